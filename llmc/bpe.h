/*
bpe.h: GPT-2's byte-level BPE encoder, text -> token ids: exactly OpenAI's GPT-2 encoder (and
tiktoken's "gpt2", and dev/data/gpt2_bpe.py, whose order this file follows). It reads GPT-2's
encoder.json and vocab.bpe; ids back to text is tokenizer.h's (llm.c's tokenizer file).

    Bpe bpe; bpe_load(&bpe, "data/gpt2");          // encoder.json and vocab.bpe in that folder
    int* ids = malloc(len * sizeof(int));          // room for len ids: every token is a byte or more
    size_t n = bpe_encode(&bpe, text, len, ids);   // "Hello world" -> 15496 995
    bpe_free(&bpe);

How GPT-2 turns text into ids, in the order of this file:
  1. pre-tokenizer: GPT-2's regex (python `regex` syntax)
         's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
     cuts the text into words, which BPE never merges across. Here it is written out by hand
     over UTF-8 code points; \p{L}, \p{N} and \s come from the generated table bpe_unicode.h.
  2. a word's bytes are the 256 single-byte tokens (vocab.bpe spells byte b as one printable
     character: b itself if printable, else chr(256 + n) for the n-th other byte);
  3. BPE: the adjacent pair with the lowest merge rank (its line in vocab.bpe) merges, every
     occurrence left to right, until no adjacent pair has a rank;
  4. the ids are encoder.json's: a symbol is an id from the start, and a merge maps a pair of
     ids to the id of the two tokens' bytes joined.
"<|endoftext|>" in the text is plain text (tiktoken's encode_ordinary); add the EOT id yourself.

Failure: a missing, foreign or inconsistent file stops with its path and where GPT-2's files
come from. Text that is not UTF-8 is encoded anyway, each invalid byte a character of no class
(bpe_utf8_error finds the first one, for a caller that would rather say so).
*/
#ifndef LLMC_BPE_H
#define LLMC_BPE_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bpe_unicode.h"
#include "utils.h"

#define BPE_ENCODER_JSON "encoder.json"  // token (in vocab.bpe's characters) -> id
#define BPE_VOCAB_BPE "vocab.bpe"        // "#version" line, then one merge "a b" a line, best first
#define BPE_FILES_HINT "GPT-2's encoder.json and vocab.bpe are at https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/ " \
                       "(python3 dev/data/tinyshakespeare.py downloads them into data/gpt2/ when ../shared/data/gpt2/ has none)"
#define BPE_NUM_BYTES 256
#define BPE_MAX_TOKEN_BYTES 255          // llm.c's tokenizer file keeps a token's length in a uint8
#define BPE_NOT_UTF8 0xFFFFFFFFu         // the "code point" of a byte that is not UTF-8: no class

// a merge in the hash table: the pair of ids (left << 32 | right), its rank, the id it makes
typedef struct {
    uint64_t pair;
    int rank;                      // its line among the merges, 0 = merged first; -1: an empty slot
    int merged;
} BpeMerge;

typedef struct {
    int vocab_size;                // encoder.json's ids are 0..vocab_size-1
    int num_merges;
    int byte_id[BPE_NUM_BYTES];    // the id of each single-byte token
    BpeMerge* merges;              // (merge_slots) open addressing, linear probing, by pair
    size_t merge_slots;            // a power of two, at least twice num_merges
} Bpe;

// ----------------------------------------------------------------------------
// 1. the pre-tokenizer: classes of code points, and the end of the word at a position

typedef enum { BPE_LETTER, BPE_NUMBER, BPE_SPACE, BPE_OTHER } BpeClass;  // \p{L}, \p{N}, \s, the rest

static int bpe_in_runs(const BpeRange* runs, int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < runs[mid].first) { hi = mid - 1; }
        else if (cp > runs[mid].last) { lo = mid + 1; }
        else { return 1; }
    }
    return 0;
}

static BpeClass bpe_class(uint32_t cp) {
    if (cp < 0x80) {  // ASCII, most text: no search
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) { return BPE_LETTER; }
        if (cp >= '0' && cp <= '9') { return BPE_NUMBER; }
        return (cp == ' ' || (cp >= '\t' && cp <= '\r')) ? BPE_SPACE : BPE_OTHER;
    }
    if (bpe_in_runs(BPE_LETTERS, BPE_RUNS(BPE_LETTERS), cp)) { return BPE_LETTER; }
    if (bpe_in_runs(BPE_NUMBERS, BPE_RUNS(BPE_NUMBERS), cp)) { return BPE_NUMBER; }
    if (bpe_in_runs(BPE_WHITE_SPACE, BPE_RUNS(BPE_WHITE_SPACE), cp)) { return BPE_SPACE; }
    return BPE_OTHER;
}

