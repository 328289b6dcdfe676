// The selection policies end to end on synthetic caches: the regions against the step-by-step
// protocol, exactness when the budget covers the zone, teacher-forced chunks against single
// steps, independence from the thread count, recall with planted relevant keys, and drift (the
// key distribution shifts halfway: ParisKV's recall holds while learned centroids fall).
#include "../attention/attention.h"
#include "../attention/recall.h"
#include "../offload/fp8.h"
#include "test_pariskv_util.h"
#include "../model/pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n, size);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

// One model's worth of synthetic attention inputs: a cache of ctx positions and a query per position.
typedef struct {
    int L, H, Hkv, D, ctx;
    float *k, *v, *q, *scratch; // k, v (L, ctx, Hkv * D); q (L, ctx, H * D)
} Inputs;

static Inputs make_inputs(Rng *r, int L, int H, int Hkv, int D, int ctx) {
    Inputs in = {L, H, Hkv, D, ctx, NULL, NULL, NULL, NULL};
    size_t kv = (size_t)L * ctx * Hkv * D, qn = (size_t)L * ctx * H * D;
    in.k = xcalloc(kv, sizeof(float)), in.v = xcalloc(kv, sizeof(float)), in.q = xcalloc(qn, sizeof(float));
    in.scratch = xcalloc(attention_dense_scratch(&pool_parallel, H, Hkv, D, ctx), sizeof(float));
    Shape ks = make_shape(r, D, 4.0f), qs = make_shape(r, D, 2.0f);
    for (size_t i = 0; i < kv / D; i++) draw(r, &ks, D, in.k + i * D);
    for (size_t i = 0; i < kv; i++) in.v[i] = gauss(r);
    for (size_t i = 0; i < qn / D; i++) draw(r, &qs, D, in.q + i * D);
    return in;
}

static void free_inputs(Inputs *in) { free(in->k), free(in->v), free(in->q), free(in->scratch); }

// Runs positions [pos0, pos0 + T) through every layer: the policy, or dense attention when NULL.
static void attend(AttnPolicy *ap, const Inputs *in, int pos0, int T, float *out) {
    size_t kvl = (size_t)in->ctx * in->Hkv * in->D, ql = (size_t)in->ctx * in->H * in->D, row = (size_t)in->H * in->D;
    for (int l = 0; l < in->L; l++) {
        float *o = out + l * ql + (size_t)pos0 * row;
        const float *q = in->q + l * ql + (size_t)pos0 * row;
        if (ap) ap->attend(ap, l, o, q, in->k + l * kvl, in->v + l * kvl, pos0, T, in->H, in->Hkv, in->D, in->scratch);
        else attention_dense(&pool_parallel, o, q, in->k + l * kvl, in->v + l * kvl, pos0, T, in->H, in->Hkv, in->D, in->scratch);
    }
}

static AttnPolicy *create(const AttnConfig *c, const Inputs *in) {
    char err[ATTN_ERR_LEN];
    AttnPolicy *ap = attn_policy_create(c, &pool_parallel, in->L, in->H, in->Hkv, in->D, in->ctx, err);
    if (!ap) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    return ap;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)a[i] - b[i]) > m || a[i] != a[i] || b[i] != b[i]) m = a[i] != a[i] || b[i] != b[i] ? INFINITY : fabs((double)a[i] - b[i]);
    return m;
}

// The regions against a simulation of the buffer protocol, step by step.
static void test_regions(void) {
    int ok = 1, cases = 0;
    int cfgs[][4] = {{4, 256, 512, 0}, {4, 256, 512, 3000}, {4, 256, 512, 100}, {0, 64, 16, 0}, {16, 128, 128, 777}, {4, 0, 64, 50}};
    for (int c = 0; c < 6; c++, cases++) {
        AttnConfig cfg;
        attn_config_default(&cfg);
        cfg.sink = cfgs[c][0], cfg.local = cfgs[c][1], cfg.update = cfgs[c][2], cfg.prefill_len = cfgs[c][3];
        int P = cfg.prefill_len, S = cfg.sink, L = cfg.local, U = cfg.update;
        // After the prefill: the window holds the prompt's last L tokens (or all past the sink).
        int zone_end = P - L > S ? P - L : S;
        for (int p = P; p < P + 5000; p++) {
            // token p enters the buffer; the query at p sees the zone as it stands
            ok &= attn_zone_end(&cfg, p) == zone_end;
            // after the step: a buffer of U tokens sends the oldest U of window + buffer to the zone
            if (p + 1 - zone_end - L == U) zone_end += U;
        }
    }
    check(ok, "zone end equals the step-by-step buffer protocol (%d configurations x 5000 steps, U > L and U < L)", cases);
    AttnConfig cfg;
    attn_config_default(&cfg);
    check(attn_dense_threshold(&cfg) == 2000 && attn_is_dense(&cfg, 1998) && !attn_is_dense(&cfg, 1999), "dense below 2000 tokens by default");
    cfg.topk = 1000;
    cfg.prefill_len = 3000;
    check(attn_dense_threshold(&cfg) == 4 + 256 + 2000 && attn_is_dense(&cfg, 2999) && !attn_is_dense(&cfg, 3000),
          "dense threshold max(2000, S + L + 2k); the prompt is dense");
}

