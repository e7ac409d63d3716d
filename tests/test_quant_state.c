/*
test_quant_state.c: optimizer state in 8 bits and bf16 (llmc/quant_state.h, cpu/optimizers_lowp.h)
against references written here: the dynamic map against the paper's formula, the binary-search
rounding against an exhaustive nearest search, quantize/dequantize errors within the map's bound on
random and adversarial blocks, one step of AdamW, Adafactor and CAME bit for bit equal to "dequantize,
update in fp32, quantize" done here, and several AdamW steps tracking fp32 AdamW on a quadratic.

    make build/test_quant_state && ./build/test_quant_state

Prints "ok name" or "FAIL name: detail" per check, then "N passed, N failed"; exits non-zero on a
failure. The CUDA kernels are held to these CPU functions byte for byte by dev/cuda/test_optimizer_lowp.cu.
*/
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../cpu/optimizers_lowp.h"
#include "../cpu/host_step.h"  // optimizer_step: the trainer's step over the state block (--optimizer-state)
#include "check.h"

// ----------------------------------------------------------------------------
// test data: a fixed generator (xorshift64*)

static uint64_t rng_next(uint64_t* s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dULL;
}

// uniform in [-1, 1)
static float rng_uniform(uint64_t* s) { return (float)((double)(rng_next(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static float rng_normal(uint64_t* s) {
    double u1 = ((double)(rng_next(s) >> 11) + 1.0) / 9007199254740993.0, u2 = (double)(rng_next(s) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

// sign * 10^(uniform in [lo, hi]): magnitudes spread over decades, as optimizer moments are
static float rng_log_uniform(uint64_t* s, double lo, double hi) {
    double e = lo + (hi - lo) * (rng_uniform(s) * 0.5 + 0.5);
    return (float)((rng_next(s) & 1 ? -1.0 : 1.0) * pow(10.0, e));
}

static float* alloc_floats(size_t n) { return (float*)malloc_check((n > 0 ? n : 1) * sizeof(float)); }

// ----------------------------------------------------------------------------
// the references

// value j of decade k (0..6) of the paper's map with F fraction values, in long double: the midpoint
// of boundaries j and j + 1 of F equal steps from 0.1 to 1, scaled by 10^(k - 6) (bitsandbytes'
// create_dynamic_map: linspace(0.1, 1, F + 1), means of neighbours)
static long double paper_value(int k, int j, int F) {
    long double b0 = 0.1L + 0.9L * j / F, b1 = 0.1L + 0.9L * (j + 1) / F;
    return powl(10.0L, k - 6) * (b0 + b1) / 2.0L;
}

// the index of the code nearest to x among codes first..255, by trying them all (exact: near a tie
// x and both codes are within a factor 10 or one is 0, so the differences are exact in double);
// ties to the even index
static int nearest_exhaustive(const float* code, int first, float x) {
    int best = first;
    double bd = INFINITY;
    for (int c = first; c < QSTATE_CODES; c++) {
        double d = fabs((double)x - (double)code[c]);
        if (d < bd || (d == bd && c % 2 == 0)) {
            best = c;
            bd = d;
        }
    }
    return best;
}

// the code of x in map `kind`: the nearest, except that the unsigned map (the second moment) takes a
// positive x to a positive code, never to 0 (llmc/quant_state.h: the zero-point problem)
static int ref_nearest(QMapKind kind, float x) {
    const float* code = qstate_maps()->map[kind].code;
    return nearest_exhaustive(code, kind == QMAP_UNSIGNED && x > 0.0f ? 1 : 0, x);
}

// quantizes a block of finite values as the paper says: absmax, then each x / absmax to its code
static void ref_quantize_block(QMapKind kind, const float* x, int n, uint8_t* codes, float* absmax) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); }
    }
    *absmax = amax;
    for (int i = 0; i < n; i++) { codes[i] = (uint8_t)ref_nearest(kind, amax == 0.0f ? 0.0f : x[i] / amax); }
}

static void ref_quantize(QMapKind kind, const float* x, size_t n, uint8_t* codes, float* absmax) {
    for (size_t b = 0; b * QSTATE_BLOCK < n; b++) {
        size_t begin = b * QSTATE_BLOCK;
        int len = (int)(n - begin < QSTATE_BLOCK ? n - begin : QSTATE_BLOCK);
        ref_quantize_block(kind, x + begin, len, codes + begin, absmax + b);
    }
}

static float ref_dequantize(const float* code, const uint8_t* codes, const float* absmax, size_t i) {
    return code[codes[i]] * absmax[i / QSTATE_BLOCK];
}

// bf16 stochastic rounding of finite x with random r16 (0..65535), from the values: between the
// truncation lo and the next bf16 value hi (away from zero), hi with probability (|x| - |lo|) / (|hi| - |lo|),
// taken when r16 / 2^16 >= 1 - that probability
static float ref_bf16_round(float x, uint32_t r16) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    uint32_t lo_bits = b & 0xffff0000U, hi_bits = lo_bits + 0x10000U;
    float lo, hi;
    memcpy(&lo, &lo_bits, sizeof lo);
    memcpy(&hi, &hi_bits, sizeof hi);
    if (lo == x) { return x; }
    double p = (fabs((double)x) - fabs((double)lo)) / (fabs((double)hi) - fabs((double)lo));
    return (double)r16 / 65536.0 >= 1.0 - p ? hi : lo;
}

static int bits_equal(const void* a, const void* b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

// ----------------------------------------------------------------------------
// the maps

static void test_map(QMapKind kind) {
    const QStateMap* m = &qstate_maps()->map[kind];
    const char* name = kind == QMAP_SIGNED ? "signed" : "unsigned";
    char title[160];
    // the paper's values, each rounded to fp32 from long double
    float want[QSTATE_CODES];
    int n = 0;
    for (int k = 0; k < QSTATE_DECADES; k++) {
        int F = kind == QMAP_SIGNED ? 1 << k : 1 << (k + 1);
        for (int j = 0; j < F; j++) {
            want[n++] = (float)paper_value(k, j, F);
            if (kind == QMAP_SIGNED) { want[n++] = -(float)paper_value(k, j, F); }
        }
    }
    want[n++] = 0.0f;
    want[n++] = 1.0f;
    int sorted = 1, found = 0, nans = 0;
    for (int i = 0; i + 1 < QSTATE_CODES; i++) { sorted = sorted && m->code[i] < m->code[i + 1]; }
    for (int w = 0; w < n; w++) {
        int hit = 0;
        for (int c = 0; c < QSTATE_CODES; c++) { hit = hit || m->code[c] == want[w]; }
        found += hit;
    }
    for (int c = 0; c < QSTATE_CODES; c++) { nans += isnan(m->code[c]); }
    snprintf(title, sizeof title, "map %s: 256 codes ascending, each the paper's value rounded to fp32 (%d of %d found)",
             name, found, n);
    check(n == QSTATE_CODES && sorted && found == n && nans == 0, title, "sorted %d, %d NaN", sorted, nans);
    int zero_ok = m->code[m->zero] == 0.0f && m->zero == (kind == QMAP_SIGNED ? 127 : 0);
    float lowest = kind == QMAP_SIGNED ? -(float)paper_value(6, 63, 64) : 0.0f;
    snprintf(title, sizeof title, "map %s: ends %.8g and %.8g, 0 at index %d", name, m->code[0], m->code[255], m->zero);
    check(zero_ok && m->code[0] == lowest && m->code[255] == 1.0f, title, "expected %.8g .. 1, zero at %d",
          lowest, kind == QMAP_SIGNED ? 127 : 0);
    // the thresholds: up[j] and the fp32 value below it round to j + 1 and j, by exhaustive search
    int bad = 0;
    for (int j = 0; j + 1 < QSTATE_CODES; j++) {
        float below = nextafterf(m->up[j], -INFINITY);
        bad += ref_nearest(kind, m->up[j]) != j + 1 || ref_nearest(kind, below) != j;
        bad += qstate_nearest(m->up, m->up[j]) != j + 1 || qstate_nearest(m->up, below) != j;
    }
    snprintf(title, sizeof title, "map %s: each threshold is where the exhaustive nearest search moves to the next code", name);
    check(bad == 0, title, "%d thresholds off", bad);
    // every code and a spread of values: binary search = exhaustive search
    uint64_t s = 7 + kind;
    int differ = 0, tested = 0;
    for (int c = 0; c < QSTATE_CODES; c++, tested++) { differ += qstate_nearest(m->up, m->code[c]) != c; }
    for (int i = 0; i < 200000; i++, tested++) {
        float x = i % 2 ? rng_uniform(&s) : rng_log_uniform(&s, -9.0, 0.0);
        if (kind == QMAP_UNSIGNED) { x = fabsf(x); }
        differ += qstate_nearest(m->up, x) != ref_nearest(kind, x);
    }
    snprintf(title, sizeof title, "map %s: binary search = exhaustive nearest search on %d values", name, tested);
    check(differ == 0, title, "%d differ", differ);
}

// a midpoint that is itself an fp32 value is a tie: it goes to the even index, both searches (the
// unsigned map's first gap excepted: a positive value goes up)
static void test_ties(void) {
    int ties = 0, bad = 0;
    for (int kind = QMAP_SIGNED; kind <= QMAP_UNSIGNED; kind++) {
        const QStateMap* m = &qstate_maps()->map[kind];
        for (int j = 0; j + 1 < QSTATE_CODES; j++) {
            double mid = 0.5 * ((double)m->code[j] + m->code[j + 1]);
            float f = (float)mid;
            if ((double)f != mid) { continue; }
            ties++;
            int want = (j % 2 == 0 && !(kind == QMAP_UNSIGNED && j == 0)) ? j : j + 1;
            bad += qstate_nearest(m->up, f) != want || ref_nearest((QMapKind)kind, f) != want;
        }
    }
    char title[128];
    snprintf(title, sizeof title, "rounding: the %d midpoints that are fp32 values go to the even index", ties);
    check(ties > 0 && bad == 0, title, "%d of %d wrong", bad, ties);
}

// the second moment's zero-point guard: a positive value, however small, is stored as a positive code
static void test_no_zero_v(void) {
    const QStateMap* m = &qstate_maps()->map[QMAP_UNSIGNED];
    float x[QSTATE_BLOCK], y[QSTATE_BLOCK], absmax;
    uint8_t codes[QSTATE_BLOCK];
    for (int i = 0; i < QSTATE_BLOCK; i++) { x[i] = i == 0 ? 1.0f : i == 1 ? 0.0f : powf(10.0f, -7.0f - 0.1f * i); }
    qstate_quantize(m, x, QSTATE_BLOCK, codes, &absmax);
    qstate_dequantize(m, codes, &absmax, QSTATE_BLOCK, y);
    int ok = codes[1] == 0 && y[1] == 0.0f;
    for (int i = 2; i < QSTATE_BLOCK; i++) { ok = ok && codes[i] == 1 && y[i] == m->code[1]; }
    char title[160];
    snprintf(title, sizeof title, "quantize unsigned: values 1e-7 .. 1e-32 of absmax are stored as the smallest positive code (%.3g), 0 as 0",
             m->code[1]);
    check(ok, title, "%s", "a value became 0, or 0 did not");
}

// x (n) in blocks whose first value is 3 (their absmax) and whose others straddle the thresholds of
// m in turn: for each up[j], the smallest v with v / 3 >= up[j] (IEEE division), then the value below it
static void straddling_values(const QStateMap* m, float* x, size_t n) {
    for (size_t i = 0, j = 0; i < n; i++) {
        if (i % QSTATE_BLOCK == 0) {
            x[i] = 3.0f;
            continue;
        }
        float v = m->up[j / 2] * 3.0f;
        while (v / 3.0f >= m->up[j / 2]) { v = nextafterf(v, -INFINITY); }
        while (v / 3.0f < m->up[j / 2]) { v = nextafterf(v, INFINITY); }
        x[i] = j % 2 == 0 ? v : nextafterf(v, -INFINITY);
        j = (j + 1) % (2 * (QSTATE_CODES - 1));
    }
}

// blocks of absmax 3 whose values straddle every threshold (straddling_values); qstate_quantize =
// the reference's quantization (a quotient computed any other way than IEEE division lands on the
// other side of some of them)
static void test_quantize_thresholds(QMapKind kind) {
    const QStateMap* m = &qstate_maps()->map[kind];
    size_t n = 3 * QSTATE_BLOCK, nb = 3;
    float x[3 * QSTATE_BLOCK], absmax[3], ref_absmax[3];
    uint8_t codes[3 * QSTATE_BLOCK], ref_codes[3 * QSTATE_BLOCK];
    straddling_values(m, x, n);
    size_t refused = qstate_quantize(m, x, n, codes, absmax);
    ref_quantize(kind, x, n, ref_codes, ref_absmax);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) { differ += codes[i] != ref_codes[i]; }
    char title[160];
    snprintf(title, sizeof title, "quantize %s: values straddling every threshold (absmax 3) get the reference's codes",
             kind == QMAP_SIGNED ? "signed" : "unsigned");
    check(refused == 0 && differ == 0 && bits_equal(absmax, ref_absmax, nb * sizeof(float)), title, "%zu codes differ", differ);
}

// ----------------------------------------------------------------------------
// the CPU's fast quantization (cpu/quant_state_fast.h) = llmc/quant_state.h's, byte for byte

// qfast_nearest against qstate_nearest wherever either can change its answer. Both are step
// functions of q: qstate_nearest steps at the thresholds up[j] alone, qfast_nearest at most there and
// at its buckets' edges. So trying each threshold and the fp32 value below it and each bucket's
// smallest and largest value (with -0, +-1, +-Inf and random values besides) tries every step of
// either: equal there, they are equal on every fp32 but NaN (a quotient x / absmax is in [-1, 1];
// past it, 1's bucket)
static void test_fast_nearest(QMapKind kind) {
    const QStateMap* m = &qstate_maps()->map[kind];
    const QFastMap* f = &qfast_maps()->map[kind];
    size_t tested = 0, differ = 0;
    float first_bad = 0.0f;
    #define TRY(q)                                                                            \
        do {                                                                                  \
            float q_ = (q);                                                                   \
            if (isnan(q_)) { break; }                                                         \
            tested++;                                                                         \
            if (qfast_nearest(f, q_) != qstate_nearest(m->up, q_) && differ++ == 0) { first_bad = q_; } \
        } while (0)
    for (int j = 0; j + 1 < QSTATE_CODES; j++) {  // each threshold, and two fp32 values on either side
        float q = m->up[j];
        TRY(q); TRY(nextafterf(q, -INFINITY)); TRY(nextafterf(nextafterf(q, -INFINITY), -INFINITY)); TRY(nextafterf(q, INFINITY));
    }
    for (uint32_t sign = 0; sign < 2; sign++) {   // each bucket's edges: its first and last magnitude bits
        for (uint32_t t = 0; t <= (QFAST_INF_BITS >> QFAST_SHIFT); t++) {
            uint32_t s = sign << QFAST_SIGN_BIT, lo = t << QFAST_SHIFT, hi = lo + (1U << QFAST_SHIFT) - 1;
            TRY(qfast_float_of(s | lo)); TRY(qfast_float_of(s | hi));
        }
    }
    float special[] = {0.0f, -0.0f, 1.0f, -1.0f, FLT_TRUE_MIN, -FLT_TRUE_MIN, FLT_MIN, -FLT_MIN, 0x1p-25f, -0x1p-25f,
                       FLT_MAX, -FLT_MAX, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) { TRY(special[i]); }
    uint64_t s = 41 + kind;
    for (int i = 0; i < 1000000; i++) {
        float q = i % 3 == 0 ? rng_uniform(&s) : i % 3 == 1 ? rng_log_uniform(&s, -9.0, 0.0) : rng_log_uniform(&s, -45.0, 0.0);
        TRY(kind == QMAP_UNSIGNED ? fabsf(q) : q);
    }
    #undef TRY
    char title[200];
    snprintf(title, sizeof title, "fast %s: the table lookup (cpu/quant_state_fast.h) = qstate_nearest at every threshold, "
             "bucket edge and %d random values (%zu tried)", kind == QMAP_SIGNED ? "signed" : "unsigned", 1000000, tested);
    check(differ == 0, title, "%zu differ, the first at %.9g (bits 0x%08x)", differ, first_bad, qstate_float_bits(first_bad));
}

// qfast_quantize_block and qfast_dequantize_block against qstate_quantize_block and
// qstate_dequantize_one on blocks of every kind: codes, absmax bits, refused counts, values back
static void test_fast_blocks(QMapKind kind) {
    const QStateMap* m = &qstate_maps()->map[kind];
    const QFastMap* f = &qfast_maps()->map[kind];
    enum { KINDS = 11, LENGTHS = 5 };
    static const char* NAMES[KINDS] = {"uniform", "log-uniform 1e-40..1e3", "straddling thresholds", "zeros and -0",
                                       "denormals", "near FLT_MAX", "a NaN", "a -NaN", "an Inf", "a -Inf", "one huge value"};
    int lengths[LENGTHS] = {QSTATE_BLOCK, QSTATE_BLOCK - 1, 9, 8, 1};  // whole, and short last blocks
    float x[QSTATE_BLOCK], y[QSTATE_BLOCK], y_ref[QSTATE_BLOCK], straddle[QSTATE_BLOCK * 4];
    uint8_t codes[QSTATE_BLOCK], ref_codes[QSTATE_BLOCK];
    straddling_values(m, straddle, QSTATE_BLOCK * 4);
    uint64_t s = 97 + kind;
    int differ = 0, tried = 0;
    const char* first_bad = NULL;
    for (int rep = 0; rep < 200; rep++) {
        for (int k = 0; k < KINDS; k++) {
            for (int i = 0; i < QSTATE_BLOCK; i++) {
                switch (k) {
                    case 0: x[i] = rng_uniform(&s); break;
                    case 1: x[i] = rng_log_uniform(&s, -40.0, 3.0); break;
                    case 2: x[i] = straddle[(size_t)(rep % 4) * QSTATE_BLOCK + (size_t)i]; break;
                    case 3: x[i] = i % 3 == 0 ? -0.0f : 0.0f; break;
                    case 4: x[i] = rng_uniform(&s) * 1e-39f; break;
                    case 5: x[i] = FLT_MAX * rng_uniform(&s); break;
                    default: x[i] = rng_uniform(&s) * 1e-3f; break;
                }
                if (kind == QMAP_UNSIGNED) { x[i] = fabsf(x[i]); }
            }
            float poison[4] = {NAN, -NAN, INFINITY, -INFINITY};
            int at = (int)(rng_next(&s) % QSTATE_BLOCK);
            if (k >= 6 && k <= 9) { x[at] = poison[k - 6]; }
            if (k == 10) { x[at] = 1e30f; }
            for (int l = 0; l < LENGTHS; l++, tried++) {
                int len = lengths[l];
                float absmax = 0.0f, ref_absmax = 1.0f;
                memset(codes, 0xAB, sizeof codes);
                size_t bad = qfast_quantize_block(f, x, len, codes, &absmax);
                size_t ref_bad = qstate_quantize_block(m, x, len, ref_codes, &ref_absmax);
                qfast_dequantize_block(f, codes, absmax, len, y);
                for (int i = 0; i < len; i++) { y_ref[i] = qstate_dequantize_one(m->code, ref_codes[i], ref_absmax); }
                int same = bad == ref_bad && bits_equal(&absmax, &ref_absmax, sizeof absmax) && bits_equal(codes, ref_codes, (size_t)len) &&
                           bits_equal(y, y_ref, (size_t)len * sizeof(float));
                if (!same && differ++ == 0) { first_bad = NAMES[k]; }
            }
        }
    }
    char title[200];
    snprintf(title, sizeof title, "fast %s: qfast_quantize_block / qfast_dequantize_block = quant_state.h's bytes on %d blocks "
             "(random, straddling, zeros, denormals, FLT_MAX, NaN, Inf; lengths 256 .. 1)", kind == QMAP_SIGNED ? "signed" : "unsigned", tried);
    check(differ == 0, title, "%d blocks differ, the first: %s", differ, first_bad ? first_bad : "");
}

// ----------------------------------------------------------------------------
// quantize / dequantize: the error within the map's bound

// the map's bound: the largest distance from a value in its range to the nearest code (half the
// widest gap, or an end's distance to -1 / 1), as a fraction of the block's absmax
static double map_bound(const QStateMap* m, int is_signed) {
    double worst = is_signed ? 1.0 + m->code[0] : m->code[0];
    for (int j = 0; j + 1 < QSTATE_CODES; j++) {
        double half = 0.5 * ((double)m->code[j + 1] - m->code[j]);
        if (half > worst) { worst = half; }
    }
    return worst;
}

// quantizes x (n) and checks each value's error: at most absmax times the distance of x / absmax to
// its nearest code (plus the roundings of the division and the product), and at most the map's bound
static void check_round_trip(QMapKind kind, const float* x, size_t n, const char* what) {
    const QStateMap* m = &qstate_maps()->map[kind];
    uint8_t* codes = (uint8_t*)malloc_check(n);
    float* absmax = alloc_floats(qstate_blocks(n));
    float* y = alloc_floats(n);
    size_t refused = qstate_quantize(m, x, n, codes, absmax);
    qstate_dequantize(m, codes, absmax, n, y);
    double bound = map_bound(m, kind == QMAP_SIGNED), worst = 0.0;
    size_t over = 0;
    for (size_t i = 0; i < n; i++) {
        double a = absmax[i / QSTATE_BLOCK];
        double xn = a == 0.0 ? 0.0 : (double)(x[i] / (float)a);
        double nearest = fabs(xn - m->code[ref_nearest(kind, (float)xn)]);
        double slack = a * ldexp(1.0, -22) + ldexp(1.0, -148);  // the division's and the product's roundings
        double err = fabs((double)y[i] - x[i]);
        if (err > a * nearest + slack || err > a * bound + slack) { over++; }
        if (a > 0.0 && err / a > worst) { worst = err / a; }
    }
    char title[200];
    snprintf(title, sizeof title, "quantize %s %s: error <= absmax x distance to the nearest code (worst %.2e of absmax, bound %.2e)",
             kind == QMAP_SIGNED ? "signed" : "unsigned", what, worst, bound);
    check(refused == 0 && over == 0, title, "%zu values over, %zu refused", over, refused);
    free(codes);
    free(absmax);
    free(y);
}

static void test_round_trip_random(void) {
    size_t n = 5 * QSTATE_BLOCK + 77;  // a short last block
    float* x = alloc_floats(n);
    uint64_t s = 11;
    for (size_t i = 0; i < n; i++) { x[i] = rng_uniform(&s); }
    check_round_trip(QMAP_SIGNED, x, n, "uniform [-1, 1)");
    for (size_t i = 0; i < n; i++) { x[i] = 0.01f * rng_normal(&s); }
    check_round_trip(QMAP_SIGNED, x, n, "normal");
    for (size_t i = 0; i < n; i++) { x[i] = rng_log_uniform(&s, -12.0, 3.0); }
    check_round_trip(QMAP_SIGNED, x, n, "log-uniform 1e-12..1e3");
    for (size_t i = 0; i < n; i++) { x[i] = fabsf(rng_log_uniform(&s, -12.0, 3.0)); }
    check_round_trip(QMAP_UNSIGNED, x, n, "log-uniform 1e-12..1e3");
    for (size_t i = 0; i < n; i++) { x[i] = 1e-4f * rng_normal(&s) * rng_normal(&s) * rng_normal(&s) * rng_normal(&s); }
    for (size_t i = 0; i < n; i++) { x[i] = x[i] * x[i]; }
    check_round_trip(QMAP_UNSIGNED, x, n, "squares of heavy-tailed values");
    free(x);
}

static void test_round_trip_adversarial(void) {
    const QStateMap* ms = &qstate_maps()->map[QMAP_SIGNED];
    size_t n = 3 * QSTATE_BLOCK;
    float* x = alloc_floats(n);
    uint8_t* codes = (uint8_t*)malloc_check(n);
    float absmax[3], y[3 * QSTATE_BLOCK];
    char title[160];
    // all zeros: absmax 0, the code of 0, read back as exact zeros
    memset(x, 0, n * sizeof(float));
    size_t refused = qstate_quantize(ms, x, n, codes, absmax);
    qstate_dequantize(ms, codes, absmax, n, y);
    int ok = refused == 0 && absmax[0] == 0.0f && absmax[2] == 0.0f;
    for (size_t i = 0; i < n; i++) { ok = ok && codes[i] == ms->zero && y[i] == 0.0f; }
    check(ok, "quantize adversarial: all zeros keep absmax 0 and read back 0", "%s", "a code or value differs");
    // negative zeros: the code of 0, read back as +0 (equal to -0)
    for (size_t i = 0; i < n; i++) { x[i] = i % 3 == 0 ? -0.0f : 0.5f; }
    qstate_quantize(ms, x, n, codes, absmax);
    qstate_dequantize(ms, codes, absmax, n, y);
    ok = 1;
    for (size_t i = 0; i < n; i += 3) { ok = ok && codes[i] == ms->zero && y[i] == 0.0f && !signbit(y[i]); }
    check(ok, "quantize adversarial: -0 is the code of 0, read back as +0", "%s", "a code or value differs");
    check_round_trip(QMAP_SIGNED, x, n, "with -0");
    // one huge value in block 1: its block's small values become 0 within the bound, blocks 0 and 2 unaffected
    uint64_t s = 3;
    for (size_t i = 0; i < n; i++) { x[i] = rng_uniform(&s); }
    x[QSTATE_BLOCK + 17] = 1e30f;
    check_round_trip(QMAP_SIGNED, x, n, "one huge value (1e30)");
    qstate_quantize(ms, x, n, codes, absmax);
    qstate_dequantize(ms, codes, absmax, n, y);
    ok = absmax[1] == 1e30f && y[QSTATE_BLOCK + 17] == 1e30f && absmax[0] <= 1.0f && absmax[2] <= 1.0f;
    for (size_t i = QSTATE_BLOCK; i < 2 * QSTATE_BLOCK; i++) { ok = ok && (i == QSTATE_BLOCK + 17 || y[i] == 0.0f); }
    check(ok, "quantize adversarial: one huge value zeroes its own block only, and is kept exactly", "absmax %g %g %g",
          absmax[0], absmax[1], absmax[2]);
    // the largest finite values: x / absmax and back stay finite
    for (size_t i = 0; i < n; i++) { x[i] = (i % 2 ? -1.0f : 1.0f) * FLT_MAX * (0.5f + 0.5f * fabsf(rng_uniform(&s))); }
    check_round_trip(QMAP_SIGNED, x, n, "near FLT_MAX");
    // denormals: a block of them, a block mixing them with normals, a block of the smallest one
    for (size_t i = 0; i < QSTATE_BLOCK; i++) { x[i] = rng_uniform(&s) * 1e-40f; }
    for (size_t i = QSTATE_BLOCK; i < 2 * QSTATE_BLOCK; i++) { x[i] = i % 2 ? rng_uniform(&s) * 1e-39f : rng_uniform(&s) * 1e-30f; }
    for (size_t i = 2 * QSTATE_BLOCK; i < n; i++) { x[i] = i % 2 ? FLT_TRUE_MIN : -FLT_TRUE_MIN; }
    check_round_trip(QMAP_SIGNED, x, n, "denormals (1e-40, mixed, FLT_TRUE_MIN)");
    qstate_quantize(ms, x, n, codes, absmax);
    qstate_dequantize(ms, codes, absmax, n, y);
    snprintf(title, sizeof title, "quantize adversarial: a block of +-FLT_TRUE_MIN reads back exactly (%g, %g)",
             y[2 * QSTATE_BLOCK], y[2 * QSTATE_BLOCK + 1]);
    check(absmax[0] > 0.0f && absmax[0] < FLT_MIN && absmax[2] == FLT_TRUE_MIN && y[2 * QSTATE_BLOCK] == -FLT_TRUE_MIN &&
          y[2 * QSTATE_BLOCK + 1] == FLT_TRUE_MIN, title, "absmax %g", absmax[2]);
    // NaN and Inf refused: counted, their block stored as absmax NaN with the code of 0, the others intact
    float bad_values[2] = {NAN, -INFINITY};
    for (int v = 0; v < 2; v++) {
        for (size_t i = 0; i < n; i++) { x[i] = rng_uniform(&s); }
        x[2 * QSTATE_BLOCK + 5] = bad_values[v];
        refused = qstate_quantize(ms, x, n, codes, absmax);
        qstate_dequantize(ms, codes, absmax, n, y);
        ok = refused == 1 && isnan(absmax[2]) && !isnan(absmax[0]) && !isnan(absmax[1]);
        for (size_t i = 2 * QSTATE_BLOCK; i < n; i++) { ok = ok && codes[i] == ms->zero && isnan(y[i]); }
        for (size_t i = 0; i < 2 * QSTATE_BLOCK; i++) { ok = ok && fabsf(y[i] - x[i]) <= 0.00704f; }
        snprintf(title, sizeof title, "quantize adversarial: %s refused (counted; its block reads back NaN, the others intact)",
                 v == 0 ? "NaN" : "-Inf");
        check(ok, title, "refused %zu, absmax %g %g %g", refused, absmax[0], absmax[1], absmax[2]);
    }
    free(x);
    free(codes);
}

// ----------------------------------------------------------------------------
// bf16: the stochastic rounding

static void test_bf16_rounding(void) {
    uint64_t s = 5;
    int bad = 0, n = 200000;
    for (int i = 0; i < n; i++) {
        float x = i % 4 == 0 ? rng_log_uniform(&s, -42.0, 37.0) : rng_uniform(&s);
        uint32_t r = qstate_random16(123, (uint32_t)i, QSTATE_STREAM_M, (uint64_t)i * 977);
        bad += qstate_bf16_to_float(qstate_bf16_round(x, r)) != ref_bf16_round(x, r);
    }
    char title[160];
    snprintf(title, sizeof title, "bf16: stochastic rounding = the reference's (from the values) on %d values, denormals included", n);
    check(bad == 0, title, "%d differ", bad);
    // unbiased: 1 + 2^-10 lies 1/8 of the way from 1 to the next bf16 value, 1 + 2^-7
    float x = 1.0f + ldexpf(1.0f, -10);
    double sum = 0.0;
    int draws = 1 << 20;
    for (int i = 0; i < draws; i++) { sum += qstate_bf16_to_float(qstate_bf16_round(x, qstate_random16(9, 3, QSTATE_STREAM_V, (uint64_t)i))); }
    double mean = sum / draws, sd = ldexp(1.0, -7) * sqrt(0.125 * 0.875 / draws);
    snprintf(title, sizeof title, "bf16: stochastic rounding is unbiased: mean of %d roundings of 1 + 2^-10 off by %.1f sd",
             draws, (mean - x) / sd);
    check(fabs(mean - x) < 5.0 * sd, title, "%s", "more than 5 standard deviations off");
    // the edges: NaN is the quiet NaN, Inf stays, -0 stays, FLT_MAX never rounds to Inf
    int ok = qstate_bf16_round(NAN, 0xffff) == 0x7fc0 && qstate_bf16_round(INFINITY, 0xffff) == 0x7f80 &&
             qstate_bf16_round(-INFINITY, 0) == 0xff80 && qstate_bf16_round(-0.0f, 0xffff) == 0x8000 &&
             qstate_bf16_round(FLT_MAX, 0xffff) == 0x7f7f && qstate_bf16_round(-FLT_MAX, 0xffff) == 0xff7f;
    check(ok, "bf16: NaN -> quiet NaN, +-Inf kept, -0 kept, +-FLT_MAX truncated rather than rounded to Inf", "%s", "an edge differs");
}

// an EMA with beta = 0.999 of N(0,1)^2 in bf16 against fp32 (why the format rounds stochastically:
// llmc/quant_state.h). Nearest rounding can never lower such a v and ends tens of % high.
static void test_bf16_ema_tracks(void) {
    const int n = 4096, steps = 3000;
    const float beta = 0.999f;
    float* v32 = alloc_floats(n);
    uint16_t* v16 = (uint16_t*)malloc_check(n * sizeof(uint16_t));
    memset(v32, 0, n * sizeof(float));
    memset(v16, 0, n * sizeof(uint16_t));
    uint64_t s = 99;
    for (int t = 1; t <= steps; t++) {
        for (int i = 0; i < n; i++) {
            float g = rng_normal(&s), g2 = g * g;
            v32[i] = beta * v32[i] + (1.0f - beta) * g2;
            float v = beta * qstate_bf16_to_float(v16[i]) + (1.0f - beta) * g2;
            v16[i] = qstate_bf16_round(v, qstate_random16(1, (uint32_t)t, QSTATE_STREAM_V, (uint64_t)i));
        }
    }
    double rel = 0.0, bias = 0.0;
    for (int i = 0; i < n; i++) {
        double r = qstate_bf16_to_float(v16[i]) / v32[i] - 1.0;
        rel += fabs(r) / n;
        bias += r / n;
    }
    char title[160];
    snprintf(title, sizeof title, "bf16: an EMA (beta 0.999, %d steps) tracks fp32: mean |error| %.2f%% <= 5%%, bias %+.2f%% within 1%%",
             steps, 100 * rel, 100 * bias);
    check(rel <= 0.05 && fabs(bias) <= 0.01, title, "%s", "over the tolerance");
    free(v32);
    free(v16);
}

// ----------------------------------------------------------------------------
// one AdamW step on 8-bit and bf16 state, bit for bit

static const float LR = 1e-2f, BETA1 = 0.9f, BETA2 = 0.95f, EPS = 1e-8f, WD = 0.1f;

// the reference: AdamW written out here (cpu/optimizers.h's formula), on the dequantized state
static void ref_adamw(float* p, const float* g, float* m, float* v, size_t n, int t, float wd) {
    float bc1 = 1.0f - powf(BETA1, (float)t), bc2 = 1.0f - powf(BETA2, (float)t);
    for (size_t i = 0; i < n; i++) {
        m[i] = BETA1 * m[i] + (1.0f - BETA1) * g[i];
        v[i] = BETA2 * v[i] + (1.0f - BETA2) * g[i] * g[i];
        float mhat = m[i] / bc1, vhat = v[i] / bc2;
        p[i] = p[i] - LR * (mhat / (sqrtf(vhat) + EPS) + wd * p[i]);
    }
}

typedef struct {
    size_t n;
    float *p, *g, *m, *v;  // weights, gradients, and a state of earlier steps in fp32
} AdamWCase;

static AdamWCase adamw_case(size_t n, uint64_t seed) {
    AdamWCase c = {n, alloc_floats(n), alloc_floats(n), alloc_floats(n), alloc_floats(n)};
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        c.p[i] = rng_uniform(&s);
        c.g[i] = 1e-2f * rng_normal(&s);
        c.m[i] = i % 97 == 5 ? 0.0f : 3e-3f * rng_normal(&s);  // some exact zeros
        c.v[i] = 1e-4f * rng_normal(&s) * rng_normal(&s) + (i < QSTATE_BLOCK ? 1e-4f : 0.0f);
        c.v[i] = fabsf(c.v[i]);
    }
    return c;
}

