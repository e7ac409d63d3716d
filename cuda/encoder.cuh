/*
encoder.cuh: token + position embedding on the device, mirroring encoder_forward/backward of
cpu/layers.h.

    encoder_forward_cuda<floatX>(out, inp, wte, wpe, B, T, C, stream);     // out =
    encoder_backward_cuda<floatX>(dwte, dwpe, dout, inp, B, T, C, stream); // dwte +=, dwpe +=

Invariants: out and dout are floatX; dwte and dwpe are fp32 and accumulated (+=) in exactly the
CPU's order (over positions b*T + t, increasing), so the gradients are bitwise those of
cpu/layers.h on the same (rounded) dout, run after run, whatever the grid. Token ids must lie in
[0, Vp) (not checked). Any C: rows that are not 16-byte aligned are read element by element.
*/
#ifndef CUDA_ENCODER_CUH
#define CUDA_ENCODER_CUH

#include "common.cuh"

// the backward kernel of dwte splits the vocabulary into this many groups (token % groups), one
// group per block row: parallelism only, the result does not depend on it
#define ENCODER_TOKEN_GROUPS 32
#define ENCODER_BLOCK 128

// ----------------------------------------------------------------------------
// CUDA kernels

// out (B,T,C) = wte (Vp,C)[inp (B,T)] + wpe (maxT,C)[t]; one thread per pack of channels of a position.
// bytes: 3 B*T*C floatX + B*T ints; FLOPs: B*T*C adds
template <typename floatX>
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                       int BT, int T, int C, bool vector) {
    const int VEC = Packed128<floatX>::size;
    int packs_per_row = ceil_div(C, VEC);
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * packs_per_row) { return; }
    int bt = (int)(idx / packs_per_row), c = (int)(idx % packs_per_row) * VEC, t = bt % T;
    Packed128<floatX> we = load_pack(wte + (size_t)inp[bt] * C, c, C, vector);
    Packed128<floatX> pe = load_pack(wpe + (size_t)t * C, c, C, vector);
    Packed128<floatX> o;
    for (int k = 0; k < VEC; k++) { o[k] = from_float<floatX>(to_float(we[k]) + to_float(pe[k])); }
    store_pack(out + (size_t)bt * C, c, C, vector, o);
}

// dwte (Vp,C) += dout (B,T,C) scattered by token, each entry in increasing position order.
// A thread owns one channel c of the tokens of its group (token % gridDim.y == blockIdx.y); each
// warp scans inp 32 positions at a time, a ballot names the positions of its group, and they are
// added in increasing order: the CPU's order per entry, no atomics.
// bytes: B*T*C floatX read + 2 fp32 per (position, channel) read-modify-write, B*T*C/ENCODER_BLOCK
// ints of inp per group (cached); FLOPs: B*T*C adds
template <typename floatX>
__global__ void encoder_backward_wte_kernel(float* dwte, const floatX* dout, const int* inp, int BT, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;  // lanes past C take part in the ballots only
    int group = blockIdx.y, groups = gridDim.y, lane = threadIdx.x % WARP_SIZE;
    for (int base = 0; base < BT; base += WARP_SIZE) {
        int p = base + lane;
        unsigned mine = __ballot_sync(FULL_MASK, p < BT && inp[p] % groups == group);
        while (mine != 0) {
            int pos = base + __ffs((int)mine) - 1;  // lowest position first
            mine &= mine - 1;
            if (c < C) {
                float* w = dwte + (size_t)inp[pos] * C + c;
                *w += to_float(dout[(size_t)pos * C + c]);
            }
        }
    }
}

// dwpe (maxT,C) += sum over b of dout (B,T,C), in increasing b; one thread per pack of channels
// of a position t. bytes: B*T*C floatX + 2 T*C fp32; FLOPs: B*T*C adds
template <typename floatX>
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, int B, int T, int C, bool vector) {
    const int VEC = Packed128<floatX>::size;
    int packs_per_row = ceil_div(C, VEC);
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * packs_per_row) { return; }
    int t = (int)(idx / packs_per_row), c = (int)(idx % packs_per_row) * VEC;
    int n = min(VEC, C - c);
    float acc[Packed128<floatX>::size];
    float* w = dwpe + (size_t)t * C + c;
    for (int k = 0; k < n; k++) { acc[k] = w[k]; }
    for (int b = 0; b < B; b++) {
        Packed128<floatX> d = load_pack(dout + ((size_t)b * T + t) * C, c, C, vector);
        for (int k = 0; k < n; k++) { acc[k] += to_float(d[k]); }
    }
    for (int k = 0; k < n; k++) { w[k] = acc[k]; }
}

// ----------------------------------------------------------------------------
// kernel launchers

// out (B,T,C) = wte[inp[b,t]] (Vp,C) + wpe[t] (maxT,C); inp (B,T) token ids
template <typename floatX>
void encoder_forward_cuda(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T, int C,
                          cudaStream_t stream) {
    const int VEC = Packed128<floatX>::size;
    bool vector = C % VEC == 0 && is_aligned16(out) && is_aligned16(wte) && is_aligned16(wpe);
    size_t threads = (size_t)B * T * ceil_div(C, VEC);
    if (threads == 0) { return; }
    encoder_forward_kernel<floatX><<<(unsigned)ceil_div(threads, (size_t)ENCODER_BLOCK), ENCODER_BLOCK, 0, stream>>>(
        out, inp, wte, wpe, B * T, T, C, vector);
    CUDA_CHECK_LAUNCH();
}

// dwte (Vp,C) += scatter of dout (B,T,C) by token; dwpe (maxT,C) += sum over b (both fp32)
template <typename floatX>
void encoder_backward_cuda(float* dwte, float* dwpe, const floatX* dout, const int* inp, int B, int T, int C,
                           cudaStream_t stream) {
    if (B * T == 0 || C == 0) { return; }
    dim3 grid((unsigned)ceil_div(C, ENCODER_BLOCK), ENCODER_TOKEN_GROUPS);
    encoder_backward_wte_kernel<floatX><<<grid, ENCODER_BLOCK, 0, stream>>>(dwte, dout, inp, B * T, C);
    CUDA_CHECK_LAUNCH();
    const int VEC = Packed128<floatX>::size;
    bool vector = C % VEC == 0 && is_aligned16(dout);
    size_t threads = (size_t)T * ceil_div(C, VEC);
    encoder_backward_wpe_kernel<floatX><<<(unsigned)ceil_div(threads, (size_t)ENCODER_BLOCK), ENCODER_BLOCK, 0, stream>>>(
        dwpe, dout, B, T, C, vector);
    CUDA_CHECK_LAUNCH();
}

#endif // CUDA_ENCODER_CUH
