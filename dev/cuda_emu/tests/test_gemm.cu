/*
test_gemm.cu: every GEMM entry point against a naive loop written from the cuBLAS documentation
(column-major; op(X) = X or X^T; leading dimensions; D = alpha op(A) op(B) + beta C), for all four
transpose combinations, odd sizes and padded (odd) leading dimensions:
  cublasSgemm, cublasGemmEx (fp32 and bf16), cublasSgemmStridedBatched, cublasGemmStridedBatchedEx,
  and cublasLtMatmul with each epilogue (DEFAULT, BIAS, GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS,
  DGELU, BGRADA, BGRADB) and with batched layouts; an operand or workspace below the alignment the
  algorithm was chosen for is refused (emulated; a GPU prints what it did).
Then the emulator's own promise (test_bitwise): every output is the in-order fp32 loop, bit for bit
(products rounded to fp32 and added in order l = 0..k-1, then the epilogue in fp32, one rounding to
the output type), for fp32, bf16 and fp16, every transpose, every epilogue, batches and odd shapes
around the emulator's GEMM tiles. On a real GPU cuBLAS sums in its own order, so there the same
cases are held to the tolerance of the type instead.
GELU comes from the project's one CPU reference, cpu/layers.h.
*/
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include <vector>
#include "check.h"
#include "cpu/layers.h"

#define CUBLAS_CHECK(call) cublas_check_at((call), #call, __FILE__, __LINE__)
static void cublas_check_at(cublasStatus_t s, const char* call, const char* file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "error: %s failed with cublasStatus_t %d\n  (at %s:%d)\n", call, (int)s, file, line);
        exit(EXIT_FAILURE);
    }
}

static const float FP32_TOLERANCE = 1e-5f;
static const float BF16_TOLERANCE = 2e-2f;   // inputs and outputs rounded to 8 mantissa bits
static const float FP16_TOLERANCE = 5e-3f;   // inputs and outputs rounded to 11 significant bits
static const int LD_PADDING = 3;             // leading dimensions are rows + 3: odd, never tight
static const int MATMUL_NOT_CALLED = -1;     // a cublasLtMatmul status when the heuristic found nothing
#ifdef CUDA_EMU
static const bool EMULATED = true;
#else
static const bool EMULATED = false;
#endif

// one GEMM problem's shape: op(A) is m x k, op(B) is k x n, C and D are m x n
struct shape {
    cublasOperation_t ta, tb;
    int m, n, k, batch;
    int lda, ldb, ldc;
    long long stride_a, stride_b, stride_c;
};

static shape make_shape(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int batch) {
    shape s;
    s.ta = ta;
    s.tb = tb;
    s.m = m;
    s.n = n;
    s.k = k;
    s.batch = batch;
    s.lda = (ta == CUBLAS_OP_N ? m : k) + LD_PADDING;
    s.ldb = (tb == CUBLAS_OP_N ? k : n) + LD_PADDING;
    s.ldc = m + LD_PADDING;
    s.stride_a = (long long)s.lda * (ta == CUBLAS_OP_N ? k : m) + 1;  // +1: batches not back to back
    s.stride_b = (long long)s.ldb * (tb == CUBLAS_OP_N ? n : k) + 1;
    s.stride_c = (long long)s.ldc * n + 1;
    return s;
}

static float op_at(const std::vector<float>& x, cublasOperation_t op, int ld, long long base, int r, int c) {
    return op == CUBLAS_OP_N ? x[base + r + (long long)c * ld] : x[base + c + (long long)r * ld];
}

// the documented definition, in double: d = alpha op(A) op(B) + beta c (c not read when beta == 0)
static std::vector<float> naive_gemm(const shape& s, float alpha, const std::vector<float>& a,
                                     const std::vector<float>& b, float beta, const std::vector<float>& c) {
    std::vector<float> d = c;
    for (int p = 0; p < s.batch; p++) {
        for (int j = 0; j < s.n; j++) {
            for (int i = 0; i < s.m; i++) {
                double acc = 0.0;
                for (int l = 0; l < s.k; l++) {
                    acc += (double)op_at(a, s.ta, s.lda, p * s.stride_a, i, l) *
                           op_at(b, s.tb, s.ldb, p * s.stride_b, l, j);
                }
                long long at = p * s.stride_c + i + (long long)j * s.ldc;
                d[at] = (float)(alpha * acc + (beta != 0.0f ? beta * (double)c[at] : 0.0));
            }
        }
    }
    return d;
}

// ----------------------------------------------------------------------------
// device buffers in fp32 or bf16

struct device_matrix {
    void* ptr;
    size_t n;
    cudaDataType type;
};

