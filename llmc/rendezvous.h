/*
rendezvous.h: rank 0 hands a few bytes (NCCL's unique id) to the other ranks of a run that MPI does
not join (started by srun or with torchrun-style variables), as --dist-init says, and only to them:

    rendezvous_share("file:/shared/dir", rank, world, settings_hash, id, sizeof(id));  // a folder every rank sees
    rendezvous_share("tcp:node0:29600", rank, world, settings_hash, id, sizeof(id));   // rank 0 serves it on that port

What it trusts: the job's secret, which every rank of the job knows and nobody else: LLMC_DIST_SECRET
(at least RENDEZVOUS_SECRET_MIN characters) or LLMC_DIST_SECRET_FILE (a file holding it, owned by this
user and readable by nobody else). tcp: needs one; file:DIR without one makes one: rank 0 writes a
fresh secret to DIR/llmc_dist.JOB.secret (mode 0600, owner only; a temporary file renamed over any
stale one), which the other ranks read. Each rank asks rank 0 for the id in an exchange of four
messages (llmc/rendezvous_proto.h: fresh nonces on both sides, an HMAC-SHA256 over the whole exchange
on every message, the id encrypted), so a stray or hostile process can neither read the id, nor take
a rank's place, nor pass off a forged id as rank 0's. Rank 0 refuses, and tells the peer why, a HELLO
of another world size, another job (the launcher's SLURM_JOB_ID, SLURM_STEP_ID, TORCHELASTIC_RUN_ID:
rendezvous_job_key) or other settings (dist_settings_hash()), or of a rank that joined already; it
drops garbage, a rank outside 1..world-1, a wrong MAC and a connection silent past
RENDEZVOUS_PEER_DEADLINE_S, and keeps waiting for the right peer, naming what it refused if it times out.

tcp:HOST:PORT. Rank 0 resolves HOST and listens on that address (PORT 1..65535), serving every
connection at once (poll, non-blocking sockets: a silent one never holds up the others); each other
rank connects (retrying while rank 0 starts) and runs the exchange, every read with a deadline.

file:DIR. Files named llmc_dist.JOB.KIND..., JOB the launcher's job key in hex (0 without one), so
two launched jobs in one folder never meet; a peer writes hello.RANK.NONCE, rank 0 claims it by a
rename (taken.NONCE: two rank 0s never answer one HELLO), answers in answer.NONCE, reads ack.NONCE
and writes welcome.NONCE; every file is written atomically (a temporary file renamed) and the names
carry the peer's fresh nonce, so stale files of a killed run are never taken for this run's. A peer
that read a stale secret file is refused (BAD_PROOF), sees the secret file change, and asks again.
A rank 0 that finds its secret file replaced (a second job without a job key in the folder) stops,
naming it. Rank 0 removes the files it claimed and wrote, and the peers theirs.

Timeout: a rank that waits longer than rendezvous_timeout_s() (LLMC_DIST_TIMEOUT seconds, 600 unless
set) stops, saying which rank(s) it waited for and what it refused. The CUDA trainer's collectives of
the host wait as long (cuda/nccl.cuh): long enough for rank 0 to write a checkpoint while the others
wait at the barrier.
*/
#ifndef LLMC_RENDEZVOUS_H
#define LLMC_RENDEZVOUS_H

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "utils.h"
#include "rendezvous_proto.h"

#define RENDEZVOUS_DEFAULT_TIMEOUT_S 600
#define RENDEZVOUS_POLL_US 20000          // between looks at the folder or connection attempts
#define RENDEZVOUS_POLL_MS (RENDEZVOUS_POLL_US / 1000)
#define RENDEZVOUS_PEER_DEADLINE_S 5.0    // a connection not through its exchange by then is dropped
#define RENDEZVOUS_PATH_MAX 4200          // a folder name (PATH_MAX) and a file name in it
#define RENDEZVOUS_SECRET_MIN 16
#define RENDEZVOUS_SECRET_MAX 4096
#define RENDEZVOUS_MADE_SECRET_BYTES 32   // the random bytes of a secret rank 0 makes (written in hex)
#define RENDEZVOUS_MAX_PENDING 64         // exchanges rank 0 holds open at once
#define RENDEZVOUS_REFUSALS_SHOWN 4       // refusals named in a timeout message (then a count)
#define RENDEZVOUS_TEXT_LEN 1024
#define RENDEZVOUS_MAX_PORT 65535
#define RENDEZVOUS_SECRET_HINT "export LLMC_DIST_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n') before launching " \
                               "every rank (scripts/launch_local.sh makes one), or LLMC_DIST_SECRET_FILE=FILE (chmod 600)"

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

static void rendezvous_random(uint8_t* out, size_t n) {
    int fd = open("/dev/urandom", O_RDONLY);
    ssize_t got = fd < 0 ? -1 : read(fd, out, n);
    if (fd >= 0) { close(fd); }
    if (got != (ssize_t)n) { fail("--dist-init: cannot read %zu random bytes from /dev/urandom: %s", n, strerror(errno)); }
}

static void rendezvous_hex(char* out, const uint8_t* b, size_t n) {
    for (size_t i = 0; i < n; i++) { snprintf(out + 2 * i, 3, "%02x", b[i]); }
}