// the code point at s[0..n) (n >= 1) into *cp; returns its length in bytes. Strict UTF-8: an
// overlong form, a surrogate, a value past U+10FFFF or a cut sequence is one byte, BPE_NOT_UTF8
static size_t bpe_utf8_char(const unsigned char* s, size_t n, uint32_t* cp) {
    static const uint32_t min_value[5] = {0, 0, 0x80, 0x800, 0x10000};  // by length: shorter forms are overlong
    unsigned char b = s[0];
    size_t len = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    *cp = BPE_NOT_UTF8;
    if (len == 0 || len > n) { return 1; }
    uint32_t v = len == 1 ? b : b & (0x7Fu >> len);
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) { return 1; }
        v = (v << 6) | (s[k] & 0x3Fu);
    }
    if (v < min_value[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) { return 1; }
    *cp = v;
    return len;
}

// the offset of the first byte of text that is not UTF-8, len if all of it is
static size_t bpe_utf8_error(const char* text, size_t len) {
    const unsigned char* s = (const unsigned char*)text;
    uint32_t cp;
    for (size_t i = 0, n; i < len; i += n) {
        n = bpe_utf8_char(s + i, len - i, &cp);
        if (cp == BPE_NOT_UTF8) { return i; }
    }
    return len;
}

// the class of the character at byte i, its length into *len
static BpeClass bpe_class_at(const unsigned char* s, size_t n, size_t i, size_t* len) {
    uint32_t cp;
    *len = bpe_utf8_char(s + i, n - i, &cp);
    return bpe_class(cp);
}

// where the word that starts at byte i < n ends: the regex's alternatives, in its order
static size_t bpe_word_end(const unsigned char* s, size_t n, size_t i) {
    // 's|'t|'re|'ve|'m|'ll|'d: the contractions (lowercase only)
    if (s[i] == '\'' && i + 1 < n) {
        if (memchr("stmd", s[i + 1], 4) != NULL) { return i + 2; }
        if (i + 2 < n && (memcmp(s + i + 1, "re", 2) == 0 || memcmp(s + i + 1, "ve", 2) == 0 || memcmp(s + i + 1, "ll", 2) == 0)) {
            return i + 3;
        }
    }
    // ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+': an optional space (U+0020 only), then a run of one class
    size_t len, next_len, start = i;
    BpeClass c = bpe_class_at(s, n, i, &len);
    if (s[i] == ' ' && i + 1 < n) {
        BpeClass next = bpe_class_at(s, n, i + 1, &next_len);
        if (next != BPE_SPACE) { start = i + 1; c = next; len = next_len; }
    }
    if (c != BPE_SPACE) {
        size_t j = start + len;
        while (j < n && bpe_class_at(s, n, j, &len) == c) { j += len; }
        return j;
    }
    // '\s+(?!\S)|\s+': a run of white space, less its last character when a word follows (that
    // one goes with the word: "a   b" -> "a", "  ", " b"), unless it is the only one
    size_t j = i, last = i;
    while (j < n && bpe_class_at(s, n, j, &len) == BPE_SPACE) { last = j; j += len; }
    return (j < n && last > i) ? last : j;
}

// ----------------------------------------------------------------------------
// 2. bytes <-> vocab.bpe's characters

#define BPE_BYTE_CHARS (BPE_NUM_BYTES + 68)  // the characters that spell bytes: < 256, and 256 + the 68 others

// GPT-2's bytes_to_unicode, inverted: byte_of[character] = the byte it spells, -1 for none
static void bpe_byte_of_char(int byte_of[BPE_BYTE_CHARS]) {
    int others = 0;
    for (int c = 0; c < BPE_BYTE_CHARS; c++) { byte_of[c] = -1; }
    for (int b = 0; b < BPE_NUM_BYTES; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_of[printable ? b : BPE_NUM_BYTES + others++] = b;
    }
}

// ----------------------------------------------------------------------------
// loading: encoder.json (a token's bytes -> its id) and vocab.bpe (the merges)

