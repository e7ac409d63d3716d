/*
test_layers.cu: kernels of the kinds the CUDA trainer needs, compared with the project's one CPU
reference (cpu/layers.h): a LayerNorm with one warp per row and shuffle reductions, a causal
softmax with one block per row and shared-memory reductions, a linear layer through cuBLASLt with
a bias epilogue, and an AdamW update. Sizes are those of a tiny GPT-2 (C=64, NH=4, T=16, B=2).
*/
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdio.h>
#include <vector>
#include "check.h"
#include "cpu/layers.h"
#include "cpu/optimizers.h"

static const int B = 2, T = 16, C = 64, NH = 4, OC = 3 * C;
static const int WARP = 32;
static const unsigned FULL_MASK = 0xffffffffu;
static const float TOLERANCE = 1e-5f;
static const float LAYER_TOLERANCE = 1e-4f;  // GPU-style reduction orders differ from the CPU loop's

// ----------------------------------------------------------------------------
// kernels

__device__ float warp_sum(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2) { v += __shfl_xor_sync(FULL_MASK, v, offset); }
    return v;
}

// out (N,C) = layernorm of inp (N,C); one warp per row, mean and rstd (N) saved
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int N, int channels) {
    int lane = threadIdx.x % WARP;
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (row >= N) { return; }  // a whole warp leaves together: no shuffle misses a lane
    const float* x = inp + (size_t)row * channels;
    float sum = 0.0f;
    for (int c = lane; c < channels; c += WARP) { sum += x[c]; }
    float m = warp_sum(sum) / channels;
    float var = 0.0f;
    for (int c = lane; c < channels; c += WARP) { float d = x[c] - m; var += d * d; }
    float s = rsqrtf(warp_sum(var) / channels + LAYERNORM_EPS);
    for (int c = lane; c < channels; c += WARP) {
        out[(size_t)row * channels + c] = (x[c] - m) * s * weight[c] + bias[c];
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// att (rows, T): row r (position t = r % T) is the softmax of preatt's entries 0..t, zero after;
// one block per row, blockDim.x a power of 2, reductions through shared memory
__global__ void causal_softmax_forward_kernel(float* att, const float* preatt, int seq_len) {
    extern __shared__ float scratch[];  // (blockDim.x)
    int row = blockIdx.x, t = row % seq_len, tid = threadIdx.x;
    const float* p = preatt + (size_t)row * seq_len;
    float* a = att + (size_t)row * seq_len;

    float maxv = -FLT_MAX;
    for (int u = tid; u <= t; u += blockDim.x) { maxv = fmaxf(maxv, p[u]); }
    scratch[tid] = maxv;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (tid < stride) { scratch[tid] = fmaxf(scratch[tid], scratch[tid + stride]); }
        __syncthreads();
    }
    maxv = scratch[0];
    __syncthreads();  // everyone has read the max before scratch is reused

    float sum = 0.0f;
    for (int u = tid; u <= t; u += blockDim.x) { sum += expf(p[u] - maxv); }
    scratch[tid] = sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (tid < stride) { scratch[tid] += scratch[tid + stride]; }
        __syncthreads();
    }
    float inv = 1.0f / scratch[0];
    for (int u = tid; u < seq_len; u += blockDim.x) { a[u] = u <= t ? expf(p[u] - maxv) * inv : 0.0f; }
}

__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, float bias_correction1,
                             float bias_correction2) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float g = grads[i];
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bias_correction1, vhat = vi / bias_correction2;
    params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * params[i]);
}

// ----------------------------------------------------------------------------
// helpers

