/*
emu_kernel.cpp: running a kernel grid. Blocks run one after another; the threads of a block are
fibers (emu_fiber.h) that a scheduler runs in rounds.

A round runs every ready thread, in the order CUDA_EMU_THREAD_ORDER picks, until it blocks:
  - at __syncthreads: it waits until every thread of the block is there;
  - at a warp collective (__syncwarp, __shfl*_sync, __ballot/__any/__all_sync, and wmma's load,
    store and mma, which also require one call site): it posts its value and waits until every
    lane of the mask has posted; the last lane to arrive computes all lanes' results (for wmma:
    emu_wmma_complete) and releases them;
  - or it returns from the kernel (exits).
After a round with nothing left to run, either all threads exited (the block is done), or all
live threads wait at __syncthreads (released: the next round starts), or the block can never
finish (a barrier some threads skipped or exited before, a warp collective whose lanes wait
elsewhere): that stops the program with a message naming the kernel, the block and every place
a thread waits.

Invariants: one fiber runs at a time on the calling OS thread; a fiber switches only inside
emu_syncthreads and emu_warp_collective; a __shared__ static and the dynamic shared buffer are
refilled with EMU_UNWRITTEN_BYTE for every block.
*/
#include "emu_internal.h"
#include "emu_fiber.h"

#include <map>
#include <string>
#include <vector>

enum emu_thread_state { THREAD_READY, THREAD_AT_BARRIER, THREAD_AT_WARP, THREAD_EXITED };

struct emu_thread {
    void* sp;                    // saved stack pointer while not running
    uint3 idx;                   // threadIdx
    int lane, warp;              // linear index / 32 and % 32
    emu_thread_state state;
    // where it waits, and what it posted there
    const char* wait_file;
    int wait_line;
    emu_collective op;
    unsigned mask;
    uint64_t value;
    int arg, width;
    uint64_t result;             // the collective's answer for this thread
};

// what a warp's collectives need to know without visiting its 32 lanes on every call
struct emu_warp {
    unsigned waiting;   // lanes that wait at a warp collective (state THREAD_AT_WARP)
    unsigned exited;    // lanes that returned from the kernel
};

emu_thread* emu_current_thread;
uint3 emu_block_idx, emu_block_dim, emu_grid_dim;
const uint3& emu_thread_idx(const emu_thread* t) { return t->idx; }

// the launch that runs now
static const emu_grid* running;
static std::vector<emu_thread> threads;       // (threads per block)
static std::vector<emu_warp> warps;           // (warps per block)
static std::vector<int> order;                // the order of a round: a permutation of the threads
static void* scheduler_sp;
// the launch's dynamic shared memory, in chunks so that it starts as aligned as the largest
// alignment a kernel may declare for it and rely on (extern __shared__ __align__(128) ...; wmma
// needs 32 bytes): rewrite.py drops the declaration's __align__, so the buffer has the most
enum { DYNAMIC_SHARED_ALIGNMENT = 128 };
struct alignas(DYNAMIC_SHARED_ALIGNMENT) shared_chunk { unsigned char bytes[DYNAMIC_SHARED_ALIGNMENT]; };
static std::vector<shared_chunk> dynamic_shared;
struct shared_var { unsigned char* p; size_t bytes; };
static std::vector<shared_var> touched_shared;  // __shared__ statics already filled for this block
static unsigned shuffle_state;

static const unsigned FULL_WARP_MASK = 0xffffffffu;
static const uint64_t INACTIVE_LANE_BITS = ~(uint64_t)0;  // what reading an inactive lane yields

[[noreturn]] static void kernel_fail(const char* fmt, const std::string& detail) {
    fflush(stdout);
    fprintf(stderr, "cuda_emu: error: kernel '%s' (launched at %s:%d), block (%u,%u,%u):\n  ",
            running->site.kernel, running->site.file, running->site.line,
            emu_block_idx.x, emu_block_idx.y, emu_block_idx.z);
    fprintf(stderr, fmt, detail.c_str());
    fprintf(stderr, "\n");
    exit(EXIT_FAILURE);
}

