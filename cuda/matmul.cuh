/*
matmul.cuh: the linear layer on the device through cuBLASLt, mirroring matmul_forward/backward of
cpu/layers.h, and matmul_lt, the one GEMM call the backend's other files (attention) use too.

    MatmulContext mm;
    matmul_context_init(&mm, NULL, 0);   // a cuBLASLt handle, its own 32 MiB workspace, an empty cache
    matmul_forward_cuda<floatX>(out, inp, weight, bias, B, T, C, OC, &mm, stream);         // out =
    float* scratch;  // matmul_backward_scratch_floats(B, T, OC) floats, contents not kept
    matmul_backward_cuda<floatX>(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC, scratch, &mm, stream);
                                                  // dinp +=, dweight += (fp32), dbias += (fp32)
    matmul_backward_cuda<floatX>(..., &mm, stream, MATMUL_DINP_SET);            // dinp = (old contents unread)
    matmul_backward_cuda<floatX>(..., &mm, stream, MATMUL_DINP_SET_DGELU, fch); // dinp = gelu'(fch) * (dout @ weight)
    matmul_context_free(&mm);

Invariants: every GEMM accumulates in fp32 (CUBLAS_COMPUTE_32F: no TF32 in fp32 mode); bf16 results
are rounded once when stored. Row-major (rows, cols) is cuBLAS's column-major (cols, rows), so
out (BT,OC) = inp (BT,C) @ weight (OC,C)^T is, column-major, out^T (OC,BT) = op_T(weight) @ inp^T.
The bias gradient is this file's kernel, not BGRADB: cuBLASLt writes (=) where the backward must
add (+=), and the kernel sums in a fixed order. The weight gradient is a GEMM with bf16 (or fp32)
inputs and an fp32 output accumulated with beta = 1 (micro-steps add up). dinp is added to (beta =
1) or, where the caller says nothing else contributes to it, written (beta = 0: no memset first).
cuBLASLt is told each pointer's real alignment, so buffers carved at any offset are safe.

Fused into the GEMMs, by cuBLASLt epilogues that get exactly the pointers they use (cuBLASLt
refuses any other pointer, ../shared/GPU.md rule 1):
- the bias, into the forward GEMM (BIAS: the bias pointer);
- the GELU backward, into the dinp GEMM of the layer that follows a GELU (DGELU: the aux pointer
  is the GELU's input, its leading dimension that of dinp; no bias pointer): dinp = gelu'(aux) *
  (dout @ weight), so the gradient of the GELU output never needs a buffer. The emulator
  (dev/cuda_emu/emu_blas.cpp) computes gelu' with the tanh form of cuda/gelu.cuh, term for term.
  No real GPU has yet run DGELU with only the aux pointer, so the first DGELU call is the probe:
  where cuBLASLt refuses it (no algorithm, or cublasLtMatmul's status), that is said once ("note:")
  and from then on the GEMM writes dout @ weight into dinp and gelu_backward_inplace_cuda multiplies
  by gelu' in place. The two paths round differently (bf16: the fused one does not round dout @
  weight first) but need the same memory, so the memory plan does not depend on the probe.
Not fused: the GELU into the forward GEMM (GELU_AUX_BIAS). With --recompute gelu the backward
recomputes the GELU output with gelu_forward_cuda, which is not bitwise the epilogue's GELU, and
recompute must give bitwise the same training as keeping the output: so the forward always runs
gelu_forward_cuda too.

Cached: each GEMM's cuBLASLt descriptors (matmul, A, B and D layouts) and the algorithm the
heuristic chose, keyed by everything that decides them (MatmulKey: transposes, m, n, k, leading
dimensions, strides, batch, types, epilogue, aux leading dimension and every pointer's alignment).
A training step runs few distinct GEMMs (counted emulated: d12 15 with flash attention, 18 with the
stored-weights attention's batched GEMMs; the test fixture 16 and 19; more where layers' weights start
at different alignments); past MATMUL_CACHE_SIZE a GEMM's descriptors are made, used and destroyed
within the call, as without a cache. The cache keeps the first ones: training's, which come before the sampler's
forwards of T = 1, 2, ... (a new shape each). The bias and
aux pointers change from call to call and are set on the cached descriptor before each use (their
alignment, part of the key, is what the heuristic looked at). A refusal is cached too. The cache is
host memory behind the context's pointer, so launchers that take a const context still fill it: it
changes what a call costs, never what it computes. matmul_context_free destroys every descriptor.
*/
#ifndef CUDA_MATMUL_CUH
#define CUDA_MATMUL_CUH

