/*
emu_timeline.cpp: CUDA_EMU_TIMELINE, a model of the GPU's time beside the emulation. Every operation
the program queues (a kernel, a cuBLAS(Lt) GEMM, a copy, a memset, an event record or wait, an NCCL
collective) is also an operation of a discrete-event simulation of one GPU of the chosen kind (h100,
a100, h200 or a file of constants), with the dependencies the program gave it:

  - the operation before it on its stream;
  - the event record a cudaStreamWaitEvent names (as CUDA captures it: the latest record at the call);
  - the legacy default stream's implicit synchronization with blocking streams;
  - the host: an operation cannot start before the host's clock reached the call that queued it.

Engines run what is ready: one compute engine (kernels, GEMMs, memsets, device-to-device copies, one at
a time, in the order they became ready), a copy engine each way (host to device, device to host: pinned
copies share the PCIe link, each at pinned_gb_s alone and pinned_both_gb_s / 2 when both directions
run; pageable copies crawl at pageable_gb_s and the host waits for them), and the network (NCCL
collectives one after another, an alpha-beta ring model over NVLink within a node, InfiniBand beyond).
Event records and waits take no time.

The host's clock: each CUDA call that queues work costs host_call_us; a host wait (stream, event or
device synchronize, a synchronous copy, cudaFree) moves the clock to the end of what it waits for; work
the host does between calls is counted only where the program marks it (--profile's host ranges,
llmc/profile.h: the offloaded optimizer's update, MPI sums, a norm on the host): its bytes at host_gb_s.
The CUDA calls the host makes inside such a range are placed in proportion to the host's own wall time
(the emulator's time excluded) at which it made them, as measured the last time the range ran (the
first time, the range's cost is charged at its end). The rest of the host's work (data loading,
bookkeeping) is taken as free.

What an operation costs (the constants: TL_CONSTANTS below, one table, each with its source):
  GEMM      2 m n k per matrix at the peak of its types (bf16/fp16 tensor, TF32, fp32) times
            gemm_peak_fraction, times the share of the last wave of tiles that has work (tiles of
            gemm_tile x gemm_tile over `sms`), times k / (k + gemm_k_half); or its operands' bytes at
            HBM bandwidth when that takes longer; plus kernel_launch_us
  kernel    its share of the profile range open on its stream (cuda/profile.cuh tells the emulator
            each range's FLOPs and bytes, llmc/profile.h's formulas): the range's FLOPs and bytes less
            those of its operations priced by their own shapes (GEMMs, memsets, device copies), then
            max(FLOPs / rate, bytes / HBM bandwidth), rate the fp32 CUDA-core peak (attention: the
            bf16 tensor peak times attention_fraction), split evenly over its kernels as counted the
            last time the range ran (the first time, its first kernel takes it all); plus
            kernel_launch_us. A kernel outside
            every range: kernel_launch_us and 8 bytes a thread at HBM bandwidth (counted as unpriced)
  memset    bytes at HBM bandwidth (+ launch); device-to-device copy: read and write at HBM bandwidth
  copy      bytes at the copy engine's rate (above)
  NCCL      ring: all-reduce 2(n-1) alpha + 2 (n-1)/n S / busbw; reduce-scatter and all-gather
            (n-1) alpha + (n-1)/n S / busbw (S the whole buffer); broadcast and reduce
            (n-1) alpha + S / busbw; a group of ncclSend and ncclRecv (point to point) alpha + S / busbw,
            S its larger direction's bytes; busbw and alpha of NVLink when the n ranks fit in one node
            (gpus_per_node), of InfiniBand otherwise; one rank: the launch only

Each process models its own GPU: ranks of a data-parallel job run the same program, so a collective
is taken to start on every rank when it starts on this one (the other ranks' lateness is not modelled).

What it predicts is scheduling (what overlaps, what waits, what the host holds up), not kernel speed:
the absolute times are estimates until a GPU measures them (doc/timeline.md).

CUDA_EMU_EXECUTE=0 (emu_runtime.cpp, emu_blas.cpp, emu_nccl.cpp): kernels, GEMMs, memsets, device
copies and collectives are modelled, not run; what the host reads back from the device is zeros.

Invariant: everything here runs on the host thread that made the CUDA call (as the rest of the
emulator); the simulation never runs ahead of the host's clock except to finish what the host waits for.
*/
#include "emu_internal.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <algorithm>
#include <deque>
#include <map>
#include <queue>
#include <string>
#include <vector>

// ----------------------------------------------------------------------------
// the constants, one table: each row's value on the three GPUs and where it comes from

enum tl_key {
    TL_BF16_TFLOPS, TL_TF32_TFLOPS, TL_FP32_TFLOPS, TL_GEMM_PEAK_FRACTION, TL_GEMM_TILE, TL_GEMM_K_HALF, TL_SMS,
    TL_ATTENTION_FRACTION, TL_HBM_GB_S, TL_KERNEL_LAUNCH_US, TL_HOST_CALL_US, TL_PINNED_GB_S, TL_PINNED_BOTH_GB_S,
    TL_PAGEABLE_GB_S, TL_HOST_GB_S, TL_NVLINK_GB_S, TL_NVLINK_ALPHA_US, TL_IB_GB_S, TL_IB_ALPHA_US, TL_GPUS_PER_NODE,
    TL_MEMORY_MIB, TL_NUM_KEYS
};
enum tl_gpu { TL_H100, TL_A100, TL_H200, TL_NUM_GPUS };
static const char* const TL_GPU_NAMES[TL_NUM_GPUS] = {"h100", "a100", "h200"};
static const char* const TL_GPU_TITLES[TL_NUM_GPUS] = {"NVIDIA H100 SXM 80GB", "NVIDIA A100 SXM 80GB", "NVIDIA H200 SXM 141GB"};

