/*
checkpoint.h: the model file (llm.c's format, so models move between the two
projects), the training-state file, and atomic writes.

Model file: header 256 x int32 with named slots (MODEL_SLOT_*): magic 20240326,
version 3 (fp32 weights) or 5 (bf16 weights, read and converted to fp32), maxT, V,
L, NH, C, Vp; then the 16 parameter tensors in model_config.h's order. This trainer's
model files also record the CRC-32 of the weights' bytes (crc32.h) in header slots that llm.c
leaves 0 and never reads (MODEL_SLOT_CHECKSUM_KIND, MODEL_SLOT_CHECKSUM), so llm.c still reads them.

Training-state file (this project's own): header 256 x int32 (STATE_SLOT_*, 64-bit
values in two slots, low half first): magic, version, processes, rank, step, data
position, sampling RNG, optimizer-state length, parameter count, ZeRO stage, the run's
identity (a random 64-bit id chosen when the run started, the same in every file it
writes), the hash of the weights of the checkpoint's model file, the file's CRC-32
(version 4) and the optimizer state's format (version 5: QStateFormat, llmc/quant_state.h; older
files are fp32); then the optimizer state, a block of floats in opt_layout.h's layout (bf16 and
8-bit moments packed into it). A resume never combines files of two runs, or of
two steps: each rank's state names rank 0's run, and the weights read hash to what the state
recorded. With
several ranks every rank writes its own state file (its data position; under ZeRO-1 its
blocks of the optimizer state).

A checkpoint of step S in directory D is D/model_S.bin, D/state_S_rank.bin and,
written last, D/DONE_S: a checkpoint without its DONE marker is incomplete and never
resumed from (and a DONE marker goes before its step's files are written again). Rank 0
writes D/WRITING_S before any file of step S and removes it after DONE_S: the record that
this trainer wrote the files of step S, so that a later run removes an incomplete
checkpoint's files only where that record stands, and never a file of the user's that is
merely named like one (it stops instead, naming the file). Every
file is written to a temporary name, flushed to disk (fsync) and renamed into place, so a
crash leaves either the old file or the new one, never half; the temporary files a crash
leaves are removed when the next run starts there. With several ranks rank 0 writes DONE_S
only once every rank has its state file in place (a barrier), so a rank killed anywhere in
the write leaves checkpoint S without its marker; a marker whose files were lost later (one
deleted, truncated, or of another run, rank or write) is found by checkpoint_damage, and the
resume skips that checkpoint, saying which rank's file and why. The output directory: what an earlier
run left (output_dir_contents, output_dir_clear), a lock while a run uses it (flock),
room for a checkpoint, and keeping only the newest K (checkpoint_prune).

    GPT2Config cfg; FILE* f = model_file_open(path, &cfg, &version);
    model_file_read_params(f, path, &cfg, version, params);

Failure: a foreign, truncated or inconsistent file stops with what is wrong and
how to make a right one.
*/
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "crc32.h"
#include "file_header.h"
#include "model_config.h"
#include "opt_layout.h"
#include "utils.h"

#define MODEL_MAGIC 20240326
#define MODEL_VERSION_FP32 3
#define MODEL_VERSION_BF16 5
enum {
    MODEL_SLOT_MAGIC = FILE_SLOT_MAGIC, MODEL_SLOT_VERSION = FILE_SLOT_VERSION, MODEL_SLOT_MAX_SEQ_LEN = 2, MODEL_SLOT_VOCAB_SIZE = 3,
    MODEL_SLOT_NUM_LAYERS = 4, MODEL_SLOT_NUM_HEADS = 5, MODEL_SLOT_CHANNELS = 6, MODEL_SLOT_PADDED_VOCAB = 7,
    MODEL_SLOT_CHECKSUM_KIND = 16,   // MODEL_CHECKSUM_CRC32: slot 17 holds the weights' checksum (0 in llm.c's files)
    MODEL_SLOT_CHECKSUM = 17,        // the CRC-32 of the bytes after the header
};
#define MODEL_CHECKSUM_CRC32 0x32335243  // "CR32" in the file's bytes (fp32 files only)

#define STATE_MAGIC 20261121   // this project's training state (not llm.c's layout)
#define STATE_VERSION 7   // 7: --pp (the state is of a stage's tensors)
#define STATE_VERSION_NO_PP 6        // 6: --tp (the state is of a rank's slices); no --pp (1); still read
#define STATE_VERSION_NO_TP 5        // 5: the optimizer state's format; no --tp (1); still read
#define STATE_VERSION_FP32_STATE 4   // 4: the file's checksum; fp32 state; still read
#define STATE_VERSION_NO_CHECKSUM 3  // 3: the run identity and the hash of the checkpoint's weights; still read
#define STATE_VERSION_NO_IDENTITY 2  // 2: optimizer state per slice for every optimizer (AdamW too), ZeRO stage; still read
#define STATE_REGEN_HINT "a training-state file is written by this trainer's checkpoints (-o, -n); resume with the version that wrote it"
enum {
    STATE_SLOT_MAGIC = FILE_SLOT_MAGIC, STATE_SLOT_VERSION = FILE_SLOT_VERSION, STATE_SLOT_NUM_PROCESSES = 2, STATE_SLOT_RANK = 3,
    STATE_SLOT_STEP = 4, STATE_SLOT_DATA_SHARD = 5, STATE_SLOT_DATA_EPOCH = 6,
    STATE_SLOT_DATA_POSITION = 8,    // 64-bit: slots 8, 9
    STATE_SLOT_RNG = 10,             // 64-bit: slots 10, 11
    STATE_SLOT_OPT_FLOATS = 12,      // 64-bit: slots 12, 13
    STATE_SLOT_NUM_PARAMS = 14,      // 64-bit: slots 14, 15
    STATE_SLOT_ZERO = 16,            // ZeroStage (distributed.h): 1 = this file holds rank's blocks only
    STATE_SLOT_RUN_ID = 18,          // 64-bit: slots 18, 19 (version 3)
    STATE_SLOT_MODEL_HASH = 20,      // 64-bit: slots 20, 21 (version 3)
    STATE_SLOT_CHECKSUM = 22,        // version 4: the CRC-32 of the whole file with this slot 0
    STATE_SLOT_OPT_FORMAT = 23,      // version 5: QStateFormat of the optimizer's moments (older: fp32)
    STATE_SLOT_TP = 24,              // version 6: --tp, the tensor-parallel ranks whose slices the state is of (older: 1)
    STATE_SLOT_PP = 25,              // version 7: --pp, the pipeline stages whose tensors the state is of (older: 1)
};

// ----------------------------------------------------------------------------
// a checkpoint file's checksum is a CRC-32 (crc32.h) of its bytes: a file changed after it was
// written (a disk or copy error, an edit) is named as damaged, and a resume goes back to an intact
// checkpoint, instead of training on from it
#define CHECKSUM_READ_BYTES (1 << 20)   // read at a time when a file is checked

