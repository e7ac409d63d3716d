/*
emu_nccl.cpp: NCCL for emulated devices, one per process, launched like the real program:

    mpirun -np 2 ./build/emu/train_gpt ...     (a single process needs no MPI at all)

Every collective is an all-gather of each rank's bytes (MPI_Allgather on a private duplicate of
MPI_COMM_WORLD, built with -DCUDA_EMU_MPI), after which each rank computes its own result:
    all-reduce       out[i] = reduce over ranks r = 0, 1, ... of in_r[i]
    reduce-scatter   out[i] = reduce over ranks of in_r[rank * count + i]
    all-gather       out[r * count + i] = in_r[i]
    broadcast        out[i] = in_root[i]
Reductions accumulate in rank order, in fp32 (in fp64 for ncclFloat64) and round once (to
nearest-even for bf16), so every rank gets bit-identical results; ncclAvg divides the sum by the
number of ranks. With 2 ranks that is the one addition real NCCL makes too (a + b = b + a, bitwise);
with more, real NCCL's order follows its ring and may differ from rank order.

When: a collective is queued on its stream and that stream is then drained, so it runs after the
work it depends on in every stream mode. It completes before the call returns (a real NCCL call
returns at once); in CUDA_EMU_STREAMS=late mode this keeps ranks from waiting on each other inside
the emulator while the program waits in its own MPI calls. ncclGroupStart/End need nothing: the
collectives of a group run in the order they were issued, the same on every rank.

Invariant: ncclCommInitRank checks that every rank passed the same ncclUniqueId and that the ranks
are the MPI processes, so a forgotten broadcast of the id is an error, not a hang.

Devices: a communicator belongs to the device that was current (cudaSetDevice) when it was made. As
real NCCL does, ncclCommInitRank returns ncclInvalidUsage on every rank when two ranks of one host
(same hostname) made theirs on the same device; the emulated node has CUDA_EMU_DEVICES devices.
*/
#include "emu_internal.h"

#include <time.h>
#include <unistd.h>
#include <vector>
#ifdef CUDA_EMU_MPI
#include <mpi.h>
#endif

struct ncclComm {
    int rank, nranks;
    int device;   // the current device at ncclCommInitRank
#ifdef CUDA_EMU_MPI
    MPI_Comm mpi;
#endif
};

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
    snprintf(id->internal, sizeof(id->internal), "%s pid %d t %ld.%09ld", UNIQUE_ID_MAGIC, (int)getpid(),
             (long)ts.tv_sec, ts.tv_nsec);
    return ncclSuccess;
}

// every rank's `bytes` bytes, in rank order
static void exchange(ncclComm_t comm, const void* mine, size_t bytes, std::vector<char>* all) {
    all->resize(bytes * comm->nranks);
    if (comm->nranks == 1) {
        memcpy(all->data(), mine, bytes);
        return;
    }
#ifdef CUDA_EMU_MPI
    if (bytes > (size_t)INT32_MAX) { emu_fail("NCCL emulation: %zu bytes in one collective is too many for MPI", bytes); }
    MPI_Allgather(mine, (int)bytes, MPI_BYTE, all->data(), (int)bytes, MPI_BYTE, comm->mpi);
#else
    emu_fail("NCCL emulation with %d ranks needs MPI: rebuild with mpicxx (CUDA_EMU_MPI)", comm->nranks);
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

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    if (strncmp(id.internal, UNIQUE_ID_MAGIC, strlen(UNIQUE_ID_MAGIC)) != 0) {
        emu_fail("ncclCommInitRank: the ncclUniqueId was not made by ncclGetUniqueId");
    }
    if (nranks < 1 || rank < 0 || rank >= nranks) { return ncclInvalidArgument; }
    ncclComm_t c = new ncclComm();
    c->rank = rank;
    c->nranks = nranks;
    c->device = emu_current_device();
    if (nranks > 1) {
#ifdef CUDA_EMU_MPI
        int initialized = 0, world = 0, world_rank = 0;
        MPI_Initialized(&initialized);
        if (!initialized) { MPI_Init(nullptr, nullptr); }
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        if (world != nranks || world_rank != rank) {
            emu_fail("ncclCommInitRank(nranks=%d, rank=%d) in MPI process %d of %d: the emulator runs one "
                     "rank per MPI process", nranks, rank, world_rank, world);
        }
        MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
#endif
        std::vector<char> ids;
        exchange(c, id.internal, sizeof(id.internal), &ids);
        for (int r = 0; r < nranks; r++) {
            if (memcmp(ids.data() + r * sizeof(id.internal), id.internal, sizeof(id.internal)) != 0) {
                emu_fail("ncclCommInitRank: rank %d has a different ncclUniqueId than rank %d "
                         "(rank 0 must make it and send it to the others)", r, rank);
            }
        }
        if (!one_rank_per_device(c)) {
            ncclCommDestroy(c);
            return ncclInvalidUsage;
        }
    }
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
#ifdef CUDA_EMU_MPI
    if (comm->nranks > 1) { MPI_Comm_free(&comm->mpi); }
#endif
    delete comm;
    return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) { *count = comm->nranks; return ncclSuccess; }
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) { *rank = comm->rank; return ncclSuccess; }
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) { *device = comm->device; return ncclSuccess; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* error) { *error = ncclSuccess; return ncclSuccess; }
ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

