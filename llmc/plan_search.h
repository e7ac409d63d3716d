/*
plan_search.h: --plan with a memory budget. Every combination of the memory flags (one table,
PLAN_DIMENSIONS) is planned by the trainer's own plan (the flag parser, the option checks and
planner.h's plan_memory: no second formula), and printed with its device and host memory and a
predicted step cost relative to plain training; the combinations that fit both budgets come
first, by cost, and the fastest that fits is recommended with its command line, generated from
the options (flags.h: options_to_args).

    PlanSearch s = {.base = &options, .world = world, .budget = budget, .device_from = "--max-memory 24GiB",
                    .host_from = "available host memory", .cost = cost_model, .prog = argv[0], .plan = plan_fn, .ctx = ctx};
    plan_search(&s);   // prints; allocates nothing

A combination is a set of flag values applied to the given options through set_flag; plan_fn
checks and plans it as a run would, under a fail() trap (utils.h), so one the ordinary checks
refuse (--offload 1 with a single segment, --offload optimizer on the CPU) is
listed with the checks' own reason. Adding a dimension (a flag and its values) is one line of
the table; the columns, the command line and the JSON follow from it.

Ties in cost go to the combination that keeps the model the flags given train (the optimizer
asked for: every other dimension trains the bitwise same model), then to the one that changes
fewer of the flags given, then to the least device memory. When the fastest that fits trains
another model (another optimizer), the fastest that fits without that is printed beside it. The
last line is one JSON object, {"plan_search": {...}}, with the budgets, the recommendation's
bytes, cost and argv, or what would be needed when nothing fits: what the tests read.
*/
#ifndef LLMC_PLAN_SEARCH_H
#define LLMC_PLAN_SEARCH_H

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "utils.h"
#include "flags.h"
#include "planner.h"

// ----------------------------------------------------------------------------
// the combinations: one value of each dimension

#define PLAN_MAX_VALUES 8
typedef struct {
    const char* flag;                       // as the parser takes it
    const char* values[PLAN_MAX_VALUES];    // as set_flag takes them; the rest NULL
    int min_ranks;                          // searched only with this many ranks or more (else the flag as given)
    int changes_model;                      // 1: another value trains another model; 0: the same one (bitwise,
                                            // --offload optimizer,gradients with accumulation to rounding,
                                            // --loss-chunk on a GPU to rounding: wte's gradient summed by chunks,
                                            // --zero 2 and 3 with accumulation to rounding: each micro-step reduced)
} PlanDimension;

// --loss-chunk's value in the search: enough tokens to keep a GPU busy (the (K,C) d(lnf output) GEMM
// has (K/128)(C/128) output tiles: at d12 192 for an H100's 132 SMs), a multiple of the CPU GEMM's
// K step (bitwise the whole head's training there: doc/memory.md), and as a cost the same FLOPs as the
// whole head (the head's backward moves into the forward, nothing runs twice)
#define PLAN_LOSS_CHUNK "4096"

static const PlanDimension PLAN_DIMENSIONS[] = {
    {"--optimizer", {"adamw", "adafactor", "came"}, 1, 1},
    {"--optimizer-state", {"fp32", "bf16", "8bit"}, 1, 1},
    {"--recompute", {"none", "gelu", "attn", "gelu,attn", "sqrt", "sqrt,gelu,attn", "1", "1,gelu,attn"}, 1, 0},
    {"--offload", {"0", "activations", "optimizer", "activations,optimizer", "optimizer,gradients", "activations,optimizer,gradients"}, 1, 0},
    {"--zero", {"0", "1", "2", "3"}, 2, 0},
    {"--tp", {"1", "2", "4", "8"}, 2, 0},  // a --tp that does not divide the ranks, the heads or Vp: refused, listed with why
    {"--pp", {"1", "2", "4", "8"}, 2, 0},  // wte's two gradients summed in another order: to rounding (doc/pipeline_parallel.md)
    {"--pp-schedule", {"1f1b", "gpipe"}, 2, 0},  // the same cost; gpipe holds more: it wins no tie, and with --pp 1 it is refused
    {"--loss-chunk", {"0", PLAN_LOSS_CHUNK}, 1, 0},
};
#define PLAN_NUM_DIMENSIONS ((int)(sizeof(PLAN_DIMENSIONS) / sizeof(PLAN_DIMENSIONS[0])))
// with ranks: 3 optimizers x 3 state formats x 8 x 6 x 4 x 4 x 4 x 2 x 2 = 110,592 combinations

