/*
opt_layout.h: the optimizers' side that every backend shares: which optimizer (AdamW,
Adafactor, CAME), its hyperparameters, how the 16 GPT-2 tensors are cut into optimizer
parameters ("slices"), how ZeRO-1 cuts each slice over the ranks, and how many floats of
state each keeps, in which order. Checkpoints (the training-state file) and ZeRO depend on
this layout, so the CPU kernels (cpu/optimizers.h) and the CUDA kernels follow it exactly
and their state files are interchangeable.

    size_t n = optimizer_state_floats(&cfg, OPT_CAME, 0, 1);   // floats, zeroed before step 1
    ParamSlice* s = param_slices_alloc(&cfg);                 // param_slice_count(&cfg) slices

One optimizer "parameter" is one torch tensor of the reference (dev/reference/README.md):
layer l's slice of a per-layer tensor is its own parameter (qkvw of layer l is its own
(3C, C) matrix, ln1w of layer l its own (C) vector); wte is one (V, C) matrix over the
UNPADDED rows (rows V..Vp-1 are never read or written: they stay zero); wpe is (maxT, C).
With --tp a rank's slice of each tensor is its parameter (its rows or columns: model_config.h),
whose statistics over the whole tensor add the group's parts (OptShard.tp_sum). Split over the
vocabulary, wte's slice is a rank's Vp/N rows, the padded ones of the last ranks included: their
gradient is always zero, so they stay zero, and the statistics count the V real rows only
(ParamSlice.whole_rows), so they are the whole tensor's but for the zeros' eps1 terms.
A slice with rows == 1 or cols == 1 is a vector; every other slice is a matrix (unlike torch,
which factors every 2-D tensor: they differ only for a model with maxT == 1 or V == 1).
Adafactor and CAME keep FACTORED second moments for matrices (a row and a column
statistic, rows + cols floats, instead of rows * cols) and full ones for vectors.

ZeRO-1 (OptSharding, at the end): with world ranks, each rank updates only its block of
every slice's rows (a vector: of its elements) and keeps only that block's state, and of a
matrix's column statistics only its block of columns. What an update needs from the whole
slice (column means, mean(R), the RMS of U and of p) is summed over the block's rows and
then across the ranks by the OptSumFn hook; the column statistics' blocks are gathered by
the OptGatherFn hook into a workspace (the CUDA backend adds and gathers the same on the
device with NCCL instead of the hooks: cuda/adafactor.cuh). With one process (hooks NULL)
every sum is taken exactly as without sharding, bit for bit.

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
The moments m, v and M are kept in the state's format (--optimizer-state, QStateFormat:
llmc/quant_state.h, doc/optimizer_state.md): fp32, bf16 or 8bit, each moment taking
qstate_moment_floats(format, n) floats of the block (8bit: its codes, then its blocks' absmax), a
slice under QSTATE_MIN_ELEMENTS elements fp32 whatever the format; R, Cc, Rr, Rc and V stay fp32.
Under 8bit a ZeRO cut falls only on a block boundary of an 8-bit slice (slice_cut_units), so that
every part's blocks are the whole slice's blocks and sharded runs equal unsharded ones bit for bit;
fp32 and bf16 slices are cut as they always were.

Hyperparameters are doubles, as the packages' Python floats: each is rounded to fp32 where it
meets a tensor, and an EMA's 1 - beta is taken in double before rounding.
*/
#ifndef LLMC_OPT_LAYOUT_H
#define LLMC_OPT_LAYOUT_H

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "utils.h"
#include "model_config.h"
#include "quant_state.h"

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

// the constants of one AdamW step in fp32: the hyperparameters where they meet the tensors, and
// step t's bias corrections 1 - beta^t by powf (every backend's: cpu/optimizers.h, cuda/adamw_lowp.cuh)
typedef struct { float lr, beta1, beta2, eps, weight_decay, bc1, bc2; } AdamWCoeffs;

static AdamWCoeffs adamw_coeffs(float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
    AdamWCoeffs s = {.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay,
                     .bc1 = 1.0f - powf(beta1, (float)t), .bc2 = 1.0f - powf(beta2, (float)t)};
    return s;
}

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

// where the hyperparameters meet fp32 tensors (every backend: cpu/optimizers.h, cuda/adafactor.cuh)

// an EMA's coefficients in fp32: avg = beta * avg + one_minus_beta * x, 1 - beta taken in double
typedef struct { float beta, one_minus_beta; } OptEma;

static OptEma opt_ema_coeffs(double beta) {
    OptEma e = {(float)beta, (float)(1.0 - beta)};
    return e;
}

