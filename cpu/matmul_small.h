/*
matmul_small.h: products of small matrices on the calling thread, without packing: the attention's
per-head products (cpu/layers.h), T x T x hs each (64 x 64 x 64 at d12's T=64), which mm_sgemm
(cpu/matmul.h) would spend more time packing and threading than multiplying.

    // c (rows, cols) = alpha * (sum over k in [k0, k1) of a(r, k) b(k, j))     (SMM_WRITE)
    // c (rows, cols) += alpha * (the same sum)                                   (SMM_ADD)
    smm(c, ldc, a, a_rs, a_ks, b, ldb, rows, cols, k0, k1, alpha, SMM_WRITE);
    smm_transpose(dst, ldd, src, lds, rows, cols);   // dst (cols, rows) = src (rows, cols)^T
    smm_copy(dst, ldd, src, lds, rows, cols);        // dst (rows, cols) = src (rows, cols): made contiguous

a is read one element at a time, a(r, k) = a[r * a_rs + k * a_ks], so a stored matrix serves as
itself (a_rs = its row length, a_ks = 1) or transposed (a_rs = 1, a_ks = its row length); b and c are
row-major with leading dimensions ldb and ldc. How: SMM_ROWS rows of c at a time, up to SMM_COLS
columns, held in vector registers while k walks [k0, k1); a step broadcasts the rows' a(r, k), loads
b's row k once and adds their products with fused multiply-adds (FMA): the register tile of a GEMM's
micro-kernel (cpu/matmul.h) with b read in place instead of packed. The caller picks the rows, the
columns and k's range, so a causal product skips the zero triangle a block of SMM_ROWS rows at a time.

Invariant: each element of c is its own sum over k in increasing order, one FMA a step from 0, then
times alpha (added to c by one more FMA for SMM_ADD): so the same bits on AVX-512 (16 lanes), AVX2
with FMA (8 lanes) and the scalar code (fmaf), whichever rows, columns and tile a call covers.
Anything (rows, cols >= 0, k0 <= k1) goes; rows and columns past the matrix are neither read nor
written (masked loads and stores).
*/
#ifndef CPU_MATMUL_SMALL_H
#define CPU_MATMUL_SMALL_H

#include <math.h>
#include <stddef.h>
#include <string.h>
#include "vecmath.h"   // transpose8_vec8 (and the vector intrinsics)

typedef enum { SMM_WRITE = 0, SMM_ADD = 1 } SmmMode;  // c = alpha * sum, or c += alpha * sum

#define SMM_ROWS 4   // rows of c a tile holds (a causal caller's block)

#if defined(__AVX512F__)
// 4 rows x 4 vectors of 16: 16 accumulators + 4 of b's row + 1 broadcast, of 32 registers
#define SMM_VL 16
#define SMM_NV 4
#define SMM_COLS (SMM_VL * SMM_NV)   // 64: hs, and T at d12's T=64, in one tile

// one tile of rows <= SMM_ROWS rows and nv vectors (cols of them live); nv a constant where inlined
static inline __attribute__((always_inline)) void smm_tile(int nv, float* c, int ldc, const float* a, int a_rs, int a_ks,
                                                           const float* b, int ldb, int rows, int cols, int k0, int k1,
                                                           float alpha, SmmMode mode) {
    const float* ar[SMM_ROWS];  // rows past the last repeat it: computed, never stored
    for (int r = 0; r < SMM_ROWS; r++) { ar[r] = a + (size_t)(r < rows ? r : rows - 1) * a_rs; }
    __mmask16 mask[SMM_NV];
#pragma GCC unroll 4
    for (int v = 0; v < SMM_NV; v++) {
        int n = cols - v * SMM_VL;
        mask[v] = n >= SMM_VL ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
    }
    __m512 acc[SMM_ROWS][SMM_NV];
#pragma GCC unroll 4
    for (int r = 0; r < SMM_ROWS; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) { acc[r][v] = _mm512_setzero_ps(); }
    }
    for (int k = k0; k < k1; k++) {
        const float* bk = b + (size_t)k * ldb;
        __m512 bv[SMM_NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) { bv[v] = _mm512_maskz_loadu_ps(mask[v], bk + v * SMM_VL); }
#pragma GCC unroll 4
        for (int r = 0; r < SMM_ROWS; r++) {
            __m512 x = _mm512_set1_ps(ar[r][(size_t)k * a_ks]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) { acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]); }
        }
    }
    __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
    for (int r = 0; r < SMM_ROWS; r++) {
        if (r >= rows) { break; }
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            float* cv = c + (size_t)r * ldc + v * SMM_VL;
            if (cols >= (v + 1) * SMM_VL) {  // a whole vector: a plain store (a masked one slows the next load of it)
                __m512 out = mode == SMM_ADD ? _mm512_fmadd_ps(va, acc[r][v], _mm512_loadu_ps(cv)) : _mm512_mul_ps(va, acc[r][v]);
                _mm512_storeu_ps(cv, out);
            } else {
                __m512 out = mode == SMM_ADD ? _mm512_fmadd_ps(va, acc[r][v], _mm512_maskz_loadu_ps(mask[v], cv))
                                             : _mm512_mul_ps(va, acc[r][v]);
                _mm512_mask_storeu_ps(cv, mask[v], out);
            }
        }
    }
}

