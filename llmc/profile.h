/*
profile.h: --profile N, where the time of one training step goes. The backend marks ranges of
its work by kind (matmuls by shape, attention, LayerNorm, ...), each with the bytes it must move
and the FLOPs it must do; this file keeps the table, prints it and writes it as JSON.

    prof_begin(2, "the CPU backend", "wall clock");                  // the trainer, before step 2
    prof_mark(PROF_LAYERNORM, prof_layernorm_forward(N, C, 4), "layernorm forward");  // CPU backend
    ...                                                              // the range runs to the next mark
    prof_close();                                                    // or to here
    prof_end(step_seconds); prof_print(stdout); prof_write_json(f);  // the trainer, after the step

A range is the time from its mark to the next mark or prof_close on the same stream: the CPU
backend's marks read the wall clock (prof_mark); the CUDA backend's record CUDA events on the
stream the work runs on (cuda/profile.cuh) and adds their times with prof_add before prof_end.
The ranges of the compute stream (stream 0) are disjoint, so they and the "other" row (the
step's time outside every range: host work, synchronization, launch gaps) add up to the step;
ranges on the other streams (copies, NCCL) overlap the compute stream and are listed apart.
When no profile is being taken (g_prof.active == 0) a mark costs a branch.

A second clock may watch (g_prof_hooks, set by cuda/profile.cuh on the emulated device when its
timeline models a GPU, dev/cuda_emu/emu_timeline.cpp): it is told of every host range, profiled or not
(their bytes are the host's modelled work), gives the step its time, and adds its own lines to the
table and its own object to the JSON. Unset (the CPU trainer, a real GPU), nothing changes.

Bytes and FLOPs are what the operation must move and do at least (each tensor read or written
once; a causal attention's half of the T x T products), not what a kernel happens to do, so the
GB/s and TFLOP/s columns say how close each kind comes to the machine's limits.
*/
#ifndef LLMC_PROFILE_H
#define LLMC_PROFILE_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "utils.h"

typedef enum {
    PROF_MATMUL, PROF_ATTENTION_FORWARD, PROF_ATTENTION_BACKWARD, PROF_LAYERNORM, PROF_GELU, PROF_RESIDUAL,
    PROF_CLASSIFIER, PROF_ENCODER, PROF_ZEROING, PROF_GRAD_NORM, PROF_OPTIMIZER, PROF_COLLECTIVE,
    PROF_OFFLOAD_COPY, PROF_COPY_WAIT, NUM_PROF_KINDS
} ProfKind;
static const char* const PROF_KIND_NAMES[NUM_PROF_KINDS] = {
    "matmul", "attention forward", "attention backward", "layernorm", "gelu", "residual",
    "classifier", "encoder", "zeroing", "gradient norm", "optimizer", "collective (NCCL, MPI)",
    "offload copy", "copy wait"};

#define PROF_MAX_ENTRIES 128  // distinct (kind, name, stream) rows; more are added to the last
#define PROF_NAME_LEN 64
// the streams of the table: ranges on all but the compute stream overlap it. The CPU backend has the
// compute stream only; host: the host's own work while the GPU computes (the offloaded optimizer's update);
// pipeline: --pp's messages between stages (a GPU's stream of them: cuda/pipeline.cuh)
enum { PROF_STREAM_COMPUTE, PROF_STREAM_COPY, PROF_STREAM_GRADS, PROF_STREAM_NCCL, PROF_STREAM_HOST, PROF_STREAM_PIPELINE, PROF_MAX_STREAMS };
static const char* const PROF_STREAM_NAMES[PROF_MAX_STREAMS] = {"compute", "copy", "gradients", "nccl", "host", "pipeline"};

typedef struct { double bytes, flops; } ProfCost;

// a mark's name is a printf format and its arguments: the compiler checks them where it can
#if defined(__GNUC__)
#define PROF_PRINTF(fmt_at, args_at) __attribute__((format(printf, fmt_at, args_at)))
#else
#define PROF_PRINTF(fmt_at, args_at)
#endif

