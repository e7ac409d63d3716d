/*
vecmath.h: exp as straight-line float arithmetic, so that a loop calling it vectorizes (libm's expf is
a call the compiler cannot widen). The CPU's per-element kernels that need an exponential use it (the
GELU: cpu/gelu.h; the softmaxes of the attention and the classifier: cpu/layers.h) and run at memory
speed instead of one libm call per element.

    float y = exp_vec(x);       // x in [EXP_VEC_MIN, EXP_VEC_MAX] (clamp first), within 1.01 ulp of exp
    __m512 y = exp_vec16(x);    // the same, 16 lanes (AVX-512); exp_vec8: 8 lanes (AVX2 with FMA)
    transpose8_vec8(v);         // an 8 x 8 block of floats in 8 AVX2 vectors, transposed in registers

How (Cody and Waite's reduction, Cephes' expf polynomial): x = n ln2 + r with n = round(x / ln2) and
|r| <= ln2/2, r taken in two steps (ln2 = EXP_LN2_HI + EXP_LN2_LO, EXP_LN2_HI exact in few bits, so
n * EXP_LN2_HI is exact); exp(r) by a degree-7 polynomial, every step a fused multiply-add (fmaf: one
rounding where a multiplication and an addition round twice); 2^n written into the float's exponent
bits. Measured against double exp over [-87, 88] in steps of 1e-4: at most 1.01 ulp. No branch, no call.

The vector versions mirror exp_vec one operation for one (an FMA is the same single rounding in every
lane as fmaf; AVX-512's scalef multiplies by the same exact 2^n), so each lane gives bitwise what exp_vec
gives for its x, on every machine: a loop's vector body and its scalar tail agree, and an AVX-512 machine
computes what an AVX2 one does (test_gpt checks both on a sweep of inputs). Machines without FMA
compute fmaf in software: slower, the same bits.
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
    float r = fmaf(n, -EXP_LN2_HI, x);
    r = fmaf(n, -EXP_LN2_LO, r);
    float p = EXP_P0;
    p = fmaf(p, r, EXP_P1);
    p = fmaf(p, r, EXP_P2);
    p = fmaf(p, r, EXP_P3);
    p = fmaf(p, r, EXP_P4);
    p = fmaf(p, r, EXP_P5);
    p = fmaf(p, r * r, r) + 1.0f;
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

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX2__)
#define VEC8 8   // floats in an AVX2 vector

// an 8 x 8 block transposed in registers: on entry v[r] holds row r, on return v[k] lane r holds row r's
// element k (the classic 24 shuffles; exact, so any machine with AVX2 gives the same)
static inline void transpose8_vec8(__m256 v[VEC8]) {
    __m256 t[VEC8], u[VEC8];
    for (int i = 0; i < VEC8; i += 2) {  // interleave row pairs: t[i] = a0 b0 a1 b1 | a4 b4 a5 b5
        t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
    }
    for (int i = 0; i < VEC8; i += 4) {  // then pairs of pairs: u[i] = a0 b0 c0 d0 | a4 b4 c4 d4
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) {        // then the 128-bit halves: rows 0-3 beside rows 4-7
        v[k] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20);
        v[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
    }
}
#endif

#if defined(__AVX512F__)
#define VEC16 16   // floats in an AVX-512 vector

// exp_vec on 16 lanes: each lane bitwise exp_vec of its x (scalef: p 2^n, exact as exp_vec's product is)
static inline __m512 exp_vec16(__m512 x) {
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)), _MM_FROUND_CUR_DIRECTION);  // rintf
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// clamp_vec on 16 lanes: max(lo, x) returns x when x is NaN, as x < lo ? lo : x does; min likewise
static inline __m512 clamp_vec16(__m512 x, float lo, float hi) {
    return _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), x));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// exp_vec on 8 lanes: each lane bitwise exp_vec of its x
static inline __m256 exp_vec8(__m256 x) {
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)), _MM_FROUND_CUR_DIRECTION);  // rintf
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(FLOAT_EXPONENT_BIAS)),
                                     FLOAT_MANTISSA_BITS);  // 2^n (n is whole: truncating it is (int32_t)n)
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// clamp_vec on 8 lanes
static inline __m256 clamp_vec8(__m256 x, float lo, float hi) {
    return _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), x));
}
#endif

#endif // CPU_VECMATH_H
