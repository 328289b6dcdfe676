// The CUDA backend's state (made in gpu_create.cu), shared by the units that run its passes
// (forward_cuda.cu and those it names). Private to kernels/: the rest of the program sees an opaque pointer.
#ifndef GPU_STATE_H
#define GPU_STATE_H

#include <cublas_v2.h>

#include "cuda_common.h"
#include "forward_cuda.h"
#include "gemv_quant.h"
#include "pariskv_attend.h"
#include "pariskv_gpu.h"
#include "sample.h"
#include "../offload/host_store.h"

extern "C" {
#include "../attention/attention.h"
#include "../model/config.h"
}

#define ERR_LEN 512

static inline double gib(size_t b) { return (double)b / (1 << 30); } // for messages

typedef struct {
    bf16 *wqkv;         // (q_dim + 2 kv_dim, dim): rows of wq, wk, wv; columns times attn_norm
    bf16 *wo;           // (dim, q_dim)
    bf16 *wgu;          // (2 hidden, dim): gate and up rows interleaved (2i gate, 2i+1 up); columns times ffn_norm
    bf16 *wdown;        // (dim, hidden)
    float *attn_norm;   // (dim), folded into wqkv's columns after upload
    float *ffn_norm;    // (dim), folded into wgu's columns after upload
    float *q_norm;      // (hd) or NULL
    float *k_norm;      // (hd) or NULL
    // A fused group kept quantized (its .dt set: the members' common Q8_0 / Q4_K, kernels/gemv_quant.h):
    // its blocks, rows as above; the bf16 pointer is NULL then, and the norm before it is not folded.
    QMat qqkv, qo, qgu, qdown;
} GpuLayer;

// ParisKV past the dense threshold (attention/attention.h has the regions and the protocol,
// attention/policy.c the CPU reference). Every step: select, fetch, attend, captured in one
// graph that reads the position and the zone from memory; every U steps, before that step's
// graph: encode the keys entering the zone (their rows are already in the store: written
// through by each step, or copied after a prefill).
typedef struct {
    int on;
    AttnConfig cfg;
    GpuKV kv;           // the device cache (sink + ring) and the zone's store
    HostStore hs;       // the zone's rows when kv.host is set
    PkvRowCache rc;     // the zone row cache (host store only; rc.n == 0: none): pkv_attend_rc
    // The benchmark's top-k locality stream (gpu_pkv_stream; bench_timing.cu): each step's top-k
    // drawn on the host into stream_h, copied to stream_d by the step's graph, attended instead
    // of the selection's. Per layer n_kv * kmax slots, then n_kv counts. NULL: off.
    int *stream_d, *stream_h;
    struct PkvStream *stream; // the generator's state (bench_timing.cu)
    PkvGpuIndex ix;
    PkvGpuScratch sc;
    float *q;           // (n_heads, hd) the step's queries, fp32
    float *partial;     // pkv_attend scratch
    unsigned *counters; // (n_kv)
    int *d_meta;        // zone_end, zone slots: device copy of h_meta
    int *h_meta;        // pinned
    int indexed;        // zone slots in the index
    int synced;         // host store: rows of positions [sink, synced) are in it
    int seen_end;       // end of the last call's positions (an earlier start is a rewind)
    int ring_hi;        // one past the highest position written to the device cache since position 0
    cudaGraphExec_t graph[2]; // the decode step's graph: [1] ends in the sampler, [0] in the logits' copy
    int graph_ready[2];
    int *d_pos_chunk;   // (chunk) positions of a chunk of ParisKV steps (pkv_chunk.cu)
    int *h_pos_chunk;   // pinned (chunk)
    float *rope_chunk;  // (chunk, hd) their RoPE tables
    // The PKV_RECALL measurement (pkv_recall.cu; attention/recall.h): each layer's step query and
    // selection kept by the decode graph (device), and their host copies. recall: on.
    int recall;
    float *dbg_q, *h_dbg_q;     // (n_layers, n_heads, hd)
    int *dbg_sel, *h_dbg_sel;   // (n_layers, n_kv, kmax)
    int *dbg_nsel, *h_dbg_nsel; // (n_layers, n_kv)
} Pkv;

