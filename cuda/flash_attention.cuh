/*
flash_attention.cuh: causal self-attention without the (B,NH,T,T) weights (--attention flash),
after Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness", and Dao 2023, "FlashAttention-2". The mathematics is attention_flash_forward and
attention_flash_backward of cpu/layers.h, their reference; this file runs it tile by tile.

    flash_attention_forward_cuda<floatX>(out, lse, qkv, B, T, C, NH, stream);        // out =, lse =
    float* scratch;  // flash_attention_scratch_floats(B, T, NH) floats, contents not kept
    flash_attention_backward_cuda<floatX>(dqkv, dout, qkv, out, lse, B, T, C, NH, scratch, stream);  // dqkv =

Layout as attention.cuh: qkv (B,T,3C) holds q, k, v side by side, each split into NH heads of hs =
C/NH; out (B,T,C); lse (B,NH,T) fp32, each row's log-sum-exp of its scaled scores. The kernels read
and write these in place (no head-split copies).

Two designs (flash_forward_launch, flash_backward_launch):
  - bf16: FlashAttention-2 on mma.sync (flash2_*_kernel, cuda/ptx.cuh): S, P (and dP, dS) and the
    accumulators O, dK, dV, dQ stay in registers, the online softmax runs on them with quad
    shuffles, the walked tiles are double-buffered by cp.async; shared memory only holds the tiles
    (details, the backward's scheme and the ptxas figures at the kernels).
  - fp32 (and bf16 for comparison in the dev/cuda test): tiles in shared memory, below; mma.sync
    has no fp32 inputs and this is the simplest correct kernel for the CPU-comparison precision.
Tiles in shared memory: a block takes FLASH_TILE rows of one (b, h) (queries in forward and in the
dq kernel, keys in the dk/dv kernel) and walks over the tiles of the other side that causality lets
it see; each of its FLASH_WARPS warps owns FLASH_MMA of its rows. Products of tiles go through
warp_tile_mma: bf16 on tensor cores (nvcuda::wmma, 16x16x16, fp32 accumulation), fp32 on the CUDA
cores (the same interface). Everything row-wise (masks, exp, the online softmax's running max and
sum) is done on shared-memory copies of the tiles, because a wmma fragment's element-to-thread
mapping is not specified.

Forward, per query tile: S = Q K_j^T * scale for each key tile j <= the query tile; the running
row maximum m and sum l; P = exp(S - m) (floatX); O = O * exp(m_old - m) + P V_j (fp32, in shared
memory, or registers); finally out = O / l and lse = m + log l.
Backward (both designs; no atomics: every output element has one writer, so results are bitwise
reproducible; scratch: D, B NH T floats, which the planner counts):
D = rowsum(dout * out) first; then one kernel per key tile accumulates dV = sum_i P_i^T dO_i and
dK = sum_i dS_i^T Q_i over the query tiles i that see it, and a second per query tile accumulates
dQ = sum_j dS_j K_j, where P = exp(S - lse) and dS = P (dO V^T - D) * scale. The second recomputes
S and dO V^T (7 tile products per pair instead of FlashAttention-2's 5 with an atomic dQ): the
price of determinism.

Head size: a multiple of FLASH_MMA, at most FLASH_MAX_HEAD (flash_attention_refusal); shared
memory per block: flash2_forward_smem_bytes (hs = 64: 36 KiB) and flash_smem_bytes (bf16, hs = 64:
70.5 KiB forward, 88.5 KiB backward; fp32 with hs = 128 needs more than an A100's 163 KiB, and
says so).
*/
#ifndef CUDA_FLASH_ATTENTION_CUH
#define CUDA_FLASH_ATTENTION_CUH

#include <math.h>
#include <type_traits>
#include "common.cuh"
#include "profile.cuh"  // --profile: a launcher marks its range on the compute stream (prof_kernel)
#include "ptx.cuh"
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

// ----------------------------------------------------------------------------
// bf16 forward on mma.sync (FlashAttention-2): everything a row needs lives in its warp's registers
//
// A block of FLASH2_WARPS warps takes FLASH2_BR = 64 queries of one (b, h), 16 per warp (mma's M);
// its key tiles are FLASH2_BC = 64 keys, double-buffered in shared memory by cp.async (the next
// tile's copy runs while this one is multiplied). Per key tile, per warp, all in registers:
//   S (16 x 64 fp32, 8 m16n8 accumulators) = Q K^T   Q's A fragments loaded once by ldmatrix.x4,
//                                                     K's B fragments by ldmatrix.x4 (two n-blocks)
//   row max, exp2, row sums: a row's 64 scores lie in the 4 lanes of a quad (lanes 4g..4g+3 hold
//     rows g and g+8): two __shfl_xor_sync (1, 2) give the row maximum; the sums stay per lane
//     until the end (rescaled like O), then one quad reduction
//   P (bf16) = the S accumulators packed in place: an m16n8 accumulator pair is exactly an m16n8k16
//     A fragment (ISA tables in cuda/ptx.cuh), so P never touches shared memory
//   O (16 x hs fp32, hs/8 accumulators) = O * exp2(m_old - m) + P V   V's B fragments by
//     ldmatrix.x4.trans
// The softmax runs in base 2: scores are scaled by scale * log2(e) once (one FMA per score), so p
// is one ex2.approx; lse = (m + log2 l) ln 2.
//
// Per tile pair (64 queries x 64 keys): 2 tile products (S, PV); shared memory moved per key tile:
// K and V in by cp.async (2 * 64 * hs * 2 bytes) and read once each by ldmatrix per warp.
// Registers, shared memory and occupancy per head size: FLASH_PTXAS below.
#define FLASH2_WARPS 4
#define FLASH2_BR (FLASH2_WARPS * 16)   // queries per block: 16 per warp, mma's M
#define FLASH2_BC 64                    // keys per tile
#define FLASH2_MIN_BLOCKS 2             // blocks per SM ptxas must allow (255 registers a thread):
                                        // without it ptxas caps hs = 64 at 128 registers and spills