// the names of a matmul's rows, by shape: (BT, C) in, OC out (the arguments, in that order)
#define PROF_MATMUL_FORWARD "forward (%zu x %d) -> %d"
#define PROF_MATMUL_BACKWARD "backward (%zu x %d) -> %d"

typedef struct {
    char name[PROF_NAME_LEN];
    ProfKind kind;
    int stream;
    int calls;
    double seconds, bytes, flops;
} ProfEntry;

// the machine's two limits, as the backend measured them (the CPU's: cpu/roofline.h); 0: not known.
// A range's roofline share is the least time its bytes and FLOPs need at these limits, over its time:
// 100% is as fast as this machine goes, whichever limit binds
typedef struct {
    double gb_s;      // memory bandwidth (the STREAM triad's)
    double gflop_s;   // arithmetic (a large GEMM's)
    char how[160];
} ProfRoofline;

typedef struct {
    int active;                  // between prof_begin and prof_end: marks count
    double tokens;               // this rank's tokens in the step (prof_encoder_forward counts them)
    int step;                    // the profiled step (1-based)
    char backend[64], timing[128];
    int n;
    ProfEntry e[PROF_MAX_ENTRIES];
    int open;                    // the CPU clock's open range (an entry), -1: none
    double open_since;
    double step_seconds;
    ProfRoofline roof;           // prof_set_roofline, after the step
} Profile;

static Profile g_prof;

// the second clock (see the top); NULL members: none
typedef struct {
    void (*host_range)(ProfKind kind, ProfCost cost, const char* name);   // a CPU-clock range starts
    void (*host_close)(void);                                               // ... and ends
    void (*step_begin)(void);
    double (*step_end)(void);              // the step's seconds on this clock
    void (*print)(FILE* f, double tokens); // after the table
    void (*json)(FILE* f, double tokens);  // members of the JSON object, each followed by ", "
} ProfHooks;
static ProfHooks g_prof_hooks;

static double prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ----------------------------------------------------------------------------
// what each operation must move and do (elem: bytes of a stored activation or weight; gradients
// of weights are fp32 and +=: read and written)

