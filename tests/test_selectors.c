// Known-answer tests of every Selector (attention/selector.h) with a budget k below the zone,
// driven through the interface itself: extend over a KVStore holding a synthetic zone, then
// select. Each expected selection is computed here independently (brute force in double, or a
// construction whose answer is known) and compared exactly, slot for slot. Where fp32 rounding
// could matter, the data are such that the answer does not depend on it, and the test asserts
// that margin from an error bound, so the result holds on any machine and at any -O / -march.
//
//   oracle     exact top-k of <q, k>
//   quest      pages of 16 by their per-channel min/max bound, best first, last page cut
//   fier       1-bit keys per group of 32: on two-valued groups the estimate is the score; on
//              any keys, the estimate as modeled here in double
//   kmeans     256 centroids per 8-dim subspace: on few-valued subspaces the codebook is exact
//   streaming  nothing from the zone
//   pariskv    planted keys, decoys the vote must reject, the exact candidate set, C and the tiers
//
// Zone slot i is position SINK + i. Every selector is built for NL layers x NH KV heads and all
// four zones are indexed before any is queried (an index read across heads would show), one of
// them in uneven chunks (the incremental path); then layer 0 is reset and re-indexed with new
// data while layer 1 must keep answering as before.
#include "../attention/attention.h"
#include "../attention/selector.h"
#include "../attention/srht.h"
#include "test_pariskv_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NL 2
#define NH 2
#define SINK 4
#define TAIL 48  // rows after the zone: the local window, which no selector may read as zone
#define MAXD 128
#define U24 (1.0 / 16777216.0) // fp32 unit roundoff, 2^-24

// gamma_m = m u / (1 - m u): |fl(sum of m products) - exact| <= gamma_m * sum of |products|,
// whatever the order of the additions and whether products are fused (Higham, Accuracy and
// Stability of Numerical Algorithms, 3.1). All fp32 bounds below come from it.
static double gam(int m) { return m * U24 / (1.0 - m * U24); }

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

// ---- ranking: higher score first, ties to the smaller id (attention/topk.c's rule) ----

typedef struct {
    double s;
    int id;
} Ranked;

