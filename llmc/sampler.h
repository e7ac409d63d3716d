/*
sampler.h: the next token from the model's probabilities over the vocabulary. Greedy (temperature
0): the most likely token. Otherwise a draw from the k most likely tokens (top-k; 0 = all), each
probability raised to the power 1/temperature and the k renormalised: a temperature below 1
sharpens the distribution, above 1 flattens it, 1 leaves it as the model says.

    Sampler s = sampler_create(V, 0.8f, 40);                  // temperature 0.8, top-k 40
    int next = sampler_next(&s, probs, rand_uniform(&rng));  // probs (V), a coin in [0, 1)
    sampler_free(&s);

A draw takes one uniform coin, so a seeded RNG (rand.h) draws the same tokens on every machine.
Ties go to the lower id: greedy takes the first largest probability, and top-k keeps, among equal
probabilities, the lower ids; so top-k 1 is greedy at any temperature.
Failure: none (the caller checks temperature >= 0 and top-k >= 0; a top-k above V is all of them).
*/
#ifndef LLMC_SAMPLER_H
#define LLMC_SAMPLER_H

#include <math.h>
#include <stdlib.h>
#include "utils.h"

// the first index of the largest of probs (n)
static int sample_argmax(const float* probs, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (probs[i] > probs[best]) { best = i; }
    }
    return best;
}

// draws an index from probs (n) given a uniform coin in [0, 1) (temperature 1, every token)
static int sample_index(const float* probs, int n, float coin) {
    float cdf = 0.0f;
    for (int i = 0; i < n; i++) {
        cdf += probs[i];
        if (coin < cdf) { return i; }
    }
    return n - 1;  // rounding
}

typedef struct { float prob; int id; } SampleCandidate;

typedef struct {
    int vocab_size;
    float temperature;             // 0 = greedy
    int top_k;                     // the k most likely tokens; 0 (or >= vocab_size) = all
    SampleCandidate* candidates;   // (vocab_size) scratch: the tokens, most likely first when cut to k
} Sampler;

static Sampler sampler_create(int vocab_size, float temperature, int top_k) {
    Sampler s;
    s.vocab_size = vocab_size;
    s.temperature = temperature;
    s.top_k = top_k > 0 && top_k < vocab_size ? top_k : 0;
    s.candidates = (SampleCandidate*)malloc_check((size_t)vocab_size * sizeof(SampleCandidate));
    return s;
}

static void sampler_free(Sampler* s) {
    free(s->candidates);
    s->candidates = NULL;
}

// qsort order: the more likely first; of equal probabilities, the lower id
static int sample_candidate_order(const void* a, const void* b) {
    const SampleCandidate* x = (const SampleCandidate*)a;
    const SampleCandidate* y = (const SampleCandidate*)b;
    if (x->prob != y->prob) { return x->prob > y->prob ? -1 : 1; }
    return (x->id > y->id) - (x->id < y->id);
}

// the next token given probs (vocab_size) and a uniform coin in [0, 1)
static int sampler_next(Sampler* s, const float* probs, float coin) {
    int V = s->vocab_size;
    if (s->temperature == 0.0f) { return sample_argmax(probs, V); }
    if (s->top_k == 0 && s->temperature == 1.0f) { return sample_index(probs, V, coin); }  // as the training samples
    // the candidates: every token in id order, or the top_k most likely, most likely first
    int k = s->top_k > 0 ? s->top_k : V;
    for (int i = 0; i < V; i++) { s->candidates[i].prob = probs[i]; s->candidates[i].id = i; }
    if (k < V) { qsort(s->candidates, V, sizeof(SampleCandidate), sample_candidate_order); }
    // weights (p / p_max)^(1/temperature): the largest is 1, so no power underflows them all
    float p_max = probs[sample_argmax(probs, V)];
    double total = 0.0;
    for (int i = 0; i < k; i++) {
        float p = s->candidates[i].prob;
        s->candidates[i].prob = s->temperature == 1.0f ? p : powf(p / p_max, 1.0f / s->temperature);
        total += s->candidates[i].prob;
    }
    double target = coin * total, cdf = 0.0;
    for (int i = 0; i < k; i++) {
        cdf += s->candidates[i].prob;
        if (target < cdf) { return s->candidates[i].id; }
    }
    return s->candidates[k - 1].id;  // rounding
}

#endif // LLMC_SAMPLER_H
