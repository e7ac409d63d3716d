/*
test_pipeline.c: pipeline parallelism's schedule (llmc/pipeline.h) and its simulation
(llmc/pipeline_sim.h), for both schedules, every N in 1..8 stages and m in 1..16 micro-batches:

- the split of L layers (1..48) into stages: contiguous, as even as L allows, the extra layers where
  pp_stage says; the refusals, each with its reason;
- each stage's list: every micro-batch's forward and backward once, the messages they imply once,
  each receive before the computation that reads it and each send after the one that writes it;
- all stages' lists together under blocking (rendezvous) sends: no deadlock; every dependency between
  stages kept in time; the step's length (m + N - 1)(tf + tb) for tf = tb = 1 and for tf = 1, tb = 2;
  each stage's idle part of it pp_bubble_fraction;
- memory: the micro-batches a stage holds at once (simulated) against min(N - s, m) (1F1B) and m
  (GPipe), and pp_act_slot's slots never shared by two of them;
- the order each gradient of a stage adds its micro-batches in: 0, 1, ... m-1, as in one process;
- which backwards find their forward still in the working buffers (pp_forward_in_place);
- why the exchanges: without them 1F1B deadlocks under rendezvous sends (exactly when N >= 2 and
  m >= 2), and finishes when a link buffers one message.

    make build/test_pipeline && ./build/test_pipeline
    ./build/test_pipeline --print 1f1b 4 8    # the timeline (stage op micro start end), for scripts/plot_pipeline.py

Prints "ok name" or "FAIL name: detail" per check (each over all N and m, the first failing case
named), then "N passed, N failed"; exits non-zero on a failure.
*/
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../llmc/pipeline.h"
#include "../llmc/pipeline_sim.h"
#include "check.h"

#define MAX_STAGES 8
#define MAX_MICRO 16
#define MAX_LAYERS 48

// ----------------------------------------------------------------------------
// a check over many cases: counts the failing ones and keeps the first one's detail

typedef struct {
    const char* name;
    int cases, failed;
    char first[400];
} Tally;

static void tally(Tally* t, int ok, const char* fmt, ...) {
    t->cases++;
    if (ok) { return; }
    if (t->failed++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(t->first, sizeof(t->first), fmt, ap);
        va_end(ap);
    }
}

static void tally_report(const Tally* t) {
    check(t->failed == 0 && t->cases > 0, t->name, "%d of %d cases failed, the first: %s", t->failed, t->cases, t->first);
}

// ----------------------------------------------------------------------------
// the split and the refusals

static void test_split(void) {
    Tally t = {.name = "split: N stages of contiguous layers covering 0..L-1, base or base + 1 each, the extra on stages N-1-extra .. N-2"};
    for (int L = 1; L <= MAX_LAYERS; L++) {
        for (int N = 1; N <= MAX_STAGES && N <= L; N++) {
            int next = 0, base = L / N, extra = L % N, ok = 1;
            for (int s = 0; s < N; s++) {
                PpStage st = pp_stage(L, N, s);
                int want = base + (s >= N - 1 - extra && s < N - 1);
                ok &= st.first == next && st.layers == want && st.layers >= 1;
                ok &= st.embeddings == (s == 0) && st.head == (s == N - 1);
                next = st.first + st.layers;
            }
            tally(&t, ok && next == L, "L=%d N=%d: the stages end at %d", L, N, next);
        }
    }
    tally_report(&t);
    char line[512];
    pp_split_describe(12, 4, line, sizeof(line));
    const char* want12 = "0: layers 0-2 + embeddings, 1: layers 3-5, 2: layers 6-8, 3: layers 9-11 + final LayerNorm, classifier";
    check(strcmp(line, want12) == 0, "split: described in one line (L=12, N=4)", "'%s', not '%s'", line, want12);
    pp_split_describe(7, 3, line, sizeof(line));  // 2, 3, 2: the extra layer on the stage before the last
    const char* want7 = "0: layers 0-1 + embeddings, 1: layers 2-4, 2: layers 5-6 + final LayerNorm, classifier";
    check(strcmp(line, want7) == 0, "split: the extra layer before the last stage (L=7, N=3)", "'%s', not '%s'", line, want7);
    pp_split_describe(1, 1, line, sizeof(line));
    check(strcmp(line, "0: layer 0 + embeddings + final LayerNorm, classifier") == 0, "split: one stage of one layer", "'%s'", line);
}

