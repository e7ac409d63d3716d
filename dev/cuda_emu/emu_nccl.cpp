/*
emu_nccl.cpp: NCCL for emulated devices, one per process, launched like the real program:

    mpirun -np 2 ./build/emu/train_gpt ...     (a single process needs no MPI at all)

Every collective is an all-gather of each rank's bytes, after which each rank computes its own result.
The bytes travel over MPI (MPI_Allgather on a private duplicate of MPI_COMM_WORLD) where the program
started MPI (built with -DCUDA_EMU_MPI), else over loopback TCP sockets, as real NCCL's bootstrap does:
ncclGetUniqueId listens on a port of 127.0.0.1 and writes it into the id, rank 0 accepts the other
ranks there, and each collective goes through rank 0 (it gathers every rank's bytes and sends them all
back). So processes started without MPI (srun, torchrun-style variables; the id handed over by the
program) join too, on one machine. Results:
    all-reduce       out[i] = reduce over ranks r = 0, 1, ... of in_r[i]
    reduce-scatter   out[i] = reduce over ranks of in_r[rank * count + i]
    all-gather       out[r * count + i] = in_r[i]
    broadcast        out[i] = in_root[i]
Reductions accumulate in rank order, in fp32 (in fp64 for ncclFloat64) and round once (to
nearest-even for bf16), so every rank gets bit-identical results; ncclAvg divides the sum by the
number of ranks. With 2 ranks that is the one addition real NCCL makes too (a + b = b + a, bitwise);
with more, real NCCL's order follows its ring and may differ from rank order.

When: a collective is queued on its stream, after the work it depends on there. In every stream mode
but late-nccl it then runs before the call returns (a real NCCL call returns at once), so in
CUDA_EMU_STREAMS=late mode ranks never wait on each other inside the emulator while the program
waits in its own MPI calls; but a stream that forgot to wait for the collective, or for work queued
before it on its stream, finds it done anyway. Under CUDA_EMU_STREAMS=late-nccl it stays queued
like any work (emu_stream.cpp: after the collective issued before it, so every rank runs them in
issue order; and forced before the program's MPI calls, emu_mpi.cpp), which catches those.
A group's collectives (ncclGroupStart/End) run in the order they were issued, the same on every rank.

Point to point (ncclSend, ncclRecv: the trainer's --pp messages between pipeline stages, cuda/pipeline.cuh)
goes over MPI's own point-to-point calls on the communicator's MPI communicator: the n-th send from rank a
to rank b meets b's n-th receive from a, as NCCL matches them (in order, no tags; MPI's messages between
two ranks of one communicator and tag do not overtake each other). A call outside a group is a group of
its own; inside one the calls wait for the outermost ncclGroupEnd, which queues them all on their stream
as one operation (ordered after the collective before it, as a collective is) that posts every send and
receive at once (MPI_Issend, MPI_Irecv, MPI_Waitall). A send completes only when its receive has met it
(a synchronous send, however small), as NCCL's does. So two ranks that each send to the other first and
then receive (an exchange) do not wait for each other when the pair is one group, as with real NCCL, and
do (a hang, as on a GPU) when it is not. A send to this rank itself meets a receive from itself in the
same group. Over sockets point to point is not emulated (it stops, naming mpirun), nor a group that mixes
it with collectives or with another stream.

ncclCommSplit (the trainer's communicator of each group of ranks under --tp: cuda/nccl.cuh): over MPI
the new communicator's bytes travel on an MPI_Comm_split of the parent's, its ranks ordered by key as
real NCCL orders them; a rank passing NCCL_SPLIT_NOCOLOR gets none. Over sockets a split is not
emulated (it stops, naming mpirun): the trainer splits only under MPI (llmc/distributed.h's dist_grid
refuses --tp without it).

Invariant: ncclCommInitRank checks that every rank passed the same ncclUniqueId and (over MPI) that
the ranks are the MPI processes, so a forgotten broadcast of the id is an error, not a hang.

Non-blocking communicators (ncclCommInitRankConfig with config.blocking = 0), as real NCCL's: the call
returns ncclInProgress at once and ncclCommGetAsyncError answers ncclInProgress until the ranks have
joined, then ncclSuccess (or the error, e.g. ncclInvalidUsage for two ranks on one device). Over
sockets the join runs on a thread of its own and never gives up by itself: ranks that disagree on
nranks (rank 0 notes the mismatch, as real NCCL's bootstrap root warns and stops answering) or a rank
that never comes leave it in progress until the program's own timeout aborts it (ncclCommAbort).
Over MPI the ranks are the MPI processes, which every one of them already met: the join finishes in
the call, and the state is final at the first query. A blocking communicator (ncclCommInitRank, or
blocking unset or 1) waits in the call, giving up after CUDA_EMU_NCCL_TIMEOUT with a message. The
emulated collectives finish before their call returns (see When), so they return ncclSuccess.

A rank stuck (CUDA_EMU_NCCL_STALL=RANK:N): rank RANK stops itself with SIGSTOP at its N-th collective
(counted over its communicators from 1), alive but silent, as a rank in a debugger or a hung kernel;
the others then wait in that collective until the program's watchdog stops them.

A rank lost (over sockets): a rank that dies closes its connections (the kernel does, even after
kill -9); a rank that does not answer within CUDA_EMU_NCCL_TIMEOUT seconds (600 unless set) counts as
lost too. Rank 0 tells the others which rank it lost, and on every rank the collective then does what
real NCCL's does: it never completes, and ncclCommGetAsyncError answers ncclRemoteError, which the
program polls (a note names the lost rank, as NCCL_DEBUG=WARN does). A program that does not poll is
stopped after SOCK_LOST_GRACE_S seconds, naming the rank, rather than left waiting forever.

Devices: a communicator belongs to the device that was current (cudaSetDevice) when it was made. As
real NCCL does, ncclCommInitRank returns ncclInvalidUsage on every rank when two ranks of one host
(same hostname) made theirs on the same device; the emulated node has CUDA_EMU_DEVICES devices.
*/
#include "emu_internal.h"

