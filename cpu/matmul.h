/*
matmul.h: the one fp32 GEMM every CPU layer calls.

    C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C

with every matrix row-major with its own leading dimension, and op(X) = X (MM_N)
or X^T (MM_T). Usage:

    #include "cpu/matmul.h"
    // out (BT,OC) = inp (BT,C) @ weight (OC,C)^T
    mm_sgemm(MM_N, MM_T, BT, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);

How it is fast without a BLAS: the classic Goto/BLIS scheme. op(B) is cut into
(MM_KC, MM_NC) blocks and op(A) into (MM_MC, MM_KC) blocks; each block is copied
("packed") into a contiguous buffer laid out in exactly the order the micro-kernel
reads it, and the micro-kernel keeps an (MM_MR, MM_NR) tile of C in vector
registers while it walks K. There is one micro-kernel per instruction set:
AVX-512 (__AVX512F__), AVX2+FMA (__AVX2__ and __FMA__), and plain C for anything
else, so the file builds everywhere and is fast where the Makefile's
-march=native allows. OpenMP threads take rectangles of C (whole MR x NR tiles)
from a shared list and pack their own copies of the blocks they need into
per-thread buffers that live for the whole program (1.25 MiB a thread).

Invariant (determinism): every element of C is computed by the same sequence of
floating point operations whatever the number of threads and wherever it lies
in C: threads split only M and N, never K; K is walked in fixed MM_KC steps in
increasing order; inside a step the micro-kernel accumulates k = 0, 1, ... in a
single register lane; and full and edge tiles share one kernel and one masked
store. So results are bitwise identical from call to call and for 1 or 64 threads
(for one build: a different instruction set or compiler may round differently).
With USE_BLAS the invariant is OpenBLAS's to keep, and it does not promise it.

Contract: any M, N, K >= 0 and any leading dimensions with lda >= the row length
of A as stored (K for MM_N, M for MM_T), likewise ldb, and ldc >= N. K = 0 gives
C = beta * C, as does alpha = 0 (A and B are then not read). beta = 0 never reads
C, so NaN or garbage in C is overwritten. Products under ~2M multiply-adds, and
calls made from inside an OpenMP parallel region, run on the calling thread only.
Failure: if the packing buffers cannot be allocated the program stops with an
error naming the size (fail() in utils.h); there is no other failure mode, and no
argument checking: bad leading dimensions read or write out of bounds, as in BLAS.

Build with -O3 -march=native -fopenmp. Compiles as C11 and as C++ (the CUDA
emulation tests include it). With -DUSE_BLAS, mm_sgemm forwards to cblas_sgemm
(link -lopenblas) and the code below is not compiled.
*/
#ifndef CPU_MATMUL_H
#define CPU_MATMUL_H

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <pthread.h>  // each thread's packing buffers freed at its end
#include "../llmc/utils.h"

typedef enum { MM_N = 0, MM_T = 1 } mm_trans; // op(X) = X or X^T

#ifdef USE_BLAS
// ----------------------------------------------------------------------------
// BLAS path: the whole module is one call

#include <cblas.h>

