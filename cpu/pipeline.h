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
#include "host_step.h"
#include "tensor_parallel.h"

typedef void (*PpChunkFn)(void* ctx, size_t offset, float* chunk, size_t n);  // as trainer.h's ParamChunkFn

// the stream's staging buffer: the whole model's weights go through it a piece at a time
static size_t pp_staging_floats(const GPT2Config* c) { return 4 * (size_t)c->channels * c->channels; }

typedef struct {
    const GPT2Config* whole;  // the model's config
    const GPT2Config* stage;  // this rank's stage's config (pp_stage_config; with --tp its slices)
    float* params;            // its weights, whole (without --zero 3)
    Dist pipeline;            // the pipeline group: rank s is stage s
    Dist tensor;              // --tp: the stage's tensor-parallel group ({0, 1}: none)
    float* staging;           // (pp_staging_floats)
    float* tp_staging;        // --tp: cpu/tensor_parallel.h's stream's (tp_staging_floats), else NULL
    const HostStep* zero3;    // --zero 3: the stage's weights are this rank's blocks (zero3->params), a run at a time
                              // gathered whole into zero3_staging (room for the largest slice); NULL: params holds them
    float* zero3_staging;
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

// One piece of the whole model, [at, at + n): tensor i's layers on one stage, or an outer tensor. Read,
// the stage that holds it ("from") pushes its floats in order (pp_relay_push: from its weights, or with
// --tp from the group's stream of its slices) and every stage gets them a staging buffer at a time, cut
// at the same places on every stage (pp_relay_take); write, fn fills them, and the stages that hold the
// piece keep their part. A stage that holds a copy it does not send (wte on the last stage) compares
// its part, `window` floats at `mine` from whole-model offset `window_at`, with what arrives.
typedef struct {
    const PpModel* p;
    int from;                 // the stage that sends the piece
    size_t at, n;             // the piece
    size_t pushed, filled;    // floats of the piece into the staging buffer (the sender), and through it (read)
    size_t base;              // --tp: a whole-model offset less the stage's stream's offset of the same float
    const float* mine;        // a held copy to compare (read, not the sender), else NULL
    size_t window_at, window;
    int write;
    PpChunkFn fn;             // the caller's, over the whole model
    void* ctx;
} PpRelay;

// the staging buffer's floats to every stage and to fn (read)
static void pp_relay_take(PpRelay* r, size_t len) {
    const PpModel* p = r->p;
    size_t at = r->at + r->filled;
    dist_broadcast_floats_over(p->staging, len, r->from, p->pipeline);
    size_t lo = at > r->window_at ? at : r->window_at, hi = at + len < r->window_at + r->window ? at + len : r->window_at + r->window;
    if (r->mine != NULL && lo < hi && memcmp(r->mine + (lo - r->window_at), p->staging + (lo - at), (hi - lo) * sizeof(float)) != 0) {
        fail("--pp: the last stage's copy of wte differs from the first stage's (floats %zu..%zu)\n"
             "  hint: a bug: the pair's gradient sums must give both copies the same bits", lo, hi);
    }
    r->fn(r->ctx, at, p->staging, len);
    r->filled += len;
}

// the sender's next n floats of the piece, at whole-model offset `at` (they come in order)
static void pp_relay_push(PpRelay* r, size_t at, const float* chunk, size_t n) {
    size_t piece = pp_staging_floats(r->p->stage);
    if (at != r->at + r->pushed) { fail("pp_relay_push: floats at %zu, not at %zu where the last ended (a bug)", at, r->at + r->pushed); }
    for (size_t done = 0; done < n; ) {
        size_t in_staging = r->pushed - r->filled;
        size_t len = n - done < piece - in_staging ? n - done : piece - in_staging;
        memcpy(r->p->staging + in_staging, chunk + done, len * sizeof(float));
        done += len;
        r->pushed += len;
        if (r->pushed - r->filled == piece) { pp_relay_take(r, piece); }
    }
}

// --tp's stream hands the relay its chunks at the stage's own offsets (write: to fill, read: to send)
static void pp_relay_chunk(void* ctx, size_t offset, float* chunk, size_t n) {
    PpRelay* r = (PpRelay*)ctx;
    if (r->write) { r->fn(r->ctx, offset + r->base, chunk, n); }
    else { pp_relay_push(r, offset + r->base, chunk, n); }
}

// whether one of the stage's runs of its weights lies in tensor i, whose mine_n floats in the stage's weights
// begin at mine_at (a padding run, wte's padded rows, lies in wte)
static int pp_run_in_tensor(const WeightRun* run, size_t mine_at, size_t mine_n) {
    return run->offset >= mine_at && run->offset < mine_at + mine_n;
}

// one of the stage's runs of its weights, the sender's (read) or a holder's (write): with --zero 3 gathered
// whole from the data group's blocks first (read) or its block kept after (write); with --tp through the
// group's stream, else straight through the relay (read) or from the caller (write)
static void pp_stream_run(PpRelay* r, TpStream* t, Zero3Runs* z, WeightRun run, size_t mine_at) {
    const PpModel* p = r->p;
    float* buf = z != NULL ? p->zero3_staging : p->params + run.offset;
    if (z != NULL && !r->write) { zero3_run_gather(z, run, buf); }
    if (t != NULL) { tp_stream_run(t, run, buf); }
    else if (r->write) { r->fn(r->ctx, r->at + (run.offset - mine_at), buf, run.n); }
    else { pp_relay_push(r, r->at + (run.offset - mine_at), buf, run.n); }
    if (z != NULL && r->write) { zero3_run_keep(z, run, buf); }
}

// the piece through the relay: the sender (or, write, every stage that holds it) streams `mine` (n
// floats at mine_at in its weights; with --tp or --zero 3, the stage's runs of tensor i from run *next on),
// the others wait for it
static void pp_stream_piece(PpRelay* r, int holds, float* mine, size_t mine_at, size_t mine_n, TpStream* t, Zero3Runs* z, int i, int* next) {
    const PpModel* p = r->p;
    size_t piece = pp_staging_floats(p->stage);
    int streams = r->write ? holds : p->pipeline.rank == r->from;
    const WeightRun* runs = t != NULL ? t->runs : z != NULL ? z->runs : NULL;
    int nruns = t != NULL ? t->nruns : z != NULL ? z->nruns : 0;
    if (streams && runs != NULL) {  // --tp or --zero 3: the stage's runs of tensor i, one at a time
        if (t != NULL) { r->base = r->at - t->whole_at[i]; }  // the stage's first layer of tensor i is the piece's start
        while (*next < nruns && pp_run_in_tensor(&runs[*next], mine_at, mine_n)) {
            pp_stream_run(r, t, z, runs[*next], mine_at);
            (*next)++;
        }
    } else if (streams && r->write) {
        for (size_t done = 0; done < r->n; done += piece) {
            size_t len = r->n - done < piece ? r->n - done : piece;
            r->fn(r->ctx, r->at + done, p->staging, len);
            memcpy(mine + done, p->staging, len * sizeof(float));
        }
    } else if (streams) {
        pp_relay_push(r, r->at, mine, r->n);
    } else if (r->write) {  // not held here: the caller's floats go by
        for (size_t done = 0; done < r->n; done += piece) { r->fn(r->ctx, r->at + done, p->staging, r->n - done < piece ? r->n - done : piece); }
        return;
    }
    if (r->write) { return; }
    while (holds && !streams && runs != NULL && *next < nruns && pp_run_in_tensor(&runs[*next], mine_at, mine_n)) { (*next)++; }  // a copy not sent
    while (r->filled < r->n) {  // the last piece (the sender's staging holds it), or every piece (the others)
        size_t len = r->n - r->filled < piece ? r->n - r->filled : piece;
        pp_relay_take(r, len);
    }
}

// the whole model's weights in model_config.h's order from the stages' parts (every rank of the
// pipeline group calls it alike): tensor by tensor, a per-layer tensor's layers stage after stage, an
// outer tensor from the stage that holds it. Read (a checkpoint, the replicas' hash): each part is
// broadcast from its stage (the last stage checks its copy of wte against the first's, but under
// --zero 3); write (the model file, the seeded initialisation: every rank reads all of it), each stage
// keeps its parts. With --tp a stage's part comes from (and goes to) its tensor group's slices through
// cpu/tensor_parallel.h's stream, and each tensor place's pipeline group carries the same whole pieces;
// with --zero 3 (p->zero3) each of the stage's slices is gathered whole from its data group's blocks
// first, or its block kept after (pp_stream_run)
static void pp_params_stream(const PpModel* p, int write, PpChunkFn fn, void* ctx) {
    const GPT2Config *me = p->stage, *whole = p->whole;
    int N = p->pipeline.world, next = 0;
    TpStream t, *tp = NULL;
    if (p->tensor.world > 1) {
        tp = &t;
        tp_stream_begin(tp, me, p->tensor, p->tp_staging, write, pp_relay_chunk, NULL);
    }
    Zero3Runs z3, *z = NULL;
    if (p->zero3 != NULL) {
        z = &z3;
        z3 = zero3_runs_begin(p->zero3);
    }
    size_t whole_sizes[NUM_PARAMETER_TENSORS], mine_sizes[NUM_PARAMETER_TENSORS], at = 0, mine_at = 0;
    gpt2_parameter_sizes(whole_sizes, whole);
    gpt2_parameter_sizes(mine_sizes, me);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        float* mine = p->params != NULL ? p->params + mine_at : NULL;
        int parts = PARAMETER_IS_PER_LAYER[i] ? N : 1;
        for (int s = 0; s < parts; s++) {
            PpStage st = pp_stage(whole->num_layers, N, s);
            int from = PARAMETER_IS_PER_LAYER[i] ? s : pp_outer_owner(i, N);
            int holds = PARAMETER_IS_PER_LAYER[i] ? s == me->stage : gpt2_holds_tensor(me, i);
            PpRelay r = {.p = p, .from = from, .at = at + pp_layer_offset(i, whole, PARAMETER_IS_PER_LAYER[i] ? st.first : 0),
                         .n = PARAMETER_IS_PER_LAYER[i] ? pp_layer_offset(i, whole, st.layers) : whole_sizes[i],
                         .pushed = 0, .filled = 0, .base = 0, .mine = NULL, .window_at = 0, .window = 0, .write = write, .fn = fn, .ctx = ctx};
            if (!write && holds && p->pipeline.rank != from && z == NULL) {  // a copy to compare: this tensor place's slice of it
                                                                             // (--zero 3: the data group's blocks, not compared)
                r.mine = mine;
                r.window = mine_sizes[i];
                r.window_at = r.at + (tp != NULL && PARAMETER_TP_SPLIT[i] == TP_ROWS ? (size_t)p->tensor.rank * mine_sizes[i] : 0);
            }
            if (tp != NULL) { tp->ctx = &r; }
            pp_stream_piece(&r, holds, mine, mine_at, mine_sizes[i], tp, z, i, &next);
        }
        at += whole_sizes[i];
        mine_at += mine_sizes[i];
    }
    if (tp != NULL) {
        tp->next = next;
        tp_stream_end(tp);
    }
    if (z != NULL) {
        if (tp == NULL && next != z->nruns) { fail("pp_params_stream: %d of the %d runs of the weights went by (a bug)", next, z->nruns); }
        zero3_runs_end(z);
    }
}

// wte's gradient: the first stage's part (the embedding's backward) and the last's (the classifier's)
// added over the pair, n floats of it (this rank's: whole, or ZeRO's block), the same bits on both
static void pp_sum_pair(float* wte_grads, size_t n, Dist pair) { dist_allreduce_floats_over(wte_grads, n, pair); }

#endif // CPU_PIPELINE_H
