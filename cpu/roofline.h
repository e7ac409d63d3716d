/*
roofline.h: the CPU's two limits, measured when asked, so that --profile can say how far each kind
of work is from what this machine can do (llmc/profile.h: ProfRoofline):

    ProfRoofline r = cpu_roofline_measure();   // about a quarter of a second
    // r.gb_s: the STREAM triad a[i] = b[i] + s c[i] over every thread, bytes read and written a second
    // r.gflop_s: the forward matmul of the d12 MLP's first layer (cpu/matmul.h, or OpenBLAS with USE_BLAS)

A memory-bound kernel (GELU, LayerNorm, AdamW) cannot beat the triad's bandwidth; a GEMM is held to
the best this trainer's own GEMM does on a large shape. Each is the best of ROOF_REPEATS tries, so a
busy moment lowers it less. Counted as STREAM counts: 3 x 4 bytes an element of the triad (no
write-allocate), 2MNK FLOPs a GEMM.
*/
#ifndef CPU_ROOFLINE_H
#define CPU_ROOFLINE_H

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include "../llmc/profile.h"
#include "../llmc/utils.h"
#include "layers.h"

#define ROOF_TRIAD_FLOATS ((size_t)1 << 24)  // 64 MiB an array: far beyond any cache
#define ROOF_TRIAD_BYTES_PER_FLOAT 12        // b and c read, a written
#define ROOF_GEMM_BT 1024                    // (BT, C) @ (OC, C)^T: d12's MLP up-projection, as the step runs it
#define ROOF_GEMM_C 768
#define ROOF_GEMM_OC 3072
#define ROOF_REPEATS 3

static double roof_triad_gb_s(void) {
    float* a = (float*)malloc_check(ROOF_TRIAD_FLOATS * sizeof(float));
    float* b = (float*)malloc_check(ROOF_TRIAD_FLOATS * sizeof(float));
    float* c = (float*)malloc_check(ROOF_TRIAD_FLOATS * sizeof(float));
    #pragma omp parallel for
    for (size_t i = 0; i < ROOF_TRIAD_FLOATS; i++) { a[i] = 0.0f; b[i] = 1.0f; c[i] = 2.0f; }  // pages touched by their thread
    double best = 0.0;
    for (int rep = 0; rep < ROOF_REPEATS; rep++) {
        double t0 = prof_now();
        #pragma omp parallel for
        for (size_t i = 0; i < ROOF_TRIAD_FLOATS; i++) { a[i] = b[i] + 3.0f * c[i]; }
        double gb_s = (double)ROOF_TRIAD_FLOATS * ROOF_TRIAD_BYTES_PER_FLOAT / (prof_now() - t0) / 1e9;
        if (gb_s > best) { best = gb_s; }
    }
    free(a); free(b); free(c);
    return best;
}

static double roof_gemm_gflop_s(void) {
    size_t n_in = (size_t)ROOF_GEMM_BT * ROOF_GEMM_C, n_w = (size_t)ROOF_GEMM_OC * ROOF_GEMM_C, n_out = (size_t)ROOF_GEMM_BT * ROOF_GEMM_OC;
    float* in = (float*)malloc_check(n_in * sizeof(float));
    float* w = (float*)malloc_check(n_w * sizeof(float));
    float* out = (float*)malloc_check(n_out * sizeof(float));
    for (size_t i = 0; i < n_in; i++) { in[i] = (float)(i % 7) * 0.1f; }
    for (size_t i = 0; i < n_w; i++) { w[i] = (float)(i % 5) * 0.1f; }
    double best = 0.0;
    for (int rep = 0; rep < ROOF_REPEATS; rep++) {
        double t0 = prof_now();
        matmul_forward(out, in, w, NULL, 1, ROOF_GEMM_BT, ROOF_GEMM_C, ROOF_GEMM_OC);
        double gflop_s = 2.0 * ROOF_GEMM_BT * ROOF_GEMM_C * ROOF_GEMM_OC / (prof_now() - t0) / 1e9;
        if (gflop_s > best) { best = gflop_s; }
    }
    free(in); free(w); free(out);
    return best;
}

static ProfRoofline cpu_roofline_measure(void) {
    ProfRoofline r = {.gb_s = roof_triad_gb_s(), .gflop_s = roof_gemm_gflop_s(), .how = ""};
    snprintf(r.how, sizeof(r.how), "STREAM triad over %d thread(s), and the matmul (%d x %d) -> %d, best of %d, measured after the step",
             omp_get_max_threads(), ROOF_GEMM_BT, ROOF_GEMM_C, ROOF_GEMM_OC, ROOF_REPEATS);
    return r;
}

#endif // CPU_ROOFLINE_H
