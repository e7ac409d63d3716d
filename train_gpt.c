/*
train_gpt.c: GPT-2 training on the CPU, fp32, C11 + OpenMP. The reference path:
every other path of the project (the memory-saving flags, the CUDA program) is
tested against what this file computes.

Reading order: the model's tensors (parameters, activations, backward buffers),
one transformer block forward and backward, the whole model forward and backward
(with the activation policy of --recompute and --offload: llmc/act_policy.h), the
gradient exchange between MPI ranks and the optimizer step (--zero), sampling,
checkpoints, and the training loop with main(). The layers themselves are in
llmc/cpu_layers.h; optimizers, files, flags and memory accounting are in the other
small headers of llmc/.

    make train_gpt && ./train_gpt             # d6 on TinyShakespeare (make run prepares the data)
    ./train_gpt -e d12 -b 4 -t 64             # GPT-2 124M
    ./train_gpt --plan -e d48 -b 8 -t 1024 --optimizer adafactor --recompute sqrt
    mpirun -np 2 ./train_gpt -e d12 --zero 1  # data parallel, optimizer state sharded
*/
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "llmc/utils.h"
#include "llmc/model_config.h"
#include "llmc/opt_layout.h"
#include "cpu/layers.h"
#include "cpu/optimizers.h"
#include "llmc/act_policy.h"
#include "llmc/memory.h"
#include "llmc/planner.h"
#include "llmc/rand.h"
#include "llmc/flags.h"
#include "llmc/dataloader.h"
#include "llmc/tokenizer.h"
#include "llmc/checkpoint.h"
#include "llmc/distributed.h"

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
    float* att;        // (B,NH,T,T) attention weights (softmax output); --recompute attn: shared
    float* residual2;  // (B,T,C)  residual stream after attention
    float* ln2;        // (B,T,C)
    float* ln2_mean;   // (B,T)
    float* ln2_rstd;   // (B,T)
    float* fch;        // (B,T,4C) MLP hidden, before GELU
    float* fch_gelu;   // (B,T,4C) after GELU; --recompute gelu: shared
    float* residual3;  // (B,T,C)  block output = next block's input
} LayerActs;
#define NUM_LAYER_ACTS 13

// the floats of each tensor of one layer's block; selective recompute keeps no GELU
// output and no attention weights in the block (one shared buffer of each serves)
static void layer_act_sizes(size_t s[NUM_LAYER_ACTS], int B, int T, int C, int NH, const ActPolicy* pol) {
    size_t BT = (size_t)B * T;
    size_t att = pol->attn ? 0 : (size_t)B * NH * T * T, gelu = pol->gelu ? 0 : BT * 4 * C;
    size_t sizes[NUM_LAYER_ACTS] = {
        BT * C, BT, BT, BT * 3 * C, BT * C, att, BT * C,
        BT * C, BT, BT, BT * 4 * C, gelu, BT * C,
    };
    memcpy(s, sizes, sizeof(sizes));
}

// points a's tensors into memory; returns the block's floats
static size_t point_layer_acts(LayerActs* a, float* memory, int B, int T, int C, int NH, const ActPolicy* pol) {
    size_t s[NUM_LAYER_ACTS], total = 0;
    layer_act_sizes(s, B, T, C, NH, pol);
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
    float* att_shared;   // (B,NH,T,T) --recompute attn: the one attention-weight buffer, else NULL
    float** seg_inputs;  // [segments] checkpointing: each segment's input; [0] = encoded, the
                         // others in device memory, or in the host store with offload
    float* staging;      // (B,T,C) checkpointing + offload: the segment input back from the host
    float* host_layers;  // (L, layer_floats) offload without checkpointing: every layer's block
    float* lnf;          // (B,T,C) final LayerNorm output
    float* lnf_mean;     // (B,T)
    float* lnf_rstd;     // (B,T)
    float* logits;       // (B,T,Vp) logits, turned in place into probabilities, then into their gradient
    float* losses;       // (B,T) per-position cross-entropy
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

typedef struct {
    GPT2Config config;
    size_t num_parameters;
    float* params_memory;
    ParameterTensors params;
    float* grads_memory;
    ParameterTensors grads;
    OptimizerKind optimizer;
    int use_beta1;            // Adafactor: keeps a first moment
    float* opt_memory;        // optimizer state, one block (layout: llmc/optimizers.h)
    size_t opt_floats;
    ActPolicy act;            // what forward keeps, and where (--recompute, --offload)
    ActivationTensors acts;
    float* acts_memory;       // device: the working set, kept segment inputs, the head
    float* host_memory;       // host store of offloaded activations, NULL without --offload
    BackwardBuffers bwd;
    float* bwd_memory;
    int batch_size, seq_len;  // the (B,T) the activations were sized for
    float mean_loss;          // of the last forward with targets
    // data parallelism (llmc/distributed.h): set before gpt2_alloc_training
    Dist dist;                // this process among the ranks
    ZeroStage zero;           // ZERO_SHARDED: this rank keeps the optimizer state of its blocks only
} GPT2;

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
// model creation: random initialisation or a checkpoint

static void gpt2_alloc_params(GPT2* m, const GPT2Config* cfg) {
    m->config = *cfg;
    m->num_parameters = gpt2_num_parameters(cfg);
    m->params_memory = (float*)mem_alloc(MEM_PARAMETERS, m->num_parameters * sizeof(float));
    point_parameters(&m->params, m->params_memory, cfg);
    m->grads_memory = NULL;
    m->opt_memory = NULL;
    m->acts_memory = m->host_memory = m->bwd_memory = NULL;
    memset(&m->acts, 0, sizeof(m->acts));
    Dist one = {0, 1};
    m->dist = one;
    m->zero = ZERO_REPLICATED;
}

// how the optimizer's slices are cut over the ranks (optimizers.h): whole unless ZeRO-1
static OptSharding gpt2_sharding(const GPT2* m) {
    if (m->zero != ZERO_SHARDED) { return OPT_UNSHARDED; }
    OptSharding z = {m->dist.rank, m->dist.world, dist_allreduce_sum_doubles, dist_allgather_floats_world};
    return z;
}

#define INIT_STD 0.02f  // GPT-2's initialisation scale

// GPT-2 initialisation: weights normal(0, 0.02), residual projections 0.02/sqrt(2L),
// biases 0, LayerNorm weights 1; padded vocabulary rows 0. Deterministic in the seed.
static void gpt2_init_random(GPT2* m, const GPT2Config* cfg, uint64_t seed) {
    gpt2_alloc_params(m, cfg);
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(sizes, cfg);
    float residual_std = INIT_STD / sqrtf(2.0f * cfg->num_layers);
    uint64_t rng = RNG_SEED_MIX ^ seed;
    float* p = m->params_memory;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        const char* name = PARAMETER_NAMES[i];
        int is_ln_weight = strcmp(name, "ln1w") == 0 || strcmp(name, "ln2w") == 0 || strcmp(name, "lnfw") == 0;
        float std = (strcmp(name, "attprojw") == 0 || strcmp(name, "fcprojw") == 0) ? residual_std : INIT_STD;
        size_t n = sizes[i];
        if (i == 0) { n = (size_t)cfg->vocab_size * cfg->channels; }  // wte: real rows only
        for (size_t j = 0; j < sizes[i]; j++) {
            if (j >= n) { p[j] = 0.0f; }
            else if (PARAMETER_IS_MATRIX[i]) { p[j] = std * rand_normal(&rng); }
            else { p[j] = is_ln_weight ? 1.0f : 0.0f; }
        }
        p += sizes[i];
    }
}

