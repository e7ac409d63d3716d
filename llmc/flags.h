/*
flags.h: the trainer's options (one struct), and the one table of flags from which
both the parser and the usage text are generated, so the two cannot drift apart.

    TrainOptions opt = options_default();
    parse_flags(&opt, argc, argv);     // -x 100, --steps 100, --steps=100
    print_usage(stdout, argv[0]);      // -h
    CommandLine cl;                    // back to arguments: every flag that differs from the default
    options_to_args(&cl, &opt, NULL, 0);

Failure: an unknown flag, a missing value or a malformed number or size stops
with a message naming the flag and pointing at -h.
*/
#ifndef LLMC_FLAGS_H
#define LLMC_FLAGS_H

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "model_config.h"
#include "utils.h"

#define PATH_MAX_LEN 1024
#define FLAGS_MAX 64                 // rows the flag table may have (TrainOptions.given)

typedef struct {
    // data and model
    char train_data[PATH_MAX_LEN];   // token shard(s) to train on, a glob pattern
    char val_data[PATH_MAX_LEN];     // token shard(s) for validation, "" for none
    int no_manifest;                 // 1: read shards without a manifest (llm.c's scripts make none; dataloader.h)
    char tokenizer[PATH_MAX_LEN];    // tokenizer file for decoding samples, "" for none
    char model[PATH_MAX_LEN];        // preset dN, or a checkpoint file to start from
    char out_dir[PATH_MAX_LEN];      // checkpoints and log go here, "" for none
    // batch
    int batch_size;                  // B, sequences per micro-batch
    int seq_len;                     // T, tokens per sequence
    int total_batch_size;            // tokens per optimizer step; -1 = B*T (no accumulation)
    // optimization
    float learning_rate;             // peak learning rate
    int warmup_steps;                // linear warmup from 0 over this many steps
    float final_lr_frac;             // cosine decay ends at learning_rate * this
    float weight_decay;              // decoupled, on the 2-D weights only
    float beta1, beta2, eps;         // AdamW
    float grad_clip;                 // global gradient-norm clip, 0 = off
    char optimizer[PATH_MAX_LEN];    // adamw | adafactor | came (string flags are all this size)
    int relative_step;               // Adafactor: relative step size instead of -l
    float adafactor_beta1;           // Adafactor: first-moment decay, 0 = none (least memory)
    float eps1;                      // Adafactor, CAME: added to g^2 before the second moment
    char optimizer_state[PATH_MAX_LEN];  // fp32 | bf16 | 8bit: the optimizer's moments (llmc/quant_state.h)
    // what forward keeps for backward (llmc/act_policy.h)
    char recompute[PATH_MAX_LEN];    // none | sqrt | K | gelu | attn, comma-separated
    char offload[PATH_MAX_LEN];      // what moves to host memory, a comma list of activations (or 1), optimizer, gradients; 0 = none
    int loss_chunk;                  // tokens per chunk of the classifier and its loss (act_policy.h), 0 = all at once
    int zero;                        // data parallel over MPI ranks: 0 = replicated optimizer, 1 = ZeRO-1 sharded, 2 = ZeRO-2 (gradients too)
    int tp;                          // tensor parallel: each layer's matrices split over this many adjacent ranks (1 = none)
    int sp;                          // sequence parallel (with tp > 1): the residual stream and LayerNorms split over the ranks' rows
    int pp;                          // pipeline parallel: the layers split into this many stages, one a rank (1 = none)
    char pp_schedule[PATH_MAX_LEN];  // 1f1b | gpipe: the order of a stage's micro-batches (llmc/pipeline.h)
    int check_replicas;              // 1: compare the ranks' parameters after every step
    int plan_ranks;                  // --plan for this many ranks; 0 = the ranks of this run
    char precision[PATH_MAX_LEN];    // fp32 | bf16 | "" = the backend's default (CPU: fp32, CUDA: bf16)
    char dist_init[PATH_MAX_LEN];    // how processes that MPI does not join meet: file:DIR | tcp:HOST:PORT ("" = MPI's ranks only)
    char attention[PATH_MAX_LEN];    // flash | matmul | "" = the backend's default (CPU: matmul, CUDA: flash)
    float peak_tflops;               // peak TFLOP/s per rank for MFU; 0 = the GPU's, from the backend's table
    int profile;                     // step whose time is broken down by kind of work (llmc/profile.h); 0 = none
    int max_steps;                   // -1: one pass over the training data
    uint64_t seed;                   // initialisation and sampling
    // evaluation, sampling, checkpoints
    int val_every;                   // steps between validation losses, 0 = never
    int val_steps;                   // batches per validation
    int sample_every;                // steps between samples, 0 = never
    int gen_tokens;                  // tokens per sample
    int checkpoint_every;            // steps between checkpoints, 0 = only at the end
    int keep_checkpoints;            // keep the newest K complete checkpoints in out_dir, 0 = all
    int resume;                      // 1: continue from the latest checkpoint in out_dir
    int overwrite;                   // 1: a fresh run removes an earlier run's checkpoints and log from out_dir
    int plan_only;                   // 1: print the memory plan and exit
    uint64_t max_memory;             // bytes a rank's device categories may take (CPU: everything); BYTES_NONE, BYTES_FREE
    uint64_t max_host_memory;        // bytes a rank's host categories may take (a GPU's offload stores and host copies)
    // sampling from a model file (--sample): trains nothing, writes nothing (trainer.h)
    char sample[PATH_MAX_LEN];       // the prompt
    float temperature;               // probabilities to the power 1/temperature; 0 = greedy
    int top_k;                       // draw from the k most likely tokens; 0 = all
    char bpe_dir[PATH_MAX_LEN];      // GPT-2's encoder.json and vocab.bpe, to tokenize the prompt
    unsigned char given[FLAGS_MAX];  // given[i]: FLAGS[i] was on the command line (parse_flags)
} TrainOptions;

