/*
dist_settings.h: every rank of a run must be started with the same settings; this checks that they
were, on every launch path (mpirun, srun, torchrun-style variables), before the first step, and stops
every rank naming the first setting that differs and its two values.

    SettingsDigest d;
    settings_digest(&d, &opt, world, backend);   // before the ranks meet
    dist_set_settings_hash(d.hash);              // the rendezvous refuses another job's peer at the door
    ... the ranks start ...
    settings_check_ranks(&d, &opt, rank, world, backend);   // a broadcast and a reduction; stops on a difference

Two jobs that met by mistake (one port or folder of --dist-init, or `mpirun -np 1 A : -np 1 B`) would
otherwise train together, each rank with its own seed or learning rate, until the replicas' hash
tells much later, and then blames the data-parallel step.

What is compared: every flag of flags.h's table (its exact value, as set_flag reads it back), the
world size, the backend (the CPU trainer, the CUDA trainer), and the contents of the files the numbers
depend on, as far as that is cheap: the model file's size and the checksum its header records, and
each training shard's size (the same -i on two machines may name different copies).
*/
#ifndef LLMC_DIST_SETTINGS_H
#define LLMC_DIST_SETTINGS_H

#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "checkpoint.h"
#include "distributed.h"
#include "flags.h"

// the settings compared: one row per flag, then these
enum { SETTING_WORLD = NUM_FLAGS, SETTING_BACKEND, SETTING_MODEL_FILE, SETTING_TRAIN_FILES, NUM_SETTINGS };
#define SETTING_VALUE_LEN (PATH_MAX_LEN + 64)   // a flag's value as text, or a file's description

typedef struct {
    uint64_t row[NUM_SETTINGS];   // each setting's hash
    uint64_t hash;                // of them all: what the rendezvous compares
} SettingsDigest;

// the text of setting i on this rank: a flag's value, or what the rows after the flags describe
static void settings_value(int i, const TrainOptions* o, int world, const char* backend, char* buf, size_t n) {
    if (i < NUM_FLAGS) { flag_value_arg(&FLAGS[i], o, buf, n); return; }
    if (i == SETTING_WORLD) { snprintf(buf, n, "%d rank(s)", world); return; }
    if (i == SETTING_BACKEND) { snprintf(buf, n, "%s", backend); return; }
    struct stat st;
    if (i == SETTING_MODEL_FILE) {
        uint32_t crc;
        if (stat(o->model, &st) != 0) { snprintf(buf, n, "no file (a preset)"); return; }
        int has = model_file_checksum(o->model, &crc);
        snprintf(buf, n, "%lld bytes, CRC-32 %s0x%08x", (long long)st.st_size, has ? "" : "(none recorded) ", has ? crc : 0);
        return;
    }
    // SETTING_TRAIN_FILES: how many shards -i names and their sizes, summed with their order
    glob_t g;
    uint64_t sum = 0;
    size_t count = 0;
    if (glob(o->train_data, 0, NULL, &g) == 0) {
        count = g.gl_pathc;
        for (size_t k = 0; k < g.gl_pathc; k++) {
            if (stat(g.gl_pathv[k], &st) == 0) { sum = sum * FNV64_PRIME + (uint64_t)st.st_size; }
        }
        globfree(&g);
    }
    snprintf(buf, n, "%zu shard(s), sizes digest 0x%016llx", count, (unsigned long long)sum);
}

static const char* settings_name(int i) {
    static const char* const rows[] = {"the number of ranks", "the program", "the model file (-e)", "the training shards (-i)"};
    return i < NUM_FLAGS ? FLAGS[i].longname : rows[i - NUM_FLAGS];
}

static void settings_digest(SettingsDigest* d, const TrainOptions* o, int world, const char* backend) {
    char value[SETTING_VALUE_LEN];
    d->hash = FNV64_OFFSET;
    for (int i = 0; i < NUM_SETTINGS; i++) {
        settings_value(i, o, world, backend, value, sizeof(value));
        d->row[i] = ((uint64_t)crc32_update(0, settings_name(i), strlen(settings_name(i))) << 32) | crc32_update(0, value, strlen(value));
        d->hash = (d->hash ^ d->row[i]) * FNV64_PRIME;
    }
}

// every rank against rank 0: stops on every rank, naming the first setting that differs (the lowest
// row, and of the ranks that differ there the lowest) with rank 0's value and that rank's
static void settings_check_ranks(const SettingsDigest* mine, const TrainOptions* o, int rank, int world, const char* backend) {
    if (world < 2) { return; }
    SettingsDigest root = *mine;
    dist_broadcast_bytes(root.row, sizeof(root.row), 0);
    uint64_t first = UINT64_MAX, lo, hi;   // (row << 32) | rank of this rank's first difference
    for (int i = 0; i < NUM_SETTINGS && first == UINT64_MAX; i++) {
        if (root.row[i] != mine->row[i]) { first = ((uint64_t)i << 32) | (uint64_t)rank; }
    }
    dist_min_max_u64(first, &lo, &hi);
    if (lo == UINT64_MAX) { return; }
    int row = (int)(lo >> 32), other = (int)(lo & 0xffffffffu);
    char at_root[SETTING_VALUE_LEN], at_other[SETTING_VALUE_LEN];
    settings_value(row, o, world, backend, at_root, sizeof(at_root));
    memcpy(at_other, at_root, sizeof(at_other));
    dist_broadcast_bytes(at_root, sizeof(at_root), 0);
    dist_broadcast_bytes(at_other, sizeof(at_other), other);
    fail("the ranks were started with different settings: %s is %s on rank 0, but %s on rank %d (this is rank %d)\n"
         "  hint: start every rank with the same command line and files; two jobs on one --dist-init port or folder, or "
         "one mpirun starting two programs, meet like this", settings_name(row), at_root, at_other, other, rank);
}

#endif // LLMC_DIST_SETTINGS_H
