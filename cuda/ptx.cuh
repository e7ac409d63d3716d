/*
ptx.cuh: the instructions fast kernels are made of, one wrapper each, with the element-to-lane
layout the PTX ISA documents for it (the ISA's sections are named at each wrapper). On the GPU
(sm_80 and newer) each is one inline-PTX instruction (built for an older GPU, a trap: ptx_refusal);
on the emulated device (dev/cuda_emu, emu_ptx.cpp) each is a warp collective (or, for cp.async, a
per-thread queue) with exactly that
mapping and the checks the hardware leaves undefined: all 32 lanes at one call site, alignment,
shared vs global memory, a cp.async destination read before its wait is NaN.

    uint32_t a[4], b[2];  float acc[4] = {0};
    ptx_ldmatrix<4, false>(a, A_row);        // a 16x16 bf16 A fragment from shared memory
    ptx_ldmatrix<2, false>(b, B_row);        // a 16x8 B fragment (B stored n-major: rows of K)
    ptx_mma_bf16_16816(acc, a, b, acc);      // acc (16x8 fp32) += A B
    ptx_cp_async_cg16(smem, gmem, 16);       // 16 bytes global -> shared, asynchronous
    ptx_cp_async_commit();  ptx_cp_async_wait<0>();  __syncthreads();

Names of the layouts (all of this warp's 32 lanes; lane = threadIdx.x % 32):
    g = lane / 4 (the "groupID"), t = lane % 4 (the "threadID_in_group").
Registers that hold two bf16 hold the lower-numbered element in their low 16 bits.
*/
#ifndef CUDA_PTX_CUH
#define CUDA_PTX_CUH

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>


// mma.sync with bf16 and cp.async need sm_80 (Ampere) or newer, ldmatrix sm_75. Built for an older
// GPU (a T4 is sm_75), every wrapper but ptx_exp2 traps instead, so that the rest of the program (the
// fp32 path) builds: the host never launches their kernels there (ptx_refusal)
#define PTX_MIN_MAJOR 8
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < PTX_MIN_MAJOR * 100
#define PTX_UNSUPPORTED 1
#endif

// NULL when the current GPU runs the instructions of this file, else why not (the caller names the
// flag that avoids them)
static const char* ptx_refusal(void) {
    static char why[160];
    static int asked_device = -1;  // the answer is kept for the device asked last (a rank has one)
    static const char* answer = NULL;
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) == cudaSuccess && device == asked_device) { return answer; }
    asked_device = device;
    answer = NULL;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        asked_device = -1;
        return "the GPU's compute capability is unknown";
    }
    if (major < PTX_MIN_MAJOR) {
        snprintf(why, sizeof(why), "this GPU is sm_%d%d, and mma.sync in bf16 and cp.async need sm_%d0 (Ampere) or newer",
                 major, minor, PTX_MIN_MAJOR);
        answer = why;
    }
    return answer;
}

// log2(e): exp(x) = exp2(x * log2(e)); kernels fold it into their scale once
#define PTX_LOG2E 1.4426950408889634f

// Under the emulator each wrapper names its caller's file:line (same-call-site checks and error
// messages): g++ evaluates __builtin_FILE()/__builtin_LINE() in a default argument where the
// function is called. nvcc's wrappers have no such arguments.
#ifdef CUDA_EMU
#define PTX_SITE , const char* file = __builtin_FILE(), int line = __builtin_LINE()
#define PTX_SITE_ONLY const char* file = __builtin_FILE(), int line = __builtin_LINE()
#else
#define PTX_SITE
#define PTX_SITE_ONLY
#endif

// two floats as a register of two bf16 (lo: the lower-numbered element), round to nearest
__device__ inline uint32_t ptx_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (low half), .y = hi
    uint32_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}

// ----------------------------------------------------------------------------
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA "Matrix Fragments for
// mma.m16n8k16 with floating point type"): d (16x8 fp32) = A (16x16 bf16) B (16x8 bf16) + c.
//   a[4] (a0..a7, two per register): a0,a1 (g, 2t+{0,1}), a2,a3 (g+8, 2t+{0,1}),
//                                    a4,a5 (g, 2t+8+{0,1}), a6,a7 (g+8, 2t+8+{0,1})
//   b[2] (b0..b3):                   b0,b1 (k = 2t+{0,1}, n = g), b2,b3 (k = 2t+8+{0,1}, n = g)
//   c[4], d[4]:                      c0,c1 (g, 2t+{0,1}), c2,c3 (g+8, 2t+{0,1})
// d may be c. Every lane of the warp, one call site.
__device__ inline void ptx_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4] PTX_SITE) {
#ifdef CUDA_EMU
    emu_ptx_mma_bf16_16816(d, a, b, c, file, line);
#elif defined(PTX_UNSUPPORTED)
    __trap();
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
#endif
}