static device_matrix upload(const std::vector<float>& x, cudaDataType type) {
    device_matrix d = {nullptr, x.size(), type};
    if (type == CUDA_R_32F) {
        CUDA_CHECK(cudaMalloc(&d.ptr, x.size() * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(d.ptr, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    } else if (type == CUDA_R_16F) {
        std::vector<__half> h(x.size());
        for (size_t i = 0; i < x.size(); i++) { h[i] = __float2half(x[i]); }
        CUDA_CHECK(cudaMalloc(&d.ptr, x.size() * sizeof(__half)));
        CUDA_CHECK(cudaMemcpy(d.ptr, h.data(), x.size() * sizeof(__half), cudaMemcpyHostToDevice));
    } else {
        std::vector<__nv_bfloat16> h(x.size());
        for (size_t i = 0; i < x.size(); i++) { h[i] = __float2bfloat16(x[i]); }
        CUDA_CHECK(cudaMalloc(&d.ptr, x.size() * sizeof(__nv_bfloat16)));
        CUDA_CHECK(cudaMemcpy(d.ptr, h.data(), x.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    }
    return d;
}

static std::vector<float> download(const device_matrix& d) {
    std::vector<float> x(d.n);
    if (d.type == CUDA_R_32F) {
        CUDA_CHECK(cudaMemcpy(x.data(), d.ptr, d.n * sizeof(float), cudaMemcpyDeviceToHost));
    } else if (d.type == CUDA_R_16F) {
        std::vector<__half> h(d.n);
        CUDA_CHECK(cudaMemcpy(h.data(), d.ptr, d.n * sizeof(__half), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < d.n; i++) { x[i] = __half2float(h[i]); }
    } else {
        std::vector<__nv_bfloat16> h(d.n);
        CUDA_CHECK(cudaMemcpy(h.data(), d.ptr, d.n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < d.n; i++) { x[i] = __bfloat162float(h[i]); }
    }
    return x;
}

// x rounded to nearest-even in a 16-bit type (unchanged in fp32), as a store to that type rounds it
static float round_to(cudaDataType type, float x) {
    if (type == CUDA_R_16BF) { return __bfloat162float(__float2bfloat16(x)); }
    if (type == CUDA_R_16F) { return __half2float(__float2half(x)); }
    return x;
}

// what the device sees of x: 16-bit inputs are rounded before the GEMM
static std::vector<float> as_type(const std::vector<float>& x, cudaDataType type) {
    std::vector<float> r = x;
    for (float& v : r) { v = round_to(type, v); }
    return r;
}

static std::vector<float> random_vector(size_t n, unsigned seed) {
    std::vector<float> x(n);
    fill_uniform(x.data(), n, seed);
    return x;
}

// ----------------------------------------------------------------------------
// cuBLAS

enum gemm_api { SGEMM, GEMM_EX, SGEMM_STRIDED_BATCHED, GEMM_STRIDED_BATCHED_EX };
static const char* API_NAMES[] = {"cublasSgemm", "cublasGemmEx", "cublasSgemmStridedBatched",
                                  "cublasGemmStridedBatchedEx"};

static void run_cublas(cublasHandle_t handle, gemm_api api, const shape& s, float alpha, const device_matrix& a,
                       const device_matrix& b, float beta, const device_matrix& c) {
    switch (api) {
        case SGEMM:
            CUBLAS_CHECK(cublasSgemm(handle, s.ta, s.tb, s.m, s.n, s.k, &alpha, (const float*)a.ptr, s.lda,
                                     (const float*)b.ptr, s.ldb, &beta, (float*)c.ptr, s.ldc));
            break;
        case GEMM_EX:
            CUBLAS_CHECK(cublasGemmEx(handle, s.ta, s.tb, s.m, s.n, s.k, &alpha, a.ptr, a.type, s.lda, b.ptr,
                                      b.type, s.ldb, &beta, c.ptr, c.type, s.ldc, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
            break;
        case SGEMM_STRIDED_BATCHED:
            CUBLAS_CHECK(cublasSgemmStridedBatched(handle, s.ta, s.tb, s.m, s.n, s.k, &alpha, (const float*)a.ptr,
                                                   s.lda, s.stride_a, (const float*)b.ptr, s.ldb, s.stride_b, &beta,
                                                   (float*)c.ptr, s.ldc, s.stride_c, s.batch));
            break;
        case GEMM_STRIDED_BATCHED_EX:
            CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, s.ta, s.tb, s.m, s.n, s.k, &alpha, a.ptr, a.type, s.lda,
                                                    s.stride_a, b.ptr, b.type, s.ldb, s.stride_b, &beta, c.ptr,
                                                    c.type, s.ldc, s.stride_c, s.batch, CUBLAS_COMPUTE_32F,
                                                    CUBLAS_GEMM_DEFAULT));
            break;
    }
}

static void test_cublas(cublasHandle_t handle, gemm_api api, cudaDataType type) {
    bool batched = api == SGEMM_STRIDED_BATCHED || api == GEMM_STRIDED_BATCHED_EX;
    float tolerance = type == CUDA_R_32F ? FP32_TOLERANCE : BF16_TOLERANCE;
    const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
    for (cublasOperation_t ta : ops) {
        for (cublasOperation_t tb : ops) {
            for (float beta : {0.0f, 0.5f}) {
                shape s = make_shape(ta, tb, 5, 7, 3, batched ? 3 : 1);
                size_t na = s.stride_a * s.batch, nb = s.stride_b * s.batch, nc = s.stride_c * s.batch;
                std::vector<float> a = as_type(random_vector(na, 1), type);
                std::vector<float> b = as_type(random_vector(nb, 2), type);
                std::vector<float> c = as_type(random_vector(nc, 3), type);
                device_matrix da = upload(a, type), db = upload(b, type), dc = upload(c, type);
                if (beta == 0.0f) {  // C may hold anything, NaNs included, when beta is 0
                    CUDA_CHECK(cudaMemset(dc.ptr, 0xFF, nc * (type == CUDA_R_32F ? 4 : 2)));
                    for (float& v : c) { v = NAN; }
                }
                float alpha = 1.5f;
                run_cublas(handle, api, s, alpha, da, db, beta, dc);
                std::vector<float> got = download(dc);
                std::vector<float> want = naive_gemm(s, alpha, a, b, beta, c);
                // compare only the m x n elements of each batch; the padding must stay untouched
                float err = 0.0f;
                for (int p = 0; p < s.batch; p++) {
                    for (int j = 0; j < s.n; j++) {
                        long long at = p * s.stride_c + (long long)j * s.ldc;
                        float e = max_rel_error(&got[at], &want[at], s.m);
                        err = e > err ? e : err;
                    }
                }
                char name[128];
                snprintf(name, sizeof name, "%s %s op(A)=%c op(B)=%c beta=%g", API_NAMES[api],
                         type == CUDA_R_32F ? "fp32" : "bf16", ta == CUBLAS_OP_N ? 'N' : 'T',
                         tb == CUBLAS_OP_N ? 'N' : 'T', beta);
                check(err <= tolerance, name, "max relative error %g", err);
                CUDA_CHECK(cudaFree(da.ptr));
                CUDA_CHECK(cudaFree(db.ptr));
                CUDA_CHECK(cudaFree(dc.ptr));
            }
        }
    }
}

// ----------------------------------------------------------------------------
// cuBLASLt

// an epilogue and the descriptor pointers it uses (cublasLt.h); a real cuBLASLt refuses a matmul
// whose descriptor sets a pointer the epilogue does not use, or lacks one it needs
struct lt_case {
    cublasLtEpilogue_t epilogue;
    const char* name;
    bool uses_bias;   // CUBLASLT_MATMUL_DESC_BIAS_POINTER: bias added, or bias gradient written
    bool uses_aux;    // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: GELU input written (_AUX) or read (DGELU)
};

static const lt_case LT_CASES[] = {
    {CUBLASLT_EPILOGUE_DEFAULT, "DEFAULT", false, false},     {CUBLASLT_EPILOGUE_BIAS, "BIAS", true, false},
    {CUBLASLT_EPILOGUE_GELU, "GELU", false, false},           {CUBLASLT_EPILOGUE_GELU_BIAS, "GELU_BIAS", true, false},
    {CUBLASLT_EPILOGUE_GELU_AUX, "GELU_AUX", false, true},    {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, "GELU_AUX_BIAS", true, true},
    {CUBLASLT_EPILOGUE_DGELU, "DGELU", false, true},          {CUBLASLT_EPILOGUE_BGRADA, "BGRADA", true, false},
    {CUBLASLT_EPILOGUE_BGRADB, "BGRADB", true, false},
};

// whether cuBLASLt has an algorithm for the epilogue and transposes: the bias gradient of BGRADA
// needs A stored m x k (op(A)=N), that of BGRADB needs B stored n x k (op(B)=T)
static bool lt_has_algorithm(cublasLtEpilogue_t epilogue, cublasOperation_t ta, cublasOperation_t tb) {
    if (epilogue == CUBLASLT_EPILOGUE_BGRADA) { return ta == CUBLAS_OP_N; }
    if (epilogue == CUBLASLT_EPILOGUE_BGRADB) { return tb == CUBLAS_OP_T; }
    return true;
}

// a fp32 matmul descriptor; the bias and aux pointers are set when not null
static cublasLtMatmulDesc_t lt_descriptor(cublasLtEpilogue_t epilogue, cublasOperation_t ta, cublasOperation_t tb,
                                          void* bias, void* aux, int64_t aux_ld) {
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t opa = ta, opb = tb;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (bias != nullptr) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    if (aux != nullptr) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
    }
    return desc;
}

// the preference every call here uses: no workspace
static cublasLtMatmulPreference_t lt_preference() {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t workspace_bytes = 0;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes, sizeof workspace_bytes));
    return pref;
}

static cublasLtMatrixLayout_t lt_layout(cudaDataType type, int rows, int cols, int ld, int batch, long long stride) {
    cublasLtMatrixLayout_t l;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld));
    if (batch > 1) {
        int32_t count = batch;
        int64_t offset = stride;
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset,
                                                      sizeof offset));
    }
    return l;
}

