/*
test_matmul.cu: cuda/matmul.cuh against matmul_forward/backward of cpu/layers.h, in fp32 and bf16 (the
CPU on the bf16-rounded inputs): forward with and without bias; backward onto gradients that
already hold values (+=), with B*T over one block of the bias gradient (B*T = 140 > MATMUL_BIAS_ROWS)
and odd C and OC; a second backward with dinp and dbias NULL must give bitwise the same dweight
and leave the others alone. dweight and dbias are fp32 in both modes and held to 1e-5.
dinp's other modes, onto a dinp of NaN bytes (beta = 0 must not read it): MATMUL_DINP_SET against
the CPU's matmul_backward onto zeros; MATMUL_DINP_SET_DGELU against it followed by gelu_backward
(cpu/layers.h), both by the DGELU epilogue and by the fallback a context takes where cuBLASLt
refuses DGELU (forced here: dgelu_refused set), with dweight still +=. The descriptor cache: more
distinct GEMMs than it holds (the rest made and destroyed per call), each right, and again from it.
`test_matmul bad-leading-dimension` must stop at a refused cuBLASLt call with CUBLAS_CHECK's message.

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda/test_matmul && ./build/emu/dev/cuda/test_matmul
*/
#include "dev/cuda/kernel_test.h"
#include "cpu/layers.h"
#include "cuda/matmul.cuh"

struct Shape { int B, T, C, OC; };
static const Shape SHAPES[] = {{2, 70, 64, 96}, {2, 9, 33, 43}};
static const float GELU_RANGE = 4.0f;  // GELU inputs in [-4, 4): both tails of the tanh

template <typename floatX>
static void test_shape(const Shape& s, const MatmulContext* mm) {
    int B = s.B, T = s.T, C = s.C, OC = s.OC, BT = B * T;
    size_t nin = (size_t)BT * C, nout = (size_t)BT * OC, nw = (size_t)OC * C;
    std::vector<float> inp = rounded<floatX>(random_vector(nin, 1)), w = rounded<floatX>(random_vector(nw, 2));
    std::vector<float> bias = rounded<floatX>(random_vector(OC, 3)), dout = rounded<floatX>(random_vector(nout, 4));
    std::vector<float> dinp0 = rounded<floatX>(random_vector(nin, 5)), dw0 = random_vector(nw, 6), db0 = random_vector(OC, 7);
    char what[128];

    // forward, with and without bias
    floatX *d_inp = upload<floatX>(inp), *d_w = upload<floatX>(w), *d_bias = upload<floatX>(bias);
    floatX* d_out = device_alloc<floatX>(nout);
    for (int with_bias = 1; with_bias >= 0; with_bias--) {
        std::vector<float> out(nout);
        matmul_forward(out.data(), inp.data(), w.data(), with_bias ? bias.data() : NULL, B, T, C, OC);
        matmul_forward_cuda<floatX>(d_out, d_inp, d_w, with_bias ? d_bias : NULL, B, T, C, OC, mm, 0);
        snprintf(what, sizeof what, "forward %s (BT=%d C=%d OC=%d)", with_bias ? "with bias" : "without bias", BT, C, OC);
        check_close<floatX>(max_rel_error(download(d_out, nout).data(), out.data(), nout), tolerance<floatX>(), "matmul", what);
    }

    // backward: everything, then dweight alone
    std::vector<float> dinp = dinp0, dw = dw0, db = db0;
    matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), B, T, C, OC);
    floatX* d_dout = upload<floatX>(dout);
    float* d_scratch = device_alloc<float>(matmul_backward_scratch_floats(B, T, OC));
    floatX* d_dinp = upload<floatX>(dinp0);
    float *d_dw[2], *d_db = upload<float>(db0);
    for (int run = 0; run < 2; run++) {
        d_dw[run] = upload<float>(dw0);
        matmul_backward_cuda<floatX>(run == 0 ? d_dinp : NULL, d_dw[run], run == 0 ? d_db : NULL, d_dout, d_inp, d_w,
                                     B, T, C, OC, d_scratch, mm, 0);
    }
    snprintf(what, sizeof what, "backward dinp += (C=%d OC=%d)", C, OC);
    check_close<floatX>(max_rel_error(download(d_dinp, nin).data(), dinp.data(), nin), tolerance<floatX>(), "matmul", what);
    snprintf(what, sizeof what, "backward dweight += (fp32, C=%d OC=%d)", C, OC);
    check_close<floatX>(max_rel_error(download(d_dw[0], nw).data(), dw.data(), nw), FP32_TOLERANCE, "matmul", what);
    snprintf(what, sizeof what, "backward dbias += (fp32, BT=%d OC=%d)", BT, OC);
    check_close<floatX>(max_rel_error(download(d_db, OC).data(), db.data(), OC), FP32_TOLERANCE, "matmul", what);
    snprintf(what, sizeof what, "backward again with dinp, dbias NULL: dweight bitwise equal (C=%d)", C);
    check(same_bits(d_dw[0], d_dw[1], nw), test_name<floatX>("matmul", what), "%s", "the runs differ");

    for (void* p : {(void*)d_inp, (void*)d_w, (void*)d_bias, (void*)d_out, (void*)d_dout, (void*)d_scratch,
                    (void*)d_dinp, (void*)d_dw[0], (void*)d_dw[1], (void*)d_db}) {
        CUDA_CHECK(cudaFree(p));
    }
}

