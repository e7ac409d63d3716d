/*
emu_blas.cpp: cuBLAS and cuBLASLt on the emulated device. Every GEMM entry point fills one
gemm_problem and queues reference_gemm() on its stream; reference_gemm is the cuBLAS definition,
column-major, with the sums of its plain loop (computed a tile of outputs at a time, bit for bit
the same: see "the sums, tile by tile" below):

    D[i,j] = epilogue(alpha * sum_l op(A)[i,l] * op(B)[l,j] + beta * C[i,j])   i < m, j < n, l < k
    op(X)[r,c] = X[r + c*ldX]  (CUBLAS_OP_N)   or   X[c + r*ldX]  (CUBLAS_OP_T / _C, real types)

  - the sum accumulates in fp32, in order l = 0, 1, ..., k-1, each product rounded to fp32 before
    it is added (CUBLAS_COMPUTE_32F; the TF32 and 16BF "fast" compute types are computed the same,
    exactly);
  - beta == 0 means C is not read at all (it may hold NaNs), as the documentation promises;
  - elements are loaded as fp32 from fp32, bf16 or fp16 and stored rounded to nearest-even;
  - batches: matrix b starts at X + b * strideX elements.

cuBLASLt epilogues, as cublasLt.h documents them (D has m rows and n columns):
    BIAS         x += bias[i]                 bias has m elements (rows of D), added before GELU
    GELU         x = gelu(x)                  the tanh approximation, as the CPU computes it (cpu/gelu.h)
    ..._AUX      aux[i + j*aux_ld] = x        the GELU input (after the bias), before GELU
    DGELU        x *= gelu'(aux[i + j*aux_ld])
    DGELU_BGRAD  and bias[i] = sum_j x        the bias gradient of the DGELU output
    BGRADA       bias[i] = sum_l op(A)[i,l]   m elements, reduced over the GEMM's k
    BGRADB       bias[j] = sum_l op(B)[l,j]   n elements (columns of D), reduced over k
The bias (and bias gradient) and aux types default to D's type, as in cuBLASLt.

Scalars alpha and beta are read when the call is made (host pointer mode semantics).

Alignment, as cublasLt.h states it: the heuristic chooses an algorithm for operands A, B, C and D
aligned as the preference says (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, default 256), and an
algorithm "will fail if buffers are not correctly aligned"; so cublasLtMatmul refuses an operand
below the alignment its algorithm was chosen for (a NULL algorithm: the default preference's 256),
and a workspace that is not 256-byte aligned (emu_lt_rules.cpp, rules 8 and 9).
*/
#include "emu_internal.h"
#include "../../cpu/gelu.h"   // gelu_elem, gelu_grad_elem: the CPU's GELU, so a fused GEMM + GELU gives what the CPU does

#include <vector>

struct cublasContext {
    cudaStream_t stream;
    cublasPointerMode_t pointer_mode;
};

struct cublasLtContext {
    int unused;
};

// ----------------------------------------------------------------------------
// elements

static bool supported_type(cudaDataType t) {
    return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F;
}

static float load(const void* p, cudaDataType t, int64_t i) {
    switch (t) {
        case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16*)p)[i]);
        case CUDA_R_16F: return __half2float(((const __half*)p)[i]);
        default: return ((const float*)p)[i];
    }
}

static void store(void* p, cudaDataType t, int64_t i, float v) {
    switch (t) {
        case CUDA_R_16BF: ((__nv_bfloat16*)p)[i] = __float2bfloat16(v); break;
        case CUDA_R_16F: ((__half*)p)[i] = __float2half(v); break;
        default: ((float*)p)[i] = v; break;
    }
}

// ----------------------------------------------------------------------------
// the reference GEMM

struct matrix {
    const void* data;
    cudaDataType type;
    int64_t ld;
    int64_t batch_stride;   // elements between consecutive matrices of a batch
};

