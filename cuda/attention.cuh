/*
attention.cuh: causal self-attention on the device, mirroring attention_weights_forward,
attention_forward and attention_backward of cpu/layers.h: batched GEMMs through cuBLASLt
(matmul_lt of matmul.cuh, one batch per (b, h)) around a fused causal softmax kernel.

    floatX* scratch;  // attention_scratch_floats(B, T, C, NH) elements of floatX, contents not kept
    attention_weights_forward_cuda<floatX>(att, qkv, B, T, C, NH, scratch, &mm, stream);   // att =
    attention_forward_cuda<floatX>(out, att, qkv, B, T, C, NH, scratch, &mm, stream);      // out =, att =
    attention_backward_cuda<floatX>(dqkv, datt, dout, qkv, att, B, T, C, NH, scratch, &mm, stream);  // dqkv +=

Layout: qkv (B,T,3C) holds q, k, v side by side, each split into NH heads of hs = C/NH (as on the
CPU); att and datt are (B,NH,T,T), row t of a head zero after t. The GEMMs want each head's
(T,hs) matrix contiguous, so q, k, v (and in backward dout) are first copied into the scratch as
(B,NH,T,hs); four such slots of B*T*C elements make the scratch, reused as the GEMMs' outputs.
The scores are computed for the whole T x T square (the upper half is then overwritten: zeros
in att, zeros in the gradient of the scores), which keeps the GEMMs plain; the scale
1/sqrt(hs) is the GEMM's alpha in forward and folded into the softmax backward.

Invariants: fp32 accumulation in every GEMM and reduction; att is stored in floatX (the scores
too, before the softmax reads them back). No atomics: each output element has one writer, so
results are bitwise reproducible. NH must divide C.
*/
#ifndef CUDA_ATTENTION_CUH
#define CUDA_ATTENTION_CUH

#include <math.h>
#include "common.cuh"
#include "profile.cuh"  // --profile: a launcher marks its range on the compute stream (prof_kernel)
#include "matmul.cuh"

#define ATTENTION_BLOCK 256          // threads per block of the copy kernels
#define ATTENTION_SOFTMAX_WARPS 4    // rows per block of the softmax kernels (one warp each)
#define ATTENTION_SCRATCH_SLOTS 4    // (B,NH,T,hs) slots: q, k, v, dout (backward)

// ----------------------------------------------------------------------------
// CUDA kernels

// dst[p] (B,NH,T,hs) = part p of src (B,T,parts,NH,hs) for p < parts, slots B*T*C apart: the heads of
// q, k, v (parts = 3, src = qkv) or of dout (parts = 1). One thread per pack of a head's row.
// bytes: 2 parts*B*T*C floatX; FLOPs: none
template <typename floatX>
__global__ void attention_split_heads_kernel(floatX* dst, const floatX* src, int B, int T, int NH, int hs, int parts,
                                             bool vector) {
    const int VEC = Packed128<floatX>::size;
    int packs = ceil_div(hs, VEC), C = NH * hs;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (part, b, h, t, pack)
    if (idx >= (size_t)parts * B * NH * T * packs) { return; }
    int i = (int)(idx % packs) * VEC;
    size_t row = idx / packs;  // (part, b, h, t)
    int t = (int)(row % T), h = (int)(row / T % NH), b = (int)(row / T / NH % B), part = (int)(row / T / NH / B);
    const floatX* from = src + ((size_t)b * T + t) * parts * C + (size_t)part * C + (size_t)h * hs;
    floatX* to = dst + (size_t)part * B * T * C + (((size_t)b * NH + h) * T + t) * hs;
    store_pack(to, i, hs, vector, load_pack(from, i, hs, vector));
}

