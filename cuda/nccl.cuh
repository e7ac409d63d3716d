/*
nccl.cuh: NCCL for the CUDA backend, one process per GPU: the error check every NCCL call goes through,
and the communicator of the ranks, bootstrapped over MPI (llmc/distributed.h), or without MPI (srun,
torchrun-style variables) over a communicator of the host's collectives that nccl_start_by_env makes
with the id that --dist-init carries (llmc/rendezvous.h), watched by a thread for a rank that died.

    Dist d;  dist_init(&d, &argc, &argv);         // MPI ranks, or the launcher's variables
    if (dist_by_env()) { nccl_start_by_env(&d, "file:/shared/dir"); }   // gpt2_dist_start
    ncclComm_t comm = nccl_init(&d);              // every rank; d.world > 1
    NCCL_CHECK(ncclAllReduce(x, x, n, ncclDouble, ncclSum, comm, stream));
    WATCHED_WAIT(cudaStreamSynchronize(stream), "the all-reduce");   // a host wait on collectives

Never a hang: every communicator is non-blocking (ncclConfig_t.blocking = 0), so its creation returns
at once and this rank polls it for at most rendezvous_timeout_s() (LLMC_DIST_TIMEOUT); a call that
answers ncclInProgress is waited for the same way. A watchdog thread (every launch path) stops the
rank when a communicator reports an error (a peer died) or when the main thread has waited longer than
the timeout inside an NCCL call or a WATCHED_WAIT (a peer alive but stuck): it aborts the
communicators (ncclCommAbort) and ends the process with a message. The timeout is long (600 s) because
a rank may wait at a barrier while rank 0 writes a checkpoint.

Built with -DNO_NCCL (the Makefile does when dev/cuda_emu/find_nccl.sh finds no NCCL, or NCCL=0), the
program is a one-GPU trainer: nccl.h is not included, nccl_built_with() is 0 and nccl_init stops with
a message naming the rebuild; the NCCL calls the backend makes are declared here so that it compiles
unchanged, and each stops the same way (none is reached: every one of them needs nccl_init's
communicator first).

Failure: a failing NCCL call stops with the call, NCCL's error text, file:line and a hint.
*/
#ifndef CUDA_NCCL_CUH
#define CUDA_NCCL_CUH

#include "../llmc/utils.h"
#include "../llmc/distributed.h"
#include "../llmc/rendezvous.h"
#include <pthread.h>

// what a build without NCCL says when several ranks would need it
#define NCCL_REBUILD_HINT "install NCCL (pip install nvidia-nccl-cu13, the libnccl-dev package, or NCCL_HOME=DIR) and rebuild: " \
                          "make -B train_gpt_cu prints where it found NCCL"

#ifndef NO_NCCL
#include <nccl.h>
static int nccl_built_with(void) { return 1; }
#else
static int nccl_built_with(void) { return 0; }

// the part of nccl.h the backend uses, each call stopping (see the top of this file)
typedef struct ncclComm* ncclComm_t;
typedef enum { ncclSuccess = 0, ncclInvalidUsage = 5, ncclInProgress = 7 } ncclResult_t;
typedef enum { ncclInt8 = 0, ncclInt32 = 2, ncclUint64 = 5, ncclFloat = 7, ncclDouble = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclMax = 2, ncclMin = 3 } ncclRedOp_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { int blocking; } ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {1}
#define NCCL_SPLIT_NOCOLOR -1
static ncclResult_t nccl_missing(const char* call) {
    fail("%s: this program was built without NCCL, which exchanging gradients between GPUs needs\n  hint: %s",
         call, NCCL_REBUILD_HINT);
    return ncclInvalidUsage;  // not reached
}
static const char* ncclGetErrorString(ncclResult_t) { return "NCCL is not built in"; }
static ncclResult_t ncclGetUniqueId(ncclUniqueId*) { return nccl_missing("ncclGetUniqueId"); }
static ncclResult_t ncclCommInitRankConfig(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) {
    return nccl_missing("ncclCommInitRankConfig");
}
static ncclResult_t ncclCommSplit(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*) { return nccl_missing("ncclCommSplit"); }
static ncclResult_t ncclCommFinalize(ncclComm_t) { return nccl_missing("ncclCommFinalize"); }
static ncclResult_t ncclCommDestroy(ncclComm_t) { return nccl_missing("ncclCommDestroy"); }
static ncclResult_t ncclCommAbort(ncclComm_t) { return nccl_missing("ncclCommAbort"); }
static ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t*) { return nccl_missing("ncclCommGetAsyncError"); }
static ncclResult_t ncclGroupStart(void) { return nccl_missing("ncclGroupStart"); }
static ncclResult_t ncclGroupEnd(void) { return nccl_missing("ncclGroupEnd"); }
static ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return nccl_missing("ncclAllReduce");
}
static ncclResult_t ncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) {
    return nccl_missing("ncclReduce");
}
static ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
    return nccl_missing("ncclBroadcast");
}
static ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return nccl_missing("ncclReduceScatter");
}
static ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
    return nccl_missing("ncclAllGather");
}
static ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return nccl_missing("ncclSend"); }
static ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return nccl_missing("ncclRecv"); }
#endif

