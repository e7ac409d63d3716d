/*
layernorm.cuh: LayerNorm on the device, mirroring layernorm_forward/backward of cpu/layers.h.

    layernorm_forward_cuda<floatX>(out, mean, rstd, inp, weight, bias, B, T, C, stream);   // out, mean, rstd =
    float* scratch;  // layernorm_backward_scratch_floats(B, T, C) floats, contents not kept
    layernorm_backward_cuda<floatX>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C, scratch, stream);
                                                          // dinp +=, dweight +=, dbias += (dbias may be NULL)

Invariants: one warp per row (B*T rows of C); mean and rstd are fp32 (B,T); dweight and dbias
are fp32 and summed in a fixed order: the rows are cut into blocks of LAYERNORM_BACKWARD_ROWS,
each block writes its column sums into scratch, and a second kernel adds the blocks' sums in
order (so results are bitwise reproducible, and independent of the GPU). Any C up to what
shared memory holds for one warp (2 C floats, C <= 29,000 on an H100; checked).
*/
#ifndef CUDA_LAYERNORM_CUH
#define CUDA_LAYERNORM_CUH

#include "common.cuh"
#include "../llmc/model_config.h"  // LAYERNORM_EPS: the model's, one epsilon for both backends

#define LAYERNORM_FORWARD_WARPS 4        // rows per block of the forward
#define LAYERNORM_BACKWARD_ROWS 32       // rows per block of the backward: the fixed partition of the sums
#define LAYERNORM_BACKWARD_MAX_WARPS 4   // warps per block of the backward, fewer when C is large
#define LAYERNORM_SMEM_DEFAULT (48 * 1024)  // dynamic shared memory without opting in

// ----------------------------------------------------------------------------
// CUDA kernels

// out (N,C) = (inp - mean) * rstd * weight (C) + bias (C), N = B*T rows; mean, rstd (N) saved (fp32).
// One warp per row, three passes over the row (sum, squared deviations, output; the second and
// third hit the cache). bytes: 2 N*C + 2 C floatX + 2 N fp32; FLOPs: about 7 N*C
template <typename floatX>
__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C, bool vector) {
    const int VEC = Packed128<floatX>::size;
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) { return; }  // the whole warp leaves together: no shuffle misses a lane
    const floatX* x = inp + (size_t)row * C;

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
        store_pack(out + (size_t)row * C, c, C, vector, o);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// dinp (N,C) += from dout (N,C); the block's column sums of norm * dout and of dout into
