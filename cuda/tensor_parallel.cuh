/*
tensor_parallel.cuh: --tp N and --sp on the device, the counterpart of cpu/tensor_parallel.h (read it
first: the split of each tensor, the hooks, why every rank of a group ends with the same bits). The
ranks of a tensor-parallel group each hold a slice of every layer's four matrices (Megatron-LM, Shoeybi
et al. 2019): qkvw and fcw column-parallel, attprojw and fcprojw row-parallel with their bias added by
rank 0 only, so a block has two sums forward and two backward; wte is split over the vocabulary, so the
embedding is summed over the group and a rank's logits are its Vp/N columns. With --sp (Korthikanti et
al. 2022) the residual stream and the LayerNorms are a rank's B T/N rows: an all-gather before each
column-parallel matmul, a reduce-scatter after each row-parallel one.

    TpCuda tp = tp_cuda_create(&tensor, comm, gathered, norm_grads);   // tensor: this rank's Dist in its group
    const floatX* ln1 = tp_gather_cuda(&tp, a->ln1, R * C, stream);    // hook: the group's rows (--sp), or a->ln1
    floatX* proj = tp_partial_cuda(&tp, a->residual2);                 // where the row-parallel matmul writes
    tp_reduce_cuda(&tp, proj, a->residual2, B * T * C, stream);        // hook: the partial sums added
    tp_cuda_destroy(&tp);

Invariants. The group's collectives run on its own stream (tp.stream) over its own NCCL communicator
(cuda/nccl.cuh's nccl_init_groups: one per group, the data-parallel group's gradients go over another):
each hook queues the collective after what `stream` queued so far and makes `stream` wait for it, so a
caller sees the result in stream order. Where nothing reads the result at once (a column-parallel
matmul's input gradient while its weight gradient's GEMM runs) tp_reduce_begin_cuda and
tp_reduce_end_cuda are the two halves, and the collective overlaps the GEMM. NCCL's all-reduce and
reduce-scatter give every rank of the group the same bits, so what a group holds whole (the residual
stream, the LayerNorms, the row-parallel biases and their gradients) stays the same on every rank.
NCCL's in-place rules hold: a reduce-scatter's output is a separate buffer or its input + rank n/N, an
all-gather's input a separate buffer. The partial sums are in the activations' precision (bf16: each
rank's partial rounded once, then the sum; cpu/tensor_parallel.h's are fp32).

With one rank (TP_CUDA_NONE) every hook does nothing and the block is the plain one, bit for bit.
Failure: a collective that fails stops with NCCL's message (NCCL_CHECK).
*/
#ifndef CUDA_TENSOR_PARALLEL_CUH
#define CUDA_TENSOR_PARALLEL_CUH

#include "common.cuh"
#include "nccl.cuh"
#include "profile.cuh"
#include "encoder.cuh"     // ENCODER_BLOCK: the vocabulary-parallel embedding's launch
#include "classifier.cuh"  // the classifier's kernels and row reductions, which the vocabulary-parallel head shares
#include "../llmc/distributed.h"

typedef struct {
    int rank, size;         // this rank in the tensor-parallel group, and the group's size (1: no --tp)
    ncclComm_t comm;        // the group's communicator (NULL without --tp)
    cudaStream_t stream;    // the group's collectives
    cudaEvent_t queued;     // the caller's stream: what a collective must wait for
    cudaEvent_t done;       // tp.stream: the collectives queued so far
    void* gathered;         // --sp: (B,T,C) floatX where the group's rows meet; NULL without --sp
    float* norm_grads;      // --sp: (2C) fp32, a LayerNorm's weight and bias gradients of this rank's rows
} TpCuda;

static const TpCuda TP_CUDA_NONE = {0, 1, NULL, NULL, NULL, NULL, NULL, NULL};

