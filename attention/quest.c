// Quest as a Selector: the zone in pages of 16 tokens, each page summarized by the per-channel
// minimum and maximum of its keys. A page's score, sum_j max(q_j min_j, q_j max_j), bounds
// <q, k> for every key in it from above; pages are taken best first until they hold k tokens
// (the last one cut to its first tokens, so the budget is exactly k, as for every policy).
#include "attention.h"
#include "selector.h"

#include <stdlib.h>
#include <string.h>

#define PAGE 16

typedef struct {
    Selector base;
    int n_kv_heads, D;
    size_t max_pages;
    float *mn, *mx; // (n_layers, n_kv_heads, max_pages, D)
} Quest;

static size_t page_base(const Quest *qs, int layer, int kv_head) {
    return ((size_t)layer * qs->n_kv_heads + kv_head) * qs->max_pages * qs->D;
}

static void qu_extend(Selector *s, int layer, int kv_head, const KVStore *st, int sink, int from, int to) {
    Quest *qs = (Quest *)s;
    float *mn = qs->mn + page_base(qs, layer, kv_head), *mx = qs->mx + page_base(qs, layer, kv_head);
    int D = qs->D;
    for (int i = from; i < to; i++) {
        const float *k = kvstore_window_k(st, sink + i, kv_head);
        float *a = mn + (size_t)(i / PAGE) * D, *b = mx + (size_t)(i / PAGE) * D;
        if (i % PAGE == 0) { // a new page
            memcpy(a, k, (size_t)D * sizeof(float));
            memcpy(b, k, (size_t)D * sizeof(float));
        } else {
            for (int j = 0; j < D; j++) {
                if (k[j] < a[j]) a[j] = k[j];
                if (k[j] > b[j]) b[j] = k[j];
            }
        }
    }
}

static void qu_reset(Selector *s, int layer) { (void)s, (void)layer; } // pages restart at slot 0

static size_t qu_scratch(const Selector *s, int max_n) {
    (void)s;
    size_t pages = (size_t)max_n / PAGE + 2;
    return pages * (sizeof(float) + sizeof(ScoredId) + 2 * sizeof(int));
}

static int page_len(int n, int p) { return n - p * PAGE < PAGE ? n - p * PAGE : PAGE; }

static int qu_select(const Selector *s, int layer, int kv_head, const float *q, int n, const SelectParams *sp, void *scratch, int *out) {
    const Quest *qs = (const Quest *)s;
    if (n <= sp->k) return select_all(n, out);
    const float *mn = qs->mn + page_base(qs, layer, kv_head), *mx = qs->mx + page_base(qs, layer, kv_head);
    int D = qs->D, np = (n + PAGE - 1) / PAGE;
    float *score = scratch;
    ScoredId *heap = (ScoredId *)(score + np);
    int *chosen = (int *)(heap + np);
    int *ranked = chosen + np;
    for (int p = 0; p < np; p++) {
        const float *a = mn + (size_t)p * D, *b = mx + (size_t)p * D;
        float u = 0.0f;
        for (int j = 0; j < D; j++) {
            float x = q[j] * a[j], y = q[j] * b[j];
            u += x > y ? x : y;
        }
        score[p] = u;
    }
    // Enough pages for k tokens even when the zone's last page is short; topk_select returns
    // them by index, so rank them best first again (insertion sort: a handful of pages).
    int m = topk_select(score, NULL, np, (sp->k + PAGE - 1) / PAGE + 1, heap, chosen);
    for (int i = 0; i < m; i++) {
        int p = chosen[i], j = i;
        while (j > 0 && (score[ranked[j - 1]] < score[p] || (score[ranked[j - 1]] == score[p] && ranked[j - 1] > p))) {
            ranked[j] = ranked[j - 1];
            j--;
        }
        ranked[j] = p;
    }
    int taken = 0, used = 0, cut = PAGE;
    while (used < m && taken < sp->k) {
        int len = page_len(n, ranked[used++]);
        if (taken + len > sp->k) len = cut = sp->k - taken;
        taken += len;
    }
    int last = ranked[used - 1];
    // The pages taken, in slot order: the last-ranked one keeps only its first `cut` tokens.
    for (int i = 1; i < used; i++)
        for (int j = i; j > 0 && ranked[j - 1] > ranked[j]; j--) {
            int t = ranked[j];
            ranked[j] = ranked[j - 1], ranked[j - 1] = t;
        }
    int cnt = 0;
    for (int i = 0; i < used; i++) {
        int p = ranked[i], len = page_len(n, p);
        if (p == last && cut < len) len = cut;
        for (int t = 0; t < len; t++) out[cnt++] = p * PAGE + t;
    }
    return cnt;
}

static void qu_destroy(Selector *s) {
    Quest *qs = (Quest *)s;
    if (qs) free(qs->mn), free(qs->mx);
    free(qs);
}

Selector *selector_quest(int n_layers, int n_kv_heads, int head_dim, int cap, char *err) {
    Quest *qs = attn_calloc(1, sizeof *qs, "the quest selector", err);
    if (!qs) return NULL;
    qs->base = (Selector){"quest", qu_extend, qu_reset, qu_scratch, qu_select, qu_destroy, NULL};
    qs->n_kv_heads = n_kv_heads, qs->D = head_dim, qs->max_pages = (size_t)(cap > 0 ? cap : 1) / PAGE + 1;
    size_t n = (size_t)n_layers * n_kv_heads * qs->max_pages * head_dim;
    qs->mn = attn_calloc(n, sizeof(float), "quest page minima", err);
    qs->mx = qs->mn ? attn_calloc(n, sizeof(float), "quest page maxima", err) : NULL;
    if (!qs->mx) {
        qu_destroy(&qs->base);
        return NULL;
    }
    return &qs->base;
}
