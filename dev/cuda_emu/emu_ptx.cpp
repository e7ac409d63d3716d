/*
emu_ptx.cpp: the PTX instructions of cuda/ptx.cuh on the emulated device, with the element-to-lane
mappings the PTX ISA specifies (so, unlike wmma's, the real ones: code may rely on them).

mma.sync.m16n8k16 (bf16 in, fp32 accumulators) and ldmatrix are warp collectives
(emu_warp_collective, ops EMU_PTX_MMA and EMU_PTX_LDMATRIX): each lane checks its own arguments,
posts a pointer to its ptx_call (on its fiber's stack while it waits), and the last lane to arrive
runs emu_ptx_complete: all 32 lanes must be there, at one call site (emu_kernel.cpp checks it),
with the same qualifiers; then it does the warp's work at once.
  - mma: gathers A (16x16), B (16x8) and C (16x8) from the lanes' registers by the ISA's tables,
    d[m][n] = c[m][n] + a[m][0] b[0][n] + ... + a[m][15] b[15][n] in that order in fp32 (products
    of bf16 are exact; each sum is rounded; -ffp-contract=off), and scatters D (d may be c).
  - ldmatrix: lane 8j + i's address is row i of matrix j (8 bf16, 16 bytes, 16-byte aligned, in
    shared memory); register j of lane l gets row l/4, columns 2(l%4) and 2(l%4)+1 of matrix j, or
    with .trans rows 2(l%4), 2(l%4)+1 of column l/4.
cp.async is per thread: a queue of copies in this thread's open group, then of committed groups.
At the cp.async its 16 destination bytes become NaN bytes and the source is read; they land in
shared memory only at the wait_group that retires their group. A thread (or, after a barrier, its
block) that reads the destination before that reads NaN: a missing wait shows as NaN in results.
Copies still in flight when the block ends are dropped (nothing could read them).

Checked (the hardware leaves these undefined): full warps, one call site, lanes with the same
qualifiers; ldmatrix rows in shared memory, 16-byte aligned; cp.async from global (cudaMalloc)
memory to shared memory, both 16-byte aligned, 0..16 source bytes.
*/
#include "emu_internal.h"

#include <string>
#include <vector>

static const unsigned FULL_WARP = 0xffffffffu;
enum {
    MMA_M = 16, MMA_N = 8, MMA_K = 16,  // mma.sync.m16n8k16
    LDMATRIX_ROWS = 8,                  // an 8x8 matrix of 16-bit elements per register
    ROW_BYTES = 16,                     // an ldmatrix row and a cp.async copy
};

// one lane's call, posted to the collective as a pointer
struct ptx_call {
    float* d;  // mma
    const uint32_t *a, *b;
    const float* c;
    uint32_t* r;  // ldmatrix
    int num;
    bool trans;
    const void* row;
    const char* file;
    int line;
};

// ----------------------------------------------------------------------------
// the ISA's tables (g = lane / 4, t = lane % 4); element i of a lane is in register i / 2, low
// half for even i

// mma A (16x16): a0,a1 (g, 2t+{0,1}) a2,a3 (g+8, ..) a4,a5 (g, 2t+8+{0,1}) a6,a7 (g+8, ..)
static inline int a_row(int lane, int i) { return lane / 4 + (i / 2 % 2) * 8; }
static inline int a_col(int lane, int i) { return lane % 4 * 2 + i % 2 + (i / 4) * 8; }
// mma B (16x8, k x n): b0,b1 (k = 2t+{0,1}, n = g) b2,b3 (k = 2t+8+{0,1}, n = g)
static inline int b_row(int lane, int i) { return lane % 4 * 2 + i % 2 + (i / 2) * 8; }
static inline int b_col(int lane) { return lane / 4; }
// mma C and D (16x8): c0,c1 (g, 2t+{0,1}) c2,c3 (g+8, ..)
static inline int c_row(int lane, int i) { return lane / 4 + (i / 2) * 8; }
static inline int c_col(int lane, int i) { return lane % 4 * 2 + i % 2; }

static inline float bf16_bits_to_float(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;  // bf16 is the top half of an fp32
    float f;
    memcpy(&f, &wide, sizeof f);
    return f;
}

static inline uint16_t half_of(uint32_t reg, int i) { return (uint16_t)(i % 2 == 0 ? reg & 0xffffu : reg >> 16); }

// ----------------------------------------------------------------------------
// errors

static std::string site(const char* what, const char* file, int line) {
    return std::string(what) + " at " + file + ":" + std::to_string(line);
}

