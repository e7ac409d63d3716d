/*
common.cuh: what every CUDA kernel file of the backend shares: error checks that stop with the
failing call, the error's name, a hint and file:line; ceil_div; warp reductions; the storage type
conversions; and Packed128, the 16-byte vector that kernels load and store memory with.

    CUDA_CHECK(cudaMalloc(&p, bytes));        // "error: cudaMalloc(&p, bytes) failed: cudaErrorMemoryAllocation (...)"
    my_kernel<floatX><<<grid, block, 0, stream>>>(...);
    CUDA_CHECK_LAUNCH();                      // a bad launch configuration stops here, not later
    float s = warp_reduce_sum(x);             // every lane gets the sum of the warp's 32 values

Conventions of the kernels in cuda/ (each file repeats what applies to it):
- floatX is the storage type of activations and working weights: float or __nv_bfloat16.
  Every sum, product and reduction is computed in fp32 (global norms in double); a bf16 result is
  rounded once, to nearest-even, when it is stored (from_float).
- Parameter gradients are fp32 (float*) and accumulated (+=) in a fixed order: no float atomics,
  so two runs give bitwise the same gradients. Where many threads contribute to one value, each
  block writes a partial sum into a caller-provided scratch and a second kernel adds the partial
  sums in block order.
- Launchers are `template <typename floatX> void NAME_cuda(...)`, mirroring NAME of cpu/layers.h
  (argument order, shapes and the = / += contract), with a scratch pointer where one is needed
  and the stream last. Launches name their template arguments (`k<floatX><<<...>>>`): the
  emulated device (dev/cuda_emu) cannot deduce them.
- Rows whose length is not a multiple of the vector width, or whose pointers are not 16-byte
  aligned, are handled element by element (load_pack / store_pack below); nothing is required
  of C, T or V beyond what each launcher's comment says.

Failure: CUDA_CHECK, CUDA_CHECK_LAUNCH and CUBLAS_CHECK print the call, the error's name and text,
a hint and file:line, then exit (fail_at of llmc/utils.h). The test harness of the emulated
device (dev/cuda_emu/tests/check.h) has its own CUDA_CHECK: include it before this file, and
this file's definition replaces it.
*/
#ifndef CUDA_COMMON_CUH
#define CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "../llmc/utils.h"

// ----------------------------------------------------------------------------
// error checks

// what to try when a CUDA call fails with e
static const char* cuda_error_hint(cudaError_t e) {
    switch (e) {
        case cudaErrorMemoryAllocation:
            return "the GPU is out of memory: try a smaller batch or model; --plan prints what these flags need";
        case cudaErrorNoDevice:
        case cudaErrorInsufficientDriver:
            return "no usable GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES";
        case cudaErrorInvalidConfiguration:
        case cudaErrorInvalidValue:
            return "a launch configuration or argument is out of range (grid, block, shared memory, sizes)";
        case cudaErrorIllegalAddress:
        case cudaErrorLaunchFailure:
            return "a kernel read or wrote out of bounds: run under compute-sanitizer to find which";
        default:
            return "run with CUDA_LAUNCH_BLOCKING=1 (or under compute-sanitizer) to find the kernel that failed";
    }
}

static void cuda_check_fail_at(cudaError_t e, const char* call, const char* file, int line) {
    if (e != cudaSuccess) {
        fail_at(file, line, "%s failed: %s (%s)\n  hint: %s", call, cudaGetErrorName(e), cudaGetErrorString(e),
                cuda_error_hint(e));
    }
}

static void cublas_check_fail_at(cublasStatus_t s, const char* call, const char* file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        const char* hint = s == CUBLAS_STATUS_NOT_SUPPORTED
                               ? "no cuBLASLt algorithm for these types, shapes, alignments and epilogue"
                           : s == CUBLAS_STATUS_INVALID_VALUE
                               ? "a shape, leading dimension or epilogue pointer does not fit the descriptor"
                               : "check the cuBLAS(Lt) arguments and that the GPU is healthy";
        fail_at(file, line, "%s failed: %s (%s)\n  hint: %s", call, cublasGetStatusName(s),
                cublasGetStatusString(s), hint);
    }
}

