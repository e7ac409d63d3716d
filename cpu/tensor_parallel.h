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
#include "../llmc/utils.h"

// buf (n) := the sum of buf over the group's ranks, with the same bits on every rank
typedef void (*TpSumFn)(float* buf, size_t n, void* ctx);

typedef struct {
    int rank, size;  // this rank in the tensor-parallel group, and the group's size (1: no --tp)
    TpSumFn sum;     // the group's sum (size > 1)
    void* ctx;
} TensorParallel;

static const TensorParallel TP_NONE = {0, 1, NULL, NULL};

// the sum over a tensor-parallel group of processes (group: its Dist, from dist_grid): MPI's all-reduce,
// which gives every rank of the group the same bits (tests/test_dist_grid.c checks it)
static void tp_dist_sum(float* buf, size_t n, void* group) { dist_allreduce_floats_over(buf, n, *(const Dist*)group); }

// this rank in its tensor-parallel group (the group's Dist must outlive it)
static TensorParallel tp_of_group(const Dist* tensor) {
    TensorParallel tp = {tensor->rank, tensor->world, tp_dist_sum, (void*)tensor};
    return tp;
}

// hook: the partial results of a row-parallel matmul (forward), or the partial input gradients of a
// column-parallel one (backward), summed over the group
static void tp_sum(const TensorParallel* tp, float* buf, size_t n) {
    if (tp->size > 1) { tp->sum(buf, n, tp->ctx); }
}

// a row-parallel matmul's bias: rank 0 adds it, so that the sum holds it once
static const float* tp_row_bias(const TensorParallel* tp, const float* bias) { return tp->rank == 0 ? bias : NULL; }

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
// of the group makes the same calls. A read gathers each split tensor's layer from the group's ranks
// (an all-gather) and hands it on in the whole model's order; a write (the file or the seeded
// initialisation fills the whole layer) keeps this rank's slice of it. The tensors every rank holds
// whole go by as they are.

typedef void (*TpChunkFn)(void* ctx, size_t offset, float* chunk, size_t n);  // as trainer.h's ParamChunkFn

// floats of the staging a stream needs: a split tensor's layer, whole (fcw and fcprojw: 4C^2)
static size_t tp_staging_floats(const GPT2Config* c) { return 4 * (size_t)c->channels * c->channels; }

typedef struct {
    GPT2Config whole, rank;   // the model's shapes and this rank's (rank.tp: the group's size)
    Dist group;               // the tensor-parallel group
    ParamSlice* slices;       // the whole model's slices (which tensor each run is of)
    WeightRun *runs, *whole_runs;  // the rank's weights and the whole model's, run by run: the same runs in order
    int nruns, next;          // the runs, and the one the next chunk starts with
    int* counts;              // (group.world) every rank's floats of the run being gathered
    float* staging;           // (tp_staging_floats) a split tensor's layer, whole
    int write;                // 1: the caller fills the whole model and each rank keeps its slices
    TpChunkFn fn;             // the caller's, over the whole model
    void* ctx;
} TpStream;

static void tp_stream_begin(TpStream* t, const GPT2Config* rank, Dist group, float* staging, int write, TpChunkFn fn, void* ctx) {
    t->rank = *rank;
    t->whole = gpt2_rank_config(rank, 1);
    t->group = group;
    t->slices = param_slices_alloc(&t->whole);
    ParamSlice* rank_slices = param_slices_alloc(&t->rank);
    t->runs = (WeightRun*)malloc_check((size_t)(param_slice_count(rank) + 1) * sizeof(WeightRun));
    t->whole_runs = (WeightRun*)malloc_check((size_t)(param_slice_count(rank) + 1) * sizeof(WeightRun));
    t->nruns = weight_runs(&t->rank, rank_slices, t->runs);
    if (weight_runs(&t->whole, t->slices, t->whole_runs) != t->nruns) { fail("tp_stream_begin: the slices' runs differ from the model's (a bug)"); }
    free(rank_slices);
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
    free(t->whole_runs);
    free(t->counts);
}

// one run: mine (r.n floats) is this rank's part of the whole model's run w
static void tp_stream_run(TpStream* t, WeightRun r, WeightRun w, float* mine) {
    TpSplit split = r.slice < 0 ? TP_WHOLE : PARAMETER_TP_SPLIT[t->slices[r.slice].tensor];
    if (split == TP_WHOLE) { t->fn(t->ctx, w.offset, mine, r.n); return; }
    size_t rows, cols, N = (size_t)t->group.world, rank = (size_t)t->group.rank;
    gpt2_tensor_shape(t->slices[r.slice].tensor, &t->whole, &rows, &cols);
    if (rows * cols != w.n || w.n != N * r.n || w.n > tp_staging_floats(&t->whole)) { fail("tp_stream_run: a slice of %zu floats of a %zu x %zu tensor (a bug)", r.n, rows, cols); }
    if (t->write) {  // the whole layer from the caller, this rank's slice kept
        t->fn(t->ctx, w.offset, t->staging, w.n);
        tp_copy_slice(mine, t->staging, rows, cols, split, (int)rank, (int)N, 1);
        return;
    }
    for (size_t q = 0; q < N; q++) { t->counts[q] = (int)r.n; }
    memcpy(t->staging + rank * r.n, mine, r.n * sizeof(float));
    dist_allgather_floats(t->staging, t->counts, t->group);  // rank q's slice at q * r.n
    // handed on in the whole model's order: the rows of q in turn (within each of q, k and v), or each
    // row's columns of q in turn
    size_t parts = split == TP_COLUMNS ? rows : split == TP_ROWS_QKV ? 3 : 1, piece = r.n / parts, at = w.offset;
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
        WeightRun r = t->runs[t->next], w = t->whole_runs[t->next];
        tp_stream_run(t, r, w, chunk + done);
        done += r.n;
        t->next++;
    }
}

#endif // CPU_TENSOR_PARALLEL_H
