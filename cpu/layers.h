/*
layers.h: the GPT-2 layers on the CPU, fp32, each forward beside its backward.

This is the one CPU reference of every layer. train_gpt.c runs the model with it,
test_gpt.c checks it against PyTorch, and the CUDA tests compare their kernels
with it; nothing else in the project re-implements a layer.

Conventions (as in llm.c):
- B = batch, T = sequence length, C = channels, NH = heads, hs = C / NH,
  V = vocabulary size, Vp = V padded up to a multiple of 128 (rows of a (B,T,Vp)
  tensor past V are never read by softmax, loss or sampling).
- Every tensor is row-major; the comment before each function gives shapes.
- A forward writes (=) its output. A backward ACCUMULATES (+=) into the
  gradients of its inputs and parameters, so the caller zeroes them once per
  step (this is what makes gradient accumulation and the residual branches work).
  The exceptions are marked "writes".
- Each function's first line marks its range for --profile (llmc/profile.h): its kind,
  and the bytes and FLOPs it must move and do; when no profile is taken it is a branch.
- Every loop is parallel over an index that owns its output, never with atomics,
  so results are bitwise reproducible run to run.

    layernorm_forward(out, mean, rstd, x, w, b, B, T, C);
    layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, B, T, C);
*/
#ifndef CPU_LAYERS_H
#define CPU_LAYERS_H

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include "../llmc/model_config.h"  // LAYERNORM_EPS, GELU_SCALE, GELU_CUBIC: the model's, for every backend
#include "matmul.h"
#include "matmul_small.h"  // the attention's per-head products, one thread each
#include "gelu.h"      // one element of the GELU and its derivative
#include "vecmath.h"   // exp_vec: the softmaxes at memory speed
#include "layernorm_sums.h"  // LayerNorm's row sums, LN_ROWS rows side by side, each in llm.c's order
#include "../llmc/profile.h"  // --profile: each layer marks its range (one line, its first), a branch when off

// channels a thread owns in a parameter gradient summed over rows (LayerNorm's dw and db, the
// encoder's dwte and dwpe): a row's block is 256 contiguous bytes
#define CHANNEL_BLOCK 64


// ----------------------------------------------------------------------------
// encoder: token embedding + position embedding

// out (B,T,C) = wte[inp[b,t]] (Vp,C) + wpe[t] (maxT,C); inp (B,T) token ids
static void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe,
                            int B, int T, int C) {
    prof_mark(PROF_ENCODER, prof_encoder_forward((size_t)B * T, C, sizeof(float)), "forward");
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float* o = out + ((size_t)b * T + t) * C;
            const float* we = wte + (size_t)inp[b * T + t] * C;
            const float* pe = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) { o[c] = we[c] + pe[c]; }
        }
    }
}

// dwte += scatter of dout (B,T,C) by token, over the rows v0 .. v0 + rows - 1 of the vocabulary that
// dwte (rows, C) holds (the whole (Vp,C): v0 = 0, rows = Vp; --tp: a rank's rows, the other tokens'
// gradients are other ranks'); dwpe (maxT,C) += sum over b, of every token. Parallel over blocks of
// channels: each thread owns those columns of dwte and dwpe and adds the rows in (b, t) order, a row's
// block at a time (contiguous: it vectorizes; every element's sum in that order)
static void encoder_backward_rows(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C, int v0, int rows,
                                  const char* what) {
    prof_mark(PROF_ENCODER, prof_encoder_backward((size_t)B * T, T, C, sizeof(float)), what);
    #pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += CHANNEL_BLOCK) {
        int n = C - c0 < CHANNEL_BLOCK ? C - c0 : CHANNEL_BLOCK;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const float* d = dout + ((size_t)b * T + t) * C + c0;
                float* dpe = dwpe + (size_t)t * C + c0;
                int row = inp[b * T + t] - v0;
                for (int c = 0; c < n; c++) { dpe[c] += d[c]; }
                if (row < 0 || row >= rows) { continue; }
                float* dte = dwte + (size_t)row * C + c0;
                for (int c = 0; c < n; c++) { dte[c] += d[c]; }
            }
        }
    }
}

// dwte (Vp,C) += scatter of dout (B,T,C) by token; dwpe (maxT,C) += sum over b (every token id < Vp)
static void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C) {
    encoder_backward_rows(dwte, dwpe, dout, inp, B, T, C, 0, INT_MAX, "backward");
}

// ----------------------------------------------------------------------------
// layernorm

// out (B,T,C) = (x - mean) * rstd * w (C) + b (C); saves mean, rstd (B,T) for backward
static void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int B, int T, int C) {
    prof_mark(PROF_LAYERNORM, prof_layernorm_forward((size_t)B * T, C, sizeof(float)), "forward");
    int BT = B * T;
    #pragma omp parallel for
    for (int r0 = 0; r0 < BT; r0 += LN_ROWS) {
        const float* x[LN_ROWS];
        ln_row_group(x, inp, r0, BT, C);
        float m[LN_ROWS], v[LN_ROWS];
        ln_sum_rows(m, x, C);
        for (int r = 0; r < LN_ROWS; r++) { m[r] /= C; }
        ln_sum_squares(v, x, m, C);
        for (int r = 0; r < LN_ROWS && r0 + r < BT; r++) {
            float s = 1.0f / sqrtf(v[r] / C + LAYERNORM_EPS);
            float* o = out + (size_t)(r0 + r) * C;
            for (int c = 0; c < C; c++) { o[c] = (x[r][c] - m[r]) * s * weight[c] + bias[c]; }
            mean[r0 + r] = m[r];
            rstd[r0 + r] = s;
        }
    }
}

