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
of a shard that does not fill a whole step across processes is skipped). After the
last shard the loader starts epoch + 1 at the first shard.

Failure: a missing, foreign, truncated or too-small shard, or a token >= V anywhere in
a shard, stops at init (each shard is read once there). Each message names the file and
the fix; a bad token, its position and byte offset.
*/
#ifndef LLMC_DATALOADER_H
#define LLMC_DATALOADER_H

#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include "file_header.h"
#include "memory.h"
#include "utils.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
enum { SHARD_SLOT_NUM_TOKENS = 2 };  // after the magic and the version (file_header.h)
#define SHARD_REGEN_HINT "shards are made by: python3 dev/data/tinyshakespeare.py"

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

// reads and checks a shard's header; returns its token count
static size_t shard_check(const char* path, FILE* f, size_t min_tokens) {
    int header[FILE_HEADER_INTS];
    long size = file_header_read(f, path, "token shard", SHARD_MAGIC, SHARD_REGEN_HINT, header);
    file_header_check_version(header, path, "token shard", SHARD_VERSION, SHARD_REGEN_HINT);
    int tokens = header[SHARD_SLOT_NUM_TOKENS];
    long expected = (long)sizeof(header) + (long)tokens * (long)sizeof(uint16_t);
    if (tokens < 0 || size != expected) {
        fail("token shard '%s' is %ld bytes but its header says %d tokens (%ld bytes): truncated or corrupt\n  hint: %s",
             path, size, tokens, expected, SHARD_REGEN_HINT);
    }
    if ((size_t)tokens < min_tokens) {
        fail("token shard '%s' has %d tokens, fewer than one step needs (%zu = B*T*processes + 1)\n"
             "  hint: use a smaller batch (-b) or sequence length (-t)", path, tokens, min_tokens);
    }
    return (size_t)tokens;
}

#define SHARD_SCAN_CHUNK 65536  // tokens read at a time by shard_check_tokens

// reads the open shard's tokens once (f at the first token) and stops at the first id
// >= vocab_size, naming the file, the token's position and its byte offset
static void shard_check_tokens(const char* path, FILE* f, size_t tokens, int vocab_size) {
    uint16_t buf[SHARD_SCAN_CHUNK];
    for (size_t done = 0; done < tokens; ) {
        size_t k = tokens - done < SHARD_SCAN_CHUNK ? tokens - done : SHARD_SCAN_CHUNK;
        fread_check(buf, sizeof(uint16_t), k, f);
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
}

static size_t dataloader_step_tokens(const DataLoader* dl) {
    return (size_t)dl->B * dl->T * dl->num_processes;
}

static void dataloader_open_shard(DataLoader* dl, size_t shard) {
    if (dl->file) { fclose(dl->file); }
    const char* path = dl->glob.gl_pathv[shard];
    dl->file = fopen_check(path, "rb");
    dl->shard_tokens = shard_check(path, dl->file, dataloader_step_tokens(dl) + 1);
    dl->shard = shard;
}

static void dataloader_init(DataLoader* dl, const char* pattern, int B, int T, int rank,
                            int num_processes, int vocab_size) {
    memset(dl, 0, sizeof(*dl));
    dl->B = B; dl->T = T; dl->rank = rank; dl->num_processes = num_processes; dl->vocab_size = vocab_size;
    int rc = glob(pattern, 0, NULL, &dl->glob);
    if (rc != 0 || dl->glob.gl_pathc == 0) {
        fail("no token shards match '%s'\n  hint: %s (or point -i/-j at your shards)", pattern, SHARD_REGEN_HINT);
    }
    dl->num_shards = dl->glob.gl_pathc;
    // check every shard now, its header and every token, so a bad file stops the run before
    // training, not hours in (one pass over the data)
    for (size_t s = 0; s < dl->num_shards; s++) {
        dataloader_open_shard(dl, s);
        shard_check_tokens(dl->glob.gl_pathv[s], dl->file, dl->shard_tokens, vocab_size);
        dl->epoch_tokens += dl->shard_tokens - 1;
    }
    dataloader_open_shard(dl, 0);
    dl->position = (size_t)rank * B * T;
    dl->buffer = (uint16_t*)mem_alloc(MEM_SCRATCH, ((size_t)B * T + 1) * sizeof(uint16_t));
    dl->inputs = (int*)mem_alloc(MEM_SCRATCH, (size_t)B * T * sizeof(int));
    dl->targets = (int*)mem_alloc(MEM_SCRATCH, (size_t)B * T * sizeof(int));
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
    size_t usable_steps = (dl->shard_tokens - 1) / step;  // whole steps in this shard
    size_t step_start = dl->position - (size_t)dl->rank * BT;
    if (step_start / step >= usable_steps) {
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