#elif defined(__AVX2__) && defined(__FMA__)
// 4 rows x 2 vectors of 8: 8 accumulators + 2 of b's row + 1 broadcast, of 16 registers
#define SMM_VL 8
#define SMM_NV 2
#define SMM_COLS (SMM_VL * SMM_NV)

static inline __attribute__((always_inline)) void smm_tile(int nv, float* c, int ldc, const float* a, int a_rs, int a_ks,
                                                           const float* b, int ldb, int rows, int cols, int k0, int k1,
                                                           float alpha, SmmMode mode) {
    const float* ar[SMM_ROWS];
    for (int r = 0; r < SMM_ROWS; r++) { ar[r] = a + (size_t)(r < rows ? r : rows - 1) * a_rs; }
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), mask[SMM_NV];  // lane i live when i < n
#pragma GCC unroll 4
    for (int v = 0; v < SMM_NV; v++) { mask[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols - v * SMM_VL), lane); }
    __m256 acc[SMM_ROWS][SMM_NV];
#pragma GCC unroll 4
    for (int r = 0; r < SMM_ROWS; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) { acc[r][v] = _mm256_setzero_ps(); }
    }
    for (int k = k0; k < k1; k++) {
        const float* bk = b + (size_t)k * ldb;
        __m256 bv[SMM_NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) { bv[v] = _mm256_maskload_ps(bk + v * SMM_VL, mask[v]); }
#pragma GCC unroll 4
        for (int r = 0; r < SMM_ROWS; r++) {
            __m256 x = _mm256_broadcast_ss(ar[r] + (size_t)k * a_ks);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) { acc[r][v] = _mm256_fmadd_ps(x, bv[v], acc[r][v]); }
        }
    }
    __m256 va = _mm256_set1_ps(alpha);
#pragma GCC unroll 4
    for (int r = 0; r < SMM_ROWS; r++) {
        if (r >= rows) { break; }
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            float* cv = c + (size_t)r * ldc + v * SMM_VL;
            if (cols >= (v + 1) * SMM_VL) {  // a whole vector: a plain store
                __m256 out = mode == SMM_ADD ? _mm256_fmadd_ps(va, acc[r][v], _mm256_loadu_ps(cv)) : _mm256_mul_ps(va, acc[r][v]);
                _mm256_storeu_ps(cv, out);
            } else {
                __m256 out = mode == SMM_ADD ? _mm256_fmadd_ps(va, acc[r][v], _mm256_maskload_ps(cv, mask[v]))
                                             : _mm256_mul_ps(va, acc[r][v]);
                _mm256_maskstore_ps(cv, mask[v], out);
            }
        }
    }
}

#else
// plain C: one column at a time, the same fused multiply-adds (fmaf) in the same order
#define SMM_VL 1
#define SMM_NV 1
#define SMM_COLS 1