struct tl_constant {
    tl_key key;
    const char* name;           // as a custom file names it
    double value[TL_NUM_GPUS];  // h100, a100, h200
    const char* source;
};
// measured: ../shared/GPU.md (an H100 SXM machine, 2026-11-22); data sheet: NVIDIA's published
// figures; estimate: a guess of this file's, to be corrected when a GPU measures it (doc/timeline.md)
static const tl_constant TL_CONSTANTS[TL_NUM_KEYS] = {
    {TL_BF16_TFLOPS, "bf16_tflops", {989, 312, 989}, "dense bf16/fp16 tensor peak, TFLOP/s: H100 SXM 989 (GPU.md), A100 312, H200 989 (data sheets)"},
    {TL_TF32_TFLOPS, "tf32_tflops", {494, 156, 494}, "dense TF32 tensor peak, TFLOP/s (data sheets)"},
    {TL_FP32_TFLOPS, "fp32_tflops", {67, 19.5, 67}, "fp32 CUDA-core peak, TFLOP/s (data sheets): kernels that are not GEMMs, fp32 GEMMs"},
    {TL_GEMM_PEAK_FRACTION, "gemm_peak_fraction", {0.81, 0.81, 0.81}, "a large bf16 GEMM's share of the peak: about 800 of 989 TFLOP/s measured on the H100 (GPU.md); the same assumed elsewhere"},
    {TL_GEMM_TILE, "gemm_tile", {128, 128, 128}, "estimate: rows and columns of D one SM computes at a time (wave quantization)"},
    {TL_GEMM_K_HALF, "gemm_k_half", {64, 64, 64}, "estimate: a GEMM of inner size k runs at k / (k + this) of the large GEMM's rate"},
    {TL_SMS, "sms", {132, 108, 132}, "streaming multiprocessors (data sheets)"},
    {TL_ATTENTION_FRACTION, "attention_fraction", {0.35, 0.35, 0.35}, "estimate: the share of the bf16 peak this project's attention kernels reach (FlashAttention-2 reaches 35-50% on an H100; unmeasured here)"},
    {TL_HBM_GB_S, "hbm_gb_s", {3000, 1800, 4300}, "estimate: 90% of the HBM spec, GB/s: H100 SXM 3350, A100 80GB 2039, H200 4800 (data sheets)"},
    {TL_KERNEL_LAUNCH_US, "kernel_launch_us", {2.5, 3.0, 2.5}, "estimate: what a kernel adds on its stream beyond its work (launch, ramp, tail), microseconds"},
    {TL_HOST_CALL_US, "host_call_us", {2.0, 2.0, 2.0}, "estimate: host time of a CUDA call that queues work (cudaLaunchKernel's), microseconds"},
    {TL_PINNED_GB_S, "pinned_gb_s", {55, 24, 55}, "pinned host memory copies, one direction at a time, GB/s: 55 measured on the H100 (GPU.md; H200 the same PCIe 5); A100 PCIe 4 estimate"},
    {TL_PINNED_BOTH_GB_S, "pinned_both_gb_s", {93, 40, 93}, "both directions at once, the two together, GB/s: 93 measured on the H100 (GPU.md); A100 estimate"},
    {TL_PAGEABLE_GB_S, "pageable_gb_s", {9.2, 6.0, 9.2}, "pageable host memory copies, GB/s: 9.2 measured on the H100 (GPU.md); A100 estimate"},
    {TL_HOST_GB_S, "host_gb_s", {87, 87, 87}, "host memory bandwidth, GB/s: the OpenMP triad on 16 threads of the H100 machine (GPU.md); the host's marked work runs at it"},
    {TL_NVLINK_GB_S, "nvlink_gb_s", {450, 230, 450}, "NCCL bus bandwidth within a node, GB/s: nccl-tests' busbw at large sizes, 8 x H100 SXM about 460-480 (NVLink 4: 450 a direction), 8 x A100 230-250 (published reference figures)"},
    {TL_NVLINK_ALPHA_US, "nvlink_alpha_us", {2.0, 3.0, 2.0}, "estimate: latency of one ring step within a node, microseconds"},
    {TL_IB_GB_S, "ib_gb_s", {45, 22, 45}, "estimate: NCCL bus bandwidth between nodes, GB/s: 400 Gb/s NDR (A100: 200 Gb/s HDR) per GPU, 90% reached"},
    {TL_IB_ALPHA_US, "ib_alpha_us", {6.0, 6.0, 6.0}, "estimate: latency of one ring step between nodes, microseconds"},
    {TL_GPUS_PER_NODE, "gpus_per_node", {8, 8, 8}, "GPUs a node's NVLink joins (HGX boards)"},
    {TL_MEMORY_MIB, "memory_mib", {81079, 81920, 142336}, "device memory, MiB: cudaMemGetInfo on the H100 (GPU.md); A100 80 GiB (data sheet); H200 about 139 GiB (what the H200 machines this project is sometimes lent report)"},
};

struct tl_model {
    std::string name, title;   // "h100", "NVIDIA H100 SXM 80GB" (or the file's)
    double c[TL_NUM_KEYS];
};

