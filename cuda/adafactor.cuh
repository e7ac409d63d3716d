/*
adafactor.cuh: the Adafactor update on the device, mirroring adafactor_update of cpu/optimizers.h,
and the factored second moment it shares with CAME (came.cuh), for one process that holds every
slice whole (no ZeRO-1: OPT_UNSHARDED).

    void* scratch;  // factored_model_scratch_bytes(&cfg) bytes (or factored_scratch_bytes(&sh), one slice)
    adafactor_update_cuda(param, grad, state, &sh, &h, t, scratch, stream);   // t = 1, 2, ...

Invariants: param, grad and state are fp32 (master weights, gradients, optimizer state in the
layout of llmc/opt_layout.h: state is where the caller points, slice by slice, as on the CPU). The
order of operations is the CPU's (the list at the top of cpu/optimizers.h), each elementwise
operation rounded as the CPU rounds it: no fused multiply-adds (__fmul_rn, __fadd_rn; the CPU is
built without contraction), IEEE division and square root, the hyperparameters rounded to fp32
where they meet a tensor and an EMA's 1 - beta taken in double (opt_ema_coeffs of opt_layout.h).
The sums (row and column means, mean(R), RMS(U), RMS(p)) are taken in double over a partition
fixed by the slice's shape alone, added in a fixed order, so a run is bitwise the same run after
run and on any GPU. They agree with the CPU's to double rounding, not bitwise, except the column
sums: those use the CPU's partition (FACTORED_ROW_PARTS = OPT_PARTS parts of the rows, each added
row after row, the parts in order) and are its sums exactly. The statistics the update reads
(the clip divisor, RMS(p)) stay in device memory: no copy to the host, no synchronization.

Scratch (the caller's, reused by every slice; the kernels run in stream order): the row and column
scales of U, the partial sums of the factored statistics, the block sums of the RMS. Its layout
comes from factored_scratch_carve alone, so the sizes and the carving cannot disagree.

Failure: a sharded slice (OptShard of more than one process) stops with a message: ZeRO-1 on the
GPU is not written yet.
*/
#ifndef CUDA_ADAFACTOR_CUH
#define CUDA_ADAFACTOR_CUH

#include <math.h>
#include "common.cuh"
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

// ----------------------------------------------------------------------------
// the scratch of one slice's update

typedef struct {
    float* scale_row;   // (rows) U's row scales; a vector's stays unused (scales of 1, passed as NULL)
    float* scale_col;   // (cols) U's column scales (a vector: one per element)
    double* row_parts;  // (col_chunks, rows) each block column's row sums; matrices
    double* col_parts;  // (FACTORED_ROW_PARTS, cols) each row part's column sums; matrices
    double* partials;   // (OPT_MAX_BLOCKS) the block sums of an RMS
    double* sums;       // [2]: sum of p^2 before the step (Adafactor's scale_parameter), sum of U^2
} FactoredScratch;

static size_t factored_align(size_t bytes) { return (bytes + 15) / 16 * 16; }

// columns one block of factored_sums_kernel covers: OPT_BLOCK threads of OPT_VEC columns
static int factored_col_chunks(int cols) { return ceil_div(cols, OPT_BLOCK * OPT_VEC); }

// threads of a block that walks a row of cols: whole warps, OPT_VEC columns each, at most OPT_BLOCK
static int opt_threads(int cols) {
    int t = ceil_div(ceil_div(cols, OPT_VEC), WARP_SIZE) * WARP_SIZE;
    return t < OPT_BLOCK ? t : OPT_BLOCK;
}