// the whole file at path, NUL-terminated; its length into *len
static char* bpe_read_file(const char* path, size_t* len) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) { fail("no GPT-2 BPE file '%s': %s\n  hint: %s", path, strerror(errno), BPE_FILES_HINT); }
    long size = file_size(f);
    char* text = (char*)malloc_check((size_t)size + 1);
    fread_check(text, 1, (size_t)size, f);
    fclose(f);
    text[size] = '\0';
    *len = (size_t)size;
    return text;
}

// the tokens while loading: their bytes by id, and a hash table from bytes to id
typedef struct {
    unsigned char* bytes;          // (vocab_size, BPE_MAX_TOKEN_BYTES) token id's bytes
    int* len;                      // (vocab_size)
    int* slots;                    // (num_slots) ids, open addressing by the bytes' hash; -1 empty
    size_t num_slots;              // a power of two, at least twice the tokens
    int byte_of[BPE_BYTE_CHARS];   // bpe_byte_of_char
} BpeVocab;

static uint64_t bpe_hash(const unsigned char* s, int n) {
    uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
    for (int i = 0; i < n; i++) { h = (h ^ s[i]) * 0x100000001b3ULL; }
    return h;
}

// the slot of bytes s[0..n) in the vocabulary's table: its id's, or the empty one it would take
static size_t bpe_vocab_slot(const BpeVocab* v, const unsigned char* s, int n) {
    size_t k = bpe_hash(s, n) & (v->num_slots - 1);
    for (int id; (id = v->slots[k]) >= 0; k = (k + 1) & (v->num_slots - 1)) {
        if (v->len[id] == n && memcmp(v->bytes + (size_t)id * BPE_MAX_TOKEN_BYTES, s, n) == 0) { break; }
    }
    return k;
}

// the id of the token with bytes s[0..n), -1 if none
static int bpe_vocab_find(const BpeVocab* v, const unsigned char* s, int n) {
    return v->slots[bpe_vocab_slot(v, s, n)];
}

// a token spelled in vocab.bpe's characters (UTF-8, s[0..n)) into its bytes; returns how many
static int bpe_chars_to_bytes(const BpeVocab* v, const char* what, const unsigned char* s, size_t n,
                              unsigned char out[BPE_MAX_TOKEN_BYTES]) {
    int len = 0;
    uint32_t cp;
    for (size_t i = 0, char_len; i < n; i += char_len) {
        char_len = bpe_utf8_char(s + i, n - i, &cp);
        if (cp >= BPE_BYTE_CHARS || v->byte_of[cp] < 0 || len == BPE_MAX_TOKEN_BYTES) {
            fail("%s: the token '%.*s' is not spelled in GPT-2's byte characters, or is longer than %d bytes\n"
                 "  hint: %s", what, (int)n, (const char*)s, BPE_MAX_TOKEN_BYTES, BPE_FILES_HINT);
        }
        out[len++] = (unsigned char)v->byte_of[cp];
    }
    return len;
}

// encoder.json is one JSON object of string keys and integer values: {"!": 0, "\"": 1, ...}.
// A key's \uXXXX escapes are code points (pairs of surrogate escapes do not occur: every
// character of a key is below U+0144); the escaped key is UTF-8 again, then bytes
typedef struct { const char* s; size_t n, i; const char* path; } BpeJson;

static void bpe_json_fail(const BpeJson* j, const char* want) {
    fail("'%s' is not GPT-2's encoder.json: %s at byte %zu\n  hint: %s", j->path, want, j->i, BPE_FILES_HINT);
}

static void bpe_json_skip_space(BpeJson* j) {
    while (j->i < j->n && memchr(" \t\r\n", j->s[j->i], 4) != NULL) { j->i++; }
}

static void bpe_json_expect(BpeJson* j, char c) {
    bpe_json_skip_space(j);
    if (j->i >= j->n || j->s[j->i] != c) {
        char want[16];
        snprintf(want, sizeof(want), "expected '%c'", c);
        bpe_json_fail(j, want);
    }
    j->i++;
}