// NCCL's error as a message (a non-blocking communicator's ncclInProgress is not one: see nccl_settle)
static void nccl_fail_at(ncclResult_t r, const char* call, const char* file, int line) {
    fail_at(file, line, "%s failed: %s\n  hint: %s", call, ncclGetErrorString(r),
            r == ncclInvalidUsage ? "each rank needs a GPU of its own (two ranks on one GPU are refused)"
                                  : "check that every rank started with the same flags, and NCCL's own log (NCCL_DEBUG=INFO)");
}

// stops where d has several ranks, which exchange gradients through NCCL, and this build has no NCCL
static void nccl_check_built(const Dist* d) {
    if (!nccl_built_with() && d->world > 1) {
        fail("%d ranks, but this program was built without NCCL (-DNO_NCCL: none found, or NCCL=0), so it trains on one GPU\n"
             "  hint: %s; or run one process (or add --offload optimizer, whose step adds the ranks' gradients over MPI)",
             d->world, NCCL_REBUILD_HINT);
    }
}

// ----------------------------------------------------------------------------
// the watchdog: a thread that stops this rank rather than let it wait forever for NCCL, on every launch
// path. Every NCCL_WATCH_POLL_US it asks each communicator whether it failed (a peer that died: NCCL's
// sockets see it closed, InfiniBand after NCCL_IB_TIMEOUT), and looks how long the main thread has
// been inside an NCCL call or a WATCHED_WAIT: past the timeout a peer is alive but stuck (stopped, or
// far behind). Either way it aborts the communicators and ends the process: not fail(), since the main
// thread is inside a CUDA or NCCL call, and exit()'s teardown would wait for it

#define NCCL_WATCH_POLL_US 200000   // the watchdog's look at the communicators and the main thread's wait
#define NCCL_SETTLE_POLL_US 1000    // the main thread's look at a call still in progress
#define NCCL_WATCH_MAX 6            // the world's while it is split, and a rank's groups: data, tensor, pipeline, pair
#define NCCL_ABORT_GRACE_S 10       // should ncclCommAbort itself hang, SIGALRM ends the process after this

static struct {
    pthread_mutex_t lock;
    ncclComm_t comms[NCCL_WATCH_MAX];
    int n, started, rank;
    double timeout_s;   // rendezvous_timeout_s(), read once by the main thread
    pthread_t thread;
    long long waiting_since_us;   // when the main thread's outermost watched wait began; 0: none (atomic)
    const char* waiting_for;      // what it waits for, for the message (atomic)
    int depth;                    // watched waits inside each other (the main thread's own)
} g_nccl_watch = {PTHREAD_MUTEX_INITIALIZER, {NULL}, 0, 0, 0, 0.0, pthread_t(), 0, NULL, 0};

static long long nccl_now_us(void) { return (long long)(rendezvous_now() * 1e6); }

// the main thread begins (and ends) a wait for NCCL's work: a call, or a host wait on a stream or event
// that carries collectives. Two clock reads a wait: nothing in the hot loop polls
static void nccl_wait_begin(const char* what) {
    if (g_nccl_watch.depth++ > 0) { return; }
    __atomic_store_n(&g_nccl_watch.waiting_for, what, __ATOMIC_RELAXED);
    __atomic_store_n(&g_nccl_watch.waiting_since_us, nccl_now_us(), __ATOMIC_RELEASE);
}
static void nccl_wait_end(void) {
    if (--g_nccl_watch.depth == 0) { __atomic_store_n(&g_nccl_watch.waiting_since_us, 0LL, __ATOMIC_RELEASE); }
}
// a host wait (cudaStreamSynchronize, cudaEventSynchronize) under the watchdog's deadline
#define WATCHED_WAIT(call, what) do { nccl_wait_begin(what); CUDA_CHECK(call); nccl_wait_end(); } while (0)

