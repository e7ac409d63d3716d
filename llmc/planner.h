/*
planner.h: how many bytes a run needs, by category, from closed-form formulas of
the model shape, the batch and the flags. This is deliberately separate code from
the allocations of the backends: the trainer prints the plan at start-up and the
measured high-water marks (memory.h) after the first step, and the tests check
that the two agree exactly. `train_gpt --plan` prints it without training.

What differs between backends (bytes per weight and per gradient, and the layout
of one layer's activations: which tensors, in which precision) the backend states
in a BackendLayout; the planner adds up the rest: the optimizer state (the same
fp32 layout everywhere: opt_layout.h), and how many layer blocks, shared buffers
and kept tensors each activation policy keeps, and where.

Notation: L layers, C channels, NH heads, Vp padded vocabulary, maxT positions,
B batch, T sequence length, P parameters = Vp*C + maxT*C + L*(12C^2 + 13C) + 2C.
Under data parallelism every number is per rank: gradients are all-reduced or
reduce-scattered in place (no extra buffer; a GPU's ZeRO-1 packs a layer at a time: its
pack is counted); ZeRO-1 cuts the optimizer state, ZeRO-2 the gradients too
(plan_zero2_gradients: its buffers), ZeRO-3 the weights (plan_zero3_weights: a GPU's
prefetch buffer and checkpoint staging too).

The plan also counts what a policy costs in time: the FLOPs it recomputes and the
bytes it moves (selective recompute through device memory, offload between device
and host, the gradient exchange between ranks). plan_step_cost turns them into a
step time relative to plain training at a backend's rates (CostModel), and
plan_fit says whether the plan fits a memory budget: what --plan's budget search
(plan_search.h) sorts by.
*/
#ifndef LLMC_PLANNER_H
#define LLMC_PLANNER_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "memory.h"
#include "model_config.h"
#include "act_policy.h"
#include "opt_layout.h"

// what one backend's tensors take, in bytes, for one (B,T); from its own size tables, each size with
// the padding of that backend's alignment (the GPU carves every tensor at 256 bytes, train_gpt.cu's
// TENSOR_ALIGN; the CPU's tensors lie back to back), so that the plan equals what is allocated
typedef struct {
    size_t param_bytes;      // per weight (CPU: 4, fp32)
    size_t grad_bytes;       // per gradient
    size_t layer;            // one layer's block of kept activations, keeping everything
    size_t layer_gelu;       // of which the GELU output: --recompute gelu keeps one, shared
    size_t layer_att;        // of which the attention weights: --recompute attn keeps one, shared
                             // (flash attention: 0, its block keeps the rows' log-sum-exp only)
    size_t residual;         // one residual-stream tensor (B,T,C): the embeddings, a kept segment input
    size_t head;             // the final LayerNorm output and statistics, logits, losses: for K tokens
                             // at a time (--loss-chunk; K = B*T without), act_policy.h's "head in chunks"
    size_t backward;         // backward's working buffers, one layer's worth
    const char* layer_formula;     // A in elements, e.g. "16BTC + 4BT + B NH T^2"
    const char* backward_formula;  // the backward buffers in bytes, e.g. "4(13BTC + B NH T^2)"
    size_t backend_scratch;  // the backend's own scratch: a GPU's reduction and attention buffers, the batch on the device
    size_t sp_gathered;      // --sp: the one (B,T,C) buffer where the group's rows meet, and 2C floats (bytes); 0 without
    size_t host_copy_bytes;  // per weight: a GPU's host copy for checkpoints (CPU: 0, its weights are host memory)
    int host_copies_opt;     // 1: the optimizer state has a host copy too
    size_t working_bytes;    // per weight: the copy the kernels read, all a GPU keeps with --offload optimizer
    const char* head_formula;  // the head in bytes, e.g. "4(3BT + K(C + Vp))"
    int head_rows;           // K: the head's rows of logits (B*T, or a --loss-chunk's tokens)
    int zero3_prefetch;      // 1: ZeRO-3 gathers the next layer into a second layer buffer while one computes (the GPU; CPU 0)
    int lowp_staging;        // 1: Adafactor's and CAME's first moment in bf16 or 8 bits is updated through an fp32
                             // copy of the largest slice part (the GPU: cuda/factored_lowp.cuh; CPU 0: block by block)
} BackendLayout;

typedef struct {
    int B, T;              // micro-batch shape
    int num_loaders;       // data loaders (train, and val if any)
    int optimizer;         // OptimizerKind: 0 AdamW, 1 Adafactor, 2 CAME
    int use_beta1;         // Adafactor keeps a first moment
    ActPolicy act;         // --recompute, --offload activations
    OptOffload offload_optimizer;  // --offload optimizer[,gradients] (act_policy.h)
    int world;             // data-parallel ranks (0 or 1: one process)
    int zero;              // ZeroStage (distributed.h): 1 = optimizer state sharded over the ranks, 2 = and the gradients, 3 = and the weights
    BackendLayout layout;  // the backend's bytes (train_gpt.c: gpt2_layout)
    int state_format;      // QStateFormat (--optimizer-state): the moments in fp32, bf16 or 8 bits
    int pp_held;           // --pp: the micro-batches whose activations the stage holds at once (llmc/pipeline.h); 0 or 1: one
    int pp_micro;          // --pp: the micro-batches of a step, whose tokens the trainer keeps; 0 without
} PlanInputs;

enum { PLAN_ADAMW = 0, PLAN_ADAFACTOR = 1, PLAN_CAME = 2 };  // = OptimizerKind (optimizers.h)

#define PLAN_FORMULA_LEN 64

