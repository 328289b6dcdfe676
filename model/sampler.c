// Sampling. The filters run in transformers' order so the same settings mean the same thing;
// sampler.h gives the definition, which kernels/sample.cu implements too.
//
// No sort of the vocabulary, and as few passes over it as each setting allows (152K tokens: the
// exp is most of the time, so it runs on the tokens that can matter where a filter bounds them):
//   a pass for the max and the min (and no NaN or infinity), then
//   top-k <= KMAX: a threshold filter over the logits finds the k (p for those alone), top-p and
//     min-p then within them;
//   min-p without top-k: a logit bound (with a margin over the roundings) collects min-p's
//     candidates; p for those alone when few (a sum pass for Z when top-p is on too);
//   else the general path: a vectorized pass for p and the sums of P by blocks of BLK (the draw
//     skips whole blocks; the min tells when exp may leave out softmax_exp's clamps, and when P
//     may be summed as p); top-p alone then takes the few heaviest tokens exactly (the head,
//     which that pass lists) and, when its cut lies past them, estimates the cut from a sample that
//     pass takes and confirms it in a band of tokens (top_p_band: a pass that sums P above the
//     band and lists the band's tokens without a branch, then a radix select over the band); what
//     remains (top-k > KMAX, a failed estimate) takes a histogram of x = (m - l) / T in 4096 bins of
//     1/128 (x is monotone in the logit, so a bin's tokens all rank before the next bin's) to find
//     the bin holding a filter's boundary, and a radix select over that bin's members alone.
// The passes over every token (the max, p and its block sums, top-p's band, the draw's block sums
// at a cut) run as pool tasks over ranges of blocks at large n; their integer sums make any split
// exact.
// The draw walks the kept tokens in id order. Every path gives the same kept set and P (the tests
// compare the whole u -> id map with a sort-based reference). Over 500 lines: the paths share the
// P arithmetic, the rank keys and the radix select, and are one definition's implementation.
#include "sampler.h"
#include "pool.h"

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
#ifdef __AVX2__
#include <immintrin.h>
#endif

// Eight lanes as GCC/Clang vector extensions (AVX2 here, two SSE halves under x86-64-v2).
#pragma GCC diagnostic ignored "-Wpsabi" // they pass only between this file's inline functions
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));
#define V8(c) ((v8){c, c, c, c, c, c, c, c})
#define AI static inline __attribute__((always_inline))

AI v8 ld8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}
// (Macros, not functions, where an argument is 32 bytes: passing one by value draws gcc's -Wpsabi
// note in builds without AVX, which no pragma silences.)
#define any8(m) ({ v8i any8_m_ = (m); any8_(&any8_m_); }) // some lane set
AI int any8_(const v8i *m) {
    uint64_t w[4];
    memcpy(w, m, sizeof w);
    return (w[0] | w[1] | w[2] | w[3]) != 0;
}
#define sel8(m, a, b) ((v8)(((v8i)(a) & (m)) | ((v8i)(b) & ~(m))))
#define lo4(v) __builtin_shufflevector((v), (v), 0, 1, 2, 3)
#define hi4(v) __builtin_shufflevector((v), (v), 4, 5, 6, 7)

// Comparisons of eight lanes: without AVX, gcc lowers a 32-byte comparison lane by lane, so there
// it is two of four lanes.
#ifdef __AVX__
#define CMP8(a, op, b) ((v8i)((a)op(b)))
#else
AI v8i cmp8_join(v4i a, v4i b) { return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7); }
#define CMP8(a, op, b) cmp8_join(lo4(a) op lo4(b), hi4(a) op hi4(b))
#endif

// softmax_exp lane by lane: the same operations in the same order, so the same bits, for finite x
// (the selects as masks; gcc's own vectorization of the loop ran a third slower). Without clamp,
// for x in [-87, 0] only, where softmax_exp's selects keep x and p * scale: the same bits without
// them (0.18 -> 0.13 ms for 152K tokens on one thread).
AI v8 exp8(const v8 *xp, int clamp) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const v8 x = *xp;
    v8 xc = x;
    if (clamp) {
        xc = sel8(CMP8(x, <, V8(88.0f)), x, V8(88.0f));
        xc = sel8(CMP8(x, >, V8(-87.0f)), xc, V8(-87.0f));
    }
    v8 n = (xc * V8(log2e) + V8(12582912.0f)) - V8(12582912.0f);
    v8 r = (xc - n * V8(ln2_hi)) - n * V8(ln2_lo);
    v8 p = V8(1.0f) + r * (V8(1.0f) + r * (V8(0.5f) + r * (V8(1.0f / 6) + r * (V8(1.0f / 24) + r * (V8(1.0f / 120) + r * (V8(1.0f / 720) + r * V8(1.0f / 5040)))))));
    v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    p = p * (v8)bits;
    return clamp ? (v8)((v8i)p & CMP8(x, >=, V8(-87.0f))) : p;
}

// Appends band's set lanes, in order, to ids (as i + lane), bl (l's lane, unless NULL) and bp
// (p's, unless NULL); returns how many. Writes 8 entries to each whatever the count (the caller
// leaves room). With AVX2 it
// takes no branch: the band's lanes are few and scattered, and a branch on them mispredicted
// often enough to cost 40% of the band's pass.
#ifdef __AVX2__
// LANES[m]: the positions of m's set bits, lowest first, a byte each (bit j goes to the byte
// numbered by the set bits below it).
#define BIT_(m, j) (((m) >> (j)) & 1)
#define POP8_(m) (BIT_(m, 0) + BIT_(m, 1) + BIT_(m, 2) + BIT_(m, 3) + BIT_(m, 4) + BIT_(m, 5) + BIT_(m, 6) + BIT_(m, 7))
#define POS_(m, j) ((uint64_t)(BIT_(m, j) * (j)) << (8 * POP8_((m) & ((1 << (j)) - 1))))
#define LANE_(m) (POS_(m, 1) | POS_(m, 2) | POS_(m, 3) | POS_(m, 4) | POS_(m, 5) | POS_(m, 6) | POS_(m, 7))
#define LANE4_(m) LANE_(m), LANE_(m + 1), LANE_(m + 2), LANE_(m + 3)
#define LANE16_(m) LANE4_(m), LANE4_(m + 4), LANE4_(m + 8), LANE4_(m + 12)
#define LANE64_(m) LANE16_(m), LANE16_(m + 16), LANE16_(m + 32), LANE16_(m + 48)
static const uint64_t LANES[256] = {LANE64_(0), LANE64_(64), LANE64_(128), LANE64_(192)};
#endif
#define append8(ids, bl, bp, i, band, l, p) \
    ({ v8i a8b_ = (band); v8 a8l_ = (l), a8p_ = (p); append8_((ids), (bl), (bp), (i), &a8b_, &a8l_, &a8p_); })
AI int append8_(int *ids, float *bl, float *bp, int i, const v8i *band, const v8 *l, const v8 *p) {
#ifdef __AVX2__
    const int mk = _mm256_movemask_ps((__m256)*band);
    const __m256i at = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&LANES[mk]));
    _mm256_storeu_si256((__m256i *)ids, _mm256_add_epi32(_mm256_set1_epi32(i), at));
    if (bl) _mm256_storeu_ps(bl, _mm256_permutevar8x32_ps((__m256)*l, at));
    if (bp) _mm256_storeu_ps(bp, _mm256_permutevar8x32_ps((__m256)*p, at));
    return __builtin_popcount((unsigned)mk);