#define FLASH2_PAD 8                    // bf16 per shared row: 16 bytes, so the 8 rows one ldmatrix
                                        // reads start in 8 different bank quads (no conflicts)

__host__ __device__ constexpr int flash2_ld(int hs) { return hs + FLASH2_PAD; }

// shared memory of the forward: two buffers each of K and V (BC rows, hs + PAD wide); Q passes
// through K's second buffer on its way into registers (BR = BC rows)
static size_t flash2_forward_smem_bytes(int hs) {
    return (size_t)4 * FLASH2_BC * flash2_ld(hs) * sizeof(__nv_bfloat16);
}

// What ptxas -v reports (nvcc 13.0 V13.0.88, -O3, 2026-11-24) for the bf16 kernels: registers per
// thread for head sizes 16, 32, ..., 128, sm_80 then sm_90; none spills or has a stack frame. With
// 128 threads a block and the shared memory of each (flash2_*_smem_bytes, flash_smem_bytes), blocks
// per SM follow (an A100 has 64K registers and 164 KiB of shared memory per SM, an H100 64K and
// 228 KiB); `test_flash_attention` prints them all. For hs = 64 (GPT-2), blocks per SM on an A100 /
// an H100: forward in registers 159 / 168 registers, 36 KiB: 3 / 3 (registers bound); forward in
// shared memory 48 / 32 registers, 70.5 KiB: 2 / 3 (shared memory bound); backward in registers,
// dK dV 224 / 228 and dQ 230 / 214 registers, 55 and 36 KiB: 2 / 2; backward in shared memory
// 88.5 KiB: 1 / 2.
// Remeasure after a change: nvcc -O3 -std=c++17 -arch=sm_80 -I. -Xptxas -v -c dev/cuda/test_flash_attention.cu
#define FLASH_HEAD_SIZES (FLASH_MAX_HEAD / 16)
struct FlashPtxas {
    const char* kernel;
    short regs_sm80[FLASH_HEAD_SIZES], regs_sm90[FLASH_HEAD_SIZES];
};
static const FlashPtxas FLASH_PTXAS[] = {
    {"flash2_forward_kernel (registers)", {109, 136, 147, 159, 170, 186, 196, 211}, {112, 143, 154, 168, 186, 186, 202, 217}},
    {"flash_forward_kernel (shared)", {40, 48, 48, 48, 40, 48, 40, 66}, {32, 32, 32, 32, 32, 38, 32, 32}},
    {"flash_backward_dkdv_kernel (shared)", {56, 84, 96, 130, 128, 176, 168, 168}, {64, 79, 80, 100, 134, 176, 168, 255}},
    {"flash_backward_dq_kernel (shared)", {56, 66, 64, 86, 76, 102, 96, 134}, {48, 48, 66, 80, 72, 82, 100, 136}},
    {"flash2_backward_dkdv_kernel (registers)", {149, 174, 200, 224, 203, 230, 234, 242}, {147, 177, 195, 228, 216, 230, 243, 244}},
    {"flash2_backward_dq_kernel (registers)", {119, 158, 186, 230, 190, 214, 226, 242}, {119, 164, 184, 214, 190, 206, 226, 238}},
};

// rows row0.. of a (b, h)'s q, k or v (row r at src + r * stride, HS bf16) into dst (rows of
// flash2_ld(HS)), by cp.async: 16 bytes per thread and step, rows past T zero-filled
template <int HS, int ROWS>
__device__ inline void flash2_load_tile(__nv_bfloat16* dst, const __nv_bfloat16* src, size_t stride, int row0, int T) {
    const int CHUNKS = HS / 8;  // 16-byte pieces of a row
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += FLASH2_WARPS * WARP_SIZE) {
        int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        bool inside = row0 + r < T;
        const __nv_bfloat16* from = inside ? src + (size_t)(row0 + r) * stride + c : src;
        ptx_cp_async_cg16(dst + r * flash2_ld(HS) + c, from, inside ? 16 : 0);
    }
}

// A warp's fragments from a bf16 tile in shared memory (rows of ld elements), by ldmatrix.x4:
// the A fragment of rows r0..r0+15, columns c0..c0+15 (quarters: rows 0-7 | 8-15, columns 0-7 | 8-15)
__device__ inline void flash2_a_frag(uint32_t a[4], const __nv_bfloat16* tile, int ld, int r0, int c0) {
    int lane = threadIdx.x % WARP_SIZE;
    ptx_ldmatrix<4, false>(a, tile + (r0 + lane % 8 + (lane / 8 % 2) * 8) * ld + c0 + (lane / 16) * 8);
}
// B fragments of two n-blocks (n0.., n0+8..) for k = c0..c0+15, the tile's rows being the n index
// (K for Q K^T): b[0..1] n-block n0, b[2..3] n-block n0+8
__device__ inline void flash2_b_frags_nk(uint32_t b[4], const __nv_bfloat16* tile, int ld, int n0, int c0) {
    int lane = threadIdx.x % WARP_SIZE;
    ptx_ldmatrix<4, false>(b, tile + (n0 + (lane / 16) * 8 + lane % 8) * ld + c0 + (lane / 8 % 2) * 8);
}
// B fragments of two n-blocks (columns n0.., n0+8..) for k = rows k0..k0+15, the tile's rows being
// the k index (V for P V): .trans; b[0..1] n-block n0, b[2..3] n-block n0+8
__device__ inline void flash2_b_frags_kn(uint32_t b[4], const __nv_bfloat16* tile, int ld, int k0, int n0) {
    int lane = threadIdx.x % WARP_SIZE;
    ptx_ldmatrix<4, true>(b, tile + (k0 + lane % 8 + (lane / 8 % 2) * 8) * ld + n0 + (lane / 16) * 8);
}
// the A fragment (m16k16) of accumulator n-blocks 2kk and 2kk+1 (m16n8 each), rounded to bf16:
// an accumulator pair is exactly an A fragment (ISA tables in cuda/ptx.cuh)
__device__ inline void flash2_acc_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
    a[0] = ptx_pack_bf16(lo[0], lo[1]);
    a[1] = ptx_pack_bf16(lo[2], lo[3]);
    a[2] = ptx_pack_bf16(hi[0], hi[1]);
    a[3] = ptx_pack_bf16(hi[2], hi[3]);
}

