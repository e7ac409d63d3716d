/*
tensor_parallel.h: tensor parallelism as Megatron-LM splits a GPT block (Shoeybi et al. 2019,
"Megatron-LM", section 3): the ranks of a tensor-parallel group (llmc/distributed.h's DIST_TENSOR)
each hold a slice of every layer's four matrices and compute with it; two sums over the group in
each block's forward, and two in its backward, join what the slices computed.

    attention: qkv = ln1 @ qkvw^T    column-parallel: rank r holds the rows of its heads (NH/N heads,
                                     C/N channels of each of q, k and v), and computes those heads
               y = atty @ attprojw^T row-parallel: rank r holds the columns that read its heads'
                                     channels, so its product is a partial sum of y: summed over the
                                     group (tp_sum), the bias added once (by rank 0: tp_row_bias)
    MLP:       h = ln2 @ fcw^T       column-parallel: 4C/N of the hidden units
               y = gelu(h) @ fcprojw^T  row-parallel: a partial sum, summed over the group

In backward the same two sums come before the column-parallel matrices' input gradients (d(ln1),
d(ln2)): each rank's slice gave a part of them. Everything else of a block (the LayerNorms, the
residual stream, the row-parallel biases) is whole and the same on every rank of the group, so
its gradients are too: the sums give every rank the same bits (the caller's TpSumFn must).

With one rank (TP_NONE) the sums do nothing and the bias goes in as before: the plain block.
The split of the whole model's tensors (the checkpoint's) into a rank's slices and back is here
too (tp_split_params, tp_join_params), and the stream through which the trainer's checkpoints
move the whole model from and to the group's slices (tp_stream_*): a checkpoint is the whole
model, whatever --tp wrote it. Which tensor splits how, and a rank's shapes, are
llmc/model_config.h's (PARAMETER_TP_SPLIT, gpt2_tensor_shape): the whole trainer sizes a rank's
tensors from its config (gpt2_rank_config).

    GPT2Config rc = gpt2_rank_config(&cfg, n);             // one rank's shapes
    float* mine = malloc(gpt2_num_parameters(&rc) * sizeof(float));
    tp_split_params(mine, whole, &cfg, rank, n);   // rank's slices of every tensor
    tp_join_params(whole, mine, &cfg, rank, n);    // and back (rank 0 joins every rank's)
*/
#ifndef CPU_TENSOR_PARALLEL_H
#define CPU_TENSOR_PARALLEL_H

#include <stddef.h>
#include <string.h>
#include "../llmc/distributed.h"
#include "../llmc/model_config.h"
#include "../llmc/opt_layout.h"
#include "../llmc/profile.h"
#include "../llmc/utils.h"
#include "layers.h"

// buf (n) := the sum (or the largest, element by element) of buf over the group's ranks, with the
// same bits on every rank. The sequence-parallel collectives take n floats a rank: buf holds every
// rank's n in rank order; an all-gather fills all of them from this rank's, a reduce-scatter leaves
// in buf's first n the group's sum of this rank's part
typedef void (*TpSumFn)(float* buf, size_t n, void* ctx);

typedef struct {
    int rank, size;  // this rank in the tensor-parallel group, and the group's size (1: no --tp)
    TpSumFn sum;     // the group's sum (size > 1)
    void* ctx;
    TpSumFn max;     // the group's largest (the vocabulary-parallel softmax's row maximum)
    // --sp (sequence parallelism): the residual stream and the LayerNorms are a rank's rows of B*T
    TpSumFn gather, reduce_scatter;
    float* gathered;    // (B,T,C) where the group's rows meet (Activations.sp_gathered); NULL without --sp
    float* norm_grads;  // (2C) a LayerNorm's weight and bias gradients of a rank's rows, after gathered's rows
} TensorParallel;

static const TensorParallel TP_NONE = {0, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL};

// the sum over a tensor-parallel group of processes (group: its Dist, from dist_grid): MPI's all-reduce,
// which gives every rank of the group the same bits (tests/test_dist_grid.c checks it); the largest;
// and --sp's all-gather and reduce-scatter (MPI's, in place)
static void tp_dist_sum(float* buf, size_t n, void* group) { dist_allreduce_floats_over(buf, n, *(const Dist*)group); }
static void tp_dist_max(float* buf, size_t n, void* group) { dist_allreduce_max_floats_over(buf, n, *(const Dist*)group); }
static void tp_dist_gather(float* buf, size_t n, void* group) {
    if (n > (size_t)INT_MAX) { fail("--sp: %zu floats a rank to gather, beyond MPI's int counts\n  hint: lower -b or -t", n); }
    dist_allgather_block_floats(buf, (int)n, *(const Dist*)group);
}
static void tp_dist_reduce_scatter(float* buf, size_t n, void* group) {
    if (n > (size_t)INT_MAX) { fail("--sp: %zu floats a rank to reduce-scatter, beyond MPI's int counts\n  hint: lower -b or -t", n); }
    dist_reduce_scatter_block_floats(buf, (int)n, *(const Dist*)group);
}