#else
    int k = 0;
    if (any8(*band))
        for (int j = 0; j < 8; j++) {
            ids[k] = i + j;
            if (bl) bl[k] = (*l)[j];
            if (bp) bp[k] = (*p)[j];
            k -= (*band)[j]; // 0 or -1
        }
    return k;
#endif
}

// Sums of P without converting each p: a p >= 2^-17 is a multiple of 2^-40 (24 bits from its
// leading one), so its P is p * 2^40 exactly, and up to BLK such p (or zeros) sum exactly in
// double (below 2^9, multiples of 2^-40: 49 bits); the sum times 2^40 is then their P's sum.
#define d_lo(v) __builtin_convertvector(lo4(v), v4d)
#define d_hi(v) __builtin_convertvector(hi4(v), v4d)
#define exact_sum(a) ((uint64_t)((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) * 0x1p40))

// P of eight p as floats, each the integer fixed40 gives: p 2^40 is exact, and below 2^23 adding
// and removing 2^23 rounds it to the nearest integer (even on ties); at or above, it is one.
AI v8 round40(const v8 *pp) {
    const v8 q = *pp * V8(0x1p40f);
    return sel8(CMP8(q, <, V8(0x1p23f)), (q + V8(0x1p23f)) - V8(0x1p23f), q);
}

#define NBIN 4096
#define XMAX 32.0f // past it e^-x < 2^-41, so P = 0: one overflow bin (NBIN) holds those tokens
#define BLK 256    // the general path's block of tokens (p, then its sums, while in L1)
#define KMAX 1024  // top-k up to this: a threshold filter over the logits, p for those k alone
#define TOPK_BUF 1024 // the top-k filter's buffer beyond k
#define MINP_FEW 16   // min-p's candidates are "few" when at most n / MINP_FEW

// The passes over all n tokens run as pool tasks over ranges of blocks when n is large (a task's
// start costs microseconds), each writing its blocks' sums; the caller combines them in block
// order. The sums are integers, so every split gives the same bits. Without the pool's workers
// (a team of 1) the tasks run on the caller.
#define PAR_MIN 16384 // below it, one task
#define PAR_MAX 64    // the most tasks of a pass
static int par_tasks(int n, int nblk) {
    if (n < PAR_MIN) return 1;
    int t = pool_threads();
    t = 4 * t < PAR_MAX ? 4 * t : PAR_MAX; // a few per thread: a descheduled one holds up a small share
    return t < nblk ? t : nblk;
}
static void par_run(int nt, PoolTask fn, void *ctx) {
    if (nt <= 1) fn(ctx, 0, 0);
    else pool_run(nt, fn, ctx);
}
// Task i of nt's blocks: [*lo, *hi) of nblk.
static void task_blocks(int i, int nt, int nblk, int *lo, int *hi) {
    *lo = (int)((int64_t)i * nblk / nt), *hi = (int)((int64_t)(i + 1) * nblk / nt);
}

// Each block's largest logit as its order key, from the max pass (blk_mass's fourth part).
static uint32_t *blk_max(const Sampler *s) { return (uint32_t *)(s->blk_mass + 3 * (size_t)((s->n_valid + BLK - 1) / BLK)); }

static int keys_size(int n) {
    int a = 3 * (n / MINP_FEW) + 3, b = 2 * KMAX + TOPK_BUF, c = 2 * n + n / 8 + 8; // select_list's P, key; a band
    return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

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
    s->blk_mass = malloc(4 * (size_t)((n_valid + BLK - 1) / BLK) * sizeof(uint64_t)); // 3 sums, the max (blk_max)
    s->keys = malloc((size_t)keys_size(n_valid) * sizeof(uint64_t));
    if (s->prob && s->bin && s->list && s->bin_count && s->bin_mass && s->blk_mass && s->keys) return 0;
    sampler_free(s);
    return -1;
}

void sampler_free(Sampler *s) {
    free(s->prob), free(s->bin), free(s->list), free(s->bin_count), free(s->bin_mass), free(s->count);
    free(s->blk_mass), free(s->keys);
    s->prob = NULL, s->bin = NULL, s->list = NULL, s->bin_count = NULL, s->bin_mass = NULL, s->count = NULL;
    s->blk_mass = NULL, s->keys = NULL;
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

// How the vectorized passes compute p = softmax_exp(x), x = (l - m) / T, given the smallest logit
// (x is monotone in l): clamp when some x may lie below -87 (exp8 keeps softmax_exp's selects);
// small when some p may lie in (0, 2^-17) (see exact_sum; every x >= -11.5 rules that out: e^-11.5
// = 1.0e-5 > 2^-17 = 7.6e-6 by far more than softmax_exp's 2 ulp); inv = 1 / T when T is a power
// of two (then (l - m) * inv rounds the same real number as (l - m) / T: the same bits, without a
// division), else 0.
typedef struct {
    float m, t, inv;
    int clamp, small;
} ExpArgs;
static ExpArgs exp_args(float lmin, float m, float t) {
    int e;
    const float x = (lmin - m) / t, inv = 1.0f / t;
    const int pow2 = frexpf(t, &e) == 0.5f && isfinite(inv);
    return (ExpArgs){.m = m, .t = t, .inv = pow2 ? inv : 0.0f, .clamp = !(x >= -87.0f), .small = !(x >= -11.5f)};
}
// Top-p's head (see top_p_band) as the exp pass lists it: the tokens with l >= l_head, per task in
// s->list from its first block's first token, k[i] of them (-1: more than HMAX).
#define HMAX 1024     // the head's most tokens (a task's list, and all of them)
#define HEAD_X -5.55f // the head: x >= this (e^-5.55 = 2^-8)
typedef struct {
    float l_head;
    int nt, k[PAR_MAX];
} Head;
static void exp_pass(const Sampler *s, const float *logits, const ExpArgs *xa, int keep, Head *hd, uint64_t *z, uint64_t *z_min,
                     int *n_min);
static void exp_block(const float *logits, const ExpArgs *xa, int b0, int e, float *dst);

// The prefix of rank order that a target ends: by count (the first `count` tokens) when by_mass
// is 0, else the shortest whose P sum, in double, is >= mass. The histogram is filled.
static Cut select_list(const Sampler *s, const float *logits, int *list, int k, int by_mass, int count, double mass, long c0, uint64_t m0);
static Cut radix_select(int *ids, float *l, float *p, int k, int by_mass, int count, double mass, long c0, uint64_t m0);
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
    return select_list(s, logits, list, k, by_mass, count, mass, c0, m0);
}

// The radix select over list[0, k) (ids in id order, all ranking after c0 tokens of mass m0 and
// before the rest), 8 bits of the key at a time from the top: their logits and p gathered into
// scratch, then radix_select.
static Cut select_list(const Sampler *s, const float *logits, int *list, int k, int by_mass, int count, double mass, long c0, uint64_t m0) {
    float *l = (float *)s->keys, *p = l + s->n_valid;
    for (int j = 0; j < k; j++) l[j] = logits[list[j]], p[j] = s->prob[list[j]];
    return radix_select(list, l, p, k, by_mass, count, mass, c0, m0);
}

