/*
cuda_emu.h: the device side of the emulated CUDA device, force-included (g++ -include) into every
.cu that dev/cuda_emu/rewrite.py has turned into host C++.

What it provides to kernels, in the order of this file:
  - the real CUDA headers (types and signatures of cudart, bf16, cuBLAS, cuBLASLt, NCCL), included
    first so that they see the host compiler's own definitions of the CUDA qualifiers;
  - the qualifiers (__global__, __device__, __shared__, ...) as host C++;
  - threadIdx, blockIdx, blockDim, gridDim, warpSize;
  - barriers (__syncthreads, __syncwarp), warp shuffles, votes, atomics (and the collectives that
    nvcuda::wmma is made of: include/mma.h, the emulator's <mma.h>);
  - device-only math, load/store and bf16 intrinsics that the headers give no host version of,
    and CUDA's min/max overloads;
  - emu_launch() and EMU_KERNEL(), the target of the rewritten kernel<<<...>>>(...) launches, for
    plain kernels and templates alike (template arguments written out or deduced).

Invariants:
  - the threads of a block are fibers on one OS thread (emu_kernel.cpp); exactly one runs at a time
    and it switches only inside the barrier, shuffle and vote calls, so every other device
    operation (atomics included) is indivisible;
  - blocks run one at a time, so a __shared__ variable (a function-local static to the host
    compiler) is one copy shared by the fibers of the running block;
  - a launch copies its arguments when it is enqueued, as CUDA does; the kernel runs when its
    stream's turn comes (see emu_stream.cpp and CUDA_EMU_STREAMS).
*/
#ifndef CUDA_EMU_H
#define CUDA_EMU_H

#include <cuda_runtime.h>
#include <cuda_profiler_api.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#ifndef NO_NCCL   // a program built without NCCL declares what it names of it itself (cuda/nccl.cuh)
#include <nccl.h>
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <algorithm>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#define CUDA_EMU 1

// ----------------------------------------------------------------------------
// qualifiers: kernels and device functions are ordinary host functions

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __managed__
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __launch_bounds__(...)
// a function-local static: one copy, shared by the fibers of the one block that runs at a time
#define __shared__ static

// ----------------------------------------------------------------------------
// thread indices: the running fiber's, and the running block's

enum { EMU_WARP_SIZE = 32, EMU_MAX_THREADS_PER_BLOCK = 1024 };

struct emu_thread;                                  // one fiber: see emu_kernel.cpp
extern emu_thread* emu_current_thread;              // the fiber that is running now
extern uint3 emu_block_idx, emu_block_dim, emu_grid_dim;
const uint3& emu_thread_idx(const emu_thread* t);

#define threadIdx (emu_thread_idx(emu_current_thread))
#define blockIdx (emu_block_idx)
#define blockDim (emu_block_dim)
#define gridDim (emu_grid_dim)
static const int warpSize = EMU_WARP_SIZE;

// ----------------------------------------------------------------------------
// barriers and warp collectives (emu_kernel.cpp); file:line name the call in error messages

enum emu_collective {
    EMU_SYNCTHREADS, EMU_SYNCWARP, EMU_SHFL_IDX, EMU_SHFL_UP, EMU_SHFL_DOWN, EMU_SHFL_XOR,
    EMU_BALLOT, EMU_ANY, EMU_ALL,
    // nvcuda::wmma (include/mma.h, emu_wmma.cpp): the same call site for all 32 lanes of the warp
    EMU_WMMA_LOAD, EMU_WMMA_STORE, EMU_WMMA_MMA,
    // PTX warp instructions (cuda/ptx.cuh, emu_ptx.cpp): the same call site for all 32 lanes
    EMU_PTX_MMA, EMU_PTX_LDMATRIX,
};
// block barrier; returns how many threads of the block passed a non-zero predicate
int emu_syncthreads(int predicate, const char* file, int line);
// warp collective over the lanes in mask: returns this lane's result (shuffled value or vote)
uint64_t emu_warp_collective(emu_collective op, unsigned mask, uint64_t value, int arg, int width,
                             const char* file, int line);
unsigned emu_active_mask();
// dynamic shared memory of the running launch; static __shared__ refill (see rewrite.py)
void* emu_dynamic_shared();
void emu_shared_touch(void* var, size_t bytes);
// the PTX instructions of cuda/ptx.cuh (emu_ptx.cpp); file:line: the caller's
void emu_ptx_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], const char* file,
                            int line);
