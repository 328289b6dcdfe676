// A prompt longer than the device cache, under ParisKV with the zone in the host store: the
// forward pass turned inside out -- layer by layer over the whole prompt instead of chunk by
// chunk through every layer -- so that the GPU holds the prompt's residual stream (n x dim
// fp32) and one layer's K/V (n positions) instead of every layer's: a 1M-token Llama-3.1-8B
// prompt needs 16 + 4 GiB instead of 128. Attention over the prompt is dense, as in a chunked
// prefill. Each chunk runs layer.cu's two halves around the same attention as a chunked prefill,
// on the same chunk boundaries, so the results are a chunked prefill's, bit for bit. After each
// layer its zone rows go to the host store and its sink and newest rows to the device cache's
// ring; at the end the index is built from the store, as at the first decode step after any
// prefill.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "gpu_state.h"
#include "kernels.h"
#include "flash_prefill.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int gpu_prefill_is_layered(const GpuState *g, int n) {
    const Pkv *p = &g->pkv;
    if (!p->on || !p->kv.host || n <= p->cfg.sink) return 0;
    const char *env = getenv("PKV_PREFILL_LAYERED"); // tests: the layered prefill on a prompt that would fit
    return n > g->dcap || (env && atoi(env) > 0);
}

// Progress on stderr: redrawn on a terminal, a line per tenth of the way into a log.
static void progress(int l, int L, int n, double t0, int *last_tenth) {
    int tty = isatty(STDERR_FILENO), tenth = 10 * l / L;
    if (!tty && tenth <= *last_tenth && l < L) return;
    double el = now_s() - t0, left = l > 0 ? el * (L - l) / l : 0;
    fprintf(stderr, "%sprefill, layer by layer: %d/%d layers of %d tokens, %.0f s (%.0f s left)%s", tty ? "\r" : "", l, L, n, el, left,
            tty && l < L ? "" : "\n");
    *last_tenth = tenth;
}

