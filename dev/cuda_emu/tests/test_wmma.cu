/*
test_wmma.cu: nvcuda::wmma (<mma.h>) with bf16 and half tiles and fp32 accumulators, against a
plain triple loop on the host. Ordinary CUDA: nvcc builds it too (make emu-nvcc-check) and
make gpu-check runs it on a GPU.

  - D (32 x 32) = scale * (A (32 x 64) B (64 x 32) + C), one warp per 16 x 16 tile of D, K = 64 as
    a chain of 4 mma_sync with d = c: every layout of a and b, the accumulator loaded and stored
    in both memory layouts, leading dimensions padded past the tile (ldm 40, 72, 36), from global
    memory and staged through static and dynamic shared memory; half for the four layouts; an
    elementwise scaling of the accumulator (x[i] *= scale over x[0..num_elements));
  - one mma_sync with d separate from c (c unchanged) and with c from fill_fragment;
  - the fragments' sizes (num_elements) and that a warp's bf16 a, b and accumulator fragments hold
    every element of their tile exactly once;
  - emulated only: the emulator's element-to-lane mapping is not the hardware's (code that assumes
    sm_80's accumulator layout, or copies an accumulator into an a fragment, gets wrong answers).

Results: the emulator sums each output in k order from c in fp32, as the reference does, so it must
agree exactly; a GPU's tensor cores add in their own order, so there the bound is 1e-5 relative.

With an argument, one misuse that must stop the emulated program with a message (run_tests.sh
checks it with expect_error; on a GPU these are undefined behaviour, never run):
  divergent-mma   half of the warp calls mma_sync, the other half goes on to store_matrix_sync
  split-mma       the two halves of the warp call mma_sync at two different lines
  lanes-disagree  the lanes pass two different tile pointers to one load_matrix_sync
  bad-ldm         ldm = 12 for a bf16 tile (not a multiple of 8)
  misaligned      a tile pointer 16 bytes past a 32-byte boundary
  partial-warp    a block of 48 threads: its second warp has 16 lanes
*/
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdio.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "check.h"

using namespace nvcuda;

static const int WARP = 32;
static const int TILE = 16;                     // wmma's m = n = k here
static const int M = 32, N = 32, K = 64;        // the GEMM: K is 4 mma_sync deep
static const int TILES_N = N / TILE;
static const int GEMM_THREADS = (M / TILE) * TILES_N * WARP;  // one warp per tile of D
// leading dimensions: each padded past the matrix (a multiple of 8 elements for 16-bit, 4 for float)
static const int PAD_16BIT = 8, PAD_FLOAT = 4;
static const int STAGE_LD = TILE + PAD_16BIT;   // a tile staged in shared memory, ldm 24
static const int STAGE_ELEMENTS = TILE * STAGE_LD;
static const int GEMM_WARPS = GEMM_THREADS / WARP;
#ifdef CUDA_EMU
static const float TOLERANCE = 0.0f;            // the emulator adds in the reference's order
#else
static const float TOLERANCE = 1e-5f;           // tensor cores add in their own order
#endif

// ----------------------------------------------------------------------------
// layouts: element (row, col) of a matrix stored row major or column major with leading dimension ld

template <typename Layout> struct is_col_major { static const bool value = false; };
template <> struct is_col_major<wmma::col_major> { static const bool value = true; };

__host__ __device__ static inline size_t index_in(bool col_major, int row, int col, int ld) {
    return col_major ? (size_t)col * ld + row : (size_t)row * ld + col;
}

// ----------------------------------------------------------------------------
// kernels

enum staging { FROM_GLOBAL, VIA_STATIC_SHARED, VIA_DYNAMIC_SHARED };

// copy the 16 x 16 tile at src (ld src_ld) to dst (ld STAGE_LD), both in one layout, by one warp
template <typename T>
__device__ void stage_tile(T* dst, const T* src, int src_ld, bool col_major) {
    for (int e = threadIdx.x % WARP; e < TILE * TILE; e += WARP) {
        int row = e / TILE, col = e % TILE;
        dst[index_in(col_major, row, col, STAGE_LD)] = src[index_in(col_major, row, col, src_ld)];
    }
    __syncwarp();  // the tile is the whole warp's before load_matrix_sync reads it
}