#include <arpa/inet.h>
#include <atomic>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <thread>
#include <time.h>
#include <unistd.h>
#include <vector>
#ifdef CUDA_EMU_MPI
#include <mpi.h>
#endif

struct ncclComm {
    int rank, nranks;
    int device;   // the current device at ncclCommInitRank
    bool over_mpi;   // the bytes travel over MPI; else over sockets through rank 0
#ifdef CUDA_EMU_MPI
    MPI_Comm mpi;
#endif
    std::vector<int> fds;   // sockets: rank 0 holds one per rank (fds[r], r > 0), the others fds[0] to rank 0
    std::vector<int> strays;   // rank 0: connections of ranks that disagree on nranks, held open unanswered
    std::atomic<int> async_error{ncclSuccess};   // what ncclCommGetAsyncError answers (joining, a rank lost)
    std::atomic<bool> aborted{false};   // ncclCommAbort: its collectives still queued (late-nccl) do nothing
    std::atomic<bool> joining{false};   // a non-blocking join's thread still runs: the communicator outlives it
};

// the thread of a non-blocking join: a failure after ncclCommAbort parks it rather than stop the program
static thread_local bool t_joining = false;

// ----------------------------------------------------------------------------
// loopback sockets

// the listening sockets of this process's ncclGetUniqueId, by port (rank 0 accepts the others there)
static std::vector<std::pair<int, int>> g_listening;
static const unsigned SOCK_MAGIC = 0x656d756eu;   // a connection that is not one of ours is refused

static double sock_timeout_s() {
    const char* v = getenv("CUDA_EMU_NCCL_TIMEOUT");
    double t = v ? atof(v) : 600.0;
    return t > 0 ? t : 600.0;
}

// 0 when all n bytes moved; -1 when the other side closed or failed; -2 when it stayed silent for
// limit_ms (-1: no limit)
static int sock_io_within(int fd, void* buf, size_t n, bool sending, int limit_ms) {
    for (size_t done = 0; done < n;) {
        struct pollfd p = {fd, (short)(sending ? POLLOUT : POLLIN), 0};
        int ready = poll(&p, 1, limit_ms);
        if (ready == 0) { return -2; }
        if (ready < 0) { if (errno == EINTR) { continue; } return -1; }
        ssize_t k = sending ? send(fd, (char*)buf + done, n - done, MSG_NOSIGNAL) : recv(fd, (char*)buf + done, n - done, 0);
        if (k <= 0) { if (k < 0 && errno == EINTR) { continue; } return -1; }
        done += (size_t)k;
    }
    return 0;
}

// the same within CUDA_EMU_NCCL_TIMEOUT
static int sock_io(int fd, void* buf, size_t n, bool sending) { return sock_io_within(fd, buf, n, sending, (int)(sock_timeout_s() * 1000.0)); }

// as real NCCL: the collective never completes, and ncclCommGetAsyncError answers ncclRemoteError (the
// note names the rank, as NCCL_DEBUG=WARN does); a program that polls it stops itself. One that does
// not is stopped here after SOCK_LOST_GRACE_S rather than left waiting forever
static const int SOCK_LOST_GRACE_S = 10;
[[noreturn]] static void sock_lost(ncclComm_t c, int lost, int why, const char* during) {
    if (c->aborted && t_joining) { for (;;) { pause(); } }
    const char* what = why == -2 ? "it did not answer in time" : "its connection closed (the process ended)";
    fflush(stdout);
    fprintf(stderr, "cuda_emu: note: NCCL emulation: rank %d lost rank %d of %d during %s: %s; ncclCommGetAsyncError "
            "now answers ncclRemoteError\n", c->rank, lost, c->nranks, during, what);
    c->async_error = ncclRemoteError;
    sleep(SOCK_LOST_GRACE_S);
    emu_fail("NCCL emulation: rank %d lost rank %d of %d during %s: %s, and the program did not stop in %d s (it does not "
             "poll ncclCommGetAsyncError)", c->rank, lost, c->nranks, during, what, SOCK_LOST_GRACE_S);
}

// rank 0's message before the bytes it sends back: a lost rank, or none (-1)
struct sock_header { int lost; int why; };