// the two sizes a FLAG_BYTES flag takes besides a number of bytes
#define BYTES_NONE 0            // "none": no budget
#define BYTES_FREE UINT64_MAX   // "free": the memory free when the run starts (the GPU's, or the host's available)

static TrainOptions options_default(void) {
    TrainOptions o;
    memset(&o, 0, sizeof(o));
    strcpy(o.train_data, "data/tinyshakespeare/tiny_shakespeare_train.bin");
    strcpy(o.val_data, "data/tinyshakespeare/tiny_shakespeare_val.bin");
    strcpy(o.tokenizer, "data/gpt2_tokenizer.bin");
    strcpy(o.model, "d6");
    strcpy(o.out_dir, "out");
    o.batch_size = 4;
    o.seq_len = 64;
    o.total_batch_size = -1;
    o.learning_rate = 1e-3f;
    o.warmup_steps = 10;
    o.final_lr_frac = 0.1f;
    o.weight_decay = 0.1f;
    o.beta1 = 0.9f;
    o.beta2 = 0.95f;
    o.eps = 1e-8f;
    o.grad_clip = 1.0f;
    strcpy(o.optimizer, "adamw");
    o.relative_step = 0;
    o.adafactor_beta1 = 0.0f;
    o.eps1 = 1e-30f;                 // Adafactor (Shazeer & Stern) and CAME (eps[0]) both use 1e-30
    strcpy(o.optimizer_state, "fp32");
    strcpy(o.recompute, "none");
    strcpy(o.offload, "0");
    o.loss_chunk = 0;
    o.zero = 0;
    o.tp = 1;
    o.sp = 0;
    o.pp = 1;
    strcpy(o.pp_schedule, "1f1b");
    o.check_replicas = 0;
    o.plan_ranks = 0;
    strcpy(o.precision, "");
    strcpy(o.attention, "");
    o.peak_tflops = 0.0f;
    o.profile = 0;
    o.max_steps = 200;
    o.seed = 1337;
    o.val_every = 25;
    o.val_steps = 10;
    o.sample_every = 100;
    o.gen_tokens = 64;
    o.checkpoint_every = 0;
    o.keep_checkpoints = 0;
    o.resume = 0;
    o.overwrite = 0;
    o.plan_only = 0;
    o.max_memory = BYTES_NONE;
    o.max_host_memory = BYTES_NONE;
    strcpy(o.sample, "");
    o.temperature = 1.0f;
    o.top_k = 0;
    strcpy(o.bpe_dir, "data/gpt2");
    return o;
}

