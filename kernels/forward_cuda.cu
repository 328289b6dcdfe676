// The CUDA backend: the forward pass of model/model.c on the GPU. bf16 weights and KV cache,
// fp32 residual stream and accumulation. Decode (one token) uses the bandwidth-bound GEMV and
// flash-decoding kernels and is captured once as a CUDA graph; prefill uses cuBLAS GEMMs and
// the tiled causal attention kernel. Both run the layer sequence of layer.cu; what differs is
// the attention step between its halves (below). Where the rest lives: gpu_weights.cu (weights
// and their memory), gpu_create.cu (the pre-flight check, state), pkv_protocol.cu (ParisKV's
// host side), prefill_layered.cu and pkv_chunk.cu (the other passes), bench_timing.cu.
#include <stdlib.h>
#include <string.h>

#include "forward_cuda.h"
#include "gpu_state.h"
#include "kernels.h"
#include "flash_prefill.h"
#include "pariskv_attend.h"
#include "pariskv_gpu.h"

extern "C" {
#include "../model/sampler.h"
}

// ---- the attention steps ----

// Decode, dense: the QKV post-processing rides on the flash-decoding kernel.
static cudaError_t attn_decode_dense(GpuState *g, uint32_t l, void *arg) {
    (void)arg;
    const Config *c = &g->c;
    if (g->skip & 1) return cudaSuccess; // PKV_DECODE_SKIP=1: the attention left out (timing breakdowns only)
    size_t layer_kv = (size_t)c->n_kv_heads * g->dcap * c->head_dim;
    return attn_decode(g->att, g->proj, g->layers[l].q_norm, g->layers[l].k_norm, g->rope_cs, g->kcache + l * layer_kv,
                       g->vcache + l * layer_kv, g->d_pos, c->n_heads, c->n_kv_heads, c->head_dim, g->dcap, c->norm_eps, g->partial,
                       g->counters, g->st);
}

// Decode under ParisKV: three stages -- QKV post-processing (the new row written through to the
// store), the selection (the group query's transform included; slots written in ascending
// order), the attention over sink + top-k + window. PKV_DECODE_SKIP's bits leave stages out
// for timing breakdowns: 1 all three, 2 the selection (nsel stays 0), 4 the attention.
static cudaError_t attn_decode_pkv(GpuState *g, uint32_t l, void *arg) {
    (void)arg;
    Pkv *p = &g->pkv;
    const Config *c = &g->c;
    int nh = c->n_heads, nkv = c->n_kv_heads, q_dim = nh * c->head_dim;
    cudaStream_t st = g->st;
    if (g->skip & 1) return cudaSuccess;
    CU_TRY(pkv_qkv_decode(p->q, g->proj, g->layers[l].q_norm, g->layers[l].k_norm, g->rope_cs, p->kv, (int)l, g->d_pos, nh, c->norm_eps, st));
    if (!(g->skip & 2))
        CU_TRY(pkv_gpu_select(&p->sc, &p->ix, (int)l, p->q, nh, p->d_meta + 1, p->cfg.topk, p->cfg.beta, p->cfg.rho, st));
    if (p->recall) { // the measurement keeps this layer's query and selection
        size_t ks = (size_t)nkv * p->sc.kmax;
        CU_TRY(cudaMemcpyAsync(p->dbg_q + (size_t)l * q_dim, p->q, (size_t)q_dim * 4, cudaMemcpyDeviceToDevice, st));
        CU_TRY(cudaMemcpyAsync(p->dbg_sel + l * ks, p->sc.sel, ks * 4, cudaMemcpyDeviceToDevice, st));
        CU_TRY(cudaMemcpyAsync(p->dbg_nsel + (size_t)l * nkv, p->sc.nsel, (size_t)nkv * 4, cudaMemcpyDeviceToDevice, st));
    }
    if (g->skip & 4) return cudaSuccess;
    const int *sel = p->sc.sel, *nsel = p->sc.nsel;
    if (p->stream_d) // the benchmark's locality stream (gpu_pkv_stream) instead of what was selected
        sel = p->stream_d + (size_t)l * nkv * (p->sc.kmax + 1), nsel = sel + (size_t)nkv * p->sc.kmax;
    return pkv_attend_rc(g->att, p->q, sel, nsel, p->sc.kmax, p->kv, p->rc, (int)l, g->d_pos, p->d_meta, nh, p->partial, p->counters, st);
}