// out (B,T,C) and lse (B,NH,T) for one query tile of one (b, h): grid (ceil(T / FLASH2_BR), B*NH),
// the tiles with the most keys first. bytes: q once, k and v once per query tile that sees them
template <int HS>
__global__ void __launch_bounds__(FLASH2_WARPS * WARP_SIZE, FLASH2_MIN_BLOCKS)
flash2_forward_kernel(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int T, int C, int NH, float scale_log2) {
    extern __shared__ __align__(128) unsigned char flash_shared[];
    const int LD = flash2_ld(HS), NB = FLASH2_BC / 8, DB = HS / 8;  // n-blocks of S, of O
    static_assert(FLASH2_BR == FLASH2_BC, "Q is staged in a K buffer");
    __nv_bfloat16* K = (__nv_bfloat16*)flash_shared;  // K[buf] at K + buf * BC * LD
    __nv_bfloat16* V = K + 2 * FLASH2_BC * LD;
    __nv_bfloat16* Q = K + FLASH2_BC * LD;              // K's buffer 1, until tile 1 is loaded
    int b = blockIdx.y / NH, h = blockIdx.y % NH, tile = gridDim.x - 1 - blockIdx.x;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    int q0 = tile * FLASH2_BR, w0 = warp * 16;
    size_t stride = 3 * (size_t)C;
    const __nv_bfloat16* q_head = flash_head(qkv, b, h, 0, T, C, HS);
    const __nv_bfloat16* k_head = flash_head(qkv, b, h, 1, T, C, HS);
    const __nv_bfloat16* v_head = flash_head(qkv, b, h, 2, T, C, HS);
    int tiles = ceil_div(min(q0 + FLASH2_BR, T), FLASH2_BC);  // key tiles the block's last row sees

    // Q and key tile 0; Q into registers, where it stays: the warp's 16 rows as A fragments, one
    // per 16 channels (x4: rows 0-7 | 8-15, channels 0-7 | 8-15)
    flash2_load_tile<HS, FLASH2_BR>(Q, q_head, stride, q0, T);
    flash2_load_tile<HS, FLASH2_BC>(K, k_head, stride, 0, T);
    flash2_load_tile<HS, FLASH2_BC>(V, v_head, stride, 0, T);
    ptx_cp_async_commit();
    ptx_cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[HS / 16][4];
    #pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) { flash2_a_frag(qf[kk], Q, LD, w0, kk * 16); }
    __syncthreads();  // every warp has its Q before tile 1 is copied over it
    float o[DB][4];           // O: rows g, g+8; channels 8 db + 2t, +1
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g+8 (l: this lane's part)
    #pragma unroll
    for (int db = 0; db < DB; db++) { o[db][0] = o[db][1] = o[db][2] = o[db][3] = 0.0f; }

    for (int kt = 0; kt < tiles; kt++) {
        int k0 = kt * FLASH2_BC, buf = kt % 2;
        if (kt + 1 < tiles) {  // the next key tile into the other buffer (every warp is done with it)
            flash2_load_tile<HS, FLASH2_BC>(K + (1 - buf) * FLASH2_BC * LD, k_head, stride, k0 + FLASH2_BC, T);
            flash2_load_tile<HS, FLASH2_BC>(V + (1 - buf) * FLASH2_BC * LD, v_head, stride, k0 + FLASH2_BC, T);
            ptx_cp_async_commit();
            ptx_cp_async_wait<1>();  // this thread's copies of tile kt have landed
        } else {
            ptx_cp_async_wait<0>();
        }
        __syncthreads();  // ... and everyone's
        const __nv_bfloat16 *Kb = K + buf * FLASH2_BC * LD, *Vb = V + buf * FLASH2_BC * LD;
        // S = Q K^T: n-blocks of 8 keys, two per ldmatrix.x4 (keys 0-7 | 8-15, channels 0-7 | 8-15)
        float s[NB][4];
        #pragma unroll
        for (int nb = 0; nb < NB; nb++) { s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f; }
        #pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            #pragma unroll
            for (int nb = 0; nb < NB; nb += 2) {
                uint32_t kf[4];
                flash2_b_frags_nk(kf, Kb, LD, nb * 8, kk * 16);
                ptx_mma_bf16_16816(s[nb], qf[kk], kf, s[nb]);
                ptx_mma_bf16_16816(s[nb + 1], qf[kk], kf + 2, s[nb + 1]);
            }
        }
        // scale into base-2 units; keys after the query or past T: -inf (only tiles that reach the
        // diagonal or the end of the sequence need the test)
        bool edge = k0 + FLASH2_BC - 1 > q0 + w0 || k0 + FLASH2_BC > T;
        #pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            #pragma unroll
            for (int i = 0; i < 4; i++) {
                int row = q0 + w0 + g + (i / 2) * 8, key = k0 + nb * 8 + 2 * t + i % 2;
                s[nb][i] = edge && (key > row || key >= T) ? -INFINITY : s[nb][i] * scale_log2;
            }
        }
        // online softmax, rows g (r = 0: accumulator elements 0, 1) and g + 8 (r = 1: 2, 3)
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = m[r];
            #pragma unroll
            for (int nb = 0; nb < NB; nb++) { mx = fmaxf(mx, fmaxf(s[nb][2 * r], s[nb][2 * r + 1])); }
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));  // the quad: the row's 64 keys
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
            // a row that has seen no key yet (mx = -inf) keeps O = 0 and l = 0 (alpha = 1, p = 0)
            float base = mx == -INFINITY ? 0.0f : mx;
            float alpha = ptx_exp2(m[r] - base);
            m[r] = mx;
            float sum = 0.0f;
            #pragma unroll
            for (int nb = 0; nb < NB; nb++) {
                s[nb][2 * r] = ptx_exp2(s[nb][2 * r] - base);
                s[nb][2 * r + 1] = ptx_exp2(s[nb][2 * r + 1] - base);
                sum += s[nb][2 * r] + s[nb][2 * r + 1];
            }
            l[r] = l[r] * alpha + sum;
            #pragma unroll
            for (int db = 0; db < DB; db++) { o[db][2 * r] *= alpha; o[db][2 * r + 1] *= alpha; }
        }
        // O += P V: P's A fragment for keys 16 kk.. is the accumulators of n-blocks 2 kk and 2 kk + 1
        #pragma unroll
        for (int kk = 0; kk < FLASH2_BC / 16; kk++) {
            uint32_t pf[4];
            flash2_acc_to_a(pf, s[2 * kk], s[2 * kk + 1]);
            #pragma unroll
            for (int db = 0; db < DB; db += 2) {  // .trans x4: keys 0-7 | 8-15, channels 0-7 | 8-15
                uint32_t vf[4];
                flash2_b_frags_kn(vf, Vb, LD, kk * 16, db * 8);
                ptx_mma_bf16_16816(o[db], pf, vf, o[db]);
                ptx_mma_bf16_16816(o[db + 1], pf, vf + 2, o[db + 1]);
            }
        }
        __syncthreads();  // every warp is done with buffer buf before tile kt + 2 is copied into it
    }
    // out = O / l, lse = (m + log2 l) ln 2: each row's sum from its quad
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 1);
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 2);
        int row = q0 + w0 + g + r * 8;
        if (row >= T) { continue; }
        float inv = 1.0f / l[r];
        __nv_bfloat16* o_row = out + ((size_t)b * T + row) * C + (size_t)h * HS;
        #pragma unroll
        for (int db = 0; db < DB; db++) {
            __nv_bfloat162 v = __floats2bfloat162_rn(o[db][2 * r] * inv, o[db][2 * r + 1] * inv);
            *(__nv_bfloat162*)(o_row + db * 8 + 2 * t) = v;
        }
        if (t == 0) { lse[((size_t)b * NH + h) * T + row] = (m[r] + log2f(l[r])) * (1.0f / PTX_LOG2E); }
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
// bf16 backward on mma.sync: the two kernels of the tiles in shared memory (dK dV per key tile, dQ
// per query tile, after the D kernel above), with S, dP, P, dS and the dK, dV, dQ accumulators in
// registers and the walked tiles double-buffered by cp.async; the fragment helpers of the forward.
//
// Still 7 tile products per (query, key) tile pair: both kernels need S and dP. Fewer needs dQ
// summed across the key-tile blocks, and every way to do that deterministically costs memory the
// planner would have to count or an ordering this trainer cannot have: FlashAttention-2's 5 add dQ
// with atomics (order-dependent, so not bitwise reproducible); dS written once for a dQ GEMM keeps
// B NH T^2 bf16 (384 MiB at d12, B = 16, T = 1024: the weights flash attention exists to avoid);
// per-key-tile dQ partials summed in order keep B NH (T / 64) T hs fp32 (768 MiB there); an
// ordered accumulation by semaphores (key tile j adds after j - 1) makes blocks wait on blocks that
// may not be resident, and the emulator runs blocks one at a time. The dQ kernel's S and dP are the
// price: 3 of 7 products.
//
// Per warp: 16 keys (dK dV) or 16 queries (dQ); the other side walks in steps of FLASH2_STEP(HS)
// rows: 64 for hs <= 64, 32 above, which keeps the accumulators (dK and dV: hs fp32 a lane; S and
// dP: STEP / 2 each) within 255 registers without spilling.
#define FLASH2_STEP(HS) ((HS) <= 64 ? 64 : 32)