static void mm_sgemm(mm_trans ta, mm_trans tb, int M, int N, int K, float alpha,
                     const float* A, int lda, const float* B, int ldb,
                     float beta, float* C, int ldc) {
    cblas_sgemm(CblasRowMajor, ta == MM_T ? CblasTrans : CblasNoTrans,
                tb == MM_T ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#else
// ----------------------------------------------------------------------------
// micro-kernels: one (MM_MR, MM_NR) tile of C from packed panels of A and B
//
// packed A panel: (kc, MM_MR), for each k the MR values of one column of op(A)
// packed B panel: (kc, MM_NR), for each k the NR values of one row of op(B)
// Panels are zero-padded to whole MR/NR, so the kernel always runs a full tile
// and only the store is masked to the m <= MR rows and n <= NR columns that exist.

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define MM_RESTRICT __restrict

static int mm_round_up(int x, int to) { return (x + to - 1) / to * to; }
static int mm_min(int a, int b) { return a < b ? a : b; }

// how a tile's result meets C: the first K step applies beta, later steps add
typedef enum {
    MM_STORE_OVERWRITE, // C = alpha * acc        (first K step, beta == 0: C not read)
    MM_STORE_SCALE,     // C = alpha * acc + beta * C   (first K step, beta != 0)
    MM_STORE_ADD,       // C = alpha * acc + C    (every later K step)
} mm_store_mode;

#if defined(__AVX512F__)
// 8x48: 24 zmm accumulators + 3 for the B row + 1 broadcast = 28 of 32 registers. Per k
// it issues 24 FMAs against 3 loads and 8 broadcasts, so the two FMA pipes are the limit.
// In L1 it runs at ~98% of FMA peak on Zen 5, as do 14x32, 8x32, 12x32 and 6x64 (all
// measured; in whole GEMMs they were within noise of each other). 8 and 48 divide the
// trainer's sizes (BT = 256; C = 768, 3C, 4C, Vp = 50304), so no edge tiles there.
// Another shape can be tried with -DMM_MR=14 -DMM_NR=32 (NR a multiple of 16, <= 64).
#ifndef MM_MR
#define MM_MR 8
#define MM_NR 48
#endif
#define MM_VL 16 // floats per vector
#define MM_NV (MM_NR / MM_VL)

static void mm_kernel(int kc, const float* MM_RESTRICT a, const float* MM_RESTRICT b,
                      float* C, int ldc, int m, int n, float alpha, float beta, mm_store_mode mode) {
    // start fetching the C tile now so it is in L1 by the time the K loop ends
    // (every cache line of it: a row of NR floats spans NR / 16 lines, one more if unaligned)
    for (int r = 0; r < m; r++) {
        for (int v = 0; v < MM_NV; v++) { _mm_prefetch((const char*)(C + (size_t)r * ldc + v * MM_VL), _MM_HINT_T0); }
        _mm_prefetch((const char*)(C + (size_t)r * ldc + n - 1), _MM_HINT_T0);
    }
    __m512 acc[MM_MR][MM_NV];
#pragma GCC unroll 32
    for (int r = 0; r < MM_MR; r++) {
#pragma GCC unroll 4
        for (int v = 0; v < MM_NV; v++) { acc[r][v] = _mm512_setzero_ps(); }
    }
    for (int k = 0; k < kc; k++) {
        __m512 bv[MM_NV];
#pragma GCC unroll 4
        for (int v = 0; v < MM_NV; v++) { bv[v] = _mm512_load_ps(b + k * MM_NR + v * MM_VL); }
#pragma GCC unroll 32
        for (int r = 0; r < MM_MR; r++) {
            __m512 ar = _mm512_set1_ps(a[k * MM_MR + r]);
#pragma GCC unroll 4
            for (int v = 0; v < MM_NV; v++) { acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]); }
        }
    }
    // masked store: lanes past column n are neither loaded nor written
    __mmask16 mask[MM_NV];
    for (int v = 0; v < MM_NV; v++) {
        int cols = n - v * MM_VL;
        mask[v] = cols >= MM_VL ? (__mmask16)0xFFFF : cols <= 0 ? (__mmask16)0 : (__mmask16)((1u << cols) - 1);
    }
    __m512 valpha = _mm512_set1_ps(alpha), vbeta = _mm512_set1_ps(beta);
#pragma GCC unroll 32
    for (int r = 0; r < MM_MR; r++) {
        if (r >= m) { break; }
#pragma GCC unroll 4
        for (int v = 0; v < MM_NV; v++) {
            float* c = C + (size_t)r * ldc + v * MM_VL;
            __m512 out;
            if (mode == MM_STORE_OVERWRITE) {
                out = _mm512_mul_ps(valpha, acc[r][v]);
            } else {
                __m512 old = _mm512_maskz_loadu_ps(mask[v], c);
                if (mode == MM_STORE_SCALE) { old = _mm512_mul_ps(vbeta, old); }
                out = _mm512_fmadd_ps(valpha, acc[r][v], old);
            }
            _mm512_mask_storeu_ps(c, mask[v], out);
        }
    }
}