// Adafactor's step size of step t (1, 2, ...) before scale_parameter: min(1e-2, 1/sqrt(t)) with
// relative_step, else lr; rounded to fp32 by the caller
static double adafactor_step_size(const AdafactorHyper* h, int t) {
    return h->relative_step ? fmin(ADAFACTOR_MAX_RELATIVE_STEP, 1.0 / sqrt((double)t)) : h->lr;
}

// Adafactor's second-moment decay of step t: beta2_t = 1 - t^decay_rate (0 at t = 1)
static double adafactor_beta2(const AdafactorHyper* h, int t) { return 1.0 - pow((double)t, h->decay_rate); }

// ----------------------------------------------------------------------------
// this process's part of one slice, and sums over a fixed partition (thread-count independent)

// adds n doubles across the processes that share a slice (ZeRO-1), in place, so that every
// process ends with the total; NULL when one process holds the whole slice
typedef void (*OptSumFn)(double* x, size_t n);

// gathers a buffer whose rank r part (counts[r] floats, parts in rank order) each rank holds
// (ZeRO-1: the column statistics), in place, so that every rank ends with all of it
typedef void (*OptGatherFn)(float* buf, const int* counts);

// ZeRO-1 cuts `units` (rows, elements or columns) into world blocks of ceil(units / world)
static int shard_units_per_rank(int units, int world) { return (units + world - 1) / world; }

// rank's units [*begin, *end) of `units` cut into blocks of `per`
static void units_range(int units, int per, int rank, int* begin, int* end) {
    *begin = rank * per < units ? rank * per : units;
    *end = (rank + 1) * per < units ? (rank + 1) * per : units;
}

// rank's units [*begin, *end) of a slice of `units`
static void shard_range(int units, int rank, int world, int* begin, int* end) {
    units_range(units, shard_units_per_rank(units, world), rank, begin, end);
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
    QStateFormat format;  // the format its moments are kept in (qstate_effective_format of the whole slice)
    // --tp: the slice is this rank's part of a tensor split over a tensor-parallel group (model_config.h's
    // TpSplit), whose other ranks hold its other rows (a column-parallel matrix; a split vector's other
    // elements) or columns (a row-parallel matrix). total_rows, total_cols and total count the whole
    // tensor; a statistic over the rows or columns the group splits adds the group's sums (tp_sum)
    int tp_rows, tp_cols; // the group holds the other rows, or the other columns
    int total_cols;       // columns of the whole tensor (a matrix)
    OptSumFn tp_sum;      // adds across the tensor-parallel group; NULL: the slice is whole on this rank
} OptShard;

// a slice (rows, cols) is a matrix unless one side is 1 (then a vector, handled as (1, n))
static int opt_is_matrix(int rows, int cols) { return rows > 1 && cols > 1; }

// ----------------------------------------------------------------------------
// floats of state each optimizer keeps for a part of one slice (the layout at the top)

// floats of one moment (m, v, M) of a part: state_units * width elements in the part's format
static size_t opt_moment_floats(const OptShard* sh) { return qstate_moment_floats(sh->format, sh->state_units * sh->width); }

static size_t adafactor_state_floats(const OptShard* sh, int use_beta1) {
    size_t n = sh->state_units * sh->width;
    size_t second = sh->factored ? sh->state_units + sh->col_units : n;
    return second + (use_beta1 ? opt_moment_floats(sh) : 0);
}

// CAME's second moments (R, Cc, Rr, Rc of a matrix; V of a vector), fp32, after M
static size_t came_second_floats(const OptShard* sh) {
    return sh->factored ? 2 * (sh->state_units + sh->col_units) : sh->state_units * sh->width;
}

static size_t came_state_floats(const OptShard* sh) { return opt_moment_floats(sh) + came_second_floats(sh); }

static size_t adamw_state_floats(const OptShard* sh) { return 2 * opt_moment_floats(sh); }

// the model's optimizer parameters: the 16 tensors split into layer slices

typedef struct {
    int tensor;      // index into PARAMETER_NAMES
    int layer;       // OUTER_GROUP for wte, wpe, lnfw, lnfb
    int rows, cols;  // rows == 1: a vector; with --tp a rank's slice of the tensor (model_config.h's gpt2_tensor_shape)
    size_t offset;   // floats from the start of the parameters (and of the gradients)
    int tp;          // the tensor-parallel ranks that hold the other slices of it (--tp), 1: this rank holds it whole
    int whole_rows;  // rows of the whole tensor that its statistics count (a matrix; wte: its V real rows); 1 for a vector
    size_t whole;    // elements of the whole tensor that its statistics count
} ParamSlice;

