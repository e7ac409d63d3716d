/*
pipeline.h: pipeline parallelism's schedule (--pp N, --pp-schedule 1f1b|gpipe, issue 37): which layers
each stage holds, and the order in which a stage runs its micro-batches' forwards, backwards and
messages. A pure schedule, as llmc/act_policy.h is checkpointing's: every backend follows these lists.

    PpStage st = pp_stage(L, N, s);                // stage s of N: layers st.first .. st.first + st.layers - 1
    PpAction acts[PP_MAX_ACTIONS(8)];
    int n = pp_schedule(PP_1F1B, N, s, 8, acts);   // stage s's actions for 8 micro-batches, in order

The layers are split into N stages of contiguous layers, one stage a rank (Huang et al. 2019, "GPipe:
Efficient Training of Giant Neural Networks using Pipeline Parallelism"). A step's gradient-accumulation
micro-steps become m micro-batches that flow through the stages: stage s receives a micro-batch's
activations (B,T,C), stage s-1's output, runs its layers forward and sends its own output (B,T,C) to
s+1; backward, it receives the gradient of its output (B,T,C) from s+1, runs its layers backward and
sends the gradient of its input (B,T,C) to s-1. The first stage also holds the embeddings (wte, wpe),
the last the final LayerNorm and the classifier (wte again, tied: two copies, see the order below).

The schedules, for stage s of N with m micro-batches (pp_schedule):
- GPipe: all m forwards, then all m backwards, in increasing micro-batch order. A stage holds the
  activations of all m micro-batches at the turn. (GPipe's figure draws the backwards from m-1 down to
  0; that order would add each gradient's micro-batches backwards, not as one process does: see below.)
- 1F1B (PipeDream-Flush, Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training";
  Megatron-LM's non-interleaved schedule): a warmup of min(N - s - 1, m) forwards, then one forward
  and one backward in turn (forward w + k, backward k), then the cooldown's remaining backwards. The
  warmup is what keeps stage s busy until its first gradient comes back from the last stage, so stage
  s holds at most min(N - s, m) micro-batches' activations: N on the first stage, 1 on the last (m on
  all of them with GPipe). With m <= N - s - 1 the warmup takes every forward: GPipe on that stage.
- Both take the same time: with a forward and a backward of one unit each, a step is 2 (m + N - 1)
  units, of which each stage computes 2m; the rest is the bubble, (N - 1) / (m + N - 1) of the step
  (pp_bubble_fraction). 1F1B saves memory, not time. (Interleaved stages, several chunks of layers a
  rank, shrink the bubble by the chunks; not built.)

The messages. A forward on stage s > 0 needs the activations from s-1 (PP_RECV_ACT before it), and a
backward on s < N-1 the gradient from s+1 (PP_RECV_GRAD). Sends block until the neighbour receives
(MPI_Send beyond the eager limit, which a (B,T,C) message is; ncclSend), and in 1F1B's steady state
two neighbours would each send first and wait for the other's receive: stage s sends forward w + k's
output and then waits for backward k's gradient, while s+1 sends a gradient and then waits for
activations. So a send followed by a receive from the same neighbour is posted as one exchange
(with_next: MPI_Sendrecv; ncclSend and ncclRecv in one group), as Megatron-LM's
send_forward_recv_backward and send_backward_recv_forward do. llmc/pipeline_sim.h runs every stage's
list against that model of blocking messages: tests/test_pipeline.c shows that the lists finish, and
that without the exchanges 1F1B deadlocks.

The order in which gradients add up (the issue: bitwise the one process with the same micro-steps).
Every weight gradient is += (cpu/layers.h), and each is added to during one kind of action: a block's
weights, the final LayerNorm's, wpe's and the embedding's part of wte's during the BACKWARD of a
micro-batch; the classifier's part of wte's during the BACKWARD, or with --loss-chunk during the
FORWARD (head_forward computes the head's gradients with the loss). Both schedules run a stage's
forwards in increasing micro-batch order and its backwards in increasing order too (1F1B's backward k
comes in turn k of the steady state or the cooldown): so every gradient of a stage receives micro-batch
0, then 1, ... m-1, as train_step's loop adds them in one process, and each contribution comes from the
same weights and inputs: the same bits (pp_accumulation_order; the test checks every stage). The one
exception is wte, whose gradient two stages hold: one process adds, micro-batch by micro-batch, the
classifier's part then the embedding's (C0 + E0 + C1 + E1 ...); here the last stage sums the C's, the
first stage the E's, and the two sums meet at the end of the step ((C0 + ... ) + (E0 + ...)): equal
within rounding (the 1e-6), not bitwise. The trainer must add the two sums in one fixed order on
both stages, so that their copies of wte get the same bits (doc/pipeline_parallel.md). The loss of each
micro-batch is the last stage's, computed in forward order 0..m-1 and added in that order.

Failure: pp_refusal says why L layers cannot run in N stages with m micro-batches (NULL: they can);
pp_schedule_parse stops on an unknown name, listing the known ones.
*/
#ifndef LLMC_PIPELINE_H
#define LLMC_PIPELINE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model_config.h"
#include "utils.h"

