/*
optimizers.h: AdamW, Adafactor and CAME on the CPU, fp32, for the 16 GPT-2 tensors.

    size_t n = optimizer_state_floats(&cfg, OPT_CAME, 0, 1);        // zeroed before step 1
    float* state = calloc(n, sizeof(float));
    optimizer_step(OPT_CAME, params, grads, state, &cfg, &hyper, t, &OPT_UNSHARDED); // t = 1, 2, ...

One optimizer "parameter" is one torch tensor of the reference (dev/reference/README.md):
layer l's slice of a per-layer tensor is its own parameter (qkvw of layer l is its own
(3C, C) matrix, ln1w of layer l its own (C) vector); wte is one (V, C) matrix over the
UNPADDED rows (rows V..Vp-1 are never read or written: they stay zero); wpe is (maxT, C).
A slice with rows == 1 or cols == 1 is a vector; every other slice is a matrix (unlike torch,
which factors every 2-D tensor: they differ only for a model with maxT == 1 or V == 1).
Adafactor and CAME keep FACTORED second moments for matrices (a row and a column
statistic, rows + cols floats, instead of rows * cols) and full ones for vectors.
AdamW is the existing adamw_update (cpu_layers.h), called per slice (it is elementwise,
so slices change nothing; the padded wte rows, whose gradient is zero, are skipped).

ZeRO-1 (OptSharding, at the end): with world ranks, each rank updates only its block of
every slice's rows (a vector: of its elements) and keeps only that block's state, and of a
matrix's column statistics only its block of columns. What an update needs from the whole
slice (column means, mean(R), the RMS of U and of p) is summed over the block's rows and
then across the ranks by the OptSumFn hook; the column statistics' blocks are gathered by
the OptGatherFn hook into a workspace. With one process (hooks NULL) every sum is taken
exactly as before, bit for bit.

Order of operations, per parameter p (rows, cols) with gradient g, step t = 1, 2, ...
(the transcriptions in dev/reference/make_reference.py, checked there against the packages;
ema(a, x, b) means a = b*a + (1-b)*x; "factored" means rows > 1 and cols > 1):

  Adafactor (HF transformers.optimization.Adafactor; Shazeer & Stern 2018)
    1. lr_t = relative_step ? min(1e-2, 1/sqrt(t)) : lr;  if scale_parameter: lr_t *= max(eps2, RMS(p))
       (RMS(p) of p before this step changes it)
    2. beta2_t = 1 - t^decay_rate;  G = g^2 + eps1
    3. factored: ema(R, row means of G, beta2_t); ema(Cc, column means of G, beta2_t)
                 U = (rsqrt(R_i / mean(R)) * rsqrt(Cc_j)) * g
       vector:   ema(V, G, beta2_t);  U = rsqrt(V) * g
    4. U /= max(1, RMS(U) / clip_threshold);  U *= lr_t
    5. if beta1 > 0: ema(M, U, beta1); U = M          (the momentum holds lr-scaled updates)
    6. if weight_decay: p -= weight_decay * lr_t * p   (every parameter, biases included)
    7. p -= U

  CAME (came-pytorch 0.1.3; Luo et al. 2023), no bias correction, no step count
    1. G = g^2 + eps1
    2. factored: ema(R, row means of G, beta2); ema(Cc, column means of G, beta2)
                 U = (rsqrt(R_i / mean(R)) * rsqrt(Cc_j)) * g
       vector:   ema(V, G, beta2);  U = rsqrt(V) * g
    3. U /= max(1, RMS(U) / clip_threshold)
    4. ema(M, U, beta1)
    5. factored: Res = (U - M)^2 + eps2; ema(Rr, row means of Res, beta3); ema(Rc, column means, beta3)
                 U = (rsqrt(Rr_i / mean(Rr)) * rsqrt(Rc_j)) * M        (the confidence factor)
       vector:   U = M                                                 (no confidence factor)
    6. if weight_decay: p -= weight_decay * lr * p     (every parameter, biases included)
    7. p -= lr * U

  AdamW: adamw_update in cpu_layers.h; weight decay on the 2-D weights only (PARAMETER_IS_MATRIX).

State layout (one block of floats, zeroed before step 1): the slices in checkpoint order
(wte, wpe, ln1w of layer 0..L-1, ln1b of layer 0..L-1, qkvw 0..L-1, ..., fcprojb 0..L-1, lnfw,
lnfb), each slice's state contiguous; under ZeRO-1 "rows" below are the ceil(rows / world)
rows of a rank's block (a vector's n: ceil(n / world)), and the "cols" of the column
statistics Cc and Rc its ceil(cols / world) columns (M stays rows*cols):
    AdamW:            m (rows*cols), v (rows*cols)
    Adafactor matrix: R (rows), Cc (cols) [, M (rows*cols) if beta1 > 0]
    Adafactor vector: V (n)               [, M (n)         if beta1 > 0]
    CAME matrix:      M (rows*cols), R (rows), Cc (cols), Rr (rows), Rc (cols)
    CAME vector:      M (n), V (n)
  (CAME's names in the package: exp_avg, exp_avg_sq_row/col, exp_avg_res_row/col, exp_avg_sq.)

Hyperparameters are doubles, as the packages' Python floats: each is rounded to fp32 where it
meets a tensor, and an EMA's 1 - beta is taken in double before rounding (see OptEma).

Determinism: every sum (means, RMS) is taken in double over a fixed partition of the rows
(OPT_PARTS parts) and the parts are added in order, so results do not depend on the thread
count. Failure: the update functions allocate a small workspace (rows + cols floats and
OPT_PARTS * cols doubles) and stop with a message if the host is out of memory.
*/
#ifndef LLMC_OPTIMIZERS_H
#define LLMC_OPTIMIZERS_H

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <string.h>
#include "utils.h"
#include "model_config.h"
#include "cpu_layers.h"

