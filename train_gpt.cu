/*
train_gpt.cu: GPT-2 training on NVIDIA GPUs, one process each: the CUDA backend of the one training program
(llmc/trainer.h). Everything around the model (flags, checks, the memory plan, checkpoints,
resume, validation, sampling, the log and the loop) is the shared code the CPU trainer runs
too; this file holds the model's tensors in device memory and calls the kernels of cuda/,
each of which mirrors its CPU function in cpu/layers.h. Read it beside train_gpt.c: the
same sections, in the same order, with the same names.

Precision (--precision, default bf16): weights and activations in floatX (fp32 or bf16),
fp32 master weights, fp32 weight gradients and optimizer state, fp32 sums everywhere (GEMMs
accumulate in fp32). bf16 values are rounded to nearest-even once, where they are stored,
so a run is deterministic: the same flags and seed give bitwise the same checkpoint.

    make train_gpt_cu && ./train_gpt_cu -e d12 -b 16 -t 1024           # bf16
    ./train_gpt_cu --precision fp32 -e tiny                              # compared with ./train_gpt
    mpirun -np 2 ./train_gpt_cu -e d12 --tp 2 --sp                       # each layer split over 2 GPUs
    make build/emu/train_gpt && ./build/emu/train_gpt ...                # the same source, emulated on the CPU

Optimizers: AdamW, Adafactor and CAME (cuda/adamw.cuh, adafactor.cuh, came.cuh), in the CPU's
state layout, so a checkpoint resumes on either backend. Data parallel: `mpirun -np N ./train_gpt_cu
--zero 0|1|2|3`, one process per GPU (the node-local rank's), NCCL bootstrapped over MPI (cuda/nccl.cuh);
--zero 1 shards every optimizer as the CPU does (Adafactor's and CAME's statistics over a whole slice
are added across the ranks by NCCL inside the update), so sharded state files move between backends;
--zero 2 shards the gradients too, --zero 3 the weights as well (gathered layer by layer into two
buffers, the next layer's gather overlapping this one's compute: see "ZeRO-3"); all exchange one
collective per layer (see "ZeRO", cuda/zero.cuh).
Tensor parallel: `mpirun -np N ./train_gpt_cu --tp T [--sp]`, groups of T adjacent ranks that split each
layer's matrices, the embedding and the classifier over the vocabulary (Megatron-LM), each group over an
NCCL communicator of its own (cuda/nccl.cuh's nccl_init_groups, cuda/tensor_parallel.cuh: its hooks in
block_forward and block_backward), the data-parallel groups across them over another; --zero shards
over the data-parallel group; the model is a rank's slices (the config's tp), the checkpoints the whole
model (cpu/tensor_parallel.h's stream over the host copies).
--offload activations moves kept activations to pinned host memory on a copy stream (see "offload");
--offload optimizer[,gradients] keeps the fp32 master weights and optimizer state in pinned host
memory and runs the step on the CPU with the CPU reference's code (see "optimizer offload").
Attention: --attention flash, the default where the head size allows (cuda/flash_attention.cuh: no
T x T weights, each row's log-sum-exp kept), or matmul (cuda/attention.cuh: the weights kept).
*/
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/trainer.h"
#include "cuda/common.cuh"
#include "cuda/nccl.cuh"
#include "cuda/zero.cuh"
#include "cuda/encoder.cuh"
#include "cuda/layernorm.cuh"
#include "cuda/matmul.cuh"
#include "cuda/attention.cuh"
#include "cuda/flash_attention.cuh"
#include "cuda/gelu.cuh"
#include "cuda/residual.cuh"
#include "cuda/classifier.cuh"
#include "cuda/adamw.cuh"
#include "cuda/adamw_lowp.cuh"
#include "cuda/adafactor.cuh"
#include "cuda/came.cuh"
#include "cuda/factored_lowp.cuh"
#include "cuda/global_norm.cuh"
#include "cuda/scale.cuh"
#include "cuda/profile.cuh"
#include "cuda/tensor_parallel.cuh"  // --tp, --sp: a block's matrices split over ranks (Megatron-LM): the hooks in block_forward, block_backward
#include "cpu/host_step.h"
#include "cpu/tensor_parallel.h"     // --tp: the checkpoints' stream of the whole model through the group's slices (TpStream)
#include "cuda/pipeline.cuh"         // --pp: the messages between stages on a stream of their own, wte's pair
#include "cpu/pipeline.h"            // --pp: the checkpoints' stream of the whole model through the stages' parts

// ----------------------------------------------------------------------------
// device memory: the accounting allocator's categories in device and pinned host memory

static void* device_alloc(size_t bytes) {
    void* p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) { cudaGetLastError(); return NULL; }  // out of memory: mem_alloc says so
    return p;
}
static void device_release(void* p) { CUDA_CHECK(cudaFree(p)); }
static void* pinned_alloc(size_t bytes) {
    void* p = NULL;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) { cudaGetLastError(); return NULL; }
    return p;
}
static void pinned_release(void* p) { CUDA_CHECK(cudaFreeHost(p)); }
static const MemAllocator MEM_DEVICE = {device_alloc, device_release, "GPU memory"};
static const MemAllocator MEM_PINNED = {pinned_alloc, pinned_release, "pinned host memory"};

// what lives on the GPU; the data loaders' and the sampler's buffers stay in host memory, the
// host copies are pinned (fast copies for checkpoints)
static void use_device_memory(void) {
    const MemCategory on_device[] = {MEM_PARAMETERS, MEM_GRADIENTS, MEM_OPTIMIZER, MEM_ACTIVATIONS, MEM_ACT_GRADIENTS};
    for (size_t i = 0; i < sizeof(on_device) / sizeof(on_device[0]); i++) { mem_set_allocator(on_device[i], MEM_DEVICE); }
    mem_set_allocator(MEM_HOST_COPIES, MEM_PINNED);
    mem_set_allocator(MEM_OFFLOADED, MEM_PINNED);  // --offload: copies that overlap compute need pinned memory
    mem_set_allocator(MEM_OPT_HOST, MEM_PINNED);
}

// ----------------------------------------------------------------------------
// parameters: the 16 tensors in checkpoint order, of type T (fp32 master, floatX working copy)

template <typename T>
struct Params {
    T *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb, *lnfw, *lnfb;
};

// where p keeps parameter tensor i's address (checkpoint order)
template <typename T>
static T** param_slot(Params<T>* p, int i) {
    T** ptrs[NUM_PARAMETER_TENSORS] = {
        &p->wte, &p->wpe, &p->ln1w, &p->ln1b, &p->qkvw, &p->qkvb, &p->attprojw, &p->attprojb,
        &p->ln2w, &p->ln2b, &p->fcw, &p->fcb, &p->fcprojw, &p->fcprojb, &p->lnfw, &p->lnfb,
    };
    return ptrs[i];
}

// the tensors of cfg's model one after another from memory; layer_only: the 12 per-layer tensors
// only (a layer buffer of their slices of one layer, cfg a one-layer model), the others left as they are
template <typename T>
static void point_params(Params<T>* p, T* memory, const GPT2Config* cfg, int layer_only = 0) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(sizes, cfg);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (layer_only && !PARAMETER_IS_PER_LAYER[i]) { continue; }
        *param_slot(p, i) = memory;
        memory += sizes[i];
    }
}

// parameter tensor i (checkpoint order) of p
template <typename T>
static T* param_tensor(const Params<T>* p, int i) {
    T* const ptrs[NUM_PARAMETER_TENSORS] = {
        p->wte, p->wpe, p->ln1w, p->ln1b, p->qkvw, p->qkvb, p->attprojw, p->attprojb,
        p->ln2w, p->ln2b, p->fcw, p->fcb, p->fcprojw, p->fcprojb, p->lnfw, p->lnfb,
    };
    return ptrs[i];
}

// one layer's slice of the per-layer tensors
template <typename T>
struct LayerParams {
    T *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};

// layer l's slice of each per-layer tensor of p (shapes: cfg's, a rank's slices with --tp)
template <typename T>
static LayerParams<T> layer_params(const Params<T>* p, int l, const GPT2Config* cfg) {
    size_t at[NUM_PARAMETER_TENSORS];  // floats before layer l of each tensor
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t rows, cols;
        gpt2_tensor_shape(i, cfg, &rows, &cols);
        at[i] = (size_t)l * rows * cols;
    }
    LayerParams<T> lp = {
        p->ln1w + at[2], p->ln1b + at[3], p->qkvw + at[4], p->qkvb + at[5], p->attprojw + at[6], p->attprojb + at[7],
        p->ln2w + at[8], p->ln2b + at[9], p->fcw + at[10], p->fcb + at[11], p->fcprojw + at[12], p->fcprojb + at[13],
    };
    return lp;
}

// ----------------------------------------------------------------------------
// activations: the CPU's tensors (train_gpt.c: LayerActs), LayerNorm statistics in fp32

template <typename floatX>
struct LayerActs {
    floatX* ln1;       // (B,T,C)
    float* ln1_mean;   // (B,T)
    float* ln1_rstd;   // (B,T)
    floatX* qkv;       // (B,T,3C)
    floatX* atty;      // (B,T,C)
    floatX* att;       // (B,NH,T,T); --recompute attn: shared; --attention flash: (B,NH,T) fp32, the
                       // rows' log-sum-exp (layer_lse)
    floatX* residual2; // (B,T,C)
    floatX* ln2;       // (B,T,C)
    float* ln2_mean;   // (B,T)
    float* ln2_rstd;   // (B,T)
    floatX* fch;       // (B,T,4C)
    floatX* fch_gelu;  // (B,T,4C); --recompute gelu: shared
    floatX* residual3; // (B,T,C)
};

// Every device tensor, scratch piece and the cuBLASLt workspace starts at a multiple of TENSOR_ALIGN
// bytes from its block (cudaMalloc's blocks start at 256): cuBLASLt's heuristic assumes 256-byte
// operands and workspace unless told less (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*, which matmul.cuh
// sets from the pointers), and less rules out its fastest kernels; Packed128 needs 16. Each size
// is rounded up with align_up, the planner adds the rounded sizes (gpt2_layout), and carve_tensor
// stops where a piece does not start aligned. The weights are one block in the checkpoint's order
// (llmc/model_config.h), not padded: every matrix of the presets starts at a multiple of 256 there.
#define TENSOR_ALIGN 256
static size_t align_up(size_t bytes) { return (bytes + TENSOR_ALIGN - 1) / TENSOR_ALIGN * TENSOR_ALIGN; }

// carves n bytes from *p and returns them as T*
template <typename T>
static T* carve(char** p, size_t bytes) {
    T* t = (T*)*p;
    *p += bytes;
    return t;
}

// the same for a device tensor or scratch piece, which must start at TENSOR_ALIGN (see there)
template <typename T>
static T* carve_tensor(char** p, size_t bytes) {
    if ((uintptr_t)*p % TENSOR_ALIGN != 0) {
        fail("a device tensor starts at %zu mod %d bytes\n  hint: round every piece carved before it with align_up",
             (size_t)((uintptr_t)*p % TENSOR_ALIGN), TENSOR_ALIGN);
    }
    return carve<T>(p, bytes);
}

// the bytes of each tensor of one layer's block (act_policy.h's table), each rounded to TENSOR_ALIGN:
// floatX of elem bytes, the LayerNorm statistics fp32; tp: --tp's group (a rank's heads and hidden
// units; with --sp, pol->sp, its rows of the residual stream)

static void layer_act_bytes(size_t s[NUM_LAYER_ACTS], int B, int T, int C, int NH, int tp, size_t elem, const ActPolicy* pol) {
    layer_act_elems(s, B, T, C, NH, tp, pol);
    for (int i = 0; i < NUM_LAYER_ACTS; i++) { s[i] = align_up(s[i] * (layer_act_is_stat(i, pol) ? sizeof(float) : elem)); }
}

// flash attention keeps each row's log-sum-exp (fp32) where the attention weights would be
template <typename floatX>
static float* layer_lse(const LayerActs<floatX>* a) { return (float*)a->att; }

static size_t layer_block_bytes(int B, int T, int C, int NH, int tp, size_t elem, const ActPolicy* pol) {
    size_t s[NUM_LAYER_ACTS], total = 0;
    layer_act_bytes(s, B, T, C, NH, tp, elem, pol);
    for (int i = 0; i < NUM_LAYER_ACTS; i++) { total += s[i]; }
    return total;
}

// points a's tensors into memory (bytes); returns the block's bytes
template <typename floatX>
static size_t point_layer_acts(LayerActs<floatX>* a, char* memory, int B, int T, int C, int NH, int tp, const ActPolicy* pol) {
    size_t s[NUM_LAYER_ACTS], total = 0;
    layer_act_bytes(s, B, T, C, NH, tp, sizeof(floatX), pol);
    void** ptrs[NUM_LAYER_ACTS] = {
        (void**)&a->ln1, (void**)&a->ln1_mean, (void**)&a->ln1_rstd, (void**)&a->qkv, (void**)&a->atty,
        (void**)&a->att, (void**)&a->residual2, (void**)&a->ln2, (void**)&a->ln2_mean, (void**)&a->ln2_rstd,
        (void**)&a->fch, (void**)&a->fch_gelu, (void**)&a->residual3,
    };
    char* p = memory;
    for (int i = 0; i < NUM_LAYER_ACTS; i++) { *ptrs[i] = carve_tensor<char>(&p, s[i]); total += s[i]; }
    return total;
}

// --pp (llmc/pipeline.h): the first stage runs the embeddings, the last the head (the final LayerNorm, the
// classifier); without --pp the one stage does both (train_gpt.c's stage_has_embeddings, stage_has_head)
static int stage_has_embeddings(const GPT2Config* c) { return gpt2_holds_tensor(c, 1); }                        // wpe
static int stage_has_head(const GPT2Config* c) { return gpt2_holds_tensor(c, NUM_PARAMETER_TENSORS - 1); }  // lnfw

// the head, K tokens at a time (K = B*T, or a --loss-chunk: act_policy.h): the final LayerNorm's
// output (K,C) floatX and its statistics (B,T) fp32, the logits (K,Vp) floatX (turned into their
// gradient in place; --tp: a rank's Vp/N columns), the losses (B,T) and the softmax's row maximum and
// sum (K each), fp32
#define NUM_HEAD_ACTS 7
static void head_act_bytes(size_t s[NUM_HEAD_ACTS], int B, int T, int K, int C, int Vp, size_t elem) {
    size_t BT = (size_t)B * T, F = sizeof(float), k = K;
    size_t sizes[NUM_HEAD_ACTS] = {k * C * elem, BT * F, BT * F, k * Vp * elem, BT * F, k * F, k * F};
    for (int i = 0; i < NUM_HEAD_ACTS; i++) { s[i] = align_up(sizes[i]); }
}

// backward's buffers, one layer's worth (act_policy.h's table, which the CPU shares; --tp: a rank's),
// floatX; the GPU has no dfch_gelu: the fc projection's dinp GEMM writes dfch directly (DGELU epilogue,
// cuda/matmul.cuh)
#define BWD_DFCH_GELU 3  // dfch_gelu's index in act_policy.h's table
static void backward_buffer_bytes(size_t s[NUM_BACKWARD_BUFFERS], int B, int T, int C, int NH, int tp, size_t elem,
                                  const ActPolicy* pol) {
    backward_buffer_elems(s, B, T, C, NH, tp, pol);
    s[BWD_DFCH_GELU] = 0;
    for (int i = 0; i < NUM_BACKWARD_BUFFERS; i++) { s[i] = align_up(s[i] * elem); }
}

// the backend's scratch on the GPU: the batch (inputs, targets), one row of probabilities
// (sampling), the reduction scratch of the deterministic gradient kernels (fp32; the encoder's
// backward borrows it for the positions grouped by token), the
// attention's (floatX head copies; flash attention: a float per row), the global norm's
// (doubles, and the result; ZeRO-1: one per slice), cuBLASLt's workspace, and Adafactor's and
// CAME's (the largest slice's: factored_model_scratch_bytes).
// gpt2_layout is not told the optimizer, so every run carves the last one (d12: 1.5 MiB, which AdamW
// leaves unused), and the maps of --optimizer-state 8bit with the count of refused moments (4 KiB).
// c: the whole model, or with --tp a rank's slices (its matmuls' and the attention's shapes; with --sp
// its LayerNorms' rows); a row of probabilities is Vp whole (sampling gathers the group's columns)
typedef struct { size_t batch, probs, reduce, attention, norm, norm_parts, matmul, optimizer, lowp; } ScratchBytes;

static ScratchBytes scratch_bytes(const GPT2Config* c, int B, int T, size_t elem, const ActPolicy* pol) {
    int N = gpt2_tp(c), C = c->channels, Ct = C / N, NHt = c->num_heads / N, Vp = c->padded_vocab_size, flash = pol->flash;
    size_t BT = (size_t)B * T, F = sizeof(float);
    size_t reduce = layernorm_backward_scratch_floats(1, (int)act_residual_rows(pol, BT, N), C);
    const int ocs[4] = {3 * Ct, C, 4 * Ct, Vp / N};  // every matmul's output channels
    for (int i = 0; i < 4; i++) {
        size_t r = matmul_backward_scratch_floats(B, T, ocs[i]);
        if (r > reduce) { reduce = r; }
    }
    if (encoder_backward_scratch_ints(B, T) > reduce) { reduce = encoder_backward_scratch_ints(B, T); }  // ints, as floats
    ScratchBytes s = {
        .batch = 2 * align_up(BT * sizeof(int)),
        .probs = align_up((size_t)Vp * F),
        .reduce = align_up(reduce * F),
        .attention = align_up(flash ? flash_attention_scratch_floats(B, T, NHt) * sizeof(float) : attention_scratch_floats(B, T, Ct, NHt) * elem),
        .norm = align_up((global_norm_scratch_doubles(gpt2_num_parameters(c)) + 1) * sizeof(double)),
        .norm_parts = align_up((size_t)param_slice_count(c) * sizeof(double)),
        .matmul = align_up(MATMUL_WORKSPACE_BYTES),
        .optimizer = align_up(factored_model_scratch_bytes(c)),
        .lowp = align_up(sizeof(QStateMaps)) + align_up(sizeof(unsigned long long)),
    };
    return s;
}

static size_t scratch_total(const ScratchBytes* s) {
    return s->batch + s->probs + s->reduce + s->attention + s->norm + s->norm_parts + s->matmul + s->optimizer + s->lowp;
}

static size_t precision_bytes(Precision p) { return p == PRECISION_BF16 ? sizeof(__nv_bfloat16) : sizeof(float); }

// --sp: the (B,T,C) buffer where the tensor-parallel group's rows meet (floatX of elem bytes), and 2C
// floats of a LayerNorm's parameter gradients of this rank's rows (cuda/tensor_parallel.cuh); 0 without
static size_t sp_gathered_bytes(int B, int T, int C, size_t elem, const ActPolicy* pol) {
    return pol->sp ? align_up((size_t)B * T * C * elem) + align_up(2 * (size_t)C * sizeof(float)) : 0;
}