// *crc over the next n bytes of f; 0 if f ends before them
static int file_crc32(FILE* f, uint32_t* crc, size_t n) {
    static unsigned char buf[CHECKSUM_READ_BYTES];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < CHECKSUM_READ_BYTES ? n - done : CHECKSUM_READ_BYTES;
        if (fread(buf, 1, k, f) != k) { return 0; }
        *crc = crc32_update(*crc, buf, k);
        done += k;
    }
    return 1;
}

// a 64-bit hash of the weights' bits (FNV-1a over 32-bit words), not a file's checksum: a state
// file records its checkpoint's weights by it (equal weights, equal hash), so that a resume never
// combines the files of two checkpoints. params_hash_more goes on from h over the next n weights
#define FNV64_OFFSET 0xcbf29ce484222325ULL
#define FNV64_PRIME 0x100000001b3ULL
static uint64_t params_hash_more(uint64_t h, const float* params, size_t n) {
    const uint32_t* w = (const uint32_t*)params;
    for (size_t i = 0; i < n; i++) { h = (h ^ w[i]) * FNV64_PRIME; }
    return h;
}
static uint64_t params_hash(const float* params, size_t n) { return params_hash_more(FNV64_OFFSET, params, n); }

// ----------------------------------------------------------------------------
// atomic writes: write to "<path>.tmp", fsync, rename over <path>, fsync the directory

#define CHECKPOINT_PATH_LEN 1100  // an output directory (flags.h: PATH_MAX_LEN) and a file name
typedef struct {
    FILE* f;
    char path[CHECKPOINT_PATH_LEN], tmp[CHECKPOINT_PATH_LEN + 4];
    int created;  // tmp is this write's own file (removed if the write fails)
} AtomicFile;

// the checkpoint this process is writing (checkpoint_begin .. checkpoint_mark_done), or step
// -1: a write that fails removes the files of it this process wrote, so no model file without
// its state (and DONE marker) is left to fill the disk
static struct { char dir[CHECKPOINT_PATH_LEN]; int step, rank; } g_ckpt_writing = {"", -1, -1};

static void checkpoint_path(char* buf, size_t n, const char* dir, const char* kind, int step, int rank) {
    if (rank < 0) { snprintf(buf, n, "%s/%s_%08d.bin", dir, kind, step); }
    else { snprintf(buf, n, "%s/%s_%08d_%05d.bin", dir, kind, step, rank); }
}

// an empty marker file of checkpoint `step`: DONE_step (complete) or WRITING_step (this trainer began it)
static void checkpoint_marker_path(char* buf, size_t n, const char* dir, const char* marker, int step) {
    snprintf(buf, n, "%s/%s_%08d", dir, marker, step);
}

// a failed write, flush or rename of a (errno: why; a full disk, most often): removes its
// temporary file and the files of the checkpoint under way that this process wrote, and stops
// naming the file
static void atomic_fail(AtomicFile* a, const char* what) {
    int err = errno;
    if (a->f != NULL) { fclose(a->f); }
    if (a->created) { remove(a->tmp); }
    char also[CHECKPOINT_PATH_LEN + 96] = "";
    if (g_ckpt_writing.step >= 0) {
        char path[CHECKPOINT_PATH_LEN + 64];  // the directory and a checkpoint file's name
        checkpoint_path(path, sizeof(path), g_ckpt_writing.dir, "state", g_ckpt_writing.step, g_ckpt_writing.rank);
        remove(path);
        if (g_ckpt_writing.rank == 0) {
            checkpoint_path(path, sizeof(path), g_ckpt_writing.dir, "model", g_ckpt_writing.step, -1);
            remove(path);
            checkpoint_marker_path(path, sizeof(path), g_ckpt_writing.dir, "WRITING", g_ckpt_writing.step);  // its record, last
            remove(path);
        }
        snprintf(also, sizeof(also), " and this process's files of checkpoint %d (it has no DONE marker: incomplete)", g_ckpt_writing.step);
    }
    char dir[CHECKPOINT_PATH_LEN];
    snprintf(dir, sizeof(dir), "%s", a->path);
    char* slash = strrchr(dir, '/');
    if (slash != NULL) { *slash = '\0'; } else { strcpy(dir, "."); }
    fail("cannot %s '%s' (written as '%s'): %s; removed what this write left%s\n"
         "  hint: free space on the disk of '%s' (df '%s') and check that it is writable, or choose another -o", what, a->path, a->tmp, strerror(err), also, dir, dir);
}

static void atomic_open(AtomicFile* a, const char* path) {
    snprintf(a->path, sizeof(a->path), "%s", path);
    snprintf(a->tmp, sizeof(a->tmp), "%s.tmp", path);
    a->f = fopen(a->tmp, "wb");
    a->created = a->f != NULL;
    if (a->f == NULL) { atomic_fail(a, "write"); }
}

static void atomic_write(AtomicFile* a, const void* ptr, size_t size, size_t n) {
    if (fwrite(ptr, size, n, a->f) != n) { atomic_fail(a, "write"); }
}

static void fsync_dir_of(const char* path) {
    char dir[CHECKPOINT_PATH_LEN];
    snprintf(dir, sizeof(dir), "%s", path);
    char* slash = strrchr(dir, '/');
    if (slash == NULL) { strcpy(dir, "."); } else if (slash == dir) { dir[1] = '\0'; } else { *slash = '\0'; }
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) { fsync(fd); close(fd); }
}

static void atomic_commit(AtomicFile* a) {
    if (fflush(a->f) != 0 || fsync(fileno(a->f)) != 0) { atomic_fail(a, "write"); }
    int closed = fclose(a->f);
    a->f = NULL;
    if (closed != 0) { atomic_fail(a, "write"); }
    if (rename(a->tmp, a->path) != 0) { atomic_fail(a, "rename into place"); }
    fsync_dir_of(a->path);
}

// ----------------------------------------------------------------------------
// model file

#define MODEL_REGEN_HINT "a model file comes from this trainer (-o) or from llm.c's train_gpt2.py"

// opens a model file and reads its header into cfg; leaves f at the first tensor
static FILE* model_file_open(const char* path, GPT2Config* cfg, int* version) {
    FILE* f = fopen_check(path, "rb");
    int h[FILE_HEADER_INTS];
    long size = file_header_read(f, path, "model file", MODEL_MAGIC, MODEL_REGEN_HINT, h);
    *version = h[MODEL_SLOT_VERSION];
    if (*version != MODEL_VERSION_FP32 && *version != MODEL_VERSION_BF16) {
        fail("model file '%s' has version %d; this program reads %d (fp32) and %d (bf16)\n  hint: %s",
             path, *version, MODEL_VERSION_FP32, MODEL_VERSION_BF16, MODEL_REGEN_HINT);
    }
    cfg->max_seq_len = h[MODEL_SLOT_MAX_SEQ_LEN];
    cfg->vocab_size = h[MODEL_SLOT_VOCAB_SIZE];
    cfg->num_layers = h[MODEL_SLOT_NUM_LAYERS];
    cfg->num_heads = h[MODEL_SLOT_NUM_HEADS];
    cfg->channels = h[MODEL_SLOT_CHANNELS];
    cfg->padded_vocab_size = h[MODEL_SLOT_PADDED_VOCAB];
    cfg->tp = cfg->pp = 1;  // a file holds the whole model
    cfg->stage = cfg->first_layer = 0;
    gpt2_config_check(cfg, path);
    size_t bytes_per = *version == MODEL_VERSION_FP32 ? sizeof(float) : sizeof(uint16_t);
    long expected = (long)sizeof(h) + (long)(gpt2_num_parameters(cfg) * bytes_per);
    if (size != expected) {
        fail("model file '%s' is %ld bytes, but its header (L=%d C=%d V=%d) implies %ld: truncated or corrupt\n  hint: %s",
             path, size, cfg->num_layers, cfg->channels, cfg->vocab_size, expected, MODEL_REGEN_HINT);
    }
    return f;
}

