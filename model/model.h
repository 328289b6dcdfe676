// A loaded model and the forward pass over it.
#ifndef MODEL_H
#define MODEL_H

#include <stddef.h>
#include "../attention/attention.h"
#include "backend.h"
#include "config.h"
#include "modelfile.h"
#include "threads.h"

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
    // Each matrix's DType: the configuration's weight_dtype, or Q8_0 / Q4_K (model/quant.h).
    uint32_t wq_dt, wk_dt, wv_dt, wo_dt, w_gate_dt, w_up_dt, w_down_dt;
} LayerWeights;

typedef struct Model {
    Config c;
    ModelFile file;
    const void *token_embd;   // (vocab_size, dim)
    const float *output_norm; // (dim)
    const void *output;       // (vocab_size, dim); the embedding when tied
    LayerWeights *layers;     // (n_layers)
    float *inv_freq;          // (head_dim / 2) RoPE angular frequencies, scaling applied
    const Backend *be;
    uint32_t token_embd_dt, output_dt; // DType of the embedding and of the LM head
    int n_quantized;          // matrices stored as Q8_0 / Q4_K blocks
    uint32_t synthetic_dt;    // a --synthetic model (no file): the DType its matrices are made in on the GPU (--quant)
    int gpus;                 // the GPUs the CUDA backend splits it over (--gpus; 0 or 1: one)
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
    float *att_scratch; // attention_dense_scratch(.., ctx): scores and blocks' partial results
    float *key_cache;   // (n_layers, ctx, n_kv_heads * head_dim)
    float *value_cache; // (n_layers, ctx, n_kv_heads * head_dim)
    AttnPolicy *attn;   // NULL: dense attention (not owned)
    ThreadTuner *threads; // NULL: OpenMP's thread count as set; else [0] decode steps, [1] chunks (not owned)
    void *dev;          // a whole-pass backend's state (GPU); the buffers above are then unused
    const Backend *be;
    const struct Sampler *sampling; // the sampler a device samples for (model_decode_sample), or NULL
    int *pen;           // (2 n_valid) that sampler's penalty list: ids, then counts
} RunState;

int model_load(Model *m, const char *path, char *err);
void model_free(Model *m);

// Bytes run_state_init would allocate on the CPU.
size_t run_state_bytes(const Config *c, int ctx, int chunk);
// Allocates the state on m's backend after checking it fits the memory available (the message
// names both).
// all_logits: the run wants logits for every token of a chunk (scoring), not only the last.
int run_state_init(RunState *s, const Model *m, int ctx, int chunk, int all_logits, char *err);
// The same, for a device backend that runs an attention policy itself (attn: NULL for dense; the
// CPU backend ignores it: its policy is an AttnPolicy attached to the state).
struct AttnConfig;
int run_state_init_attn(RunState *s, const Model *m, int ctx, int chunk, int all_logits, const struct AttnConfig *attn, char *err);
void run_state_free(RunState *s);

// Runs tokens[0..T) (T <= chunk) at positions pos .. pos+T-1, writing their K/V into the cache.
// Returns the logits (host memory) of every token (T, vocab) when all_logits, else of the last
// token only. NULL only from a device backend's failure, with err filled.
float *model_forward(const Model *m, RunState *s, const int *tokens, int T, int pos, int all_logits, char *err);
// One decode step for token at pos and the next token sampled from its logits by smp, given
// the context hist[0..n_hist) for the penalties (token at n_hist - 1): on a backend that samples
// inside its step only the id comes back; otherwise model_forward, then sampler_penalize and
// sampler_sample on the CPU. Either draws the same uniforms from smp's stream. The id, or -1
// with err filled.
struct Sampler;
int model_decode_sample(const Model *m, RunState *s, struct Sampler *smp, int token, int pos, const int *hist, int n_hist, char *err);

// Fills a synthetic model (no file, random weights on the device) with a named real shape:
// llama3.1-8b, qwen3-8b, qwen3-0.6b. Returns 0, or -1 for an unknown name.
int model_synthetic(Model *m, const char *name);

// "bf16", or the matrices' dtypes with their counts when they differ ("q8_0 x155 + q4_k x30"),
// for the load summary.
const char *model_weights_desc(const Model *m, char *buf, size_t n);

// RoPE frequencies for a configuration (rope_freqs: per-frequency divisors, or NULL).
void rope_inv_freq(const Config *c, const float *rope_freqs, float *inv_freq);

#endif
