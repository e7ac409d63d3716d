/*
test_optimizer.cu: the update step's kernels: cuda/adamw.cuh against adamw_update of
cpu/optimizers.h (three steps, bitwise: the same operations in the same order, no fused
multiply-adds), copy_to_floatX_cuda against the host's round-to-nearest-even (bitwise), and
cuda/global_norm.cuh against opt_sum_squares of cpu/optimizers.h (the CPU's sum in double, within
1e-12) and against itself (two runs bitwise equal). Sizes with a tail (1003) and buffers one float
off 16-byte alignment; the norm also at sizes where threads take several packs (past
GLOBAL_NORM_MAX_BLOCKS blocks of GLOBAL_NORM_BLOCK threads).

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda/test_optimizer && ./build/emu/dev/cuda/test_optimizer
*/
#include "dev/cuda/kernel_test.h"
#include "cpu/optimizers.h"
#include "cuda/adamw.cuh"
#include "cuda/global_norm.cuh"

struct Case { size_t n; int offset; };  // offset: floats past a 16-byte aligned start
static const Case CASES[] = {{1024, 0}, {1003, 0}, {1003, 1}};
static const size_t NORM_SIZES[] = {1003, 70001, 1100003};
static const double NORM_TOLERANCE = 1e-12;  // relative, between two double sums of the same squares
static const int ADAMW_STEPS = 3;
static const float LR = 1e-3f, BETA1 = 0.9f, BETA2 = 0.95f, EPS = 1e-8f, WEIGHT_DECAY = 0.1f;

// n floats at offset past an aligned allocation (free base)
static float* offset_upload(const std::vector<float>& x, int offset, float** base) {
    *base = device_alloc<float>(x.size() + 1);
    upload_into(*base + offset, x);
    return *base + offset;
}

static void test_adamw(const Case& c) {
    size_t n = c.n;
    std::vector<float> params = random_vector(n, 1), m(n, 0.0f), v(n, 0.0f);
    float *bp, *bg, *bm, *bv;
    float* d_params = offset_upload(params, c.offset, &bp);
    float* d_m = offset_upload(m, c.offset, &bm);
    float* d_v = offset_upload(v, c.offset, &bv);
    float* d_grads = offset_upload(std::vector<float>(n, 0.0f), c.offset, &bg);
    for (int t = 1; t <= ADAMW_STEPS; t++) {
        std::vector<float> grads = random_vector(n, 100 + t);
        adamw_update(params.data(), grads.data(), m.data(), v.data(), n, LR, BETA1, BETA2, EPS, WEIGHT_DECAY, t);
        upload_into(d_grads, grads);
        adamw_update_cuda(d_params, d_grads, d_m, d_v, n, LR, BETA1, BETA2, EPS, WEIGHT_DECAY, t, 0);
    }
    std::vector<float> got_p = download(d_params, n), got_m = download(d_m, n), got_v = download(d_v, n);
    bool exact = got_p == params && got_m == m && got_v == v;
    char name[128];
    snprintf(name, sizeof name, "adamw: %d steps bitwise cpu/optimizers.h (n=%zu, offset %d)", ADAMW_STEPS, n, c.offset);
    check(exact, name, "params %g, m %g, v %g max relative error", max_rel_error(got_p.data(), params.data(), n),
          max_rel_error(got_m.data(), m.data(), n), max_rel_error(got_v.data(), v.data(), n));
    for (float* p : {bp, bg, bm, bv}) { CUDA_CHECK(cudaFree(p)); }
}