#elif defined(__AVX2__) && defined(__FMA__)
// 6x16: 12 ymm accumulators + 2 for the B row + 1 broadcast = 15 of 16 registers
#define MM_MR 6
#define MM_NR 16
#define MM_VL 8
#define MM_NV (MM_NR / MM_VL)

static void mm_kernel(int kc, const float* MM_RESTRICT a, const float* MM_RESTRICT b,
                      float* C, int ldc, int m, int n, float alpha, float beta, mm_store_mode mode) {
    for (int r = 0; r < m; r++) { // the C tile, every line, as in the AVX-512 kernel
        _mm_prefetch((const char*)(C + (size_t)r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char*)(C + (size_t)r * ldc + n - 1), _MM_HINT_T0);
    }
    __m256 acc[MM_MR][MM_NV];
#pragma GCC unroll 32
    for (int r = 0; r < MM_MR; r++) {
        for (int v = 0; v < MM_NV; v++) { acc[r][v] = _mm256_setzero_ps(); }
    }
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(b + k * MM_NR);
        __m256 b1 = _mm256_load_ps(b + k * MM_NR + MM_VL);
#pragma GCC unroll 32
        for (int r = 0; r < MM_MR; r++) {
            __m256 ar = _mm256_broadcast_ss(a + k * MM_MR + r);
            acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
        }
    }
    // masked store: lane i is live when i < cols (maskload/maskstore test the sign bit)
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i mask[MM_NV];
    for (int v = 0; v < MM_NV; v++) {
        mask[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - v * MM_VL), lane);
    }
    __m256 valpha = _mm256_set1_ps(alpha), vbeta = _mm256_set1_ps(beta);
#pragma GCC unroll 32
    for (int r = 0; r < MM_MR; r++) {
        if (r >= m) { break; }
        for (int v = 0; v < MM_NV; v++) {
            float* c = C + (size_t)r * ldc + v * MM_VL;
            __m256 out;
            if (mode == MM_STORE_OVERWRITE) {
                out = _mm256_mul_ps(valpha, acc[r][v]);
            } else {
                __m256 old = _mm256_maskload_ps(c, mask[v]);
                if (mode == MM_STORE_SCALE) { old = _mm256_mul_ps(vbeta, old); }
                out = _mm256_fmadd_ps(valpha, acc[r][v], old);
            }
            _mm256_maskstore_ps(c, mask[v], out);
        }
    }
}

#else
// portable fallback: plain C the compiler vectorizes; same packing, same contract.
// 4x8 keeps the accumulators in 8 SSE registers (4x16 spilled them: 6 vs 35 GFLOP/s)
#define MM_MR 4
#define MM_NR 8

static void mm_kernel(int kc, const float* MM_RESTRICT a, const float* MM_RESTRICT b,
                      float* C, int ldc, int m, int n, float alpha, float beta, mm_store_mode mode) {
    float acc[MM_MR][MM_NR] = {{0.0f}};
    for (int k = 0; k < kc; k++) {
        for (int r = 0; r < MM_MR; r++) {
            for (int j = 0; j < MM_NR; j++) { acc[r][j] += a[k * MM_MR + r] * b[k * MM_NR + j]; }
        }
    }
    for (int r = 0; r < m; r++) {
        for (int j = 0; j < n; j++) {
            float* c = C + (size_t)r * ldc + j;
            if (mode == MM_STORE_OVERWRITE) { *c = alpha * acc[r][j]; }
            else if (mode == MM_STORE_SCALE) { *c = alpha * acc[r][j] + beta * *c; }
            else { *c = alpha * acc[r][j] + *c; }
        }
    }
}
#endif