// d = scale * (a b + c): the warp w computes D's tile (w / TILES_N, w % TILES_N), a chain of k / 16
// mma_sync with d = c; a, b staged as `how` says; c and d in c_layout
template <typename T, typename ALayout, typename BLayout>
__global__ void gemm_kernel(float* d, const T* a, int lda, const T* b, int ldb, const float* c, int ldc,
                            wmma::layout_t c_layout, float scale, int k, staging how) {
    __shared__ __align__(32) T a_static[GEMM_WARPS][STAGE_ELEMENTS];
    __shared__ __align__(32) T b_static[GEMM_WARPS][STAGE_ELEMENTS];
    extern __shared__ __align__(32) unsigned char dynamic_stage[];  // GEMM_WARPS * 2 tiles of T
    const bool a_col = is_col_major<ALayout>::value, b_col = is_col_major<BLayout>::value;
    const bool c_col = c_layout == wmma::mem_col_major;
    int warp = threadIdx.x / WARP;
    int tile_m = warp / TILES_N * TILE, tile_n = warp % TILES_N * TILE;
    T* a_stage = a_static[warp];
    T* b_stage = b_static[warp];
    if (how == VIA_DYNAMIC_SHARED) {
        a_stage = (T*)dynamic_stage + (size_t)warp * 2 * STAGE_ELEMENTS;
        b_stage = a_stage + STAGE_ELEMENTS;
    }

    wmma::fragment<wmma::accumulator, TILE, TILE, TILE, float> acc;
    wmma::fragment<wmma::matrix_a, TILE, TILE, TILE, T, ALayout> fa;
    wmma::fragment<wmma::matrix_b, TILE, TILE, TILE, T, BLayout> fb;
    wmma::load_matrix_sync(acc, c + index_in(c_col, tile_m, tile_n, ldc), ldc, c_layout);
    for (int k0 = 0; k0 < k; k0 += TILE) {
        const T* a_tile = a + index_in(a_col, tile_m, k0, lda);
        const T* b_tile = b + index_in(b_col, k0, tile_n, ldb);
        if (how == FROM_GLOBAL) {
            wmma::load_matrix_sync(fa, a_tile, lda);
            wmma::load_matrix_sync(fb, b_tile, ldb);
        } else {
            stage_tile(a_stage, a_tile, lda, a_col);
            stage_tile(b_stage, b_tile, ldb, b_col);
            wmma::load_matrix_sync(fa, a_stage, STAGE_LD);
            wmma::load_matrix_sync(fb, b_stage, STAGE_LD);
            __syncwarp();  // every lane has loaded before the next tile overwrites the stage
        }
        wmma::mma_sync(acc, fa, fb, acc);
    }
    for (int i = 0; i < acc.num_elements; i++) { acc.x[i] *= scale; }
    wmma::store_matrix_sync(d + index_in(c_col, tile_m, tile_n, ldc), acc, ldc, c_layout);
}

// one 16 x 16 x 16 product into a fragment of its own: d_out = a b + c (c from memory, or 0 by
// fill_fragment when c is null), and c_out = the c fragment afterwards (row major, ld 16 all)
__global__ void separate_d_kernel(float* d_out, float* c_out, const __nv_bfloat16* a, const __nv_bfloat16* b,
                                  const float* c) {
    wmma::fragment<wmma::matrix_a, TILE, TILE, TILE, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, TILE, TILE, TILE, __nv_bfloat16, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, TILE, TILE, TILE, float> fc, fd;
    wmma::load_matrix_sync(fa, a, TILE);
    wmma::load_matrix_sync(fb, b, TILE);
    if (c != nullptr) {
        wmma::load_matrix_sync(fc, c, TILE, wmma::mem_row_major);
    } else {
        wmma::fill_fragment(fc, 0.0f);
    }
    wmma::mma_sync(fd, fa, fb, fc);
    wmma::store_matrix_sync(d_out, fd, TILE, wmma::mem_row_major);
    wmma::store_matrix_sync(c_out, fc, TILE, wmma::mem_row_major);
}

