/*
classifier.cuh: softmax and cross-entropy over the vocabulary on the device, fused; the device
counterpart of softmax_forward, crossentropy_forward and crossentropy_softmax_backward of
cpu/layers.h. The probabilities are never stored: the forward keeps two floats per position
(the row's max and its sum of exp(logit - max)), from which the backward (and sampling) recompute
each probability where it is needed.

    classifier_forward_cuda<floatX>(losses, row_max, row_sum, logits, targets, B, T, V, Vp, stream);
    classifier_backward_cuda<floatX>(dlogits, logits, row_max, row_sum, targets, dloss, B, T, V, Vp, stream);
    softmax_row_cuda<floatX>(probs, logits, row_max, row_sum, position, V, Vp, stream);   // for sampling
    classifier_fused_cuda<floatX>(losses, logits, targets, dloss, B, T, V, Vp, stream);   // --loss-chunk: both at once

Invariants: logits (B,T,Vp) floatX, rows of Vp of which the first V are real; losses, row_max,
row_sum (B,T) fp32; the forward reduces each row in a fixed order (bitwise reproducible). The
backward writes (=) (softmax - onehot(target)) * dloss, zero past V, and may run in place
(dlogits == logits). Any V <= Vp; rows that are not 16-byte aligned are read element by element.
The fused kernel (--loss-chunk, whose forward knows the loss scale) is the two in one launch, a block
per row: the forward's reduction, then the backward's element formula, in place; each row is read
twice (the second time from L2: a row of d12's 50304 bf16 logits is 98 KiB), written once, and its
losses and logits' gradient are bitwise those of the two kernels.
*/
#ifndef CUDA_CLASSIFIER_CUH
#define CUDA_CLASSIFIER_CUH

#include "common.cuh"
#include "profile.cuh"  // --profile: a launcher marks its range on the compute stream (prof_kernel)

#define CLASSIFIER_FORWARD_BLOCK 512
#define CLASSIFIER_BACKWARD_BLOCK 256

// ----------------------------------------------------------------------------
// CUDA kernels

