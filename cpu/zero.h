/*
zero.h: ZeRO stages 1, 2 and 3 (--zero, Rajbhandari et al. 2020) in the CPU model, at the hooks
train_gpt.c calls. The exchanges themselves are cpu/host_step.h's (shared with the CUDA
backend's --offload optimizer); this file keeps the CPU model's buffers for them and says when
they run:

    zero_alloc_weights / zero_alloc_grads           // the shards and the one-layer working buffers
    zero_outer_weights_ready(&z, &h)                 // hook: before the encoder (ZeRO-3: gather wte, wpe, lnf)
    int at = zero_layer_weights_ready(&z, &h, l)     // hook: before layer l's forward and backward (ZeRO-3:
                                                     // gather it; the kernels read layer `at` of the weights)
    zero_layer_grads_done(&z, &h, l)                 // hook: after layer l's backward (ZeRO-2, 3: reduce-scatter)
    zero_outer_grads_done(&z, &h)                    // hook: after the encoder's backward (the same for wte, wpe, lnf)
    zero_step_done(&z, &h, t)                        // after the update: step 1's collectives counted, gathers reset

ZeRO-1 (ZERO_1) shards the optimizer state only: nothing happens during the step, and the
reduce-scatter and all-gather around the update are host_step.h's. ZeRO-2 (ZERO_2) also keeps
only this rank's blocks of the reduced gradients (the gradient shard): the backward writes a
one-layer model's working buffer, reduce-scattered after each layer. ZeRO-3 (ZERO_3) also keeps
only this rank's blocks of the weights (the weight shard, in the same layout: llmc/opt_layout.h's
ShardLayout): the kernels read a working copy shaped as a one-layer model, into which wte, wpe,
lnfw, lnfb (the outer tensors) are gathered once a step and each layer before its forward and its
backward. The CPU waits for each collective: it has no second stream to overlap them with.
*/
#ifndef CPU_ZERO_H
#define CPU_ZERO_H

#include <stdio.h>
#include <string.h>
#include "../llmc/distributed.h"
#include "../llmc/memory.h"
#include "../llmc/model_config.h"
#include "../llmc/opt_layout.h"
#include "../llmc/profile.h"
#include "host_step.h"

typedef struct {
    ZeroStage stage;
    QStateFormat format;    // the optimizer state's (--optimizer-state): 8-bit state moves the cut (llmc/opt_layout.h)
    float* grad_working;    // ZeRO-2, 3: the backward's own gradients, a one-layer model's layout (not reduced)
    float* pack;            // ZeRO-1, 2, 3: one layer's blocks rank by rank, for its reduce-scatter and all-gather
    float* weight_working;  // ZeRO-3: the weights the kernels read, a one-layer model's layout
    int gathered_layer;     // ZeRO-3: the layer the working copy holds, -1 none
    int outer_gathered;     // ZeRO-3: the working copy holds this step's wte, wpe, lnfw, lnfb
    long reduces, gathers;  // the gradients' and the weights' collectives since the last update (printed for step 1)
    long step_collectives;  // g_dist_collectives when the step began: step 1's count starts there
} CpuZero;

// a one-layer model: the working buffers' layout (wte, wpe, one layer's 12 tensors, lnfw, lnfb)
static GPT2Config zero_one_layer(const GPT2Config* c) {
    GPT2Config one = *c;
    one.num_layers = 1;
    return one;
}

// the weights: the whole model (returned: the kernels read it, *layers = L), or under ZeRO-3 the
// weight shard in *shard and the working copy returned (*layers = 1)
static float* zero_alloc_weights(CpuZero* z, const GPT2Config* c, int world, float** shard, int* layers) {
    if (z->stage != ZERO_3) {
        *shard = (float*)mem_alloc(MEM_PARAMETERS, gpt2_num_parameters(c) * sizeof(float));
        *layers = c->num_layers;
        return *shard;
    }
    GPT2Config one = zero_one_layer(c);
    *shard = (float*)mem_calloc(MEM_PARAMETERS, shard_layout_as(c, world, z->format).shard * sizeof(float));
    z->weight_working = (float*)mem_calloc(MEM_PARAMETERS, gpt2_num_parameters(&one) * sizeof(float));
    z->gathered_layer = -1;
    *layers = 1;
    return z->weight_working;
}