// the group of `tensor` (from dist_grid) over comm, which it keeps (and tp_cuda_destroy frees); gathered,
// norm_grads: --sp's buffers, NULL without
static TpCuda tp_cuda_create(const Dist* tensor, ncclComm_t comm, void* gathered, float* norm_grads) {
    if (tensor->world <= 1) { return TP_CUDA_NONE; }
    TpCuda tp = {tensor->rank, tensor->world, comm, NULL, NULL, NULL, gathered, norm_grads};
    CUDA_CHECK(cudaStreamCreate(&tp.stream));
    CUDA_CHECK(cudaEventCreateWithFlags(&tp.queued, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&tp.done, cudaEventDisableTiming));
    return tp;
}

// the group's stream, events and communicator (tp_cuda_create took it over)
static void tp_cuda_destroy(TpCuda* tp) {
    if (tp->size == 1) { return; }
    CUDA_CHECK(cudaEventDestroy(tp->queued));
    CUDA_CHECK(cudaEventDestroy(tp->done));
    CUDA_CHECK(cudaStreamDestroy(tp->stream));
    nccl_comm_destroy(tp->comm);
    *tp = TP_CUDA_NONE;
}

template <typename T> inline ncclDataType_t nccl_type();
template <> inline ncclDataType_t nccl_type<float>() { return ncclFloat; }
template <> inline ncclDataType_t nccl_type<__nv_bfloat16>() { return ncclBfloat16; }

// the group's stream waits for what `stream` queued so far
static void tp_stream_after(const TpCuda* tp, cudaStream_t stream) {
    CUDA_CHECK(cudaEventRecord(tp->queued, stream));
    CUDA_CHECK(cudaStreamWaitEvent(tp->stream, tp->queued, 0));
}

// `stream` waits for the group's collectives queued so far
static void tp_wait_cuda(const TpCuda* tp, cudaStream_t stream) {
    CUDA_CHECK(cudaEventRecord(tp->done, tp->stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, tp->done, 0));
}

// buf (n of T, device) := the group's sum (or ncclMax) of buf, in place, in `stream`'s order
template <typename T>
static void tp_allreduce_cuda(const TpCuda* tp, T* buf, size_t n, ncclRedOp_t op, cudaStream_t stream) {
    if (tp->size == 1) { return; }
    tp_stream_after(tp, stream);
    NCCL_CHECK(ncclAllReduce(buf, buf, n, nccl_type<T>(), op, tp->comm, tp->stream));
    tp_wait_cuda(tp, stream);
}

// ----------------------------------------------------------------------------
// --sp: the rows of the residual stream a rank holds (cpu/tensor_parallel.h's tp_rows, tp_first_row)

static size_t tp_rows_cuda(const TpCuda* tp, size_t BT) { return tp->gathered ? BT / (size_t)tp->size : BT; }
static size_t tp_first_row_cuda(const TpCuda* tp, size_t BT) { return tp->gathered ? (size_t)tp->rank * tp_rows_cuda(tp, BT) : 0; }

// hook, before a column-parallel matmul: its input (B,T,C); mine itself, or with --sp the group's rows
// (this rank's: mine, n elements) gathered into the shared buffer
template <typename floatX>
static const floatX* tp_gather_cuda(const TpCuda* tp, const floatX* mine, size_t n, cudaStream_t stream) {
    if (tp->gathered == NULL) { return mine; }
    tp_stream_after(tp, stream);
    NCCL_CHECK(ncclAllGather(mine, tp->gathered, n, nccl_type<floatX>(), tp->comm, tp->stream));
    tp_wait_cuda(tp, stream);
    return (const floatX*)tp->gathered;
}

// where a row-parallel matmul writes its partial output (B,T,C): out, or with --sp the shared buffer
template <typename floatX>
static floatX* tp_partial_cuda(const TpCuda* tp, floatX* out) { return tp->gathered ? (floatX*)tp->gathered : out; }

// a row-parallel matmul's bias: rank 0 adds it, so that the group's sum holds it once
template <typename floatX>
static const floatX* tp_row_bias_cuda(const TpCuda* tp, const floatX* bias) { return tp->rank == 0 ? bias : NULL; }

