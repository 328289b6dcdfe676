// Attention over the KV cache. Dense attention is the exact reference; the ParisKV policy and
// its peers (issue 5) select a subset of positions and then attend exactly over that subset.
#ifndef ATTENTION_H
#define ATTENTION_H

// Causal grouped-query attention: query t (at position pos0 + t) attends to cache positions
// 0 .. pos0 + t. Query head h reads KV head h / (n_heads / n_kv_heads). Scale 1/sqrt(head_dim).
//   out     (T, n_heads * head_dim)
//   q       (T, n_heads * head_dim)
//   k_cache (ctx, n_kv_heads * head_dim), v_cache likewise; positions 0 .. pos0 + T - 1 filled
//   scratch (omp_get_max_threads(), pos0 + T) floats
void attention_dense(float *out, const float *q, const float *k_cache, const float *v_cache, int pos0, int T,
                     int n_heads, int n_kv_heads, int head_dim, float *scratch);

// A selection policy (ParisKV, its peers) plugs in here. The forward pass calls attend() for
// every layer once that layer's K/V for positions pos0 .. pos0+T-1 are in the cache; the policy
// keeps whatever index it needs (per layer, per KV head) and writes out exactly as
// attention_dense does, but over the positions it selects. NULL policy: dense attention.
typedef struct AttnPolicy AttnPolicy;
struct AttnPolicy {
    const char *name;
    void (*attend)(AttnPolicy *p, int layer, float *out, const float *q, const float *k_cache, const float *v_cache,
                   int pos0, int T, int n_heads, int n_kv_heads, int head_dim, float *scratch);
    void (*reset)(AttnPolicy *p); // a new sequence starts at position 0
    void (*destroy)(AttnPolicy *p);
    void *state;
};

#endif