// the index of the first non-finite value of x (n), or n if all are finite
static size_t first_non_finite(const float* x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) { return i; }
    }
    return n;
}

// stops if a weight read from path is NaN or infinite, naming its tensor, layer and element; chunk
// holds the n weights from `offset` on (of the model's gpt2_num_parameters, in its order)
static void params_check_finite(const char* path, const GPT2Config* cfg, const float* chunk, size_t offset, size_t n) {
    size_t in_chunk = first_non_finite(chunk, n);
    if (in_chunk == n) { return; }
    size_t bad = offset + in_chunk;
    size_t sizes[NUM_PARAMETER_TENSORS], begin = 0;
    gpt2_parameter_sizes(sizes, cfg);
    int t = 0;
    while (bad >= begin + sizes[t]) { begin += sizes[t]; t++; }
    size_t per_layer = tensor_is_per_layer(t) ? sizes[t] / cfg->num_layers : sizes[t], i = bad - begin;
    char layer[32] = "";
    if (tensor_is_per_layer(t)) { snprintf(layer, sizeof(layer), " of layer %zu", i / per_layer); }
    fail("model file '%s': %s%s, element %zu of %zu, is %g: a model with non-finite weights cannot train\n"
         "  hint: it was written after its run diverged; start from an earlier checkpoint",
         path, PARAMETER_NAMES[t], layer, i % per_layer, per_layer, chunk[in_chunk]);
}

#define BF16_READ_CHUNK 65536  // bf16 values converted per read

// reads the next n parameters of f (fp32, or bf16 widened to fp32 exactly), the ones from `offset`
// on, and stops on a non-finite one; model_file_read_params reads them all and closes f
static void model_file_read_chunk(FILE* f, const char* path, const GPT2Config* cfg, int version, float* params, size_t offset,
                                  size_t n) {
    if (version == MODEL_VERSION_FP32) {
        fread_check(params, sizeof(float), n, f);
    } else {
        uint16_t buf[BF16_READ_CHUNK];
        for (size_t done = 0; done < n; ) {
            size_t k = n - done < BF16_READ_CHUNK ? n - done : BF16_READ_CHUNK;
            fread_check(buf, sizeof(uint16_t), k, f);
            for (size_t i = 0; i < k; i++) {
                uint32_t bits = (uint32_t)buf[i] << 16;  // bf16 is the top half of an fp32
                memcpy(&params[done + i], &bits, sizeof(float));
            }
            done += k;
        }
    }
    params_check_finite(path, cfg, params, offset, n);
}

static void model_file_read_params(FILE* f, const char* path, const GPT2Config* cfg, int version, float* params) {
    model_file_read_chunk(f, path, cfg, version, params, 0, gpt2_num_parameters(cfg));
    fclose(f);
}

// the checksum a model file's header records (this trainer's fp32 files): 1 and *sum, or 0 when it
// records none (llm.c's files, bf16 files)
static int model_file_recorded_checksum(const int h[FILE_HEADER_INTS], uint32_t* sum) {
    if (h[MODEL_SLOT_VERSION] != MODEL_VERSION_FP32 || h[MODEL_SLOT_CHECKSUM_KIND] != MODEL_CHECKSUM_CRC32) { return 0; }
    *sum = (uint32_t)h[MODEL_SLOT_CHECKSUM];
    return 1;
}

// the same, read from the file at path (0 when it cannot be read)
static int model_file_checksum(const char* path, uint32_t* sum) {
    int h[FILE_HEADER_INTS];
    FILE* f = fopen(path, "rb");
    if (f == NULL) { return 0; }
    size_t got = fread(h, sizeof(int), FILE_HEADER_INTS, f);
    fclose(f);
    return got == FILE_HEADER_INTS && model_file_recorded_checksum(h, sum);
}

#define DAMAGED_HINT "the file was changed after it was written (a disk or copy error, or an edit)"

// stops if the weights read from the model file at path (their bytes' CRC-32: crc) are not what its
// header recorded
static void model_file_check_sum(const char* path, uint32_t crc) {
    uint32_t recorded;
    if (model_file_checksum(path, &recorded) && recorded != crc) {
        fail("model file '%s' is damaged: its weights' CRC-32 is 0x%08x, but its header recorded 0x%08x when it was written\n"
             "  hint: %s; take it again from where it came from, or start from another checkpoint", path, crc, recorded, DAMAGED_HINT);
    }
}

// a model file written a chunk at a time: the header (with the weights' checksum), then the parameters
// in order (model_file_write writes them from one array)
static void model_file_write_header(AtomicFile* a, const char* path, const GPT2Config* cfg, uint32_t checksum) {
    int h[FILE_HEADER_INTS] = {0};
    h[MODEL_SLOT_MAGIC] = MODEL_MAGIC;
    h[MODEL_SLOT_VERSION] = MODEL_VERSION_FP32;
    h[MODEL_SLOT_MAX_SEQ_LEN] = cfg->max_seq_len;
    h[MODEL_SLOT_VOCAB_SIZE] = cfg->vocab_size;
    h[MODEL_SLOT_NUM_LAYERS] = cfg->num_layers;
    h[MODEL_SLOT_NUM_HEADS] = cfg->num_heads;
    h[MODEL_SLOT_CHANNELS] = cfg->channels;
    h[MODEL_SLOT_PADDED_VOCAB] = cfg->padded_vocab_size;
    h[MODEL_SLOT_CHECKSUM_KIND] = MODEL_CHECKSUM_CRC32;
    h[MODEL_SLOT_CHECKSUM] = (int)checksum;
    atomic_open(a, path);
    atomic_write(a, h, sizeof(int), FILE_HEADER_INTS);
}

static void model_file_write(const char* path, const GPT2Config* cfg, const float* params) {
    AtomicFile a;
    model_file_write_header(&a, path, cfg, crc32_update(0, params, gpt2_num_parameters(cfg) * sizeof(float)));
    atomic_write(&a, params, sizeof(float), gpt2_num_parameters(cfg));
    atomic_commit(&a);
}

// ----------------------------------------------------------------------------
// training-state file

