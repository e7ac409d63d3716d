/*
adafactor.cuh: the Adafactor update on the device, mirroring adafactor_update of cpu/optimizers.h,
and the factored second moment it shares with CAME (came.cuh), for a slice held whole or, under
ZeRO-1, for this rank's part of it (OptShard of llmc/opt_layout.h), the ranks joined by NCCL.

    void* scratch;  // factored_model_scratch_bytes(&cfg) bytes (or factored_scratch_bytes(&sh), one slice)
    OptComms comms = {zero_comm, tensor_comm};   // OPT_NO_COMMS when one process holds the slice whole
    adafactor_update_cuda(param, grad, state, &sh, &h, t, scratch, comms, stream);   // t = 1, 2, ...
    // comms.zero: the ranks' NCCL communicator when sh.world > 1; comms.tensor: --tp's group when the
    // slice is a rank's part of a split tensor (sh.tp_rows or sh.tp_cols)

Invariants: param, grad and state are fp32 (master weights, gradients, optimizer state in the
layout of llmc/opt_layout.h: state is where the caller points, slice by slice, as on the CPU). The
order of operations is the CPU's (the list at the top of cpu/optimizers.h), each elementwise
operation rounded as the CPU rounds it: no fused multiply-adds (__fmul_rn, __fadd_rn; the CPU is
built without contraction), IEEE division and square root, the hyperparameters rounded to fp32
where they meet a tensor and an EMA's 1 - beta taken in double (opt_ema_coeffs of opt_layout.h).
The sums (row and column means, mean(R), RMS(U), RMS(p)) are taken in double over a partition
fixed by the slice part's shape alone, added in a fixed order, so a run is bitwise the same run
after run and on any GPU. They agree with the CPU's to double rounding, not bitwise, except the
column sums: those use the CPU's partition (FACTORED_ROW_PARTS = OPT_PARTS parts of the part's
rows, each added row after row, the parts in order) and are its sums exactly. The statistics the
update reads (the clip divisor, RMS(p)) stay in device memory: no copy to the host, no
synchronization.

ZeRO-1 (sh->world > 1; the CPU's OptSumFn and OptGatherFn hooks become NCCL calls on `stream`, so
nothing waits on the host): each rank updates its block of rows (a vector: of elements) and keeps
its block of the column statistics, as the CPU does. What needs the whole slice is each rank's
partial sum, in double, then an ncclAllReduce (ncclSum, in place) of those doubles across the ranks:
the column sums with the sum of the row statistic (mean(R)) in one call, the sums of U^2 and of p^2
in another; the CPU adds the same partial sums with MPI_Allreduce. With 2 ranks either library makes
one addition, so from the same gradients the column statistics are the CPU's bitwise; with more,
NCCL's order (its ring) and MPI's may differ in the last bit of a double. Each rank updates its
columns of the column statistic and their scales rsqrt(Cc_j); the scales are gathered, one
ncclBroadcast per rank's block of columns in one NCCL group (the CPU gathers Cc and takes rsqrt on
every rank: the same floats).
The sharded sums add in another order than the whole slice's (per rank, then across), so --zero 1
agrees with --zero 0 to double rounding before each float rounding (in practice bitwise).

--tp (sh->tp_rows, sh->tp_cols: the slice is a rank's rows or columns of a tensor split over the
tensor-parallel group, cpu/optimizers.h's OptShard.tp_sum): what spans the group's parts adds the
group's partial sums, an ncclAllReduce of doubles over its communicator, after ZeRO's sum where both
apply, as the CPU adds them: a column-parallel matrix's column sums and mean(R) (the group holds the
other rows), a row-parallel matrix's row sums before the row statistic's EMA (the other columns:
one more kernel adds the block columns' row sums first), and every RMS (U's, p's). The sums give every
rank of the group the same bits, so the statistics of a row-parallel matrix's rows stay alike there.

Launches per slice (a real GPU's cost is mostly their count: a d12 step has 50 matrix and 98 vector
slices): Adafactor matrix 6 kernels, vector 4, each +2 with scale_parameter (RMS(p)); ZeRO-1 adds
NCCL calls: 3 for a matrix (all-reduce, broadcast group, all-reduce), 1 for a vector. CAME: see came.cuh.

Scratch (the caller's, reused by every slice; the kernels run in stream order): the row and column
scales of U, the partial sums of the factored statistics, the block sums of the RMS. Its layout
comes from factored_scratch_carve alone, so the sizes and the carving cannot disagree; a part of a
slice needs at most what the whole slice needs, so the model's scratch covers every ZeRO-1 part.

Failure: a sharded slice without a communicator stops with a message.
*/
#ifndef CUDA_ADAFACTOR_CUH
#define CUDA_ADAFACTOR_CUH