// the JSON string at the cursor, unescaped to UTF-8 into out (cap bytes); returns its length
static size_t bpe_json_string(BpeJson* j, char* out, size_t cap) {
    bpe_json_expect(j, '"');
    size_t n = 0;
    while (j->i < j->n && j->s[j->i] != '"') {
        if (n + 4 > cap) { bpe_json_fail(j, "a key too long"); }
        char c = j->s[j->i++];
        if (c != '\\') { out[n++] = c; continue; }
        if (j->i >= j->n) { bpe_json_fail(j, "a cut escape"); }
        c = j->s[j->i++];
        static const char escapes[] = "\"\\/bfnrt", escaped[] = "\"\\/\b\f\n\r\t";
        const char* simple = c == '\0' ? NULL : strchr(escapes, c);
        if (simple != NULL) { out[n++] = escaped[simple - escapes]; continue; }
        if (c != 'u') { bpe_json_fail(j, "an unknown escape"); }
        unsigned v = 0;
        for (int k = 0; k < 4; k++, j->i++) {
            char h = j->i < j->n ? j->s[j->i] : '\0';
            int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (d < 0) { bpe_json_fail(j, "a bad \\u escape"); }
            v = v * 16 + (unsigned)d;
        }
        if (v < 0x80) { out[n++] = (char)v; }  // UTF-8 of a code point below U+0800
        else if (v < 0x800) { out[n++] = (char)(0xC0 | (v >> 6)); out[n++] = (char)(0x80 | (v & 0x3F)); }
        else { bpe_json_fail(j, "a \\u escape beyond GPT-2's byte characters"); }
    }
    bpe_json_expect(j, '"');
    return n;
}

static int bpe_json_int(BpeJson* j) {
    bpe_json_skip_space(j);
    long v = 0;
    size_t start = j->i;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9' && v <= INT_MAX) { v = v * 10 + (j->s[j->i++] - '0'); }
    if (j->i == start || v > INT_MAX) { bpe_json_fail(j, "expected a token id (a non-negative int)"); }
    return (int)v;
}

// reads encoder.json into v: every token's bytes at its id, ids 0..count-1 each once; returns count
static int bpe_read_encoder(BpeVocab* v, const char* path) {
    size_t size;
    char* text = bpe_read_file(path, &size);
    BpeJson j = {text, size, 0, path};
    // the tokens are at most as many as the colons: size the tables for that many
    size_t max_tokens = 0;
    for (size_t i = 0; i < size; i++) { max_tokens += text[i] == ':'; }
    v->bytes = (unsigned char*)malloc_check((max_tokens + 1) * BPE_MAX_TOKEN_BYTES);
    v->len = (int*)malloc_check((max_tokens + 1) * sizeof(int));
    for (size_t i = 0; i <= max_tokens; i++) { v->len[i] = -1; }
    for (v->num_slots = 1; v->num_slots < 2 * (max_tokens + 1); v->num_slots *= 2) {}
    v->slots = (int*)malloc_check(v->num_slots * sizeof(int));
    for (size_t k = 0; k < v->num_slots; k++) { v->slots[k] = -1; }
    int count = 0;
    char key[4 * BPE_MAX_TOKEN_BYTES];
    bpe_json_expect(&j, '{');
    for (;;) {
        size_t key_len = bpe_json_string(&j, key, sizeof(key));
        bpe_json_expect(&j, ':');
        int id = bpe_json_int(&j);
        unsigned char bytes[BPE_MAX_TOKEN_BYTES];
        int n = bpe_chars_to_bytes(v, path, (const unsigned char*)key, key_len, bytes);
        if ((size_t)id > max_tokens || v->len[id] >= 0) { bpe_json_fail(&j, "a token id out of range or given twice"); }
        size_t slot = bpe_vocab_slot(v, bytes, n);
        if (v->slots[slot] >= 0) { bpe_json_fail(&j, "a token given twice"); }
        memcpy(v->bytes + (size_t)id * BPE_MAX_TOKEN_BYTES, bytes, n);
        v->len[id] = n;
        v->slots[slot] = id;
        count++;
        bpe_json_skip_space(&j);
        if (j.i >= j.n || j.s[j.i] != ',') { break; }
        j.i++;
    }
    bpe_json_expect(&j, '}');
    for (int id = 0; id < count; id++) {
        if (v->len[id] < 0) { fail("'%s' is not GPT-2's encoder.json: its %d ids are not 0..%d (%d is missing)\n  hint: %s", path, count, count - 1, id, BPE_FILES_HINT); }
    }
    free(text);
    return count;
}