#include "common.cuh"
#include "profile.cuh"  // --profile: a launcher marks its range on the compute stream (prof_kernel)
#include "gelu.cuh"  // gelu_backward_inplace_cuda: the GELU backward where cuBLASLt refuses DGELU

#define MATMUL_WORKSPACE_BYTES (32u << 20)  // cuBLASLt's workspace, as NVIDIA recommends for Hopper
#define MATMUL_CACHE_SIZE 64                 // cached GEMMs per context (a training step: 15 to 20)
#define MATMUL_BIAS_ROWS 128                 // rows per block of the bias gradient: the fixed partition of its sums
#define MATMUL_BIAS_WARPS 8                  // warps per block of the bias gradient, each taking every 8th row

// everything that decides a GEMM's descriptors and algorithm; one type throughout, so no padding
// (keys compare with memcmp)
typedef struct {
    long long trans_a, trans_b, m, n, k, lda, ldb, ldd, stride_a, stride_b, stride_d, batch;
    long long ab_type, d_type, epilogue, aux_ld;
    long long align_a, align_b, align_d, align_bias, align_aux;  // bytes (pointer_alignment); 0: no such pointer
} MatmulKey;

// a GEMM's descriptors and what cuBLASLt answered for them
typedef struct {
    MatmulKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;  // D's layout is C's too (C = D)
    cublasLtMatmulAlgo_t algo;       // the heuristic's first choice (when status is SUCCESS)
    cublasStatus_t status;           // SUCCESS, or the refusal of the heuristic or of the first cublasLtMatmul
} MatmulPlan;

typedef struct {
    MatmulPlan plans[MATMUL_CACHE_SIZE];
    int count;
    int dgelu_refused;  // cuBLASLt refused DGELU once: the GELU backward is a kernel from then on (tests set it)
} MatmulCache;

typedef struct {
    cublasLtHandle_t lt;
    void* workspace;         // device memory cuBLASLt may use during a matmul
    size_t workspace_bytes;
    int owns_workspace;      // allocated by matmul_context_init (and freed by matmul_context_free)
    MatmulCache* cache;      // host memory, filled as GEMMs run
} MatmulContext;

// the epilogue after D = alpha op(A) op(B) + beta D, and the pointers it reads (only these are set)
typedef struct {
    cublasLtEpilogue_t kind;  // DEFAULT, BIAS or DGELU
    const void* bias;         // BIAS: (m) of D's type, added to every column
    const void* aux;          // DGELU: (m,n) of D's type, leading dimension aux_ld: D *= gelu'(aux)
    int aux_ld;
} MatmulEpilogue;

// a handle, an empty cache and a workspace: the caller's (workspace_bytes of device memory, e.g.
// from its accounting allocator), or when workspace is NULL, MATMUL_WORKSPACE_BYTES allocated here
static void matmul_context_init(MatmulContext* ctx, void* workspace, size_t workspace_bytes) {
    CUBLAS_CHECK(cublasLtCreate(&ctx->lt));
    ctx->owns_workspace = workspace == NULL;
    if (workspace == NULL) {
        workspace_bytes = MATMUL_WORKSPACE_BYTES;
        CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
    }
    ctx->workspace = workspace;
    ctx->workspace_bytes = workspace_bytes;
    ctx->cache = (MatmulCache*)calloc_check(1, sizeof(MatmulCache));
}

static void matmul_plan_destroy(MatmulPlan* p) {
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->a));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->d));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
}

