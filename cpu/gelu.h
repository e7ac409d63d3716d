/*
gelu.h: GELU of one element and its derivative, the one definition that the CPU's layers
(cpu/layers.h: gelu_forward, gelu_backward) and the emulated device's cuBLASLt GELU epilogues
(dev/cuda_emu/emu_blas.cpp) share, so the emulator's fused GEMM + GELU gives what the CPU does.

    float y = gelu_elem(x);       // 0.5 x (1 + tanh(u)), u = GELU_SCALE (x + GELU_CUBIC x^3)
    float d = gelu_grad_elem(x);  // d gelu / dx

Computed as what it equals, x sigmoid(2u) = x / (1 + exp(-2u)): no 1 + tanh(u) that cancels where x is
very negative (within 6.5e-7 of fp64, 1e-6 absolute near 0), and an exp that vectorizes (vecmath.h),
so a loop of these runs at memory speed. (GELU_SCALE and GELU_CUBIC: llmc/model_config.h.)
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

#endif // CPU_GELU_H
