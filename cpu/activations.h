/*
activations.h: what the CPU model's forward keeps for its backward (LayerActs, one block a
layer), where it lives, and the two techniques that change that: activation checkpointing
(--recompute K | sqrt) and activation offload (--offload activations). The schedule, which
layer keeps or moves what and when, is decided in llmc/act_policy.h for every backend; this
file carves the buffers and moves the bytes. train_gpt.c calls it at three hooks:

    act_alloc(&a, &policy, cfg, B, T);            // the working set (and the host store with --offload)
    act_after_layer_forward(&a, l, BTC);          // hook: layer l's forward is done: keep or move what the schedule says
    ActRecompute r = act_bring_back(&a, l, BTC);  // hook: before layer l's backward: its block back;
                                                  // r.segment >= 0: run that segment's forward again

Plain training (no flag) keeps a block per layer: act_after_forward and act_bring_back then do
nothing. The layer functions (cpu/layers.h) never know which policy is on.
*/
#ifndef CPU_ACTIVATIONS_H
#define CPU_ACTIVATIONS_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "../llmc/act_policy.h"
#include "../llmc/memory.h"
#include "../llmc/model_config.h"
#include "../llmc/profile.h"
#include "../llmc/utils.h"

// one layer's activations: what its forward keeps for its backward. The tensors are one
// contiguous block (ln1 first), so a layer moves (offload) or is recomputed as a unit.
typedef struct {
    float* ln1;        // (B,T,C)  LayerNorm 1 output
    float* ln1_mean;   // (B,T)
    float* ln1_rstd;   // (B,T)
    float* qkv;        // (B,T,3C) query, key, value
    float* atty;       // (B,T,C)  attention output, heads concatenated
    float* att;        // (B,NH,T,T) attention weights (softmax output); --recompute attn: shared; NULL with flash
    float* lse;        // (B,NH,T) --attention flash: the rows' log-sum-exp, in att's place; else NULL
    float* residual2;  // (B,T,C)  residual stream after attention
    float* ln2;        // (B,T,C)
    float* ln2_mean;   // (B,T)
    float* ln2_rstd;   // (B,T)
    float* fch;        // (B,T,4C) MLP hidden, before GELU
    float* fch_gelu;   // (B,T,4C) after GELU; --recompute gelu: shared
    float* residual3;  // (B,T,C)  block output = next block's input
} LayerActs;

// Where the activations live: layer l computes into the working-set buffer slots[l % slots].
// Plain training has a slot per layer; checkpointing (segments of k layers) has k slots and keeps
// each segment's input; offload moves the kept tensors to the host store (host_layers or the
// segment inputs) and back.
typedef struct {
    ActPolicy pol;       // what forward keeps, and where (--recompute, --offload, --attention, --loss-chunk)
    int num_layers;      // L
    float* encoded;      // (B,T,C) embeddings = input of layer 0 (and of segment 0); --sp: a rank's rows of them
    LayerActs* slots;    // [act_num_slots] the working set of layer blocks
    int* slot_layer;     // [act_num_slots] offload: the layer each slot holds now, -1 none
    size_t layer_floats; // one layer block
    float* gelu_shared;  // (B,T,4C) (--tp: 4C/N) --recompute gelu: the one GELU output buffer, else NULL
    float* att_shared;   // (B,NH,T,T) (--tp: NH/N) --recompute attn (not flash): the one attention-weight buffer, else NULL
    float** seg_inputs;  // [segments] checkpointing: each segment's input; [0] = encoded, the
                         // others in device memory, or in the host store with offload
    float* staging[ACT_STAGING_BUFFERS];  // (B,T,C) each, checkpointing + offload: segment s's input back
                                          // from the host in staging[s % 2]
    float* sp_gathered;  // --sp: (B,T,C) + 2C, the rows of every rank of the group met (cpu/tensor_parallel.h), else NULL
    float* host_layers;  // (L, layer_floats) offload without checkpointing: every layer's block
    // the head (the final LayerNorm and the classifier), K = head_rows tokens at a time: K = B*T,
    // or with --loss-chunk a chunk (act_policy.h)
    float* lnf;          // (K,C) final LayerNorm output
    float* lnf_mean;     // (B,T)
    float* lnf_rstd;     // (B,T)
    float* logits;       // (K,Vp) the logits (--tp: a rank's Vp/N columns of the vocabulary); softmax turns them into probabilities in place (what forward
                         // leaves), and the loss's backward the probabilities into the logits' gradient
    float* losses;       // (B,T) per-position cross-entropy
    int head_rows;       // K
    int probs_first, probs_end;  // the positions whose probabilities logits holds after the last forward
                                 // (first..end-1); first = -1: none
    float head_grad_scale;  // --loss-chunk: the loss_scale of the head's gradients the last forward computed, 0 none
    float* device_memory;   // everything above but the host store: one allocation
    float* host_memory;     // the host store of offloaded activations, NULL without --offload
} Activations;

