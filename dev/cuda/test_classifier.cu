/*
test_classifier.cu: cuda/classifier.cuh against softmax_forward, crossentropy_forward and
crossentropy_softmax_backward of cpu/layers.h, in fp32 and bf16 (the CPU on the bf16-rounded
logits): losses (fp32 in both modes, held to 1e-5), one position's probabilities for sampling
(fp32, 1e-5), and the gradient written (=) into its own buffer and in place, zero past V. V is
not a multiple of the vector width (100, 97) and one shape has Vp = 101 (rows not 16-byte
aligned); V = 5000 spreads a row over every warp of a block. The forward without targets must give bitwise the same row statistics.
The fused kernel (--loss-chunk) must give bitwise the losses of the forward and the gradient of the backward.

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda/test_classifier && ./build/emu/dev/cuda/test_classifier
*/
#include "dev/cuda/kernel_test.h"
#include "cpu/layers.h"
#include "cuda/classifier.cuh"

struct Shape { int B, T, V, Vp; };
static const Shape SHAPES[] = {{2, 5, 100, 128}, {1, 3, 97, 101}, {1, 2, 5000, 5120}};
static const float LOGIT_SCALE = 4.0f;  // logits in [-4, 4): probabilities from about 1e-4 to 0.3
static const float DLOSS = 0.5f;        // d(total loss) / d(each loss), a value that shows a missed factor

static std::vector<int> random_targets(int n, int V, unsigned seed) {
    std::vector<int> t(n);
    unsigned s = seed;
    for (int& x : t) {
        s = s * 1664525u + 1013904223u;
        x = (int)((s >> 8) % (unsigned)V);
    }
    return t;
}

template <typename floatX>
static void test_shape(const Shape& s) {
    int B = s.B, T = s.T, V = s.V, Vp = s.Vp, N = B * T;
    size_t NV = (size_t)N * Vp;
    std::vector<float> logits = rounded<floatX>(random_vector(NV, 1, LOGIT_SCALE));
    std::vector<int> targets = random_targets(N, V, 2);
    char what[128];

    // the CPU: probabilities, losses, gradient
    std::vector<float> probs(NV), losses(N), dlogits(NV);
    softmax_forward(probs.data(), logits.data(), B, T, V, Vp);
    crossentropy_forward(losses.data(), probs.data(), targets.data(), B, T, Vp);
    crossentropy_softmax_backward(dlogits.data(), probs.data(), targets.data(), DLOSS, B, T, V, Vp);

    floatX* d_logits = upload<floatX>(logits);
    int* d_targets = upload_ints(targets);
    float *d_losses = device_alloc<float>(N), *d_max = device_alloc<float>(N), *d_sum = device_alloc<float>(N);
    float *d_max2 = device_alloc<float>(N), *d_sum2 = device_alloc<float>(N), *d_probs = device_alloc<float>(Vp);
    classifier_forward_cuda<floatX>(d_losses, d_max, d_sum, d_logits, d_targets, B, T, V, Vp, 0);
    snprintf(what, sizeof what, "forward losses (fp32, N=%d V=%d Vp=%d)", N, V, Vp);
    check_close<floatX>(max_rel_error(download(d_losses, N).data(), losses.data(), N), FP32_TOLERANCE, "classifier", what);
    classifier_forward_cuda<floatX>(NULL, d_max2, d_sum2, d_logits, NULL, B, T, V, Vp, 0);
    snprintf(what, sizeof what, "forward without targets: the same row statistics, bitwise (V=%d)", V);
    check(same_bits(d_max, d_max2, N) && same_bits(d_sum, d_sum2, N), test_name<floatX>("classifier", what), "%s",
          "they differ");

    int position = N - 1;
    softmax_row_cuda<floatX>(d_probs, d_logits, d_max, d_sum, position, V, Vp, 0);
    snprintf(what, sizeof what, "softmax_row of position %d (fp32, zero past V=%d)", position, V);
    check_close<floatX>(max_rel_error(download(d_probs, Vp).data(), &probs[(size_t)position * Vp], Vp), FP32_TOLERANCE,
                        "classifier", what);

    // the gradient, into its own buffer (filled with something else first) and in place
    floatX* d_dlogits = upload<floatX>(random_vector(NV, 3));
    classifier_backward_cuda<floatX>(d_dlogits, d_logits, d_max, d_sum, d_targets, DLOSS, B, T, V, Vp, 0);
    snprintf(what, sizeof what, "backward dlogits = (V=%d Vp=%d)", V, Vp);
    check_close<floatX>(max_rel_error(download(d_dlogits, NV).data(), dlogits.data(), NV), tolerance<floatX>(),
                        "classifier", what);
    classifier_backward_cuda<floatX>(d_logits, d_logits, d_max, d_sum, d_targets, DLOSS, B, T, V, Vp, 0);
    snprintf(what, sizeof what, "backward in place: bitwise the same as into its own buffer (V=%d)", V);
    check(same_bits(d_logits, d_dlogits, NV), test_name<floatX>("classifier", what), "%s", "they differ");

    // fused: losses and the gradient in place in one kernel, bitwise the two kernels' results
    floatX* d_fused = upload<floatX>(logits);
    float* d_fused_losses = device_alloc<float>(N);
    classifier_fused_cuda<floatX>(d_fused_losses, d_fused, d_targets, DLOSS, B, T, V, Vp, 0);
    snprintf(what, sizeof what, "fused: losses and dlogits bitwise those of forward + backward (V=%d Vp=%d)", V, Vp);
    check(same_bits(d_fused_losses, d_losses, N) && same_bits(d_fused, d_dlogits, NV), test_name<floatX>("classifier", what), "%s",
          "they differ");
    CUDA_CHECK(cudaFree(d_fused));
    CUDA_CHECK(cudaFree(d_fused_losses));

    for (void* p : {(void*)d_logits, (void*)d_targets, (void*)d_losses, (void*)d_max, (void*)d_sum, (void*)d_max2,
                    (void*)d_sum2, (void*)d_probs, (void*)d_dlogits}) {
        CUDA_CHECK(cudaFree(p));
    }
}

