/*
rendezvous_proto.h: the messages of the rendezvous (llmc/rendezvous.h), as pure functions over byte
buffers: built, parsed and checked here, carried by a socket or a file there (and read from a file by
the fuzzer, tests/fuzz.c). Every rank knows the job's secret; a peer (rank r > 0) asks rank 0 for
NCCL's id, and the four messages of one exchange are:

    HELLO    peer -> 0   rank, world size, settings hash, job key, the peer's fresh nonce;     MAC
    ANSWER   0 -> peer   a status, rank 0's world size, settings hash and job key, rank 0's fresh
                         nonce, the id encrypted (zeros unless the status is OK);               MAC
    ACK      peer -> 0   the rank again;                                                        MAC
    WELCOME  0 -> peer   a status: joined, or the rank was taken meanwhile;                     MAC

Every MAC is HMAC-SHA256 under a key made from the secret, over every byte of the exchange before it
(the earlier messages whole, this one up to its MAC) after a label naming the message, so:
  - only a holder of the secret makes a HELLO rank 0 answers with the id, or an ANSWER a peer takes;
  - the ANSWER covers the peer's fresh nonce: a recorded answer (of a forged or a dead rank 0) fails;
  - the ACK covers rank 0's fresh nonce: a recorded HELLO replayed gets an answer it cannot read
    (the id is encrypted with a keystream made from the secret and both nonces) and never takes a
    place, which only a valid ACK does (the WELCOME then says so, or that the rank was taken);
  - a refusal (another world size, job or settings hash, a rank taken) is authenticated too, so the
    peer stops naming it; an unverifiable ANSWER (status BAD_PROOF: rank 0 could not check the HELLO's
    MAC, or a forgery) tells the peer only that the two sides do not share the secret.
Integers are little-endian. Sizes: HELLO 84 bytes, ANSWER 88 + the id's bytes, ACK and WELCOME 48.
*/
#ifndef LLMC_RENDEZVOUS_PROTO_H
#define LLMC_RENDEZVOUS_PROTO_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "hmac_sha256.h"

#define RENDEZVOUS_MAGIC 0x6c6c6d63u   // "llmc": a message that is not one of ours is refused
#define RENDEZVOUS_VERSION 2            // 1: the unauthenticated rank + id of before
#define RENDEZVOUS_NONCE_BYTES 16
#define RENDEZVOUS_MAX_WORLD (1 << 20)  // a HELLO saying more is garbage
#define RENDEZVOUS_MAX_ID 1024          // bytes a rendezvous hands over (NCCL's id: 128)
#define RENDEZVOUS_HEADER_BYTES 12      // magic, version, kind
#define RENDEZVOUS_HELLO_BYTES (RENDEZVOUS_HEADER_BYTES + 4 + 4 + 8 + 8 + RENDEZVOUS_NONCE_BYTES + SHA256_BYTES)
#define RENDEZVOUS_ANSWER_BYTES(id_bytes) (RENDEZVOUS_HEADER_BYTES + 4 + 4 + 8 + 8 + RENDEZVOUS_NONCE_BYTES + 4 + (id_bytes) + SHA256_BYTES)
#define RENDEZVOUS_ACK_BYTES (RENDEZVOUS_HEADER_BYTES + 4 + SHA256_BYTES)
#define RENDEZVOUS_WELCOME_BYTES (RENDEZVOUS_HEADER_BYTES + 4 + SHA256_BYTES)
#define RENDEZVOUS_TRANSCRIPT_MAX (RENDEZVOUS_HELLO_BYTES + RENDEZVOUS_ANSWER_BYTES(RENDEZVOUS_MAX_ID) + RENDEZVOUS_ACK_BYTES + RENDEZVOUS_WELCOME_BYTES)
#define RENDEZVOUS_WHY_LEN 200          // a refusal's reason

typedef enum { RDV_HELLO = 1, RDV_ANSWER = 2, RDV_ACK = 3, RDV_WELCOME = 4 } RendezvousKind;
static const char* const RENDEZVOUS_LABELS[] = {"", "llmc rendezvous hello", "llmc rendezvous answer", "llmc rendezvous ack", "llmc rendezvous welcome"};

