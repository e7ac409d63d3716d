/*
optimizers_lowp.h: the CPU optimizers on optimizer state in 8 bits or bf16 (llmc/quant_state.h):
AdamW with both moments in either format, and the first moment of Adafactor and CAME (beta1 > 0)
in either format beside their factored second moments, which stay fp32.

    QBlocks m = {m_codes, m_absmax}, v = {v_codes, v_absmax};   // zeroed memory: every moment 0
    size_t bad = adamw_update_8bit(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
    if (bad > 0) { fail("%s: %zu non-finite values in the optimizer state ...", tensor_name, bad); }
    QStateStream s = {seed_of_tensor, first_element_in_tensor};
    bad = adamw_update_bf16(params, grads, m_bf16, v_bf16, n, lr, beta1, beta2, eps, weight_decay, t, s);

Each update is cpu/optimizers.h's fp32 update on the dequantized state, the same operations in the
same order (AdamW through its adamw_element), with only the stored moments rounded: one step is bit
for bit "dequantize, the fp32 update, quantize", which tests/test_quant_state.c checks against a
reference of its own. The parameter update reads the new moments in fp32, before they are rounded
(as bitsandbytes' fused kernels do): the rounding error reaches the weights one step later, through
the EMA, scaled by beta.

8bit: one pass per block of QSTATE_BLOCK elements, the blocks split over the OpenMP threads: read the
codes, update the block's weights and moments in fp32, take the new absmax, write the codes (found
by cpu/quant_state_fast.h's table: qstate_quantize_block's bytes, without its binary search). The
blocks start at the first element of what is passed (a part of a tensor must start at a block
boundary of the tensor for the result not to depend on the cut). bf16: elementwise, the rounding
bits from (seed, step t, element index_base + i).

Failure: nothing stops here. Each update returns the count of non-finite values (NaN, Inf) among the
new moments, which the low-precision formats refuse to store as numbers (8bit: the block becomes
absmax NaN; bf16: NaN or Inf); the caller stops with a message naming the tensor (the fp32 state
would have carried the NaN into the weights silently). The results do not depend on the thread count.
*/
#ifndef CPU_OPTIMIZERS_LOWP_H
#define CPU_OPTIMIZERS_LOWP_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include "optimizers.h"
#include "../llmc/quant_state.h"
#include "quant_state_fast.h"

// [begin, begin + *len) is block b of n elements
static size_t lowp_block_range(size_t n, long long b, int* len) {
    size_t begin = (size_t)b * QSTATE_BLOCK;
    *len = (int)(n - begin < QSTATE_BLOCK ? n - begin : QSTATE_BLOCK);
    return begin;
}

// ----------------------------------------------------------------------------
// a first moment M (QMoment: llmc/quant_state.h) in 8 bits or bf16, read and written

// element k of M as fp32 (8bit: through the signed map f)
static inline float qmoment_get(const QMoment* M, const QFastMap* f, size_t k) {
    if (M->format == QSTATE_BF16) { return qstate_bf16_to_float(M->bf16[k]); }
    return qstate_dequantize_one(f->code, M->q.codes[k], M->q.absmax[k / QSTATE_BLOCK]);
}

// stores x (len values) as block b of M (8bit: quantized through f, qstate_quantize_block's bytes;
// bf16: rounded with step's bits); returns the count of non-finite values
static size_t qmoment_put_block(QMoment* M, const QFastMap* f, size_t b, const float* x, int len, uint32_t step) {
    size_t begin = b * QSTATE_BLOCK, bad = 0;
    if (M->format == QSTATE_8BIT) { return qfast_quantize_block(f, x, len, M->q.codes + begin, M->q.absmax + b); }
    for (int i = 0; i < len; i++) {
        bad += !isfinite(x[i]);
        uint64_t index = (uint64_t)(M->stream.index_base + begin + i);
        M->bf16[begin + i] = qstate_bf16_round(x[i], qstate_random16(M->stream.seed, step, QSTATE_STREAM_M, index));
    }
    return bad;
}

