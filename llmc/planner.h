/*
planner.h: how many bytes a run needs, by category, from closed-form formulas of
the model shape and the batch. This is deliberately separate code from the
allocations in train_gpt.c: the trainer prints the plan at start-up and the
measured high-water marks (memory.h) after the first step, and the tests check
that the two agree exactly. `train_gpt --plan` prints it without training.

Notation: L layers, C channels, NH heads, Vp padded vocabulary, maxT positions,
B batch, T sequence length, P parameters = Vp*C + maxT*C + L*(12C^2 + 13C) + 2C.
Under data parallelism every number is per rank: gradients are all-reduced or
reduce-scattered in place (no extra buffer); ZeRO-1 cuts the optimizer state.
*/
#ifndef LLMC_PLANNER_H
#define LLMC_PLANNER_H

#include <stdint.h>
#include <stdio.h>
#include "memory.h"
#include "model_config.h"

typedef struct {
    int B, T;              // micro-batch shape
    int num_loaders;       // data loaders (train, and val if any)
    int optimizer;         // OptimizerKind: 0 AdamW, 1 Adafactor, 2 CAME
    int use_beta1;         // Adafactor keeps a first moment
    int world;             // data-parallel ranks (0 or 1: one process)
    int zero;              // ZeroStage (distributed.h): 1 = optimizer state sharded over the ranks
} PlanInputs;

enum { PLAN_ADAMW = 0, PLAN_ADAFACTOR = 1, PLAN_CAME = 2 };  // = OptimizerKind (optimizers.h)

typedef struct {
    size_t bytes[NUM_MEM_CATEGORIES];
    const char* formula[NUM_MEM_CATEGORIES];  // how bytes[] was computed, for the table
} MemPlan;

