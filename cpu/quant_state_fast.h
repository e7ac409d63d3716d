/*
quant_state_fast.h: the CPU's fast form of llmc/quant_state.h's 8-bit block quantization: the same
codes, byte for byte, as qstate_quantize_block, found by a table lookup on the quotient's fp32 bits
instead of a binary search; and the block dequantization beside it. cpu/optimizers_lowp.h's 8-bit
updates (AdamW, and Adafactor's and CAME's first moment) quantize through it; llmc/quant_state.h's
functions stay the definition (and the CUDA kernels use them), tests/test_quant_state.c holds this
file to them.

    const QFastMaps* fm = qfast_maps();          // built once from qstate_maps(), on first use
    size_t bad = qfast_quantize_block(&fm->map[QMAP_SIGNED], x, len, codes, &absmax);  // = qstate_quantize_block
    qfast_dequantize_block(&fm->map[QMAP_SIGNED], codes, absmax, len, x);               // = qstate_dequantize_one each

Why: the reference search, qstate_nearest, is 8 dependent compare-and-branch steps over 255
thresholds, and which way each goes is a coin toss for the branch predictor, so about half of them
mispredict. AdamW in 8 bits searches twice an element (m and v), and its update ran at 0.2-0.8 GB/s,
a tenth of fp32 AdamW's; with the table, 6 to 9 times faster (doc/optimizer_state.md; measured by
dev/bench_quant_state.c, which checks the two byte for byte first).

The lookup. The value searched is q = x / absmax, so |q| <= 1 (IEEE division is monotone and
absmax / absmax = 1; larger magnitudes share 1's bucket, so any q but NaN is looked up right). Its fp32 bits, sign apart, are ordered as the magnitudes are; the exponent and
the top QFAST_MANTISSA_BITS bits of the mantissa cut [0, 1] into buckets whose width is 2^-7 of
their smallest value; every magnitude under 2^-QFAST_FLOOR_OCTAVES shares one bucket; negative q
have a second set of buckets. The map's gaps are wider than the buckets everywhere (the narrowest,
0.9/128 = 0.0070 of the block's maximum next to 1, lies in buckets 2^-8 = 0.0039 wide), and its
thresholds, the unsigned map's up[0] (the smallest positive fp32) apart, are all above 2^-25, so a
bucket holds at most QFAST_PROBES = 1 threshold (qfast_build_map counts, and stops if one held
more). For each bucket the table keeps first = #{j : up[j] <= the bucket's smallest value}, and
    code(q) = first + #{i < QFAST_PROBES : up[first + i] <= q}
is exactly qstate_nearest's #{j : up[j] <= q}: the thresholds past first + QFAST_PROBES lie above
every value of the bucket (past the last threshold the table's up is NaN, which no q reaches). first is computed by
qstate_nearest itself, so the lookup is the search, read from a table (6.4 KB a map: in L1).

Vectors: plain C, in loops the compiler vectorizes (-O3 -march=native): the block's quotients and
bucket indices 8 at a time under AVX2, the absmax as the largest of the values' |x| bits (for finite
values the same order as the numbers: an integer max), the dequantization's products; only the two
table loads of each lookup are scalar. AVX2 gathers were tried for the lookups and the
dequantization and were slower on AMD Zen 3 than the scalar loads (a gather of 8 is about as slow as
8 loads there). Each step is the IEEE operation quant_state.h does (x / absmax, code * absmax), so
every backend's bytes stay equal (cuda/adamw_lowp.cuh keeps the binary search: a GPU thread runs
its 8 steps without a branch predictor to miss).
*/
#ifndef CPU_QUANT_STATE_FAST_H
#define CPU_QUANT_STATE_FAST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../llmc/quant_state.h"

#define QFAST_MANTISSA_BITS 7    // mantissa bits of a bucket: relative width 2^-7, under the codes' narrowest gap (0.7%)
#define QFAST_FLOOR_OCTAVES 25   // magnitudes under 2^-25 share one bucket (the map's thresholds but up[0] lie above it)
#define QFAST_PROBES 1           // thresholds a bucket may hold (qfast_build_map checks it)
#define QFAST_FLOAT_MANTISSA 23  // fp32's mantissa bits
#define QFAST_FLOAT_BIAS 127     // fp32's exponent bias: 1.0 has biased exponent 127
#define QFAST_SIGN_BIT 31
#define QFAST_ABS_MASK 0x7fffffffU  // an fp32's bits without the sign
#define QFAST_INF_BITS 0x7f800000U  // +Inf; |x|'s bits at or above it: NaN or Inf

