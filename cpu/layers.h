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

#include <math.h>
#include <stddef.h>
#include "../llmc/model_config.h"  // LAYERNORM_EPS, GELU_SCALE, GELU_CUBIC: the model's, for every backend
#include "matmul.h"
#include "gelu.h"      // one element of the GELU and its derivative
#include "vecmath.h"   // exp_vec: the softmax at memory speed
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

// dwte (Vp,C) += scatter of dout (B,T,C) by token; dwpe (maxT,C) += sum over b
// parallel over blocks of channels: each thread owns those columns of dwte and dwpe and adds the rows
// in (b, t) order, a row's block at a time (contiguous: it vectorizes; every element's sum in that order)
static void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp,
                             int B, int T, int C) {
    prof_mark(PROF_ENCODER, prof_encoder_backward((size_t)B * T, T, C, sizeof(float)), "backward");
    #pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += CHANNEL_BLOCK) {
        int n = C - c0 < CHANNEL_BLOCK ? C - c0 : CHANNEL_BLOCK;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const float* d = dout + ((size_t)b * T + t) * C + c0;
                float* dte = dwte + (size_t)inp[b * T + t] * C + c0;
                float* dpe = dwpe + (size_t)t * C + c0;
                for (int c = 0; c < n; c++) { dte[c] += d[c]; dpe[c] += d[c]; }
            }
        }
    }
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

// dinp (B,T,C) +=, dweight (C) +=, dbias (C) += from dout (B,T,C)
static void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int B, int T, int C) {
    prof_mark(PROF_LAYERNORM, prof_layernorm_backward((size_t)B * T, C, sizeof(float)), "backward");
    int BT = B * T;
    // input gradient: rows are independent (LN_ROWS of them side by side, cpu/layernorm_sums.h)
    #pragma omp parallel for
    for (int r0 = 0; r0 < BT; r0 += LN_ROWS) {
        const float *x[LN_ROWS], *dy[LN_ROWS];
        ln_row_group(x, inp, r0, BT, C);
        ln_row_group(dy, dout, r0, BT, C);
        float m[LN_ROWS], s[LN_ROWS];
        for (int r = 0; r < LN_ROWS; r++) { int bt = r0 + r < BT ? r0 + r : BT - 1; m[r] = mean[bt]; s[r] = rstd[bt]; }
        // the two means that the normalisation feeds back through
        float dnorm_mean[LN_ROWS], dnorm_norm_mean[LN_ROWS];
        ln_sums_backward(dnorm_mean, dnorm_norm_mean, x, dy, weight, m, s, C);
        for (int r = 0; r < LN_ROWS && r0 + r < BT; r++) {
            float* dx = dinp + (size_t)(r0 + r) * C;
            float dm = dnorm_mean[r] / C, dnm = dnorm_norm_mean[r] / C;
            for (int c = 0; c < C; c++) {
                float norm = (x[r][c] - m[r]) * s[r];
                float dnorm = weight[c] * dy[r][c];
                dx[c] += (dnorm - dm - norm * dnm) * s[r];
            }
        }
    }
    // parameter gradients: each thread owns a block of channels and sums over the rows in order,
    // a row's block at a time (contiguous: it vectorizes; each channel's sum is in the same order)
    #pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += CHANNEL_BLOCK) {
        int n = C - c0 < CHANNEL_BLOCK ? C - c0 : CHANNEL_BLOCK;
        float dw[CHANNEL_BLOCK] = {0.0f}, db[CHANNEL_BLOCK] = {0.0f};
        for (int bt = 0; bt < B * T; bt++) {
            const float* x = inp + (size_t)bt * C + c0;
            const float* dy = dout + (size_t)bt * C + c0;
            float m = mean[bt], s = rstd[bt];
            for (int c = 0; c < n; c++) {
                dw[c] += (x[c] - m) * s * dy[c];
                db[c] += dy[c];
            }
        }
        for (int c = 0; c < n; c++) {
            dweight[c0 + c] += dw[c];
            if (dbias != NULL) { dbias[c0 + c] += db[c]; }
        }
    }
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
// causal self-attention

// att (B,NH,T,T) writes: row t is the softmax of preatt's positions 0..t, zero after t.
// att may equal preatt (in place).
static void causal_softmax_forward(float* att, const float* preatt, int B, int NH, int T) {
    #pragma omp parallel for
    for (size_t row = 0; row < (size_t)B * NH * T; row++) {
        int t = (int)(row % T);
        const float* p = preatt + row * T;
        float* a = att + row * T;
        float maxv = -INFINITY;
        for (int u = 0; u <= t; u++) { if (p[u] > maxv) { maxv = p[u]; } }
        float sum = 0.0f;
        for (int u = 0; u <= t; u++) { a[u] = expf(p[u] - maxv); sum += a[u]; }
        float inv = 1.0f / sum;
        for (int u = 0; u <= t; u++) { a[u] *= inv; }
        for (int u = t + 1; u < T; u++) { a[u] = 0.0f; }
    }
}

