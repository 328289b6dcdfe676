// One ParisKV retrieval step for one query: collision voting with the 6-tier bonus, an integer
// bucket top-C of the vote scores, the calibrated rerank of the candidates, the final top-k.
#include "pariskv.h"
#include "selector.h"
#include "srht.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const double pkv_tier_frac[PKV_TIERS] = {0.05, 0.15, 0.30, 0.50, 0.75, 1.0};

void pkv_schedule(int n, float *beta, float *rho) {
    if (n < 5000) *beta = 0.5f, *rho = 0.5f;
    else if (n < 10000) *beta = 0.25f, *rho = 0.3f;
    else if (n < 30000) *beta = 0.2f, *rho = 0.25f;
    else *beta = 0.1f, *rho = 0.2f;
}

int pkv_ceil(double x) { return (int)ceil(x - 1e-9); }

// beta and rho arrive as floats (0.3f is 0.30000001192...): their products with n would land just
// past a whole number that the decimal value hits exactly, and ceil one too high. The schedule's
// values are decimals of a few digits: take the float's nearest 6-digit decimal, in double.
static double decimal(float x) { return round((double)x * 1e6) / 1e6; }

void pkv_prepare_query(const float *q, int D, const float *s, float *qt, float *qnorm) {
    float n2 = 0.0f;
    for (int i = 0; i < D; i++) n2 += q[i] * q[i];
    float n = sqrtf(n2), inv = n > 0.0f ? 1.0f / n : 0.0f;
    for (int i = 0; i < D; i++) qt[i] = q[i] * inv;
    srht_apply(qt, s, D);
    *qnorm = n;
}

typedef struct {
    float score;
    int id;
} Pattern;

static int better(Pattern a, Pattern b) { return a.score > b.score || (a.score == b.score && a.id < b.id); } // ties: the smaller id

// Best first, by a bottom-up merge sort of the 256 patterns (a comparison the compiler inlines).
static void rank_patterns(Pattern *p, Pattern *tmp) {
    for (int w = 1; w < PKV_PATTERNS; w *= 2) {
        for (int lo = 0; lo < PKV_PATTERNS; lo += 2 * w) {
            int a = lo, b = lo + w, mid = lo + w, hi = lo + 2 * w, o = lo;
            while (a < mid && b < hi) tmp[o++] = better(p[b], p[a]) ? p[b++] : p[a++];
            while (a < mid) tmp[o++] = p[a++];
            while (b < hi) tmp[o++] = p[b++];
        }
        memcpy(p, tmp, sizeof(Pattern) * PKV_PATTERNS);
    }
}

void pkv_bonus(const float *qt, int B, const int32_t *count, int n, float rho, uint8_t *bonus) {
    int target[PKV_TIERS];
    for (int t = 0; t < PKV_TIERS; t++) target[t] = pkv_ceil((double)n * decimal(rho) * pkv_tier_frac[t]);
    for (int b = 0; b < B; b++) {
        const float *qb = qt + b * PKV_M;
        Pattern p[PKV_PATTERNS], tmp[PKV_PATTERNS];
        for (int c = 0; c < PKV_PATTERNS; c++) {
            float sc = 0.0f; // <q_b, c> with c in {+1, -1}^8: bit j set = +1
            for (int j = 0; j < PKV_M; j++) sc += (c >> j) & 1 ? qb[j] : -qb[j];
            p[c] = (Pattern){sc, c};
        }
        rank_patterns(p, tmp);
        // A pattern is in tier t while the keys of the patterns ranked before it number < T_t.
        int64_t before = 0;
        const int32_t *cnt = count + (size_t)b * PKV_PATTERNS;
        for (int r = 0; r < PKV_PATTERNS; r++) {
            int c = p[r].id, tiers = 0;
            for (int t = 0; t < PKV_TIERS; t++) tiers += before < target[t];
            bonus[b * PKV_PATTERNS + c] = (uint8_t)tiers;
            before += cnt[c];
        }
    }
}

void pkv_vote(const uint8_t *ids, int n, int B, const uint8_t *bonus, uint16_t *score) {
    for (int i = 0; i < n; i++) {
        const uint8_t *id = ids + (size_t)i * B;
        unsigned s = 0;
        for (int b = 0; b < B; b++) s += bonus[b * PKV_PATTERNS + id[b]];
        score[i] = (uint16_t)s;
    }
}

