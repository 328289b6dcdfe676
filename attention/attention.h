// Attention over the KV cache. Dense attention is the exact reference; the ParisKV policy and
// its peers select a subset of positions and then attend exactly over that subset.
#ifndef ATTENTION_H
#define ATTENTION_H

#include "parallel.h"

#include <stddef.h>
#include <stdio.h>

// Causal grouped-query attention: query t (at position pos0 + t) attends to cache positions
// 0 .. pos0 + t. Query head h reads KV head h / (n_heads / n_kv_heads). Scale 1/sqrt(head_dim).
//   out     (T, n_heads * head_dim)
//   q       (T, n_heads * head_dim)
//   k_cache (ctx, n_kv_heads * head_dim), v_cache likewise; positions 0 .. pos0 + T - 1 filled
//   scratch attention_dense_scratch(par, n_heads, n_kv_heads, head_dim, pos0 + T) floats (sized
//           for par's most threads, as they are when it is called)
// The query heads of a KV group are attended together, so each K and V row is read once per group;
// a single query's blocks of positions are spread over par's threads (attend_rows below), which
// gives the same numbers as one thread taking them in turn.
void attention_dense(const AttnParallel *par, float *out, const float *q, const float *k_cache, const float *v_cache, int pos0,
                     int T, int n_heads, int n_kv_heads, int head_dim, float *scratch);
size_t attention_dense_scratch(const AttnParallel *par, int n_heads, int n_kv_heads, int head_dim, int n_keys);

// ---- exact attention over a list of rows (attend_rows.c): the arithmetic every CPU attention shares ----
//
// g <= ATT_SUB query heads of one KV group attend to n K/V rows (head_dim floats each, given by
// pointers, in position order). The rows are taken in blocks of ATT_BLOCK: per block and head the
// max score m_b, l_b = sum of exp(s - m_b) and o_b = sum of exp(s - m_b) v (unnormalized); then
// out = sum_b e^(m_b - M) o_b / sum_b e^(m_b - M) l_b over the blocks in order (M the max of m_b).
// The blocks are fixed by the row index alone, so a dense pass, a policy attending every
// position, and any split of the blocks over threads all give the same result, bit for bit.
#define ATT_BLOCK 256
#define ATT_SUB 8
#define ATT_PART(hd) ((size_t)(hd) + 2) // a block's partial per head: o_b (hd), m_b, l_b
// One block (m <= ATT_BLOCK rows): part (ATT_SUB, ATT_PART(hd)) for the g heads; score (ATT_SUB, ATT_BLOCK) scratch.
void attend_block(const float *q, int g, int hd, const float *const *krow, const float *const *vrow, int m, float *part, float *score);
// out (g, hd) from nb blocks' partials, part (nb, ATT_SUB, ATT_PART(hd)).
void attend_merge(float *out, int g, int hd, int nb, const float *part);
// Both in turn: out (g, hd), q (g, hd); scratch attend_rows_scratch(hd, n) floats.
void attend_rows(float *out, const float *q, int g, int hd, const float *const *krow, const float *const *vrow, int n, float *scratch);
size_t attend_rows_scratch(int hd, int n);

// A selection policy (ParisKV, its peers) plugs in here. The forward pass calls attend() for
// every layer once that layer's K/V for positions pos0 .. pos0+T-1 are in the cache; the policy
// keeps whatever index it needs (per layer, per KV head) and writes out exactly as
// attention_dense does, but over the positions it selects. NULL policy: dense attention.
typedef struct AttnPolicy AttnPolicy;
struct AttnPolicy {
    const char *name;
    // k_cache / v_cache: the layer's rows; a policy with zone_fp8 rewrites the zone's rows in place.
    void (*attend)(AttnPolicy *p, int layer, float *out, const float *q, float *k_cache, float *v_cache,
                   int pos0, int T, int n_heads, int n_kv_heads, int head_dim, float *scratch);
    void (*reset)(AttnPolicy *p); // a new sequence starts at position 0
    void (*destroy)(AttnPolicy *p);
    void *state;
};

// ---- selection policies: ParisKV and its peers (policy.c) ----
//
// Regions of a sequence, by position: [0, sink) is the sink; [sink, zone_end) the retrieval
// zone; [zone_end, p] the local window and the update buffer, p the query's own position.
// Positions below prefill_len are the prompt: attended densely (a prefill). Every later position
// is a decode step: its query sees the regions the step-by-step protocol gives it, whether it
// arrives alone (T = 1) or inside a chunk (teacher forcing: each query selects for itself).
// Protocol: after the prefill the local window holds its last `local` tokens and the zone
// everything between sink and window; each decode token enters the update buffer; after a step
// that leaves `update` tokens in the buffer, the oldest `update` tokens of window + buffer move
// to the zone. A query attends densely while the sequence (p + 1 tokens) is shorter than
// max(dense_min, sink + local + 2 topk).
typedef enum { ATTN_FULL, ATTN_PARISKV, ATTN_STREAMING, ATTN_QUEST, ATTN_FIER, ATTN_KMEANS, ATTN_ORACLE, ATTN_N_METHODS } AttnMethod;

enum { KV_STORE_AUTO, KV_STORE_GPU, KV_STORE_HOST }; // where the GPU path keeps the retrieval zone's K/V

