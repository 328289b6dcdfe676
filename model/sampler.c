// Sampling. The filters run in transformers' order so the same settings mean the same thing;
// sampler.h gives the definition, which kernels/sample.cu implements too.
//
// No sort of the vocabulary, and as few passes over it as each setting allows (152K tokens: the
// exp is most of the time, so it runs on the tokens that can matter where a filter bounds them):
//   a pass for the max (and no NaN or infinity), then
//   top-k <= KMAX: a threshold filter over the logits finds the k (p for those alone), top-p and
//     min-p then within them;
//   min-p without top-k: a logit bound (with a margin over the roundings) collects min-p's
//     candidates; p for those alone when few (a sum pass for Z when top-p is on too);
//   else the general path: a vectorized pass for p and the sums of P by blocks of BLK (the draw
//     skips whole blocks); top-p alone then estimates its cut from a sample and confirms it in a
//     band of tokens (top_p_band); what remains (top-k > KMAX, a failed estimate) takes a
//     histogram of x = (m - l) / T in 4096 bins of 1/128 (x is monotone in the logit, so a bin's
//     tokens all rank before the next bin's) to find the bin holding a filter's boundary, and a
//     radix select on the logit's key over that bin's members alone.
// The passes over every token (p and its block sums, top-p's band, the draw's block sums at a cut)
// run as pool tasks over ranges of blocks at large n; their integer sums make any split exact.
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

// Eight lanes as GCC/Clang vector extensions (AVX2 here, two SSE halves under x86-64-v2).
#pragma GCC diagnostic ignored "-Wpsabi" // they pass only between this file's inline functions
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));
typedef uint64_t v4u __attribute__((vector_size(32)));
typedef int64_t v4l __attribute__((vector_size(32)));
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
#define lo4i(v) lo4(v)
#define hi4i(v) hi4(v)

// fixed40 of four lanes.
AI v4u fixed40x4(v4 p) {
    v4d t = __builtin_convertvector(p, v4d) * 0x1p40 + 0x1p52;
    return (v4u)t - 0x4330000000000000ull;
}
AI v4u mask64(v4i m) { return (v4u)__builtin_convertvector(m, v4l); }

// Comparisons of eight lanes: without AVX, gcc lowers a 32-byte comparison lane by lane, so there
// it is two of four lanes.
#ifdef __AVX__
#define CMP8(a, op, b) ((v8i)((a)op(b)))
#else
AI v8i cmp8_join(v4i a, v4i b) { return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7); }
#define CMP8(a, op, b) cmp8_join(lo4(a) op lo4(b), hi4(a) op hi4(b))
#endif

// softmax_exp lane by lane: the same operations in the same order, so the same bits, for finite x
// (the selects as masks; gcc's own vectorization of the loop ran a third slower).
AI v8 exp8(const v8 *xp) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const v8 x = *xp;
    v8 xc = sel8(CMP8(x, <, V8(88.0f)), x, V8(88.0f));
    xc = sel8(CMP8(x, >, V8(-87.0f)), xc, V8(-87.0f));
    v8 n = (xc * V8(log2e) + V8(12582912.0f)) - V8(12582912.0f);
    v8 r = (xc - n * V8(ln2_hi)) - n * V8(ln2_lo);
    v8 p = V8(1.0f) + r * (V8(1.0f) + r * (V8(0.5f) + r * (V8(1.0f / 6) + r * (V8(1.0f / 24) + r * (V8(1.0f / 120) + r * (V8(1.0f / 720) + r * V8(1.0f / 5040)))))));
    v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    return (v8)((v8i)(p * (v8)bits) & CMP8(x, >=, V8(-87.0f)));
}

// Sums of P without converting each p: a p >= 2^-17 is a multiple of 2^-40 (24 bits from its
// leading one), so its P is p * 2^40 exactly, and up to BLK such p (or zeros) sum exactly in
// double (below 2^9, multiples of 2^-40: 49 bits); the sum times 2^40 is then their P's sum.
#define d_lo(v) __builtin_convertvector(lo4(v), v4d)
#define d_hi(v) __builtin_convertvector(hi4(v), v4d)
#define exact_sum(a) ((uint64_t)((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) * 0x1p40))

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
    s->blk_mass = malloc(3 * (size_t)((n_valid + BLK - 1) / BLK) * sizeof(uint64_t));
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

