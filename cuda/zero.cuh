/*
zero.cuh: ZeRO's exchanges on the GPU, one NCCL collective per group of slices: a layer's 12 slices
(the gradients reduce-scattered, the updated weights all-gathered), and the outer slices (wte, wpe,
lnfw, lnfb) in a few rounds. Each rank owns a block of every slice (llmc/opt_layout.h: ceil(units /
world) rows of a matrix or elements of a vector, the last rank's padded); a collective needs one
buffer of world equal parts, rank r's part holding everything rank r owns, so a small kernel packs
the group's blocks rank by rank into `pack` (the padding zero) and another unpacks them.

    ZeroGroup* g = zero_groups(&cfg, world, f, &n);              // once: layers 0..L-1, then the outer slices' rounds
    zero_pack_cuda(&g[l], 0, world, slice_ptr, pack, stream);             // every rank's blocks, rank by rank
    zero_reduce_scatter(&g[l], rank, pack, comm, stream);                  // ncclReduceScatter, in place
    zero_unpack_cuda(&g[l], rank, rank + 1, slice_ptr, pack, stream);        // ZeRO-1: the sums into this rank's blocks
    zero_add_cuda(shard + g[l].shard_at, pack + rank * g[l].part, g[l].part, stream);  // ZeRO-2: into the shard
    zero_all_gather(&g[l], rank, world, slice_ptr, pack, comm, stream);      // the updated blocks to every rank
    zero_gather_shard(&g[l], world, weight_shard, slice_ptr, pack, comm, stream);  // ZeRO-3: a layer's weights from the shards

slice_ptr(k) is the device address of slice k (checkpoint order, opt_layout.h's param_slices) in
the buffer at hand: the model's gradients or master weights, or ZeRO-2's one-layer working buffer.

A group's part (each rank's floats in the pack) is its pieces one after another: a layer's 12 padded
blocks in tensor order (the order of opt_layout.h's gradient shard, so a ZeRO-2 part adds into the
shard as one run), or a round of the outer slices: their blocks' concatenation (wte, wpe, lnfw, lnfb, also
the shard's order) cut into runs of at most one layer's part, so that one pack of world x (a layer's
part) floats serves every group (GPT-2 d12: 6 rounds; the test fixtures: 1).

Invariants: the pack is all the exchange needs besides the buffers themselves; the kernels write
only a slice's real elements (never the padding) when unpacking; sums are NCCL's (the same
additions as --zero 0's all-reduce on 2 ranks, a + b).
*/
#ifndef CUDA_ZERO_CUH
#define CUDA_ZERO_CUH

#include "common.cuh"
#include "nccl.cuh"
#include "../llmc/opt_layout.h"

#define ZERO_MAX_PIECES 12   // a layer's slices; a round of the outer slices has at most 4
#define ZERO_BLOCK 256

// floats [first, first + count) of every rank's padded block (block floats) of slice `slice`
// (total floats), at `at` in each rank's part
typedef struct { int slice; size_t total, block, first, count, at; } ZeroPiece;

typedef struct {
    int n;                             // pieces
    ZeroPiece piece[ZERO_MAX_PIECES];
    size_t part;                       // floats of each rank's part: the pieces' counts added
    size_t shard_at;                   // ZeRO-2: where the part lies in the gradient shard
} ZeroGroup;

// adds floats [first, first + count) of slice k's blocks (each `block` floats) to group g
static void zero_group_add(ZeroGroup* g, const ParamSlice* s, int k, size_t block, size_t first, size_t count) {
    ZeroPiece p = {k, (size_t)s->rows * s->cols, block, first, count, g->part};
    g->piece[g->n++] = p;
    g->part += count;
}

