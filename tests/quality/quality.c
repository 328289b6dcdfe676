// Retrieval quality of ParisKV and its peers on a real model, side by side (a measurement, not a
// test: tests/quality/run.sh builds and runs it; tests/bench/RESULTS.md keeps what it printed).
//
//   text:  teacher-force a long text (P = 0: every position is a decode step, as ./run --score
//          does) under full attention and under each policy in lockstep, chunk by chunk;
//          per position: KL(full || policy) of the next-token distribution, top-1 agreement,
//          NLL (perplexity); every `stride` positions, for every layer and KV head: Recall@k of
//          the selected keys against the exact top-k by the same score (<mean query, key>), and
//          the share of the exact softmax mass over the retrieval zone that they capture.
//   drift: generate greedily with full attention from a long prompt, then teacher-force prompt +
//          generation (P = the prompt) the same way; the metrics by quarter of the generation.
//
// Sharing: positions that every policy attends densely (below the dense threshold, or the
// prompt) run once, under full attention, and their K/V rows are copied to every policy's cache;
// the policies then run in parallel, one thread each, all against the same full-attention logits.
#include "../../attention/attention.h"
#include "../../attention/selector.h"
#include "../../model/model.h"
#include "../../tokenizer/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include "../../model/pool.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK 64
#define MAX_BINS 8
#define MAX_ARMS 12
static int arm_threads = 1; // OpenMP threads running the arms side by side
#define ZONE_BIN 1000 // zone-size bins for the comparison with the paper's recall figures
#define ZONE_BINS 16

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "quality: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) die("out of memory (%.1f MiB)", (double)n * size / (1 << 20));
    return p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    double n, kl, top1, nll, nll_full; // scored positions
    double rn, recall, mass;           // retrieval samples: position x layer x KV head
} Bin;

typedef struct {
    int n, prefill, stride, n_bins, bin_lo, bin_hi;
    const int *tokens;
} Exp;

typedef struct {
    int method, topk; // topk 0: the base budget
} ArmSpec;

typedef struct {
    int method;
    char label[32]; // method, "@k" when the budget is not the base one
    AttnConfig cfg;
    AttnPolicy *inner; // the policy under test
    AttnPolicy probe;  // wraps inner: stops after each sampled query to measure its selection
    RunState s;
    const Exp *e;
    const Model *m;
    Bin bin[MAX_BINS];
    double zone_recall[ZONE_BINS][2], zone_n[ZONE_BINS]; // pariskv: [schedule, ratio 0.10] by zone size
    int select_failures;
    // measurement scratch
    float *score, *qbar;
    ScoredId *heap;
    int *sel, *top;
    char *mark;
    double *z;
    double seconds;
} Arm;

static int bin_of(const Exp *e, int p) {
    if (p < e->bin_lo || p >= e->bin_hi) return -1;
    int b = (int)((long)(p - e->bin_lo) * e->n_bins / (e->bin_hi - e->bin_lo));
    return b < e->n_bins ? b : e->n_bins - 1;
}