// partials (gridDim.x, 2, C): [block][0] for dweight, [block][1] for dbias.
// Block b owns rows [b*LAYERNORM_BACKWARD_ROWS, ...); its warp w takes rows w, w + warps, ... of
// them in order, each lane adding into its own columns of the warp's accumulators in shared
// memory (2 C floats per warp, rounded up to whole packs; column c = p*VEC + k is stored at k*P + p,
// so that the lanes of a warp touch consecutive words); then the warps' sums are added in warp order.
// bytes: 3 N*C floatX (inp, dout, dinp read) + N*C floatX written + 2 N fp32 + 2 C per block;
// FLOPs: about 14 N*C
template <typename floatX>
__global__ void layernorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd, int N, int C,
                                          bool vector) {
    extern __shared__ float acc[];  // (warps, 2, VEC, P): per warp, column sums of norm * dout, then of dout
    const int VEC = Packed128<floatX>::size;
    int P = ceil_div(C, VEC);  // packs per row
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    float* dw_acc = acc + (size_t)warp * 2 * VEC * P;
    float* db_acc = dw_acc + (size_t)VEC * P;
    for (int c = lane * VEC; c < C; c += WARP_SIZE * VEC) {  // each lane zeroes the columns it will own
        for (int k = 0; k < VEC && c + k < C; k++) {
            dw_acc[k * P + c / VEC] = 0.0f;
            db_acc[k * P + c / VEC] = 0.0f;
        }
    }

    int row_end = min(N, (int)(blockIdx.x + 1) * LAYERNORM_BACKWARD_ROWS);
    for (int row = blockIdx.x * LAYERNORM_BACKWARD_ROWS + warp; row < row_end; row += warps) {
        const floatX* x = inp + (size_t)row * C;
        const floatX* dy = dout + (size_t)row * C;
        float m = mean[row], s = rstd[row];
        // the two means that the normalisation feeds back through
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int c = lane * VEC; c < C; c += WARP_SIZE * VEC) {
            Packed128<floatX> xp = load_pack(x, c, C, vector), dyp = load_pack(dy, c, C, vector);
            Packed128<floatX> wp = load_pack(weight, c, C, vector);
            for (int k = 0; k < VEC; k++) {  // zeros past C add nothing
                float dnorm = to_float(wp[k]) * to_float(dyp[k]);
                dnorm_mean += dnorm;
                dnorm_norm_mean += dnorm * (to_float(xp[k]) - m) * s;
            }
        }
        dnorm_mean = warp_reduce_sum(dnorm_mean) / C;
        dnorm_norm_mean = warp_reduce_sum(dnorm_norm_mean) / C;
        for (int c = lane * VEC; c < C; c += WARP_SIZE * VEC) {
            Packed128<floatX> xp = load_pack(x, c, C, vector), dyp = load_pack(dy, c, C, vector);
            Packed128<floatX> wp = load_pack(weight, c, C, vector);
            Packed128<floatX> dxp = load_pack(dinp + (size_t)row * C, c, C, vector);
            for (int k = 0; k < VEC && c + k < C; k++) {
                float norm = (to_float(xp[k]) - m) * s;
                float dyk = to_float(dyp[k]);
                float dnorm = to_float(wp[k]) * dyk;
                dxp[k] = from_float<floatX>(to_float(dxp[k]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
                dw_acc[k * P + c / VEC] += norm * dyk;
                db_acc[k * P + c / VEC] += dyk;
            }
            store_pack(dinp + (size_t)row * C, c, C, vector, dxp);
        }
    }
    __syncthreads();
    float* out = partials + (size_t)blockIdx.x * 2 * C;
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) {
        int part = i / C, c = i % C;  // part 0: dweight, 1: dbias
        size_t at = ((size_t)part * VEC + c % VEC) * P + c / VEC;
        float sum = 0.0f;
        for (int w = 0; w < warps; w++) { sum += acc[(size_t)w * 2 * VEC * P + at]; }
        out[i] = sum;
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// out (B,T,C) = (x - mean) * rstd * w (C) + b (C); saves mean, rstd (B,T) for backward
template <typename floatX>
void layernorm_forward_cuda(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                            const floatX* bias, int B, int T, int C, cudaStream_t stream) {
    int N = B * T;
    if (N == 0) { return; }
    const int VEC = Packed128<floatX>::size;
    bool vector = C % VEC == 0 && is_aligned16(out) && is_aligned16(inp) && is_aligned16(weight) && is_aligned16(bias);
    layernorm_forward_kernel<floatX><<<ceil_div(N, LAYERNORM_FORWARD_WARPS), LAYERNORM_FORWARD_WARPS * WARP_SIZE, 0,
                                       stream>>>(out, mean, rstd, inp, weight, bias, N, C, vector);
    CUDA_CHECK_LAUNCH();
}

// the scratch layernorm_backward_cuda needs: 2 C floats per block of LAYERNORM_BACKWARD_ROWS rows
static size_t layernorm_backward_scratch_floats(int B, int T, int C) {
    return (size_t)ceil_div(B * T, LAYERNORM_BACKWARD_ROWS) * 2 * C;
}

// dinp (B,T,C) +=, dweight (C) +=, dbias (C) += from dout (B,T,C); dweight and dbias fp32, dbias may
// be NULL; scratch: layernorm_backward_scratch_floats(B, T, C) floats
template <typename floatX>
void layernorm_backward_cuda(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                             const floatX* weight, const float* mean, const float* rstd, int B, int T, int C,
                             float* scratch, cudaStream_t stream) {
    int N = B * T;
    if (N == 0 || C == 0) { return; }
    // warps per block: as many as fit their 2 C floats (whole packs) in the default shared memory, at least one
    const int VEC = Packed128<floatX>::size;
    size_t warp_bytes = 2 * (size_t)ceil_div(C, VEC) * VEC * sizeof(float);
    int warps = (int)(LAYERNORM_SMEM_DEFAULT / warp_bytes);
    warps = warps < 1 ? 1 : (warps > LAYERNORM_BACKWARD_MAX_WARPS ? LAYERNORM_BACKWARD_MAX_WARPS : warps);
    size_t smem = warps * warp_bytes;
    if (smem > LAYERNORM_SMEM_DEFAULT) {
        int device, optin;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        if (smem > (size_t)optin) {
            fail("layernorm_backward_cuda: C=%d needs %zu bytes of shared memory per block, the GPU has %d\n"
                 "  hint: the kernel keeps 2 C fp32 column sums per warp; C above %d needs a kernel that tiles C",
                 C, smem, optin, (int)(optin / (2 * sizeof(float))));
        }
        CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<floatX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
    }
    bool vector = C % VEC == 0 && is_aligned16(dinp) && is_aligned16(dout) && is_aligned16(inp) && is_aligned16(weight);
    int blocks = ceil_div(N, LAYERNORM_BACKWARD_ROWS);
    layernorm_backward_kernel<floatX><<<blocks, warps * WARP_SIZE, smem, stream>>>(dinp, scratch, dout, inp, weight,
                                                                                  mean, rstd, N, C, vector);
    CUDA_CHECK_LAUNCH();
    add_partial_sums_cuda(dweight, scratch, blocks, C, 2 * (size_t)C, stream);
    if (dbias != NULL) { add_partial_sums_cuda(dbias, scratch + C, blocks, C, 2 * (size_t)C, stream); }
}

#endif // CUDA_LAYERNORM_CUH