typedef struct {
    int num_processes, rank;
    int step;                   // optimizer steps completed
    int data_shard, data_epoch;
    uint64_t data_position;
    uint64_t rng;               // sampling RNG
    uint64_t num_params;        // checked against the model
    size_t opt_floats;          // length of the optimizer state
    int opt_format;             // QStateFormat of its moments (--optimizer-state; 0 = fp32, all before version 5)
    int zero;                   // ZeroStage of the run that wrote it
    int tp;                     // --tp of the run that wrote it (1: none; every file before version 6)
    int pp;                     // --pp of the run that wrote it (1: none; every file before version 7)
    uint64_t run_id;            // the run that wrote it: random, chosen when the run started (0: version 2, unknown)
    uint64_t model_hash;        // params_hash of the weights of the same checkpoint's model file (0: unknown)
    int has_checksum;           // version 4: the file records its checksum
    uint32_t checksum;          // what it records
    uint32_t header_crc;        // state_file_open: the CRC-32 of the header read, to go on over the state
} TrainState;

// a state file's checksum starts with its header, the checksum's slot taken as 0
static uint32_t state_header_crc(const int h[FILE_HEADER_INTS]) {
    int copy[FILE_HEADER_INTS];
    memcpy(copy, h, sizeof(copy));
    copy[STATE_SLOT_CHECKSUM] = 0;
    return crc32_update(0, copy, sizeof(copy));
}

static void state_file_write(const char* path, const TrainState* s, const float* opt_state) {
    if (s->tp < 1 || s->pp < 1) { fail("state_file_write: --tp %d, --pp %d (a bug: 1 without them)", s->tp, s->pp); }
    int h[FILE_HEADER_INTS] = {0};
    h[STATE_SLOT_MAGIC] = STATE_MAGIC;
    h[STATE_SLOT_VERSION] = STATE_VERSION;
    h[STATE_SLOT_NUM_PROCESSES] = s->num_processes;
    h[STATE_SLOT_RANK] = s->rank;
    h[STATE_SLOT_STEP] = s->step;
    h[STATE_SLOT_DATA_SHARD] = s->data_shard;
    h[STATE_SLOT_DATA_EPOCH] = s->data_epoch;
    header_set64(h, STATE_SLOT_DATA_POSITION, s->data_position);
    header_set64(h, STATE_SLOT_RNG, s->rng);
    header_set64(h, STATE_SLOT_OPT_FLOATS, s->opt_floats);
    header_set64(h, STATE_SLOT_NUM_PARAMS, s->num_params);
    h[STATE_SLOT_ZERO] = s->zero;
    header_set64(h, STATE_SLOT_RUN_ID, s->run_id);
    header_set64(h, STATE_SLOT_MODEL_HASH, s->model_hash);
    h[STATE_SLOT_OPT_FORMAT] = s->opt_format;
    h[STATE_SLOT_TP] = s->tp;
    h[STATE_SLOT_PP] = s->pp;
    h[STATE_SLOT_CHECKSUM] = (int)crc32_update(state_header_crc(h), opt_state, s->opt_floats * sizeof(float));
    AtomicFile a;
    atomic_open(&a, path);
    atomic_write(&a, h, sizeof(int), FILE_HEADER_INTS);
    atomic_write(&a, opt_state, sizeof(float), s->opt_floats);
    atomic_commit(&a);
}

// reads the header of the state file at path into s; returns the open file, at the state
static FILE* state_file_open(const char* path, TrainState* s, long* size) {
    FILE* f = fopen_check(path, "rb");
    int h[FILE_HEADER_INTS];
    *size = file_header_read(f, path, "training-state file", STATE_MAGIC, STATE_REGEN_HINT, h);
    int version = h[STATE_SLOT_VERSION];
    if (version != STATE_VERSION_NO_IDENTITY && version != STATE_VERSION_NO_CHECKSUM && version != STATE_VERSION_FP32_STATE
        && version != STATE_VERSION_NO_TP && version != STATE_VERSION_NO_PP) {
        file_header_check_version(h, path, "training-state file", STATE_VERSION, STATE_REGEN_HINT);
    }
    s->num_processes = h[STATE_SLOT_NUM_PROCESSES];
    s->rank = h[STATE_SLOT_RANK];
    s->step = h[STATE_SLOT_STEP];
    s->data_shard = h[STATE_SLOT_DATA_SHARD];
    s->data_epoch = h[STATE_SLOT_DATA_EPOCH];
    s->data_position = header_get64(h, STATE_SLOT_DATA_POSITION);
    s->rng = header_get64(h, STATE_SLOT_RNG);
    s->opt_floats = header_get64(h, STATE_SLOT_OPT_FLOATS);
    s->num_params = header_get64(h, STATE_SLOT_NUM_PARAMS);
    s->zero = h[STATE_SLOT_ZERO];
    int identity = h[STATE_SLOT_VERSION] != STATE_VERSION_NO_IDENTITY;
    s->run_id = identity ? header_get64(h, STATE_SLOT_RUN_ID) : 0;
    s->model_hash = identity ? header_get64(h, STATE_SLOT_MODEL_HASH) : 0;
    s->has_checksum = version >= STATE_VERSION_FP32_STATE;
    s->opt_format = version >= STATE_VERSION_NO_TP ? h[STATE_SLOT_OPT_FORMAT] : QSTATE_FP32;
    s->tp = version >= STATE_VERSION_NO_PP ? h[STATE_SLOT_TP] : 1;
    s->pp = version >= STATE_VERSION ? h[STATE_SLOT_PP] : 1;
    if (s->tp < 1 || s->pp < 1) {
        fail("state file '%s': --tp %d, --pp %d in its header: corrupt\n  hint: %s", path, s->tp, s->pp, STATE_REGEN_HINT);
    }
    if (s->opt_format < 0 || s->opt_format >= NUM_QSTATE_FORMATS) {
        fail("state file '%s': optimizer-state format %d in its header is none of fp32, bf16, 8bit (0..%d): corrupt\n  hint: %s",
             path, s->opt_format, NUM_QSTATE_FORMATS - 1, STATE_REGEN_HINT);
    }
    s->checksum = (uint32_t)h[STATE_SLOT_CHECKSUM];
    s->header_crc = state_header_crc(h);
    return f;
}

static void state_file_read_header(const char* path, TrainState* s) {
    long size;
    fclose(state_file_open(path, s, &size));
}

// reads the header into s and the optimizer state into opt_state, which must hold
// expected_opt_floats floats (checked against the file)
static void state_file_read(const char* path, TrainState* s, float* opt_state, size_t expected_opt_floats) {
    long size;
    FILE* f = state_file_open(path, s, &size);
    if (s->opt_floats != expected_opt_floats) {
        fail("state file '%s' holds %zu optimizer floats, this run needs %zu\n"
             "  hint: resume with the same model, optimizer and number of processes", path, s->opt_floats, expected_opt_floats);
    }
    long expected = (long)(FILE_HEADER_INTS * sizeof(int)) + (long)(s->opt_floats * sizeof(float));
    if (size != expected) { fail("state file '%s' is %ld bytes, its header implies %ld: truncated or corrupt", path, size, expected); }
    fread_check(opt_state, sizeof(float), s->opt_floats, f);
    fclose(f);
    uint32_t crc = crc32_update(s->header_crc, opt_state, s->opt_floats * sizeof(float));
    if (s->has_checksum && crc != s->checksum) {
        fail("state file '%s' is damaged: its CRC-32 is 0x%08x, but its header recorded 0x%08x when it was written\n"
             "  hint: %s; resume from another checkpoint (move this one's DONE marker away)", path, crc, s->checksum, DAMAGED_HINT);
    }
}