// dinp (B,T,C) +=, dweight (C) +=, dbias (C) += from dout (B,T,C). One pass over the rows: each row's two
// means (LN_ROWS rows side by side, cpu/layernorm_sums.h), its input gradient, and its terms of the
// parameter gradients added into its part's sums (a fixed partition of LN_PART_ROWS rows: a part is one
// thread's, its rows in order); then the parts' sums added in part order. So x and dout are read from
// memory once, and the result is the same for any thread count (llm.c adds a channel's rows in one chain;
// here a part's, then the parts: another order, the same sums to float rounding).
#define LN_PART_ROWS (4 * LN_ROWS)

// one row's input gradient dx (C) += and its terms of the parameter gradients dw, db (C) +=, from its x,
// dy (C), mean m, rstd s and the two means dm, dnm; the pointers restrict: six arrays that might overlap
// are more run-time checks than gcc makes before it vectorizes a loop
static inline void ln_row_grads(float* __restrict dx, float* __restrict dw, float* __restrict db, const float* __restrict x,
                                const float* __restrict dy, const float* __restrict w, float m, float s, float dm, float dnm, int C) {
    for (int c = 0; c < C; c++) {
        float norm = (x[c] - m) * s;
        float dnorm = w[c] * dy[c];
        dx[c] += (dnorm - dm - norm * dnm) * s;
        dw[c] += norm * dy[c];
        db[c] += dy[c];
    }
}
static void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int B, int T, int C) {
    prof_mark(PROF_LAYERNORM, prof_layernorm_backward((size_t)B * T, C, sizeof(float)), "backward");
    int BT = B * T, parts = (BT + LN_PART_ROWS - 1) / LN_PART_ROWS;
    float* part_sums = (float*)calloc((size_t)parts * 2 * C, sizeof(float));  // part p: its dweight (C), then its dbias (C)
    if (part_sums == NULL) { fail("layernorm_backward: out of memory for %d parts' sums", parts); }
    #pragma omp parallel for
    for (int p = 0; p < parts; p++) {
        float *dw = part_sums + (size_t)p * 2 * C, *db = dw + C;
        int end = (p + 1) * LN_PART_ROWS < BT ? (p + 1) * LN_PART_ROWS : BT;
        for (int r0 = p * LN_PART_ROWS; r0 < end; r0 += LN_ROWS) {
            const float *x[LN_ROWS], *dy[LN_ROWS];
            ln_row_group(x, inp, r0, BT, C);
            ln_row_group(dy, dout, r0, BT, C);
            float m[LN_ROWS], s[LN_ROWS];
            for (int r = 0; r < LN_ROWS; r++) { int bt = r0 + r < BT ? r0 + r : BT - 1; m[r] = mean[bt]; s[r] = rstd[bt]; }
            // the two means that the normalisation feeds back through
            float dnorm_mean[LN_ROWS], dnorm_norm_mean[LN_ROWS];
            ln_sums_backward(dnorm_mean, dnorm_norm_mean, x, dy, weight, m, s, C);
            for (int r = 0; r < LN_ROWS && r0 + r < end; r++) {
                ln_row_grads(dinp + (size_t)(r0 + r) * C, dw, db, x[r], dy[r], weight, m[r], s[r],
                             dnorm_mean[r] / C, dnorm_norm_mean[r] / C, C);
            }
        }
    }
    // the parts' sums, in part order: parallel over blocks of channels (a block's sums vectorize)
    #pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += CHANNEL_BLOCK) {
        int n = C - c0 < CHANNEL_BLOCK ? C - c0 : CHANNEL_BLOCK;
        float dw[CHANNEL_BLOCK] = {0.0f}, db[CHANNEL_BLOCK] = {0.0f};
        for (int p = 0; p < parts; p++) {
            const float* sums = part_sums + (size_t)p * 2 * C + c0;
            for (int c = 0; c < n; c++) { dw[c] += sums[c]; db[c] += sums[C + c]; }
        }
        for (int c = 0; c < n; c++) {
            dweight[c0 + c] += dw[c];
            if (dbias != NULL) { dbias[c0 + c] += db[c]; }
        }
    }
    free(part_sums);
}

// ----------------------------------------------------------------------------
// matmul (a linear layer): weights are (out, in) as in PyTorch and the checkpoint