// the launcher's job (srun's job and step, torchrun's run id) as a 64-bit key; 0 when none says
static uint64_t rendezvous_job_key(void) {
    static const char* const VARS[] = {"SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID"};
    char text[RENDEZVOUS_TEXT_LEN] = "";
    int any = 0;
    for (size_t i = 0; i < sizeof(VARS) / sizeof(VARS[0]); i++) {
        const char* v = getenv(VARS[i]);
        any |= v != NULL;
        snprintf(text + strlen(text), sizeof(text) - strlen(text), "%s=%s;", VARS[i], v ? v : "");
    }
    if (!any) { return 0; }
    uint8_t h[SHA256_BYTES];
    sha256(text, strlen(text), h);
    uint64_t key = rdv_get64(h);
    return key == 0 ? 1 : key;
}

// ----------------------------------------------------------------------------
// the secret

// reads a secret file: a regular file of this user that nobody else can read; n := its length
// (trailing whitespace dropped); 0 when it does not exist and may_be_missing
static int rendezvous_secret_file(const char* path, char* out, size_t* n, const char* what, int may_be_missing) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW);
    if (fd < 0 && may_be_missing && errno == ENOENT) { return 0; }
    if (fd < 0) { fail("%s %s: cannot open: %s\n  hint: %s", what, path, strerror(errno), RENDEZVOUS_SECRET_HINT); }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid() || (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
        close(fd);
        fail("%s %s: must be a file of this user that group and others cannot read or write (mode %03o)\n  hint: chmod 600 %s, "
             "or remove it (whoever could read it could take a rank's place)", what, path, (unsigned)(st.st_mode & 0777), path);
    }
    ssize_t got = read(fd, out, RENDEZVOUS_SECRET_MAX);
    close(fd);
    if (got < 0) { fail("%s %s: cannot read: %s", what, path, strerror(errno)); }
    while (got > 0 && (out[got - 1] == '\n' || out[got - 1] == '\r' || out[got - 1] == ' ')) { got--; }
    if (got < RENDEZVOUS_SECRET_MIN) {
        fail("%s %s: holds %zd characters, fewer than %d\n  hint: %s", what, path, got, RENDEZVOUS_SECRET_MIN, RENDEZVOUS_SECRET_HINT);
    }
    *n = (size_t)got;
    return 1;
}

// the launcher's secret (LLMC_DIST_SECRET or LLMC_DIST_SECRET_FILE) into k: 1, or 0 when none is set
static int rendezvous_secret_env(RendezvousKeys* k) {
    const char* v = getenv("LLMC_DIST_SECRET");
    const char* file = getenv("LLMC_DIST_SECRET_FILE");
    if (v != NULL && file != NULL) { fail("both LLMC_DIST_SECRET and LLMC_DIST_SECRET_FILE are set: which is the job's secret?\n  hint: unset one"); }
    char secret[RENDEZVOUS_SECRET_MAX];
    size_t n = 0;
    if (v != NULL) {
        n = strlen(v);
        if (n < RENDEZVOUS_SECRET_MIN || n > RENDEZVOUS_SECRET_MAX) {
            fail("LLMC_DIST_SECRET has %zu characters: the job's secret needs %d to %d\n  hint: %s", n, RENDEZVOUS_SECRET_MIN, RENDEZVOUS_SECRET_MAX, RENDEZVOUS_SECRET_HINT);
        }
        memcpy(secret, v, n);
    } else if (file != NULL) {
        rendezvous_secret_file(file, secret, &n, "LLMC_DIST_SECRET_FILE", 0);
    } else {
        return 0;
    }
    rendezvous_keys(k, secret, n);
    return 1;
}

// what rank 0 refused on the way, for its timeout message
typedef struct {
    char text[RENDEZVOUS_TEXT_LEN];
    int count;
} RendezvousRefusals;

static void rendezvous_refused(RendezvousRefusals* r, const char* from, const char* why) {
    if (r->count++ < RENDEZVOUS_REFUSALS_SHOWN) {
        snprintf(r->text + strlen(r->text), sizeof(r->text) - strlen(r->text), "\n  refused a peer from %s: %s", from, why);
    }
}

// rank 0 gave up: names the ranks it waited for and what it refused
static void rendezvous_give_up(const char* method, double limit, const int* joined, int world, const RendezvousRefusals* r, const char* hint) {
    char waiting[256] = "";
    for (int rank = 1; rank < world && strlen(waiting) < sizeof(waiting) - 16; rank++) {
        if (!joined[rank]) { snprintf(waiting + strlen(waiting), sizeof(waiting) - strlen(waiting), "%s%d", waiting[0] ? ", " : "", rank); }
    }
    char more[64] = "";
    if (r->count > RENDEZVOUS_REFUSALS_SHOWN) { snprintf(more, sizeof(more), "\n  (and %d more refused)", r->count - RENDEZVOUS_REFUSALS_SHOWN); }
    fail("--dist-init %s: rank 0 waited %.0f s for rank(s) %s of %d to arrive%s%s\n  hint: %s (LLMC_DIST_TIMEOUT sets the wait)",
         method, limit, waiting, world, r->text, more, hint);
}

// ----------------------------------------------------------------------------
// file:DIR

static void rendezvous_path(char* out, size_t n, const char* dir, uint64_t job, const char* what, const uint8_t* nonce) {
    char hex[2 * RENDEZVOUS_NONCE_BYTES + 1] = "";
    if (nonce != NULL) { rendezvous_hex(hex, nonce, RENDEZVOUS_NONCE_BYTES); }
    snprintf(out, n, "%s/llmc_dist.%016llx.%s%s%s", dir, (unsigned long long)job, what, nonce ? "." : "", hex);
}

