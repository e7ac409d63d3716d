/*
layernorm.cuh: LayerNorm on the device, mirroring layernorm_forward/backward of cpu/layers.h.

    layernorm_forward_cuda<floatX>(out, mean, rstd, inp, weight, bias, B, T, C, stream);   // out, mean, rstd =
    residual_layernorm_forward_cuda<floatX>(res, out, mean, rstd, a, b, weight, bias, B, T, C, stream);  // res = a + b, then its LN
    float* scratch;  // layernorm_backward_scratch_floats(B, T, C) floats, contents not kept
    layernorm_backward_cuda<floatX>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C, scratch, stream);
                                                          // dinp +=, dweight +=, dbias += (dbias may be NULL)

Invariants: the forward takes one warp per row (B*T rows of C); the backward spreads a row's
columns over up to 16 warps and cuts the rows into blocks by B*T (layernorm_backward_launch).
mean and rstd are fp32 (B,T); dweight and dbias are fp32 and summed in a fixed order: each block
writes its column sums into scratch, and a second kernel adds the blocks' sums in a fixed tree
(so results are bitwise reproducible, and independent of the GPU). Any C up to what shared memory
holds for one row group (2 C floats, C <= 29,000 on an H100, opting in above 48 KiB; checked).
*/
#ifndef CUDA_LAYERNORM_CUH
#define CUDA_LAYERNORM_CUH

#include "common.cuh"
#include "profile.cuh"  // --profile: a launcher marks its range on the compute stream (prof_kernel)
#include "../llmc/model_config.h"  // LAYERNORM_EPS: the model's, one epsilon for both backends

#define LAYERNORM_FORWARD_WARPS 4        // rows per block of the forward
#define LAYERNORM_BACKWARD_BLOCKS 512     // blocks the backward aims at (about 4 per SM of a 132-SM H100)
#define LAYERNORM_BACKWARD_MIN_ROWS 8     // rows per block at least (its 2 C partial sums against 4 C per row)
#define LAYERNORM_BACKWARD_MAX_WARPS 16   // warps that share one row's columns
#define LAYERNORM_BACKWARD_BLOCK_WARPS 16 // warps per block the row groups fill (at least one group)
#define LAYERNORM_SMEM_DEFAULT (48 * 1024)  // dynamic shared memory without opting in

// ----------------------------------------------------------------------------
// CUDA kernels

// out (C) = (x - mean) * rstd * weight (C) + bias (C) for one row x (C); mean, rstd saved (fp32) by
// lane 0. One warp, three passes over the row (sum, squared deviations, output; the second and
// third hit the cache); each lane reads the packs lane, lane + 32, ... of x
template <typename floatX>
__device__ inline void layernorm_row(floatX* out, float* mean, float* rstd, const floatX* x, const floatX* weight,
                                     const floatX* bias, int C, bool vector) {
    const int VEC = Packed128<floatX>::size;
    int lane = threadIdx.x % WARP_SIZE;
    float sum = 0.0f;
    for (int c = lane * VEC; c < C; c += WARP_SIZE * VEC) {
        Packed128<floatX> xp = load_pack(x, c, C, vector);  // zeros past C
        for (int k = 0; k < VEC; k++) { sum += to_float(xp[k]); }
    }
    float m = warp_reduce_sum(sum) / C;

    float var = 0.0f;
    for (int c = lane * VEC; c < C; c += WARP_SIZE * VEC) {
        Packed128<floatX> xp = load_pack(x, c, C, vector);
        for (int k = 0; k < VEC && c + k < C; k++) {
            float d = to_float(xp[k]) - m;
            var += d * d;
        }
    }
    float s = 1.0f / sqrtf(warp_reduce_sum(var) / C + LAYERNORM_EPS);

    for (int c = lane * VEC; c < C; c += WARP_SIZE * VEC) {
        Packed128<floatX> xp = load_pack(x, c, C, vector);
        Packed128<floatX> wp = load_pack(weight, c, C, vector), bp = load_pack(bias, c, C, vector);
        Packed128<floatX> o;
        for (int k = 0; k < VEC; k++) {
            o[k] = from_float<floatX>((to_float(xp[k]) - m) * s * to_float(wp[k]) + to_float(bp[k]));
        }
        store_pack(out, c, C, vector, o);
    }
    if (lane == 0) {
        *mean = m;
        *rstd = s;
    }
}

