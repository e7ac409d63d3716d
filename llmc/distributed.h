/*
distributed.h: the ranks and their groups, and a handful of collective calls over a group. Built with -DUSE_MPI
(`make` does when mpicc exists) and started by an MPI launcher they are MPI collectives on
MPI_COMM_WORLD; started by srun or torchrun-style variables without MPI, the backend carries them
(the CUDA trainer over NCCL: DistCarrier); one process is the whole world and every call is a no-op,
so the trainer has a single code path.

    Dist d;
    dist_init(&d, &argc, &argv);                 // d.rank, d.world (1 for one process)
    dist_allreduce_sum_floats(grads, n);         // every rank ends with the sum
    dist_reduce_scatter_floats(buf, counts, d);  // rank r ends with the sum of its part
    dist_allgather_floats(buf, counts, d);       // every rank ends with every part
    DistGrid g = dist_grid(d, 2, 1);             // tensor-parallel pairs of adjacent ranks, and the data-parallel groups across them
    dist_allreduce_floats_over(x, n, g.tensor);  // the sum over this rank's pair only
    dist_finalize();

A Dist is a group and this process's place in it; the collectives that take one run over its
ranks only. The world is DIST_WORLD; dist_grid splits it into a grid: pipeline stages (--pp,
outermost), each of tensor-parallel groups of tp adjacent ranks (as on one machine's NVLink: they
exchange every layer) and data-parallel groups across them (the ranks of a stage at the same place of
every tensor group: they hold the same part of the model and sum their gradients, and --zero shards
over them); the pipeline groups join a rank of each stage, and pass messages between neighbours
(dist_send_floats, dist_recv_floats, dist_sendrecv_floats). With tp = pp = 1 the data group is the world.

Parts: buf holds the parts of all ranks in rank order, counts[r] floats for rank r;
reduce-scatter and all-gather work in place on buf (rank r's part at the sum of
counts[0..r-1]). Every rank must make the same calls in the same order, also a rank
whose part is empty.

Launch, and where each process learns its place (dist_source(), printed in the configuration table):
  - MPI: `mpirun -np N ./train_gpt ...` (or mpiexec, or srun --mpi=pmix) of an MPI build. A plain
    `./train_gpt` does not start MPI at all (OpenMPI's singleton start costs about 0.4 s and a helper
    daemon): MPI starts only when a launcher's variable is set (DIST_LAUNCHER_VARS).
  - slurm: srun's SLURM_PROCID, SLURM_STEP_NUM_TASKS and SLURM_LOCALID (sbatch's one shell, which
    has SLURM_NTASKS but no step count, is one process), when no MPI launcher's variable is set.
  - torchrun-style: RANK, WORLD_SIZE and LOCAL_RANK (torchrun, or a script of one's own); under srun
    too (one torchrun per machine), unless the two disagree.
Partly set or contradicting variables stop, naming them. The last two are dist_by_env(): the backend's
gpt2_dist_start must start a carrier (dist_set_carrier) before the first collective; the CPU
trainer has none and stops. A launcher that started several processes that cannot join stops every
one of them at start-up, naming the rebuild: mpirun of a build without MPI, or an MPI that sees
fewer ranks than the launcher started.

Failure: every MPI call returns its error code (MPI_ERRORS_RETURN) and a failing one
stops with the call, the MPI error text and file:line; mpirun then ends the other ranks.
*/
#ifndef LLMC_DISTRIBUTED_H
#define LLMC_DISTRIBUTED_H

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "utils.h"
#ifdef USE_MPI
#include <mpi.h>
#endif

static int g_dist_world = 1;  // the world of the last dist_init; collectives are no-ops at 1
static int g_dist_world_of(void) { return g_dist_world; }

// the groups of ranks (dist_grid): every process is in one of each
typedef enum {
    DIST_WORLD,   // every process
    DIST_DATA,    // the ranks that hold the same part of the model and read different data
    DIST_TENSOR,  // the ranks that split each layer's matrices (--tp), adjacent ranks
    DIST_PIPELINE,  // the ranks that hold a model's stages (--pp), one each, at the same data and tensor place
    DIST_PAIR,    // the first and the last stage of a pipeline group: both hold wte (--pp)
    DIST_NUM_GROUPS
} DistGroup;
static const char* const DIST_GROUP_NAMES[DIST_NUM_GROUPS] = {"world", "data-parallel", "tensor-parallel", "pipeline",
                                                              "embedding pair"};

typedef struct {
    int rank;   // this process in the group, 0..world-1
    int world;  // number of processes in the group
    DistGroup group;  // which group ({rank, world} alone: the world's)
} Dist;

