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
the table's times say nothing of a GPU's (prof_gpu_timing says so).
*/
#ifndef CUDA_PROFILE_CUH
#define CUDA_PROFILE_CUH

#include "common.cuh"
#include "../llmc/profile.h"

// the streams of the table (PROF_STREAM_NAMES): ranges on all but the compute stream overlap it
enum { PROF_STREAM_COMPUTE = 0, PROF_STREAM_COPY = 1, PROF_STREAM_GRADS = 2, PROF_STREAM_NCCL = 3 };

typedef struct { int entry; cudaEvent_t start, stop; } ProfGpuRange;

typedef struct {
    ProfGpuRange* ranges;
    int n, cap;
    cudaEvent_t* events;         // every event recorded (each ends one range and may start the next)
    int n_events, cap_events;
    int open[PROF_MAX_STREAMS];  // each stream's open range, -1: none
} ProfGpu;

static ProfGpu g_prof_gpu = {NULL, 0, 0, NULL, 0, 0, {-1, -1, -1, -1}};

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

// ends the open range of stream id (on s) here, if there is one
static void prof_gpu_close(cudaStream_t s, int id) {
    if (!g_prof.active || g_prof_gpu.open[id] < 0) { return; }
    g_prof_gpu.ranges[g_prof_gpu.open[id]].stop = prof_gpu_record(s);
    g_prof_gpu.open[id] = -1;
}

// a range of `kind` named by fmt starts here on stream id (s) and runs to its next mark or close
PROF_PRINTF(5, 6) static void prof_gpu_mark(cudaStream_t s, int id, ProfKind kind, ProfCost cost, const char* fmt, ...) {
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
    ProfGpu empty = {NULL, 0, 0, NULL, 0, 0, {-1, -1, -1, -1}};
    *p = empty;
}

// a layer's launcher (cuda/*.cuh) marks its own range, as its first line: the layers run on the
// compute stream (the side streams' copies and collectives are marked where they are issued)
#define prof_kernel(stream, kind, cost, ...) prof_gpu_mark(stream, PROF_STREAM_COMPUTE, kind, cost, __VA_ARGS__)

#endif // CUDA_PROFILE_CUH