// every rank's `bytes` bytes, in rank order, through rank 0; a rank lost stops every rank, naming it
static void sock_exchange(ncclComm_t c, const void* mine, size_t bytes, char* all, const char* during) {
    if (c->rank != 0) {
        int rc = sock_io(c->fds[0], (void*)mine, bytes, true);
        sock_header h = {-1, 0};
        if (rc == 0) { rc = sock_io(c->fds[0], &h, sizeof(h), false); }
        if (rc != 0) { sock_lost(c, 0, rc, during); }
        if (h.lost >= 0) { sock_lost(c, h.lost, h.why, during); }
        rc = sock_io(c->fds[0], all, bytes * c->nranks, false);
        if (rc != 0) { sock_lost(c, 0, rc, during); }
        return;
    }
    memcpy(all, mine, bytes);
    sock_header h = {-1, 0};
    for (int r = 1; r < c->nranks && h.lost < 0; r++) {
        int rc = sock_io(c->fds[r], all + r * bytes, bytes, false);
        if (rc != 0) { h = {r, rc}; }
    }
    for (int r = 1; r < c->nranks; r++) {
        if (r == h.lost) { continue; }
        if (sock_io(c->fds[r], &h, sizeof(h), true) == 0 && h.lost < 0) { sock_io(c->fds[r], all, bytes * c->nranks, true); }
    }
    if (h.lost >= 0) { sock_lost(c, h.lost, h.why, during); }
}

// the port in an id that ncclGetUniqueId made (0: none)
static int id_port(const ncclUniqueId& id) {
    const char* p = strstr(id.internal, " port ");
    return p ? atoi(p + 6) : 0;
}

// the listening socket of this process's ncclGetUniqueId with port (-1: none)
static int listening_socket(int port) {
    for (auto& l : g_listening) { if (l.first == port) { return l.second; } }
    return -1;
}

static const int JOIN_POLL_MS = 100;   // a join looks this often whether it was aborted (or gave up)
static const int JOIN_RETRY_US = 20000;   // between a rank's tries to connect to rank 0

// rank 0 accepts the others on its id's port srv, each rank else connects there; every rank sends
// {magic, rank, nranks} and rank 0 answers each when all have come. A rank whose nranks is not rank 0's
// is noted and never answered, as real NCCL's bootstrap root does. give_up (a blocking communicator):
// stop the program after CUDA_EMU_NCCL_TIMEOUT; else wait until the communicator is aborted.
// Returns whether the ranks joined
static bool sock_join(ncclComm_t c, int srv, int port, bool give_up) {
    c->fds.assign(c->nranks, -1);
    double limit = sock_timeout_s();
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    auto waited = [&] { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9; };
    if (c->rank == 0) {
        for (int joined = 1; joined < c->nranks;) {
            if (c->aborted) { return false; }
            struct pollfd p = {srv, POLLIN, 0};
            if (poll(&p, 1, JOIN_POLL_MS) > 0) {
                int fd = accept(srv, nullptr, nullptr);
                unsigned hello[3] = {0, 0, 0};
                bool ours = fd >= 0 && sock_io(fd, hello, sizeof(hello), false) == 0 && hello[0] == SOCK_MAGIC;
                if (ours && (int)hello[2] != c->nranks) {
                    fflush(stdout);
                    fprintf(stderr, "cuda_emu: note: NCCL emulation: rank %u joined with nranks %u, rank 0 has nranks %d: the "
                            "communicator never forms (as real NCCL's bootstrap root, which warns 'mismatch in rank count' and "
                            "stops answering)\n", hello[1], hello[2], c->nranks);
                    c->strays.push_back(fd);
                } else if (ours && hello[1] > 0 && (int)hello[1] < c->nranks && c->fds[hello[1]] < 0) {
                    c->fds[hello[1]] = fd;
                    joined++;
                } else if (fd >= 0) {
                    close(fd);
                }
            }
            if (joined < c->nranks && give_up && waited() > limit) {
                int missing = 1;
                while (c->fds[missing] >= 0) { missing++; }
                emu_fail("ncclCommInitRank: rank 0 waited %.0f s for rank %d of %d to join (CUDA_EMU_NCCL_TIMEOUT sets the wait)",
                         limit, missing, c->nranks);
            }
        }
        char go = 1;
        for (int r = 1; r < c->nranks; r++) { sock_io(c->fds[r], &go, 1, true); }
        return true;
    }
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = -1;
    while (fd < 0) {
        if (c->aborted) { return false; }
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr*)&a, sizeof(a)) == 0) { break; }
        close(fd);
        fd = -1;
        if (give_up && waited() > limit) { emu_fail("ncclCommInitRank: rank %d waited %.0f s for rank 0 at 127.0.0.1:%d", c->rank, limit, port); }
        usleep(JOIN_RETRY_US);
    }
    c->fds[0] = fd;
    unsigned hello[3] = {SOCK_MAGIC, (unsigned)c->rank, (unsigned)c->nranks};
    if (sock_io(fd, hello, sizeof(hello), true) != 0) { sock_lost(c, 0, -1, "ncclCommInitRank"); }
    char go = 0;
    for (;;) {   // rank 0's answer: it never comes where rank 0 has another nranks
        int rc = sock_io_within(fd, &go, 1, false, JOIN_POLL_MS);
        if (rc == 0) { return true; }
        if (c->aborted) { return false; }
        if (rc == -1) { sock_lost(c, 0, -1, "ncclCommInitRank"); }
        if (give_up && waited() > limit) {
            emu_fail("ncclCommInitRank: rank %d of %d waited %.0f s for rank 0 to answer (does rank 0 have the same nranks? "
                     "CUDA_EMU_NCCL_TIMEOUT sets the wait)", c->rank, c->nranks, limit);
        }
    }
}

static const char UNIQUE_ID_MAGIC[] = "cuda_emu nccl id";

// where a rank runs: what real NCCL compares to find two ranks on one GPU
struct rank_place {
    char host[256];   // gethostname(), cut to fit
    int device;
};