// the world, and this process's groups in it
typedef struct { Dist world, data, tensor, pipeline, pair; } DistGrid;
// the grid dist_grid made last (before one: the world, whose data group is the world and whose
// tensor-parallel and pipeline groups are each one rank), for the hooks that hold no Dist (the optimizer's sums)
static DistGrid g_dist_grid = {{0, 1, DIST_WORLD}, {0, 1, DIST_WORLD}, {0, 1, DIST_TENSOR}, {0, 1, DIST_PIPELINE}, {0, 1, DIST_PAIR}};
// the grid of one process: every group this one rank
static DistGrid dist_grid_of_one(Dist world) {
    DistGrid g = {world, world, {0, 1, DIST_TENSOR}, {0, 1, DIST_PIPELINE}, {0, 1, DIST_PAIR}};
    return g;
}

// what the last dist_init found besides rank and world
static const char* g_dist_source = "one process";  // who said so: "MPI", "slurm (...)", "torchrun-style (...)"
static int g_dist_env_local_rank = 0;   // without MPI: the launcher's local rank (the GPU this process takes)
static int g_dist_by_env = 0;           // 1: several processes that MPI does not join (slurm's or torchrun-style
                                        // variables): the backend carries the collectives (dist_set_carrier)
static const char* dist_source(void) { return g_dist_source; }
// a hash of the settings that every rank must share (the model, the flags that change the numbers,
// the data, the world size): the trainer sets it (dist_set_settings_hash) before the ranks meet, so
// that a rendezvous refuses a peer of another job or another command line at the door
static uint64_t g_dist_settings_hash = 0;
static void dist_set_settings_hash(uint64_t h) { g_dist_settings_hash = h; }
static uint64_t dist_settings_hash(void) { return g_dist_settings_hash; }
static int dist_by_env(void) { return g_dist_by_env; }

// the element types and reductions of a carried all-reduce
typedef enum { DIST_FLOAT, DIST_DOUBLE, DIST_UINT64, DIST_INT, DIST_BYTE } DistType;  // DIST_BYTE: a broadcast's raw bytes
typedef enum { DIST_SUM, DIST_MIN, DIST_MAX } DistOp;

// the collectives of processes that MPI does not join, as a backend carries them (the CUDA trainer
// over NCCL: cuda/nccl.cuh). Every call is made by every rank in the same order
typedef struct {
    void (*allreduce)(void* buf, size_t n, DistType type, DistOp op);
    void (*broadcast)(void* buf, size_t bytes, int root);
    void (*reduce_scatter)(float* buf, const int* counts, int rank, int world);  // as dist_reduce_scatter_floats
    void (*allgather)(float* buf, const int* counts, int rank, int world);       // as dist_allgather_floats
    void (*finish)(void);                                                        // at dist_finalize
    int local_rank, local_ranks;   // this process's machine, as the carrier found it
} DistCarrier;
static DistCarrier g_dist_carrier;   // set by the backend (dist_set_carrier) before the first collective

static void dist_set_carrier(const DistCarrier* c) { g_dist_carrier = *c; }

// a collective of several processes without MPI, and no carrier: the backend did not start one
static const DistCarrier* dist_carrier(const char* call) {
    if (g_dist_carrier.allreduce == NULL) {
        fail("%s: %d processes that MPI does not join, and no carrier of their collectives was started\n"
             "  hint: this is a bug: the backend's gpt2_dist_start starts one (the CUDA trainer: NCCL)", call, g_dist_world_of());
    }
    return &g_dist_carrier;
}

// --zero: how the data-parallel ranks hold the optimizer
typedef enum {
    ZERO_0 = 0,  // no ZeRO: gradients all-reduced, every rank keeps the whole optimizer state
    ZERO_1 = 1,  // ZeRO-1: each rank keeps and updates 1/world of the state and weights
    ZERO_2 = 2,  // ZeRO-2: ZeRO-1, and each rank keeps only its blocks of the reduced fp32 gradients
    ZERO_3 = 3,  // ZeRO-3: ZeRO-2, and each rank keeps only its blocks of the weights (gathered layer by layer)
} ZeroStage;

// the optimizer state (and its files) is sharded: ZeRO-1, 2 and 3 keep the same state, laid out alike
static int zero_shards_state(int zero) { return zero == ZERO_1 || zero == ZERO_2 || zero == ZERO_3; }
// the gradients are sharded (ZeRO-2 and 3): reduce-scattered layer by layer during every backward
static int zero_shards_grads(int zero) { return zero == ZERO_2 || zero == ZERO_3; }

// collectives started by this process (ZeRO-2 prints its count per step); counted where they start
static long g_dist_collectives = 0;


static int dist_built_with_mpi(void) {
#ifdef USE_MPI
    return 1;
#else
    return 0;
#endif
}

