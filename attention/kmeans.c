// Learned centroids (the PQCache / RetroInfer style the paper compares against): product
// quantization of the raw keys, 8-dim subspaces with 256 k-means centroids each, learned once from
// the retrieval zone the first time it is indexed (the prompt's keys, or at the dense threshold)
// and never updated. Later keys take the nearest stale centroid, which is how such indexes drift.
// Score: sum over subspaces of <q_b, centroid_b(key)>; the top k are attended.
#include "attention.h"
#include "selector.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUB 8      // subspace dimension, as ParisKV's
#define CENT 256   // centroids per subspace, as ParisKV's sign patterns
#define ITERS 10   // Lloyd iterations

typedef struct {
    Selector base;
    int n_kv_heads, D, M; // M = D / SUB subspaces
    size_t cap;
    int *n_cent;     // (n_layers, n_kv_heads): centroids learned (0: not yet trained)
    float *cent;     // (n_layers, n_kv_heads, M, CENT, SUB)
    uint8_t *codes;  // (n_layers, n_kv_heads, cap, M)
    float *rows;     // (n_kv_heads, cap, D): the training keys
    int *assign;     // (n_kv_heads, cap)
    double *sums;    // (n_kv_heads, CENT, SUB)
    int *counts;     // (n_kv_heads, CENT)
} KMeans;

static size_t lh(const KMeans *km, int layer, int kv_head) { return (size_t)layer * km->n_kv_heads + kv_head; }

static int nearest(const float *c, int K, const float *x) {
    int best = 0;
    float bd = 0.0f;
    for (int j = 0; j < K; j++) {
        float d = 0.0f;
        for (int t = 0; t < SUB; t++) {
            float e = x[t] - c[j * SUB + t];
            d += e * e;
        }
        if (j == 0 || d < bd) bd = d, best = j; // ties: the smaller index
    }
    return best;
}

// Lloyd's k-means on subspace b of N rows, seeded with evenly spaced keys (deterministic).
static void train(KMeans *km, int kv_head, float *cent, const float *rows, int N, int K, int b) {
    int *assign = km->assign + (size_t)kv_head * km->cap, *cnt = km->counts + (size_t)kv_head * CENT;
    double *sum = km->sums + (size_t)kv_head * CENT * SUB;
    for (int j = 0; j < K; j++) memcpy(cent + j * SUB, rows + (size_t)((long)j * N / K) * km->D + b * SUB, SUB * sizeof(float));
    for (int it = 0; it < ITERS; it++) {
        for (int i = 0; i < N; i++) assign[i] = nearest(cent, K, rows + (size_t)i * km->D + b * SUB);
        memset(sum, 0, (size_t)K * SUB * sizeof(double));
        memset(cnt, 0, (size_t)K * sizeof(int));
        for (int i = 0; i < N; i++) {
            cnt[assign[i]]++;
            for (int t = 0; t < SUB; t++) sum[assign[i] * SUB + t] += rows[(size_t)i * km->D + b * SUB + t];
        }
        for (int j = 0; j < K; j++) // an empty cluster keeps its centroid
            if (cnt[j])
                for (int t = 0; t < SUB; t++) cent[j * SUB + t] = (float)(sum[j * SUB + t] / cnt[j]);
    }
}

static void km_extend(Selector *s, int layer, int kv_head, const KVStore *st, int sink, int from, int to) {
    KMeans *km = (KMeans *)s;
    size_t h = lh(km, layer, kv_head);
    float *cent = km->cent + h * km->M * CENT * SUB;
    int *K = &km->n_cent[h];
    if (*K == 0) { // first index of this sequence: learn the centroids from these keys, once
        float *rows = km->rows + (size_t)kv_head * km->cap * km->D;
        int N = to - from;
        for (int i = 0; i < N; i++)
            memcpy(rows + (size_t)i * km->D, kvstore_window_k(st, sink + from + i, kv_head), (size_t)km->D * sizeof(float));
        *K = N < CENT ? N : CENT;
        for (int b = 0; b < km->M; b++) train(km, kv_head, cent + (size_t)b * CENT * SUB, rows, N, *K, b);
    }
    for (int i = from; i < to; i++) {
        const float *k = kvstore_window_k(st, sink + i, kv_head);
        uint8_t *c = km->codes + (h * km->cap + i) * km->M;
        for (int b = 0; b < km->M; b++) c[b] = (uint8_t)nearest(cent + (size_t)b * CENT * SUB, *K, k + b * SUB);
    }
}