// Recall@k and softmax-mass share of one selection at position p for one KV head, whose group's
// query heads are qg; k_cache is the layer's cache.
static void measure_one(Arm *a, int kv_head, const float *qg, const float *k_cache, int p, const int *sel, int nsel, double *recall, double *mass) {
    const Config *c = &a->m->c;
    int D = (int)c->head_dim, G = (int)(c->n_heads / c->n_kv_heads), kv = (int)c->n_kv_heads * D, S = a->cfg.sink;
    int ze = attn_zone_end(&a->cfg, p), nz = ze - S, k = a->cfg.topk;
    for (int j = 0; j < D; j++) {
        float s = 0.0f;
        for (int g = 0; g < G; g++) s += qg[g * D + j];
        a->qbar[j] = s / (float)G;
    }
    const float *kz = k_cache + (size_t)S * kv + (size_t)kv_head * D;
    for (int i = 0; i < nz; i++) {
        const float *ki = kz + (size_t)i * kv;
        double d = 0;
        for (int j = 0; j < D; j++) d += (double)a->qbar[j] * ki[j];
        a->score[i] = (float)d;
    }
    int ntop = topk_select(a->score, NULL, nz, k, a->heap, a->top);
    memset(a->mark, 0, (size_t)nz);
    for (int i = 0; i < ntop; i++) a->mark[a->top[i]] = 1;
    int hit = 0;
    for (int i = 0; i < nsel; i++) hit += a->mark[sel[i] - S];
    *recall = ntop ? (double)hit / ntop : 1.0;
    // mass: per query head, softmax over the zone, summed over the selected keys
    double m = 0;
    for (int g = 0; g < G; g++) {
        const float *qh = qg + g * D;
        double mx = -1e300, sum = 0, got = 0;
        for (int i = 0; i < nz; i++) {
            const float *ki = kz + (size_t)i * kv;
            double d = 0;
            for (int j = 0; j < D; j++) d += (double)qh[j] * ki[j];
            a->z[i] = d / sqrt((double)D);
            if (a->z[i] > mx) mx = a->z[i];
        }
        for (int i = 0; i < nz; i++) sum += exp(a->z[i] - mx);
        for (int i = 0; i < nsel; i++) got += exp(a->z[sel[i] - S] - mx);
        m += nz ? got / sum : 1.0;
    }
    *mass = m / G;
}

static void measure(Arm *a, int layer, const float *q, const float *k_cache, int p) {
    const Config *c = &a->m->c;
    int D = (int)c->head_dim, G = (int)(c->n_heads / c->n_kv_heads);
    int b = bin_of(a->e, p), nz = attn_zone_end(&a->cfg, p) - a->cfg.sink;
    for (int h = 0; h < (int)c->n_kv_heads; h++) {
        const float *qg = q + (size_t)h * G * D;
        int nsel = attn_policy_select(a->inner, layer, h, qg, p, 0, 0, a->sel);
        if (nsel < 0) {
            a->select_failures++;
            continue;
        }
        double r, m;
        measure_one(a, h, qg, k_cache, p, a->sel, nsel, &r, &m);
        if (b >= 0) a->bin[b].rn++, a->bin[b].recall += r, a->bin[b].mass += m;
        int zb = nz / ZONE_BIN < ZONE_BINS ? nz / ZONE_BIN : ZONE_BINS - 1;
        if (a->method == ATTN_PARISKV) {
            a->zone_recall[zb][0] += r;
            nsel = attn_policy_select(a->inner, layer, h, qg, p, 0.10f, 0.20f, a->sel); // the paper's ratio 0.10
            measure_one(a, h, qg, k_cache, p, a->sel, nsel, &r, &m);
            a->zone_recall[zb][1] += r, a->zone_n[zb]++;
        }
    }
}

static int sampled(const Arm *a, int p) {
    return !attn_is_dense(&a->cfg, p) && (p - attn_dense_threshold(&a->cfg)) % a->e->stride == 0;
}

// The inner policy's attend, cut after every sampled query so that its index is exactly that
// query's zone when the selection is measured.
static void probe_attend(AttnPolicy *pp, int layer, float *out, const float *q, float *k_cache, float *v_cache, int pos0, int T,
                         int n_heads, int n_kv_heads, int head_dim, float *scratch) {
    Arm *a = pp->state;
    size_t row = (size_t)n_heads * head_dim;
    int t0 = 0;
    for (int t = 0; t < T; t++) {
        if (!sampled(a, pos0 + t)) continue;
        a->inner->attend(a->inner, layer, out + t0 * row, q + t0 * row, k_cache, v_cache, pos0 + t0, t - t0 + 1, n_heads, n_kv_heads, head_dim,
                         scratch);
        measure(a, layer, q + t * row, k_cache, pos0 + t);
        t0 = t + 1;
    }
    if (t0 < T)
        a->inner->attend(a->inner, layer, out + t0 * row, q + t0 * row, k_cache, v_cache, pos0 + t0, T - t0, n_heads, n_kv_heads, head_dim, scratch);
}