void emu_kernel_fail(const std::string& detail) { kernel_fail("%s", detail); }

void emu_device_trap(const char* what, const char* file, int line) {
    kernel_fail("%s", std::string(what) + " at " + file + ":" + std::to_string(line) + " in thread (" +
                std::to_string(emu_current_thread->idx.x) + "," + std::to_string(emu_current_thread->idx.y) +
                "," + std::to_string(emu_current_thread->idx.z) + ")");
}

// ----------------------------------------------------------------------------
// switching

static void yield_to_scheduler() {
    emu_fiber_switch(&emu_current_thread->sp, scheduler_sp);
}

static void thread_entry() {
    running->body();
    emu_current_thread->state = THREAD_EXITED;
    warps[emu_current_thread->warp].exited |= 1u << emu_current_thread->lane;
    yield_to_scheduler();
    // never resumed: an exited thread is not scheduled again
}

// ----------------------------------------------------------------------------
// barriers and warp collectives (called from kernels via the macros in cuda_emu.h)

int emu_syncthreads(int predicate, const char* file, int line) {
    emu_thread* t = emu_current_thread;
    t->state = THREAD_AT_BARRIER;
    t->wait_file = file;
    t->wait_line = line;
    t->op = EMU_SYNCTHREADS;
    t->value = (uint64_t)predicate;
    yield_to_scheduler();
    return (int)t->result;
}

// mask of the lanes of warp w that exist in this block (the last warp may be partial)
static unsigned lanes_in_block(int w) {
    int n = (int)threads.size() - w * EMU_WARP_SIZE;
    return n >= EMU_WARP_SIZE ? FULL_WARP_MASK : ((1u << n) - 1u);
}

static const char* collective_name(emu_collective op) {
    switch (op) {
        case EMU_SYNCTHREADS: return "__syncthreads";
        case EMU_SYNCWARP: return "__syncwarp";
        case EMU_SHFL_IDX: return "__shfl_sync";
        case EMU_SHFL_UP: return "__shfl_up_sync";
        case EMU_SHFL_DOWN: return "__shfl_down_sync";
        case EMU_SHFL_XOR: return "__shfl_xor_sync";
        case EMU_BALLOT: return "__ballot_sync";
        case EMU_ANY: return "__any_sync";
        case EMU_ALL: return "__all_sync";
        case EMU_WMMA_LOAD: return "wmma::load_matrix_sync";
        case EMU_WMMA_STORE: return "wmma::store_matrix_sync";
        case EMU_WMMA_MMA: return "wmma::mma_sync";
        case EMU_PTX_MMA: return "mma.sync.m16n8k16 (ptx_mma_bf16_16816)";
        case EMU_PTX_LDMATRIX: return "ldmatrix (ptx_ldmatrix)";
    }
    return "?";
}

// the lane whose value `lane` receives, as the CUDA programming guide defines it for each shuffle:
// width splits the warp into segments; a source outside the lane's segment gives its own value
// (except __shfl_sync, which wraps srcLane into the segment, and xor, which may read lower segments)
static int shuffle_source(emu_collective op, int lane, int arg, int width) {
    int segment_start = lane & ~(width - 1);
    int in_segment = lane & (width - 1);
    switch (op) {
        case EMU_SHFL_IDX: return segment_start + (arg & (width - 1));
        case EMU_SHFL_UP: return in_segment - arg < 0 ? lane : lane - arg;
        case EMU_SHFL_DOWN: return in_segment + arg >= width ? lane : lane + arg;
        case EMU_SHFL_XOR: {
            int src = lane ^ arg;
            return src >= segment_start + width ? lane : src;
        }
        default: return lane;
    }
}

// "__shfl_sync at file:line", for error messages only (building it on every call would cost more
// than the collective itself)
static std::string collective_site(emu_collective op, const char* file, int line) {
    return std::string(collective_name(op)) + " at " + file + ":" + std::to_string(line);
}

