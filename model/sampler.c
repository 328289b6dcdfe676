// Sampling. The filters run in transformers' order so the same settings mean the same thing;
// sampler.h gives the definition, which kernels/sample.cu implements too.
//
// No sort of the vocabulary: a pass for the max, a vectorized pass for p, the sum of P and the
// min-p count, then (top-k or top-p only) a histogram of x = (m - l) / T in 4096 bins of 1/128
// (x is monotone in the logit, so a bin's tokens all rank before the next bin's) to find the bin
// holding a filter's boundary, and a radix select on the logit's key over that bin's members
// alone. The draw walks the kept tokens in id order.
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF // p must be the GPU's bits (gcc's ISO C mode contracts nothing anyway)
#else
// Lets gcc vectorize softmax_exp's selects (with trapping math it keeps them as branches: the
// loop ran scalar, 1.1 ms at 152K tokens instead of 0.17). No operation or rounding changes.
#pragma GCC optimize("no-trapping-math")
#endif
#include "../attention/softmax_exp.h"

#define NBIN 4096
#define XMAX 32.0f // past it e^-x < 2^-41, so P = 0: one overflow bin (NBIN) holds those tokens

int sampler_init(Sampler *s, int n_valid, float temperature, int top_k, float top_p, float min_p, uint64_t seed) {
    s->n_valid = n_valid;
    s->temperature = temperature;
    s->top_k = top_k;
    s->top_p = top_p;
    s->min_p = min_p;
    s->rng = seed ? seed : 0x9E3779B97F4A7C15ull;
    s->repeat = 1.0f, s->presence = 0.0f, s->frequency = 0.0f, s->last_n = 0, s->count = NULL;
    s->prob = malloc((size_t)n_valid * sizeof(float));
    s->bin = malloc((size_t)n_valid * sizeof(uint16_t));
    s->list = malloc((size_t)n_valid * sizeof(int));
    s->bin_count = malloc((NBIN + 1) * sizeof(uint32_t));
    s->bin_mass = malloc((NBIN + 1) * sizeof(uint64_t));
    if (s->prob && s->bin && s->list && s->bin_count && s->bin_mass) return 0;
    sampler_free(s);
    return -1;
}

void sampler_free(Sampler *s) {
    free(s->prob), free(s->bin), free(s->list), free(s->bin_count), free(s->bin_mass), free(s->count);
    s->prob = NULL, s->bin = NULL, s->list = NULL, s->bin_count = NULL, s->bin_mass = NULL, s->count = NULL;
}

static int penalties_on(const Sampler *s) {
    return s->count && s->last_n != 0 && (s->repeat != 1.0f || s->presence != 0.0f || s->frequency != 0.0f);
}

int sampler_set_penalties(Sampler *s, float repeat, float presence, float frequency, int last_n) {
    s->repeat = repeat, s->presence = presence, s->frequency = frequency, s->last_n = last_n;
    if (repeat == 1.0f && presence == 0.0f && frequency == 0.0f) return 0;
    if (!s->count) s->count = calloc((size_t)s->n_valid, sizeof(int));
    return s->count ? 0 : -1;
}

// Counts the window's valid ids into s->count; returns where the window starts.
static int count_window(Sampler *s, const int *hist, int n_hist) {
    int from = s->last_n < 0 || s->last_n >= n_hist ? 0 : n_hist - s->last_n;
    for (int i = from; i < n_hist; i++)
        if (hist[i] >= 0 && hist[i] < s->n_valid) s->count[hist[i]]++;
    return from;
}

void sampler_penalize(Sampler *s, float *logits, const int *hist, int n_hist) {
    if (!penalties_on(s)) return;
    int from = count_window(s, hist, n_hist);
    for (int i = from; i < n_hist; i++) { // each distinct token once: its count is cleared after
        int id = hist[i];
        if (id < 0 || id >= s->n_valid || s->count[id] == 0) continue;
        float l = logits[id];
        if (s->repeat != 1.0f) l = l > 0.0f ? l / s->repeat : l * s->repeat;
        logits[id] = l - s->presence - s->frequency * (float)s->count[id];
        s->count[id] = 0;
    }
}

