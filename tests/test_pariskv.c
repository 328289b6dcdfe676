// ParisKV's math, piece by piece, each against an independent computation: the SRHT, the ids,
// the 4-bit codes, fp16, the calibrated estimator (and what alpha buys), the tier bonus, the
// bucket top-C and the top-k. Deterministic: every input comes from a fixed-seed generator.
#include "../attention/pariskv.h"
#include "../attention/selector.h"
#include "../attention/srht.h"
#include "test_pariskv_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// fp32 unit roundoff: every float bound below is a multiple of it.
#define U32 ldexp(1.0, -24)

static double dotd(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static void test_srht(void) {
    Rng r = {1};
    for (int D = 8; D <= 128; D *= 4) { // 8, 32, 128
        float s[128], x[128], y[128], xs[128], ys[128];
        srht_signs(SRHT_SEED, D, s);
        // Against the explicit matrix: H_ij = (-1)^popcount(i & j) (Sylvester order).
        for (int j = 0; j < D; j++) x[j] = gauss(&r);
        memcpy(xs, x, sizeof xs);
        srht_apply(xs, s, D);
        // fp32 butterflies: log2(D) stages of one rounding each, then the 1/sqrt(D) scale, each
        // relative to the sum of magnitudes flowing into the output: (log2 D + 2) u sum|x| / sqrt(D).
        double maxd = 0, l1 = 0, tol;
        for (int j = 0; j < D; j++) l1 += fabs(x[j]);
        tol = (log2((double)D) + 2) * U32 * l1 / sqrt((double)D);
        for (int i = 0; i < D; i++) {
            double e = 0;
            for (int j = 0; j < D; j++) e += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * s[j] * x[j];
            e /= sqrt((double)D);
            if (fabs(e - xs[i]) > maxd) maxd = fabs(e - xs[i]);
        }
        check(maxd <= tol, "SRHT D=%d equals H diag(s) x / sqrt(D) (max diff %.2e, tol %.2e)", D, maxd, tol);
        // Inner products of unit vectors are preserved.
        double worst = 0;
        for (int t = 0; t < 200; t++) {
            for (int j = 0; j < D; j++) x[j] = gauss(&r), y[j] = gauss(&r);
            float nx = (float)sqrt(dotd(x, x, D)), ny = (float)sqrt(dotd(y, y, D));
            for (int j = 0; j < D; j++) x[j] /= nx, y[j] /= ny;
            memcpy(xs, x, sizeof xs), memcpy(ys, y, sizeof ys);
            srht_apply(xs, s, D), srht_apply(ys, s, D);
            double d = fabs(dotd(xs, ys, D) - dotd(x, y, D));
            if (d > worst) worst = d;
        }
        // Unit inputs (normalized in fp32: within D u of unit length), each rotated coordinate
        // within (log2 D + 2) u sum|x| / sqrt(D) <= (log2 D + 2) u (sum|x| <= sqrt(D)): a rotated
        // vector's error is at most sqrt(D) times that in norm, and enters the product twice.
        double tol_ip = 2 * ((log2((double)D) + 2) * sqrt((double)D) + D) * U32;
        check(worst <= tol_ip, "SRHT D=%d preserves inner products of unit vectors (worst %.2e, tol %.2e)", D, worst, tol_ip);
    }
    float a[64], b[64];
    srht_signs(SRHT_SEED, 64, a), srht_signs(SRHT_SEED, 64, b);
    int pos = 0;
    for (int j = 0; j < 64; j++) pos += a[j] > 0;
    check(memcmp(a, b, sizeof a) == 0 && pos > 16 && pos < 48, "SRHT signs are fixed by the seed and mixed (%d of 64 positive)", pos);
}

// Rotated, normalized key as the encoder sees it, computed here in double.
static void rotated(const float *k, int D, const float *s, float *kt) {
    double r = sqrt(dotd(k, k, D));
    for (int j = 0; j < D; j++) kt[j] = (float)(k[j] / r);
    srht_apply(kt, s, D);
}

static void test_encoding(void) {
    Rng r = {2};
    int D = 64, B = D / PKV_M;
    float s[64], k[64], kt[64], alpha[8];
    uint8_t ids[8], codes[32];
    uint16_t w[8];
    srht_signs(SRHT_SEED, D, s);
    Shape ks = make_shape(&r, D, 6.0f);
    int ids_ok = 1, nearest_ok = 1, codes_ok = 1, alpha_ok = 1, w_ok = 1, undecided = 0, compared = 0;
    // The encoder normalizes and rotates in fp32 (a norm over D squares, D divisions, the SRHT),
    // the reference here in double before one rounding: a unit coordinate may differ by
    // tu = (D + log2 D + 4) u, and u / r_b by twice that. A sign or code is compared exactly
    // unless the coordinate lies within that distance of its decision boundary (0 or a
    // threshold), where either answer is right; the count of those is printed and kept small.
    double tu = (D + log2((double)D) + 4) * U32, tc = 2 * tu + 4 * U32;
    for (int t = 0; t < 300; t++) {
        draw(&r, &ks, D, k);
        pkv_encode_key(k, D, s, ids, codes, w, alpha);
        rotated(k, D, s, kt);
        double kn = sqrt(dotd(k, k, D));
        for (int b = 0; b < B; b++) {
            const float *u = kt + b * PKV_M;
            double rb = sqrt(dotd(u, u, PKV_M));
            int id = 0, free_bits = 0;
            for (int j = 0; j < PKV_M; j++) {
                id |= (u[j] >= 0) << j;
                if (fabs(u[j]) <= tu) free_bits |= 1 << j, undecided++;
            }
            ids_ok &= (ids[b] & ~free_bits) == (id & ~free_bits);
            // The sign pattern is the nearest of the 256 centroids {+-1/sqrt(8)}^8.
            double best = -1e30;
            int arg = -1;
            for (int c = 0; c < 256; c++) {
                double d = 0;
                for (int j = 0; j < PKV_M; j++) d += ((c >> j) & 1 ? 1 : -1) * u[j];
                if (d > best) best = d, arg = c;
            }
            nearest_ok &= (arg & ~free_bits) == (ids[b] & ~free_bits);
            double a = 0;
            for (int j = 0; j < PKV_M; j++) {
                int c = (codes[b * 4 + j / 2] >> (j & 1 ? 4 : 0)) & 15;
                double ub = u[j] / rb, edge = fabs(ub);
                for (int t = 0; t < 7; t++) edge = fmin(edge, fabs(fabs(ub) - pkv_thresholds[t]));
                if (edge <= tc) undecided++;
                else compared++, codes_ok &= c == pkv_code((float)ub);
                a += pkv_decode(c) * ub;
            }
            // alpha = sum of 8 centers (< 0.77) x |u_j / r_b|: the inputs' error plus 8 roundings
            alpha_ok &= fabs(a - alpha[b]) <= 8 * 0.77 * tc + 8 * U32;
            // w: fp16 rounds to half an ulp (2^-11 relative), after fp32 inputs off by ~tc relative
            double want = kn * rb / a, got = pkv_f16_to_f32(w[b]);
            w_ok &= fabs(got - want) <= want * (ldexp(1.0, -11) + 4 * tc / 0.3 + 16 * U32) + ldexp(1.0, -25);
        }
    }
    check(ids_ok && compared > 300 * B * PKV_M * 9 / 10,
          "ids are the sign patterns of the rotated subspaces (300 keys x %d; %d coordinates within rounding of a boundary)", B, undecided);
    check(nearest_ok, "each id is the nearest of the 256 sign-pattern centroids");
    check(codes_ok, "the packed nibbles are each coordinate's code, even coordinate low");
    check(alpha_ok, "alpha_b = <v_b, u_b>");
    check(w_ok, "w_b = ||k|| r_b / alpha_b, rounded to fp16");
}

static void test_codes(void) {
    int ok = 1;
    for (int c = 0; c < 16; c++) ok &= pkv_code(pkv_decode(c)) == c; // each center lies in its own bin
    check(ok, "code -> value -> code round trip for all 16 codes");
    // Every value decodes to within its bin: the worst distance is the widest half-bin (or the
    // top bin's reach to 1).
    double worst = 0;
    for (int i = -1000; i <= 1000; i++) {
        float u = (float)i / 1000.0f;
        double d = fabs(pkv_decode(pkv_code(u)) - u);
        if (d > worst) worst = d;
    }
    check(worst <= 0.2368 && pkv_code(0.0f) == 8 && pkv_code(-0.0001f) == 0 && pkv_code(0.95f) == 15,
          "decode(code(u)) within its bin for u in [-1, 1] (worst %.4f <= 1 - 0.7633); sign bit 3", worst);
    // fp16: exact values, round-to-nearest-even at a midpoint, subnormals, saturation to inf.
    check(pkv_f32_to_f16(1.0f) == 0x3c00 && pkv_f32_to_f16(-2.5f) == 0xc100 && pkv_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00 &&
              pkv_f32_to_f16(1.0f + 3 * ldexpf(1, -11)) == 0x3c02 && pkv_f32_to_f16(ldexpf(1, -24)) == 0x0001 &&
              pkv_f32_to_f16(1e6f) == 0x7c00 && pkv_f16_to_f32(0x3c00) == 1.0f && pkv_f16_to_f32(0x0001) == ldexpf(1, -24) &&
              pkv_f16_to_f32(pkv_f32_to_f16(65504.0f)) == 65504.0f,
          "fp16 conversion: exact values, ties to even, subnormals, overflow");
}

// The estimator on random anisotropic keys and queries: its error relative to ||k|| ||q||, with
// the alpha correction and without it (w_b = ||k|| r_b).
static void test_estimator(void) {
    Rng r = {3};
    for (int D = 64; D <= 128; D *= 2) {
        int B = D / PKV_M;
        float s[128], k[128], q[128], kt[128], qt[128], alpha[16], qn;
        uint8_t ids[16], codes[64];
        uint16_t w[16];
        srht_signs(SRHT_SEED, D, s);
        Shape ks = make_shape(&r, D, 6.0f), qs = make_shape(&r, D, 6.0f);
        double err = 0, err_plain = 0, et = 0, pt = 0, tt = 0; // slope of est on the truth: sum est t / sum t^2
        int N = 4000;
        for (int t = 0; t < N; t++) {
            draw(&r, &ks, D, k), draw(&r, &qs, D, q);
            pkv_encode_key(k, D, s, ids, codes, w, alpha);
            pkv_prepare_query(q, D, s, qt, &qn);
            double truth = dotd(k, q, D), norm = sqrt(dotd(k, k, D) * dotd(q, q, D));
            double est = pkv_estimate(codes, w, B, qt, qn);
            rotated(k, D, s, kt);
            double kn = sqrt(dotd(k, k, D)), plain = 0;
            for (int b = 0; b < B; b++) {
                double rb = sqrt(dotd(kt + b * PKV_M, kt + b * PKV_M, PKV_M)), d = 0;
                for (int j = 0; j < PKV_M; j++) d += pkv_decode((codes[b * 4 + j / 2] >> (j & 1 ? 4 : 0)) & 15) * qt[b * PKV_M + j];
                plain += kn * rb * d;
            }
            plain *= qn;
            err += fabs(est - truth) / norm, err_plain += fabs(plain - truth) / norm;
            et += est * truth, pt += plain * truth, tt += truth * truth;
        }
        err /= N, err_plain /= N;
        check(err < 0.012, "estimator D=%d: mean |est - <k,q>| / (||k|| ||q||) = %.4f < 0.012", D, err);
        check(err < 0.9 * err_plain, "alpha correction D=%d cuts the error: %.4f vs %.4f without (> 10%% less)", D, err, err_plain);
        // Both are close to unbiased here (slope of est on the truth near 1): what alpha buys on
        // these keys is a smaller spread, not the removal of a shrinkage.
        check(fabs(et / tt - 1) < 0.01, "estimator D=%d is unbiased: slope on the truth %.4f (%.4f without alpha)", D, et / tt, pt / tt);
    }
}

// An independent bonus: for each pattern, the keys of all strictly better-ranked patterns.
static void test_bonus(void) {
    Rng r = {4};
    int B = 4, n = 3000;
    float qt[32];
    int32_t count[4 * 256] = {0};
    for (int j = 0; j < 32; j++) qt[j] = gauss(&r);
    for (int i = 0; i < n; i++)
        for (int b = 0; b < B; b++) count[b * 256 + (next_u64(&r) % 7 == 0 ? next_u64(&r) % 256 : next_u64(&r) % 40)]++;
    uint8_t bonus[4 * 256];
    float rho = 0.3f;
    pkv_bonus(qt, B, count, n, rho, bonus);
    int ok = 1, top = 0;
    for (int b = 0; b < B; b++) {
        float sc[256];
        for (int c = 0; c < 256; c++) {
            sc[c] = 0;
            for (int j = 0; j < 8; j++) sc[c] += (c >> j) & 1 ? qt[b * 8 + j] : -qt[b * 8 + j];
        }
        for (int c = 0; c < 256; c++) {
            long before = 0;
            for (int d = 0; d < 256; d++)
                if (sc[d] > sc[c] || (sc[d] == sc[c] && d < c)) before += count[b * 256 + d];
            int want = 0;
            for (int t = 0; t < 6; t++) want += before < (long)ceil(n * 0.3 * pkv_tier_frac[t] - 1e-9); // rho as the decimal 0.3
            ok &= bonus[b * 256 + c] == want;
            top += want == 6;
        }
    }
    check(ok && top >= B, "6-tier bonus equals a brute-force count of better-ranked keys (rho %.1f)", rho);
    check(pkv_ceil(1000 * 0.5 * 0.3) == 150 && pkv_ceil(150.2) == 151 && pkv_ceil(100) == 100, "tier targets: ceil without float noise");
}

static int cmp_desc(const void *a, const void *b) {
    const ScoredId *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}
static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

// The first C of (score desc, slot asc), ascending: what both top-k routines must return.
static int ref_top(const float *score, int n, int C, int *out) {
    ScoredId *v = malloc((size_t)n * sizeof *v);
    if (!v) return -1;
    for (int i = 0; i < n; i++) v[i] = (ScoredId){score[i], i};
    qsort(v, (size_t)n, sizeof *v, cmp_desc);
    if (C > n) C = n;
    for (int i = 0; i < C; i++) out[i] = v[i].id;
    qsort(out, (size_t)C, sizeof(int), cmp_int);
    free(v);
    return C;
}

static void test_topk(void) {
    Rng r = {5};
    int n = 5000, max_score = 96;
    uint16_t *s16 = malloc(n * sizeof *s16);
    float *sf = malloc(n * sizeof *sf);
    int *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    ScoredId *heap = malloc(n * sizeof *heap);
    int32_t hist[97];
    if (!s16 || !sf || !a || !b || !heap) exit(1);
    int ok = 1, cases = 0;
    for (int rep = 0; rep < 6; rep++) {
        for (int i = 0; i < n; i++) { // heavily tied integer scores, skewed like vote scores
            double u = uniform(&r);
            s16[i] = (uint16_t)(u * u * max_score), sf[i] = s16[i];
        }
        int Cs[] = {1, 100, 777, 2500, 4999, 5000, 6000};
        for (int c = 0; c < 7; c++, cases++) {
            int na = pkv_bucket_topc(s16, n, max_score, Cs[c], hist, a), nb = ref_top(sf, n, Cs[c], b);
            ok &= na == nb && memcmp(a, b, (size_t)na * sizeof(int)) == 0;
        }
    }
    check(ok, "bucket top-C selects exactly the top C of a sort, ties to the smaller slot (%d cases)", cases);
    ok = 1, cases = 0;
    for (int rep = 0; rep < 6; rep++) {
        for (int i = 0; i < n; i++) sf[i] = rep % 2 ? (float)(next_u64(&r) % 50) : gauss(&r); // tied and untied
        int ks[] = {1, 100, 1000, 5000, 7000};
        for (int c = 0; c < 5; c++, cases++) {
            int na = topk_select(sf, NULL, n, ks[c], heap, a), nb = ref_top(sf, n, ks[c], b);
            ok &= na == nb && memcmp(a, b, (size_t)na * sizeof(int)) == 0;
        }
    }
    check(ok, "top-k equals a sort, ties to the smaller id (%d cases)", cases);
    free(s16), free(sf), free(a), free(b), free(heap);
}

int main(void) {
    test_srht();
    test_encoding();
    test_codes();
    test_estimator();
    test_bonus();
    test_topk();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
