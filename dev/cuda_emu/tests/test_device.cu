/*
test_device.cu: the execution model, checked on small kernels whose answers are known in closed form:
shared-memory reductions with barriers (up to 1024 threads), every warp shuffle with every width,
votes, __syncwarp, atomics across blocks (integer, float, and a float add written with atomicCAS),
dynamic shared memory (also above 48 KiB after opting in), early returns, 2D/3D indices, and
__syncthreads_count. Ordinary CUDA: nvcc builds it too (make emu-nvcc-check).
*/
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include <vector>
#include "check.h"

static const unsigned FULL_MASK = 0xffffffffu;
static const int WARP = 32;

// ----------------------------------------------------------------------------
// kernels

// out[blockIdx.x] = sum of the block's slice of x, by a shared-memory tree (blockDim.x a power of 2)
__global__ void block_sum_kernel(float* out, const float* x) {
    extern __shared__ float partial[];
    int t = threadIdx.x;
    partial[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) { partial[t] += partial[t + stride]; }
        __syncthreads();
    }
    if (t == 0) { out[blockIdx.x] = partial[0]; }
}

// the same with a static __shared__ array and a warp-shuffle finish (blockDim.x == 256)
__global__ void block_sum_static_kernel(float* out, const float* x) {
    __shared__ float warp_sums[8];
    int t = threadIdx.x;
    float v = x[blockIdx.x * blockDim.x + t];
    for (int offset = 16; offset > 0; offset /= 2) { v += __shfl_down_sync(FULL_MASK, v, offset); }
    if (t % WARP == 0) { warp_sums[t / WARP] = v; }
    __syncthreads();
    if (t < WARP) {
        float w = t < 8 ? warp_sums[t] : 0.0f;
        for (int offset = 16; offset > 0; offset /= 2) { w += __shfl_xor_sync(FULL_MASK, w, offset); }
        if (t == 0) { out[blockIdx.x] = w; }
    }
}

enum shuffle_kind { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };

// out[t] = the shuffle of value (1000 + t) from the lane the kind, arg and width select
__global__ void shuffle_kernel(int* out, int kind, int arg, int width) {
    int v = 1000 + (int)threadIdx.x;
    int r = 0;
    switch (kind) {
        case SHFL_IDX: r = __shfl_sync(FULL_MASK, v, arg, width); break;
        case SHFL_UP: r = __shfl_up_sync(FULL_MASK, v, arg, width); break;
        case SHFL_DOWN: r = __shfl_down_sync(FULL_MASK, v, arg, width); break;
        case SHFL_XOR: r = __shfl_xor_sync(FULL_MASK, v, arg, width); break;
    }
    out[threadIdx.x] = r;
}

// votes over "lane is a multiple of 3" and "lane < 32", plus a __syncwarp between
__global__ void vote_kernel(unsigned* out) {
    int lane = threadIdx.x % WARP;
    unsigned ballot = __ballot_sync(FULL_MASK, lane % 3 == 0);
    __syncwarp();
    int any = __any_sync(FULL_MASK, lane == 7);
    int all = __all_sync(FULL_MASK, lane < 32);
    int none = __any_sync(FULL_MASK, lane > 40);
    if (threadIdx.x == 0) {
        out[0] = ballot;
        out[1] = any;
        out[2] = all;
        out[3] = none;
    }
}

// a float add built from atomicCAS, as code for older GPUs writes it
__device__ float atomic_add_by_cas(float* address, float v) {
    unsigned* bits = (unsigned*)address;
    unsigned old = *bits, assumed;
    do {
        assumed = old;
        old = atomicCAS(bits, assumed, __float_as_uint(v + __uint_as_float(assumed)));
    } while (assumed != old);
    return __uint_as_float(old);
}

__global__ void atomics_kernel(int* count, float* sum, float* sum_cas, int* max_index) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(count, 1);
    atomicAdd(sum, 0.5f);
    atomic_add_by_cas(sum_cas, 0.25f);
    atomicMax(max_index, i);
}

// threads past n return at once; no barrier follows, so that is allowed
__global__ void early_return_kernel(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    out[i] = 2.0f * i;
}

// out[linear index] = the flattened (block, thread) coordinates
__global__ void indices_kernel(int* out) {
    int tx = threadIdx.x, ty = threadIdx.y, tz = threadIdx.z;
    int threads_per_block = blockDim.x * blockDim.y * blockDim.z;
    int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int thread = tx + blockDim.x * (ty + blockDim.y * tz);
    out[block * threads_per_block + thread] = block * 10000 + thread;
}

// __syncthreads_count of "thread index is even"
__global__ void barrier_count_kernel(int* out) {
    int n = __syncthreads_count(threadIdx.x % 2 == 0);
    if (threadIdx.x == 0) { out[blockIdx.x] = n; }
}

