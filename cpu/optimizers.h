/*
optimizers.h: AdamW, Adafactor and CAME on the CPU, fp32, over the model's parameter slices,
with the state layout and ZeRO-1 sharding of llmc/opt_layout.h.

    size_t n = optimizer_state_floats(&cfg, OPT_CAME, 0, 1);        // zeroed before step 1
    float* state = calloc(n, sizeof(float));
    came_update(param, grad, state, &shard, &hyper.came);   // one slice part (OptShard: llmc/opt_layout.h)
    // the step over every slice, in any state format: optimizer_step (cpu/host_step.h)

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

  AdamW (Loshchilov & Hutter), bias-corrected: adamw_update below, called per slice (it is
  elementwise, so slices change nothing; the padded wte rows, whose gradient is zero, are
  skipped); weight decay on the 2-D weights only (PARAMETER_IS_MATRIX).

Determinism: every sum (means, RMS) is taken in double over a fixed partition of the rows
(OPT_PARTS parts) and the parts are added in order, so results do not depend on the thread
count. Failure: the update functions allocate a small workspace (rows + cols floats and
OPT_PARTS * cols doubles) and stop with a message if the host is out of memory.
*/
#ifndef CPU_OPTIMIZERS_H
#define CPU_OPTIMIZERS_H

#include <math.h>
#include <stddef.h>
#include <string.h>
#include "../llmc/utils.h"
#include "../llmc/model_config.h"
#include "../llmc/opt_layout.h"

// ----------------------------------------------------------------------------
// AdamW (Loshchilov & Hutter), bias-corrected, decoupled weight decay.
// t is the step number starting at 1. For each of the n entries:
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   p -= lr * ( (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * p )
// adamw_element is one entry (*m and *v updated in place, the new p returned), shared with the
// 8-bit and bf16 state of cpu/optimizers_lowp.h; the step's constants (AdamWCoeffs) are opt_layout.h's
static inline float adamw_element(float p, float g, float* m, float* v, const AdamWCoeffs* s) {
    float mi = s->beta1 * *m + (1.0f - s->beta1) * g;
    float vi = s->beta2 * *v + (1.0f - s->beta2) * g * g;
    *m = mi;
    *v = vi;
    float mhat = mi / s->bc1, vhat = vi / s->bc2;
    return p - s->lr * (mhat / (sqrtf(vhat) + s->eps) + s->weight_decay * p);
}

// every entry of params, grads, m, v (n)
static void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                         float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
    AdamWCoeffs s = adamw_coeffs(lr, beta1, beta2, eps, weight_decay, t);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { params[i] = adamw_element(params[i], grads[i], &m[i], &v[i], &s); }
}

// ----------------------------------------------------------------------------
// sums over a fixed partition (thread-count independent), and across the ranks of a slice

static void opt_sum_across(OptSumFn sum, double* x, size_t n) {
    if (sum != NULL) { sum(x, n); }
}

// --tp: adds x (n) across the tensor-parallel group when the statistic spans the tensor's parts there
// (split: 1); a split slice without the group's sum would be updated from its own part alone: stop
static void opt_sum_tp(const OptShard* sh, int split, double* x, size_t n) {
    if (!split) { return; }
    if (sh->tp_sum == NULL) { fail("an optimizer step over a tensor split by --tp, without the tensor-parallel group's sum (a bug)"); }
    sh->tp_sum(x, n);
}

// a sum over every element of the slice: this part's, added across the ZeRO ranks and the --tp group
static void opt_sum_elements(const OptShard* sh, double* x, size_t n) {
    opt_sum_across(sh->sum, x, n);
    opt_sum_tp(sh, sh->tp_rows || sh->tp_cols, x, n);
}

#define OPT_PARTS 64  // every sum is split into this many parts, added in order

// [begin, end) of part p of n items
static void opt_part(size_t n, int p, size_t* begin, size_t* end) {
    *begin = n * p / OPT_PARTS;
    *end = n * (p + 1) / OPT_PARTS;
}

// avg = beta * avg + one_minus_beta * x (OptEma, opt_ema_coeffs: llmc/opt_layout.h)
static float opt_ema(float avg, float x, OptEma e) { return e.beta * avg + e.one_minus_beta * x; }