static void adamw_case_free(AdamWCase* c) {
    free(c->p);
    free(c->g);
    free(c->m);
    free(c->v);
}

static void test_adamw_8bit_step(size_t n, int t) {
    const QStateMaps* maps = qstate_maps();
    const float *cs = maps->map[QMAP_SIGNED].code, *cu = maps->map[QMAP_UNSIGNED].code;
    AdamWCase c = adamw_case(n, 1000 + n);
    size_t nb = qstate_blocks(n);
    uint8_t *mc = (uint8_t*)malloc_check(n), *vc = (uint8_t*)malloc_check(n);
    uint8_t *rmc = (uint8_t*)malloc_check(n), *rvc = (uint8_t*)malloc_check(n);
    float *ma = alloc_floats(nb), *va = alloc_floats(nb), *rma = alloc_floats(nb), *rva = alloc_floats(nb);
    ref_quantize(QMAP_SIGNED, c.m, n, mc, ma);  // the state before the step
    ref_quantize(QMAP_UNSIGNED, c.v, n, vc, va);
    // the reference: dequantize, update in fp32, quantize by exhaustive search
    float *rp = alloc_floats(n), *rm = alloc_floats(n), *rv = alloc_floats(n);
    memcpy(rp, c.p, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        rm[i] = ref_dequantize(cs, mc, ma, i);
        rv[i] = ref_dequantize(cu, vc, va, i);
    }
    float *fm = alloc_floats(n), *fv = alloc_floats(n), *fp = alloc_floats(n);  // and cpu/optimizers.h's adamw_update on the same state
    memcpy(fm, rm, n * sizeof(float));
    memcpy(fv, rv, n * sizeof(float));
    memcpy(fp, c.p, n * sizeof(float));
    ref_adamw(rp, c.g, rm, rv, n, t, WD);
    adamw_update(fp, c.g, fm, fv, n, LR, BETA1, BETA2, EPS, WD, t);
    ref_quantize(QMAP_SIGNED, rm, n, rmc, rma);
    ref_quantize(QMAP_UNSIGNED, rv, n, rvc, rva);
    // the function under test
    QBlocks qm = {mc, ma}, qv = {vc, va};
    size_t bad = adamw_update_8bit(c.p, c.g, qm, qv, n, LR, BETA1, BETA2, EPS, WD, t);
    int same = bits_equal(c.p, rp, n * sizeof(float)) && bits_equal(mc, rmc, n) && bits_equal(vc, rvc, n) &&
               bits_equal(ma, rma, nb * sizeof(float)) && bits_equal(va, rva, nb * sizeof(float));
    size_t code_diff = 0;
    for (size_t i = 0; i < n; i++) { code_diff += (mc[i] != rmc[i]) + (vc[i] != rvc[i]); }
    char title[200];
    snprintf(title, sizeof title, "adamw 8bit (n=%zu, t=%d): one step bitwise = dequantize, AdamW in fp32, exhaustive nearest codes", n, t);
    check(bad == 0 && same, title, "%zu codes differ, weights %s, refused %zu", code_diff,
          bits_equal(c.p, rp, n * sizeof(float)) ? "equal" : "differ", bad);
    snprintf(title, sizeof title, "adamw (n=%zu): the reference's fp32 step = cpu/optimizers.h's adamw_update, bitwise", n);
    check(bits_equal(fp, rp, n * sizeof(float)) && bits_equal(fm, rm, n * sizeof(float)) && bits_equal(fv, rv, n * sizeof(float)),
          title, "%s", "differ");
    free(mc); free(vc); free(rmc); free(rvc); free(ma); free(va); free(rma); free(rva);
    free(rp); free(rm); free(rv); free(fm); free(fv); free(fp);
    adamw_case_free(&c);
}