// each lane writes what its fragments hold (lane * num_elements + i): a and b loaded from a bf16
// tile, the accumulator from a float tile, both holding their element's index 0..255
__global__ void fragment_contents_kernel(float* a_held, float* b_held, float* acc_held, const __nv_bfloat16* index16,
                                         const float* index32) {
    wmma::fragment<wmma::matrix_a, TILE, TILE, TILE, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, TILE, TILE, TILE, __nv_bfloat16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, TILE, TILE, TILE, float> acc;
    wmma::load_matrix_sync(fa, index16, TILE);
    wmma::load_matrix_sync(fb, index16, TILE);
    wmma::load_matrix_sync(acc, index32, TILE, wmma::mem_row_major);
    int lane = threadIdx.x;
    for (int i = 0; i < fa.num_elements; i++) { a_held[lane * fa.num_elements + i] = __bfloat162float(fa.x[i]); }
    for (int i = 0; i < fb.num_elements; i++) { b_held[lane * fb.num_elements + i] = __bfloat162float(fb.x[i]); }
    for (int i = 0; i < acc.num_elements; i++) { acc_held[lane * acc.num_elements + i] = acc.x[i]; }
}

// wrong on purpose: the row sums of a 16 x 16 tile read out of an accumulator as if sm_80's mapping
// held (lane l has rows l/4 and l/4 + 8: x[0, 1, 4, 5] in the first, x[2, 3, 6, 7] in the second),
// finished by shuffles among the 4 lanes of a row; CUDA leaves the mapping unspecified
__global__ void assumed_layout_row_sums_kernel(float* row_sums, const float* tile) {
    wmma::fragment<wmma::accumulator, TILE, TILE, TILE, float> acc;
    wmma::load_matrix_sync(acc, tile, TILE, wmma::mem_row_major);
    float upper = acc.x[0] + acc.x[1] + acc.x[4] + acc.x[5];
    float lower = acc.x[2] + acc.x[3] + acc.x[6] + acc.x[7];
    for (int offset = 1; offset < 4; offset *= 2) {
        upper += __shfl_xor_sync(0xffffffffu, upper, offset);
        lower += __shfl_xor_sync(0xffffffffu, lower, offset);
    }
    int lane = threadIdx.x;
    if (lane % 4 == 0) {
        row_sums[lane / 4] = upper;
        row_sums[lane / 4 + TILE / 2] = lower;
    }
}

// wrong on purpose: P = a b in an accumulator, copied elementwise into an a fragment (as flash
// attention kernels written for one GPU's registers do), times the identity: d is P only if the
// accumulator and matrix_a fragments share their mapping, which CUDA does not promise
__global__ void accumulator_as_a_kernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b,
                                        const __nv_bfloat16* identity) {
    wmma::fragment<wmma::matrix_a, TILE, TILE, TILE, __nv_bfloat16, wmma::row_major> fa, fp;
    wmma::fragment<wmma::matrix_b, TILE, TILE, TILE, __nv_bfloat16, wmma::row_major> fb, fi;
    wmma::fragment<wmma::accumulator, TILE, TILE, TILE, float> acc;
    wmma::load_matrix_sync(fa, a, TILE);
    wmma::load_matrix_sync(fb, b, TILE);
    wmma::fill_fragment(acc, 0.0f);
    wmma::mma_sync(acc, fa, fb, acc);
    for (int i = 0; i < fp.num_elements; i++) { fp.x[i] = __float2bfloat16(acc.x[i]); }
    wmma::load_matrix_sync(fi, identity, TILE);
    wmma::fill_fragment(acc, 0.0f);
    wmma::mma_sync(acc, fp, fi, acc);
    wmma::store_matrix_sync(d, acc, TILE, wmma::mem_row_major);
}

// ----------------------------------------------------------------------------
// misuses (argument modes): each must stop the emulated program

