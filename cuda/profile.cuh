/*
profile.cuh: the CUDA backend's clock for --profile (llmc/profile.h keeps the table): a range is
timed by CUDA events recorded on the stream its work runs on, so it measures the GPU's time, not
the host's. A mark records one event, which ends the stream's open range and starts the next.

    prof_gpu_mark(stream, PROF_STREAM_COMPUTE, PROF_GELU, prof_gelu_forward(n, X), "gelu forward");
    gelu_forward_cuda(...);                       // the range runs to the next mark on the stream
    prof_gpu_close(stream, PROF_STREAM_COMPUTE);  // or to here
    prof_gpu_collect();                           // after the step: waits for the events, adds the times

Only while a profile is taken (g_prof.active) is anything recorded; otherwise a mark is a branch.
On the emulated device (dev/cuda_emu) an event's time is the host's clock while it emulates, so
the table's times say nothing of a GPU's (prof_gpu_timing says so) unless the emulator's timeline
models one (CUDA_EMU_TIMELINE=h100, dev/cuda_emu/emu_timeline.cpp): then every mark, profiled step or
not, also tells the timeline what its range costs (its kernels share the FLOPs and bytes) and which
technique it serves, the events' times are the modelled GPU's, and the step's predicted time, busy
streams and exposed copies follow the table (prof_timeline_hooks: the second clock of llmc/profile.h;
the Chrome trace, trace.json, beside profile.json).
*/
#ifndef CUDA_PROFILE_CUH
#define CUDA_PROFILE_CUH

#include "common.cuh"
#include "../llmc/profile.h"
#include <unistd.h>  // readlink: the trace beside profile.json (the timeline)

typedef struct { int entry; cudaEvent_t start, stop; } ProfGpuRange;

typedef struct {
    ProfGpuRange* ranges;
    int n, cap;
    cudaEvent_t* events;         // every event recorded (each ends one range and may start the next)
    int n_events, cap_events;
    int open[PROF_MAX_STREAMS];  // each stream's open range, -1: none
} ProfGpu;

// nothing recorded, no stream's range open
static ProfGpu prof_gpu_empty(void) {
    ProfGpu p = {NULL, 0, 0, NULL, 0, 0, {0}};
    for (int i = 0; i < PROF_MAX_STREAMS; i++) { p.open[i] = -1; }
    return p;
}
static ProfGpu g_prof_gpu = prof_gpu_empty();

// room for one more item in an array that doubles
static void* prof_grow(void* p, int n, int* cap, size_t size) {
    if (n < *cap) { return p; }
    *cap = *cap ? 2 * *cap : 1024;
    p = realloc(p, (size_t)*cap * size);
    if (p == NULL) { fail("--profile: out of host memory for %d ranges\n  hint: profile a step with fewer micro-steps (-d)", *cap); }
    return p;
}

// how the table's times were taken
static const char* prof_gpu_timing(void) {
#ifdef CUDA_EMU
    if (emu_timeline_on()) { return "CUDA events on the emulated device's TIMELINE: PREDICTED times of a modelled GPU (doc/timeline.md)"; }
    return "CUDA events on the EMULATED device: the times are the emulator's on the CPU and say nothing of a GPU's";
#else
    return "CUDA events on each range's stream";
#endif
}

static cudaEvent_t prof_gpu_record(cudaStream_t s) {
    ProfGpu* p = &g_prof_gpu;
    p->events = (cudaEvent_t*)prof_grow(p->events, p->n_events, &p->cap_events, sizeof(cudaEvent_t));
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaEventRecord(e, s));
    p->events[p->n_events++] = e;
    return e;
}

#ifdef CUDA_EMU
// the technique a range serves, as the timeline sums its exposed time
static int prof_technique(ProfKind kind, int on_host) {
    if (kind == PROF_OFFLOAD_COPY) { return EMU_TECHNIQUE_OFFLOAD; }
    if (kind == PROF_COLLECTIVE) { return EMU_TECHNIQUE_EXCHANGE; }
    if (kind == PROF_OPTIMIZER && on_host) { return EMU_TECHNIQUE_OPTIMIZER_HOST; }
    return EMU_TECHNIQUE_NONE;
}

// the timeline's name of a range: kind and name ("layernorm: forward")
static void prof_timeline_name(char* out, size_t n, ProfKind kind, const char* fmt, va_list ap) {
    char name[PROF_NAME_LEN];
    vsnprintf(name, sizeof(name), fmt, ap);
    snprintf(out, n, "%s: %s", PROF_KIND_NAMES[kind], name);
}

