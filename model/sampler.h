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
    // Penalties on tokens seen in the last `last_n` tokens of the context (-1: all of it),
    // applied to the logits before anything else (greedy included), with the usual definitions:
    //   repeat (CTRL, as transformers): a seen token's logit l becomes l / r if l > 0, else l * r
    //   presence, frequency (OpenAI): l -= presence * [count > 0] + frequency * count
    float repeat, presence, frequency; // 1, 0, 0: off
    int last_n;
    int *count;        // (n_valid) scratch, all zero between calls
} Sampler;

int sampler_init(Sampler *s, int n_valid, float temperature, int top_k, float top_p, float min_p, uint64_t seed);
void sampler_free(Sampler *s);
// Turns the penalties on (0, or -1 when out of memory).
int sampler_set_penalties(Sampler *s, float repeat, float presence, float frequency, int last_n);
// Applies the penalties to logits given the context so far, hist[0..n_hist).
void sampler_penalize(Sampler *s, float *logits, const int *hist, int n_hist);
// Picks the next id from logits (n_valid entries are read; they are overwritten).
int sampler_sample(Sampler *s, float *logits);
int argmax(const float *x, int n);

#endif