typedef struct AttnConfig {
    int method;      // AttnMethod
    int topk;        // retrieval-zone keys attended per step and KV head (100)
    int sink;        // S (4)
    int local;       // L (256)
    int update;      // U (512)
    int dense_min;   // dense below max(dense_min, S + L + 2 topk) tokens (2000)
    int prefill_len; // positions below it are the prompt (0: every position is a decode step)
    float beta, rho; // ParisKV candidate ratio and tier fraction; 0: the adaptive schedule by zone size
    int store;       // KV_STORE_*: the GPU path's zone in device memory, in the host store, or host when the GPU is short
    int prefill_fp8; // GPU (sm_90): a prompt's attention in fp8 (--prefill-attn fp8: e4m3 Q, K, V and weights,
                     // kernels/flash_prefill_fp8.cu); the CPU path refuses it
    int zone_fp8;    // the retrieval zone's K/V kept as fp8 (e4m3, a scale per row: offload/fp8.h) instead of bf16 (GPU)
                     // or fp32 (CPU): rows are quantized as they enter the zone; the index and the attention read
                     // the stored values. The CPU path rewrites those rows of its cache in place (the reference).
    int cache_rows;  // GPU, zone in the host store: lines of the zone row cache per layer and KV head (a power of
                     // two up to ATTN_CACHE_ROWS_MAX; 0: off; -1: the default), rows recently selected kept in GPU memory
    int profile;     // --profile: measure where ParisKV's work goes (CPU: the selection's step-to-step overlap;
                     // GPU: the row cache's hits), reported when the run ends
} AttnConfig;

#define ATTN_ERR_LEN 256

void attn_config_default(AttnConfig *c);          // the spec's defaults, method ParisKV
int attn_method_parse(const char *name);           // AttnMethod, or -1
const char *attn_method_name(int method);
int attn_dense_threshold(const AttnConfig *c);     // max(dense_min, S + L + 2 topk)
int attn_is_dense(const AttnConfig *c, int pos);   // the query at pos attends densely
int attn_zone_end(const AttnConfig *c, int pos);   // end of the retrieval zone seen by the query at pos

// A policy for every layer of a model, K/V cache of ctx positions, its work spread by par (kept:
// it must outlive the policy; scratch for par's most threads now). NULL with err filled when the
// configuration is invalid (ATTN_FULL included: it needs no policy) or memory runs out. All index
// memory is allocated here: attend() never allocates.
AttnPolicy *attn_policy_create(const AttnConfig *c, const AttnParallel *par, int n_layers, int n_heads, int n_kv_heads, int head_dim, int ctx, char *err);
const AttnConfig *attn_policy_config(const AttnPolicy *p);
// Saved sessions (model/session.h): how far the rows of the cache hold their fp8 values
// (zone_fp8; the policy rewrites rows as they enter the zone), and a fresh policy told that the
// cache holds positions [0, pos) as a policy of its configuration left them, rows below fp8_end
// already rewritten; its index is rebuilt from the rows at the next step.
int attn_policy_fp8_end(const AttnPolicy *p);
void attn_policy_resume(AttnPolicy *p, int pos, int fp8_end);

// What the policy selects for the query at pos (q_group: the G query heads of kv_head, (G,
// head_dim)) -- the same choice attend() made, for measuring it. Valid right after attend() has
// run with pos as its last query (the index then covers exactly pos's zone). beta, rho > 0
// override the configured ParisKV schedule. Writes retrieval-zone positions (ascending) to out
// (room for topk + 16) and returns their count, or -1 when pos is dense or the index is elsewhere.
int attn_policy_select(AttnPolicy *p, int layer, int kv_head, const float *q_group, int pos, float beta, float rho, int *out);

// --profile (AttnConfig.profile): the overlap of each decode query's selection with the previous
// decode query's (attention/recall.h's selection_overlap), per layer and KV head over the run
// so far: its mean into *mean, and the number of queries measured (0: none; the first decode
// query of a sequence has no previous one). A query inside a chunk is compared with the query
// before it as if each had come alone.
long attn_policy_overlap(const AttnPolicy *p, int layer, int kv_head, double *mean);
// The measurement's summary on f (nothing without --profile): the mean, and the min and max of
// the layers' means and of the (layer, KV head) means; and the hit rate the GPU's zone row cache
// (cache_rows lines; the default for -1) would have had on these selections, simulated.
void attn_policy_report(const AttnPolicy *p, FILE *f);
// The GPU zone row cache's default lines per layer and KV head: 16384 -- measured on an H200
// (tests/bench/GPU.md, session 25), Qwen3-8B 128K, k = 100: 1024 lines hit 0.77 of the locality
// stream's rows, 4096 0.83, 16384 0.84 (the step 1.9% shorter than at 1024), 32768 no more and a
// slower step (the attention's line table, an int a line in shared memory, takes 128 KB a block).
// The caller halves it while it takes more than its share of GPU memory.
#define ATTN_CACHE_ROWS_MAX (1 << 20) // beyond 16,384 lines the GPU resolves claims in a hash of the step's lines
// The default lines for top-k k: 16,384, doubled up to 32 k (k <= 4,096): a line per slot of the
// last several steps' top-k's, so rows that come back after a few steps are still there.
int attn_cache_rows_default(int topk);
// That simulation so far: zone rows it read from the cache (*hits) and in all; returns its lines
// (0: none, without --profile or with cache_rows 0).
int attn_policy_cache_sim(const AttnPolicy *p, double *hits, double *rows);

#endif