static void probe_reset(AttnPolicy *pp) {
    Arm *a = pp->state;
    a->inner->reset(a->inner);
}

static void probe_destroy(AttnPolicy *pp) { (void)pp; }

static int argmax_f(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

static double log_z(const float *l, int n) {
    float mx = l[argmax_f(l, n)];
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)l[i] - mx);
    return log(s) + mx;
}

// Runs the experiment: full attention and every arm in lockstep over e->tokens[0..n).
static void lockstep(const Model *m, const Exp *e, Arm *arms, int n_arms, Bin *full_bin, double *full_seconds) {
    const Config *c = &m->c;
    int V = (int)c->vocab_size, kv = (int)(c->n_kv_heads * c->head_dim);
    char err[MODEL_ERR_LEN];
    RunState full;
    if (run_state_init(&full, m, e->n, CHUNK, 1, err) != 0) die("%s", err);
    double *lzf = xcalloc(CHUNK, sizeof(double));
    int *amf = xcalloc(CHUNK, sizeof(int));
    double t_start = now_s(), t_full = 0;
    for (int c0 = 0; c0 < e->n; c0 += CHUNK) {
        int T = e->n - c0 < CHUNK ? e->n - c0 : CHUNK;
        double t0 = now_s();
        const float *lf = model_forward(m, &full, e->tokens + c0, T, c0, 1, err);
        if (!lf) die("%s", err);
        for (int t = 0; t < T; t++) lzf[t] = log_z(lf + (size_t)t * V, V), amf[t] = argmax_f(lf + (size_t)t * V, V);
        t_full += now_s() - t0;
        int all_dense = 1;
        for (int i = 0; i < n_arms; i++) all_dense &= attn_is_dense(&arms[i].cfg, c0 + T - 1);
        if (all_dense) { // every arm attends densely: share full's K/V
            for (int i = 0; i < n_arms; i++)
                for (uint32_t l = 0; l < c->n_layers; l++) {
                    size_t off = ((size_t)l * e->n + c0) * kv;
                    memcpy(arms[i].s.key_cache + off, full.key_cache + off, (size_t)T * kv * sizeof(float));
                    memcpy(arms[i].s.value_cache + off, full.value_cache + off, (size_t)T * kv * sizeof(float));
                }
            continue;
        }
        for (int t = 0; t < T; t++) {
            int p = c0 + t, b = bin_of(e, p);
            if (b >= 0 && p + 1 < e->n && !attn_is_dense(&arms[0].cfg, p))
                full_bin[b].nll_full += lzf[t] - lf[(size_t)t * V + e->tokens[p + 1]], full_bin[b].n++;
        }
        // One thread per arm: the forward pass inside runs single-threaded (the pool takes one
        // operation at a time; with a team of one it runs tasks on the calling thread).
        int team = pool_threads();
        pool_set_threads(1);
#pragma omp parallel for schedule(dynamic, 1) num_threads(arm_threads)
        for (int i = 0; i < n_arms; i++) {
            Arm *a = &arms[i];
            double ta = now_s();
            char aerr[MODEL_ERR_LEN];
            const float *la = model_forward(m, &a->s, e->tokens + c0, T, c0, 1, aerr);
            if (!la) die("%s", aerr);
            for (int t = 0; t < T; t++) {
                int p = c0 + t, b = bin_of(e, p);
                if (b < 0 || p + 1 >= e->n || attn_is_dense(&a->cfg, p)) continue;
                const float *f = lf + (size_t)t * V, *g = la + (size_t)t * V;
                double lza = log_z(g, V), kl = 0;
                for (int v = 0; v < V; v++) {
                    double lpf = f[v] - lzf[t];
                    kl += exp(lpf) * (lpf - (g[v] - lza));
                }
                Bin *bb = &a->bin[b];
                bb->n++, bb->kl += kl, bb->top1 += argmax_f(g, V) == amf[t];
                bb->nll += lza - g[e->tokens[p + 1]];
                bb->nll_full += lzf[t] - f[e->tokens[p + 1]];
            }
            a->seconds += now_s() - ta;
        }
        pool_set_threads(team);
        double el = now_s() - t_start;
        fprintf(stderr, "\r  %d / %d positions, %.0f s elapsed, %.0f s left   ", c0 + T, e->n, el, el / (c0 + T) * (e->n - c0 - T));
    }
    fprintf(stderr, "\n");
    *full_seconds = t_full;
    free(lzf), free(amf);
    run_state_free(&full);
}