// points a's tensors into memory (act_policy.h's table of their sizes: all fp32 here); returns
// the block's floats
static size_t act_point_layer(LayerActs* a, float* memory, int B, int T, int C, int NH, int tp, const ActPolicy* pol) {
    size_t s[NUM_LAYER_ACTS], total = 0;
    layer_act_elems(s, B, T, C, NH, tp, pol);
    float** ptrs[NUM_LAYER_ACTS] = {
        &a->ln1, &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->atty, &a->att, &a->residual2,
        &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fch, &a->fch_gelu, &a->residual3,
    };
    for (int i = 0; i < NUM_LAYER_ACTS; i++) { *ptrs[i] = memory + total; total += s[i]; }
    a->lse = pol->flash ? a->att : NULL;  // flash keeps the log-sum-exp in the weights' place
    if (pol->flash) { a->att = NULL; }
    return total;
}

// floats of one layer's block under a policy (tp: --tp's ranks, 1 without)
static size_t act_layer_floats(int B, int T, int C, int NH, int tp, const ActPolicy* pol) {
    size_t s[NUM_LAYER_ACTS], total = 0;
    layer_act_elems(s, B, T, C, NH, tp, pol);
    for (int i = 0; i < NUM_LAYER_ACTS; i++) { total += s[i]; }
    return total;
}

// whether a model's activations hold the head (the final LayerNorm, the logits): every model's but a
// pipeline stage's before the last (--pp: llmc/pipeline.h)
static int act_has_head(const GPT2Config* c) { return gpt2_holds_tensor(c, NUM_PARAMETER_TENSORS - 1); }

// --sp: the one buffer where the group's rows meet, (B,T,C), and 2C floats for a LayerNorm's parameter
// gradients of a rank's rows (cpu/tensor_parallel.h); 0 without
static size_t act_sp_gathered_floats(const ActPolicy* pol, size_t BT, int C) { return pol->sp ? BT * C + 2 * (size_t)C : 0; }

// the head, K tokens at a time (K = B*T, or a --loss-chunk): the final LayerNorm's output (K,C) and
// its statistics (B,T each), the logits (K,Vp), the losses (B,T)
static size_t act_head_floats(int B, int T, int C, int Vp, int K) {
    size_t BT = (size_t)B * T;
    return (size_t)K * C + 2 * BT + (size_t)K * Vp + BT;
}

// carves n floats from *p and returns them
static float* act_carve(float** p, size_t n) {
    float* t = *p;
    *p += n;
    return t;
}

