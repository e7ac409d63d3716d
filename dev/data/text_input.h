/*
text_input.h: the text that dev/data/prepare_tokens.c reads, made into UTF-8 the BPE can take:
a byte stream checked (or repaired) as UTF-8, and one line of JSON Lines reduced to the string of
one field; and the file readers built on them, which hand each document's text to a sink.

    ReadSpec r = {"web.jsonl", UTF8_ERROR, DOCS_FILE, "text", NULL};
    jsonl_read_file(&r, my_sink, ctx);          // my_sink(ctx, text, n, ends) for every document
    Utf8Out out = {0}, key = {0};          // growing buffers
    size_t used = utf8_clean(&out, raw, n, at_end, UTF8_REPLACE, &bad);  // bytes of raw taken
    JsonLine j = {line, len, 0, "", UTF8_ERROR};
    if (json_field(&j, "text", &out, &key) != JSON_FIELD_OK) { ... j.error says what and where }

Invalid UTF-8 (a byte that starts no character, a cut or overlong sequence, a surrogate, a value
past U+10FFFF; in JSON also a lone \uD800-\uDFFF escape) is, by the mode:
  UTF8_ERROR    refused: utf8_clean stops there and says where (the caller names file, line, byte);
  UTF8_REPLACE  replaced by U+FFFD, one for each "maximal subpart" of a sequence, which is what
                python's bytes.decode("utf-8", errors="replace") does (and so what tiktoken sees
                when a file is read that way); a lone surrogate escape in JSON also becomes U+FFFD
                (python's json would keep it; tiktoken then replaces it by U+FFFD).
The JSON reader is strict RFC 8259 (python's json.loads, less NaN and Infinity): one object a line,
any values; the field's value must be a string; a key given twice: the last one counts, as in python.
The file readers stop through fail() naming the file (and line, and byte offset for UTF-8).
*/
#ifndef DEV_DATA_TEXT_INPUT_H
#define DEV_DATA_TEXT_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include "../../llmc/utils.h"

typedef enum { UTF8_ERROR, UTF8_REPLACE } Utf8Mode;

// a growing byte buffer
typedef struct { unsigned char* data; size_t len, cap; } Utf8Out;

static void out_reserve(Utf8Out* o, size_t more) {
    if (o->len + more <= o->cap) { return; }
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more) { cap *= 2; }
    unsigned char* p = (unsigned char*)realloc(o->data, cap);
    if (p == NULL) { fail("out of host memory growing a text buffer to %zu bytes\n  hint: a single line or document this long?", cap); }
    o->data = p;
    o->cap = cap;
}

static void out_append(Utf8Out* o, const void* s, size_t n) {
    if (n == 0) { return; }  // (o->data may still be NULL: memcpy must not see it)
    out_reserve(o, n);
    memcpy(o->data + o->len, s, n);
    o->len += n;
}

static void out_append_code_point(Utf8Out* o, uint32_t v) {
    unsigned char b[4];
    size_t n;
    if (v < 0x80) { b[0] = (unsigned char)v; n = 1; }
    else if (v < 0x800) { b[0] = (unsigned char)(0xC0 | (v >> 6)); b[1] = (unsigned char)(0x80 | (v & 0x3F)); n = 2; }
    else if (v < 0x10000) {
        b[0] = (unsigned char)(0xE0 | (v >> 12)); b[1] = (unsigned char)(0x80 | ((v >> 6) & 0x3F));
        b[2] = (unsigned char)(0x80 | (v & 0x3F)); n = 3;
    } else {
        b[0] = (unsigned char)(0xF0 | (v >> 18)); b[1] = (unsigned char)(0x80 | ((v >> 12) & 0x3F));
        b[2] = (unsigned char)(0x80 | ((v >> 6) & 0x3F)); b[3] = (unsigned char)(0x80 | (v & 0x3F)); n = 4;
    }
    out_append(o, b, n);
}

#define UTF8_REPLACEMENT_POINT 0xFFFDu  // U+FFFD (tokenizer.h has its UTF-8 bytes)

// ----------------------------------------------------------------------------
// UTF-8