static void read_constants_file(const char* path, tl_model* m) {
    FILE* f = fopen(path, "r");
    if (f == nullptr) {
        emu_fail("CUDA_EMU_TIMELINE='%s': neither h100, a100, h200 nor a readable file of constants "
                 "(lines 'name value', the names of doc/timeline.md's table; unnamed ones are the H100's)", path);
    }
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f) != nullptr) {
        n++;
        char name[128];
        double v;
        char* hash = strchr(line, '#');
        if (hash != nullptr) { *hash = '\0'; }
        int got = sscanf(line, " %127s %lf", name, &v);
        if (got <= 0) { continue; }
        int k = 0;
        while (k < TL_NUM_KEYS && strcmp(TL_CONSTANTS[k].name, name) != 0) { k++; }
        if (got != 2 || k == TL_NUM_KEYS || !(v > 0.0)) {
            emu_fail("%s:%d: expected 'name value' with a positive value and one of the names of doc/timeline.md's "
                     "table (e.g. hbm_gb_s 3000), got '%s'", path, n, name);
        }
        m->c[k] = v;
    }
    fclose(f);
    m->name = path;
    m->title = std::string("constants of ") + path + " (the H100's where not named)";
}

static tl_model read_model(const char* setting) {
    tl_model m;
    int g = 0;
    while (g < TL_NUM_GPUS && strcmp(TL_GPU_NAMES[g], setting) != 0) { g++; }
    for (int k = 0; k < TL_NUM_KEYS; k++) { m.c[k] = TL_CONSTANTS[k].value[g < TL_NUM_GPUS ? g : TL_H100]; }
    if (g < TL_NUM_GPUS) {
        m.name = TL_GPU_NAMES[g];
        m.title = TL_GPU_TITLES[g];
    } else {
        read_constants_file(setting, &m);
    }
    return m;
}

static const tl_model* model() {
    static tl_model* m = emu_config().timeline ? new tl_model(read_model(emu_config().timeline)) : nullptr;
    return m;
}
static double K(tl_key k) { return model()->c[k]; }

bool emu_timeline_on() { return emu_config().timeline != nullptr; }

size_t emu_timeline_memory_bytes(const char* setting) { return (size_t)(read_model(setting).c[TL_MEMORY_MIB] * 1024 * 1024); }

// ----------------------------------------------------------------------------
// the operations and the simulation's state

enum tl_engine { TL_NONE, TL_COMPUTE, TL_H2D, TL_D2H, TL_NET, TL_NUM_ENGINES };
static const char* const TL_TECHNIQUE_NAMES[EMU_NUM_TECHNIQUES] = {"", "offload", "exchange", "optimizer_host"};

struct emu_tl_op {
    uint64_t seq;
    int track;                       // 0: the host; else a stream's
    std::string name;                // the range it belongs to, or what it is
    const char* what;                // the CUDA call or kernel
    const char* cat;                 // trace category
    tl_engine engine;
    double need;                     // seconds of the engine (copies: bytes)
    double flops, bytes;
    int technique;
    bool pageable;                   // a copy at pageable_gb_s
    double enqueued;                 // the host's clock at the call
    double start = -1.0, end = -1.0;
    int waiting = 0;                 // dependencies not yet done
    bool done = false;
    std::vector<emu_tl_op*> deps, dependents;
    // a running copy: bytes left at `since`, and the rate it runs at
    double left = 0.0, since = 0.0, rate = 0.0;
    uint32_t version = 0;            // bumps when its finish time changes (stale events are skipped)
};

struct tl_event {
    double t;
    uint64_t order;
    emu_tl_op* op;
    uint32_t version;
    bool operator>(const tl_event& o) const { return t != o.t ? t > o.t : order > o.order; }
};

struct tl_track { std::string name; bool named; };

// a profile range open on a stream (cuda/profile.cuh): what its kernels share
struct tl_range {
    std::string name;
    double flops, bytes;   // the range's (llmc/profile.h's formulas)
    double rate;           // FLOP/s of its kernels
    int technique;
    double self_flops, self_bytes;   // of the GEMMs, memsets and device copies in it so far, priced by their own shapes
    int kernels;           // kernels in it so far
};
struct tl_range_history { int kernels; double self_flops, self_bytes; };

// a host range (llmc/profile.h's CPU clock)
struct tl_host_range {
    bool open = false;
    std::string name;
    int technique = 0;
    double start = 0.0, cost = 0.0, charged = 0.0;
    double wall_start = 0.0, emulation_at_start = 0.0;
};
struct tl_host_interval { double start, end; int technique; std::string name; };

static struct {
    std::deque<emu_tl_op> ops;          // every operation, in enqueue order (stable addresses)
    std::priority_queue<tl_event, std::vector<tl_event>, std::greater<tl_event>> events;
    uint64_t event_order = 0;
    double now = 0.0;                   // the simulation's time: every event up to it is processed
    double host = 0.0;                  // the host's clock
    emu_tl_op* running[TL_NUM_ENGINES] = {};
    std::deque<emu_tl_op*> ready[TL_NUM_ENGINES];
    std::vector<tl_track> tracks{{"host", true}};
    std::map<const void*, int> track_of;
    std::map<const void*, tl_range> open_range;
    std::map<std::string, tl_range_history> range_history;
    tl_host_range host_range;
    std::map<std::string, double> host_range_wall;   // a host range's own wall time, last time
    std::vector<tl_host_interval> host_intervals;
    double emulation_wall = 0.0;        // seconds the emulator spent running queued work
    int nranks = 1, rank = 0;
    uint64_t unpriced = 0;              // kernels outside every range
    bool in_window = false;
    double window_start = -1.0, window_end = -1.0;
    uint64_t window_first_seq = 0, window_unpriced = 0;
} S;