// out (B,T,C) = (or +=, when accumulate) part of y (B,NH,T,hs): the heads concatenated back.
// One thread per pack of a head's row. bytes: 2 (3 when accumulating) B*T*C floatX; FLOPs: B*T*C or none
template <typename floatX>
__global__ void attention_merge_heads_kernel(floatX* out, int out_stride, const floatX* y, int B, int T, int NH, int hs,
                                             bool accumulate, bool vector) {
    const int VEC = Packed128<floatX>::size;
    int packs = ceil_div(hs, VEC);
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (b, t, h, pack): writes in out's order
    if (idx >= (size_t)B * T * NH * packs) { return; }
    int i = (int)(idx % packs) * VEC;
    size_t row = idx / packs;  // (b, t, h)
    int h = (int)(row % NH), t = (int)(row / NH % T), b = (int)(row / NH / T);
    const floatX* from = y + (((size_t)b * NH + h) * T + t) * hs;
    floatX* to = out + ((size_t)b * T + t) * out_stride + (size_t)h * hs;
    Packed128<floatX> v = load_pack(from, i, hs, vector);
    if (accumulate) {
        Packed128<floatX> o = load_pack(to, i, hs, vector);
        for (int k = 0; k < VEC; k++) { v[k] = from_float<floatX>(to_float(o[k]) + to_float(v[k])); }
    }
    store_pack(to, i, hs, vector, v);
}

// att (rows = B*NH*T, T) in place: row t of each head becomes the softmax of its scores 0..t, zero
// after t. One warp per row: an online max and sum per lane, merged across the warp, then the
// row written. bytes: 2 rows*T floatX (read the causal half, write all); FLOPs: about 3 rows*T*T/2
// plus as many exp
template <typename floatX>
__global__ void attention_softmax_forward_kernel(floatX* att, int rows, int T, bool vector) {
    const int VEC = Packed128<floatX>::size;
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) { return; }  // the whole warp leaves together
    int t = row % T, n = t + 1;   // the causal entries 0..t
    floatX* a = att + (size_t)row * T;
    float m = -INFINITY, s = 0.0f;
    for (int u = lane * VEC; u < n; u += WARP_SIZE * VEC) {
        Packed128<floatX> x = load_pack(a, u, T, vector);
        for (int k = 0; k < VEC && u + k < n; k++) { softmax_add(m, s, to_float(x[k])); }
    }
    warp_softmax_merge(m, s);
    float inv = 1.0f / s;
    for (int u = lane * VEC; u < T; u += WARP_SIZE * VEC) {
        Packed128<floatX> x = load_pack(a, u, T, vector);
        for (int k = 0; k < VEC; k++) { x[k] = from_float<floatX>(u + k < n ? expf(to_float(x[k]) - m) * inv : 0.0f); }
        store_pack(a, u, T, vector, x);
    }
}

// datt (rows, T) in place: the gradient of the scaled scores, datt[u] = att[u] (datt[u] - sum_j att[j]
// datt[j]) * scale for u <= t, zero after t. One warp per row. bytes: 3 rows*T floatX; FLOPs: about
// 5 rows*T*T/2
template <typename floatX>
__global__ void attention_softmax_backward_kernel(floatX* datt, const floatX* att, int rows, int T, float scale,
                                                  bool vector) {
    const int VEC = Packed128<floatX>::size;
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) { return; }
    int t = row % T, n = t + 1;
    floatX* da = datt + (size_t)row * T;
    const floatX* a = att + (size_t)row * T;
    float dot = 0.0f;
    for (int u = lane * VEC; u < n; u += WARP_SIZE * VEC) {
        Packed128<floatX> ap = load_pack(a, u, T, vector), dp = load_pack(da, u, T, vector);
        for (int k = 0; k < VEC && u + k < n; k++) { dot += to_float(ap[k]) * to_float(dp[k]); }
    }
    dot = warp_reduce_sum(dot);
    for (int u = lane * VEC; u < T; u += WARP_SIZE * VEC) {
        Packed128<floatX> ap = load_pack(a, u, T, vector), dp = load_pack(da, u, T, vector);
        for (int k = 0; k < VEC; k++) {
            float g = to_float(ap[k]) * (to_float(dp[k]) - dot) * scale;
            dp[k] = from_float<floatX>(u + k < n ? g : 0.0f);
        }
        store_pack(da, u, T, vector, dp);
    }
}

// ----------------------------------------------------------------------------
// kernel launchers and their steps

// the scratch the attention launchers need, in elements of floatX: ATTENTION_SCRATCH_SLOTS slots of
// (B,NH,T,hs) = B*T*C
static size_t attention_scratch_floats(int B, int T, int C, int NH) {
    (void)NH;
    return (size_t)ATTENTION_SCRATCH_SLOTS * B * T * C;
}