// what a launcher tells each process it starts: how many there are, or which one this is (a rank
// above 0 means several). Not SLURM_NTASKS: sbatch and salloc set it for the job's one shell too
typedef struct {
    const char* name;
    int is_rank;     // 1: the process's rank (0-based), 0: the number of processes
    int starts_mpi;  // 1: an MPI launcher's, so an MPI build starts MPI even when it says 1
} DistLauncherVar;
static const DistLauncherVar DIST_LAUNCHER_VARS[] = {
    {"OMPI_COMM_WORLD_SIZE", 0, 1}, {"OMPI_COMM_WORLD_RANK", 1, 1},  // OpenMPI's mpirun
    {"PMI_SIZE", 0, 1}, {"PMI_RANK", 1, 1},                          // MPICH's and Intel MPI's mpiexec, srun --mpi=pmi2
    {"PMIX_RANK", 1, 1},                                              // PMIx: OpenMPI 5's mpirun, srun --mpi=pmix
    {"SLURM_STEP_NUM_TASKS", 0, 0}, {"SLURM_PROCID", 1, 0},          // srun, whatever its --mpi
};
#define DIST_NUM_LAUNCHER_VARS (sizeof(DIST_LAUNCHER_VARS) / sizeof(DIST_LAUNCHER_VARS[0]))

// how many processes the launcher started (at least: a rank says only that there are more), 1 when
// none was; *said: the variable that said the most, as NAME=VALUE; *mpi: an MPI launcher's is set
static int dist_launched_processes(char said[64], int* mpi) {
    int most = 1;
    *mpi = 0;
    said[0] = '\0';
    for (size_t i = 0; i < DIST_NUM_LAUNCHER_VARS; i++) {
        const char* v = getenv(DIST_LAUNCHER_VARS[i].name);
        if (v == NULL) { continue; }
        *mpi |= DIST_LAUNCHER_VARS[i].starts_mpi;
        char* end;
        long n = strtol(v, &end, 10);
        if (end == v || *end != '\0' || n < 0 || n >= INT_MAX) { continue; }  // not a count: says nothing
        int processes = DIST_LAUNCHER_VARS[i].is_rank ? (int)n + 1 : (int)n;
        if (processes > most) {
            most = processes;
            snprintf(said, 64, "%s=%s", DIST_LAUNCHER_VARS[i].name, v);
        }
    }
    return most;
}

#define DIST_REBUILD_HINT "install MPI (Debian/Ubuntu: apt install libopenmpi-dev openmpi-bin) and rebuild: make (train_gpt, " \
                          "with mpicc) and make train_gpt_cu (with mpicxx) say which MPI they found; or start one process"

#ifdef USE_MPI

#define mpi_check(call) mpi_check_at((call), #call, __FILE__, __LINE__)
static void mpi_check_at(int rc, const char* call, const char* file, int line) {
    if (rc == MPI_SUCCESS) { return; }
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    fail_at(file, line, "MPI call %s failed: %s\n  hint: did every rank start with the same flags?", call, text);
}

// each group's communicator (dist_grid splits them from the world; dist_finalize frees them)
static MPI_Comm g_dist_comms[DIST_NUM_GROUPS];
static int g_dist_comm_made[DIST_NUM_GROUPS];

static MPI_Comm dist_comm(Dist d) {
    if (d.group == DIST_WORLD) { return MPI_COMM_WORLD; }
    if (!g_dist_comm_made[d.group]) { fail("a collective over the %s group before dist_grid made it (a bug)", DIST_GROUP_NAMES[d.group]); }
    return g_dist_comms[d.group];
}

static void dist_free_groups(void) {
    for (int g = 0; g < DIST_NUM_GROUPS; g++) {
        if (g_dist_comm_made[g]) { mpi_check(MPI_Comm_free(&g_dist_comms[g])); g_dist_comm_made[g] = 0; }
    }
}

#endif

// a launcher variable as a count or rank (0 or more), -1 when unset; set but not a number stops
static int dist_env_int(const char* name) {
    const char* v = getenv(name);
    if (v == NULL) { return -1; }
    char* end;
    long n = strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 0 || n >= INT_MAX) {
        fail("%s=%s: not a number of processes or a rank\n  hint: unset it, or start the program with the launcher that sets it", name, v);
    }
    return (int)n;
}

// the most processes a launcher's variables may name: every rank keeps a few words per rank (the
// rendezvous, the ranks' host names), and a larger count is a typo, not a cluster
#define DIST_MAX_RANKS (1 << 20)

// where a launcher that is not MPI put this process: rank, world, local_rank and which variables said so
typedef struct { int rank, world, local_rank; const char* source; } DistPlace;

