/*
quant_state.h: optimizer state in fewer bits than fp32, the numerical core shared by the CPU
(cpu/optimizers_lowp.h) and the CUDA kernels (cuda/adamw_lowp.cuh): the dynamic quantization map of
Dettmers et al., block-wise 8-bit quantization with one fp32 absolute maximum per block, and bf16
with stochastic rounding. Plain C; the functions marked QSTATE_HD are also device functions under nvcc.

    const QStateMaps* maps = qstate_maps();                         // built once, on first use
    size_t bad = qstate_quantize(&maps->map[QMAP_SIGNED], x, n, codes, absmax);  // codes (n), absmax (qstate_blocks(n))
    qstate_dequantize(&maps->map[QMAP_SIGNED], codes, absmax, n, y);             // y (n) ~ x
    uint16_t h = qstate_bf16_round(x[i], qstate_random16(seed, t, QSTATE_STREAM_M, index_base + i));

Formats of one moment of n elements (QStateFormat), bytes per element:
    fp32   4                 today's state (cpu/optimizers.h, cuda/adamw.cuh)
    bf16   2                 the top 16 bits of the fp32 value, stochastically rounded (below)
    8bit   1 + 4/QSTATE_BLOCK  a code (uint8) per element and an fp32 absmax per block of QSTATE_BLOCK
AdamW keeps two moments: 8, 4 and 2 + 8/256 = 2.03 bytes per parameter.

The 8-bit format (Dettmers, Lewis, Shleifer, Zettlemoyer, "8-bit Optimizers via Block-wise
Quantization", ICLR 2022: the sections "Block-wise Quantization" and "Dynamic Quantization", which
extends their "Dynamic Tree Quantization"; bitsandbytes' create_dynamic_map builds the same map):
  - A moment is cut into blocks of QSTATE_BLOCK elements from its first element (the last block may
    be short). Block b keeps N_b = max |x_i| over the block (fp32) and, per element, the index
    (0..255) of the code nearest to x_i / N_b in a map of 256 sorted values in [-1, 1].
  - The map (dynamic quantization): a code is s sign bits (1 for the signed map, 0 for the
    unsigned), then e zero bits (e = 0..6), an indicator bit 1, and 7 - s - e fraction bits: one of
    the 2^(7 - s - e) midpoints of as many equal steps from 0.1 to 1, scaled by 10^-e. In numbers,
    decade k = 0..6 (scale 10^(k - 6)) holds F = 2^k (signed, each with both signs) or 2^(k + 1)
    (unsigned) values
        10^(k - 6) * (0.1 + 0.9 (j + 1/2) / F),   j = 0 .. F - 1,
    and the map adds 0 and 1: 2 (1 + 2 + ... + 64) + 2 = 256 signed codes (from -0.99297 to 1),
    2 + 4 + ... + 128 + 2 = 256 unsigned ones (0 to 1). Each value is computed in double and rounded
    to fp32 once (bitsandbytes computes them in fp32 steps, so a value of its may differ in the last
    bit). The first moment uses the signed map, the second (never negative) the unsigned one: the
    sign bit becomes one more fraction bit (the paper's reason for "dynamic" over "dynamic tree"
    quantization). Precision: relative steps of 0.9 / F within a decade, so the top decade (0.1..1
    of the block's maximum) is kept to within 0.7% of the maximum (signed) or 0.35% (unsigned); a
    first moment below 2.75e-7 of the maximum becomes 0.
  - Rounding: to the nearest code, ties (x exactly halfway, in exact arithmetic) to the even index,
    with one exception: the unsigned map (the second moment) never rounds a positive value to 0, but
    to its smallest positive code, 3.25e-7. A v stored as 0 under an m that is not makes the next
    update m / (sqrt(v) + eps), up to |m| / eps: Li, Chen, Zhu, "Memory Efficient Optimizers with
    4-bit States" (NeurIPS 2023) call it the zero-point problem and drop 0 from v's map. Measured
    here: after 300 steps of d6 on TinyShakespeare (fp32 AdamW), 0.72% of wte's v (140k values, all
    but 45 in blocks that straddle the rows of two tokens, C = 384: v spans up to 10^11 in such a
    block) would round to 0 while their m does not; on a quadratic whose curvatures span 4 decades
    within a block, 8-bit AdamW with plain nearest rounding diverged (tests/test_quant_state.c).
    Storing such a v too large only shortens that element's step. bitsandbytes rounds v to the
    nearest code, 0 included.
    Each gap between codes j and j + 1 is stored as up[j], the smallest fp32 value that rounds to
    code j + 1 (computed on the host from the exact midpoint, in double: the midpoint of two
    neighbouring codes is exact there; the unsigned map's up[0] is the smallest positive fp32).
    The code of x is then #{j : x >= up[j]}, found by a binary search of 8 comparisons
    (qstate_nearest), which equals the exhaustive nearest search the tests do. The CPU's updates
    read the same count from a table on x's fp32 bits (cpu/quant_state_fast.h: the same bytes,
    several times faster); this file stays the definition, and the CUDA kernels search.
    x = value / N_b by IEEE division, a code back by code * N_b: every backend does the same two
    roundings, so their bytes agree.
  - A block of zeros (N_b = 0) keeps N_b = 0 and the code of 0. Denormal values are ordinary values
    here (IEEE division and products, no flush to zero). Negative zero is stored as the code of 0
    and comes back as +0.
  - A non-finite value (NaN, +-Inf) is refused: the quantizer counts it and stores its block as
    N_b = NaN with every code that of 0 (so the block reads back as NaN, never as a plausible
    value). The update functions return the count; the caller stops naming the tensor
    (cpu/optimizers_lowp.h, cuda/adamw_lowp.cuh say how).

Block size, QSTATE_BLOCK = 256 (bitsandbytes' optimizer kernels; the paper used 2,048). Chosen
because: (1) one outlier (an embedding row's spike) coarsens 255 neighbours, not 2,047; (2) on the
GPU a block is one warp (32 lanes x 8 elements) and its absmax one warp reduction, with no shared
memory or barrier; (3) ZeRO shards and rows cut at block boundaries more often (768, 1024, 2304,
3072 are multiples of 256, not of 2,048). The cost, an fp32 per 256 elements, is 1.6% of the 8-bit
state (0.03 of 2.03 bytes per AdamW parameter): d12's AdamW state is 241.7 MiB (949.4 in fp32),
3.7 MiB of it absmax.

The bf16 format: the top 16 bits of the fp32 value after adding 16 random bits to its low half
(stochastic rounding: rounds up with probability equal to the discarded fraction, so the stored
moment is unbiased). Not round-to-nearest-even: an EMA with beta close to 1 moves by (1 - beta) of
the difference each step, and bf16's half step is 2^-9 of the value, so with beta2 = 0.999 nearest
rounding can never lower v (a decrease of at most 0.001 v is always rounded away) and v ratchets
up: an EMA of N(0, 1)^2 with beta 0.999 over 3,000 steps ends 30% above fp32's with nearest
rounding, 2.7% from it on average (bias -0.03%) with stochastic rounding (tests/test_quant_state.c,
where AdamW in bf16 also tracks fp32 AdamW on a quadratic to 0.3% at beta2 = 0.999, 0.03% at 0.95).
The random bits come from a counter-based hash of (seed, step, stream, element index), not a
generator's state: the same bits on every backend, for any thread count or ZeRO cut (the index is
the element's place in its tensor: index_base + i), and after a resume (nothing to save). NaN is
stored as bf16's quiet NaN and counted; Inf stays Inf and is counted; a value that would round
past the largest finite bf16 is truncated instead.
The 8-bit format keeps nearest rounding (the paper's, bitsandbytes'), and so the same lag: on that
quadratic with beta2 = 0.999 its v ends at 0.72 of fp32's and the loss 24% above; at 0.95 within
0.5% (doc/optimizer_state.md).

Small tensors: bitsandbytes keeps tensors under 4,096 elements in fp32 (min_8bit_size); so does
qstate_effective_format (biases and LayerNorms: their state is a few kB either way).
*/
#ifndef LLMC_QUANT_STATE_H
#define LLMC_QUANT_STATE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__CUDACC__)
#define QSTATE_HD __host__ __device__
#else
#define QSTATE_HD
#endif