// select_list's work on members given as ids (in id order), logits and p, all three compacted in
// place as the select narrows them down.
static Cut radix_select(int *ids, float *l, float *p, int k, int by_mass, int count, double mass, long c0, uint64_t m0) {
    while (k > 1) {
        uint32_t lo = order_key(l[0]), hi = lo;
        for (int j = 1; j < k; j++) {
            uint32_t key = order_key(l[j]);
            lo = key < lo ? key : lo, hi = key > hi ? key : hi;
        }
        if (lo == hi) break;
        int shift = 0; // the digit (key - lo) >> shift < 256
        while ((hi - lo) >> shift > 255) shift++;
        uint32_t dc[256] = {0};
        uint64_t dm[256] = {0};
        for (int j = 0; j < k; j++) {
            int d = (int)((order_key(l[j]) - lo) >> shift);
            dc[d]++, dm[d] += fixed40(p[j]);
        }
        int d = (int)((hi - lo) >> shift);
        for (;; d--) { // larger keys rank first
            if (d == 0 || (by_mass ? (double)(m0 + dm[d]) >= mass : c0 + (long)dc[d] >= count)) break;
            c0 += dc[d], m0 += dm[d];
        }
        int kk = 0;
        for (int j = 0; j < k; j++)
            if ((int)((order_key(l[j]) - lo) >> shift) == d) ids[kk] = ids[j], l[kk] = l[j], p[kk] = p[j], kk++;
        k = kk;
    }
    // equal keys: in id order
    Cut c = {0, 0, 0, 0};
    for (int j = 0; j < k; j++) {
        c0++, m0 += fixed40(p[j]);
        if (j == k - 1 || (by_mass ? (double)m0 >= mass : c0 >= count)) {
            c.s = (int)c0, c.key = order_key(l[j]), c.id = ids[j], c.mass = m0;
            break;
        }
    }
    return c;
}


// ---- small sorts on rank keys: (~order key) << 32 | id, smaller = earlier in rank order ----

static inline uint64_t rank_key(float l, int id) { return (uint64_t)~order_key(l) << 32 | (uint32_t)id; }
static inline int key_id(uint64_t c) { return (int)(uint32_t)c; }
// The float whose order key is k (finite floats; key 0x80000000 gives +0).
static inline float key_float(uint32_t k) {
    uint32_t b = k & 0x80000000u ? k & 0x7fffffffu : ~k;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}
static inline float rank_key_logit(uint64_t c) { return key_float(~(uint32_t)(c >> 32)); }

// Hoare partition of a[lo, hi] (hi - lo > 16) around the median of three (keys are distinct):
// returns j with a[lo, j] <= pivot <= a[j + 1, hi].
static int partition_u64(uint64_t *a, int lo, int hi) {
    uint64_t x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi];
    uint64_t piv = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
    int i = lo, j = hi;
    for (;;) {
        while (a[i] < piv) i++;
        while (a[j] > piv) j--;
        if (i >= j) return j;
        uint64_t t = a[i];
        a[i++] = a[j], a[j--] = t;
    }
}

static void sort_u64(uint64_t *a, int n) {
    while (n > 16) {
        int j = partition_u64(a, 0, n - 1);
        // [0, j] <= piv <= [j + 1, n): recurse on the smaller side
        if (j + 1 < n - j - 1) sort_u64(a, j + 1), a += j + 1, n -= j + 1;
        else sort_u64(a + j + 1, n - j - 1), n = j + 1;
    }
    for (int i = 1; i < n; i++) {
        uint64_t v = a[i];
        int j = i;
        for (; j > 0 && a[j - 1] > v; j--) a[j] = a[j - 1];
        a[j] = v;
    }
}

// Reorders a[0, n) so that a[0, k) holds its k smallest (in any order), 0 < k < n.
static void select_smallest(uint64_t *a, int n, int k) {
    int lo = 0, hi = n - 1;
    while (hi - lo > 16) {
        int j = partition_u64(a, lo, hi);
        if (k - 1 <= j) hi = j;
        else lo = j + 1;
    }
    sort_u64(a + lo, hi - lo + 1);
}


// The first k tokens in rank order (0 < k < n, k <= KMAX) as rank keys, sorted, in keys[0, k): one
// pass over the logits that buffers a token only if its logit is above the worst of the best k
// found so far (the pass goes in id order, so a later token that ties that worst ranks after it);
// a full buffer keeps its best k.
static void top_k_keys(const float *logits, int n, int k, uint64_t *keys) {
    int nb = 0;
    for (int i = 0; i < k; i++) keys[nb++] = rank_key(logits[i], i);
    uint64_t worst = 0;
    for (int j = 0; j < k; j++) worst = keys[j] > worst ? keys[j] : worst;
    float thr = rank_key_logit(worst);
    v8 tv = {thr, thr, thr, thr, thr, thr, thr, thr};
    int i = k;
    for (; i < n; i++) {
        if (i % 16 == 0 && i + 16 <= n) { // whole blocks of 16 at a time while nothing passes
            while (i + 16 <= n && !any8(CMP8(ld8(logits + i), >, tv) | CMP8(ld8(logits + i + 8), >, tv))) i += 16;
            if (i == n) break;
        }
        if (logits[i] > thr) {
            keys[nb++] = rank_key(logits[i], i);
            if (nb == k + TOPK_BUF) {
                select_smallest(keys, nb, k);
                nb = k, worst = 0;
                for (int j = 0; j < k; j++) worst = keys[j] > worst ? keys[j] : worst;
                thr = rank_key_logit(worst);
                for (int j = 0; j < 8; j++) tv[j] = thr;
            }
        }
    }
    if (nb > k) select_smallest(keys, nb, k);
    sort_u64(keys, k);
}

// The draw over a kept set given as ids in ascending order: the first whose running sum of P
// exceeds r = floor(u * mass).
static int draw_ids(const float *logits, float m, float t, const uint64_t *ids, int cnt, uint64_t mass, double u) {
    uint64_t r = (uint64_t)(u * (double)mass), cum = 0;
    if (r >= mass) r = mass - 1;
    for (int j = 0; j < cnt; j++) {
        int i = (int)ids[j];
        if ((cum += fixed40(softmax_exp((logits[i] - m) / t))) > r) return i;
    }
    return (int)ids[cnt - 1]; // not reached
}

// The lowest id holding the max m (present: -0 and +0 are equal), 16 at a time.
static int first_max(const float *logits, int n, float m) {
    int i = 0;
    while (i + 16 <= n && !any8(CMP8(ld8(logits + i), ==, V8(m)) | CMP8(ld8(logits + i + 8), ==, V8(m)))) i += 16;
    while (logits[i] != m) i++;
    return i;
}

// Top-k with k <= KMAX (and top-p, min-p on top): p only for the k candidates. Returns -1 when
// min-p's count could not be settled from them (p is within 2 ulp of e^x but not exactly monotone:
// when the k-th p lies within 1e-5 of min_p); the caller then takes the general path.
static int pick_top_k(const Sampler *s, const float *logits, float m, double u) {
    const int n = s->n_valid, k = s->top_k;
    const float t = s->temperature, min_p = s->min_p;
    uint64_t *keys = s->keys, *kept = s->keys + k;
    top_k_keys(logits, n, k, keys);
    uint64_t zk = 0;
    int c = 0; // how many of the k reach min_p
    for (int j = 0; j < k; j++) {
        float p = softmax_exp((logits[key_id(keys[j])] - m) / t);
        zk += fixed40(p);
        c += p >= min_p;
    }
    int s_kp = k; // the prefix that top-k and top-p keep
    uint64_t mass = zk;
    if (s->top_p < 1.0f) {
        double target = (double)s->top_p * (double)zk;
        uint64_t cum = 0;
        s_kp = 1;
        if (target > 0)
            for (int j = 0; j < k; j++)
                if ((double)(cum += fixed40(softmax_exp((logits[key_id(keys[j])] - m) / t))) >= target) {
                    s_kp = j + 1;
                    break;
                }
        if (target <= 0) cum = fixed40(softmax_exp((logits[key_id(keys[0])] - m) / t));
        mass = cum;
    }
    int cnt = 0;
    if (min_p > 0.0f && c < k) {
        // no token past the k reaches min_p when the k-th p is clearly below it: n_min = c
        float p_last = softmax_exp((logits[key_id(keys[k - 1])] - m) / t);
        if (!((double)p_last < (double)min_p * (1 - 1e-5))) return -1;
        if (c == 0) return first_max(logits, n, m); // none reaches min_p: the best token alone
        if (c <= s_kp) { // min-p's set, {p >= min_p}
            mass = 0;
            for (int j = 0; j < k; j++) {
                float p = softmax_exp((logits[key_id(keys[j])] - m) / t);
                if (p >= min_p) kept[cnt++] = (uint64_t)key_id(keys[j]), mass += fixed40(p);
            }
        }
    }
    if (cnt == 0) // the prefix
        for (int j = 0; j < s_kp; j++) kept[cnt++] = (uint64_t)key_id(keys[j]);
    sort_u64(kept, cnt);
    return draw_ids(logits, m, t, kept, cnt, mass, u);
}

