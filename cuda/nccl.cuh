/*
nccl.cuh: NCCL for the CUDA backend, one process per GPU: the error check every NCCL call goes through,
and the communicator of the MPI world, bootstrapped over MPI (llmc/distributed.h).

    Dist d;  dist_init(&d, &argc, &argv);         // MPI ranks
    ncclComm_t comm = nccl_init(&d);              // every rank; d.world > 1
    NCCL_CHECK(ncclAllReduce(x, x, n, ncclDouble, ncclSum, comm, stream));

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
typedef enum { ncclSuccess = 0, ncclInvalidUsage = 5 } ncclResult_t;
typedef enum { ncclFloat = 7, ncclDouble = 8 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef struct { char internal[128]; } ncclUniqueId;
static ncclResult_t nccl_missing(const char* call) {
    fail("%s: this program was built without NCCL, which exchanging gradients between GPUs needs\n  hint: %s",
         call, NCCL_REBUILD_HINT);
    return ncclInvalidUsage;  // not reached
}
static const char* ncclGetErrorString(ncclResult_t) { return "NCCL is not built in"; }
static ncclResult_t ncclGetUniqueId(ncclUniqueId*) { return nccl_missing("ncclGetUniqueId"); }
static ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) { return nccl_missing("ncclCommInitRank"); }
static ncclResult_t ncclCommDestroy(ncclComm_t) { return nccl_missing("ncclCommDestroy"); }
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
#endif

static void nccl_check_at(ncclResult_t r, const char* call, const char* file, int line) {
    if (r != ncclSuccess) {
        fail_at(file, line, "%s failed: %s\n  hint: %s", call, ncclGetErrorString(r),
                r == ncclInvalidUsage ? "each rank needs a GPU of its own (two ranks on one GPU are refused)"
                                      : "check that every rank started with the same flags, and NCCL's own log (NCCL_DEBUG=INFO)");
    }
}
#define NCCL_CHECK(call) nccl_check_at((call), #call, __FILE__, __LINE__)

// stops where d has several ranks, which exchange gradients through NCCL, and this build has no NCCL
static void nccl_check_built(const Dist* d) {
    if (!nccl_built_with() && d->world > 1) {
        fail("%d ranks, but this program was built without NCCL (-DNO_NCCL: none found, or NCCL=0), so it trains on one GPU\n"
             "  hint: %s; or run one process (or add --offload optimizer, whose step adds the ranks' gradients over MPI)",
             d->world, NCCL_REBUILD_HINT);
    }
}

// rank 0 makes NCCL's unique id, MPI carries it to the others, and every rank joins
static ncclComm_t nccl_init(const Dist* d) {
    nccl_check_built(d);
    ncclUniqueId id;
    if (d->rank == 0) { NCCL_CHECK(ncclGetUniqueId(&id)); }
    dist_broadcast_bytes(&id, sizeof(id), 0);
    ncclComm_t comm;
    NCCL_CHECK(ncclCommInitRank(&comm, d->world, id, d->rank));
    return comm;
}

#endif // CUDA_NCCL_CUH