static inline void smm_tile(int nv, float* c, int ldc, const float* a, int a_rs, int a_ks, const float* b, int ldb,
                            int rows, int cols, int k0, int k1, float alpha, SmmMode mode) {
    (void)nv;
    if (cols < 1) { return; }
    for (int r = 0; r < rows; r++) {
        float acc = 0.0f;
        for (int k = k0; k < k1; k++) { acc = fmaf(a[(size_t)r * a_rs + (size_t)k * a_ks], b[(size_t)k * ldb], acc); }
        c[(size_t)r * ldc] = mode == SMM_ADD ? fmaf(alpha, acc, c[(size_t)r * ldc]) : alpha * acc;
    }
}
#endif

// c (rows, cols) = or += alpha * a (rows, [k0, k1)) b ([k0, k1), cols): tile by tile, each tile's
// vectors a constant so that its accumulators stay in registers
static void smm(float* c, int ldc, const float* a, int a_rs, int a_ks, const float* b, int ldb, int rows, int cols,
                int k0, int k1, float alpha, SmmMode mode) {
    for (int r0 = 0; r0 < rows; r0 += SMM_ROWS) {
        int nr = rows - r0 < SMM_ROWS ? rows - r0 : SMM_ROWS;
        const float* ar = a + (size_t)r0 * a_rs;
        float* cr = c + (size_t)r0 * ldc;
        for (int j0 = 0; j0 < cols; j0 += SMM_COLS) {
            int nc = cols - j0 < SMM_COLS ? cols - j0 : SMM_COLS, nv = (nc + SMM_VL - 1) / SMM_VL;
            switch (nv) {
            case 1: smm_tile(1, cr + j0, ldc, ar, a_rs, a_ks, b + j0, ldb, nr, nc, k0, k1, alpha, mode); break;
#if SMM_NV >= 2
            case 2: smm_tile(2, cr + j0, ldc, ar, a_rs, a_ks, b + j0, ldb, nr, nc, k0, k1, alpha, mode); break;
#endif
#if SMM_NV >= 4
            case 3: smm_tile(3, cr + j0, ldc, ar, a_rs, a_ks, b + j0, ldb, nr, nc, k0, k1, alpha, mode); break;
            case 4: smm_tile(4, cr + j0, ldc, ar, a_rs, a_ks, b + j0, ldb, nr, nc, k0, k1, alpha, mode); break;
#endif
            default: break;
            }
        }
    }
}

// dst (rows, cols) = src (rows, cols); lds and ldd the two leading dimensions (a strided operand made
// contiguous: b's rows at a large stride fall into few of the L1 cache's sets and evict each other)
static void smm_copy(float* dst, int ldd, const float* src, int lds, int rows, int cols) {
    for (int i = 0; i < rows; i++) { memcpy(dst + (size_t)i * ldd, src + (size_t)i * lds, (size_t)cols * sizeof(float)); }
}

// dst (cols, rows) = src (rows, cols)^T; lds and ldd the two leading dimensions. With AVX2 by 8 x 8
// blocks in registers (transpose8_vec8), the rows and columns past the last whole block one at a time
static void smm_transpose(float* dst, int ldd, const float* src, int lds, int rows, int cols) {
    int i0 = 0;
#if defined(__AVX2__)
    for (; i0 + VEC8 <= rows; i0 += VEC8) {
        int j0 = 0;
        for (; j0 + VEC8 <= cols; j0 += VEC8) {
            __m256 v[VEC8];
            for (int r = 0; r < VEC8; r++) { v[r] = _mm256_loadu_ps(src + (size_t)(i0 + r) * lds + j0); }
            transpose8_vec8(v);
            for (int k = 0; k < VEC8; k++) { _mm256_storeu_ps(dst + (size_t)(j0 + k) * ldd + i0, v[k]); }
        }
        for (int i = i0; i < i0 + VEC8; i++) {
            for (int j = j0; j < cols; j++) { dst[(size_t)j * ldd + i] = src[(size_t)i * lds + j]; }
        }
    }
#endif
    for (int i = i0; i < rows; i++) {
        for (int j = 0; j < cols; j++) { dst[(size_t)j * ldd + i] = src[(size_t)i * lds + j]; }
    }
}

#endif // CPU_MATMUL_SMALL_H
