/*
emu_wmma.cpp: nvcuda::wmma on the emulated device; the API is include/mma.h (the emulator's <mma.h>).

Which lane holds which element. A fragment's 16x16 tile (a: M x K, b: K x N, accumulator: M x N;
element e = row * 16 + col) is spread over the warp's 32 lanes: lane l's x[i] is slot
s = l * num_elements + i, and slot s holds element (s * mul + add) mod 256, with a multiplier and an
offset of its own for a, b and the accumulator (SCRAMBLE). The multipliers are odd, so slots
0..255 are a permutation of the tile; half a and b have 16 elements per lane (CUDA's number), and
slot s + 256 holds the same element as slot s. The hardware keeps a row in a few neighbouring
lanes (in the accumulator of sm_80's mma.sync, lane l holds rows l/4 and l/4 + 8); here a lane's elements lie
in scattered rows and columns, and a, b and the accumulator are scrambled differently, so code
that assumes any mapping (reads a row out of x[], copies an accumulator into an a fragment) gets
wrong answers instead of passing by luck. Elementwise code that treats every x[i] alike is right.

How a call runs. load_matrix_sync, store_matrix_sync and mma_sync are warp collectives
(emu_warp_collective, op EMU_WMMA_*): each lane checks its own arguments (ldm, alignment, layout),
then posts a pointer to its wmma_call, which lives on its fiber's stack while it waits. The last
lane to arrive runs emu_wmma_complete: every lane must be there (a full warp) with the same
arguments (emu_kernel.cpp has already checked that they wait at the same call site), and then it
does the work of all 32 lanes at once: a load or a store walks the slots, an mma gathers a, b and
c into fp32 tiles, multiplies, and scatters d (d may be c: c is read in full first).

Arithmetic: d[m][n] = c[m][n] + a[m][0]*b[0][n] + ... + a[m][15]*b[15][n], added in that order,
each addition rounded to fp32. The products of two bf16 or two half values are exact in fp32 (8 or
11 significant bits each), so only the additions round; tensor cores may add in another order or
keep other bits, so the hardware agrees to a tolerance (test_wmma allows 1e-5 relative on a GPU).
*/
#include "emu_internal.h"
#include "include/mma.h"

#include <string>

enum {
    TILE = 16,                       // every fragment here is 16 x 16 (m = n = k = 16)
    TILE_ELEMENTS = TILE * TILE,
    POINTER_ALIGNMENT = 32,          // bytes: CUDA requires 256-bit aligned tile pointers
    LDM_BYTES = 16,                  // ldm is a multiple of 16 bytes: 8 bf16 or half, 4 float
};
static const unsigned FULL_WARP = 0xffffffffu;

// slot -> element: (slot * mul + add) mod 256, per use; odd multipliers make it a permutation
struct scramble { int mul, add; };
static const scramble SCRAMBLE[] = {
    {37, 11},    // EMU_WMMA_MATRIX_A
    {83, 29},    // EMU_WMMA_MATRIX_B
    {157, 71},   // EMU_WMMA_ACCUMULATOR
};

static inline int element_of_slot(emu_wmma_use use, int slot) {
    return (slot * SCRAMBLE[use].mul + SCRAMBLE[use].add) & (TILE_ELEMENTS - 1);
}

static inline int per_lane(const emu_wmma_fragment_ref& f) {
    return f.element == EMU_WMMA_HALF && f.use != EMU_WMMA_ACCUMULATOR ? EMU_WMMA_PER_LANE_HALF_AB : EMU_WMMA_PER_LANE;
}

static inline size_t element_bytes(emu_wmma_element e) {
    return e == EMU_WMMA_FLOAT ? sizeof(float) : sizeof(__nv_bfloat16);
}

// one lane's call, posted to the collective as a pointer
struct wmma_call {
    emu_wmma_fragment_ref frag;      // load: the destination; store: the source; mma: d
    emu_wmma_fragment_ref a, b, c;   // mma only
    const void* memory;              // load and store: where the tile's element (0, 0) is
    unsigned ldm;                    // elements between rows (row major) or columns (column major)
    int mem_layout;                  // a wmma::layout_t
    const char* file;
    int line;
};

