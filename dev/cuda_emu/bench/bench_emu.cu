/*
bench_emu.cu: what one training step of a small GPT-2 costs the emulated device, by kind of work.

The shapes are those of the CI comparison model with GPT-2's vocabulary: L=2 layers, C=64
channels, NH=4 heads, T=64, B=4, V=50257. One "step" runs the kernels a CUDA trainer runs, in the
styles the trainer will use (fp32 throughout):
  gemm          every matmul of forward and backward through cuBLAS (the classifier, m=V, n=BT, k=C,
                and its two gradients dominate), attention through strided-batched GEMMs
  warp reduce   LayerNorm forward/backward (one warp per row), causal softmax forward/backward (one
                warp per row), the fused classifier (one 1024-thread block per row of V logits), bias
                gradients (one warp per column), the global gradient norm (grid sized from the SM count)
  elementwise   embedding forward/backward, residual, GELU, permutes, the AdamW update (grid-stride,
                grid sized from the SM count)
The numbers are not checked against a reference (the tests do that); the data are finite so that
nothing runs on NaNs. Ordinary CUDA: nvcc builds it too, and on a GPU it times the same work.

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda_emu/bench/bench_emu
    ./build/emu/dev/cuda_emu/bench/bench_emu [steps]      (default 1 step after 1 warm-up step)
*/
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <vector>

static const int L = 2, C = 64, NH = 4, T = 64, B = 4, V = 50257;
static const int BT = B * T, HS = C / NH;
static const int WARP = 32;
static const unsigned FULL_MASK = 0xffffffffu;
static const int ROWS_PER_BLOCK = 8;           // warp-per-row kernels: 256 threads
static const int ELEMENTWISE_THREADS = 256;
static const int CLASSIFIER_THREADS = 1024;
static const int REDUCE_THREADS = 512;
static const float LAYERNORM_EPS = 1e-5f;
static const float GELU_SCALING_FACTOR = 0.7978845608028654f;  // sqrt(2 / pi)

#define CUDA_CHECK(call) check_cuda((call), #call, __FILE__, __LINE__)
static void check_cuda(cudaError_t e, const char* call, const char* file, int line) {
    if (e != cudaSuccess) {
        fprintf(stderr, "error: %s: %s\n  (at %s:%d)\n", call, cudaGetErrorString(e), file, line);
        exit(EXIT_FAILURE);
    }
}
#define CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)
static void check_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "error: %s: cublasStatus_t %d\n  (at %s:%d)\n", call, (int)s, file, line);
        exit(EXIT_FAILURE);
    }
}

// ----------------------------------------------------------------------------
// kernels

__device__ float warp_sum(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2) { v += __shfl_xor_sync(FULL_MASK, v, offset); }
    return v;
}

__device__ float warp_max(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2) { v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset)); }
    return v;
}

// the sum over the block (blockDim.x a multiple of 32): warp sums through shared memory
__device__ float block_sum(float v) {
    __shared__ float warp_sums[WARP];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    v = warp_sum(v);
    if (lane == 0) { warp_sums[warp] = v; }
    __syncthreads();
    v = lane < warps ? warp_sums[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();  // warp_sums may be reused by the next call
    return v;
}

__device__ float block_max(float v) {
    __shared__ float warp_maxes[WARP];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    v = warp_max(v);
    if (lane == 0) { warp_maxes[warp] = v; }
    __syncthreads();
    v = lane < warps ? warp_maxes[lane] : -FLT_MAX;
    v = warp_max(v);
    __syncthreads();
    return v;
}

// out (BT,C) = wte[tokens] + wpe[t]
__global__ void encoder_forward_kernel(float* out, const int* tokens, const float* wte, const float* wpe) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BT * C) { return; }
    int bt = i / C, c = i % C, t = bt % T;
    out[i] = wte[(size_t)tokens[bt] * C + c] + wpe[t * C + c];
}

// dwte[tokens] += dout, dwpe[t] += dout (atomics: tokens repeat)
__global__ void encoder_backward_kernel(float* dwte, float* dwpe, const float* dout, const int* tokens) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BT * C) { return; }
    int bt = i / C, c = i % C, t = bt % T;
    atomicAdd(&dwte[(size_t)tokens[bt] * C + c], dout[i]);
    atomicAdd(&dwpe[t * C + c], dout[i]);
}