static BpeMerge* bpe_merge_slot(const Bpe* b, uint64_t pair) {
    size_t k = (size_t)((pair * 0x9E3779B97F4A7C15ULL) >> 32) & (b->merge_slots - 1);
    while (b->merges[k].rank >= 0 && b->merges[k].pair != pair) { k = (k + 1) & (b->merge_slots - 1); }
    return &b->merges[k];
}

// reads vocab.bpe's merges (path) into b: each line "left right" (vocab.bpe's characters), rank
// = its place among them; the two tokens and their join must be encoder.json's (encoder_path)
static void bpe_read_merges(Bpe* b, const BpeVocab* v, const char* path, const char* encoder_path) {
    size_t size;
    char* text = bpe_read_file(path, &size);
    int lines = 0;
    for (size_t i = 0; i < size; i++) { lines += text[i] == '\n'; }
    for (b->merge_slots = 1; b->merge_slots < 2 * (size_t)(lines + 1); b->merge_slots *= 2) {}
    b->merges = (BpeMerge*)malloc_check(b->merge_slots * sizeof(BpeMerge));
    for (size_t k = 0; k < b->merge_slots; k++) { b->merges[k].rank = -1; }
    b->num_merges = 0;
    int number = 0;
    for (char* line = text; *line != '\0'; line += strcspn(line, "\n"), line += *line == '\n') {
        size_t len = strcspn(line, "\n"), left_len = strcspn(line, " ");
        number++;
        if (len == 0 || (number == 1 && line[0] == '#')) { continue; }  // "#version: 0.2", an empty line
        if (left_len == 0 || left_len + 1 >= len || memchr(line + left_len + 1, ' ', len - left_len - 1) != NULL) {
            fail("'%s' line %d is not a merge 'left right': '%.*s'\n  hint: %s", path, number, (int)len, line, BPE_FILES_HINT);
        }
        unsigned char left[BPE_MAX_TOKEN_BYTES], right[BPE_MAX_TOKEN_BYTES], joined[2 * BPE_MAX_TOKEN_BYTES];
        int nl = bpe_chars_to_bytes(v, path, (const unsigned char*)line, left_len, left);
        int nr = bpe_chars_to_bytes(v, path, (const unsigned char*)line + left_len + 1, len - left_len - 1, right);
        memcpy(joined, left, nl);
        memcpy(joined + nl, right, nr);
        int l = bpe_vocab_find(v, left, nl), r = bpe_vocab_find(v, right, nr);
        int merged = nl + nr <= BPE_MAX_TOKEN_BYTES ? bpe_vocab_find(v, joined, nl + nr) : -1;
        if (l < 0 || r < 0 || merged < 0) {
            fail("'%s' line %d merges '%.*s', but a token of it or their join is not in '%s'\n"
                 "  hint: use GPT-2's encoder.json and vocab.bpe from one folder; %s", path, number, (int)len, line, encoder_path,
                 BPE_FILES_HINT);
        }
        BpeMerge* m = bpe_merge_slot(b, ((uint64_t)l << 32) | (uint32_t)r);
        if (m->rank >= 0) { fail("'%s' line %d repeats the merge '%.*s'\n  hint: %s", path, number, (int)len, line, BPE_FILES_HINT); }
        m->pair = ((uint64_t)l << 32) | (uint32_t)r;
        m->rank = b->num_merges++;
        m->merged = merged;
    }
    free(text);
}

// reads the two files: encoder.json at encoder_path, vocab.bpe at vocab_path
static void bpe_load_files(Bpe* b, const char* encoder_path, const char* vocab_path) {
    BpeVocab v;
    memset(&v, 0, sizeof(v));
    bpe_byte_of_char(v.byte_of);
    b->vocab_size = bpe_read_encoder(&v, encoder_path);
    for (int byte = 0; byte < BPE_NUM_BYTES; byte++) {
        unsigned char c = (unsigned char)byte;
        b->byte_id[byte] = bpe_vocab_find(&v, &c, 1);
        if (b->byte_id[byte] < 0) { fail("'%s' has no token for the byte 0x%02x\n  hint: %s", encoder_path, byte, BPE_FILES_HINT); }
    }
    bpe_read_merges(b, &v, vocab_path, encoder_path);
    free(v.bytes);
    free(v.len);
    free(v.slots);
}

