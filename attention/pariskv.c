// ParisKV as a Selector: the encoded index of every (layer, KV head), grown as keys enter the
// retrieval zone, and pkv_select over it.
#include "attention.h"
#include "pariskv.h"
#include "selector.h"
#include "srht.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    Selector base;
    int n_layers, n_kv_heads, D, B, cap;
    float signs[PKV_MAX_D];
    PkvIndex *ix; // (n_layers, n_kv_heads)
} ParisKV;

// The new keys are still in the working window when they are encoded (the policy evicts them
// to the host store afterwards), so they are read in place.
static void pkv_extend(Selector *s, int layer, int kv_head, const KVStore *st, int sink, int from, int to) {
    ParisKV *p = (ParisKV *)s;
    PkvIndex *ix = &p->ix[layer * p->n_kv_heads + kv_head];
    for (int i = from; i < to; i++) {
        uint8_t *ids = ix->ids + (size_t)i * p->B;
        pkv_encode_key(kvstore_window_k(st, sink + i, kv_head), p->D, p->signs, ids, ix->codes + (size_t)i * p->B * (PKV_M / 2),
                       ix->w + (size_t)i * p->B, NULL);
        for (int b = 0; b < p->B; b++) ix->count[b * PKV_PATTERNS + ids[b]]++;
    }
    ix->n = to;
}

static void pkv_reset(Selector *s, int layer) {
    ParisKV *p = (ParisKV *)s;
    for (int h = 0; h < p->n_kv_heads; h++) {
        PkvIndex *ix = &p->ix[layer * p->n_kv_heads + h];
        ix->n = 0;
        for (int i = 0; i < p->B * PKV_PATTERNS; i++) ix->count[i] = 0;
    }
}

// The slots from n on leave: their ids leave the counts (the rest of the index is per slot).
static void pkv_truncate(Selector *s, int layer, int n) {
    ParisKV *p = (ParisKV *)s;
    for (int h = 0; h < p->n_kv_heads; h++) {
        PkvIndex *ix = &p->ix[layer * p->n_kv_heads + h];
        for (int i = n; i < ix->n; i++)
            for (int b = 0; b < p->B; b++) ix->count[b * PKV_PATTERNS + ix->ids[(size_t)i * p->B + b]]--;
        if (n < ix->n) ix->n = n;
    }
}

static size_t pkv_scratch(const Selector *s, int max_n) {
    const ParisKV *p = (const ParisKV *)s;
    // k is at most max_n: the top-k heap never holds more than the zone.
    return pkv_scratch_bytes(p->B, max_n, max_n);
}

static int pkv_sel(const Selector *s, int layer, int kv_head, const float *q, int n, const SelectParams *sp, void *scratch, int *out) {
    const ParisKV *p = (const ParisKV *)s;
    const PkvIndex *ix = &p->ix[layer * p->n_kv_heads + kv_head];
    if (ix->n != n) return 0; // policy.c keeps the index at exactly the query's zone
    return pkv_select(ix, p->D, p->signs, q, sp->k, sp->beta, sp->rho, scratch, out);
}

static void pkv_destroy(Selector *s) {
    ParisKV *p = (ParisKV *)s;
    if (!p) return;
    if (p->ix)
        for (int i = 0; i < p->n_layers * p->n_kv_heads; i++) {
            free(p->ix[i].ids);
            free(p->ix[i].codes);
            free(p->ix[i].w);
            free(p->ix[i].count);
        }
    free(p->ix);
    free(p);
}

Selector *selector_pariskv(int n_layers, int n_kv_heads, int head_dim, int cap, char *err) {
    int D = head_dim;
    if (D < PKV_M || D > PKV_MAX_D || (D & (D - 1))) {
        snprintf(err, ATTN_ERR_LEN, "pariskv needs head_dim a power of two in [%d, %d] (the Hadamard transform), not %d", PKV_M, PKV_MAX_D, D);
        return NULL;
    }
    ParisKV *p = attn_calloc(1, sizeof *p, "the pariskv selector", err);
    if (!p) return NULL;
    p->base = (Selector){"pariskv", pkv_extend, pkv_reset, pkv_scratch, pkv_sel, pkv_destroy, pkv_truncate};
    p->n_layers = n_layers, p->n_kv_heads = n_kv_heads, p->D = D, p->B = D / PKV_M, p->cap = cap;
    srht_signs(SRHT_SEED, D, p->signs);
    p->ix = attn_calloc((size_t)n_layers * n_kv_heads, sizeof(PkvIndex), "the pariskv index", err);
    if (!p->ix) {
        pkv_destroy(&p->base);
        return NULL;
    }
    size_t c = (size_t)(cap > 0 ? cap : 1);
    for (int i = 0; i < n_layers * n_kv_heads; i++) {
        PkvIndex *ix = &p->ix[i];
        ix->B = p->B, ix->cap = cap;
        if (!(ix->ids = attn_calloc(c * p->B, 1, "pariskv ids", err)) ||
            !(ix->codes = attn_calloc(c * p->B * (PKV_M / 2), 1, "pariskv codes", err)) ||
            !(ix->w = attn_calloc(c * p->B, sizeof(uint16_t), "pariskv weights", err)) ||
            !(ix->count = attn_calloc((size_t)p->B * PKV_PATTERNS, sizeof(int32_t), "pariskv id counts", err))) {
            pkv_destroy(&p->base);
            return NULL;
        }
    }
    return &p->base;
}