// out (N,C) = (inp - mean) * rstd * weight (C) + bias (C), N = B*T rows; mean, rstd (N) saved (fp32).
// One warp per row. bytes: 2 N*C + 2 C floatX + 2 N fp32; FLOPs: about 7 N*C
template <typename floatX>
__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C, bool vector) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) { return; }  // the whole warp leaves together: no shuffle misses a lane
    size_t at = (size_t)row * C;
    layernorm_row(out + at, mean + row, rstd + row, inp + at, weight, bias, C, vector);
}

// residual (N,C) = a + b (rounded to floatX, as residual_forward_cuda), then out, mean, rstd = the
// LayerNorm of that residual, as layernorm_forward_kernel: bitwise the two kernels' results, but the
// residual stream is read once (each lane reads back only the packs it wrote, from its cache).
// residual may be a or b. bytes: 4 N*C + 2 C floatX + 2 N fp32; FLOPs: about 8 N*C
template <typename floatX>
__global__ void residual_layernorm_forward_kernel(floatX* residual, floatX* out, float* mean, float* rstd,
                                                  const floatX* a, const floatX* b, const floatX* weight,
                                                  const floatX* bias, int N, int C, bool vector) {
    const int VEC = Packed128<floatX>::size;
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) { return; }
    size_t at = (size_t)row * C;
    for (int c = lane * VEC; c < C; c += WARP_SIZE * VEC) {
        Packed128<floatX> ap = load_pack(a + at, c, C, vector), bp = load_pack(b + at, c, C, vector), r;
        for (int k = 0; k < VEC; k++) { r[k] = from_float<floatX>(to_float(ap[k]) + to_float(bp[k])); }
        store_pack(residual + at, c, C, vector, r);
    }
    layernorm_row(out + at, mean + row, rstd + row, residual + at, weight, bias, C, vector);
}