static void matmul_context_free(MatmulContext* ctx) {
    for (int i = 0; i < ctx->cache->count; i++) { matmul_plan_destroy(&ctx->cache->plans[i]); }
    free(ctx->cache);
    ctx->cache = NULL;
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
// accumulation, then the epilogue. FLOPs: 2 m n k batch

// the per-call pointers of the epilogue, on the plan's descriptor (before the heuristic too: it
// reads their alignment)
static void matmul_set_pointers(cublasLtMatmulDesc_t desc, const MatmulEpilogue* e) {
    if (e->bias != NULL) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e->bias, sizeof e->bias));
    }
    if (e->aux != NULL) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e->aux, sizeof e->aux));
    }
}

// p's descriptors for key, and the heuristic's answer (workspace: the context's)
static void matmul_plan_make(MatmulPlan* p, const MatmulContext* ctx, const MatmulKey* key, const MatmulEpilogue* e) {
    p->key = *key;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = key->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (e->kind != CUBLASLT_EPILOGUE_DEFAULT) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e->kind, sizeof e->kind));
    }
    if (e->aux != NULL) {
        int64_t aux_ld = e->aux_ld;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
    }
    matmul_set_pointers(p->desc, e);
    int m = (int)key->m, n = (int)key->n, k = (int)key->k;
    cudaDataType ab_type = (cudaDataType)key->ab_type;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab_type, key->trans_a ? k : m, key->trans_a ? m : k, key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab_type, key->trans_b ? n : k, key->trans_b ? k : n, key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, (cudaDataType)key->d_type, m, n, key->ldd));
    if (key->batch > 1) {
        const cublasLtMatrixLayout_t layouts[3] = {p->a, p->b, p->d};
        const long long strides[3] = {key->stride_a, key->stride_b, key->stride_d};
        for (int i = 0; i < 3; i++) {
            int32_t count = (int32_t)key->batch;
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
    const long long aligns[4] = {key->align_a, key->align_b, key->align_d, key->align_d};
    for (int i = 0; i < 4; i++) {
        uint32_t a = (uint32_t)aligns[i];
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &a, sizeof a));
    }
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    p->status = cublasLtMatmulAlgoGetHeuristic(ctx->lt, p->desc, p->a, p->b, p->d, p->d, pref, 1, &heuristic, &found);
    if (p->status == CUBLAS_STATUS_SUCCESS && found == 0) { p->status = CUBLAS_STATUS_NOT_SUPPORTED; }
    if (p->status == CUBLAS_STATUS_SUCCESS) { p->algo = heuristic.algo; }
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
}

// the plan for key: cached, else made now into a free slot of the cache or, when it is full, into
// *spare (the caller destroys that one after use)
static MatmulPlan* matmul_plan(const MatmulContext* ctx, const MatmulKey* key, const MatmulEpilogue* e, MatmulPlan* spare) {
    MatmulCache* c = ctx->cache;
    for (int i = 0; i < c->count; i++) {
        if (memcmp(&c->plans[i].key, key, sizeof *key) == 0) { return &c->plans[i]; }
    }
    MatmulPlan* p = c->count < MATMUL_CACHE_SIZE ? &c->plans[c->count++] : spare;
    matmul_plan_make(p, ctx, key, e);
    return p;
}

// the GEMM with epilogue e; returns cuBLASLt's status rather than stopping (a refusal stays in the plan)
static cublasStatus_t matmul_lt_try(const MatmulContext* ctx, bool trans_a, bool trans_b, int m, int n, int k,
                                    float alpha, const void* A, int lda, long long stride_a, const void* B, int ldb,
                                    long long stride_b, float beta, void* D, int ldd, long long stride_d, int batch,
                                    cudaDataType ab_type, cudaDataType d_type, const MatmulEpilogue* e,
                                    cudaStream_t stream) {
    if (m == 0 || n == 0 || batch == 0) { return CUBLAS_STATUS_SUCCESS; }
    MatmulKey key = {trans_a, trans_b, m, n, k, lda, ldb, ldd, stride_a, stride_b, stride_d, batch, ab_type, d_type,
                     e->kind, e->aux_ld, pointer_alignment(A), pointer_alignment(B), pointer_alignment(D),
                     e->bias != NULL ? pointer_alignment(e->bias) : 0, e->aux != NULL ? pointer_alignment(e->aux) : 0};
    MatmulPlan spare, *p = matmul_plan(ctx, &key, e, &spare);
    if (p->status == CUBLAS_STATUS_SUCCESS) {
        matmul_set_pointers(p->desc, e);
        p->status = cublasLtMatmul(ctx->lt, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->d, D, p->d, &p->algo,
                                   ctx->workspace, ctx->workspace_bytes, stream);
    }
    cublasStatus_t status = p->status;
    if (p == &spare) { matmul_plan_destroy(&spare); }
    return status;
}

