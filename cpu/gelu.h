/*
gelu.h: GELU of one element and its derivative, the one definition that the CPU's layers
(cpu/layers.h: gelu_forward, gelu_backward) and the emulated device's cuBLASLt GELU epilogues
(dev/cuda_emu/emu_blas.cpp) share, so the emulator's fused GEMM + GELU gives what the CPU does.

    float y = gelu_elem(x);       // 0.5 x (1 + tanh(u)), u = GELU_SCALE (x + GELU_CUBIC x^3)
    float d = gelu_grad_elem(x);  // d gelu / dx
    gelu_span(out, inp, n);                // out[i] = gelu_elem(inp[i]), i < n
    gelu_grad_span(dinp, inp, dout, n);    // dinp[i] += gelu_grad_elem(inp[i]) * dout[i], i < n (one FMA)

Computed as what it equals, x sigmoid(2u) = x / (1 + exp(-2u)): no 1 + tanh(u) that cancels where x is
very negative, and an exp that vectorizes (vecmath.h), so a loop of these runs at memory speed. The
exponent is one polynomial in x with the constants folded, -2u = x (GELU_EXP_LINEAR + GELU_EXP_CUBIC x^2),
and every multiply-add is fused (fmaf): within 2e-6 relative of GELU in double (1e-6 absolute near 0).
(GELU_SCALE and GELU_CUBIC: llmc/model_config.h.)

The spans take 16 elements a step with AVX-512 and 8 with AVX2 (exp_vec16, exp_vec8: vecmath.h), the
same operations in the same order as the one-element functions, so bitwise what they give on any of
these machines (test_gpt checks both on a sweep of inputs); the elements past the last whole vector,
and machines without AVX2 and FMA, take the one-element functions.
*/
#ifndef CPU_GELU_H
#define CPU_GELU_H

#include "../llmc/model_config.h"
#include "vecmath.h"

#define GELU_EXP_LINEAR (-2.0f * GELU_SCALE)                 // -2u = x (GELU_EXP_LINEAR + GELU_EXP_CUBIC x^2)
#define GELU_EXP_CUBIC (-2.0f * GELU_SCALE * GELU_CUBIC)
#define GELU_SLOPE_LINEAR (2.0f * GELU_SCALE)                // 2 du/dx = GELU_SLOPE_LINEAR + GELU_SLOPE_CUBIC x^2
#define GELU_SLOPE_CUBIC (6.0f * GELU_SCALE * GELU_CUBIC)

// exp(-2u), its argument clamped where it would overflow (sigmoid(2u) is 0 or 1 there anyway)
static inline float gelu_exp(float x) {
    return exp_vec(clamp_vec(x * fmaf(GELU_EXP_CUBIC, x * x, GELU_EXP_LINEAR), EXP_VEC_MIN, EXP_VEC_MAX));
}

static inline float gelu_elem(float x) { return x / (1.0f + gelu_exp(x)); }

// with s = sigmoid(2u): gelu = x s, and d gelu/dx = s + x s (1 - s) 2 du/dx
static inline float gelu_grad_elem(float x) {
    float s = 1.0f / (1.0f + gelu_exp(x));
    return fmaf(x * fmaf(-s, s, s), fmaf(GELU_SLOPE_CUBIC, x * x, GELU_SLOPE_LINEAR), s);
}

#if defined(__AVX512F__)
// gelu_exp on 16 lanes, in its order
static inline __m512 gelu_exp16(__m512 x) {
    __m512 w = _mm512_fmadd_ps(_mm512_set1_ps(GELU_EXP_CUBIC), _mm512_mul_ps(x, x), _mm512_set1_ps(GELU_EXP_LINEAR));
    return exp_vec16(clamp_vec16(_mm512_mul_ps(x, w), EXP_VEC_MIN, EXP_VEC_MAX));
}
#endif
#if defined(__AVX2__) && defined(__FMA__)
// gelu_exp on 8 lanes, in its order
static inline __m256 gelu_exp8(__m256 x) {
    __m256 w = _mm256_fmadd_ps(_mm256_set1_ps(GELU_EXP_CUBIC), _mm256_mul_ps(x, x), _mm256_set1_ps(GELU_EXP_LINEAR));
    return exp_vec8(clamp_vec8(_mm256_mul_ps(x, w), EXP_VEC_MIN, EXP_VEC_MAX));
}
#endif

// out[i] = gelu_elem(inp[i]) for i < n
static void gelu_span(float* out, const float* inp, size_t n) {
    size_t i = 0;
#if defined(__AVX512F__)
    for (; i + VEC16 <= n; i += VEC16) {
        __m512 x = _mm512_loadu_ps(inp + i);
        _mm512_storeu_ps(out + i, _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), gelu_exp16(x))));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (; i + VEC8 <= n; i += VEC8) {
        __m256 x = _mm256_loadu_ps(inp + i);
        _mm256_storeu_ps(out + i, _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), gelu_exp8(x))));
    }
#endif
    for (; i < n; i++) { out[i] = gelu_elem(inp[i]); }
}

// dinp[i] = fmaf(gelu_grad_elem(inp[i]), dout[i], dinp[i]) for i < n
static void gelu_grad_span(float* dinp, const float* inp, const float* dout, size_t n) {
    size_t i = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + VEC16 <= n; i += VEC16) {
        __m512 x = _mm512_loadu_ps(inp + i), s = _mm512_div_ps(one, _mm512_add_ps(one, gelu_exp16(x)));
        __m512 slope = _mm512_fmadd_ps(_mm512_set1_ps(GELU_SLOPE_CUBIC), _mm512_mul_ps(x, x), _mm512_set1_ps(GELU_SLOPE_LINEAR));
        __m512 grad = _mm512_fmadd_ps(_mm512_mul_ps(x, _mm512_fnmadd_ps(s, s, s)), slope, s);
        _mm512_storeu_ps(dinp + i, _mm512_fmadd_ps(grad, _mm512_loadu_ps(dout + i), _mm512_loadu_ps(dinp + i)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + VEC8 <= n; i += VEC8) {
        __m256 x = _mm256_loadu_ps(inp + i), s = _mm256_div_ps(one, _mm256_add_ps(one, gelu_exp8(x)));
        __m256 slope = _mm256_fmadd_ps(_mm256_set1_ps(GELU_SLOPE_CUBIC), _mm256_mul_ps(x, x), _mm256_set1_ps(GELU_SLOPE_LINEAR));
        __m256 grad = _mm256_fmadd_ps(_mm256_mul_ps(x, _mm256_fnmadd_ps(s, s, s)), slope, s);
        _mm256_storeu_ps(dinp + i, _mm256_fmadd_ps(grad, _mm256_loadu_ps(dout + i), _mm256_loadu_ps(dinp + i)));
    }
#endif
    for (; i < n; i++) { dinp[i] = fmaf(gelu_grad_elem(inp[i]), dout[i], dinp[i]); }
}

#endif // CPU_GELU_H
