/*
test_optimizer_lowp.cu: the kernels of cuda/adamw_lowp.cuh against cpu/optimizers_lowp.h and
llmc/quant_state.h, byte for byte: block-wise quantize and dequantize (random blocks; blocks of
zeros, -0, a huge value, denormals, NaN, Inf; values straddling every rounding threshold), and three
AdamW steps on 8-bit and on bf16 state (from zeroed state and from a random one, with a NaN
gradient), the refused counts equal too. Sizes with a short last block (7 blocks + 77), a single
block, fewer elements than a lane holds, more blocks than the grid has warps (201: its warps take
several each); buffers one element off their alignment. Adafactor and CAME with an 8-bit or bf16
first moment (cuda/factored_lowp.cuh) against the fp32 device update on the dequantized moment,
stored as the CPU stores it. The CPU functions are held to the test's own references by
tests/test_quant_state.c.

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda/test_optimizer_lowp && ./build/emu/dev/cuda/test_optimizer_lowp
*/
#include "dev/cuda/kernel_test.h"
#include "cpu/optimizers_lowp.h"
#include "cuda/factored_lowp.cuh"

struct Case { size_t n; int offset; };  // offset: elements past an aligned start (floats 4 bytes, codes 1)
static const Case CASES[] = {{7 * QSTATE_BLOCK + 77, 0}, {7 * QSTATE_BLOCK + 77, 1}, {QSTATE_BLOCK, 0}, {5, 1},
                             {200 * QSTATE_BLOCK + 13, 0}};  // the last: more blocks than the grid's warps (grid-stride)
static const int STEPS = 3;
static const float LR = 1e-3f, BETA1 = 0.9f, BETA2 = 0.95f, EPS = 1e-8f, WEIGHT_DECAY = 0.1f;