// shared memory of the backward kernels. dK dV: K and V (64 rows), two buffers each of Q and dO
// (STEP rows), and two of the step's lse and D (floats); dQ: two buffers each of K and V (STEP
// rows), Q and dO passing through them on the way into registers (2 STEP >= 64 rows)
static size_t flash2_backward_smem_bytes(int hs, bool dkdv) {
    size_t step = FLASH2_STEP(hs), row = (size_t)flash2_ld(hs) * sizeof(__nv_bfloat16);
    if (dkdv) { return (2 * FLASH2_BR + 4 * step) * row + 4 * step * sizeof(float); }
    return 4 * step * row;
}

// lse and D of queries q0.. (STEP of them, zeros past T) into lse_s, D_s: plain loads (rows of
// (B,NH,T) floats are not 16-byte aligned for cp.async); ready for all after the next barrier
template <int STEP>
__device__ inline void flash2_load_rows(float* lse_s, float* D_s, const float* lse, const float* D, int q0, int T) {
    for (int i = threadIdx.x; i < STEP; i += FLASH2_WARPS * WARP_SIZE) {
        lse_s[i] = q0 + i < T ? lse[q0 + i] * PTX_LOG2E : 0.0f;  // base 2, as the scores
        D_s[i] = q0 + i < T ? D[q0 + i] : 0.0f;
    }
}

