/*
flash_attention.cuh: causal self-attention without the (B,NH,T,T) weights (--attention flash),
after Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness", and Dao 2023, "FlashAttention-2". The mathematics is attention_flash_forward and
attention_flash_backward of cpu/layers.h, their reference; this file runs it tile by tile in
shared memory.

    flash_attention_forward_cuda<floatX>(out, lse, qkv, B, T, C, NH, stream);        // out =, lse =
    float* scratch;  // flash_attention_scratch_floats(B, T, NH) floats, contents not kept
    flash_attention_backward_cuda<floatX>(dqkv, dout, qkv, out, lse, B, T, C, NH, scratch, stream);  // dqkv =

Layout as attention.cuh: qkv (B,T,3C) holds q, k, v side by side, each split into NH heads of hs =
C/NH; out (B,T,C); lse (B,NH,T) fp32, each row's log-sum-exp of its scaled scores. The kernels read
and write these in place (no head-split copies).

Tiles: a block takes FLASH_TILE rows of one (b, h) (queries in forward and in the dq kernel, keys in
the dk/dv kernel) and walks over the tiles of the other side that causality lets it see; each of
its FLASH_WARPS warps owns FLASH_MMA of its rows. Products of tiles go through warp_tile_mma: bf16
on tensor cores (nvcuda::wmma, 16x16x16, fp32 accumulation), fp32 on the CUDA cores (the same
interface). Everything row-wise (masks, exp, the online softmax's running max and sum) is done on
shared-memory copies of the tiles, because a wmma fragment's element-to-thread mapping is not
specified.

Forward, per query tile: S = Q K_j^T * scale for each key tile j <= the query tile; the running
row maximum m and sum l; P = exp(S - m) (floatX); O = O * exp(m_old - m) + P V_j (fp32, in shared
memory); finally out = O / l and lse = m + log l.
Backward (no atomics: every output element has one writer, so results are bitwise reproducible):
D = rowsum(dout * out) first; then one kernel per key tile accumulates dV = sum_i P_i^T dO_i and
dK = sum_i dS_i^T Q_i over the query tiles i that see it, and a second per query tile accumulates
dQ = sum_j dS_j K_j, where P = exp(S - lse) and dS = P (dO V^T - D) * scale. The second recomputes
S and dO V^T (7 tile products per pair instead of FlashAttention-2's 5 with an atomic dQ): the
price of determinism.

Head size: a multiple of FLASH_MMA, at most FLASH_MAX_HEAD (flash_attention_refusal); shared
memory per block: flash_smem_bytes (bf16, hs = 64: 70.5 KiB forward, 88.5 KiB backward; fp32 with
hs = 128 needs more than an A100's 163 KiB, and says so).
*/
#ifndef CUDA_FLASH_ATTENTION_CUH
#define CUDA_FLASH_ATTENTION_CUH

#include <math.h>
#include <type_traits>
#include "common.cuh"
#ifndef FLASH_NO_TENSOR_CORES
#include <mma.h>
#endif

#define FLASH_MMA 16                          // the side of a tensor-core tile (wmma m16n16k16)
#define FLASH_WARPS 4                         // warps per block, FLASH_MMA rows each
#define FLASH_TILE (FLASH_WARPS * FLASH_MMA)  // rows of a block's tile, and keys per step
#define FLASH_MAX_HEAD 128                    // the largest head size (shared memory)
#define FLASH_PAD 8                           // extra floatX per shared row (16 bytes): spreads rows over
                                              // banks, keeps 16-row tiles 32-byte aligned for wmma
#define FLASH_PAD_F32 4                       // extra floats per fp32 row: the least wmma allows (ldm a
                                              // multiple of 4), rows r and r + 8 share a bank
#define FLASH_D_BLOCK 256                     // threads per block of the D = rowsum(dout * out) kernel

// NULL if the kernels run heads of hs channels, else why not
static const char* flash_attention_refusal(int hs) {
    if (hs % FLASH_MMA != 0) { return "flash attention needs a head size that is a multiple of 16 (its tensor-core tiles)"; }
    if (hs > FLASH_MAX_HEAD) { return "flash attention runs head sizes up to 128 (shared memory per block)"; }
    return NULL;
}

