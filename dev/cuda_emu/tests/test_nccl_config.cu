/*
test_nccl_config.cu: NCCL's non-blocking communicators (ncclCommInitRankConfig with config.blocking =
0), which the trainer makes (cuda/nccl.cuh) so that no rank waits for ever, and what NCCL does with
them. Three modes, the two of two processes started here (fork, the id through a pipe, no MPI: NCCL's
own sockets join them):

    test_nccl_config                   one rank: NCCL_CONFIG_INITIALIZER leaves blocking unset, which
                                       is blocking (the call answers ncclSuccess); blocking = 0 answers
                                       ncclInProgress or ncclSuccess, ncclCommGetAsyncError turns to
                                       ncclSuccess, and an all-reduce on it sums
    test_nccl_config mismatch          rank 0 says 2 ranks, rank 1 says 3: neither communicator forms
                                       (ncclInProgress for MISMATCH_WAIT_S; NCCL's bootstrap root
                                       refuses the count and answers no one), and ncclCommAbort ends it
    test_nccl_config trainer-mismatch  the same through the trainer's nccl_comm_create: each rank stops
                                       after LLMC_DIST_TIMEOUT (TRAINER_TIMEOUT_S here), saying what it
                                       waited for and the likely cause
*/
#include <cuda_runtime.h>
#include <nccl.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "cuda/common.cuh"
#include "cuda/nccl.cuh"

static const int COUNT = 8;
static const double MISMATCH_WAIT_S = 2.0;   // how long the mismatched ranks must stay in progress
static const char TRAINER_TIMEOUT_S[] = "2";  // LLMC_DIST_TIMEOUT of trainer-mismatch
static const double SLACK_S = 5.0;            // a stop this much past the timeout is late

// the communicator's state once it leaves ncclInProgress, or ncclInProgress after limit_s seconds
static ncclResult_t state_within(ncclComm_t comm, double limit_s) {
    double t0 = rendezvous_now();
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress && rendezvous_now() - t0 < limit_s) {
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) { return ncclInternalError; }
        usleep(1000);
    }
    return state;
}

static void one_rank(void) {
    CUDA_CHECK(cudaSetDevice(0));
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) { check(false, "ncclGetUniqueId", "failed"); return; }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
    check(r == ncclSuccess, "NCCL_CONFIG_INITIALIZER: blocking, the call answers ncclSuccess", "%s", ncclGetErrorString(r));
    if (r == ncclSuccess) { ncclCommDestroy(comm); }

    if (ncclGetUniqueId(&id) != ncclSuccess) { check(false, "ncclGetUniqueId", "failed"); return; }
    config.blocking = 0;
    r = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
    check(r == ncclInProgress || r == ncclSuccess, "blocking = 0: the call answers ncclInProgress (or ncclSuccess)", "%s",
          ncclGetErrorString(r));
    if (r != ncclInProgress && r != ncclSuccess) { return; }
    ncclResult_t state = state_within(comm, 60.0);
    check(state == ncclSuccess, "blocking = 0: ncclCommGetAsyncError turns to ncclSuccess", "%s", ncclGetErrorString(state));
    float host[COUNT], *dev;
    for (int i = 0; i < COUNT; i++) { host[i] = (float)i; }
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    CUDA_CHECK(cudaMalloc(&dev, sizeof(host)));
    CUDA_CHECK(cudaMemcpy(dev, host, sizeof(host), cudaMemcpyHostToDevice));
    r = ncclAllReduce(dev, dev, COUNT, ncclFloat, ncclSum, comm, stream);
    if (r == ncclInProgress) { r = state_within(comm, 60.0); }  // issued, still under way: wait before the next call
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(host, dev, sizeof(host), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < COUNT; i++) { wrong += host[i] != (float)i; }
    check(r == ncclSuccess && wrong == 0, "blocking = 0: an all-reduce of one rank", "%s, %d wrong", ncclGetErrorString(r), wrong);
    CUDA_CHECK(cudaFree(dev));
    CUDA_CHECK(cudaStreamDestroy(stream));
    ncclCommDestroy(comm);
}