// A head's dot products s_u = sum_i x_i y_u[i] with each of its keys (or values) y_u run on the
// keys transposed, yt[i*Tp + u] = y_u[i]: step i adds x_i yt[i*Tp + u] to ATT_KEYS running sums at
// once (a vector over u, held in registers), in the order of i, so every s_u is bitwise the
// one-key-at-a-time sum: vectorized without changing a bit.
#define ATT_KEYS 16   // keys a step takes: two AVX2 vectors, one AVX-512 vector
static int attention_padded_T(int T) { return (T + ATT_KEYS - 1) / ATT_KEYS * ATT_KEYS; }

typedef enum { QKV_QUERY = 0, QKV_KEY = 1, QKV_VALUE = 2 } QkvPart;  // the thirds of a qkv row, in order

// returns (hs, Tp) (free it): head h's keys or values (part) of sequence b in qkv (B,T,3C),
// transposed; the Tp - T columns past the last position are zero
static float* attention_head_transposed(const float* qkv, int b, int h, QkvPart part, int T, int C, int NH) {
    int C3 = 3 * C, hs = C / NH, Tp = attention_padded_T(T);
    float* yt = (float*)malloc_check((size_t)hs * Tp * sizeof(float));
    for (int u = 0; u < T; u++) {
        const float* y = qkv + ((size_t)b * T + u) * C3 + part * C + h * hs;
        for (int i = 0; i < hs; i++) { yt[(size_t)i * Tp + u] = y[i]; }
    }
    for (int i = 0; i < hs; i++) {
        for (int u = T; u < Tp; u++) { yt[(size_t)i * Tp + u] = 0.0f; }
    }
    return yt;
}

// s (n) writes s[u] = sum_i x[i] yt[i*Tp + u] for u < n <= Tp, each sum in the order of i
static void attention_dots(float* s, const float* x, const float* yt, int n, int Tp, int hs) {
    for (int u0 = 0; u0 < n; u0 += ATT_KEYS) {
        float acc[ATT_KEYS] = {0.0f};
        for (int i = 0; i < hs; i++) {
            const float* y = yt + (size_t)i * Tp + u0;
            float xi = x[i];
            #pragma omp simd
            for (int k = 0; k < ATT_KEYS; k++) { acc[k] += xi * y[k]; }
        }
        for (int k = 0; k < ATT_KEYS && u0 + k < n; k++) { s[u0 + k] = acc[k]; }
    }
}

// o (hs) += sum_u a[u] v[u*ldv + i] over u < n, each term added in the order of u as one
// o[i] += a[u] v[u][i] at a time would: ATT_KEYS outputs at a time keep their running sums in
// registers over all of u (the last hs % ATT_KEYS one at a time)
static void attention_weighted_sum(float* o, const float* a, const float* v, int n, int ldv, int hs) {
    int i0 = 0;
    for (; i0 + ATT_KEYS <= hs; i0 += ATT_KEYS) {
        float acc[ATT_KEYS];
        for (int k = 0; k < ATT_KEYS; k++) { acc[k] = o[i0 + k]; }
        for (int u = 0; u < n; u++) {
            const float* vu = v + (size_t)u * ldv + i0;
            float au = a[u];
            #pragma omp simd
            for (int k = 0; k < ATT_KEYS; k++) { acc[k] += au * vu[k]; }
        }
        for (int k = 0; k < ATT_KEYS; k++) { o[i0 + k] = acc[k]; }
    }
    for (; i0 < hs; i0++) {
        float sum = o[i0];
        for (int u = 0; u < n; u++) { sum += a[u] * v[(size_t)u * ldv + i0]; }
        o[i0] = sum;
    }
}

// qkv (B,T,3C) holds q, k, v side by side, each split into NH heads of hs = C/NH.
// att (B,NH,T,T) writes the attention weights softmax(q k^T / sqrt(hs), causal). On its
// own it is what selective recompute (--recompute attn) runs again in backward.
static void attention_weights_forward(float* att, const float* qkv, int B, int T, int C, int NH) {
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    // scores into att (as the pre-softmax preatt), then softmax in place; parallel over (b, h):
    // a head's keys are transposed once for all its rows
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float* kt = attention_head_transposed(qkv, b, h, QKV_KEY, T, C, NH);
            for (int t = 0; t < T; t++) {
                const float* q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float* a = att + (((size_t)b * NH + h) * T + t) * T;
                attention_dots(a, q, kt, t + 1, attention_padded_T(T), hs);
                for (int u = 0; u <= t; u++) { a[u] *= scale; }
            }
            free(kt);
        }
    }
    causal_softmax_forward(att, att, B, NH, T);
}