// With a budget at least the zone, every method but streaming attends to every position: its
// output must be dense attention's. GQA group sizes 1, 3, 4 and head_dim 64, 128.
static void test_exact_when_budget_covers_zone(void) {
    Rng r = {11};
    int shapes[][3] = {{3, 1, 64}, {9, 3, 64}, {8, 2, 128}};
    for (int sh = 0; sh < 3; sh++) {
        Inputs in = make_inputs(&r, 2, shapes[sh][0], shapes[sh][1], shapes[sh][2], 420);
        size_t n = (size_t)in.L * in.ctx * in.H * in.D;
        float *want = xcalloc(n, sizeof(float)), *got = xcalloc(n, sizeof(float));
        attend(NULL, &in, 0, in.ctx, want);
        for (int m = ATTN_PARISKV; m < ATTN_N_METHODS; m++) {
            if (m == ATTN_STREAMING) continue;
            AttnConfig c;
            attn_config_default(&c);
            // zone [4, 118) of 114 keys <= topk 120; the threshold 4 + 32 + 240 = 276 keeps the
            // queries past 276 on the policy's path.
            c.method = m, c.sink = 4, c.local = 32, c.update = 1000, c.topk = 120, c.prefill_len = 150, c.dense_min = 0;
            AttnPolicy *ap = create(&c, &in);
            memset(got, 0, n * sizeof(float));
            attend(ap, &in, 0, 300, got);    // a prefill chunk crossing into decode
            attend(ap, &in, 300, 1, got);     // a single step
            attend(ap, &in, 301, in.ctx - 301, got); // a teacher-forced chunk
            double d = max_diff(want, got, n);
            // Bit for bit: the policy attends over every position with attention_dense's own
            // operations in its order (policy.c, attend_rows), so nothing may differ.
            check(d == 0, "%s, %d heads / %d KV heads, head_dim %d: k >= zone gives full attention bit for bit (max diff %.1e)", attn_method_name(m),
                  in.H, in.Hkv, in.D, d);
            ap->destroy(ap);
        }
        free(want), free(got), free_inputs(&in);
    }
}

// Teacher forcing: chunks of 64 queries (each selecting for itself) against one query at a
// time, for every method, with and without a prompt; and the same for 1 and 2 threads.
static void test_chunks_equal_steps(void) {
    Rng r = {12};
    Inputs in = make_inputs(&r, 2, 6, 2, 64, 720);
    size_t n = (size_t)in.L * in.ctx * in.H * in.D;
    float *a = xcalloc(n, sizeof(float)), *b = xcalloc(n, sizeof(float));
    // One thread here (the thread count is checked on its own below): thousands of one-query
    // calls each open a parallel region, which costs more than the work on a busy machine.
    int threads = pool_max_threads();
    pool_set_threads(1);
    for (int P = 0; P <= 300; P += 300)
        for (int m = ATTN_PARISKV; m < ATTN_N_METHODS; m++) {
            AttnConfig c;
            attn_config_default(&c);
            // zone updates every 64 steps, some inside a chunk; the prompt ends inside one too
            c.method = m, c.sink = 4, c.local = 32, c.update = 64, c.topk = 16, c.dense_min = 200, c.prefill_len = P;
            AttnPolicy *pa = create(&c, &in), *pb = create(&c, &in);
            for (int p = 0; p < in.ctx; p += 64) attend(pa, &in, p, p + 64 < in.ctx ? 64 : in.ctx - p, a);
            for (int p = 0; p < in.ctx; p++) attend(pb, &in, p, 1, b);
            check(memcmp(a, b, n * sizeof(float)) == 0, "%s, prompt %d: teacher-forced chunks of 64 equal single steps, bit for bit",
                  attn_method_name(m), P);
            pa->destroy(pa), pb->destroy(pb);
        }
    for (int m = ATTN_PARISKV; m <= ATTN_KMEANS; m += ATTN_KMEANS - ATTN_PARISKV) {
        AttnConfig c;
        attn_config_default(&c);
        c.method = m, c.sink = 4, c.local = 32, c.update = 64, c.topk = 16, c.dense_min = 200;
        pool_set_threads(1);
        AttnPolicy *pa = create(&c, &in);
        for (int p = 0; p < in.ctx; p += 90) attend(pa, &in, p, p + 90 < in.ctx ? 90 : in.ctx - p, a);
        pool_set_threads(threads > 1 ? threads : 2);
        AttnPolicy *pb = create(&c, &in);
        for (int p = 0; p < in.ctx; p += 90) attend(pb, &in, p, p + 90 < in.ctx ? 90 : in.ctx - p, b);
        check(memcmp(a, b, n * sizeof(float)) == 0, "%s: 1 thread and %d threads give the same output, bit for bit", attn_method_name(m),
              threads > 1 ? threads : 2);
        pa->destroy(pa), pb->destroy(pb);
        pool_set_threads(threads);
    }
    free(a), free(b), free_inputs(&in);
}

