/*
gelu.cuh: GELU (tanh approximation) on the device, mirroring gelu_forward/backward of cpu/layers.h.

    gelu_forward_cuda<floatX>(out, inp, N, stream);          // out = gelu(inp)
    gelu_backward_cuda<floatX>(dinp, inp, dout, N, stream);  // dinp += gelu'(inp) * dout
    gelu_backward_inplace_cuda<floatX>(d, inp, N, stream);     // d = gelu'(inp) * d (dout in, dinp out)

Invariants: elementwise, one thread per 16-byte pack (4 fp32 or 8 bf16 values), the same formula
and constants (GELU_SCALE, GELU_CUBIC of llmc/model_config.h) computed in fp32. Any N and any pointer
alignment (a tail or unaligned buffers are read element by element). out may equal inp; dinp and
dout of gelu_backward_cuda must be distinct buffers, as on the CPU. gelu_backward_inplace_cuda is
the fc-projection GEMM's fallback (cuda/matmul.cuh) where cuBLASLt refuses its DGELU epilogue.
*/
#ifndef CUDA_GELU_CUH
#define CUDA_GELU_CUH

#include "common.cuh"
#include "profile.cuh"  // --profile: a launcher marks its range on the compute stream (prof_kernel)
#include "../llmc/model_config.h"  // GELU_SCALE, GELU_CUBIC: the model's, one set for both backends

#define GELU_THREADS 256

// ----------------------------------------------------------------------------
// CUDA kernels

// out (N) = 0.5 x (1 + tanh(GELU_SCALE (x + GELU_CUBIC x^3))), x = inp (N).
// bytes: 2 N floatX; FLOPs: about 10 N plus N tanh
template <typename floatX>
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t N, bool vector) {
    const int VEC = Packed128<floatX>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= N) { return; }
    Packed128<floatX> x = load_pack(inp, i, N, vector), o;
    for (int k = 0; k < VEC; k++) {
        float xk = to_float(x[k]);
        o[k] = from_float<floatX>(0.5f * xk * (1.0f + tanhf(GELU_SCALE * (xk + GELU_CUBIC * xk * xk * xk))));
    }
    store_pack(out, i, N, vector, o);
}

// gelu'(x), the derivative of the forward kernel's formula (cpu/layers.h's gelu_backward, term for term)
__device__ inline float gelu_grad(float x) {
    float u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
}

// dinp (N) += gelu'(inp (N)) * dout (N). bytes: 4 N floatX; FLOPs: about 20 N plus N tanh
template <typename floatX>
__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N, bool vector) {
    const int VEC = Packed128<floatX>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= N) { return; }
    Packed128<floatX> x = load_pack(inp, i, N, vector), dy = load_pack(dout, i, N, vector);
    Packed128<floatX> dx = load_pack(dinp, i, N, vector);
    for (int k = 0; k < VEC; k++) {
        dx[k] = from_float<floatX>(to_float(dx[k]) + gelu_grad(to_float(x[k])) * to_float(dy[k]));
    }
    store_pack(dinp, i, N, vector, dx);
}

// d (N) = gelu'(inp (N)) * d (N): dout in, dinp out. bytes: 3 N floatX; FLOPs: about 20 N plus N tanh
template <typename floatX>
__global__ void gelu_backward_inplace_kernel(floatX* d, const floatX* inp, size_t N, bool vector) {
    const int VEC = Packed128<floatX>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= N) { return; }
    Packed128<floatX> x = load_pack(inp, i, N, vector), dy = load_pack(d, i, N, vector);
    for (int k = 0; k < VEC; k++) { dy[k] = from_float<floatX>(gelu_grad(to_float(x[k])) * to_float(dy[k])); }
    store_pack(d, i, N, vector, dy);
}

// ----------------------------------------------------------------------------
// kernel launchers

// out (N) = gelu(inp (N))
template <typename floatX>
void gelu_forward_cuda(floatX* out, const floatX* inp, size_t N, cudaStream_t stream) {
    prof_kernel(stream, PROF_GELU, prof_gelu_forward(N, sizeof(floatX)), "forward");
    if (N == 0) { return; }
    const size_t VEC = Packed128<floatX>::size;
    bool vector = is_aligned16(out) && is_aligned16(inp);
    size_t blocks = ceil_div(ceil_div(N, VEC), (size_t)GELU_THREADS);
    gelu_forward_kernel<floatX><<<(unsigned)blocks, GELU_THREADS, 0, stream>>>(out, inp, N, vector);
    CUDA_CHECK_LAUNCH();
}

// dinp (N) += gelu'(inp) * dout; dinp and dout must be distinct buffers
template <typename floatX>
void gelu_backward_cuda(floatX* dinp, const floatX* inp, const floatX* dout, size_t N, cudaStream_t stream) {
    prof_kernel(stream, PROF_GELU, prof_gelu_backward(N, sizeof(floatX)), "backward");
    if (N == 0) { return; }
    const size_t VEC = Packed128<floatX>::size;
    bool vector = is_aligned16(dinp) && is_aligned16(inp) && is_aligned16(dout);
    size_t blocks = ceil_div(ceil_div(N, VEC), (size_t)GELU_THREADS);
    gelu_backward_kernel<floatX><<<(unsigned)blocks, GELU_THREADS, 0, stream>>>(dinp, inp, dout, N, vector);
    CUDA_CHECK_LAUNCH();
}

// d (N) = gelu'(inp) * d: d holds dout on entry and dinp on exit (= where gelu_backward_cuda adds)
template <typename floatX>
void gelu_backward_inplace_cuda(floatX* d, const floatX* inp, size_t N, cudaStream_t stream) {
    if (N == 0) { return; }
    const size_t VEC = Packed128<floatX>::size;
    bool vector = is_aligned16(d) && is_aligned16(inp);
    size_t blocks = ceil_div(ceil_div(N, VEC), (size_t)GELU_THREADS);
    gelu_backward_inplace_kernel<floatX><<<(unsigned)blocks, GELU_THREADS, 0, stream>>>(d, inp, N, vector);
    CUDA_CHECK_LAUNCH();
}

#endif // CUDA_GELU_CUH