// the GEMM, plus the bias (m, d_type) by the BIAS epilogue when bias is not NULL; stops if cuBLASLt refuses
static void matmul_lt(const MatmulContext* ctx, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                      const void* A, int lda, long long stride_a, const void* B, int ldb, long long stride_b,
                      float beta, void* D, int ldd, long long stride_d, int batch, cudaDataType ab_type,
                      cudaDataType d_type, const void* bias, cudaStream_t stream) {
    MatmulEpilogue e = {bias != NULL ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, NULL, 0};
    cublasStatus_t s = matmul_lt_try(ctx, trans_a, trans_b, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b, beta,
                                     D, ldd, stride_d, batch, ab_type, d_type, &e, stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        char call[192];
        snprintf(call, sizeof call, "cuBLASLt GEMM op(A)=%c op(B)=%c m=%d n=%d k=%d batch=%d lda=%d ldb=%d ldd=%d%s",
                 trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, batch, lda, ldb, ldd, bias ? " (bias epilogue)" : "");
        cublas_check_fail_at(s, call, __FILE__, __LINE__);
    }
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
    prof_kernel(stream, PROF_MATMUL, prof_matmul_forward((size_t)B * T, C, OC, sizeof(floatX)), PROF_MATMUL_FORWARD, (size_t)B * T, C, OC);
    cudaDataType type = cuda_data_type<floatX>();
    matmul_lt(ctx, true, false, OC, B * T, C, 1.0f, weight, C, 0, inp, C, 0, 0.0f, out, OC, 0, 1, type, type, bias,
              stream);
}

// the scratch matmul_backward_cuda needs (for the bias gradient): OC floats per MATMUL_BIAS_ROWS rows
static size_t matmul_backward_scratch_floats(int B, int T, int OC) {
    return (size_t)ceil_div(B * T, MATMUL_BIAS_ROWS) * OC;
}

// what matmul_backward_cuda does with dinp
typedef enum {
    MATMUL_DINP_ADD,        // dinp += dout @ weight, as cpu/layers.h's matmul_backward
    MATMUL_DINP_SET,        // dinp = dout @ weight: its old contents are not read (it needs no memset)
    MATMUL_DINP_SET_DGELU,  // dinp = gelu'(gelu_inp) * (dout @ weight): also the backward of the GELU
                            // whose output was this layer's input (gelu_inp: that GELU's input)
} MatmulDinp;

// dinp^T (C,BT) = gelu'(gelu_inp^T) * weight^T (C,OC) @ dout^T (OC,BT) by the DGELU epilogue (column-major);
// false where cuBLASLt refuses it: said once on stdout, and every later call is false without asking
template <typename floatX>
static bool matmul_dinp_dgelu(floatX* dinp, const floatX* dout, const floatX* weight, const floatX* gelu_inp, int BT,
                              int C, int OC, const MatmulContext* ctx, cudaStream_t stream) {
    if (ctx->cache->dgelu_refused) { return false; }
    cudaDataType type = cuda_data_type<floatX>();
    MatmulEpilogue dgelu = {CUBLASLT_EPILOGUE_DGELU, NULL, gelu_inp, C};
    cublasStatus_t s = matmul_lt_try(ctx, false, false, C, BT, OC, 1.0f, weight, C, 0, dout, OC, 0, 0.0f, dinp, C, 0, 1,
                                     type, type, &dgelu, stream);
    if (s == CUBLAS_STATUS_SUCCESS) { return true; }
    ctx->cache->dgelu_refused = 1;
    printf("note: cuBLASLt refused the DGELU epilogue (%s) for m=%d n=%d k=%d: the GELU backward runs as "
            "its own kernel from now on (the same memory, a little slower)\n", cublasGetStatusName(s), C, BT, OC);
    return false;
}

