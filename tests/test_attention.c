// Dense CPU attention (attention/dense.c over attend_rows.c's blocks) against a double-precision
// reference with a bound from the arithmetic, and the bit-for-bit properties the policies rely
// on: a decode query alone equals the same query inside a chunk, any thread count gives the same
// numbers, and rows given by scattered pointers give what the contiguous cache gives.
#include "../attention/attention.h"
#include "test_pariskv_util.h"
#include "../model/pool.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int H, Hkv, hd, n; // n cached positions
    float *k, *v, *q;  // k, v (n, Hkv * hd); q (n, H * hd): a query per position
} Case;

static Case make_case(Rng *r, int H, int Hkv, int hd, int n, float qscale) {
    Case c = {H, Hkv, hd, n, NULL, NULL, NULL};
    size_t kv = (size_t)n * Hkv * hd, qn = (size_t)n * H * hd;
    c.k = malloc(kv * sizeof(float)), c.v = malloc(kv * sizeof(float)), c.q = malloc(qn * sizeof(float));
    for (size_t i = 0; i < kv; i++) c.k[i] = gauss(r), c.v[i] = gauss(r);
    for (size_t i = 0; i < qn; i++) c.q[i] = qscale * gauss(r);
    return c;
}

static void free_case(Case *c) { free(c->k), free(c->v), free(c->q); }

static float *scratch_for(const Case *c) {
    return calloc(attention_dense_scratch(&pool_parallel, c->H, c->Hkv, c->hd, c->n), sizeof(float));
}

static double gamma_n(double n) { // n unit roundoffs, as in Higham's gamma_n
    double u = FLT_EPSILON / 2;
    return n * u / (1 - n * u);
}

// Query at position p (the cache holds 0..p) in double, and the error bound of the fp32 result:
// scores within gamma_hd * scale * sum|q_j k_j| (their exponentials inherit it relatively, twice
// across numerator and denominator), the weighted sums of <= ATT_BLOCK rows and the merge of the
// blocks within gamma(ATT_BLOCK + blocks) relatively, exp itself within 2 ulp (test_softmax_exp):
// all times max |v| (the output is a convex combination of V rows).
static double check_query(const Case *c, int p, const float *out, double *worst_ratio) {
    int hd = c->hd, G = c->H / c->Hkv, n = p + 1, nb = (n + ATT_BLOCK - 1) / ATT_BLOCK, kvd = c->Hkv * hd;
    double scale = 1.0 / sqrt((double)hd), worst = 0.0, vmax = 0.0, *w = malloc((size_t)n * sizeof(double));
    for (size_t i = 0; i < (size_t)n * kvd; i++) vmax = fabs(c->v[i]) > vmax ? fabs(c->v[i]) : vmax;
    for (int h = 0; h < c->H; h++) {
        const float *q = c->q + ((size_t)p * c->H + h) * hd;
        int kh = h / G;
        double mx = -INFINITY, sum = 0.0, abs_dot = 0.0;
        for (int i = 0; i < n; i++) {
            const float *k = c->k + (size_t)i * kvd + (size_t)kh * hd;
            double s = 0.0, a = 0.0;
            for (int j = 0; j < hd; j++) s += (double)q[j] * k[j], a += fabs((double)q[j] * k[j]);
            w[i] = s * scale;
            if (w[i] > mx) mx = w[i];
            if (a * scale > abs_dot) abs_dot = a * scale;
        }
        for (int i = 0; i < n; i++) w[i] = exp(w[i] - mx), sum += w[i];
        double eps = FLT_EPSILON / 2, rel = 2 * (gamma_n(hd) * abs_dot + 2 * eps) + 2 * gamma_n(ATT_BLOCK + nb) + 8 * eps;
        for (int j = 0; j < hd; j++) {
            double ref = 0.0;
            for (int i = 0; i < n; i++) ref += w[i] * c->v[(size_t)i * kvd + (size_t)kh * hd + j];
            ref /= sum;
            double d = fabs(out[(size_t)h * hd + j] - ref);
            if (d > worst) worst = d;
            if (d / (rel * vmax) > *worst_ratio) *worst_ratio = d / (rel * vmax);
        }
    }
    free(w);
    return worst;
}

