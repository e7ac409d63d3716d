/*
adamw_lowp.cuh: AdamW on optimizer state in 8 bits or bf16 on the device (llmc/quant_state.h),
mirroring adamw_update_8bit and adamw_update_bf16 of cpu/optimizers_lowp.h, and the block-wise
quantization of a tensor on its own (qstate_quantize / qstate_dequantize there) and bf16's rounding
(qstate_bf16_load_cuda / qstate_bf16_store_cuda: what cuda/factored_lowp.cuh stages M through).

    QStateMaps* d_maps = qstate_maps_upload();            // once: both maps in device memory (cudaFree it)
    unsigned long long* d_bad;                            // device counter of refused values, zeroed by the caller
    QBlocks m = {m_codes, m_absmax}, v = {v_codes, v_absmax};   // device memory; zeroed: every moment 0
    adamw_update_8bit_cuda(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t, d_maps, d_bad, stream);
    adamw_update_bf16_cuda(params, grads, m_bf16, v_bf16, n, lr, beta1, beta2, eps, weight_decay, t, s, d_bad, stream);
    copy_to_floatX_cuda<floatX>(weights, params, n, stream);    // adamw.cuh: working weights = master, rounded

Invariants: params and grads fp32 (the master weights, as in adamw.cuh), the state in the formats of
quant_state.h. The operations are cpu/optimizers_lowp.h's, in its order and with its roundings: the
CPU's adamw_element without fused multiply-adds (__fmul_rn, __fadd_rn), bias corrections by the
host's powf, IEEE division and square root, a code's value code * absmax, x / absmax to the code by
quant_state.h's qstate_nearest over the same thresholds, bf16's rounding bits from the same hash of
(seed, t, stream, element). So the bytes written equal the CPU's, whatever the grid
(dev/cuda/test_optimizer_lowp.cu checks it on the emulated device).

8bit: a warp per block of QSTATE_BLOCK = 256 elements (8 a lane), the block's new absmax by a warp
reduction (no shared memory, no barrier); a thread block of LOWP_THREADS holds both maps in shared
memory (4 KiB) and walks blocks grid-stride. bf16: a thread per 4 elements, elementwise. Any n and
alignment: weights and gradients in 16-byte packs and codes in 8-byte ones where the pointers
allow, bf16 moments element by element.

Failure: refused values (NaN, Inf among the new moments: quant_state.h) are added to *bad (the
caller zeroes it, reads it after the step, e.g. with the loss, and stops naming the tensor);
nothing here stops. Launch errors stop at the launcher (CUDA_CHECK_LAUNCH).
*/
#ifndef CUDA_ADAMW_LOWP_CUH
#define CUDA_ADAMW_LOWP_CUH

#include <math.h>
#include <stdint.h>
#include "common.cuh"
#include "../llmc/opt_layout.h"   // AdamWCoeffs: the step's constants, as the CPU computes them
#include "../llmc/quant_state.h"

#define LOWP_THREADS 256                          // 8 warps: 8 blocks of the 8-bit format at a time
#define LOWP_PER_LANE (QSTATE_BLOCK / WARP_SIZE)  // 8 elements of a block per lane
#define LOWP_BLOCKS_PER_SM 4                      // the 8-bit kernels' grid: this many thread blocks per SM, at most
#define LOWP_BF16_THREADS 256
#define LOWP_BF16_VEC 4                           // elements per thread of the bf16 kernel

// ----------------------------------------------------------------------------
// device helpers

// a map in shared memory: the 256 values, the 255 thresholds (and +Inf after them), the index of 0
typedef struct {
    float code[QSTATE_CODES];
    float up[QSTATE_CODES];
    int zero;
} QMapShared;

// every thread of the block copies part of m into s; a barrier must follow
__device__ inline void load_map_shared(QMapShared* s, const QStateMap* m) {
    for (int i = threadIdx.x; i < QSTATE_CODES; i += blockDim.x) {
        s->code[i] = m->code[i];
        s->up[i] = i < QSTATE_CODES - 1 ? m->up[i] : INFINITY;
    }
    if (threadIdx.x == 0) { s->zero = m->zero; }
}

