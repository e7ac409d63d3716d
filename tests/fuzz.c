/*
fuzz.c: a mutation fuzzer of everything the trainer reads from outside: the model file, a
token shard and its manifest, the training-state file, the tokenizer file, GPT-2's BPE files
(encoder.json and vocab.bpe, for --sample) and the command line; and prepare_tokens' readers of
JSON Lines and text (dev/data/text_input.h), whose output must be valid UTF-8.

    make build/fuzz && ./build/fuzz ./test_gpt [CASES [SEED]]   # CASES per target (default 5000)
    FUZZ_TARGETS='shard manifest,flags' ./build/fuzz ./test_gpt  # only these targets
    make bench-fuzz                                             # 100,000 cases per target (TARGETS=...)
    ./build/fuzz --replay TARGET FILE                           # one kept case, in this process

Each case mutates a seed (tests/fuzz_corpus.h: files that `test_gpt --write-fixtures` writes,
each accepted by its reader; for the command line, a list of valid flag sets here) with one to
three random edits (a header slot or any word set to a value that sits on a boundary, a bit
flipped, a byte changed, the file cut short or lengthened, an argument replaced, dropped,
doubled or swapped), writes it to a file and runs the reader on it in a forked child: the
readers stop through fail(), which exits. The child must, within FUZZ_CASE_SECONDS, either
exit 0 (accepted) or exit 1 through fail() with "error: ", the "(at file:line)" and the name
of what it rejects in its stderr: the file's path, or for the command line a flag. Anything
else (a signal, a sanitizer report, another exit status, a hang, a rejection that does not
say what it rejects) fails the target, and the case is kept in FUZZ_KEEP_DIR (default
/tmp/fuzz_failures) for --replay. The seed (default 1) makes a run repeatable.

Built by `make build/fuzz` with -fsanitize=address,undefined -fno-sanitize-recover=all, so a
memory error or undefined behaviour aborts the child; leaks are not checked (a reader that
stops through fail() leaves its buffers to exit()). Prints one "ok"/"FAIL" line per target
and "N passed, N failed" last (tests/check.h), for make test.
*/
#define TESTING
#include "train_gpt.c"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "dev/data/text_input.h"
#include "tests/check.h"
#include "tests/fuzz_corpus.h"

#define FUZZ_CASES_DEFAULT 5000
#define FUZZ_CASE_SECONDS 10     // a child still running then is killed: a hang
#define FUZZ_MAX_EDITS 3
#define FUZZ_MAX_APPEND 64
#define FUZZ_MAX_ARGS 48
#define FUZZ_ERR_LEN 8192
#define FUZZ_KEEP_MAX 20         // failing cases kept per target

// a sanitizer's report ends the child: a crash is a signal (abort), never exit status 1
const char* __asan_default_options(void) { return "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1"; }
const char* __ubsan_default_options(void) { return "print_stacktrace=1:halt_on_error=1:abort_on_error=1"; }

static char g_corpus[CHECKPOINT_PATH_LEN / 2];  // the directory test_gpt --write-fixtures wrote

static void corpus_path(char* out, size_t n, const char* file) { snprintf(out, n, "%s/%s", g_corpus, file); }

// ----------------------------------------------------------------------------
// the readers, each as the trainer calls it on a file from outside

static void fuzz_model(const char* path) {
    GPT2Config cfg;
    int version;
    FILE* f = model_file_open(path, &cfg, &version);
    float* params = (float*)malloc_check(gpt2_num_parameters(&cfg) * sizeof(float));
    model_file_read_params(f, path, &cfg, version, params);
    free(params);
}

static void fuzz_shard(const char* path) {
    GPT2Config cfg = FUZZ_CONFIG;
    DataLoader dl;
    dataloader_init_rule(&dl, path, FUZZ_B, FUZZ_T, 0, 1, cfg.vocab_size, SHARDS_WITHOUT_MANIFEST);  // the manifest: its own target
    for (int i = 0; i < 100; i++) { dataloader_next_batch(&dl); }  // over the end of the shard: the next epoch
    dataloader_free(&dl);
}