// Min-p without top-k: a token with p >= min_p has (l - m) / T >= ln(min_p) up to the roundings of
// x and softmax_exp's 2 ulp, so the logits at or above a bound with a wide margin hold all of them.
// When those are few (at most n / MINP_FEW), p only for them (and, for top-p, a pass for Z alone).
// Returns -1 when they are not few, or when min-p's set is not a prefix of their rank order
// (possible at 1 ulp, and then top-p's prefix is not comparable): the general path then.
static int pick_min_p(const Sampler *s, const float *logits, const ExpArgs *xa, double u) {
    const int n = s->n_valid, few = n / MINP_FEW;
    const float m = xa->m, t = s->temperature, min_p = s->min_p;
    double L = log((double)min_p), lo = (double)m + (double)t * (L - 1e-3 * (1 + fabs(L)));
    float lf = (float)lo;
    if ((double)lf > lo) lf = nextafterf(lf, -INFINITY);
    uint64_t *ids = s->keys;
    v8 tv = {lf, lf, lf, lf, lf, lf, lf, lf};
    int nc = 0;
    for (int i = 0; i < n; i++) {
        if (i % 16 == 0)
            while (i + 16 <= n && !any8(CMP8(ld8(logits + i), >=, tv) | CMP8(ld8(logits + i + 8), >=, tv))) i += 16;
        if (i < n && logits[i] >= lf) {
            if (nc == few) return -1;
            ids[nc++] = (uint64_t)i;
        }
    }
    int n_min = 0;
    uint64_t z_min = 0;
    for (int j = 0; j < nc; j++) {
        int i = (int)ids[j];
        float p = softmax_exp((logits[i] - m) / t);
        if (p >= min_p) ids[n_min++] = (uint64_t)i, z_min += fixed40(p); // in place: still ascending
        else ids[nc + (j - n_min)] = (uint64_t)i;                    // the others, from nc on
    }
    if (n_min == 0) return first_max(logits, n, m); // none reaches min_p: the best token alone
    if (s->top_p < 1.0f) {
        // Z over all n, then top-p's prefix against min-p's set (when it is a prefix of rank order)
        uint64_t z, z_min_all;
        int n_min_all;
        exp_pass(s, logits, xa, 0, NULL, &z, &z_min_all, &n_min_all);
        double target = (double)s->top_p * (double)z;
        uint64_t *rk = ids + nc + nc; // the candidates' rank keys: min-p's set first, then the rest
        for (int j = 0; j < n_min; j++) rk[j] = rank_key(logits[ids[j]], (int)ids[j]);
        uint64_t worst_in = 0, best_out = UINT64_MAX;
        for (int j = 0; j < n_min; j++) worst_in = rk[j] > worst_in ? rk[j] : worst_in;
        for (int j = n_min; j < nc; j++) {
            uint64_t c = rank_key(logits[ids[nc + (j - n_min)]], (int)ids[nc + (j - n_min)]);
            best_out = c < best_out ? c : best_out;
        }
        if (worst_in > best_out) return -1;
        sort_u64(rk, n_min);
        uint64_t cum = 0;
        int s_p = 1;
        if (target > 0) {
            for (int j = 0; j < n_min; j++)
                if ((double)(cum += fixed40(softmax_exp((logits[key_id(rk[j])] - m) / t))) >= target) {
                    s_p = j + 1;
                    break;
                }
            if ((double)cum < target) s_p = n_min + 1; // past min-p's set
        } else {
            cum = fixed40(softmax_exp((logits[key_id(rk[0])] - m) / t));
        }
        if (s_p < n_min) { // top-p's prefix
            for (int j = 0; j < s_p; j++) ids[j] = (uint64_t)key_id(rk[j]);
            sort_u64(ids, s_p);
            return draw_ids(logits, m, t, ids, s_p, cum, u);
        }
    }
    return draw_ids(logits, m, t, ids, n_min, z_min, u);
}

// Top-p over all n (no top-k) without a histogram of every token, after the exp pass (p stored).
// The head first: the few tokens whose P may each weigh in the cut (l >= l_head: p above about
// 2^-8 of the best's), listed by the exp pass and taken exactly (a sample misses them, or one it
// holds swamps its variance); the cut when they reach top_p of Z. Else (past the head, or a head
// too long to list: then no token outweighs many) a histogram of P over a sample of the rest (bins
// of the logit below m, T/32 wide) estimates the tail past each bin (the tail's P are small, so
// its estimate is the close one: Z less it is the prefix's mass), and a band of bins wide enough
// for the sample's error (4 sigma) must hold the crossing; one pass sums P exactly above the band
// (per block, for the draw), collects the band's tokens and checks that the crossing lies among
// them, and the radix select finds it there. Returns 0 (the caller takes the histogram of every
// token) when the band holds too many tokens or the check fails; 1 with the cut in the band (the
// draw's data left for top_p_draw); 2 with the cut in the head (the kept ids in ascending order
// in keys[0, cut->s), for draw_ids).
#define SAMP_BLK 1 // the sample: runs of 8 tokens a block (whole cache lines, not strided tokens)
#define SBIN 1024
#define BAND_MIN 32768 // fewer tokens: the histogram of every token costs little
typedef struct {
    const Sampler *s;
    const float *logits;
    const ExpArgs *xa;
    float l_in, l_out;
    int nt, exact;
    int k[PAR_MAX];
    uint64_t m_in[PAR_MAX], m_band[PAR_MAX];
    long c_in[PAR_MAX];
} BandPass;
static void band_task(void *ctx, int task, int thread);

// The sample: SAMP_BLK runs of 8 tokens a block, at offsets that vary from block to block; the exp
// pass copies each run's logits and p while they are in L1 (strided loads afterwards were half
// the estimate's time). Run r of block b starts at token samp_at(b, r) of the block.
static int samp_at(int b, int r) { return 8 * ((b * 11 + r * (BLK / 8 / SAMP_BLK)) % (BLK / 8)); }
// The keys scratch on top-p's band path, in uint64 (keys_size: 2n + n/8 + 8): [0, n) the band's
// logits then p, 2n floats; [n, n + n/16) the sample (samp_buf), per run 8 logits then 8 p, in
// block order; [n + n/8, + HMAX) the head's rank keys (head_buf); [2n, 2n + n/16) the band's ids,
// kept for the draw.
static float *samp_buf(const Sampler *s) { return (float *)(s->keys + s->n_valid); }
static uint64_t *head_buf(const Sampler *s) { return s->keys + s->n_valid + s->n_valid / 8; }