// this lane's 8 floats x[i0 .. i0 + 8) (n), zeros past n: two 16-byte loads when `vector`
__device__ inline void load_lane_floats(float out[LOWP_PER_LANE], const float* x, size_t i0, size_t n, bool vector) {
    for (int h = 0; h < LOWP_PER_LANE; h += 4) {
        Packed128<float> p = load_pack(x, i0 + h, n, vector);
        for (int k = 0; k < 4; k++) { out[h + k] = p[k]; }
    }
}

__device__ inline void store_lane_floats(float* x, size_t i0, size_t n, bool vector, const float in[LOWP_PER_LANE]) {
    for (int h = 0; h < LOWP_PER_LANE; h += 4) {
        Packed128<float> p;
        for (int k = 0; k < 4; k++) { p[k] = in[h + k]; }
        store_pack(x, i0 + h, n, vector, p);
    }
}

// this lane's 8 codes x[i0 .. i0 + 8) (n), 0 past n: one 8-byte load when `vector` (x 8-byte aligned) and whole
__device__ inline void load_lane_codes(uint8_t out[LOWP_PER_LANE], const uint8_t* x, size_t i0, size_t n, bool vector) {
    if (vector && i0 + LOWP_PER_LANE <= n) {
        uint2 bits = *reinterpret_cast<const uint2*>(x + i0);
        memcpy(out, &bits, LOWP_PER_LANE);
        return;
    }
    for (int k = 0; k < LOWP_PER_LANE; k++) { out[k] = i0 + k < n ? x[i0 + k] : 0; }
}

__device__ inline void store_lane_codes(uint8_t* x, size_t i0, size_t n, bool vector, const uint8_t in[LOWP_PER_LANE]) {
    if (vector && i0 + LOWP_PER_LANE <= n) {
        uint2 bits;
        memcpy(&bits, in, LOWP_PER_LANE);
        *reinterpret_cast<uint2*>(x + i0) = bits;
        return;
    }
    for (int k = 0; k < LOWP_PER_LANE && i0 + k < n; k++) { x[i0 + k] = in[k]; }
}

// the end of a warp's block: from each lane's max |x| and count of non-finite values, the block's
// absmax (NaN when a value is refused) and this lane's codes (quant_state.h's qstate_quantize_block);
// returns the block's refused count. Every lane of the warp calls it
__device__ inline float quantize_warp_block(uint8_t codes[LOWP_PER_LANE], float* absmax, const float x[LOWP_PER_LANE],
                                            float lane_max, float lane_bad, const QMapShared* s) {
    float amax = warp_reduce_max(lane_max);
    float bad = warp_reduce_sum(lane_bad);  // exact: at most 256
    if (bad > 0.0f) { amax = qstate_nan(); }
    for (int k = 0; k < LOWP_PER_LANE; k++) {
        codes[k] = (uint8_t)(bad > 0.0f || amax == 0.0f ? s->zero : qstate_nearest(s->up, x[k] / amax));
    }
    *absmax = amax;
    return bad;
}

// one AdamW entry, as cpu adamw_element (no fused multiply-adds): m, v updated, returns the new p
__device__ inline float adamw_element_device(float p, float g, float* m, float* v, const AdamWCoeffs& c) {
    float mi = __fadd_rn(__fmul_rn(c.beta1, *m), __fmul_rn(1.0f - c.beta1, g));
    float vi = __fadd_rn(__fmul_rn(c.beta2, *v), __fmul_rn(__fmul_rn(1.0f - c.beta2, g), g));
    *m = mi;
    *v = vi;
    float mhat = mi / c.bc1, vhat = vi / c.bc2;
    float update = __fadd_rn(mhat / (sqrtf(vhat) + c.eps), __fmul_rn(c.weight_decay, p));
    return __fadd_rn(p, -__fmul_rn(c.lr, update));
}


// ----------------------------------------------------------------------------
// CUDA kernels