// the first half of tp_reduce_cuda: the collective queued after `stream`'s work, not yet waited for
template <typename floatX>
static void tp_reduce_begin_cuda(const TpCuda* tp, floatX* partial, floatX* out, size_t n, cudaStream_t stream) {
    if (tp->size == 1) { return; }
    tp_stream_after(tp, stream);
    if (tp->gathered == NULL) {
        NCCL_CHECK(ncclAllReduce(partial, partial, n, nccl_type<floatX>(), ncclSum, tp->comm, tp->stream));
    } else {
        NCCL_CHECK(ncclReduceScatter(partial, out, n / (size_t)tp->size, nccl_type<floatX>(), ncclSum, tp->comm, tp->stream));
    }
}

// the second: `stream` waits for it
static void tp_reduce_end_cuda(const TpCuda* tp, cudaStream_t stream) {
    if (tp->size > 1) { tp_wait_cuda(tp, stream); }
}

// hook: the group's partial sums in `partial` (n = B T C elements) added: in place (--tp: out is
// partial), or with --sp this rank's rows of the sum into out (n / N elements: a separate buffer, or
// partial + rank n/N, NCCL's in-place reduce-scatter)
template <typename floatX>
static void tp_reduce_cuda(const TpCuda* tp, floatX* partial, floatX* out, size_t n, cudaStream_t stream) {
    tp_reduce_begin_cuda(tp, partial, out, n, stream);
    tp_reduce_end_cuda(tp, stream);
}

// where tp_reduce_cuda leaves the sum of a partial (B,T,C) buffer when it reduces in place: the buffer,
// or with --sp this rank's rows of it
template <typename floatX>
static floatX* tp_reduced_rows_cuda(const TpCuda* tp, floatX* partial, size_t BT, int C) {
    return partial + tp_first_row_cuda(tp, BT) * C;
}

// --sp: a LayerNorm's backward over this rank's rows gives a part of its weight's and bias's gradients,
// into the 2C scratch floats (zeroed here); tp_norm_grads_done_cuda adds the group's sum into the
// model's. Without --sp the model's own (dw, db), += as always
typedef struct { float *w, *b; } TpNormGradsCuda;

static TpNormGradsCuda tp_norm_grads_cuda(const TpCuda* tp, float* dw, float* db, int C, cudaStream_t stream) {
    TpNormGradsCuda g = {dw, db};
    if (tp->gathered == NULL) { return g; }
    CUDA_CHECK(cudaMemsetAsync(tp->norm_grads, 0, 2 * (size_t)C * sizeof(float), stream));
    g.w = tp->norm_grads;
    g.b = tp->norm_grads + C;
    return g;
}

// hook, after a LayerNorm's backward: --sp's parts of its parameter gradients summed over the group and added
static void tp_norm_grads_done_cuda(const TpCuda* tp, float* dw, float* db, int C, cudaStream_t stream) {
    if (tp->gathered == NULL) { return; }
    tp_allreduce_cuda(tp, tp->norm_grads, 2 * (size_t)C, ncclSum, stream);
    add_partial_sums_cuda(dw, tp->norm_grads, 1, C, (size_t)C, stream);  // dw += the sum (one part)
    add_partial_sums_cuda(db, tp->norm_grads + C, 1, C, (size_t)C, stream);
}

// ----------------------------------------------------------------------------
// the vocabulary-parallel embedding and classifier (cpu/tensor_parallel.h): this rank holds the Vr =
// Vp/N rows of wte of tokens v0 = rank Vr .. v0 + Vr - 1, of which `real` are below V

static int tp_real_rows_cuda(const TpCuda* tp, int V, int Vr) {
    int real = V - tp->rank * Vr;
    return real < 0 ? 0 : real > Vr ? Vr : real;
}

// CUDA kernels

