/*
fault_inject.c: a test-only LD_PRELOAD library that stops a trainer's process at a chosen point of
a file write, so that the checkpoint tests (tests/test_checkpoint_ranks.py) can kill one rank with
SIGKILL exactly there, in the trainer as it is shipped: no hook in the trainer itself.

    make build/fault_inject.so
    LD_PRELOAD=build/fault_inject.so LLMC_FAULT=kill@write:state_00000004_00001.bin.tmp ./train_gpt ...
    mpirun ... -x LD_PRELOAD=$PWD/build/fault_inject.so -x LLMC_FAULT=... ./train_gpt ...  (every rank)

LLMC_FAULT is a comma-separated list of ACTION@POINT:NAME, NAME a file's base name (no folder):
  ACTION  kill   raise(SIGKILL): the process dies at once, as by kill -9 (what a crash or the OOM
                 killer does: no handler, no flush, no MPI call)
          usr1   raise(SIGUSR1): the trainer's stop signal, asking for a checkpoint at the next safe point
  POINT   open     as fopen() is about to open NAME for writing or appending (nothing of it written)
          write    after the first fwrite() into NAME so opened, that much flushed to the file
                   (a file half written: its header and none of its data)
          rename   as rename() is about to move a file onto NAME (the temporary file whole, not in place)
          renamed  after rename() has moved a file onto NAME (in place, the call returned)
A name matches in whichever process writes it: the state files carry the rank in their names, so
one rank is hit and the others run on; the model file and the DONE marker are rank 0's. Each entry
acts once per process. A malformed LLMC_FAULT stops the process at its first file call, naming it.
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FAULTS 8
#define NAME_LEN 256
typedef enum { AT_OPEN, AT_WRITE, AT_RENAME, AT_RENAMED } FaultPoint;
typedef struct {
    int sig;               // SIGKILL or SIGUSR1
    FaultPoint point;
    char name[NAME_LEN];   // a base name
    FILE* stream;          // AT_WRITE: the stream opened on name, once it is
    int fired;
} Fault;

static Fault g_faults[MAX_FAULTS];
static int g_nfaults = -1;  // -1: LLMC_FAULT not read yet

static void bad_spec(const char* spec, const char* why) {
    fprintf(stderr, "fault_inject: LLMC_FAULT='%s': %s\n  hint: ACTION@POINT:NAME[,...], ACTION kill or usr1, "
            "POINT open, write, rename or renamed, NAME a file's base name (tests/fault_inject.c)\n", spec, why);
    _exit(2);
}

static void read_faults(void) {
    if (g_nfaults >= 0) { return; }
    g_nfaults = 0;
    const char* spec = getenv("LLMC_FAULT");
    if (spec == NULL || spec[0] == '\0') { return; }
    char buf[MAX_FAULTS * (NAME_LEN + 16)];
    if (strlen(spec) >= sizeof(buf)) { bad_spec(spec, "too long"); }
    strcpy(buf, spec);
    for (char* save = NULL, *e = strtok_r(buf, ",", &save); e != NULL; e = strtok_r(NULL, ",", &save)) {
        if (g_nfaults == MAX_FAULTS) { bad_spec(spec, "more than 8 entries"); }
        char* at = strchr(e, '@');
        char* colon = at != NULL ? strchr(at, ':') : NULL;
        if (at == NULL || colon == NULL || colon[1] == '\0' || strlen(colon + 1) >= NAME_LEN) { bad_spec(spec, "an entry is not ACTION@POINT:NAME"); }
        *at = *colon = '\0';
        Fault* f = &g_faults[g_nfaults++];
        memset(f, 0, sizeof(*f));
        if (strcmp(e, "kill") == 0) { f->sig = SIGKILL; }
        else if (strcmp(e, "usr1") == 0) { f->sig = SIGUSR1; }
        else { bad_spec(spec, "unknown ACTION"); }
        static const char* const POINTS[] = {"open", "write", "rename", "renamed"};
        int p = 0;
        while (p < 4 && strcmp(at + 1, POINTS[p]) != 0) { p++; }
        if (p == 4) { bad_spec(spec, "unknown POINT"); }
        f->point = (FaultPoint)p;
        strcpy(f->name, colon + 1);
    }
}

static const char* base_name(const char* path) {
    const char* slash = strrchr(path, '/');
    return slash != NULL ? slash + 1 : path;
}

static void act(Fault* f) {
    f->fired = 1;
    fflush(stdout);  // what the process printed so far reaches the test (a kill loses the rest)
    raise(f->sig);
}

// fopen and fopen64 (the same call; which one a program links depends on its flags)
static FILE* opened(FILE* (*real)(const char*, const char*), const char* path, const char* mode) {
    read_faults();
    int writing = mode[0] == 'w' || mode[0] == 'a';
    for (int i = 0; i < g_nfaults && writing; i++) {
        Fault* f = &g_faults[i];
        if (!f->fired && f->point == AT_OPEN && strcmp(base_name(path), f->name) == 0) { act(f); }
    }
    FILE* s = real(path, mode);
    for (int i = 0; i < g_nfaults && writing && s != NULL; i++) {
        Fault* f = &g_faults[i];
        if (!f->fired && f->point == AT_WRITE && strcmp(base_name(path), f->name) == 0) { f->stream = s; }
    }
    return s;
}

FILE* fopen(const char* path, const char* mode) {
    static FILE* (*real)(const char*, const char*) = NULL;
    if (real == NULL) { real = (FILE* (*)(const char*, const char*))dlsym(RTLD_NEXT, "fopen"); }
    return opened(real, path, mode);
}

FILE* fopen64(const char* path, const char* mode) {
    static FILE* (*real)(const char*, const char*) = NULL;
    if (real == NULL) { real = (FILE* (*)(const char*, const char*))dlsym(RTLD_NEXT, "fopen64"); }
    return opened(real, path, mode);
}

size_t fwrite(const void* ptr, size_t size, size_t n, FILE* stream) {
    static size_t (*real)(const void*, size_t, size_t, FILE*) = NULL;
    if (real == NULL) { real = (size_t (*)(const void*, size_t, size_t, FILE*))dlsym(RTLD_NEXT, "fwrite"); }
    size_t done = real(ptr, size, n, stream);
    for (int i = 0; i < g_nfaults; i++) {
        Fault* f = &g_faults[i];
        if (!f->fired && f->point == AT_WRITE && f->stream == stream) {
            fflush(stream);
            act(f);
        }
    }
    return done;
}

int rename(const char* from, const char* to) {
    static int (*real)(const char*, const char*) = NULL;
    if (real == NULL) { real = (int (*)(const char*, const char*))dlsym(RTLD_NEXT, "rename"); }
    read_faults();
    for (int i = 0; i < g_nfaults; i++) {
        Fault* f = &g_faults[i];
        if (!f->fired && f->point == AT_RENAME && strcmp(base_name(to), f->name) == 0) { act(f); }
    }
    int rc = real(from, to);
    for (int i = 0; i < g_nfaults && rc == 0; i++) {
        Fault* f = &g_faults[i];
        if (!f->fired && f->point == AT_RENAMED && strcmp(base_name(to), f->name) == 0) { act(f); }
    }
    return rc;
}

// a closed stream's FILE may be reused for another file: it no longer stands for NAME
int fclose(FILE* stream) {
    static int (*real)(FILE*) = NULL;
    if (real == NULL) { real = (int (*)(FILE*))dlsym(RTLD_NEXT, "fclose"); }
    for (int i = 0; i < (g_nfaults > 0 ? g_nfaults : 0); i++) {
        if (g_faults[i].stream == stream) { g_faults[i].stream = NULL; }
    }
    return real(stream);
}
