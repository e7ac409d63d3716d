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
too (tp_split_params, tp_join_params): a checkpoint is the whole model, whatever --tp wrote it.

    GPT2Config rc = tp_rank_config(&cfg, n);             // one rank's shapes
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
// shapes are those of its config, whose tp is the group's size: gpt2_tensor_shape)

// the config of one rank's slices of the model c split over n ranks
static GPT2Config tp_rank_config(const GPT2Config* c, int n) {
    GPT2Config r = *c;
    r.tp = n;
    return r;
}

// why the model cannot be split over n ranks, or NULL: every slice must be whole heads and channels
static const char* tp_refusal(const GPT2Config* c, int n) {
    static char why[160];
    if (n < 1) { snprintf(why, sizeof(why), "--tp %d: a group has at least 1 rank", n); return why; }
    if (c->num_heads % n != 0) {
        snprintf(why, sizeof(why), "--tp %d: the model's %d heads do not split over %d ranks (each takes whole heads)", n, c->num_heads, n);
        return why;
    }
    return NULL;  // NH | C, so C, 3C and 4C split too
}

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
    GPT2Config rc = tp_rank_config(c, n), wc = tp_rank_config(c, 1);
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

#endif // CPU_TENSOR_PARALLEL_H