// FLAG_SWITCH: on or off; "--plan" alone turns it on, and it takes an optional 0 or 1 after it
// ("-y 1", "--plan 0") or after '=' ("--plan=1"). FLAG_WORDS: a string that alone means "1"
// ("--offload" = "--offload 1", "--offload optimizer"): a word after it is its value unless it
// starts with '-'. FLAG_BYTES: a size (parse_bytes) into a uint64_t
typedef enum { FLAG_INT, FLAG_FLOAT, FLAG_STRING, FLAG_U64, FLAG_SWITCH, FLAG_WORDS, FLAG_BYTES } FlagType;

typedef struct {
    const char* shortname;   // "-x", or NULL
    const char* longname;    // "--steps"
    FlagType type;
    size_t offset;           // field in TrainOptions
    const char* help;
} FlagSpec;

#define OPT(field) offsetof(TrainOptions, field)
static const FlagSpec FLAGS[] = {
    {"-i", "--train",         FLAG_STRING, OPT(train_data),       "training token shards (glob pattern)"},
    {"-j", "--val",           FLAG_STRING, OPT(val_data),         "validation token shards (glob), \"\" = none"},
    {NULL, "--no-manifest",   FLAG_SWITCH, OPT(no_manifest),      "read -i/-j shards that have no manifest (made by llm.c's scripts, not build/prepare_tokens): the set is not checked whole"},
    {"-k", "--tokenizer",     FLAG_STRING, OPT(tokenizer),        "tokenizer file for samples, \"\" = none"},
    {"-e", "--model",         FLAG_STRING, OPT(model),            "a preset (listed below) or a model file .bin to start from"},
    {"-o", "--out",           FLAG_STRING, OPT(out_dir),          "output directory for checkpoints and log, \"\" = none"},
    {"-b", "--batch",         FLAG_INT,    OPT(batch_size),       "micro-batch size B (sequences)"},
    {"-t", "--seq",           FLAG_INT,    OPT(seq_len),          "sequence length T (tokens)"},
    {"-d", "--total-batch",   FLAG_INT,    OPT(total_batch_size), "tokens per optimizer step (gradient accumulation); -1 = B*T"},
    {"-l", "--lr",            FLAG_FLOAT,  OPT(learning_rate),    "peak learning rate"},
    {"-u", "--warmup",        FLAG_INT,    OPT(warmup_steps),     "learning-rate warmup steps"},
    {"-q", "--final-lr-frac", FLAG_FLOAT,  OPT(final_lr_frac),    "cosine schedule ends at lr times this"},
    {"-c", "--weight-decay",  FLAG_FLOAT,  OPT(weight_decay),     "decoupled weight decay (2-D weights only)"},
    {NULL, "--beta1",         FLAG_FLOAT,  OPT(beta1),            "AdamW beta1"},
    {NULL, "--beta2",         FLAG_FLOAT,  OPT(beta2),            "AdamW beta2"},
    {NULL, "--eps",           FLAG_FLOAT,  OPT(eps),              "AdamW epsilon"},
    {NULL, "--grad-clip",     FLAG_FLOAT,  OPT(grad_clip),        "clip the global gradient norm to this, 0 = off"},
    {NULL, "--optimizer",     FLAG_STRING, OPT(optimizer),        "adamw | adafactor | came (Adafactor, CAME: papers' betas and eps)"},
    {NULL, "--relative-step", FLAG_SWITCH, OPT(relative_step),    "Adafactor: step min(1e-2, 1/sqrt(t)) x RMS(param) instead of -l"},
    {NULL, "--adafactor-beta1", FLAG_FLOAT, OPT(adafactor_beta1), "Adafactor: first-moment decay, 0 = none"},
    {NULL, "--optimizer-state", FLAG_STRING, OPT(optimizer_state), "fp32 | bf16 | 8bit: the optimizer's moments (AdamW's m, v; Adafactor's and CAME's first moment), bf16 stochastically rounded, 8bit block-wise (doc/optimizer_state.md)"},
    {NULL, "--eps1",          FLAG_FLOAT,  OPT(eps1),             "Adafactor, CAME: added to g^2 (the papers' 1e-30)"},
    {NULL, "--zero",          FLAG_INT,    OPT(zero),             "with mpirun -np N: 0 = all-reduce, full optimizer per rank; 1 = ZeRO-1 optimizer sharding; 2 = ZeRO-2: and gradients; 3 = ZeRO-3: and weights"},
    {NULL, "--tp",            FLAG_INT,    OPT(tp),               "tensor parallelism (Megatron-LM): each layer's matrices split over N adjacent ranks of mpirun -np (a multiple of N; heads divisible by N); --zero shards over the data-parallel ranks across them"},
    {NULL, "--sp",            FLAG_SWITCH, OPT(sp),               "with --tp: sequence parallelism: the residual stream, the LayerNorms and the activations kept between the split matmuls are each rank's B*T/N rows (all-gathers and reduce-scatters in place of --tp's all-reduces)"},
    {NULL, "--pp",            FLAG_INT,    OPT(pp),               "pipeline parallelism: the layers in N stages of contiguous layers, one a rank (mpirun -np a multiple of N), the -d micro-steps flowing through them as micro-batches"},
    {NULL, "--pp-schedule",   FLAG_STRING, OPT(pp_schedule),      "with --pp: 1f1b (PipeDream-Flush: a stage holds at most N - s micro-batches) | gpipe (all forwards, then all backwards: every stage holds all of them)"},
    {NULL, "--check-replicas", FLAG_SWITCH, OPT(check_replicas),   "check every step that all ranks hold the same weights (a hash pass; else at checkpoints; one rank: nothing to compare)"},
    {NULL, "--plan-ranks",    FLAG_INT,    OPT(plan_ranks),       "--plan for this many ranks (e.g. --zero 1 on a laptop); 0 = this run's"},
    {NULL, "--precision",     FLAG_STRING, OPT(precision),        "fp32 | bf16 (weights and activations; fp32 master weights, optimizer state and sums); \"\" = the backend's default: CPU fp32, CUDA bf16"},
    {NULL, "--attention",     FLAG_STRING, OPT(attention),        "flash (blockwise, keeps no T x T weights: a row's log-sum-exp) | matmul (GEMMs around a softmax, keeps the weights); \"\" = the backend's default: CUDA flash, CPU matmul"},
    {NULL, "--peak-tflops",   FLAG_FLOAT,  OPT(peak_tflops),      "peak TFLOP/s of one GPU (or CPU) for the MFU of the progress line; 0 = the GPU's from the table of train_gpt.cu"},
    {NULL, "--profile",       FLAG_INT,    OPT(profile),          "time step N by kind of work (matmuls by shape, attention, LayerNorm, ..., copies, NCCL): a table and OUT/profile.json; 0 = none"},
    {"-x", "--steps",         FLAG_INT,    OPT(max_steps),        "optimizer steps; -1 = one epoch of the training data"},
    {NULL, "--seed",          FLAG_U64,    OPT(seed),             "random seed (initialisation, sampling)"},
    {"-v", "--val-every",     FLAG_INT,    OPT(val_every),        "validate every N steps, 0 = never"},
    {"-m", "--val-steps",     FLAG_INT,    OPT(val_steps),        "batches per validation"},
    {"-s", "--sample-every",  FLAG_INT,    OPT(sample_every),     "print a sample every N steps, 0 = never"},
    {"-g", "--gen-tokens",    FLAG_INT,    OPT(gen_tokens),       "tokens per sample (the model sees the last -t of the text)"},
    {"-n", "--checkpoint-every", FLAG_INT, OPT(checkpoint_every), "checkpoint every N steps, 0 = only at the end"},
    {NULL, "--keep-checkpoints", FLAG_INT, OPT(keep_checkpoints), "keep only the newest K checkpoints in -o, removing older ones; 0 = keep all"},
    {"-y", "--resume",        FLAG_SWITCH, OPT(resume),           "resume from the latest checkpoint in the output directory (also onto another --tp, --pp, --zero or number of ranks: doc/files.md)"},
    {NULL, "--overwrite",     FLAG_SWITCH, OPT(overwrite),        "start over in an output directory that holds an earlier run (removes its checkpoints and log)"},
    {NULL, "--recompute",     FLAG_STRING, OPT(recompute),        "none | sqrt | K (layers per checkpointed segment) | gelu | attn, e.g. sqrt,attn"},
    {NULL, "--dist-init",     FLAG_STRING, OPT(dist_init),        "CUDA, started by srun or torchrun-style variables without MPI: how rank 0 hands NCCL's id to the others: file:DIR (a folder all ranks see) | tcp:HOST:PORT (rank 0's host; needs the job's secret LLMC_DIST_SECRET); \"\" = none (MPI)"},
    {NULL, "--offload",       FLAG_WORDS,  OPT(offload),          "to host memory, a comma list: activations (or 1); optimizer (GPU: fp32 master weights and state, the update on the CPU); gradients (with optimizer: every micro-step's, not the step's); 0 = none"},
    {NULL, "--loss-chunk",    FLAG_INT,    OPT(loss_chunk),       "the classifier and its loss N tokens at a time, their gradients already in forward: the (B,T,Vp) logits are never whole (4096 keeps a GPU busy at d12); 0 = all at once"},
    {NULL, "--plan",          FLAG_SWITCH, OPT(plan_only),        "print the memory plan for these flags and exit; with a budget, every combination of the memory flags and the fastest that fits"},
    {NULL, "--max-memory",    FLAG_BYTES,  OPT(max_memory),       "memory budget of a rank's device (GPU) memory, on the CPU of everything: 24GiB, 512MiB, bytes, free; --plan searches for it, a run refuses to start above it"},
    {NULL, "--max-host-memory", FLAG_BYTES, OPT(max_host_memory), "GPU builds: budget of a rank's host memory (offload store, optimizer offload, host copies); with --plan omitted = available"},
    {NULL, "--sample",        FLAG_STRING, OPT(sample),           "continue this prompt by -g tokens with the model file of -e, and exit: trains and writes nothing, refuses training flags; the model sees the last -t tokens"},
    {NULL, "--temperature",   FLAG_FLOAT,  OPT(temperature),      "--sample: probabilities to the power 1/temperature; 0 = greedy (the most likely token)"},
    {NULL, "--top-k",         FLAG_INT,    OPT(top_k),            "--sample: draw from the k most likely tokens; 0 = all"},
    {NULL, "--bpe",           FLAG_STRING, OPT(bpe_dir),          "--sample: folder of GPT-2's encoder.json and vocab.bpe, for the prompt; if the default has none, ../shared/data/gpt2"},
};
#undef OPT
#define NUM_FLAGS ((int)(sizeof(FLAGS) / sizeof(FLAGS[0])))
typedef char flag_table_fits_given[NUM_FLAGS <= FLAGS_MAX ? 1 : -1];  // else raise FLAGS_MAX