// out (BT,C) = wte (Vr,C)[inp - v0] where this rank holds the token, else 0; a thread per pack of
// channels of a position. bytes: 2 BT*C floatX + BT ints
template <typename floatX>
__global__ void tp_encoder_rows_kernel(floatX* out, const int* inp, const floatX* wte, int v0, int Vr, int BT, int C, bool vector) {
    const int VEC = Packed128<floatX>::size;
    int packs = ceil_div(C, VEC);
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * packs) { return; }
    int bt = (int)(idx / packs), c = (int)(idx % packs) * VEC, row = inp[bt] - v0;
    Packed128<floatX> we = row >= 0 && row < Vr ? load_pack(wte + (size_t)row * C, c, C, vector) : Packed128<floatX>::zeros();
    store_pack(out + (size_t)bt * C, c, C, vector, we);
}

// out (R,C) += wpe (maxT,C)[t] of rows first .. first + R - 1 (t = row mod T), rounded once (as the
// plain embedding's wte + wpe: the group's sum of one nonzero row is that row's bits). bytes: 3 R*C floatX
template <typename floatX>
__global__ void tp_encoder_add_wpe_kernel(floatX* out, const floatX* wpe, size_t first, int R, int T, int C, bool vector) {
    const int VEC = Packed128<floatX>::size;
    int packs = ceil_div(C, VEC);
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)R * packs) { return; }
    int r = (int)(idx / packs), c = (int)(idx % packs) * VEC;
    size_t t = (first + (size_t)r) % (size_t)T;
    Packed128<floatX> o = load_pack(out + (size_t)r * C, c, C, vector), pe = load_pack(wpe + t * C, c, C, vector);
    for (int k = 0; k < VEC; k++) { o[k] = from_float<floatX>(to_float(o[k]) + to_float(pe[k])); }
    store_pack(out + (size_t)r * C, c, C, vector, o);
}

// row_max (n) = the largest of each row of logits (n,Vr) over its first `real` columns (-inf: none);
// a block per row, the threads' maxima by warp butterflies, then the warps in order
template <typename floatX>
__global__ void tp_row_max_kernel(float* row_max, const floatX* logits, int real, int Vr, bool vector) {
    __shared__ float warp_max[CLASSIFIER_WARPS];
    const int VEC = Packed128<floatX>::size;
    const floatX* x = logits + (size_t)blockIdx.x * Vr;
    float m = -INFINITY;
    for (int i = threadIdx.x * VEC; i < real; i += blockDim.x * VEC) {
        Packed128<floatX> p = load_pack(x, i, real, vector);
        for (int k = 0; k < VEC && i + k < real; k++) { m = fmaxf(m, to_float(p[k])); }
    }
    m = warp_reduce_max(m);
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) { warp_max[warp] = m; }
    __syncthreads();
    if (threadIdx.x != 0) { return; }
    m = warp_max[0];
    for (int w = 1; w < (int)blockDim.x / WARP_SIZE; w++) { m = fmaxf(m, warp_max[w]); }
    row_max[blockIdx.x] = m;
}

// row_sum (n) = the sum of exp(logit - row_max) over each row's first `real` columns (the group's max):
// each thread its columns in order, the threads by warp butterflies, the warps in order
template <typename floatX>
__global__ void tp_row_sum_kernel(float* row_sum, const floatX* logits, const float* row_max, int real, int Vr, bool vector) {
    __shared__ float warp_sum[CLASSIFIER_WARPS];
    const int VEC = Packed128<floatX>::size;
    const floatX* x = logits + (size_t)blockIdx.x * Vr;
    float m = row_max[blockIdx.x], s = 0.0f;
    for (int i = threadIdx.x * VEC; i < real; i += blockDim.x * VEC) {
        Packed128<floatX> p = load_pack(x, i, real, vector);
        for (int k = 0; k < VEC && i + k < real; k++) { s += expf(to_float(p[k]) - m); }
    }
    s = warp_reduce_sum(s);
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    if (lane == 0) { warp_sum[warp] = s; }
    __syncthreads();
    if (threadIdx.x != 0) { return; }
    s = warp_sum[0];
    for (int w = 1; w < (int)blockDim.x / WARP_SIZE; w++) { s += warp_sum[w]; }
    row_sum[blockIdx.x] = s;
}