// ----------------------------------------------------------------------------
// a warp's 16x16 fp32 tile C += A B, A (16 x k) row-major and B (k x 16) row- or column-major
// (B_COL: element (k, n) at b[n*ldb + k], i.e. the rows of a row-major matrix taken as columns),
// both in shared memory. Only uniform operations may touch a tile's elements: which thread holds
// which is the hardware's business. k, lda, ldb: multiples of FLASH_MMA and 8.

// fp32 (and bf16 without tensor cores): lane owns elements e = lane + 32 i, row e / 16, column e % 16
template <typename floatX>
struct WarpTile {
    static constexpr int n = FLASH_MMA * FLASH_MMA / WARP_SIZE;
    float x[n];
};

template <typename floatX>
__device__ inline void warp_tile_zero(WarpTile<floatX>& c) {
    for (int i = 0; i < c.n; i++) { c.x[i] = 0.0f; }
}

template <typename floatX>
__device__ inline void warp_tile_load(WarpTile<floatX>& c, const float* p, int ld) {
    int lane = threadIdx.x % WARP_SIZE;
    for (int i = 0; i < c.n; i++) {
        int e = lane + WARP_SIZE * i;
        c.x[i] = p[(e / FLASH_MMA) * ld + e % FLASH_MMA];
    }
}

template <typename floatX>
__device__ inline void warp_tile_store(float* p, int ld, const WarpTile<floatX>& c) {
    int lane = threadIdx.x % WARP_SIZE;
    for (int i = 0; i < c.n; i++) {
        int e = lane + WARP_SIZE * i;
        p[(e / FLASH_MMA) * ld + e % FLASH_MMA] = c.x[i];
    }
}

template <bool B_COL, typename floatX>
__device__ inline void warp_tile_mma(WarpTile<floatX>& c, const floatX* a, int lda, const floatX* b, int ldb, int k) {
    int lane = threadIdx.x % WARP_SIZE;
    for (int i = 0; i < c.n; i++) {
        int e = lane + WARP_SIZE * i, r = e / FLASH_MMA, col = e % FLASH_MMA;
        float s = c.x[i];
        #pragma unroll 1  // a loop, not k copies: fp32 is the comparison path, and unrolled it takes nvcc minutes
        for (int j = 0; j < k; j++) {
            s += to_float(a[r * lda + j]) * to_float(B_COL ? b[col * ldb + j] : b[j * ldb + col]);
        }
        c.x[i] = s;
    }
}

#ifndef FLASH_NO_TENSOR_CORES
// bf16: the tensor cores, fp32 accumulation
template <>
struct WarpTile<__nv_bfloat16> {
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, FLASH_MMA, FLASH_MMA, FLASH_MMA, float> f;
};

template <>
__device__ inline void warp_tile_zero(WarpTile<__nv_bfloat16>& c) { nvcuda::wmma::fill_fragment(c.f, 0.0f); }

template <>
__device__ inline void warp_tile_load(WarpTile<__nv_bfloat16>& c, const float* p, int ld) {
    nvcuda::wmma::load_matrix_sync(c.f, p, ld, nvcuda::wmma::mem_row_major);
}

template <>
__device__ inline void warp_tile_store(float* p, int ld, const WarpTile<__nv_bfloat16>& c) {
    nvcuda::wmma::store_matrix_sync(p, c.f, ld, nvcuda::wmma::mem_row_major);
}

template <bool B_COL>
__device__ inline void warp_tile_mma(WarpTile<__nv_bfloat16>& c, const __nv_bfloat16* a, int lda, const __nv_bfloat16* b,
                                     int ldb, int k) {
    using namespace nvcuda;
    typedef typename std::conditional<B_COL, wmma::col_major, wmma::row_major>::type BLayout;
    wmma::fragment<wmma::matrix_a, FLASH_MMA, FLASH_MMA, FLASH_MMA, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, FLASH_MMA, FLASH_MMA, FLASH_MMA, __nv_bfloat16, BLayout> fb;
    for (int j = 0; j < k; j += FLASH_MMA) {
        wmma::load_matrix_sync(fa, a + j, lda);
        wmma::load_matrix_sync(fb, B_COL ? b + j : b + (size_t)j * ldb, ldb);
        wmma::mma_sync(c.f, fa, fb, c.f);
    }
}
#endif

