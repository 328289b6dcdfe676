// The selection policies as one AttnPolicy: the regions of the sequence, the sliding update, the
// dense threshold, and exact attention over sink + selected + local + buffer. What is selected
// comes from a Selector: ParisKV or one of its peers, all on the same keys and the same budget.
#include "attention.h"
#include "recall.h"
#include "selector.h"
#include "../offload/fp8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const method_names[ATTN_N_METHODS] = {"full", "pariskv", "streaming", "quest", "fier", "kmeans", "oracle"};

void attn_config_default(AttnConfig *c) {
    *c = (AttnConfig){.method = ATTN_PARISKV, .topk = 100, .sink = 4, .local = 256, .update = 512, .dense_min = 2000, .cache_rows = -1};
}

int attn_method_parse(const char *name) {
    for (int i = 0; i < ATTN_N_METHODS; i++)
        if (strcmp(name, method_names[i]) == 0) return i;
    return -1;
}

const char *attn_method_name(int method) { return method >= 0 && method < ATTN_N_METHODS ? method_names[method] : "?"; }

int attn_dense_threshold(const AttnConfig *c) {
    long t = (long)c->sink + c->local + 2L * c->topk;
    return t > c->dense_min ? (int)t : c->dense_min;
}

int attn_is_dense(const AttnConfig *c, int pos) { return pos < c->prefill_len || pos + 1 < attn_dense_threshold(c); }

int attn_zone_end(const AttnConfig *c, int pos) {
    // After the prefill the zone ends `local` tokens before the prompt's end (never inside the
    // sink); each update moves it forward by `update`, once per `update` decode steps.
    int r0 = c->prefill_len - c->local > c->sink ? c->prefill_len - c->local : c->sink;
    long over = (long)pos - r0 - c->local;
    return over < 0 ? r0 : r0 + c->update * (int)(over / c->update);
}

typedef struct {
    AttnConfig cfg;
    int n_layers, n_heads, n_kv_heads, head_dim, ctx, n_threads;
    const AttnParallel *par; // spreads the tasks over threads (n_threads: its most, at creation)
    Selector *sel;
    int *indexed;   // (n_layers) zone slots in the layer's index
    int *seen_end;  // (n_layers) end of the positions of the layer's last call
    int *fp8_end;   // (n_layers) zone_fp8: the layer's rows below it hold their fp8 values
    char *scratch;  // (n_threads, stride)
    size_t stride, sel_off;
    // --profile: the selection's step-to-step overlap. last_*: the latest decode query's selection
    // per (layer, KV head) (positions), next_*: the one a run's last query leaves, made last when
    // the run ends (the run's first query reads last_* meanwhile); sums per thread, no locks.
    int *last_sel, *next_sel; // (n_layers, n_kv, kmax)
    int *last_n, *next_n;     // (n_layers, n_kv)
    int *last_pos;            // (n_layers) the position last_* belongs to; -1: none
    double *ov_sum;           // (n_threads, n_layers, n_kv) overlaps summed
    long *ov_cnt;             // (n_threads, n_layers, n_kv) and counted
    // --profile: the GPU's zone row cache (kernels/pariskv_attend.h) simulated on the selections,
    // in step order when each run ends: the run's selections (its first PROFILE_RUN queries; a
    // longer run stops the simulation), the cache's tags, its hits and rows read.
    int sim_lines, sim_broken;
    int *run_sel, *run_n;     // (PROFILE_RUN, n_kv, kmax) zone slots, (PROFILE_RUN, n_kv)
    int *sim_tags;            // (n_layers, n_kv, sim_lines), -1: empty
    int *sim_first;           // (sim_lines) the line's first row this step (| SIM_HIT when a row hits it)
    unsigned *sim_stamp;      // (sim_lines) the step sim_first was written at
    unsigned sim_now;
    long *sim_hits, *sim_rows; // (n_layers, n_kv)
} Policy;

#define PROFILE_RUN 256 // the CPU's chunk (model/backend_cpu.c's max_chunk)
#define SIM_HIT 0x40000000