static void attention_check_heads(const char* who, int C, int NH) {
    if (NH < 1 || C % NH != 0) {
        fail("%s: C=%d is not divisible by NH=%d\n  hint: heads must split the channels evenly", who, C, NH);
    }
}

template <typename floatX>
static void attention_split_heads(floatX* dst, const floatX* src, int B, int T, int C, int NH, int parts,
                                  cudaStream_t stream) {
    const int VEC = Packed128<floatX>::size;
    int hs = C / NH;
    bool vector = hs % VEC == 0 && is_aligned16(dst) && is_aligned16(src);
    size_t threads = (size_t)parts * B * NH * T * ceil_div(hs, VEC);
    attention_split_heads_kernel<floatX><<<(unsigned)ceil_div(threads, (size_t)ATTENTION_BLOCK), ATTENTION_BLOCK, 0,
                                           stream>>>(dst, src, B, T, NH, hs, parts, vector);
    CUDA_CHECK_LAUNCH();
}

template <typename floatX>
static void attention_merge_heads(floatX* out, int out_stride, const floatX* y, int B, int T, int C, int NH,
                                  bool accumulate, cudaStream_t stream) {
    const int VEC = Packed128<floatX>::size;
    int hs = C / NH;
    bool vector = hs % VEC == 0 && out_stride % VEC == 0 && is_aligned16(out) && is_aligned16(y);
    size_t threads = (size_t)B * T * NH * ceil_div(hs, VEC);
    attention_merge_heads_kernel<floatX><<<(unsigned)ceil_div(threads, (size_t)ATTENTION_BLOCK), ATTENTION_BLOCK, 0,
                                           stream>>>(out, out_stride, y, B, T, NH, hs, accumulate, vector);
    CUDA_CHECK_LAUNCH();
}

// att (B,NH,T,T) writes the attention weights softmax(q k^T / sqrt(hs), causal), zero after t, from
// qkv (B,T,3C); as cpu attention_weights_forward (what --recompute attn runs again in backward).
// scratch: attention_scratch_floats(B, T, C, NH) elements; on return its slots 0..2 hold q, k, v
// as (B,NH,T,hs) (attention_forward_cuda uses them)
template <typename floatX>
void attention_weights_forward_cuda(floatX* att, const floatX* qkv, int B, int T, int C, int NH, floatX* scratch,
                                    const MatmulContext* ctx, cudaStream_t stream) {
    attention_check_heads("attention_weights_forward_cuda", C, NH);
    if (B * T == 0) { return; }
    int hs = C / NH, BNH = B * NH;
    size_t slot = (size_t)B * T * C;
    floatX *q = scratch, *k = scratch + slot;
    attention_split_heads(scratch, qkv, B, T, C, NH, 3, stream);
    // column-major per head: scores^T (T_k,T_q) = op_T(k) (T_k,hs) @ q (hs,T_q), times 1/sqrt(hs)
    cudaDataType type = cuda_data_type<floatX>();
    long long head = (long long)T * hs, square = (long long)T * T;
    matmul_lt(ctx, true, false, T, T, hs, 1.0f / sqrtf((float)hs), k, hs, head, q, hs, head, 0.0f, att, T, square, BNH,
              type, type, NULL, stream);
    const int VEC = Packed128<floatX>::size;
    bool vector = T % VEC == 0 && is_aligned16(att);
    int rows = BNH * T;
    attention_softmax_forward_kernel<floatX><<<ceil_div(rows, ATTENTION_SOFTMAX_WARPS),
                                               ATTENTION_SOFTMAX_WARPS * WARP_SIZE, 0, stream>>>(att, rows, T, vector);
    CUDA_CHECK_LAUNCH();
}

// out (B,T,C) = att v, heads concatenated; att (B,NH,T,T) writes the attention weights, which
// backward needs; scratch: attention_scratch_floats(B, T, C, NH) elements
template <typename floatX>
void attention_forward_cuda(floatX* out, floatX* att, const floatX* qkv, int B, int T, int C, int NH, floatX* scratch,
                            const MatmulContext* ctx, cudaStream_t stream) {
    prof_kernel(stream, PROF_ATTENTION_FORWARD, prof_attention_forward(B, T, C, sizeof(floatX)), "matmul");
    attention_weights_forward_cuda(att, qkv, B, T, C, NH, scratch, ctx, stream);
    if (B * T == 0) { return; }
    int hs = C / NH;
    size_t slot = (size_t)B * T * C;
    floatX *y = scratch, *v = scratch + 2 * slot;  // y replaces q, no longer needed
    // column-major per head: y^T (hs,T_q) = v^T (hs,T_k) @ att^T (T_k,T_q)
    cudaDataType type = cuda_data_type<floatX>();
    long long head = (long long)T * hs, square = (long long)T * T;
    matmul_lt(ctx, false, false, hs, T, T, 1.0f, v, hs, head, att, T, square, 0.0f, y, hs, head, B * NH, type, type, NULL,
              stream);
    attention_merge_heads(out, C, y, B, T, C, NH, false, stream);
}

