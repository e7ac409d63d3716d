/*
pipeline.h: pipeline parallelism (--pp, doc/pipeline_parallel.md) on the CPU trainer, what a stage does
beside computing its layers. The schedule, which forward and backward a stage runs when and which
messages go between neighbours, is llmc/pipeline.h's, for every backend; the trainer walks it
(llmc/trainer.h) and train_gpt.c computes a stage's part of forward and backward. Here:

    pp_params_stream(&s, write, fn, ctx);   // the whole model from the stages' parts (checkpoints, the initialisation)
    pp_sum_pair(grads, n, pair);            // wte's gradient: the first stage's (the embedding) + the last's (the classifier)

A stage's config (llmc/pipeline.h's pp_stage_config) holds its layers and the outer tensors it computes
with: wte on the first and the last stage (tied: the embedding and the classifier), wpe on the first,
the final LayerNorm on the last. The model file stays the whole model whatever --pp wrote it.
*/
#ifndef CPU_PIPELINE_H
#define CPU_PIPELINE_H

#include <stddef.h>
#include <string.h>
#include "../llmc/checkpoint.h"
#include "../llmc/distributed.h"
#include "../llmc/model_config.h"
#include "../llmc/pipeline.h"
#include "../llmc/utils.h"

typedef void (*PpChunkFn)(void* ctx, size_t offset, float* chunk, size_t n);  // as trainer.h's ParamChunkFn

// the stream's staging buffer: the whole model's weights go through it a piece at a time
static size_t pp_staging_floats(const GPT2Config* c) { return 4 * (size_t)c->channels * c->channels; }

typedef struct {
    const GPT2Config* whole;  // the model's config
    const GPT2Config* stage;  // this rank's stage's config (pp_stage_config)
    float* params;            // its weights, whole (not ZeRO-3's shard)
    Dist pipeline;            // the pipeline group: rank s is stage s
    float* staging;           // (pp_staging_floats)
} PpModel;

// the stage that sends tensor i's part of layer range (the outer tensors: wte and wpe the first stage,
// whose copy the last stage's equals; the final LayerNorm the last)
static int pp_outer_owner(int i, int N) { return i <= 1 ? 0 : N - 1; }

// floats of tensor i before its layer `layer` (a per-layer tensor), or 0
static size_t pp_layer_offset(int i, const GPT2Config* c, int layer) {
    size_t rows, cols;
    gpt2_tensor_shape(i, c, &rows, &cols);
    return PARAMETER_IS_PER_LAYER[i] ? (size_t)layer * rows * cols : 0;
}

// n floats of the whole model at `at`: read, stage `from`'s (mine there) broadcast over the group a
// staging buffer at a time and handed to fn; write, fn fills them and the stages that hold them keep
// them (mine: NULL where this stage does not)
static void pp_stream_piece(const PpModel* p, int write, int from, float* mine, size_t n, size_t at, PpChunkFn fn, void* ctx) {
    size_t piece = pp_staging_floats(p->stage);
    for (size_t done = 0; done < n; done += piece) {
        size_t len = n - done < piece ? n - done : piece;
        if (write) {
            fn(ctx, at + done, p->staging, len);
            if (mine != NULL) { memcpy(mine + done, p->staging, len * sizeof(float)); }
            continue;
        }
        if (p->pipeline.rank == from) { memcpy(p->staging, mine + done, len * sizeof(float)); }
        dist_broadcast_floats_over(p->staging, len, from, p->pipeline);
        if (mine != NULL && p->pipeline.rank != from && memcmp(mine + done, p->staging, len * sizeof(float)) != 0) {
            fail("--pp: the last stage's copy of wte differs from the first stage's (floats %zu..%zu)\n"
                 "  hint: a bug: the pair's gradient sums must give both copies the same bits", at + done, at + done + len);
        }
        fn(ctx, at + done, p->staging, len);
    }
}

// the whole model's weights in model_config.h's order from the stages' parts (every rank of the
// pipeline group calls it alike): tensor by tensor, a per-layer tensor's layers stage after stage, an
// outer tensor from the stage that holds it. Read (a checkpoint, the replicas' hash): each part is
// broadcast from its stage (the last stage checks its copy of wte against the first's); write (the
// model file, the seeded initialisation: every rank reads all of it), each stage keeps its parts
static void pp_params_stream(const PpModel* p, int write, PpChunkFn fn, void* ctx) {
    const GPT2Config *me = p->stage, *whole = p->whole;
    int N = p->pipeline.world;
    size_t whole_sizes[NUM_PARAMETER_TENSORS], mine_sizes[NUM_PARAMETER_TENSORS], at = 0, mine_at = 0;
    gpt2_parameter_sizes(whole_sizes, whole);
    gpt2_parameter_sizes(mine_sizes, me);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        float* mine = p->params + mine_at;
        if (!PARAMETER_IS_PER_LAYER[i]) {
            int from = pp_outer_owner(i, N);
            pp_stream_piece(p, write, from, gpt2_holds_tensor(me, i) ? mine : NULL, whole_sizes[i], at, fn, ctx);
        } else {
            for (int s = 0; s < N; s++) {
                PpStage st = pp_stage(whole->num_layers, N, s);
                size_t n = pp_layer_offset(i, whole, st.layers), off = at + pp_layer_offset(i, whole, st.first);
                pp_stream_piece(p, write, s, s == me->stage ? mine : NULL, n, off, fn, ctx);
            }
        }
        at += whole_sizes[i];
        mine_at += mine_sizes[i];
    }
}

// wte's gradient: the first stage's part (the embedding's backward) and the last's (the classifier's)
// added over the pair, n floats of it (this rank's: whole, or ZeRO's block), the same bits on both
static void pp_sum_pair(float* wte_grads, size_t n, Dist pair) { dist_allreduce_floats_over(wte_grads, n, pair); }

#endif // CPU_PIPELINE_H
