/*
prepare_tokens.c: any text into llm.c's token shards, with GPT-2's BPE (llmc/bpe.h) on every core.

    make build/prepare_tokens
    ./build/prepare_tokens -o data/mine/mine my_texts/            # a folder: its .txt and .jsonl files
    ./build/prepare_tokens -o data/web/web --field text web.jsonl # one document a JSON line
    cat notes.txt | ./build/prepare_tokens -o data/notes/notes -  # standard input
    ./train_gpt -i 'data/mine/mine_train_*.bin' -j 'data/mine/mine_val_*.bin'

Inputs, in the order given (a folder: every .txt and .jsonl file under it, recursively, sorted by
path byte by byte): a .jsonl file holds one JSON object a line (blank lines are skipped), and the
string of its --field is a document; any other file, or "-" (standard input), is text: one
document, or with --docs blank-lines one for every block that ends in a blank line ("\n\n", kept
with its block: llm.c's TinyShakespeare). As in llm.c's scripts every document starts with
<|endoftext|> (50256) and "<|endoftext|>" inside a text is plain text (tiktoken's encode_ordinary).

Output: the token stream cut into shards of --shard-tokens (default 100M, llm.c's), the first
--val-tokens N tokens (or --val-fraction F of the first shard's tokens: of the whole corpus when it
fits one shard; the default is 0.1) into OUT_val_000000.bin..., the rest into OUT_train_NNNNNN.bin,
numbered on (llm.c's fineweb names). A document runs on into the next shard where one is full.
Each shard is written to NAME.tmp and renamed when whole; a run that stops on an error removes
the shards it wrote. Last, OUT_manifest.txt (llmc/manifest.h): every shard with its split, tokens
and checksum, and the tokenizer; the trainer refuses shards it does not list (an interrupted run
has none). The files of an earlier run under the same OUT (exactly OUT_val_NNNNNN.bin,
OUT_train_NNNNNN.bin, OUT_manifest.txt: no pattern) stop the run, or with --overwrite are removed,
each named, never one that is an input. -o is checked (a folder that takes files) before any
input is read; a split (or its last shard) shorter than a step of -b 4 -t 1024 is warned about.

Speed: the text is cut into blocks (--block-size) at places where a word of GPT-2's pre-tokenizer
must end (after a character that is not white space, before one that is), so each block encodes
to the same ids alone as within its document; blocks are encoded by OpenMP threads, each with a
cache of the words it has seen, and their ids are written in input order: the shards are the same
bytes for any number of threads and any block size. Memory: a shard of uint16 tokens, plus about
5 bytes a byte of text in flight (2 blocks a thread), plus the longest JSON line.

Invalid UTF-8 (--invalid-utf8): "error" (default) stops naming the file, line and byte offset;
"replace" puts U+FFFD for it as python's bytes.decode("utf-8", errors="replace") does, so the ids
are tiktoken's of the text python reads that way (dev/data/text_input.h).
*/
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "llmc/bpe.h"
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "text_input.h"

#define SHARED_BPE_DIR "../shared/data/gpt2"    // where the repository's tests keep GPT-2's files
#define PREP_PATH_LEN 1024                       // a path: a prefix, an input, a folder
#define MAX_LOOKAHEAD UTF8_MAX_BYTES             // bytes of one UTF-8 character
#define SHARD_NAME_LEN (PREP_PATH_LEN + 32)
#define MANIFEST_TOKENIZER "gpt2-bpe"           // the manifest's name of the tokenizer (llmc/bpe.h)
#define SHARD_INDEX_DIGITS 6                     // PREFIX_train_000001.bin (llm.c's fineweb names)
#define TYPICAL_B 4                              // a typical step, for the warning about a short split:
#define TYPICAL_T 1024                           // -b 4 at GPT-2's context
#define TYPICAL_STEP_TOKENS (TYPICAL_B * TYPICAL_T + 1)

// ----------------------------------------------------------------------------
// options: one table gives the parser and the usage text

typedef enum { FORMAT_AUTO, FORMAT_TEXT, FORMAT_JSONL } InputFormat;

typedef struct {
    char out[PREP_PATH_LEN];         // shards are OUT_val_NNNNNN.bin and OUT_train_NNNNNN.bin
    char bpe_dir[PREP_PATH_LEN];     // encoder.json and vocab.bpe
    char format[16];                // auto | text | jsonl
    char field[256];                // the JSON key of the text
    char docs[16];                  // file | blank-lines
    char invalid_utf8[16];          // error | replace
    double shard_tokens;            // tokens a shard
    double val_tokens;              // -1: by --val-fraction
    double val_fraction;
    double block_size;              // bytes of text a thread encodes at a time
    double threads;                 // 0: all cores
    double overwrite;               // a switch
    double help;
    const char* inputs[4096];
    int num_inputs;
} Options;

typedef enum { OPT_STRING, OPT_NUMBER, OPT_SWITCH } OptKind;
typedef struct { const char* name; const char* arg; OptKind kind; size_t offset; size_t size; const char* help; } OptSpec;
#define STR_OPT(field) OPT_STRING, offsetof(Options, field), sizeof(((Options*)0)->field)
#define NUM_OPT(field) OPT_NUMBER, offsetof(Options, field), 0
#define SWITCH_OPT(field) OPT_SWITCH, offsetof(Options, field), 0