// dinp of the modes that write it, from a dinp of NaN bytes: MATMUL_DINP_SET, and MATMUL_DINP_SET_DGELU
// on mm (fused, where cuBLASLt takes DGELU) and on unfused (GELU backward kernel). dweight += in each.
template <typename floatX>
static void test_dinp_modes(const Shape& s, const MatmulContext* mm, const MatmulContext* unfused) {
    int B = s.B, T = s.T, C = s.C, OC = s.OC, BT = B * T;
    size_t nin = (size_t)BT * C, nout = (size_t)BT * OC, nw = (size_t)OC * C;
    std::vector<float> inp = rounded<floatX>(random_vector(nin, 1)), w = rounded<floatX>(random_vector(nw, 2));
    std::vector<float> dout = rounded<floatX>(random_vector(nout, 4)), dw0 = random_vector(nw, 6);
    std::vector<float> pre_gelu = rounded<floatX>(random_vector(nin, 8, GELU_RANGE));
    // the CPU: dinp = dout @ w (onto zeros), then the GELU backward of it
    std::vector<float> set(nin, 0.0f), dgelu(nin, 0.0f), dw = dw0, db(OC, 0.0f);
    matmul_backward(set.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), B, T, C, OC);
    gelu_backward(dgelu.data(), pre_gelu.data(), set.data(), nin);
    floatX *d_inp = upload<floatX>(inp), *d_w = upload<floatX>(w), *d_dout = upload<floatX>(dout);
    floatX *d_pre = upload<floatX>(pre_gelu), *d_dinp = device_alloc<floatX>(nin);
    float* d_dw = device_alloc<float>(nw);
    const struct { MatmulDinp mode; const MatmulContext* ctx; const char* name; const std::vector<float>* want; } runs[] = {
        {MATMUL_DINP_SET, mm, "dinp = dout @ weight", &set},
        {MATMUL_DINP_SET_DGELU, mm, "dinp = gelu'(x) * (dout @ weight), DGELU epilogue", &dgelu},
        {MATMUL_DINP_SET_DGELU, unfused, "dinp = gelu'(x) * (dout @ weight), DGELU refused: in-place kernel", &dgelu},
    };
    char what[160];
    for (const auto& r : runs) {
        CUDA_CHECK(cudaMemset(d_dinp, 0xFF, nin * sizeof(floatX)));  // NaN: a GEMM that reads dinp gives NaN
        upload_into(d_dw, dw0);
        matmul_backward_cuda<floatX>(d_dinp, d_dw, NULL, d_dout, d_inp, d_w, B, T, C, OC, NULL, r.ctx, 0, r.mode, d_pre);
        snprintf(what, sizeof what, "backward %s (C=%d OC=%d)", r.name, C, OC);
        check_close<floatX>(max_rel_error(download(d_dinp, nin).data(), r.want->data(), nin), tolerance<floatX>(), "matmul", what);
        snprintf(what, sizeof what, "backward %s: dweight += (fp32, C=%d OC=%d)", r.name, C, OC);
        check_close<floatX>(max_rel_error(download(d_dw, nw).data(), dw.data(), nw), FP32_TOLERANCE, "matmul", what);
    }
    // the emulator takes DGELU with only the aux pointer (the probe of mm said yes); a GPU says here what it did
    printf("matmul %s: cuBLASLt %s the DGELU epilogue (C=%d OC=%d)\n", type_name<floatX>(),
           mm->cache->dgelu_refused ? "refused" : "took", C, OC);
#ifdef CUDA_EMU
    check(!mm->cache->dgelu_refused, test_name<floatX>("matmul", "the DGELU epilogue fused (emulated)"), "%s", "refused");
#endif
    for (void* p : {(void*)d_inp, (void*)d_w, (void*)d_dout, (void*)d_pre, (void*)d_dinp, (void*)d_dw}) { CUDA_CHECK(cudaFree(p)); }
}