// ----------------------------------------------------------------------------
// shared memory

// a block's shared arrays, in elements of their types (the layout both launcher and kernel use):
// rows of a head (Q, K, V, dO floatX; O fp32) are hs wide, rows of a pair of tiles (P, dS floatX;
// S, dP fp32) FLASH_TILE wide, each padded
struct FlashSmem {
    int ld, ldp;          // floatX rows: of a head (hs + FLASH_PAD), of a pair (FLASH_TILE + FLASH_PAD)
    int ldo, lds;         // fp32 rows: of a head (hs + FLASH_PAD_F32), of a pair (FLASH_TILE + FLASH_PAD_F32)
    size_t head, pair;    // elements of one (FLASH_TILE, ld) and one (FLASH_TILE, ldp) floatX array
    size_t head32, pair32;  // ... and of one (FLASH_TILE, ldo) and one (FLASH_TILE, lds) fp32 array
};

__host__ __device__ inline FlashSmem flash_smem(int hs) {
    FlashSmem s;
    s.ld = hs + FLASH_PAD;
    s.ldp = FLASH_TILE + FLASH_PAD;
    s.ldo = hs + FLASH_PAD_F32;
    s.lds = FLASH_TILE + FLASH_PAD_F32;
    s.head = (size_t)FLASH_TILE * s.ld;
    s.pair = (size_t)FLASH_TILE * s.ldp;
    s.head32 = (size_t)FLASH_TILE * s.ldo;
    s.pair32 = (size_t)FLASH_TILE * s.lds;
    return s;
}

// bytes per block. forward: Q, K, V, P (floatX), S, O (fp32), and the rows' m and l; backward (both
// kernels): Q, dO, K, V, P, dS (floatX), S, dP (fp32), and the rows' lse and D. The backward's
// accumulators go out through S and dP, contiguous (2 lds >= ldo for hs <= FLASH_MAX_HEAD)
template <typename floatX>
static size_t flash_smem_bytes(int hs, bool backward) {
    FlashSmem s = flash_smem(hs);
    size_t X = sizeof(floatX), F = sizeof(float), rows = 2 * FLASH_TILE * F;
    if (!backward) { return (3 * s.head + s.pair) * X + (s.pair32 + s.head32) * F + rows; }
    return (4 * s.head + 2 * s.pair) * X + 2 * s.pair32 * F + rows;
}

// dst (FLASH_TILE, ld) = rows row0.. of src (row r at src + r * stride, hs elements each), zeros
// past T; the whole block takes part, 16 bytes a thread at a time
template <typename floatX>
__device__ void flash_load_tile(floatX* dst, int ld, const floatX* src, size_t stride, int row0, int T, int hs) {
    const int VEC = Packed128<floatX>::size;
    int packs = hs / VEC;
    for (int i = threadIdx.x; i < FLASH_TILE * packs; i += blockDim.x) {
        int r = i / packs, c = (i % packs) * VEC;
        Packed128<floatX> v = row0 + r < T ? load128(src + (size_t)(row0 + r) * stride + c) : Packed128<floatX>::zeros();
        store128(dst + r * ld + c, v);
    }
}

// the rows of a (b, h) in qkv (B,T,3C): q, k or v (part 0, 1, 2)
template <typename floatX>
__device__ inline const floatX* flash_head(const floatX* qkv, int b, int h, int part, int T, int C, int hs) {
    return qkv + (size_t)b * T * 3 * C + (size_t)part * C + (size_t)h * hs;
}

// the key tile at k0 of (b, h) into K and V, once every thread is done with the previous one, and
// ready for all when it returns
template <typename floatX>
__device__ void flash_next_keys(floatX* K, floatX* V, int ld, const floatX* qkv, int b, int h, int k0, int T, int C, int hs) {
    __syncthreads();
    flash_load_tile(K, ld, flash_head(qkv, b, h, 1, T, C, hs), 3 * (size_t)C, k0, T, hs);
    flash_load_tile(V, ld, flash_head(qkv, b, h, 2, T, C, hs), 3 * (size_t)C, k0, T, hs);
    __syncthreads();
}

