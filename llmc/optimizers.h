/*
optimizers.h: AdamW, Adafactor and CAME on the CPU, fp32, for the 16 GPT-2 tensors.

    size_t n = optimizer_state_floats(&cfg, OPT_CAME, 0);          // zeroed before step 1
    float* state = calloc(n, sizeof(float));
    optimizer_step(OPT_CAME, params, grads, state, &cfg, &hyper, t); // t = 1, 2, ...

One optimizer "parameter" is one torch tensor of the reference (dev/reference/README.md):
layer l's slice of a per-layer tensor is its own parameter (qkvw of layer l is its own
(3C, C) matrix, ln1w of layer l its own (C) vector); wte is one (V, C) matrix over the
UNPADDED rows (rows V..Vp-1 are never read or written: they stay zero); wpe is (maxT, C).
A slice with rows == 1 or cols == 1 is a vector; every other slice is a matrix (unlike torch,
which factors every 2-D tensor: they differ only for a model with maxT == 1 or V == 1).
Adafactor and CAME keep FACTORED second moments for matrices (a row and a column
statistic, rows + cols floats, instead of rows * cols) and full ones for vectors.
AdamW is the existing adamw_update (cpu_layers.h), called per whole tensor as
train_gpt.c does (it is elementwise, so slices would change nothing).

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

State layout (one block of floats, zeroed before step 1):
  AdamW:     m (P) then v (P), over the padded parameter layout, as train_gpt.c.
  Adafactor, CAME: the slices in checkpoint order (wte, wpe, ln1w of layer 0..L-1, ln1b of
  layer 0..L-1, qkvw 0..L-1, ..., fcprojb 0..L-1, lnfw, lnfb), each slice's state contiguous:
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
#define ADAFACTOR_EPS1 1e-30            // added to g^2
#define ADAFACTOR_EPS2 1e-3             // floor of RMS(p) in the relative step
#define ADAFACTOR_CLIP_THRESHOLD 1.0    // update clipping: RMS(U) / d with d = 1
#define CAME_BETA1 0.9
#define CAME_BETA2 0.999
#define CAME_BETA3 0.9999
#define CAME_EPS1 1e-30
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
// sums over a fixed partition (thread-count independent), and the small helpers

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

// RMS of x (n), summed in double over the fixed partition
static float opt_rms(const float* x, size_t n) {
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
    return (float)sqrt(total / (double)n);
}

// ----------------------------------------------------------------------------
// the second moment shared by Adafactor and CAME: U_ij = (scale_row_i * scale_col_j) g_ij
// (a vector is handled as one row: scale_row = {1}, scale_col = rsqrt(V))

typedef struct {
    float* scale_row;   // (rows)
    float* scale_col;   // (cols)
    double* col_parts;  // (OPT_PARTS, cols) column sums of each part of the rows
} OptWorkspace;

static OptWorkspace opt_workspace_alloc(int rows, int cols) {
    OptWorkspace w;
    w.scale_row = (float*)malloc_check((size_t)rows * sizeof(float));
    w.scale_col = (float*)malloc_check((size_t)cols * sizeof(float));
    w.col_parts = rows > 1 ? (double*)malloc_check((size_t)OPT_PARTS * cols * sizeof(double)) : NULL;
    return w;
}

static void opt_workspace_free(OptWorkspace* w) {
    free(w->scale_row);
    free(w->scale_col);
    free(w->col_parts);
}

// ema of the column means from the column sums of the parts, added in part order
static void opt_ema_col_means(float* col, const double* col_parts, int rows, int cols, OptEma ema) {
    for (int j = 0; j < cols; j++) {
        double s = 0.0;
        for (int p = 0; p < OPT_PARTS; p++) { s += col_parts[(size_t)p * cols + j]; }
        col[j] = opt_ema(col[j], (float)(s / rows), ema);
    }
}

// ema(R, row means of G), ema(Cc, column means of G), G = g^2 + eps1, g (rows, cols)
static void opt_ema_grad_sq_factored(float* R, float* Cc, const float* g, int rows, int cols,
                                     float eps1, OptEma ema, double* col_parts) {
    #pragma omp parallel for
    for (int p = 0; p < OPT_PARTS; p++) {
        double* col_sum = col_parts + (size_t)p * cols;
        for (int j = 0; j < cols; j++) { col_sum[j] = 0.0; }
        size_t b, e;
        opt_part((size_t)rows, p, &b, &e);
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
    opt_ema_col_means(Cc, col_parts, rows, cols, ema);
}

// scale_row_i = rsqrt(R_i / mean(R)), scale_col_j = rsqrt(Cc_j): the factored rsqrt(V)
static void opt_factored_scales(float* scale_row, float* scale_col, const float* R, const float* Cc, int rows, int cols) {
    double s = 0.0;
    for (int i = 0; i < rows; i++) { s += R[i]; }
    float mean = (float)(s / rows);
    for (int i = 0; i < rows; i++) { scale_row[i] = opt_rsqrt(R[i] / mean); }
    for (int j = 0; j < cols; j++) { scale_col[j] = opt_rsqrt(Cc[j]); }
}

// updates the second-moment state v (factored: R then Cc; vector: V) with g and fills
// the workspace's scales so that U_ij = (scale_row_i * scale_col_j) g_ij
static void opt_second_moment(float* v, const float* g, int rows, int cols, float eps1,
                              OptEma ema, OptWorkspace* w) {
    if (rows > 1) {
        opt_ema_grad_sq_factored(v, v + rows, g, rows, cols, eps1, ema, w->col_parts);
        opt_factored_scales(w->scale_row, w->scale_col, v, v + rows, rows, cols);
        return;
    }
    w->scale_row[0] = 1.0f;
    for (int j = 0; j < cols; j++) {
        v[j] = opt_ema(v[j], g[j] * g[j] + eps1, ema);
        w->scale_col[j] = opt_rsqrt(v[j]);
    }
}

// max(1, RMS(U) / clip_threshold) for U_ij = (scale_row_i * scale_col_j) g_ij
static float opt_clip_divisor(const float* g, const OptWorkspace* w, int rows, int cols, float clip_threshold) {
    double part[OPT_PARTS], total = 0.0;
    #pragma omp parallel for
    for (int p = 0; p < OPT_PARTS; p++) {
        size_t b, e;
        opt_part((size_t)rows, p, &b, &e);
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
    float rms = (float)sqrt(total / ((double)rows * cols));
    return fmaxf(1.0f, rms / clip_threshold);
}

// a vector arrives as (n, 1) or (1, n); it is handled as one row (1, n)
static int opt_is_matrix(int rows, int cols) { return rows > 1 && cols > 1; }

static void opt_as_row_if_vector(int* rows, int* cols) {
    if (!opt_is_matrix(*rows, *cols)) { *cols = *rows * *cols; *rows = 1; }
}

// ----------------------------------------------------------------------------
// Adafactor

static size_t adafactor_state_floats(int rows, int cols, int use_beta1) {
    size_t n = (size_t)rows * cols;
    size_t second = opt_is_matrix(rows, cols) ? (size_t)rows + cols : n;
    return second + (use_beta1 ? n : 0);
}

// step 1: the learning rate of this step, from p before the update
static float adafactor_lr(const float* param, size_t n, const AdafactorHyper* h, int t) {
    double step = h->relative_step ? fmin(ADAFACTOR_MAX_RELATIVE_STEP, 1.0 / sqrt((double)t)) : h->lr;
    float lr = (float)step;
    if (h->scale_parameter) { lr *= fmaxf((float)h->eps2, opt_rms(param, n)); }
    return lr;
}

// one Adafactor step on one parameter (rows, cols); state as in the layout at the top
static void adafactor_update(float* param, const float* grad, float* state, int rows, int cols,
                             const AdafactorHyper* h, int t) {
    size_t n = (size_t)rows * cols;
    float lr = adafactor_lr(param, n, h, t);
    double beta2 = 1.0 - pow((double)t, (double)h->decay_rate);  // 0 at t = 1
    opt_as_row_if_vector(&rows, &cols);
    OptWorkspace w = opt_workspace_alloc(rows, cols);
    opt_second_moment(state, grad, rows, cols, (float)h->eps1, opt_ema_coeffs(beta2), &w);
    float clip = opt_clip_divisor(grad, &w, rows, cols, (float)h->clip_threshold);
    float* M = h->beta1 > 0.0 ? state + adafactor_state_floats(rows, cols, 0) : NULL;
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

static size_t came_state_floats(int rows, int cols) {
    size_t n = (size_t)rows * cols;
    return n + (opt_is_matrix(rows, cols) ? 2 * ((size_t)rows + cols) : n);
}

// steps 4-5 of a matrix: ema(M, U), then ema(Rr, Rc) of the row/column means of
// Res = (U - M)^2 + eps2, with U_ij = (scale_row_i scale_col_j) g_ij / clip
static void came_moment_and_residual(float* M, float* Rr, float* Rc, const float* g, int rows, int cols,
                                     float clip, const CAMEHyper* h, OptWorkspace* w) {
    OptEma e1 = opt_ema_coeffs(h->beta1), e3 = opt_ema_coeffs(h->beta3);
    float eps2 = (float)h->eps2;
    #pragma omp parallel for
    for (int p = 0; p < OPT_PARTS; p++) {
        double* col_sum = w->col_parts + (size_t)p * cols;
        for (int j = 0; j < cols; j++) { col_sum[j] = 0.0; }
        size_t b, e;
        opt_part((size_t)rows, p, &b, &e);
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
    opt_ema_col_means(Rc, w->col_parts, rows, cols, e3);
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

// one CAME step on one parameter (rows, cols); state as in the layout at the top
static void came_update(float* param, const float* grad, float* state, int rows, int cols, const CAMEHyper* h) {
    int factored = opt_is_matrix(rows, cols);
    opt_as_row_if_vector(&rows, &cols);
    size_t n = (size_t)rows * cols;
    float* M = state;
    float* v = state + n;  // factored: R, Cc, Rr, Rc; vector: V
    OptWorkspace w = opt_workspace_alloc(rows, cols);
    opt_second_moment(v, grad, rows, cols, (float)h->eps1, opt_ema_coeffs(h->beta2), &w);
    float clip = opt_clip_divisor(grad, &w, rows, cols, (float)h->clip_threshold);
    if (factored) {
        float* Rr = v + rows + cols;
        float* Rc = Rr + rows;
        came_moment_and_residual(M, Rr, Rc, grad, rows, cols, clip, h, &w);
        opt_factored_scales(w.scale_row, w.scale_col, Rr, Rc, rows, cols);  // the confidence factor
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

// floats of optimizer state for one slice (Adafactor, CAME)
static size_t slice_state_floats(OptimizerKind kind, const ParamSlice* s, int use_beta1) {
    return kind == OPT_ADAFACTOR ? adafactor_state_floats(s->rows, s->cols, use_beta1)
                                 : came_state_floats(s->rows, s->cols);
}

// floats of optimizer state for the model; use_beta1 matters to Adafactor only
static size_t optimizer_state_floats(const GPT2Config* c, OptimizerKind kind, int use_beta1) {
    if (kind == OPT_ADAMW) { return 2 * gpt2_num_parameters(c); }
    int n = param_slice_count(c);
    ParamSlice* s = (ParamSlice*)malloc_check((size_t)n * sizeof(ParamSlice));
    param_slices(s, c);
    size_t total = 0;
    for (int k = 0; k < n; k++) { total += slice_state_floats(kind, &s[k], use_beta1); }
    free(s);
    return total;
}

// AdamW over the 16 whole tensors, as train_gpt.c's gpt2_update: m = state, v = state + P
static void adamw_step(float* params, const float* grads, float* state, const GPT2Config* c,
                       const AdamWHyper* h, int t) {
    size_t sizes[NUM_PARAMETER_TENSORS], off = 0, P = gpt2_num_parameters(c);
    gpt2_parameter_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        double wd = PARAMETER_IS_MATRIX[i] ? h->weight_decay : 0.0;
        adamw_update(params + off, grads + off, state + off, state + P + off, sizes[i],
                     (float)h->lr, (float)h->beta1, (float)h->beta2, (float)h->eps, (float)wd, t);
        off += sizes[i];
    }
}

// one optimizer step over the whole model (gradients already clipped); t = 1, 2, ...
static void optimizer_step(OptimizerKind kind, float* params, const float* grads, float* state,
                           const GPT2Config* c, const OptimizerHyper* h, int t) {
    if (kind == OPT_ADAMW) { adamw_step(params, grads, state, c, &h->adamw, t); return; }
    int n = param_slice_count(c), use_beta1 = h->adafactor.beta1 > 0.0;
    ParamSlice* s = (ParamSlice*)malloc_check((size_t)n * sizeof(ParamSlice));
    param_slices(s, c);
    float* st = state;
    for (int k = 0; k < n; k++) {
        float* p = params + s[k].offset;
        const float* g = grads + s[k].offset;
        if (kind == OPT_ADAFACTOR) {
            adafactor_update(p, g, st, s[k].rows, s[k].cols, &h->adafactor, t);
        } else {
            came_update(p, g, st, s[k].rows, s[k].cols, &h->came);
        }
        st += slice_state_floats(kind, &s[k], use_beta1);
    }
    free(s);
}

#endif // LLMC_OPTIMIZERS_H