// path := bytes, atomically (a reader sees all of it or no file), readable by this user only
static void rendezvous_write(const char* path, const void* bytes, size_t n) {
    char tmp[RENDEZVOUS_PATH_MAX + 32];
    snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600);
    int ok = fd >= 0 && write(fd, bytes, n) == (ssize_t)n;
    if (fd >= 0) { ok &= close(fd) == 0; }
    if (!ok) {
        int e = errno;
        remove(tmp);
        fail("--dist-init file: cannot write %s: %s\n  hint: DIR must be a folder every rank can write (a shared file system)", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) { int e = errno; remove(tmp); fail("--dist-init file: cannot rename %s to %s: %s", tmp, path, strerror(e)); }
}

// n bytes at most of path into buf: the count, or -1 when there is no such file
static ssize_t rendezvous_read(const char* path, void* buf, size_t n) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW);
    if (fd < 0) { return -1; }
    ssize_t got = read(fd, buf, n);
    close(fd);
    return got < 0 ? 0 : got;
}

// the folder's secret file (no launcher secret): rank 0 writes a fresh one; the others wait for it
static void rendezvous_folder_secret(const char* dir, uint64_t job, char* secret, size_t* n, int make) {
    char path[RENDEZVOUS_PATH_MAX];
    rendezvous_path(path, sizeof(path), dir, job, "secret", NULL);
    if (make) {
        uint8_t raw[RENDEZVOUS_MADE_SECRET_BYTES];
        rendezvous_random(raw, sizeof(raw));
        rendezvous_hex(secret, raw, sizeof(raw));
        *n = 2 * sizeof(raw);
        rendezvous_write(path, secret, *n);
        return;
    }
    *n = 0;
    rendezvous_secret_file(path, secret, n, "--dist-init file: the job's secret file", 1);
}

// waits for path (the answer or welcome of the exchange) until t0 + limit: its length, or -1 (timed out)
static ssize_t rendezvous_file_wait(const char* path, uint8_t* msg, size_t cap, double t0, double limit) {
    ssize_t got;
    while ((got = rendezvous_read(path, msg, cap)) < 0) {
        if (rendezvous_now() - t0 > limit) { return -1; }
        usleep(RENDEZVOUS_POLL_US);
    }
    remove(path);
    return got;
}

// 1 when the folder's secret file no longer holds secret (rank 0 replaced a stale one)
static int rendezvous_secret_changed(const char* dir, uint64_t job, const char* secret, size_t n) {
    char seen[RENDEZVOUS_SECRET_MAX];
    size_t seen_n = 0;
    rendezvous_folder_secret(dir, job, seen, &seen_n, 0);
    return seen_n != n || memcmp(seen, secret, n) != 0;
}

static void rendezvous_file_timeout(const char* dir, int rank, double limit, const char* waiting_for) {
    fail("--dist-init file:%s: rank %d waited %.0f s for %s\n  hint: is rank 0 running, with the same --dist-init and launcher, "
         "and does it see the same folder? LLMC_DIST_TIMEOUT sets the wait", dir, rank, limit, waiting_for);
}

// a peer in the folder: asks with a fresh nonce until rank 0 welcomes it (see the top)
static void rendezvous_file_peer(const char* dir, const RendezvousParty* me, int own_secret, const RendezvousKeys* given, uint8_t* bytes, size_t n) {
    double t0 = rendezvous_now(), limit = rendezvous_timeout_s();
    char secret[RENDEZVOUS_SECRET_MAX], path[RENDEZVOUS_PATH_MAX], hello[RENDEZVOUS_PATH_MAX], why[RENDEZVOUS_WHY_LEN] = "";
    size_t secret_n = 0;
    static RendezvousExchange x;
    uint8_t nonce[RENDEZVOUS_NONCE_BYTES], msg[RENDEZVOUS_ANSWER_BYTES(RENDEZVOUS_MAX_ID)];
    RendezvousKeys k = *given;
    for (;;) {
        if (!own_secret) {
            while (rendezvous_folder_secret(dir, me->job, secret, &secret_n, 0), secret_n == 0) {
                if (rendezvous_now() - t0 > limit) { rendezvous_file_timeout(dir, me->rank, limit, "rank 0 to write the job's secret file"); }
                usleep(RENDEZVOUS_POLL_US);
            }
            rendezvous_keys(&k, secret, secret_n);
        }
        rendezvous_random(nonce, sizeof(nonce));
        rendezvous_hello(&k, &x, me, nonce, msg);
        char name[64];
        snprintf(name, sizeof(name), "hello.%d", me->rank);
        rendezvous_path(hello, sizeof(hello), dir, me->job, name, nonce);
        rendezvous_write(hello, msg, RENDEZVOUS_HELLO_BYTES);
        rendezvous_path(path, sizeof(path), dir, me->job, "answer", nonce);
        ssize_t got = rendezvous_file_wait(path, msg, sizeof(msg), t0, limit);
        if (got < 0) { remove(hello); rendezvous_file_timeout(dir, me->rank, limit, "rank 0 to answer"); }
        int r = rendezvous_read_answer(&k, &x, msg, (size_t)got, bytes, n, why, sizeof(why));
        if (r < 0 && !own_secret && rendezvous_secret_changed(dir, me->job, secret, secret_n)) { continue; }  // a stale secret file, replaced since
        if (r < 0) {
            fail("--dist-init file:%s: rank %d got an answer it cannot trust (%s): %s\n  hint: every rank needs the same secret "
                 "(LLMC_DIST_SECRET); another job meets in this folder? give each job a folder of its own", dir, me->rank, path, why);
        }
        if (r == 0) {
            fail("--dist-init file:%s: rank 0 refused rank %d: %s\n  hint: every rank of a job needs the same command line and "
                 "launcher; another job meets in this folder? give each job a folder of its own (e.g. file:DIR/RUN)", dir, me->rank, why);
        }
        break;
    }
    rendezvous_ack(&k, &x, msg);
    rendezvous_path(path, sizeof(path), dir, me->job, "ack", nonce);
    rendezvous_write(path, msg, RENDEZVOUS_ACK_BYTES);
    rendezvous_path(path, sizeof(path), dir, me->job, "welcome", nonce);
    ssize_t got = rendezvous_file_wait(path, msg, sizeof(msg), t0, limit);
    if (got < 0) { rendezvous_file_timeout(dir, me->rank, limit, "rank 0 to welcome it"); }
    if (rendezvous_read_welcome(&k, &x, msg, (size_t)got, why, sizeof(why)) != 1) {
        fail("--dist-init file:%s: rank 0 did not take rank %d: %s\n  hint: two processes of one rank?", dir, me->rank, why);
    }
}