// ----------------------------------------------------------------------------
// NCCL: one process per GPU, the communicator bootstrapped over MPI (cuda/nccl.cuh)


// every slice of the model of layer `layer` (or ALL_SLICES) through call(offset in floats, floats):
// --zero 0's all-reduce per slice (ZeRO's exchanges go a layer at a time: cuda/zero.cuh)
template <typename F>
static void for_each_slice(const GPT2Config* c, int layer, F call) {
    ParamSlice* slices = param_slices_alloc(c);
    for (int k = 0; k < param_slice_count(c); k++) {
        if (layer == ALL_SLICES || slices[k].layer == layer) { call(slices[k].offset, (size_t)slices[k].rows * slices[k].cols); }
    }
    free(slices);
}

// ----------------------------------------------------------------------------
// the model

// --offload activations (see "offload"): the copy stream that moves blocks to an activation set's host
// store and back (each set's store and the state of its slots: ActOffloadSet)
struct ActOffload {
    size_t layer_bytes;           // one layer's block
    cudaStream_t copy_stream;
    cudaEvent_t compute_done;     // compute stream: what the copy stream must wait for (recorded when needed)
    cudaEvent_t* wait_marks;      // [2 * OFFLOAD_MAX_WAITS] compute stream: before and after each wait for a copy
    int waits;                    // waits marked since the step began
};

// --offload activations, one activation set's part: its pinned host store, and where its slots' and
// staging buffers' copies stand
struct ActOffloadSet {
    char* host_store;             // pinned: every layer's block (L, layer_bytes), or the segment inputs
    int* slot_layer;              // [slots] the layer each slot holds now, -1 none
    cudaEvent_t* slot_saved;      // [slots] copy stream: the slot's block (or segment input) is in the host store
    int* slot_saving;             // [slots] a copy out of the slot is queued that the compute stream has not waited for
    cudaEvent_t* slot_loaded;     // [slots] copy stream: the slot's block is back from the host store
    int staging_segment[ACT_STAGING_BUFFERS];          // the segment input each staging buffer holds or
                                                       // is being filled with, -1 none
    cudaEvent_t staging_loaded[ACT_STAGING_BUFFERS];   // copy stream: staging[i] holds staging_segment[i]
};

// what forward keeps for backward, of one micro-batch (train_gpt.c's Activations): the embeddings, the
// working set of layer blocks (act_policy.h), shared GELU / attention buffers, kept segment inputs, the
// head. With --tp the blocks are a rank's heads and hidden units (act_policy.h's table), with --sp the
// residual stream a rank's R = B T/N rows: (B,T,C) below then reads (R,C) where the residual stream is
// meant. With --pp a stage has one set for each micro-batch it holds at once (gpt2_pp_slot puts one in hand)
template <typename floatX>
struct Acts {
    char* memory;                 // everything below but the host store: one allocation
    floatX* encoded;              // (B,T,C) the embeddings, or (--pp, a later stage) the stage input received
    LayerActs<floatX>* slots;     // [act_num_slots]
    floatX* gelu_shared;          // (B,T,4C) --recompute gelu, else NULL
    floatX* att_shared;           // (B,NH,T,T) --recompute attn, else NULL
    floatX** seg_inputs;          // [segments] checkpointing: each segment's input; [0] = encoded; the
                                  // others in GPU memory, or with --offload in the pinned host store
    floatX* staging[ACT_STAGING_BUFFERS];  // (B,T,C) each, checkpointing + offload: segment s's input back
                                           // from the host in staging[s % 2]
    floatX* sp_gathered;          // --sp: (B,T,C) where the group's rows meet (cuda/tensor_parallel.cuh), else NULL
    float* sp_norm_grads;         // --sp: (2C) a LayerNorm's parameter gradients of this rank's rows, else NULL
    // the head (--pp: the last stage's), K = head_rows tokens at a time: K = B*T, or with --loss-chunk a
    // chunk (act_policy.h); NULL where the stage has no head
    floatX* lnf;                  // (K,C)
    float *lnf_mean, *lnf_rstd;   // (B,T)
    floatX* logits;               // (K,Vp) logits (--tp: (K,Vp/N), a rank's columns); backward (--loss-chunk: forward)
                                  // turns them into their gradient in place
    float* losses;                // (B,T)
    float *row_max, *row_sum;     // (K)
    int head_rows;                // K
    int probs_first, probs_end;   // the positions whose logits and row statistics the head holds (first..end-1); -1: none
    float head_grad_scale;        // --loss-chunk: the loss_scale of the head's gradients the last forward computed, 0 none
    ActOffloadSet offload;        // --offload activations: its host store
    PpSent sent;                  // --pp: the last send of its stage output (the last layer's) to the next stage
};

// data parallelism (one process per GPU): the gradients' exchange over NCCL among the ranks
struct GradExchange {
    ncclComm_t comm;              // NULL on one rank
    cudaStream_t comm_stream;     // the gradient exchange during the last micro-step's backward
    cudaEvent_t grads_final;      // compute stream: a layer's gradients are final
    cudaEvent_t reduced;          // comm stream: every gradient is reduced
    int reduce_in_backward;       // the next backward is the step's last: reduce as it goes
    double* norm_parts;           // [slices] ZeRO-1: the sum of squares of this rank's block of each slice
    long grad_collectives;        // the gradients' and the weights' collectives since the last update (printed for step 1)
    long weight_collectives;
    long next_weight_collectives; // ZeRO-3: the next forward's gathers the update queued (zero3_first_updated)
};

// ZeRO-1 and 2 (cuda/zero.cuh, see "ZeRO" below): one collective per layer through the pack; ZeRO-2:
// grads_memory is this rank's gradient shard and grads point into a one-layer working buffer
struct ZeroShards {
    ZeroGroup* zero_groups;       // [num_zero_groups] the layers', then the outer slices' rounds
    int num_zero_groups;
    float* zero_pack;             // (world * a layer's part) one group rank by rank
    float* grad_working;          // ZeRO-2: a one-layer model's gradients (opt_layout.h's working buffer)
    size_t* shard_block_off;      // [slices] ZeRO-2 and 3: each slice's block in the shard (shard_block_offsets)
    cudaEvent_t working_taken;    // comm stream: the working gradients are packed (the compute stream may clear them)
    cudaEvent_t updated;          // ZeRO-1, 2, compute stream: the update has written this rank's blocks
    cudaEvent_t* gathered;        // ZeRO-1, 2: [L + 1] comm stream: layer l's updated weights ([L]: the outer
                                  // slices') gathered from every rank and in the working weights
    int next_gather;              // ZeRO-1, 2: the next group whose gather the last update left due, -1 none
    int first_queued;             // ZeRO-1, 2 (AdamW): the outer slices' and layer 0's gathers were queued during the update
};

// ZeRO-3 (see "ZeRO-3" below): master_memory and weights_memory are this rank's shards (the
// gradient shard's layout, shard_block_off); weights point into the working copy, a one-layer
// model (the outer tensors gathered once a step; its layer is buffer 0), and a second layer buffer
template <typename floatX>
struct Zero3Weights {
    floatX* weight_working;       // a one-layer model's weights (opt_layout.h's working copy)
    floatX* layer_buf_memory;     // (Pl) layer buffer 1
    Params<floatX> layer_buf[2];  // the working weights with buffer b's layer tensors (b = l % 2)
    int buf_layer[2];             // the layer buffer b holds, or is being gathered into; -1 none
    int outer_gathered;           // the working copy holds this step's wte, wpe, lnfw, lnfb
    cudaEvent_t gathered[2];      // comm stream: buffer b's gather is unpacked (the compute stream may read it)
    cudaEvent_t released[2];      // compute stream: buffer b's last reader is done (the comm stream may overwrite it)
    cudaEvent_t outer_ready;      // comm stream: the outer tensors are gathered
    cudaEvent_t compute_mark;     // compute stream: what the comm stream must wait for (the update's shard)
    float* ckpt_staging;          // pinned: the largest slice, checkpoints' weights a slice at a time
    size_t ckpt_staging_floats;
};

// --offload optimizer (see "optimizer offload"): master_memory, opt_memory and these are pinned
// host memory; with ",gradients" grads_memory on the GPU holds the outer tensors' gradients (wte, wpe,
// lnfw, lnfb) and two layers' (grad_layers), else all of them
struct OptOffloadState {
    int send_in_backward;         // OPT_OFFLOAD_STATE: the next backward is the step's last: send as it goes
    char* opt_host_memory;        // one pinned block: master (P), host_grads (P), staging, the optimizer state
    float* host_grads;            // (P) fp32: the step's gradients, summed on the host
    float* grad_layers[2];        // (Pl) each, on the GPU: layer l computes its gradients into [l % 2]
    float* opt_staging[2];        // (max(Pl, Pr)) each, pinned: gradients on their way down, new weights on their way up
    size_t opt_staging_floats;
    int next_staging;             // the opt_staging buffer the next upload fills
    int first_micro_step;         // the step's first backward: its gradients replace the host's, later ones add
    cudaStream_t grad_stream;     // copies of gradients to the host while the next layer computes
    cudaEvent_t grads_down[2];    // grad_stream: grad_layers[i] (or the outer tensors') copied into opt_staging[i]
    cudaEvent_t staged_up[2];     // stream: the upload out of opt_staging[i] is done
    cudaEvent_t grads_ready;      // stream: a group's gradients are computed (grad_stream waits for it)
    cudaEvent_t uploaded;         // stream: a group of the offloaded shard is up (ZeRO-3's comm stream waits for it)
    int deferred;                 // the last step's host update is still to be made (by the next forward, group by group)
    int next_group;               // the group it makes next, in the forward's order: 0 the outer slices, 1 + l layer l
    StepConfig step;              // that update's step (t, hyperparameters, clipping) and gradient norm
    float grad_norm;
};

// the model: the plain tensors first (as train_gpt.c's GPT2), then each technique's state
template <typename floatX>
struct Model {
    GPT2Config config;
    size_t num_parameters;
    float* master_memory;         // (P) fp32 master weights: what the optimizer updates and checkpoints hold
    Params<float> master;
    floatX* weights_memory;       // (P) the working weights the kernels read: master itself (fp32) or a bf16 copy
    Params<floatX> weights;
    size_t weight_floats;         // floats of master_memory (and weights_memory): P, or ZeRO-3's shard
    floatX* weight_shard;         // ZeRO-2 with --offload optimizer: this rank's blocks of the new weights, up from the host
                                  // and gathered from (ZeRO-3's: weights_memory); see "the offloaded shard"
    float* grads_memory;          // (P) fp32
    Params<float> grads;
    size_t grad_floats;           // floats of grads_memory: P, or ZeRO-2's shard
    float* opt_memory;            // optimizer state (opt_layout.h's layout: fp32, or the moments in state_format)
    size_t opt_floats;
    QStateFormat state_format;    // --optimizer-state (llmc/quant_state.h, cuda/adamw_lowp.cuh)
    int lowp_step;                // the step whose update lowp_refused counts, 0 none
    OptimizerKind optimizer;
    ParamSlice* slices;           // [param_slice_count] the optimizer's slices (opt_layout.h)
    ActPolicy act;
    Acts<floatX>* acts;           // what forward keeps for backward: the micro-batch in hand's, one of `held`
    Acts<floatX>* held;           // [num_held] --pp: a set for each micro-batch the stage holds at once (1 without)
    int num_held;
    // backward's buffers
    char* bwd_memory;
    floatX *dresidual, *dbtc, *dqkv, *dfch, *datt;  // (B,T,C) (B,T,C) (B,T,3C) (B,T,4C) (B,NH,T,T); dbtc: one
                                                    // (B,T,C) gradient at a time (d(ln2), d(atty), d(ln1), d(lnf))
    // scratch
    char* scratch_memory;
    int *inputs, *targets;        // (B,T) the batch on the GPU
    float* probs;                 // (Vp) one position's probabilities (sampling; --tp: gathered from the group)
    float* reduce_scratch;        // the deterministic reductions' partial sums (and the encoder's token buckets)
    floatX* attention_scratch;    // --attention matmul: the heads' copies
    float* flash_scratch;         // --attention flash: a float per row (backward's D)
    double* norm_scratch;         // global norm partial sums; the last double is the result
    void* opt_scratch;            // Adafactor's and CAME's scales and partial sums (adafactor.cuh)
    QStateMaps* lowp_maps;        // --optimizer-state 8bit: the maps of quant_state.h (uploaded when used)
    unsigned long long* lowp_refused;  // --optimizer-state bf16, 8bit: non-finite new moments, counted by the update
    float* lowp_m_staging;        // Adafactor, CAME with M in bf16 or 8 bits: M's fp32 copy during a slice's update
                                  // (lowp_largest_part_floats; planned as scratch: BackendLayout.lowp_staging)
    // host: copies for checkpoints, one row of probabilities, the losses of a forward
    float* host_params;           // (P)
    float* host_opt;              // (opt_floats)
    float* host_probs;            // (Vp)
    float* host_losses;           // (B,T)
    int batch_size, seq_len;      // the (B,T) the activations were sized for
    MatmulContext matmul;
    cudaStream_t stream;          // the compute stream
    Dist dist;                    // this process among the data-parallel ranks
    ZeroStage zero;               // --zero
    OptOffload offload_opt;       // --offload optimizer[,gradients]
    // the techniques' state
    Dist tensor;                  // --tp: this process in its tensor-parallel group ({0, 1}: none)
    TpCuda tp;                    // --tp: its communicator, stream and --sp's buffers (cuda/tensor_parallel.cuh)
    float* tp_staging;            // --tp: host memory, a split tensor's layer whole, through which checkpoints move the
                                  // weights (cpu/tensor_parallel.h's stream, tp_staging_floats), else NULL
    ActOffload offload;           // --offload activations
    GradExchange exchange;        // more than one rank
    ZeroShards shard;             // --zero 1, 2 (and 3's gradients)
    Zero3Weights<floatX> zero3;   // --zero 3
    OptOffloadState opt_offload;  // --offload optimizer
    // --pp (cuda/pipeline.cuh): config is this rank's stage's part of the model
    GPT2Config whole;             // the model's config
    Dist pipeline, pair;          // this process among the stages ({0, 1}: none), and wte's pair (the first and the last stage)
    PpCuda pp;                    // the messages' communicator and stream, the pair's communicator
    PpSent grad_sent;             // the last send of dresidual (the gradient of the stage input) to the stage before
    float* pp_staging;            // host: the whole model's weights go through it a piece at a time (checkpoints), else NULL
};

// ZeRO's cut of the slices over the ranks (llmc/opt_layout.h): with 8-bit state each part starts on a
// boundary of the state's blocks, so every layout of the gradients, weights and state follows the format
template <typename floatX>
static ShardLayout model_shard_layout(const Model<floatX>* m) { return shard_layout_as(&m->config, m->dist.world, m->state_format); }

struct GPT2 {
    Precision precision;
    Model<float>* f32;            // one of the two, as --precision says
    Model<__nv_bfloat16>* bf16;
};

// the working-set buffer layer l computes into
template <typename floatX>
static LayerActs<floatX>* act_layer(Model<floatX>* m, int l) {
    return &m->acts->slots[act_slot_of(&m->act, m->config.num_layers, l)];
}

// segment s's input in GPU memory: the embeddings, the kept tensor, or (offload) the staging buffer
template <typename floatX>
static const floatX* segment_input(Model<floatX>* m, int s) {
    if (s == 0) { return m->acts->encoded; }
    return m->act.offload ? m->acts->staging[s % ACT_STAGING_BUFFERS] : m->acts->seg_inputs[s];
}

// layer l's input, while l's block is in the working set; l == L: the last block's output
template <typename floatX>
static const floatX* layer_input(Model<floatX>* m, int l) {
    if (l == 0) { return m->acts->encoded; }
    int k = m->act.segment;
    if (k > 0 && l % k == 0 && l < m->config.num_layers) { return segment_input(m, l / k); }
    return act_layer(m, l - 1)->residual3;
}

// ----------------------------------------------------------------------------
// allocation

#define OFFLOAD_MAX_WAITS 4096  // timed waits for copies per step: a few per layer and micro-step