// This state's share of a model spread over several GPUs (tensor parallel, gpus.cu): rank r of
// n owns KV heads [r n_kv / n, (r + 1) n_kv / n) with their query heads, the same share of the FFN's
// hidden units and of the LM head's vocabulary rows; the residual stream is whole on every rank.
// n == 1: the whole model, no communication.
typedef struct {
    int rank, n;
    void *comm;         // the rank's NCCL communicator (ncclComm_t), NULL when n == 1
} Shard;

// The one-shot all-reduce's buffers (tp_oneshot.cu), on every rank: each rank's slots of
// 16-byte lines (two floats, each beside the call's number; peer-accessible device pointers) and
// this rank's call count. on == 0: NCCL for every sum.
#define TP_MAX_RANKS 16
#define TP_ONESHOT_MAX 16384 // floats: the decode residual (dim) at most
// fused: the sums ride on the residual GEMVs instead (gemv_bf16_add_stats_tp, TpSum in kernels.h;
// bf16 layer weights; PKV_TP_FUSED=0: the one-shot kernel): rows[q] rank q's slots, count this
// rank's step count.
typedef struct {
    uint4 *in[TP_MAX_RANKS];
    unsigned *epoch;
    int on;
    void *rows[TP_MAX_RANKS];
    unsigned *count;
    int fused;
} TpPeers;

struct GpuState {
    Config c;           // the rank's share: n_heads, n_kv_heads, hidden_dim divided by shard.n (vocab_size whole)
    Shard shard;
    TpPeers tp;         // the one-shot all-reduce (n > 1 with peer access); tp_base its allocation here
    void *tp_base;
    int vocab0, vocab_n; // the LM head's rows here: [vocab0, vocab0 + vocab_n) of the vocabulary
    float *logits_gather; // (logit_rows, vocab) the ranks' logit slices gathered, before their reordering (n > 1, logit_rows > 1)
    int ctx, chunk, logit_rows;
    // --prefill-attn fp8: flash_prefill_fp8's workspace (e4m3 copies of a layer's visible K/V rows and
    // of a chunk's queries), made for chunk queries over the device cache, grown for a layered prefill
    int prefill_fp8;
    void *f8_ws;
    size_t f8_ws_bytes;
    cudaStream_t st;
    cublasHandle_t blas;
    // weights
    bf16 *embd;         // (vocab, dim)
    bf16 *head;         // (vocab, dim); == embd when tied
    QMat qhead;         // a quantized LM head's blocks (.dt set), read by the decode step (prefill's logits use head)
    bf16 *wdeq;         // a quantized layer's largest matrix, dequantized for a prefill GEMM (NULL: no quantized layer)
    float *out_norm;    // (dim)
    float *inv_freq;    // (hd / 2)
    float *rope_cs;     // (hd): cos, sin at the decode step's position
    GpuLayer *layers;   // host array of device pointers
    size_t weight_bytes;
    // KV cache: (n_layers, n_kv, ctx, hd) bf16
    bf16 *kcache, *vcache;
    // activations for up to chunk tokens
    float *x;           // (chunk, dim) residual stream
    bf16 *xb;           // (chunk, max(dim, q_dim, hidden)) matmul input
    float *proj;        // (chunk, max(q_dim + 2 kv_dim, 2 hidden)) matmul output (the gate/up pairs in bf16)
    bf16 *q;            // (chunk, q_dim)
    bf16 *att;          // (chunk, q_dim)
    bf16 *hb;           // (chunk, hidden) SwiGLU output
    float *logits;      // (logit_rows, vocab)
    float *partial;     // flash-decoding scratch
    float *sumsq_a, *sumsq_b; // decode: per-block sums of squares of the residual (gemv_bf16_add_stats)
    unsigned *counters; // (n_kv) decode attention's split counters, zero between steps
    int *d_tokens;      // (chunk)
    int *d_pos;         // (1)
    int *h_tokens;      // pinned (chunk)
    int *h_pos;         // pinned (1)
    float *h_logits;    // pinned (chunk, vocab)
    int skip;           // PKV_DECODE_SKIP: decode stages left out, for timing breakdowns only
    int tp_mutant;      // PKV_TP_MUTANT=1 (gpu_checks.sh tp, split states only): the last layer's W_down parts not summed
    cudaEvent_t *attn_ev; // --bench-prefill: events around each layer's prefill attention (2 per layer), or NULL
    double attn_ms;       // their sum over the chunks so far
    float *h_step;      // pinned (vocab): the logits of a decode step
    cudaGraphExec_t decode_graph[2]; // [1] ends in the sampler, [0] in the logits' copy to h_step
    int graph_ready[2];
    // Sampling inside the decode step (kernels/sample.h), set by gpu_sample_config: the settings
    // (captured into the graph), the step's uniform and penalty list and the id read back, all
    // pinned so that a replay reads what the host wrote.
    int sample_on;
    int sample_pen;     // the step applies the penalty list (the sampler has penalties on)
    SampleParams sp;
    void *sample_scratch;
    float *h_u;         // pinned (1)
    int *h_pen;         // pinned (1 + 2 n_valid): count, ids, counts
    int *h_out;         // pinned (2): the id, the first non-finite logit's id or -1
    int dcap;           // positions of the device cache kcache/vcache (== ctx unless the zone is in the host store)
    Pkv pkv;
};