// the message of fail() inside a trap (NULL if it did not stop)
static const char* parse_refusal(const char* name) {
    static FailTrap trap;
    g_fail_trap = &trap;
    if (setjmp(trap.jump) != 0) { return trap.message; }
    pp_schedule_parse(name);
    g_fail_trap = NULL;
    return NULL;
}

static void test_refusals(void) {
    const char* why = pp_refusal(4, 5, 8);
    check(why != NULL && strstr(why, "4 layers do not fill 5 stages") && strstr(why, "hint: --pp 4"),
          "refused: more stages than layers, with a hint", "%s", why ? why : "(accepted)");
    why = pp_refusal(4, 0, 8);
    check(why != NULL && strstr(why, "at least 1 stage"), "refused: 0 stages", "%s", why ? why : "(accepted)");
    why = pp_refusal(4, 2, 0);
    check(why != NULL && strstr(why, "at least 1") && strstr(why, "hint:"), "refused: 0 micro-batches, with a hint", "%s", why ? why : "(accepted)");
    int accepted = 1;
    for (int L = 1; L <= MAX_LAYERS; L++) {
        for (int N = 1; N <= L && N <= MAX_STAGES; N++) { accepted &= pp_refusal(L, N, 1) == NULL; }
    }
    check(accepted, "accepted: every N <= L with m >= 1", "%s", "a valid layout refused");
    why = parse_refusal("pipedream");
    check(why != NULL && strstr(why, "'pipedream'") && strstr(why, "hint: 1f1b") && strstr(why, "gpipe"),
          "refused: an unknown --pp-schedule, naming the known ones", "%s", why ? why : "(accepted)");
    check(parse_refusal("1f1b") == NULL && pp_schedule_parse("1f1b") == PP_1F1B && pp_schedule_parse("gpipe") == PP_GPIPE,
          "--pp-schedule 1f1b and gpipe parse", "%s", "not parsed");
}

// ----------------------------------------------------------------------------
// one stage's list

// where the list holds (op, micro): its index, -1 if absent; *times: how often
static int find(const PpAction* a, int n, PpOp op, int micro, int* times) {
    int at = -1;
    *times = 0;
    for (int k = 0; k < n; k++) {
        if (a[k].op == op && a[k].micro == micro) { at = k; ++*times; }
    }
    return at;
}

// every micro-batch's forward and backward once, and the messages stage s has once (none it has not)
static int once_each(const PpAction* a, int n, int N, int s, int m, char* why, size_t len) {
    int has[PP_NUM_OPS] = {[PP_FORWARD] = 1, [PP_BACKWARD] = 1, [PP_RECV_ACT] = s > 0, [PP_SEND_ACT] = s < N - 1,
                           [PP_RECV_GRAD] = s < N - 1, [PP_SEND_GRAD] = s > 0};
    int total = 0;
    for (int op = 0; op < PP_NUM_OPS; op++) {
        for (int i = 0; i < m; i++) {
            int times;
            find(a, n, (PpOp)op, i, &times);
            if (times != has[op]) { snprintf(why, len, "stage %d: %s %d %d times, not %d", s, PP_OP_NAMES[op], i, times, has[op]); return 0; }
            total += times;
        }
    }
    if (total != n || n > PP_MAX_ACTIONS(m)) { snprintf(why, len, "stage %d: %d actions, %d expected (room %d)", s, n, total, PP_MAX_ACTIONS(m)); return 0; }
    return 1;
}