// the activations for micro-batches of (B,T) under the policy: device memory (working set,
// shared buffers, kept segment inputs, staging, head) and the host store (offload); c: the whole
// model's shape, or with --tp (c->tp > 1) a rank's, whose blocks hold its heads and hidden units;
// with --sp the residual stream (the embeddings, the segment inputs) is a rank's rows, RC of BTC
// floats, and the rows of every rank meet in one shared buffer (sp_gathered)
static void act_alloc(Activations* a, const ActPolicy* pol, const GPT2Config* c, int B, int T) {
    int L = c->num_layers, C = c->channels, NH = c->num_heads, tp = gpt2_tp(c), Vp = c->padded_vocab_size / tp;  // --tp: a rank's columns
    size_t BT = (size_t)B * T, BTC = BT * C, RC = act_residual_rows(pol, BT, tp) * C;
    memset(a, 0, sizeof(*a));
    a->pol = *pol;
    a->num_layers = L;
    int slots = act_num_slots(pol, L), segments = act_num_segments(pol, L);
    int seg_kept = pol->segment > 0 ? segments - 1 : 0;  // segment inputs besides the embeddings
    a->layer_floats = act_layer_floats(B, T, C, NH, tp, pol);
    size_t gelu = pol->gelu ? BTC * 4 / tp : 0, att = act_shared_att_elems(pol, B, T, NH / tp);
    size_t device_kept = pol->offload ? 0 : seg_kept * RC, staging = pol->offload && seg_kept ? ACT_STAGING_BUFFERS * RC : 0;
    int K = act_head_rows(pol, BT);
    size_t head = act_has_head(c) ? act_head_floats(B, T, C, Vp, K) : 0, gathered = act_sp_gathered_floats(pol, BT, C);
    size_t total = RC + slots * a->layer_floats + gelu + att + device_kept + staging + gathered + head;
    a->device_memory = (float*)mem_calloc(MEM_ACTIVATIONS, total * sizeof(float));
    a->slots = (LayerActs*)malloc_check(slots * sizeof(LayerActs));  // pointers only, not counted
    a->slot_layer = (int*)malloc_check(slots * sizeof(int));
    a->seg_inputs = (float**)malloc_check(segments * sizeof(float*));
    float* p = a->device_memory;
    a->encoded = act_carve(&p, RC);
    for (int i = 0; i < slots; i++) {
        p += act_point_layer(&a->slots[i], p, B, T, C, NH, tp, pol);
        a->slot_layer[i] = -1;
    }
    a->gelu_shared = pol->gelu ? act_carve(&p, gelu) : NULL;
    a->att_shared = att ? act_carve(&p, att) : NULL;
    for (int i = 0; i < slots; i++) {
        if (pol->gelu) { a->slots[i].fch_gelu = a->gelu_shared; }
        if (att) { a->slots[i].att = a->att_shared; }
    }
    a->seg_inputs[0] = a->encoded;
    for (int s = 1; s <= seg_kept; s++) { a->seg_inputs[s] = pol->offload ? NULL : act_carve(&p, RC); }
    for (int i = 0; i < ACT_STAGING_BUFFERS; i++) { a->staging[i] = staging ? act_carve(&p, RC) : NULL; }
    a->sp_gathered = gathered ? act_carve(&p, gathered) : NULL;
    if (head) {  // --pp: the last stage's
        a->lnf = act_carve(&p, (size_t)K * C);
        a->lnf_mean = act_carve(&p, BT);
        a->lnf_rstd = act_carve(&p, BT);
        a->logits = act_carve(&p, (size_t)K * Vp);
        a->losses = act_carve(&p, BT);
    }
    a->head_rows = K;
    a->probs_first = -1;
    if (!pol->offload) { return; }
    size_t host = seg_kept ? seg_kept * RC : (size_t)act_offloaded_layers(pol, L) * a->layer_floats;
    a->host_memory = (float*)mem_calloc(MEM_OFFLOADED, host * sizeof(float));
    p = a->host_memory;
    if (seg_kept) {
        for (int s = 1; s <= seg_kept; s++) { a->seg_inputs[s] = act_carve(&p, RC); }
    } else {
        a->host_layers = a->host_memory;
    }
}

