/*
model_config.h: the GPT-2 shape (one struct), the llm.c presets, the size table of the
16 parameter tensors in checkpoint order, and GPT-2's initialisation of them. Shared by
the CPU and CUDA paths.

    GPT2Config cfg;
    if (!gpt2_config_preset(&cfg, "d12")) { ... }   // GPT-2 124M
    size_t sizes[NUM_PARAMETER_TENSORS]; gpt2_parameter_sizes(sizes, &cfg);
    gpt2_init_params(params, &cfg, seed);           // params: gpt2_num_parameters(&cfg) floats

Failure: gpt2_config_check() stops with a message naming the impossible shape.
*/
#ifndef LLMC_MODEL_CONFIG_H
#define LLMC_MODEL_CONFIG_H

#include <math.h>
#include <stdio.h>
#include <string.h>
#include "rand.h"
#include "utils.h"

#define GPT2_VOCAB_SIZE 50257   // GPT-2's BPE vocabulary
#define GPT2_MAX_SEQ_LEN 1024   // GPT-2's context length
#define GPT2_EOT 50256          // <|endoftext|>
#define VOCAB_PAD_MULTIPLE 128  // Vp = V rounded up to this (llm.c): aligned rows, faster matmuls

// the layers' constants, part of the model's definition: every backend computes with these
#define LAYERNORM_EPS 1e-5f              // GPT-2's LayerNorm epsilon (biased variance)
#define GELU_SCALE 0.7978845608028654f   // sqrt(2/pi), GELU's tanh approximation
#define GELU_CUBIC 0.044715f             // the cubic term's coefficient in that approximation

typedef struct {
    int max_seq_len;        // maxT, positions in wpe
    int vocab_size;         // V, real tokens
    int padded_vocab_size;  // Vp >= V; rows V..Vp-1 of wte are zero and never used
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
    int tp;                 // --tp: the ranks each layer's matrices are split over (Megatron-LM); the tensors this
                            // config sizes are then one rank's slices of them (gpt2_tensor_shape). 0 or 1: whole
    int pp, stage;          // --pp: the pipeline's stages; with pp > 1 this config is stage `stage`'s part of the
    int first_layer;        // model: its num_layers layers from layer first_layer of the whole, and the outer
                            // tensors it holds (gpt2_holds_tensor). 0 or 1: the whole model (llmc/pipeline.h)
} GPT2Config;

// the ranks a config's layers are split over: 1 for the whole model (a file's, a preset's)
static int gpt2_tp(const GPT2Config* c) { return c->tp > 1 ? c->tp : 1; }
// the pipeline stages a config's layers are split over: 1 for the whole model
static int gpt2_pp(const GPT2Config* c) { return c->pp > 1 ? c->pp : 1; }

static int gpt2_padded_vocab(int V) {
    return (V + VOCAB_PAD_MULTIPLE - 1) / VOCAB_PAD_MULTIPLE * VOCAB_PAD_MULTIPLE;
}

// named presets as llm.c spells them: dN = depth N with GPT-2's widths (the one list:
// -h, the error for an unknown -e and README's table come from it)
typedef struct { const char* name; int layers, channels, heads; } GPT2Preset;
static const GPT2Preset GPT2_PRESETS[] = {
    {"tiny", 2, 64, 4},     // for tests and quick checks, 3.3M parameters
    {"d6", 6, 384, 6},      // the small default, 30M
    {"d12", 12, 768, 12},   // GPT-2 124M
    {"d24", 24, 1024, 16},  // GPT-2 350M
    {"d36", 36, 1280, 20},  // GPT-2 774M
    {"d48", 48, 1600, 25},  // GPT-2 1558M
    {"d60", 60, 1920, 30},  // 2.7B, the largest llm.c trains on one 80 GB GPU
    {"d72", 72, 2880, 30},  // 7.3B
    {"d84", 84, 3456, 36},  // 12.2B
};
#define NUM_GPT2_PRESETS ((int)(sizeof(GPT2_PRESETS) / sizeof(GPT2_PRESETS[0])))
#define GPT2_PRESET_LIST_LEN 128

// "tiny, d6, d12, ..." into out
static void gpt2_preset_list(char* out, size_t n) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < NUM_GPT2_PRESETS && used < n; i++) {
        used += snprintf(out + used, n - used, "%s%s", i ? ", " : "", GPT2_PRESETS[i].name);
    }
}

