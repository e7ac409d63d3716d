/*
bench_quant_state.c: one AdamW step on d6's parameter count with the moments in fp32, bf16 and
8 bits (cpu/optimizers.h, cpu/optimizers_lowp.h), and the 8-bit step as it was before
cpu/quant_state_fast.h: every code by llmc/quant_state.h's binary search (qstate_quantize_block),
written out here as the reference. The table's step is first checked byte for byte against it
(weights, codes, absmax), then each step is timed: best of BENCH_REPEATS calls (a busy moment of a
shared machine counts less), its GB/s by the bytes --profile counts for "optimizer adamw", and its
share of the STREAM triad measured in the same run (the profile's roof column).

    make build/bench_quant_state && ./build/bench_quant_state

Exits non-zero if the two 8-bit steps differ in a byte.
*/
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../cpu/optimizers_lowp.h"
#include "../cpu/roofline.h"

#define BENCH_N 30000000   // about d6's parameters (its --profile counts 16 bytes each for the 8-bit step: 488 MB)
#define BENCH_REPEATS 5
#define BENCH_T 10         // the step number (bias corrections)
static const float LR = 1e-3f, BETA1 = 0.9f, BETA2 = 0.95f, EPS = 1e-8f, WD = 0.1f;

// bytes a step moves, as --profile counts them (llmc/profile.h): read and write the weights, read the
// gradients, read and write each moment
static double step_bytes(QStateFormat f, size_t n) {
    double moment = f == QSTATE_FP32 ? 4.0 * n : f == QSTATE_BF16 ? 2.0 * n : n + 4.0 * qstate_blocks(n);
    return 12.0 * n + 4.0 * moment;
}

// the reference: the 8-bit step with every code found by qstate_nearest's binary search, as
// cpu/optimizers_lowp.h's adamw_update_8bit did before the table
static size_t adamw_8bit_search(float* params, const float* grads, QBlocks m, QBlocks v, size_t n, int t) {
    const QStateMaps* maps = qstate_maps();
    const QStateMap* ms = &maps->map[QMAP_SIGNED];
    const QStateMap* vs = &maps->map[QMAP_UNSIGNED];
    AdamWCoeffs s = adamw_coeffs(LR, BETA1, BETA2, EPS, WD, t);
    size_t bad = 0;
    #pragma omp parallel for reduction(+ : bad)
    for (long long b = 0; b < (long long)qstate_blocks(n); b++) {
        int len;
        size_t begin = lowp_block_range(n, b, &len);
        float mb[QSTATE_BLOCK], vb[QSTATE_BLOCK];
        for (int k = 0; k < len; k++) {
            size_t i = begin + (size_t)k;
            mb[k] = qstate_dequantize_one(ms->code, m.codes[i], m.absmax[b]);
            vb[k] = qstate_dequantize_one(vs->code, v.codes[i], v.absmax[b]);
            params[i] = adamw_element(params[i], grads[i], &mb[k], &vb[k], &s);
        }
        bad += qstate_quantize_block(ms, mb, len, m.codes + begin, m.absmax + b);
        bad += qstate_quantize_block(vs, vb, len, v.codes + begin, v.absmax + b);
    }
    return bad;
}

typedef struct {
    float *p, *g, *m32, *v32;
    uint16_t *m16, *v16;
    QBlocks m8, v8;
} BenchState;