// ----------------------------------------------------------------------------
// checkpoint names and the DONE marker

// from here until checkpoint_mark_done, a failed write removes this process's files of the step
static void checkpoint_begin(const char* dir, int step, int rank) {
    snprintf(g_ckpt_writing.dir, sizeof(g_ckpt_writing.dir), "%s", dir);
    g_ckpt_writing.step = step;
    g_ckpt_writing.rank = rank;
}

static void checkpoint_marker_write(const char* dir, const char* marker, int step) {
    char path[CHECKPOINT_PATH_LEN];
    checkpoint_marker_path(path, sizeof(path), dir, marker, step);
    AtomicFile a;
    atomic_open(&a, path);
    atomic_commit(&a);
}

static void checkpoint_mark_done(const char* dir, int step) { checkpoint_marker_write(dir, "DONE", step); }

// rank 0, before any file of checkpoint `step` is written: the record that this trainer writes them
static void checkpoint_mark_writing(const char* dir, int step) { checkpoint_marker_write(dir, "WRITING", step); }

// rank 0, after DONE_step: the checkpoint is complete, its DONE marker is the record now
static void checkpoint_unmark_writing(const char* dir, int step) {
    char path[CHECKPOINT_PATH_LEN];
    checkpoint_marker_path(path, sizeof(path), dir, "WRITING", step);
    if (remove(path) == 0) { fsync_dir_of(path); }
    else if (errno != ENOENT) { fail("cannot remove '%s' after checkpoint %d was complete: %s", path, step, strerror(errno)); }
}

// the checkpoint is complete (its DONE marker written) on every rank
static void checkpoint_end(void) { g_ckpt_writing.step = -1; }

// the step of a checkpoint file's name and which file it is, or -1 for any other name
typedef enum { CKPT_FILE_MODEL, CKPT_FILE_STATE, CKPT_FILE_DONE, CKPT_FILE_WRITING } CheckpointFileKind;
static int checkpoint_file_step(const char* name, CheckpointFileKind* kind) {
    char want[64];
    int step = -1, rank = -1;
    if (sscanf(name, "DONE_%8d", &step) == 1) { *kind = CKPT_FILE_DONE; snprintf(want, sizeof(want), "DONE_%08d", step); }
    else if (sscanf(name, "WRITING_%8d", &step) == 1) { *kind = CKPT_FILE_WRITING; snprintf(want, sizeof(want), "WRITING_%08d", step); }
    else if (sscanf(name, "model_%8d", &step) == 1) { *kind = CKPT_FILE_MODEL; snprintf(want, sizeof(want), "model_%08d.bin", step); }
    else if (sscanf(name, "state_%8d_%5d", &step, &rank) == 2 && rank >= 0) {
        *kind = CKPT_FILE_STATE;
        snprintf(want, sizeof(want), "state_%08d_%05d.bin", step, rank);
    } else { return -1; }
    return step >= 0 && strcmp(name, want) == 0 ? step : -1;  // the exact name, nothing before or after
}

static int compare_steps_descending(const void* a, const void* b) { return *(const int*)b - *(const int*)a; }

// the steps of dir's markers of one kind (DONE: its complete checkpoints; WRITING: those this
// trainer began), newest first: a malloc'ed list of *n (NULL when none)
static int* checkpoint_marker_steps(const char* dir, CheckpointFileKind marker, int* n) {
    int* steps = NULL;
    int cap = 0;
    *n = 0;
    DIR* d = opendir(dir);
    if (d == NULL) { return NULL; }
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        CheckpointFileKind kind;
        int step = checkpoint_file_step(e->d_name, &kind);
        if (step < 0 || kind != marker) { continue; }
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            steps = (int*)realloc(steps, (size_t)cap * sizeof(int));
            if (steps == NULL) { fail("out of host memory listing the checkpoints of '%s'", dir); }
        }
        steps[(*n)++] = step;
    }
    closedir(d);
    if (*n > 0) { qsort(steps, (size_t)*n, sizeof(int), compare_steps_descending); }
    return steps;
}

static int* checkpoint_done_steps(const char* dir, int* n) { return checkpoint_marker_steps(dir, CKPT_FILE_DONE, n); }