// prints why, aborts every communicator and ends the process (from the watchdog thread, lock held)
[[noreturn]] static void nccl_watch_stop(const char* why, const char* hint, int line) {
    fflush(stdout);
    fprintf(stderr, "error: rank %d: %s, so it aborts NCCL and stops rather than wait\n  hint: %s; the last complete "
            "checkpoint resumes the run (-y 1)\n  (at %s:%d)\n", g_nccl_watch.rank, why, hint, __FILE__, line);
    alarm(NCCL_ABORT_GRACE_S);
    for (int i = 0; i < g_nccl_watch.n; i++) { ncclCommAbort(g_nccl_watch.comms[i]); }
    _exit(EXIT_FAILURE);
}

static void* nccl_watch_loop(void*) {
    for (;;) {
        usleep(NCCL_WATCH_POLL_US);
        pthread_mutex_lock(&g_nccl_watch.lock);
        char why[256];
        for (int i = 0; i < g_nccl_watch.n; i++) {
            ncclResult_t async = ncclSuccess;
            if (ncclCommGetAsyncError(g_nccl_watch.comms[i], &async) != ncclSuccess || async == ncclSuccess || async == ncclInProgress) { continue; }
            snprintf(why, sizeof(why), "NCCL reports %s: a rank died or its network failed", ncclGetErrorString(async));
            nccl_watch_stop(why, "the first rank that stopped says why (NCCL_DEBUG=WARN names the peer NCCL lost)", __LINE__);
        }
        long long since = __atomic_load_n(&g_nccl_watch.waiting_since_us, __ATOMIC_ACQUIRE);
        double waited = since == 0 ? 0.0 : (nccl_now_us() - since) * 1e-6;
        if (waited > g_nccl_watch.timeout_s) {
            snprintf(why, sizeof(why), "waited %.0f s for %s: another rank stopped or stalled", waited,
                     __atomic_load_n(&g_nccl_watch.waiting_for, __ATOMIC_RELAXED));
            nccl_watch_stop(why, "the rank that stopped first says why; one stopped by a debugger or a signal (SIGSTOP) stalls "
                            "the others; LLMC_DIST_TIMEOUT sets the wait (raise it if rank 0's checkpoints take longer)", __LINE__);
        }
        pthread_mutex_unlock(&g_nccl_watch.lock);
    }
    return NULL;
}

// the watchdog runs from this rank's first communicator on
static void nccl_watch_start(int rank) {
    if (g_nccl_watch.started) { return; }
    g_nccl_watch.started = 1;
    g_nccl_watch.rank = rank;
    g_nccl_watch.timeout_s = rendezvous_timeout_s();
    if (pthread_create(&g_nccl_watch.thread, NULL, nccl_watch_loop, NULL) != 0) { fail("cannot start the NCCL watchdog thread"); }
    pthread_detach(g_nccl_watch.thread);
}

// comm joins the watch
static void nccl_watch(ncclComm_t comm) {
    pthread_mutex_lock(&g_nccl_watch.lock);
    if (g_nccl_watch.n == NCCL_WATCH_MAX) { fail("more than %d NCCL communicators to watch", NCCL_WATCH_MAX); }
    g_nccl_watch.comms[g_nccl_watch.n++] = comm;
    pthread_mutex_unlock(&g_nccl_watch.lock);
}

// before comm is destroyed
static void nccl_unwatch(ncclComm_t comm) {
    pthread_mutex_lock(&g_nccl_watch.lock);
    for (int i = 0; i < g_nccl_watch.n; i++) {
        if (g_nccl_watch.comms[i] == comm) { g_nccl_watch.comms[i--] = g_nccl_watch.comms[--g_nccl_watch.n]; }
    }
    pthread_mutex_unlock(&g_nccl_watch.lock);
}