typedef enum { OPT_ADAMW, OPT_ADAFACTOR, OPT_CAME, NUM_OPTIMIZERS } OptimizerKind;
static const char* OPTIMIZER_NAMES[NUM_OPTIMIZERS] = {"adamw", "adafactor", "came"};

// the papers' / packages' defaults, used by the trainer for what its flags do not set
#define ADAFACTOR_DECAY_RATE (-0.8)     // beta2_t = 1 - t^-0.8
#define ADAFACTOR_EPS2 1e-3             // floor of RMS(p) in the relative step
#define ADAFACTOR_CLIP_THRESHOLD 1.0    // update clipping: RMS(U) / d with d = 1
#define CAME_BETA1 0.9
#define CAME_BETA2 0.999
#define CAME_BETA3 0.9999
#define CAME_EPS2 1e-16
#define CAME_CLIP_THRESHOLD 1.0

// the kind named name ("adamw", "adafactor", "came"), or -1 if none is
static int optimizer_from_name(const char* name) {
    for (int k = 0; k < NUM_OPTIMIZERS; k++) {
        if (strcmp(name, OPTIMIZER_NAMES[k]) == 0) { return k; }
    }
    return -1;
}

// Hyperparameters are doubles, as the Python floats of the packages: where one meets an
// fp32 tensor it is rounded to float, and an EMA's 1 - beta is taken in double first.
// (With float betas, 1 - 0.9999f is 1.7e-4 away from 1e-4f, and CAME's confidence factor,
// which scales the update by rsqrt of that EMA, moves every update by about 1e-4.)
typedef struct {
    double lr, beta1, beta2, eps;
    double weight_decay;    // decoupled, 2-D weights only
} AdamWHyper;

#define ADAFACTOR_MAX_RELATIVE_STEP 1e-2  // relative step: lr_t = min(this, 1/sqrt(t))

typedef struct {
    double lr;              // fixed learning rate; unused when relative_step
    double beta1;           // 0 = no first moment (the memory-saving setting)
    double decay_rate;      // beta2_t = 1 - t^decay_rate (HF: -0.8)
    double eps1;            // added to g^2 (HF eps[0])
    double eps2;            // floor under RMS(p) for scale_parameter (HF eps[1], 1e-3)
    double clip_threshold;  // U /= max(1, RMS(U) / clip_threshold) (HF: 1.0)
    double weight_decay;    // p -= weight_decay * lr_t * p
    int scale_parameter;    // lr_t *= max(eps2, RMS(p))
    int relative_step;      // lr_t = min(1e-2, 1/sqrt(t)) in place of lr
} AdafactorHyper;