static float* to_device(const std::vector<float>& h) {
    float* d;
    CUDA_CHECK(cudaMalloc(&d, h.size() * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static std::vector<float> to_host(const float* d, size_t n) {
    std::vector<float> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

static std::vector<float> random_vector(size_t n, unsigned seed) {
    std::vector<float> x(n);
    fill_uniform(x.data(), n, seed);
    return x;
}

// ----------------------------------------------------------------------------
// checks

static void test_layernorm() {
    int N = B * T;
    std::vector<float> inp = random_vector((size_t)N * C, 1), w = random_vector(C, 2), b = random_vector(C, 3);
    std::vector<float> out(N * C), mean(N), rstd(N);
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), B, T, C);
    float *d_inp = to_device(inp), *d_w = to_device(w), *d_b = to_device(b), *d_out, *d_mean, *d_rstd;
    CUDA_CHECK(cudaMalloc(&d_out, N * C * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_mean, N * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_rstd, N * sizeof(float)));
    const int threads = 128, rows_per_block = threads / WARP;
    layernorm_forward_kernel<<<(N + rows_per_block - 1) / rows_per_block, threads>>>(d_out, d_mean, d_rstd, d_inp,
                                                                                     d_w, d_b, N, C);
    CUDA_CHECK(cudaGetLastError());
    float err = max_rel_error(to_host(d_out, N * C).data(), out.data(), N * C);
    float err_stats = fmaxf(max_rel_error(to_host(d_mean, N).data(), mean.data(), N),
                            max_rel_error(to_host(d_rstd, N).data(), rstd.data(), N));
    check(err <= LAYER_TOLERANCE && err_stats <= LAYER_TOLERANCE,
          "layernorm_forward: warp-per-row kernel vs cpu/layers.h", "out %g, mean/rstd %g", err, err_stats);
    for (float* p : {d_inp, d_w, d_b, d_out, d_mean, d_rstd}) { CUDA_CHECK(cudaFree(p)); }
}

static void test_causal_softmax() {
    size_t n = (size_t)B * NH * T * T;
    std::vector<float> preatt = random_vector(n, 4), att(n);
    for (float& x : preatt) { x *= 4.0f; }
    causal_softmax_forward(att.data(), preatt.data(), B, NH, T);
    float *d_pre = to_device(preatt), *d_att;
    CUDA_CHECK(cudaMalloc(&d_att, n * sizeof(float)));
    const int threads = 32;
    causal_softmax_forward_kernel<<<B * NH * T, threads, threads * sizeof(float)>>>(d_att, d_pre, T);
    CUDA_CHECK(cudaGetLastError());
    float err = max_rel_error(to_host(d_att, n).data(), att.data(), n);
    check(err <= LAYER_TOLERANCE, "causal_softmax_forward: block-per-row shared-memory kernel vs cpu/layers.h",
          "max relative error %g", err);
    CUDA_CHECK(cudaFree(d_pre));
    CUDA_CHECK(cudaFree(d_att));
}

// out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias: in cuBLAS's column-major terms
// D (OC x BT) = op(W) (OC x C) op(inp) (C x BT) with W stored C x OC (transposed), bias per row of D
static void test_matmul_bias() {
    int BT = B * T;
    std::vector<float> inp = random_vector((size_t)BT * C, 5), w = random_vector((size_t)OC * C, 6);
    std::vector<float> bias = random_vector(OC, 7), out((size_t)BT * OC);
    matmul_forward(out.data(), inp.data(), w.data(), bias.data(), B, T, C, OC);
    float *d_inp = to_device(inp), *d_w = to_device(w), *d_bias = to_device(bias), *d_out;
    CUDA_CHECK(cudaMalloc(&d_out, (size_t)BT * OC * sizeof(float)));

    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t transa = CUBLAS_OP_T;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &d_bias, sizeof d_bias);
    cublasLtMatrixLayout_t lw, linp, lout;
    cublasLtMatrixLayoutCreate(&lw, CUDA_R_32F, C, OC, C);
    cublasLtMatrixLayoutCreate(&linp, CUDA_R_32F, C, BT, C);
    cublasLtMatrixLayoutCreate(&lout, CUDA_R_32F, OC, BT, OC);
    float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t s = cublasLtMatmul(lt, desc, &alpha, d_w, lw, d_inp, linp, &beta, d_out, lout, d_out, lout,
                                      nullptr, nullptr, 0, 0);
    float err = max_rel_error(to_host(d_out, (size_t)BT * OC).data(), out.data(), (size_t)BT * OC);
    check(s == CUBLAS_STATUS_SUCCESS && err <= TOLERANCE,
          "matmul_forward: cublasLtMatmul with the BIAS epilogue vs cpu/layers.h",
          "status %d, max relative error %g", (int)s, err);
    cublasLtMatrixLayoutDestroy(lw);
    cublasLtMatrixLayoutDestroy(linp);
    cublasLtMatrixLayoutDestroy(lout);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    for (float* p : {d_inp, d_w, d_bias, d_out}) { CUDA_CHECK(cudaFree(p)); }
}

static void test_adamw() {
    const size_t n = 1000;
    const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    std::vector<float> params = random_vector(n, 8), m(n, 0.0f), v(n, 0.0f);
    float *d_params = to_device(params), *d_m = to_device(m), *d_v = to_device(v), *d_grads;
    CUDA_CHECK(cudaMalloc(&d_grads, n * sizeof(float)));
    for (int step = 1; step <= 3; step++) {
        std::vector<float> grads = random_vector(n, 100 + step);
        adamw_update(params.data(), grads.data(), m.data(), v.data(), n, lr, beta1, beta2, eps, weight_decay, step);
        CUDA_CHECK(cudaMemcpy(d_grads, grads.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
        adamw_kernel<<<(unsigned)((n + 255) / 256), 256>>>(d_params, d_grads, d_m, d_v, n, lr, beta1, beta2, eps,
                                                           weight_decay, bc1, bc2);
    }
    float err = max_rel_error(to_host(d_params, n).data(), params.data(), n);
    float err_moments = fmaxf(max_rel_error(to_host(d_m, n).data(), m.data(), n),
                              max_rel_error(to_host(d_v, n).data(), v.data(), n));
    check(err <= TOLERANCE && err_moments <= TOLERANCE, "adamw_update: 3 steps of the kernel vs cpu/optimizers.h",
          "params %g, moments %g", err, err_moments);
    for (float* p : {d_params, d_m, d_v, d_grads}) { CUDA_CHECK(cudaFree(p)); }
}

int main() {
    test_layernorm();
    test_causal_softmax();
    test_matmul_bias();
    test_adamw();
    return check_summary();
}