static double wall_now() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ----------------------------------------------------------------------------
// the simulation

static void push_finish(emu_tl_op* op, double t) {
    S.events.push(tl_event{t, S.event_order++, op, op->version});
}

// the rates of the copies running now: pinned copies share the link when both directions run
static void rerate_copies(double t) {
    emu_tl_op* up = S.running[TL_H2D];
    emu_tl_op* down = S.running[TL_D2H];
    bool both = up != nullptr && down != nullptr && !up->pageable && !down->pageable;
    for (emu_tl_op* op : {up, down}) {
        if (op == nullptr) { continue; }
        double pinned = both ? std::min(K(TL_PINNED_GB_S), K(TL_PINNED_BOTH_GB_S) / 2.0) : K(TL_PINNED_GB_S);
        double rate = (op->pageable ? K(TL_PAGEABLE_GB_S) : pinned) * 1e9;
        op->left -= op->rate * (t - op->since);
        if (op->left < 0.0) { op->left = 0.0; }
        op->since = t;
        if (rate != op->rate) {
            op->rate = rate;
            op->version++;
            push_finish(op, t + op->left / rate);
        }
    }
}

static void start_on_engine(emu_tl_op* op, double t) {
    S.running[op->engine] = op;
    op->start = t;
    if (op->engine == TL_H2D || op->engine == TL_D2H) {
        op->left = op->need;
        op->since = t;
        op->rate = 0.0;     // rerate gives it its rate and its finish
        rerate_copies(t);
    } else {
        push_finish(op, t + op->need);
    }
}

static void make_ready(emu_tl_op* op, double t) {
    if (op->engine == TL_NONE) {
        op->start = t;
        push_finish(op, t);
        return;
    }
    if (S.running[op->engine] == nullptr) { start_on_engine(op, t); }
    else { S.ready[op->engine].push_back(op); }
}

static void finish(emu_tl_op* op, double t) {
    op->done = true;
    op->end = t;
    if (op->engine != TL_NONE) {
        S.running[op->engine] = nullptr;
        if (op->engine == TL_H2D || op->engine == TL_D2H) { rerate_copies(t); }
        std::deque<emu_tl_op*>& q = S.ready[op->engine];
        if (!q.empty()) {
            emu_tl_op* next = q.front();
            q.pop_front();
            start_on_engine(next, t);
        }
    }
    for (emu_tl_op* d : op->dependents) {
        if (--d->waiting == 0) { make_ready(d, std::max(t, d->enqueued)); }
    }
}

static void process_one() {
    tl_event e = S.events.top();
    S.events.pop();
    if (e.t > S.now) { S.now = e.t; }
    if (e.version != e.op->version || e.op->done) { return; }
    finish(e.op, e.t);
}

// process everything that happens up to time t
static void advance_to(double t) {
    while (!S.events.empty() && S.events.top().t <= t) { process_one(); }
    if (t > S.now) { S.now = t; }
}

// ----------------------------------------------------------------------------
// the host's clock

// inside a host range, the share of its cost the host's own wall time so far stands for
static void host_catch_up() {
    tl_host_range& r = S.host_range;
    if (!r.open) { return; }
    auto last = S.host_range_wall.find(r.name);
    if (last == S.host_range_wall.end() || last->second <= 0.0) { return; }
    double own = (wall_now() - r.wall_start) - (S.emulation_wall - r.emulation_at_start);
    double target = r.cost * std::min(1.0, std::max(0.0, own / last->second));
    if (target > r.charged) {
        S.host += target - r.charged;
        r.charged = target;
    }
}

void emu_tl_emulation_wall(double seconds) { S.emulation_wall += seconds; }

// ----------------------------------------------------------------------------
// pricing

static int track_for(const void* stream, bool legacy) {
    auto it = S.track_of.find(stream);
    if (it != S.track_of.end()) { return it->second; }
    int t = (int)S.tracks.size();
    S.tracks.push_back({legacy ? "default stream" : "stream " + std::to_string(t), false});
    S.track_of[stream] = t;
    return t;
}

static double gemm_peak(int peak) {
    switch (peak) {
        case EMU_PEAK_BF16: return K(TL_BF16_TFLOPS) * 1e12;
        case EMU_PEAK_TF32: return K(TL_TF32_TFLOPS) * 1e12;
        default: return K(TL_FP32_TFLOPS) * 1e12;
    }
}

static double gemm_seconds(const emu_work& w) {
    double tile = K(TL_GEMM_TILE), sms = K(TL_SMS);
    double tiles = ceil(w.m / tile) * ceil(w.n / tile) * std::max(1, w.batch);
    double waves = ceil(tiles / sms);
    double filled = tiles > 0.0 ? tiles / (waves * sms) : 1.0;
    double k_share = w.k / (w.k + K(TL_GEMM_K_HALF));
    double rate = gemm_peak(w.peak) * K(TL_GEMM_PEAK_FRACTION) * filled * k_share;
    double compute = rate > 0.0 ? w.flops / rate : 0.0;
    return std::max(compute, w.bytes / (K(TL_HBM_GB_S) * 1e9));
}

