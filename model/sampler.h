// Next-token sampling: greedy, or temperature → top-k → top-p → min-p as transformers orders them.
//
// The definition both the CPU (sampler.c) and the GPU (kernels/sample.cu) implement, so that one
// uniform u picks the same id on either:
//   rank order: logit descending, then id ascending; every filter keeps a prefix of it, the first
//     s = min(s_k, s_p, s_m) >= 1 tokens;
//   m = the largest logit, p_i = exp((l_i - m) / T) by softmax_exp (attention/softmax_exp.h,
//     within 2 ulp of expf; the GPU evaluates the same operations, so its p are the same bits),
//     P_i = p_i * 2^40 rounded to the nearest integer (uint64: integer sums are exact, so every
//     summation order gives the same totals);
//   top-k: s_k = k if 0 < k < n, else n; Z_K = the sum of P over those s_k;
//   top-p (< 1): s_p = the smallest s whose prefix sum of P is >= top_p * Z_K (compared in double);
//   min-p (> 0): s_m = the number of tokens with p_i >= min_p (at least 1);
//   draw: Z = the sum of P over the kept set, r = floor(u * Z) (at most Z - 1); the kept tokens in
//     ascending id order, the first whose running sum of P exceeds r.
// T <= 0 is greedy: the largest logit, the lowest id among equals.
#ifndef SAMPLER_H
#define SAMPLER_H

#include <stdint.h>

typedef struct Sampler {
    int n_valid;       // ids >= n_valid (vocabulary padding) are never sampled
    float temperature; // 0: greedy
    int top_k;         // 0: off
    float top_p;       // 1: off
    float min_p;       // 0: off
    uint64_t rng;
    // scratch sized at init: p and the bin of (m - l) / T per token, a list of ids, a histogram
    float *prob;
    uint16_t *bin;
    int *list;
    uint32_t *bin_count;
    uint64_t *bin_mass;
    uint64_t *blk_mass; // P sums per block of tokens (all, and those reaching min-p)
    uint64_t *keys;     // candidates' rank keys or ids (top-k, min-p)
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
// The same penalties as a list, for the GPU sampler: the distinct ids seen in the window (in order
// of first appearance) and how often each was seen. Returns how many (0 when penalties are off).
// ids and counts need room for min(window, n_valid) entries.
int sampler_penalty_list(Sampler *s, const int *hist, int n_hist, int *ids, int *counts);
// The next uniform in [0, 1) of the sampler's stream (what sampler_sample draws with).
float sampler_uniform(Sampler *s);
// The id the definition above picks from logits (n_valid entries, left unchanged) for the
// uniform u in [0, 1). A non-finite logit is not sampled: returns -1 - (its index), the first one.
int sampler_pick(const Sampler *s, float *logits, double u);
// sampler_pick with the next uniform of the stream (greedy draws none).
int sampler_sample(Sampler *s, float *logits);
int argmax(const float *x, int n);

#endif