void gpu_set_err(char *err, const char *fmt, ...);

// ---- communication between the ranks (gpus.cu; no-ops when shard.n == 1) ----

// x (n floats, on this rank's device) summed over the ranks, in place, on g->st.
cudaError_t tp_all_reduce(GpuState *g, float *x, size_t n);
// buf (n_ranks * count floats): rank r's slice at r * count gathered into every rank's buf, in place.
cudaError_t tp_all_gather(GpuState *g, float *buf, size_t count);
// tp_all_reduce, then xb = bf16(x) and *sumsq = sum of x^2 (residual_stats): in one kernel over
// peer access where the ranks have it and x is a decode residual (tp_oneshot.cu), else NCCL + stats.
cudaError_t tp_all_reduce_stats(GpuState *g, float *x, size_t n, bf16 *xb, float *sumsq);
// tp_oneshot.cu: alloc on each rank's thread (peer access enabled; PKV_TP_ONESHOT=0: left off),
// then link once with every rank's state, before any decode graph is captured; free on the rank's thread.
cudaError_t tp_oneshot_alloc(GpuState *g);
void tp_oneshot_link(GpuState *const *all, int n);
void tp_oneshot_free(GpuState *g);
int tp_oneshot_fits(const GpuState *g, size_t n);
cudaError_t tp_oneshot(GpuState *g, float *x, size_t n, bf16 *xb, float *sumsq);
// The fused sum's link for this rank (tp.fused): call = its place in the step (2 l after W_o, 2 l + 1
// after W_down).
TpSum tp_sum_link(const GpuState *g, unsigned call, int own_only);

// ---- the layer sequence (layer.cu) ----

// How a layer's projections run: LAYER_DECODE, one row in the decode graph (GEMVs, each RMSNorm
// split between the residual GEMV before it and the GEMV after it, x must be g->x);
// LAYER_GEMM, T rows (cuBLAS GEMMs; quantized groups dequantized into g->wdeq first).
typedef enum { LAYER_DECODE, LAYER_GEMM } LayerMode;
// Layer l's halves around its attention, over T rows of the residual stream x (T, dim):
//   layer_qkv:     g->proj (T, q_dim + 2 kv_dim) = QKV projection of RMSNorm(x)
//   layer_out_mlp: x += Wo g->att; x += W_down SwiGLU(W_gate/up RMSNorm(x))
cudaError_t layer_qkv(GpuState *g, uint32_t l, float *x, int T, LayerMode mode);
cudaError_t layer_out_mlp(GpuState *g, uint32_t l, float *x, int T, LayerMode mode);
// The attention between them: layer l's g->proj to g->att (arg: the step's own arguments).
typedef cudaError_t (*AttnStep)(GpuState *g, uint32_t l, void *arg);
// Every layer in turn: layer_qkv, attn, layer_out_mlp.
cudaError_t gpu_layers(GpuState *g, float *x, int T, LayerMode mode, AttnStep attn, void *arg);
// g->logits (n, vocab) = LM head of the final RMSNorm of x (n, dim) (one row: the decode GEMV).
cudaError_t gpu_logits(GpuState *g, const float *x, int n);
// A prefill's attention step in two: the QKV post-processing of g->proj (per-head norms, RoPE)
// into g->q and layer l's K/V rows into kc / vc (n_kv, ctx, hd) at positions *d_pos ..; then
// causal attention of the T queries at pos .. over positions [0, pos + T) into g->att.
cudaError_t prefill_qkv_store(GpuState *g, uint32_t l, bf16 *kc, bf16 *vc, const int *d_pos, int T, int ctx);
// copies_from (--prefill-attn fp8): rows [0, copies_from) of kc / vc are unchanged since the last
// call, which had the same ctx (flash_prefill_fp8 reuses their e4m3 copies); 0 when unsure.
cudaError_t prefill_attention(GpuState *g, const bf16 *kc, const bf16 *vc, int pos, int T, int ctx, int copies_from);
// --prefill-attn fp8: its workspace made large enough for T queries over a cache of ctx rows (the
// old one freed first; its copies are then lost); the bytes it needs in *need (for a message).
// *remade: whether it was.
cudaError_t prefill_fp8_reserve(GpuState *g, int T, int ctx, size_t *need, int *remade);
// y (T, d) fp32 (= or +=) x (T, n) bf16 · W^T; W (d, n) bf16.
cudaError_t gpu_gemm(GpuState *g, float *y, const bf16 *x, const bf16 *W, int T, int n, int d, int accumulate);
// The same with a layer's matrix that may be quantized (q->dt set): dequantized into g->wdeq first,
// its columns times norm (the RMSNorm's weights, folded as for bf16 weights at load; NULL: none).
cudaError_t gpu_gemm_w(GpuState *g, float *y, const bf16 *x, const bf16 *W, const QMat *q, const float *norm, int T, int n, int d,
                       int accumulate);
