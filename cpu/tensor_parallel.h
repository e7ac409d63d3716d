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

    float* mine = malloc(tp_num_parameters(&cfg, n) * sizeof(float));
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
// the slices: how --tp cuts each parameter tensor (in model_config.h's order)

typedef enum {
    TP_WHOLE,     // every rank holds it all (embeddings, LayerNorms, the row-parallel biases)
    TP_ROWS,      // rank r holds rows r/N..(r+1)/N of each layer's (rows, cols): a column-parallel matrix, its bias
    TP_ROWS_QKV,  // the same within each of q, k and v (the rows of rank r's heads)
    TP_COLUMNS,   // rank r holds columns r/N..(r+1)/N of every row: a row-parallel matrix
} TpSplit;

static const TpSplit TP_SPLIT[NUM_PARAMETER_TENSORS] = {
    TP_WHOLE, TP_WHOLE, TP_WHOLE, TP_WHOLE,   // wte, wpe, ln1w, ln1b
    TP_ROWS_QKV, TP_ROWS_QKV,                 // qkvw (3C, C), qkvb (3C)
    TP_COLUMNS, TP_WHOLE, TP_WHOLE, TP_WHOLE, // attprojw (C, C), attprojb, ln2w, ln2b
    TP_ROWS, TP_ROWS,                         // fcw (4C, C), fcb (4C)
    TP_COLUMNS, TP_WHOLE, TP_WHOLE, TP_WHOLE, // fcprojw (C, 4C), fcprojb, lnfw, lnfb
};

// tensor i of one layer (or the outer tensors whole) as (rows, cols) in the whole model; vectors are
// (n, 1), so that a split by rows cuts them as it cuts their matrix
static void tp_tensor_shape(int i, const GPT2Config* c, size_t* rows, size_t* cols) {
    size_t C = c->channels;
    const size_t shape[NUM_PARAMETER_TENSORS][2] = {
        {(size_t)c->padded_vocab_size, C}, {(size_t)c->max_seq_len, C}, {C, 1}, {C, 1},  // wte, wpe, ln1w, ln1b
        {3 * C, C}, {3 * C, 1}, {C, C}, {C, 1}, {C, 1}, {C, 1},                           // qkvw, qkvb, attprojw, attprojb, ln2w, ln2b
        {4 * C, C}, {4 * C, 1}, {C, 4 * C}, {C, 1}, {C, 1}, {C, 1},                       // fcw, fcb, fcprojw, fcprojb, lnfw, lnfb
    };
    *rows = shape[i][0];
    *cols = shape[i][1];
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

// floats of tensor i on one rank of n (all layers)
static size_t tp_tensor_floats(int i, const GPT2Config* c, int n) {
    size_t rows, cols;
    tp_tensor_shape(i, c, &rows, &cols);
    size_t layers = PARAMETER_IS_PER_LAYER[i] ? (size_t)c->num_layers : 1;
    return layers * rows * cols / (TP_SPLIT[i] == TP_WHOLE ? 1 : (size_t)n);
}

static void tp_parameter_sizes(size_t sizes[NUM_PARAMETER_TENSORS], const GPT2Config* c, int n) {
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { sizes[i] = tp_tensor_floats(i, c, n); }
}

static size_t tp_num_parameters(const GPT2Config* c, int n) {
    size_t total = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { total += tp_tensor_floats(i, c, n); }
    return total;
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
    size_t whole_sizes[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(whole_sizes, c);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t rows, cols, layers = PARAMETER_IS_PER_LAYER[i] ? (size_t)c->num_layers : 1;
        tp_tensor_shape(i, c, &rows, &cols);
        size_t slice = tp_tensor_floats(i, c, n) / layers;
        for (size_t l = 0; l < layers; l++) {
            tp_copy_slice(mine + l * slice, whole + l * rows * cols, rows, cols, TP_SPLIT[i], rank, n, to_slice);
        }
        mine += tp_tensor_floats(i, c, n);
        whole += whole_sizes[i];
    }
}

static void tp_split_params(float* mine, const float* whole, const GPT2Config* c, int rank, int n) {
    tp_move_params(mine, (float*)whole, c, rank, n, 1);  // whole is only read
}
static void tp_join_params(float* whole, const float* mine, const GPT2Config* c, int rank, int n) {
    tp_move_params((float*)mine, whole, c, rank, n, 0);  // mine is only read
}

#endif // CPU_TENSOR_PARALLEL_H