// ----------------------------------------------------------------------------
// AdamW: cpu/optimizers.h's adamw_update (its formula: adamw_element) on low-precision moments

// m: first moment (signed map), v: second moment (unsigned map), each (n) codes and
// (qstate_blocks(n)) absmax; returns the count of non-finite new moments
static size_t adamw_update_8bit(float* params, const float* grads, QBlocks m, QBlocks v, size_t n,
                                float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
    const QFastMaps* maps = qfast_maps();
    const QFastMap* ms = &maps->map[QMAP_SIGNED];
    const QFastMap* vs = &maps->map[QMAP_UNSIGNED];
    AdamWCoeffs s = adamw_coeffs(lr, beta1, beta2, eps, weight_decay, t);
    size_t bad = 0;
    #pragma omp parallel for reduction(+ : bad)
    for (long long b = 0; b < (long long)qstate_blocks(n); b++) {
        int len;
        size_t begin = lowp_block_range(n, b, &len);
        float mb[QSTATE_BLOCK], vb[QSTATE_BLOCK];  // the block's moments, fp32
        qfast_dequantize_block(ms, m.codes + begin, m.absmax[b], len, mb);
        qfast_dequantize_block(vs, v.codes + begin, v.absmax[b], len, vb);
        float* p = params + begin;
        const float* g = grads + begin;
        for (int k = 0; k < len; k++) { p[k] = adamw_element(p[k], g[k], &mb[k], &vb[k], &s); }  // vectorized by the compiler
        bad += qfast_quantize_block(ms, mb, len, m.codes + begin, m.absmax + b);
        bad += qfast_quantize_block(vs, vb, len, v.codes + begin, v.absmax + b);
    }
    return bad;
}

// m, v: (n) bf16 bits, rounded stochastically with stream s at step t; returns the count of
// non-finite new moments
static size_t adamw_update_bf16(float* params, const float* grads, uint16_t* m, uint16_t* v, size_t n,
                                float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                                QStateStream s) {
    AdamWCoeffs st = adamw_coeffs(lr, beta1, beta2, eps, weight_decay, t);
    size_t bad = 0;
    #pragma omp parallel for reduction(+ : bad)
    for (long long i = 0; i < (long long)n; i++) {
        float mi = qstate_bf16_to_float(m[i]), vi = qstate_bf16_to_float(v[i]);
        params[i] = adamw_element(params[i], grads[i], &mi, &vi, &st);
        bad += !isfinite(mi) + !isfinite(vi);
        uint32_t index_hash = qstate_index_hash((uint64_t)(s.index_base + (size_t)i));  // shared by m's and v's bits
        m[i] = qstate_bf16_round(mi, qstate_random16_of(index_hash, s.seed, (uint32_t)t, QSTATE_STREAM_M));
        v[i] = qstate_bf16_round(vi, qstate_random16_of(index_hash, s.seed, (uint32_t)t, QSTATE_STREAM_V));
    }
    return bad;
}

// ----------------------------------------------------------------------------
// Adafactor and CAME with the first moment M in 8 bits or bf16 (QMoment); their second moments
// (`second`: opt_layout.h's layout of the slice part's state without M) stay fp32 and go through
// cpu/optimizers.h's own functions. Returns the count of non-finite values of the new M.