// out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC); bias may be NULL
static void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                           int B, int T, int C, int OC) {
    int BT = B * T;
    prof_mark(PROF_MATMUL, prof_matmul_forward(BT, C, OC, sizeof(float)), PROF_MATMUL_FORWARD, (size_t)BT, C, OC);
    mm_sgemm(MM_N, MM_T, BT, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    if (bias == NULL) { return; }
    #pragma omp parallel for
    for (int bt = 0; bt < BT; bt++) {
        float* o = out + (size_t)bt * OC;
        for (int i = 0; i < OC; i++) { o[i] += bias[i]; }
    }
}

// dinp (B,T,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += sum of dout
// dinp may be NULL (nothing upstream needs it)
static void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, int B, int T, int C, int OC) {
    int BT = B * T;
    prof_mark(PROF_MATMUL, prof_matmul_backward(BT, C, OC, sizeof(float)), PROF_MATMUL_BACKWARD, (size_t)BT, C, OC);
    if (dinp != NULL) { mm_sgemm(MM_N, MM_N, BT, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C); }
    mm_sgemm(MM_T, MM_N, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias == NULL) { return; }
    #pragma omp parallel for
    for (int o = 0; o < OC; o++) {
        float s = 0.0f;
        for (int bt = 0; bt < BT; bt++) { s += dout[(size_t)bt * OC + o]; }
        dbias[o] += s;
    }
}

// ----------------------------------------------------------------------------
// a row's softmax: the attention's causal rows and the classifier's rows over the vocabulary

#define SOFTMAX_LANES 16   // a row's sum in this many running ones (element i in lane i % 16): the same on every machine

// the sum of the SOFTMAX_LANES lanes, pairwise: lane k + lane k + 8, then + 4, + 2, + 1 (a vector's halving
// tree, 4 adds deep where one after another is 15)
static float softmax_lane_sum(float lane[SOFTMAX_LANES]) {
    for (int w = SOFTMAX_LANES / 2; w >= 1; w /= 2) {
        for (int k = 0; k < w; k++) { lane[k] += lane[k + w]; }
    }
    return lane[0];
}

#if defined(__AVX512F__)
// AVX-512 reads and writes a row of len floats by whole vectors, masked only where one would cross len:
// a masked store makes the next load of its bytes wait for it to reach the cache (about 5x a plain one's
// cost, measured on the AMD EPYC of doc/benchmarks.md), and a row is written, then read back, pass by pass
static __mmask16 softmax_live(int left) { return left >= VEC16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1); }
static inline __m512 softmax_load(const float* x, int i, int len) {
    return i + VEC16 <= len ? _mm512_loadu_ps(x + i) : _mm512_maskz_loadu_ps(softmax_live(len - i), x + i);
}
static inline void softmax_store(float* p, int i, int len, __m512 v) {
    if (i + VEC16 <= len) { _mm512_storeu_ps(p + i, v); } else { _mm512_mask_storeu_ps(p + i, softmax_live(len - i), v); }
}
#endif

// exp(d) for d <= 0 as the softmaxes take it: exp_vec, 0 below EXP_VEC_MIN (where expf gives a denormal or 0)
static inline float softmax_exp(float d) { return d < EXP_VEC_MIN ? 0.0f : exp_vec(clamp_vec(d, EXP_VEC_MIN, 0.0f)); }

// the largest of x[0..n), 1 <= n <= len, in running maxima over vectors (any order gives the same max)
static float softmax_row_max(const float* x, int n, int len) {
#if defined(__AVX512F__)
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += VEC16) { m = _mm512_mask_max_ps(m, softmax_live(n - i), m, softmax_load(x, i, len)); }
    return _mm512_reduce_max_ps(m);
#else
    (void)len;
    float lane_max[SOFTMAX_LANES], maxv = -INFINITY;
    for (int k = 0; k < SOFTMAX_LANES; k++) { lane_max[k] = -INFINITY; }
    int i = 0;
    for (; i + SOFTMAX_LANES <= n; i += SOFTMAX_LANES) {
        for (int k = 0; k < SOFTMAX_LANES; k++) { lane_max[k] = x[i + k] > lane_max[k] ? x[i + k] : lane_max[k]; }
    }
    for (; i < n; i++) { maxv = x[i] > maxv ? x[i] : maxv; }
    for (int k = 0; k < SOFTMAX_LANES; k++) { maxv = lane_max[k] > maxv ? lane_max[k] : maxv; }
    return maxv;
#endif
}