// AdamW on 8-bit moments: warp w of the grid takes blocks w, w + warps of the grid, ...; per block:
// dequantize m and v, update p, m, v in fp32, the new absmax by a warp max, quantize.
// bytes: 12 n (p, g read, p written) + 4 n (m and v codes read and written) + 16 n / 256 (absmax); FLOPs: about 30 n
static __global__ void adamw_8bit_kernel(float* params, const float* grads, QBlocks m, QBlocks v, size_t n,
                                         AdamWCoeffs st, const QStateMaps* maps, unsigned long long* bad, bool vector) {
    __shared__ QMapShared smap[2];  // [QMAP_SIGNED]: m's map, [QMAP_UNSIGNED]: v's
    load_map_shared(&smap[QMAP_SIGNED], &maps->map[QMAP_SIGNED]);
    load_map_shared(&smap[QMAP_UNSIGNED], &maps->map[QMAP_UNSIGNED]);
    __syncthreads();
    int warps = blockDim.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    size_t blocks = qstate_blocks(n);
    for (size_t b = (size_t)blockIdx.x * warps + threadIdx.x / WARP_SIZE; b < blocks; b += (size_t)gridDim.x * warps) {
        size_t i0 = b * QSTATE_BLOCK + (size_t)lane * LOWP_PER_LANE;
        float p[LOWP_PER_LANE], g[LOWP_PER_LANE], mx[LOWP_PER_LANE], vx[LOWP_PER_LANE];
        uint8_t mc[LOWP_PER_LANE], vc[LOWP_PER_LANE];
        load_lane_floats(p, params, i0, n, vector);
        load_lane_floats(g, grads, i0, n, vector);
        load_lane_codes(mc, m.codes, i0, n, vector);
        load_lane_codes(vc, v.codes, i0, n, vector);
        float am = m.absmax[b], av = v.absmax[b];
        float m_max = 0.0f, v_max = 0.0f, m_bad = 0.0f, v_bad = 0.0f;
        for (int k = 0; k < LOWP_PER_LANE; k++) {
            mx[k] = vx[k] = 0.0f;
            if (i0 + k >= n) { continue; }
            mx[k] = __fmul_rn(smap[QMAP_SIGNED].code[mc[k]], am);
            vx[k] = __fmul_rn(smap[QMAP_UNSIGNED].code[vc[k]], av);
            p[k] = adamw_element_device(p[k], g[k], &mx[k], &vx[k], st);
            m_bad += !isfinite(mx[k]);
            v_bad += !isfinite(vx[k]);
            m_max = fmaxf(m_max, fabsf(mx[k]));
            v_max = fmaxf(v_max, fabsf(vx[k]));
        }
        float refused = quantize_warp_block(mc, &am, mx, m_max, m_bad, &smap[QMAP_SIGNED]);
        refused += quantize_warp_block(vc, &av, vx, v_max, v_bad, &smap[QMAP_UNSIGNED]);
        store_lane_floats(params, i0, n, vector, p);
        store_lane_codes(m.codes, i0, n, vector, mc);
        store_lane_codes(v.codes, i0, n, vector, vc);
        if (lane == 0) {
            m.absmax[b] = am;
            v.absmax[b] = av;
            if (refused > 0.0f) { atomicAdd(bad, (unsigned long long)refused); }
        }
    }
}

// AdamW on bf16 moments, a thread per LOWP_BF16_VEC elements; the rounding bits of element i are
// qstate_random16(s.seed, step, stream, s.index_base + i). bytes: 12 n fp32 + 8 n bf16; FLOPs: about 40 n
static __global__ void adamw_bf16_kernel(float* params, const float* grads, uint16_t* m, uint16_t* v, size_t n,
                                         AdamWCoeffs st, QStateStream s, uint32_t step, unsigned long long* bad,
                                         bool vector) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * LOWP_BF16_VEC;
    if (i >= n) { return; }
    Packed128<float> p = load_pack(params, i, n, vector), g = load_pack(grads, i, n, vector);
    unsigned long long refused = 0;
    for (int k = 0; k < LOWP_BF16_VEC && i + k < n; k++) {
        float mi = qstate_bf16_to_float(m[i + k]), vi = qstate_bf16_to_float(v[i + k]);
        p[k] = adamw_element_device(p[k], g[k], &mi, &vi, st);
        refused += !isfinite(mi) + !isfinite(vi);
        uint64_t index = (uint64_t)(s.index_base + i + k);
        m[i + k] = qstate_bf16_round(mi, qstate_random16(s.seed, step, QSTATE_STREAM_M, index));
        v[i + k] = qstate_bf16_round(vi, qstate_random16(s.seed, step, QSTATE_STREAM_V, index));
    }
    store_pack(params, i, n, vector, p);
    if (refused > 0) { atomicAdd(bad, refused); }
}