static int by_score(const void *a, const void *b) {
    const Ranked *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static Ranked *rank_all(const double *s, int n) {
    Ranked *r = xcalloc((size_t)n, sizeof *r);
    for (int i = 0; i < n; i++) r[i] = (Ranked){s[i], i};
    qsort(r, (size_t)n, sizeof *r, by_score);
    return r;
}

// Whether any computation within err[i] of each exact score s[i] must select the exact top k
// rk[0..k): every member beats every non-member by more than both bounds, or the two are of one
// class (cls: keys whose computed scores are bitwise identical, so the tie rule orders them as it
// orders the equal exact scores).
static int separated(const Ranked *rk, const double *err, const uint64_t *cls, int n, int k) {
    double lo = INFINITY, hi = -INFINITY;
    for (int r = 0; r < k; r++) lo = fmin(lo, rk[r].s - err[rk[r].id]);
    for (int r = k; r < n; r++) hi = fmax(hi, rk[r].s + err[rk[r].id]);
    if (lo > hi) return 1;
    for (int a = 0; a < k; a++) {
        int i = rk[a].id;
        if (rk[a].s - err[i] > hi) continue;
        for (int b = k; b < n; b++) {
            int j = rk[b].id;
            if (rk[a].s - err[i] > rk[b].s + err[j]) continue;
            if (!cls || cls[i] != cls[j]) return 0;
        }
    }
    return 1;
}

// ---- the store: one K cache per layer, NH KV heads ----

typedef struct {
    int D, n, ctx;
    float *k[NL];
    KVStore st[NL];
} Cache;

static void cache_init(Cache *c, Rng *r, int D, int n) {
    c->D = D, c->n = n, c->ctx = SINK + n + TAIL;
    for (int l = 0; l < NL; l++) {
        size_t m = (size_t)c->ctx * NH * D;
        c->k[l] = xcalloc(m, sizeof(float));
        // Sink and window rows of +-1000: read as a zone key (a slot off by the sink, a page or a
        // group read past the zone's end) they would top any ranking half the time.
        for (size_t i = 0; i < m; i++) c->k[l][i] = next_u64(r) & 1 ? 1000.0f : -1000.0f;
        kvstore_cpu_view(&c->st[l], c->k[l], c->k[l], NH, D); // V is never read by a selector
    }
}

static void cache_free(Cache *c) {
    for (int l = 0; l < NL; l++) free(c->k[l]);
}

static void cache_put(Cache *c, int l, int h, const float *keys, int n) {
    for (int i = 0; i < n; i++)
        memcpy(c->k[l] + ((size_t)(SINK + i) * NH + h) * c->D, keys + (size_t)i * c->D, (size_t)c->D * sizeof(float));
}

// Indexes slots [0, n): at once, or in uneven chunks as the zone grows (the first of 512 keys:
// kmeans learns its codebook from it; the others cut pages of 16 and groups of 32).
static void extend(Selector *s, Cache *c, int l, int h, int n, int chunked) {
    int cuts[] = {0, 512, 1301, 2047, n};
    if (!chunked || n <= 2047) cuts[1] = n;
    for (int i = 0; cuts[i] < n; i++) s->extend(s, l, h, &c->st[l], SINK, cuts[i], cuts[i + 1]);
}

// sel->select with budget k, and the interface's contract around it: at most k + 16 slots,
// strictly ascending, in [0, n); nothing written past out[k + 16]; nothing past scratch_bytes(n).
// Returns the count (slots copied to out), or -1 with the breach printed.
static int do_select(const Selector *s, int l, int h, const float *q, int n, int k, float beta, float rho, int *out) {
    size_t sb = s->scratch_bytes(s, n);
    unsigned char *scr = xcalloc(sb + 64, 1);
    memset(scr + sb, 0xA5, 64);
    int room = k + 16, *buf = xcalloc((size_t)room + 8, sizeof(int));
    for (int i = 0; i < room + 8; i++) buf[i] = -12345;
    SelectParams sp = {k, beta, rho};
    int m = s->select(s, l, h, q, n, &sp, scr, buf), ok = m >= 0 && m <= room;
    for (int i = 0; ok && i < m; i++) ok = buf[i] >= 0 && buf[i] < n && (i == 0 || buf[i] > buf[i - 1]);
    for (int i = room; i < room + 8; i++) ok &= buf[i] == -12345;
    for (size_t i = sb; i < sb + 64; i++) ok &= scr[i] == 0xA5;
    if (!ok) printf("     %s layer %d head %d k %d: %d slots, the output contract is broken\n", s->name, l, h, k, m);
    else memcpy(out, buf, (size_t)m * sizeof(int));
    free(scr), free(buf);
    return ok ? m : -1;
}

// Prints where two selections first differ; returns whether they are identical.
static int same_sel(const char *what, const int *got, int ng, const int *want, int nw) {
    if (ng == nw && memcmp(got, want, (size_t)nw * sizeof(int)) == 0) return 1;
    int i = 0;
    while (i < ng && i < nw && got[i] == want[i]) i++;
    printf("     %s: got %d slots, want %d; first difference at #%d (got %d, want %d)\n", what, ng, nw, i, i < ng ? got[i] : -1, i < nw ? want[i] : -1);
    return 0;
}

// ======================= the peers: a zone, its expected selection =======================

typedef struct {
    int D, n;
    float *keys; // (n, D), slot order
    float q[MAXD];
    double *model; // per key: the score the method is meant to compute, if not <q, k> (NULL: <q, k>)
    double *err;   // per key: a bound on |the selector's fp32 score - the expected score| (NULL: exact arithmetic)
    uint64_t *cls; // classes of keys whose computed scores are bitwise identical (NULL: none assumed)
    int margins;   // quest: the page bounds need margins (0: exact arithmetic)
    int model_ok;  // fier model: no 1-bit decision within rounding of its threshold
    double *err_buf, *model_buf;
    uint64_t *cls_buf;
} Zone;

typedef void (*GenFn)(Zone *z, Rng *r, const int *ks, int nk);
// The expected selection for budget k, ascending, into out; returns its size, or -1 when the
// data do not establish it (margins too small). *tie is set when equal exact scores straddle
// the budget's boundary (the tie rule decides).
typedef int (*WantFn)(const Zone *z, int k, int *out, int *tie);

static void zone_alloc(Zone *z, int D, int n) {
    memset(z, 0, sizeof *z);
    z->D = D, z->n = n;
    z->keys = xcalloc((size_t)n * D, sizeof(float));
    z->err_buf = xcalloc((size_t)n, sizeof(double));
    z->model_buf = xcalloc((size_t)n, sizeof(double));
    z->cls_buf = xcalloc((size_t)n, sizeof(uint64_t));
}

static void zone_free(Zone *z) { free(z->keys), free(z->err_buf), free(z->model_buf), free(z->cls_buf); }

static double dotd(const float *a, const float *b, int D) {
    double s = 0;
    for (int j = 0; j < D; j++) s += (double)a[j] * b[j];
    return s;
}

static double absdot(const float *a, const float *b, int D) {
    double s = 0;
    for (int j = 0; j < D; j++) s += fabs((double)a[j] * b[j]);
    return s;
}

// The exact top k by <q, k_i> (double: the products of floats are exact, the sums of D <= 128
// terms of the sizes used here within 2^-45 relative, far below every margin asserted), or by
// the zone's model score.
static int want_topk(const Zone *z, int k, int *out, int *tie) {
    int n = z->n;
    double *s = xcalloc((size_t)n, sizeof *s);
    for (int i = 0; i < n; i++) s[i] = z->model ? z->model[i] : dotd(z->q, z->keys + (size_t)i * z->D, z->D);
    Ranked *rk = rank_all(s, n);
    int ok = (!z->model || z->model_ok) && (!z->err || separated(rk, z->err, z->cls, n, k));
    if (k < n && rk[k - 1].s == rk[k].s) *tie = 1;
    for (int i = 0; i < k; i++) out[i] = rk[i].id;
    qsort(out, (size_t)k, sizeof(int), cmp_int);
    free(s), free(rk);
    return ok ? k : -1;
}

// Small integers: every product and partial sum is an integer below 2^24, so fp32 computes
// every score of every peer exactly, in any order. Many exact ties: the tie rule decides.
static float small_int(Rng *r, int lo, int hi) { return (float)(lo + (int)(next_u64(r) % (unsigned)(hi - lo + 1))); }

// ---- oracle ----

static void gen_oracle_int(Zone *z, Rng *r, const int *ks, int nk) {
    (void)ks, (void)nk;
    for (size_t i = 0; i < (size_t)z->n * z->D; i++) z->keys[i] = small_int(r, -2, 2);
    for (int j = 0; j < z->D; j++) z->q[j] = small_int(r, -3, 3);
    z->err = NULL, z->cls = NULL; // |score| <= 6 D: exact
}

// Anisotropic real-valued keys; then a staircase lift along q: a key gains h for every tested
// budget whose exact top-k holds it, which opens a gap of at least h at every tested boundary
// and keeps the order. The bound: oracle.c sums D fp32 products, so gamma_D sum |q_j k_j|.
static void gen_oracle_real(Zone *z, Rng *r, const int *ks, int nk) {
    int D = z->D, n = z->n;
    Shape ksh = make_shape(r, D, 4.0f), qsh = make_shape(r, D, 2.0f);
    draw(r, &qsh, D, z->q);
    for (int i = 0; i < n; i++) draw(r, &ksh, D, z->keys + (size_t)i * D);
    double *s = xcalloc((size_t)n, sizeof *s), qq = dotd(z->q, z->q, D), h = 1.0;
    for (int i = 0; i < n; i++) s[i] = dotd(z->q, z->keys + (size_t)i * D, D);
    Ranked *rk = rank_all(s, n);
    for (int rr = 0; rr < n; rr++) {
        int lift = 0;
        for (int t = 0; t < nk; t++) lift += rr < ks[t];
        float *k = z->keys + (size_t)rk[rr].id * D;
        for (int j = 0; j < D; j++) k[j] = (float)(k[j] + lift * h * z->q[j] / qq);
    }
    for (int i = 0; i < n; i++) z->err_buf[i] = gam(D) * absdot(z->q, z->keys + (size_t)i * D, D);
    z->err = z->err_buf, z->cls = NULL;
    free(s), free(rk);
}

// ---- quest ----

#define PAGE 16

static int page_len(int n, int p) { return n - p * PAGE < PAGE ? n - p * PAGE : PAGE; }

// Page bounds sum_j max(q_j min_j, q_j max_j) in double, and quest.c's fp32 error on them: D
// products and D - 1 additions, gamma_D times the sum of the terms' magnitudes.
static void page_bounds(const Zone *z, double *u, double *e) {
    int D = z->D, np = (z->n + PAGE - 1) / PAGE;
    for (int p = 0; p < np; p++) {
        double s = 0, a = 0;
        for (int j = 0; j < D; j++) {
            float mn = INFINITY, mx = -INFINITY;
            for (int t = 0; t < page_len(z->n, p); t++) {
                float x = z->keys[(size_t)(p * PAGE + t) * D + j];
                mn = fminf(mn, x), mx = fmaxf(mx, x);
            }
            double x = (double)z->q[j] * mn, y = (double)z->q[j] * mx;
            s += fmax(x, y), a += fmax(fabs(x), fabs(y));
        }
        u[p] = s, e[p] = gam(D) * a;
    }
}

// Pages best first (ties: the smaller page), taken until they hold k tokens, the last one cut
// to its first tokens; the result in slot order.
static int want_quest(const Zone *z, int k, int *out, int *tie) {
    int n = z->n, np = (n + PAGE - 1) / PAGE;
    double *u = xcalloc((size_t)np, sizeof *u), *e = xcalloc((size_t)np, sizeof *e);
    page_bounds(z, u, e);
    Ranked *rk = rank_all(u, np);
    int taken = 0, used = 0, cut = -1;
    while (taken < k) {
        int len = page_len(n, rk[used].id);
        if (taken + len > k) len = cut = k - taken;
        taken += len, used++;
    }
    int ok = 1;
    if (z->margins) { // the taken set above the rest; the cut page below the other taken ones
        double lo = INFINITY, hi = -INFINITY;
        for (int r = 0; r < used; r++) lo = fmin(lo, u[rk[r].id] - e[rk[r].id]);
        for (int r = used; r < np; r++) hi = fmax(hi, u[rk[r].id] + e[rk[r].id]);
        ok = lo > hi;
        for (int r = 0; cut >= 0 && r < used - 1; r++) ok &= u[rk[r].id] - e[rk[r].id] > u[rk[used - 1].id] + e[rk[used - 1].id];
    }
    if ((used < np && rk[used - 1].s == rk[used].s) || (cut >= 0 && used >= 2 && rk[used - 2].s == rk[used - 1].s)) *tie = 1;
    int *pages = xcalloc((size_t)used, sizeof(int)), last = rk[used - 1].id, m = 0;
    for (int r = 0; r < used; r++) pages[r] = rk[r].id;
    qsort(pages, (size_t)used, sizeof(int), cmp_int);
    for (int i = 0; i < used; i++) {
        int len = pages[i] == last && cut >= 0 ? cut : page_len(n, pages[i]);
        for (int t = 0; t < len; t++) out[m++] = pages[i] * PAGE + t;
    }
    free(u), free(e), free(rk), free(pages);
    return ok ? m : -1;
}

// Integer keys, pages in identical pairs (same keys, shuffled within the page: same bounds, so
// every boundary between the pair is decided by the tie rule), and the zone's short last page
// made the best, so that a page of fewer than 16 tokens is taken first.
static void gen_quest_int(Zone *z, Rng *r, const int *ks, int nk) {
    (void)ks, (void)nk;
    int D = z->D, n = z->n, full = n / PAGE;
    float amp[MAXD];
    for (int j = 0; j < D; j++) amp[j] = 0.5f + 2.5f * (float)uniform(r);
    for (int p = 0; p * PAGE < n; p++) {
        float a = p == full ? 6.0f : (float)(1 + next_u64(r) % 3);
        for (int t = 0; t < page_len(n, p); t++)
            for (int j = 0; j < D; j++) z->keys[(size_t)(p * PAGE + t) * D + j] = roundf(a * amp[j] * gauss(r));
    }
    for (int j = 0; j < D; j++) z->q[j] = small_int(r, -3, 3);
    int *perm = xcalloc((size_t)full, sizeof(int));
    for (int p = 0; p < full; p++) perm[p] = p;
    for (int p = full - 1; p > 0; p--) {
        int o = (int)(next_u64(r) % (unsigned)(p + 1)), t = perm[p];
        perm[p] = perm[o], perm[o] = t;
    }
    for (int i = 0; i + 1 < full; i += 2) {
        float *src = z->keys + (size_t)perm[i] * PAGE * D, *dst = z->keys + (size_t)perm[i + 1] * PAGE * D;
        int sh = 1 + (int)(next_u64(r) % (PAGE - 1));
        for (int t = 0; t < PAGE; t++) memcpy(dst + (size_t)t * D, src + (size_t)((t + sh) % PAGE) * D, (size_t)D * sizeof(float));
    }
    free(perm);
    z->err = NULL, z->cls = NULL, z->margins = 0; // |values| <= ~80, bounds < 2^24: exact
}

// Real-valued keys; the 10 best pages lifted along q in a staircase (every key of a page moved by
// c q / |q|^2 raises the page's bound by exactly c), opening gaps of at least c among them.
static void gen_quest_real(Zone *z, Rng *r, const int *ks, int nk) {
    (void)ks, (void)nk;
    int D = z->D, n = z->n, np = (n + PAGE - 1) / PAGE, R = 10;
    Shape ksh = make_shape(r, D, 4.0f), qsh = make_shape(r, D, 2.0f);
    draw(r, &qsh, D, z->q);
    for (int i = 0; i < n; i++) draw(r, &ksh, D, z->keys + (size_t)i * D);
    double *u = xcalloc((size_t)np, sizeof *u), *e = xcalloc((size_t)np, sizeof *e), qq = dotd(z->q, z->q, D), c = 4.0;
    page_bounds(z, u, e);
    Ranked *rk = rank_all(u, np);
    for (int rr = 0; rr < R; rr++)
        for (int t = 0, p = rk[rr].id; t < page_len(n, p); t++)
            for (int j = 0; j < D; j++) {
                float *x = z->keys + (size_t)(p * PAGE + t) * D + j;
                *x = (float)(*x + c * (R - rr) * z->q[j] / qq);
            }
    z->err = NULL, z->cls = NULL, z->margins = 1;
    free(u), free(e), free(rk);
}

// ---- fier ----

#define GROUP 32

// Per (group of 32, channel) the group's min and max over the zone's keys.
static void group_range(const Zone *z, int g, int j, float *lo, float *hi) {
    *lo = INFINITY, *hi = -INFINITY;
    for (int i = g * GROUP; i < z->n && i < (g + 1) * GROUP; i++) {
        float x = z->keys[(size_t)i * z->D + j];
        *lo = fminf(*lo, x), *hi = fmaxf(*hi, x);
    }
}

// Channel j of group g takes a or b: the group's first `one` tokens all one of them, the rest
// either. A group the zone grows into (the chunked extends cut groups at slots 1301 and 2047)
// then often has a single value in a channel before the cut and two after: its earlier keys
// must be quantized again.
static void fill_group(Zone *z, Rng *r, int g, int j, float a, float b) {
    int one = (int)(next_u64(r) % (GROUP + 1));
    float first = next_u64(r) & 1 ? a : b;
    for (int i = g * GROUP; i < z->n && i < (g + 1) * GROUP; i++) z->keys[(size_t)i * z->D + j] = i - g * GROUP < one ? first : next_u64(r) & 1 ? a : b;
}

// Two values per (group, channel): each key is exactly its own 1-bit code (min or max), so
// FIER's estimate is <q, k> itself. Integers: exactly, ties included.
static void gen_fier_int(Zone *z, Rng *r, const int *ks, int nk) {
    (void)ks, (void)nk;
    int D = z->D, n = z->n;
    for (int g = 0; g * GROUP < n; g++)
        for (int j = 0; j < D; j++) {
            float lo = small_int(r, -4, 3), hi = lo + small_int(r, 0, 3); // sometimes one value
            fill_group(z, r, g, j, lo, hi);
        }
    for (int j = 0; j < D; j++) z->q[j] = small_int(r, -3, 3);
    z->err = NULL, z->cls = NULL;
}

// fier.c's fp32 score against the exact base + sum over the set bits of q_j (hi_j - lo_j): base
// = sum q_j lo_j within gamma_D sum |q_j lo_j|; each d_j = q_j (hi_j - lo_j) within gamma_2, their
// sum over the set bits gamma_D more; the last addition u (|base| + |e|), below u times the same
// sums. All within 2 gamma_{D+3} (sum |q_j lo_j| + sum |q_j (hi_j - lo_j)|), lo, hi the group's.
static void fier_err(Zone *z) {
    int D = z->D;
    for (int i = 0; i < z->n; i++) {
        double a = 0;
        for (int j = 0; j < D; j++) {
            float lo, hi;
            group_range(z, i / GROUP, j, &lo, &hi);
            a += fabs((double)z->q[j] * lo) + fabs((double)z->q[j] * ((double)hi - lo));
        }
        z->err_buf[i] = 2 * gam(D + 3) * a;
    }
}

// Real two-valued groups, fier_err's bound. Redrawn (fixed seed) until every tested boundary
// is wider than the bounds.
static void gen_fier_real(Zone *z, Rng *r, const int *ks, int nk) {
    int D = z->D, n = z->n, *tmp = xcalloc((size_t)n, sizeof(int));
    for (int attempt = 0; attempt < 100; attempt++) {
        Shape sh = make_shape(r, D, 4.0f), qsh = make_shape(r, D, 2.0f);
        draw(r, &qsh, D, z->q);
        for (int g = 0; g * GROUP < n; g++)
            for (int j = 0; j < D; j++) {
                float lo = sh.scale[j] * gauss(r) + sh.offset[j], hi = lo + sh.scale[j] * (0.1f + fabsf(gauss(r)));
                fill_group(z, r, g, j, lo, hi);
            }
        fier_err(z);
        z->err = z->err_buf, z->cls = NULL, z->model = NULL;
        int ok = 1, tie = 0;
        for (int t = 0; t < nk && ok; t++) ok = want_topk(z, ks[t], tmp, &tie) >= 0;
        if (ok) break;
    }
    free(tmp);
}

// Any real keys: the model is FIER's estimate as its paper defines it, computed here in double:
// per (group of 32, channel) offset lo = min, scale hi - lo; a key's channel decodes to lo or hi,
// whichever is nearer (x - lo >= (hi - lo) / 2: the bit). fp32 evaluates each decision exactly
// as here when x is not within 2 u (|x| + |lo| + |hi|) of the midpoint: values closer than
// 1e-5 (|x| + |lo| + |hi|) are moved 1e-3 (hi - lo) up (still strictly inside the group's range).
// The sums: fier_err's bound. Redrawn until every tested boundary is wider than the bounds.
static void gen_fier_model(Zone *z, Rng *r, const int *ks, int nk) {
    int D = z->D, n = z->n, *tmp = xcalloc((size_t)n, sizeof(int));
    for (int attempt = 0; attempt < 100; attempt++) {
        Shape sh = make_shape(r, D, 4.0f), qsh = make_shape(r, D, 2.0f);
        draw(r, &qsh, D, z->q);
        for (int i = 0; i < n; i++) draw(r, &sh, D, z->keys + (size_t)i * D);
        z->model_ok = 1;
        for (int i = 0; i < n; i++) z->model_buf[i] = 0;
        for (int g = 0; g * GROUP < n; g++)
            for (int j = 0; j < D; j++) {
                float lo, hi;
                group_range(z, g, j, &lo, &hi);
                for (int i = g * GROUP; i < n && i < (g + 1) * GROUP; i++) {
                    float *x = z->keys + (size_t)i * D + j;
                    double mid = ((double)*x - lo) - 0.5 * ((double)hi - lo), near = 1e-5 * (fabs(*x) + fabs(lo) + fabs(hi));
                    if (fabs(mid) <= near) *x = (float)(lo + (0.5 + 1e-3) * ((double)hi - lo));
                    mid = ((double)*x - lo) - 0.5 * ((double)hi - lo);
                    z->model_ok &= fabs(mid) > near;
                    z->model_buf[i] += (double)z->q[j] * (mid >= 0 ? hi : lo);
                }
            }
        fier_err(z);
        z->err = z->err_buf, z->cls = NULL, z->model = z->model_buf;
        int ok = 1, tie = 0;
        for (int t = 0; t < nk && ok; t++) ok = want_topk(z, ks[t], tmp, &tie) >= 0;
        if (ok) break;
    }
    free(tmp);
}

// ---- kmeans ----

#define SUB 8
#define V 16 // distinct sub-vectors per subspace

// Each 8-dim subspace takes V distinct values. kmeans.c seeds its 256 centroids with the rows
// floor(j N / 256) of the first indexed chunk (N = 512 here: rows 0, 2, 4, ...); row 2j holds
// value (j + b) mod V, so every value is a seed. Each row is then at distance exactly 0 from a
// centroid equal to its value and > 0 from any other, the means of identical rows are that row
// (a double sum of at most 512 equal floats is exact), empty duplicates keep their value: the
// codebook is the value table exactly, and every later key's nearest centroid is its own value.
// The score is then the sum of <q_b, value> over subspaces: <q, k> up to rounding.
static void kmeans_fill(Zone *z, Rng *r, float (*table)[V][SUB]) {
    int D = z->D, n = z->n, M = D / SUB;
    for (int i = 0; i < n; i++) {
        uint64_t cls = 0;
        for (int b = 0; b < M; b++) {
            int v = i < 512 && i % 2 == 0 ? (i / 2 + b) % V : (int)(next_u64(r) % V);
            memcpy(z->keys + (size_t)i * D + b * SUB, table[b][v], sizeof table[b][v]);
            cls |= (uint64_t)v << (4 * b);
        }
        z->cls_buf[i] = cls;
    }
}

static void gen_kmeans_int(Zone *z, Rng *r, const int *ks, int nk) {
    (void)ks, (void)nk;
    int D = z->D, M = D / SUB;
    float table[MAXD / SUB][V][SUB];
    for (int b = 0; b < M; b++)
        for (int v = 0; v < V; v++) {
            int dup;
            do { // distinct integer vectors: two at distance >= 1
                for (int t = 0; t < SUB; t++) table[b][v][t] = small_int(r, -3, 3);
                dup = 0;
                for (int w = 0; w < v; w++) dup |= memcmp(table[b][v], table[b][w], sizeof table[b][v]) == 0;
            } while (dup);
        }
    kmeans_fill(z, r, table);
    for (int j = 0; j < D; j++) z->q[j] = small_int(r, -3, 3);
    z->err = NULL, z->cls = NULL; // integer centroids and lookups: exact
}

// Real values. kmeans.c: a lookup <q_b, c> of 8 products (gamma_8), then the sum of M lookups
// (gamma_M): within gamma_{8+M} sum |q_j k_j| (gamma_a + gamma_b + gamma_a gamma_b <= gamma_{a+b}).
// Keys with one tuple of values have bitwise-equal scores (one class). Redrawn until separated.
static void gen_kmeans_real(Zone *z, Rng *r, const int *ks, int nk) {
    int D = z->D, n = z->n, M = D / SUB, *tmp = xcalloc((size_t)n, sizeof(int));
    float table[MAXD / SUB][V][SUB];
    for (int attempt = 0; attempt < 100; attempt++) {
        Shape sh = make_shape(r, D, 4.0f), qsh = make_shape(r, D, 2.0f);
        for (int b = 0; b < M; b++)
            for (int v = 0; v < V; v++)
                for (int t = 0; t < SUB; t++) table[b][v][t] = sh.scale[b * SUB + t] * gauss(r) + sh.offset[b * SUB + t];
        double dmin = INFINITY; // distinct values, so that the nearest centroid is unambiguous
        for (int b = 0; b < M; b++)
            for (int v = 0; v < V; v++)
                for (int w = 0; w < v; w++) {
                    double d = 0;
                    for (int t = 0; t < SUB; t++) d += ((double)table[b][v][t] - table[b][w][t]) * ((double)table[b][v][t] - table[b][w][t]);
                    dmin = fmin(dmin, d);
                }
        if (dmin < 1e-2) continue;
        kmeans_fill(z, r, table);
        draw(r, &qsh, D, z->q);
        for (int i = 0; i < n; i++) z->err_buf[i] = gam(SUB + M) * absdot(z->q, z->keys + (size_t)i * D, D);
        z->err = z->err_buf, z->cls = z->cls_buf;
        int ok = 1, tie = 0;
        for (int t = 0; t < nk && ok; t++) ok = want_topk(z, ks[t], tmp, &tie) >= 0;
        if (ok) break;
    }
    free(tmp);
}

// ---- the driver ----

typedef struct {
    const char *name, *want_desc;
    Selector *(*make)(int n_layers, int n_kv_heads, int head_dim, int cap, char *err);
    GenFn gen;
    WantFn want;
    int D, n;
    int ks[8], nk;
    int chunk_all; // every zone indexed in chunks (kmeans: the codebook comes from the first 512)
    int need_tie;  // the data must put exact ties at some tested boundary
    unsigned long long seed;
} Scenario;

static void compare_zone(const Selector *s, const Scenario *sc, const Zone *z, int l, int h, int *ok, int *established, int *tie) {
    int *want = xcalloc((size_t)z->n + 32, sizeof(int)), *got = xcalloc((size_t)z->n + 32, sizeof(int));
    for (int t = 0; t < sc->nk; t++) {
        int k = sc->ks[t], nw = sc->want(z, k, want, tie);
        if (nw < 0) {
            *established = 0;
            continue;
        }
        int ng = do_select(s, l, h, z->q, z->n, k, 0.0f, 0.0f, got);
        char what[96];
        snprintf(what, sizeof what, "%s layer %d head %d k %d", sc->name, l, h, k);
        if (ng < 0 || !same_sel(what, got, ng, want, nw)) ok[t] = 0;
    }
    free(want), free(got);
}

static void drive(Selector *s, const Scenario *sc) {
    if (!s) {
        check(0, "%s: selector created", sc->name);
        return;
    }
    Rng r = {sc->seed};
    Cache c;
    cache_init(&c, &r, sc->D, sc->n);
    Zone z[NL][NH];
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) {
            zone_alloc(&z[l][h], sc->D, sc->n);
            sc->gen(&z[l][h], &r, sc->ks, sc->nk);
            cache_put(&c, l, h, z[l][h].keys, sc->n);
        }
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) extend(s, &c, l, h, sc->n, sc->chunk_all || (l == 1 && h == 1));
    int ok[8], established = 1, tie = 0;
    for (int t = 0; t < sc->nk; t++) ok[t] = 1;
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) compare_zone(s, sc, &z[l][h], l, h, ok, &established, &tie);
    // A new sequence on layer 0: reset, new keys; layer 1's index must be untouched.
    s->reset(s, 0);
    for (int h = 0; h < NH; h++) {
        sc->gen(&z[0][h], &r, sc->ks, sc->nk);
        cache_put(&c, 0, h, z[0][h].keys, sc->n);
        extend(s, &c, 0, h, sc->n, sc->chunk_all || h == 0);
    }
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) compare_zone(s, sc, &z[l][h], l, h, ok, &established, &tie);
    check(established, "%s: the known answer holds in every zone (%s)", sc->name,
          z[1][1].err || z[1][1].margins ? "every tested boundary wider than the fp32 error bounds" : "exact fp32 arithmetic on small integers");
    for (int t = 0; t < sc->nk; t++)
        check(ok[t], "%s, D %d, zone %d: k = %d selects %s, slot for slot (6 zones: 2 layers x 2 heads, layer 0 again after a reset)", sc->name, sc->D,
              sc->n, sc->ks[t], sc->want_desc);
    if (sc->need_tie) check(tie, "%s: equal exact scores straddle a tested budget's boundary (the tie rule is exercised)", sc->name);
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) zone_free(&z[l][h]);
    cache_free(&c);
    s->destroy(s);
}