// A prefill chunk of T tokens at pos through the device cache: --bench-prefill's events around
// the attention kernel.
typedef struct {
    int T, pos;
} ChunkArgs;

static cudaError_t attn_chunk(GpuState *g, uint32_t l, void *arg) {
    const ChunkArgs *a = (const ChunkArgs *)arg;
    size_t layer_kv = (size_t)g->c.n_kv_heads * g->dcap * g->c.head_dim;
    bf16 *kc = g->kcache + l * layer_kv, *vc = g->vcache + l * layer_kv;
    CU_TRY(prefill_qkv_store(g, l, kc, vc, g->d_pos, a->T, g->dcap));
    if (g->attn_ev) CU_TRY(cudaEventRecord(g->attn_ev[2 * l], g->st));
    CU_TRY(prefill_attention(g, kc, vc, a->pos, a->T, g->dcap, 0)); // fp8: the workspace serves every layer, copies made afresh
    if (g->attn_ev) CU_TRY(cudaEventRecord(g->attn_ev[2 * l + 1], g->st));
    return cudaSuccess;
}

// ---- the passes ----

// One decode step (T = 1): five kernels a layer (layer.cu), the attention dense or ParisKV's.
// Logits land in h_step, or (sample) the sampler picks the next id from them into h_out.
static cudaError_t enqueue_decode(GpuState *g, int pkv, int sample) {
    const Config *c = &g->c;
    CU_TRY(embed_stats(g->x, g->xb, g->sumsq_a, g->embd, g->d_tokens, c->dim, g->tp.fused ? g->tp.count : NULL, g->st));
    CU_TRY(rope_table(g->rope_cs, g->inv_freq, g->d_pos, c->head_dim / 2, g->st));
    CU_TRY(gpu_layers(g, g->x, 1, LAYER_DECODE, pkv ? attn_decode_pkv : attn_decode_dense, NULL));
    CU_TRY(gpu_logits(g, g->x, 1));
    if (sample) return gpu_sample(g->logits, &g->sp, g->h_u, g->sample_pen ? g->h_pen : NULL, g->h_out, g->sample_scratch, g->st);
    return cudaMemcpyAsync(g->h_step, g->logits, (size_t)c->vocab_size * 4, cudaMemcpyDeviceToHost, g->st);
}

// Enqueues one forward pass for T tokens (already in d_tokens, position in d_pos / pos): a
// prefill chunk (cuBLAS GEMMs, tiled causal attention).
static cudaError_t enqueue_forward(GpuState *g, int T, int pos, int all_logits) {
    const Config *c = &g->c;
    ChunkArgs a = {T, pos};
    CU_TRY(embed_rows(g->x, g->embd, g->d_tokens, T, c->dim, g->st));
    CU_TRY(gpu_layers(g, g->x, T, LAYER_GEMM, attn_chunk, &a));
    int first = all_logits ? 0 : T - 1, n = T - first;
    CU_TRY(gpu_logits(g, g->x + (size_t)first * c->dim, n));
    return cudaMemcpyAsync(g->h_logits, g->logits, (size_t)n * c->vocab_size * 4, cudaMemcpyDeviceToHost, g->st);
}

cudaError_t gpu_enqueue_chunk(GpuState *g, const int *tokens, int T, int pos, int all_logits) {
    memcpy(g->h_tokens, tokens, (size_t)T * sizeof(int));
    *g->h_pos = pos;
    CU_TRY(cudaMemcpyAsync(g->d_tokens, g->h_tokens, (size_t)T * 4, cudaMemcpyHostToDevice, g->st));
    CU_TRY(cudaMemcpyAsync(g->d_pos, g->h_pos, 4, cudaMemcpyHostToDevice, g->st));
    return enqueue_forward(g, T, pos, all_logits);
}