static void gpt2_load(GPT2* m, const char* path) {
    GPT2Config cfg;
    int version;
    FILE* f = model_file_open(path, &cfg, &version);
    gpt2_alloc_params(m, &cfg);
    model_file_read_params(f, path, &cfg, version, m->params_memory);
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
    layer_act_sizes(ls, B, T, C, NH, pol);
    a->layer_floats = 0;
    for (int i = 0; i < NUM_LAYER_ACTS; i++) { a->layer_floats += ls[i]; }
    size_t gelu = pol->gelu ? BTC * 4 : 0, att = pol->attn ? (size_t)B * NH * T * T : 0;
    size_t device_kept = pol->offload ? 0 : seg_kept * BTC, staging = pol->offload && seg_kept ? BTC : 0;
    size_t head = BTC + 2 * BT + BT * Vp + BT;
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
    a->att_shared = pol->attn ? carve(&p, att) : NULL;
    for (int i = 0; i < slots; i++) {
        if (pol->gelu) { a->slots[i].fch_gelu = a->gelu_shared; }
        if (pol->attn) { a->slots[i].att = a->att_shared; }
    }
    a->seg_inputs[0] = a->encoded;
    for (int s = 1; s <= seg_kept; s++) { a->seg_inputs[s] = pol->offload ? NULL : carve(&p, BTC); }
    a->staging = staging ? carve(&p, staging) : NULL;
    a->lnf = carve(&p, BTC);
    a->lnf_mean = carve(&p, BT);
    a->lnf_rstd = carve(&p, BT);
    a->logits = carve(&p, BT * Vp);
    a->losses = carve(&p, BT);
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
    size_t BT = (size_t)B * T, P = m->num_parameters;
    m->batch_size = B;
    m->seq_len = T;
    m->grads_memory = (float*)mem_calloc(MEM_GRADIENTS, P * sizeof(float));
    point_parameters(&m->grads, m->grads_memory, c);
    m->optimizer = optimizer;
    m->use_beta1 = use_beta1;
    m->opt_floats = optimizer_state_floats(c, optimizer, use_beta1, gpt2_sharding(m).world);
    m->opt_memory = (float*)mem_calloc(MEM_OPTIMIZER, m->opt_floats * sizeof(float));
    gpt2_alloc_activations(m, B, T, pol);
    // backward buffers
    size_t bsizes[6] = {BT * C, BT * C, BT * 3 * C, BT * 4 * C, BT * 4 * C, (size_t)B * NH * T * T};
    float** bptrs[6] = {&m->bwd.dresidual, &m->bwd.dbtc, &m->bwd.dqkv, &m->bwd.dfch_gelu, &m->bwd.dfch, &m->bwd.datt};
    size_t btotal = 0;
    for (int i = 0; i < 6; i++) { btotal += bsizes[i]; }
    m->bwd_memory = (float*)mem_calloc(MEM_ACT_GRADIENTS, btotal * sizeof(float));
    float* p = m->bwd_memory;
    for (int i = 0; i < 6; i++) { *bptrs[i] = carve(&p, bsizes[i]); }
}

static void gpt2_free(GPT2* m) {
    mem_free(m->params_memory);
    mem_free(m->grads_memory);
    mem_free(m->opt_memory);
    mem_free(m->acts_memory);
    mem_free(m->host_memory);
    mem_free(m->bwd_memory);
    free(m->acts.slots);
    free(m->acts.slot_layer);
    free(m->acts.seg_inputs);
}

// ----------------------------------------------------------------------------
// one transformer block: x -> x + attn(ln1(x)) -> (that) + mlp(ln2(that))

// x (B,T,C) is the block's input; fills a (its residual3 is the block output)
static void block_forward(LayerActs* a, const float* x, const LayerParams* p, int B, int T, int C, int NH) {
    size_t BTC = (size_t)B * T * C;
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, B, T, C);
    matmul_forward(a->qkv, a->ln1, p->qkvw, p->qkvb, B, T, C, 3 * C);
    attention_forward(a->atty, a->att, a->qkv, B, T, C, NH);
    matmul_forward(a->residual2, a->atty, p->attprojw, p->attprojb, B, T, C, C);
    residual_forward(a->residual2, x, a->residual2, BTC);  // in place: residual2 = x + projection
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, p->ln2w, p->ln2b, B, T, C);
    matmul_forward(a->fch, a->ln2, p->fcw, p->fcb, B, T, C, 4 * C);
    gelu_forward(a->fch_gelu, a->fch, BTC * 4);
    matmul_forward(a->residual3, a->fch_gelu, p->fcprojw, p->fcprojb, B, T, 4 * C, C);
    residual_forward(a->residual3, a->residual2, a->residual3, BTC);
}

