/*
dataloader.h: reads batches of tokens from llm.c's token shards, in order.
Shard format (written by dev/data/tinyshakespeare.py):
  header 256 x int32: [0] magic 20240520, [1] version 1, [2] number of tokens N
  then N uint16 tokens.

    DataLoader dl;
    dataloader_init(&dl, "data/x_train.bin", B, T, rank, num_processes, V);
    dataloader_next_batch(&dl);   // dl.inputs (B,T), dl.targets (B,T) = inputs shifted by one

Walk order: shards in sorted name order; within a shard, process `rank` reads the
(B*T+1)-token windows starting at rank*B*T, then every num_processes*B*T tokens, so
over all processes each token position is an input exactly once per epoch (the tail
of a shard that does not fill a whole round across processes is skipped). After the
last shard the loader starts epoch + 1 at the first shard. A run resumed on another count of
processes (llmc/relayout.h) goes on from the old round's start, which need not be a multiple of
its own rounds: a round is read while all of its windows fit in the shard.

Failure: a missing, foreign, truncated or too-small shard, or a token >= V anywhere in
a shard, stops at init (each shard is read once there). Each message names the file and
the fix; a bad token, its position and byte offset.

The manifest (manifest.h): prepare_tokens writes one last, beside its shards. dataloader_init
then checks the set against it, while it reads each shard anyway: every shard that matches is
listed by a manifest in its folder with its token count and checksum, and every shard listed in
the splits it reads matches the pattern. So a set of an interrupted run (no manifest), a shard
left by an earlier run, a changed or a missing shard stops the run before training.
dataloader_init_rule(..., SHARDS_WITHOUT_MANIFEST) reads shards without one (llm.c's scripts
make none: the trainer's --no-manifest). Measured (2026-11-26, this project's 2-core EPYC, busy):
the checksum runs at about 1.4 GB/s on a core, 0.15 s for a shard of 100M tokens (200 MB), beside
0.08 s for the token check and the read itself: cheap enough to take on every start.
*/
#ifndef LLMC_DATALOADER_H
#define LLMC_DATALOADER_H

#include <dirent.h>
#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include "file_header.h"
#include "manifest.h"
#include "memory.h"
#include "utils.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
enum { SHARD_SLOT_NUM_TOKENS = 2 };  // after the magic and the version (file_header.h)
#define SHARD_REGEN_HINT "shards are made by: python3 dev/data/tinyshakespeare.py"
#define SHARD_PATH_LEN 4096  // a shard's or a manifest's path
#define SHARD_NO_MANIFEST_HINT "shards made by llm.c's own scripts have no manifest: --no-manifest reads them without one"

// whether a set of shards must have a manifest (the trainer's --no-manifest: it need not)
typedef enum { SHARDS_NEED_MANIFEST, SHARDS_WITHOUT_MANIFEST } ShardManifestRule;

typedef struct {
    int B, T, rank, num_processes, vocab_size;
    glob_t glob;              // the shard paths, sorted
    size_t num_shards;
    size_t epoch_tokens;      // over all shards: tokens that start a window (each shard's count - 1)
    // position: which shard, which token, which pass over the data
    size_t shard;
    size_t position;          // token index in the shard where this rank's next window starts
    int epoch;
    FILE* file;               // the open shard
    size_t shard_tokens;      // tokens in the open shard
    uint16_t* buffer;         // (B*T+1) tokens as read
    int* inputs;              // (B,T)
    int* targets;             // (B,T)
} DataLoader;

// reads and checks a shard's header; returns its token count. last_of: the number of shards in
// the set when this is the last of them (a split's tail, often short), else 0
static size_t shard_check(const char* path, FILE* f, size_t min_tokens, size_t last_of) {
    int header[FILE_HEADER_INTS];
    long size = file_header_read(f, path, "token shard", SHARD_MAGIC, SHARD_REGEN_HINT, header);
    file_header_check_version(header, path, "token shard", SHARD_VERSION, SHARD_REGEN_HINT);
    int tokens = header[SHARD_SLOT_NUM_TOKENS];
    long expected = (long)sizeof(header) + (long)tokens * (long)sizeof(uint16_t);
    if (tokens < 0 || size != expected) {
        fail("token shard '%s' is %ld bytes but its header says %d tokens (%ld bytes): truncated or corrupt\n  hint: %s",
             path, size, tokens, expected, SHARD_REGEN_HINT);
    }
    if ((size_t)tokens < min_tokens && last_of > 1) {
        fail("token shard '%s' has %d tokens, fewer than one step needs (%zu = B*T*processes + 1): it is the last of the %zu "
             "shards that match, the tail of its split\n  hint: use a smaller batch (-b) or sequence length (-t), or leave it "
             "out of the pattern, or make the shards again with a --shard-tokens that leaves a longer tail", path, tokens,
             min_tokens, last_of);
    }
    if ((size_t)tokens < min_tokens) {
        fail("token shard '%s' has %d tokens, fewer than one step needs (%zu = B*T*processes + 1): the split is too short\n"
             "  hint: use a smaller batch (-b) or sequence length (-t), or make a longer split (prepare_tokens --val-tokens N, "
             "or a larger --val-fraction, for a validation split)", path, tokens, min_tokens);
    }
    return (size_t)tokens;
}

