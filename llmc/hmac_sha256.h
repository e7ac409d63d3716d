/*
hmac_sha256.h: SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), small and dependency-free, for the
rendezvous's message authentication (llmc/rendezvous.h). Not constant-time beyond the MAC compare
(hmac_sha256_equal): it hashes a few hundred bytes of a job's secret once per peer, not a server's keys.

    uint8_t digest[SHA256_BYTES], mac[SHA256_BYTES];
    sha256(msg, msg_len, digest);
    hmac_sha256(key, key_len, msg, msg_len, mac);
    if (!hmac_sha256_equal(mac, received)) { ... }   // compares every byte, whatever differs first

Checked against Python's hashlib and hmac (tests/test_rendezvous.py, through build/rendezvous_peer --hmac).
*/
#ifndef LLMC_HMAC_SHA256_H
#define LLMC_HMAC_SHA256_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SHA256_BYTES 32        // a digest
#define SHA256_BLOCK_BYTES 64  // what the compression function takes at a time
#define SHA256_LENGTH_BYTES 8  // the message length in bits, at the end of the padding
#define HMAC_IPAD 0x36
#define HMAC_OPAD 0x5c

typedef struct {
    uint32_t h[8];                         // the running hash
    uint8_t block[SHA256_BLOCK_BYTES];     // bytes not yet compressed
    size_t used;                           // of block
    uint64_t total;                        // bytes taken so far
} Sha256;

// FIPS 180-4 section 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64 primes
static const uint32_t SHA256_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};
// section 5.3.3: the first 32 bits of the fractional parts of the square roots of the first 8 primes
static const uint32_t SHA256_H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

static uint32_t sha256_rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// section 6.2.2: one 64-byte block into the running hash
static void sha256_compress(uint32_t h[8], const uint8_t* p) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++) { w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3]; }
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = sha256_rotr(w[t - 15], 7) ^ sha256_rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = sha256_rotr(w[t - 2], 17) ^ sha256_rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = hh + (sha256_rotr(e, 6) ^ sha256_rotr(e, 11) ^ sha256_rotr(e, 25)) + ((e & f) ^ (~e & g)) + SHA256_K[t] + w[t];
        uint32_t t2 = (sha256_rotr(a, 2) ^ sha256_rotr(a, 13) ^ sha256_rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

static void sha256_init(Sha256* s) {
    memcpy(s->h, SHA256_H0, sizeof(s->h));
    s->used = 0;
    s->total = 0;
}

static void sha256_update(Sha256* s, const void* data, size_t n) {
    const uint8_t* p = (const uint8_t*)data;
    s->total += n;
    while (n > 0) {
        size_t take = SHA256_BLOCK_BYTES - s->used < n ? SHA256_BLOCK_BYTES - s->used : n;
        memcpy(s->block + s->used, p, take);
        s->used += take;
        p += take;
        n -= take;
        if (s->used == SHA256_BLOCK_BYTES) { sha256_compress(s->h, s->block); s->used = 0; }
    }
}

// section 5.1.1: a 1 bit, zeros up to 8 bytes short of a block, the length in bits (big-endian)
static void sha256_final(Sha256* s, uint8_t out[SHA256_BYTES]) {
    uint64_t bits = s->total * 8;
    uint8_t pad = 0x80, zero = 0, len[SHA256_LENGTH_BYTES];
    sha256_update(s, &pad, 1);
    while (s->used != SHA256_BLOCK_BYTES - SHA256_LENGTH_BYTES) { sha256_update(s, &zero, 1); }
    for (int i = 0; i < SHA256_LENGTH_BYTES; i++) { len[i] = (uint8_t)(bits >> (56 - 8 * i)); }
    sha256_update(s, len, sizeof(len));
    for (int i = 0; i < 8; i++) {
        for (int j = 0; j < 4; j++) { out[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j)); }
    }
}

static void sha256(const void* data, size_t n, uint8_t out[SHA256_BYTES]) {
    Sha256 s;
    sha256_init(&s);
    sha256_update(&s, data, n);
    sha256_final(&s, out);
}

// RFC 2104: H((K ^ opad) || H((K ^ ipad) || msg)), a key longer than a block hashed first
static void hmac_sha256(const void* key, size_t key_len, const void* msg, size_t msg_len, uint8_t out[SHA256_BYTES]) {
    uint8_t k[SHA256_BLOCK_BYTES] = {0}, pad[SHA256_BLOCK_BYTES], inner[SHA256_BYTES];
    if (key_len > SHA256_BLOCK_BYTES) { sha256(key, key_len, k); }
    else if (key_len > 0) { memcpy(k, key, key_len); }
    Sha256 s;
    for (int i = 0; i < SHA256_BLOCK_BYTES; i++) { pad[i] = k[i] ^ HMAC_IPAD; }
    sha256_init(&s);
    sha256_update(&s, pad, sizeof(pad));
    sha256_update(&s, msg, msg_len);
    sha256_final(&s, inner);
    for (int i = 0; i < SHA256_BLOCK_BYTES; i++) { pad[i] = k[i] ^ HMAC_OPAD; }
    sha256_init(&s);
    sha256_update(&s, pad, sizeof(pad));
    sha256_update(&s, inner, sizeof(inner));
    sha256_final(&s, out);
}

// 1 when the two MACs are equal; looks at every byte, so the time does not say where they differ
static int hmac_sha256_equal(const uint8_t a[SHA256_BYTES], const uint8_t b[SHA256_BYTES]) {
    uint8_t diff = 0;
    for (int i = 0; i < SHA256_BYTES; i++) { diff |= (uint8_t)(a[i] ^ b[i]); }
    return diff == 0;
}

#endif // LLMC_HMAC_SHA256_H