// ----------------------------------------------------------------------------
// non-blocking communicators: a call returns ncclInProgress while NCCL still works on it in the
// background (NCCL's docs: query ncclCommGetAsyncError until it is no longer ncclInProgress before the
// next call on the communicator); this rank waits for that at most the timeout

// waits while comm is in progress; its error, or the timeout, aborts it and stops, saying what it waited for
static void nccl_settle(ncclComm_t comm, const char* what, const char* hint, const char* file, int line) {
    double t0 = rendezvous_now(), limit = rendezvous_timeout_s();
    for (;;) {
        ncclResult_t state = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess) { state = r; }
        if (state == ncclSuccess) { return; }
        double waited = rendezvous_now() - t0;
        if (state != ncclInProgress || waited > limit) {
            ncclCommAbort(comm);
            if (state != ncclInProgress) { nccl_fail_at(state, what, file, line); }
            fail_at(file, line, "%s: no answer from the other ranks in %.0f s (LLMC_DIST_TIMEOUT)\n  hint: %s", what, waited, hint);
        }
        usleep(NCCL_SETTLE_POLL_US);
    }
}

// every NCCL call's check: ncclInProgress is a non-blocking communicator's "issued, still under way":
// every watched communicator is waited for before the program goes on
static void nccl_check_at(ncclResult_t r, const char* call, const char* file, int line) {
    nccl_wait_end();
    if (r == ncclInProgress) {
        pthread_mutex_lock(&g_nccl_watch.lock);
        int n = g_nccl_watch.n;
        ncclComm_t comms[NCCL_WATCH_MAX];
        memcpy(comms, g_nccl_watch.comms, sizeof(comms));
        pthread_mutex_unlock(&g_nccl_watch.lock);
        for (int i = 0; i < n; i++) {
            nccl_settle(comms[i], call, "a rank stopped or stalled: the rank that stopped first says why", file, line);
        }
        return;
    }
    if (r != ncclSuccess) { nccl_fail_at(r, call, file, line); }
}
// the call is a watched wait too (a collective may block in it, as the emulated NCCL's do)
#define NCCL_CHECK(call) (nccl_wait_begin(#call), nccl_check_at((call), #call, __FILE__, __LINE__))

// a communicator of world ranks that every rank joins with rank 0's id, non-blocking; waited for at
// most LLMC_DIST_TIMEOUT (a rank that never started, or ranks that disagree on their number, leave it
// in progress for ever), then watched
static ncclComm_t nccl_comm_create(int world, ncclUniqueId id, int rank, const char* source) {
    nccl_watch_start(rank);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once: this rank can stop waiting
    ncclComm_t comm = NULL;
    static char what[160];  // static: the watchdog may read it while this returns
    snprintf(what, sizeof(what), "NCCL's communicator of %d ranks (this is rank %d; the number from %s)", world, rank, source);
    nccl_wait_begin(what);
    ncclResult_t r = ncclCommInitRankConfig(&comm, world, id, rank, &config);
    nccl_wait_end();
    if (r != ncclSuccess && r != ncclInProgress) { nccl_fail_at(r, what, __FILE__, __LINE__); }
    nccl_settle(comm, what, "every rank must start, with the same number of ranks (WORLD_SIZE, SLURM_STEP_NUM_TASKS, mpirun -np): "
                "ranks started with different numbers (2 and 3), or a rank that never started, leave the others waiting; "
                "NCCL_DEBUG=WARN says more", __FILE__, __LINE__);
    nccl_watch(comm);
    return comm;
}

// comm's end: finished (a non-blocking communicator's ncclCommFinalize may be in progress), then freed
static void nccl_comm_destroy(ncclComm_t comm) {
    NCCL_CHECK(ncclCommFinalize(comm));
    nccl_unwatch(comm);
    NCCL_CHECK(ncclCommDestroy(comm));
}

// ----------------------------------------------------------------------------
// processes that MPI does not join (srun, torchrun-style variables: dist_by_env()): a communicator of
// their own carries the host's collectives (llmc/distributed.h's DistCarrier), each through a small
// device buffer, waited for with a timeout that notices a rank that died

#define NCCL_HOST_STAGING_BYTES (1 << 20)   // host collectives go through the GPU in pieces of this size
#define NCCL_HOST_POLL_US 1000

