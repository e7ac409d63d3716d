/*
relayout.h: a checkpoint's optimizer state on another layout (issues 36 and 37): -y 1 with another --tp,
--pp or --zero than the run that wrote the checkpoint keeps the optimizer state. The model file is the
whole model (every layout reads it as it is); a rank's state file holds the optimizer state of its own
parts of the slices (llmc/opt_layout.h): its --tp slices of the tensors a group splits, its --pp stage's
tensors, and under --zero 1, 2 and 3 its blocks of each. Each rank of the new layout assembles its own
parts from the old ranks' state files in the checkpoint's directory (every rank reads that directory, as
a resume in one layout does).

    StateLayout from = {...}, to = {...};       // the checkpoint's layout, and this run's
    RelayoutCounts n;
    TrainState st = relayout_rank_state(dir, step, &from, &to, place, state, &n);  // the state of the rank at place,
                                                                                   // and the header of its data place's file

How an entry moves. Every entry of a rank's state stands for a place in one layer's whole tensor: a
moment's entry (m, v, M) and a vector's V an element (row, column), a row statistic's (R, Rr) a row, a
column statistic's (Cc, Rc) a column (opt_layout.h's slice_state_fields). A rank's part of a slice
(PartPlace) maps its entries to those places and back: first the --tp cut (model_config.h's TpSplit: a
column-parallel matrix's rows and its bias's elements, qkvw's rows within each of q, k and v, a
row-parallel matrix's columns, wte's Vp/N rows of the vocabulary), then the ZeRO block (a block of the
slice's rows or elements; of its columns for the column statistics). For each slice of the new rank,
every old part of the same tensor's layer is read from its rank's file, decoded to fp32, and each of its
entries written where the new part holds the same place.
Which statistics a --tp rank holds whole, as the optimizers compute them (cpu/optimizers.h, the GPU's
alike): a column-parallel matrix (qkvw, fcw, wte) has its rows split and so its row statistics R and Rr,
while its column statistics Cc and Rc are the group's sums over all rows, the same on every rank: the
whole tensor's columns; a row-parallel matrix (attprojw, fcprojw) has its columns split and so its
column statistics, while its row statistics are the group's sums, whole on every rank. A statistic the
group holds whole is taken from the group's first rank. wte under --pp: the first and the last stage
hold it, with the same state (they take the same update); the first stage's is taken.

A part that is the same in both layouts (the same elements of the same slice, the same format) is copied
as it was, in any format: every --pp change, and at the same ZeRO cut the tensors --tp does not split.

What is bitwise. fp32 state: every entry (the moved state is the written one). bf16: every entry too (a
bf16 value decoded to fp32 rounds back to its own bits). 8-bit: a part copied as it was is; a part that
is cut anew is requantized from its decoded values (a slice's blocks are its own, and another --tp cut,
or another ZeRO cut, makes other blocks): within a step of the format, not bitwise. A run that changes
--optimizer-state as well converts the moved values into its format (state_moment_encode).

What has no old place: wte's padded rows V..Vp-1 are no row of one process's wte (its state counts the V
real rows, opt_layout.h) but are rows of a --tp rank's slice. Coming from --tp 1, their moments are 0
(their gradient is always zero, so in any run they are) and their row statistics start at 0, as in a new
run: the update they get is zero either way, and the statistics over the whole tensor change by their
eps1 terms only.

The data. Any count of data-parallel ranks resumes any other: the header returned is the old rank 0's,
whose sampling RNG every rank shares and whose data position is where the round of every data-parallel
rank's next windows starts (the checkpoint is written between steps); trainer.h's state_load_relayout
puts new data rank d d windows after it, as llmc/dataloader.h's rounds do.

Refused: a slice that is a matrix in one layout and a vector in the other (a --tp that leaves one row
or one column of it) under Adafactor or CAME: their factored and their full second moments are not
each other's. Stops naming the slice and the fix.

Failure: a state file of the checkpoint that is damaged, of another write, or of another model,
optimizer or layout stops naming it; a non-finite value stops naming the file and the slice.
*/
#ifndef LLMC_RELAYOUT_H
#define LLMC_RELAYOUT_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "utils.h"
#include "model_config.h"
#include "opt_layout.h"
#include "pipeline.h"
#include "checkpoint.h"

