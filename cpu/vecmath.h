/*
vecmath.h: exp as straight-line float arithmetic, so that a loop calling it vectorizes (libm's expf is
a call the compiler cannot widen). The CPU's per-element kernels that need an exponential use it
(GELU: cpu/layers.h), and run at memory speed instead of one libm call per element.

    float y = exp_vec(x);   // x in [EXP_VEC_MIN, EXP_VEC_MAX] (clamp first), within 1.5 ulp of exp

How (Cody and Waite's reduction, Cephes' expf polynomial): x = n ln2 + r with n = round(x / ln2) and
|r| <= ln2/2, r taken in two steps (ln2 = EXP_LN2_HI + EXP_LN2_LO, EXP_LN2_HI exact in few bits, so
n * EXP_LN2_HI is exact); exp(r) by a degree-7 polynomial; 2^n written into the float's exponent bits.
Measured against double exp over [-87, 88] in steps of 1e-4: at most 1.40 ulp. No branch, no call:
with -fno-math-errno and -fno-trapping-math (the Makefile's) gcc vectorizes it with AVX2 or AVX-512.
The result is a function of x alone (the same operations in every lane and in a scalar tail), so a
vectorized loop gives bitwise what a scalar one does.

With AVX2, exp_vec8 and clamp_vec8 are the same operations written on 8 lanes, for the loops whose
vectorization gcc spoils (it turns a clamp before a product into compares and blends: GELU's, cpu/gelu.h).
They mirror exp_vec one operation for one, no fused multiply-add (the Makefile's -std=c11 contracts none),
so they are bitwise exp_vec; test_gpt checks it on a sweep of inputs.
*/
#ifndef CPU_VECMATH_H
#define CPU_VECMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define EXP_VEC_MIN (-87.0f)       // 2^n stays a normal float: n >= -126
#define EXP_VEC_MAX 88.0f          // exp(88) = 1.65e38 < FLT_MAX
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f    // 355/512: n * EXP_LN2_HI is exact for |n| < 2^15
#define EXP_LN2_LO (-2.12194440e-4f)
#define FLOAT_EXPONENT_BIAS 127
#define FLOAT_MANTISSA_BITS 23

// Cephes expf's polynomial: exp(r) = 1 + r + r^2 p(r) on |r| <= ln2/2, p's coefficients from the highest power
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

// exp(x) for x in [EXP_VEC_MIN, EXP_VEC_MAX]
static inline float exp_vec(float x) {
    float n = rintf(x * EXP_LOG2E);
    float r = x - n * EXP_LN2_HI - n * EXP_LN2_LO;
    float p = EXP_P0;
    p = p * r + EXP_P1;
    p = p * r + EXP_P2;
    p = p * r + EXP_P3;
    p = p * r + EXP_P4;
    p = p * r + EXP_P5;
    p = p * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + FLOAT_EXPONENT_BIAS) << FLOAT_MANTISSA_BITS;  // 2^n (unsigned: out of range, as a NaN's n, shifts no sign bit: no UB)
    float two_n;
    memcpy(&two_n, &bits, sizeof(two_n));
    return p * two_n;
}

// x clamped to [lo, hi]; a NaN stays NaN (fminf and fmaxf do not vectorize: they must drop a NaN)
static inline float clamp_vec(float x, float lo, float hi) {
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}

#if defined(__AVX2__)
#include <immintrin.h>
#define VEC8 8   // floats in an AVX2 vector

// exp_vec on 8 lanes: each lane bitwise exp_vec of its x
static inline __m256 exp_vec8(__m256 x) {
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)), _MM_FROUND_CUR_DIRECTION);  // rintf
    __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(EXP_LN2_HI))),
                             _mm256_mul_ps(n, _mm256_set1_ps(EXP_LN2_LO)));
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P1));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P2));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P3));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P4));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_P5));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(FLOAT_EXPONENT_BIAS)),
                                     FLOAT_MANTISSA_BITS);  // 2^n (n is whole: truncating it is (int32_t)n)
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// clamp_vec on 8 lanes: max(lo, x) returns x when x is NaN, as x < lo ? lo : x does; min likewise
static inline __m256 clamp_vec8(__m256 x, float lo, float hi) {
    return _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), x));
}
#endif

#endif // CPU_VECMATH_H