static int plan_dimension_size(const PlanDimension* d) {
    int n = 0;
    while (n < PLAN_MAX_VALUES && d->values[n] != NULL) { n++; }
    return n;
}

// how the trainer plans one set of options (plan_run): it may fail() on options the checks refuse
typedef void (*PlanOptionsFn)(const TrainOptions* o, void* ctx, MemPlan* plan, int* accum);

typedef struct {
    const TrainOptions* base;   // the options as given: the other flags, and what a tie prefers
    int world;                  // ranks planned for (1: one process)
    MemBudget budget;
    const char* device_from;    // where each budget came from, in words ("--max-memory 24GiB")
    const char* host_from;
    CostModel cost;
    const char* prog;           // argv[0], for the command line
    PlanOptionsFn plan;
    void* ctx;
} PlanSearch;

typedef struct {
    int value[PLAN_NUM_DIMENSIONS];  // index into each dimension's values; -1: not searched
    int index;                       // in enumeration order
    int planned;                     // 0: the checks refused it (why)
    int why;                         // then the checks' message: its index in the search's PlanReasons
    int changes;                     // dimensions whose value differs from the options given
    int model_changes;               // of which dimensions that train another model (changes_model)
    size_t need;                     // the bytes against the device budget: device (shared: device + host)
    BudgetFit fit;
    StepCost cost;
    char policy[128];                // the plan's activation policy in words (planner.h)
    int repeats;                     // 1: plans as an earlier candidate of the other values (flash attention
                                     // implies attn: --recompute gelu and gelu,attn are one policy); not listed
} PlanCandidate;

static int plan_dimension_active(const PlanSearch* s, int d) { return s->world >= PLAN_DIMENSIONS[d].min_ranks; }

// the options of candidate c: the options given with its value of each searched dimension
static void plan_candidate_options(const PlanSearch* s, const PlanCandidate* c, TrainOptions* o) {
    *o = *s->base;
    for (int d = 0; d < PLAN_NUM_DIMENSIONS; d++) {
        if (c->value[d] < 0) { continue; }
        const PlanDimension* dim = &PLAN_DIMENSIONS[d];
        const FlagSpec* f = find_flag(dim->flag, strlen(dim->flag));
        if (f == NULL) { fail("plan_search.h: PLAN_DIMENSIONS names %s, which is not a flag", dim->flag); }
        set_flag(o, f, dim->values[c->value[d]]);
    }
    // another --tp or --pp keeps the step's tokens: -d -1 means a micro-batch on every data-parallel rank,
    // and --tp and --pp change their number (world / (tp pp)), so the candidate says the base's total
    int base_split = (s->base->tp > 0 ? s->base->tp : 1) * (s->base->pp > 0 ? s->base->pp : 1);
    int64_t tokens = (int64_t)o->batch_size * o->seq_len * (s->world / base_split);
    if ((o->tp != s->base->tp || o->pp != s->base->pp) && o->total_batch_size == -1 && tokens <= INT_MAX) { o->total_batch_size = (int)tokens; }
}

// the checks' distinct messages (a few dozen: most refusals repeat one), which candidates name by index
typedef struct {
    char (*text)[FAIL_MESSAGE_LEN];
    int n, cap;
} PlanReasons;

static int plan_reason_id(PlanReasons* r, const char* why) {
    for (int i = 0; i < r->n; i++) {
        if (strcmp(r->text[i], why) == 0) { return i; }
    }
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->text = (char (*)[FAIL_MESSAGE_LEN])realloc_check(r->text, (size_t)r->cap * FAIL_MESSAGE_LEN);
    }
    snprintf(r->text[r->n], FAIL_MESSAGE_LEN, "%s", why);
    return r->n++;
}

// a fail() message on one line, without its hint
static void plan_why(char* out, size_t n, const char* message) {
    size_t used = 0;
    for (const char* p = message; *p && used + 1 < n; p++) {
        if (strncmp(p, "\n  hint:", 8) == 0) { break; }
        if (*p == '\n') {
            while (p[1] == ' ') { p++; }
            out[used++] = ' ';
        } else {
            out[used++] = *p;
        }
    }
    out[used] = '\0';
}