// in the list: a micro-batch's receive of activations before its forward, its forward before the
// send of its output, the receive of its gradient before its backward, its backward before the send
// of its input's gradient, its forward before its backward
static int in_order(const PpAction* a, int n, int m, char* why, size_t len) {
    static const PpOp BEFORE[5][2] = {{PP_RECV_ACT, PP_FORWARD}, {PP_FORWARD, PP_SEND_ACT}, {PP_RECV_GRAD, PP_BACKWARD},
                                      {PP_BACKWARD, PP_SEND_GRAD}, {PP_FORWARD, PP_BACKWARD}};
    for (int i = 0; i < m; i++) {
        for (int r = 0; r < 5; r++) {
            int t0, t1, k0 = find(a, n, BEFORE[r][0], i, &t0), k1 = find(a, n, BEFORE[r][1], i, &t1);
            if (t0 && t1 && k0 > k1) {
                snprintf(why, len, "%s %d at %d after %s %d at %d", PP_OP_NAMES[BEFORE[r][0]], i, k0, PP_OP_NAMES[BEFORE[r][1]], i, k1);
                return 0;
            }
        }
    }
    return 1;
}

// with_next only on a send that a receive from the same neighbour follows
static int exchanges_paired(const PpAction* a, int n) {
    for (int k = 0; k < n; k++) {
        if (!a[k].with_next) { continue; }
        if (k + 1 >= n || !pp_is_send(a[k].op) || !pp_is_recv(a[k + 1].op) || pp_peer_offset(a[k].op) != pp_peer_offset(a[k + 1].op)) { return 0; }
    }
    return 1;
}

// no two micro-batches held at once (from arrival to backward, as pp_max_in_flight counts) in one slot
static int slots_distinct(const PpAction* a, int n, int slots, int m) {
    int owner[MAX_MICRO];
    for (int k = 0; k < slots; k++) { owner[k] = -1; }
    PpOp arrival = PP_FORWARD;
    for (int k = 0; k < n; k++) { arrival = a[k].op == PP_RECV_ACT ? PP_RECV_ACT : arrival; }
    for (int k = 0; k < n; k++) {
        int i = a[k].micro, slot = pp_act_slot(i, slots);
        if (i < 0 || i >= m) { return 0; }
        if (a[k].op == arrival) {
            if (owner[slot] != -1) { return 0; }
            owner[slot] = i;
        }
        if (a[k].op == PP_BACKWARD) { owner[slot] = -1; }
    }
    return 1;
}

// ----------------------------------------------------------------------------
// all stages together

// start and end of (op, micro) on stage s, from the simulation
static double t_start(const PpPipeline* p, int s, PpOp op, int i) {
    int times, k = find(pp_list(p, s), p->count[s], op, i, &times);
    return k < 0 ? -1.0 : p->start[(size_t)s * p->cap + k];
}
static double t_end(const PpPipeline* p, int s, PpOp op, int i) {
    int times, k = find(pp_list(p, s), p->count[s], op, i, &times);
    return k < 0 ? -1.0 : p->end[(size_t)s * p->cap + k];
}

// forward i on s after forward i on s-1; backward i on s after backward i on s+1 and after forward i on s
static int dependencies_kept(const PpPipeline* p, char* why, size_t len) {
    for (int s = 0; s < p->N; s++) {
        for (int i = 0; i < p->m; i++) {
            double f = t_start(p, s, PP_FORWARD, i), b = t_start(p, s, PP_BACKWARD, i);
            if (s > 0 && f < t_end(p, s - 1, PP_FORWARD, i)) { snprintf(why, len, "stage %d's forward %d at %g, before stage %d's ends", s, i, f, s - 1); return 0; }
            if (s < p->N - 1 && b < t_end(p, s + 1, PP_BACKWARD, i)) { snprintf(why, len, "stage %d's backward %d at %g, before stage %d's ends", s, i, b, s + 1); return 0; }
            if (b < t_end(p, s, PP_FORWARD, i)) { snprintf(why, len, "stage %d's backward %d at %g, before its forward ends", s, i, b); return 0; }
        }
    }
    return 1;
}

// the time stage s computes
static double busy(const PpPipeline* p, int s) {
    double t = 0.0;
    for (int k = 0; k < p->count[s]; k++) {
        PpOp op = pp_list(p, s)[k].op;
        if (op == PP_FORWARD || op == PP_BACKWARD) { t += p->end[(size_t)s * p->cap + k] - p->start[(size_t)s * p->cap + k]; }
    }
    return t;
}

