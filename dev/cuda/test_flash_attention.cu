/*
test_flash_attention.cu: cuda/flash_attention.cuh against attention_flash_forward and
attention_flash_backward of cpu/layers.h (and so against the stored-weights attention, which
test_gpt checks them against), in fp32 and bf16 (the CPU on the bf16-rounded qkv and dout): the
output, each row's log-sum-exp, and dqkv written over a buffer of other values. Both forward
designs in bf16 (tiles in registers, the one bf16 runs; tiles in shared memory, fp32's, timed beside
it). Shapes: one tile (T = 8, hs = 16), T = 130 (three tiles, the last partial, with key and query
rows past T), hs = 64 over two tiles, the largest head (hs = 128) and hs = 96 (d72, d84). The
backward run twice must give bitwise the same dqkv.
`test_flash_attention head-size` must stop with a message (hs = 12, not a multiple of 16); qkv, out,
dout and dqkv off the alignment the kernels' wide accesses need stop the call, naming the tensor.

It prints, per kernel and design, what a GPU would show without one: tile products per (query, key)
tile pair, shared-memory bytes moved per tile pair, registers (the header's FLASH_PTXAS) and blocks
per SM on an A100 and an H100. On a GPU it times both forward designs and the backward at GPT-2 d12's
shapes and prints TFLOP/s (causal FLOPs) beside cuBLAS's batched GEMMs of the same products.

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda/test_flash_attention && ./build/emu/dev/cuda/test_flash_attention
*/
#include "dev/cuda/kernel_test.h"
#include "cpu/layers.h"
#include "cuda/flash_attention.cuh"

struct Shape { int B, T, C, NH; };
static const Shape SHAPES[] = {{2, 8, 64, 4}, {2, 130, 64, 2}, {1, 100, 64, 1}, {1, 70, 128, 1}, {1, 65, 192, 2}};
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
    if (flash_design<floatX>() != FLASH_TILES_IN_SHARED) {  // the other design, timed beside it
        upload_into(d_out, random_vector(nout, 4));
        flash_forward_launch<FLASH_TILES_IN_SHARED>(d_out, d_lse, d_qkv, B, T, C, NH, 0);
        snprintf(what, sizeof what, "forward, tiles in shared memory (T=%d hs=%d)", T, C / NH);
        check_close<floatX>(max_rel_error(download(d_out, nout).data(), out.data(), nout), tolerance<floatX>(), "flash attention", what);
    }

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
    if (flash_design<floatX>() != FLASH_TILES_IN_SHARED) {  // the other design, timed beside it
        upload_into(d_dqkv[1], random_vector(nqkv, 8));
        flash_backward_launch<FLASH_TILES_IN_SHARED>(d_dqkv[1], d_dout, d_qkv, d_out, d_lse, B, T, C, NH, d_scratch, 0);
        snprintf(what, sizeof what, "backward, tiles in shared memory (T=%d hs=%d)", T, C / NH);
        check_close<floatX>(max_rel_error(download(d_dqkv[1], nqkv).data(), dqkv.data(), nqkv), tolerance<floatX>(),
                            "flash attention", what);
    }

    for (void* p : {(void*)d_qkv, (void*)d_out, (void*)d_lse, (void*)d_dout, (void*)d_scratch, (void*)d_dqkv[0],
                    (void*)d_dqkv[1]}) {
        CUDA_CHECK(cudaFree(p));
    }
}

