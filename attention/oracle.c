// The oracle: exact top-k of the zone by <q, k> over full-precision keys. Not a deployable
// method (it reads every key every step); the upper bound the others are measured against.
#include "attention.h"
#include "selector.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    Selector base;
    int n_kv_heads, D;
    size_t cap;
    float *keys; // (n_layers, n_kv_heads, cap, D)
} Oracle;

static float *keys_of(const Oracle *o, int layer, int kv_head) {
    return o->keys + ((size_t)layer * o->n_kv_heads + kv_head) * o->cap * o->D;
}

static void or_extend(Selector *s, int layer, int kv_head, const KVStore *st, int sink, int from, int to) {
    Oracle *o = (Oracle *)s;
    float *k = keys_of(o, layer, kv_head);
    for (int i = from; i < to; i++) // still in the working window: read in place
        memcpy(k + (size_t)i * o->D, kvstore_window_k(st, sink + i, kv_head), (size_t)o->D * sizeof(float));
}

static void or_reset(Selector *s, int layer) { (void)s, (void)layer; } // rows are rewritten on extend

static size_t or_scratch(const Selector *s, int max_n) {
    (void)s;
    return (size_t)max_n * (sizeof(float) + sizeof(ScoredId));
}

static int or_select(const Selector *s, int layer, int kv_head, const float *q, int n, const SelectParams *sp, void *scratch, int *out) {
    const Oracle *o = (const Oracle *)s;
    if (n <= sp->k) return select_all(n, out);
    const float *k = keys_of(o, layer, kv_head);
    float *score = scratch;
    ScoredId *heap = (ScoredId *)(score + n);
    for (int i = 0; i < n; i++) {
        const float *ki = k + (size_t)i * o->D;
        float d = 0.0f;
        for (int j = 0; j < o->D; j++) d += q[j] * ki[j];
        score[i] = d;
    }
    return topk_select(score, NULL, n, sp->k, heap, out);
}

static void or_destroy(Selector *s) {
    Oracle *o = (Oracle *)s;
    if (o) free(o->keys);
    free(o);
}

Selector *selector_oracle(int n_layers, int n_kv_heads, int head_dim, int cap, char *err) {
    Oracle *o = attn_calloc(1, sizeof *o, "the oracle selector", err);
    if (!o) return NULL;
    o->base = (Selector){"oracle", or_extend, or_reset, or_scratch, or_select, or_destroy, NULL};
    o->n_kv_heads = n_kv_heads, o->D = head_dim, o->cap = (size_t)(cap > 0 ? cap : 1);
    o->keys = attn_calloc((size_t)n_layers * n_kv_heads * o->cap * head_dim, sizeof(float), "the oracle's key copy", err);
    if (!o->keys) {
        free(o);
        return NULL;
    }
    return &o->base;
}
