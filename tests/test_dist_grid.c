/*
test_dist_grid.c: the grid of llmc/distributed.h (dist_grid) under MPI: the world split into
tensor-parallel groups of tp adjacent ranks and data-parallel groups across them, and each
collective that takes a group running over that group's ranks only; with --pp, the stages' blocks,
the pipeline groups and wte's pair, and a message along the pipeline. Then --tp's block
(cpu/tensor_parallel.h) over each tensor-parallel group's processes, summed by MPI, against the
whole block: as test_gpt.c checks it with threads (tests/tp_block.h), here with the real sum.

    mpirun -np 4 ./build/test_dist_grid        # every tp that divides 4: 1, 2, 4; and --pp 2 (tp 1, 2) and 4
    mpirun -np 4 ./build/test_dist_grid 3      # a tp that does not divide the world: must stop

Built without MPI (make MPI=0) it runs as one process, where only tp 1 divides the world.

Each rank's values name the rank (rank r holds r + 1, or 100 r + i at place i), so a sum over the
wrong ranks gives another number. Every rank checks its own results; rank 0 prints the checks and
counts a check failed when it failed on any rank.
*/
#define TESTING
#include "../train_gpt.c"
#include "check.h"
#include "tp_block.h"

#define PART 3       // floats of one rank's part in the reduce-scatter and all-gather
#define MAX_RANKS 4  // the buffers' room

// a check that holds on every rank (rank 0 reports it)
static void check_all(int ok, const char* name, int tp, int rank) {
    float bad = !ok;
    dist_allreduce_sum_floats(&bad, 1);
    char full[256];
    snprintf(full, sizeof(full), "tp %d: %s", tp, name);
    if (rank == 0) { check(bad == 0.0f, full, "wrong on %.0f rank(s)", bad); }
}

// the world rank at place `place` of group g, seen from world rank r (the grid's own arithmetic, written again)
static int member(DistGroup g, int r, int place, int tp) {
    return g == DIST_TENSOR ? (r / tp) * tp + place : place * tp + r % tp;
}

static void test_grid(Dist world, int tp) {
    int r = world.rank;
    DistGrid g = dist_grid(world, tp, 1);
    check_all(g.tensor.world == tp && g.tensor.rank == r % tp && g.tensor.group == DIST_TENSOR,
              "the tensor group: tp adjacent ranks, this rank at place rank % tp", tp, r);
    check_all(g.data.world == world.world / tp && g.data.rank == r / tp,
              "the data group: world / tp ranks, this rank at place rank / tp", tp, r);
    check_all(g.world.rank == r && g.world.world == world.world, "the world as it was", tp, r);
    if (tp == 1) { check_all(g.data.group == DIST_WORLD, "with tp 1 the data group is the world", tp, r); }

    const Dist groups[2] = {g.tensor, g.data};
    for (int k = 0; k < 2; k++) {
        Dist d = groups[k];
        const char* name = DIST_GROUP_NAMES[k == 0 ? DIST_TENSOR : DIST_DATA];
        DistGroup which = k == 0 ? DIST_TENSOR : DIST_DATA;
        char what[128];
        // all-reduce: the sum of (rank + 1) over the group's members
        float x[2] = {(float)(r + 1), -(float)(r + 1)};
        float want = 0.0f;
        for (int p = 0; p < d.world; p++) { want += (float)(member(which, r, p, tp) + 1); }
        dist_allreduce_floats_over(x, 2, d);
        snprintf(what, sizeof(what), "all-reduce over the %s group sums its ranks' values only", name);
        check_all(x[0] == want && x[1] == -want, what, tp, r);
        // reduce-scatter: place p's part summed over the group, 100 * (world rank) + i at element i
        float buf[MAX_RANKS * PART];
        int counts[MAX_RANKS];
        for (int p = 0; p < d.world; p++) { counts[p] = PART; }
        for (int i = 0; i < d.world * PART; i++) { buf[i] = (float)(100 * r + i); }
        dist_reduce_scatter_floats(buf, counts, d);
        int ok = 1;
        for (int i = 0; i < PART; i++) {
            int at = d.rank * PART + i;
            float sum = 0.0f;
            for (int p = 0; p < d.world; p++) { sum += (float)(100 * member(which, r, p, tp) + at); }
            ok &= buf[at] == sum;
        }
        snprintf(what, sizeof(what), "reduce-scatter over the %s group: this rank's part, summed over the group", name);
        check_all(ok, what, tp, r);
        // all-gather: every part from its owner (owner's world rank in the values)
        for (int i = 0; i < d.world * PART; i++) { buf[i] = -1.0f; }
        for (int i = 0; i < PART; i++) { buf[d.rank * PART + i] = (float)(100 * r + i); }
        dist_allgather_floats(buf, counts, d);
        ok = 1;
        for (int p = 0; p < d.world; p++) {
            for (int i = 0; i < PART; i++) { ok &= buf[p * PART + i] == (float)(100 * member(which, r, p, tp) + i); }
        }
        snprintf(what, sizeof(what), "all-gather over the %s group: each part from its owner", name);
        check_all(ok, what, tp, r);
    }
    // the world's own collectives are untouched by the grid
    float y = 1.0f;
    dist_allreduce_sum_floats(&y, 1);
    check_all(y == (float)world.world, "the world's all-reduce still sums every rank", tp, r);
}