#include <math.h>
#include "common.cuh"
#include "nccl.cuh"
#include "global_norm.cuh"  // block_sum_double, global_norm_squared_cuda, global_norm_total_kernel
#include "../llmc/model_config.h"
#include "../llmc/opt_layout.h"

#define OPT_BLOCK GLOBAL_NORM_BLOCK          // the most threads of a block (block_sum_double's size)
#define OPT_VEC 4                            // floats per thread and row: one Packed128<float>
#define FACTORED_ROW_PARTS 64                // a matrix's rows cut into this many parts: cpu OPT_PARTS's cut
#define FACTORED_TILE 32                     // rows whose sums a block gathers between two barriers
#define OPT_MAX_BLOCKS GLOBAL_NORM_MAX_BLOCKS  // blocks of an RMS(U) sum (and of an RMS(p): global_norm.cuh)

// ----------------------------------------------------------------------------
// device helpers: the CPU's elementwise operations, rounded as the CPU rounds them

// avg = beta avg + (1 - beta) x, as cpu opt_ema (two products, then their sum)
__device__ inline float opt_ema_device(float avg, float x, OptEma e) {
    return __fadd_rn(__fmul_rn(e.beta, avg), __fmul_rn(e.one_minus_beta, x));
}

// 1 / sqrt(x), both IEEE-rounded, as cpu opt_rsqrt (not the approximate rsqrtf)
__device__ inline float opt_rsqrt_device(float x) { return 1.0f / sqrtf(x); }

// max(1, RMS(U) / clip_threshold) from the sum of U^2 over the slice's total elements, as cpu opt_clip_divisor
__device__ inline float clip_divisor(double sum_u2, double total, float clip_threshold) {
    float rms = (float)sqrt(sum_u2 / total);
    return fmaxf(1.0f, rms / clip_threshold);
}

// element (i, j) of U = (scale_row_i scale_col_j) g_ij; a vector has no scale_row (1)
__device__ inline float scaled_grad(const float* scale_row, int i, float scale_col_j, float g) {
    float sr = scale_row != NULL ? scale_row[i] : 1.0f;
    return __fmul_rn(__fmul_rn(sr, scale_col_j), g);
}

// the NCCL communicators a slice part's sums cross (either NULL where it does not)
typedef struct {
    ncclComm_t zero;    // ZeRO-1's data-parallel ranks that share the slice (sh->world > 1)
    ncclComm_t tensor;  // --tp's group that holds the tensor's other parts (sh->tp_rows or sh->tp_cols)
} OptComms;
static const OptComms OPT_NO_COMMS = {NULL, NULL};

// ----------------------------------------------------------------------------
// the scratch of one slice's update

typedef struct {
    float* scale_row;   // (rows) U's row scales; a vector's stays unused (scales of 1, passed as NULL)
    float* scale_col;   // (cols) U's column scales (a vector: one per element); whole under ZeRO-1 too
    double* row_parts;  // (col_chunks, rows) each block column's row sums; matrices
    double* col_parts;  // (FACTORED_ROW_PARTS, cols) each row part's column sums; matrices
    double* col_sums;   // (1 + cols) [0]: the sum of the row statistic over the rows (mean(R)),
                        // [1 + j]: column j's sum; what ZeRO-1's ranks add in one call; matrices
    double* partials;   // (OPT_MAX_BLOCKS) the block sums of an RMS
    double* sums;       // [2]: sum of p^2 before the step (Adafactor's scale_parameter), sum of U^2
} FactoredScratch;

static size_t factored_align(size_t bytes) { return (bytes + 15) / 16 * 16; }

// columns one block of factored_sums_kernel covers: OPT_BLOCK threads of OPT_VEC columns
static int factored_col_chunks(int cols) { return ceil_div(cols, OPT_BLOCK * OPT_VEC); }