// x (n) into codes (n) and absmax (qstate_blocks(n)) through map `kind`, a warp per block (as
// cpu qstate_quantize); refused values added to *bad. bytes: 5 n + 4 n / 256; FLOPs: about 10 n
static __global__ void qstate_quantize_kernel(uint8_t* codes, float* absmax, const float* x, size_t n, QMapKind kind,
                                              const QStateMaps* maps, unsigned long long* bad, bool vector) {
    __shared__ QMapShared smap;
    load_map_shared(&smap, &maps->map[kind]);
    __syncthreads();
    int warps = blockDim.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    size_t blocks = qstate_blocks(n);
    for (size_t b = (size_t)blockIdx.x * warps + threadIdx.x / WARP_SIZE; b < blocks; b += (size_t)gridDim.x * warps) {
        size_t i0 = b * QSTATE_BLOCK + (size_t)lane * LOWP_PER_LANE;
        float xs[LOWP_PER_LANE], lane_max = 0.0f, lane_bad = 0.0f, amax;
        uint8_t c[LOWP_PER_LANE];
        load_lane_floats(xs, x, i0, n, vector);  // zeros past n
        for (int k = 0; k < LOWP_PER_LANE; k++) {
            lane_bad += !isfinite(xs[k]);
            lane_max = fmaxf(lane_max, fabsf(xs[k]));
        }
        float refused = quantize_warp_block(c, &amax, xs, lane_max, lane_bad, &smap);
        store_lane_codes(codes, i0, n, vector, c);
        if (lane == 0) {
            absmax[b] = amax;
            if (refused > 0.0f) { atomicAdd(bad, (unsigned long long)refused); }
        }
    }
}

// x (n) = code value * its block's absmax, a thread per element. bytes: 5 n; FLOPs: n
static __global__ void qstate_dequantize_kernel(float* x, const uint8_t* codes, const float* absmax, size_t n,
                                                QMapKind kind, const QStateMaps* maps) {
    __shared__ float code[QSTATE_CODES];
    for (int i = threadIdx.x; i < QSTATE_CODES; i += blockDim.x) { code[i] = maps->map[kind].code[i]; }
    __syncthreads();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { x[i] = __fmul_rn(code[codes[i]], absmax[i / QSTATE_BLOCK]); }
}

// x (n) = the fp32 values of bf16 bits h (n), a thread per element. bytes: 6 n; FLOPs: none
static __global__ void qstate_bf16_load_kernel(float* x, const uint16_t* h, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { x[i] = qstate_bf16_to_float(h[i]); }
}

// h (n) = x (n) rounded to bf16 with the bits of (s.seed, step, stream, s.index_base + i) (as cpu
// qmoment_put_block); refused values added to *bad. bytes: 6 n; FLOPs: about 30 integer ops n
static __global__ void qstate_bf16_store_kernel(uint16_t* h, const float* x, size_t n, QStateStream s, uint32_t step,
                                                uint32_t stream, unsigned long long* bad) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float v = x[i];
    h[i] = qstate_bf16_round(v, qstate_random16(s.seed, step, stream, (uint64_t)(s.index_base + i)));
    if (!isfinite(v)) { atomicAdd(bad, 1ULL); }
}

// ----------------------------------------------------------------------------
// kernel launchers

// both maps of quant_state.h in device memory, for the kernels here (the caller frees it with cudaFree)
static QStateMaps* qstate_maps_upload(void) {
    QStateMaps* d;
    CUDA_CHECK(cudaMalloc(&d, sizeof(QStateMaps)));
    CUDA_CHECK(cudaMemcpy(d, qstate_maps(), sizeof(QStateMaps), cudaMemcpyHostToDevice));
    return d;
}

// thread blocks of LOWP_THREADS for the 8-bit kernels over n elements: a warp per block of the
// format, at most LOWP_BLOCKS_PER_SM per SM (each loads the maps once), at least one
static unsigned lowp_grid(size_t n) {
    size_t want = ceil_div(qstate_blocks(n), (size_t)(LOWP_THREADS / WARP_SIZE));
    size_t most = (size_t)LOWP_BLOCKS_PER_SM * device_sm_count();
    return (unsigned)(want < 1 ? 1 : (want < most ? want : most));
}

