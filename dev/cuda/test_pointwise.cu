/*
test_pointwise.cu: the elementwise kernels, cuda/gelu.cuh and cuda/residual.cuh, against gelu_forward,
gelu_backward and residual_forward of cpu/layers.h, in fp32 and bf16 (the CPU on the bf16-rounded
inputs): N a multiple of the vector width, N with a tail (1003), and buffers one element off
16-byte alignment (the element-by-element path); gelu_backward onto a gradient that already holds
values (+=), and in place (gelu_backward_inplace_cuda: dout in, dinp out, against gelu_backward onto
zeros); residual in place (out = a).

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda/test_pointwise && ./build/emu/dev/cuda/test_pointwise
*/
#include "dev/cuda/kernel_test.h"
#include "cpu/layers.h"
#include "cuda/gelu.cuh"
#include "cuda/residual.cuh"

struct Case { size_t N; int offset; };  // offset: elements past a 16-byte aligned start
static const Case CASES[] = {{1024, 0}, {1003, 0}, {1003, 1}};
static const float GELU_RANGE = 4.0f;   // inputs in [-4, 4): both tails of the tanh

template <typename floatX>
static void test_case(const Case& c) {
    size_t N = c.N;
    std::vector<float> x = rounded<floatX>(random_vector(N, 1, GELU_RANGE)), y = rounded<floatX>(random_vector(N, 2));
    std::vector<float> dout = rounded<floatX>(random_vector(N, 3)), dinp0 = rounded<floatX>(random_vector(N, 4));
    // device buffers with room for the offset
    floatX *base_x = device_alloc<floatX>(N + 1), *base_y = device_alloc<floatX>(N + 1);
    floatX *base_out = device_alloc<floatX>(N + 1), *base_dout = device_alloc<floatX>(N + 1);
    floatX *d_x = base_x + c.offset, *d_y = base_y + c.offset, *d_out = base_out + c.offset, *d_dout = base_dout + c.offset;
    upload_into(d_x, x);
    upload_into(d_y, y);
    upload_into(d_dout, dout);
    char what[128];

    std::vector<float> out(N);
    gelu_forward(out.data(), x.data(), N);
    gelu_forward_cuda<floatX>(d_out, d_x, N, 0);
    snprintf(what, sizeof what, "gelu forward (N=%zu, offset %d)", N, c.offset);
    check_close<floatX>(max_rel_error(download(d_out, N).data(), out.data(), N), tolerance<floatX>(), "pointwise", what);

    std::vector<float> dinp = dinp0;
    gelu_backward(dinp.data(), x.data(), dout.data(), N);
    upload_into(d_out, dinp0);  // d_out now holds dinp
    gelu_backward_cuda<floatX>(d_out, d_x, d_dout, N, 0);
    snprintf(what, sizeof what, "gelu backward dinp += (N=%zu, offset %d)", N, c.offset);
    check_close<floatX>(max_rel_error(download(d_out, N).data(), dinp.data(), N), tolerance<floatX>(), "pointwise", what);

    std::vector<float> dinp_set(N, 0.0f);
    gelu_backward(dinp_set.data(), x.data(), dout.data(), N);
    upload_into(d_out, dout);  // d_out now holds dout, and then dinp
    gelu_backward_inplace_cuda<floatX>(d_out, d_x, N, 0);
    snprintf(what, sizeof what, "gelu backward in place dout -> dinp (N=%zu, offset %d)", N, c.offset);
    check_close<floatX>(max_rel_error(download(d_out, N).data(), dinp_set.data(), N), tolerance<floatX>(), "pointwise", what);

    residual_forward(out.data(), x.data(), y.data(), N);
    residual_forward_cuda<floatX>(d_x, d_x, d_y, N, 0);  // in place: out = a
    snprintf(what, sizeof what, "residual forward in place (N=%zu, offset %d)", N, c.offset);
    check_close<floatX>(max_rel_error(download(d_x, N).data(), out.data(), N), tolerance<floatX>(), "pointwise", what);

    for (void* p : {(void*)base_x, (void*)base_y, (void*)base_out, (void*)base_dout}) { CUDA_CHECK(cudaFree(p)); }
}

// the MLP activations of GPT-2 d12 (B=8, T=1024, 4C = 3072) and its residual stream (C = 768)
template <typename floatX>
static void bench_pointwise() {
#ifdef CUDA_EMU
    const size_t N = 2 * 16 * 64;
#else
    const size_t N = (size_t)8 * 1024 * 3072;
#endif
    floatX *d_x = upload<floatX>(random_vector(N, 1)), *d_y = upload<floatX>(random_vector(N, 2));
    floatX* d_out = device_alloc<floatX>(N);
    double x = sizeof(floatX);
    char name[64];
    snprintf(name, sizeof name, "gelu_forward %s", type_name<floatX>());
    bench(name, 2.0 * N * x, 10.0 * N, [&] { gelu_forward_cuda<floatX>(d_out, d_x, N, 0); });
    snprintf(name, sizeof name, "gelu_backward %s", type_name<floatX>());
    bench(name, 4.0 * N * x, 20.0 * N, [&] { gelu_backward_cuda<floatX>(d_out, d_x, d_y, N, 0); });
    snprintf(name, sizeof name, "residual_forward %s", type_name<floatX>());
    bench(name, 3.0 * N * x, 1.0 * N, [&] { residual_forward_cuda<floatX>(d_out, d_x, d_y, N, 0); });
    for (void* p : {(void*)d_x, (void*)d_y, (void*)d_out}) { CUDA_CHECK(cudaFree(p)); }
}

int main() {
    for (const Case& c : CASES) {
        test_case<float>(c);
        test_case<__nv_bfloat16>(c);
    }
    bench_pointwise<float>();
    bench_pointwise<__nv_bfloat16>();
    return check_summary();
}