// Streaming attends to the sink, the local window and the buffer only: dense attention over
// those positions, computed here directly.
static void test_streaming(void) {
    Rng r = {13};
    Inputs in = make_inputs(&r, 1, 2, 1, 64, 600);
    AttnConfig c;
    attn_config_default(&c);
    c.method = ATTN_STREAMING, c.sink = 4, c.local = 64, c.update = 128, c.topk = 16, c.dense_min = 0;
    AttnPolicy *ap = create(&c, &in);
    int p = 599, ze = attn_zone_end(&c, p), D = 64;
    float *full = xcalloc((size_t)in.ctx * 2 * D, sizeof(float)), *out = full + (size_t)p * 2 * D;
    attend(ap, &in, p, 1, full);
    // Directly: the rows kept are [0, 4) and [ze, p].
    // fp32 against double: each score is within 2 D u of its sum of |q_j k_j| / sqrt(D) (the dot
    // product, then the scale), so each softmax weight within a relative 2 (2 D u smax + 2 u)
    // plus m u for the normalizing sum; the output, a weighted mean of V rows, within that times
    // max|v| plus m u max|v| for its own sum: tol = (4 D u smax + (2 m + 8) u) max|v|.
    double d = 0, tol = 0, u = ldexp(1.0, -24);
    for (int h = 0; h < 2; h++) {
        const float *q = in.q + ((size_t)p * 2 + h) * D;
        double w[600], mx = -1e30, sum = 0;
        int rows[600], m = 0;
        for (int i = 0; i < 4; i++) rows[m++] = i;
        for (int i = ze; i <= p; i++) rows[m++] = i;
        double smax = 0, vmax = 0;
        for (int i = 0; i < m; i++) {
            double s = 0, sa = 0;
            for (int j = 0; j < D; j++) {
                s += (double)q[j] * in.k[(size_t)rows[i] * D + j], sa += fabs((double)q[j] * in.k[(size_t)rows[i] * D + j]);
                vmax = fmax(vmax, fabs(in.v[(size_t)rows[i] * D + j]));
            }
            w[i] = s / 8.0, smax = fmax(smax, sa / 8.0);
            if (w[i] > mx) mx = w[i];
        }
        tol = fmax(tol, (4.0 * D * u * smax + (2.0 * m + 8) * u) * vmax);
        for (int i = 0; i < m; i++) sum += (w[i] = exp(w[i] - mx));
        for (int j = 0; j < D; j++) {
            double o = 0;
            for (int i = 0; i < m; i++) o += w[i] / sum * in.v[(size_t)rows[i] * D + j];
            if (fabs(o - out[h * D + j]) > d) d = fabs(o - out[h * D + j]);
        }
    }
    check(d <= tol && ze > 4, "streaming attends to sink + local + buffer only (zone [4, %d) skipped; max diff %.1e, tol %.1e)", ze, d, tol);
    ap->destroy(ap), free(full), free_inputs(&in);
}