// --offload: an activation set's pinned host store (every layer's block but the last three, or with
// checkpointing the segment inputs but the first) and its slots' and staging buffers' events
template <typename floatX>
static void alloc_host_store(Model<floatX>* m, Acts<floatX>* a, int slots, int seg_kept, size_t R) {
    int L = m->config.num_layers;
    ActOffloadSet* o = &a->offload;
    size_t bytes = seg_kept ? seg_kept * R : (size_t)act_offloaded_layers(&m->act, L) * m->offload.layer_bytes;
    o->host_store = (char*)mem_alloc(MEM_OFFLOADED, bytes);
    char* p = o->host_store;
    for (int s = 1; s <= seg_kept; s++) { a->seg_inputs[s] = carve<floatX>(&p, R); }
    o->slot_layer = (int*)malloc_check(slots * sizeof(int));
    o->slot_saved = (cudaEvent_t*)malloc_check(slots * sizeof(cudaEvent_t));
    o->slot_saving = (int*)calloc_check(slots, sizeof(int));
    o->slot_loaded = (cudaEvent_t*)malloc_check(slots * sizeof(cudaEvent_t));
    for (int i = 0; i < ACT_STAGING_BUFFERS; i++) {
        o->staging_segment[i] = -1;
        CUDA_CHECK(cudaEventCreateWithFlags(&o->staging_loaded[i], cudaEventDisableTiming));
    }
    for (int i = 0; i < slots; i++) {
        o->slot_layer[i] = -1;
        CUDA_CHECK(cudaEventCreateWithFlags(&o->slot_saved[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&o->slot_loaded[i], cudaEventDisableTiming));
    }
}

// one activation set for micro-batches of (B,T) (the head only where the stage has it: --pp)
template <typename floatX>
static void alloc_activation_set(Model<floatX>* m, Acts<floatX>* a, int B, int T, const ActPolicy* pol) {
    const GPT2Config* c = &m->config;
    int L = c->num_layers, C = c->channels, NH = c->num_heads, N = gpt2_tp(c), Vr = c->padded_vocab_size / N;
    size_t elem = sizeof(floatX), BT = (size_t)B * T, R = align_up(act_residual_rows(pol, BT, N) * C * elem);
    int slots = act_num_slots(pol, L), segments = act_num_segments(pol, L);
    int seg_kept = pol->segment > 0 ? segments - 1 : 0;
    size_t layer = layer_block_bytes(B, T, C, NH, N, elem, pol);
    size_t gelu = pol->gelu ? align_up(BT * 4 * (C / N) * elem) : 0;
    size_t att = align_up(act_shared_att_elems(pol, B, T, NH / N) * elem);
    size_t hs[NUM_HEAD_ACTS], head = 0;
    int K = act_head_rows(pol, BT);
    head_act_bytes(hs, B, T, K, C, Vr, elem);
    for (int i = 0; i < NUM_HEAD_ACTS && stage_has_head(c); i++) { head += hs[i]; }
    size_t device_kept = pol->offload ? 0 : seg_kept * R, staging = pol->offload && seg_kept ? ACT_STAGING_BUFFERS * R : 0;
    size_t gathered = sp_gathered_bytes(B, T, C, elem, pol);
    size_t total = R + slots * layer + gelu + att + device_kept + staging + gathered + head;
    memset(a, 0, sizeof(*a));
    a->memory = (char*)mem_alloc(MEM_ACTIVATIONS, total);
    a->slots = (LayerActs<floatX>*)malloc_check(slots * sizeof(LayerActs<floatX>));  // pointers only, not counted
    a->seg_inputs = (floatX**)malloc_check(segments * sizeof(floatX*));
    char* p = a->memory;
    a->encoded = carve_tensor<floatX>(&p, R);
    for (int i = 0; i < slots; i++) { p += point_layer_acts(&a->slots[i], p, B, T, C, NH, N, pol); }
    a->gelu_shared = pol->gelu ? carve_tensor<floatX>(&p, gelu) : NULL;
    a->att_shared = att ? carve_tensor<floatX>(&p, att) : NULL;
    for (int i = 0; i < slots; i++) {
        if (pol->gelu) { a->slots[i].fch_gelu = a->gelu_shared; }
        if (att) { a->slots[i].att = a->att_shared; }
    }
    a->seg_inputs[0] = a->encoded;
    for (int s = 1; s <= seg_kept; s++) { a->seg_inputs[s] = pol->offload ? NULL : carve_tensor<floatX>(&p, R); }
    for (int i = 0; i < ACT_STAGING_BUFFERS; i++) { a->staging[i] = staging ? carve_tensor<floatX>(&p, R) : NULL; }
    a->sp_gathered = gathered ? carve_tensor<floatX>(&p, align_up(BT * C * elem)) : NULL;
    a->sp_norm_grads = gathered ? carve_tensor<float>(&p, align_up(2 * (size_t)C * sizeof(float))) : NULL;
    if (head > 0) {
        a->lnf = carve_tensor<floatX>(&p, hs[0]);
        a->lnf_mean = carve_tensor<float>(&p, hs[1]);
        a->lnf_rstd = carve_tensor<float>(&p, hs[2]);
        a->logits = carve_tensor<floatX>(&p, hs[3]);
        a->losses = carve_tensor<float>(&p, hs[4]);
        a->row_max = carve_tensor<float>(&p, hs[5]);
        a->row_sum = carve_tensor<float>(&p, hs[6]);
    }
    a->head_rows = K;
    a->probs_first = -1;
    if (pol->offload) { alloc_host_store(m, a, slots, seg_kept, R); }
}

// the activations of every micro-batch the stage holds at once (--pp: llmc/pipeline.h's pp_max_in_flight;
// 1 without), each a whole set, the first in hand; with --offload the copy stream they share
template <typename floatX>
static void alloc_activations(Model<floatX>* m, const ModelSetup* s) {
    const GPT2Config* c = &m->config;
    m->offload.layer_bytes = layer_block_bytes(s->B, s->T, c->channels, c->num_heads, gpt2_tp(c), sizeof(floatX), &s->act);
    if (s->act.offload) {
        CUDA_CHECK(cudaStreamCreate(&m->offload.copy_stream));
        CUDA_CHECK(cudaEventCreateWithFlags(&m->offload.compute_done, cudaEventDisableTiming));
    }
    m->num_held = s->pp_held > 1 ? s->pp_held : 1;
    m->held = (Acts<floatX>*)malloc_check((size_t)m->num_held * sizeof(Acts<floatX>));  // the sets' pointers: not counted
    for (int i = 0; i < m->num_held; i++) {
        alloc_activation_set(m, &m->held[i], s->B, s->T, &s->act);
        if (s->pipeline.world > 1) { pp_sent_create(&m->held[i].sent); }
    }
    m->acts = &m->held[0];
}

// an activation set's memory, its host store and its events
template <typename floatX>
static void free_activation_set(Model<floatX>* m, Acts<floatX>* a) {
    mem_free(a->memory);
    free(a->slots);
    free(a->seg_inputs);
    if (m->pipeline.world > 1) { pp_sent_destroy(&a->sent); }
    if (!m->act.offload) { return; }
    ActOffloadSet* o = &a->offload;
    int slots = act_num_slots(&m->act, m->config.num_layers);
    for (int i = 0; i < slots; i++) { CUDA_CHECK(cudaEventDestroy(o->slot_saved[i])); CUDA_CHECK(cudaEventDestroy(o->slot_loaded[i])); }
    for (int i = 0; i < ACT_STAGING_BUFFERS; i++) { CUDA_CHECK(cudaEventDestroy(o->staging_loaded[i])); }
    free(o->slot_layer); free(o->slot_saved); free(o->slot_loaded); free(o->slot_saving);
    mem_free(o->host_store);
}

// backward's working buffers, one layer's worth (training only)
template <typename floatX>
static void alloc_backward(Model<floatX>* m, int B, int T) {
    const GPT2Config* c = &m->config;
    size_t bs[NUM_BACKWARD_BUFFERS], btotal = 0;
    backward_buffer_bytes(bs, B, T, c->channels, c->num_heads, gpt2_tp(c), sizeof(floatX), &m->act);
    for (int i = 0; i < NUM_BACKWARD_BUFFERS; i++) { btotal += bs[i]; }
    m->bwd_memory = (char*)mem_alloc(MEM_ACT_GRADIENTS, btotal);
    char* p = m->bwd_memory;
    floatX* no_dfch_gelu;  // 0 bytes (backward_buffer_bytes)
    floatX** bptrs[NUM_BACKWARD_BUFFERS] = {&m->dresidual, &m->dbtc, &m->dqkv, &no_dfch_gelu, &m->dfch, &m->datt};
    for (int i = 0; i < NUM_BACKWARD_BUFFERS; i++) { *bptrs[i] = carve_tensor<floatX>(&p, bs[i]); }
}

// device scratch: the batch's ids, a row of probabilities, reductions, the cuBLASLt workspace
template <typename floatX>
static void alloc_scratch(Model<floatX>* m, int B, int T) {
    ScratchBytes sb = scratch_bytes(&m->config, B, T, sizeof(floatX), &m->act);
    m->scratch_memory = (char*)mem_alloc_from(MEM_SCRATCH, &MEM_DEVICE, scratch_total(&sb));
    char* p = m->scratch_memory;
    m->inputs = carve_tensor<int>(&p, sb.batch / 2);
    m->targets = carve_tensor<int>(&p, sb.batch / 2);
    m->probs = carve_tensor<float>(&p, sb.probs);
    m->reduce_scratch = carve_tensor<float>(&p, sb.reduce);
    m->attention_scratch = m->act.flash ? NULL : carve_tensor<floatX>(&p, sb.attention);
    m->flash_scratch = m->act.flash ? carve_tensor<float>(&p, sb.attention) : NULL;
    m->norm_scratch = carve_tensor<double>(&p, sb.norm);
    m->exchange.norm_parts = carve_tensor<double>(&p, sb.norm_parts);
    matmul_context_init(&m->matmul, carve_tensor<char>(&p, sb.matmul), sb.matmul);  // a cuBLASLt handle, our workspace
    m->opt_scratch = carve_tensor<char>(&p, sb.optimizer);
    m->lowp_maps = carve_tensor<QStateMaps>(&p, align_up(sizeof(QStateMaps)));
    m->lowp_refused = carve_tensor<unsigned long long>(&p, align_up(sizeof(unsigned long long)));
}

// the fp32 gradients, zeroed: the model's (P), and under ZeRO-1 the pack (cuda/zero.cuh); under ZeRO-2
// (and 3) the gradient shard, the working buffer (a one-layer model's gradients: every use leaves it zero)
// and the pack: opt_layout.h's ShardLayout, as the CPU's, each its own allocation (what the planner counts)
template <typename floatX>
static void alloc_gradients(Model<floatX>* m) {
    const GPT2Config* c = &m->config;
    int world = m->dist.world, zero2 = zero_shards_grads(m->zero);
    ShardLayout z = model_shard_layout(m);
    m->grad_floats = zero2 ? z.shard : m->num_parameters;
    m->grads_memory = (float*)mem_alloc(MEM_GRADIENTS, m->grad_floats * sizeof(float));
    CUDA_CHECK(cudaMemset(m->grads_memory, 0, m->grad_floats * sizeof(float)));
    m->slices = param_slices_alloc(c);
    if (zero2) {
        GPT2Config one = *c;
        one.num_layers = 1;
        m->shard.grad_working = (float*)mem_alloc(MEM_GRADIENTS, z.working * sizeof(float));
        CUDA_CHECK(cudaMemset(m->shard.grad_working, 0, z.working * sizeof(float)));
        point_params(&m->grads, m->shard.grad_working, &one);  // every layer's backward uses layer 0's place
        m->shard.shard_block_off = (size_t*)malloc_check((size_t)param_slice_count(c) * sizeof(size_t));
        shard_block_offsets_as(c, world, m->state_format, m->shard.shard_block_off);
    } else {
        point_params(&m->grads, m->grads_memory, c);
    }
    if (zero_shards_state(m->zero)) {
        m->shard.zero_pack = (float*)mem_alloc(MEM_GRADIENTS, z.pack * sizeof(float));
        m->shard.zero_groups = zero_groups(c, world, m->state_format, &m->shard.num_zero_groups);
    }
}

// the floats of one layer's weights (Pl: its slices of the 12 per-layer tensors) and of the outer tensors
// (Pr: wte, wpe, lnfw, lnfb): --offload optimizer's groups, ZeRO's layer buffers
static size_t layer_weights(const GPT2Config* c) {
    size_t sizes[NUM_PARAMETER_TENSORS], n = 0;
    gpt2_parameter_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { n += PARAMETER_IS_PER_LAYER[i] ? sizes[i] / c->num_layers : 0; }
    return n;
}
static size_t outer_weights(const GPT2Config* c) { return gpt2_num_parameters(c) - (size_t)c->num_layers * layer_weights(c); }

// checkpoints under ZeRO-3, and under ZeRO-2 with --offload optimizer: a pinned buffer of the largest
// slice (or of wte's padded rows, which go by as zeros), through which gpt2_params_stream moves the
// weights a slice at a time; the planner's count of it (plan_largest_slice: the whole model's, which
// holds a rank's --tp slices too)
template <typename floatX>
static void alloc_ckpt_staging(Model<floatX>* m) {
    m->zero3.ckpt_staging_floats = plan_largest_slice(&m->config);
    m->zero3.ckpt_staging = (float*)mem_alloc(MEM_HOST_COPIES, m->zero3.ckpt_staging_floats * sizeof(float));
}

// ZeRO-3: this rank's shards of the fp32 master weights (with --offload optimizer: in host memory,
// alloc_offloaded_optimizer) and of the working weights (floatX: the master itself in fp32 when both are
// on the GPU), in the gradient shard's layout (opt_layout.h), zero in the padding; the working copy
// the kernels read, a one-layer model (the outer tensors whole, layer buffer 0) and layer buffer 1; the
// checkpoints' staging: the whole model is never in one place, on the GPU or in host memory
template <typename floatX>
static void alloc_zero3_weights(Model<floatX>* m) {
    const GPT2Config* c = &m->config;
    ShardLayout z = model_shard_layout(m);
    GPT2Config one = *c;
    one.num_layers = 1;
    m->weight_floats = z.shard;
    if (!m->offload_opt) {
        m->master_memory = (float*)mem_alloc(MEM_PARAMETERS, z.shard * sizeof(float));
        CUDA_CHECK(cudaMemset(m->master_memory, 0, z.shard * sizeof(float)));
    }
    m->weights_memory = sizeof(floatX) == sizeof(float) && m->master_memory != NULL
                            ? (floatX*)m->master_memory : (floatX*)mem_alloc(MEM_PARAMETERS, z.shard * sizeof(floatX));
    CUDA_CHECK(cudaMemset(m->weights_memory, 0, z.shard * sizeof(floatX)));
    m->zero3.weight_working = (floatX*)mem_alloc(MEM_PARAMETERS, z.working * sizeof(floatX));
    CUDA_CHECK(cudaMemset(m->zero3.weight_working, 0, z.working * sizeof(floatX)));  // wte's padded rows stay zero
    point_params(&m->weights, m->zero3.weight_working, &one);
    m->zero3.layer_buf_memory = (floatX*)mem_alloc(MEM_PARAMETERS, layer_weights(c) * sizeof(floatX));
    m->zero3.layer_buf[0] = m->weights;
    m->zero3.layer_buf[1] = m->weights;
    point_params(&m->zero3.layer_buf[1], m->zero3.layer_buf_memory, &one, 1);
    m->zero3.buf_layer[0] = m->zero3.buf_layer[1] = -1;
    alloc_ckpt_staging(m);
}

// ZeRO-3: a slice's blocks are gathered for checkpoints into the gradients' working buffer (idle
// between steps): every rank's padded block of the largest slice must fit
template <typename floatX>
static void zero3_check_staging(const Model<floatX>* m) {
    const GPT2Config* c = &m->config;
    ShardLayout z = model_shard_layout(m);
    for (int k = 0; k < param_slice_count(c); k++) {
        size_t need = (size_t)m->dist.world * slice_block_floats_as(&m->slices[k], m->dist.world, m->state_format);
        if (need > z.working) {
            fail("--zero 3 on %d ranks: slice %d's blocks (%zu floats) outgrow the gradients' working buffer (%zu), "
                 "through which checkpoints gather the weights\n  hint: fewer ranks", m->dist.world, k, need, z.working);
        }
    }
}

// the fp32 master weights, their gradients and the optimizer state on the GPU, and pinned host
// copies of the weights and the state for checkpoints; a model for sampling has the weights only
template <typename floatX>
static void alloc_optimizer_on_device(Model<floatX>* m, int training) {
    size_t P = m->num_parameters;
    m->weight_floats = P;
    if (m->zero == ZERO_3 && training) {
        alloc_zero3_weights(m);
    } else {
        m->master_memory = (float*)mem_alloc(MEM_PARAMETERS, P * sizeof(float));
        point_params(&m->master, m->master_memory, &m->config);
        m->weights_memory = sizeof(floatX) == sizeof(float) ? (floatX*)m->master_memory
                                                            : (floatX*)mem_alloc(MEM_PARAMETERS, P * sizeof(floatX));
        point_params(&m->weights, m->weights_memory, &m->config);
        m->host_params = (float*)mem_alloc(MEM_HOST_COPIES, P * sizeof(float));
    }
    if (!training) { return; }
    alloc_gradients(m);
    if (m->zero == ZERO_3) { zero3_check_staging(m); }
    m->opt_memory = (float*)mem_alloc(MEM_OPTIMIZER, m->opt_floats * sizeof(float));
    CUDA_CHECK(cudaMemset(m->opt_memory, 0, m->opt_floats * sizeof(float)));
    if (m->optimizer != OPT_ADAMW && m->state_format != QSTATE_FP32) {  // cuda/factored_lowp.cuh's staging
        size_t n = lowp_largest_part_floats(&m->config, zero_shards_state(m->zero) ? m->dist.world : 1, m->state_format);
        m->lowp_m_staging = (float*)mem_alloc_from(MEM_SCRATCH, &MEM_DEVICE, n * sizeof(float));
    }
    m->host_opt = (float*)mem_alloc(MEM_HOST_COPIES, m->opt_floats * sizeof(float));
    // a fresh run's state: zero (gpt2_sync sends it up with the weights); a modelled device's pinned
    // memory is fresh pages, zero already, that a memset would fill (d48: 12 GB of AdamW state)
    if (!gpt2_device_is_modelled()) { memset(m->host_opt, 0, m->opt_floats * sizeof(float)); }
}

// --offload optimizer: the working weights on the GPU with the gradients of the outer tensors and of two
// layers; one pinned host block with the master weights, the step's gradients, two staging
// buffers and the optimizer state (the master weights and the state are what checkpoints hold).
// Under ZeRO-2 and 3 (see "the offloaded shard") the GPU keeps what ZeRO-2 or 3 keeps there but the
// fp32 master, with (ZeRO-2) a floatX shard the new weights come up into, and the host block holds
// this rank's shards of the master weights and of the step's gradients (the optimizer state is
// sharded from ZeRO-1 on)
template <typename floatX>
static void alloc_offloaded_optimizer(Model<floatX>* m) {
    const GPT2Config* c = &m->config;
    size_t P = m->num_parameters, Pl = layer_weights(c), Pr = outer_weights(c);
    int shard = zero_shards_grads(m->zero);
    size_t host = shard ? model_shard_layout(m).shard : P;  // floats of the master weights and gradients on the host
    if (m->zero == ZERO_3) {
        alloc_zero3_weights(m);
    } else {
        m->weight_floats = P;
        m->weights_memory = (floatX*)mem_alloc(MEM_PARAMETERS, P * sizeof(floatX));
        CUDA_CHECK(cudaMemset(m->weights_memory, 0, P * sizeof(floatX)));  // wte's padded rows, which no gather writes
        point_params(&m->weights, m->weights_memory, c);
    }
    if (m->zero == ZERO_2) {
        m->weight_shard = (floatX*)mem_alloc(MEM_PARAMETERS, host * sizeof(floatX));
        alloc_ckpt_staging(m);
    }
    if (shard) {
        alloc_gradients(m);
    } else {
        m->grad_floats = m->offload_opt == OPT_OFFLOAD_GRADS ? Pr + 2 * Pl : P;
        m->grads_memory = (float*)mem_alloc(MEM_GRADIENTS, m->grad_floats * sizeof(float));
        CUDA_CHECK(cudaMemset(m->grads_memory, 0, m->grad_floats * sizeof(float)));
    }
    if (m->offload_opt == OPT_OFFLOAD_GRADS) {
        size_t sizes[NUM_PARAMETER_TENSORS];  // --tp: a rank's rows of wte; --pp: the stage's outer tensors (some absent)
        gpt2_parameter_sizes(sizes, c);
        m->grads.wte = m->grads_memory;  // the rest, in checkpoint order; the per-layer tensors stay NULL
        m->grads.wpe = m->grads.wte + sizes[0];
        m->grads.lnfw = m->grads.wpe + sizes[1];
        m->grads.lnfb = m->grads.lnfw + sizes[NUM_PARAMETER_TENSORS - 2];
        m->opt_offload.grad_layers[0] = m->grads_memory + Pr;
        m->opt_offload.grad_layers[1] = m->opt_offload.grad_layers[0] + Pl;
    } else if (!shard) {
        point_params(&m->grads, m->grads_memory, c);
    }
    // the staging buffers: a group of gradients on its way down, or a chunk of the new weights on its
    // way up (the offloaded shard, whose gradients go down from the GPU's shard: a rank's blocks of one layer)
    m->opt_offload.opt_staging_floats = shard ? model_shard_layout(m).layer_part : Pl > Pr ? Pl : Pr;
    m->opt_offload.opt_host_memory = (char*)mem_alloc(MEM_OPT_HOST, (2 * host + 2 * m->opt_offload.opt_staging_floats + m->opt_floats) * sizeof(float));
    char* p = m->opt_offload.opt_host_memory;
    m->master_memory = carve<float>(&p, host * sizeof(float));
    memset(m->master_memory, 0, host * sizeof(float));  // a shard's padding stays zero
    if (!shard) { point_params(&m->master, m->master_memory, c); }
    m->opt_offload.host_grads = carve<float>(&p, host * sizeof(float));
    for (int i = 0; i < 2; i++) { m->opt_offload.opt_staging[i] = carve<float>(&p, m->opt_offload.opt_staging_floats * sizeof(float)); }
    m->opt_memory = carve<float>(&p, m->opt_floats * sizeof(float));
    memset(m->opt_memory, 0, m->opt_floats * sizeof(float));  // a fresh run's state: zero
    m->host_params = shard ? NULL : m->master_memory;  // what checkpoints read and write (a shard: gpt2_params_stream)
    m->host_opt = m->opt_memory;
    m->opt_offload.first_micro_step = 1;
    for (int i = 0; i < 2; i++) { CUDA_CHECK(cudaEventCreateWithFlags(&m->opt_offload.staged_up[i], cudaEventDisableTiming)); }
    CUDA_CHECK(cudaEventCreateWithFlags(&m->opt_offload.uploaded, cudaEventDisableTiming));
    if (shard) { return; }  // the gradient shard comes down on the comm stream (zero2_reduce)
    CUDA_CHECK(cudaStreamCreate(&m->opt_offload.grad_stream));
    CUDA_CHECK(cudaEventCreateWithFlags(&m->opt_offload.grads_ready, cudaEventDisableTiming));
    for (int i = 0; i < 2; i++) { CUDA_CHECK(cudaEventCreateWithFlags(&m->opt_offload.grads_down[i], cudaEventDisableTiming)); }
}

template <typename floatX>
static Model<floatX>* model_create(const ModelSetup* s) {
    Model<floatX>* m = (Model<floatX>*)malloc_check(sizeof(Model<floatX>));
    memset(m, 0, sizeof(*m));
    m->config = setup_rank_config(s);  // the whole model, or (--tp) this rank's slices of it
    const GPT2Config* c = &m->config;
    size_t P = gpt2_num_parameters(c), BT = (size_t)s->B * s->T;
    m->num_parameters = P;
    m->optimizer = s->optimizer;
    m->act = s->act;
    m->dist = s->dist;
    m->zero = s->zero;
    m->batch_size = s->B;
    m->seq_len = s->T;
    CUDA_CHECK(cudaStreamCreate(&m->stream));
    // weights: fp32 master, and for bf16 a working copy; for training gradients, optimizer state
    int training = s->use == MODEL_FOR_TRAINING;  // else sampling: forward only
    m->offload_opt = s->offload_optimizer;
    m->state_format = s->state_format;
    m->opt_floats = training ? optimizer_state_floats_as(c, s->optimizer, s->use_beta1, zero_shards_state(s->zero) ? s->dist.world : 1,
                                                         s->state_format) : 0;
    if (m->offload_opt) { alloc_offloaded_optimizer(m); } else { alloc_optimizer_on_device(m, training); }
    alloc_activations(m, s);
    if (training) { alloc_backward(m, s->B, s->T); }
    alloc_scratch(m, s->B, s->T);
    if (training && m->state_format == QSTATE_8BIT && !m->offload_opt) {  // the update's maps (cuda/adamw_lowp.cuh, factored_lowp.cuh)
        CUDA_CHECK(cudaMemcpy(m->lowp_maps, qstate_maps(), sizeof(QStateMaps), cudaMemcpyHostToDevice));
    }
    CUDA_CHECK(cudaMemset(m->lowp_refused, 0, sizeof(unsigned long long)));
    m->host_probs = (float*)mem_alloc(MEM_SCRATCH, (size_t)c->padded_vocab_size * sizeof(float));
    m->host_losses = (float*)mem_alloc(MEM_SCRATCH, BT * sizeof(float));
    if (s->tensor.world > 1) { m->tp_staging = (float*)mem_alloc(MEM_HOST_COPIES, tp_staging_floats(c) * sizeof(float)); }
    if (s->pipeline.world > 1) { m->pp_staging = (float*)mem_alloc(MEM_HOST_COPIES, pp_staging_floats(c) * sizeof(float)); }
    if (m->act.offload) {  // timed waits for copies (gpt2_copy_wait_ms)
        m->offload.wait_marks = (cudaEvent_t*)malloc_check(2 * OFFLOAD_MAX_WAITS * sizeof(cudaEvent_t));
        for (int i = 0; i < 2 * OFFLOAD_MAX_WAITS; i++) { CUDA_CHECK(cudaEventCreate(&m->offload.wait_marks[i])); }
    }
    // with the optimizer on the host, MPI sums the gradients there (cpu/host_step.h): no NCCL
    // (the offloaded shard: NCCL reduce-scatters and gathers on the GPU, MPI adds the norm's parts).
    // --tp, --pp: each group's own communicator (cuda/nccl.cuh: one per group)
    int exchange = s->dist.world > 1 && (!m->offload_opt || zero_shards_grads(m->zero));
    NcclGroups groups = {NULL, NULL, NULL, NULL};
    if (exchange || s->tensor.world > 1 || s->pipeline.world > 1) {
        groups = nccl_init_groups(&s->world, &s->dist, s->tensor.world, s->pipeline.world, exchange);
    }
    m->exchange.comm = groups.data;
    m->tensor = s->tensor;
    m->tp = tp_cuda_create(&s->tensor, groups.tensor, m->acts->sp_gathered, m->acts->sp_norm_grads);
    m->whole = s->config;
    m->pipeline = s->pipeline;
    m->pair = s->pair;
    m->pp = pp_cuda_create(&s->pipeline, groups.pipeline, groups.pair);
    if (s->pipeline.world > 1) { pp_sent_create(&m->grad_sent); }
    if (m->exchange.comm != NULL) {
        CUDA_CHECK(cudaStreamCreate(&m->exchange.comm_stream));
        CUDA_CHECK(cudaEventCreateWithFlags(&m->exchange.grads_final, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&m->exchange.reduced, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&m->shard.working_taken, cudaEventDisableTiming));
    }
    if (m->exchange.comm != NULL && zero_gathers_after_update(m)) {
        int L = c->num_layers;
        m->shard.next_gather = -1;  // none due before the first update
        m->shard.gathered = (cudaEvent_t*)malloc_check((size_t)(L + 1) * sizeof(cudaEvent_t));
        for (int i = 0; i <= L; i++) { CUDA_CHECK(cudaEventCreateWithFlags(&m->shard.gathered[i], cudaEventDisableTiming)); }
        CUDA_CHECK(cudaEventCreateWithFlags(&m->shard.updated, cudaEventDisableTiming));
    }
    if (m->exchange.comm != NULL && m->zero == ZERO_3) {
        cudaEvent_t* all[] = {&m->zero3.gathered[0], &m->zero3.gathered[1], &m->zero3.released[0], &m->zero3.released[1], &m->zero3.outer_ready, &m->zero3.compute_mark};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) { CUDA_CHECK(cudaEventCreateWithFlags(all[i], cudaEventDisableTiming)); }
        for (int b = 0; b < 2; b++) { CUDA_CHECK(cudaEventRecord(m->zero3.released[b], m->stream)); }  // no reader yet
    }
    return m;
}

