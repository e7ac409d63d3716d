/*
train_gpt.c: GPT-2 training on the CPU, fp32, C11 + OpenMP: the CPU model and the
CPU backend of the one training program (llmc/trainer.h). The reference path: every
other path of the project (the memory-saving flags, the CUDA backend) is tested
against what this file computes.

Reading order: the model's tensors (parameters, activations, backward buffers) and
their sizes (which the memory planner reads), allocation, one transformer block
forward and backward, the whole model forward and backward (with the activation
policy of --recompute and --offload: llmc/act_policy.h), the gradient exchange
between MPI ranks and the optimizer step (--zero), and the host view that
checkpoints read. The layers are in cpu/layers.h, the optimizers in
cpu/optimizers.h; the loop, flags, files and memory accounting are shared (llmc/).

    make train_gpt && ./train_gpt             # d6 on TinyShakespeare (make run prepares the data)
    ./train_gpt -e d12 -b 4 -t 64             # GPT-2 124M
    ./train_gpt --plan -e d48 -b 8 -t 1024 --optimizer adafactor --recompute sqrt
    mpirun -np 2 ./train_gpt -e d12 --zero 1  # data parallel, optimizer state sharded
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/trainer.h"
#include "cpu/layers.h"
#include "cpu/optimizers.h"
#include "cpu/host_step.h"
#include "cpu/roofline.h"     // --profile's roof column: this machine's bandwidth and GEMM rate

// ----------------------------------------------------------------------------
// parameters: 16 tensors carved from one allocation, in checkpoint order

typedef struct {
    float* wte;      // (Vp, C) token embedding, also the classifier (tied)
    float* wpe;      // (maxT, C) position embedding
    float* ln1w;     // (L, C)
    float* ln1b;     // (L, C)
    float* qkvw;     // (L, 3C, C)
    float* qkvb;     // (L, 3C)
    float* attprojw; // (L, C, C)
    float* attprojb; // (L, C)
    float* ln2w;     // (L, C)
    float* ln2b;     // (L, C)
    float* fcw;      // (L, 4C, C)
    float* fcb;      // (L, 4C)
    float* fcprojw;  // (L, C, 4C)
    float* fcprojb;  // (L, C)
    float* lnfw;     // (C)
    float* lnfb;     // (C)
} ParameterTensors;

// points the 16 tensors of p into memory, in model_config.h's order
static void point_parameters(ParameterTensors* p, float* memory, const GPT2Config* cfg) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(sizes, cfg);
    float** ptrs[NUM_PARAMETER_TENSORS] = {
        &p->wte, &p->wpe, &p->ln1w, &p->ln1b, &p->qkvw, &p->qkvb, &p->attprojw, &p->attprojb,
        &p->ln2w, &p->ln2b, &p->fcw, &p->fcb, &p->fcprojw, &p->fcprojb, &p->lnfw, &p->lnfb,
    };
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { *ptrs[i] = memory; memory += sizes[i]; }
}

// one layer's slice of the per-layer tensors
typedef struct {
    const float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} LayerParams;
typedef struct {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} LayerGrads;

static LayerParams layer_params(const ParameterTensors* p, int l, int C) {
    size_t c = C;
    LayerParams lp = {
        p->ln1w + l * c, p->ln1b + l * c, p->qkvw + l * 3 * c * c, p->qkvb + l * 3 * c,
        p->attprojw + l * c * c, p->attprojb + l * c, p->ln2w + l * c, p->ln2b + l * c,
        p->fcw + l * 4 * c * c, p->fcb + l * 4 * c, p->fcprojw + l * 4 * c * c, p->fcprojb + l * c,
    };
    return lp;
}
static LayerGrads layer_grads(const ParameterTensors* g, int l, int C) {
    LayerParams lp = layer_params(g, l, C);  // same offsets, writable memory
    LayerGrads lg;
    memcpy(&lg, &lp, sizeof(lg));
    return lg;
}

// ----------------------------------------------------------------------------
// activations: what forward keeps for backward. Each layer's tensors are one
// contiguous block, so a layer moves (offload) or is recomputed as a unit.

typedef struct {
    float* ln1;        // (B,T,C)  LayerNorm 1 output
    float* ln1_mean;   // (B,T)
    float* ln1_rstd;   // (B,T)
    float* qkv;        // (B,T,3C) query, key, value
    float* atty;       // (B,T,C)  attention output, heads concatenated
    float* att;        // (B,NH,T,T) attention weights (softmax output); --recompute attn: shared;
                       // --attention flash: (B,NH,T) the rows' log-sum-exp
    float* residual2;  // (B,T,C)  residual stream after attention
    float* ln2;        // (B,T,C)
    float* ln2_mean;   // (B,T)
    float* ln2_rstd;   // (B,T)
    float* fch;        // (B,T,4C) MLP hidden, before GELU
    float* fch_gelu;   // (B,T,4C) after GELU; --recompute gelu: shared
    float* residual3;  // (B,T,C)  block output = next block's input
} LayerActs;

// points a's tensors into memory (act_policy.h's table of their sizes: all fp32 here); returns
// the block's floats
static size_t point_layer_acts(LayerActs* a, float* memory, int B, int T, int C, int NH, const ActPolicy* pol) {
    size_t s[NUM_LAYER_ACTS], total = 0;
    layer_act_elems(s, B, T, C, NH, pol);
    float** ptrs[NUM_LAYER_ACTS] = {
        &a->ln1, &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->atty, &a->att, &a->residual2,
        &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fch, &a->fch_gelu, &a->residual3,
    };
    for (int i = 0; i < NUM_LAYER_ACTS; i++) { *ptrs[i] = memory + total; total += s[i]; }
    return total;
}

// Where the activations live (llmc/act_policy.h): layer l computes into the working-set
// buffer slots[l % slots]. Plain training has a slot per layer; checkpointing (segments of
// k layers) has k slots and keeps each segment's input; offload moves the kept tensors to
// the host store (host_layers or the segment inputs) and back.
typedef struct {
    float* encoded;      // (B,T,C) embeddings = input of layer 0 (and of segment 0)
    LayerActs* slots;    // [act_num_slots] the working set of layer blocks
    int* slot_layer;     // [act_num_slots] the layer each slot holds now (offload), -1 none
    size_t layer_floats; // one layer block
    float* gelu_shared;  // (B,T,4C) --recompute gelu: the one GELU output buffer, else NULL
    float* att_shared;   // (B,NH,T,T) --recompute attn (not flash): the one attention-weight buffer, else NULL
    float** seg_inputs;  // [segments] checkpointing: each segment's input; [0] = encoded, the
                         // others in device memory, or in the host store with offload
    float* staging;      // (B,T,C) checkpointing + offload: the segment input back from the host
    float* host_layers;  // (L, layer_floats) offload without checkpointing: every layer's block
    // the head, K = head_rows tokens at a time: K = B*T, or with --loss-chunk a chunk (act_policy.h)
    float* lnf;          // (K,C) final LayerNorm output
    float* lnf_mean;     // (B,T)
    float* lnf_rstd;     // (B,T)
    float* probs;        // (K,Vp) the logits, turned in place into probabilities (what forward
                         // leaves), which backward (--loss-chunk: forward) turns in place into the logits' gradient
    float* losses;       // (B,T) per-position cross-entropy
    int head_rows;       // K
    int probs_first, probs_end;  // the positions whose probabilities probs holds after the last forward
                                 // (first..end-1); first = -1: none
    float head_grad_scale;  // --loss-chunk: the loss_scale of the head's gradients the last forward computed, 0 none
} ActivationTensors;

// backward's working set: one layer's worth, reused by every layer
typedef struct {
    float* dresidual;   // (B,T,C) gradient of the residual stream at the current layer boundary
    float* dbtc;        // (B,T,C) temporary: d(ln2), then d(atty), then d(ln1)
    float* dqkv;        // (B,T,3C)
    float* dfch_gelu;   // (B,T,4C)
    float* dfch;        // (B,T,4C)
    float* datt;        // (B,NH,T,T) attention-weight gradient (scratch)
} BackwardBuffers;

struct GPT2 {
    GPT2Config config;
    size_t num_parameters;
    float* params_memory;
    ParameterTensors params;
    float* grads_memory;
    ParameterTensors grads;
    OptimizerKind optimizer;
    int use_beta1;            // Adafactor: keeps a first moment
    float* opt_memory;        // optimizer state, one block (layout: llmc/opt_layout.h)
    size_t opt_floats;
    ActPolicy act;            // what forward keeps, and where (--recompute, --offload)
    ActivationTensors acts;
    float* acts_memory;       // device: the working set, kept segment inputs, the head
    float* host_memory;       // host store of offloaded activations, NULL without --offload
    BackwardBuffers bwd;
    float* bwd_memory;
    int batch_size, seq_len;  // the (B,T) the activations were sized for
    float mean_loss;          // of the last forward with targets
    // data parallelism (llmc/distributed.h)
    Dist dist;                // this process among the ranks
    ZeroStage zero;           // ZERO_SHARDED: this rank keeps the optimizer state of its blocks only
    // ZeRO-2 (opt_layout.h): grads_memory is the gradient shard; m->grads point into the working
    // buffer, a one-layer model's layout (every layer's backward uses layer 0's place)
    float* grad_working;
    float* grad_pack;         // ZeRO-1/2/3: one layer rank by rank, for its reduce-scatter and all-gather
    size_t grad_floats;       // floats of grads_memory
    long zero2_reduces;       // the gradients' collectives since the last update (printed for step 1)
    // ZeRO-3 (opt_layout.h): params_memory is the weight shard; m->params point into the working
    // copy, a one-layer model's layout: wte, wpe, lnfw, lnfb gathered whole once a step, and the
    // layer that computes gathered into layer 0's place before its forward and its backward
    float* weight_working;
    int gathered_layer;       // the layer the working copy holds, -1 none
    int head_gathered;        // the working copy holds this step's wte, wpe, lnfw, lnfb
    long zero3_gathers;       // the weights' collectives since the last update (printed for step 1)
    long step_collectives;    // g_dist_collectives when the step began (gpt2_zero_grad): ZeRO's step-1 count
};

// the working-set buffer layer l computes into
static LayerActs* act_layer(const GPT2* m, int l) {
    return &m->acts.slots[act_slot_of(&m->act, m->config.num_layers, l)];
}

// segment s's input in device memory: the embeddings, the kept tensor, or (offload) the staging buffer
static float* segment_input(const GPT2* m, int s) {
    if (s == 0) { return m->acts.encoded; }
    return m->act.offload ? m->acts.staging : m->acts.seg_inputs[s];
}

// layer l's input, while l's block is in the working set; l == L: the last block's output
static const float* layer_input(const GPT2* m, int l) {
    if (l == 0) { return m->acts.encoded; }
    int k = m->act.segment;
    if (k > 0 && l % k == 0 && l < m->config.num_layers) { return segment_input(m, l / k); }
    return act_layer(m, l - 1)->residual3;
}

// ----------------------------------------------------------------------------
// sizes (the planner reads them through gpt2_layout) and allocation

// floats of one layer's block under a policy
static size_t layer_act_floats(int B, int T, int C, int NH, const ActPolicy* pol) {
    size_t s[NUM_LAYER_ACTS], total = 0;
    layer_act_elems(s, B, T, C, NH, pol);
    for (int i = 0; i < NUM_LAYER_ACTS; i++) { total += s[i]; }
    return total;
}

// the head, K tokens at a time (K = B*T, or a --loss-chunk): the final LayerNorm's output (K,C) and
// its statistics (B,T each), the probabilities (K,Vp), the losses (B,T)
static size_t head_act_floats(int B, int T, int C, int Vp, int K) {
    size_t BT = (size_t)B * T;
    return (size_t)K * C + 2 * BT + (size_t)K * Vp + BT;
}

const char* gpt2_backend_name(void) { return "the CPU backend (train_gpt)"; }
int gpt2_zero_max_stage(void) { return ZERO_WEIGHTS; }
// no device: the "device" categories are host memory, and no table of peak FLOP/s (--peak-tflops)
void gpt2_select_device(const Dist* d) { (void)d; }
// the CPU trainer's collectives go over MPI only (it has no NCCL)
void gpt2_dist_start(Dist* d, const char* method) {
    (void)method;
    fail("%s says %d processes, which MPI does not join, but the CPU trainer exchanges between processes over MPI only%s\n"
         "  hint: %s", dist_source(), d->world,
         dist_built_with_mpi() ? ": the launcher started more processes than the 1 that MPI joined"
                               : ", and this program was built without MPI: each would train alone",
         dist_built_with_mpi() ? "launch with mpirun, or srun --mpi=pmix (or pmi2)" : DIST_REBUILD_HINT);
}
size_t gpt2_device_free_bytes(void) { return 0; }
size_t gpt2_device_bytes_used(size_t* accounted) { *accounted = 0; return 0; }
double gpt2_peak_flops(Precision p) { (void)p; return 0.0; }
// the CPU reduces after the backward (MPI calls block: nothing would overlap)
void gpt2_reduce_during_backward(GPT2* m) { (void)m; }
// offload on the CPU is a memcpy inside the step (nothing overlaps, nothing to report apart)
double gpt2_copy_wait_ms(GPT2* m) { (void)m; return -1.0; }
Precision gpt2_default_precision(void) { return PRECISION_FP32; }
// flash attention runs on any head size here; the default stays the stored-weights attention, the
// reference, and faster here (flash took 1.28x the plain step on d6 at T=1024: its backward
// computes every score again; README, "Which flags should I use?")
const char* gpt2_flash_refusal(int head_size) { (void)head_size; return NULL; }
int gpt2_prefers_flash(void) { return 0; }
// one memory: the "device" categories are host memory too, so one budget (--max-memory) covers all
int gpt2_has_device(void) { return 0; }

// the step-cost model's rates (planner.h), measured on this project's 2-core machine: the d12
// step of make bench (200 GFLOP/s at B=4 T=64, quiet: README, Performance), and a 512 MiB memcpy;
// a rank's gradient exchange is MPI between processes on one machine, two copies through shared memory
#define CPU_STEP_FLOPS 200e9
#define CPU_MEMCPY_BW 10e9      // bytes copied per second: a read and a write each
#define CPU_MPI_BW 5e9
CostModel gpt2_cost_model(Precision p) {
    (void)p;  // fp32 only
    CostModel m = {CPU_STEP_FLOPS, 2.0 * CPU_MEMCPY_BW, CPU_MEMCPY_BW, 2.0 * CPU_MEMCPY_BW, CPU_MPI_BW,
                   "make bench's d12 step on 2 cores", "reads and writes of a memcpy, 2 x its rate",
                   "a memcpy in host memory, measured", "no --offload optimizer on the CPU",
                   "MPI through shared memory on one machine, assumed"};
    return m;
}

// the CPU trains in fp32 only: it is the reference the other precisions are measured against
void gpt2_check_setup(const ModelSetup* s) {
    if (s->precision != PRECISION_FP32) {
        fail("--precision %s: the CPU backend trains in fp32 only (it is the reference)\n"
             "  hint: --precision fp32, or the CUDA trainer (make train_gpt_cu) for bf16", PRECISION_NAMES[s->precision]);
    }
    if (s->offload_optimizer) {
        fail("--offload optimizer: the CPU backend's weights, gradients and optimizer state are host memory already\n"
             "  hint: it moves them off a GPU (make train_gpt_cu); here --offload activations, --optimizer adafactor or --zero 1 save memory");
    }
}

// the CPU's tensors in bytes, for the memory planner: everything fp32
BackendLayout gpt2_layout(const GPT2Config* c, int B, int T, Precision precision, int flash, int loss_chunk) {
    (void)precision;  // fp32 only (gpt2_check_setup)
    int C = c->channels, NH = c->num_heads;
    // keeping everything, and what selective recompute of the GELU and (not with flash) the attention drops
    const ActPolicy all = {0, 0, flash, 0, flash, loss_chunk}, gelu = {0, 1, flash, 0, flash, 0}, attn = {0, 0, 1, 0, flash, 0};
    int K = act_head_rows(&all, (size_t)B * T);
    size_t F = sizeof(float), layer = layer_act_floats(B, T, C, NH, &all);
    size_t bwd[NUM_BACKWARD_BUFFERS], backward = 0;
    backward_buffer_elems(bwd, B, T, C, NH, &all);
    for (int i = 0; i < NUM_BACKWARD_BUFFERS; i++) { backward += bwd[i]; }
    BackendLayout l = {F, F, layer * F, (layer - layer_act_floats(B, T, C, NH, &gelu)) * F,
                       (layer - layer_act_floats(B, T, C, NH, &attn)) * F, (size_t)B * T * C * F,
                       head_act_floats(B, T, C, c->padded_vocab_size, K) * F, backward * F,
                       flash ? "4(16BTC + 4BT + B NH T)" : "4(16BTC + 4BT + B NH T^2)",
                       flash ? "4(13BTC)" : "4(13BTC + B NH T^2)", 0, 0, 0, F, "4(3BT + K(C + Vp))", K, 0};
    return l;
}

// carves n floats from *p and returns them
static float* carve(float** p, size_t n) {
    float* t = *p;
    *p += n;
    return t;
}

// the activations for micro-batches of (B,T) under the policy: device memory (working set,
// shared buffers, kept segment inputs, staging, head) and the host store (offload)
static void gpt2_alloc_activations(GPT2* m, int B, int T, const ActPolicy* pol) {
    const GPT2Config* c = &m->config;
    int L = c->num_layers, C = c->channels, NH = c->num_heads, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T, BTC = BT * C;
    ActivationTensors* a = &m->acts;
    m->act = *pol;
    int slots = act_num_slots(pol, L), segments = act_num_segments(pol, L);
    int seg_kept = pol->segment > 0 ? segments - 1 : 0;  // segment inputs besides the embeddings
    size_t ls[NUM_LAYER_ACTS];
    layer_act_elems(ls, B, T, C, NH, pol);
    a->layer_floats = 0;
    for (int i = 0; i < NUM_LAYER_ACTS; i++) { a->layer_floats += ls[i]; }
    size_t gelu = pol->gelu ? BTC * 4 : 0, att = act_shared_att_elems(pol, B, T, NH);
    size_t device_kept = pol->offload ? 0 : seg_kept * BTC, staging = pol->offload && seg_kept ? BTC : 0;
    int K = act_head_rows(pol, BT);
    size_t head = head_act_floats(B, T, C, Vp, K);
    size_t total = BTC + slots * a->layer_floats + gelu + att + device_kept + staging + head;
    m->acts_memory = (float*)mem_calloc(MEM_ACTIVATIONS, total * sizeof(float));
    a->slots = (LayerActs*)malloc_check(slots * sizeof(LayerActs));  // pointers only, not counted
    a->slot_layer = (int*)malloc_check(slots * sizeof(int));
    a->seg_inputs = (float**)malloc_check(segments * sizeof(float*));
    float* p = m->acts_memory;
    a->encoded = carve(&p, BTC);
    for (int i = 0; i < slots; i++) {
        p += point_layer_acts(&a->slots[i], p, B, T, C, NH, pol);
        a->slot_layer[i] = -1;
    }
    a->gelu_shared = pol->gelu ? carve(&p, gelu) : NULL;
    a->att_shared = att ? carve(&p, att) : NULL;
    for (int i = 0; i < slots; i++) {
        if (pol->gelu) { a->slots[i].fch_gelu = a->gelu_shared; }
        if (att) { a->slots[i].att = a->att_shared; }
    }
    a->seg_inputs[0] = a->encoded;
    for (int s = 1; s <= seg_kept; s++) { a->seg_inputs[s] = pol->offload ? NULL : carve(&p, BTC); }
    a->staging = staging ? carve(&p, staging) : NULL;
    a->lnf = carve(&p, (size_t)K * C);
    a->lnf_mean = carve(&p, BT);
    a->lnf_rstd = carve(&p, BT);
    a->probs = carve(&p, (size_t)K * Vp);
    a->losses = carve(&p, BT);
    a->head_rows = K;
    a->probs_first = -1;
    // the host store
    a->host_layers = NULL;
    if (!pol->offload) { return; }
    size_t host = seg_kept ? seg_kept * BTC : (size_t)L * a->layer_floats;
    m->host_memory = (float*)mem_calloc(MEM_OFFLOADED, host * sizeof(float));
    p = m->host_memory;
    if (seg_kept) {
        for (int s = 1; s <= seg_kept; s++) { a->seg_inputs[s] = carve(&p, BTC); }
    } else {
        a->host_layers = m->host_memory;
    }
}

// gradients, optimizer state, activations and backward buffers for micro-batches of (B,T)
static void gpt2_alloc_training(GPT2* m, int B, int T, OptimizerKind optimizer, int use_beta1, const ActPolicy* pol) {
    const GPT2Config* c = &m->config;
    int C = c->channels, NH = c->num_heads;
    size_t P = m->num_parameters;
    if (zero_shards_grads(m->zero)) {
        Zero2Grads z = zero2_grad_floats(c, m->dist.world);
        m->grad_floats = z.shard;
        m->grads_memory = (float*)mem_calloc(MEM_GRADIENTS, z.shard * sizeof(float));
        m->grad_working = (float*)mem_calloc(MEM_GRADIENTS, z.working * sizeof(float));
        m->grad_pack = (float*)mem_calloc(MEM_GRADIENTS, z.pack * sizeof(float));
        GPT2Config one = *c;
        one.num_layers = 1;
        point_parameters(&m->grads, m->grad_working, &one);
    } else {
        m->grad_floats = P;
        m->grads_memory = (float*)mem_calloc(MEM_GRADIENTS, P * sizeof(float));
        point_parameters(&m->grads, m->grads_memory, c);
        if (m->zero == ZERO_SHARDED) {  // ZeRO-1 exchanges a layer at a time through it too (cpu/host_step.h)
            m->grad_pack = (float*)mem_calloc(MEM_GRADIENTS, zero2_grad_floats(c, m->dist.world).pack * sizeof(float));
        }
    }
    m->optimizer = optimizer;
    m->use_beta1 = use_beta1;
    m->opt_floats = optimizer_state_floats(c, optimizer, use_beta1, zero_shards_state(m->zero) ? m->dist.world : 1);
    m->opt_memory = (float*)mem_calloc(MEM_OPTIMIZER, m->opt_floats * sizeof(float));
    gpt2_alloc_activations(m, B, T, pol);
    size_t bsizes[NUM_BACKWARD_BUFFERS], btotal = 0;
    backward_buffer_elems(bsizes, B, T, C, NH, pol);
    float** bptrs[NUM_BACKWARD_BUFFERS] = {&m->bwd.dresidual, &m->bwd.dbtc, &m->bwd.dqkv, &m->bwd.dfch_gelu, &m->bwd.dfch, &m->bwd.datt};
    for (int i = 0; i < NUM_BACKWARD_BUFFERS; i++) { btotal += bsizes[i]; }
    m->bwd_memory = (float*)mem_calloc(MEM_ACT_GRADIENTS, btotal * sizeof(float));
    float* p = m->bwd_memory;
    for (int i = 0; i < NUM_BACKWARD_BUFFERS; i++) { *bptrs[i] = carve(&p, bsizes[i]); }
}

// every tensor of a model for the setup (for sampling, what forward needs); the weights are
// left for the caller to fill
GPT2* gpt2_create(const ModelSetup* s) {
    GPT2* m = (GPT2*)malloc_check(sizeof(GPT2));
    memset(m, 0, sizeof(*m));
    m->config = s->config;
    m->num_parameters = gpt2_num_parameters(&s->config);
    m->dist = s->dist;
    m->zero = s->zero;
    if (s->zero == ZERO_WEIGHTS) {  // the weight shard, and the working copy the kernels read
        GPT2Config one = s->config;
        one.num_layers = 1;
        m->params_memory = (float*)mem_calloc(MEM_PARAMETERS, zero2_grad_floats(&s->config, s->dist.world).shard * sizeof(float));
        m->weight_working = (float*)mem_calloc(MEM_PARAMETERS, gpt2_num_parameters(&one) * sizeof(float));
        point_parameters(&m->params, m->weight_working, &one);
        m->gathered_layer = -1;
    } else {
        m->params_memory = (float*)mem_alloc(MEM_PARAMETERS, m->num_parameters * sizeof(float));
        point_parameters(&m->params, m->params_memory, &s->config);
    }
    m->batch_size = s->B;
    m->seq_len = s->T;
    if (s->use == MODEL_FOR_TRAINING) {
        gpt2_alloc_training(m, s->B, s->T, s->optimizer, s->use_beta1, &s->act);
    } else {
        gpt2_alloc_activations(m, s->B, s->T, &s->act);  // forward only: no gradients, optimizer state or backward buffers
    }
    return m;
}

void gpt2_destroy(GPT2* m) {
    mem_free(m->params_memory);
    mem_free(m->weight_working);
    mem_free(m->grads_memory);
    mem_free(m->grad_working);
    mem_free(m->grad_pack);
    mem_free(m->opt_memory);
    mem_free(m->acts_memory);
    mem_free(m->host_memory);
    mem_free(m->bwd_memory);
    free(m->acts.slots);
    free(m->acts.slot_layer);
    free(m->acts.seg_inputs);
    free(m);
}

static HostStep gpt2_host_step(GPT2* m) {
    HostStep h = {&m->config, m->dist, m->zero, m->optimizer, m->num_parameters, m->params_memory, m->grads_memory, m->opt_memory,
                  m->grad_pack};
    return h;
}

// the CPU's weights and optimizer state are host memory already: checkpoints read and
// write them in place, and there is nothing to bring up to date
HostView gpt2_host_view(GPT2* m) {
    HostView h = {m->opt_memory, m->opt_floats};
    return h;
}
void gpt2_sync(GPT2* m, SyncDirection dir) { (void)m; (void)dir; }

// the weights for checkpoints: in place, one chunk. ZeRO-3 has no whole copy: a slice at a time
// through the working copy (which the next forward gathers anew), gathered from every rank's
// blocks for a read; for a write every rank keeps its blocks (each reads the whole file)
void gpt2_params_stream(GPT2* m, ParamsAccess how, ParamChunkFn fn, void* ctx) {
    if (m->zero != ZERO_WEIGHTS) { fn(ctx, 0, m->params_memory, m->num_parameters); return; }
    HostStep h = gpt2_host_step(m);
    prof_mark(PROF_COLLECTIVE, prof_bytes(m->num_parameters * sizeof(float)), "ZeRO-3: the weights slice by slice, %s",
              how == PARAMS_WRITE ? "each rank's blocks kept" : "gathered");
    host_zero3_stream(&h, how == PARAMS_WRITE, m->weight_working, fn, ctx);
    m->head_gathered = 0;
    m->gathered_layer = -1;
    prof_close();
}

// ZeRO-3: wte, wpe, lnfw, lnfb into the working copy, once a step (the encoder and the head read them)
static void zero3_gather_head(GPT2* m) {
    if (m->zero != ZERO_WEIGHTS || m->head_gathered) { return; }
    HostStep h = gpt2_host_step(m);
    prof_mark(PROF_COLLECTIVE, prof_bytes((double)(m->params.ln1w - m->weight_working) * sizeof(float)), "ZeRO-3: wte, wpe, lnf all-gather");
    host_zero3_gather_head(&h, m->weight_working);
    m->zero3_gathers += 4;
    m->head_gathered = 1;
    prof_close();
}

// layer l's weights for its forward or backward: ZeRO-3 gathers them into the working copy's
// one layer (unless it holds l already: a recomputed segment's last layer runs its backward next).
// It waits for the gather: the CPU has no second stream to prefetch the next layer on
static LayerParams weights_of_layer(GPT2* m, int l) {
    int C = m->config.channels;
    if (m->zero != ZERO_WEIGHTS) { return layer_params(&m->params, l, C); }
    if (m->gathered_layer != l) {
        HostStep h = gpt2_host_step(m);
        Zero2Grads z = zero2_grad_floats(&m->config, m->dist.world);
        prof_mark(PROF_COLLECTIVE, prof_bytes(z.pack * sizeof(float)), "ZeRO-3: layer %d all-gather", l);
        host_zero3_gather_layer(&h, m->params.ln1w, l, m->grad_pack);
        m->zero3_gathers++;
        m->gathered_layer = l;
        prof_close();
    }
    return layer_params(&m->params, 0, C);
}

// ----------------------------------------------------------------------------
// one transformer block: x -> x + attn(ln1(x)) -> (that) + mlp(ln2(that))

// x (B,T,C) is the block's input; fills a (its residual3 is the block output)
static void block_forward(LayerActs* a, const float* x, const LayerParams* p, int B, int T, int C, int NH,
                          const ActPolicy* pol) {
    size_t BT = (size_t)B * T, BTC = BT * C, X = sizeof(float);
    prof_mark(PROF_LAYERNORM, prof_layernorm_forward(BT, C, X), "forward");
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, B, T, C);
    prof_mark(PROF_MATMUL, prof_matmul_forward(BT, C, 3 * C, X), PROF_MATMUL_FORWARD, BT, C, 3 * C);
    matmul_forward(a->qkv, a->ln1, p->qkvw, p->qkvb, B, T, C, 3 * C);
    prof_mark(PROF_ATTENTION_FORWARD, prof_attention_forward(B, T, C, X), pol->flash ? "flash" : "matmul");
    if (pol->flash) { attention_flash_forward(a->atty, a->att, a->qkv, B, T, C, NH); }  // att: the log-sum-exp
    else { attention_forward(a->atty, a->att, a->qkv, B, T, C, NH); }
    prof_mark(PROF_MATMUL, prof_matmul_forward(BT, C, C, X), PROF_MATMUL_FORWARD, BT, C, C);
    matmul_forward(a->residual2, a->atty, p->attprojw, p->attprojb, B, T, C, C);
    prof_mark(PROF_RESIDUAL, prof_residual_forward(BTC, X), "forward");
    residual_forward(a->residual2, x, a->residual2, BTC);  // in place: residual2 = x + projection
    prof_mark(PROF_LAYERNORM, prof_layernorm_forward(BT, C, X), "forward");
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, p->ln2w, p->ln2b, B, T, C);
    prof_mark(PROF_MATMUL, prof_matmul_forward(BT, C, 4 * C, X), PROF_MATMUL_FORWARD, BT, C, 4 * C);
    matmul_forward(a->fch, a->ln2, p->fcw, p->fcb, B, T, C, 4 * C);
    prof_mark(PROF_GELU, prof_gelu_forward(BTC * 4, X), "forward");
    gelu_forward(a->fch_gelu, a->fch, BTC * 4);
    prof_mark(PROF_MATMUL, prof_matmul_forward(BT, 4 * C, C, X), PROF_MATMUL_FORWARD, BT, 4 * C, C);
    matmul_forward(a->residual3, a->fch_gelu, p->fcprojw, p->fcprojb, B, T, 4 * C, C);
    prof_mark(PROF_RESIDUAL, prof_residual_forward(BTC, X), "forward");
    residual_forward(a->residual3, a->residual2, a->residual3, BTC);
}

// on entry bwd->dresidual holds d(block output); on exit d(block input) (x).
// Parameter gradients accumulate into g. Selective recompute (pol) first runs the GELU
// and the attention softmax again into their shared buffers.
static void block_backward(BackwardBuffers* bwd, const LayerActs* a, const float* x, const LayerParams* p,
                           const LayerGrads* g, int B, int T, int C, int NH, const ActPolicy* pol) {
    size_t BT = (size_t)B * T, BTC = BT * C, X = sizeof(float);
    if (pol->gelu) {
        prof_mark(PROF_GELU, prof_gelu_forward(BTC * 4, X), "forward (recompute)");
        gelu_forward(a->fch_gelu, a->fch, BTC * 4);
    }
    // MLP branch; the residual passes dresidual through unchanged, so it stays in place
    prof_mark(PROF_MATMUL, prof_matmul_backward(BT, 4 * C, C, X), PROF_MATMUL_BACKWARD, BT, 4 * C, C);
    memset(bwd->dfch_gelu, 0, BTC * 4 * sizeof(float));
    matmul_backward(bwd->dfch_gelu, g->fcprojw, g->fcprojb, bwd->dresidual, a->fch_gelu, p->fcprojw, B, T, 4 * C, C);
    prof_mark(PROF_GELU, prof_gelu_backward(BTC * 4, X), "backward");
    memset(bwd->dfch, 0, BTC * 4 * sizeof(float));
    gelu_backward(bwd->dfch, a->fch, bwd->dfch_gelu, BTC * 4);
    prof_mark(PROF_MATMUL, prof_matmul_backward(BT, C, 4 * C, X), PROF_MATMUL_BACKWARD, BT, C, 4 * C);
    memset(bwd->dbtc, 0, BTC * sizeof(float));
    matmul_backward(bwd->dbtc, g->fcw, g->fcb, bwd->dfch, a->ln2, p->fcw, B, T, C, 4 * C);
    prof_mark(PROF_LAYERNORM, prof_layernorm_backward(BT, C, X), "backward");
    layernorm_backward(bwd->dresidual, g->ln2w, g->ln2b, bwd->dbtc, a->residual2, p->ln2w, a->ln2_mean, a->ln2_rstd, B, T, C);
    // attention branch
    prof_mark(PROF_MATMUL, prof_matmul_backward(BT, C, C, X), PROF_MATMUL_BACKWARD, BT, C, C);
    memset(bwd->dbtc, 0, BTC * sizeof(float));
    matmul_backward(bwd->dbtc, g->attprojw, g->attprojb, bwd->dresidual, a->atty, p->attprojw, B, T, C, C);
    prof_mark(PROF_ATTENTION_BACKWARD, prof_attention_backward(B, T, C, X), pol->flash ? "flash" : "matmul");
    memset(bwd->dqkv, 0, BTC * 3 * sizeof(float));
    if (pol->flash) {
        attention_flash_backward(bwd->dqkv, bwd->dbtc, a->qkv, a->atty, a->att, B, T, C, NH);
    } else {
        if (pol->attn) { attention_weights_forward(a->att, a->qkv, B, T, C, NH); }
        attention_backward(bwd->dqkv, bwd->datt, bwd->dbtc, a->qkv, a->att, B, T, C, NH);
    }
    prof_mark(PROF_MATMUL, prof_matmul_backward(BT, C, 3 * C, X), PROF_MATMUL_BACKWARD, BT, C, 3 * C);
    memset(bwd->dbtc, 0, BTC * sizeof(float));
    matmul_backward(bwd->dbtc, g->qkvw, g->qkvb, bwd->dqkv, a->ln1, p->qkvw, B, T, C, 3 * C);
    prof_mark(PROF_LAYERNORM, prof_layernorm_backward(BT, C, X), "backward");
    layernorm_backward(bwd->dresidual, g->ln1w, g->ln1b, bwd->dbtc, x, p->ln1w, a->ln1_mean, a->ln1_rstd, B, T, C);
}

// ----------------------------------------------------------------------------
// the whole model

// after layer l's forward, what the schedule (act_policy.h) keeps: the next segment's input
// (in device memory, or in the host store with offload), or with offload l's whole block
static void act_store_after_forward(GPT2* m, int l, size_t BTC) {
    ActivationTensors* a = &m->acts;
    int L = m->config.num_layers;
    ActStore st = act_after_forward(&m->act, L, l);
    LayerActs* la = act_layer(m, l);
    if (st.segment_input >= 0 || st.offload_layer >= 0) {
        prof_mark(PROF_OFFLOAD_COPY, prof_bytes(2.0 * (st.segment_input >= 0 ? BTC : a->layer_floats) * sizeof(float)), "after forward");
    }
    if (st.segment_input >= 0) { memcpy(a->seg_inputs[st.segment_input], la->residual3, BTC * sizeof(float)); }
    if (st.offload_layer >= 0) {
        memcpy(a->host_layers + (size_t)l * a->layer_floats, la->ln1, a->layer_floats * sizeof(float));
        a->slot_layer[act_slot_of(&m->act, L, l)] = l;
    }
}

// offload: brings layer l's block back from the host store unless its slot still holds it
static void act_fetch_layer(GPT2* m, int l) {
    ActivationTensors* a = &m->acts;
    int slot = act_slot_of(&m->act, m->config.num_layers, l);
    if (a->slot_layer[slot] == l) { return; }
    prof_mark(PROF_OFFLOAD_COPY, prof_bytes(2.0 * a->layer_floats * sizeof(float)), "before backward");
    memcpy(a->slots[slot].ln1, a->host_layers + (size_t)l * a->layer_floats, a->layer_floats * sizeof(float));
    a->slot_layer[slot] = l;
}

// layers first..last forward from x into the working set
static void forward_layers(GPT2* m, int first, int last, const float* x, int B, int T, int store) {
    int C = m->config.channels, NH = m->config.num_heads;
    for (int l = first; l <= last; l++) {
        LayerParams lp = weights_of_layer(m, l);
        LayerActs* la = act_layer(m, l);
        block_forward(la, x, &lp, B, T, C, NH, &m->act);
        if (store) { act_store_after_forward(m, l, (size_t)B * T * C); }
        x = la->residual3;
    }
}

// before layer l's backward: its block and its input into the working set, as the schedule
// (act_policy.h) says: a segment input back from the host, a segment's forward again, blocks back
static void act_prepare_backward(GPT2* m, int l, int B, int T) {
    ActBackwardPlan bp = act_before_backward(&m->act, m->config.num_layers, l);
    if (bp.restore_segment >= 0) {
        prof_mark(PROF_OFFLOAD_COPY, prof_bytes(2.0 * B * T * m->config.channels * sizeof(float)), "before backward");
        memcpy(m->acts.staging, m->acts.seg_inputs[bp.restore_segment], (size_t)B * T * m->config.channels * sizeof(float));
    }
    if (bp.recompute_segment >= 0) {
        forward_layers(m, bp.recompute_first, bp.recompute_last, segment_input(m, bp.recompute_segment), B, T, 0);
    }
    for (int i = 0; i < 2; i++) {
        if (bp.fetch[i] >= 0) { act_fetch_layer(m, bp.fetch[i]); }
    }
}

// the head forward of n tokens, from the last block's output x (n,C): the final LayerNorm into
// lnf (n,C) (statistics into mean, rstd (n)), probabilities into probs (n,Vp), and with targets (n)
// the losses (n). With loss_scale > 0 (--loss-chunk, training) also the head's backward at once:
// probs become the logits' gradient, d(lnf output) (n,C) is written into dlnf and wte's gradient +=
static void head_forward(GPT2* m, float* losses, float* mean, float* rstd, float* dlnf, const float* x,
                         const int* targets, int n, float loss_scale) {
    const GPT2Config* c = &m->config;
    int C = c->channels, V = c->vocab_size, Vp = c->padded_vocab_size;
    ActivationTensors* a = &m->acts;
    size_t N = (size_t)n, X = sizeof(float);
    prof_mark(PROF_LAYERNORM, prof_layernorm_forward(N, C, X), "forward");
    layernorm_forward(a->lnf, mean, rstd, x, m->params.lnfw, m->params.lnfb, 1, n, C);
    prof_mark(PROF_MATMUL, prof_matmul_forward(N, C, Vp, X), PROF_MATMUL_FORWARD, N, C, Vp);
    matmul_forward(a->probs, a->lnf, m->params.wte, NULL, 1, n, C, Vp);  // the logits
    prof_mark(PROF_CLASSIFIER, prof_classifier(N, V, Vp, X), "forward (softmax, cross-entropy)");
    softmax_forward(a->probs, a->probs, 1, n, V, Vp);  // in place: logits -> probabilities
    if (targets == NULL) { return; }
    crossentropy_forward(losses, a->probs, targets, 1, n, Vp);
    if (loss_scale == 0.0f) { return; }
    prof_mark(PROF_CLASSIFIER, prof_classifier(N, V, Vp, X), "backward");
    crossentropy_softmax_backward(a->probs, a->probs, targets, loss_scale, 1, n, V, Vp);  // in place: probs -> dlogits
    prof_mark(PROF_MATMUL, prof_matmul_backward(N, C, Vp, X), PROF_MATMUL_BACKWARD, N, C, Vp);
    memset(dlnf, 0, (size_t)n * C * sizeof(float));
    matmul_backward(dlnf, m->grads.wte, NULL, a->probs, a->lnf, m->params.wte, 1, n, C, Vp);
}

// inputs (B,T) token ids; targets (B,T) or NULL. Leaves the probabilities of the head's last
// K tokens (all of them without --loss-chunk) in acts.probs and, with targets, the per-position
// losses; returns their mean (-1 without targets). loss_scale > 0: gpt2_forward_train's
static float forward(GPT2* m, const int* inputs, const int* targets, int B, int T, float loss_scale) {
    const GPT2Config* c = &m->config;
    int L = c->num_layers, C = c->channels;
    if (B > m->batch_size || T > m->seq_len) { fail("forward with (B,T)=(%d,%d) beyond the allocated (%d,%d)", B, T, m->batch_size, m->seq_len); }
    ActivationTensors* a = &m->acts;
    size_t BT = (size_t)B * T, X = sizeof(float);
    zero3_gather_head(m);
    prof_mark(PROF_ENCODER, prof_encoder_forward(BT, C, X), "forward");
    encoder_forward(a->encoded, inputs, m->params.wte, m->params.wpe, B, T, C);
    forward_layers(m, 0, L - 1, a->encoded, B, T, 1);
    // the head, K tokens at a time (one chunk of B*T without --loss-chunk)
    int K = a->head_rows < (int)BT ? a->head_rows : (int)BT;
    const float* x = layer_input(m, L);
    for (int first = 0; first < (int)BT; first += K) {
        int n = (int)BT - first < K ? (int)BT - first : K;
        size_t row = (size_t)first * C;
        head_forward(m, a->losses + first, a->lnf_mean + first, a->lnf_rstd + first, loss_scale > 0.0f ? m->bwd.dbtc + row : NULL,
                     x + row, targets ? targets + first : NULL, n, loss_scale);
        a->probs_first = first;
        a->probs_end = first + n;
    }
    prof_close();
    if (loss_scale > 0.0f) { a->probs_first = -1; }  // the last chunk's probabilities are its gradient now
    a->head_grad_scale = loss_scale;
    if (targets == NULL) { m->mean_loss = -1.0f; return m->mean_loss; }
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) { sum += a->losses[i]; }
    m->mean_loss = (float)(sum / BT);
    return m->mean_loss;
}

float gpt2_forward(GPT2* m, const int* inputs, const int* targets, int B, int T) {
    return forward(m, inputs, targets, B, T, 0.0f);
}

float gpt2_forward_train(GPT2* m, const int* inputs, const int* targets, int B, int T, float loss_scale) {
    return forward(m, inputs, targets, B, T, m->act.loss_chunk > 0 ? loss_scale : 0.0f);
}

// the (Vp) probabilities of one position of the last forward: one the head still holds (with
// --loss-chunk, the last chunk's: sampling asks for the last position)
const float* gpt2_probs(GPT2* m, int position) {
    const ActivationTensors* a = &m->acts;
    if (a->probs_first < 0 || position < a->probs_first || position >= a->probs_end) {
        fail("gpt2_probs(%d): the last forward's head holds the probabilities of positions %d..%d only (-1: none, after a backward)\n"
             "  hint: with --loss-chunk, ask for a position of the last chunk (sampling: the last position)",
             position, a->probs_first, a->probs_end - 1);
    }
    return a->probs + (size_t)(position - a->probs_first) * m->config.padded_vocab_size;
}

// ZeRO-2, every micro-step, after layer l's backward: its gradients reduce-scattered into the
// shard (one MPI_Reduce_scatter_block), the working layer cleared for the next layer. It waits
// for the collective: the CPU has no second stream to overlap it with the next layer's backward
static void zero2_reduce_layer(GPT2* m, int l) {
    HostStep h = gpt2_host_step(m);
    Zero2Grads z = zero2_grad_floats(&m->config, m->dist.world);
    float* layer = m->grads.ln1w;  // the working buffer's one layer: its 12 tensors, ln1w first
    prof_mark(PROF_COLLECTIVE, prof_bytes(z.pack * sizeof(float)), "ZeRO-2: layer %d reduce-scatter", l);
    host_zero2_reduce_layer(&h, layer, l, m->grad_pack);
    m->zero2_reduces++;
    memset(layer, 0, (size_t)(m->grads.lnfw - layer) * sizeof(float));
    prof_close();
}

// ZeRO-2, after the encoder: wte's, wpe's and the final LayerNorm's gradients reduce-scattered
// into the shard, then the working buffer cleared (with --loss-chunk the next forward adds the
// classifier's wte gradient into it)
static void zero2_reduce_head(GPT2* m) {
    HostStep h = gpt2_host_step(m);
    Zero2Grads z = zero2_grad_floats(&m->config, m->dist.world);
    prof_mark(PROF_COLLECTIVE, prof_bytes(z.working * sizeof(float)), "ZeRO-2: wte, wpe, lnf reduce-scatter");
    host_zero2_reduce_head(&h, m->grad_working);
    m->zero2_reduces += 4;  // wte, wpe, lnfw, lnfb
    memset(m->grad_working, 0, z.working * sizeof(float));
    prof_close();
}

void gpt2_zero_grad(GPT2* m) {
    m->step_collectives = g_dist_collectives;  // the step's collectives count from here (not validation's or start-up's)
    m->zero3_gathers = 0;
    prof_mark(PROF_ZEROING, prof_bytes(m->grad_floats * sizeof(float)), "gradients");
    memset(m->grads_memory, 0, m->grad_floats * sizeof(float));  // ZeRO-2: the working buffer is zero already
    prof_close();
}

// accumulates into the gradients d(loss_scale * sum of position losses) for the batch
// of the last forward; loss_scale is 1/(B*T*accumulation steps) for a mean loss.
void gpt2_backward(GPT2* m, const int* inputs, const int* targets, int B, int T, float loss_scale) {
    const GPT2Config* c = &m->config;
    int L = c->num_layers, C = c->channels, NH = c->num_heads, V = c->vocab_size, Vp = c->padded_vocab_size;
    ActivationTensors* a = &m->acts;
    BackwardBuffers* bwd = &m->bwd;
    size_t BT = (size_t)B * T, BTC = BT * C, X = sizeof(float);
    if (m->act.loss_chunk > 0) {  // the forward did the head's backward, chunk by chunk: d(lnf output) is in dbtc
        act_take_head_grads(&a->head_grad_scale, loss_scale);
    } else {
        prof_mark(PROF_CLASSIFIER, prof_classifier(BT, V, Vp, X), "backward");
        crossentropy_softmax_backward(a->probs, a->probs, targets, loss_scale, B, T, V, Vp);  // in place: probs -> dlogits
        a->probs_first = -1;
        prof_mark(PROF_MATMUL, prof_matmul_backward(BT, C, Vp, X), PROF_MATMUL_BACKWARD, BT, C, Vp);
        memset(bwd->dbtc, 0, BTC * sizeof(float));
        matmul_backward(bwd->dbtc, m->grads.wte, NULL, a->probs, a->lnf, m->params.wte, B, T, C, Vp);
    }
    prof_mark(PROF_LAYERNORM, prof_layernorm_backward(BT, C, X), "backward");
    memset(bwd->dresidual, 0, BTC * sizeof(float));
    layernorm_backward(bwd->dresidual, m->grads.lnfw, m->grads.lnfb, bwd->dbtc, layer_input(m, L),
                       m->params.lnfw, a->lnf_mean, a->lnf_rstd, B, T, C);
    for (int l = L - 1; l >= 0; l--) {
        act_prepare_backward(m, l, B, T);
        LayerParams lp = weights_of_layer(m, l);
        LayerGrads lg = layer_grads(&m->grads, zero_shards_grads(m->zero) ? 0 : l, C);
        block_backward(bwd, act_layer(m, l), layer_input(m, l), &lp, &lg, B, T, C, NH, &m->act);
        if (zero_shards_grads(m->zero)) { zero2_reduce_layer(m, l); }
    }
    prof_mark(PROF_ENCODER, prof_encoder_backward(BT, T, C, X), "backward");
    encoder_backward(m->grads.wte, m->grads.wpe, bwd->dresidual, inputs, B, T, C);
    prof_close();
    if (zero_shards_grads(m->zero)) { zero2_reduce_head(m); }
}

// ----------------------------------------------------------------------------
// data parallelism and the optimizer step: cpu/host_step.h, on the model's own arrays. Each
// rank's gradient is of its own part of the batch; before the step ZERO_REPLICATED sums them
// whole on every rank (all-reduce), ZERO_SHARDED sums each block only on the rank that owns it
// (reduce-scatter), which updates it and sends it to the others (all-gather). ZERO_GRADS
// reduce-scatters during the backward (zero2_reduce_layer, zero2_reduce_head) and keeps the
// reduced blocks only; its step is ZeRO-1's on them. ZERO_WEIGHTS does the same, and its step
// updates the rank's weight shard, which no one else needs until it is gathered again.

void gpt2_reduce_grads(GPT2* m) {
    HostStep h = gpt2_host_step(m);
    if (m->dist.world > 1 && !zero_shards_grads(m->zero)) { prof_mark(PROF_COLLECTIVE, prof_bytes(m->num_parameters * sizeof(float)), "MPI gradient sums"); }
    host_reduce_grads(&h);
    prof_close();
}
float gpt2_grad_norm(GPT2* m) {
    HostStep h = gpt2_host_step(m);
    prof_mark(PROF_GRAD_NORM, prof_grad_norm(m->num_parameters), "all gradients");
    float norm = host_grad_norm(&h);
    prof_close();
    return norm;
}
void gpt2_update(GPT2* m, const StepConfig* s, float grad_norm) {
    HostStep h = gpt2_host_step(m);
    prof_mark(PROF_OPTIMIZER, prof_optimizer(m->num_parameters, m->opt_floats, sizeof(float)), "%s", OPTIMIZER_NAMES[m->optimizer]);
    host_update(&h, s, grad_norm, NULL, NULL);
    prof_close();
    // ZeRO-1, 2 and 3: the collectives of the first step, counted (tests/test_zero.py bounds them): the
    // gradients' (micro-steps x (L + 4)), ZeRO-3's weight gathers (4 + L a forward, L a backward, more
    // with recompute), the norm's, the optimizer's sums and ZeRO-2's weight gathers
    long step = g_dist_collectives - m->step_collectives;
    if (zero_shards_grads(m->zero) && s->t == 1 && m->dist.rank == 0) {
        Zero2Grads z = zero2_grad_floats(&m->config, m->dist.world);
        printf("ZeRO-%d: step 1: %ld gradient reduce-scatters, %ld weight all-gathers, %ld collectives in all (L = %d); "
               "gradients per rank: shard %zu of %zu floats, working buffer %zu, pack %zu", (int)m->zero, m->zero2_reduces,
               m->zero3_gathers, step, m->config.num_layers, z.shard, m->num_parameters, z.working, z.pack);
        if (m->zero == ZERO_WEIGHTS) { printf("; weights per rank: shard %zu, working copy %zu", z.shard, z.working); }
        printf("\n");
    }
    if (m->zero == ZERO_SHARDED && s->t == 1 && m->dist.rank == 0) {  // ZeRO-1: a layer at a time, each way
        printf("ZeRO-1: step 1: %ld collectives in all (L = %d)\n", step, m->config.num_layers);
    }
    m->head_gathered = 0;  // ZeRO-3: the shard moved on; the next forward gathers again
    m->gathered_layer = -1;
    m->zero2_reduces = 0;
}

// --profile: the CPU's ranges are timed by the wall clock as they close; nothing to wait for
void gpt2_profile_begin(GPT2* m) { (void)m; }
void gpt2_profile_end(GPT2* m) { (void)m; }
const char* gpt2_profile_timing(void) { return "the wall clock of each range (OpenMP threads inside it)"; }
ProfRoofline gpt2_profile_roofline(void) { return cpu_roofline_measure(); }

#ifndef TESTING
int main(int argc, char** argv) {
    return train_main(argc, argv);
}
#endif