// The prefix of rank order that a target ends: by count (the first `count` tokens) when by_mass
// is 0, else the shortest whose P sum, in double, is >= mass. The histogram is filled.
static Cut select_list(const Sampler *s, const float *logits, int *list, int k, int by_mass, int count, double mass, long c0, uint64_t m0);
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
// before the rest), 8 bits of the key at a time from the top.
static Cut select_list(const Sampler *s, const float *logits, int *list, int k, int by_mass, int count, double mass, long c0, uint64_t m0) {
    // each member's key and P, once (compacted along with the list)
    uint64_t *P = s->keys;
    uint32_t *key = (uint32_t *)(s->keys + s->n_valid);
    for (int j = 0; j < k; j++) key[j] = order_key(logits[list[j]]), P[j] = fixed40(s->prob[list[j]]);
    while (k > 1) {
        uint32_t lo = key[0], hi = key[0];
        for (int j = 1; j < k; j++) lo = key[j] < lo ? key[j] : lo, hi = key[j] > hi ? key[j] : hi;
        if (lo == hi) break;
        int shift = 0; // the digit (key - lo) >> shift < 256
        while ((hi - lo) >> shift > 255) shift++;
        uint32_t dc[256] = {0};
        uint64_t dm[256] = {0};
        for (int j = 0; j < k; j++) {
            int d = (int)((key[j] - lo) >> shift);
            dc[d]++, dm[d] += P[j];
        }
        int d = (int)((hi - lo) >> shift);
        for (;; d--) { // larger keys rank first
            if (d == 0 || (by_mass ? (double)(m0 + dm[d]) >= mass : c0 + (long)dc[d] >= count)) break;
            c0 += dc[d], m0 += dm[d];
        }
        int kk = 0;
        for (int j = 0; j < k; j++)
            if ((int)((key[j] - lo) >> shift) == d) list[kk] = list[j], key[kk] = key[j], P[kk] = P[j], kk++;
        k = kk;
    }
    // equal keys: in id order
    Cut c = {0, 0, 0, 0};
    for (int j = 0; j < k; j++) {
        c0++, m0 += P[j];
        if (j == k - 1 || (by_mass ? (double)m0 >= mass : c0 >= count)) {
            c.s = (int)c0, c.key = key[j], c.id = list[j], c.mass = m0;
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
static int pick_min_p(const Sampler *s, const float *logits, float m, double u) {
    const int n = s->n_valid, few = n / MINP_FEW;
    const float t = s->temperature, min_p = s->min_p;
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
        uint64_t z = 0;
#pragma omp simd reduction(+ : z)
        for (int i = 0; i < n; i++) z += fixed40(softmax_exp((logits[i] - m) / t));
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
// A histogram of P over a sample of NSAMP tokens (bins of
// the logit below m, T/32 wide) estimates the tail past each bin (the tail's P are small, so its
// estimate is the close one: Z less it is the prefix's mass), and a band of bins wide enough for
// the sample's error (4 sigma) must hold the crossing; one pass sums P exactly above the band (per
// block, for the draw), collects the band's tokens and checks that the crossing lies among them,
// and the radix select finds it there. Returns 0 (the caller takes the histogram of every token)
// when n is small, the band holds too many tokens or the check fails; 1 with the cut (the draw's
// data left for top_p_draw).
#define NSAMP 8192
#define SBIN 1024
typedef struct {
    const Sampler *s;
    const float *logits;
    float l_in, l_out;
    int nt;
    int k[PAR_MAX];
    uint64_t m_in[PAR_MAX], m_band[PAR_MAX];
    long c_in[PAR_MAX];
} BandPass;
static void band_task(void *ctx, int task, int thread);
static int top_p_band(const Sampler *s, const float *logits, float m, uint64_t z, double target, Cut *cut, int *band_k) {
    const int n = s->n_valid, nblk = (n + BLK - 1) / BLK;
    const float t = s->temperature;
    if (n < 4 * NSAMP || !(target > 0)) return 0;
    double w[SBIN + 1], w2[SBIN + 1];
    memset(w, 0, sizeof w), memset(w2, 0, sizeof w2);
    const float step = t / 32; // bin b: m - (b + 1) step < l <= m - b step, roughly; any monotone map will do
    for (int j = 0; j < NSAMP; j++) {
        int i = (int)((int64_t)j * n / NSAMP);
        float y = (m - logits[i]) / step;
        int b = y < (float)SBIN ? (int)y : SBIN;
        double P = (double)fixed40(s->prob[i]);
        w[b] += P, w2[b] += P * P;
    }
    const double scale = (double)n / NSAMP;
    double tail = 0, var = 0;
    int b_hi = -1, b_lo = SBIN; // bins <= b_hi: surely before the crossing; > b_lo: surely after
    for (int b = SBIN; b >= 0; b--) {
        double mb = (double)z - tail * scale, sd = 4 * sqrt(var) * scale + 1e-9 * (double)z;
        if (mb - sd >= target) b_lo = b;
        if (mb + sd < target) {
            b_hi = b;
            break;
        }
        tail += w[b], var += w2[b];
    }
    // in: l > l_in; the band: l_out < l <= l_in; monotone in l, so in ranks before band before out
    const float l_in = m - (float)(b_hi + 1) * step, l_out = b_lo < SBIN ? m - (float)(b_lo + 1) * step : -INFINITY;
    BandPass c = {.s = s, .logits = logits, .l_in = l_in, .l_out = l_out, .nt = par_tasks(n, nblk)};
    par_run(c.nt, band_task, &c);
    int *list = s->list, k = 0, cap = n / 8;
    uint64_t m_in = 0, m_band = 0;
    long c_in = 0;
    for (int i = 0; i < c.nt; i++) { // each task's band, from its blocks' first entry of list, in order
        if (c.k[i] < 0 || k + c.k[i] > cap) return 0;
        int b_lo, b_hi;
        task_blocks(i, c.nt, nblk, &b_lo, &b_hi);
        if (k != b_lo * BLK) memmove(list + k, list + b_lo * BLK, (size_t)c.k[i] * sizeof *list);
        k += c.k[i], m_in += c.m_in[i], m_band += c.m_band[i], c_in += c.c_in[i];
    }
    if (!((double)m_in < target && (double)(m_in + m_band) >= target)) return 0;
    int *band_ids = (int *)(s->keys + 2 * (size_t)n); // the band, kept for the draw
    memcpy(band_ids, list, (size_t)k * sizeof *list);
    *cut = select_list(s, logits, list, k, 1, 0, target, c_in, m_in);
    *band_k = k;
    return 1;
}

// top_p_band's pass, a task's blocks: P summed above the band (per block, for the draw), the band's
// ids listed from list[its first block's first token] (k -1: more than the band may hold).
static void band_task(void *ctx, int task, int thread) {
    (void)thread;
    BandPass *c = ctx;
    const Sampler *s = c->s;
    const float *logits = c->logits, l_in = c->l_in, l_out = c->l_out;
    const int n = s->n_valid, nblk = (n + BLK - 1) / BLK;
    int b_lo, b_hi;
    task_blocks(task, c->nt, nblk, &b_lo, &b_hi);
    const v8 vi = V8(l_in), vo = V8(l_out);
    int *list = s->list + b_lo * BLK, k = 0, cap = n / 8;
    uint64_t m_in = 0, m_band = 0, *blk_in = s->blk_mass + 2 * nblk;
    long c_in = 0;
    c->k[task] = -1;
    for (int b = b_lo; b < b_hi; b++) {
        const int b0 = b * BLK, e = b0 + BLK < n ? b0 + BLK : n;
        uint64_t bi = 0;
        v4d da = {0, 0, 0, 0};
        v8i ca = {0, 0, 0, 0, 0, 0, 0, 0}, small = {0, 0, 0, 0, 0, 0, 0, 0};
        int i = b0;
        for (; i + 8 <= e; i += 8) {
            v8 l = ld8(logits + i), p = ld8(s->prob + i);
            v8i in = CMP8(l, >, vi), band = ~in & CMP8(l, >, vo);
            if (!any8(in | band)) continue;
            v8 pi = (v8)((v8i)p & in);
            small |= in & CMP8(p, <, V8(0x1p-17f)) & CMP8(p, >, V8(0.0f));
            da += d_lo(pi) + d_hi(pi), ca -= in;
            if (any8(band)) {
                if (k + 8 > cap) return;
                for (int j = 0; j < 8; j++) list[k] = i + j, k -= band[j]; // band[j]: 0 or -1
            }
        }
        if (any8(small)) { // P one by one (see exact_sum)
            for (int j = b0; j < i; j++)
                if (logits[j] > l_in) bi += fixed40(s->prob[j]);
        } else
            bi = exact_sum(da);
        c_in += ca[0] + ca[1] + ca[2] + ca[3] + ca[4] + ca[5] + ca[6] + ca[7];
        for (; i < e; i++) {
            uint64_t P = fixed40(s->prob[i]);
            if (logits[i] > l_in) bi += P, c_in++;
            else if (logits[i] > l_out) {
                if (k == cap) return;
                list[k++] = i;
            }
        }
        blk_in[b] = bi, m_in += bi;
    }
    for (int j = 0; j < k; j++) m_band += fixed40(s->prob[list[j]]);
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

// p of tokens [b0, e) into dst; returns whether some p lies in (0, 2^-17) (see exact_sum).
static int exp_block(const float *logits, float m, float t, int b0, int e, float *dst) {
    const v8 mv = V8(m), tv = V8(t);
    v8i small = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = b0, sm = 0;
    for (; i + 8 <= e; i += 8) {
        v8 x = (ld8(logits + i) - mv) / tv, p = exp8(&x);
        small |= CMP8(p, <, V8(0x1p-17f)) & CMP8(p, >, V8(0.0f));
        memcpy(dst + (i - b0), &p, sizeof p);
    }
    for (; i < e; i++) {
        float p = dst[i - b0] = softmax_exp((logits[i] - m) / t);
        sm |= p < 0x1p-17f && p > 0.0f;
    }
    return sm || any8(small);
}

// The general path's pass: p for every token, block by block (into s->prob when keep, else into a
// block buffer that stays in L1), and per block the sums of P, all and those reaching min_p (the
// draw skips whole blocks by them); returns the totals.
typedef struct {
    const Sampler *s;
    const float *logits;
    float m;
    int keep, nt;
    uint64_t z[PAR_MAX], z_min[PAR_MAX];
    int n_min[PAR_MAX];
} ExpPass;

static void exp_task(void *ctx, int task, int thread) {
    (void)thread;
    ExpPass *c = ctx;
    const Sampler *s = c->s;
    const float *logits = c->logits;
    const float m = c->m;
    const int keep = c->keep;
    const int n = s->n_valid, nblk = (n + BLK - 1) / BLK;
    const float t = s->temperature, min_p = s->min_p;
    uint64_t *blk = s->blk_mass, *blk_min = blk + nblk, zt = 0, zmt = 0;
    int nt = 0, b_lo, b_hi;
    task_blocks(task, c->nt, nblk, &b_lo, &b_hi);
    const v4 pv = {min_p, min_p, min_p, min_p};
    float buf[BLK] __attribute__((aligned(32)));
    for (int b = b_lo; b < b_hi; b++) {
        const int b0 = b * BLK, e = b0 + BLK < n ? b0 + BLK : n, e4 = b0 + (e - b0) / 4 * 4;
        float *p = keep ? s->prob + b0 : buf;
        const int small = exp_block(logits, m, t, b0, e, p);
        v4u za = {0, 0, 0, 0}, zma = {0, 0, 0, 0};
        v4i na = {0, 0, 0, 0};
        if (!small) { // the block's P while its p are in L1: in double, exactly
            v4d da = {0, 0, 0, 0}, dma = {0, 0, 0, 0};
            v8i n8 = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int j = 0; j + 8 <= e4 - b0; j += 8) {
                v8 q = ld8(p + j);
                v8i ge = CMP8(q, >=, V8(min_p));
                v8 qm = (v8)((v8i)q & ge);
                da += d_lo(q) + d_hi(q), dma += d_lo(qm) + d_hi(qm), n8 -= ge;
            }
            for (int j = (e4 - b0) / 8 * 8; j < e4 - b0; j += 4) {
                v4 q;
                memcpy(&q, p + j, sizeof q);
                v4i ge = q >= pv;
                v4u P = fixed40x4(q);
                za += P, zma += P & mask64(ge), na -= ge;
            }
            za[0] += exact_sum(da), zma[0] += exact_sum(dma);
            na += lo4i(n8) + hi4i(n8);
        } else if (min_p > 0.0f)
            for (int j = 0; j < e4 - b0; j += 4) {
                v4 q;
                memcpy(&q, p + j, sizeof q);
                v4i ge = q >= pv;
                v4u P = fixed40x4(q);
                za += P, zma += P & mask64(ge), na -= ge;
            }
        else
            for (int j = 0; j < e4 - b0; j += 4) {
                v4 q;
                memcpy(&q, p + j, sizeof q);
                za += fixed40x4(q);
            }
        uint64_t zb = za[0] + za[1] + za[2] + za[3], zmb = zma[0] + zma[1] + zma[2] + zma[3];
        int nb = na[0] + na[1] + na[2] + na[3];
        for (int i = e4; i < e; i++) {
            float q = p[i - b0];
            zb += fixed40(q), zmb += q >= min_p ? fixed40(q) : 0, nb += q >= min_p;
        }
        if (!(min_p > 0.0f)) zmb = zb, nb = e - b0;
        blk[b] = zb, blk_min[b] = zmb, zt += zb, zmt += zmb, nt += nb;
    }
    c->z[task] = zt, c->z_min[task] = zmt, c->n_min[task] = nt;
}

static void exp_pass(const Sampler *s, const float *logits, float m, int keep, uint64_t *z, uint64_t *z_min, int *n_min) {
    const int n = s->n_valid, nblk = (n + BLK - 1) / BLK;
    ExpPass c = {.s = s, .logits = logits, .m = m, .keep = keep, .nt = par_tasks(n, nblk)};
    par_run(c.nt, exp_task, &c);
    uint64_t zt = 0, zmt = 0;
    int nt = 0;
    for (int i = 0; i < c.nt; i++) zt += c.z[i], zmt += c.z_min[i], nt += c.n_min[i];
    *z = zt, *z_min = zmt, *n_min = nt;
}

// The max pass, a task's blocks: the largest key, and whether a logit is NaN or infinite.
typedef struct {
    const float *logits;
    int n, nt;
    uint32_t kmax[PAR_MAX], bad[PAR_MAX];
} MaxPass;
static void max_task(void *ctx, int task, int thread) {
    (void)thread;
    MaxPass *c = ctx;
    const float *logits = c->logits;
    int b_lo, b_hi;
    task_blocks(task, c->nt, (c->n + BLK - 1) / BLK, &b_lo, &b_hi);
    const int e = b_hi * BLK < c->n ? b_hi * BLK : c->n;
    uint32_t kmax = 0, bad = 0;
    for (int i = b_lo * BLK; i < e; i++) {
        uint32_t b;
        memcpy(&b, &logits[i], sizeof b);
        bad |= (b & 0x7f800000u) == 0x7f800000u;
        uint32_t k = b & 0x80000000u ? ~b : b | 0x80000000u;
        kmax = k > kmax ? k : kmax;
    }
    c->kmax[task] = kmax, c->bad[task] = bad;
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
    // the max (as the largest key: a float max reduction does not vectorize), and no NaN or infinity
    // (on one thread: the paths that follow it on few tokens would run beside the pool's workers
    // spinning for the next task, slower than the pass is made faster)
    MaxPass mp = {.logits = logits, .n = n, .nt = 1};
    max_task(&mp, 0, 0);
    uint32_t kmax = 0, bad = 0;
    for (int i = 0; i < mp.nt; i++) kmax = mp.kmax[i] > kmax ? mp.kmax[i] : kmax, bad |= mp.bad[i];
    if (bad)
        for (int i = 0; i < n; i++)
            if (!isfinite(logits[i])) return -1 - i;
    float m = key_float(kmax);
    if (t <= 0.0f) return first_max(logits, n, m); // -0 and +0 are equal
    int s_k = s->top_k > 0 && s->top_k < n ? s->top_k : n;
    if (s_k <= KMAX && s_k < n) {
        int id = pick_top_k(s, logits, m, u);
        if (id >= 0) return id;
    } else if (s_k == n && s->min_p > 0.0f) {
        int id = pick_min_p(s, logits, m, u);
        if (id >= 0) return id;
    }
    // The general path. p for every token, block by block: the block's p, then the sums of its P
    // (all, and those reaching min_p) while it is in L1; the draw skips whole blocks by these sums.
    float *prob = s->prob;
    const float min_p = s->min_p;
    uint64_t z, z_min, *blk = s->blk_mass, *blk_min = s->blk_mass + (n + BLK - 1) / BLK;
    int n_min;
    const int keep = s_k < n || s->top_p < 1.0f; // the selects read p
    exp_pass(s, logits, m, keep, &z, &z_min, &n_min);
    int s_m = min_p > 0.0f ? (n_min > 0 ? n_min : 1) : n;
    // min-p's kept set is {p >= min_p} itself (p falls along rank order): no select for it;
    // past 1 no p reaches it, and the one best token (p = 1) is kept
    Cut cut = {n, 0, 0, z};
    int by_p = 0;
    if (s_m < n) cut.s = s_m, cut.mass = z_min, by_p = 1;
    if (min_p > 0.0f && n_min == 0) return first_max(logits, n, m);
    Cut kp;
    int band_k = 0;
    if (s_k == n && s->top_p < 1.0f && top_p_band(s, logits, m, z, (double)s->top_p * (double)z, &kp, &band_k)) {
        if (kp.s < cut.s) return top_p_draw(s, logits, band_k, kp, u);
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
        if (!keep) exp_block(logits, m, t, b0, e, buf), p = buf;
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