// Recall@k of a selection against the exact top-k of the zone [S, zone_end) by <qbar, k>.
static double recall(const Inputs *in, int layer, int kv_head, const float *qbar, int S, int zone_end, const int *sel, int nsel, int k) {
    int n = zone_end - S;
    double *s = xcalloc((size_t)n, sizeof(double));
    char *mark = xcalloc((size_t)in->ctx, 1);
    for (int i = 0; i < n; i++) {
        const float *kp = in->k + ((size_t)layer * in->ctx + S + i) * in->Hkv * in->D + (size_t)kv_head * in->D;
        double d = 0;
        for (int j = 0; j < in->D; j++) d += (double)qbar[j] * kp[j];
        s[i] = d;
    }
    for (int i = 0; i < nsel; i++) mark[sel[i]] = 1;
    // the k-th largest score, then how many of the selected reach it
    double *t = xcalloc((size_t)n, sizeof(double));
    memcpy(t, s, (size_t)n * sizeof(double));
    for (int i = 0; i < k; i++) { // partial selection sort: k is small
        int m = i;
        for (int j = i + 1; j < n; j++)
            if (t[j] > t[m]) m = j;
        double x = t[i];
        t[i] = t[m], t[m] = x;
    }
    double kth = t[k - 1];
    int hit = 0;
    for (int i = 0; i < n; i++) hit += mark[S + i] && s[i] >= kth;
    free(s), free(mark), free(t);
    return (double)hit / k;
}

// The G query heads of one KV head: qbar plus a spread that averages to zero.
static void group_query(Rng *r, const float *qbar, int G, int D, float *qg) {
    for (int j = 0; j < D; j++) {
        float noise[8], m = 0;
        for (int g = 0; g < G; g++) m += noise[g] = 0.3f * gauss(r);
        m /= (float)G;
        for (int g = 0; g < G; g++) qg[g * D + j] = qbar[j] + noise[g] - m;
    }
}

// Planted relevant keys: 100 zone keys are moved towards the query so that they are the true
// top 100 by a modest margin; ParisKV must find most of them among 5000.
static void test_planted_recall(void) {
    Rng r = {14};
    int D = 64, G = 2, ctx = 5400, S = 4;
    Inputs in = make_inputs(&r, 1, G, 1, D, ctx);
    AttnConfig c;
    attn_config_default(&c);
    c.prefill_len = 5300, c.dense_min = 0; // zone [4, 5044): 5040 keys
    AttnPolicy *ap = create(&c, &in);
    float *out = xcalloc((size_t)ctx * G * D, sizeof(float));
    attend(ap, &in, 5300, 1, out);
    int ze = attn_zone_end(&c, 5300), sel[200];
    double rec_sum = 0, rec_min = 1, rec10_sum = 0;
    int trials = 20;
    Shape qs = make_shape(&r, D, 2.0f);
    for (int t = 0; t < trials; t++) {
        float qbar[64], qg[128];
        draw(&r, &qs, D, qbar);
        double qn = 0;
        for (int j = 0; j < D; j++) qn += qbar[j] * qbar[j];
        qn = sqrt(qn);
        // plant: 100 random zone keys get + 3 ||k||-ish along q/||q||
        int planted[100];
        for (int i = 0; i < 100; i++) {
            planted[i] = S + (int)(next_u64(&r) % (unsigned)(ze - S));
            float *kp = in.k + (size_t)planted[i] * D;
            for (int j = 0; j < D; j++) kp[j] += (float)(9.0 * qbar[j] / qn);
        }
        // the index must see the planted keys: rebuild it (a new sequence)
        ap->reset(ap);
        attend(ap, &in, 5300, 1, out);
        group_query(&r, qbar, G, D, qg);
        int nsel = attn_policy_select(ap, 0, 0, qg, 5300, 0, 0, sel);
        char mark[5400] = {0};
        for (int i = 0; i < nsel; i++) mark[sel[i]] = 1;
        int hit = 0, distinct = 0;
        char seen[5400] = {0};
        for (int i = 0; i < 100; i++)
            if (!seen[planted[i]]) seen[planted[i]] = 1, distinct++, hit += mark[planted[i]];
        double rc = (double)hit / distinct;
        rec_sum += rc, rec_min = rc < rec_min ? rc : rec_min;
        // Recall@100 against the exact top 100 at the paper's candidate ratio 0.10 as well
        nsel = attn_policy_select(ap, 0, 0, qg, 5300, 0.10f, 0.2f, sel);
        rec10_sum += recall(&in, 0, 0, qbar, S, ze, sel, nsel, 100);
        for (int i = 0; i < 100; i++) {
            float *kp = in.k + (size_t)planted[i] * D;
            for (int j = 0; j < D; j++) kp[j] -= (float)(9.0 * qbar[j] / qn);
        }
    }
    // The group's mean query decides: heads qbar +- d, with d larger than qbar, select what two
    // heads equal to qbar select (up to the rounding of the mean); one head alone would not.
    ap->reset(ap); // the index of the restored keys
    attend(ap, &in, 5300, 1, out);
    int same = 0, total = 0;
    for (int t = 0; t < 10; t++) {
        float qbar[64], qg[128], q2[128];
        int sel2[200];
        draw(&r, &qs, D, qbar);
        for (int j = 0; j < D; j++) {
            float d = 3.0f * qs.scale[j] * gauss(&r);
            qg[j] = qbar[j] + d, qg[D + j] = qbar[j] - d, q2[j] = q2[D + j] = qbar[j];
        }
        int na = attn_policy_select(ap, 0, 0, qg, 5300, 0, 0, sel), nb = attn_policy_select(ap, 0, 0, q2, 5300, 0, 0, sel2);
        for (int i = 0, j = 0; i < na && j < nb;) // both ascending
            if (sel[i] == sel2[j]) same++, i++, j++;
            else if (sel[i] < sel2[j]) i++;
            else j++;
        total += nb;
    }
    check(same >= 0.97 * total, "the mean of the group's query heads selects: heads qbar +- 3 sigma choose %.1f%% of what heads = qbar choose (floor 97%%)",
          100.0 * same / total);
    check(rec_sum / trials >= 0.90 && rec_min >= 0.75, "planted keys: ParisKV finds %.1f%% of 100 planted among %d (worst query %.0f%%; floor 90%% / 75%%)",
          100 * rec_sum / trials, ze - S, 100 * rec_min);
    check(rec10_sum / trials >= 0.80, "planted keys at candidate ratio 0.10: Recall@100 vs the exact top 100 %.1f%% (floor 80%%)", 100 * rec10_sum / trials);
    ap->destroy(ap), free(out), free_inputs(&in);
}