static const OptSpec OPTS[] = {
    {"-o", "PREFIX", STR_OPT(out), "shards are PREFIX_val_000000.bin, PREFIX_train_000001.bin, ... (folders made as needed; required)"},
    {"--bpe", "DIR", STR_OPT(bpe_dir), "folder of GPT-2's encoder.json and vocab.bpe (default data/gpt2, else " SHARED_BPE_DIR ")"},
    {"--format", "KIND", STR_OPT(format), "auto (.jsonl files are JSON Lines, the rest text) | text | jsonl (default auto)"},
    {"--field", "NAME", STR_OPT(field), "JSON Lines: the key whose string is the document (default text)"},
    {"--docs", "HOW", STR_OPT(docs), "text: file (a file is a document) | blank-lines (each block ending in \"\\n\\n\") (default file)"},
    {"--shard-tokens", "N", NUM_OPT(shard_tokens), "tokens a shard; K, M, G = 1e3, 1e6, 1e9 (default 100M)"},
    {"--val-tokens", "N", NUM_OPT(val_tokens), "the first N tokens are the validation split (0: none)"},
    {"--val-fraction", "F", NUM_OPT(val_fraction), "or this fraction of the first shard's tokens (default 0.1)"},
    {"--invalid-utf8", "WHAT", STR_OPT(invalid_utf8), "error (stop, naming file, line and byte) | replace (by U+FFFD, as python's decode) (default error)"},
    {"--block-size", "BYTES", NUM_OPT(block_size), "text one thread encodes at a time; the shards do not depend on it (default 1M)"},
    {"--threads", "N", NUM_OPT(threads), "OpenMP threads, 0 = all cores (default 0)"},
    {"--overwrite", NULL, SWITCH_OPT(overwrite), "replace shards of an earlier run under PREFIX (they are removed first)"},
    {"-h", NULL, SWITCH_OPT(help), "this text"},
};
#define NUM_OPTS (sizeof(OPTS) / sizeof(OPTS[0]))

static void print_usage(FILE* f) {
    fprintf(f, "usage: prepare_tokens -o PREFIX [options] INPUT...   (INPUT: a file, a folder, or - for standard input)\n");
    for (size_t k = 0; k < NUM_OPTS; k++) {
        char left[40];
        snprintf(left, sizeof(left), "%s%s%s", OPTS[k].name, OPTS[k].arg ? " " : "", OPTS[k].arg ? OPTS[k].arg : "");
        fprintf(f, "  %-22s %s\n", left, OPTS[k].help);
    }
}

// "100M", "32768", "1e8", "0.25": a number with an optional K/M/G (powers of 1000)
static double parse_number(const char* flag, const char* s) {
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    double scale = *end == 'K' || *end == 'k' ? 1e3 : *end == 'M' ? 1e6 : *end == 'G' ? 1e9 : 1;
    if (scale != 1) { end++; }
    if (end == s || *end != '\0' || errno != 0 || !isfinite(v)) {
        fail("%s '%s' is not a number\n  hint: e.g. %s 100M (K, M, G: 1e3, 1e6, 1e9); prepare_tokens -h lists the flags", flag, s, flag);
    }
    return v * scale;
}

static Options options_default(void) {
    Options o;
    memset(&o, 0, sizeof(o));
    snprintf(o.bpe_dir, sizeof(o.bpe_dir), "data/gpt2");
    snprintf(o.format, sizeof(o.format), "auto");
    snprintf(o.field, sizeof(o.field), "text");
    snprintf(o.docs, sizeof(o.docs), "file");
    snprintf(o.invalid_utf8, sizeof(o.invalid_utf8), "error");
    o.shard_tokens = 1e8;
    o.val_tokens = -1;
    o.val_fraction = 0.1;
    o.block_size = 1e6;
    return o;
}

static int given_val_fraction = 0, given_bpe = 0;

static void parse_options(Options* o, int argc, char** argv) {
    for (int a = 1; a < argc; a++) {
        const char* arg = argv[a];
        if (arg[0] != '-' || strcmp(arg, "-") == 0) {
            if (o->num_inputs == (int)(sizeof(o->inputs) / sizeof(o->inputs[0]))) { fail("more than %d inputs\n  hint: put them in a folder", o->num_inputs); }
            o->inputs[o->num_inputs++] = arg;
            continue;
        }
        const char* eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        const OptSpec* spec = NULL;
        for (size_t k = 0; k < NUM_OPTS; k++) {
            if (strlen(OPTS[k].name) == name_len && strncmp(OPTS[k].name, arg, name_len) == 0) { spec = &OPTS[k]; }
        }
        if (spec == NULL) { fail("unknown flag '%s'\n  hint: prepare_tokens -h lists the flags", arg); }
        char* field = (char*)o + spec->offset;
        if (spec->kind == OPT_SWITCH) { *(double*)field = 1; continue; }
        const char* value = eq ? eq + 1 : (a + 1 < argc ? argv[++a] : NULL);
        if (value == NULL) { fail("flag %s needs a value (%s)\n  hint: prepare_tokens -h", spec->name, spec->arg); }
        if (spec->kind == OPT_NUMBER) { *(double*)field = parse_number(spec->name, value); }
        else {
            if (strlen(value) >= spec->size) { fail("%s '%s' is longer than %zu characters", spec->name, value, spec->size - 1); }
            snprintf(field, spec->size, "%s", value);
        }
        given_val_fraction |= strcmp(spec->name, "--val-fraction") == 0;
        given_bpe |= strcmp(spec->name, "--bpe") == 0;
    }
}