// a causal entry: key u is visible from query t (both inside the sequence)
__device__ inline bool flash_visible(int t, int u, int T) { return u <= t && t < T; }

// ----------------------------------------------------------------------------
// CUDA kernels

// out (B,T,C) and lse (B,NH,T) for one query tile of one (b, h): grid (T / FLASH_TILE, B*NH).
// bytes: qkv read once for q, once per visible query tile for k and v; out written once.
// FLOPs: about 2 B NH T^2 hs (causal half of 4 B NH T^2 hs), as many exp / 2 B NH T^2 / 2
template <typename floatX, int HS>
__global__ void __launch_bounds__(FLASH_WARPS * WARP_SIZE)
flash_forward_kernel(floatX* out, float* lse, const floatX* qkv, int T, int C, int NH, float scale) {
    extern __shared__ __align__(128) unsigned char flash_shared[];
    const int hs = HS;
    int b = blockIdx.y / NH, h = blockIdx.y % NH, tile = blockIdx.x;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    FlashSmem sm = flash_smem(hs);
    int ldo = sm.ldo, lds = sm.lds;
    floatX *Q = (floatX*)flash_shared, *K = Q + sm.head, *V = K + sm.head, *P = V + sm.head;
    float *S = (float*)(P + sm.pair), *O = S + sm.pair32, *row_m = O + sm.head32, *row_l = row_m + FLASH_TILE;
    size_t stride = 3 * (size_t)C;
    int q0 = tile * FLASH_TILE;
    flash_load_tile(Q, sm.ld, flash_head(qkv, b, h, 0, T, C, hs), stride, q0, T, hs);
    for (int i = threadIdx.x; i < FLASH_TILE * ldo; i += blockDim.x) { O[i] = 0.0f; }
    for (int i = threadIdx.x; i < FLASH_TILE; i += blockDim.x) { row_m[i] = -INFINITY; row_l[i] = 0.0f; }
    // the warp's rows; two lanes per row in the softmax, each taking every other key of the tile
    // (the pair reads adjacent words: another bank)
    int w0 = warp * FLASH_MMA, r = w0 + lane / 2, half = lane % 2;
    for (int kt = 0; kt <= tile; kt++) {
        int k0 = kt * FLASH_TILE;
        flash_next_keys(K, V, sm.ld, qkv, b, h, k0, T, C, hs);
        // S (warp's 16 rows, FLASH_TILE keys) = Q K^T
        for (int n = 0; n < FLASH_TILE; n += FLASH_MMA) {
            WarpTile<floatX> s;
            warp_tile_zero(s);
            warp_tile_mma<true>(s, Q + w0 * sm.ld, sm.ld, K + n * sm.ld, sm.ld, hs);
            warp_tile_store(S + w0 * lds + n, lds, s);
        }
        __syncwarp();
        // the online softmax of the row: new maximum, P = exp(S - m), the sum rescaled
        float mx = -INFINITY;
        for (int c = half; c < FLASH_TILE; c += 2) {
            if (flash_visible(q0 + r, k0 + c, T)) { mx = fmaxf(mx, S[r * lds + c] * scale); }
        }
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
        float m_old = row_m[r], m_new = fmaxf(m_old, mx);
        float alpha = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);  // a row with nothing visible yet stays empty
        float sum = 0.0f;
        for (int c = half; c < FLASH_TILE; c += 2) {
            float p = flash_visible(q0 + r, k0 + c, T) ? expf(S[r * lds + c] * scale - m_new) : 0.0f;
            P[r * sm.ldp + c] = from_float<floatX>(p);
            sum += p;
        }
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        for (int d = half; d < hs; d += 2) { O[r * ldo + d] *= alpha; }
        __syncwarp();  // every lane has read row_m[r] before it changes
        if (half == 0) { row_m[r] = m_new; row_l[r] = row_l[r] * alpha + sum; }
        __syncwarp();
        // O (warp's rows) += P V
        for (int d = 0; d < hs; d += FLASH_MMA) {
            WarpTile<floatX> o;
            warp_tile_load(o, O + w0 * ldo + d, ldo);
            warp_tile_mma<false>(o, P + w0 * sm.ldp, sm.ldp, V + d, sm.ld, FLASH_TILE);
            warp_tile_store(O + w0 * ldo + d, ldo, o);
        }
    }
    __syncwarp();
    // out = O / l, lse = m + log l: the warp's rows, a lane per column
    for (int rr = w0; rr < w0 + FLASH_MMA && q0 + rr < T; rr++) {
        float inv = 1.0f / row_l[rr];
        floatX* o = out + ((size_t)b * T + q0 + rr) * C + (size_t)h * hs;
        for (int d = lane; d < hs; d += WARP_SIZE) { o[d] = from_float<floatX>(O[rr * ldo + d] * inv); }
        if (lane == 0) { lse[((size_t)b * NH + h) * T + q0 + rr] = row_m[rr] + logf(row_l[rr]); }
    }
}