// ----------------------------------------------------------------------------
// a layout: how the ranks of a run hold the optimizer state

typedef struct {
    GPT2Config model;      // the whole model
    OptimizerKind kind;
    int use_beta1;         // Adafactor keeps a first moment
    QStateFormat format;   // --optimizer-state
    int tp, pp, dp;        // tp * pp * dp ranks, placed as llmc/distributed.h's dist_grid places them
    int sharded;           // --zero 1, 2, 3: each data-parallel rank keeps its blocks of every slice; 0: all of it
} StateLayout;

typedef struct { int stage, data, tensor; } RankPlace;  // a rank's place in the grid

static int layout_world(const StateLayout* L) { return L->tp * L->pp * L->dp; }

// the rank at place p: dist_grid's rank = stage (dp tp) + data tp + tensor
static int layout_rank(const StateLayout* L, RankPlace p) { return (p.stage * L->dp + p.data) * L->tp + p.tensor; }

// the config of the rank at place p: its --tp slices of its stage's part (trainer.h's setup_rank_config)
static GPT2Config layout_rank_config(const StateLayout* L, RankPlace p) {
    GPT2Config tp = gpt2_rank_config(&L->model, L->tp);
    return pp_stage_config(&tp, L->pp, p.stage);
}

// how the rank at place p cuts its slices over the data-parallel ranks
static OptSharding layout_sharding(const StateLayout* L, RankPlace p) {
    OptSharding z = OPT_UNSHARDED;
    z.rank = L->sharded ? p.data : 0;
    z.world = L->sharded ? L->dp : 1;
    z.format = L->format;
    return z;
}

// the first stage of layout L that holds tensor i of layer `layer` (OUTER_GROUP: wte, wpe, lnfw, lnfb)
static int layout_stage_of(const StateLayout* L, int i, int layer) {
    for (int s = 0; s < L->pp; s++) {
        GPT2Config c = pp_stage_config(&L->model, L->pp, s);
        int holds = layer == OUTER_GROUP ? gpt2_holds_tensor(&c, i) : layer >= c.first_layer && layer < c.first_layer + c.num_layers;
        if (holds) { return s; }
    }
    fail("relayout: no stage of --pp %d holds %s of layer %d (a bug)", L->pp, PARAMETER_NAMES[i], layer);
    return -1;  // not reached
}

// a rank of a layout: its slices, its part of each and where each part's state lies in its state
typedef struct {
    const StateLayout* layout;
    RankPlace place;
    GPT2Config config;
    ParamSlice* slices;    // param_slice_count(&config), in checkpoint order
    OptShard* parts;       // this rank's part of each
    size_t* part_first;    // elements from each slice's start to this rank's part of it
    size_t* state_at;      // floats from the state's start to each part's state
    size_t floats;         // the state's floats
} LayoutRank;

static LayoutRank layout_rank_open(const StateLayout* L, RankPlace p) {
    LayoutRank r;
    r.layout = L;
    r.place = p;
    r.config = layout_rank_config(L, p);
    int n = param_slice_count(&r.config);
    r.slices = param_slices_alloc(&r.config);
    r.parts = (OptShard*)malloc_check((size_t)n * sizeof(OptShard));
    r.part_first = (size_t*)malloc_check((size_t)n * sizeof(size_t));
    r.state_at = (size_t*)malloc_check((size_t)n * sizeof(size_t));
    OptSharding z = layout_sharding(L, p);
    r.floats = 0;
    for (int k = 0; k < n; k++) {
        r.parts[k] = slice_shard(&r.slices[k], &z, &r.part_first[k]);
        r.state_at[k] = r.floats;
        r.floats += slice_state_floats(L->kind, &r.parts[k], L->use_beta1);
    }
    return r;
}

static void layout_rank_close(LayoutRank* r) {
    free(r->slices);
    free(r->parts);
    free(r->part_first);
    free(r->state_at);
    r->slices = NULL;
}

// the layer of the whole model that slice k of a rank is of (OUTER_GROUP for wte, wpe, lnfw, lnfb)
static int layout_slice_layer(const LayoutRank* r, int k) {
    int l = r->slices[k].layer;
    return l == OUTER_GROUP ? OUTER_GROUP : r->config.first_layer + l;
}