// --pp: the grid of pp stages of dp x tp ranks (rank = stage (dp tp) + data tp + tensor); each group's
// members, an all-reduce over the pipeline group and over wte's pair, and a message to the next stage
// and back (dist_send_floats, dist_recv_floats, dist_sendrecv_floats)
static void test_pipeline_grid(Dist world, int tp, int pp) {
    int r = world.rank, block = world.world / pp, stage = r / block, local = r % block;
    DistGrid g = dist_grid(world, tp, pp);
    char what[160];
    snprintf(what, sizeof(what), "pp %d: the groups: stage rank / (world / pp), tensor and data places within the stage's block", pp);
    check_all(g.pipeline.world == pp && g.pipeline.rank == stage && g.tensor.rank == local % tp && g.data.rank == local / tp &&
              g.data.world == block / tp && g.tensor.world == tp, what, tp, r);
    int in_pair = pp > 1 && (stage == 0 || stage == pp - 1);
    snprintf(what, sizeof(what), "pp %d: wte's pair: the first and the last stage at one place (%s)", pp, pp > 1 ? "2 ranks" : "none");
    check_all(in_pair ? g.pair.world == 2 && g.pair.rank == (stage != 0) : g.pair.world == 1, what, tp, r);
    // the pipeline group sums the ranks at this rank's place in every stage: local + s block
    float x = (float)(r + 1), want = 0.0f;
    for (int s = 0; s < pp; s++) { want += (float)(local + s * block + 1); }
    dist_allreduce_floats_over(&x, 1, g.pipeline);
    snprintf(what, sizeof(what), "pp %d: all-reduce over the pipeline group sums this place's rank in every stage only", pp);
    check_all(x == want, what, tp, r);
    float y = (float)(r + 1), pair_want = (float)(local + 1) + (float)(local + (pp - 1) * block + 1);
    if (in_pair) { dist_allreduce_floats_over(&y, 1, g.pair); }  // (the middle stages are in no pair)
    snprintf(what, sizeof(what), "pp %d: all-reduce over the pair sums the first and the last stage's", pp);
    check_all(!in_pair || y == pair_want, what, tp, r);  // (check_all is a collective of the world)
    // a message down the pipeline and one back: stage s sends its world rank to s+1, which answers with its own
    float got = -1.0f, back = -1.0f, mine = (float)r;
    if (stage > 0) { dist_recv_floats(&got, 1, stage - 1, g.pipeline); }
    if (stage < pp - 1) { dist_sendrecv_floats(&mine, 1, stage + 1, &back, 1, stage + 1, g.pipeline); }
    if (stage > 0) { dist_send_floats(&mine, 1, stage - 1, g.pipeline); }
    int ok = (stage == 0 || got == (float)(r - block)) && (stage == pp - 1 || back == (float)(r + block));
    snprintf(what, sizeof(what), "pp %d: a message to the next stage and its answer, between this place's ranks", pp);
    check_all(ok, what, tp, r);
}