// D (B,NH,T) = rowsum(dout * out) per head: one thread per row. bytes: 2 B T C floatX + B NH T fp32
template <typename floatX>
__global__ void flash_backward_dot_kernel(float* D, const floatX* dout, const floatX* out, int B, int T, int C, int NH) {
    size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // (b, h, t)
    if (row >= (size_t)B * NH * T) { return; }
    int hs = C / NH, t = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / T / NH);
    size_t at = ((size_t)b * T + t) * C + (size_t)h * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; d++) { s += to_float(dout[at + d]) * to_float(out[at + d]); }
    D[row] = s;
}

// the tile products shared by both backward kernels: for the pair (query tile q0, key tile k0),
// S = Q K^T and dP = dO V^T over the warp's 16 rows (its queries when KEY_ROWS is false; its keys,
// giving S^T and dP^T, when true), then dS = P (dP - D) * scale into the floatX tile dS, and
// (KEY_ROWS) P into the floatX tile P. A, B: the row-side and column-side tiles of the product.
template <bool KEY_ROWS, typename floatX>
__device__ void flash_backward_scores(floatX* dS, floatX* P, float* S, float* dP, const floatX* Q, const floatX* dO,
                                      const floatX* K, const floatX* V, const float* lse, const float* D, int q0, int k0,
                                      int T, int hs, float scale, const FlashSmem& sm) {
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, w0 = warp * FLASH_MMA;
    const floatX *rowA = KEY_ROWS ? K : Q, *colA = KEY_ROWS ? Q : K;    // S: rows of one, columns of the other
    const floatX *rowB = KEY_ROWS ? V : dO, *colB = KEY_ROWS ? dO : V;  // dP likewise
    for (int n = 0; n < FLASH_TILE; n += FLASH_MMA) {
        WarpTile<floatX> s, dp;
        warp_tile_zero(s);
        warp_tile_mma<true>(s, rowA + w0 * sm.ld, sm.ld, colA + n * sm.ld, sm.ld, hs);
        warp_tile_store(S + w0 * sm.lds + n, sm.lds, s);
        warp_tile_zero(dp);
        warp_tile_mma<true>(dp, rowB + w0 * sm.ld, sm.ld, colB + n * sm.ld, sm.ld, hs);
        warp_tile_store(dP + w0 * sm.lds + n, sm.lds, dp);
    }
    __syncwarp();
    for (int i = lane; i < FLASH_MMA * FLASH_TILE; i += WARP_SIZE) {
        int r = w0 + i / FLASH_TILE, c = i % FLASH_TILE;
        int qi = KEY_ROWS ? c : r;  // the query's row in its tile
        int t = q0 + qi, u = k0 + (KEY_ROWS ? r : c);
        float p = flash_visible(t, u, T) ? expf(S[r * sm.lds + c] * scale - lse[qi]) : 0.0f;
        dS[r * sm.ldp + c] = from_float<floatX>(p * (dP[r * sm.lds + c] - D[qi]) * scale);
        if (KEY_ROWS) { P[r * sm.ldp + c] = from_float<floatX>(p); }
    }
    __syncwarp();
}