#undef CUDA_CHECK  // replaces dev/cuda_emu/tests/check.h's, when a test included it first
#define CUDA_CHECK(call) cuda_check_fail_at((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) cublas_check_fail_at((call), #call, __FILE__, __LINE__)
// after a kernel launch: a bad configuration stops here, naming the launcher's line
#define CUDA_CHECK_LAUNCH() cuda_check_fail_at(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// ----------------------------------------------------------------------------
// sizes

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu

template <typename T>
__host__ __device__ inline T ceil_div(T a, T b) { return (a + b - 1) / b; }

// true when p is 16-byte aligned (so that Packed128 loads and stores may use it)
static inline bool is_aligned16(const void* p) { return ((uintptr_t)p % 16) == 0; }

// ----------------------------------------------------------------------------
// warp reductions: every lane returns the result over the 32 lanes (butterfly, fixed order)

__device__ inline float warp_reduce_sum(float x) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) { x += __shfl_xor_sync(FULL_MASK, x, offset); }
    return x;
}

__device__ inline float warp_reduce_max(float x) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) { x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, offset)); }
    return x;
}

__device__ inline double warp_reduce_sum(double x) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) { x += __shfl_xor_sync(FULL_MASK, x, offset); }
    return x;
}

// the online softmax: (m, s) is a part's max and sum of exp(x - max), an empty part (-INFINITY, 0)
__device__ inline void softmax_add(float& m, float& s, float x) {
    if (x > m) {
        s = s * expf(m - x) + 1.0f;  // exp(-inf) = 0 when the part was empty
        m = x;
    } else {
        s += expf(x - m);
    }
}

// (m, s) <- the union of the parts (m, s) and (m2, s2)
__device__ inline void softmax_merge(float& m, float& s, float m2, float s2) {
    float mn = fmaxf(m, m2);
    if (mn == -INFINITY) { return; }  // both empty
    s = (m == -INFINITY ? 0.0f : s * expf(m - mn)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mn));
    m = mn;
}

// softmax_merge over the 32 lanes (butterfly, fixed order): every lane gets the warp's (m, s)
__device__ inline void warp_softmax_merge(float& m, float& s) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) {
        float m2 = __shfl_xor_sync(FULL_MASK, m, offset), s2 = __shfl_xor_sync(FULL_MASK, s, offset);
        softmax_merge(m, s, m2, s2);
    }
}

// ----------------------------------------------------------------------------
// storage type conversions: to fp32 for math, back with round-to-nearest-even

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __host__ __device__ inline T from_float(float x);
template <> __host__ __device__ inline float from_float<float>(float x) { return x; }
template <> __host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// ----------------------------------------------------------------------------
// Packed128: 16 bytes of T (4 floats or 8 bf16) moved by one vector instruction

template <typename T>
struct alignas(16) Packed128 {
    static constexpr int size = (int)(sizeof(int4) / sizeof(T));
    T payload[size];

    __device__ static Packed128 zeros() {
        Packed128 p;
        for (int k = 0; k < size; k++) { p.payload[k] = from_float<T>(0.0f); }
        return p;
    }
    __device__ T& operator[](int k) { return payload[k]; }
    __device__ const T& operator[](int k) const { return payload[k]; }
};

// one 16-byte load (p 16-byte aligned), through the cache
template <typename T>
__device__ inline Packed128<T> load128(const T* p) {
    int4 bits = *reinterpret_cast<const int4*>(p);
    Packed128<T> out;
    memcpy(&out, &bits, sizeof(bits));
    return out;
}

// one 16-byte load that streams past the cache (data read once)
template <typename T>
__device__ inline Packed128<T> load128cs(const T* p) {
    int4 bits = __ldcs(reinterpret_cast<const int4*>(p));
    Packed128<T> out;
    memcpy(&out, &bits, sizeof(bits));
    return out;
}

template <typename T>
__device__ inline void store128(T* p, const Packed128<T>& v) {
    int4 bits;
    memcpy(&bits, &v, sizeof(bits));
    *reinterpret_cast<int4*>(p) = bits;
}