// ----------------------------------------------------------------------------
// the designs side by side: per kernel, for one (query tile, key tile) pair of 64 x 64 and head size
// hs (bf16), the tile products (64 x 64 x hs or 64 x hs x 64 each), the bytes that pass through
// shared memory (written and read), and from the header's ptxas figures (FLASH_PTXAS, in this
// order), registers and blocks per SM. Shared-memory traffic per pair, by kernel:
//   forward, tiles in registers: K, V written by cp.async, each read once per warp by ldmatrix
//   forward, tiles in shared memory: K, V written (2 * 64 hs * 2 bytes); wmma loads for S = Q K^T
//     (4 warps x 4 column tiles x (Q and K 16 x hs)); S written, read twice, P written (fp32 S,
//     bf16 P, 64 x 64); O rescaled (read and written, fp32); P V: per warp and 16 channels, O in and
//     out (fp32), P and V (bf16 16 x 64)
//   backward dK dV, tiles in shared memory: Q, dO written; S and dP products' wmma loads; S, dP
//     written and read (fp32), P, dS written (bf16); dV += P^T dO, dK += dS^T Q (per warp and 16
//     channels: 2 x (16 x 64 + 64 x 16) bf16)
//   backward dQ, tiles in shared memory: K, V written; S and dP loads; S, dP written and read; dS
//     written; dQ += dS K (per warp and 16 channels: 16 x 64 + 64 x 16 bf16)
//   backward dK dV, tiles in registers: Q, dO written by cp.async; per warp and step of STEP
//     queries, its K and V rows (A fragments, 16 x hs each) read again; per warp, Q and dO read
//     twice (once as B for S^T and dP^T, once .trans for dK and dV)
//   backward dQ, tiles in registers: K, V written; per warp, K and V read for S and dP, K again
//     (.trans) for dQ
struct FlashKernelRow {
    const char* role;
    int products;  // tile products per tile pair
};
static const FlashKernelRow FLASH_ROWS[] = {  // FLASH_PTXAS's rows
    {"forward bf16, after", 2},               // S, PV
    {"forward bf16 before, fp32", 2},
    {"backward dK dV bf16 before, fp32", 4},  // S, dP, dV, dK
    {"backward dQ bf16 before, fp32", 3},     // S, dP, dQ
    {"backward dK dV bf16, after", 4},
    {"backward dQ bf16, after", 3},
};

static double flash_smem_moved(int row, int hs) {
    const double X = 2, F = 4, tile = 64, warps = 4, pair_f32 = tile * tile * F, pair_x = tile * tile * X;
    double head_tile = tile * hs * X;                    // one 64 x hs bf16 tile
    double wmma_operands = warps * 4 * 2 * 16 * hs * X;  // a 64 x 64 product over hs, 16 x 16 tiles
    double per_channel_tiles = warps * (hs / 16.0);      // (warp, 16 channels) pairs of a 64 x hs result
    double warp_rows = 16 * hs * X;                      // a warp's 16 rows of a head
    switch (row) {
        case 0: return 2 * head_tile + 2 * warps * head_tile;
        case 1: return 2 * head_tile + wmma_operands + pair_f32 * 3 + pair_x + 2 * tile * hs * F +
                       per_channel_tiles * (2 * 16 * 16 * F + 2 * 16 * tile * X);
        case 2: return 2 * head_tile + 2 * wmma_operands + 4 * pair_f32 + 2 * pair_x + per_channel_tiles * 4 * 16 * tile * X;
        case 3: return 2 * head_tile + 2 * wmma_operands + 4 * pair_f32 + pair_x + per_channel_tiles * 2 * 16 * tile * X;
        case 4: return 2 * head_tile + warps * (tile / FLASH2_STEP(hs)) * 2 * warp_rows + warps * 4 * head_tile;
        default: return 2 * head_tile + warps * 3 * head_tile;
    }
}

static size_t flash_smem_block(int row, int hs) {
    switch (row) {
        case 0: return flash2_forward_smem_bytes(hs);
        case 1: return flash_smem_bytes<__nv_bfloat16>(hs, false);
        case 2:
        case 3: return flash_smem_bytes<__nv_bfloat16>(hs, true);
        default: return flash2_backward_smem_bytes(hs, row == 4);
    }
}

// blocks of 128 threads per SM: registers (64K per SM, allocated per warp in multiples of 256, i.e.
// per thread in multiples of 8), shared memory (plus 1 KiB the runtime reserves per block), threads
static int flash_blocks_per_sm(int regs, size_t smem, size_t smem_per_sm) {
    const int threads = FLASH_WARPS * WARP_SIZE, regs_per_sm = 65536, threads_per_sm = 2048, reserved = 1024;
    int by_regs = regs_per_sm / (((regs + 7) / 8 * 8) * threads);
    int by_smem = (int)(smem_per_sm / (smem + reserved));
    return std::min(std::min(by_regs, by_smem), threads_per_sm / threads);
}