typedef struct {
    size_t bytes[NUM_MEM_CATEGORIES];
    char formula[NUM_MEM_CATEGORIES][PLAN_FORMULA_LEN];  // how bytes[] was computed, for the table
    size_t layer_bytes;      // A: one layer's block of kept activations
    char layer_formula[PLAN_FORMULA_LEN];  // A in elements
    size_t residual_bytes;   // R: one residual-stream tensor (B,T,C)
    size_t head_bytes;       // the final LayerNorm, logits and losses
    char head_formula[PLAN_FORMULA_LEN];  // the head in bytes, with K's value
    char act_policy[128];    // the policy, in words
    double recompute_flops;  // extra forward FLOPs per micro-step (checkpointing, selective recompute)
    double step_flops;       // training FLOPs per micro-step without recompute, 6P + 12LTC per token
    double recompute_bytes;  // selective recompute's extra device-memory traffic per micro-step
    double offload_bytes;    // bytes copied between device and host per micro-step (--offload)
    double step_offload_bytes;  // and per optimizer step (--offload optimizer: gradients down, weights up)
    double host_update_bytes;   // host memory the CPU's update reads and writes per step (--offload optimizer)
    double exchange_bytes;   // bytes a rank sends in the gradient exchange per optimizer step (ranks > 1)
    double exchange_micro_bytes;  // ... and per micro-step (--zero 2 and 3 reduce-scatter every micro-step's gradients,
                                  // --zero 3 gathers every layer's weights for its forward and its backward)
    double pp_bubble;        // --pp: the time a stage waits, over its compute: (N-1)/m (llmc/pipeline.h); 0 without
} MemPlan;

// appends printf-style text to a formula
static void plan_append(char* f, const char* fmt, ...) {
    size_t n = strlen(f);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f + n, PLAN_FORMULA_LEN - n, fmt, ap);
    va_end(ap);
}

// --optimizer-state bf16, 8bit: the moments (AdamW's m and v; Adafactor's and CAME's M) of each slice
// in qstate_moment_floats(format, n) floats, a slice under QSTATE_MIN_ELEMENTS (4,096) elements fp32
// under 8bit, and under 8bit ZeRO's parts cut on block boundaries: counted slice by slice from
// opt_layout.h's layout, the one the trainer allocates (no closed form has the per-slice rounding)
static void plan_lowp_state(MemPlan* p, const GPT2Config* cfg, const PlanInputs* in, size_t N) {
    QStateFormat f = (QStateFormat)in->state_format;
    p->bytes[MEM_OPTIMIZER] = optimizer_state_floats_as(cfg, (OptimizerKind)in->optimizer, in->use_beta1, (int)N, f) * sizeof(float);
    const char* moments = in->optimizer == PLAN_ADAMW ? "m, v" : "M";
    if (f == QSTATE_BF16) {
        snprintf(p->formula[MEM_OPTIMIZER], PLAN_FORMULA_LEN, "bf16 %s: 2 bytes each a weight (of %s)", moments, N > 1 ? "E" : "Pu");
    } else {
        snprintf(p->formula[MEM_OPTIMIZER], PLAN_FORMULA_LEN, "8bit %s: 1 + 4/256 bytes each a weight, n < 4096: 4", moments);
    }
    if (in->optimizer != PLAN_ADAMW) { plan_append(p->formula[MEM_OPTIMIZER], "; 2nd moments fp32"); }
}

// the floats of the fp32 copy through which a GPU updates Adafactor's and CAME's first moment in bf16 or 8
// bits (BackendLayout.lowp_staging; not with --offload optimizer, whose host updates it block by block)
static size_t plan_lowp_staging_floats(const GPT2Config* cfg, const PlanInputs* in) {
    if (!in->layout.lowp_staging || in->state_format == QSTATE_FP32 || in->optimizer == PLAN_ADAMW
        || in->offload_optimizer != OPT_OFFLOAD_NONE) {
        return 0;
    }
    int N = in->zero >= 1 && in->world > 1 ? in->world : 1;
    return lowp_largest_part_floats(cfg, N, (QStateFormat)in->state_format);
}