// a device copy of n T at `offset` elements past an aligned allocation (free *base)
template <typename T>
static T* offset_copy(const T* x, size_t n, int offset, T** base) {
    CUDA_CHECK(cudaMalloc(base, (n + 16) * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(*base + offset, x, n * sizeof(T), cudaMemcpyHostToDevice));
    return *base + offset;
}

// true when the n T at device d are the bytes of host h
template <typename T>
static bool same_as_host(const T* d, const T* h, size_t n) {
    std::vector<T> got(n);
    CUDA_CHECK(cudaMemcpy(got.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return memcmp(got.data(), h, n * sizeof(T)) == 0;
}

static unsigned long long read_counter(const unsigned long long* d) {
    unsigned long long x;
    CUDA_CHECK(cudaMemcpy(&x, d, sizeof x, cudaMemcpyDeviceToHost));
    return x;
}

enum QuantizeData { DATA_RANDOM, DATA_ADVERSARIAL, DATA_THRESHOLDS, NUM_DATA };
static const char* DATA_NAMES[NUM_DATA] = {"random", "adversarial blocks", "values at the thresholds"};

// blocks whose absmax is 3 and whose other values straddle every threshold of map m: for each
// up[j], the smallest v with v / 3 >= up[j] (by IEEE division) and the value below it; a quotient
// computed any other way (a reciprocal, a fused operation) lands on the other side of some of them
static std::vector<float> threshold_data(size_t n, const QStateMap* m) {
    std::vector<float> pairs;
    for (int j = 0; j + 1 < QSTATE_CODES; j++) {
        float v = m->up[j] * 3.0f;
        while (v / 3.0f >= m->up[j]) { v = nextafterf(v, -INFINITY); }
        while (v / 3.0f < m->up[j]) { v = nextafterf(v, INFINITY); }
        pairs.push_back(v);
        pairs.push_back(nextafterf(v, -INFINITY));
    }
    std::vector<float> x(n);
    for (size_t i = 0, k = 0; i < n; i++) { x[i] = i % QSTATE_BLOCK == 0 ? 3.0f : pairs[k++ % pairs.size()]; }
    return x;
}

// the data of the quantize tests (QuantizeData) for map `map`
static std::vector<float> quantize_data(size_t n, QuantizeData data, QMapKind map) {
    if (data == DATA_THRESHOLDS) { return threshold_data(n, &qstate_maps()->map[map]); }
    std::vector<float> x = random_vector(n, 3 + data);
    for (size_t i = 0; i < n; i++) { x[i] *= powf(10.0f, -8.0f * fabsf(x[(i * 7919) % n])); }
    if (data == DATA_ADVERSARIAL) {
        for (size_t i = 0; i < n; i++) {
            switch ((i / QSTATE_BLOCK) % 6) {
                case 0: x[i] = 0.0f; break;                                // all zeros
                case 1: x[i] = i % 2 ? -0.0f : x[i]; break;                // negative zeros
                case 2: x[i] = i % QSTATE_BLOCK == 9 ? 1e30f : x[i]; break;  // one huge value
                case 3: x[i] *= 1e-38f; break;                             // denormals
                case 4: x[i] = i % QSTATE_BLOCK == 3 ? NAN : x[i]; break;  // refused
                default: x[i] = i % QSTATE_BLOCK == 4 ? -INFINITY : x[i];  // refused
            }
        }
    }
    if (map == QMAP_UNSIGNED) {
        for (float& v : x) { v = fabsf(v); }
    }
    return x;
}

static void test_quantize(const Case& c, QuantizeData data, QMapKind kind, const QStateMaps* d_maps) {
    size_t n = c.n, nb = qstate_blocks(n);
    std::vector<float> x = quantize_data(n, data, kind);
    const QStateMap* map = &qstate_maps()->map[kind];
    std::vector<uint8_t> codes(n);
    std::vector<float> absmax(nb), back(n);
    size_t want_bad = qstate_quantize(map, x.data(), n, codes.data(), absmax.data());
    qstate_dequantize(map, codes.data(), absmax.data(), n, back.data());
    float *xb, *ab = device_alloc<float>(nb), *bb;
    uint8_t* cb;
    float* d_x = offset_copy(x.data(), n, c.offset, &xb);
    uint8_t* d_codes = offset_copy(codes.data(), n, c.offset, &cb);  // overwritten
    float* d_back = offset_copy(back.data(), n, c.offset, &bb);
    CUDA_CHECK(cudaMemset(d_back, 0, n * sizeof(float)));
    unsigned long long* d_bad = device_alloc<unsigned long long>(1);
    CUDA_CHECK(cudaMemset(d_bad, 0, sizeof(unsigned long long)));
    qstate_quantize_cuda(d_codes, ab, d_x, n, kind, d_maps, d_bad, 0);
    qstate_dequantize_cuda(d_back, d_codes, ab, n, kind, d_maps, 0);
    unsigned long long got_bad = read_counter(d_bad);
    char name[200];
    snprintf(name, sizeof name, "qstate_quantize_cuda %s %s (n=%zu, offset %d): codes, absmax, refused count (%zu) = cpu, bytes",
             kind == QMAP_SIGNED ? "signed" : "unsigned", DATA_NAMES[data], n, c.offset, want_bad);
    check(same_as_host(d_codes, codes.data(), n) && same_as_host(ab, absmax.data(), nb) && got_bad == want_bad, name,
          "refused %llu vs %zu", got_bad, want_bad);
    snprintf(name, sizeof name, "qstate_dequantize_cuda %s (n=%zu, offset %d): = cpu, bytes",
             kind == QMAP_SIGNED ? "signed" : "unsigned", n, c.offset);
    check(same_as_host(d_back, back.data(), n), name, "%s", "differ");
    for (void* p : {(void*)xb, (void*)ab, (void*)bb, (void*)cb, (void*)d_bad}) { CUDA_CHECK(cudaFree(p)); }
}

// STEPS steps of 8-bit AdamW on both backends, from zeroed state (random_state 0) or a quantized
// random one; with nan_grad, one gradient of step 2 is NaN
static void test_adamw_8bit(const Case& c, int random_state, int nan_grad, const QStateMaps* d_maps) {
    size_t n = c.n, nb = qstate_blocks(n);
    std::vector<float> params = random_vector(n, 1), m0 = random_vector(n, 2, 1e-3f), v0 = random_vector(n, 3, 1e-6f);
    std::vector<uint8_t> mc(n, 0), vc(n, 0);
    std::vector<float> ma(nb, 0.0f), va(nb, 0.0f);
    if (random_state) {
        for (float& v : v0) { v = fabsf(v); }
        qstate_quantize(&qstate_maps()->map[QMAP_SIGNED], m0.data(), n, mc.data(), ma.data());
        qstate_quantize(&qstate_maps()->map[QMAP_UNSIGNED], v0.data(), n, vc.data(), va.data());
    }
    float *pb, *gb, *mab, *vab;
    uint8_t *mcb, *vcb;
    float* d_p = offset_copy(params.data(), n, c.offset, &pb);
    float* d_g = offset_copy(params.data(), n, c.offset, &gb);
    uint8_t* d_mc = offset_copy(mc.data(), n, c.offset, &mcb);
    uint8_t* d_vc = offset_copy(vc.data(), n, c.offset, &vcb);
    float* d_ma = offset_copy(ma.data(), nb, 0, &mab);
    float* d_va = offset_copy(va.data(), nb, 0, &vab);
    unsigned long long* d_bad = device_alloc<unsigned long long>(1);
    CUDA_CHECK(cudaMemset(d_bad, 0, sizeof(unsigned long long)));
    QBlocks m = {mc.data(), ma.data()}, v = {vc.data(), va.data()}, dm = {d_mc, d_ma}, dv = {d_vc, d_va};
    size_t want_bad = 0;
    for (int t = 1; t <= STEPS; t++) {
        std::vector<float> grads = random_vector(n, 100 + t, 1e-2f);
        if (nan_grad && t == 2) { grads[n / 2] = NAN; }
        want_bad += adamw_update_8bit(params.data(), grads.data(), m, v, n, LR, BETA1, BETA2, EPS, WEIGHT_DECAY, t);
        CUDA_CHECK(cudaMemcpy(d_g, grads.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        adamw_update_8bit_cuda(d_p, d_g, dm, dv, n, LR, BETA1, BETA2, EPS, WEIGHT_DECAY, t, d_maps, d_bad, 0);
    }
    unsigned long long got_bad = read_counter(d_bad);
    bool same = same_as_host(d_p, params.data(), n) && same_as_host(d_mc, mc.data(), n) && same_as_host(d_vc, vc.data(), n) &&
                same_as_host(d_ma, ma.data(), nb) && same_as_host(d_va, va.data(), nb);
    char name[200];
    snprintf(name, sizeof name, "adamw_update_8bit_cuda: %d steps from %s state%s = cpu, bytes (n=%zu, offset %d; refused %zu)",
             STEPS, random_state ? "a random" : "zeroed", nan_grad ? ", a NaN gradient" : "", n, c.offset, want_bad);
    check(same && got_bad == want_bad && (want_bad > 0) == (nan_grad != 0), name, "bytes %s, refused %llu vs %zu",
          same ? "equal" : "differ", got_bad, want_bad);
    for (void* p : {(void*)pb, (void*)gb, (void*)mcb, (void*)vcb, (void*)mab, (void*)vab, (void*)d_bad}) { CUDA_CHECK(cudaFree(p)); }
}

static void test_adamw_bf16(const Case& c, int nan_grad) {
    size_t n = c.n;
    std::vector<float> params = random_vector(n, 4);
    std::vector<uint16_t> m(n, 0), v(n, 0);
    QStateStream s = {12345, 70000};  // a part that starts at element 70000 of its tensor
    float *pb, *gb;
    uint16_t *mb, *vb;
    float* d_p = offset_copy(params.data(), n, c.offset, &pb);
    float* d_g = offset_copy(params.data(), n, c.offset, &gb);
    uint16_t* d_m = offset_copy(m.data(), n, c.offset, &mb);
    uint16_t* d_v = offset_copy(v.data(), n, c.offset, &vb);
    unsigned long long* d_bad = device_alloc<unsigned long long>(1);
    CUDA_CHECK(cudaMemset(d_bad, 0, sizeof(unsigned long long)));
    size_t want_bad = 0;
    for (int t = 1; t <= STEPS; t++) {
        std::vector<float> grads = random_vector(n, 200 + t, 1e-2f);
        if (nan_grad && t == 2) { grads[n / 2] = NAN; }
        want_bad += adamw_update_bf16(params.data(), grads.data(), m.data(), v.data(), n, LR, BETA1, BETA2, EPS, WEIGHT_DECAY, t, s);
        CUDA_CHECK(cudaMemcpy(d_g, grads.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        adamw_update_bf16_cuda(d_p, d_g, d_m, d_v, n, LR, BETA1, BETA2, EPS, WEIGHT_DECAY, t, s, d_bad, 0);
    }
    unsigned long long got_bad = read_counter(d_bad);
    bool same = same_as_host(d_p, params.data(), n) && same_as_host(d_m, m.data(), n) && same_as_host(d_v, v.data(), n);
    char name[200];
    snprintf(name, sizeof name, "adamw_update_bf16_cuda: %d steps%s = cpu, bytes (n=%zu, offset %d; refused %zu)", STEPS,
             nan_grad ? ", a NaN gradient" : "", n, c.offset, want_bad);
    check(same && got_bad == want_bad && (want_bad > 0) == (nan_grad != 0), name, "bytes %s, refused %llu vs %zu",
          same ? "equal" : "differ", got_bad, want_bad);
    for (void* p : {(void*)pb, (void*)gb, (void*)mb, (void*)vb, (void*)d_bad}) { CUDA_CHECK(cudaFree(p)); }
}

// one step of Adafactor (came 0) or CAME (came 1) with M in format f on a whole (rows, cols) slice:
// cuda/factored_lowp.cuh against the fp32 device update (adafactor_update_m_cuda, came_update_m_cuda)
// on the dequantized M, whose new M the host then quantizes (or rounds) as the CPU does
static void test_factored(int came, int rows, int cols, QStateFormat f, const QStateMaps* d_maps) {
    ParamSlice slice = param_slice_alone(0, rows, cols);
    size_t offset;
    OptShard sh = slice_shard(&slice, &OPT_UNSHARDED, &offset);
    size_t n = (size_t)rows * cols, nb = qstate_blocks(n);
    size_t second = came ? came_state_floats(&sh) - n : adafactor_state_floats(&sh, 0);
    const AdafactorHyper af = {1e-2, 0.9, ADAFACTOR_DECAY_RATE, 1e-30, ADAFACTOR_EPS2, 1.0, 0.1, 1, 0};
    const CAMEHyper ch = {1e-3, CAME_BETA1, CAME_BETA2, CAME_BETA3, 1e-30, CAME_EPS2, CAME_CLIP_THRESHOLD, 0.01};
    const int t = 3;
    std::vector<float> p = random_vector(n, 5), g = random_vector(n, 6, 1e-2f), m0 = random_vector(n, 7, 1e-3f);
    std::vector<float> v0 = random_vector(second, 8, 1e-4f);
    for (float& x : v0) { x = 2e-4f + fabsf(x); }  // earlier steps' statistics (> 0)
    // M before the step, in format f, and its values
    const QStateMap* map = &qstate_maps()->map[QMAP_SIGNED];
    std::vector<uint8_t> codes(n);
    std::vector<float> absmax(nb), mdeq(n);
    std::vector<uint16_t> h(n);
    qstate_quantize(map, m0.data(), n, codes.data(), absmax.data());
    for (size_t i = 0; i < n; i++) {
        h[i] = qstate_bf16_round(m0[i], (uint32_t)(i * 7919 % 65536));
        mdeq[i] = f == QSTATE_BF16 ? qstate_bf16_to_float(h[i]) : qstate_dequantize_one(map->code, codes[i], absmax[i / QSTATE_BLOCK]);
    }
    float *d_p = upload<float>(p), *d_pref = upload<float>(p), *d_g = upload<float>(g), *d_mref = upload<float>(mdeq);
    float *d_v = upload<float>(v0), *d_vref = upload<float>(v0), *d_absmax = upload<float>(absmax);
    float* d_staging = device_alloc<float>(n);
    uint8_t* d_codes = device_alloc<uint8_t>(n);
    uint16_t* d_h = device_alloc<uint16_t>(n);
    CUDA_CHECK(cudaMemcpy(d_codes, codes.data(), n, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_h, h.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    void* scratch = device_alloc<char>(factored_scratch_bytes(&sh));
    unsigned long long* d_bad = device_alloc<unsigned long long>(1);
    CUDA_CHECK(cudaMemset(d_bad, 0, sizeof(unsigned long long)));
    QMoment M = {f, {d_codes, d_absmax}, d_h, {99, 4000}};
    FactoredLowp lp = {d_maps, d_bad, d_staging};
    if (came) {
        came_update_m_cuda(d_pref, d_g, d_mref, d_vref, &sh, &ch, scratch, OPT_NO_COMMS, 0);
        came_update_lowp_cuda(d_p, d_g, d_v, &M, &sh, &ch, t, scratch, OPT_NO_COMMS, &lp, 0);
    } else {
        adafactor_update_m_cuda(d_pref, d_g, d_vref, d_mref, &sh, &af, t, scratch, OPT_NO_COMMS, 0);
        adafactor_update_lowp_cuda(d_p, d_g, d_v, &M, &sh, &af, t, scratch, OPT_NO_COMMS, &lp, 0);
    }
    // the fp32 update's new M, stored as the CPU stores it
    std::vector<float> mnew = download(d_mref, n);
    bool same_m;
    if (f == QSTATE_BF16) {
        for (size_t i = 0; i < n; i++) { h[i] = qstate_bf16_round(mnew[i], qstate_random16(99, t, QSTATE_STREAM_M, 4000 + i)); }
        same_m = same_as_host(d_h, h.data(), n);
    } else {
        qstate_quantize(map, mnew.data(), n, codes.data(), absmax.data());
        same_m = same_as_host(d_codes, codes.data(), n) && same_as_host(d_absmax, absmax.data(), nb);
    }
    bool same_p = same_bits(d_p, d_pref, n), same_v = same_bits(d_v, d_vref, second);
    unsigned long long refused = read_counter(d_bad);
    char name[200];
    snprintf(name, sizeof name, "%s_update_lowp_cuda %s M (%d x %d): = the fp32 device update on the dequantized M, "
             "stored as the CPU stores it, bytes", came ? "came" : "adafactor", QSTATE_FORMAT_NAMES[f], rows, cols);
    check(same_p && same_v && same_m && refused == 0, name, "weights %d, second moment %d, M %d (1 = equal), refused %llu",
          same_p, same_v, same_m, refused);
    for (void* q : {(void*)d_p, (void*)d_pref, (void*)d_g, (void*)d_mref, (void*)d_v, (void*)d_vref, (void*)d_absmax,
                    (void*)d_staging, (void*)d_codes, (void*)d_h, scratch, (void*)d_bad}) {
        CUDA_CHECK(cudaFree(q));
    }
}

// GPT-2 d12's 124M parameters on a GPU: AdamW on 8-bit and on bf16 state
static void bench_lowp(const QStateMaps* d_maps) {
#ifdef CUDA_EMU
    const size_t n = 4096;
#else
    const size_t n = 124475904;
#endif
    size_t nb = qstate_blocks(n);
    float *d_p = upload<float>(random_vector(n, 1)), *d_g = upload<float>(random_vector(n, 2, 1e-2f));
    uint8_t *d_mc = device_alloc<uint8_t>(n), *d_vc = device_alloc<uint8_t>(n);
    float *d_ma = device_alloc<float>(nb), *d_va = device_alloc<float>(nb);
    uint16_t *d_m = device_alloc<uint16_t>(n), *d_v = device_alloc<uint16_t>(n);
    unsigned long long* d_bad = device_alloc<unsigned long long>(1);
    for (void* p : {(void*)d_mc, (void*)d_vc}) { CUDA_CHECK(cudaMemset(p, 0, n)); }
    for (void* p : {(void*)d_ma, (void*)d_va}) { CUDA_CHECK(cudaMemset(p, 0, nb * sizeof(float))); }
    for (void* p : {(void*)d_m, (void*)d_v}) { CUDA_CHECK(cudaMemset(p, 0, n * sizeof(uint16_t))); }
    QBlocks m = {d_mc, d_ma}, v = {d_vc, d_va};
    QStateStream s = {1, 0};
    bench("adamw_update_8bit", 12.0 * n + 4.0 * n + 16.0 * nb, 30.0 * n,
          [&] { adamw_update_8bit_cuda(d_p, d_g, m, v, n, LR, BETA1, BETA2, EPS, WEIGHT_DECAY, 1, d_maps, d_bad, 0); });
    bench("adamw_update_bf16", 12.0 * n + 8.0 * n, 40.0 * n,
          [&] { adamw_update_bf16_cuda(d_p, d_g, d_m, d_v, n, LR, BETA1, BETA2, EPS, WEIGHT_DECAY, 1, s, d_bad, 0); });
    for (void* p : {(void*)d_p, (void*)d_g, (void*)d_mc, (void*)d_vc, (void*)d_ma, (void*)d_va, (void*)d_m, (void*)d_v,
                    (void*)d_bad}) {
        CUDA_CHECK(cudaFree(p));
    }
}

int main() {
    QStateMaps* d_maps = qstate_maps_upload();
    for (const Case& c : CASES) {
        for (int data = 0; data < NUM_DATA; data++) {
            test_quantize(c, (QuantizeData)data, QMAP_SIGNED, d_maps);
            test_quantize(c, (QuantizeData)data, QMAP_UNSIGNED, d_maps);
        }
        test_adamw_8bit(c, 0, 0, d_maps);
        test_adamw_8bit(c, 1, 0, d_maps);
        test_adamw_8bit(c, 1, 1, d_maps);
        test_adamw_bf16(c, 0);
        test_adamw_bf16(c, 1);
    }
    for (int f = QSTATE_BF16; f <= QSTATE_8BIT; f++) {
        for (int came = 0; came <= 1; came++) {
            test_factored(came, 70, 37, (QStateFormat)f, d_maps);  // rows cut across blocks; 16-byte packs off
            test_factored(came, 1, 1030, (QStateFormat)f, d_maps);  // a vector
        }
    }
    bench_lowp(d_maps);
    CUDA_CHECK(cudaFree(d_maps));
    return check_summary();
}