// ----------------------------------------------------------------------------
// sizes: "24GiB", "1.5TiB", "512MiB", "64KiB", "4096B", "4096" (bytes), "free", "none"

typedef struct { const char* name; int shift; } ByteUnit;  // 2^shift bytes
static const ByteUnit BYTE_UNITS[] = {{"B", 0}, {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}};
#define NUM_BYTE_UNITS ((int)(sizeof(BYTE_UNITS) / sizeof(BYTE_UNITS[0])))
#define BYTES_LIMIT ((uint64_t)1 << 62)  // 4 EiB: beyond is a typo (and the plan's sizes stay below 2^62)

// s as bytes into *out: digits with an optional fraction and a unit of BYTE_UNITS (any case; a
// fraction only with a unit above B), rounded down, 1 to 2^62; or free, none. Returns 0 if s is not one
static int parse_bytes(const char* s, uint64_t* out) {
    if (strcmp(s, "free") == 0) { *out = BYTES_FREE; return 1; }
    if (strcmp(s, "none") == 0) { *out = BYTES_NONE; return 1; }
    const char* p = s;
    while (*p >= '0' && *p <= '9') { p++; }
    size_t whole = (size_t)(p - s), frac = 0;
    if (*p == '.') {
        const char* q = ++p;
        while (*p >= '0' && *p <= '9') { p++; }
        frac = (size_t)(p - q);
        if (frac == 0) { return 0; }
    }
    if (whole == 0 || whole > 19) { return 0; }  // 19 digits: below 2^64
    int shift = -1;
    for (int i = 0; i < NUM_BYTE_UNITS; i++) {
        if (strcasecmp(p, BYTE_UNITS[i].name) == 0) { shift = BYTE_UNITS[i].shift; }
    }
    if (*p == '\0') { shift = 0; }
    if (shift < 0 || (frac > 0 && shift == 0)) { return 0; }
    if (frac == 0) {  // exactly, beyond 2^53 too
        uint64_t w = strtoull(s, NULL, 10);  // at most 19 digits: no overflow
        if (w == 0 || w > (BYTES_LIMIT >> shift)) { return 0; }
        *out = w << shift;
        return 1;
    }
    double v = strtod(s, NULL) * (double)((uint64_t)1 << shift);  // digits, '.', digits: strtod reads them all
    if (!(v >= 1.0 && v <= (double)BYTES_LIMIT)) { return 0; }
    *out = (uint64_t)v;
    return 1;
}