// ----------------------------------------------------------------------------
// the split: N stages of contiguous layers

typedef struct {
    int first, layers;  // the stage's layers: first .. first + layers - 1
    int embeddings;     // 1 on the first stage: wte and wpe, the token and position embeddings
    int head;           // 1 on the last stage: the final LayerNorm and the classifier (wte, tied)
} PpStage;

// why L layers cannot be split into N stages that run m micro-batches a step, or NULL
static const char* pp_refusal(int L, int N, int m) {
    static char why[200];
    if (N < 1) { snprintf(why, sizeof(why), "--pp %d: a pipeline has at least 1 stage", N); return why; }
    if (N > L) {
        snprintf(why, sizeof(why), "--pp %d: the model's %d layers do not fill %d stages (each holds at least one layer)\n"
                 "  hint: --pp %d or fewer", N, L, N, L);
        return why;
    }
    if (m < 1) {
        snprintf(why, sizeof(why), "%d micro-batches a step: the pipeline needs at least 1\n"
                 "  hint: the micro-batches are the gradient-accumulation micro-steps (-d); %d or more keep the bubble below half", m, N - 1);
        return why;
    }
    return NULL;
}

// stage s of N over L layers (pp_refusal(L, N, 1) is NULL): base = L / N layers each, and the
// extra = L % N layers one each to the extra stages just before the last, N-1-extra .. N-2. Why
// there: the last stage also runs the classifier, 2 C Vp FLOPs a token against a layer's 24 C^2 (d12:
// about five layers' worth), so it never takes one more; and 1F1B's stage s holds N - s micro-batches'
// activations, so a layer more costs the first stage the most memory and those near the end the least
static PpStage pp_stage(int L, int N, int s) {
    int base = L / N, extra = L % N, first_extra = N - 1 - extra;
    int extras_before = s - first_extra;  // extra layers in the stages before s
    extras_before = extras_before < 0 ? 0 : extras_before > extra ? extra : extras_before;
    PpStage st = {.first = s * base + extras_before, .layers = base + (s >= first_extra && s < N - 1 ? 1 : 0),
                  .embeddings = s == 0, .head = s == N - 1};
    return st;
}

// the config of stage s of N's part of model c (c: the whole model, or a rank's --tp slices of it): its
// layers, and the outer tensors it holds (model_config.h's gpt2_holds_tensor); N = 1: c itself
static GPT2Config pp_stage_config(const GPT2Config* c, int N, int s) {
    GPT2Config r = *c;
    if (N <= 1) { return r; }
    PpStage st = pp_stage(c->num_layers, N, s);
    r.pp = N;
    r.stage = s;
    r.first_layer = st.first;
    r.num_layers = st.layers;
    return r;
}

#define PP_DESCRIBE_LEN 512      // pp_split_describe's and pp_schedule_describe's lines
#define PP_STAGE_DESCRIBE_LEN 80 // pp_stage_describe's