// Per-thread scratch: the mean query, the selected slots and their gathered rows, the attended
// rows' pointers and their scores, then the selector's own.
typedef struct {
    float *qbar;
    int *slots, *prev; // prev: --profile's selection of the query before
    float *ksel, *vsel;
    const float **krow, **vrow;
    float *score;
    void *sel;
} Scratch;

#define ALIGN64(x) (((x) + 63) & ~(size_t)63)

static size_t scratch_layout(const Policy *P, char *base, Scratch *s) {
    size_t hd = (size_t)P->head_dim, kmax = (size_t)P->cfg.topk + 16, ctx = (size_t)P->ctx, off = 0;
#define CARVE(field, type, count) \
    if (s) s->field = (type)(base + off); \
    off += ALIGN64((count) * sizeof(*s->field))
    CARVE(qbar, float *, hd);
    CARVE(slots, int *, kmax);
    CARVE(prev, int *, kmax);
    CARVE(ksel, float *, kmax * hd);
    CARVE(vsel, float *, kmax * hd);
    CARVE(krow, const float **, ctx);
    CARVE(vrow, const float **, ctx);
    CARVE(score, float *, attend_rows_scratch((int)hd, (int)ctx));
#undef CARVE
    if (s) s->sel = base + off;
    return off;
}

static Scratch thread_scratch(const Policy *P, int tid) {
    Scratch s;
    scratch_layout(P, P->scratch + (size_t)tid * P->stride, &s);
    return s;
}

static void reset_layer(Policy *P, int layer) {
    P->sel->reset(P->sel, layer);
    P->indexed[layer] = 0;
}

// --profile: the layer's next decode query has no previous one to compare with.
static void forget_last(Policy *P, int layer) {
    if (P->last_pos) P->last_pos[layer] = -1;
    for (size_t i = 0; P->sim_tags && i < (size_t)P->n_kv_heads * P->sim_lines; i++) // the GPU empties its cache then too
        P->sim_tags[(size_t)layer * P->n_kv_heads * P->sim_lines + i] = -1;
}

static void policy_reset(AttnPolicy *ap) {
    Policy *P = ap->state;
    for (int l = 0; l < P->n_layers; l++) reset_layer(P, l), forget_last(P, l), P->seen_end[l] = 0, P->fp8_end[l] = 0;
}

// zone_fp8: the rows of positions [p0, p1), every KV head, K and V, replaced by their fp8
// values (offload/fp8.h), as the GPU's host store holds them.
typedef struct {
    float *k_cache, *v_cache;
    int p0, rows, hd, n_kv_heads;
} Fp8Rows;

static void fp8_task(void *ctx, int task, int thread) {
    (void)thread;
    Fp8Rows *f = ctx;
    uint8_t c[1024]; // head_dim <= 1024: checked at creation
    for (int r = task * 64; r < (task + 1) * 64 && r < 2 * f->rows; r++) {
        float *x = (r < f->rows ? f->k_cache : f->v_cache) + (size_t)f->p0 * f->n_kv_heads * f->hd + (size_t)(r % f->rows) * f->hd;
        float s = fp8_quantize_row(x, f->hd, c);
        fp8_dequantize_row(c, s, f->hd, x);
    }
}

static void to_fp8(Policy *P, float *k_cache, float *v_cache, int p0, int p1) {
    Fp8Rows f = {k_cache, v_cache, p0, (p1 - p0) * P->n_kv_heads, P->head_dim, P->n_kv_heads};
    if (f.rows > 0) P->par->run((2 * f.rows + 63) / 64, fp8_task, &f);
}

typedef struct {
    Policy *P;
    int layer, from, need;
    KVStore *st;
} Extend;

static void extend_task(void *ctx, int h, int thread) {
    (void)thread;
    Extend *e = ctx;
    e->P->sel->extend(e->P->sel, e->layer, h, e->st, e->P->cfg.sink, e->from, e->need);
}