enum bias_grad_source { BIAS_GRAD_NONE, BIAS_GRAD_FROM_A, BIAS_GRAD_FROM_B, BIAS_GRAD_FROM_D };

struct epilogue_plan {
    bool add_bias;
    bool relu;
    bool gelu;
    bool store_aux;          // the GELU input goes to aux
    bool dgelu;              // multiply by gelu'(aux)
    bias_grad_source bias_grad;
};

struct gemm_problem {
    cublasOperation_t transa, transb;
    int m, n, k, batch;
    float alpha, beta;
    matrix A, B, C, D;
    epilogue_plan epilogue;
    void* bias;             // bias (read) or bias gradient (written)
    cudaDataType bias_type;
    int64_t bias_batch_stride;
    void* aux;
    cudaDataType aux_type;
    int64_t aux_ld, aux_batch_stride;
};

// op(X)[r, c] of batch b
static float element(const matrix& x, cublasOperation_t op, int b, int r, int c) {
    int64_t at = (op == CUBLAS_OP_N) ? r + c * x.ld : c + r * x.ld;
    return load(x.data, x.type, b * x.batch_stride + at);
}

// ----------------------------------------------------------------------------
// the sums, tile by tile
//
// D is computed in tiles of GEMM_TILE_ROWS x GEMM_TILE_COLS outputs. op(A) is first packed into
// fp32 panels of GEMM_TILE_ROWS rows (for each l, the panel's rows side by side), op(B) into panels
// of GEMM_TILE_COLS columns, so a tile's sums read two contiguous panels and advance a whole column
// of the tile per vector instruction. Each output still sums its products in order l = 0..k-1, each
// product rounded to fp32 before it is added (emu.mk builds with -ffp-contract=off: no fused
// multiply-add), so every D[i,j] is bitwise what the plain loop of the definition gives.
// Packing costs (m + n) * k loads next to m * n * k products, and (m + n) * k floats of memory.

enum {
    GEMM_TILE_ROWS = 8,   // one 8-float vector (two SSE registers, or one AVX register)
    GEMM_TILE_COLS = 6,   // 6 column accumulators + the row vector + a broadcast fit 16 registers
};

static float to_float(float x) { return x; }
static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
static float to_float(__half x) { return __half2float(x); }

// lines [0, lines) of an operand into panels of `width` lines: out[(panel * k + l) * width + w] is
// element l of line panel * width + w (0 past the last line). A line is a row of op(A) or a column
// of op(B); its element l is at data[line * line_stride + l * step_stride].
template <typename T>
static void pack_panels_of(std::vector<float>& out, const T* data, int64_t line_stride, int64_t step_stride,
                           int lines, int k, int width) {
    int panels = (lines + width - 1) / width;
    out.resize((size_t)panels * k * width);
    for (int line = 0; line < panels * width; line++) {
        float* panel = &out[(size_t)(line / width) * k * width + line % width];
        const T* x = data + line * line_stride;
        for (int l = 0; l < k; l++) { panel[(size_t)l * width] = line < lines ? to_float(x[l * step_stride]) : 0.0f; }
    }
}

static void pack_panels(std::vector<float>& out, const matrix& x, int b, int64_t line_stride, int64_t step_stride,
                        int lines, int k, int width) {
    int64_t start = b * x.batch_stride;
    switch (x.type) {
        case CUDA_R_16BF:
            pack_panels_of(out, (const __nv_bfloat16*)x.data + start, line_stride, step_stride, lines, k, width);
            break;
        case CUDA_R_16F: pack_panels_of(out, (const __half*)x.data + start, line_stride, step_stride, lines, k, width); break;
        default: pack_panels_of(out, (const float*)x.data + start, line_stride, step_stride, lines, k, width); break;
    }
}

// the rows of op(A): op(A)[i, l] is A[i + l*lda] (N) or A[l + i*lda] (T)
static void pack_rows_of_op_a(std::vector<float>& out, const gemm_problem& p, int b) {
    bool n = p.transa == CUBLAS_OP_N;
    pack_panels(out, p.A, b, n ? 1 : p.A.ld, n ? p.A.ld : 1, p.m, p.k, GEMM_TILE_ROWS);
}