// the first half of the warp multiplies, the second half does not: all then store
__global__ void divergent_mma_kernel(float* d, const __nv_bfloat16* a) {
    wmma::fragment<wmma::matrix_a, TILE, TILE, TILE, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, TILE, TILE, TILE, __nv_bfloat16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, TILE, TILE, TILE, float> acc;
    wmma::load_matrix_sync(fa, a, TILE);
    wmma::load_matrix_sync(fb, a, TILE);
    wmma::fill_fragment(acc, 0.0f);
    if (threadIdx.x < WARP / 2) { wmma::mma_sync(acc, fa, fb, acc); }
    wmma::store_matrix_sync(d, acc, TILE, wmma::mem_row_major);
}

// the two halves of the warp multiply at two different call sites
__global__ void split_mma_kernel(float* d, const __nv_bfloat16* a) {
    wmma::fragment<wmma::matrix_a, TILE, TILE, TILE, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, TILE, TILE, TILE, __nv_bfloat16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, TILE, TILE, TILE, float> acc;
    wmma::load_matrix_sync(fa, a, TILE);
    wmma::load_matrix_sync(fb, a, TILE);
    wmma::fill_fragment(acc, 0.0f);
    if (threadIdx.x < WARP / 2) {
        wmma::mma_sync(acc, fa, fb, acc);
    } else {
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(d, acc, TILE, wmma::mem_row_major);
}

// load_matrix_sync with per-lane arguments: offset_odd for odd lanes, ldm for all
__global__ void load_misuse_kernel(float* d, const __nv_bfloat16* a, int offset_odd, unsigned ldm) {
    wmma::fragment<wmma::matrix_a, TILE, TILE, TILE, __nv_bfloat16, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + (threadIdx.x % 2 == 1 ? offset_odd : 0), ldm);
    d[threadIdx.x] = __bfloat162float(fa.x[0]);
}

// ----------------------------------------------------------------------------
// host side

template <typename T> static T to_device_type(float x);
template <> __nv_bfloat16 to_device_type<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __half to_device_type<__half>(float x) { return __float2half(x); }
template <> float to_device_type<float>(float x) { return x; }
template <typename T> static float from_device_type(T x);
template <> float from_device_type<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> float from_device_type<__half>(__half x) { return __half2float(x); }

template <typename T> static const char* type_name();
template <> const char* type_name<__nv_bfloat16>() { return "bf16"; }
template <> const char* type_name<__half>() { return "half"; }
template <typename Layout> static const char* layout_name() { return is_col_major<Layout>::value ? "col_major" : "row_major"; }

template <typename T>
static T* upload(const std::vector<T>& h) {
    T* d;
    CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T>
static std::vector<T> download(const T* d, size_t n) {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

// a rows x cols matrix (row major, values rounded to T) stored in a layout with leading dimension
// ld; the padding holds `pad`
template <typename T>
static std::vector<T> store_matrix(const std::vector<float>& m, int rows, int cols, bool col_major, int ld, float pad) {
    std::vector<T> out((size_t)ld * (col_major ? cols : rows), to_device_type<T>(pad));
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) { out[index_in(col_major, r, c, ld)] = to_device_type<T>(m[(size_t)r * cols + c]); }
    }
    return out;
}

// rows x cols values in [-1, 1), rounded to T (so that the device and the reference see the same)
template <typename T>
static std::vector<float> random_matrix(int rows, int cols, unsigned seed) {
    std::vector<float> m((size_t)rows * cols);
    fill_uniform(m.data(), m.size(), seed);
    for (float& x : m) { x = from_device_type<T>(to_device_type<T>(x)); }
    return m;
}

// d = scale * (c + a b), each output summed in order k = 0..k-1 from c in fp32: the reference
static std::vector<float> reference_gemm(const std::vector<float>& a, const std::vector<float>& b,
                                         const std::vector<float>& c, int m, int n, int k, float scale) {
    std::vector<float> d((size_t)m * n);
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            float sum = c[(size_t)i * n + j];
            for (int l = 0; l < k; l++) { sum += a[(size_t)i * k + l] * b[(size_t)l * n + j]; }
            d[(size_t)i * n + j] = sum * scale;
        }
    }
    return d;
}