// loads the per-row lse and D of the query tile at q0 into shared memory (zeros past T)
__device__ inline void flash_load_rows(float* lse_s, float* D_s, const float* lse, const float* D, int q0, int T) {
    for (int i = threadIdx.x; i < FLASH_TILE; i += blockDim.x) {
        lse_s[i] = q0 + i < T ? lse[q0 + i] : 0.0f;
        D_s[i] = q0 + i < T ? D[q0 + i] : 0.0f;
    }
}

// writes a warp's accumulated (16, hs) rows, row0.. of the tile, into dst (row r at dst + r*stride)
template <int HS, typename floatX>
__device__ void flash_store_rows(floatX* dst, size_t stride, const WarpTile<floatX>* acc, float* stage, int ld, int row0, int T) {
    const int hs = HS;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, w0 = warp * FLASH_MMA;
    #pragma unroll
    for (int d = 0; d < HS; d += FLASH_MMA) { warp_tile_store(stage + w0 * ld + d, ld, acc[d / FLASH_MMA]); }
    __syncwarp();
    for (int rr = w0; rr < w0 + FLASH_MMA && row0 + rr < T; rr++) {
        for (int d = lane; d < hs; d += WARP_SIZE) { dst[(size_t)(row0 + rr) * stride + d] = from_float<floatX>(stage[rr * ld + d]); }
    }
}

// dK, dV of one key tile of one (b, h) into dqkv: grid (T / FLASH_TILE, B*NH); the warp's 16 keys
// accumulate over the query tiles from this one on. bytes: per visible pair, Q and dO tiles read;
// FLOPs: about 4 B NH T^2 hs (4 of the 8 tile products of backward, causal half)
template <typename floatX, int HS>
__global__ void __launch_bounds__(FLASH_WARPS * WARP_SIZE)
flash_backward_dkdv_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse, const float* D, int T,
                           int C, int NH, float scale) {
    extern __shared__ __align__(128) unsigned char flash_shared[];
    const int hs = HS;
    int b = blockIdx.y / NH, h = blockIdx.y % NH, tile = blockIdx.x, tiles = gridDim.x;
    int w0 = threadIdx.x / WARP_SIZE * FLASH_MMA;
    FlashSmem sm = flash_smem(hs);
    floatX *Q = (floatX*)flash_shared, *dO = Q + sm.head, *K = dO + sm.head, *V = K + sm.head, *P = V + sm.head;
    floatX* dS = P + sm.pair;
    float *S = (float*)(dS + sm.pair), *dP = S + sm.pair32, *lse_s = dP + sm.pair32, *D_s = lse_s + FLASH_TILE;
    size_t stride = 3 * (size_t)C;
    int k0 = tile * FLASH_TILE;
    const float *lse_bh = lse + (size_t)blockIdx.y * T, *D_bh = D + (size_t)blockIdx.y * T;
    flash_load_tile(K, sm.ld, flash_head(qkv, b, h, 1, T, C, hs), stride, k0, T, hs);
    flash_load_tile(V, sm.ld, flash_head(qkv, b, h, 2, T, C, hs), stride, k0, T, hs);
    WarpTile<floatX> dK[HS / FLASH_MMA], dV[HS / FLASH_MMA];  // registers: HS is known, the loops unroll
    #pragma unroll
    for (int d = 0; d < HS / FLASH_MMA; d++) { warp_tile_zero(dK[d]); warp_tile_zero(dV[d]); }
    for (int qt = tile; qt < tiles; qt++) {
        int q0 = qt * FLASH_TILE;
        __syncthreads();  // the previous Q, dO, lse, D are consumed
        flash_load_tile(Q, sm.ld, flash_head(qkv, b, h, 0, T, C, hs), stride, q0, T, hs);
        flash_load_tile(dO, sm.ld, dout + (size_t)b * T * C + (size_t)h * hs, (size_t)C, q0, T, hs);
        flash_load_rows(lse_s, D_s, lse_bh, D_bh, q0, T);
        __syncthreads();
        // the warp's keys: S^T, dP^T, then P^T and dS^T (floatX)
        flash_backward_scores<true>(dS, P, S, dP, Q, dO, K, V, lse_s, D_s, q0, k0, T, hs, scale, sm);
        // dV += P^T dO, dK += dS^T Q over the tile's queries
        #pragma unroll
        for (int d = 0; d < HS; d += FLASH_MMA) {
            warp_tile_mma<false>(dV[d / FLASH_MMA], P + w0 * sm.ldp, sm.ldp, dO + d, sm.ld, FLASH_TILE);
            warp_tile_mma<false>(dK[d / FLASH_MMA], dS + w0 * sm.ldp, sm.ldp, Q + d, sm.ld, FLASH_TILE);
        }
    }
    __syncthreads();  // S and dP, read by every warp above, become the staging of the results
    floatX* dqkv_bh = dqkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    flash_store_rows<HS>(dqkv_bh + C, stride, dK, S, sm.ldo, k0, T);
    __syncwarp();
    flash_store_rows<HS>(dqkv_bh + 2 * (size_t)C, stride, dV, S, sm.ldo, k0, T);
}