static void test_adamw_bf16_step(size_t n, int t) {
    AdamWCase c = adamw_case(n, 2000 + n);
    QStateStream st = {77, 5000};  // this part starts at element 5000 of its tensor
    uint16_t *m = (uint16_t*)malloc_check(n * 2), *v = (uint16_t*)malloc_check(n * 2);
    float *rp = alloc_floats(n), *rm = alloc_floats(n), *rv = alloc_floats(n);
    uint64_t s = 17;
    for (size_t i = 0; i < n; i++) {  // the state before the step: bf16 values
        m[i] = qstate_bf16_round(c.m[i], (uint32_t)(rng_next(&s) >> 48));
        v[i] = qstate_bf16_round(c.v[i], (uint32_t)(rng_next(&s) >> 48));
        rm[i] = qstate_bf16_to_float(m[i]);
        rv[i] = qstate_bf16_to_float(v[i]);
    }
    memcpy(rp, c.p, n * sizeof(float));
    ref_adamw(rp, c.g, rm, rv, n, t, WD);
    size_t bad = adamw_update_bf16(c.p, c.g, m, v, n, LR, BETA1, BETA2, EPS, WD, t, st);
    int differ = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t index = st.index_base + i;
        float wm = ref_bf16_round(rm[i], qstate_random16(st.seed, (uint32_t)t, QSTATE_STREAM_M, index));
        float wv = ref_bf16_round(rv[i], qstate_random16(st.seed, (uint32_t)t, QSTATE_STREAM_V, index));
        differ += qstate_bf16_to_float(m[i]) != wm || qstate_bf16_to_float(v[i]) != wv;
    }
    char title[200];
    snprintf(title, sizeof title, "adamw bf16 (n=%zu, t=%d): one step bitwise = AdamW in fp32 on the bf16 state, the reference's rounding", n, t);
    check(bad == 0 && differ == 0 && bits_equal(c.p, rp, n * sizeof(float)), title, "%d moments differ, weights %s", differ,
          bits_equal(c.p, rp, n * sizeof(float)) ? "equal" : "differ");
    free(m); free(v); free(rp); free(rm); free(rv);
    adamw_case_free(&c);
}