// this rank in its tensor-parallel group (the group's Dist must outlive it); gathered: --sp's buffer
// of (B,T,C) + 2C floats (Activations.sp_gathered), NULL without --sp
static TensorParallel tp_of_group(const Dist* tensor, float* gathered, size_t BTC) {
    TensorParallel tp = {tensor->rank, tensor->world, tp_dist_sum, (void*)tensor, tp_dist_max, tp_dist_gather, tp_dist_reduce_scatter,
                         gathered, gathered ? gathered + BTC : NULL};
    return tp;
}

// hook: the partial results of a row-parallel matmul (forward), or the partial input gradients of a
// column-parallel one (backward), summed over the group
static void tp_sum(const TensorParallel* tp, float* buf, size_t n) {
    if (tp->size == 1) { return; }
    prof_mark(PROF_COLLECTIVE, prof_bytes((double)n * sizeof(float)), "--tp all-reduce");
    tp->sum(buf, n, tp->ctx);
    prof_close();
}

// ----------------------------------------------------------------------------
// --sp, sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
// Transformer Models", section 4.2.2): what every rank of the group holds whole without it (the
// residual stream, the LayerNorms and their outputs) is split over the ranks' rows of B*T instead:
// rank r holds rows r B T/N .. (r + 1) B T/N - 1. A LayerNorm and a residual add work row by row, so a
// rank computes its rows. Before a column-parallel matmul the group's rows are gathered (an
// all-gather: `tp_gather`), and after a row-parallel one its partial sums are reduce-scattered, each
// rank taking the sum of its rows (`tp_reduce`), where --tp alone all-reduces: the same bytes move,
// and the activations kept between the matmuls are 1/N a rank. In backward the two swap.

// the rows of B*T this rank holds of the residual stream: all, or with --sp its 1/N; and the first
static size_t tp_rows(const TensorParallel* tp, size_t BT) { return tp->gathered ? BT / (size_t)tp->size : BT; }
static size_t tp_first_row(const TensorParallel* tp, size_t BT) { return tp->gathered ? (size_t)tp->rank * tp_rows(tp, BT) : 0; }

// hook, before a column-parallel matmul: its input, (B,T,C). Without --sp it is `mine`; with --sp
// `mine` is this rank's rows of it (n floats), gathered with every rank's into the gathered buffer
static const float* tp_gather(const TensorParallel* tp, const float* mine, size_t n) {
    if (tp->gathered == NULL) { return mine; }
    prof_mark(PROF_COLLECTIVE, prof_bytes((double)n * tp->size * sizeof(float)), "--sp all-gather");
    memcpy(tp->gathered + (size_t)tp->rank * n, mine, n * sizeof(float));
    tp->gather(tp->gathered, n, tp->ctx);
    prof_close();
    return tp->gathered;
}

// where a row-parallel matmul writes its partial output (B,T,C): out itself, or with --sp the
// gathered buffer (whose sums tp_reduce hands out by rows)
static float* tp_partial(const TensorParallel* tp, float* out) { return tp->gathered ? tp->gathered : out; }

// hook: the group's partial sums in `partial` (n = B T C floats) added: in place over every row (--tp:
// then partial is out), or with --sp this rank's rows of the sum into out (n / N floats)
static void tp_reduce(const TensorParallel* tp, float* partial, float* out, size_t n) {
    if (tp->gathered == NULL) { tp_sum(tp, partial, n); return; }
    size_t mine = n / (size_t)tp->size;
    prof_mark(PROF_COLLECTIVE, prof_bytes((double)n * sizeof(float)), "--sp reduce-scatter");
    tp->reduce_scatter(partial, mine, tp->ctx);  // this rank's rows of the sum, at partial's start
    if (out != partial) { memcpy(out, partial, mine * sizeof(float)); }
    prof_close();
}