// The sample's histogram, of its tokens below l_skip: w[b] the sum of P over bin b (the last bin:
// all beyond), w2[b] of P^2; returns how many it holds, and in *top the last bin that holds any.
static int sample_hist(const Sampler *s, float m, float step, float l_skip, double *w, double *w2, int *top) {
    const int n = s->n_valid, nblk = (n + BLK - 1) / BLK;
    const float *sp = samp_buf(s);
    const v8 mv = V8(m), sv = V8(step), kv = V8(l_skip);
    int ns = 0, hi = 0;
    memset(w, 0, (SBIN + 1) * sizeof *w), memset(w2, 0, (SBIN + 1) * sizeof *w2);
    for (int b = 0; b < nblk; b++)
        for (int r = 0; r < SAMP_BLK; r++, sp += 16) {
            if (b * BLK + samp_at(b, r) + 8 > n) continue; // a short last block
            const v8 l = ld8(sp), y = (mv - l) / sv, p = (v8)((v8i)ld8(sp + 8) & CMP8(l, <, kv));
            const v8i bin = __builtin_convertvector(sel8(CMP8(y, <, V8((float)SBIN)), y, V8((float)SBIN)), v8i);
            for (int j = 0; j < 8; j++) {
                const double P = (double)p[j] * 0x1p40; // an estimate: no need for fixed40's rounding
                w[bin[j]] += P, w2[bin[j]] += P * P, hi = bin[j] > hi ? bin[j] : hi, ns += l[j] < l_skip;
            }
        }
    *top = hi;
    return ns;
}

// The head's tokens as rank keys in head_buf, their P's sum in *mass; returns how many, -1 when
// more than HMAX.
static int head_keys(const Sampler *s, const float *logits, const Head *hd, uint64_t *mass) {
    const int nblk = (s->n_valid + BLK - 1) / BLK;
    uint64_t *hk = head_buf(s), m = 0;
    int nh = 0;
    for (int i = 0; i < hd->nt; i++) {
        if (hd->k[i] < 0 || nh + hd->k[i] > HMAX) return -1;
        int b_lo, b_hi;
        task_blocks(i, hd->nt, nblk, &b_lo, &b_hi);
        const int *ids = s->list + b_lo * BLK;
        for (int j = 0; j < hd->k[i]; j++) hk[nh++] = rank_key(logits[ids[j]], ids[j]), m += fixed40(s->prob[ids[j]]);
    }
    *mass = m;
    return nh;
}

// The cut in the head, whose P reach target: its keys sorted, their P summed in rank order up to
// target; the kept ids in ascending order in keys[0, cut->s).
static void head_cut(const Sampler *s, const float *logits, int nh, double target, Cut *cut) {
    uint64_t *hk = head_buf(s), cum = 0;
    sort_u64(hk, nh);
    for (int j = 0; j < nh; j++) {
        const int id = key_id(hk[j]);
        if ((double)(cum += fixed40(s->prob[id])) >= target) {
            *cut = (Cut){.s = j + 1, .key = order_key(logits[id]), .id = id, .mass = cum};
            for (int i = 0; i <= j; i++) s->keys[i] = (uint64_t)key_id(hk[i]);
            sort_u64(s->keys, j + 1);
            return;
        }
    }
}

// The band's edges from the sample's histogram (scale: tokens per sampled one): bins <= *b_hi
// surely before the crossing, bins > *b_lo surely after it (4 sigma).
static void band_edges(const double *w, const double *w2, int top, double scale, uint64_t z, double target, int *b_hi, int *b_lo) {
    double tail = 0, var = 0;
    *b_hi = -1, *b_lo = SBIN;
    for (int b = top; b >= 0; b--) { // (the empty bins past top add nothing)
        double mb = (double)z - tail * scale, sd = 4 * sqrt(var) * scale + 1e-9 * (double)z;
        if (mb - sd >= target) *b_lo = b;
        if (mb + sd < target) {
            *b_hi = b;
            return;
        }
        tail += w[b], var += w2[b];
    }
}

// The band pass's lists (each task's from its first block's first token) joined in order at the
// start of list and the keys scratch, their sums added up; returns the band's size, -1 past n / 8.
static int band_join(const Sampler *s, const BandPass *c, uint64_t *m_in, uint64_t *m_band, long *c_in) {
    const int n = s->n_valid, nblk = (n + BLK - 1) / BLK;
    int *list = s->list, k = 0;
    float *bl = (float *)s->keys, *bp = bl + n;
    *m_in = 0, *m_band = 0, *c_in = 0;
    for (int i = 0; i < c->nt; i++) {
        if (c->k[i] < 0 || k + c->k[i] > n / 8) return -1;
        int b_lo, b_hi;
        task_blocks(i, c->nt, nblk, &b_lo, &b_hi);
        if (k != b_lo * BLK) {
            memmove(list + k, list + b_lo * BLK, (size_t)c->k[i] * sizeof *list);
            memmove(bl + k, bl + b_lo * BLK, (size_t)c->k[i] * sizeof *bl);
            memmove(bp + k, bp + b_lo * BLK, (size_t)c->k[i] * sizeof *bp);
        }
        k += c->k[i], *m_in += c->m_in[i], *m_band += c->m_band[i], *c_in += c->c_in[i];
    }
    return k;
}

static int top_p_band(const Sampler *s, const float *logits, const ExpArgs *xa, uint64_t z, const Head *hd, Cut *cut, int *band_k) {
    const int n = s->n_valid, nblk = (n + BLK - 1) / BLK;
    const float m = xa->m;
    const float t = s->temperature;
    const double target = (double)s->top_p * (double)z;
    uint64_t m_head;
    const int nh = head_keys(s, logits, hd, &m_head);
    if (nh >= 0 && (double)m_head >= target) return head_cut(s, logits, nh, target, cut), 2;
    if (!(target > 0)) return 0;
    double w[SBIN + 1], w2[SBIN + 1];
    const float step = t / 32; // bin b: m - (b + 1) step < l <= m - b step, roughly; any monotone map will do
    int top, b_hi, b_lo; // the sample of the tokens past the head when it is listed, else of all
    const int ns = sample_hist(s, m, step, nh >= 0 ? hd->l_head : INFINITY, w, w2, &top);
    band_edges(w, w2, top, (double)(n - (nh >= 0 ? nh : 0)) / (ns > 0 ? ns : 1), z, target, &b_hi, &b_lo);
    // in: l > l_in; the band: l_out < l <= l_in; monotone in l, so in ranks before band before out
    const float l_in = m - (float)(b_hi + 1) * step, l_out = b_lo < SBIN ? m - (float)(b_lo + 1) * step : -INFINITY;
    // every p above the band >= 2^-17 (within 2 ulp of e^x, x monotone in l): its sums in double
    const int exact = softmax_exp((l_in - m) / t) >= 0x1p-16f;
    BandPass c = {.s = s, .logits = logits, .xa = xa, .l_in = l_in, .l_out = l_out, .nt = par_tasks(n, nblk), .exact = exact};
    par_run(c.nt, band_task, &c);
    uint64_t m_in, m_band;
    long c_in;
    const int k = band_join(s, &c, &m_in, &m_band, &c_in);
    if (k < 0 || !((double)m_in < target && (double)(m_in + m_band) >= target)) return 0;
    memcpy(s->keys + 2 * (size_t)n, s->list, (size_t)k * sizeof *s->list); // the band's ids, kept for the draw
    *cut = radix_select(s->list, (float *)s->keys, (float *)s->keys + n, k, 1, 0, target, c_in, m_in);
    *band_k = k;
    return 1;
}