static void test_peers(void) {
    char err[ATTN_ERR_LEN];
    // Zones of a few thousand; budgets 1, 16, 37 (not a multiple of a page), 100 and zone - 1.
    int n1 = 3001, n2 = 2995;
    Scenario sc[] = {
        {"oracle, integer keys", "the exact top-k (brute force, ties to the smaller slot)", selector_oracle, gen_oracle_int, want_topk, 64, n1, {1, 16, 37, 100, n1 - 1}, 5, 0, 1, 101},
        {"oracle, real keys", "the exact top-k (brute force in double)", selector_oracle, gen_oracle_real, want_topk, 40, n2, {1, 16, 37, 100, n2 - 1}, 5, 0, 0, 102},
        {"quest, integer keys", "the best pages by the exact min/max bound, the last cut", selector_quest, gen_quest_int, want_quest, 64, n1, {1, 16, 37, 100, n1 - 1}, 5, 0, 1, 103},
        {"quest, real keys", "the best pages by the min/max bound, the last cut", selector_quest, gen_quest_real, want_quest, 40, n2, {1, 16, 37, 100}, 4, 0, 0, 104},
        {"fier, integer two-valued groups", "the exact top-k (the 1-bit code is exact)", selector_fier, gen_fier_int, want_topk, 64, n1, {1, 16, 37, 100, n1 - 1}, 5, 0, 1, 105},
        {"fier, real two-valued groups", "the exact top-k (the 1-bit code is exact)", selector_fier, gen_fier_real, want_topk, 40, n2, {1, 16, 37, 100, n2 - 1}, 5, 0, 0, 106},
        {"fier, real keys", "the top-k of the 1-bit estimate (modeled in double)", selector_fier, gen_fier_model, want_topk, 64, n1, {1, 16, 37, 100, n1 - 1}, 5, 0, 0, 110},
        {"kmeans, integer 16-valued subspaces", "the exact top-k (the codebook is exact)", selector_kmeans, gen_kmeans_int, want_topk, 40, n1, {1, 16, 37, 100, n1 - 1}, 5, 1, 1, 107},
        {"kmeans, real 16-valued subspaces", "the exact top-k (the codebook is exact)", selector_kmeans, gen_kmeans_real, want_topk, 64, n2, {1, 16, 37, 100, n2 - 1}, 5, 1, 0, 108},
    };
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) drive(sc[i].make(NL, NH, sc[i].D, sc[i].n, err), &sc[i]);
}