// out (N,C) = layernorm(inp); one warp per row
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int N) {
    int lane = threadIdx.x % WARP, row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (row >= N) { return; }
    const float* x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += WARP) { s += x[c]; }
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += WARP) { v += (x[c] - m) * (x[c] - m); }
    float r = rsqrtf(warp_sum(v) / C + LAYERNORM_EPS);
    for (int c = lane; c < C; c += WARP) { out[(size_t)row * C + c] = (x[c] - m) * r * weight[c] + bias[c]; }
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

// dinp (N,C) += , dweight, dbias (C) += (atomics across rows); one warp per row
__global__ void layernorm_backward_kernel(float* dinp, float* dweight, float* dbias, const float* dout,
                                          const float* inp, const float* weight, const float* mean,
                                          const float* rstd, int N) {
    int lane = threadIdx.x % WARP, row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (row >= N) { return; }
    const float *x = inp + (size_t)row * C, *g = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float dnorm = weight[c] * g[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * (x[c] - m) * r;
    }
    dnorm_mean = warp_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
    for (int c = lane; c < C; c += WARP) {
        float norm = (x[c] - m) * r, dnorm = weight[c] * g[c];
        atomicAdd(&dbias[c], g[c]);
        atomicAdd(&dweight[c], norm * g[c]);
        dinp[(size_t)row * C + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
    }
}

// qkv (B,T,3,NH,HS) -> q, k, v (B,NH,T,HS)
__global__ void permute_kernel(float* q, float* k, float* v, const float* qkv) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BT * C) { return; }
    int b = i / (NH * T * HS), h = i / (T * HS) % NH, t = i / HS % T, d = i % HS;
    const float* src = qkv + ((size_t)(b * T + t) * 3 * C) + h * HS + d;
    q[i] = src[0];
    k[i] = src[C];
    v[i] = src[2 * C];
}

// out (B,T,NH,HS) <- inp (B,NH,T,HS)
__global__ void unpermute_kernel(float* out, const float* inp) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BT * C) { return; }
    int b = i / (NH * T * HS), h = i / (T * HS) % NH, t = i / HS % T, d = i % HS;
    out[(size_t)(b * T + t) * C + h * HS + d] = inp[i];
}

// att (rows,T) = causal softmax of scale * preatt; one warp per row
__global__ void softmax_forward_kernel(float* att, const float* preatt, int rows, float scale) {
    int lane = threadIdx.x % WARP, row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (row >= rows) { return; }
    int t = row % T;
    const float* p = preatt + (size_t)row * T;
    float m = -FLT_MAX;
    for (int u = lane; u <= t; u += WARP) { m = fmaxf(m, scale * p[u]); }
    m = warp_max(m);
    float s = 0.0f;
    for (int u = lane; u <= t; u += WARP) { s += expf(scale * p[u] - m); }
    float inv = 1.0f / warp_sum(s);
    for (int u = lane; u < T; u += WARP) { att[(size_t)row * T + u] = u <= t ? expf(scale * p[u] - m) * inv : 0.0f; }
}

// dpreatt (rows,T) = scale * softmax backward; one warp per row
__global__ void softmax_backward_kernel(float* dpreatt, const float* datt, const float* att, int rows, float scale) {
    int lane = threadIdx.x % WARP, row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (row >= rows) { return; }
    const float *a = att + (size_t)row * T, *d = datt + (size_t)row * T;
    float dot = 0.0f;
    for (int u = lane; u < T; u += WARP) { dot += a[u] * d[u]; }
    dot = warp_sum(dot);
    for (int u = lane; u < T; u += WARP) { dpreatt[(size_t)row * T + u] = scale * a[u] * (d[u] - dot); }
}

__global__ void residual_kernel(float* out, const float* a, const float* b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = a[i] + b[i]; }
}

__global__ void gelu_forward_kernel(float* out, const float* inp, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x)));
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float x = inp[i], u = GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x), th = tanhf(u);
    float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_SCALING_FACTOR * (1.0f + 0.134145f * x * x);
    dinp[i] = local * dout[i];
}

