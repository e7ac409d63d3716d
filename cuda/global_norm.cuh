/*
global_norm.cuh: the sum of squares of the gradients on the device, in double, deterministic: the
device counterpart of the CPU trainer's gradient norm (train_gpt.c gpt2_grad_norm, opt_sum_squares
of cpu/optimizers.h).

    double* scratch;  // global_norm_scratch_doubles(n) doubles
    global_norm_squared_cuda(d_total, grads, n, scratch, stream);   // *d_total = sum of grads[i]^2
    // copy d_total to the host (or keep it on the device for clipping) and take sqrt there

Invariants: the partition is fixed by n alone (GLOBAL_NORM_BLOCK threads per block, at most
GLOBAL_NORM_MAX_BLOCKS blocks, each thread a fixed grid-stride set of 4-float packs); each thread
sums in double, a block's threads are added by a fixed tree, and a second kernel adds the blocks
in order. So the result is bitwise the same run after run and on any GPU (not bitwise the CPU's:
its partition differs; they agree to double rounding). The result stays in device memory (*out
written, =), so the caller can clip without a round trip.
*/
#ifndef CUDA_GLOBAL_NORM_CUH
#define CUDA_GLOBAL_NORM_CUH

#include "common.cuh"

#define GLOBAL_NORM_BLOCK 256
#define GLOBAL_NORM_MAX_BLOCKS 1024  // about two waves of an H100's 132 SMs

// ----------------------------------------------------------------------------
// CUDA kernels

// the block's sum over its threads of x^2 in double: butterflies within warps, then the warps in order
__device__ inline double block_sum_double(double s) {
    __shared__ double warp_sums[GLOBAL_NORM_BLOCK / WARP_SIZE];
    s = warp_reduce_sum(s);
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) { warp_sums[warp] = s; }
    __syncthreads();
    double total = 0.0;
    if (threadIdx.x == 0) {
        for (int w = 0; w < (int)(blockDim.x / WARP_SIZE); w++) { total += warp_sums[w]; }
    }
    return total;  // in thread 0
}

// partials (gridDim.x) = each block's sum of x (n)^2, in double. bytes: 4 n; FLOPs: 2 n (double)
static __global__ void global_norm_partials_kernel(double* partials, const float* x, size_t n, bool vector) {
    const int VEC = Packed128<float>::size;
    double s = 0.0;
    size_t stride = (size_t)gridDim.x * blockDim.x * VEC;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n; i += stride) {
        Packed128<float> p = load_pack(x, i, n, vector);  // zeros past n
        for (int k = 0; k < VEC; k++) { s += (double)p[k] * p[k]; }
    }
    double total = block_sum_double(s);
    if (threadIdx.x == 0) { partials[blockIdx.x] = total; }
}

// *out = sum of partials (parts), one block, each thread a fixed stride of parts
static __global__ void global_norm_total_kernel(double* out, const double* partials, int parts) {
    double s = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) { s += partials[i]; }
    double total = block_sum_double(s);
    if (threadIdx.x == 0) { *out = total; }
}

// ----------------------------------------------------------------------------
// kernel launchers

static int global_norm_blocks(size_t n) {
    size_t blocks = ceil_div(ceil_div(n, (size_t)Packed128<float>::size), (size_t)GLOBAL_NORM_BLOCK);
    return blocks < 1 ? 1 : (blocks > GLOBAL_NORM_MAX_BLOCKS ? GLOBAL_NORM_MAX_BLOCKS : (int)blocks);
}

// the scratch global_norm_squared_cuda needs: one double per block
static size_t global_norm_scratch_doubles(size_t n) { return (size_t)global_norm_blocks(n); }

// *out (one double, device memory) = sum over x (n) of x^2; scratch: global_norm_scratch_doubles(n)
static void global_norm_squared_cuda(double* out, const float* x, size_t n, double* scratch, cudaStream_t stream) {
    int blocks = global_norm_blocks(n);
    global_norm_partials_kernel<<<blocks, GLOBAL_NORM_BLOCK, 0, stream>>>(scratch, x, n, is_aligned16(x));
    CUDA_CHECK_LAUNCH();
    global_norm_total_kernel<<<1, GLOBAL_NORM_BLOCK, 0, stream>>>(out, scratch, blocks);
    CUDA_CHECK_LAUNCH();
}

#endif // CUDA_GLOBAL_NORM_CUH
