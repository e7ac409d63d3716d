/*
test_runtime.cu: the runtime API a trainer leans on, with answers that hold on any CUDA device:
device properties (the SM count both ways; emulated, the one CUDA_EMU_SMS sets), memory accounting and out-of-memory, launch-configuration errors, copies and
memsets, streams ordered by events, pinned-memory async copies, events and elapsed time.
run_tests.sh runs it in every CUDA_EMU_STREAMS mode: correct code is right in all of them.
*/
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "check.h"

__global__ void scale_kernel(float* out, const float* in, float factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = factor * in[i]; }
}

static void test_properties() {
    int count = 0, device = -1;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    check(count >= 1 && device == 0, "cudaGetDeviceCount / cudaSetDevice / cudaGetDevice");
    check(prop.warpSize == 32 && prop.maxThreadsPerBlock == 1024 && prop.multiProcessorCount > 0 &&
          prop.sharedMemPerBlock >= 48 * 1024 && prop.totalGlobalMem > 0,
          "cudaGetDeviceProperties", "%s: warp %d, %d threads, %d SMs", prop.name, prop.warpSize,
          prop.maxThreadsPerBlock, prop.multiProcessorCount);
}

static void test_memory_accounting() {
    size_t free0, total;
    CUDA_CHECK(cudaMemGetInfo(&free0, &total));
    const size_t bytes = 1 << 20;
    void* p;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    size_t free1;
    CUDA_CHECK(cudaMemGetInfo(&free1, &total));
    check(free0 - free1 >= bytes && free1 <= total, "cudaMemGetInfo counts a 1 MiB cudaMalloc",
          "free went from %zu to %zu", free0, free1);
    CUDA_CHECK(cudaFree(p));

    void* too_big = (void*)1;
    cudaError_t e = cudaMalloc(&too_big, total + 1);
    check(e == cudaErrorMemoryAllocation, "cudaMalloc beyond the device size is cudaErrorMemoryAllocation",
          "got %s", cudaGetErrorName(e));
    cudaGetLastError();  // clear it, as a program that handles the failure would
    check(cudaGetLastError() == cudaSuccess, "cudaGetLastError resets the error");
}

static void test_launch_errors() {
    float* d;
    CUDA_CHECK(cudaMalloc(&d, sizeof(float)));
    scale_kernel<<<1, 2048>>>(d, d, 1.0f, 1);  // more threads per block than any device has
    cudaError_t e = cudaGetLastError();
    check(e == cudaErrorInvalidConfiguration, "a 2048-thread block is cudaErrorInvalidConfiguration",
          "got %s", cudaGetErrorName(e));
    check(strlen(cudaGetErrorString(e)) > 0, "cudaGetErrorString names it", "%s", cudaGetErrorString(e));
    CUDA_CHECK(cudaFree(d));
}

static void test_copies_and_memset() {
    const int n = 300;
    std::vector<float> h(n), back(n);
    for (int i = 0; i < n; i++) { h[i] = (float)i; }
    float *a, *b;
    CUDA_CHECK(cudaMalloc(&a, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&b, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(a, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(b, a, n * sizeof(float), cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(back.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost));
    check(memcmp(h.data(), back.data(), n * sizeof(float)) == 0, "cudaMemcpy H2D, D2D, D2H round trip");
    CUDA_CHECK(cudaMemset(b, 0, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(back.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost));
    bool zero = true;
    for (float v : back) { zero = zero && v == 0.0f; }
    check(zero, "cudaMemset to zero");
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
}

// producer on one stream, consumer on another, ordered by an event; pinned async copies
static void test_streams_and_events() {
    const int n = 1000, threads = 128, blocks = (n + threads - 1) / threads;
    float *host_in, *host_out;
    CUDA_CHECK(cudaMallocHost(&host_in, n * sizeof(float)));
    CUDA_CHECK(cudaMallocHost(&host_out, n * sizeof(float)));
    for (int i = 0; i < n; i++) { host_in[i] = (float)i; }
    float *x, *y, *z;
    CUDA_CHECK(cudaMalloc(&x, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&y, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&z, n * sizeof(float)));
    cudaStream_t producer, consumer;
    CUDA_CHECK(cudaStreamCreate(&producer));
    CUDA_CHECK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
    cudaEvent_t produced, start, stop;
    CUDA_CHECK(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));

    CUDA_CHECK(cudaEventRecord(start, producer));
    CUDA_CHECK(cudaMemcpyAsync(x, host_in, n * sizeof(float), cudaMemcpyHostToDevice, producer));
    scale_kernel<<<blocks, threads, 0, producer>>>(y, x, 2.0f, n);
    CUDA_CHECK(cudaEventRecord(produced, producer));
    CUDA_CHECK(cudaStreamWaitEvent(consumer, produced, 0));
    scale_kernel<<<blocks, threads, 0, consumer>>>(z, y, 3.0f, n);
    CUDA_CHECK(cudaMemcpyAsync(host_out, z, n * sizeof(float), cudaMemcpyDeviceToHost, consumer));
    CUDA_CHECK(cudaEventRecord(stop, consumer));
    CUDA_CHECK(cudaStreamSynchronize(consumer));
    bool ok = true;
    for (int i = 0; i < n; i++) { ok = ok && host_out[i] == 6.0f * i; }
    check(ok, "two streams ordered by cudaEventRecord + cudaStreamWaitEvent, pinned async copies");

    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = -1.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    check(ms >= 0.0f, "cudaEventElapsedTime", "%g ms", ms);
    check(cudaEventQuery(stop) == cudaSuccess && cudaStreamQuery(consumer) == cudaSuccess,
          "cudaEventQuery / cudaStreamQuery after synchronizing");

    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaEventDestroy(produced));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    CUDA_CHECK(cudaStreamDestroy(producer));
    CUDA_CHECK(cudaStreamDestroy(consumer));
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(y));
    CUDA_CHECK(cudaFree(z));
    CUDA_CHECK(cudaFreeHost(host_in));
    CUDA_CHECK(cudaFreeHost(host_out));
}

#ifdef CUDA_EMU
static const int EMU_DEFAULT_SMS = 6;  // dev/cuda_emu/README.md: CUDA_EMU_SMS
#endif

// kernels size grid-stride grids from the SM count: the property and the attribute must agree
static void test_multiprocessors() {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    int attribute = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&attribute, cudaDevAttrMultiProcessorCount, 0));
    check(attribute == prop.multiProcessorCount && attribute > 0,
          "cudaDevAttrMultiProcessorCount == cudaDeviceProp.multiProcessorCount", "%d and %d", attribute,
          prop.multiProcessorCount);
#ifdef CUDA_EMU
    const char* sms = getenv("CUDA_EMU_SMS");
    int want = sms != nullptr ? atoi(sms) : EMU_DEFAULT_SMS;
    char name[96];
    snprintf(name, sizeof name, "the SM count is CUDA_EMU_SMS (%s)", sms != nullptr ? sms : "unset: 6");
    check(prop.multiProcessorCount == want, name, "got %d", prop.multiProcessorCount);
#endif
}

int main() {
    test_properties();
    test_multiprocessors();
    test_memory_accounting();
    test_launch_errors();
    test_copies_and_memset();
    test_streams_and_events();
    return check_summary();
}