const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return "no error";
        case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
        case ncclInvalidUsage: return "invalid usage (emulated NCCL)";
        case ncclSystemError: return "system error (emulated NCCL)";
        default: return "unhandled error (emulated NCCL)";
    }
}

ncclResult_t ncclGetVersion(int* version) { *version = NCCL_VERSION_CODE; return ncclSuccess; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    memset(id, 0, sizeof(*id));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    // rank 0 listens here for the ranks that MPI does not carry (see the top of this file)
    int srv = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (srv < 0 || bind(srv, (struct sockaddr*)&a, sizeof(a)) != 0 || listen(srv, 64) != 0 ||
        getsockname(srv, (struct sockaddr*)&a, &len) != 0) {
        return ncclSystemError;
    }
    g_listening.push_back({ntohs(a.sin_port), srv});
    snprintf(id->internal, sizeof(id->internal), "%s pid %d t %ld.%09ld port %d", UNIQUE_ID_MAGIC, (int)getpid(),
             (long)ts.tv_sec, ts.tv_nsec, (int)ntohs(a.sin_port));
    return ncclSuccess;
}

// every rank's `bytes` bytes, in rank order
static void exchange(ncclComm_t comm, const void* mine, size_t bytes, std::vector<char>* all, const char* during = "a collective") {
    all->resize(bytes * comm->nranks);
    if (comm->nranks == 1) {
        memcpy(all->data(), mine, bytes);
        return;
    }
    if (!comm->over_mpi) {
        sock_exchange(comm, mine, bytes, all->data(), during);
        return;
    }
#ifdef CUDA_EMU_MPI
    if (bytes > (size_t)INT32_MAX) { emu_fail("NCCL emulation: %zu bytes in one collective is too many for MPI", bytes); }
    // PMPI_: the emulator's own exchange, not one of the program's MPI calls (emu_mpi.cpp)
    PMPI_Allgather(mine, (int)bytes, MPI_BYTE, all->data(), (int)bytes, MPI_BYTE, comm->mpi);
#endif
}

// whether the ranks of the communicator use distinct devices wherever they share a host; every rank
// computes the same answer, and the rank that finds it shares a device with an earlier rank says so
static bool one_rank_per_device(ncclComm_t c) {
    rank_place mine = {};
    if (gethostname(mine.host, sizeof(mine.host) - 1) != 0) { snprintf(mine.host, sizeof(mine.host), "?"); }
    mine.device = c->device;
    std::vector<char> all;
    exchange(c, &mine, sizeof(mine), &all);
    const rank_place* places = (const rank_place*)all.data();
    bool distinct = true;
    for (int r = 0; r < c->nranks; r++) {
        for (int q = 0; q < r; q++) {
            if (places[q].device != places[r].device || strcmp(places[q].host, places[r].host) != 0) { continue; }
            distinct = false;
            if (r == c->rank) {
                fflush(stdout);
                fprintf(stderr, "cuda_emu: note: ncclCommInitRank: ranks %d and %d both use CUDA device %d of host %s: "
                        "ncclInvalidUsage, as real NCCL answers; give each rank of a host its own device "
                        "(cudaSetDevice(local rank)) and run at most as many ranks per host as it has GPUs\n",
                        q, r, places[r].device, places[r].host);
            }
        }
    }
    return distinct;
}

// after the ranks met: they check each other's id and devices; ncclSuccess or ncclInvalidUsage
static ncclResult_t check_joined(ncclComm_t c, const ncclUniqueId& id) {
    std::vector<char> ids;
    exchange(c, id.internal, sizeof(id.internal), &ids);
    for (int r = 0; r < c->nranks; r++) {
        if (memcmp(ids.data() + r * sizeof(id.internal), id.internal, sizeof(id.internal)) != 0) {
            emu_fail("ncclCommInitRank: rank %d has a different ncclUniqueId than rank %d "
                     "(rank 0 must make it and send it to the others)", r, c->rank);
        }
    }
    return one_rank_per_device(c) ? ncclSuccess : ncclInvalidUsage;
}