// The decode step's logits: g->logits = LM head · g->xb (the quantized head's blocks when there are).
cudaError_t gpu_head_gemv(GpuState *g);

// ---- the passes (forward_cuda.cu, pkv_protocol.cu) ----

// The decode step (token in *h_tokens, position in *h_pos; under ParisKV the zone in
// pkv.h_meta) as its CUDA graph, captured on first use: logits in h_step, or (sample) the
// sampled id in h_out. Not synchronized.
cudaError_t gpu_decode_step(GpuState *g, int pkv, int sample);
// A prefill chunk of T tokens at pos through the device cache; logits (of every token, or of
// the last) into h_logits. Not synchronized.
cudaError_t gpu_enqueue_chunk(GpuState *g, const int *tokens, int T, int pos, int all_logits);
// gpu_forward under ParisKV: the dense phase as chunks, later positions as decode steps or
// ParisKV chunks. sample (T = 1 only): the step ends in the sampler (id in h_out). NULL (err
// filled) on failure.
float *pkv_forward(GpuState *g, const int *tokens, int T, int pos, int all_logits, int sample, char *err);
// One ParisKV decode step at pos: the index update it needs, then its graph. Not synchronized.
cudaError_t pkv_step(GpuState *g, int token, int pos, int sample, char *err);
// Frees the benchmark's top-k stream (Pkv.stream_*; bench_timing.cu).
void pkv_stream_free(Pkv *p);
// The bytes of the benchmark's top-k stream (Pkv.stream_d).
static inline size_t pkv_stream_bytes(const GpuState *g) {
    return (size_t)g->c.n_layers * g->c.n_kv_heads * (g->pkv.sc.kmax + 1) * sizeof(int);
}
// The row cache's counters (pkv.rc.stats) since they were last zeroed: zone rows read from it
// (*hits) and in all (*rows), per layer into per_layer (n_layers, 2: hits, misses) if not NULL;
// reset: zeroed after. Synchronizes the stream.
cudaError_t pkv_cache_stats(GpuState *g, unsigned long long *per_layer, double *hits, double *rows, int reset);

// ---- weights and state (gpu_weights.cu, gpu_create.cu) ----

// The share of c that rank r of n holds (Shard): heads, KV heads and hidden units divided by n.
Config shard_config(const Config *c, int n);
// Why m cannot be split over n GPUs (NULL: it can).
const char *shard_refusal(const Model *m, int n);