// The decode step as a graph: it reads the token, the position (and ParisKV's zone, the
// sampler's uniform and penalties) from pinned host memory when replayed, so one capture serves
// every step.
cudaError_t gpu_decode_step(GpuState *g, int pkv, int sample) {
    sample = sample != 0;
    cudaGraphExec_t *exec = pkv ? &g->pkv.graph[sample] : &g->decode_graph[sample];
    int *ready = pkv ? &g->pkv.graph_ready[sample] : &g->graph_ready[sample];
    if (!*ready) {
        cudaGraph_t graph;
        CU_TRY(cudaStreamBeginCapture(g->st, cudaStreamCaptureModeThreadLocal));
        cudaError_t e = cudaMemcpyAsync(g->d_tokens, g->h_tokens, 4, cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(g->d_pos, g->h_pos, 4, cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess && pkv) e = cudaMemcpyAsync(g->pkv.d_meta, g->pkv.h_meta, 2 * sizeof(int), cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess && pkv && g->pkv.stream_d) e = cudaMemcpyAsync(g->pkv.stream_d, g->pkv.stream_h, pkv_stream_bytes(g), cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess) e = enqueue_decode(g, pkv, sample);
        cudaError_t e2 = cudaStreamEndCapture(g->st, &graph);
        CU_TRY(e);
        CU_TRY(e2);
        e = cudaGraphInstantiate(exec, graph, 0);
        cudaGraphDestroy(graph);
        CU_TRY(e);
        *ready = 1;
    }
    return cudaGraphLaunch(*exec, g->st);
}

float *one_forward(void *dev, const int *tokens, int T, int pos, int all_logits, char *err) {
    GpuState *g = (GpuState *)dev;
    if (g->pkv.on) return pkv_forward(g, tokens, T, pos, all_logits, 0, err);
    cudaError_t e;
    if (T == 1) {
        *g->h_tokens = tokens[0];
        *g->h_pos = pos;
        e = gpu_decode_step(g, 0, 0);
    } else {
        e = gpu_enqueue_chunk(g, tokens, T, pos, all_logits);
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
    for (uint32_t l = 0; e == cudaSuccess && T > 1 && g->attn_ev && l < g->c.n_layers; l++) {
        float ms;
        if ((e = cudaEventElapsedTime(&ms, g->attn_ev[2 * l], g->attn_ev[2 * l + 1])) == cudaSuccess) g->attn_ms += ms;
    }
    if (e != cudaSuccess) {
        gpu_set_err(err, "GPU forward pass failed: %s", cudaGetErrorString(e));
        return NULL;
    }
    return T == 1 ? g->h_step : g->h_logits;
}

// ---- sampling inside the decode step ----

int one_sample_config(void *dev, const Sampler *s, char *err) {
    GpuState *g = (GpuState *)dev;
    SampleParams sp = {s->n_valid, s->temperature, s->top_k, s->top_p, s->min_p, s->repeat, s->presence, s->frequency};
    cudaError_t e = cudaStreamSynchronize(g->st);
    if (e == cudaSuccess && !g->sample_scratch) {
        e = cudaMalloc(&g->sample_scratch, gpu_sample_scratch_bytes(s->n_valid));
        if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_u, sizeof(float));
        if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_pen, (1 + 2 * (size_t)g->c.vocab_size) * sizeof(int));
        if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_out, 2 * sizeof(int));
        if (e == cudaSuccess) *g->h_u = 0.5f, g->h_pen[0] = 0; // what a timed replay reads (bench_timing.cu)
    }
    if (e != cudaSuccess) {
        gpu_set_err(err, "GPU sampler setup failed: %s", cudaGetErrorString(e));
        return -1;
    }
    int pen = s->count != NULL; // the sampler keeps counts only with penalties on (model_decode_sample's test too)
    if (g->sample_on && memcmp(&sp, &g->sp, sizeof sp) == 0 && pen == g->sample_pen) return 0;
    g->sp = sp, g->sample_on = 1, g->sample_pen = pen;
    // The graphs that end in the sampler hold the old settings.
    if (g->graph_ready[1]) cudaGraphExecDestroy(g->decode_graph[1]), g->graph_ready[1] = 0;
    if (g->pkv.graph_ready[1]) cudaGraphExecDestroy(g->pkv.graph[1]), g->pkv.graph_ready[1] = 0;
    return 0;
}