// The errors of a collective, out of line (and cold): the path every shuffle takes then keeps a
// small stack frame, which matters because each waiting fiber's frame must come back into cache.

// stop: lane l of the warp waits at another collective (or the same with another mask) than t
[[noreturn]] __attribute__((noinline, cold)) static void fail_mismatch(const emu_thread* t, int l) {
    const emu_thread& other = threads[t->warp * EMU_WARP_SIZE + l];
    bool wmma = emu_collective_is_wmma(t->op) || emu_collective_is_wmma(other.op);
    bool ptx = emu_collective_is_ptx(t->op) || emu_collective_is_ptx(other.op);
    kernel_fail("%s", collective_site(t->op, t->wait_file, t->wait_line) + " (lane " + std::to_string(t->lane) +
                "): lane " + std::to_string(l) + " waits at a different collective, " +
                collective_site(other.op, other.wait_file, other.wait_line) +
                (wmma  ? " (every lane of the warp must reach the same wmma call: no divergent wmma)"
                 : ptx ? " (every lane of the warp must reach the same instruction: mma.sync and ldmatrix are .aligned)"
                       : " (or with a different mask)"));
}

[[noreturn]] __attribute__((noinline, cold)) static void fail_width(const emu_thread* t) {
    kernel_fail("%s: width must be a power of 2 no larger than 32", collective_site(t->op, t->wait_file, t->wait_line));
}

[[noreturn]] __attribute__((noinline, cold)) static void fail_not_in_mask(const emu_thread* t) {
    kernel_fail("%s: the calling lane is not in the mask",
                collective_site(t->op, t->wait_file, t->wait_line) + ", lane " + std::to_string(t->lane));
}

[[noreturn]] __attribute__((noinline, cold)) static void fail_exited(const emu_thread* t, int l) {
    kernel_fail("%s of the mask has already exited", collective_site(t->op, t->wait_file, t->wait_line) + " (lane " +
                                                         std::to_string(t->lane) + "): lane " + std::to_string(l));
}

// whether two waiting threads wait at the same line of the same file
static bool same_site(const emu_thread& a, const emu_thread& b) {
    return a.wait_line == b.wait_line && (a.wait_file == b.wait_file || strcmp(a.wait_file, b.wait_file) == 0);
}

// all lanes of `expected` have posted a collective: check it is the same one, then compute every
// lane's result (t is the last lane to arrive). Out of line: its frame stays off the waiting stacks.
__attribute__((noinline)) static void complete_collective(const emu_thread* t, unsigned expected) {
    emu_thread* lanes = &threads[t->warp * EMU_WARP_SIZE];
    emu_collective op = t->op;
    bool wmma = emu_collective_is_wmma(op), ptx = emu_collective_is_ptx(op);
    unsigned votes = 0;
    uint64_t posted[EMU_WARP_SIZE];
    for (int l = 0; l < EMU_WARP_SIZE; l++) {
        if (!(expected >> l & 1u)) { continue; }
        if (lanes[l].op != op || lanes[l].mask != t->mask || ((wmma || ptx) && !same_site(lanes[l], *t))) {
            fail_mismatch(t, l);
        }
        posted[l] = lanes[l].value;
        if (lanes[l].value != 0) { votes |= 1u << l; }
    }
    if (wmma) { emu_wmma_complete(op, posted, expected); }  // the lanes' fragments, all written now
    if (ptx) { emu_ptx_complete(op, posted, expected); }    // the lanes' registers, likewise
    for (int l = 0; l < EMU_WARP_SIZE; l++) {
        if (!(expected >> l & 1u)) { continue; }
        emu_thread* lane = &lanes[l];
        switch (op) {
            case EMU_BALLOT: lane->result = votes; break;
            case EMU_ANY: lane->result = votes != 0; break;
            case EMU_ALL: lane->result = votes == expected; break;
            case EMU_SYNCWARP:
            case EMU_WMMA_LOAD:
            case EMU_WMMA_STORE:
            case EMU_WMMA_MMA:
            case EMU_PTX_MMA:
            case EMU_PTX_LDMATRIX: lane->result = 0; break;
            default: {
                int src = shuffle_source(op, l, lane->arg, lane->width);
                lane->result = (expected >> src & 1u) ? posted[src] : INACTIVE_LANE_BITS;
            }
        }
        lane->state = THREAD_READY;
    }
    warps[t->warp].waiting &= ~expected;
}