// the same step with 1 and with 2 threads: the same bytes
static void test_thread_count(void) {
    size_t n = 9 * QSTATE_BLOCK + 3;
    AdamWCase c[2] = {adamw_case(n, 5), adamw_case(n, 5)};
    uint8_t* code[2][2];
    float* amax[2][2];
    uint16_t* h[2][2];
    int threads[2] = {1, 2}, saved = omp_get_max_threads();
    for (int r = 0; r < 2; r++) {
        omp_set_num_threads(threads[r]);
        for (int k = 0; k < 2; k++) {
            code[r][k] = (uint8_t*)calloc(n, 1);
            amax[r][k] = (float*)calloc(qstate_blocks(n), sizeof(float));
            h[r][k] = (uint16_t*)calloc(n, 2);
        }
        QBlocks m = {code[r][0], amax[r][0]}, v = {code[r][1], amax[r][1]};
        QStateStream st = {1, 0};
        for (int t = 1; t <= 3; t++) {
            adamw_update_8bit(c[r].p, c[r].g, m, v, n, LR, BETA1, BETA2, EPS, WD, t);
            adamw_update_bf16(c[r].m, c[r].g, h[r][0], h[r][1], n, LR, BETA1, BETA2, EPS, WD, t, st);  // c.m as a second weight
        }
    }
    omp_set_num_threads(saved);
    int same = bits_equal(c[0].p, c[1].p, n * 4) && bits_equal(c[0].m, c[1].m, n * 4);
    for (int k = 0; k < 2; k++) {
        same = same && bits_equal(code[0][k], code[1][k], n) && bits_equal(amax[0][k], amax[1][k], qstate_blocks(n) * 4) &&
               bits_equal(h[0][k], h[1][k], n * 2);
        for (int r = 0; r < 2; r++) { free(code[r][k]); free(amax[r][k]); free(h[r][k]); }
    }
    check(same, "adamw 8bit and bf16: 3 steps from zeroed state, 1 thread and 2 threads give the same bytes", "%s", "differ");
    adamw_case_free(&c[0]);
    adamw_case_free(&c[1]);
}