// ----------------------------------------------------------------------------
// cache blocking (sizes for Zen 5: 48 KiB L1d, 1 MiB L2 per core; fine on most x86)
//
// MM_KC: the K step. A packed B micro-panel (KC, NR) is re-read for every MR rows of
//   the A block, so it should sit in L1 (256 * 48 floats = 48 KiB, all of it; the
//   prefetcher keeps up), and each tile of C is read and written once per step, so
//   fewer, longer steps are better. 256 is also the dW products' whole K, so those
//   touch C once. (128 and 192 measured slower, 384 no better.)
// MM_MC: the packed A block (MC, KC) is re-read for every NR columns: 256 * 256 floats =
//   256 KiB, a quarter of L2. 256 is the trainer's BT, so A is packed once per B block.
// MM_NC: the packed B block (KC, NC) is re-read for every MC rows: 256 * 1024 floats =
//   1 MiB, L2 / L3. Larger NC means A is repacked less often. (512, 768, 1536 similar.)
// Blocks are split evenly (mm_block_step), so these are upper bounds.
#ifndef MM_KC
#define MM_KC 256
#endif
#ifndef MM_MC
#define MM_MC 256
#endif
#ifndef MM_NC
#define MM_NC 1024
#endif

// ----------------------------------------------------------------------------
// packing
//
// Both packs write the same layout: a block of `rows` rows of op(X) (rows of C's
// M or N side) by kc is cut into panels of `panel` rows; panel p is (kc, panel),
// so row r, column k lands at dst[(r / panel) * panel * kc + k * panel + r % panel].
// Rows past `rows` up to the next whole panel are zeros.
//   copy:       the source holds each k's rows contiguously (A^T, or B): read row by row.
//   transposed: the source holds each row's k contiguously (A, or B^T): read 16 rows x
//               16 k, transpose in registers (AVX-512) or element by element (elsewhere).

// how far ahead, in floats, a transposing pack prefetches along each source row: four
// cache lines, enough to hide DRAM latency when the lm head's weight streams in
#define MM_PACK_PREFETCH 64

// panel by panel, so the writes are sequential; the panel's stripe of each source row
// is still in L1 when the next panel reads the rest of that cache line (k-outer order,
// with 32 write streams, measured 5-8% slower on the dW products)
static void mm_pack_copy(const float* src, int ld, int rows, int kc, int panel, float* dst) {
    for (int p = 0; p < rows; p += panel) {
        int w = mm_min(panel, rows - p);
        float* d = dst + (size_t)p * kc;
        const float* s = src + p;
        for (int k = 0; k < kc; k++, d += panel, s += ld) {
            if (w == panel) { memcpy(d, s, (size_t)panel * sizeof(float)); continue; }
            for (int i = 0; i < w; i++) { d[i] = s[i]; }
            for (int i = w; i < panel; i++) { d[i] = 0.0f; }
        }
    }
}

#if defined(__AVX512F__)
// g++ 12 warns that the shuffle intrinsics' internal _mm512_undefined_ps() is used
// uninitialized (GCC bug 105593, fixed in 13); it is not, so silence it here only
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// src rows [0, n) (row stride ld), k in [0, kn) with kn <= 16 -> out[k] = (src[0][k],
// ..., src[15][k]); rows >= n and k >= kn read as 0
static void mm_transpose16(const float* src, int ld, int n, int kn, __m512 out[16]) {
    __mmask16 kmask = kn >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << kn) - 1);
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) {
        r[i] = _mm512_setzero_ps();
        if (i < n) {
            r[i] = _mm512_maskz_loadu_ps(kmask, src + (size_t)i * ld);
            _mm_prefetch((const char*)(src + (size_t)i * ld + MM_PACK_PREFETCH), _MM_HINT_T0);
        }
    }
    // interleave pairs of rows, then pairs of pairs: each 128-bit lane holds a 4x4 transpose
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    // r[4g + q], lane L now holds k = 4L + q of rows 4g..4g+3: gather the 4 groups' lanes
    for (int q = 0; q < 4; q++) {
        __m512 x0 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0x88);
        __m512 x1 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0xDD);
        __m512 y0 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0x88);
        __m512 y1 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0xDD);
        out[q] = _mm512_shuffle_f32x4(x0, y0, 0x88);
        out[4 + q] = _mm512_shuffle_f32x4(x1, y1, 0x88);
        out[8 + q] = _mm512_shuffle_f32x4(x0, y0, 0xDD);
        out[12 + q] = _mm512_shuffle_f32x4(x1, y1, 0xDD);
    }
}
#pragma GCC diagnostic pop