static float opt_rsqrt(float x) { return 1.0f / sqrtf(x); }

#define OPT_SUM_LANES 8   // each part's sum in this many running sums (element i in lane i % 8), added in order at its end:
                          // the same order on every machine, and one a compiler can keep in vector registers

// sum of x_i^2 over x (n), in double, one thread: the lanes, then their sum in order
static double sum_squares_lanes(const float* x, size_t n) {
    double lane[OPT_SUM_LANES] = {0.0};
    size_t i = 0;
    for (; i + OPT_SUM_LANES <= n; i += OPT_SUM_LANES) {
        for (int k = 0; k < OPT_SUM_LANES; k++) { lane[k] += (double)x[i + k] * x[i + k]; }
    }
    for (int k = 0; i < n; i++, k++) { lane[k] += (double)x[i] * x[i]; }
    double s = 0.0;
    for (int k = 0; k < OPT_SUM_LANES; k++) { s += lane[k]; }
    return s;
}

// sum of x_i^2 over x (n), in double over the fixed partition
static double opt_sum_squares(const float* x, size_t n) {
    double part[OPT_PARTS], total = 0.0;
    #pragma omp parallel for
    for (int p = 0; p < OPT_PARTS; p++) {
        size_t b, e;
        opt_part(n, p, &b, &e);
        part[p] = sum_squares_lanes(x + b, e - b);
    }
    for (int p = 0; p < OPT_PARTS; p++) { total += part[p]; }
    return total;
}

// RMS over the whole slice, of which x (n) is this process's part
static float opt_rms(const float* x, size_t n, const OptShard* sh) {
    double s = opt_sum_squares(x, n);
    opt_sum_elements(sh, &s, 1);
    return (float)sqrt(s / (double)sh->total);
}

// ----------------------------------------------------------------------------
// the second moment shared by Adafactor and CAME: U_ij = (scale_row_i * scale_col_j) g_ij
// (a vector is handled as one row: scale_row = {1}, scale_col = rsqrt(V))

typedef struct {
    float* scale_row;   // (rows) of this part
    float* scale_col;   // (cols)
    double* row_sum;    // (rows) a statistic's sums over each row's columns (--tp: added across the group); matrices only
    double* col_parts;  // (OPT_PARTS, cols) column sums of each part of the rows; matrices only
    double* col_sum;    // (cols) their total over the parts and the processes; matrices only
    float* col_full;    // (cols) a column statistic whole, gathered from its shards; matrices only
} OptWorkspace;

static OptWorkspace opt_workspace_alloc(const OptShard* sh) {
    OptWorkspace w;
    int rows = sh->rows > 1 ? sh->rows : 1;  // scale_row[0] exists even for an empty part
    w.scale_row = (float*)malloc_check((size_t)rows * sizeof(float));
    w.scale_col = (float*)malloc_check((size_t)sh->cols * sizeof(float));
    w.row_sum = sh->factored ? (double*)malloc_check((size_t)rows * sizeof(double)) : NULL;
    w.col_parts = sh->factored ? (double*)malloc_check((size_t)OPT_PARTS * sh->cols * sizeof(double)) : NULL;
    w.col_sum = sh->factored ? (double*)malloc_check((size_t)sh->cols * sizeof(double)) : NULL;
    w.col_full = sh->factored ? (float*)malloc_check((size_t)sh->cols * sizeof(float)) : NULL;
    return w;
}