// ----------------------------------------------------------------------------
// errors (out of line: the paths every call takes stay small)

static const char* call_name(emu_collective op) {
    switch (op) {
        case EMU_WMMA_LOAD: return "wmma::load_matrix_sync";
        case EMU_WMMA_STORE: return "wmma::store_matrix_sync";
        default: return "wmma::mma_sync";
    }
}

static std::string call_site(emu_collective op, const wmma_call& call) {
    return std::string(call_name(op)) + " at " + call.file + ":" + std::to_string(call.line);
}

static std::string describe_fragment(const emu_wmma_fragment_ref& f) {
    static const char* USES[] = {"matrix_a", "matrix_b", "accumulator"};
    static const char* ELEMENTS[] = {"__nv_bfloat16", "__half", "float"};
    std::string s = std::string(USES[f.use]) + " " + ELEMENTS[f.element];
    if (f.use != EMU_WMMA_ACCUMULATOR) { s += f.col_major ? " col_major" : " row_major"; }
    return s;
}

static std::string describe_call(emu_collective op, const wmma_call& call) {
    if (op == EMU_WMMA_MMA) {
        return "d " + describe_fragment(call.frag) + ", a " + describe_fragment(call.a) + ", b " +
               describe_fragment(call.b) + ", c " + describe_fragment(call.c);
    }
    char where[64];
    snprintf(where, sizeof where, "pointer %p, ldm %u, ", call.memory, call.ldm);
    return where + std::string(call.mem_layout == nvcuda::wmma::mem_col_major ? "mem_col_major" : "mem_row_major") +
           ", " + describe_fragment(call.frag);
}

[[noreturn]] __attribute__((noinline, cold)) static void fail_arguments(emu_collective op, const wmma_call& call) {
    const emu_wmma_fragment_ref& f = call.frag;
    std::string site = call_site(op, call);
    if (call.memory == nullptr) { emu_kernel_fail(site + ": the tile pointer is null"); }
    if ((uintptr_t)call.memory % POINTER_ALIGNMENT != 0) {
        char detail[256];
        snprintf(detail, sizeof detail,
                 ": pointer %p is not %d-byte aligned (it is %d bytes past a multiple): CUDA requires a wmma tile "
                 "pointer aligned to 256 bits; align the array (__align__(%d) on a __shared__ one) and start tiles "
                 "at multiples of %d bytes",
                 call.memory, (int)POINTER_ALIGNMENT, (int)((uintptr_t)call.memory % POINTER_ALIGNMENT),
                 (int)POINTER_ALIGNMENT, (int)POINTER_ALIGNMENT);
        emu_kernel_fail(site + detail);
    }
    unsigned multiple = (unsigned)(LDM_BYTES / element_bytes(f.element));
    if (call.ldm % multiple != 0) {
        emu_kernel_fail(site + ": ldm = " + std::to_string(call.ldm) + " is not a multiple of " +
                        std::to_string(multiple) + ": CUDA requires the leading dimension of a " +
                        (f.element == EMU_WMMA_FLOAT ? "float" : "16-bit (bf16, half)") + " tile to be a multiple of " +
                        std::to_string(multiple) + " elements (16 bytes); pad the matrix's rows (or columns) to one");
    }
    emu_kernel_fail(site + ": layout " + std::to_string(call.mem_layout) +
                    " is neither wmma::mem_row_major nor wmma::mem_col_major");
}

[[noreturn]] __attribute__((noinline, cold)) static void fail_partial_warp(emu_collective op, const wmma_call& call,
                                                                          unsigned lanes) {
    unsigned block_threads = blockDim.x * blockDim.y * blockDim.z;
    emu_kernel_fail(call_site(op, call) + ": the warp has only " + std::to_string(__builtin_popcount(lanes)) +
                    " threads (a block of " + std::to_string(block_threads) +
                    "): wmma needs all 32 lanes of a warp; make the block a multiple of 32 threads");
}