#define OUTER_GROUP (-1)  // the layer of wte, wpe, lnfw, lnfb: the outer slices, a group in place of a layer
#define ALL_SLICES (-2)   // a layer filter that takes every slice (OUTER_GROUP: the outer slices; l: layer l's)

// a slice that is a whole tensor of its own, (rows, cols) at offset 0 (the optimizers' tests)
static ParamSlice param_slice_alone(int tensor, int rows, int cols) {
    ParamSlice s = {.tensor = tensor, .layer = OUTER_GROUP, .rows = rows, .cols = cols, .offset = 0, .tp = 1,
                    .whole_rows = rows, .whole = (size_t)rows * cols};
    return s;
}

// tensors 2 (ln1w) .. 13 (fcprojb) hold one slice per layer, layer-major
static int tensor_is_per_layer(int i) { return i >= 2 && i <= 13; }

static int param_slice_count(const GPT2Config* c) { return 4 + 12 * c->num_layers; }

// fills s[param_slice_count(c)] in checkpoint order; shapes as in gpt2_parameter_sizes (a rank's
// slices with --tp), vectors as (1, n), wte over its V real rows (--tp: a rank's Vp/N rows, the
// statistics over the V real rows of the whole)
static void param_slices(ParamSlice* s, const GPT2Config* c) {
    size_t sizes[NUM_PARAMETER_TENSORS], off = 0;
    gpt2_parameter_sizes(sizes, c);
    int n = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t r, cl;
        gpt2_tensor_shape(i, c, &r, &cl);
        int rows = cl == 1 ? 1 : (int)r, cols = cl == 1 ? (int)r : (int)cl;  // a vector: (1, n)
        int tp = PARAMETER_TP_SPLIT[i] == TP_WHOLE ? 1 : gpt2_tp(c);
        int whole_rows = rows * (PARAMETER_TP_SPLIT[i] == TP_COLUMNS || cl == 1 ? 1 : tp);
        size_t whole = (size_t)rows * cols * tp;
        if (i == 0 && gpt2_holds_tensor(c, 0)) {  // wte: the V real rows (one process: its slice; --tp: what the statistics count)
            whole_rows = c->vocab_size;
            whole = (size_t)c->vocab_size * cols;
            if (tp == 1) { rows = c->vocab_size; }
        }
        int layers = tensor_is_per_layer(i) ? c->num_layers : 1;
        for (int l = 0; l < layers; l++) {
            ParamSlice p = {.tensor = i, .layer = tensor_is_per_layer(i) ? l : OUTER_GROUP, .rows = rows, .cols = cols,
                            .offset = off + (size_t)l * r * cl, .tp = tp, .whole_rows = whole_rows, .whole = whole};
            s[n++] = p;
        }
        off += sizes[i];
    }
}

#define SLICE_NAME_LEN 48

// a slice's name for messages: "qkvw of layer 3", "wte"
static void slice_name(const ParamSlice* s, char* out, size_t n) {
    if (s->layer >= 0) { snprintf(out, n, "%s of layer %d", PARAMETER_NAMES[s->tensor], s->layer); }
    else { snprintf(out, n, "%s", PARAMETER_NAMES[s->tensor]); }
}

// the slice list of a model (free() it)
static ParamSlice* param_slices_alloc(const GPT2Config* c) {
    ParamSlice* s = (ParamSlice*)malloc_check((size_t)param_slice_count(c) * sizeof(ParamSlice));
    param_slices(s, c);
    return s;
}

// the model's weights in order as runs: a slice (slice = its index) or a stretch no slice holds
// (slice = -1: wte's padded rows, which stay zero). runs[] has room for param_slice_count(c) + 1;
// returns how many there are. ZeRO-3's checkpoints walk the weights this way, a slice at a time. A
// slice of no weights (an outer tensor a pipeline's stage does not hold) is no run
typedef struct { int slice; size_t offset, n; } WeightRun;

static int weight_runs(const GPT2Config* c, const ParamSlice* s, WeightRun* runs) {
    int n = 0, slices = param_slice_count(c);
    size_t at = 0;
    for (int k = 0; k <= slices; k++) {
        size_t next = k < slices ? s[k].offset : gpt2_num_parameters(c);
        if (next > at) {
            WeightRun gap = {-1, at, next - at};
            runs[n++] = gap;
            at = next;  // (a slice of no weights next: its offset is where the gap ends, not another gap)
        }
        if (k == slices) { break; }
        if ((size_t)s[k].rows * s[k].cols == 0) { continue; }
        WeightRun r = {k, s[k].offset, (size_t)s[k].rows * s[k].cols};
        runs[n++] = r;
        at = r.offset + r.n;
    }
    return n;
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
    int grads_compact;   // ZeRO-2 and 3: the gradients hold this rank's blocks only, at shard_block_offsets
    int params_compact;  // ZeRO-3: the weights too, in the same layout
    QStateFormat format; // the state's format (--optimizer-state): where its 8-bit blocks lie decides the cut
    OptSumFn tp_sum;     // --tp: adds across the tensor-parallel group (the slices split over it); NULL without
} OptSharding;