// one Adafactor step with beta1 > 0 (steps 1-7 of cpu/optimizers.h): second = R, Cc (a matrix) or V
static size_t adafactor_update_lowp(float* param, const float* grad, float* second, QMoment* M, const OptShard* sh,
                                    const AdafactorHyper* h, int t) {
    const QFastMap* map = &qfast_maps()->map[QMAP_SIGNED];
    size_t n = (size_t)sh->rows * sh->cols, bad = 0;
    int cols = sh->cols;
    float lr = adafactor_lr(param, n, sh, h, t);
    OptWorkspace w = opt_workspace_alloc(sh);
    opt_second_moment(second, grad, sh, (float)h->eps1, opt_ema_coeffs(adafactor_beta2(h, t)), &w);
    float clip = opt_clip_divisor(grad, &w, sh, (float)h->clip_threshold);
    OptEma e1 = opt_ema_coeffs(h->beta1);
    float decay = (float)(-h->weight_decay * lr);
    // adafactor_update's last loop, one block of M at a time
    #pragma omp parallel for reduction(+ : bad)
    for (long long b = 0; b < (long long)qstate_blocks(n); b++) {
        int len;
        size_t begin = lowp_block_range(n, b, &len);
        float mb[QSTATE_BLOCK];
        for (int c = 0; c < len; c++) {
            size_t k = begin + (size_t)c;
            size_t i = k / cols, j = k % cols;
            float u = (w.scale_row[i] * w.scale_col[j]) * grad[k] / clip * lr;
            mb[c] = opt_ema(qmoment_get(M, map, k), u, e1);
            if (h->weight_decay != 0.0) { param[k] += decay * param[k]; }
            param[k] -= mb[c];
        }
        bad += qmoment_put_block(M, map, (size_t)b, mb, len, (uint32_t)t);
    }
    opt_workspace_free(&w);
    return bad;
}

// CAME's steps 4-5 of a matrix (cpu came_moment_and_residual) with M read, not written: the new
// M_ij = ema(M_ij, U_ij) feeds the residual (U - M)^2 + eps2, whose row and column means update Rr
// and Rc; came_update_lowp's last pass computes the same new M again (the same operations on the
// same stored M: the same bits) and stores it, so M is written once, a block at a time
static void came_residual_lowp(const QMoment* M, const QFastMap* map, float* Rr, float* Rc, const float* g,
                               const OptShard* sh, float clip, const CAMEHyper* h, OptWorkspace* w) {
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
                float m = opt_ema(qmoment_get(M, map, k), u, e1);
                float d = u - m;
                float res = d * d + eps2;
                row_sum += res;
                col_sum[j] += res;
            }
            w->row_sum[i] = row_sum;
        }
    }
    opt_sum_tp(sh, sh->tp_cols, w->row_sum, (size_t)sh->rows);  // --tp: the group's columns of a row-parallel matrix
    for (int i = 0; i < sh->rows; i++) { Rr[i] = opt_ema(Rr[i], (float)(w->row_sum[i] / sh->total_cols), e3); }
    opt_ema_col_means(Rc, w, sh, e3);
}