// dqkv (B,T,3C) += from dout (B,T,C), given qkv and att (B,NH,T,T) of the forward; datt (B,NH,T,T) is
// scratch (it ends holding the gradient of the scaled scores); scratch: attention_scratch_floats
// (B, T, C, NH) elements
template <typename floatX>
void attention_backward_cuda(floatX* dqkv, floatX* datt, const floatX* dout, const floatX* qkv, const floatX* att,
                             int B, int T, int C, int NH, floatX* scratch, const MatmulContext* ctx, cudaStream_t stream) {
    prof_kernel(stream, PROF_ATTENTION_BACKWARD, prof_attention_backward(B, T, C, sizeof(floatX)), "matmul");
    attention_check_heads("attention_backward_cuda", C, NH);
    if (B * T == 0) { return; }
    int hs = C / NH, BNH = B * NH;
    size_t slot = (size_t)B * T * C;
    floatX *q = scratch, *k = scratch + slot, *v = scratch + 2 * slot, *dy = scratch + 3 * slot;
    attention_split_heads(scratch, qkv, B, T, C, NH, 3, stream);
    attention_split_heads(dy, dout, B, T, C, NH, 1, stream);
    cudaDataType type = cuda_data_type<floatX>();
    long long head = (long long)T * hs, square = (long long)T * T;
    // through the weighted sum of values (column-major per head):
    //   datt^T (T_k,T_q) = op_T(v) (T_k,hs) @ dy^T (hs,T_q)
    matmul_lt(ctx, true, false, T, T, hs, 1.0f, v, hs, head, dy, hs, head, 0.0f, datt, T, square, BNH, type, type, NULL,
              stream);
    //   dv^T (hs,T_k) = dy^T (hs,T_q) @ op_T(att^T) (T_q,T_k), into v's slot
    matmul_lt(ctx, false, true, hs, T, T, 1.0f, dy, hs, head, att, T, square, 0.0f, v, hs, head, BNH, type, type, NULL,
              stream);
    // through the softmax and the scale: datt becomes the gradient of the scores q.k
    const int VEC = Packed128<floatX>::size;
    bool vector = T % VEC == 0 && is_aligned16(att) && is_aligned16(datt);
    int rows = BNH * T;
    attention_softmax_backward_kernel<floatX><<<ceil_div(rows, ATTENTION_SOFTMAX_WARPS),
                                                ATTENTION_SOFTMAX_WARPS * WARP_SIZE, 0, stream>>>(
        datt, att, rows, T, 1.0f / sqrtf((float)hs), vector);
    CUDA_CHECK_LAUNCH();
    // through the scores:
    //   dq^T (hs,T_q) = k^T (hs,T_k) @ datt^T (T_k,T_q), into dy's slot
    matmul_lt(ctx, false, false, hs, T, T, 1.0f, k, hs, head, datt, T, square, 0.0f, dy, hs, head, BNH, type, type, NULL,
              stream);
    //   dk^T (hs,T_k) = q^T (hs,T_q) @ op_T(datt^T) (T_q,T_k), into k's slot
    matmul_lt(ctx, false, true, hs, T, T, 1.0f, q, hs, head, datt, T, square, 0.0f, k, hs, head, BNH, type, type, NULL,
              stream);
    attention_merge_heads(dqkv, 3 * C, dy, B, T, C, NH, true, stream);
    attention_merge_heads(dqkv + C, 3 * C, k, B, T, C, NH, true, stream);
    attention_merge_heads(dqkv + 2 * C, 3 * C, v, B, T, C, NH, true, stream);
}

#endif // CUDA_ATTENTION_CUH