static const OptSharding OPT_UNSHARDED = {.rank = 0, .world = 1, .sum = NULL, .gather = NULL, .grads_compact = 0,
                                          .params_compact = 0, .format = QSTATE_FP32, .tp_sum = NULL};

static int slice_units(const ParamSlice* s) { return opt_is_matrix(s->rows, s->cols) ? s->rows : s->rows * s->cols; }
static int slice_unit_width(const ParamSlice* s) { return opt_is_matrix(s->rows, s->cols) ? s->cols : 1; }

// the format slice s's moments are kept in when the state's format is f (small slices: fp32)
static QStateFormat slice_format(const ParamSlice* s, QStateFormat f) { return qstate_effective_format(f, (size_t)s->rows * s->cols); }

// the units a rank's part of slice s comes in multiples of: 1, or for a slice kept in 8 bits the
// fewest units that hold whole QSTATE_BLOCK-element blocks (QSTATE_BLOCK / the largest power of two
// that divides the unit's width), so that every part starts on a block boundary of the slice
static int slice_cut_units(const ParamSlice* s, QStateFormat f) {
    if (slice_format(s, f) != QSTATE_8BIT) { return 1; }
    int cut = QSTATE_BLOCK, width = slice_unit_width(s);
    while (cut > 1 && width % 2 == 0) { cut /= 2; width /= 2; }
    return cut;
}

// the units of slice s a rank's part is sized for: ceil(units / world), rounded up to slice_cut_units
// when there is a cut (world > 1)
static int slice_units_per_rank(const ParamSlice* s, int world, QStateFormat f) {
    int cut = world > 1 ? slice_cut_units(s, f) : 1, per = shard_units_per_rank(slice_units(s), world);
    return (per + cut - 1) / cut * cut;
}

// rank's units [*begin, *end) of slice s under state format f
static void slice_range(const ParamSlice* s, int rank, int world, QStateFormat f, int* begin, int* end) {
    units_range(slice_units(s), slice_units_per_rank(s, world, f), rank, begin, end);
}

// rank z->rank's part of slice s; *offset = floats from the slice's start to the part's
static OptShard slice_shard(const ParamSlice* s, const OptSharding* z, size_t* offset) {
    int width = slice_unit_width(s), begin, end;
    slice_range(s, z->rank, z->world, z->format, &begin, &end);
    OptShard sh;
    sh.factored = opt_is_matrix(s->rows, s->cols);
    sh.rows = sh.factored ? end - begin : 1;
    sh.cols = sh.factored ? s->cols : end - begin;
    sh.state_units = (size_t)slice_units_per_rank(s, z->world, z->format);
    sh.width = width;
    int col_end;
    shard_range(s->cols, z->rank, z->world, &sh.col_begin, &col_end);
    sh.col_count = sh.factored ? col_end - sh.col_begin : 0;
    sh.col_units = sh.factored ? (size_t)shard_units_per_rank(s->cols, z->world) : 0;
    sh.rank = z->rank;
    sh.world = z->world;
    sh.sum = z->sum;
    sh.gather = z->gather;
    sh.format = slice_format(s, z->format);
    TpSplit split = s->tp > 1 ? PARAMETER_TP_SPLIT[s->tensor] : TP_WHOLE;  // --tp: the whole tensor's other parts
    sh.tp_rows = split == TP_ROWS || split == TP_ROWS_QKV;
    sh.tp_cols = split == TP_COLUMNS;
    sh.total_cols = sh.factored ? (int)(s->whole / (size_t)s->whole_rows) : 1;
    sh.total_rows = sh.factored ? s->whole_rows : 1;
    sh.total = s->whole;
    sh.tp_sum = split != TP_WHOLE ? z->tp_sum : NULL;
    *offset = (size_t)begin * width;
    return sh;
}