// out (B,T,C) = att v, heads concatenated; att (B,NH,T,T) writes the attention weights,
// which backward needs
static void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    prof_mark(PROF_ATTENTION_FORWARD, prof_attention_forward(B, T, C, sizeof(float)), "matmul");
    int C3 = 3 * C, hs = C / NH;
    attention_weights_forward(att, qkv, B, T, C, NH);
    // parallel over rows: a row owns its head's slice of out
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float* a = att + (((size_t)b * NH + h) * T + t) * T;
                const float* v = qkv + (size_t)b * T * C3 + 2 * C + h * hs;  // position u's values at v + u * C3
                float* o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) { o[i] = 0.0f; }
                attention_weighted_sum(o, a, v, t + 1, C3, hs);
            }
        }
    }
}

// dqkv (B,T,3C) += from dout (B,T,C); datt (B,NH,T,T) is scratch (written, then overwritten
// in place by the gradient of the pre-softmax scores). Parallel over (b, h): a head owns its
// slices of dq, dk, dv.
static void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                               const float* att, int B, int T, int C, int NH) {
    prof_mark(PROF_ATTENTION_BACKWARD, prof_attention_backward(B, T, C, sizeof(float)), "matmul");
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float* vt = attention_head_transposed(qkv, b, h, QKV_VALUE, T, C, NH);
            float* g = (float*)malloc_check((size_t)T * sizeof(float));
            for (int t = 0; t < T; t++) {
                const float* a = att + (((size_t)b * NH + h) * T + t) * T;
                float* da = datt + (((size_t)b * NH + h) * T + t) * T;
                const float* dy = dout + ((size_t)b * T + t) * C + h * hs;
                // through the weighted sum of values: datt = dy . v, dv += att * dy
                attention_dots(da, dy, vt, t + 1, attention_padded_T(T), hs);
                for (int u = 0; u <= t; u++) {
                    float* dv = dqkv + ((size_t)b * T + u) * C3 + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) { dv[i] += a[u] * dy[i]; }
                }
                // through the softmax: dpre[u] = att[u] * (datt[u] - sum_j att[j] datt[j])
                float dot = 0.0f;
                for (int u = 0; u <= t; u++) { dot += a[u] * da[u]; }
                for (int u = 0; u <= t; u++) { da[u] = a[u] * (da[u] - dot); }
                // through the scores q.k * scale: g[u] = da[u] * scale, dq += sum_u g[u] k_u, dk_u += g[u] q
                const float* q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                for (int u = 0; u <= t; u++) {
                    float* dk = dqkv + ((size_t)b * T + u) * C3 + C + h * hs;
                    g[u] = da[u] * scale;
                    for (int i = 0; i < hs; i++) { dk[i] += g[u] * q[i]; }
                }
                const float* k = qkv + (size_t)b * T * C3 + C + h * hs;  // position u's keys at k + u * C3
                attention_weighted_sum(dqkv + ((size_t)b * T + t) * C3 + h * hs, g, k, t + 1, C3, hs);
            }
            free(vt);
            free(g);
        }
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
                for (int u = 0; u <= t; u++) { sum += expf(s[u] - m); }
                float row_lse = m + logf(sum);
                lse[((size_t)b * NH + h) * T + t] = row_lse;
                float* o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) { o[i] = 0.0f; }
                for (int u = 0; u <= t; u++) {
                    const float* v = qkv + ((size_t)b * T + u) * C3 + 2 * C + h * hs;
                    float p = expf(s[u] - row_lse);
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
                    float p = expf(sc * scale - row_lse);
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
// residual connection

// out (N) = a (N) + b (N)
static void residual_forward(float* out, const float* a, const float* b, size_t N) {
    prof_mark(PROF_RESIDUAL, prof_residual_forward(N, sizeof(float)), "forward");
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) { out[i] = a[i] + b[i]; }
}

// ----------------------------------------------------------------------------
// softmax and cross-entropy over the (unpadded) vocabulary

#define SOFTMAX_LANES 16   // the row's max and sum in this many running ones: vectorized, the same order on every machine