typedef enum {
    RDV_OK = 0,
    RDV_BAD_PROOF = 1,       // the HELLO's MAC is wrong: another secret (the ANSWER's MAC then fails as well)
    RDV_WRONG_WORLD = 2,
    RDV_WRONG_JOB = 3,
    RDV_WRONG_SETTINGS = 4,
    RDV_RANK_TAKEN = 5,      // another process of that rank joined first
    RDV_NUM_STATUS
} RendezvousStatus;

// the keys made from the job's secret: one for the MACs, one for the id's keystream
typedef struct {
    uint8_t mac[SHA256_BYTES];
    uint8_t stream[SHA256_BYTES];
} RendezvousKeys;

// what one side says of itself
typedef struct {
    int rank, world;
    uint64_t settings;   // dist_settings_hash(): the settings every rank must share
    uint64_t job;        // the launcher's job (rendezvous_job_key), 0 when none says
} RendezvousParty;

// one exchange: every byte so far, which the next MAC covers
typedef struct {
    uint8_t bytes[RENDEZVOUS_TRANSCRIPT_MAX];
    size_t len;
    RendezvousParty peer;                       // what the HELLO said
    uint8_t peer_nonce[RENDEZVOUS_NONCE_BYTES];
    uint8_t rank0_nonce[RENDEZVOUS_NONCE_BYTES];
    RendezvousParty rank0;                      // what the ANSWER said
    int status;                                 // the ANSWER's
} RendezvousExchange;

static void rendezvous_keys(RendezvousKeys* k, const char* secret, size_t n) {
    static const char MAC_LABEL[] = "llmc rendezvous mac key", STREAM_LABEL[] = "llmc rendezvous stream key";
    hmac_sha256(secret, n, MAC_LABEL, sizeof(MAC_LABEL) - 1, k->mac);
    hmac_sha256(secret, n, STREAM_LABEL, sizeof(STREAM_LABEL) - 1, k->stream);
}

// ----------------------------------------------------------------------------
// little-endian fields

static void rdv_put32(uint8_t* p, uint32_t v) { for (int i = 0; i < 4; i++) { p[i] = (uint8_t)(v >> (8 * i)); } }
static void rdv_put64(uint8_t* p, uint64_t v) { for (int i = 0; i < 8; i++) { p[i] = (uint8_t)(v >> (8 * i)); } }
static uint32_t rdv_get32(const uint8_t* p) { uint32_t v = 0; for (int i = 0; i < 4; i++) { v |= (uint32_t)p[i] << (8 * i); } return v; }
static uint64_t rdv_get64(const uint8_t* p) { uint64_t v = 0; for (int i = 0; i < 8; i++) { v |= (uint64_t)p[i] << (8 * i); } return v; }

static size_t rdv_header(uint8_t* p, RendezvousKind kind) {
    rdv_put32(p, RENDEZVOUS_MAGIC);
    rdv_put32(p + 4, RENDEZVOUS_VERSION);
    rdv_put32(p + 8, (uint32_t)kind);
    return RENDEZVOUS_HEADER_BYTES;
}

// 1 when msg (n bytes) is a message of this kind and size; else why
static int rdv_header_ok(const uint8_t* msg, size_t n, RendezvousKind kind, size_t want, char* why, size_t why_n) {
    if (n < RENDEZVOUS_HEADER_BYTES || rdv_get32(msg) != RENDEZVOUS_MAGIC) {
        snprintf(why, why_n, "not a rendezvous message (%zu bytes without the magic)", n);
        return 0;
    }
    if (rdv_get32(msg + 4) != RENDEZVOUS_VERSION) {
        snprintf(why, why_n, "protocol version %u, this program speaks %d (another build of llm.c?)", rdv_get32(msg + 4), RENDEZVOUS_VERSION);
        return 0;
    }
    if (rdv_get32(msg + 8) != (uint32_t)kind || n != want) {
        snprintf(why, why_n, "message of kind %u and %zu bytes where a %s of %zu bytes belongs", rdv_get32(msg + 8), n, RENDEZVOUS_LABELS[kind] + 16, want);
        return 0;
    }
    return 1;
}

// the MAC of a message of this kind: over the transcript so far and the message's first n bytes
static void rdv_mac(const RendezvousKeys* k, const RendezvousExchange* x, RendezvousKind kind, const uint8_t* msg, size_t n, uint8_t out[SHA256_BYTES]) {
    uint8_t buf[64 + RENDEZVOUS_TRANSCRIPT_MAX];
    size_t label = strlen(RENDEZVOUS_LABELS[kind]);
    memcpy(buf, RENDEZVOUS_LABELS[kind], label);
    memcpy(buf + label, x->bytes, x->len);
    memcpy(buf + label + x->len, msg, n);
    hmac_sha256(k->mac, sizeof(k->mac), buf, label + x->len + n, out);
}