// p[i] = exp(x[i] - maxv) for i < n: exp_vec where it is a normal float, 0 below (expf gives a denormal or 0
// there); returns their sum: lane[i % SOFTMAX_LANES] += p[i] in the order of i, then softmax_lane_sum. One
// pass (the row is read once, not twice): AVX-512 takes 16 lanes a step (the lanes past n written 0, up to
// len at most); AVX2 two vectors of 8, the elements past the last 16 one at a time (exp_vec16, exp_vec8:
// bitwise exp_vec, so every machine sums the same values in the same lanes). While it computes it asks for
// the cache lines of next (the row this thread takes next, or NULL), whose first pass, the max, would
// otherwise wait on memory.
static float softmax_exp_row(float* p, const float* x, float maxv, int n, int len, const float* next) {
    float lane[SOFTMAX_LANES] = {0.0f};
    int i = 0;
#if defined(__AVX512F__)
    __m512 m = _mm512_set1_ps(maxv), acc = _mm512_setzero_ps();
    for (; i < n; i += VEC16) {
        if (next != NULL) { _mm_prefetch((const char*)(next + i), _MM_HINT_T1); }  // 16 floats: one 64-byte line
        __m512 d = _mm512_sub_ps(softmax_load(x, i, len), m);
        // d < EXP_VEC_MIN ? 0 : exp: keep the live lanes not below (a NaN is kept, as the scalar test keeps it)
        __mmask16 keep = _mm512_mask_cmp_ps_mask(softmax_live(n - i), d, _mm512_set1_ps(EXP_VEC_MIN), _CMP_NLT_UQ);
        __m512 e = _mm512_maskz_mov_ps(keep, exp_vec16(clamp_vec16(d, EXP_VEC_MIN, 0.0f)));
        softmax_store(p, i, len, e);
        acc = _mm512_add_ps(acc, e);  // a dead lane adds +0: its sum (never -0) unchanged
    }
    _mm512_storeu_ps(lane, acc);
#elif defined(__AVX2__) && defined(__FMA__)
    (void)len;
    __m256 m = _mm256_set1_ps(maxv), lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (; i + SOFTMAX_LANES <= n; i += SOFTMAX_LANES) {
        if (next != NULL) { _mm_prefetch((const char*)(next + i), _MM_HINT_T1); }
        __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i), m), d1 = _mm256_sub_ps(_mm256_loadu_ps(x + i + VEC8), m);
        __m256 e0 = _mm256_and_ps(_mm256_cmp_ps(d0, _mm256_set1_ps(EXP_VEC_MIN), _CMP_NLT_UQ), exp_vec8(clamp_vec8(d0, EXP_VEC_MIN, 0.0f)));
        __m256 e1 = _mm256_and_ps(_mm256_cmp_ps(d1, _mm256_set1_ps(EXP_VEC_MIN), _CMP_NLT_UQ), exp_vec8(clamp_vec8(d1, EXP_VEC_MIN, 0.0f)));
        _mm256_storeu_ps(p + i, e0);
        _mm256_storeu_ps(p + i + VEC8, e1);
        lo = _mm256_add_ps(lo, e0);
        hi = _mm256_add_ps(hi, e1);
    }
    _mm256_storeu_ps(lane, lo);
    _mm256_storeu_ps(lane + VEC8, hi);
#else
    (void)len, (void)next;  // the prefetch is the vector loops'
#endif
    for (; i < n; i++) {
        p[i] = softmax_exp(x[i] - maxv);
        lane[i % SOFTMAX_LANES] += p[i];
    }
    return softmax_lane_sum(lane);
}

// p[i] *= inv for i < n (1 <= n <= len), p[i] = 0 for n <= i < len: a row's normalisation
static void softmax_row_scale(float* p, float inv, int n, int len) {
    int i = 0;
#if defined(__AVX512F__)
    __m512 s = _mm512_set1_ps(inv);
    for (; i < n; i += VEC16) { softmax_store(p, i, len, _mm512_mul_ps(s, softmax_load(p, i, len))); }  // past n: 0 times inv
    for (; i < len; i += VEC16) { softmax_store(p, i, len, _mm512_setzero_ps()); }
#endif
    for (; i < n; i++) { p[i] *= inv; }
    for (; i < len; i++) { p[i] = 0.0f; }
}

// p (len) writes the softmax of x's first n entries (1 <= n <= len), zero from n to len; p may equal x
static void softmax_row(float* p, const float* x, int n, int len, const float* next) {
    softmax_row_scale(p, 1.0f / softmax_exp_row(p, x, softmax_row_max(x, n, len), n, len, next), n, len);
}

// the sum over i < n (1 <= n <= len) of a[i] b[i], two rows of len floats (the softmax's backward: weights
// times their gradients): lane i % SOFTMAX_LANES takes fmaf(a[i], b[i], lane) in the order of i, then
// softmax_lane_sum; vectorized, the same on every machine (one chain of n adds would wait n adds' latency)
static float softmax_row_dot(const float* a, const float* b, int n, int len) {
    float lane[SOFTMAX_LANES] = {0.0f};
    int i = 0;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    for (; i < n; i += VEC16) { acc = _mm512_mask3_fmadd_ps(softmax_load(a, i, len), softmax_load(b, i, len), acc, softmax_live(n - i)); }
    _mm512_storeu_ps(lane, acc);
#elif defined(__AVX2__) && defined(__FMA__)
    (void)len;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (; i + SOFTMAX_LANES <= n; i += SOFTMAX_LANES) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + VEC8), _mm256_loadu_ps(b + i + VEC8), hi);
    }
    _mm256_storeu_ps(lane, lo);
    _mm256_storeu_ps(lane + VEC8, hi);
#else
    (void)len;