// stage st's part: "layers 0-2 + embeddings", "layer 5", "layers 9-11 + final LayerNorm, classifier"
static void pp_stage_describe(PpStage st, char* out, size_t n) {
    int last = st.first + st.layers - 1;
    if (st.layers > 1) { snprintf(out, n, "layers %d-%d", st.first, last); }
    else { snprintf(out, n, "layer %d", st.first); }
    if (st.embeddings) { snprintf(out + strlen(out), n - strlen(out), " + embeddings"); }
    if (st.head) { snprintf(out + strlen(out), n - strlen(out), " + final LayerNorm, classifier"); }
}

// "0: layers 0-2 + embeddings, 1: layers 3-5, 2: layers 6-8, 3: layers 9-11 + final LayerNorm,
// classifier", one line for the configuration table
static void pp_split_describe(int L, int N, char* out, size_t n) {
    out[0] = '\0';
    for (int s = 0; s < N; s++) {
        char part[PP_STAGE_DESCRIBE_LEN];
        pp_stage_describe(pp_stage(L, N, s), part, sizeof(part));
        size_t used = strlen(out);
        snprintf(out + used, n - used, "%s%d: %s", s ? ", " : "", s, part);
    }
}

// ----------------------------------------------------------------------------
// the schedules: a stage's ordered list of actions

typedef enum { PP_1F1B, PP_GPIPE, PP_NUM_SCHEDULES } PpSchedule;  // --pp-schedule; 1F1B the default
static const char* const PP_SCHEDULE_NAMES[PP_NUM_SCHEDULES] = {"1f1b", "gpipe"};

// --pp-schedule's value; stops on an unknown name
static PpSchedule pp_schedule_parse(const char* name) {
    for (int i = 0; i < PP_NUM_SCHEDULES; i++) {
        if (strcmp(name, PP_SCHEDULE_NAMES[i]) == 0) { return (PpSchedule)i; }
    }
    fail("--pp-schedule '%s': not a schedule\n"
         "  hint: 1f1b (the default: stage s holds at most N - s micro-batches' activations) or gpipe (all forwards,\n"
         "  then all backwards: every stage holds all m)", name);
    return PP_1F1B;  // not reached
}

typedef enum {
    PP_FORWARD,    // the stage's layers forward (the first stage: from the micro-batch's tokens)
    PP_BACKWARD,   // the stage's layers backward (the last stage: from its loss); every gradient +=
    PP_RECV_ACT,   // receive the micro-batch's activations (B,T,C) from s-1: this stage's input
    PP_SEND_ACT,   // send this stage's output (B,T,C) to s+1
    PP_RECV_GRAD,  // receive the gradient of this stage's output (B,T,C) from s+1
    PP_SEND_GRAD,  // send the gradient of this stage's input (B,T,C) to s-1
    PP_NUM_OPS
} PpOp;
static const char* const PP_OP_NAMES[PP_NUM_OPS] = {"F", "B", "recv act", "send act", "recv grad", "send grad"};

typedef struct {
    PpOp op;
    int micro;      // the micro-batch, 0..m-1
    int with_next;  // 1: a send posted together with the next action, a receive from the same neighbour,
                    // as one exchange that completes when both have (MPI_Sendrecv; ncclSend and ncclRecv
                    // in one ncclGroupStart/End); 0: an action alone
} PpAction;

// a stage's list is at most a forward, a backward and four messages a micro-batch
#define PP_MAX_ACTIONS(m) (6 * (m))

// the neighbour a message goes to or comes from: +1 (stage s+1), -1 (stage s-1), 0 for a computation
static int pp_peer_offset(PpOp op) {
    return op == PP_SEND_ACT || op == PP_RECV_GRAD ? 1 : op == PP_RECV_ACT || op == PP_SEND_GRAD ? -1 : 0;
}
static int pp_is_send(PpOp op) { return op == PP_SEND_ACT || op == PP_SEND_GRAD; }
static int pp_is_recv(PpOp op) { return op == PP_RECV_ACT || op == PP_RECV_GRAD; }

