/*
encoder.cuh: token + position embedding on the device, mirroring encoder_forward/backward of
cpu/layers.h.

    encoder_forward_cuda<floatX>(out, d_inp, wte, wpe, B, T, C, stream);   // out =; d_inp on the device
    int* scratch;  // encoder_backward_scratch_ints(B, T) ints of device memory, contents not kept
    encoder_backward_cuda<floatX>(dwte, dwpe, dout, inp, B, T, C, scratch, stream);  // dwte +=, dwpe +=; inp on the host

Invariants: out and dout are floatX; dwte and dwpe are fp32 and accumulated (+=) in exactly the
CPU's order (over positions b*T + t, increasing), so the gradients are bitwise those of
cpu/layers.h on the same (rounded) dout, run after run, whatever the grid. The backward groups the
positions by token on the host (as llm.c's encoder backward does), so that a thread owns one
(token, pack of channels) and adds that token's positions in order: no atomics, and as many
threads as distinct tokens times packs. Token ids must lie in [0, Vp) (not checked). Any C: rows
that are not 16-byte aligned are read element by element.
*/
#ifndef CUDA_ENCODER_CUH
#define CUDA_ENCODER_CUH

#include "common.cuh"
#include "profile.cuh"  // --profile: a launcher marks its range on the compute stream (prof_kernel)

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
// buckets (nb, 3): a token, the start of its positions in `positions` and their count; the
// positions of a bucket are increasing. A thread owns one pack of channels of one bucket's row and
// adds the bucket's positions in order: the CPU's order per entry, no atomics. Consecutive threads
// take consecutive packs, so a warp reads whole rows of dout. bytes: B*T*C floatX read + 2 fp32 per
// (distinct token, channel) + 4 B*T ints; FLOPs: B*T*C adds
template <typename floatX>
__global__ void encoder_backward_wte_kernel(float* dwte, const floatX* dout, const int* positions, const int* buckets,
                                            int nb, int C, bool vector) {
    const int VEC = Packed128<floatX>::size;
    int packs = ceil_div(C, VEC);
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)nb * packs) { return; }
    const int* bucket = buckets + 3 * (idx / packs);
    int c = (int)(idx % packs) * VEC, n = min(VEC, C - c);
    float acc[Packed128<floatX>::size];
    float* w = dwte + (size_t)bucket[0] * C + c;
    for (int k = 0; k < n; k++) { acc[k] = w[k]; }
    for (int i = bucket[1]; i < bucket[1] + bucket[2]; i++) {
        Packed128<floatX> d = load_pack(dout + (size_t)positions[i] * C, c, C, vector);
        for (int k = 0; k < n; k++) { acc[k] += to_float(d[k]); }
    }
    for (int k = 0; k < n; k++) { w[k] = acc[k]; }
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
    prof_kernel(stream, PROF_ENCODER, prof_encoder_forward((size_t)B * T, C, sizeof(floatX)), "forward");
    const int VEC = Packed128<floatX>::size;
    bool vector = C % VEC == 0 && is_aligned16(out) && is_aligned16(wte) && is_aligned16(wpe);
    size_t threads = (size_t)B * T * ceil_div(C, VEC);
    if (threads == 0) { return; }
    encoder_forward_kernel<floatX><<<(unsigned)ceil_div(threads, (size_t)ENCODER_BLOCK), ENCODER_BLOCK, 0, stream>>>(
        out, inp, wte, wpe, B * T, T, C, vector);
    CUDA_CHECK_LAUNCH();
}

// the device scratch encoder_backward_cuda needs: the positions grouped by token (B*T) and up to
// B*T buckets of 3 ints
static size_t encoder_backward_scratch_ints(int B, int T) { return 4 * (size_t)B * T; }

// buckets in the order the kernel runs them: the largest first (their chains are the longest), ties
// by token
static int encoder_bucket_cmp(const void* a, const void* b) {
    const int *x = (const int*)a, *y = (const int*)b;
    if (x[2] != y[2]) { return x[2] > y[2] ? -1 : 1; }
    return (x[0] > y[0]) - (x[0] < y[0]);
}