#endif
    for (; i < n; i++) { lane[i % SOFTMAX_LANES] = fmaf(a[i], b[i], lane[i % SOFTMAX_LANES]); }
    return softmax_lane_sum(lane);
}

// ----------------------------------------------------------------------------
// causal self-attention
//
// qkv (B,T,3C) holds q, k, v side by side, each split into NH heads of hs = C/NH; a head's rows are
// (T, hs) slices of it, row t at a stride of 3C. Each head is one thread's: its operands are first made
// contiguous (keys and values transposed or copied: rows 3C apart fall into few cache sets), then its
// T x T products (64 x 64 x 64 at d12's T=64) go through cpu/matmul_small.h SMM_ROWS rows at a time, so
// that a block of rows multiplies only the keys it sees (the causal triangle skipped but for a block's
// own corner, whose weights are zero), with fused multiply-adds, each sum in the order of its k.

#define ATT_HEAD_OPERANDS 4   // a head's scratch: up to 4 (T, hs) operands, packed, and its (T, T) scores' gradients
#define CACHE_LINE_FLOATS 16  // 64 bytes: a packed row starts on a cache line (a vector load across two costs two)

// a packed operand's row length: n floats rounded up to whole cache lines
static int attention_packed_ld(int n) { return (n + CACHE_LINE_FLOATS - 1) / CACHE_LINE_FLOATS * CACHE_LINE_FLOATS; }

// one thread's scratch for a head: ATT_HEAD_OPERANDS packed operands of attention_operand_floats, then the
// (T, T) gradients of its scores (backward), 64-byte aligned
static size_t attention_operand_floats(int T, int hs) {
    size_t a = (size_t)T * attention_packed_ld(hs), b = (size_t)hs * attention_packed_ld(T);  // (T, hs) or (hs, T)
    return a > b ? a : b;
}
static float* attention_scratch_alloc(int T, int hs) {
    size_t line = CACHE_LINE_FLOATS * sizeof(float), floats = ATT_HEAD_OPERANDS * attention_operand_floats(T, hs) + (size_t)T * T;
    size_t bytes = (floats * sizeof(float) + line - 1) / line * line;  // aligned_alloc takes whole multiples of the alignment
    float* p = (float*)aligned_alloc(line, bytes);
    if (p == NULL) { fail("attention: out of memory for a head's scratch (%zu bytes)", bytes); }
    return p;
}

// keys a block of rows scores: those it sees (0..seen-1) up to whole vectors of SOFTMAX_LANES, at most T
// (a score past its row's last key is computed, then zeroed by the softmax: whole vectors store plainly)
static int attention_keys_scored(int seen, int T) {
    int keys = (seen + SOFTMAX_LANES - 1) / SOFTMAX_LANES * SOFTMAX_LANES;
    return keys < T ? keys : T;
}

// att (B,NH,T,T) writes: row t is the softmax of preatt's positions 0..t, zero after t.
// att may equal preatt (in place).
static void causal_softmax_forward(float* att, const float* preatt, int B, int NH, int T) {
    #pragma omp parallel for
    for (size_t row = 0; row < (size_t)B * NH * T; row++) {
        softmax_row(att + row * T, preatt + row * T, (int)(row % T) + 1, T, NULL);
    }
}

// rows t0..t0+rows-1 (rows <= SMM_ROWS) of one head's scores a (T,T) (row t0 first) into their weights,
// in place, each as softmax_row does it: row t over keys 0..t. Step by step over the rows (every max, then
// every exponential, then every normalisation): each row's steps wait on one another, the rows' do not
static void attention_softmax_rows(float* a, int T, int t0, int rows) {
    float maxv[SMM_ROWS], sum[SMM_ROWS];
    for (int r = 0; r < rows; r++) { maxv[r] = softmax_row_max(a + (size_t)r * T, t0 + r + 1, T); }
    for (int r = 0; r < rows; r++) { sum[r] = softmax_exp_row(a + (size_t)r * T, a + (size_t)r * T, maxv[r], t0 + r + 1, T, NULL); }
    for (int r = 0; r < rows; r++) { softmax_row_scale(a + (size_t)r * T, 1.0f / sum[r], t0 + r + 1, T); }
}

// one head's weights att (T,T) from its q and k (rows at a stride of ld), and with out (T, hs) (rows at
// a stride of ldo; NULL: none) its output att v; scratch holds ATT_HEAD_OPERANDS (T, hs) operands
static void attention_head_forward(float* out, int ldo, float* att, const float* q, const float* k, const float* v,
                                   int ld, int T, int hs, float* scratch) {
    float scale = 1.0f / sqrtf((float)hs);
    size_t n = attention_operand_floats(T, hs);
    int ldh = attention_packed_ld(hs), ldt = attention_packed_ld(T);
    float *kt = scratch, *vp = scratch + n;  // k^T (hs, T) and v (T, hs), packed
    smm_transpose(kt, ldt, k, ld, T, hs);
    if (out != NULL) { smm_copy(vp, ldh, v, ld, T, hs); }
    for (int t0 = 0; t0 < T; t0 += SMM_ROWS) {
        int rows = T - t0 < SMM_ROWS ? T - t0 : SMM_ROWS, seen = t0 + rows;  // the block's rows see keys 0..seen-1
        float* a = att + (size_t)t0 * T;
        // the scores q.k / sqrt(hs), then each row's softmax in place
        smm(a, T, q + (size_t)t0 * ld, ld, 1, kt, ldt, rows, attention_keys_scored(seen, T), 0, hs, scale, SMM_WRITE);
        attention_softmax_rows(a, T, t0, rows);
        if (out != NULL) { smm(out + (size_t)t0 * ldo, ldo, a, T, 1, vp, ldh, rows, hs, 0, seen, 1.0f, SMM_WRITE); }
    }
}