// forwards stage s runs before its first backward: GPipe all m; 1F1B N - s - 1 (or m if fewer), so that
// with the steady state's first forward it holds the N - s micro-batches that keep it busy until the
// first gradient has gone to the last stage and back
static int pp_warmup(PpSchedule sch, int N, int s, int m) {
    int w = N - s - 1;
    return sch == PP_GPIPE ? m : w < m ? w : m;
}

// a list being written, and the halves of moving a micro-batch that stage s has (the first stage
// receives no activations and sends no gradient; the last sends no activations, receives no gradient)
typedef struct { PpAction* a; int n, s, N; } PpList;

static void pp_push(PpList* l, PpOp op, int micro) {
    PpAction x = {.op = op, .micro = micro, .with_next = 0};
    l->a[l->n++] = x;
}
static void pp_emit_recv_act(PpList* l, int i) { if (l->s > 0) { pp_push(l, PP_RECV_ACT, i); } }
static void pp_emit_recv_grad(PpList* l, int i) { if (l->s < l->N - 1) { pp_push(l, PP_RECV_GRAD, i); } }
static void pp_emit_forward(PpList* l, int i) {
    pp_push(l, PP_FORWARD, i);
    if (l->s < l->N - 1) { pp_push(l, PP_SEND_ACT, i); }
}
static void pp_emit_backward(PpList* l, int i) {
    pp_push(l, PP_BACKWARD, i);
    if (l->s > 0) { pp_push(l, PP_SEND_GRAD, i); }
}

// marks each send that is followed by a receive from the same neighbour: one exchange (with_next)
static void pp_pair_exchanges(PpAction* a, int n) {
    for (int k = 0; k + 1 < n; k++) {
        a[k].with_next = pp_is_send(a[k].op) && pp_is_recv(a[k + 1].op) && pp_peer_offset(a[k].op) == pp_peer_offset(a[k + 1].op);
    }
}

// stage s's actions for m micro-batches under schedule sch, in order, into out (room for
// PP_MAX_ACTIONS(m)); returns their number. One list serves both schedules: GPipe is the warmup
// stretched over every forward (m - w = 0 turns of the steady state)
static int pp_schedule(PpSchedule sch, int N, int s, int m, PpAction* out) {
    PpList l = {.a = out, .n = 0, .s = s, .N = N};
    int w = pp_warmup(sch, N, s, m), steady = m - w;
    for (int i = 0; i < w; i++) {  // warmup: forwards only
        pp_emit_recv_act(&l, i);
        pp_emit_forward(&l, i);
    }
    if (steady > 0) { pp_emit_recv_act(&l, w); }
    for (int k = 0; k < steady; k++) {  // steady state: forward w + k, then backward k
        pp_emit_forward(&l, w + k);
        pp_emit_recv_grad(&l, k);  // with the send above: one exchange with s+1
        pp_emit_backward(&l, k);
        if (k + 1 < steady) { pp_emit_recv_act(&l, w + k + 1); }  // with the send above: one exchange with s-1
    }
    for (int k = steady; k < m; k++) {  // cooldown: the backwards of the warmup's forwards
        pp_emit_recv_grad(&l, k);
        pp_emit_backward(&l, k);
    }
    pp_pair_exchanges(out, l.n);
    return l.n;
}

// ----------------------------------------------------------------------------
// what a list implies: memory, buffer slots, the order of the gradients' sums, the bubble

// the most micro-batches whose activations the stage holds at once, walking its list: a micro-batch is
// held from its input's arrival (its PP_RECV_ACT; on the first stage, which receives none, its
// forward) to the end of its backward. This counts the received inputs (B,T,C) the stage keeps for its
// first layer's backward; the activations its layers keep (act_policy.h's blocks, from the forward)
// are held over a part of that time, so never by more micro-batches
static int pp_max_in_flight(const PpAction* a, int n) {
    PpOp arrival = PP_FORWARD;
    for (int k = 0; k < n; k++) {
        if (a[k].op == PP_RECV_ACT) { arrival = PP_RECV_ACT; }
    }
    int held = 0, most = 0;
    for (int k = 0; k < n; k++) {
        if (a[k].op == arrival) { held++; }
        if (a[k].op == PP_BACKWARD) { held--; }
        most = held > most ? held : most;
    }
    return most;
}