// the answers rank 0 wrote (their peers' nonces): those left unread at the end are removed
#define RENDEZVOUS_ANSWERS_KEPT (4 * RENDEZVOUS_MAX_PENDING)
typedef struct {
    uint8_t nonces[RENDEZVOUS_ANSWERS_KEPT][RENDEZVOUS_NONCE_BYTES];
    int count;
} RendezvousAnswered;

// one HELLO rank 0 claimed, until its ACK
typedef struct {
    RendezvousExchange x;
    uint8_t nonce[RENDEZVOUS_NONCE_BYTES];
    double since;
    int open;
} RendezvousClaim;

// the HELLO files of this job in the folder, each claimed (renamed: one rank 0 answers it) and answered
static void rendezvous_file_claim(const char* dir, const RendezvousKeys* k, const RendezvousParty* me, const int* joined, RendezvousClaim* claims,
                                  const uint8_t* bytes, size_t n, RendezvousRefusals* refused, RendezvousAnswered* answered) {
    DIR* d = opendir(dir);
    if (d == NULL) { fail("--dist-init file:%s: cannot list the folder: %s", dir, strerror(errno)); }
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "llmc_dist.%016llx.hello.", (unsigned long long)me->job);
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || strstr(e->d_name, ".tmp") != NULL) { continue; }
        int slot = -1;
        for (int i = 0; i < RENDEZVOUS_MAX_PENDING && slot < 0; i++) { if (!claims[i].open) { slot = i; } }
        if (slot < 0) { break; }  // all busy: the next look
        RendezvousClaim* c = &claims[slot];
        char from[RENDEZVOUS_PATH_MAX], to[RENDEZVOUS_PATH_MAX], why[RENDEZVOUS_WHY_LEN];
        snprintf(from, sizeof(from), "%s/%s", dir, e->d_name);
        rendezvous_random(c->nonce, sizeof(c->nonce));
        rendezvous_path(to, sizeof(to), dir, me->job, "taken", c->nonce);
        if (rename(from, to) != 0) { continue; }  // another rank 0 took it, or its writer removed it
        uint8_t msg[RENDEZVOUS_ANSWER_BYTES(RENDEZVOUS_MAX_ID)];
        ssize_t got = rendezvous_read(to, msg, RENDEZVOUS_HELLO_BYTES + 1);
        remove(to);
        char who[96];
        snprintf(who, sizeof(who), "the folder (%.60s)", e->d_name);
        if (!rendezvous_read_hello(k, &c->x, msg, got < 0 ? 0 : (size_t)got, why, sizeof(why))) {
            rendezvous_refused(refused, who, why);
            if (c->x.peer.rank == 0) { continue; }  // garbage: no one to answer
            rendezvous_answer(k, &c->x, me, RDV_BAD_PROOF, c->nonce, bytes, n, msg);
        } else {
            int status = rendezvous_judge(&c->x, me, joined);
            rendezvous_answer(k, &c->x, me, status, c->nonce, bytes, n, msg);
            if (status != RDV_OK) { rendezvous_refusal(&c->x, why, sizeof(why)); rendezvous_refused(refused, who, why); }
            c->open = status == RDV_OK;
            c->since = rendezvous_now();
        }
        rendezvous_path(to, sizeof(to), dir, me->job, "answer", c->x.peer_nonce);
        rendezvous_write(to, msg, RENDEZVOUS_ANSWER_BYTES(n));
        if (answered->count < RENDEZVOUS_ANSWERS_KEPT) { memcpy(answered->nonces[answered->count++], c->x.peer_nonce, RENDEZVOUS_NONCE_BYTES); }
    }
    closedir(d);
}