// top_p_band's pass, a task's blocks: P summed above the band (per block, for the draw; as p when
// c->exact, see exact_sum, else as round40's P); the band's ids, logits and p listed from its first
// block's first token on (k -1: more than the band may hold).
static void band_task(void *ctx, int task, int thread) {
    (void)thread;
    BandPass *c = ctx;
    const Sampler *s = c->s;
    const float *logits = c->logits, *prob = s->prob, l_in = c->l_in, l_out = c->l_out;
    const int n = s->n_valid, nblk = (n + BLK - 1) / BLK, exact = c->exact;
    int b_lo, b_hi;
    task_blocks(task, c->nt, nblk, &b_lo, &b_hi);
    const v8 vi = V8(l_in), vo = V8(l_out);
    int *list = s->list + b_lo * BLK, k = 0, cap = n / 8;
    float *bl = (float *)s->keys + b_lo * BLK, *bp = bl + n; // the band's logits and p
    uint64_t m_in = 0, m_band = 0, *blk_in = s->blk_mass + 2 * nblk;
    long c_in = 0;
    c->k[task] = -1;
    for (int b = b_lo; b < b_hi; b++) {
        const int b0 = b * BLK, e = b0 + BLK < n ? b0 + BLK : n;
        uint64_t bi = 0;
        v4d da = {0, 0, 0, 0};
        v8i ca = {0, 0, 0, 0, 0, 0, 0, 0};
        int i = key_float(blk_max(s)[b]) > l_out ? b0 : e; // a block wholly below the band adds nothing
        for (; i + 8 <= e; i += 8) {
            const v8 l = ld8(logits + i), p = ld8(prob + i), P = exact ? p : round40(&p);
            const v8i in = CMP8(l, >, vi), band = ~in & CMP8(l, >, vo);
            const v8 pi = (v8)((v8i)P & in);
            da += d_lo(pi) + d_hi(pi), ca -= in;
            if (k + 8 > cap) return;
            k += append8(list + k, bl + k, NULL, i, band, l, p);
        }
        bi = (uint64_t)(((da[0] + da[1]) + (da[2] + da[3])) * (exact ? 0x1p40 : 1.0));
        c_in += ca[0] + ca[1] + ca[2] + ca[3] + ca[4] + ca[5] + ca[6] + ca[7];
        for (; i < e; i++) {
            if (logits[i] > l_in) bi += fixed40(prob[i]), c_in++;
            else if (logits[i] > l_out) {
                if (k == cap) return;
                list[k] = i, bl[k] = logits[i], k++;
            }
        }
        blk_in[b] = bi, m_in += bi;
    }
    exp_block(bl, c->xa, 0, k, bp); // the band's p again, from its logits: fewer stores in the loop above
    for (int j = 0; j < k; j++) m_band += fixed40(bp[j]);
    c->k[task] = k, c->m_in[task] = m_in, c->m_band[task] = m_band, c->c_in[task] = c_in;
}

// The draw over top_p_band's kept set: the tokens above the band (their P per block) and the band's
// up to the cut, in id order.
static int top_p_draw(const Sampler *s, const float *logits, int band_k, Cut cut, double u) {
    const int n = s->n_valid, nblk = (n + BLK - 1) / BLK;
    const float *prob = s->prob;
    uint64_t r = (uint64_t)(u * (double)cut.mass), cum = 0;
    if (r >= cut.mass) r = cut.mass - 1;
    const float cl = key_float(cut.key);
    const int cid = cut.id, *band = (const int *)(s->keys + 2 * (size_t)n);
    const uint64_t *blk_in = s->blk_mass + 2 * nblk;
    for (int b = 0, j = 0; b < nblk; b++) {
        const int b0 = b * BLK, e = b0 + BLK < n ? b0 + BLK : n;
        uint64_t bs = blk_in[b];
        for (; j < band_k && band[j] < e; j++) {
            int i = band[j];
            if (logits[i] > cl || (logits[i] == cl && i <= cid)) bs += fixed40(prob[i]);
        }
        if (cum + bs <= r) {
            cum += bs;
            continue;
        }
        for (int i = b0; i < e; i++) // above the band: l > cl; below it: l < cl
            if ((logits[i] > cl || (logits[i] == cl && i <= cid)) && (cum += fixed40(prob[i])) > r) return i;
    }
    return cut.id; // not reached
}

// exp_block's loop over whole vectors, for one (clamp, mul) pair: four vectors at a time, as four
// independent chains of operations (exp8 is one long chain of dependent operations, about 80
// cycles: with one vector an iteration the core ran out of room to overlap enough of them; four
// took 0.13 -> 0.11 ms for 152K tokens).
#define X8(i) ({ const v8 d_ = ld8(logits + (i)) - mv; mul ? d_ * iv : d_ / tv; })
AI void exp_run(const float *logits, const ExpArgs *xa, int b0, int e, float *dst, int clamp, int mul) {
    const v8 mv = V8(xa->m), tv = V8(xa->t), iv = V8(xa->inv);
    int i = b0;
    for (; i + 32 <= e; i += 32) {
        const v8 x0 = X8(i), x1 = X8(i + 8), x2 = X8(i + 16), x3 = X8(i + 24);
        const v8 p0 = exp8(&x0, clamp), p1 = exp8(&x1, clamp), p2 = exp8(&x2, clamp), p3 = exp8(&x3, clamp);
        float *o = dst + (i - b0);
        memcpy(o, &p0, sizeof p0), memcpy(o + 8, &p1, sizeof p1), memcpy(o + 16, &p2, sizeof p2), memcpy(o + 24, &p3, sizeof p3);
    }
    for (; i + 8 <= e; i += 8) {
        const v8 x = X8(i), p = exp8(&x, clamp);
        memcpy(dst + (i - b0), &p, sizeof p);
    }
}
#undef X8

// p of tokens [b0, e) into dst (see ExpArgs).
static void exp_block(const float *logits, const ExpArgs *xa, int b0, int e, float *dst) {
    const int mul = xa->inv != 0.0f;
    if (xa->clamp && mul) exp_run(logits, xa, b0, e, dst, 1, 1);
    else if (xa->clamp) exp_run(logits, xa, b0, e, dst, 1, 0);
    else if (mul) exp_run(logits, xa, b0, e, dst, 0, 1);
    else exp_run(logits, xa, b0, e, dst, 0, 0);
    for (int i = b0 + (e - b0) / 8 * 8; i < e; i++) dst[i - b0] = softmax_exp((logits[i] - xa->m) / xa->t);
}

// Eight p into a block's sums (see block_sums): of P in da, of those reaching min_p in dma with
// their count in n8 (mp). small: the lanes are rounded to P (round40), else they are p, and p
// >= 2^-17 sum exactly as they are (see exact_sum).
AI void sums8(const float *p, int small, int mp, float min_p, v4d *da, v4d *dma, v8i *n8) {
    const v8 q = ld8(p), P = small ? round40(&q) : q;
    *da += d_lo(P) + d_hi(P);
    if (mp) {
        const v8i ge = CMP8(q, >=, V8(min_p));
        const v8 Pm = (v8)((v8i)P & ge);
        *dma += d_lo(Pm) + d_hi(Pm), *n8 -= ge;
    }
}

