/*
rendezvous_peer.c: llmc/rendezvous.h alone, without the trainer, for tests/test_rendezvous.py: one rank of
a rendezvous that hands over a 128-byte id (NCCL's size), in milliseconds.

    build/rendezvous_peer METHOD RANK WORLD [SETTINGS]   # rank 0 makes a random id; every rank prints "id HEX"
    build/rendezvous_peer --hmac KEYHEX MSGHEX           # prints "sha256 HEX" of MSG and "hmac HEX" of KEY, MSG

The job's secret, timeout and job key come from the environment, as in the trainer (LLMC_DIST_SECRET,
LLMC_DIST_TIMEOUT, SLURM_JOB_ID, ...). SETTINGS stands for dist_settings_hash() (hex, default 0).
*/
#include "llmc/rendezvous.h"

#define PEER_ID_BYTES 128   // sizeof(ncclUniqueId)

static void print_hex(const char* what, const uint8_t* b, size_t n) {
    char hex[2 * RENDEZVOUS_MAX_ID + 1];
    rendezvous_hex(hex, b, n);
    printf("%s %s\n", what, hex);
}

// hex into bytes: the count
static size_t from_hex(const char* hex, uint8_t* out, size_t cap) {
    size_t n = strlen(hex) / 2;
    if (strlen(hex) % 2 != 0 || n > cap) { fail("'%.40s': not hex of at most %zu bytes", hex, cap); }
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) { fail("'%.40s': not hex", hex); }
        out[i] = (uint8_t)v;
    }
    return n;
}

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && strcmp(argv[1], "--hmac") == 0) {
        static uint8_t key[1 << 16], msg[1 << 16];
        size_t kn = from_hex(argv[2], key, sizeof(key)), mn = from_hex(argv[3], msg, sizeof(msg));
        uint8_t out[SHA256_BYTES];
        sha256(msg, mn, out);
        print_hex("sha256", out, sizeof(out));
        hmac_sha256(key, kn, msg, mn, out);
        print_hex("hmac", out, sizeof(out));
        return 0;
    }
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s METHOD RANK WORLD [SETTINGS] | --hmac KEYHEX MSGHEX\n", argv[0]);
        return 2;
    }
    int rank = atoi(argv[2]), world = atoi(argv[3]);
    uint64_t settings = argc == 5 ? strtoull(argv[4], NULL, 16) : 0;
    uint8_t id[PEER_ID_BYTES] = {0};
    if (rank == 0) { rendezvous_random(id, sizeof(id)); }
    rendezvous_share(argv[1], rank, world, settings, id, sizeof(id));
    print_hex("id", id, sizeof(id));
    return 0;
}
