/*
test_flash_attention.cu: cuda/flash_attention.cuh against attention_flash_forward and
attention_flash_backward of cpu/layers.h (and so against the stored-weights attention, which
test_gpt checks them against), in fp32 and bf16 (the CPU on the bf16-rounded qkv and dout): the
output, each row's log-sum-exp, and dqkv written over a buffer of other values. Shapes: one tile
(T = 8), T = 130 (three tiles, the last partial, with key and query rows past T), the largest head
(hs = 128) and hs = 96 (d72, d84). The backward run twice must give bitwise the same dqkv.
`test_flash_attention head-size` must stop with a message (hs = 12, not a multiple of 16).

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda/test_flash_attention && ./build/emu/dev/cuda/test_flash_attention
*/
#include "dev/cuda/kernel_test.h"
#include "cpu/layers.h"
#include "cuda/flash_attention.cuh"

struct Shape { int B, T, C, NH; };
static const Shape SHAPES[] = {{2, 8, 64, 4}, {2, 130, 64, 2}, {1, 70, 128, 1}, {1, 65, 192, 2}};
static const float QKV_SCALE = 1.5f;  // q.k / sqrt(hs) of order 1: softmaxes neither flat nor one-hot

template <typename floatX>
static void test_shape(const Shape& s) {
    int B = s.B, T = s.T, C = s.C, NH = s.NH;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    std::vector<float> qkv = rounded<floatX>(random_vector(nqkv, 1, QKV_SCALE));
    std::vector<float> dout = rounded<floatX>(random_vector(nout, 2));
    char what[128];

    // forward
    std::vector<float> out(nout), lse(nlse);
    attention_flash_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    floatX* d_qkv = upload<floatX>(qkv);
    floatX* d_out = upload<floatX>(random_vector(nout, 4));
    float* d_lse = upload<float>(random_vector(nlse, 5));
    flash_attention_forward_cuda<floatX>(d_out, d_lse, d_qkv, B, T, C, NH, 0);
    snprintf(what, sizeof what, "forward out (B=%d T=%d C=%d NH=%d)", B, T, C, NH);
    check_close<floatX>(max_rel_error(download(d_out, nout).data(), out.data(), nout), tolerance<floatX>(), "flash attention", what);
    snprintf(what, sizeof what, "forward log-sum-exp (T=%d hs=%d)", T, C / NH);
    check_close<floatX>(max_rel_error(download(d_lse, nlse).data(), lse.data(), nlse), tolerance<floatX>(), "flash attention", what);

    // backward from the CPU's (rounded) output and log-sum-exp on both sides, twice
    std::vector<float> out_in = rounded<floatX>(out), dqkv(nqkv, 0.0f);
    attention_flash_backward(dqkv.data(), dout.data(), qkv.data(), out_in.data(), lse.data(), B, T, C, NH);
    upload_into(d_out, out_in);
    upload_into(d_lse, lse);
    floatX *d_dout = upload<floatX>(dout), *d_dqkv[2];
    float* d_scratch = device_alloc<float>(flash_attention_scratch_floats(B, T, NH));
    for (int run = 0; run < 2; run++) {
        d_dqkv[run] = upload<floatX>(random_vector(nqkv, 6 + run));  // written over, not added to
        flash_attention_backward_cuda<floatX>(d_dqkv[run], d_dout, d_qkv, d_out, d_lse, B, T, C, NH, d_scratch, 0);
    }
    snprintf(what, sizeof what, "backward dqkv = (T=%d hs=%d)", T, C / NH);
    check_close<floatX>(max_rel_error(download(d_dqkv[0], nqkv).data(), dqkv.data(), nqkv), tolerance<floatX>(),
                        "flash attention", what);
    snprintf(what, sizeof what, "backward twice: bitwise equal (T=%d)", T);
    check(same_bits(d_dqkv[0], d_dqkv[1], nqkv), test_name<floatX>("flash attention", what), "%s", "the runs differ");

    for (void* p : {(void*)d_qkv, (void*)d_out, (void*)d_lse, (void*)d_dout, (void*)d_scratch, (void*)d_dqkv[0],
                    (void*)d_dqkv[1]}) {
        CUDA_CHECK(cudaFree(p));
    }
}

// GPT-2 d12's attention (B=8, T=1024, C=768, NH=12) on a GPU; FLOPs count the causal half of the
// tile products (forward 2 of them, backward 7: S and dP twice, dV, dK, dQ)
template <typename floatX>
static void bench_flash(void) {
#ifdef CUDA_EMU
    const int B = 1, T = 64, C = 32, NH = 2;
#else
    const int B = 8, T = 1024, C = 768, NH = 12;
#endif
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    floatX *d_qkv = upload<floatX>(random_vector(nqkv, 1)), *d_out = device_alloc<floatX>(nout);
    floatX* d_dqkv = device_alloc<floatX>(nqkv);
    float *d_lse = device_alloc<float>(nlse), *d_scratch = device_alloc<float>(flash_attention_scratch_floats(B, T, NH));
    double x = sizeof(floatX), half_square = (double)B * T * T * C;  // (B NH T^2 hs) / 2 per product... x2 FLOPs
    char name[64];
    snprintf(name, sizeof name, "flash_attention_forward %s", type_name<floatX>());
    bench(name, (nqkv + nout) * x + nlse * 4.0, 2.0 * half_square,
          [&] { flash_attention_forward_cuda<floatX>(d_out, d_lse, d_qkv, B, T, C, NH, 0); });
    snprintf(name, sizeof name, "flash_attention_backward %s", type_name<floatX>());
    bench(name, (2.0 * nqkv + 2.0 * nout) * x + 2.0 * nlse * 4.0, 7.0 * half_square, [&] {
        flash_attention_backward_cuda<floatX>(d_dqkv, d_out, d_qkv, d_out, d_lse, B, T, C, NH, d_scratch, 0);
    });
    for (void* p : {(void*)d_qkv, (void*)d_out, (void*)d_dqkv, (void*)d_lse, (void*)d_scratch}) { CUDA_CHECK(cudaFree(p)); }
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "head-size") == 0) {  // run_tests.sh: must stop with a message
        const int B = 1, T = 2, C = 48, NH = 4;
        __nv_bfloat16* d = device_alloc<__nv_bfloat16>((size_t)B * T * 3 * C);
        float* l = device_alloc<float>((size_t)B * NH * T);
        flash_attention_forward_cuda<__nv_bfloat16>(d, l, d, B, T, C, NH, 0);
        printf("hs=%d was accepted: it should have been refused\n", C / NH);
        return 0;
    }
    for (const Shape& s : SHAPES) {
        test_shape<float>(s);
        test_shape<__nv_bfloat16>(s);
    }
    bench_flash<float>();
    bench_flash<__nv_bfloat16>();
    return check_summary();
}