// elements [i, i + size) of x (n): one vector load when `vector` (x 16-byte aligned; i is a multiple
// of Packed128<T>::size) and the pack is whole, else element by element, with zeros past n
template <typename T>
__device__ inline Packed128<T> load_pack(const T* x, size_t i, size_t n, bool vector) {
    const int size = Packed128<T>::size;
    if (vector && i + size <= n) { return load128(x + i); }
    Packed128<T> p = Packed128<T>::zeros();
    for (int k = 0; k < size && i + k < n; k++) { p[k] = x[i + k]; }
    return p;
}

// stores the elements of p that fall in [i, n): the counterpart of load_pack
template <typename T>
__device__ inline void store_pack(T* x, size_t i, size_t n, bool vector, const Packed128<T>& p) {
    const int size = Packed128<T>::size;
    if (vector && i + size <= n) {
        store128(x + i, p);
        return;
    }
    for (int k = 0; k < size && i + k < n; k++) { x[i + k] = p[k]; }
}

// ----------------------------------------------------------------------------
// the second pass of a deterministic column sum: out (n) += sum over p of partials (parts, stride)[p, :n].
// The parts of a column are cut into PARTIAL_SUMS_SPLITS strided runs (run s: parts s, s + SPLITS,
// ... in increasing order), one thread each, and the runs' sums are added in a fixed binary tree
// in shared memory (s with s + 8, then s + 4, ...), so the result depends on `parts` alone. A block
// takes `cols` consecutive columns (a warp reads 32 / cols parts' rows of cols floats); the
// launcher narrows cols until the blocks fill the GPU's SMs: that changes where a sum runs, not
// its order. bytes: parts*n + 2n fp32; FLOPs: parts*n adds

#define PARTIAL_SUMS_SPLITS 16     // runs per column: the shape of the tree (fixed: the order of the sums)
#define PARTIAL_SUMS_MAX_COLS 32   // columns per block at most (a warp reads 128 contiguous bytes)
#define PARTIAL_SUMS_MIN_COLS 4    // at least (a warp reads 16-byte pieces of 8 parts)
#define PARTIAL_SUMS_BLOCKS_PER_SM 2

static __global__ void add_partial_sums_kernel(float* out, const float* partials, int parts, int n, size_t stride) {
    __shared__ float runs[PARTIAL_SUMS_SPLITS * PARTIAL_SUMS_MAX_COLS];  // (split, col)
    int cols = blockDim.x / PARTIAL_SUMS_SPLITS;
    int col = threadIdx.x % cols, split = threadIdx.x / cols;
    int i = blockIdx.x * cols + col;
    float s = 0.0f;
    for (int p = split; i < n && p < parts; p += PARTIAL_SUMS_SPLITS) { s += partials[(size_t)p * stride + i]; }
    runs[split * cols + col] = s;
    for (int half = PARTIAL_SUMS_SPLITS / 2; half > 0; half /= 2) {
        __syncthreads();
        if (split < half) { runs[split * cols + col] += runs[(split + half) * cols + col]; }
    }
    if (split == 0 && i < n) { out[i] += runs[col]; }
}

// the columns per block of add_partial_sums_kernel for n columns on a GPU of `sms` SMs: the widest
// (coalesced) tile whose blocks still fill PARTIAL_SUMS_BLOCKS_PER_SM per SM
static int partial_sums_cols(int n, int sms) {
    int cols = PARTIAL_SUMS_MAX_COLS;
    while (cols > PARTIAL_SUMS_MIN_COLS && ceil_div(n, cols) < PARTIAL_SUMS_BLOCKS_PER_SM * sms) { cols /= 2; }
    return cols;
}

// the SMs of the current GPU (asked once: every GPU of a run is the same kind)
static int device_sm_count(void) {
    static int sms = 0;
    if (sms == 0) {
        int device;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    }
    return sms;
}

static void add_partial_sums_cuda(float* out, const float* partials, int parts, int n, size_t stride,
                                  cudaStream_t stream) {
    if (n == 0) { return; }
    int cols = partial_sums_cols(n, device_sm_count());
    add_partial_sums_kernel<<<ceil_div(n, cols), cols * PARTIAL_SUMS_SPLITS, 0, stream>>>(out, partials, parts, n, stride);
    CUDA_CHECK_LAUNCH();
}

#endif // CUDA_COMMON_CUH
