/*
act_policy.h: what forward keeps for backward, and where (flags --recompute, --offload and --loss-chunk).

    ActPolicy p = act_policy_parse("sqrt,attn", 1, L, 0);   // k = ceil(sqrt(L)), offload on, no flash
    int slots = act_num_slots(&p, L);                    // layer buffers in the working set

Activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
Cost"): the L layers are split into segments of k layers; forward keeps only each
segment's input (one (B,T,C) residual-stream tensor) and k layers of working buffers;
backward runs each segment's forward again from its input, then back-propagates through
it. The last segment is still in the working buffers when backward starts, so it is not
recomputed. k = L is plain training; k = 1 keeps every layer's input.

Selective recompute (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models"): no layer keeps its GELU output (B,T,4C) or its attention
weights (B,NH,T,T); one shared buffer of each serves forward, and backward recomputes
them from fch and from q, k (the softmax of q k^T) just before it needs them.

Offload: the kept activations move to a host store after forward and come back before
backward. Without checkpointing, each layer's whole block moves and the working set is
three layer buffers (layer l's backward reads l's block and l-1's, while l-2's comes
back into the third); the last three layers never move. With checkpointing, the segment
inputs move and the working set is the k layers a segment recomputes into, plus two
staging buffers: the input being recomputed from, and the next one on its way back.

Flash attention (Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention
with IO-Awareness"; --attention flash): attention runs block by block with an online softmax,
never writing the (B,NH,T,T) weights; forward keeps each row's log-sum-exp (B,NH,T, fp32) and
backward recomputes the weights from it, q and k. It is selective attention recompute done
inside one kernel, so it implies attn: a flash policy has attn set, keeps no attention weights
and needs no shared buffer for them. Its sums run in another order than the stored-weights
attention (--attention matmul), so the two agree to rounding, not bitwise.

Every policy computes the same numbers in the same order: losses and gradients are
bitwise identical to keeping everything (with the same --attention).

The schedule is decided here once, for every backend; a backend only moves the bytes:

    ActStore st = act_after_forward(&p, L, l);       // after layer l's forward: keep or move what?
    ActBackwardPlan bp = act_before_backward(&p, L, l);  // before l's backward: restore, recompute, fetch
*/
#ifndef LLMC_ACT_POLICY_H
#define LLMC_ACT_POLICY_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "utils.h"

typedef struct {
    int segment;   // layers per checkpointed segment, 0 = keep every layer (no checkpointing)
    int gelu;      // recompute the GELU output in backward
    int attn;      // recompute the attention weights in backward
    int offload;   // kept activations live in the host store between forward and backward
    int flash;     // --attention flash: attention keeps each row's log-sum-exp (B,NH,T), not its weights
    int loss_chunk;  // --loss-chunk: tokens per chunk of the classifier and its loss, 0 = all at once
    int sp;          // --sp (with --tp): the residual stream and the LayerNorms split over the tensor-parallel ranks' rows
} ActPolicy;

static const ActPolicy ACT_KEEP_ALL = {.segment = 0, .gelu = 0, .attn = 0, .offload = 0, .flash = 0, .loss_chunk = 0, .sp = 0};  // plain training, attention weights kept, logits whole

// the rows (of B*T) of the residual stream and the LayerNorms a rank holds: all of them, or with --sp
// (sequence parallelism, Korthikanti et al. 2022) its 1/tp of them (cpu/tensor_parallel.h)
static size_t act_residual_rows(const ActPolicy* p, size_t BT, int tp) { return p->sp ? BT / (size_t)tp : BT; }

static int act_min(int a, int b) { return a < b ? a : b; }

// segments of k layers: ceil(L/k); without checkpointing, the whole model is one
static int act_num_segments(const ActPolicy* p, int L) {
    return p->segment > 0 ? (L + p->segment - 1) / p->segment : 1;
}