// one CAME step (cpu came_update): second = R, Cc, Rr, Rc (a matrix) or V (a vector); t = 1, 2, ...
// (CAME itself has no step count: t only draws bf16's rounding bits)
static size_t came_update_lowp(float* param, const float* grad, float* second, QMoment* M, const OptShard* sh,
                               const CAMEHyper* h, int t) {
    const QFastMap* map = &qfast_maps()->map[QMAP_SIGNED];
    size_t n = (size_t)sh->rows * sh->cols, bad = 0;
    int cols = sh->cols;
    OptWorkspace w = opt_workspace_alloc(sh);
    opt_second_moment(second, grad, sh, (float)h->eps1, opt_ema_coeffs(h->beta2), &w);
    float clip = opt_clip_divisor(grad, &w, sh, (float)h->clip_threshold);
    // U's scales, kept for the last pass: a matrix's confidence factor replaces them in w
    int rows1 = sh->rows > 1 ? sh->rows : 1;
    float* u_row = (float*)malloc_check((size_t)rows1 * sizeof(float));
    float* u_col = (float*)malloc_check((size_t)(cols > 0 ? cols : 1) * sizeof(float));
    memcpy(u_row, w.scale_row, (size_t)rows1 * sizeof(float));
    memcpy(u_col, w.scale_col, (size_t)cols * sizeof(float));
    if (sh->factored) {
        float* Rr = second + sh->state_units + sh->col_units;
        float* Rc = Rr + sh->state_units;  // this process's columns
        came_residual_lowp(M, map, Rr, Rc, grad, sh, clip, h, &w);
        opt_factored_scales(w.scale_row, w.scale_col, Rr, w.col_full, sh);  // the confidence factor
    } else {
        for (int j = 0; j < cols; j++) { w.scale_col[j] = 1.0f; }  // a vector's update is M itself
    }
    OptEma e1 = opt_ema_coeffs(h->beta1);
    float decay = (float)(-h->weight_decay * h->lr), lr = (float)h->lr;
    #pragma omp parallel for reduction(+ : bad)
    for (long long b = 0; b < (long long)qstate_blocks(n); b++) {
        int len;
        size_t begin = lowp_block_range(n, b, &len);
        float mb[QSTATE_BLOCK];
        for (int c = 0; c < len; c++) {
            size_t k = begin + (size_t)c;
            size_t i = k / cols, j = k % cols;
            // U as came_moment_and_residual (a matrix) or came_moment_vector (a vector) computes it
            float u = sh->factored ? (u_row[i] * u_col[j]) * grad[k] / clip : u_col[j] * grad[k] / clip;
            mb[c] = opt_ema(qmoment_get(M, map, k), u, e1);
            if (h->weight_decay != 0.0) { param[k] += decay * param[k]; }
            param[k] -= (w.scale_row[i] * w.scale_col[j]) * mb[c] * lr;
        }
        bad += qmoment_put_block(M, map, (size_t)b, mb, len, (uint32_t)t);
    }
    free(u_row);
    free(u_col);
    opt_workspace_free(&w);
    return bad;
}

// ----------------------------------------------------------------------------
// one slice part in the state block (llmc/opt_layout.h's layout, moments in sh->format, bf16 or 8bit):
// AdamW's m, v; Adafactor's R, Cc | V, then M; CAME's M, then R, Cc, Rr, Rc | V. stream: bf16's rounding
// bits (the slice's seed, the part's first element in the slice). Returns the count of refused moments

static size_t lowp_update_part(OptimizerKind kind, float* param, const float* grad, float* state, const OptShard* sh,
                               const OptimizerHyper* h, int is_matrix_tensor, int t, QStateStream stream) {
    size_t n = (size_t)sh->rows * sh->cols, units = sh->state_units * sh->width;
    if (kind == OPT_ADAMW) {
        const AdamWHyper* a = &h->adamw;
        double wd = is_matrix_tensor ? a->weight_decay : 0.0;  // as adamw_update_part
        QMoment m = qmoment_at(state, sh->format, units, stream);
        QMoment v = qmoment_at(state + opt_moment_floats(sh), sh->format, units, stream);
        if (sh->format == QSTATE_8BIT) {
            return adamw_update_8bit(param, grad, m.q, v.q, n, (float)a->lr, (float)a->beta1, (float)a->beta2, (float)a->eps, (float)wd, t);
        }
        return adamw_update_bf16(param, grad, m.bf16, v.bf16, n, (float)a->lr, (float)a->beta1, (float)a->beta2, (float)a->eps,
                                 (float)wd, t, stream);
    }
    if (kind == OPT_ADAFACTOR) {  // beta1 > 0: the trainer refuses a low-precision format without a first moment
        QMoment M = qmoment_at(state + adafactor_state_floats(sh, 0), sh->format, units, stream);
        return adafactor_update_lowp(param, grad, state, &M, sh, &h->adafactor, t);
    }
    QMoment M = qmoment_at(state, sh->format, units, stream);
    return came_update_lowp(param, grad, state + opt_moment_floats(sh), &M, sh, &h->came, t);
}

#endif // CPU_OPTIMIZERS_LOWP_H