// the valid sequence at s[0..n): its length if whole and valid; else 0 with *subpart = the bytes of
// its "maximal subpart" (at least 1: what one U+FFFD replaces), or *subpart = 0 when s ends inside
// a sequence that may still be valid (more bytes needed)
static size_t utf8_sequence(const unsigned char* s, size_t n, size_t* subpart) {
    unsigned char b = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte (Unicode table 3-7)
    if (b < 0x80) { return 1; }
    if (b >= 0xC2 && b <= 0xDF) { len = 2; }
    else if (b >= 0xE0 && b <= 0xEF) { len = 3; lo = b == 0xE0 ? 0xA0 : 0x80; hi = b == 0xED ? 0x9F : 0xBF; }
    else if (b >= 0xF0 && b <= 0xF4) { len = 4; lo = b == 0xF0 ? 0x90 : 0x80; hi = b == 0xF4 ? 0x8F : 0xBF; }
    else { *subpart = 1; return 0; }  // 80..C1, F5..FF start nothing
    for (size_t k = 1; k < len; k++) {
        if (k >= n) { *subpart = 0; return 0; }
        unsigned char lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
        if (s[k] < lo_k || s[k] > hi_k) { *subpart = k; return 0; }
    }
    return len;
}

// appends raw[0..n) to out as valid UTF-8; returns how many bytes of raw it took: all of them, or
// fewer when raw ends inside a character and !at_end (the caller passes the rest again with more
// bytes). UTF8_ERROR: stops at the first invalid byte, its offset into *bad (else *bad = SIZE_MAX)
static size_t utf8_clean(Utf8Out* out, const unsigned char* raw, size_t n, int at_end, Utf8Mode mode, size_t* bad) {
    *bad = SIZE_MAX;
    out_reserve(out, n);
    size_t i = 0, run = 0;  // raw[run..i) is valid and not yet copied
    while (i < n) {
        if (raw[i] < 0x80) { i++; continue; }
        size_t subpart, len = utf8_sequence(raw + i, n - i, &subpart);
        if (len > 0) { i += len; continue; }
        if (subpart == 0 && !at_end) { break; }  // cut by the end of this read
        if (subpart == 0) { subpart = n - i; }
        out_append(out, raw + run, i - run);
        if (mode == UTF8_ERROR) { *bad = i; return i; }
        out_append_code_point(out, UTF8_REPLACEMENT_POINT);
        i += subpart;
        run = i;
    }
    out_append(out, raw + run, i - run);
    return i;
}

// ----------------------------------------------------------------------------
// one line of JSON Lines: the string value of a top-level field

#define JSON_MAX_DEPTH 256  // arrays and objects nested deeper are refused (python's limit is about 1000)

typedef struct {
    const unsigned char* s;
    size_t n, i;
    char error[160];   // what is wrong, set at the first error
    Utf8Mode mode;
} JsonLine;

static int json_error(JsonLine* j, const char* what) {
    if (j->error[0] == '\0') { snprintf(j->error, sizeof(j->error), "%s at column %zu", what, j->i + 1); }
    return 0;
}

static void json_space(JsonLine* j) {
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\r' || j->s[j->i] == '\n')) { j->i++; }
}

static int json_hex4(JsonLine* j, uint32_t* v) {
    *v = 0;
    for (int k = 0; k < 4; k++, j->i++) {
        int c = j->i < j->n ? j->s[j->i] : -1;
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) { return json_error(j, "a \\u escape without 4 hex digits"); }
        *v = *v * 16 + (uint32_t)d;
    }
    return 1;
}