// Offload without checkpointing keeps three layer buffers: layer l's backward reads its own block
// and its input (l-1's block), and the third receives l-2's block from the host while l computes
// (the CUDA backend's copy stream; the CPU, whose copies are memcpys, shares the schedule). The
// last three layers are never stored: their buffers still hold them when the backward begins
#define ACT_OFFLOAD_SLOTS 3
// checkpointing + offload: segment inputs come back from the host into two staging buffers, the
// next segment's arriving while the one before it is recomputed and runs its backward
#define ACT_STAGING_BUFFERS 2

// layer buffers in the working set: k with checkpointing, ACT_OFFLOAD_SLOTS with offload, else L
static int act_num_slots(const ActPolicy* p, int L) {
    if (p->segment > 0) { return act_min(p->segment, L); }
    return p->offload ? act_min(ACT_OFFLOAD_SLOTS, L) : L;
}

// offload without checkpointing: the layers whose blocks go to the host store, 0 .. this - 1
// (the others stay in their buffers until their backward)
static int act_offloaded_layers(const ActPolicy* p, int L) {
    return p->offload && p->segment == 0 ? L - act_num_slots(p, L) : 0;
}

// the working-set buffer that layer l computes into
static int act_slot_of(const ActPolicy* p, int L, int l) {
    return l % act_num_slots(p, L);
}

// parses --recompute (comma-separated: none | sqrt | K | gelu | attn) and --offload for a
// model of L layers, with flash attention or not; stops with a message on anything it cannot honour
static ActPolicy act_policy_parse(const char* spec, int offload, int L, int flash) {
    ActPolicy p = ACT_KEEP_ALL;
    char buf[64];
    if (strlen(spec) >= sizeof(buf)) { fail("--recompute '%s': too long", spec); }
    strcpy(buf, spec);
    int none = 0, tokens = 0;
    for (char* tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ","), tokens++) {
        char* end;
        long k = strtol(tok, &end, 10);
        if (strcmp(tok, "none") == 0) { none = 1; }
        else if (strcmp(tok, "gelu") == 0) { p.gelu = 1; }
        else if (strcmp(tok, "attn") == 0) { p.attn = 1; }
        else if (strcmp(tok, "sqrt") == 0 || (*end == '\0' && end != tok)) {
            if (p.segment) { fail("--recompute '%s': give one segment size (sqrt or a number), not two", spec); }
            if (strcmp(tok, "sqrt") == 0) { k = (long)ceil(sqrt((double)L)); }
            if (k < 1 || k > L) {  // the text as given: strtol clamps a number beyond a long
                fail("--recompute %s: the segment size must be 1..%d (the model's layers)\n"
                     "  hint: 1 keeps every layer's input, %d is plain training, sqrt picks %d", tok, L, L, (int)ceil(sqrt((double)L)));
            }
            p.segment = (int)k;
        } else {
            fail("--recompute '%s': unknown part '%s'\n  hint: none, sqrt, a segment size 1..%d, gelu, attn; "
                 "combine with commas, e.g. --recompute sqrt,attn", spec, tok, L);
        }
    }
    if (tokens == 0) { fail("--recompute '': empty\n  hint: none, sqrt, a segment size, gelu, attn"); }
    if (none && tokens > 1) { fail("--recompute '%s': 'none' cannot be combined with other parts", spec); }
    if (offload != 0 && offload != 1) { fail("--offload %d: offload is 0 or 1", offload); }
    p.offload = offload;
    p.flash = flash;
    if (flash) { p.attn = 1; }  // flash attention recomputes the weights in backward by design
    if (p.offload && p.segment > 0 && act_num_segments(&p, L) == 1) {
        fail("--offload 1 with --recompute %d: one segment keeps nothing but the embedding, so nothing would move to the host\n"
             "  hint: a segment size below %d, or offload without checkpointing", p.segment, L);
    }
    return p;
}