#define SHARD_SCAN_CHUNK 65536  // tokens read at a time by shard_check_tokens

// reads the open shard once, its header and its tokens, and stops at the first id >=
// vocab_size, naming the file, the token's position and its byte offset; returns the CRC-32
// of its bytes (manifest.h)
static uint32_t shard_check_tokens(const char* path, FILE* f, size_t tokens, int vocab_size) {
    static uint16_t buf[SHARD_SCAN_CHUNK];  // (not on the stack: 128 KiB)
    int header[FILE_HEADER_INTS];
    fseek_check(f, 0, SEEK_SET);
    fread_check(header, sizeof(int), FILE_HEADER_INTS, f);
    uint32_t crc = crc32_update(0, header, sizeof(header));
    for (size_t done = 0; done < tokens; ) {
        size_t k = tokens - done < SHARD_SCAN_CHUNK ? tokens - done : SHARD_SCAN_CHUNK;
        fread_check(buf, sizeof(uint16_t), k, f);
        crc = crc32_update(crc, buf, k * sizeof(uint16_t));
        for (size_t i = 0; i < k; i++) {
            if (buf[i] >= vocab_size) {
                size_t at = done + i;
                fail("token shard '%s': token %d at position %zu (byte offset %zu) is >= the model's vocabulary size %d\n"
                     "  hint: the shard was made with another tokenizer; %s",
                     path, buf[i], at, FILE_HEADER_INTS * sizeof(int) + at * sizeof(uint16_t), vocab_size, SHARD_REGEN_HINT);
            }
        }
        done += k;
    }
    return crc;
}

static size_t dataloader_step_tokens(const DataLoader* dl) {
    return (size_t)dl->B * dl->T * dl->num_processes;
}

static void dataloader_open_shard(DataLoader* dl, size_t shard) {
    if (dl->file) { fclose(dl->file); }
    const char* path = dl->glob.gl_pathv[shard];
    dl->file = fopen_check(path, "rb");
    dl->shard_tokens = shard_check(path, dl->file, dataloader_step_tokens(dl) + 1, shard + 1 == dl->num_shards ? dl->num_shards : 0);
    dl->shard = shard;
}

// ----------------------------------------------------------------------------
// the set against its manifests: those in the folder of each shard

typedef struct {
    char path[SHARD_PATH_LEN];
    Manifest m;
    unsigned char* matched;   // (m.num_shards) the pattern matched this shard
    int splits_read[2];       // the set reads shards of its val, train split
} ShardManifest;

static int manifest_split_index(const char* split) { return strcmp(split, "val") == 0 ? 0 : 1; }

// the manifests in dir (files named *_manifest.txt), read; returns how many
static int manifests_in(const char* dir, ShardManifest** out) {
    DIR* d = opendir(dir);
    if (d == NULL) { fail("cannot read the folder '%s' of token shards: %s", dir, strerror(errno)); }
    int n = 0, cap = 0;
    *out = NULL;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name), suffix = strlen(MANIFEST_SUFFIX);
        if (len < suffix || strcmp(e->d_name + len - suffix, MANIFEST_SUFFIX) != 0) { continue; }
        if (n == cap) {
            cap = cap ? 2 * cap : 4;
            *out = (ShardManifest*)realloc(*out, (size_t)cap * sizeof(ShardManifest));
            if (*out == NULL) { fail("out of host memory reading the manifests in '%s'", dir); }
        }
        ShardManifest* sm = &(*out)[n++];
        memset(sm, 0, sizeof(*sm));
        if (snprintf(sm->path, sizeof(sm->path), "%s/%s", dir, e->d_name) >= (int)sizeof(sm->path)) { fail("path too long: '%s/%s'", dir, e->d_name); }
        manifest_read(sm->path, &sm->m);
        sm->matched = (unsigned char*)calloc((size_t)sm->m.num_shards + 1, 1);
        if (sm->matched == NULL) { fail("out of host memory reading '%s'", sm->path); }
    }
    closedir(d);
    return n;
}