// A block's sums of P from its p (in L1): all, and (min_p > 0) those with p >= min_p and their
// count; without min-p those are all of them. small: some p in (0, 2^-17), whose P need rounding.
// The sums run in double, exactly: at most BLK values, integers below 2^40 or multiples of 2^-40
// below 1.
static void block_sums(const float *p, int len, int small, float min_p, uint64_t *zb, uint64_t *zmb, int *nb) {
    const int len8 = len / 8 * 8, mp = min_p > 0.0f;
    v4d da = {0, 0, 0, 0}, dma = {0, 0, 0, 0};
    v8i n8 = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0;
    if (small && mp)
        for (; j < len8; j += 8) sums8(p + j, 1, 1, min_p, &da, &dma, &n8);
    else if (small)
        for (; j < len8; j += 8) sums8(p + j, 1, 0, min_p, &da, &dma, &n8);
    else if (mp)
        for (; j < len8; j += 8) sums8(p + j, 0, 1, min_p, &da, &dma, &n8);
    else
        for (; j < len8; j += 8) sums8(p + j, 0, 0, min_p, &da, &dma, &n8);
    const double sc = small ? 1.0 : 0x1p40;
    uint64_t z = (uint64_t)(((da[0] + da[1]) + (da[2] + da[3])) * sc);
    uint64_t zm = (uint64_t)(((dma[0] + dma[1]) + (dma[2] + dma[3])) * sc);
    int c = n8[0] + n8[1] + n8[2] + n8[3] + n8[4] + n8[5] + n8[6] + n8[7];
    for (; j < len; j++) z += fixed40(p[j]), zm += p[j] >= min_p ? fixed40(p[j]) : 0, c += p[j] >= min_p;
    if (!mp) zm = z, c = len;
    *zb = z, *zmb = zm, *nb = c;
}

// Top-p's share of the exp pass for block b (tokens [b * BLK, e), their p in p): the sample's runs
// into samp_buf, the head's tokens (l >= l_head) appended to ids from *k (-1 once past HMAX: then
// the head is long, and no token outweighs many).
static void band_extras(const Sampler *s, const float *logits, const float *p, int b, int e, float l_head, int *ids, int *k) {
    const int b0 = b * BLK;
    for (int r = 0; r < SAMP_BLK; r++) {
        float *sp = samp_buf(s) + 16 * (b * SAMP_BLK + r);
        const int at = samp_at(b, r);
        if (b0 + at + 8 <= e) memcpy(sp, logits + b0 + at, 8 * sizeof *sp), memcpy(sp + 8, p + at, 8 * sizeof *p);
    }
    int i = b0, kk = *k;
    const v8 hv = V8(l_head);
    if (key_float(blk_max(s)[b]) < l_head) return; // none of the head here
    for (; kk >= 0 && i + 8 <= e; i += 8) {
        const v8 l = ld8(logits + i);
        kk = kk + 8 > HMAX ? -1 : kk + append8(ids + kk, NULL, NULL, i, CMP8(l, >=, hv), l, l);
    }
    for (; kk >= 0 && i < e; i++)
        if (logits[i] >= l_head) kk = kk < HMAX ? (ids[kk] = i, kk + 1) : -1;
    *k = kk;
}

// The general path's pass: p for every token, block by block (into s->prob when keep, else into a
// block buffer that stays in L1), and per block the sums of P, all and those reaching min_p (the
// draw skips whole blocks by them); returns the totals.
typedef struct {
    const Sampler *s;
    const float *logits;
    const ExpArgs *xa;
    int keep, nt;
    Head *hd; // top-p's band path: take its sample, list its head
    uint64_t z[PAR_MAX], z_min[PAR_MAX];
    int n_min[PAR_MAX];
} ExpPass;

static void exp_task(void *ctx, int task, int thread) {
    (void)thread;
    ExpPass *c = ctx;
    const Sampler *s = c->s;
    const float *logits = c->logits;
    const int keep = c->keep;
    const int n = s->n_valid, nblk = (n + BLK - 1) / BLK;
    const float min_p = s->min_p;
    uint64_t *blk = s->blk_mass, *blk_min = blk + nblk, zt = 0, zmt = 0;
    int nt = 0, b_lo, b_hi, hk = 0;
    task_blocks(task, c->nt, nblk, &b_lo, &b_hi);
    float buf[BLK] __attribute__((aligned(32)));
    for (int b = b_lo; b < b_hi; b++) {
        const int b0 = b * BLK, e = b0 + BLK < n ? b0 + BLK : n;
        float *p = keep ? s->prob + b0 : buf;
        exp_block(logits, c->xa, b0, e, p);
        if (c->hd) band_extras(s, logits, p, b, e, c->hd->l_head, s->list + b_lo * BLK, &hk);
        uint64_t zb, zmb;
        int nb;
        block_sums(p, e - b0, c->xa->small, min_p, &zb, &zmb, &nb);
        blk[b] = zb, blk_min[b] = zmb, zt += zb, zmt += zmb, nt += nb;
    }
    c->z[task] = zt, c->z_min[task] = zmt, c->n_min[task] = nt;
    if (c->hd) c->hd->k[task] = hk;
}

static void exp_pass(const Sampler *s, const float *logits, const ExpArgs *xa, int keep, Head *hd, uint64_t *z, uint64_t *z_min,
                     int *n_min) {
    const int n = s->n_valid, nblk = (n + BLK - 1) / BLK;
    ExpPass c = {.s = s, .logits = logits, .xa = xa, .keep = keep, .hd = hd, .nt = par_tasks(n, nblk)};
    if (hd) hd->nt = c.nt;
    par_run(c.nt, exp_task, &c);
    uint64_t zt = 0, zmt = 0;
    int nt = 0;
    for (int i = 0; i < c.nt; i++) zt += c.z[i], zmt += c.z_min[i], nt += c.n_min[i];
    *z = zt, *z_min = zmt, *n_min = nt;
}

// The max pass, a task's blocks: the largest and smallest keys.
typedef struct {
    const Sampler *s;
    const float *logits;
    int n, nt, blk; // blk: each block's max too (blk_max)
    uint32_t kmax[PAR_MAX], kmin[PAR_MAX];
} MaxPass;
// The largest and smallest keys of logits [i0, e) folded into *kmax, *kmin (written so that gcc
// vectorizes it). A NaN or an infinity has a key past every finite float's (KEY_HI, KEY_LO), so
// these two tell whether there is one.
#define KEY_HI 0xff800000u // +infinity's key; a positive NaN's is larger
#define KEY_LO 0x007fffffu // -infinity's key; a negative NaN's is smaller
AI void key_range(const float *logits, int i0, int e, uint32_t *kmax, uint32_t *kmin) {
    uint32_t hi = *kmax, lo = *kmin;
    for (int i = i0; i < e; i++) {
        uint32_t b;
        memcpy(&b, &logits[i], sizeof b);
        uint32_t k = b & 0x80000000u ? ~b : b | 0x80000000u;
        hi = k > hi ? k : hi, lo = k < lo ? k : lo;
    }
    *kmax = hi, *kmin = lo;
}

static void max_task(void *ctx, int task, int thread) {
    (void)thread;
    MaxPass *c = ctx;
    const int nblk = (c->n + BLK - 1) / BLK;
    int b_lo, b_hi;
    task_blocks(task, c->nt, nblk, &b_lo, &b_hi);
    uint32_t kmax = 0, kmin = UINT32_MAX;
    if (!c->blk) key_range(c->logits, b_lo * BLK, b_hi * BLK < c->n ? b_hi * BLK : c->n, &kmax, &kmin);
    else
        for (int b = b_lo; b < b_hi; b++) { // block by block, each block's max kept
            uint32_t bm = 0;
            key_range(c->logits, b * BLK, (b + 1) * BLK < c->n ? (b + 1) * BLK : c->n, &bm, &kmin);
            blk_max(c->s)[b] = bm, kmax = bm > kmax ? bm : kmax;
        }
    c->kmax[task] = kmax, c->kmin[task] = kmin;
}