// the checks of one schedule over every N and m
typedef struct {
    Tally once, order, paired, finishes, deps, makespan, bubble, in_flight, slots, accumulation, in_place;
} ScheduleTallies;
#define NUM_SCHEDULE_CHECKS 11

static void check_case(ScheduleTallies* t, PpSchedule sch, int N, int m) {
    const char* name = PP_SCHEDULE_NAMES[sch];
    PpPipeline p = pp_pipeline_new(sch, N, m);
    char why[300] = "";
    int order[PP_MAX_ACTIONS(MAX_MICRO)];
    for (int s = 0; s < N; s++) {
        const PpAction* a = pp_list(&p, s);
        int n = p.count[s];
        tally(&t->once, once_each(a, n, N, s, m, why, sizeof(why)), "%s N=%d m=%d: %s", name, N, m, why);
        tally(&t->order, in_order(a, n, m, why, sizeof(why)), "%s N=%d m=%d stage %d: %s", name, N, m, s, why);
        tally(&t->paired, exchanges_paired(a, n), "%s N=%d m=%d stage %d: with_next on another pair", name, N, m, s);
        int held = pp_max_in_flight(a, n), want = sch == PP_GPIPE ? m : (N - s < m ? N - s : m);
        tally(&t->in_flight, held == want, "%s N=%d m=%d stage %d: holds %d micro-batches, the formula %d", name, N, m, s, held, want);
        tally(&t->slots, slots_distinct(a, n, held, m), "%s N=%d m=%d stage %d: two micro-batches held at once share a slot of %d", name, N, m, s, held);
        int in_place = 0, want_in_place = (sch == PP_1F1B && s == N - 1) || m == 1 ? m : 0;
        for (int k = 0; k < n; k++) { in_place += pp_forward_in_place(a, k); }
        tally(&t->in_place, in_place == want_in_place, "%s N=%d m=%d stage %d: %d backwards find their forward in place, not %d",
              name, N, m, s, in_place, want_in_place);
        for (int op = PP_FORWARD; op <= PP_BACKWARD; op++) {
            int count = pp_accumulation_order(a, n, (PpOp)op, order), increasing = count == m;
            for (int i = 0; i < count && increasing; i++) { increasing = order[i] == i; }
            tally(&t->accumulation, increasing, "%s N=%d m=%d stage %d: the %ss run micro-batches %d, %d, ... (%d of them)",
                  name, N, m, s, PP_OP_NAMES[op], count > 0 ? order[0] : -1, count > 1 ? order[1] : -1, count);
        }
    }
    // the step's length: (m + N - 1)(tf + tb), tf = tb = 1 and tf = 1, tb = 2
    const PpCosts COSTS[2] = {PP_UNIT_COSTS, {.forward = 1.0, .backward = 2.0}};
    for (int c = 0; c < 2; c++) {
        PpSimResult r = pp_simulate(&p, COSTS[c], PP_SENDS_RENDEZVOUS);
        tally(&t->finishes, r.finished, "%s N=%d m=%d: %s", name, N, m, r.why);
        if (!r.finished) { continue; }
        tally(&t->deps, dependencies_kept(&p, why, sizeof(why)), "%s N=%d m=%d: %s", name, N, m, why);
        double tfb = COSTS[c].forward + COSTS[c].backward, want = (m + N - 1) * tfb;
        tally(&t->makespan, r.makespan == want, "%s N=%d m=%d tf=%g tb=%g: the step takes %g, not (m + N - 1)(tf + tb) = %g",
              name, N, m, COSTS[c].forward, COSTS[c].backward, r.makespan, want);
        for (int s = 0; s < N; s++) {
            double idle = (r.makespan - busy(&p, s)) / r.makespan;
            tally(&t->bubble, fabs(idle - pp_bubble_fraction(N, m)) < 1e-12, "%s N=%d m=%d stage %d: idle %.6f of the step, pp_bubble_fraction %.6f",
                  name, N, m, s, idle, pp_bubble_fraction(N, m));
        }
    }
    PpSimResult r = pp_simulate(&p, PP_UNIT_COSTS, PP_SENDS_BUFFERED);
    tally(&t->finishes, r.finished, "%s N=%d m=%d (one-message links): %s", name, N, m, r.why);
    pp_pipeline_free(&p);
}