static void arms_init(Arm *arms, int n_arms, const Model *m, const Exp *e, const AttnConfig *base, const ArmSpec *spec) {
    const Config *c = &m->c;
    for (int i = 0; i < n_arms; i++) {
        Arm *a = &arms[i];
        memset(a, 0, sizeof *a);
        a->method = spec[i].method, a->e = e, a->m = m;
        a->cfg = *base;
        a->cfg.method = spec[i].method, a->cfg.prefill_len = e->prefill;
        if (spec[i].topk) a->cfg.topk = spec[i].topk;
        snprintf(a->label, sizeof a->label, spec[i].topk ? "%s@%d" : "%s", attn_method_name(spec[i].method), spec[i].topk);
        char err[ATTN_ERR_LEN > MODEL_ERR_LEN ? ATTN_ERR_LEN : MODEL_ERR_LEN];
        a->inner = attn_policy_create(&a->cfg, &pool_parallel, (int)c->n_layers, (int)c->n_heads, (int)c->n_kv_heads, (int)c->head_dim, e->n, err);
        if (!a->inner) die("%s", err);
        a->probe = (AttnPolicy){a->inner->name, probe_attend, probe_reset, probe_destroy, a};
        if (run_state_init(&a->s, m, e->n, CHUNK, 1, err) != 0) die("%s", err);
        a->s.attn = &a->probe;
        a->score = xcalloc((size_t)e->n, sizeof(float));
        a->z = xcalloc((size_t)e->n, sizeof(double));
        a->heap = xcalloc((size_t)a->cfg.topk + 16, sizeof(ScoredId));
        a->sel = xcalloc((size_t)a->cfg.topk + 16, sizeof(int));
        a->top = xcalloc((size_t)a->cfg.topk + 16, sizeof(int));
        a->mark = xcalloc((size_t)e->n, 1);
        a->qbar = xcalloc(c->head_dim, sizeof(float));
    }
}

static void arms_free(Arm *arms, int n_arms) {
    for (int i = 0; i < n_arms; i++) {
        Arm *a = &arms[i];
        a->inner->destroy(a->inner);
        run_state_free(&a->s);
        free(a->score), free(a->z), free(a->heap), free(a->sel), free(a->top), free(a->mark), free(a->qbar);
    }
}

static Bin sum_bins(const Bin *b, int n) {
    Bin s = {0};
    for (int i = 0; i < n; i++)
        s.n += b[i].n, s.kl += b[i].kl, s.top1 += b[i].top1, s.nll += b[i].nll, s.nll_full += b[i].nll_full, s.rn += b[i].rn, s.recall += b[i].recall,
            s.mass += b[i].mass;
    return s;
}

static void print_summary(const Exp *e, const Arm *arms, int n_arms, const Bin *full_bin, int k) {
    // k: the base budget (an arm labelled name@k has its own)
    Bin f = sum_bins(full_bin, e->n_bins);
    double ppl_full = exp(f.nll_full / f.n);
    printf("| policy | KL(full‖policy) nats | top-1 agreement | perplexity | Δ perplexity | Recall@k (k = %d unless @k) | attention mass |\n", k);
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    printf("| full | 0 | 100%% | %.4f | 0 | 100%% | 100%% |\n", ppl_full);
    for (int i = 0; i < n_arms; i++) {
        Bin s = sum_bins(arms[i].bin, e->n_bins);
        double ppl = exp(s.nll / s.n); // Δ: against full attention over this arm's positions
        printf("| %s | %.5f | %.2f%% | %.4f | %+.2f%% | %.1f%% | %.1f%% |\n", arms[i].label, s.kl / s.n, 100 * s.top1 / s.n, ppl,
               100 * (exp((s.nll - s.nll_full) / s.n) - 1), 100 * s.recall / s.rn, 100 * s.mass / s.rn);
    }
    printf("\n%.0f scored positions [%d, %d); %.0f retrieval samples per policy (every %d positions x layers x KV heads)\n\n", f.n, e->bin_lo,
           e->bin_hi, n_arms ? sum_bins(arms[0].bin, e->n_bins).rn : 0, e->stride);
}