static struct {
    ncclComm_t comm;
    cudaStream_t stream;
    char* staging;   // NCCL_HOST_STAGING_BYTES on the device
    double timeout_s;
    const char* what;   // the collective being waited for, for the message
} g_nccl_host;

// waits for the host comm's collective; a rank that died or stopped makes NCCL report an error
// (ncclCommGetAsyncError) or the wait run past the timeout: either aborts the communicator and stops
static void nccl_host_wait(void) {
    double t0 = rendezvous_now();
    for (;;) {
        cudaError_t e = cudaStreamQuery(g_nccl_host.stream);
        if (e == cudaSuccess) { return; }
        if (e != cudaErrorNotReady) { CUDA_CHECK(e); }
        ncclResult_t async = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(g_nccl_host.comm, &async));
        double waited = rendezvous_now() - t0;
        if ((async != ncclSuccess && async != ncclInProgress) || waited > g_nccl_host.timeout_s) {
            ncclCommAbort(g_nccl_host.comm);
            fail("%s between the ranks: %s after %.0f s: a rank died or stopped\n  hint: the first rank that stopped says why "
                 "(NCCL_DEBUG=WARN names the peer NCCL lost); the last complete checkpoint resumes the run (-y 1); "
                 "LLMC_DIST_TIMEOUT sets the wait", g_nccl_host.what, async != ncclSuccess ? ncclGetErrorString(async) : "no answer", waited);
        }
        usleep(NCCL_HOST_POLL_US);
    }
}

static ncclDataType_t nccl_host_type(DistType type, size_t* bytes) {
    switch (type) {
        case DIST_FLOAT: *bytes = sizeof(float); return ncclFloat;
        case DIST_DOUBLE: *bytes = sizeof(double); return ncclDouble;
        case DIST_UINT64: *bytes = sizeof(uint64_t); return ncclUint64;
        case DIST_INT: *bytes = sizeof(int); return ncclInt32;
        default: *bytes = 1; return ncclInt8;  // DIST_BYTE
    }
}

static ncclRedOp_t nccl_host_op(DistOp op) { return op == DIST_MIN ? ncclMin : op == DIST_MAX ? ncclMax : ncclSum; }

// the collectives nccl_host_collective runs; a reduce changes only root's buf
typedef enum { HOST_ALLREDUCE, HOST_BROADCAST, HOST_REDUCE } HostCollective;

// one collective on host memory, in pieces through the staging buffer (root: a broadcast's source,
// a reduce's destination)
static void nccl_host_collective(void* buf, size_t n, DistType type, DistOp op, HostCollective kind, int root, const char* what) {
    size_t eb;
    ncclDataType_t t = nccl_host_type(type, &eb);
    ncclRedOp_t o = nccl_host_op(op);
    size_t per = NCCL_HOST_STAGING_BYTES / eb;
    g_nccl_host.what = what;
    for (size_t done = 0; done < n; done += per) {
        size_t k = n - done < per ? n - done : per;
        char* piece = (char*)buf + done * eb;
        void* staging = g_nccl_host.staging;
        CUDA_CHECK(cudaMemcpyAsync(staging, piece, k * eb, cudaMemcpyHostToDevice, g_nccl_host.stream));
        switch (kind) {
            case HOST_ALLREDUCE: NCCL_CHECK(ncclAllReduce(staging, staging, k, t, o, g_nccl_host.comm, g_nccl_host.stream)); break;
            case HOST_BROADCAST: NCCL_CHECK(ncclBroadcast(staging, staging, k, t, root, g_nccl_host.comm, g_nccl_host.stream)); break;
            case HOST_REDUCE: NCCL_CHECK(ncclReduce(staging, staging, k, t, o, root, g_nccl_host.comm, g_nccl_host.stream)); break;
        }
        CUDA_CHECK(cudaMemcpyAsync(piece, staging, k * eb, cudaMemcpyDeviceToHost, g_nccl_host.stream));
        nccl_host_wait();
    }
}

static void nccl_host_allreduce(void* buf, size_t n, DistType type, DistOp op) {
    nccl_host_collective(buf, n, type, op, HOST_ALLREDUCE, 0, "an all-reduce");
}
static void nccl_host_broadcast(void* buf, size_t bytes, int root) {
    nccl_host_collective(buf, bytes, DIST_BYTE, DIST_SUM, HOST_BROADCAST, root, "a broadcast");
}

