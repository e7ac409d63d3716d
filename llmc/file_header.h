/*
file_header.h: the one reader of the header that starts every file this project reads:
256 x int32 slots, slot 0 a magic number, slot 1 a version. llm.c's model file, token
shard and tokenizer file have it, and so does this project's training-state file; each
format names its slots (MODEL_SLOT_*, STATE_SLOT_*, ...) where it is defined.

    int h[FILE_HEADER_INTS];
    long size = file_header_read(f, path, "model file", MODEL_MAGIC, MODEL_REGEN_HINT, h);
    file_header_check_version(h, path, "token shard", SHARD_VERSION, SHARD_REGEN_HINT);

Failure: a file shorter than the header, or with another magic or version, stops with
the file, what it was expected to be, and the hint that says how to make a right one.
*/
#ifndef LLMC_FILE_HEADER_H
#define LLMC_FILE_HEADER_H

#include <stdint.h>
#include <stdio.h>
#include "utils.h"

#define FILE_HEADER_INTS 256
#define FILE_SLOT_MAGIC 0
#define FILE_SLOT_VERSION 1

// reads the header of f (at its start) into h and checks its magic; returns the file's size
// in bytes and leaves f at the first byte after the header
static long file_header_read(FILE* f, const char* path, const char* what, int magic, const char* hint,
                             int h[FILE_HEADER_INTS]) {
    long size = file_size(f);
    if (size < (long)(FILE_HEADER_INTS * sizeof(int))) {
        fail("%s '%s' is truncated (%ld bytes, less than its header)\n  hint: %s", what, path, size, hint);
    }
    fread_check(h, sizeof(int), FILE_HEADER_INTS, f);
    if (h[FILE_SLOT_MAGIC] != magic) {
        fail("'%s' is not a %s (magic %d, want %d)\n  hint: %s", path, what, h[FILE_SLOT_MAGIC], magic, hint);
    }
    return size;
}

// stops unless the header's version is want
static void file_header_check_version(const int h[FILE_HEADER_INTS], const char* path, const char* what, int want,
                                      const char* hint) {
    if (h[FILE_SLOT_VERSION] != want) {
        fail("%s '%s' has version %d, want %d\n  hint: %s", what, path, h[FILE_SLOT_VERSION], want, hint);
    }
}

// a 64-bit value in two slots, low half first
static void header_set64(int* h, int slot, uint64_t v) { h[slot] = (int)(uint32_t)v; h[slot + 1] = (int)(uint32_t)(v >> 32); }
static uint64_t header_get64(const int* h, int slot) { return (uint64_t)(uint32_t)h[slot] | ((uint64_t)(uint32_t)h[slot + 1] << 32); }

#endif // LLMC_FILE_HEADER_H