// GPT-2's vocabulary at d12's batch on a GPU
template <typename floatX>
static void bench_classifier() {
#ifdef CUDA_EMU
    const int B = 2, T = 4, V = 100, Vp = 128;
#else
    const int B = 8, T = 1024, V = 50257, Vp = 50304;
#endif
    size_t NV = (size_t)B * T * Vp, N = (size_t)B * T;
    floatX* d_logits = upload<floatX>(random_vector(NV, 1, LOGIT_SCALE));
    int* d_targets = upload_ints(random_targets((int)N, V, 2));
    float *d_losses = device_alloc<float>(N), *d_max = device_alloc<float>(N), *d_sum = device_alloc<float>(N);
    double x = sizeof(floatX);
    char name[64];
    snprintf(name, sizeof name, "classifier_forward %s", type_name<floatX>());
    bench(name, (double)N * V * x + 16.0 * N, 5.0 * N * V,
          [&] { classifier_forward_cuda<floatX>(d_losses, d_max, d_sum, d_logits, d_targets, B, T, V, Vp, 0); });
    snprintf(name, sizeof name, "classifier_backward %s (in place)", type_name<floatX>());
    bench(name, 2.0 * NV * x + 12.0 * N, 5.0 * N * V, [&] {
        classifier_backward_cuda<floatX>(d_logits, d_logits, d_max, d_sum, d_targets, 1.0f / N, B, T, V, Vp, 0);
    });
    snprintf(name, sizeof name, "classifier_fused %s (in place)", type_name<floatX>());
    bench(name, 3.0 * NV * x + 8.0 * N, 10.0 * N * V,
          [&] { classifier_fused_cuda<floatX>(d_losses, d_logits, d_targets, 1.0f / N, B, T, V, Vp, 0); });
    for (void* p : {(void*)d_logits, (void*)d_targets, (void*)d_losses, (void*)d_max, (void*)d_sum}) { CUDA_CHECK(cudaFree(p)); }
}

int main() {
    for (const Shape& s : SHAPES) {
        test_shape<float>(s);
        test_shape<__nv_bfloat16>(s);
    }
    bench_classifier<float>();
    bench_classifier<__nv_bfloat16>();
    return check_summary();
}