// AdamW (cpu adamw_update_8bit) on n entries: params, grads fp32; m, v 8-bit blocks (device memory);
// t = 1, 2, ...; the count of refused new moments is added to *bad (device memory)
static void adamw_update_8bit_cuda(float* params, const float* grads, QBlocks m, QBlocks v, size_t n, float lr,
                                   float beta1, float beta2, float eps, float weight_decay, int t,
                                   const QStateMaps* d_maps, unsigned long long* bad, cudaStream_t stream) {
    if (n == 0) { return; }
    bool vector = is_aligned16(params) && is_aligned16(grads) && (uintptr_t)m.codes % 8 == 0 && (uintptr_t)v.codes % 8 == 0;
    AdamWCoeffs st = adamw_coeffs(lr, beta1, beta2, eps, weight_decay, t);
    adamw_8bit_kernel<<<lowp_grid(n), LOWP_THREADS, 0, stream>>>(params, grads, m, v, n, st, d_maps, bad, vector);
    CUDA_CHECK_LAUNCH();
}

// AdamW (cpu adamw_update_bf16) on n entries: m, v bf16 bits (device memory), rounded with stream s
// at step t; the count of refused new moments is added to *bad
static void adamw_update_bf16_cuda(float* params, const float* grads, uint16_t* m, uint16_t* v, size_t n, float lr,
                                   float beta1, float beta2, float eps, float weight_decay, int t, QStateStream s,
                                   unsigned long long* bad, cudaStream_t stream) {
    if (n == 0) { return; }
    bool vector = is_aligned16(params) && is_aligned16(grads);
    AdamWCoeffs st = adamw_coeffs(lr, beta1, beta2, eps, weight_decay, t);
    size_t blocks = ceil_div(ceil_div(n, (size_t)LOWP_BF16_VEC), (size_t)LOWP_BF16_THREADS);
    adamw_bf16_kernel<<<(unsigned)blocks, LOWP_BF16_THREADS, 0, stream>>>(params, grads, m, v, n, st, s, (uint32_t)t, bad,
                                                                          vector);
    CUDA_CHECK_LAUNCH();
}

// x (n, device) into codes (n) and absmax (qstate_blocks(n)) through map `kind` (cpu qstate_quantize);
// the count of refused values is added to *bad
static void qstate_quantize_cuda(uint8_t* codes, float* absmax, const float* x, size_t n, QMapKind kind,
                                 const QStateMaps* d_maps, unsigned long long* bad, cudaStream_t stream) {
    if (n == 0) { return; }
    bool vector = is_aligned16(x) && (uintptr_t)codes % 8 == 0;
    qstate_quantize_kernel<<<lowp_grid(n), LOWP_THREADS, 0, stream>>>(codes, absmax, x, n, kind, d_maps, bad, vector);
    CUDA_CHECK_LAUNCH();
}

// x (n, device) = the values of codes (n) with absmax (qstate_blocks(n)) through map `kind` (cpu qstate_dequantize)
static void qstate_dequantize_cuda(float* x, const uint8_t* codes, const float* absmax, size_t n, QMapKind kind,
                                   const QStateMaps* d_maps, cudaStream_t stream) {
    if (n == 0) { return; }
    size_t blocks = ceil_div(n, (size_t)LOWP_THREADS);
    qstate_dequantize_kernel<<<(unsigned)blocks, LOWP_THREADS, 0, stream>>>(x, codes, absmax, n, kind, d_maps);
    CUDA_CHECK_LAUNCH();
}

// x (n, device) = the values of bf16 bits h (n)
static void qstate_bf16_load_cuda(float* x, const uint16_t* h, size_t n, cudaStream_t stream) {
    if (n == 0) { return; }
    qstate_bf16_load_kernel<<<(unsigned)ceil_div(n, (size_t)LOWP_BF16_THREADS), LOWP_BF16_THREADS, 0, stream>>>(x, h, n);
    CUDA_CHECK_LAUNCH();
}

// h (n, device) = x (n) rounded to bf16 with the bits of stream `stream` (QStateStreamId) of s at
// step; the count of refused values is added to *bad
static void qstate_bf16_store_cuda(uint16_t* h, const float* x, size_t n, QStateStream s, int step, QStateStreamId stream,
                                   unsigned long long* bad, cudaStream_t cuda_stream) {
    if (n == 0) { return; }
    qstate_bf16_store_kernel<<<(unsigned)ceil_div(n, (size_t)LOWP_BF16_THREADS), LOWP_BF16_THREADS, 0, cuda_stream>>>(
        h, x, n, s, (uint32_t)step, (uint32_t)stream, bad);
    CUDA_CHECK_LAUNCH();
}

#endif // CUDA_ADAMW_LOWP_CUH