static double collective_seconds(const emu_work& w) {
    int n = std::max(1, w.nranks);
    if (n == 1) { return 0.0; }
    bool in_node = n <= (int)K(TL_GPUS_PER_NODE);
    double busbw = (in_node ? K(TL_NVLINK_GB_S) : K(TL_IB_GB_S)) * 1e9;
    double alpha = (in_node ? K(TL_NVLINK_ALPHA_US) : K(TL_IB_ALPHA_US)) * 1e-6;
    double share = (n - 1.0) / n;
    switch (w.collective) {
        case EMU_ALL_REDUCE: return 2.0 * (n - 1) * alpha + 2.0 * share * w.bytes / busbw;
        case EMU_REDUCE_SCATTER:
        case EMU_ALL_GATHER: return (n - 1) * alpha + share * w.bytes / busbw;
        case EMU_SEND_RECV: return alpha + w.bytes / busbw;   // one link, each direction at its rate
        default: return (n - 1) * alpha + w.bytes / busbw;   // broadcast, reduce: pipelined along the ring
    }
}

static double hbm_seconds(double bytes) { return bytes / (K(TL_HBM_GB_S) * 1e9); }

// a kernel's share of the range open on its stream (see the top of this file)
static double kernel_seconds(const void* stream, const emu_work& w) {
    double launch = K(TL_KERNEL_LAUNCH_US) * 1e-6;
    auto it = S.open_range.find(stream);
    if (it == S.open_range.end()) {
        S.unpriced++;
        return launch + hbm_seconds(8.0 * w.threads);
    }
    tl_range& r = it->second;
    r.kernels++;
    // what the range's own-priced operations do not account for, at the kernels' limits
    auto rest = [&](double self_flops, double self_bytes) {
        return std::max(std::max(0.0, r.flops - self_flops) / r.rate, hbm_seconds(std::max(0.0, r.bytes - self_bytes)));
    };
    auto h = S.range_history.find(r.name);
    double share;
    if (h != S.range_history.end()) {
        share = rest(h->second.self_flops, h->second.self_bytes) / std::max(1, h->second.kernels);
    } else {
        share = r.kernels == 1 ? rest(r.self_flops, r.self_bytes) : 0.0;
    }
    return launch + share;
}

// engine and need of an operation; self-priced work inside a range is remembered there
static void price(emu_tl_op* op, const void* stream, const emu_work& w) {
    auto in_range = S.open_range.find(stream);
    tl_range* r = in_range == S.open_range.end() ? nullptr : &in_range->second;
    double launch = K(TL_KERNEL_LAUNCH_US) * 1e-6;
    op->engine = TL_COMPUTE;
    op->flops = w.flops;
    op->bytes = w.bytes;
    switch (w.kind) {
        case EMU_WORK_MARKER:
            op->engine = TL_NONE;
            op->cat = "marker";
            op->need = 0.0;
            break;
        case EMU_WORK_KERNEL:
            op->cat = "kernel";
            op->need = kernel_seconds(stream, w);
            break;
        case EMU_WORK_GEMM:
            op->cat = "gemm";
            op->need = launch + gemm_seconds(w);
            break;
        case EMU_WORK_MEMSET:
            op->cat = "memset";
            op->need = launch + hbm_seconds(w.bytes);
            break;
        case EMU_WORK_COPY:
            op->pageable = w.pageable;
            if (w.dir == EMU_COPY_H2D || w.dir == EMU_COPY_D2H) {
                op->engine = w.dir == EMU_COPY_H2D ? TL_H2D : TL_D2H;
                op->cat = w.dir == EMU_COPY_H2D ? "memcpy HtoD" : "memcpy DtoH";
                op->need = w.bytes;
                if (r != nullptr && r->technique == EMU_TECHNIQUE_OFFLOAD) { op->technique = EMU_TECHNIQUE_OFFLOAD; }
            } else if (w.dir == EMU_COPY_D2D) {
                op->cat = "memcpy DtoD";
                op->need = launch + hbm_seconds(2.0 * w.bytes);
                op->bytes = 2.0 * w.bytes;
            } else {
                op->engine = TL_NONE;   // host to host: the host's own memcpy
                op->cat = "memcpy HtoH";
                op->need = 0.0;
            }
            break;
        case EMU_WORK_COLLECTIVE:
            op->engine = TL_NET;
            op->cat = "collective";
            op->need = launch + collective_seconds(w);
            op->technique = EMU_TECHNIQUE_EXCHANGE;
            S.nranks = std::max(S.nranks, w.nranks);
            break;
    }
    if (r != nullptr) {
        op->name = r->name;
        if (op->engine == TL_COMPUTE && w.kind != EMU_WORK_KERNEL) {   // its own shape priced it
            r->self_flops += op->flops;
            r->self_bytes += op->bytes;
        }
    }
}

static void trace_at_exit();

// ----------------------------------------------------------------------------
// what the rest of the emulator tells the timeline

emu_tl_op* emu_tl_enqueue(const void* stream, bool legacy, const char* what, const emu_work& w,
                          const std::vector<emu_tl_op*>& deps) {
    static bool at_exit = (atexit(trace_at_exit), true);   // in main, so before the state is destroyed
    (void)at_exit;
    host_catch_up();
    S.host += K(TL_HOST_CALL_US) * 1e-6;
    advance_to(S.host);
    S.ops.emplace_back();
    emu_tl_op* op = &S.ops.back();
    op->seq = S.ops.size();
    op->track = track_for(stream, legacy);
    op->what = what;
    op->name = what;
    op->technique = EMU_TECHNIQUE_NONE;
    op->pageable = false;
    op->enqueued = S.host;
    price(op, stream, w);
    for (emu_tl_op* d : deps) {
        if (d == nullptr || std::find(op->deps.begin(), op->deps.end(), d) != op->deps.end()) { continue; }
        op->deps.push_back(d);
        if (!d->done) {
            op->waiting++;
            d->dependents.push_back(op);
        }
    }
    if (op->waiting == 0) { make_ready(op, S.host); }
    return op;
}