// the groups of a model: L layers, then the outer slices' rounds (*n of them in all; free() the array),
// the slices cut as the state format f cuts them (opt_layout.h: 8-bit state's parts start on its blocks)
static ZeroGroup* zero_groups(const GPT2Config* c, int world, QStateFormat f, int* n) {
    ParamSlice* s = param_slices_alloc(c);
    int ns = param_slice_count(c), L = c->num_layers;
    size_t* goff = (size_t*)malloc_check((size_t)ns * sizeof(size_t));
    shard_block_offsets_as(c, world, f, goff);
    size_t outer = 0, round = shard_layout_as(c, world, f).layer_part;  // a round: at most one layer's part
    for (int k = 0; k < ns; k++) { outer += slice_is_outer(&s[k]) ? slice_block_floats_as(&s[k], world, f) : 0; }
    int rounds = (int)((outer + round - 1) / round);
    ZeroGroup* g = (ZeroGroup*)calloc((size_t)(L + rounds), sizeof(ZeroGroup));
    if (g == NULL) { fail("out of memory"); }
    for (int k = 0; k < ns; k++) {
        if (slice_is_outer(&s[k])) { continue; }
        ZeroGroup* lg = &g[s[k].layer];
        if (lg->n == 0) { lg->shard_at = goff[k]; }  // the layer's first slice: its blocks follow
        size_t block = slice_block_floats_as(&s[k], world, f);
        zero_group_add(lg, &s[k], k, block, 0, block);
    }
    size_t at = 0;  // the outer slices' blocks concatenated, cut into rounds
    for (int k = 0; k < ns; k++) {
        if (!slice_is_outer(&s[k])) { continue; }
        size_t block = slice_block_floats_as(&s[k], world, f);
        for (size_t first = 0; first < block;) {
            ZeroGroup* hg = &g[L + (int)(at / round)];
            if (hg->n == 0) { hg->shard_at = at; }
            size_t count = block - first < round - at % round ? block - first : round - at % round;
            zero_group_add(hg, &s[k], k, block, first, count);
            first += count;
            at += count;
        }
    }
    free(goff);
    free(s);
    *n = L + rounds;
    return g;
}

// ----------------------------------------------------------------------------
// CUDA kernels

// a group with each piece's slice as a device address: the kernels' argument (by value). T: fp32
// (gradients, master weights), or ZeRO-3's working weights (floatX)
template <typename T>
struct ZeroArgs {
    ZeroGroup g;
    T* base[ZERO_MAX_PIECES];
};

// element i of a run of ranks' parts: its piece, and the slice element it stands for (rank r's
// block starts at r * block; past the slice's end lies the padding, -1)
static __device__ long long zero_element(const ZeroGroup* g, int r, size_t q, int* piece) {
    int p = 0;
    while (p + 1 < g->n && q >= g->piece[p + 1].at) { p++; }
    const ZeroPiece* z = &g->piece[p];
    size_t idx = (size_t)r * z->block + z->first + (q - z->at);
    *piece = p;
    return idx < z->total ? (long long)idx : -1;
}

// pack[r * part + q] = ranks r0..r1-1's blocks (0 in the padding), a grid-stride loop over (r1 - r0) * part
template <typename T>
__global__ void zero_pack_kernel(T* pack, ZeroArgs<T> a, int r0, int r1) {
    size_t n = (size_t)(r1 - r0) * a.g.part, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int r = r0 + (int)(i / a.g.part), p;
        size_t q = i % a.g.part;
        long long idx = zero_element(&a.g, r, q, &p);
        pack[(size_t)r * a.g.part + q] = idx >= 0 ? a.base[p][idx] : (T)0.0f;
    }
}

// the slices' real elements of ranks r0..r1-1's blocks = pack (the padding is dropped); with
// has_copy, the same elements of a second set of slices (W: the bf16 working weights) = those
// values rounded as copy_to_floatX_cuda rounds them (in the same pass: no kernel per slice after)
template <typename T, typename W>
__global__ void zero_unpack_kernel(ZeroArgs<T> a, ZeroArgs<W> copy, int has_copy, const T* pack, int r0, int r1) {
    size_t n = (size_t)(r1 - r0) * a.g.part, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int r = r0 + (int)(i / a.g.part), p;
        size_t q = i % a.g.part;
        long long idx = zero_element(&a.g, r, q, &p);
        if (idx < 0) { continue; }
        T v = pack[(size_t)r * a.g.part + q];
        a.base[p][idx] = v;
        if (has_copy) { copy.base[p][idx] = from_float<W>((float)v); }
    }
}

// dst (n) += src (n)
__global__ void zero_add_kernel(float* dst, const float* src, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) { dst[i] += src[i]; }
}

// ----------------------------------------------------------------------------
// kernel launchers

// blocks for n elements, at most enough to fill every SM
static unsigned zero_grid(size_t n) {
    int device, sms;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    size_t blocks = ceil_div(n, (size_t)ZERO_BLOCK), most = (size_t)sms * 8;
    return (unsigned)(blocks < most ? blocks : most);
}

template <typename T, typename F>
static ZeroArgs<T> zero_args(const ZeroGroup* g, F slice_ptr) {
    ZeroArgs<T> a;
    a.g = *g;
    for (int p = 0; p < g->n; p++) { a.base[p] = slice_ptr(g->piece[p].slice); }
    return a;
}