typedef struct {
    double lr;
    double beta1, beta2, beta3;  // first moment, second moment, residual (confidence) EMAs
    double eps1, eps2;           // added to g^2, added to the squared residual
    double clip_threshold;       // U /= max(1, RMS(U) / clip_threshold) (package: 1.0)
    double weight_decay;         // p -= weight_decay * lr * p
} CAMEHyper;

// the hyperparameters of every optimizer; optimizer_step reads the one it runs
typedef struct {
    AdamWHyper adamw;
    AdafactorHyper adafactor;
    CAMEHyper came;
} OptimizerHyper;

// ----------------------------------------------------------------------------
// this process's part of one slice, and sums over a fixed partition (thread-count independent)

// adds n doubles across the processes that share a slice (ZeRO-1), in place, so that every
// process ends with the total; NULL when one process holds the whole slice
typedef void (*OptSumFn)(double* x, size_t n);

// gathers a buffer whose rank r part (counts[r] floats, parts in rank order) each rank holds
// (ZeRO-1: the column statistics), in place, so that every rank ends with all of it
typedef void (*OptGatherFn)(float* buf, const int* counts);

static void opt_sum_across(OptSumFn sum, double* x, size_t n) {
    if (sum != NULL) { sum(x, n); }
}

// ZeRO-1 cuts `units` (rows, elements or columns) into world blocks of ceil(units / world)
static int shard_units_per_rank(int units, int world) { return (units + world - 1) / world; }

// rank's units [*begin, *end) of a slice of `units`
static void shard_range(int units, int rank, int world, int* begin, int* end) {
    int per = shard_units_per_rank(units, world);
    *begin = rank * per < units ? rank * per : units;
    *end = (rank + 1) * per < units ? (rank + 1) * per : units;
}

// the part of one slice that this process updates: all of it, or under ZeRO-1 a block of
// a matrix's rows or of a vector's elements (see OptSharding below). Statistics over the
// whole slice (column means, mean(R), RMS) are each process's sums added by `sum`.
typedef struct {
    int rows, cols;       // this part: (rows, cols) of a matrix, (1, n) of a vector's elements
    int total_rows;       // rows of the whole slice (1 for a vector)
    size_t total;         // elements of the whole slice
    int factored;         // the whole slice is a matrix (even if this part has one row, or none)
    size_t state_units;   // rows (matrix) or elements (vector) the state is sized for, >= this part's
    int width;            // floats per unit: cols for a matrix, 1 for a vector
    // a matrix's column statistics are sharded too: this process keeps columns
    // [col_begin, col_begin + col_count) of them, in state sized for col_units columns
    int col_begin, col_count;
    size_t col_units;
    int rank, world;      // of the processes that share the slice
    OptSumFn sum;         // NULL: this part is the whole slice
    OptGatherFn gather;   // NULL: this part is the whole slice
} OptShard;

// a slice (rows, cols) is a matrix unless one side is 1 (then a vector, handled as (1, n))
static int opt_is_matrix(int rows, int cols) { return rows > 1 && cols > 1; }

#define OPT_PARTS 64  // every sum is split into this many parts, added in order

// [begin, end) of part p of n items
static void opt_part(size_t n, int p, size_t* begin, size_t* end) {
    *begin = n * p / OPT_PARTS;
    *end = n * (p + 1) / OPT_PARTS;
}

// an EMA's coefficients in fp32: avg = beta * avg + one_minus_beta * x
typedef struct { float beta, one_minus_beta; } OptEma;

static OptEma opt_ema_coeffs(double beta) {
    OptEma e = {(float)beta, (float)(1.0 - beta)};
    return e;
}

static float opt_ema(float avg, float x, OptEma e) { return e.beta * avg + e.one_minus_beta * x; }

static float opt_rsqrt(float x) { return 1.0f / sqrtf(x); }

// sum of x_i^2 over x (n), in double over the fixed partition
static double opt_sum_squares(const float* x, size_t n) {
    double part[OPT_PARTS], total = 0.0;
    #pragma omp parallel for
    for (int p = 0; p < OPT_PARTS; p++) {
        size_t b, e;
        opt_part(n, p, &b, &e);
        double s = 0.0;
        for (size_t i = b; i < e; i++) { s += (double)x[i] * x[i]; }
        part[p] = s;
    }
    for (int p = 0; p < OPT_PARTS; p++) { total += part[p]; }
    return total;
}