// the host waits for op (nullptr: nothing)
void emu_tl_host_wait(emu_tl_op* op) {
    if (op == nullptr) { return; }
    host_catch_up();
    advance_to(S.host);
    while (!op->done) {
        if (S.events.empty()) { emu_fail("timeline: the host waits for '%s', which can never run (an internal error)", op->what); }
        process_one();
    }
    S.host = std::max(S.host, op->end);
}

bool emu_tl_done(const emu_tl_op* op) { return op != nullptr && op->done; }
double emu_tl_end_ms(const emu_tl_op* op) { return op->end * 1e3; }

// ----------------------------------------------------------------------------
// what the program tells the timeline (cuda_emu.h; cuda/profile.cuh and llmc/profile.h call these)

void emu_timeline_range(cudaStream_t stream, const char* stream_name, const char* name, double flops, double bytes,
                        int technique, int tensor) {
    if (!emu_timeline_on()) { return; }
    const void* key = emu_stream_key(stream);
    emu_timeline_range_end(stream);
    int t = track_for(key, stream == 0);
    if (!S.tracks[t].named && stream_name != nullptr) {
        S.tracks[t].name = stream_name;
        S.tracks[t].named = true;
    }
    double rate = tensor ? K(TL_BF16_TFLOPS) * 1e12 * K(TL_ATTENTION_FRACTION) : K(TL_FP32_TFLOPS) * 1e12;
    S.open_range[key] = tl_range{name, flops, bytes, rate, technique, 0.0, 0.0, 0};
}

void emu_timeline_range_end(cudaStream_t stream) {
    if (!emu_timeline_on()) { return; }
    auto it = S.open_range.find(emu_stream_key(stream));
    if (it == S.open_range.end()) { return; }
    S.range_history[it->second.name] = tl_range_history{it->second.kernels, it->second.self_flops, it->second.self_bytes};
    S.open_range.erase(it);
}

void emu_timeline_host_range_end() {
    if (!emu_timeline_on() || !S.host_range.open) { return; }
    tl_host_range& r = S.host_range;
    S.host += std::max(0.0, r.cost - r.charged);
    S.host_range_wall[r.name] = (wall_now() - r.wall_start) - (S.emulation_wall - r.emulation_at_start);
    S.host_intervals.push_back({r.start, S.host, r.technique, r.name});
    r.open = false;
}

void emu_timeline_host_range(const char* name, double bytes, int technique) {
    if (!emu_timeline_on()) { return; }
    emu_timeline_host_range_end();
    host_catch_up();
    tl_host_range& r = S.host_range;
    r.open = true;
    r.name = name;
    r.technique = technique;
    r.start = S.host;
    r.cost = bytes / (K(TL_HOST_GB_S) * 1e9);
    r.charged = 0.0;
    r.wall_start = wall_now();
    r.emulation_at_start = S.emulation_wall;
}

void emu_timeline_set_rank(int rank) { S.rank = rank; }

void emu_timeline_step_begin() {
    if (!emu_timeline_on()) { return; }
    host_catch_up();
    S.window_start = S.host;
    S.window_end = -1.0;
    S.window_first_seq = S.ops.size() + 1;
    S.window_unpriced = S.unpriced;
    S.in_window = true;
}

double emu_timeline_step_end() {
    if (!emu_timeline_on() || !S.in_window) { return 0.0; }
    emu_timeline_host_range_end();
    host_catch_up();
    S.window_end = S.host;
    S.window_unpriced = S.unpriced - S.window_unpriced;
    S.in_window = false;
    return S.window_end - S.window_start;
}

// ----------------------------------------------------------------------------
// the reports: busy and exposed time in the step, printed, as JSON, as a Chrome trace

typedef std::vector<std::pair<double, double>> tl_intervals;

static double measure(tl_intervals v) {   // of the union
    std::sort(v.begin(), v.end());
    double total = 0.0, from = 0.0, to = -1.0;
    for (auto& iv : v) {
        if (iv.first > to) { total += std::max(0.0, to - from); from = iv.first; to = iv.second; }
        else { to = std::max(to, iv.second); }
    }
    return total + std::max(0.0, to - from);
}

// the part of a's union that b's union does not cover
static double measure_outside(const tl_intervals& a, const tl_intervals& b) {
    tl_intervals both = a;
    both.insert(both.end(), b.begin(), b.end());
    return measure(both) - measure(b);
}

struct tl_summary {
    double step = 0.0;
    std::vector<double> busy;                 // per track
    double total[EMU_NUM_TECHNIQUES] = {}, exposed[EMU_NUM_TECHNIQUES] = {};
    int compute_track = -1;
};

static bool op_in(const emu_tl_op& op, double from, double to) {
    return op.done && op.start < to && op.end > from;
}