// Drift: the prompt's keys come from one distribution, the generated ones from another. kmeans
// learns its centroids from the prompt; ParisKV has nothing to learn. Queries late in the
// generation look for the new keys.
static void test_drift(void) {
    Rng r = {15};
    int D = 64, G = 2, ctx = 6200, P = 3000, S = 4;
    Inputs in = make_inputs(&r, 1, G, 1, D, ctx);
    Shape a = make_shape(&r, D, 4.0f), b = make_shape(&r, D, 4.0f);
    for (int j = 0; j < D; j++) b.offset[j] = j % 16 == 9 ? 8.0f * gauss(&r) : 0.0f, b.scale[j] *= 1.5f; // other channels
    for (int p = 0; p < ctx; p++) draw(&r, p < P ? &a : &b, D, in.k + (size_t)p * D);
    Shape qa = make_shape(&r, D, 2.0f);
    double rec[2][2] = {{0}}; // [pariskv, kmeans][early, late]
    int methods[2] = {ATTN_PARISKV, ATTN_KMEANS}, trials = 30;
    int late = ctx - 1;
    for (int mi = 0; mi < 2; mi++) {
        AttnConfig c;
        attn_config_default(&c);
        c.method = methods[mi], c.prefill_len = P, c.dense_min = 0;
        AttnPolicy *ap = create(&c, &in);
        float *out = xcalloc((size_t)ctx * G * D, sizeof(float));
        Rng rq = {99}; // the same queries for both methods
        for (int phase = 0; phase < 2; phase++) {
            int pos = phase ? late : P;
            attend(ap, &in, pos, 1, out);
            int ze = attn_zone_end(&c, pos), sel[200];
            for (int t = 0; t < trials; t++) {
                float qbar[64], qg[128];
                // early queries look like the prompt's; late ones like the new keys' distribution
                draw(&rq, &qa, D, qbar);
                if (phase)
                    for (int j = 0; j < D; j++) qbar[j] = 0.5f * qbar[j] + b.offset[j] * 0.5f + b.scale[j] * gauss(&rq);
                group_query(&rq, qbar, G, D, qg);
                int nsel = attn_policy_select(ap, 0, 0, qg, pos, 0, 0, sel);
                rec[mi][phase] += recall(&in, 0, 0, qbar, S, ze, sel, nsel, 100) / trials;
            }
        }
        ap->destroy(ap), free(out);
    }
    printf("     drift Recall@100: pariskv early %.1f%% late %.1f%%; kmeans early %.1f%% late %.1f%%\n", 100 * rec[0][0], 100 * rec[0][1],
           100 * rec[1][0], 100 * rec[1][1]);
    check(rec[0][1] >= 0.85 && rec[0][1] >= rec[0][0] - 0.05, "drift: ParisKV's recall holds (late %.1f%% >= 85%%, early %.1f%%)", 100 * rec[0][1],
          100 * rec[0][0]);
    check(rec[1][1] <= rec[1][0] - 0.15 && rec[1][1] <= rec[0][1] - 0.2, "drift: kmeans falls (early %.1f%% -> late %.1f%%, below ParisKV's by > 20 points)",
          100 * rec[1][0], 100 * rec[1][1]);
    free_inputs(&in);
}