void emu_ptx_ldmatrix(uint32_t* r, int num, bool trans, const void* row, const char* file, int line);
void emu_ptx_cp_async(void* dst, const void* src, int src_bytes, const char* name, const char* file, int line);
void emu_ptx_cp_async_commit(const char* file, int line);
void emu_ptx_cp_async_wait(int n, const char* file, int line);
// stop the program with a message that names the running kernel
[[noreturn]] void emu_device_trap(const char* what, const char* file, int line);

#define __syncthreads() ((void)emu_syncthreads(0, __FILE__, __LINE__))
#define __syncthreads_count(p) emu_syncthreads((p) != 0, __FILE__, __LINE__)
#define __syncthreads_and(p) (emu_syncthreads((p) != 0, __FILE__, __LINE__) == (int)(blockDim.x * blockDim.y * blockDim.z))
#define __syncthreads_or(p) (emu_syncthreads((p) != 0, __FILE__, __LINE__) != 0)
#define __syncwarp(...) emu_syncwarp(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_sync(...) emu_shfl(EMU_SHFL_IDX, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) emu_shfl(EMU_SHFL_UP, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) emu_shfl(EMU_SHFL_DOWN, __FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) emu_shfl(EMU_SHFL_XOR, __FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, p) ((unsigned)emu_warp_collective(EMU_BALLOT, mask, (p) != 0, 0, EMU_WARP_SIZE, __FILE__, __LINE__))
#define __any_sync(mask, p) ((int)emu_warp_collective(EMU_ANY, mask, (p) != 0, 0, EMU_WARP_SIZE, __FILE__, __LINE__))
#define __all_sync(mask, p) ((int)emu_warp_collective(EMU_ALL, mask, (p) != 0, 0, EMU_WARP_SIZE, __FILE__, __LINE__))
#define __activemask() emu_active_mask()
#define __trap() emu_device_trap("__trap()", __FILE__, __LINE__)

static inline void emu_syncwarp(const char* file, int line, unsigned mask = 0xffffffffu) {
    emu_warp_collective(EMU_SYNCWARP, mask, 0, 0, EMU_WARP_SIZE, file, line);
}

// any value of up to 8 bytes travels through a shuffle as its bytes
template <typename T>
static inline T emu_shfl(emu_collective op, const char* file, int line, unsigned mask, T var, int arg,
                         int width = EMU_WARP_SIZE) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "__shfl_*_sync: values of up to 8 bytes only");
    uint64_t bits = 0;
    memcpy(&bits, (const void*)&var, sizeof(T));
    bits = emu_warp_collective(op, mask, bits, arg, width, file, line);
    T out;
    memcpy((void*)&out, &bits, sizeof(T));
    return out;
}

static inline void __threadfence() {}
static inline void __threadfence_block() {}
static inline void __nanosleep(unsigned) {}
static inline long long clock64() { return 0; }

// ----------------------------------------------------------------------------
// atomics: indivisible already (see the invariants above); written with __atomic builtins and
// float/double/bf16 adds by compare-and-swap so that they stay right if blocks ever run in parallel