static void test_schedule(PpSchedule sch) {
    char names[NUM_SCHEDULE_CHECKS][200];
    const char* name = PP_SCHEDULE_NAMES[sch];
    snprintf(names[0], 200, "%s: each micro-batch's forward and backward once a stage, and the messages they imply once", name);
    snprintf(names[1], 200, "%s: each receive before the computation that reads it, each send after the one that writes it", name);
    snprintf(names[2], 200, "%s: an exchange pairs a send with a receive from the same neighbour", name);
    snprintf(names[3], 200, "%s: no deadlock, sends blocking until received (and with one-message links)", name);
    snprintf(names[4], 200, "%s: in time, forward i after the previous stage's, backward i after the next stage's and its own forward", name);
    snprintf(names[5], 200, "%s: the step takes (m + N - 1)(tf + tb) (tf = tb = 1; tf = 1, tb = 2)", name);
    snprintf(names[6], 200, "%s: each stage idle (N - 1)/(m + N - 1) of the step (pp_bubble_fraction)", name);
    snprintf(names[7], 200, "%s: micro-batches held at once, simulated = %s", name, sch == PP_GPIPE ? "m" : "min(N - s, m)");
    snprintf(names[8], 200, "%s: pp_act_slot gives the micro-batches held at once distinct slots", name);
    snprintf(names[9], 200, "%s: every stage's forwards and backwards in micro-batch order 0..m-1 (gradients add up as in one process)", name);
    snprintf(names[10], 200, "%s: backwards that find their forward in place: %s", name,
             sch == PP_GPIPE ? "every one if m = 1, else none" : "every one on the last stage or with m = 1, else none");
    ScheduleTallies t;
    memset(&t, 0, sizeof(t));
    Tally* all[NUM_SCHEDULE_CHECKS] = {&t.once, &t.order, &t.paired, &t.finishes, &t.deps, &t.makespan, &t.bubble, &t.in_flight,
                                       &t.slots, &t.accumulation, &t.in_place};
    for (int k = 0; k < NUM_SCHEDULE_CHECKS; k++) { all[k]->name = names[k]; }
    for (int N = 1; N <= MAX_STAGES; N++) {
        for (int m = 1; m <= MAX_MICRO; m++) { check_case(&t, sch, N, m); }
    }
    for (int k = 0; k < NUM_SCHEDULE_CHECKS; k++) { tally_report(all[k]); }
}

// ----------------------------------------------------------------------------
// why the exchanges, and the simulator's own checks

static void clear_exchanges(PpPipeline* p) {
    for (int s = 0; s < p->N; s++) {
        for (int k = 0; k < p->count[s]; k++) { pp_list(p, s)[k].with_next = 0; }
    }
}