// the gradients, as zero_alloc_weights: the whole model's, or (ZeRO-2, 3) the gradient shard in
// *shard and the working buffer returned (*layers = 1); ZeRO-1 and up also get the pack. Returns
// the floats of *shard in *floats
static float* zero_alloc_grads(CpuZero* z, const GPT2Config* c, int world, float** shard, size_t* floats, int* layers) {
    ShardLayout sl = shard_layout_as(c, world, z->format);
    if (zero_shards_state(z->stage)) { z->pack = (float*)mem_calloc(MEM_GRADIENTS, sl.pack * sizeof(float)); }
    if (!zero_shards_grads(z->stage)) {
        *floats = gpt2_num_parameters(c);
        *shard = (float*)mem_calloc(MEM_GRADIENTS, *floats * sizeof(float));
        *layers = c->num_layers;
        return *shard;
    }
    *floats = sl.shard;
    *shard = (float*)mem_calloc(MEM_GRADIENTS, sl.shard * sizeof(float));
    z->grad_working = (float*)mem_calloc(MEM_GRADIENTS, sl.working * sizeof(float));
    *layers = 1;
    return z->grad_working;
}

static void zero_free(CpuZero* z) {
    mem_free(z->grad_working);
    mem_free(z->pack);
    mem_free(z->weight_working);
}

// where a one-layer model's layer tensors begin (after wte and wpe) and how many floats they are
static void zero_working_layer(const GPT2Config* c, size_t* offset, size_t* floats) {
    GPT2Config one = zero_one_layer(c);
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(sizes, &one);
    *offset = sizes[0] + sizes[1];
    *floats = 0;
    for (int i = 2; i < NUM_PARAMETER_TENSORS - 2; i++) { *floats += sizes[i]; }
}

// ----------------------------------------------------------------------------
// the hooks

// before the encoder: ZeRO-3 gathers wte, wpe, lnfw, lnfb into the working copy, once a step
// (the encoder and the head read them)
static void zero_outer_weights_ready(CpuZero* z, const HostStep* h) {
    if (z->stage != ZERO_3 || z->outer_gathered) { return; }
    size_t at, n;
    zero_working_layer(h->config, &at, &n);
    prof_mark(PROF_COLLECTIVE, prof_bytes((double)at * sizeof(float)), "ZeRO-3: wte, wpe, lnf all-gather");
    host_zero3_gather_outer(h, z->weight_working);
    z->gathers += 4;
    z->outer_gathered = 1;
    prof_close();
}

// before layer l's forward or backward: the layer of the weights the kernels read for it. ZeRO-3
// gathers l into the working copy's one layer (unless it holds l already: a recomputed segment's
// last layer runs its backward next) and returns 0; the others return l
static int zero_layer_weights_ready(CpuZero* z, const HostStep* h, int l) {
    if (z->stage != ZERO_3) { return l; }
    if (z->gathered_layer != l) {
        size_t at, n;
        zero_working_layer(h->config, &at, &n);
        prof_mark(PROF_COLLECTIVE, prof_bytes(shard_layout_as(h->config, h->dist.world, h->format).pack * sizeof(float)), "ZeRO-3: layer %d all-gather", l);
        host_zero3_gather_layer(h, z->weight_working + at, l, z->pack);
        z->gathers++;
        z->gathered_layer = l;
        prof_close();
    }
    return 0;
}

// the layer of the gradients that layer l's backward adds into: the working buffer's one layer
// under ZeRO-2 and 3, else l
static int zero_layer_grads_at(const CpuZero* z, int l) { return zero_shards_grads(z->stage) ? 0 : l; }

