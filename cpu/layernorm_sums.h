/*
layernorm_sums.h: LayerNorm's row sums (cpu/layers.h), LN_ROWS rows side by side, each row's sum
in llm.c's order.

A row's sums (forward: its mean and its variance; backward: the two means the normalisation feeds
back through) are each one chain of dependent adds over c = 0, 1, ..., C-1, the order of llm.c's
CPU trainer. One row at a time, the chain runs at one add per add's latency, a fraction of what the
core can do. Here LN_ROWS rows run side by side, each still adding in that order, so every sum is
bitwise what one row at a time gives:
- with AVX2 (AVX-512 machines have it too): an 8 x 8 block (8 rows, 8 columns) is loaded as 8
  vectors and transposed in registers, so that lane r of vector k holds row r's column c + k; each
  vector operation then moves all 8 rows' chains on by one column;
- without: the same updates in scalar code, LN_ROWS independent chains that the core overlaps;
  columns past the last whole block of 8 go this way on AVX2 too.

    const float* x[LN_ROWS];
    ln_row_group(x, inp, r0, N, C);      // rows r0 .. r0 + LN_ROWS - 1 of inp (N,C)
    float sum[LN_ROWS], sq[LN_ROWS];
    ln_sum_rows(sum, x, C);              // sum[r] = sum_c x[r][c]
    ln_sum_squares(sq, x, mean, C);      // sq[r] = sum_c (x[r][c] - mean[r])^2

Measured on d12's LayerNorm (256 rows of 768, AMD EPYC Zen 3, AVX2): dev/bench_layers.c.
The results hold for any C >= 1; the rows need no alignment.
*/
#ifndef CPU_LAYERNORM_SUMS_H
#define CPU_LAYERNORM_SUMS_H

#include <stddef.h>
#include "vecmath.h"   // transpose8_vec8

#define LN_ROWS 8   // rows side by side: an AVX2 vector's lanes (scalar: 8 chains fill the adder's pipeline)

// rows[r] = row r0 + r of x (N,C) for r < LN_ROWS; past the last row, the last row again (its sums
// are computed and dropped: every group runs the same fixed-width loops)
static void ln_row_group(const float* rows[LN_ROWS], const float* x, int r0, int N, int C) {
    for (int r = 0; r < LN_ROWS; r++) { rows[r] = x + (size_t)(r0 + r < N ? r0 + r : N - 1) * C; }
}

#if defined(__AVX2__)
#define LN_BLOCK 8   // columns a step of the vector path takes: with LN_ROWS rows, an 8 x 8 block

// v[k] lane r = rows[r][c + k], r, k < 8: 8 loads, then the 8 x 8 transpose (cpu/vecmath.h)
static inline void ln_load_transposed(__m256 v[LN_BLOCK], const float* const rows[LN_ROWS], int c) {
    for (int r = 0; r < LN_ROWS; r++) { v[r] = _mm256_loadu_ps(rows[r] + c); }
    transpose8_vec8(v);
}

// the columns the vector path takes (whole blocks); the scalar loops do the rest
static int ln_vector_columns(int C) { return C / LN_BLOCK * LN_BLOCK; }
#else
static int ln_vector_columns(int C) { (void)C; return 0; }  // no vector path
#endif

// sum[r] = sum over c of rows[r][c]
static void ln_sum_rows(float sum[LN_ROWS], const float* const rows[LN_ROWS], int C) {
    int c = ln_vector_columns(C);
    for (int r = 0; r < LN_ROWS; r++) { sum[r] = 0.0f; }
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps(), v[LN_BLOCK];
    for (int c0 = 0; c0 < c; c0 += LN_BLOCK) {
        ln_load_transposed(v, rows, c0);
        for (int k = 0; k < LN_BLOCK; k++) { acc = _mm256_add_ps(acc, v[k]); }
    }
    _mm256_storeu_ps(sum, acc);
#endif
    for (; c < C; c++) {
        for (int r = 0; r < LN_ROWS; r++) { sum[r] += rows[r][c]; }
    }
}

// sq[r] = sum over c of (rows[r][c] - mean[r])^2
static void ln_sum_squares(float sq[LN_ROWS], const float* const rows[LN_ROWS], const float mean[LN_ROWS], int C) {
    int c = ln_vector_columns(C);
    for (int r = 0; r < LN_ROWS; r++) { sq[r] = 0.0f; }
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps(), m = _mm256_loadu_ps(mean), v[LN_BLOCK];
    for (int c0 = 0; c0 < c; c0 += LN_BLOCK) {
        ln_load_transposed(v, rows, c0);
        for (int k = 0; k < LN_BLOCK; k++) {
            __m256 d = _mm256_sub_ps(v[k], m);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(d, d));
        }
    }
    _mm256_storeu_ps(sq, acc);
#endif
    for (; c < C; c++) {
        for (int r = 0; r < LN_ROWS; r++) { float d = rows[r][c] - mean[r]; sq[r] += d * d; }
    }
}

// backward's two sums with dnorm = w[c] dy[r][c]: dsum[r] = sum of dnorm, dnsum[r] = sum of
// dnorm (x[r][c] - mean[r]) rstd[r] (the normalised input), each in the order of c
static void ln_sums_backward(float dsum[LN_ROWS], float dnsum[LN_ROWS], const float* const x[LN_ROWS],
                             const float* const dy[LN_ROWS], const float* w, const float mean[LN_ROWS],
                             const float rstd[LN_ROWS], int C) {
    int c = ln_vector_columns(C);
    for (int r = 0; r < LN_ROWS; r++) { dsum[r] = 0.0f; dnsum[r] = 0.0f; }
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps(), nacc = _mm256_setzero_ps(), m = _mm256_loadu_ps(mean), s = _mm256_loadu_ps(rstd);
    __m256 xv[LN_BLOCK], dyv[LN_BLOCK];
    for (int c0 = 0; c0 < c; c0 += LN_BLOCK) {
        ln_load_transposed(xv, x, c0);
        ln_load_transposed(dyv, dy, c0);
        for (int k = 0; k < LN_BLOCK; k++) {
            __m256 dnorm = _mm256_mul_ps(_mm256_set1_ps(w[c0 + k]), dyv[k]);
            acc = _mm256_add_ps(acc, dnorm);
            nacc = _mm256_add_ps(nacc, _mm256_mul_ps(_mm256_mul_ps(dnorm, _mm256_sub_ps(xv[k], m)), s));
        }
    }
    _mm256_storeu_ps(dsum, acc);
    _mm256_storeu_ps(dnsum, nacc);
#endif
    for (; c < C; c++) {
        for (int r = 0; r < LN_ROWS; r++) {
            float dnorm = w[c] * dy[r][c];
            dsum[r] += dnorm;
            dnsum[r] += dnorm * (x[r][c] - mean[r]) * rstd[r];
        }
    }
}

#endif // CPU_LAYERNORM_SUMS_H