// dK, dV of one key tile (64 keys) of one (b, h) into dqkv: grid (ceil(T / 64), B*NH); the warp's 16
// keys accumulate over the queries from the tile on, STEP at a time. Per step, for the warp:
//   S^T = K Q^T, dP^T = V dO^T (16 x STEP)    A: K, V rows (ldmatrix); B: Q, dO rows (ldmatrix)
//   P^T = exp2(S^T scale log2 e - lse log2 e), dS^T = P^T (dP^T - D) scale, masked, in place
//   dV += P^T dO, dK += dS^T Q (16 x hs)       A: the accumulators packed; B: dO, Q (.trans)
template <int HS>
__global__ void __launch_bounds__(FLASH2_WARPS * WARP_SIZE, FLASH2_MIN_BLOCKS)
flash2_backward_dkdv_kernel(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const float* lse,
                            const float* D, int T, int C, int NH, float scale) {
    extern __shared__ __align__(128) unsigned char flash_shared[];
    const int LD = flash2_ld(HS), STEP = FLASH2_STEP(HS), NB = STEP / 8, DB = HS / 8;
    __nv_bfloat16* K = (__nv_bfloat16*)flash_shared;
    __nv_bfloat16* V = K + FLASH2_BR * LD;
    __nv_bfloat16* Q = V + FLASH2_BR * LD;  // Q[buf] at Q + buf * STEP * LD
    __nv_bfloat16* dO = Q + 2 * STEP * LD;
    float* lse_s = (float*)(dO + 2 * STEP * LD);  // [buf][STEP]
    float* D_s = lse_s + 2 * STEP;
    int b = blockIdx.y / NH, h = blockIdx.y % NH, tile = blockIdx.x;  // the most queries first
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    int k0 = tile * FLASH2_BR, w0 = warp * 16;
    size_t stride = 3 * (size_t)C;
    const __nv_bfloat16* q_head = flash_head(qkv, b, h, 0, T, C, HS);
    const __nv_bfloat16* do_head = dout + (size_t)b * T * C + (size_t)h * HS;
    const float *lse_bh = lse + (size_t)blockIdx.y * T, *D_bh = D + (size_t)blockIdx.y * T;
    int steps = ceil_div(T - k0, STEP);  // query steps from k0 (the first that sees these keys) to T
    float scale_log2 = scale * PTX_LOG2E;

    flash2_load_tile<HS, FLASH2_BR>(K, flash_head(qkv, b, h, 1, T, C, HS), stride, k0, T);
    flash2_load_tile<HS, FLASH2_BR>(V, flash_head(qkv, b, h, 2, T, C, HS), stride, k0, T);
    flash2_load_tile<HS, STEP>(Q, q_head, stride, k0, T);
    flash2_load_tile<HS, STEP>(dO, do_head, (size_t)C, k0, T);
    flash2_load_rows<STEP>(lse_s, D_s, lse_bh, D_bh, k0, T);
    ptx_cp_async_commit();

    float dk[DB][4], dv[DB][4];  // the warp's keys: rows g, g+8; channels 8 db + 2t, +1
    #pragma unroll
    for (int db = 0; db < DB; db++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) { dk[db][i] = dv[db][i] = 0.0f; }
    }
    for (int st = 0; st < steps; st++) {
        int q0 = k0 + st * STEP, buf = st % 2;
        if (st + 1 < steps) {  // the next queries into the other buffers (every warp is done with them)
            int nb_ = 1 - buf;
            flash2_load_tile<HS, STEP>(Q + nb_ * STEP * LD, q_head, stride, q0 + STEP, T);
            flash2_load_tile<HS, STEP>(dO + nb_ * STEP * LD, do_head, (size_t)C, q0 + STEP, T);
            flash2_load_rows<STEP>(lse_s + nb_ * STEP, D_s + nb_ * STEP, lse_bh, D_bh, q0 + STEP, T);
            ptx_cp_async_commit();
            ptx_cp_async_wait<1>();
        } else {
            ptx_cp_async_wait<0>();
        }
        __syncthreads();
        const __nv_bfloat16 *Qb = Q + buf * STEP * LD, *dOb = dO + buf * STEP * LD;
        const float *lse_b = lse_s + buf * STEP, *D_b = D_s + buf * STEP;
        float sT[NB][4], dpT[NB][4];
        #pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            #pragma unroll
            for (int i = 0; i < 4; i++) { sT[nb][i] = dpT[nb][i] = 0.0f; }
        }
        #pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            uint32_t ka[4], va[4];
            flash2_a_frag(ka, K, LD, w0, kk * 16);
            flash2_a_frag(va, V, LD, w0, kk * 16);
            #pragma unroll
            for (int nb = 0; nb < NB; nb += 2) {
                uint32_t qb[4], ob[4];
                flash2_b_frags_nk(qb, Qb, LD, nb * 8, kk * 16);
                ptx_mma_bf16_16816(sT[nb], ka, qb, sT[nb]);
                ptx_mma_bf16_16816(sT[nb + 1], ka, qb + 2, sT[nb + 1]);
                flash2_b_frags_nk(ob, dOb, LD, nb * 8, kk * 16);
                ptx_mma_bf16_16816(dpT[nb], va, ob, dpT[nb]);
                ptx_mma_bf16_16816(dpT[nb + 1], va, ob + 2, dpT[nb + 1]);
            }
        }
        // P^T and dS^T in place; a query before the key, or past T, contributes nothing
        #pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            #pragma unroll
            for (int i = 0; i < 4; i++) {
                int key = k0 + w0 + g + (i / 2) * 8, qi = nb * 8 + 2 * t + i % 2, query = q0 + qi;
                float p = key <= query && query < T ? ptx_exp2(sT[nb][i] * scale_log2 - lse_b[qi]) : 0.0f;
                sT[nb][i] = p;
                dpT[nb][i] = p * (dpT[nb][i] - D_b[qi]) * scale;
            }
        }
        // dV += P^T dO, dK += dS^T Q over the step's queries
        #pragma unroll
        for (int kk = 0; kk < STEP / 16; kk++) {
            uint32_t pa[4], dsa[4];
            flash2_acc_to_a(pa, sT[2 * kk], sT[2 * kk + 1]);
            flash2_acc_to_a(dsa, dpT[2 * kk], dpT[2 * kk + 1]);
            #pragma unroll
            for (int db = 0; db < DB; db += 2) {
                uint32_t ob[4], qb[4];
                flash2_b_frags_kn(ob, dOb, LD, kk * 16, db * 8);
                ptx_mma_bf16_16816(dv[db], pa, ob, dv[db]);
                ptx_mma_bf16_16816(dv[db + 1], pa, ob + 2, dv[db + 1]);
                flash2_b_frags_kn(qb, Qb, LD, kk * 16, db * 8);
                ptx_mma_bf16_16816(dk[db], dsa, qb, dk[db]);
                ptx_mma_bf16_16816(dk[db + 1], dsa, qb + 2, dk[db + 1]);
            }
        }
        __syncthreads();  // every warp is done with buffer buf before step st + 2 is copied into it
    }
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = k0 + w0 + g + r * 8;
        if (key >= T) { continue; }
        __nv_bfloat16* row = dqkv + ((size_t)b * T + key) * stride + (size_t)h * HS + 2 * t;
        #pragma unroll
        for (int db = 0; db < DB; db++) {
            *(__nv_bfloat162*)(row + C + db * 8) = __floats2bfloat162_rn(dk[db][2 * r], dk[db][2 * r + 1]);
            *(__nv_bfloat162*)(row + 2 * (size_t)C + db * 8) = __floats2bfloat162_rn(dv[db][2 * r], dv[db][2 * r + 1]);
        }
    }
}

