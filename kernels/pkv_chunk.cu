// Several positions past the dense phase under ParisKV in one pass (a chat's later turn, a score
// chunk): each query still selects its own top-k and attends sink + top-k + window exactly as a
// decode step does (the CPU policy's semantics), but the weights are read once for the chunk:
// the QKV, output and MLP projections are GEMMs over its T rows, as in a dense prefill. Between
// them, per layer, each token in order: its QKV post-processing (its row into the ring and the
// store), its selection, its attention -- so token t sees tokens < t of the chunk in its window.
// A chunk never crosses an index update (the zone is the same for all its tokens), so the index
// is brought up to date once, before it.
#include "gpu_state.h"
#include "kernels.h"

int pkv_chunk_len(const GpuState *g, int pos, int T) {
    const AttnConfig *cf = &g->pkv.cfg;
    int ze = attn_zone_end(cf, pos), n = 1;
    while (n < T && n < g->chunk && attn_zone_end(cf, pos + n) == ze) n++;
    return n;
}

// The attention step of a chunk's layer: each of its T tokens in order, as a decode step.
static cudaError_t attn_tokens(GpuState *g, uint32_t l, void *arg) {
    Pkv *p = &g->pkv;
    const Config *c = &g->c;
    int T = *(const int *)arg, hd = c->head_dim, nh = c->n_heads, q_dim = nh * hd, qkv_dim = q_dim + 2 * c->n_kv_heads * hd;
    const GpuLayer *w = &g->layers[l];
    for (int t = 0; t < T; t++) {
        const int *d_pos = p->d_pos_chunk + t;
        CU_TRY(pkv_qkv_decode(p->q, g->proj + (size_t)t * qkv_dim, w->q_norm, w->k_norm, p->rope_chunk + (size_t)t * hd, p->kv, (int)l,
                              d_pos, nh, c->norm_eps, g->st));
        CU_TRY(pkv_gpu_select(&p->sc, &p->ix, (int)l, p->q, nh, p->d_meta + 1, p->cfg.topk, p->cfg.beta, p->cfg.rho, g->st));
        CU_TRY(pkv_attend_rc(g->att + (size_t)t * q_dim, p->q, p->sc.sel, p->sc.nsel, p->sc.kmax, p->kv, p->rc, (int)l, d_pos, p->d_meta, nh,
                             p->partial, p->counters, g->st));
    }
    return cudaSuccess;
}

cudaError_t pkv_chunk(GpuState *g, const int *tokens, int T, int pos, int all_logits, float *logits_out, char *err) {
    Pkv *p = &g->pkv;
    const Config *c = &g->c;
    int hd = c->head_dim;
    cudaStream_t st = g->st;
    int zone_end = attn_zone_end(&p->cfg, pos);
    CU_TRY(pkv_index_to(g, zone_end, pos, err));
    if (p->kv.host && host_store_grow(&p->hs, pos + T - p->cfg.sink, err) != 0) return cudaErrorMemoryAllocation;
    // Inputs in pinned memory, read by the copies below when they run: the caller synchronizes
    // before the next chunk rewrites them.
    memcpy(g->h_tokens, tokens, (size_t)T * sizeof(int));
    for (int t = 0; t < T; t++) p->h_pos_chunk[t] = pos + t;
    p->h_meta[0] = zone_end, p->h_meta[1] = zone_end - p->cfg.sink;
    CU_TRY(cudaMemcpyAsync(g->d_tokens, g->h_tokens, (size_t)T * 4, cudaMemcpyHostToDevice, st));
    CU_TRY(cudaMemcpyAsync(p->d_pos_chunk, p->h_pos_chunk, (size_t)T * 4, cudaMemcpyHostToDevice, st));
    CU_TRY(cudaMemcpyAsync(p->d_meta, p->h_meta, 2 * sizeof(int), cudaMemcpyHostToDevice, st));
    for (int t = 0; t < T; t++) CU_TRY(rope_table(p->rope_chunk + (size_t)t * hd, g->inv_freq, p->d_pos_chunk + t, hd / 2, st));
    CU_TRY(embed_rows(g->x, g->embd, g->d_tokens, T, c->dim, st));
    CU_TRY(gpu_layers(g, g->x, T, LAYER_GEMM, attn_tokens, &T));
    int first = all_logits ? 0 : T - 1, n = T - first;
    CU_TRY(gpu_logits(g, g->x + (size_t)first * c->dim, n));
    CU_TRY(cudaMemcpyAsync(logits_out, g->logits, (size_t)n * c->vocab_size * 4, cudaMemcpyDeviceToHost, st));
    CU_TRY(cudaStreamSynchronize(st));
    if (pos + T > p->ring_hi) p->ring_hi = pos + T;
    if (p->kv.host && pos + T > p->synced) p->synced = pos + T; // written through
    return cudaSuccess;
}