int pkv_bucket_topc(const uint16_t *score, int n, int max_score, int C, int32_t *hist, int *out) {
    if (C > n) C = n;
    if (C <= 0) return 0;
    memset(hist, 0, (size_t)(max_score + 1) * sizeof *hist);
    for (int i = 0; i < n; i++) hist[score[i]]++;
    // The threshold bucket: everything above it is in; of it, the first `quota` slots.
    int thr = 0, above = 0;
    for (int s = max_score; s >= 0; s--) {
        if (above + hist[s] >= C) {
            thr = s;
            break;
        }
        above += hist[s];
    }
    int quota = C - above, m = 0;
    for (int i = 0; i < n; i++) {
        if (score[i] > thr) out[m++] = i;
        else if (score[i] == thr && quota > 0) out[m++] = i, quota--;
    }
    return m;
}

float pkv_estimate(const uint8_t *codes, const uint16_t *w, int B, const float *qt, float qnorm) {
    float est = 0.0f;
    for (int b = 0; b < B; b++) {
        const uint8_t *cb = codes + b * (PKV_M / 2);
        const float *qb = qt + b * PKV_M;
        float d = 0.0f; // <v_b, qt_b>
        for (int j = 0; j < PKV_M; j++) d += pkv_levels[j & 1 ? cb[j / 2] >> 4 : cb[j / 2] & 15] * qb[j];
        est += pkv_f16_to_f32(w[b]) * d;
    }
    return qnorm * est;
}

#define ALIGN16(x) (((x) + 15) & ~(size_t)15)

size_t pkv_scratch_bytes(int B, int max_n, int k) {
    size_t n = (size_t)(max_n > 0 ? max_n : 1);
    return ALIGN16(PKV_MAX_D * sizeof(float)) + ALIGN16((size_t)B * PKV_PATTERNS) + ALIGN16(n * sizeof(uint16_t)) +
           ALIGN16(((size_t)PKV_TIERS * B + 1) * sizeof(int32_t)) + ALIGN16(n * sizeof(int)) + ALIGN16(n * sizeof(float)) +
           ALIGN16((size_t)(k > 0 ? k : 1) * sizeof(ScoredId));
}

int pkv_select(const PkvIndex *ix, int D, const float *s, const float *q, int k, float beta, float rho, void *scratch, int *out) {
    int n = ix->n, B = ix->B, max_score = PKV_TIERS * B;
    if (n <= k) return select_all(n, out);
    if (beta <= 0.0f || rho <= 0.0f) pkv_schedule(n, &beta, &rho);
    char *p = scratch;
    float *qt = (float *)p;
    p += ALIGN16(PKV_MAX_D * sizeof(float));
    uint8_t *bonus = (uint8_t *)p;
    p += ALIGN16((size_t)B * PKV_PATTERNS);
    uint16_t *score = (uint16_t *)p;
    p += ALIGN16((size_t)n * sizeof(uint16_t));
    int32_t *hist = (int32_t *)p;
    p += ALIGN16(((size_t)max_score + 1) * sizeof(int32_t));
    int *cand = (int *)p;
    p += ALIGN16((size_t)n * sizeof(int));
    float *est = (float *)p;
    p += ALIGN16((size_t)n * sizeof(float));
    ScoredId *heap = (ScoredId *)p;

    float qnorm;
    pkv_prepare_query(q, D, s, qt, &qnorm);
    pkv_bonus(qt, B, ix->count, n, rho, bonus);
    pkv_vote(ix->ids, n, B, bonus, score);
    int C = pkv_ceil((double)n * decimal(beta));
    if (C < k) C = k; // the final top-k is never short of candidates
    int nc = pkv_bucket_topc(score, n, max_score, C, hist, cand);
    for (int i = 0; i < nc; i++)
        est[i] = pkv_estimate(ix->codes + (size_t)cand[i] * B * (PKV_M / 2), ix->w + (size_t)cand[i] * B, B, qt, qnorm);
    return topk_select(est, cand, nc, k, heap, out);
}