// the columns of op(B): op(B)[l, j] is B[l + j*ldb] (N) or B[j + l*ldb] (T)
static void pack_columns_of_op_b(std::vector<float>& out, const gemm_problem& p, int b) {
    bool n = p.transb == CUBLAS_OP_N;
    pack_panels(out, p.B, b, n ? p.B.ld : 1, n ? 1 : p.B.ld, p.n, p.k, GEMM_TILE_COLS);
}

typedef float tile_column __attribute__((vector_size(GEMM_TILE_ROWS * sizeof(float))));

// sums[c * GEMM_TILE_ROWS + r] = sum over l = 0..k-1, in order, of a[l][r] * b[l][c] (one panel each).
// Compiled twice, for AVX2 and for any x86-64; the loader picks one. Both give the same bits.
__attribute__((target_clones("avx2", "default")))
static void sum_tile(int k, const float* a, const float* b, float* sums) {
    tile_column acc[GEMM_TILE_COLS] = {};
    for (int l = 0; l < k; l++) {
        tile_column a_l;
        memcpy(&a_l, a + (size_t)l * GEMM_TILE_ROWS, sizeof a_l);
        const float* b_l = b + (size_t)l * GEMM_TILE_COLS;
#pragma GCC unroll 16  // all GEMM_TILE_COLS: the accumulators then live in registers, not memory
        for (int c = 0; c < GEMM_TILE_COLS; c++) { acc[c] += a_l * b_l[c]; }
    }
    memcpy(sums, acc, sizeof acc);
}

// ----------------------------------------------------------------------------
// the reference GEMM: the sums above, then the epilogue on each output

// D[i,j] (and aux, row_sums[i]) from the sum of products of output (i, j) in batch b
static void finish_output(const gemm_problem& p, int b, int i, int j, float sum, std::vector<float>& row_sums) {
    const epilogue_plan& e = p.epilogue;
    float x = p.alpha * sum;
    if (p.beta != 0.0f) { x += p.beta * element(p.C, CUBLAS_OP_N, b, i, j); }
    int64_t aux_at = b * p.aux_batch_stride + i + j * p.aux_ld;
    if (e.add_bias) { x += load(p.bias, p.bias_type, b * p.bias_batch_stride + i); }
    if (e.store_aux) { store(p.aux, p.aux_type, aux_at, x); }
    if (e.relu) { x = x > 0.0f ? x : 0.0f; }
    if (e.gelu) { x = gelu_elem(x); }
    if (e.dgelu) { x *= gelu_grad_elem(load(p.aux, p.aux_type, aux_at)); }
    row_sums[i] += x;
    store((void*)p.D.data, p.D.type, b * p.D.batch_stride + i + j * p.D.ld, x);
}