// RMS over the whole slice, of which x (n) is this process's part
static float opt_rms(const float* x, size_t n, const OptShard* sh) {
    double s = opt_sum_squares(x, n);
    opt_sum_across(sh->sum, &s, 1);
    return (float)sqrt(s / (double)sh->total);
}

// ----------------------------------------------------------------------------
// the second moment shared by Adafactor and CAME: U_ij = (scale_row_i * scale_col_j) g_ij
// (a vector is handled as one row: scale_row = {1}, scale_col = rsqrt(V))

typedef struct {
    float* scale_row;   // (rows) of this part
    float* scale_col;   // (cols)
    double* col_parts;  // (OPT_PARTS, cols) column sums of each part of the rows; matrices only
    double* col_sum;    // (cols) their total over the parts and the processes; matrices only
    float* col_full;    // (cols) a column statistic whole, gathered from its shards; matrices only
} OptWorkspace;

static OptWorkspace opt_workspace_alloc(const OptShard* sh) {
    OptWorkspace w;
    int rows = sh->rows > 1 ? sh->rows : 1;  // scale_row[0] exists even for an empty part
    w.scale_row = (float*)malloc_check((size_t)rows * sizeof(float));
    w.scale_col = (float*)malloc_check((size_t)sh->cols * sizeof(float));
    w.col_parts = sh->factored ? (double*)malloc_check((size_t)OPT_PARTS * sh->cols * sizeof(double)) : NULL;
    w.col_sum = sh->factored ? (double*)malloc_check((size_t)sh->cols * sizeof(double)) : NULL;
    w.col_full = sh->factored ? (float*)malloc_check((size_t)sh->cols * sizeof(float)) : NULL;
    return w;
}

static void opt_workspace_free(OptWorkspace* w) {
    free(w->scale_row);
    free(w->scale_col);
    free(w->col_parts);
    free(w->col_sum);
    free(w->col_full);
}

// ema of the column means over the whole slice, from this part's column sums of the row parts
// (added in part order, then across the processes), on this process's shard of the column
// statistic col; leaves the whole statistic in w->col_full
static void opt_ema_col_means(float* col, OptWorkspace* w, const OptShard* sh, OptEma ema) {
    int cols = sh->cols;
    for (int j = 0; j < cols; j++) {
        double s = 0.0;
        for (int p = 0; p < OPT_PARTS; p++) { s += w->col_parts[(size_t)p * cols + j]; }
        w->col_sum[j] = s;
    }
    opt_sum_across(sh->sum, w->col_sum, (size_t)cols);
    for (int c = 0; c < sh->col_count; c++) {
        int j = sh->col_begin + c;
        col[c] = opt_ema(col[c], (float)(w->col_sum[j] / sh->total_rows), ema);
        w->col_full[j] = col[c];
    }
    if (sh->gather != NULL) {
        int* counts = (int*)malloc_check((size_t)sh->world * sizeof(int));
        for (int r = 0; r < sh->world; r++) {
            int b, e;
            shard_range(cols, r, sh->world, &b, &e);
            counts[r] = e - b;
        }
        sh->gather(w->col_full, counts);
        free(counts);
    }
}

// ema(R, row means of G), ema(Cc, column means of G), G = g^2 + eps1, g (rows, cols) this part
static void opt_ema_grad_sq_factored(float* R, float* Cc, const float* g, const OptShard* sh,
                                     float eps1, OptEma ema, OptWorkspace* w) {
    int cols = sh->cols;
    #pragma omp parallel for
    for (int p = 0; p < OPT_PARTS; p++) {
        double* col_sum = w->col_parts + (size_t)p * cols;
        for (int j = 0; j < cols; j++) { col_sum[j] = 0.0; }
        size_t b, e;
        opt_part((size_t)sh->rows, p, &b, &e);
        for (size_t i = b; i < e; i++) {
            const float* gi = g + i * cols;
            double row_sum = 0.0;
            for (int j = 0; j < cols; j++) {
                float G = gi[j] * gi[j] + eps1;
                row_sum += G;
                col_sum[j] += G;
            }
            R[i] = opt_ema(R[i], (float)(row_sum / cols), ema);
        }
    }
    opt_ema_col_means(Cc, w, sh, ema);
}