static int choice(const char* flag, const char* value, const char* const* names, int n) {
    char want[128] = "";
    for (int k = 0; k < n; k++) {
        if (strcmp(value, names[k]) == 0) { return k; }
        snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%s", k ? " | " : "", names[k]);
    }
    fail("%s '%s': want %s\n  hint: prepare_tokens -h", flag, value, want);
    return -1;
}

static int is_whole(double v) { return v >= 0 && v == floor(v); }

// ----------------------------------------------------------------------------
// inputs: the files to read, in order

typedef struct { char* path; InputFormat format; long long bytes; } Input;  // path "-": stdin, bytes -1
typedef struct { Input* items; size_t n, cap; } InputList;

static int has_suffix(const char* s, const char* suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void input_add(InputList* l, const char* path, InputFormat forced, long long bytes) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->items = (Input*)realloc(l->items, l->cap * sizeof(Input));
        if (l->items == NULL) { fail("out of host memory listing inputs"); }
    }
    Input* in = &l->items[l->n++];
    in->path = strdup(path);
    in->format = forced != FORMAT_AUTO ? forced : has_suffix(path, ".jsonl") ? FORMAT_JSONL : FORMAT_TEXT;
    in->bytes = bytes;
}

static int compare_inputs(const void* a, const void* b) { return strcmp(((const Input*)a)->path, ((const Input*)b)->path); }

// every .txt and .jsonl file under dir (not following links to folders), unsorted
static void input_add_folder(InputList* l, const char* dir, InputFormat forced) {
    DIR* d = opendir(dir);
    if (d == NULL) { fail("cannot read the folder '%s': %s", dir, strerror(errno)); }
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') { continue; }  // ., .., hidden files
        char path[PREP_PATH_LEN];
        if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path)) { fail("path too long: '%s/%s'", dir, e->d_name); }
        struct stat st;
        if (lstat(path, &st) != 0) { continue; }
        if (S_ISDIR(st.st_mode)) { input_add_folder(l, path, forced); continue; }
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) { continue; }
        if (has_suffix(path, ".txt") || has_suffix(path, ".jsonl")) { input_add(l, path, forced, (long long)st.st_size); }
    }
    closedir(d);
}

// the inputs as given: files, folders (expanded, sorted), "-"; stops on one that is not there
static InputList inputs_list(const Options* o, InputFormat forced) {
    InputList l = {0};
    for (int k = 0; k < o->num_inputs; k++) {
        const char* p = o->inputs[k];
        struct stat st;
        if (strcmp(p, "-") == 0) { input_add(&l, "-", forced, -1); continue; }
        if (stat(p, &st) != 0) { fail("input '%s' not found: %s\n  hint: give text files, folders of .txt/.jsonl files, or - for standard input", p, strerror(errno)); }
        if (S_ISDIR(st.st_mode)) {
            size_t first = l.n;
            input_add_folder(&l, p, forced);
            if (l.n == first) { fail("the folder '%s' holds no .txt or .jsonl file\n  hint: name the files, or give them the extension .txt (text) or .jsonl (JSON Lines)", p); }
            qsort(l.items + first, l.n - first, sizeof(Input), compare_inputs);
        } else {
            input_add(&l, p, forced, (long long)st.st_size);
        }
    }
    return l;
}

// ----------------------------------------------------------------------------
// the shard writer: tokens in, val shards then train shards out

typedef struct {
    char prefix[PREP_PATH_LEN];
    size_t shard_tokens;
    size_t val_target;         // tokens of the val split, once known
    int val_known;             // 0: --val-fraction, until the first shard is full or the input ends
    double val_fraction;
    uint16_t* buf;             // (shard_tokens) the shard being filled
    size_t n;
    int in_train;              // the val split is done
    int index;                 // the next shard's number
    size_t val_written, train_written;
    char (*written)[SHARD_NAME_LEN];  // the shards of this run, removed if it fails
    int num_written, cap_written;
    char tmp[CHECKPOINT_PATH_LEN + 4];  // the file being written (AtomicFile.tmp), "" when none
    Manifest manifest;         // the shards written, each with its split, tokens and checksum
    size_t last_tokens[2];     // the tokens of the last val, train shard (a short tail)
} Writer;

static Writer g_writer;        // the atexit clean-up reads it
static int g_finished = 0;

static void shard_name(char* buf, size_t n, const char* prefix, const char* split, int index) {
    snprintf(buf, n, "%s_%s_%0*d.bin", prefix, split, SHARD_INDEX_DIGITS, index);
}