template <typename floatX>
static void model_destroy(Model<floatX>* m) {
    if (m->offload_opt) {  // the master weights, the host's gradients and the state: carved from one pinned block
        mem_free(m->opt_offload.opt_host_memory);
        for (int i = 0; i < 2; i++) { CUDA_CHECK(cudaEventDestroy(m->opt_offload.staged_up[i])); }
        CUDA_CHECK(cudaEventDestroy(m->opt_offload.uploaded));
        if (m->opt_offload.grad_stream != NULL) {
            CUDA_CHECK(cudaEventDestroy(m->opt_offload.grads_ready));
            for (int i = 0; i < 2; i++) { CUDA_CHECK(cudaEventDestroy(m->opt_offload.grads_down[i])); }
            CUDA_CHECK(cudaStreamDestroy(m->opt_offload.grad_stream));
        }
    } else {
        void* blocks[] = {m->master_memory, m->opt_memory, m->host_params, m->host_opt};
        for (size_t i = 0; i < sizeof(blocks) / sizeof(blocks[0]); i++) { mem_free(blocks[i]); }
    }
    if ((void*)m->weights_memory != (void*)m->master_memory) { mem_free(m->weights_memory); }
    void* zero[] = {m->grads_memory, m->shard.grad_working, m->shard.zero_pack, m->zero3.weight_working, m->zero3.layer_buf_memory, m->zero3.ckpt_staging, m->weight_shard};
    for (size_t i = 0; i < sizeof(zero) / sizeof(zero[0]); i++) { mem_free(zero[i]); }
    free(m->slices); free(m->shard.zero_groups); free(m->shard.shard_block_off);
    void* blocks[] = {m->bwd_memory, m->scratch_memory, m->lowp_m_staging, m->host_probs, m->host_losses, m->tp_staging};
    for (size_t i = 0; i < sizeof(blocks) / sizeof(blocks[0]); i++) { mem_free(blocks[i]); }
    if (m->offload.wait_marks != NULL) {
        for (int i = 0; i < 2 * OFFLOAD_MAX_WAITS; i++) { CUDA_CHECK(cudaEventDestroy(m->offload.wait_marks[i])); }
        free(m->offload.wait_marks);
    }
    if (m->act.offload) {
        CUDA_CHECK(cudaEventDestroy(m->offload.compute_done));
        CUDA_CHECK(cudaStreamDestroy(m->offload.copy_stream));  // its copies to and from the sets' host stores finish first
    }
    pp_cuda_destroy(&m->pp);  // its messages from the sets' buffers finish first
    if (m->pipeline.world > 1) { pp_sent_destroy(&m->grad_sent); }
    for (int i = 0; i < m->num_held; i++) { free_activation_set(m, &m->held[i]); }
    free(m->held);
    mem_free(m->pp_staging);
    matmul_context_free(&m->matmul);
    tp_cuda_destroy(&m->tp);
    if (m->exchange.comm != NULL) {
        nccl_comm_destroy(m->exchange.comm);
        CUDA_CHECK(cudaEventDestroy(m->exchange.grads_final));
        CUDA_CHECK(cudaEventDestroy(m->exchange.reduced));
        CUDA_CHECK(cudaEventDestroy(m->shard.working_taken));
        if (zero_gathers_after_update(m)) {
            for (int i = 0; i <= m->config.num_layers; i++) { CUDA_CHECK(cudaEventDestroy(m->shard.gathered[i])); }
            free(m->shard.gathered);
            CUDA_CHECK(cudaEventDestroy(m->shard.updated));
        }
        if (m->zero == ZERO_3) {
            cudaEvent_t all[] = {m->zero3.gathered[0], m->zero3.gathered[1], m->zero3.released[0], m->zero3.released[1], m->zero3.outer_ready, m->zero3.compute_mark};
            for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) { CUDA_CHECK(cudaEventDestroy(all[i])); }
        }
        CUDA_CHECK(cudaStreamDestroy(m->exchange.comm_stream));
    }
    CUDA_CHECK(cudaStreamDestroy(m->stream));
    free(m);
}

// ----------------------------------------------------------------------------
// one transformer block: x -> x + attn(ln1(x)) -> (that) + mlp(ln2(that)), as train_gpt.c's.
// ln1_done: a's ln1, ln1_mean and ln1_rstd hold ln1(x) already (the block before computed them with
// its last residual). next, np: the next block's activations and weights, whose ln1 this block's
// last residual computes in the same pass (NULL: none; the results are bitwise the same either way)
//
// With --tp N (cuda/tensor_parallel.cuh) this rank computes Ct = C/N channels of the attention (NHt =
// NH/N heads) and 4Ct of the MLP's hidden units, as train_gpt.c's block does: its two row-parallel
// matmuls give partial sums, which the hook tp_reduce_cuda adds over the group (forward), as it adds
// the partial d(ln2) and d(ln1) (backward). With --sp the residual stream and the LayerNorms are this
// rank's R = B T/N rows (R = B T without it): tp_gather_cuda meets the group's rows before each
// column-parallel matmul, and tp_reduce_cuda hands each rank its rows of the sums

template <typename floatX>
static void block_forward(Model<floatX>* m, LayerActs<floatX>* a, const floatX* x, const LayerParams<floatX>* p, int B, int T,
                          int ln1_done = 0, LayerActs<floatX>* next = NULL, const LayerParams<floatX>* np = NULL) {
    const TpCuda* tp = &m->tp;
    int C = m->config.channels, Ct = C / tp->size, NHt = m->config.num_heads / tp->size;
    size_t BTC = (size_t)B * T * C, R = tp_rows_cuda(tp, (size_t)B * T), RC = R * C;
    const MatmulContext* mc = &m->matmul;
    cudaStream_t s = m->stream;
    if (!ln1_done) { layernorm_forward_cuda(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, 1, (int)R, C, s); }
    const floatX* ln1 = tp_gather_cuda(tp, a->ln1, RC, s);  // hook: --sp's rows of every rank, (B,T,C)
    matmul_forward_cuda(a->qkv, ln1, p->qkvw, p->qkvb, B, T, C, 3 * Ct, mc, s);  // (B,T,3Ct)
    if (m->act.flash) { flash_attention_forward_cuda(a->atty, layer_lse(a), a->qkv, B, T, Ct, NHt, s); }  // (B,T,Ct)
    else { attention_forward_cuda(a->atty, a->att, a->qkv, B, T, Ct, NHt, m->attention_scratch, mc, s); }
    floatX* proj = tp_partial_cuda(tp, a->residual2);  // --sp: the partial projection of every row
    matmul_forward_cuda(proj, a->atty, p->attprojw, tp_row_bias_cuda(tp, p->attprojb), B, T, Ct, C, mc, s);
    tp_reduce_cuda(tp, proj, a->residual2, BTC, s);  // hook: --tp's partial projections added
    // in place: residual2 = x + projection, and its LayerNorm, in one pass over the residual stream
    residual_layernorm_forward_cuda(a->residual2, a->ln2, a->ln2_mean, a->ln2_rstd, x, a->residual2, p->ln2w, p->ln2b,
                                    1, (int)R, C, s);
    const floatX* ln2 = tp_gather_cuda(tp, a->ln2, RC, s);  // hook
    matmul_forward_cuda(a->fch, ln2, p->fcw, p->fcb, B, T, C, 4 * Ct, mc, s);  // (B,T,4Ct)
    gelu_forward_cuda(a->fch_gelu, a->fch, BTC / tp->size * 4, s);
    proj = tp_partial_cuda(tp, a->residual3);
    matmul_forward_cuda(proj, a->fch_gelu, p->fcprojw, tp_row_bias_cuda(tp, p->fcprojb), B, T, 4 * Ct, C, mc, s);
    tp_reduce_cuda(tp, proj, a->residual3, BTC, s);  // hook
    if (next != NULL) {  // residual3 = residual2 + projection, and the next block's ln1 of it
        residual_layernorm_forward_cuda(a->residual3, next->ln1, next->ln1_mean, next->ln1_rstd, a->residual2, a->residual3,
                                        np->ln1w, np->ln1b, 1, (int)R, C, s);
        return;
    }
    residual_forward_cuda(a->residual3, a->residual2, a->residual3, RC, s);
}

// --recompute gelu, attn (selective recompute): what the layer's forward did not keep, again into the
// shared buffers before its backward reads it (flash attention recomputes its weights in its kernels)
template <typename floatX>
static void recompute_dropped(Model<floatX>* m, LayerActs<floatX>* a, int B, int T) {
    int N = m->tp.size, Ct = m->config.channels / N, NHt = m->config.num_heads / N;
    prof_context("recompute");
    if (m->act.gelu) { gelu_forward_cuda(a->fch_gelu, a->fch, (size_t)B * T * 4 * Ct, m->stream); }
    if (m->act.attn && !m->act.flash) {
        prof_kernel(m->stream, PROF_ATTENTION_FORWARD, prof_attention_forward(B, T, Ct, sizeof(floatX)), "weights");
        attention_weights_forward_cuda(a->att, a->qkv, B, T, Ct, NHt, m->attention_scratch, &m->matmul, m->stream);
    }
    prof_context(NULL);
}

// a column-parallel matmul's backward (qkvw's, fcw's) under --tp: its input gradient dinp (B,T,C) is
// this rank's part, which the group's sum (tp_reduce_cuda, on the group's stream) completes while the
// compute stream computes the weight and bias gradients; on return the sum (--sp: this rank's rows of
// it, at tp_reduced_rows_cuda) is in dinp, in stream order. Without --tp, matmul_backward_cuda
template <typename floatX>
static void column_parallel_backward(Model<floatX>* m, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                                     const floatX* inp, const floatX* weight, int B, int T, int C, int OC) {
    const TpCuda* tp = &m->tp;
    cudaStream_t s = m->stream;
    if (tp->size == 1) {
        matmul_backward_cuda(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC, m->reduce_scratch, &m->matmul, s, MATMUL_DINP_SET);
        return;
    }
    size_t BT = (size_t)B * T;
    prof_kernel(s, PROF_MATMUL, prof_matmul_backward(BT, C, OC, sizeof(floatX)), PROF_MATMUL_BACKWARD " (--tp: dinp summed beside)",
                BT, C, OC);
    matmul_backward_dinp_cuda(dinp, dout, weight, B, T, C, OC, &m->matmul, s, MATMUL_DINP_SET);
    tp_reduce_begin_cuda(tp, dinp, tp_reduced_rows_cuda(tp, dinp, BT, C), BT * C, s);  // hook: the partial input gradients
    matmul_backward_weights_cuda(dweight, dbias, dout, inp, B, T, C, OC, m->reduce_scratch, &m->matmul, s);
    tp_reduce_end_cuda(tp, s);
}