// scale_row_i = rsqrt(R_i / mean(R)), scale_col_j = rsqrt(Cc_j): the factored rsqrt(V);
// mean(R) is over the whole slice's rows, Cc is the whole column statistic
static void opt_factored_scales(float* scale_row, float* scale_col, const float* R, const float* Cc, const OptShard* sh) {
    double s = 0.0;
    for (int i = 0; i < sh->rows; i++) { s += R[i]; }
    opt_sum_across(sh->sum, &s, 1);
    float mean = (float)(s / sh->total_rows);
    for (int i = 0; i < sh->rows; i++) { scale_row[i] = opt_rsqrt(R[i] / mean); }
    for (int j = 0; j < sh->cols; j++) { scale_col[j] = opt_rsqrt(Cc[j]); }
}

// updates the second-moment state v (factored: R then Cc; vector: V) with g and fills
// the workspace's scales so that U_ij = (scale_row_i * scale_col_j) g_ij
static void opt_second_moment(float* v, const float* g, const OptShard* sh, float eps1, OptEma ema, OptWorkspace* w) {
    if (sh->factored) {
        float* R = v;
        float* Cc = v + sh->state_units;  // this process's columns
        opt_ema_grad_sq_factored(R, Cc, g, sh, eps1, ema, w);
        opt_factored_scales(w->scale_row, w->scale_col, R, w->col_full, sh);
        return;
    }
    w->scale_row[0] = 1.0f;
    for (int j = 0; j < sh->cols; j++) {
        v[j] = opt_ema(v[j], g[j] * g[j] + eps1, ema);
        w->scale_col[j] = opt_rsqrt(v[j]);
    }
}

// max(1, RMS(U) / clip_threshold) for U_ij = (scale_row_i * scale_col_j) g_ij, RMS over the whole slice
static float opt_clip_divisor(const float* g, const OptWorkspace* w, const OptShard* sh, float clip_threshold) {
    double part[OPT_PARTS], total = 0.0;
    int cols = sh->cols;
    #pragma omp parallel for
    for (int p = 0; p < OPT_PARTS; p++) {
        size_t b, e;
        opt_part((size_t)sh->rows, p, &b, &e);
        double s = 0.0;
        for (size_t i = b; i < e; i++) {
            for (int j = 0; j < cols; j++) {
                float u = (w->scale_row[i] * w->scale_col[j]) * g[i * cols + j];
                s += (double)u * u;
            }
        }
        part[p] = s;
    }
    for (int p = 0; p < OPT_PARTS; p++) { total += part[p]; }
    opt_sum_across(sh->sum, &total, 1);
    float rms = (float)sqrt(total / (double)sh->total);
    return fmaxf(1.0f, rms / clip_threshold);
}

// ----------------------------------------------------------------------------
// Adafactor

static size_t adafactor_state_floats(const OptShard* sh, int use_beta1) {
    size_t n = sh->state_units * sh->width;
    size_t second = sh->factored ? sh->state_units + sh->col_units : n;
    return second + (use_beta1 ? n : 0);
}

// step 1: the learning rate of this step, from p (this part, n) before the update
static float adafactor_lr(const float* param, size_t n, const OptShard* sh, const AdafactorHyper* h, int t) {
    double step = h->relative_step ? fmin(ADAFACTOR_MAX_RELATIVE_STEP, 1.0 / sqrt((double)t)) : h->lr;
    float lr = (float)step;
    if (h->scale_parameter) { lr *= fmaxf((float)h->eps2, opt_rms(param, n, sh)); }
    return lr;
}