// the string at the cursor (at its '"'), unescaped into out when out != NULL; 1 if well formed
static int json_string(JsonLine* j, Utf8Out* out) {
    j->i++;  // the opening quote
    for (;;) {
        size_t run = j->i;
        while (j->i < j->n && j->s[j->i] != '"' && j->s[j->i] != '\\' && j->s[j->i] >= 0x20 && j->s[j->i] < 0x80) { j->i++; }
        if (out) { out_append(out, j->s + run, j->i - run); }
        if (j->i >= j->n) { return json_error(j, "a string without its closing quote"); }
        unsigned char c = j->s[j->i];
        if (c == '"') { j->i++; return 1; }
        if (c < 0x20) { return json_error(j, "a control character inside a string (JSON wants it escaped)"); }
        if (c >= 0x80) {  // raw UTF-8 inside the string
            size_t subpart, len = utf8_sequence(j->s + j->i, j->n - j->i, &subpart);
            if (len == 0) {
                if (j->mode == UTF8_ERROR) { return json_error(j, "invalid UTF-8 (use --invalid-utf8 replace to replace it by U+FFFD)"); }
                if (out) { out_append_code_point(out, UTF8_REPLACEMENT_POINT); }
                j->i += subpart ? subpart : j->n - j->i;
            } else {
                if (out) { out_append(out, j->s + j->i, len); }
                j->i += len;
            }
            continue;
        }
        j->i++;  // the backslash
        if (j->i >= j->n) { return json_error(j, "a string cut after a backslash"); }
        static const char escapes[] = "\"\\/bfnrt", escaped[] = "\"\\/\b\f\n\r\t";
        const char* simple = strchr(escapes, j->s[j->i]);
        if (j->s[j->i] != '\0' && simple != NULL) {
            if (out) { out_append(out, &escaped[simple - escapes], 1); }
            j->i++;
            continue;
        }
        if (j->s[j->i] != 'u') { return json_error(j, "an unknown escape in a string"); }
        j->i++;
        uint32_t v, low;
        if (!json_hex4(j, &v)) { return 0; }
        int lone = 0;
        if (v >= 0xD800 && v <= 0xDBFF) {  // a high surrogate: a low one must follow
            if (j->i + 1 < j->n && j->s[j->i] == '\\' && j->s[j->i + 1] == 'u') {
                size_t back = j->i;
                j->i += 2;
                if (!json_hex4(j, &low)) { return 0; }
                if (low >= 0xDC00 && low <= 0xDFFF) { v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00); }
                else { lone = 1; j->i = back; }  // the next escape stands alone
            } else { lone = 1; }
        } else if (v >= 0xDC00 && v <= 0xDFFF) { lone = 1; }
        if (lone) {
            if (j->mode == UTF8_ERROR) { return json_error(j, "a lone surrogate escape (\\uD800-\\uDFFF: not a character; use --invalid-utf8 replace)"); }
            v = UTF8_REPLACEMENT_POINT;
        }
        if (out) { out_append_code_point(out, v); }
    }
}

static int json_literal(JsonLine* j, const char* word) {
    size_t n = strlen(word);
    if (j->i + n > j->n || memcmp(j->s + j->i, word, n) != 0) { return json_error(j, "not a JSON value"); }
    j->i += n;
    return 1;
}