// fills cfg from a preset name; returns 0 if the name is not a preset
static int gpt2_config_preset(GPT2Config* cfg, const char* name) {
    for (int i = 0; i < NUM_GPT2_PRESETS; i++) {
        if (strcmp(name, GPT2_PRESETS[i].name) == 0) {
            cfg->max_seq_len = GPT2_MAX_SEQ_LEN;
            cfg->vocab_size = GPT2_VOCAB_SIZE;
            cfg->padded_vocab_size = gpt2_padded_vocab(GPT2_VOCAB_SIZE);
            cfg->num_layers = GPT2_PRESETS[i].layers;
            cfg->channels = GPT2_PRESETS[i].channels;
            cfg->num_heads = GPT2_PRESETS[i].heads;
            cfg->tp = 1;
            cfg->pp = 1;
            cfg->stage = cfg->first_layer = 0;
            return 1;
        }
    }
    return 0;
}

// upper bounds of a model file's shape, far above any GPT-2 (d84: L=84 C=3456, V=50257,
// maxT=1024) and low enough that every size of the model and its plan fits in 64 bits:
// P < Vp*C + maxT*C + L*13*(C^2 + C) < 2^48
#define MODEL_LIMIT_LAYERS 1024
#define MODEL_LIMIT_CHANNELS 65536
#define MODEL_LIMIT_VOCAB (1 << 24)     // V and Vp
#define MODEL_LIMIT_SEQ_LEN (1 << 20)

// stops with a clear message if the shape cannot be a GPT-2
static void gpt2_config_check(const GPT2Config* c, const char* where) {
    const struct { const char* name; int value, max; } fields[] = {
        {"L (layers)", c->num_layers, MODEL_LIMIT_LAYERS}, {"C (channels)", c->channels, MODEL_LIMIT_CHANNELS},
        {"NH (heads)", c->num_heads, MODEL_LIMIT_CHANNELS}, {"V (vocabulary)", c->vocab_size, MODEL_LIMIT_VOCAB},
        {"Vp (padded vocabulary)", c->padded_vocab_size, MODEL_LIMIT_VOCAB}, {"maxT (context)", c->max_seq_len, MODEL_LIMIT_SEQ_LEN},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (fields[i].value < 1 || fields[i].value > fields[i].max) {
            fail("%s: impossible model shape L=%d C=%d NH=%d V=%d Vp=%d maxT=%d: %s = %d is outside 1..%d",
                 where, c->num_layers, c->channels, c->num_heads, c->vocab_size, c->padded_vocab_size, c->max_seq_len,
                 fields[i].name, fields[i].value, fields[i].max);
        }
    }
    if (c->channels % c->num_heads != 0) {
        fail("%s: channels C=%d is not divisible by heads NH=%d\n  hint: pick NH dividing C (head size C/NH)",
             where, c->channels, c->num_heads);
    }
    if (c->padded_vocab_size < c->vocab_size) {
        fail("%s: padded vocabulary Vp=%d is smaller than V=%d", where, c->padded_vocab_size, c->vocab_size);
    }
}

// ----------------------------------------------------------------------------
// the 16 parameter tensors, in the order of the checkpoint file (llm.c's order)

#define NUM_PARAMETER_TENSORS 16
static const char* PARAMETER_NAMES[NUM_PARAMETER_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
};
// which tensors are matrices (get weight decay, factored optimizer state)
static const int PARAMETER_IS_MATRIX[NUM_PARAMETER_TENSORS] = {1,1,0,0,1,0,1,0,0,0,1,0,1,0,0,0};
// which tensors hold one slice per layer (the rest: wte, wpe, lnfw, lnfb)
static const int PARAMETER_IS_PER_LAYER[NUM_PARAMETER_TENSORS] = {0,0,1,1,1,1,1,1,1,1,1,1,1,1,0,0};