// --sp: a LayerNorm's backward over this rank's rows gives a part of its weight's and bias's
// gradients: they go to 2C scratch floats (zeroed here) and tp_norm_grads_done adds the group's sum
// of them into the model's. Without --sp the model's own gradients (dw, db), += as always
typedef struct { float *w, *b; } TpNormGrads;

static TpNormGrads tp_norm_grads(const TensorParallel* tp, float* dw, float* db, int C) {
    TpNormGrads g = {dw, db};
    if (tp->gathered == NULL) { return g; }
    memset(tp->norm_grads, 0, 2 * (size_t)C * sizeof(float));
    g.w = tp->norm_grads;
    g.b = tp->norm_grads + C;
    return g;
}

// hook, after a LayerNorm's backward: --sp's parts of its parameter gradients summed and added
static void tp_norm_grads_done(const TensorParallel* tp, const TpNormGrads* g, float* dw, float* db, int C) {
    if (tp->gathered == NULL) { return; }
    tp_sum(tp, tp->norm_grads, 2 * (size_t)C);
    for (int c = 0; c < C; c++) { dw[c] += g->w[c]; db[c] += g->b[c]; }
}

// a row-parallel matmul's bias: rank 0 adds it, so that the sum holds it once
static const float* tp_row_bias(const TensorParallel* tp, const float* bias) { return tp->rank == 0 ? bias : NULL; }

// ----------------------------------------------------------------------------
// the vocabulary-parallel embedding and classifier (Megatron-LM's VocabParallelEmbedding and parallel
// cross-entropy). wte (Vp, C) is split by rows: this rank holds the Vr = Vp/N rows of tokens
// v0 = rank Vr .. v0 + Vr - 1, of which the real ones (< V) are `tp_real_rows`. The embedding adds the
// rows of the tokens a rank holds (zeros for the others'), and the group's sum gives every rank the
// whole embedding. The classifier's logits are a rank's columns (n, Vr): the softmax takes the row's
// maximum and sum of exponentials over the group, so that no rank ever holds a whole row of logits,
// and the loss of a position is that of the rank holding its target (the others add 0).

// the real rows (tokens < V) of this rank's Vr rows of wte
static int tp_real_rows(const TensorParallel* tp, int V, int Vr) {
    int real = V - tp->rank * Vr;
    return real < 0 ? 0 : real > Vr ? Vr : real;
}

// out (B,T,C) = wte[inp] + wpe[t], wte (Vr, C) this rank's rows: the embedding of each token the rank
// holds, zeros for the others', summed over the group (one nonzero row each: the plain embedding's
// bits), then wpe (maxT, C) added on every rank. With --sp out is this rank's rows of it (reduce-scattered)
static void tp_encoder_forward(const TensorParallel* tp, float* out, const int* inp, const float* wte, const float* wpe,
                               int B, int T, int C, int Vr) {
    prof_mark(PROF_ENCODER, prof_encoder_forward((size_t)B * T, C, sizeof(float)), "forward (vocabulary-parallel)");
    int v0 = tp->rank * Vr;
    size_t BT = (size_t)B * T, first = tp_first_row(tp, BT);
    float* full = tp_partial(tp, out);
    #pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        float* o = full + (size_t)bt * C;
        int row = inp[bt] - v0;
        if (row >= 0 && row < Vr) { memcpy(o, wte + (size_t)row * C, (size_t)C * sizeof(float)); }
        else { memset(o, 0, (size_t)C * sizeof(float)); }
    }
    tp_reduce(tp, full, out, BT * C);
    #pragma omp parallel for
    for (long long i = 0; i < (long long)tp_rows(tp, BT); i++) {  // this rank's rows: position (first + i) mod T
        float* o = out + (size_t)i * C;
        const float* pe = wpe + ((first + (size_t)i) % (size_t)T) * C;
        for (int c = 0; c < C; c++) { o[c] += pe[c]; }
    }
}

// dwte (Vr, C) += dout (B,T,C) of the tokens this rank holds; dwpe (maxT, C) += the sum over b (every
// rank the same: dout is every row's, with --sp gathered first)
static void tp_encoder_backward(const TensorParallel* tp, float* dwte, float* dwpe, const float* dout, const int* inp,
                                int B, int T, int C, int Vr) {
    encoder_backward_rows(dwte, dwpe, dout, inp, B, T, C, tp->rank * Vr, Vr, "backward (vocabulary-parallel)");
    prof_close();
}

