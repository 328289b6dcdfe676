// Sampling. The filters run in transformers' order so the same settings mean the same thing.
#include "sampler.h"

#include <math.h>
#include <stdlib.h>

int sampler_init(Sampler *s, int n_valid, float temperature, int top_k, float top_p, float min_p, uint64_t seed) {
    s->n_valid = n_valid;
    s->temperature = temperature;
    s->top_k = top_k;
    s->top_p = top_p;
    s->min_p = min_p;
    s->rng = seed ? seed : 0x9E3779B97F4A7C15ull;
    s->repeat = 1.0f, s->presence = 0.0f, s->frequency = 0.0f, s->last_n = 0, s->count = NULL;
    s->cand = malloc((size_t)n_valid * sizeof(ProbId));
    return s->cand ? 0 : -1;
}

void sampler_free(Sampler *s) {
    free(s->cand);
    free(s->count);
    s->cand = NULL, s->count = NULL;
}

int sampler_set_penalties(Sampler *s, float repeat, float presence, float frequency, int last_n) {
    s->repeat = repeat, s->presence = presence, s->frequency = frequency, s->last_n = last_n;
    if (repeat == 1.0f && presence == 0.0f && frequency == 0.0f) return 0;
    if (!s->count) s->count = calloc((size_t)s->n_valid, sizeof(int));
    return s->count ? 0 : -1;
}

void sampler_penalize(Sampler *s, float *logits, const int *hist, int n_hist) {
    if (!s->count || s->last_n == 0) return;
    int from = s->last_n < 0 || s->last_n >= n_hist ? 0 : n_hist - s->last_n;
    for (int i = from; i < n_hist; i++)
        if (hist[i] >= 0 && hist[i] < s->n_valid) s->count[hist[i]]++;
    for (int i = from; i < n_hist; i++) { // each distinct token once: its count is cleared after
        int id = hist[i];
        if (id < 0 || id >= s->n_valid || s->count[id] == 0) continue;
        float l = logits[id];
        if (s->repeat != 1.0f) l = l > 0.0f ? l / s->repeat : l * s->repeat;
        logits[id] = l - s->presence - s->frequency * (float)s->count[id];
        s->count[id] = 0;
    }
}

int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// xorshift64*: a uniform float in [0, 1).
static float uniform(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (float)((*state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

static int by_prob_desc(const void *a, const void *b) {
    float pa = ((const ProbId *)a)->prob, pb = ((const ProbId *)b)->prob;
    return pa < pb ? 1 : pa > pb ? -1 : ((const ProbId *)a)->id - ((const ProbId *)b)->id;
}

int sampler_sample(Sampler *s, float *logits) {
    int n = s->n_valid;
    if (s->temperature <= 0.0f) return argmax(logits, n);
    // Softmax of logits / temperature.
    float mx = logits[argmax(logits, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        logits[i] = expf((logits[i] - mx) / s->temperature);
        sum += logits[i];
    }
    // Candidates: tokens that can survive the filters. With top-p alone, a token below
    // (1 - top_p) / (n - 1) can never be in the nucleus, which keeps the sort short.
    float cutoff = 0.0f;
    if (s->top_k <= 0 && s->top_p < 1.0f && n > 1) cutoff = (float)((1.0f - s->top_p) / (n - 1) * sum);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] >= cutoff) s->cand[m].prob = logits[i], s->cand[m].id = i, m++;
    qsort(s->cand, (size_t)m, sizeof(ProbId), by_prob_desc);
    if (s->top_k > 0 && s->top_k < m) m = s->top_k;
    // top-p over what is left, renormalized (transformers applies it to the top-k-masked logits).
    double kept = 0.0;
    for (int i = 0; i < m; i++) kept += s->cand[i].prob;
    if (s->top_p < 1.0f) {
        double cum = 0.0;
        for (int i = 0; i < m; i++) {
            cum += s->cand[i].prob / kept;
            if (cum >= s->top_p) {
                m = i + 1;
                break;
            }
        }
    }
    // min-p: drop tokens below min_p times the most likely one.
    if (s->min_p > 0.0f) {
        float floor_p = s->min_p * s->cand[0].prob;
        int k = 1;
        while (k < m && s->cand[k].prob >= floor_p) k++;
        m = k;
    }
    double total = 0.0;
    for (int i = 0; i < m; i++) total += s->cand[i].prob;
    double r = (double)uniform(&s->rng) * total, cum = 0.0;
    for (int i = 0; i < m; i++) {
        cum += s->cand[i].prob;
        if (r < cum) return s->cand[i].id;
    }
    return s->cand[m - 1].id;
}