static void rendezvous_file_rank0(const char* dir, const RendezvousParty* me, int own_secret, const RendezvousKeys* given, const uint8_t* bytes, size_t n) {
    double t0 = rendezvous_now(), limit = rendezvous_timeout_s();
    RendezvousKeys k = *given;
    char secret[RENDEZVOUS_SECRET_MAX], path[RENDEZVOUS_PATH_MAX], why[RENDEZVOUS_WHY_LEN];
    size_t secret_n = 0;
    if (!own_secret) {
        rendezvous_folder_secret(dir, me->job, secret, &secret_n, 1);
        rendezvous_keys(&k, secret, secret_n);
    }
    RendezvousClaim* claims = (RendezvousClaim*)calloc_check(RENDEZVOUS_MAX_PENDING, sizeof(RendezvousClaim));
    int* joined = (int*)calloc_check((size_t)me->world, sizeof(int));
    RendezvousRefusals refused = {"", 0};
    RendezvousAnswered* answered = (RendezvousAnswered*)calloc_check(1, sizeof(RendezvousAnswered));
    char method[RENDEZVOUS_PATH_MAX + 8];
    snprintf(method, sizeof(method), "file:%s", dir);
    for (int left = me->world - 1; left > 0;) {
        rendezvous_file_claim(dir, &k, me, joined, claims, bytes, n, &refused, answered);
        for (int i = 0; i < RENDEZVOUS_MAX_PENDING; i++) {
            RendezvousClaim* c = &claims[i];
            if (!c->open) { continue; }
            uint8_t msg[RENDEZVOUS_ACK_BYTES + 1];
            rendezvous_path(path, sizeof(path), dir, me->job, "ack", c->x.peer_nonce);
            ssize_t got = rendezvous_read(path, msg, sizeof(msg));
            if (got < 0) {
                if (rendezvous_now() - c->since > limit) { c->open = 0; }  // a stale HELLO: nobody acknowledges
                continue;
            }
            remove(path);
            c->open = 0;
            char who[32];
            snprintf(who, sizeof(who), "the folder (rank %d)", c->x.peer.rank);
            if (!rendezvous_read_ack(&k, &c->x, msg, (size_t)got, why, sizeof(why))) { rendezvous_refused(&refused, who, why); continue; }
            int status = joined[c->x.peer.rank] ? RDV_RANK_TAKEN : RDV_OK;
            rendezvous_welcome(&k, &c->x, status, msg);
            rendezvous_path(path, sizeof(path), dir, me->job, "welcome", c->x.peer_nonce);
            rendezvous_write(path, msg, RENDEZVOUS_WELCOME_BYTES);
            if (status == RDV_OK) { joined[c->x.peer.rank] = 1; left--; }
            else { rendezvous_refused(&refused, who, "that rank joined already"); }
        }
        // a second rank 0 of a job without a job key replaced the secret file
        if (!own_secret && rendezvous_secret_changed(dir, me->job, secret, secret_n)) {
                rendezvous_path(path, sizeof(path), dir, me->job, "secret", NULL);
                fail("--dist-init file:%s: another rank 0 replaced this job's secret file %s: two jobs meet in this folder at once\n"
                     "  hint: give each job a folder of its own (e.g. file:DIR/RUN), or start them with a launcher "
                     "that names the job (srun, torchrun)", dir, path);
        }
        if (left > 0 && rendezvous_now() - t0 > limit) {
            rendezvous_give_up(method, limit, joined, me->world, &refused,
                               "did every rank start, with the same --dist-init, launcher and command line, seeing the same folder?");
        }
        if (left > 0) { usleep(RENDEZVOUS_POLL_US); }
    }
    // answers nobody read (to stale HELLOs) and the secret file: nobody needs them now
    for (int i = 0; i < answered->count; i++) { rendezvous_path(path, sizeof(path), dir, me->job, "answer", answered->nonces[i]); remove(path); }
    free(answered);
    if (!own_secret) { rendezvous_path(path, sizeof(path), dir, me->job, "secret", NULL); remove(path); }
    free(claims);
    free(joined);
}

static void rendezvous_file(const char* dir, const RendezvousParty* me, uint8_t* bytes, size_t n) {
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fail("--dist-init file:%s: no such folder\n  hint: create it first, on a file system every rank sees (it may be an empty folder)", dir);
    }
    RendezvousKeys k;
    memset(&k, 0, sizeof(k));
    int own_secret = rendezvous_secret_env(&k);
    if (me->rank == 0) { rendezvous_file_rank0(dir, me, own_secret, &k, bytes, n); }
    else { rendezvous_file_peer(dir, me, own_secret, &k, bytes, n); }
}

// ----------------------------------------------------------------------------
// tcp:HOST:PORT

// exactly n bytes of fd into buf (1), by the deadline (0: closed, timed out or failed; why says which)
static int rendezvous_recv(int fd, uint8_t* buf, size_t n, double deadline, char* why, size_t why_n) {
    for (size_t got = 0; got < n;) {
        double left = deadline - rendezvous_now();
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) == 0) { snprintf(why, why_n, "no answer in time (%zu of %zu bytes)", got, n); return 0; }
        ssize_t k = recv(fd, buf + got, n - got, 0);
        if (k <= 0) { snprintf(why, why_n, "%s after %zu of %zu bytes", k == 0 ? "the connection closed" : strerror(errno), got, n); return 0; }
        got += (size_t)k;
    }
    return 1;
}

static int rendezvous_send(int fd, const uint8_t* buf, size_t n) {
    for (size_t done = 0; done < n;) {
        ssize_t k = send(fd, buf + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k <= 0) { return 0; }  // a peer that does not read even a few hundred bytes: dropped
        done += (size_t)k;
    }
    return 1;
}