// D from the device (its layout, ld) as a row-major m x n matrix; counts padding that changed
static std::vector<float> read_matrix(const std::vector<float>& stored, int rows, int cols, bool col_major, int ld,
                                      float pad, int* changed_padding) {
    std::vector<float> m((size_t)rows * cols);
    *changed_padding = 0;
    for (size_t i = 0; i < stored.size(); i++) {
        size_t major = i / ld, minor = i % ld;
        bool inside = (int)minor < (col_major ? rows : cols);
        if (!inside) {
            *changed_padding += !(stored[i] == pad);
            continue;
        }
        int r = (int)(col_major ? minor : major), c = (int)(col_major ? major : minor);
        m[(size_t)r * cols + c] = stored[i];
    }
    return m;
}

enum { SEED_A = 1, SEED_B = 2, SEED_C = 3 };
static const float PAD_VALUE = -7.0f;  // what D's padding holds before the kernel: must stay

template <typename T, typename ALayout, typename BLayout>
static void check_gemm(wmma::layout_t c_layout, staging how, float scale) {
    const bool a_col = is_col_major<ALayout>::value, b_col = is_col_major<BLayout>::value;
    const bool c_col = c_layout == wmma::mem_col_major;
    int lda = (a_col ? M : K) + PAD_16BIT, ldb = (b_col ? K : N) + PAD_16BIT, ldc = (c_col ? M : N) + PAD_FLOAT;
    std::vector<float> a = random_matrix<T>(M, K, SEED_A), b = random_matrix<T>(K, N, SEED_B);
    std::vector<float> c((size_t)M * N);
    fill_uniform(c.data(), c.size(), SEED_C);

    T* a_d = upload(store_matrix<T>(a, M, K, a_col, lda, 0.0f));
    T* b_d = upload(store_matrix<T>(b, K, N, b_col, ldb, 0.0f));
    float* c_d = upload(store_matrix<float>(c, M, N, c_col, ldc, 0.0f));
    float* d_d = upload(store_matrix<float>(std::vector<float>((size_t)M * N, PAD_VALUE), M, N, c_col, ldc, PAD_VALUE));
    size_t dynamic_bytes = how == VIA_DYNAMIC_SHARED ? (size_t)GEMM_WARPS * 2 * STAGE_ELEMENTS * sizeof(T) : 0;
    gemm_kernel<T, ALayout, BLayout><<<1, GEMM_THREADS, dynamic_bytes>>>(d_d, a_d, lda, b_d, ldb, c_d, ldc, c_layout,
                                                                          scale, K, how);
    CUDA_CHECK(cudaGetLastError());
    int changed_padding;
    std::vector<float> got = read_matrix(download(d_d, (size_t)ldc * (c_col ? N : M)), M, N, c_col, ldc, PAD_VALUE,
                                         &changed_padding);
    std::vector<float> want = reference_gemm(a, b, c, M, N, K, scale);
    float err = max_rel_error(got.data(), want.data(), want.size());

    static const char* HOW[] = {"global memory", "static shared memory", "dynamic shared memory"};
    char name[256];
    snprintf(name, sizeof name, "%s a %s, b %s, c and d %s, from %s%s: K=%d as %d mma_sync (d = c) vs the triple loop",
             type_name<T>(), layout_name<ALayout>(), layout_name<BLayout>(),
             c_col ? "mem_col_major" : "mem_row_major", HOW[how], scale != 1.0f ? ", x[i] *= scale" : "", K, K / TILE);
    check(err <= TOLERANCE && changed_padding == 0, name, "max relative error %g (allowed %g), %d padding values written",
          err, TOLERANCE, changed_padding);
    CUDA_CHECK(cudaFree(a_d));
    CUDA_CHECK(cudaFree(b_d));
    CUDA_CHECK(cudaFree(c_d));
    CUDA_CHECK(cudaFree(d_d));
}

