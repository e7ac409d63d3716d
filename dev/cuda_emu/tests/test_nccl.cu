/*
test_nccl.cu: each NCCL collective (all-reduce, reduce-scatter, all-gather, broadcast) with ncclSum
and ncclAvg, in fp32, bf16 and fp64 (the optimizers' statistics: cuda/adafactor.cuh), between the processes of one run, set up as the trainer does it:
rank 0 makes the ncclUniqueId and MPI sends it to the others, and each rank of a host uses the GPU
of its local rank. Two more modes check what NCCL and CUDA refuse on a host with fewer GPUs than ranks:

    mpirun -np 2 test_nccl                           collectives, rank r on device (local rank)
    test_nccl                                        the same with one rank (without MPI too)
    mpirun -np 2 test_nccl same-device               every rank on device 0: ncclCommInitRank
                                                     returns ncclInvalidUsage (as on a real GPU)
    CUDA_EMU_DEVICES=1 mpirun -np 2 test_nccl more-ranks-than-devices
                                                     cudaSetDevice(local rank) is cudaErrorInvalidDevice
                                                     on the ranks the host has no GPU for

Two checks are about when collectives run (CUDA_EMU_STREAMS=late-nccl keeps them queued):

    mpirun -np 2 test_nccl                           (also) rank 0 synchronizes a queued all-reduce
                                                     while rank 1 first waits in MPI_Barrier: fine
                                                     on a GPU, and must not hang here either
    CUDA_EMU_STREAMS=late-nccl test_nccl missing-waits
                                                     a stream that overwrites a collective's input
                                                     and one that reads its output, neither waiting
                                                     for it: wrong results, two FAIL lines (a wrong
                                                     program: run_tests.sh expects them; a GPU
                                                     races, so gpu_check.sh does not run it)

Communicators split from the world (ncclCommSplit, as the trainer's --tp makes its groups: cuda/nccl.cuh):
the ranks of each color form one, ordered by key; a rank that passes NCCL_SPLIT_NOCOLOR gets none; a
split's all-reduce adds its own ranks only.

Point to point (ncclSend, ncclRecv, as the trainer's --pp passes activations between stages:
cuda/pipeline.cuh), in fp32 and bf16: a ring in one group (each rank sends to the next and receives from
the one before: every rank sends first, which only a group lets finish), an exchange with a partner in
one group (a send and the receive after it), two messages on one link matched in order (outside groups;
one rank: to itself in one group), and a rank's receive read by the next work on its stream. One more
mode is a wrong program that must hang, as on a GPU:

    mpirun -np 2 test_nccl p2p-no-group              both ranks send to each other first, outside a
                                                     group: each send waits for a receive the other
                                                     never reaches (run_tests.sh expects the timeout)

(built with -DUSE_MPI for more than one rank.) Rank r contributes x_r[i] = (r + 1) * (i + 1) / 8,
exact in bf16 for the sizes used, so the expected sums and averages are exact in every type.
fp64 has one more check: an all-reduce of values whose sum is exact in double but not in float (a
reduction in fp32 would round it).
*/
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <vector>
#include "check.h"
#ifdef USE_MPI
#include <mpi.h>
#endif

#define NCCL_CHECK(call) nccl_check_at((call), #call, __FILE__, __LINE__)
static void nccl_check_at(ncclResult_t r, const char* call, const char* file, int line) {
    if (r != ncclSuccess) {
        fprintf(stderr, "error: %s failed: %s\n  (at %s:%d)\n", call, ncclGetErrorString(r), file, line);
        exit(EXIT_FAILURE);
    }
}

static const int COUNT = 12;  // elements per rank chunk

static float contribution(int rank, int i) { return (float)((rank + 1) * (i + 1)) / 8.0f; }

// a device buffer of n values in fp32, bf16 or fp64, filled from values (or NaN bytes when null)
struct buffer {
    void* ptr;
    int n;
    ncclDataType_t type;
};

static size_t element_bytes(ncclDataType_t type) {
    return type == ncclFloat ? sizeof(float) : type == ncclDouble ? sizeof(double) : sizeof(__nv_bfloat16);
}

