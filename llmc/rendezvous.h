/*
rendezvous.h: rank 0 hands a few bytes (NCCL's unique id) to the other ranks of a run that MPI does
not join (started by srun or with torchrun-style variables), as --dist-init says:

    rendezvous_share("file:/shared/dir", rank, world, id, sizeof(id));   // a folder every rank sees
    rendezvous_share("tcp:node0:29600", rank, world, id, sizeof(id));    // rank 0 serves it on that port

file:DIR. No earlier run's id is ever taken: each rank r > 0 asks with a fresh nonce (its file
llmc_dist.want.R names it, written atomically: a temporary file renamed), rank 0 answers each nonce it
reads with llmc_dist.id.NONCE (atomically too) and waits for that rank's llmc_dist.ack.NONCE; a stale
want file's nonce is answered but never acknowledged, and the rank's fresh one replaces it. Rank 0
removes every file it answered with, and the ranks their own.

tcp:HOST:PORT. Rank 0 listens on HOST:PORT (HOST as the others reach it; it binds every address),
each other rank connects (retrying while rank 0 starts) and sends its rank; rank 0 sends the bytes.

Timeout: a rank that waits longer than rendezvous_timeout_s() (LLMC_DIST_TIMEOUT seconds, 600 unless
set) stops, saying which rank(s) it waited for. The CUDA trainer's collectives of the host wait as long
(cuda/nccl.cuh): long enough for rank 0 to write a checkpoint while the others wait at the barrier.
*/
#ifndef LLMC_RENDEZVOUS_H
#define LLMC_RENDEZVOUS_H

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "utils.h"

#define RENDEZVOUS_DEFAULT_TIMEOUT_S 600
#define RENDEZVOUS_POLL_US 20000   // between looks at the folder or connection attempts
#define RENDEZVOUS_MAGIC 0x6c6c6d63u   // "llmc": a connection that is not one of ours is refused
#define RENDEZVOUS_PATH_MAX 4200   // a folder name (PATH_MAX) and a file name in it

static double rendezvous_timeout_s(void) {
    const char* v = getenv("LLMC_DIST_TIMEOUT");
    if (v == NULL) { return RENDEZVOUS_DEFAULT_TIMEOUT_S; }
    char* end;
    double t = strtod(v, &end);
    if (end == v || *end != '\0' || !(t > 0)) { fail("LLMC_DIST_TIMEOUT=%s: not a number of seconds\n  hint: e.g. LLMC_DIST_TIMEOUT=120", v); }
    return t;
}

static double rendezvous_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ----------------------------------------------------------------------------
// file:DIR

static void rendezvous_path(char* out, size_t n, const char* dir, const char* what, unsigned long long key) {
    snprintf(out, n, "%s/llmc_dist.%s.%llx", dir, what, key);
}

// path := bytes, atomically (a reader sees all of it or no file)
static void rendezvous_write(const char* path, const void* bytes, size_t n) {
    char tmp[RENDEZVOUS_PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
    FILE* f = fopen(tmp, "wb");
    if (f == NULL || fwrite(bytes, 1, n, f) != n || fclose(f) != 0) {
        fail("--dist-init file: cannot write %s: %s\n  hint: DIR must be a folder every rank can write (a shared file system)", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0) { fail("--dist-init file: cannot rename %s to %s: %s", tmp, path, strerror(errno)); }
}

// 1 and buf filled when path holds exactly n bytes
static int rendezvous_read(const char* path, void* buf, size_t n) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) { return 0; }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    return got == n;
}

static unsigned long long rendezvous_nonce(int rank) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    unsigned long long x = (unsigned long long)ts.tv_nsec ^ ((unsigned long long)ts.tv_sec << 30) ^ ((unsigned long long)getpid() << 17) ^ (unsigned long long)rank;
    for (const char* c = host; *c; c++) { x = (x ^ (unsigned char)*c) * 0x100000001b3ull; }
    return x == 0 ? 1 : x;
}