// Streaming keeps nothing of the zone, whatever the budget.
static void test_streaming(void) {
    char err[ATTN_ERR_LEN];
    Selector *s = selector_streaming(err);
    Rng r = {109};
    int n = 3001, D = 64, ok = 1;
    Cache c;
    cache_init(&c, &r, D, n);
    float q[64];
    for (int j = 0; j < D; j++) q[j] = gauss(&r);
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) extend(s, &c, l, h, n, 1);
    int ks[] = {1, 16, 37, 100, n - 1, n, n + 5}, *out = xcalloc((size_t)n + 32, sizeof(int));
    for (int t = 0; t < 7; t++) ok &= do_select(s, 1, 1, q, n, ks[t], 0, 0, out) == 0;
    check(ok, "streaming: selects no zone slot for k = 1, 16, 37, 100, zone - 1, zone, zone + 5 (zone %d)", n);
    free(out), cache_free(&c), s->destroy(s);
}

// ======================= ParisKV =======================
//
// The answer is made known by building keys in the rotated domain (the SRHT with the selector's
// own signs, computed here in double), where the sign patterns (ids) are chosen and the
// estimate's error is bounded analytically:
//
// est = |q| sum_b w_b <v_b, qt_b>, w_b = |k| r_b / alpha_b, alpha_b = <v_b, u_b> (spec, steps 3-6).
// v_b / alpha_b - u_b is orthogonal to u_b, of length tan(theta_b), theta_b the angle between u_b
// and its 4-bit code v_b; so |k| r_b <v_b, qt_b> / alpha_b = |k| r_b (<u_b, qt_b> + e_b) with
// |e_b| <= tan(theta_b) |qt_b perp u_b|, and summed over b that is <k, q> / |q| plus the error.
// Per coordinate |u| - center[t] is at most 0.6901 - 0.6169 = 0.0732 except in the top bin,
// where it reaches 1 - 0.7633 = 0.2367, and only for |u| > 0.8365, which one coordinate of a unit
// vector can exceed: |v - u|^2 <= 0.2367^2 + 7 * 0.0732^2, sin(theta) <= |v - u| <= 0.3058,
// tan(theta) <= 0.322 < PKV_TAN. w is stored in fp16: a relative 2^-11 on each term. The fp32
// work (normalizing, rotating, the estimate's sums) is below 1e-5 relative to |q| |k| (D <= 128:
// log2 D butterfly stages on a unit vector, |error| <= (log2 D + 3) u sqrt(D)), covered by a
// slack of 1e-4 |q| |k|. So |est - <k, q>| <= |q| |k| (sum_b r_b (T p_b + 2^-11 (|c_b| + T p_b)) + 1e-4),
// c_b = <u_b, qt_b>, p_b = |qt_b perp u_b|.
#define PKV_TAN 0.33
#define PKV_SLACK 1e-4
// The same fp32 work moves a rotated coordinate by at most 1e-5 of the vector's norm: sign
// decisions (ids) and pattern rankings are taken as certain when their margins exceed 1e-4.
#define PKV_SURE 1e-4

