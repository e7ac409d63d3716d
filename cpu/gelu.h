/*
gelu.h: GELU of one element and its derivative, the one definition that the CPU's layers
(cpu/layers.h: gelu_forward, gelu_backward) and the emulated device's cuBLASLt GELU epilogues
(dev/cuda_emu/emu_blas.cpp) share, so the emulator's fused GEMM + GELU gives what the CPU does.

    float y = gelu_elem(x);       // 0.5 x (1 + tanh(u)), u = GELU_SCALE (x + GELU_CUBIC x^3)
    float d = gelu_grad_elem(x);  // d gelu / dx
    gelu_span(out, inp, n);                // out[i] = gelu_elem(inp[i]), i < n
    gelu_grad_span(dinp, inp, dout, n);    // dinp[i] += gelu_grad_elem(inp[i]) * dout[i], i < n

Computed as what it equals, x sigmoid(2u) = x / (1 + exp(-2u)): no 1 + tanh(u) that cancels where x is
very negative (within 6.5e-7 of fp64, 1e-6 absolute near 0), and an exp that vectorizes (vecmath.h),
so a loop of these runs at memory speed. (GELU_SCALE and GELU_CUBIC: llmc/model_config.h.)

The spans take 8 elements a step with AVX2 (exp_vec8, clamp_vec8: vecmath.h), the same operations in
the same order as the one-element functions, so bitwise what they give (test_gpt checks both on a sweep
of inputs); gcc's own vectorization of the one-element loop spends a third of its instructions on
compares and blends for the clamp. The elements past the last whole vector, and machines without
AVX2, take the one-element functions.
*/
#ifndef CPU_GELU_H
#define CPU_GELU_H

#include "../llmc/model_config.h"
#include "vecmath.h"

// 0.5 (1 + tanh(u)) = sigmoid(2u), its argument clamped where exp(-2u) would overflow (the result is 0 or 1 there anyway)
static inline float gelu_sigmoid(float u) { return 1.0f / (1.0f + exp_vec(clamp_vec(-2.0f * u, EXP_VEC_MIN, EXP_VEC_MAX))); }

static inline float gelu_elem(float x) { return x * gelu_sigmoid(GELU_SCALE * (x + GELU_CUBIC * x * x * x)); }

// with s = sigmoid(2u): gelu = x s, and ds/dx = 2 s (1 - s) du/dx, du/dx = GELU_SCALE (1 + 3 GELU_CUBIC x^2)
static inline float gelu_grad_elem(float x) {
    float s = gelu_sigmoid(GELU_SCALE * (x + GELU_CUBIC * x * x * x));
    return s + 2.0f * x * s * (1.0f - s) * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
}

#if defined(__AVX2__)
// gelu_sigmoid of GELU_SCALE (x + GELU_CUBIC x^3), 8 lanes, in gelu_elem's order: ((GELU_CUBIC x) x) x + x
static inline __m256 gelu_sigmoid8(__m256 x) {
    __m256 cubic = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_CUBIC), x), x), x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(GELU_SCALE), _mm256_add_ps(x, cubic));
    __m256 e = exp_vec8(clamp_vec8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u), EXP_VEC_MIN, EXP_VEC_MAX));
    return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}
#endif

// out[i] = gelu_elem(inp[i]) for i < n
static void gelu_span(float* out, const float* inp, size_t n) {
    size_t i = 0;
#if defined(__AVX2__)
    for (; i + VEC8 <= n; i += VEC8) {
        __m256 x = _mm256_loadu_ps(inp + i);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(x, gelu_sigmoid8(x)));
    }
#endif
    for (; i < n; i++) { out[i] = gelu_elem(inp[i]); }
}

// dinp[i] += gelu_grad_elem(inp[i]) * dout[i] for i < n
static void gelu_grad_span(float* dinp, const float* inp, const float* dout, size_t n) {
    size_t i = 0;
#if defined(__AVX2__)
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + VEC8 <= n; i += VEC8) {
        __m256 x = _mm256_loadu_ps(inp + i), s = gelu_sigmoid8(x);
        // s + 2 x s (1 - s) GELU_SCALE (1 + 3 GELU_CUBIC x^2), multiplied left to right as gelu_grad_elem
        __m256 slope = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(2.0f), x), s),
                                                   _mm256_sub_ps(one, s)), _mm256_set1_ps(GELU_SCALE));
        __m256 du = _mm256_add_ps(one, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(3.0f * GELU_CUBIC), x), x));
        __m256 grad = _mm256_add_ps(s, _mm256_mul_ps(slope, du));
        __m256 d = _mm256_add_ps(_mm256_loadu_ps(dinp + i), _mm256_mul_ps(grad, _mm256_loadu_ps(dout + i)));
        _mm256_storeu_ps(dinp + i, d);
    }
#endif
    for (; i < n; i++) { dinp[i] += gelu_grad_elem(inp[i]) * dout[i]; }
}

#endif // CPU_GELU_H
