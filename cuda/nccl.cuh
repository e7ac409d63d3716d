/*
nccl.cuh: NCCL for the CUDA backend, one process per GPU: the error check every NCCL call goes through,
and the communicator of the MPI world, bootstrapped over MPI (llmc/distributed.h).

    Dist d;  dist_init(&d, &argc, &argv);         // MPI ranks
    ncclComm_t comm = nccl_init(&d);              // every rank; d.world > 1
    NCCL_CHECK(ncclAllReduce(x, x, n, ncclDouble, ncclSum, comm, stream));

Failure: a failing NCCL call stops with the call, NCCL's error text, file:line and a hint.
*/
#ifndef CUDA_NCCL_CUH
#define CUDA_NCCL_CUH

#include <nccl.h>
#include "../llmc/utils.h"
#include "../llmc/distributed.h"

static void nccl_check_at(ncclResult_t r, const char* call, const char* file, int line) {
    if (r != ncclSuccess) {
        fail_at(file, line, "%s failed: %s\n  hint: %s", call, ncclGetErrorString(r),
                r == ncclInvalidUsage ? "each rank needs a GPU of its own (two ranks on one GPU are refused)"
                                      : "check that every rank started with the same flags, and NCCL's own log (NCCL_DEBUG=INFO)");
    }
}
#define NCCL_CHECK(call) nccl_check_at((call), #call, __FILE__, __LINE__)

// rank 0 makes NCCL's unique id, MPI carries it to the others, and every rank joins
static ncclComm_t nccl_init(const Dist* d) {
    ncclUniqueId id;
    if (d->rank == 0) { NCCL_CHECK(ncclGetUniqueId(&id)); }
    dist_broadcast_bytes(&id, sizeof(id), 0);
    ncclComm_t comm;
    NCCL_CHECK(ncclCommInitRank(&comm, d->world, id, d->rank));
    return comm;
}

#endif // CUDA_NCCL_CUH
