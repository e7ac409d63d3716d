/*
test_device.cu: the execution model, checked on small kernels whose answers are known in closed form:
shared-memory reductions with barriers (up to 1024 threads), every warp shuffle with every width,
votes, __syncwarp, atomics across blocks (integer, float, and a float add written with atomicCAS),
the rest of CUDA's atomics (atomicInc/atomicDec wrapping, atomicCAS on int, unsigned and unsigned
long long, atomicMax/atomicMin on every integer type, atomicAdd on double, bf16, __nv_bfloat162,
half and __half2, atomicExch), CUDA's min/max overloads for mixed types (result types and values),
the profiler calls (cudaProfilerStart/Stop, NVTX ranges), dynamic shared memory (also above 48 KiB
after opting in), early returns, 2D/3D indices, and __syncthreads_count. Ordinary CUDA: nvcc builds
it too (make emu-nvcc-check).
*/
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <string.h>
#include <algorithm>
#include <type_traits>
#include <vector>
#include "check.h"

static const unsigned FULL_MASK = 0xffffffffu;
static const int WARP = 32;

// ----------------------------------------------------------------------------
// kernels

// out[blockIdx.x] = sum of the block's slice of x, by a shared-memory tree (blockDim.x a power of 2)
__global__ void block_sum_kernel(float* out, const float* x) {
    extern __shared__ float partial[];
    int t = threadIdx.x;
    partial[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) { partial[t] += partial[t + stride]; }
        __syncthreads();
    }
    if (t == 0) { out[blockIdx.x] = partial[0]; }
}

// the same with a static __shared__ array and a warp-shuffle finish (blockDim.x == 256)
__global__ void block_sum_static_kernel(float* out, const float* x) {
    __shared__ float warp_sums[8];
    int t = threadIdx.x;
    float v = x[blockIdx.x * blockDim.x + t];
    for (int offset = 16; offset > 0; offset /= 2) { v += __shfl_down_sync(FULL_MASK, v, offset); }
    if (t % WARP == 0) { warp_sums[t / WARP] = v; }
    __syncthreads();
    if (t < WARP) {
        float w = t < 8 ? warp_sums[t] : 0.0f;
        for (int offset = 16; offset > 0; offset /= 2) { w += __shfl_xor_sync(FULL_MASK, w, offset); }
        if (t == 0) { out[blockIdx.x] = w; }
    }
}

enum shuffle_kind { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };

// out[t] = the shuffle of value (1000 + t) from the lane the kind, arg and width select
__global__ void shuffle_kernel(int* out, int kind, int arg, int width) {
    int v = 1000 + (int)threadIdx.x;
    int r = 0;
    switch (kind) {
        case SHFL_IDX: r = __shfl_sync(FULL_MASK, v, arg, width); break;
        case SHFL_UP: r = __shfl_up_sync(FULL_MASK, v, arg, width); break;
        case SHFL_DOWN: r = __shfl_down_sync(FULL_MASK, v, arg, width); break;
        case SHFL_XOR: r = __shfl_xor_sync(FULL_MASK, v, arg, width); break;
    }
    out[threadIdx.x] = r;
}

// votes over "lane is a multiple of 3" and "lane < 32", plus a __syncwarp between
__global__ void vote_kernel(unsigned* out) {
    int lane = threadIdx.x % WARP;
    unsigned ballot = __ballot_sync(FULL_MASK, lane % 3 == 0);
    __syncwarp();
    int any = __any_sync(FULL_MASK, lane == 7);
    int all = __all_sync(FULL_MASK, lane < 32);
    int none = __any_sync(FULL_MASK, lane > 40);
    if (threadIdx.x == 0) {
        out[0] = ballot;
        out[1] = any;
        out[2] = all;
        out[3] = none;
    }
}

// a float add built from atomicCAS, as code for older GPUs writes it
__device__ float atomic_add_by_cas(float* address, float v) {
    unsigned* bits = (unsigned*)address;
    unsigned old = *bits, assumed;
    do {
        assumed = old;
        old = atomicCAS(bits, assumed, __float_as_uint(v + __uint_as_float(assumed)));
    } while (assumed != old);
    return __uint_as_float(old);
}

__global__ void atomics_kernel(int* count, float* sum, float* sum_cas, int* max_index) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(count, 1);
    atomicAdd(sum, 0.5f);
    atomic_add_by_cas(sum_cas, 0.25f);
    atomicMax(max_index, i);
}