// the expected D (and bias output) of one cublasLt call, from the naive GEMM and the CPU GELU
static void expected_lt(const lt_case& t, const shape& s, const std::vector<float>& pre, const std::vector<float>& a,
                        const std::vector<float>& b, const std::vector<float>& bias, const std::vector<float>& aux_in,
                        std::vector<float>* d, std::vector<float>* aux_out, std::vector<float>* bias_grad) {
    bool add_bias = t.epilogue == CUBLASLT_EPILOGUE_BIAS || t.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS ||
                    t.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    bool gelu = t.epilogue == CUBLASLT_EPILOGUE_GELU || t.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS ||
                t.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || t.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    *d = pre;
    for (int j = 0; j < s.n; j++) {
        for (int i = 0; i < s.m; i++) {
            size_t at = i + (size_t)j * s.ldc;
            float x = pre[at] + (add_bias ? bias[i] : 0.0f);
            (*aux_out)[at] = x;
            if (gelu) { gelu_forward(&x, &x, 1); }
            if (t.epilogue == CUBLASLT_EPILOGUE_DGELU) {
                float dx = 0.0f;
                gelu_backward(&dx, &aux_in[at], &pre[at], 1);
                x = dx;
            }
            (*d)[at] = x;
        }
    }
    if (t.epilogue == CUBLASLT_EPILOGUE_BGRADB) {  // n sums over k of op(B)
        bias_grad->assign(s.n, 0.0f);
        for (int j = 0; j < s.n; j++) {
            for (int l = 0; l < s.k; l++) { (*bias_grad)[j] += op_at(b, s.tb, s.ldb, 0, l, j); }
        }
    }
    if (t.epilogue == CUBLASLT_EPILOGUE_BGRADA) {  // m sums over k of op(A)
        bias_grad->assign(s.m, 0.0f);
        for (int i = 0; i < s.m; i++) {
            for (int l = 0; l < s.k; l++) { (*bias_grad)[i] += op_at(a, s.ta, s.lda, 0, i, l); }
        }
    }
}