// dinp (B,T,C) += dout (B,T,OC) @ weight (OC,C) (or =, or = gelu'(gelu_inp (B,T,C)) * (dout @ weight):
// dinp_mode): the input-gradient half of matmul_backward_cuda, alone for a caller that starts
// something on dinp before the weight gradient's GEMM (--tp's sum over the group: cuda/tensor_parallel.cuh,
// whose caller marks the --profile range of both halves)
template <typename floatX>
void matmul_backward_dinp_cuda(floatX* dinp, const floatX* dout, const floatX* weight, int B, int T, int C, int OC,
                               const MatmulContext* ctx, cudaStream_t stream, MatmulDinp dinp_mode = MATMUL_DINP_ADD,
                               const floatX* gelu_inp = NULL) {
    int BT = B * T;
    cudaDataType type = cuda_data_type<floatX>();
    // column-major: dinp^T (C,BT) (+)= weight^T (C,OC) @ dout^T (OC,BT)
    bool dgelu = dinp_mode == MATMUL_DINP_SET_DGELU;
    bool fused = dgelu && matmul_dinp_dgelu(dinp, dout, weight, gelu_inp, BT, C, OC, ctx, stream);
    if (!fused) {
        float beta = dinp_mode == MATMUL_DINP_ADD ? 1.0f : 0.0f;
        matmul_lt(ctx, false, false, C, BT, OC, 1.0f, weight, C, 0, dout, OC, 0, beta, dinp, C, 0, 1, type, type,
                  NULL, stream);
    }
    if (dgelu && !fused) { gelu_backward_inplace_cuda(dinp, gelu_inp, (size_t)BT * C, stream); }  // DGELU refused
}

// dweight (OC,C) += dout^T @ inp (fp32); dbias (OC) += sum of dout (fp32, may be NULL): the weight half
// of matmul_backward_cuda, alone for a caller that runs something beside it (--tp's sum of dinp over the
// group: cuda/tensor_parallel.cuh); scratch: matmul_backward_scratch_floats(B, T, OC) floats
template <typename floatX>
void matmul_backward_weights_cuda(float* dweight, float* dbias, const floatX* dout, const floatX* inp, int B, int T, int C,
                                  int OC, float* scratch, const MatmulContext* ctx, cudaStream_t stream) {
    int BT = B * T;
    cudaDataType type = cuda_data_type<floatX>();
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

// dinp (B,T,C) += dout @ weight (or =, or = gelu'(gelu_inp (B,T,C)) * (dout @ weight): dinp_mode);
// dweight (OC,C) += dout^T @ inp; dbias (OC) += sum of dout; dweight and dbias fp32; dinp may be
// NULL (nothing upstream needs it), dbias may be NULL (no bias), gelu_inp is read by
// MATMUL_DINP_SET_DGELU only; scratch: matmul_backward_scratch_floats(B, T, OC) floats (unused when
// dbias is NULL)
template <typename floatX>
void matmul_backward_cuda(floatX* dinp, float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                          const floatX* weight, int B, int T, int C, int OC, float* scratch, const MatmulContext* ctx,
                          cudaStream_t stream, MatmulDinp dinp_mode = MATMUL_DINP_ADD, const floatX* gelu_inp = NULL) {
    prof_kernel(stream, PROF_MATMUL, prof_matmul_backward((size_t)B * T, C, OC, sizeof(floatX)), PROF_MATMUL_BACKWARD "%s", (size_t)B * T, C, OC,
                dinp_mode == MATMUL_DINP_SET_DGELU ? " (with gelu backward)" : "");
    if (dinp != NULL) { matmul_backward_dinp_cuda(dinp, dout, weight, B, T, C, OC, ctx, stream, dinp_mode, gelu_inp); }
    matmul_backward_weights_cuda(dweight, dbias, dout, inp, B, T, C, OC, scratch, ctx, stream);
}

#endif // CUDA_MATMUL_CUH
