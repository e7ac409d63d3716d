/*
test_catches.cu: the emulator's checking modes catch the bugs they are for. Each check runs a
buggy piece of CUDA and passes when the bug SHOWS (wrong or NaN results), next to the fixed code,
which must be right. run_tests.sh runs this program under the modes (the program reads the same
environment variables to know which bugs the mode must expose):

  always                        a read of memory nobody wrote (fresh cudaMalloc, past the written
                                part, a __shared__ array in a later block) yields NaN
  CUDA_EMU_THREAD_ORDER=reverse a missing __syncthreads between a shared write and a neighbour's read
  CUDA_EMU_STREAMS=late         a missing cudaStreamWaitEvent; a pinned host buffer reused before
                                its cudaMemcpyAsync ran
  argument "deadlock"           a barrier one thread returns before: the program must stop with an
                                error naming the kernel (run_tests.sh checks the exit and message)
  argument "shuffle-mismatch"   the two halves of a warp call two different shuffles with a full
                                mask: the program must stop naming both
  argument "shuffle-exited"     lane 0 returns, the others shuffle with a full mask: the program must
                                stop saying a lane of the mask has exited

On a real GPU these bugs may or may not show, so the checks only run emulated.
*/
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "check.h"

static const int THREADS = 64;

// ----------------------------------------------------------------------------
// buggy kernels and their fixes

// out[t] = in[t - 1] through shared memory; the bug is the missing barrier
__global__ void shift_kernel(float* out, const float* in, bool with_barrier) {
    __shared__ float buf[THREADS];
    int t = threadIdx.x;
    buf[t] = in[t];
    if (with_barrier) { __syncthreads(); }
    out[t] = t > 0 ? buf[t - 1] : 0.0f;
}

// block b writes part[b] only for even b, then every block reads its own part
__global__ void copy_kernel(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = in[i]; }
}

// the second block reads the __shared__ array before writing it: it must not see block 0's data
__global__ void stale_shared_kernel(float* out) {
    __shared__ float buf[THREADS];
    int t = threadIdx.x;
    if (blockIdx.x == 0) { buf[t] = 1.0f; }
    __syncthreads();
    out[blockIdx.x * THREADS + t] = buf[t];
}

__global__ void scale_kernel(float* out, const float* in, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = factor * in[i]; }
}

// thread 0 leaves before the barrier the others wait at
// each half of the warp waits for the other at a different shuffle: on a GPU, undefined behaviour
__global__ void shuffle_mismatch_kernel(float* out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16) {
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    } else {
        v = __shfl_down_sync(0xffffffffu, v, 1);
    }
    out[threadIdx.x] = v;
}

// lane 0 leaves; the rest name it in their mask
__global__ void shuffle_exited_kernel(float* out) {
    if (threadIdx.x == 0) { return; }
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (float)threadIdx.x, 1);
}