// threads of a block that walks a row of cols: whole warps, OPT_VEC columns each, at least one warp
// (an empty ZeRO-1 part still launches), at most OPT_BLOCK
static int opt_threads(int cols) {
    int t = ceil_div(ceil_div(cols, OPT_VEC), WARP_SIZE) * WARP_SIZE;
    return t < WARP_SIZE ? WARP_SIZE : (t < OPT_BLOCK ? t : OPT_BLOCK);
}

// points w into base (NULL: only counts) for slice part sh; returns the bytes
static size_t factored_scratch_carve(char* base, const OptShard* sh, FactoredScratch* w) {
    size_t rows = (size_t)sh->rows, cols = (size_t)sh->cols, offset = 0;
    size_t row_parts = sh->factored ? (size_t)factored_col_chunks(sh->cols) * rows : 0;
    size_t col_parts = sh->factored ? (size_t)FACTORED_ROW_PARTS * cols : 0;
    size_t col_sums = sh->factored ? 1 + cols : 0;
    const size_t bytes[7] = {rows * sizeof(float), cols * sizeof(float), row_parts * sizeof(double),
                             col_parts * sizeof(double), col_sums * sizeof(double), OPT_MAX_BLOCKS * sizeof(double),
                             2 * sizeof(double)};
    void** ptrs[7] = {(void**)&w->scale_row, (void**)&w->scale_col, (void**)&w->row_parts, (void**)&w->col_parts,
                      (void**)&w->col_sums, (void**)&w->partials, (void**)&w->sums};
    for (int k = 0; k < 7; k++) {
        *ptrs[k] = base != NULL ? base + offset : NULL;
        offset += factored_align(bytes[k]);
    }
    return offset;
}

// the scratch bytes of the update of slice part sh (Adafactor or CAME)
static size_t factored_scratch_bytes(const OptShard* sh) {
    FactoredScratch w;
    return factored_scratch_carve(NULL, sh, &w);
}

// the most any slice of model c needs, one process holding every slice: the scratch the trainer keeps
static size_t factored_model_scratch_bytes(const GPT2Config* c) {
    ParamSlice* s = param_slices_alloc(c);
    size_t most = 0, offset;
    for (int k = 0; k < param_slice_count(c); k++) {
        OptShard sh = slice_shard(&s[k], &OPT_UNSHARDED, &offset);
        size_t b = factored_scratch_bytes(&sh);
        if (b > most) { most = b; }
    }
    free(s);
    return most;
}

// ----------------------------------------------------------------------------
// CUDA kernels

// the two statistics whose row and column means are taken: Adafactor's and CAME's G = g^2 + eps1,
// and CAME's residual Res = (U - M)^2 + eps2 (ema(M, U) updated in passing)
enum FactoredStat { STAT_GRAD_SQ, STAT_CAME_RESIDUAL };

typedef struct {
    const float* g;          // (rows, cols) the gradient
    float eps;               // added to the statistic: eps1 (G) or eps2 (Res)
    // CAME's residual only: U_ij = (scale_row_i scale_col_j) g_ij / clip, M = ema(M, U, e1)
    float* M;                // (rows, cols) the first moment
    const float* scale_row;  // (rows)
    const float* scale_col;  // (cols)
    const double* sum_u2;    // the sum of U^2, for the clip divisor
    double total;            // elements of the slice
    float clip_threshold;
    OptEma e1;
} FactoredArgs;

// x[k] = the statistic at (i, j0 + k), k < OPT_VEC, zero past cols; `vector`: 16-byte loads
template <int STAT>
__device__ inline void factored_stat(float x[OPT_VEC], const FactoredArgs& a, int i, int j0, int cols, float clip,
                                     bool vector) {
    size_t row = (size_t)i * cols;
    Packed128<float> g = load_pack(a.g + row, j0, cols, vector);
    if (STAT == STAT_GRAD_SQ) {
        for (int k = 0; k < OPT_VEC; k++) { x[k] = j0 + k < cols ? __fadd_rn(__fmul_rn(g[k], g[k]), a.eps) : 0.0f; }
        return;
    }
    Packed128<float> m = load_pack(a.M + row, j0, cols, vector), sc = load_pack(a.scale_col, j0, cols, vector);
    for (int k = 0; k < OPT_VEC; k++) {
        float u = scaled_grad(a.scale_row, i, sc[k], g[k]) / clip;
        m[k] = opt_ema_device(m[k], u, a.e1);
        float d = __fadd_rn(u, -m[k]);
        x[k] = j0 + k < cols ? __fadd_rn(__fmul_rn(d, d), a.eps) : 0.0f;
    }
    store_pack(a.M + row, j0, cols, vector, m);
}