// every thread writes, then reads its mirror across a barrier: needs the whole dynamic buffer
__global__ void big_shared_kernel(float* out, int n) {
    extern __shared__ float buffer[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) { buffer[i] = (float)i; }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) { out[i] = buffer[n - 1 - i]; }
}

// ----------------------------------------------------------------------------
// checks

static void test_block_sums() {
    const int blocks = 3;
    for (int threads : {32, 256, 1024}) {
        int n = blocks * threads;
        std::vector<float> x(n), out(blocks);
        for (int i = 0; i < n; i++) { x[i] = (float)(i % 7); }
        float *d_x, *d_out;
        CUDA_CHECK(cudaMalloc(&d_x, n * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&d_out, blocks * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(d_x, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        block_sum_kernel<<<blocks, threads, threads * sizeof(float)>>>(d_out, d_x);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaMemcpy(out.data(), d_out, blocks * sizeof(float), cudaMemcpyDeviceToHost));
        bool ok = true;
        for (int b = 0; b < blocks; b++) {
            float expect = 0.0f;
            for (int i = 0; i < threads; i++) { expect += x[b * threads + i]; }
            ok = ok && out[b] == expect;
        }
        char name[96];
        snprintf(name, sizeof name, "shared-memory tree reduction, %d threads per block", threads);
        check(ok, name, "block 0 sum %g", out[0]);
        CUDA_CHECK(cudaFree(d_x));
        CUDA_CHECK(cudaFree(d_out));
    }

    const int threads = 256;
    std::vector<float> x(blocks * threads), out(blocks);
    fill_uniform(x.data(), x.size(), 1);
    for (float& v : x) { v = roundf(v * 64.0f); }  // integers: every summation order is exact
    float *d_x, *d_out;
    CUDA_CHECK(cudaMalloc(&d_x, x.size() * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_out, blocks * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_x, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    block_sum_static_kernel<<<blocks, threads>>>(d_out, d_x);
    CUDA_CHECK(cudaMemcpy(out.data(), d_out, blocks * sizeof(float), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int b = 0; b < blocks; b++) {
        float expect = 0.0f;
        for (int i = 0; i < threads; i++) { expect += x[b * threads + i]; }
        ok = ok && out[b] == expect;
    }
    check(ok, "static __shared__ + __shfl_down/__shfl_xor reduction, 3 blocks");
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_out));
}

// what lane `lane` must receive, from the CUDA programming guide's definitions
static int expected_shuffle(int kind, int lane, int arg, int width) {
    int segment = lane / width * width;
    int src = lane;
    switch (kind) {
        case SHFL_IDX: src = segment + arg % width; break;
        case SHFL_UP: src = (lane - segment) - arg >= 0 ? lane - arg : lane; break;
        case SHFL_DOWN: src = (lane - segment) + arg < width ? lane + arg : lane; break;
        case SHFL_XOR: src = (lane ^ arg) < segment + width ? (lane ^ arg) : lane; break;
    }
    return 1000 + src;
}

static void test_shuffles() {
    const char* names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync"};
    int* d_out;
    CUDA_CHECK(cudaMalloc(&d_out, WARP * sizeof(int)));
    for (int kind = SHFL_IDX; kind <= SHFL_XOR; kind++) {
        for (int width : {32, 16, 8, 4}) {
            bool ok = true;
            char detail[128] = "";
            for (int arg : {0, 1, 3, 5, 17}) {
                shuffle_kernel<<<1, WARP>>>(d_out, kind, arg, width);
                int out[WARP];
                CUDA_CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
                for (int lane = 0; lane < WARP; lane++) {
                    int e = expected_shuffle(kind, lane, arg, width);
                    if (out[lane] != e && ok) {
                        ok = false;
                        snprintf(detail, sizeof detail, "arg %d lane %d got %d want %d", arg, lane, out[lane], e);
                    }
                }
            }
            char name[96];
            snprintf(name, sizeof name, "%s width %d", names[kind], width);
            check(ok, name, "%s", detail);
        }
    }
    CUDA_CHECK(cudaFree(d_out));
}

static void test_votes() {
    unsigned* d_out;
    CUDA_CHECK(cudaMalloc(&d_out, 4 * sizeof(unsigned)));
    vote_kernel<<<1, WARP>>>(d_out);
    unsigned out[4];
    CUDA_CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    unsigned expect_ballot = 0;
    for (int lane = 0; lane < WARP; lane += 3) { expect_ballot |= 1u << lane; }
    check(out[0] == expect_ballot, "__ballot_sync", "got %08x want %08x", out[0], expect_ballot);
    check(out[1] == 1 && out[3] == 0, "__any_sync", "got %u and %u", out[1], out[3]);
    check(out[2] == 1, "__all_sync + __syncwarp", "got %u", out[2]);
    CUDA_CHECK(cudaFree(d_out));
}

static void test_atomics() {
    const int blocks = 7, threads = 96;
    int *d_count, *d_max;
    float *d_sum, *d_sum_cas;
    CUDA_CHECK(cudaMalloc(&d_count, sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_max, sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_sum, sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_sum_cas, sizeof(float)));
    CUDA_CHECK(cudaMemset(d_count, 0, sizeof(int)));
    CUDA_CHECK(cudaMemset(d_max, 0, sizeof(int)));
    CUDA_CHECK(cudaMemset(d_sum, 0, sizeof(float)));
    CUDA_CHECK(cudaMemset(d_sum_cas, 0, sizeof(float)));
    atomics_kernel<<<blocks, threads>>>(d_count, d_sum, d_sum_cas, d_max);
    int count, max_index;
    float sum, sum_cas;
    CUDA_CHECK(cudaMemcpy(&count, d_count, sizeof count, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&max_index, d_max, sizeof max_index, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&sum_cas, d_sum_cas, sizeof sum_cas, cudaMemcpyDeviceToHost));
    int n = blocks * threads;
    check(count == n, "atomicAdd(int) across blocks", "count %d want %d", count, n);
    check(sum == 0.5f * n, "atomicAdd(float) across blocks", "sum %g want %g", sum, 0.5f * n);
    check(sum_cas == 0.25f * n, "float add by atomicCAS across blocks", "sum %g want %g", sum_cas, 0.25f * n);
    check(max_index == n - 1, "atomicMax across blocks", "max %d want %d", max_index, n - 1);
    CUDA_CHECK(cudaFree(d_count));
    CUDA_CHECK(cudaFree(d_max));
    CUDA_CHECK(cudaFree(d_sum));
    CUDA_CHECK(cudaFree(d_sum_cas));
}

static void test_early_return_and_indices() {
    const int n = 1000, threads = 128, blocks = (n + threads - 1) / threads;
    float* d_out;
    CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(float)));
    early_return_kernel<<<blocks, threads>>>(d_out, n);
    std::vector<float> out(n);
    CUDA_CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int i = 0; i < n; i++) { ok = ok && out[i] == 2.0f * i; }
    check(ok, "early return past the end of the data");
    CUDA_CHECK(cudaFree(d_out));

    dim3 grid(3, 2, 2), block(4, 3, 2);
    int total = 12 * 24;
    int* d_idx;
    CUDA_CHECK(cudaMalloc(&d_idx, total * sizeof(int)));
    indices_kernel<<<grid, block>>>(d_idx);
    std::vector<int> idx(total);
    CUDA_CHECK(cudaMemcpy(idx.data(), d_idx, total * sizeof(int), cudaMemcpyDeviceToHost));
    ok = true;
    for (int i = 0; i < total; i++) { ok = ok && idx[i] == (i / 24) * 10000 + i % 24; }
    check(ok, "threadIdx/blockIdx/blockDim/gridDim in 3D");
    CUDA_CHECK(cudaFree(d_idx));

    int* d_counts;
    CUDA_CHECK(cudaMalloc(&d_counts, 2 * sizeof(int)));
    barrier_count_kernel<<<2, 100>>>(d_counts);
    int counts[2];
    CUDA_CHECK(cudaMemcpy(counts, d_counts, sizeof counts, cudaMemcpyDeviceToHost));
    check(counts[0] == 50 && counts[1] == 50, "__syncthreads_count, 100 threads", "got %d %d", counts[0], counts[1]);
    CUDA_CHECK(cudaFree(d_counts));
}

static void test_dynamic_shared() {
    const int n = 20000;  // 80000 bytes: more than the 48 KiB a kernel gets without opting in
    size_t bytes = n * sizeof(float);
    float* d_out;
    CUDA_CHECK(cudaMalloc(&d_out, bytes));
    big_shared_kernel<<<1, 256, bytes>>>(d_out, n);
    cudaError_t without = cudaGetLastError();
    check(without != cudaSuccess, "80 KB of dynamic shared memory without opting in is a launch error",
          "got %s", cudaGetErrorName(without));
    CUDA_CHECK(cudaFuncSetAttribute(big_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    big_shared_kernel<<<1, 256, bytes>>>(d_out, n);
    CUDA_CHECK(cudaGetLastError());
    std::vector<float> out(n);
    CUDA_CHECK(cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int i = 0; i < n; i++) { ok = ok && out[i] == (float)(n - 1 - i); }
    check(ok, "80 KB of dynamic shared memory after cudaFuncSetAttribute");
    CUDA_CHECK(cudaFree(d_out));
}

int main() {
    test_block_sums();
    test_shuffles();
    test_votes();
    test_atomics();
    test_early_return_and_indices();
    test_dynamic_shared();
    return check_summary();
}
