/*
test_launch.cu: the forms a kernel launch takes in real CUDA code, each checked by what the kernel
wrote: plain kernels; templates with their arguments written out (kernel<float>, kernel<float, 4>);
templates whose arguments are deduced from the launch's arguments, including a non-type argument
carried by std::bool_constant (as llm.c does) and a const T* parameter given a T*; an overloaded
kernel picked by its argument types; a default argument; a launch through a function pointer; a
kernel in a namespace; a launch inside a function template. Ordinary CUDA: nvcc builds it too.

Argument "deduced-big-shared" (emulated only): a deduced launch asking for more than 48 KiB of
dynamic shared memory must stop with a message that says to write the template arguments out
(run_tests.sh checks the exit and message).
*/
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include <type_traits>
#include <vector>
#include "check.h"

static const int N = 40;       // elements: more than one warp, not a multiple of 32
static const int THREADS = 64;

// ----------------------------------------------------------------------------
// kernels

// out[i] = factor * in[i]; in is const T*, so a T* argument still deduces T
template <typename T>
__global__ void scale_kernel(T* out, const T* in, T factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = factor * in[i]; }
}

// out[i] = in[i] summed over a window of WIDTH elements starting at i (clamped at n)
template <typename T, int WIDTH>
__global__ void window_sum_kernel(T* out, const T* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    T sum = 0;
    for (int w = 0; w < WIDTH && i + w < n; w++) { sum += in[i + w]; }
    out[i] = sum;
}

// out[i] = i, plus 1000 when the flag, passed as a type (std::bool_constant<true>), is set
template <bool ADD_THOUSAND>
__global__ void flag_kernel(int* out, int n, std::bool_constant<ADD_THOUSAND>) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = i + (ADD_THOUSAND ? 1000 : 0); }
}

// overloads: C++ picks by the argument's type, at the launch as at a call
__global__ void mark_kernel(int* out) { out[threadIdx.x] = 1; }
__global__ void mark_kernel(float* out) { out[threadIdx.x] = 2.0f; }

// b has a default
__global__ void add_kernel(int* out, int a, int b = 7) { out[threadIdx.x] = a + b; }

namespace kernels {
template <typename T>
__global__ void fill_kernel(T* out, T value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = value; }
}
}  // namespace kernels

// a launch inside a function template: the kernel's arguments depend on the caller's T
template <typename T>
static void fill(T* out, T value, int n) {
    kernels::fill_kernel<<<(n + THREADS - 1) / THREADS, THREADS>>>(out, value, n);
}

// reads the whole dynamic shared buffer (used only to provoke the deduced-launch message)
template <typename T>
__global__ void big_shared_kernel(T* out, int n) {
    extern __shared__ char buffer[];
    T* b = (T*)buffer;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { b[i] = (T)i; }
    __syncthreads();
    if (threadIdx.x == 0) { out[0] = b[n - 1]; }
}

// ----------------------------------------------------------------------------
// checks