// att (B,NH,T,T) writes the attention weights softmax(q k^T / sqrt(hs), causal), and out (B,T,C) (NULL:
// not) their weighted sums of the values, heads concatenated. Parallel over (b, h): a head owns its
// weights and its slice of out
static void attention_heads_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    int C3 = 3 * C, hs = C / NH;
    #pragma omp parallel
    {
        float* scratch = attention_scratch_alloc(T, hs);
        #pragma omp for
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            const float* q = qkv + (size_t)b * T * C3 + h * hs;
            float* o = out != NULL ? out + (size_t)b * T * C + h * hs : NULL;
            attention_head_forward(o, C, att + (size_t)bh * T * T, q, q + C, q + 2 * C, C3, T, hs, scratch);
        }
        free(scratch);
    }
}

// att (B,NH,T,T) writes the attention weights from qkv (B,T,3C) alone. On its own it is what
// selective recompute (--recompute attn) runs again in backward: the same function, the same bits
static void attention_weights_forward(float* att, const float* qkv, int B, int T, int C, int NH) {
    attention_heads_forward(NULL, att, qkv, B, T, C, NH);
}

// out (B,T,C) = att v, heads concatenated; att (B,NH,T,T) writes the attention weights,
// which backward needs
static void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    prof_mark(PROF_ATTENTION_FORWARD, prof_attention_weights(prof_attention_forward(B, T, C, sizeof(float)), B, NH, T, sizeof(float)), "matmul");
    attention_heads_forward(out, att, qkv, B, T, C, NH);
}

// one head's gradients dq, dk, dv = (rows at a stride of ldd: each written once, by one product, so the
// layer's dqkv need not be cleared first) from dout (T, hs) (stride ldy), its q, k,
// v (stride ld) and weights att (T,T); scratch as attention_scratch_alloc's (the (T, T) gradients of the
// scaled scores, ds, among it)
static void attention_head_backward(float* dq, float* dk, float* dv, int ldd, const float* dout, int ldy,
                                    const float* q, const float* k, const float* v, int ld, const float* att,
                                    int T, int hs, float* scratch) {
    float scale = 1.0f / sqrtf((float)hs);
    size_t n = attention_operand_floats(T, hs);
    int ldh = attention_packed_ld(hs), ldt = attention_packed_ld(T);
    float *vt = scratch, *kp = scratch + n, *qp = scratch + 2 * n, *dy = scratch + 3 * n;  // v^T (hs, T); k, q, dout (T, hs): packed
    float* ds = scratch + ATT_HEAD_OPERANDS * n;                                            // (T, T)
    smm_transpose(vt, ldt, v, ld, T, hs);
    smm_copy(kp, ldh, k, ld, T, hs);
    smm_copy(qp, ldh, q, ld, T, hs);
    smm_copy(dy, ldh, dout, ldy, T, hs);
    for (int t0 = 0; t0 < T; t0 += SMM_ROWS) {
        int rows = T - t0 < SMM_ROWS ? T - t0 : SMM_ROWS, seen = t0 + rows;
        float* g = ds + (size_t)t0 * T;
        // through the weighted sum of values: datt = dout v^T
        smm(g, T, dy + (size_t)t0 * ldh, ldh, 1, vt, ldt, rows, attention_keys_scored(seen, T), 0, hs, 1.0f, SMM_WRITE);
        // through the softmax and the scale: ds[u] = att[u] (datt[u] - sum_j att[j] datt[j]) / sqrt(hs), u <= t; 0 after t
        for (int r = 0; r < rows; r++) {
            const float* a = att + (size_t)(t0 + r) * T;
            float* gr = g + (size_t)r * T;
            int n_t = t0 + r + 1;
            float dot = softmax_row_dot(a, gr, n_t, T);
            for (int u = 0; u < n_t; u++) { gr[u] = a[u] * (gr[u] - dot) * scale; }
            for (int u = n_t; u < T; u++) { gr[u] = 0.0f; }
        }
        // through the scores: dq = ds k
        smm(dq + (size_t)t0 * ldd, ldd, g, T, 1, kp, ldh, rows, hs, 0, seen, 1.0f, SMM_WRITE);
    }
    // dv = att^T dout and dk = ds^T q: position u's rows from the rows t >= u (att and ds are zero above)
    for (int u0 = 0; u0 < T; u0 += SMM_ROWS) {
        int rows = T - u0 < SMM_ROWS ? T - u0 : SMM_ROWS;
        smm(dv + (size_t)u0 * ldd, ldd, att + u0, 1, T, dy, ldh, rows, hs, u0, T, 1.0f, SMM_WRITE);
        smm(dk + (size_t)u0 * ldd, ldd, ds + u0, 1, T, qp, ldh, rows, hs, u0, T, 1.0f, SMM_WRITE);
    }
}