// a NaN gradient: counted by the update (its m and v), its block refused, the others updated
static void test_adamw_nonfinite(void) {
    size_t n = 3 * QSTATE_BLOCK;
    AdamWCase c = adamw_case(n, 8);
    c.g[QSTATE_BLOCK + 9] = NAN;
    uint8_t *mc = (uint8_t*)calloc(n, 1), *vc = (uint8_t*)calloc(n, 1);
    float *ma = (float*)calloc(3, 4), *va = (float*)calloc(3, 4);
    uint16_t *hm = (uint16_t*)calloc(n, 2), *hv = (uint16_t*)calloc(n, 2);
    QBlocks m = {mc, ma}, v = {vc, va};
    size_t bad8 = adamw_update_8bit(c.p, c.g, m, v, n, LR, BETA1, BETA2, EPS, WD, 1);
    QStateStream st = {1, 0};
    size_t bad16 = adamw_update_bf16(c.m, c.g, hm, hv, n, LR, BETA1, BETA2, EPS, WD, 1, st);
    int ok = bad8 == 2 && bad16 == 2 && isnan(ma[1]) && isnan(va[1]) && !isnan(ma[0]) && !isnan(ma[2]) && !isnan(va[2]);
    check(ok, "adamw 8bit and bf16: a NaN gradient is refused: 2 non-finite moments counted, its block's absmax NaN",
          "counted %zu (8bit) %zu (bf16); absmax %g %g %g", bad8, bad16, ma[0], ma[1], ma[2]);
    free(mc); free(vc); free(ma); free(va); free(hm); free(hv);
    adamw_case_free(&c);
}