// seals msg (n bytes, its MAC the last SHA256_BYTES) and appends it to the transcript
static void rdv_seal(const RendezvousKeys* k, RendezvousExchange* x, RendezvousKind kind, uint8_t* msg, size_t n) {
    rdv_mac(k, x, kind, msg, n - SHA256_BYTES, msg + n - SHA256_BYTES);
    memcpy(x->bytes + x->len, msg, n);
    x->len += n;
}

// 1 when msg's MAC is right (then appended to the transcript)
static int rdv_unseal(const RendezvousKeys* k, RendezvousExchange* x, RendezvousKind kind, const uint8_t* msg, size_t n) {
    uint8_t mac[SHA256_BYTES];
    rdv_mac(k, x, kind, msg, n - SHA256_BYTES, mac);
    if (!hmac_sha256_equal(mac, msg + n - SHA256_BYTES)) { return 0; }
    memcpy(x->bytes + x->len, msg, n);
    x->len += n;
    return 1;
}

// id ^= the keystream of this exchange: HMAC(stream key, both nonces, block number), block after block
static void rdv_crypt(const RendezvousKeys* k, const RendezvousExchange* x, uint8_t* id, size_t n) {
    uint8_t in[2 * RENDEZVOUS_NONCE_BYTES + 4], block[SHA256_BYTES];
    memcpy(in, x->peer_nonce, RENDEZVOUS_NONCE_BYTES);
    memcpy(in + RENDEZVOUS_NONCE_BYTES, x->rank0_nonce, RENDEZVOUS_NONCE_BYTES);
    for (size_t at = 0; at < n; at += SHA256_BYTES) {
        rdv_put32(in + 2 * RENDEZVOUS_NONCE_BYTES, (uint32_t)(at / SHA256_BYTES));
        hmac_sha256(k->stream, sizeof(k->stream), in, sizeof(in), block);
        for (size_t i = 0; i < SHA256_BYTES && at + i < n; i++) { id[at + i] ^= block[i]; }
    }
}

// ----------------------------------------------------------------------------
// the peer's side

// msg := the HELLO of a new exchange x (RENDEZVOUS_HELLO_BYTES)
static void rendezvous_hello(const RendezvousKeys* k, RendezvousExchange* x, const RendezvousParty* me, const uint8_t nonce[RENDEZVOUS_NONCE_BYTES], uint8_t* msg) {
    memset(x, 0, sizeof(*x));
    x->peer = *me;
    memcpy(x->peer_nonce, nonce, RENDEZVOUS_NONCE_BYTES);
    size_t at = rdv_header(msg, RDV_HELLO);
    rdv_put32(msg + at, (uint32_t)me->rank);
    rdv_put32(msg + at + 4, (uint32_t)me->world);
    rdv_put64(msg + at + 8, me->settings);
    rdv_put64(msg + at + 16, me->job);
    memcpy(msg + at + 24, nonce, RENDEZVOUS_NONCE_BYTES);
    rdv_seal(k, x, RDV_HELLO, msg, RENDEZVOUS_HELLO_BYTES);
}

// what a refusal says, read the same on both sides: rank 0's value, then the peer's
static void rendezvous_refusal(const RendezvousExchange* x, char* why, size_t why_n) {
    const RendezvousParty *a = &x->rank0, *b = &x->peer;
    int r = b->rank;
    switch (x->status) {
        case RDV_WRONG_WORLD: snprintf(why, why_n, "world size: rank 0's %d, rank %d's %d", a->world, r, b->world); break;
        case RDV_WRONG_JOB: snprintf(why, why_n, "another job: rank 0's job key %016llx, rank %d's %016llx (SLURM_JOB_ID, SLURM_STEP_ID, "
                                     "TORCHELASTIC_RUN_ID)", (unsigned long long)a->job, r, (unsigned long long)b->job); break;
        case RDV_WRONG_SETTINGS: snprintf(why, why_n, "other settings: rank 0's settings hash %016llx, rank %d's %016llx",
                                          (unsigned long long)a->settings, r, (unsigned long long)b->settings); break;
        case RDV_RANK_TAKEN: snprintf(why, why_n, "rank %d was taken by another process first", r); break;
        default: snprintf(why, why_n, "status %d", x->status);
    }
}