static const int pkv_tier_pct[6] = {5, 15, 30, 50, 75, 100}; // the spec's r_t, in hundredths

static void fwht_d(double *x, int D) {
    for (int h = 1; h < D; h *= 2)
        for (int i = 0; i < D; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                double a = x[j], b = x[j + h];
                x[j] = a + b, x[j + h] = a - b;
            }
}

// y = H diag(s) x / sqrt(D), the spec's rotation; and its inverse x = diag(s) H y / sqrt(D).
static void rot_d(const float *s, const float *x, double *y, int D) {
    for (int j = 0; j < D; j++) y[j] = (double)s[j] * x[j];
    fwht_d(y, D);
    for (int j = 0; j < D; j++) y[j] /= sqrt((double)D);
}

static void unrot_d(const float *s, const double *y, float *x, int D) {
    double t[MAXD];
    memcpy(t, y, (size_t)D * sizeof(double));
    fwht_d(t, D);
    for (int j = 0; j < D; j++) x[j] = (float)(s[j] * t[j] / sqrt((double)D));
}

// What the spec says the selector does, in double from the very floats it is given.
typedef struct {
    int D, B, n;
    double qt[MAXD];
    uint8_t *ids;       // (n, B): [rotated coordinate >= 0] << j
    double *score, *err; // <k, q> and the bound on |est - <k, q>|
    double sure;        // the smallest |rotated coordinate| / norm over the keys (their ids' margin)
    double wmax;        // the largest w_b bound, |k| r_b / alpha_min (fp16 saturates at 65504)
} PkvRef;

static void pkv_ref(PkvRef *R, const float *s, const float *keys, const float *q, int D, int n) {
    R->D = D, R->B = D / 8, R->n = n, R->sure = INFINITY, R->wmax = 0;
    R->ids = xcalloc((size_t)n * R->B, 1);
    R->score = xcalloc((size_t)n, sizeof(double)), R->err = xcalloc((size_t)n, sizeof(double));
    double qn = sqrt(dotd(q, q, D)), y[MAXD];
    rot_d(s, q, R->qt, D);
    for (int j = 0; j < D; j++) R->qt[j] /= qn; // its signs matter only through the pattern ranking (ref_votes)
    for (int i = 0; i < n; i++) {
        const float *k = keys + (size_t)i * D;
        rot_d(s, k, y, D);
        double kn = 0, e = 0;
        for (int j = 0; j < D; j++) kn += y[j] * y[j];
        kn = sqrt(kn);
        for (int b = 0; b < R->B; b++) {
            double rb = 0, c = 0, qq = 0;
            for (int j = 0; j < 8; j++) rb += y[b * 8 + j] * y[b * 8 + j], qq += R->qt[b * 8 + j] * R->qt[b * 8 + j];
            rb = sqrt(rb);
            int id = 0;
            for (int j = 0; j < 8; j++) {
                id |= (y[b * 8 + j] >= 0) << j;
                c += y[b * 8 + j] / rb * R->qt[b * 8 + j];
                R->sure = fmin(R->sure, fabs(y[b * 8 + j]) / kn);
            }
            double p = sqrt(fmax(0.0, qq - c * c));
            e += rb / kn * (PKV_TAN * p + ldexp(1.0, -11) * (fabs(c) + PKV_TAN * p));
            // w_b = |k| (rb / |k|) / alpha_b, alpha_b >= |v| cos(theta) >= sqrt(8) 0.0420 sqrt(1 - 0.3058^2) > 0.113
            R->wmax = fmax(R->wmax, rb / 0.113);
            R->ids[(size_t)i * R->B + b] = (uint8_t)id;
        }
        R->score[i] = dotd(k, q, D);
        R->err[i] = qn * kn * (e + PKV_SLACK);
    }
}

static void pkv_ref_free(PkvRef *R) { free(R->ids), free(R->score), free(R->err); }

static long ceil_div(long a, long b) { return (a + b - 1) / b; }

// The spec's (beta, rho) in thousandths for a zone of n keys (the adaptive schedule).
static void schedule_milli(int n, int *beta, int *rho) {
    if (n < 5000) *beta = 500, *rho = 500;
    else if (n < 10000) *beta = 250, *rho = 300;
    else if (n < 30000) *beta = 200, *rho = 250;
    else *beta = 100, *rho = 200;
}