[[noreturn]] __attribute__((noinline, cold)) static void fail_disagree(emu_collective op, const wmma_call& first,
                                                                      const wmma_call& other, int lane) {
    emu_kernel_fail(call_site(op, first) + ": lane " + std::to_string(lane) + " passes " + describe_call(op, other) +
                    ", lane 0 passes " + describe_call(op, first) +
                    ": every lane of the warp must pass the same tile and fragments (the warp " +
                    (op == EMU_WMMA_MMA ? "multiplies" : op == EMU_WMMA_LOAD ? "loads" : "stores") + " one tile together)");
}

// ----------------------------------------------------------------------------
// the work, for the whole warp (calls[l]: lane l's call)

static bool same_fragment_kind(const emu_wmma_fragment_ref& x, const emu_wmma_fragment_ref& y) {
    return x.use == y.use && x.element == y.element && x.col_major == y.col_major;
}

static bool same_arguments(emu_collective op, const wmma_call& x, const wmma_call& y) {
    if (!same_fragment_kind(x.frag, y.frag)) { return false; }
    if (op == EMU_WMMA_MMA) {
        return same_fragment_kind(x.a, y.a) && same_fragment_kind(x.b, y.b) && same_fragment_kind(x.c, y.c);
    }
    return x.memory == y.memory && x.ldm == y.ldm && x.mem_layout == y.mem_layout;
}

// offset in elements of tile element (row, col) in memory
static inline size_t memory_offset(int element, unsigned ldm, bool col_major) {
    size_t row = (size_t)(element / TILE), col = (size_t)(element % TILE);
    return col_major ? col * ldm + row : row * ldm + col;
}

// memory -> fragments (load) or fragments -> memory (store), every slot of every lane; Bits is
// an unsigned integer of the element's size (elements are copied as bits)
template <typename Bits>
static void copy_tile(const wmma_call* const calls[], bool to_memory) {
    const wmma_call& first = *calls[0];
    emu_wmma_use use = first.frag.use;
    int n = per_lane(first.frag);
    bool col_major = first.mem_layout == nvcuda::wmma::mem_col_major;
    Bits* memory = (Bits*)first.memory;
    for (int l = 0; l < EMU_WARP_SIZE; l++) {
        Bits* x = (Bits*)calls[l]->frag.x;
        for (int i = 0; i < n; i++) {
            Bits* at = memory + memory_offset(element_of_slot(use, l * n + i), first.ldm, col_major);
            if (to_memory) {
                *at = x[i];
            } else {
                x[i] = *at;
            }
        }
    }
}

static void copy_tile(const wmma_call* const calls[], bool to_memory) {
    if (calls[0]->frag.element == EMU_WMMA_FLOAT) {
        copy_tile<uint32_t>(calls, to_memory);
    } else {
        copy_tile<uint16_t>(calls, to_memory);
    }
}

static inline float to_float(emu_wmma_element element, const void* x, int i) {
    switch (element) {
        case EMU_WMMA_BF16: {
            uint16_t bits;
            memcpy(&bits, (const char*)x + i * sizeof(bits), sizeof bits);
            uint32_t wide = (uint32_t)bits << 16;  // bf16 is the top half of an fp32
            float f;
            memcpy(&f, &wide, sizeof f);
            return f;
        }
        case EMU_WMMA_HALF: return __half2float(((const __half*)x)[i]);
        default: return ((const float*)x)[i];
    }
}

// the tile held by one fragment of every lane (which: the call's member), in fp32, row major;
// each element from its first slot (half a and b hold each one twice)
static void gather_tile(const wmma_call* const calls[], emu_wmma_fragment_ref wmma_call::*which, float* tile) {
    const emu_wmma_fragment_ref& first = calls[0]->*which;
    int n = per_lane(first);
    for (int l = 0; l < TILE_ELEMENTS / n; l++) {  // the lanes of slots 0..255
        const void* x = (calls[l]->*which).x;
        for (int i = 0; i < n; i++) { tile[element_of_slot(first.use, l * n + i)] = to_float(first.element, x, i); }
    }
}

