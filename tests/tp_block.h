/*
tp_block.h: one transformer block of --tp's split (cpu/tensor_parallel.h) as a test runs it: a rank's
slices of a random whole model, its activations and backward buffers, a forward and a backward, and
the distance of its results from the whole block's. Shared by test_gpt.c (ranks as the threads of an
OpenMP team) and tests/test_dist_grid.c (ranks as MPI processes). Include it after train_gpt.c.
*/
#ifndef TESTS_TP_BLOCK_H
#define TESTS_TP_BLOCK_H

#include <math.h>

#define TP_B 2
#define TP_T 8
#define TP_RTOL 1e-5
static const GPT2Config TP_MODEL = {.max_seq_len = TP_T, .vocab_size = 64, .padded_vocab_size = 128, .num_layers = 1,
                                    .num_heads = 4, .channels = 32};

// one rank's block: its activations, backward buffers, slices and their gradients
typedef struct {
    LayerActs a;
    BackwardBuffers bwd;
    float *params, *grads, *acts, *bufs;
} TpBlock;

static void tp_block_alloc(TpBlock* b, const float* whole, int rank, int n, int flash) {
    const GPT2Config* c = &TP_MODEL;
    GPT2Config rc = gpt2_rank_config(c, n);
    size_t BT = (size_t)TP_B * TP_T, C = c->channels, Ct = C / n, NHt = c->num_heads / n, P = gpt2_num_parameters(&rc);
    b->params = (float*)malloc_check(P * sizeof(float));
    b->grads = (float*)calloc(P, sizeof(float));
    tp_split_params(b->params, whole, c, rank, n);
    size_t sizes[] = {BT * C, BT, BT, BT * 3 * Ct, BT * Ct, TP_B * NHt * TP_T * TP_T, TP_B * NHt * TP_T, BT * C, BT * C, BT, BT,
                      BT * 4 * Ct, BT * 4 * Ct, BT * C};
    float** ptrs[] = {&b->a.ln1, &b->a.ln1_mean, &b->a.ln1_rstd, &b->a.qkv, &b->a.atty, &b->a.att, &b->a.lse, &b->a.residual2,
                      &b->a.ln2, &b->a.ln2_mean, &b->a.ln2_rstd, &b->a.fch, &b->a.fch_gelu, &b->a.residual3};
    size_t total = 0, k = sizeof(sizes) / sizeof(sizes[0]);
    for (size_t i = 0; i < k; i++) { total += sizes[i]; }
    float* p = b->acts = (float*)calloc(total, sizeof(float));
    for (size_t i = 0; i < k; i++) { *ptrs[i] = p; p += sizes[i]; }
    if (flash) { b->a.att = NULL; } else { b->a.lse = NULL; }
    size_t bsizes[] = {BT * C, BT * C, BT * 3 * Ct, BT * 4 * Ct, BT * 4 * Ct, TP_B * NHt * TP_T * TP_T};
    float** bptrs[] = {&b->bwd.dresidual, &b->bwd.dbtc, &b->bwd.dqkv, &b->bwd.dfch_gelu, &b->bwd.dfch, &b->bwd.datt};
    total = 0;
    for (size_t i = 0; i < 6; i++) { total += bsizes[i]; }
    p = b->bufs = (float*)calloc(total, sizeof(float));
    for (size_t i = 0; i < 6; i++) { *bptrs[i] = p; p += bsizes[i]; }
}

// the block forward from x, then backward from dy (into bwd.dresidual: d(x) on return), as rank tp.rank of tp.size
static void tp_block_run(TpBlock* b, const float* x, const float* dy, const ActPolicy* pol, TensorParallel tp) {
    const GPT2Config* c = &TP_MODEL;
    GPT2Config rc = gpt2_rank_config(c, tp.size);
    ParameterTensors pt, gt;
    point_parameters(&pt, b->params, &rc);
    point_parameters(&gt, b->grads, &rc);
    LayerParams lp = layer_params(&pt, 0, &rc);
    LayerGrads lg = layer_grads(&gt, 0, &rc);
    block_forward(&b->a, x, &lp, TP_B, TP_T, c->channels, c->num_heads, pol, &tp);
    memcpy(b->bwd.dresidual, dy, (size_t)TP_B * TP_T * c->channels * sizeof(float));
    block_backward(&b->bwd, &b->a, x, &lp, &lg, TP_B, TP_T, c->channels, c->num_heads, pol, &tp);
}

static void tp_block_free(TpBlock* b) { free(b->params); free(b->grads); free(b->acts); free(b->bufs); }

// the whole model (random, its biases and LayerNorms too: not 0 or 1), the block's input x and d(output) dy
static void tp_test_inputs(float* whole, float* x, float* dy) {
    size_t P = gpt2_num_parameters(&TP_MODEL), BTC = (size_t)TP_B * TP_T * TP_MODEL.channels;
    uint64_t rng = 36;
    for (size_t i = 0; i < P; i++) { whole[i] = 0.2f * rand_uniform(&rng) - 0.1f; }
    for (size_t i = 0; i < BTC; i++) { x[i] = 2.0f * rand_uniform(&rng) - 1.0f; dy[i] = rand_uniform(&rng) - 0.5f; }
}

static double tp_rel_dist(const float* a, const float* b, size_t n) {
    double d = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) { d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]); m += (double)b[i] * b[i]; }
    return m > 0.0 ? sqrt(d / m) : sqrt(d);
}

// the largest relative distance of a rank's gradient slices from the same slices of the whole block's
// gradients (plain_grads), over the block's tensors (the embeddings and lnf have none here); *worst_at: which
static double tp_block_grad_dist(const TpBlock* b, const float* plain_grads, int rank, int n, int* worst_at) {
    const GPT2Config* c = &TP_MODEL;
    GPT2Config rc = gpt2_rank_config(c, n);
    size_t sizes[NUM_PARAMETER_TENSORS], off = 0;
    gpt2_parameter_sizes(sizes, &rc);
    float* want = (float*)malloc_check(gpt2_num_parameters(&rc) * sizeof(float));
    tp_split_params(want, plain_grads, c, rank, n);
    double worst = 0.0;
    *worst_at = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        double d = PARAMETER_IS_PER_LAYER[i] ? tp_rel_dist(b->grads + off, want + off, sizes[i]) : 0.0;
        if (d > worst) { worst = d; *worst_at = i; }
        off += sizes[i];
    }
    free(want);
    return worst;
}

// a hash of what every rank of the group must hold alike: the block's output, d(input), and the
// gradients of the tensors it holds whole
static uint64_t tp_block_shared_hash(const TpBlock* b, int n) {
    const GPT2Config* c = &TP_MODEL;
    size_t BTC = (size_t)TP_B * TP_T * c->channels, sizes[NUM_PARAMETER_TENSORS], off = 0;
    uint64_t h = params_hash_more(FNV64_OFFSET, b->a.residual3, BTC);
    h = params_hash_more(h, b->bwd.dresidual, BTC);
    GPT2Config rc = gpt2_rank_config(c, n);
    gpt2_parameter_sizes(sizes, &rc);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (PARAMETER_TP_SPLIT[i] == TP_WHOLE) { h = params_hash_more(h, b->grads + off, sizes[i]); }
        off += sizes[i];
    }
    return h;
}

#endif // TESTS_TP_BLOCK_H