// ----------------------------------------------------------------------------
// Adafactor and CAME with a first moment in 8 bits or bf16: bitwise cpu/optimizers.h's fp32 update
// on the dequantized M, then quantized (or rounded) here

typedef struct {
    QMoment M;
    uint8_t* codes;
    float* absmax;
    uint16_t* bf16;
    float* deq;  // (n) its values
} TestMoment;

static TestMoment test_moment(QStateFormat f, const float* values, size_t n) {
    TestMoment t;
    memset(&t, 0, sizeof t);
    t.codes = (uint8_t*)malloc_check(n + 1);
    t.absmax = alloc_floats(qstate_blocks(n) + 1);
    t.bf16 = (uint16_t*)malloc_check(2 * n + 2);
    t.deq = alloc_floats(n);
    const float* code = qstate_maps()->map[QMAP_SIGNED].code;
    for (size_t i = 0; i < n; i++) { t.bf16[i] = qstate_bf16_round(values[i], (uint32_t)(i * 7919 % 65536)); }
    ref_quantize(QMAP_SIGNED, values, n, t.codes, t.absmax);
    for (size_t i = 0; i < n; i++) { t.deq[i] = f == QSTATE_BF16 ? qstate_bf16_to_float(t.bf16[i]) : ref_dequantize(code, t.codes, t.absmax, i); }
    QMoment M = {f, {t.codes, t.absmax}, t.bf16, {31, 1000}};
    t.M = M;
    return t;
}

static void test_moment_free(TestMoment* t) {
    free(t->codes);
    free(t->absmax);
    free(t->bf16);
    free(t->deq);
}

// the stored M equals the reference's rounding of want (n), the fp32 update's new M
static int moment_matches(const TestMoment* t, const float* want, size_t n, int step) {
    if (t->M.format == QSTATE_BF16) {
        for (size_t i = 0; i < n; i++) {
            uint32_t r = qstate_random16(t->M.stream.seed, (uint32_t)step, QSTATE_STREAM_M, t->M.stream.index_base + i);
            if (qstate_bf16_to_float(t->bf16[i]) != ref_bf16_round(want[i], r)) { return 0; }
        }
        return 1;
    }
    size_t nb = qstate_blocks(n);
    uint8_t* codes = (uint8_t*)malloc_check(n + 1);
    float* absmax = alloc_floats(nb);
    ref_quantize(QMAP_SIGNED, want, n, codes, absmax);
    int same = bits_equal(codes, t->codes, n) && bits_equal(absmax, t->absmax, nb * sizeof(float));
    free(codes);
    free(absmax);
    return same;
}

static OptShard whole_slice(int rows, int cols) {
    ParamSlice s = param_slice_alone(0, rows, cols);
    size_t offset;
    return slice_shard(&s, &OPT_UNSHARDED, &offset);
}

// one step of Adafactor (came = 0) or CAME (came = 1) on a (rows, cols) slice with M in format f
static void test_factored_step(int came, int rows, int cols, QStateFormat f) {
    OptShard sh = whole_slice(rows, cols);
    size_t n = (size_t)rows * cols;
    AdafactorHyper ah = {1e-2, 0.9, ADAFACTOR_DECAY_RATE, 1e-30, ADAFACTOR_EPS2, ADAFACTOR_CLIP_THRESHOLD, 0.01, 1, 0};
    CAMEHyper ch = {1e-3, CAME_BETA1, CAME_BETA2, CAME_BETA3, 1e-30, CAME_EPS2, CAME_CLIP_THRESHOLD, 0.01};
    size_t second = came ? came_state_floats(&sh) - n : adafactor_state_floats(&sh, 0);
    float *p = alloc_floats(n), *g = alloc_floats(n), *m0 = alloc_floats(n), *rp = alloc_floats(n);
    float *state = alloc_floats(second + n), *lowp_second = alloc_floats(second);
    uint64_t s = 40 + rows + came;
    for (size_t i = 0; i < n; i++) {
        p[i] = rng_uniform(&s);
        g[i] = 1e-2f * rng_normal(&s);
        m0[i] = 1e-3f * rng_normal(&s);
    }
    for (size_t i = 0; i < second; i++) { lowp_second[i] = 1e-4f * (1.5f + rng_uniform(&s)); }  // earlier steps' statistics (> 0)
    TestMoment tm = test_moment(f, m0, n);
    // the reference: cpu/optimizers.h on fp32 state [second, M] (Adafactor) or [M, second] (CAME), M dequantized
    float* refM = came ? state : state + second;
    memcpy(came ? state + n : state, lowp_second, second * sizeof(float));
    memcpy(refM, tm.deq, n * sizeof(float));
    memcpy(rp, p, n * sizeof(float));
    int t = 4;
    size_t bad;
    if (came) {
        came_update(rp, g, state, &sh, &ch);
        bad = came_update_lowp(p, g, lowp_second, &tm.M, &sh, &ch, t);
    } else {
        adafactor_update(rp, g, state, &sh, &ah, t);
        bad = adafactor_update_lowp(p, g, lowp_second, &tm.M, &sh, &ah, t);
    }
    int same_p = bits_equal(p, rp, n * sizeof(float));
    int same_second = bits_equal(lowp_second, came ? state + n : state, second * sizeof(float));
    int same_m = moment_matches(&tm, refM, n, t);
    char title[200];
    snprintf(title, sizeof title, "%s %s M (%d x %d): one step bitwise = cpu/optimizers.h on the dequantized M, then rounded",
             came ? "came" : "adafactor", QSTATE_FORMAT_NAMES[f], rows, cols);
    check(bad == 0 && same_p && same_second && same_m, title, "weights %d, second moments %d, M %d (1 = equal), refused %zu",
          same_p, same_second, same_m, bad);
    test_moment_free(&tm);
    free(p); free(g); free(m0); free(rp); free(state); free(lowp_second);
}

// ----------------------------------------------------------------------------
// several steps: 8-bit and bf16 AdamW track fp32 AdamW on a noisy quadratic

// how close a format must end to fp32: the final loss (relative) and the weights (RMS of the
// difference over the RMS of fp32's distance travelled)
typedef struct { double loss, weights; } Tolerance;