// pack's parts of ranks r0..r1-1 := their blocks of the group's slices (slice_ptr(k): slice k's address)
template <typename T, typename F>
static void zero_pack_cuda(const ZeroGroup* g, int r0, int r1, F slice_ptr, T* pack, cudaStream_t stream) {
    size_t n = (size_t)(r1 - r0) * g->part;
    if (n == 0) { return; }
    zero_pack_kernel<T><<<zero_grid(n), ZERO_BLOCK, 0, stream>>>(pack, zero_args<T>(g, slice_ptr), r0, r1);
    CUDA_CHECK_LAUNCH();
}

// ranks r0..r1-1's blocks of the group's slices := their parts of pack; and with copy_ptr (slice k's
// address in a second, W-typed set of the slices, NULL for none) the same blocks there, rounded
template <typename T, typename F, typename W = T>
static void zero_unpack_cuda(const ZeroGroup* g, int r0, int r1, F slice_ptr, const T* pack, cudaStream_t stream,
                             W* (*copy_ptr)(void*, int) = NULL, void* copy_ctx = NULL) {
    size_t n = (size_t)(r1 - r0) * g->part;
    if (n == 0) { return; }
    ZeroArgs<W> copy;
    memset(&copy, 0, sizeof(copy));
    if (copy_ptr != NULL) { copy = zero_args<W>(g, [copy_ptr, copy_ctx](int k) { return copy_ptr(copy_ctx, k); }); }
    zero_unpack_kernel<T, W><<<zero_grid(n), ZERO_BLOCK, 0, stream>>>(zero_args<T>(g, slice_ptr), copy, copy_ptr != NULL, pack, r0, r1);
    CUDA_CHECK_LAUNCH();
}

static void zero_add_cuda(float* dst, const float* src, size_t n, cudaStream_t stream) {
    if (n == 0) { return; }
    zero_add_kernel<<<zero_grid(n), ZERO_BLOCK, 0, stream>>>(dst, src, n);
    CUDA_CHECK_LAUNCH();
}

// ----------------------------------------------------------------------------
// the exchanges: one collective each, in place in the pack

// a pack of every rank's blocks (zero_pack_cuda of ranks 0..world-1) summed over the ranks: this
// rank's part of pack then holds its blocks' sums (pack + rank * part)
static void zero_reduce_scatter(const ZeroGroup* g, int rank, float* pack, ncclComm_t comm, cudaStream_t stream) {
    float* mine = pack + (size_t)rank * g->part;
    NCCL_CHECK(ncclReduceScatter(pack, mine, g->part, ncclFloat, ncclSum, comm, stream));
}

// this rank's blocks to every rank: packed, all-gathered, every rank's unpacked into the slices (and
// with copy_ptr into a W-typed copy of them too: zero_unpack_cuda)
template <typename F, typename W = float>
static void zero_all_gather(const ZeroGroup* g, int rank, int world, F slice_ptr, float* pack, ncclComm_t comm,
                            cudaStream_t stream, W* (*copy_ptr)(void*, int) = NULL, void* copy_ctx = NULL) {
    zero_pack_cuda(g, rank, rank + 1, slice_ptr, pack, stream);
    float* mine = pack + (size_t)rank * g->part;
    NCCL_CHECK(ncclAllGather(mine, pack, g->part, ncclFloat, comm, stream));
    zero_unpack_cuda(g, 0, world, slice_ptr, (const float*)pack, stream, copy_ptr, copy_ctx);
}

// ZeRO-3: group g's working weights (T: floatX) to every rank from the ranks' shards. This rank's part
// lies in its weight shard as one run at g->shard_at (the shard has the gradient shard's layout), so it
// is all-gathered from there into the pack as bytes (the collective only copies: fp32 or bf16 alike),
// and every rank's part unpacked into the slices (slice_ptr: the working copy's tensors)
template <typename T, typename F>
static void zero_gather_shard(const ZeroGroup* g, int world, const T* shard, F slice_ptr, T* pack, ncclComm_t comm,
                              cudaStream_t stream) {
    NCCL_CHECK(ncclAllGather(shard + g->shard_at, pack, g->part * sizeof(T), ncclInt8, comm, stream));
    zero_unpack_cuda(g, 0, world, slice_ptr, pack, stream);
}

#endif // CUDA_ZERO_CUH
