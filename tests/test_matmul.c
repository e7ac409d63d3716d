/*
test_matmul.c: mm_sgemm (cpu/matmul.h) against a naive triple loop that sums in double.

    gcc -O3 -march=native -fopenmp tests/test_matmul.c -o test_matmul -lm && ./test_matmul
    gcc -O3 -march=native -fopenmp -DUSE_BLAS tests/test_matmul.c -o test_matmul_blas -lopenblas -lm

Checks all four transpose combinations over odd sizes and odd leading dimensions,
alpha/beta variants, beta = 0 with NaN in C (must be overwritten, never read),
K = 0, call-to-call repeatability and independence of the thread count (1 vs 2
threads must be bitwise equal). Prints "ok name" or "FAIL name" per check, then
"N passed, N failed"; exits non-zero on any failure.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "../cpu/matmul.h"
#include "check.h"

// ----------------------------------------------------------------------------
// reference and helpers

// an (rows, cols) matrix stored with leading dimension ld >= cols, padding poisoned
static float* random_matrix(int rows, int cols, int ld) {
    size_t n = (size_t)(rows > 0 ? rows : 1) * ld;
    float* x = (float*)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { x[i] = (i % ld) < (size_t)cols ? (float)rand() / RAND_MAX * 2.0f - 1.0f : NAN; }
    return x;
}

static float op_at(const float* X, int ld, mm_trans t, int r, int c) {
    return t == MM_N ? X[(size_t)r * ld + c] : X[(size_t)c * ld + r];
}

// C = alpha * op(A) @ op(B) + beta * C, summed in double; beta = 0 does not read C
static void sgemm_ref(mm_trans ta, mm_trans tb, int M, int N, int K, float alpha, const float* A, int lda,
                      const float* B, int ldb, float beta, float* C, int ldc) {
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double sum = 0.0;
            for (int k = 0; k < K; k++) { sum += (double)op_at(A, lda, ta, i, k) * op_at(B, ldb, tb, k, j); }
            double c = beta == 0.0f ? 0.0 : (double)beta * C[(size_t)i * ldc + j];
            C[(size_t)i * ldc + j] = (float)(alpha * sum + c);
        }
    }
}

// max |got - want| / (scale) over the M x N block, and checks padding was left alone
static int close_enough(const float* got, const float* want, int M, int N, int ldc, int K) {
    // fp32 sums of K products of values in [-1, 1]: error grows about like sqrt(K)
    double tol = 1e-5 * (4.0 + sqrt((double)K) * 4.0);
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < ldc; j++) {
            float g = got[(size_t)i * ldc + j], w = want[(size_t)i * ldc + j];
            if (j >= N) {
                if (memcmp(&g, &w, sizeof(float)) != 0) { return 0; } // padding must be untouched
            } else if (!(fabs((double)g - w) <= tol * (1.0 + fabs((double)w)))) {
                return 0;
            }
        }
    }
    return 1;
}

typedef struct { mm_trans ta, tb; int M, N, K, pad; float alpha, beta; int nan_c; } case_t;

// runs one case against the reference; returns 1 if it matched
static int run_case(case_t c) {
    int ar = c.ta == MM_N ? c.M : c.K, ac = c.ta == MM_N ? c.K : c.M; // A as stored
    int br = c.tb == MM_N ? c.K : c.N, bc = c.tb == MM_N ? c.N : c.K;
    int lda = ac + c.pad, ldb = bc + c.pad, ldc = c.N + c.pad;
    float* A = random_matrix(ar, ac, lda);
    float* B = random_matrix(br, bc, ldb);
    float* C = random_matrix(c.M, c.N, ldc);
    if (c.nan_c) {
        for (int i = 0; i < c.M; i++) { for (int j = 0; j < c.N; j++) { C[(size_t)i * ldc + j] = NAN; } }
    }
    size_t cn = (size_t)(c.M > 0 ? c.M : 1) * ldc;
    float* want = (float*)malloc_check(cn * sizeof(float));
    memcpy(want, C, cn * sizeof(float));
    sgemm_ref(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A, lda, B, ldb, c.beta, want, ldc);
    mm_sgemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A, lda, B, ldb, c.beta, C, ldc);
    int ok = close_enough(C, want, c.M, c.N, ldc, c.K);
    free(A); free(B); free(C); free(want);
    return ok;
}

// ----------------------------------------------------------------------------
// the checks

static const char* TRANS_NAME[] = {"N", "T"};

// every transpose combination over sizes that hit full tiles, edge tiles and K blocks
static void test_shapes(void) {
    static const int SIZES[] = {1, 3, 17, 33, 65, 130};
    int ns = (int)(sizeof(SIZES) / sizeof(SIZES[0]));
    for (int t = 0; t < 4; t++) {
        mm_trans ta = (mm_trans)(t >> 1), tb = (mm_trans)(t & 1);
        int ok = 1;
        for (int i = 0; i < ns; i++) {
            for (int j = 0; j < ns; j++) {
                for (int k = 0; k < ns; k++) {
                    case_t c = {ta, tb, SIZES[i], SIZES[j], SIZES[k], (i + j + k) % 3 * 3, 1.0f, 0.0f, 0};
                    ok &= run_case(c);
                }
            }
        }
        char name[64];
        snprintf(name, sizeof(name), "shapes_%s%s", TRANS_NAME[ta], TRANS_NAME[tb]);
        check(ok, name, "wrong result");
    }
}

// bigger products that span several MC/NC/KC blocks and several threads
static void test_large(void) {
    static const int SHAPES[][3] = {{300, 1100, 600}, {257, 2100, 531}, {1000, 77, 1030}};
    for (int t = 0; t < 4; t++) {
        int ok = 1;
        for (int s = 0; s < 3; s++) {
            case_t c = {(mm_trans)(t >> 1), (mm_trans)(t & 1), SHAPES[s][0], SHAPES[s][1], SHAPES[s][2],
                        5, 0.5f, 1.0f, 0};
            ok &= run_case(c);
        }
        char name[64];
        snprintf(name, sizeof(name), "large_%s%s", TRANS_NAME[t >> 1], TRANS_NAME[t & 1]);
        check(ok, name, "wrong result");
    }
}

static void test_alpha_beta(void) {
    static const float AB[][2] = {{1.0f, 1.0f}, {0.5f, -2.0f}, {-1.5f, 0.25f}, {0.0f, 0.5f}, {2.0f, 0.0f}};
    for (int v = 0; v < 5; v++) {
        int ok = 1;
        for (int t = 0; t < 4; t++) {
            case_t c = {(mm_trans)(t >> 1), (mm_trans)(t & 1), 37, 45, 300, 1, AB[v][0], AB[v][1], 0};
            ok &= run_case(c);
        }
        char name[64];
        snprintf(name, sizeof(name), "alpha_%g_beta_%g", AB[v][0], AB[v][1]);
        check(ok, name, "wrong result");
    }
}

static void test_beta0_nan(void) {
    int ok = 1;
    for (int t = 0; t < 4; t++) {
        case_t c = {(mm_trans)(t >> 1), (mm_trans)(t & 1), 29, 71, 513, 2, 1.0f, 0.0f, 1};
        ok &= run_case(c);
        case_t k0 = {(mm_trans)(t >> 1), (mm_trans)(t & 1), 29, 71, 0, 2, 1.0f, 0.0f, 1};
        ok &= run_case(k0);
    }
    check(ok, "beta0_overwrites_nan", "wrong result");
}

static void test_k0(void) {
    case_t c = {MM_N, MM_N, 19, 23, 0, 3, 1.0f, 0.5f, 0};
    case_t empty = {MM_N, MM_T, 0, 23, 5, 3, 1.0f, 0.5f, 0};
    check(run_case(c) && run_case(empty), "k0_scales_c_and_empty_is_noop", "wrong result");
}

// the trainer's three layouts, bitwise equal for 1 vs 2 threads and from call to call
static void test_determinism(void) {
    int M = 259, N = 771, K = 1030; // odd sizes: edge tiles and a partial K block
    static const mm_trans LAYOUT[][2] = {{MM_N, MM_T}, {MM_N, MM_N}, {MM_T, MM_N}};
    float* A = random_matrix(K, K, K); // big enough for every layout
    float* B = random_matrix(K, K, K);
    size_t cn = (size_t)M * N;
    float* c1 = (float*)malloc_check(cn * sizeof(float));
    float* c2 = (float*)malloc_check(cn * sizeof(float));
    float* c3 = (float*)malloc_check(cn * sizeof(float));
    int threads_ok = 1, repeat_ok = 1;
    for (int l = 0; l < 3; l++) {
        mm_trans ta = LAYOUT[l][0], tb = LAYOUT[l][1];
        for (size_t i = 0; i < cn; i++) { c1[i] = c2[i] = c3[i] = 0.25f; }
        omp_set_num_threads(1);
        mm_sgemm(ta, tb, M, N, K, 1.0f, A, K, B, K, 1.0f, c1, N);
        omp_set_num_threads(2);
        mm_sgemm(ta, tb, M, N, K, 1.0f, A, K, B, K, 1.0f, c2, N);
        mm_sgemm(ta, tb, M, N, K, 1.0f, A, K, B, K, 1.0f, c3, N);
        threads_ok &= memcmp(c1, c2, cn * sizeof(float)) == 0;
        repeat_ok &= memcmp(c2, c3, cn * sizeof(float)) == 0;
    }
    check(threads_ok, "bitwise_equal_1_vs_2_threads", "wrong result");
    check(repeat_ok, "bitwise_equal_call_to_call", "wrong result");
    free(A); free(B); free(c1); free(c2); free(c3);
}

int main(void) {
    srand(1337);
    int maxt = omp_get_max_threads();
    test_shapes();
    test_large();
    test_alpha_beta();
    test_beta0_nan();
    test_k0();
    test_determinism();
    omp_set_num_threads(maxt);
    return check_summary();
}