// loss 1/2 sum a_i (x_i - c_i)^2 with curvatures a_i over four decades in every block (v over eight:
// the second moment's zero-point guard is needed, llmc/quant_state.h), gradients plus noise of a
// fixed sequence; 400 steps of lr 1e-2 from the same start. tol8: 8bit's tolerance, bf16's is
// within 1% and 5%
static void test_quadratic_tracking(float beta2, Tolerance tol8, const char* why8) {
    const size_t n = 32 * QSTATE_BLOCK;
    const int steps = 400;
    float *a = alloc_floats(n), *c = alloc_floats(n), *x0 = alloc_floats(n), *x[3], *g = alloc_floats(n);
    float *m32 = (float*)calloc(n, 4), *v32 = (float*)calloc(n, 4);
    uint8_t *mc = (uint8_t*)calloc(n, 1), *vc = (uint8_t*)calloc(n, 1);
    float *ma = (float*)calloc(qstate_blocks(n), 4), *va = (float*)calloc(qstate_blocks(n), 4);
    uint16_t *hm = (uint16_t*)calloc(n, 2), *hv = (uint16_t*)calloc(n, 2);
    uint64_t s = 2024;
    for (int k = 0; k < 3; k++) { x[k] = alloc_floats(n); }
    double loss0 = 0.0;
    for (size_t i = 0; i < n; i++) {
        a[i] = powf(10.0f, 2.0f * rng_uniform(&s));
        c[i] = rng_uniform(&s);
        x0[i] = x[0][i] = x[1][i] = x[2][i] = rng_uniform(&s);
        loss0 += 0.5 * a[i] * (x[0][i] - c[i]) * (x[0][i] - c[i]);
    }
    QBlocks qm = {mc, ma}, qv = {vc, va};
    QStateStream st = {3, 0};
    size_t bad = 0;
    for (int t = 1; t <= steps; t++) {
        for (int k = 0; k < 3; k++) {
            uint64_t noise = 0x9e3779b97f4a7c15ULL * (uint64_t)t;  // the same noise for the three runs
            for (size_t i = 0; i < n; i++) { g[i] = a[i] * (x[k][i] - c[i]) + 0.3f * sqrtf(a[i]) * rng_normal(&noise); }
            if (k == 0) { adamw_update(x[0], g, m32, v32, n, 1e-2f, 0.9f, beta2, 1e-8f, 0.0f, t); }
            if (k == 1) { bad += adamw_update_8bit(x[1], g, qm, qv, n, 1e-2f, 0.9f, beta2, 1e-8f, 0.0f, t); }
            if (k == 2) { bad += adamw_update_bf16(x[2], g, hm, hv, n, 1e-2f, 0.9f, beta2, 1e-8f, 0.0f, t, st); }
        }
    }
    double loss[3] = {0, 0, 0}, dist[3] = {0, 0, 0}, travel = 0.0, vratio[3] = {1, 0, 0};
    const float* vcode = qstate_maps()->map[QMAP_UNSIGNED].code;
    for (size_t i = 0; i < n; i++) {
        travel += (x[0][i] - x0[i]) * (x[0][i] - x0[i]);
        for (int k = 0; k < 3; k++) {
            loss[k] += 0.5 * a[i] * (x[k][i] - c[i]) * (x[k][i] - c[i]);
            dist[k] += (x[k][i] - x[0][i]) * (x[k][i] - x[0][i]);
        }
        vratio[1] += vcode[vc[i]] * va[i / QSTATE_BLOCK] / v32[i] / n;
        vratio[2] += qstate_bf16_to_float(hv[i]) / v32[i] / n;
    }
    const char* names[3] = {"fp32", "8bit", "bf16"};
    Tolerance tol[3] = {{0, 0}, tol8, {0.01, 0.05}};
    for (int k = 1; k < 3; k++) {
        double dl = fabs(loss[k] - loss[0]) / loss[0], dx = sqrt(dist[k] / travel);
        char title[320];
        snprintf(title, sizeof title, "adamw %s tracks fp32 on a noisy quadratic (beta2 %.3f, %d steps, loss %.3g -> %.4g): "
                 "final loss within %.2f%% <= %.0f%%, weights %.2f%% of the distance travelled <= %.0f%%; mean v / fp32's %.3f%s",
                 names[k], beta2, steps, loss0, loss[0], 100 * dl, 100 * tol[k].loss, 100 * dx, 100 * tol[k].weights,
                 vratio[k], k == 1 ? why8 : "");
        check(bad == 0 && dl <= tol[k].loss && dx <= tol[k].weights, title, "loss %.6g vs %.6g", loss[k], loss[0]);
    }
    for (int k = 0; k < 3; k++) { free(x[k]); }
    free(a); free(c); free(x0); free(g); free(m32); free(v32); free(mc); free(vc); free(ma); free(va); free(hm); free(hv);
}

// ----------------------------------------------------------------------------

// ----------------------------------------------------------------------------
// the trainer's step (cpu/host_step.h's optimizer_step over llmc/opt_layout.h's state block) on a
// one-layer model, against the reference slice by slice, each slice's moments read from where this
// test computes they lie

// a one-layer model whose matrices are kept in 8 bits (>= 4,096 elements) and vectors in fp32; rows
// of 66 (2 x 33) take 128 to end on an 8-bit block boundary, of 264 (8 x 33) 32, so ZeRO's cuts move
// (3 ranks: wte's 34 rows a rank become 128, all rank 0's), and wpe's 63 x 66 codes do not fill whole floats
static GPT2Config wired_config(void) {
    GPT2Config c = {.max_seq_len = 63, .vocab_size = 100, .padded_vocab_size = 128, .num_layers = 1, .num_heads = 2, .channels = 66};
    return c;
}

// floats of one moment of n elements kept as `requested` asks, as this test reads the layout: fp32 (n),
// bf16 (n halves in whole floats), 8bit (n codes in whole floats, then one absmax a 256-element block);
// tensors under 4,096 elements fp32 under 8bit
static size_t ref_moment_floats(QStateFormat requested, size_t n, QStateFormat* kept) {
    *kept = requested == QSTATE_8BIT && n < 4096 ? QSTATE_FP32 : requested;
    if (*kept == QSTATE_BF16) { return (n + 1) / 2; }
    if (*kept == QSTATE_8BIT) { return (n + 3) / 4 + (n + 255) / 256; }
    return n;
}

// one reference AdamW step of step t on a moment pair of n elements in format f at m_at, v_at (read,
// updated, written back), weights p, gradients g; seed: bf16's rounding bits (the slice's index)
static void ref_wired_moments(QStateFormat f, float* m_at, float* v_at, float* p, const float* g, size_t n, int t, float wd, uint32_t seed) {
    const QStateMaps* maps = qstate_maps();
    float *m = alloc_floats(n), *v = alloc_floats(n);
    uint16_t *mh = (uint16_t*)m_at, *vh = (uint16_t*)v_at;
    uint8_t *mc = (uint8_t*)m_at, *vc = (uint8_t*)v_at;
    float *ma = m_at + (n + 3) / 4, *va = v_at + (n + 3) / 4;
    for (size_t i = 0; i < n; i++) {
        if (f == QSTATE_FP32) { m[i] = m_at[i]; v[i] = v_at[i]; }
        else if (f == QSTATE_BF16) { m[i] = qstate_bf16_to_float(mh[i]); v[i] = qstate_bf16_to_float(vh[i]); }
        else { m[i] = ref_dequantize(maps->map[QMAP_SIGNED].code, mc, ma, i); v[i] = ref_dequantize(maps->map[QMAP_UNSIGNED].code, vc, va, i); }
    }
    ref_adamw(p, g, m, v, n, t, wd);
    if (f == QSTATE_FP32) { memcpy(m_at, m, n * sizeof(float)); memcpy(v_at, v, n * sizeof(float)); }
    else if (f == QSTATE_8BIT) { ref_quantize(QMAP_SIGNED, m, n, mc, ma); ref_quantize(QMAP_UNSIGNED, v, n, vc, va); }
    else {
        for (size_t i = 0; i < n; i++) {
            float rm = ref_bf16_round(m[i], qstate_random16(seed, (uint32_t)t, QSTATE_STREAM_M, i));
            float rv = ref_bf16_round(v[i], qstate_random16(seed, (uint32_t)t, QSTATE_STREAM_V, i));
            mh[i] = (uint16_t)(qstate_float_bits(rm) >> 16);
            vh[i] = (uint16_t)(qstate_float_bits(rv) >> 16);
        }
    }
    free(m);
    free(v);
}

// the model's weights and gradients, random (wte's padded rows zero, as the trainer keeps them)
static void wired_case(const GPT2Config* c, float* p, float* g, uint64_t seed) {
    size_t P = gpt2_num_parameters(c);
    uint64_t r = seed;
    for (size_t i = 0; i < P; i++) { p[i] = rng_uniform(&r); g[i] = 1e-2f * rng_normal(&r); }
}

static OptimizerHyper wired_hyper(void) {
    OptimizerHyper h;
    memset(&h, 0, sizeof(h));
    AdamWHyper a = {.lr = LR, .beta1 = BETA1, .beta2 = BETA2, .eps = EPS, .weight_decay = WD};
    h.adamw = a;
    return h;
}

// two steps through optimizer_step from zeroed state; the second against the reference on the state
// the first left
static void test_wired_step(QStateFormat f) {
    GPT2Config c = wired_config();
    size_t P = gpt2_num_parameters(&c), floats = optimizer_state_floats_as(&c, OPT_ADAMW, 0, 1, f);
    float *p = alloc_floats(P), *g = alloc_floats(P), *rp = alloc_floats(P);
    float *state = (float*)calloc(floats, sizeof(float)), *ref = alloc_floats(floats);
    wired_case(&c, p, g, 42);
    OptimizerHyper h = wired_hyper();
    OptSharding z = OPT_UNSHARDED;
    z.format = f;
    optimizer_step(OPT_ADAMW, p, g, state, &c, &h, 1, &z, ALL_SLICES);
    memcpy(rp, p, P * sizeof(float));
    memcpy(ref, state, floats * sizeof(float));
    optimizer_step(OPT_ADAMW, p, g, state, &c, &h, 2, &z, ALL_SLICES);
    ParamSlice* s = param_slices_alloc(&c);
    size_t at = 0;
    for (int k = 0; k < param_slice_count(&c); k++) {
        size_t n = (size_t)s[k].rows * s[k].cols;
        QStateFormat kept;
        size_t mf = ref_moment_floats(f, n, &kept);
        float wd = PARAMETER_IS_MATRIX[s[k].tensor] ? WD : 0.0f;
        ref_wired_moments(kept, ref + at, ref + at + mf, rp + s[k].offset, g + s[k].offset, n, 2, wd, (uint32_t)k);
        at += 2 * mf;
    }
    free(s);
    char title[200];
    snprintf(title, sizeof title, "--optimizer-state %s: the trainer's step (optimizer_step over the state block) = the reference slice by "
             "slice, weights and state bitwise (%zu floats, the layout as this test reads it)", QSTATE_FORMAT_NAMES[f], floats);
    check(at == floats && bits_equal(p, rp, P * sizeof(float)) && bits_equal(state, ref, floats * sizeof(float)), title,
          "layout %zu of %zu floats, weights %s, state %s", at, floats, bits_equal(p, rp, P * sizeof(float)) ? "equal" : "differ",
          bits_equal(state, ref, floats * sizeof(float)) ? "equal" : "differs");
    free(p); free(g); free(rp); free(state); free(ref);
}