uint64_t emu_warp_collective(emu_collective op, unsigned mask, uint64_t value, int arg, int width,
                             const char* file, int line) {
    emu_thread* t = emu_current_thread;
    t->state = THREAD_AT_WARP;
    t->wait_file = file;
    t->wait_line = line;
    t->op = op;
    t->mask = mask;
    t->value = value;
    t->arg = arg;
    t->width = width;
    if (width <= 0 || width > EMU_WARP_SIZE || (width & (width - 1)) != 0) { fail_width(t); }
    unsigned self = 1u << t->lane;
    if (!(mask & self)) { fail_not_in_mask(t); }

    emu_warp& w = warps[t->warp];
    unsigned expected = mask & lanes_in_block(t->warp);
    unsigned gone = expected & w.exited;
    if (gone != 0) { fail_exited(t, __builtin_ctz(gone)); }
    // a lane of the mask already waiting elsewhere: say so now (complete_collective checks them all)
    unsigned others = expected & w.waiting;
    if (others != 0) {
        const emu_thread& first = threads[t->warp * EMU_WARP_SIZE + __builtin_ctz(others)];
        if (first.op != op || first.mask != mask) { fail_mismatch(t, __builtin_ctz(others)); }
    }
    w.waiting |= self;
    if ((w.waiting & expected) == expected) {
        complete_collective(t, expected);  // the last lane to arrive goes on without a switch
    } else {
        yield_to_scheduler();
    }
    return t->result;
}

unsigned emu_active_mask() {
    // the lanes of this warp that have not exited; the emulator does not model divergence
    int w = emu_current_thread->warp;
    return lanes_in_block(w) & ~warps[w].exited;
}

void* emu_dynamic_shared() {
    return dynamic_shared.empty() ? nullptr : dynamic_shared.data();
}

void emu_shared_touch(void* var, size_t bytes) {
    for (const shared_var& v : touched_shared) {
        if (v.p == var) { return; }
    }
    touched_shared.push_back(shared_var{(unsigned char*)var, bytes});
    memset(var, EMU_UNWRITTEN_BYTE, bytes);
}

bool emu_is_shared_range(const void* p, size_t bytes) {
    const unsigned char* c = (const unsigned char*)p;
    const unsigned char* dyn = (const unsigned char*)emu_dynamic_shared();
    if (dyn != nullptr && c >= dyn && c + bytes <= dyn + running->dynamic_shared_bytes) { return true; }
    for (const shared_var& v : touched_shared) {
        if (c >= v.p && c + bytes <= v.p + v.bytes) { return true; }
    }
    return false;
}

int emu_current_thread_index() { return emu_current_thread->warp * EMU_WARP_SIZE + emu_current_thread->lane; }

// ----------------------------------------------------------------------------
// the scheduler

static void make_round_order() {
    int n = (int)threads.size();
    switch (emu_config().thread_order) {
        case EMU_ORDER_FORWARD: break;  // set up once by run_block
        case EMU_ORDER_REVERSE: break;
        case EMU_ORDER_SHUFFLE:
            for (int i = n - 1; i > 0; i--) {  // Fisher-Yates with a xorshift generator
                shuffle_state ^= shuffle_state << 13;
                shuffle_state ^= shuffle_state >> 17;
                shuffle_state ^= shuffle_state << 5;
                std::swap(order[i], order[shuffle_state % (unsigned)(i + 1)]);
            }
            break;
    }
}