// the optimizer state of one rank (opt_layout.h's layout): fp32 here, bf16 and 8-bit moments in plan_lowp_state
static void plan_optimizer_state(MemPlan* p, const GPT2Config* cfg, const PlanInputs* in) {
    size_t L = cfg->num_layers, C = cfg->channels, maxT = cfg->max_seq_len, F = sizeof(float);
    // Every optimizer keeps state per slice (opt_layout.h): each layer's slice of a per-layer
    // tensor, wte over its V real rows. Under ZeRO-1 with N ranks a rank keeps state for
    // ceil(units / N) units of each slice (rows of a matrix, elements of a vector); write
    // [x] = ceil(x / N) (= x for one process). Matrices: wte (V,C), wpe (maxT,C), per layer
    // qkvw (3C,C), attprojw (C,C), fcw (4C,C), fcprojw (C,4C). Vectors: per layer four
    // LayerNorm vectors and attprojb, fcprojb (C each), qkvb (3C), fcb (4C); lnfw, lnfb (C).
    //   E        = elements of a rank's blocks     (= Pu = P - (Vp - V)C, the unpadded weights, for N = 1)
    //   factored = sum of [rows] + [cols], matrices (= V + maxT + 2C + 16LC for N = 1)
    //   vectors  = sum of [n], vectors            (= 13LC + 2C for N = 1)
    size_t N = (in->zero >= 1 && in->world > 1) ? (size_t)in->world : 1;
    size_t V = cfg->vocab_size;
    size_t cV = (V + N - 1) / N, cT = (maxT + N - 1) / N, c1 = (C + N - 1) / N;
    size_t c3 = (3 * C + N - 1) / N, c4 = (4 * C + N - 1) / N;
    size_t vectors = L * (6 * c1 + c3 + c4) + 2 * c1;
    size_t E = (cV + cT) * C + L * (c3 * C + c1 * C + c4 * C + c1 * 4 * C) + vectors;
    size_t factored = cV + cT + 2 * c1 + L * (c3 + c1 + c4 + c1 + 3 * c1 + c4);  // [rows] + [cols] of each
    int sharded = N > 1;
    const char* formula;
    if (in->optimizer == PLAN_ADAFACTOR) {
        p->bytes[MEM_OPTIMIZER] = (factored + vectors + (in->use_beta1 ? E : 0)) * F;
        formula = sharded ? (in->use_beta1 ? "Adafactor, ZeRO-1 block: 4(factored + vectors + E)" : "Adafactor, ZeRO-1 block: 4(factored + vectors)")
                          : (in->use_beta1 ? "Adafactor: 4(V + maxT + 4C + 29LC + Pu)" : "Adafactor: 4(V + maxT + 4C + 29LC)");
    } else if (in->optimizer == PLAN_CAME) {
        p->bytes[MEM_OPTIMIZER] = (E + 2 * factored + vectors) * F;
        formula = sharded ? "CAME, ZeRO-1 block: 4(E + 2 factored + vectors)" : "CAME: 4(Pu + 2(V + maxT + 2C + 16LC) + 13LC + 2C)";
    } else {
        p->bytes[MEM_OPTIMIZER] = 2 * E * F;
        formula = sharded ? "AdamW m, v, ZeRO-1 block: 8E" : "AdamW m, v: 8Pu";
    }
    snprintf(p->formula[MEM_OPTIMIZER], PLAN_FORMULA_LEN, "%s", formula);
    if (in->state_format != QSTATE_FP32) { plan_lowp_state(p, cfg, in, N); }
    else if (gpt2_tp(cfg) > 1 || gpt2_pp(cfg) > 1) {  // --tp, --pp: a rank's slices, counted slice by slice from opt_layout.h's layout
        p->bytes[MEM_OPTIMIZER] = optimizer_state_floats_as(cfg, (OptimizerKind)in->optimizer, in->use_beta1, (int)N, QSTATE_FP32) * F;
        snprintf(p->formula[MEM_OPTIMIZER], PLAN_FORMULA_LEN, "%s of a rank's %s (opt_layout.h's count)",
                 in->optimizer == PLAN_ADAFACTOR ? "Adafactor" : in->optimizer == PLAN_CAME ? "CAME" : "AdamW m, v",
                 gpt2_tp(cfg) > 1 ? "--tp slices" : "stage's tensors");
    }
}

// A layer has Pl = 12C^2 + 13C weights, the rest Pr = (Vp + maxT)C + 2C (--tp N: a rank's slices,
// (12C^2 + 7C)/N + 6C and (Vp/N + maxT)C + 2C)
static size_t plan_outer_weights(const GPT2Config* c) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(sizes, c);
    return sizes[0] + sizes[1] + sizes[NUM_PARAMETER_TENSORS - 2] + sizes[NUM_PARAMETER_TENSORS - 1];  // wte, wpe, lnfw, lnfb
}
static size_t plan_layer_weights(const GPT2Config* c) {
    GPT2Config one = *c;
    one.num_layers = 1;
    return gpt2_num_parameters(&one) - plan_outer_weights(c);
}
// A rank's shard under ZeRO-2 and 3 (opt_layout.h's shard_block_offsets, shard_layout): its padded
// blocks of every slice, E floats, as the ZeRO-1 state counts them ([x] = ceil(x / N)); Eℓ of them
// one layer's 12 slices; and the working buffer shaped as a one-layer model, Vp C + maxT C + 12C^2 + 15C
typedef struct { size_t E, El, working; } PlanShard;

static PlanShard plan_shard(const GPT2Config* cfg, size_t N, int state_format) {
    size_t L = cfg->num_layers, C = cfg->channels, maxT = cfg->max_seq_len;
    size_t V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    size_t cV = (V + N - 1) / N, cT = (maxT + N - 1) / N, c1 = (C + N - 1) / N;
    size_t c3 = (3 * C + N - 1) / N, c4 = (4 * C + N - 1) / N;
    PlanShard s;
    s.El = c3 * C + c1 * C + c4 * C + c1 * 4 * C + 6 * c1 + c3 + c4;
    s.E = (cV + cT) * C + 2 * c1 + L * s.El;
    s.working = Vp * C + maxT * C + 12 * C * C + 15 * C;
    // 8-bit slices' parts cut on block boundaries, --tp's slices (one layer of a rank's slices in the
    // working buffer) and --pp's stage (its outer tensors): opt_layout.h's own count
    if ((state_format == QSTATE_8BIT && N > 1) || gpt2_tp(cfg) > 1 || gpt2_pp(cfg) > 1) {
        ShardLayout z = shard_layout_as(cfg, (int)N, (QStateFormat)state_format);
        s.E = z.shard;
        s.El = z.layer_part;
        s.working = z.working;
    }
    return s;
}

// ZeRO-2 (both backends): a rank keeps its shard of the reduced gradients, the backward's own
// gradients in the working buffer, and one layer's gradients packed rank by rank for its
// reduce-scatter (N Eℓ). ZeRO-1 (both backends, not with --offload optimizer, whose exchange is a slice at a
// time): the model's gradients and the pack
static void plan_zero2_gradients(MemPlan* p, const GPT2Config* cfg, const PlanInputs* in) {
    PlanShard z = plan_shard(cfg, in->world, in->state_format);
    size_t N = in->world, F = sizeof(float);
    if (in->zero == 1) {
        p->bytes[MEM_GRADIENTS] += N * z.El * F;
        snprintf(p->formula[MEM_GRADIENTS], PLAN_FORMULA_LEN, "ZeRO-1: %zuP + 4(%zu layer blocks: the pack)", in->layout.grad_bytes, N);
        return;
    }
    p->bytes[MEM_GRADIENTS] = (z.E + z.working + N * z.El) * F;
    snprintf(p->formula[MEM_GRADIENTS], PLAN_FORMULA_LEN, "ZeRO-2: 4(E + one-layer model + %zu layer blocks)", N);
}