static void mm_pack_transposed(const float* src, int ld, int rows, int kc, int panel, float* dst) {
    int padded = mm_round_up(rows, panel);
    __m512 col[16];
    for (int i = 0; i < padded; i += 16) {
        // the 16 rows i..i+15 fall into at most 16 / panel + 2 panels; one masked store each
        int p_first = i / panel, p_last = (mm_min(i + 16, padded) - 1) / panel;
        for (int k0 = 0; k0 < kc; k0 += 16) {
            int kn = mm_min(16, kc - k0);
            mm_transpose16(src + (size_t)i * ld + k0, ld, rows - i, kn, col);
            for (int p = p_first; p <= p_last; p++) {
                int lo = mm_min(16, p * panel - i > 0 ? p * panel - i : 0), hi = mm_min(16, (p + 1) * panel - i);
                hi = mm_min(hi, padded - i);
                __mmask16 lanes = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
                // lane L is row i + L, which sits at offset (i + L - p * panel) in panel p
                float* base = dst + (size_t)p * panel * kc + (i - p * panel);
                for (int k = 0; k < kn; k++) { _mm512_mask_storeu_ps(base + (size_t)(k0 + k) * panel, lanes, col[k]); }
            }
        }
    }
}
#else
static void mm_pack_transposed(const float* src, int ld, int rows, int kc, int panel, float* dst) {
    for (int r = 0; r < mm_round_up(rows, panel); r++) {
        float* d = dst + (size_t)(r / panel) * panel * kc + r % panel;
        for (int k = 0; k < kc; k++) { d[(size_t)k * panel] = r < rows ? src[(size_t)r * ld + k] : 0.0f; }
    }
}
#endif

// op(A) rows [i0, i0+mc), cols [p0, p0+kc) -> panels of MR rows
static void mm_pack_a(mm_trans ta, const float* A, int lda, int i0, int mc, int p0, int kc, float* out) {
    if (ta == MM_T) { mm_pack_copy(A + (size_t)p0 * lda + i0, lda, mc, kc, MM_MR, out); }
    else { mm_pack_transposed(A + (size_t)i0 * lda + p0, lda, mc, kc, MM_MR, out); }
}

// op(B) rows [p0, p0+kc), cols [j0, j0+nc) -> panels of NR columns
static void mm_pack_b(mm_trans tb, const float* B, int ldb, int p0, int kc, int j0, int nc, float* out) {
    if (tb == MM_N) { mm_pack_copy(B + (size_t)p0 * ldb + j0, ldb, nc, kc, MM_NR, out); }
    else { mm_pack_transposed(B + (size_t)j0 * ldb + p0, ldb, nc, kc, MM_NR, out); }
}

// ----------------------------------------------------------------------------
// one thread's share: C[m0:m1, n0:n1], the full K loop

typedef struct {
    mm_trans ta, tb;
    int K;
    float alpha, beta;
    const float* A; int lda;
    const float* B; int ldb;
    float* C; int ldc;
} mm_args;

// every MR x NR tile of the packed (mc, kc) A block times the packed (kc, nc) B block
static void mm_macro_kernel(const mm_args* g, const float* Ap, const float* Bp, int ic, int mc,
                            int jc, int nc, int kc, mm_store_mode mode) {
    for (int jr = 0; jr < nc; jr += MM_NR) {
        for (int ir = 0; ir < mc; ir += MM_MR) {
            float* c = g->C + (size_t)(ic + ir) * g->ldc + jc + jr;
            mm_kernel(kc, Ap + (size_t)ir * kc, Bp + (size_t)jr * kc, c, g->ldc,
                      mm_min(MM_MR, mc - ir), mm_min(MM_NR, nc - jr), g->alpha, g->beta, mode);
        }
    }
}