// points w into base (NULL: only counts) for slice part sh; returns the bytes
static size_t factored_scratch_carve(char* base, const OptShard* sh, FactoredScratch* w) {
    size_t rows = (size_t)sh->rows, cols = (size_t)sh->cols, offset = 0;
    size_t row_parts = sh->factored ? (size_t)factored_col_chunks(sh->cols) * rows : 0;
    size_t col_parts = sh->factored ? (size_t)FACTORED_ROW_PARTS * cols : 0;
    const size_t bytes[6] = {rows * sizeof(float), cols * sizeof(float), row_parts * sizeof(double),
                             col_parts * sizeof(double), OPT_MAX_BLOCKS * sizeof(double), 2 * sizeof(double)};
    void** ptrs[6] = {(void**)&w->scale_row, (void**)&w->scale_col, (void**)&w->row_parts,
                      (void**)&w->col_parts, (void**)&w->partials, (void**)&w->sums};
    for (int k = 0; k < 6; k++) {
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

// the EMAs of the means, as cpu opt_ema_grad_sq_factored and opt_ema_col_means:
// R (rows) = ema(R, (row_parts summed over chunks) / cols), Cc (cols) = ema(Cc, (col_parts summed
// over the parts) / rows), scale_col (cols) = rsqrt(Cc); a thread per row, then one per column.
// bytes: 8 (chunks rows + parts cols) + 8 rows + 12 cols; FLOPs: chunks rows + parts cols + 4 (rows + cols)
static __global__ void factored_ema_kernel(float* R, float* Cc, float* scale_col, const double* row_parts, int chunks,
                                           const double* col_parts, int rows, int cols, OptEma e) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < rows) {
        double s = 0.0;
        for (int c = 0; c < chunks; c++) { s += row_parts[(size_t)c * rows + k]; }
        R[k] = opt_ema_device(R[k], (float)(s / cols), e);
    } else if (k < rows + cols) {
        int j = k - rows;
        double s = 0.0;
        for (int p = 0; p < FACTORED_ROW_PARTS; p++) { s += col_parts[(size_t)p * cols + j]; }
        Cc[j] = opt_ema_device(Cc[j], (float)(s / rows), e);
        scale_col[j] = opt_rsqrt_device(Cc[j]);
    }
}