// rank (0 or 1) of a pair that disagrees on the number of ranks: 2 + rank
static void mismatched_rank(int rank, ncclUniqueId id, bool through_trainer) {
    int devices = 1;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    CUDA_CHECK(cudaSetDevice(rank % devices));
    int nranks = 2 + rank;
    char name[128];
    if (through_trainer) {
        FailTrap trap;
        g_fail_trap = &trap;
        double t0 = rendezvous_now();
        if (setjmp(trap.jump) == 0) {
            nccl_comm_create(nranks, id, rank, "the test");
            snprintf(name, sizeof(name), "nccl_comm_create, rank %d of %d (the other says %d): stops", rank, nranks, 5 - nranks);
            check(false, name, "it returned a communicator");
            return;
        }
        double waited = rendezvous_now() - t0, limit = atof(TRAINER_TIMEOUT_S);
        snprintf(name, sizeof(name), "nccl_comm_create, rank %d of %d (the other says %d): stops after LLMC_DIST_TIMEOUT, "
                 "naming the wait and the likely cause", rank, nranks, 5 - nranks);
        check(waited >= limit && waited < limit + SLACK_S && strstr(trap.message, "no answer from the other ranks in 2 s") &&
              strstr(trap.message, "ranks started with different numbers"), name, "after %.1f s: %s", waited, trap.message);
        return;
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
    snprintf(name, sizeof(name), "rank %d of %d (the other says %d): the call returns ncclInProgress", rank, nranks, 5 - nranks);
    check(r == ncclInProgress, name, "%s", ncclGetErrorString(r));
    if (r != ncclInProgress) { return; }
    ncclResult_t state = state_within(comm, MISMATCH_WAIT_S);
    snprintf(name, sizeof(name), "rank %d of %d: still ncclInProgress after %.0f s", rank, nranks, MISMATCH_WAIT_S);
    check(state == ncclInProgress, name, "%s", ncclGetErrorString(state));
    r = ncclCommAbort(comm);
    snprintf(name, sizeof(name), "rank %d of %d: ncclCommAbort ends the wait", rank, nranks);
    check(r == ncclSuccess, name, "%s", ncclGetErrorString(r));
}

// two processes: this one rank 0, a child rank 1, NCCL's id handed over a pipe; the child's counts
// come back over another
static void mismatch(bool through_trainer) {
    if (through_trainer) { setenv("LLMC_DIST_TIMEOUT", TRAINER_TIMEOUT_S, 1); }
    int id_pipe[2], count_pipe[2];
    if (pipe(id_pipe) != 0 || pipe(count_pipe) != 0) { check(false, "pipes", "cannot make them"); return; }
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        ncclUniqueId id;
        if (read(id_pipe[0], &id, sizeof(id)) != (ssize_t)sizeof(id)) { _exit(EXIT_FAILURE); }
        mismatched_rank(1, id, through_trainer);
        int counts[2] = {g_checks_passed, g_checks_failed};
        fflush(stdout);
        _exit(write(count_pipe[1], counts, sizeof(counts)) == (ssize_t)sizeof(counts) ? EXIT_SUCCESS : EXIT_FAILURE);
    }
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess || write(id_pipe[1], &id, sizeof(id)) != (ssize_t)sizeof(id)) {
        check(false, "rank 0 hands NCCL's id to rank 1", "failed");
        return;
    }
    mismatched_rank(0, id, through_trainer);
    int counts[2] = {0, 1}, status = 0;
    bool heard = read(count_pipe[0], counts, sizeof(counts)) == (ssize_t)sizeof(counts);
    waitpid(child, &status, 0);
    check(heard && WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank 1 reports its checks", "exit status %d", status);
    g_checks_passed += counts[0];
    g_checks_failed += counts[1];
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "";
    if (mode[0] == '\0') {
        one_rank();
    } else if (strcmp(mode, "mismatch") == 0 || strcmp(mode, "trainer-mismatch") == 0) {
        mismatch(strcmp(mode, "trainer-mismatch") == 0);
    } else {
        fprintf(stderr, "usage: %s [mismatch | trainer-mismatch]\n", argv[0]);
        return EXIT_FAILURE;
    }
    return check_summary();
}