// logits (BT,V) -> dlogits in place, losses (BT); one block per row
__global__ void classifier_kernel(float* logits, float* losses, const int* targets) {
    float* x = logits + (size_t)blockIdx.x * V;
    float m = -FLT_MAX;
    for (int v = threadIdx.x; v < V; v += blockDim.x) { m = fmaxf(m, x[v]); }
    m = block_max(m);
    float s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) { s += expf(x[v] - m); }
    s = block_sum(s);
    int target = targets[blockIdx.x];
    if (threadIdx.x == 0) { losses[blockIdx.x] = logf(s) + m - x[target]; }
    __syncthreads();  // x[target] is read before any thread overwrites the row
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        x[v] = (expf(x[v] - m) / s - (v == target ? 1.0f : 0.0f)) / BT;
    }
}

// dbias (OC) += sum over rows of dout (rows,OC); one warp per column
__global__ void bias_backward_kernel(float* dbias, const float* dout, int rows, int OC) {
    int lane = threadIdx.x % WARP, col = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (col >= OC) { return; }
    float s = 0.0f;
    for (int r = lane; r < rows; r += WARP) { s += dout[(size_t)r * OC + col]; }
    s = warp_sum(s);
    if (lane == 0) { dbias[col] += s; }
}

// out += sum of x^2 over n; grid-stride, gridDim from the SM count
__global__ void norm_squared_kernel(float* out, const float* x, size_t n) {
    float s = 0.0f;
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) { s += x[i] * x[i]; }
    s = block_sum(s);
    if (threadIdx.x == 0) { atomicAdd(out, s); }
}

// AdamW over n parameters; grid-stride, gridDim from the SM count
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, size_t n, float lr, float scale) {
    const float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i] * scale;
        m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
        v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        p[i] -= lr * (m[i] / (sqrtf(v[i]) + eps) + weight_decay * p[i]);
    }
}

// ----------------------------------------------------------------------------
// timing by kind of work

enum work_kind { WORK_GEMM, WORK_WARP_REDUCE, WORK_ELEMENTWISE, WORK_KINDS };
static const char* WORK_NAMES[WORK_KINDS] = {"gemm", "warp reduce", "elementwise"};
static double work_seconds[WORK_KINDS];
static double mark;

static double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// charge the time since the last call to `kind` (the device is synchronized first)
static void charge(work_kind kind) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaGetLastError());
    double t = now_s();
    work_seconds[kind] += t - mark;
    mark = t;
}

// ----------------------------------------------------------------------------
// the model's buffers and one step

static float* device_floats(size_t n, unsigned seed) {
    std::vector<float> h(n);
    unsigned s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        h[i] = ((float)(s >> 8) / (float)(1u << 24) - 0.5f) * 0.1f;
    }
    float* d;
    CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

struct layer {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attw, *attb, *ln2w, *ln2b, *fcw, *fcb, *projw, *projb;  // parameters
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *preatt, *att, *atty, *attproj, *res2, *ln2, *ln2_mean,
          *ln2_rstd, *fch, *fch_gelu, *res3;                                                  // activations
};

static cublasHandle_t cublas;
static const float ONE = 1.0f, ZERO = 0.0f;

// out (BT,OC) = inp (BT,IC) @ w (OC,IC)^T (+ bias in a separate kernel, as without epilogues)
static void matmul_forward(float* out, const float* inp, const float* w, int IC, int OC) {
    CUBLAS_CHECK(cublasSgemm(cublas, CUBLAS_OP_T, CUBLAS_OP_N, OC, BT, IC, &ONE, w, IC, inp, IC, &ZERO, out, OC));
}

// dinp (BT,IC) = dout @ w; dw (OC,IC) += dout^T @ inp
static void matmul_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, int IC, int OC) {
    CUBLAS_CHECK(cublasSgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_N, IC, BT, OC, &ONE, w, IC, dout, OC, &ZERO, dinp, IC));
    CUBLAS_CHECK(cublasSgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, BT, &ONE, inp, IC, dout, OC, &ONE, dw, IC));
}

static int blocks_for(int n, int threads) { return (n + threads - 1) / threads; }