// Every shape: decode queries at chosen positions against the reference, then the bit-for-bit properties.
static void run_case(Rng *r, int H, int Hkv, int hd, int n, float qscale) {
    Case c = make_case(r, H, Hkv, hd, n, qscale);
    float *sc = scratch_for(&c);
    size_t row = (size_t)H * hd;
    float *alone = malloc(row * sizeof(float)), *chunk = malloc((size_t)n * row * sizeof(float));
    int positions[] = {0, 1, ATT_BLOCK - 2, ATT_BLOCK - 1, ATT_BLOCK, n / 2, n - 1};
    double worst = 0.0, ratio = 0.0;
    int same_chunk = 1;
    attention_dense(&pool_parallel, chunk, c.q, c.k, c.v, 0, n, H, Hkv, hd, sc); // the whole sequence as one chunk
    for (size_t i = 0; i < sizeof positions / sizeof *positions; i++) {
        int p = positions[i];
        if (p < 0 || p >= n) continue;
        attention_dense(&pool_parallel, alone, c.q + (size_t)p * row, c.k, c.v, p, 1, H, Hkv, hd, sc);
        double d = check_query(&c, p, alone, &ratio);
        if (d > worst) worst = d;
        if (memcmp(alone, chunk + (size_t)p * row, row * sizeof(float))) same_chunk = 0;
    }
    check(ratio <= 1.0, "H %d / Hkv %d, head_dim %d, %d positions, |q| x%.0f: within the arithmetic's bound of the double reference (max diff %.2e, %.1e of the bound)",
          H, Hkv, hd, n, qscale, worst, ratio);
    check(same_chunk, "H %d / Hkv %d, head_dim %d, %d positions: a decode query alone == the same query in a chunk, bit for bit", H, Hkv, hd, n);

    // Thread counts: the last query (split over threads by blocks) and a chunk of 5.
    int nt = pool_max_threads(), same_threads = 1, p = n - 1, t0 = n > 5 ? n - 5 : 0;
    float *ref1 = malloc(row * sizeof(float)), *refc = malloc((size_t)5 * row * sizeof(float)), *o = malloc((size_t)5 * row * sizeof(float));
    for (int t = 1; t <= 3; t++) {
        pool_set_threads(t);
        attention_dense(&pool_parallel, o, c.q + (size_t)p * row, c.k, c.v, p, 1, H, Hkv, hd, sc);
        if (t == 1) memcpy(ref1, o, row * sizeof(float));
        else if (memcmp(ref1, o, row * sizeof(float))) same_threads = 0;
        attention_dense(&pool_parallel, o, c.q + (size_t)t0 * row, c.k, c.v, t0, n - t0, H, Hkv, hd, sc);
        if (t == 1) memcpy(refc, o, (size_t)(n - t0) * row * sizeof(float));
        else if (memcmp(refc, o, (size_t)(n - t0) * row * sizeof(float))) same_threads = 0;
    }
    pool_set_threads(nt);
    check(same_threads, "H %d / Hkv %d, head_dim %d, %d positions: 1, 2 and 3 threads give the same output, bit for bit", H, Hkv, hd, n);

    // The rows through pointers into a scattered copy (as a policy gathers them) == the cache.
    int G = H / Hkv, same_rows = 1;
    const float **kr = malloc((size_t)n * sizeof *kr), **vr = malloc((size_t)n * sizeof *vr);
    float *copy = malloc((size_t)2 * n * hd * sizeof(float)), *rs = calloc(attend_rows_scratch(hd, n), sizeof(float));
    for (int kh = 0; kh < Hkv; kh++) {
        for (int i = 0; i < n; i++) { // reversed placement: row i lives at slot n - 1 - i
            float *kk = copy + (size_t)(n - 1 - i) * hd, *vv = copy + (size_t)(2 * n - 1 - i) * hd;
            memcpy(kk, c.k + (size_t)i * Hkv * hd + (size_t)kh * hd, (size_t)hd * sizeof(float));
            memcpy(vv, c.v + (size_t)i * Hkv * hd + (size_t)kh * hd, (size_t)hd * sizeof(float));
            kr[i] = kk, vr[i] = vv;
        }
        for (int g0 = 0; g0 < G; g0 += ATT_SUB) {
            int g = G - g0 < ATT_SUB ? G - g0 : ATT_SUB;
            size_t h = (size_t)kh * G + g0;
            attend_rows(o, c.q + (size_t)p * row + h * hd, g, hd, kr, vr, n, rs);
            if (memcmp(o, ref1 + h * hd, (size_t)g * hd * sizeof(float))) same_rows = 0;
        }
    }
    check(same_rows, "H %d / Hkv %d, head_dim %d, %d positions: attend_rows over scattered rows == dense, bit for bit", H, Hkv, hd, n);
    free(kr), free(vr), free(copy), free(rs), free(ref1), free(refc), free(o);
    free(alone), free(chunk), free(sc);
    free_case(&c);
}

int main(void) {
    pool_set_max_threads(3); // the thread-count check runs 1, 2 and 3 threads on any machine
    Rng r = {2026};
    run_case(&r, 9, 3, 64, 700, 1.0f);    // SmolLM2's heads, three blocks
    run_case(&r, 8, 2, 128, 1100, 1.0f);  // Llama/Qwen head_dim, groups of 4
    run_case(&r, 12, 1, 64, 300, 1.0f);   // a group wider than ATT_SUB: two sub-groups
    run_case(&r, 4, 4, 48, 520, 1.0f);    // head_dim off the vector paths
    run_case(&r, 6, 3, 80, 257, 1.0f);    // head_dim a multiple of 16 but not of 64
    run_case(&r, 9, 3, 64, 2100, 3.0f);   // sharper attention (scores up to ~25), nine blocks
    run_case(&r, 2, 1, 64, 1, 1.0f);      // one position
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