static void print_bins(const Exp *e, const Arm *arms, int n_arms, const Bin *full_bin, const char *unit, int offset) {
    printf("| policy | metric |");
    for (int b = 0; b < e->n_bins; b++) {
        int lo = e->bin_lo + (int)((long)(e->bin_hi - e->bin_lo) * b / e->n_bins), hi = e->bin_lo + (int)((long)(e->bin_hi - e->bin_lo) * (b + 1) / e->n_bins);
        printf(" %s %d–%d |", unit, lo - offset, hi - offset);
    }
    printf("\n| --- | --- |");
    for (int b = 0; b < e->n_bins; b++) printf(" ---: |");
    printf("\n| full | perplexity |");
    for (int b = 0; b < e->n_bins; b++) printf(" %.3f |", exp(full_bin[b].nll_full / full_bin[b].n));
    printf("\n");
    for (int i = 0; i < n_arms; i++) {
        const Bin *bb = arms[i].bin;
        const char *name = arms[i].label;
        printf("| %s | KL |", name);
        for (int b = 0; b < e->n_bins; b++) printf(" %.4f |", bb[b].kl / bb[b].n);
        printf("\n| %s | Δ perplexity |", name);
        for (int b = 0; b < e->n_bins; b++) printf(" %+.2f%% |", 100 * (exp((bb[b].nll - bb[b].nll_full) / bb[b].n) - 1));
        printf("\n| %s | top-1 |", name);
        for (int b = 0; b < e->n_bins; b++) printf(" %.1f%% |", 100 * bb[b].top1 / bb[b].n);
        printf("\n| %s | Recall@k |", name);
        for (int b = 0; b < e->n_bins; b++) printf(" %.1f%% |", 100 * bb[b].recall / bb[b].rn);
        printf("\n| %s | mass |", name);
        for (int b = 0; b < e->n_bins; b++) printf(" %.1f%% |", 100 * bb[b].mass / bb[b].rn);
        printf("\n");
    }
    printf("\n");
}

static void print_zone_recall(const Arm *arms, int n_arms) {
    for (int i = 0; i < n_arms; i++) {
        const Arm *a = &arms[i];
        if (a->method != ATTN_PARISKV) continue;
        int k = a->cfg.topk;
        printf("%s by zone size:\n\n| zone size (keys) | samples | Recall@%d, adaptive (β, ρ) | Recall@%d, β = 0.10, ρ = 0.20 |\n| --- | ---: | ---: | ---: |\n",
               a->label, k, k);
        for (int z = 0; z < ZONE_BINS; z++)
            if (a->zone_n[z] > 0)
                printf("| %d–%d | %.0f | %.1f%% | %.1f%% |\n", z * ZONE_BIN, (z + 1) * ZONE_BIN, a->zone_n[z], 100 * a->zone_recall[z][0] / a->zone_n[z],
                       100 * a->zone_recall[z][1] / a->zone_n[z]);
        printf("\n");
    }
}