template <typename floatX>
static void test_copy(const Case& c) {
    size_t n = c.n;
    std::vector<float> x = random_vector(n, 7, 3.0f);
    float* base;
    float* d_src = offset_upload(x, c.offset, &base);
    floatX* dst_base = device_alloc<floatX>(n + 1);
    floatX* d_dst = dst_base + c.offset;
    copy_to_floatX_cuda<floatX>(d_dst, d_src, n, 0);
    std::vector<floatX> got(n);
    CUDA_CHECK(cudaMemcpy(got.data(), d_dst, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    bool exact = true;
    for (size_t i = 0; i < n; i++) {
        floatX want = from_float<floatX>(x[i]);
        exact = exact && memcmp(&got[i], &want, sizeof(floatX)) == 0;
    }
    char name[128];
    snprintf(name, sizeof name, "copy_to_floatX %s: bitwise round-to-nearest-even (n=%zu, offset %d)",
             type_name<floatX>(), n, c.offset);
    check(exact, name, "%s", "an element differs");
    CUDA_CHECK(cudaFree(base));
    CUDA_CHECK(cudaFree(dst_base));
}

static void test_global_norm(size_t n, int offset) {
    std::vector<float> x = random_vector(n, 9);
    double want = opt_sum_squares(x.data(), n);
    float* base;
    float* d_x = offset_upload(x, offset, &base);
    double *d_out = device_alloc<double>(2), *d_scratch = device_alloc<double>(global_norm_scratch_doubles(n));
    global_norm_squared_cuda(d_out, d_x, n, d_scratch, 0);
    global_norm_squared_cuda(d_out + 1, d_x, n, d_scratch, 0);
    double got[2];
    CUDA_CHECK(cudaMemcpy(got, d_out, sizeof got, cudaMemcpyDeviceToHost));
    double err = fabs(got[0] - want) / want;
    char name[160];
    snprintf(name, sizeof name, "global_norm_squared vs opt_sum_squares (n=%zu, offset %d): rel error %.1e <= %.0e",
             n, offset, err, NORM_TOLERANCE);
    check(err <= NORM_TOLERANCE, name, "%s", "over the tolerance");
    snprintf(name, sizeof name, "global_norm_squared twice: bitwise equal (n=%zu)", n);
    check(memcmp(&got[0], &got[1], sizeof(double)) == 0, name, "%.17g vs %.17g", got[0], got[1]);
    for (void* p : {(void*)base, (void*)d_out, (void*)d_scratch}) { CUDA_CHECK(cudaFree(p)); }
}

// GPT-2 d12's 124M parameters on a GPU
static void bench_optimizer() {
#ifdef CUDA_EMU
    const size_t n = 4096;
#else
    const size_t n = 124475904;
#endif
    float *d_p = upload<float>(random_vector(n, 1)), *d_g = upload<float>(random_vector(n, 2));
    float *d_m = upload<float>(std::vector<float>(n, 0.0f)), *d_v = upload<float>(std::vector<float>(n, 0.0f));
    __nv_bfloat16* d_w = device_alloc<__nv_bfloat16>(n);
    double *d_out = device_alloc<double>(1), *d_scratch = device_alloc<double>(global_norm_scratch_doubles(n));
    bench("adamw_update", 7.0 * 4 * n, 16.0 * n,
          [&] { adamw_update_cuda(d_p, d_g, d_m, d_v, n, LR, BETA1, BETA2, EPS, WEIGHT_DECAY, 1, 0); });
    bench("copy_to_floatX bf16", 6.0 * n, 0.0, [&] { copy_to_floatX_cuda<__nv_bfloat16>(d_w, d_p, n, 0); });
    bench("global_norm_squared", 4.0 * n, 2.0 * n, [&] { global_norm_squared_cuda(d_out, d_g, n, d_scratch, 0); });
    for (void* p : {(void*)d_p, (void*)d_g, (void*)d_m, (void*)d_v, (void*)d_w, (void*)d_out, (void*)d_scratch}) {
        CUDA_CHECK(cudaFree(p));
    }
}

int main() {
    for (const Case& c : CASES) {
        test_adamw(c);
        test_copy<float>(c);
        test_copy<__nv_bfloat16>(c);
    }
    for (size_t n : NORM_SIZES) { test_global_norm(n, 0); }
    test_global_norm(1003, 1);
    bench_optimizer();
    return check_summary();
}
