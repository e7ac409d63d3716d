/*
test_encoder.cu: cuda/encoder.cuh against encoder_forward/backward of cpu/layers.h, in fp32 and bf16,
at a shape whose C is a multiple of the vector width and one whose C is not (C = 33), with a
small vocabulary so that tokens repeat (the scatter of the backward then adds several positions
into one row), and one with a skewed mix (one token at half the positions, GPT-2's vocabulary).
The backward adds in the CPU's order, so its gradients must be bitwise the CPU's on the same
(rounded) dout; it is also run twice (bitwise equal) and checked to accumulate (+=) onto gradients
that already hold values; the host's grouping of positions by token is checked on its own. It
prints the launch of dwte's kernel (blocks, warps, the longest chain of dependent adds) before and
now at d12 (B=16, T=1024) and d84 (B=1, T=1024) on TinyShakespeare-like token counts. On a GPU it
then times both at GPT-2 d12 shapes.
`test_encoder out-of-memory` must stop at a failing cudaMalloc with common.cuh's message.

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda/test_encoder && ./build/emu/dev/cuda/test_encoder
*/
#include "dev/cuda/kernel_test.h"
#include "cpu/layers.h"
#include "cuda/encoder.cuh"

struct Shape { int B, T, C, V; bool skewed; };
static const Shape SHAPES[] = {{2, 8, 64, 11, false}, {2, 9, 33, 7, false}, {1, 40, 16, 50304, true}};
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
    if (s.skewed) {
        for (size_t i = 0; i < inp.size(); i += 2) { inp[i] = V - 1; }  // the last token id at every other position
    }
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
    int* d_scratch = device_alloc<int>(encoder_backward_scratch_ints(B, T));
    float *d_dwte[2], *d_dwpe[2];
    for (int run = 0; run < 2; run++) {
        d_dwte[run] = upload<float>(dwte0);
        d_dwpe[run] = upload<float>(dwpe0);
        encoder_backward_cuda<floatX>(d_dwte[run], d_dwpe[run], d_dout, inp.data(), B, T, C, d_scratch, 0);
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
    for (void* p : {(void*)d_inp, (void*)d_wte, (void*)d_wpe, (void*)d_out, (void*)d_dout, (void*)d_scratch}) {
        CUDA_CHECK(cudaFree(p));
    }
}

// encoder_buckets: every position once, in its token's bucket, increasing; buckets largest first
static void test_buckets() {
    const int BT = 1000, V = 37;
    std::vector<int> inp = random_tokens(BT, V, 3), out(4 * BT);
    for (int i = 0; i < BT; i += 3) { inp[i] = 5; }
    int nb = encoder_buckets(inp.data(), BT, out.data());
    std::vector<int> seen(BT, 0);
    bool ok = nb > 0 && nb <= V;
    for (int b = 0; ok && b < nb; b++) {
        const int* k = &out[BT + 3 * b];
        ok = k[2] > 0 && (b == 0 || k[2] <= out[BT + 3 * (b - 1) + 2]);
        for (int i = k[1]; ok && i < k[1] + k[2]; i++) {
            int pos = out[i];
            ok = pos >= 0 && pos < BT && inp[pos] == k[0] && seen[pos]++ == 0 && (i == k[1] || out[i - 1] < pos);
        }
    }
    for (int i = 0; ok && i < BT; i++) { ok = seen[i] == 1; }
    check(ok && out[BT] == 5, "encoder: positions grouped by token: each once, increasing, largest bucket first", "%d buckets", nb);
}

// the launch of dwte's kernel, before (commit 78312d3: 32 token groups x ceil(C/128) blocks of 128
// threads, each scanning all B*T positions; a thread's chain: every position of its group) and now
// (a thread per distinct token and pack of 8 bf16 channels; its chain: its token's positions), for
// the distinct tokens and the most frequent token's count of B*T tokens of TinyShakespeare (about
// 10,000 distinct tokens in 338,025; the most frequent, ",", about 5% of them)
static void print_launches() {
    const struct { const char* model; int BT, C; } sizes[] = {{"d12 B=16 T=1024", 16 * 1024, 768}, {"d84 B=1 T=1024", 1024, 3456}};
    for (const auto& z : sizes) {
        int blocks = ceil_div(z.C, 128) * 32, distinct = z.BT < 2000 ? z.BT / 3 : 3000, top = z.BT / 20;
        printf("encoder_backward dwte before %s: %5d blocks x 4 warps = %6d warps, %5d serial steps a thread (B*T/32 ballots,"
               " then its group's adds)\n", z.model, blocks, blocks * 4, z.BT / 32 * 2);
        size_t threads = (size_t)distinct * ceil_div(z.C, 8);
        printf("encoder_backward dwte now    %s: %5zu blocks x 4 warps = %6zu warps, %5d serial steps a thread at most"
               " (assumed: %d distinct tokens, the commonest at 5%%)\n", z.model, ceil_div(threads, (size_t)ENCODER_BLOCK),
               ceil_div(threads, (size_t)ENCODER_BLOCK) * 4, top, distinct);
    }
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
    std::vector<int> inp = random_tokens((size_t)B * T, V, 7);
    int* d_inp = upload_ints(inp);
    int* d_scratch = device_alloc<int>(encoder_backward_scratch_ints(B, T));
    floatX *d_wte = upload<floatX>(random_vector((size_t)V * C, 8)), *d_wpe = upload<floatX>(random_vector((size_t)T * C, 9));
    floatX* d_out = device_alloc<floatX>(BTC);
    float *d_dwte = upload<float>(std::vector<float>((size_t)V * C, 0.0f)), *d_dwpe = upload<float>(std::vector<float>((size_t)T * C, 0.0f));
    double x = sizeof(floatX);
    char name[64];
    snprintf(name, sizeof name, "encoder_forward %s", type_name<floatX>());
    bench(name, 3.0 * BTC * x + 4.0 * B * T, (double)BTC, [&] { encoder_forward_cuda<floatX>(d_out, d_inp, d_wte, d_wpe, B, T, C, 0); });
    snprintf(name, sizeof name, "encoder_backward %s", type_name<floatX>());
    bench(name, BTC * x * 2 + BTC * 8.0 + (double)T * C * 8, 2.0 * BTC,
          [&] { encoder_backward_cuda<floatX>(d_dwte, d_dwpe, d_out, inp.data(), B, T, C, d_scratch, 0); });
    for (void* p : {(void*)d_inp, (void*)d_wte, (void*)d_wpe, (void*)d_out, (void*)d_dwte, (void*)d_dwpe, (void*)d_scratch}) {
        CUDA_CHECK(cudaFree(p));
    }
}

int main(int argc, char** argv) {
    // run_tests.sh: a failing CUDA call stops with the call, the error's name, a hint and file:line
    if (argc > 1 && strcmp(argv[1], "out-of-memory") == 0) {
        float* p = device_alloc<float>((size_t)1 << 48);
        printf("allocated %p: the device should have refused\n", (void*)p);
        return 0;
    }
    print_launches();
    test_buckets();
    for (const Shape& s : SHAPES) {
        test_shape<float>(s);
        test_shape<__nv_bfloat16>(s);
    }
    bench_encoder<float>();
    bench_encoder<__nv_bfloat16>();
    return check_summary();
}