static void run_experiment(const Model *m, const Exp *e, const AttnConfig *base, const ArmSpec *spec, int n_arms, const char *unit, int offset) {
    Arm *arms = xcalloc((size_t)n_arms, sizeof(Arm));
    Bin full_bin[MAX_BINS] = {{0}};
    double t0 = now_s(), full_s;
    arms_init(arms, n_arms, m, e, base, spec);
    lockstep(m, e, arms, n_arms, full_bin, &full_s);
    double el = now_s() - t0;
    print_summary(e, arms, n_arms, full_bin, base->topk);
    print_bins(e, arms, n_arms, full_bin, unit, offset);
    print_zone_recall(arms, n_arms);
    for (int i = 0; i < n_arms; i++)
        if (arms[i].select_failures) printf("warning: %s: %d selections could not be measured\n", arms[i].label, arms[i].select_failures);
    printf("time: %.0f s wall; full attention %.0f s", el, full_s);
    for (int i = 0; i < n_arms; i++) printf(", %s %.0f s", arms[i].label, arms[i].seconds);
    printf(" (policy times are per thread, %d threads)\n\n", arm_threads);
    fflush(stdout);
    arms_free(arms, n_arms);
    free(arms);
}

static int *tokenize_file(const Tokenizer *tok, const char *path, int *n) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open '%s': %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = xcalloc((size_t)len + 1, 1);
    if (fread(text, 1, (size_t)len, f) != (size_t)len) die("cannot read '%s'", path);
    fclose(f);
    char err[TOK_ERR_LEN];
    int *ids = NULL;
    long k = tokenizer_encode(tok, text, (size_t)len, 1, &ids, err);
    if (k < 0) die("cannot tokenize '%s': %s", path, err);
    free(text);
    *n = (int)k;
    return ids;
}

// Greedy continuation of prompt[0..P) with full attention, G tokens, into out (cached in a file).
static void generate(const Model *m, const int *prompt, int P, int G, int *out, const char *cache) {
    FILE *f = cache ? fopen(cache, "r") : NULL;
    if (f) {
        int cp, cg, ok = fscanf(f, "%d %d", &cp, &cg) == 2 && cp == P && cg == G;
        for (int i = 0; ok && i < P; i++) {
            int x;
            ok = fscanf(f, "%d", &x) == 1 && x == prompt[i];
        }
        for (int i = 0; ok && i < G; i++) ok = fscanf(f, "%d", &out[i]) == 1;
        fclose(f);
        if (ok) {
            fprintf(stderr, "drift: %d generated tokens from %s\n", G, cache);
            return;
        }
    }
    char err[MODEL_ERR_LEN];
    RunState s;
    if (run_state_init(&s, m, P + G, CHUNK, 0, err) != 0) die("%s", err);
    // One thread: a single-token step opens some 250 parallel regions, and on a shared machine
    // their barriers cost more than the work (1.5 s per token measured with 2 threads, one core
    // busy elsewhere). The tokens do not depend on the thread count.
    int threads = pool_threads();
    pool_set_threads(1);
    const float *l = NULL;
    for (int i = 0; i < P; i += CHUNK)
        if (!(l = model_forward(m, &s, prompt + i, P - i < CHUNK ? P - i : CHUNK, i, 0, err))) die("%s", err);
    double t0 = now_s();
    for (int i = 0; i < G; i++) {
        out[i] = argmax_f(l, (int)m->c.vocab_size);
        if (i + 1 < G && !(l = model_forward(m, &s, &out[i], 1, P + i, 0, err))) die("%s", err);
        if (i % 64 == 63) fprintf(stderr, "\r  generated %d / %d (%.0f ms/token)", i + 1, G, 1e3 * (now_s() - t0) / (i + 1));
    }
    fprintf(stderr, "\n");
    pool_set_threads(threads);
    run_state_free(&s);
    if (cache && (f = fopen(cache, "w"))) {
        fprintf(f, "%d %d\n", P, G);
        for (int i = 0; i < P; i++) fprintf(f, "%d%c", prompt[i], i + 1 < P ? ' ' : '\n');
        for (int i = 0; i < G; i++) fprintf(f, "%d%c", out[i], i + 1 < G ? ' ' : '\n');
        fclose(f);
    }
}

static long parse_long(const char *s, const char *flag, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) die("%s needs an integer in [%ld, %ld], got '%s'", flag, lo, hi, s);
    return v;
}

