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

// exp(x) for x in [EXP_VEC_MIN, EXP_VEC_MAX]
static inline float exp_vec(float x) {
    float n = rintf(x * EXP_LOG2E);
    float r = x - n * EXP_LN2_HI - n * EXP_LN2_LO;
    float p = 1.9875691500e-4f;    // Cephes expf: exp(r) = 1 + r + r^2 (p(r)) on |r| <= ln2/2
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + FLOAT_EXPONENT_BIAS) << FLOAT_MANTISSA_BITS;  // 2^n
    float two_n;
    memcpy(&two_n, &bits, sizeof(two_n));
    return p * two_n;
}

// x clamped to [lo, hi]; a NaN stays NaN (fminf and fmaxf do not vectorize: they must drop a NaN)
static inline float clamp_vec(float x, float lo, float hi) {
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}

#endif // CPU_VECMATH_H