// ----------------------------------------------------------------------------
// the tensors a layer keeps for its backward, and backward's working buffers: the one table of
// their sizes (in elements) that every backend allocates from and describes to the planner.
// A block, in order: ln1 (B,T,C), ln1_mean, ln1_rstd (B,T), qkv (B,T,3C), atty (B,T,C),
// att (B,NH,T,T), residual2 (B,T,C), ln2 (B,T,C), ln2_mean, ln2_rstd (B,T), fch (B,T,4C),
// fch_gelu (B,T,4C), residual3 (B,T,C). Selective recompute keeps no attention weights or GELU
// output in the block (one shared buffer of each serves every layer); flash attention keeps
// the rows' log-sum-exp (B,NH,T) in att's place and no shared buffer. With --tp N (tp = N) a rank
// computes NH/N heads and 4C/N hidden units: qkv (B,T,3C/N), atty (B,T,C/N), att (B,NH/N,T,T),
// fch and fch_gelu (B,T,4C/N); the LayerNorms and the residual stream stay whole, or with --sp are
// a rank's B T / N rows: ln1, residual2, ln2, residual3 (B T/N, C) and their statistics (B T/N).

#define NUM_LAYER_ACTS 13
#define LAYER_ACT_ATT 5   // the attention weights' entry (flash: the log-sum-exp)

// fp32 on every backend (the others are in the activation precision): the LayerNorm statistics,
// and flash attention's log-sum-exp
static int layer_act_is_stat(int i, const ActPolicy* pol) {
    static const int STAT[NUM_LAYER_ACTS] = {0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0};
    return STAT[i] || (i == LAYER_ACT_ATT && pol->flash);
}

// the one buffer of attention weights that selective recompute shares between layers (elements;
// 0 when each layer keeps its own, or flash attention keeps none); NH: a rank's heads with --tp
static size_t act_shared_att_elems(const ActPolicy* pol, int B, int T, int NH) {
    return pol->attn && !pol->flash ? (size_t)B * NH * T * T : 0;
}

static void layer_act_elems(size_t n[NUM_LAYER_ACTS], int B, int T, int C, int NH, int tp, const ActPolicy* pol) {
    size_t BT = (size_t)B * T, Ct = (size_t)C / tp, NHt = (size_t)NH / tp, R = act_residual_rows(pol, BT, tp);
    size_t att = pol->flash ? (size_t)B * NHt * T : pol->attn ? 0 : (size_t)B * NHt * T * T;
    size_t gelu = pol->gelu ? 0 : BT * 4 * Ct;
    size_t sizes[NUM_LAYER_ACTS] = {
        R * C, R, R, BT * 3 * Ct, BT * Ct, att, R * C,
        R * C, R, R, BT * 4 * Ct, gelu, R * C,
    };
    memcpy(n, sizes, sizeof(sizes));
}

// backward's buffers, one layer's worth, reused by every layer: dresidual, dbtc (B,T,C),
// dqkv (B,T,3C), dfch_gelu, dfch (B,T,4C), datt (B,NH,T,T; none with flash attention); with --tp
// a rank's: dqkv (B,T,3C/N), dfch_gelu, dfch (B,T,4C/N), datt (B,NH/N,T,T); with --sp dresidual
// is a rank's rows (B T/N, C)
#define NUM_BACKWARD_BUFFERS 6
static void backward_buffer_elems(size_t n[NUM_BACKWARD_BUFFERS], int B, int T, int C, int NH, int tp, const ActPolicy* pol) {
    size_t BTC = (size_t)B * T * C, BTCt = BTC / tp, RC = act_residual_rows(pol, (size_t)B * T, tp) * C;
    size_t datt = pol->flash ? 0 : (size_t)B * (NH / tp) * T * T;
    size_t sizes[NUM_BACKWARD_BUFFERS] = {RC, BTC, 3 * BTCt, 4 * BTCt, 4 * BTCt, datt};
    memcpy(n, sizes, sizeof(sizes));
}

