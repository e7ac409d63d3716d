/*
test_zero.cu: ZeRO's pack and unpack kernels and groups (cuda/zero.cuh) against the layout the
optimizer reads (llmc/opt_layout.h: shard_range's blocks, shard_block_offsets' gradient shard), for
1 to 5 ranks (uneven blocks, padding), on models whose head goes through the pack in one round and
in several (a vocabulary large against the channels), with the cut of fp32 (and bf16) state and the
one of 8-bit state (--optimizer-state 8bit: a part of a slice of 4,096 elements or more starts on a
block of 256 elements; 3 ranks cut the fixture's fcw at 48 rows, not 43):
  - the groups' parts tile the gradient shard: every float of [0, E) at exactly one (group, offset),
    and the head takes the rounds the model needs;
  - packing every rank's blocks of a buffer in the model's layout, group by group, and taking rank r's
    part of each at its shard_at gives rank r's shard: each slice's block at shard_block_offsets' place,
    zero in the padding (bit for bit; what ZeRO-2's reduce-scatter adds into the shard);
  - unpacking every rank's parts into a zeroed buffer gives back every real element (ZeRO's
    all-gather), and wte's padded rows stay zero; unpacking one rank's parts writes its blocks only
    (ZeRO-1's reduce-scatter);
  - zero_add_cuda adds a part into the shard;
  - ZeRO-3: the ranks' bf16 weight shards, each group's parts rank by rank (an all-gather's result),
    unpacked into a one-layer model's buffers give back the model's weights rounded to bf16.

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda/test_zero && ./build/emu/dev/cuda/test_zero
*/
#include "dev/cuda/kernel_test.h"
#include "cuda/zero.cuh"

// the rounds of a model's head through the pack (at least), and the model: maxT, V, Vp, L, NH, C
struct ZeroCase { GPT2Config c; const char* what; };
static const ZeroCase CASES[] = {
    {{32, 64, 128, 2, 2, 32}, "the test fixture (L=2 C=32 V=64): the head in one round"},
    {{32, 500, 512, 2, 2, 32}, "V=500 C=32: wte's padded rows, the head in rounds"},
    {{20, 1000, 1024, 3, 2, 24}, "V=1000 C=24 maxT=20: rows that no rank count divides, several rounds"},
};

// rank r's shard of x (the model's layout) under state format f: each slice's block at shard_block_offsets' place, padded with zeros
static std::vector<float> reference_shard(const GPT2Config* c, int world, QStateFormat f, int r, const std::vector<float>& x) {
    ParamSlice* s = param_slices_alloc(c);
    std::vector<size_t> goff(param_slice_count(c));
    std::vector<float> shard(shard_block_offsets_as(c, world, f, goff.data()), 0.0f);
    for (int k = 0; k < param_slice_count(c); k++) {
        int begin, end, width = slice_unit_width(&s[k]);
        slice_range(&s[k], r, world, f, &begin, &end);
        for (size_t i = 0; i < (size_t)(end - begin) * width; i++) { shard[goff[k] + i] = x[s[k].offset + (size_t)begin * width + i]; }
    }
    free(s);
    return shard;
}