typedef enum { QSTATE_FP32, QSTATE_BF16, QSTATE_8BIT, NUM_QSTATE_FORMATS } QStateFormat;
static const char* QSTATE_FORMAT_NAMES[NUM_QSTATE_FORMATS] = {"fp32", "bf16", "8bit"};

#define QSTATE_BLOCK 256           // elements per block of the 8-bit format (why: above)
#define QSTATE_CODES 256           // codes of a map (uint8)
#define QSTATE_MIN_ELEMENTS 4096   // tensors smaller than this keep fp32 state under 8bit (bitsandbytes' min_8bit_size)
#define QSTATE_DECADES 7           // powers of ten a map spans: 10^-6 .. 10^0

// the format named name ("fp32", "bf16", "8bit"), or -1 if none is
static int qstate_format_from_name(const char* name) {
    for (int f = 0; f < NUM_QSTATE_FORMATS; f++) {
        if (strcmp(name, QSTATE_FORMAT_NAMES[f]) == 0) { return f; }
    }
    return -1;
}

// the format a tensor of n elements is kept in when `requested` is asked for: small tensors stay fp32 under 8bit
static QStateFormat qstate_effective_format(QStateFormat requested, size_t n) {
    return requested == QSTATE_8BIT && n < QSTATE_MIN_ELEMENTS ? QSTATE_FP32 : requested;
}