// over MPI: the program's processes are the ranks, so every one of them is there
static void mpi_join(ncclComm_t c) {
#ifdef CUDA_EMU_MPI
    int world = 0, world_rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (world != c->nranks || world_rank != c->rank) {
        emu_fail("ncclCommInitRank(nranks=%d, rank=%d) in MPI process %d of %d: the emulator runs one "
                 "rank per MPI process", c->nranks, c->rank, world_rank, world);
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
#else
    (void)c;
#endif
}

// the communicator of nranks that each rank joins with id: blocking waits in the call (and answers
// the result), else the join goes on in the background (see the top of this file)
static ncclResult_t comm_init(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, bool blocking) {
    if (strncmp(id.internal, UNIQUE_ID_MAGIC, strlen(UNIQUE_ID_MAGIC)) != 0) {
        emu_fail("ncclCommInitRank: the ncclUniqueId was not made by ncclGetUniqueId");
    }
    if (nranks < 1 || rank < 0 || rank >= nranks) { return ncclInvalidArgument; }
    ncclComm_t c = new ncclComm();
    c->rank = rank;
    emu_timeline_set_rank(rank);   // the trace names its process after the rank
    c->nranks = nranks;
    c->device = emu_current_device();
    *comm = c;
    ncclResult_t state = ncclSuccess;
    if (nranks > 1) {
        int initialized = 0;
#ifdef CUDA_EMU_MPI
        MPI_Initialized(&initialized);  // the program started MPI: its processes are the ranks
#endif
        c->over_mpi = initialized != 0;
        int port = id_port(id), srv = rank == 0 ? listening_socket(port) : -1;
        if (!c->over_mpi && rank == 0 && srv < 0) {
            emu_fail("ncclCommInitRank: rank 0 must use the ncclUniqueId it made with ncclGetUniqueId (port %d is not its)", port);
        }
        if (!c->over_mpi && !blocking) {
            c->async_error = ncclInProgress;
            c->joining = true;
            std::thread([c, id, srv, port] {
                t_joining = true;
                if (sock_join(c, srv, port, false)) { c->async_error = check_joined(c, id); }
                c->joining = false;
            }).detach();
            return ncclInProgress;
        }
        if (c->over_mpi) { mpi_join(c); } else { sock_join(c, srv, port, true); }
        state = check_joined(c, id);
    }
    if (blocking) {
        if (state != ncclSuccess) { ncclCommDestroy(c); }
        return state;
    }
    c->async_error = state;
    return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    return comm_init(comm, nranks, id, rank, true);
}

// NCCL_CONFIG_INITIALIZER leaves blocking unset (NCCL_CONFIG_UNDEF_INT): NCCL's default, blocking
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
    return comm_init(comm, nranks, id, rank, config == nullptr || config->blocking != 0);
}

// the ranks of comm that pass one color form a communicator, ordered by key (ties by rank in comm);
// NCCL_SPLIT_NOCOLOR: this rank joins none (*newcomm = NULL). Every rank of comm calls it. Over MPI:
// an MPI_Comm_split of comm's own communicator (the bytes of the new one travel there), its ranks'
// devices checked as ncclCommInitRank checks them. Over sockets it is not emulated (a split would
// need rank 0 of each group to listen anew): the emulator stops, naming the launch that has it.
// Non-blocking (config.blocking = 0) as ncclCommInitRankConfig: ncclInProgress, then the state at
// the first ncclCommGetAsyncError
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
    bool blocking = config == nullptr || config->blocking != 0;
    *newcomm = nullptr;
    if (comm->nranks > 1 && !comm->over_mpi) {
        emu_fail("ncclCommSplit: the emulated NCCL splits communicators over MPI only (these ranks joined over sockets: "
                 "started without MPI)\n  hint: launch with mpirun");
    }
    emu_before_host_wait();  // late-nccl: a collective the others may be waiting for runs first (as before an MPI call)
    std::vector<char> all;
    int mine[2] = {color, key};
    exchange(comm, mine, sizeof(mine), &all, "ncclCommSplit");  // the colors and keys of every rank
    const int* ck = (const int*)all.data();
    if (color == NCCL_SPLIT_NOCOLOR) {
#ifdef CUDA_EMU_MPI
        if (comm->nranks > 1) { MPI_Comm none; PMPI_Comm_split(comm->mpi, MPI_UNDEFINED, key, &none); }
#endif
        return ncclSuccess;
    }
    if (color < 0) { return ncclInvalidArgument; }
    ncclComm_t c = new ncclComm();
    c->device = emu_current_device();
    c->rank = 0;
    c->nranks = 0;
    for (int r = 0; r < comm->nranks; r++) {  // the same order as MPI_Comm_split's: by key, then by rank in comm
        if (ck[2 * r] != color) { continue; }
        c->nranks++;
        if (ck[2 * r + 1] < key || (ck[2 * r + 1] == key && r < comm->rank)) { c->rank++; }
    }
#ifdef CUDA_EMU_MPI
    if (comm->nranks > 1) {
        PMPI_Comm_split(comm->mpi, color, key, &c->mpi);
        int rank = -1, nranks = 0;
        PMPI_Comm_rank(c->mpi, &rank);
        PMPI_Comm_size(c->mpi, &nranks);
        if (rank != c->rank || nranks != c->nranks) {
            emu_fail("ncclCommSplit: MPI made rank %d of %d where the colors and keys say %d of %d (the emulator's bug)",
                     rank, nranks, c->rank, c->nranks);
        }
        if (c->nranks == 1) { PMPI_Comm_free(&c->mpi); }  // one rank: its collectives are copies (exchange)
    }
#endif
    c->over_mpi = c->nranks > 1;
    *newcomm = c;
    ncclResult_t state = one_rank_per_device(c) ? ncclSuccess : ncclInvalidUsage;
    if (blocking) {
        if (state != ncclSuccess) { ncclCommDestroy(c); *newcomm = nullptr; }
        return state;
    }
    c->async_error = state;
    return ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm->joining) { return ncclCommAbort(comm); }   // its join's thread still holds it: kept, as an aborted one
    emu_before_host_wait();  // late-nccl: its queued collectives run (with the other ranks') before it goes
#ifdef CUDA_EMU_MPI
    if (comm->nranks > 1 && comm->over_mpi) { MPI_Comm_free(&comm->mpi); }