// ----------------------------------------------------------------------------
// elements and reductions

static size_t element_bytes(ncclDataType_t t) {
    switch (t) {
        case ncclFloat32: return sizeof(float);
        case ncclFloat64: return sizeof(double);
        case ncclBfloat16: return sizeof(__nv_bfloat16);
        case ncclFloat16: return sizeof(__half);
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

static void reduce_ranks(const std::vector<char>& all, size_t rank_stride, size_t offset, size_t count,
                         ncclDataType_t type, ncclRedOp_t op, int nranks, void* out) {
    if (type == ncclFloat64) {
        reduce_ranks_in<double>(all, rank_stride, offset, count, type, op, nranks, out);
    } else {
        reduce_ranks_in<float>(all, rank_stride, offset, count, type, op, nranks, out);
    }
}

static bool known_op(ncclRedOp_t op) {
    return op == ncclSum || op == ncclAvg || op == ncclMax || op == ncclMin || op == ncclProd;
}

// queue the collective on the stream and drain it: see "When" at the top of this file
static ncclResult_t run_collective(cudaStream_t stream, const char* what, std::function<void()> work) {
    emu_enqueue(stream, what, std::move(work));
    emu_stream_drain(stream);
    return ncclSuccess;
}

// ----------------------------------------------------------------------------
// collectives

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    if (element_bytes(type) == 0 || !known_op(op)) { return ncclInvalidArgument; }
    return run_collective(stream, "ncclAllReduce", [=] {
        std::vector<char> all;
        exchange(comm, sendbuff, count * element_bytes(type), &all);
        reduce_ranks(all, count, 0, count, type, op, comm->nranks, recvbuff);
    });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    if (element_bytes(type) == 0 || !known_op(op)) { return ncclInvalidArgument; }
    return run_collective(stream, "ncclReduceScatter", [=] {
        std::vector<char> all;
        size_t n = recvcount * comm->nranks;
        exchange(comm, sendbuff, n * element_bytes(type), &all);
        reduce_ranks(all, n, comm->rank * recvcount, recvcount, type, op, comm->nranks, recvbuff);
    });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
    if (element_bytes(type) == 0) { return ncclInvalidArgument; }
    return run_collective(stream, "ncclAllGather", [=] {
        std::vector<char> all;  // a copy first: in place, sendbuff lies inside recvbuff
        exchange(comm, sendbuff, sendcount * element_bytes(type), &all);
        memcpy(recvbuff, all.data(), all.size());
    });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    if (element_bytes(type) == 0 || root < 0 || root >= comm->nranks) { return ncclInvalidArgument; }
    return run_collective(stream, "ncclBroadcast", [=] {
        size_t bytes = count * element_bytes(type);
        std::vector<char> all;  // only the root's sendbuff is valid; the others send their recvbuff
        exchange(comm, comm->rank == root ? sendbuff : recvbuff, bytes, &all);
        memcpy(recvbuff, all.data() + root * bytes, bytes);
    });
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t type, int root, ncclComm_t comm, cudaStream_t stream) {
    return ncclBroadcast(buff, buff, count, type, root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    if (element_bytes(type) == 0 || !known_op(op) || root < 0 || root >= comm->nranks) { return ncclInvalidArgument; }
    return run_collective(stream, "ncclReduce", [=] {
        std::vector<char> all;
        exchange(comm, sendbuff, count * element_bytes(type), &all);
        if (comm->rank == root) { reduce_ranks(all, count, 0, count, type, op, comm->nranks, recvbuff); }
    });
}