// the three variables of one kind of launcher, all set or none (partly set stops, naming them)
static int dist_env_triple(const char* const names[3], int values[3], const char* launcher) {
    int set = 0;
    for (int i = 0; i < 3; i++) { values[i] = dist_env_int(names[i]); set += values[i] >= 0; }
    if (set == 0) { return 0; }
    if (set < 3) {
        char missing[96] = "";
        for (int i = 0; i < 3; i++) {
            if (values[i] < 0) { snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing), "%s%s", missing[0] ? ", " : "", names[i]); }
        }
        fail("%s sets %s, %s and %s together, but %s is not set: this process cannot know its place\n"
             "  hint: set all three (rank, number of processes, rank on this machine) or none", launcher, names[0], names[1], names[2], missing);
    }
    if (values[1] > DIST_MAX_RANKS) {
        fail("%s=%d: more processes than this program runs together (at most %d)\n"
             "  hint: check the launcher's variables (a typo?)", names[1], values[1], DIST_MAX_RANKS);
    }
    if (values[0] >= values[1] || values[2] > values[0]) {
        fail("%s=%d, %s=%d, %s=%d: the rank must be below the number of processes, the local rank at most the rank\n"
             "  hint: check the launcher's variables", names[0], values[0], names[1], values[1], names[2], values[2]);
    }
    return 1;
}

// torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK: torchrun, accelerate, a script of one's own) or
// slurm's srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID). Not SLURM_NTASKS: sbatch and
// salloc set it, and SLURM_PROCID=0, for the job's one shell, which is one process; srun sets the
// step's count. Both kinds set (torchrun started by srun, one per machine): torchrun's place wins,
// unless it contradicts srun's (as many processes but another rank, or fewer processes). 0: neither
static int dist_env_place(DistPlace* p) {
    static const char* const TORCH[3] = {"RANK", "WORLD_SIZE", "LOCAL_RANK"};
    static const char* const SLURM[3] = {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"};
    int t[3], sl[3];
    int torch = dist_env_triple(TORCH, t, "torchrun-style launching");
    int procid = dist_env_int("SLURM_PROCID");
    int slurm = 0;
    if (getenv("SLURM_STEP_NUM_TASKS") != NULL) { slurm = dist_env_triple(SLURM, sl, "slurm's srun"); }
    else if (procid > 0) {
        fail("SLURM_PROCID=%d without SLURM_STEP_NUM_TASKS: slurm set this process's rank but not how many there are\n"
             "  hint: start it with srun (which sets both), or unset SLURM_PROCID", procid);
    }
    if (torch && slurm && ((t[1] == sl[1] && t[0] != sl[0]) || t[1] < sl[1])) {
        fail("the launchers' variables disagree: RANK=%d WORLD_SIZE=%d but SLURM_PROCID=%d SLURM_STEP_NUM_TASKS=%d\n"
             "  hint: unset the torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK) under srun, or start one torchrun per machine (srun --ntasks-per-node=1)",
             t[0], t[1], sl[0], sl[1]);
    }
    if (!torch && !slurm) { return 0; }
    const int* v = torch ? t : sl;
    p->rank = v[0];
    p->world = v[1];
    p->local_rank = v[2];
    p->source = torch ? "torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK)" : "slurm (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID)";
    return 1;
}

// MPI (an MPI build started by mpirun, mpiexec or srun --mpi=pmix: MPI's ranks), else the launcher's
// variables (slurm's or torchrun-style: by_env, the backend carries the collectives), else one process
static void dist_init(Dist* d, int* argc, char*** argv) {
    d->rank = 0;
    d->world = 1;
    d->group = DIST_WORLD;
    g_dist_source = "one process";
    g_dist_env_local_rank = 0;
    char said[64];
    int mpi_launcher;
    int launched = dist_launched_processes(said, &mpi_launcher);
    DistPlace env;
    int by_env = 0;
#ifdef USE_MPI
    // under an MPI launcher, MPI says (mpirun's daemons started by srun leave srun's variables to its ranks)
    if (!mpi_launcher) { by_env = dist_env_place(&env) && env.world > 1; }
    if (!by_env && (mpi_launcher || launched > 1)) {
        mpi_check(MPI_Init(argc, argv));
        mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
        mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &d->rank));
        mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &d->world));
        g_dist_source = "MPI";
        if (launched > d->world) {
            fail("%s: the launcher started more processes than the %d that MPI joined: they would train apart\n"
                 "  hint: launch with the mpirun of the MPI this program was built with, or srun --mpi=pmix (or pmi2)",
                 said, d->world);
        }
    }