// the block cannot finish: say where every live thread waits
[[noreturn]] static void report_stuck_block(int exited) {
    std::map<std::string, int> waiting;  // "what at file:line" -> how many threads
    for (emu_thread& t : threads) {
        if (t.state == THREAD_EXITED) { continue; }
        waiting[std::string(collective_name(t.op)) + " at " + t.wait_file + ":" + std::to_string(t.wait_line)]++;
    }
    std::string detail = "the block cannot finish (a barrier or warp collective not reached by every thread "
                         "it waits for):";
    for (auto& w : waiting) { detail += "\n    " + std::to_string(w.second) + " thread(s) wait at " + w.first; }
    if (exited > 0) { detail += "\n    " + std::to_string(exited) + " thread(s) have returned from the kernel"; }
    kernel_fail("%s", detail);
}

static void run_block() {
    int n = (int)threads.size();
    for (int i = 0; i < n; i++) {
        threads[i].state = THREAD_READY;
        threads[i].sp = emu_fiber_prepare(emu_fiber_stack_get(i), thread_entry);
    }
    for (emu_warp& w : warps) { w = emu_warp{0, 0}; }
    touched_shared.clear();
    emu_ptx_block_start(n);
    if (!dynamic_shared.empty()) {
        memset(dynamic_shared.data(), EMU_UNWRITTEN_BYTE, dynamic_shared.size() * sizeof(shared_chunk));
    }

    for (;;) {
        make_round_order();
        for (int i = 0; i < n; i++) {
            emu_thread* t = &threads[order[i]];
            if (t->state != THREAD_READY) { continue; }
            emu_current_thread = t;
            emu_fiber_switch(&scheduler_sp, t->sp);
        }
        int ready = 0, at_barrier = 0, exited = 0, barrier_true = 0;
        for (emu_thread& t : threads) {
            ready += t.state == THREAD_READY;
            exited += t.state == THREAD_EXITED;
            if (t.state == THREAD_AT_BARRIER) {
                at_barrier++;
                barrier_true += t.value != 0;
            }
        }
        if (exited == n) { return; }
        if (ready > 0) { continue; }  // released by a warp collective during the round
        if (at_barrier != n) { report_stuck_block(exited); }
        for (emu_thread& t : threads) {
            t.state = THREAD_READY;
            t.result = (uint64_t)barrier_true;
        }
    }
}

void emu_run_grid(const emu_grid& g) {
    running = &g;
    emu_grid_dim = uint3{g.grid.x, g.grid.y, g.grid.z};
    emu_block_dim = uint3{g.block.x, g.block.y, g.block.z};
    int n = (int)(g.block.x * g.block.y * g.block.z);
    threads.assign(n, emu_thread{});
    warps.assign((n + EMU_WARP_SIZE - 1) / EMU_WARP_SIZE, emu_warp{0, 0});
    order.resize(n);
    for (int i = 0; i < n; i++) {
        emu_thread& t = threads[i];
        t.idx = uint3{i % g.block.x, (i / g.block.x) % g.block.y, i / (g.block.x * g.block.y)};
        t.lane = i % EMU_WARP_SIZE;
        t.warp = i / EMU_WARP_SIZE;
        order[i] = emu_config().thread_order == EMU_ORDER_REVERSE ? n - 1 - i : i;
    }
    shuffle_state = emu_config().seed;
    dynamic_shared.resize((g.dynamic_shared_bytes + sizeof(shared_chunk) - 1) / sizeof(shared_chunk));  // filled per block

    for (unsigned z = 0; z < g.grid.z; z++) {
        for (unsigned y = 0; y < g.grid.y; y++) {
            for (unsigned x = 0; x < g.grid.x; x++) {
                emu_block_idx = uint3{x, y, z};
                run_block();
            }
        }
    }
    emu_current_thread = nullptr;
    running = nullptr;
}
