/*
check.h: what the emulated-device tests add to the project's harness (tests/check.h: check()
and check_summary()): CUDA_CHECK, and comparison and test-data helpers. Host code; nvcc and
the emulator both build it.

    CUDA_CHECK(cudaMalloc(&p, n));                    // stops with file:line and the call on error
    check(err < 1e-5f, "sgemm NN", "max err %g", err); // "ok   sgemm NN" or "FAIL sgemm NN: max err ..."
    return check_summary();                           // "N passed, N failed"; non-zero if any failed
*/
#ifndef CUDA_EMU_TEST_CHECK_H
#define CUDA_EMU_TEST_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "tests/check.h"  // check() and check_summary(): the project's one harness

#define CUDA_CHECK(call) cuda_check_at((call), #call, __FILE__, __LINE__)
static void cuda_check_at(cudaError_t e, const char* call, const char* file, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "error: %s failed: %s (%s)\n  (at %s:%d)\n", call, cudaGetErrorString(e),
                cudaGetErrorName(e), file, line);
        exit(EXIT_FAILURE);
    }
}

// largest |a[i] - b[i]| relative to max(1, |b[i]|); NaN anywhere counts as infinitely far
static float max_rel_error(const float* a, const float* b, size_t n) {
    float worst = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]) / fmaxf(1.0f, fabsf(b[i]));
        if (!(d <= worst)) { worst = isnan(d) ? INFINITY : d; }
    }
    return worst;
}

// deterministic test data in [-1, 1)
static void fill_uniform(float* x, size_t n, unsigned seed) {
    unsigned s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)(s >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
    }
}

#endif // CUDA_EMU_TEST_CHECK_H