// d = a * b + c, each output summed in order k = 0..15 from c (see the top of this file)
static void multiply(const wmma_call* const calls[]) {
    float a[TILE_ELEMENTS], b[TILE_ELEMENTS], d[TILE_ELEMENTS];
    gather_tile(calls, &wmma_call::a, a);
    gather_tile(calls, &wmma_call::b, b);
    gather_tile(calls, &wmma_call::c, d);
    for (int m = 0; m < TILE; m++) {
        for (int k = 0; k < TILE; k++) {
            float a_mk = a[m * TILE + k];
            for (int n = 0; n < TILE; n++) { d[m * TILE + n] += a_mk * b[k * TILE + n]; }
        }
    }
    for (int s = 0; s < TILE_ELEMENTS; s++) {
        ((float*)calls[s / EMU_WMMA_PER_LANE]->frag.x)[s % EMU_WMMA_PER_LANE] = d[element_of_slot(EMU_WMMA_ACCUMULATOR, s)];
    }
}

void emu_wmma_complete(emu_collective op, const uint64_t posted[EMU_WARP_SIZE], unsigned lanes) {
    if (lanes != FULL_WARP) {
        fail_partial_warp(op, *(const wmma_call*)(uintptr_t)posted[__builtin_ctz(lanes)], lanes);
    }
    const wmma_call* calls[EMU_WARP_SIZE];
    for (int l = 0; l < EMU_WARP_SIZE; l++) {
        calls[l] = (const wmma_call*)(uintptr_t)posted[l];
        if (l > 0 && !same_arguments(op, *calls[0], *calls[l])) { fail_disagree(op, *calls[0], *calls[l], l); }
    }
    switch (op) {
        case EMU_WMMA_LOAD: copy_tile(calls, false); break;
        case EMU_WMMA_STORE: copy_tile(calls, true); break;
        default: multiply(calls); break;
    }
}

// ----------------------------------------------------------------------------
// the entry points (include/mma.h): each lane checks its arguments, then joins the collective

static void post(emu_collective op, const wmma_call& call) {
    emu_warp_collective(op, FULL_WARP, (uint64_t)(uintptr_t)&call, 0, EMU_WARP_SIZE, call.file, call.line);
}

static void check_tile_arguments(emu_collective op, const wmma_call& call) {
    bool known_layout = call.mem_layout == nvcuda::wmma::mem_row_major || call.mem_layout == nvcuda::wmma::mem_col_major;
    if (call.memory == nullptr || (uintptr_t)call.memory % POINTER_ALIGNMENT != 0 ||
        call.ldm % (LDM_BYTES / element_bytes(call.frag.element)) != 0 || !known_layout) {
        fail_arguments(op, call);
    }
}

void emu_wmma_load(emu_wmma_fragment_ref f, const void* p, unsigned ldm, int mem_layout, const char* file, int line) {
    wmma_call call{f, {}, {}, {}, p, ldm, mem_layout, file, line};
    check_tile_arguments(EMU_WMMA_LOAD, call);
    post(EMU_WMMA_LOAD, call);
}

void emu_wmma_store(void* p, emu_wmma_fragment_ref f, unsigned ldm, int mem_layout, const char* file, int line) {
    wmma_call call{f, {}, {}, {}, p, ldm, mem_layout, file, line};
    check_tile_arguments(EMU_WMMA_STORE, call);
    post(EMU_WMMA_STORE, call);
}

void emu_wmma_mma(emu_wmma_fragment_ref d, emu_wmma_fragment_ref a, emu_wmma_fragment_ref b, emu_wmma_fragment_ref c,
                  const char* file, int line) {
    wmma_call call{d, a, b, c, nullptr, 0, nvcuda::wmma::mem_row_major, file, line};
    post(EMU_WMMA_MMA, call);
}