// p[i] = exp(x[i] - maxv) for i < V: exp_vec where it is a normal float, 0 below (expf gives a denormal or 0
// there), and lane[i % SOFTMAX_LANES] += p[i] in the order of i, in one pass (the row is read once, not twice).
// With AVX2 and FMA, two vectors of 8 make the 16 lanes (exp_vec8: bitwise exp_vec; test_gpt checks the softmax
// against this loop written one element at a time); the elements past the last 16 go one at a time.
// This pass computes while the row's first (the max) waits on memory: it asks for the next row's
// cache lines as it goes (next: that row, or NULL), so the two overlap.
static void softmax_exp_row(float* p, const float* x, float maxv, int V, float lane[SOFTMAX_LANES], const float* next) {
    int i = 0;
#if !(defined(__AVX2__) && defined(__FMA__))
    (void)next;  // the prefetch is the AVX2 loop's
#else
    __m256 m = _mm256_set1_ps(maxv), lo = _mm256_loadu_ps(lane), hi = _mm256_loadu_ps(lane + VEC8);
    for (; i + SOFTMAX_LANES <= V; i += SOFTMAX_LANES) {
        if (next != NULL) { _mm_prefetch((const char*)(next + i), _MM_HINT_T1); }  // 16 floats: one 64-byte line
        __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i), m), d1 = _mm256_sub_ps(_mm256_loadu_ps(x + i + VEC8), m);
        // d < EXP_VEC_MIN ? 0 : exp: keep the lanes not below (a NaN is kept, as the scalar test keeps it)
        __m256 e0 = _mm256_and_ps(_mm256_cmp_ps(d0, _mm256_set1_ps(EXP_VEC_MIN), _CMP_NLT_UQ), exp_vec8(clamp_vec8(d0, EXP_VEC_MIN, 0.0f)));
        __m256 e1 = _mm256_and_ps(_mm256_cmp_ps(d1, _mm256_set1_ps(EXP_VEC_MIN), _CMP_NLT_UQ), exp_vec8(clamp_vec8(d1, EXP_VEC_MIN, 0.0f)));
        _mm256_storeu_ps(p + i, e0);
        _mm256_storeu_ps(p + i + VEC8, e1);
        lo = _mm256_add_ps(lo, e0);
        hi = _mm256_add_ps(hi, e1);
    }
    _mm256_storeu_ps(lane, lo);
    _mm256_storeu_ps(lane + VEC8, hi);
#endif
    for (; i < V; i++) {  // the clamp keeps the lanes that take the 0 in exp_vec's range
        float d = x[i] - maxv;
        p[i] = d < EXP_VEC_MIN ? 0.0f : exp_vec(clamp_vec(d, EXP_VEC_MIN, 0.0f));
        lane[i % SOFTMAX_LANES] += p[i];
    }
}

// probs (B,T,Vp) writes softmax over the first V entries of logits (B,T,Vp), zero after V.
// probs may equal logits (in place). Each pass over the row vectorizes (exp_vec: cpu/vecmath.h).
static void softmax_forward(float* probs, const float* logits, int B, int T, int V, int Vp) {
    prof_mark(PROF_CLASSIFIER, prof_classifier((size_t)B * T, V, Vp, sizeof(float)), "forward (softmax, cross-entropy)");  // crossentropy_forward too
    #pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        const float* x = logits + (size_t)bt * Vp;
        float* p = probs + (size_t)bt * Vp;
        float lane_max[SOFTMAX_LANES], maxv = -INFINITY;  // the max in lanes too (any order gives the same max)
        for (int k = 0; k < SOFTMAX_LANES; k++) { lane_max[k] = -INFINITY; }
        int i = 0;
        for (; i + SOFTMAX_LANES <= V; i += SOFTMAX_LANES) {
            for (int k = 0; k < SOFTMAX_LANES; k++) { lane_max[k] = x[i + k] > lane_max[k] ? x[i + k] : lane_max[k]; }
        }
        for (; i < V; i++) { maxv = x[i] > maxv ? x[i] : maxv; }
        for (int k = 0; k < SOFTMAX_LANES; k++) { maxv = lane_max[k] > maxv ? lane_max[k] : maxv; }
        float lane[SOFTMAX_LANES] = {0.0f}, sum = 0.0f;  // the sum in lanes (element i in lane i % 16), then in order
        const float* next = bt + 1 < B * T ? x + Vp : NULL;  // the row this thread most likely takes next
        softmax_exp_row(p, x, maxv, V, lane, next);          // the exponentials, summed in the same pass
        for (int k = 0; k < SOFTMAX_LANES; k++) { sum += lane[k]; }
        float inv = 1.0f / sum;
        for (int i = 0; i < V; i++) { p[i] *= inv; }
        for (int i = V; i < Vp; i++) { p[i] = 0.0f; }
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