#else
    (void)argc; (void)argv;
    by_env = dist_env_place(&env) && env.world > 1;
    // fewer than an MPI launcher started: two would take one place (more: torchrun's processes under
    // srun with a PMI, whose variables count srun's tasks, one per machine)
    if (by_env && mpi_launcher && launched > env.world) {
        fail("%s, but %s says %d processes: the launchers' variables disagree\n  hint: start the program with one launcher", said, env.source, env.world);
    }
    if (!by_env && launched > 1) {
        fail("%s: a launcher (mpirun, mpiexec, srun) started several processes, but this program was built "
             "without MPI: each would train alone, as rank 0 of 1 (on the same GPU)\n  hint: %s; or start them with srun "
             "(slurm's variables) or torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK), which the CUDA trainer "
             "joins over NCCL (--dist-init)", said, DIST_REBUILD_HINT);
    }
#endif
    if (by_env) {
        d->rank = env.rank;
        d->world = env.world;
        g_dist_env_local_rank = env.local_rank;
        g_dist_source = env.source;
    }
    g_dist_world = d->world;
    g_dist_by_env = by_env;
    g_dist_grid = dist_grid_of_one(*d);  // no grid yet: the data group is the world
}

static void dist_finalize(void) {
    if (g_dist_carrier.finish != NULL) { g_dist_carrier.finish(); }
    memset(&g_dist_carrier, 0, sizeof(g_dist_carrier));
#ifdef USE_MPI
    int started = 0;
    MPI_Initialized(&started);
    if (started) { dist_free_groups(); mpi_check(MPI_Finalize()); }
#endif
}

// several processes that MPI does not join: the backend's carrier makes each collective
static int dist_carried(void) { return g_dist_world > 1 && g_dist_by_env; }

static void dist_barrier(void) {
    if (dist_carried()) { int x = 0; dist_carrier("dist_barrier")->allreduce(&x, 1, DIST_INT, DIST_SUM); return; }
#ifdef USE_MPI
    if (g_dist_world > 1) { mpi_check(MPI_Barrier(MPI_COMM_WORLD)); }
#endif
}

#ifdef USE_MPI
// MPI counts are ints: longer buffers are summed in chunks of at most INT_MAX elements
static void dist_allreduce_sum(void* buf, size_t n, MPI_Datatype type, size_t elem_bytes, MPI_Comm comm) {
    for (size_t done = 0; done < n; ) {
        size_t k = n - done < (size_t)INT_MAX ? n - done : (size_t)INT_MAX;
        mpi_check(MPI_Allreduce(MPI_IN_PLACE, (char*)buf + done * elem_bytes, (int)k, type, MPI_SUM, comm));
        done += k;
    }
}
#endif

// the carrier of a collective over group d, without MPI: it carries the world's only
static const DistCarrier* dist_carrier_over(Dist d, const char* call) {
    if (d.group != DIST_WORLD) {
        fail("%s over a %s group of %d ranks: processes that MPI does not join (%s) exchange over the whole world only\n"
             "  hint: launch with mpirun (or srun --mpi=pmix) for tensor parallelism", call, DIST_GROUP_NAMES[d.group], d.world, g_dist_source);
    }
    return dist_carrier(call);
}

// the world as a grid of pp pipeline stages (outermost), each of dp data-parallel places of tp tensor-
// parallel ranks: rank = stage (dp tp) + data tp + tensor. Tensor-parallel groups are tp adjacent ranks
// (one machine's: they exchange every layer); data-parallel groups the dp ranks of a stage at the same
// tensor place (they hold the same part of the model, read different data, sum their gradients, and
// --zero shards over them); pipeline groups the pp ranks at the same (data, tensor) place, a stride of
// dp tp apart (they pass activations and gradients to their neighbours: they can sit on other machines);
// and the pair of a pipeline group's first and last stage (both hold wte). With tp = pp = 1 the data
// group is the world. Every rank calls it with the same tp and pp; a rank's earlier grid is replaced
static DistGrid dist_grid(Dist world, int tp, int pp) {
    if (tp < 1 || pp < 1 || world.world % (tp * pp) != 0) {
        char stages[64] = "";
        if (pp != 1) { snprintf(stages, sizeof(stages), " (--pp %d: %d stages of them)", pp, pp); }
        fail("--tp %d: %d rank(s) do not split into tensor-parallel groups of %d%s\n"
             "  hint: launch a multiple of tp x pp = %d ranks (mpirun -np %d), or give a --tp and --pp whose product divides %d", tp,
             world.world, tp, stages, tp * pp, tp * pp, world.world);
    }
    int block = world.world / pp, dp = block / tp;  // the ranks of a stage, and its data-parallel places
    int stage = world.rank / block, local = world.rank % block;
    DistGrid g = {world, {local / tp, dp, DIST_DATA}, {local % tp, tp, DIST_TENSOR}, {stage, pp, DIST_PIPELINE},
                  {stage == 0 ? 0 : 1, pp > 1 && (stage == 0 || stage == pp - 1) ? 2 : 1, DIST_PAIR}};
    if (g.pair.world == 1) { g.pair.rank = 0; }  // a middle stage's pair is itself
    if (tp == 1 && pp == 1) { g.data = world; }  // the data group is the world: its collectives are the world's, as before
    g_dist_grid = g;
    if ((tp > 1 || pp > 1) && dist_carried()) { dist_carrier_over(tp > 1 ? g.tensor : g.pipeline, "dist_grid"); }  // stops, naming the launch
#ifdef USE_MPI
    dist_free_groups();
    if (world.world > 1 && (tp > 1 || pp > 1)) {
        int in_pair = pp > 1 && (stage == 0 || stage == pp - 1);
        const int colors[DIST_NUM_GROUPS] = {0, stage * tp + local % tp, world.rank / tp, local, in_pair ? local : MPI_UNDEFINED};
        for (int k = DIST_DATA; k < DIST_NUM_GROUPS; k++) {  // ranks of one color form a group
            mpi_check(MPI_Comm_split(MPI_COMM_WORLD, colors[k], world.rank, &g_dist_comms[k]));
            if (g_dist_comms[k] == MPI_COMM_NULL) { continue; }  // a middle stage: in no pair
            mpi_check(MPI_Comm_set_errhandler(g_dist_comms[k], MPI_ERRORS_RETURN));
            g_dist_comm_made[k] = 1;
        }
    }
#endif
    return g;
}

