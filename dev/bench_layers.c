/*
bench_layers.c: the CPU's per-element layers (cpu/layers.h) one at a time on the shapes of the d12
step at B=4, T=64, against the STREAM triad measured in the same run: each kernel's time (best of
BENCH_REPEATS calls, so a busy moment of a shared machine counts less), its CPU time (the process's, best of the same calls: with one thread
the time the core was ours), its GB/s by the bytes --profile counts (llmc/profile.h) and its share of the triad, the `roof` column of --profile
without the rest of the step around it.

    make build/bench_layers && ./build/bench_layers     # the trainer's flags (-std=c11: no FMA contraction)
    OMP_NUM_THREADS=1 ./build/bench_layers             # one core: steadier on a shared machine
    BENCH_COLD=1 ./build/bench_layers                  # each call's inputs from memory, as in the step (below)

The GELU runs on the MLP's (B,T,4C), as the step does. A kernel's inputs here stay in the caches from one
call to the next (LayerNorm's 0.8 MB, the attention's 2.4 MB), where in the step they were written a layer
or a pass earlier; BENCH_COLD=1 writes BENCH_FLUSH_BYTES (more than the last-level cache) before every call,
outside its time.

To compare two versions of cpu/layers.h in one run, build this file in each tree and run the two
binaries one after the other (scripts/bench.sh does not: it times whole steps).
*/
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
#include <time.h>
#include "../cpu/layers.h"
#include "../cpu/roofline.h"

#define BENCH_B 4
#define BENCH_T 64
#define BENCH_C 768
#define BENCH_NH 12
#define BENCH_V 50257           // the vocabulary: the softmax's row
#define BENCH_VP 50304          // wte's rows: the encoder gathers from all of them; the logits' row
#define BENCH_REPEATS 50
#define BENCH_FLUSH_BYTES ((size_t)64 << 20)   // BENCH_COLD: written before each call, twice the 32 MiB L3 of the AMD EPYC

typedef struct {
    float *x, *y, *dy, *dx, *w, *b, *dw, *db, *mean, *rstd, *qkv, *dqkv, *att, *datt, *wte, *wpe, *dwte, *dwpe, *logits;
    float *fch, *fch_gelu, *dfch, *dfch_gelu;  // the MLP's (B,T,4C): the GELU's input, output and their gradients
    int* tok;
} BenchBufs;

static float* bench_floats(size_t n) {
    float* p = (float*)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f; }
    return p;
}

static BenchBufs bench_alloc(void) {
    size_t BT = (size_t)BENCH_B * BENCH_T, C = BENCH_C, att = (size_t)BENCH_B * BENCH_NH * BENCH_T * BENCH_T;
    BenchBufs u = {
        .x = bench_floats(BT * C), .y = bench_floats(BT * C), .dy = bench_floats(BT * C), .dx = bench_floats(BT * C),
        .w = bench_floats(C), .b = bench_floats(C), .dw = bench_floats(C), .db = bench_floats(C),
        .mean = bench_floats(BT), .rstd = bench_floats(BT), .qkv = bench_floats(3 * BT * C), .dqkv = bench_floats(3 * BT * C),
        .att = bench_floats(att), .datt = bench_floats(att), .wte = bench_floats(BENCH_VP * C), .wpe = bench_floats(BENCH_T * C),
        .dwte = bench_floats(BENCH_VP * C), .dwpe = bench_floats(BENCH_T * C), .tok = (int*)malloc_check(BT * sizeof(int)),
        .logits = bench_floats(BT * BENCH_VP), .fch = bench_floats(4 * BT * C), .fch_gelu = bench_floats(4 * BT * C),
        .dfch = bench_floats(4 * BT * C), .dfch_gelu = bench_floats(4 * BT * C),
    };
    for (size_t i = 0; i < BT; i++) { u.tok[i] = (int)((i * 7919u) % BENCH_VP); }
    return u;
}

typedef enum { K_LN_FWD, K_LN_BWD, K_ENC_FWD, K_ENC_BWD, K_ATT_FWD, K_ATT_BWD, K_GELU_FWD, K_GELU_BWD, K_SOFTMAX, K_COUNT } BenchKernel;
static const char* K_NAME[K_COUNT] = {
    "layernorm forward", "layernorm backward", "encoder forward", "encoder backward",
    "attention forward", "attention backward", "gelu forward", "gelu backward", "softmax (in place)",
};