// one Adafactor step on this process's part of one slice; state as in the layout at the top
static void adafactor_update(float* param, const float* grad, float* state, const OptShard* sh,
                             const AdafactorHyper* h, int t) {
    int rows = sh->rows, cols = sh->cols;
    float lr = adafactor_lr(param, (size_t)rows * cols, sh, h, t);
    double beta2 = 1.0 - pow((double)t, (double)h->decay_rate);  // 0 at t = 1
    OptWorkspace w = opt_workspace_alloc(sh);
    opt_second_moment(state, grad, sh, (float)h->eps1, opt_ema_coeffs(beta2), &w);
    float clip = opt_clip_divisor(grad, &w, sh, (float)h->clip_threshold);
    float* M = h->beta1 > 0.0 ? state + adafactor_state_floats(sh, 0) : NULL;
    OptEma e1 = opt_ema_coeffs(h->beta1);
    float decay = (float)(-h->weight_decay * lr);
    #pragma omp parallel for
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) {
            size_t k = (size_t)i * cols + j;
            float u = (w.scale_row[i] * w.scale_col[j]) * grad[k] / clip * lr;
            if (M) { M[k] = opt_ema(M[k], u, e1); u = M[k]; }
            if (h->weight_decay != 0.0) { param[k] += decay * param[k]; }
            param[k] -= u;
        }
    }
    opt_workspace_free(&w);
}

// ----------------------------------------------------------------------------
// CAME

static size_t came_state_floats(const OptShard* sh) {
    size_t n = sh->state_units * sh->width;
    return n + (sh->factored ? 2 * (sh->state_units + sh->col_units) : n);
}

// steps 4-5 of a matrix: ema(M, U), then ema(Rr, Rc) of the row/column means of
// Res = (U - M)^2 + eps2, with U_ij = (scale_row_i scale_col_j) g_ij / clip
static void came_moment_and_residual(float* M, float* Rr, float* Rc, const float* g, const OptShard* sh,
                                     float clip, const CAMEHyper* h, OptWorkspace* w) {
    OptEma e1 = opt_ema_coeffs(h->beta1), e3 = opt_ema_coeffs(h->beta3);
    float eps2 = (float)h->eps2;
    int cols = sh->cols;
    #pragma omp parallel for
    for (int p = 0; p < OPT_PARTS; p++) {
        double* col_sum = w->col_parts + (size_t)p * cols;
        for (int j = 0; j < cols; j++) { col_sum[j] = 0.0; }
        size_t b, e;
        opt_part((size_t)sh->rows, p, &b, &e);
        for (size_t i = b; i < e; i++) {
            double row_sum = 0.0;
            for (int j = 0; j < cols; j++) {
                size_t k = i * cols + j;
                float u = (w->scale_row[i] * w->scale_col[j]) * g[k] / clip;
                M[k] = opt_ema(M[k], u, e1);
                float d = u - M[k];
                float res = d * d + eps2;
                row_sum += res;
                col_sum[j] += res;
            }
            Rr[i] = opt_ema(Rr[i], (float)(row_sum / cols), e3);
        }
    }
    opt_ema_col_means(Rc, w, sh, e3);
}

// step 4 of a vector: ema(M, U); its update is M itself (scales of 1)
static void came_moment_vector(float* M, const float* g, int n, float clip, const CAMEHyper* h, OptWorkspace* w) {
    OptEma e1 = opt_ema_coeffs(h->beta1);
    for (int j = 0; j < n; j++) {
        float u = w->scale_col[j] * g[j] / clip;  // scale_row[0] = 1
        M[j] = opt_ema(M[j], u, e1);
        w->scale_col[j] = 1.0f;
    }
}

// one CAME step on this process's part of one slice; state as in the layout at the top
static void came_update(float* param, const float* grad, float* state, const OptShard* sh, const CAMEHyper* h) {
    int rows = sh->rows, cols = sh->cols;
    float* M = state;
    float* v = state + sh->state_units * sh->width;  // factored: R, Cc, Rr, Rc; vector: V
    OptWorkspace w = opt_workspace_alloc(sh);
    opt_second_moment(v, grad, sh, (float)h->eps1, opt_ema_coeffs(h->beta2), &w);
    float clip = opt_clip_divisor(grad, &w, sh, (float)h->clip_threshold);
    if (sh->factored) {
        float* Rr = v + sh->state_units + sh->col_units;
        float* Rc = Rr + sh->state_units;  // this process's columns
        came_moment_and_residual(M, Rr, Rc, grad, sh, clip, h, &w);
        opt_factored_scales(w.scale_row, w.scale_col, Rr, w.col_full, sh);  // the confidence factor
    } else {
        came_moment_vector(M, grad, cols, clip, h, &w);
    }
    float decay = (float)(-h->weight_decay * h->lr), lr = (float)h->lr;
    #pragma omp parallel for
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) {
            size_t k = (size_t)i * cols + j;
            if (h->weight_decay != 0.0) { param[k] += decay * param[k]; }
            param[k] -= (w.scale_row[i] * w.scale_col[j]) * M[k] * lr;
        }
    }
    opt_workspace_free(&w);
}