static void print_designs(void) {
    const size_t A100_SMEM = 164 * 1024, H100_SMEM = 228 * 1024;
    const int rows = (int)(sizeof FLASH_PTXAS / sizeof FLASH_PTXAS[0]);
    check(rows == (int)(sizeof FLASH_ROWS / sizeof FLASH_ROWS[0]), "flash attention: a role for every kernel of FLASH_PTXAS",
          "%d kernels, %d roles", rows, (int)(sizeof FLASH_ROWS / sizeof FLASH_ROWS[0]));
    printf("flash attention kernels per (64 query x 64 key) tile pair, bf16 (registers: ptxas, FLASH_PTXAS):\n");
    printf("  %-40s %-33s %3s %8s %11s %10s %19s\n", "kernel", "role", "hs", "products", "smem B/pair", "regs 80/90",
           "blocks/SM A100/H100");
    for (int row = 0; row < rows; row++) {
        for (int hs : {64, 128}) {
            const FlashPtxas& f = FLASH_PTXAS[row];
            int i = hs / 16 - 1;
            size_t smem = flash_smem_block(row, hs);
            printf("  %-40s %-33s %3d %8d %11.0f %6d/%-3d %13d/%d   (%zu B shared/block)\n", f.kernel, FLASH_ROWS[row].role,
                   hs, FLASH_ROWS[row].products, flash_smem_moved(row, hs), f.regs_sm80[i], f.regs_sm90[i],
                   flash_blocks_per_sm(f.regs_sm80[i], smem, A100_SMEM), flash_blocks_per_sm(f.regs_sm90[i], smem, H100_SMEM),
                   smem);
        }
    }
}

// cuBLAS's batched GEMMs of the attention's two forward products, full (not causal) T x T: S = Q K^T
// and O = P V per (b, h), bf16 in, fp32 accumulation
static void bench_cublas_pair(int BNH, int T, int hs) {
    size_t nq = (size_t)BNH * T * hs, np = (size_t)BNH * T * T;
    __nv_bfloat16 *q = device_alloc<__nv_bfloat16>(nq), *k = device_alloc<__nv_bfloat16>(nq), *p = device_alloc<__nv_bfloat16>(np);
    __nv_bfloat16* o = device_alloc<__nv_bfloat16>(nq);
    upload_into(q, random_vector(nq, 11));
    upload_into(k, random_vector(nq, 12));
    upload_into(p, random_vector(np, 13));
    cublasHandle_t handle;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) { fail("cublasCreate failed\n  hint: is a GPU there?"); }
    const float one = 1.0f, zero = 0.0f;
    double flops = 2.0 * 2.0 * BNH * (double)T * T * hs;
    double s = bench("cuBLAS batched GEMMs S=QK^T, O=PV (bf16, full)", (2.0 * nq + np) * 2 * 2, flops, [&] {
        // column major: S^T (T x T) = K Q^T, then O^T (hs x T) = V^T P^T
        cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &one, k, CUDA_R_16BF, hs, (long long)T * hs,
                                   q, CUDA_R_16BF, hs, (long long)T * hs, &zero, p, CUDA_R_16BF, T, (long long)T * T, BNH,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &one, k, CUDA_R_16BF, hs, (long long)T * hs,
                                   p, CUDA_R_16BF, T, (long long)T * T, &zero, o, CUDA_R_16BF, hs, (long long)T * hs, BNH,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
    if (s > 0) { printf("      cuBLAS: %.1f TFLOP/s on the full T x T products\n", flops / s / 1e12); }
    CUDA_CHECK(cudaDeviceSynchronize());
    cublasDestroy(handle);
    for (void* x : {(void*)q, (void*)k, (void*)p, (void*)o}) { CUDA_CHECK(cudaFree(x)); }
}

// one design's forward and backward, timed; FLOPs count the causal half of the tile products
// (forward 2 of them, backward 7: S and dP twice, dV, dK, dQ), llm.c's count
template <FlashDesign DESIGN, typename floatX>
static void bench_designs(floatX* d_out, floatX* d_dqkv, const floatX* d_qkv, float* d_lse, float* d_scratch, int B, int T,
                          int C, int NH) {
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    double x = sizeof(floatX), half_square = (double)B * T * T * C;  // (B NH T^2 hs) / 2 per product... x2 FLOPs
    const char* where = DESIGN == FLASH_TILES_IN_REGISTERS ? "registers" : "shared";
    char name[96];
    snprintf(name, sizeof name, "flash_attention_forward %s, tiles in %s", type_name<floatX>(), where);
    double s = bench(name, (nqkv + nout) * x + nlse * 4.0, 2.0 * half_square,
                     [&] { flash_forward_launch<DESIGN>(d_out, d_lse, d_qkv, B, T, C, NH, 0); });
    if (s > 0) { printf("      %.1f TFLOP/s (causal)\n", 2.0 * half_square / s / 1e12); }
    snprintf(name, sizeof name, "flash_attention_backward %s, tiles in %s", type_name<floatX>(), where);
    s = bench(name, (2.0 * nqkv + 2.0 * nout) * x + 2.0 * nlse * 4.0, 7.0 * half_square, [&] {
        flash_backward_launch<DESIGN>(d_dqkv, d_out, d_qkv, d_out, d_lse, B, T, C, NH, d_scratch, 0);
    });
    if (s > 0) { printf("      %.1f TFLOP/s (causal, 7 products)\n", 7.0 * half_square / s / 1e12); }
}

// GPT-2 d12's attention (B=8, T=1024, C=768, NH=12) on a GPU, tiny on the emulated device: each
// design, then (bf16) cuBLAS's batched GEMMs of the same shapes
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
    bench_designs<flash_design<floatX>()>(d_out, d_dqkv, d_qkv, d_lse, d_scratch, B, T, C, NH);
    if constexpr (flash_design<floatX>() != FLASH_TILES_IN_SHARED) {
        bench_designs<FLASH_TILES_IN_SHARED>(d_out, d_dqkv, d_qkv, d_lse, d_scratch, B, T, C, NH);
    }
    if (std::is_same<floatX, __nv_bfloat16>::value) { bench_cublas_pair(B * NH, T, C / NH); }
    for (void* p : {(void*)d_qkv, (void*)d_out, (void*)d_dqkv, (void*)d_lse, (void*)d_scratch}) { CUDA_CHECK(cudaFree(p)); }
}