// on entry bwd->dresidual holds d(block output); on exit d(block input) (x).
// Parameter gradients accumulate into g. Selective recompute (pol) first runs the GELU
// and the attention softmax again into their shared buffers.
static void block_backward(BackwardBuffers* bwd, const LayerActs* a, const float* x, const LayerParams* p,
                           const LayerGrads* g, int B, int T, int C, int NH, const ActPolicy* pol) {
    size_t BTC = (size_t)B * T * C;
    if (pol->gelu) { gelu_forward(a->fch_gelu, a->fch, BTC * 4); }
    // MLP branch; the residual passes dresidual through unchanged, so it stays in place
    memset(bwd->dfch_gelu, 0, BTC * 4 * sizeof(float));
    matmul_backward(bwd->dfch_gelu, g->fcprojw, g->fcprojb, bwd->dresidual, a->fch_gelu, p->fcprojw, B, T, 4 * C, C);
    memset(bwd->dfch, 0, BTC * 4 * sizeof(float));
    gelu_backward(bwd->dfch, a->fch, bwd->dfch_gelu, BTC * 4);
    memset(bwd->dbtc, 0, BTC * sizeof(float));
    matmul_backward(bwd->dbtc, g->fcw, g->fcb, bwd->dfch, a->ln2, p->fcw, B, T, C, 4 * C);
    layernorm_backward(bwd->dresidual, g->ln2w, g->ln2b, bwd->dbtc, a->residual2, p->ln2w, a->ln2_mean, a->ln2_rstd, B, T, C);
    // attention branch
    memset(bwd->dbtc, 0, BTC * sizeof(float));
    matmul_backward(bwd->dbtc, g->attprojw, g->attprojb, bwd->dresidual, a->atty, p->attprojw, B, T, C, C);
    memset(bwd->dqkv, 0, BTC * 3 * sizeof(float));
    if (pol->attn) { attention_weights_forward(a->att, a->qkv, B, T, C, NH); }
    attention_backward(bwd->dqkv, bwd->datt, bwd->dbtc, a->qkv, a->att, B, T, C, NH);
    memset(bwd->dbtc, 0, BTC * sizeof(float));
    matmul_backward(bwd->dbtc, g->qkvw, g->qkvb, bwd->dqkv, a->ln1, p->qkvw, B, T, C, 3 * C);
    layernorm_backward(bwd->dresidual, g->ln1w, g->ln1b, bwd->dbtc, x, p->ln1w, a->ln1_mean, a->ln1_rstd, B, T, C);
}

// ----------------------------------------------------------------------------
// the whole model

// after layer l's forward: offload moves its block to the host store; checkpointing keeps
// the next segment's input (in device memory, or in the host store with offload)
static void act_store_after_forward(GPT2* m, int l, size_t BTC) {
    ActivationTensors* a = &m->acts;
    int k = m->act.segment, L = m->config.num_layers;
    LayerActs* la = act_layer(m, l);
    if (k > 0) {
        if ((l + 1) % k == 0 && l + 1 < L) { memcpy(a->seg_inputs[(l + 1) / k], la->residual3, BTC * sizeof(float)); }
        return;
    }
    if (m->act.offload) {
        memcpy(a->host_layers + (size_t)l * a->layer_floats, la->ln1, a->layer_floats * sizeof(float));
        a->slot_layer[act_slot_of(&m->act, L, l)] = l;
    }
}

// offload: brings layer l's block back from the host store unless its slot still holds it
static void act_fetch_layer(GPT2* m, int l) {
    ActivationTensors* a = &m->acts;
    int slot = act_slot_of(&m->act, m->config.num_layers, l);
    if (a->slot_layer[slot] == l) { return; }
    memcpy(a->slots[slot].ln1, a->host_layers + (size_t)l * a->layer_floats, a->layer_floats * sizeof(float));
    a->slot_layer[slot] = l;
}

// layers first..last forward from x into the working set
static void forward_layers(GPT2* m, int first, int last, const float* x, int B, int T, int store) {
    int C = m->config.channels, NH = m->config.num_heads;
    for (int l = first; l <= last; l++) {
        LayerParams lp = layer_params(&m->params, l, C);
        LayerActs* la = act_layer(m, l);
        block_forward(la, x, &lp, B, T, C, NH);
        if (store) { act_store_after_forward(m, l, (size_t)B * T * C); }
        x = la->residual3;
    }
}

// before layer l's backward: its block and its input into the working set. Checkpointing:
// at a segment's last layer, its input comes back (from the host with offload) and all
// but the last segment run forward again. Offload: l's block and l-1's (the input) come back.
static void act_prepare_backward(GPT2* m, int l, int B, int T) {
    int k = m->act.segment, L = m->config.num_layers;
    if (k > 0) {
        int s = l / k, first = s * k, last = act_min(L, first + k) - 1, segments = act_num_segments(&m->act, L);
        if (l != last) { return; }
        if (m->act.offload && s > 0) { memcpy(m->acts.staging, m->acts.seg_inputs[s], (size_t)B * T * m->config.channels * sizeof(float)); }
        if (s < segments - 1) { forward_layers(m, first, last, segment_input(m, s), B, T, 0); }
        return;
    }
    if (m->act.offload) {
        act_fetch_layer(m, l);
        if (l > 0) { act_fetch_layer(m, l - 1); }
    }
}

// inputs (B,T) token ids; targets (B,T) or NULL. Leaves probabilities in acts.logits
// and, with targets, per-position losses and their mean in m->mean_loss.
static void gpt2_forward(GPT2* m, const int* inputs, const int* targets, int B, int T) {
    const GPT2Config* c = &m->config;
    int L = c->num_layers, C = c->channels, V = c->vocab_size, Vp = c->padded_vocab_size;
    if (B > m->batch_size || T > m->seq_len) { fail("forward with (B,T)=(%d,%d) beyond the allocated (%d,%d)", B, T, m->batch_size, m->seq_len); }
    ActivationTensors* a = &m->acts;
    encoder_forward(a->encoded, inputs, m->params.wte, m->params.wpe, B, T, C);
    forward_layers(m, 0, L - 1, a->encoded, B, T, 1);
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, layer_input(m, L), m->params.lnfw, m->params.lnfb, B, T, C);
    matmul_forward(a->logits, a->lnf, m->params.wte, NULL, B, T, C, Vp);
    softmax_forward(a->logits, a->logits, B, T, V, Vp);  // in place: logits -> probabilities
    if (targets == NULL) { m->mean_loss = -1.0f; return; }
    crossentropy_forward(a->losses, a->logits, targets, B, T, Vp);
    double sum = 0.0;
    for (int i = 0; i < B * T; i++) { sum += a->losses[i]; }
    m->mean_loss = (float)(sum / (B * T));
}