// plans candidate c into it, or keeps why the checks refused it. The trap and the options are
// the caller's: nothing this function changes after setjmp is read after a longjmp
static void plan_candidate(const PlanSearch* s, PlanCandidate* c, FailTrap* trap, TrainOptions* o, PlanReasons* reasons) {
    MemPlan plan;
    int accum = 1;
    g_fail_trap = trap;
    if (setjmp(trap->jump) != 0) {
        char why[FAIL_MESSAGE_LEN];
        c->planned = 0;
        plan_why(why, sizeof(why), trap->message);
        c->why = plan_reason_id(reasons, why);
        return;
    }
    plan_candidate_options(s, c, o);
    s->plan(o, s->ctx, &plan, &accum);
    g_fail_trap = NULL;
    c->planned = 1;
    c->fit = plan_fit(&plan, &s->budget);
    c->need = s->budget.shared ? c->fit.device + c->fit.host : c->fit.device;
    c->cost = plan_step_cost(&plan, accum, &s->cost);
    snprintf(c->policy, sizeof(c->policy), "%s", plan.act_policy);
    c->changes = c->model_changes = 0;
    for (int d = 0; d < PLAN_NUM_DIMENSIONS; d++) {
        const FlagSpec* f = find_flag(PLAN_DIMENSIONS[d].flag, strlen(PLAN_DIMENSIONS[d].flag));
        int changed = !flag_field_equal(f, o, s->base);
        c->changes += changed;
        c->model_changes += changed && PLAN_DIMENSIONS[d].changes_model;
    }
}

// every combination of the searched dimensions, in the table's order (the last dimension fastest)
static int plan_enumerate(const PlanSearch* s, PlanCandidate* out, int max) {
    int n = 0, idx[PLAN_NUM_DIMENSIONS] = {0};
    for (;;) {
        if (n == max) { fail("plan_search.h: more than %d combinations (a bug: plan_search_run counts them)", max); }
        PlanCandidate* c = &out[n];
        memset(c, 0, sizeof(*c));
        c->index = n;
        for (int d = 0; d < PLAN_NUM_DIMENSIONS; d++) { c->value[d] = plan_dimension_active(s, d) ? idx[d] : -1; }
        n++;
        int d = PLAN_NUM_DIMENSIONS - 1;
        for (; d >= 0; d--) {  // the next combination: an odometer over the searched dimensions
            if (!plan_dimension_active(s, d)) { continue; }
            if (++idx[d] < plan_dimension_size(&PLAN_DIMENSIONS[d])) { break; }
            idx[d] = 0;
        }
        if (d < 0) { return n; }
    }
}

static int plan_fits(const PlanCandidate* c) { return c->planned && c->fit.device_ok && c->fit.host_ok; }

// marks each planned candidate that only repeats an earlier one (in enumeration order, c[j] the
// j-th): the same values but --recompute's, the same activation policy, memory and cost. Those
// differ from c[j] by a multiple of --recompute's stride in the odometer (plan_enumerate)
static void plan_mark_repeats(const PlanSearch* s, PlanCandidate* c, int n) {
    int recompute = 0;  // PLAN_DIMENSIONS' --recompute
    while (strcmp(PLAN_DIMENSIONS[recompute].flag, "--recompute") != 0) { recompute++; }
    if (!plan_dimension_active(s, recompute)) { return; }
    int stride = 1;
    for (int d = recompute + 1; d < PLAN_NUM_DIMENSIONS; d++) {
        if (plan_dimension_active(s, d)) { stride *= plan_dimension_size(&PLAN_DIMENSIONS[d]); }
    }
    for (int j = 0; j < n; j++) {
        for (int k = 1; k <= c[j].value[recompute] && c[j].planned && !c[j].repeats; k++) {
            const PlanCandidate* i = &c[j - k * stride];
            c[j].repeats = i->planned && !i->repeats && strcmp(i->policy, c[j].policy) == 0 && i->fit.device == c[j].fit.device &&
                           i->fit.host == c[j].fit.host && i->cost.relative == c[j].cost.relative;
        }
    }
}