// bucket of the magnitude bits (bits >> QFAST_SHIFT), the first above the floor bucket (0), and
// buckets per sign: the floor, (2^-25, 1) in QFAST_FLOOR_OCTAVES octaves, and 1.0's own
#define QFAST_SHIFT (QFAST_FLOAT_MANTISSA - QFAST_MANTISSA_BITS)
#define QFAST_BASE ((uint32_t)(QFAST_FLOAT_BIAS - QFAST_FLOOR_OCTAVES) << QFAST_MANTISSA_BITS)
#define QFAST_BUCKETS ((QFAST_FLOOR_OCTAVES << QFAST_MANTISSA_BITS) + 2)

typedef struct {
    uint8_t first[2 * QFAST_BUCKETS];                     // (sign, bucket): the code of the bucket's smallest value
    float up[QSTATE_CODES - 1 + QFAST_PROBES];            // the map's thresholds, then NaN (no q is >= NaN, +Inf included)
    float code[QSTATE_CODES];                             // the map's values
    uint8_t zero;                                         // the code of 0
} QFastMap;

typedef struct { QFastMap map[2]; } QFastMaps;  // indexed by QMapKind

// the bucket of q's bits: positive magnitudes 0 .. QFAST_BUCKETS - 1, negative ones after them.
// Magnitudes above 1 (never a quotient x / absmax) go to 1.0's bucket, whose code, 255 (or 0 for
// -1), is the search's for them too: no q reads outside the table
static inline uint32_t qfast_bucket(uint32_t bits) {
    uint32_t t = (bits & QFAST_ABS_MASK) >> QFAST_SHIFT;
    uint32_t b = t < QFAST_BASE ? 0 : t - QFAST_BASE + 1;
    b = b < QFAST_BUCKETS - 1 ? b : QFAST_BUCKETS - 1;
    return b + (bits >> QFAST_SIGN_BIT) * QFAST_BUCKETS;
}