// the floats of the largest slice, or of wte's padded rows (which checkpoints move as one run)
static size_t plan_largest_slice(const GPT2Config* cfg) {
    size_t C = cfg->channels, V = cfg->vocab_size, gap = cfg->padded_vocab_size - V, most = V;
    size_t rows[] = {gap, (size_t)cfg->max_seq_len, 4 * C};  // wte's padded rows, wpe, fcw and fcprojw
    for (int i = 0; i < 3; i++) { most = rows[i] > most ? rows[i] : most; }
    return most * C;
}

// ZeRO-3: ZeRO-2's gradients, and of the weights a rank keeps its shard (E; the GPU: fp32 master and
// the working precision's, param_bytes a weight, or with --offload optimizer the latter only) and the
// working copy the kernels read, shaped as a one-layer model (wte, wpe, lnf whole, one layer at a
// time), the GPU's with a second layer buffer (Pl) for the next layer's gather (zero3_prefetch); a
// layer's gather goes through the gradients' pack, and checkpoints move the weights a slice at a time (the CPU: through the working copy; a
// GPU: through the gradients' working buffer and a host copy of the largest slice, or of wte's
// padded rows, in place of the whole model's): the whole model is never in one place
static void plan_zero3_weights(MemPlan* p, const GPT2Config* cfg, const PlanInputs* in) {
    PlanShard z = plan_shard(cfg, in->world, in->state_format);
    const BackendLayout* lay = &in->layout;
    size_t prefetch = lay->zero3_prefetch ? plan_layer_weights(cfg) : 0;
    size_t shard_bytes = in->offload_optimizer != OPT_OFFLOAD_NONE ? lay->working_bytes : lay->param_bytes;  // no fp32 master offloaded
    p->bytes[MEM_PARAMETERS] = z.E * shard_bytes + (z.working + prefetch) * lay->working_bytes;
    if (prefetch > 0) {
        snprintf(p->formula[MEM_PARAMETERS], PLAN_FORMULA_LEN, "ZeRO-3: %zuE + %zu(one-layer model + Pl)", shard_bytes,
                 lay->working_bytes);
    } else {
        snprintf(p->formula[MEM_PARAMETERS], PLAN_FORMULA_LEN, "ZeRO-3: %zu(E + one-layer model)", shard_bytes);
    }
    if (lay->host_copy_bytes > 0) {
        p->bytes[MEM_HOST_COPIES] = plan_largest_slice(cfg) * lay->host_copy_bytes + (lay->host_copies_opt ? p->bytes[MEM_OPTIMIZER] : 0);
        snprintf(p->formula[MEM_HOST_COPIES], PLAN_FORMULA_LEN, "ZeRO-3: the largest slice + optimizer state");
    }
}

// --offload optimizer (ZeRO-Offload): the device keeps the working weights and the fp32
// gradients; host memory the fp32 master weights, the step's gradients, the optimizer state, and
// two staging buffers the size of the larger of a layer's weights and the rest's, through which
// new weights come up (and with ",gradients" each micro-step's gradients come down). With
// ",gradients" the device keeps only the gradients of two layers (one computing, one on its way
// to the host) and of the rest (wte, wpe, lnf: wte's builds up over the whole backward).
// Under ZeRO-2 and 3 (the offloaded shard, train_gpt.cu) a rank offloads its shard: the host keeps
// its E floats of the master weights and of the gradients, staging buffers of El (the new weights go
// up a layer's blocks at a time) and a copy of the largest slice, through which checkpoints move the
// weights; the device ZeRO-2's or 3's buffers without an fp32 master (ZeRO-2: with a floatX shard
// the new weights come up into)
static void plan_offload_optimizer(MemPlan* p, const GPT2Config* c, size_t P, const PlanInputs* in) {
    const BackendLayout* lay = &in->layout;
    OptOffload what = in->offload_optimizer;
    size_t F = sizeof(float), Pl = plan_layer_weights(c), Pr = plan_outer_weights(c);
    int shard = in->zero >= 2 && in->world > 1;
    PlanShard z = plan_shard(c, in->world, in->state_format);
    size_t host = shard ? z.E : P;  // master weights and gradients in host memory
    size_t staging = shard ? z.El : Pl > Pr ? Pl : Pr;  // the shard's weights go up a layer's blocks at a time
    if (shard && in->zero == 2) {
        p->bytes[MEM_PARAMETERS] = (P + host) * lay->working_bytes;
        snprintf(p->formula[MEM_PARAMETERS], PLAN_FORMULA_LEN, "%zu(P + E): working copy, shard up (master on the host)",
                 lay->working_bytes);
    } else if (!shard) {
        p->bytes[MEM_PARAMETERS] = P * lay->working_bytes;
        snprintf(p->formula[MEM_PARAMETERS], PLAN_FORMULA_LEN, "%zuP: working copy (fp32 master on the host)", lay->working_bytes);
    }  // ZeRO-3: plan_zero3_weights' shard, working copy and layer buffer, with no fp32 master
    if (what == OPT_OFFLOAD_GRADS) {
        p->bytes[MEM_GRADIENTS] = (2 * Pl + Pr) * F;
        snprintf(p->formula[MEM_GRADIENTS], PLAN_FORMULA_LEN, "4(2Pl + Pr): two layers' and the rest's");
    }
    p->bytes[MEM_OPT_HOST] = (2 * host + 2 * staging) * F + p->bytes[MEM_OPTIMIZER];
    snprintf(p->formula[MEM_OPT_HOST], PLAN_FORMULA_LEN, "%s + state: %.32s", shard ? "4(2E + 2El)" : "4(2P + 2max(Pl, Pr))",
             p->formula[MEM_OPTIMIZER]);
    p->bytes[MEM_OPTIMIZER] = 0;
    snprintf(p->formula[MEM_OPTIMIZER], PLAN_FORMULA_LEN, "in host memory: --offload optimizer");
    p->bytes[MEM_HOST_COPIES] = shard ? plan_largest_slice(c) * F : 0;
    snprintf(p->formula[MEM_HOST_COPIES], PLAN_FORMULA_LEN, shard ? "the largest slice (checkpoints)"
                                                                  : "none: master weights and state are host memory");
    // what moves (the step's cost): the fp32 gradients down once a step (",gradients": every
    // micro-step's), the new working weights up; the CPU's update reads and writes its bytes once
    double grads = (double)host * F, up = (double)host * lay->working_bytes;
    if (what == OPT_OFFLOAD_GRADS) { p->offload_bytes += grads; }
    p->step_offload_bytes = (what == OPT_OFFLOAD_GRADS ? 0.0 : grads) + up;
    p->host_update_bytes = 2.0 * p->bytes[MEM_OPT_HOST];
}

