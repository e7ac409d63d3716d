/*
rand.h: a small seeded random number generator (xorshift64*), uniform and normal
draws. Deterministic across machines: the whole state is one uint64 that the
training-state file saves, so a resumed run draws the same numbers.

    uint64_t rng = RNG_SEED_MIX ^ seed;
    float u = rand_uniform(&rng);          // [0, 1)
    float z = rand_normal(&rng);           // N(0, 1), Box-Muller
*/
#ifndef LLMC_RAND_H
#define LLMC_RAND_H

#include <math.h>
#include <stdint.h>

#define RNG_SEED_MIX 0x9E3779B97F4A7C15ULL  // golden-ratio constant: spreads small seeds
#define TWO_PI 6.283185307179586

static uint32_t rand_u32(uint64_t* state) {
    // xorshift64* (Vigna); the state must never be 0
    if (*state == 0) { *state = RNG_SEED_MIX; }
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1DULL) >> 32);
}

// uniform in [0, 1) with 24 random bits
static float rand_uniform(uint64_t* state) {
    return (rand_u32(state) >> 8) / 16777216.0f;
}

// standard normal (Box-Muller, in double for accuracy in the tails)
static float rand_normal(uint64_t* state) {
    double u1 = ((rand_u32(state) >> 8) + 1.0) / 16777217.0;  // (0, 1]: log is finite
    double u2 = (rand_u32(state) >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(TWO_PI * u2));
}

#endif // LLMC_RAND_H
