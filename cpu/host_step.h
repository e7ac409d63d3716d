/*
host_step.h: the end of a training step on host arrays: the ranks' gradients summed over
MPI, their global norm, clipping, one optimizer step (cpu/optimizers.h) and, under ZeRO-1,
every rank's updated blocks gathered. The CPU backend's step (train_gpt.c), and the CUDA
backend's under --offload optimizer (train_gpt.cu), where the master weights, the gradients
and the optimizer state live in host memory and the CPU updates them: one code for both, so
the offloaded update is the CPU reference's own arithmetic.

    HostStep h = {&cfg, dist, ZERO_SHARDED, OPT_ADAMW, P, params, grads, state};
    host_reduce_grads(&h);                    // MPI: all-reduce, or reduce-scatter (ZeRO-1)
    float norm = host_grad_norm(&h);
    host_update(&h, &step_config, norm, NULL, NULL);

Determinism: the norm is summed in double over a fixed partition (NORM_CHUNKS parts) and the
optimizers sum the same way, so nothing depends on the number of OpenMP threads.
*/
#ifndef CPU_HOST_STEP_H
#define CPU_HOST_STEP_H

#include <math.h>
#include <stddef.h>
#include "../llmc/distributed.h"
#include "../llmc/model_config.h"
#include "../llmc/opt_layout.h"
#include "../llmc/schedule.h"
#include "optimizers.h"

typedef struct {
    const GPT2Config* config;
    Dist dist;                // this process among the data-parallel ranks
    ZeroStage zero;           // ZERO_SHARDED: this rank updates (and keeps state for) its blocks only
    OptimizerKind optimizer;
    size_t num_parameters;    // P
    float* params;            // (P) fp32 weights, model_config.h's order
    float* grads;             // (P) fp32 gradients of this rank's micro-batches, summed by host_reduce_grads
    float* state;             // this rank's optimizer state (opt_layout.h)
} HostStep;

// how the optimizer's slices are cut over the ranks (opt_layout.h): whole unless ZeRO-1
static OptSharding host_sharding(const HostStep* h) {
    if (h->zero != ZERO_SHARDED) { return OPT_UNSHARDED; }
    OptSharding z = {h->dist.rank, h->dist.world, dist_allreduce_sum_doubles, dist_allgather_floats_world};
    return z;
}

// calls part(slice memory, counts) for every slice of the model, counts[r] = floats of rank r's block
static void host_for_each_slice_block(const HostStep* h, float* memory, void (*part)(float*, const int*, Dist)) {
    ParamSlice* s = param_slices_alloc(h->config);
    int* counts = (int*)malloc_check((size_t)h->dist.world * sizeof(int));
    for (int k = 0; k < param_slice_count(h->config); k++) {
        slice_part_counts(&s[k], h->dist.world, counts);
        part(memory + s[k].offset, counts, h->dist);
    }
    free(counts);
    free(s);
}

// the gradients of all ranks' micro-batches, summed: whole, or this rank's blocks (ZeRO-1).
// The loss scale already divides by the number of ranks.
static void host_reduce_grads(const HostStep* h) {
    if (h->dist.world == 1) { return; }
    if (h->zero == ZERO_SHARDED) { host_for_each_slice_block(h, h->grads, dist_reduce_scatter_floats); }
    else { dist_allreduce_sum_floats(h->grads, h->num_parameters); }
}

#define NORM_CHUNKS 256  // fixed partition of the sum of squares: same result for any thread count

// global L2 norm of all gradients, summed in double over a fixed partition. ZeRO-1: each
// rank sums the squares of its blocks (the only reduced gradients it has), then the ranks add.
static float host_grad_norm(const HostStep* h) {
    if (h->zero == ZERO_SHARDED) {
        OptSharding z = host_sharding(h);
        ParamSlice* s = param_slices_alloc(h->config);
        double total = 0.0;
        for (int k = 0; k < param_slice_count(h->config); k++) {
            size_t offset;
            OptShard sh = slice_shard(&s[k], &z, &offset);
            total += opt_sum_squares(h->grads + s[k].offset + offset, (size_t)sh.rows * sh.cols);
        }
        free(s);
        dist_allreduce_sum_doubles(&total, 1);
        return (float)sqrt(total);
    }
    double partial[NORM_CHUNKS];
    size_t n = h->num_parameters, chunk = (n + NORM_CHUNKS - 1) / NORM_CHUNKS;
    #pragma omp parallel for
    for (int k = 0; k < NORM_CHUNKS; k++) {
        double s = 0.0;
        size_t end = (k + 1) * chunk < n ? (k + 1) * chunk : n;
        for (size_t i = k * chunk; i < end; i++) { s += (double)h->grads[i] * h->grads[i]; }
        partial[k] = s;
    }
    double total = 0.0;
    for (int k = 0; k < NORM_CHUNKS; k++) { total += partial[k]; }
    return (float)sqrt(total);
}

// clips the gradients to s->grad_clip given their norm, takes one optimizer step over this
// rank's part of every slice and (ZeRO-1) gathers the other ranks' blocks. tensor_done(ctx, i),
// when given, is called as soon as parameter tensor i holds its new values (a GPU backend
// sends each tensor up while the CPU updates the next)
static void host_update(const HostStep* h, const StepConfig* s, float grad_norm, void (*tensor_done)(void*, int), void* ctx) {
    if (s->grad_clip > 0.0f && grad_norm > s->grad_clip) {
        float scale = s->grad_clip / grad_norm;
        #pragma omp parallel for
        for (size_t i = 0; i < h->num_parameters; i++) { h->grads[i] *= scale; }
    }
    OptSharding z = host_sharding(h);
    int sharded = h->zero == ZERO_SHARDED;
    optimizer_step(h->optimizer, h->params, h->grads, h->state, h->config, &s->hyper, s->t, &z,
                   sharded ? NULL : tensor_done, ctx);
    if (sharded) { host_for_each_slice_block(h, h->params, dist_allgather_floats); }
    if (sharded && tensor_done != NULL) {
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { tensor_done(ctx, i); }
    }
}

#endif // CPU_HOST_STEP_H