// the state of the corpus model's run (AdamW, one rank), read as a resume reads it: its header,
// the checks against the run and the model's weights, the data position on the corpus shard
static void fuzz_state(const char* path) {
    char model_path[CHECKPOINT_PATH_LEN], shard_path[CHECKPOINT_PATH_LEN];
    corpus_path(model_path, sizeof(model_path), FUZZ_MODEL_FILE);
    corpus_path(shard_path, sizeof(shard_path), FUZZ_SHARD_FILE);
    GPT2Config cfg;
    int version;
    FILE* f = model_file_open(model_path, &cfg, &version);
    size_t P = gpt2_num_parameters(&cfg);
    ModelSetup s;
    memset(&s, 0, sizeof(s));
    s.config = cfg;
    s.B = FUZZ_B;
    s.T = FUZZ_T;
    s.optimizer = OPT_ADAMW;
    Dist world = {0, 1, DIST_WORLD};
    setup_groups_of_one(&s, world);
    float* params = (float*)malloc_check(P * sizeof(float));
    HostView h = {NULL, optimizer_state_floats(&cfg, OPT_ADAMW, 0, 1)};
    h.opt_state = (float*)malloc_check(h.opt_floats * sizeof(float));
    model_file_read_params(f, model_path, &cfg, version, params);
    DataLoader dl;
    dataloader_init(&dl, shard_path, FUZZ_B, FUZZ_T, 0, 1, cfg.vocab_size);
    TrainState st;
    state_file_read_header(path, &st);  // as rank 0's: the ranks and the run identity
    if (st.num_processes != 1 || st.zero != 0) { fail("state file '%s' is not of one rank with --zero 0", path); }
    state_load(path, &st, &s, FUZZ_STEP, st.run_id, model_path, params_hash(params, P), h, &dl);
    dataloader_next_batch(&dl);
    dataloader_free(&dl);
    free(params);
    free(h.opt_state);
}

static void fuzz_tokenizer(const char* path) {
    Tokenizer tok;
    tokenizer_init(&tok, path);
    Utf8Printer pr = {{0}, 0, 0};
    for (uint32_t i = 0; i <= tok.vocab_size; i++) { utf8_print(&pr, tokenizer_decode(&tok, i), stdout); }
    utf8_print_end(&pr, stdout);
    tokenizer_free(&tok);
}

// GPT-2's BPE files (llmc/bpe.h, --sample's prompt), each beside the corpus's other one, then a text
// encoded: every id in the vocabulary
static void fuzz_bpe(const char* encoder_path, const char* vocab_path) {
    Bpe bpe;
    bpe_load_files(&bpe, encoder_path, vocab_path);
    const char* text = FUZZ_BPE_TEXT;
    int ids[sizeof(FUZZ_BPE_TEXT)];
    size_t n = bpe_encode(&bpe, text, strlen(text), ids);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= bpe.vocab_size) { fprintf(stderr, "id %d outside the vocabulary of %d\n", ids[i], bpe.vocab_size); abort(); }
    }
    bpe_free(&bpe);
}

static void fuzz_bpe_encoder(const char* path) {
    char vocab[CHECKPOINT_PATH_LEN];
    corpus_path(vocab, sizeof(vocab), FUZZ_BPE_VOCAB_FILE);
    fuzz_bpe(path, vocab);
}

static void fuzz_bpe_vocab(const char* path) {
    char encoder[CHECKPOINT_PATH_LEN];
    corpus_path(encoder, sizeof(encoder), FUZZ_BPE_ENCODER_FILE);
    fuzz_bpe(encoder, path);
}

// the rendezvous's messages (llmc/rendezvous_proto.h), each as the other side parses bytes from the network:
// rank 0 a peer's HELLO (then judges it and answers), a peer rank 0's ANSWER to its HELLO. The bytes sit in
// an allocation of their own size, so that a parser reading past them is a sanitizer's report
#define FUZZ_RDV_READ_MAX (RENDEZVOUS_ANSWER_BYTES(FUZZ_RDV_ID_BYTES) + FUZZ_MAX_EDITS * FUZZ_MAX_APPEND)

static uint8_t* fuzz_rdv_read(const char* path, size_t* n) {
    uint8_t buf[FUZZ_RDV_READ_MAX];
    FILE* f = fopen_check(path, "rb");
    *n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    uint8_t* msg = (uint8_t*)malloc_check(*n ? *n : 1);
    memcpy(msg, buf, *n);
    return msg;
}

static void fuzz_rdv_hello(const char* path) {
    uint8_t answer[RENDEZVOUS_ANSWER_BYTES(FUZZ_RDV_ID_BYTES)], id[FUZZ_RDV_ID_BYTES] = {0};
    size_t n;
    uint8_t* msg = fuzz_rdv_read(path, &n);
    RendezvousKeys k;
    rendezvous_keys(&k, FUZZ_RDV_SECRET, strlen(FUZZ_RDV_SECRET));
    static RendezvousExchange x;
    char why[RENDEZVOUS_WHY_LEN];
    if (!rendezvous_read_hello(&k, &x, msg, n, why, sizeof(why))) { fail("rendezvous HELLO %s refused: %s", path, why); }
    RendezvousParty me = {0, 2, FUZZ_RDV_SETTINGS, 0};
    int taken[2] = {0, 0};
    int status = rendezvous_judge(&x, &me, taken);
    uint8_t nonce[RENDEZVOUS_NONCE_BYTES] = {0};
    rendezvous_answer(&k, &x, &me, status, nonce, id, sizeof(id), answer);
    if (status != RDV_OK) { rendezvous_refusal(&x, why, sizeof(why)); fail("rendezvous HELLO %s refused: %s", path, why); }
    free(msg);
}