// Grows the layer's index to the zone [sink, zone_end): the keys leaving the local window are
// encoded while still in the working window, then evicted to the host store. With zone_fp8 the
// rows entering the zone are first replaced by their fp8 values: the index and the attention see
// what the store holds.
static void index_to(Policy *P, int layer, KVStore *st, float *k_cache, float *v_cache, int zone_end) {
    int need = zone_end - P->cfg.sink, from = P->indexed[layer];
    if (P->cfg.zone_fp8 && P->fp8_end[layer] < zone_end) {
        int p0 = P->fp8_end[layer] > P->cfg.sink ? P->fp8_end[layer] : P->cfg.sink;
        to_fp8(P, k_cache, v_cache, p0, zone_end);
        P->fp8_end[layer] = zone_end;
    }
    if (from > need) reset_layer(P, layer), from = 0; // the zone never shrinks within a sequence
    if (need <= from) return;
    Extend e = {P, layer, from, need, st};
    P->par->run(P->n_kv_heads, extend_task, &e);
    st->evict(st, P->cfg.sink + from, need - from);
    P->indexed[layer] = need;
}

static void mean_query(float *qbar, const float *qg, int G, int hd) {
    for (int j = 0; j < hd; j++) {
        float s = 0.0f;
        for (int g = 0; g < G; g++) s += qg[(size_t)g * hd + j];
        qbar[j] = s / (float)G;
    }
}

// The zone slots the group's queries qg select, ascending into out.
static int select_zone(const Policy *P, int layer, int kv_head, const float *qg, int zone_end, float beta, float rho, Scratch *s, int *out) {
    int G = P->n_heads / P->n_kv_heads, n = zone_end - P->cfg.sink;
    mean_query(s->qbar, qg, G, P->head_dim);
    SelectParams sp = {P->cfg.topk, beta, rho};
    return n > 0 ? P->sel->select(P->sel, layer, kv_head, s->qbar, n, &sp, s->sel, out) : 0;
}

// One decode query (position pos, chunk row t) and one KV head: select, fetch, attend for the
// group's query heads. Leaves the selected positions in s->slots; returns their count.
static int attend_one(const Policy *P, int layer, const KVStore *st, float *out, const float *q, int t, int pos, int kv_head, int zone_end,
                       Scratch *s) {
    int hd = P->head_dim, G = P->n_heads / P->n_kv_heads, S = P->cfg.sink;
    const float *qg = q + ((size_t)t * P->n_heads + (size_t)kv_head * G) * hd;
    int nsel = select_zone(P, layer, kv_head, qg, zone_end, P->cfg.beta, P->cfg.rho, s, s->slots);
    for (int i = 0; i < nsel; i++) s->slots[i] += S; // slots -> positions
    st->gather(st, kv_head, s->slots, nsel, s->ksel, s->vsel);
    // sink, then the selected keys (ascending), then local window + buffer: position order.
    int m = 0;
    for (int p = 0; p < S && p <= pos; p++, m++) s->krow[m] = kvstore_window_k(st, p, kv_head), s->vrow[m] = kvstore_window_v(st, p, kv_head);
    for (int i = 0; i < nsel; i++, m++) s->krow[m] = s->ksel + (size_t)i * hd, s->vrow[m] = s->vsel + (size_t)i * hd;
    for (int p = zone_end; p <= pos; p++, m++) s->krow[m] = kvstore_window_k(st, p, kv_head), s->vrow[m] = kvstore_window_v(st, p, kv_head);
    for (int g0 = 0; g0 < G; g0 += ATT_SUB) { // attention_dense's arithmetic: every position selected reproduces it
        size_t h = (size_t)t * P->n_heads + (size_t)kv_head * G + g0;
        attend_rows(out + h * hd, q + h * hd, G - g0 < ATT_SUB ? G - g0 : ATT_SUB, hd, s->krow, s->vrow, m, s->score);
    }
    return nsel;
}

typedef struct {
    const Policy *P;
    int layer;
    const KVStore *st;
    float *out;
    const float *q;
    int pos0, t0, t1, zone_end; // the run [t0, t1) of queries that see this zone
} Decode;