template <typename T>
static void check_gemm_layouts(wmma::layout_t c_layout) {
    check_gemm<T, wmma::row_major, wmma::row_major>(c_layout, FROM_GLOBAL, 1.0f);
    check_gemm<T, wmma::row_major, wmma::col_major>(c_layout, FROM_GLOBAL, 1.0f);
    check_gemm<T, wmma::col_major, wmma::row_major>(c_layout, FROM_GLOBAL, 1.0f);
    check_gemm<T, wmma::col_major, wmma::col_major>(c_layout, FROM_GLOBAL, 1.0f);
}

static void check_separate_d() {
    std::vector<float> a = random_matrix<__nv_bfloat16>(TILE, TILE, SEED_A);
    std::vector<float> b = random_matrix<__nv_bfloat16>(TILE, TILE, SEED_B);
    std::vector<float> c((size_t)TILE * TILE), zero((size_t)TILE * TILE, 0.0f);
    fill_uniform(c.data(), c.size(), SEED_C);
    __nv_bfloat16* a_d = upload(store_matrix<__nv_bfloat16>(a, TILE, TILE, false, TILE, 0.0f));
    __nv_bfloat16* b_d = upload(store_matrix<__nv_bfloat16>(b, TILE, TILE, false, TILE, 0.0f));
    float* c_d = upload(c);
    float *d_out, *c_out;
    CUDA_CHECK(cudaMalloc(&d_out, c.size() * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&c_out, c.size() * sizeof(float)));

    separate_d_kernel<<<1, WARP>>>(d_out, c_out, a_d, b_d, c_d);
    CUDA_CHECK(cudaGetLastError());
    std::vector<float> want = reference_gemm(a, b, c, TILE, TILE, TILE, 1.0f);
    std::vector<float> got = download(d_out, c.size()), c_after = download(c_out, c.size());
    float err = max_rel_error(got.data(), want.data(), want.size());
    check(err <= TOLERANCE, "mma_sync(d, a, b, c) with d separate from c: d = a b + c", "max relative error %g", err);
    check(c_after == c, "... and c keeps its values");

    separate_d_kernel<<<1, WARP>>>(d_out, c_out, a_d, b_d, nullptr);
    CUDA_CHECK(cudaGetLastError());
    want = reference_gemm(a, b, zero, TILE, TILE, TILE, 1.0f);
    got = download(d_out, c.size());
    c_after = download(c_out, c.size());
    err = max_rel_error(got.data(), want.data(), want.size());
    check(err <= TOLERANCE && c_after == zero, "fill_fragment(c, 0.0f), then d = a b + c is a b, c stays 0",
          "max relative error %g, c %s", err, c_after == zero ? "0" : "changed");
    CUDA_CHECK(cudaFree(a_d));
    CUDA_CHECK(cudaFree(b_d));
    CUDA_CHECK(cudaFree(c_d));
    CUDA_CHECK(cudaFree(d_out));
    CUDA_CHECK(cudaFree(c_out));
}

// the values 0..255 held across the warp, each exactly once (held: WARP * per_lane values)
static bool holds_each_once(const std::vector<float>& held) {
    std::vector<float> sorted = held;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.size() != (size_t)TILE * TILE) { return false; }
    for (int e = 0; e < TILE * TILE; e++) {
        if (sorted[e] != (float)e) { return false; }
    }
    return true;
}

