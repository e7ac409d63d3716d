/*
test_attention.cu: cuda/attention.cuh against attention_forward and attention_backward of
cpu/layers.h, in fp32 and bf16 (the CPU on the bf16-rounded qkv, dout and att): the weights (the
whole (B,NH,T,T), zeros after t included, written over a buffer of other values), the output, and
dqkv accumulated (+=) onto values already there. Shapes: a head size that is not a multiple of the
bf16 vector width (hs = 12, odd T = 13), and T = 130 (rows longer than a warp's one pass).
attention_weights_forward_cuda alone must give bitwise the weights attention_forward_cuda gives,
and the backward run twice bitwise the same dqkv. `test_attention indivisible-heads` must stop
with a message (C = 30, NH = 4).

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda/test_attention && ./build/emu/dev/cuda/test_attention
*/
#include "dev/cuda/kernel_test.h"
#include "cpu/layers.h"
#include "cuda/attention.cuh"

struct Shape { int B, T, C, NH; };
static const Shape SHAPES[] = {{2, 8, 64, 4}, {2, 13, 48, 4}, {1, 130, 32, 2}};
static const float QKV_SCALE = 1.5f;  // q.k / sqrt(hs) of order 1: softmaxes neither flat nor one-hot

template <typename floatX>
static void test_shape(const Shape& s, const MatmulContext* mm) {
    int B = s.B, T = s.T, C = s.C, NH = s.NH;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    std::vector<float> qkv = rounded<floatX>(random_vector(nqkv, 1, QKV_SCALE));
    std::vector<float> dout = rounded<floatX>(random_vector(nout, 2));
    std::vector<float> dqkv0 = rounded<floatX>(random_vector(nqkv, 3));
    char what[128];

    // forward
    std::vector<float> out(nout), att(natt);
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    floatX* d_qkv = upload<floatX>(qkv);
    floatX *d_out = device_alloc<floatX>(nout), *d_att = upload<floatX>(random_vector(natt, 4));
    floatX* d_att2 = upload<floatX>(random_vector(natt, 5));
    floatX* d_scratch = device_alloc<floatX>(attention_scratch_floats(B, T, C, NH));
    attention_forward_cuda<floatX>(d_out, d_att, d_qkv, B, T, C, NH, d_scratch, mm, 0);
    snprintf(what, sizeof what, "forward att, zero after t (B=%d T=%d C=%d NH=%d)", B, T, C, NH);
    check_close<floatX>(max_rel_error(download(d_att, natt).data(), att.data(), natt), tolerance<floatX>(), "attention", what);
    snprintf(what, sizeof what, "forward out (T=%d hs=%d)", T, C / NH);
    check_close<floatX>(max_rel_error(download(d_out, nout).data(), out.data(), nout), tolerance<floatX>(), "attention", what);
    attention_weights_forward_cuda<floatX>(d_att2, d_qkv, B, T, C, NH, d_scratch, mm, 0);
    snprintf(what, sizeof what, "attention_weights_forward alone: the same att, bitwise (T=%d)", T);
    check(same_bits(d_att, d_att2, natt), test_name<floatX>("attention", what), "%s", "they differ");

    // backward from the (rounded) CPU weights on both sides, twice
    std::vector<float> att_in = rounded<floatX>(att), dqkv(nqkv), datt(natt);
    attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att_in.data(), B, T, C, NH);  // (writes dqkv)
    for (size_t i = 0; i < nqkv; i++) { dqkv[i] += dqkv0[i]; }  // the CUDA launcher adds onto what is there
    upload_into(d_att, att_in);
    floatX *d_dout = upload<floatX>(dout), *d_datt = device_alloc<floatX>(natt), *d_dqkv[2];
    for (int run = 0; run < 2; run++) {
        d_dqkv[run] = upload<floatX>(dqkv0);
        attention_backward_cuda<floatX>(d_dqkv[run], d_datt, d_dout, d_qkv, d_att, B, T, C, NH, d_scratch, mm, 0);
    }
    snprintf(what, sizeof what, "backward dqkv += (T=%d hs=%d)", T, C / NH);
    check_close<floatX>(max_rel_error(download(d_dqkv[0], nqkv).data(), dqkv.data(), nqkv), tolerance<floatX>(),
                        "attention", what);
    snprintf(what, sizeof what, "backward twice: bitwise equal (T=%d)", T);
    check(same_bits(d_dqkv[0], d_dqkv[1], nqkv), test_name<floatX>("attention", what), "%s", "the runs differ");

    for (void* p : {(void*)d_qkv, (void*)d_out, (void*)d_att, (void*)d_att2, (void*)d_scratch, (void*)d_dout,
                    (void*)d_datt, (void*)d_dqkv[0], (void*)d_dqkv[1]}) {
        CUDA_CHECK(cudaFree(p));
    }
}

