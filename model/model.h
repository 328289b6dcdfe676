// A loaded model and the forward pass over it.
#ifndef MODEL_H
#define MODEL_H

#include <stddef.h>
#include "../attention/attention.h"
#include "backend.h"
#include "config.h"
#include "modelfile.h"

typedef struct {
    const float *attn_norm;  // (dim)
    const void *wq;          // (n_heads * head_dim, dim)
    const void *wk;          // (n_kv_heads * head_dim, dim)
    const void *wv;          // (n_kv_heads * head_dim, dim)
    const float *q_norm;     // (head_dim), Qwen3 only
    const float *k_norm;     // (head_dim), Qwen3 only
    const void *wo;          // (dim, n_heads * head_dim)
    const float *ffn_norm;   // (dim)
    const void *w_gate;      // (hidden_dim, dim)
    const void *w_up;        // (hidden_dim, dim)
    const void *w_down;      // (dim, hidden_dim)
} LayerWeights;

typedef struct {
    Config c;
    ModelFile file;
    const void *token_embd;   // (vocab_size, dim)
    const float *output_norm; // (dim)
    const void *output;       // (vocab_size, dim); the embedding when tied
    LayerWeights *layers;     // (n_layers)
    float *inv_freq;          // (head_dim / 2) RoPE angular frequencies, scaling applied
    const Backend *be;
} Model;

// Activations for up to `chunk` tokens at once, and the KV cache for `ctx` positions.
typedef struct {
    int ctx, chunk;
    float *x;           // (chunk, dim) residual stream
    float *xb;          // (chunk, max(dim, n_heads * head_dim)) normed input / attention output
    float *xb2;         // (chunk, dim) projection output
    float *q;           // (chunk, n_heads * head_dim)
    float *hb;          // (chunk, hidden_dim)
    float *hb2;         // (chunk, hidden_dim)
    float *logits;      // (chunk, vocab_size)
    float *att_scratch; // (threads, ctx) attention scores
    float *key_cache;   // (n_layers, ctx, n_kv_heads * head_dim)
    float *value_cache; // (n_layers, ctx, n_kv_heads * head_dim)
    AttnPolicy *attn;   // NULL: dense attention (not owned)
} RunState;

int model_load(Model *m, const char *path, char *err);
void model_free(Model *m);

// Bytes run_state_init would allocate.
size_t run_state_bytes(const Config *c, int ctx, int chunk);
// Allocates the state after checking it fits the memory available (the message names both).
int run_state_init(RunState *s, const Config *c, int ctx, int chunk, char *err);
void run_state_free(RunState *s);

// Runs tokens[0..T) (T <= chunk) at positions pos .. pos+T-1, writing their K/V into the cache.
// Returns the logits of every token (T, vocab) when all_logits, else of the last token only.
float *model_forward(const Model *m, RunState *s, const int *tokens, int T, int pos, int all_logits);

// RoPE frequencies for a configuration (rope_freqs: per-frequency divisors, or NULL).
void rope_inv_freq(const Config *c, const float *rope_freqs, float *inv_freq);

#endif