// losses (n) = -(logit[target] - max - log(sum)) of the rows whose target this rank holds, 0 for the
// others (the group's sum then holds each row's once); a thread per row
template <typename floatX>
__global__ void tp_loss_kernel(float* losses, const floatX* logits, const float* row_max, const float* row_sum,
                               const int* targets, int v0, int Vr, int n) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) { return; }
    int col = targets[r] - v0;
    losses[r] = col >= 0 && col < Vr ? -(to_float(logits[(size_t)r * Vr + col]) - row_max[r] - logf(row_sum[r])) : 0.0f;
}

// kernel launchers

// out (B,T,C) = wte[inp] + wpe[t] with wte split over the vocabulary (cpu/tensor_parallel.h's
// tp_encoder_forward): the rows of the tokens this rank holds, zeros for the others', summed over the
// group (--sp: reduce-scattered, out this rank's rows), then wpe added to this rank's rows
template <typename floatX>
void tp_encoder_forward_cuda(const TpCuda* tp, floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int B, int T,
                             int C, int Vr, cudaStream_t stream) {
    prof_kernel(stream, PROF_ENCODER, prof_encoder_forward((size_t)B * T, C, sizeof(floatX)), "forward (vocabulary-parallel)");
    const int VEC = Packed128<floatX>::size;
    size_t BT = (size_t)B * T, R = tp_rows_cuda(tp, BT);
    floatX* full = tp_partial_cuda(tp, out);
    bool vector = C % VEC == 0 && is_aligned16(full) && is_aligned16(wte) && is_aligned16(wpe) && is_aligned16(out);
    size_t threads = BT * ceil_div(C, VEC);
    if (threads == 0) { return; }
    tp_encoder_rows_kernel<floatX><<<(unsigned)ceil_div(threads, (size_t)ENCODER_BLOCK), ENCODER_BLOCK, 0, stream>>>(
        full, inp, wte, tp->rank * Vr, Vr, (int)BT, C, vector);
    CUDA_CHECK_LAUNCH();
    tp_reduce_cuda(tp, full, out, BT * C, stream);
    threads = R * ceil_div(C, VEC);
    tp_encoder_add_wpe_kernel<floatX><<<(unsigned)ceil_div(threads, (size_t)ENCODER_BLOCK), ENCODER_BLOCK, 0, stream>>>(
        out, wpe, tp_first_row_cuda(tp, BT), (int)R, T, C, vector);
    CUDA_CHECK_LAUNCH();
}

// dwte (Vr,C) += dout (B,T,C) of the tokens this rank holds, dwpe (maxT,C) += the sum over b (dout is
// every row's: with --sp gathered first), as cpu/tensor_parallel.h's tp_encoder_backward; inp on the host
template <typename floatX>
void tp_encoder_backward_cuda(const TpCuda* tp, float* dwte, float* dwpe, const floatX* dout, const int* inp, int B, int T, int C,
                              int Vr, int* scratch, cudaStream_t stream) {
    prof_kernel(stream, PROF_ENCODER, prof_encoder_backward((size_t)B * T, T, C, sizeof(floatX)), "backward (vocabulary-parallel)");
    encoder_backward_rows_cuda(dwte, dwpe, dout, inp, B, T, C, tp->rank * Vr, Vr, scratch, stream);
}