// the index of a rank's slice of tensor i of layer `layer` of the whole model, or -1 if it has none
static int layout_slice_index(const LayoutRank* r, int i, int layer) {
    for (int k = 0; k < param_slice_count(&r->config); k++) {
        if (r->slices[k].tensor == i && layout_slice_layer(r, k) == layer) { return k; }
    }
    return -1;
}

// ----------------------------------------------------------------------------
// a rank's part of a slice in the whole tensor: its entries' places, and back

typedef struct {
    TpSplit split;           // how the group cuts the tensor (TP_WHOLE: this rank holds it whole)
    int tp, tp_rank;         // the group's ranks and this one's place in it (1 and 0 for a whole tensor)
    int rows, cols;          // the slice as its tensor's (rows, cols) (a vector: (n, 1)); wte of one process: its V real rows
    size_t first, end;       // the part's elements [first, end) of the slice, row-major
    int row_first, row_end;  // a matrix part's rows, those of its row statistics
    int col_first, col_end;  // the columns of its column statistics
} PartPlace;

static PartPlace part_place(const LayoutRank* r, int k) {
    const ParamSlice* s = &r->slices[k];
    const OptShard* sh = &r->parts[k];
    size_t tensor_rows, tensor_cols;
    gpt2_tensor_shape(s->tensor, &r->config, &tensor_rows, &tensor_cols);
    PartPlace p;
    p.split = s->tp > 1 ? PARAMETER_TP_SPLIT[s->tensor] : TP_WHOLE;
    p.tp = p.split != TP_WHOLE ? r->layout->tp : 1;
    p.tp_rank = p.split != TP_WHOLE ? r->place.tensor : 0;
    p.cols = (int)tensor_cols;
    p.rows = (int)((size_t)s->rows * s->cols / tensor_cols);
    p.first = r->part_first[k];
    p.end = p.first + (size_t)sh->rows * sh->cols;
    p.row_first = sh->factored ? (int)(p.first / (size_t)p.cols) : 0;
    p.row_end = sh->factored ? p.row_first + sh->rows : 0;
    p.col_first = sh->col_begin;
    p.col_end = sh->col_begin + sh->col_count;
    return p;
}

// row r of the part's slice as a row of the whole tensor
static int part_whole_row(const PartPlace* p, int r) {
    if (p->split == TP_ROWS) { return p->tp_rank * p->rows + r; }
    if (p->split == TP_ROWS_QKV) {  // the slice: its rows of q, then of k, then of v
        int third = p->rows / 3;
        return r / third * (third * p->tp) + p->tp_rank * third + r % third;
    }
    return r;
}

// row R of the whole tensor as a row of the part's slice, or -1 if another rank's slice holds it (or, wte's
// padded rows for one process, none)
static int part_slice_row(const PartPlace* p, int R) {
    if (p->split == TP_ROWS) { return R / p->rows == p->tp_rank ? R % p->rows : -1; }
    if (p->split == TP_ROWS_QKV) {
        int third = p->rows / 3, whole_third = third * p->tp, at = R % whole_third;
        return at / third == p->tp_rank ? R / whole_third * third + at % third : -1;
    }
    return R < p->rows ? R : -1;
}

static int part_whole_col(const PartPlace* p, int c) { return p->split == TP_COLUMNS ? p->tp_rank * p->cols + c : c; }

static int part_slice_col(const PartPlace* p, int C) {
    if (p->split == TP_COLUMNS) { return C / p->cols == p->tp_rank ? C % p->cols : -1; }
    return C < p->cols ? C : -1;
}

// whether a field of kind k is cut by the --tp group (each rank holds its own entries), or held whole by
// every rank of it (a whole tensor's fields; the statistics the group sums over its other side)
static int field_cut_by_group(const PartPlace* p, StateFieldKind k) {
    if (p->split == TP_WHOLE) { return 0; }
    if (k == FIELD_ROWS) { return p->split != TP_COLUMNS; }
    if (k == FIELD_COLS) { return p->split == TP_COLUMNS; }
    return 1;
}

