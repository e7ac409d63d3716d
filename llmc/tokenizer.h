/*
tokenizer.h: decodes GPT-2 token ids to text for printing samples. Reads llm.c's
tokenizer file, written by dev/data/tinyshakespeare.py:
  header 256 x int32: [0] magic 20240328, [1] version 2, [2] vocabulary size, [3] EOT id
  (checked to be in the vocabulary)
  then for each token id: one uint8 length n, then n raw bytes (may be partial UTF-8).

    Tokenizer tok; tokenizer_init(&tok, "data/gpt2_tokenizer.bin");
    Utf8Printer pr = {{0}, 0, 0};                          // one per text printed
    for (...) { utf8_print(&pr, tokenizer_decode(&tok, id), stdout); }
    utf8_print_end(&pr, stdout);

Printing: a token holds bytes, not characters (GPT-2 splits a character of several UTF-8
bytes across tokens), so the bytes of consecutive tokens are one stream: a sequence is held
until the token that completes it, a byte that cannot begin or continue a valid sequence (and
a sequence cut short) prints as U+FFFD, and a control character other than tab and newline
as its picture (U+2400 + byte: a terminal is never steered by a sample).

Failure: a missing file only disables decoding (samples print as ids); an unreadable,
foreign or truncated file stops with the reason and the script that regenerates it.
*/
#ifndef LLMC_TOKENIZER_H
#define LLMC_TOKENIZER_H

#include <errno.h>
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
    if (f == NULL && errno == ENOENT) {
        printf("note: no tokenizer at '%s': samples print token ids (%s)\n", path, TOKENIZER_REGEN_HINT);
        return;
    }
    if (f == NULL) {
        fail("tokenizer '%s' (-k): %s\n  hint: make it readable, or -k \"\" to print token ids", path,
             errno == EACCES ? "permission denied" : strerror(errno));
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

// ----------------------------------------------------------------------------
// token bytes as UTF-8 text (see the top)

#define UTF8_REPLACEMENT "\xEF\xBF\xBD"  // U+FFFD
#define UTF8_MAX_SEQUENCE 4
typedef struct {
    unsigned char held[UTF8_MAX_SEQUENCE];  // the start of a sequence that the next bytes complete
    int n, need;                            // bytes held, bytes of the whole sequence
} Utf8Printer;

// the length of the sequence that byte b begins (1..4), or 0 if it begins none (a continuation
// byte, C0 and C1: overlong, F5..FF: beyond U+10FFFF)
static int utf8_sequence_length(unsigned char b) {
    if (b < 0x80) { return 1; }
    if (b >= 0xC2 && b <= 0xDF) { return 2; }
    if (b >= 0xE0 && b <= 0xEF) { return 3; }
    if (b >= 0xF0 && b <= 0xF4) { return 4; }
    return 0;
}

// whether b continues the n held bytes: a continuation byte, and after the lead byte one that
// makes no overlong form (E0, F0), surrogate (ED) or code point above U+10FFFF (F4)
static int utf8_continues(const unsigned char* held, int n, unsigned char b) {
    if (b < 0x80 || b > 0xBF) { return 0; }
    if (n == 1 && held[0] == 0xE0) { return b >= 0xA0; }
    if (n == 1 && held[0] == 0xED) { return b <= 0x9F; }
    if (n == 1 && held[0] == 0xF0) { return b >= 0x90; }
    if (n == 1 && held[0] == 0xF4) { return b <= 0x8F; }
    return 1;
}

#define ASCII_DEL 0x7F
#define CONTROL_PICTURES 0x2400  // U+2400 + c: the picture of control character c; U+2421 of DEL
static void utf8_print_ascii(unsigned char b, FILE* out) {
    if (b == '\n' || b == '\t' || (b >= 0x20 && b < ASCII_DEL)) { fputc(b, out); return; }
    unsigned cp = CONTROL_PICTURES + (b == ASCII_DEL ? 0x21 : b);  // three bytes: E2 90 xx
    fputc(0xE0 | (cp >> 12), out);
    fputc(0x80 | ((cp >> 6) & 0x3F), out);
    fputc(0x80 | (cp & 0x3F), out);
}

static void utf8_print_byte(Utf8Printer* p, unsigned char b, FILE* out) {
    if (p->n > 0) {
        if (utf8_continues(p->held, p->n, b)) {
            p->held[p->n++] = b;
            if (p->n == p->need) { fwrite(p->held, 1, (size_t)p->n, out); p->n = 0; }
            return;
        }
        fputs(UTF8_REPLACEMENT, out);  // the held bytes, a sequence cut short: one U+FFFD; b starts afresh
        p->n = 0;
    }
    int len = utf8_sequence_length(b);
    if (len == 0) { fputs(UTF8_REPLACEMENT, out); }
    else if (len == 1) { utf8_print_ascii(b, out); }
    else { p->held[0] = b; p->n = 1; p->need = len; }
}

// prints the bytes of one token (a NUL-terminated string), holding an incomplete sequence at
// its end for the next token
static void utf8_print(Utf8Printer* p, const char* bytes, FILE* out) {
    for (const unsigned char* b = (const unsigned char*)bytes; *b != '\0'; b++) { utf8_print_byte(p, *b, out); }
}

// the end of the text: a sequence still held was cut short, and prints as U+FFFD
static void utf8_print_end(Utf8Printer* p, FILE* out) {
    if (p->n > 0) { fputs(UTF8_REPLACEMENT, out); }
    p->n = 0;
}

static void tokenizer_free(Tokenizer* tok) {
    if (!tok->init_ok) { return; }
    for (uint32_t i = 0; i < tok->vocab_size; i++) { free(tok->token_table[i]); }
    free(tok->token_table);
    tok->init_ok = 0;
}

#endif // LLMC_TOKENIZER_H