static inline float qfast_float_of(uint32_t bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

// f from the map m (quant_state.h's): each bucket's first code by qstate_nearest on its smallest
// value, and the check that no bucket holds more than QFAST_PROBES thresholds
static void qfast_build_map(QFastMap* f, const QStateMap* m) {
    memset(f, 0, sizeof *f);
    for (int sign = 0; sign < 2; sign++) {
        for (uint32_t b = 0; b < QFAST_BUCKETS; b++) {
            // the bucket's magnitudes [lo, hi] as bits; the last bucket is 1.0 (and what lies above: no threshold)
            uint32_t lo = b == 0 ? 0 : (QFAST_BASE + b - 1) << QFAST_SHIFT;
            uint32_t hi = b == 0 ? (QFAST_BASE << QFAST_SHIFT) - 1 : b + 1 == QFAST_BUCKETS ? lo : lo + (1U << QFAST_SHIFT) - 1;
            uint32_t s = (uint32_t)sign << QFAST_SIGN_BIT;
            float smallest = qfast_float_of(s | (sign ? hi : lo)), largest = qfast_float_of(s | (sign ? lo : hi));
            int first = qstate_nearest(m->up, smallest), last = qstate_nearest(m->up, largest);
            if (qfast_bucket(s | lo) != (uint32_t)(sign * QFAST_BUCKETS) + b || qfast_bucket(s | hi) != qfast_bucket(s | lo)) {
                fprintf(stderr, "%s:%d: qfast_build_map: magnitudes 0x%08x .. 0x%08x (sign %d) are not all in bucket %u\n"
                        "  hint: qfast_bucket and this loop's bucket edges disagree: change them together\n",
                        __FILE__, __LINE__, lo, hi, sign, b);
                exit(EXIT_FAILURE);
            }
            if (last - first > QFAST_PROBES) {
                fprintf(stderr, "%s:%d: qfast_build_map: bucket %u (sign %d) holds %d thresholds, more than QFAST_PROBES = %d\n"
                        "  hint: the map changed (llmc/quant_state.h): raise QFAST_MANTISSA_BITS or QFAST_PROBES\n",
                        __FILE__, __LINE__, b, sign, last - first, QFAST_PROBES);
                exit(EXIT_FAILURE);
            }
            f->first[sign * QFAST_BUCKETS + b] = (uint8_t)first;
        }
    }
    for (int j = 0; j < QSTATE_CODES - 1 + QFAST_PROBES; j++) { f->up[j] = j < QSTATE_CODES - 1 ? m->up[j] : qstate_nan(); }
    memcpy(f->code, m->code, sizeof f->code);
    f->zero = (uint8_t)m->zero;
}

// both maps, built on the first call (make it outside parallel regions: the update functions do)
static const QFastMaps* qfast_maps(void) {
    static QFastMaps maps;
    static int built = 0;
    if (!built) {
        const QStateMaps* m = qstate_maps();
        qfast_build_map(&maps.map[QMAP_SIGNED], &m->map[QMAP_SIGNED]);
        qfast_build_map(&maps.map[QMAP_UNSIGNED], &m->map[QMAP_UNSIGNED]);
        built = 1;
    }
    return &maps;
}

// the code of q in bucket `bucket`: first + the bucket's thresholds at or below q
static inline int qfast_lookup(const QFastMap* f, uint32_t bucket, float q) {
    int c = f->first[bucket];
    for (int p = 0; p < QFAST_PROBES; p++) { c += f->up[c] <= q; }
    return c;
}

// the code of q (not NaN): qstate_nearest(m->up, q) by the table
static inline int qfast_nearest(const QFastMap* f, float q) { return qfast_lookup(f, qfast_bucket(qstate_float_bits(q)), q); }

// ----------------------------------------------------------------------------
// a block: absmax and refused count, the codes, the values back

// the largest |x| bits over x (n) into *amax_bits; returns the count of NaN / Inf (|x| bits at or
// above Inf's). Integer max and count: a loop the compiler vectorizes
static inline size_t qfast_absmax_bits(const float* x, int n, uint32_t* amax_bits) {
    uint32_t m = 0;
    size_t count = 0;
    for (int i = 0; i < n; i++) {
        uint32_t a = qstate_float_bits(x[i]) & QFAST_ABS_MASK;
        m = a > m ? a : m;
        count += a >= QFAST_INF_BITS;
    }
    *amax_bits = m;
    return count;
}

// codes[i] = qfast_nearest(f, x[i] / amax), i < n (<= QSTATE_BLOCK): the quotients and their buckets
// in a loop the compiler vectorizes (IEEE division, integer ops), then the lookups one by one (two
// dependent loads an element, independent between elements, so the core overlaps them)
static inline void qfast_codes(const QFastMap* f, const float* x, int n, float amax, uint8_t* codes) {
    float q[QSTATE_BLOCK];
    uint32_t bucket[QSTATE_BLOCK];
    for (int i = 0; i < n; i++) {
        q[i] = x[i] / amax;
        bucket[i] = qfast_bucket(qstate_float_bits(q[i]));
    }
    for (int i = 0; i < n; i++) { codes[i] = (uint8_t)qfast_lookup(f, bucket[i], q[i]); }
}

// x[i] = the value of codes[i] times absmax, i < n: qstate_dequantize_one's product, in a loop the
// compiler vectorizes
static inline void qfast_dequantize_block(const QFastMap* f, const uint8_t* codes, float absmax, int n, float* x) {
    for (int i = 0; i < n; i++) { x[i] = qstate_dequantize_one(f->code, codes[i], absmax); }
}

// qstate_quantize_block, byte for byte: x (n <= QSTATE_BLOCK) into codes and *absmax; returns the
// count of non-finite values (then *absmax = NaN and every code is the code of 0). The absmax is
// the largest |x| by its bits: for finite values the same number as quant_state.h's fmaxf chain
static inline size_t qfast_quantize_block(const QFastMap* f, const float* x, int n, uint8_t* codes, float* absmax) {
    uint32_t amax_bits;
    size_t bad = qfast_absmax_bits(x, n, &amax_bits);
    float amax = bad > 0 ? qstate_nan() : qfast_float_of(amax_bits);
    *absmax = amax;
    if (bad > 0 || amax == 0.0f) { memset(codes, f->zero, (size_t)n); }
    else { qfast_codes(f, x, n, amax, codes); }
    return bad;
}

#endif // CPU_QUANT_STATE_FAST_H