// the place in the whole tensor of entry e (< state_field_used) of the part's field of kind k: (*row, *col)
// (a row statistic's column and a column statistic's row are 0)
static void part_entry_place(const PartPlace* p, StateFieldKind k, size_t e, int* row, int* col) {
    *row = *col = 0;
    if (k == FIELD_ROWS) { *row = part_whole_row(p, p->row_first + (int)e); return; }
    if (k == FIELD_COLS) { *col = part_whole_col(p, p->col_first + (int)e); return; }
    size_t x = p->first + e;
    *row = part_whole_row(p, (int)(x / (size_t)p->cols));
    *col = part_whole_col(p, (int)(x % (size_t)p->cols));
}

// the entry of the part's field of kind k at place (row, col) of the whole tensor, or -1 if the part holds none there
static long part_place_entry(const PartPlace* p, StateFieldKind k, int row, int col) {
    if (k == FIELD_ROWS) {
        int r = part_slice_row(p, row);
        return r >= p->row_first && r < p->row_end ? r - p->row_first : -1;
    }
    if (k == FIELD_COLS) {
        int c = part_slice_col(p, col);
        return c >= p->col_first && c < p->col_end ? c - p->col_first : -1;
    }
    int r = part_slice_row(p, row), c = part_slice_col(p, col);
    if (r < 0 || c < 0) { return -1; }
    size_t x = (size_t)r * p->cols + c;
    return x >= p->first && x < p->end ? (long)(x - p->first) : -1;
}

// whether two parts (of two layouts) hold the same elements of the same slice in the same state layout
static int parts_same(const PartPlace* a, const OptShard* sa, const PartPlace* b, const OptShard* sb) {
    return a->split == b->split && a->tp == b->tp && a->tp_rank == b->tp_rank && a->rows == b->rows && a->cols == b->cols &&
           a->first == b->first && a->end == b->end && a->col_first == b->col_first && a->col_end == b->col_end &&
           sa->factored == sb->factored && sa->state_units == sb->state_units && sa->width == sb->width &&
           sa->col_units == sb->col_units && sa->format == sb->format;
}

// ----------------------------------------------------------------------------
// a part's fields in fp32 while they move

typedef struct {
    int n;
    StateField field[MAX_STATE_FIELDS];
    size_t used[MAX_STATE_FIELDS];    // the entries that hold state (state_field_used)
    float* value[MAX_STATE_FIELDS];   // (field[i].entries) fp32
} PartFields;

static PartFields part_fields_alloc(const StateLayout* L, const OptShard* sh) {
    PartFields f;
    f.n = slice_state_fields(L->kind, sh, L->use_beta1, f.field);
    for (int i = 0; i < f.n; i++) {
        f.used[i] = state_field_used(&f.field[i], sh);
        f.value[i] = (float*)calloc_check(f.field[i].entries > 0 ? f.field[i].entries : 1, sizeof(float));
    }
    return f;
}

static void part_fields_free(PartFields* f) {
    for (int i = 0; i < f->n; i++) { free(f->value[i]); }
}

// the fields of a part's state (raw, in the layout of part sh) in fp32
static void part_fields_decode(PartFields* f, const OptShard* sh, const float* raw) {
    for (int i = 0; i < f->n; i++) {
        if (f->field[i].kind == FIELD_MOMENT) { state_moment_decode(f->field[i].map, f->field[i].entries, sh->format, raw, f->value[i]); }
        else { memcpy(f->value[i], raw, f->field[i].entries * sizeof(float)); }
        raw += f->field[i].floats;
    }
}

// the fields into a part's state (raw, zero, in the layout of part sh): each moment's used entries in its
// format (rounded with `stream`'s bits of step 0, or quantized), the statistics as they are
static void part_fields_encode(const PartFields* f, const OptShard* sh, float* raw, QStateStream stream) {
    for (int i = 0; i < f->n; i++) {
        const StateField* x = &f->field[i];
        if (x->kind == FIELD_MOMENT) { state_moment_encode(x->map, f->value[i], f->used[i], x->entries, sh->format, raw, stream); }
        else { memcpy(raw, f->value[i], x->entries * sizeof(float)); }
        raw += x->floats;
    }
}

