/*
manifest.h: the manifest of a set of token shards. build/prepare_tokens writes it last, beside the
shards (PREFIX_manifest.txt, atomically), so a set without one is an interrupted run's, or made
elsewhere; the data loader (dataloader.h) reads it and refuses shards it does not list, or that
differ from it, or a set with a listed shard missing.

    llm.c token shards manifest 1
    tokenizer gpt2-bpe vocab 50257 eot 50256
    shard val 32768 0x6f2c91d0 mine_val_000000.bin
    shard train 305260 0x0d4f1b93 mine_train_000001.bin
    end 2

A shard line: its split, its tokens, the CRC-32 of all its bytes (crc32.h, as the checkpoints'),
its name (the rest of the line: a base name, the shard sits beside the manifest). "end N" closes a
whole manifest.

    Manifest m; manifest_read(path, &m);   // stops naming path and line on anything else
    const ManifestShard* e = manifest_find(&m, "mine_val_000000.bin");

Failure: a manifest that is not one, cut short or malformed stops naming its path, the line and
the fix (re-run prepare_tokens).
*/
#ifndef LLMC_MANIFEST_H
#define LLMC_MANIFEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "crc32.h"
#include "utils.h"

#define MANIFEST_SUFFIX "_manifest.txt"          // PREFIX_manifest.txt beside PREFIX_val_000000.bin
#define MANIFEST_FIRST_LINE "llm.c token shards manifest"
#define MANIFEST_VERSION 1
#define MANIFEST_LINE_LEN 1024                   // a line: a shard's name and four words
#define MANIFEST_WORD_LEN 32                     // a split, a tokenizer's name
#define MANIFEST_MAX_SHARDS 1000000              // beyond: not a manifest (of 100M-token shards: 1e14 tokens)
#define MANIFEST_REGEN_HINT "re-run build/prepare_tokens (it writes the manifest last; --overwrite replaces its earlier shards), " \
                            "or for TinyShakespeare python3 dev/data/tinyshakespeare.py --force"

// ----------------------------------------------------------------------------
// the manifest

typedef struct {
    char split[MANIFEST_WORD_LEN];               // val | train
    char name[MANIFEST_LINE_LEN];                // the shard's base name
    long long tokens;
    uint32_t crc;                                // CRC-32 of the whole file
} ManifestShard;

typedef struct {
    char tokenizer[MANIFEST_WORD_LEN];           // gpt2-bpe (prepare_tokens); the tests' fixtures name theirs
    int vocab_size, eot;
    ManifestShard* shards;
    int num_shards, cap_shards;
} Manifest;

static void manifest_add(Manifest* m, const char* split, const char* name, long long tokens, uint32_t crc) {
    if (m->num_shards == m->cap_shards) {
        m->cap_shards = m->cap_shards ? 2 * m->cap_shards : 16;
        m->shards = (ManifestShard*)realloc(m->shards, (size_t)m->cap_shards * sizeof(ManifestShard));
        if (m->shards == NULL) { fail("out of host memory for a manifest of %d shards", m->num_shards); }
    }
    ManifestShard* e = &m->shards[m->num_shards++];
    snprintf(e->split, sizeof(e->split), "%s", split);
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->tokens = tokens;
    e->crc = crc;
}

static void manifest_free(Manifest* m) {
    free(m->shards);
    memset(m, 0, sizeof(*m));
}

// the manifest into f (the caller writes it atomically: AtomicFile)
static void manifest_write(FILE* f, const Manifest* m) {
    fprintf(f, "%s %d\n", MANIFEST_FIRST_LINE, MANIFEST_VERSION);
    fprintf(f, "tokenizer %s vocab %d eot %d\n", m->tokenizer, m->vocab_size, m->eot);
    for (int k = 0; k < m->num_shards; k++) {
        const ManifestShard* e = &m->shards[k];
        fprintf(f, "shard %s %lld 0x%08x %s\n", e->split, e->tokens, e->crc, e->name);
    }
    fprintf(f, "end %d\n", m->num_shards);
}

static void manifest_fail_line(const char* path, int line, const char* what) {
    fail("'%s' line %d: %s: not a manifest of token shards, or damaged\n  hint: %s", path, line, what, MANIFEST_REGEN_HINT);
}