static void check_fragment_contents() {
    typedef wmma::fragment<wmma::matrix_a, TILE, TILE, TILE, __nv_bfloat16, wmma::row_major> bf16_a;
    typedef wmma::fragment<wmma::matrix_b, TILE, TILE, TILE, __nv_bfloat16, wmma::col_major> bf16_b;
    typedef wmma::fragment<wmma::matrix_a, TILE, TILE, TILE, __half, wmma::row_major> half_a;
    typedef wmma::fragment<wmma::accumulator, TILE, TILE, TILE, float> accumulator;
    const int per_lane = 8, per_lane_half_ab = 16;  // CUDA's header: 256 elements over 32 lanes (half twice)
    check(bf16_a::num_elements == per_lane && bf16_b::num_elements == per_lane && accumulator::num_elements == per_lane &&
              half_a::num_elements == per_lane_half_ab,
          "num_elements: 8 for bf16 a and b and the float accumulator, 16 for half a",
          "bf16 a %d, bf16 b %d, accumulator %d, half a %d", (int)bf16_a::num_elements, (int)bf16_b::num_elements,
          (int)accumulator::num_elements, (int)half_a::num_elements);

    std::vector<float> index((size_t)TILE * TILE);
    for (int e = 0; e < TILE * TILE; e++) { index[e] = (float)e; }  // exact in bf16 (up to 256)
    __nv_bfloat16* index16 = upload(store_matrix<__nv_bfloat16>(index, TILE, TILE, false, TILE, 0.0f));
    float* index32 = upload(index);
    float *a_held, *b_held, *acc_held;
    size_t held = (size_t)WARP * per_lane;
    CUDA_CHECK(cudaMalloc(&a_held, held * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&b_held, held * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&acc_held, held * sizeof(float)));
    fragment_contents_kernel<<<1, WARP>>>(a_held, b_held, acc_held, index16, index32);
    CUDA_CHECK(cudaGetLastError());
    check(holds_each_once(download(a_held, held)), "a warp's bf16 matrix_a fragments hold each element once");
    check(holds_each_once(download(b_held, held)), "a warp's bf16 matrix_b fragments hold each element once");
    check(holds_each_once(download(acc_held, held)), "a warp's accumulator fragments hold each element once");
    CUDA_CHECK(cudaFree(index16));
    CUDA_CHECK(cudaFree(index32));
    CUDA_CHECK(cudaFree(a_held));
    CUDA_CHECK(cudaFree(b_held));
    CUDA_CHECK(cudaFree(acc_held));
}

// code that assumes a mapping: on the emulator it must get wrong answers (on a GPU it may be right)
static void check_mapping_is_not_assumable() {
    std::vector<float> tile((size_t)TILE * TILE);
    fill_uniform(tile.data(), tile.size(), SEED_C);
    float* tile_d = upload(tile);
    float* sums_d;
    CUDA_CHECK(cudaMalloc(&sums_d, TILE * sizeof(float)));
    assumed_layout_row_sums_kernel<<<1, WARP>>>(sums_d, tile_d);
    CUDA_CHECK(cudaGetLastError());
    std::vector<float> sums = download(sums_d, TILE);
    int wrong_rows = 0;
    for (int r = 0; r < TILE; r++) {
        float want = 0.0f;
        for (int c = 0; c < TILE; c++) { want += tile[(size_t)r * TILE + c]; }
        wrong_rows += !(fabsf(sums[r] - want) <= 1e-4f);
    }

    std::vector<float> a = random_matrix<__nv_bfloat16>(TILE, TILE, SEED_A);
    std::vector<float> b = random_matrix<__nv_bfloat16>(TILE, TILE, SEED_B);
    std::vector<float> identity((size_t)TILE * TILE, 0.0f);
    for (int i = 0; i < TILE; i++) { identity[(size_t)i * TILE + i] = 1.0f; }
    __nv_bfloat16* a_d = upload(store_matrix<__nv_bfloat16>(a, TILE, TILE, false, TILE, 0.0f));
    __nv_bfloat16* b_d = upload(store_matrix<__nv_bfloat16>(b, TILE, TILE, false, TILE, 0.0f));
    __nv_bfloat16* identity_d = upload(store_matrix<__nv_bfloat16>(identity, TILE, TILE, false, TILE, 0.0f));
    float* d_d;
    CUDA_CHECK(cudaMalloc(&d_d, tile.size() * sizeof(float)));
    accumulator_as_a_kernel<<<1, WARP>>>(d_d, a_d, b_d, identity_d);
    CUDA_CHECK(cudaGetLastError());
    std::vector<float> got = download(d_d, tile.size());
    std::vector<float> product = reference_gemm(a, b, std::vector<float>(tile.size(), 0.0f), TILE, TILE, TILE, 1.0f);
    const float bf16_rounding = 1.0f / 128.0f;  // P passed through bf16 (8 significant bits) on the way
    float err = max_rel_error(got.data(), product.data(), product.size());
#ifdef CUDA_EMU
    check(wrong_rows > TILE / 2, "row sums that assume sm_80's accumulator layout are wrong here",
          "only %d of %d rows wrong", wrong_rows, TILE);
    check(err > bf16_rounding, "an accumulator copied elementwise into a matrix_a fragment is not the same tile here",
          "max relative error %g: the mappings coincide", err);
#else
    printf("(on this GPU: row sums assuming sm_80's layout have %d of %d rows wrong; an accumulator copied into "
           "a matrix_a fragment is %s)\n", wrong_rows, TILE, err <= bf16_rounding ? "the same tile" : "another tile");
#endif
    CUDA_CHECK(cudaFree(tile_d));
    CUDA_CHECK(cudaFree(sums_d));
    CUDA_CHECK(cudaFree(a_d));
    CUDA_CHECK(cudaFree(b_d));
    CUDA_CHECK(cudaFree(identity_d));
    CUDA_CHECK(cudaFree(d_d));
}