// on entry m->dresidual holds d(block output); on exit d(block input) (x), R rows each. Weight gradients
// (fp32) accumulate into g. Selective recompute first runs the GELU and the attention softmax
// again into their shared buffers (flash attention recomputes its weights inside its kernels). A
// buffer with one contributor is written (MATMUL_DINP_SET), not cleared and added to; dqkv is
// cleared for the stored-weights attention, whose backward adds into it. With --sp the forward's
// gathered rows are gathered again where a matmul's backward reads them, and d(block output) of every row too
template <typename floatX>
static void block_backward(Model<floatX>* m, LayerActs<floatX>* a, const floatX* x, const LayerParams<floatX>* p,
                           const LayerParams<float>* g, int B, int T) {
    const TpCuda* tp = &m->tp;
    int C = m->config.channels, Ct = C / tp->size, NHt = m->config.num_heads / tp->size;
    size_t BT = (size_t)B * T, R = tp_rows_cuda(tp, BT), RC = R * C, X = sizeof(floatX);
    const MatmulContext* mc = &m->matmul;
    cudaStream_t s = m->stream;
    float* scratch = m->reduce_scratch;
    floatX *dln2 = m->dbtc, *datty = m->dbtc, *dln1 = m->dbtc;  // one buffer, three gradients in turn
    if (m->act.gelu || (m->act.attn && !m->act.flash)) { recompute_dropped(m, a, B, T); }
    // MLP branch; the residual passes dresidual through unchanged, so it stays in place. The fc
    // projection's dinp GEMM also takes the GELU backward: dfch = gelu'(fch) * (dresidual @ fcprojw)
    const floatX* dout = tp_gather_cuda(tp, m->dresidual, RC, s);  // hook: --sp's d(block output) of every row
    matmul_backward_cuda(m->dfch, g->fcprojw, g->fcprojb, dout, a->fch_gelu, p->fcprojw, B, T, 4 * Ct, C, scratch,
                         mc, s, MATMUL_DINP_SET_DGELU, a->fch);
    column_parallel_backward(m, dln2, g->fcw, g->fcb, m->dfch, tp_gather_cuda(tp, a->ln2, RC, s), p->fcw, B, T, C, 4 * Ct);
    TpNormGradsCuda gn = tp_norm_grads_cuda(tp, g->ln2w, g->ln2b, C, s);  // --sp: a part of them, from this rank's rows
    layernorm_backward_cuda(m->dresidual, gn.w, gn.b, tp_reduced_rows_cuda(tp, dln2, BT, C), a->residual2, p->ln2w, a->ln2_mean,
                            a->ln2_rstd, 1, (int)R, C, scratch, s);
    tp_norm_grads_done_cuda(tp, g->ln2w, g->ln2b, C, s);  // hook
    // attention branch
    dout = tp_gather_cuda(tp, m->dresidual, RC, s);  // hook
    matmul_backward_cuda(datty, g->attprojw, g->attprojb, dout, a->atty, p->attprojw, B, T, Ct, C, scratch, mc,
                         s, MATMUL_DINP_SET);
    if (m->act.flash) {  // writes all of dqkv
        flash_attention_backward_cuda(m->dqkv, datty, a->qkv, a->atty, layer_lse(a), B, T, Ct, NHt, m->flash_scratch, s);
    } else {  // adds into dqkv
        CUDA_CHECK(cudaMemsetAsync(m->dqkv, 0, BT * 3 * Ct * X, s));
        attention_backward_cuda(m->dqkv, m->datt, datty, a->qkv, a->att, B, T, Ct, NHt, m->attention_scratch, mc, s);
    }
    column_parallel_backward(m, dln1, g->qkvw, g->qkvb, m->dqkv, tp_gather_cuda(tp, a->ln1, RC, s), p->qkvw, B, T, C, 3 * Ct);
    gn = tp_norm_grads_cuda(tp, g->ln1w, g->ln1b, C, s);
    layernorm_backward_cuda(m->dresidual, gn.w, gn.b, tp_reduced_rows_cuda(tp, dln1, BT, C), x, p->ln1w, a->ln1_mean, a->ln1_rstd,
                            1, (int)R, C, scratch, s);
    tp_norm_grads_done_cuda(tp, g->ln1w, g->ln1b, C, s);  // hook
}

// ----------------------------------------------------------------------------
// the whole model

#include "cuda/zero_gather.cuh"      // --zero 1, 2: the updated weights gathered during the next forward (zero_gather_updated)
#include "cuda/zero3_weights.cuh"    // --zero 3: the weights gathered layer by layer (weights_of_layer, zero3_release)
#include "cuda/offload_optimizer.cuh"  // --offload optimizer[,gradients]: the host's step (offload_update_upto, send_final_grads, take_grads)

// hook: wte, wpe, lnfw, lnfb ready for the encoder and the head: ZeRO-3 gathers them, ZeRO-1 and 2
// wait for the update's gather of them
template <typename floatX>
static void outer_weights_ready(Model<floatX>* m) {
    offload_update_upto(m, OUTER_GROUP);
    zero3_gather_outer(m);
    zero_wait_gathered(m, OUTER_GROUP);
}

#include "cuda/offload_activations.cuh"  // --offload activations, --recompute: the copy stream (store_after_forward, prepare_backward)

// hook: --pp: before a forward or backward writes them again, the sends that read the held set's stage output
// and dresidual are done (within a step they are: the receive the list puts before it came after them)
template <typename floatX>
static void pp_sends_done(Model<floatX>* m) {
    if (m->pipeline.world == 1) { return; }
    pp_wait_sent_cuda(&m->acts->sent, m->stream);
    pp_wait_sent_cuda(&m->grad_sent, m->stream);
}

// layers first..last forward from x into the working set; with store, what the schedule keeps.
// Each block but the last computes the next one's ln1 with its last residual (one pass over the
// residual stream), except under offload, where the next block's slot may still be on its way to
// the host until the compute stream waits for it, and under ZeRO-3, whose next layer's weights are
// gathered while this one computes
template <typename floatX>
static void forward_layers(Model<floatX>* m, int first, int last, const floatX* x, int B, int T, int store) {
    int C = m->config.channels;
    int ln1_done = 0;
    for (int l = first; l <= last; l++) {
        // not under ZeRO-3, where the next layer's weights are still on their way
        LayerActs<floatX>* next = l < last && !m->act.offload && m->zero != ZERO_3 ? act_layer(m, l + 1) : NULL;
        // hook: --offload optimizer's deferred update of the weights read next (ZeRO-3: and of those its
        // prefetch gathers while l computes)
        offload_update_upto(m, l < last && (next != NULL || m->zero == ZERO_3) ? l + 1 : l);
        LayerParams<floatX> lp = weights_of_layer(m, l), np;
        LayerActs<floatX>* la = act_layer(m, l);
        if (next != NULL) { np = weights_of_layer(m, l + 1); }  // its ln1 (ZeRO-1, 2: once gathered)
        if (m->act.offload) { wait_slot_saved(m, l); }
        block_forward(m, la, x, &lp, B, T, ln1_done, next, next != NULL ? &np : (const LayerParams<floatX>*)NULL);
        zero3_release(m, l, l < last ? l + 1 : -1);
        ln1_done = next != NULL;
        if (store) { store_after_forward(m, l, tp_rows_cuda(&m->tp, (size_t)B * T) * C); }
        x = la->residual3;
    }
}


// the mean of the (B,T) losses, added on the host in the CPU's order
template <typename floatX>
static float mean_loss(Model<floatX>* m, int B, int T) {
    size_t BT = (size_t)B * T;
    CUDA_CHECK(cudaMemcpyAsync(m->host_losses, m->acts->losses, BT * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    WATCHED_WAIT(cudaStreamSynchronize(m->stream), "the model's stream");
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) { sum += m->host_losses[i]; }
    return (float)(sum / BT);
}

// --offload optimizer,gradients: the outer tensors' gradients (wte, wpe, lnfw, lnfb) hold one micro-batch's
// only (the host sums the step's): cleared before the micro-step's first contribution to them (the
// head's: in backward, or with --loss-chunk in forward)
template <typename floatX>
static void clear_outer_grads(Model<floatX>* m) {
    if (m->offload_opt != OPT_OFFLOAD_GRADS) { return; }
    prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_ZEROING, prof_bytes(outer_weights(&m->config) * sizeof(float)), "gradients of wte, wpe, lnf");
    CUDA_CHECK(cudaMemsetAsync(m->grads_memory, 0, outer_weights(&m->config) * sizeof(float), m->stream));
}

// the head forward of n tokens from row `first` of the last block's output x (B*T,C), as
// train_gpt.c's head_forward: the final LayerNorm (statistics at first), the logits, with targets the
// losses (at first); loss_scale > 0 (--loss-chunk, training): the logits' gradient at once, its part
// of d(lnf output) written into dbtc's rows and of wte's gradient += (fp32); else the row statistics.
// With --tp the classifier is split over the vocabulary (cuda/tensor_parallel.cuh): a rank's logits
// are its Vp/N columns, the softmax's row maximum and sum are the group's, and the partial d(lnf
// output) of a rank's columns is summed over the group
template <typename floatX>
static void head_forward(Model<floatX>* m, const floatX* x, int first, int n, int has_targets, float loss_scale) {
    const GPT2Config* c = &m->config;
    const TpCuda* tp = &m->tp;
    int C = c->channels, V = c->vocab_size, Vp = c->padded_vocab_size / tp->size;  // --tp: a rank's columns
    size_t row = (size_t)first * C;
    cudaStream_t s = m->stream;
    const int* targets = has_targets ? m->targets + first : (const int*)NULL;
    layernorm_forward_cuda(m->acts->lnf, m->acts->lnf_mean + first, m->acts->lnf_rstd + first, x + row, m->weights.lnfw, m->weights.lnfb, 1, n, C, s);
    matmul_forward_cuda(m->acts->logits, m->acts->lnf, m->weights.wte, (const floatX*)NULL, 1, n, C, Vp, &m->matmul, s);
    if (tp->size > 1) { tp_classifier_forward_cuda(tp, m->acts->losses + first, m->acts->row_max, m->acts->row_sum, m->acts->logits, targets, n, V, Vp, s); }
    if (loss_scale == 0.0f) {
        if (tp->size == 1) { classifier_forward_cuda(m->acts->losses + first, m->acts->row_max, m->acts->row_sum, m->acts->logits, targets, 1, n, V, Vp, s); }
        return;
    }
    if (tp->size > 1) {  // in place: dlogits
        tp_classifier_backward_cuda(tp, m->acts->logits, m->acts->logits, m->acts->row_max, m->acts->row_sum, m->targets + first, loss_scale, n, V, Vp, s);
    } else {
        classifier_fused_cuda(m->acts->losses + first, m->acts->logits, m->targets + first, loss_scale, 1, n, V, Vp, s);  // in place: dlogits
    }
    matmul_backward_cuda(m->dbtc + row, m->grads.wte, (float*)NULL, m->acts->logits, m->acts->lnf, m->weights.wte, 1, n, C, Vp, m->reduce_scratch,
                         &m->matmul, s, MATMUL_DINP_SET);
    tp_allreduce_cuda(tp, m->dbtc + row, (size_t)n * C, ncclSum, s);  // hook: --tp's partial d(lnf output) of a rank's columns added
}

// --sp splits the B*T rows over the group: a sample's forward of 1..T tokens that do not split runs on
// T padded up to a multiple of the group's size, token 0 after the text (causal attention: the text's
// positions see none of them; their probabilities are never asked for), as train_gpt.c's forward_padded;
// the trainer's checks keep that within the allocated T (-t a multiple of --tp when training samples)
template <typename floatX>
static float model_forward(Model<floatX>* m, const int* inputs, const int* targets, int B, int T, float loss_scale);
template <typename floatX>
static float model_forward_padded(Model<floatX>* m, const int* inputs, int B, int T) {
    int N = m->tp.size, Tp = (T + N - 1) / N * N;
    if (B != 1 || Tp > m->seq_len) {
        fail("--sp: a forward of B=%d x T=%d tokens does not split over the %d ranks' rows, and T padded to %d passes the allocated T=%d\n"
             "  hint: a -t that is a multiple of --tp %d", B, T, N, Tp, m->seq_len, N);
    }
    int* padded = (int*)calloc_check((size_t)Tp, sizeof(int));  // token 0 after the text
    memcpy(padded, inputs, (size_t)T * sizeof(int));
    float loss = model_forward(m, padded, (const int*)NULL, 1, Tp, 0.0f);
    free(padded);
    return loss;
}

// loss_scale > 0: gpt2_forward_train's with --loss-chunk (the head's gradients too)
template <typename floatX>
static float model_forward(Model<floatX>* m, const int* inputs, const int* targets, int B, int T, float loss_scale) {
    const GPT2Config* c = &m->config;
    const TpCuda* tp = &m->tp;
    int L = c->num_layers, C = c->channels;
    if (B > m->batch_size || T > m->seq_len) { fail("forward with (B,T)=(%d,%d) beyond the allocated (%d,%d)", B, T, m->batch_size, m->seq_len); }
    if (tp->gathered != NULL && (size_t)B * T % (size_t)tp->size != 0 && targets == NULL) { return model_forward_padded(m, inputs, B, T); }
    size_t BT = (size_t)B * T;
    cudaStream_t s = m->stream;
    const int S = PROF_STREAM_COMPUTE;
    CUDA_CHECK(cudaMemcpyAsync(m->inputs, inputs, BT * sizeof(int), cudaMemcpyHostToDevice, s));
    if (targets != NULL) { CUDA_CHECK(cudaMemcpyAsync(m->targets, targets, BT * sizeof(int), cudaMemcpyHostToDevice, s)); }
    pp_sends_done(m);                                       // hook: --pp: the sends from the buffers it writes are done
    outer_weights_ready(m);                                 // hook: wte, wpe, lnf ready (ZeRO gathers them)
    if (!stage_has_embeddings(c)) {  // --pp: a later stage: encoded holds the previous stage's output (received)
    } else if (tp->size > 1) {  // --tp: wte split over the vocabulary (cuda/tensor_parallel.cuh)
        tp_encoder_forward_cuda(tp, m->acts->encoded, m->inputs, m->weights.wte, m->weights.wpe, B, T, C, c->padded_vocab_size / tp->size, s);
    } else {
        encoder_forward_cuda(m->acts->encoded, m->inputs, m->weights.wte, m->weights.wpe, B, T, C, s);
    }
    forward_layers(m, 0, L - 1, m->acts->encoded, B, T, 1);
    if (!stage_has_head(c)) { prof_gpu_close(s, S); return 0.0f; }  // --pp: the next stage goes on from the last layer's output
    if (loss_scale > 0.0f) { clear_outer_grads(m); }       // hook: --offload optimizer,gradients (--loss-chunk's head adds to them)
    // the head, K tokens at a time (one chunk of B*T without --loss-chunk), over every row (--sp: gathered)
    int n_all = (int)BT, K = m->acts->head_rows < n_all ? m->acts->head_rows : n_all;
    const floatX* x = tp_gather_cuda(tp, layer_input(m, L), tp_rows_cuda(tp, BT) * C, s);
    for (int first = 0; first < n_all; first += K) {
        int n = n_all - first < K ? n_all - first : K;
        head_forward(m, x, first, n, targets != NULL, loss_scale);
        m->acts->probs_first = first;
        m->acts->probs_end = first + n;
    }
    prof_gpu_close(s, S);
    if (loss_scale > 0.0f) { m->acts->probs_first = -1; }  // the last chunk's logits are their gradient now
    m->acts->head_grad_scale = loss_scale;
    return targets != NULL ? mean_loss(m, B, T) : -1.0f;
}

// the first layer whose weights the backward reads after layer l + 1's: l, or the first layer of
// the segment recomputed before l's backward (act_policy.h)
template <typename floatX>
static int next_backward_layer(const Model<floatX>* m, int l) {
    ActBackwardPlan bp = act_before_backward(&m->act, m->config.num_layers, l);
    return bp.recompute_segment >= 0 ? bp.recompute_first : l;
}

// the backward's hooks, where the techniques enter the plain loop of model_backward

// where layer l's backward adds its gradients: the model's gradients, ZeRO-2's one-layer working
// buffer, or with --offload optimizer,gradients one of the two layers' on the GPU
template <typename floatX>
static LayerParams<float> layer_grads_of(Model<floatX>* m, int l) {
    if (m->offload_opt == OPT_OFFLOAD_GRADS) { return layer_grads_on_device(m, l); }
    return layer_params(&m->grads, zero_shards_grads(m->zero) ? 0 : l, &m->config);
}

// after layer l's backward: ZeRO-3 releases its weights (and prefetches the next layer the backward
// reads); its gradients are reduce-scattered (ZeRO-2), all-reduced (the step's last micro-step), sent
// to the host (--offload optimizer), or go down while the CPU takes l+1's (,gradients)
template <typename floatX>
static void layer_grads_done(Model<floatX>* m, int l) {
    zero3_release(m, l, l > 0 ? next_backward_layer(m, l - 1) : -1);
    if (zero_shards_grads(m->zero)) { zero2_reduce(m, l); }
    else if (m->exchange.reduce_in_backward) { reduce_now_final(m, l); }
    if (m->opt_offload.send_in_backward) { send_final_grads(m, l); }
    if (m->offload_opt == OPT_OFFLOAD_GRADS) {
        send_grads_down(m, m->opt_offload.grad_layers[l % 2], layer_weights(&m->config), l % 2);
        if (l + 1 < m->config.num_layers) { take_grads(m, l + 1, (l + 1) % 2); }
    }
}

// after the encoder's backward: layer_grads_done for wte, wpe, lnfw, lnfb (OUTER_GROUP); with
// ,gradients they go through opt_staging[1] (layer 1's, taken), then the last two groups
template <typename floatX>
static void outer_grads_done(Model<floatX>* m) {
    if (zero_shards_grads(m->zero)) { zero2_reduce(m, OUTER_GROUP); }
    else if (m->exchange.reduce_in_backward) { reduce_now_final(m, OUTER_GROUP); }
    if (m->opt_offload.send_in_backward) { send_final_grads(m, OUTER_GROUP); }
    if (m->offload_opt == OPT_OFFLOAD_GRADS) {
        send_grads_down(m, m->grads_memory, outer_weights(&m->config), 1);
        take_grads(m, 0, 0);
        take_grads(m, OUTER_GROUP, 1);
        m->opt_offload.first_micro_step = 0;
    }
}

// the head's backward (the last stage's with --pp): the classifier's (or, with --loss-chunk, what the forward
// left of it: d(lnf output) in dbtc), then the final LayerNorm's into dresidual, d(the last block's output)
template <typename floatX>
static void head_backward(Model<floatX>* m, const int* targets, int B, int T, float loss_scale) {
    const GPT2Config* c = &m->config;
    const TpCuda* tp = &m->tp;
    int L = c->num_layers, C = c->channels, V = c->vocab_size, Vp = c->padded_vocab_size / tp->size;  // --tp: a rank's columns
    size_t BT = (size_t)B * T, R = tp_rows_cuda(tp, BT), first = tp_first_row_cuda(tp, BT), X = sizeof(floatX);
    cudaStream_t s = m->stream;
    Acts<floatX>* a = m->acts;
    if (m->act.loss_chunk > 0) {  // the forward did the head's backward, chunk by chunk: d(lnf output) is in dbtc
        act_take_head_grads(&a->head_grad_scale, loss_scale);
    } else {
        clear_outer_grads(m);
        if (m->num_held > 1) {  // --pp: this micro-batch's targets again (the forwards of the others held since replaced them)
            CUDA_CHECK(cudaMemcpyAsync(m->targets, targets, BT * sizeof(int), cudaMemcpyHostToDevice, s));
        }
        if (tp->size > 1) {  // in place: dlogits
            tp_classifier_backward_cuda(tp, a->logits, a->logits, a->row_max, a->row_sum, m->targets, loss_scale, (int)BT, V, Vp, s);
        } else {
            classifier_backward_cuda(a->logits, a->logits, a->row_max, a->row_sum, m->targets, loss_scale, B, T, V, Vp, s);  // in place: dlogits
        }
        a->probs_first = -1;
        matmul_backward_cuda(m->dbtc, m->grads.wte, (float*)NULL, a->logits, a->lnf, m->weights.wte, B, T, C, Vp, m->reduce_scratch,
                             &m->matmul, s, MATMUL_DINP_SET);
        tp_allreduce_cuda(tp, m->dbtc, BT * C, ncclSum, s);  // hook: --tp's partial d(lnf output) added
    }
    CUDA_CHECK(cudaMemsetAsync(m->dresidual, 0, R * C * X, s));  // --sp: this rank's rows
    TpNormGradsCuda gn = tp_norm_grads_cuda(tp, m->grads.lnfw, m->grads.lnfb, C, s);  // --sp: a part of them, from this rank's rows
    layernorm_backward_cuda(m->dresidual, gn.w, gn.b, m->dbtc + first * C, layer_input(m, L), m->weights.lnfw,
                            a->lnf_mean + first, a->lnf_rstd + first, 1, (int)R, C, m->reduce_scratch, s);
    tp_norm_grads_done_cuda(tp, m->grads.lnfw, m->grads.lnfb, C, s);  // hook
}