// one matmul per epilogue and transposes, with only the pointers the epilogue uses; where cuBLASLt
// has no algorithm (BGRADA with op(A)=T, BGRADB with op(B)=N) the heuristic must say so
static void test_cublaslt_epilogues(cublasLtHandle_t lt) {
    const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
    for (const lt_case& t : LT_CASES) {
        bool ok = true;
        char detail[160] = "";
        for (cublasOperation_t ta : ops) {
            for (cublasOperation_t tb : ops) {
                shape s = make_shape(ta, tb, 6, 5, 7, 1);
                size_t nd = (size_t)s.ldc * s.n;
                std::vector<float> a = random_vector(s.stride_a, 11), b = random_vector(s.stride_b, 12);
                std::vector<float> bias = random_vector(s.m > s.n ? s.m : s.n, 13), aux_in = random_vector(nd, 14);
                std::vector<float> c(nd, 0.0f);
                float alpha = 0.75f, beta = 0.0f;
                std::vector<float> pre = naive_gemm(s, alpha, a, b, beta, c);
                std::vector<float> want_d, want_aux(nd, 0.0f), want_bias;
                expected_lt(t, s, pre, a, b, bias, aux_in, &want_d, &want_aux, &want_bias);

                device_matrix da = upload(a, CUDA_R_32F), db = upload(b, CUDA_R_32F), dd = upload(c, CUDA_R_32F);
                device_matrix dbias = upload(bias, CUDA_R_32F), daux = upload(aux_in, CUDA_R_32F);
                cublasLtMatmulDesc_t desc = lt_descriptor(t.epilogue, ta, tb, t.uses_bias ? dbias.ptr : nullptr,
                                                          t.uses_aux ? daux.ptr : nullptr, s.ldc);
                cublasLtMatrixLayout_t la = lt_layout(CUDA_R_32F, ta == CUBLAS_OP_N ? s.m : s.k,
                                                      ta == CUBLAS_OP_N ? s.k : s.m, s.lda, 1, 0);
                cublasLtMatrixLayout_t lb = lt_layout(CUDA_R_32F, tb == CUBLAS_OP_N ? s.k : s.n,
                                                      tb == CUBLAS_OP_N ? s.n : s.k, s.ldb, 1, 0);
                cublasLtMatrixLayout_t ld = lt_layout(CUDA_R_32F, s.m, s.n, s.ldc, 1, 0);
                cublasLtMatmulPreference_t pref = lt_preference();
                cublasLtMatmulHeuristicResult_t heuristic;
                int found = 0;
                cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heuristic, &found);
                float err = 0.0f;
                bool expected_outcome;
                if (!lt_has_algorithm(t.epilogue, ta, tb)) {
                    expected_outcome = hs == CUBLAS_STATUS_NOT_SUPPORTED && found == 0;
                } else {
                    expected_outcome = hs == CUBLAS_STATUS_SUCCESS && found == 1;
                    if (expected_outcome) {
                        CUBLAS_CHECK(cublasLtMatmul(lt, desc, &alpha, da.ptr, la, db.ptr, lb, &beta, dd.ptr, ld, dd.ptr,
                                                    ld, &heuristic.algo, nullptr, 0, 0));
                    }
                    std::vector<float> got_d = download(dd), got_aux = download(daux), got_bias = download(dbias);
                    bool stores_aux = t.epilogue == CUBLASLT_EPILOGUE_GELU_AUX ||
                                      t.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
                    for (int j = 0; j < s.n; j++) {
                        size_t at = (size_t)j * s.ldc;
                        err = fmaxf(err, max_rel_error(&got_d[at], &want_d[at], s.m));
                        if (stores_aux) { err = fmaxf(err, max_rel_error(&got_aux[at], &want_aux[at], s.m)); }
                    }
                    if (!want_bias.empty()) {
                        err = fmaxf(err, max_rel_error(got_bias.data(), want_bias.data(), want_bias.size()));
                    }
                }
                if (!expected_outcome || err > FP32_TOLERANCE) {
                    if (ok) {
                        snprintf(detail, sizeof detail, "op(A)=%c op(B)=%c: heuristic status %d, %d algos (%s), "
                                 "max relative error %g", ta == CUBLAS_OP_N ? 'N' : 'T', tb == CUBLAS_OP_N ? 'N' : 'T',
                                 (int)hs, found, lt_has_algorithm(t.epilogue, ta, tb) ? "want 0 and 1 algo" : "want 15 and none",
                                 err);
                    }
                    ok = false;
                }
                cublasLtMatmulPreferenceDestroy(pref);
                cublasLtMatrixLayoutDestroy(la);
                cublasLtMatrixLayoutDestroy(lb);
                cublasLtMatrixLayoutDestroy(ld);
                cublasLtMatmulDescDestroy(desc);
                for (device_matrix* m : {&da, &db, &dd, &dbias, &daux}) { CUDA_CHECK(cudaFree(m->ptr)); }
            }
        }
        char name[128];
        snprintf(name, sizeof name, "cublasLtMatmul epilogue %s, all transposes%s", t.name,
                 t.epilogue == CUBLASLT_EPILOGUE_BGRADA   ? " (op(A)=T: no algorithm)"
                 : t.epilogue == CUBLASLT_EPILOGUE_BGRADB ? " (op(B)=N: no algorithm)"
                                                          : "");
        check(ok, name, "%s", detail);
    }
}