// the step that cuts `range` into the fewest blocks of at most about `max_block`,
// as equal as whole `unit`s allow (so 256 rows make one block of 256, not 252 + 4)
static int mm_block_step(int range, int max_block, int unit) {
    int nblocks = (range + max_block - 1) / max_block;
    return mm_round_up((range + nblocks - 1) / nblocks, unit);
}

#ifdef __cplusplus
#define MM_THREAD_LOCAL thread_local
#else
#define MM_THREAD_LOCAL _Thread_local
#endif

// each thread's packing buffers, made at its first call and kept for the thread's life
// (1.25 MiB a thread): allocating them per call cost 100-450 page faults a call, a few %
// of a layer's time. 64-byte aligned so packed B rows take aligned vector loads.
// Thread-local, so calls from several threads at once (inside a caller's parallel loop)
// are safe; freed when the thread ends (OpenMP ends threads when a later team is smaller)
static pthread_key_t mm_buffers_key;
static pthread_once_t mm_buffers_once = PTHREAD_ONCE_INIT;
static void mm_free_buffers(void* p) {
    float** bufs = (float**)p;
    free(bufs[0]);
    free(bufs[1]);
    free(bufs);
}
static void mm_make_buffers_key(void) {
    if (pthread_key_create(&mm_buffers_key, mm_free_buffers) != 0) { fail("mm_sgemm: pthread_key_create failed"); }
}

static void mm_pack_buffers(float** Ap, float** Bp) {
    static MM_THREAD_LOCAL float* a_buf = NULL;
    static MM_THREAD_LOCAL float* b_buf = NULL;
    if (a_buf == NULL) {
        // mm_block_step rounds a block up to whole tiles, so a block can exceed MC by < MR
        size_t a_bytes = (size_t)mm_round_up(MM_MC, MM_MR) * MM_KC * sizeof(float);
        size_t b_bytes = (size_t)mm_round_up(MM_NC, MM_NR) * MM_KC * sizeof(float);
        a_buf = (float*)aligned_alloc(64, (a_bytes + 63) / 64 * 64);
        b_buf = (float*)aligned_alloc(64, (b_bytes + 63) / 64 * 64);
        float** bufs = (float**)malloc(2 * sizeof(float*));
        if (a_buf == NULL || b_buf == NULL || bufs == NULL) {
            fail("mm_sgemm: out of memory for packing buffers (%zu + %zu bytes)", a_bytes, b_bytes);
        }
        bufs[0] = a_buf;
        bufs[1] = b_buf;
        pthread_once(&mm_buffers_once, mm_make_buffers_key);
        pthread_setspecific(mm_buffers_key, bufs);  // mm_free_buffers at the thread's end
    }
    *Ap = a_buf;
    *Bp = b_buf;
}

static void mm_thread_block(const mm_args* g, int m0, int m1, int n0, int n1) {
    if (m1 <= m0 || n1 <= n0) { return; }
    int mc_step = mm_block_step(m1 - m0, MM_MC, MM_MR), nc_step = mm_block_step(n1 - n0, MM_NC, MM_NR);
    float *Ap, *Bp;
    mm_pack_buffers(&Ap, &Bp);
    for (int jc = n0; jc < n1; jc += nc_step) {
        int nc = mm_min(nc_step, n1 - jc);
        for (int pc = 0; pc < g->K; pc += MM_KC) {
            int kc = mm_min(MM_KC, g->K - pc);
            mm_store_mode mode = pc > 0 ? MM_STORE_ADD : g->beta == 0.0f ? MM_STORE_OVERWRITE : MM_STORE_SCALE;
            mm_pack_b(g->tb, g->B, g->ldb, pc, kc, jc, nc, Bp);
            for (int ic = m0; ic < m1; ic += mc_step) {
                int mc = mm_min(mc_step, m1 - ic);
                mm_pack_a(g->ta, g->A, g->lda, ic, mc, pc, kc, Ap);
                mm_macro_kernel(g, Ap, Bp, ic, mc, jc, nc, kc, mode);
            }
        }
    }
}