// reads rank 0's ANSWER to x's HELLO: 1 and id (id_bytes) filled when it is authentic and OK;
// 0 with x->status the refusal (why says it) when authentic; -1 when not authentic (why says why)
static int rendezvous_read_answer(const RendezvousKeys* k, RendezvousExchange* x, const uint8_t* msg, size_t n, uint8_t* id, size_t id_bytes,
                                  char* why, size_t why_n) {
    if (!rdv_header_ok(msg, n, RDV_ANSWER, RENDEZVOUS_ANSWER_BYTES(id_bytes), why, why_n)) { return -1; }
    size_t at = RENDEZVOUS_HEADER_BYTES;
    uint32_t status = rdv_get32(msg + at);
    if (!rdv_unseal(k, x, RDV_ANSWER, msg, n)) {
        snprintf(why, why_n, "its MAC is wrong: it does not know this job's secret%s", status == RDV_BAD_PROOF ? " (and it says ours was wrong)" : "");
        return -1;
    }
    x->status = status < RDV_NUM_STATUS ? (int)status : RDV_NUM_STATUS;
    x->rank0.rank = 0;
    x->rank0.world = (int)rdv_get32(msg + at + 4);
    x->rank0.settings = rdv_get64(msg + at + 8);
    x->rank0.job = rdv_get64(msg + at + 16);
    memcpy(x->rank0_nonce, msg + at + 24, RENDEZVOUS_NONCE_BYTES);
    if (rdv_get32(msg + at + 24 + RENDEZVOUS_NONCE_BYTES) != id_bytes) {
        snprintf(why, why_n, "it hands over %u bytes where this rank wants %zu (another build?)", rdv_get32(msg + at + 24 + RENDEZVOUS_NONCE_BYTES), id_bytes);
        return -1;
    }
    if (x->status != RDV_OK) {
        rendezvous_refusal(x, why, why_n);
        return 0;
    }
    memcpy(id, msg + at + 28 + RENDEZVOUS_NONCE_BYTES, id_bytes);
    rdv_crypt(k, x, id, id_bytes);
    return 1;
}

// msg := the ACK of x (RENDEZVOUS_ACK_BYTES)
static void rendezvous_ack(const RendezvousKeys* k, RendezvousExchange* x, uint8_t* msg) {
    size_t at = rdv_header(msg, RDV_ACK);
    rdv_put32(msg + at, (uint32_t)x->peer.rank);
    rdv_seal(k, x, RDV_ACK, msg, RENDEZVOUS_ACK_BYTES);
}

// 1: joined; 0: refused (why); -1: not authentic (why)
static int rendezvous_read_welcome(const RendezvousKeys* k, RendezvousExchange* x, const uint8_t* msg, size_t n, char* why, size_t why_n) {
    if (!rdv_header_ok(msg, n, RDV_WELCOME, RENDEZVOUS_WELCOME_BYTES, why, why_n)) { return -1; }
    if (!rdv_unseal(k, x, RDV_WELCOME, msg, n)) { snprintf(why, why_n, "its MAC is wrong"); return -1; }
    uint32_t status = rdv_get32(msg + RENDEZVOUS_HEADER_BYTES);
    x->status = status < RDV_NUM_STATUS ? (int)status : RDV_NUM_STATUS;
    if (x->status == RDV_OK) { return 1; }
    rendezvous_refusal(x, why, why_n);
    return 0;
}

// ----------------------------------------------------------------------------
// rank 0's side