static void fuzz_rdv_answer(const char* path) {
    uint8_t hello[RENDEZVOUS_HELLO_BYTES], id[FUZZ_RDV_ID_BYTES];
    size_t n;
    uint8_t* msg = fuzz_rdv_read(path, &n);
    RendezvousKeys k;
    static RendezvousExchange x;
    fuzz_rdv_exchange(&k, &x, hello, NULL);
    char why[RENDEZVOUS_WHY_LEN];
    int r = rendezvous_read_answer(&k, &x, msg, n, id, sizeof(id), why, sizeof(why));
    if (r != 1) { fail("rendezvous ANSWER %s %s: %s", path, r == 0 ? "is a refusal" : "cannot be trusted", why); }
    for (int i = 0; i < FUZZ_RDV_ID_BYTES; i++) {
        if (id[i] != (uint8_t)i) { fprintf(stderr, "an ANSWER taken with the wrong id: byte %d is %d\n", i, id[i]); abort(); }
    }
    free(msg);
}

// the manifest of the corpus shard (llmc/manifest.h), read and the shard checked against it, as
// dataloader_init does for a set of one shard
static void fuzz_manifest(const char* path) {
    char shard_path[CHECKPOINT_PATH_LEN];
    corpus_path(shard_path, sizeof(shard_path), FUZZ_SHARD_FILE);
    GPT2Config cfg = FUZZ_CONFIG;
    FILE* f = fopen_check(shard_path, "rb");
    size_t tokens = shard_check(shard_path, f, 1, 0);
    uint32_t sum = shard_check_tokens(shard_path, f, tokens, cfg.vocab_size);
    fclose(f);
    ShardManifest sm;
    memset(&sm, 0, sizeof(sm));
    snprintf(sm.path, sizeof(sm.path), "%s", path);
    manifest_read(path, &sm.m);
    sm.matched = (unsigned char*)calloc_check((size_t)sm.m.num_shards + 1, 1);
    manifest_check_shard(&sm, 1, shard_path, tokens, sum, cfg.vocab_size);
    manifest_check_whole(&sm, 1, shard_path);
    manifest_free(&sm.m);
    free(sm.matched);
}

// prepare_tokens' readers (dev/data/text_input.h) as it reads a file: what they hand on is whole
// UTF-8 characters, valid, which the corpus's small BPE encodes into ids of its vocabulary
static size_t fuzz_text_sink(void* ctx, const unsigned char* text, size_t n, int ends) {
    const Bpe* bpe = (const Bpe*)ctx;
    size_t take = n;
    if (!ends) { while (take > 0 && (text[take - 1] & 0xC0) == 0x80) { take--; } take -= take > 0; }  // whole characters
    if (bpe_utf8_error((const char*)text, take) != take) { fprintf(stderr, "a reader handed on invalid UTF-8\n"); abort(); }
    int* ids = (int*)malloc_check((take + 1) * sizeof(int));
    size_t m = bpe_encode(bpe, (const char*)text, take, ids);
    for (size_t i = 0; i < m; i++) {
        if (ids[i] < 0 || ids[i] >= bpe->vocab_size) { fprintf(stderr, "id %d outside the vocabulary\n", ids[i]); abort(); }
    }
    free(ids);
    return take;
}

static void fuzz_read_input(const char* path, int jsonl) {
    char encoder[CHECKPOINT_PATH_LEN], vocab[CHECKPOINT_PATH_LEN];
    corpus_path(encoder, sizeof(encoder), FUZZ_BPE_ENCODER_FILE);
    corpus_path(vocab, sizeof(vocab), FUZZ_BPE_VOCAB_FILE);
    Bpe bpe;
    bpe_load_files(&bpe, encoder, vocab);
    // JSON Lines with invalid UTF-8 replaced (python's decode); text refused at the first invalid byte
    ReadSpec r = {path, jsonl ? UTF8_REPLACE : UTF8_ERROR, DOCS_BLANK_LINES, "text", NULL};
    if (jsonl) { jsonl_read_file(&r, fuzz_text_sink, &bpe); } else { text_read_file(&r, fuzz_text_sink, &bpe); }
    bpe_free(&bpe);
}