// The vote (spec, one decode step, 1): per subspace, the patterns ranked by <qt_b, c>; pattern c
// is in tier t while the keys of the patterns before it number < T_t = ceil(n rho r_t), taken
// over the decimal constants exactly (integers here). Returns 0 if two patterns that hold keys
// score within PKV_SURE (the selector's fp32 ranking could differ).
static int ref_votes(const PkvRef *R, int rho_milli, int *vote) {
    int B = R->B, n = R->n, sure = 1;
    long T[6];
    for (int t = 0; t < 6; t++) T[t] = ceil_div((long)n * rho_milli * pkv_tier_pct[t], 100000);
    int *count = xcalloc((size_t)B * 256, sizeof(int));
    uint8_t *bonus = xcalloc((size_t)B * 256, 1);
    for (int i = 0; i < n; i++)
        for (int b = 0; b < B; b++) count[b * 256 + R->ids[(size_t)i * B + b]]++;
    for (int b = 0; b < B; b++) {
        double sc[256];
        for (int c = 0; c < 256; c++) {
            sc[c] = 0;
            for (int j = 0; j < 8; j++) sc[c] += (c >> j) & 1 ? R->qt[b * 8 + j] : -R->qt[b * 8 + j];
        }
        for (int c = 0; c < 256; c++)
            for (int d = 0; d < c; d++) sure &= !(count[b * 256 + c] && count[b * 256 + d] && fabs(sc[c] - sc[d]) < PKV_SURE);
        Ranked *rk = rank_all(sc, 256);
        long before = 0;
        for (int r = 0; r < 256; r++) {
            int c = rk[r].id, tiers = 0;
            for (int t = 0; t < 6; t++) tiers += before < T[t];
            bonus[b * 256 + c] = (uint8_t)tiers;
            before += count[b * 256 + c];
        }
        free(rk);
    }
    for (int i = 0; i < n; i++) {
        vote[i] = 0;
        for (int b = 0; b < B; b++) vote[i] += bonus[b * 256 + R->ids[(size_t)i * B + b]];
    }
    free(count), free(bonus);
    return sure;
}

// The C best votes, ties to the smaller slot: mark[i] = 1 for the candidates.
static void ref_candidates(const int *vote, int n, int C, char *mark) {
    double *v = xcalloc((size_t)n, sizeof *v);
    for (int i = 0; i < n; i++) v[i] = vote[i], mark[i] = 0;
    Ranked *rk = rank_all(v, n);
    for (int r = 0; r < C && r < n; r++) mark[rk[r].id] = 1;
    free(v), free(rk);
}

// The top k by estimate among the candidates: the exact top k when the estimate intervals
// separate it (else -1). Ascending into out.
static int ref_rerank(const PkvRef *R, const char *mark, int k, int *out) {
    int n = R->n, m = 0;
    double *s = xcalloc((size_t)n, sizeof *s), *e = xcalloc((size_t)n, sizeof *e);
    int *id = xcalloc((size_t)n, sizeof(int));
    for (int i = 0; i < n; i++)
        if (mark[i]) s[m] = R->score[i], e[m] = R->err[i], id[m++] = i;
    Ranked *rk = rank_all(s, m);
    int ok = k <= m && separated(rk, e, NULL, m, k);
    for (int i = 0; i < k && i < m; i++) out[i] = id[rk[i].id];
    qsort(out, (size_t)(k < m ? k : m), sizeof(int), cmp_int);
    free(s), free(e), free(id), free(rk);
    return ok ? k : -1;
}

static int mark_list(const char *mark, int n, int *out) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (mark[i]) out[m++] = i;
    return m;
}

// A query whose rotated subspace b has coordinates +-a_b 2^pi_b(j): the 256 patterns' scores are
// a_b times distinct odd integers, no two closer than 2 a_b / |.|. Normalized; q = 2 SRHT^-1.
static void pkv_query(Rng *r, const float *s, int D, double *qt, float *q) {
    double nn = 0;
    for (int b = 0; b < D / 8; b++) {
        int pi[8];
        for (int j = 0; j < 8; j++) pi[j] = j;
        for (int j = 7; j > 0; j--) {
            int o = (int)(next_u64(r) % (unsigned)(j + 1)), t = pi[j];
            pi[j] = pi[o], pi[o] = t;
        }
        double a = 0.7 + 0.6 * uniform(r);
        for (int j = 0; j < 8; j++) qt[b * 8 + j] = (next_u64(r) & 1 ? a : -a) * ldexp(1.0, pi[j]), nn += qt[b * 8 + j] * qt[b * 8 + j];
    }
    for (int j = 0; j < D; j++) qt[j] /= sqrt(nn);
    double t[MAXD];
    for (int j = 0; j < D; j++) t[j] = 2.0 * qt[j];
    unrot_d(s, t, q, D);
}

// Planted keys: 100 exactly along q (rotated: R qt), norms 3 (1 + 0.01 t) times the largest
// background norm, so that their ids are q's best pattern in every subspace (vote 6B, the
// maximum) and their estimates, within 2^-11 of the truth, beat every background key's upper
// bound and are 1% apart. Decoys: 8 keys along qt in one subspace only, with a tiny part on the
// worst pattern in every other: vote 6, far below the candidates' cut, yet an exact score above
// every planted key: the oracle takes them, ParisKV's vote must not. Background: anisotropic
// keys, every rotated coordinate pushed to at least 2% of the norm (certain signs).
typedef struct {
    float *keys, q[MAXD];
    int planted[100], decoy[8];
} PkvZone;

static void pkv_planted_zone(PkvZone *pz, Rng *r, const float *s, int D, int n) {
    int B = D / 8, *perm = xcalloc((size_t)n, sizeof(int));
    double qt[MAXD], y[MAXD];
    pz->keys = xcalloc((size_t)n * D, sizeof(float));
    pkv_query(r, s, D, qt, pz->q);
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int o = (int)(next_u64(r) % (unsigned)(i + 1)), t = perm[i];
        perm[i] = perm[o], perm[o] = t;
    }
    Shape sh = make_shape(r, D, 4.0f);
    double bg = 0;
    for (int i = 108; i < n; i++) {
        float *k = pz->keys + (size_t)perm[i] * D;
        draw(r, &sh, D, k);
        rot_d(s, k, y, D);
        double nn = 0;
        for (int j = 0; j < D; j++) nn += y[j] * y[j];
        nn = sqrt(nn);
        for (int j = 0; j < D; j++)
            if (fabs(y[j]) < 0.02 * nn) y[j] = y[j] >= 0 ? 0.02 * nn : -0.02 * nn;
        unrot_d(s, y, k, D);
        bg = fmax(bg, sqrt(dotd(k, k, D)));
    }
    for (int t = 0; t < 100; t++) {
        pz->planted[t] = perm[t];
        double R = 3 * bg * (1 + 0.01 * t);
        for (int j = 0; j < D; j++) y[j] = R * qt[j];
        unrot_d(s, y, pz->keys + (size_t)perm[t] * D, D);
    }
    for (int d = 0; d < 8; d++) {
        pz->decoy[d] = perm[100 + d];
        int b0 = d % B;
        double R = 60 * bg, nb = 0;
        for (int j = 0; j < 8; j++) nb += qt[b0 * 8 + j] * qt[b0 * 8 + j];
        for (int j = 0; j < D; j++) y[j] = j / 8 == b0 ? R * qt[j] / sqrt(nb) : (qt[j] >= 0 ? -0.003 : 0.003) * R;
        unrot_d(s, y, pz->keys + (size_t)perm[100 + d] * D, D);
    }
    free(perm);
}