static void rendezvous_file(const char* dir, int rank, int world, void* bytes, size_t n) {
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fail("--dist-init file:%s: no such folder\n  hint: create it first, on a file system every rank sees (it may be an empty folder)", dir);
    }
    double t0 = rendezvous_now(), limit = rendezvous_timeout_s();
    char path[RENDEZVOUS_PATH_MAX];
    if (rank != 0) {
        unsigned long long nonce = rendezvous_nonce(rank);
        rendezvous_path(path, sizeof(path), dir, "want", (unsigned long long)rank);
        rendezvous_write(path, &nonce, sizeof(nonce));
        rendezvous_path(path, sizeof(path), dir, "id", nonce);
        while (!rendezvous_read(path, bytes, n)) {
            if (rendezvous_now() - t0 > limit) {
                fail("--dist-init file:%s: rank %d waited %.0f s for rank 0 to answer (%s)\n  hint: is rank 0 running, "
                     "with the same --dist-init, and does it see the same folder? LLMC_DIST_TIMEOUT sets the wait", dir, rank, limit, path);
            }
            usleep(RENDEZVOUS_POLL_US);
        }
        remove(path);
        rendezvous_path(path, sizeof(path), dir, "ack", nonce);
        rendezvous_write(path, &nonce, sizeof(nonce));
        return;
    }
    // rank 0: answers every nonce it reads in a want file until each rank acknowledged one
    unsigned long long* answered = (unsigned long long*)calloc((size_t)world * 8, sizeof(unsigned long long));
    int* tries = (int*)calloc((size_t)world, sizeof(int));
    int* done = (int*)calloc((size_t)world, sizeof(int));
    if (answered == NULL || tries == NULL || done == NULL) { fail("out of memory"); }
    for (int left = world - 1; left > 0;) {
        for (int r = 1; r < world; r++) {
            if (done[r]) { continue; }
            unsigned long long nonce;
            rendezvous_path(path, sizeof(path), dir, "want", (unsigned long long)r);
            if (rendezvous_read(path, &nonce, sizeof(nonce))) {
                int seen = 0;
                for (int i = 0; i < tries[r]; i++) { seen |= answered[r * 8 + i] == nonce; }
                if (!seen && tries[r] < 8) {
                    answered[r * 8 + tries[r]++] = nonce;
                    rendezvous_path(path, sizeof(path), dir, "id", nonce);
                    rendezvous_write(path, bytes, n);
                }
            }
            for (int i = 0; i < tries[r] && !done[r]; i++) {
                rendezvous_path(path, sizeof(path), dir, "ack", answered[r * 8 + i]);
                if (rendezvous_read(path, &nonce, sizeof(nonce))) {
                    done[r] = 1;
                    left--;
                    remove(path);
                    rendezvous_path(path, sizeof(path), dir, "want", (unsigned long long)r);
                    remove(path);
                }
            }
        }
        if (left > 0 && rendezvous_now() - t0 > limit) {
            char waiting[256] = "";
            for (int r = 1; r < world && strlen(waiting) < sizeof(waiting) - 16; r++) {
                if (!done[r]) { snprintf(waiting + strlen(waiting), sizeof(waiting) - strlen(waiting), "%s%d", waiting[0] ? ", " : "", r); }
            }
            fail("--dist-init file:%s: rank 0 waited %.0f s for rank(s) %s of %d to arrive\n  hint: did every rank start, with "
                 "the same --dist-init, seeing the same folder? LLMC_DIST_TIMEOUT sets the wait", dir, limit, waiting, world);
        }
        if (left > 0) { usleep(RENDEZVOUS_POLL_US); }
    }
    for (int r = 1; r < world; r++) {  // the answers to stale nonces nobody took
        for (int i = 0; i < tries[r]; i++) { rendezvous_path(path, sizeof(path), dir, "id", answered[r * 8 + i]); remove(path); }
    }
    free(answered); free(tries); free(done);
}

// ----------------------------------------------------------------------------
// tcp:HOST:PORT

static void rendezvous_io(int fd, void* buf, size_t n, int sending, const char* what) {
    for (size_t done = 0; done < n;) {
        ssize_t k = sending ? send(fd, (char*)buf + done, n - done, MSG_NOSIGNAL) : recv(fd, (char*)buf + done, n - done, 0);
        if (k <= 0) { fail("--dist-init tcp: %s: %s", what, k == 0 ? "the other side closed the connection" : strerror(errno)); }
        done += (size_t)k;
    }
}