// ----------------------------------------------------------------------------
// the head in chunks (--loss-chunk K): the classifier is the model's last operation, so its
// forward and backward can run together, K tokens at a time. For each chunk the forward computes
// the final LayerNorm's output, the logits (K,Vp), softmax, losses and (training) at once the
// logits' gradient, its part of d(lnf output) and of wte's gradient (fp32, += over the chunks);
// what it keeps is the per-token losses and what the final LayerNorm's backward reads (its
// statistics; d(lnf output) in backward's (B,T,C) buffer). The (B,T,Vp) logits never exist at
// once: the head holds K rows, not B*T. No FLOP is done twice (the backward's head work moves
// into the forward). Without the flag K = B*T and the forward keeps the logits for the backward.

// checks --loss-chunk and sets it in p
static void act_policy_set_loss_chunk(ActPolicy* p, int tokens) {
    if (tokens < 0) {
        fail("--loss-chunk %d: a chunk is a number of tokens, 0 for the whole batch at once\n"
             "  hint: --loss-chunk 4096 (a GPU is kept busy by a few thousand tokens at d12), or 0", tokens);
    }
    p->loss_chunk = tokens;
}

// K: the rows of the head's chunk for micro-batches of BT tokens (BT without --loss-chunk, or when
// a chunk would hold the whole batch)
static int act_head_rows(const ActPolicy* p, size_t BT) {
    return p->loss_chunk > 0 && (size_t)p->loss_chunk < BT ? p->loss_chunk : (int)BT;
}

// ----------------------------------------------------------------------------
// the schedule: what moves or runs again around each layer

// after layer l's forward, what the backend stores
typedef struct {
    int segment_input;  // checkpointing: keep l's output as the input of this segment (-1: none),
                        // in device memory, or in the host store with offload
    int offload_layer;  // offload without checkpointing: move l's block to the host store (-1: none)
} ActStore;

static ActStore act_after_forward(const ActPolicy* p, int L, int l) {
    ActStore st = {-1, -1};
    int k = p->segment;
    if (k > 0) {
        if ((l + 1) % k == 0 && l + 1 < L) { st.segment_input = (l + 1) / k; }
    } else if (l < act_offloaded_layers(p, L)) {
        st.offload_layer = l;
    }
    return st;
}

// before layer l's backward, what brings its block and its input into the working set
typedef struct {
    int restore_segment;                  // checkpointing + offload: bring this segment's input back
                                          // from the host store into the staging buffer (-1: none)
    int recompute_segment;                // checkpointing: run this segment's forward again from its
                                          // input (-1: none; the last segment is still in place)
    int recompute_first, recompute_last;  // its layers
    int fetch[2];                         // offload: bring these layers' blocks back (l, then its
                                          // input's layer l-1), unless still in their slots (-1: none,
                                          // or a last layer, never stored)
    int prefetch;                         // offload: a block that may come back while l computes
                                          // (l-2, into the slot l+1's backward is done with; -1: none)
    int prefetch_segment;                 // checkpointing + offload: the next segment input that may
                                          // come back while this segment computes (-1: none)
} ActBackwardPlan;

static ActBackwardPlan act_before_backward(const ActPolicy* p, int L, int l) {
    ActBackwardPlan bp = {.restore_segment = -1, .recompute_segment = -1, .recompute_first = -1, .recompute_last = -1,
                          .fetch = {-1, -1}, .prefetch = -1, .prefetch_segment = -1};
    int k = p->segment;
    if (k > 0) {
        int s = l / k, first = s * k, last = act_min(L, first + k) - 1;
        if (l != last) { return bp; }  // the segment was recomputed at its last layer
        if (p->offload && s > 0) { bp.restore_segment = s; }
        if (p->offload && s > 1) { bp.prefetch_segment = s - 1; }
        if (s < act_num_segments(p, L) - 1) { bp.recompute_segment = s; bp.recompute_first = first; bp.recompute_last = last; }
    } else if (p->offload) {
        int stored = act_offloaded_layers(p, L);
        bp.fetch[0] = l < stored ? l : -1;
        bp.fetch[1] = l - 1 >= 0 && l - 1 < stored ? l - 1 : -1;
        bp.prefetch = l - 2 >= 0 && l - 2 < stored ? l - 2 : -1;
    }
    return bp;
}