// the sums of a statistic X (rows, cols) of a matrix, in double: row_parts (gridDim.x, rows) =
// each block column's sum of X_i over its columns, col_parts (FACTORED_ROW_PARTS, cols) = each row
// part's sum of X_:j over its rows. Block (c, p) covers columns [c 4 blockDim, (c+1) 4 blockDim) and
// part p of the rows (cpu opt_part's cut); a thread holds 4 columns and adds their rows in order
// (the CPU's column sums, bitwise); a row's 4 values are added in the thread, its warp's by a
// butterfly, the warps in order through shared memory, FACTORED_TILE rows between barriers.
// bytes: 4 rows cols (g) [+ 8 rows cols: M read and written, CAME] + 8 (chunks rows + parts cols);
// FLOPs: about 4 rows cols (G) or 12 rows cols (Res), plus 2 rows cols double adds
template <int STAT>
__global__ void factored_sums_kernel(double* row_parts, double* col_parts, FactoredArgs a, int rows, int cols, bool vector) {
    __shared__ double tile_sums[OPT_BLOCK / WARP_SIZE][FACTORED_TILE];
    int warps = blockDim.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    int j0 = (blockIdx.x * blockDim.x + threadIdx.x) * OPT_VEC;
    int begin = (int)((long long)rows * blockIdx.y / FACTORED_ROW_PARTS);
    int end = (int)((long long)rows * (blockIdx.y + 1) / FACTORED_ROW_PARTS);
    float clip = STAT == STAT_CAME_RESIDUAL ? clip_divisor(*a.sum_u2, a.total, a.clip_threshold) : 1.0f;
    double col[OPT_VEC] = {0.0, 0.0, 0.0, 0.0};
    for (int i0 = begin; i0 < end; i0 += FACTORED_TILE) {
        int n = min(FACTORED_TILE, end - i0);
        for (int r = 0; r < n; r++) {
            float x[OPT_VEC];
            factored_stat<STAT>(x, a, i0 + r, j0, cols, clip, vector);
            double s = 0.0;
            for (int k = 0; k < OPT_VEC; k++) {
                col[k] += x[k];
                s += x[k];
            }
            s = warp_reduce_sum(s);
            if (lane == 0) { tile_sums[warp][r] = s; }
        }
        __syncthreads();
        if ((int)threadIdx.x < n) {
            double s = 0.0;
            for (int w = 0; w < warps; w++) { s += tile_sums[w][threadIdx.x]; }
            row_parts[(size_t)blockIdx.x * rows + i0 + threadIdx.x] = s;
        }
        __syncthreads();  // tile_sums is refilled by the next tile
    }
    for (int k = 0; k < OPT_VEC; k++) {
        if (j0 + k < cols) { col_parts[(size_t)blockIdx.y * cols + j0 + k] = col[k]; }
    }
}

// the row statistic's EMA and what the column statistic needs, as cpu opt_ema_grad_sq_factored and
// opt_ema_col_means up to the sums across the ranks: S_row (rows) = ema(S_row, (row_parts summed over
// the chunks) / total_cols (cols, or --tp's whole tensor's); col_sums[0] = the sum of the new S_row (mean(R)'s, cpu opt_factored_scales:
// thread t adds rows t, t + blockDim, ..., the threads by a fixed tree), col_sums[1 + j] = col_parts
// summed over the parts in order (the CPU's column sums, bitwise). One block: the row sum needs every row.
// bytes: 8 (chunks rows + parts cols) + 8 rows + 8 cols; FLOPs: chunks rows + parts cols + 4 rows
static __global__ void factored_row_ema_kernel(float* S_row, double* col_sums, const double* row_parts, int chunks,
                                               const double* col_parts, int rows, int cols, int total_cols, OptEma e) {
    double sum_rows = 0.0;
    for (int i = threadIdx.x; i < rows; i += blockDim.x) {
        double s = 0.0;
        for (int c = 0; c < chunks; c++) { s += row_parts[(size_t)c * rows + i]; }
        float r = opt_ema_device(S_row[i], (float)(s / total_cols), e);
        S_row[i] = r;
        sum_rows += r;
    }
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        double s = 0.0;
        for (int p = 0; p < FACTORED_ROW_PARTS; p++) { s += col_parts[(size_t)p * cols + j]; }
        col_sums[1 + j] = s;
    }
    double total = block_sum_double(sum_rows);
    if (threadIdx.x == 0) { col_sums[0] = total; }
}