// one misuse from the list at the top; returns when the kernel finished, which is the failure
static int run_misuse(const char* name) {
    const int tile_elements = TILE * TILE;
    std::vector<float> ones((size_t)2 * tile_elements, 1.0f);
    __nv_bfloat16* a_d = upload(store_matrix<__nv_bfloat16>(ones, 2 * TILE, TILE, false, TILE, 0.0f));
    float* d_d;
    CUDA_CHECK(cudaMalloc(&d_d, tile_elements * sizeof(float)));
    const int bad_ldm = 12, misaligned_elements = 8, partial_block = WARP + WARP / 2;
    const int next_tile = TILE * TILE;  // 512 bytes on: aligned, but another tile
    if (strcmp(name, "divergent-mma") == 0) {
        divergent_mma_kernel<<<1, WARP>>>(d_d, a_d);
    } else if (strcmp(name, "split-mma") == 0) {
        split_mma_kernel<<<1, WARP>>>(d_d, a_d);
    } else if (strcmp(name, "lanes-disagree") == 0) {
        load_misuse_kernel<<<1, WARP>>>(d_d, a_d, next_tile, TILE);
    } else if (strcmp(name, "bad-ldm") == 0) {
        load_misuse_kernel<<<1, WARP>>>(d_d, a_d, 0, bad_ldm);
    } else if (strcmp(name, "misaligned") == 0) {
        load_misuse_kernel<<<1, WARP>>>(d_d, a_d + misaligned_elements, 0, TILE);
    } else if (strcmp(name, "partial-warp") == 0) {
        load_misuse_kernel<<<1, partial_block>>>(d_d, a_d, 0, TILE);
    } else {
        fprintf(stderr, "usage: test_wmma [divergent-mma | split-mma | lanes-disagree | bad-ldm | misaligned | partial-warp]\n");
        return EXIT_FAILURE;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    printf("the kernel finished: the emulator should have stopped it\n");
    return EXIT_SUCCESS;
}

int main(int argc, char** argv) {
    if (argc > 1) { return run_misuse(argv[1]); }
    // every tile pointer below is a cudaMalloc'd (256-byte aligned) matrix plus a multiple of 16 rows
    // and 16 columns: 32-byte aligned, as wmma requires
    check_gemm_layouts<__nv_bfloat16>(wmma::mem_row_major);
    check_gemm_layouts<__nv_bfloat16>(wmma::mem_col_major);
    check_gemm_layouts<__half>(wmma::mem_row_major);
    check_gemm<__nv_bfloat16, wmma::row_major, wmma::col_major>(wmma::mem_row_major, VIA_STATIC_SHARED, 1.0f);
    check_gemm<__nv_bfloat16, wmma::col_major, wmma::row_major>(wmma::mem_col_major, VIA_DYNAMIC_SHARED, 1.0f);
    check_gemm<__nv_bfloat16, wmma::row_major, wmma::col_major>(wmma::mem_row_major, FROM_GLOBAL, 0.5f);
    check_separate_d();
    check_fragment_contents();
    check_mapping_is_not_assumable();
    return check_summary();
}