#endif
    for (int fd : comm->fds) { if (fd >= 0) { close(fd); } }
    for (int fd : comm->strays) { close(fd); }
    delete comm;
    return ncclSuccess;
}
// as real NCCL's: the queued collectives are dropped, not run (another rank may be gone). The
// communicator stays allocated: late-nccl may still hold them in a stream
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    comm->aborted = true;
    if (comm->joining) { return ncclSuccess; }   // its thread sees the flag within JOIN_POLL_MS and parks; its sockets stay
    for (int& fd : comm->fds) { if (fd >= 0) { close(fd); fd = -1; } }
    for (int& fd : comm->strays) { close(fd); }
    comm->strays.clear();
    return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) { *count = comm->nranks; return ncclSuccess; }
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) { *rank = comm->rank; return ncclSuccess; }
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) { *device = comm->device; return ncclSuccess; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) { *error = (ncclResult_t)comm->async_error.load(); return ncclSuccess; }
// ncclGroupStart/End: the groups' point-to-point calls (below) wait for the outermost ncclGroupEnd
static int g_group_depth = 0;
struct p2p_call {
    bool send;
    void* buf;          // the send's buffer (read) or the receive's (written)
    size_t bytes;
    int peer;
    ncclComm_t comm;
};
static std::vector<p2p_call> g_group_p2p;   // the current group's calls, in order
static cudaStream_t g_group_stream;          // their stream (one for the group)
static ncclResult_t group_end_p2p();
ncclResult_t ncclGroupStart() { g_group_depth++; return ncclSuccess; }
ncclResult_t ncclGroupEnd() {
    if (g_group_depth == 0) { return ncclInvalidUsage; }
    return --g_group_depth == 0 ? group_end_p2p() : ncclSuccess;
}

// ----------------------------------------------------------------------------
// elements and reductions

static size_t element_bytes(ncclDataType_t t) {
    switch (t) {
        case ncclFloat32: return sizeof(float);
        case ncclFloat64: return sizeof(double);
        case ncclBfloat16: return sizeof(__nv_bfloat16);
        case ncclFloat16: return sizeof(__half);
        case ncclInt8: case ncclUint8: return 1;
        case ncclInt32: case ncclUint32: return 4;
        case ncclInt64: case ncclUint64: return 8;
        default: return 0;  // not emulated
    }
}

// element i of p as a double (exact for every emulated type)
static double load(const char* p, ncclDataType_t t, size_t i) {
    switch (t) {
        case ncclFloat64: return ((const double*)p)[i];
        case ncclBfloat16: return __bfloat162float(((const __nv_bfloat16*)p)[i]);
        case ncclFloat16: return __half2float(((const __half*)p)[i]);
        default: return ((const float*)p)[i];
    }
}

// stores v, which the reduction computed in the type's accumulator (so exact but for bf16 and fp16)
static void store(void* p, ncclDataType_t t, size_t i, double v) {
    switch (t) {
        case ncclFloat64: ((double*)p)[i] = v; break;
        case ncclBfloat16: ((__nv_bfloat16*)p)[i] = __float2bfloat16((float)v); break;
        case ncclFloat16: ((__half*)p)[i] = __float2half((float)v); break;
        default: ((float*)p)[i] = (float)v; break;
    }
}

// out[i] = op over ranks r = 0, 1, ... of all[r * rank_stride + offset + i], for i < count, each
// step rounded to Acc (float, or double for ncclFloat64)
template <typename Acc>
static void reduce_ranks_in(const std::vector<char>& all, size_t rank_stride, size_t offset, size_t count,
                            ncclDataType_t type, ncclRedOp_t op, int nranks, void* out) {
    size_t eb = element_bytes(type);
    for (size_t i = 0; i < count; i++) {
        Acc acc = (Acc)load(all.data(), type, offset + i);
        for (int r = 1; r < nranks; r++) {
            Acc v = (Acc)load(all.data() + r * rank_stride * eb, type, offset + i);
            switch (op) {
                case ncclMax: acc = (Acc)fmax(acc, v); break;  // exact: both are Acc
                case ncclMin: acc = (Acc)fmin(acc, v); break;
                case ncclProd: acc *= v; break;
                default: acc += v; break;  // ncclSum, ncclAvg
            }
        }
        if (op == ncclAvg) { acc /= (Acc)nranks; }
        store(out, type, i, acc);
    }
}

// integers: exact, wrapping as NCCL's do (T the element type itself)
template <typename T>
static void reduce_ints(const std::vector<char>& all, size_t rank_stride, size_t offset, size_t count,
                        ncclRedOp_t op, int nranks, void* out) {
    const T* in = (const T*)all.data();
    for (size_t i = 0; i < count; i++) {
        T acc = in[offset + i];
        for (int r = 1; r < nranks; r++) {
            T v = in[r * rank_stride + offset + i];
            switch (op) {
                case ncclMax: acc = v > acc ? v : acc; break;
                case ncclMin: acc = v < acc ? v : acc; break;
                case ncclProd: acc = (T)(acc * v); break;
                default: acc = (T)(acc + v); break;
            }
        }
        if (op == ncclAvg) { acc = (T)(acc / nranks); }
        ((T*)out)[i] = acc;
    }
}

