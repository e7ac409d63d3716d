/*
factored_lowp.cuh: Adafactor (beta1 > 0) and CAME on the device with the first moment M in 8 bits or
bf16 (llmc/quant_state.h's QMoment, device pointers), their second moments fp32: the counterparts of
adafactor_update_lowp and came_update_lowp of cpu/optimizers_lowp.h.

    FactoredLowp lp = {d_maps, d_bad, m_staging};   // m_staging: the largest slice part's n floats
    adafactor_update_lowp_cuda(param, grad, second, &M, &sh, &h, t, scratch, comms, &lp, stream);
    came_update_lowp_cuda(param, grad, second, &M, &sh, &h, t, scratch, comms, &lp, stream);

Staged, not fused: M is read into an fp32 copy (m_staging), the fp32 update of adafactor.cuh or
came.cuh runs on it (adafactor_update_m_cuda, came_update_m_cuda: the same kernels, the same
results), and the copy is stored back (8bit: qstate_quantize_cuda, a warp per block; bf16: rounded
with stream QSTATE_STREAM_M of M.stream at step t). So a step equals, bit for bit, the fp32 device
update on the dequantized M, then quantized as cpu/optimizers_lowp.h quantizes
(dev/cuda/test_optimizer_lowp.cu checks it). The fp32 device update itself agrees with the CPU's
to double rounding (adafactor.cuh), so the two backends' M may differ by a code where a value
lands within that rounding of a threshold. The cost of staging: the scratch, 4 bytes per element of
the largest slice part (d12's wte: 154 MB beside 124 MB for every M in 8 bits), and 2 more passes
over M; a fused kernel (M read in the residual pass, stored in the update) is left for later.

`second`: the slice part's state in opt_layout.h's layout without M (Adafactor: R, Cc or V; CAME:
R, Cc, Rr, Rc or V). Failure: refused values (NaN, Inf in the new M) are added to *lp->refused; a
sharded slice without a communicator stops (adafactor.cuh).
*/
#ifndef CUDA_FACTORED_LOWP_CUH
#define CUDA_FACTORED_LOWP_CUH

#include "adafactor.cuh"
#include "came.cuh"
#include "adamw_lowp.cuh"

// what the low-precision factored updates need beside the fp32 update's arguments
typedef struct {
    const QStateMaps* maps;        // qstate_maps_upload()
    unsigned long long* refused;   // device counter of refused values (the caller zeroes and reads it)
    float* m_staging;              // (n) device floats: the slice part's M in fp32 during the update
} FactoredLowp;

// lp->m_staging (n) = the values of M
static void qmoment_load_cuda(const QMoment* M, size_t n, const FactoredLowp* lp, cudaStream_t stream) {
    if (M->format == QSTATE_BF16) {
        qstate_bf16_load_cuda(lp->m_staging, M->bf16, n, stream);
    } else {
        qstate_dequantize_cuda(lp->m_staging, M->q.codes, M->q.absmax, n, QMAP_SIGNED, lp->maps, stream);
    }
}

// M = lp->m_staging (n) in M's format; t draws bf16's rounding bits
static void qmoment_store_cuda(QMoment* M, size_t n, int t, const FactoredLowp* lp, cudaStream_t stream) {
    if (M->format == QSTATE_BF16) {
        qstate_bf16_store_cuda(M->bf16, lp->m_staging, n, M->stream, t, QSTATE_STREAM_M, lp->refused, stream);
    } else {
        qstate_quantize_cuda(M->q.codes, M->q.absmax, lp->m_staging, n, QMAP_SIGNED, lp->maps, lp->refused, stream);
    }
}

// one Adafactor step (beta1 > 0) on slice part sh, as adafactor_update_cuda, with M in 8 bits or bf16
static void adafactor_update_lowp_cuda(float* param, const float* grad, float* second, QMoment* M, const OptShard* sh,
                                       const AdafactorHyper* h, int t, void* scratch, OptComms comms,
                                       const FactoredLowp* lp, cudaStream_t stream) {
    size_t n = (size_t)sh->rows * sh->cols;
    qmoment_load_cuda(M, n, lp, stream);
    adafactor_update_m_cuda(param, grad, second, lp->m_staging, sh, h, t, scratch, comms, stream);
    qmoment_store_cuda(M, n, t, lp, stream);
}

// one CAME step on slice part sh, as came_update_cuda, with M in 8 bits or bf16; t = 1, 2, ... draws
// bf16's rounding bits only (CAME has no step count)
static void came_update_lowp_cuda(float* param, const float* grad, float* second, QMoment* M, const OptShard* sh,
                                  const CAMEHyper* h, int t, void* scratch, OptComms comms, const FactoredLowp* lp,
                                  cudaStream_t stream) {
    size_t n = (size_t)sh->rows * sh->cols;
    qmoment_load_cuda(M, n, lp, stream);
    came_update_m_cuda(param, grad, lp->m_staging, second, sh, h, scratch, comms, stream);
    qmoment_store_cuda(M, n, t, lp, stream);
}

#endif // CUDA_FACTORED_LOWP_CUH