// dQ of one query tile (64 queries) of one (b, h) into dqkv: grid (ceil(T / 64), B*NH), the tiles
// with the most keys first; the warp's 16 queries accumulate over the keys up to the tile's last,
// STEP at a time. Per step: S = Q K^T, dP = dO V^T (Q, dO as A fragments, kept in registers), P and
// dS in place (each row's lse and D in the lane), dQ += dS K (K .trans)
template <int HS>
__global__ void __launch_bounds__(FLASH2_WARPS * WARP_SIZE, FLASH2_MIN_BLOCKS)
flash2_backward_dq_kernel(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv, const float* lse,
                          const float* D, int T, int C, int NH, float scale) {
    extern __shared__ __align__(128) unsigned char flash_shared[];
    const int LD = flash2_ld(HS), STEP = FLASH2_STEP(HS), NB = STEP / 8, DB = HS / 8;
    static_assert(2 * FLASH2_STEP(HS) >= FLASH2_BR, "Q and dO pass through the two K and V buffers");
    __nv_bfloat16* K = (__nv_bfloat16*)flash_shared;  // K[buf] at K + buf * STEP * LD
    __nv_bfloat16* V = K + 2 * STEP * LD;
    int b = blockIdx.y / NH, h = blockIdx.y % NH, tile = gridDim.x - 1 - blockIdx.x;
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    int q0 = tile * FLASH2_BR, w0 = warp * 16;
    size_t stride = 3 * (size_t)C;
    const __nv_bfloat16* k_head = flash_head(qkv, b, h, 1, T, C, HS);
    const __nv_bfloat16* v_head = flash_head(qkv, b, h, 2, T, C, HS);
    int steps = ceil_div(min(q0 + FLASH2_BR, T), STEP);  // key steps the tile's last row sees
    float scale_log2 = scale * PTX_LOG2E;

    // Q and dO into registers, through the K and V buffers
    flash2_load_tile<HS, FLASH2_BR>(K, flash_head(qkv, b, h, 0, T, C, HS), stride, q0, T);
    flash2_load_tile<HS, FLASH2_BR>(V, dout + (size_t)b * T * C + (size_t)h * HS, (size_t)C, q0, T);
    ptx_cp_async_commit();
    ptx_cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[HS / 16][4], of[HS / 16][4];
    #pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        flash2_a_frag(qf[kk], K, LD, w0, kk * 16);
        flash2_a_frag(of[kk], V, LD, w0, kk * 16);
    }
    float lse2[2], Dr[2];  // rows g, g+8: lse in base 2, and D
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = q0 + w0 + g + r * 8;
        lse2[r] = row < T ? lse[(size_t)blockIdx.y * T + row] * PTX_LOG2E : 0.0f;
        Dr[r] = row < T ? D[(size_t)blockIdx.y * T + row] : 0.0f;
    }
    __syncthreads();  // every warp has its Q and dO before key step 0 is copied over them
    flash2_load_tile<HS, STEP>(K, k_head, stride, 0, T);
    flash2_load_tile<HS, STEP>(V, v_head, stride, 0, T);
    ptx_cp_async_commit();

    float dq[DB][4];
    #pragma unroll
    for (int db = 0; db < DB; db++) { dq[db][0] = dq[db][1] = dq[db][2] = dq[db][3] = 0.0f; }
    for (int kt = 0; kt < steps; kt++) {
        int k0 = kt * STEP, buf = kt % 2;
        if (kt + 1 < steps) {
            flash2_load_tile<HS, STEP>(K + (1 - buf) * STEP * LD, k_head, stride, k0 + STEP, T);
            flash2_load_tile<HS, STEP>(V + (1 - buf) * STEP * LD, v_head, stride, k0 + STEP, T);
            ptx_cp_async_commit();
            ptx_cp_async_wait<1>();
        } else {
            ptx_cp_async_wait<0>();
        }
        __syncthreads();
        const __nv_bfloat16 *Kb = K + buf * STEP * LD, *Vb = V + buf * STEP * LD;
        float s[NB][4], dp[NB][4];
        #pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            #pragma unroll
            for (int i = 0; i < 4; i++) { s[nb][i] = dp[nb][i] = 0.0f; }
        }
        #pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            #pragma unroll
            for (int nb = 0; nb < NB; nb += 2) {
                uint32_t kb[4], vb[4];
                flash2_b_frags_nk(kb, Kb, LD, nb * 8, kk * 16);
                ptx_mma_bf16_16816(s[nb], qf[kk], kb, s[nb]);
                ptx_mma_bf16_16816(s[nb + 1], qf[kk], kb + 2, s[nb + 1]);
                flash2_b_frags_nk(vb, Vb, LD, nb * 8, kk * 16);
                ptx_mma_bf16_16816(dp[nb], of[kk], vb, dp[nb]);
                ptx_mma_bf16_16816(dp[nb + 1], of[kk], vb + 2, dp[nb + 1]);
            }
        }
        // dS in place; a key after the query, or past T, contributes nothing
        #pragma unroll
        for (int nb = 0; nb < NB; nb++) {
            #pragma unroll
            for (int i = 0; i < 4; i++) {
                int row = q0 + w0 + g + (i / 2) * 8, key = k0 + nb * 8 + 2 * t + i % 2;
                float p = key <= row && key < T ? ptx_exp2(s[nb][i] * scale_log2 - lse2[i / 2]) : 0.0f;
                s[nb][i] = p * (dp[nb][i] - Dr[i / 2]) * scale;
            }
        }
        // dQ += dS K over the step's keys
        #pragma unroll
        for (int kk = 0; kk < STEP / 16; kk++) {
            uint32_t dsa[4];
            flash2_acc_to_a(dsa, s[2 * kk], s[2 * kk + 1]);
            #pragma unroll
            for (int db = 0; db < DB; db += 2) {
                uint32_t kb[4];
                flash2_b_frags_kn(kb, Kb, LD, kk * 16, db * 8);
                ptx_mma_bf16_16816(dq[db], dsa, kb, dq[db]);
                ptx_mma_bf16_16816(dq[db + 1], dsa, kb + 2, dq[db + 1]);
            }
        }
        __syncthreads();  // every warp is done with buffer buf before step kt + 2 is copied into it
    }
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = q0 + w0 + g + r * 8;
        if (row >= T) { continue; }
        __nv_bfloat16* out = dqkv + ((size_t)b * T + row) * stride + (size_t)h * HS + 2 * t;
        #pragma unroll
        for (int db = 0; db < DB; db++) {
            *(__nv_bfloat162*)(out + db * 8) = __floats2bfloat162_rn(dq[db][2 * r], dq[db][2 * r + 1]);
        }
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// the scratch flash_attention_backward_cuda needs: D, one float per row of each head
static size_t flash_attention_scratch_floats(int B, int T, int NH) { return (size_t)B * NH * T; }

