/*
check.h: the one reporting harness of the project's test programs, in C (test_gpt.c,
tests/test_matmul.c), C++ and CUDA (dev/cuda_emu/tests/, the CUDA kernel tests).

    check(err < 1e-5, "sgemm NN", "max err %g", err);   // "ok   sgemm NN" or "FAIL sgemm NN: max err ..."
    return check_summary();                             // "N passed, N failed"; EXIT_FAILURE if any failed

Every check prints one line; a test program's last line is the summary, which the test
runner (tests/run_tests.py) adds up, and its exit status is non-zero when a check failed.
*/
#ifndef TESTS_CHECK_H
#define TESTS_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int g_checks_passed = 0, g_checks_failed = 0;

// counts a check; on failure prints the printf-style detail after the name
static void check(int ok, const char* name, const char* fmt, ...) {
    if (ok) {
        g_checks_passed++;
        printf("ok   %s\n", name);
        return;
    }
    g_checks_failed++;
    printf("FAIL %s: ", name);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

#ifdef __cplusplus
// C++ (and CUDA): a check without a detail
static void check(bool ok, const char* name) { check(ok ? 1 : 0, name, "%s", "(no detail)"); }
#endif

// prints "N passed, N failed"; returns the program's exit status
static int check_summary(void) {
    printf("%d passed, %d failed\n", g_checks_passed, g_checks_failed);
    return g_checks_failed > 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif // TESTS_CHECK_H