// shard `path` (tokens, crc: its CRC-32) against the manifests of its folder: listed by one, as it is
static void manifest_check_shard(ShardManifest* ms, int n, const char* path, size_t tokens, uint32_t crc, int vocab_size) {
    const char* slash = strrchr(path, '/');
    const char* base = slash ? slash + 1 : path;
    if (n == 0) {
        fail("no manifest beside the token shard '%s' (PREFIX%s, which prepare_tokens writes after the last shard): the set "
             "may be an interrupted run's, or made elsewhere\n  hint: %s; %s", path, MANIFEST_SUFFIX, MANIFEST_REGEN_HINT, SHARD_NO_MANIFEST_HINT);
    }
    for (int k = 0; k < n; k++) {
        const ManifestShard* e = manifest_find(&ms[k].m, base);
        if (e == NULL) { continue; }
        if ((size_t)e->tokens != tokens || e->crc != crc) {
            fail("token shard '%s' is not the one '%s' lists (%lld tokens, CRC-32 0x%08x; the file: %zu tokens, 0x%08x): "
                 "changed or replaced since it was made\n  hint: %s", path, ms[k].path, e->tokens, e->crc, tokens, crc, MANIFEST_REGEN_HINT);
        }
        if (ms[k].m.vocab_size > vocab_size) {
            fail("'%s' says its shards were made with a vocabulary of %d tokens (%s), the model has %d\n  hint: train on shards "
                 "made with the model's tokenizer", ms[k].path, ms[k].m.vocab_size, ms[k].m.tokenizer, vocab_size);
        }
        ms[k].matched[e - ms[k].m.shards] = 1;
        ms[k].splits_read[manifest_split_index(e->split)] = 1;
        return;
    }
    fail("token shard '%s' is listed in no manifest beside it (%s, ...): a shard of another or an earlier run, or of an "
         "interrupted one\n  hint: leave it out of the pattern, or remove it; or %s", path, ms[0].path, MANIFEST_REGEN_HINT);
}

// every shard the manifests list in a split the set reads is one the pattern matched
static void manifest_check_whole(const ShardManifest* ms, int n, const char* pattern) {
    for (int k = 0; k < n; k++) {
        for (int i = 0; i < ms[k].m.num_shards; i++) {
            const ManifestShard* e = &ms[k].m.shards[i];
            if (ms[k].matched[i] || !ms[k].splits_read[manifest_split_index(e->split)]) { continue; }
            fail("'%s' lists the %s shard '%s', which the pattern '%s' does not match: missing, or left out, so the split "
                 "would not be read whole\n  hint: make the pattern match all of the split's shards (or restore the shard: %s)",
                 ms[k].path, e->split, e->name, pattern, MANIFEST_REGEN_HINT);
        }
    }
}

static void manifests_free(ShardManifest* ms, int n) {
    for (int k = 0; k < n; k++) { manifest_free(&ms[k].m); free(ms[k].matched); }
    free(ms);
}

// the folder of a shard's path ("." for a bare name)
static void shard_dir(const char* path, char* dir, size_t n) {
    const char* slash = strrchr(path, '/');
    if (slash == NULL) { snprintf(dir, n, "."); }
    else { snprintf(dir, n, "%.*s", slash == path ? 1 : (int)(slash - path), path); }
}

// the matched shards (paths sorted, so a folder's are together) against their manifests
static void dataloader_check_manifests(const DataLoader* dl, const char* pattern, const size_t* tokens, const uint32_t* sums) {
    for (size_t s = 0; s < dl->num_shards;) {
        char dir[SHARD_PATH_LEN], next[SHARD_PATH_LEN];
        shard_dir(dl->glob.gl_pathv[s], dir, sizeof(dir));
        size_t end = s + 1;
        for (; end < dl->num_shards; end++) {
            shard_dir(dl->glob.gl_pathv[end], next, sizeof(next));
            if (strcmp(next, dir) != 0) { break; }
        }
        ShardManifest* ms;
        int n = manifests_in(dir, &ms);
        for (size_t k = s; k < end; k++) { manifest_check_shard(ms, n, dl->glob.gl_pathv[k], tokens[k], sums[k], dl->vocab_size); }
        manifest_check_whole(ms, n, pattern);
        manifests_free(ms, n);
        s = end;
    }
}

