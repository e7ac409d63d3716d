/*
matmul.cuh: the linear layer on the device through cuBLASLt, mirroring matmul_forward/backward of
cpu/layers.h, and matmul_lt, the one GEMM call the backend's other files (attention) use too.

    MatmulContext mm;
    matmul_context_init(&mm, NULL, 0);   // a cuBLASLt handle and its own 32 MiB workspace
    matmul_forward_cuda<floatX>(out, inp, weight, bias, B, T, C, OC, &mm, stream);         // out =
    float* scratch;  // matmul_backward_scratch_floats(B, T, OC) floats, contents not kept
    matmul_backward_cuda<floatX>(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC, scratch, &mm, stream);
                                                  // dinp +=, dweight += (fp32), dbias += (fp32)
    matmul_context_free(&mm);

Invariants: every GEMM accumulates in fp32 (CUBLAS_COMPUTE_32F: no TF32 in fp32 mode); bf16 results
are rounded once when stored. Row-major (rows, cols) is cuBLAS's column-major (cols, rows), so
out (BT,OC) = inp (BT,C) @ weight (OC,C)^T is, column-major, out^T (OC,BT) = op_T(weight) @ inp^T.
The bias is added by the BIAS epilogue (only the bias pointer set: cuBLASLt refuses pointers an
epilogue does not use). The bias gradient is this file's kernel, not BGRADB: cuBLASLt writes (=)
where the backward must add (+=), and the kernel sums in a fixed order. The weight gradient is
a GEMM with bf16 (or fp32) inputs and an fp32 output accumulated with beta = 1. cuBLASLt is
told each pointer's real alignment, so buffers carved at any offset are safe.
*/
#ifndef CUDA_MATMUL_CUH
#define CUDA_MATMUL_CUH

#include "common.cuh"

#define MATMUL_WORKSPACE_BYTES (32u << 20)  // cuBLASLt's workspace, as NVIDIA recommends for Hopper
#define MATMUL_BIAS_ROWS 128                 // rows per block of the bias gradient: the fixed partition of its sums
#define MATMUL_BIAS_WARPS 8                  // warps per block of the bias gradient, each taking every 8th row

typedef struct {
    cublasLtHandle_t lt;
    void* workspace;         // device memory cuBLASLt may use during a matmul
    size_t workspace_bytes;
    int owns_workspace;      // allocated by matmul_context_init (and freed by matmul_context_free)
} MatmulContext;

// a handle and a workspace: the caller's (workspace_bytes of device memory, e.g. from its
// accounting allocator), or when workspace is NULL, MATMUL_WORKSPACE_BYTES allocated here
static void matmul_context_init(MatmulContext* ctx, void* workspace, size_t workspace_bytes) {
    CUBLAS_CHECK(cublasLtCreate(&ctx->lt));
    ctx->owns_workspace = workspace == NULL;
    if (workspace == NULL) {
        workspace_bytes = MATMUL_WORKSPACE_BYTES;
        CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
    }
    ctx->workspace = workspace;
    ctx->workspace_bytes = workspace_bytes;
}

static void matmul_context_free(MatmulContext* ctx) {
    if (ctx->owns_workspace) { CUDA_CHECK(cudaFree(ctx->workspace)); }
    CUBLAS_CHECK(cublasLtDestroy(ctx->lt));
    ctx->workspace = NULL;
}

template <typename T> inline cudaDataType cuda_data_type();
template <> inline cudaDataType cuda_data_type<float>() { return CUDA_R_32F; }
template <> inline cudaDataType cuda_data_type<__nv_bfloat16>() { return CUDA_R_16BF; }

// the largest power of two (up to 256) that divides p's address: what cuBLASLt may assume of it
static uint32_t pointer_alignment(const void* p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a != 0) { a /= 2; }
    return a;
}

// ----------------------------------------------------------------------------
// the GEMM: column-major D (m,n) = alpha op(A) (m,k) op(B) (k,n) + beta D, batch times with the given
// strides (elements), A and B of ab_type, D of d_type (so fp32 gradients from bf16 inputs), fp32
// accumulation; bias (m, d_type) added by the BIAS epilogue when not NULL. FLOPs: 2 m n k batch

static void matmul_lt(const MatmulContext* ctx, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                      const void* A, int lda, long long stride_a, const void* B, int ldb, long long stride_b,
                      float beta, void* D, int ldd, long long stride_d, int batch, cudaDataType ab_type,
                      cudaDataType d_type, const void* bias, cudaStream_t stream) {
    if (m == 0 || n == 0 || batch == 0) { return; }
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (bias != NULL) {
        cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, ab_type, trans_a ? k : m, trans_a ? m : k, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, ab_type, trans_b ? n : k, trans_b ? k : n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, d_type, m, n, ldd));
    if (batch > 1) {
        const cublasLtMatrixLayout_t layouts[3] = {la, lb, ld};
        const long long strides[3] = {stride_a, stride_b, stride_d};
        for (int i = 0; i < 3; i++) {
            int32_t count = batch;
            int64_t stride = strides[i];
            CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
            CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                          &stride, sizeof stride));
        }
    }
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = ctx->workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const void* ptrs[4] = {A, B, D, D};
    for (int i = 0; i < 4; i++) {
        uint32_t a = pointer_alignment(ptrs[i]);
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &a, sizeof a));
    }
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx->lt, desc, la, lb, ld, ld, pref, 1, &heuristic, &found));
    if (found == 0) {
        fail("cuBLASLt has no algorithm for op(A)=%c op(B)=%c m=%d n=%d k=%d batch=%d lda=%d ldb=%d ldd=%d%s\n"
             "  hint: check the types and leading dimensions; odd sizes of bf16 matrices limit the algorithms",
             trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, batch, lda, ldb, ldd, bias ? " (bias epilogue)" : "");
    }
    CUBLAS_CHECK(cublasLtMatmul(ctx->lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &heuristic.algo,
                                ctx->workspace, ctx->workspace_bytes, stream));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
}