// blocks of the 8-bit format for n elements (the last may be short)
static QSTATE_HD inline size_t qstate_blocks(size_t n) { return (n + QSTATE_BLOCK - 1) / QSTATE_BLOCK; }

// the hint of the message that stops a run whose new moments were refused (every backend's)
#define QSTATE_REFUSED_HINT \
    "  hint: the run diverged (its gradients or weights are not finite, or a gradient is past about 1.8e19, whose square\n" \
    "  fp32 cannot hold); resume from an earlier checkpoint with a lower -l or a smaller --grad-clip"

// the quiet NaN a refused block's absmax holds: one bit pattern on every backend
static QSTATE_HD inline float qstate_nan(void) {
    uint32_t b = 0x7fc00000U;
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

// bytes of one moment of n elements in format f (8bit: the codes, then the absmax floats)
static size_t qstate_moment_bytes(QStateFormat f, size_t n) {
    switch (f) {
        case QSTATE_BF16: return 2 * n;
        case QSTATE_8BIT: return n + 4 * qstate_blocks(n);
        default: return 4 * n;
    }
}

// floats one moment of n elements in format f takes in a state block of floats (the optimizers' state
// is one float array: llmc/opt_layout.h): its bytes rounded up to whole floats, so that every moment,
// and every 8-bit moment's absmax, starts 4-byte aligned
static size_t qstate_moment_floats(QStateFormat f, size_t n) {
    size_t F = sizeof(float);
    if (f == QSTATE_8BIT) { return (n + F - 1) / F + qstate_blocks(n); }  // the codes padded, then the absmax
    return (qstate_moment_bytes(f, n) + F - 1) / F;
}

// ----------------------------------------------------------------------------
// the dynamic quantization maps

typedef enum { QMAP_SIGNED, QMAP_UNSIGNED } QMapKind;  // first moment, second moment

typedef struct {
    float code[QSTATE_CODES];     // the values, ascending
    float up[QSTATE_CODES - 1];   // up[j]: the smallest fp32 that rounds to code j + 1 (nearest, ties to even index;
                                  // unsigned: up[0] is the smallest positive fp32)
    int zero;                     // the index of the code 0 (127 signed, 0 unsigned)
} QStateMap;

typedef struct { QStateMap map[2]; } QStateMaps;  // indexed by QMapKind

static int qstate_cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

// fills m with the signed or unsigned dynamic map (the formula at the top) and its rounding thresholds
static void qstate_build_map(QStateMap* m, QMapKind kind) {
    static const double DECADE_SCALE[QSTATE_DECADES] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1e0};
    int is_signed = kind == QMAP_SIGNED;
    double v[QSTATE_CODES];
    int n = 0;
    for (int k = 0; k < QSTATE_DECADES; k++) {
        int F = is_signed ? 1 << k : 1 << (k + 1);  // fraction values in this decade
        for (int j = 0; j < F; j++) {
            double x = (double)(float)(DECADE_SCALE[k] * (0.1 + 0.9 * (j + 0.5) / F));  // rounded to fp32 once
            v[n++] = x;
            if (is_signed) { v[n++] = -x; }
        }
    }
    v[n++] = 0.0;
    v[n++] = 1.0;
    qsort(v, QSTATE_CODES, sizeof(double), qstate_cmp_double);
    for (int i = 0; i < QSTATE_CODES; i++) {
        m->code[i] = (float)v[i];
        if (v[i] == 0.0) { m->zero = i; }
    }
    // up[j]: the exact midpoint (in double: neighbours are within a factor 10, or one of them is 0),
    // rounded up to fp32; a midpoint that is itself an fp32 value is a tie: it rounds to the even index
    for (int j = 0; j + 1 < QSTATE_CODES; j++) {
        double mid = 0.5 * (v[j] + v[j + 1]);
        float f = (float)mid;
        if ((double)f < mid) { f = nextafterf(f, INFINITY); }
        if ((double)f == mid && (j + 1) % 2 == 1) { f = nextafterf(f, INFINITY); }  // tie, and j (not j + 1) is even
        m->up[j] = f;
    }
    if (kind == QMAP_UNSIGNED) { m->up[0] = nextafterf(0.0f, INFINITY); }  // no positive v rounds to 0 (above)
}

