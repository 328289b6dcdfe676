// ParisKV's protocol on the host side of the GPU pass (attention/policy.c is the CPU reference):
// which positions are attended densely and which select, when the index grows and from where
// (the host store or the device cache), the zone's rows written to the store, and rewinds.
#include <stdlib.h>
#include <string.h>

#include "gpu_state.h"
#include "kernels.h"

// A new sequence or a rewind: the index is rebuilt from the store at the next step, and the row
// cache emptied with it (pkv_index_to): rows from pos on may change.
static void pkv_reset(GpuState *g, int pos) {
    Pkv *p = &g->pkv;
    p->indexed = 0;
    if (p->synced > pos) p->synced = pos;
    if (pos == 0) p->ring_hi = 0, p->synced = 0;
}

// Makes the index cover the zone [sink, zone_end) before a step that sees it. The keys entering
// it are read from the store: with a host store, rows of positions not yet written through
// (a prefill, dense steps) are copied there first.
cudaError_t pkv_index_to(GpuState *g, int zone_end, int pos, char *err) {
    Pkv *p = &g->pkv;
    int S = p->cfg.sink, n = zone_end - S;
    if (p->kv.host) {
        if (p->synced < pos) {
            int from = p->synced > S ? p->synced : S;
            // Those positions were written by the prefill or dense steps, all below dcap: still in the cache.
            if (pos > g->dcap) {
                gpu_set_err(err, "internal: positions %d..%d are not in the host store and no longer in the device cache", from, pos);
                return cudaErrorInvalidValue;
            }
            if (host_store_grow(&p->hs, pos - S, err) != 0) return cudaErrorMemoryAllocation;
            CU_TRY(pkv_rows_to_host(p->kv, from, pos, g->st));
            p->synced = pos;
        }
        if (host_store_grow(&p->hs, pos - S + 1, err) != 0) return cudaErrorMemoryAllocation; // this step writes pos through
    }
    if (n < p->indexed) p->indexed = 0; // the zone never shrinks within a sequence
    if (n > p->indexed) {
        if (p->indexed == 0) { // every way a zone row can change (a new sequence, a rewind, a restored session, a refill) comes here
            CU_TRY(pkv_gpu_index_reset(&p->ix, -1, g->st));
            CU_TRY(pkv_row_cache_invalidate(p->rc, p->kv.n_layers, p->kv.n_kv, g->st));
        }
        size_t hd = p->kv.hd;
        PkvKeySource src;
        size_t row = p->hs.row_bytes;
        if (p->kv.host && p->kv.fp8) // strides in bytes
            src = (PkvKeySource){NULL, (size_t)p->kv.n_kv * row, row, (size_t)p->kv.n_layers * p->kv.n_kv * row, (const uint8_t *)p->kv.host,
                                 2 * hd, 0};
        else if (p->kv.host)
            src = (PkvKeySource){(const bf16 *)p->kv.host, (size_t)p->kv.n_kv * 2 * hd, 2 * hd, (size_t)p->kv.n_layers * p->kv.n_kv * 2 * hd,
                                 NULL, 0, 0};
        else
            src = (PkvKeySource){p->kv.kc + (size_t)S * hd, (size_t)p->kv.n_kv * g->dcap * hd, (size_t)g->dcap * hd, hd, NULL, 0, 0};
        // A folded (aliased) store: encode piece by piece, each read from the folded rows.
        long A = p->kv.host && p->kv.alias_slots ? p->kv.alias_slots : 0;
        for (int from = p->indexed; from < n;) {
            int to = A ? (int)((from / A + 1) * A < n ? (from / A + 1) * A : n) : n;
            PkvKeySource piece = src;
            if (A && src.fp8) piece.fp8 -= (size_t)(from / A * A) * src.slot_stride;
            else if (A) piece.base -= (size_t)(from / A * A) * src.slot_stride;
            CU_TRY(pkv_gpu_encode(&p->ix, piece, from, to, g->st));
            from = to;
        }
        p->indexed = n;
    }
    return cudaSuccess;
}

cudaError_t pkv_cache_stats(GpuState *g, unsigned long long *per_layer, double *hits, double *rows, int reset) {
    const PkvRowCache *rc = &g->pkv.rc;
    *hits = *rows = 0;
    if (!rc->n) return cudaSuccess;
    size_t n = (size_t)g->c.n_layers * 2;
    unsigned long long *v = per_layer ? per_layer : (unsigned long long *)malloc(n * sizeof *v);
    cudaError_t e = v ? cudaStreamSynchronize(g->st) : cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = cudaMemcpy(v, rc->stats, n * sizeof *v, cudaMemcpyDeviceToHost);
    for (size_t l = 0; e == cudaSuccess && l < n / 2; l++) *hits += (double)v[2 * l], *rows += (double)(v[2 * l] + v[2 * l + 1]);
    if (e == cudaSuccess && reset) e = cudaMemset(rc->stats, 0, n * sizeof *v);
    if (!per_layer) free(v);
    return e;
}