// ----------------------------------------------------------------------------
// CUDA kernels

// partials (row blocks, OC) = column sums of dout (BT,OC) over each block of MATMUL_BIAS_ROWS rows.
// A thread sums a pack of columns over rows ty, ty + MATMUL_BIAS_WARPS, ... of its block, in order;
// the warps' sums are then added in warp order. bytes: BT*OC floatX + (BT/MATMUL_BIAS_ROWS)*OC fp32;
// FLOPs: BT*OC adds
template <typename floatX>
__global__ void matmul_bias_partials_kernel(float* partials, const floatX* dout, int BT, int OC, bool vector) {
    const int VEC = Packed128<floatX>::size;
    __shared__ float sums[MATMUL_BIAS_WARPS][WARP_SIZE * Packed128<floatX>::size];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = (blockIdx.x * WARP_SIZE + tx) * VEC;
    int row_end = min(BT, (int)(blockIdx.y + 1) * MATMUL_BIAS_ROWS);
    float acc[Packed128<floatX>::size];
    for (int k = 0; k < VEC; k++) { acc[k] = 0.0f; }
    if (c < OC) {
        for (int row = blockIdx.y * MATMUL_BIAS_ROWS + ty; row < row_end; row += MATMUL_BIAS_WARPS) {
            Packed128<floatX> d = load_pack(dout + (size_t)row * OC, c, OC, vector);
            for (int k = 0; k < VEC; k++) { acc[k] += to_float(d[k]); }
        }
    }
    for (int k = 0; k < VEC; k++) { sums[ty][tx * VEC + k] = acc[k]; }
    __syncthreads();
    if (ty != 0 || c >= OC) { return; }
    for (int k = 0; k < VEC && c + k < OC; k++) {
        float s = 0.0f;
        for (int w = 0; w < MATMUL_BIAS_WARPS; w++) { s += sums[w][tx * VEC + k]; }
        partials[(size_t)blockIdx.y * OC + c + k] = s;
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC); bias may be NULL
template <typename floatX>
void matmul_forward_cuda(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int B, int T, int C,
                         int OC, const MatmulContext* ctx, cudaStream_t stream) {
    cudaDataType type = cuda_data_type<floatX>();
    matmul_lt(ctx, true, false, OC, B * T, C, 1.0f, weight, C, 0, inp, C, 0, 0.0f, out, OC, 0, 1, type, type, bias,
              stream);
}

// the scratch matmul_backward_cuda needs (for the bias gradient): OC floats per MATMUL_BIAS_ROWS rows
static size_t matmul_backward_scratch_floats(int B, int T, int OC) {
    return (size_t)ceil_div(B * T, MATMUL_BIAS_ROWS) * OC;
}

// dinp (B,T,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += sum of dout;
// dweight and dbias fp32; dinp may be NULL (nothing upstream needs it), dbias may be NULL (no bias);
// scratch: matmul_backward_scratch_floats(B, T, OC) floats (unused when dbias is NULL)
template <typename floatX>
void matmul_backward_cuda(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                          const floatX* weight, int B, int T, int C, int OC, float* scratch, const MatmulContext* ctx,
                          cudaStream_t stream) {
    int BT = B * T;
    cudaDataType type = cuda_data_type<floatX>();
    // column-major: dinp^T (C,BT) += weight^T (C,OC) @ dout^T (OC,BT)
    if (dinp != NULL) {
        matmul_lt(ctx, false, false, C, BT, OC, 1.0f, weight, C, 0, dout, OC, 0, 1.0f, dinp, C, 0, 1, type, type, NULL,
                  stream);
    }
    // column-major: dweight^T (C,OC) += inp^T (C,BT) @ dout (BT,OC), into fp32
    matmul_lt(ctx, false, true, C, OC, BT, 1.0f, inp, C, 0, dout, OC, 0, 1.0f, dweight, C, 0, 1, type, CUDA_R_32F, NULL,
              stream);
    if (dbias == NULL || BT == 0 || OC == 0) { return; }
    const int VEC = Packed128<floatX>::size;
    bool vector = OC % VEC == 0 && is_aligned16(dout);
    int row_blocks = ceil_div(BT, MATMUL_BIAS_ROWS);
    dim3 grid(ceil_div(OC, WARP_SIZE * VEC), row_blocks), block(WARP_SIZE, MATMUL_BIAS_WARPS);
    matmul_bias_partials_kernel<floatX><<<grid, block, 0, stream>>>(scratch, dout, BT, OC, vector);
    CUDA_CHECK_LAUNCH();
    add_partial_sums_cuda(dbias, scratch, row_blocks, OC, OC, stream);
}

#endif // CUDA_MATMUL_CUH