// dinp (N,C) += from dout (N,C); the block's column sums of norm * dout and of dout into
// partials (gridDim.x, 2, C): [block][0] for dweight, [block][1] for dbias.
// Block b owns rows [b*rows, (b+1)*rows). Its warps form `groups` row groups of group_warps warps:
// group g takes rows g, g + groups, ... of the block's, in order, and its threads spread each row's
// columns among them (thread j of the group owns packs j, j + group threads, ...), so a wide row
// keeps many warps busy. The two means a row's gradient needs are summed over the group's warps
// through shared memory, in warp order. Each thread adds its columns' norm * dout and dout into
// the group's accumulators in shared memory (2 C floats per group, rounded up to whole packs;
// column c = p*VEC + k is stored at k*P + p, so that the lanes of a warp touch consecutive words);
// at the end the groups' sums are added in group order. The order of every sum depends on
// (rows, groups, group_warps) alone, which the launcher derives from N and C, not from the GPU.
// bytes: 3 N*C floatX (inp, dout, dinp read) + N*C floatX written + 2 N fp32 + 2 C per block;
// FLOPs: about 14 N*C
template <typename floatX>
__global__ void layernorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd, int N, int C,
                                          int rows, int group_warps, bool vector) {
    extern __shared__ float smem[];  // (groups, 2, VEC, P) column sums; then (groups, group_warps, 2) row sums
    const int VEC = Packed128<floatX>::size;
    int P = ceil_div(C, VEC);  // packs per row
    int group_threads = group_warps * WARP_SIZE, groups = blockDim.x / group_threads;
    int g = threadIdx.x / group_threads, j = threadIdx.x % group_threads;
    int lane = threadIdx.x % WARP_SIZE, warp = j / WARP_SIZE;
    float* dw_acc = smem + (size_t)g * 2 * VEC * P;
    float* db_acc = dw_acc + (size_t)VEC * P;
    float* row_sums = smem + (size_t)groups * 2 * VEC * P + (size_t)g * group_warps * 2;
    for (int p = j; p < P; p += group_threads) {  // each thread zeroes the columns it will own
        for (int k = 0; k < VEC; k++) {
            dw_acc[k * P + p] = 0.0f;
            db_acc[k * P + p] = 0.0f;
        }
    }

    int first = blockIdx.x * rows, end = min(N, first + rows);
    for (int base = first; base < end; base += groups) {  // every group reaches every barrier
        int row = base + g;
        bool active = row < end;
        const floatX* x = inp + (size_t)row * C;
        const floatX* dy = dout + (size_t)row * C;
        float m = active ? mean[row] : 0.0f, s = active ? rstd[row] : 0.0f;
        // the two means that the normalisation feeds back through
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int p = j; active && p < P; p += group_threads) {
            int c = p * VEC;
            Packed128<floatX> xp = load_pack(x, c, C, vector), dyp = load_pack(dy, c, C, vector);
            Packed128<floatX> wp = load_pack(weight, c, C, vector);
            for (int k = 0; k < VEC; k++) {  // zeros past C add nothing
                float dnorm = to_float(wp[k]) * to_float(dyp[k]);
                dnorm_mean += dnorm;
                dnorm_norm_mean += dnorm * (to_float(xp[k]) - m) * s;
            }
        }
        dnorm_mean = warp_reduce_sum(dnorm_mean);
        dnorm_norm_mean = warp_reduce_sum(dnorm_norm_mean);
        if (lane == 0) {
            row_sums[2 * warp] = dnorm_mean;
            row_sums[2 * warp + 1] = dnorm_norm_mean;
        }
        __syncthreads();
        dnorm_mean = 0.0f;
        dnorm_norm_mean = 0.0f;
        for (int w = 0; w < group_warps; w++) {
            dnorm_mean += row_sums[2 * w];
            dnorm_norm_mean += row_sums[2 * w + 1];
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int p = j; active && p < P; p += group_threads) {
            int c = p * VEC;
            Packed128<floatX> xp = load_pack(x, c, C, vector), dyp = load_pack(dy, c, C, vector);
            Packed128<floatX> wp = load_pack(weight, c, C, vector);
            Packed128<floatX> dxp = load_pack(dinp + (size_t)row * C, c, C, vector);
            for (int k = 0; k < VEC && c + k < C; k++) {
                float norm = (to_float(xp[k]) - m) * s;
                float dyk = to_float(dyp[k]);
                float dnorm = to_float(wp[k]) * dyk;
                dxp[k] = from_float<floatX>(to_float(dxp[k]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
                dw_acc[k * P + p] += norm * dyk;
                db_acc[k * P + p] += dyk;
            }
            store_pack(dinp + (size_t)row * C, c, C, vector, dxp);
        }
        __syncthreads();  // row_sums is written again for the next row
    }
    float* out = partials + (size_t)blockIdx.x * 2 * C;
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) {
        int part = i / C, c = i % C;  // part 0: dweight, 1: dbias
        size_t at = ((size_t)part * VEC + c % VEC) * P + c / VEC;
        float sum = 0.0f;
        for (int q = 0; q < groups; q++) { sum += smem[(size_t)q * 2 * VEC * P + at]; }
        out[i] = sum;
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// out (B,T,C) = (x - mean) * rstd * w (C) + b (C); saves mean, rstd (B,T) for backward
template <typename floatX>
void layernorm_forward_cuda(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                            const floatX* bias, int B, int T, int C, cudaStream_t stream) {
    prof_kernel(stream, PROF_LAYERNORM, prof_layernorm_forward((size_t)B * T, C, sizeof(floatX)), "forward");
    int N = B * T;
    if (N == 0) { return; }
    const int VEC = Packed128<floatX>::size;
    bool vector = C % VEC == 0 && is_aligned16(out) && is_aligned16(inp) && is_aligned16(weight) && is_aligned16(bias);
    layernorm_forward_kernel<floatX><<<ceil_div(N, LAYERNORM_FORWARD_WARPS), LAYERNORM_FORWARD_WARPS * WARP_SIZE, 0,
                                       stream>>>(out, mean, rstd, inp, weight, bias, N, C, vector);
    CUDA_CHECK_LAUNCH();
}

// residual (B,T,C) = a + b; out (B,T,C) = its LayerNorm with w (C), b (C); mean, rstd (B,T) saved.
// The same results as residual_forward_cuda then layernorm_forward_cuda, bit for bit, in one pass
// over the residual stream; residual may be a or b
template <typename floatX>
void residual_layernorm_forward_cuda(floatX* residual, floatX* out, float* mean, float* rstd, const floatX* a,
                                     const floatX* b, const floatX* weight, const floatX* bias, int B, int T, int C,
                                     cudaStream_t stream) {
    prof_kernel(stream, PROF_LAYERNORM, prof_residual_layernorm_forward((size_t)B * T, C, sizeof(floatX)), "forward, fused with the residual");
    int N = B * T;
    if (N == 0) { return; }
    const int VEC = Packed128<floatX>::size;
    bool vector = C % VEC == 0 && is_aligned16(residual) && is_aligned16(out) && is_aligned16(a) && is_aligned16(b) &&
                  is_aligned16(weight) && is_aligned16(bias);
    residual_layernorm_forward_kernel<floatX><<<ceil_div(N, LAYERNORM_FORWARD_WARPS), LAYERNORM_FORWARD_WARPS * WARP_SIZE,
                                                0, stream>>>(residual, out, mean, rstd, a, b, weight, bias, N, C, vector);
    CUDA_CHECK_LAUNCH();
}

// how layernorm_backward_kernel is launched for (N, C): rows per block from N (about
// LAYERNORM_BACKWARD_BLOCKS blocks, at least LAYERNORM_BACKWARD_MIN_ROWS rows each, so that a
// block's 2 C partial sums are small beside the rows it reads), a row's packs spread over up to
// LAYERNORM_BACKWARD_MAX_WARPS warps, and as many row groups as fill LAYERNORM_BACKWARD_BLOCK_WARPS.
// It depends on N, C and the storage type's vector width alone (not on the GPU), and so do the
// order of the sums and the results.
typedef struct { int rows, blocks, group_warps, groups; size_t smem; } LayerNormBackwardLaunch;

static LayerNormBackwardLaunch layernorm_backward_launch(int N, int C, int vec) {
    LayerNormBackwardLaunch l;
    l.rows = ceil_div(N, LAYERNORM_BACKWARD_BLOCKS);
    if (l.rows < LAYERNORM_BACKWARD_MIN_ROWS) { l.rows = LAYERNORM_BACKWARD_MIN_ROWS; }
    l.blocks = ceil_div(N, l.rows);
    int packs = ceil_div(C, vec);
    l.group_warps = ceil_div(packs, WARP_SIZE);
    if (l.group_warps > LAYERNORM_BACKWARD_MAX_WARPS) { l.group_warps = LAYERNORM_BACKWARD_MAX_WARPS; }
    l.groups = LAYERNORM_BACKWARD_BLOCK_WARPS / l.group_warps;
    if (l.groups < 1) { l.groups = 1; }
    if (l.groups > l.rows) { l.groups = l.rows; }
    l.smem = (size_t)l.groups * (2 * (size_t)packs * vec + 2 * (size_t)l.group_warps) * sizeof(float);
    return l;
}

// the scratch layernorm_backward_cuda needs: 2 C floats per block (the blocks depend on N only)
static size_t layernorm_backward_scratch_floats(int B, int T, int C) {
    return (size_t)layernorm_backward_launch(B * T, C, 1).blocks * 2 * C;
}

// dinp (B,T,C) +=, dweight (C) +=, dbias (C) += from dout (B,T,C); dweight and dbias fp32, dbias may
// be NULL; scratch: layernorm_backward_scratch_floats(B, T, C) floats
template <typename floatX>
void layernorm_backward_cuda(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                             const floatX* weight, const float* mean, const float* rstd, int B, int T, int C,
                             float* scratch, cudaStream_t stream) {
    prof_kernel(stream, PROF_LAYERNORM, prof_layernorm_backward((size_t)B * T, C, sizeof(floatX)), "backward");
    int N = B * T;
    if (N == 0 || C == 0) { return; }
    const int VEC = Packed128<floatX>::size;
    LayerNormBackwardLaunch l = layernorm_backward_launch(N, C, VEC);
    if (l.smem > LAYERNORM_SMEM_DEFAULT) {  // a wide row: opt into the GPU's larger shared memory
        int device, optin;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        if (l.smem > (size_t)optin) {
            fail("layernorm_backward_cuda: C=%d needs %zu bytes of shared memory per block, the GPU has %d\n"
                 "  hint: the kernel keeps 2 C fp32 column sums per row group; C above %d needs a kernel that tiles C",
                 C, l.smem, optin, (int)(optin / (2 * sizeof(float))) - 2 * LAYERNORM_BACKWARD_MAX_WARPS);
        }
        CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<floatX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)l.smem));
    }
    bool vector = C % VEC == 0 && is_aligned16(dinp) && is_aligned16(dout) && is_aligned16(inp) && is_aligned16(weight);
    layernorm_backward_kernel<floatX><<<l.blocks, l.groups * l.group_warps * WARP_SIZE, l.smem, stream>>>(
        dinp, scratch, dout, inp, weight, mean, rstd, N, C, l.rows, l.group_warps, vector);
    CUDA_CHECK_LAUNCH();
    add_partial_sums_cuda(dweight, scratch, l.blocks, C, 2 * (size_t)C, stream);
    if (dbias != NULL) { add_partial_sums_cuda(dbias, scratch + C, l.blocks, C, 2 * (size_t)C, stream); }
}

#endif // CUDA_LAYERNORM_CUH