// both maps, built on the first call (make it outside parallel regions: the update functions do)
static const QStateMaps* qstate_maps(void) {
    static QStateMaps maps;
    static int built = 0;
    if (!built) {
        qstate_build_map(&maps.map[QMAP_SIGNED], QMAP_SIGNED);
        qstate_build_map(&maps.map[QMAP_UNSIGNED], QMAP_UNSIGNED);
        built = 1;
    }
    return &maps;
}

// the index of the code nearest to x (ties to the even index): #{j : x >= up[j]}, by binary search
// over the 255 ascending thresholds (steps 128, 64, ..., 1 add up to 255: no bounds check needed)
static QSTATE_HD inline int qstate_nearest(const float* up, float x) {
    int pos = 0;
    for (int step = QSTATE_CODES / 2; step > 0; step /= 2) {
        if (up[pos + step - 1] <= x) { pos += step; }
    }
    return pos;
}

// ----------------------------------------------------------------------------
// block-wise quantization (host)

// x (n <= QSTATE_BLOCK, one block) into codes and *absmax; returns the count of non-finite values
// (then *absmax = NaN and every code is the code of 0)
static size_t qstate_quantize_block(const QStateMap* m, const float* x, int n, uint8_t* codes, float* absmax) {
    float amax = 0.0f;
    size_t bad = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i])) { bad++; }
        amax = fmaxf(amax, fabsf(x[i]));
    }
    if (bad > 0) { amax = qstate_nan(); }
    *absmax = amax;
    for (int i = 0; i < n; i++) {
        codes[i] = (uint8_t)(bad > 0 || amax == 0.0f ? m->zero : qstate_nearest(m->up, x[i] / amax));
    }
    return bad;
}

// the value of code c of a block whose absmax is absmax
static QSTATE_HD inline float qstate_dequantize_one(const float* code, uint8_t c, float absmax) { return code[c] * absmax; }

// x (n) into codes (n) and absmax (qstate_blocks(n)), block by block in parallel; returns the
// count of non-finite values (their blocks: absmax NaN)
static size_t qstate_quantize(const QStateMap* m, const float* x, size_t n, uint8_t* codes, float* absmax) {
    size_t bad = 0;
    long long blocks = (long long)qstate_blocks(n);
    #pragma omp parallel for reduction(+ : bad)
    for (long long b = 0; b < blocks; b++) {
        size_t begin = (size_t)b * QSTATE_BLOCK;
        int len = (int)(n - begin < QSTATE_BLOCK ? n - begin : QSTATE_BLOCK);
        bad += qstate_quantize_block(m, x + begin, len, codes + begin, absmax + b);
    }
    return bad;
}

// x (n) = the values of codes (n) with the blocks' absmax (qstate_blocks(n))
static void qstate_dequantize(const QStateMap* m, const uint8_t* codes, const float* absmax, size_t n, float* x) {
    #pragma omp parallel for
    for (long long i = 0; i < (long long)n; i++) { x[i] = qstate_dequantize_one(m->code, codes[i], absmax[i / QSTATE_BLOCK]); }
}