static void writer_write(Writer* w, const uint16_t* tokens, size_t n, const char* split) {
    if (w->num_written == w->cap_written) {
        w->cap_written = w->cap_written ? 2 * w->cap_written : 16;
        w->written = realloc(w->written, (size_t)w->cap_written * SHARD_NAME_LEN);
        if (w->written == NULL) { fail("out of host memory"); }
    }
    char* path = w->written[w->num_written];
    shard_name(path, SHARD_NAME_LEN, w->prefix, split, w->index++);
    int header[FILE_HEADER_INTS] = {0};
    header[FILE_SLOT_MAGIC] = SHARD_MAGIC;
    header[FILE_SLOT_VERSION] = SHARD_VERSION;
    header[SHARD_SLOT_NUM_TOKENS] = (int)n;
    uint32_t crc = crc32_update(crc32_update(0, header, sizeof(header)), tokens, n * sizeof(uint16_t));
    AtomicFile a;
    atomic_open(&a, path);
    snprintf(w->tmp, sizeof(w->tmp), "%s", a.tmp);
    fwrite_check(header, sizeof(int), FILE_HEADER_INTS, a.f);  // little-endian hosts: the format's order
    fwrite_check(tokens, sizeof(uint16_t), n, a.f);
    atomic_commit(&a);
    w->tmp[0] = '\0';
    w->num_written++;
    const char* slash = strrchr(path, '/');
    manifest_add(&w->manifest, split, slash ? slash + 1 : path, (long long)n, crc);
    w->last_tokens[w->in_train] = n;
    if (w->in_train) { w->train_written += n; } else { w->val_written += n; }
    printf("wrote %zu tokens to %s\n", n, path);
    fflush(stdout);
}

// the tokens the current shard holds when it is written
static size_t writer_capacity(const Writer* w) {
    if (!w->val_known || w->in_train) { return w->shard_tokens; }
    size_t left = w->val_target - w->val_written;
    return left < w->shard_tokens ? left : w->shard_tokens;
}

// --val-fraction: the split is F of the first shard's tokens (the buffer, full or at the end)
static void writer_decide_val(Writer* w) {
    w->val_target = (size_t)floor(w->val_fraction * (double)w->n + 0.5);
    w->val_known = 1;
    if (w->val_target > 0) {
        writer_write(w, w->buf, w->val_target, "val");
        memmove(w->buf, w->buf + w->val_target, (w->n - w->val_target) * sizeof(uint16_t));
        w->n -= w->val_target;
    }
    w->in_train = 1;
}

// the buffer is full: write it out as the split it belongs to
static void writer_flush(Writer* w) {
    if (!w->val_known) { writer_decide_val(w); if (w->n < w->shard_tokens) { return; } }
    writer_write(w, w->buf, w->n, w->in_train ? "train" : "val");
    w->n = 0;
    if (!w->in_train && w->val_written == w->val_target) { w->in_train = 1; }
}

static void writer_push(Writer* w, const int* ids, size_t n) {
    for (size_t k = 0; k < n;) {
        if (w->val_known && !w->in_train && w->val_written == w->val_target) { w->in_train = 1; }
        size_t cap = writer_capacity(w), take = n - k < cap - w->n ? n - k : cap - w->n;
        for (size_t t = 0; t < take; t++) { w->buf[w->n + t] = (uint16_t)ids[k + t]; }
        w->n += take;
        k += take;
        if (w->n == cap) { writer_flush(w); }
    }
}

static void manifest_path(char* buf, size_t n, const char* prefix) { snprintf(buf, n, "%s%s", prefix, MANIFEST_SUFFIX); }

// the last shard, then the manifest: written last, so a set with one is whole
static void writer_finish(Writer* w) {
    if (!w->val_known) { writer_decide_val(w); }
    if (w->n > 0) { writer_write(w, w->buf, w->n, w->in_train ? "train" : "val"); w->n = 0; }
    char path[SHARD_NAME_LEN];
    manifest_path(path, sizeof(path), w->prefix);
    AtomicFile a;
    atomic_open(&a, path);
    snprintf(w->tmp, sizeof(w->tmp), "%s", a.tmp);
    manifest_write(a.f, &w->manifest);
    if (ferror(a.f)) { atomic_fail(&a, "write"); }
    atomic_commit(&a);
    w->tmp[0] = '\0';
    printf("wrote the manifest of %d shard(s) to %s\n", w->manifest.num_shards, path);
}

// at exit after an error: no half-written file, and none of this run's shards
static void writer_cleanup(void) {
    Writer* w = &g_writer;
    if (g_finished) { return; }
    if (w->tmp[0] != '\0') { remove(w->tmp); }
    for (int k = 0; k < w->num_written; k++) { remove(w->written[k]); }
    if (w->num_written > 0) { fprintf(stderr, "removed the %d shard(s) this run had written: the corpus was not read to its end\n", w->num_written); }
}

// a warning for a split (0 val, 1 train) or its last shard shorter than a step of a typical run
static void warn_short_split(const Writer* w, int train) {
    const char* split = train ? "train" : "val";
    size_t total = train ? w->train_written : w->val_written, last = w->last_tokens[train];
    if (total == 0) { return; }
    if (total < TYPICAL_STEP_TOKENS) {
        fprintf(stderr, "warning: the %s split has %zu tokens, fewer than one step of -b %d -t %d needs (%d): the trainer refuses "
                "it for such -b and -t\n  hint: a longer split (--val-tokens, --val-fraction), or train with a smaller -b or -t\n",
                split, total, TYPICAL_B, TYPICAL_T, TYPICAL_STEP_TOKENS);
    } else if (last < TYPICAL_STEP_TOKENS) {
        fprintf(stderr, "warning: the last %s shard has %zu tokens, fewer than one step of -b %d -t %d needs (%d): the trainer "
                "refuses it for such -b and -t\n  hint: a --shard-tokens that leaves a longer tail, or leave the shard out of -i/-j\n",
                split, last, TYPICAL_B, TYPICAL_T, TYPICAL_STEP_TOKENS);
    }
}

