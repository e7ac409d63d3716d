/*
pipeline.cuh: --pp N on the device, the counterpart of cpu/pipeline.h (read doc/pipeline_parallel.md
first: the split of the layers into stages, the two schedules, why a stage's gradients add up in one
process's order). A rank holds its stage's layers (llmc/pipeline.h's pp_stage_config); llmc/trainer.h
walks the stage's list of forwards, backwards and messages; train_gpt.cu computes the stage's part. Here:
the messages between neighbouring stages, and wte's gradient summed over the pair of the first and the
last stage (both hold wte: the embedding and the tied classifier).

    PpCuda pp = pp_cuda_create(&pipeline, groups.pipeline, groups.pair);   // cuda/nccl.cuh's communicators
    pp_message_cuda(&pp, out, stage + 1, &sent, NULL, -1, n, ncclFloat, stream, "send act");  // a send
    pp_message_cuda(&pp, dx, stage - 1, &dx_sent, in, stage - 1, n, ncclFloat, stream, "send grad, recv act");  // one exchange
    pp_wait_sent_cuda(&sent, stream);                   // before `stream` writes `out` again
    pp_sum_pair_cuda(&pp, wte_grads, n, stream);        // the first stage's part + the last's, the same bits on both
    pp_cuda_destroy(&pp);

Invariants. The messages run on the pipeline's own stream (pp.stream) over the pipeline group's own
communicator, in the order of the stage's list, which llmc/pipeline_sim.h shows finishes when a send
waits for its receive (ncclSend does): a send and the receive after it from the same neighbour
(PpAction.with_next) are one ncclGroupStart/ncclGroupEnd, else the two neighbours would each wait in
their send. Events order the two streams: a message waits for everything the compute stream queued
before it (a send's buffer is written; a receive's buffer has been read for the last time, by the
backward of the micro-batch that held its slot before), and the compute stream waits for a receive at
once (the forward or backward that reads it comes next in the list). The compute stream does not wait
for a send: it goes on with the next micro-batch while the send runs (the overlap); the send's end is
kept (PpSent) for the compute stream to wait for before it writes the sent buffer again. Messages are in
the activations' precision (bf16: the bits one process passes from a layer to the next). The pair's
all-reduce of two ranks adds a + b on both (the same bits: a sum of two floats commutes).

With one stage (PP_CUDA_NONE) nothing here is called and the model is the plain one, bit for bit.
Failure: a message or sum that fails stops with NCCL's message (NCCL_CHECK); one that never meets its
peer is stopped by cuda/nccl.cuh's watchdog after LLMC_DIST_TIMEOUT.
*/
#ifndef CUDA_PIPELINE_CUH
#define CUDA_PIPELINE_CUH

#include "common.cuh"
#include "nccl.cuh"
#include "profile.cuh"
#include "../llmc/distributed.h"

typedef struct {
    int stage, stages;        // this rank's stage, and the pipeline's stages (1: no --pp)
    ncclComm_t comm;          // the pipeline group's communicator: rank s is stage s (NULL without --pp)
    ncclComm_t pair;          // wte's pair, the first and the last stage (NULL on a middle stage and without --pp)
    cudaStream_t stream;      // the messages
    cudaEvent_t queued;       // the compute stream: what a message waits for
    cudaEvent_t received;     // pp.stream: the receives queued so far
} PpCuda;

static const PpCuda PP_CUDA_NONE = {0, 1, NULL, NULL, NULL, NULL, NULL};

// a send's end on pp.stream, for the compute stream to wait for before it writes the sent buffer again
typedef struct {
    cudaEvent_t event;
    int pending;              // a send was recorded that the compute stream has not waited for
} PpSent;

// the stages of `pipeline` (from dist_grid) over comm and pair (cuda/nccl.cuh's nccl_init_groups), which it
// keeps (pp_cuda_destroy frees them)
static PpCuda pp_cuda_create(const Dist* pipeline, ncclComm_t comm, ncclComm_t pair) {
    if (pipeline->world <= 1) { return PP_CUDA_NONE; }
    PpCuda pp = {pipeline->rank, pipeline->world, comm, pair, NULL, NULL, NULL};
    CUDA_CHECK(cudaStreamCreate(&pp.stream));
    CUDA_CHECK(cudaEventCreateWithFlags(&pp.queued, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&pp.received, cudaEventDisableTiming));
    return pp;
}