// --tp, a row-parallel matrix: row_parts' first block column (rows) := each row's sum over the block
// columns (chunks), in order, as factored_row_ema_kernel adds them, so that the group's sums of the
// rows can be added before the EMA (which then reads one block column). A thread per row.
// bytes: 8 (chunks + 1) rows; FLOPs: chunks rows
static __global__ void factored_row_sums_kernel(double* row_parts, int chunks, int rows) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) { return; }
    double s = 0.0;
    for (int c = 0; c < chunks; c++) { s += row_parts[(size_t)c * rows + i]; }
    row_parts[i] = s;
}

// from the sums over the whole slice (col_sums, added across the ranks), as cpu opt_ema_col_means and
// opt_factored_scales: this part's columns of the column statistic, S_col (col_count) = ema(S_col,
// col_sums[1 + col_begin + c] / total_rows), and their scales scale_col[col_begin + c] = rsqrt(S_col[c]);
// the row scales scale_row (rows) = rsqrt(S_row_i / mean(S_row)), mean = col_sums[0] / total_rows.
// A thread per row, then one per column. bytes: 8 rows + 20 col_count; FLOPs: 4 (rows + col_count)
static __global__ void factored_scales_kernel(float* scale_row, float* scale_col, float* S_col, const float* S_row,
                                              const double* col_sums, int rows, int total_rows, int col_begin,
                                              int col_count, OptEma e) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < rows) {
        float mean = (float)(col_sums[0] / total_rows);
        scale_row[k] = opt_rsqrt_device(S_row[k] / mean);
    } else if (k < rows + col_count) {
        int c = k - rows, j = col_begin + c;
        float v = opt_ema_device(S_col[c], (float)(col_sums[1 + j] / total_rows), e);
        S_col[c] = v;
        scale_col[j] = opt_rsqrt_device(v);
    }
}

// a vector's second moment, as cpu opt_second_moment: V (n) = ema(V, g^2 + eps1), scale_col = rsqrt(V).
// bytes: 16 n; FLOPs: 6 n
static __global__ void second_moment_vector_kernel(float* V, float* scale_col, const float* g, int n, float eps1, OptEma e) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) { return; }
    float v = opt_ema_device(V[j], __fadd_rn(__fmul_rn(g[j], g[j]), eps1), e);
    V[j] = v;
    scale_col[j] = opt_rsqrt_device(v);
}

// partials (gridDim.x) = each block's sum of U^2 in double, U_ij = (scale_row_i scale_col_j) g_ij
// (cpu opt_clip_divisor's sum); block b takes rows b, b + gridDim.x, ..., its threads 4 columns
// at a time. bytes: 4 rows cols + 4 (rows + cols); FLOPs: 4 rows cols
static __global__ void clip_partials_kernel(double* partials, const float* g, const float* scale_row,
                                            const float* scale_col, int rows, int cols, bool vector) {
    double s = 0.0;
    for (int i = blockIdx.x; i < rows; i += gridDim.x) {
        for (int j0 = threadIdx.x * OPT_VEC; j0 < cols; j0 += blockDim.x * OPT_VEC) {
            Packed128<float> gp = load_pack(g + (size_t)i * cols, j0, cols, vector);
            Packed128<float> sc = load_pack(scale_col, j0, cols, vector);
            for (int k = 0; k < OPT_VEC && j0 + k < cols; k++) {
                float u = scaled_grad(scale_row, i, sc[k], gp[k]);
                s += (double)u * u;
            }
        }
    }
    double total = block_sum_double(s);
    if (threadIdx.x == 0) { partials[blockIdx.x] = total; }
}

// what one Adafactor step applies, beside the slice's statistics (in device memory)
typedef struct {
    float lr;              // the step size (adafactor_step_size), before scale_parameter
    float eps2;            // floor of RMS(p)
    int scale_parameter;   // lr *= max(eps2, RMS(p)), RMS(p) from the sum of p^2 before the step
    float clip_threshold;
    double weight_decay;
    OptEma e1;             // the first moment's EMA; used when M is given
} AdafactorStep;