// probs (n, Vr) := the softmax of each row of logits over the whole vocabulary, of which this rank holds
// columns v0 .. v0 + Vr - 1 (n, Vr; zero past V); may be in place. The row's maximum and its sum of
// exponentials are taken over the group (two all-reduces of n floats)
static void tp_softmax_forward(const TensorParallel* tp, float* probs, const float* logits, int n, int V, int Vr) {
    prof_mark(PROF_CLASSIFIER, prof_classifier((size_t)n, tp_real_rows(tp, V, Vr), Vr, sizeof(float)),
              "forward (softmax, cross-entropy; vocabulary-parallel)");
    int real = tp_real_rows(tp, V, Vr);
    float* stats = (float*)malloc_check(2 * (size_t)(n > 0 ? n : 1) * sizeof(float));
    float *row_max = stats, *row_sum = stats + n;
    #pragma omp parallel for
    for (int r = 0; r < n; r++) { row_max[r] = softmax_row_max(logits + (size_t)r * Vr, real, Vr); }
    tp->max(row_max, (size_t)n, tp->ctx);
    #pragma omp parallel for
    for (int r = 0; r < n; r++) { row_sum[r] = softmax_exp_row(probs + (size_t)r * Vr, logits + (size_t)r * Vr, row_max[r], real, Vr, NULL); }
    tp->sum(row_sum, (size_t)n, tp->ctx);
    #pragma omp parallel for
    for (int r = 0; r < n; r++) {
        float* p = probs + (size_t)r * Vr, inv = 1.0f / row_sum[r];
        for (int i = 0; i < real; i++) { p[i] *= inv; }
        for (int i = real; i < Vr; i++) { p[i] = 0.0f; }
    }
    free(stats);
    prof_close();
}

// losses (n) := -log probs[target] of each row, taken by the rank that holds the target (the others
// give 0) and summed over the group: the same bits on every rank
static void tp_crossentropy_forward(const TensorParallel* tp, float* losses, const float* probs, const int* targets, int n, int Vr) {
    int v0 = tp->rank * Vr;
    for (int r = 0; r < n; r++) {
        int col = targets[r] - v0;
        losses[r] = col >= 0 && col < Vr ? -logf(probs[(size_t)r * Vr + col]) : 0.0f;
    }
    tp->sum(losses, (size_t)n, tp->ctx);
}

// dlogits (n, Vr) := (probs - onehot(target)) * dloss on this rank's columns, zero past V (in place allowed)
static void tp_crossentropy_softmax_backward(const TensorParallel* tp, float* dlogits, const float* probs, const int* targets,
                                             float dloss, int n, int V, int Vr) {
    prof_mark(PROF_CLASSIFIER, prof_classifier((size_t)n, tp_real_rows(tp, V, Vr), Vr, sizeof(float)), "backward (vocabulary-parallel)");
    int v0 = tp->rank * Vr, real = tp_real_rows(tp, V, Vr);
    #pragma omp parallel for
    for (int r = 0; r < n; r++) {
        const float* p = probs + (size_t)r * Vr;
        float* d = dlogits + (size_t)r * Vr;
        int col = targets[r] - v0;
        for (int i = 0; i < real; i++) { d[i] = (p[i] - (i == col ? 1.0f : 0.0f)) * dloss; }
        for (int i = real; i < Vr; i++) { d[i] = 0.0f; }
    }
    prof_close();
}

// ----------------------------------------------------------------------------
// the slices: how --tp cuts each parameter tensor (model_config.h's PARAMETER_TP_SPLIT; a rank's
// shapes are those of its config, gpt2_rank_config, whose tp is the group's size: gpt2_tensor_shape;
// gpt2_tp_refusal says why a model does not split)

// rank's slice of one layer's (rows, cols) tensor between the whole (whole) and the slice (mine):
// to_slice 1 copies whole -> mine, 0 mine -> whole
static void tp_copy_slice(float* mine, float* whole, size_t rows, size_t cols, TpSplit split, int rank, int n, int to_slice) {
    size_t parts = split == TP_ROWS_QKV ? 3 : 1;
    if (split == TP_WHOLE) { n = 1, rank = 0; split = TP_ROWS; }
    if (split == TP_COLUMNS) {  // a strided copy: cols / n of every row
        size_t w = cols / (size_t)n;
        for (size_t r = 0; r < rows; r++) {
            float *a = mine + r * w, *b = whole + r * cols + (size_t)rank * w;
            memcpy(to_slice ? a : b, to_slice ? b : a, w * sizeof(float));
        }
        return;
    }
    size_t part_rows = rows / parts, h = part_rows / (size_t)n;  // rows of each part (q, k, v), this rank's of them
    for (size_t p = 0; p < parts; p++) {
        float *a = mine + p * h * cols, *b = whole + (p * part_rows + (size_t)rank * h) * cols;
        memcpy(to_slice ? a : b, to_slice ? b : a, h * cols * sizeof(float));
    }
}