// dqkv (B,T,3C) = from dout (B,T,C): written, not added to (the layer is its one contributor), so the
// backward clears no scratch for it (cuda/attention.cuh's adds: dev/cuda/test_attention.cu adds this onto its values). datt (B,NH,T,T), the scratch the layer's signature names (the CUDA
// launcher's too), is not touched: a head's score gradients stay in its thread's scratch, in the cache.
// Parallel over (b, h): a head owns its slices of dq, dk, dv.
static void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                               const float* att, int B, int T, int C, int NH) {
    prof_mark(PROF_ATTENTION_BACKWARD, prof_attention_weights(prof_attention_backward(B, T, C, sizeof(float)), B, NH, T, sizeof(float)),
              "matmul");
    (void)datt;
    int C3 = 3 * C, hs = C / NH;
    #pragma omp parallel
    {
        float* scratch = attention_scratch_alloc(T, hs);
        #pragma omp for
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            size_t head = (size_t)b * T * C3 + h * hs;
            const float* q = qkv + head;
            float* dq = dqkv + head;
            attention_head_backward(dq, dq + C, dq + 2 * C, C3, dout + (size_t)b * T * C + h * hs, C,
                                    q, q + C, q + 2 * C, C3, att + (size_t)bh * T * T, T, hs, scratch);
        }
        free(scratch);
    }
}

// Flash attention (--attention flash): the same attention without the (B,NH,T,T) weights.
// Forward keeps each row's log-sum-exp of its scaled scores s_u = q.k_u / sqrt(hs), u <= t:
// lse = m + log(sum_u exp(s_u - m)), m their maximum, so that a weight is exp(s_u - lse).
// Backward recomputes a row's weights from q, k and lse, and gets the softmax's gradient from
// D = dout . out (= sum_u p_u (dout . v_u)) instead of a stored row of datt. The GPU kernels
// (cuda/flash_attention.cuh) run the same mathematics block by block; this is their reference.

// out (B,T,C) = softmax(q k^T / sqrt(hs), causal) v, heads concatenated; lse (B,NH,T) the
// rows' log-sum-exp. One row at a time in a buffer of T scores per (b, h).
static void attention_flash_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    prof_mark(PROF_ATTENTION_FORWARD, prof_attention_forward(B, T, C, sizeof(float)), "flash");
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float* s = (float*)malloc_check((size_t)T * sizeof(float));
            for (int t = 0; t < T; t++) {
                const float* q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float m = -INFINITY, sum = 0.0f;
                for (int u = 0; u <= t; u++) {
                    const float* k = qkv + ((size_t)b * T + u) * C3 + C + h * hs;
                    float d = 0.0f;
                    for (int i = 0; i < hs; i++) { d += q[i] * k[i]; }
                    s[u] = d * scale;
                    if (s[u] > m) { m = s[u]; }
                }
                for (int u = 0; u <= t; u++) { sum += softmax_exp(s[u] - m); }
                float row_lse = m + logf(sum);
                lse[((size_t)b * NH + h) * T + t] = row_lse;
                float* o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) { o[i] = 0.0f; }
                for (int u = 0; u <= t; u++) {
                    const float* v = qkv + ((size_t)b * T + u) * C3 + 2 * C + h * hs;
                    float p = softmax_exp(s[u] - row_lse);
                    for (int i = 0; i < hs; i++) { o[i] += p * v[i]; }
                }
            }
            free(s);
        }
    }
}