// One ParisKV decode step at pos: the index update it needs, then its graph. Logits in h_step.
cudaError_t pkv_step(GpuState *g, int token, int pos, int sample, char *err) {
    Pkv *p = &g->pkv;
    int zone_end = attn_zone_end(&p->cfg, pos);
    CU_TRY(pkv_index_to(g, zone_end, pos, err));
    *g->h_tokens = token;
    *g->h_pos = pos;
    p->h_meta[0] = zone_end, p->h_meta[1] = zone_end - p->cfg.sink;
    CU_TRY(gpu_decode_step(g, 1, sample));
    if (pos + 1 > p->ring_hi) p->ring_hi = pos + 1;
    if (p->kv.host && pos >= p->synced) p->synced = pos + 1; // written through
    return cudaSuccess;
}

static float *forward_failed(GpuState *g, cudaError_t e, char *err) {
    if (e != cudaErrorMemoryAllocation || !err[0]) gpu_set_err(err, "GPU forward pass failed: %s", cudaGetErrorString(e));
    (void)g;
    return NULL;
}

// The positions [pos, pos + T) under ParisKV: those the protocol attends densely (the prompt, a
// short sequence) as one chunk through the device cache, every later one as a decode step --
// alone or inside a chunk, each query selects for itself, as on the CPU.
float *pkv_forward(GpuState *g, const int *tokens, int T, int pos, int all_logits, int sample, char *err) {
    Pkv *p = &g->pkv;
    const AttnConfig *cf = &p->cfg;
    err[0] = 0;
    if (pos == 0 || pos < p->seen_end) { // a new sequence, or a rewind
        int wrapped = p->ring_hi > g->dcap;
        int nd0 = attn_is_dense(cf, pos);
        if (pos > 0 && wrapped && (nd0 || attn_zone_end(cf, pos) < p->ring_hi - (g->dcap - cf->sink))) {
            gpu_set_err(err, "cannot go back to position %d: the device cache no longer holds its window (%d positions); start over", pos, g->dcap);
            return NULL;
        }
        pkv_reset(g, pos);
    }
    p->seen_end = pos + T;
    size_t V = g->c.vocab_size;
    int nd = 0;
    while (nd < T && attn_is_dense(cf, pos + nd)) nd++;
    // Text after a restored session is more prompt, attended densely -- unless the device cache
    // no longer holds the context (zone in the host store, ring wrapped: a 1M-token session):
    // then it runs through the selection, as a chat's later turn does, and a note says so.
    if (pos > 0 && nd > 0 && pos + nd > g->dcap && p->kv.host && !(pos + 1 < attn_dense_threshold(cf))) {
        fprintf(stderr, "note: the %d tokens after position %d go through the ParisKV selection: the GPU holds %d positions of the %d-token "
                        "context, not enough to attend them densely\n", nd, pos, g->dcap, pos + nd);
        p->cfg.prefill_len = pos;
        nd = 0;
    }
    cudaError_t e = cudaSuccess;
    if (pos == 0 && nd == T && !all_logits && gpu_prefill_is_layered(g, T)) { // a prompt longer than the device cache
        e = gpu_prefill_layered(g, tokens, T, err);
        return e == cudaSuccess ? g->h_logits : forward_failed(g, e, err);
    }
    if (nd > 0) {
        if (pos + nd > g->dcap) {
            gpu_set_err(err, "the prompt reaches position %d, but the GPU holds a prompt's K/V for %d positions (the rest of the context is in host memory): "
                    "shorten the prompt", pos + nd, g->dcap);
            return NULL;
        }
        if (nd == 1 && T == 1) {
            *g->h_tokens = tokens[0];
            *g->h_pos = pos;
            e = gpu_decode_step(g, 0, sample);
            if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
            if (e != cudaSuccess) return forward_failed(g, e, err);
            if (pos + 1 > p->ring_hi) p->ring_hi = pos + 1;
            return g->h_step;
        }
        e = gpu_enqueue_chunk(g, tokens, nd, pos, all_logits);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
        if (e != cudaSuccess) return forward_failed(g, e, err);
        if (pos + nd > p->ring_hi) p->ring_hi = pos + nd;
        // The prompt's end: its zone rows to the store and the index built now, as part of the
        // prefill, rather than inside the first decode step.
        int end = pos + nd;
        if (end == cf->prefill_len && !attn_is_dense(cf, end)) {
            e = pkv_index_to(g, attn_zone_end(cf, end), end, err);
            if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
            if (e != cudaSuccess) return forward_failed(g, e, err);
        }
    }
    // Past the dense phase: a lone position is a decode step (its graph); several go as chunks
    // (pkv_chunk.cu), each query still selecting for itself.
    for (int t = nd, n; t < T; t += n) {
        n = pkv_chunk_len(g, pos + t, T - t);
        if (n > 1 && !getenv("PKV_NO_CHUNK") && !p->recall) { // PKV_NO_CHUNK: decode steps only, for comparisons
            e = pkv_chunk(g, tokens + t, n, pos + t, all_logits, all_logits ? g->h_logits + (size_t)t * V : g->h_logits, err);
            if (e != cudaSuccess) return forward_failed(g, e, err);
            continue;
        }
        n = 1;
        e = pkv_step(g, tokens[t], pos + t, sample, err);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
        if (e == cudaSuccess && p->recall) e = pkv_recall_step(g, pos + t);
        if (e != cudaSuccess) return forward_failed(g, e, err);
        if (all_logits) memcpy(g->h_logits + (size_t)t * V, g->h_step, V * sizeof(float));
        else if (t == T - 1 && !sample) memcpy(g->h_logits, g->h_step, V * sizeof(float));
    }
    return g->h_logits;
}