// --profile: the overlap of query t's selection (s->slots, nsel positions) with the previous
// decode query's. Inside the run that one saw the same zone: its selection is made again
// (deterministic: what it got); the run's first query reads last_*, its last leaves next_*.
static void profile_overlap(const Decode *d, int t, int h, int thread, Scratch *s, int nsel) {
    const Policy *P = d->P;
    size_t lh = (size_t)d->layer * P->n_kv_heads + h, kmax = (size_t)P->cfg.topk + 16;
    if (t == d->t1 - 1) memcpy(P->next_sel + lh * kmax, s->slots, (size_t)nsel * sizeof(int)), P->next_n[lh] = nsel;
    if (P->sim_lines && t - d->t0 < PROFILE_RUN) { // for the cache simulation, as zone slots
        size_t at = ((size_t)(t - d->t0) * P->n_kv_heads + h) * kmax;
        for (int i = 0; i < nsel; i++) P->run_sel[at + i] = s->slots[i] - P->cfg.sink;
        P->run_n[(size_t)(t - d->t0) * P->n_kv_heads + h] = nsel;
    }
    const int *prev = s->prev;
    int np;
    if (t > d->t0) {
        const float *qg = d->q + ((size_t)(t - 1) * P->n_heads + (size_t)h * (P->n_heads / P->n_kv_heads)) * P->head_dim;
        np = select_zone(P, d->layer, h, qg, d->zone_end, P->cfg.beta, P->cfg.rho, s, s->prev);
        for (int i = 0; i < np; i++) s->prev[i] += P->cfg.sink;
    } else if (P->last_pos[d->layer] == d->pos0 + t - 1) {
        prev = P->last_sel + lh * kmax, np = P->last_n[lh];
    } else return; // the sequence's first decode query
    size_t at = (size_t)thread * P->n_layers * P->n_kv_heads + lh;
    P->ov_sum[at] += selection_overlap(s->slots, nsel, prev, np);
    P->ov_cnt[at]++;
}

static void decode_task(void *ctx, int i, int thread) {
    Decode *d = ctx;
    Scratch s = thread_scratch(d->P, thread);
    int t = d->t0 + i / d->P->n_kv_heads, h = i % d->P->n_kv_heads;
    int nsel = attend_one(d->P, d->layer, d->st, d->out, d->q, t, d->pos0 + t, h, d->zone_end, &s);
    if (d->P->cfg.profile) profile_overlap(d, t, h, thread, &s, nsel);
}

// --profile: one step of the GPU's row cache for (layer, h) and its selection sel[0, n) (zone
// slots): per line the slot whose tag it is hits and keeps the line; with no hit the line's
// first selected slot fills it.
static void sim_cache_step(Policy *P, int layer, int h, const int *sel, int n) {
    int M = P->sim_lines;
    size_t lh = (size_t)layer * P->n_kv_heads + h;
    int *tag = P->sim_tags + lh * M, *first = P->sim_first;
    unsigned now = ++P->sim_now;
    for (int r = 0; r < n; r++) {
        int line = sel[r] & (M - 1);
        if (P->sim_stamp[line] != now) P->sim_stamp[line] = now, first[line] = r;
        if (tag[line] == sel[r]) first[line] |= SIM_HIT, P->sim_hits[lh]++;
    }
    for (int r = 0; r < n; r++)
        if (first[sel[r] & (M - 1)] == r) tag[sel[r] & (M - 1)] = sel[r];
    P->sim_rows[lh] += n;
}

// --profile, when the run [d->t0, d->t1) ends: its last query's selections become the layer's
// latest, and its queries go through the cache simulation in order.
static void profile_run_end(Policy *P, const Decode *d) {
    size_t nkv = (size_t)P->n_kv_heads, kmax = (size_t)P->cfg.topk + 16;
    memcpy(P->last_sel + d->layer * nkv * kmax, P->next_sel + d->layer * nkv * kmax, nkv * kmax * sizeof(int));
    memcpy(P->last_n + d->layer * nkv, P->next_n + d->layer * nkv, nkv * sizeof(int));
    P->last_pos[d->layer] = d->pos0 + d->t1 - 1;
    if (!P->sim_lines) return;
    if (d->t1 - d->t0 > PROFILE_RUN) P->sim_broken = 1;
    for (int t = 0; t < d->t1 - d->t0 && t < PROFILE_RUN; t++)
        for (size_t h = 0; h < nkv; h++) sim_cache_step(P, d->layer, (int)h, P->run_sel + (t * nkv + h) * kmax, P->run_n[t * nkv + h]);
}