int sampler_penalty_list(Sampler *s, const int *hist, int n_hist, int *ids, int *counts) {
    if (!penalties_on(s)) return 0;
    int from = count_window(s, hist, n_hist), k = 0;
    for (int i = from; i < n_hist; i++) {
        int id = hist[i];
        if (id < 0 || id >= s->n_valid || s->count[id] == 0) continue;
        ids[k] = id, counts[k] = s->count[id], k++;
        s->count[id] = 0;
    }
    return k;
}

int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// xorshift64*: a uniform float in [0, 1).
float sampler_uniform(Sampler *s) {
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (float)((s->rng * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

// A float's order as an unsigned integer (larger float, larger key; -0 counts as +0).
static inline uint32_t order_key(float f) {
    f += 0.0f;
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

// P = p * 2^40 rounded to nearest (even on ties): adding 2^52 to the exact double product rounds
// it to an integer, which the low bits then hold. Written so the pass over p vectorizes.
static inline uint64_t fixed40(float p) {
    double t = (double)p * 0x1p40 + 0x1p52;
    uint64_t b;
    memcpy(&b, &t, sizeof b);
    return b - 0x4330000000000000ull;
}

// The first s tokens in rank order: the last one (key, id) and the sum of their P.
typedef struct {
    int s;
    uint32_t key;
    int id;
    uint64_t mass;
} Cut;

// The prefix of rank order that a target ends: by count (the first `count` tokens) when by_mass
// is 0, else the shortest whose P sum, in double, is >= mass. The histogram is filled.
static Cut select_prefix(const Sampler *s, const float *logits, int by_mass, int count, double mass) {
    const int n = s->n_valid;
    // the bin holding the boundary
    int b = 0;
    long c0 = 0;
    uint64_t m0 = 0;
    for (;; b++) {
        if (b == NBIN || (by_mass ? (double)(m0 + s->bin_mass[b]) >= mass : c0 + (long)s->bin_count[b] >= count)) break;
        c0 += s->bin_count[b], m0 += s->bin_mass[b];
    }
    // its members in id order, then the radix select on the key, 8 bits at a time from the top
    int *list = s->list, k = 0;
    for (int i = 0; i < n; i++)
        if (s->bin[i] == b) list[k++] = i;
    for (int shift = 24; shift >= 0 && k > 1; shift -= 8) {
        uint32_t dc[256] = {0};
        uint64_t dm[256] = {0};
        for (int j = 0; j < k; j++) {
            int d = order_key(logits[list[j]]) >> shift & 255;
            dc[d]++, dm[d] += fixed40(s->prob[list[j]]);
        }
        int d = 255;
        for (;; d--) { // larger keys rank first
            if (d == 0 || (by_mass ? (double)(m0 + dm[d]) >= mass : c0 + (long)dc[d] >= count)) break;
            c0 += dc[d], m0 += dm[d];
        }
        int kk = 0;
        for (int j = 0; j < k; j++)
            if ((int)(order_key(logits[list[j]]) >> shift & 255) == d) list[kk++] = list[j];
        k = kk;
    }
    // equal keys: in id order
    Cut c = {0, 0, 0, 0};
    for (int j = 0; j < k; j++) {
        c0++, m0 += fixed40(s->prob[list[j]]);
        if (j == k - 1 || (by_mass ? (double)m0 >= mass : c0 >= count)) {
            c.s = (int)c0, c.key = order_key(logits[list[j]]), c.id = list[j], c.mass = m0;
            break;
        }
    }
    return c;
}

int sampler_pick(const Sampler *s, float *logits, double u) {
    const int n = s->n_valid;
    const float t = s->temperature;
    // the max (as the largest key: a float max reduction does not vectorize), and no NaN or infinity
    uint32_t kmax = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &logits[i], sizeof b);
        bad |= (b & 0x7f800000u) == 0x7f800000u;
        uint32_t k = b & 0x80000000u ? ~b : b | 0x80000000u;
        kmax = k > kmax ? k : kmax;
    }
    if (bad)
        for (int i = 0; i < n; i++)
            if (!isfinite(logits[i])) return -1 - i;
    uint32_t mb = kmax & 0x80000000u ? kmax & 0x7fffffffu : ~kmax;
    float m;
    memcpy(&m, &mb, sizeof m);
    if (t <= 0.0f) { // the lowest id holding the max (-0 and +0 are equal)
        int i = 0;
        while (logits[i] != m) i++;
        return i;
    }
    // p, the sum of P, the min-p count
    float *prob = s->prob;
    const float min_p = s->min_p;
    uint64_t z = 0, z_min = 0;
    int n_min = 0;
    uint16_t *bin = s->bin;
#pragma omp simd // lane by lane the same IEEE operations: the same p
    for (int i = 0; i < n; i++) {
        float x = (logits[i] - m) / t; // -x = (m - l) / T exactly
        prob[i] = softmax_exp(x);
        // NBIN / XMAX = 128: -x * 128 is exact and < NBIN; past XMAX the overflow bin NBIN
        bin[i] = (uint16_t)(-x < XMAX ? (int)(-x * (NBIN / XMAX)) : NBIN);
    }
#pragma omp simd reduction(+ : z, z_min, n_min) // apart: together they ran twice as long
    for (int i = 0; i < n; i++) {
        uint64_t P = fixed40(prob[i]);
        z += P;
        z_min += prob[i] >= min_p ? P : 0;
        n_min += prob[i] >= min_p;
    }
    int s_k = s->top_k > 0 && s->top_k < n ? s->top_k : n;
    int s_m = s->min_p > 0.0f ? (n_min > 0 ? n_min : 1) : n;
    // min-p's kept set is {p >= min_p} itself (p falls along rank order): no select for it;
    // past 1 no p reaches it, and the one best token (p = 1) is kept
    Cut cut = {n, 0, 0, z};
    int by_p = 0;
    if (s_m < n) cut.s = s_m, cut.mass = z_min, by_p = 1;
    if (min_p > 0.0f && n_min == 0) {
        int best = 0;
        while (logits[best] != m) best++;
        cut.s = 1, cut.key = order_key(m), cut.id = best, cut.mass = fixed40(1.0f), by_p = 0;
    }
    if (s_k < n || s->top_p < 1.0f) {
        memset(s->bin_count, 0, (NBIN + 1) * sizeof(uint32_t));
        memset(s->bin_mass, 0, (NBIN + 1) * sizeof(uint64_t));
        int in_range = 0;
        for (int i = 0; i < n; i++)
            if (bin[i] < NBIN) s->bin_count[bin[i]]++, s->bin_mass[bin[i]] += fixed40(prob[i]), in_range++;
        s->bin_count[NBIN] = (uint32_t)(n - in_range); // their P are 0
        Cut k = {n, 0, 0, z};
        if (s_k < n) k = select_prefix(s, logits, 0, s_k, 0);
        if (s->top_p < 1.0f) {
            double target = (double)s->top_p * (double)k.mass; // Z_K
            Cut p = target > 0 ? select_prefix(s, logits, 1, 0, target) : select_prefix(s, logits, 0, 1, 0);
            if (p.s < k.s) k = p;
        }
        if (k.s < cut.s) cut = k, by_p = 0;
    }
    // the draw, in id order over the kept tokens
    uint64_t r = (uint64_t)(u * (double)cut.mass), cum = 0;
    if (r >= cut.mass) r = cut.mass - 1;
    if (cut.s == n) {
        for (int i = 0; i < n; i++)
            if ((cum += fixed40(prob[i])) > r) return i;
    } else if (by_p) {
        for (int i = 0; i < n; i++)
            if (prob[i] >= min_p && (cum += fixed40(prob[i])) > r) return i;
    } else {
        int cb = bin[cut.id]; // earlier bins are kept, later ones not, this one by key and id
        for (int i = 0; i < n; i++) {
            int in = bin[i] < cb;
            if (bin[i] == cb) {
                uint32_t k = order_key(logits[i]);
                in = k > cut.key || (k == cut.key && i <= cut.id);
            }
            if (in && (cum += fixed40(prob[i])) > r) return i;
        }
    }
    return cut.id; // not reached: the kept P sum to cut.mass > r
}

int sampler_sample(Sampler *s, float *logits) {
    if (s->temperature <= 0.0f) return sampler_pick(s, logits, 0.0);
    return sampler_pick(s, logits, sampler_uniform(s));
}