// rank r's part := the sum of that part over the ranks: a reduce to each part's owner (a reduce
// leaves the others' buffers as they were: this rank's own values, as MPI's in-place reduce-scatter)
static void nccl_host_reduce_scatter(float* buf, const int* counts, int rank, int world) {
    (void)rank;
    for (int r = 0; r < world; r++) {
        nccl_host_collective(buf + dist_part_offset(counts, r), (size_t)counts[r], DIST_FLOAT, DIST_SUM, HOST_REDUCE, r, "a reduce-scatter");
    }
}

static void nccl_host_allgather(float* buf, const int* counts, int rank, int world) {
    (void)rank;
    for (int r = 0; r < world; r++) {
        nccl_host_collective(buf + dist_part_offset(counts, r), (size_t)counts[r], DIST_FLOAT, DIST_SUM, HOST_BROADCAST, r, "an all-gather");
    }
}

static void nccl_stop_by_env(void) {
    if (g_nccl_host.comm == NULL) { return; }
    CUDA_CHECK(cudaFree(g_nccl_host.staging));
    CUDA_CHECK(cudaStreamDestroy(g_nccl_host.stream));
    nccl_comm_destroy(g_nccl_host.comm);
    g_nccl_host.comm = NULL;
}

// srun or torchrun-style variables started d's processes: each takes the GPU of its local rank, rank 0's
// NCCL id reaches the others as method (--dist-init) says, and their communicator carries the host's
// collectives (distributed.h); the machine's ranks are counted by host name
static void nccl_start_by_env(Dist* d, const char* method) {
    if (!nccl_built_with()) {
        fail("%s says %d processes, but this program was built without NCCL, which joins them without MPI\n  hint: %s",
             dist_source(), d->world, NCCL_REBUILD_HINT);
    }
    if (method[0] == '\0') {
        fail("%s says %d processes (rank %d): --dist-init is needed, for rank 0 to hand NCCL's id to the others\n"
             "  hint: --dist-init file:DIR (a folder every rank sees) or tcp:HOST:PORT (rank 0's machine, a free port; "
             "not torchrun's MASTER_PORT); or launch with mpirun", dist_source(), d->world, d->rank);
    }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) { fail("%s: rank %d finds no GPU", dist_source(), d->rank); }
    if (g_dist_env_local_rank >= devices) {
        fail("%s: rank %d is local rank %d, but this machine has %d GPU(s): each rank needs a GPU of its own\n"
             "  hint: start at most %d processes per machine", dist_source(), d->rank, g_dist_env_local_rank, devices, devices);
    }
    CUDA_CHECK(cudaSetDevice(g_dist_env_local_rank));
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (d->rank == 0) { NCCL_CHECK(ncclGetUniqueId(&id)); }
    rendezvous_share(method, d->rank, d->world, dist_settings_hash(), &id, sizeof(id));
    g_nccl_host.timeout_s = rendezvous_timeout_s();
    g_nccl_host.comm = nccl_comm_create(d->world, id, d->rank, dist_source());
    CUDA_CHECK(cudaStreamCreateWithFlags(&g_nccl_host.stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMalloc((void**)&g_nccl_host.staging, NCCL_HOST_STAGING_BYTES));
    DistCarrier c = {nccl_host_allreduce, nccl_host_broadcast, nccl_host_reduce_scatter, nccl_host_allgather, nccl_stop_by_env,
                     g_dist_env_local_rank, 1};
    dist_set_carrier(&c);
    // the ranks on this machine (they share its memory): host names hashed into one slot per rank
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    uint64_t h = 1469598103934665603ull;
    for (const char* p = host; *p; p++) { h = (h ^ (unsigned char)*p) * 1099511628211ull; }
    uint64_t* hosts = (uint64_t*)calloc((size_t)d->world, sizeof(uint64_t));
    if (hosts == NULL) { fail("out of memory"); }
    hosts[d->rank] = h;
    dist_carrier("nccl_start_by_env")->allreduce(hosts, (size_t)d->world, DIST_UINT64, DIST_MAX);
    int here = 0, before = 0;
    for (int r = 0; r < d->world; r++) { here += hosts[r] == h; before += r < d->rank && hosts[r] == h; }
    free(hosts);
    if (before != g_dist_env_local_rank) {
        fail("%s: rank %d says local rank %d, but it is rank %d of the %d on host %s\n  hint: the launcher's local ranks "
             "must count the ranks of each machine in rank order (torchrun's and srun's do)", dist_source(), d->rank, g_dist_env_local_rank, before, here, host);
    }
    c.local_ranks = here;
    dist_set_carrier(&c);
}

