/*
train_gpt.c: GPT-2 training on the CPU, fp32, C11 + OpenMP: the CPU model and the
CPU backend of the one training program (llmc/trainer.h). The reference path: every
other path of the project (the memory-saving flags, the CUDA backend) is tested
against what this file computes.

Reading order: the model's tensors (parameters here, activations in cpu/activations.h,
backward buffers here), the backend's answers to the trainer (sizes for the memory planner,
the cost model), allocation, one transformer block forward and backward, the whole model
forward and backward, and the end of the step (gradient sums, norm, update). The layers are
in cpu/layers.h, AdamW in cpu/optimizers.h; the loop, flags, files and memory accounting are
shared (llmc/trainer.h). The memory techniques enter the plain model at named hooks, one line
each, and live in their own files: --recompute and --offload activations in cpu/activations.h
(the schedule: llmc/act_policy.h), --zero in cpu/zero.h (its exchanges: cpu/host_step.h),
--loss-chunk in forward's head loop; --profile's marks are inside the layers. --tp N (tensor
parallelism: cpu/tensor_parallel.h, doc/tensor_parallel.md) gives a rank its slices of each layer:
its config's tp sizes every tensor, and the block adds the group's partial sums at the hook tp_reduce
(with --sp a rank's rows of them, its rows met at tp_gather before the split matmuls).

    make train_gpt && ./train_gpt             # d6 on TinyShakespeare (make run prepares the data)
    ./train_gpt -e d12 -b 4 -t 64             # GPT-2 124M
    ./train_gpt --plan -e d48 -b 8 -t 1024 --optimizer adafactor --recompute sqrt
    mpirun -np 2 ./train_gpt -e d12 --zero 1  # data parallel, optimizer state sharded
    mpirun -np 2 ./train_gpt -e d12 --tp 2    # tensor parallel: each layer's matrices split over 2 ranks
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
#include "cpu/activations.h"  // what forward keeps for backward; --recompute, --offload activations
#include "cpu/zero.h"         // --zero 1, 2, 3
#include "cpu/tensor_parallel.h"  // a block's matrices split over ranks (Megatron-LM): the hooks in block_forward, block_backward
#include "cpu/pipeline.h"     // --pp: the whole model from the stages' parts, wte's pair
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

// points the 16 tensors of p into memory, in model_config.h's order: the whole model's, or (cfg->tp > 1)
// one rank's slices of it (--tp: the shapes of gpt2_tensor_shape, Ct = C/tp in place of C)
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

// layer l's slice of each per-layer tensor of p (shapes: cfg's, a rank's slices with --tp)
static LayerParams layer_params(const ParameterTensors* p, int l, const GPT2Config* cfg) {
    size_t at[NUM_PARAMETER_TENSORS];  // floats of one layer of each tensor
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t rows, cols;
        gpt2_tensor_shape(i, cfg, &rows, &cols);
        at[i] = (size_t)l * rows * cols;
    }
    LayerParams lp = {
        p->ln1w + at[2], p->ln1b + at[3], p->qkvw + at[4], p->qkvb + at[5], p->attprojw + at[6], p->attprojb + at[7],
        p->ln2w + at[8], p->ln2b + at[9], p->fcw + at[10], p->fcb + at[11], p->fcprojw + at[12], p->fcprojb + at[13],
    };
    return lp;
}
static LayerGrads layer_grads(const ParameterTensors* g, int l, const GPT2Config* cfg) {
    LayerParams lp = layer_params(g, l, cfg);  // same offsets, writable memory
    LayerGrads lg;
    memcpy(&lg, &lp, sizeof(lg));
    return lg;
}

// backward's working set: one layer's worth, reused by every layer
typedef struct {
    float* dresidual;   // (B,T,C) gradient of the residual stream at the current layer boundary
    float* dbtc;        // (B,T,C) scratch, one meaning at a time: d(ln2), d(atty), d(ln1), d(lnf) (each named where used)
    float* dqkv;        // (B,T,3C)
    float* dfch_gelu;   // (B,T,4C)
    float* dfch;        // (B,T,4C)
    float* datt;        // (B,NH,T,T) attention-weight gradient (scratch)
} BackwardBuffers;

struct GPT2 {
    GPT2Config config;
    size_t num_parameters;
    float* params_memory;     // the weights (ZeRO-3: this rank's shard of them)
    ParameterTensors params;  // the weights the layers read (ZeRO-3: the working copy, cpu/zero.h)
    float* grads_memory;      // the gradients (ZeRO-2 and 3: this rank's shard of them)
    ParameterTensors grads;   // the gradients the layers add into (ZeRO-2 and 3: the working buffer)
    size_t grad_floats;       // floats of grads_memory
    OptimizerKind optimizer;
    int use_beta1;            // Adafactor: keeps a first moment
    float* opt_memory;        // optimizer state, one block (layout: llmc/opt_layout.h)
    size_t opt_floats;
    QStateFormat state_format;  // its moments' format (--optimizer-state: cpu/optimizers_lowp.h)
    Activations* acts;        // what forward keeps, and where (cpu/activations.h: --recompute, --offload): of the
                              // micro-batch in hand, one of `held`
    Activations* held;        // [num_held] --pp: one set for each micro-batch a stage holds at once (1 without)
    int num_held;
    BackwardBuffers bwd;
    float* bwd_memory;
    int batch_size, seq_len;  // the (B,T) the activations were sized for
    float mean_loss;          // of the last forward with targets
    Dist dist;                // this process among the data-parallel ranks (llmc/distributed.h)
    CpuZero zero;             // --zero 1, 2, 3: the shards' buffers (cpu/zero.h)
    Dist tensor;              // --tp: this process in its tensor-parallel group ({0, 1}: none)
    TensorParallel tp;        // its sums (cpu/tensor_parallel.h); TP_NONE: this rank holds each block's matrices whole
    float* tp_staging;        // --tp: a split tensor's layer whole, as checkpoints move it (tp_staging_floats), else NULL
    float* tp_probs;          // --tp: (Vp) one position's probabilities gathered whole from the group (gpt2_probs), else NULL
    GPT2Config whole;         // --pp: the model's config (config: this rank's stage's, cpu/pipeline.h)
    Dist pipeline, pair;      // --pp: this process among the stages ({0, 1}: none), and wte's pair (the first and last stage)
    float* pp_staging;        // --pp: the whole model's weights go through it, a piece at a time (checkpoints), else NULL
    float* pp_probs;          // --pp: (Vp) one position's probabilities, from the last stage (gpt2_probs), else NULL
};

// ----------------------------------------------------------------------------
// sizes (the planner reads them through gpt2_layout) and allocation

const char* gpt2_backend_name(void) { return "the CPU backend (train_gpt)"; }
int gpt2_zero_max_stage(void) { return ZERO_3; }
int gpt2_tp_max(void) { return INT_MAX; }  // any group whose ranks take whole heads (trainer.h checks)
int gpt2_pp_max(void) { return INT_MAX; }  // any number of stages up to the layers (trainer.h checks)
const char* gpt2_pp_refusal(PpSchedule schedule, ZeroStage zero, int offload_optimizer, int loss_chunk) {
    (void)schedule; (void)zero; (void)offload_optimizer; (void)loss_chunk;
    return NULL;  // every schedule, ZeRO stage and --loss-chunk (--offload optimizer: refused for the CPU itself)
}
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
int gpt2_device_is_modelled(void) { return 0; }
size_t gpt2_device_bytes_used(size_t* accounted) { *accounted = 0; return 0; }
double gpt2_peak_flops(Precision p) { (void)p; return 0.0; }
// the CPU reduces after the backward (MPI calls block: nothing would overlap)
void gpt2_reduce_during_backward(GPT2* m) { (void)m; }
// offload on the CPU is a memcpy inside the step (nothing overlaps, nothing to report apart)
double gpt2_copy_wait_ms(GPT2* m) { (void)m; return -1.0; }
Precision gpt2_default_precision(void) { return PRECISION_FP32; }
// flash attention runs on any head size here; the default stays the stored-weights attention, the
// reference, and faster here (flash took 1.28x the plain step on d6 at T=1024: its backward
// computes every score again; doc/benchmarks.md, "Flag sets compared")
const char* gpt2_flash_refusal(int head_size) { (void)head_size; return NULL; }
int gpt2_prefers_flash(void) { return 0; }
// one memory: the "device" categories are host memory too, so one budget (--max-memory) covers all
int gpt2_has_device(void) { return 0; }

// the step-cost model's rates (planner.h), measured on this project's 2-core machine: the d12
// step of make bench (200 GFLOP/s at B=4 T=64, quiet: doc/benchmarks.md), and a 512 MiB memcpy;
// a rank's gradient exchange is MPI between processes on one machine, two copies through shared memory
#define CPU_STEP_FLOPS 200e9
#define CPU_MEMCPY_BW 10e9      // bytes copied per second: a read and a write each
#define CPU_MPI_BW 5e9
CostModel gpt2_cost_model(Precision p) {
    (void)p;  // fp32 only
    CostModel m = {.flops = CPU_STEP_FLOPS, .memory_bw = 2.0 * CPU_MEMCPY_BW, .host_bw = CPU_MEMCPY_BW,
                   .host_memory_bw = 2.0 * CPU_MEMCPY_BW, .link_bw = CPU_MPI_BW,
                   .flops_note = "make bench's d12 step on 2 cores", .memory_note = "reads and writes of a memcpy, 2 x its rate",
                   .host_note = "a memcpy in host memory, measured", .host_memory_note = "no --offload optimizer on the CPU",
                   .link_note = "MPI through shared memory on one machine, assumed"};
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

// the CPU's tensors in bytes, for the memory planner: everything fp32; c: the whole model, or with
// --tp (c->tp = N > 1) a rank's slices, whose blocks hold NH/N heads and 4C/N hidden units; with --sp
// (act->sp) the residual stream and the LayerNorms a rank's B T/N rows, and one (B,T,C) buffer where they meet
BackendLayout gpt2_layout(const GPT2Config* c, int B, int T, Precision precision, const ActPolicy* act) {
    (void)precision;  // fp32 only (gpt2_check_setup)
    int C = c->channels, NH = c->num_heads, N = gpt2_tp(c), flash = act->flash, sp = act->sp;
    // keeping everything, and what selective recompute of the GELU and (not with flash) the attention drops
    const ActPolicy all = {.attn = flash, .flash = flash, .loss_chunk = act->loss_chunk, .sp = sp};
    const ActPolicy gelu = {.gelu = 1, .attn = flash, .flash = flash, .sp = sp}, attn = {.attn = 1, .flash = flash, .sp = sp};
    int K = act_head_rows(&all, (size_t)B * T);
    size_t F = sizeof(float), layer = act_layer_floats(B, T, C, NH, N, &all), R = act_residual_rows(&all, (size_t)B * T, N);
    size_t bwd[NUM_BACKWARD_BUFFERS], backward = 0;
    backward_buffer_elems(bwd, B, T, C, NH, N, &all);
    for (int i = 0; i < NUM_BACKWARD_BUFFERS; i++) { backward += bwd[i]; }
    BackendLayout l = {
        .param_bytes = F, .grad_bytes = F, .layer = layer * F,
        .layer_gelu = (layer - act_layer_floats(B, T, C, NH, N, &gelu)) * F,
        .layer_att = (layer - act_layer_floats(B, T, C, NH, N, &attn)) * F,
        .residual = R * C * F,
        .sp_gathered = act_sp_gathered_floats(&all, (size_t)B * T, C) * F,
        .head = act_has_head(c) ? act_head_floats(B, T, C, c->padded_vocab_size / N, K) * F : 0,  // --tp: a rank's Vp/N columns; --pp: the last stage's
        .backward = backward * F,
        .layer_formula = sp ? (flash ? "4(4BTC/N + 12BTC/N + 4BT/N + B NH T/N)" : "4(4BTC/N + 12BTC/N + 4BT/N + B NH T^2/N)")
                       : N > 1 ? (flash ? "4(4BTC + 12BTC/N + 4BT + B NH T/N)" : "4(4BTC + 12BTC/N + 4BT + B NH T^2/N)")
                               : (flash ? "4(16BTC + 4BT + B NH T)" : "4(16BTC + 4BT + B NH T^2)"),
        .backward_formula = sp ? (flash ? "4(BTC + BTC/N + 11BTC/N)" : "4(BTC + BTC/N + 11BTC/N + B NH T^2/N)")
                          : N > 1 ? (flash ? "4(2BTC + 11BTC/N)" : "4(2BTC + 11BTC/N + B NH T^2/N)")
                                  : (flash ? "4(13BTC)" : "4(13BTC + B NH T^2)"),
        .working_bytes = F,  // the CPU's kernels read the fp32 weights themselves
        .head_formula = N > 1 ? "4(3BT + K(C + Vp/N))" : "4(3BT + K(C + Vp))", .head_rows = K,
        .backend_scratch = (size_t)((N > 1) + (gpt2_pp(c) > 1)) * c->padded_vocab_size * F,  // --tp, --pp: a row of probabilities whole each (sampling)
    };
    return l;
}

// carves n floats from *p and returns them
static float* carve(float** p, size_t n) {
    float* t = *p;
    *p += n;
    return t;
}

// the activations of every micro-batch the stage holds at once (--pp: llmc/pipeline.h's
// pp_max_in_flight; 1 without), the first in hand
static void gpt2_alloc_held(GPT2* m, const ModelSetup* s) {
    m->num_held = s->pp_held > 1 ? s->pp_held : 1;
    m->held = (Activations*)malloc_check((size_t)m->num_held * sizeof(Activations));  // the sets' pointers: not counted
    for (int i = 0; i < m->num_held; i++) { act_alloc(&m->held[i], &s->act, &m->config, s->B, s->T); }
    m->acts = &m->held[0];
}

// gradients, optimizer state, activations and backward buffers for micro-batches of (B,T)
static void gpt2_alloc_training(GPT2* m, const ModelSetup* s) {
    const GPT2Config* c = &m->config;
    int C = c->channels, NH = c->num_heads, grad_layers;
    GPT2Config layout = *c;  // what the layers add into: the whole model, or (ZeRO-2, 3) a one-layer working buffer
    float* grads = zero_alloc_grads(&m->zero, c, m->dist.world, &m->grads_memory, &m->grad_floats, &grad_layers);
    layout.num_layers = grad_layers;
    point_parameters(&m->grads, grads, &layout);
    m->optimizer = s->optimizer;
    m->use_beta1 = s->use_beta1;
    m->state_format = s->state_format;
    m->opt_floats = optimizer_state_floats_as(c, s->optimizer, s->use_beta1, zero_shards_state(m->zero.stage) ? m->dist.world : 1, s->state_format);
    m->opt_memory = (float*)mem_calloc(MEM_OPTIMIZER, m->opt_floats * sizeof(float));
    gpt2_alloc_held(m, s);
    size_t bsizes[NUM_BACKWARD_BUFFERS], btotal = 0;
    backward_buffer_elems(bsizes, s->B, s->T, C, NH, gpt2_tp(c), &s->act);
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
    m->config = setup_rank_config(s);  // the whole model, or (--tp) this rank's slices of it, or (--pp) its stage's part
    m->num_parameters = gpt2_num_parameters(&m->config);
    m->dist = s->dist;
    m->tensor = s->tensor;
    m->whole = s->config;
    m->pipeline = s->pipeline;
    m->pair = s->pair;
    if (s->tensor.world > 1) {
        m->tp_staging = (float*)mem_alloc(MEM_PARAMETERS, tp_staging_floats(&m->config) * sizeof(float));
        m->tp_probs = (float*)mem_alloc(MEM_SCRATCH, (size_t)m->config.padded_vocab_size * sizeof(float));
    }
    if (s->pipeline.world > 1) {
        m->pp_staging = (float*)mem_alloc(MEM_PARAMETERS, pp_staging_floats(&m->config) * sizeof(float));
        m->pp_probs = (float*)mem_alloc(MEM_SCRATCH, (size_t)m->config.padded_vocab_size * sizeof(float));
    }
    m->zero.stage = s->zero;
    m->zero.format = s->state_format;  // an 8-bit state's blocks decide ZeRO's cut
    int layers;
    GPT2Config layout = m->config;  // what the layers read: the whole model, or (ZeRO-3) a one-layer working copy
    float* weights = zero_alloc_weights(&m->zero, &m->config, s->dist.world, &m->params_memory, &layers);
    layout.num_layers = layers;
    point_parameters(&m->params, weights, &layout);
    m->batch_size = s->B;
    m->seq_len = s->T;
    if (s->use == MODEL_FOR_TRAINING) {
        gpt2_alloc_training(m, s);
    } else {
        gpt2_alloc_held(m, s);  // forward only: no gradients, optimizer state or backward buffers
    }
    size_t BTC = (size_t)s->B * s->T * m->config.channels;  // --sp's rows meet in the activations' gathered buffer
    m->tp = s->tensor.world > 1 ? tp_of_group(&m->tensor, m->acts->sp_gathered, BTC) : TP_NONE;
    return m;
}

void gpt2_destroy(GPT2* m) {
    mem_free(m->params_memory);
    mem_free(m->grads_memory);
    mem_free(m->opt_memory);
    mem_free(m->bwd_memory);
    mem_free(m->tp_staging);
    mem_free(m->tp_probs);
    for (int i = 0; i < m->num_held; i++) { act_free(&m->held[i]); }
    free(m->held);
    mem_free(m->pp_staging);
    mem_free(m->pp_probs);
    zero_free(&m->zero);
    free(m);
}

// the end of the step's arrays, for cpu/host_step.h and cpu/zero.h
static HostStep gpt2_host_step(GPT2* m) {
    HostStep h = {.config = &m->config, .dist = m->dist, .zero = m->zero.stage, .optimizer = m->optimizer,
                  .num_parameters = m->num_parameters, .params = m->params_memory, .grads = m->grads_memory,
                  .state = m->opt_memory, .format = m->state_format, .pack = m->zero.pack, .pipeline = m->pipeline};
    return h;
}

// the CPU's weights and optimizer state are host memory already: checkpoints read and
// write them in place, and there is nothing to bring up to date
HostView gpt2_host_view(GPT2* m) {
    HostView h = {m->opt_memory, m->opt_floats};
    return h;
}
void gpt2_sync(GPT2* m, SyncDirection dir) { (void)m; (void)dir; }

// the weights for checkpoints: in place, one chunk (ZeRO-3: slice by slice, cpu/zero.h); with --tp
// the whole model's, through the group's slices (cpu/tensor_parallel.h's stream)
void gpt2_params_stream(GPT2* m, ParamsAccess how, ParamChunkFn fn, void* ctx) {
    if (m->pipeline.world > 1) {  // --pp: the stages' parts in the whole model's order (cpu/pipeline.h; with --tp through the groups'
                                  // slices, with --zero 3 each slice gathered from the data group's blocks)
        HostStep h = gpt2_host_step(m);
        int z3 = m->zero.stage == ZERO_3;
        PpModel p = {.whole = &m->whole, .stage = &m->config, .params = z3 ? NULL : m->params_memory, .pipeline = m->pipeline,
                     .tensor = m->tensor, .staging = m->pp_staging, .tp_staging = m->tp_staging, .zero3 = z3 ? &h : NULL,
                     .zero3_staging = z3 ? m->zero.weight_working : NULL};
        pp_params_stream(&p, how == PARAMS_WRITE, fn, ctx);
        if (z3) { zero3_working_stale(&m->zero); }
        return;
    }
    TpStream t;
    if (m->tp.size > 1) {
        tp_stream_begin(&t, &m->config, m->tensor, m->tp_staging, how == PARAMS_WRITE, fn, ctx);
        fn = tp_stream_chunk;
        ctx = &t;
    }
    if (m->zero.stage != ZERO_3) {
        fn(ctx, 0, m->params_memory, m->num_parameters);
    } else {
        HostStep h = gpt2_host_step(m);
        zero3_params_stream(&m->zero, &h, how == PARAMS_WRITE, fn, ctx);
    }
    if (m->tp.size > 1) { tp_stream_end(&t); }
}

// ----------------------------------------------------------------------------
// one transformer block: x -> x + attn(ln1(x)) -> (that) + mlp(ln2(that))
//
// With --tp N (cpu/tensor_parallel.h) this rank computes Ct = C/N channels of the attention (NHt =
// NH/N heads) and 4Ct of the MLP's hidden units: the shapes below say Ct and NHt, which are C and NH
// without it. Its two row-parallel matmuls give partial sums, which the hook tp_reduce adds over the
// ranks (forward), as it adds the partial d(ln2) and d(ln1) (backward). With --sp the residual stream
// and the LayerNorms are this rank's R = B T / N rows (R = B T without it): the hook tp_gather meets
// the group's rows before each column-parallel matmul, and tp_reduce hands each rank its rows of the sums.

// x (R,C) is the block's input; fills a (its residual3 is the block output)
static void block_forward(LayerActs* a, const float* x, const LayerParams* p, int B, int T, int C, int NH,
                          const ActPolicy* pol, const TensorParallel* tp) {
    size_t BTC = (size_t)B * T * C, R = tp_rows(tp, (size_t)B * T), RC = R * C;
    int Ct = C / tp->size, NHt = NH / tp->size;
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, 1, (int)R, C);
    const float* ln1 = tp_gather(tp, a->ln1, RC);  // hook: --sp's rows of every rank, (B,T,C)
    matmul_forward(a->qkv, ln1, p->qkvw, p->qkvb, B, T, C, 3 * Ct);                     // (B,T,3Ct)
    if (pol->flash) { attention_flash_forward(a->atty, a->lse, a->qkv, B, T, Ct, NHt); }  // (B,T,Ct)
    else { attention_forward(a->atty, a->att, a->qkv, B, T, Ct, NHt); }
    float* proj = tp_partial(tp, a->residual2);  // --sp: the partial projection of every row, before its rows are handed out
    matmul_forward(proj, a->atty, p->attprojw, tp_row_bias(tp, p->attprojb), B, T, Ct, C);
    tp_reduce(tp, proj, a->residual2, BTC);  // hook: --tp's partial projections added
    residual_forward(a->residual2, x, a->residual2, RC);  // in place: residual2 = x + projection
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, p->ln2w, p->ln2b, 1, (int)R, C);
    const float* ln2 = tp_gather(tp, a->ln2, RC);  // hook
    matmul_forward(a->fch, ln2, p->fcw, p->fcb, B, T, C, 4 * Ct);                       // (B,T,4Ct)
    gelu_forward(a->fch_gelu, a->fch, (size_t)B * T * 4 * Ct);
    proj = tp_partial(tp, a->residual3);
    matmul_forward(proj, a->fch_gelu, p->fcprojw, tp_row_bias(tp, p->fcprojb), B, T, 4 * Ct, C);
    tp_reduce(tp, proj, a->residual3, BTC);  // hook
    residual_forward(a->residual3, a->residual2, a->residual3, RC);
}

// --recompute gelu, attn (selective recompute): what this layer's forward did not keep, again into
// the shared buffers, before its backward reads it
static void recompute_dropped(const LayerActs* a, int B, int T, int C, int NH, const ActPolicy* pol, const TensorParallel* tp) {
    int Ct = C / tp->size, NHt = NH / tp->size;
    prof_context("recompute");
    if (pol->gelu) { gelu_forward(a->fch_gelu, a->fch, (size_t)B * T * 4 * Ct); }
    if (pol->attn && !pol->flash) {
        prof_mark(PROF_ATTENTION_FORWARD, prof_attention_weights(prof_attention_forward(B, T, Ct, sizeof(float)), B, NHt, T, sizeof(float)),
                  "weights");
        attention_weights_forward(a->att, a->qkv, B, T, Ct, NHt);
    }
    prof_context(NULL);
}

// on entry bwd->dresidual holds d(block output); on exit d(block input) (x), R rows each.
// Parameter gradients accumulate into g. The scratch buffers are cleared before each
// backward that adds (+=) into them. With --sp the forward's gathered rows are gathered again
// (tp_gather) where a matmul's backward reads them, and d(block output) of every row too
static void block_backward(BackwardBuffers* bwd, const LayerActs* a, const float* x, const LayerParams* p,
                           const LayerGrads* g, int B, int T, int C, int NH, const ActPolicy* pol, const TensorParallel* tp) {
    size_t BTC = (size_t)B * T * C, BTCt = BTC / (size_t)tp->size, R = tp_rows(tp, (size_t)B * T), RC = R * C;
    int Ct = C / tp->size, NHt = NH / tp->size;
    float *dln2 = bwd->dbtc, *datty = bwd->dbtc, *dln1 = bwd->dbtc;  // one buffer, three gradients in turn
    if (pol->gelu || (pol->attn && !pol->flash)) { recompute_dropped(a, B, T, C, NH, pol, tp); }
    // MLP branch; the residual passes dresidual through unchanged, so it stays in place
    const float* dout = tp_gather(tp, bwd->dresidual, RC);  // hook: --sp's d(block output) of every row
    zero_floats(bwd->dfch_gelu, BTCt * 4, "backward's scratch");
    matmul_backward(bwd->dfch_gelu, g->fcprojw, g->fcprojb, dout, a->fch_gelu, p->fcprojw, B, T, 4 * Ct, C);
    zero_floats(bwd->dfch, BTCt * 4, "backward's scratch");
    gelu_backward(bwd->dfch, a->fch, bwd->dfch_gelu, BTCt * 4);
    zero_floats(dln2, BTC, "backward's scratch");
    matmul_backward(dln2, g->fcw, g->fcb, bwd->dfch, tp_gather(tp, a->ln2, RC), p->fcw, B, T, C, 4 * Ct);
    tp_reduce(tp, dln2, dln2, BTC);  // hook: --tp's partial input gradients added (--sp: this rank's rows)
    TpNormGrads gn = tp_norm_grads(tp, g->ln2w, g->ln2b, C);  // --sp: a part of them, from this rank's rows
    layernorm_backward(bwd->dresidual, gn.w, gn.b, dln2, a->residual2, p->ln2w, a->ln2_mean, a->ln2_rstd, 1, (int)R, C);
    tp_norm_grads_done(tp, &gn, g->ln2w, g->ln2b, C);  // hook
    // attention branch
    dout = tp_gather(tp, bwd->dresidual, RC);  // hook
    zero_floats(datty, BTCt, "backward's scratch");
    matmul_backward(datty, g->attprojw, g->attprojb, dout, a->atty, p->attprojw, B, T, Ct, C);
    if (pol->flash) {  // (adds into dqkv; the matmul attention's backward writes it)
        zero_floats(bwd->dqkv, BTCt * 3, "backward's scratch");
        attention_flash_backward(bwd->dqkv, datty, a->qkv, a->atty, a->lse, B, T, Ct, NHt);
    }
    else { attention_backward(bwd->dqkv, bwd->datt, datty, a->qkv, a->att, B, T, Ct, NHt); }
    zero_floats(dln1, BTC, "backward's scratch");
    matmul_backward(dln1, g->qkvw, g->qkvb, bwd->dqkv, tp_gather(tp, a->ln1, RC), p->qkvw, B, T, C, 3 * Ct);
    tp_reduce(tp, dln1, dln1, BTC);  // hook
    gn = tp_norm_grads(tp, g->ln1w, g->ln1b, C);
    layernorm_backward(bwd->dresidual, gn.w, gn.b, dln1, x, p->ln1w, a->ln1_mean, a->ln1_rstd, 1, (int)R, C);
    tp_norm_grads_done(tp, &gn, g->ln1w, g->ln1b, C);  // hook
}

// ----------------------------------------------------------------------------
// the whole model. The techniques enter at named hooks, one line each: the weights of layer l
// ready (ZeRO-3 gathers them: cpu/zero.h), layer l's forward done (checkpointing and offload keep
// or move its activations: cpu/activations.h), layer l's activations back before its backward,
// layer l's gradients done (ZeRO-2 reduce-scatters them)

// hook: layer l's weights, ready for its forward or backward
static LayerParams layer_weights_ready(GPT2* m, int l) {
    HostStep h = gpt2_host_step(m);
    return layer_params(&m->params, zero_layer_weights_ready(&m->zero, &h, l), &m->config);
}

// layers first..last forward from x into the working set (store: the schedule keeps what it says;
// 0 when a checkpointed segment runs again)
static void forward_layers(GPT2* m, int first, int last, const float* x, int B, int T, int store) {
    int C = m->config.channels, NH = m->config.num_heads;
    for (int l = first; l <= last; l++) {
        LayerParams lp = layer_weights_ready(m, l);
        LayerActs* la = act_layer(m->acts, l);
        block_forward(la, x, &lp, B, T, C, NH, &m->acts->pol, &m->tp);
        if (store) { act_after_layer_forward(m->acts, l, tp_rows(&m->tp, (size_t)B * T) * C); }
        x = la->residual3;
    }
}

// hook: before layer l's backward, its block and its input in the working set (cpu/activations.h);
// a checkpointed segment runs forward again at its last layer
static void layer_activations_ready(GPT2* m, int l, int B, int T) {
    ActRecompute r = act_bring_back(m->acts, l, tp_rows(&m->tp, (size_t)B * T) * m->config.channels);
    if (r.segment >= 0) { forward_layers(m, r.first, r.last, act_segment_input(m->acts, r.segment), B, T, 0); }
}

// the head forward of n tokens, from the last block's output x (n,C): the final LayerNorm into
// lnf (n,C) (statistics into mean, rstd (n)), probabilities into the logits buffer (n,Vp), and
// with targets (n) the losses (n). With loss_scale > 0 (--loss-chunk, training) also the head's
// backward at once: the probabilities become the logits' gradient, d(lnf output) (n,C) is written
// into dlnf and wte's gradient +=
//
// With --tp the classifier is split over the vocabulary (cpu/tensor_parallel.h): a rank's logits are
// its Vp/N columns, the softmax's row maximum and sum are the group's, and the partial d(lnf output)
// of a rank's columns is summed over the group (the hook tp_sum)
static void head_forward(GPT2* m, float* losses, float* mean, float* rstd, float* dlnf, const float* x,
                         const int* targets, int n, float loss_scale) {
    const GPT2Config* c = &m->config;
    int C = c->channels, V = c->vocab_size, Vp = c->padded_vocab_size / m->tp.size;  // --tp: a rank's columns
    const TensorParallel* tp = &m->tp;
    Activations* a = m->acts;
    float *logits = a->logits, *probs = a->logits, *dlogits = a->logits;  // one buffer, three meanings in turn
    layernorm_forward(a->lnf, mean, rstd, x, m->params.lnfw, m->params.lnfb, 1, n, C);
    matmul_forward(logits, a->lnf, m->params.wte, NULL, 1, n, C, Vp);
    if (tp->size > 1) { tp_softmax_forward(tp, probs, logits, n, V, Vp); }
    else { softmax_forward(probs, logits, 1, n, V, Vp); }  // in place
    if (targets == NULL) { return; }
    if (tp->size > 1) { tp_crossentropy_forward(tp, losses, probs, targets, n, Vp); }
    else { crossentropy_forward(losses, probs, targets, 1, n, Vp); }
    if (loss_scale == 0.0f) { return; }
    if (tp->size > 1) { tp_crossentropy_softmax_backward(tp, dlogits, probs, targets, loss_scale, n, V, Vp); }
    else { crossentropy_softmax_backward(dlogits, probs, targets, loss_scale, 1, n, V, Vp); }  // in place
    zero_floats(dlnf, (size_t)n * C, "backward's scratch");
    matmul_backward(dlnf, m->grads.wte, NULL, dlogits, a->lnf, m->params.wte, 1, n, C, Vp);
    tp_sum(tp, dlnf, (size_t)n * C);  // hook: --tp's partial d(lnf output) of a rank's columns added
}

// inputs (B,T) token ids; targets (B,T) or NULL. Leaves the probabilities of the head's last
// K tokens (all of them without --loss-chunk) in acts.logits and, with targets, the per-position
// losses; returns their mean (-1 without targets). loss_scale > 0: gpt2_forward_train's
// --pp (cpu/pipeline.h): the first stage runs the embeddings, the last the head; between them a stage's
// input comes from the previous stage (into a->encoded, where the trainer receives it) and its output
// (the last layer's) goes to the next. Without --pp the one stage does both
static int stage_has_embeddings(const GPT2* m) { return gpt2_holds_tensor(&m->config, 1); }                        // wpe
static int stage_has_head(const GPT2* m) { return gpt2_holds_tensor(&m->config, NUM_PARAMETER_TENSORS - 1); }  // lnfw

// the floats of a message between stages for a forward of (B,T): the residual stream's (B,T,C), with --sp
// this rank's R = B T / N rows of it (each tensor place's pipeline group passes its own rows)
static size_t pp_message_floats(const GPT2* m, int B, int T) { return tp_rows(&m->tp, (size_t)B * T) * m->config.channels; }

// --sp splits the B*T rows over the group: a sample's forward of 1..T tokens that do not split runs on
// T padded up to a multiple of the group's size, token 0 after the text (causal attention: the text's
// positions see none of them; their probabilities are never asked for); the trainer's checks keep that
// within the allocated T (-t a multiple of --tp when training samples)
static float forward(GPT2* m, const int* inputs, const int* targets, int B, int T, float loss_scale);
static float forward_padded(GPT2* m, const int* inputs, int B, int T) {
    int N = m->tp.size, Tp = (T + N - 1) / N * N;
    if (B != 1 || Tp > m->seq_len) {
        fail("--sp: a forward of B=%d x T=%d tokens does not split over the %d ranks' rows, and T padded to %d passes the allocated T=%d\n"
             "  hint: a -t that is a multiple of --tp %d", B, T, N, Tp, m->seq_len, N);
    }
    int* padded = (int*)calloc((size_t)Tp, sizeof(int));  // token 0 after the text
    if (padded == NULL) { fail("out of memory for %d tokens", Tp); }
    memcpy(padded, inputs, (size_t)T * sizeof(int));
    float loss = forward(m, padded, NULL, 1, Tp, 0.0f);
    free(padded);
    return loss;
}

static float forward(GPT2* m, const int* inputs, const int* targets, int B, int T, float loss_scale) {
    const GPT2Config* c = &m->config;
    int L = c->num_layers, C = c->channels;
    if (B > m->batch_size || T > m->seq_len) { fail("forward with (B,T)=(%d,%d) beyond the allocated (%d,%d)", B, T, m->batch_size, m->seq_len); }
    if (m->tp.gathered != NULL && (size_t)B * T % (size_t)m->tp.size != 0 && targets == NULL) { return forward_padded(m, inputs, B, T); }
    Activations* a = m->acts;
    size_t BT = (size_t)B * T;
    HostStep h = gpt2_host_step(m);
    zero_outer_weights_ready(&m->zero, &h);  // hook: wte, wpe, lnf ready
    if (!stage_has_embeddings(m)) {  // --pp: a later stage: a->encoded holds the previous stage's output
    } else if (m->tp.size > 1) {  // --tp: wte split over the vocabulary (cpu/tensor_parallel.h)
        tp_encoder_forward(&m->tp, a->encoded, inputs, m->params.wte, m->params.wpe, B, T, C, c->padded_vocab_size / m->tp.size);
    } else {
        encoder_forward(a->encoded, inputs, m->params.wte, m->params.wpe, B, T, C);
    }
    forward_layers(m, 0, L - 1, a->encoded, B, T, 1);
    if (!stage_has_head(m)) { prof_close(); return 0.0f; }  // --pp: the next stage goes on from the last layer's output
    // the head, K tokens at a time (one chunk of B*T without --loss-chunk), over every row (--sp: gathered)
    int K = a->head_rows < (int)BT ? a->head_rows : (int)BT;
    const float* x = tp_gather(&m->tp, act_layer_input(a, L), tp_rows(&m->tp, BT) * C);
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

// --pp: validation's and a sample's forward (no backward follows) runs the stages in turn: each its
// layers, the activations passed on, the loss the last stage's (and to every stage)
float gpt2_forward(GPT2* m, const int* inputs, const int* targets, int B, int T) {
    if (m->pipeline.world <= 1) { return forward(m, inputs, targets, B, T, 0.0f); }
    int stage = m->pipeline.rank, last = m->pipeline.world - 1;
    int N = m->tp.size, Tsplit = m->tp.gathered != NULL && (size_t)B * T % (size_t)N != 0 && targets == NULL ? (T + N - 1) / N * N : T;
    size_t n = pp_message_floats(m, B, Tsplit);  // --sp: forward_padded's T
    gpt2_pp_slot(m, 0);
    if (stage > 0) { dist_recv_floats(m->acts->encoded, n, stage - 1, m->pipeline); }
    float loss = forward(m, inputs, targets, B, T, 0.0f);
    if (stage < last) { dist_send_floats(act_layer_input(m->acts, m->config.num_layers), n, stage + 1, m->pipeline); }
    dist_broadcast_floats_over(&loss, 1, last, m->pipeline);
    m->mean_loss = loss;
    return loss;
}

float gpt2_forward_train(GPT2* m, const int* inputs, const int* targets, int B, int T, float loss_scale) {
    return forward(m, inputs, targets, B, T, m->acts->pol.loss_chunk > 0 ? loss_scale : 0.0f);
}

// the (Vp) probabilities of one position of the last forward: one the head still holds (with
// --loss-chunk, the last chunk's: sampling asks for the last position)
// the row of probabilities this stage's head holds: its own (Vp), or (--tp) the group's Vp/N columns
// gathered whole (every rank of the group asks alike)
static const float* probs_row(GPT2* m, int position) {
    const Activations* a = m->acts;
    if (m->tp.size == 1) { return a->logits + (size_t)(position - a->probs_first) * m->config.padded_vocab_size; }
    int Vr = m->config.padded_vocab_size / m->tp.size;
    int* counts = (int*)malloc_check((size_t)m->tp.size * sizeof(int));
    for (int q = 0; q < m->tp.size; q++) { counts[q] = Vr; }
    memcpy(m->tp_probs + (size_t)m->tp.rank * Vr, a->logits + (size_t)(position - a->probs_first) * Vr, (size_t)Vr * sizeof(float));
    dist_allgather_floats(m->tp_probs, counts, m->tensor);
    free(counts);
    return m->tp_probs;
}

const float* gpt2_probs(GPT2* m, int position) {
    const Activations* a = m->acts;
    int last = m->pipeline.world - 1, head_here = m->pipeline.rank == last;  // --pp: the last stage holds them
    if (head_here && (a->probs_first < 0 || position < a->probs_first || position >= a->probs_end)) {
        fail("gpt2_probs(%d): the last forward's head holds the probabilities of positions %d..%d only (-1: none, after a backward)\n"
             "  hint: with --loss-chunk, ask for a position of the last chunk (sampling: the last position)",
             position, a->probs_first, a->probs_end - 1);
    }
    if (m->pipeline.world == 1) { return probs_row(m, position); }
    // --pp: the last stage's row, to every stage (every rank asks alike)
    size_t Vp = (size_t)m->config.padded_vocab_size;
    if (head_here) { memcpy(m->pp_probs, probs_row(m, position), Vp * sizeof(float)); }
    dist_broadcast_floats_over(m->pp_probs, Vp, last, m->pipeline);
    return m->pp_probs;
}

// --pp: the activations of held micro-batch `slot` in hand for the next forward or backward
void gpt2_pp_slot(GPT2* m, int slot) {
    if (slot < 0 || slot >= m->num_held) { fail("gpt2_pp_slot(%d): the stage holds %d micro-batches (a bug)", slot, m->num_held); }
    m->acts = &m->held[slot];
}

// the (B,T,C) buffer a message reads or fills: the stage input (the embeddings' place), the stage
// output (the last layer's), the gradient of either (the backward's)
static float* pp_buffer(GPT2* m, PpOp op) {
    if (op == PP_RECV_ACT) { return m->acts->encoded; }
    if (op == PP_SEND_ACT) { return (float*)act_layer_input(m->acts, m->config.num_layers); }
    return m->bwd.dresidual;  // PP_RECV_GRAD, PP_SEND_GRAD
}

// a message of the stage's list over MPI, each in its micro-batch's slot
void gpt2_pp_message(GPT2* m, PpAction a, const PpAction* next, int slots) {
    int stage = m->pipeline.rank;
    size_t n = pp_message_floats(m, m->batch_size, m->seq_len);
    gpt2_pp_slot(m, pp_act_slot(a.micro, slots));
    float* buf = pp_buffer(m, a.op);
    if (pp_is_recv(a.op)) {
        dist_recv_floats(buf, n, stage + pp_peer_offset(a.op), m->pipeline);
    } else if (next == NULL) {
        dist_send_floats(buf, n, stage + pp_peer_offset(a.op), m->pipeline);
    } else {
        gpt2_pp_slot(m, pp_act_slot(next->micro, slots));
        dist_sendrecv_floats(buf, n, stage + pp_peer_offset(a.op), pp_buffer(m, next->op), n, stage + pp_peer_offset(next->op), m->pipeline);
    }
}

void gpt2_zero_grad(GPT2* m) {
    zero_step_begin(&m->zero);
    zero_floats(m->grads_memory, m->grad_floats, "gradients");  // ZeRO-2: the working buffer is zero already
    prof_close();
}

// the classifier's backward over the whole batch: the probabilities the forward left become the
// logits' gradient, d(lnf output) goes into dlnf (B,T,C) and wte's gradient +=
static void head_backward(GPT2* m, float* dlnf, const int* targets, int B, int T, float loss_scale) {
    const GPT2Config* c = &m->config;
    const TensorParallel* tp = &m->tp;
    int Vp = c->padded_vocab_size / tp->size;  // --tp: a rank's columns
    Activations* a = m->acts;
    float *probs = a->logits, *dlogits = a->logits;
    if (tp->size > 1) { tp_crossentropy_softmax_backward(tp, dlogits, probs, targets, loss_scale, B * T, c->vocab_size, Vp); }
    else { crossentropy_softmax_backward(dlogits, probs, targets, loss_scale, B, T, c->vocab_size, Vp); }  // in place
    a->probs_first = -1;
    zero_floats(dlnf, (size_t)B * T * c->channels, "backward's scratch");
    matmul_backward(dlnf, m->grads.wte, NULL, dlogits, a->lnf, m->params.wte, B, T, c->channels, Vp);
    tp_sum(tp, dlnf, (size_t)B * T * c->channels);  // hook: --tp's partial d(lnf output) added
}

// accumulates into the gradients d(loss_scale * sum of position losses) for the batch
// of the last forward; loss_scale is 1/(B*T*accumulation steps) for a mean loss.
void gpt2_backward(GPT2* m, const int* inputs, const int* targets, int B, int T, float loss_scale) {
    const GPT2Config* c = &m->config;
    int L = c->num_layers, C = c->channels, NH = c->num_heads;
    Activations* a = m->acts;
    BackwardBuffers* bwd = &m->bwd;
    HostStep h = gpt2_host_step(m);
    float* dlnf = bwd->dbtc;  // (B,T,C): the head reads every row
    size_t R = tp_rows(&m->tp, (size_t)B * T), first = tp_first_row(&m->tp, (size_t)B * T);  // --sp: this rank's rows
    if (stage_has_head(m)) {  // --pp: else bwd->dresidual holds the next stage's gradient of this stage's output
        if (a->pol.loss_chunk > 0) { act_take_head_grads(&a->head_grad_scale, loss_scale); }  // --loss-chunk: done in forward
        else { head_backward(m, dlnf, targets, B, T, loss_scale); }
        zero_floats(bwd->dresidual, R * C, "backward's scratch");
        TpNormGrads gn = tp_norm_grads(&m->tp, m->grads.lnfw, m->grads.lnfb, C);  // --sp: a part of them, from this rank's rows
        layernorm_backward(bwd->dresidual, gn.w, gn.b, dlnf + first * C, act_layer_input(a, L), m->params.lnfw, a->lnf_mean + first,
                           a->lnf_rstd + first, 1, (int)R, C);
        tp_norm_grads_done(&m->tp, &gn, m->grads.lnfw, m->grads.lnfb, C);  // hook
    }
    for (int l = L - 1; l >= 0; l--) {
        layer_activations_ready(m, l, B, T);  // hook
        LayerParams lp = layer_weights_ready(m, l);  // hook
        LayerGrads lg = layer_grads(&m->grads, zero_layer_grads_at(&m->zero, l), &m->config);
        block_backward(bwd, act_layer(a, l), act_layer_input(a, l), &lp, &lg, B, T, C, NH, &a->pol, &m->tp);
        zero_layer_grads_done(&m->zero, &h, l);  // hook
    }
    if (!stage_has_embeddings(m)) {  // --pp: bwd->dresidual is d(stage input), for the previous stage
    } else if (m->tp.size > 1) {  // --tp: wte's rows of this rank, from d(embeddings) of every row (--sp: gathered)
        tp_encoder_backward(&m->tp, m->grads.wte, m->grads.wpe, tp_gather(&m->tp, bwd->dresidual, R * C), inputs, B, T, C,
                            c->padded_vocab_size / m->tp.size);
    }
    else { encoder_backward(m->grads.wte, m->grads.wpe, bwd->dresidual, inputs, B, T, C); }
    prof_close();
    zero_outer_grads_done(&m->zero, &h);  // hook
}

// ----------------------------------------------------------------------------
// the end of the step: the gradients summed over the ranks, their norm, the update. The
// exchanges and the sharded updates are cpu/host_step.h's (--zero: cpu/zero.h says which).

void gpt2_reduce_grads(GPT2* m) {
    HostStep h = gpt2_host_step(m);
    if (m->dist.world > 1 && !zero_shards_grads(m->zero.stage)) { prof_mark(PROF_COLLECTIVE, prof_bytes(m->num_parameters * sizeof(float)), "MPI gradient sums"); }
    host_reduce_grads(&h);
    if (m->pair.world > 1) {  // --pp: wte's two parts, the embedding's (the first stage) and the classifier's (the last)
        size_t n;
        float* wte = host_slice_grads(&h, 0, &n);
        prof_mark(PROF_COLLECTIVE, prof_bytes((double)n * sizeof(float)), "--pp: wte's pair");
        pp_sum_pair(wte, n, m->pair);
    }
    prof_close();
}
float gpt2_grad_norm(GPT2* m) {
    HostStep h = gpt2_host_step(m);
    prof_mark(PROF_GRAD_NORM, prof_grad_norm(m->num_parameters), "all gradients");
    // the whole model's gradients here (summed over the ranks already), ZeRO's blocks, or --tp's slices (cpu/host_step.h)
    float norm = host_grad_norm(&h);
    prof_close();
    return norm;
}
void gpt2_update(GPT2* m, const StepConfig* s, float grad_norm) {
    HostStep h = gpt2_host_step(m);
    prof_mark(PROF_OPTIMIZER, prof_optimizer(m->num_parameters, m->opt_floats, sizeof(float)), "%s", OPTIMIZER_NAMES[m->optimizer]);
    if (m->optimizer == OPT_ADAMW && m->zero.stage == ZERO_0 && m->state_format == QSTATE_FP32) {  // the whole model, fp32: AdamW directly
        host_clip_grads(m->grads_memory, m->num_parameters, s->grad_clip, grad_norm);
        adamw_step(m->params_memory, m->grads_memory, m->opt_memory, &m->config, &s->hyper.adamw, s->t);
    } else {
        host_update(&h, s, grad_norm);  // Adafactor, CAME; ZeRO; bf16 or 8-bit state (cpu/host_step.h)
    }
    prof_close();
    zero_step_done(&m->zero, &h, s->t);
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