// after layer l's backward, every micro-step: ZeRO-2 and 3 reduce-scatter its gradients into the
// shard (one MPI_Reduce_scatter_block) and clear the working layer for the next layer
static void zero_layer_grads_done(CpuZero* z, const HostStep* h, int l) {
    if (!zero_shards_grads(z->stage)) { return; }
    size_t at, n;
    zero_working_layer(h->config, &at, &n);
    float* layer = z->grad_working + at;
    prof_mark(PROF_COLLECTIVE, prof_bytes(shard_layout_as(h->config, h->dist.world, h->format).pack * sizeof(float)), "ZeRO-2: layer %d reduce-scatter", l);
    host_zero2_reduce_layer(h, layer, l, z->pack);
    z->reduces++;
    memset(layer, 0, n * sizeof(float));
    prof_close();
}

// after the encoder's backward: ZeRO-2 and 3 reduce-scatter wte's, wpe's and the final LayerNorm's
// gradients into the shard, then clear the working buffer (with --loss-chunk the next forward adds
// the classifier's wte gradient into it)
static void zero_outer_grads_done(CpuZero* z, const HostStep* h) {
    if (!zero_shards_grads(z->stage)) { return; }
    size_t working = shard_layout_as(h->config, h->dist.world, h->format).working;
    prof_mark(PROF_COLLECTIVE, prof_bytes(working * sizeof(float)), "ZeRO-2: wte, wpe, lnf reduce-scatter");
    host_zero2_reduce_outer(h, z->grad_working);
    z->reduces += 4;  // wte, wpe, lnfw, lnfb
    memset(z->grad_working, 0, working * sizeof(float));
    prof_close();
}

// after the update of step t: the collectives of step 1 printed (tests/test_zero.py bounds them: the
// gradients' (micro-steps x (L + 4)), ZeRO-3's weight gathers (4 + L a forward, L a backward, more
// with recompute), the norm's, the optimizer's sums and the weight gathers); ZeRO-3's working copy
// is stale now (the shard moved on): the next forward gathers again
static void zero_step_done(CpuZero* z, const HostStep* h, int t) {
    long step = g_dist_collectives - z->step_collectives;
    const GPT2Config* c = h->config;
    if (zero_shards_grads(z->stage) && t == 1 && h->dist.rank == 0) {
        ShardLayout sl = shard_layout_as(c, h->dist.world, h->format);
        printf("ZeRO-%d: step 1: %ld gradient reduce-scatters, %ld weight all-gathers, %ld collectives in all (L = %d); "
               "gradients per rank: shard %zu of %zu floats, working buffer %zu, pack %zu", (int)z->stage, z->reduces,
               z->gathers, step, c->num_layers, sl.shard, gpt2_num_parameters(c), sl.working, sl.pack);
        if (z->stage == ZERO_3) { printf("; weights per rank: shard %zu, working copy %zu", sl.shard, sl.working); }
        printf("\n");
    }
    if (z->stage == ZERO_1 && t == 1 && h->dist.rank == 0) {  // a layer at a time, each way
        printf("ZeRO-1: step 1: %ld collectives in all (L = %d)\n", step, c->num_layers);
    }
    z->outer_gathered = 0;
    z->gathered_layer = -1;
    z->reduces = 0;
}

// the start of a step (gpt2_zero_grad): the step's collectives count from here (not validation's
// or start-up's)
static void zero_step_begin(CpuZero* z) {
    z->step_collectives = g_dist_collectives;
    z->gathers = 0;
}

// ZeRO-3's working copy was the staging of a stream of the weights (zero3_params_stream, --pp's
// cpu/pipeline.h): the next forward gathers anew
static void zero3_working_stale(CpuZero* z) {
    z->outer_gathered = 0;
    z->gathered_layer = -1;
}

// the weights for checkpoints under ZeRO-3, which has no whole copy: a slice at a time through the
// working copy (which the next forward gathers anew), gathered from every rank's blocks for a
// read; for a write every rank keeps its blocks (each reads the whole file)
static void zero3_params_stream(CpuZero* z, const HostStep* h, int write, void (*fn)(void*, size_t, float*, size_t), void* ctx) {
    prof_mark(PROF_COLLECTIVE, prof_bytes(h->num_parameters * sizeof(float)), "ZeRO-3: the weights slice by slice, %s",
              write ? "each rank's blocks kept" : "gathered");
    host_zero3_stream(h, write, z->weight_working, fn, ctx);
    zero3_working_stale(z);
    prof_close();
}

#endif // CPU_ZERO_H
