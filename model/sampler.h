// Next-token sampling: greedy, or temperature → top-k → top-p → min-p as transformers orders them.
#ifndef SAMPLER_H
#define SAMPLER_H

#include <stdint.h>

typedef struct {
    float prob;
    int id;
} ProbId;

typedef struct {
    int n_valid;       // ids >= n_valid (vocabulary padding) are never sampled
    float temperature; // 0: greedy
    int top_k;         // 0: off
    float top_p;       // 1: off
    float min_p;       // 0: off
    uint64_t rng;
    ProbId *cand;      // (n_valid) scratch
} Sampler;

int sampler_init(Sampler *s, int n_valid, float temperature, int top_k, float top_p, float min_p, uint64_t seed);
void sampler_free(Sampler *s);
// Picks the next id from logits (n_valid entries are read; they are overwritten).
int sampler_sample(Sampler *s, float *logits);
int argmax(const float *x, int n);

#endif