static MemPlan plan_memory(const GPT2Config* cfg, PlanInputs in) {
    size_t L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads;
    size_t Vp = cfg->padded_vocab_size, maxT = cfg->max_seq_len;
    size_t B = in.B, T = in.T, BT = B * T, F = sizeof(float);
    size_t P = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C;
    MemPlan p;
    p.bytes[MEM_PARAMETERS] = P * F;
    p.formula[MEM_PARAMETERS] = "4P";
    p.bytes[MEM_GRADIENTS] = P * F;
    p.formula[MEM_GRADIENTS] = "4P";
    // Every optimizer keeps state per slice (optimizers.h): each layer's slice of a per-layer
    // tensor, wte over its V real rows. Under ZeRO-1 with N ranks a rank keeps state for
    // ceil(units / N) units of each slice (rows of a matrix, elements of a vector); write
    // [x] = ceil(x / N) (= x for one process). Matrices: wte (V,C), wpe (maxT,C), per layer
    // qkvw (3C,C), attprojw (C,C), fcw (4C,C), fcprojw (C,4C). Vectors: per layer four
    // LayerNorm vectors and attprojb, fcprojb (C each), qkvb (3C), fcb (4C); lnfw, lnfb (C).
    //   E        = elements of a rank's blocks     (= Pu = P - (Vp - V)C, the unpadded weights, for N = 1)
    //   factored = sum of [rows] + cols, matrices (= V + maxT + 2C + 16LC for N = 1)
    //   vectors  = sum of [n], vectors            (= 13LC + 2C for N = 1)
    size_t N = (in.zero == 1 && in.world > 1) ? (size_t)in.world : 1;
    size_t V = cfg->vocab_size;
    size_t cV = (V + N - 1) / N, cT = (maxT + N - 1) / N, c1 = (C + N - 1) / N;
    size_t c3 = (3 * C + N - 1) / N, c4 = (4 * C + N - 1) / N;
    size_t vectors = L * (6 * c1 + c3 + c4) + 2 * c1;
    size_t E = (cV + cT) * C + L * (c3 * C + c1 * C + c4 * C + c1 * 4 * C) + vectors;
    size_t factored = cV + cT + 2 * C + L * (c3 + c1 + c4 + c1 + 7 * C);
    int sharded = N > 1;
    if (in.optimizer == PLAN_ADAFACTOR) {
        p.bytes[MEM_OPTIMIZER] = (factored + vectors + (in.use_beta1 ? E : 0)) * F;
        p.formula[MEM_OPTIMIZER] = sharded ? (in.use_beta1 ? "Adafactor, ZeRO-1 block: 4(factored + vectors + E)"
                                                           : "Adafactor, ZeRO-1 block: 4(factored + vectors)")
                                           : (in.use_beta1 ? "Adafactor: 4(V + maxT + 4C + 29LC + Pu)" : "Adafactor: 4(V + maxT + 4C + 29LC)");
    } else if (in.optimizer == PLAN_CAME) {
        p.bytes[MEM_OPTIMIZER] = (E + 2 * factored + vectors) * F;
        p.formula[MEM_OPTIMIZER] = sharded ? "CAME, ZeRO-1 block: 4(E + 2 factored + vectors)"
                                           : "CAME: 4(Pu + 2(V + maxT + 2C + 16LC) + 13LC + 2C)";
    } else {
        p.bytes[MEM_OPTIMIZER] = 2 * E * F;
        p.formula[MEM_OPTIMIZER] = sharded ? "AdamW m, v, ZeRO-1 block: 8E" : "AdamW m, v: 8Pu";
    }
    // per layer: ln1, atty, residual2, ln2, residual3 (BTC each), qkv (3BTC), fch and its
    // GELU (4BTC each), attention weights (B NH T^2), four LayerNorm statistics (BT each);
    // outside the layers: embedding output and final LayerNorm (BTC each), its two
    // statistics, losses (BT each) and the logits (BT Vp)
    p.bytes[MEM_ACTIVATIONS] = (L * (16 * BT * C + 4 * BT + B * NH * T * T) + 2 * BT * C + 3 * BT + BT * Vp) * F;
    p.formula[MEM_ACTIVATIONS] = "4[L(16BTC + 4BT + B NH T^2) + 2BTC + 3BT + BT Vp]";
    // one layer's backward buffers: residual-stream grad and one (B,T,C) temporary, dqkv (3BTC),
    // MLP grads (2 x 4BTC), attention-score grad (B NH T^2)
    p.bytes[MEM_ACT_GRADIENTS] = (13 * BT * C + B * NH * T * T) * F;
    p.formula[MEM_ACT_GRADIENTS] = "4(13BTC + B NH T^2)";
    // each loader: uint16 read buffer of BT+1 tokens, int inputs and targets (BT each);
    // sampling: one int per position of a generated sequence (T)
    p.bytes[MEM_SCRATCH] = in.num_loaders * ((BT + 1) * sizeof(uint16_t) + 2 * BT * sizeof(int)) + T * sizeof(int);
    p.formula[MEM_SCRATCH] = "loaders x (2(BT+1) + 8BT) + 4T";
    return p;
}

static size_t plan_total(const MemPlan* p) {
    size_t s = 0;
    for (int i = 0; i < NUM_MEM_CATEGORIES; i++) { s += p->bytes[i]; }
    return s;
}

#define MIB (1024.0 * 1024.0)
#define MEM_TABLE_RULE "+--------------------+----------------+----------------+-----------------------------------------------------+\n"

// prints the plan; with measured != NULL, the measured high-water marks beside it
static void print_memory_table(const MemPlan* p, const MemStats* measured) {
    printf("%s", MEM_TABLE_RULE);
    printf("| %-18s | %-14s | %-14s | %-51s |\n", "memory", "planned", "measured", "formula (bytes)");
    printf("%s", MEM_TABLE_RULE);
    for (int i = 0; i < NUM_MEM_CATEGORIES; i++) {
        char m[32] = "-";
        if (measured) { snprintf(m, sizeof(m), "%.2f MiB", measured->peak[i] / MIB); }
        printf("| %-18s | %10.2f MiB | %14s | %-51s |\n", MEM_CATEGORY_NAMES[i], p->bytes[i] / MIB, m, p->formula[i]);
    }
    char m[32] = "-";
    if (measured) { snprintf(m, sizeof(m), "%.2f MiB", measured->total_peak / MIB); }
    printf("| %-18s | %10.2f MiB | %14s | %-51s |\n", "total", plan_total(p) / MIB, m, "");
    printf("%s", MEM_TABLE_RULE);
}

#endif // LLMC_PLANNER_H