// the vocabulary-parallel softmax's statistics and the loss (cpu/tensor_parallel.h's tp_softmax_forward,
// tp_crossentropy_forward), for n rows of logits (n,Vr), this rank's columns: row_max (n) the group's
// largest logit of each row, row_sum (n) the group's sum of exp(logit - max) (two all-reduces of n
// floats), and with targets (n) the losses (n) from the rank that holds each target, summed (a third)
template <typename floatX>
void tp_classifier_forward_cuda(const TpCuda* tp, float* losses, float* row_max, float* row_sum, const floatX* logits,
                                const int* targets, int n, int V, int Vr, cudaStream_t stream) {
    int real = tp_real_rows_cuda(tp, V, Vr);
    prof_kernel(stream, PROF_CLASSIFIER, prof_classifier((size_t)n, real, Vr, sizeof(floatX)), "forward (softmax, cross-entropy; vocabulary-parallel)");
    if (n == 0) { return; }
    const int VEC = Packed128<floatX>::size;
    bool vector = Vr % VEC == 0 && is_aligned16(logits);
    tp_row_max_kernel<floatX><<<n, CLASSIFIER_FORWARD_BLOCK, 0, stream>>>(row_max, logits, real, Vr, vector);
    CUDA_CHECK_LAUNCH();
    tp_allreduce_cuda(tp, row_max, (size_t)n, ncclMax, stream);
    tp_row_sum_kernel<floatX><<<n, CLASSIFIER_FORWARD_BLOCK, 0, stream>>>(row_sum, logits, row_max, real, Vr, vector);
    CUDA_CHECK_LAUNCH();
    tp_allreduce_cuda(tp, row_sum, (size_t)n, ncclSum, stream);
    if (targets == NULL) { return; }
    tp_loss_kernel<floatX><<<ceil_div(n, CLASSIFIER_BACKWARD_BLOCK), CLASSIFIER_BACKWARD_BLOCK, 0, stream>>>(
        losses, logits, row_max, row_sum, targets, tp->rank * Vr, Vr, n);
    CUDA_CHECK_LAUNCH();
    tp_allreduce_cuda(tp, losses, (size_t)n, ncclSum, stream);
}

// dlogits (n,Vr) = (softmax - onehot(target)) * dloss on this rank's columns, zero past V, from the
// group's row statistics (cpu/tensor_parallel.h's tp_crossentropy_softmax_backward); in place allowed
template <typename floatX>
void tp_classifier_backward_cuda(const TpCuda* tp, floatX* dlogits, const floatX* logits, const float* row_max,
                                 const float* row_sum, const int* targets, float dloss, int n, int V, int Vr, cudaStream_t stream) {
    int real = tp_real_rows_cuda(tp, V, Vr);
    prof_kernel(stream, PROF_CLASSIFIER, prof_classifier((size_t)n, real, Vr, sizeof(floatX)), "backward (vocabulary-parallel)");
    if (n == 0) { return; }
    const int VEC = Packed128<floatX>::size;
    bool vector = Vr % VEC == 0 && is_aligned16(logits) && is_aligned16(dlogits);
    dim3 grid(n, ceil_div(ceil_div(Vr, VEC), CLASSIFIER_BACKWARD_BLOCK));
    classifier_backward_kernel<floatX><<<grid, CLASSIFIER_BACKWARD_BLOCK, 0, stream>>>(dlogits, logits, row_max, row_sum,
                                                                                      targets, tp->rank * Vr, dloss, real, Vr, vector);
    CUDA_CHECK_LAUNCH();
}

// probs (Vp, fp32) = the softmax of one row of logits (Vr, this rank's columns) from the group's row
// statistics, every rank's columns gathered whole (sampling: every rank of the group asks alike)
template <typename floatX>
void tp_softmax_row_cuda(const TpCuda* tp, float* probs, const floatX* logits, const float* row_max, const float* row_sum,
                         int position, int V, int Vr, cudaStream_t stream) {
    float* mine = probs + (size_t)tp->rank * Vr;
    softmax_row_cuda(mine, logits, row_max, row_sum, position, tp_real_rows_cuda(tp, V, Vr), Vr, stream);
    tp_stream_after(tp, stream);
    NCCL_CHECK(ncclAllGather(mine, probs, (size_t)Vr, ncclFloat, tp->comm, tp->stream));
    tp_wait_cuda(tp, stream);
}

#endif // CUDA_TENSOR_PARALLEL_CUH