static void rendezvous_tcp(const char* host, const char* port, int rank, int world, void* bytes, size_t n) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (rank == 0) { hints.ai_flags = AI_PASSIVE; }
    int rc = getaddrinfo(rank == 0 ? NULL : host, port, &hints, &res);
    if (rc != 0) { fail("--dist-init tcp:%s:%s: %s\n  hint: HOST is rank 0's machine as the others reach it, PORT a free port", host, port, gai_strerror(rc)); }
    double t0 = rendezvous_now(), limit = rendezvous_timeout_s();
    if (rank != 0) {
        int fd = -1;
        while (fd < 0) {
            fd = socket(res->ai_family, res->ai_socktype, 0);
            if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) { break; }
            if (fd >= 0) { close(fd); fd = -1; }
            if (rendezvous_now() - t0 > limit) {
                fail("--dist-init tcp:%s:%s: rank %d waited %.0f s for rank 0 to listen there\n  hint: is rank 0 running with the "
                     "same --dist-init, and is HOST its address as this machine reaches it? LLMC_DIST_TIMEOUT sets the wait", host, port, rank, limit);
            }
            usleep(RENDEZVOUS_POLL_US);
        }
        uint32_t hello[2] = {RENDEZVOUS_MAGIC, (uint32_t)rank};
        rendezvous_io(fd, hello, sizeof(hello), 1, "sending this rank to rank 0");
        rendezvous_io(fd, bytes, n, 0, "receiving rank 0's id");
        close(fd);
        freeaddrinfo(res);
        return;
    }
    int srv = socket(res->ai_family, res->ai_socktype, 0), one = 1;
    setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (srv < 0 || bind(srv, res->ai_addr, res->ai_addrlen) != 0 || listen(srv, world) != 0) {
        fail("--dist-init tcp:%s:%s: rank 0 cannot listen on port %s: %s\n  hint: choose a free port (not torchrun's MASTER_PORT, which its own store holds)",
             host, port, port, strerror(errno));
    }
    freeaddrinfo(res);
    int* joined = (int*)calloc((size_t)world, sizeof(int));
    if (joined == NULL) { fail("out of memory"); }
    for (int left = world - 1; left > 0;) {
        struct timeval tv = {0, RENDEZVOUS_POLL_US * 10};
        fd_set fds;
        FD_ZERO(&fds);
        FD_SET(srv, &fds);
        if (select(srv + 1, &fds, NULL, NULL, &tv) > 0) {
            int fd = accept(srv, NULL, NULL);
            uint32_t hello[2] = {0, 0};
            if (fd >= 0 && recv(fd, hello, sizeof(hello), MSG_WAITALL) == (ssize_t)sizeof(hello) && hello[0] == RENDEZVOUS_MAGIC &&
                hello[1] > 0 && (int)hello[1] < world && !joined[hello[1]]) {
                rendezvous_io(fd, bytes, n, 1, "sending the id");
                joined[hello[1]] = 1;
                left--;
            }
            if (fd >= 0) { close(fd); }
        }
        if (left > 0 && rendezvous_now() - t0 > limit) {
            char waiting[256] = "";
            for (int r = 1; r < world && strlen(waiting) < sizeof(waiting) - 16; r++) {
                if (!joined[r]) { snprintf(waiting + strlen(waiting), sizeof(waiting) - strlen(waiting), "%s%d", waiting[0] ? ", " : "", r); }
            }
            fail("--dist-init tcp:%s:%s: rank 0 waited %.0f s for rank(s) %s of %d to connect\n  hint: did every rank start with "
                 "the same --dist-init, and can they reach this machine on port %s? LLMC_DIST_TIMEOUT sets the wait", host, port, limit, waiting, world, port);
        }
    }
    close(srv);
    free(joined);
}

// bytes (n) := rank 0's, on every rank of world, met as method says (file:DIR or tcp:HOST:PORT)
static void rendezvous_share(const char* method, int rank, int world, void* bytes, size_t n) {
    if (strncmp(method, "file:", 5) == 0 && method[5] != '\0') {
        rendezvous_file(method + 5, rank, world, bytes, n);
        return;
    }
    const char* colon = strncmp(method, "tcp:", 4) == 0 ? strrchr(method + 4, ':') : NULL;
    if (colon != NULL && colon > method + 4 && colon[1] != '\0') {
        char host[256];
        snprintf(host, sizeof(host), "%.*s", (int)(colon - (method + 4)), method + 4);
        rendezvous_tcp(host, colon + 1, rank, world, bytes, n);
        return;
    }
    fail("--dist-init %s: unknown; choose file:DIR (a folder every rank sees) or tcp:HOST:PORT (rank 0's machine and a free port)", method);
}

#endif // LLMC_RENDEZVOUS_H