// dataloader_init, and whether the set must have a manifest
static void dataloader_init_rule(DataLoader* dl, const char* pattern, int B, int T, int rank,
                                 int num_processes, int vocab_size, ShardManifestRule rule) {
    memset(dl, 0, sizeof(*dl));
    dl->B = B; dl->T = T; dl->rank = rank; dl->num_processes = num_processes; dl->vocab_size = vocab_size;
    int rc = glob(pattern, 0, NULL, &dl->glob);
    if (rc != 0 || dl->glob.gl_pathc == 0) {
        fail("no token shards match '%s'\n  hint: %s (or point -i/-j at your shards)", pattern, SHARD_REGEN_HINT);
    }
    dl->num_shards = dl->glob.gl_pathc;
    // check every shard now, its header and every token, so a bad file stops the run before
    // training, not hours in (one pass over the data), then the set against its manifests
    size_t* tokens = (size_t*)malloc_check(dl->num_shards * sizeof(size_t));
    uint32_t* sums = (uint32_t*)malloc_check(dl->num_shards * sizeof(uint32_t));
    for (size_t s = 0; s < dl->num_shards; s++) {
        dataloader_open_shard(dl, s);
        sums[s] = shard_check_tokens(dl->glob.gl_pathv[s], dl->file, dl->shard_tokens, vocab_size);
        tokens[s] = dl->shard_tokens;
        dl->epoch_tokens += dl->shard_tokens - 1;
    }
    if (rule == SHARDS_NEED_MANIFEST) { dataloader_check_manifests(dl, pattern, tokens, sums); }
    free(tokens);
    free(sums);
    dataloader_open_shard(dl, 0);
    dl->position = (size_t)rank * B * T;
    dl->buffer = (uint16_t*)mem_alloc(MEM_SCRATCH, ((size_t)B * T + 1) * sizeof(uint16_t));
    dl->inputs = (int*)mem_alloc(MEM_SCRATCH, (size_t)B * T * sizeof(int));
    dl->targets = (int*)mem_alloc(MEM_SCRATCH, (size_t)B * T * sizeof(int));
}

// the shards of pattern, with their manifest (the trainer's default)
static void dataloader_init(DataLoader* dl, const char* pattern, int B, int T, int rank, int num_processes, int vocab_size) {
    dataloader_init_rule(dl, pattern, B, T, rank, num_processes, vocab_size, SHARDS_NEED_MANIFEST);
}

// moves to (shard, position, epoch), e.g. when resuming from a checkpoint
static void dataloader_seek(DataLoader* dl, size_t shard, size_t position, int epoch) {
    if (shard >= dl->num_shards) { fail("data position names shard %zu but only %zu shards match\n  hint: resume with the same -i/-j", shard, dl->num_shards); }
    dataloader_open_shard(dl, shard);
    dl->position = position;
    dl->epoch = epoch;
}

static void dataloader_reset(DataLoader* dl) {
    dataloader_seek(dl, 0, (size_t)dl->rank * dl->B * dl->T, 0);
}

// fills inputs and targets with the next window, moving to the next shard (or epoch) first
// if this rank's window would run past the last whole step of the shard
static void dataloader_next_batch(DataLoader* dl) {
    size_t BT = (size_t)dl->B * dl->T, step = dataloader_step_tokens(dl);
    size_t step_start = dl->position - (size_t)dl->rank * BT;  // where this round of every rank's windows starts
    if (step_start + step > dl->shard_tokens - 1) {  // its last window's last target would be past the shard's end
        size_t next = dl->shard + 1;
        if (next == dl->num_shards) { next = 0; dl->epoch++; }
        dataloader_open_shard(dl, next);
        dl->position = (size_t)dl->rank * BT;
    }
    fseek_check(dl->file, (long)(FILE_HEADER_INTS * sizeof(int) + dl->position * sizeof(uint16_t)), SEEK_SET);
    fread_check(dl->buffer, sizeof(uint16_t), BT + 1, dl->file);
    for (size_t i = 0; i < BT + 1; i++) {
        if (dl->buffer[i] >= dl->vocab_size) {
            fail("token shard '%s': token %d at position %zu is >= the model's vocabulary size %d\n"
                 "  hint: the shard was made with another tokenizer; %s",
                 dl->glob.gl_pathv[dl->shard], dl->buffer[i], dl->position + i, dl->vocab_size, SHARD_REGEN_HINT);
        }
    }
    for (size_t i = 0; i < BT; i++) {
        dl->inputs[i] = dl->buffer[i];
        dl->targets[i] = dl->buffer[i + 1];
    }
    dl->position += step;
}

static void dataloader_free(DataLoader* dl) {
    if (dl->file) { fclose(dl->file); }
    globfree(&dl->glob);
    mem_free(dl->buffer);
    mem_free(dl->inputs);
    mem_free(dl->targets);
}

#endif // LLMC_DATALOADER_H