static const char* op_name(emu_collective op) { return op == EMU_PTX_MMA ? "mma.sync" : "ldmatrix"; }

[[noreturn]] __attribute__((noinline, cold)) static void fail_partial_warp(emu_collective op, const ptx_call& call,
                                                                          unsigned lanes) {
    emu_kernel_fail(site(op_name(op), call.file, call.line) + ": the warp has only " +
                    std::to_string(__builtin_popcount(lanes)) +
                    " threads: the instruction needs all 32 lanes of a warp (.aligned); make the block a multiple "
                    "of 32 threads");
}

[[noreturn]] __attribute__((noinline, cold)) static void fail_qualifiers(const ptx_call& first, const ptx_call& other,
                                                                        int lane) {
    emu_kernel_fail(site("ldmatrix", first.file, first.line) + ": lane " + std::to_string(lane) + " loads .x" +
                    std::to_string(other.num) + (other.trans ? ".trans" : "") + ", lane 0 .x" +
                    std::to_string(first.num) + (first.trans ? ".trans" : "") +
                    ": every lane of the warp must execute the same ldmatrix");
}

[[noreturn]] __attribute__((noinline, cold)) static void fail_address(const char* what, const char* file, int line,
                                                                     const char* operand, const void* p,
                                                                     const char* problem) {
    char detail[512];
    snprintf(detail, sizeof detail, " (thread %d): %s %p %s", emu_current_thread_index(), operand, p, problem);
    emu_kernel_fail(site(what, file, line) + detail);
}

// ----------------------------------------------------------------------------
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32

static void multiply(const ptx_call* const calls[]) {
    float A[MMA_M][MMA_K], B[MMA_K][MMA_N], D[MMA_M][MMA_N];
    for (int l = 0; l < EMU_WARP_SIZE; l++) {
        const ptx_call& c = *calls[l];
        for (int i = 0; i < 8; i++) { A[a_row(l, i)][a_col(l, i)] = bf16_bits_to_float(half_of(c.a[i / 2], i)); }
        for (int i = 0; i < 4; i++) { B[b_row(l, i)][b_col(l)] = bf16_bits_to_float(half_of(c.b[i / 2], i)); }
        for (int i = 0; i < 4; i++) { D[c_row(l, i)][c_col(l, i)] = c.c[i]; }
    }
    for (int m = 0; m < MMA_M; m++) {
        for (int n = 0; n < MMA_N; n++) {
            float s = D[m][n];
            for (int k = 0; k < MMA_K; k++) { s += A[m][k] * B[k][n]; }
            D[m][n] = s;
        }
    }
    for (int l = 0; l < EMU_WARP_SIZE; l++) {
        for (int i = 0; i < 4; i++) { calls[l]->d[i] = D[c_row(l, i)][c_col(l, i)]; }
    }
}

void emu_ptx_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], const char* file,
                            int line) {
    ptx_call call{d, a, b, c, nullptr, 0, false, nullptr, file, line};
    emu_warp_collective(EMU_PTX_MMA, FULL_WARP, (uint64_t)(uintptr_t)&call, 0, EMU_WARP_SIZE, file, line);
}

// ----------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16