static const char* type_name_of(ncclDataType_t type) { return type == ncclFloat ? "fp32" : type == ncclDouble ? "fp64" : "bf16"; }

// values are held as doubles on the host: exact for every value of fp32, bf16 and fp64
static buffer make_buffer(int n, ncclDataType_t type, const std::vector<double>* values) {
    buffer b = {nullptr, n, type};
    CUDA_CHECK(cudaMalloc(&b.ptr, n * element_bytes(type)));
    if (values == nullptr) { return b; }
    if (type == ncclDouble) {
        CUDA_CHECK(cudaMemcpy(b.ptr, values->data(), n * sizeof(double), cudaMemcpyHostToDevice));
    } else if (type == ncclFloat) {
        std::vector<float> h(values->begin(), values->end());
        CUDA_CHECK(cudaMemcpy(b.ptr, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    } else {
        std::vector<__nv_bfloat16> h(n);
        for (int i = 0; i < n; i++) { h[i] = __float2bfloat16((float)(*values)[i]); }
        CUDA_CHECK(cudaMemcpy(b.ptr, h.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    }
    return b;
}

static std::vector<double> read_buffer(const buffer& b) {
    std::vector<double> out(b.n);
    if (b.type == ncclDouble) {
        CUDA_CHECK(cudaMemcpy(out.data(), b.ptr, b.n * sizeof(double), cudaMemcpyDeviceToHost));
    } else if (b.type == ncclFloat) {
        std::vector<float> h(b.n);
        CUDA_CHECK(cudaMemcpy(h.data(), b.ptr, b.n * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < b.n; i++) { out[i] = h[i]; }
    } else {
        std::vector<__nv_bfloat16> h(b.n);
        CUDA_CHECK(cudaMemcpy(h.data(), b.ptr, b.n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
        for (int i = 0; i < b.n; i++) { out[i] = __bfloat162float(h[i]); }
    }
    return out;
}

static bool equal(const std::vector<double>& got, const std::vector<double>& want, char* detail, size_t detail_size) {
    for (size_t i = 0; i < want.size(); i++) {
        if (got[i] != want[i]) {
            snprintf(detail, detail_size, "element %zu: got %.17g want %.17g", i, got[i], want[i]);
            return false;
        }
    }
    return true;
}

static void test_collectives(ncclComm_t comm, int rank, int nranks, ncclDataType_t type, cudaStream_t stream) {
    const char* type_name = type_name_of(type);
    char name[96], detail[128] = "";
    int total = COUNT * nranks;

    for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
        const char* op_name = op == ncclSum ? "sum" : "avg";
        // all-reduce over COUNT * nranks elements; reduce-scatter of the same input
        std::vector<double> mine(total), want(total);
        for (int i = 0; i < total; i++) {
            mine[i] = contribution(rank, i);
            float sum = 0.0f;  // exact
            for (int r = 0; r < nranks; r++) { sum += contribution(r, i); }
            want[i] = op == ncclSum ? sum : sum / nranks;
        }
        buffer send = make_buffer(total, type, &mine), recv = make_buffer(total, type, nullptr);
        NCCL_CHECK(ncclAllReduce(send.ptr, recv.ptr, total, type, op, comm, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        snprintf(name, sizeof name, "ncclAllReduce %s %s, %d ranks", op_name, type_name, nranks);
        check(equal(read_buffer(recv), want, detail, sizeof detail), name, "%s", detail);

        buffer chunk = make_buffer(COUNT, type, nullptr);
        NCCL_CHECK(ncclReduceScatter(send.ptr, chunk.ptr, COUNT, type, op, comm, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<double> want_chunk(want.begin() + rank * COUNT, want.begin() + (rank + 1) * COUNT);
        snprintf(name, sizeof name, "ncclReduceScatter %s %s, %d ranks", op_name, type_name, nranks);
        check(equal(read_buffer(chunk), want_chunk, detail, sizeof detail), name, "%s", detail);
        for (buffer* b : {&send, &recv, &chunk}) { CUDA_CHECK(cudaFree(b->ptr)); }
    }

    // all-gather, in place: each rank's chunk already sits at its place in the full buffer
    std::vector<double> full(total), want(total);
    for (int i = 0; i < total; i++) {
        int owner = i / COUNT;
        full[i] = owner == rank ? contribution(rank, i) : -1.0f;
        want[i] = contribution(owner, i);
    }
    buffer gathered = make_buffer(total, type, &full);
    char* my_chunk = (char*)gathered.ptr + rank * COUNT * element_bytes(type);
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclAllGather(my_chunk, gathered.ptr, COUNT, type, comm, stream));
    NCCL_CHECK(ncclGroupEnd());
    CUDA_CHECK(cudaStreamSynchronize(stream));
    snprintf(name, sizeof name, "ncclAllGather in place %s, %d ranks", type_name, nranks);
    check(equal(read_buffer(gathered), want, detail, sizeof detail), name, "%s", detail);
    CUDA_CHECK(cudaFree(gathered.ptr));

    // broadcast from the last rank
    int root = nranks - 1;
    std::vector<double> values(COUNT), want_root(COUNT);
    for (int i = 0; i < COUNT; i++) {
        values[i] = rank == root ? contribution(root, i) : 0.0f;
        want_root[i] = contribution(root, i);
    }
    buffer b = make_buffer(COUNT, type, &values);
    NCCL_CHECK(ncclBroadcast(b.ptr, b.ptr, COUNT, type, root, comm, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    snprintf(name, sizeof name, "ncclBroadcast from rank %d %s, %d ranks", root, type_name, nranks);
    check(equal(read_buffer(b), want_root, detail, sizeof detail), name, "%s", detail);
    CUDA_CHECK(cudaFree(b.ptr));
}

// fp64 sums in fp64: rank r adds 1 + r 2^-40, whose sum over the ranks float would round to 1 or 2
static void test_double_sum(ncclComm_t comm, int rank, int nranks, cudaStream_t stream) {
    std::vector<double> mine(COUNT, 1.0 + rank * ldexp(1.0, -40)), want(COUNT, 0.0);
    for (int r = 0; r < nranks; r++) {
        for (int i = 0; i < COUNT; i++) { want[i] += 1.0 + r * ldexp(1.0, -40); }
    }
    buffer b = make_buffer(COUNT, ncclDouble, &mine);
    NCCL_CHECK(ncclAllReduce(b.ptr, b.ptr, COUNT, ncclDouble, ncclSum, comm, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    char name[96], detail[128] = "";
    snprintf(name, sizeof name, "ncclAllReduce sum fp64 in place adds in fp64, %d ranks", nranks);
    check(equal(read_buffer(b), want, detail, sizeof detail), name, "%s", detail);
    CUDA_CHECK(cudaFree(b.ptr));
}

// a queued all-reduce that rank 0 waits for at once, while the other ranks first wait for rank 0 in
// MPI_Barrier. On a GPU their all-reduce runs meanwhile; under late-nccl the emulator must run it
// before the barrier (emu_mpi.cpp), or rank 0 waits inside the all-reduce and the others in the barrier
static void test_host_wait_between(ncclComm_t comm, int rank, int nranks, cudaStream_t stream) {
    std::vector<double> mine(COUNT), want(COUNT);
    for (int i = 0; i < COUNT; i++) {
        mine[i] = contribution(rank, i);
        for (int r = 0; r < nranks; r++) { want[i] += contribution(r, i); }
    }
    buffer b = make_buffer(COUNT, ncclFloat, &mine);
    NCCL_CHECK(ncclAllReduce(b.ptr, b.ptr, COUNT, ncclFloat, ncclSum, comm, stream));
    if (rank == 0) { CUDA_CHECK(cudaStreamSynchronize(stream)); }
#ifdef USE_MPI
    MPI_Barrier(MPI_COMM_WORLD);
#endif
    CUDA_CHECK(cudaStreamSynchronize(stream));
    char name[128], detail[128] = "";
    snprintf(name, sizeof name, "an all-reduce rank 0 synchronizes while the others wait in MPI_Barrier, %d ranks", nranks);
    check(equal(read_buffer(b), want, detail, sizeof detail), name, "%s", detail);
    CUDA_CHECK(cudaFree(b.ptr));
}

// ncclCommSplit: the even and the odd ranks, each group in decreasing rank order (key -rank): its
// ranks, its size and an all-reduce over it; then a split the odd ranks stay out of (NCCL_SPLIT_NOCOLOR)
static void test_split(ncclComm_t comm, int rank, int nranks, cudaStream_t stream) {
    ncclComm_t half = nullptr;
    NCCL_CHECK(ncclCommSplit(comm, rank % 2, -rank, &half, nullptr));
    int members = 0, above = 0;  // ranks of this color, and those of them above this one (before it by key)
    for (int r = rank % 2; r < nranks; r += 2) { members++; above += r > rank; }
    int got_rank = -1, got_count = -1;
    NCCL_CHECK(ncclCommUserRank(half, &got_rank));
    NCCL_CHECK(ncclCommCount(half, &got_count));
    char name[128], detail[128] = "";
    snprintf(name, sizeof name, "ncclCommSplit by parity, key -rank: the group's ranks in key order, %d ranks", nranks);
    check(got_rank == above && got_count == members, name, "rank %d: rank %d of %d, want %d of %d", rank, got_rank, got_count,
          above, members);
    std::vector<double> mine(COUNT), want(COUNT);
    for (int i = 0; i < COUNT; i++) {
        mine[i] = contribution(rank, i);
        for (int r = rank % 2; r < nranks; r += 2) { want[i] += contribution(r, i); }
    }
    buffer b = make_buffer(COUNT, ncclFloat, &mine);
    NCCL_CHECK(ncclAllReduce(b.ptr, b.ptr, COUNT, ncclFloat, ncclSum, half, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    snprintf(name, sizeof name, "ncclCommSplit by parity: an all-reduce adds the group's ranks only, %d ranks", nranks);
    check(equal(read_buffer(b), want, detail, sizeof detail), name, "%s", detail);
    CUDA_CHECK(cudaFree(b.ptr));
    NCCL_CHECK(ncclCommDestroy(half));
    ncclComm_t evens = nullptr;
    NCCL_CHECK(ncclCommSplit(comm, rank % 2 == 0 ? 0 : NCCL_SPLIT_NOCOLOR, rank, &evens, nullptr));
    snprintf(name, sizeof name, "ncclCommSplit with NCCL_SPLIT_NOCOLOR: no communicator for the odd ranks, %d ranks", nranks);
    check((evens == nullptr) == (rank % 2 == 1), name, "rank %d got %s", rank, evens == nullptr ? "none" : "one");
    if (evens != nullptr) { NCCL_CHECK(ncclCommDestroy(evens)); }
}

// point to point: rank r's message i is r * 100 + i + 1 (exact in bf16 for the sizes used)
static std::vector<double> message_of(int rank, int salt) {
    std::vector<double> v(COUNT);
    for (int i = 0; i < COUNT; i++) { v[i] = rank * 100 + salt * 20 + i + 1; }
    return v;
}

static void test_p2p(ncclComm_t comm, int rank, int nranks, ncclDataType_t type, cudaStream_t stream) {
    const char* type_name = type_name_of(type);
    char name[128], detail[128] = "";
    // a ring in one group: every rank sends to the next first (one rank: to itself)
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    std::vector<double> mine = message_of(rank, 0);
    buffer send = make_buffer(COUNT, type, &mine), recv = make_buffer(COUNT, type, nullptr);
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(send.ptr, COUNT, type, next, comm, stream));
    NCCL_CHECK(ncclRecv(recv.ptr, COUNT, type, prev, comm, stream));
    NCCL_CHECK(ncclGroupEnd());
    CUDA_CHECK(cudaStreamSynchronize(stream));
    snprintf(name, sizeof name, "ncclSend to the next rank, ncclRecv from the one before, one group (a ring) %s, %d ranks", type_name, nranks);
    check(equal(read_buffer(recv), message_of(prev, 0), detail, sizeof detail), name, "%s", detail);
    // an exchange with a partner (rank ^ 1, or itself): a send, then the receive after it, one group
    int partner = (rank ^ 1) < nranks ? rank ^ 1 : rank;
    std::vector<double> out = message_of(rank, 1);
    buffer a = make_buffer(COUNT, type, &out), b = make_buffer(COUNT, type, nullptr);
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(a.ptr, COUNT, type, partner, comm, stream));
    NCCL_CHECK(ncclRecv(b.ptr, COUNT, type, partner, comm, stream));
    NCCL_CHECK(ncclGroupEnd());
    // the next work on the stream reads the receive's output (a copy: late-nccl keeps both queued)
    buffer copy = make_buffer(COUNT, type, nullptr);
    CUDA_CHECK(cudaMemcpyAsync(copy.ptr, b.ptr, COUNT * element_bytes(type), cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    snprintf(name, sizeof name, "an exchange with rank %d (a send, the receive after it, one group), read on the stream %s, %d ranks",
             partner, type_name, nranks);
    check(equal(read_buffer(copy), message_of(partner, 1), detail, sizeof detail), name, "rank %d: %s", rank, detail);
    // two messages on one link meet their receives in order: rank 0 to rank 1 outside groups (one rank: to itself, in one group)
    int from = 0, to = nranks > 1 ? 1 : 0;
    std::vector<double> m0 = message_of(rank, 2), m1 = message_of(rank, 3);
    buffer s0 = make_buffer(COUNT, type, &m0), s1 = make_buffer(COUNT, type, &m1);
    buffer r0 = make_buffer(COUNT, type, nullptr), r1 = make_buffer(COUNT, type, nullptr);
    if (nranks == 1) { NCCL_CHECK(ncclGroupStart()); }
    if (rank == from) {
        NCCL_CHECK(ncclSend(s0.ptr, COUNT, type, to, comm, stream));
        NCCL_CHECK(ncclSend(s1.ptr, COUNT, type, to, comm, stream));
    }
    if (rank == to) {
        NCCL_CHECK(ncclRecv(r0.ptr, COUNT, type, from, comm, stream));
        NCCL_CHECK(ncclRecv(r1.ptr, COUNT, type, from, comm, stream));
    }
    if (nranks == 1) { NCCL_CHECK(ncclGroupEnd()); }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (rank == to) {
        snprintf(name, sizeof name, "two messages from rank %d to rank %d meet the two receives in order %s", from, to, type_name);
        bool first = equal(read_buffer(r0), message_of(from, 2), detail, sizeof detail);
        check(first && equal(read_buffer(r1), message_of(from, 3), detail, sizeof detail), name, "%s", detail);
    }
    for (buffer* x : {&send, &recv, &a, &b, &copy, &s0, &s1, &r0, &r1}) { CUDA_CHECK(cudaFree(x->ptr)); }
}

// ----------------------------------------------------------------------------
// devices

enum test_mode { COLLECTIVES, SAME_DEVICE, MORE_RANKS_THAN_DEVICES, MISSING_WAITS, P2P_NO_GROUP };

// rank 0 makes the id, every rank gets it
static ncclUniqueId shared_unique_id(int rank) {
    ncclUniqueId id;
    if (rank == 0) { NCCL_CHECK(ncclGetUniqueId(&id)); }
#ifdef USE_MPI
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
    return id;
}

static void run_collectives(int rank, int nranks, int local_rank) {
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (local_rank >= devices) {
        fprintf(stderr, "error: rank %d is local rank %d of its host, which has %d CUDA device(s)\n"
                "  hint: run at most %d ranks per host\n", rank, local_rank, devices, devices);
        exit(EXIT_FAILURE);
    }
    CUDA_CHECK(cudaSetDevice(local_rank));
    ncclUniqueId id = shared_unique_id(rank);
    ncclComm_t comm;
    NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, rank));
    int comm_device = -1;
    NCCL_CHECK(ncclCommCuDevice(comm, &comm_device));
    char name[96];
    snprintf(name, sizeof name, "ncclCommCuDevice is the device of the local rank, %d ranks", nranks);
    check(comm_device == local_rank, name, "rank %d: device %d, local rank %d", rank, comm_device, local_rank);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    test_collectives(comm, rank, nranks, ncclFloat, stream);
    test_collectives(comm, rank, nranks, ncclBfloat16, stream);
    test_collectives(comm, rank, nranks, ncclDouble, stream);
    test_double_sum(comm, rank, nranks, stream);
    test_host_wait_between(comm, rank, nranks, stream);
    test_split(comm, rank, nranks, stream);
    test_p2p(comm, rank, nranks, ncclFloat, stream);
    test_p2p(comm, rank, nranks, ncclBfloat16, stream);
    CUDA_CHECK(cudaStreamDestroy(stream));
    NCCL_CHECK(ncclCommDestroy(comm));
}

// a wrong program, as the ZeRO code would be without its waits: the comm stream copies src into the
// send buffer and all-reduces it into out; the compute stream clears src (without waiting for the
// copy: `taken`) and copies out away (without waiting for the all-reduce: `reduced`). Where the
// collective runs at its call both happen to work; under late-nccl both fail
static void run_missing_waits(int rank, int nranks, int local_rank) {
    CUDA_CHECK(cudaSetDevice(local_rank));
    ncclUniqueId id = shared_unique_id(rank);
    ncclComm_t comm;
    NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, rank));
    cudaStream_t compute, comm_stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
    std::vector<double> mine(COUNT), want(COUNT);
    for (int i = 0; i < COUNT; i++) {
        mine[i] = contribution(rank, i);
        for (int r = 0; r < nranks; r++) { want[i] += contribution(r, i); }
    }
    buffer src = make_buffer(COUNT, ncclFloat, &mine), send = make_buffer(COUNT, ncclFloat, nullptr);
    buffer out = make_buffer(COUNT, ncclFloat, nullptr), copy = make_buffer(COUNT, ncclFloat, nullptr);
    size_t bytes = COUNT * sizeof(float);
    CUDA_CHECK(cudaMemcpyAsync(send.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice, comm_stream));
    NCCL_CHECK(ncclAllReduce(send.ptr, out.ptr, COUNT, ncclFloat, ncclSum, comm, comm_stream));
    CUDA_CHECK(cudaMemsetAsync(src.ptr, 0, bytes, compute));  // missing: a wait for the copy into send
    CUDA_CHECK(cudaMemcpyAsync(copy.ptr, out.ptr, bytes, cudaMemcpyDeviceToDevice, compute));  // missing: a wait for the all-reduce
    CUDA_CHECK(cudaStreamSynchronize(compute));
    CUDA_CHECK(cudaStreamSynchronize(comm_stream));
    char detail[128] = "";
    check(equal(read_buffer(out), want, detail, sizeof detail), "missing wait: the all-reduce of an input cleared without "
          "waiting for the copy that reads it", "%s", detail);
    check(equal(read_buffer(copy), want, detail, sizeof detail), "missing wait: the all-reduce's output, copied without "
          "waiting for it", "%s", detail);
    for (buffer* b : {&src, &send, &out, &copy}) { CUDA_CHECK(cudaFree(b->ptr)); }
    CUDA_CHECK(cudaStreamDestroy(compute));
    CUDA_CHECK(cudaStreamDestroy(comm_stream));
    NCCL_CHECK(ncclCommDestroy(comm));
}

// a wrong program: two ranks each send to the other first and then receive, outside a group. Each
// send waits for the other's receive, which comes after the other's send: a GPU hangs, and so must
// the emulator (run_tests.sh runs it under a timeout)
static void run_p2p_no_group(int rank, int nranks, int local_rank) {
    CUDA_CHECK(cudaSetDevice(local_rank));
    ncclUniqueId id = shared_unique_id(rank);
    ncclComm_t comm;
    NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, rank));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    int partner = rank ^ 1;
    std::vector<double> mine = message_of(rank, 0);
    buffer send = make_buffer(COUNT, ncclFloat, &mine), recv = make_buffer(COUNT, ncclFloat, nullptr);
    if (partner < nranks) {
        NCCL_CHECK(ncclSend(send.ptr, COUNT, ncclFloat, partner, comm, stream));
        NCCL_CHECK(ncclRecv(recv.ptr, COUNT, ncclFloat, partner, comm, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    check(false, "an exchange outside a group finished: it must hang, as on a GPU", "rank %d", rank);
}

// every rank on device 0: refused on every rank (one check per rank)
static void run_same_device(int rank, int nranks, int local_ranks) {
    if (local_ranks < 2) {
        fprintf(stderr, "error: same-device needs two or more ranks on one host\n"
                "  hint: mpirun -np 2 test_nccl same-device\n");
        exit(EXIT_FAILURE);
    }
    CUDA_CHECK(cudaSetDevice(0));
    ncclUniqueId id = shared_unique_id(rank);
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
    if (r == ncclSuccess) { NCCL_CHECK(ncclCommDestroy(comm)); }
    char name[128];
    snprintf(name, sizeof name, "%d ranks of one host on device 0: ncclCommInitRank is ncclInvalidUsage on each",
             nranks);
    check(r == ncclInvalidUsage, name, "rank %d got %s", rank, ncclGetErrorString(r));
}

// each rank takes the device of its local rank; the host has fewer: the later ranks are refused
static void run_more_ranks_than_devices(int rank, int local_rank, int local_ranks) {
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (local_ranks <= devices) {
        fprintf(stderr, "error: more-ranks-than-devices needs more ranks on one host than its %d device(s)\n"
                "  hint: CUDA_EMU_DEVICES=1 mpirun -np 2 test_nccl more-ranks-than-devices\n", devices);
        exit(EXIT_FAILURE);
    }
    cudaError_t e = cudaSetDevice(local_rank);
    cudaGetLastError();  // handled here
    cudaError_t want = local_rank < devices ? cudaSuccess : cudaErrorInvalidDevice;
    char name[128];
    snprintf(name, sizeof name, "cudaSetDevice(local rank) on a host of %d device(s): %s past the last", devices,
             cudaGetErrorName(cudaErrorInvalidDevice));
    check(e == want, name, "rank %d (local rank %d) got %s", rank, local_rank, cudaGetErrorName(e));
}

int main(int argc, char** argv) {
    test_mode mode = COLLECTIVES;
    if (argc > 1 && strcmp(argv[1], "same-device") == 0) {
        mode = SAME_DEVICE;
    } else if (argc > 1 && strcmp(argv[1], "more-ranks-than-devices") == 0) {
        mode = MORE_RANKS_THAN_DEVICES;
    } else if (argc > 1 && strcmp(argv[1], "missing-waits") == 0) {
        mode = MISSING_WAITS;
    } else if (argc > 1 && strcmp(argv[1], "p2p-no-group") == 0) {
        mode = P2P_NO_GROUP;
    } else if (argc > 1) {
        fprintf(stderr, "usage: %s [same-device | more-ranks-than-devices | missing-waits | p2p-no-group]\n", argv[0]);
        return EXIT_FAILURE;
    }
    int rank = 0, nranks = 1, local_rank = 0, local_ranks = 1;
#ifdef USE_MPI
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    MPI_Comm host;  // the ranks of this host
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
    MPI_Comm_rank(host, &local_rank);
    MPI_Comm_size(host, &local_ranks);
    MPI_Comm_free(&host);
#endif
    // one report per run: rank 0's lines, and at the end the totals of all ranks
    if (rank != 0 && freopen("/dev/null", "w", stdout) == nullptr) { return EXIT_FAILURE; }
    switch (mode) {
        case COLLECTIVES: run_collectives(rank, nranks, local_rank); break;
        case SAME_DEVICE: run_same_device(rank, nranks, local_ranks); break;
        case MORE_RANKS_THAN_DEVICES: run_more_ranks_than_devices(rank, local_rank, local_ranks); break;
        case MISSING_WAITS: run_missing_waits(rank, nranks, local_rank); break;
        case P2P_NO_GROUP: run_p2p_no_group(rank, nranks, local_rank); break;
    }
#ifdef USE_MPI
    if (rank != 0 && g_checks_failed > 0) { fprintf(stderr, "rank %d: %d check(s) failed\n", rank, g_checks_failed); }
    int counts[2] = {g_checks_passed, g_checks_failed}, totals[2];
    MPI_Allreduce(counts, totals, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    g_checks_passed = totals[0];
    g_checks_failed = totals[1];
    MPI_Finalize();
#endif
    return check_summary();
}