static int json_number(JsonLine* j) {
    size_t start = j->i;
    if (j->i < j->n && j->s[j->i] == '-') { j->i++; }
    if (j->i < j->n && j->s[j->i] == '0') { j->i++; }
    else if (j->i < j->n && j->s[j->i] >= '1' && j->s[j->i] <= '9') { while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') { j->i++; } }
    else { j->i = start; return json_error(j, "not a JSON value"); }
    if (j->i < j->n && j->s[j->i] == '.') {
        j->i++;
        if (!(j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')) { return json_error(j, "a number without digits after '.'"); }
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') { j->i++; }
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-')) { j->i++; }
        if (!(j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')) { return json_error(j, "a number without exponent digits"); }
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') { j->i++; }
    }
    return 1;
}

// skips the value at the cursor; 1 if well formed
static int json_value(JsonLine* j, int depth) {
    json_space(j);
    if (j->i >= j->n) { return json_error(j, "a value missing"); }
    unsigned char c = j->s[j->i];
    if (c == '"') { return json_string(j, NULL); }
    if (c == 't') { return json_literal(j, "true"); }
    if (c == 'f') { return json_literal(j, "false"); }
    if (c == 'n') { return json_literal(j, "null"); }
    if (c != '{' && c != '[') { return json_number(j); }
    if (depth >= JSON_MAX_DEPTH) { return json_error(j, "arrays or objects nested too deep"); }
    unsigned char close = c == '{' ? '}' : ']';
    j->i++;
    json_space(j);
    if (j->i < j->n && j->s[j->i] == close) { j->i++; return 1; }
    for (;;) {
        if (c == '{') {
            json_space(j);
            if (j->i >= j->n || j->s[j->i] != '"') { return json_error(j, "an object key that is not a string"); }
            if (!json_string(j, NULL)) { return 0; }
            json_space(j);
            if (j->i >= j->n || j->s[j->i] != ':') { return json_error(j, "':' missing after a key"); }
            j->i++;
        }
        if (!json_value(j, depth + 1)) { return 0; }
        json_space(j);
        if (j->i < j->n && j->s[j->i] == ',') { j->i++; continue; }
        if (j->i < j->n && j->s[j->i] == close) { j->i++; return 1; }
        return json_error(j, c == '{' ? "',' or '}' expected in an object" : "',' or ']' expected in an array");
    }
}

typedef enum { JSON_FIELD_OK, JSON_NOT_JSON, JSON_NOT_OBJECT, JSON_FIELD_ABSENT, JSON_FIELD_NOT_STRING } JsonFieldResult;

// the line (one JSON object) into out: the string value of its top-level key `field`
static JsonFieldResult json_field(JsonLine* j, const char* field, Utf8Out* out, Utf8Out* key) {
    j->i = 0;
    j->error[0] = '\0';
    json_space(j);
    if (j->i >= j->n || j->s[j->i] != '{') {
        if (!json_value(j, 0)) { return JSON_NOT_JSON; }
        return JSON_NOT_OBJECT;
    }
    j->i++;
    int found = 0, not_string = 0;
    json_space(j);
    if (j->i < j->n && j->s[j->i] == '}') { j->i++; }
    else {
        for (;;) {
            json_space(j);
            if (j->i >= j->n || j->s[j->i] != '"') { json_error(j, "an object key that is not a string"); return JSON_NOT_JSON; }
            key->len = 0;
            if (!json_string(j, key)) { return JSON_NOT_JSON; }
            json_space(j);
            if (j->i >= j->n || j->s[j->i] != ':') { json_error(j, "':' missing after a key"); return JSON_NOT_JSON; }
            j->i++;
            json_space(j);
            int match = key->len == strlen(field) && memcmp(key->data, field, key->len) == 0;
            if (match && j->i < j->n && j->s[j->i] == '"') {  // the last one counts
                out->len = 0;
                if (!json_string(j, out)) { return JSON_NOT_JSON; }
                found = 1;
                not_string = 0;
            } else {
                if (!json_value(j, 1)) { return JSON_NOT_JSON; }
                if (match) { found = 1; not_string = 1; }
            }
            json_space(j);
            if (j->i < j->n && j->s[j->i] == ',') { j->i++; continue; }
            if (j->i < j->n && j->s[j->i] == '}') { j->i++; break; }
            json_error(j, "',' or '}' expected in an object");
            return JSON_NOT_JSON;
        }
    }
    json_space(j);
    if (j->i < j->n) { json_error(j, "more after the object (one JSON object a line)"); return JSON_NOT_JSON; }
    if (!found) { return JSON_FIELD_ABSENT; }
    return not_string ? JSON_FIELD_NOT_STRING : JSON_FIELD_OK;
}

// ----------------------------------------------------------------------------
// the file readers: text (one document, or blank-line blocks) and JSON Lines, each document's
// text handed to a sink, which takes all of it where the document ends and else as much as it
// wants (the reader passes the rest again with more)

typedef enum { DOCS_FILE, DOCS_BLANK_LINES } DocSplit;
#define TEXT_READ_BYTES (1 << 20)   // one fread of a text file
#define UTF8_MAX_BYTES 4            // bytes of one UTF-8 character (a cut one waits for the next read)

// returns how many bytes of text[0..n) it took; ends: the document ends at n (take all)
typedef size_t (*TextSink)(void* ctx, const unsigned char* text, size_t n, int ends);

typedef struct {
    const char* path;          // "-": standard input
    Utf8Mode mode;
    DocSplit docs;             // text files
    const char* field;         // JSON Lines: the key whose string is the document
    long long* bytes_in;       // bytes read are added here (progress), or NULL
} ReadSpec;


// the line of byte offset `at` in path (re-read; 0 for standard input)
static long long line_of_offset(const char* path, size_t at) {
    if (strcmp(path, "-") == 0) { return 0; }
    FILE* f = fopen(path, "rb");
    if (f == NULL) { return 0; }
    long long line = 1;
    for (size_t i = 0; i < at; i++) {
        int c = fgetc(f);
        if (c == EOF) { break; }
        line += c == '\n';
    }
    fclose(f);
    return line;
}

static void fail_utf8(const char* path, size_t at) {
    long long line = line_of_offset(path, at);
    char where[48] = "";
    if (line > 0) { snprintf(where, sizeof(where), ":%lld", line); }
    fail("%s%s: invalid UTF-8 at byte offset %zu\n  hint: --invalid-utf8 replace puts U+FFFD there (as python's "
         "decode(errors=\"replace\") does); or fix the file's encoding (iconv -f latin1 -t utf-8, say)",
         strcmp(path, "-") == 0 ? "standard input" : path, where, at);
}

static void text_read_file(const ReadSpec* r, TextSink sink, void* ctx) {
    FILE* f = strcmp(r->path, "-") == 0 ? stdin : fopen(r->path, "rb");
    if (f == NULL) { fail("cannot open '%s': %s", r->path, strerror(errno)); }
    unsigned char* raw = (unsigned char*)malloc_check(TEXT_READ_BYTES + UTF8_MAX_BYTES);
    Utf8Out doc = {0};
    out_reserve(&doc, 1);  // never NULL: memmem and memmove take no NULL, even for 0 bytes
    size_t kept = 0, offset = 0, searched = 0;  // raw[0..kept): a cut character from the last read
    int at_end = 0;
    while (!at_end) {
        size_t got = fread(raw + kept, 1, TEXT_READ_BYTES, f);
        if (got < TEXT_READ_BYTES) {
            if (ferror(f)) { fail("cannot read '%s': %s", r->path, strerror(errno)); }
            at_end = 1;
        }
        if (r->bytes_in) { *r->bytes_in += (long long)got; }
        size_t have = kept + got, bad;
        size_t used = utf8_clean(&doc, raw, have, at_end, r->mode, &bad);
        if (bad != SIZE_MAX) { fail_utf8(r->path, offset + bad); }
        offset += used;
        kept = have - used;
        memmove(raw, raw + used, kept);
        size_t start = 0;
        if (r->docs == DOCS_BLANK_LINES) {  // every "\n\n" ends a document (python's split, left to right)
            for (;;) {
                const unsigned char* nn = memmem(doc.data + searched, doc.len - searched, "\n\n", 2);
                if (nn == NULL) { searched = doc.len > start + 1 ? doc.len - 1 : start; break; }
                size_t end = (size_t)(nn - doc.data) + 2;
                sink(ctx, doc.data + start, end - start, 1);
                start = searched = end;
            }
        }
        start += sink(ctx, doc.data + start, doc.len - start, 0);
        memmove(doc.data, doc.data + start, doc.len - start);
        doc.len -= start;
        searched -= searched >= start ? start : searched;
    }
    sink(ctx, doc.data, doc.len, 1);  // the last document (empty after a final "\n\n": an EOT, as in llm.c)
    if (f != stdin) { fclose(f); }
    free(raw);
    free(doc.data);
}

static void jsonl_read_file(const ReadSpec* r, TextSink sink, void* ctx) {
    FILE* f = strcmp(r->path, "-") == 0 ? stdin : fopen(r->path, "rb");
    if (f == NULL) { fail("cannot open '%s': %s", r->path, strerror(errno)); }
    char* line = NULL;
    size_t cap = 0;
    Utf8Out text = {0}, key = {0};
    out_reserve(&text, 1);  // an empty first document is text.data + 0, which must not be NULL
    const char* name = strcmp(r->path, "-") == 0 ? "standard input" : r->path;
    long long number = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) != -1) {
        number++;
        if (r->bytes_in) { *r->bytes_in += n; }
        JsonLine j = {(const unsigned char*)line, (size_t)n, 0, "", r->mode};
        json_space(&j);
        if (j.i == j.n) { continue; }  // a blank line
        JsonFieldResult res = json_field(&j, r->field, &text, &key);
        if (res == JSON_NOT_JSON) { fail("%s:%lld: not JSON: %s\n  hint: a .jsonl file holds one JSON object a line", name, number, j.error); }
        if (res == JSON_NOT_OBJECT) { fail("%s:%lld: a JSON value that is not an object\n  hint: a .jsonl file holds one JSON object a line, e.g. {\"%s\": \"...\"}", name, number, r->field); }
        if (res == JSON_FIELD_ABSENT) { fail("%s:%lld: no field \"%s\" in this object\n  hint: --field NAME names the key that holds the text", name, number, r->field); }
        if (res == JSON_FIELD_NOT_STRING) { fail("%s:%lld: the field \"%s\" is not a string\n  hint: --field NAME names the key that holds the text", name, number, r->field); }
        sink(ctx, text.data, text.len, 1);
    }
    if (ferror(f)) { fail("cannot read '%s': %s", name, strerror(errno)); }
    if (f != stdin) { fclose(f); }
    free(line);
    free(text.data);
    free(key.data);
}

#endif // DEV_DATA_TEXT_INPUT_H