// more distinct GEMMs than the cache holds (forwards of T = 1, 2, ...), twice: each right, the cache full
// after the first pass, and the second pass (cached ones and made-per-call ones alike) bitwise the same
static void test_cache(const MatmulContext* mm) {
    const int C = 8, OC = 8, GEMMS = MATMUL_CACHE_SIZE + 8;
    size_t nout = (size_t)GEMMS * (GEMMS + 1) / 2 * OC;  // the outputs, one after the other
    std::vector<float> inp = random_vector((size_t)GEMMS * C, 1), w = random_vector((size_t)OC * C, 2), want;
    for (int t = 1; t <= GEMMS; t++) {
        std::vector<float> out((size_t)t * OC);
        matmul_forward(out.data(), inp.data(), w.data(), NULL, 1, t, C, OC);
        want.insert(want.end(), out.begin(), out.end());
    }
    float *d_inp = upload<float>(inp), *d_w = upload<float>(w), *d_out[2];
    for (int pass = 0; pass < 2; pass++) {
        d_out[pass] = device_alloc<float>(nout);
        float* out = d_out[pass];
        for (int t = 1; t <= GEMMS; out += (size_t)t * OC, t++) { matmul_forward_cuda<float>(out, d_inp, d_w, NULL, 1, t, C, OC, mm, 0); }
        if (pass == 0) { check(mm->cache->count == MATMUL_CACHE_SIZE, "matmul: cache full", "%d plans", mm->cache->count); }
    }
    char what[96];
    snprintf(what, sizeof what, "cache: %d GEMMs, %d of them cached", GEMMS, MATMUL_CACHE_SIZE);
    check_close<float>(max_rel_error(download(d_out[0], nout).data(), want.data(), nout), FP32_TOLERANCE, "matmul", what);
    check(same_bits(d_out[0], d_out[1], nout), "matmul: cache: the second pass bitwise the same", "%s", "the passes differ");
    for (void* p : {(void*)d_inp, (void*)d_w, (void*)d_out[0], (void*)d_out[1]}) { CUDA_CHECK(cudaFree(p)); }
}

// the four linear layers of a GPT-2 d12 block (qkv, attention projection, fc, fc projection) on a GPU
template <typename floatX>
static void bench_matmul(const MatmulContext* mm) {
#ifdef CUDA_EMU
    const int B = 2, T = 16, C = 64;
#else
    const int B = 8, T = 1024, C = 768;
#endif
    const int LAYERS[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};  // (in, out) channels
    for (const int* layer : LAYERS) {
        int in = layer[0], OC = layer[1];
        size_t BT = (size_t)B * T;
        floatX *d_inp = upload<floatX>(random_vector(BT * in, 1)), *d_w = upload<floatX>(random_vector((size_t)OC * in, 2));
        floatX *d_bias = upload<floatX>(random_vector(OC, 3)), *d_out = device_alloc<floatX>(BT * OC);
        float *d_dw = upload<float>(std::vector<float>((size_t)OC * in, 0.0f)), *d_db = upload<float>(std::vector<float>(OC, 0.0f));
        float* d_scratch = device_alloc<float>(matmul_backward_scratch_floats(B, T, OC));
        floatX* d_dinp = upload<floatX>(std::vector<float>(BT * in, 0.0f));
        double x = sizeof(floatX), flops = 2.0 * BT * OC * in;
        char name[64];
        snprintf(name, sizeof name, "matmul_forward %s C=%d OC=%d", type_name<floatX>(), in, OC);
        bench(name, (BT * in + (double)OC * in + BT * OC) * x, flops,
              [&] { matmul_forward_cuda<floatX>(d_out, d_inp, d_w, d_bias, B, T, in, OC, mm, 0); });
        snprintf(name, sizeof name, "matmul_backward %s C=%d OC=%d", type_name<floatX>(), in, OC);
        bench(name, (2 * BT * in + (double)OC * in + BT * OC) * x + 8.0 * OC * in, 2 * flops, [&] {
            matmul_backward_cuda<floatX>(d_dinp, d_dw, d_db, d_out, d_inp, d_w, B, T, in, OC, d_scratch, mm, 0);
        });
        for (void* p : {(void*)d_inp, (void*)d_w, (void*)d_bias, (void*)d_out, (void*)d_dw, (void*)d_db,
                        (void*)d_scratch, (void*)d_dinp}) {
            CUDA_CHECK(cudaFree(p));
        }
    }
}

int main(int argc, char** argv) {
    MatmulContext mm, unfused;
    matmul_context_init(&mm, NULL, 0);
    matmul_context_init(&unfused, NULL, 0);
    unfused.cache->dgelu_refused = 1;  // as after a GPU refused DGELU: the GELU backward kernel runs instead
    if (argc > 1 && strcmp(argv[1], "bad-leading-dimension") == 0) {  // run_tests.sh: CUBLAS_CHECK's message
        float* d = device_alloc<float>(64);
        matmul_lt(&mm, false, false, 4, 4, 4, 1.0f, d, 2, 0, d, 4, 0, 0.0f, d + 32, 4, 0, 1, CUDA_R_32F, CUDA_R_32F,
                  NULL, 0);  // lda = 2 < m = 4 rows
        CUDA_CHECK(cudaDeviceSynchronize());
        printf("lda < m was accepted: it should have been refused\n");
        return 0;
    }
    for (const Shape& s : SHAPES) {
        test_shape<float>(s, &mm);
        test_shape<__nv_bfloat16>(s, &mm);
        test_dinp_modes<float>(s, &mm, &unfused);
        test_dinp_modes<__nv_bfloat16>(s, &mm, &unfused);
    }
    MatmulContext fresh;  // its cache starts empty
    matmul_context_init(&fresh, NULL, 0);
    test_cache(&fresh);
    matmul_context_free(&fresh);
    bench_matmul<float>(&mm);
    bench_matmul<__nv_bfloat16>(&mm);
    matmul_context_free(&mm);
    matmul_context_free(&unfused);
    return check_summary();
}