// bytes as a size parse_bytes reads back: the largest unit that divides it ("24GiB", "1000B" -> "1000"), free, none
static void bytes_to_arg(uint64_t bytes, char* buf, size_t n) {
    if (bytes == BYTES_FREE) { snprintf(buf, n, "free"); return; }
    if (bytes == BYTES_NONE) { snprintf(buf, n, "none"); return; }
    int u = NUM_BYTE_UNITS - 1;
    while (u > 0 && bytes % ((uint64_t)1 << BYTE_UNITS[u].shift) != 0) { u--; }
    snprintf(buf, n, "%llu%s", (unsigned long long)(bytes >> BYTE_UNITS[u].shift), u > 0 ? BYTE_UNITS[u].name : "");
}

// writes the current value of a flag into buf, for the usage text and the config table
static void flag_value_string(const FlagSpec* f, const TrainOptions* o, char* buf, size_t n) {
    const char* p = (const char*)o + f->offset;
    switch (f->type) {
        case FLAG_INT: snprintf(buf, n, "%d", *(const int*)p); break;
        case FLAG_SWITCH: snprintf(buf, n, "%s", *(const int*)p ? "on" : "off"); break;
        case FLAG_FLOAT: snprintf(buf, n, "%g", *(const float*)p); break;
        case FLAG_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t*)p); break;
        case FLAG_STRING: case FLAG_WORDS: snprintf(buf, n, "\"%s\"", p); break;
        case FLAG_BYTES: bytes_to_arg(*(const uint64_t*)p, buf, n); break;
    }
}