// dQ of one query tile of one (b, h) into dqkv: grid (T / FLASH_TILE, B*NH); the warp's 16 queries
// accumulate over the key tiles up to this one. FLOPs: about 3 B NH T^2 hs (S and dP again, dQ)
template <typename floatX, int HS>
__global__ void __launch_bounds__(FLASH_WARPS * WARP_SIZE)
flash_backward_dq_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse, const float* D, int T,
                         int C, int NH, float scale) {
    extern __shared__ __align__(128) unsigned char flash_shared[];
    const int hs = HS;
    int b = blockIdx.y / NH, h = blockIdx.y % NH, tile = blockIdx.x;
    int w0 = threadIdx.x / WARP_SIZE * FLASH_MMA;
    FlashSmem sm = flash_smem(hs);
    floatX *Q = (floatX*)flash_shared, *dO = Q + sm.head, *K = dO + sm.head, *V = K + sm.head, *dS = V + sm.head;
    float *S = (float*)(dS + sm.pair), *dP = S + sm.pair32, *lse_s = dP + sm.pair32, *D_s = lse_s + FLASH_TILE;
    size_t stride = 3 * (size_t)C;
    int q0 = tile * FLASH_TILE;
    flash_load_tile(Q, sm.ld, flash_head(qkv, b, h, 0, T, C, hs), stride, q0, T, hs);
    flash_load_tile(dO, sm.ld, dout + (size_t)b * T * C + (size_t)h * hs, (size_t)C, q0, T, hs);
    flash_load_rows(lse_s, D_s, lse + (size_t)blockIdx.y * T, D + (size_t)blockIdx.y * T, q0, T);
    WarpTile<floatX> dQ[HS / FLASH_MMA];
    #pragma unroll
    for (int d = 0; d < HS / FLASH_MMA; d++) { warp_tile_zero(dQ[d]); }
    for (int kt = 0; kt <= tile; kt++) {
        int k0 = kt * FLASH_TILE;
        flash_next_keys(K, V, sm.ld, qkv, b, h, k0, T, C, hs);
        flash_backward_scores<false>(dS, (floatX*)NULL, S, dP, Q, dO, K, V, lse_s, D_s, q0, k0, T, hs, scale, sm);
        // dQ += dS K over the tile's keys
        #pragma unroll
        for (int d = 0; d < HS; d += FLASH_MMA) {
            warp_tile_mma<false>(dQ[d / FLASH_MMA], dS + w0 * sm.ldp, sm.ldp, K + d, sm.ld, FLASH_TILE);
        }
    }
    __syncthreads();  // S and dP, read by every warp above, become the staging of the results
    flash_store_rows<HS>(dqkv + (size_t)b * T * 3 * C + (size_t)h * hs, stride, dQ, S, sm.ldo, q0, T);
}

// ----------------------------------------------------------------------------
// kernel launchers

// the scratch flash_attention_backward_cuda needs: D, one float per row of each head
static size_t flash_attention_scratch_floats(int B, int T, int NH) { return (size_t)B * NH * T; }

static void flash_check(const char* who, int C, int NH, const void* qkv) {
    if (NH < 1 || C % NH != 0) { fail("%s: C=%d is not divisible by NH=%d\n  hint: heads must split the channels evenly", who, C, NH); }
    const char* refusal = flash_attention_refusal(C / NH);
    if (refusal != NULL) { fail("%s: %s (hs = %d)\n  hint: --attention matmul", who, refusal, C / NH); }
    if (!is_aligned16(qkv)) { fail("%s: qkv is not 16-byte aligned\n  hint: carve activations at 16-byte multiples", who); }
}