static void test_pariskv_planted(int D, int n, unsigned long long seed) {
    char err[ATTN_ERR_LEN];
    Selector *sel = selector_pariskv(NL, NH, D, n, err);
    if (!sel) {
        check(0, "pariskv D=%d: created (%s)", D, err);
        return;
    }
    float s[MAXD];
    srht_signs(SRHT_SEED, D, s); // the selector's signs (pariskv.c)
    Rng r = {seed};
    Cache c;
    cache_init(&c, &r, D, n);
    // Zones checked: (1, 1) indexed in chunks and (0, 0) at once; (0, 1) and (1, 0) hold other
    // keys. Then layer 0 is reset and gets new keys: (0, 0) is checked again, (1, 1) must not change.
    PkvZone pz[2], other;
    int at[2][2] = {{1, 1}, {0, 0}};
    for (int z = 0; z < 2; z++) {
        pkv_planted_zone(&pz[z], &r, s, D, n);
        cache_put(&c, at[z][0], at[z][1], pz[z].keys, n);
    }
    pkv_planted_zone(&other, &r, s, D, n);
    cache_put(&c, 0, 1, other.keys, n), cache_put(&c, 1, 0, other.keys, n);
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NH; h++) extend(sel, &c, l, h, n, l == 1 && h == 1);
    int bm, rm, *vote = xcalloc((size_t)n, sizeof(int)), *want = xcalloc((size_t)n + 32, sizeof(int)), *got = xcalloc((size_t)n + 32, sizeof(int));
    char *mark = xcalloc((size_t)n, 1);
    schedule_milli(n, &bm, &rm);
    int C = (int)ceil_div((long)n * bm, 1000), ks[3] = {16, 37, 100};
    int design = 1, established = 1, ok_k[3] = {1, 1, 1}, ok_b1 = 1, ok_cand = 1, ok_cand2 = 1, ok_min = 1, ok_last = 1;
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 1) { // a new sequence on layer 0
            sel->reset(sel, 0);
            free(pz[1].keys);
            pkv_planted_zone(&pz[1], &r, s, D, n);
            cache_put(&c, 0, 0, pz[1].keys, n);
            extend(sel, &c, 0, 0, n, 1);
            extend(sel, &c, 0, 1, n, 0);
        }
        for (int z = 0; z < 2; z++) {
            int l = at[z][0], h = at[z][1];
            PkvRef R;
            pkv_ref(&R, s, pz[z].keys, pz[z].q, D, n);
            design &= R.sure > PKV_SURE && R.wmax < 65504;
            design &= ref_votes(&R, rm, vote);
            ref_candidates(vote, n, C, mark);
            // planted keys all candidates, decoys none, and the decoys' exact scores above the planted
            double pmax = -INFINITY, dmin = INFINITY;
            for (int t = 0; t < 100; t++) design &= mark[pz[z].planted[t]] == 1, pmax = fmax(pmax, R.score[pz[z].planted[t]]);
            for (int d = 0; d < 8; d++) design &= mark[pz[z].decoy[d]] == 0, dmin = fmin(dmin, R.score[pz[z].decoy[d]]);
            design &= dmin > pmax;
            // k below the planted count: the k largest planted keys
            for (int t = 0; t < 3; t++) {
                int k = ks[t], nw = ref_rerank(&R, mark, k, want), ng = do_select(sel, l, h, pz[z].q, n, k, 0, 0, got);
                int byn[100], m = 0; // the design's answer: planted t >= 100 - k
                for (int p = 100 - k; p < 100; p++) byn[m++] = pz[z].planted[p];
                qsort(byn, (size_t)m, sizeof(int), cmp_int);
                if (nw < 0) established = 0;
                else design &= memcmp(byn, want, (size_t)k * sizeof(int)) == 0;
                char what[80];
                snprintf(what, sizeof what, "pariskv D %d zone (%d,%d) k %d", D, l, h, k);
                ok_k[t] &= nw >= 0 && ng >= 0 && same_sel(what, got, ng, want, nw);
            }
            // beta = 1: every key a candidate; the 108 best estimates are the planted and the decoys
            char *all = xcalloc((size_t)n, 1);
            memset(all, 1, (size_t)n);
            int nw = ref_rerank(&R, all, 108, want), ng = do_select(sel, l, h, pz[z].q, n, 108, 1.0f, 0.5f, got);
            if (nw < 0) established = 0;
            ok_b1 &= nw >= 0 && ng >= 0 && same_sel("pariskv beta 1", got, ng, want, nw);
            free(all);
            // k = C: the whole candidate set comes back, whatever the estimates (schedule; then beta 0.3, rho 0.7)
            nw = mark_list(mark, n, want), ng = do_select(sel, l, h, pz[z].q, n, C, 0, 0, got);
            ok_cand &= ng >= 0 && same_sel("pariskv candidates", got, ng, want, nw);
            int C2 = (int)ceil_div((long)n * 300, 1000);
            design &= ref_votes(&R, 700, vote);
            ref_candidates(vote, n, C2, mark);
            nw = mark_list(mark, n, want), ng = do_select(sel, l, h, pz[z].q, n, C2, 0.3f, 0.7f, got);
            ok_cand2 &= ng >= 0 && same_sel("pariskv candidates beta 0.3 rho 0.7", got, ng, want, nw);
            // C is never below k: beta 0.01 leaves ceil(0.01 n) < 100 = k, so the 100 best votes come back
            ref_votes(&R, 500, vote);
            ref_candidates(vote, n, 100, mark);
            nw = mark_list(mark, n, want), ng = do_select(sel, l, h, pz[z].q, n, 100, 0.01f, 0.5f, got);
            ok_min &= ng >= 0 && same_sel("pariskv C = k", got, ng, want, nw);
            // k = zone - 1: all but the worst vote (ties: the larger slot goes)
            ref_votes(&R, rm, vote);
            ref_candidates(vote, n, n - 1, mark);
            nw = mark_list(mark, n, want), ng = do_select(sel, l, h, pz[z].q, n, n - 1, 0, 0, got);
            ok_last &= ng >= 0 && same_sel("pariskv k = zone - 1", got, ng, want, nw);
            pkv_ref_free(&R);
        }
    }
    const char *where = "2 layers x 2 heads, one zone indexed in chunks, layer 0 again after a reset";
    check(design, "pariskv D %d zone %d: construction holds (ids certain, pattern ranking unambiguous, w below fp16's max; planted keys all candidates, decoys none, decoys above the planted by exact score)", D, n);
    check(established, "pariskv D %d zone %d: estimate bounds separate the expected top-k (the known answer holds)", D, n);
    for (int t = 0; t < 3; t++)
        check(ok_k[t], "pariskv D %d zone %d: k = %d selects exactly the %d largest planted keys (decoys rejected by the vote; %s)", D, n, ks[t], ks[t], where);
    check(ok_b1, "pariskv D %d zone %d: beta = 1 (all candidates), k = 108 selects the planted keys and the decoys", D, n);
    check(ok_cand, "pariskv D %d zone %d: k = C = ceil(beta n) = %d returns the brute-force candidate set (vote, 6 tiers, ties to the smaller slot), schedule beta %.2f rho %.2f (%s)", D, n, C,
          bm / 1000.0, rm / 1000.0, where);
    check(ok_cand2, "pariskv D %d zone %d: the same with fixed beta 0.3, rho 0.7", D, n);
    check(ok_min, "pariskv D %d zone %d: beta 0.01 gives C = k = 100: the 100 best votes come back", D, n);
    check(ok_last, "pariskv D %d zone %d: k = zone - 1 returns all but the worst vote", D, n);
    free(vote), free(want), free(got), free(mark);
    for (int z = 0; z < 2; z++) free(pz[z].keys);
    free(other.keys), cache_free(&c), sel->destroy(sel);
}

// A zone whose keys all share one sign pattern per subspace: every vote is 6B, so the candidates
// are exactly the first C slots (ties to the smaller slot). Two strong keys (norm x10 at slot
// lo, x12 at slot lo + 1) along q's orthant make lo and lo + 1 the only possible top-1: with
// lo = C - 1, ParisKV must answer lo (lo + 1 is not a candidate). Checks C = ceil(beta n) of the
// decimal beta exactly, and C = k when that is below k (then slots [0, k) come back).
static void pkv_same_pattern_zone(Rng *r, const float *s, int D, int n, int lo, float *keys, float *q) {
    double y[MAXD], qt[MAXD], sg[MAXD];
    for (int j = 0; j < D; j++) sg[j] = next_u64(r) & 1 ? 1.0 : -1.0;
    for (int j = 0; j < D; j++) qt[j] = gauss(r);
    unrot_d(s, qt, q, D);
    for (int i = 0; i < n; i++) {
        double big = i == lo ? 10 : i == lo + 1 ? 12 : 1;
        for (int j = 0; j < D; j++) {
            double m = big > 1 ? fmax(0.05, sg[j] * qt[j] / 3) : 0.05 + 0.95 * uniform(r);
            y[j] = big * sg[j] * m;
        }
        unrot_d(s, y, keys + (size_t)i * D, D);
    }
}