#ifndef USE_MPI
// without MPI there are no point-to-point messages (a carrier makes collectives only): --pp stops
// before any (trainer.h's check_pp_option), so reaching here is a bug
static void dist_no_messages(Dist d, const char* call) {
    if (d.world > 1) { fail("%s: a message between %d ranks without MPI (a bug: --pp needs an MPI build and launch)", call, d.world); }
}
#endif

// --pp's messages between neighbouring stages: n floats to rank `to` of group d, from rank `from`, or
// both at once (MPI_Sendrecv: two neighbours that each send first would wait on each other: llmc/pipeline.h)
static void dist_send_floats(const float* buf, size_t n, int to, Dist d) {
    if (n > (size_t)INT_MAX) { fail("dist_send_floats: %zu floats, beyond MPI's int counts\n  hint: lower -b or -t", n); }
#ifdef USE_MPI
    mpi_check(MPI_Send(buf, (int)n, MPI_FLOAT, to, 0, dist_comm(d)));
#else
    (void)buf; (void)to;
    dist_no_messages(d, "dist_send_floats");
#endif
}
static void dist_recv_floats(float* buf, size_t n, int from, Dist d) {
    if (n > (size_t)INT_MAX) { fail("dist_recv_floats: %zu floats, beyond MPI's int counts\n  hint: lower -b or -t", n); }
#ifdef USE_MPI
    mpi_check(MPI_Recv(buf, (int)n, MPI_FLOAT, from, 0, dist_comm(d), MPI_STATUS_IGNORE));
#else
    (void)buf; (void)from;
    dist_no_messages(d, "dist_recv_floats");
#endif
}
static void dist_sendrecv_floats(const float* send, size_t sn, int to, float* recv, size_t rn, int from, Dist d) {
    if (sn > (size_t)INT_MAX || rn > (size_t)INT_MAX) { fail("dist_sendrecv_floats: beyond MPI's int counts\n  hint: lower -b or -t"); }
#ifdef USE_MPI
    mpi_check(MPI_Sendrecv(send, (int)sn, MPI_FLOAT, to, 0, recv, (int)rn, MPI_FLOAT, from, 0, dist_comm(d), MPI_STATUS_IGNORE));
#else
    (void)send; (void)to; (void)recv; (void)from;
    dist_no_messages(d, "dist_sendrecv_floats");
#endif
}

// buf (n) := the sum of buf over the ranks of group d
static void dist_allreduce_floats_over(float* buf, size_t n, Dist d) {
    if (d.world < 2) { return; }
    g_dist_collectives++;
    if (dist_carried()) { dist_carrier_over(d, "dist_allreduce_floats_over")->allreduce(buf, n, DIST_FLOAT, DIST_SUM); return; }
#ifdef USE_MPI
    dist_allreduce_sum(buf, n, MPI_FLOAT, sizeof(float), dist_comm(d));
#else
    (void)buf; (void)n;
#endif
}

// buf (n) := the largest of buf over the ranks of group d, element by element
static void dist_allreduce_max_floats_over(float* buf, size_t n, Dist d) {
    if (d.world < 2) { return; }
    g_dist_collectives++;
    if (dist_carried()) { dist_carrier_over(d, "dist_allreduce_max_floats_over")->allreduce(buf, n, DIST_FLOAT, DIST_MAX); return; }
#ifdef USE_MPI
    for (size_t done = 0; done < n; ) {  // MPI counts are ints
        size_t k = n - done < (size_t)INT_MAX ? n - done : (size_t)INT_MAX;
        mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf + done, (int)k, MPI_FLOAT, MPI_MAX, dist_comm(d)));
        done += k;
    }
