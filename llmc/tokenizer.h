/*
tokenizer.h: decodes GPT-2 token ids to text for printing samples. Reads llm.c's
tokenizer file, written by dev/data/tinyshakespeare.py:
  header 256 x int32: [0] magic 20240328, [1] version 2, [2] vocabulary size, [3] EOT id
  (checked to be in the vocabulary)
  then for each token id: one uint8 length n, then n raw bytes (may be partial UTF-8).

    Tokenizer tok; tokenizer_init(&tok, "data/gpt2_tokenizer.bin");
    if (tok.init_ok) { safe_print(tokenizer_decode(&tok, id)); }

Failure: a missing file only disables decoding (samples print as ids); a foreign or
truncated file stops with the reason and the script that regenerates it.
*/
#ifndef LLMC_TOKENIZER_H
#define LLMC_TOKENIZER_H

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include "file_header.h"
#include "utils.h"

#define TOKENIZER_MAGIC 20240328
#define TOKENIZER_VERSION 2
enum { TOKENIZER_SLOT_VOCAB_SIZE = 2, TOKENIZER_SLOT_EOT = 3 };  // after the magic and the version (file_header.h)
#define TOKENIZER_REGEN_HINT "regenerate it with: python3 dev/data/tinyshakespeare.py --force"

typedef struct {
    uint32_t vocab_size;
    char** token_table;   // (vocab_size) NUL-terminated byte strings
    int init_ok;
} Tokenizer;

static void tokenizer_init(Tokenizer* tok, const char* path) {
    tok->init_ok = 0;
    tok->vocab_size = 0;
    tok->token_table = NULL;
    if (path[0] == '\0') { return; }  // decoding turned off
    FILE* f = fopen(path, "rb");
    if (f == NULL) {
        printf("note: no tokenizer at '%s': samples print token ids (%s)\n", path, TOKENIZER_REGEN_HINT);
        return;
    }
    int header[FILE_HEADER_INTS];
    long size = file_header_read(f, path, "tokenizer file", TOKENIZER_MAGIC, TOKENIZER_REGEN_HINT, header);
    file_header_check_version(header, path, "tokenizer file", TOKENIZER_VERSION, TOKENIZER_REGEN_HINT);
    int vocab = header[TOKENIZER_SLOT_VOCAB_SIZE], eot = header[TOKENIZER_SLOT_EOT];
    long body = size - (long)sizeof(header);  // each token takes at least its length byte
    if (vocab <= 0 || vocab > body) {
        fail("tokenizer '%s': vocabulary size %d is impossible for its %ld bytes of tokens\n  hint: %s",
             path, vocab, body, TOKENIZER_REGEN_HINT);
    }
    if (eot < 0 || eot >= vocab) {
        fail("tokenizer '%s': the end-of-text id %d is outside its vocabulary 0..%d\n  hint: %s",
             path, eot, vocab - 1, TOKENIZER_REGEN_HINT);
    }
    tok->vocab_size = (uint32_t)vocab;
    tok->token_table = (char**)calloc_check(tok->vocab_size, sizeof(char*));
    for (uint32_t i = 0; i < tok->vocab_size; i++) {
        unsigned char len;
        size_t got = fread(&len, 1, 1, f);
        tok->token_table[i] = (char*)malloc_check(len + 1);
        if (got == 1) { got += fread(tok->token_table[i], 1, len, f); }
        if (got != 1 + (size_t)len) {
            fail("tokenizer '%s' is truncated: token %u of %d ends past the end of the file (%ld bytes)\n  hint: %s",
                 path, i, vocab, size, TOKENIZER_REGEN_HINT);
        }
        tok->token_table[i][len] = '\0';
    }
    if (ftell(f) != size) { fail("tokenizer '%s' has %ld trailing bytes\n  hint: %s", path, size - ftell(f), TOKENIZER_REGEN_HINT); }
    fclose(f);
    tok->init_ok = 1;
}

// the bytes of one token; "" for an id outside the vocabulary
static const char* tokenizer_decode(const Tokenizer* tok, uint32_t id) {
    if (!tok->init_ok || id >= tok->vocab_size) { return ""; }
    return tok->token_table[id];
}

// prints a token's bytes, skipping lone control bytes that would garble a terminal
static void safe_print(const char* piece) {
    if (piece == NULL || piece[0] == '\0') { return; }
    if (piece[1] == '\0') {
        unsigned char b = (unsigned char)piece[0];
        if (!(isprint(b) || isspace(b))) { return; }
    }
    printf("%s", piece);
}

static void tokenizer_free(Tokenizer* tok) {
    if (!tok->init_ok) { return; }
    for (uint32_t i = 0; i < tok->vocab_size; i++) { free(tok->token_table[i]); }
    free(tok->token_table);
    tok->init_ok = 0;
}

#endif // LLMC_TOKENIZER_H
