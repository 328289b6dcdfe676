// FIER as a Selector: 1-bit keys. Each channel of each group of 32 consecutive zone tokens has
// an offset (the group's minimum) and a scale (maximum - minimum); a key's channel is one bit,
// decoding to the minimum or the maximum (round to nearest). The estimate <q, k~> ranks every
// token; the top k are attended. (paper: ../shared/papers/004_bbea14ed257af46b.txt, g = 32)
#include "attention.h"
#include "selector.h"

#include <stdlib.h>
#include <string.h>

#define GROUP 32

typedef struct {
    Selector base;
    int n_kv_heads, D, bytes; // bytes: packed bits per key
    size_t cap, max_groups;
    float *lo, *hi;  // (n_layers, n_kv_heads, max_groups, D)
    uint8_t *bits;   // (n_layers, n_kv_heads, cap, bytes)
    float *rows;     // (n_kv_heads, GROUP, D): one group's keys while it is quantized
} Fier;

static size_t lh(const Fier *f, int layer, int kv_head) { return (size_t)layer * f->n_kv_heads + kv_head; }

// A group that gains tokens gets a new minimum and maximum, so all its keys are quantized again:
// the earlier ones come back from the host store, the new ones are still in the working window.
static void fi_extend(Selector *s, int layer, int kv_head, const KVStore *st, int sink, int from, int to) {
    Fier *f = (Fier *)s;
    int D = f->D;
    float *rows = f->rows + (size_t)kv_head * GROUP * D;
    for (int g = from / GROUP; g * GROUP < to; g++) {
        int g0 = g * GROUP, g1 = g0 + GROUP < to ? g0 + GROUP : to;
        for (int i = g0; i < g1; i++) {
            int pos = sink + i;
            if (i < from) st->gather(st, kv_head, &pos, 1, rows + (size_t)(i - g0) * D, NULL);
            else memcpy(rows + (size_t)(i - g0) * D, kvstore_window_k(st, pos, kv_head), (size_t)D * sizeof(float));
        }
        float *lo = f->lo + (lh(f, layer, kv_head) * f->max_groups + g) * D;
        float *hi = f->hi + (lh(f, layer, kv_head) * f->max_groups + g) * D;
        memcpy(lo, rows, (size_t)D * sizeof(float));
        memcpy(hi, rows, (size_t)D * sizeof(float));
        for (int i = 1; i < g1 - g0; i++)
            for (int j = 0; j < D; j++) {
                float x = rows[(size_t)i * D + j];
                if (x < lo[j]) lo[j] = x;
                if (x > hi[j]) hi[j] = x;
            }
        for (int i = g0; i < g1; i++) {
            const float *x = rows + (size_t)(i - g0) * D;
            uint8_t *b = f->bits + (lh(f, layer, kv_head) * f->cap + i) * f->bytes;
            memset(b, 0, (size_t)f->bytes);
            for (int j = 0; j < D; j++)
                if (x[j] - lo[j] >= 0.5f * (hi[j] - lo[j])) b[j / 8] |= (uint8_t)(1 << (j % 8));
        }
    }
}

static void fi_reset(Selector *s, int layer) { (void)s, (void)layer; } // groups restart at slot 0

static size_t fi_scratch(const Selector *s, int max_n) {
    const Fier *f = (const Fier *)s;
    return (size_t)f->D * sizeof(float) + (size_t)max_n * (sizeof(float) + sizeof(ScoredId));
}

static int fi_select(const Selector *s, int layer, int kv_head, const float *q, int n, const SelectParams *sp, void *scratch, int *out) {
    const Fier *f = (const Fier *)s;
    if (n <= sp->k) return select_all(n, out);
    int D = f->D;
    float *diff = scratch, *score = diff + D;
    ScoredId *heap = (ScoredId *)(score + n);
    for (int g = 0; g * GROUP < n; g++) {
        const float *lo = f->lo + (lh(f, layer, kv_head) * f->max_groups + g) * D;
        const float *hi = f->hi + (lh(f, layer, kv_head) * f->max_groups + g) * D;
        // <q, k~> = <q, lo> + sum over set bits of q_j (hi_j - lo_j)
        float base = 0.0f;
        for (int j = 0; j < D; j++) base += q[j] * lo[j], diff[j] = q[j] * (hi[j] - lo[j]);
        int g1 = (g + 1) * GROUP < n ? (g + 1) * GROUP : n;
        for (int i = g * GROUP; i < g1; i++) {
            const uint8_t *b = f->bits + (lh(f, layer, kv_head) * f->cap + i) * f->bytes;
            float e = 0.0f;
            for (int j = 0; j < D; j++) e += (float)(b[j / 8] >> (j % 8) & 1) * diff[j];
            score[i] = base + e;
        }
    }
    return topk_select(score, NULL, n, sp->k, heap, out);
}

static void fi_destroy(Selector *s) {
    Fier *f = (Fier *)s;
    if (f) free(f->lo), free(f->hi), free(f->bits), free(f->rows);
    free(f);
}

Selector *selector_fier(int n_layers, int n_kv_heads, int head_dim, int cap, char *err) {
    Fier *f = attn_calloc(1, sizeof *f, "the fier selector", err);
    if (!f) return NULL;
    f->base = (Selector){"fier", fi_extend, fi_reset, fi_scratch, fi_select, fi_destroy, NULL};
    f->n_kv_heads = n_kv_heads, f->D = head_dim, f->bytes = (head_dim + 7) / 8;
    f->cap = (size_t)(cap > 0 ? cap : 1), f->max_groups = f->cap / GROUP + 1;
    size_t heads = (size_t)n_layers * n_kv_heads;
    if (!(f->lo = attn_calloc(heads * f->max_groups * head_dim, sizeof(float), "fier group minima", err)) ||
        !(f->hi = attn_calloc(heads * f->max_groups * head_dim, sizeof(float), "fier group maxima", err)) ||
        !(f->bits = attn_calloc(heads * f->cap * f->bytes, 1, "fier key bits", err)) ||
        !(f->rows = attn_calloc((size_t)n_kv_heads * GROUP * head_dim, sizeof(float), "fier group rows", err))) {
        fi_destroy(&f->base);
        return NULL;
    }
    return &f->base;
}