static void prof_timeline_host_range(ProfKind kind, ProfCost cost, const char* name) {
    char full[PROF_NAME_LEN + 32];
    snprintf(full, sizeof(full), "%s: %s", PROF_KIND_NAMES[kind], name);
    emu_timeline_host_range(full, cost.bytes, prof_technique(kind, 1));
}

// trace.json beside the profile.json being written (f: its temporary file, in the same folder)
static void prof_timeline_json(FILE* f, double tokens) {
    emu_timeline_json(f, tokens);
    char link[64], path[4096];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fileno(f));
    ssize_t n = readlink(link, path, sizeof(path) - 32);
    if (n <= 0) { return; }
    path[n] = '\0';
    char* slash = strrchr(path, '/');
    if (slash == NULL) { return; }
    strcpy(slash + 1, "trace.json");
    emu_timeline_trace(path);
}

static void prof_timeline_print(FILE* f, double tokens) {
    emu_timeline_print(f, tokens);
    fprintf(f, "  (with -o, the step's Chrome trace, trace.json, is written beside profile.json: ui.perfetto.dev opens it)\n");
}

// llmc/profile.h's second clock, set before main when the timeline is on
static struct ProfTimelineHooks {
    ProfTimelineHooks() {
        if (!emu_timeline_on()) { return; }
        g_prof_hooks.host_range = prof_timeline_host_range;
        g_prof_hooks.host_close = emu_timeline_host_range_end;
        g_prof_hooks.step_begin = emu_timeline_step_begin;
        g_prof_hooks.step_end = emu_timeline_step_end;
        g_prof_hooks.print = prof_timeline_print;
        g_prof_hooks.json = prof_timeline_json;
    }
} prof_timeline_hooks;
#endif

// ends the open range of stream id (on s) here, if there is one
static void prof_gpu_close(cudaStream_t s, int id) {
#ifdef CUDA_EMU
    emu_timeline_range_end(s);
#endif
    if (!g_prof.active || g_prof_gpu.open[id] < 0) { return; }
    g_prof_gpu.ranges[g_prof_gpu.open[id]].stop = prof_gpu_record(s);
    g_prof_gpu.open[id] = -1;
}

// a range of `kind` named by fmt starts here on stream id (s) and runs to its next mark or close
PROF_PRINTF(5, 6) static void prof_gpu_mark(cudaStream_t s, int id, ProfKind kind, ProfCost cost, const char* fmt, ...) {
#ifdef CUDA_EMU
    if (emu_timeline_on()) {   // every step's ranges price their kernels
        char name[PROF_NAME_LEN + 32];
        va_list ap;
        va_start(ap, fmt);
        prof_timeline_name(name, sizeof(name), kind, fmt, ap);
        va_end(ap);
        int tensor = kind == PROF_ATTENTION_FORWARD || kind == PROF_ATTENTION_BACKWARD;
        emu_timeline_range(s, PROF_STREAM_NAMES[id], name, cost.flops, cost.bytes, prof_technique(kind, 0), tensor);
    }
#endif
    if (!g_prof.active) { return; }
    ProfGpu* p = &g_prof_gpu;
    p->ranges = (ProfGpuRange*)prof_grow(p->ranges, p->n, &p->cap, sizeof(ProfGpuRange));
    cudaEvent_t e = prof_gpu_record(s);
    if (p->open[id] >= 0) { p->ranges[p->open[id]].stop = e; }  // one event ends a range and starts the next
    va_list ap;
    va_start(ap, fmt);
    ProfGpuRange r = {prof_count_v(kind, id, cost, fmt, ap), e, NULL};
    va_end(ap);
    p->open[id] = p->n;
    p->ranges[p->n++] = r;
}

// after the step (every stream's ranges closed): each range's time into its entry; the events go
static void prof_gpu_collect(void) {
    ProfGpu* p = &g_prof_gpu;
    for (int i = 0; i < p->n; i++) {
        ProfGpuRange* r = &p->ranges[i];
        if (r->stop == NULL) { fail("--profile: a range of '%s' was never closed", g_prof.e[r->entry].name); }
        float ms = 0.0f;
        CUDA_CHECK(cudaEventSynchronize(r->stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms, r->start, r->stop));
        prof_add(r->entry, ms / 1e3);
    }
    for (int i = 0; i < p->n_events; i++) { CUDA_CHECK(cudaEventDestroy(p->events[i])); }
    free(p->ranges);
    free(p->events);
    *p = prof_gpu_empty();
}

// a layer's launcher (cuda/*.cuh) marks its own range, as its first line: the layers run on the
// compute stream (the side streams' copies and collectives are marked where they are issued)
#define prof_kernel(stream, kind, cost, ...) prof_gpu_mark(stream, PROF_STREAM_COMPUTE, kind, cost, __VA_ARGS__)

#endif // CUDA_PROFILE_CUH