// cfg: the model, or with --tp (cfg->tp = N > 1) a rank's slices of it, whose P, activations and
// FLOPs are a rank's; in.world counts the data-parallel ranks (ZeRO's)
static MemPlan plan_memory(const GPT2Config* cfg, PlanInputs in) {
    size_t L = cfg->num_layers, C = cfg->channels, N_tp = (size_t)gpt2_tp(cfg);
    size_t B = in.B, T = in.T, BT = B * T;
    size_t P = gpt2_num_parameters(cfg);  // Vp C + maxT C + L(12C^2 + 13C) + 2C; --tp: a rank's slices
    const BackendLayout* lay = &in.layout;
    MemPlan p;
    p.bytes[MEM_PARAMETERS] = P * lay->param_bytes;
    snprintf(p.formula[MEM_PARAMETERS], PLAN_FORMULA_LEN, "%zuP", lay->param_bytes);
    int tp_staging_on_host = N_tp > 1 && lay->host_copy_bytes > 0;  // a GPU's: beside its host copies (at the end)
    if (N_tp > 1 && !tp_staging_on_host) {  // --tp: a split tensor's layer whole (4C^2), through which checkpoints move the weights
        p.bytes[MEM_PARAMETERS] += 4 * C * C * lay->param_bytes;
        snprintf(p.formula[MEM_PARAMETERS], PLAN_FORMULA_LEN, "%zu(P + 4C^2): a rank's --tp slices, a layer whole", lay->param_bytes);
    }
    int pp_staging_on_host = gpt2_pp(cfg) > 1 && lay->host_copy_bytes > 0;  // a GPU's: beside its host copies (at the end)
    if (gpt2_pp(cfg) > 1 && !pp_staging_on_host) {  // --pp: the stage's tensors, and a 4C^2 piece of the whole model as checkpoints move it (cpu/pipeline.h)
        p.bytes[MEM_PARAMETERS] += 4 * C * C * lay->param_bytes;
        snprintf(p.formula[MEM_PARAMETERS], PLAN_FORMULA_LEN, "%zu(P + 4C^2): the stage's tensors, a piece in transit", lay->param_bytes);
    }
    p.bytes[MEM_GRADIENTS] = P * lay->grad_bytes;
    snprintf(p.formula[MEM_GRADIENTS], PLAN_FORMULA_LEN, "%zuP", lay->grad_bytes);
    int zero_pack = in.zero >= 2 || (in.zero == 1 && in.offload_optimizer == OPT_OFFLOAD_NONE);
    if (zero_pack && in.world > 1) { plan_zero2_gradients(&p, cfg, &in); }
    plan_optimizer_state(&p, cfg, &in);
    // A, one layer's block (the backend's layout); selective recompute drops the GELU output
    // and the attention weights from it and keeps one shared buffer of each instead. The
    // embedding output (one residual tensor R) is layer 0's input. Checkpointing keeps
    // segments - 1 more segment inputs (R each); offload moves them (or, without
    // checkpointing, every layer's block but the last three) to the host and keeps two staging
    // buffers for segment inputs on their way back. Then the head: final LayerNorm, logits, losses.
    const ActPolicy* ap = &in.act;
    size_t R = lay->residual, head = lay->head;
    size_t A = lay->layer - (ap->gelu ? lay->layer_gelu : 0) - (ap->attn ? lay->layer_att : 0);
    size_t shared = (ap->gelu ? lay->layer_gelu : 0) + (ap->attn ? lay->layer_att : 0);
    size_t slots = act_num_slots(ap, (int)L), segments = act_num_segments(ap, (int)L);
    size_t kept = ap->segment > 0 ? segments - 1 : 0;
    size_t device_kept = ap->offload ? (kept > 0 ? ACT_STAGING_BUFFERS : 0) : kept;
    size_t offloaded = (size_t)act_offloaded_layers(ap, (int)L);
    size_t held = in.pp_held > 1 ? (size_t)in.pp_held : 1;  // --pp: a set of the below for each held micro-batch
    p.bytes[MEM_ACTIVATIONS] = held * (R + slots * A + shared + device_kept * R + lay->sp_gathered + head);
    char* f = p.formula[MEM_ACTIVATIONS];
    snprintf(f, PLAN_FORMULA_LEN, held > 1 ? "%zu x (R + %zu A" : "R + %zu A", held > 1 ? held : slots, slots);
    if (lay->sp_gathered) { plan_append(f, " + 4(BTC + 2C) gathered (--sp; R = 4BTC/N)"); }
    if (device_kept > 0 && ap->offload) { plan_append(f, " + %zu R staging", device_kept); }
    if (device_kept > 0 && !ap->offload) { plan_append(f, " + %zu R kept", kept); }
    if (ap->gelu) { plan_append(f, " + gelu"); }
    if (ap->attn && !ap->flash) { plan_append(f, " + attn"); }
    if (head > 0) { plan_append(f, ap->loss_chunk > 0 ? " + head of K=%d tokens" : " + head", lay->head_rows); }
    if (held > 1) { plan_append(f, "): --pp's held micro-batches"); }
    p.bytes[MEM_OFFLOADED] = held * (ap->offload ? (kept > 0 ? kept * R : offloaded * A) : 0);
    if (!ap->offload) { snprintf(p.formula[MEM_OFFLOADED], PLAN_FORMULA_LEN, "no --offload"); }
    else if (kept > 0) { snprintf(p.formula[MEM_OFFLOADED], PLAN_FORMULA_LEN, "%zu R: segment inputs", kept); }
    else { snprintf(p.formula[MEM_OFFLOADED], PLAN_FORMULA_LEN, "%zu A: every layer's block but the last %d", offloaded, act_num_slots(ap, (int)L)); }
    p.layer_bytes = A;
    p.residual_bytes = R;
    p.head_bytes = head;
    snprintf(p.head_formula, sizeof(p.head_formula), "%s, K = %d", lay->head_formula, lay->head_rows);
    snprintf(p.layer_formula, sizeof(p.layer_formula), "%s", lay->layer_formula);
    act_policy_describe(ap, (int)L, p.act_policy, sizeof(p.act_policy));
    // FLOPs per token: a layer's forward is 24C^2 (matmuls) + 4TC (scores and values); a
    // recomputed segment runs it again, selective attention runs the scores (2TC) again, and flash
    // attention's backward on a GPU runs three tile products more than the stored weights' (the
    // scores twice, dout v^T once: 6TC; cuda/flash_attention.cuh; the CPU's runs the scores once
    // more, 2TC, which this estimate overstates)
    // (--tp N: a rank's share, the matmuls' and the attention's 1/N; the classifier whole)
    double layer_forward = (24.0 * C * C + 4.0 * T * C) / N_tp;
    double recomputed_layers = ap->segment > 0 ? (double)(segments - 1) * ap->segment : 0.0;
    double attn_again = (ap->flash ? 6.0 * T * C : ap->attn ? 2.0 * T * C : 0.0) / N_tp;
    p.recompute_flops = BT * (recomputed_layers * layer_forward + L * attn_again);
    p.step_flops = BT * (6.0 * P + 12.0 * L * T * C / N_tp);
    // bytes moved: a recomputed GELU output or attention weights tensor is written and read once
    // more per layer; each offloaded byte goes to the host after forward and back before backward
    p.recompute_bytes = 2.0 * L * ((ap->gelu ? lay->layer_gelu : 0) + (ap->attn ? lay->layer_att : 0));
    p.offload_bytes = 2.0 * p.bytes[MEM_OFFLOADED];
    p.bytes[MEM_ACT_GRADIENTS] = lay->backward;
    snprintf(p.formula[MEM_ACT_GRADIENTS], PLAN_FORMULA_LEN, "%s", lay->backward_formula);
    // each loader: uint16 read buffer of BT+1 tokens, int inputs and targets (BT each);
    // sampling: one int per position of a generated sequence (T)
    p.bytes[MEM_SCRATCH] = in.num_loaders * ((BT + 1) * sizeof(uint16_t) + 2 * BT * sizeof(int)) + T * sizeof(int)
                           + lay->backend_scratch + (size_t)in.pp_micro * 2 * BT * sizeof(int);
    snprintf(p.formula[MEM_SCRATCH], PLAN_FORMULA_LEN, "loaders x (2(BT+1) + 8BT) + 4T%s%s",
             lay->backend_scratch ? " + backend scratch" : "", in.pp_micro ? " + 8mBT (--pp)" : "");
    size_t staging = plan_lowp_staging_floats(cfg, &in);
    if (staging > 0) {
        p.bytes[MEM_SCRATCH] += staging * sizeof(float);
        plan_append(p.formula[MEM_SCRATCH], " + 4 x M's largest part (fp32 staging)");
    }
    p.bytes[MEM_HOST_COPIES] = P * lay->host_copy_bytes + (lay->host_copies_opt ? p.bytes[MEM_OPTIMIZER] : 0);
    snprintf(p.formula[MEM_HOST_COPIES], PLAN_FORMULA_LEN, "%s", lay->host_copy_bytes ? "4P weights + optimizer state" : "none: the weights are host memory");
    if (in.zero == 3 && in.world > 1) {
        plan_zero3_weights(&p, cfg, &in);
        if (N_tp > 1 && !tp_staging_on_host) {
            p.bytes[MEM_PARAMETERS] += 4 * C * C * lay->param_bytes;
            plan_append(p.formula[MEM_PARAMETERS], " + %zu(4C^2): --tp's layer whole", lay->param_bytes);
        }
        if (gpt2_pp(cfg) > 1 && !pp_staging_on_host) {  // (the slices go through the working copy; the pieces through this)
            p.bytes[MEM_PARAMETERS] += 4 * C * C * lay->param_bytes;
            plan_append(p.formula[MEM_PARAMETERS], " + %zu(4C^2): --pp's piece in transit", lay->param_bytes);
        }
    }
    p.bytes[MEM_OPT_HOST] = 0;
    snprintf(p.formula[MEM_OPT_HOST], PLAN_FORMULA_LEN, "no --offload optimizer");
    p.step_offload_bytes = p.host_update_bytes = 0.0;
    if (in.offload_optimizer != OPT_OFFLOAD_NONE) { plan_offload_optimizer(&p, cfg, P, &in); }
    // the gradient exchange of N ranks, per optimizer step: a ring all-reduce sends 2(N-1)/N of
    // the gradients from each rank; ZeRO-1's reduce to each block's owner and broadcast back the
    // same bytes (a reduce-scatter and an all-gather)
    double N = in.world > 1 ? in.world : 1;
    p.exchange_bytes = 2.0 * (N - 1.0) / N * (double)(P * lay->grad_bytes);
    p.exchange_micro_bytes = 0.0;
    if (in.zero >= 2 && N > 1) {  // ZeRO-2: a reduce-scatter each micro-step, the weights' all-gather once
        p.exchange_micro_bytes = p.exchange_bytes / 2.0;
        p.exchange_bytes /= 2.0;
        if (in.offload_optimizer != OPT_OFFLOAD_NONE) {  // the offloaded shard gathers the working precision's weights
            p.exchange_bytes = (N - 1.0) / N * (double)(P * lay->working_bytes);
        }
    }
    if (N_tp > 1) {  // --tp: each layer's two sums forward and two backward (and a recomputed layer's forward two again),
        // of B T C activations each, every micro-step: a ring all-reduce over the group sends 2(N-1)/N of them. --sp
        // moves the same bytes forward (an all-gather and a reduce-scatter, (N-1)/N each, for each sum) and gathers
        // again in backward what forward gathered (the LayerNorms' outputs) and d(block output) twice: 10 (N-1)/N a layer
        double halves = ap->sp ? 10.0 * L + 4.0 * recomputed_layers : 8.0 * L + 4.0 * recomputed_layers;
        p.exchange_micro_bytes += (N_tp - 1.0) / N_tp * halves * (double)BT * C * lay->working_bytes;
    }
    if (in.zero == 3 && N > 1) {  // ZeRO-3: no all-gather after the update; wte, wpe, lnf once a step, each
        // layer for its forward, its backward and each recompute of it, every micro-step; what is gathered
        // is the working copy's precision (a GPU's bf16 blocks, not the fp32 master)
        double share = (N - 1.0) / N * lay->working_bytes;
        p.exchange_bytes = share * (double)plan_outer_weights(cfg);
        p.exchange_micro_bytes += share * (double)plan_layer_weights(cfg) * (2.0 * L + recomputed_layers);
    }
    p.pp_bubble = 0.0;
    if (gpt2_pp(cfg) > 1) {  // --pp: a (B,T,C) message to each neighbour every micro-step (activations on, gradients
        // back), wte's gradient between the first and the last stage once a step, and the bubble (N-1)/m
        int stage = cfg->stage, stages = cfg->pp, m = in.pp_micro > 0 ? in.pp_micro : 1;
        double message = (double)BT * C * lay->working_bytes;
        p.exchange_micro_bytes += message * ((stage > 0) + (stage < stages - 1));
        if (stage == 0 || stage == stages - 1) { p.exchange_bytes += (double)cfg->padded_vocab_size * C * lay->grad_bytes; }  // a 2-rank all-reduce: 2(2-1)/2 of it
        p.pp_bubble = (double)(stages - 1) / m;
    }
    if (tp_staging_on_host) {  // --tp on a GPU: the staging of a split tensor's layer whole is host memory (train_gpt.cu)
        p.bytes[MEM_HOST_COPIES] += 4 * C * C * lay->host_copy_bytes;
        plan_append(p.formula[MEM_HOST_COPIES], " + %zu(4C^2): --tp's layer whole", lay->host_copy_bytes);
    }
    if (pp_staging_on_host) {  // --pp on a GPU: the whole model's piece in transit is host memory (train_gpt.cu: the stream runs over the host copies)
        p.bytes[MEM_HOST_COPIES] += 4 * C * C * lay->host_copy_bytes;
        plan_append(p.formula[MEM_HOST_COPIES], " + %zu(4C^2): --pp's piece in transit", lay->host_copy_bytes);
    }
    return p;
}

