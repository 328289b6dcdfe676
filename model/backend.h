// The backend interface. The CPU backend (backend_cpu.c) supplies the operations the forward
// pass in model.c is written in, and is the reference. The CUDA backend (kernels/) runs the
// same pass itself -- fused kernels, bf16 weights and KV cache, the decode step as one CUDA
// graph -- behind create / forward / destroy, and is checked against the CPU one.
// Activations are fp32, row-major, T rows (tokens) at a time.
#ifndef BACKEND_H
#define BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct Model;
struct AttnConfig;
struct Sampler;
struct SessionGpuLayout;
struct SessionStream;

typedef struct Backend {
    const char *name;
    // y (T, d) = x (T, n) · W^T, W (d, n) stored in dtype (DType)
    void (*matmul)(float *y, const float *x, const void *w, uint32_t dtype, int T, int n, int d);
    // out (T, n) = x / rms(x) * w, per row
    void (*rmsnorm)(float *out, const float *x, const float *w, int T, int n, float eps);
    // out (T, dim) = rows of the embedding table E (vocab, dim) in dtype
    void (*embed)(float *out, const void *E, uint32_t dtype, const int *tokens, int T, int dim);
    // Rotate-half RoPE in place on x (T, n_heads, head_dim), token t at position pos0 + t,
    // with inv_freq (head_dim / 2) angular frequencies.
    void (*rope)(float *x, const float *inv_freq, int pos0, int T, int n_heads, int head_dim);
    // a (n) = silu(a) * b
    void (*swiglu)(float *a, const float *b, long n);
    // x (n) += y
    void (*add)(float *x, const float *y, long n);

    // Whole-pass backends (NULL for the CPU). create() uploads the weights (or makes random
    // ones for a synthetic model: m->token_embd == NULL) and allocates the KV cache for ctx
    // positions and activations for chunk tokens (logits for all of them when all_logits),
    // after checking they fit device memory.
    int (*available)(void);
    // attn: the attention policy the pass runs (NULL or ATTN_FULL: dense), with its store.
    void *(*create)(const struct Model *m, int ctx, int chunk, int all_logits, const struct AttnConfig *attn, char *err);
    // The prompt's length: positions below it are attended densely (AttnConfig.prefill_len).
    void (*set_prefill_len)(void *dev, int prefill_len);
    // As model_forward; the logits returned are in host memory. NULL (err filled) on failure.
    float *(*forward)(void *dev, const int *tokens, int T, int pos, int all_logits, char *err);
    void (*destroy)(void *dev);
    // ./run --bench (see kernels/bench_cuda.cu); 0 on success.
    // attn: NULL or full for dense attention, or ParisKV (its store, k, ...); smp: the sampling
    // timed beside greedy.
    // keep, ret: ParisKV's second row per context, the top-k locality stream that keeps that share
    // of the step before's and draws ret of the rest from recent steps (keep 0: no such row).
    int (*bench)(const struct Model *m, const int *ctx_list, int n_ctx, int steps, int real_prefill, int chunk, const struct AttnConfig *attn,
                 const struct Sampler *smp, double keep, double ret);
    int max_chunk; // preferred prefill chunk
    // Whether a prompt of n tokens at position 0 (logits of the last only) must be given to
    // forward in one call instead of chunks (NULL: never): the CUDA pass prefills a prompt longer
    // than its device cache layer by layer, which needs every token at once.
    int (*prompt_whole)(void *dev, int n);
    // Saved sessions (model/session.h, kv_format SESSION_KV_GPU): the K/V of positions
    // [0, L->n) written to the stream in the layout's order (save), or read from it into the
    // state, which then goes on from position L->n as the saving state would (load). 0, or -1
    // with err filled. NULL: the backend keeps no sessions.
    int (*session_save)(void *dev, const struct SessionGpuLayout *L, struct SessionStream *out, char *err);
    int (*session_load)(void *dev, const struct SessionGpuLayout *L, struct SessionStream *in, char *err);
    // Forgets the sequence and gives back the memory it held beyond the state's fixed buffers (the
    // host store's pinned pages): the next forward starts at position 0. Returns the bytes given
    // back. NULL: nothing to give back.
    size_t (*reset)(void *dev);
    // Sampling inside the decode step, so only the chosen id comes back (NULL: the caller samples
    // the logits forward returns). sample_config fixes the settings (temperature, filters,
    // penalties of model/sampler.h's Sampler) for the steps after it; decode_sample runs the step
    // for token at pos and picks the next id on the device by sampler_pick's definition, from the
    // uniform u and the penalty list (sampler_penalty_list's n_pen ids and counts). The id, or
    // -1 with err filled (a non-finite logit says so as model_forward does).
    int (*sample_config)(void *dev, const struct Sampler *s, char *err);
    int (*decode_sample)(void *dev, int token, int pos, float u, const int *pen_ids, const int *pen_counts, int n_pen, char *err);
    // --profile (AttnConfig.profile): what the run's ParisKV steps measured, printed on f when the
    // run ends (nothing without --profile). NULL: nothing to print.
    void (*profile)(void *dev, FILE *f);
} Backend;

extern const Backend backend_cpu;
// NULL when built without CUDA.
const Backend *backend_cuda_get(void);

#endif