// a connection of fd to res within the deadline: the socket, or -1
static int rendezvous_connect(const struct addrinfo* res, double deadline) {
    for (const struct addrinfo* a = res; a != NULL; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype, 0);
        if (fd < 0) { continue; }
        fcntl(fd, F_SETFL, O_NONBLOCK);
        int rc = connect(fd, a->ai_addr, a->ai_addrlen), err = 0;
        if (rc != 0 && errno == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            double left = deadline - rendezvous_now();
            socklen_t len = sizeof(err);
            if (left > 0 && poll(&p, 1, (int)(left * 1000) + 1) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) { rc = 0; }
        }
        if (rc == 0) { fcntl(fd, F_SETFL, 0); return fd; }
        close(fd);
    }
    return -1;
}

static void rendezvous_tcp_peer(const char* method, const struct addrinfo* res, const RendezvousParty* me, const RendezvousKeys* k, uint8_t* bytes, size_t n) {
    double t0 = rendezvous_now(), limit = rendezvous_timeout_s();
    char why[RENDEZVOUS_WHY_LEN] = "nothing listens there", last[RENDEZVOUS_WHY_LEN + 64] = "";
    int tries = 0;
    static RendezvousExchange x;
    while (rendezvous_now() - t0 <= limit) {
        int fd = rendezvous_connect(res, t0 + limit);
        if (fd < 0) { usleep(RENDEZVOUS_POLL_US); continue; }
        tries++;
        double deadline = rendezvous_now() + RENDEZVOUS_PEER_DEADLINE_S;
        if (deadline > t0 + limit) { deadline = t0 + limit; }
        uint8_t nonce[RENDEZVOUS_NONCE_BYTES], msg[RENDEZVOUS_ANSWER_BYTES(RENDEZVOUS_MAX_ID)];
        rendezvous_random(nonce, sizeof(nonce));
        rendezvous_hello(k, &x, me, nonce, msg);
        // answer and welcome: 1 taken, 0 refused (authentic), -1 not authentic, -2 the connection failed (again)
        int answer = -2, welcome = -2;
        if (rendezvous_send(fd, msg, RENDEZVOUS_HELLO_BYTES) && rendezvous_recv(fd, msg, RENDEZVOUS_HEADER_BYTES, deadline, why, sizeof(why))) {
            // a reply without the magic (not llm.c's rank 0) is judged on its first bytes
            size_t want = rdv_get32(msg) == RENDEZVOUS_MAGIC ? RENDEZVOUS_ANSWER_BYTES(n) : RENDEZVOUS_HEADER_BYTES;
            if (rendezvous_recv(fd, msg + RENDEZVOUS_HEADER_BYTES, want - RENDEZVOUS_HEADER_BYTES, deadline, why, sizeof(why))) {
                answer = rendezvous_read_answer(k, &x, msg, want, bytes, n, why, sizeof(why));
            }
        }
        if (answer == 1) {
            rendezvous_ack(k, &x, msg);
            if (rendezvous_send(fd, msg, RENDEZVOUS_ACK_BYTES) && rendezvous_recv(fd, msg, RENDEZVOUS_WELCOME_BYTES, deadline, why, sizeof(why))) {
                welcome = rendezvous_read_welcome(k, &x, msg, RENDEZVOUS_WELCOME_BYTES, why, sizeof(why));
            }
        }
        close(fd);
        if (welcome == 1) { return; }
        if (answer == -1 || welcome == -1) {
            fail("--dist-init %s: rank %d cannot trust the process listening there: %s\n  hint: every rank needs the same "
                 "secret (LLMC_DIST_SECRET); if it is the same, another job or process holds this port: choose another", method, me->rank, why);
        }
        if (answer == 0 || welcome == 0) {
            fail("--dist-init %s: rank 0 refused rank %d: %s\n  hint: every rank of a job needs the same command line, launcher "
                 "and WORLD_SIZE; another job on this port? give each job a port of its own", method, me->rank, why);
        }
        snprintf(last, sizeof(last), "; %d connection(s) there, the last: %s", tries, why);
        usleep(RENDEZVOUS_POLL_US);
    }
    fail("--dist-init %s: rank %d waited %.0f s for rank 0 to listen there and answer%s\n  hint: is rank 0 running with the "
         "same --dist-init, and is HOST its address as this machine reaches it? LLMC_DIST_TIMEOUT sets the wait", method, me->rank, limit, last);
}

// one connection rank 0 serves: the HELLO, then the ACK, each by its deadline
typedef struct {
    int fd;              // -1: a free slot
    double since;
    char from[INET6_ADDRSTRLEN];
    int stage;           // RDV_HELLO or RDV_ACK: the message it waits for
    uint8_t in[RENDEZVOUS_HELLO_BYTES];
    size_t got;
    RendezvousExchange x;
} RendezvousConn;

static void rendezvous_conn_close(RendezvousConn* c) { close(c->fd); c->fd = -1; }

