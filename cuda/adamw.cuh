/*
adamw.cuh: the AdamW update on the device, mirroring adamw_update of cpu/optimizers.h, and the copy
of the fp32 master weights into the working weights of the storage type.

    adamw_update_cuda(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t, stream);  // t = 1, 2, ...
    copy_to_floatX_cuda<floatX>(weights, params, n, stream);   // working weights = master, rounded

Invariants: params, grads, m, v are fp32 (master weights and optimizer state, the layout of
llmc/opt_layout.h: m and v are where the caller points, slice by slice, as on the CPU). The update
does the CPU's operations in the CPU's order with the bias corrections computed on the host by the
same powf, and never fuses a multiply and an add (__fmul_rn, __fadd_rn: the CPU reference is
built without contraction, -std=c11), so its results are bitwise those of cpu/optimizers.h. Any n
and any alignment (16-byte packs where the pointers allow).
*/
#ifndef CUDA_ADAMW_CUH
#define CUDA_ADAMW_CUH

#include <math.h>
#include "common.cuh"

#define ADAMW_BLOCK 256
#define COPY_BLOCK 256

// ----------------------------------------------------------------------------
// CUDA kernels

// for each of the n entries, as cpu adamw_update (no fused multiply-adds):
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g g
//   p -= lr ((m / bc1) / (sqrt(v / bc2) + eps) + weight_decay p)
// one thread per pack of 4. bytes: 7 n fp32 (p, g, m, v read; p, m, v written); FLOPs: about 16 n
static __global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float bc1, float bc2, bool vector) {
    const int VEC = Packed128<float>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= n) { return; }
    Packed128<float> p = load_pack(params, i, n, vector), g = load_pack(grads, i, n, vector);
    Packed128<float> mp = load_pack(m, i, n, vector), vp = load_pack(v, i, n, vector);
    for (int k = 0; k < VEC; k++) {
        float mi = __fadd_rn(__fmul_rn(beta1, mp[k]), __fmul_rn(1.0f - beta1, g[k]));
        float vi = __fadd_rn(__fmul_rn(beta2, vp[k]), __fmul_rn(__fmul_rn(1.0f - beta2, g[k]), g[k]));
        mp[k] = mi;
        vp[k] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        float update = __fadd_rn(mhat / (sqrtf(vhat) + eps), __fmul_rn(weight_decay, p[k]));
        p[k] = __fadd_rn(p[k], -__fmul_rn(lr, update));
    }
    store_pack(params, i, n, vector, p);
    store_pack(m, i, n, vector, mp);
    store_pack(v, i, n, vector, vp);
}

// dst (n) = src (n) in floatX, rounded to nearest-even; one thread per 16-byte pack of dst.
// bytes: n fp32 + n floatX; FLOPs: none
template <typename floatX>
__global__ void copy_to_floatX_kernel(floatX* dst, const float* src, size_t n, bool vector) {
    const int VEC = Packed128<floatX>::size, FVEC = Packed128<float>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= n) { return; }
    Packed128<floatX> out;
    for (int j = 0; j < VEC; j += FVEC) {
        Packed128<float> f = load_pack(src, i + j, n, vector);
        for (int k = 0; k < FVEC; k++) { out[j + k] = from_float<floatX>(f[k]); }
    }
    store_pack(dst, i, n, vector, out);
}

// ----------------------------------------------------------------------------
// kernel launchers

// AdamW (Loshchilov & Hutter), bias-corrected, decoupled weight decay; t is the step number
// starting at 1. For each of the n entries:
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   p -= lr * ( (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * p )
static void adamw_update_cuda(float* params, const float* grads, float* m, float* v, size_t n, float lr, float beta1,
                              float beta2, float eps, float weight_decay, int t, cudaStream_t stream) {
    if (n == 0) { return; }
    float bc1 = 1.0f - powf(beta1, (float)t);  // on the host, as the CPU computes them
    float bc2 = 1.0f - powf(beta2, (float)t);
    bool vector = is_aligned16(params) && is_aligned16(grads) && is_aligned16(m) && is_aligned16(v);
    size_t blocks = ceil_div(ceil_div(n, (size_t)Packed128<float>::size), (size_t)ADAMW_BLOCK);
    adamw_kernel<<<(unsigned)blocks, ADAMW_BLOCK, 0, stream>>>(params, grads, m, v, n, lr, beta1, beta2, eps,
                                                              weight_decay, bc1, bc2, vector);
    CUDA_CHECK_LAUNCH();
}

// dst (n) = src (n): master fp32 weights into the working weights, rounded to nearest-even
template <typename floatX>
void copy_to_floatX_cuda(floatX* dst, const float* src, size_t n, cudaStream_t stream) {
    if (n == 0) { return; }
    bool vector = is_aligned16(dst) && is_aligned16(src);
    size_t blocks = ceil_div(ceil_div(n, (size_t)Packed128<floatX>::size), (size_t)COPY_BLOCK);
    copy_to_floatX_kernel<floatX><<<(unsigned)blocks, COPY_BLOCK, 0, stream>>>(dst, src, n, vector);
    CUDA_CHECK_LAUNCH();
}

#endif // CUDA_ADAMW_CUH