// zone_fp8: a prompt, then decode steps through an index update and a chunk, then a rewind. The
// policy must rewrite exactly the zone's rows with their fp8 values (offload/fp8.h, the
// GPU host store's format) and attend exactly as the plain policy does on a cache where those rows
// were rounded beforehand: the index and the attention see the stored values, nothing else
// changes. Bit for bit (the same arithmetic on the same numbers).
static void test_zone_fp8(void) {
    Rng r = {808};
    Inputs a = make_inputs(&r, 2, 6, 2, 64, 1400), b = make_inputs(&r, 2, 6, 2, 64, 1400);
    size_t kvn = (size_t)a.L * a.ctx * a.Hkv * a.D, qn = (size_t)a.L * a.ctx * a.H * a.D;
    memcpy(b.k, a.k, kvn * 4), memcpy(b.v, a.v, kvn * 4), memcpy(b.q, a.q, qn * 4);
    AttnConfig c;
    attn_config_default(&c);
    c.topk = 24, c.local = 96, c.update = 64, c.dense_min = 0, c.prefill_len = 600;
    AttnConfig c8 = c;
    c8.zone_fp8 = 1;
    AttnPolicy *pa = create(&c8, &a), *pb = create(&c, &b);
    float *oa = xcalloc(qn, sizeof(float)), *ob = xcalloc(qn, sizeof(float));
    // b: the rows [sink, zone_end) rounded by hand before each call that reaches them.
    int rounded = c.sink, row = a.Hkv * a.D;
    // Each call's decode positions see one zone (the policy rounds as a run of them starts); the
    // zone grows at 664 and 728. After the rewind to 640 the zone is back to [4, 504), and rows up
    // to 568 stay rounded (as the store holds them; the GPU's window would still hold the originals).
    int steps[][2] = {{0, 600}, {600, 1}, {601, 63}, {664, 1}, {665, 63}, {640, 1}, {641, 23}};
    int bad_rows = 0, calls = 0;
    double d = 0;
    for (int s = 0; s < 7; s++) {
        int p0 = steps[s][0], T = steps[s][1];
        if (p0 < rounded) { // the rewind rewrites rows from p0 on: fresh values for both caches
            for (int l = 0; l < a.L; l++)
                for (size_t i = (size_t)p0 * row; i < (size_t)a.ctx * row; i++) {
                    size_t o = (size_t)l * a.ctx * row + i;
                    b.k[o] = a.k[o] = gauss(&r), b.v[o] = a.v[o] = gauss(&r);
                }
            rounded = p0 > c.sink ? p0 : c.sink;
        }
        int ze = p0 + T <= c.prefill_len ? 0 : attn_zone_end(&c, p0 + T - 1); // the prompt: dense, nothing rounded
        for (int l = 0; l < b.L; l++) // zone rows of b rounded as the store holds them
            for (int p = rounded; p < ze; p++)
                for (int h = 0; h < 2 * b.Hkv; h++) {
                    float *x = (h < b.Hkv ? b.k : b.v) + ((size_t)l * b.ctx + p) * row + (size_t)(h % b.Hkv) * b.D;
                    uint8_t code[64];
                    float sc = fp8_quantize_row(x, b.D, code);
                    fp8_dequantize_row(code, sc, b.D, x);
                }
        if (ze > rounded) rounded = ze;
        attend(pa, &a, p0, T, oa);
        attend(pb, &b, p0, T, ob);
        calls++;
        for (int l = 0; l < a.L; l++) d = fmax(d, max_diff(oa + (size_t)l * a.ctx * a.H * a.D + (size_t)p0 * a.H * a.D,
                                                      ob + (size_t)l * b.ctx * b.H * b.D + (size_t)p0 * b.H * b.D, (size_t)T * a.H * a.D));
        bad_rows += memcmp(a.k, b.k, kvn * 4) != 0 || memcmp(a.v, b.v, kvn * 4) != 0;
    }
    check(d == 0 && bad_rows == 0,
          "zone_fp8: %d calls (prompt, steps, an update, chunks, a rewind): the cache's zone rows are their fp8 values and the output "
          "equals the plain policy's on such a cache (max diff %.1e, calls with other rows %d)", calls, d, bad_rows);
    pa->destroy(pa), pb->destroy(pb);
    free(oa), free(ob), free_inputs(&a), free_inputs(&b);
}