// counts[r] = floats of rank r's part of slice s, r = 0..world-1 (for the collectives), state format f
static void slice_part_counts(const ParamSlice* s, int world, QStateFormat f, int* counts) {
    if ((size_t)s->rows * s->cols > (size_t)INT_MAX) { fail("a slice of %d x %d floats is beyond MPI's int counts", s->rows, s->cols); }
    for (int r = 0; r < world; r++) {
        int begin, end;
        slice_range(s, r, world, f, &begin, &end);
        counts[r] = (end - begin) * slice_unit_width(s);
    }
}

// floats of optimizer state for this process's part of one slice
static size_t slice_state_floats(OptimizerKind kind, const OptShard* sh, int use_beta1) {
    if (kind == OPT_ADAMW) { return adamw_state_floats(sh); }
    return kind == OPT_ADAFACTOR ? adafactor_state_floats(sh, use_beta1) : came_state_floats(sh);
}

// floats of optimizer state of one rank out of `world` (1: unsharded) in state format f for the
// slices of `layer` (ALL_SLICES, OUTER_GROUP or l); use_beta1 matters to Adafactor only
static size_t optimizer_state_floats_of(const GPT2Config* c, OptimizerKind kind, int use_beta1, int world, QStateFormat f, int layer) {
    ParamSlice* s = param_slices_alloc(c);
    OptSharding z = OPT_UNSHARDED;
    z.world = world;  // every rank's state has rank 0's size
    z.format = f;
    size_t total = 0, offset;
    for (int k = 0; k < param_slice_count(c); k++) {
        OptShard sh = slice_shard(&s[k], &z, &offset);
        if (layer == ALL_SLICES || s[k].layer == layer) { total += slice_state_floats(kind, &sh, use_beta1); }
    }
    free(s);
    return total;
}

// the floats of the largest part a rank of `world` keeps of a slice whose moments are in a
// low-precision format under f (0 with f fp32, or if every slice is small enough to stay fp32): the GPU
// updates Adafactor's and CAME's first moment through an fp32 copy of that size (cuda/factored_lowp.cuh)
static size_t lowp_largest_part_floats(const GPT2Config* c, int world, QStateFormat f) {
    ParamSlice* s = param_slices_alloc(c);
    size_t most = 0;
    for (int k = 0; k < param_slice_count(c); k++) {
        size_t n = slice_format(&s[k], f) != QSTATE_FP32 ? (size_t)slice_units_per_rank(&s[k], world, f) * slice_unit_width(&s[k]) : 0;
        most = n > most ? n : most;
    }
    free(s);
    return most;
}

// the same for every slice
static size_t optimizer_state_floats_as(const GPT2Config* c, OptimizerKind kind, int use_beta1, int world, QStateFormat f) {
    return optimizer_state_floats_of(c, kind, use_beta1, world, f, ALL_SLICES);
}

// ----------------------------------------------------------------------------
// a slice part's state as pieces, for what reads it whole (checkpoints: llmc/trainer.h): in the
// layout's order, each a moment (m, v, M: n_units elements in the part's format, through the
// signed or unsigned map) or fp32 floats (Adafactor's and CAME's second moments)

typedef struct {
    int is_moment;
    QMapKind map;   // a moment's: QMAP_SIGNED for m and M, QMAP_UNSIGNED for v
    size_t floats;  // floats of the block it takes
} StatePiece;

#define MAX_STATE_PIECES 2

// fills pieces[] for part sh of a slice; returns how many
static int slice_state_pieces(OptimizerKind kind, const OptShard* sh, int use_beta1, StatePiece* pieces) {
    StatePiece m = {1, QMAP_SIGNED, opt_moment_floats(sh)}, v = {1, QMAP_UNSIGNED, opt_moment_floats(sh)};
    if (kind == OPT_ADAMW) { pieces[0] = m; pieces[1] = v; return 2; }
    if (kind == OPT_CAME) { StatePiece second = {0, QMAP_SIGNED, came_second_floats(sh)}; pieces[0] = m; pieces[1] = second; return 2; }
    StatePiece second = {0, QMAP_SIGNED, adafactor_state_floats(sh, 0)};
    pieces[0] = second;
    pieces[1] = m;
    return use_beta1 ? 2 : 1;
}

