/*
text_input.h: the text that dev/data/prepare_tokens.c reads, made into UTF-8 the BPE can take:
a byte stream checked (or repaired) as UTF-8, and one line of JSON Lines reduced to the string of
one field.

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
*/
#ifndef DEV_DATA_TEXT_INPUT_H
#define DEV_DATA_TEXT_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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

#define UTF8_REPLACEMENT 0xFFFDu

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
        out_append_code_point(out, UTF8_REPLACEMENT);
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
                if (out) { out_append_code_point(out, UTF8_REPLACEMENT); }
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
            v = UTF8_REPLACEMENT;
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

#endif // DEV_DATA_TEXT_INPUT_H