// a tensor the kernels touch with wide accesses, and the alignment of its first element that they
// need. Its rows (3C or C elements) and heads (hs, a multiple of 16: flash_attention_refusal) then
// start aligned too
typedef struct {
    const char* name;
    const void* ptr;
    size_t align;     // bytes
    const char* by;   // the accesses, for the message
} FlashAccess;

#define FLASH_WIDE_ALIGN 16   // cp.async (the bf16 kernels) and load128 (the fp32 ones) move 16 bytes
#define FLASH_PAIR_ALIGN 4    // the bf16 kernels store two values at once (__nv_bfloat162)
#define FLASH_WIDE_READS "cp.async and 16-byte loads"

// the alignment of the outputs out and dqkv: pairs of bf16 from the bf16 kernels, single values else
template <typename floatX>
static size_t flash_store_align(void) {
    return std::is_same<floatX, __nv_bfloat16>::value ? FLASH_PAIR_ALIGN : sizeof(floatX);
}

static void flash_check(const char* who, int C, int NH, const FlashAccess* accesses, int n) {
    if (NH < 1 || C % NH != 0) { fail("%s: C=%d is not divisible by NH=%d\n  hint: heads must split the channels evenly", who, C, NH); }
    const char* refusal = flash_attention_refusal(C / NH);
    if (refusal != NULL) { fail("%s: %s (hs = %d)\n  hint: --attention matmul", who, refusal, C / NH); }
    for (int i = 0; i < n; i++) {
        const FlashAccess* a = &accesses[i];
        if ((uintptr_t)a->ptr % a->align != 0) {
            fail("%s: %s (%p) is not %zu-byte aligned, which the kernels' %s need\n  hint: carve activations at "
                 "16-byte multiples", who, a->name, a->ptr, a->align, a->by);
        }
    }
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

// The two designs, a launcher for each pass (flash_attention_*_cuda pick; the dev/cuda test runs
// and times both, so a template argument: the trainer compiles only the one it runs):
//   FLASH_TILES_IN_SHARED: S, P (and the forward's O) go through shared memory between tile
//     products (warp_tile_mma: wmma for bf16, CUDA cores for fp32). The fp32 path: mma.sync has no
//     fp32 inputs, and this is the simplest correct kernel for the precision that is the CPU
//     comparison's.
//   FLASH_TILES_IN_REGISTERS: FlashAttention-2 on mma.sync (bf16 only): flash2_*_kernel.
enum FlashDesign { FLASH_TILES_IN_SHARED, FLASH_TILES_IN_REGISTERS };

// the design each precision runs
template <typename floatX>
constexpr FlashDesign flash_design() {
    return std::is_same<floatX, __nv_bfloat16>::value ? FLASH_TILES_IN_REGISTERS : FLASH_TILES_IN_SHARED;
}

// tiles in registers (mma.sync, cp.async: cuda/ptx.cuh) run on sm_80 and newer; built for an older
// GPU their kernels trap, so they are refused here first
static void flash2_check_gpu(const char* who) {
    const char* why = ptx_refusal();
    if (why != NULL) {
        fail("%s in bf16: %s\n  hint: --precision fp32 (its flash attention, on CUDA cores, runs on such a GPU)", who, why);
    }
}

template <FlashDesign DESIGN, typename floatX>
static void flash_forward_launch(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, cudaStream_t stream) {
    static_assert(DESIGN == FLASH_TILES_IN_SHARED || std::is_same<floatX, __nv_bfloat16>::value,
                  "tiles in registers (mma.sync) run bf16 only");
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    if constexpr (DESIGN == FLASH_TILES_IN_REGISTERS) {
        flash2_check_gpu("flash attention forward");
        size_t bytes = flash2_forward_smem_bytes(hs);
        dim3 grid(ceil_div(T, FLASH2_BR), B * NH);
        flash_with_head_size(hs, [&](auto head) {
            constexpr int HS = decltype(head)::value;
            flash_prepare(flash2_forward_kernel<HS>, bytes, "flash attention forward");
            flash2_forward_kernel<HS><<<grid, FLASH2_WARPS * WARP_SIZE, bytes, stream>>>(out, lse, qkv, T, C, NH,
                                                                                       scale * PTX_LOG2E);
            CUDA_CHECK_LAUNCH();
        });
    } else {
        size_t bytes = flash_smem_bytes<floatX>(hs, false);
        dim3 grid(ceil_div(T, FLASH_TILE), B * NH);
        flash_with_head_size(hs, [&](auto head) {
            constexpr int HS = decltype(head)::value;
            flash_prepare(flash_forward_kernel<floatX, HS>, bytes, "flash attention forward");
            flash_forward_kernel<floatX, HS><<<grid, FLASH_WARPS * WARP_SIZE, bytes, stream>>>(out, lse, qkv, T, C, NH, scale);
            CUDA_CHECK_LAUNCH();
        });
    }
}

// scratch: D, flash_attention_scratch_floats(B, T, NH) floats
template <FlashDesign DESIGN, typename floatX>
static void flash_backward_launch(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                                  int B, int T, int C, int NH, float* scratch, cudaStream_t stream) {
    static_assert(DESIGN == FLASH_TILES_IN_SHARED || std::is_same<floatX, __nv_bfloat16>::value,
                  "tiles in registers (mma.sync) run bf16 only");
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t rows = (size_t)B * NH * T;
    if constexpr (DESIGN == FLASH_TILES_IN_REGISTERS) { flash2_check_gpu("flash attention backward"); }
    flash_backward_dot_kernel<floatX><<<(unsigned)ceil_div(rows, (size_t)FLASH_D_BLOCK), FLASH_D_BLOCK, 0, stream>>>(
        scratch, dout, out, B, T, C, NH);
    CUDA_CHECK_LAUNCH();
    if constexpr (DESIGN == FLASH_TILES_IN_REGISTERS) {
        size_t dkdv_bytes = flash2_backward_smem_bytes(hs, true), dq_bytes = flash2_backward_smem_bytes(hs, false);
        dim3 grid(ceil_div(T, FLASH2_BR), B * NH);
        flash_with_head_size(hs, [&](auto head) {
            constexpr int HS = decltype(head)::value;
            flash_prepare(flash2_backward_dkdv_kernel<HS>, dkdv_bytes, "flash attention backward");
            flash_prepare(flash2_backward_dq_kernel<HS>, dq_bytes, "flash attention backward");
            flash2_backward_dkdv_kernel<HS><<<grid, FLASH2_WARPS * WARP_SIZE, dkdv_bytes, stream>>>(dqkv, dout, qkv, lse,
                                                                                                  scratch, T, C, NH, scale);
            CUDA_CHECK_LAUNCH();
            flash2_backward_dq_kernel<HS><<<grid, FLASH2_WARPS * WARP_SIZE, dq_bytes, stream>>>(dqkv, dout, qkv, lse, scratch,
                                                                                              T, C, NH, scale);
            CUDA_CHECK_LAUNCH();
        });
    } else {
        size_t bytes = flash_smem_bytes<floatX>(hs, true);
        dim3 grid(ceil_div(T, FLASH_TILE), B * NH);
        flash_with_head_size(hs, [&](auto head) {
            constexpr int HS = decltype(head)::value;
            flash_prepare(flash_backward_dkdv_kernel<floatX, HS>, bytes, "flash attention backward");
            flash_prepare(flash_backward_dq_kernel<floatX, HS>, bytes, "flash attention backward");
            flash_backward_dkdv_kernel<floatX, HS><<<grid, FLASH_WARPS * WARP_SIZE, bytes, stream>>>(dqkv, dout, qkv, lse,
                                                                                                    scratch, T, C, NH, scale);
            CUDA_CHECK_LAUNCH();
            flash_backward_dq_kernel<floatX, HS><<<grid, FLASH_WARPS * WARP_SIZE, bytes, stream>>>(dqkv, dout, qkv, lse, scratch,
                                                                                                  T, C, NH, scale);
            CUDA_CHECK_LAUNCH();
        });
    }
}

// out (B,T,C) = causal attention of qkv (B,T,3C); lse (B,NH,T) the rows' log-sum-exp (fp32)
template <typename floatX>
void flash_attention_forward_cuda(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, cudaStream_t stream) {
    prof_kernel(stream, PROF_ATTENTION_FORWARD, prof_attention_forward(B, T, C, sizeof(floatX)), "flash");
    FlashAccess wide[] = {{"qkv", qkv, FLASH_WIDE_ALIGN, FLASH_WIDE_READS}, {"out", out, flash_store_align<floatX>(), "stores"}};
    flash_check("flash_attention_forward_cuda", C, NH, wide, 2);
    if (B * T == 0) { return; }
    flash_forward_launch<flash_design<floatX>()>(out, lse, qkv, B, T, C, NH, stream);
}

// dqkv (B,T,3C) = the gradient of the attention given dout (B,T,C), and the forward's qkv, out and
// lse; scratch: flash_attention_scratch_floats(B, T, NH) floats
template <typename floatX>
void flash_attention_backward_cuda(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                                   int B, int T, int C, int NH, float* scratch, cudaStream_t stream) {
    prof_kernel(stream, PROF_ATTENTION_BACKWARD, prof_attention_backward(B, T, C, sizeof(floatX)), "flash");
    FlashAccess wide[] = {{"qkv", qkv, FLASH_WIDE_ALIGN, FLASH_WIDE_READS}, {"dout", dout, FLASH_WIDE_ALIGN, FLASH_WIDE_READS},
                          {"dqkv", dqkv, flash_store_align<floatX>(), "stores"}};
    flash_check("flash_attention_backward_cuda", C, NH, wide, 3);
    if (B * T == 0) { return; }
    flash_backward_launch<flash_design<floatX>()>(dqkv, dout, qkv, out, lse, B, T, C, NH, scratch, stream);
}

#endif // CUDA_FLASH_ATTENTION_CUH