// ----------------------------------------------------------------------------
// the output: the prefix's folder made and writable, and the files of an earlier run under the
// prefix (its exact shard names and manifest, no pattern: the prefix may hold '*' or '[')

// name is prefix's base name, then "_val_" or "_train_", six digits or more, ".bin" (or ".bin.tmp")
static int is_own_shard(const char* name, const char* base) {
    size_t b = strlen(base);
    if (strncmp(name, base, b) != 0) { return 0; }
    const char* rest = name + b;
    const char* kinds[] = {"_val_", "_train_"};
    for (int k = 0; k < 2; k++) {
        size_t n = strlen(kinds[k]), digits = 0;
        if (strncmp(rest, kinds[k], n) != 0) { continue; }
        const char* d = rest + n;
        while (d[digits] >= '0' && d[digits] <= '9') { digits++; }
        if (digits >= SHARD_INDEX_DIGITS && (strcmp(d + digits, ".bin") == 0 || strcmp(d + digits, ".bin.tmp") == 0)) { return 1; }
    }
    char manifest[PREP_PATH_LEN + 32];
    snprintf(manifest, sizeof(manifest), "%s%s", base, MANIFEST_SUFFIX);
    return strncmp(name, manifest, strlen(manifest)) == 0 && (name[strlen(manifest)] == '\0' || strcmp(name + strlen(manifest), ".tmp") == 0);
}

typedef struct { char (*paths)[SHARD_NAME_LEN]; int n; } FileList;

// the files of prefix (dir/base) already there: its shards and manifest, and their temporaries
static FileList own_files(const char* dir, const char* base) {
    FileList l = {NULL, 0};
    DIR* d = opendir(dir);
    if (d == NULL) { fail("cannot read the folder '%s' of -o: %s", dir, strerror(errno)); }
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (!is_own_shard(e->d_name, base)) { continue; }
        l.paths = realloc(l.paths, (size_t)(l.n + 1) * SHARD_NAME_LEN);
        if (l.paths == NULL) { fail("out of host memory"); }
        if (snprintf(l.paths[l.n++], SHARD_NAME_LEN, "%s/%s", dir, e->d_name) >= SHARD_NAME_LEN) { fail("path too long: '%s/%s'", dir, e->d_name); }
    }
    closedir(d);
    return l;
}

// the input that is the file at path, NULL if none is
static const char* input_at(const InputList* inputs, const char* path) {
    struct stat a, b;
    if (stat(path, &a) != 0) { return NULL; }
    for (size_t k = 0; k < inputs->n; k++) {
        if (strcmp(inputs->items[k].path, "-") != 0 && stat(inputs->items[k].path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            return inputs->items[k].path;
        }
    }
    return NULL;
}

// makes the folders of prefix and checks that the last one takes files, before any input is read
static void make_output_folder(const char* prefix, char* dir, size_t n) {
    snprintf(dir, n, "%s", prefix);
    char* slash = strrchr(dir, '/');
    if (slash == NULL) { snprintf(dir, n, "."); } else if (slash == dir) { dir[1] = '\0'; } else { *slash = '\0'; }
    for (char* p = dir + 1; ; p++) {
        if (*p != '/' && *p != '\0') { continue; }
        char c = *p;
        *p = '\0';
        struct stat st;
        if (mkdir(dir, 0777) != 0 && errno != EEXIST) { fail("cannot make the folder '%s' for -o '%s': %s\n  hint: choose another -o", dir, prefix, strerror(errno)); }
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fail("-o '%s': '%s' is a file, not a folder\n  hint: -o FOLDER/NAME writes FOLDER/NAME_val_000000.bin, ...; choose a FOLDER that is one (or none yet)", prefix, dir);
        }
        *p = c;
        if (c == '\0') { break; }
    }
    char probe[PREP_PATH_LEN + 64];
    snprintf(probe, sizeof(probe), "%s/.prepare_tokens_probe_%ld.tmp", dir, (long)getpid());
    FILE* f = fopen(probe, "wb");
    if (f == NULL) { fail("-o '%s': cannot write in the folder '%s': %s\n  hint: choose a folder you can write (and with free space: df '%s')", prefix, dir, strerror(errno), dir); }
    fclose(f);
    remove(probe);
}

// refuses (or with --overwrite removes, naming each) the files of an earlier run under prefix;
// never an input of this run
static void writer_prepare_output(const char* prefix, int overwrite, const InputList* inputs) {
    char dir[PREP_PATH_LEN];
    make_output_folder(prefix, dir, sizeof(dir));
    const char* slash = strrchr(prefix, '/');
    FileList old = own_files(dir, slash ? slash + 1 : prefix);
    if (old.n > 0 && !overwrite) {
        fail("'%s' already has %d file(s) of an earlier run under this name (%s ...)\n  hint: --overwrite replaces them; or choose another -o",
             prefix, old.n, old.paths[0]);
    }
    for (int k = 0; k < old.n; k++) {
        const char* input = input_at(inputs, old.paths[k]);
        if (input != NULL) {
            fail("--overwrite would remove '%s', which is the input '%s' of this run\n  hint: choose another -o, or move the input", old.paths[k], input);
        }
    }
    for (int k = 0; k < old.n; k++) {
        if (remove(old.paths[k]) != 0) { fail("--overwrite: cannot remove '%s': %s", old.paths[k], strerror(errno)); }
        printf("removed %s (--overwrite: a file of an earlier run under -o '%s')\n", old.paths[k], prefix);
    }
    free(old.paths);
}