// reads a HELLO into a new exchange x: 1 when it is well formed (x->peer, x->peer_nonce set) and its MAC
// right; 0 when it is not (why says why: garbage, a rank outside 1..world-1, another secret). A rank
// outside [1, world) is refused before anything is indexed by it
static int rendezvous_read_hello(const RendezvousKeys* k, RendezvousExchange* x, const uint8_t* msg, size_t n, char* why, size_t why_n) {
    memset(x, 0, sizeof(*x));
    if (!rdv_header_ok(msg, n, RDV_HELLO, RENDEZVOUS_HELLO_BYTES, why, why_n)) { return 0; }
    size_t at = RENDEZVOUS_HEADER_BYTES;
    uint32_t rank = rdv_get32(msg + at), world = rdv_get32(msg + at + 4);
    if (world < 2 || world > RENDEZVOUS_MAX_WORLD || rank < 1 || rank >= world) {
        snprintf(why, why_n, "rank %u of world size %u: not a rank that asks (1..world-1 of 2..%d)", rank, world, RENDEZVOUS_MAX_WORLD);
        return 0;
    }
    x->peer.rank = (int)rank;
    x->peer.world = (int)world;
    x->peer.settings = rdv_get64(msg + at + 8);
    x->peer.job = rdv_get64(msg + at + 16);
    memcpy(x->peer_nonce, msg + at + 24, RENDEZVOUS_NONCE_BYTES);
    if (!rdv_unseal(k, x, RDV_HELLO, msg, n)) {
        snprintf(why, why_n, "rank %u: wrong secret (its HELLO's MAC fails: LLMC_DIST_SECRET differs)", rank);
        return 0;
    }
    return 1;
}

// what rank 0 answers a HELLO read into x: OK, or the first thing that differs (taken[]: of me->world)
static int rendezvous_judge(const RendezvousExchange* x, const RendezvousParty* me, const int* taken) {
    if (x->peer.world != me->world) { return RDV_WRONG_WORLD; }
    if (x->peer.job != me->job) { return RDV_WRONG_JOB; }
    if (x->peer.settings != me->settings) { return RDV_WRONG_SETTINGS; }
    return taken[x->peer.rank] ? RDV_RANK_TAKEN : RDV_OK;
}

// msg := the ANSWER (RENDEZVOUS_ANSWER_BYTES(id_bytes)) to x's HELLO: status, and the id when OK. For
// BAD_PROOF x holds no HELLO (its MAC failed): the peer cannot check the answer, as it should not
static void rendezvous_answer(const RendezvousKeys* k, RendezvousExchange* x, const RendezvousParty* me, int status,
                              const uint8_t nonce[RENDEZVOUS_NONCE_BYTES], const uint8_t* id, size_t id_bytes, uint8_t* msg) {
    x->status = status;
    x->rank0 = *me;
    memcpy(x->rank0_nonce, nonce, RENDEZVOUS_NONCE_BYTES);
    size_t at = rdv_header(msg, RDV_ANSWER);
    rdv_put32(msg + at, (uint32_t)status);
    rdv_put32(msg + at + 4, (uint32_t)me->world);
    rdv_put64(msg + at + 8, me->settings);
    rdv_put64(msg + at + 16, me->job);
    memcpy(msg + at + 24, nonce, RENDEZVOUS_NONCE_BYTES);
    rdv_put32(msg + at + 24 + RENDEZVOUS_NONCE_BYTES, (uint32_t)id_bytes);
    uint8_t* sealed = msg + at + 28 + RENDEZVOUS_NONCE_BYTES;
    memset(sealed, 0, id_bytes);
    if (status == RDV_OK) {
        memcpy(sealed, id, id_bytes);
        rdv_crypt(k, x, sealed, id_bytes);
    }
    rdv_seal(k, x, RDV_ANSWER, msg, RENDEZVOUS_ANSWER_BYTES(id_bytes));
}

// 1 when msg is x's peer's authentic ACK
static int rendezvous_read_ack(const RendezvousKeys* k, RendezvousExchange* x, const uint8_t* msg, size_t n, char* why, size_t why_n) {
    if (!rdv_header_ok(msg, n, RDV_ACK, RENDEZVOUS_ACK_BYTES, why, why_n)) { return 0; }
    if (rdv_get32(msg + RENDEZVOUS_HEADER_BYTES) != (uint32_t)x->peer.rank || !rdv_unseal(k, x, RDV_ACK, msg, n)) {
        snprintf(why, why_n, "rank %d: its ACK's MAC fails (a HELLO replayed by someone without the secret?)", x->peer.rank);
        return 0;
    }
    return 1;
}

// msg := the WELCOME (RENDEZVOUS_WELCOME_BYTES): OK, or RANK_TAKEN
static void rendezvous_welcome(const RendezvousKeys* k, RendezvousExchange* x, int status, uint8_t* msg) {
    size_t at = rdv_header(msg, RDV_WELCOME);
    rdv_put32(msg + at, (uint32_t)status);
    rdv_seal(k, x, RDV_WELCOME, msg, RENDEZVOUS_WELCOME_BYTES);
}

#endif // LLMC_RENDEZVOUS_PROTO_H