// out (BT,OC) = inp (BT,C) @ w (OC,C)^T + b (OC)
static ProfCost prof_matmul_forward(size_t BT, int C, int OC, size_t elem) {
    ProfCost c = {((double)BT * C + (double)C * OC + OC + (double)BT * OC) * elem, 2.0 * BT * C * OC};
    return c;
}
// dinp (BT,C), dw (OC,C) +=, db (OC) += from dout (BT,OC), inp, w
static ProfCost prof_matmul_backward(size_t BT, int C, int OC, size_t elem) {
    ProfCost c = {((double)BT * OC + 2.0 * BT * C + (double)C * OC) * elem + 8.0 * ((double)C * OC + OC),
                  4.0 * BT * C * OC + (double)BT * OC};
    return c;
}
// causal attention of (B,T,3C) qkv into (B,T,C): 2 products (scores, values) over half of T x T;
// backward 5 (scores again, dvalues, dweights, dq, dk)
static ProfCost prof_attention_forward(int B, int T, int C, size_t elem) {
    ProfCost c = {4.0 * B * T * C * elem + 4.0 * B * T, 2.0 * B * (double)T * T * C};
    return c;
}
static ProfCost prof_attention_backward(int B, int T, int C, size_t elem) {
    ProfCost c = {9.0 * B * T * C * elem + 4.0 * B * T, 5.0 * B * (double)T * T * C};
    return c;
}
// the attention that keeps its (B,NH,T,T) weights for the backward (the CPU's matmul attention, not flash):
// the forward writes them and the backward reads them, on top of c
static ProfCost prof_attention_weights(ProfCost c, int B, int NH, int T, size_t elem) {
    c.bytes += (double)B * NH * T * T * elem;
    return c;
}
// out (N,C) from inp (N,C), w, b (C); mean, rstd (N) fp32
static ProfCost prof_layernorm_forward(size_t N, int C, size_t elem) {
    ProfCost c = {(2.0 * N * C + 2.0 * C) * elem + 8.0 * N, 7.0 * N * C};
    return c;
}
// residual (N,C) = a + b and its LayerNorm out (N,C) in one pass: a, b read, residual, out written
static ProfCost prof_residual_layernorm_forward(size_t N, int C, size_t elem) {
    ProfCost c = {(4.0 * N * C + 2.0 * C) * elem + 8.0 * N, 8.0 * N * C};
    return c;
}
// dinp (N,C) += from dout, inp (N,C), w (C), mean, rstd; dw, db (C) += fp32
static ProfCost prof_layernorm_backward(size_t N, int C, size_t elem) {
    ProfCost c = {(4.0 * N * C + C) * elem + 8.0 * N + 16.0 * C, 14.0 * N * C};
    return c;
}
// n elements in, n out (the tanh form: about 10 operations each)
static ProfCost prof_gelu_forward(size_t n, size_t elem) {
    ProfCost c = {2.0 * n * elem, 10.0 * n};
    return c;
}
static ProfCost prof_gelu_backward(size_t n, size_t elem) {
    ProfCost c = {3.0 * n * elem, 16.0 * n};
    return c;
}
static ProfCost prof_residual_forward(size_t n, size_t elem) {
    ProfCost c = {3.0 * n * elem, (double)n};
    return c;
}
// softmax and cross-entropy over (BT,V) logits (Vp stored), and their backward in place
static ProfCost prof_classifier(size_t BT, int V, int Vp, size_t elem) {
    ProfCost c = {2.0 * BT * Vp * elem + 8.0 * BT, 5.0 * BT * V};
    return c;
}
// (every forward pass starts here: while a profile is taken it counts the step's tokens)
static ProfCost prof_encoder_forward(size_t BT, int C, size_t elem) {
    ProfCost c = {3.0 * BT * C * elem + 4.0 * BT, (double)BT * C};
    if (g_prof.active) { g_prof.tokens += (double)BT; }
    return c;
}
// dwte rows and dwpe (fp32 +=) from dout (BT,C)
static ProfCost prof_encoder_backward(size_t BT, int T, int C, size_t elem) {
    ProfCost c = {(double)BT * C * elem + 8.0 * BT * C + 8.0 * T * C + 4.0 * BT, 2.0 * BT * C};
    return c;
}
// a copy or a clear of n bytes (a clear writes only)
static ProfCost prof_bytes(double n) {
    ProfCost c = {n, 0.0};
    return c;
}
// the squares of n fp32 gradients, summed
static ProfCost prof_grad_norm(size_t n) {
    ProfCost c = {4.0 * n, 2.0 * n};
    return c;
}
// an update of n parameters: the fp32 master weight, its gradient and state_floats floats of
// optimizer state read, weight and state written (plus the working copy when it is narrower);
// about 12 operations a parameter (AdamW's count; Adafactor's and CAME's are close)
static ProfCost prof_optimizer(size_t n, size_t state_floats, size_t elem) {
    ProfCost c = {12.0 * n + 8.0 * state_floats + (elem < 4 ? (double)elem * n : 0.0), 12.0 * n};
    return c;
}

// ----------------------------------------------------------------------------
// the table

// the entry of (kind, name, stream), added if new (the last entry takes the overflow)
static int prof_entry(ProfKind kind, const char* name, int stream) {
    for (int i = 0; i < g_prof.n; i++) {
        ProfEntry* e = &g_prof.e[i];
        if (e->kind == kind && e->stream == stream && strcmp(e->name, name) == 0) { return i; }
    }
    if (g_prof.n == PROF_MAX_ENTRIES) { return PROF_MAX_ENTRIES - 1; }
    ProfEntry* e = &g_prof.e[g_prof.n];
    memset(e, 0, sizeof(*e));
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->kind = kind;
    e->stream = stream;
    return g_prof.n++;
}

// what the marks until prof_context(NULL) are part of, added to their names: a technique that runs
// the model's own layers again says so once (--recompute: "recompute") and the layers mark as always
static const char* g_prof_context = NULL;
static void prof_context(const char* why) { g_prof_context = why; }

