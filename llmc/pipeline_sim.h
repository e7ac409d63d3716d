/*
pipeline_sim.h: every stage's list (llmc/pipeline.h) run together, on a model of time and of blocking
messages: does the step finish (no deadlock), when does each action start and end, how long is the step.
tests/test_pipeline.c holds the schedules to it; scripts/plot_pipeline.py draws its timeline.

    PpPipeline p = pp_pipeline_new(PP_1F1B, 4, 8);                    // the 4 stages' lists
    PpSimResult r = pp_simulate(&p, PP_UNIT_COSTS, PP_SENDS_RENDEZVOUS); // r.finished, r.makespan, p.start, p.end
    pp_pipeline_free(&p);

The model:
- A stage runs its list in order, one action at a time, each as soon as it can: a forward takes
  costs.forward, a backward costs.backward; a message takes no time (on a GPU the messages run on a
  stream of their own, beside the compute: the planner prices their time).
- Sends (PpSendModel): RENDEZVOUS, the model the tests assume, because it is the strict one: a send
  completes only when the neighbour posts the matching receive. That is MPI_Send's behaviour beyond
  the eager limit (tens of KiB; a (B,T,C) message is MiBs) and ncclSend's; a list that finishes under
  it finishes under any buffering. BUFFERED: a link holds one message, and a send completes at once
  if its link is empty (what an eager MPI_Send of small messages gives), to show what buffering hides.
- Matching: the n-th send on a link meets the n-th receive (NCCL has no tags, only order); a receive
  that meets another micro-batch's message stops the simulation and says so.
- An action with_next posts its send and the next action's receive together, and completes when both
  have (MPI_Sendrecv; ncclSend and ncclRecv in one group).
- Deadlock: no stage can complete its current action, and not every list has ended. The result says
  where each stage waits.
*/
#ifndef LLMC_PIPELINE_SIM_H
#define LLMC_PIPELINE_SIM_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipeline.h"
#include "utils.h"

typedef enum {
    PP_SENDS_RENDEZVOUS,  // a send completes when the neighbour posts the matching receive
    PP_SENDS_BUFFERED,    // a link holds one message: a send completes at once if its link is empty
} PpSendModel;

typedef struct { double forward, backward; } PpCosts;  // the time of one micro-batch's forward and backward on a stage
static const PpCosts PP_UNIT_COSTS = {.forward = 1.0, .backward = 1.0};

// every stage's list and, once simulated, each action's times
typedef struct {
    PpSchedule schedule;
    int N, m;            // stages, micro-batches
    int cap;             // room for a stage's list: PP_MAX_ACTIONS(m)
    PpAction* actions;   // (N, cap): stage s's list at actions + s * cap
    int* count;          // (N) the actions of each list
    double *start, *end; // (N, cap) each action's start (posted) and end; -1 for one that never completed
} PpPipeline;

static PpAction* pp_list(const PpPipeline* p, int s) { return p->actions + (size_t)s * p->cap; }

static PpPipeline pp_pipeline_new(PpSchedule sch, int N, int m) {
    size_t slots = (size_t)N * PP_MAX_ACTIONS(m);
    PpPipeline p = {.schedule = sch, .N = N, .m = m, .cap = PP_MAX_ACTIONS(m),
                    .actions = (PpAction*)malloc_check(slots * sizeof(PpAction)),
                    .count = (int*)malloc_check((size_t)N * sizeof(int)),
                    .start = (double*)malloc_check(slots * sizeof(double)),
                    .end = (double*)malloc_check(slots * sizeof(double))};
    for (int s = 0; s < N; s++) { p.count[s] = pp_schedule(sch, N, s, m, pp_list(&p, s)); }
    return p;
}

static void pp_pipeline_free(PpPipeline* p) {
    free(p->actions);
    free(p->count);
    free(p->start);
    free(p->end);
}

typedef struct {
    int finished;     // 1: every stage ran its whole list
    double makespan;  // the last action's end (finished only)
    char why[512];    // not finished: where each stuck stage waits, or the message that met the wrong receive
} PpSimResult;

// ----------------------------------------------------------------------------
// the simulation's state

