// The selection step every policy shares: given the retrieval zone of one (layer, KV head) and a
// query, choose the zone keys to attend. ParisKV (pariskv.c) and its peers (streaming.c,
// quest.c, fier.c, kmeans.c, oracle.c) implement it; policy.c owns the regions, the sliding
// update, the dense threshold and the exact attention over what was chosen.
#ifndef SELECTOR_H
#define SELECTOR_H

#include <stddef.h>
#include <stdint.h>

#include "../offload/kvstore.h"

typedef struct {
    int k;           // keys to choose (the budget)
    float beta, rho; // ParisKV: candidate ratio and tier fraction (> 0: fixed; else adaptive)
} SelectParams;

// Zone slot i is position sink + i. Indexes grow by whole slot ranges, in order.
typedef struct Selector Selector;
struct Selector {
    const char *name;
    // Indexes zone slots [from, to) of (layer, kv_head), reading their rows through st. Called for
    // the KV heads of a layer in parallel: it touches only that (layer, kv_head).
    void (*extend)(Selector *s, int layer, int kv_head, const KVStore *st, int sink, int from, int to);
    // Forgets the layer's index (a new sequence).
    void (*reset)(Selector *s, int layer);
    // Per-thread scratch bytes for select over up to max_n slots.
    size_t (*scratch_bytes)(const Selector *s, int max_n);
    // Chooses up to sp->k + 16 of the n indexed slots for q (head_dim floats: the mean query of
    // the KV head's group); writes them ascending to out and returns how many. Reads the index only.
    int (*select)(const Selector *s, int layer, int kv_head, const float *q, int n, const SelectParams *sp, void *scratch, int *out);
    void (*destroy)(Selector *s);
    // Keeps the first n slots of the layer's index and forgets the rest (a rewind: the zone's
    // earlier keys are unchanged). NULL: the policy resets the layer and indexes it again.
    void (*truncate)(Selector *s, int layer, int n);
};

// Each returns NULL with err (ATTN_ERR_LEN) filled on a bad shape or out of memory. cap: the
// most zone slots an index will hold.
Selector *selector_pariskv(int n_layers, int n_kv_heads, int head_dim, int cap, char *err);
Selector *selector_streaming(char *err);
Selector *selector_quest(int n_layers, int n_kv_heads, int head_dim, int cap, char *err);
Selector *selector_fier(int n_layers, int n_kv_heads, int head_dim, int cap, char *err);
Selector *selector_kmeans(int n_layers, int n_kv_heads, int head_dim, int cap, char *err);
Selector *selector_oracle(int n_layers, int n_kv_heads, int head_dim, int cap, char *err);

// ---- helpers the selectors share (topk.c) ----

// The k best of score[0..n) (higher first; ties: the smaller id) where id[i] names item i
// (NULL: i itself). Writes the chosen ids ascending to out and returns min(k, n). heap: room for
// k (score, id) pairs.
typedef struct {
    float score;
    int id;
} ScoredId;
int topk_select(const float *score, const int *id, int n, int k, ScoredId *heap, int *out);

// All n slots: the budget covers the whole zone.
int select_all(int n, int *out);

// Allocation that names what failed in err.
void *attn_calloc(size_t n, size_t size, const char *what, char *err);

#endif