// calls f(std::integral_constant<int, HS>()) for the head size HS = hs, a multiple of FLASH_MMA up to
// FLASH_MAX_HEAD (flash_check): the kernels are compiled for each, so that a warp's accumulator
// tiles live in registers (arrays indexed by loops of known length)
template <int HS = FLASH_MMA, typename F>
static void flash_with_head_size(int hs, F&& f) {
    if constexpr (HS <= FLASH_MAX_HEAD) {
        if (hs == HS) { f(std::integral_constant<int, HS>()); return; }
        flash_with_head_size<HS + FLASH_MMA>(hs, f);
    }
}

// sets the kernel's dynamic shared memory (more than the default 48 KiB needs an opt-in), or stops
// with a message when this GPU has less than it needs
template <typename Kernel>
static void flash_prepare(Kernel kernel, size_t bytes, const char* who) {
    int device, most;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (bytes > (size_t)most) {
        fail("%s: needs %zu bytes of shared memory per block, this GPU allows %d\n"
             "  hint: --attention matmul, or --precision bf16 (half the bytes)", who, bytes, most);
    }
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// out (B,T,C) = causal attention of qkv (B,T,3C); lse (B,NH,T) the rows' log-sum-exp (fp32)
template <typename floatX>
void flash_attention_forward_cuda(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, cudaStream_t stream) {
    flash_check("flash_attention_forward_cuda", C, NH, qkv);
    if (B * T == 0) { return; }
    int hs = C / NH;
    size_t bytes = flash_smem_bytes<floatX>(hs, false);
    dim3 grid(ceil_div(T, FLASH_TILE), B * NH);
    flash_with_head_size(hs, [&](auto head) {
        constexpr int HS = decltype(head)::value;
        flash_prepare(flash_forward_kernel<floatX, HS>, bytes, "flash attention forward");
        flash_forward_kernel<floatX, HS><<<grid, FLASH_WARPS * WARP_SIZE, bytes, stream>>>(out, lse, qkv, T, C, NH,
                                                                                          1.0f / sqrtf((float)hs));
        CUDA_CHECK_LAUNCH();
    });
}

// dqkv (B,T,3C) = the gradient of the attention given dout (B,T,C), and the forward's qkv, out and
// lse; scratch: flash_attention_scratch_floats(B, T, NH) floats
template <typename floatX>
void flash_attention_backward_cuda(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                                   int B, int T, int C, int NH, float* scratch, cudaStream_t stream) {
    flash_check("flash_attention_backward_cuda", C, NH, qkv);
    if (B * T == 0) { return; }
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t rows = (size_t)B * NH * T;
    flash_backward_dot_kernel<floatX><<<(unsigned)ceil_div(rows, (size_t)FLASH_D_BLOCK), FLASH_D_BLOCK, 0, stream>>>(
        scratch, dout, out, B, T, C, NH);
    CUDA_CHECK_LAUNCH();
    size_t bytes = flash_smem_bytes<floatX>(hs, true);
    dim3 grid(ceil_div(T, FLASH_TILE), B * NH);
    flash_with_head_size(hs, [&](auto head) {
        constexpr int HS = decltype(head)::value;
        flash_prepare(flash_backward_dkdv_kernel<floatX, HS>, bytes, "flash attention backward");
        flash_prepare(flash_backward_dq_kernel<floatX, HS>, bytes, "flash attention backward");
        flash_backward_dkdv_kernel<floatX, HS><<<grid, FLASH_WARPS * WARP_SIZE, bytes, stream>>>(dqkv, dout, qkv, lse, scratch,
                                                                                                T, C, NH, scale);
        CUDA_CHECK_LAUNCH();
        flash_backward_dq_kernel<floatX, HS><<<grid, FLASH_WARPS * WARP_SIZE, bytes, stream>>>(dqkv, dout, qkv, lse, scratch,
                                                                                              T, C, NH, scale);
        CUDA_CHECK_LAUNCH();
    });
}

#endif // CUDA_FLASH_ATTENTION_CUH