int one_decode_sample(void *dev, int token, int pos, float u, const int *pen_ids, const int *pen_counts, int n_pen, char *err) {
    GpuState *g = (GpuState *)dev;
    if (!g->sample_on) {
        gpu_set_err(err, "internal: gpu_decode_sample before gpu_sample_config");
        return -1;
    }
    *g->h_u = u;
    g->h_pen[0] = n_pen;
    memcpy(g->h_pen + 1, pen_ids, (size_t)n_pen * sizeof(int));
    memcpy(g->h_pen + 1 + n_pen, pen_counts, (size_t)n_pen * sizeof(int));
    cudaError_t e = cudaSuccess;
    if (g->pkv.on) {
        err[0] = 0;
        if (!pkv_forward(g, &token, 1, pos, 0, 1, err)) return -1;
    } else {
        *g->h_tokens = token;
        *g->h_pos = pos;
        e = gpu_decode_step(g, 0, 1);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
    }
    if (e != cudaSuccess) {
        gpu_set_err(err, "GPU forward pass failed: %s", cudaGetErrorString(e));
        return -1;
    }
    if (g->h_out[1] >= 0) { // as model_forward reports it
        float bad = 0.0f;
        cudaMemcpy(&bad, g->logits + g->h_out[1], sizeof bad, cudaMemcpyDeviceToHost);
        gpu_set_err(err, "the model produced a non-finite logit (%g, token id %d) at position %d: its weights are damaged or the computation overflowed",
                    (double)bad, g->h_out[1], pos);
        return -1;
    }
    return g->h_out[0];
}

// ---- the rest of the backend table (gpus.cu holds the table, over one GPU or several) ----

// Whether a prompt of n tokens must come in one forward call (prefilled layer by layer).
int one_prompt_whole(void *dev, int n) { return gpu_prefill_is_layered((GpuState *)dev, n); }

// A chat's /reset: the sequence forgotten, the host store's pages given back.
size_t one_reset(void *dev) {
    GpuState *g = (GpuState *)dev;
    Pkv *p = &g->pkv;
    cudaStreamSynchronize(g->st);
    if (!p->on) return 0;
    p->seen_end = 0, p->ring_hi = 0, p->synced = 0, p->indexed = 0;
    return p->kv.host ? host_store_release(&p->hs) : 0;
}

// --profile: the row cache's hit rate over the run, and its spread over the layers.
void one_profile(void *dev, FILE *f) {
    GpuState *g = (GpuState *)dev;
    const Pkv *p = &g->pkv;
    if (!p->on || !p->cfg.profile) return;
    if (!p->rc.n) {
        fprintf(f, "profile: pariskv zone row cache off (%s)\n", p->kv.host ? "--pkv-cache-rows 0" : "the zone is in GPU memory");
        return;
    }
    int L = (int)g->c.n_layers;
    unsigned long long *v = (unsigned long long *)calloc((size_t)L * 2, sizeof *v);
    double hits, rows;
    if (!v || pkv_cache_stats(g, v, &hits, &rows, 0) != cudaSuccess) {
        fprintf(f, "profile: pariskv zone row cache: cannot read its counters\n");
        free(v);
        return;
    }
    double lo = 1, hi = 0;
    int lo_at = 0, hi_at = 0;
    for (int l = 0; l < L; l++) {
        double n = (double)(v[2 * l] + v[2 * l + 1]), r = n > 0 ? v[2 * l] / n : 0;
        if (r < lo) lo = r, lo_at = l;
        if (r > hi) hi = r, hi_at = l;
    }
    fprintf(f, "profile: pariskv zone row cache, %d rows per layer and KV head: %.0f of %.0f zone rows read from it (hit rate %.4f); "
               "layers min %.4f (layer %d) max %.4f (layer %d)\n",
            p->rc.n, hits, rows, rows > 0 ? hits / rows : 0.0, lo, lo_at, hi, hi_at);
    free(v);
}