// inp (BT) token ids into out: positions grouped by token, each group increasing ([0, BT)), then the
// buckets (token, start, count) from BT on; returns the number of buckets. A counting sort by token
static int encoder_buckets(const int* inp, int BT, int* out) {
    int max_token = 0;
    for (int i = 0; i < BT; i++) { max_token = inp[i] > max_token ? inp[i] : max_token; }
    int* start = (int*)calloc_check((size_t)max_token + 2, sizeof(int));  // start[t + 1]: tokens below t+1 counted
    for (int i = 0; i < BT; i++) { start[inp[i] + 1]++; }
    int* buckets = out + BT;
    int nb = 0;
    for (int t = 0; t <= max_token; t++) {
        if (start[t + 1] > 0) {
            int* b = buckets + 3 * nb++;
            b[0] = t; b[1] = start[t]; b[2] = start[t + 1];
        }
        start[t + 1] += start[t];
    }
    for (int i = 0; i < BT; i++) { out[start[inp[i]]++] = i; }  // increasing positions within each token
    free(start);
    qsort(buckets, (size_t)nb, 3 * sizeof(int), encoder_bucket_cmp);
    return nb;
}

// the buckets (n, 3) of the tokens in [v0, v0 + rows), in order, as rows of wte's slice (token - v0);
// returns their number
static int encoder_buckets_of_rows(int* buckets, int n, int v0, int rows) {
    int kept = 0;
    for (int b = 0; b < n; b++) {
        int* from = buckets + 3 * b;
        if (from[0] < v0 || from[0] - v0 >= rows) { continue; }
        int* to = buckets + 3 * kept++;
        to[0] = from[0] - v0; to[1] = from[1]; to[2] = from[2];
    }
    return kept;
}

// dwte (rows,C) += scatter of dout (B,T,C) by token, the tokens v0 .. v0 + rows - 1 into rows 0 ..
// rows - 1 (the whole of wte: 0, Vp; --tp: a rank's slice, cuda/tensor_parallel.cuh); dwpe (maxT,C) +=
// sum over b (both fp32). inp (B,T) is on the host; scratch: encoder_backward_scratch_ints(B, T) ints of
// device memory
template <typename floatX>
void encoder_backward_rows_cuda(float* dwte, float* dwpe, const floatX* dout, const int* inp, int B, int T, int C, int v0,
                                int rows, int* scratch, cudaStream_t stream) {
    int BT = B * T;
    if (BT == 0 || C == 0) { return; }
    const int VEC = Packed128<floatX>::size;
    bool vector = C % VEC == 0 && is_aligned16(dout);
    int* host = (int*)malloc_check(encoder_backward_scratch_ints(B, T) * sizeof(int));
    int nb = encoder_buckets_of_rows(host + BT, encoder_buckets(inp, BT, host), v0, rows);
    // from pageable memory: staged at once, so the host buffer may go (the copy runs in stream order)
    CUDA_CHECK(cudaMemcpyAsync(scratch, host, ((size_t)BT + 3 * (size_t)nb) * sizeof(int), cudaMemcpyHostToDevice, stream));
    free(host);
    size_t threads = (size_t)nb * ceil_div(C, VEC);
    if (threads > 0) {  // none: --tp's rank holds none of the batch's tokens
        encoder_backward_wte_kernel<floatX><<<(unsigned)ceil_div(threads, (size_t)ENCODER_BLOCK), ENCODER_BLOCK, 0, stream>>>(
            dwte, dout, scratch, scratch + BT, nb, C, vector);
        CUDA_CHECK_LAUNCH();
    }
    threads = (size_t)T * ceil_div(C, VEC);
    encoder_backward_wpe_kernel<floatX><<<(unsigned)ceil_div(threads, (size_t)ENCODER_BLOCK), ENCODER_BLOCK, 0, stream>>>(
        dwpe, dout, B, T, C, vector);
    CUDA_CHECK_LAUNCH();
}

// dwte (Vp,C) += scatter of dout (B,T,C) by token; dwpe (maxT,C) += sum over b (both fp32). inp (B,T)
// is on the host (as cpu/layers.h's); scratch: encoder_backward_scratch_ints(B, T) ints of device memory
template <typename floatX>
void encoder_backward_cuda(float* dwte, float* dwpe, const floatX* dout, const int* inp, int B, int T, int C,
                           int* scratch, cudaStream_t stream) {
    prof_kernel(stream, PROF_ENCODER, prof_encoder_backward((size_t)B * T, T, C, sizeof(floatX)), "backward");
    encoder_backward_rows_cuda(dwte, dwpe, dout, inp, B, T, C, 0, INT_MAX, scratch, stream);
}

#endif // CUDA_ENCODER_CUH