// scale_row (rows) = rsqrt(R_i / mean(R)), mean(R) in double over R (rows), as cpu
// opt_factored_scales; one block (thread t adds rows t, t + blockDim, ...; the threads by a fixed tree).
// bytes: 12 rows; FLOPs: about 4 rows
static __global__ void factored_row_scales_kernel(float* scale_row, const float* R, int rows) {
    __shared__ float mean;
    double s = 0.0;
    for (int i = threadIdx.x; i < rows; i += blockDim.x) { s += R[i]; }
    double total = block_sum_double(s);
    if (threadIdx.x == 0) { mean = (float)(total / rows); }
    __syncthreads();
    for (int i = threadIdx.x; i < rows; i += blockDim.x) { scale_row[i] = opt_rsqrt_device(R[i] / mean); }
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

// the slice part must be the whole slice: ZeRO-1's sums across the ranks are not on the GPU yet
static void factored_check_unsharded(const OptShard* sh, const char* who) {
    if (sh->world != 1 || sh->sum != NULL || sh->gather != NULL) {
        fail("%s: a slice shared by %d processes; the GPU's Adafactor and CAME hold every slice whole\n"
             "  hint: ZeRO-1 on the GPU is issue 10; pass OPT_UNSHARDED", who, sh->world);
    }
}

// 16-byte loads and stores: every pointer aligned and every row a whole number of packs
static bool factored_vector(const void* a, const void* b, const void* c, int cols) {
    return is_aligned16(a) && is_aligned16(b) && (c == NULL || is_aligned16(c)) && cols % OPT_VEC == 0;
}

// blocks of a kernel that takes one row per block (grid-stride over the rows)
static int opt_row_blocks(int rows) { return rows < OPT_MAX_BLOCKS ? rows : OPT_MAX_BLOCKS; }

// ema(S_row, row means of X), ema(S_col, column means of X) for a matrix (rows, cols), then the
// scales of the factored rsqrt: w->scale_row = rsqrt(S_row / mean(S_row)), w->scale_col = rsqrt(S_col)
template <int STAT>
static void factored_stat_cuda(float* S_row, float* S_col, const FactoredArgs* a, int rows, int cols, OptEma e,
                               const FactoredScratch* w, cudaStream_t stream) {
    int chunks = factored_col_chunks(cols);
    bool vector = factored_vector(a->g, a->M, a->scale_col, cols);
    dim3 grid(chunks, FACTORED_ROW_PARTS);
    factored_sums_kernel<STAT><<<grid, opt_threads(cols), 0, stream>>>(w->row_parts, w->col_parts, *a, rows, cols, vector);
    CUDA_CHECK_LAUNCH();
    factored_ema_kernel<<<ceil_div(rows + cols, OPT_BLOCK), OPT_BLOCK, 0, stream>>>(S_row, S_col, w->scale_col, w->row_parts,
                                                                                    chunks, w->col_parts, rows, cols, e);
    CUDA_CHECK_LAUNCH();
    factored_row_scales_kernel<<<1, OPT_BLOCK, 0, stream>>>(w->scale_row, S_row, rows);
    CUDA_CHECK_LAUNCH();
}

// the second moment shared by Adafactor and CAME (cpu opt_second_moment): updates v (factored: R then
// Cc; vector: V) with g and fills w's scales so that U_ij = (scale_row_i scale_col_j) g_ij
static void second_moment_cuda(float* v, const float* g, const OptShard* sh, float eps1, OptEma e,
                               const FactoredScratch* w, cudaStream_t stream) {
    if (sh->factored) {
        FactoredArgs a;
        memset(&a, 0, sizeof(a));
        a.g = g;
        a.eps = eps1;
        factored_stat_cuda<STAT_GRAD_SQ>(v, v + sh->state_units, &a, sh->rows, sh->cols, e, w, stream);
        return;
    }
    second_moment_vector_kernel<<<ceil_div(sh->cols, OPT_BLOCK), OPT_BLOCK, 0, stream>>>(v, w->scale_col, g, sh->cols, eps1, e);
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

// one Adafactor step on one slice (rows, cols), held whole, as cpu adafactor_update: param and grad
// (rows, cols), state in the layout of opt_layout.h (factored: R, Cc [, M]; vector: V [, M]); t = 1, 2, ...;
// scratch: factored_scratch_bytes(sh) bytes
static void adafactor_update_cuda(float* param, const float* grad, float* state, const OptShard* sh,
                                  const AdafactorHyper* h, int t, void* scratch, cudaStream_t stream) {
    factored_check_unsharded(sh, "adafactor_update_cuda");
    FactoredScratch w;
    factored_scratch_carve((char*)scratch, sh, &w);
    int rows = sh->rows, cols = sh->cols;
    size_t n = (size_t)rows * cols;
    if (h->scale_parameter) { global_norm_squared_cuda(w.sums, param, n, w.partials, stream); }  // p before the step
    second_moment_cuda(state, grad, sh, (float)h->eps1, opt_ema_coeffs(adafactor_beta2(h, t)), &w, stream);
    clip_sum_cuda(w.sums + 1, grad, sh, &w, stream);
    float* M = h->beta1 > 0.0 ? state + adafactor_state_floats(sh, 0) : NULL;
    AdafactorStep st = {(float)adafactor_step_size(h, t), (float)h->eps2, h->scale_parameter, (float)h->clip_threshold,
                        h->weight_decay, opt_ema_coeffs(h->beta1)};
    bool vector = factored_vector(param, grad, M, cols) && is_aligned16(w.scale_col);
    adafactor_apply_kernel<<<opt_row_blocks(rows), opt_threads(cols), 0, stream>>>(
        param, grad, M, sh->factored ? w.scale_row : NULL, w.scale_col, rows, cols, w.sums, (double)sh->total, st, vector);
    CUDA_CHECK_LAUNCH();
}

#endif // CUDA_ADAFACTOR_CUH