static void reduce_ranks(const std::vector<char>& all, size_t rank_stride, size_t offset, size_t count,
                         ncclDataType_t type, ncclRedOp_t op, int nranks, void* out) {
    switch (type) {
        case ncclInt8: reduce_ints<int8_t>(all, rank_stride, offset, count, op, nranks, out); return;
        case ncclUint8: reduce_ints<uint8_t>(all, rank_stride, offset, count, op, nranks, out); return;
        case ncclInt32: reduce_ints<int32_t>(all, rank_stride, offset, count, op, nranks, out); return;
        case ncclUint32: reduce_ints<uint32_t>(all, rank_stride, offset, count, op, nranks, out); return;
        case ncclInt64: reduce_ints<int64_t>(all, rank_stride, offset, count, op, nranks, out); return;
        case ncclUint64: reduce_ints<uint64_t>(all, rank_stride, offset, count, op, nranks, out); return;
        default: break;
    }
    if (type == ncclFloat64) {
        reduce_ranks_in<double>(all, rank_stride, offset, count, type, op, nranks, out);
    } else {
        reduce_ranks_in<float>(all, rank_stride, offset, count, type, op, nranks, out);
    }
}

static bool known_op(ncclRedOp_t op) {
    return op == ncclSum || op == ncclAvg || op == ncclMax || op == ncclMin || op == ncclProd;
}

// CUDA_EMU_NCCL_STALL=RANK:N: rank RANK stops itself (SIGSTOP) at its N-th collective (see the top)
static void stall_if_asked(ncclComm_t comm, const char* what) {
    static int stall_rank = -1, stall_at = 0, seen = 0;
    static bool parsed = false;
    if (!parsed) {
        parsed = true;
        const char* v = getenv("CUDA_EMU_NCCL_STALL");
        if (v != nullptr && (sscanf(v, "%d:%d", &stall_rank, &stall_at) != 2 || stall_rank < 0 || stall_at < 1)) {
            emu_fail("CUDA_EMU_NCCL_STALL='%s': expected RANK:N (rank RANK stops at its N-th collective), e.g. 1:20", v);
        }
    }
    if (comm->rank != stall_rank || ++seen != stall_at) { return; }
    fflush(stdout);
    fprintf(stderr, "cuda_emu: note: CUDA_EMU_NCCL_STALL: rank %d stops itself (SIGSTOP) at its collective %d (%s)\n",
            comm->rank, seen, what);
    raise(SIGSTOP);
}

// what a collective of `bytes` (the whole buffer: all-reduce's, reduce-scatter's input, all-gather's
// output, broadcast's) costs on the timeline (emu_timeline.cpp: the ring's alpha-beta model)
static emu_work collective_cost(ncclComm_t comm, emu_collective_kind kind, double bytes) {
    emu_work w;
    w.kind = EMU_WORK_COLLECTIVE;
    w.collective = kind;
    w.bytes = bytes;
    w.nranks = comm->nranks;
    return w;
}

// queue the collective on the stream: see "When" at the top of this file. CUDA_EMU_EXECUTE=0: it is
// modelled, not run (no rank waits for another; the others get zeros where they read)
static ncclResult_t run_collective(ncclComm_t comm, cudaStream_t stream, const char* what, const emu_work& cost,
                                   std::function<void()> work) {
    if (!g_group_p2p.empty()) {
        emu_fail("%s in a group after ncclSend or ncclRecv: a group that mixes point to point with collectives is not emulated\n"
                 "  hint: end the group of sends and receives first (ncclGroupEnd)", what);
    }
    if (!emu_config().execute) {
        emu_enqueue_collective(stream, what, [] {}, cost);
        return ncclSuccess;
    }
    emu_enqueue_collective(stream, what, [comm, what, work] {
        if (comm->aborted) { return; }
        stall_if_asked(comm, what);
        work();
    }, cost);
    return ncclSuccess;
}