static tl_summary summarize(double from, double to) {
    tl_summary s;
    s.step = to - from;
    s.busy.assign(S.tracks.size(), 0.0);
    for (size_t t = 0; t < S.tracks.size(); t++) {
        if (S.tracks[t].name == "compute") { s.compute_track = (int)t; }
    }
    if (s.compute_track < 0) {
        for (auto& kv : S.track_of) {
            if (S.tracks[kv.second].name == "default stream") { s.compute_track = kv.second; }
        }
    }
    std::vector<tl_intervals> busy(S.tracks.size());
    tl_intervals compute, tech[EMU_NUM_TECHNIQUES];
    auto clip = [&](double a, double b) { return std::make_pair(std::max(a, from), std::min(b, to)); };
    for (const emu_tl_op& op : S.ops) {
        if (!op_in(op, from, to) || op.engine == TL_NONE) { continue; }
        auto iv = clip(op.start, op.end);
        busy[op.track].push_back(iv);
        if (op.track == s.compute_track && op.engine == TL_COMPUTE) { compute.push_back(iv); }
        if (op.technique != EMU_TECHNIQUE_NONE) { tech[op.technique].push_back(iv); }
    }
    for (const tl_host_interval& h : S.host_intervals) {
        if (h.start >= to || h.end <= from) { continue; }
        busy[0].push_back(clip(h.start, h.end));
        if (h.technique != EMU_TECHNIQUE_NONE) { tech[h.technique].push_back(clip(h.start, h.end)); }
    }
    for (size_t t = 0; t < S.tracks.size(); t++) { s.busy[t] = measure(busy[t]); }
    for (int k = 1; k < EMU_NUM_TECHNIQUES; k++) {
        s.total[k] = measure(tech[k]);
        s.exposed[k] = measure_outside(tech[k], compute);
    }
    return s;
}

static bool have_window() { return S.window_end >= S.window_start && S.window_start >= 0.0; }

void emu_timeline_print(FILE* f, double tokens) {
    if (!emu_timeline_on() || !have_window()) { return; }
    tl_summary s = summarize(S.window_start, S.window_end);
    fprintf(f, "timeline (CUDA_EMU_TIMELINE=%s: %s, modelled): predicted step %.3f ms", model()->name.c_str(),
            model()->title.c_str(), s.step * 1e3);
    if (tokens > 0.0 && s.step > 0.0) {
        fprintf(f, ", %.0f tokens/s", tokens / s.step);
        if (S.nranks > 1) { fprintf(f, " a rank (%.0f for %d ranks)", tokens * S.nranks / s.step, S.nranks); }
    }
    fprintf(f, "\n  busy in the step:");
    const char* sep = " ";
    for (size_t t = 0; t < S.tracks.size(); t++) {
        if (s.busy[t] <= 0.0 && t != 0) { continue; }   // a stream idle in the step (the host is always named)
        fprintf(f, "%s%s %.3f ms (%.0f%%)", sep, S.tracks[t].name.c_str(), s.busy[t] * 1e3,
                s.step > 0.0 ? 100.0 * s.busy[t] / s.step : 0.0);
        sep = ", ";
    }
    fprintf(f, "\n  | %-15s | %10s | %10s | %8s |\n", "technique", "total ms", "exposed ms", "exposed");
    for (int k = 1; k < EMU_NUM_TECHNIQUES; k++) {
        char share[16] = "-";
        if (s.total[k] > 0.0) { snprintf(share, sizeof share, "%.1f%%", 100.0 * s.exposed[k] / s.total[k]); }
        fprintf(f, "  | %-15s | %10.3f | %10.3f | %8s |\n", TL_TECHNIQUE_NAMES[k], s.total[k] * 1e3, s.exposed[k] * 1e3, share);
    }
    fprintf(f, "  exposed: the part of a technique's copies (offload), collectives (exchange) or host update\n"
               "  (optimizer_host) during which the compute stream runs no kernel. The table's times above are this\n"
               "  model's too. A prediction of what overlaps and what waits, not of kernel speed: doc/timeline.md\n");
    if (S.window_unpriced > 0) {
        fprintf(f, "  (%llu kernels of the step ran outside every profile range: priced at their launch and 8 bytes a thread)\n",
                (unsigned long long)S.window_unpriced);
    }
}

static void json_string(FILE* f, const std::string& s) {
    fputc('"', f);
    for (char ch : s) {
        if (ch == '"' || ch == '\\') { fputc('\\', f); fputc(ch, f); }
        else if ((unsigned char)ch < 0x20) { fprintf(f, "\\u%04x", ch); }
        else { fputc(ch, f); }
    }
    fputc('"', f);
}

void emu_timeline_json(FILE* f, double tokens) {
    if (!emu_timeline_on() || !have_window()) { return; }
    tl_summary s = summarize(S.window_start, S.window_end);
    fprintf(f, "\"timeline\": {\"gpu\": ");
    json_string(f, model()->name);
    fprintf(f, ", \"step_s\": %.9f, \"tokens_per_s\": %.3f, \"ranks\": %d, \"streams\": {", s.step,
            tokens > 0.0 && s.step > 0.0 ? tokens / s.step : 0.0, S.nranks);
    const char* sep = "";
    for (size_t t = 0; t < S.tracks.size(); t++) {
        fprintf(f, "%s", sep);
        json_string(f, S.tracks[t].name);
        fprintf(f, ": %.9f", s.busy[t]);
        sep = ", ";
    }
    for (const char* what : {"exposed_s", "total_s"}) {
        fprintf(f, "}, \"%s\": {", what);
        for (int k = 1; k < EMU_NUM_TECHNIQUES; k++) {
            fprintf(f, "%s\"%s\": %.9f", k > 1 ? ", " : "", TL_TECHNIQUE_NAMES[k],
                    what[0] == 'e' ? s.exposed[k] : s.total[k]);
        }
    }
    fprintf(f, "}, \"unpriced_kernels\": %llu}, ", (unsigned long long)S.window_unpriced);
}