static void gpt2_zero_grad(GPT2* m) {
    memset(m->grads_memory, 0, m->num_parameters * sizeof(float));
}

// accumulates into the gradients d(loss_scale * sum of position losses) for the batch
// of the last forward; loss_scale is 1/(B*T*accumulation steps) for a mean loss.
static void gpt2_backward(GPT2* m, const int* inputs, const int* targets, int B, int T, float loss_scale) {
    const GPT2Config* c = &m->config;
    int L = c->num_layers, C = c->channels, NH = c->num_heads, V = c->vocab_size, Vp = c->padded_vocab_size;
    ActivationTensors* a = &m->acts;
    BackwardBuffers* bwd = &m->bwd;
    size_t BTC = (size_t)B * T * C;
    crossentropy_softmax_backward(a->logits, a->logits, targets, loss_scale, B, T, V, Vp);  // probs -> dlogits
    memset(bwd->dbtc, 0, BTC * sizeof(float));
    matmul_backward(bwd->dbtc, m->grads.wte, NULL, a->logits, a->lnf, m->params.wte, B, T, C, Vp);
    memset(bwd->dresidual, 0, BTC * sizeof(float));
    layernorm_backward(bwd->dresidual, m->grads.lnfw, m->grads.lnfb, bwd->dbtc, layer_input(m, L),
                       m->params.lnfw, a->lnf_mean, a->lnf_rstd, B, T, C);
    for (int l = L - 1; l >= 0; l--) {
        act_prepare_backward(m, l, B, T);
        LayerParams lp = layer_params(&m->params, l, C);
        LayerGrads lg = layer_grads(&m->grads, l, C);
        block_backward(bwd, act_layer(m, l), layer_input(m, l), &lp, &lg, B, T, C, NH, &m->act);
    }
    encoder_backward(m->grads.wte, m->grads.wpe, bwd->dresidual, inputs, B, T, C);
}

// ----------------------------------------------------------------------------
// optimizer step

// ----------------------------------------------------------------------------
// data parallelism: each rank's gradient is of its own part of the batch; before the step
// ZERO_REPLICATED sums them whole on every rank (all-reduce), ZERO_SHARDED sums each block
// only on the rank that owns it (reduce-scatter), which updates it and sends it to the
// others (all-gather). The loss scale already divides by the number of ranks.

// calls part(slice memory, counts) for every slice of the model, counts[r] = floats of rank r's block
static void for_each_slice_block(const GPT2* m, float* memory, void (*part)(float*, const int*, Dist)) {
    ParamSlice* s = param_slices_alloc(&m->config);
    int* counts = (int*)malloc_check((size_t)m->dist.world * sizeof(int));
    for (int k = 0; k < param_slice_count(&m->config); k++) {
        slice_part_counts(&s[k], m->dist.world, counts);
        part(memory + s[k].offset, counts, m->dist);
    }
    free(counts);
    free(s);
}

// the gradients of all ranks' micro-batches, summed: whole, or this rank's blocks (ZeRO-1)
static void gpt2_reduce_grads(GPT2* m) {
    if (m->dist.world == 1) { return; }
    if (m->zero == ZERO_SHARDED) { for_each_slice_block(m, m->grads_memory, dist_reduce_scatter_floats); }
    else { dist_allreduce_sum_floats(m->grads_memory, m->num_parameters); }
}

// ----------------------------------------------------------------------------
// optimizer step

#define NORM_CHUNKS 256  // fixed partition of the sum of squares: same result for any thread count

// global L2 norm of all gradients, summed in double over a fixed partition. ZeRO-1: each
// rank sums the squares of its blocks (the only reduced gradients it has), then the ranks add.
static float gpt2_grad_norm(const GPT2* m) {
    if (m->zero == ZERO_SHARDED) {
        OptSharding z = gpt2_sharding(m);
        ParamSlice* s = param_slices_alloc(&m->config);
        double total = 0.0;
        for (int k = 0; k < param_slice_count(&m->config); k++) {
            size_t offset;
            OptShard sh = slice_shard(&s[k], &z, &offset);
            total += opt_sum_squares(m->grads_memory + s[k].offset + offset, (size_t)sh.rows * sh.cols);
        }
        free(s);
        dist_allreduce_sum_doubles(&total, 1);
        return (float)sqrt(total);
    }
    double partial[NORM_CHUNKS];
    size_t n = m->num_parameters, chunk = (n + NORM_CHUNKS - 1) / NORM_CHUNKS;
    #pragma omp parallel for
    for (int k = 0; k < NORM_CHUNKS; k++) {
        double s = 0.0;
        size_t end = (k + 1) * chunk < n ? (k + 1) * chunk : n;
        for (size_t i = k * chunk; i < end; i++) { s += (double)m->grads_memory[i] * m->grads_memory[i]; }
        partial[k] = s;
    }
    double total = 0.0;
    for (int k = 0; k < NORM_CHUNKS; k++) { total += partial[k]; }
    return (float)sqrt(total);
}

typedef struct {
    OptimizerHyper hyper;  // of the model's optimizer (llmc/optimizers.h)
    float grad_clip;       // 0 = off
    int t;                 // optimizer step, from 1
} StepConfig;

// clips the gradients to the global norm (given) and takes one step of the model's optimizer;
// ZeRO-1: on this rank's blocks, then every rank gathers the others' updated blocks
static void gpt2_update(GPT2* m, const StepConfig* s, float grad_norm) {
    if (s->grad_clip > 0.0f && grad_norm > s->grad_clip) {
        float scale = s->grad_clip / grad_norm;
        #pragma omp parallel for
        for (size_t i = 0; i < m->num_parameters; i++) { m->grads_memory[i] *= scale; }
    }
    OptSharding z = gpt2_sharding(m);
    optimizer_step(m->optimizer, m->params_memory, m->grads_memory, m->opt_memory, &m->config, &s->hyper, s->t, &z);
    if (m->zero == ZERO_SHARDED) { for_each_slice_block(m, m->params_memory, dist_allgather_floats); }
}