static void policy_attend(AttnPolicy *ap, int layer, float *out, const float *q, float *k_cache, float *v_cache, int pos0, int T,
                          int n_heads, int n_kv_heads, int head_dim, float *scratch) {
    Policy *P = ap->state;
    if (pos0 == 0 || pos0 < P->seen_end[layer]) forget_last(P, layer);
    if (pos0 == 0) reset_layer(P, layer); // a new sequence
    else if (pos0 < P->seen_end[layer]) { // a rewind: rows from pos0 on are new
        // The zone slots below both the zone at pos0 and pos0 itself hold unchanged keys: a
        // selector that can keeps them (a chat's later turn then encodes only what is new).
        int keep = attn_zone_end(&P->cfg, pos0);
        keep = (keep < pos0 ? keep : pos0) - P->cfg.sink;
        if (keep > P->indexed[layer]) keep = P->indexed[layer];
        if (P->sel->truncate && keep > 0) P->sel->truncate(P->sel, layer, keep), P->indexed[layer] = keep;
        else reset_layer(P, layer);
    }
    if (P->fp8_end[layer] > pos0) P->fp8_end[layer] = pos0;
    P->seen_end[layer] = pos0 + T;
    // Prompt positions and short sequences attend densely; they come first in any chunk.
    int nd = 0;
    while (nd < T && attn_is_dense(&P->cfg, pos0 + nd)) nd++;
    if (nd > 0) attention_dense(P->par, out, q, k_cache, v_cache, pos0, nd, n_heads, n_kv_heads, head_dim, scratch);
    KVStore st;
    kvstore_cpu_view(&st, k_cache, v_cache, n_kv_heads, head_dim);
    // Decode queries, in runs that see the same zone: grow the index to it, then each query of
    // the run selects for itself, exactly as it would arriving alone.
    for (int t0 = nd; t0 < T;) {
        int zone_end = attn_zone_end(&P->cfg, pos0 + t0), t1 = t0 + 1;
        while (t1 < T && attn_zone_end(&P->cfg, pos0 + t1) == zone_end) t1++;
        index_to(P, layer, &st, k_cache, v_cache, zone_end);
        Decode d = {P, layer, &st, out, q, pos0, t0, t1, zone_end};
        P->par->run((t1 - t0) * n_kv_heads, decode_task, &d);
        if (P->cfg.profile) profile_run_end(P, &d);
        t0 = t1;
    }
}

int attn_policy_select(AttnPolicy *ap, int layer, int kv_head, const float *q_group, int pos, float beta, float rho, int *out) {
    Policy *P = ap->state;
    if (layer < 0 || layer >= P->n_layers || kv_head < 0 || kv_head >= P->n_kv_heads || attn_is_dense(&P->cfg, pos)) return -1;
    int zone_end = attn_zone_end(&P->cfg, pos);
    if (P->indexed[layer] != zone_end - P->cfg.sink) return -1;
    Scratch s = thread_scratch(P, 0);
    int nsel = select_zone(P, layer, kv_head, q_group, zone_end, beta > 0 ? beta : P->cfg.beta, rho > 0 ? rho : P->cfg.rho, &s, s.slots);
    for (int i = 0; i < nsel; i++) out[i] = s.slots[i] + P->cfg.sink;
    return nsel;
}

const AttnConfig *attn_policy_config(const AttnPolicy *ap) { return &((const Policy *)ap->state)->cfg; }

int attn_policy_fp8_end(const AttnPolicy *ap) {
    const Policy *P = ap->state;
    int e = P->fp8_end[0];
    for (int l = 1; l < P->n_layers; l++) e = P->fp8_end[l] < e ? P->fp8_end[l] : e;
    return e;
}

