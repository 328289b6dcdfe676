// Dense causal attention on the CPU: the exact reference.
#include "attention.h"


// Per thread (par's most): one block's scores for ATT_SUB heads and the partial results
// of one query's blocks (attend_rows_scratch); then a single query's blocks, all groups.
size_t attention_dense_scratch(const AttnParallel *par, int n_heads, int n_kv_heads, int head_dim, int n_keys) {
    int group = n_heads / n_kv_heads, subs = (group + ATT_SUB - 1) / ATT_SUB;
    size_t nb = ((size_t)n_keys + ATT_BLOCK - 1) / ATT_BLOCK;
    size_t shared = (size_t)n_kv_heads * subs * nb * ATT_SUB * ATT_PART(head_dim);
    return (size_t)par->max_threads() * attend_rows_scratch(head_dim, n_keys) + shared;
}

// Rows [p0, p0 + m) of one KV head as pointers (attend_block reads rows through pointers so that
// the policies, whose rows are scattered, share its arithmetic).
static void block_rows(const float **kr, const float **vr, const float *kb, const float *vb, int p0, int m, int kv_dim) {
    for (int p = 0; p < m; p++) kr[p] = kb + (size_t)(p0 + p) * kv_dim, vr[p] = vb + (size_t)(p0 + p) * kv_dim;
}

typedef struct {
    float *out, *scratch, *shared;
    const float *q, *k_cache, *v_cache;
    int pos0, T, n_heads, group, subs, hd, kv_dim, nb; // nb: blocks of a single query (T = 1)
    size_t stride;
} Dense;

// Task `task` of a query: ATT_SUB heads (or what is left of the group) of one KV group.
static int task_heads(const Dense *d, int task, int *kvh, int *h0) {
    *kvh = task / d->subs, *h0 = *kvh * d->group + (task % d->subs) * ATT_SUB;
    int left = *kvh * d->group + d->group - *h0;
    return left < ATT_SUB ? left : ATT_SUB;
}

// Block b of task `task` of query row t (n keys): its partial into part.
static void one_block(const Dense *d, int t, int task, int b, int n, float *part, float *score) {
    const float *kr[ATT_BLOCK], *vr[ATT_BLOCK];
    int kvh, h0, g = task_heads(d, task, &kvh, &h0), m = n - b * ATT_BLOCK < ATT_BLOCK ? n - b * ATT_BLOCK : ATT_BLOCK;
    block_rows(kr, vr, d->k_cache + (size_t)kvh * d->hd, d->v_cache + (size_t)kvh * d->hd, b * ATT_BLOCK, m, d->kv_dim);
    attend_block(d->q + ((size_t)t * d->n_heads + h0) * d->hd, g, d->hd, kr, vr, m, part, score);
}

// A single query (a decode step): its blocks spread over the threads, then merged per task.
static void decode_block_task(void *ctx, int i, int thread) {
    Dense *d = ctx;
    int task = i / d->nb, b = i % d->nb;
    float *score = d->scratch + (size_t)thread * d->stride;
    one_block(d, 0, task, b, d->pos0 + 1, d->shared + ((size_t)task * d->nb + b) * ATT_SUB * ATT_PART(d->hd), score);
}

static void decode_merge_task(void *ctx, int task, int thread) {
    (void)thread;
    Dense *d = ctx;
    int kvh, h0, g = task_heads(d, task, &kvh, &h0);
    attend_merge(d->out + (size_t)h0 * d->hd, g, d->hd, d->nb, d->shared + (size_t)task * d->nb * ATT_SUB * ATT_PART(d->hd));
}

// A chunk of queries: one task per query and group, its blocks in turn.
static void chunk_task(void *ctx, int i, int thread) {
    Dense *d = ctx;
    int tasks = d->n_heads / d->group * d->subs, t = i / tasks, task = i % tasks, n = d->pos0 + t + 1;
    int nb = (n + ATT_BLOCK - 1) / ATT_BLOCK, kvh, h0, g = task_heads(d, task, &kvh, &h0);
    float *score = d->scratch + (size_t)thread * d->stride, *part = score + ATT_SUB * ATT_BLOCK;
    for (int b = 0; b < nb; b++) one_block(d, t, task, b, n, part + (size_t)b * ATT_SUB * ATT_PART(d->hd), score);
    attend_merge(d->out + ((size_t)t * d->n_heads + h0) * d->hd, g, d->hd, nb, part);
}

void attention_dense(const AttnParallel *par, float *out, const float *q, const float *k_cache, const float *v_cache, int pos0,
                     int T, int n_heads, int n_kv_heads, int head_dim, float *scratch) {
    int group = n_heads / n_kv_heads, subs = (group + ATT_SUB - 1) / ATT_SUB, tasks = n_kv_heads * subs;
    Dense d = {out, scratch, NULL, q, k_cache, v_cache, pos0, T, n_heads, group, subs, head_dim, n_kv_heads * head_dim,
               (pos0 + T + ATT_BLOCK - 1) / ATT_BLOCK, attend_rows_scratch(head_dim, pos0 + T)};
    d.shared = scratch + (size_t)par->max_threads() * d.stride;
    if (T == 1) {
        par->run(tasks * d.nb, decode_block_task, &d);
        par->run(tasks, decode_merge_task, &d);
    } else {
        par->run(T * tasks, chunk_task, &d);
    }
}