static void km_reset(Selector *s, int layer) {
    KMeans *km = (KMeans *)s;
    for (int h = 0; h < km->n_kv_heads; h++) km->n_cent[lh(km, layer, h)] = 0;
}

static size_t km_scratch(const Selector *s, int max_n) {
    const KMeans *km = (const KMeans *)s;
    return (size_t)km->M * CENT * sizeof(float) + (size_t)max_n * (sizeof(float) + sizeof(ScoredId));
}

static int km_select(const Selector *s, int layer, int kv_head, const float *q, int n, const SelectParams *sp, void *scratch, int *out) {
    const KMeans *km = (const KMeans *)s;
    if (n <= sp->k) return select_all(n, out);
    size_t h = lh(km, layer, kv_head);
    const float *cent = km->cent + h * km->M * CENT * SUB;
    float *lut = scratch, *score = lut + km->M * CENT; // lut (M, CENT): <q_b, centroid>
    ScoredId *heap = (ScoredId *)(score + n);
    for (int b = 0; b < km->M; b++)
        for (int j = 0; j < km->n_cent[h]; j++) {
            float d = 0.0f;
            for (int t = 0; t < SUB; t++) d += q[b * SUB + t] * cent[((size_t)b * CENT + j) * SUB + t];
            lut[b * CENT + j] = d;
        }
    for (int i = 0; i < n; i++) {
        const uint8_t *c = km->codes + (h * km->cap + i) * km->M;
        float e = 0.0f;
        for (int b = 0; b < km->M; b++) e += lut[b * CENT + c[b]];
        score[i] = e;
    }
    return topk_select(score, NULL, n, sp->k, heap, out);
}

static void km_destroy(Selector *s) {
    KMeans *km = (KMeans *)s;
    if (km) free(km->n_cent), free(km->cent), free(km->codes), free(km->rows), free(km->assign), free(km->sums), free(km->counts);
    free(km);
}

Selector *selector_kmeans(int n_layers, int n_kv_heads, int head_dim, int cap, char *err) {
    if (head_dim % SUB) {
        snprintf(err, ATTN_ERR_LEN, "kmeans needs head_dim a multiple of %d, not %d", SUB, head_dim);
        return NULL;
    }
    KMeans *km = attn_calloc(1, sizeof *km, "the kmeans selector", err);
    if (!km) return NULL;
    km->base = (Selector){"kmeans", km_extend, km_reset, km_scratch, km_select, km_destroy, NULL};
    km->n_kv_heads = n_kv_heads, km->D = head_dim, km->M = head_dim / SUB, km->cap = (size_t)(cap > 0 ? cap : 1);
    size_t heads = (size_t)n_layers * n_kv_heads;
    if (!(km->n_cent = attn_calloc(heads, sizeof(int), "kmeans state", err)) ||
        !(km->cent = attn_calloc(heads * km->M * CENT * SUB, sizeof(float), "kmeans centroids", err)) ||
        !(km->codes = attn_calloc(heads * km->cap * km->M, 1, "kmeans codes", err)) ||
        !(km->rows = attn_calloc((size_t)n_kv_heads * km->cap * head_dim, sizeof(float), "kmeans training keys", err)) ||
        !(km->assign = attn_calloc((size_t)n_kv_heads * km->cap, sizeof(int), "kmeans assignments", err)) ||
        !(km->sums = attn_calloc((size_t)n_kv_heads * CENT * SUB, sizeof(double), "kmeans sums", err)) ||
        !(km->counts = attn_calloc((size_t)n_kv_heads * CENT, sizeof(int), "kmeans counts", err))) {
        km_destroy(&km->base);
        return NULL;
    }
    return &km->base;
}