static void usage(void) {
    printf("usage: quality MODEL.bin [options]\n"
           "  --text FILE          long text for the teacher-forced run (default ../shared/papers/002_2a568f802c63c4ca.txt)\n"
           "  --positions N        its first N tokens (default: the model's context)\n"
           "  --stride S           retrieval metrics every S positions (default 64)\n"
           "  --bins B             report B position bins, early to late (default 4)\n"
           "  --policies LIST      comma-separated, each NAME or NAME@K for its own budget K\n"
           "                       (default pariskv,streaming,quest,fier,kmeans,oracle)\n"
           "  --topk K --sink S --local L --update U   the budget and regions (defaults 100 4 256 512)\n"
           "  --drift-text FILE    prompt source for the drift run (default ../shared/papers/003_87dadc83df7b9a89.txt)\n"
           "  --drift-prompt N     prompt tokens (default 3072; 0 skips the drift run)\n"
           "  --drift-gen N        tokens generated greedily with full attention (default 4096)\n"
           "  --drift-cache FILE   the generated tokens, reused when the prompt matches (default build/quality/drift.ids)\n"
           "  --no-text            skip the teacher-forced text run\n");
}

int main(int argc, char **argv) {
    arm_threads = omp_get_max_threads(); // before the pool's first operation sets this thread's count to one (pool.c)
    const char *model_path = NULL, *text = "../shared/papers/002_2a568f802c63c4ca.txt", *drift_text = "../shared/papers/003_87dadc83df7b9a89.txt";
    const char *drift_cache = "build/quality/drift.ids", *policies = "pariskv,streaming,quest,fier,kmeans,oracle";
    int positions = 0, stride = 64, bins = 4, drift_prompt = 3072, drift_gen = 4096, do_text = 1;
    AttnConfig base;
    attn_config_default(&base);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = a[0] == '-' && a[1] == '-' && strcmp(a, "--no-text") && strcmp(a, "--help");
        if (takes && !v) die("%s needs a value", a);
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(), 0;
        else if (strcmp(a, "--text") == 0) text = v;
        else if (strcmp(a, "--positions") == 0) positions = (int)parse_long(v, a, 2, 1 << 24);
        else if (strcmp(a, "--stride") == 0) stride = (int)parse_long(v, a, 1, 1 << 24);
        else if (strcmp(a, "--bins") == 0) bins = (int)parse_long(v, a, 1, MAX_BINS);
        else if (strcmp(a, "--policies") == 0) policies = v;
        else if (strcmp(a, "--topk") == 0) base.topk = (int)parse_long(v, a, 1, 1 << 20);
        else if (strcmp(a, "--sink") == 0) base.sink = (int)parse_long(v, a, 0, 1 << 20);
        else if (strcmp(a, "--local") == 0) base.local = (int)parse_long(v, a, 0, 1 << 20);
        else if (strcmp(a, "--update") == 0) base.update = (int)parse_long(v, a, 1, 1 << 20);
        else if (strcmp(a, "--drift-text") == 0) drift_text = v;
        else if (strcmp(a, "--drift-prompt") == 0) drift_prompt = (int)parse_long(v, a, 0, 1 << 24);
        else if (strcmp(a, "--drift-gen") == 0) drift_gen = (int)parse_long(v, a, 1, 1 << 24);
        else if (strcmp(a, "--drift-cache") == 0) drift_cache = v;
        else if (strcmp(a, "--no-text") == 0) do_text = 0;
        else if (a[0] == '-') die("unknown option '%s' (see --help)", a);
        else if (!model_path) model_path = a;
        else die("unexpected argument '%s'", a);
        if (takes) i++;
    }
    if (!model_path) return usage(), 1;
    ArmSpec spec[MAX_ARMS];
    int n_arms = 0;
    for (const char *p = policies; *p;) { // name or name@k
        char name[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof name) die("bad --policies '%s'", policies);
        memcpy(name, p, len), name[len] = 0;
        char *at = strchr(name, '@');
        int k = 0;
        if (at) *at = 0, k = (int)parse_long(at + 1, "--policies budget", 1, 1 << 20);
        int mth = attn_method_parse(name);
        if (mth <= ATTN_FULL) die("--policies: '%s' is not a policy (pariskv, streaming, quest, fier, kmeans, oracle)", name);
        if (n_arms == MAX_ARMS) die("--policies: at most %d", MAX_ARMS);
        spec[n_arms++] = (ArmSpec){mth, k};
        p += len + (p[len] == ',');
    }

    Model m;
    char err[MODEL_ERR_LEN];
    if (model_load(&m, model_path, err) != 0) die("%s", err);
    const FileHeader *h = m.file.header;
    char terr[TOK_ERR_LEN];
    Tokenizer *tok = tokenizer_load(m.file.data + h->tokenizer_offset, h->tokenizer_size, terr);
    if (!tok) die("bad tokenizer section: %s", terr);
    int ctx = (int)m.c.max_seq_len;
    printf("model %s: %u layers, %u heads / %u KV heads, head_dim %u, context %d; topk %d, sink %d, local %d, update %d, dense below %d tokens; %d threads\n\n",
           model_path, m.c.n_layers, m.c.n_heads, m.c.n_kv_heads, m.c.head_dim, ctx, base.topk, base.sink, base.local, base.update,
           attn_dense_threshold(&base), arm_threads);

    if (do_text) {
        int n;
        int *ids = tokenize_file(tok, text, &n);
        if (positions == 0) positions = ctx;
        if (n < positions) die("'%s' has %d tokens, fewer than --positions %d", text, n, positions);
        int thr = attn_dense_threshold(&base);
        if (positions <= thr) die("--positions %d leaves nothing past the dense threshold %d", positions, thr);
        Exp e = {positions, 0, stride, bins, thr - 1, positions - 1, ids};
        printf("## Teacher-forced text: %s, %d tokens, every position a decode step (P = 0)\n\n", text, positions);
        fprintf(stderr, "text: %d positions, %d policies\n", positions, n_arms);
        run_experiment(&m, &e, &base, spec, n_arms, "positions", 0);
        free(ids);
    }
    if (drift_prompt > 0) {
        int n;
        int *ids = tokenize_file(tok, drift_text, &n);
        if (n < drift_prompt) die("'%s' has %d tokens, fewer than --drift-prompt %d", drift_text, n, drift_prompt);
        if (drift_prompt + drift_gen > ctx) die("--drift-prompt + --drift-gen = %d is past the context %d", drift_prompt + drift_gen, ctx);
        int total = drift_prompt + drift_gen;
        int *seq = xcalloc((size_t)total, sizeof(int));
        memcpy(seq, ids, (size_t)drift_prompt * sizeof(int));
        fprintf(stderr, "drift: generating %d tokens greedily after a %d-token prompt\n", drift_gen, drift_prompt);
        double t0 = now_s();
        generate(&m, seq, drift_prompt, drift_gen, seq + drift_prompt, drift_cache);
        double tg = now_s() - t0;
        int distinct = 0;
        char *seen = xcalloc(m.c.vocab_size, 1);
        for (int i = drift_prompt; i < total; i++) distinct += !seen[seq[i]], seen[seq[i]] = 1;
        free(seen);
        char *gen_text = tokenizer_decode(tok, seq + drift_prompt, (size_t)(drift_gen < 60 ? drift_gen : 60));
        printf("## Drift: %d-token prompt from %s, %d tokens generated greedily with full attention (%.0f s; %d distinct tokens), then teacher-forced (P = %d)\n\n",
               drift_prompt, drift_text, drift_gen, tg, distinct, drift_prompt);
        if (gen_text) {
            for (char *c = gen_text; *c; c++)
                if (*c == '\n' || *c == '|') *c = ' ';
            printf("generation begins: \"%s...\"\n\n", gen_text);
            free(gen_text);
        }
        Exp e = {total, drift_prompt, stride, bins, drift_prompt, total - 1, seq};
        run_experiment(&m, &e, &base, spec, n_arms, "generated", drift_prompt);
        free(seq), free(ids);
    }
    tokenizer_free(tok);
    model_free(&m);
    return 0;
}