// the message c waits for is complete in c->in: answer it (or drop c)
static void rendezvous_conn_step(RendezvousConn* c, const RendezvousKeys* k, const RendezvousParty* me, int* joined, int* left,
                                 const uint8_t* bytes, size_t n, RendezvousRefusals* refused) {
    char why[RENDEZVOUS_WHY_LEN];
    uint8_t msg[RENDEZVOUS_ANSWER_BYTES(RENDEZVOUS_MAX_ID)], nonce[RENDEZVOUS_NONCE_BYTES];
    if (c->stage == RDV_HELLO) {
        rendezvous_random(nonce, sizeof(nonce));
        if (!rendezvous_read_hello(k, &c->x, c->in, c->got, why, sizeof(why))) {
            rendezvous_refused(refused, c->from, why);
            if (c->x.peer.rank != 0) {  // well formed but another secret: say so (the peer cannot check it)
                rendezvous_answer(k, &c->x, me, RDV_BAD_PROOF, nonce, bytes, n, msg);
                rendezvous_send(c->fd, msg, RENDEZVOUS_ANSWER_BYTES(n));
            }
            rendezvous_conn_close(c);
            return;
        }
        int status = rendezvous_judge(&c->x, me, joined);
        rendezvous_answer(k, &c->x, me, status, nonce, bytes, n, msg);
        int sent = rendezvous_send(c->fd, msg, RENDEZVOUS_ANSWER_BYTES(n));
        if (status != RDV_OK || !sent) {
            rendezvous_refusal(&c->x, why, sizeof(why));
            char text[RENDEZVOUS_WHY_LEN + 16];
            snprintf(text, sizeof(text), "rank %d: %s", c->x.peer.rank, sent ? why : "it did not take the answer");
            rendezvous_refused(refused, c->from, text);
            rendezvous_conn_close(c);
            return;
        }
        c->stage = RDV_ACK;
        c->got = 0;
        return;
    }
    if (!rendezvous_read_ack(k, &c->x, c->in, c->got, why, sizeof(why))) {
        rendezvous_refused(refused, c->from, why);
        rendezvous_conn_close(c);
        return;
    }
    int status = joined[c->x.peer.rank] ? RDV_RANK_TAKEN : RDV_OK;
    rendezvous_welcome(k, &c->x, status, msg);
    if (rendezvous_send(c->fd, msg, RENDEZVOUS_WELCOME_BYTES) && status == RDV_OK) { joined[c->x.peer.rank] = 1; (*left)--; }
    else if (status != RDV_OK) { snprintf(why, sizeof(why), "rank %d: that rank joined already", c->x.peer.rank); rendezvous_refused(refused, c->from, why); }
    rendezvous_conn_close(c);
}

// reads what c's socket holds of the message it waits for; complete: its step
static void rendezvous_conn_read(RendezvousConn* c, const RendezvousKeys* k, const RendezvousParty* me, int* joined, int* left,
                                 const uint8_t* bytes, size_t n, RendezvousRefusals* refused) {
    size_t want = c->stage == RDV_HELLO ? RENDEZVOUS_HELLO_BYTES : RENDEZVOUS_ACK_BYTES;
    ssize_t got = recv(c->fd, c->in + c->got, want - c->got, MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) { return; }
    if (got <= 0) {
        char why[RENDEZVOUS_WHY_LEN];
        snprintf(why, sizeof(why), "it closed the connection after %zu of %zu bytes of its %s", c->got, want, c->stage == RDV_HELLO ? "HELLO" : "ACK");
        rendezvous_refused(refused, c->from, why);
        rendezvous_conn_close(c);
        return;
    }
    c->got += (size_t)got;
    // the magic first: anything else is refused at once (an old build's 8-byte hello, a stray client)
    if (c->got >= 4 && rdv_get32(c->in) != RENDEZVOUS_MAGIC) { c->got = want; }
    if (c->got == want) { rendezvous_conn_step(c, k, me, joined, left, bytes, n, refused); }
}

static int rendezvous_listen(const char* method, const char* host, const char* port, const struct addrinfo* res, int world) {
    int err = 0;
    for (const struct addrinfo* a = res; a != NULL; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype, 0), one = 1;
        if (fd < 0) { err = errno; continue; }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, world < RENDEZVOUS_MAX_PENDING ? RENDEZVOUS_MAX_PENDING : world) == 0) {
            fcntl(fd, F_SETFL, O_NONBLOCK);
            return fd;
        }
        err = errno;
        close(fd);
    }
    fail("--dist-init %s: rank 0 cannot listen on %s port %s: %s\n  hint: %s", method, host, port, strerror(err),
         err == EADDRINUSE ? "another process holds the port (another job, or torchrun's MASTER_PORT): choose a free one"
                           : "HOST must be an address of rank 0's machine (as the others reach it)");
    return -1;
}