template <typename T>
static std::vector<T> to_host(const T* d, int n) {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

template <typename T>
static T* to_device(const std::vector<T>& h) {
    T* d;
    CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

static void test_templates() {
    std::vector<float> x(N);
    std::vector<double> xd(N);
    for (int i = 0; i < N; i++) { x[i] = xd[i] = (float)i - 3.0f; }
    float* in = to_device(x);
    double* in_d = to_device(xd);
    float* out;
    double* out_d;
    CUDA_CHECK(cudaMalloc(&out, N * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&out_d, N * sizeof(double)));
    int blocks = (N + THREADS - 1) / THREADS;

    scale_kernel<<<blocks, THREADS>>>(out, in, 2.0f, N);  // T = float, deduced
    CUDA_CHECK(cudaGetLastError());
    std::vector<float> got = to_host(out, N);
    bool ok = true;
    for (int i = 0; i < N; i++) { ok = ok && got[i] == 2.0f * x[i]; }
    check(ok, "template kernel, arguments deduced (float; const T* given a T*)", "out[1] = %g", got[1]);

    scale_kernel<<<blocks, THREADS>>>(out_d, in_d, 0.5, N);  // T = double, deduced
    std::vector<double> got_d = to_host(out_d, N);
    ok = true;
    for (int i = 0; i < N; i++) { ok = ok && got_d[i] == 0.5 * xd[i]; }
    check(ok, "template kernel, arguments deduced (double)", "out[1] = %g", got_d[1]);

    scale_kernel<double><<<blocks, THREADS>>>(out_d, in_d, 3, N);  // written out: 3 converts to double
    got_d = to_host(out_d, N);
    ok = true;
    for (int i = 0; i < N; i++) { ok = ok && got_d[i] == 3.0 * xd[i]; }
    check(ok, "template kernel, argument written out (scale_kernel<double>, int factor converted)");

    window_sum_kernel<float, 3><<<blocks, THREADS>>>(out, in, N);
    got = to_host(out, N);
    ok = true;
    for (int i = 0; i < N; i++) {
        float want = 0.0f;
        for (int w = 0; w < 3 && i + w < N; w++) { want += x[i + w]; }
        ok = ok && got[i] == want;
    }
    check(ok, "template kernel, two arguments written out (window_sum_kernel<float, 3>)");

    int* flags;
    CUDA_CHECK(cudaMalloc(&flags, N * sizeof(int)));
    flag_kernel<<<blocks, THREADS>>>(flags, N, std::bool_constant<true>{});
    std::vector<int> on = to_host(flags, N);
    flag_kernel<<<blocks, THREADS>>>(flags, N, std::bool_constant<false>{});
    std::vector<int> off = to_host(flags, N);
    check(on[5] == 1005 && off[5] == 5 && on[N - 1] == 1000 + N - 1, "template kernel, bool deduced from std::bool_constant",
          "true: %d, false: %d", on[5], off[5]);

    fill(out, 1.5f, N);
    got = to_host(out, N);
    fill(flags, 42, N);
    std::vector<int> filled = to_host(flags, N);
    check(got[N - 1] == 1.5f && filled[N - 1] == 42, "template kernel in a namespace, launched from a function template",
          "%g and %d", got[N - 1], filled[N - 1]);

    for (void* p : {(void*)in, (void*)in_d, (void*)out, (void*)out_d, (void*)flags}) { CUDA_CHECK(cudaFree(p)); }
}

static void test_overloads_defaults_pointers() {
    int* ints;
    float* floats;
    CUDA_CHECK(cudaMalloc(&ints, sizeof(int)));
    CUDA_CHECK(cudaMalloc(&floats, sizeof(float)));
    mark_kernel<<<1, 1>>>(ints);
    mark_kernel<<<1, 1>>>(floats);
    int i_got = to_host(ints, 1)[0];
    float f_got = to_host(floats, 1)[0];
    check(i_got == 1 && f_got == 2.0f, "overloaded kernel picked by its argument type", "int %d, float %g", i_got, f_got);

    add_kernel<<<1, 1>>>(ints, 3);
    int with_default = to_host(ints, 1)[0];
    add_kernel<<<1, 1>>>(ints, 3, 4);
    int without = to_host(ints, 1)[0];
    check(with_default == 10 && without == 7, "kernel with a default argument", "%d and %d", with_default, without);

    void (*kernel)(int*) = mark_kernel;
    CUDA_CHECK(cudaMemset(ints, 0, sizeof(int)));
    kernel<<<1, 1>>>(ints);
    check(to_host(ints, 1)[0] == 1, "launch through a function pointer");
    CUDA_CHECK(cudaFree(ints));
    CUDA_CHECK(cudaFree(floats));
}

int main(int argc, char** argv) {
#ifdef CUDA_EMU
    if (argc > 1 && strcmp(argv[1], "deduced-big-shared") == 0) {
        const int n = 16 * 1024;  // 64 KiB of floats: more than 48 KiB without opting in
        float* out;
        CUDA_CHECK(cudaMalloc(&out, sizeof(float)));
        CUDA_CHECK(cudaFuncSetAttribute(big_shared_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        n * (int)sizeof(float)));
        big_shared_kernel<<<1, THREADS, n * sizeof(float)>>>(out, n);
        CUDA_CHECK(cudaDeviceSynchronize());
        printf("the deduced launch ran: under the emulator it should have stopped\n");
        return EXIT_SUCCESS;  // run_tests.sh treats finishing as the failure
    }
#else
    (void)argc;
    (void)argv;
#endif
    test_templates();
    test_overloads_defaults_pointers();
    return check_summary();
}