// A rewind (a chat's re-rendered turn) keeps the zone's unchanged keys in the ParisKV index
// (truncation) instead of encoding them again: after it, every output must equal that of a
// fresh policy that saw the final contents from the start. Content from the rewind point on is
// replaced, the index loses two updates' worth of slots.
static void test_rewind_truncates(void) {
    Rng r = {4242};
    Inputs a = make_inputs(&r, 2, 6, 2, 64, 1100);
    size_t row = (size_t)a.Hkv * a.D, qrow = (size_t)a.H * a.D, qn = (size_t)a.L * a.ctx * qrow;
    AttnConfig c;
    attn_config_default(&c);
    c.topk = 24, c.local = 96, c.update = 64, c.dense_min = 0, c.prefill_len = 600;
    AttnPolicy *pa = create(&c, &a), *pb = create(&c, &a);
    float *oa = xcalloc(qn, sizeof(float)), *ob = xcalloc(qn, sizeof(float));
    attend(pa, &a, 0, 600, oa);
    for (int p = 600; p < 900; p++) attend(pa, &a, p, 1, oa);
    for (int l = 0; l < a.L; l++) // new rows and queries from 750 on
        for (size_t i = 750 * row; i < (size_t)a.ctx * row; i++) {
            size_t o = (size_t)l * a.ctx * row + i;
            a.k[o] = gauss(&r), a.v[o] = gauss(&r);
        }
    for (size_t i = 0; i < (size_t)a.L * a.ctx; i++)
        if ((int)(i % a.ctx) >= 750) for (size_t j = 0; j < qrow; j++) a.q[i * qrow + j] = gauss(&r);
    for (int p = 750; p < 1000; p++) attend(pa, &a, p, 1, oa); // rewound
    attend(pb, &a, 0, 600, ob);
    attend(pb, &a, 600, 150, ob);
    for (int p = 750; p < 1000; p++) attend(pb, &a, p, 1, ob);
    double d = 0;
    for (int l = 0; l < a.L; l++) d = fmax(d, max_diff(oa + ((size_t)l * a.ctx + 750) * qrow, ob + ((size_t)l * a.ctx + 750) * qrow, 250 * qrow));
    check(d == 0, "rewind from 900 to 750 (zone slots 628..756 dropped, 0..628 kept): 250 steps equal a fresh policy's (max diff %.1e)", d);
    pa->destroy(pa), pb->destroy(pb);
    free(oa), free(ob), free_inputs(&a);
}

// --profile's overlap: the definition on hand-made sets, then the policy's measurement against
// selection_overlap of consecutive attn_policy_select results, step by step and in chunks.
static void test_overlap_definition(void) {
    int a[] = {1, 2, 3, 4}, b[] = {2, 3, 5, 9}, c[] = {10, 11}, d[] = {1, 2};
    check(selection_overlap(a, 4, b, 4) == 0.5, "overlap {1,2,3,4} vs {2,3,5,9}: 2 of 4 = %.3f", selection_overlap(a, 4, b, 4));
    check(selection_overlap(a, 4, a, 4) == 1.0 && selection_overlap(a, 4, c, 2) == 0.0, "overlap: a set with itself 1, disjoint sets 0");
    check(selection_overlap(d, 2, a, 4) == 0.5 && selection_overlap(a, 4, d, 2) == 0.5, "overlap of sets of 2 and 4 sharing 2: / the larger, 0.5");
    check(selection_overlap(NULL, 0, NULL, 0) == 1.0 && selection_overlap(a, 4, NULL, 0) == 0.0, "overlap: two empty sets 1, one empty 0");
}

// The reference: each step's selections by attn_policy_select (valid right after the step), the
// overlap of consecutive decode steps summed per (layer, KV head).
static void overlap_reference(AttnPolicy *ap, const Inputs *in, int pos, int *prev, int *prev_n, double *sum, long *cnt) {
    int G = in->H / in->Hkv, kmax = attn_policy_config(ap)->topk + 16, sel[64];
    for (int l = 0; l < in->L; l++)
        for (int h = 0; h < in->Hkv; h++) {
            const float *qg = in->q + (((size_t)l * in->ctx + pos) * in->H + (size_t)h * G) * in->D;
            int lh = l * in->Hkv + h, n = attn_policy_select(ap, l, h, qg, pos, 0, 0, sel);
            if (n >= 0 && prev_n[lh] >= 0) sum[lh] += selection_overlap(sel, n, prev + lh * kmax, prev_n[lh]), cnt[lh]++;
            prev_n[lh] = n;
            if (n > 0) memcpy(prev + lh * kmax, sel, (size_t)n * sizeof(int));
        }
}