// where piece p (at `at`) of part sh first holds a non-finite value: its index in the piece's units
// (returned; *units = how many it has, *what = "float", "bf16 value" or "8-bit block's absmax": a
// refused block's is NaN, its codes are any bytes), the value in *value; *units when none
static size_t state_piece_non_finite(const StatePiece* p, const OptShard* sh, const float* at, size_t* units, const char** what,
                                     float* value) {
    size_t n = sh->state_units * sh->width;
    QStateFormat f = p->is_moment ? sh->format : QSTATE_FP32;
    QMoment M = qmoment_at((float*)at, f == QSTATE_FP32 ? QSTATE_8BIT : f, n, (QStateStream){0, 0});
    *what = f == QSTATE_FP32 ? "float" : f == QSTATE_BF16 ? "bf16 value" : "8-bit block's absmax";
    *units = f == QSTATE_FP32 ? p->floats : f == QSTATE_BF16 ? n : qstate_blocks(n);
    for (size_t i = 0; i < *units; i++) {
        *value = f == QSTATE_FP32 ? at[i] : f == QSTATE_BF16 ? qstate_bf16_to_float(M.bf16[i]) : M.q.absmax[i];
        if (!isfinite(*value)) { return i; }
    }
    return *units;
}

// stops if part sh of slice s's state (at `state`, read from the file at path) holds a NaN or infinity,
// naming the slice and what holds it: an fp32 value, a bf16 one, or an 8-bit block's absmax (NaN: a
// block the quantizer refused)
static void slice_state_check_finite(const char* path, const ParamSlice* s, const OptShard* sh, OptimizerKind kind, int use_beta1,
                                     const float* state) {
    StatePiece pieces[MAX_STATE_PIECES];
    int n = slice_state_pieces(kind, sh, use_beta1, pieces);
    size_t before = 0, total = slice_state_floats(kind, sh, use_beta1), units;
    for (int i = 0; i < n; i++) {
        const char* what;
        float value;
        size_t bad = state_piece_non_finite(&pieces[i], sh, state, &units, &what, &value);
        int floats = strcmp(what, "float") == 0;  // then counted over the slice's state, as the layout lays it
        if (bad < units) {
            char name[SLICE_NAME_LEN];
            slice_name(s, name, sizeof(name));
            fail("state file '%s': the optimizer state of %s, %s %zu of its %zu, is %g: non-finite optimizer state cannot train\n"
                 "  hint: it was written after its run diverged; resume from an earlier checkpoint", path, name, what,
                 floats ? before + bad : bad, floats ? total : units, value);
        }
        before += pieces[i].floats;
        state += pieces[i].floats;
    }
}

// a moment of a part (n_units elements in format f, at src) read as fp32 into x (n_units)
static void state_moment_decode(QMapKind map, size_t n_units, QStateFormat f, const float* src, float* x) {
    QMoment in = qmoment_at((float*)src, f, n_units, (QStateStream){0, 0});
    if (f == QSTATE_FP32) { memcpy(x, src, n_units * sizeof(float)); }
    else if (f == QSTATE_BF16) { for (size_t i = 0; i < n_units; i++) { x[i] = qstate_bf16_to_float(in.bf16[i]); } }
    else { qstate_dequantize(&qstate_maps()->map[map], in.q.codes, in.q.absmax, n_units, x); }
}

// x (its first n elements) into a moment of a part laid out for n_units elements in format f (at dst):
// copied, rounded (bf16: the bits of step 0 of `stream`, which no training step draws) or quantized.
// A bf16 value read as fp32 rounds back to its own bits (the bits below it are zero), so a bf16 moment
// decoded and encoded again is the same; an 8-bit one is requantized (its blocks' absmax may move)
static void state_moment_encode(QMapKind map, const float* x, size_t n, size_t n_units, QStateFormat f, float* dst, QStateStream stream) {
    QMoment out = qmoment_at(dst, f, n_units, stream);
    if (f == QSTATE_FP32) { memcpy(dst, x, n * sizeof(float)); }
    else if (f == QSTATE_8BIT) { qstate_quantize(&qstate_maps()->map[map], x, n, out.q.codes, out.q.absmax); }
    else {
        QStateStreamId id = map == QMAP_SIGNED ? QSTATE_STREAM_M : QSTATE_STREAM_V;
        for (size_t i = 0; i < n; i++) { out.bf16[i] = qstate_bf16_round(x[i], qstate_random16(stream.seed, 0, id, stream.index_base + i)); }
    }
}

// moment piece p of a part of n_units elements, from format `from` (at src) into format `to` (at dst):
// read as fp32, then rounded or quantized (state_moment_encode)
static void state_moment_convert(const StatePiece* p, size_t n_units, QStateFormat from, const float* src, QStateFormat to,
                                 float* dst, QStateStream stream, float* scratch) {
    state_moment_decode(p->map, n_units, from, src, scratch);
    state_moment_encode(p->map, scratch, n_units, n_units, to, dst, stream);
}