// the value's type follows the pointer's (atomicAdd(&counter_ull, 1) must not fail deduction)
template <typename T> struct emu_same { typedef T type; };
template <typename T> static inline T atomicAdd(T* p, typename emu_same<T>::type v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
template <typename T> static inline T atomicSub(T* p, typename emu_same<T>::type v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
template <typename T> static inline T atomicAnd(T* p, typename emu_same<T>::type v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }
template <typename T> static inline T atomicOr(T* p, typename emu_same<T>::type v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
template <typename T> static inline T atomicXor(T* p, typename emu_same<T>::type v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); }
template <typename T> static inline T atomicExch(T* p, typename emu_same<T>::type v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
template <typename T> static inline T atomicCAS(T* p, typename emu_same<T>::type expected, typename emu_same<T>::type desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return expected;  // the old value, whether or not the swap happened
}
template <typename T> static inline T atomicMax(T* p, typename emu_same<T>::type v) {
    T old = *p;
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
template <typename T> static inline T atomicMin(T* p, typename emu_same<T>::type v) {
    T old = *p;
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
// add on a type the hardware has no integer add for: compare-and-swap on its bits
template <typename T, typename Bits>
static inline T emu_atomic_add_by_cas(T* p, T v) {
    static_assert(sizeof(T) == sizeof(Bits), "bit type must match");
    Bits* bp = reinterpret_cast<Bits*>(p);
    Bits old_bits = __atomic_load_n(bp, __ATOMIC_RELAXED);
    for (;;) {
        T old, sum;
        memcpy((void*)&old, &old_bits, sizeof(T));
        sum = (T)(old + v);
        Bits sum_bits;
        memcpy(&sum_bits, (const void*)&sum, sizeof(T));
        if (__atomic_compare_exchange_n(bp, &old_bits, sum_bits, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            return old;
        }
    }
}
static inline float atomicExch(float* p, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    bits = __atomic_exchange_n(reinterpret_cast<uint32_t*>(p), bits, __ATOMIC_RELAXED);
    memcpy(&v, &bits, sizeof v);
    return v;
}
static inline float atomicAdd(float* p, float v) { return emu_atomic_add_by_cas<float, uint32_t>(p, v); }
static inline double atomicAdd(double* p, double v) { return emu_atomic_add_by_cas<double, uint64_t>(p, v); }
static inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
    return emu_atomic_add_by_cas<__nv_bfloat16, uint16_t>(p, v);
}
static inline __nv_bfloat162 atomicAdd(__nv_bfloat162* p, __nv_bfloat162 v) {
    return emu_atomic_add_by_cas<__nv_bfloat162, uint32_t>(p, v);  // each half added, rounded to bf16
}
static inline __half atomicAdd(__half* p, __half v) { return emu_atomic_add_by_cas<__half, uint16_t>(p, v); }
static inline __half2 atomicAdd(__half2* p, __half2 v) { return emu_atomic_add_by_cas<__half2, uint32_t>(p, v); }

// an unsigned counter that wraps, as the CUDA programming guide defines them (unsigned int only):
//   atomicInc: *p = (old >= val) ? 0 : old + 1          atomicDec: *p = (old == 0 || old > val) ? val : old - 1
static inline unsigned atomicInc(unsigned* p, unsigned val) {
    unsigned old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &old, old >= val ? 0u : old + 1u, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
static inline unsigned atomicDec(unsigned* p, unsigned val) {
    unsigned old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &old, (old == 0u || old > val) ? val : old - 1u, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {}
    return old;
}

// ----------------------------------------------------------------------------
// device-only math and intrinsics: host versions (the fast-math ones are exact here)

// (__expf, __logf, __sinf, __cosf, __tanhf, __powf: glibc's math.h declares them already)
static inline float __fdividef(float x, float y) { return x / y; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
static inline int __float_as_int(float x) { int i; memcpy(&i, &x, sizeof i); return i; }
static inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, sizeof i); return i; }
static inline float __int_as_float(int i) { float x; memcpy(&x, &i, sizeof x); return x; }
static inline float __uint_as_float(unsigned i) { float x; memcpy(&x, &i, sizeof x); return x; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) { r = (r << 1) | ((x >> i) & 1u); }
    return r;
}
// CUDA's min/max overloads (crt/math_functions.hpp), exactly that set, so that a call resolves as
// under nvcc, or is ambiguous as under nvcc (max(size_t, int) and min(long long, int) are: nvcc
// rejects them too). A signed/unsigned pair of one width compares as unsigned: min(-1, 5u) is 5u.
#define EMU_MIN_MAX(Result, A, B)                                                                       \
    static inline Result min(A a, B b) { return (Result)a < (Result)b ? (Result)a : (Result)b; }        \
    static inline Result max(A a, B b) { return (Result)a > (Result)b ? (Result)a : (Result)b; }
EMU_MIN_MAX(int, int, int)
EMU_MIN_MAX(unsigned int, unsigned int, unsigned int)
EMU_MIN_MAX(unsigned int, int, unsigned int)
EMU_MIN_MAX(unsigned int, unsigned int, int)
EMU_MIN_MAX(long, long, long)
EMU_MIN_MAX(unsigned long, unsigned long, unsigned long)
EMU_MIN_MAX(unsigned long, long, unsigned long)
EMU_MIN_MAX(unsigned long, unsigned long, long)
EMU_MIN_MAX(long long, long long, long long)
EMU_MIN_MAX(unsigned long long, unsigned long long, unsigned long long)
EMU_MIN_MAX(unsigned long long, long long, unsigned long long)
EMU_MIN_MAX(unsigned long long, unsigned long long, long long)
#undef EMU_MIN_MAX
// floating point: fminf/fmaxf semantics (a NaN operand yields the other); float with double is double
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline float min(float a, float b) { return fminf(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(float a, double b) { return fmax((double)a, b); }
static inline double min(float a, double b) { return fmin((double)a, b); }
static inline double max(double a, float b) { return fmax(a, (double)b); }
static inline double min(double a, float b) { return fmin(a, (double)b); }

// cache-hinted loads and stores are plain loads and stores
template <typename T> static inline T __ldg(const T* p) { return *p; }
template <typename T> static inline T __ldcs(const T* p) { return *p; }
template <typename T> static inline T __ldcg(const T* p) { return *p; }
template <typename T> static inline T __ldca(const T* p) { return *p; }
template <typename T> static inline T __ldlu(const T* p) { return *p; }
template <typename T> static inline T __ldcv(const T* p) { return *p; }
template <typename T> static inline void __stcs(T* p, T v) { *p = v; }
template <typename T> static inline void __stcg(T* p, T v) { *p = v; }
template <typename T> static inline void __stwb(T* p, T v) { *p = v; }
template <typename T> static inline void __stwt(T* p, T v) { *p = v; }

// bf16 functions that cuda_bf16.h defines for device code only: computed in fp32, rounded once
// to nearest-even, as the hardware does for a single bf16 operation
static inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
    return __float2bfloat16(fmaf(__bfloat162float(a), __bfloat162float(b), __bfloat162float(c)));
}
static inline __nv_bfloat16 hexp(__nv_bfloat16 a) { return __float2bfloat16(expf(__bfloat162float(a))); }
static inline __nv_bfloat16 hlog(__nv_bfloat16 a) { return __float2bfloat16(logf(__bfloat162float(a))); }
static inline __nv_bfloat16 hsqrt(__nv_bfloat16 a) { return __float2bfloat16(sqrtf(__bfloat162float(a))); }
static inline __nv_bfloat16 hrsqrt(__nv_bfloat16 a) { return __float2bfloat16(1.0f / sqrtf(__bfloat162float(a))); }
static inline __nv_bfloat16 htanh(__nv_bfloat16 a) { return __float2bfloat16(tanhf(__bfloat162float(a))); }

// ----------------------------------------------------------------------------
// kernel launch: the target of kernel<<<grid, block, smem, stream>>>(args) after rewrite.py

struct emu_launch_site {
    const char* kernel;   // the kernel expression as written, e.g. "layernorm_forward_kernel<float>"
    const char* file;     // where the launch is (the .cu, thanks to rewrite.py's #line)
    int line;
};
#define EMU_LAUNCH_SITE(name) (emu_launch_site{name, __FILE__, __LINE__})

struct emu_launch_config {
    dim3 grid, block;
    size_t dynamic_shared_bytes;
    cudaStream_t stream;
    emu_launch_config(dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = 0)
        : grid(g), block(b), dynamic_shared_bytes(smem), stream(s) {}
};

// checks the configuration (errors go to cudaGetLastError, as with a real launch) and enqueues
// the grid on its stream; body runs the kernel once for the fiber that calls it; kernel is the
// function's address, nullptr when its template arguments are deduced at the launch
void emu_enqueue_kernel(const emu_launch_site& site, const emu_launch_config& config, const void* kernel,
                        std::function<void()> body);

// the timeline (emu_timeline.cpp, CUDA_EMU_TIMELINE=h100|a100|h200|FILE): a model of the GPU's time
// beside the emulation. The program's profile (cuda/profile.cuh, llmc/profile.h) tells it what its
// ranges cost and which technique they serve; every call is a no-op when the timeline is off.
enum { EMU_TECHNIQUE_NONE, EMU_TECHNIQUE_OFFLOAD, EMU_TECHNIQUE_EXCHANGE, EMU_TECHNIQUE_OPTIMIZER_HOST, EMU_NUM_TECHNIQUES };
bool emu_timeline_on();
// the GPU modelled (h100, a100, h200 or the constants file's path); NULL when the timeline is off
const char* emu_timeline_gpu();
// a range of work on a stream starts (ending the one open there): its kernels share its FLOPs and
// bytes; tensor: its FLOPs run on the tensor cores (attention); stream_name names the stream's track
void emu_timeline_range(cudaStream_t stream, const char* stream_name, const char* name, double flops, double bytes,
                        int technique, int tensor);
void emu_timeline_range_end(cudaStream_t stream);
// the host's own work: bytes at the host's memory bandwidth, until the next host range or its end
void emu_timeline_host_range(const char* name, double bytes, int technique);
void emu_timeline_host_range_end();
// the step the reports cover: from begin to end on the host's modelled clock; end returns its seconds
void emu_timeline_step_begin();
double emu_timeline_step_end();
// the step's predicted time, tokens/s (tokens: this rank's in the step), busy and exposed times
void emu_timeline_print(FILE* f, double tokens);
// the same as the members of a JSON object: "timeline": {...}, (with the comma)
void emu_timeline_json(FILE* f, double tokens);
// the step's Chrome trace (ui.perfetto.dev), written to path
void emu_timeline_trace(const char* path);
// whether the device's work runs (CUDA_EMU_EXECUTE, default 1) or is only modelled (0): then whatever
// the program reads back from the device is zeros, and work of its own on values it never reads back
// (a weight initialization, a checksum of the weights) may be skipped
bool emu_device_executes();

// the C++ conveniences cuda_runtime.h declares for nvcc only
template <typename T>
cudaError_t cudaFuncSetAttribute(T* kernel, enum cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void*)kernel, attr, value);
}

// Which function a launch names. rewrite.py passes every kernel expression through EMU_KERNEL(k),
// which gives emu_launch two things:
//   - EMU_KERNEL_POINTER(k): the kernel's address when k names one function (a plain kernel, a
//     template with its arguments written out, kernel<float>, or a function pointer), else an
//     emu_deduced_kernel: k is a template whose arguments the launch's own arguments decide (or an
//     overloaded kernel), which has no address until it is called;
//   - a lambda that calls k with the stored arguments, so that C++ deduces the template arguments
//     from them as nvcc does from the launch's arguments.
// The pointer is found by overload resolution: the first lambda below exists only when k converts
// to one function pointer (substitution fails for a template name), else the second one is chosen.
struct emu_deduced_kernel {};
template <typename Tag, typename F> F* emu_single_function(F* f) { return f; }
struct emu_any_tag { emu_any_tag(int) {} };  // a worse match for 0 than int: the fallback
template <typename First, typename Fallback> struct emu_first_of : First, Fallback {
    using First::operator();
    using Fallback::operator();
};
template <typename First, typename Fallback> emu_first_of(First, Fallback) -> emu_first_of<First, Fallback>;

#define EMU_KERNEL_POINTER(...)                                                                              \
    (emu_first_of{[=](auto tag) -> decltype(emu_single_function<decltype(tag)>(__VA_ARGS__)) { return __VA_ARGS__; }, \
                  [](emu_any_tag) { return emu_deduced_kernel{}; }}(0))
#define EMU_KERNEL(...) EMU_KERNEL_POINTER(__VA_ARGS__), [=](auto&... emu_args) { __VA_ARGS__(emu_args...); }

// a kernel with an address: its arguments are copied now, converted to the parameter types, as a
// real launch does (with fewer arguments than parameters, the call supplies the defaults)
template <typename... Params, typename Call, typename... Args>
void emu_launch(const emu_launch_site& site, const emu_launch_config& config, void (*kernel)(Params...), Call call,
                Args&&... args) {
    if constexpr (sizeof...(Params) == sizeof...(Args)) {
        auto params = std::make_shared<std::tuple<typename std::decay<Params>::type...>>(std::forward<Args>(args)...);
        emu_enqueue_kernel(site, config, (const void*)kernel, [kernel, params]() { std::apply(kernel, *params); });
    } else {
        auto params = std::make_shared<std::tuple<typename std::decay<Args>::type...>>(std::forward<Args>(args)...);
        emu_enqueue_kernel(site, config, (const void*)kernel, [call, params]() { std::apply(call, *params); });
    }
}

// a template whose arguments are deduced (or an overloaded kernel): the arguments are stored as
// they were passed (decayed, as deduction sees them) and the call picks the function. It has no
// address before that, so cudaFuncSetAttribute's opt-in to more shared memory cannot be matched to
// it (emu_enqueue_kernel says so when the launch needs one).
template <typename Call, typename... Args>
void emu_launch(const emu_launch_site& site, const emu_launch_config& config, emu_deduced_kernel, Call call,
                Args&&... args) {
    auto params = std::make_shared<std::tuple<typename std::decay<Args>::type...>>(std::forward<Args>(args)...);
    emu_enqueue_kernel(site, config, nullptr, [call, params]() { std::apply(call, *params); });
}

#endif // CUDA_EMU_H