static BenchState bench_alloc(size_t n, uint64_t seed) {
    BenchState b;
    size_t nb = qstate_blocks(n);
    b.p = (float*)malloc_check(n * sizeof(float));
    b.g = (float*)malloc_check(n * sizeof(float));
    b.m32 = (float*)calloc(n, sizeof(float));
    b.v32 = (float*)calloc(n, sizeof(float));
    b.m16 = (uint16_t*)calloc(n, sizeof(uint16_t));
    b.v16 = (uint16_t*)calloc(n, sizeof(uint16_t));
    b.m8 = (QBlocks){(uint8_t*)calloc(n, 1), (float*)calloc(nb, sizeof(float))};
    b.v8 = (QBlocks){(uint8_t*)calloc(n, 1), (float*)calloc(nb, sizeof(float))};
    if (!b.m32 || !b.v32 || !b.m16 || !b.v16 || !b.m8.codes || !b.m8.absmax || !b.v8.codes || !b.v8.absmax) {
        fprintf(stderr, "%s:%d: out of memory for %zu parameters\n  hint: lower BENCH_N\n", __FILE__, __LINE__, n);
        exit(EXIT_FAILURE);
    }
    // weights about 0.02, gradients spread over 6 decades, as a layer's are (xorshift, fixed seed)
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
        float u = (float)((seed >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
        b.p[i] = 0.02f * u;
        b.g[i] = u * powf(10.0f, -6.0f * (float)((seed >> 8) & 0xffff) / 65536.0f);
    }
    return b;
}

typedef enum { RUN_FP32, RUN_BF16, RUN_8BIT_TABLE, RUN_8BIT_SEARCH } BenchRun;

static size_t bench_step(BenchRun r, BenchState* b, size_t n, int t) {
    switch (r) {
        case RUN_FP32: adamw_update(b->p, b->g, b->m32, b->v32, n, LR, BETA1, BETA2, EPS, WD, t); return 0;
        case RUN_BF16: return adamw_update_bf16(b->p, b->g, b->m16, b->v16, n, LR, BETA1, BETA2, EPS, WD, t, (QStateStream){1, 0});
        case RUN_8BIT_TABLE: return adamw_update_8bit(b->p, b->g, b->m8, b->v8, n, LR, BETA1, BETA2, EPS, WD, t);
        default: return adamw_8bit_search(b->p, b->g, b->m8, b->v8, n, t);
    }
}

int main(void) {
    size_t n = BENCH_N, nb = qstate_blocks(n);
    qstate_maps();
    qfast_maps();
    ProfRoofline roof = cpu_roofline_measure();
    BenchState a = bench_alloc(n, 88172645463325252ULL), s = bench_alloc(n, 88172645463325252ULL);
    // two steps each from the same start (the second from non-zero moments): the same bytes
    size_t bad = 0;
    for (int t = 1; t <= 2; t++) { bad += bench_step(RUN_8BIT_TABLE, &a, n, t) + bench_step(RUN_8BIT_SEARCH, &s, n, t); }
    int same = memcmp(a.p, s.p, n * sizeof(float)) == 0 && memcmp(a.m8.codes, s.m8.codes, n) == 0 &&
               memcmp(a.v8.codes, s.v8.codes, n) == 0 && memcmp(a.m8.absmax, s.m8.absmax, nb * sizeof(float)) == 0 &&
               memcmp(a.v8.absmax, s.v8.absmax, nb * sizeof(float)) == 0;
    printf("%d thread(s); triad %.1f GB/s (cpu/roofline.h); %zu parameters, best of %d steps\n", omp_get_max_threads(),
           roof.gb_s, n, BENCH_REPEATS);
    printf("8-bit step, table (cpu/quant_state_fast.h) vs binary search: weights, codes and absmax %s (%zu refused)\n\n",
           same ? "bitwise equal" : "DIFFER", bad);
    static const char* NAMES[] = {"fp32", "bf16", "8bit, table (cpu/quant_state_fast.h)", "8bit, binary search (before)"};
    static const QStateFormat FORMATS[] = {QSTATE_FP32, QSTATE_BF16, QSTATE_8BIT, QSTATE_8BIT};
    printf("| moments | ms | GB/s | roof |\n|---|---|---|---|\n");
    for (int r = RUN_FP32; r <= RUN_8BIT_SEARCH; r++) {
        double best = 1e30;
        for (int k = 0; k < BENCH_REPEATS; k++) {
            double t0 = omp_get_wtime();
            bench_step((BenchRun)r, &a, n, BENCH_T + k);
            double dt = omp_get_wtime() - t0;
            best = dt < best ? dt : best;
        }
        double gb_s = step_bytes(FORMATS[r], n) / best / 1e9;
        printf("| %s | %.1f | %.2f | %.0f%% |\n", NAMES[r], best * 1e3, gb_s, 100.0 * gb_s / roof.gb_s);
    }
    return same ? EXIT_SUCCESS : EXIT_FAILURE;
}