// the bytes of the categories in host memory (memory.h: mem_category_on_host)
static size_t plan_host_bytes(const size_t bytes[NUM_MEM_CATEGORIES]) {
    size_t s = 0;
    for (int i = 0; i < NUM_MEM_CATEGORIES; i++) { if (mem_category_on_host(i)) { s += bytes[i]; } }
    return s;
}

static size_t plan_total(const MemPlan* p) {
    size_t s = 0;
    for (int i = 0; i < NUM_MEM_CATEGORIES; i++) { s += p->bytes[i]; }
    return s;
}

// ----------------------------------------------------------------------------
// the time a plan costs, and whether it fits a budget

// the rates of one rank that turn a plan's FLOPs and bytes into time (a backend's: gpt2_cost_model)
#define COST_NOTE_LEN 96
typedef struct {
    double flops;       // FLOP/s a training step achieves
    double memory_bw;   // bytes/s of device memory: selective recompute's extra traffic
    double host_bw;     // bytes/s between device and host: --offload's copies
    double host_memory_bw;  // bytes/s of host memory for one rank's update on the CPU: --offload optimizer
    double link_bw;     // bytes/s a rank sends in the gradient exchange (all-reduce bus bandwidth)
    char flops_note[COST_NOTE_LEN], memory_note[COST_NOTE_LEN], host_note[COST_NOTE_LEN], host_memory_note[COST_NOTE_LEN],
        link_note[COST_NOTE_LEN];
} CostModel;