cudaError_t gpu_prefill_layered(GpuState *g, const int *tokens, int n, char *err) {
    Pkv *p = &g->pkv;
    const Config *c = &g->c;
    int hd = c->head_dim, dim = c->dim, nkv = c->n_kv_heads;
    int S = p->cfg.sink, T0 = g->chunk, n_chunks = (n + T0 - 1) / T0;
    cudaStream_t st = g->st;

    // Memory: the residual stream and one layer's K/V beside a device cache cut down to what is
    // left (at least the ring the decode steps need), checked before anything is freed.
    size_t x_bytes = (size_t)n * dim * 4, kv_bytes = (size_t)nkv * n * hd * 2, aux = ((size_t)n + n_chunks) * 4;
    size_t f8 = g->prefill_fp8 ? flash_prefill_fp8_workspace(T0, n, c->n_heads, nkv, hd) : 0; // --prefill-attn fp8's e4m3 copies
    size_t scratch = x_bytes + 2 * kv_bytes + f8 + aux + (8u << 20), slack = 256u << 20, per_pos = gpu_kv_bytes(c, 1);
    size_t free_b = 0, total_b = 0;
    CU_TRY(cudaStreamSynchronize(st));
    CU_TRY(cudaMemGetInfo(&free_b, &total_b));
    size_t avail = free_b + per_pos * (size_t)g->dcap + g->f8_ws_bytes; // the device cache (and fp8 workspace) given back first
    long fit = avail > scratch + slack ? (long)((avail - scratch - slack) / per_pos) : 0;
    int least = pkv_min_positions(&p->cfg, g->chunk), dcap = fit < g->dcap ? (int)fit : g->dcap;
    if (dcap < least) {
        gpu_set_err(err, "GPU memory: a %d-token prompt is prefilled layer by layer: its residual stream %.2f GiB + one layer's K/V %.2f GiB "
                    "%s+ a device cache of %d positions %.2f GiB need %.2f GiB, but %.2f GiB of %.2f GiB is free for them: shorten the prompt or lower --ctx",
                    n, gib(x_bytes), gib(2 * kv_bytes), f8 ? "+ fp8 attention's copies of it " : "", least, gib(per_pos * least),
                    gib(scratch + per_pos * least), gib(avail), gib(total_b));
        return cudaErrorMemoryAllocation;
    }
    if (host_store_grow(&p->hs, n - S, err) != 0) return cudaErrorMemoryAllocation;
    gpu_drop_graphs(g); // they hold the device cache's address and size
    cudaFree(g->kcache), cudaFree(g->vcache), cudaFree(g->f8_ws);
    g->kcache = g->vcache = NULL, g->f8_ws = NULL, g->f8_ws_bytes = 0;
    g->dcap = dcap;
    size_t half = per_pos * (size_t)dcap / 2;
    float *x = NULL;
    bf16 *ks = NULL, *vs = NULL;
    int *d_tok = NULL, *d_start = NULL, *h_start = (int *)malloc((size_t)n_chunks * sizeof(int));
    cudaError_t e = h_start ? cudaSuccess : cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = cudaMalloc((void **)&g->kcache, half);
    if (e == cudaSuccess) e = cudaMalloc((void **)&g->vcache, half);
    if (e == cudaSuccess) e = cudaMalloc((void **)&x, x_bytes);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ks, kv_bytes);
    if (e == cudaSuccess) e = cudaMalloc((void **)&vs, kv_bytes);
    if (e == cudaSuccess && f8) e = prefill_fp8_reserve(g, T0, n, NULL, NULL);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_tok, (size_t)n * 4);
    if (e == cudaSuccess) e = cudaMalloc((void **)&d_start, (size_t)n_chunks * 4);
    p->kv.kc = g->kcache, p->kv.vc = g->vcache, p->kv.dcap = dcap;
    if (e == cudaSuccess) {
        for (int i = 0; i < n_chunks; i++) h_start[i] = i * T0;
        e = cudaMemcpy(d_tok, tokens, (size_t)n * 4, cudaMemcpyHostToDevice);
    }
    if (e == cudaSuccess) e = cudaMemcpy(d_start, h_start, (size_t)n_chunks * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = embed_rows(x, g->embd, d_tok, n, dim, st);
    // The index is built layer by layer from the rows still in GPU memory (rounded as the fp8
    // store rounds them, when it is fp8: the same codes the store's copies would encode to), not
    // read back from the host store at the end (10.1 s of a 1M prompt on one H100 that way).
    const int nz = attn_zone_end(&p->cfg, n) - S; // zone slots
    p->indexed = 0;
    if (e == cudaSuccess) e = pkv_gpu_index_reset(&p->ix, -1, st);
    if (e == cudaSuccess) e = pkv_row_cache_invalidate(p->rc, p->kv.n_layers, p->kv.n_kv, st);
    double t0 = now_s();
    int show = n > 8 * T0, last_tenth = 0;
    for (uint32_t l = 0; l < c->n_layers && e == cudaSuccess; l++) {
        for (int ci = 0; ci < n_chunks && e == cudaSuccess; ci++) {
            int p0 = ci * T0, T = n - p0 < T0 ? n - p0 : T0;
            float *xc = x + (size_t)p0 * dim;
            e = layer_qkv(g, l, xc, T, LAYER_GEMM);
            if (e == cudaSuccess) e = prefill_qkv_store(g, l, ks, vs, d_start + ci, T, n);
            if (e == cudaSuccess) e = prefill_attention(g, ks, vs, p0, T, n, p0); // fp8: this layer's earlier chunks copied already
            if (e == cudaSuccess) e = layer_out_mlp(g, l, xc, T, LAYER_GEMM);
        }
        // This layer's rows: the zone's to the host store, the sink's and the ring's newest to
        // the device cache.
        int ring_from = n - (dcap - S) > S ? n - (dcap - S) : S;
        if (e == cudaSuccess) e = pkv_layer_rows_out(p->kv, (int)l, ks, vs, n, S, n, 1, st);
        if (e == cudaSuccess) e = pkv_layer_rows_out(p->kv, (int)l, ks, vs, n, 0, S < n ? S : n, 0, st);
        if (e == cudaSuccess) e = pkv_layer_rows_out(p->kv, (int)l, ks, vs, n, ring_from, n, 0, st);
        if (e == cudaSuccess && nz > 0) {
            PkvKeySource src = {ks + (size_t)S * hd, 0, (size_t)n * hd, (size_t)hd, NULL, 0, p->kv.fp8};
            e = pkv_gpu_encode_layer(&p->ix, src, (int)l, 0, nz, st);
        }
        if (e == cudaSuccess && show) {
            e = cudaStreamSynchronize(st);
            if (g->shard.rank == 0) progress((int)l + 1, (int)c->n_layers, n, t0, &last_tenth); // one line for all GPUs
        }
    }
    if (e == cudaSuccess) e = gpu_logits(g, x + (size_t)(n - 1) * dim, 1);
    if (e == cudaSuccess) e = cudaMemcpyAsync(g->h_logits, g->logits, (size_t)c->vocab_size * 4, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    cudaFree(x), cudaFree(ks), cudaFree(vs), cudaFree(d_tok), cudaFree(d_start);
    free(h_start);
    if (e != cudaSuccess) return e;
    p->synced = n;  // every zone row is in the store
    p->ring_hi = n; // the ring holds the newest positions only
    p->indexed = nz > 0 ? nz : 0; // encoded above
    // What the first decode step needs beyond it (the store grown for its row): timed as part of
    // the prefill.
    double t1 = now_s();
    e = pkv_index_to(g, attn_zone_end(&p->cfg, n), n, err);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e == cudaSuccess && g->shard.rank == 0)
        fprintf(stderr, "prefill, layer by layer (%d tokens; device cache %d positions; the index of %d zone positions built with each layer): "
                "%.1f s, then %.1f s\n", n, dcap, nz > 0 ? nz : 0, t1 - t0, now_s() - t1);
    return e;
}