static void reference_gemm(const gemm_problem& p) {
    const epilogue_plan& e = p.epilogue;
    // kept from call to call (the emulator runs on one OS thread): no fresh pages for every GEMM
    static std::vector<float> a_panels, b_panels;
    for (int b = 0; b < p.batch; b++) {
        pack_rows_of_op_a(a_panels, p, b);
        pack_columns_of_op_b(b_panels, p, b);
        // row_sums[i] (DGELU_BGRAD) adds its outputs in order j = 0..n-1: the tile columns go left to right
        std::vector<float> row_sums(p.m, 0.0f);
        for (int j0 = 0; j0 < p.n; j0 += GEMM_TILE_COLS) {
            for (int i0 = 0; i0 < p.m; i0 += GEMM_TILE_ROWS) {
                float sums[GEMM_TILE_COLS * GEMM_TILE_ROWS];
                sum_tile(p.k, a_panels.data() + (size_t)i0 * p.k, b_panels.data() + (size_t)j0 * p.k, sums);
                for (int c = 0; c < GEMM_TILE_COLS && j0 + c < p.n; c++) {
                    for (int r = 0; r < GEMM_TILE_ROWS && i0 + r < p.m; r++) {
                        finish_output(p, b, i0 + r, j0 + c, sums[c * GEMM_TILE_ROWS + r], row_sums);
                    }
                }
            }
        }
        void* bias = p.bias;
        int64_t bias_at = b * p.bias_batch_stride;
        if (e.bias_grad == BIAS_GRAD_FROM_D) {
            for (int i = 0; i < p.m; i++) { store(bias, p.bias_type, bias_at + i, row_sums[i]); }
        } else if (e.bias_grad == BIAS_GRAD_FROM_A) {
            for (int i = 0; i < p.m; i++) {
                float s = 0.0f;
                for (int l = 0; l < p.k; l++) { s += element(p.A, p.transa, b, i, l); }
                store(bias, p.bias_type, bias_at + i, s);
            }
        } else if (e.bias_grad == BIAS_GRAD_FROM_B) {
            for (int j = 0; j < p.n; j++) {
                float s = 0.0f;
                for (int l = 0; l < p.k; l++) { s += element(p.B, p.transb, b, l, j); }
                store(bias, p.bias_type, bias_at + j, s);
            }
        }
    }
}

static size_t type_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

// the GEMM's cost on the timeline (emu_timeline.cpp): FLOPs, the operands' bytes, and the peak its
// types run at (bf16 and fp16 operands, or fp32 ones with a 16-bit fast mode, on the tensor cores)
static emu_work gemm_cost(const gemm_problem& p, cublasComputeType_t compute) {
    emu_work w;
    w.kind = EMU_WORK_GEMM;
    w.m = p.m;
    w.n = p.n;
    w.k = p.k;
    w.batch = p.batch;
    double mats = p.batch;
    w.flops = 2.0 * p.m * (double)p.n * p.k * mats;
    w.bytes = mats * ((double)p.m * p.k * type_bytes(p.A.type) + (double)p.k * p.n * type_bytes(p.B.type) +
                      (double)p.m * p.n * type_bytes(p.D.type) * (p.beta != 0.0f ? 2.0 : 1.0));
    bool narrow = p.A.type != CUDA_R_32F && p.B.type != CUDA_R_32F;
    if (narrow || compute == CUBLAS_COMPUTE_32F_FAST_16BF || compute == CUBLAS_COMPUTE_32F_FAST_16F) { w.peak = EMU_PEAK_BF16; }
    else if (compute == CUBLAS_COMPUTE_32F_FAST_TF32) { w.peak = EMU_PEAK_TF32; }
    else { w.peak = EMU_PEAK_FP32; }
    return w;
}

static cublasStatus_t enqueue_gemm(cudaStream_t stream, const char* what, const gemm_problem& p,
                                   cublasComputeType_t compute = CUBLAS_COMPUTE_32F) {
    if (p.m < 0 || p.n < 0 || p.k < 0 || p.batch < 0) { return CUBLAS_STATUS_INVALID_VALUE; }
    if (!supported_type(p.A.type) || !supported_type(p.B.type) || !supported_type(p.D.type)) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    // the leading dimensions cuBLAS requires: at least the stored rows of each matrix
    int64_t a_rows = p.transa == CUBLAS_OP_N ? p.m : p.k;
    int64_t b_rows = p.transb == CUBLAS_OP_N ? p.k : p.n;
    if (p.A.ld < (a_rows > 1 ? a_rows : 1) || p.B.ld < (b_rows > 1 ? b_rows : 1) || p.D.ld < (p.m > 1 ? p.m : 1)) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!emu_config().execute) {   // modelled, not run
        emu_enqueue(stream, what, [] {}, gemm_cost(p, compute));
        return CUBLAS_STATUS_SUCCESS;
    }
    emu_enqueue(stream, what, [p] { reference_gemm(p); }, gemm_cost(p, compute));
    return CUBLAS_STATUS_SUCCESS;
}