// every tensor of the whole model's params, rank's slice into mine, or (to_slice 0) back
static void tp_move_params(float* mine, float* whole, const GPT2Config* c, int rank, int n, int to_slice) {
    GPT2Config rc = gpt2_rank_config(c, n), wc = gpt2_rank_config(c, 1);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t rows, cols, slice_rows, slice_cols, layers = PARAMETER_IS_PER_LAYER[i] ? (size_t)c->num_layers : 1;
        gpt2_tensor_shape(i, &wc, &rows, &cols);
        gpt2_tensor_shape(i, &rc, &slice_rows, &slice_cols);
        for (size_t l = 0; l < layers; l++) {
            tp_copy_slice(mine + l * slice_rows * slice_cols, whole + l * rows * cols, rows, cols, PARAMETER_TP_SPLIT[i], rank, n, to_slice);
        }
        mine += layers * slice_rows * slice_cols;
        whole += layers * rows * cols;
    }
}

static void tp_split_params(float* mine, const float* whole, const GPT2Config* c, int rank, int n) {
    tp_move_params(mine, (float*)whole, c, rank, n, 1);  // whole is only read
}
static void tp_join_params(float* whole, const float* mine, const GPT2Config* c, int rank, int n) {
    tp_move_params((float*)mine, whole, c, rank, n, 0);  // mine is only read
}

// ----------------------------------------------------------------------------
// the whole model's weights from the group's slices, a run at a time (checkpoints, the replicas'
// hash, the initialisation): the model file is the whole model whatever --tp wrote it. Every rank
// of the group makes the same calls. A read hands each split tensor's layer on in the whole model's
// order: a tensor split by rows (fcw, fcb, wte) rank after rank, each rank's rows broadcast over the
// group through the staging buffer a piece at a time; one whose ranks' parts interleave (qkvw, qkvb
// within each of q, k and v; a row-parallel matrix's rows) gathered whole into it first (an
// all-gather). A write (the file or the seeded initialisation fills the whole model) keeps this
// rank's part of each. The tensors every rank holds whole go by as they are.

typedef void (*TpChunkFn)(void* ctx, size_t offset, float* chunk, size_t n);  // as trainer.h's ParamChunkFn

// floats of the staging a stream needs: an interleaved split tensor's layer, whole (fcprojw: 4C^2)
static size_t tp_staging_floats(const GPT2Config* c) { return 4 * (size_t)c->channels * c->channels; }

typedef struct {
    GPT2Config whole, rank;   // the model's shapes and this rank's (rank.tp: the group's size)
    Dist group;               // the tensor-parallel group
    ParamSlice* slices;       // this rank's slices: each run's tensor and layer
    WeightRun* runs;          // this rank's weights, run by run (a split model has no padding run: wte's rows are Vp/N)
    int nruns, next;          // the runs, and the one the next chunk starts with
    size_t whole_at[NUM_PARAMETER_TENSORS];  // where each tensor begins in the whole model
    int* counts;              // (group.world) every rank's floats of a run being gathered
    float* staging;           // (tp_staging_floats)
    int write;                // 1: the caller fills the whole model and each rank keeps its part
    TpChunkFn fn;             // the caller's, over the whole model
    void* ctx;
} TpStream;

static void tp_stream_begin(TpStream* t, const GPT2Config* rank, Dist group, float* staging, int write, TpChunkFn fn, void* ctx) {
    t->rank = *rank;
    t->whole = gpt2_rank_config(rank, 1);
    t->group = group;
    t->slices = param_slices_alloc(&t->rank);
    t->runs = (WeightRun*)malloc_check((size_t)(param_slice_count(rank) + 1) * sizeof(WeightRun));
    t->nruns = weight_runs(&t->rank, t->slices, t->runs);
    size_t sizes[NUM_PARAMETER_TENSORS], at = 0;
    gpt2_parameter_sizes(sizes, &t->whole);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { t->whole_at[i] = at; at += sizes[i]; }
    t->next = 0;
    t->counts = (int*)malloc_check((size_t)group.world * sizeof(int));
    t->staging = staging;
    t->write = write;
    t->fn = fn;
    t->ctx = ctx;
}