// ----------------------------------------------------------------------------
// encoding: a block of one document, scanned against the bytes after it

#define CACHE_SLOTS (1 << 16)   // words a thread remembers (direct mapped)
#define CACHE_WORD_MAX 15       // words up to this many bytes are cached (nearly all of them)
typedef struct {
    unsigned char len;          // 0: empty
    unsigned char num_ids;
    unsigned char bytes[CACHE_WORD_MAX];
    uint16_t ids[CACHE_WORD_MAX];
} CachedWord;

static uint32_t word_hash(const unsigned char* s, size_t n) {
    uint32_t h = 2166136261u;  // FNV-1a
    for (size_t i = 0; i < n; i++) { h = (h ^ s[i]) * 16777619u; }
    return h;
}

// one word's ids (room for n): from the thread's cache, else by BPE (and then cached)
static size_t encode_word_cached(const Bpe* bpe, CachedWord* cache, const unsigned char* w, size_t n, int* ids) {
    if (n == 1) { ids[0] = bpe->byte_id[w[0]]; return 1; }
    if (n > CACHE_WORD_MAX) { return bpe_encode_word(bpe, w, n, ids); }
    CachedWord* c = &cache[word_hash(w, n) & (CACHE_SLOTS - 1)];
    if (c->len == n && memcmp(c->bytes, w, n) == 0) {
        for (int k = 0; k < c->num_ids; k++) { ids[k] = c->ids[k]; }
        return c->num_ids;
    }
    size_t m = bpe_encode_word(bpe, w, n, ids);
    c->len = (unsigned char)n;
    c->num_ids = (unsigned char)m;
    memcpy(c->bytes, w, n);
    for (size_t k = 0; k < m; k++) { c->ids[k] = (uint16_t)ids[k]; }
    return m;
}

// the ids of the words that start in s[0..len), which ends where a word ends; the scan may look at
// s[len..len+ctx) (the document's next character) to see where words end, as it would in the
// whole document
static size_t encode_block(const Bpe* bpe, CachedWord* cache, const unsigned char* s, size_t len, size_t ctx, int* ids) {
    size_t n = 0;
    for (size_t i = 0, end; i < len; i = end) {
        end = bpe_word_end(s, len + ctx, i);
        n += encode_word_cached(bpe, cache, s + i, end - i, ids + n);
    }
    return n;
}

// ----------------------------------------------------------------------------
// blocks: the text cut where a word must end, gathered for the threads

typedef struct { size_t off, len, ctx; int starts_doc; } Block;

typedef struct {
    const Bpe* bpe;
    int eot;
    size_t block_size, batch_bytes;
    Utf8Out text;               // the blocks' bytes (each followed by its ctx bytes)
    Block* blocks;
    size_t num_blocks, cap_blocks;
    int* ids;                   // the blocks' ids, block k's at ids_off[k]
    size_t* ids_off;
    size_t* ids_len;
    size_t ids_cap;
    CachedWord** caches;        // one a thread
    int num_threads;
    int doc_open;               // the document's EOT is not yet out
    Writer* writer;
    // progress
    long long bytes_in, bytes_total, documents, tokens;
    double start, last_print;
    int tty;
} Batch;

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void progress(Batch* b, int final) {
    double t = now_seconds(), elapsed = t - b->start;
    if (!final && t - b->last_print < (b->tty ? 0.25 : 10.0)) { return; }
    b->last_print = t;
    double mbs = elapsed > 0 ? b->bytes_in / 1e6 / elapsed : 0;
    char eta[32] = "";
    if (!final && b->bytes_total > 0 && mbs > 0) {
        double left = (b->bytes_total - b->bytes_in) / 1e6 / mbs;
        snprintf(eta, sizeof(eta), ", ETA %d:%02d", (int)(left / 60), (int)fmod(left, 60));
    }
    char total[32] = "";
    if (b->bytes_total > 0) { snprintf(total, sizeof(total), " of %.1f", b->bytes_total / 1e6); }
    fprintf(stderr, "%s%.1f%s MB, %lld documents, %lld tokens, %.1f MB/s (%d threads)%s%s", b->tty && !final ? "\r" : "",
            b->bytes_in / 1e6, total, b->documents, b->tokens, mbs, b->num_threads, eta, b->tty && !final ? "   " : "\n");
}

// encodes the gathered blocks on all threads, then hands their ids to the writer in order
static void batch_run(Batch* b) {
    size_t need = 0;
    for (size_t k = 0; k < b->num_blocks; k++) { b->ids_off[k] = need; need += b->blocks[k].len + 1; }
    if (need > b->ids_cap) {
        free(b->ids);
        b->ids_cap = need;
        b->ids = (int*)malloc_check(need * sizeof(int));
    }
    #pragma omp parallel for schedule(dynamic, 1)
    for (long k = 0; k < (long)b->num_blocks; k++) {
        const Block* bl = &b->blocks[k];
        int* out = b->ids + b->ids_off[k];
        size_t n = 0;
        if (bl->starts_doc) { out[n++] = b->eot; }
        n += encode_block(b->bpe, b->caches[omp_get_thread_num()], b->text.data + bl->off, bl->len, bl->ctx, out + n);
        b->ids_len[k] = n;
    }
    for (size_t k = 0; k < b->num_blocks; k++) {
        writer_push(b->writer, b->ids + b->ids_off[k], b->ids_len[k]);
        b->tokens += (long long)b->ids_len[k];
    }
    b->num_blocks = 0;
    b->text.len = 0;
    progress(b, 0);
}