// the (max, sum of exp(logit - max)) of one row x (V real entries) in thread 0, by the block of
// CLASSIFIER_FORWARD_BLOCK threads: each thread runs an online softmax over its packs, then the
// threads' pairs merge in a fixed order (warp butterflies, then the warps in order) through the
// kernel's shared warp_max, warp_sum (a float per warp each)
#define CLASSIFIER_WARPS (CLASSIFIER_FORWARD_BLOCK / WARP_SIZE)
template <typename floatX>
__device__ void classifier_row_reduce(const floatX* x, int V, bool vector, float& m, float& s, float* warp_max, float* warp_sum) {
    const int VEC = Packed128<floatX>::size;
    m = -INFINITY;
    s = 0.0f;
    for (int i = threadIdx.x * VEC; i < V; i += blockDim.x * VEC) {
        Packed128<floatX> p = load_pack(x, i, V, vector);
        for (int k = 0; k < VEC && i + k < V; k++) { softmax_add(m, s, to_float(p[k])); }
    }
    warp_softmax_merge(m, s);
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    if (lane == 0) {
        warp_max[warp] = m;
        warp_sum[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x != 0) { return; }
    m = warp_max[0];
    s = warp_sum[0];
    for (int w = 1; w < warps; w++) { softmax_merge(m, s, warp_max[w], warp_sum[w]); }
}

// one pack of dlogits at i of a row: (exp(logit - max) * inv - onehot(target)) * dloss, zero past V
template <typename floatX>
__device__ Packed128<floatX> classifier_grad_pack(const Packed128<floatX>& x, int i, float m, float inv, int target,
                                                  float dloss, int V) {
    Packed128<floatX> d;
    for (int k = 0; k < Packed128<floatX>::size; k++) {
        float p = i + k < V ? expf(to_float(x[k]) - m) * inv : 0.0f;
        float g = i + k < V ? (p - (i + k == target ? 1.0f : 0.0f)) * dloss : 0.0f;
        d[k] = from_float<floatX>(g);
    }
    return d;
}

// per position of logits (N,Vp): row_max, row_sum (N) = max and sum of exp(logit - max) over the V
// real entries; losses (N) = -(logit[target] - max - log(sum)) when targets is not NULL.
// One block per position. bytes: N*V floatX + 3 N fp32 + N ints; FLOPs: about 4 N*V plus N*V exp
template <typename floatX>
__global__ void classifier_forward_kernel(float* losses, float* row_max, float* row_sum, const floatX* logits,
                                          const int* targets, int V, int Vp, bool vector) {
    __shared__ float warp_max[CLASSIFIER_WARPS], warp_sum[CLASSIFIER_WARPS];
    const floatX* x = logits + (size_t)blockIdx.x * Vp;
    float m, s;
    classifier_row_reduce(x, V, vector, m, s, warp_max, warp_sum);
    if (threadIdx.x != 0) { return; }
    row_max[blockIdx.x] = m;
    row_sum[blockIdx.x] = s;
    if (targets != NULL) { losses[blockIdx.x] = -(to_float(x[targets[blockIdx.x]]) - m - logf(s)); }
}

// dlogits (N,Vp) = (exp(logit - max) / sum - onehot(target - v0)) * dloss, zero past V; one thread per
// pack; may run in place. v0: the token of column 0 (0; --tp: this rank's first row of wte,
// cuda/tensor_parallel.cuh). bytes: 2 N*Vp floatX + 2 N fp32 + N ints; FLOPs: about 4 N*V plus N*V exp
template <typename floatX>
__global__ void classifier_backward_kernel(floatX* dlogits, const floatX* logits, const float* row_max,
                                           const float* row_sum, const int* targets, int v0, float dloss, int V, int Vp,
                                           bool vector) {
    const int VEC = Packed128<floatX>::size;
    int row = blockIdx.x;  // rows on x: B*T may pass gridDim.y's limit of 65535
    int i = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
    if (i >= Vp) { return; }
    float m = row_max[row], inv = 1.0f / row_sum[row];
    Packed128<floatX> x = load_pack(logits + (size_t)row * Vp, i, Vp, vector);
    store_pack(dlogits + (size_t)row * Vp, i, Vp, vector, classifier_grad_pack(x, i, m, inv, targets[row] - v0, dloss, V));
}

// the two above in one pass per row, in place: losses (N) and logits (N,Vp) -> their gradient.
// The row's (max, sum) reach every thread through shared memory, after thread 0 has read the
// target's logit (before any thread overwrites it). bytes: 3 N*Vp floatX (two reads, one
// write) + N fp32 + N ints; FLOPs: about 8 N*V plus 2 N*V exp
template <typename floatX>
__global__ void classifier_fused_kernel(float* losses, floatX* logits, const int* targets, float dloss, int V, int Vp,
                                        bool vector) {
    __shared__ float warp_max[CLASSIFIER_WARPS], warp_sum[CLASSIFIER_WARPS], row[2];  // row: max, sum
    const int VEC = Packed128<floatX>::size;
    floatX* x = logits + (size_t)blockIdx.x * Vp;
    int target = targets[blockIdx.x];
    float m, s;
    classifier_row_reduce(x, V, vector, m, s, warp_max, warp_sum);
    if (threadIdx.x == 0) {
        row[0] = m;
        row[1] = s;
        losses[blockIdx.x] = -(to_float(x[target]) - m - logf(s));
    }
    __syncthreads();
    m = row[0];
    float inv = 1.0f / row[1];
    for (int i = threadIdx.x * VEC; i < Vp; i += blockDim.x * VEC) {
        Packed128<floatX> p = load_pack(x, i, Vp, vector);
        store_pack(x, i, Vp, vector, classifier_grad_pack(p, i, m, inv, target, dloss, V));
    }
}

// probs (Vp) = softmax of one position's logits (Vp) from its row statistics, zero past V (fp32).
// bytes: Vp floatX + Vp fp32; FLOPs: 2 Vp plus V exp
template <typename floatX>
__global__ void softmax_row_kernel(float* probs, const floatX* logits, const float* row_max, const float* row_sum,
                                   int V, int Vp) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= Vp) { return; }
    float inv = 1.0f / *row_sum;
    probs[i] = i < V ? expf(to_float(logits[i]) - *row_max) * inv : 0.0f;
}

// ----------------------------------------------------------------------------
// kernel launchers

