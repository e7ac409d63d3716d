/*
bench_matmul.c: GFLOP/s of mm_sgemm (cpu/matmul.h) against OpenBLAS cblas_sgemm on
the products the trainer runs for GPT-2 124M at B=4, T=64 (BT = 256 rows).

    gcc -O3 -march=native -fopenmp dev/bench_matmul.c -o bench_matmul -lopenblas -lm
    ./bench_matmul            # 1 thread, then omp_get_max_threads() threads

For each thread count it prints a markdown table, then one line a bench script can grep:
    sgemm_openblas_gflops <x>   (OpenBLAS, lm head forward, all threads)
    sgemm_ours_gflops <x>       (ours, same shape)
Each entry is the best of several timed calls after one warm-up call.

Measured (2-core AMD EPYC Zen 5, gcc 12, Debian OpenBLAS 0.3.21, which picks its
AVX2 "Haswell" kernels on this CPU; FMA peak is ~248 GFLOP/s a core with AVX-512):
  1 thread:  ours 193-225 GFLOP/s, OpenBLAS  99-116  (ours/OpenBLAS 1.71-2.06)
  2 threads: ours 390-431 GFLOP/s, OpenBLAS 202-247  (1.70-2.02)
With OPENBLAS_CORETYPE=SkylakeX (OpenBLAS's AVX-512 kernels, about twice as fast
here) the ratio is 0.95-1.11 on the forward and dinp products, 0.91-0.99 on dW.
The machine is shared: rerun when the numbers look low, other work steals cores.
*/
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <omp.h>
#include <cblas.h>
#include "../cpu/matmul.h"
#include "../cpu/roofline.h"   // the triad: the memory limit beside the GEMM rates

void openblas_set_num_threads(int); // from OpenBLAS, not declared by every cblas.h

// ----------------------------------------------------------------------------
// the trainer's products, in its three layouts

typedef struct { const char* layer; int C, OC; } bench_layer;
static const bench_layer LAYERS[] = {
    {"qkv", 768, 2304}, {"attproj", 768, 768}, {"fc", 768, 3072}, {"fcproj", 3072, 768}, {"lmhead", 768, 50304},
};
#define N_LAYERS (int)(sizeof(LAYERS) / sizeof(LAYERS[0]))
#define BT 256

typedef enum { FWD, BWD_DINP, BWD_DW } bench_kind;
static const char* KIND_NAME[] = {
    "fwd  out = inp @ W^T   (N,T)", "bwd  dinp += dout @ W  (N,N)", "bwd  dW += dout^T @ inp (T,N)",
};

typedef struct { mm_trans ta, tb; int M, N, K, lda, ldb, ldc; float beta; } bench_shape;

// out (BT,OC) = inp (BT,C) @ W (OC,C)^T;  dinp (BT,C) += dout (BT,OC) @ W (OC,C);
// dW (OC,C) += dout (BT,OC)^T @ inp (BT,C)
static bench_shape shape_of(bench_kind kind, bench_layer l) {
    bench_shape s;
    if (kind == FWD) { bench_shape f = {MM_N, MM_T, BT, l.OC, l.C, l.C, l.C, l.OC, 0.0f}; s = f; }
    else if (kind == BWD_DINP) { bench_shape f = {MM_N, MM_N, BT, l.C, l.OC, l.OC, l.C, l.C, 1.0f}; s = f; }
    else { bench_shape f = {MM_T, MM_N, l.OC, l.C, BT, l.OC, l.C, l.C, 1.0f}; s = f; }
    return s;
}

// ----------------------------------------------------------------------------
// timing

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void run_ours(const bench_shape* s, const float* A, const float* B, float* C) {
    mm_sgemm(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, s->lda, B, s->ldb, s->beta, C, s->ldc);
}