// descriptors a real cuBLASLt (CUDA 13, H100) refuses at cublasLtMatmul although the heuristic found
// an algorithm; D must stay untouched. One accepted case shows that an unused aux pointer is not
// always an error. Every case here is a line of tests/data/cublaslt_h100_cuda13.0_driver580.txt.
static void test_cublaslt_refusals(cublasLtHandle_t lt) {
    const struct {
        const char* what;
        cublasLtEpilogue_t epilogue;
        bool set_bias, set_aux;
        cublasStatus_t want;
    } cases[] = {
        {"DEFAULT with bias and aux pointers", CUBLASLT_EPILOGUE_DEFAULT, true, true, CUBLAS_STATUS_INVALID_VALUE},
        {"GELU with bias and aux pointers", CUBLASLT_EPILOGUE_GELU, true, true, CUBLAS_STATUS_INVALID_VALUE},
        {"DGELU with bias and aux pointers", CUBLASLT_EPILOGUE_DGELU, true, true, CUBLAS_STATUS_INVALID_VALUE},
        {"BIAS without a bias pointer", CUBLASLT_EPILOGUE_BIAS, false, false, CUBLAS_STATUS_INVALID_VALUE},
        {"BGRADB without a bias pointer", CUBLASLT_EPILOGUE_BGRADB, false, false, CUBLAS_STATUS_INVALID_VALUE},
        {"DGELU without an aux pointer", CUBLASLT_EPILOGUE_DGELU, false, false, CUBLAS_STATUS_INVALID_VALUE},
        {"GELU_AUX without an aux pointer", CUBLASLT_EPILOGUE_GELU_AUX, false, false, CUBLAS_STATUS_NOT_SUPPORTED},
        {"GELU_BIAS with an aux pointer too", CUBLASLT_EPILOGUE_GELU_BIAS, true, true, CUBLAS_STATUS_NOT_SUPPORTED},
        {"BIAS with an aux pointer too", CUBLASLT_EPILOGUE_BIAS, true, true, CUBLAS_STATUS_SUCCESS},
    };
    shape s = make_shape(CUBLAS_OP_N, CUBLAS_OP_T, 6, 5, 7, 1);
    size_t nd = (size_t)s.ldc * s.n;
    std::vector<float> d_before = random_vector(nd, 31);
    device_matrix da = upload(random_vector(s.stride_a, 32), CUDA_R_32F);
    device_matrix db = upload(random_vector(s.stride_b, 33), CUDA_R_32F);
    device_matrix dbias = upload(random_vector(s.m > s.n ? s.m : s.n, 34), CUDA_R_32F);
    device_matrix daux = upload(random_vector(nd, 35), CUDA_R_32F);
    cublasLtMatrixLayout_t la = lt_layout(CUDA_R_32F, s.m, s.k, s.lda, 1, 0);
    cublasLtMatrixLayout_t lb = lt_layout(CUDA_R_32F, s.n, s.k, s.ldb, 1, 0);
    cublasLtMatrixLayout_t ld = lt_layout(CUDA_R_32F, s.m, s.n, s.ldc, 1, 0);
    cublasLtMatmulPreference_t pref = lt_preference();
    for (const auto& t : cases) {
        device_matrix dd = upload(d_before, CUDA_R_32F);
        cublasLtMatmulDesc_t desc = lt_descriptor(t.epilogue, s.ta, s.tb, t.set_bias ? dbias.ptr : nullptr,
                                                  t.set_aux ? daux.ptr : nullptr, s.ldc);
        cublasLtMatmulHeuristicResult_t heuristic;
        int found = 0;
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heuristic, &found);
        int ms = MATMUL_NOT_CALLED;
        float alpha = 1.0f, beta = 0.0f;
        if (hs == CUBLAS_STATUS_SUCCESS && found == 1) {
            ms = (int)cublasLtMatmul(lt, desc, &alpha, da.ptr, la, db.ptr, lb, &beta, dd.ptr, ld, dd.ptr, ld, &heuristic.algo,
                                nullptr, 0, 0);
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> d_after = download(dd);
        bool untouched = memcmp(d_after.data(), d_before.data(), nd * sizeof(float)) == 0;
        bool ok = hs == CUBLAS_STATUS_SUCCESS && found == 1 && ms == (int)t.want &&
                  (t.want == CUBLAS_STATUS_SUCCESS ? !untouched : untouched);
        char name[128];
        snprintf(name, sizeof name, "cublasLtMatmul, %s: %s", t.what, cublasGetStatusName(t.want));
        check(ok, name, "heuristic %d with %d algos, cublasLtMatmul %d (-1: not called), D %s", (int)hs, found, ms,
              untouched ? "untouched" : "written");
        cublasLtMatmulDescDestroy(desc);
        CUDA_CHECK(cudaFree(dd.ptr));
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    for (device_matrix* m : {&da, &db, &dbias, &daux}) { CUDA_CHECK(cudaFree(m->ptr)); }
}

// ----------------------------------------------------------------------------
// alignment: the heuristic chooses for operands aligned as the preference says (default 256 bytes)

static const size_t MISALIGN_FLOATS = 4;   // 16 bytes past a cudaMalloc'd (256-byte aligned) start

// one GEMM of test_cublaslt_alignment: A, B, D (D also as C) each at its own byte offset from a
// 256-byte start, the preference's MIN_ALIGNMENT_A (0: not set), the workspace at its offset (or
// none), the algorithm from the heuristic or NULL; returns cublasLtMatmul's status, and in *correct
// whether D is then the naive GEMM's (and untouched when refused)
struct align_case {
    const char* what;
    size_t a_floats, d_floats;    // offsets, in floats
    uint32_t pref_align_a;
    bool workspace;
    size_t workspace_offset;      // bytes
    bool pass_algo;
    cublasStatus_t emulated;      // the emulator's answer (rules 8 and 9 of emu_lt_rules.cpp)
};

static cublasStatus_t run_align_case(cublasLtHandle_t lt, const align_case& t, bool* correct) {
    shape s = make_shape(CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, 1);
    std::vector<float> a = random_vector(s.stride_a, 41), b = random_vector(s.stride_b, 42), d = random_vector(s.stride_c, 43);
    std::vector<float> pa(t.a_floats, 0.0f), pd(t.d_floats, 0.0f);
    pa.insert(pa.end(), a.begin(), a.end());
    pd.insert(pd.end(), d.begin(), d.end());
    device_matrix da = upload(pa, CUDA_R_32F), db = upload(b, CUDA_R_32F), dd = upload(pd, CUDA_R_32F);
    float* A = (float*)da.ptr + t.a_floats;
    float* D = (float*)dd.ptr + t.d_floats;
    const size_t WORKSPACE_BYTES = 1 << 20;
    char* workspace = nullptr;
    if (t.workspace) { CUDA_CHECK(cudaMalloc((void**)&workspace, WORKSPACE_BYTES + t.workspace_offset)); }
    cublasLtMatmulDesc_t desc = lt_descriptor(CUBLASLT_EPILOGUE_DEFAULT, s.ta, s.tb, nullptr, nullptr, s.ldc);
    cublasLtMatrixLayout_t la = lt_layout(CUDA_R_32F, s.m, s.k, s.lda, 1, 0);
    cublasLtMatrixLayout_t lb = lt_layout(CUDA_R_32F, s.k, s.n, s.ldb, 1, 0);
    cublasLtMatrixLayout_t ld = lt_layout(CUDA_R_32F, s.m, s.n, s.ldc, 1, 0);
    cublasLtMatmulPreference_t pref = lt_preference();
    if (t.pref_align_a != 0) {
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &t.pref_align_a,
                                                          sizeof t.pref_align_a));
    }
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heuristic, &found));
    float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t status = cublasLtMatmul(lt, desc, &alpha, A, la, db.ptr, lb, &beta, D, ld, D, ld,
                                           t.pass_algo ? &heuristic.algo : nullptr, workspace ? workspace + t.workspace_offset : nullptr,
                                           workspace ? WORKSPACE_BYTES : 0, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got = download(dd);
    got.erase(got.begin(), got.begin() + t.d_floats);
    std::vector<float> want = status == CUBLAS_STATUS_SUCCESS ? naive_gemm(s, alpha, a, b, beta, d) : d;
    *correct = found == 1 && max_rel_error(got.data(), want.data(), want.size()) <= FP32_TOLERANCE;
    cublasLtMatmulPreferenceDestroy(pref);
    for (cublasLtMatrixLayout_t l : {la, lb, ld}) { cublasLtMatrixLayoutDestroy(l); }
    cublasLtMatmulDescDestroy(desc);
    for (device_matrix* m : {&da, &db, &dd}) { CUDA_CHECK(cudaFree(m->ptr)); }
    if (workspace) { CUDA_CHECK(cudaFree(workspace)); }
    return status;
}