// one call of (kind, name) on a stream with its cost; returns its entry, whose seconds the
// caller adds (prof_add) when the range's time is known
static int prof_count_v(ProfKind kind, int stream, ProfCost cost, const char* fmt, va_list ap) {
    char name[PROF_NAME_LEN];
    int n = vsnprintf(name, sizeof(name), fmt, ap);
    if (g_prof_context != NULL && n >= 0 && (size_t)n < sizeof(name)) {
        snprintf(name + n, sizeof(name) - (size_t)n, " (%s)", g_prof_context);
    }
    int i = prof_entry(kind, name, stream);
    g_prof.e[i].calls++;
    g_prof.e[i].bytes += cost.bytes;
    g_prof.e[i].flops += cost.flops;
    return i;
}

static void prof_add(int entry, double seconds) { g_prof.e[entry].seconds += seconds; }

// the CPU clock: ends the open range (if any)
static void prof_close(void) {
    if (g_prof_hooks.host_close) { g_prof_hooks.host_close(); }
    if (!g_prof.active || g_prof.open < 0) { return; }
    prof_add(g_prof.open, prof_now() - g_prof.open_since);
    g_prof.open = -1;
}

// the CPU clock: a range of `kind` named by fmt starts here on the table's `stream` and runs to the next
// mark or prof_close
static void prof_mark_v(int stream, ProfKind kind, ProfCost cost, const char* fmt, va_list ap) {
    if (!g_prof.active && !g_prof_hooks.host_range) { return; }
    prof_close();   // the open range ends here, on both clocks
    if (g_prof_hooks.host_range) {
        char name[PROF_NAME_LEN];
        va_list again;
        va_copy(again, ap);
        vsnprintf(name, sizeof(name), fmt, again);
        va_end(again);
        g_prof_hooks.host_range(kind, cost, name);
    }
    if (g_prof.active) {
        g_prof.open = prof_count_v(kind, stream, cost, fmt, ap);
        g_prof.open_since = prof_now();
    }
}

// a range of the host's work, as the compute stream's share of the step
PROF_PRINTF(3, 4) static void prof_mark(ProfKind kind, ProfCost cost, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    prof_mark_v(PROF_STREAM_COMPUTE, kind, cost, fmt, ap);
    va_end(ap);
}

// a range of the host's work while the GPU computes (on the host stream: it overlaps the compute
// stream's ranges, which would count the same time twice)
PROF_PRINTF(3, 4) static void prof_mark_beside(ProfKind kind, ProfCost cost, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    prof_mark_v(PROF_STREAM_HOST, kind, cost, fmt, ap);
    va_end(ap);
}

// starts the profile of `step` (1-based); timing says how the backend times its ranges
static void prof_begin(int step, const char* backend, const char* timing) {
    memset(&g_prof, 0, sizeof(g_prof));
    g_prof.step = step;
    snprintf(g_prof.backend, sizeof(g_prof.backend), "%s", backend);
    snprintf(g_prof.timing, sizeof(g_prof.timing), "%s", timing);
    g_prof.open = -1;
    g_prof.active = 1;
    if (g_prof_hooks.step_begin) { g_prof_hooks.step_begin(); }
}

// the step took step_seconds (its ranges' times all added): marks stop counting
static void prof_end(double step_seconds) {
    prof_close();
    if (g_prof_hooks.step_end) { step_seconds = g_prof_hooks.step_end(); }
    g_prof.active = 0;
    g_prof.step_seconds = step_seconds;
}

// the compute stream's ranges added up; the step's time outside them (never below 0)
static double prof_compute_seconds(void) {
    double s = 0.0;
    for (int i = 0; i < g_prof.n; i++) {
        if (g_prof.e[i].stream == 0) { s += g_prof.e[i].seconds; }
    }
    return s;
}
static double prof_other_seconds(void) {
    double other = g_prof.step_seconds - prof_compute_seconds();
    return other > 0.0 ? other : 0.0;
}
// the whole the shares are of: the step, or the compute ranges where clocks differ and they exceed it
static double prof_whole_seconds(void) {
    double c = prof_compute_seconds();
    return g_prof.step_seconds > c ? g_prof.step_seconds : c;
}