// a 64-bit hash of the parameters' bits (FNV-1a over 32-bit words): equal weights, equal hash
#define FNV64_OFFSET 0xcbf29ce484222325ULL
#define FNV64_PRIME 0x100000001b3ULL
static uint64_t gpt2_params_hash(const GPT2* m) {
    uint64_t h = FNV64_OFFSET;
    const uint32_t* w = (const uint32_t*)m->params_memory;
    for (size_t i = 0; i < m->num_parameters; i++) { h = (h ^ w[i]) * FNV64_PRIME; }
    return h;
}

// stops the run unless every rank holds the same parameters (costs one pass over them)
static void gpt2_check_replicas(const GPT2* m, int step) {
    uint64_t lo, hi;
    dist_min_max_u64(gpt2_params_hash(m), &lo, &hi);
    if (lo != hi) {
        fail("replicas: the parameters differ between ranks after step %d (hashes 0x%016llx .. 0x%016llx)\n"
             "  hint: a bug in the data-parallel step; rerun with --check-replicas 1 to find the first bad step",
             step, (unsigned long long)lo, (unsigned long long)hi);
    }
    printf("replicas: parameters identical on %d ranks after step %d (hash 0x%016llx)\n", m->dist.world, step, (unsigned long long)lo);
}

// the optimizer's hyperparameters from the flags, at this step's scheduled learning rate.
// Adafactor and CAME take their papers' defaults for what the flags do not set.
static OptimizerHyper optimizer_hyper(const TrainOptions* o, OptimizerKind kind, float lr) {
    OptimizerHyper h;
    memset(&h, 0, sizeof(h));
    if (kind == OPT_ADAMW) {
        AdamWHyper a = {lr, o->beta1, o->beta2, o->eps, o->weight_decay};
        h.adamw = a;
    } else if (kind == OPT_ADAFACTOR) {
        // --relative-step: lr = min(1e-2, 1/sqrt(t)) * max(eps2, RMS(p)) and -l is ignored;
        // otherwise the scheduled -l (as HF Trainer uses Adafactor)
        int rel = o->relative_step;
        AdafactorHyper a = {rel ? 0.0 : lr, o->adafactor_beta1, ADAFACTOR_DECAY_RATE, o->eps1, ADAFACTOR_EPS2,
                            ADAFACTOR_CLIP_THRESHOLD, o->weight_decay, rel, rel};
        h.adafactor = a;
    } else {
        CAMEHyper c = {lr, CAME_BETA1, CAME_BETA2, CAME_BETA3, o->eps1, CAME_EPS2, CAME_CLIP_THRESHOLD, o->weight_decay};
        h.came = c;
    }
    return h;
}

// warmup (linear from lr/warmup) then cosine decay to lr * final_frac at max_steps
static float learning_rate_at(const TrainOptions* o, int step, int max_steps) {
    if (step < o->warmup_steps) { return o->learning_rate * (step + 1) / o->warmup_steps; }
    if (max_steps <= o->warmup_steps) { return o->learning_rate; }
    float ratio = (float)(step - o->warmup_steps) / (float)(max_steps - o->warmup_steps);
    float coeff = 0.5f * (1.0f + cosf((float)M_PI * ratio));
    float min_lr = o->learning_rate * o->final_lr_frac;
    return min_lr + coeff * (o->learning_rate - min_lr);
}

// ----------------------------------------------------------------------------
// sampling

// draws an index from probs (n) given a uniform coin in [0, 1)
static int sample_index(const float* probs, int n, float coin) {
    float cdf = 0.0f;
    for (int i = 0; i < n; i++) {
        cdf += probs[i];
        if (coin < cdf) { return i; }
    }
    return n - 1;  // rounding
}

// generates tokens[1..n-1] after tokens[0] (EOT), one forward per token, and prints them
static void gpt2_sample(GPT2* m, int* tokens, int n, const Tokenizer* tok, uint64_t* rng) {
    tokens[0] = m->config.vocab_size > GPT2_EOT ? GPT2_EOT : m->config.vocab_size - 1;  // a smaller vocabulary: its last id, where GPT-2 keeps EOT
    for (int t = 1; t < n; t++) {
        gpt2_forward(m, tokens, NULL, 1, t);
        const float* probs = m->acts.logits + (size_t)(t - 1) * m->config.padded_vocab_size;
        tokens[t] = sample_index(probs, m->config.vocab_size, rand_uniform(rng));
        if (tok->init_ok) { safe_print(tokenizer_decode(tok, tokens[t])); } else { printf("%d ", tokens[t]); }
        fflush(stdout);
    }
    printf("\n");
}

// ----------------------------------------------------------------------------
// checkpoints: model file + training state + DONE marker (checkpoint.h)

// rank 0 writes the model file, every rank its own state file (its data position and, under
// ZeRO-1, its blocks of the optimizer state); once all have written, rank 0 marks DONE
static void gpt2_save_checkpoint(const GPT2* m, const char* dir, int step, const DataLoader* dl, uint64_t rng) {
    if (m->dist.world > 1) { gpt2_check_replicas(m, step); }
    char path[1100];
    if (m->dist.rank == 0) {
        checkpoint_path(path, sizeof(path), dir, "model", step, -1);
        model_file_write(path, &m->config, m->params_memory);
    }
    TrainState s = {m->dist.world, m->dist.rank, step, (int)dl->shard, dl->epoch, dl->position, rng,
                    m->num_parameters, m->opt_floats, m->zero};
    checkpoint_path(path, sizeof(path), dir, "state", step, m->dist.rank);
    state_file_write(path, &s, m->opt_memory);
    dist_barrier();
    if (m->dist.rank == 0) { checkpoint_mark_done(dir, step); }
    printf("checkpoint: wrote step %d to %s/\n", step, dir);
}