// the fraction of a peak FLOP/s a training step is taken to achieve where only the peak is known
// (a GPU's data sheet, --peak-tflops)
#define COST_ASSUMED_MFU 0.4

// one optimizer step (accum micro-steps) in seconds, by part; nothing assumed to overlap
typedef struct {
    double compute, recompute, memory, offload, host_update, exchange;  // FLOPs, recomputed FLOPs, traffic, copies, CPU update, exchange
    double bubble;      // --pp: the stage's wait for its neighbours while the pipeline fills and drains
    double total;
    double relative;    // total over the plain step (compute alone): 1.0 = plain training
} StepCost;

static StepCost plan_step_cost(const MemPlan* p, int accum, const CostModel* m) {
    StepCost c;
    c.compute = accum * p->step_flops / m->flops;
    c.recompute = accum * p->recompute_flops / m->flops;
    c.memory = accum * p->recompute_bytes / m->memory_bw;
    c.offload = (accum * p->offload_bytes + p->step_offload_bytes) / m->host_bw;
    c.host_update = p->host_update_bytes / m->host_memory_bw;
    c.exchange = (p->exchange_bytes + accum * p->exchange_micro_bytes) / m->link_bw;
    c.bubble = p->pp_bubble * (c.compute + c.recompute + c.memory + c.offload);  // the micro-steps' work, (N-1)/m of it again
    c.total = c.compute + c.recompute + c.memory + c.offload + c.host_update + c.exchange + c.bubble;
    c.relative = c.total / c.compute;
    return c;
}