void attn_policy_resume(AttnPolicy *ap, int pos, int fp8_end) {
    Policy *P = ap->state;
    for (int l = 0; l < P->n_layers; l++)
        reset_layer(P, l), forget_last(P, l), P->seen_end[l] = pos, P->fp8_end[l] = fp8_end < pos ? fp8_end : pos;
}

long attn_policy_overlap(const AttnPolicy *ap, int layer, int kv_head, double *mean) {
    const Policy *P = ap->state;
    double sum = 0;
    long n = 0;
    size_t per = (size_t)P->n_layers * P->n_kv_heads, lh = (size_t)layer * P->n_kv_heads + kv_head;
    for (int th = 0; P->ov_cnt && th < P->n_threads; th++) sum += P->ov_sum[th * per + lh], n += P->ov_cnt[th * per + lh];
    *mean = n ? sum / n : 0.0;
    return n;
}

// The layer's overlaps over its KV heads: their mean into *mean, the count returned.
static long layer_overlap(const AttnPolicy *ap, int layer, double *mean) {
    const Policy *P = ap->state;
    double sum = 0, m;
    long n = 0;
    for (int h = 0; h < P->n_kv_heads; h++) {
        long c = attn_policy_overlap(ap, layer, h, &m);
        sum += m * c, n += c;
    }
    *mean = n ? sum / n : 0.0;
    return n;
}

// The smallest and largest of some means, and where they are.
typedef struct {
    double lo, hi;
    int lo_at, hi_at;
} Range;

static void range_add(Range *r, double v, int at) {
    if (r->lo_at < 0 || v < r->lo) r->lo = v, r->lo_at = at;
    if (r->hi_at < 0 || v > r->hi) r->hi = v, r->hi_at = at;
}

void attn_policy_report(const AttnPolicy *ap, FILE *f) {
    const Policy *P = ap->state;
    if (!P->cfg.profile) return;
    int nkv = P->n_kv_heads;
    double all = 0, m;
    long n_all = 0;
    Range layers = {0, 0, -1, -1}, heads = {0, 0, -1, -1};
    for (int l = 0; l < P->n_layers; l++) {
        for (int h = 0; h < nkv; h++)
            if (attn_policy_overlap(ap, l, h, &m)) range_add(&heads, m, l * nkv + h);
        long n = layer_overlap(ap, l, &m);
        if (n) range_add(&layers, m, l);
        all += m * n, n_all += n;
    }
    fprintf(f, "profile: %s top-k overlap of consecutive decode steps (|sel_t & sel_t-1| / k, k %d): ", ap->name, P->cfg.topk);
    if (!n_all) {
        fprintf(f, "no two consecutive decode steps\n");
        return;
    }
    fprintf(f, "mean %.4f over %ld (step, layer, KV head); layer means min %.4f (layer %d) max %.4f (layer %d); (layer, KV head) means "
               "min %.4f (%d, %d) max %.4f (%d, %d)\nprofile: overlap per layer:",
            all / n_all, n_all, layers.lo, layers.lo_at, layers.hi, layers.hi_at, heads.lo, heads.lo_at / nkv, heads.lo_at % nkv, heads.hi,
            heads.hi_at / nkv, heads.hi_at % nkv);
    for (int l = 0; l < P->n_layers; l++) fprintf(f, " %.3f", layer_overlap(ap, l, &m) ? m : 0.0);
    fprintf(f, "\n");
    double hits, rows;
    if (!attn_policy_cache_sim(ap, &hits, &rows)) return;
    fprintf(f, "profile: the GPU's zone row cache of %d rows per layer and KV head, simulated on these selections, would read %.0f of "
               "their %.0f zone rows (hit rate %.4f)%s\n",
            P->sim_lines, hits, rows, rows > 0 ? hits / rows : 0.0, P->sim_broken ? " (runs longer than 256 queries left out: incomplete)" : "");
}