// loads the newest complete checkpoint of dir into an allocated model; returns its step
static int gpt2_resume(GPT2* m, const char* dir, DataLoader* dl, uint64_t* rng) {
    int step = checkpoint_latest(dir);
    if (step < 0) { fail("-y 1: no complete checkpoint (DONE_* marker) in '%s'\n  hint: check -o, or start without -y", dir); }
    char path[1100];
    checkpoint_path(path, sizeof(path), dir, "model", step, -1);
    GPT2Config cfg;
    int version;
    FILE* f = model_file_open(path, &cfg, &version);
    if (memcmp(&cfg, &m->config, sizeof(cfg)) != 0) { fail("checkpoint '%s' has another model shape than -e\n  hint: resume with the same -e", path); }
    model_file_read_params(f, path, &cfg, version, m->params_memory);
    // rank 0's state file exists for any number of ranks: it says how many wrote the checkpoint
    TrainState s;
    checkpoint_path(path, sizeof(path), dir, "state", step, 0);
    state_file_read_header(path, &s);
    if (s.num_processes != m->dist.world) {
        fail("checkpoint '%s/' of step %d was written by %d rank(s); this run has %d\n"
             "  hint: resume with mpirun -np %d (each rank reads its own state file)",
             dir, step, s.num_processes, m->dist.world, s.num_processes);
    }
    if (s.zero != (int)m->zero) {
        fail("checkpoint '%s/' of step %d was written with --zero %d; this run has --zero %d\n"
             "  hint: resume with --zero %d", dir, step, s.zero, (int)m->zero, s.zero);
    }
    checkpoint_path(path, sizeof(path), dir, "state", step, m->dist.rank);
    state_file_read(path, &s, m->opt_memory, m->opt_floats);
    dataloader_seek(dl, (size_t)s.data_shard, s.data_position, s.data_epoch);
    *rng = s.rng;
    printf("resumed from %s/ at step %d\n", dir, step);
    return step;
}

// ----------------------------------------------------------------------------
// training

static volatile sig_atomic_t g_stop_requested = 0;
static void on_stop_signal(int sig) { (void)sig; g_stop_requested = 1; }

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int num_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// training FLOPs per token: 6 per parameter (forward 2, backward 4) plus attention's
// score and value products, 12 L T C (PaLM's estimate, as llm.c)
static double flops_per_token(const GPT2* m, int T) {
    const GPT2Config* c = &m->config;
    return 6.0 * m->num_parameters + 12.0 * c->num_layers * T * c->channels;
}

// the model's shape from -e: a preset name, or the header of a model file
static int model_is_preset(const TrainOptions* o, GPT2Config* cfg) {
    return gpt2_config_preset(cfg, o->model);
}

static void resolve_model_config(const TrainOptions* o, GPT2Config* cfg) {
    if (model_is_preset(o, cfg)) { return; }
    FILE* f = fopen(o->model, "rb");
    if (f == NULL) {
        fail("-e '%s' is neither a preset (tiny, d6, d12, d24, d36, d48, d60) nor a readable model file", o->model);
    }
    fclose(f);
    int version;
    fclose(model_file_open(o->model, cfg, &version));
}

// the model from -e: a preset initialises randomly, a model file is loaded
static void build_model(GPT2* m, const TrainOptions* o) {
    GPT2Config cfg;
    if (model_is_preset(o, &cfg)) { gpt2_init_random(m, &cfg, o->seed); } else { gpt2_load(m, o->model); }
}

// --zero against the build and the number of ranks (world: this run's, or --plan-ranks)
static void check_zero_option(const TrainOptions* o, int world) {
    if (o->zero != ZERO_REPLICATED && o->zero != ZERO_SHARDED) {
        fail("--zero %d: unknown; choose 0 (every rank keeps the whole optimizer state) or 1 (ZeRO-1: the state is sharded over the ranks)", o->zero);
    }
    if (o->zero == ZERO_SHARDED && world < 2) {
        if (!dist_built_with_mpi() && !o->plan_only) {
            fail("--zero 1 shards the optimizer state across MPI ranks, but this train_gpt was built without MPI, so it needs mpirun\n"
                 "  hint: build with MPI (make, with mpicc installed) and launch with mpirun -np 2 ./train_gpt --zero 1 ...");
        }
        fail("--zero 1 shards the optimizer state across ranks, but this run has %d rank\n"
             "  hint: launch with mpirun -np 2 (or more) ./train_gpt ..., use --zero 0, or --plan --plan-ranks N", world);
    }
    if (o->check_replicas != 0 && o->check_replicas != 1) { fail("--check-replicas %d: 0 or 1", o->check_replicas); }
    if (o->plan_ranks < 0) { fail("--plan-ranks %d: the number of ranks must be >= 1, or 0 for this run's", o->plan_ranks); }
    if (o->plan_ranks != 0 && !o->plan_only) {
        fail("--plan-ranks %d plans for other ranks than this run's, so it only goes with --plan\n"
             "  hint: add --plan, or launch the ranks with mpirun -np %d", o->plan_ranks, o->plan_ranks);
    }
}

// checks the options against each other, the model and the number of ranks (world);
// returns the gradient accumulation steps of each rank
static int check_options(const TrainOptions* o, const GPT2Config* c, int world) {
    check_zero_option(o, world);
    if (o->batch_size < 1) { fail("-b %d: the batch size must be >= 1", o->batch_size); }
    if (o->seq_len < 1) { fail("-t %d: the sequence length must be >= 1", o->seq_len); }
    if (o->seq_len > c->max_seq_len) {
        fail("-t %d is longer than the model's context maxT=%d\n  hint: use -t %d or less", o->seq_len, c->max_seq_len, c->max_seq_len);
    }
    int BT = o->batch_size * o->seq_len, step_tokens = BT * world;  // one micro-batch on every rank
    int total = o->total_batch_size == -1 ? step_tokens : o->total_batch_size;
    if (total < 1 || total % step_tokens != 0) {
        char what[96];
        if (world == 1) { snprintf(what, sizeof(what), "B*T = %d", BT); }
        else { snprintf(what, sizeof(what), "B*T times the ranks = %d x %d = %d", BT, world, step_tokens); }
        fail("-d %d: the total batch (tokens per step) must be a positive multiple of %s\n"
             "  hint: use -d %d, %d, ... or -d -1", o->total_batch_size, what, step_tokens, 2 * step_tokens);
    }
    if (o->learning_rate < 0.0f || o->weight_decay < 0.0f || o->grad_clip < 0.0f) { fail("-l, -c and --grad-clip must be >= 0"); }
    if (o->beta1 < 0.0f || o->beta1 >= 1.0f || o->beta2 < 0.0f || o->beta2 >= 1.0f) { fail("--beta1 and --beta2 must be in [0, 1)"); }
    if (o->warmup_steps < 0 || o->val_every < 0 || o->sample_every < 0 || o->checkpoint_every < 0 || o->val_steps < 0) {
        fail("-u, -v, -m, -s and -n must be >= 0");
    }
    if (o->max_steps < -1 || o->max_steps == 0) { fail("-x %d: the number of steps must be >= 1, or -1 for one epoch", o->max_steps); }
    if (o->gen_tokens < 1) { fail("-g %d: a sample needs at least one token", o->gen_tokens); }
    if (o->resume != 0 && o->resume != 1) { fail("-y %d: resume is 0 or 1", o->resume); }
    if (optimizer_from_name(o->optimizer) < 0) { fail("--optimizer '%s': unknown; choose adamw, adafactor or came", o->optimizer); }
    if (o->adafactor_beta1 < 0.0f || o->adafactor_beta1 >= 1.0f) { fail("--adafactor-beta1 must be in [0, 1)"); }
    if (!(o->eps1 > 0.0f)) { fail("--eps1 %g: must be > 0 (it keeps the second moment of a zero gradient positive)", o->eps1); }
    if (o->resume && o->out_dir[0] == '\0') { fail("-y 1 needs the output directory to resume from (-o)"); }
    return total / step_tokens;
}