int main(int argc, char** argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 1;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    int sized_grid = prop.multiProcessorCount * (prop.maxThreadsPerMultiProcessor / REDUCE_THREADS);
    CUBLAS_CHECK(cublasCreate(&cublas));

    // parameters (one buffer each, as the bench needs no checkpoint layout) and their gradients
    float* wte = device_floats((size_t)V * C, 1);
    float* wpe = device_floats((size_t)T * C, 2);
    float* lnfw = device_floats(C, 3);
    float* lnfb = device_floats(C, 4);
    std::vector<layer> layers(L);
    unsigned seed = 10;
    for (layer& l : layers) {
        float** params[] = {&l.ln1w, &l.ln1b, &l.qkvw, &l.qkvb, &l.attw, &l.attb, &l.ln2w, &l.ln2b, &l.fcw, &l.fcb, &l.projw, &l.projb};
        size_t sizes[] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, C * 4 * C, C};
        for (int i = 0; i < 12; i++) { *params[i] = device_floats(sizes[i], seed++); }
        float** acts[] = {&l.ln1, &l.ln1_mean, &l.ln1_rstd, &l.qkv, &l.preatt, &l.att, &l.atty, &l.attproj, &l.res2,
                          &l.ln2, &l.ln2_mean, &l.ln2_rstd, &l.fch, &l.fch_gelu, &l.res3};
        size_t act_sizes[] = {BT * C, BT, BT, BT * 3 * C, (size_t)B * NH * T * T, (size_t)B * NH * T * T, BT * C,
                              BT * C, BT * C, BT * C, BT, BT, BT * 4 * C, BT * 4 * C, BT * C};
        for (int i = 0; i < 15; i++) { *acts[i] = device_floats(act_sizes[i], seed++); }
    }
    size_t num_params = (size_t)V * C + T * C + 2 * C + L * (size_t)(12 * C * C + 13 * C);
    float* grads_all = device_floats(num_params, 90);   // the gradient buffer the optimizer sees
    float* params_all = device_floats(num_params, 91);
    float* m_all = device_floats(num_params, 92);
    float* v_all = device_floats(num_params, 93);
    float* dwte = device_floats((size_t)V * C, 94);
    float* dwpe = device_floats((size_t)T * C, 95);
    float* dsmall = device_floats(4 * C * C, 96);       // a stand-in gradient for every small tensor
    float* dbias = device_floats(4 * C, 97);
    float* encoded = device_floats(BT * C, 20);
    float* lnf = device_floats(BT * C, 21);
    float* lnf_mean = device_floats(BT, 22);
    float* lnf_rstd = device_floats(BT, 23);
    float* logits = device_floats((size_t)BT * V, 24);
    float* losses = device_floats(BT, 25);
    float *q = device_floats(BT * C, 26), *k = device_floats(BT * C, 27), *v = device_floats(BT * C, 28);
    float* scratch = device_floats(BT * 4 * C, 29);
    float* dx = device_floats(BT * 4 * C, 30);
    float* dy = device_floats(BT * 4 * C, 31);
    float* datt = device_floats((size_t)B * NH * T * T, 32);
    float* norm = device_floats(1, 33);
    std::vector<int> tokens_h(BT);
    for (int i = 0; i < BT; i++) { tokens_h[i] = (i * 7919) % V; }
    int* tokens;
    CUDA_CHECK(cudaMalloc(&tokens, BT * sizeof(int)));
    CUDA_CHECK(cudaMemcpy(tokens, tokens_h.data(), BT * sizeof(int), cudaMemcpyHostToDevice));

    const int ew = ELEMENTWISE_THREADS, rows_threads = ROWS_PER_BLOCK * WARP;
    const int att_rows = B * NH * T;
    const float att_scale = 1.0f / sqrtf((float)HS);
    double total = 0.0;
    for (int step = 0; step <= steps; step++) {  // step 0 warms up and is not counted
        for (int w = 0; w < WORK_KINDS; w++) { work_seconds[w] = 0.0; }
        double start = now_s();
        mark = start;
        // forward
        encoder_forward_kernel<<<blocks_for(BT * C, ew), ew>>>(encoded, tokens, wte, wpe);
        charge(WORK_ELEMENTWISE);
        const float* residual = encoded;
        for (layer& l : layers) {
            layernorm_forward_kernel<<<BT / ROWS_PER_BLOCK, rows_threads>>>(l.ln1, l.ln1_mean, l.ln1_rstd, residual, l.ln1w, l.ln1b, BT);
            charge(WORK_WARP_REDUCE);
            matmul_forward(l.qkv, l.ln1, l.qkvw, C, 3 * C);
            charge(WORK_GEMM);
            permute_kernel<<<blocks_for(BT * C, ew), ew>>>(q, k, v, l.qkv);
            charge(WORK_ELEMENTWISE);
            CUBLAS_CHECK(cublasSgemmStridedBatched(cublas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, &ONE, k, HS, T * HS,
                                                   q, HS, T * HS, &ZERO, l.preatt, T, T * T, B * NH));
            charge(WORK_GEMM);
            softmax_forward_kernel<<<att_rows / ROWS_PER_BLOCK, rows_threads>>>(l.att, l.preatt, att_rows, att_scale);
            charge(WORK_WARP_REDUCE);
            CUBLAS_CHECK(cublasSgemmStridedBatched(cublas, CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T, &ONE, v, HS, T * HS,
                                                   l.att, T, T * T, &ZERO, scratch, HS, T * HS, B * NH));
            charge(WORK_GEMM);
            unpermute_kernel<<<blocks_for(BT * C, ew), ew>>>(l.atty, scratch);
            charge(WORK_ELEMENTWISE);
            matmul_forward(l.attproj, l.atty, l.attw, C, C);
            charge(WORK_GEMM);
            residual_kernel<<<blocks_for(BT * C, ew), ew>>>(l.res2, residual, l.attproj, BT * C);
            layernorm_forward_kernel<<<BT / ROWS_PER_BLOCK, rows_threads>>>(l.ln2, l.ln2_mean, l.ln2_rstd, l.res2, l.ln2w, l.ln2b, BT);
            charge(WORK_WARP_REDUCE);
            matmul_forward(l.fch, l.ln2, l.fcw, C, 4 * C);
            charge(WORK_GEMM);
            gelu_forward_kernel<<<blocks_for(BT * 4 * C, ew), ew>>>(l.fch_gelu, l.fch, BT * 4 * C);
            charge(WORK_ELEMENTWISE);
            matmul_forward(scratch, l.fch_gelu, l.projw, 4 * C, C);
            charge(WORK_GEMM);
            residual_kernel<<<blocks_for(BT * C, ew), ew>>>(l.res3, l.res2, scratch, BT * C);
            charge(WORK_ELEMENTWISE);
            residual = l.res3;
        }
        layernorm_forward_kernel<<<BT / ROWS_PER_BLOCK, rows_threads>>>(lnf, lnf_mean, lnf_rstd, residual, lnfw, lnfb, BT);
        charge(WORK_WARP_REDUCE);
        matmul_forward(logits, lnf, wte, C, V);
        charge(WORK_GEMM);
        classifier_kernel<<<BT, CLASSIFIER_THREADS>>>(logits, losses, tokens);
        charge(WORK_WARP_REDUCE);

        // backward
        matmul_backward(dx, dwte, logits, lnf, wte, C, V);
        charge(WORK_GEMM);
        layernorm_backward_kernel<<<BT / ROWS_PER_BLOCK, rows_threads>>>(dy, dsmall, dbias, dx, residual, lnfw, lnf_mean, lnf_rstd, BT);
        charge(WORK_WARP_REDUCE);
        for (int li = L - 1; li >= 0; li--) {
            layer& l = layers[li];
            const float* inp = li == 0 ? encoded : layers[li - 1].res3;
            bias_backward_kernel<<<blocks_for(C, ROWS_PER_BLOCK), rows_threads>>>(dbias, dy, BT, C);
            charge(WORK_WARP_REDUCE);
            matmul_backward(dx, dsmall, dy, l.fch_gelu, l.projw, 4 * C, C);
            charge(WORK_GEMM);
            gelu_backward_kernel<<<blocks_for(BT * 4 * C, ew), ew>>>(scratch, l.fch, dx, BT * 4 * C);
            charge(WORK_ELEMENTWISE);
            bias_backward_kernel<<<blocks_for(4 * C, ROWS_PER_BLOCK), rows_threads>>>(dbias, scratch, BT, 4 * C);
            charge(WORK_WARP_REDUCE);
            matmul_backward(dx, dsmall, scratch, l.ln2, l.fcw, C, 4 * C);
            charge(WORK_GEMM);
            layernorm_backward_kernel<<<BT / ROWS_PER_BLOCK, rows_threads>>>(dy, dsmall, dbias, dx, l.res2, l.ln2w, l.ln2_mean, l.ln2_rstd, BT);
            bias_backward_kernel<<<blocks_for(C, ROWS_PER_BLOCK), rows_threads>>>(dbias, dy, BT, C);
            charge(WORK_WARP_REDUCE);
            matmul_backward(dx, dsmall, dy, l.atty, l.attw, C, C);
            charge(WORK_GEMM);
            permute_kernel<<<blocks_for(BT * C, ew), ew>>>(q, k, v, l.qkv);
            charge(WORK_ELEMENTWISE);
            // datt = dout v^T, dv = att^T dout (dout: dx viewed as (B,NH,T,HS))
            CUBLAS_CHECK(cublasSgemmStridedBatched(cublas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, &ONE, v, HS, T * HS,
                                                   dx, HS, T * HS, &ZERO, datt, T, T * T, B * NH));
            CUBLAS_CHECK(cublasSgemmStridedBatched(cublas, CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T, &ONE, dx, HS, T * HS,
                                                   l.att, T, T * T, &ZERO, scratch, HS, T * HS, B * NH));
            charge(WORK_GEMM);
            softmax_backward_kernel<<<att_rows / ROWS_PER_BLOCK, rows_threads>>>(l.preatt, datt, l.att, att_rows, att_scale);
            charge(WORK_WARP_REDUCE);
            // dq = dpreatt k, dk = dpreatt^T q
            CUBLAS_CHECK(cublasSgemmStridedBatched(cublas, CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T, &ONE, k, HS, T * HS,
                                                   l.preatt, T, T * T, &ZERO, scratch, HS, T * HS, B * NH));
            CUBLAS_CHECK(cublasSgemmStridedBatched(cublas, CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T, &ONE, q, HS, T * HS,
                                                   l.preatt, T, T * T, &ZERO, scratch, HS, T * HS, B * NH));
            charge(WORK_GEMM);
            bias_backward_kernel<<<blocks_for(3 * C, ROWS_PER_BLOCK), rows_threads>>>(dbias, l.qkv, BT, 3 * C);
            charge(WORK_WARP_REDUCE);
            matmul_backward(dx, dsmall, l.qkv, l.ln1, l.qkvw, C, 3 * C);
            charge(WORK_GEMM);
            layernorm_backward_kernel<<<BT / ROWS_PER_BLOCK, rows_threads>>>(dy, dsmall, dbias, dx, inp, l.ln1w, l.ln1_mean, l.ln1_rstd, BT);
            charge(WORK_WARP_REDUCE);
        }
        encoder_backward_kernel<<<blocks_for(BT * C, ew), ew>>>(dwte, dwpe, dy, tokens);
        charge(WORK_ELEMENTWISE);

        // update
        CUDA_CHECK(cudaMemset(norm, 0, sizeof(float)));
        norm_squared_kernel<<<sized_grid, REDUCE_THREADS>>>(norm, grads_all, num_params);
        charge(WORK_WARP_REDUCE);
        adamw_kernel<<<sized_grid, REDUCE_THREADS>>>(params_all, grads_all, m_all, v_all, num_params, 1e-4f, 1.0f);
        charge(WORK_ELEMENTWISE);

        double seconds = now_s() - start;
        if (step == 0) { continue; }
        total += seconds;
        printf("step %d: %.3f s (", step, seconds);
        for (int w = 0; w < WORK_KINDS; w++) { printf("%s%s %.3f s", w ? ", " : "", WORK_NAMES[w], work_seconds[w]); }
        printf(")\n");
    }
    printf("L=%d C=%d T=%d B=%d V=%d, %d SMs (grid-stride kernels: %d blocks of %d): %.3f s per step\n", L, C, T, B,
           V, prop.multiProcessorCount, sized_grid, REDUCE_THREADS, total / steps);
    CUBLAS_CHECK(cublasDestroy(cublas));
    return 0;
}
