/*
test_pointwise.cu: the elementwise kernels, cuda/gelu.cuh and cuda/residual.cuh, against gelu_forward,
gelu_backward and residual_forward of cpu/layers.h, in fp32 and bf16 (the CPU on the bf16-rounded
inputs): N a multiple of the vector width, N with a tail (1003), and buffers one element off
16-byte alignment (the element-by-element path); gelu_backward onto a gradient that already holds
values (+=), and in place (gelu_backward_inplace_cuda: dout in, dinp out, against gelu_backward onto
zeros); residual in place (out = a). And add_partial_sums (cuda/common.cuh), the second pass of every
deterministic column sum: against the same fixed tree computed here on the host (bitwise), for
1 to 600 parts and n with a partial last block, whatever the columns per block (bitwise the same
for every width the launcher may pick), adding into values already there; it prints the launch
(blocks, warps, the longest chain of dependent adds) before and now for the column sums of
LayerNorm and the matmul bias at d12 (B=16, T=1024) and d84 (B=1, T=1024) on a 132-SM H100.

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

// ----------------------------------------------------------------------------
// add_partial_sums

// out[i] + the sum of partials[p][i] in the kernel's order: PARTIAL_SUMS_SPLITS strided runs, then
// the binary tree over the runs (the one order the kernel must keep, whatever its grid)
static float partial_sums_reference(float out, const std::vector<float>& partials, int parts, int n, int i) {
    float runs[PARTIAL_SUMS_SPLITS];
    for (int r = 0; r < PARTIAL_SUMS_SPLITS; r++) {
        runs[r] = 0.0f;
        for (int p = r; p < parts; p += PARTIAL_SUMS_SPLITS) { runs[r] += partials[(size_t)p * n + i]; }
    }
    for (int half = PARTIAL_SUMS_SPLITS / 2; half > 0; half /= 2) {
        for (int r = 0; r < half; r++) { runs[r] += runs[r + half]; }
    }
    return out + runs[0];
}

static void test_partial_sums() {
    const int PARTS[] = {1, 3, 16, 17, 600}, NS[] = {5, 1003};
    for (int parts : PARTS) {
        for (int n : NS) {
            std::vector<float> partials = random_vector((size_t)parts * n, 7), out0 = random_vector(n, 8);
            float* d_partials = upload<float>(partials);
            std::vector<float> want(n);
            for (int i = 0; i < n; i++) { want[i] = partial_sums_reference(out0[i], partials, parts, n, i); }
            char what[160];
            float* d_out = upload<float>(out0);
            add_partial_sums_cuda(d_out, d_partials, parts, n, n, 0);
            std::vector<float> got = download(d_out, n);
            snprintf(what, sizeof what, "add_partial_sums += (parts=%d, n=%d): bitwise the fixed tree", parts, n);
            check(memcmp(got.data(), want.data(), n * sizeof(float)) == 0, what, "differs from the host's tree");
            bool same = true;
            for (int cols = PARTIAL_SUMS_MIN_COLS; cols <= PARTIAL_SUMS_MAX_COLS; cols *= 2) {
                upload_into(d_out, out0);
                add_partial_sums_kernel<<<ceil_div(n, cols), cols * PARTIAL_SUMS_SPLITS>>>(d_out, d_partials, parts, n, n);
                CUDA_CHECK_LAUNCH();
                same = same && download(d_out, n) == got;
            }
            snprintf(what, sizeof what, "add_partial_sums (parts=%d, n=%d): the same bits at %d to %d columns a block",
                     parts, n, PARTIAL_SUMS_MIN_COLS, PARTIAL_SUMS_MAX_COLS);
            check(same, what, "the grid changed the result");
            CUDA_CHECK(cudaFree(d_out));
            CUDA_CHECK(cudaFree(d_partials));
        }
    }
}

// before (commit 78312d3: one thread a column, the parts added in a serial loop, 256 threads a
// block) and now, on an H100's 132 SMs
static void print_partial_sums_launches() {
    const int H100_SMS = 132;
    const struct { const char* what; int parts_before, parts_now, n; } sums[] = {
        {"layernorm dweight, d12 B=16 T=1024", 512, 512, 768},
        {"matmul fc bias,    d12 B=16 T=1024", 128, 128, 3072},
        {"layernorm dweight, d84 B=1 T=1024", 32, 128, 3456},
        {"matmul qkv bias,   d84 B=1 T=1024", 8, 8, 3 * 3456},
    };
    for (const auto& z : sums) {
        int blocks = ceil_div(z.n, 256);
        printf("add_partial_sums before %s: %4d blocks x %2d warps = %5d warps, %3d dependent adds, %.2f MB\n", z.what,
               blocks, 256 / WARP_SIZE, blocks * 256 / WARP_SIZE, z.parts_before, (z.parts_before + 2.0) * z.n * 4 / 1e6);
        int cols = partial_sums_cols(z.n, H100_SMS), warps = cols * PARTIAL_SUMS_SPLITS / WARP_SIZE;
        int chain = ceil_div(z.parts_now, PARTIAL_SUMS_SPLITS) + 4;  // a run, then log2(16) tree levels
        printf("add_partial_sums now    %s: %4d blocks x %2d warps = %5d warps, %3d dependent adds, %.2f MB\n", z.what,
               ceil_div(z.n, cols), warps, ceil_div(z.n, cols) * warps, chain, (z.parts_now + 2.0) * z.n * 4 / 1e6);
    }
}

int main() {
    print_partial_sums_launches();
    test_partial_sums();
    for (const Case& c : CASES) {
        test_case<float>(c);
        test_case<__nv_bfloat16>(c);
    }
    bench_pointwise<float>();
    bench_pointwise<__nv_bfloat16>();
    return check_summary();
}