// ZeRO's cut: each of 3 ranks updates its part of every slice (parts of 8-bit slices start on block
// boundaries) and the union of their weights equals the unsharded step's
static void test_wired_cut(QStateFormat f) {
    GPT2Config c = wired_config();
    int world = 3;
    size_t P = gpt2_num_parameters(&c), one = optimizer_state_floats_as(&c, OPT_ADAMW, 0, 1, f);
    size_t per = optimizer_state_floats_as(&c, OPT_ADAMW, 0, world, f);
    float *p1 = alloc_floats(P), *g = alloc_floats(P), *state1 = (float*)calloc(one, sizeof(float));
    wired_case(&c, p1, g, 7);
    OptimizerHyper h = wired_hyper();
    OptSharding z1 = OPT_UNSHARDED;
    z1.format = f;
    float* pr[3];
    float* staters[3];
    for (int r = 0; r < world; r++) { pr[r] = alloc_floats(P); memcpy(pr[r], p1, P * sizeof(float)); staters[r] = (float*)calloc(per, sizeof(float)); }
    ParamSlice* s = param_slices_alloc(&c);
    int moved = 0, differ = 0;
    for (int t = 1; t <= 2; t++) {
        optimizer_step(OPT_ADAMW, p1, g, state1, &c, &h, t, &z1, ALL_SLICES);
        for (int r = 0; r < world; r++) {
            OptSharding z = {.rank = r, .world = world, .sum = NULL, .gather = NULL, .grads_compact = 0, .params_compact = 0, .format = f};
            optimizer_step(OPT_ADAMW, pr[r], g, staters[r], &c, &h, t, &z, ALL_SLICES);
        }
    }
    for (int k = 0; k < param_slice_count(&c); k++) {
        moved += slice_units_per_rank(&s[k], world, f) != shard_units_per_rank(slice_units(&s[k]), world);
        for (int r = 0; r < world; r++) {
            int b, e;
            slice_range(&s[k], r, world, f, &b, &e);
            size_t w = (size_t)slice_unit_width(&s[k]), from = s[k].offset + (size_t)b * w, n = (size_t)(e - b) * w;
            differ += !bits_equal(pr[r] + from, p1 + from, n * sizeof(float));
        }
    }
    free(s);
    char title[200];
    snprintf(title, sizeof title, "--optimizer-state %s, ZeRO's cut on 3 ranks (%d slices' cuts moved to block boundaries): "
             "every rank's part after 2 steps = the unsharded step, bitwise", QSTATE_FORMAT_NAMES[f], moved);
    check(differ == 0 && (f != QSTATE_8BIT || moved > 0), title, "%d parts differ, %d cuts moved", differ, moved);
    for (int r = 0; r < world; r++) { free(pr[r]); free(staters[r]); }
    free(p1); free(g); free(state1);
}

// a resume into another format: opt_state_convert from fp32 into f equals the reference's quantizing
// (8bit) or rounding with step 0's bits (bf16) slice by slice, and back into fp32 its reading
static void test_state_convert(QStateFormat f) {
    GPT2Config c = wired_config();
    size_t n32 = optimizer_state_floats_as(&c, OPT_ADAMW, 0, 1, QSTATE_FP32), nf = optimizer_state_floats_as(&c, OPT_ADAMW, 0, 1, f);
    float *src = alloc_floats(n32), *low = (float*)calloc(nf, sizeof(float)), *back = alloc_floats(n32), *ref = (float*)calloc(nf, sizeof(float));
    float* ref_back = alloc_floats(n32);
    uint64_t r = 99;
    for (size_t i = 0; i < n32; i++) { src[i] = 1e-3f * rng_normal(&r); }
    ParamSlice* s = param_slices_alloc(&c);
    size_t at32 = 0, at = 0;
    for (int k = 0; k < param_slice_count(&c); k++) {
        size_t n = (size_t)s[k].rows * s[k].cols;
        for (size_t i = 0; i < n; i++) { src[at32 + n + i] = fabsf(src[at32 + n + i]); }  // v >= 0
        QStateFormat kept;
        size_t mf = ref_moment_floats(f, n, &kept);
        for (int mv = 0; mv < 2; mv++) {
            const float* x = src + at32 + (size_t)mv * n;
            float* out = ref + at + (size_t)mv * mf;
            float* rb = ref_back + at32 + (size_t)mv * n;
            QMapKind kind = mv ? QMAP_UNSIGNED : QMAP_SIGNED;
            if (kept == QSTATE_FP32) { memcpy(out, x, n * sizeof(float)); memcpy(rb, x, n * sizeof(float)); continue; }
            if (kept == QSTATE_8BIT) {
                ref_quantize(kind, x, n, (uint8_t*)out, out + (n + 3) / 4);
                for (size_t i = 0; i < n; i++) { rb[i] = ref_dequantize(qstate_maps()->map[kind].code, (uint8_t*)out, out + (n + 3) / 4, i); }
                continue;
            }
            for (size_t i = 0; i < n; i++) {
                float y = ref_bf16_round(x[i], qstate_random16((uint32_t)k, 0, mv ? QSTATE_STREAM_V : QSTATE_STREAM_M, i));
                ((uint16_t*)out)[i] = (uint16_t)(qstate_float_bits(y) >> 16);
                rb[i] = y;
            }
        }
        at32 += 2 * n;
        at += 2 * mf;
    }
    free(s);
    OptSharding z32 = OPT_UNSHARDED, zf = OPT_UNSHARDED;
    zf.format = f;
    int bad = opt_state_convert(&c, OPT_ADAMW, 0, &z32, src, &zf, low);
    bad += opt_state_convert(&c, OPT_ADAMW, 0, &zf, low, &z32, back);
    char title[200];
    snprintf(title, sizeof title, "resume fp32 -> %s -> fp32 (opt_state_convert): the reference's %s, and its reading back, bitwise",
             QSTATE_FORMAT_NAMES[f], f == QSTATE_8BIT ? "quantizing" : "rounding with step 0's bits");
    check(bad == 0 && bits_equal(low, ref, nf * sizeof(float)) && bits_equal(back, ref_back, n32 * sizeof(float)), title,
          "to %s: %s, back: %s", QSTATE_FORMAT_NAMES[f], bits_equal(low, ref, nf * sizeof(float)) ? "equal" : "differs",
          bits_equal(back, ref_back, n32 * sizeof(float)) ? "equal" : "differs");
    free(src); free(low); free(back); free(ref); free(ref_back);
}

int main(void) {
    test_map(QMAP_SIGNED);
    test_map(QMAP_UNSIGNED);
    test_ties();
    test_no_zero_v();
    test_quantize_thresholds(QMAP_SIGNED);
    test_quantize_thresholds(QMAP_UNSIGNED);
    test_fast_nearest(QMAP_SIGNED);
    test_fast_nearest(QMAP_UNSIGNED);
    test_fast_blocks(QMAP_SIGNED);
    test_fast_blocks(QMAP_UNSIGNED);
    test_round_trip_random();
    test_round_trip_adversarial();
    test_bf16_rounding();
    test_bf16_ema_tracks();
    size_t sizes[3] = {QSTATE_BLOCK, 4 * QSTATE_BLOCK + 37, 5};
    for (int k = 0; k < 3; k++) {
        test_adamw_8bit_step(sizes[k], k + 1);
        test_adamw_bf16_step(sizes[k], k + 2);
    }
    test_thread_count();
    test_adamw_nonfinite();
    for (int f = QSTATE_BF16; f <= QSTATE_8BIT; f++) {
        test_wired_step((QStateFormat)f);
        test_wired_cut((QStateFormat)f);
        test_state_convert((QStateFormat)f);
    }
    for (int f = QSTATE_BF16; f <= QSTATE_8BIT; f++) {
        test_factored_step(0, 48, 40, (QStateFormat)f);   // a matrix whose rows cut across blocks
        test_factored_step(0, 1, 700, (QStateFormat)f);   // a vector
        test_factored_step(1, 48, 40, (QStateFormat)f);
        test_factored_step(1, 1, 700, (QStateFormat)f);
    }
    Tolerance close = {0.01, 0.05}, lagging = {0.30, 0.10};
    test_quadratic_tracking(0.95f, close, "");
    // nearest rounding cannot follow an EMA that moves by less than half a code's gap a step: with
    // beta2 = 0.999, v lags behind (doc/optimizer_state.md); this bounds how far, as measured
    test_quadratic_tracking(0.999f, lagging, " (nearest rounding: v lags, doc/optimizer_state.md)");
    return check_summary();
}
