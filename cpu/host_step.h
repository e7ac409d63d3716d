/*
host_step.h: the end of a training step on host arrays: the ranks' gradients summed over
MPI, their global norm, clipping, one optimizer step over every slice (optimizer_step: cpu/optimizers.h
in fp32, cpu/optimizers_lowp.h for --optimizer-state bf16 and 8bit) and, under ZeRO-1 and 2,
every rank's updated blocks gathered; and the CPU's ZeRO-2 and 3 exchanges during the step
(each layer's gradients reduce-scattered, each layer's weights gathered). The CPU backend's step
(train_gpt.c), and the CUDA backend's under --offload optimizer (train_gpt.cu), where the master
weights, the gradients and the optimizer state live in host memory and the CPU updates them: one
code for both, so the offloaded update is the CPU reference's own arithmetic.

    HostStep h = {.config = &cfg, .dist = dist, .zero = ZERO_1, .optimizer = OPT_ADAMW, .num_parameters = P,
                  .params = params, .grads = grads, .state = state, .pack = pack};
    host_reduce_grads(&h);                    // MPI: all-reduce, or reduce-scatter (ZeRO-1)
    float norm = host_grad_norm(&h);
    host_update(&h, &step_config, norm);

Determinism: the norm is summed in double over a fixed partition (NORM_CHUNKS parts: optimizers.h) and the
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
#include "optimizers_lowp.h"  // --optimizer-state bf16, 8bit

typedef struct {
    const GPT2Config* config;
    Dist dist;                // this process among the data-parallel ranks (--tp: its data-parallel group)
    ZeroStage zero;           // ZERO_1 and up: this rank updates (and keeps state for) its blocks only
    OptimizerKind optimizer;
    size_t num_parameters;    // P
    float* params;            // (P) fp32 weights, model_config.h's order; ZeRO-3: this rank's blocks only (the weight shard)
    float* grads;             // (P) fp32 gradients of this rank's micro-batches, summed by host_reduce_grads;
                              // ZeRO-2 and 3: this rank's reduced blocks only (opt_layout.h's gradient shard)
    float* state;             // this rank's optimizer state (opt_layout.h)
    QStateFormat format;      // its moments' format (--optimizer-state); under ZeRO it also decides the cut
    float* pack;              // ZeRO-1/2: one layer's blocks rank by rank (opt_layout.h's ShardLayout.pack floats): the
                              // exchanges go a layer at a time through it; NULL: a slice at a time (GPU --offload optimizer)
    Dist pipeline;            // --pp: this rank among the stages ({0, 1}: none); config is its stage's part
} HostStep;

// how the optimizer's slices are cut over the ranks (opt_layout.h): whole unless ZeRO-1, over the
// data-parallel group; with --tp (h->config->tp > 1) a split tensor's statistics add the tensor-parallel
// group's parts
static OptSharding host_sharding(const HostStep* h) {
    OptSumFn tp_sum = gpt2_tp(h->config) > 1 ? dist_sum_doubles_tensor : NULL;
    OptSharding z = OPT_UNSHARDED;
    z.format = h->format;
    z.tp_sum = tp_sum;
    if (!zero_shards_state(h->zero)) { return z; }
    OptSharding sharded = {.rank = h->dist.rank, .world = h->dist.world, .sum = dist_sum_doubles_data,
                           .gather = dist_allgather_floats_data, .grads_compact = zero_shards_grads(h->zero),
                           .params_compact = h->zero == ZERO_3, .format = h->format, .tp_sum = tp_sum};
    return sharded;
}

// the slices of a model with where each rank's block lies in a shard (opt_layout.h's
// shard_block_offsets: at[k] for slice k) and the ZeRO-2/3 buffer sizes, for the functions below
typedef struct {
    ParamSlice* slices;
    size_t* at;
    ShardLayout z;
} ShardMap;

static ShardMap shard_map(const GPT2Config* c, int world, QStateFormat f) {
    ShardMap m = {param_slices_alloc(c), (size_t*)malloc_check((size_t)param_slice_count(c) * sizeof(size_t)), shard_layout_as(c, world, f)};
    shard_block_offsets_as(c, world, f, m.at);
    return m;
}

static void shard_map_free(ShardMap* m) {
    free(m->at);
    free(m->slices);
}

// the addresses of layer l's 12 slices (tensor order) in a buffer laid out as the whole model (at base)
// or, one_layer, as a one-layer model (the working buffers: the 12 tensors one after another)
static void layer_slice_ptrs(const GPT2Config* c, const ParamSlice* s, int l, float* base, int one_layer, float* ptrs[12]) {
    int L = c->num_layers;
    for (int i = 0; i < 12; i++) {
        const ParamSlice* sl = &s[2 + i * L + l];
        ptrs[i] = one_layer ? base : base + sl->offset;
        if (one_layer) { base += (size_t)sl->rows * sl->cols; }
    }
}

// layer l's 12 slices (at ptrs) and rank r's blocks of them side by side in part (each padded to its
// block size, as the shards are): to_part 1 copies from the slices into part (the padding zeroed),
// 0 from part back into the slices
static void zero_layer_blocks(const GPT2Config* c, const ParamSlice* s, int l, int r, int world, QStateFormat f, float* const ptrs[12],
                              float* part, int to_part) {
    int L = c->num_layers;
    for (int i = 0; i < 12; i++) {
        const ParamSlice* sl = &s[2 + i * L + l];
        int begin, end, width = slice_unit_width(sl);
        slice_range(sl, r, world, f, &begin, &end);
        size_t have = (size_t)(end - begin) * width, block = slice_block_floats_as(sl, world, f);
        float* mine = ptrs[i] + (size_t)begin * width;
        if (to_part) {
            memcpy(part, mine, have * sizeof(float));
            memset(part + have, 0, (block - have) * sizeof(float));
        } else {
            memcpy(mine, part, have * sizeof(float));
        }
        part += block;
    }
}

// calls part(slice memory, counts) for every slice of the model, counts[r] = floats of rank r's block:
// the four outer slices only (outer_only: wte, wpe, lnfw, lnfb), or every one
static void host_for_each_slice_block(const HostStep* h, float* memory, int outer_only, void (*part)(float*, const int*, Dist)) {
    ParamSlice* s = param_slices_alloc(h->config);
    int* counts = (int*)malloc_check((size_t)h->dist.world * sizeof(int));
    for (int k = 0; k < param_slice_count(h->config); k++) {
        if (outer_only && !slice_is_outer(&s[k])) { continue; }
        slice_part_counts(&s[k], h->dist.world, h->format, counts);
        part(memory + s[k].offset, counts, h->dist);
    }
    free(counts);
    free(s);
}

// ZeRO-1 and 2's exchanges of the whole model (memory: the gradients to be reduce-scattered, or the
// updated weights to be all-gathered), each rank's blocks in place: with a pack, a layer at a time
// (its 12 slices packed rank by rank, one MPI_Reduce_scatter_block or MPI_Allgather, unpacked) and a
// collective per head slice; without, a collective per slice
static void host_exchange_blocks(const HostStep* h, float* memory, int reduce) {
    if (h->pack == NULL) {
        host_for_each_slice_block(h, memory, 0, reduce ? dist_reduce_scatter_floats : dist_allgather_floats);
        return;
    }
    const GPT2Config* c = h->config;
    int world = h->dist.world, rank = h->dist.rank;
    ShardMap m = shard_map(c, world, h->format);
    size_t part = m.z.layer_part;
    for (int l = 0; l < c->num_layers; l++) {
        float* ptrs[12];
        layer_slice_ptrs(c, m.slices, l, memory, 0, ptrs);
        if (reduce) {  // every rank's blocks in, the sums of this rank's out (MPI leaves them first)
            for (int r = 0; r < world; r++) { zero_layer_blocks(c, m.slices, l, r, world, h->format, ptrs, h->pack + (size_t)r * part, 1); }
            dist_reduce_scatter_block_floats(h->pack, (int)part, h->dist);
            zero_layer_blocks(c, m.slices, l, rank, world, h->format, ptrs, h->pack, 0);
        } else {       // this rank's blocks in, every rank's out
            zero_layer_blocks(c, m.slices, l, rank, world, h->format, ptrs, h->pack + (size_t)rank * part, 1);
            dist_allgather_block_floats(h->pack, (int)part, h->dist);
            for (int r = 0; r < world; r++) { zero_layer_blocks(c, m.slices, l, r, world, h->format, ptrs, h->pack + (size_t)r * part, 0); }
        }
    }
    shard_map_free(&m);
    host_for_each_slice_block(h, memory, 1, reduce ? dist_reduce_scatter_floats : dist_allgather_floats);
}

// the gradients of all ranks' micro-batches, summed: whole, or this rank's blocks (ZeRO-1).
// The loss scale already divides by the number of ranks.
static void host_reduce_grads(const HostStep* h) {
    if (h->dist.world == 1 || zero_shards_grads(h->zero)) { return; }  // ZeRO-2 and 3: reduced during the backward (host_zero2_*)
    if (h->zero == ZERO_1) { host_exchange_blocks(h, h->grads, 1); }
    else { dist_allreduce_floats_over(h->grads, h->num_parameters, h->dist); }
}

// this rank's part of slice k's gradients (whole, or ZeRO's block: in the gradient shard under ZeRO-2
// and 3), and its floats in *n
static float* host_slice_grads(const HostStep* h, int k, size_t* n) {
    OptSharding z = host_sharding(h);
    ParamSlice* s = param_slices_alloc(h->config);
    size_t offset, at;
    OptShard sh = slice_shard(&s[k], &z, &offset);
    if (z.grads_compact) {
        size_t* goff = (size_t*)malloc_check((size_t)param_slice_count(h->config) * sizeof(size_t));
        shard_block_offsets_as(h->config, z.world, h->format, goff);
        at = goff[k];
        free(goff);
    } else {
        at = s[k].offset + offset;
    }
    free(s);
    *n = (size_t)sh.rows * sh.cols;
    return h->grads + at;
}

// global L2 norm of all gradients, summed in double over a fixed partition. ZeRO-1: each
// rank sums the squares of its blocks (the only reduced gradients it has), then the ranks add.
// --tp: the squares of the split tensors' slices are added over the tensor-parallel group, those of
// the tensors every rank of it holds whole are counted once. --pp: each stage's squares are added over
// the pipeline group, wte's (which the first and the last stage both hold, summed) by the last stage only
static float host_grad_norm(const HostStep* h) {
    int tp = gpt2_tp(h->config) > 1, pp = h->pipeline.world > 1;
    if (!zero_shards_state(h->zero) && !tp && !pp) { return global_norm(h->grads, h->num_parameters); }
    OptSharding z = host_sharding(h);  // ZeRO-2: the same blocks, in the gradient shard: the same sum
    ParamSlice* s = param_slices_alloc(h->config);
    size_t* goff = (size_t*)malloc_check((size_t)param_slice_count(h->config) * sizeof(size_t));
    shard_block_offsets_as(h->config, z.world, h->format, goff);
    double total = 0.0, split = 0.0;  // split: the --tp slices' squares
    for (int k = 0; k < param_slice_count(h->config); k++) {
        size_t offset;
        OptShard sh = slice_shard(&s[k], &z, &offset);
        const float* g = z.grads_compact ? h->grads + goff[k] : h->grads + s[k].offset + offset;
        if (pp && k == 0 && h->pipeline.rank == 0) { continue; }  // wte: the last stage's copy counts
        double sq = opt_sum_squares(g, (size_t)sh.rows * sh.cols);
        if (s[k].tp > 1) { split += sq; } else { total += sq; }
    }
    free(goff);
    free(s);
    if (tp) {  // the group's sum gives every rank of it the same bits, and the whole tensors' are the same there
        dist_sum_doubles_tensor(&split, 1);
        total += split;
    }
    if (zero_shards_state(h->zero)) { dist_allreduce_doubles_over(&total, 1, h->dist); }
    dist_allreduce_doubles_over(&total, 1, h->pipeline);  // --pp: every stage's
    return (float)sqrt(total);
}

// scales the n gradients down to the norm clip when their norm grad_norm is above it (clip 0: never)
static void host_clip_grads(float* grads, size_t n, float clip, float grad_norm) {
    if (clip <= 0.0f || grad_norm <= clip) { return; }
    float scale = clip / grad_norm;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { grads[i] *= scale; }
}

// stops the run: the new moments of slice sl held `refused` non-finite values at step t, which a
// low-precision state cannot keep as numbers (fp32 state would carry them into the weights silently)
static void lowp_refused_fail(const ParamSlice* sl, size_t refused, QStateFormat f, int t) {
    char name[SLICE_NAME_LEN];
    slice_name(sl, name, sizeof(name));
    fail("step %d: the optimizer's new moments of %s hold %zu non-finite value(s) (NaN or Inf), which %s state refuses\n"
         QSTATE_REFUSED_HINT, t, name, refused, QSTATE_FORMAT_NAMES[f]);
}

// ----------------------------------------------------------------------------
// the step over every slice (Adafactor, CAME, any optimizer under ZeRO or with bf16 or 8-bit state)

// one optimizer step over this process's part of the slices of `layer` (gradients already clipped):
// ALL_SLICES every slice, OUTER_GROUP wte, wpe, lnfw and lnfb, l >= 0 layer l's 12. t = 1, 2, ...;
// z = &OPT_UNSHARDED for the whole model. Each slice's update reads its own gradients and state only,
// so a model updated layer by layer is bit for bit the model updated at once (the GPU's deferred
// update under --offload optimizer: cuda/offload_optimizer.cuh)
static void optimizer_step(OptimizerKind kind, float* params, const float* grads, float* state,
                           const GPT2Config* c, const OptimizerHyper* h, int t, const OptSharding* z, int layer) {
    ParamSlice* s = param_slices_alloc(c);
    int use_beta1 = h->adafactor.beta1 > 0.0;
    float* st = state;
    size_t* goff = NULL;  // ZeRO-2 and 3: each slice's block in the gradient (ZeRO-3: and weight) shard (opt_layout.h)
    if (z->grads_compact || z->params_compact) {
        goff = (size_t*)malloc_check((size_t)param_slice_count(c) * sizeof(size_t));
        shard_block_offsets_as(c, z->world, z->format, goff);
    }
    for (int k = 0; k < param_slice_count(c); k++) {
        size_t offset;
        OptShard sh = slice_shard(&s[k], z, &offset);
        float* p = z->params_compact ? params + goff[k] : params + s[k].offset + offset;
        const float* g = z->grads_compact ? grads + goff[k] : grads + s[k].offset + offset;
        if (layer != ALL_SLICES && s[k].layer != layer) {  // not asked for: its state is skipped
        } else if (s[k].whole == 0) {  // a tensor this pipeline stage does not hold (--pp): no weights, no state
        } else if (sh.format != QSTATE_FP32) {  // --optimizer-state bf16, 8bit (cpu/optimizers_lowp.h)
            QStateStream stream = {.seed = (uint32_t)k, .index_base = offset};
            size_t refused = lowp_update_part(kind, p, g, st, &sh, h, PARAMETER_IS_MATRIX[s[k].tensor], t, stream);
            if (refused > 0) { lowp_refused_fail(&s[k], refused, sh.format, t); }
        } else if (kind == OPT_ADAMW) {
            adamw_update_part(p, g, st, &sh, &h->adamw, PARAMETER_IS_MATRIX[s[k].tensor], t);
        } else if (kind == OPT_ADAFACTOR) {
            adafactor_update(p, g, st, &sh, &h->adafactor, t);
        } else {
            came_update(p, g, st, &sh, &h->came);
        }
        st += slice_state_floats(kind, &sh, use_beta1);
    }
    free(goff);
    free(s);
}

// clips the gradients to s->grad_clip given their norm, takes one optimizer step over this
// rank's part of every slice and (ZeRO-1) gathers the other ranks' blocks
static void host_update(const HostStep* h, const StepConfig* s, float grad_norm) {
    size_t n = zero_shards_grads(h->zero) ? shard_layout_as(h->config, h->dist.world, h->format).shard : h->num_parameters;
    host_clip_grads(h->grads, n, s->grad_clip, grad_norm);
    OptSharding z = host_sharding(h);
    optimizer_step(h->optimizer, h->params, h->grads, h->state, h->config, &s->hyper, s->t, &z, ALL_SLICES);
    // ZeRO-1 and 2: every rank's updated blocks to every rank; ZeRO-3 keeps its own blocks only
    if (zero_shards_state(h->zero) && h->zero != ZERO_3) { host_exchange_blocks(h, h->params, 0); }
}

// host_update of the slices of one `layer` (OUTER_GROUP or l): the same clipping and the same step, bit
// for bit, for that layer's slices. Not under ZeRO-1 and 2, whose exchange follows the whole update
// (ZeRO-3's compact shards: this rank's blocks, their padding zero, as host_update's clipping leaves it)
static void host_update_layer(const HostStep* h, const StepConfig* s, float grad_norm, int layer) {
    if (zero_shards_state(h->zero) && h->zero != ZERO_3) {
        fail("host_update_layer: ZeRO-%d exchanges the updated blocks after the whole update: update the whole model (host_update)", (int)h->zero);
    }
    OptSharding z = host_sharding(h);
    ParamSlice* sl = param_slices_alloc(h->config);
    size_t* goff = (size_t*)malloc_check((size_t)param_slice_count(h->config) * sizeof(size_t));  // ZeRO-3: each block in the shard
    shard_block_offsets_as(h->config, z.world, h->format, goff);
    for (int k = 0; k < param_slice_count(h->config); k++) {
        if (sl[k].layer != layer) { continue; }
        size_t offset;
        OptShard sh = slice_shard(&sl[k], &z, &offset);
        float* g = z.grads_compact ? h->grads + goff[k] : h->grads + sl[k].offset + offset;
        host_clip_grads(g, (size_t)sh.rows * sh.cols, s->grad_clip, grad_norm);
    }
    free(goff);
    free(sl);
    optimizer_step(h->optimizer, h->params, h->grads, h->state, h->config, &s->hyper, s->t, &z, layer);
}

// ----------------------------------------------------------------------------
// ZeRO-2 on the host (the CPU backend): the backward's working gradients (opt_layout.h) are
// reduce-scattered into the gradient shard as they are finished, every micro-step: one
// MPI_Reduce_scatter_block per layer (its 12 slices packed rank by rank), then one
// MPI_Reduce_scatter per head slice (wte, wpe, lnfw, lnfb: each already in rank order) after the
// encoder. Each result is added to the shard, so the micro-steps accumulate there. The caller
// clears what it hands over (the working buffer must be zero before the next backward adds).

// layer l's gradients (layer: the working buffer's 12 layer tensors) summed over the ranks; this
// rank's blocks added to the shard
static void host_zero2_reduce_layer(const HostStep* h, float* layer, int l, float* pack) {
    const GPT2Config* c = h->config;
    int world = h->dist.world;
    ShardMap m = shard_map(c, world, h->format);
    size_t part = m.z.layer_part;
    float* ptrs[12];
    layer_slice_ptrs(c, m.slices, l, layer, 1, ptrs);
    for (int r = 0; r < world; r++) { zero_layer_blocks(c, m.slices, l, r, world, h->format, ptrs, pack + (size_t)r * part, 1); }
    dist_reduce_scatter_block_floats(pack, (int)part, h->dist);
    float* shard = h->grads + m.at[2 + l];  // the layer's first slice, ln1w: the layer's blocks follow it
    #pragma omp parallel for
    for (size_t i = 0; i < part; i++) { shard[i] += pack[i]; }
    shard_map_free(&m);
}

// the outer slices (wte, wpe, lnfw, lnfb: the tensors outside the layers): their indices in the model's slices and their offsets in a
// one-layer model's layout (the working buffers), in that order
typedef struct { int slice[4]; size_t working_at[4]; } OuterSlices;

static OuterSlices outer_slices(const GPT2Config* c) {
    GPT2Config one = *c;
    one.num_layers = 1;
    ParamSlice* w = param_slices_alloc(&one);
    int n = param_slice_count(c), n1 = param_slice_count(&one);
    OuterSlices hs = {{0, 1, n - 2, n - 1}, {w[0].offset, w[1].offset, w[n1 - 2].offset, w[n1 - 1].offset}};
    free(w);
    return hs;
}

// the outer slices' gradients (working: the working buffer, a one-layer model's layout) summed
// over the ranks, in place; this rank's blocks added to the shard
static void host_zero2_reduce_outer(const HostStep* h, float* working) {
    int world = h->dist.world;
    ShardMap m = shard_map(h->config, world, h->format);
    OuterSlices hs = outer_slices(h->config);
    int* counts = (int*)malloc_check((size_t)world * sizeof(int));
    for (int j = 0; j < 4; j++) {
        slice_part_counts(&m.slices[hs.slice[j]], world, h->format, counts);
        float* buf = working + hs.working_at[j];
        dist_reduce_scatter_floats(buf, counts, h->dist);
        const float* mine = buf + dist_part_offset(counts, h->dist.rank);
        float* shard = h->grads + m.at[hs.slice[j]];
        for (int i = 0; i < counts[h->dist.rank]; i++) { shard[i] += mine[i]; }
    }
    free(counts);
    shard_map_free(&m);
}

// ----------------------------------------------------------------------------
// ZeRO-3 on the host (the CPU backend): the weights are a shard in the gradient shard's layout
// (h->params); what the kernels read is gathered into a working copy shaped as a one-layer model:
// one layer at a time (one MPI_Allgather of the layer's blocks through the pack), and wte, wpe,
// lnfw, lnfb whole (an MPI_Allgatherv each). Checkpoints move the model a slice at a time through the
// working copy (host_zero3_stream): gathered to be written, and each rank's blocks kept as it is read.

// layer l's weights into layer (a one-layer model's 12 layer tensors) from every rank's blocks
static void host_zero3_gather_layer(const HostStep* h, float* layer, int l, float* pack) {
    const GPT2Config* c = h->config;
    int world = h->dist.world;
    ShardMap m = shard_map(c, world, h->format);
    size_t part = m.z.layer_part;
    memcpy(pack + (size_t)h->dist.rank * part, h->params + m.at[2 + l], part * sizeof(float));
    dist_allgather_block_floats(pack, (int)part, h->dist);
    float* ptrs[12];
    layer_slice_ptrs(c, m.slices, l, layer, 1, ptrs);
    for (int r = 0; r < world; r++) { zero_layer_blocks(c, m.slices, l, r, world, h->format, ptrs, pack + (size_t)r * part, 0); }
    shard_map_free(&m);
}

// slice sl's weights, whole, into dst from every rank's block (this rank's: block, in the shard)
static void zero3_gather_slice(const HostStep* h, const ParamSlice* sl, const float* block, float* dst, int* counts) {
    slice_part_counts(sl, h->dist.world, h->format, counts);
    memcpy(dst + dist_part_offset(counts, h->dist.rank), block, (size_t)counts[h->dist.rank] * sizeof(float));
    dist_allgather_floats(dst, counts, h->dist);
}

// wte, wpe, lnfw, lnfb gathered into the working copy (a one-layer model's layout)
static void host_zero3_gather_outer(const HostStep* h, float* working) {
    ShardMap m = shard_map(h->config, h->dist.world, h->format);
    OuterSlices hs = outer_slices(h->config);
    int* counts = (int*)malloc_check((size_t)h->dist.world * sizeof(int));
    for (int j = 0; j < 4; j++) {
        int k = hs.slice[j];
        zero3_gather_slice(h, &m.slices[k], h->params + m.at[k], working + hs.working_at[j], counts);
    }
    free(counts);
    shard_map_free(&m);
}

// ZeRO-3's weights a run at a time (opt_layout.h's weight_runs: a slice whole, or wte's padded rows, which
// no slice holds and stay zero): the stage's runs, its shard's map and the gathers' counts
typedef struct {
    const HostStep* h;
    ShardMap map;
    WeightRun* runs;
    int nruns;
    int* counts;     // (h->dist.world)
} Zero3Runs;

static Zero3Runs zero3_runs_begin(const HostStep* h) {
    Zero3Runs z = {h, shard_map(h->config, h->dist.world, h->format), NULL, 0, NULL};
    z.runs = (WeightRun*)malloc_check((size_t)(param_slice_count(h->config) + 1) * sizeof(WeightRun));
    z.nruns = weight_runs(h->config, z.map.slices, z.runs);
    z.counts = (int*)malloc_check((size_t)h->dist.world * sizeof(int));
    return z;
}

static void zero3_runs_end(Zero3Runs* z) {
    free(z->counts);
    free(z->runs);
    shard_map_free(&z->map);
}

// run r's floats whole into buf from every rank's blocks (a read: a collective over the data group)
static void zero3_run_gather(Zero3Runs* z, WeightRun r, float* buf) {
    if (r.slice < 0) { memset(buf, 0, r.n * sizeof(float)); return; }  // wte's padded rows
    zero3_gather_slice(z->h, &z->map.slices[r.slice], z->h->params + z->map.at[r.slice], buf, z->counts);
}

// run r's floats (buf, whole, as a write's caller filled them): this rank's block of them kept
static void zero3_run_keep(Zero3Runs* z, WeightRun r, const float* buf) {
    if (r.slice < 0) { return; }
    const HostStep* h = z->h;
    slice_part_counts(&z->map.slices[r.slice], h->dist.world, h->format, z->counts);
    memcpy(h->params + z->map.at[r.slice], buf + dist_part_offset(z->counts, h->dist.rank), (size_t)z->counts[h->dist.rank] * sizeof(float));
}

// the whole model's weights a slice at a time through staging (room for the largest slice), in
// model_config.h's order, as fn(ctx, offset, chunk, n) sees them: each slice gathered from every
// rank's blocks for fn to read, or (write) filled by fn and this rank's block kept. wte's padded
// rows, which no slice holds, go by as zeros
static void host_zero3_stream(const HostStep* h, int write, float* staging, void (*fn)(void*, size_t, float*, size_t), void* ctx) {
    Zero3Runs z = zero3_runs_begin(h);
    for (int i = 0; i < z.nruns; i++) {
        WeightRun r = z.runs[i];
        if (!write) { zero3_run_gather(&z, r, staging); }
        else if (r.slice < 0) { memset(staging, 0, r.n * sizeof(float)); }
        fn(ctx, r.offset, staging, r.n);
        if (write) { zero3_run_keep(&z, r, staging); }
    }
    zero3_runs_end(&z);
}

#endif // CPU_HOST_STEP_H
