/*
test_encoder.cu: cuda/encoder.cuh against encoder_forward/backward of cpu/layers.h, in fp32 and bf16,
at a shape whose C is a multiple of the vector width and one whose C is not (C = 33), with a
small vocabulary so that tokens repeat (the scatter of the backward then adds several positions
into one row). The backward adds in the CPU's order, so its gradients must be bitwise the CPU's
on the same (rounded) dout; it is also run twice (bitwise equal) and checked to accumulate (+=)
onto gradients that already hold values. On a GPU it then times both at GPT-2 d12 shapes.
`test_encoder out-of-memory` must stop at a failing cudaMalloc with common.cuh's message.

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda/test_encoder && ./build/emu/dev/cuda/test_encoder
*/
#include "dev/cuda/kernel_test.h"
#include "cpu/layers.h"
#include "cuda/encoder.cuh"

struct Shape { int B, T, C, V; };
static const Shape SHAPES[] = {{2, 8, 64, 11}, {2, 9, 33, 7}};
static const int EXTRA_POSITIONS = 3;  // wpe has maxT = T + 3 rows, as a model longer than the batch

static std::vector<int> random_tokens(size_t n, int V, unsigned seed) {
    std::vector<int> tokens(n);
    unsigned s = seed;
    for (int& t : tokens) {
        s = s * 1664525u + 1013904223u;
        t = (int)((s >> 8) % (unsigned)V);
    }
    return tokens;
}

template <typename floatX>
static void test_shape(const Shape& s) {
    int B = s.B, T = s.T, C = s.C, V = s.V, maxT = T + EXTRA_POSITIONS;
    size_t BTC = (size_t)B * T * C, VC = (size_t)V * C, TC = (size_t)maxT * C;
    std::vector<int> inp = random_tokens((size_t)B * T, V, 1);
    std::vector<float> wte = rounded<floatX>(random_vector(VC, 2)), wpe = rounded<floatX>(random_vector(TC, 3));
    std::vector<float> dout = rounded<floatX>(random_vector(BTC, 4));
    std::vector<float> dwte0 = random_vector(VC, 5), dwpe0 = random_vector(TC, 6);  // the += contract
    char what[128];

    // forward
    std::vector<float> out(BTC);
    encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    int* d_inp = upload_ints(inp);
    floatX *d_wte = upload<floatX>(wte), *d_wpe = upload<floatX>(wpe), *d_out = device_alloc<floatX>(BTC);
    encoder_forward_cuda<floatX>(d_out, d_inp, d_wte, d_wpe, B, T, C, 0);
    float err = max_rel_error(download(d_out, BTC).data(), out.data(), BTC);
    snprintf(what, sizeof what, "forward vs cpu/layers.h (B=%d T=%d C=%d)", B, T, C);
    check_close<floatX>(err, tolerance<floatX>(), "encoder", what);

    // backward, twice, onto the same starting gradients
    std::vector<float> dwte = dwte0, dwpe = dwpe0;
    encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);
    floatX* d_dout = upload<floatX>(dout);
    float *d_dwte[2], *d_dwpe[2];
    for (int run = 0; run < 2; run++) {
        d_dwte[run] = upload<float>(dwte0);
        d_dwpe[run] = upload<float>(dwpe0);
        encoder_backward_cuda<floatX>(d_dwte[run], d_dwpe[run], d_dout, d_inp, B, T, C, 0);
    }
    std::vector<float> got_dwte = download(d_dwte[0], VC), got_dwpe = download(d_dwpe[0], TC);
    float err_wte = max_rel_error(got_dwte.data(), dwte.data(), VC);
    float err_wpe = max_rel_error(got_dwpe.data(), dwpe.data(), TC);
    bool exact = memcmp(got_dwte.data(), dwte.data(), VC * sizeof(float)) == 0 &&
                 memcmp(got_dwpe.data(), dwpe.data(), TC * sizeof(float)) == 0;
    snprintf(what, sizeof what, "backward += onto set gradients, bitwise the CPU's order (C=%d)", C);
    check(exact, test_name<floatX>("encoder", what), "dwte %g, dwpe %g max relative error", err_wte, err_wpe);
    bool same = same_bits(d_dwte[0], d_dwte[1], VC) && same_bits(d_dwpe[0], d_dwpe[1], TC);
    snprintf(what, sizeof what, "backward run twice: bitwise equal (C=%d)", C);
    check(same, test_name<floatX>("encoder", what), "%s", "the two runs differ");

    for (int run = 0; run < 2; run++) {
        CUDA_CHECK(cudaFree(d_dwte[run]));
        CUDA_CHECK(cudaFree(d_dwpe[run]));
    }
    for (void* p : {(void*)d_inp, (void*)d_wte, (void*)d_wpe, (void*)d_out, (void*)d_dout}) { CUDA_CHECK(cudaFree(p)); }
}

// GPT-2 d12 shapes on a GPU; tiny ones on the emulated device
template <typename floatX>
static void bench_encoder() {
#ifdef CUDA_EMU
    const int B = 2, T = 16, C = 64, V = 128;
#else
    const int B = 8, T = 1024, C = 768, V = 50304;
#endif
    size_t BTC = (size_t)B * T * C;
    int* d_inp = upload_ints(random_tokens((size_t)B * T, V, 7));
    floatX *d_wte = upload<floatX>(random_vector((size_t)V * C, 8)), *d_wpe = upload<floatX>(random_vector((size_t)T * C, 9));
    floatX* d_out = device_alloc<floatX>(BTC);
    float *d_dwte = upload<float>(std::vector<float>((size_t)V * C, 0.0f)), *d_dwpe = upload<float>(std::vector<float>((size_t)T * C, 0.0f));
    double x = sizeof(floatX);
    char name[64];
    snprintf(name, sizeof name, "encoder_forward %s", type_name<floatX>());
    bench(name, 3.0 * BTC * x + 4.0 * B * T, (double)BTC, [&] { encoder_forward_cuda<floatX>(d_out, d_inp, d_wte, d_wpe, B, T, C, 0); });
    snprintf(name, sizeof name, "encoder_backward %s", type_name<floatX>());
    bench(name, BTC * x * 2 + BTC * 8.0 + (double)T * C * 8, 2.0 * BTC,
          [&] { encoder_backward_cuda<floatX>(d_dwte, d_dwpe, d_out, d_inp, B, T, C, 0); });
    for (void* p : {(void*)d_inp, (void*)d_wte, (void*)d_wpe, (void*)d_out, (void*)d_dwte, (void*)d_dwpe}) { CUDA_CHECK(cudaFree(p)); }
}

int main(int argc, char** argv) {
    // run_tests.sh: a failing CUDA call stops with the call, the error's name, a hint and file:line
    if (argc > 1 && strcmp(argv[1], "out-of-memory") == 0) {
        float* p = device_alloc<float>((size_t)1 << 48);
        printf("allocated %p: the device should have refused\n", (void*)p);
        return 0;
    }
    for (const Shape& s : SHAPES) {
        test_shape<float>(s);
        test_shape<__nv_bfloat16>(s);
    }
    bench_encoder<float>();
    bench_encoder<__nv_bfloat16>();
    return check_summary();
}