// "k=4 (3 segments), gelu, attn, offload" or "none", for the configuration table
static void act_policy_describe(const ActPolicy* p, int L, char* out, size_t n) {
    int used = 0;
    out[0] = '\0';
    if (p->segment > 0) { used += snprintf(out + used, n - used, "segments of k=%d layers (%d segments)", p->segment, act_num_segments(p, L)); }
    if (p->gelu) { used += snprintf(out + used, n - used, "%sgelu", used ? ", " : ""); }
    if (p->flash) { used += snprintf(out + used, n - used, "%sflash attention", used ? ", " : ""); }
    else if (p->attn) { used += snprintf(out + used, n - used, "%sattn", used ? ", " : ""); }
    if (p->offload) { used += snprintf(out + used, n - used, "%soffload to host", used ? ", " : ""); }
    if (p->loss_chunk > 0) { used += snprintf(out + used, n - used, "%sloss in chunks of %d tokens", used ? ", " : "", p->loss_chunk); }
    if (p->sp) { used += snprintf(out + used, n - used, "%s--sp: the residual stream a rank's rows", used ? ", " : ""); }
    if (used == 0) { snprintf(out, n, "none: every layer keeps its activations"); }
}

// --offload optimizer (a GPU's): what of the optimizer lives in host memory
typedef enum {
    OPT_OFFLOAD_NONE,    // everything on the GPU
    OPT_OFFLOAD_STATE,   // fp32 master weights, optimizer state and the update on the host; the step's
                         // gradients build up on the GPU and go down during the last micro-step
    OPT_OFFLOAD_GRADS,   // also the gradients: each micro-step's go down layer by layer and the host
                         // adds them; the GPU keeps two layers' (least GPU memory, most traffic)
} OptOffload;

// --offload: a comma list of activations (or 1), optimizer and gradients (with optimizer), or
// 0 / none alone
static void offload_parse(const char* spec, int* activations, OptOffload* optimizer) {
    *activations = 0;
    *optimizer = OPT_OFFLOAD_NONE;
    if (strcmp(spec, "0") == 0 || strcmp(spec, "none") == 0) { return; }
    char buf[64];
    if (strlen(spec) >= sizeof(buf)) { fail("--offload '%.40s...': too long (a comma list of activations, optimizer, gradients)", spec); }
    memcpy(buf, spec, strlen(spec) + 1);
    int opt = 0, grads = 0;
    for (char* w = strtok(buf, ","); w != NULL; w = strtok(NULL, ",")) {
        if (strcmp(w, "1") == 0 || strcmp(w, "activations") == 0) { *activations = 1; }
        else if (strcmp(w, "optimizer") == 0) { opt = 1; }
        else if (strcmp(w, "gradients") == 0) { grads = 1; }
        else {
            fail("--offload %s: '%s' is not something that moves to host memory\n"
                 "  hint: a comma list of activations (or 1), optimizer, gradients (with optimizer); 0 or none for nothing", spec, w);
        }
    }
    if (grads && !opt) {
        fail("--offload %s: gradients go to the host only with the optimizer, which updates the weights there\n"
             "  hint: --offload optimizer,gradients", spec);
    }
    if (!*activations && !opt) { fail("--offload '%s': name what moves: activations (or 1), optimizer; 0 for nothing", spec); }
    *optimizer = !opt ? OPT_OFFLOAD_NONE : grads ? OPT_OFFLOAD_GRADS : OPT_OFFLOAD_STATE;
}

// --loss-chunk: the backward takes the head's gradients that the micro-step's forward computed
// (gpt2_forward_train, which leaves its loss_scale in *computed) for the same loss_scale, once
static void act_take_head_grads(float* computed, float loss_scale) {
    if (*computed != loss_scale) {
        fail("gpt2_backward with --loss-chunk: the last forward computed the head's gradients for loss_scale %g, not %g\n"
             "  hint: run the micro-step's forward with gpt2_forward_train and the same loss_scale", *computed, loss_scale);
    }
    *computed = 0.0f;
}

#endif // LLMC_ACT_POLICY_H