static void test_without_exchanges(void) {
    Tally rdv = {.name = "without exchanges, 1F1B deadlocks under rendezvous sends exactly when N >= 2 and m >= 2"};
    Tally buf = {.name = "without exchanges, 1F1B and GPipe finish with one-message links, in 2 (m + N - 1)"};
    Tally gpipe = {.name = "without exchanges, GPipe finishes under rendezvous sends"};
    for (int N = 1; N <= MAX_STAGES; N++) {
        for (int m = 1; m <= MAX_MICRO; m++) {
            for (int sch = 0; sch < PP_NUM_SCHEDULES; sch++) {
                PpPipeline p = pp_pipeline_new((PpSchedule)sch, N, m);
                clear_exchanges(&p);
                PpSimResult r = pp_simulate(&p, PP_UNIT_COSTS, PP_SENDS_RENDEZVOUS);
                if (sch == PP_1F1B) { tally(&rdv, r.finished == !(N >= 2 && m >= 2), "N=%d m=%d: finished %d (%s)", N, m, r.finished, r.why); }
                else { tally(&gpipe, r.finished, "N=%d m=%d: %s", N, m, r.why); }
                r = pp_simulate(&p, PP_UNIT_COSTS, PP_SENDS_BUFFERED);
                tally(&buf, r.finished && r.makespan == 2.0 * (m + N - 1), "%s N=%d m=%d: finished %d in %g", PP_SCHEDULE_NAMES[sch], N, m, r.finished, r.makespan);
                pp_pipeline_free(&p);
            }
        }
    }
    tally_report(&rdv);
    tally_report(&gpipe);
    tally_report(&buf);
    // the simulator's message matching: stage 0's first two sends swapped meet stage 1's receives out of order
    PpPipeline p = pp_pipeline_new(PP_GPIPE, 2, 2);
    PpAction* a = pp_list(&p, 0);  // F 0, send act 0, F 1, send act 1, ...
    a[1].micro = 1;
    a[3].micro = 0;
    PpSimResult r = pp_simulate(&p, PP_UNIT_COSTS, PP_SENDS_RENDEZVOUS);
    check(!r.finished && strstr(r.why, "met micro-batch 1's message"), "the simulator stops on a message met by another micro-batch's receive", "%s", r.why);
    pp_pipeline_free(&p);
}

static void test_describe(void) {
    char line[512];
    pp_schedule_describe(PP_1F1B, 4, 8, line, sizeof(line));
    const char* want = "1f1b, 4 stages, 8 micro-batches: bubble 3/11 = 27.3%; activations of at most 4, 3, 2, 1 micro-batches (stage 0 .. 3)";
    check(strcmp(line, want) == 0, "1f1b described in one line (N=4, m=8)", "'%s'", line);
    pp_schedule_describe(PP_GPIPE, 2, 1, line, sizeof(line));
    want = "gpipe, 2 stages, 1 micro-batch: bubble 1/2 = 50.0%; activations of at most 1, 1 micro-batches (stage 0 .. 1)";
    check(strcmp(line, want) == 0, "gpipe described in one line (N=2, m=1)", "'%s'", line);
}

// ----------------------------------------------------------------------------

// --print SCHEDULE N M: the simulated timeline's computations, one a line
static int print_timeline(const char* schedule, int N, int m) {
    const char* why = pp_refusal(N, N, m);  // as many layers as stages: a list does not depend on L
    if (why != NULL) { fail("%s", why); }
    PpPipeline p = pp_pipeline_new(pp_schedule_parse(schedule), N, m);
    PpSimResult r = pp_simulate(&p, PP_UNIT_COSTS, PP_SENDS_RENDEZVOUS);
    if (!r.finished) { fail("%s N=%d m=%d: %s", schedule, N, m, r.why); }
    printf("# %s N=%d m=%d makespan %g bubble %.6f\n# held", schedule, N, m, r.makespan, pp_bubble_fraction(N, m));
    for (int s = 0; s < N; s++) { printf(" %d", pp_max_in_flight(pp_list(&p, s), p.count[s])); }  // micro-batches each stage holds at most
    printf("\n# stage op micro start end\n");
    for (int s = 0; s < N; s++) {
        for (int k = 0; k < p.count[s]; k++) {
            const PpAction* a = &pp_list(&p, s)[k];
            if (a->op != PP_FORWARD && a->op != PP_BACKWARD) { continue; }
            printf("%d %s %d %g %g\n", s, PP_OP_NAMES[a->op], a->micro, p.start[(size_t)s * p.cap + k], p.end[(size_t)s * p.cap + k]);
        }
    }
    pp_pipeline_free(&p);
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 5 && strcmp(argv[1], "--print") == 0) { return print_timeline(argv[2], atoi(argv[3]), atoi(argv[4])); }
    if (argc != 1) { fail("usage: %s [--print 1f1b|gpipe N M]", argv[0]); }
    test_split();
    test_refusals();
    test_schedule(PP_1F1B);
    test_schedule(PP_GPIPE);
    test_without_exchanges();
    test_describe();
    return check_summary();
}