template <typename floatX>
static void model_backward(Model<floatX>* m, const int* inputs, const int* targets, int B, int T, float loss_scale) {
    const GPT2Config* c = &m->config;
    const TpCuda* tp = &m->tp;
    int L = c->num_layers, C = c->channels, Vp = c->padded_vocab_size / tp->size;  // --tp: a rank's columns
    size_t R = tp_rows_cuda(tp, (size_t)B * T);
    cudaStream_t s = m->stream;
    const int S = PROF_STREAM_COMPUTE;
    pp_sends_done(m);                                     // hook: --pp: the sends from the buffers it writes are done
    if (stage_has_head(c)) {
        head_backward(m, targets, B, T, loss_scale);
    } else {  // --pp: dresidual holds the next stage's gradient of this stage's output (received)
        clear_outer_grads(m);                             // hook: --offload optimizer,gradients (the embeddings' add to them)
    }
    for (int l = L - 1; l >= 0; l--) {
        prepare_backward(m, l, B, T);                     // hook: l's activations back (--offload, --recompute)
        LayerParams<floatX> lp = weights_of_layer(m, l);  // hook: l's weights (ZeRO-3 gathers them)
        LayerParams<float> lg = layer_grads_of(m, l);     // hook: where l's gradients go (ZeRO-2, --offload optimizer,gradients)
        block_backward(m, act_layer(m, l), layer_input(m, l), &lp, &lg, B, T);
        layer_grads_done(m, l);                           // hook: ZeRO's and NCCL's exchanges, the offloaded optimizer's copies
    }
    if (!stage_has_embeddings(c)) {  // --pp: dresidual is d(stage input), for the stage before
    } else if (tp->size > 1) {  // --tp: wte's rows of this rank, from d(embeddings) of every row (--sp: gathered)
        tp_encoder_backward_cuda(tp, m->grads.wte, m->grads.wpe, tp_gather_cuda(tp, (const floatX*)m->dresidual, R * C, s), inputs, B, T, C,
                                 Vp, (int*)m->reduce_scratch, s);
    } else {
        encoder_backward_cuda(m->grads.wte, m->grads.wpe, m->dresidual, inputs, B, T, C, (int*)m->reduce_scratch, s);
    }
    prof_gpu_close(s, S);
    outer_grads_done(m);                                  // hook: the same for wte, wpe, lnfw, lnfb
}

#include "cuda/zero_exchange.cuh"  // more than one rank, --zero 1, 2: the gradients' NCCL exchange (zero2_reduce, reduce_now_final, model_reduce_grads)

// rank's reduced gradients of slice k: its block in the model's gradients (offset: from the
// slice's start, slice_shard's), or under ZeRO-2 and 3 in the gradient shard
template <typename floatX>
static float* grad_block(Model<floatX>* m, int k, size_t offset) {
    return zero_shards_grads(m->zero) ? m->grads_memory + m->shard.shard_block_off[k] : m->grads_memory + m->slices[k].offset + offset;
}

// --pp, after the data group's sums: wte's two parts, the embedding's (the first stage) and the classifier's
// (the last), added over the pair (cuda/pipeline.cuh; on the host with --offload optimizer, cpu/pipeline.h),
// this rank's block of them (whole, or ZeRO's: the same block on both stages)
template <typename floatX>
static void pp_reduce_pair(Model<floatX>* m) {
    if (m->pair.world <= 1) { return; }
    size_t n, offset;
    if (m->offload_opt) {
        HostStep h = host_step_of(m);
        float* wte = host_slice_grads(&h, 0, &n);
        prof_mark(PROF_COLLECTIVE, prof_bytes((double)n * sizeof(float)), "--pp: wte's pair, on the host");
        pp_sum_pair(wte, n, m->pair);
        prof_close();
        return;
    }
    OptSharding z = OPT_UNSHARDED;
    if (zero_shards_state(m->zero)) { z.rank = m->dist.rank; z.world = m->dist.world; }
    z.format = m->state_format;
    OptShard sh = slice_shard(&m->slices[0], &z, &offset);  // slice 0: wte
    pp_sum_pair_cuda(&m->pp, grad_block(m, 0, offset), (size_t)sh.rows * sh.cols, m->stream);
}

// global L2 norm of the fp32 gradients (a fixed-order sum in double). ZeRO-1 and 2: each rank sums
// the squares of its blocks (the only reduced gradients it has), in slice order, then the ranks add.
// --tp: the squares of the split tensors' slices are added over the tensor-parallel group, those of the
// tensors every rank of it holds whole counted once; --pp: each stage's squares are added over the
// pipeline group, wte's (which the first and the last stage both hold, summed) the last stage's only (as
// cpu/host_step.h's host_grad_norm)
template <typename floatX>
static float model_grad_norm(Model<floatX>* m) {
    lowp_check_refused(m);
    if (m->offload_opt) {
        HostStep h = host_step_of(m);
        prof_mark(PROF_GRAD_NORM, prof_grad_norm(m->num_parameters), "on the host");
        float norm = host_grad_norm(&h);
        prof_close();
        return norm;
    }
    double sum = 0.0;
    prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_GRAD_NORM, prof_grad_norm(m->num_parameters), "all gradients");
    int sharded = zero_shards_state(m->zero) && m->exchange.comm != NULL, tp = m->tp.size > 1, pp = m->pipeline.world > 1;
    if (!sharded && !tp && !pp) {
        double* result = m->norm_scratch;
        global_norm_squared_cuda(result, m->grads_memory, m->num_parameters, m->norm_scratch + 1, m->stream);
        CUDA_CHECK(cudaMemcpyAsync(&sum, result, sizeof(double), cudaMemcpyDeviceToHost, m->stream));
        prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
        WATCHED_WAIT(cudaStreamSynchronize(m->stream), "the model's stream");
        return (float)sqrt(sum);
    }
    int nslices = param_slice_count(&m->config);
    OptSharding z = {.rank = sharded ? m->dist.rank : 0, .world = sharded ? m->dist.world : 1, .sum = NULL, .gather = NULL,
                     .grads_compact = 0, .params_compact = 0, .format = m->state_format, .tp_sum = NULL};
    for (int k = 0; k < nslices; k++) {
        size_t offset;
        OptShard sh = slice_shard(&m->slices[k], &z, &offset);
        global_norm_squared_cuda(m->exchange.norm_parts + k, grad_block(m, k, offset), (size_t)sh.rows * sh.cols, m->norm_scratch + 1, m->stream);
    }
    double* parts = (double*)malloc_check((size_t)nslices * sizeof(double));
    CUDA_CHECK(cudaMemcpyAsync(parts, m->exchange.norm_parts, (size_t)nslices * sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
    WATCHED_WAIT(cudaStreamSynchronize(m->stream), "the model's stream");
    double split = 0.0;  // --tp: the split tensors' slices' squares
    for (int k = 0; k < nslices; k++) {
        if (pp && k == 0 && m->pipeline.rank == 0) { continue; }  // wte: the last stage's copy counts
        if (m->slices[k].tp > 1) { split += parts[k]; } else { sum += parts[k]; }
    }
    free(parts);
    if (tp) {  // the group's sum gives every rank of it the same bits, and the whole tensors' are the same there
        dist_allreduce_doubles_over(&split, 1, m->tensor);
        sum += split;
    }
    if (sharded) { dist_allreduce_doubles_over(&sum, 1, m->dist); }
    dist_allreduce_doubles_over(&sum, 1, m->pipeline);  // --pp: every stage's
    return (float)sqrt(sum);
}

// the communicators Adafactor's and CAME's sums cross (cuda/adafactor.cuh): ZeRO's data-parallel
// ranks, --tp's group
template <typename floatX>
static OptComms opt_comms(const Model<floatX>* m) {
    OptComms c = {m->exchange.comm, m->tp.comm};
    return c;
}

// --optimizer-state bf16 or 8bit: slice k's part (p, g: n weights and gradients; st: its state, the
// moments in sh->format) updated as cpu/optimizers_lowp.h's lowp_update_part updates it, with the CPU's
// rounding stream (the slice's index, the part's first element): AdamW's two moments in one pass
// (cuda/adamw_lowp.cuh), Adafactor's and CAME's first moment M through its fp32 copy in lowp_m_staging
// (cuda/factored_lowp.cuh); non-finite new moments counted in lowp_refused
template <typename floatX>
static void update_lowp_slice(Model<floatX>* m, int k, float* p, const float* g, float* st, const OptShard* sh,
                              const OptimizerHyper* h, int t, size_t offset) {
    size_t n = (size_t)sh->rows * sh->cols, units = sh->state_units * sh->width;
    QStateStream qs = {.seed = (uint32_t)k, .index_base = offset};
    FactoredLowp lp = {m->lowp_maps, m->lowp_refused, m->lowp_m_staging};
    if (m->optimizer == OPT_ADAFACTOR) {  // beta1 > 0 (the trainer refuses a low-precision format without M): R, Cc or V, then M
        QMoment M = qmoment_at(st + adafactor_state_floats(sh, 0), sh->format, units, qs);
        adafactor_update_lowp_cuda(p, g, st, &M, sh, &h->adafactor, t, m->opt_scratch, opt_comms(m), &lp, m->stream);
        return;
    }
    if (m->optimizer == OPT_CAME) {  // M, then R, Cc, Rr, Rc or V
        QMoment M = qmoment_at(st, sh->format, units, qs);
        came_update_lowp_cuda(p, g, st + opt_moment_floats(sh), &M, sh, &h->came, t, m->opt_scratch, opt_comms(m), &lp, m->stream);
        return;
    }
    if (n == 0) { return; }
    const AdamWHyper* a = &h->adamw;
    float wd = PARAMETER_IS_MATRIX[m->slices[k].tensor] ? (float)a->weight_decay : 0.0f;
    QMoment mo = qmoment_at(st, sh->format, units, qs), v = qmoment_at(st + opt_moment_floats(sh), sh->format, units, qs);
    if (sh->format == QSTATE_8BIT) {
        adamw_update_8bit_cuda(p, g, mo.q, v.q, n, (float)a->lr, (float)a->beta1, (float)a->beta2, (float)a->eps, wd, t, m->lowp_maps,
                               m->lowp_refused, m->stream);
    } else {
        adamw_update_bf16_cuda(p, g, mo.bf16, v.bf16, n, (float)a->lr, (float)a->beta1, (float)a->beta2, (float)a->eps, wd, t, qs,
                               m->lowp_refused, m->stream);
    }
}

// the last update's count of non-finite new moments (--optimizer-state bf16, 8bit): read where the
// host waits for the compute stream anyway (the next gradient norm, a checkpoint's copy), and the
// run stopped if there are any: the fp32 state would have carried the NaN into the weights silently
template <typename floatX>
static void lowp_check_refused(Model<floatX>* m) {
    if (m->lowp_step == 0) { return; }
    unsigned long long refused = 0;
    CUDA_CHECK(cudaMemcpyAsync(&refused, m->lowp_refused, sizeof(refused), cudaMemcpyDeviceToHost, m->stream));
    WATCHED_WAIT(cudaStreamSynchronize(m->stream), "the model's stream");
    if (refused > 0) {
        fail("step %d: the optimizer's new moments hold %llu non-finite value(s) (NaN or Inf), which %s state refuses\n"
             QSTATE_REFUSED_HINT, m->lowp_step, refused, QSTATE_FORMAT_NAMES[m->state_format]);
    }
    m->lowp_step = 0;
}

// clips the gradients and takes one step of the model's optimizer per slice (under ZeRO-1 and 2 on
// this rank's block of each), as cpu/optimizers.h's optimizer_step (AdamW: weight decay on the 2-D
// weights only; the padded wte rows never touched), the slices the next forward reads first (the outer
// ones, layer 0) first; ZeRO-1 and 2 then send every rank's updated blocks to the others on the comm
// stream (an all-gather per group: cuda/zero_gather.cuh, mostly during the next forward), ZeRO-3's
// next forward gathers what it reads; elsewhere the working weights follow the master
template <typename floatX>
static void model_update(Model<floatX>* m, const StepConfig* s, float grad_norm) {
    size_t X = sizeof(floatX);
    zero_gathers_done(m);  // the last update's gathers (ZeRO-1, 2): the forward waited for them all
    if (defers_update(m)) { defer_update(m, s, grad_norm); return; }  // the CPU's step, made by the next forward
    if (m->offload_opt) {  // ZeRO-1: the CPU's step and the ranks' exchange, then the weights go up
        HostStep h = host_step_of(m);
        prof_mark(PROF_OPTIMIZER, prof_optimizer(m->num_parameters, m->opt_floats, X), "%s on the host, this rank's blocks",
                  OPTIMIZER_NAMES[m->optimizer]);
        host_update(&h, s, grad_norm);
        prof_close();
        upload_all(m);
        return;
    }
    prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_OPTIMIZER, prof_optimizer(m->num_parameters, m->opt_floats, X), "%s",
                  OPTIMIZER_NAMES[m->optimizer]);
    float clip = s->grad_clip > 0.0f && grad_norm > s->grad_clip ? s->grad_clip / grad_norm : 1.0f;
    if (clip != 1.0f) { scale_cuda(m->grads_memory, clip, m->grad_floats, m->stream); }
    const OptimizerHyper* h = &s->hyper;
    int use_beta1 = h->adafactor.beta1 > 0.0;
    OptSharding z = OPT_UNSHARDED;
    if (zero_shards_state(m->zero)) { z.rank = m->dist.rank; z.world = m->dist.world; }
    z.format = m->state_format;  // each slice's moments in it (small slices fp32): the state's offsets follow
    const ParamSlice* slices = m->slices;
    int ns = param_slice_count(&m->config);
    size_t* state_at = (size_t*)malloc_check((size_t)ns * sizeof(size_t));  // each slice's state in opt_memory
    size_t at = 0;
    for (int k = 0; k < ns; k++) {
        size_t offset;
        OptShard sh = slice_shard(&slices[k], &z, &offset);
        state_at[k] = at;
        at += slice_state_floats(m->optimizer, &sh, use_beta1);
    }
    // what the next forward reads first (the outer slices, layer 0) first: their gather may start while
    // the other layers' update runs (cuda/zero_gather.cuh); each slice's update is its own, so the
    // order changes no bit
    size_t made = 0;  // the working shard's floats already made from the master (ZeRO-3: zero3_first_updated)
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < ns; k++) {
            if ((slice_is_outer(&slices[k]) || slices[k].layer == 0) != (pass == 0)) { continue; }
            size_t offset;
            OptShard sh = slice_shard(&slices[k], &z, &offset);
            size_t n = (size_t)sh.rows * sh.cols;
            float* p = m->zero == ZERO_3 ? m->master_memory + m->shard.shard_block_off[k] : m->master_memory + slices[k].offset + offset;
            const float* g = grad_block(m, k, offset);
            float* st = m->opt_memory + state_at[k];
            if (sh.format != QSTATE_FP32) {  // --optimizer-state bf16, 8bit
                update_lowp_slice(m, k, p, g, st, &sh, h, s->t, offset);
            } else if (m->optimizer == OPT_ADAMW) {
                const AdamWHyper* a = &h->adamw;
                double wd = PARAMETER_IS_MATRIX[slices[k].tensor] ? a->weight_decay : 0.0;
                if (n > 0) {
                    adamw_update_cuda(p, g, st, st + sh.state_units * sh.width, n, (float)a->lr, (float)a->beta1,
                                      (float)a->beta2, (float)a->eps, (float)wd, s->t, m->stream);
                }
            } else if (m->optimizer == OPT_ADAFACTOR) {
                adafactor_update_cuda(p, g, st, &sh, &h->adafactor, s->t, m->opt_scratch, opt_comms(m), m->stream);
            } else {
                came_update_cuda(p, g, st, &sh, &h->came, m->opt_scratch, opt_comms(m), m->stream);
            }
        }
        if (pass == 0) { zero_first_updated(m); made = zero3_first_updated(m); }  // hook: ZeRO (AdamW) gathers them at once
    }
    free(state_at);
    m->lowp_step = m->state_format != QSTATE_FP32 ? s->t : 0;  // its refused moments are read at the next sync (lowp_check_refused)
    if (m->zero == ZERO_3) {  // the shard only: the next forward gathers what it reads (made: the first are on their way)
        print_zero_collectives(m, s->t);
        if (made == 0) { zero3_invalidate(m); }
    } else if (zero_shards_state(m->zero) && m->exchange.comm != NULL) {  // the working weights follow each gather
        prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
        zero_update_done(m);  // the next forward gathers the blocks (cuda/zero_gather.cuh)
        print_zero_collectives(m, s->t);
        return;
    }
    if ((void*)m->weights_memory != (void*)m->master_memory) {
        prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_OPTIMIZER, prof_bytes(m->weight_floats * (4.0 + X)), "working weights from the master");
        copy_to_floatX_cuda(m->weights_memory + made, m->master_memory + made, m->weight_floats - made, m->stream);
    }
    prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
    if (made > 0) { comm_after_compute(m); }  // ZeRO-3: the layers' gathers to come wait for the whole update, not its first part
}