// a stage: where it is in its list, and which halves of its current action (a message, or a send
// and a receive posted as one exchange) have completed
typedef struct {
    int pc;               // the current action
    double clock;         // when the stage reached it (posted it)
    int done[2];          // the current action's halves completed: the action, and with_next's receive
    double done_at[2];
} PpStageRun;

// the one-message buffer of a directed link (BUFFERED): activations s -> s+1, gradients s+1 -> s
typedef struct { int full, micro; double sent_at; } PpLinkBuffer;

typedef struct {
    PpPipeline* p;
    PpSendModel model;
    PpStageRun* st;      // (N)
    PpLinkBuffer* acts;  // (N) the link s -> s+1
    PpLinkBuffer* grads; // (N) the link s -> s-1
    PpSimResult* r;
} PpSim;

// the number of halves of stage s's current action (0 once its list has ended)
static int pp_sim_halves(const PpSim* sim, int s) {
    const PpStageRun* st = &sim->st[s];
    if (st->pc >= sim->p->count[s]) { return 0; }
    return pp_list(sim->p, s)[st->pc].with_next ? 2 : 1;
}
static const PpAction* pp_sim_half(const PpSim* sim, int s, int h) { return &pp_list(sim->p, s)[sim->st[s].pc + h]; }

// a receive meets micro-batch got's message: 1 if it is the one the receive expects; else the
// simulation stops, naming both (0)
static int pp_sim_check_micro(PpSim* sim, int s, const PpAction* recv, int got) {
    if (recv->micro == got) { return 1; }
    snprintf(sim->r->why, sizeof(sim->r->why), "stage %d's %s of micro-batch %d met micro-batch %d's message (the lists send in another order)",
             s, PP_OP_NAMES[recv->op], recv->micro, got);
    return 0;
}

// RENDEZVOUS: half h of stage s's current action, a send or a receive, meets the matching half that
// the neighbour has posted, if it has; both complete at the later of the two posts
static int pp_sim_rendezvous(PpSim* sim, int s, int h) {
    const PpAction* mine = pp_sim_half(sim, s, h);
    int q = s + pp_peer_offset(mine->op);
    PpOp want = mine->op == PP_SEND_ACT ? PP_RECV_ACT : mine->op == PP_RECV_ACT ? PP_SEND_ACT
              : mine->op == PP_SEND_GRAD ? PP_RECV_GRAD : PP_SEND_GRAD;
    for (int k = 0; k < pp_sim_halves(sim, q); k++) {
        const PpAction* theirs = pp_sim_half(sim, q, k);
        if (theirs->op != want || sim->st[q].done[k]) { continue; }
        const PpAction* recv = pp_is_recv(mine->op) ? mine : theirs;
        if (!pp_sim_check_micro(sim, pp_is_recv(mine->op) ? s : q, recv, pp_is_recv(mine->op) ? theirs->micro : mine->micro)) { return -1; }
        double t = sim->st[s].clock > sim->st[q].clock ? sim->st[s].clock : sim->st[q].clock;
        sim->st[s].done[h] = sim->st[q].done[k] = 1;
        sim->st[s].done_at[h] = sim->st[q].done_at[k] = t;
        return 1;
    }
    return 0;
}

// BUFFERED: a send completes if its link is empty, leaving the message there; a receive completes
// when its link holds a message, taking it
static int pp_sim_buffered(PpSim* sim, int s, int h) {
    const PpAction* mine = pp_sim_half(sim, s, h);
    PpStageRun* st = &sim->st[s];
    int down = mine->op == PP_SEND_ACT || mine->op == PP_RECV_ACT;  // activations flow to s+1
    int from = pp_is_send(mine->op) ? s : s + pp_peer_offset(mine->op);
    PpLinkBuffer* link = down ? &sim->acts[from] : &sim->grads[from];
    if (pp_is_send(mine->op)) {
        if (link->full) { return 0; }
        link->full = 1;
        link->micro = mine->micro;
        link->sent_at = st->clock;
        st->done_at[h] = st->clock;
    } else {
        if (!link->full) { return 0; }
        if (!pp_sim_check_micro(sim, s, mine, link->micro)) { return -1; }
        link->full = 0;
        st->done_at[h] = link->sent_at > st->clock ? link->sent_at : st->clock;
    }
    st->done[h] = 1;
    return 1;
}

