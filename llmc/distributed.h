/*
distributed.h: data parallelism over MPI ranks, as a handful of collective calls.
Built with -DUSE_MPI (`make` does when mpicc exists) they are MPI collectives on
MPI_COMM_WORLD; built without, one process is the whole world and every call is a
no-op, so the trainer has a single code path.

    Dist d;
    dist_init(&d, &argc, &argv);                 // d.rank, d.world (1 without mpirun)
    dist_allreduce_sum_floats(grads, n);         // every rank ends with the sum
    dist_reduce_scatter_floats(buf, counts, d);  // rank r ends with the sum of its part
    dist_allgather_floats(buf, counts, d);       // every rank ends with every part
    dist_finalize();

Parts: buf holds the parts of all ranks in rank order, counts[r] floats for rank r;
reduce-scatter and all-gather work in place on buf (rank r's part at the sum of
counts[0..r-1]). Every rank must make the same calls in the same order, also a rank
whose part is empty.

Launch: `mpirun -np N ./train_gpt ...` (or mpiexec, or srun). A plain `./train_gpt` of an
MPI build does not start MPI at all (OpenMPI's singleton start costs about 0.4 s and a helper
daemon): MPI starts only when a launcher's environment variable is set (DIST_LAUNCHER_VARS).
A launcher that started several processes stops every one of them at start-up, naming the
rebuild, where they could not join: a build without MPI (each would train alone, as rank 0 of
1), or an MPI that sees fewer ranks than the launcher started (srun without --mpi=pmix).

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

typedef struct {
    int rank;   // this process, 0..world-1
    int world;  // number of processes (MPI ranks)
} Dist;

// --zero: how the data-parallel ranks hold the optimizer
typedef enum {
    ZERO_REPLICATED = 0,   // gradients all-reduced, every rank keeps the whole optimizer state
    ZERO_SHARDED = 1,      // ZeRO-1: each rank keeps and updates 1/world of the state and weights
} ZeroStage;

static int g_dist_world = 1;  // the world of the last dist_init; collectives are no-ops at 1

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

#endif

static void dist_init(Dist* d, int* argc, char*** argv) {
    d->rank = 0;
    d->world = 1;
    char said[64];
    int mpi_launcher;
    int launched = dist_launched_processes(said, &mpi_launcher);
#ifdef USE_MPI
    if (mpi_launcher || launched > 1) {
        mpi_check(MPI_Init(argc, argv));
        mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
        mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &d->rank));
        mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &d->world));
    }
    if (launched > d->world) {
        fail("%s: the launcher started more processes than the %d that MPI joined: they would train apart\n"
             "  hint: launch with the mpirun of the MPI this program was built with, or srun --mpi=pmix (or pmi2)",
             said, d->world);
    }
#else
    (void)argc; (void)argv;
    if (launched > 1) {
        fail("%s: a launcher (mpirun, mpiexec, srun) started several processes, but this program was built "
             "without MPI: each would train alone, as rank 0 of 1 (on the same GPU)\n  hint: %s", said, DIST_REBUILD_HINT);
    }
#endif
    g_dist_world = d->world;
}

static void dist_finalize(void) {
#ifdef USE_MPI
    int started = 0;
    MPI_Initialized(&started);
    if (started) { mpi_check(MPI_Finalize()); }
#endif
}

static void dist_barrier(void) {
#ifdef USE_MPI
    if (g_dist_world > 1) { mpi_check(MPI_Barrier(MPI_COMM_WORLD)); }
#endif
}

#ifdef USE_MPI
// MPI counts are ints: longer buffers are summed in chunks of at most INT_MAX elements
static void dist_allreduce_sum(void* buf, size_t n, MPI_Datatype type, size_t elem_bytes) {
    for (size_t done = 0; done < n; ) {
        size_t k = n - done < (size_t)INT_MAX ? n - done : (size_t)INT_MAX;
        mpi_check(MPI_Allreduce(MPI_IN_PLACE, (char*)buf + done * elem_bytes, (int)k, type, MPI_SUM, MPI_COMM_WORLD));
        done += k;
    }
}
#endif

// buf (n) := the sum of every rank's buf
static void dist_allreduce_sum_floats(float* buf, size_t n) {
#ifdef USE_MPI
    if (g_dist_world > 1) { dist_allreduce_sum(buf, n, MPI_FLOAT, sizeof(float)); }
#else
    (void)buf; (void)n;
#endif
}

static void dist_allreduce_sum_doubles(double* buf, size_t n) {
#ifdef USE_MPI
    if (g_dist_world > 1) { dist_allreduce_sum(buf, n, MPI_DOUBLE, sizeof(double)); }
#else
    (void)buf; (void)n;
#endif
}

// 1 if flag is nonzero on any rank (a signal may reach one rank before the others)
static int dist_any(int flag) {
#ifdef USE_MPI
    if (g_dist_world > 1) { mpi_check(MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD)); }
#endif
    return flag != 0;
}

// the smallest and largest of v over the ranks
static void dist_min_max_u64(uint64_t v, uint64_t* min, uint64_t* max) {
    *min = *max = v;
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
#ifdef USE_MPI
    if (d.world > 1) {
        // in place, MPI leaves the result at the start of buf: move it to this rank's part
        mpi_check(MPI_Reduce_scatter(MPI_IN_PLACE, buf, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
        memmove(buf + dist_part_offset(counts, d.rank), buf, (size_t)counts[d.rank] * sizeof(float));
    }
#else
    (void)buf; (void)counts; (void)d;
#endif
}

// every rank's buf := the parts of all ranks, each from its owner
static void dist_allgather_floats(float* buf, const int* counts, Dist d) {
#ifdef USE_MPI
    if (d.world > 1) {
        int* displs = (int*)malloc_check((size_t)d.world * sizeof(int));
        for (int r = 0; r < d.world; r++) { displs[r] = (int)dist_part_offset(counts, r); }
        mpi_check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_FLOAT, MPI_COMM_WORLD));
        free(displs);
    }
#else
    (void)buf; (void)counts; (void)d;
#endif
}

// this process on its machine: its rank among the ranks there (the GPU it takes, so that one
// command works on one machine or many) and how many ranks share the machine's memory; 0 and 1
// without MPI
static void dist_local(int* rank, int* ranks) {
    *rank = 0;
    *ranks = 1;
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

// buf (bytes) := root's buf, on every rank (e.g. NCCL's unique id from rank 0)
static void dist_broadcast_bytes(void* buf, size_t bytes, int root) {
#ifdef USE_MPI
    if (g_dist_world > 1) {
        if (bytes > (size_t)INT_MAX) { fail("dist_broadcast_bytes: %zu bytes is beyond MPI's int counts", bytes); }
        mpi_check(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD));
    }
#else
    (void)buf; (void)bytes; (void)root;
#endif
}

// the same over the world that dist_init started, for callers that hold no Dist (the
// optimizer's hook): an in-place gather needs the counts, not this rank's number
static void dist_allgather_floats_world(float* buf, const int* counts) {
    Dist world = {0, g_dist_world};
    dist_allgather_floats(buf, counts, world);
}

#endif // LLMC_DISTRIBUTED_H