// K = 0 or alpha = 0: nothing to multiply, C = beta * C (beta = 0 writes zeros, reads nothing)
static void mm_scale_c(int M, int N, float beta, float* C, int ldc) {
    for (int i = 0; i < M; i++) {
        float* c = C + (size_t)i * ldc;
        for (int j = 0; j < N; j++) { c[j] = beta == 0.0f ? 0.0f : beta * c[j]; }
    }
}

// ----------------------------------------------------------------------------
// threading: C is cut into a grid of rectangles ("units", whole tiles each) that the
// threads take dynamically, so a thread slowed by another process on its core does
// not hold the others up. Which thread computes a unit never changes its bits.

// below this many multiply-adds a call runs on one thread: a parallel region costs
// a few microseconds, as much as a 64x64x64 product (attention's per-head size)
#define MM_MIN_PARALLEL_FMAS (1 << 21)

// the tm x tn grid, one rectangle per thread, with the least work per thread, where
// work = the thread's FMAs plus its packing (each packed element costs about as much
// as MM_PACK_COST FMAs: packing is a copy through memory, the FMAs run at 32 a cycle)
#define MM_PACK_COST 16
static void mm_thread_grid(int mt, int nt, int nthreads, int* tm, int* tn) {
    double best = -1.0;
    for (int a = 1; a <= nthreads; a++) {
        if (nthreads % a != 0) { continue; }
        int b = nthreads / a;
        double rows = (double)((mt + a - 1) / a) * MM_MR, cols = (double)((nt + b - 1) / b) * MM_NR;
        double work = rows * cols + (rows + cols) * MM_PACK_COST; // per unit of K
        if (best < 0.0 || work < best) { best = work; *tm = a; *tn = b; }
    }
}

// each thread's rectangle is cut again into up to MM_UNITS_PER_THREAD units along N
// (or M), but never narrower than one B block (MM_NC columns) or two A blocks (2 * MM_MC
// rows), so the cut adds little packing: a unit repacks what a block boundary would anyway
#define MM_UNITS_PER_THREAD 4
static int mm_units_along(int per_thread, int min_unit) {
    int u = per_thread / min_unit;
    return u < 1 ? 1 : u > MM_UNITS_PER_THREAD ? MM_UNITS_PER_THREAD : u;
}

static void mm_sgemm(mm_trans ta, mm_trans tb, int M, int N, int K, float alpha,
                     const float* A, int lda, const float* B, int ldb,
                     float beta, float* C, int ldc) {
    if (M <= 0 || N <= 0) { return; }
    if (K <= 0 || alpha == 0.0f) { mm_scale_c(M, N, beta, C, ldc); return; } // A, B not read
    mm_args g = {ta, tb, K, alpha, beta, A, lda, B, ldb, C, ldc};
    int nthreads = 1;
#ifdef _OPENMP
    if ((double)M * N * K >= MM_MIN_PARALLEL_FMAS && !omp_in_parallel()) { nthreads = omp_get_max_threads(); }
#endif
    int mt = (M + MM_MR - 1) / MM_MR, nt = (N + MM_NR - 1) / MM_NR; // tiles
    int gm = 1, gn = 1; // the unit grid
    if (nthreads > 1) {
        mm_thread_grid(mt, nt, nthreads, &gm, &gn);
        int un = mm_units_along(N / gn, MM_NC);
        if (un > 1) { gn *= un; } else { gm *= mm_units_along(M / gm, 2 * MM_MC); }
    }
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) if (nthreads > 1)
    for (int u = 0; u < gm * gn; u++) {
        // unit u's rectangle, in whole tiles, the tiles split as evenly as the grid allows
        int a = u / gn, b = u % gn;
        int m0 = (int)((long)mt * a / gm) * MM_MR, m1 = mm_min(M, (int)((long)mt * (a + 1) / gm) * MM_MR);
        int n0 = (int)((long)nt * b / gn) * MM_NR, n1 = mm_min(N, (int)((long)nt * (b + 1) / gn) * MM_NR);
        mm_thread_block(&g, m0, m1, n0, n1);
    }
}

#endif // USE_BLAS
#endif // CPU_MATMUL_H