// the micro-batches stage s of N holds at once over a step of m (pp_max_in_flight of its list): the
// activation sets a stage allocates (1 without a pipeline)
static int pp_stage_held(PpSchedule sch, int N, int s, int m) {
    if (N <= 1) { return 1; }
    PpAction* a = (PpAction*)malloc_check((size_t)PP_MAX_ACTIONS(m) * sizeof(PpAction));
    int held = pp_max_in_flight(a, pp_schedule(sch, N, s, m, a));
    free(a);
    return held;
}

// the buffer slot of micro-batch i's activations on a stage that keeps `slots` sets of them
// (pp_max_in_flight): backwards run in the forwards' order, so the micro-batches held at once are
// consecutive and i % slots tells them apart
static int pp_act_slot(int micro, int slots) { return micro % slots; }

// whether the backward at list index k finds its own forward still in the working buffers: the
// stage's computation just before it (messages aside) was that micro-batch's forward. llmc/act_policy.h
// counts on it (checkpointing does not recompute the last segment, offload never stores the last three
// layers, and the head's backward reads the logits or --loss-chunk's d(lnf output) that the forward
// left): where it does not hold, another micro-batch's forward has overwritten them in between. 1F1B:
// on the last stage, and anywhere with m = 1; GPipe: with m = 1 only
static int pp_forward_in_place(const PpAction* a, int k) {
    int j = k - 1;
    while (j >= 0 && a[j].op != PP_FORWARD && a[j].op != PP_BACKWARD) { j--; }
    return a[k].op == PP_BACKWARD && j >= 0 && a[j].op == PP_FORWARD && a[j].micro == a[k].micro;
}

// the micro-batches in the order the stage's actions of kind op run them (PP_BACKWARD: the order in
// which each of the stage's gradients receives its micro-batches' contributions; PP_FORWARD: that of
// the classifier's part of wte with --loss-chunk, and of the losses); returns their number
static int pp_accumulation_order(const PpAction* a, int n, PpOp op, int* micro) {
    int count = 0;
    for (int k = 0; k < n; k++) {
        if (a[k].op == op) { micro[count++] = a[k].micro; }
    }
    return count;
}

// the part of the step each stage waits, with a forward and a backward of one unit each: the step
// takes 2 (m + N - 1) units, a stage computes 2m of them (tests/test_pipeline.c simulates it)
static double pp_bubble_fraction(int N, int m) { return (double)(N - 1) / (double)(m + N - 1); }

// "1f1b, 4 stages, 8 micro-batches: bubble 3/11 = 27.3%; activations of at most 4, 3, 2, 1
// micro-batches (stage 0 .. 3)", one line for the configuration table
static void pp_schedule_describe(PpSchedule sch, int N, int m, char* out, size_t n) {
    PpAction* a = (PpAction*)malloc_check((size_t)PP_MAX_ACTIONS(m) * sizeof(PpAction));
    size_t used = (size_t)snprintf(out, n, "%s, %d stage%s, %d micro-batch%s: bubble %d/%d = %.1f%%; activations of at most ",
                                   PP_SCHEDULE_NAMES[sch], N, N > 1 ? "s" : "", m, m > 1 ? "es" : "", N - 1, m + N - 1,
                                   100.0 * pp_bubble_fraction(N, m));
    for (int s = 0; s < N && used < n; s++) {
        int held = pp_max_in_flight(a, pp_schedule(sch, N, s, m, a));
        used += (size_t)snprintf(out + used, n - used, "%s%d", s ? ", " : "", held);
    }
    if (used < n) { snprintf(out + used, n - used, " micro-batches (stage 0 .. %d)", N - 1); }
    free(a);
}

#endif // LLMC_PIPELINE_H