static void pp_cuda_destroy(PpCuda* pp) {
    if (pp->stages == 1) { return; }
    CUDA_CHECK(cudaStreamDestroy(pp->stream));  // its messages finish first
    CUDA_CHECK(cudaEventDestroy(pp->queued));
    CUDA_CHECK(cudaEventDestroy(pp->received));
    nccl_comm_destroy(pp->comm);
    if (pp->pair != NULL) { nccl_comm_destroy(pp->pair); }
    *pp = PP_CUDA_NONE;
}

static void pp_sent_create(PpSent* s) {
    CUDA_CHECK(cudaEventCreateWithFlags(&s->event, cudaEventDisableTiming));
    s->pending = 0;
}
static void pp_sent_destroy(PpSent* s) { CUDA_CHECK(cudaEventDestroy(s->event)); }

// `stream` waits for the last send that read a buffer (s: its end), if it has not already
static void pp_wait_sent_cuda(PpSent* s, cudaStream_t stream) {
    if (!s->pending) { return; }
    CUDA_CHECK(cudaStreamWaitEvent(stream, s->event, 0));
    s->pending = 0;
}

// one message of the stage's list, or a send and the receive after it as one exchange: n elements of type
// from `send` (device) to stage `to`, its end recorded in *sent, and/or into `recv` (device) from stage
// `from` (-1: none). On pp.stream after everything `stream` queued; `stream` waits for the receive.
// what: the range's name for --profile (PP_OP_NAMES)
static void pp_message_cuda(const PpCuda* pp, const void* send, int to, PpSent* sent, void* recv, int from, size_t n,
                            ncclDataType_t type, cudaStream_t stream, const char* what) {
    size_t bytes = n * (type == ncclBfloat16 ? sizeof(__nv_bfloat16) : sizeof(float));
    CUDA_CHECK(cudaEventRecord(pp->queued, stream));
    CUDA_CHECK(cudaStreamWaitEvent(pp->stream, pp->queued, 0));
    prof_gpu_mark(pp->stream, PROF_STREAM_PIPELINE, PROF_COLLECTIVE, prof_bytes((double)bytes * ((to >= 0) + (from >= 0))), "--pp: %s", what);
    NCCL_CHECK(ncclGroupStart());
    if (to >= 0) { NCCL_CHECK(ncclSend(send, n, type, to, pp->comm, pp->stream)); }
    if (from >= 0) { NCCL_CHECK(ncclRecv(recv, n, type, from, pp->comm, pp->stream)); }
    NCCL_CHECK(ncclGroupEnd());
    prof_gpu_close(pp->stream, PROF_STREAM_PIPELINE);
    if (to >= 0) {
        CUDA_CHECK(cudaEventRecord(sent->event, pp->stream));
        sent->pending = 1;
    }
    if (from >= 0) {
        CUDA_CHECK(cudaEventRecord(pp->received, pp->stream));
        CUDA_CHECK(cudaStreamWaitEvent(stream, pp->received, 0));
    }
}

// wte's gradient, n floats (device: this rank's, whole or ZeRO's block of it; the same block on both):
// the first stage's part (the embedding's backward) + the last's (the classifier's), on both, in
// `stream`'s order
static void pp_sum_pair_cuda(const PpCuda* pp, float* grads, size_t n, cudaStream_t stream) {
    if (pp->pair == NULL) { return; }
    prof_gpu_mark(stream, PROF_STREAM_COMPUTE, PROF_COLLECTIVE, prof_bytes((double)n * sizeof(float)), "--pp: wte's pair");
    NCCL_CHECK(ncclAllReduce(grads, grads, n, ncclFloat, ncclSum, pp->pair, stream));
    prof_gpu_close(stream, PROF_STREAM_COMPUTE);
}

#endif // CUDA_PIPELINE_CUH
