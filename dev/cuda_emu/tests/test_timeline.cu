/*
test_timeline.cu: what a copy that overlaps compute saves, measured with CUDA events, the way a real
GPU is measured. On the emulated device the events read the timeline's modelled times
(CUDA_EMU_TIMELINE=h100, dev/cuda_emu/emu_timeline.cpp; run_tests.sh runs it so, with
CUDA_EMU_EXECUTE=0); built by nvcc, the same program measures a real GPU and the same checks hold.

    copy waited at once   copy stream: upload; compute: wait for it, then the kernel  -> copy + kernel
    overlapped            copy stream: upload; compute: the kernel, then the wait     -> max(copy, kernel)
    both directions       an upload and a download at once share the link: slower than one alone,
                          faster than one after the other (55 GB/s each way, 93 together on an H100)
    pageable              a copy from pageable memory is several times slower than from pinned

A model that ignored the event wait would give the first case the second's time, and fail here.
The kernel declares its FLOPs and bytes to the timeline (emu_timeline_range, as the trainer's
profile ranges do); nvcc builds do not see that call.

    ./build/emu/dev/cuda_emu/tests/test_timeline    (with CUDA_EMU_TIMELINE=h100; without it, on the
                                                    emulator, the times are the CPU's: it says so, fails)
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

static const size_t COPY_BYTES = (size_t)64 << 20;   // 64 MiB: about 1.2 ms each way at 55 GB/s
static const int N = 1 << 24;                        // the kernel's elements (64 MiB of floats)
static const int REPS = 2000;                        // FMAs per element: 67 GFLOP, about 1 ms at fp32 peak

// x[i] = x[i] * a + b, REPS times: arithmetic that a GPU cannot skip
__global__ void busy_kernel(float* x, int n, int reps) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = x[i];
        for (int r = 0; r < reps; r++) { v = v * 0.999f + 0.001f; }
        x[i] = v;
    }
}

static void launch_busy(float* x, cudaStream_t s) {
#ifdef CUDA_EMU
    emu_timeline_range(s, "compute", "busy_kernel", 2.0 * N * REPS, 8.0 * N, EMU_TECHNIQUE_NONE, 0);
#endif
    busy_kernel<<<264, 256, 0, s>>>(x, N, REPS);
#ifdef CUDA_EMU
    emu_timeline_range_end(s);
#endif
}

struct Bench {
    cudaStream_t compute, copy, other;
    float* x;              // the kernel's data
    char *dev_a, *dev_b;   // copy targets on the device
    char *pinned_a, *pinned_b, *pageable;
    cudaEvent_t start, end, copied, copy_begin, other_end;
};

static float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0.0f;
    CUDA_CHECK(cudaEventSynchronize(b));
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

// start on the compute stream; the copy streams begin after it (copy_begin: when the copy stream did)
static void begin(Bench* b) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaEventRecord(b->start, b->compute));
    CUDA_CHECK(cudaStreamWaitEvent(b->copy, b->start, 0));
    CUDA_CHECK(cudaStreamWaitEvent(b->other, b->start, 0));
    CUDA_CHECK(cudaEventRecord(b->copy_begin, b->copy));
}

// the upload on the copy stream, then the compute stream waits for it: at once, or after the kernel
static float copy_and_kernel(Bench* b, int wait_at_once) {
    begin(b);
    CUDA_CHECK(cudaMemcpyAsync(b->dev_a, b->pinned_a, COPY_BYTES, cudaMemcpyHostToDevice, b->copy));
    CUDA_CHECK(cudaEventRecord(b->copied, b->copy));
    if (wait_at_once) { CUDA_CHECK(cudaStreamWaitEvent(b->compute, b->copied, 0)); }
    launch_busy(b->x, b->compute);
    if (!wait_at_once) { CUDA_CHECK(cudaStreamWaitEvent(b->compute, b->copied, 0)); }
    CUDA_CHECK(cudaEventRecord(b->end, b->compute));
    return elapsed_ms(b->start, b->end);
}

static float kernel_alone(Bench* b) {
    begin(b);
    launch_busy(b->x, b->compute);
    CUDA_CHECK(cudaEventRecord(b->end, b->compute));
    return elapsed_ms(b->start, b->end);
}

// one copy (src to dst) on the copy stream, or two at once: src to dst there and back on the other;
// timed on the copy streams themselves (no wait of the compute stream in the measure)
static float copies(Bench* b, const void* src, void* dst, enum cudaMemcpyKind kind, int both_ways) {
    begin(b);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, COPY_BYTES, kind, b->copy));
    CUDA_CHECK(cudaEventRecord(b->copied, b->copy));
    float ms = elapsed_ms(b->copy_begin, b->copied);
    if (both_ways) {
        begin(b);
        CUDA_CHECK(cudaMemcpyAsync(dst, src, COPY_BYTES, kind, b->copy));
        CUDA_CHECK(cudaMemcpyAsync(b->pinned_b, b->dev_b, COPY_BYTES, cudaMemcpyDeviceToHost, b->other));
        CUDA_CHECK(cudaEventRecord(b->copied, b->copy));
        CUDA_CHECK(cudaEventRecord(b->other_end, b->other));
        float there = elapsed_ms(b->copy_begin, b->copied), back = elapsed_ms(b->copy_begin, b->other_end);
        ms = there > back ? there : back;
    }
    return ms;
}

int main(void) {
#ifdef CUDA_EMU
    if (!emu_timeline_on()) {
        fprintf(stderr, "test_timeline: on the emulated device the events need CUDA_EMU_TIMELINE (e.g. h100): "
                        "without it their times are the emulator's on the CPU\n");
        printf("0 passed, 1 failed\n");
        return 1;
    }
#endif
    Bench b;
    CUDA_CHECK(cudaStreamCreateWithFlags(&b.compute, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&b.copy, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&b.other, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMalloc(&b.x, (size_t)N * sizeof(float)));
    CUDA_CHECK(cudaMemset(b.x, 0, (size_t)N * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&b.dev_a, COPY_BYTES));
    CUDA_CHECK(cudaMalloc(&b.dev_b, COPY_BYTES));
    CUDA_CHECK(cudaMemset(b.dev_b, 0, COPY_BYTES));
    CUDA_CHECK(cudaMallocHost(&b.pinned_a, COPY_BYTES));
    CUDA_CHECK(cudaMallocHost(&b.pinned_b, COPY_BYTES));
    b.pageable = (char*)malloc(COPY_BYTES);
    memset(b.pinned_a, 1, COPY_BYTES);
    memset(b.pageable, 1, COPY_BYTES);
    CUDA_CHECK(cudaEventCreate(&b.start));
    CUDA_CHECK(cudaEventCreate(&b.end));
    CUDA_CHECK(cudaEventCreate(&b.copied));
    CUDA_CHECK(cudaEventCreate(&b.copy_begin));
    CUDA_CHECK(cudaEventCreate(&b.other_end));

    copy_and_kernel(&b, 1);   // warm-up (a GPU's first launches and copies are slower)
    float kernel = kernel_alone(&b);
    float copy = copies(&b, b.pinned_a, b.dev_a, cudaMemcpyHostToDevice, 0);
    float at_once = copy_and_kernel(&b, 1);
    float overlapped = copy_and_kernel(&b, 0);
    float both = copies(&b, b.pinned_a, b.dev_a, cudaMemcpyHostToDevice, 1);
    float pageable = copies(&b, b.pageable, b.dev_a, cudaMemcpyHostToDevice, 0);
    printf("kernel %.3f ms, copy %.3f ms (%.1f GB/s), copy waited at once %.3f ms, overlapped %.3f ms, "
           "both directions %.3f ms, pageable %.3f ms (%.1f GB/s)\n", kernel, copy, COPY_BYTES / (copy * 1e6), at_once,
           overlapped, both, pageable, COPY_BYTES / (pageable * 1e6));

    float shorter = copy < kernel ? copy : kernel, longer = copy < kernel ? kernel : copy;
    check(at_once >= 0.9f * (copy + kernel), "copy waited at once: the compute stream waits for the whole copy",
          "%.3f ms, copy + kernel = %.3f ms", at_once, copy + kernel);
    check(overlapped <= 1.1f * longer + 0.05f, "overlapped: the kernel runs while the copy does",
          "%.3f ms, max(copy, kernel) = %.3f ms", overlapped, longer);
    check(at_once - overlapped >= 0.5f * shorter, "the overlap saves at least half of the shorter one",
          "saved %.3f ms of %.3f ms", at_once - overlapped, shorter);
    check(both > 1.05f * copy && both < 1.6f * copy, "both directions at once share the link (93 GB/s together, 55 alone)",
          "%.3f ms for two copies, %.3f ms for one", both, copy);
    check(pageable > 3.0f * copy, "a pageable copy is several times slower than a pinned one (9.2 GB/s against 55)",
          "%.3f ms against %.3f ms", pageable, copy);

    CUDA_CHECK(cudaFree(b.x));
    CUDA_CHECK(cudaFree(b.dev_a));
    CUDA_CHECK(cudaFree(b.dev_b));
    CUDA_CHECK(cudaFreeHost(b.pinned_a));
    CUDA_CHECK(cudaFreeHost(b.pinned_b));
    free(b.pageable);
    return check_summary();
}