// GPT-2 d12's attention (B=8, T=1024, C=768, NH=12) on a GPU; FLOPs count the whole T x T squares
// the GEMMs compute (4 B T^2 C forward, 8 B T^2 C backward)
template <typename floatX>
static void bench_attention(const MatmulContext* mm) {
#ifdef CUDA_EMU
    const int B = 1, T = 16, C = 32, NH = 2;
#else
    const int B = 8, T = 1024, C = 768, NH = 12;
#endif
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    floatX *d_qkv = upload<floatX>(random_vector(nqkv, 1)), *d_out = device_alloc<floatX>(nout);
    floatX *d_att = device_alloc<floatX>(natt), *d_datt = device_alloc<floatX>(natt);
    floatX* d_scratch = device_alloc<floatX>(attention_scratch_floats(B, T, C, NH));
    floatX* d_dqkv = upload<floatX>(std::vector<float>(nqkv, 0.0f));
    double x = sizeof(floatX), square = (double)B * T * T * C;
    char name[64];
    snprintf(name, sizeof name, "attention_forward %s", type_name<floatX>());
    bench(name, (nqkv + 2.0 * nout + 3.0 * natt) * x + 4.0 * nout * x, 4.0 * square,
          [&] { attention_forward_cuda<floatX>(d_out, d_att, d_qkv, B, T, C, NH, d_scratch, mm, 0); });
    snprintf(name, sizeof name, "attention_backward %s", type_name<floatX>());
    bench(name, (3.0 * nqkv + 2.0 * nout + 6.0 * natt) * x + 8.0 * nout * x, 8.0 * square, [&] {
        attention_backward_cuda<floatX>(d_dqkv, d_datt, d_out, d_qkv, d_att, B, T, C, NH, d_scratch, mm, 0);
    });
    for (void* p : {(void*)d_qkv, (void*)d_out, (void*)d_att, (void*)d_datt, (void*)d_scratch, (void*)d_dqkv}) {
        CUDA_CHECK(cudaFree(p));
    }
}

int main(int argc, char** argv) {
    MatmulContext mm;
    matmul_context_init(&mm, NULL, 0);
    if (argc > 1 && strcmp(argv[1], "indivisible-heads") == 0) {  // run_tests.sh: must stop with a message
        const int B = 1, T = 2, C = 30, NH = 4;
        __nv_bfloat16* d = device_alloc<__nv_bfloat16>((size_t)B * T * 3 * C + attention_scratch_floats(B, T, C, NH));
        attention_forward_cuda<__nv_bfloat16>(d, d, d, B, T, C, NH, d, &mm, 0);
        printf("C=%d NH=%d was accepted: it should have been refused\n", C, NH);
        return 0;
    }
    for (const Shape& s : SHAPES) {
        test_shape<float>(s, &mm);
        test_shape<__nv_bfloat16>(s, &mm);
    }
    bench_attention<float>(&mm);
    bench_attention<__nv_bfloat16>(&mm);
    matmul_context_free(&mm);
    return check_summary();
}