// ----------------------------------------------------------------------------
// bf16 with stochastic rounding

// the random streams of the two moments (so that m and v of one element round independently)
typedef enum { QSTATE_STREAM_M = 1, QSTATE_STREAM_V = 2 } QStateStreamId;

// where a part of a tensor draws its rounding bits: seed (the same for every part of one tensor,
// e.g. derived from the tensor's index) and the part's first element within the tensor
typedef struct {
    uint32_t seed;
    size_t index_base;
} QStateStream;

// a bijection of 32 bits that mixes every input bit into every output bit ("lowbias32", C. Wellons)
static QSTATE_HD inline uint32_t qstate_mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// the first two of qstate_random16's five mixings, which depend on the element's index alone: an
// update that rounds both moments of an element computes them once (two mixings of ten saved)
static QSTATE_HD inline uint32_t qstate_index_hash(uint64_t index) {
    uint32_t h = qstate_mix32((uint32_t)index);
    return qstate_mix32(h ^ (uint32_t)(index >> 32) ^ 0x9e3779b9U);
}

// qstate_random16 from the element's qstate_index_hash
static QSTATE_HD inline uint32_t qstate_random16_of(uint32_t index_hash, uint32_t seed, uint32_t step, uint32_t stream) {
    uint32_t h = qstate_mix32(index_hash ^ stream * 0x85ebca6bU);
    h = qstate_mix32(h ^ step);
    h = qstate_mix32(h ^ seed);
    return h >> 16;
}

// 16 random bits for element `index` of a tensor at step `step` in stream `stream`
static QSTATE_HD inline uint32_t qstate_random16(uint32_t seed, uint32_t step, uint32_t stream, uint64_t index) {
    return qstate_random16_of(qstate_index_hash(index), seed, step, stream);
}

static QSTATE_HD inline uint32_t qstate_float_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

// x rounded to bf16 (its bits) with the 16 random bits r16: up with probability (low 16 bits) / 2^16
static QSTATE_HD inline uint16_t qstate_bf16_round(float x, uint32_t r16) {
    uint32_t b = qstate_float_bits(x);
    if ((b & 0x7f800000U) == 0x7f800000U) { return (b & 0x007fffffU) != 0 ? 0x7fc0 : (uint16_t)(b >> 16); }  // NaN, Inf
    uint32_t r = (b + r16) >> 16;
    if ((r & 0x7f80U) == 0x7f80U) { r = b >> 16; }  // past the largest finite bf16: truncate instead
    return (uint16_t)r;
}

// the fp32 value of bf16 bits (exact)
static QSTATE_HD inline float qstate_bf16_to_float(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

// ----------------------------------------------------------------------------
// one moment in a low-precision format, for the optimizers that keep a first moment beside
// their own second moments (Adafactor, CAME: cpu/optimizers_lowp.h reads and writes it)

typedef struct {
    uint8_t* codes;   // (n) indices into the map
    float* absmax;    // (qstate_blocks(n)) each block's absolute maximum
} QBlocks;

typedef struct {
    QStateFormat format;   // QSTATE_BF16 or QSTATE_8BIT (an fp32 moment is a float*: cpu/optimizers.h)
    QBlocks q;             // 8bit: blocks of the signed map
    uint16_t* bf16;        // bf16: (n) bits
    QStateStream stream;   // bf16: where the rounding bits come from (stream QSTATE_STREAM_M)
} QMoment;

// the moment of n elements (sized for n_units >= n: a ZeRO part's padded size) in format f (bf16 or
// 8bit) that starts at `at` in a state block: bf16's (n_units) bits; 8bit's codes (n_units, padded to
// whole floats), then the absmax (qstate_blocks(n_units)). stream: bf16's rounding bits
static QMoment qmoment_at(float* at, QStateFormat f, size_t n_units, QStateStream stream) {
    QMoment M = {.format = f, .q = {NULL, NULL}, .bf16 = NULL, .stream = stream};
    if (f == QSTATE_BF16) { M.bf16 = (uint16_t*)at; }
    else { M.q.codes = (uint8_t*)at; M.q.absmax = at + (n_units + sizeof(float) - 1) / sizeof(float); }
    return M;
}

#endif // LLMC_QUANT_STATE_H