// emulated, an operand below the alignment its algorithm was chosen for, or a workspace off 256
// bytes, is refused and D left as it was; a preference that admits the operand's alignment runs.
// On a GPU the cases that must run are checked, and what the library did with the others is printed
static void test_cublaslt_alignment(cublasLtHandle_t lt) {
    const size_t M = MISALIGN_FLOATS, W = MISALIGN_FLOATS * sizeof(float);
    const align_case cases[] = {
        {"A 16 bytes off, the default preference (256)", M, 0, 0, false, 0, true, CUBLAS_STATUS_INVALID_VALUE},
        {"A 16 bytes off, MIN_ALIGNMENT_A_BYTES = 16", M, 0, 16, false, 0, true, CUBLAS_STATUS_SUCCESS},
        {"A 16 bytes off, MIN_ALIGNMENT_A_BYTES = 32", M, 0, 32, false, 0, true, CUBLAS_STATUS_INVALID_VALUE},
        {"D 16 bytes off, no algorithm given (the default preference)", 0, M, 0, false, 0, false, CUBLAS_STATUS_INVALID_VALUE},
        {"every operand at 256, no algorithm given", 0, 0, 0, false, 0, false, CUBLAS_STATUS_SUCCESS},
        {"a workspace 16 bytes off 256", 0, 0, 0, true, W, true, CUBLAS_STATUS_INVALID_VALUE},
        {"a workspace at 256", 0, 0, 0, true, 0, true, CUBLAS_STATUS_SUCCESS},
    };
    for (const align_case& t : cases) {
        bool correct = false;
        cublasStatus_t status = run_align_case(lt, t, &correct);
        char name[160];
        snprintf(name, sizeof name, "cublasLtMatmul alignment, %s: %s", t.what, cublasGetStatusName(t.emulated));
        if (EMULATED || t.emulated == CUBLAS_STATUS_SUCCESS) {
            check(status == t.emulated && correct, name, "got status %d, D %s", (int)status,
                  correct ? "as expected" : "wrong (or written though refused)");
        } else {
            printf("note: real cuBLASLt, %s: status %d, D %s\n", t.what, (int)status, correct ? "as the status says" : "wrong");
        }
    }
}

// a strided batch described by the layouts alone, bf16 in and out, with a bias epilogue
static void test_cublaslt_batched_bf16(cublasLtHandle_t lt) {
    shape s = make_shape(CUBLAS_OP_T, CUBLAS_OP_N, 4, 6, 5, 3);
    size_t na = s.stride_a * s.batch, nb = s.stride_b * s.batch, nc = s.stride_c * s.batch;
    std::vector<float> a = as_type(random_vector(na, 21), CUDA_R_16BF);
    std::vector<float> b = as_type(random_vector(nb, 22), CUDA_R_16BF);
    std::vector<float> c = as_type(random_vector(nc, 23), CUDA_R_16BF);
    std::vector<float> bias = as_type(random_vector(s.m, 24), CUDA_R_16BF);
    float alpha = 1.0f, beta = 1.0f;
    std::vector<float> want = naive_gemm(s, alpha, a, b, beta, c);
    device_matrix da = upload(a, CUDA_R_16BF), db = upload(b, CUDA_R_16BF), dc = upload(c, CUDA_R_16BF);
    device_matrix dbias = upload(bias, CUDA_R_16BF);
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t opa = s.ta;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias.ptr, sizeof dbias.ptr));
    cublasLtMatrixLayout_t la = lt_layout(CUDA_R_16BF, s.k, s.m, s.lda, s.batch, s.stride_a);
    cublasLtMatrixLayout_t lb = lt_layout(CUDA_R_16BF, s.k, s.n, s.ldb, s.batch, s.stride_b);
    cublasLtMatrixLayout_t lc = lt_layout(CUDA_R_16BF, s.m, s.n, s.ldc, s.batch, s.stride_c);
    CUBLAS_CHECK(cublasLtMatmul(lt, desc, &alpha, da.ptr, la, db.ptr, lb, &beta, dc.ptr, lc, dc.ptr, lc, nullptr,
                                nullptr, 0, 0));
    std::vector<float> got = download(dc);
    float err = 0.0f;
    for (int p = 0; p < s.batch; p++) {
        for (int j = 0; j < s.n; j++) {
            for (int i = 0; i < s.m; i++) {
                long long at = p * s.stride_c + i + (long long)j * s.ldc;
                float w = want[at] + bias[i];
                float e = fabsf(got[at] - w) / fmaxf(1.0f, fabsf(w));
                err = e > err ? e : err;
            }
        }
    }
    check(err <= BF16_TOLERANCE, "cublasLtMatmul bf16, BATCH_COUNT 3 + STRIDED_BATCH_OFFSET, BIAS, beta 1",
          "max relative error %g", err);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    for (device_matrix* m : {&da, &db, &dc, &dbias}) { CUDA_CHECK(cudaFree(m->ptr)); }
}

// ----------------------------------------------------------------------------
// bitwise: the emulator's GEMM is the in-order fp32 loop

// what cublasLt.h documents each epilogue to do (D has m rows; bias and its gradients per batch)
struct epilogue_steps {
    bool add_bias, relu, gelu, store_aux, dgelu, bias_grad_from_d, bias_grad_from_a, bias_grad_from_b;
};

static epilogue_steps steps_of(cublasLtEpilogue_t e) {
    epilogue_steps s = {};
    s.add_bias = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                 e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    s.relu = e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS;
    s.gelu = e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX ||
             e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    s.store_aux = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    s.dgelu = e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    s.bias_grad_from_d = e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    s.bias_grad_from_a = e == CUBLASLT_EPILOGUE_BGRADA;
    s.bias_grad_from_b = e == CUBLASLT_EPILOGUE_BGRADB;
    return s;
}