static void act_free(Activations* a) {
    mem_free(a->device_memory);
    mem_free(a->host_memory);
    free(a->slots);
    free(a->slot_layer);
    free(a->seg_inputs);
}

// the working-set buffer layer l computes into
static LayerActs* act_layer(const Activations* a, int l) {
    return &a->slots[act_slot_of(&a->pol, a->num_layers, l)];
}

// segment s's input in device memory: the embeddings, the kept tensor, or (offload) its staging buffer
static float* act_segment_input(const Activations* a, int s) {
    if (s == 0) { return a->encoded; }
    return a->pol.offload ? a->staging[s % ACT_STAGING_BUFFERS] : a->seg_inputs[s];
}

// layer l's input, while l's block is in the working set; l == L: the last block's output
static const float* act_layer_input(const Activations* a, int l) {
    if (l == 0) { return a->encoded; }
    int k = a->pol.segment;
    if (k > 0 && l % k == 0 && l < a->num_layers) { return act_segment_input(a, l / k); }
    return act_layer(a, l - 1)->residual3;
}

// ----------------------------------------------------------------------------
// the hooks

// after layer l's forward, what the schedule (act_policy.h) keeps: the next segment's input
// (in device memory, or in the host store with offload), or with offload l's whole block.
// Nothing in plain training
static void act_after_layer_forward(Activations* a, int l, size_t BTC) {
    ActStore st = act_after_forward(&a->pol, a->num_layers, l);
    if (a->pol.offload && a->pol.segment == 0) { a->slot_layer[act_slot_of(&a->pol, a->num_layers, l)] = l; }  // stored or not
    if (st.segment_input < 0 && st.offload_layer < 0) { return; }
    LayerActs* la = act_layer(a, l);
    prof_mark(PROF_OFFLOAD_COPY, prof_bytes(2.0 * (st.segment_input >= 0 ? BTC : a->layer_floats) * sizeof(float)), "after forward");
    if (st.segment_input >= 0) { memcpy(a->seg_inputs[st.segment_input], la->residual3, BTC * sizeof(float)); }
    if (st.offload_layer >= 0) {
        memcpy(a->host_layers + (size_t)l * a->layer_floats, la->ln1, a->layer_floats * sizeof(float));
    }
}

// offload: brings layer l's block back from the host store unless its slot still holds it
static void act_fetch_layer(Activations* a, int l) {
    int slot = act_slot_of(&a->pol, a->num_layers, l);
    if (a->slot_layer[slot] == l) { return; }
    prof_mark(PROF_OFFLOAD_COPY, prof_bytes(2.0 * a->layer_floats * sizeof(float)), "before backward");
    memcpy(a->slots[slot].ln1, a->host_layers + (size_t)l * a->layer_floats, a->layer_floats * sizeof(float));
    a->slot_layer[slot] = l;
}

// a checkpointed segment the caller runs forward again (segment -1: none)
typedef struct { int segment, first, last; } ActRecompute;

// before layer l's backward: its block and its input into the working set, as the schedule says:
// a segment input back from the host, blocks back; a segment to run forward again is returned
static ActRecompute act_bring_back(Activations* a, int l, size_t BTC) {
    ActBackwardPlan bp = act_before_backward(&a->pol, a->num_layers, l);
    if (bp.restore_segment >= 0) {
        prof_mark(PROF_OFFLOAD_COPY, prof_bytes(2.0 * BTC * sizeof(float)), "before backward");
        memcpy(act_segment_input(a, bp.restore_segment), a->seg_inputs[bp.restore_segment], BTC * sizeof(float));
    }
    for (int i = 0; i < 2; i++) {
        if (bp.fetch[i] >= 0) { act_fetch_layer(a, bp.fetch[i]); }
    }
    ActRecompute r = {bp.recompute_segment, bp.recompute_first, bp.recompute_last};
    return r;
}

#endif // CPU_ACTIVATIONS_H