// ----------------------------------------------------------------------------
// collectives

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    if (element_bytes(type) == 0 || !known_op(op)) { return ncclInvalidArgument; }
    return run_collective(comm, stream, "ncclAllReduce", collective_cost(comm, EMU_ALL_REDUCE, (double)count * element_bytes(type)), [=] {
        std::vector<char> all;
        exchange(comm, sendbuff, count * element_bytes(type), &all, "ncclAllReduce");
        reduce_ranks(all, count, 0, count, type, op, comm->nranks, recvbuff);
    });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    if (element_bytes(type) == 0 || !known_op(op)) { return ncclInvalidArgument; }
    return run_collective(comm, stream, "ncclReduceScatter",
                          collective_cost(comm, EMU_REDUCE_SCATTER, (double)recvcount * comm->nranks * element_bytes(type)), [=] {
        std::vector<char> all;
        size_t n = recvcount * comm->nranks;
        exchange(comm, sendbuff, n * element_bytes(type), &all, "ncclReduceScatter");
        reduce_ranks(all, n, comm->rank * recvcount, recvcount, type, op, comm->nranks, recvbuff);
    });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
    if (element_bytes(type) == 0) { return ncclInvalidArgument; }
    return run_collective(comm, stream, "ncclAllGather",
                          collective_cost(comm, EMU_ALL_GATHER, (double)sendcount * comm->nranks * element_bytes(type)), [=] {
        std::vector<char> all;  // a copy first: in place, sendbuff lies inside recvbuff
        exchange(comm, sendbuff, sendcount * element_bytes(type), &all, "ncclAllGather");
        memcpy(recvbuff, all.data(), all.size());
    });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    if (element_bytes(type) == 0 || root < 0 || root >= comm->nranks) { return ncclInvalidArgument; }
    return run_collective(comm, stream, "ncclBroadcast", collective_cost(comm, EMU_BROADCAST, (double)count * element_bytes(type)), [=] {
        size_t bytes = count * element_bytes(type);
        std::vector<char> all;  // only the root's sendbuff is valid; the others send their recvbuff
        exchange(comm, comm->rank == root ? sendbuff : recvbuff, bytes, &all, "ncclBroadcast");
        memcpy(recvbuff, all.data() + root * bytes, bytes);
    });
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t type, int root, ncclComm_t comm, cudaStream_t stream) {
    return ncclBroadcast(buff, buff, count, type, root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    if (element_bytes(type) == 0 || !known_op(op) || root < 0 || root >= comm->nranks) { return ncclInvalidArgument; }
    return run_collective(comm, stream, "ncclReduce", collective_cost(comm, EMU_REDUCE, (double)count * element_bytes(type)), [=] {
        std::vector<char> all;
        exchange(comm, sendbuff, count * element_bytes(type), &all, "ncclReduce");
        if (comm->rank == root) { reduce_ranks(all, count, 0, count, type, op, comm->nranks, recvbuff); }
    });
}

// ----------------------------------------------------------------------------
// point to point (see the top of this file)

static const int P2P_TAG = 0;                // NCCL has no tags: every message between two ranks is in order

// one send or receive, queued for the outermost ncclGroupEnd (outside a group: a group of its own)
static ncclResult_t p2p(bool send, const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream,
                        const char* what) {
    if (element_bytes(type) == 0 || comm == nullptr || peer < 0 || peer >= comm->nranks) { return ncclInvalidArgument; }
    if (peer != comm->rank && !comm->over_mpi) {
        emu_fail("%s: the emulated NCCL sends point to point over MPI only (these ranks joined over sockets: started without MPI)\n"
                 "  hint: launch with mpirun", what);
    }
    if (!g_group_p2p.empty() && g_group_stream != stream) {
        emu_fail("%s: a group of point-to-point calls on two streams is not emulated\n  hint: issue a group's calls on one stream", what);
    }
    g_group_p2p.push_back({send, const_cast<void*>(buf), count * element_bytes(type), peer, comm});
    g_group_stream = stream;
    return g_group_depth == 0 ? group_end_p2p() : ncclSuccess;
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
    return p2p(true, sendbuff, count, datatype, peer, comm, stream, "ncclSend");
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
    return p2p(false, recvbuff, count, datatype, peer, comm, stream, "ncclRecv");
}

// this rank's sends to itself, each into the receive from itself of the same place in the group's order
static void p2p_to_self(const std::vector<p2p_call>& calls) {
    std::vector<const p2p_call*> sends, recvs;
    for (const p2p_call& c : calls) {
        if (c.peer == c.comm->rank) { (c.send ? sends : recvs).push_back(&c); }
    }
    if (sends.size() != recvs.size()) {
        emu_fail("a group of point-to-point calls with %zu send(s) to this rank itself and %zu receive(s) from it: each needs its pair "
                 "in the same group (real NCCL hangs)", sends.size(), recvs.size());
    }
    for (size_t i = 0; i < sends.size(); i++) {
        if (sends[i]->bytes != recvs[i]->bytes) {
            emu_fail("ncclSend of %zu bytes to this rank itself meets an ncclRecv of %zu bytes", sends[i]->bytes, recvs[i]->bytes);
        }
        memmove(recvs[i]->buf, sends[i]->buf, sends[i]->bytes);
    }
}

// every send and receive of the group posted at once, then waited for
static void p2p_run(const std::vector<p2p_call>& calls) {
    p2p_to_self(calls);
#ifdef CUDA_EMU_MPI
    std::vector<MPI_Request> requests;
    for (const p2p_call& c : calls) {
        if (c.peer == c.comm->rank || c.comm->aborted) { continue; }
        if (c.bytes > (size_t)INT32_MAX) { emu_fail("NCCL emulation: %zu bytes in one message is too many for MPI", c.bytes); }
        MPI_Request r;
        // PMPI_: the emulator's own messages, not the program's MPI calls (emu_mpi.cpp)
        // a synchronous send (Issend): it completes when the peer's receive has met it, however small the message,
        // as NCCL's blocks until the peer posts its receive (MPI_Isend's eager messages would hide a missing group)
        if (c.send) { PMPI_Issend(c.buf, (int)c.bytes, MPI_BYTE, c.peer, P2P_TAG, c.comm->mpi, &r); }
        else { PMPI_Irecv(c.buf, (int)c.bytes, MPI_BYTE, c.peer, P2P_TAG, c.comm->mpi, &r); }
        requests.push_back(r);
    }
    if (!requests.empty()) { PMPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE); }
#endif
}

// the group's calls as one operation on their stream: the timeline prices the larger direction over one
// link of the communicator's ranks (a point-to-point transfer: its alpha and its bytes at the link's rate)
static ncclResult_t group_end_p2p() {
    if (g_group_p2p.empty()) { return ncclSuccess; }
    std::vector<p2p_call> calls;
    calls.swap(g_group_p2p);
    double sent = 0.0, received = 0.0;
    for (const p2p_call& c : calls) { (c.send ? sent : received) += (double)c.bytes; }
    emu_work cost = collective_cost(calls[0].comm, EMU_SEND_RECV, sent > received ? sent : received);
    const char* what = calls.size() == 1 ? (calls[0].send ? "ncclSend" : "ncclRecv") : "ncclGroupEnd (ncclSend, ncclRecv)";
    ncclComm_t comm = calls[0].comm;
    return run_collective(comm, g_group_stream, what, cost, [calls] { p2p_run(calls); });
}