static void batch_add(Batch* b, const unsigned char* s, size_t len, size_t ctx, int starts_doc) {
    if (b->num_blocks == b->cap_blocks) {
        b->cap_blocks = b->cap_blocks ? 2 * b->cap_blocks : 1024;
        b->blocks = realloc(b->blocks, b->cap_blocks * sizeof(Block));
        b->ids_off = realloc(b->ids_off, b->cap_blocks * sizeof(size_t));
        b->ids_len = realloc(b->ids_len, b->cap_blocks * sizeof(size_t));
        if (!b->blocks || !b->ids_off || !b->ids_len) { fail("out of host memory"); }
    }
    Block* bl = &b->blocks[b->num_blocks++];
    bl->off = b->text.len;
    bl->len = len;
    bl->ctx = ctx;
    bl->starts_doc = starts_doc;
    out_append(&b->text, s, len + ctx);
    if (b->text.len >= b->batch_bytes) { batch_run(b); }
}

// the length of the character that ends just before s[i] (valid UTF-8)
static size_t char_before(const unsigned char* s, size_t i) {
    size_t k = 1;
    while (k < i && k < MAX_LOOKAHEAD && (s[i - k] & 0xC0) == 0x80) { k++; }
    return k;
}

// a word of GPT-2's pre-tokenizer ends at i (0 < i < n, s valid UTF-8 whole to n): the character
// before i is not white space and the one at i is. No alternative of the regex runs from a
// character that is not white space into one that is (the optional space only leads a word), so
// every scan has a word end there, and the scan from i on is the whole document's
static int word_must_end(const unsigned char* s, size_t n, size_t i) {
    size_t len;
    if (s[i] < 0x80 ? !(s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r')) : bpe_class_at(s, n, i, &len) != BPE_SPACE) { return 0; }
    size_t back = char_before(s, i);
    return bpe_class_at(s, i, i - back, &len) != BPE_SPACE;
}

// where to end the next block of s[pos..n): the last word end in (pos, pos + block], else the first
// after it that has its next character whole before n; 0 if there is none
static size_t next_cut(const unsigned char* s, size_t pos, size_t n, size_t block) {
    size_t limit = pos + block < n ? pos + block : n;
    for (size_t i = limit; i > pos; i--) {
        if ((s[i] & 0xC0) != 0x80 && i + MAX_LOOKAHEAD <= n && word_must_end(s, n, i)) { return i; }
    }
    for (size_t i = limit + 1; i + MAX_LOOKAHEAD <= n; i++) {
        if ((s[i] & 0xC0) != 0x80 && word_must_end(s, n, i)) { return i; }
    }
    return 0;
}

// hands the document text s[0..n) to the batch in blocks; *doc_open: the document's EOT is not
// yet out. With ends, all of it (the document ends at n); else only up to the last cut that
// leaves less than a block, returning how much it took (the caller keeps the rest)
static size_t batch_document(Batch* b, const unsigned char* s, size_t n, int ends, int* doc_open) {
    size_t pos = 0;
    while (n - pos > b->block_size + MAX_LOOKAHEAD) {
        size_t cut = next_cut(s, pos, n, b->block_size);
        if (cut == 0) { break; }  // no place to cut: one block to the end (or more text first)
        batch_add(b, s + pos, cut - pos, MAX_LOOKAHEAD, *doc_open);
        *doc_open = 0;
        pos = cut;
    }
    if (!ends) { return pos; }
    batch_add(b, s + pos, n - pos, 0, *doc_open);
    *doc_open = 0;
    b->documents++;
    return n;
}

// the readers' sink (text_input.h): a document's text into blocks; a new document after one ends
static size_t batch_sink(void* ctx, const unsigned char* text, size_t n, int ends) {
    Batch* b = (Batch*)ctx;
    size_t took = batch_document(b, text, n, ends, &b->doc_open);
    if (ends) { b->doc_open = 1; }
    return took;
}

// ----------------------------------------------------------------------------

static const char* bpe_dir_found(const Options* o) {
    char path[PREP_PATH_LEN + 32];
    snprintf(path, sizeof(path), "%s/%s", o->bpe_dir, BPE_ENCODER_JSON);
    if (given_bpe || access(path, R_OK) == 0) { return o->bpe_dir; }
    return SHARED_BPE_DIR;
}

static void check_options(const Options* o) {
    if (o->out[0] == '\0') { fail("no output given\n  hint: -o data/mine/mine writes data/mine/mine_val_000000.bin, data/mine/mine_train_000001.bin, ..."); }
    if (o->num_inputs == 0) { fail("no input given\n  hint: name files, folders or - (standard input) after the flags; prepare_tokens -h"); }
    if (!is_whole(o->shard_tokens) || o->shard_tokens < 1 || o->shard_tokens > INT_MAX) {
        fail("--shard-tokens %.0f: want a whole number from 1 to %d (the shard header's token count is an int32)", o->shard_tokens, INT_MAX);
    }
    if (o->val_tokens != -1 && (!is_whole(o->val_tokens) || o->val_tokens > 1e18)) { fail("--val-tokens %g: want a whole number of tokens, 0 or more", o->val_tokens); }
    if (o->val_tokens != -1 && given_val_fraction) { fail("--val-tokens and --val-fraction both given\n  hint: the split is one or the other"); }
    if (!(o->val_fraction >= 0 && o->val_fraction <= 1)) { fail("--val-fraction %g: want a fraction from 0 to 1", o->val_fraction); }
    if (!is_whole(o->block_size) || o->block_size < 1 || o->block_size > 1e9) { fail("--block-size %g: want a whole number of bytes from 1 to 1G", o->block_size); }
    if (!is_whole(o->threads) || o->threads > 4096) { fail("--threads %g: want 0 (all cores) or a number of threads", o->threads); }
    int stdin_count = 0;
    for (int k = 0; k < o->num_inputs; k++) { stdin_count += strcmp(o->inputs[k], "-") == 0; }
    if (stdin_count > 1) { fail("standard input (-) given %d times\n  hint: it can be read once", stdin_count); }
}

int main(int argc, char** argv) {
    (void)MEM_CATEGORY_KEYS;  // memory.h's table, which dataloader.h brings and this program does not use
    Options o = options_default();
    parse_options(&o, argc, argv);
    if (o.help) { print_usage(stdout); return 0; }
    check_options(&o);
    static const char* const FORMATS[] = {"auto", "text", "jsonl"}, *const DOCS[] = {"file", "blank-lines"}, *const UTF8[] = {"error", "replace"};
    InputFormat format = (InputFormat)choice("--format", o.format, FORMATS, 3);
    DocSplit docs = (DocSplit)choice("--docs", o.docs, DOCS, 2);
    Utf8Mode mode = (Utf8Mode)choice("--invalid-utf8", o.invalid_utf8, UTF8, 2);
    if (o.threads > 0) { omp_set_num_threads((int)o.threads); }

    InputList inputs = inputs_list(&o, format);  // every input there before anything is written
    Bpe bpe;
    bpe_load(&bpe, bpe_dir_found(&o));
    if (bpe.vocab_size > UINT16_MAX + 1) { fail("the vocabulary has %d tokens; a shard's uint16 holds 65536", bpe.vocab_size); }

    Writer* w = &g_writer;
    snprintf(w->prefix, sizeof(w->prefix), "%s", o.out);
    w->shard_tokens = (size_t)o.shard_tokens;
    w->val_known = o.val_tokens != -1;
    w->val_target = w->val_known ? (size_t)o.val_tokens : 0;
    w->in_train = w->val_known && w->val_target == 0;
    w->val_fraction = o.val_fraction;
    snprintf(w->manifest.tokenizer, sizeof(w->manifest.tokenizer), "%s", MANIFEST_TOKENIZER);
    w->manifest.vocab_size = bpe.vocab_size;
    w->manifest.eot = bpe.vocab_size - 1;  // GPT-2's <|endoftext|> is its last id, 50256
    writer_prepare_output(o.out, (int)o.overwrite, &inputs);
    w->buf = (uint16_t*)malloc_check(w->shard_tokens * sizeof(uint16_t));
    atexit(writer_cleanup);

    Batch b;
    memset(&b, 0, sizeof(b));
    b.bpe = &bpe;
    b.eot = w->manifest.eot;
    b.writer = w;
    b.block_size = (size_t)o.block_size;
    b.num_threads = omp_get_max_threads();
    b.batch_bytes = 2 * (size_t)b.num_threads * b.block_size;
    b.caches = (CachedWord**)malloc_check((size_t)b.num_threads * sizeof(CachedWord*));
    for (int t = 0; t < b.num_threads; t++) { b.caches[t] = (CachedWord*)calloc_check(CACHE_SLOTS, sizeof(CachedWord)); }
    for (size_t k = 0; k < inputs.n; k++) { b.bytes_total += inputs.items[k].bytes > 0 ? inputs.items[k].bytes : 0; }
    b.doc_open = 1;
    b.tty = isatty(fileno(stderr));
    b.start = b.last_print = now_seconds();

    for (size_t k = 0; k < inputs.n; k++) {
        ReadSpec r = {inputs.items[k].path, mode, docs, o.field, &b.bytes_in};
        if (inputs.items[k].format == FORMAT_JSONL) { jsonl_read_file(&r, batch_sink, &b); } else { text_read_file(&r, batch_sink, &b); }
    }
    batch_run(&b);
    writer_finish(w);
    g_finished = 1;
    progress(&b, 1);
    fprintf(stderr, "%zu input file(s) -> %lld tokens (eot %d): val %zu, train %zu, in %d shard(s) %s_{val,train}_*.bin\n",
            inputs.n, b.tokens, b.eot, w->val_written, w->train_written, w->num_written, o.out);
    if (w->train_written == 0) { fprintf(stderr, "warning: no training tokens: the corpus is all validation split\n  hint: a smaller --val-tokens or --val-fraction\n"); }
    warn_short_split(w, 0);
    warn_short_split(w, 1);
    for (int t = 0; t < b.num_threads; t++) { free(b.caches[t]); }
    free(b.caches); free(b.text.data); free(b.blocks); free(b.ids); free(b.ids_off); free(b.ids_len);
    for (size_t k = 0; k < inputs.n; k++) { free(inputs.items[k].path); }
    free(inputs.items); free(w->buf); free(w->written);
    manifest_free(&w->manifest);
    bpe_free(&bpe);
    return 0;
}
