/*
scale.cuh: x *= s over an fp32 vector: the gradient clipping before the optimizer step, as
train_gpt.c's gpt2_update scales the gradients by clip / norm.

    scale_cuda(grads, 0.5f, n, stream);
*/
#ifndef CUDA_SCALE_CUH
#define CUDA_SCALE_CUH

#include "common.cuh"

#define SCALE_BLOCK 256

// x (n) *= s, a grid-stride loop; bytes: 8n, FLOPs: n
__global__ void scale_kernel(float* x, float s, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) { x[i] *= s; }
}

static void scale_cuda(float* x, float s, size_t n, cudaStream_t stream) {
    if (n == 0) { return; }
    int device, sms;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    size_t blocks = ceil_div(n, (size_t)SCALE_BLOCK), most = (size_t)sms * 8;  // enough blocks to fill every SM
    scale_kernel<<<(unsigned)(blocks < most ? blocks : most), SCALE_BLOCK, 0, stream>>>(x, s, n);
    CUDA_CHECK_LAUNCH();
}

#endif // CUDA_SCALE_CUH