// the block on this rank's slices, its group's sums by MPI, against the whole block computed here
static void test_block(Dist world, int tp) {
    int r = world.rank;
    DistGrid g = dist_grid(world, tp, 1);
    const GPT2Config* c = &TP_MODEL;
    size_t P = gpt2_num_parameters(c), BTC = (size_t)TP_B * TP_T * c->channels;
    float* whole = (float*)malloc_check(P * sizeof(float));
    float* x = (float*)malloc_check(BTC * sizeof(float));
    float* dy = (float*)malloc_check(BTC * sizeof(float));
    tp_test_inputs(whole, x, dy);  // the same on every rank: the same seed
    for (int flash = 0; flash < 2; flash++) {
        const ActPolicy pol = {.attn = flash, .flash = flash};
        TpBlock plain, mine;
        tp_block_alloc(&plain, whole, 0, 1, flash);
        tp_block_run(&plain, x, dy, &pol, TP_NONE);
        tp_block_alloc(&mine, whole, g.tensor.rank, tp, flash);
        tp_block_run(&mine, x, dy, &pol, tp_of_group(&g.tensor, NULL, 0));
        int at;
        double grads = tp_block_grad_dist(&mine, plain.grads, g.tensor.rank, tp, &at);
        double out = tp_rel_dist(mine.a.residual3, plain.a.residual3, BTC), dx = tp_rel_dist(mine.bwd.dresidual, plain.bwd.dresidual, BTC);
        char what[200];
        snprintf(what, sizeof(what), "the block%s over MPI: its output, d(input) and gradient slices within %g of the whole block's",
                 flash ? " (flash)" : "", TP_RTOL);
        check_all(out < TP_RTOL && dx < TP_RTOL && grads < TP_RTOL, what, tp, r);
        uint64_t lo, hi;
        dist_min_max_u64(tp_block_shared_hash(&mine, tp), &lo, &hi);
        snprintf(what, sizeof(what), "the block%s over MPI: the output, d(input) and the whole tensors' gradients the same bits on every rank",
                 flash ? " (flash)" : "");
        check_all(lo == hi, what, tp, r);
        tp_block_free(&plain);
        tp_block_free(&mine);
    }
    free(whole); free(x); free(dy);
}

int main(int argc, char** argv) {
    Dist world;
    dist_init(&world, &argc, &argv);
    if (world.world > MAX_RANKS) { fail("test_dist_grid: %d ranks; it is written for at most %d", world.world, MAX_RANKS); }
    if (world.rank != 0 && freopen("/dev/null", "w", stdout) == NULL) { return 1; }
    if (argc == 2) {  // a tp to try alone (one that must stop)
        test_grid(world, atoi(argv[1]));
    } else {
        for (int tp = 1; tp <= world.world; tp++) {
            if (world.world % tp == 0) { test_grid(world, tp); }
            if (world.world % tp == 0 && tp > 1 && !gpt2_tp_refusal(&TP_MODEL, tp)) { test_block(world, tp); }
        }
        for (int pp = 2; pp <= world.world; pp++) {
            for (int tp = 1; world.world % pp == 0 && tp <= world.world / pp; tp++) {
                if ((world.world / pp) % tp == 0) { test_pipeline_grid(world, tp, pp); }
            }
        }
    }
    dist_finalize();
    return world.rank == 0 ? check_summary() : 0;
}