// reads dir/encoder.json and dir/vocab.bpe
static void bpe_load(Bpe* b, const char* dir) {
    char encoder_path[2048], vocab_path[2048];
    snprintf(encoder_path, sizeof(encoder_path), "%s/%s", dir, BPE_ENCODER_JSON);
    snprintf(vocab_path, sizeof(vocab_path), "%s/%s", dir, BPE_VOCAB_BPE);
    bpe_load_files(b, encoder_path, vocab_path);
}

static void bpe_free(Bpe* b) {
    free(b->merges);
    b->merges = NULL;
}

// ----------------------------------------------------------------------------
// 3. + 4. BPE and the encoder
//
// GPT-2's rule: the adjacent pair of the lowest rank merges, at every place it occurs, left to
// right (a run "a a a" of a pair (a, a) makes "aa a"); then the lowest rank among the pairs that
// are left, and so on. Two ways to follow it, which give the same ids:
//   - scan: find the best pair by a pass over the word, merge it everywhere in a second pass;
//     O(n^2) on a word of n bytes, and fastest on the short words of ordinary text;
//   - heap: the parts in a linked list and a min-heap of (rank, position) of their pairs, so
//     a merge costs O(log n): a 2 MB word without white space (one pre-tokenizer word) takes
//     a second instead of minutes.

#define BPE_HEAP_MIN_BYTES 32           // words this long or longer merge by heap (shorter, most words: scan is faster)
#define BPE_NO_PART UINT32_MAX          // the end of the heap's linked list of parts

// the merge of the pair (left, right), a slot of rank -1 if there is none
static const BpeMerge* bpe_pair(const Bpe* b, int left, int right) {
    return bpe_merge_slot(b, ((uint64_t)(uint32_t)left << 32) | (uint32_t)right);
}

// scan: ids[0..n) merged in place; returns how many are left
static size_t bpe_merge_scan(const Bpe* b, int* ids, size_t n) {
    for (;;) {
        const BpeMerge* best = NULL;
        for (size_t k = 0; k + 1 < n; k++) {
            const BpeMerge* m = bpe_pair(b, ids[k], ids[k + 1]);
            if (m->rank >= 0 && (best == NULL || m->rank < best->rank)) { best = m; }
        }
        if (best == NULL) { return n; }  // no adjacent pair can merge
        int left = (int)(best->pair >> 32), right = (int)(uint32_t)best->pair;
        size_t out = 0;
        for (size_t k = 0; k < n;) {
            if (k + 1 < n && ids[k] == left && ids[k + 1] == right) { ids[out++] = best->merged; k += 2; }
            else { ids[out++] = ids[k++]; }
        }
        n = out;
    }
}

// heap: a pair that may merge, the part at pos and the next one; ordered by rank, then pos
// (among equal ranks the leftmost first, as the scan merges them)
typedef struct { int rank; uint32_t pos; } BpePairAt;
typedef struct { BpePairAt* items; size_t n, cap; } BpePairs;

static int bpe_pair_before(BpePairAt a, BpePairAt b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void bpe_pairs_append(BpePairs* h, int rank, uint32_t pos) {
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 256;
        h->items = (BpePairAt*)realloc(h->items, h->cap * sizeof(BpePairAt));
        if (h->items == NULL) { fail("out of host memory merging a word of BPE\n  hint: a word this long (text without white space)?"); }
    }
    h->items[h->n].rank = rank;
    h->items[h->n].pos = pos;
    h->n++;
}

static void bpe_heap_down(BpePairs* h, size_t k) {
    for (;;) {
        size_t least = k, l = 2 * k + 1, r = l + 1;
        if (l < h->n && bpe_pair_before(h->items[l], h->items[least])) { least = l; }
        if (r < h->n && bpe_pair_before(h->items[r], h->items[least])) { least = r; }
        if (least == k) { return; }
        BpePairAt t = h->items[k]; h->items[k] = h->items[least]; h->items[least] = t;
        k = least;
    }
}

static void bpe_heap_push(BpePairs* h, BpePairAt p) {
    bpe_pairs_append(h, p.rank, p.pos);
    for (size_t k = h->n - 1; k > 0 && bpe_pair_before(h->items[k], h->items[(k - 1) / 2]); k = (k - 1) / 2) {
        BpePairAt t = h->items[k]; h->items[k] = h->items[(k - 1) / 2]; h->items[(k - 1) / 2] = t;
    }
}