static void policy_destroy(AttnPolicy *ap) {
    if (!ap) return;
    Policy *P = ap->state;
    if (P) {
        if (P->sel) P->sel->destroy(P->sel);
        free(P->indexed);
        free(P->seen_end);
        free(P->fp8_end);
        free(P->scratch);
        free(P->last_sel), free(P->next_sel), free(P->last_n), free(P->next_n), free(P->last_pos), free(P->ov_sum), free(P->ov_cnt);
        free(P->run_sel), free(P->run_n), free(P->sim_tags), free(P->sim_first), free(P->sim_stamp), free(P->sim_hits), free(P->sim_rows);
        free(P);
    }
    free(ap);
}

int attn_policy_cache_sim(const AttnPolicy *ap, double *hits, double *rows) {
    const Policy *P = ap->state;
    *hits = *rows = 0;
    for (size_t i = 0; P->sim_lines && i < (size_t)P->n_layers * P->n_kv_heads; i++) *hits += (double)P->sim_hits[i], *rows += (double)P->sim_rows[i];
    return P->sim_lines;
}

int attn_cache_rows_default(int topk) {
    int n = 16384;
    while (topk <= 4096 && n < 32 * topk) n *= 2;
    return n;
}

// --profile's cache simulation (Policy's run_sel ... sim_rows), sim_lines set. 0, or -1 with err filled.
static int sim_alloc(Policy *P, char *err) {
    size_t lh = (size_t)P->n_layers * P->n_kv_heads, kmax = (size_t)P->cfg.topk + 16, M = (size_t)P->sim_lines;
    if (!(P->run_sel = attn_calloc((size_t)PROFILE_RUN * P->n_kv_heads * kmax, sizeof(int), "profile state", err)) ||
        !(P->run_n = attn_calloc((size_t)PROFILE_RUN * P->n_kv_heads, sizeof(int), "profile state", err)) ||
        !(P->sim_tags = attn_calloc(lh * M, sizeof(int), "profile state", err)) ||
        !(P->sim_first = attn_calloc(M, sizeof(int), "profile state", err)) ||
        !(P->sim_stamp = attn_calloc(M, sizeof(unsigned), "profile state", err)) ||
        !(P->sim_hits = attn_calloc(lh, sizeof(long), "profile state", err)) || !(P->sim_rows = attn_calloc(lh, sizeof(long), "profile state", err)))
        return -1;
    for (size_t i = 0; i < lh * M; i++) P->sim_tags[i] = -1;
    return 0;
}

// --profile's buffers (Policy's last_* ... sim_rows). 0, or -1 with err filled.
static int profile_alloc(Policy *P, char *err) {
    size_t lh = (size_t)P->n_layers * P->n_kv_heads, kmax = (size_t)P->cfg.topk + 16;
    P->sim_lines = P->cfg.cache_rows < 0 ? attn_cache_rows_default(P->cfg.topk) : P->cfg.cache_rows;
    if (P->sim_lines && sim_alloc(P, err) != 0) return -1;
    return !(P->last_sel = attn_calloc(lh * kmax, sizeof(int), "profile state", err)) ||
                   !(P->next_sel = attn_calloc(lh * kmax, sizeof(int), "profile state", err)) ||
                   !(P->last_n = attn_calloc(lh, sizeof(int), "profile state", err)) ||
                   !(P->next_n = attn_calloc(lh, sizeof(int), "profile state", err)) ||
                   !(P->last_pos = attn_calloc((size_t)P->n_layers, sizeof(int), "profile state", err)) ||
                   !(P->ov_sum = attn_calloc((size_t)P->n_threads * lh, sizeof(double), "profile state", err)) ||
                   !(P->ov_cnt = attn_calloc((size_t)P->n_threads * lh, sizeof(long), "profile state", err))
               ? -1
               : 0;
}

static int bad(char *err, const char *what, int v) {
    snprintf(err, ATTN_ERR_LEN, "attention: %s, got %d", what, v);
    return 1;
}