// --tp (cpu/tensor_parallel.h): how each tensor is cut over the ranks of a tensor-parallel group.
// A column-parallel matrix (qkvw, fcw) gives each rank rows (qkvw: its heads' rows in each of q, k
// and v), and its bias the same elements; a row-parallel one (attprojw, fcprojw) gives each rank
// columns; wte gives each rank Vp/N rows of the vocabulary (the embedding and the classifier split
// over the vocabulary, Megatron-LM's vocabulary-parallel layers). Everything else is whole on every rank
typedef enum {
    TP_WHOLE,     // every rank holds it all (embeddings, LayerNorms, the row-parallel biases)
    TP_ROWS,      // rank r holds rows r/N..(r+1)/N of each layer's (rows, cols): a column-parallel matrix, its bias
    TP_ROWS_QKV,  // the same within each of q, k and v (the rows of rank r's heads)
    TP_COLUMNS,   // rank r holds columns r/N..(r+1)/N of every row: a row-parallel matrix
} TpSplit;

static const TpSplit PARAMETER_TP_SPLIT[NUM_PARAMETER_TENSORS] = {
    TP_ROWS, TP_WHOLE, TP_WHOLE, TP_WHOLE,    // wte (Vp, C): by the vocabulary; wpe, ln1w, ln1b
    TP_ROWS_QKV, TP_ROWS_QKV,                 // qkvw (3C, C), qkvb (3C)
    TP_COLUMNS, TP_WHOLE, TP_WHOLE, TP_WHOLE, // attprojw (C, C), attprojb, ln2w, ln2b
    TP_ROWS, TP_ROWS,                         // fcw (4C, C), fcb (4C)
    TP_COLUMNS, TP_WHOLE, TP_WHOLE, TP_WHOLE, // fcprojw (C, 4C), fcprojb, lnfw, lnfb
};

// whether the config holds tensor i: every one but on a pipeline's stage (--pp), which holds its own
// layers' tensors and of the outer ones (wte, wpe, lnfw, lnfb) what it computes with: wte the first
// stage (the embedding) and the last (the classifier: tied), wpe the first, the final LayerNorm the last
static int gpt2_holds_tensor(const GPT2Config* c, int i) {
    if (PARAMETER_IS_PER_LAYER[i] || gpt2_pp(c) == 1) { return 1; }
    int first = c->stage == 0, last = c->stage == c->pp - 1;
    return i == 0 ? first || last : i == 1 ? first : last;  // wte, wpe; lnfw, lnfb
}

// tensor i of one layer (or an outer tensor) as (rows, cols): the whole model's, or (c->tp > 1) one
// rank's slice of it. Vectors are (n, 1), so that a split by rows cuts them as it cuts their matrix.
// A tensor a pipeline's stage does not hold has no rows
static void gpt2_tensor_shape(int i, const GPT2Config* c, size_t* rows, size_t* cols) {
    size_t C = c->channels, N = (size_t)gpt2_tp(c);
    const size_t shape[NUM_PARAMETER_TENSORS][2] = {
        {(size_t)c->padded_vocab_size, C}, {(size_t)c->max_seq_len, C}, {C, 1}, {C, 1},  // wte, wpe, ln1w, ln1b
        {3 * C, C}, {3 * C, 1}, {C, C}, {C, 1}, {C, 1}, {C, 1},                           // qkvw, qkvb, attprojw, attprojb, ln2w, ln2b
        {4 * C, C}, {4 * C, 1}, {C, 4 * C}, {C, 1}, {C, 1}, {C, 1},                       // fcw, fcb, fcprojw, fcprojb, lnfw, lnfb
    };
    *rows = shape[i][0];
    *cols = shape[i][1];
    if (PARAMETER_TP_SPLIT[i] == TP_COLUMNS) { *cols /= N; }
    else if (PARAMETER_TP_SPLIT[i] != TP_WHOLE) { *rows /= N; }
    if (!gpt2_holds_tensor(c, i)) { *rows = 0; }
}

// the config of one rank's slices of the whole model c split over tp ranks (--tp; 1: the whole model)
static GPT2Config gpt2_rank_config(const GPT2Config* c, int tp) {
    GPT2Config r = *c;
    r.tp = tp;
    return r;
}