static void test_pariskv_candidate_count(void) {
    char err[ATTN_ERR_LEN];
    int D = 64;
    float s[MAXD], q[MAXD];
    srht_signs(SRHT_SEED, D, s);
    struct {
        int n, k, beta_milli; // beta_milli 0: the schedule
        float beta;
    } cs[] = {{3000, 1, 500, 0.5f}, {3000, 1, 250, 0.25f}, {3001, 1, 200, 0.2f}, {3000, 1, 200, 0.2f}, {3000, 1, 100, 0.1f},
              {3000, 40, 10, 0.01f}, {6000, 1, 0, 0}, {10000, 1, 0, 0}};
    Rng r = {201};
    for (size_t t = 0; t < sizeof cs / sizeof cs[0]; t++) {
        int n = cs[t].n, bm = cs[t].beta_milli, rm;
        if (!bm) schedule_milli(n, &bm, &rm);
        int C = (int)ceil_div((long)n * bm, 1000), Ck = C > cs[t].k ? C : cs[t].k;
        Selector *sel = selector_pariskv(1, 1, D, n, err);
        Cache c;
        cache_init(&c, &r, D, n);
        float *keys = xcalloc((size_t)n * D, sizeof(float));
        pkv_same_pattern_zone(&r, s, D, n, Ck - 1, keys, q);
        cache_put(&c, 0, 0, keys, n);
        extend(sel, &c, 0, 0, n, 1);
        PkvRef R;
        pkv_ref(&R, s, keys, q, D, n);
        int *vote = xcalloc((size_t)n, sizeof(int)), *want = xcalloc((size_t)n + 32, sizeof(int)), *got = xcalloc((size_t)n + 32, sizeof(int));
        char *mark = xcalloc((size_t)n, 1);
        int design = R.sure > PKV_SURE && ref_votes(&R, 500, vote);
        for (int i = 0; i < n; i++) design &= vote[i] == 6 * (D / 8);
        ref_candidates(vote, n, Ck, mark);
        int nw = cs[t].k == 1 ? ref_rerank(&R, mark, 1, want) : mark_list(mark, n, want);
        design &= nw >= 0 && (cs[t].k == 1 ? want[0] == Ck - 1 : nw == Ck && want[nw - 1] == Ck - 1);
        int ng = do_select(sel, 0, 0, q, n, cs[t].k, cs[t].beta, 0.5f, got);
        char what[64];
        snprintf(what, sizeof what, "pariskv C n %d beta %.3f", n, bm / 1000.0);
        int ok = design && ng >= 0 && same_sel(what, got, ng, want, nw);
        if (cs[t].k == 1)
            check(ok, "pariskv candidate count: zone %d, beta %.2f%s: C = ceil(beta n) = %d exactly (slot %d, the C-th by vote, is chosen; slot %d, stronger, is not a candidate)", n,
                  bm / 1000.0, cs[t].beta > 0 ? "" : " (schedule)", C, Ck - 1, Ck);
        else
            check(ok, "pariskv candidate count: zone %d, beta %.2f, k = %d: C = max(ceil(beta n), k) = %d: slots [0, %d) come back", n, bm / 1000.0, cs[t].k, Ck, Ck);
        pkv_ref_free(&R), free(vote), free(want), free(got), free(mark), free(keys), cache_free(&c), sel->destroy(sel);
    }
}

// The tier targets T_t = ceil(n rho r_t) at a boundary: in subspace 0, exactly T_t keys (group A)
// hold q's best pattern, so the second pattern's keys (B) see exactly T_t before them and are in
// 5 - t tiers, not 6 - t; the third pattern's keys (D, at smaller slots than B) are in 5 - t too,
// the rest (E) in fewer. Every other subspace: one pattern for all keys (the same bonus). So the
// C = |A| + |D| best votes are A and D; were T_t one larger, B would outvote D.
static void test_pariskv_tiers(void) {
    char err[ATTN_ERR_LEN];
    int D = 64, B = 8, n = 3000, rho_milli = 500;
    float s[MAXD], q[MAXD];
    srht_signs(SRHT_SEED, D, s);
    long T[6];
    for (int t = 0; t < 6; t++) T[t] = ceil_div((long)n * rho_milli * pkv_tier_pct[t], 100000);
    Rng r = {301};
    for (int t = 0; t < 5; t++) {
        int nA = (int)T[t], gap = (int)(T[t + 1] - T[t]), nB = gap / 2, nD = gap - nB + 1;
        double qt[MAXD], y[MAXD], sg[MAXD];
        pkv_query(&r, s, D, qt, q);
        for (int j = 0; j < D; j++) sg[j] = next_u64(&r) & 1 ? 1.0 : -1.0;
        // subspace 0's patterns by rank: best = signs of qt; 2nd: the weight-1 coordinate flipped; 3rd: the weight-2 one
        int j1 = 0, j2 = 0;
        for (int j = 0; j < 8; j++) {
            if (fabs(qt[j]) < fabs(qt[j1])) j1 = j;
        }
        j2 = j1 == 0 ? 1 : 0;
        for (int j = 0; j < 8; j++)
            if (j != j1 && fabs(qt[j]) < fabs(qt[j2])) j2 = j;
        int *grp = xcalloc((size_t)n, sizeof(int)), *perm = xcalloc((size_t)n, sizeof(int));
        for (int i = 0; i < n; i++) perm[i] = i;
        for (int i = n - 1; i > 0; i--) {
            int o = (int)(next_u64(&r) % (unsigned)(i + 1)), x = perm[i];
            perm[i] = perm[o], perm[o] = x;
        }
        for (int i = 0; i < n; i++) grp[perm[i]] = i < nA ? 0 : i < nA + nB + nD ? 1 : 3; // 1: B or D
        for (int i = 0, m = 0; i < n; i++) // the first nD slots of B + D are D
            if (grp[i] == 1) grp[i] = m++ < nD ? 2 : 1;
        float *keys = xcalloc((size_t)n * D, sizeof(float));
        for (int i = 0; i < n; i++) {
            for (int j = 8; j < D; j++) y[j] = sg[j] * (0.05 + 0.95 * uniform(&r));
            int pat[8];
            for (int j = 0; j < 8; j++) pat[j] = qt[j] >= 0 ? 1 : -1;
            if (grp[i] == 1) pat[j1] = -pat[j1];
            else if (grp[i] == 2) pat[j2] = -pat[j2];
            else if (grp[i] == 3) { // a pattern ranked 4th or lower: flip the weight-1 and weight-2 coordinates, and maybe more
                pat[j1] = -pat[j1], pat[j2] = -pat[j2];
                for (int j = 0; j < 8; j++)
                    if (j != j1 && j != j2 && next_u64(&r) % 3 == 0) pat[j] = -pat[j];
            }
            for (int j = 0; j < 8; j++) y[j] = pat[j] * (0.05 + 0.95 * uniform(&r));
            unrot_d(s, y, keys + (size_t)i * D, D);
        }
        Selector *sel = selector_pariskv(1, 1, D, n, err);
        Cache c;
        cache_init(&c, &r, D, n);
        cache_put(&c, 0, 0, keys, n);
        extend(sel, &c, 0, 0, n, 1);
        PkvRef R;
        pkv_ref(&R, s, keys, q, D, n);
        int *vote = xcalloc((size_t)n, sizeof(int)), *want = xcalloc((size_t)n + 32, sizeof(int)), *got = xcalloc((size_t)n + 32, sizeof(int));
        char *mark = xcalloc((size_t)n, 1);
        int k = nA + nD, design = R.sure > PKV_SURE && ref_votes(&R, rho_milli, vote);
        for (int i = 0; i < n; i++) { // subspace 0's bonus (6 in every other): A 6, B and D 5 - t, E less
            int v0 = vote[i] - 6 * (B - 1);
            design &= grp[i] == 0 ? v0 == 6 : grp[i] == 3 ? v0 < 5 - t : v0 == 5 - t;
        }
        ref_candidates(vote, n, k, mark);
        for (int i = 0; i < n; i++) design &= mark[i] == (grp[i] == 0 || grp[i] == 2);
        int nw = mark_list(mark, n, want), ng = do_select(sel, 0, 0, q, n, k, 0.001f, 0.5f, got);
        check(design && ng >= 0 && same_sel("pariskv tiers", got, ng, want, nw),
              "pariskv tier %d target T = ceil(%d x 0.5 x %.2f) = %ld exactly: the keys behind exactly T keys are in %d tiers (candidates = A + D, %d slots)", t, n,
              pkv_tier_pct[t] / 100.0, T[t], 5 - t, k);
        pkv_ref_free(&R), free(vote), free(want), free(got), free(mark), free(keys), free(grp), free(perm), cache_free(&c), sel->destroy(sel);
    }
}

int main(void) {
    test_peers();
    test_streaming();
    test_pariskv_planted(64, 3001, 401);
    test_pariskv_planted(128, 6007, 402);
    test_pariskv_candidate_count();
    test_pariskv_tiers();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