static void run_blas(const bench_shape* s, const float* A, const float* B, float* C) {
    cblas_sgemm(CblasRowMajor, s->ta == MM_T ? CblasTrans : CblasNoTrans, s->tb == MM_T ? CblasTrans : CblasNoTrans,
                s->M, s->N, s->K, 1.0f, A, s->lda, B, s->ldb, s->beta, C, s->ldc);
}

// best GFLOP/s over calls until about 0.3 s or 20 calls, after one warm-up call
// (best, not mean: it is the least disturbed by other work on a shared machine)
static double gflops(void (*fn)(const bench_shape*, const float*, const float*, float*),
                     const bench_shape* s, const float* A, const float* B, float* C) {
    fn(s, A, B, C);
    double best = 1e30, spent = 0.0;
    for (int rep = 0; rep < 20 && spent < 0.3; rep++) {
        double t0 = now_s();
        fn(s, A, B, C);
        double dt = now_s() - t0;
        spent += dt;
        if (dt < best) { best = dt; }
    }
    return 2.0 * s->M * s->N * (double)s->K / best * 1e-9;
}

// ----------------------------------------------------------------------------

static float* random_floats(size_t n) {
    float* x = (float*)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { x[i] = (float)rand() / RAND_MAX - 0.5f; }
    return x;
}

// one table for one thread count; returns ours and OpenBLAS on the lm head forward.
// All of ours run first, then all of OpenBLAS: each library's idle threads spin for a
// while after a call, and would steal the cores from the other one if interleaved.
#define N_KINDS 3
static void bench_table(int nthreads, const float* A, const float* B, float* C, double* ours_lm, double* blas_lm) {
    omp_set_num_threads(nthreads);
    openblas_set_num_threads(nthreads);
    double ours[N_KINDS][N_LAYERS], blas[N_KINDS][N_LAYERS];
    for (int kind = 0; kind < N_KINDS; kind++) {
        for (int l = 0; l < N_LAYERS; l++) {
            bench_shape s = shape_of((bench_kind)kind, LAYERS[l]);
            ours[kind][l] = gflops(run_ours, &s, A, B, C);
        }
    }
    for (int kind = 0; kind < N_KINDS; kind++) {
        for (int l = 0; l < N_LAYERS; l++) {
            bench_shape s = shape_of((bench_kind)kind, LAYERS[l]);
            blas[kind][l] = gflops(run_blas, &s, A, B, C);
        }
    }
    printf("\n### %d thread%s\n\n", nthreads, nthreads > 1 ? "s" : "");
    printf("| product | M | N | K | ours GFLOP/s | OpenBLAS GFLOP/s | ours/OpenBLAS |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
    for (int kind = 0; kind < N_KINDS; kind++) {
        for (int l = 0; l < N_LAYERS; l++) {
            bench_shape s = shape_of((bench_kind)kind, LAYERS[l]);
            printf("| %s %s | %d | %d | %d | %.1f | %.1f | %.2f |\n", KIND_NAME[kind], LAYERS[l].layer,
                   s.M, s.N, s.K, ours[kind][l], blas[kind][l], ours[kind][l] / blas[kind][l]);
        }
    }
    *ours_lm = ours[FWD][N_LAYERS - 1];
    *blas_lm = blas[FWD][N_LAYERS - 1];
}

int main(void) {
    // the largest operand is the lm head weight (50304, 768); size all three buffers for it
    size_t n = (size_t)50304 * 768;
    float* A = random_floats(n);
    float* B = random_floats(n);
    float* C = random_floats(n);
    int maxt = omp_get_max_threads();
    double ours_lm = 0, blas_lm = 0;
    bench_table(1, A, B, C, &ours_lm, &blas_lm);
    if (maxt > 1) { bench_table(maxt, A, B, C, &ours_lm, &blas_lm); }
    printf("\ntriad_gb_s %.1f\n", roof_triad_gb_s());
    printf("sgemm_openblas_gflops %.1f\n", blas_lm);
    printf("sgemm_ours_gflops %.1f\n", ours_lm);
    free(A); free(B); free(C);
    return 0;
}