static void load_matrices(const ptx_call* const calls[]) {
    const ptx_call& first = *calls[0];
    for (int j = 0; j < first.num; j++) {
        const uint16_t* rows[LDMATRIX_ROWS];  // matrix j's rows, from lanes 8j .. 8j+7
        for (int i = 0; i < LDMATRIX_ROWS; i++) { rows[i] = (const uint16_t*)calls[LDMATRIX_ROWS * j + i]->row; }
        for (int l = 0; l < EMU_WARP_SIZE; l++) {
            int g = l / 4, t = l % 4;
            uint16_t lo = first.trans ? rows[2 * t][g] : rows[g][2 * t];
            uint16_t hi = first.trans ? rows[2 * t + 1][g] : rows[g][2 * t + 1];
            calls[l]->r[j] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    }
}

void emu_ptx_ldmatrix(uint32_t* r, int num, bool trans, const void* row, const char* file, int line) {
    const char* what = "ldmatrix";
    if (emu_current_thread_index() % EMU_WARP_SIZE < LDMATRIX_ROWS * num) {  // this lane's address is used
        if ((uintptr_t)row % ROW_BYTES != 0) {
            fail_address(what, file, line, "row address", row,
                         "is not 16-byte aligned: ldmatrix rows are 8 16-bit elements, naturally aligned; pad "
                         "shared rows to a multiple of 8 elements");
        }
        if (!emu_is_shared_range(row, ROW_BYTES)) {
            fail_address(what, file, line, "row address", row,
                         "is not in shared memory: ldmatrix reads only shared memory (load the tile into a "
                         "__shared__ array first, e.g. with cp.async)");
        }
    }
    ptx_call call{nullptr, nullptr, nullptr, nullptr, r, num, trans, row, file, line};
    emu_warp_collective(EMU_PTX_LDMATRIX, FULL_WARP, (uint64_t)(uintptr_t)&call, 0, EMU_WARP_SIZE, file, line);
}

void emu_ptx_complete(emu_collective op, const uint64_t posted[EMU_WARP_SIZE], unsigned lanes) {
    if (lanes != FULL_WARP) { fail_partial_warp(op, *(const ptx_call*)(uintptr_t)posted[__builtin_ctz(lanes)], lanes); }
    const ptx_call* calls[EMU_WARP_SIZE];
    for (int l = 0; l < EMU_WARP_SIZE; l++) {
        calls[l] = (const ptx_call*)(uintptr_t)posted[l];
        if (op == EMU_PTX_LDMATRIX && (calls[l]->num != calls[0]->num || calls[l]->trans != calls[0]->trans)) {
            fail_qualifiers(*calls[0], *calls[l], l);
        }
    }
    if (op == EMU_PTX_MMA) {
        multiply(calls);
    } else {
        load_matrices(calls);
    }
}

// ----------------------------------------------------------------------------
// cp.async, commit_group, wait_group: per thread

struct async_copy {
    unsigned char* dst;
    unsigned char data[ROW_BYTES];  // the source as read at the cp.async, zero-filled past src_bytes
};
struct thread_copies {
    std::vector<async_copy> open;                 // issued since the last commit
    std::vector<std::vector<async_copy>> groups;  // committed, oldest first
};
static std::vector<thread_copies> copies;  // (threads of the running block)

void emu_ptx_block_start(int n) { copies.assign(n, thread_copies{}); }

void emu_ptx_cp_async(void* dst, const void* src, int src_bytes, const char* name, const char* file, int line) {
    if (src_bytes < 0 || src_bytes > ROW_BYTES) {
        char detail[160];
        snprintf(detail, sizeof detail, " (thread %d): src_bytes = %d: a 16-byte cp.async reads 0 to 16 bytes",
                 emu_current_thread_index(), src_bytes);
        emu_kernel_fail(site(name, file, line) + detail);
    }
    if ((uintptr_t)dst % ROW_BYTES != 0) { fail_address(name, file, line, "destination", dst, "is not 16-byte aligned"); }
    if (!emu_is_shared_range(dst, ROW_BYTES)) {
        fail_address(name, file, line, "destination", dst,
                     "is not in shared memory: cp.async copies global memory to shared memory");
    }
    if ((uintptr_t)src % ROW_BYTES != 0) { fail_address(name, file, line, "source", src, "is not 16-byte aligned"); }
    if (src_bytes > 0 && emu_is_shared_range(src, (size_t)src_bytes)) {
        fail_address(name, file, line, "source", src,
                     "is in shared memory: cp.async reads global memory (copy within shared memory with loads)");
    }
    if (src_bytes > 0 && !emu_is_device_range(src, (size_t)src_bytes)) {
        fail_address(name, file, line, "source", src,
                     "is not in device memory (cudaMalloc): cp.async reads global memory");
    }
    async_copy c;
    c.dst = (unsigned char*)dst;
    memset(c.data, 0, sizeof c.data);
    memcpy(c.data, src, (size_t)src_bytes);
    memset(dst, EMU_UNWRITTEN_BYTE, ROW_BYTES);  // in flight: whoever reads it before the wait gets NaN
    copies[emu_current_thread_index()].open.push_back(c);
}

void emu_ptx_cp_async_commit(const char*, int) {
    thread_copies& t = copies[emu_current_thread_index()];
    t.groups.push_back(std::move(t.open));
    t.open.clear();
}

void emu_ptx_cp_async_wait(int n, const char*, int) {
    thread_copies& t = copies[emu_current_thread_index()];
    size_t keep = (size_t)n, retire = t.groups.size() > keep ? t.groups.size() - keep : 0;
    for (size_t g = 0; g < retire; g++) {
        for (const async_copy& c : t.groups[g]) { memcpy(c.dst, c.data, ROW_BYTES); }
    }
    t.groups.erase(t.groups.begin(), t.groups.begin() + (long)retire);
}