static void test_overlap_policy(void) {
    Rng r = {31};
    Inputs in = make_inputs(&r, 2, 6, 2, 64, 720);
    size_t n = (size_t)in.L * in.ctx * in.H * in.D;
    float *a = xcalloc(n, sizeof(float)), *b = xcalloc(n, sizeof(float));
    int threads = pool_max_threads();
    pool_set_threads(1); // the sums in step order: equal to the reference's, bit for bit
    AttnConfig c;
    attn_config_default(&c);
    c.sink = 4, c.local = 32, c.update = 64, c.topk = 16, c.dense_min = 200, c.profile = 1;
    AttnPolicy *pa = create(&c, &in), *pb = create(&c, &in);
    int LH = in.L * in.Hkv, prev[4 * 32], prev_n[4];
    double sum[4] = {0};
    long cnt[4] = {0};
    for (int i = 0; i < LH; i++) prev_n[i] = -1;
    for (int p = 0; p < in.ctx; p++) {
        attend(pa, &in, p, 1, a);
        overlap_reference(pa, &in, p, prev, prev_n, sum, cnt);
    }
    for (int p = 0; p < in.ctx; p += 64) attend(pb, &in, p, p + 64 < in.ctx ? 64 : in.ctx - p, b);
    int same = 1;
    double lo = 1, hi = 0;
    for (int i = 0; i < LH; i++) {
        double ma, mb;
        long na = attn_policy_overlap(pa, i / in.Hkv, i % in.Hkv, &ma), nb = attn_policy_overlap(pb, i / in.Hkv, i % in.Hkv, &mb);
        same &= na == cnt[i] && nb == cnt[i] && cnt[i] > 0 && ma == sum[i] / cnt[i] && mb == ma;
        lo = fmin(lo, ma), hi = fmax(hi, ma);
    }
    check(same, "profile overlap per (layer, KV head), steps and chunks of 64, equals the consecutive selections' (%ld steps; means %.3f..%.3f)",
          cnt[0], lo, hi);
    double ha, ra, hb, rb;
    int lines = attn_policy_cache_sim(pa, &ha, &ra);
    check(lines == attn_cache_rows_default(c.topk) && attn_policy_cache_sim(pb, &hb, &rb) == lines && ha == hb && ra == rb && ra > 0 && ha > 0,
          "profile's row cache simulation (%d lines) reads the same rows from the cache, steps and chunks (%.0f of %.0f)", lines, ha, ra);
    attend(pa, &in, 0, 1, a); // a new sequence: its first decode step has nothing to compare with
    double m0;
    long before = attn_policy_overlap(pa, 0, 0, &m0);
    for (int p = 1; p < 260; p++) attend(pa, &in, p, 1, a);
    check(attn_policy_overlap(pa, 0, 0, &m0) == before + 259 - (attn_dense_threshold(&c) - 1),
          "after a new sequence, the overlap counts from its second decode step on");
    pa->destroy(pa), pb->destroy(pb);
    pool_set_threads(threads);
    free(a), free(b), free_inputs(&in);
}

static void test_bad_config(void) {
    Rng r = {16};
    Inputs in = make_inputs(&r, 1, 2, 1, 64, 64);
    char err[ATTN_ERR_LEN];
    AttnConfig c;
    attn_config_default(&c);
    c.topk = 0;
    AttnPolicy *a = attn_policy_create(&c, &pool_parallel, 1, 2, 1, 64, 64, err);
    check(!a && strstr(err, "topk"), "topk 0 is refused: %s", err);
    attn_config_default(&c);
    AttnPolicy *b = attn_policy_create(&c, &pool_parallel, 1, 2, 1, 48, 64, err);
    check(!b && strstr(err, "power of two"), "pariskv refuses head_dim 48: %s", err);
    c.method = ATTN_FULL;
    check(!attn_policy_create(&c, &pool_parallel, 1, 2, 1, 64, 64, err), "full attention makes no policy: %s", err);
    check(attn_method_parse("quest") == ATTN_QUEST && attn_method_parse("nope") == -1, "method names parse");
    free_inputs(&in);
}

int main(void) {
    pool_set_max_threads(pool_max_threads() > 2 ? pool_max_threads() : 2); // the thread-count check needs two
    test_regions();
    test_exact_when_budget_covers_zone();
    test_chunks_equal_steps();
    test_streaming();
    test_planted_recall();
    test_drift();
    test_zone_fp8();
    test_rewind_truncates();
    test_overlap_definition();
    test_overlap_policy();
    test_bad_config();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