static int step_listed(const int* steps, int n, int step) {
    for (int i = 0; i < n; i++) {
        if (steps[i] == step) { return 1; }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the output directory: what an earlier run left there, a lock while a run uses it

// the files of dir a run may remove, each of a step this trainer recorded (DONE_step or
// WRITING_step): the files of a checkpoint without its DONE marker (a run killed or out of disk
// while writing it: never resumed from) and its WRITING marker, or what an earlier run left,
// its checkpoints' files and markers and log.jsonl (--overwrite 1). A file named like a
// checkpoint's without either record is the user's (DIR_FILES_FOREIGN): never removed
typedef enum { DIR_FILES_INCOMPLETE, DIR_FILES_EARLIER_RUN, DIR_FILES_FOREIGN } DirFileSet;
typedef struct { int *done, *writing; int ndone, nwriting; } DirScan;  // the markers' steps

static DirScan dir_scan(const char* dir) {
    DirScan scan;
    scan.done = checkpoint_marker_steps(dir, CKPT_FILE_DONE, &scan.ndone);
    scan.writing = checkpoint_marker_steps(dir, CKPT_FILE_WRITING, &scan.nwriting);
    return scan;
}
static void dir_scan_free(DirScan* scan) { free(scan->done); free(scan->writing); }

static int dir_file_in_set(const char* name, DirFileSet set, const DirScan* scan) {
    CheckpointFileKind kind;
    int step = checkpoint_file_step(name, &kind);
    if (step < 0) { return set == DIR_FILES_EARLIER_RUN && strcmp(name, "log.jsonl") == 0; }
    int done = step_listed(scan->done, scan->ndone, step), writing = step_listed(scan->writing, scan->nwriting, step);
    switch (set) {
        case DIR_FILES_INCOMPLETE: return !done && writing;
        case DIR_FILES_EARLIER_RUN: return done || writing;
        case DIR_FILES_FOREIGN: return !done && !writing;
    }
    return 0;
}

// the order in which output_dir_remove takes a set's files: the DONE markers first (no checkpoint
// looks complete while its files go), the WRITING markers last (the record stays until its files
// are gone)
static int dir_remove_pass(const char* name) {
    CheckpointFileKind kind;
    if (checkpoint_file_step(name, &kind) < 0) { return 1; }
    return kind == CKPT_FILE_DONE ? 0 : kind == CKPT_FILE_WRITING ? 2 : 1;
}
#define DIR_REMOVE_PASSES 3

// the first file of dir named like a checkpoint's that no record of this trainer's covers
// (DIR_FILES_FOREIGN) into path; 0 when there is none
static int output_dir_foreign_file(const char* dir, char* path, size_t n, int* step) {
    DirScan scan = dir_scan(dir);
    DIR* d = opendir(dir);
    struct dirent* e;
    int found = 0;
    while (d != NULL && !found && (e = readdir(d)) != NULL) {
        CheckpointFileKind kind;
        if (!dir_file_in_set(e->d_name, DIR_FILES_FOREIGN, &scan)) { continue; }
        *step = checkpoint_file_step(e->d_name, &kind);
        snprintf(path, n, "%s/%s", dir, e->d_name);
        found = 1;
    }
    if (d != NULL) { closedir(d); }
    dir_scan_free(&scan);
    return found;
}

// a file that the run reads (the flag that names it, what it is, its path), never to be removed
typedef struct { const char* flag; const char* what; const char* path; } InputFile;

// stops, before anything is removed, if a file of `set` in dir is one of the run's inputs (the
// same file: device and inode, so a link or another spelling of the path is caught), naming it
static void output_dir_spare_inputs(const char* dir, DirFileSet set, const InputFile* inputs, int n, const char* action) {
    DirScan scan = dir_scan(dir);
    DIR* d = opendir(dir);
    struct dirent* e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (!dir_file_in_set(e->d_name, set, &scan)) { continue; }
        char path[CHECKPOINT_PATH_LEN + sizeof(e->d_name)];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        struct stat in_dir, input;
        if (stat(path, &in_dir) != 0) { continue; }
        for (int i = 0; i < n; i++) {
            if (stat(inputs[i].path, &input) == 0 && input.st_dev == in_dir.st_dev && input.st_ino == in_dir.st_ino) {
                fail("%s would remove '%s', which this run reads (%s '%s', its %s); nothing was removed\n"
                     "  hint: copy it out of '%s' and point %s at the copy (cp '%s' %s.copy; %s %s.copy), or choose another -o",
                     action, path, inputs[i].flag, inputs[i].path, inputs[i].what, dir, inputs[i].flag, path, e->d_name,
                     inputs[i].flag, e->d_name);
            }
        }
    }
    if (d != NULL) { closedir(d); }
    dir_scan_free(&scan);
}

// removes the files of `set` from dir (in dir_remove_pass's order), saying each one when `say`;
// returns the number removed
static int output_dir_remove(const char* dir, DirFileSet set, int say) {
    DirScan scan = dir_scan(dir);
    int removed = 0;
    for (int pass = 0; pass < DIR_REMOVE_PASSES; pass++) {
        DIR* d = opendir(dir);
        if (d == NULL) { fail("cannot read output directory '%s': %s", dir, strerror(errno)); }
        struct dirent* e;
        while ((e = readdir(d)) != NULL) {
            if (!dir_file_in_set(e->d_name, set, &scan) || dir_remove_pass(e->d_name) != pass) { continue; }
            char path[CHECKPOINT_PATH_LEN + sizeof(e->d_name)];
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            if (remove(path) != 0) { fail("cannot remove '%s': %s", path, strerror(errno)); }
            if (say) { printf("removed '%s': a file of an incomplete checkpoint (no DONE marker), which no run resumes from\n", path); }
            removed++;
        }
        closedir(d);
        fsync_dir_of(dir);  // the markers' removal reaches the disk before the files'
    }
    dir_scan_free(&scan);
    return removed;
}

// what an earlier run left in dir: its complete checkpoints' files (with a DONE marker) and
// whether it has a log.jsonl
typedef struct { int files, newest_step, has_log; } OutputDirContents;
static OutputDirContents output_dir_contents(const char* dir) {
    OutputDirContents c = {0, -1, 0};
    DirScan scan = dir_scan(dir);
    DIR* d = opendir(dir);
    struct dirent* e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        CheckpointFileKind kind;
        int step = checkpoint_file_step(e->d_name, &kind);
        if (step >= 0 && step_listed(scan.done, scan.ndone, step)) { c.files++; if (step > c.newest_step) { c.newest_step = step; } }
        if (strcmp(e->d_name, "log.jsonl") == 0) { c.has_log = 1; }
    }
    if (d != NULL) { closedir(d); }
    dir_scan_free(&scan);
    return c;
}

#define CKPT_WHOLE (-2)       // checkpoint_damage: every file of the checkpoint there, whole, of one write
#define CKPT_MODEL_FILE (-1)  // checkpoint_damage: the model file (rank 0's) is missing or damaged
#define CKPT_MAX_RANKS (1 << 20)  // a state header naming more ranks is corrupt (checked before one file per rank is looked for)

// rank's state file of checkpoint `step` (path) against its name and against rank 0's header h0
// (NULL for rank 0 itself): there, whole (the size its header implies), of this rank and step, and
// of the same write as rank 0's (the same ranks, run and weights). Returns 1, or 0 and why into `why`
static int state_file_whole(const char* path, int rank, int step, const int* h0, int h[FILE_HEADER_INTS], char* why, size_t n) {
    struct stat st;
    FILE* f = fopen(path, "rb");
    if (f == NULL || fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, n, "rank %d's state file '%s': %s", rank, path, f == NULL ? strerror(errno) : "not a file");
        if (f != NULL) { fclose(f); }
        return 0;
    }
    long header = (long)(FILE_HEADER_INTS * sizeof(int));
    size_t got = fread(h, sizeof(int), FILE_HEADER_INTS, f);
    uint32_t crc = got == FILE_HEADER_INTS ? state_header_crc(h) : 0;
    int checksummed = got == FILE_HEADER_INTS && h[STATE_SLOT_VERSION] >= STATE_VERSION_FP32_STATE;  // (older versions record none)
    int whole = checksummed && h[STATE_SLOT_VERSION] <= STATE_VERSION &&
                file_crc32(f, &crc, (size_t)(st.st_size - header));
    fclose(f);
    long want = got == FILE_HEADER_INTS ? header + (long)(header_get64(h, STATE_SLOT_OPT_FLOATS) * sizeof(float)) : -1;
    int version = got == FILE_HEADER_INTS ? h[STATE_SLOT_VERSION] : 0;
    if (got != FILE_HEADER_INTS || h[STATE_SLOT_MAGIC] != STATE_MAGIC || st.st_size != want ||
        (version != STATE_VERSION && version != STATE_VERSION_NO_PP && version != STATE_VERSION_NO_TP && version != STATE_VERSION_FP32_STATE &&
         version != STATE_VERSION_NO_CHECKSUM && version != STATE_VERSION_NO_IDENTITY)) {
        snprintf(why, n, "rank %d's state file '%s' (%lld bytes) is not a whole state file: truncated or corrupt", rank, path, (long long)st.st_size);
        return 0;
    }
    // then the checksum, before what the header says (its rank, step, run) is believed
    if (checksummed && (!whole || crc != (uint32_t)h[STATE_SLOT_CHECKSUM])) {
        snprintf(why, n, "rank %d's state file '%s' is damaged: its CRC-32 is 0x%08x, but its header recorded 0x%08x when it "
                 "was written (%s)", rank, path, crc, (uint32_t)h[STATE_SLOT_CHECKSUM], DAMAGED_HINT);
        return 0;
    }
    if (h[STATE_SLOT_RANK] != rank || h[STATE_SLOT_STEP] != step) {
        snprintf(why, n, "rank %d's state file '%s' holds rank %d's state of step %d, but is read as rank %d's of step %d: "
                 "renamed or copied from another checkpoint", rank, path, h[STATE_SLOT_RANK], h[STATE_SLOT_STEP], rank, step);
        return 0;
    }
    int ranks = h[STATE_SLOT_NUM_PROCESSES];
    if (ranks < 1 || ranks > CKPT_MAX_RANKS || rank >= ranks) {
        snprintf(why, n, "rank %d's state file '%s' says it is one of %d rank(s): corrupt", rank, path, ranks);
        return 0;
    }
    if (h0 == NULL) { return 1; }
    if (ranks != h0[STATE_SLOT_NUM_PROCESSES]) {
        snprintf(why, n, "rank %d's state file '%s' was written by one of %d rank(s), rank 0's by one of %d: files of two runs", rank, path,
                 h[STATE_SLOT_NUM_PROCESSES], h0[STATE_SLOT_NUM_PROCESSES]);
        return 0;
    }
    if (version == STATE_VERSION_NO_IDENTITY || h0[STATE_SLOT_VERSION] == STATE_VERSION_NO_IDENTITY) { return 1; }  // no identity to compare
    uint64_t run = header_get64(h, STATE_SLOT_RUN_ID), run0 = header_get64(h0, STATE_SLOT_RUN_ID);
    if (run != run0) {
        snprintf(why, n, "rank %d's state file '%s' was written by run 0x%016llx, rank 0's state file of the same checkpoint by run 0x%016llx: "
                 "files of two runs", rank, path, (unsigned long long)run, (unsigned long long)run0);
        return 0;
    }
    uint64_t hash = header_get64(h, STATE_SLOT_MODEL_HASH), hash0 = header_get64(h0, STATE_SLOT_MODEL_HASH);
    if (hash != hash0) {
        snprintf(why, n, "rank %d's state file '%s' was written with weights of hash 0x%016llx, rank 0's with 0x%016llx: "
                 "files of two writes of step %d", rank, path, (unsigned long long)hash, (unsigned long long)hash0, step);
        return 0;
    }
    return 1;
}