// ----------------------------------------------------------------------------
// AdamW: elementwise, so a part of a slice is updated as it stands (adamw_update, cpu_layers.h)

static size_t adamw_state_floats(const OptShard* sh) { return 2 * sh->state_units * sh->width; }

// m = state, v = state + (state_units * width); weight decay on the 2-D weights only
static void adamw_update_part(float* param, const float* grad, float* state, const OptShard* sh,
                              const AdamWHyper* h, int is_matrix_tensor, int t) {
    double wd = is_matrix_tensor ? h->weight_decay : 0.0;
    adamw_update(param, grad, state, state + sh->state_units * sh->width, (size_t)sh->rows * sh->cols,
                 (float)h->lr, (float)h->beta1, (float)h->beta2, (float)h->eps, (float)wd, t);
}

// ----------------------------------------------------------------------------
// the model's optimizer parameters: the 16 tensors split into layer slices

typedef struct {
    int tensor;      // index into PARAMETER_NAMES
    int layer;       // -1 for wte, wpe, lnfw, lnfb
    int rows, cols;  // rows == 1: a vector
    size_t offset;   // floats from the start of the parameters (and of the gradients)
} ParamSlice;

// tensors 2 (ln1w) .. 13 (fcprojb) hold one slice per layer, layer-major
static int tensor_is_per_layer(int i) { return i >= 2 && i <= 13; }

static int param_slice_count(const GPT2Config* c) { return 4 + 12 * c->num_layers; }

// fills s[param_slice_count(c)] in checkpoint order; shapes as in gpt2_parameter_sizes
static void param_slices(ParamSlice* s, const GPT2Config* c) {
    int C = c->channels, V = c->vocab_size, maxT = c->max_seq_len;
    const int shape[NUM_PARAMETER_TENSORS][2] = {
        {V, C}, {maxT, C}, {1, C}, {1, C}, {3 * C, C}, {1, 3 * C}, {C, C}, {1, C},
        {1, C}, {1, C}, {4 * C, C}, {1, 4 * C}, {C, 4 * C}, {1, C}, {1, C}, {1, C},
    };  // wte: the V real rows only
    size_t sizes[NUM_PARAMETER_TENSORS], off = 0;
    gpt2_parameter_sizes(sizes, c);
    int n = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        int layers = tensor_is_per_layer(i) ? c->num_layers : 1;
        for (int l = 0; l < layers; l++) {
            ParamSlice p = {i, tensor_is_per_layer(i) ? l : -1, shape[i][0], shape[i][1],
                            off + (size_t)l * shape[i][0] * shape[i][1]};
            s[n++] = p;
        }
        off += sizes[i];
    }
}

// the slice list of a model (free() it)
static ParamSlice* param_slices_alloc(const GPT2Config* c) {
    ParamSlice* s = (ParamSlice*)malloc_check((size_t)param_slice_count(c) * sizeof(ParamSlice));
    param_slices(s, c);
    return s;
}

// ----------------------------------------------------------------------------
// ZeRO-1 sharding: every slice is cut into `world` parts along its units, a matrix's rows
// or a vector's elements; rank r owns units [r*per, min(units, (r+1)*per)) with
// per = ceil(units / world). Every rank's state is sized for per units, so all ranks have
// one layout and one size (a last rank owning fewer units, or none, leaves padding).

typedef struct {
    int rank, world;     // world 1: one process holds every slice whole
    OptSumFn sum;        // adds statistics across the ranks; NULL when world is 1
    OptGatherFn gather;  // gathers the column statistics' shards; NULL when world is 1
} OptSharding;

static const OptSharding OPT_UNSHARDED = {0, 1, NULL, NULL};