// dqkv (B,T,3C) += from dout (B,T,C), given qkv, the forward's out (B,T,C) and lse (B,NH,T).
// Parallel over (b, h): a head owns its slices of dq, dk, dv.
static void attention_flash_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                     const float* lse, int B, int T, int C, int NH) {
    prof_mark(PROF_ATTENTION_BACKWARD, prof_attention_backward(B, T, C, sizeof(float)), "flash");
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float* q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                const float* dy = dout + ((size_t)b * T + t) * C + h * hs;
                const float* y = out + ((size_t)b * T + t) * C + h * hs;
                float* dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;
                float row_lse = lse[((size_t)b * NH + h) * T + t], D = 0.0f;
                for (int i = 0; i < hs; i++) { D += dy[i] * y[i]; }
                for (int u = 0; u <= t; u++) {
                    const float* k = qkv + ((size_t)b * T + u) * C3 + C + h * hs;
                    const float* v = qkv + ((size_t)b * T + u) * C3 + 2 * C + h * hs;
                    float* dk = dqkv + ((size_t)b * T + u) * C3 + C + h * hs;
                    float* dv = dqkv + ((size_t)b * T + u) * C3 + 2 * C + h * hs;
                    float sc = 0.0f, dp = 0.0f;
                    for (int i = 0; i < hs; i++) { sc += q[i] * k[i]; dp += dy[i] * v[i]; }
                    float p = softmax_exp(sc * scale - row_lse);
                    float g = p * (dp - D) * scale;  // the gradient of the score q.k_u
                    for (int i = 0; i < hs; i++) { dv[i] += p * dy[i]; dq[i] += g * k[i]; dk[i] += g * q[i]; }
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = GELU_SCALE (x + GELU_CUBIC x^3), computed by
// cpu/gelu.h (x sigmoid(2u), an exp in plain arithmetic, 8 elements a step with AVX2). Each thread owns
// whole blocks of GELU_BLOCK elements (static schedule: one contiguous range a thread)

#define GELU_BLOCK 4096   // elements a loop iteration hands gelu_span: whole vectors, 16 KB of input

// out (N) = gelu(inp (N))
static void gelu_forward(float* out, const float* inp, size_t N) {
    prof_mark(PROF_GELU, prof_gelu_forward(N, sizeof(float)), "forward");
    #pragma omp parallel for
    for (size_t i0 = 0; i0 < N; i0 += GELU_BLOCK) { gelu_span(out + i0, inp + i0, N - i0 < GELU_BLOCK ? N - i0 : GELU_BLOCK); }
}

// dinp (N) += gelu'(inp) * dout; dinp and dout must be distinct buffers
static void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
    prof_mark(PROF_GELU, prof_gelu_backward(N, sizeof(float)), "backward");
    #pragma omp parallel for
    for (size_t i0 = 0; i0 < N; i0 += GELU_BLOCK) {
        gelu_grad_span(dinp + i0, inp + i0, dout + i0, N - i0 < GELU_BLOCK ? N - i0 : GELU_BLOCK);
    }
}

// ----------------------------------------------------------------------------
// zeroing: the buffers a backward adds (+=) into, and the gradients before a step

#define ZERO_CHUNK_FLOATS ((size_t)1 << 16)   // a thread's piece of a zeroing: 256 KB, whole cache lines

// buf (n) = 0 over the threads, a range of --profile's of its own (one thread's memset reaches about half
// the machine's write bandwidth; a backward's scratch is 10 MB a d12 layer)
static void zero_floats(float* buf, size_t n, const char* what) {
    prof_mark(PROF_ZEROING, prof_bytes((double)n * sizeof(float)), "%s", what);
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += ZERO_CHUNK_FLOATS) { memset(buf + i, 0, (n - i < ZERO_CHUNK_FLOATS ? n - i : ZERO_CHUNK_FLOATS) * sizeof(float)); }
}

// ----------------------------------------------------------------------------
// residual connection

// out (N) = a (N) + b (N)
static void residual_forward(float* out, const float* a, const float* b, size_t N) {
    prof_mark(PROF_RESIDUAL, prof_residual_forward(N, sizeof(float)), "forward");
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) { out[i] = a[i] + b[i]; }
}

// ----------------------------------------------------------------------------
// softmax and cross-entropy over the (unpadded) vocabulary

// probs (B,T,Vp) writes softmax over the first V entries of logits (B,T,Vp), zero after V.
// probs may equal logits (in place). Each pass over the row vectorizes (softmax_row, above).
static void softmax_forward(float* probs, const float* logits, int B, int T, int V, int Vp) {
    prof_mark(PROF_CLASSIFIER, prof_classifier((size_t)B * T, V, Vp, sizeof(float)), "forward (softmax, cross-entropy)");  // crossentropy_forward too
    #pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        const float* x = logits + (size_t)bt * Vp;
        const float* next = bt + 1 < B * T ? x + Vp : NULL;  // the row this thread most likely takes next
        softmax_row(probs + (size_t)bt * Vp, x, V, Vp, next);
    }
}

// losses (B,T) writes -log probs[target]; targets (B,T)
static void crossentropy_forward(float* losses, const float* probs, const int* targets,
                                 int B, int T, int Vp) {
    for (int bt = 0; bt < B * T; bt++) {
        losses[bt] = -logf(probs[(size_t)bt * Vp + targets[bt]]);
    }
}

// dlogits (B,T,Vp) writes (probs - onehot(target)) * dloss, zero past V.
// dloss is d(total loss)/d(each position's loss), e.g. 1/(B*T) for a mean.
// dlogits may equal probs (in place).
static void crossentropy_softmax_backward(float* dlogits, const float* probs, const int* targets,
                                          float dloss, int B, int T, int V, int Vp) {
    prof_mark(PROF_CLASSIFIER, prof_classifier((size_t)B * T, V, Vp, sizeof(float)), "backward");
    #pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        const float* p = probs + (size_t)bt * Vp;
        float* d = dlogits + (size_t)bt * Vp;
        int target = targets[bt];
        for (int i = 0; i < V; i++) { d[i] = (p[i] - (i == target ? 1.0f : 0.0f)) * dloss; }
        for (int i = V; i < Vp; i++) { d[i] = 0.0f; }
    }
}

#endif // CPU_LAYERS_H