// whether checkpoint `step` of dir has all its files, whole and of one write: the model file of
// cfg's size and every rank's state file (as many as rank 0's says; state_file_whole). Returns
// CKPT_WHOLE, or which file is not (CKPT_MODEL_FILE, or the rank whose state file it is) and why
// into `why`. The weights and optimizer state inside are checked as they are read
static int checkpoint_damage(const char* dir, int step, const GPT2Config* cfg, char* why, size_t n) {
    char path[CHECKPOINT_PATH_LEN];
    struct stat st;
    long header = (long)(FILE_HEADER_INTS * sizeof(int));
    checkpoint_path(path, sizeof(path), dir, "model", step, -1);
    long model_bytes = header + (long)(gpt2_num_parameters(cfg) * sizeof(float));
    FILE* f = fopen(path, "rb");
    int h[FILE_HEADER_INTS], h0[FILE_HEADER_INTS];
    if (f == NULL || fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, n, "'%s': %s", path, f == NULL ? strerror(errno) : "not a file");
        if (f != NULL) { fclose(f); }
        return CKPT_MODEL_FILE;
    }
    size_t got = fread(h, sizeof(int), FILE_HEADER_INTS, f);
    fclose(f);
    if (got == FILE_HEADER_INTS && h[MODEL_SLOT_MAGIC] == MODEL_MAGIC &&
        (h[MODEL_SLOT_NUM_LAYERS] != cfg->num_layers || h[MODEL_SLOT_CHANNELS] != cfg->channels ||
         h[MODEL_SLOT_NUM_HEADS] != cfg->num_heads || h[MODEL_SLOT_VOCAB_SIZE] != cfg->vocab_size)) {
        fail("checkpoint '%s' has another model shape than -e (L=%d C=%d NH=%d V=%d; -e: L=%d C=%d NH=%d V=%d)\n"
             "  hint: resume with the same -e", path, h[MODEL_SLOT_NUM_LAYERS], h[MODEL_SLOT_CHANNELS], h[MODEL_SLOT_NUM_HEADS],
             h[MODEL_SLOT_VOCAB_SIZE], cfg->num_layers, cfg->channels, cfg->num_heads, cfg->vocab_size);
    }
    if (st.st_size != model_bytes) {
        snprintf(why, n, "'%s' is %lld bytes, a model file of this shape %ld: truncated or corrupt", path, (long long)st.st_size, model_bytes);
        return CKPT_MODEL_FILE;
    }
    uint32_t recorded, crc = 0;
    if (model_file_recorded_checksum(h, &recorded)) {
        f = fopen(path, "rb");
        int read = f != NULL && fseek(f, header, SEEK_SET) == 0 && file_crc32(f, &crc, (size_t)(model_bytes - header));
        if (f != NULL) { fclose(f); }
        if (!read || crc != recorded) {
            snprintf(why, n, "'%s' is damaged: its weights' CRC-32 is 0x%08x, but its header recorded 0x%08x when it was written (%s)",
                     path, crc, recorded, DAMAGED_HINT);
            return CKPT_MODEL_FILE;
        }
    }
    // rank 0's state file exists for any number of ranks: it says how many wrote the checkpoint
    checkpoint_path(path, sizeof(path), dir, "state", step, 0);
    if (!state_file_whole(path, 0, step, NULL, h0, why, n)) { return 0; }  // (0: rank 0's)
    for (int rank = 1; rank < h0[STATE_SLOT_NUM_PROCESSES]; rank++) {
        checkpoint_path(path, sizeof(path), dir, "state", step, rank);
        if (!state_file_whole(path, rank, step, h0, h, why, n)) { return rank; }
    }
    return CKPT_WHOLE;
}

// removes the temporary files of atomic writes (a checkpoint file's or log.jsonl's name and
// ".tmp") that a crashed run left in dir, saying so; other files are not touched. Call it
// with dir locked: a running writer's files are never removed
static void output_dir_remove_stale_tmp(const char* dir) {
    DIR* d = opendir(dir);
    if (d == NULL) { return; }
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n <= 4 || strcmp(e->d_name + n - 4, ".tmp") != 0) { continue; }
        char base[sizeof(e->d_name)], path[CHECKPOINT_PATH_LEN + sizeof(e->d_name)];
        snprintf(base, sizeof(base), "%.*s", (int)(n - 4), e->d_name);
        CheckpointFileKind kind;
        if (checkpoint_file_step(base, &kind) < 0 && strcmp(base, "log.jsonl") != 0) { continue; }
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) { continue; }
        if (remove(path) != 0) { fail("cannot remove the stale temporary file '%s': %s", path, strerror(errno)); }
        printf("removed '%s', a temporary file that a crashed run left\n", path);
    }
    closedir(d);
}