// ZeRO-1, 2 and 3: the NCCL collectives of the gradients and the weights in step 1, counted
// (tests/test_zero_cuda.py bounds them per layer: one each a group, the outer slices' rounds beside;
// ZeRO-3's weight all-gathers: the outer slices' rounds once, each layer for its forward and backward)
template <typename floatX>
static void print_zero_collectives(Model<floatX>* m, int t) {
    if (t == 1 && m->dist.rank == 0) {
        int L = m->config.num_layers;
        printf("ZeRO-%d: step 1: %ld gradient reduce-scatters, %ld weight all-gathers (L = %d, %d outer rounds); "
               "gradients per rank: %zu of %zu floats, pack %zu\n", (int)m->zero, m->exchange.grad_collectives, m->exchange.weight_collectives,
               L, m->shard.num_zero_groups - L, m->grad_floats, m->num_parameters, model_shard_layout(m).pack);
        if (m->zero == ZERO_3) {
            const char* what = m->offload_opt ? (sizeof(floatX) == sizeof(float) ? "fp32 master in host memory, and an fp32 shard on the GPU"
                                                                                  : "fp32 master in host memory, and a bf16 shard on the GPU")
                                              : (sizeof(floatX) == sizeof(float) ? "fp32 master, and the same floats read by the kernels"
                                                                                  : "fp32 master, and a bf16 shard");
            printf("ZeRO-3: weights per rank: shard %zu of %zu floats (%s), working copy %zu\n", m->weight_floats, m->num_parameters,
                   what, model_shard_layout(m).working + layer_weights(&m->config));
        }
    }
    m->exchange.grad_collectives = 0;
    m->exchange.weight_collectives = m->exchange.next_weight_collectives;
    m->exchange.next_weight_collectives = 0;
}

template <typename floatX>
static void model_sync(Model<floatX>* m, SyncDirection dir) {
    size_t P = m->num_parameters;
    offload_update_finish(m);  // --offload optimizer: the last step's update, if the next forward has not made it
    zero_gathers_done(m);  // ZeRO-1, 2: the weights are whole again
    lowp_check_refused(m);
    size_t opt_bytes = m->opt_floats * sizeof(float);  // 0: a model for sampling has no optimizer state
    if (m->offload_opt) {  // the host holds the master weights and the state: the GPU's weights follow them
        if (dir == SYNC_FROM_HOST && offloads_shard(m)) { upload_shard(m); }
        else if (dir == SYNC_FROM_HOST) { upload_all(m); }
    } else if (dir == SYNC_TO_HOST) {  // ZeRO-3: no host copy of the weights (gpt2_params_stream moves them)
        if (m->host_params != NULL) { CUDA_CHECK(cudaMemcpyAsync(m->host_params, m->master_memory, P * sizeof(float), cudaMemcpyDeviceToHost, m->stream)); }
        if (opt_bytes > 0) { CUDA_CHECK(cudaMemcpyAsync(m->host_opt, m->opt_memory, opt_bytes, cudaMemcpyDeviceToHost, m->stream)); }
    } else {
        if (opt_bytes > 0) { CUDA_CHECK(cudaMemcpyAsync(m->opt_memory, m->host_opt, opt_bytes, cudaMemcpyHostToDevice, m->stream)); }
        if (m->host_params == NULL) { WATCHED_WAIT(cudaStreamSynchronize(m->stream), "the model's stream"); return; }
        CUDA_CHECK(cudaMemcpyAsync(m->master_memory, m->host_params, P * sizeof(float), cudaMemcpyHostToDevice, m->stream));
        if ((void*)m->weights_memory != (void*)m->master_memory) {
            copy_to_floatX_cuda(m->weights_memory, m->master_memory, P, m->stream);
        }
    }
    WATCHED_WAIT(cudaStreamSynchronize(m->stream), "the model's stream");
}

// the (Vp) probabilities of a position the head still holds (with --loss-chunk, the last chunk's)
template <typename floatX>
static const float* head_probs(Model<floatX>* m, int position) {
    const GPT2Config* c = &m->config;
    if (m->acts->probs_first < 0 || position < m->acts->probs_first || position >= m->acts->probs_end) {
        fail("gpt2_probs(%d): the last forward's head holds the probabilities of positions %d..%d only (-1: none, after a backward)\n"
             "  hint: with --loss-chunk, ask for a position of the last chunk (sampling: the last position)",
             position, m->acts->probs_first, m->acts->probs_end - 1);
    }
    if (m->tp.size > 1) {  // --tp: the row's Vp/N columns of every rank of the group, gathered whole (every rank asks alike)
        tp_softmax_row_cuda(&m->tp, m->probs, m->acts->logits, m->acts->row_max, m->acts->row_sum, position - m->acts->probs_first, c->vocab_size,
                            c->padded_vocab_size / m->tp.size, m->stream);
    } else {
        softmax_row_cuda(m->probs, m->acts->logits, m->acts->row_max, m->acts->row_sum, position - m->acts->probs_first, c->vocab_size, c->padded_vocab_size,
                         m->stream);
    }
    CUDA_CHECK(cudaMemcpyAsync(m->host_probs, m->probs, (size_t)c->padded_vocab_size * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    WATCHED_WAIT(cudaStreamSynchronize(m->stream), "the model's stream");
    return m->host_probs;
}

// the same on every stage (--pp): the last stage's row, broadcast over the pipeline group (every rank asks alike)
template <typename floatX>
static const float* model_probs(Model<floatX>* m, int position) {
    if (m->pipeline.world == 1) { return head_probs(m, position); }
    int last = m->pipeline.world - 1;
    if (m->pipeline.rank == last) { head_probs(m, position); }
    dist_broadcast_floats_over(m->host_probs, (size_t)m->config.padded_vocab_size, last, m->pipeline);
    return m->host_probs;
}

// ----------------------------------------------------------------------------
// pipeline parallelism (--pp, cuda/pipeline.cuh): a stage's held micro-batches and its messages, as train_gpt.c's

// what --pp does not compose with on the GPU, before anything is allocated (the trainer refuses --sp and
// --zero 3 on both backends)
static void pp_check_setup(const ModelSetup* s) {
    if (s->pipeline.world <= 1) { return; }
    nccl_check_built(&s->pipeline);  // the messages are NCCL's
}

// what the GPU's --pp does not take yet (trainer.h asks before any work, and --plan's search leaves it out)
const char* gpt2_pp_refusal(PpSchedule schedule, ZeroStage zero, int offload_optimizer, int loss_chunk) {
    if (schedule == PP_GPIPE && loss_chunk > 0) {
        return "--pp-schedule gpipe with --loss-chunk: the head's part of the backward, which --loss-chunk makes in the forward, leaves "
               "d(final LayerNorm output) in one buffer until the micro-batch's backward, and GPipe runs the last stage's other forwards in "
               "between (they would replace it)\n"
               "  hint: --pp-schedule 1f1b (the default: its last stage runs each backward right after its forward), or no --loss-chunk";
    }
    if (zero == ZERO_3 && !offload_optimizer) {
        return "--zero 3: the GPU's weight shards reach checkpoints a slice at a time from the data group's devices (model_zero3_stream), "
               "which the stages' stream of the whole model (cpu/pipeline.h) does not take yet (the CPU trainer's does, and the GPU's "
               "with --offload optimizer, whose shards are on the hosts)\n"
               "  hint: --zero 2 with --pp (the optimizer state and the gradients sharded), --zero 3 --offload optimizer, or --pp on the CPU trainer";
    }
    return NULL;
}

// the activations of held micro-batch `slot` in hand for the next forward, backward or message
template <typename floatX>
static void model_pp_slot(Model<floatX>* m, int slot) {
    if (slot < 0 || slot >= m->num_held) { fail("gpt2_pp_slot(%d): the stage holds %d micro-batches (a bug)", slot, m->num_held); }
    m->acts = &m->held[slot];
}

// the (B,T,C) buffer a message reads or fills: the stage input (the embeddings' place), the stage output
// (the last layer's), the gradient of either (the backward's); and where a send from it records its end
template <typename floatX>
static floatX* pp_buffer(Model<floatX>* m, PpOp op) {
    if (op == PP_RECV_ACT) { return m->acts->encoded; }
    if (op == PP_SEND_ACT) { return (floatX*)layer_input(m, m->config.num_layers); }
    return m->dresidual;  // PP_RECV_GRAD, PP_SEND_GRAD
}
template <typename floatX>
static PpSent* pp_sent_of(Model<floatX>* m, PpOp op) { return op == PP_SEND_ACT ? &m->acts->sent : &m->grad_sent; }

// the elements of a message between stages for a forward of (B,T): the residual stream's (B,T,C), with --sp
// this rank's R = B T / N rows of it (each tensor place's pipeline group passes its own rows; train_gpt.c's)
template <typename floatX>
static size_t pp_message_elems(const Model<floatX>* m, int B, int T) { return tp_rows_cuda(&m->tp, (size_t)B * T) * m->config.channels; }

// a message of the stage's list over the pipeline's communicator, each in its micro-batch's slot: a receive,
// a send, or (next) a send and the receive after it as one exchange
template <typename floatX>
static void model_pp_message(Model<floatX>* m, PpAction a, const PpAction* next, int slots) {
    int stage = m->pipeline.rank, to = -1, from = -1;
    size_t n = pp_message_elems(m, m->batch_size, m->seq_len);
    const floatX* out = NULL;
    floatX* in = NULL;
    PpSent* sent = NULL;
    model_pp_slot(m, pp_act_slot(a.micro, slots));
    if (pp_is_send(a.op)) {
        out = pp_buffer(m, a.op);
        to = stage + pp_peer_offset(a.op);
        sent = pp_sent_of(m, a.op);
    }
    const PpAction* r = pp_is_recv(a.op) ? &a : next;
    if (r != NULL) {
        model_pp_slot(m, pp_act_slot(r->micro, slots));
        in = pp_buffer(m, r->op);
        from = stage + pp_peer_offset(r->op);
    }
    char what[PROF_NAME_LEN];
    snprintf(what, sizeof(what), "%s%s%s", PP_OP_NAMES[a.op], next != NULL ? ", " : "", next != NULL ? PP_OP_NAMES[next->op] : "");
    pp_message_cuda(&m->pp, out, to, sent, in, from, n, nccl_type<floatX>(), m->stream, what);
}

// --pp: validation's and a sample's forward (no backward follows) through the stages in turn: each its
// layers in held set 0, the activations passed on; the loss the last stage's, to every stage
template <typename floatX>
static float model_forward_stages(Model<floatX>* m, const int* inputs, const int* targets, int B, int T) {
    if (m->pipeline.world == 1) { return model_forward(m, inputs, targets, B, T, 0.0f); }
    int stage = m->pipeline.rank, last = m->pipeline.world - 1;
    int N = m->tp.size, Tsplit = m->tp.gathered != NULL && (size_t)B * T % (size_t)N != 0 && targets == NULL ? (T + N - 1) / N * N : T;
    size_t n = pp_message_elems(m, B, Tsplit);  // --sp: model_forward_padded's T
    model_pp_slot(m, 0);
    if (stage > 0) {
        pp_message_cuda(&m->pp, NULL, -1, NULL, m->acts->encoded, stage - 1, n, nccl_type<floatX>(), m->stream, PP_OP_NAMES[PP_RECV_ACT]);
    }
    float loss = model_forward(m, inputs, targets, B, T, 0.0f);
    if (stage < last) {
        pp_message_cuda(&m->pp, layer_input(m, m->config.num_layers), stage + 1, &m->acts->sent, NULL, -1, n, nccl_type<floatX>(), m->stream,
                        PP_OP_NAMES[PP_SEND_ACT]);
    }
    dist_broadcast_floats_over(&loss, 1, last, m->pipeline);
    return loss;
}

// ----------------------------------------------------------------------------
// the backend interface (llmc/trainer.h): each call goes to the model of the run's precision

const char* gpt2_backend_name(void) { return "the CUDA backend (train_gpt_cu)"; }
int gpt2_zero_max_stage(void) { return ZERO_3; }
// --tp: any group whose ranks take whole heads (trainer.h checks), over an NCCL communicator per group
int gpt2_tp_max(void) { return INT_MAX; }

#ifdef CUDA_EMU
int gpt2_device_is_modelled(void) { return !emu_device_executes(); }
#else
int gpt2_device_is_modelled(void) { return 0; }
#endif

// free GPU memory at the first call, before any tensor: what gpt2_device_bytes_used counts from
static size_t g_free_at_start = 0;

size_t gpt2_device_free_bytes(void) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) { cudaGetLastError(); return 0; }  // gpt2_create says so
    size_t free_bytes, total;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    if (g_free_at_start == 0) { g_free_at_start = free_bytes; }
    return free_bytes;
}

size_t gpt2_device_bytes_used(size_t* accounted) {
    size_t free_bytes, total;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    *accounted = mem_live_bytes_from(&MEM_DEVICE);
    return g_free_at_start > free_bytes ? g_free_at_start - free_bytes : 0;
}

// dense peak FLOP/s per GPU model (NVIDIA's data sheets): bf16 on the tensor cores, fp32 without
// TF32 (this backend's fp32 GEMMs accumulate and multiply in full fp32), and the memory's
// bandwidth. Unknown GPUs: --peak-tflops
typedef struct { const char* name; double bf16, fp32, memory_bw; } GPUPeak;
static const GPUPeak GPU_PEAKS[] = {
    {"H100 PCIe", 756e12, 51e12, 2.0e12},
    {"H100", 989e12, 67e12, 3.35e12},   // SXM and NVL ("H100 80GB HBM3")
    {"H200", 989e12, 67e12, 4.8e12},
    {"A100", 312e12, 19.5e12, 2.0e12},
    {"L40S", 362e12, 91.6e12, 0.864e12},
    {"A10", 125e12, 31.2e12, 0.6e12},
};
#define NUM_GPU_PEAKS ((int)(sizeof(GPU_PEAKS) / sizeof(GPU_PEAKS[0])))

// the row of GPU_PEAKS whose name is in the device's name (the first: "H100 PCIe" before "H100"),
// NULL for none; name: the device's, "" without a GPU
static const GPUPeak* gpu_peak_row(char* name, size_t n) {
    name[0] = '\0';
    int device;
    if (cudaGetDevice(&device) != cudaSuccess) { cudaGetLastError(); return NULL; }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) { cudaGetLastError(); return NULL; }
    snprintf(name, n, "%s", prop.name);
    for (int i = 0; i < NUM_GPU_PEAKS; i++) {
        if (strstr(prop.name, GPU_PEAKS[i].name) != NULL) { return &GPU_PEAKS[i]; }
    }
    return NULL;
}

double gpt2_peak_flops(Precision p) {
    char name[256];
    const GPUPeak* row = gpu_peak_row(name, sizeof(name));
    if (row != NULL) { return p == PRECISION_BF16 ? row->bf16 : row->fp32; }
    if (name[0] != '\0') { printf("note: no peak FLOP/s known for '%s': the progress line shows no MFU (give one with --peak-tflops)\n", name); }
    return 0.0;
}

int gpt2_has_device(void) { return 1; }

// the step-cost model's rates (planner.h): the GPU's peak and memory bandwidth from GPU_PEAKS,
// or an H100's where no GPU of the table is found (no GPU, the emulator); pinned copies to and
// from the host on PCIe 4.0 x16 (about 25 of its 32 GB/s; PCIe 5.0 doubles it); the CPU's update
// of --offload optimizer at one GPU's share of a node's host memory bandwidth (eight GPUs on two
// sockets of DDR5, about 400 GB/s in all); NCCL's all-reduce bus bandwidth of one 400 Gb/s
// InfiniBand link per GPU between machines (NVLink in one is faster)
#define COST_DEFAULT_GPU "H100"
#define PCIE_BW 25e9
#define HOST_MEMORY_BW_PER_GPU 50e9
#define GPU_LINK_BW 50e9
CostModel gpt2_cost_model(Precision p) {
    char name[256];
    const GPUPeak* row = gpu_peak_row(name, sizeof(name));
    const char* which = "this GPU";
    if (row == NULL) {
        for (int i = 0; i < NUM_GPU_PEAKS; i++) {
            if (strcmp(GPU_PEAKS[i].name, COST_DEFAULT_GPU) == 0) { row = &GPU_PEAKS[i]; }
        }
        which = "an " COST_DEFAULT_GPU " (no GPU of the table here)";
    }
    double peak = p == PRECISION_BF16 ? row->bf16 : row->fp32;
    CostModel m = {.flops = COST_ASSUMED_MFU * peak, .memory_bw = row->memory_bw, .host_bw = PCIE_BW,
                   .host_memory_bw = HOST_MEMORY_BW_PER_GPU, .link_bw = GPU_LINK_BW,
                   .flops_note = "", .memory_note = "", .host_note = "", .host_memory_note = "", .link_note = ""};
    snprintf(m.flops_note, sizeof(m.flops_note), "%.0f%% of the %s peak %.0f TFLOP/s of %s", 100.0 * COST_ASSUMED_MFU,
             PRECISION_NAMES[p], peak / 1e12, which);
    snprintf(m.memory_note, sizeof(m.memory_note), "the memory of %s", which);
    snprintf(m.host_note, sizeof(m.host_note), "pinned copies on PCIe 4.0 x16");
    snprintf(m.host_memory_note, sizeof(m.host_memory_note), "a GPU's share of a node's host memory, 8 GPUs");
    snprintf(m.link_note, sizeof(m.link_note), "NCCL over one 400 Gb/s InfiniBand link per GPU");
    return m;
}
Precision gpt2_default_precision(void) { return PRECISION_BF16; }

// what the GPU does not do stops here, before anything is allocated: several ranks in a build
// without NCCL (cuda/nccl.cuh), unless the optimizer step runs on the host on whole gradients
// (--offload optimizer below ZeRO-2: the ranks add them over MPI there); ",gradients" under ZeRO-2
// and 3; every other setup the shared checks let through runs
void gpt2_check_setup(const ModelSetup* s) {
    if (!s->offload_optimizer || zero_shards_grads(s->zero)) { nccl_check_built(&s->dist); }
    nccl_check_built(&s->tensor);  // --tp: the group's sums in every layer are NCCL's
    pp_check_setup(s);
    if (s->offload_optimizer == OPT_OFFLOAD_GRADS && zero_shards_grads(s->zero)) {
        fail("--zero %d with --offload optimizer,gradients: under ZeRO-2 and 3 the GPU keeps only its 1/N shard of the reduced "
             "gradients (NCCL reduce-scatters every micro-step's into it) and the host takes that shard once a step; \",gradients\" "
             "would send every micro-step's whole gradients to the host instead\n"
             "  hint: --zero %d --offload optimizer (each rank offloads its shard), or --zero 1 --offload optimizer,gradients",
             (int)s->zero, (int)s->zero);
    }
}

// srun or torchrun-style variables without MPI: NCCL carries the host's collectives too (cuda/nccl.cuh)
void gpt2_dist_start(Dist* d, const char* method) { nccl_start_by_env(d, method); }

// the GPU of this rank: the node-local rank's (mpirun -np N on one machine of N GPUs, or many)
void gpt2_select_device(const Dist* d) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) { cudaGetLastError(); return; }  // gpt2_create says so
    int local = dist_local_rank(), here = dist_local_ranks();
    if (here > devices) {
        fail("%d ranks run on this machine but it has %d GPU(s): each rank needs a GPU of its own\n"
             "  hint: mpirun -np %d per machine of %d GPUs (a hostfile spreads more ranks over more machines)",
             here, devices, devices, devices);
    }
    CUDA_CHECK(cudaSetDevice(local));
    (void)d;
}