// stops before allocating anything if the plan cannot fit in the memory this machine has
// available (on the CPU the "device" and the host store share it), for every rank on it
static void check_memory_fits(const MemPlan* plan, const ActPolicy* act, int local_ranks) {
    double avail = (double)mem_available();
    double host = (double)plan->bytes[MEM_OFFLOADED] * local_ranks, total = (double)plan_total(plan) * local_ranks;
    if (avail == 0.0) { return; }  // unknown (not Linux)
    if (act->offload && host > avail) {
        fail("--offload 1: the host store for the offloaded activations needs %.1f MiB (%d rank(s) on this machine), but only %.1f MiB of host memory is available\n"
             "  hint: --recompute sqrt offloads only the segment inputs; or lower -b or -t (see --plan)", host / MIB, local_ranks, avail / MIB);
    }
    if (total > avail) {
        fail("this run needs %.1f MiB (the memory plan, %d rank(s) on this machine) but only %.1f MiB is available\n"
             "  hint: see --plan; lower -b or -t, --recompute sqrt, --optimizer adafactor, --zero 1", total / MIB, local_ranks, avail / MIB);
    }
}

static void print_config(const TrainOptions* o, const GPT2* m, int accum) {
    const GPT2Config* c = &m->config;
    printf("+-----------------------+----------------------------------------------------+\n");
    printf("| model                 | L=%d C=%d NH=%d V=%d Vp=%d maxT=%d\n", c->num_layers, c->channels,
           c->num_heads, c->vocab_size, c->padded_vocab_size, c->max_seq_len);
    printf("| parameters            | %zu (%.1fM)\n", m->num_parameters, m->num_parameters / 1e6);
    printf("| gradient accumulation | %d micro-steps of B*T = %d tokens\n", accum, o->batch_size * o->seq_len);
    printf("| data parallel (MPI)   | %d rank(s), --zero %d%s\n", m->dist.world, (int)m->zero,
           m->zero == ZERO_SHARDED ? ": each rank keeps its blocks of the optimizer state" : "");
    printf("| OpenMP threads        | %d\n", num_threads());
    for (int i = 0; i < NUM_FLAGS; i++) {
        char v[PATH_MAX_LEN + 8];
        flag_value_string(&FLAGS[i], o, v, sizeof(v));
        printf("| %-21s | %s\n", FLAGS[i].longname + 2, v);
    }
    printf("+-----------------------+----------------------------------------------------+\n");
}

static float validation_loss(GPT2* m, DataLoader* val, int steps) {
    dataloader_reset(val);
    double sum = 0.0;
    for (int i = 0; i < steps; i++) {
        dataloader_next_batch(val);
        gpt2_forward(m, val->inputs, val->targets, val->B, val->T);
        sum += m->mean_loss;
    }
    dist_allreduce_sum_doubles(&sum, 1);  // each rank validated on its own part of the data
    return (float)(sum / steps / m->dist.world);
}