// this rank's state (src, in z_from's format) converted into z_to's format (dst), slice by slice;
// returns 0, or (the cuts differ: ZeRO with 8-bit state) the slice + 1 where the two cuts part
static int opt_state_convert(const GPT2Config* c, OptimizerKind kind, int use_beta1, const OptSharding* z_from, const float* src,
                             const OptSharding* z_to, float* dst) {
    ParamSlice* s = param_slices_alloc(c);
    int bad_slice = 0;
    for (int k = 0; k < param_slice_count(c) && bad_slice == 0; k++) {
        size_t off_from, off_to;
        OptShard a = slice_shard(&s[k], z_from, &off_from), b = slice_shard(&s[k], z_to, &off_to);
        if (a.state_units != b.state_units || off_from != off_to) { bad_slice = k + 1; break; }
        StatePiece pa[MAX_STATE_PIECES], pb[MAX_STATE_PIECES];
        int n = slice_state_pieces(kind, &a, use_beta1, pa);
        slice_state_pieces(kind, &b, use_beta1, pb);
        size_t units = a.state_units * a.width;
        float* scratch = (float*)malloc_check((units > 0 ? units : 1) * sizeof(float));
        for (int i = 0; i < n; i++) {
            QStateStream stream = {.seed = (uint32_t)k, .index_base = off_to};
            if (pa[i].is_moment) { state_moment_convert(&pa[i], units, a.format, src, b.format, dst, stream, scratch); }
            else { memcpy(dst, src, pa[i].floats * sizeof(float)); }
            src += pa[i].floats;
            dst += pb[i].floats;
        }
        free(scratch);
    }
    free(s);
    return bad_slice;
}

// ----------------------------------------------------------------------------
// a slice part's state field by field, finer than its pieces, for what moves it entry by entry into
// another layout (llmc/relayout.h): each moment, and each second-moment statistic by what its
// entries stand for (an element, a row, a column of the slice)

typedef enum {
    FIELD_MOMENT,    // m, v, M: an entry an element of the part (state_units * width), in the part's format
    FIELD_ELEMENTS,  // a vector's V: an entry an element of the part, fp32
    FIELD_ROWS,      // a matrix's R, Rr: an entry a row of the part (state_units), fp32
    FIELD_COLS,      // a matrix's Cc, Rc: an entry a column of the part's column block (col_units), fp32
} StateFieldKind;

typedef struct {
    StateFieldKind kind;
    QMapKind map;    // a moment's: QMAP_SIGNED for m and M, QMAP_UNSIGNED for v
    size_t entries;  // its entries, the padding of a rank's part included
    size_t floats;   // floats of the block it takes
} StateField;

#define MAX_STATE_FIELDS 5

// fills fields[] for part sh of a slice in the layout's order (the top of this file); returns how many.
// They take the floats its pieces take (slice_state_pieces), in the same order
static int slice_state_fields(OptimizerKind kind, const OptShard* sh, int use_beta1, StateField* fields) {
    size_t n = sh->state_units * sh->width;
    StateField m = {FIELD_MOMENT, QMAP_SIGNED, n, opt_moment_floats(sh)}, v = {FIELD_MOMENT, QMAP_UNSIGNED, n, opt_moment_floats(sh)};
    StateField rows = {FIELD_ROWS, QMAP_SIGNED, sh->state_units, sh->state_units}, cols = {FIELD_COLS, QMAP_SIGNED, sh->col_units, sh->col_units};
    StateField elements = {FIELD_ELEMENTS, QMAP_SIGNED, n, n};
    int k = 0;
    if (kind == OPT_ADAMW) { fields[k++] = m; fields[k++] = v; return k; }
    if (kind == OPT_CAME) { fields[k++] = m; }
    if (sh->factored) {
        fields[k++] = rows;  // R
        fields[k++] = cols;  // Cc
        if (kind == OPT_CAME) { fields[k++] = rows; fields[k++] = cols; }  // Rr, Rc
    } else {
        fields[k++] = elements;  // V
    }
    if (kind == OPT_ADAFACTOR && use_beta1) { fields[k++] = m; }
    return k;
}

// the entries of field f of part sh that hold state: its elements, rows or columns (the rest pad the
// part to its rank's size)
static size_t state_field_used(const StateField* f, const OptShard* sh) {
    if (f->kind == FIELD_ROWS) { return (size_t)sh->rows; }
    if (f->kind == FIELD_COLS) { return (size_t)sh->col_count; }
    return (size_t)sh->rows * sh->cols;
}