// entries in the table's order: compute stream first, by kind, then by time (largest first)
static int prof_order_cmp(const ProfEntry* a, const ProfEntry* b) {
    if ((a->stream != 0) != (b->stream != 0)) { return a->stream != 0 ? 1 : -1; }
    if (a->kind != b->kind) { return a->kind < b->kind ? -1 : 1; }
    if (a->seconds != b->seconds) { return a->seconds > b->seconds ? -1 : 1; }
    return strcmp(a->name, b->name);
}
static void prof_sorted(int order[PROF_MAX_ENTRIES]) {
    for (int i = 0; i < g_prof.n; i++) { order[i] = i; }
    for (int i = 1; i < g_prof.n; i++) {  // insertion sort: a hundred rows
        int k = order[i], j = i;
        while (j > 0 && prof_order_cmp(&g_prof.e[order[j - 1]], &g_prof.e[k]) > 0) { order[j] = order[j - 1]; j--; }
        order[j] = k;
    }
}

static void prof_set_roofline(ProfRoofline r) { g_prof.roof = r; }

// the share of the roofline a range of bytes and flops reached in `seconds`, or -1 when the limits are not known
static double prof_roofline_share(double bytes, double flops, double seconds) {
    if (g_prof.roof.gb_s <= 0.0 || g_prof.roof.gflop_s <= 0.0 || seconds <= 0.0 || (bytes <= 0.0 && flops <= 0.0)) { return -1.0; }
    double need_memory = bytes / (g_prof.roof.gb_s * 1e9), need_arithmetic = flops / (g_prof.roof.gflop_s * 1e9);
    return (need_memory > need_arithmetic ? need_memory : need_arithmetic) / seconds;
}

// the rate of x per second in units of `unit` (0 when nothing was timed)
static double prof_rate(double x, double seconds, double unit) { return seconds > 0.0 ? x / seconds / unit : 0.0; }

static void prof_print_row(FILE* f, const char* kind, const char* name, const char* stream, int calls, double s,
                           double bytes, double flops, const char* share) {
    double roof = prof_roofline_share(bytes, flops, s);
    char roof_text[16] = "-";
    if (roof >= 0.0) {   // which limit binds: m(emory) or f(lops)
        int memory_bound = bytes / g_prof.roof.gb_s >= flops / g_prof.roof.gflop_s;
        snprintf(roof_text, sizeof(roof_text), "%.0f%% %c", 100.0 * roof, memory_bound ? 'm' : 'f');
    }
    fprintf(f, "| %-22s | %-48s | %-9s | %5d | %9.3f | %6s | %10.2f | %9.3f | %8.1f | %7.3f | %7s |\n", kind, name, stream,
            calls, s * 1e3, share, bytes / 1e6, flops / 1e9, prof_rate(bytes, s, 1e9), prof_rate(flops, s, 1e12), roof_text);
}