// every entry of source part ps's fields (src) written where part pd (its fields dst) holds the same place
static void part_fields_move(const PartFields* src, const PartPlace* ps, PartFields* dst, const PartPlace* pd) {
    for (int i = 0; i < src->n; i++) {
        StateFieldKind k = src->field[i].kind;
        if (!field_cut_by_group(ps, k) && ps->tp_rank > 0) { continue; }  // held whole by every rank of the group: the first's
        for (size_t e = 0; e < src->used[i]; e++) {
            int row, col;
            part_entry_place(ps, k, e, &row, &col);
            long d = part_place_entry(pd, k, row, col);
            if (d >= 0) { dst->value[i][d] = src->value[i][e]; }
        }
    }
}

// ----------------------------------------------------------------------------
// the checkpoint's state files, each checked the first time a part of it is read

typedef struct {
    const char* dir;
    int step;
    const StateLayout* layout;
    TrainState head0;          // rank 0's header, read
    int h0[FILE_HEADER_INTS];  // and as it is in its file, once the file is checked
    LayoutRank* ranks;         // (world) each old rank, opened the first time it is needed (slices NULL before)
} CheckpointFiles;

static const LayoutRank* checkpoint_rank(CheckpointFiles* F, RankPlace p);

// the checkpoint of `step` in dir, written in layout L: rank 0's file checked first (the others are checked
// against its header)
static CheckpointFiles checkpoint_files_open(const char* dir, int step, const StateLayout* L) {
    CheckpointFiles F;
    memset(&F, 0, sizeof(F));
    F.dir = dir;
    F.step = step;
    F.layout = L;
    F.ranks = (LayoutRank*)calloc_check((size_t)layout_world(L), sizeof(LayoutRank));
    char path[CHECKPOINT_PATH_LEN];
    checkpoint_path(path, sizeof(path), dir, "state", step, 0);
    state_file_read_header(path, &F.head0);
    RankPlace first = {0, 0, 0};
    checkpoint_rank(&F, first);
    return F;
}

static void checkpoint_files_close(CheckpointFiles* F) {
    for (int r = 0; r < layout_world(F->layout); r++) {
        if (F->ranks[r].slices != NULL) { layout_rank_close(&F->ranks[r]); }
    }
    free(F->ranks);
}

// the old rank at place p, its file checked: whole and of the write of rank 0's (checkpoint.h's
// state_file_whole), of its layout (tp, pp, ZeRO, format as rank 0's) and of its size in that layout
static const LayoutRank* checkpoint_rank(CheckpointFiles* F, RankPlace p) {
    const StateLayout* L = F->layout;
    int rank = layout_rank(L, p);
    LayoutRank* r = &F->ranks[rank];
    if (r->slices != NULL) { return r; }
    char path[CHECKPOINT_PATH_LEN], why[CHECKPOINT_PATH_LEN + 256];
    int h[FILE_HEADER_INTS];
    checkpoint_path(path, sizeof(path), F->dir, "state", F->step, rank);
    if (!state_file_whole(path, rank, F->step, rank == 0 ? NULL : F->h0, h, why, sizeof(why))) {
        fail("-y 1: %s\n  hint: put the checkpoint's own file back, or resume from another checkpoint", why);
    }
    if (rank == 0) { memcpy(F->h0, h, sizeof(h)); }
    TrainState st;
    state_file_read_header(path, &st);
    *r = layout_rank_open(L, p);
    size_t params = gpt2_num_parameters(&r->config);
    if (st.tp != F->head0.tp || st.pp != F->head0.pp || st.zero != F->head0.zero || st.opt_format != F->head0.opt_format ||
        st.opt_floats != r->floats || st.num_params != params) {
        fail("state file '%s' (--tp %d --pp %d --zero %d, %s state: %zu optimizer floats of %llu parameters) is not rank %d's of the\n"
             "  checkpoint's layout (rank 0's: --tp %d --pp %d --zero %d, %s), which with this run's model and --optimizer %s holds\n"
             "  %zu floats of %zu parameters\n  hint: resume with the model (-e) and the optimizer flags that wrote it", path, st.tp, st.pp,
             st.zero, QSTATE_FORMAT_NAMES[st.opt_format], st.opt_floats, (unsigned long long)st.num_params, rank, F->head0.tp, F->head0.pp,
             F->head0.zero, QSTATE_FORMAT_NAMES[F->head0.opt_format], OPTIMIZER_NAMES[L->kind], r->floats, params);
    }
    return r;
}