// what a rank may use, in bytes; SIZE_MAX: no limit
typedef struct {
    size_t device;   // the device categories (all but the host ones); shared: everything
    size_t host;     // the host categories (the offload store, --offload optimizer's host memory, a GPU's host copies)
    int shared;      // 1: one memory holds both (the CPU backend): device + host must fit in .device
} MemBudget;

typedef struct {
    size_t device, host;         // the plan's bytes in each
    int device_ok, host_ok;      // each within its budget (shared: device_ok for the sum, host_ok = 1)
} BudgetFit;

static BudgetFit plan_fit(const MemPlan* p, const MemBudget* b) {
    BudgetFit f;
    f.host = plan_host_bytes(p->bytes);
    f.device = plan_total(p) - f.host;
    f.device_ok = (b->shared ? f.device + f.host : f.device) <= b->device;
    f.host_ok = b->shared || f.host <= b->host;
    return f;
}

#define MIB (1024.0 * 1024.0)
#define MEM_TABLE_RULE "+--------------------+----------------+----------------+------------------------------------------------------------------+\n"

static void print_memory_row(const char* name, size_t planned, const char* measured, const char* formula) {
    printf("| %-18s | %10.2f MiB | %14s | %-64s |\n", name, planned / MIB, measured, formula);
}

// prints the plan; with measured != NULL, the measured high-water marks beside it.
// "device" is everything but the host store of offloaded activations.
static void print_memory_table(const MemPlan* p, const MemStats* measured) {
    printf("%s", MEM_TABLE_RULE);
    printf("| %-18s | %-14s | %-14s | %-64s |\n", "memory", "planned", "measured", "formula (bytes)");
    printf("%s", MEM_TABLE_RULE);
    char m[32] = "-";
    for (int i = 0; i < NUM_MEM_CATEGORIES; i++) {
        if (measured) { snprintf(m, sizeof(m), "%.2f MiB", measured->peak[i] / MIB); }
        print_memory_row(MEM_CATEGORY_NAMES[i], p->bytes[i], m, p->formula[i]);
    }
    printf("%s", MEM_TABLE_RULE);
    size_t host = plan_host_bytes(p->bytes);
    if (measured) { snprintf(m, sizeof(m), "%.2f MiB", (measured->total_peak - plan_host_bytes(measured->peak)) / MIB); }
    print_memory_row("device total", plan_total(p) - host, m, "all but the host categories");
    if (measured) { snprintf(m, sizeof(m), "%.2f MiB", plan_host_bytes(measured->peak) / MIB); }
    print_memory_row("host total", host, m, "offloaded activations, optimizer, host copies");
    if (measured) { snprintf(m, sizeof(m), "%.2f MiB", measured->total_peak / MIB); }
    print_memory_row("total", plan_total(p), m, "");
    printf("%s", MEM_TABLE_RULE);
    printf("activations: %s; A (one layer's block: %s) = %.2f MiB, R (a residual-stream tensor) = %.2f MiB,\n"
           "  head (the final LayerNorm's statistics, the losses, K tokens' lnf output and logits: %s) = %.2f MiB\n",
           p->act_policy, p->layer_formula, p->layer_bytes / MIB, p->residual_bytes / MIB, p->head_formula, p->head_bytes / MIB);
    if (p->recompute_flops > 0.0) {
        printf("recompute: +%.3f GFLOP of forward per micro-step, +%.1f%% of the step's %.3f GFLOP\n",
               p->recompute_flops / 1e9, 100.0 * p->recompute_flops / p->step_flops, p->step_flops / 1e9);
    }
}

// writes {"parameters": bytes, ..., "device_total": bytes, "host_total": bytes, "total": bytes}
// for a table's column: the plan (bytes) or the measured high-water marks (peak, total_peak)
static void json_memory_object(FILE* f, const size_t bytes[NUM_MEM_CATEGORIES], size_t total) {
    fprintf(f, "{");
    for (int i = 0; i < NUM_MEM_CATEGORIES; i++) { fprintf(f, "\"%s\": %zu, ", MEM_CATEGORY_KEYS[i], bytes[i]); }
    fprintf(f, "\"device_total\": %zu, \"host_total\": %zu, \"total\": %zu}",
            total - plan_host_bytes(bytes), plan_host_bytes(bytes), total);
}

// one line of log.jsonl: {"step": S, "memory": {"planned": {...}, "measured": {...}}}, bytes
static void log_memory_json(FILE* f, int step, const MemPlan* plan, const MemStats* measured) {
    fprintf(f, "{\"step\": %d, \"memory\": {\"planned\": ", step);
    json_memory_object(f, plan->bytes, plan_total(plan));
    fprintf(f, ", \"measured\": ");
    json_memory_object(f, measured->peak, measured->total_peak);
    fprintf(f, "}}\n");
}

#endif // LLMC_PLANNER_H