// runs kernel k once; returns the bytes and FLOPs --profile counts for it
static ProfCost bench_run(BenchKernel k, BenchBufs* u) {
    int B = BENCH_B, T = BENCH_T, C = BENCH_C, NH = BENCH_NH;
    size_t BT = (size_t)B * T;
    switch (k) {
    case K_LN_FWD: layernorm_forward(u->y, u->mean, u->rstd, u->x, u->w, u->b, B, T, C); return prof_layernorm_forward(BT, C, sizeof(float));
    case K_LN_BWD: layernorm_backward(u->dx, u->dw, u->db, u->dy, u->x, u->w, u->mean, u->rstd, B, T, C); return prof_layernorm_backward(BT, C, sizeof(float));
    case K_ENC_FWD: encoder_forward(u->y, u->tok, u->wte, u->wpe, B, T, C); return prof_encoder_forward(BT, C, sizeof(float));
    case K_ENC_BWD: encoder_backward(u->dwte, u->dwpe, u->dy, u->tok, B, T, C); return prof_encoder_backward(BT, T, C, sizeof(float));
    case K_ATT_FWD: attention_forward(u->y, u->att, u->qkv, B, T, C, NH); return prof_attention_weights(prof_attention_forward(B, T, C, sizeof(float)), B, NH, T, sizeof(float));
    case K_ATT_BWD: attention_backward(u->dqkv, u->datt, u->dy, u->qkv, u->att, B, T, C, NH); return prof_attention_weights(prof_attention_backward(B, T, C, sizeof(float)), B, NH, T, sizeof(float));
    case K_GELU_FWD: gelu_forward(u->fch_gelu, u->fch, 4 * BT * C); return prof_gelu_forward(4 * BT * C, sizeof(float));
    case K_GELU_BWD: gelu_backward(u->dfch, u->fch, u->dfch_gelu, 4 * BT * C); return prof_gelu_backward(4 * BT * C, sizeof(float));
    case K_SOFTMAX: softmax_forward(u->logits, u->logits, B, T, BENCH_V, BENCH_VP); return prof_classifier(BT, BENCH_V, BENCH_VP, sizeof(float));
    default: return prof_bytes(0.0);
    }
}

// the process's CPU time: with one thread, a call's share of it leaves out the moments a shared machine
// gave the core to someone else (the wall clock counts them), so one-thread comparisons hold under load
static double bench_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// BENCH_COLD: every cache line of the last-level cache replaced, so the next call reads its inputs from memory
static void bench_flush(unsigned char* flush) {
    if (flush == NULL) { return; }
    #pragma omp parallel for
    for (size_t i = 0; i < BENCH_FLUSH_BYTES; i += 64) { flush[i] = (unsigned char)i; }
}

int main(void) {
    BenchBufs u = bench_alloc();
    const char* cold = getenv("BENCH_COLD");
    unsigned char* flush = cold != NULL && atoi(cold) != 0 ? (unsigned char*)malloc_check(BENCH_FLUSH_BYTES) : NULL;
    ProfRoofline roof = cpu_roofline_measure();
    printf("%d thread(s); triad %.1f GB/s, GEMM %.1f GFLOP/s (cpu/roofline.h); d12 B=%d T=%d, best of %d calls%s\n\n",
           omp_get_max_threads(), roof.gb_s, roof.gflop_s, BENCH_B, BENCH_T, BENCH_REPEATS,
           flush != NULL ? ", inputs from memory (BENCH_COLD)" : "");
    printf("| kernel | us | cpu us | MB | GB/s | GFLOP/s | roof |\n|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < K_COUNT; k++) {
        double best = 1e30, best_cpu = 1e30;
        ProfCost cost = bench_run((BenchKernel)k, &u);  // a warm-up call
        for (int rep = 0; rep < BENCH_REPEATS; rep++) {
            bench_flush(flush);
            double t0 = prof_now(), c0 = bench_cpu_seconds();
            bench_run((BenchKernel)k, &u);
            double t = prof_now() - t0, c = bench_cpu_seconds() - c0;
            if (t < best) { best = t; }
            if (c < best_cpu) { best_cpu = c; }
        }
        // the roof as --profile computes it: the least time at the two limits, over the time taken
        double t_mem = cost.bytes / (roof.gb_s * 1e9), t_flop = cost.flops / (roof.gflop_s * 1e9);
        printf("| %s | %.1f | %.1f | %.2f | %.1f | %.2f | %.0f%% %c |\n", K_NAME[k], best * 1e6, best_cpu * 1e6, cost.bytes / 1e6,
               cost.bytes / best / 1e9, cost.flops / best / 1e9, 100.0 * (t_mem > t_flop ? t_mem : t_flop) / best, t_mem > t_flop ? 'm' : 'f');
    }
    return 0;
}