// ----------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16 (PTX ISA "Warp-level matrix load
// instruction: ldmatrix"): NUM 8x8 matrices of 16-bit elements from shared memory. Lane 8j + i
// passes the address of row i of matrix j (16 bytes, 16-byte aligned; lanes past 8 NUM pass any
// valid address, unused). Register j of lane l holds matrix j's elements
//   (row g, columns 2t, 2t+1)                 without .trans: a row of the matrix, four lanes
//   (rows 2t, 2t+1, column g)                 with .trans: the transposed matrix's row
// so x4 on the four 8x8 quarters of a row-major 16x16 tile ([0..8)x[0..8), [8..16)x[0..8),
// [0..8)x[8..16), [8..16)x[8..16) in that order) is exactly mma's A fragment, and x2 on a tile
// stored with the k index contiguous (K rows for Q K^T) is mma's B fragment; .trans gives B from a
// tile stored with n contiguous (V rows for P V).
template <int NUM, bool TRANS>
__device__ inline void ptx_ldmatrix(uint32_t r[NUM], const void* row PTX_SITE) {
    static_assert(NUM == 1 || NUM == 2 || NUM == 4, "ldmatrix loads 1, 2 or 4 matrices");
#ifdef CUDA_EMU
    emu_ptx_ldmatrix(r, NUM, TRANS, row, file, line);
#elif defined(PTX_UNSUPPORTED)
    __trap();
#else
    unsigned p = (unsigned)__cvta_generic_to_shared(row);
    if constexpr (NUM == 1 && !TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(p));
    } else if constexpr (NUM == 1) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(p));
    } else if constexpr (NUM == 2 && !TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(p));
    } else if constexpr (NUM == 2) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(p));
    } else if constexpr (!TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(p));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(p));
    }
#endif
}


// ----------------------------------------------------------------------------
// cp.async.{cg,ca}.shared.global [dst], [src], 16, src_bytes (PTX ISA "cp.async"): one thread
// copies 16 bytes from global to shared memory without holding registers, asynchronously; the
// first src_bytes (0..16) come from src, the rest are zeros (src_bytes = 0: a row past the end,
// read as zeros, src not dereferenced). Both addresses 16-byte aligned. .cg caches in L2 only
// (streamed tiles), .ca in L1 too. The copy is complete, and dst may be read, only after this
// thread's cp.async.wait_group that covers its group; other threads see it after a barrier too.
__device__ inline void ptx_cp_async_cg16(void* dst, const void* src, int src_bytes PTX_SITE) {
#ifdef CUDA_EMU
    emu_ptx_cp_async(dst, src, src_bytes, "cp.async.cg", file, line);
#elif defined(PTX_UNSUPPORTED)
    __trap();
#else
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes));
#endif
}

__device__ inline void ptx_cp_async_ca16(void* dst, const void* src, int src_bytes PTX_SITE) {
#ifdef CUDA_EMU
    emu_ptx_cp_async(dst, src, src_bytes, "cp.async.ca", file, line);
#elif defined(PTX_UNSUPPORTED)
    __trap();
#else
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes));
#endif
}

// cp.async.commit_group: this thread's cp.async issued since its last commit become one group
__device__ inline void ptx_cp_async_commit(PTX_SITE_ONLY) {
#ifdef CUDA_EMU
    emu_ptx_cp_async_commit(file, line);
#elif defined(PTX_UNSUPPORTED)
    __trap();
#else
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// cp.async.wait_group N: wait until at most N of this thread's committed groups (the newest) are
// still in flight; N = 0 waits for all. Then __syncthreads before other threads read the data.
template <int N>
__device__ inline void ptx_cp_async_wait(PTX_SITE_ONLY) {
#ifdef CUDA_EMU
    emu_ptx_cp_async_wait(N, file, line);
#elif defined(PTX_UNSUPPORTED)
    __trap();
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ----------------------------------------------------------------------------
// ex2.approx.ftz.f32: 2^x, approximate (the ISA bounds its error to a few ulp; denormal
// results flushed to zero), one instruction where expf is about ten. Softmax kernels compute exp(s * scale - m) as
// exp2(s * (scale * PTX_LOG2E) - m') with m' in the same units: one multiply-add and one ex2.
// The emulator calls exp2f (its error is below the tests' tolerances either way).
__device__ inline float ptx_exp2(float x) {
#ifdef CUDA_EMU
    return exp2f(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

#undef PTX_SITE
#undef PTX_SITE_ONLY
#endif // CUDA_PTX_CUH