// the wrapping counters: every thread steps both once; old values are counted in histograms
static const unsigned WRAP_LIMIT = 4;       // atomicInc wraps after 4, atomicDec restarts at 4
static const unsigned DEC_START = 10;       // above the limit: the first atomicDec restarts at 4
__global__ void wrapping_counters_kernel(unsigned* inc, unsigned* dec, unsigned* inc_olds, unsigned* dec_olds) {
    unsigned old_inc = atomicInc(inc, WRAP_LIMIT);
    unsigned old_dec = atomicDec(dec, WRAP_LIMIT);
    atomicAdd(&inc_olds[old_inc <= DEC_START ? old_inc : DEC_START], 1u);
    atomicAdd(&dec_olds[old_dec <= DEC_START ? old_dec : DEC_START], 1u);
}

struct integer_atomics {
    int max_int, min_int, cas_max_int;
    unsigned max_unsigned, min_unsigned;
    long long max_ll, min_ll;
    unsigned long long max_ull, min_ull, claimed_by, exch_ull, exch_sum;
    int claims;
    float exch_float, exch_float_sum;
};

// thread i (of n) offers i - 500 (or i, unsigned) to every max/min; claims a slot with atomicCAS;
// exchanges its index into a slot and sums what it got back
__global__ void integer_atomics_kernel(integer_atomics* a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = i - 500;
    atomicMax(&a->max_int, v);
    atomicMin(&a->min_int, v);
    atomicMax(&a->max_unsigned, (unsigned)i);
    atomicMin(&a->min_unsigned, (unsigned)i + 3u);
    atomicMax(&a->max_ll, (long long)v * 1000000000LL);
    atomicMin(&a->min_ll, (long long)v * 1000000000LL);
    atomicMax(&a->max_ull, (unsigned long long)i << 40);
    atomicMin(&a->min_ull, ((unsigned long long)i << 40) + 7ull);
    // a max written with atomicCAS on int, negative values included
    int old = a->cas_max_int, assumed;
    do {
        assumed = old;
        old = atomicCAS(&a->cas_max_int, assumed, assumed > v ? assumed : v);
    } while (old != assumed);
    // only the first thread to arrive replaces 0 (unsigned long long CAS)
    if (atomicCAS(&a->claimed_by, 0ull, (unsigned long long)i + 1ull) == 0ull) { atomicAdd(&a->claims, 1); }
    unsigned long long got = atomicExch(&a->exch_ull, (unsigned long long)i);
    atomicAdd(&a->exch_sum, got);
    float got_f = atomicExch(&a->exch_float, (float)i);
    atomicAdd(&a->exch_float_sum, got_f);
}

// every thread adds its share to each floating-point type; the sums stay exact in 16 bits
__global__ void float_atomics_kernel(double* d, __nv_bfloat16* b, __nv_bfloat162* b2, __half* h, __half2* h2) {
    atomicAdd(d, 0.25);
    atomicAdd(b, __float2bfloat16(1.0f));
    atomicAdd(b2, __floats2bfloat162_rn(1.0f, 0.5f));
    atomicAdd(h, __float2half(1.0f));
    atomicAdd(h2, __floats2half2_rn(0.5f, 2.0f));
}

// CUDA's min/max for mixed argument types: the result types (checked at compile time) and values
__global__ void min_max_kernel(unsigned long long* u, long long* s, double* f) {
    int i = -1, neg = -5;
    unsigned five = 5u;
    long l = -5;
    unsigned long ul = 3ul;
    size_t small = 7, large = 9;
    long long ll = -5;
    unsigned long long ull = 3ull;
    static_assert(std::is_same<decltype(min(i, five)), unsigned int>::value, "min(int, unsigned) is unsigned");
    static_assert(std::is_same<decltype(max(five, i)), unsigned int>::value, "max(unsigned, int) is unsigned");
    static_assert(std::is_same<decltype(min(l, ul)), unsigned long>::value, "min(long, unsigned long)");
    static_assert(std::is_same<decltype(min(small, large)), unsigned long>::value, "min(size_t, size_t)");
    static_assert(std::is_same<decltype(max(ll, ull)), unsigned long long>::value, "max(long long, ull)");
    static_assert(std::is_same<decltype(min(l, l)), long>::value, "min(long, long)");
    static_assert(std::is_same<decltype(min(2.5f, 1.0)), double>::value, "min(float, double) is double");
    u[0] = min(i, five);     // -1 compares as 0xffffffff: 5
    u[1] = max(i, five);     // 0xffffffff
    u[2] = min(five, neg);   // 5
    u[3] = min(l, ul);       // 3
    u[4] = min(small, large);
    u[5] = max(ll, ull);     // (unsigned long long)-5
    s[0] = min(l, l - 1);
    s[1] = max(ll, ll * 2);
    s[2] = min(neg, 3);
    f[0] = min(2.5f, 1.0);
    f[1] = max(1.5, 2.5f);
    f[2] = max(-0.5f, -1.5f);
}