static void fuzz_jsonl(const char* path) { fuzz_read_input(path, 1); }
static void fuzz_text(const char* path) { fuzz_read_input(path, 0); }

// ----------------------------------------------------------------------------
// the command line: parsed, then checked and planned as the trainer does for the tiny preset

static const char* const FLAG_SEEDS[][16] = {
    {"-e", "tiny", "-b", "4", "-t", "64", "-d", "-1", "-x", "10"},
    {"--plan", "-e", "d12", "--zero", "1", "--plan-ranks", "8", "-b", "8", "-t", "1024"},
    {"-l", "1e-3", "--eps", "1e-8", "-q", "0.1", "--beta1", "0.9", "--beta2", "0.95", "-c", "0.1", "--grad-clip", "1"},
    {"--optimizer", "adafactor", "--relative-step", "--adafactor-beta1", "0.9", "--eps1", "1e-30"},
    {"--recompute", "1,gelu", "--offload", "1", "-b", "2", "-t", "16"},  // tiny has L=2: sqrt would be one segment, nothing to offload
    {"-y", "-o", "out", "--keep-checkpoints", "3", "-n", "5", "--check-replicas", "0"},
    {"--steps=10", "-v", "0", "-m", "1", "-s", "0", "-g", "8", "--seed=7", "-u", "2"},
    {"-o", "out", "--overwrite", "--optimizer=came", "--recompute=2,attn", "-d", "512"},
    {"--plan", "-e", "tiny", "-b", "2", "-t", "16", "--max-memory", "24GiB", "--plan-ranks", "2"},
    {"--plan", "-e", "tiny", "--max-memory=1.5MiB", "-b", "1", "-t", "8", "--recompute", "1"},
};
#define NUM_FLAG_SEEDS ((int)(sizeof(FLAG_SEEDS) / sizeof(FLAG_SEEDS[0])))
static const char* const FLAG_VALUES[] = {
    "0", "1", "-1", "2", "3", "7", "64", "1023", "1024", "1025", "65536", "-2147483648", "2147483647", "2147483648",
    "4194304", "67108864", "99999999999999999999", "1e39", "-1e39", "1e-45", "inf", "-inf", "nan", "0.5", "1.0", "-0",
    "0x10", "", "=", "-", "--", "none", "sqrt", "sqrt,sqrt", "none,gelu", "0,gelu", "gelu,attn,1", "adamw", "sgd", "tiny",
    "d60", "18446744073709551616", "24GiB", "0.5KiB", "1.5", "free", "24GB", "4611686018427387905", "8TiB",
};
#define NUM_FLAG_VALUES ((int)(sizeof(FLAG_VALUES) / sizeof(FLAG_VALUES[0])))

// a flag set written one argument a line (what --replay reads)
typedef struct { int argc; char* argv[FUZZ_MAX_ARGS + 1]; char text[FUZZ_MAX_ARGS][PATH_MAX_LEN + 64]; } ArgList;

static void fuzz_flags_args(int argc, char** argv) {
    TrainOptions o = options_default();
    if (parse_flags(&o, argc, argv)) { return; }  // -h
    GPT2Config cfg;
    gpt2_config_preset(&cfg, "tiny");
    int world = o.plan_only && o.plan_ranks > 0 ? o.plan_ranks : 1;
    check_options(&o, &cfg, world);
    int offload_acts;
    OptOffload offload_opt;
    offload_parse(o.offload, &offload_acts, &offload_opt);
    ActPolicy act = act_policy_parse(o.recompute, offload_acts, cfg.num_layers, attention_from_flag(o.attention, &cfg));
    act_policy_set_loss_chunk(&act, o.loss_chunk);
    OptimizerKind kind = (OptimizerKind)optimizer_from_name(o.optimizer);
    Precision precision = precision_from_flag(o.precision);
    PlanInputs in = {o.batch_size, o.seq_len, 2, kind, kind == OPT_ADAFACTOR && o.adafactor_beta1 > 0.0f, act, offload_opt, world, o.zero,
                     gpt2_layout(&cfg, o.batch_size, o.seq_len, precision, &act),
                     qstate_format_from_name(o.optimizer_state), 0, 0};  // (check_options: a known format); no --pp
    MemPlan plan = plan_memory(&cfg, in);
    (void)plan;
    // --plan as the trainer runs it: with a budget, the search of every combination of the memory
    // flags under the fail() trap (nothing is allocated)
    if (o.plan_only) {
        Dist single = {0, 1, DIST_WORLD};
        run_training(&o, &single, "train_gpt");
    }
}