// fitting first, refused last; then cost (equal within 1e-9); the model the flags given train;
// fewer changes to the flags given; device memory (shared: the total), host memory
static int plan_candidate_order(const void* pa, const void* pb) {
    const PlanCandidate *a = (const PlanCandidate*)pa, *b = (const PlanCandidate*)pb;
    if (plan_fits(a) != plan_fits(b)) { return plan_fits(b) - plan_fits(a); }
    if (a->planned != b->planned) { return b->planned - a->planned; }
    double ca = a->cost.relative, cb = b->cost.relative;
    if (ca < cb * (1.0 - 1e-9)) { return -1; }
    if (cb < ca * (1.0 - 1e-9)) { return 1; }
    if (a->model_changes != b->model_changes) { return a->model_changes - b->model_changes; }
    if (a->changes != b->changes) { return a->changes - b->changes; }
    if (a->need != b->need) { return a->need < b->need ? -1 : 1; }
    if (a->fit.host != b->fit.host) { return a->fit.host < b->fit.host ? -1 : 1; }
    return a->index - b->index;
}

// ----------------------------------------------------------------------------
// printing

// "13.12 GiB", "512.00 MiB", "3.50 KiB", "100 B"
static void format_bytes(char* buf, size_t n, double bytes) {
    if (bytes >= 1024.0 * MIB) { snprintf(buf, n, "%.2f GiB", bytes / (1024.0 * MIB)); }
    else if (bytes >= MIB) { snprintf(buf, n, "%.2f MiB", bytes / MIB); }
    else if (bytes >= 1024.0) { snprintf(buf, n, "%.2f KiB", bytes / 1024.0); }
    else { snprintf(buf, n, "%.0f B", bytes); }
}

// bytes as a size for a flag that covers them: rounded up to 2 decimals of format_bytes's unit ("25.32GiB")
static void format_bytes_arg(char* buf, size_t n, size_t bytes) {
    double unit = bytes >= 1024.0 * MIB ? 1024.0 * MIB : bytes >= MIB ? MIB : 1024.0;
    const char* name = unit == 1024.0 * MIB ? "GiB" : unit == MIB ? "MiB" : "KiB";
    if (bytes < 1024) { snprintf(buf, n, "%zu", bytes); return; }
    snprintf(buf, n, "%.2f%s", ceil((double)bytes / unit * 100.0) / 100.0, name);
}

// "--optimizer adamw --recompute sqrt --offload 0": the searched flags of c
static void plan_candidate_flags(const PlanCandidate* c, char* buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int d = 0; d < PLAN_NUM_DIMENSIONS && used < n; d++) {
        if (c->value[d] < 0) { continue; }
        used += snprintf(buf + used, n - used, "%s%s %s", used ? " " : "", PLAN_DIMENSIONS[d].flag,
                         PLAN_DIMENSIONS[d].values[c->value[d]]);
    }
}

static const char* plan_fit_word(const PlanCandidate* c) {
    if (plan_fits(c)) { return "yes"; }
    if (!c->fit.device_ok && !c->fit.host_ok) { return "no: both"; }
    return c->fit.device_ok ? "no: host" : "no: device";
}

static void plan_print_budgets(const PlanSearch* s) {
    char dev[32], host[32];
    format_bytes(dev, sizeof(dev), (double)s->budget.device);
    if (s->budget.shared) {
        printf("budget: %s (%s) for everything: this backend's \"device\" categories are host memory, so device + host must fit\n",
               dev, s->device_from);
        return;
    }
    if (s->budget.host == SIZE_MAX) { snprintf(host, sizeof(host), "no limit"); }
    else { format_bytes(host, sizeof(host), (double)s->budget.host); }
    printf("budget: device %s (%s), host %s (%s)\n", dev, s->device_from, host, s->host_from);
}