static BpePairAt bpe_heap_pop(BpePairs* h) {
    BpePairAt top = h->items[0];
    h->items[0] = h->items[--h->n];
    bpe_heap_down(h, 0);
    return top;
}

// the pair of part pos and the next one into *to, if it has a merge
static void bpe_note_pair(const Bpe* b, const int* ids, const uint32_t* next, uint32_t pos, BpePairs* to) {
    if (pos == BPE_NO_PART || next[pos] == BPE_NO_PART) { return; }
    const BpeMerge* m = bpe_pair(b, ids[pos], ids[next[pos]]);
    if (m->rank >= 0) { bpe_pairs_append(to, m->rank, pos); }
}

// heap: ids[0..n) merged in place; returns how many are left. The heap's entries are checked
// when they come out (lazy deletion): one whose part was merged away, or whose pair changed,
// is dropped. A merge's new pairs wait in `fresh` until the rank's last merge is done: the
// scan merges every place of a rank before it looks at the pairs those merges made
static size_t bpe_merge_heap(const Bpe* b, int* ids, size_t n) {
    if (n >= BPE_NO_PART) { fail("a word of %zu bytes without white space: BPE merges words below 4 GiB\n  hint: is this a text file?", n); }
    uint32_t* next = (uint32_t*)malloc_check(2 * n * sizeof(uint32_t));  // (n) the next part, (n) the one before
    uint32_t* prev = next + n;
    BpePairs heap = {NULL, 0, 0}, fresh = {NULL, 0, 0};
    for (uint32_t k = 0; k < n; k++) {
        next[k] = k + 1 < n ? k + 1 : BPE_NO_PART;
        prev[k] = k > 0 ? k - 1 : BPE_NO_PART;
    }
    for (uint32_t k = 0; k + 1 < n; k++) { bpe_note_pair(b, ids, next, k, &heap); }
    for (size_t k = heap.n / 2; k-- > 0;) { bpe_heap_down(&heap, k); }
    int rank = -1;  // the rank being merged
    while (heap.n > 0 || fresh.n > 0) {
        if (heap.n == 0 || heap.items[0].rank != rank) {  // this rank is done: the new pairs join
            for (size_t k = 0; k < fresh.n; k++) { bpe_heap_push(&heap, fresh.items[k]); }
            fresh.n = 0;
            if (heap.n == 0) { break; }
            rank = heap.items[0].rank;
        }
        BpePairAt p = bpe_heap_pop(&heap);
        uint32_t right = next[p.pos];
        if (ids[p.pos] < 0 || right == BPE_NO_PART) { continue; }  // merged away, or now the last part
        const BpeMerge* m = bpe_pair(b, ids[p.pos], ids[right]);
        if (m->rank != p.rank) { continue; }  // its pair changed (a rank is one pair)
        ids[p.pos] = m->merged;
        ids[right] = -1;
        next[p.pos] = next[right];
        if (next[right] != BPE_NO_PART) { prev[next[right]] = p.pos; }
        bpe_note_pair(b, ids, next, prev[p.pos], &fresh);
        bpe_note_pair(b, ids, next, p.pos, &fresh);
    }
    size_t out = 0;
    for (uint32_t k = 0; k != BPE_NO_PART; k = next[k]) { ids[out++] = ids[k]; }  // part 0 is never merged away
    free(next);
    free(heap.items);
    free(fresh.items);
    return out;
}

// one word's bytes (n >= 1) into ids (room for n): its bytes' ids merged, lowest rank first;
// returns how many
static size_t bpe_encode_word(const Bpe* b, const unsigned char* word, size_t n, int* ids) {
    for (size_t k = 0; k < n; k++) { ids[k] = b->byte_id[word[k]]; }
    return n < BPE_HEAP_MIN_BYTES ? bpe_merge_scan(b, ids, n) : bpe_merge_heap(b, ids, n);
}

// text[0..len) into ids (room for len: a token is at least one byte); returns how many
static size_t bpe_encode(const Bpe* b, const char* text, size_t len, int* ids) {
    const unsigned char* s = (const unsigned char*)text;
    size_t n = 0;
    for (size_t i = 0, end; i < len; i = end) {
        end = bpe_word_end(s, len, i);
        n += bpe_encode_word(b, s + i, end - i, ids + n);
    }
    return n;
}

#endif // LLMC_BPE_H