// why the model c cannot be split over tp ranks, or NULL: every rank takes whole heads (and so whole
// channels of C, 3C and 4C: NH divides C) and an equal part of the padded vocabulary Vp
static const char* gpt2_tp_refusal(const GPT2Config* c, int tp) {
    static char why[200];
    if (tp < 1) { snprintf(why, sizeof(why), "--tp %d: a tensor-parallel group has at least 1 rank", tp); return why; }
    if (c->num_heads % tp != 0) {
        snprintf(why, sizeof(why), "--tp %d: the model's %d heads do not split over %d ranks (each takes whole heads)", tp, c->num_heads, tp);
        return why;
    }
    if (c->padded_vocab_size % tp != 0) {
        snprintf(why, sizeof(why), "--tp %d: the model's padded vocabulary Vp = %d does not split over %d ranks (each takes Vp/%d rows of wte)",
                 tp, c->padded_vocab_size, tp, tp);
        return why;
    }
    return NULL;
}

// number of floats of each tensor; per-layer tensors hold all L layers, layer-major. With --tp
// (c->tp > 1) a rank's slices: qkvw (L, 3C/N, C), qkvb (L, 3C/N), attprojw (L, C, C/N), fcw (L, 4C/N, C),
// fcb (L, 4C/N), fcprojw (L, C, 4C/N)
static void gpt2_parameter_sizes(size_t sizes[NUM_PARAMETER_TENSORS], const GPT2Config* cfg) {
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t rows, cols, layers = PARAMETER_IS_PER_LAYER[i] ? (size_t)cfg->num_layers : 1;
        gpt2_tensor_shape(i, cfg, &rows, &cols);
        sizes[i] = layers * rows * cols;
    }
}

static size_t gpt2_num_parameters(const GPT2Config* cfg) {
    size_t sizes[NUM_PARAMETER_TENSORS], n = 0;
    gpt2_parameter_sizes(sizes, cfg);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { n += sizes[i]; }
    return n;
}

#define INIT_STD 0.02f  // GPT-2's initialisation scale

// GPT-2 initialisation of params (gpt2_num_parameters floats): weights normal(0, 0.02),
// residual projections 0.02/sqrt(2L), biases 0, LayerNorm weights 1; padded vocabulary
// rows 0. Deterministic in the seed. It can be made a chunk at a time (a rank of --zero 3 keeps
// its blocks of each slice only): ParamInit walks the parameters in order, one random draw per
// matrix element, so any chunking gives the same numbers.
typedef struct {
    GPT2Config cfg;
    uint64_t rng;
    int tensor;       // the tensor the next value belongs to
    size_t at;        // its index there
} ParamInit;

static ParamInit gpt2_param_init(const GPT2Config* cfg, uint64_t seed) {
    if (gpt2_tp(cfg) > 1 || gpt2_pp(cfg) > 1) {
        fail("gpt2_param_init: the initialisation walks the whole model; this config is a rank's part of it (--tp %d, --pp %d)", cfg->tp, cfg->pp);
    }
    ParamInit it = {*cfg, RNG_SEED_MIX ^ seed, 0, 0};
    return it;
}

// the next n values of the initialisation into p
static void gpt2_init_params_next(ParamInit* it, float* p, size_t n) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(sizes, &it->cfg);
    float residual_std = INIT_STD / sqrtf(2.0f * it->cfg.num_layers);
    while (n > 0) {
        while (it->at == sizes[it->tensor]) { it->tensor++; it->at = 0; }
        int i = it->tensor;
        const char* name = PARAMETER_NAMES[i];
        int is_ln_weight = strcmp(name, "ln1w") == 0 || strcmp(name, "ln2w") == 0 || strcmp(name, "lnfw") == 0;
        float std = (strcmp(name, "attprojw") == 0 || strcmp(name, "fcprojw") == 0) ? residual_std : INIT_STD;
        size_t real = i == 0 ? (size_t)it->cfg.vocab_size * it->cfg.channels : sizes[i];  // wte: real rows only
        size_t run = sizes[i] - it->at < n ? sizes[i] - it->at : n;  // this chunk's part of tensor i
        for (size_t k = 0; k < run; k++, it->at++) {
            if (it->at >= real) { p[k] = 0.0f; }
            else if (PARAMETER_IS_MATRIX[i]) { p[k] = std * rand_normal(&it->rng); }
            else { p[k] = is_ln_weight ? 1.0f : 0.0f; }
        }
        p += run;
        n -= run;
    }
}

static void gpt2_init_params(float* params, const GPT2Config* cfg, uint64_t seed) {
    ParamInit it = gpt2_param_init(cfg, seed);
    gpt2_init_params_next(&it, params, gpt2_num_parameters(cfg));
}

#endif // LLMC_MODEL_CONFIG_H
