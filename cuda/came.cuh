/*
came.cuh: the CAME update on the device (confidence-guided Adafactor), mirroring came_update of
cpu/optimizers.h, for a slice held whole or, under ZeRO-1, for this rank's part of it. The factored
second moment, the clip divisor, the sums across the ranks and the scratch are Adafactor's
(adafactor.cuh): CAME adds the first moment and the factored EMA of the residual (U - M)^2, whose
scales replace U's.

    void* scratch;  // factored_model_scratch_bytes(&cfg) bytes (or factored_scratch_bytes(&sh), one slice)
    came_update_cuda(param, grad, state, &sh, &h, scratch, comms, stream);   // no step count: no bias correction; comms: adafactor.cuh's

Invariants: those of adafactor.cuh: fp32 parameters, gradients and state in opt_layout.h's layout
(M, R, Cc, Rr, Rc for a matrix; M, V for a vector; under ZeRO-1 this rank's rows and its block of
Cc's and Rc's columns), the CPU's order of operations and roundings, sums in double over partitions
fixed by the shape (bitwise the same run after run), the statistics in device memory, the ranks'
sums added by NCCL on the stream. Launches per slice: a matrix 9 kernels, a vector 4; ZeRO-1 adds
NCCL calls: 5 for a matrix (each factored statistic's all-reduce and gather, the all-reduce of the
sum of U^2 between them), 1 for a vector. Failure: a sharded slice without a communicator stops
with a message.
*/
#ifndef CUDA_CAME_CUH
#define CUDA_CAME_CUH

#include "adafactor.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

// what one CAME step applies, beside the slice's statistics (in device memory)
typedef struct {
    float lr;
    float decay;           // -weight_decay lr, rounded once (cpu came_update's)
    int weight_decay;      // 1: p += decay p before the step
    float clip_threshold;
    OptEma e1;             // the first moment's EMA; a vector's is updated here
} CAMEStep;

// the update, as cpu came_update's last loop (and, for a vector, came_moment_vector before it):
//   matrix (scale_row given): p += decay p; p -= ((scale_row_i scale_col_j) M_ij) lr   (the confidence factor)
//   vector (scale_row NULL):  M = ema(M, scale_col_j g_j / clip); p += decay p; p -= M lr
// sum_u2: the sum of U^2 (the vector's clip divisor). Block b takes rows b, b + gridDim.x, ..., its
// threads 4 columns at a time. bytes: 12 rows cols (p, M read, p written) [+ 8 n: g read, M
// written, a vector]; FLOPs: about 5 rows cols
static __global__ void came_apply_kernel(float* param, const float* grad, float* M, const float* scale_row,
                                         const float* scale_col, int rows, int cols, const double* sum_u2, double total,
                                         CAMEStep st, bool vector) {
    bool moment = scale_row == NULL;
    float clip = moment ? clip_divisor(*sum_u2, total, st.clip_threshold) : 1.0f;
    for (int i = blockIdx.x; i < rows; i += gridDim.x) {
        size_t row = (size_t)i * cols;
        for (int j0 = threadIdx.x * OPT_VEC; j0 < cols; j0 += blockDim.x * OPT_VEC) {
            Packed128<float> p = load_pack(param + row, j0, cols, vector), m = load_pack(M + row, j0, cols, vector);
            Packed128<float> sc = load_pack(scale_col, j0, cols, vector);
            Packed128<float> g = moment ? load_pack(grad + row, j0, cols, vector) : Packed128<float>::zeros();
            for (int k = 0; k < OPT_VEC; k++) {
                float update;
                if (moment) {
                    m[k] = opt_ema_device(m[k], __fmul_rn(sc[k], g[k]) / clip, st.e1);
                    update = m[k];  // scales of 1
                } else {
                    update = scaled_grad(scale_row, i, sc[k], m[k]);
                }
                if (st.weight_decay) { p[k] = __fadd_rn(p[k], __fmul_rn(st.decay, p[k])); }
                p[k] = __fadd_rn(p[k], -__fmul_rn(update, st.lr));
            }
            store_pack(param + row, j0, cols, vector, p);
            if (moment) { store_pack(M + row, j0, cols, vector, m); }
        }
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// one CAME step on a slice part sh (rows, cols), the whole slice or this rank's ZeRO-1 part, as cpu
// came_update: param and grad (rows, cols), state in the layout of opt_layout.h; scratch:
// factored_scratch_bytes(sh) bytes; comm: the ranks that share the slice (unused when sh->world is 1).
// Steps (cpu/optimizers.h): 1-2 the second moment and U's scales, 3 the clip divisor's sum (over the
// whole slice before the residual reads it), then a matrix's 4-5 (ema(M, U) and the residual's EMAs,
// whose scales replace U's) in one pass, and 6-7 the update (a vector's 4 with it). came_update_m_cuda
// takes the first moment M (rows, cols) wherever the caller keeps it and v the rest of the state
// (factored: R, Cc, Rr, Rc; vector: V): cuda/factored_lowp.cuh passes an fp32 copy of an 8-bit or
// bf16 M; came_update_cuda finds both in the state, M first
static void came_update_m_cuda(float* param, const float* grad, float* M, float* v, const OptShard* sh, const CAMEHyper* h,
                               void* scratch, OptComms comms, cudaStream_t stream) {
    factored_check_comm(sh, comms, "came_update_cuda");
    FactoredScratch w;
    factored_scratch_carve((char*)scratch, sh, &w);
    int rows = sh->rows, cols = sh->cols;
    second_moment_cuda(v, grad, sh, (float)h->eps1, opt_ema_coeffs(h->beta2), &w, comms, stream);
    clip_sum_cuda(w.sums + 1, grad, sh, &w, stream);
    opt_sum_across_cuda(w.sums + 1, 1, sh, comms, stream);
    opt_sum_tp_cuda(w.sums + 1, 1, sh->tp_rows || sh->tp_cols, comms, stream);  // --tp: the group's parts
    if (sh->factored) {
        float* Rr = v + sh->state_units + sh->col_units;
        float* Rc = Rr + sh->state_units;  // this part's block of columns
        FactoredArgs a = {grad, (float)h->eps2, M, w.scale_row, w.scale_col, w.sums + 1, (double)sh->total,
                          (float)h->clip_threshold, opt_ema_coeffs(h->beta1)};
        factored_stat_cuda<STAT_CAME_RESIDUAL>(Rr, Rc, &a, sh, opt_ema_coeffs(h->beta3), &w, comms, stream);
    }
    CAMEStep st = {(float)h->lr, (float)(-h->weight_decay * h->lr), h->weight_decay != 0.0, (float)h->clip_threshold,
                   opt_ema_coeffs(h->beta1)};
    bool vector = factored_vector(param, M, grad, cols) && is_aligned16(w.scale_col);
    came_apply_kernel<<<opt_row_blocks(rows), opt_threads(cols), 0, stream>>>(
        param, grad, M, sh->factored ? w.scale_row : NULL, w.scale_col, rows, cols, w.sums + 1, (double)sh->total, st, vector);
    CUDA_CHECK_LAUNCH();
}

static void came_update_cuda(float* param, const float* grad, float* state, const OptShard* sh, const CAMEHyper* h,
                             void* scratch, OptComms comms, cudaStream_t stream) {
    came_update_m_cuda(param, grad, state, state + sh->state_units * sh->width, sh, h, scratch, comms, stream);
}

#endif // CUDA_CAME_CUH