// reads a flag set from path, one argument a line
static void fuzz_flags(const char* path) {
    static ArgList a;
    FILE* f = fopen_check(path, "rb");
    a.argc = 1;
    a.argv[0] = (char*)"train_gpt";
    while (a.argc < FUZZ_MAX_ARGS && fgets(a.text[a.argc], sizeof(a.text[0]), f) != NULL) {
        a.text[a.argc][strcspn(a.text[a.argc], "\n")] = '\0';
        a.argv[a.argc] = a.text[a.argc];
        a.argc++;
    }
    fclose(f);
    fuzz_flags_args(a.argc, a.argv);
}

// ----------------------------------------------------------------------------
// mutations

typedef struct { unsigned char* data; size_t size, cap; } Bytes;

static const int32_t BOUNDARY_INTS[] = {
    0, 1, -1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 63, 64, 127, 128, 255, 256, 1023, 1024, 1025, 65535, 65536, 65537,
    1 << 20, (1 << 20) + 1, 1 << 24, (1 << 24) + 1, 0x7fffffff, (int32_t)0x80000000, 0x3fffffff, -2,
    0x7fc00000, 0x7f800000, (int32_t)0xff800000,                       // NaN, +inf, -inf as floats
    20240326, 20240520, 20261121, 20240328,                            // every format's magic
};
#define NUM_BOUNDARY_INTS ((int)(sizeof(BOUNDARY_INTS) / sizeof(BOUNDARY_INTS[0])))
#define FUZZ_HEADER_SLOTS 24  // the slots any format uses (the state's reach slot 21)

static uint32_t fuzz_rand(uint64_t* rng, uint32_t n) { return n ? rand_u32(rng) % n : 0; }

static void put_int(Bytes* b, size_t at, int32_t v) {
    if (at + 4 <= b->size) { memcpy(b->data + at, &v, 4); }
}

static void mutate_bytes(Bytes* b, uint64_t* rng) {
    int edits = 1 + (int)fuzz_rand(rng, FUZZ_MAX_EDITS);
    for (int e = 0; e < edits; e++) {
        switch (fuzz_rand(rng, 8)) {
            case 0: case 1: {  // a header slot on a boundary, or off by one from what it holds
                size_t at = 4 * fuzz_rand(rng, FUZZ_HEADER_SLOTS);
                int32_t old = 0;
                if (at + 4 <= b->size) { memcpy(&old, b->data + at, 4); }
                int32_t v = fuzz_rand(rng, 3) == 0 ? (int32_t)((uint32_t)old + (fuzz_rand(rng, 2) ? 1u : 0xffffffffu)) : BOUNDARY_INTS[fuzz_rand(rng, NUM_BOUNDARY_INTS)];
                put_int(b, at, v);
                break;
            }
            case 2:  // any word on a boundary (a weight NaN, a token count, ...)
                put_int(b, 4 * fuzz_rand(rng, (uint32_t)(b->size / 4)), BOUNDARY_INTS[fuzz_rand(rng, NUM_BOUNDARY_INTS)]);
                break;
            case 3:  // a bit
                if (b->size) { b->data[fuzz_rand(rng, (uint32_t)b->size)] ^= (unsigned char)(1u << fuzz_rand(rng, 8)); }
                break;
            case 4:  // a byte
                if (b->size) { b->data[fuzz_rand(rng, (uint32_t)b->size)] = (unsigned char)fuzz_rand(rng, 256); }
                break;
            case 5: {  // a 16-bit token on a boundary
                static const uint16_t tokens[] = {0, 15, 16, 17, 255, 0x7fff, 0x8000, 0xffff};
                size_t at = 2 * fuzz_rand(rng, (uint32_t)(b->size / 2));
                if (at + 2 <= b->size) { memcpy(b->data + at, &tokens[fuzz_rand(rng, 8)], 2); }
                break;
            }
            case 6:  // cut short, often inside the header
                b->size = fuzz_rand(rng, 2) ? fuzz_rand(rng, (uint32_t)b->size + 1) : fuzz_rand(rng, 1100 < b->size ? 1100 : (uint32_t)b->size + 1);
                break;
            default: {  // lengthened with random bytes
                size_t n = 1 + fuzz_rand(rng, FUZZ_MAX_APPEND);
                if (b->size + n <= b->cap) {
                    for (size_t i = 0; i < n; i++) { b->data[b->size + i] = (unsigned char)fuzz_rand(rng, 256); }
                    b->size += n;
                }
            }
        }
    }
}

