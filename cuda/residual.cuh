/*
residual.cuh: the residual connection on the device, mirroring residual_forward of cpu/layers.h.

    residual_forward_cuda<floatX>(out, a, b, N, stream);   // out = a + b

Invariants: elementwise, one thread per 16-byte pack, the sum in fp32 rounded once. Any N and any
pointer alignment; out may equal a or b. (Its backward is two += of the same gradient, which the
caller does by passing one gradient buffer to both branches, as on the CPU.)
*/
#ifndef CUDA_RESIDUAL_CUH
#define CUDA_RESIDUAL_CUH

#include "common.cuh"
#include "profile.cuh"  // --profile: a launcher marks its range on the compute stream (prof_kernel)

#define RESIDUAL_BLOCK 256

// ----------------------------------------------------------------------------
// CUDA kernels

// out (N) = a (N) + b (N). bytes: 3 N floatX; FLOPs: N
template <typename floatX>
__global__ void residual_forward_kernel(floatX* out, const floatX* a, const floatX* b, size_t N, bool vector) {
    const int VEC = Packed128<floatX>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= N) { return; }
    Packed128<floatX> ap = load_pack(a, i, N, vector), bp = load_pack(b, i, N, vector), o;
    for (int k = 0; k < VEC; k++) { o[k] = from_float<floatX>(to_float(ap[k]) + to_float(bp[k])); }
    store_pack(out, i, N, vector, o);
}

// ----------------------------------------------------------------------------
// kernel launchers

// out (N) = a (N) + b (N)
template <typename floatX>
void residual_forward_cuda(floatX* out, const floatX* a, const floatX* b, size_t N, cudaStream_t stream) {
    prof_kernel(stream, PROF_RESIDUAL, prof_residual_forward(N, sizeof(floatX)), "forward");
    if (N == 0) { return; }
    const size_t VEC = Packed128<floatX>::size;
    bool vector = is_aligned16(out) && is_aligned16(a) && is_aligned16(b);
    size_t blocks = ceil_div(ceil_div(N, VEC), (size_t)RESIDUAL_BLOCK);
    residual_forward_kernel<floatX><<<(unsigned)blocks, RESIDUAL_BLOCK, 0, stream>>>(out, a, b, N, vector);
    CUDA_CHECK_LAUNCH();
}

#endif // CUDA_RESIDUAL_CUH