// per position of logits (B,T,Vp): row_max, row_sum (B,T) = max and sum of exp(logit - max) over
// the first V entries; losses (B,T) = -log softmax[target] when targets (B,T) is not NULL (losses
// may then be NULL too: only the row statistics, e.g. for sampling)
template <typename floatX>
void classifier_forward_cuda(float* losses, float* row_max, float* row_sum, const floatX* logits, const int* targets,
                             int B, int T, int V, int Vp, cudaStream_t stream) {
    prof_kernel(stream, PROF_CLASSIFIER, prof_classifier((size_t)B * T, V, Vp, sizeof(floatX)), "forward (softmax, cross-entropy)");
    if (V < 1 || V > Vp) { fail("classifier_forward_cuda: V=%d must be in [1, Vp=%d]", V, Vp); }
    if (B * T == 0) { return; }
    const int VEC = Packed128<floatX>::size;
    bool vector = Vp % VEC == 0 && is_aligned16(logits);
    classifier_forward_kernel<floatX><<<B * T, CLASSIFIER_FORWARD_BLOCK, 0, stream>>>(losses, row_max, row_sum, logits,
                                                                                    targets, V, Vp, vector);
    CUDA_CHECK_LAUNCH();
}

// dlogits (B,T,Vp) writes (softmax - onehot(target)) * dloss, zero past V; dloss is d(total loss) /
// d(each position's loss), e.g. 1/(B*T) for a mean; dlogits may equal logits (in place)
template <typename floatX>
void classifier_backward_cuda(floatX* dlogits, const floatX* logits, const float* row_max, const float* row_sum,
                              const int* targets, float dloss, int B, int T, int V, int Vp, cudaStream_t stream) {
    prof_kernel(stream, PROF_CLASSIFIER, prof_classifier((size_t)B * T, V, Vp, sizeof(floatX)), "backward");
    if (V < 1 || V > Vp) { fail("classifier_backward_cuda: V=%d must be in [1, Vp=%d]", V, Vp); }
    if (B * T == 0) { return; }
    const int VEC = Packed128<floatX>::size;
    bool vector = Vp % VEC == 0 && is_aligned16(logits) && is_aligned16(dlogits);
    dim3 grid(B * T, ceil_div(ceil_div(Vp, VEC), CLASSIFIER_BACKWARD_BLOCK));
    classifier_backward_kernel<floatX><<<grid, CLASSIFIER_BACKWARD_BLOCK, 0, stream>>>(dlogits, logits, row_max, row_sum,
                                                                                      targets, 0, dloss, V, Vp, vector);
    CUDA_CHECK_LAUNCH();
}

// losses (B,T) = -log softmax[target], and logits (B,T,Vp) turned in place into their gradient
// (softmax - onehot(target)) * dloss, zero past V: classifier_forward_cuda, then
// classifier_backward_cuda in place, bit for bit, in one kernel (no row statistics kept)
template <typename floatX>
void classifier_fused_cuda(float* losses, floatX* logits, const int* targets, float dloss, int B, int T, int V, int Vp,
                           cudaStream_t stream) {
    prof_kernel(stream, PROF_CLASSIFIER, prof_classifier((size_t)B * T, V, Vp, sizeof(floatX)), "forward and backward, fused (--loss-chunk)");
    if (V < 1 || V > Vp) { fail("classifier_fused_cuda: V=%d must be in [1, Vp=%d]", V, Vp); }
    if (B * T == 0) { return; }
    const int VEC = Packed128<floatX>::size;
    bool vector = Vp % VEC == 0 && is_aligned16(logits);
    classifier_fused_kernel<floatX><<<B * T, CLASSIFIER_FORWARD_BLOCK, 0, stream>>>(losses, logits, targets, dloss, V, Vp, vector);
    CUDA_CHECK_LAUNCH();
}

// probs (Vp) = softmax over the first V logits of one position (b*T + t), zero past V, in fp32
template <typename floatX>
void softmax_row_cuda(float* probs, const floatX* logits, const float* row_max, const float* row_sum, int position,
                      int V, int Vp, cudaStream_t stream) {
    softmax_row_kernel<floatX><<<ceil_div(Vp, CLASSIFIER_BACKWARD_BLOCK), CLASSIFIER_BACKWARD_BLOCK, 0, stream>>>(
        probs, logits + (size_t)position * Vp, row_max + position, row_sum + position, V, Vp);
    CUDA_CHECK_LAUNCH();
}

#endif // CUDA_CLASSIFIER_CUH