#else
    (void)buf; (void)n;
#endif
}

// buf (n) := the sum of every rank's buf
static void dist_allreduce_sum_floats(float* buf, size_t n) {
    Dist world = {0, g_dist_world, DIST_WORLD};  // the rank does not matter to a sum
    dist_allreduce_floats_over(buf, n, world);
}

// buf (n doubles) := the sum of buf over the ranks of group d
static void dist_allreduce_doubles_over(double* buf, size_t n, Dist d) {
    if (d.world < 2) { return; }
    g_dist_collectives++;
    if (dist_carried()) { dist_carrier_over(d, "dist_allreduce_doubles_over")->allreduce(buf, n, DIST_DOUBLE, DIST_SUM); return; }
#ifdef USE_MPI
    dist_allreduce_sum(buf, n, MPI_DOUBLE, sizeof(double), dist_comm(d));
#else
    (void)buf; (void)n;
#endif
}

static void dist_allreduce_sum_doubles(double* buf, size_t n) {
    Dist world = {0, g_dist_world, DIST_WORLD};
    dist_allreduce_doubles_over(buf, n, world);
}

// the same over this rank's data-parallel or tensor-parallel group of the last grid (the world's, one
// rank, before dist_grid), for the hooks that hold no Dist: the optimizer's sums across ZeRO's ranks and
// across --tp's slices of a tensor (opt_layout.h's OptSumFn)
static void dist_sum_doubles_data(double* buf, size_t n) { dist_allreduce_doubles_over(buf, n, g_dist_grid.data); }
static void dist_sum_doubles_tensor(double* buf, size_t n) { dist_allreduce_doubles_over(buf, n, g_dist_grid.tensor); }

// 1 if flag is nonzero on any rank (a signal may reach one rank before the others)
static int dist_any(int flag) {
    if (dist_carried()) { flag = flag != 0; dist_carrier("dist_any")->allreduce(&flag, 1, DIST_INT, DIST_MAX); return flag != 0; }
#ifdef USE_MPI
    if (g_dist_world > 1) { mpi_check(MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD)); }
#endif
    return flag != 0;
}

// the smallest and largest of v over the ranks
static void dist_min_max_u64(uint64_t v, uint64_t* min, uint64_t* max) {
    *min = *max = v;
    if (dist_carried()) {
        dist_carrier("dist_min_max_u64")->allreduce(min, 1, DIST_UINT64, DIST_MIN);
        dist_carrier("dist_min_max_u64")->allreduce(max, 1, DIST_UINT64, DIST_MAX);
        return;
    }
#ifdef USE_MPI
    if (g_dist_world > 1) {
        mpi_check(MPI_Allreduce(&v, min, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD));
        mpi_check(MPI_Allreduce(&v, max, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD));
    }
#endif
}

// floats before rank's part
static size_t dist_part_offset(const int* counts, int rank) {
    size_t off = 0;
    for (int r = 0; r < rank; r++) { off += (size_t)counts[r]; }
    return off;
}

// rank d.rank's part of buf := the sum over the ranks of that part (the rest of buf is left
// holding this rank's own, unreduced values)
static void dist_reduce_scatter_floats(float* buf, const int* counts, Dist d) {
    if (d.world > 1) { g_dist_collectives++; }
    if (d.world > 1 && dist_carried()) { dist_carrier_over(d, "dist_reduce_scatter_floats")->reduce_scatter(buf, counts, d.rank, d.world); return; }
#ifdef USE_MPI
    if (d.world > 1) {
        // in place, MPI leaves the result at the start of buf: move it to this rank's part
        mpi_check(MPI_Reduce_scatter(MPI_IN_PLACE, buf, counts, MPI_FLOAT, MPI_SUM, dist_comm(d)));
        memmove(buf + dist_part_offset(counts, d.rank), buf, (size_t)counts[d.rank] * sizeof(float));
    }
#else
    (void)buf; (void)counts; (void)d;
#endif
}

// ZeRO-2: buf holds world parts of `count` floats each, rank by rank; on return the first
// `count` floats hold the sum over the ranks of this rank's part (MPI_Reduce_scatter_block in
// place). The host's NCCL carrier (launches without MPI) has no such call: the CUDA trainer,
// the one that uses it, reduce-scatters ZeRO-2's gradients on the GPU (cuda/zero.cuh), not here
static void dist_reduce_scatter_block_floats(float* buf, int count, Dist d) {
    if (d.world < 2) { return; }
    g_dist_collectives++;
    if (dist_carried()) { fail("dist_reduce_scatter_block_floats: ZeRO-2 runs under MPI only\n  hint: launch with mpirun, or use --zero 1"); }
#ifdef USE_MPI
    mpi_check(MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, dist_comm(d)));