static void mutate_args(ArgList* a, uint64_t* rng) {
    int edits = 1 + (int)fuzz_rand(rng, FUZZ_MAX_EDITS);
    for (int e = 0; e < edits; e++) {
        int i = a->argc > 1 ? 1 + (int)fuzz_rand(rng, (uint32_t)(a->argc - 1)) : 1;
        const FlagSpec* f = &FLAGS[fuzz_rand(rng, NUM_FLAGS)];
        const char* flag = f->shortname && fuzz_rand(rng, 2) ? f->shortname : f->longname;
        const char* value = FLAG_VALUES[fuzz_rand(rng, NUM_FLAG_VALUES)];
        switch (fuzz_rand(rng, 6)) {
            case 0: if (i < a->argc) { snprintf(a->text[i], sizeof(a->text[i]), "%s", value); } break;  // a value
            case 1: if (i < a->argc) { snprintf(a->text[i], sizeof(a->text[i]), "%s", flag); } break;   // a flag
            case 2: if (a->argc + 2 <= FUZZ_MAX_ARGS) {                                               // a flag and a value
                snprintf(a->text[a->argc], sizeof(a->text[0]), "%s", flag);
                snprintf(a->text[a->argc + 1], sizeof(a->text[0]), "%s", value);
                a->argc += 2;
            } break;
            case 3: if (a->argc < FUZZ_MAX_ARGS) {                                                    // --name=value
                snprintf(a->text[a->argc], sizeof(a->text[0]), "%s=%s", f->longname, value);
                a->argc++;
            } break;
            case 4: if (i < a->argc) {                                                                  // dropped
                for (int k = i; k + 1 < a->argc; k++) { memcpy(a->text[k], a->text[k + 1], sizeof(a->text[0])); }
                a->argc--;
            } break;
            default: if (a->argc < FUZZ_MAX_ARGS && i < a->argc) {                                    // doubled
                memcpy(a->text[a->argc], a->text[i], sizeof(a->text[0]));
                a->argc++;
            }
        }
    }
    if (fuzz_rand(rng, 50) == 0 && a->argc > 1) {  // now and then a value longer than any path
        int i = 1 + (int)fuzz_rand(rng, (uint32_t)(a->argc - 1));
        memset(a->text[i], 'x', sizeof(a->text[i]) - 1);
        a->text[i][sizeof(a->text[i]) - 1] = '\0';
    }
    for (int i = 0; i < a->argc; i++) { a->argv[i] = a->text[i]; }
    a->argv[a->argc] = NULL;
}

// ----------------------------------------------------------------------------
// one case in a child process, and what its end says

typedef enum { CASE_ACCEPTED, CASE_REJECTED, CASE_BAD } CaseResult;

// the parent writes and reads the cases with plain system calls: no malloc per case, so its
// heap (and ASan's quarantine of freed blocks, which every fork copies) does not grow
static void write_file(const char* path, const void* data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, data, n) != (ssize_t)n || close(fd) != 0) { fail("cannot write '%s': %s", path, strerror(errno)); }
}

static size_t read_text(const char* path, char* buf, size_t cap) {
    int fd = open(path, O_RDONLY);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, cap - 1);
    if (fd >= 0) { close(fd); }
    buf[n > 0 ? n : 0] = '\0';
    return n > 0 ? (size_t)n : 0;
}

// runs reader(path) in a child; what_named: what a rejection must name (the path, or NULL: a flag)
static CaseResult run_case(void (*reader)(const char*), const char* path, const char* err_path, char* why, size_t why_n) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) { fail("fork: %s", strerror(errno)); }
    if (pid == 0) {
        if (freopen("/dev/null", "w", stdout) == NULL || freopen(err_path, "w", stderr) == NULL) { _exit(3); }
        alarm(FUZZ_CASE_SECONDS);
        reader(path);
        exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    char err[FUZZ_ERR_LEN];
    size_t n = read_text(err_path, err, sizeof(err));
    if (WIFSIGNALED(status)) {
        snprintf(why, why_n, "%s (signal %d): %.600s", WTERMSIG(status) == SIGALRM ? "hang" : "crash", WTERMSIG(status), err);
        return CASE_BAD;
    }
    int code = WEXITSTATUS(status);
    if (code == 0 && n == 0) { return CASE_ACCEPTED; }
    int names = reader == fuzz_flags ? (strstr(err, "flag") != NULL || strstr(err, " -") != NULL || strstr(err, "error: -") != NULL)
                                     : strstr(err, path) != NULL;
    if (code == 1 && strncmp(err, "error: ", 7) == 0 && strstr(err, "(at ") != NULL && names) { return CASE_REJECTED; }
    snprintf(why, why_n, "exit status %d, stderr %s: %.600s", code,
             code == 0 ? "not empty" : !names ? "does not name what it rejects" : "is not fail()'s", err);
    return CASE_BAD;
}