static void print_usage(FILE* out, const char* prog) {
    TrainOptions d = options_default();
    fprintf(out, "usage: %s [flags]   (each flag also takes --name=value; a switch alone is on, or takes 0 or 1)\n", prog);
    for (int i = 0; i < NUM_FLAGS; i++) {
        char def[PATH_MAX_LEN + 8];
        flag_value_string(&FLAGS[i], &d, def, sizeof(def));
        fprintf(out, "  %-3s %-20s %s (%sdefault %s)\n", FLAGS[i].shortname ? FLAGS[i].shortname : "",
               FLAGS[i].longname, FLAGS[i].help, FLAGS[i].type == FLAG_SWITCH ? "a switch, " : "", def);
    }
    fprintf(out, "  -h  --help                 this text\n");
    fprintf(out, "presets for -e: ");
    for (int i = 0; i < NUM_GPT2_PRESETS; i++) {
        const GPT2Preset* p = &GPT2_PRESETS[i];
        fprintf(out, "%s%s (L=%d C=%d NH=%d)", i ? ", " : "", p->name, p->layers, p->channels, p->heads);
    }
    fprintf(out, "; GPT-2's vocabulary and maxT %d\n", GPT2_MAX_SEQ_LEN);
}

static const FlagSpec* find_flag(const char* name, size_t len) {
    for (int i = 0; i < NUM_FLAGS; i++) {
        const FlagSpec* f = &FLAGS[i];
        if (f->shortname && strlen(f->shortname) == len && strncmp(f->shortname, name, len) == 0) { return f; }
        if (strlen(f->longname) == len && strncmp(f->longname, name, len) == 0) { return f; }
    }
    return NULL;
}