static void opt_workspace_free(OptWorkspace* w) {
    free(w->scale_row);
    free(w->scale_col);
    free(w->row_sum);
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
    opt_sum_tp(sh, sh->tp_rows, w->col_sum, (size_t)cols);  // --tp: the group's rows of a column-parallel matrix
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

// The factored statistics (Adafactor's and CAME's G = g^2 + eps1, CAME's residual) of one element,
// and the pass that sums them by rows and by columns. A row's sum is one chain of dependent adds (in
// double) over its columns: one row at a time the pass waits on the adder's latency, not on memory.
// OPT_ROWS rows run side by side instead, each row's chain still in the order of its columns and each
// column's sum still in the order of the rows, so every sum is bitwise what one row at a time gives.
#define OPT_ROWS 4   // rows of a part whose sums run side by side: independent chains the core overlaps

typedef enum {
    OPT_STAT_GRAD_SQ,   // G = g^2 + eps
    OPT_STAT_RESIDUAL,  // CAME: u = (scale_row_i scale_col_j) g / clip; M = ema(M, u); (u - M)^2 + eps
} OptStatKind;

typedef struct {
    const float* g;           // (rows, cols) this part's gradient
    float eps;                // eps1 (G) or eps2 (residual)
    float* M;                 // residual only: the first moment, updated in the same pass
    const OptWorkspace* w;    // residual only: the second moment's scales
    float clip;               // residual only: the update's clip divisor
    OptEma e1;                // residual only: the first moment's EMA
} OptStatArgs;

#define OPT_COL_BLOCK 256   // columns of a row whose statistics are computed before they are summed

// x[j] = the statistic of row i's columns j0 .. j0 + nj - 1: no element waits on another, so the loop
// vectorizes (CAME's division included), and x stays in L1 for the sums
static inline void opt_stat_block(float* x, OptStatKind kind, const OptStatArgs* a, size_t i, int j0, int nj, int cols) {
    const float* g = a->g + i * cols + j0;
    float eps = a->eps;
    if (kind == OPT_STAT_GRAD_SQ) {
        for (int j = 0; j < nj; j++) { x[j] = g[j] * g[j] + eps; }
        return;
    }
    float* M = a->M + i * cols + j0;
    const float* scale_col = a->w->scale_col + j0;
    float scale_row = a->w->scale_row[i], clip = a->clip;
    OptEma e1 = a->e1;
    for (int j = 0; j < nj; j++) {
        float u = (scale_row * scale_col[j]) * g[j] / clip;
        float m = opt_ema(M[j], u, e1);
        M[j] = m;
        float d = u - m;
        x[j] = d * d + eps;
    }
}

// rows [i, i + nr) (nr <= OPT_ROWS) side by side: row_sums[i + r] = the sum of the row's elements, and
// each row's elements added to col_sum in row order, a block of columns at a time (opt_stat_block)
static inline void opt_stat_rows(double* row_sums, double* col_sum, size_t i, int nr, int cols, OptStatKind kind,
                                 const OptStatArgs* a) {
    double row_sum[OPT_ROWS] = {0.0};
    float x[OPT_ROWS][OPT_COL_BLOCK];
    for (int j0 = 0; j0 < cols; j0 += OPT_COL_BLOCK) {
        int nj = cols - j0 < OPT_COL_BLOCK ? cols - j0 : OPT_COL_BLOCK;
        for (int r = 0; r < nr; r++) { opt_stat_block(x[r], kind, a, i + r, j0, nj, cols); }
        for (int j = 0; j < nj; j++) {
            for (int r = 0; r < nr; r++) {
                row_sum[r] += x[r][j];
                col_sum[j0 + j] += x[r][j];
            }
        }
    }
    for (int r = 0; r < nr; r++) { row_sums[i + r] = row_sum[r]; }
}

// ema(row_stat, row means), ema(col_stat, column means) of the statistic over this part of a matrix;
// the row sums (--tp: with the group's columns of a row-parallel matrix added) and the column sums by
// parts of the rows (w->col_parts), then opt_ema_col_means
static inline void opt_ema_stat_factored(float* row_stat, float* col_stat, OptStatKind kind, const OptStatArgs* a,
                                  const OptShard* sh, OptEma ema, OptWorkspace* w) {
    int cols = sh->cols;
    #pragma omp parallel for
    for (int p = 0; p < OPT_PARTS; p++) {
        double* col_sum = w->col_parts + (size_t)p * cols;
        for (int j = 0; j < cols; j++) { col_sum[j] = 0.0; }
        size_t b, e, i;
        opt_part((size_t)sh->rows, p, &b, &e);
        for (i = b; i + OPT_ROWS <= e; i += OPT_ROWS) { opt_stat_rows(w->row_sum, col_sum, i, OPT_ROWS, cols, kind, a); }
        if (i < e) { opt_stat_rows(w->row_sum, col_sum, i, (int)(e - i), cols, kind, a); }
    }
    opt_sum_tp(sh, sh->tp_cols, w->row_sum, (size_t)sh->rows);
    for (int i = 0; i < sh->rows; i++) { row_stat[i] = opt_ema(row_stat[i], (float)(w->row_sum[i] / sh->total_cols), ema); }
    opt_ema_col_means(col_stat, w, sh, ema);
}

// ema(R, row means of G), ema(Cc, column means of G), G = g^2 + eps1, g (rows, cols) this part
static void opt_ema_grad_sq_factored(float* R, float* Cc, const float* g, const OptShard* sh,
                                     float eps1, OptEma ema, OptWorkspace* w) {
    OptStatArgs a = {.g = g, .eps = eps1, .M = NULL, .w = NULL, .clip = 1.0f, .e1 = {0.0f, 0.0f}};  // the residual's fields unused
    opt_ema_stat_factored(R, Cc, OPT_STAT_GRAD_SQ, &a, sh, ema, w);
}

// scale_row_i = rsqrt(R_i / mean(R)), scale_col_j = rsqrt(Cc_j): the factored rsqrt(V);
// mean(R) is over the whole slice's rows, Cc is the whole column statistic
static void opt_factored_scales(float* scale_row, float* scale_col, const float* R, const float* Cc, const OptShard* sh) {
    double s = 0.0;
    for (int i = 0; i < sh->rows; i++) { s += R[i]; }
    opt_sum_across(sh->sum, &s, 1);
    opt_sum_tp(sh, sh->tp_rows, &s, 1);  // --tp: the group's rows of a column-parallel matrix
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

// U_ij^2 in double, U_ij = (scale_row_i * scale_col_j) g_ij
static inline double opt_clip_elem(const float* g, const OptWorkspace* w, size_t i, int j, int cols) {
    float u = (w->scale_row[i] * w->scale_col[j]) * g[i * cols + j];
    return (double)u * u;
}

#define OPT_SIDE 4   // parts of the clip's sum that run side by side in one thread: OPT_PARTS is a multiple (test_gpt checks)

// the sum of U_ij^2 over this part of the slice, U_ij = (scale_row_i * scale_col_j) g_ij, in double.
// Each part's sum is one chain over its elements in (i, j) order; OPT_SIDE parts advance together, a
// row of each in turn, so their chains overlap and each is bitwise what it was alone
static double opt_clip_sum_squares(const float* g, const OptWorkspace* w, const OptShard* sh) {
    double part[OPT_PARTS], total = 0.0;
    int cols = sh->cols;
    #pragma omp parallel for
    for (int p0 = 0; p0 < OPT_PARTS; p0 += OPT_SIDE) {
        size_t b[OPT_SIDE], e[OPT_SIDE], common = (size_t)sh->rows;  // the rows every part of the group has
        double s[OPT_SIDE] = {0.0};
        for (int q = 0; q < OPT_SIDE; q++) {
            opt_part((size_t)sh->rows, p0 + q, &b[q], &e[q]);
            common = e[q] - b[q] < common ? e[q] - b[q] : common;
        }
        for (size_t r = 0; r < common; r++) {
            for (int j = 0; j < cols; j++) {
                for (int q = 0; q < OPT_SIDE; q++) { s[q] += opt_clip_elem(g, w, b[q] + r, j, cols); }
            }
        }
        for (int q = 0; q < OPT_SIDE; q++) {  // a part's rows past the common count (at most one), in order
            for (size_t i = b[q] + common; i < e[q]; i++) {
                for (int j = 0; j < cols; j++) { s[q] += opt_clip_elem(g, w, i, j, cols); }
            }
            part[p0 + q] = s[q];
        }
    }
    for (int p = 0; p < OPT_PARTS; p++) { total += part[p]; }
    return total;
}

// max(1, RMS(U) / clip_threshold), RMS over the whole slice (its parts' sums added across the processes)
static float opt_clip_divisor(const float* g, const OptWorkspace* w, const OptShard* sh, float clip_threshold) {
    double total = opt_clip_sum_squares(g, w, sh);
    opt_sum_elements(sh, &total, 1);
    float rms = (float)sqrt(total / (double)sh->total);
    return fmaxf(1.0f, rms / clip_threshold);
}

// ----------------------------------------------------------------------------
// Adafactor

// step 1: the learning rate of this step, from p (this part, n) before the update
static float adafactor_lr(const float* param, size_t n, const OptShard* sh, const AdafactorHyper* h, int t) {
    float lr = (float)adafactor_step_size(h, t);
    if (h->scale_parameter) { lr *= fmaxf((float)h->eps2, opt_rms(param, n, sh)); }
    return lr;
}

// one Adafactor step on this process's part of one slice; state as in the layout at the top
static void adafactor_update(float* param, const float* grad, float* state, const OptShard* sh,
                             const AdafactorHyper* h, int t) {
    int rows = sh->rows, cols = sh->cols;
    float lr = adafactor_lr(param, (size_t)rows * cols, sh, h, t);
    double beta2 = adafactor_beta2(h, t);  // 0 at t = 1
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

// steps 4-5 of a matrix: ema(M, U), then ema(Rr, Rc) of the row/column means of
// Res = (U - M)^2 + eps2, with U_ij = (scale_row_i scale_col_j) g_ij / clip
static void came_moment_and_residual(float* M, float* Rr, float* Rc, const float* g, const OptShard* sh,
                                     float clip, const CAMEHyper* h, OptWorkspace* w) {
    OptStatArgs a = {.g = g, .eps = (float)h->eps2, .M = M, .w = w, .clip = clip, .e1 = opt_ema_coeffs(h->beta1)};
    opt_ema_stat_factored(Rr, Rc, OPT_STAT_RESIDUAL, &a, sh, opt_ema_coeffs(h->beta3), w);
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
    float* v = state + opt_moment_floats(sh);  // factored: R, Cc, Rr, Rc; vector: V
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
// AdamW on a part of a slice: elementwise, so the part is updated as it stands

// m = state, v = state + (state_units * width); weight decay on the 2-D weights only
static void adamw_update_part(float* param, const float* grad, float* state, const OptShard* sh,
                              const AdamWHyper* h, int is_matrix_tensor, int t) {
    double wd = is_matrix_tensor ? h->weight_decay : 0.0;
    adamw_update(param, grad, state, state + opt_moment_floats(sh), (size_t)sh->rows * sh->cols,
                 (float)h->lr, (float)h->beta1, (float)h->beta2, (float)h->eps, (float)wd, t);
}

// the gradients' global L2 norm, summed in double over a fixed partition: the same result for
// any thread count
#define NORM_CHUNKS 256

static float global_norm(const float* g, size_t n) {
    double partial[NORM_CHUNKS];
    size_t chunk = (n + NORM_CHUNKS - 1) / NORM_CHUNKS;
    #pragma omp parallel for
    for (int k = 0; k < NORM_CHUNKS; k++) {
        size_t begin = (size_t)k * chunk < n ? (size_t)k * chunk : n, end = (k + 1) * chunk < n ? (k + 1) * chunk : n;
        partial[k] = sum_squares_lanes(g + begin, end - begin);
    }
    double total = 0.0;
    for (int k = 0; k < NORM_CHUNKS; k++) { total += partial[k]; }
    return (float)sqrt(total);
}

// AdamW over the whole model in one process (or a rank that keeps it whole: no ZeRO), gradients
// already clipped: a direct call of adamw_update per slice, whose m and v lie side by side in state
// (opt_layout.h's layout; wte's slice is its V real rows, so the padded rows are skipped)
static void adamw_step(float* params, const float* grads, float* state, const GPT2Config* c, const AdamWHyper* h, int t) {
    ParamSlice* s = param_slices_alloc(c);
    for (int k = 0; k < param_slice_count(c); k++) {
        size_t n = (size_t)s[k].rows * s[k].cols;
        double wd = PARAMETER_IS_MATRIX[s[k].tensor] ? h->weight_decay : 0.0;
        adamw_update(params + s[k].offset, grads + s[k].offset, state, state + n, n,
                     (float)h->lr, (float)h->beta1, (float)h->beta2, (float)h->eps, (float)wd, t);
        state += 2 * n;
    }
    free(s);
}

#endif // CPU_OPTIMIZERS_H