// The world-only forms below (optimizer_state_floats, slice_block_floats, shard_block_offsets,
// shard_layout) are the fp32 state's cut: the CUDA backend's, which keeps fp32 state only until it is
// wired to cuda/adamw_lowp.cuh (doc/optimizer_state.md); the CPU passes its format to the _as forms.
static size_t optimizer_state_floats(const GPT2Config* c, OptimizerKind kind, int use_beta1, int world) {
    return optimizer_state_floats_as(c, kind, use_beta1, world, QSTATE_FP32);
}

// ----------------------------------------------------------------------------
// ZeRO-2: a rank keeps only its blocks of the reduced fp32 gradients ("the gradient shard"),
// each slice's block padded to ceil(units / world) units as the state is, in the order
// wte, wpe, lnfw, lnfb, then layer by layer that layer's 12 slices (so that one layer's blocks
// are contiguous: one reduce-scatter a layer). Gradients are not in checkpoints: this order is
// the CPU trainer's own. While the backward runs, the rank also holds a working buffer shaped as
// a one-layer model's parameters (wte's Vp rows, wpe, one layer's 12 tensors, lnfw, lnfb): the
// classifier and the encoder add into wte's part across the whole backward, each layer's
// backward into the layer part, which is reduce-scattered (packed rank by rank into `pack`)
// and cleared before the next layer.
//
// ZeRO-3: the fp32 weights are sharded the same way, in the same layout (a rank's weight shard
// is its blocks of every slice, at shard_block_offsets), and a working copy shaped as a one-layer
// model holds what the kernels read: wte, wpe, lnfw, lnfb gathered whole for the step, and one
// layer at a time, gathered from every rank's blocks through the same `pack` before the layer's
// forward (and again before its backward).

// floats of rank's padded block of slice s under state format f
static size_t slice_block_floats_as(const ParamSlice* s, int world, QStateFormat f) {
    return (size_t)slice_units_per_rank(s, world, f) * slice_unit_width(s);
}
static size_t slice_block_floats(const ParamSlice* s, int world) { return slice_block_floats_as(s, world, QSTATE_FP32); }

// the slices that are no layer's: wte, wpe, lnfw, lnfb (indices in checkpoint order)
static int slice_is_outer(const ParamSlice* s) { return s->layer == OUTER_GROUP; }

// off[k] = floats from the gradient shard's start to slice k's block, k in checkpoint order, under
// state format f; returns the shard's floats
static size_t shard_block_offsets_as(const GPT2Config* c, int world, QStateFormat f, size_t* off) {
    ParamSlice* s = param_slices_alloc(c);
    int n = param_slice_count(c);
    size_t at = 0;
    for (int k = 0; k < n; k++) {
        if (slice_is_outer(&s[k])) { off[k] = at; at += slice_block_floats_as(&s[k], world, f); }
    }
    for (int l = 0; l < c->num_layers; l++) {
        for (int k = 0; k < n; k++) {
            if (s[k].layer == l) { off[k] = at; at += slice_block_floats_as(&s[k], world, f); }
        }
    }
    free(s);
    return at;
}
static size_t shard_block_offsets(const GPT2Config* c, int world, size_t* off) { return shard_block_offsets_as(c, world, QSTATE_FP32, off); }

typedef struct {
    size_t shard;       // this rank's blocks of every slice, reduced (what the optimizer reads)
    size_t working;     // a one-layer model's parameters: the backward's own gradients, not reduced
    size_t layer_part;  // this rank's padded blocks of one layer's 12 slices
    size_t pack;        // world * layer_part: one layer's gradients rank by rank for its reduce-scatter
} ShardLayout;

// the gradient floats a rank of `world` keeps under ZeRO-2 with state format f (the planner counts the same)
static ShardLayout shard_layout_as(const GPT2Config* c, int world, QStateFormat f) {
    ShardLayout z;
    size_t* off = (size_t*)malloc_check((size_t)param_slice_count(c) * sizeof(size_t));
    z.shard = shard_block_offsets_as(c, world, f, off);
    free(off);
    GPT2Config one = *c;
    one.num_layers = 1;
    z.working = gpt2_num_parameters(&one);
    ParamSlice* s = param_slices_alloc(&one);
    z.layer_part = 0;
    for (int k = 0; k < param_slice_count(&one); k++) {
        if (!slice_is_outer(&s[k])) { z.layer_part += slice_block_floats_as(&s[k], world, f); }
    }
    free(s);
    z.pack = (size_t)world * z.layer_part;
    return z;
}
static ShardLayout shard_layout(const GPT2Config* c, int world) { return shard_layout_as(c, world, QSTATE_FP32); }

static size_t shard_layout_floats(const ShardLayout* z) { return z->shard + z->working + z->pack; }

#endif // LLMC_OPT_LAYOUT_H