// one shard line's fields after "shard " into m; 0 if malformed
static int manifest_parse_shard(Manifest* m, const char* s) {
    char split[MANIFEST_WORD_LEN];
    long long tokens;
    unsigned int crc;
    int used = 0;
    if (sscanf(s, "%31s %lld 0x%8x %n", split, &tokens, &crc, &used) != 3 || used == 0) { return 0; }
    const char* name = s + used;
    if (strcmp(split, "val") != 0 && strcmp(split, "train") != 0) { return 0; }
    if (tokens < 0 || tokens > INT32_MAX || *name == '\0' || strchr(name, '/') != NULL) { return 0; }
    manifest_add(m, split, name, tokens, (uint32_t)crc);
    return 1;
}

static int manifest_compare_names(const void* a, const void* b) { return strcmp(*(const char* const*)a, *(const char* const*)b); }

// reads the manifest at path into m; stops naming the path and line if it is not a whole one
static void manifest_read(const char* path, Manifest* m) {
    memset(m, 0, sizeof(*m));
    FILE* f = fopen_check(path, "rb");
    char line[MANIFEST_LINE_LEN + 64];
    int number = 0, ended = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        number++;
        size_t len = strlen(line);
        if (len == 0 || line[len - 1] != '\n') { manifest_fail_line(path, number, "a line too long, or without its end"); }
        line[len - 1] = '\0';
        if (memchr(line, '\0', len - 1) != NULL) { manifest_fail_line(path, number, "a NUL byte"); }
        if (ended) { manifest_fail_line(path, number, "more after its \"end\" line"); }
        int version = 0, count = -1, used = 0;
        char word[MANIFEST_WORD_LEN];
        if (number == 1) {
            if (sscanf(line, MANIFEST_FIRST_LINE " %d%n", &version, &used) != 1 || line[used] != '\0') {
                manifest_fail_line(path, number, "the first line is not \"" MANIFEST_FIRST_LINE " N\"");
            }
            if (version != MANIFEST_VERSION) { manifest_fail_line(path, number, "a version this program does not read"); }
        } else if (number == 2) {
            if (sscanf(line, "tokenizer %31s vocab %d eot %d%n", word, &m->vocab_size, &m->eot, &used) != 3 || line[used] != '\0'
                || m->vocab_size < 1 || m->eot < 0 || m->eot >= m->vocab_size) {
                manifest_fail_line(path, number, "not \"tokenizer NAME vocab V eot E\" (0 <= E < V)");
            }
            snprintf(m->tokenizer, sizeof(m->tokenizer), "%s", word);
        } else if (strncmp(line, "shard ", 6) == 0) {
            if (m->num_shards >= MANIFEST_MAX_SHARDS || !manifest_parse_shard(m, line + 6)) {
                manifest_fail_line(path, number, "not \"shard val|train TOKENS 0xCHECKSUM NAME\"");
            }
        } else if (sscanf(line, "end %d%n", &count, &used) == 1 && line[used] == '\0') {
            if (count != m->num_shards) { manifest_fail_line(path, number, "its \"end\" counts another number of shards than it lists"); }
            ended = 1;
        } else {
            manifest_fail_line(path, number, "a line of no known kind");
        }
    }
    if (ferror(f)) { fail("cannot read '%s': %s", path, strerror(errno)); }
    fclose(f);
    if (!ended) { manifest_fail_line(path, number + 1, "no \"end\" line: cut short"); }
    const char** names = (const char**)malloc_check(((size_t)m->num_shards + 1) * sizeof(char*));
    for (int k = 0; k < m->num_shards; k++) { names[k] = m->shards[k].name; }
    qsort(names, (size_t)m->num_shards, sizeof(char*), manifest_compare_names);
    for (int k = 0; k + 1 < m->num_shards; k++) {
        if (strcmp(names[k], names[k + 1]) == 0) { manifest_fail_line(path, number, "a shard listed twice"); }
    }
    free(names);
}

// the entry of the shard of this base name, NULL if the manifest does not list it
static const ManifestShard* manifest_find(const Manifest* m, const char* name) {
    for (int k = 0; k < m->num_shards; k++) {
        if (strcmp(m->shards[k].name, name) == 0) { return &m->shards[k]; }
    }
    return NULL;
}

#endif // LLMC_MANIFEST_H