static void test_case(const ZeroCase& zc, int world, QStateFormat f) {
    const GPT2Config* c = &zc.c;
    size_t P = gpt2_num_parameters(c), C = c->channels;
    int ng, L = c->num_layers;
    ZeroGroup* g = zero_groups(c, world, f, &ng);
    ParamSlice* s = param_slices_alloc(c);
    std::vector<size_t> goff(param_slice_count(c));
    size_t E = shard_block_offsets_as(c, world, f, goff.data()), most = 0;
    char name[200];
    snprintf(name, sizeof name, "zero %d rank(s), %s state, %s", world, QSTATE_FORMAT_NAMES[f], zc.what);

    std::vector<int> hits(E, 0);  // the groups tile the shard
    for (int j = 0; j < ng; j++) {
        for (size_t q = 0; q < g[j].part; q++) { hits[g[j].shard_at + q]++; }
        most = g[j].part > most ? g[j].part : most;
    }
    size_t once = 0;
    for (size_t i = 0; i < E; i++) { once += hits[i] == 1; }
    check(once == E, name, "the groups' parts cover %zu of the shard's %zu floats once", once, E);
    size_t head = 0, layer = shard_layout_as(c, world, f).layer_part;
    for (int k = 0; k < param_slice_count(c); k++) { head += slice_is_outer(&s[k]) ? slice_block_floats_as(&s[k], world, f) : 0; }
    check(ng - L == (int)ceil_div(head, layer) && most <= layer, name, "%d head rounds for a head of %zu floats a rank, a layer's part %zu",
          ng - L, head, layer);

    std::vector<float> x = random_vector(P, 7 + world);
    for (size_t i = (size_t)c->vocab_size * C; i < (size_t)c->padded_vocab_size * C; i++) { x[i] = 0.0f; }  // wte's padded rows
    float* d_x = upload<float>(x);
    float* d_y = device_alloc<float>(P);
    float* pack = device_alloc<float>((size_t)world * layer);
    auto xs = [d_x, s](int k) { return d_x + s[k].offset; };
    auto ys = [d_y, s](int k) { return d_y + s[k].offset; };

    // pack every rank's blocks: rank r's parts, at their shard_at, are rank r's shard
    std::vector<std::vector<float>> got(world, std::vector<float>(E, -1.0f));
    CUDA_CHECK(cudaMemset(d_y, 0, P * sizeof(float)));
    for (int j = 0; j < ng; j++) {
        zero_pack_cuda(&g[j], 0, world, xs, pack, 0);
        std::vector<float> p = download(pack, (size_t)world * g[j].part);
        for (int r = 0; r < world; r++) {
            memcpy(&got[r][g[j].shard_at], &p[(size_t)r * g[j].part], g[j].part * sizeof(float));
        }
        zero_unpack_cuda(&g[j], 0, world, ys, pack, 0);  // every rank's parts back: the all-gather's unpack
    }
    for (int r = 0; r < world; r++) {
        std::vector<float> want = reference_shard(c, world, f, r, x);
        check(memcmp(got[r].data(), want.data(), E * sizeof(float)) == 0, name, "rank %d's parts are its shard (bit for bit)", r);
    }
    check(memcmp(download(d_y, P).data(), x.data(), P * sizeof(float)) == 0, name, "every rank's parts unpacked give back the buffer (bit for bit)");

    // one rank's parts unpacked (ZeRO-1 after its reduce-scatter): its blocks only
    int r = world - 1;
    CUDA_CHECK(cudaMemset(d_y, 0, P * sizeof(float)));
    for (int j = 0; j < ng; j++) {
        zero_pack_cuda(&g[j], 0, world, xs, pack, 0);
        zero_unpack_cuda(&g[j], r, r + 1, ys, pack, 0);
    }
    std::vector<float> y = download(d_y, P), want(P, 0.0f);
    for (int k = 0; k < param_slice_count(c); k++) {
        int begin, end, width = slice_unit_width(&s[k]);
        slice_range(&s[k], r, world, f, &begin, &end);
        for (size_t i = (size_t)begin * width; i < (size_t)end * width; i++) { want[s[k].offset + i] = x[s[k].offset + i]; }
    }
    check(memcmp(y.data(), want.data(), P * sizeof(float)) == 0, name, "rank %d's parts unpacked write its blocks only", r);

    // ZeRO-2's add of the last group's part of rank r into a shard that holds values
    const ZeroGroup* last = &g[ng - 1];
    std::vector<float> shard = random_vector(E, 3), sum = shard;
    float* d_shard = upload<float>(shard);
    zero_pack_cuda(last, 0, world, xs, pack, 0);
    zero_add_cuda(d_shard + last->shard_at, pack + (size_t)r * last->part, last->part, 0);
    std::vector<float> mine = reference_shard(c, world, f, r, x);
    for (size_t q = 0; q < last->part; q++) { sum[last->shard_at + q] += mine[last->shard_at + q]; }
    check(memcmp(download(d_shard, E).data(), sum.data(), E * sizeof(float)) == 0, name, "a part added into the shard (bit for bit)");

    // ZeRO-3's gather of the working weights (bf16): each group's all-gathered pack is every rank's part
    // of its bf16 shard, rank by rank (what ncclAllGather leaves, built here on the host); unpacked into
    // a one-layer model's buffers (the head, or layer 0's place), group by group, they give back every
    // real element of the model rounded to bf16, and wte's padded rows stay zero
    GPT2Config one = *c;
    one.num_layers = 1;
    size_t P1 = gpt2_num_parameters(&one);
    ParamSlice* s1 = param_slices_alloc(&one);
    std::vector<std::vector<__nv_bfloat16>> shard16(world, std::vector<__nv_bfloat16>(E));
    for (int q = 0; q < world; q++) {
        std::vector<float> sh = reference_shard(c, world, f, q, x);
        for (size_t i = 0; i < E; i++) { shard16[q][i] = __float2bfloat16(sh[i]); }
    }
    __nv_bfloat16* d_w = device_alloc<__nv_bfloat16>(P1);
    __nv_bfloat16* pack16 = device_alloc<__nv_bfloat16>((size_t)world * layer);
    int ns1 = param_slice_count(&one), ns = param_slice_count(c);
    // slice k of the model at its place in the one-layer buffer: the same tensor's slice (layer 0's for a layer)
    auto in_one = [d_w, s, s1, ns, ns1](int k) {
        int k1 = s[k].layer < 0 ? (s[k].tensor < 2 ? s[k].tensor : ns1 - (ns - k)) : 2 + (s[k].tensor - 2);
        return d_w + s1[k1].offset;
    };
    bool ok = true;
    // the model's slices k (those of layer l, or with l = -1 the head's) against the one-layer buffer w
    auto agrees = [&](const std::vector<__nv_bfloat16>& w, int l) {
        for (int k = 0; k < ns; k++) {
            if (s[k].layer != l) { continue; }
            size_t at = in_one(k) - d_w, n = (size_t)s[k].rows * s[k].cols;
            for (size_t i = 0; i < n; i++) { ok = ok && __bfloat162float(w[at + i]) == __bfloat162float(__float2bfloat16(x[s[k].offset + i])); }
        }
    };
    for (int j = 0; j < ng; j++) {
        if (j == 0 || j == L) { CUDA_CHECK(cudaMemset(d_w, 0, P1 * sizeof(__nv_bfloat16))); }  // the layers', then the head's rounds
        std::vector<__nv_bfloat16> p16((size_t)world * g[j].part);
        for (int q = 0; q < world; q++) { memcpy(&p16[(size_t)q * g[j].part], &shard16[q][g[j].shard_at], g[j].part * sizeof(__nv_bfloat16)); }
        CUDA_CHECK(cudaMemcpy(pack16, p16.data(), p16.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
        zero_unpack_cuda(&g[j], 0, world, in_one, pack16, 0);
        if (j >= L && j < ng - 1) { continue; }  // the head is whole after its last round
        std::vector<__nv_bfloat16> w(P1);
        CUDA_CHECK(cudaMemcpy(w.data(), d_w, P1 * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
        agrees(w, j < L ? j : -1);
        if (j == ng - 1) {  // wte's padded rows untouched
            for (size_t i = (size_t)c->vocab_size * C; i < (size_t)c->padded_vocab_size * C; i++) { ok = ok && __bfloat162float(w[i]) == 0.0f; }
        }
    }
    check(ok, name, "ZeRO-3: the bf16 shards' parts, gathered and unpacked group by group, give back the model's weights (bit for bit)");
    free(s1);
    CUDA_CHECK(cudaFree(d_w));
    CUDA_CHECK(cudaFree(pack16));

    const float* bufs[] = {d_x, d_y, pack, d_shard};
    for (const float* b : bufs) { CUDA_CHECK(cudaFree((void*)b)); }
    free(s);
    free(g);
}

// the 8-bit cut is not fp32's where it must not be: the fixture's fcw (128 x 32, 8-bit blocks of 8
// rows) on 3 ranks in parts of 48 rows, where fp32's are 43
static void test_cut_differs(void) {
    const GPT2Config* c = &CASES[0].c;
    ParamSlice* s = param_slices_alloc(c);
    int k = 0;
    while (!(s[k].tensor == 10 && s[k].layer == 0)) { k++; }  // fcw of layer 0
    int b8, e8, b32, e32;
    slice_range(&s[k], 1, 3, QSTATE_8BIT, &b8, &e8);
    slice_range(&s[k], 1, 3, QSTATE_FP32, &b32, &e32);
    check(b8 == 48 && e8 == 96 && b32 == 43 && e32 == 86, "zero 3 ranks, the fixture's fcw",
          "rank 1's rows: 8-bit state [%d, %d) (blocks of 8 rows), fp32 [%d, %d)", b8, e8, b32, e32);
    free(s);
}

int main() {
    test_cut_differs();
    for (const ZeroCase& zc : CASES) {
        for (int world = 1; world <= 5; world++) {
            test_case(zc, world, QSTATE_FP32);
            test_case(zc, world, QSTATE_8BIT);
        }
    }
    return check_summary();
}