static int run_training(const TrainOptions* o, const Dist* dist) {
    GPT2Config cfg;
    resolve_model_config(o, &cfg);
    int world = dist->world;
    int plan_world = o->plan_only && o->plan_ranks > 0 ? o->plan_ranks : world;
    int accum = check_options(o, &cfg, plan_world);
    int B = o->batch_size, T = o->seq_len;
    int has_val = o->val_data[0] != '\0' && o->val_steps > 0;
    OptimizerKind optimizer = (OptimizerKind)optimizer_from_name(o->optimizer);
    int use_beta1 = optimizer == OPT_ADAFACTOR && o->adafactor_beta1 > 0.0f;
    ActPolicy act = act_policy_parse(o->recompute, o->offload, cfg.num_layers);
    PlanInputs plan_in = {B, T, 1 + has_val, optimizer, use_beta1, act, plan_world, o->zero};
    MemPlan plan = plan_memory(&cfg, plan_in);
    if (o->plan_only) {  // nothing allocated: any model can be planned on a laptop
        printf("memory plan for L=%d C=%d NH=%d Vp=%d, B=%d T=%d (%s, fp32), per rank of %d, --zero %d:\n", cfg.num_layers,
               cfg.channels, cfg.num_heads, cfg.padded_vocab_size, B, T, o->optimizer, plan_world, o->zero);
        print_memory_table(&plan, NULL);
        return 0;
    }
    check_memory_fits(&plan, &act, dist_local_ranks());
    // the fixed overhead, measured before any tensor exists: code, libraries, the OpenMP
    // threads' stacks (started by a first parallel region), the tokenizer
    #pragma omp parallel
    { (void)0; }
    Tokenizer tok;
    tokenizer_init(&tok, o->tokenizer);
    size_t rss_at_start = mem_rss_now();
    GPT2 model;
    build_model(&model, o);
    int has_out = o->out_dir[0] != '\0';
    if (has_out && dist->rank == 0) { ensure_output_dir(o->out_dir); }
    dist_barrier();  // the other ranks write their state files into it
    model.dist = *dist;
    model.zero = (ZeroStage)o->zero;
    gpt2_alloc_training(&model, B, T, optimizer, use_beta1, &act);
    DataLoader train, val;
    dataloader_init(&train, o->train_data, B, T, dist->rank, world, model.config.vocab_size);
    if (has_val) { dataloader_init(&val, o->val_data, B, T, dist->rank, world, model.config.vocab_size); }
    int gen_len = o->gen_tokens < T ? o->gen_tokens : T;
    int* gen_tokens = (int*)mem_alloc(MEM_SCRATCH, (size_t)T * sizeof(int));
    // steps: -x, or one epoch of the training shards
    int max_steps = o->max_steps;
    if (max_steps == -1) {
        size_t tokens = 0;
        for (size_t s = 0; s < train.num_shards; s++) { dataloader_open_shard(&train, s); tokens += train.shard_tokens - 1; }
        dataloader_reset(&train);
        max_steps = (int)(tokens / ((size_t)B * T * accum * world));
        if (max_steps < 1) { max_steps = 1; }
    }
    uint64_t sample_rng = RNG_SEED_MIX ^ (o->seed + 1);
    int start_step = o->resume ? gpt2_resume(&model, o->out_dir, &train, &sample_rng) : 0;
    print_config(o, &model, accum);
    printf("memory plan (bytes by category; measured after the first step):\n");
    print_memory_table(&plan, NULL);
    FILE* log = NULL;
    if (has_out && dist->rank == 0) {
        char path[1100];
        snprintf(path, sizeof(path), "%s/log.jsonl", o->out_dir);
        log = fopen_check(path, o->resume ? "a" : "w");
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);  // under mpirun: OpenMPI forwards SIGUSR1 to every rank, while
                                    // SIGINT/SIGTERM to mpirun kill the ranks (no time to checkpoint)

    double fpt = flops_per_token(&model, T);
    int step = start_step;
    for (; step <= max_steps; step++) {
        int last = step == max_steps;
        if (has_val && o->val_every > 0 && (step % o->val_every == 0 || last)) {
            float vl = validation_loss(&model, &val, o->val_steps);
            printf("step %5d | val loss %.6f\n", step, vl);
            if (log) { fprintf(log, "{\"step\": %d, \"val_loss\": %.6f}\n", step, vl); fflush(log); }
        }
        if (o->sample_every > 0 && step > start_step && (step % o->sample_every == 0 || last)) {
            printf("---- sample at step %d ----\n", step);
            gpt2_sample(&model, gen_tokens, gen_len, &tok, &sample_rng);
            printf("---------------------------\n");
        }
        int stop = dist_any(g_stop_requested);  // all ranks stop at the same step
        int periodic = o->checkpoint_every > 0 && step > start_step && step % o->checkpoint_every == 0;
        if (has_out && (last || stop || periodic)) { gpt2_save_checkpoint(&model, o->out_dir, step, &train, sample_rng); }
        if (stop) {
            printf("stopped by signal after step %d; resume with the same flags and -y 1\n", step);
            break;
        }
        if (last) { break; }

        double t0 = now_seconds();
        gpt2_zero_grad(&model);
        double loss = 0.0;
        for (int micro = 0; micro < accum; micro++) {
            dataloader_next_batch(&train);
            gpt2_forward(&model, train.inputs, train.targets, B, T);
            gpt2_backward(&model, train.inputs, train.targets, B, T, 1.0f / ((float)B * T * accum * world));
            loss += model.mean_loss;
        }
        gpt2_reduce_grads(&model);
        dist_allreduce_sum_doubles(&loss, 1);
        loss /= accum * world;
        float norm = gpt2_grad_norm(&model);
        if (!isfinite(loss) || !isfinite(norm)) {
            fail("the loss (%f) or gradient norm (%f) is not finite at step %d; the weights were not updated\n"
                 "  hint: lower the learning rate (-l), keep --grad-clip on; checkpoints already in '%s' are intact",
                 loss, norm, step + 1, has_out ? o->out_dir : "(no -o)");
        }
        float lr = learning_rate_at(o, step, max_steps);
        StepConfig sc = {optimizer_hyper(o, model.optimizer, lr), o->grad_clip, step + 1};
        gpt2_update(&model, &sc, norm);
        if (o->check_replicas && world > 1) { gpt2_check_replicas(&model, step + 1); }
        double dt = now_seconds() - t0;
        double tokens = (double)B * T * accum * world;
        printf("step %5d/%d | loss %.6f | norm %7.4f | lr %.2e | %8.1f ms | %7.0f tok/s | %6.1f GFLOP/s\n",
               step + 1, max_steps, loss, norm, lr, dt * 1e3, tokens / dt, fpt * tokens / dt / 1e9);
        if (log) {
            fprintf(log, "{\"step\": %d, \"loss\": %.6f, \"grad_norm\": %.6f, \"lr\": %.6e, \"ms\": %.3f, \"tokens_per_s\": %.1f}\n",
                    step + 1, loss, norm, lr, dt * 1e3, tokens / dt);
            fflush(log);
        }
        if (step == start_step) {
            printf("memory after the first step (planned vs measured high-water marks):\n");
            print_memory_table(&plan, &g_mem);
            if (log) { log_memory_json(log, step + 1, &plan, &g_mem); fflush(log); }
        }
    }
    if (world > 1 && !has_out) { gpt2_check_replicas(&model, step); }  // with -o, the last checkpoint checked
    size_t peak = mem_rss_peak();
    printf("peak RSS %.1f MiB = accounted tensors %.1f MiB + fixed overhead %.1f MiB (code, libraries, thread\n"
           "  stacks, tokenizer: measured before the first tensor) + %.1f MiB other (malloc arenas, stdio, page rounding)\n",
           peak / MIB, g_mem.total_peak / MIB, rss_at_start / MIB,
           ((double)peak - (double)g_mem.total_peak - (double)rss_at_start) / MIB);
    if (log) { fclose(log); }
    mem_free(gen_tokens);
    dataloader_free(&train);
    if (has_val) { dataloader_free(&val); }
    tokenizer_free(&tok);
    gpt2_free(&model);
    return 0;
}

#ifndef TESTING
int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    Dist dist;
    dist_init(&dist, &argc, &argv);
    // rank 0 speaks for the job: the other ranks' stdout is dropped (their errors still reach stderr)
    if (dist.rank != 0 && freopen("/dev/null", "w", stdout) == NULL) { fail("cannot silence stdout of rank %d", dist.rank); }
    TrainOptions opt = options_default();
    int rc = parse_flags(&opt, argc, argv) ? 0 : run_training(&opt, &dist);
    dist_finalize();
    return rc;
}
#endif