// the Chrome trace (chrome://tracing, ui.perfetto.dev) of the operations that ran in [from, to):
// one thread a stream (tid 0 the host), complete events ("X") in microseconds, each with its
// sequence number and those of the operations it waited for ("after", their streams "after_tids"),
// and a flow arrow for
// every dependency across streams
static void write_trace(FILE* f, double from, double to) {
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"gpu\": ");
    json_string(f, model()->name);
    fprintf(f, ", \"what\": \"predicted by dev/cuda_emu's timeline, not measured\"}, \"traceEvents\": [\n");
    int pid = S.rank;
    for (size_t t = 0; t < S.tracks.size(); t++) {
        fprintf(f, "{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": %zu, \"args\": {\"name\": ", pid, t);
        json_string(f, S.tracks[t].name);
        fprintf(f, "}},\n{\"ph\": \"M\", \"name\": \"thread_sort_index\", \"pid\": %d, \"tid\": %zu, \"args\": {\"sort_index\": %zu}},\n", pid, t, t);
    }
    fprintf(f, "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}}", pid, S.rank);
    uint64_t flow = 0;
    for (const emu_tl_op& op : S.ops) {
        if (!op.done || op.start < from || op.start >= to) { continue; }
        fprintf(f, ",\n{\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"name\": ", pid, op.track,
                op.start * 1e6, (op.end - op.start) * 1e6);
        json_string(f, op.name);
        fprintf(f, ", \"cat\": \"%s\", \"args\": {\"seq\": %llu, \"call\": ", op.cat, (unsigned long long)op.seq);
        json_string(f, op.what);
        fprintf(f, ", \"after\": [");
        for (size_t i = 0; i < op.deps.size(); i++) { fprintf(f, "%s%llu", i ? ", " : "", (unsigned long long)op.deps[i]->seq); }
        fprintf(f, "], \"after_tids\": [");   // their streams (those before the trace's start too)
        for (size_t i = 0; i < op.deps.size(); i++) { fprintf(f, "%s%d", i ? ", " : "", op.deps[i]->track); }
        fprintf(f, "]");
        if (op.technique != EMU_TECHNIQUE_NONE) { fprintf(f, ", \"technique\": \"%s\"", TL_TECHNIQUE_NAMES[op.technique]); }
        if (op.bytes > 0.0) { fprintf(f, ", \"bytes\": %.0f", op.bytes); }
        if (op.flops > 0.0) { fprintf(f, ", \"flops\": %.0f", op.flops); }
        fprintf(f, "}}");
        for (const emu_tl_op* d : op.deps) {
            if (d->track == op.track || d->start < from) { continue; }
            flow++;
            fprintf(f, ",\n{\"ph\": \"s\", \"id\": %llu, \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"name\": \"waits\", \"cat\": \"dependency\"}",
                    (unsigned long long)flow, pid, d->track, d->end * 1e6);
            fprintf(f, ",\n{\"ph\": \"f\", \"bp\": \"e\", \"id\": %llu, \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"name\": \"waits\", \"cat\": \"dependency\"}",
                    (unsigned long long)flow, pid, op.track, op.start * 1e6);
        }
    }
    for (const tl_host_interval& h : S.host_intervals) {
        if (h.start < from || h.start >= to) { continue; }
        fprintf(f, ",\n{\"ph\": \"X\", \"pid\": %d, \"tid\": 0, \"ts\": %.3f, \"dur\": %.3f, \"name\": ", pid, h.start * 1e6,
                (h.end - h.start) * 1e6);
        json_string(f, h.name);
        fprintf(f, ", \"cat\": \"host\", \"args\": {");
        if (h.technique != EMU_TECHNIQUE_NONE) { fprintf(f, "\"technique\": \"%s\"", TL_TECHNIQUE_NAMES[h.technique]); }
        fprintf(f, "}}");
    }
    fprintf(f, "\n]}\n");
}

// written whole under a temporary name, then renamed: a reader never sees half a trace
static void write_trace_file(const char* path, double from, double to) {
    std::string tmp = std::string(path) + ".tmp";
    FILE* f = fopen(tmp.c_str(), "w");
    if (f == nullptr) { emu_fail("timeline: cannot write the trace %s (%s)", tmp.c_str(), strerror(errno)); }
    write_trace(f, from, to);
    if (fclose(f) != 0 || rename(tmp.c_str(), path) != 0) {
        emu_fail("timeline: cannot write the trace %s (%s)", path, strerror(errno));
    }
}

void emu_timeline_trace(const char* path) {
    if (!emu_timeline_on() || !have_window()) { return; }
    write_trace_file(path, S.window_start, S.window_end);
}

// CUDA_EMU_TRACE=FILE: the whole run's trace at exit, for programs without --profile
static void trace_at_exit() {
    const char* path = getenv("CUDA_EMU_TRACE");
    if (path == nullptr || path[0] == '\0' || !emu_timeline_on()) { return; }
    while (!S.events.empty()) { process_one(); }   // what the program never waited for still ends
    write_trace_file(path, 0.0, 1e300);
}

void emu_timeline_init() {
    if (emu_timeline_on()) { model(); }   // a constants file's mistakes stop the program at once
}

const char* emu_timeline_gpu() { return emu_timeline_on() ? model()->name.c_str() : nullptr; }