static gemm_problem plain_gemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                               const void* alpha, matrix A, matrix B, const void* beta, matrix C) {
    gemm_problem p = {};
    p.transa = transa;
    p.transb = transb;
    p.m = m;
    p.n = n;
    p.k = k;
    p.batch = 1;
    p.alpha = *(const float*)alpha;
    p.beta = *(const float*)beta;
    p.A = A;
    p.B = B;
    p.C = C;
    p.D = C;
    return p;
}

// ----------------------------------------------------------------------------
// cuBLAS

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
    *handle = new cublasContext{0, CUBLAS_POINTER_MODE_HOST};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) { delete handle; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) { handle->stream = stream; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) { *stream = handle->stream; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void*, size_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        default: return "CUBLAS_STATUS_(other)";
    }
}
const char* cublasGetStatusString(cublasStatus_t s) { return cublasGetStatusName(s); }

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc) {
    gemm_problem p = plain_gemm(transa, transb, m, n, k, alpha, matrix{A, CUDA_R_32F, lda, 0},
                                matrix{B, CUDA_R_32F, ldb, 0}, beta, matrix{C, CUDA_R_32F, ldc, 0});
    return enqueue_gemm(handle->stream, "cublasSgemm", p);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long strideA, const float* B, int ldb, long long strideB,
                                         const float* beta, float* C, int ldc, long long strideC, int batchCount) {
    gemm_problem p = plain_gemm(transa, transb, m, n, k, alpha, matrix{A, CUDA_R_32F, lda, strideA},
                                matrix{B, CUDA_R_32F, ldb, strideB}, beta, matrix{C, CUDA_R_32F, ldc, strideC});
    p.batch = batchCount;
    return enqueue_gemm(handle->stream, "cublasSgemmStridedBatched", p);
}

static bool supported_compute(cublasComputeType_t c) {
    return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_PEDANTIC || c == CUBLAS_COMPUTE_32F_FAST_TF32 ||
           c == CUBLAS_COMPUTE_32F_FAST_16BF || c == CUBLAS_COMPUTE_32F_FAST_16F;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    (void)algo;
    if (!supported_compute(computeType)) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    gemm_problem p = plain_gemm(transa, transb, m, n, k, alpha, matrix{A, Atype, lda, 0}, matrix{B, Btype, ldb, 0},
                                beta, matrix{C, Ctype, ldc, 0});
    return enqueue_gemm(handle->stream, "cublasGemmEx", p, computeType);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
    (void)algo;
    if (!supported_compute(computeType)) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    gemm_problem p = plain_gemm(transa, transb, m, n, k, alpha, matrix{A, Atype, lda, strideA},
                                matrix{B, Btype, ldb, strideB}, beta, matrix{C, Ctype, ldc, strideC});
    p.batch = batchCount;
    return enqueue_gemm(handle->stream, "cublasGemmStridedBatchedEx", p, computeType);
}

// ----------------------------------------------------------------------------
// cuBLASLt: descriptors live inside the headers' semi-opaque structs