__global__ void deadlock_kernel(float* out) {
    if (threadIdx.x == 0) { return; }
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

#ifdef CUDA_EMU  // the checks below only mean something on the emulated device
// ----------------------------------------------------------------------------
// helpers

static bool env_is(const char* name, const char* value) {
    const char* v = getenv(name);
    return v != nullptr && strcmp(v, value) == 0;
}

static int count_nan(const std::vector<float>& x) {
    int n = 0;
    for (float v : x) { n += isnan(v); }
    return n;
}

static std::vector<float> read_back(const float* d, int n) {
    std::vector<float> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// ----------------------------------------------------------------------------
// checks

static void test_unwritten_reads() {
    const int n = 256, written = 200;
    float *in, *out;
    CUDA_CHECK(cudaMalloc(&in, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&out, n * sizeof(float)));
    std::vector<float> fresh = read_back(in, n);
    check(count_nan(fresh) == n, "fresh cudaMalloc memory reads as NaN", "%d of %d NaN", count_nan(fresh), n);

    std::vector<float> h(written, 1.0f);
    CUDA_CHECK(cudaMemcpy(in, h.data(), written * sizeof(float), cudaMemcpyHostToDevice));
    copy_kernel<<<(n + THREADS - 1) / THREADS, THREADS>>>(out, in, n);  // bug: n instead of written
    std::vector<float> got = read_back(out, n);
    check(count_nan(got) == n - written, "a kernel reading past the written part gets NaNs",
          "%d NaN, want %d", count_nan(got), n - written);

    stale_shared_kernel<<<2, THREADS>>>(out);
    got = read_back(out, 2 * THREADS);
    int nan_block0 = count_nan(std::vector<float>(got.begin(), got.begin() + THREADS));
    int nan_block1 = count_nan(std::vector<float>(got.begin() + THREADS, got.end()));
    check(nan_block0 == 0 && nan_block1 == THREADS, "__shared__ memory is NaN again in every block",
          "block 0: %d NaN, block 1: %d NaN", nan_block0, nan_block1);
    CUDA_CHECK(cudaFree(in));
    CUDA_CHECK(cudaFree(out));
}

static void test_missing_barrier() {
    std::vector<float> h(THREADS);
    for (int i = 0; i < THREADS; i++) { h[i] = (float)i + 1.0f; }
    float *in, *out;
    CUDA_CHECK(cudaMalloc(&in, THREADS * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&out, THREADS * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(in, h.data(), THREADS * sizeof(float), cudaMemcpyHostToDevice));
    shift_kernel<<<1, THREADS>>>(out, in, true);
    std::vector<float> fixed = read_back(out, THREADS);
    bool right = true;
    for (int t = 1; t < THREADS; t++) { right = right && fixed[t] == h[t - 1]; }
    check(right, "shift through shared memory with __syncthreads is right");

    shift_kernel<<<1, THREADS>>>(out, in, false);
    std::vector<float> buggy = read_back(out, THREADS);
    int wrong = 0;
    for (int t = 1; t < THREADS; t++) { wrong += !(buggy[t] == h[t - 1]); }
    if (env_is("CUDA_EMU_THREAD_ORDER", "reverse") || env_is("CUDA_EMU_THREAD_ORDER", "shuffle")) {
        check(wrong > 0, "missing __syncthreads caught by the thread order", "all %d results right", THREADS);
    } else {
        printf("(forward thread order: a read of a lower thread's write is not expected to be caught, %d wrong)\n",
               wrong);
    }
    CUDA_CHECK(cudaFree(in));
    CUDA_CHECK(cudaFree(out));
}

static void test_stream_bugs() {
    if (!env_is("CUDA_EMU_STREAMS", "late")) {
        printf("(CUDA_EMU_STREAMS is not 'late': stream-order bugs are not expected to be caught)\n");
        return;
    }
    const int n = 256, threads = 128, blocks = n / threads;
    float *x, *y, *z;
    CUDA_CHECK(cudaMalloc(&x, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&y, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&z, n * sizeof(float)));
    std::vector<float> h(n, 1.0f);
    CUDA_CHECK(cudaMemcpy(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t producer, consumer;
    CUDA_CHECK(cudaStreamCreate(&producer));
    CUDA_CHECK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));

    // the bug: the consumer does not wait for the producer
    scale_kernel<<<blocks, threads, 0, producer>>>(y, x, 2.0f, n);
    scale_kernel<<<blocks, threads, 0, consumer>>>(z, y, 3.0f, n);
    CUDA_CHECK(cudaStreamSynchronize(consumer));
    std::vector<float> got = read_back(z, n);
    int right = 0;
    for (float v : got) { right += v == 6.0f; }
    check(right < n, "missing cudaStreamWaitEvent caught (consumer read the producer's output too early)",
          "all %d results right", n);

    // the bug: the host refills a pinned buffer before its async copy has run
    float* pinned;
    CUDA_CHECK(cudaMallocHost(&pinned, n * sizeof(float)));
    for (int i = 0; i < n; i++) { pinned[i] = 1.0f; }
    CUDA_CHECK(cudaMemcpyAsync(x, pinned, n * sizeof(float), cudaMemcpyHostToDevice, producer));
    for (int i = 0; i < n; i++) { pinned[i] = 2.0f; }  // too early: no cudaStreamSynchronize(producer)
    CUDA_CHECK(cudaStreamSynchronize(producer));
    got = read_back(x, n);
    int overwritten = 0;
    for (float v : got) { overwritten += v == 2.0f; }
    check(overwritten > 0, "pinned host buffer reused before its cudaMemcpyAsync ran is caught",
          "the copy delivered the first contents");

    CUDA_CHECK(cudaStreamDestroy(producer));
    CUDA_CHECK(cudaStreamDestroy(consumer));
    CUDA_CHECK(cudaFreeHost(pinned));
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(y));
    CUDA_CHECK(cudaFree(z));
}

#endif // CUDA_EMU

int main(int argc, char** argv) {
#ifndef CUDA_EMU
    (void)argc;
    (void)argv;
    printf("skipped: these checks need the emulated device (make emu-test)\n");
    return check_summary();
#else
    if (argc > 1) {  // one bug that must stop the program; run_tests.sh treats finishing as the failure
        float* out;
        CUDA_CHECK(cudaMalloc(&out, THREADS * sizeof(float)));
        if (strcmp(argv[1], "deadlock") == 0) {
            deadlock_kernel<<<1, THREADS>>>(out);
        } else if (strcmp(argv[1], "shuffle-mismatch") == 0) {
            shuffle_mismatch_kernel<<<1, 32>>>(out);
        } else if (strcmp(argv[1], "shuffle-exited") == 0) {
            shuffle_exited_kernel<<<1, 32>>>(out);
        } else {
            fprintf(stderr, "usage: %s [deadlock | shuffle-mismatch | shuffle-exited]\n", argv[0]);
            return EXIT_FAILURE;
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        printf("the kernel finished: the emulator should have stopped it\n");
        return EXIT_SUCCESS;
    }
    test_unwritten_reads();
    test_missing_barrier();
    test_stream_bugs();
    return check_summary();
#endif
}