static int slice_units(const ParamSlice* s) { return opt_is_matrix(s->rows, s->cols) ? s->rows : s->rows * s->cols; }
static int slice_unit_width(const ParamSlice* s) { return opt_is_matrix(s->rows, s->cols) ? s->cols : 1; }
// rank z->rank's part of slice s; *offset = floats from the slice's start to the part's
static OptShard slice_shard(const ParamSlice* s, const OptSharding* z, size_t* offset) {
    int units = slice_units(s), width = slice_unit_width(s), begin, end;
    shard_range(units, z->rank, z->world, &begin, &end);
    OptShard sh;
    sh.factored = opt_is_matrix(s->rows, s->cols);
    sh.rows = sh.factored ? end - begin : 1;
    sh.cols = sh.factored ? s->cols : end - begin;
    sh.total_rows = sh.factored ? s->rows : 1;
    sh.total = (size_t)s->rows * s->cols;
    sh.state_units = (size_t)shard_units_per_rank(units, z->world);
    sh.width = width;
    int col_end;
    shard_range(s->cols, z->rank, z->world, &sh.col_begin, &col_end);
    sh.col_count = sh.factored ? col_end - sh.col_begin : 0;
    sh.col_units = sh.factored ? (size_t)shard_units_per_rank(s->cols, z->world) : 0;
    sh.rank = z->rank;
    sh.world = z->world;
    sh.sum = z->sum;
    sh.gather = z->gather;
    *offset = (size_t)begin * width;
    return sh;
}

// counts[r] = floats of rank r's part of slice s, r = 0..world-1 (for the collectives)
static void slice_part_counts(const ParamSlice* s, int world, int* counts) {
    if ((size_t)s->rows * s->cols > (size_t)INT_MAX) { fail("a slice of %d x %d floats is beyond MPI's int counts", s->rows, s->cols); }
    for (int r = 0; r < world; r++) {
        int begin, end;
        shard_range(slice_units(s), r, world, &begin, &end);
        counts[r] = (end - begin) * slice_unit_width(s);
    }
}

// floats of optimizer state for this process's part of one slice
static size_t slice_state_floats(OptimizerKind kind, const OptShard* sh, int use_beta1) {
    if (kind == OPT_ADAMW) { return adamw_state_floats(sh); }
    return kind == OPT_ADAFACTOR ? adafactor_state_floats(sh, use_beta1) : came_state_floats(sh);
}

// floats of optimizer state of one rank out of `world` (1: unsharded); use_beta1 matters to Adafactor only
static size_t optimizer_state_floats(const GPT2Config* c, OptimizerKind kind, int use_beta1, int world) {
    ParamSlice* s = param_slices_alloc(c);
    OptSharding z = {0, world, NULL, NULL};  // every rank's state has rank 0's size
    size_t total = 0, offset;
    for (int k = 0; k < param_slice_count(c); k++) {
        OptShard sh = slice_shard(&s[k], &z, &offset);
        total += slice_state_floats(kind, &sh, use_beta1);
    }
    free(s);
    return total;
}

// one optimizer step over this process's part of every slice (gradients already clipped);
// t = 1, 2, ...; z = &OPT_UNSHARDED for the whole model
static void optimizer_step(OptimizerKind kind, float* params, const float* grads, float* state,
                           const GPT2Config* c, const OptimizerHyper* h, int t, const OptSharding* z) {
    ParamSlice* s = param_slices_alloc(c);
    int use_beta1 = h->adafactor.beta1 > 0.0;
    float* st = state;
    for (int k = 0; k < param_slice_count(c); k++) {
        size_t offset;
        OptShard sh = slice_shard(&s[k], z, &offset);
        float* p = params + s[k].offset + offset;
        const float* g = grads + s[k].offset + offset;
        if (kind == OPT_ADAMW) {
            adamw_update_part(p, g, st, &sh, &h->adamw, PARAMETER_IS_MATRIX[s[k].tensor], t);
        } else if (kind == OPT_ADAFACTOR) {
            adafactor_update(p, g, st, &sh, &h->adafactor, t);
        } else {
            came_update(p, g, st, &sh, &h->came);
        }
        st += slice_state_floats(kind, &sh, use_beta1);
    }
    free(s);
}

#endif // LLMC_OPTIMIZERS_H