#else
    (void)buf; (void)count;
#endif
}

// ZeRO-3: buf holds world parts of `count` floats each, rank by rank; this rank's part is filled, and
// on return every part holds its owner's (MPI_Allgather in place). MPI only, as its reduce-scatter twin
static void dist_allgather_block_floats(float* buf, int count, Dist d) {
    if (d.world < 2) { return; }
    g_dist_collectives++;
    if (dist_carried()) { fail("dist_allgather_block_floats: ZeRO-3 runs under MPI only\n  hint: launch with mpirun, or use --zero 1"); }
#ifdef USE_MPI
    mpi_check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, count, MPI_FLOAT, dist_comm(d)));
#else
    (void)buf; (void)count;
#endif
}

// every rank's buf := the parts of all ranks, each from its owner
static void dist_allgather_floats(float* buf, const int* counts, Dist d) {
    if (d.world > 1) { g_dist_collectives++; }
    if (d.world > 1 && dist_carried()) { dist_carrier_over(d, "dist_allgather_floats")->allgather(buf, counts, d.rank, d.world); return; }
#ifdef USE_MPI
    if (d.world > 1) {
        int* displs = (int*)malloc_check((size_t)d.world * sizeof(int));
        for (int r = 0; r < d.world; r++) { displs[r] = (int)dist_part_offset(counts, r); }
        mpi_check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_FLOAT, dist_comm(d)));
        free(displs);
    }
#else
    (void)buf; (void)counts; (void)d;
#endif
}

// this process on its machine: its rank among the ranks there (the GPU it takes, so that one
// command works on one machine or many) and how many ranks share the machine's memory; 0 and 1
// for one process; without MPI as the carrier found them (the launcher's local rank before it starts)
static void dist_local(int* rank, int* ranks) {
    *rank = 0;
    *ranks = 1;
    if (dist_carried()) {
        if (g_dist_carrier.allreduce == NULL) { fail("dist_local: called before the carrier of the collectives started (a bug)"); }
        *rank = g_dist_carrier.local_rank;
        *ranks = g_dist_carrier.local_ranks;
        return;
    }
#ifdef USE_MPI
    if (g_dist_world > 1) {
        MPI_Comm local;
        mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
        mpi_check(MPI_Comm_rank(local, rank));
        mpi_check(MPI_Comm_size(local, ranks));
        mpi_check(MPI_Comm_free(&local));
    }
#endif
}
static int dist_local_ranks(void) { int r, n; dist_local(&r, &n); return n; }
static int dist_local_rank(void) { int r, n; dist_local(&r, &n); return r; }

// buf (n floats) := the buf of rank root of group d, on every rank of d
static void dist_broadcast_floats_over(float* buf, size_t n, int root, Dist d) {
    if (d.world < 2) { return; }
    g_dist_collectives++;
    if (dist_carried()) { dist_carrier_over(d, "dist_broadcast_floats_over")->broadcast(buf, n * sizeof(float), root); return; }
#ifdef USE_MPI
    for (size_t done = 0; done < n; ) {  // MPI counts are ints
        size_t k = n - done < (size_t)INT_MAX ? n - done : (size_t)INT_MAX;
        mpi_check(MPI_Bcast(buf + done, (int)k, MPI_FLOAT, root, dist_comm(d)));
        done += k;
    }
#else
    (void)buf; (void)n; (void)root;
#endif
}

// buf (bytes) := root's buf, on every rank (e.g. NCCL's unique id from rank 0)
static void dist_broadcast_bytes(void* buf, size_t bytes, int root) {
    if (dist_carried()) { dist_carrier("dist_broadcast_bytes")->broadcast(buf, bytes, root); return; }
#ifdef USE_MPI
    if (g_dist_world > 1) {
        if (bytes > (size_t)INT_MAX) { fail("dist_broadcast_bytes: %zu bytes is beyond MPI's int counts", bytes); }
        mpi_check(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD));
    }
#else
    (void)buf; (void)bytes; (void)root;
#endif
}

// the same over the world that dist_init started, or this rank's data-parallel group of the last
// grid, for callers that hold no Dist (the optimizer's hook): an in-place gather needs the counts
static void dist_allgather_floats_world(float* buf, const int* counts) {
    Dist world = {0, g_dist_world, DIST_WORLD};
    world.rank = g_dist_grid.world.rank;
    dist_allgather_floats(buf, counts, world);
}
static void dist_allgather_floats_data(float* buf, const int* counts) { dist_allgather_floats(buf, counts, g_dist_grid.data); }

#endif // LLMC_DISTRIBUTED_H