// Activations of a state for chunk tokens and a context (decode scratch), logit_rows rows of logits.
size_t gpu_activation_bytes(const Config *c, int ctx, int chunk, int logit_rows);
// Uploads (or, for a synthetic model, makes) every weight of g's share of m into g (g->layers
// allocated; g->c, g->shard set).
cudaError_t gpu_upload_weights(GpuState *g, const Model *m);
void gpu_free_weights(GpuState *g);
// gpu_create with the device cache's size under a host store chosen by the caller (dcap_want
// > 0, the benchmark: no prompt to hold) or from the memory left (0).
// sh: the share of m this state holds (NULL: all of it).
void *gpu_create_sized(const Model *m, const Shard *sh, int ctx, int chunk, int all_logits, const AttnConfig *attn, int dcap_want, char *err);
// The positions the device cache needs at least under ParisKV with the zone in the host store.
int pkv_min_positions(const AttnConfig *a, int chunk);
// Makes the ParisKV index cover the zone [sink, zone_end) before a step at pos that sees it.
cudaError_t pkv_index_to(GpuState *g, int zone_end, int pos, char *err);
// Frees the decode graphs (they hold the device cache's address and size).
void gpu_drop_graphs(GpuState *g);

// A prompt of n tokens at position 0 under ParisKV with the zone in the host store, computed one
// layer at a time over the whole prompt, so that only one layer's K/V is in GPU memory at once
// (prefill_layered.cu). Leaves the state as a chunked prefill would (zone rows in the store,
// sink and ring rows in the device cache, which may shrink); the last token's logits in h_logits.
cudaError_t gpu_prefill_layered(GpuState *g, const int *tokens, int n, char *err);
// Whether a prompt of n tokens is prefilled that way: it does not fit the device cache (or
// PKV_PREFILL_LAYERED=1 asks for it, tests).
int gpu_prefill_is_layered(const GpuState *g, int n);

// The PKV_RECALL measurement after the ParisKV decode step at pos (pkv_recall.cu): one line per
// layer and KV head, Recall@k of the step's selection against the zone's exact top-k.
cudaError_t pkv_recall_step(GpuState *g, int pos);

// Saved sessions (session_gpu.cu; model/backend.h's session_save / session_load): one_session_*.
struct SessionGpuLayout;
struct SessionStream;
struct Sampler;

// Positions [pos, pos + T) past the dense phase as one pass (pkv_chunk.cu): how many of them one
// chunk takes (those before the next index update, at most the chunk size), and the pass, with
// the logits of every position (all_logits) or of the last into logits_out (pinned host).
int pkv_chunk_len(const GpuState *g, int pos, int T);
cudaError_t pkv_chunk(GpuState *g, const int *tokens, int T, int pos, int all_logits, float *logits_out, char *err);

// One GPU's state behind the public entry points of forward_cuda.h (gpus.cu calls them on every
// rank): each is the gpu_ function of the same name for one state.
void *one_create(const Model *m, const Shard *sh, int ctx, int chunk, int all_logits, const AttnConfig *attn, char *err);
void one_set_prefill_len(void *dev, int prefill_len);
float *one_forward(void *dev, const int *tokens, int T, int pos, int all_logits, char *err);
void one_destroy(void *dev);
int one_sample_config(void *dev, const struct Sampler *s, char *err);
int one_decode_sample(void *dev, int token, int pos, float u, const int *pen_ids, const int *pen_counts, int n_pen, char *err);
int one_prompt_whole(void *dev, int n);
size_t one_reset(void *dev);
void one_profile(void *dev, FILE *f);
int one_session_save(void *dev, const struct SessionGpuLayout *L, struct SessionStream *out, char *err);
int one_session_load(void *dev, const struct SessionGpuLayout *L, struct SessionStream *in, char *err);
size_t one_state_weight_bytes(void *dev);
cudaError_t one_fill_kv_random(void *dev, int n_tokens);
cudaError_t one_time_decode(void *dev, int pos, int warmup, int n, int sample, float *ms_out);
double one_prefill_attention_ms(void *dev, int start);
void *one_create_bench(const Model *m, const Shard *sh, int ctx, int chunk, const AttnConfig *attn, char *err);
cudaError_t one_pkv_fill(void *dev, int n, double *fill_s, double *index_s, char *err);
cudaError_t one_pkv_time(void *dev, int pos0, int n, int sample, float *ms_out, int *updated, char *err);
void one_pkv_step_bytes(void *dev, int pos, double *device_bytes, double *host_bytes);
int one_pkv_device_positions(void *dev);
cudaError_t one_pkv_time_skip(void *dev, int pos, int skip, int n, float *median_ms, char *err);
int one_pkv_cache_lines(void *dev, double *bytes);
cudaError_t one_pkv_cache_stats(void *dev, double *hits, double *rows, int reset);
cudaError_t one_pkv_stream(void *dev, double keep, double ret, char *err);

#endif