// one cublasLtMatmul's buffers on the host, as fp32 values of `type` (C, D, aux, bias all of it)
struct lt_buffers {
    std::vector<float> a, b, c, d, aux, bias;
};

// the bias (or bias gradient) of one batch has m elements, or n for BGRADB
static int bias_length(const shape& s, const epilogue_steps& e) { return e.bias_grad_from_b ? s.n : s.m; }

// D, aux and bias as the in-order fp32 loop computes them: each product rounded to fp32 and added
// in order l = 0..k-1, then alpha, beta, the epilogue in fp32, and one rounding to the output type
static void inorder_lt(const shape& s, cudaDataType type, const epilogue_steps& e, float alpha, float beta,
                       lt_buffers* x) {
    int bias_n = bias_length(s, e);
    for (int p = 0; p < s.batch; p++) {
        std::vector<float> row_sums(s.m, 0.0f);
        for (int j = 0; j < s.n; j++) {
            for (int i = 0; i < s.m; i++) {
                float acc = 0.0f;
                for (int l = 0; l < s.k; l++) {
                    acc += op_at(x->a, s.ta, s.lda, p * s.stride_a, i, l) * op_at(x->b, s.tb, s.ldb, p * s.stride_b, l, j);
                }
                long long at = p * s.stride_c + i + (long long)j * s.ldc;
                float v = alpha * acc;
                if (beta != 0.0f) { v += beta * x->c[at]; }
                if (e.add_bias) { v += x->bias[p * bias_n + i]; }
                if (e.store_aux) { x->aux[at] = round_to(type, v); }
                if (e.relu) { v = v > 0.0f ? v : 0.0f; }
                if (e.gelu) { gelu_forward(&v, &v, 1); }
                if (e.dgelu) {
                    float grad = 0.0f, one = 1.0f;
                    gelu_backward(&grad, &x->aux[at], &one, 1);  // gelu'(aux)
                    v *= grad;
                }
                row_sums[i] += v;
                x->d[at] = round_to(type, v);
            }
        }
        for (int i = 0; i < s.m && e.bias_grad_from_d; i++) { x->bias[p * bias_n + i] = round_to(type, row_sums[i]); }
        for (int i = 0; i < s.m && e.bias_grad_from_a; i++) {
            float sum = 0.0f;
            for (int l = 0; l < s.k; l++) { sum += op_at(x->a, s.ta, s.lda, p * s.stride_a, i, l); }
            x->bias[p * bias_n + i] = round_to(type, sum);
        }
        for (int j = 0; j < s.n && e.bias_grad_from_b; j++) {
            float sum = 0.0f;
            for (int l = 0; l < s.k; l++) { sum += op_at(x->b, s.tb, s.ldb, p * s.stride_b, l, j); }
            x->bias[p * bias_n + j] = round_to(type, sum);
        }
    }
}

// how far got is from want: 0 when bitwise equal; else the largest relative error, at least 1e-30
static float distance(const std::vector<float>& got, const std::vector<float>& want) {
    if (got.size() == want.size() && memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0) { return 0.0f; }
    float err = max_rel_error(got.data(), want.data(), want.size());
    return err > 1e-30f ? err : 1e-30f;
}

// run one cublasLtMatmul on x (D, aux and bias are overwritten with the results); false if the
// library has no algorithm for the descriptor (a real GPU refuses some epilogue/transpose pairs)
static bool run_lt(cublasLtHandle_t lt, const shape& s, cudaDataType type, cublasLtEpilogue_t epilogue, float alpha,
                   float beta, lt_buffers* x) {
    epilogue_steps e = steps_of(epilogue);
    device_matrix da = upload(x->a, type), db = upload(x->b, type), dc = upload(x->c, type);
    device_matrix dd = upload(x->d, type), daux = upload(x->aux, type), dbias = upload(x->bias, type);
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t opa = s.ta, opb = s.tb;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    // only the pointers the epilogue uses: the real library refuses the others
    if (e.add_bias || e.bias_grad_from_a || e.bias_grad_from_b || e.bias_grad_from_d) {
        int64_t bias_stride = bias_length(s, e);
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias.ptr, sizeof dbias.ptr));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias_stride,
                                                    sizeof bias_stride));
    }
    if (e.store_aux || e.dgelu) {
        int64_t aux_ld = s.ldc, aux_stride = s.stride_c;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &daux.ptr,
                                                    sizeof daux.ptr));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &aux_stride,
                                                    sizeof aux_stride));
    }
    bool na = s.ta == CUBLAS_OP_N, nb = s.tb == CUBLAS_OP_N;
    cublasLtMatrixLayout_t la = lt_layout(type, na ? s.m : s.k, na ? s.k : s.m, s.lda, s.batch, s.stride_a);
    cublasLtMatrixLayout_t lb = lt_layout(type, nb ? s.k : s.n, nb ? s.n : s.k, s.ldb, s.batch, s.stride_b);
    cublasLtMatrixLayout_t lc = lt_layout(type, s.m, s.n, s.ldc, s.batch, s.stride_c);
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heuristic, &found);
    bool supported = status == CUBLAS_STATUS_SUCCESS && found == 1;
    if (supported) {
        CUBLAS_CHECK(cublasLtMatmul(lt, desc, &alpha, da.ptr, la, db.ptr, lb, &beta, dc.ptr, lc, dd.ptr, lc,
                                    &heuristic.algo, nullptr, 0, 0));
        x->d = download(dd);
        x->aux = download(daux);
        x->bias = download(dbias);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    for (device_matrix* m : {&da, &db, &dc, &dd, &daux, &dbias}) { CUDA_CHECK(cudaFree(m->ptr)); }
    return supported;
}

// shapes around the emulator's 8 x 6 output tiles: smaller, exact, ragged, long k, batched
struct bitwise_shape {
    int m, n, k, batch;
};
static const bitwise_shape BITWISE_SHAPES[] = {{1, 1, 1, 1}, {8, 6, 64, 1}, {19, 13, 37, 1}, {17, 7, 130, 2}};