// whether the flag of this long name was on the command line (parse_flags)
static int flag_given(const TrainOptions* o, const char* longname) {
    const FlagSpec* f = find_flag(longname, strlen(longname));
    if (f == NULL) { fail("flag_given: no flag %s in the table", longname); }
    return o->given[f - FLAGS];
}

// 1 if s is a whole integer (what a switch may take after it)
static int is_integer(const char* s) {
    char* end = NULL;
    errno = 0;
    strtol(s, &end, 10);
    return *s != '\0' && *end == '\0' && errno == 0;
}

static void set_flag(TrainOptions* o, const FlagSpec* f, const char* value) {
    char* p = (char*)o + f->offset;
    char* end = NULL;
    errno = 0;
    switch (f->type) {
        case FLAG_INT: case FLAG_SWITCH: {
            long v = strtol(value, &end, 10);
            if (*value == '\0' || *end != '\0') { fail("flag %s: '%s' is not an integer\n  hint: see -h", f->longname, value); }
            if (errno == ERANGE || v < -INT_MAX || v > INT_MAX) {
                fail("flag %s: %s is beyond the range of an int (%d to %d)\n  hint: see -h for what it means", f->longname, value, -INT_MAX, INT_MAX);
            }
            if (f->type == FLAG_SWITCH && v != 0 && v != 1) {
                const char* name = f->shortname ? f->shortname : f->longname;
                fail("%s %s: %s is 0 or 1 (a switch: %s alone means 1)", name, value, f->longname + 2, name);
            }
            *(int*)p = (int)v;
            break;
        }
        case FLAG_U64: {
            unsigned long long v = strtoull(value, &end, 10);
            if (*value == '\0' || *value == '-' || *end != '\0' || errno != 0) {
                fail("flag %s: '%s' is not a non-negative integer\n  hint: see -h", f->longname, value);
            }
            *(uint64_t*)p = v;
            break;
        }
        case FLAG_FLOAT: {
            float v = strtof(value, &end);
            if (*value == '\0' || *end != '\0' || v != v) {
                fail("flag %s: '%s' is not a number\n  hint: see -h", f->longname, value);
            }
            if (errno == ERANGE) {  // beyond a float, or so close to 0 that it is one no longer (below FLT_MIN)
                fail("flag %s: '%s' is %s a float's range (%g to %g, or 0)\n  hint: see -h", f->longname, value,
                     fabsf(v) > 1.0f ? "beyond" : "too close to 0 for", (double)FLT_MIN, (double)FLT_MAX);
            }
            *(float*)p = v;
            break;
        }
        case FLAG_STRING: case FLAG_WORDS:
            if (strlen(value) >= PATH_MAX_LEN) { fail("flag %s: value longer than %d characters", f->longname, PATH_MAX_LEN - 1); }
            strcpy(p, value);
            break;
        case FLAG_BYTES:
            if (!parse_bytes(value, (uint64_t*)p)) {
                fail("flag %s: '%s' is not a size\n"
                     "  hint: bytes (4096), or a number and a unit B, KiB, MiB, GiB, TiB, powers of 1024 (24GiB, 1.5TiB;\n"
                     "  GB and MB are not taken: they mean powers of 1000 to some and 1024 to others), from 1 byte to 4 EiB;\n"
                     "  or free (what is free when the run starts), or none", f->longname, value);
            }
            break;
    }
}

// parses argv into o; returns 0 normally, 1 if -h was given (usage already printed)
static int parse_flags(TrainOptions* o, int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) { print_usage(stdout, argv[0]); return 1; }
        const char* eq = strchr(arg, '=');
        size_t len = (arg[0] == '-' && arg[1] == '-' && eq) ? (size_t)(eq - arg) : strlen(arg);
        const FlagSpec* f = arg[0] == '-' ? find_flag(arg, len) : NULL;
        if (f == NULL) { fail("unknown flag '%s'\n  hint: %s -h lists the flags", arg, argv[0]); }
        o->given[f - FLAGS] = 1;
        if (f->type == FLAG_SWITCH) {  // alone, or with 0 or 1 after it or after '='
            if (eq && len == (size_t)(eq - arg)) { set_flag(o, f, eq + 1); }
            else if (i + 1 < argc && is_integer(argv[i + 1])) { set_flag(o, f, argv[++i]); }
            else { *(int*)((char*)o + f->offset) = 1; }
            continue;
        }
        if (f->type == FLAG_WORDS && !(eq && len == (size_t)(eq - arg)) && (i + 1 >= argc || argv[i + 1][0] == '-')) {
            set_flag(o, f, "1");  // alone
            continue;
        }
        const char* value;
        if (eq && len == (size_t)(eq - arg)) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc) { fail("flag %s needs a value\n  hint: %s -h", arg, argv[0]); }
            value = argv[++i];
        }
        set_flag(o, f, value);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// options back to arguments: what a printed command line is made of (--plan's recommendation)