typedef struct {
    const char* name;
    void (*reader)(const char*);
    const char* seed;  // the corpus file; NULL: the command line
} FuzzTarget;

static const FuzzTarget TARGETS[] = {
    {"model file", fuzz_model, FUZZ_MODEL_FILE},
    {"token shard", fuzz_shard, FUZZ_SHARD_FILE},
    {"training state", fuzz_state, FUZZ_STATE_FILE},
    {"tokenizer", fuzz_tokenizer, FUZZ_TOKENIZER_FILE},
    {"BPE encoder.json", fuzz_bpe_encoder, FUZZ_BPE_ENCODER_FILE},
    {"BPE vocab.bpe", fuzz_bpe_vocab, FUZZ_BPE_VOCAB_FILE},
    {"flags", fuzz_flags, NULL},
    {"rendezvous HELLO (rank 0 reads)", fuzz_rdv_hello, FUZZ_RDV_HELLO_FILE},
    {"rendezvous ANSWER (a rank reads)", fuzz_rdv_answer, FUZZ_RDV_ANSWER_FILE},
    {"shard manifest", fuzz_manifest, FUZZ_MANIFEST_FILE},
    {"prepare_tokens JSON Lines", fuzz_jsonl, FUZZ_JSONL_FILE},
    {"prepare_tokens text", fuzz_text, FUZZ_TEXT_FILE},
};
#define NUM_TARGETS ((int)(sizeof(TARGETS) / sizeof(TARGETS[0])))

static unsigned char* read_file(const char* path, size_t* n) {
    FILE* f = fopen_check(path, "rb");
    long size = file_size(f);
    unsigned char* data = (unsigned char*)malloc_check((size_t)size + 1);
    fread_check(data, 1, (size_t)size, f);
    fclose(f);
    *n = (size_t)size;
    return data;
}

// the seed accepted, then `cases` mutations of it; returns the failing cases
static void fuzz_target(const FuzzTarget* t, const char* work, int cases, uint64_t seed, const char* keep_dir) {
    char path[CHECKPOINT_PATH_LEN], err_path[CHECKPOINT_PATH_LEN], why[1024], first[1200] = "";
    snprintf(path, sizeof(path), "%s/case.bin", work);
    snprintf(err_path, sizeof(err_path), "%s/stderr.txt", work);
    size_t seed_size = 0;
    unsigned char* seed_bytes = NULL;
    if (t->seed) {
        char seed_path[CHECKPOINT_PATH_LEN];
        corpus_path(seed_path, sizeof(seed_path), t->seed);
        seed_bytes = read_file(seed_path, &seed_size);
    }
    Bytes b = {(unsigned char*)malloc_check(seed_size + FUZZ_MAX_EDITS * FUZZ_MAX_APPEND + 1), 0, seed_size + FUZZ_MAX_EDITS * FUZZ_MAX_APPEND};
    static ArgList a;
    uint64_t rng = RNG_SEED_MIX ^ (seed * 1000003 + (uint64_t)(t - TARGETS));
    int counts[3] = {0, 0, 0}, kept = 0;
    double t0 = now_seconds();
    for (int c = 0; c <= cases; c++) {  // case 0: the seed itself, which must be accepted
        if (t->seed) {
            memcpy(b.data, seed_bytes, seed_size);
            b.size = seed_size;
            if (c > 0) { mutate_bytes(&b, &rng); }
            write_file(path, b.data, b.size);
        } else {
            const char* const* s = FLAG_SEEDS[fuzz_rand(&rng, NUM_FLAG_SEEDS)];
            a.argc = 1;
            snprintf(a.text[0], sizeof(a.text[0]), "train_gpt");
            for (int i = 0; i < 16 && s[i]; i++) { snprintf(a.text[a.argc++], sizeof(a.text[0]), "%s", s[i]); }
            if (c > 0) { mutate_args(&a, &rng); }
            static char lines[FUZZ_MAX_ARGS * (PATH_MAX_LEN + 65)];
            size_t used = 0;
            for (int i = 1; i < a.argc; i++) { used += (size_t)snprintf(lines + used, sizeof(lines) - used, "%s\n", a.text[i]); }
            write_file(path, lines, used);
        }
        CaseResult r = run_case(t->reader, path, err_path, why, sizeof(why));
        counts[r]++;
        if (c == 0 && r != CASE_ACCEPTED) { snprintf(first, sizeof(first), "the seed itself is not accepted: %s", why); }
        if (r == CASE_BAD) {
            if (first[0] == '\0') { snprintf(first, sizeof(first), "case %d: %s", c, why); }
            if (kept < FUZZ_KEEP_MAX) {
                char keep[CHECKPOINT_PATH_LEN + 64], cmd[3 * CHECKPOINT_PATH_LEN];
                snprintf(keep, sizeof(keep), "%s/%s_%d.bin", keep_dir, t->seed ? t->seed : "flags", c);
                snprintf(cmd, sizeof(cmd), "mkdir -p '%s' && cp '%s' '%s'", keep_dir, path, keep);
                if (system(cmd) == 0) { printf("  kept %s: %.300s\n", keep, why); kept++; }
            }
        }
    }
    char name[256];
    snprintf(name, sizeof(name), "fuzz %s: %d cases in %.0f s, each accepted (%d) or rejected naming the %s (%d)",
             t->name, cases, now_seconds() - t0, counts[CASE_ACCEPTED], t->seed ? "file" : "flag", counts[CASE_REJECTED]);
    check(counts[CASE_BAD] == 0 && first[0] == '\0', name, "%d bad case(s) (a crash, a sanitizer report, a hang or a rejection "
          "that does not name what it rejects); first %s (replay: ./build/fuzz --replay '%s' FILE)", counts[CASE_BAD], first, t->name);
    free(b.data);
    free(seed_bytes);
}