// part k of old rank r's state (slice_state_floats of it) read from its file into raw, checked finite
static void checkpoint_part_read(const CheckpointFiles* F, const LayoutRank* r, int k, float* raw) {
    const StateLayout* L = F->layout;
    char path[CHECKPOINT_PATH_LEN];
    checkpoint_path(path, sizeof(path), F->dir, "state", F->step, layout_rank(L, r->place));
    size_t n = slice_state_floats(L->kind, &r->parts[k], L->use_beta1);
    FILE* f = fopen_check(path, "rb");
    fseek_check(f, (long)(FILE_HEADER_INTS * sizeof(int) + r->state_at[k] * sizeof(float)), SEEK_SET);
    fread_check(raw, sizeof(float), n, f);
    fclose(f);
    slice_state_check_finite(path, &r->slices[k], &r->parts[k], L->kind, L->use_beta1, raw);
}

// ----------------------------------------------------------------------------
// a new rank's state

typedef struct {
    int copied;          // slices whose part is the same in both layouts: copied as they were
    int recut;           // slices moved entry by entry through the whole tensor
    int requantized;     // of those, kept in 8 bits: requantized (not bitwise)
    size_t no_place;     // entries of wte's padded rows that had no old place (from --tp 1): 0
} RelayoutCounts;

// stops if slice k of the new rank dst is a matrix in one layout and a vector in the other under a
// factored optimizer (their second moments are not each other's), naming the slice and the fix
static void relayout_check_factored(const CheckpointFiles* F, const LayoutRank* src, int k_src, const LayoutRank* dst, int k) {
    const OptShard *a = &src->parts[k_src], *b = &dst->parts[k];
    if (F->layout->kind == OPT_ADAMW || a->factored == b->factored) { return; }
    char name[SLICE_NAME_LEN], model[CHECKPOINT_PATH_LEN];
    slice_name(&dst->slices[k], name, sizeof(name));
    checkpoint_path(model, sizeof(model), F->dir, "model", F->step, -1);
    const ParamSlice *s = &src->slices[k_src], *t = &dst->slices[k];
    fail("-y 1: %s is a %s under the checkpoint's --tp %d (a rank's %d x %d) and a %s under this run's --tp %d (%d x %d): %s keeps\n"
         "  a row and a column statistic of a matrix, one of each element of a vector, and neither is the other\n"
         "  hint: resume with --tp %d, or start a new run from the checkpoint's model file (-e %s), whose optimizer state starts anew",
         name, a->factored ? "matrix" : "vector", F->layout->tp, s->rows, s->cols, b->factored ? "matrix" : "vector", dst->layout->tp,
         t->rows, t->cols, OPTIMIZER_NAMES[F->layout->kind], F->layout->tp, model);
}

// the old parts that hold slice k of the new rank dst, moved into its fields, which are then checked whole:
// every entry found, but wte's padded rows from --tp 1 (0: the top of this file)
static void relayout_gather(CheckpointFiles* F, const LayoutRank* dst, int k, PartFields* out, RelayoutCounts* counts) {
    const StateLayout* from = F->layout;
    const ParamSlice* s = &dst->slices[k];
    int layer = layout_slice_layer(dst, k), stage = layout_stage_of(from, s->tensor, layer);
    int tensors = PARAMETER_TP_SPLIT[s->tensor] != TP_WHOLE ? from->tp : 1, datas = from->sharded ? from->dp : 1;
    PartPlace pd = part_place(dst, k);
    for (int i = 0; i < out->n; i++) {  // NaN: not found yet (the old state is checked finite)
        for (size_t e = 0; e < out->used[i]; e++) { out->value[i][e] = NAN; }
    }
    for (int t = 0; t < tensors; t++) {
        for (int d = 0; d < datas; d++) {
            RankPlace at = {stage, d, t};
            const LayoutRank* src = checkpoint_rank(F, at);
            int k_src = layout_slice_index(src, s->tensor, layer);
            relayout_check_factored(F, src, k_src, dst, k);
            float* raw = (float*)malloc_check((slice_state_floats(from->kind, &src->parts[k_src], from->use_beta1) + 1) * sizeof(float));
            checkpoint_part_read(F, src, k_src, raw);
            PartFields in = part_fields_alloc(from, &src->parts[k_src]);
            part_fields_decode(&in, &src->parts[k_src], raw);
            PartPlace ps = part_place(src, k_src);
            part_fields_move(&in, &ps, out, &pd);
            part_fields_free(&in);
            free(raw);
        }
    }
    for (int i = 0; i < out->n; i++) {
        for (size_t e = 0; e < out->used[i]; e++) {
            if (!isnan(out->value[i][e])) { continue; }
            int row, col;
            part_entry_place(&pd, out->field[i].kind, e, &row, &col);
            if (s->tensor == 0 && out->field[i].kind != FIELD_COLS && row >= from->model.vocab_size) {  // wte's padded rows
                out->value[i][e] = 0.0f;
                counts->no_place++;
                continue;
            }
            char name[SLICE_NAME_LEN];
            slice_name(s, name, sizeof(name));
            fail("relayout: entry %zu of field %d of %s (row %d, column %d of the tensor) is in no part of the checkpoint's layout (a bug)",
                 e, i, name, row, col);
        }
    }
}

