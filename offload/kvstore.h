// The KV store behind the attention policies: where the K/V rows of one layer live.
//
// Regions of a sequence (attention/attention.h has the arithmetic):
//   [ sink | retrieval zone | local window | update buffer ]
// The sink, the local window and the update buffer are the working window: on the GPU they stay
// in device memory, and the forward pass writes each new token's K/V there. The retrieval zone
// is the host store: full-precision rows that only a selection reads, a few rows per step.
// A policy touches the store in two ways only:
//   evict:  positions [p0, p0+n) leave the local window for the retrieval zone (GPU: an async
//           copy to pinned host memory; the policy encodes their keys before calling it)
//   gather: copy the K and V rows of chosen retrieval-zone positions of one KV head (GPU: the
//           top-k fetch through UVA)
// and reads the window rows in place through window_k / window_v.
//
// On the CPU the "host store" is the layer's slice of RunState's fp32 cache, so the whole store
// is a view: eviction moves nothing and a gather is a row copy. It is header-only so that every
// unit that needs it compiles it in. The pinned-host-memory + UVA store of the offload issue
// implements the same two calls.
#ifndef KVSTORE_H
#define KVSTORE_H

#include <string.h>

typedef struct KVStore KVStore;
struct KVStore {
    // Rows (n, head_dim) of KV head h at positions pos[0..n) into k and v.
    void (*gather)(const KVStore *s, int kv_head, const int *pos, int n, float *k, float *v);
    // Positions [p0, p0 + n) join the retrieval zone.
    void (*evict)(KVStore *s, int p0, int n);
    // The working window: row of position p, KV head h at window_k + p * row_stride + h * head_dim.
    const float *window_k, *window_v;
    long row_stride; // n_kv_heads * head_dim
    int head_dim;
};

static inline const float *kvstore_window_k(const KVStore *s, int pos, int kv_head) {
    return s->window_k + (size_t)pos * (size_t)s->row_stride + (size_t)kv_head * (size_t)s->head_dim;
}

static inline const float *kvstore_window_v(const KVStore *s, int pos, int kv_head) {
    return s->window_v + (size_t)pos * (size_t)s->row_stride + (size_t)kv_head * (size_t)s->head_dim;
}

static inline void kvstore_cpu_gather(const KVStore *s, int kv_head, const int *pos, int n, float *k, float *v) {
    size_t row = (size_t)s->head_dim * sizeof(float);
    for (int i = 0; i < n; i++) {
        if (k) memcpy(k + (size_t)i * s->head_dim, kvstore_window_k(s, pos[i], kv_head), row);
        if (v) memcpy(v + (size_t)i * s->head_dim, kvstore_window_v(s, pos[i], kv_head), row);
    }
}

static inline void kvstore_cpu_evict(KVStore *s, int p0, int n) {
    (void)s, (void)p0, (void)n; // plain memory: the rows are already where the zone reads them
}

// A view of one layer's cache: k_cache, v_cache (ctx, n_kv_heads * head_dim).
static inline void kvstore_cpu_view(KVStore *s, const float *k_cache, const float *v_cache, int n_kv_heads, int head_dim) {
    s->gather = kvstore_cpu_gather;
    s->evict = kvstore_cpu_evict;
    s->window_k = k_cache;
    s->window_v = v_cache;
    s->row_stride = (long)n_kv_heads * head_dim;
    s->head_dim = head_dim;
}

#endif