static void plan_print_cost_model(const CostModel* m) {
    printf("cost model: the step's time over plain training's (1.00x = its FLOPs alone, per rank), nothing overlapped:\n"
           "  FLOPs, recomputed ones too, at %.4g TFLOP/s (%s)\n"
           "  + selective recompute's device-memory traffic (2 x each recomputed tensor) at %.4g GB/s (%s)\n"
           "  + offload copies (activations: 2 x the host store per micro-step; optimizer: the fp32 gradients down,\n"
           "    the working weights up) at %.4g GB/s (%s)\n"
           "  + the CPU's update of --offload optimizer (2 x its host bytes) at %.4g GB/s (%s)\n"
           "  + the gradient exchange (2(N-1)/N x the gradients per step; ZeRO-1 the same bytes) at %.4g GB/s (%s)\n"
           "  not counted: the GPU's optimizer update, kernels' memory traffic besides recompute's\n"
           "  error: measured on the CPU (doc/memory.md, \"The cost model against measurements\"), within 0.15 of the plain step\n"
           "  (GELU recompute costs more than its FLOPs, AdamW's update more than Adafactor's); a GPU's: not yet measured\n",
           m->flops / 1e12, m->flops_note, m->memory_bw / 1e9, m->memory_note, m->host_bw / 1e9, m->host_note,
           m->host_memory_bw / 1e9, m->host_memory_note, m->link_bw / 1e9, m->link_note);
}

// one row a planned combination: fits, cost, memory (shared: the total too), the searched flags
static void plan_print_table(const PlanSearch* s, const PlanCandidate* c, int n) {
    int width[PLAN_NUM_DIMENSIONS], last = -1;
    printf("%-10s | %-10s | %-10s | %-10s", "fits", "cost", "device", "host");
    if (s->budget.shared) { printf(" | %-10s", "total"); }
    for (int d = 0; d < PLAN_NUM_DIMENSIONS; d++) {
        if (!plan_dimension_active(s, d)) { continue; }
        width[d] = (int)strlen(PLAN_DIMENSIONS[d].flag);
        for (int v = 0; v < plan_dimension_size(&PLAN_DIMENSIONS[d]); v++) {
            int w = (int)strlen(PLAN_DIMENSIONS[d].values[v]);
            if (w > width[d]) { width[d] = w; }
        }
        last = d;
    }
    for (int d = 0; d <= last; d++) {
        if (plan_dimension_active(s, d)) { printf(" | %-*s", d == last ? 0 : width[d], PLAN_DIMENSIONS[d].flag); }
    }
    printf("\n");
    int repeats = 0;
    for (int i = 0; i < n; i++) {
        repeats += c[i].repeats;
        if (!c[i].planned || c[i].repeats) { continue; }
        char dev[32], host[32], total[32], cost[32];
        format_bytes(dev, sizeof(dev), (double)c[i].fit.device);
        format_bytes(host, sizeof(host), (double)c[i].fit.host);
        format_bytes(total, sizeof(total), (double)(c[i].fit.device + c[i].fit.host));
        snprintf(cost, sizeof(cost), "%.3fx", c[i].cost.relative);
        printf("%-10s | %10s | %10s | %10s", plan_fit_word(&c[i]), cost, dev, host);
        if (s->budget.shared) { printf(" | %10s", total); }
        for (int d = 0; d <= last; d++) {
            if (c[i].value[d] >= 0) { printf(" | %-*s", d == last ? 0 : width[d], PLAN_DIMENSIONS[d].values[c[i].value[d]]); }
        }
        printf("\n");
    }
    if (repeats > 0) {
        printf("(%d more plan as a row above with another --recompute: flash attention recomputes the attention\n"
               " weights anyway, so attn changes nothing; not listed)\n", repeats);
    }
}

// the refused combinations, one line per reason: how many, the reason, one example (the first in
// the table's order)
static void plan_print_refused(const PlanCandidate* c, int n, const PlanReasons* reasons) {
    int* count = (int*)calloc_check((size_t)reasons->n + 1, sizeof(int));
    for (int i = 0; i < n; i++) { count[c[i].planned ? reasons->n : c[i].why]++; }
    for (int i = 0; i < n; i++) {
        if (c[i].planned || count[c[i].why] == 0) { continue; }
        char flags[256];
        plan_candidate_flags(&c[i], flags, sizeof(flags));
        printf("refused by the flag checks (%d combination%s, e.g. %s): %s\n", count[c[i].why], count[c[i].why] == 1 ? "" : "s", flags,
               reasons->text[c[i].why]);
        count[c[i].why] = 0;  // listed
    }
    free(count);
}