// 1 if name is one of the comma-separated names of list
static int name_in_list(const char* name, const char* list) {
    size_t n = strlen(name);
    for (const char* p = list; *p != '\0';) {
        size_t len = strcspn(p, ",");
        if (len == n && strncmp(p, name, n) == 0) { return 1; }
        p += len + (p[len] == ',');
    }
    return 0;
}

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && strcmp(argv[1], "--replay") == 0) {
        for (int i = 0; i < NUM_TARGETS; i++) {
            if (strcmp(argv[2], TARGETS[i].name) == 0) { TARGETS[i].reader(argv[3]); printf("accepted\n"); return 0; }
        }
        char names[1024] = "";
        for (int i = 0; i < NUM_TARGETS; i++) { snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s", i ? ", " : "", TARGETS[i].name); }
        fail("--replay: no target '%s' (%s)", argv[2], names);
    }
    if (argc < 2 || argc > 4) { fprintf(stderr, "usage: %s ./test_gpt [CASES [SEED]]\n", argv[0]); return 2; }
    int cases = argc > 2 ? atoi(argv[2]) : FUZZ_CASES_DEFAULT;
    uint64_t seed = argc > 3 ? strtoull(argv[3], NULL, 10) : 1;
    // the cases are files written and read thousands of times: in memory (tmpfs) where there is one
    struct stat st;
    char work[64];
    snprintf(work, sizeof(work), "%s/fuzz_XXXXXX", stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp");
    if (mkdtemp(work) == NULL) { fail("mkdtemp %s: %s", work, strerror(errno)); }
    snprintf(g_corpus, sizeof(g_corpus), "%s/corpus", work);
    char cmd[3 * CHECKPOINT_PATH_LEN];
    snprintf(cmd, sizeof(cmd), "'%s' --write-fixtures '%s' > /dev/null", argv[1], g_corpus);
    if (system(cmd) != 0) { fail("%s failed: the corpus comes from test_gpt --write-fixtures", cmd); }
    const char* keep = getenv("FUZZ_KEEP_DIR") ? getenv("FUZZ_KEEP_DIR") : "/tmp/fuzz_failures";
    printf("fuzzing %d cases per target, seed %llu, corpus from %s --write-fixtures\n", cases, (unsigned long long)seed, argv[1]);
    const char* only = getenv("FUZZ_TARGETS");  // a comma-separated list of target names; unset or empty: all
    int run = 0;
    double t0 = now_seconds();
    for (int i = 0; i < NUM_TARGETS; i++) {
        if (only != NULL && only[0] != '\0' && !name_in_list(TARGETS[i].name, only)) { continue; }
        fuzz_target(&TARGETS[i], work, cases, seed, keep);
        run++;
    }
    if (run == 0) { fail("FUZZ_TARGETS '%s' names no target\n  hint: names as the fuzzer prints them, comma-separated, e.g. FUZZ_TARGETS='token shard,flags'", only); }
    printf("%d target(s), %d cases each (%lld in all) in %.0f s\n", run, cases, (long long)run * (cases + 1), now_seconds() - t0);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", work);
    if (system(cmd) != 0) { printf("note: could not remove %s\n", work); }
    return check_summary();
}