// threads past n return at once; no barrier follows, so that is allowed
__global__ void early_return_kernel(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    out[i] = 2.0f * i;
}

// out[linear index] = the flattened (block, thread) coordinates
__global__ void indices_kernel(int* out) {
    int tx = threadIdx.x, ty = threadIdx.y, tz = threadIdx.z;
    int threads_per_block = blockDim.x * blockDim.y * blockDim.z;
    int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int thread = tx + blockDim.x * (ty + blockDim.y * tz);
    out[block * threads_per_block + thread] = block * 10000 + thread;
}

// __syncthreads_count of "thread index is even"
__global__ void barrier_count_kernel(int* out) {
    int n = __syncthreads_count(threadIdx.x % 2 == 0);
    if (threadIdx.x == 0) { out[blockIdx.x] = n; }
}

// every thread writes, then reads its mirror across a barrier: needs the whole dynamic buffer
__global__ void big_shared_kernel(float* out, int n) {
    extern __shared__ float buffer[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) { buffer[i] = (float)i; }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) { out[i] = buffer[n - 1 - i]; }
}

// ----------------------------------------------------------------------------
// checks

static void test_block_sums() {
    const int blocks = 3;
    for (int threads : {32, 256, 1024}) {
        int n = blocks * threads;
        std::vector<float> x(n), out(blocks);
        for (int i = 0; i < n; i++) { x[i] = (float)(i % 7); }
        float *d_x, *d_out;
        CUDA_CHECK(cudaMalloc(&d_x, n * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&d_out, blocks * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(d_x, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        block_sum_kernel<<<blocks, threads, threads * sizeof(float)>>>(d_out, d_x);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaMemcpy(out.data(), d_out, blocks * sizeof(float), cudaMemcpyDeviceToHost));
        bool ok = true;
        for (int b = 0; b < blocks; b++) {
            float expect = 0.0f;
            for (int i = 0; i < threads; i++) { expect += x[b * threads + i]; }
            ok = ok && out[b] == expect;
        }
        char name[96];
        snprintf(name, sizeof name, "shared-memory tree reduction, %d threads per block", threads);
        check(ok, name, "block 0 sum %g", out[0]);
        CUDA_CHECK(cudaFree(d_x));
        CUDA_CHECK(cudaFree(d_out));
    }

    const int threads = 256;
    std::vector<float> x(blocks * threads), out(blocks);
    fill_uniform(x.data(), x.size(), 1);
    for (float& v : x) { v = roundf(v * 64.0f); }  // integers: every summation order is exact
    float *d_x, *d_out;
    CUDA_CHECK(cudaMalloc(&d_x, x.size() * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_out, blocks * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_x, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    block_sum_static_kernel<<<blocks, threads>>>(d_out, d_x);
    CUDA_CHECK(cudaMemcpy(out.data(), d_out, blocks * sizeof(float), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int b = 0; b < blocks; b++) {
        float expect = 0.0f;
        for (int i = 0; i < threads; i++) { expect += x[b * threads + i]; }
        ok = ok && out[b] == expect;
    }
    check(ok, "static __shared__ + __shfl_down/__shfl_xor reduction, 3 blocks");
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_out));
}

// what lane `lane` must receive, from the CUDA programming guide's definitions
static int expected_shuffle(int kind, int lane, int arg, int width) {
    int segment = lane / width * width;
    int src = lane;
    switch (kind) {
        case SHFL_IDX: src = segment + arg % width; break;
        case SHFL_UP: src = (lane - segment) - arg >= 0 ? lane - arg : lane; break;
        case SHFL_DOWN: src = (lane - segment) + arg < width ? lane + arg : lane; break;
        case SHFL_XOR: src = (lane ^ arg) < segment + width ? (lane ^ arg) : lane; break;
    }
    return 1000 + src;
}

static void test_shuffles() {
    const char* names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync"};
    int* d_out;
    CUDA_CHECK(cudaMalloc(&d_out, WARP * sizeof(int)));
    for (int kind = SHFL_IDX; kind <= SHFL_XOR; kind++) {
        for (int width : {32, 16, 8, 4}) {
            bool ok = true;
            char detail[128] = "";
            for (int arg : {0, 1, 3, 5, 17}) {
                shuffle_kernel<<<1, WARP>>>(d_out, kind, arg, width);
                int out[WARP];
                CUDA_CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
                for (int lane = 0; lane < WARP; lane++) {
                    int e = expected_shuffle(kind, lane, arg, width);
                    if (out[lane] != e && ok) {
                        ok = false;
                        snprintf(detail, sizeof detail, "arg %d lane %d got %d want %d", arg, lane, out[lane], e);
                    }
                }
            }
            char name[96];
            snprintf(name, sizeof name, "%s width %d", names[kind], width);
            check(ok, name, "%s", detail);
        }
    }
    CUDA_CHECK(cudaFree(d_out));
}

static void test_votes() {
    unsigned* d_out;
    CUDA_CHECK(cudaMalloc(&d_out, 4 * sizeof(unsigned)));
    vote_kernel<<<1, WARP>>>(d_out);
    unsigned out[4];
    CUDA_CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
    unsigned expect_ballot = 0;
    for (int lane = 0; lane < WARP; lane += 3) { expect_ballot |= 1u << lane; }
    check(out[0] == expect_ballot, "__ballot_sync", "got %08x want %08x", out[0], expect_ballot);
    check(out[1] == 1 && out[3] == 0, "__any_sync", "got %u and %u", out[1], out[3]);
    check(out[2] == 1, "__all_sync + __syncwarp", "got %u", out[2]);
    CUDA_CHECK(cudaFree(d_out));
}

static void test_atomics() {
    const int blocks = 7, threads = 96;
    int *d_count, *d_max;
    float *d_sum, *d_sum_cas;
    CUDA_CHECK(cudaMalloc(&d_count, sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_max, sizeof(int)));
    CUDA_CHECK(cudaMalloc(&d_sum, sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_sum_cas, sizeof(float)));
    CUDA_CHECK(cudaMemset(d_count, 0, sizeof(int)));
    CUDA_CHECK(cudaMemset(d_max, 0, sizeof(int)));
    CUDA_CHECK(cudaMemset(d_sum, 0, sizeof(float)));
    CUDA_CHECK(cudaMemset(d_sum_cas, 0, sizeof(float)));
    atomics_kernel<<<blocks, threads>>>(d_count, d_sum, d_sum_cas, d_max);
    int count, max_index;
    float sum, sum_cas;
    CUDA_CHECK(cudaMemcpy(&count, d_count, sizeof count, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&max_index, d_max, sizeof max_index, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&sum_cas, d_sum_cas, sizeof sum_cas, cudaMemcpyDeviceToHost));
    int n = blocks * threads;
    check(count == n, "atomicAdd(int) across blocks", "count %d want %d", count, n);
    check(sum == 0.5f * n, "atomicAdd(float) across blocks", "sum %g want %g", sum, 0.5f * n);
    check(sum_cas == 0.25f * n, "float add by atomicCAS across blocks", "sum %g want %g", sum_cas, 0.25f * n);
    check(max_index == n - 1, "atomicMax across blocks", "max %d want %d", max_index, n - 1);
    CUDA_CHECK(cudaFree(d_count));
    CUDA_CHECK(cudaFree(d_max));
    CUDA_CHECK(cudaFree(d_sum));
    CUDA_CHECK(cudaFree(d_sum_cas));
}

// what atomicInc/atomicDec must leave and return after n steps, by the CUDA programming guide's rules
static void simulate_wrapping(int n, unsigned* inc, unsigned* dec, std::vector<unsigned>& inc_olds,
                              std::vector<unsigned>& dec_olds) {
    for (int k = 0; k < n; k++) {
        inc_olds[*inc]++;
        dec_olds[*dec <= DEC_START ? *dec : DEC_START]++;
        *inc = *inc >= WRAP_LIMIT ? 0u : *inc + 1u;
        *dec = (*dec == 0u || *dec > WRAP_LIMIT) ? WRAP_LIMIT : *dec - 1u;
    }
}

static void test_more_atomics() {
    const int blocks = 7, threads = 96, n = blocks * threads;
    const int slots = DEC_START + 1;
    unsigned *d_counters, *d_olds;
    CUDA_CHECK(cudaMalloc(&d_counters, 2 * sizeof(unsigned)));
    CUDA_CHECK(cudaMalloc(&d_olds, 2 * slots * sizeof(unsigned)));
    unsigned start[2] = {0u, DEC_START};
    CUDA_CHECK(cudaMemcpy(d_counters, start, sizeof start, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_olds, 0, 2 * slots * sizeof(unsigned)));
    wrapping_counters_kernel<<<blocks, threads>>>(d_counters, d_counters + 1, d_olds, d_olds + slots);
    unsigned got[2];
    std::vector<unsigned> got_olds(2 * slots);
    CUDA_CHECK(cudaMemcpy(got, d_counters, sizeof got, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(got_olds.data(), d_olds, got_olds.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
    unsigned want_inc = 0u, want_dec = DEC_START;
    std::vector<unsigned> want_inc_olds(slots, 0u), want_dec_olds(slots, 0u);
    simulate_wrapping(n, &want_inc, &want_dec, want_inc_olds, want_dec_olds);
    bool inc_ok = got[0] == want_inc && std::equal(want_inc_olds.begin(), want_inc_olds.end(), got_olds.begin());
    bool dec_ok = got[1] == want_dec && std::equal(want_dec_olds.begin(), want_dec_olds.end(), got_olds.begin() + slots);
    check(inc_ok, "atomicInc wraps: old >= val ? 0 : old + 1", "final %u want %u; old 0 seen %u times, want %u",
          got[0], want_inc, got_olds[0], want_inc_olds[0]);
    check(dec_ok, "atomicDec wraps: (old == 0 || old > val) ? val : old - 1", "final %u want %u; old 10 seen %u times",
          got[1], want_dec, got_olds[slots + DEC_START]);
    CUDA_CHECK(cudaFree(d_counters));
    CUDA_CHECK(cudaFree(d_olds));

    integer_atomics start_a = {};
    start_a.max_int = start_a.cas_max_int = -1000000;
    start_a.min_int = 1000000;
    start_a.min_unsigned = 0xffffffffu;
    start_a.max_ll = -(1LL << 62);
    start_a.min_ll = 1LL << 62;
    start_a.min_ull = ~0ull;
    start_a.exch_ull = 123456ull;
    start_a.exch_float = 0.5f;
    integer_atomics* d_a;
    CUDA_CHECK(cudaMalloc(&d_a, sizeof(integer_atomics)));
    CUDA_CHECK(cudaMemcpy(d_a, &start_a, sizeof start_a, cudaMemcpyHostToDevice));
    integer_atomics_kernel<<<blocks, threads>>>(d_a);
    integer_atomics a;
    CUDA_CHECK(cudaMemcpy(&a, d_a, sizeof a, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_a));
    long long top = n - 1 - 500, bottom = -500;
    check(a.max_int == top && a.min_int == bottom, "atomicMax/atomicMin int (negative values)", "%d %d", a.max_int, a.min_int);
    check(a.max_unsigned == (unsigned)(n - 1) && a.min_unsigned == 3u, "atomicMax/atomicMin unsigned", "%u %u",
          a.max_unsigned, a.min_unsigned);
    check(a.max_ll == top * 1000000000LL && a.min_ll == bottom * 1000000000LL, "atomicMax/atomicMin long long",
          "%lld %lld", a.max_ll, a.min_ll);
    check(a.max_ull == ((unsigned long long)(n - 1) << 40) && a.min_ull == 7ull, "atomicMax/atomicMin unsigned long long",
          "%llx %llx", a.max_ull, a.min_ull);
    check(a.cas_max_int == top, "atomicCAS int: a max by compare-and-swap", "%d", a.cas_max_int);
    check(a.claims == 1 && a.claimed_by >= 1ull && a.claimed_by <= (unsigned long long)n,
          "atomicCAS unsigned long long: exactly one thread replaces 0", "%d claims, slot %llu", a.claims, a.claimed_by);
    // every value written is read back exactly once, by the next exchange or by the host
    unsigned long long indices = (unsigned long long)n * (n - 1) / 2;
    check(a.exch_sum + a.exch_ull == 123456ull + indices, "atomicExch unsigned long long: every value comes back once",
          "%llu + %llu", a.exch_sum, a.exch_ull);
    check(a.exch_float_sum + a.exch_float == 0.5f + (float)indices, "atomicExch float: every value comes back once",
          "%g + %g", a.exch_float_sum, a.exch_float);

    const int adders = 64;  // 64 bf16 ones and 32 halves are exact in 8 significant bits
    double* d_double;
    __nv_bfloat16* d_b;
    __nv_bfloat162* d_b2;
    __half* d_h;
    __half2* d_h2;
    CUDA_CHECK(cudaMalloc(&d_double, sizeof(double)));
    CUDA_CHECK(cudaMalloc(&d_b, sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&d_b2, sizeof(__nv_bfloat162)));
    CUDA_CHECK(cudaMalloc(&d_h, sizeof(__half)));
    CUDA_CHECK(cudaMalloc(&d_h2, sizeof(__half2)));
    CUDA_CHECK(cudaMemset(d_double, 0, sizeof(double)));
    CUDA_CHECK(cudaMemset(d_b, 0, sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMemset(d_b2, 0, sizeof(__nv_bfloat162)));
    CUDA_CHECK(cudaMemset(d_h, 0, sizeof(__half)));
    CUDA_CHECK(cudaMemset(d_h2, 0, sizeof(__half2)));
    float_atomics_kernel<<<2, adders / 2>>>(d_double, d_b, d_b2, d_h, d_h2);
    double sum_d;
    __nv_bfloat16 sum_b;
    __nv_bfloat162 sum_b2;
    __half sum_h;
    __half2 sum_h2;
    CUDA_CHECK(cudaMemcpy(&sum_d, d_double, sizeof sum_d, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&sum_b, d_b, sizeof sum_b, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&sum_b2, d_b2, sizeof sum_b2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&sum_h, d_h, sizeof sum_h, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&sum_h2, d_h2, sizeof sum_h2, cudaMemcpyDeviceToHost));
    check(sum_d == 0.25 * adders, "atomicAdd double", "%g", sum_d);
    check(__bfloat162float(sum_b) == (float)adders, "atomicAdd __nv_bfloat16", "%g", __bfloat162float(sum_b));
    float b2x = __bfloat162float(sum_b2.x), b2y = __bfloat162float(sum_b2.y);
    check(b2x == (float)adders && b2y == 0.5f * adders, "atomicAdd __nv_bfloat162 (each half)", "(%g, %g)", b2x, b2y);
    check(__half2float(sum_h) == (float)adders, "atomicAdd half", "%g", __half2float(sum_h));
    float h2x = __low2float(sum_h2), h2y = __high2float(sum_h2);
    check(h2x == 0.5f * adders && h2y == 2.0f * adders, "atomicAdd __half2 (each half)", "(%g, %g)", h2x, h2y);
    for (void* p : {(void*)d_double, (void*)d_b, (void*)d_b2, (void*)d_h, (void*)d_h2}) { CUDA_CHECK(cudaFree(p)); }
}

static void test_min_max() {
    unsigned long long* d_u;
    long long* d_s;
    double* d_f;
    CUDA_CHECK(cudaMalloc(&d_u, 6 * sizeof(unsigned long long)));
    CUDA_CHECK(cudaMalloc(&d_s, 3 * sizeof(long long)));
    CUDA_CHECK(cudaMalloc(&d_f, 3 * sizeof(double)));
    min_max_kernel<<<1, 1>>>(d_u, d_s, d_f);
    unsigned long long u[6];
    long long s[3];
    double f[3];
    CUDA_CHECK(cudaMemcpy(u, d_u, sizeof u, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(s, d_s, sizeof s, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(f, d_f, sizeof f, cudaMemcpyDeviceToHost));
    check(u[0] == 5u && u[1] == 0xffffffffu && u[2] == 5u, "min/max(int, unsigned) compare as unsigned",
          "%llu %llu %llu", u[0], u[1], u[2]);
    check(u[3] == 3u && u[4] == 7u && u[5] == (unsigned long long)-5LL, "min/max of long/size_t/long long mixes",
          "%llu %llu %llu", u[3], u[4], u[5]);
    check(s[0] == -6 && s[1] == -5 && s[2] == -5, "min/max(long, long), (long long, long long), (int, int)",
          "%lld %lld %lld", s[0], s[1], s[2]);
    check(f[0] == 1.0 && f[1] == 2.5 && f[2] == -0.5, "min/max(float, double) in double, (float, float)", "%g %g %g",
          f[0], f[1], f[2]);
    CUDA_CHECK(cudaFree(d_u));
    CUDA_CHECK(cudaFree(d_s));
    CUDA_CHECK(cudaFree(d_f));
}

// a profiled region as a trainer marks it: nothing to see without a profiler, nothing may break
static void test_profiler_calls() {
    cudaError_t started = cudaProfilerStart();
    nvtxRangePush("step");
    nvtxRangePushA("forward");
    nvtxMarkA("loss");
    nvtxRangePop();
    nvtxRangePop();
    cudaError_t stopped = cudaProfilerStop();
    check(started == cudaSuccess && stopped == cudaSuccess,
          "cudaProfilerStart/Stop succeed; nvtxRangePush/Pop and nvtxMarkA build and run", "%s %s",
          cudaGetErrorName(started), cudaGetErrorName(stopped));
}

static void test_early_return_and_indices() {
    const int n = 1000, threads = 128, blocks = (n + threads - 1) / threads;
    float* d_out;
    CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(float)));
    early_return_kernel<<<blocks, threads>>>(d_out, n);
    std::vector<float> out(n);
    CUDA_CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int i = 0; i < n; i++) { ok = ok && out[i] == 2.0f * i; }
    check(ok, "early return past the end of the data");
    CUDA_CHECK(cudaFree(d_out));

    dim3 grid(3, 2, 2), block(4, 3, 2);
    int total = 12 * 24;
    int* d_idx;
    CUDA_CHECK(cudaMalloc(&d_idx, total * sizeof(int)));
    indices_kernel<<<grid, block>>>(d_idx);
    std::vector<int> idx(total);
    CUDA_CHECK(cudaMemcpy(idx.data(), d_idx, total * sizeof(int), cudaMemcpyDeviceToHost));
    ok = true;
    for (int i = 0; i < total; i++) { ok = ok && idx[i] == (i / 24) * 10000 + i % 24; }
    check(ok, "threadIdx/blockIdx/blockDim/gridDim in 3D");
    CUDA_CHECK(cudaFree(d_idx));

    int* d_counts;
    CUDA_CHECK(cudaMalloc(&d_counts, 2 * sizeof(int)));
    barrier_count_kernel<<<2, 100>>>(d_counts);
    int counts[2];
    CUDA_CHECK(cudaMemcpy(counts, d_counts, sizeof counts, cudaMemcpyDeviceToHost));
    check(counts[0] == 50 && counts[1] == 50, "__syncthreads_count, 100 threads", "got %d %d", counts[0], counts[1]);
    CUDA_CHECK(cudaFree(d_counts));
}

static void test_dynamic_shared() {
    const int n = 20000;  // 80000 bytes: more than the 48 KiB a kernel gets without opting in
    size_t bytes = n * sizeof(float);
    float* d_out;
    CUDA_CHECK(cudaMalloc(&d_out, bytes));
    big_shared_kernel<<<1, 256, bytes>>>(d_out, n);
    cudaError_t without = cudaGetLastError();
    check(without != cudaSuccess, "80 KB of dynamic shared memory without opting in is a launch error",
          "got %s", cudaGetErrorName(without));
    CUDA_CHECK(cudaFuncSetAttribute(big_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    big_shared_kernel<<<1, 256, bytes>>>(d_out, n);
    CUDA_CHECK(cudaGetLastError());
    std::vector<float> out(n);
    CUDA_CHECK(cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int i = 0; i < n; i++) { ok = ok && out[i] == (float)(n - 1 - i); }
    check(ok, "80 KB of dynamic shared memory after cudaFuncSetAttribute");
    CUDA_CHECK(cudaFree(d_out));
}

int main() {
    test_block_sums();
    test_shuffles();
    test_votes();
    test_atomics();
    test_more_atomics();
    test_min_max();
    test_profiler_calls();
    test_early_return_and_indices();
    test_dynamic_shared();
    return check_summary();
}