// 1 if the flag's field holds the same value in a and b
static int flag_field_equal(const FlagSpec* f, const TrainOptions* a, const TrainOptions* b) {
    const char *pa = (const char*)a + f->offset, *pb = (const char*)b + f->offset;
    switch (f->type) {
        case FLAG_INT: case FLAG_SWITCH: return *(const int*)pa == *(const int*)pb;
        case FLAG_FLOAT: return *(const float*)pa == *(const float*)pb;
        case FLAG_U64: case FLAG_BYTES: return *(const uint64_t*)pa == *(const uint64_t*)pb;
        case FLAG_STRING: case FLAG_WORDS: return strcmp(pa, pb) == 0;
    }
    return 0;
}

// a flag's value as an argument that set_flag reads back to the same value (floats: the
// shortest %g that does)
static void flag_value_arg(const FlagSpec* f, const TrainOptions* o, char* buf, size_t n) {
    const char* p = (const char*)o + f->offset;
    switch (f->type) {
        case FLAG_INT: case FLAG_SWITCH: snprintf(buf, n, "%d", *(const int*)p); break;
        case FLAG_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t*)p); break;
        case FLAG_STRING: case FLAG_WORDS: snprintf(buf, n, "%s", p); break;
        case FLAG_BYTES: bytes_to_arg(*(const uint64_t*)p, buf, n); break;
        case FLAG_FLOAT: {
            float v = *(const float*)p;
            for (int digits = 1; digits <= 9; digits++) {  // 9 significant digits round-trip any float
                snprintf(buf, n, "%.*g", digits, v);
                if (strtof(buf, NULL) == v) { break; }
            }
            break;
        }
    }
}

#define COMMAND_MAX_ARGS (2 * NUM_FLAGS)
#define COMMAND_TEXT_LEN (8 * PATH_MAX_LEN)
typedef struct {
    int argc;
    const char* argv[COMMAND_MAX_ARGS];  // into text
    char text[COMMAND_TEXT_LEN];
    size_t used;
} CommandLine;

static void command_add(CommandLine* c, const char* arg) {
    size_t n = strlen(arg) + 1;
    if (c->argc >= COMMAND_MAX_ARGS || c->used + n > COMMAND_TEXT_LEN) { fail("command line longer than %d characters", COMMAND_TEXT_LEN); }
    memcpy(c->text + c->used, arg, n);
    c->argv[c->argc++] = c->text + c->used;
    c->used += n;
}

// the arguments that give o from the defaults: every flag whose value differs, in the table's
// order, by its short name where it has one (a switch that is on: the name alone), except the
// flags at the offsets in skip (fields of TrainOptions, e.g. --plan's)
static void options_to_args(CommandLine* c, const TrainOptions* o, const size_t* skip, int num_skip) {
    TrainOptions d = options_default();
    c->argc = 0;
    c->used = 0;
    for (int i = 0; i < NUM_FLAGS; i++) {
        const FlagSpec* f = &FLAGS[i];
        int skipped = 0;
        for (int k = 0; k < num_skip; k++) { skipped |= skip[k] == f->offset; }
        if (skipped || flag_field_equal(f, o, &d)) { continue; }
        command_add(c, f->shortname ? f->shortname : f->longname);
        if (f->type == FLAG_SWITCH && *(const int*)((const char*)o + f->offset) == 1) { continue; }
        char v[PATH_MAX_LEN + 32];
        flag_value_arg(f, o, v, sizeof(v));
        command_add(c, v);
    }
}

#endif // LLMC_FLAGS_H