// slice k of the new rank dst's state (out: its floats, zero) from the checkpoint: the one old part that is
// the same, copied; or every old part of it, moved through the whole tensor
static void relayout_slice(CheckpointFiles* F, const LayoutRank* dst, int k, float* out, RelayoutCounts* counts) {
    const StateLayout *from = F->layout, *to = dst->layout;
    const ParamSlice* s = &dst->slices[k];
    int layer = layout_slice_layer(dst, k), split = PARAMETER_TP_SPLIT[s->tensor] != TP_WHOLE;
    RankPlace same = {layout_stage_of(from, s->tensor, layer), from->sharded ? dst->place.data : 0, split ? dst->place.tensor : 0};
    if (same.data < from->dp && same.tensor < from->tp) {
        const LayoutRank* src = checkpoint_rank(F, same);
        int k_src = layout_slice_index(src, s->tensor, layer);
        PartPlace a = part_place(src, k_src), b = part_place(dst, k);
        if (parts_same(&a, &src->parts[k_src], &b, &dst->parts[k])) {
            checkpoint_part_read(F, src, k_src, out);
            counts->copied++;
            return;
        }
    }
    PartFields fields = part_fields_alloc(to, &dst->parts[k]);
    relayout_gather(F, dst, k, &fields, counts);
    QStateStream stream = {.seed = (uint32_t)k, .index_base = dst->part_first[k]};  // (as opt_state_convert's)
    part_fields_encode(&fields, &dst->parts[k], out, stream);
    part_fields_free(&fields);
    counts->recut++;
    counts->requantized += dst->parts[k].format == QSTATE_8BIT;
}

// the optimizer state of the rank at place `at` of layout `to` (state: its floats in that layout) from the
// checkpoint of `step` in dir, written in layout `from` (the same model, optimizer and, but for a
// conversion, format); *counts says how its slices came. Returns the header of the old rank 0's state file:
// its sampling RNG is every rank's, its data position the start of the round of windows every data-parallel
// rank goes on from (rank d d windows after it: trainer.h's state_load_relayout)
static TrainState relayout_rank_state(const char* dir, int step, const StateLayout* from, const StateLayout* to, RankPlace at,
                                      float* state, RelayoutCounts* counts) {
    CheckpointFiles F = checkpoint_files_open(dir, step, from);
    LayoutRank dst = layout_rank_open(to, at);
    RelayoutCounts zero = {0, 0, 0, 0};
    *counts = zero;
    memset(state, 0, dst.floats * sizeof(float));
    for (int k = 0; k < param_slice_count(&dst.config); k++) {
        if ((size_t)dst.slices[k].rows * dst.slices[k].cols == 0) { continue; }  // a tensor this stage does not hold: no state
        relayout_slice(&F, &dst, k, state + dst.state_at[k], counts);
    }
    TrainState st = F.head0;  // (its file checked when F opened)
    layout_rank_close(&dst);
    checkpoint_files_close(&F);
    return st;
}

// the floats of the state of the rank at place `at` of layout L
static size_t layout_state_floats(const StateLayout* L, RankPlace at) {
    GPT2Config c = layout_rank_config(L, at);
    OptSharding z = layout_sharding(L, at);
    return optimizer_state_floats_as(&c, L->kind, L->use_beta1, z.world, L->format);
}

#endif // LLMC_RELAYOUT_H