// the update, as cpu adafactor_update's last loop: u = (scale_row_i scale_col_j) g_ij / clip * lr;
// with M: M = ema(M, u), u = M; with weight decay: p += (-weight_decay lr) p; then p -= u.
// sums[0] = sum of p^2 before the step (scale_parameter), sums[1] = sum of U^2 (the clip divisor).
// Block b takes rows b, b + gridDim.x, ..., its threads 4 columns at a time.
// bytes: 12 rows cols (p, g read, p written) [+ 8 rows cols: M]; FLOPs: about 8 rows cols
static __global__ void adafactor_apply_kernel(float* param, const float* grad, float* M, const float* scale_row,
                                              const float* scale_col, int rows, int cols, const double* sums,
                                              double total, AdafactorStep st, bool vector) {
    float clip = clip_divisor(sums[1], total, st.clip_threshold);
    float lr = st.scale_parameter ? __fmul_rn(st.lr, fmaxf(st.eps2, (float)sqrt(sums[0] / total))) : st.lr;
    float decay = (float)(-st.weight_decay * lr);
    for (int i = blockIdx.x; i < rows; i += gridDim.x) {
        size_t row = (size_t)i * cols;
        for (int j0 = threadIdx.x * OPT_VEC; j0 < cols; j0 += blockDim.x * OPT_VEC) {
            Packed128<float> p = load_pack(param + row, j0, cols, vector), g = load_pack(grad + row, j0, cols, vector);
            Packed128<float> sc = load_pack(scale_col, j0, cols, vector);
            Packed128<float> m = M != NULL ? load_pack(M + row, j0, cols, vector) : Packed128<float>::zeros();
            for (int k = 0; k < OPT_VEC; k++) {
                float u = __fmul_rn(scaled_grad(scale_row, i, sc[k], g[k]) / clip, lr);
                if (M != NULL) {
                    m[k] = opt_ema_device(m[k], u, st.e1);
                    u = m[k];
                }
                if (st.weight_decay != 0.0) { p[k] = __fadd_rn(p[k], __fmul_rn(decay, p[k])); }
                p[k] = __fadd_rn(p[k], -u);
            }
            store_pack(param + row, j0, cols, vector, p);
            if (M != NULL) { store_pack(M + row, j0, cols, vector, m); }
        }
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// a slice part shared by several ranks needs their communicator, and a rank's part of a --tp split tensor its group's
static void factored_check_comm(const OptShard* sh, OptComms comms, const char* who) {
    if (sh->world > 1 && comms.zero == NULL) {
        fail("%s: a slice shared by %d processes (ZeRO-1) and no NCCL communicator to add their sums\n"
             "  hint: pass the ranks' communicator (train_gpt.cu: m->comm), or OPT_UNSHARDED for a slice held whole",
             who, sh->world);
    }
    if ((sh->tp_rows || sh->tp_cols) && comms.tensor == NULL) {
        fail("%s: an optimizer step over a tensor split by --tp, without the tensor-parallel group's communicator to add its sums (a bug)", who);
    }
}

// x (n doubles, device) := the sum over the ranks that share the slice of their x, in place on
// stream (the CPU's opt_sum_across); nothing when this process holds the slice whole
static void opt_sum_across_cuda(double* x, size_t n, const OptShard* sh, OptComms comms, cudaStream_t stream) {
    if (sh->world == 1) { return; }
    NCCL_CHECK(ncclAllReduce(x, x, n, ncclDouble, ncclSum, comms.zero, stream));
}

// --tp: x (n doubles, device) := the sum over the tensor-parallel group of x, in place on stream, when
// the statistic spans the tensor's parts there (split: 1; the CPU's opt_sum_tp)
static void opt_sum_tp_cuda(double* x, size_t n, int split, OptComms comms, cudaStream_t stream) {
    if (!split) { return; }
    NCCL_CHECK(ncclAllReduce(x, x, n, ncclDouble, ncclSum, comms.tensor, stream));
}

// scale_col (cols): every rank's block of columns (opt_layout.h's shard_range, the CPU's gather
// counts) from the rank that computed it, one broadcast per block in one NCCL group, in place;
// nothing when the slice is whole
static void opt_gather_cols_cuda(float* scale_col, const OptShard* sh, ncclComm_t comm, cudaStream_t stream) {
    if (sh->world == 1) { return; }
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < sh->world; r++) {
        int begin, end;
        shard_range(sh->cols, r, sh->world, &begin, &end);
        if (end > begin) {
            NCCL_CHECK(ncclBroadcast(scale_col + begin, scale_col + begin, (size_t)(end - begin), ncclFloat, r, comm, stream));
        }
    }
    NCCL_CHECK(ncclGroupEnd());
}

// 16-byte loads and stores: every pointer aligned and every row a whole number of packs
static bool factored_vector(const void* a, const void* b, const void* c, int cols) {
    return is_aligned16(a) && is_aligned16(b) && (c == NULL || is_aligned16(c)) && cols % OPT_VEC == 0;
}

// blocks of a kernel that takes one row per block (grid-stride over the rows); one for an empty
// ZeRO-1 part (a grid of none is a launch error)
static int opt_row_blocks(int rows) { return rows < 1 ? 1 : (rows < OPT_MAX_BLOCKS ? rows : OPT_MAX_BLOCKS); }

// blocks of OPT_BLOCK threads for n items, a thread each; one for none
static int opt_blocks(int n) { return n < 1 ? 1 : ceil_div(n, OPT_BLOCK); }

// ema(S_row, row means of X), ema(S_col, column means of X) for this part (rows, cols) of a matrix,
// the means over the whole slice, then the scales of the factored rsqrt: w->scale_row =
// rsqrt(S_row / mean(S_row)), w->scale_col = rsqrt(S_col), every column (S_col: this part's block).
// 3 kernels; ZeRO-1 adds an all-reduce of the sums and the gather of the column scales; --tp adds
// an all-reduce of the column sums and mean(R) (a column-parallel matrix), or a kernel and an
// all-reduce of the row sums (a row-parallel one)
template <int STAT>
static void factored_stat_cuda(float* S_row, float* S_col, const FactoredArgs* a, const OptShard* sh, OptEma e,
                               const FactoredScratch* w, OptComms comms, cudaStream_t stream) {
    int rows = sh->rows, cols = sh->cols, chunks = factored_col_chunks(cols);
    bool vector = factored_vector(a->g, a->M, a->scale_col, cols);
    dim3 grid(chunks, FACTORED_ROW_PARTS);
    factored_sums_kernel<STAT><<<grid, opt_threads(cols), 0, stream>>>(w->row_parts, w->col_parts, *a, rows, cols, vector);
    CUDA_CHECK_LAUNCH();
    if (sh->tp_cols) {  // --tp: the group's columns of a row-parallel matrix, added to each row's sum before its EMA
        factored_row_sums_kernel<<<opt_blocks(rows), OPT_BLOCK, 0, stream>>>(w->row_parts, chunks, rows);
        CUDA_CHECK_LAUNCH();
        opt_sum_tp_cuda(w->row_parts, (size_t)rows, 1, comms, stream);
        chunks = 1;
    }
    factored_row_ema_kernel<<<1, OPT_BLOCK, 0, stream>>>(S_row, w->col_sums, w->row_parts, chunks, w->col_parts, rows, cols,
                                                         sh->total_cols, e);
    CUDA_CHECK_LAUNCH();
    opt_sum_across_cuda(w->col_sums, 1 + (size_t)cols, sh, comms, stream);
    opt_sum_tp_cuda(w->col_sums, 1 + (size_t)cols, sh->tp_rows, comms, stream);  // --tp: the group's rows of a column-parallel matrix
    factored_scales_kernel<<<opt_blocks(rows + sh->col_count), OPT_BLOCK, 0, stream>>>(
        w->scale_row, w->scale_col, S_col, S_row, w->col_sums, rows, sh->total_rows, sh->col_begin, sh->col_count, e);
    CUDA_CHECK_LAUNCH();
    opt_gather_cols_cuda(w->scale_col, sh, comms.zero, stream);
}

// the second moment shared by Adafactor and CAME (cpu opt_second_moment): updates v (factored: R then
// this part's block of Cc; vector: V) with g and fills w's scales so that U_ij = (scale_row_i scale_col_j) g_ij
static void second_moment_cuda(float* v, const float* g, const OptShard* sh, float eps1, OptEma e,
                               const FactoredScratch* w, OptComms comms, cudaStream_t stream) {
    if (sh->factored) {
        FactoredArgs a;
        memset(&a, 0, sizeof(a));
        a.g = g;
        a.eps = eps1;
        factored_stat_cuda<STAT_GRAD_SQ>(v, v + sh->state_units, &a, sh, e, w, comms, stream);
        return;
    }
    second_moment_vector_kernel<<<opt_blocks(sh->cols), OPT_BLOCK, 0, stream>>>(v, w->scale_col, g, sh->cols, eps1, e);
    CUDA_CHECK_LAUNCH();
}

// *sum_u2 (device) = the sum over the slice of U^2, U_ij = (scale_row_i scale_col_j) g_ij
// (cpu opt_clip_divisor's sum); a vector's scale_row is not read
static void clip_sum_cuda(double* sum_u2, const float* g, const OptShard* sh, const FactoredScratch* w, cudaStream_t stream) {
    int blocks = opt_row_blocks(sh->rows);
    const float* scale_row = sh->factored ? w->scale_row : NULL;
    clip_partials_kernel<<<blocks, opt_threads(sh->cols), 0, stream>>>(w->partials, g, scale_row, w->scale_col, sh->rows,
                                                                       sh->cols, factored_vector(g, w->scale_col, NULL, sh->cols));
    CUDA_CHECK_LAUNCH();
    global_norm_total_kernel<<<1, GLOBAL_NORM_BLOCK, 0, stream>>>(sum_u2, w->partials, blocks);
    CUDA_CHECK_LAUNCH();
}

// one Adafactor step on a slice part sh (rows, cols), the whole slice or this rank's ZeRO-1 part,
// as cpu adafactor_update: param and grad (rows, cols), state in the layout of opt_layout.h (factored:
// R, Cc [, M]; vector: V [, M]); t = 1, 2, ...; scratch: factored_scratch_bytes(sh) bytes; comm: the
// ranks that share the slice (unused when sh->world is 1). The sums of p^2 (RMS(p), taken before the
// step changes p) and of U^2 cross the ranks together (ZeRO's, then --tp's group), just before the
// update that reads them.
// adafactor_update_m_cuda takes the first moment M (rows, cols) wherever the caller keeps it (NULL:
// none) and `second` the rest of the state (R, Cc; V): cuda/factored_lowp.cuh passes an fp32 copy
// of an 8-bit or bf16 M; adafactor_update_cuda finds M in the state, after the second moment
static void adafactor_update_m_cuda(float* param, const float* grad, float* second, float* M, const OptShard* sh,
                                    const AdafactorHyper* h, int t, void* scratch, OptComms comms, cudaStream_t stream) {
    factored_check_comm(sh, comms, "adafactor_update_cuda");
    FactoredScratch w;
    factored_scratch_carve((char*)scratch, sh, &w);
    int rows = sh->rows, cols = sh->cols;
    size_t n = (size_t)rows * cols;
    if (h->scale_parameter) { global_norm_squared_cuda(w.sums, param, n, w.partials, stream); }  // p before the step
    second_moment_cuda(second, grad, sh, (float)h->eps1, opt_ema_coeffs(adafactor_beta2(h, t)), &w, comms, stream);
    clip_sum_cuda(w.sums + 1, grad, sh, &w, stream);
    int first = h->scale_parameter ? 0 : 1;  // sums[0]: p^2 (scale_parameter only), sums[1]: U^2
    opt_sum_across_cuda(w.sums + first, 2 - first, sh, comms, stream);
    opt_sum_tp_cuda(w.sums + first, 2 - first, sh->tp_rows || sh->tp_cols, comms, stream);  // --tp: the group's parts
    AdafactorStep st = {(float)adafactor_step_size(h, t), (float)h->eps2, h->scale_parameter, (float)h->clip_threshold,
                        h->weight_decay, opt_ema_coeffs(h->beta1)};
    bool vector = factored_vector(param, grad, M, cols) && is_aligned16(w.scale_col);
    adafactor_apply_kernel<<<opt_row_blocks(rows), opt_threads(cols), 0, stream>>>(
        param, grad, M, sh->factored ? w.scale_row : NULL, w.scale_col, rows, cols, w.sums, (double)sh->total, st, vector);
    CUDA_CHECK_LAUNCH();
}

static void adafactor_update_cuda(float* param, const float* grad, float* state, const OptShard* sh,
                                  const AdafactorHyper* h, int t, void* scratch, OptComms comms, cudaStream_t stream) {
    float* M = h->beta1 > 0.0 ? state + adafactor_state_floats(sh, 0) : NULL;
    adafactor_update_m_cuda(param, grad, state, M, sh, h, t, scratch, comms, stream);
}

#endif // CUDA_ADAFACTOR_CUH