// the table: every range, the time outside them, then the same by kind
static void prof_print(FILE* f) {
    double whole = prof_whole_seconds();
    int order[PROF_MAX_ENTRIES];
    prof_sorted(order);
    fprintf(f, "profile of step %d, %s: %.3f ms; %s\n", g_prof.step, g_prof.backend, g_prof.step_seconds * 1e3, g_prof.timing);
    fprintf(f, "| %-22s | %-48s | %-9s | %5s | %9s | %6s | %10s | %9s | %8s | %7s | %7s |\n", "kind", "what", "stream", "calls",
            "ms", "share", "MB", "GFLOP", "GB/s", "TFLOP/s", "roof");
    char share[16];
    for (int k = 0; k < g_prof.n; k++) {
        const ProfEntry* e = &g_prof.e[order[k]];
        if (e->stream == 0) { snprintf(share, sizeof(share), "%5.1f%%", 100.0 * e->seconds / whole); }
        else { snprintf(share, sizeof(share), "(%.0f%%)", 100.0 * e->seconds / whole); }
        prof_print_row(f, PROF_KIND_NAMES[e->kind], e->name, PROF_STREAM_NAMES[e->stream], e->calls, e->seconds, e->bytes,
                       e->flops, share);
    }
    snprintf(share, sizeof(share), "%5.1f%%", 100.0 * prof_other_seconds() / whole);
    prof_print_row(f, "other", "outside every range", "", 0, prof_other_seconds(), 0.0, 0.0, share);
    fprintf(f, "by kind (compute stream; the other streams' ranges overlap it, their share in parentheses):\n");
    for (int kind = 0; kind < NUM_PROF_KINDS; kind++) {
        for (int side = 0; side < 2; side++) {
            double s = 0.0, bytes = 0.0, flops = 0.0;
            int calls = 0;
            for (int i = 0; i < g_prof.n; i++) {
                const ProfEntry* e = &g_prof.e[i];
                if ((int)e->kind != kind || (e->stream != 0) != side) { continue; }
                s += e->seconds; bytes += e->bytes; flops += e->flops; calls += e->calls;
            }
            if (calls == 0) { continue; }
            snprintf(share, sizeof(share), side ? "(%.0f%%)" : "%5.1f%%", 100.0 * s / whole);
            prof_print_row(f, PROF_KIND_NAMES[kind], side ? "(other streams)" : "", side ? "other" : "compute", calls, s,
                           bytes, flops, share);
        }
    }
    if (g_prof.roof.gb_s > 0.0) {
        fprintf(f, "roof: the least time a range's bytes (at %.1f GB/s) and FLOPs (at %.1f GFLOP/s) need, over its time; m: its bytes "
                "bind, f: its FLOPs\n  (above 100%%: it moves memory better than the triad, or the machine was busier while the "
                "limits were measured)\n  the limits: %s\n", g_prof.roof.gb_s, g_prof.roof.gflop_s, g_prof.roof.how);
    }
    if (g_prof_hooks.print) { g_prof_hooks.print(f, g_prof.tokens); }
}

// the same as one JSON object: {"step", "backend", "timing", "step_ms", "other_ms", "roofline": {"gb_s", "gflop_s"}
// (where measured), "timeline": {...} (the second clock's, where one watches), "entries": [{"kind", "name", "stream", "calls", "ms", "share", "bytes", "flops", "gb_s", "tflop_s",
// "roofline_share" (where measured)}]}
// ("share" of the step; entries of streams other than "compute" overlap it)
static void prof_write_json(FILE* f) {
    double whole = prof_whole_seconds();
    int order[PROF_MAX_ENTRIES];
    prof_sorted(order);
    fprintf(f, "{\"step\": %d, \"backend\": \"%s\", \"timing\": \"%s\", \"step_ms\": %.6f, \"other_ms\": %.6f, "
               "\"other_share\": %.6f, ", g_prof.step, g_prof.backend, g_prof.timing,
            g_prof.step_seconds * 1e3, prof_other_seconds() * 1e3, prof_other_seconds() / whole);
    if (g_prof.roof.gb_s > 0.0) {
        fprintf(f, "\"roofline\": {\"gb_s\": %.3f, \"gflop_s\": %.3f, \"how\": \"%s\"}, ", g_prof.roof.gb_s, g_prof.roof.gflop_s, g_prof.roof.how);
    }
    if (g_prof_hooks.json) { g_prof_hooks.json(f, g_prof.tokens); }
    fprintf(f, "\"entries\": [");
    for (int k = 0; k < g_prof.n; k++) {
        const ProfEntry* e = &g_prof.e[order[k]];
        fprintf(f, "%s\n  {\"kind\": \"%s\", \"name\": \"%s\", \"stream\": \"%s\", \"calls\": %d, \"ms\": %.6f, "
                   "\"share\": %.6f, \"bytes\": %.0f, \"flops\": %.0f, \"gb_s\": %.3f, \"tflop_s\": %.6f",
                k ? "," : "", PROF_KIND_NAMES[e->kind], e->name, PROF_STREAM_NAMES[e->stream], e->calls,
                e->seconds * 1e3, e->seconds / whole, e->bytes, e->flops, prof_rate(e->bytes, e->seconds, 1e9),
                prof_rate(e->flops, e->seconds, 1e12));
        double roof = prof_roofline_share(e->bytes, e->flops, e->seconds);
        if (roof >= 0.0) { fprintf(f, ", \"roofline_share\": %.6f", roof); }
        fprintf(f, "}");
    }
    fprintf(f, "\n]}\n");
}

#endif // LLMC_PROFILE_H