// flash attention for heads of hs channels (cuda/flash_attention.cuh), the default where it runs
const char* gpt2_flash_refusal(int head_size) { return flash_attention_refusal(head_size); }
int gpt2_prefers_flash(void) { return 1; }

// the GPU's tensors in bytes, for the memory planner; c: the whole model, or with --tp (c->tp = N > 1) a
// rank's slices, whose blocks hold NH/N heads and 4C/N hidden units and whose logits are Vp/N columns;
// with --sp (act->sp) the residual stream and the LayerNorms a rank's B T/N rows, and one (B,T,C) buffer
// where they meet. The formulas are the whole model's (the table's bytes are a rank's)
BackendLayout gpt2_layout(const GPT2Config* c, int B, int T, Precision precision, const ActPolicy* act) {
    int C = c->channels, NH = c->num_heads, N = gpt2_tp(c), flash = act->flash, loss_chunk = act->loss_chunk, sp = act->sp;
    size_t X = precision_bytes(precision), F = sizeof(float), BT = (size_t)B * T;
    // keeping everything, and what selective recompute of the GELU and (not with flash) the attention drops
    const ActPolicy all = {.segment = 0, .gelu = 0, .attn = flash, .offload = 0, .flash = flash, .loss_chunk = loss_chunk, .sp = sp};
    const ActPolicy gelu = {.segment = 0, .gelu = 1, .attn = flash, .offload = 0, .flash = flash, .loss_chunk = 0, .sp = sp};
    const ActPolicy attn = {.segment = 0, .gelu = 0, .attn = 1, .offload = 0, .flash = flash, .loss_chunk = 0, .sp = sp};
    size_t layer = layer_block_bytes(B, T, C, NH, N, X, &all);
    size_t hs[NUM_HEAD_ACTS], head = 0, bs[NUM_BACKWARD_BUFFERS], backward = 0;
    int K = act_head_rows(&all, BT);
    head_act_bytes(hs, B, T, K, C, c->padded_vocab_size / N, X);
    for (int i = 0; i < NUM_HEAD_ACTS && stage_has_head(c); i++) { head += hs[i]; }  // --pp: the last stage's
    backward_buffer_bytes(bs, B, T, C, NH, N, X, &all);
    for (int i = 0; i < NUM_BACKWARD_BUFFERS; i++) { backward += bs[i]; }
    ScratchBytes sb = scratch_bytes(c, B, T, X, &all);
    size_t host_scratch = ((size_t)c->padded_vocab_size + BT) * F;  // host: a row of probabilities, the losses
    // [--tp: 0 none, 1 --tp, 2 --tp --sp][bf16][flash]: a layer's block, and backward's buffers (no dfch_gelu:
    // 9BTC where the CPU has 13)
    static const char* const LAYER_FORMULA[3][2][2] = {
        {{"4(16BTC + 4BT + B NH T^2)", "4(16BTC + 4BT + B NH T)"}, {"2(16BTC + B NH T^2) + 4(4BT)", "2(16BTC) + 4(4BT + B NH T)"}},
        {{"4(4BTC + 12BTC/N + 4BT + B NH T^2/N)", "4(4BTC + 12BTC/N + 4BT + B NH T/N)"},
         {"2(4BTC + 12BTC/N + B NH T^2/N) + 4(4BT)", "2(4BTC + 12BTC/N) + 4(4BT + B NH T/N)"}},
        {{"4(16BTC + 4BT + B NH T^2)/N", "4(16BTC + 4BT + B NH T)/N"}, {"2(16BTC + B NH T^2)/N + 4(4BT/N)", "2(16BTC)/N + 4(4BT + B NH T)/N"}},
    };
    static const char* const BACKWARD_FORMULA[3][2][2] = {
        {{"4(9BTC + B NH T^2)", "4(9BTC)"}, {"2(9BTC + B NH T^2)", "2(9BTC)"}},
        {{"4(2BTC + 7BTC/N + B NH T^2/N)", "4(2BTC + 7BTC/N)"}, {"2(2BTC + 7BTC/N + B NH T^2/N)", "2(2BTC + 7BTC/N)"}},
        {{"4(BTC + 8BTC/N + B NH T^2/N)", "4(BTC + 8BTC/N)"}, {"2(BTC + 8BTC/N + B NH T^2/N)", "2(BTC + 8BTC/N)"}},
    };
    int mode = N == 1 ? 0 : sp ? 2 : 1, bf16 = precision == PRECISION_BF16;
    BackendLayout l = {
        .param_bytes = precision == PRECISION_BF16 ? F + X : F,  // the fp32 master and the bf16 working copy
        .grad_bytes = F,
        .layer = layer,
        .layer_gelu = layer - layer_block_bytes(B, T, C, NH, N, X, &gelu),
        .layer_att = layer - layer_block_bytes(B, T, C, NH, N, X, &attn),
        .residual = align_up(act_residual_rows(&all, BT, N) * C * X),
        .head = head,
        .backward = backward,
        .layer_formula = LAYER_FORMULA[mode][bf16][flash],
        .backward_formula = BACKWARD_FORMULA[mode][bf16][flash],
        .backend_scratch = scratch_total(&sb) + host_scratch,
        .sp_gathered = sp_gathered_bytes(B, T, C, X, &all),
        .host_copy_bytes = F,
        .host_copies_opt = 1,
        .working_bytes = X,
        .head_formula = N > 1 ? (precision == PRECISION_BF16 ? "2K(C + Vp/N) + 4(3BT + 2K)" : "4(K(C + Vp/N) + 3BT + 2K)")
                              : (precision == PRECISION_BF16 ? "2K(C + Vp) + 4(3BT + 2K)" : "4(K(C + Vp) + 3BT + 2K)"),
        .head_rows = K,
        .zero3_prefetch = 1,
        .lowp_staging = 1,
    };
    return l;
}

GPT2* gpt2_create(const ModelSetup* s) {
    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0) {
        fail("no CUDA GPU: %s\n  hint: check nvidia-smi and CUDA_VISIBLE_DEVICES, or train on the CPU with ./train_gpt",
             e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
    }
    use_device_memory();
    GPT2* m = (GPT2*)malloc_check(sizeof(GPT2));
    memset(m, 0, sizeof(*m));
    m->precision = s->precision;
    if (s->precision == PRECISION_BF16) { m->bf16 = model_create<__nv_bfloat16>(s); } else { m->f32 = model_create<float>(s); }
    return m;
}

void gpt2_destroy(GPT2* m) {
    // the last update's refused moments, when nothing after it read them (no checkpoint, no next step)
    if (m->bf16) { lowp_check_refused(m->bf16); } else { lowp_check_refused(m->f32); }
    if (m->bf16) { model_destroy(m->bf16); } else { model_destroy(m->f32); }
    free(m);
}

HostView gpt2_host_view(GPT2* m) {
    HostView h;
    if (m->bf16) { offload_update_finish(m->bf16); } else { offload_update_finish(m->f32); }  // the state the view shows is the last step's
    if (m->bf16) { HostView v = {m->bf16->host_opt, m->bf16->opt_floats}; h = v; }
    else { HostView v = {m->f32->host_opt, m->f32->opt_floats}; h = v; }
    return h;
}

// ZeRO-3's weights for checkpoints, a slice at a time in model_config.h's order (wte's padded rows,
// which no slice holds, go by as zeros): for a read each slice's fp32 master blocks are all-gathered
// into the gradients' working buffer (idle between steps; left zero again) and the slice copied to
// the pinned staging buffer; for a write each rank keeps its block of each slice fn fills, in the
// master shard, and then the working shard follows. The gathered copies are stale after either
template <typename floatX>
static void model_zero3_stream(Model<floatX>* m, ParamsAccess how, ParamChunkFn fn, void* ctx) {
    const GPT2Config* c = &m->config;
    int rank = m->dist.rank, world = m->dist.world;
    float* staging = m->zero3.ckpt_staging;
    WeightRun* runs = (WeightRun*)malloc_check((size_t)(param_slice_count(c) + 1) * sizeof(WeightRun));
    int n = weight_runs(c, m->slices, runs);
    if (m->exchange.comm != NULL) {  // the comm stream's collectives first (the gathers the update queued: zero3_first_updated):
        CUDA_CHECK(cudaEventRecord(m->exchange.reduced, m->exchange.comm_stream));  // one communicator, one collective at a time
        CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->exchange.reduced, 0));
    }
    prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_COLLECTIVE, prof_bytes(m->num_parameters * sizeof(float)),
                  "ZeRO-3: the weights slice by slice, %s", how == PARAMS_WRITE ? "each rank's blocks kept" : "gathered");
    for (int i = 0; i < n; i++) {
        WeightRun r = runs[i];
        if (r.slice < 0) {  // wte's padded rows
            memset(staging, 0, r.n * sizeof(float));
            fn(ctx, r.offset, staging, r.n);
            continue;
        }
        const ParamSlice* sl = &m->slices[r.slice];
        size_t len = r.n;
        float* mine = m->master_memory + m->shard.shard_block_off[r.slice];
        if (how == PARAMS_WRITE) {
            fn(ctx, r.offset, staging, len);
            int begin, end, width = slice_unit_width(sl);
            slice_range(sl, rank, world, m->state_format, &begin, &end);
            CUDA_CHECK(cudaMemcpyAsync(mine, staging + (size_t)begin * width, (size_t)(end - begin) * width * sizeof(float),
                                       cudaMemcpyHostToDevice, m->stream));
        } else {  // the ranks' padded blocks one after another: the slice, then the padding
            NCCL_CHECK(ncclAllGather(mine, m->shard.grad_working, slice_block_floats_as(sl, world, m->state_format), ncclFloat, m->exchange.comm,
                                     m->stream));
            CUDA_CHECK(cudaMemcpyAsync(staging, m->shard.grad_working, len * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
        }
        WATCHED_WAIT(cudaStreamSynchronize(m->stream), "the model's stream");  // staging is free (write) or filled (read)
        if (how != PARAMS_WRITE) { fn(ctx, r.offset, staging, len); }
    }
    free(runs);
    if (how == PARAMS_WRITE && (void*)m->weights_memory != (void*)m->master_memory) {
        copy_to_floatX_cuda(m->weights_memory, m->master_memory, m->weight_floats, m->stream);
    }
    if (how != PARAMS_WRITE) {
        CUDA_CHECK(cudaMemsetAsync(m->shard.grad_working, 0, model_shard_layout(m).working * sizeof(float), m->stream));
    }
    prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
    WATCHED_WAIT(cudaStreamSynchronize(m->stream), "the model's stream");
    zero3_invalidate(m);
}

// the weights through their whole host copy (host_params): one chunk, brought up to date before a
// read, sent up after a write (with the optimizer state's host copy, as gpt2_sync does); with --pp the
// stage's host copy through cpu/pipeline.h's stream of the whole model. ZeRO-3 and the offloaded shard
// have no whole copy (the shard's master is host memory: the CPU backend's ZeRO-3 walk, gathered over
// the ranks on the host): a slice at a time
template <typename floatX>
static void model_params_stream_rank(Model<floatX>* m, ParamsAccess how, ParamChunkFn fn, void* ctx) {
    offload_update_finish(m);
    if (offloads_shard(m)) {  // the host's master shard, a slice at a time (cpu/host_step.h; --pp: through the stages' stream)
        HostStep h = host_step_of(m);
        if (m->pipeline.world > 1) {
            PpModel p = {.whole = &m->whole, .stage = &m->config, .params = NULL, .pipeline = m->pipeline, .tensor = m->tensor,
                         .staging = m->pp_staging, .tp_staging = m->tp_staging, .zero3 = &h, .zero3_staging = m->zero3.ckpt_staging};
            pp_params_stream(&p, how == PARAMS_WRITE, fn, ctx);
        } else {
            host_zero3_stream(&h, how == PARAMS_WRITE, m->zero3.ckpt_staging, fn, ctx);
        }
        if (how == PARAMS_WRITE) { model_sync(m, SYNC_FROM_HOST); }
        return;
    }
    if (m->zero == ZERO_3 && m->host_params == NULL) { model_zero3_stream(m, how, fn, ctx); return; }
    if (how == PARAMS_READ) { model_sync(m, SYNC_TO_HOST); }
    if (m->pipeline.world > 1) {  // --pp: the stages' parts in the whole model's order (cpu/pipeline.h; with --tp through the groups' slices)
        PpModel p = {.whole = &m->whole, .stage = &m->config, .params = m->host_params, .pipeline = m->pipeline, .tensor = m->tensor,
                     .staging = m->pp_staging, .tp_staging = m->tp_staging, .zero3 = NULL, .zero3_staging = NULL};
        pp_params_stream(&p, how == PARAMS_WRITE, fn, ctx);
    } else {
        fn(ctx, 0, m->host_params, m->num_parameters);
    }
    if (how == PARAMS_WRITE) { model_sync(m, SYNC_FROM_HOST); }
}

// the same with --tp: the whole model's weights through the group's slices (cpu/tensor_parallel.h's
// stream over this rank's host copies: a split tensor's layer gathered whole into tp_staging, or each
// rank's rows broadcast over the group, for a read; a write keeps this rank's part of each)
template <typename floatX>
static void model_params_stream(Model<floatX>* m, ParamsAccess how, ParamChunkFn fn, void* ctx) {
    if (m->tp.size == 1 || m->pipeline.world > 1) { model_params_stream_rank(m, how, fn, ctx); return; }  // --pp: its stream has --tp's
    TpStream t;
    tp_stream_begin(&t, &m->config, m->tensor, m->tp_staging, how == PARAMS_WRITE, fn, ctx);
    model_params_stream_rank(m, how, tp_stream_chunk, &t);
    tp_stream_end(&t);
}

void gpt2_params_stream(GPT2* m, ParamsAccess how, ParamChunkFn fn, void* ctx) {
    if (m->bf16) { model_params_stream(m->bf16, how, fn, ctx); } else { model_params_stream(m->f32, how, fn, ctx); }
}

void gpt2_sync(GPT2* m, SyncDirection dir) {
    if (m->bf16) { model_sync(m->bf16, dir); } else { model_sync(m->f32, dir); }
}

float gpt2_forward(GPT2* m, const int* inputs, const int* targets, int B, int T) {
    return m->bf16 ? model_forward_stages(m->bf16, inputs, targets, B, T) : model_forward_stages(m->f32, inputs, targets, B, T);
}

float gpt2_forward_train(GPT2* m, const int* inputs, const int* targets, int B, int T, float loss_scale) {
    if (m->bf16) { return model_forward(m->bf16, inputs, targets, B, T, m->bf16->act.loss_chunk > 0 ? loss_scale : 0.0f); }
    return model_forward(m->f32, inputs, targets, B, T, m->f32->act.loss_chunk > 0 ? loss_scale : 0.0f);
}

const float* gpt2_probs(GPT2* m, int position) {
    return m->bf16 ? model_probs(m->bf16, position) : model_probs(m->f32, position);
}

// --offload optimizer: the next backward's gradients replace the host's (no pass over them)
template <typename floatX>
static void model_zero_grad(Model<floatX>* m) {
    if (m->offload_opt == OPT_OFFLOAD_GRADS) { m->opt_offload.first_micro_step = 1; return; }
    size_t n = m->grad_floats;  // ZeRO-2: the shard (the working buffer is zero already)
    prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_ZEROING, prof_bytes(n * sizeof(float)), "gradients");
    CUDA_CHECK(cudaMemsetAsync(m->grads_memory, 0, n * sizeof(float), m->stream));
    prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
}

void gpt2_zero_grad(GPT2* m) {
    if (m->bf16) { model_zero_grad(m->bf16); } else { model_zero_grad(m->f32); }
}

void gpt2_backward(GPT2* m, const int* inputs, const int* targets, int B, int T, float loss_scale) {
    // targets: on the GPU since the forward (--pp: again if a stage's later forward replaced them); the
    // inputs group dwte's positions by token (encoder.cuh)
    if (m->bf16) { model_backward(m->bf16, inputs, targets, B, T, loss_scale); } else { model_backward(m->f32, inputs, targets, B, T, loss_scale); }
}

double gpt2_copy_wait_ms(GPT2* m) {
    if (m->bf16) { return m->bf16->offload.wait_marks != NULL ? copy_wait_ms(m->bf16) : -1.0; }
    return m->f32->offload.wait_marks != NULL ? copy_wait_ms(m->f32) : -1.0;
}

// the next backward is the step's last: its gradients are reduced (NCCL) or sent to the host as
// each layer's are final (the offloaded shard's come down after the backward, all at once)
template <typename floatX>
static void model_reduce_during_backward(Model<floatX>* m) {
    m->exchange.reduce_in_backward = m->exchange.comm != NULL;
    m->opt_offload.send_in_backward = m->offload_opt == OPT_OFFLOAD_STATE && !offloads_shard(m);
}

void gpt2_reduce_during_backward(GPT2* m) {
    if (m->bf16) { model_reduce_during_backward(m->bf16); } else { model_reduce_during_backward(m->f32); }
}

void gpt2_reduce_grads(GPT2* m) {
    if (m->bf16) { model_reduce_grads(m->bf16); pp_reduce_pair(m->bf16); } else { model_reduce_grads(m->f32); pp_reduce_pair(m->f32); }
}

float gpt2_grad_norm(GPT2* m) { return m->bf16 ? model_grad_norm(m->bf16) : model_grad_norm(m->f32); }

void gpt2_update(GPT2* m, const StepConfig* s, float grad_norm) {
    if (m->bf16) { model_update(m->bf16, s, grad_norm); } else { model_update(m->f32, s, grad_norm); }
}

// --profile: the device idle before the step, so that its time is its own; after it, every
// stream's ranges closed and their events' times into the table (cuda/profile.cuh)
void gpt2_profile_begin(GPT2* m) {
    (void)m;
    WATCHED_WAIT(cudaDeviceSynchronize(), "the device");
}
void gpt2_profile_end(GPT2* m) {
    (void)m;
    WATCHED_WAIT(cudaDeviceSynchronize(), "the device");
    prof_gpu_collect();
}
const char* gpt2_profile_timing(void) { return prof_gpu_timing(); }
// the GPU's limits are not measured (the timeline of the emulated device models them): no roof column
ProfRoofline gpt2_profile_roofline(void) { ProfRoofline none = {.gb_s = 0.0, .gflop_s = 0.0, .how = ""}; return none; }

// --pp: any number of stages up to the layers (trainer.h checks), over an NCCL communicator per pipeline group
int gpt2_pp_max(void) { return INT_MAX; }
void gpt2_pp_slot(GPT2* m, int slot) { if (m->bf16) { model_pp_slot(m->bf16, slot); } else { model_pp_slot(m->f32, slot); } }
void gpt2_pp_message(GPT2* m, PpAction a, const PpAction* next, int slots) {
    if (m->bf16) { model_pp_message(m->bf16, a, next, slots); } else { model_pp_message(m->f32, a, next, slots); }
}

int main(int argc, char** argv) {
    return train_main(argc, argv);
}