AttnPolicy *attn_policy_create(const AttnConfig *c, const AttnParallel *par, int n_layers, int n_heads, int n_kv_heads, int head_dim, int ctx, char *err) {
    if (c->method == ATTN_FULL) {
        snprintf(err, ATTN_ERR_LEN, "attention: full attention needs no policy");
        return NULL;
    }
    if (c->method < 0 || c->method >= ATTN_N_METHODS) { bad(err, "unknown method", c->method); return NULL; }
    if (c->topk < 1) { bad(err, "topk must be at least 1", c->topk); return NULL; }
    if (c->sink < 0) { bad(err, "sink must be at least 0", c->sink); return NULL; }
    if (c->local < 0) { bad(err, "local must be at least 0", c->local); return NULL; }
    if (c->update < 1) { bad(err, "update must be at least 1", c->update); return NULL; }
    if (c->dense_min < 0 || c->prefill_len < 0) { bad(err, "dense_min and prefill_len must be at least 0", c->dense_min < 0 ? c->dense_min : c->prefill_len); return NULL; }
    if (!(c->beta >= 0 && c->beta <= 1 && c->rho >= 0 && c->rho <= 1)) {
        snprintf(err, ATTN_ERR_LEN, "attention: beta and rho must be in [0, 1], got %g and %g", c->beta, c->rho);
        return NULL;
    }
    if (c->zone_fp8 && head_dim > 1024) { bad(err, "the fp8 zone store supports head_dim up to 1024", head_dim); return NULL; }
    if (n_layers < 1 || n_kv_heads < 1 || head_dim < 1 || n_heads % n_kv_heads || ctx < 1) {
        snprintf(err, ATTN_ERR_LEN, "attention: bad shape (layers %d, heads %d / %d, head_dim %d, ctx %d)", n_layers, n_heads, n_kv_heads, head_dim, ctx);
        return NULL;
    }
    AttnPolicy *ap = attn_calloc(1, sizeof *ap, "the attention policy", err);
    Policy *P = ap ? attn_calloc(1, sizeof *P, "the attention policy", err) : NULL;
    if (!P) {
        free(ap);
        return NULL;
    }
    *ap = (AttnPolicy){method_names[c->method], policy_attend, policy_reset, policy_destroy, P};
    P->cfg = *c;
    P->n_layers = n_layers, P->n_heads = n_heads, P->n_kv_heads = n_kv_heads, P->head_dim = head_dim, P->ctx = ctx;
    P->par = par;
    P->n_threads = par->max_threads();
    int cap = ctx > c->sink ? ctx - c->sink : 0; // the most zone slots a sequence of ctx tokens has
    switch (c->method) {
    case ATTN_PARISKV: P->sel = selector_pariskv(n_layers, n_kv_heads, head_dim, cap, err); break;
    case ATTN_STREAMING: P->sel = selector_streaming(err); break;
    case ATTN_QUEST: P->sel = selector_quest(n_layers, n_kv_heads, head_dim, cap, err); break;
    case ATTN_FIER: P->sel = selector_fier(n_layers, n_kv_heads, head_dim, cap, err); break;
    case ATTN_KMEANS: P->sel = selector_kmeans(n_layers, n_kv_heads, head_dim, cap, err); break;
    case ATTN_ORACLE: P->sel = selector_oracle(n_layers, n_kv_heads, head_dim, cap, err); break;
    }
    if (!P->sel) {
        policy_destroy(ap);
        return NULL;
    }
    P->sel_off = scratch_layout(P, NULL, NULL);
    P->stride = ALIGN64(P->sel_off + P->sel->scratch_bytes(P->sel, cap));
    if (!(P->indexed = attn_calloc((size_t)n_layers, sizeof(int), "policy state", err)) ||
        !(P->seen_end = attn_calloc((size_t)n_layers, sizeof(int), "policy state", err)) ||
        !(P->fp8_end = attn_calloc((size_t)n_layers, sizeof(int), "policy state", err)) ||
        !(P->scratch = attn_calloc((size_t)P->n_threads, P->stride, "attention scratch", err)) ||
        (c->profile && profile_alloc(P, err) != 0)) {
        policy_destroy(ap);
        return NULL;
    }
    if (P->last_pos)
        for (int l = 0; l < n_layers; l++) P->last_pos[l] = -1;
    return ap;
}