// locks dir for this process (flock on the directory itself, released when the process
// ends); stops if another run holds it. Returns the descriptor, to keep open. A file system
// without locks (some network ones) gets a note, and the run goes on unlocked
static int output_dir_lock(const char* dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) { fail("cannot open output directory '%s': %s", dir, strerror(errno)); }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) {
            fail("output directory '%s' is in use by another run (it holds the directory's lock)\n"
                 "  hint: wait until that run ends, or choose another -o", dir);
        }
        printf("note: cannot lock output directory '%s' (%s): nothing keeps a second run out of it\n", dir, strerror(errno));
    }
    return fd;
}

// removes DONE_step, if there, before the files of that step are written again: a checkpoint
// being rewritten is incomplete until its new marker
static void checkpoint_unmark_done(const char* dir, int step) {
    char path[CHECKPOINT_PATH_LEN];
    checkpoint_marker_path(path, sizeof(path), dir, "DONE", step);
    if (remove(path) == 0) { fsync_dir_of(path); }
    else if (errno != ENOENT) { fail("cannot remove '%s' before rewriting checkpoint %d: %s", path, step, strerror(errno)); }
}

// removes the state files of checkpoint `step` in dir of ranks `ranks` and up (its DONE marker gone
// first: checkpoint_unmark_done), before `ranks` ranks write that step again: what an earlier write of
// it by more ranks left (a checkpoint that -y 1 skipped as damaged and then resumed on fewer ranks, llmc/
// relayout.h, rewrites), which no reader of the new write would read (checkpoint_damage reads as many as
// its rank 0 says) and no one should take for part of it
static void checkpoint_remove_states_from(const char* dir, int step, int ranks) {
    DIR* d = opendir(dir);
    if (d == NULL) { fail("cannot read output directory '%s': %s", dir, strerror(errno)); }
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        CheckpointFileKind kind;
        int rank = -1, file_step = checkpoint_file_step(e->d_name, &kind);
        if (file_step != step || kind != CKPT_FILE_STATE || sscanf(e->d_name, "state_%*8d_%5d", &rank) != 1 || rank < ranks) { continue; }
        char path[CHECKPOINT_PATH_LEN];
        checkpoint_path(path, sizeof(path), dir, "state", step, rank);  // (the name read: checkpoint_file_step takes the exact one only)
        if (remove(path) != 0) { fail("cannot remove '%s' before rewriting checkpoint %d with %d rank(s): %s", path, step, ranks, strerror(errno)); }
        fsync_dir_of(path);
    }
    closedir(d);
}

// the step of the checkpoint file in dir that is one of the run's inputs (the same file: device and
// inode, as output_dir_spare_inputs matches), or -1: --keep-checkpoints never removes the model
// that -e started from, wherever in dir it sits
static int checkpoint_input_step(const char* dir, const InputFile* inputs, int n) {
    DIR* d = opendir(dir);
    struct dirent* e;
    int found = -1;
    while (d != NULL && found < 0 && (e = readdir(d)) != NULL) {
        CheckpointFileKind kind;
        int step = checkpoint_file_step(e->d_name, &kind);
        if (step < 0) { continue; }
        char path[CHECKPOINT_PATH_LEN + sizeof(e->d_name)];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        struct stat in_dir, input;
        if (stat(path, &in_dir) != 0) { continue; }
        for (int i = 0; i < n && found < 0; i++) {
            if (stat(inputs[i].path, &input) == 0 && input.st_dev == in_dir.st_dev && input.st_ino == in_dir.st_ino) { found = step; }
        }
    }
    if (d != NULL) { closedir(d); }
    return found;
}

// keeps the newest `keep` complete checkpoints of dir up to step `written` (the one this run just
// wrote) and removes every checkpoint file of an older step (the DONE markers first, so no
// checkpoint looks complete while its files go), except the step `spare` (a run input's, or -1;
// *spared says whether it was one to remove); returns the number of complete checkpoints removed.
// Newer ones than `written` are those that -y 1 skipped as damaged: neither counted nor removed,
// so they never push out the checkpoints this run resumed from and wrote
static int checkpoint_prune(const char* dir, int keep, int written, int spare, int* spared) {
    int n_all, n = 0;
    int* all = checkpoint_done_steps(dir, &n_all);
    while (n < n_all && all[n] > written) { n++; }  // newest first: skip the newer ones
    int* steps = all + n;
    n = n_all - n;
    int removed = n > keep ? n - keep : 0, oldest_kept = removed > 0 ? steps[keep - 1] : -1;
    *spared = removed > 0 && spare >= 0 && spare < oldest_kept && step_listed(steps, n, spare);
    removed -= *spared;
    free(all);
    DIR* d;
    struct dirent* e;
    for (int pass = 0; pass < 2 && oldest_kept >= 0; pass++) {  // 0: DONE markers, 1: model and state files
        d = opendir(dir);
        if (d == NULL) { fail("cannot read output directory '%s': %s", dir, strerror(errno)); }
        while ((e = readdir(d)) != NULL) {
            CheckpointFileKind kind;
            int step = checkpoint_file_step(e->d_name, &kind);
            if (step < 0 || step >= oldest_kept || step == spare || (pass == 0) != (kind == CKPT_FILE_DONE)) { continue; }
            char path[CHECKPOINT_PATH_LEN + sizeof(e->d_name)];
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            if (remove(path) != 0) { fail("cannot remove old checkpoint file '%s': %s", path, strerror(errno)); }
        }
        closedir(d);
        fsync_dir_of(dir);
    }
    return removed;
}

// bytes of one checkpoint: the model file and `ranks` state files of opt_floats floats each
static uint64_t checkpoint_bytes(const GPT2Config* cfg, size_t opt_floats, int ranks) {
    uint64_t header = FILE_HEADER_INTS * sizeof(int);
    return header + (uint64_t)gpt2_num_parameters(cfg) * sizeof(float) + (uint64_t)ranks * (header + (uint64_t)opt_floats * sizeof(float));
}

// stops unless the file system of dir has `need` bytes free for an unprivileged writer
static void check_free_space(const char* dir, uint64_t need, const char* what) {
    struct statvfs st;
    if (statvfs(dir, &st) != 0) { return; }  // unknown: the writes themselves will tell
    uint64_t avail = (uint64_t)st.f_bavail * st.f_frsize;
    if (avail < need) {
        fail("output directory '%s' has %.1f MiB free, but %s needs %.1f MiB\n"
             "  hint: free some space, choose another -o, or -o \"\" to write no checkpoints",
             dir, avail / 1048576.0, what, need / 1048576.0);
    }
}

// creates dir if needed and proves it is writable, before any training is spent
static void ensure_output_dir(const char* dir) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (mkdir(dir, 0755) != 0) { fail("cannot create output directory '%s': %s\n  hint: choose another -o", dir, strerror(errno)); }
    } else if (!S_ISDIR(st.st_mode)) {
        fail("output path '%s' exists and is not a directory\n  hint: choose another -o", dir);
    }
    char probe[CHECKPOINT_PATH_LEN];
    snprintf(probe, sizeof(probe), "%s/.write_test", dir);
    FILE* f = fopen(probe, "wb");
    if (f == NULL) { fail("output directory '%s' is not writable: %s\n  hint: choose another -o, or -o \"\" to write nothing", dir, strerror(errno)); }
    fclose(f);
    remove(probe);
}

#endif // LLMC_CHECKPOINT_H