// an argument for a shell: as it is when it is plain, else in single quotes
static void print_shell_arg(const char* a) {
    if (*a != '\0' && strspn(a, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=,:+@%-") == strlen(a)) {
        printf("%s", a);
        return;
    }
    printf("'");
    for (; *a; a++) {
        if (*a == '\'') { printf("'\\''"); } else { putchar(*a); }
    }
    printf("'");
}

static void print_json_string(const char* a) {
    putchar('"');
    for (; *a; a++) {
        unsigned char ch = (unsigned char)*a;
        if (ch == '"' || ch == '\\') { printf("\\%c", ch); }
        else if (ch < 0x20) { printf("\\u%04x", ch); }
        else { putchar(ch); }
    }
    putchar('"');
}

// the command that runs candidate c: the program (under mpirun for several ranks) and every
// flag that differs from its default, --plan's own flags aside
static void plan_command(const PlanSearch* s, const PlanCandidate* c, CommandLine* cl) {
    static TrainOptions o;  // large; one at a time
    plan_candidate_options(s, c, &o);
    const size_t skip[] = {offsetof(TrainOptions, plan_only), offsetof(TrainOptions, plan_ranks)};
    CommandLine flags;
    options_to_args(&flags, &o, skip, (int)(sizeof(skip) / sizeof(skip[0])));
    cl->argc = 0;
    cl->used = 0;
    if (s->world > 1) {
        char np[16];
        snprintf(np, sizeof(np), "%d", s->world);
        command_add(cl, "mpirun");
        command_add(cl, "-np");
        command_add(cl, np);
    }
    command_add(cl, s->prog);
    for (int i = 0; i < flags.argc; i++) { command_add(cl, flags.argv[i]); }
}

static void print_json_bytes_or_null(size_t b) {
    if (b == SIZE_MAX) { printf("null"); } else { printf("%zu", b); }
}

// when nothing fits, what would: the combination of least device need among those whose host
// memory fits (the device budget that would do), and the least host memory among those whose
// device memory fits; -1: none
static void plan_needed(const PlanCandidate* c, int n, int* dev, int* host) {
    *dev = *host = -1;
    for (int i = 0; i < n; i++) {
        if (!c[i].planned) { continue; }
        if (c[i].fit.host_ok && (*dev < 0 || c[i].need < c[*dev].need)) { *dev = i; }
        if (c[i].fit.device_ok && (*host < 0 || c[i].fit.host < c[*host].fit.host)) { *host = i; }
    }
}

static void plan_print_nothing_fits(const PlanSearch* s, const PlanCandidate* c, int n, int dev, int host) {
    char need[32], budget[32], flags[256];
    int planned = 0;
    for (int i = 0; i < n; i++) { planned += c[i].planned; }
    if (planned == 0) {
        printf("nothing fits: the flag checks refused every combination (above)\n");
        return;
    }
    printf("nothing fits: none of the %d combinations planned fits %s\n", planned, s->budget.shared ? "the budget" : "both budgets");
    char arg[32];
    if (s->budget.shared && dev >= 0) {
        format_bytes(need, sizeof(need), (double)c[dev].need);
        format_bytes(budget, sizeof(budget), (double)s->budget.device);
        format_bytes_arg(arg, sizeof(arg), c[dev].need);
        plan_candidate_flags(&c[dev], flags, sizeof(flags));
        printf("  the least memory of any: %s (%s), against %s: it would fit with --max-memory %s\n", need, flags, budget, arg);
    }
    double dev_ratio = dev >= 0 ? (double)c[dev].fit.device / (double)s->budget.device : INFINITY;
    double host_ratio = host >= 0 ? (double)c[host].fit.host / (double)s->budget.host : INFINITY;
    if (!s->budget.shared && dev >= 0) {
        format_bytes(need, sizeof(need), (double)c[dev].fit.device);
        format_bytes(budget, sizeof(budget), (double)s->budget.device);
        format_bytes_arg(arg, sizeof(arg), c[dev].fit.device);
        plan_candidate_flags(&c[dev], flags, sizeof(flags));
        printf("  %sdevice: %s (%s) would fit with --max-memory %s (the budget is %s: %.0f%% short); its host memory fits\n",
               dev_ratio <= host_ratio ? "closest, the " : "the ", need, flags, arg, budget, 100.0 * (dev_ratio - 1.0));
    }
    if (!s->budget.shared && host >= 0) {
        format_bytes(need, sizeof(need), (double)c[host].fit.host);
        format_bytes(budget, sizeof(budget), (double)s->budget.host);
        format_bytes_arg(arg, sizeof(arg), c[host].fit.host);
        plan_candidate_flags(&c[host], flags, sizeof(flags));
        printf("  %shost: %s (%s) would fit with --max-host-memory %s (the budget is %s: %.0f%% short); its device memory fits\n",
               host_ratio < dev_ratio ? "closest, the " : "the ", need, flags, arg, budget, 100.0 * (host_ratio - 1.0));
    }
    if (!s->budget.shared && dev < 0 && host < 0) {
        size_t least_dev = SIZE_MAX, least_host = SIZE_MAX;
        for (int i = 0; i < n; i++) {
            if (!c[i].planned) { continue; }
            if (c[i].fit.device < least_dev) { least_dev = c[i].fit.device; }
            if (c[i].fit.host < least_host) { least_host = c[i].fit.host; }
        }
        format_bytes(need, sizeof(need), (double)least_dev);
        format_bytes(budget, sizeof(budget), (double)least_host);
        printf("  no combination fits either budget alone: the least device memory of any is %s, the least host memory %s\n",
               need, budget);
    }
    printf("  or shrink what every combination needs: a smaller -b or -t (activations grow with B*T), more ranks\n"
           "  with --zero 1, 2 or 3 (the optimizer state, the gradients, the weights divide by them: --plan-ranks N)\n");
}

// one recommendation: its flags, cost and memory, and the command that runs it
static void plan_print_pick(const PlanSearch* s, const PlanCandidate* c, const char* title) {
    char flags[256], dev[32], host[32];
    static CommandLine cl;
    plan_command(s, c, &cl);
    plan_candidate_flags(c, flags, sizeof(flags));
    format_bytes(dev, sizeof(dev), (double)c->fit.device);
    format_bytes(host, sizeof(host), (double)c->fit.host);
    printf("%s:\n  %s: %.3fx the plain step, device %s, host %s\n  ", title, flags, c->cost.relative, dev, host);
    for (int i = 0; i < cl.argc; i++) {
        if (i > 0) { printf(" "); }
        print_shell_arg(cl.argv[i]);
    }
    printf("\n");
}

// {"flags": {"--optimizer": "adamw", ...}, "device": bytes, "host": bytes, "cost": x, "argv": [...]}, or null
static void plan_print_json_pick(const PlanSearch* s, const PlanCandidate* c) {
    if (c == NULL) { printf("null"); return; }
    static CommandLine cl;
    plan_command(s, c, &cl);
    printf("{\"flags\": {");
    int k = 0;
    for (int d = 0; d < PLAN_NUM_DIMENSIONS; d++) {
        if (c->value[d] < 0) { continue; }
        printf("%s\"%s\": \"%s\"", k++ ? ", " : "", PLAN_DIMENSIONS[d].flag, PLAN_DIMENSIONS[d].values[c->value[d]]);
    }
    printf("}, \"device\": %zu, \"host\": %zu, \"cost\": %.6f, \"argv\": [", c->fit.device, c->fit.host, c->cost.relative);
    for (int i = 0; i < cl.argc; i++) {
        if (i > 0) { printf(", "); }
        print_json_string(cl.argv[i]);
    }
    printf("]}");
}

// the last line: {"plan_search": {"budget": {...}, "combinations": N, ..., "recommended": {...} or null,
// "same_model": {...} or null, "needed": {"device": bytes or null, "host": bytes or null}}}
static void plan_print_json(const PlanSearch* s, const PlanCandidate* c, int n, const PlanCandidate* best,
                            const PlanCandidate* same, int dev, int host) {
    int planned = 0, fitting = 0;
    for (int i = 0; i < n; i++) { planned += c[i].planned; fitting += plan_fits(&c[i]); }
    printf("{\"plan_search\": {\"budget\": {\"device\": %zu, \"host\": ", s->budget.device);
    print_json_bytes_or_null(s->budget.shared ? SIZE_MAX : s->budget.host);
    printf(", \"shared\": %s}, \"combinations\": %d, \"planned\": %d, \"fitting\": %d, \"refused\": %d, \"recommended\": ",
           s->budget.shared ? "true" : "false", n, planned, fitting, n - planned);
    plan_print_json_pick(s, best);
    printf(", \"same_model\": ");
    plan_print_json_pick(s, same);
    printf(", \"needed\": {\"device\": ");
    print_json_bytes_or_null(dev >= 0 ? c[dev].need : SIZE_MAX);
    printf(", \"host\": ");
    print_json_bytes_or_null(host >= 0 && !s->budget.shared ? c[host].fit.host : SIZE_MAX);
    printf("}}}\n");
}

// ----------------------------------------------------------------------------
// the search

// every combination planned into *out (malloc'd: free() it; the refusals' messages in *reasons, free()
// its text), in the order of the table (fitting first, by cost); returns how many
static int plan_search_run(const PlanSearch* s, PlanCandidate** out, PlanReasons* reasons) {
    static TrainOptions o;  // a candidate's options while it is planned
    FailTrap trap;
    int most = 1;
    for (int d = 0; d < PLAN_NUM_DIMENSIONS; d++) { most *= plan_dimension_active(s, d) ? plan_dimension_size(&PLAN_DIMENSIONS[d]) : 1; }
    PlanCandidate* c = (PlanCandidate*)malloc_check((size_t)most * sizeof(PlanCandidate));
    memset(reasons, 0, sizeof(*reasons));
    int n = plan_enumerate(s, c, most);
    for (int i = 0; i < n; i++) { plan_candidate(s, &c[i], &trap, &o, reasons); }
    plan_mark_repeats(s, c, n);
    qsort(c, (size_t)n, sizeof(c[0]), plan_candidate_order);
    *out = c;
    return n;
}

// for a message: the searched flags that the fastest fitting combination changes, "--optimizer
// adafactor --recompute sqrt" (or "" when it is the flags given); returns 0, printing nothing, when
// nothing fits
static int plan_search_fastest(const PlanSearch* s, char* out, size_t n) {
    PlanCandidate* c;
    PlanReasons reasons;
    int count = plan_search_run(s, &c, &reasons);
    free(reasons.text);
    out[0] = '\0';
    if (count == 0 || !plan_fits(&c[0])) { free(c); return 0; }
    static TrainOptions o;
    plan_candidate_options(s, &c[0], &o);
    size_t used = 0;
    for (int d = 0; d < PLAN_NUM_DIMENSIONS; d++) {
        const FlagSpec* f = find_flag(PLAN_DIMENSIONS[d].flag, strlen(PLAN_DIMENSIONS[d].flag));
        if (c[0].value[d] < 0 || flag_field_equal(f, &o, s->base) || used >= n) { continue; }
        used += snprintf(out + used, n - used, "%s%s %s", used ? " " : "", PLAN_DIMENSIONS[d].flag,
                         PLAN_DIMENSIONS[d].values[c[0].value[d]]);
    }
    free(c);
    return 1;
}

static void plan_search(const PlanSearch* s) {
    PlanCandidate* c;
    PlanReasons reasons;
    int n = plan_search_run(s, &c, &reasons);
    plan_print_budgets(s);
    plan_print_cost_model(&s->cost);
    printf("\n");
    plan_print_table(s, c, n);
    plan_print_refused(c, n, &reasons);
    printf("\n");
    // the first fitting (the order puts them first), and the first that fits and trains the model
    // the flags given, when that is another
    const PlanCandidate *best = n > 0 && plan_fits(&c[0]) ? &c[0] : NULL, *same = NULL;
    for (int i = 0; best != NULL && best->model_changes > 0 && i < n && same == NULL; i++) {
        if (plan_fits(&c[i]) && c[i].model_changes == 0) { same = &c[i]; }
    }
    int dev = -1, host = -1;
    if (best != NULL) {
        plan_print_pick(s, best, "recommended (the fastest that fits; ties: the model the flags given train, then fewer\n"
                                 "changes to them, then the least device memory)");
        if (same != NULL) { plan_print_pick(s, same, "the fastest that fits and trains the model of the flags given (their --optimizer)"); }
        else if (best->model_changes > 0) { printf("nothing that fits trains the model of the flags given (their --optimizer)\n"); }
    } else {
        plan_needed(c, n, &dev, &host);
        plan_print_nothing_fits(s, c, n, dev, host);
    }
    plan_print_json(s, c, n, best, same, dev, host);
    free(c);
    free(reasons.text);
}

#endif // LLMC_PLAN_SEARCH_H
