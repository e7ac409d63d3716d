/*
kernel_test.h: what the kernel tests of dev/cuda/ share: device buffers filled from host vectors in
either storage type, the tolerances, bitwise comparison, and a benchmark that times a launcher on a
real GPU (and runs it once, untimed, on the emulated device). The CPU reference is cpu/layers.h,
included by each test; the harness is tests/check.h through dev/cuda_emu/tests/check.h.

    std::vector<float> x = random_vector(n, 1);       // uniform in [-1, 1)
    std::vector<float> xr = rounded<floatX>(x);       // what a floatX device buffer holds of x
    floatX* d = upload<floatX>(x);                    // cudaMalloc'd; free with cudaFree
    float err = max_rel_error(download(d, n).data(), want.data(), n);
    check(err <= tolerance<floatX>(), "name", "max relative error %g", err);
    bench("gelu_forward bf16", bytes, flops, [&] { gelu_forward_cuda<floatX>(...); });

Tolerances (max_rel_error: |a - b| / max(1, |b|)): fp32 1e-5 (reduction orders differ from the
CPU loops); bf16 2e-2: the CPU runs on the bf16-rounded inputs, the device stores its results in
bf16 (8 bits of mantissa: a relative step of 2^-8 = 4e-3, a few roundings deep).
*/
#ifndef DEV_CUDA_KERNEL_TEST_H
#define DEV_CUDA_KERNEL_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "dev/cuda_emu/tests/check.h"  // check, check_summary, max_rel_error, fill_uniform (before common.cuh)
#include "cuda/common.cuh"

static const float FP32_TOLERANCE = 1e-5f;
static const float BF16_TOLERANCE = 2e-2f;

template <typename T> float tolerance();
template <> float tolerance<float>() { return FP32_TOLERANCE; }
template <> float tolerance<__nv_bfloat16>() { return BF16_TOLERANCE; }

template <typename T> const char* type_name();
template <> const char* type_name<float>() { return "fp32"; }
template <> const char* type_name<__nv_bfloat16>() { return "bf16"; }

// uniform in [-scale, scale), deterministic in seed
static std::vector<float> random_vector(size_t n, unsigned seed, float scale = 1.0f) {
    std::vector<float> x(n);
    fill_uniform(x.data(), n, seed);
    for (float& v : x) { v *= scale; }
    return x;
}

// what a buffer of T holds of x: bf16 rounds each value to nearest-even
template <typename T>
static std::vector<float> rounded(const std::vector<float>& x) {
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); i++) { r[i] = to_float(from_float<T>(x[i])); }
    return r;
}

template <typename T>
static T* device_alloc(size_t n) {
    T* d;
    CUDA_CHECK(cudaMalloc(&d, (n > 0 ? n : 1) * sizeof(T)));
    return d;
}

// copies x, converted to T, into d (n = x.size())
template <typename T>
static void upload_into(T* d, const std::vector<float>& x) {
    std::vector<T> h(x.size());
    for (size_t i = 0; i < x.size(); i++) { h[i] = from_float<T>(x[i]); }
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}

template <typename T>
static T* upload(const std::vector<float>& x) {
    T* d = device_alloc<T>(x.size());
    upload_into(d, x);
    return d;
}

static int* upload_ints(const std::vector<int>& x) {
    int* d = device_alloc<int>(x.size());
    CUDA_CHECK(cudaMemcpy(d, x.data(), x.size() * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}

// n values of d as fp32 (synchronizes with the device)
template <typename T>
static std::vector<float> download(const T* d, size_t n) {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) { x[i] = to_float(h[i]); }
    return x;
}

// true when the n values of T at a and b are the same bits
template <typename T>
static bool same_bits(const T* a, const T* b, size_t n) {
    std::vector<T> ha(n), hb(n);
    CUDA_CHECK(cudaMemcpy(ha.data(), a, n * sizeof(T), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hb.data(), b, n * sizeof(T), cudaMemcpyDeviceToHost));
    return memcmp(ha.data(), hb.data(), n * sizeof(T)) == 0;
}

// test name "NAME TYPE: WHAT" in a static buffer (valid until the next call)
template <typename T>
static const char* test_name(const char* name, const char* what) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s %s: %s", name, type_name<T>(), what);
    return buf;
}

// one check of an error against a tolerance; the line names both, so that a passing run
// records how close it came: "ok   layernorm bf16: forward (C=33): max rel error 3.1e-03 <= 2e-02"
template <typename T>
static void check_close(float err, float tol, const char* layer, const char* what) {
    char name[256];
    snprintf(name, sizeof name, "%s %s: %s: max rel error %.1e <= %.0e", layer, type_name<T>(), what, err, tol);
    check(err <= tol, name, "%s", "over the tolerance");
}

// ----------------------------------------------------------------------------
// benchmark: on a GPU, the mean time of BENCH_REPEATS launches after BENCH_WARMUP, as bandwidth
// (bytes the kernel must move) and arithmetic rate, returned in seconds; on the emulated device,
// one untimed launch (returns 0)

static const int BENCH_WARMUP = 3, BENCH_REPEATS = 20;

// KERNEL_TEST_NO_BENCH=1 skips them (scripts/gpu_runbook.sh: the tests under compute-sanitizer)

template <typename F>
static double bench(const char* name, double bytes, double flops, F launch) {
    if (getenv("KERNEL_TEST_NO_BENCH") != NULL) { return 0.0; }
#ifdef CUDA_EMU
    launch();
    CUDA_CHECK(cudaDeviceSynchronize());
    printf("bench %-40s emulated device: ran once, not timed (%.3g MB, %.3g MFLOP)\n", name, bytes / 1e6,
           flops / 1e6);
    return 0.0;
#else
    for (int i = 0; i < BENCH_WARMUP; i++) { launch(); }
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < BENCH_REPEATS; i++) { launch(); }
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    double s = ms / 1e3 / BENCH_REPEATS;
    printf("bench %-40s %9.1f us  %8.1f GB/s  %9.1f GFLOP/s\n", name, s * 1e6, bytes / s / 1e9, flops / s / 1e9);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return s;
#endif
}

#endif // DEV_CUDA_KERNEL_TEST_H