// The general path's draw, when the kept set is the prefix ending at a cut: the kept P's sum per
// block, a task's blocks (into blk_mass's third part).
typedef struct {
    const Sampler *s;
    const float *logits;
    float cl;
    int cid, nt;
} CutPass;
static void cut_task(void *ctx, int task, int thread) {
    (void)thread;
    CutPass *c = ctx;
    const float *logits = c->logits, *prob = c->s->prob, cl = c->cl;
    const int n = c->s->n_valid, nblk = (n + BLK - 1) / BLK, cid = c->cid;
    uint64_t *out = c->s->blk_mass + 2 * nblk;
    int b_lo, b_hi;
    task_blocks(task, c->nt, nblk, &b_lo, &b_hi);
    for (int b = b_lo; b < b_hi; b++) {
        const int b0 = b * BLK, e = b0 + BLK < n ? b0 + BLK : n;
        uint64_t bs = 0;
#pragma omp simd reduction(+ : bs)
        for (int i = b0; i < e; i++) {
            float l = logits[i];
            bs += l > cl || (l == cl && i <= cid) ? fixed40(prob[i]) : 0;
        }
        out[b] = bs;
    }
}

int sampler_pick(const Sampler *s, float *logits, double u) {
    const int n = s->n_valid;
    const float t = s->temperature;
    // the max (as the largest key: a float max reduction does not vectorize), and no NaN or infinity;
    // on the pool only where the general path's passes follow (the paths that follow it on few
    // tokens would run beside the pool's workers spinning for the next task, slower than the pass is
    // made faster)
    const int general = t > 0.0f && !(s->top_k > 0 && s->top_k < n) && !(s->min_p > 0.0f);
    // top-p's band path may follow (its head skips blocks by their max)
    const int band = t > 0.0f && !(s->top_k > 0 && s->top_k < n) && s->top_p < 1.0f && n >= BAND_MIN;
    const int s_k = s->top_k > 0 && s->top_k < n ? s->top_k : n, small_k = s_k <= KMAX && s_k < n;
    MaxPass mp = {.s = s, .logits = logits, .n = n, .nt = general ? par_tasks(n, (n + BLK - 1) / BLK) : 1, .blk = band};
    par_run(mp.nt, max_task, &mp);
    uint32_t kmax = 0, kmin = UINT32_MAX;
    for (int i = 0; i < mp.nt; i++) kmax = mp.kmax[i] > kmax ? mp.kmax[i] : kmax, kmin = mp.kmin[i] < kmin ? mp.kmin[i] : kmin;
    if (kmax >= KEY_HI || kmin <= KEY_LO) // a NaN or an infinity
        for (int i = 0; i < n; i++)
            if (!isfinite(logits[i])) return -1 - i;
    float m = key_float(kmax);
    if (t <= 0.0f) return first_max(logits, n, m); // -0 and +0 are equal
    const ExpArgs xa = exp_args(key_float(kmin), m, t);
    if (small_k) {
        int id = pick_top_k(s, logits, m, u);
        if (id >= 0) return id;
    } else if (s_k == n && s->min_p > 0.0f) {
        int id = pick_min_p(s, logits, &xa, u);
        if (id >= 0) return id;
    }
    // The general path. p for every token, block by block: the block's p, then the sums of its P
    // (all, and those reaching min_p) while it is in L1; the draw skips whole blocks by these sums.
    float *prob = s->prob;
    const float min_p = s->min_p;
    uint64_t z, z_min, *blk = s->blk_mass, *blk_min = s->blk_mass + (n + BLK - 1) / BLK;
    int n_min;
    const int keep = s_k < n || s->top_p < 1.0f; // the selects read p
    Head hd = {.l_head = m + t * HEAD_X};
    exp_pass(s, logits, &xa, keep, band ? &hd : NULL, &z, &z_min, &n_min);
    int s_m = min_p > 0.0f ? (n_min > 0 ? n_min : 1) : n;
    // min-p's kept set is {p >= min_p} itself (p falls along rank order): no select for it;
    // past 1 no p reaches it, and the one best token (p = 1) is kept
    Cut cut = {n, 0, 0, z};
    int by_p = 0;
    if (s_m < n) cut.s = s_m, cut.mass = z_min, by_p = 1;
    if (min_p > 0.0f && n_min == 0) return first_max(logits, n, m);
    Cut kp = {0, 0, 0, 0};
    int band_k = 0;
    const int tp = band ? top_p_band(s, logits, &xa, z, &hd, &kp, &band_k) : 0; // 1: in the band, 2: in the head
    if (tp) {
        if (kp.s < cut.s && tp == 1) return top_p_draw(s, logits, band_k, kp, u);
        if (kp.s < cut.s) return draw_ids(logits, m, t, s->keys, kp.s, kp.mass, u);
    } else if (s_k < n || s->top_p < 1.0f) {
        uint16_t *bin = s->bin;
#pragma omp simd
        for (int i = 0; i < n; i++) {
            float x = (logits[i] - m) / t; // -x = (m - l) / T exactly
            // NBIN / XMAX = 128: -x * 128 is exact and < NBIN; past XMAX the overflow bin NBIN
            bin[i] = (uint16_t)(-x < XMAX ? (int)(-x * (NBIN / XMAX)) : NBIN);
        }
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
    // the draw, in id order over the kept tokens: whole blocks while their kept P stay <= r
    uint64_t r = (uint64_t)(u * (double)cut.mass), cum = 0;
    if (r >= cut.mass) r = cut.mass - 1;
    const float cl = key_float(cut.key);
    const int cid = cut.id, all = cut.s == n, nblk = (n + BLK - 1) / BLK;
    CutPass cp = {.s = s, .logits = logits, .cl = cl, .cid = cid, .nt = all || by_p ? 1 : par_tasks(n, nblk)};
    if (cp.nt > 1) par_run(cp.nt, cut_task, &cp); // the block sums in parallel, then the walk
    const uint64_t *blk_cut = s->blk_mass + 2 * nblk;
    float buf[BLK];
    for (int b0 = 0, b = 0; b0 < n; b0 += BLK, b++) {
        const int e = b0 + BLK < n ? b0 + BLK : n;
        uint64_t bs = 0;
        if (all) bs = blk[b];
        else if (by_p) bs = blk_min[b];
        else if (cp.nt > 1) bs = blk_cut[b];
        else {
#pragma omp simd reduction(+ : bs)
            for (int i = b0; i < e; i++) {
                float l = logits[i];
                bs += l > cl || (l == cl && i <= cid) ? fixed40(prob[i]) : 0;
            }
        }
        if (cum + bs <= r) {
            cum += bs;
            continue;
        }
        const float *p = prob + b0;
        if (!keep) exp_block(logits, &xa, b0, e, buf), p = buf;
        for (int i = b0; i < e; i++) {
            float l = logits[i];
            int in = all || (by_p ? p[i - b0] >= min_p : l > cl || (l == cl && i <= cid));
            if (in && (cum += fixed40(p[i - b0])) > r) return i;
        }
    }
    return cut.id; // not reached: the kept P sum to cut.mass > r
}

int sampler_sample(Sampler *s, float *logits) {
    if (s->temperature <= 0.0f) return sampler_pick(s, logits, 0.0);
    return sampler_pick(s, logits, sampler_uniform(s));
}