static const char* type_name(cudaDataType type) {
    return type == CUDA_R_32F ? "fp32" : type == CUDA_R_16BF ? "bf16" : "fp16";
}

static float tolerance_of(cudaDataType type) {
    return type == CUDA_R_32F ? FP32_TOLERANCE : type == CUDA_R_16BF ? BF16_TOLERANCE : FP16_TOLERANCE;
}

// every transpose and shape of one type and epilogue (beta 0.5 where C is read, else 0 with NaN in C)
static void test_bitwise_epilogue(cublasLtHandle_t lt, cudaDataType type, const lt_case& t) {
    epilogue_steps e = steps_of(t.epilogue);
    const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
    float worst = 0.0f;
    int refused = 0, cases = 0;
    char detail[160] = "";
    for (const bitwise_shape& bs : BITWISE_SHAPES) {
        for (cublasOperation_t ta : ops) {
            for (cublasOperation_t tb : ops) {
                if (!lt_has_algorithm((cublasLtEpilogue_t)t.epilogue, ta, tb)) { continue; }  // refused, as on the H100 (test_lt_refusals)
                shape s = make_shape(ta, tb, bs.m, bs.n, bs.k, bs.batch);
                float alpha = 0.75f, beta = t.epilogue == CUBLASLT_EPILOGUE_DEFAULT ? 0.5f : 0.0f;
                size_t nd = s.stride_c * s.batch;
                unsigned seed = 100 + 10 * cases;
                lt_buffers want;
                want.a = as_type(random_vector(s.stride_a * s.batch, seed), type);
                want.b = as_type(random_vector(s.stride_b * s.batch, seed + 1), type);
                want.c = as_type(random_vector(nd, seed + 2), type);
                if (beta == 0.0f) { want.c.assign(nd, NAN); }  // not read when beta is 0
                want.d = as_type(random_vector(nd, seed + 3), type);   // outside the m x n results: kept
                want.aux = as_type(random_vector(nd, seed + 4), type);
                want.bias = as_type(random_vector((size_t)bias_length(s, e) * s.batch, seed + 5), type);
                lt_buffers got = want;
                cases++;
                if (!run_lt(lt, s, type, t.epilogue, alpha, beta, &got)) {
                    refused++;
                    continue;
                }
                inorder_lt(s, type, e, alpha, beta, &want);
                float err = distance(got.d, want.d);
                if (e.store_aux) { err = fmaxf(err, distance(got.aux, want.aux)); }
                if (e.bias_grad_from_a || e.bias_grad_from_b || e.bias_grad_from_d) { err = fmaxf(err, distance(got.bias, want.bias)); }
                if (err > worst) {
                    worst = err;
                    snprintf(detail, sizeof detail, "m=%d n=%d k=%d batch %d op(A)=%c op(B)=%c: max relative error %g",
                             bs.m, bs.n, bs.k, bs.batch, ta == CUBLAS_OP_N ? 'N' : 'T', tb == CUBLAS_OP_N ? 'N' : 'T', err);
                }
            }
        }
    }
    char name[160];
    if (EMULATED) {
        snprintf(name, sizeof name, "bitwise: cublasLtMatmul %s %s = the in-order fp32 loop (%d cases)", type_name(type),
                 t.name, cases);
        check(worst == 0.0f && refused == 0, name, "%s%s", refused ? "descriptors refused; " : "", detail);
    } else {
        snprintf(name, sizeof name, "cublasLtMatmul %s %s within %g of the in-order loop (%d cases, %d refused)",
                 type_name(type), t.name, tolerance_of(type), cases, refused);
        check(worst <= tolerance_of(type), name, "%s", detail);
    }
}

static void test_bitwise(cublasLtHandle_t lt) {
    const lt_case cases[] = {
        {CUBLASLT_EPILOGUE_DEFAULT, "DEFAULT"},   {CUBLASLT_EPILOGUE_BIAS, "BIAS"},
        {CUBLASLT_EPILOGUE_RELU, "RELU"},         {CUBLASLT_EPILOGUE_RELU_BIAS, "RELU_BIAS"},
        {CUBLASLT_EPILOGUE_GELU, "GELU"},         {CUBLASLT_EPILOGUE_GELU_BIAS, "GELU_BIAS"},
        {CUBLASLT_EPILOGUE_GELU_AUX, "GELU_AUX"}, {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, "GELU_AUX_BIAS"},
        {CUBLASLT_EPILOGUE_DGELU, "DGELU"},       {CUBLASLT_EPILOGUE_DGELU_BGRAD, "DGELU_BGRAD"},
        {CUBLASLT_EPILOGUE_BGRADA, "BGRADA"},     {CUBLASLT_EPILOGUE_BGRADB, "BGRADB"},
    };
    for (cudaDataType type : {CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F}) {
        for (const lt_case& t : cases) { test_bitwise_epilogue(lt, type, t); }
    }
}

int main() {
    cublasHandle_t handle;
    CUBLAS_CHECK(cublasCreate(&handle));
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    test_cublas(handle, SGEMM, CUDA_R_32F);
    test_cublas(handle, GEMM_EX, CUDA_R_32F);
    test_cublas(handle, GEMM_EX, CUDA_R_16BF);
    test_cublas(handle, SGEMM_STRIDED_BATCHED, CUDA_R_32F);
    test_cublas(handle, GEMM_STRIDED_BATCHED_EX, CUDA_R_32F);
    test_cublas(handle, GEMM_STRIDED_BATCHED_EX, CUDA_R_16BF);
    CUBLAS_CHECK(cublasDestroy(handle));

    cublasLtHandle_t lt;
    CUBLAS_CHECK(cublasLtCreate(&lt));
    test_cublaslt_epilogues(lt);
    test_cublaslt_refusals(lt);
    test_cublaslt_alignment(lt);
    test_cublaslt_batched_bf16(lt);
    test_bitwise(lt);
    CUBLAS_CHECK(cublasLtDestroy(lt));
    return check_summary();
}