struct lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch_count;
    int64_t batch_stride;
    int32_t order;
};
struct lt_matmul_desc {
    cublasComputeType_t compute;
    cudaDataType scale_type;
    int32_t transa, transb;
    uint32_t epilogue;
    const void* bias;
    int32_t bias_type;      // -1: D's type
    int64_t bias_batch_stride;
    void* aux;
    int64_t aux_ld, aux_batch_stride;
    int32_t aux_type;       // -1: D's type
    int32_t pointer_mode;
};
static_assert(sizeof(lt_layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout must fit its opaque struct");
static_assert(sizeof(lt_matmul_desc) <= sizeof(cublasLtMatmulDescOpaque_t), "desc must fit its opaque struct");
static lt_layout* layout_of(cublasLtMatrixLayout_t l) { return reinterpret_cast<lt_layout*>(l->data); }
static lt_matmul_desc* desc_of(cublasLtMatmulDesc_t d) { return reinterpret_cast<lt_matmul_desc*>(d->data); }

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) { *handle = new cublasLtContext{0}; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) { delete handle; return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    *layout = new cublasLtMatrixLayoutOpaque_t{};
    *layout_of(*layout) = lt_layout{type, rows, cols, ld, 1, 0, CUBLASLT_ORDER_COL};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) { delete layout; return CUBLAS_STATUS_SUCCESS; }

// copy an attribute value of exactly the documented size
template <typename T>
static cublasStatus_t set_attribute(T* field, const void* buf, size_t bytes) {
    if (buf == nullptr || bytes != sizeof(T)) { return CUBLAS_STATUS_INVALID_VALUE; }
    memcpy(field, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t bytes) {
    lt_layout* l = layout_of(layout);
    switch (attr) {
        case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set_attribute(&l->batch_count, buf, bytes);
        case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set_attribute(&l->batch_stride, buf, bytes);
        case CUBLASLT_MATRIX_LAYOUT_ORDER: return set_attribute(&l->order, buf, bytes);
        case CUBLASLT_MATRIX_LAYOUT_ROWS: return set_attribute(&l->rows, buf, bytes);
        case CUBLASLT_MATRIX_LAYOUT_COLS: return set_attribute(&l->cols, buf, bytes);
        case CUBLASLT_MATRIX_LAYOUT_LD: return set_attribute(&l->ld, buf, bytes);
        default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
    *desc = new cublasLtMatmulDescOpaque_t{};
    *desc_of(*desc) = lt_matmul_desc{compute, scale_type, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT,
                                     nullptr, -1, 0, nullptr, 0, 0, -1, CUBLASLT_POINTER_MODE_HOST};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) { delete desc; return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
    lt_matmul_desc* d = desc_of(desc);
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA: return set_attribute(&d->transa, buf, bytes);
        case CUBLASLT_MATMUL_DESC_TRANSB: return set_attribute(&d->transb, buf, bytes);
        case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_attribute(&d->epilogue, buf, bytes);
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_attribute(&d->bias, buf, bytes);
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_attribute(&d->bias_type, buf, bytes);
        case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return set_attribute(&d->bias_batch_stride, buf, bytes);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set_attribute(&d->aux, buf, bytes);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set_attribute(&d->aux_ld, buf, bytes);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return set_attribute(&d->aux_batch_stride, buf, bytes);
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return set_attribute(&d->aux_type, buf, bytes);
        case CUBLASLT_MATMUL_DESC_POINTER_MODE: return set_attribute(&d->pointer_mode, buf, bytes);
        case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set_attribute(&d->scale_type, buf, bytes);
        case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set_attribute(&d->compute, buf, bytes);
        default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

// what the preference lets the heuristic assume of the operands A, B, C, D (bytes), and the algorithm
// it returns: the reference GEMM, marked with the alignments it was chosen for
static const uint32_t LT_DEFAULT_ALIGNMENT = 256;   // cublasLt.h: every MIN_ALIGNMENT preference's default
struct lt_preference {
    uint32_t min_alignment[EMU_LT_OPERANDS];
};
struct lt_algo {
    uint64_t magic;   // LT_ALGO_MAGIC: one of ours (a caller's zeroed struct is not)
    uint32_t min_alignment[EMU_LT_OPERANDS];
};
static const uint64_t LT_ALGO_MAGIC = 0x31746c2d756d65ull;  // "emu-lt1"
static_assert(sizeof(lt_preference) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "preference must fit its opaque struct");
static_assert(sizeof(lt_algo) <= sizeof(cublasLtMatmulAlgo_t), "algorithm must fit its semi-opaque struct");
static lt_preference* preference_of(cublasLtMatmulPreference_t p) { return reinterpret_cast<lt_preference*>(p->data); }

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    *pref = new cublasLtMatmulPreferenceOpaque_t{};
    for (uint32_t& a : preference_of(*pref)->min_alignment) { a = LT_DEFAULT_ALIGNMENT; }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) { delete pref; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t bytes) {
    uint32_t* align = preference_of(pref)->min_alignment;
    switch (attr) {
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set_attribute(&align[0], buf, bytes);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set_attribute(&align[1], buf, bytes);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set_attribute(&align[2], buf, bytes);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set_attribute(&align[3], buf, bytes);
        default: return buf == nullptr ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;  // workspace limits: no effect
    }
}

// the epilogues the emulator knows (see the top of this file); false for the rest
static bool plan_epilogue(uint32_t epilogue, epilogue_plan* e) {
    *e = epilogue_plan{false, false, false, false, false, BIAS_GRAD_NONE};
    switch (epilogue) {
        case CUBLASLT_EPILOGUE_DEFAULT: return true;
        case CUBLASLT_EPILOGUE_BIAS: e->add_bias = true; return true;
        case CUBLASLT_EPILOGUE_RELU: e->relu = true; return true;
        case CUBLASLT_EPILOGUE_RELU_BIAS: e->relu = e->add_bias = true; return true;
        case CUBLASLT_EPILOGUE_GELU: e->gelu = true; return true;
        case CUBLASLT_EPILOGUE_GELU_BIAS: e->gelu = e->add_bias = true; return true;
        case CUBLASLT_EPILOGUE_GELU_AUX: e->gelu = e->store_aux = true; return true;
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: e->gelu = e->store_aux = e->add_bias = true; return true;
        case CUBLASLT_EPILOGUE_DGELU: e->dgelu = true; return true;
        case CUBLASLT_EPILOGUE_DGELU_BGRAD: e->dgelu = true; e->bias_grad = BIAS_GRAD_FROM_D; return true;
        case CUBLASLT_EPILOGUE_BGRADA: e->bias_grad = BIAS_GRAD_FROM_A; return true;
        case CUBLASLT_EPILOGUE_BGRADB: e->bias_grad = BIAS_GRAD_FROM_B; return true;
        default: return false;
    }
}

// the matmul the descriptors describe, or a status saying why not
static cublasStatus_t lt_problem(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
                                 cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,
                                 cublasLtMatrixLayout_t Ddesc, gemm_problem* p) {
    const lt_matmul_desc* d = desc_of(desc);
    const lt_layout *a = layout_of(Adesc), *b = layout_of(Bdesc), *c = layout_of(Cdesc), *o = layout_of(Ddesc);
    if (!supported_compute(d->compute) || d->scale_type != CUDA_R_32F) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    for (const lt_layout* l : {a, b, c, o}) {
        if (l->order != CUBLASLT_ORDER_COL || !supported_type(l->type)) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    }
    *p = gemm_problem{};
    p->transa = (cublasOperation_t)d->transa;
    p->transb = (cublasOperation_t)d->transb;
    p->m = (int)o->rows;
    p->n = (int)o->cols;
    p->k = (int)(p->transa == CUBLAS_OP_N ? a->cols : a->rows);
    uint64_t a_other = p->transa == CUBLAS_OP_N ? a->rows : a->cols;
    uint64_t b_k = p->transb == CUBLAS_OP_N ? b->rows : b->cols;
    uint64_t b_n = p->transb == CUBLAS_OP_N ? b->cols : b->rows;
    if (a_other != o->rows || b_k != (uint64_t)p->k || b_n != o->cols || c->rows != o->rows || c->cols != o->cols) {
        return CUBLAS_STATUS_INVALID_VALUE;  // the shapes do not chain: op(A) is m x k, op(B) k x n, C and D m x n
    }
    p->batch = o->batch_count;
    for (const lt_layout* l : {a, b, c}) {
        if (l->batch_count != o->batch_count) { return CUBLAS_STATUS_INVALID_VALUE; }
    }
    if (!plan_epilogue(d->epilogue, &p->epilogue)) { return CUBLAS_STATUS_NOT_SUPPORTED; }
    p->A = matrix{nullptr, a->type, a->ld, a->batch_stride};
    p->B = matrix{nullptr, b->type, b->ld, b->batch_stride};
    p->C = matrix{nullptr, c->type, c->ld, c->batch_stride};
    p->D = matrix{nullptr, o->type, o->ld, o->batch_stride};
    p->bias = (void*)d->bias;
    p->bias_type = d->bias_type < 0 ? o->type : (cudaDataType)d->bias_type;
    p->bias_batch_stride = d->bias_batch_stride;
    p->aux = d->aux;
    p->aux_type = d->aux_type < 0 ? o->type : (cudaDataType)d->aux_type;
    p->aux_ld = d->aux_ld;
    p->aux_batch_stride = d->aux_batch_stride;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
    gemm_problem p;
    cublasStatus_t s = lt_problem(desc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    *returned = 0;
    if (s != CUBLAS_STATUS_SUCCESS) { return s; }
    // what the real library refuses here (the pointers are checked by cublasLtMatmul only)
    const lt_matmul_desc* d = desc_of(desc);
    s = emu_lt_check_algorithm("cublasLtMatmulAlgoGetHeuristic", d->epilogue, d->transa, d->transb);
    if (s != CUBLAS_STATUS_SUCCESS) { return s; }
    if (requested < 1) { return CUBLAS_STATUS_INVALID_VALUE; }
    memset(&results[0], 0, sizeof(results[0]));  // one algorithm: the reference GEMM
    lt_algo chosen = {LT_ALGO_MAGIC, {LT_DEFAULT_ALIGNMENT, LT_DEFAULT_ALIGNMENT, LT_DEFAULT_ALIGNMENT, LT_DEFAULT_ALIGNMENT}};
    if (pref != nullptr) { memcpy(chosen.min_alignment, preference_of(pref)->min_alignment, sizeof chosen.min_alignment); }
    memcpy(results[0].algo.data, &chosen, sizeof chosen);
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
    gemm_problem p;
    cublasStatus_t s = lt_problem(desc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (s != CUBLAS_STATUS_SUCCESS) { return s; }
    // what the real library refuses (emu_lt_rules.cpp)
    const lt_matmul_desc* d = desc_of(desc);
    s = emu_lt_check_algorithm("cublasLtMatmul", d->epilogue, d->transa, d->transb);
    if (s != CUBLAS_STATUS_SUCCESS) { return s; }
    s = emu_lt_check_pointers("cublasLtMatmul", d->epilogue, d->bias, d->aux, d->aux_ld, (uint64_t)p.m);
    if (s != CUBLAS_STATUS_SUCCESS) { return s; }
    // the alignments the algorithm was chosen for; without one, cuBLASLt chooses under the default preference
    lt_algo chosen = {LT_ALGO_MAGIC, {LT_DEFAULT_ALIGNMENT, LT_DEFAULT_ALIGNMENT, LT_DEFAULT_ALIGNMENT, LT_DEFAULT_ALIGNMENT}};
    if (algo != nullptr && memcmp(algo->data, &LT_ALGO_MAGIC, sizeof LT_ALGO_MAGIC) == 0) { memcpy(&chosen, algo->data, sizeof chosen); }
    const void* operands[EMU_LT_OPERANDS] = {A, B, C, D};
    s = emu_lt_check_alignment("cublasLtMatmul", operands, chosen.min_alignment, workspace, workspace_bytes);
    if (s != CUBLAS_STATUS_SUCCESS) { return s; }
    p.alpha = *(const float*)alpha;
    p.beta = *(const float*)beta;
    p.A.data = A;
    p.B.data = B;
    p.C.data = C;
    p.D.data = D;
    return enqueue_gemm(stream, "cublasLtMatmul", p, d->compute);
}