// completes stage s's current action if it can: 1 if it moved (the action, or a half of it, completed),
// 0 if it waits, -1 on a mismatched message
static int pp_sim_advance(PpSim* sim, int s, PpCosts costs) {
    PpStageRun* st = &sim->st[s];
    int halves = pp_sim_halves(sim, s), progress = 0;
    if (halves == 0) { return 0; }
    const PpAction* a = pp_sim_half(sim, s, 0);
    size_t at = (size_t)s * sim->p->cap + st->pc;
    double end = st->clock;
    if (a->op == PP_FORWARD || a->op == PP_BACKWARD) {
        end += a->op == PP_FORWARD ? costs.forward : costs.backward;
    } else {
        for (int h = 0; h < halves; h++) {
            if (st->done[h]) { continue; }
            int got = sim->model == PP_SENDS_RENDEZVOUS ? pp_sim_rendezvous(sim, s, h) : pp_sim_buffered(sim, s, h);
            if (got < 0) { return -1; }
            progress |= got;
        }
        for (int h = 0; h < halves; h++) {
            if (!st->done[h]) { return progress; }  // a half met its match, but the action waits on the other
            end = st->done_at[h] > end ? st->done_at[h] : end;
        }
    }
    for (int h = 0; h < halves; h++) {
        sim->p->start[at + h] = st->clock;
        sim->p->end[at + h] = end;
    }
    st->pc += halves;
    st->clock = end;
    st->done[0] = st->done[1] = 0;
    return 1;
}

// "stage 1 waits in send act 3 (to stage 2); ..." for a deadlock
static void pp_sim_describe_stuck(const PpSim* sim) {
    size_t used = (size_t)snprintf(sim->r->why, sizeof(sim->r->why), "deadlock:");
    for (int s = 0; s < sim->p->N && used < sizeof(sim->r->why); s++) {
        if (pp_sim_halves(sim, s) == 0) { continue; }
        const PpAction* a = pp_sim_half(sim, s, 0);
        used += (size_t)snprintf(sim->r->why + used, sizeof(sim->r->why) - used, " stage %d waits in %s %d%s (stage %d);", s,
                                 PP_OP_NAMES[a->op], a->micro, a->with_next ? " and the receive after it" : "", s + pp_peer_offset(a->op));
    }
}

// runs every stage's list of p together; fills p->start and p->end
static PpSimResult pp_simulate(PpPipeline* p, PpCosts costs, PpSendModel model) {
    PpSimResult r = {.finished = 0, .makespan = 0.0, .why = ""};
    PpSim sim = {.p = p, .model = model,
                 .st = (PpStageRun*)calloc((size_t)p->N, sizeof(PpStageRun)),
                 .acts = (PpLinkBuffer*)calloc((size_t)p->N, sizeof(PpLinkBuffer)),
                 .grads = (PpLinkBuffer*)calloc((size_t)p->N, sizeof(PpLinkBuffer)),
                 .r = &r};
    if (sim.st == NULL || sim.acts == NULL || sim.grads == NULL) { fail("pp_simulate: out of memory for %d stages", p->N); }
    for (size_t k = 0; k < (size_t)p->N * p->cap; k++) { p->start[k] = p->end[k] = -1.0; }
    int mismatch = 0;
    while (!mismatch) {
        int progress = 0, ended = 0;
        for (int s = 0; s < p->N && !mismatch; s++) {  // each stage as far as it goes
            int got;
            while ((got = pp_sim_advance(&sim, s, costs)) > 0) { progress = 1; }
            mismatch = got < 0;
            ended += sim.st[s].pc >= p->count[s];
        }
        if (mismatch) { break; }
        if (ended == p->N) { r.finished = 1; break; }
        if (!progress) { pp_sim_describe_stuck(&sim); break; }
    }
    for (int s = 0; s < p->N && r.finished; s++) { r.makespan = sim.st[s].clock > r.makespan ? sim.st[s].clock : r.makespan; }
    free(sim.st);
    free(sim.acts);
    free(sim.grads);
    return r;
}

#endif // LLMC_PIPELINE_SIM_H