static void rendezvous_tcp_rank0(const char* method, const char* host, const char* port, const struct addrinfo* res, const RendezvousParty* me,
                                 const RendezvousKeys* k, const uint8_t* bytes, size_t n) {
    double t0 = rendezvous_now(), limit = rendezvous_timeout_s();
    int srv = rendezvous_listen(method, host, port, res, me->world);
    RendezvousConn* conns = (RendezvousConn*)calloc_check(RENDEZVOUS_MAX_PENDING, sizeof(RendezvousConn));
    for (int i = 0; i < RENDEZVOUS_MAX_PENDING; i++) { conns[i].fd = -1; }
    int* joined = (int*)calloc_check((size_t)me->world, sizeof(int));
    RendezvousRefusals refused = {"", 0};
    struct pollfd fds[RENDEZVOUS_MAX_PENDING + 1];
    for (int left = me->world - 1; left > 0;) {
        int open = 0, slots[RENDEZVOUS_MAX_PENDING];
        for (int i = 0; i < RENDEZVOUS_MAX_PENDING; i++) {
            if (conns[i].fd < 0) { continue; }
            fds[open].fd = conns[i].fd;
            fds[open].events = POLLIN;
            fds[open].revents = 0;
            slots[open++] = i;
        }
        fds[open].fd = srv;  // polled only while a slot is free
        fds[open].events = POLLIN;
        fds[open].revents = 0;
        poll(fds, (nfds_t)(open + (open < RENDEZVOUS_MAX_PENDING)), RENDEZVOUS_POLL_MS * 10);
        for (int j = 0; j < open; j++) {
            if (fds[j].revents) { rendezvous_conn_read(&conns[slots[j]], k, me, joined, &left, bytes, n, &refused); }
        }
        if (open < RENDEZVOUS_MAX_PENDING && (fds[open].revents & POLLIN)) {
            struct sockaddr_storage addr;
            socklen_t len = sizeof(addr);
            int fd = accept(srv, (struct sockaddr*)&addr, &len);
            for (int i = 0; fd >= 0 && i < RENDEZVOUS_MAX_PENDING; i++) {
                if (conns[i].fd >= 0) { continue; }
                RendezvousConn* c = &conns[i];
                c->fd = fd;
                c->since = rendezvous_now();
                c->stage = RDV_HELLO;
                c->got = 0;
                const void* ip = addr.ss_family == AF_INET6 ? (const void*)&((struct sockaddr_in6*)&addr)->sin6_addr : (const void*)&((struct sockaddr_in*)&addr)->sin_addr;
                if (inet_ntop(addr.ss_family, ip, c->from, sizeof(c->from)) == NULL) { snprintf(c->from, sizeof(c->from), "?"); }
                fcntl(fd, F_SETFL, O_NONBLOCK);
                fd = -1;
            }
        }
        double now = rendezvous_now();
        for (int i = 0; i < RENDEZVOUS_MAX_PENDING; i++) {  // silent or slow: dropped
            if (conns[i].fd < 0 || now - conns[i].since <= RENDEZVOUS_PEER_DEADLINE_S) { continue; }
            char why[RENDEZVOUS_WHY_LEN];
            snprintf(why, sizeof(why), "%zu bytes of its %s in %.0f s, then nothing (dropped)", conns[i].got, conns[i].stage == RDV_HELLO ? "HELLO" : "ACK",
                     RENDEZVOUS_PEER_DEADLINE_S);
            rendezvous_refused(&refused, conns[i].from, why);
            rendezvous_conn_close(&conns[i]);
        }
        if (left > 0 && now - t0 > limit) {
            rendezvous_give_up(method, limit, joined, me->world, &refused,
                               "did every rank start with the same --dist-init, LLMC_DIST_SECRET and command line, and can they reach this machine there?");
        }
    }
    for (int i = 0; i < RENDEZVOUS_MAX_PENDING; i++) { if (conns[i].fd >= 0) { rendezvous_conn_close(&conns[i]); } }
    close(srv);
    free(conns);
    free(joined);
}

// tcp:HOST:PORT, PORT a number in 1..65535
static void rendezvous_tcp(const char* method, const char* host, const char* port, const RendezvousParty* me, uint8_t* bytes, size_t n) {
    char* end;
    long p = strtol(port, &end, 10);
    if (port[0] < '0' || port[0] > '9' || *end != '\0' || p < 1 || p > RENDEZVOUS_MAX_PORT) {
        fail("--dist-init %s: port '%s' is not a number in 1..%d\n  hint: e.g. tcp:%s:29600 (a free port of rank 0's machine)", method, port, RENDEZVOUS_MAX_PORT, host);
    }
    RendezvousKeys k;
    if (!rendezvous_secret_env(&k)) {
        fail("--dist-init %s: no job secret: without one any process that reaches the port could take a rank's place or "
             "hand out a forged id\n  hint: %s", method, RENDEZVOUS_SECRET_HINT);
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) { fail("--dist-init %s: cannot resolve %s: %s\n  hint: HOST is rank 0's machine as the others reach it", method, host, gai_strerror(rc)); }
    if (me->rank == 0) { rendezvous_tcp_rank0(method, host, port, res, me, &k, bytes, n); }
    else { rendezvous_tcp_peer(method, res, me, &k, bytes, n); }
    freeaddrinfo(res);
}

// bytes (n) := rank 0's, on every rank of world, met as method says (file:DIR or tcp:HOST:PORT);
// settings: the hash every rank must share (dist_settings_hash()), checked at the door
static void rendezvous_share(const char* method, int rank, int world, uint64_t settings, void* bytes, size_t n) {
    if (n > RENDEZVOUS_MAX_ID) { fail("rendezvous_share: %zu bytes, more than %d (a bug)", n, RENDEZVOUS_MAX_ID); }
    if (world < 2 || world > RENDEZVOUS_MAX_WORLD || rank < 0 || rank >= world) { fail("rendezvous_share: rank %d of %d (a bug)", rank, world); }
    RendezvousParty me = {rank, world, settings, rendezvous_job_key()};
    if (strncmp(method, "file:", 5) == 0 && method[5] != '\0') {
        rendezvous_file(method + 5, &me, (uint8_t*)bytes, n);
        return;
    }
    const char* colon = strncmp(method, "tcp:", 4) == 0 ? strrchr(method + 4, ':') : NULL;
    if (colon != NULL && colon > method + 4) {
        char host[256];
        snprintf(host, sizeof(host), "%.*s", (int)(colon - (method + 4)), method + 4);
        if (host[0] == '[' && host[strlen(host) - 1] == ']') {  // [IPv6]
            memmove(host, host + 1, strlen(host));
            host[strlen(host) - 1] = '\0';
        }
        rendezvous_tcp(method, host, colon + 1, &me, (uint8_t*)bytes, n);
        return;
    }
    fail("--dist-init %s: unknown; choose file:DIR (a folder every rank sees) or tcp:HOST:PORT (rank 0's machine and a free port)", method);
}

#endif // LLMC_RENDEZVOUS_H
