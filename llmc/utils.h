/*
utils.h: error handling that stops with file:line, the failing call and a hint.

Every call that can fail (fopen, fread, malloc, ...) goes through one of these
wrappers, so a failure never goes unnoticed and always says where and why:

    FILE* f = fopen_check(path, "rb");           // "error: cannot open 'x.bin' ..."
    fread_check(buf, sizeof(float), n, f);        // "error: short read ..."
    float* p = malloc_check(n * sizeof(float));

fail(...) prints "error: <message>" and the source location, then exits with
EXIT_FAILURE. Messages name the problem and, where one exists, the fix. Inside a
FailTrap (below) it returns to the trap with the message instead.
*/
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// a caller that tries something the ordinary checks may refuse (--plan's budget search plans
// every combination of the memory flags) points g_fail_trap at a trap and setjmp()s it: fail()
// then keeps its message there and longjmps back instead of exiting. Only around code that
// allocates nothing and leaves no file open when it fails (the checks and the planner)
#define FAIL_MESSAGE_LEN 512
typedef struct {
    jmp_buf jump;
    char message[FAIL_MESSAGE_LEN];  // what fail() would have printed after "error: "
} FailTrap;
static FailTrap* g_fail_trap = NULL;

// print "error: ..." with the caller's file:line and exit (in a trap: return to it)
static void fail_at(const char* file, int line, const char* fmt, ...) {
    if (g_fail_trap != NULL) {
        FailTrap* trap = g_fail_trap;
        g_fail_trap = NULL;  // a trap catches one failure
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(trap->message, sizeof(trap->message), fmt, ap);
        va_end(ap);
        (void)file;
        (void)line;
        longjmp(trap->jump, 1);
    }
    fflush(stdout);
    fprintf(stderr, "error: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  (at %s:%d)\n", file, line);
    exit(EXIT_FAILURE);
}
#define fail(...) fail_at(__FILE__, __LINE__, __VA_ARGS__)

// opens a file, or stops naming it: missing, unreadable ("permission denied"), or a directory
// (which fopen opens for reading on Linux, and the first read then fails)
static FILE* fopen_check_at(const char* path, const char* mode, const char* file, int line) {
    FILE* f = fopen(path, mode);
    if (f == NULL) {
        fail_at(file, line, "cannot open '%s' (mode %s): %s\n"
                "  hint: %s", path, mode, errno == EACCES ? "permission denied" : strerror(errno),
                errno == EACCES ? "make it readable (chmod), or use a copy you can read"
                                : "check the path; data files are made by the scripts in dev/data/");
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fail_at(file, line, "'%s' is a directory, where a file is expected\n  hint: name the file in it", path);
    }
    return f;
}
#define fopen_check(path, mode) fopen_check_at(path, mode, __FILE__, __LINE__)

static void fread_check_at(void* ptr, size_t size, size_t n, FILE* f, const char* file, int line) {
    size_t got = fread(ptr, size, n, f);
    if (got != n) {
        fail_at(file, line, "short read: wanted %zu items of %zu bytes, got %zu (%s)\n"
                "  hint: the file is truncated or not the format expected",
                n, size, got, feof(f) ? "end of file" : strerror(errno));
    }
}
#define fread_check(ptr, size, n, f) fread_check_at(ptr, size, n, f, __FILE__, __LINE__)

static void fwrite_check_at(const void* ptr, size_t size, size_t n, FILE* f, const char* file, int line) {
    if (fwrite(ptr, size, n, f) != n) {
        fail_at(file, line, "write failed: %zu items of %zu bytes: %s\n"
                "  hint: is the disk full or the output directory read-only?", n, size, strerror(errno));
    }
}
#define fwrite_check(ptr, size, n, f) fwrite_check_at(ptr, size, n, f, __FILE__, __LINE__)

static void fclose_check_at(FILE* f, const char* file, int line) {
    if (fclose(f) != 0) { fail_at(file, line, "fclose failed: %s", strerror(errno)); }
}
#define fclose_check(f) fclose_check_at(f, __FILE__, __LINE__)

static void fseek_check_at(FILE* f, long off, int whence, const char* file, int line) {
    if (fseek(f, off, whence) != 0) { fail_at(file, line, "fseek to %ld failed: %s", off, strerror(errno)); }
}
#define fseek_check(f, off, whence) fseek_check_at(f, off, whence, __FILE__, __LINE__)

static void* malloc_check_at(size_t size, const char* file, int line) {
    void* p = malloc(size);
    if (p == NULL && size > 0) {
        fail_at(file, line, "out of host memory allocating %zu bytes (%.1f MiB)\n"
                "  hint: try a smaller model or batch; --plan prints what a run needs",
                size, size / (1024.0 * 1024.0));
    }
    return p;
}
#define malloc_check(size) malloc_check_at(size, __FILE__, __LINE__)

static void* calloc_check_at(size_t n, size_t size, const char* file, int line) {
    void* p = calloc(n, size);
    if (p == NULL && n * size > 0) {
        fail_at(file, line, "out of host memory allocating %zu bytes", n * size);
    }
    return p;
}
#define calloc_check(n, size) calloc_check_at(n, size, __FILE__, __LINE__)

static void* realloc_check_at(void* old, size_t size, const char* file, int line) {
    void* p = realloc(old, size);
    if (p == NULL && size > 0) { fail_at(file, line, "out of host memory growing a block to %zu bytes", size); }
    return p;
}
#define realloc_check(old, size) realloc_check_at(old, size, __FILE__, __LINE__)

// size of an open file in bytes (leaves the position at the start)
static long file_size(FILE* f) {
    fseek_check(f, 0, SEEK_END);
    long n = ftell(f);
    fseek_check(f, 0, SEEK_SET);
    return n;
}

#endif // LLMC_UTILS_H