// rank 0 makes NCCL's unique id, MPI (or the carrier of the host's collectives) takes it to the
// others, and every rank joins
static ncclComm_t nccl_init(const Dist* d) {
    nccl_check_built(d);
    ncclUniqueId id;
    if (d->rank == 0) { NCCL_CHECK(ncclGetUniqueId(&id)); }
    dist_broadcast_bytes(&id, sizeof(id), 0);
    return nccl_comm_create(d->world, id, d->rank, dist_source());
}

// the communicator of the ranks of parent that pass the same color (ordered by key), non-blocking and
// watched as nccl_comm_create's; NULL for NCCL_SPLIT_NOCOLOR. Every rank of parent calls it (ncclCommSplit,
// NCCL 2.18 on). what: the group, for the messages
static ncclComm_t nccl_comm_split(ncclComm_t parent, int color, int key, const char* what) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    static char says[2][160];  // static: the watchdog may read it while this returns
    char* text = says[color == NCCL_SPLIT_NOCOLOR ? 0 : 1];
    snprintf(text, sizeof(says[0]), "NCCL's communicator of the %s group (ncclCommSplit)", what);
    nccl_wait_begin(text);
    ncclResult_t r = ncclCommSplit(parent, color, key, &comm, &config);
    nccl_wait_end();
    if (r != ncclSuccess && r != ncclInProgress) { nccl_fail_at(r, text, __FILE__, __LINE__); }
    const char* hint = "every rank must split the world's communicator alike (the same --tp on every rank): NCCL_DEBUG=WARN says more";
    nccl_settle(parent, text, hint, __FILE__, __LINE__);
    if (comm == NULL) { return NULL; }
    nccl_settle(comm, text, hint, __FILE__, __LINE__);
    nccl_watch(comm);
    return comm;
}

// the NCCL communicators of this rank's groups (llmc/distributed.h's grid: tensor-parallel groups of tp
// adjacent ranks, data-parallel groups across them within a stage, pipeline groups of pp stages across
// the stages' blocks, and each pipeline group's pair of its first and last stage): data (NULL unless
// want_data: the gradients' exchange, ZeRO's), tensor (NULL without --tp: a block's sums), pipeline (NULL
// without --pp: the stages' messages) and pair (NULL but on a first or last stage with --pp: wte's gradient
// sum). Without --tp and --pp the data group is the world and its communicator is made as it always was;
// else the world's is made and split by the colors dist_grid gives MPI (a stage's block of dp tp ranks:
// data, stage tp + the place in the tensor group; tensor, rank / tp; pipeline, the place in the block;
// pair, that place on the first and last stage), key the world rank (so a group's ranks are dist_grid's),
// then freed. Every rank of the world calls it with the same tp, pp and want_data
typedef struct { ncclComm_t data, tensor, pipeline, pair; } NcclGroups;

static NcclGroups nccl_init_groups(const Dist* world, const Dist* data, int tp, int pp, int want_data) {
    NcclGroups g = {NULL, NULL, NULL, NULL};
    if (tp <= 1 && pp <= 1) {
        if (want_data) { g.data = nccl_init(data); }
        return g;
    }
    int block = world->world / pp, stage = world->rank / block, local = world->rank % block, in_pair = stage == 0 || stage == pp - 1;
    ncclComm_t all = nccl_init(world);
    g.data = nccl_comm_split(all, want_data ? stage * tp + local % tp : NCCL_SPLIT_NOCOLOR, world->rank, "data-parallel");
    if (tp > 1) { g.tensor = nccl_comm_split(all, world->rank / tp, world->rank, "tensor-parallel"); }
    if (pp > 1) {
        g.pipeline = nccl_comm_split(all, local, world->rank, "pipeline");
        g.pair = nccl_comm_split(all, in_pair ? local : NCCL_SPLIT_NOCOLOR, world->rank, "embedding pair (--pp)");
    }
    nccl_comm_destroy(all);
    return g;
}

#endif // CUDA_NCCL_CUH