// flash_check: each tensor the kernels read with cp.async or 16-byte loads (qkv, dout) or store in
// pairs (out, dqkv in bf16), one element off its alignment, stops the call before any launch, naming
// the tensor and the alignment it needs
static void test_alignment(void) {
    const int B = 1, T = 2, C = 32, NH = 2;
    size_t n = (size_t)B * T * 3 * C + 1;  // one element more: room for the shifted pointer
    __nv_bfloat16 *qkv = device_alloc<__nv_bfloat16>(n), *out = device_alloc<__nv_bfloat16>(n);
    __nv_bfloat16 *dout = device_alloc<__nv_bfloat16>(n), *dqkv = device_alloc<__nv_bfloat16>(n);
    float *lse = device_alloc<float>((size_t)B * NH * T), *scratch = device_alloc<float>(flash_attention_scratch_floats(B, T, NH));
    struct { const char* name; __nv_bfloat16** ptr; int align; bool backward; } cases[] = {
        {"qkv", &qkv, 16, false}, {"out", &out, 4, false}, {"qkv", &qkv, 16, true}, {"dout", &dout, 16, true}, {"dqkv", &dqkv, 4, true}};
    for (auto& c : cases) {
        __nv_bfloat16* aligned = *c.ptr;
        *c.ptr = aligned + 1;  // 2 bytes off
        FailTrap trap;
        g_fail_trap = &trap;
        bool stopped = setjmp(trap.jump) != 0;
        if (!stopped) {
            if (c.backward) {
                flash_attention_backward_cuda<__nv_bfloat16>(dqkv, dout, qkv, out, lse, B, T, C, NH, scratch, 0);
            } else {
                flash_attention_forward_cuda<__nv_bfloat16>(out, lse, qkv, B, T, C, NH, 0);
            }
        }
        g_fail_trap = NULL;
        *c.ptr = aligned;
        char name[128], tensor[32], want[64];
        snprintf(name, sizeof(name), "flash attention %s: %s 2 bytes off stops, naming it and the %d-byte alignment",
                 c.backward ? "backward" : "forward", c.name, c.align);
        snprintf(tensor, sizeof(tensor), ": %s (", c.name);  // "who: qkv (0x...) is not ..."
        snprintf(want, sizeof(want), "is not %d-byte aligned", c.align);
        check(stopped && strstr(trap.message, tensor) != NULL && strstr(trap.message, want) != NULL, name, "%s",
              stopped ? trap.message : "it ran");
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    for (void* p : {(void*)qkv, (void*)out, (void*)dout, (void*)dqkv, (void*)lse, (void*)scratch}) { CUDA_CHECK(cudaFree(p)); }
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
    test_alignment();
    for (const Shape& s : SHAPES) {
        test_shape<float>(s);
        test_shape<__nv_bfloat16>(s);
    }
    print_designs();
    bench_flash<float>();
    bench_flash<__nv_bfloat16>();
    return check_summary();
}