static void tp_stream_end(TpStream* t) {
    if (t->next != t->nruns) { fail("tp_stream_end: %d of the %d runs of the weights went by (a bug)", t->next, t->nruns); }
    free(t->slices);
    free(t->runs);
    free(t->counts);
}

// a tensor split by rows: rank q's n floats (mine on rank q) are the whole's floats at + q n ...:
// read, broadcast from each rank in turn a staging buffer at a time; write, each rank keeps its own
static void tp_stream_rows(TpStream* t, float* mine, size_t n, size_t at) {
    size_t piece = tp_staging_floats(&t->whole);
    for (int q = 0; q < t->group.world; q++) {
        for (size_t done = 0; done < n; done += piece) {
            size_t len = n - done < piece ? n - done : piece, whole_at = at + (size_t)q * n + done;
            if (t->write) {
                t->fn(t->ctx, whole_at, t->staging, len);
                if (q == t->group.rank) { memcpy(mine + done, t->staging, len * sizeof(float)); }
            } else {
                if (q == t->group.rank) { memcpy(t->staging, mine + done, len * sizeof(float)); }
                dist_broadcast_floats_over(t->staging, len, q, t->group);
                t->fn(t->ctx, whole_at, t->staging, len);
            }
        }
    }
}

// one run of this rank's weights, r (mine: its r.n floats): slice r.slice's part of the whole model
static void tp_stream_run(TpStream* t, WeightRun r, float* mine) {
    if (r.slice < 0) { fail("tp_stream_run: a padding run in a split model (a bug: wte's rows are Vp/N there)"); }
    const ParamSlice* sl = &t->slices[r.slice];
    int i = sl->tensor, l = sl->layer < 0 ? 0 : sl->layer;
    size_t rows, cols, N = (size_t)t->group.world, rank = (size_t)t->group.rank;
    gpt2_tensor_shape(i, &t->whole, &rows, &cols);
    size_t at = t->whole_at[i] + (size_t)l * rows * cols;  // the whole layer of the tensor, in the whole model
    TpSplit split = PARAMETER_TP_SPLIT[i];
    if (split == TP_WHOLE) { t->fn(t->ctx, at, mine, r.n); return; }
    if (rows * cols != N * r.n) { fail("tp_stream_run: a slice of %zu floats of a %zu x %zu tensor (a bug)", r.n, rows, cols); }
    if (split == TP_ROWS) { tp_stream_rows(t, mine, r.n, at); return; }
    if (rows * cols > tp_staging_floats(&t->whole)) { fail("tp_stream_run: %zu x %zu beyond the staging buffer (a bug)", rows, cols); }
    if (t->write) {  // the whole layer from the caller, this rank's part kept
        t->fn(t->ctx, at, t->staging, rows * cols);
        tp_copy_slice(mine, t->staging, rows, cols, split, (int)rank, (int)N, 1);
        return;
    }
    for (size_t q = 0; q < N; q++) { t->counts[q] = (int)r.n; }
    memcpy(t->staging + rank * r.n, mine, r.n * sizeof(float));
    dist_allgather_floats(t->staging, t->counts, t->group);  // rank q's part at q * r.n
    // handed on in the whole model's order: within each of q, k and v the rows of rank after rank, or
    // each row's columns of rank after rank
    size_t parts = split == TP_COLUMNS ? rows : 3, piece = r.n / parts;
    for (size_t p = 0; p < parts; p++) {
        for (size_t q = 0; q < N; q++, at += piece) { t->fn(t->ctx, at, t->staging + q * r.n + p * piece, piece); }
    }
}

// the caller's chunk of this rank's weights (offset, n: whole runs of them, in order) through the stream
static void tp_stream_chunk(void* ctx, size_t offset, float* chunk, size_t n) {
    TpStream* t = (TpStream*)ctx;
    for (size_t done = 0; done < n; ) {
        if (t->next >= t->nruns || t->runs[t->next].offset != offset + done || t->runs[t->next].n > n - done) {
            fail("tp_stream_chunk: a chunk of the weights that is not whole runs of them (a bug)");
        }
        WeightRun r = t->runs[t->next];
        tp_stream_run(t, r, chunk + done);
        done += r.n;
        t->next++;
    }
}

#endif // CPU_TENSOR_PARALLEL_H
