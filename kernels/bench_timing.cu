// The benchmark's side of the CUDA backend (kernels/bench_cuda.cu prints the tables): random
// K/V and ParisKV zones as after a prompt, decode steps timed with CUDA events, the device's
// read bandwidth (the floor's denominator), the bytes a ParisKV step reads, and the per-stage
// breakdown.
#include <stdlib.h>
#include <string.h>

#include "gpu_state.h"
#include "kernels.h"

extern "C" {
#include "../attention/pariskv.h"
}

// Times each layer's prefill attention (events around the kernel) from now on; returns the
// milliseconds summed so far (-1: could not make the events).
double one_prefill_attention_ms(void *dev, int start) {
    GpuState *g = (GpuState *)dev;
    if (start && !g->attn_ev) {
        cudaEvent_t *ev = (cudaEvent_t *)calloc(2 * (size_t)g->c.n_layers, sizeof(cudaEvent_t));
        uint32_t made = 0;
        while (ev && made < 2 * g->c.n_layers && cudaEventCreate(&ev[made]) == cudaSuccess) made++;
        if (!ev || made < 2 * g->c.n_layers) { // all or none: the forward pass records every one
            for (uint32_t i = 0; i < made; i++) cudaEventDestroy(ev[i]);
            free(ev);
            return -1;
        }
        g->attn_ev = ev, g->attn_ms = 0;
    }
    return g->attn_ev ? g->attn_ms : -1;
}

cudaError_t one_fill_kv_random(void *dev, int n_tokens) {
    GpuState *g = (GpuState *)dev;
    const Config *c = &g->c;
    size_t per_head = (size_t)n_tokens * c->head_dim, stride = (size_t)g->dcap * c->head_dim;
    for (uint32_t l = 0; l < c->n_layers; l++)
        for (uint32_t h = 0; h < c->n_kv_heads; h++) {
            size_t off = ((size_t)l * c->n_kv_heads + h) * stride;
            CU_TRY(fill_random_bf16(g->kcache + off, per_head, 7000 + l * 64 + h, 1.0f, 0.0f, g->st));
            CU_TRY(fill_random_bf16(g->vcache + off, per_head, 9000 + l * 64 + h, 1.0f, 0.0f, g->st));
        }
    return cudaStreamSynchronize(g->st);
}

// Times n decode steps at position pos (graph replays, CUDA events; sample: each ending in the
// sampler as set by gpu_sample_config, else in the logits' copy); per-step ms into ms_out.
cudaError_t one_time_decode(void *dev, int pos, int warmup, int n, int sample, float *ms_out) {
    GpuState *g = (GpuState *)dev;
    cudaEvent_t a, b;
    CU_TRY(cudaEventCreate(&a));
    CU_TRY(cudaEventCreate(&b));
    *g->h_tokens = 1;
    *g->h_pos = pos;
    for (int i = 0; i < warmup + n; i++) {
        CU_TRY(cudaEventRecord(a, g->st));
        CU_TRY(gpu_decode_step(g, 0, sample));
        CU_TRY(cudaEventRecord(b, g->st));
        CU_TRY(cudaEventSynchronize(b));
        if (i >= warmup) CU_TRY(cudaEventElapsedTime(&ms_out[i - warmup], a, b));
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return cudaSuccess;
}

// Measured device read bandwidth in bytes/s (streaming read of a 2 GiB buffer, median of 10).
extern "C" double gpu_read_bandwidth(void) {
    size_t n = (size_t)2 << 30;
    void *buf;
    float *sink;
    if (cudaMalloc(&buf, n) != cudaSuccess) return 0;
    if (cudaMalloc(&sink, 4) != cudaSuccess) {
        cudaFree(buf);
        return 0;
    }
    fill_random_bf16((bf16 *)buf, n / 2, 1, 1.0f, 0.0f, 0);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float t[13];
    for (int i = 0; i < 13; i++) {
        cudaEventRecord(a, 0);
        read_bandwidth_kernel(buf, n, sink, 0);
        cudaEventRecord(b, 0);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&t[i], a, b);
    }
    // median of the last 10
    for (int i = 3; i < 13; i++)
        for (int j = i + 1; j < 13; j++)
            if (t[j] < t[i]) {
                float x = t[i];
                t[i] = t[j], t[j] = x;
            }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaFree(buf);
    cudaFree(sink);
    return (double)n / (t[8] * 1e-3);
}

size_t one_state_weight_bytes(void *dev) { return ((GpuState *)dev)->weight_bytes; }

// ---- ParisKV ----

void *one_create_bench(const Model *m, const Shard *sh, int ctx, int chunk, const AttnConfig *attn, char *err) {
    return gpu_create_sized(m, sh, ctx, chunk, 0, attn, attn && (attn->store == KV_STORE_HOST || attn->zone_fp8) ? pkv_min_positions(attn, chunk) : 0,
                         err);
}

// As after a prompt of n tokens: random K/V in every zone slot of the context and every device
// cache slot, then the index of the zone [sink, zone_end(n)) built. *fill_s, *index_s: seconds.
cudaError_t one_pkv_fill(void *dev, int n, double *fill_s, double *index_s, char *err) {
    GpuState *g = (GpuState *)dev;
    Pkv *p = &g->pkv;
    if (!p->on) return cudaErrorInvalidValue;
    int slots = g->ctx - p->cfg.sink;
    cudaEvent_t a, b, c;
    CU_TRY(cudaEventCreate(&a));
    CU_TRY(cudaEventCreate(&b));
    CU_TRY(cudaEventCreate(&c));
    CU_TRY(cudaEventRecord(a, g->st));
    if (p->kv.host && host_store_grow(&p->hs, slots, err) != 0) return cudaErrorMemoryAllocation;
    CU_TRY(pkv_fill_random(p->kv, slots, 4242, g->st));
    CU_TRY(cudaEventRecord(b, g->st));
    p->cfg.prefill_len = n;
    p->seen_end = n, p->ring_hi = n, p->synced = g->ctx, p->indexed = 0;
    CU_TRY(pkv_index_to(g, attn_zone_end(&p->cfg, n), n, err));
    CU_TRY(cudaEventRecord(c, g->st));
    CU_TRY(cudaEventSynchronize(c));
    float ab, bc;
    cudaEventElapsedTime(&ab, a, b), cudaEventElapsedTime(&bc, b, c);
    *fill_s = ab * 1e-3, *index_s = bc * 1e-3;
    cudaEventDestroy(a), cudaEventDestroy(b), cudaEventDestroy(c);
    return cudaSuccess;
}

// ---- the top-k locality stream (gpu_pkv_stream) ----

// Per (layer, KV head): the slots dropped in the last steps (a ring of STREAM_HIST), where the
// returns come from.
#define STREAM_HIST_K 4 // the ring holds this many top-k's worth of dropped slots
struct PkvStream {
    double keep, ret;
    unsigned long long rng;
    int hist_cap;
    int *hist, *hist_n, *hist_at; // (heads, hist_cap), (heads), (heads)
    int *prev;                    // (kmax) a head's top-k of the step before
};

static unsigned long long stream_u64(PkvStream *s) { // xorshift64
    unsigned long long x = s->rng;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return s->rng = x;
}

static double stream_unit(PkvStream *s) { return (double)(stream_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

static bool sorted_has(const int *v, int n, int x) { return bsearch(&x, v, (size_t)n, sizeof(int), cmp_int) != NULL; }

// One head's next top-k in place: sel[0, *cnt) the step before's (ascending), each kept with
// probability keep; the rest drawn -- with probability ret one of the head's slots dropped in
// the last steps (not by this step: that would raise the overlap), else uniform over the zone
// [0, n) -- until k distinct, ascending. Then this step's dropped slots join the ring.
static void stream_head(PkvStream *s, int head, int *sel, int *cnt, int n, int k) {
    int np = *cnt, m = 0, *prev = s->prev, *hist = s->hist + (size_t)head * s->hist_cap;
    memcpy(prev, sel, (size_t)np * sizeof(int));
    for (int i = 0; i < np; i++)
        if (prev[i] < n && stream_unit(s) < s->keep) sel[m++] = prev[i];
    for (int round = 0; m < k; round++) { // draw what is missing, then drop repeats: a few rounds (later ones uniform only)
        for (int want = k - m; want > 0; want--) {
            int x = (int)(stream_u64(s) % (unsigned long long)n);
            if (round < 8 && s->hist_n[head] && stream_unit(s) < s->ret) { // a return, unless the step before held it: then the uniform draw
                int r = hist[stream_u64(s) % (unsigned long long)s->hist_n[head]];
                if (r < n && !sorted_has(prev, np, r)) x = r;
            }
            sel[m++] = x;
        }
        qsort(sel, (size_t)m, sizeof(int), cmp_int);
        int u = 0;
        for (int i = 0; i < m; i++)
            if (u == 0 || sel[i] != sel[u - 1]) sel[u++] = sel[i];
        m = u;
    }
    *cnt = m;
    for (int i = 0; i < np; i++)
        if (!sorted_has(sel, m, prev[i])) {
            hist[s->hist_at[head]] = prev[i];
            s->hist_at[head] = (s->hist_at[head] + 1) % s->hist_cap;
            if (s->hist_n[head] < s->hist_cap) s->hist_n[head]++;
        }
}

// The stream's top-k for the step at pos, every layer and KV head, into stream_h.
static void stream_step(GpuState *g, int pos) {
    Pkv *p = &g->pkv;
    int n = attn_zone_end(&p->cfg, pos) - p->cfg.sink, k = p->cfg.topk < n ? p->cfg.topk : n, nkv = (int)g->c.n_kv_heads, kmax = p->sc.kmax;
    for (uint32_t l = 0; l < g->c.n_layers; l++) {
        int *layer = p->stream_h + (size_t)l * nkv * (kmax + 1);
        for (int h = 0; h < nkv; h++) stream_head(p->stream, (int)l * nkv + h, layer + (size_t)h * kmax, layer + (size_t)nkv * kmax + h, n, k);
    }
}

void pkv_stream_free(Pkv *p) {
    if (p->stream) free(p->stream->hist), free(p->stream->hist_n), free(p->stream->hist_at), free(p->stream->prev), free(p->stream);
    cudaFree(p->stream_d), cudaFreeHost(p->stream_h);
    p->stream = NULL, p->stream_d = p->stream_h = NULL;
}

cudaError_t one_pkv_stream(void *dev, double keep, double ret, char *err) {
    GpuState *g = (GpuState *)dev;
    Pkv *p = &g->pkv;
    CU_TRY(cudaStreamSynchronize(g->st));
    gpu_drop_graphs(g); // captured reading the selection's top-k, or the stream's
    pkv_stream_free(p);
    if (keep <= 0) return cudaSuccess;
    size_t bytes = pkv_stream_bytes(g), heads = (size_t)g->c.n_layers * g->c.n_kv_heads;
    PkvStream *s = (PkvStream *)calloc(1, sizeof *s);
    if (s) s->hist_cap = STREAM_HIST_K * p->sc.kmax;
    if (!s || !(s->hist = (int *)malloc(heads * s->hist_cap * sizeof(int))) || !(s->hist_n = (int *)calloc(heads, sizeof(int))) ||
        !(s->hist_at = (int *)calloc(heads, sizeof(int))) || !(s->prev = (int *)malloc((size_t)p->sc.kmax * sizeof(int)))) {
        if (s) free(s->hist), free(s->hist_n), free(s->hist_at), free(s);
        gpu_set_err(err, "out of memory for the top-k stream");
        return cudaErrorMemoryAllocation;
    }
    s->keep = keep, s->ret = ret, s->rng = 0x9E3779B97F4A7C15ull;
    p->stream = s;
    cudaError_t e = cudaMalloc((void **)&p->stream_d, bytes);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&p->stream_h, bytes);
    if (e != cudaSuccess) {
        pkv_stream_free(p);
        gpu_set_err(err, "the top-k stream's buffers (%zu bytes)", bytes);
        return e;
    }
    memset(p->stream_h, 0, bytes); // no step before: the first step's top-k all drawn
    return cudaSuccess;
}

int one_pkv_cache_lines(void *dev, double *bytes) {
    GpuState *g = (GpuState *)dev;
    const Config *c = &g->c;
    int n = g->pkv.on ? g->pkv.rc.n : 0;
    *bytes = n ? (double)pkv_row_cache_bytes(c->n_layers, c->n_kv_heads, c->head_dim, g->pkv.kv.fp8, n) : 0;
    return n;
}

cudaError_t one_pkv_cache_stats(void *dev, double *hits, double *rows, int reset) {
    return pkv_cache_stats((GpuState *)dev, NULL, hits, rows, reset);
}

// Times steps at positions pos0, pos0 + 1, ... (each with the index update it needs, outside
// its graph but inside its timing): ms_out[i], and updated[i] = 1 where step i updated the index.
// Going back (pos0 below the last step's end) empties the row cache as a rewind does -- the
// selection at a repeated position repeats itself, which a warm cache would flatter -- except
// under the locality stream, which sets the overlap itself (and is drawn before each step,
// outside its timing).
cudaError_t one_pkv_time(void *dev, int pos0, int n, int sample, float *ms_out, int *updated, char *err) {
    GpuState *g = (GpuState *)dev;
    Pkv *p = &g->pkv;
    cudaEvent_t a, b;
    if (pos0 < p->seen_end && !p->stream_d) CU_TRY(pkv_row_cache_invalidate(p->rc, p->kv.n_layers, p->kv.n_kv, g->st));
    CU_TRY(cudaEventCreate(&a));
    CU_TRY(cudaEventCreate(&b));
    p->seen_end = pos0;
    for (int i = 0; i < n; i++) {
        int before = p->indexed;
        if (p->stream_d) stream_step(g, pos0 + i);
        CU_TRY(cudaEventRecord(a, g->st));
        CU_TRY(pkv_step(g, 1, pos0 + i, sample, err));
        CU_TRY(cudaEventRecord(b, g->st));
        CU_TRY(cudaEventSynchronize(b));
        CU_TRY(cudaEventElapsedTime(&ms_out[i], a, b));
        updated[i] = p->indexed != before;
        p->seen_end = pos0 + i + 1;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return cudaSuccess;
}

// Bytes one ParisKV step reads at pos: from device memory (index, window and sink rows, the
// selection's own arrays) and through PCIe (the top-k rows from a host store).
void one_pkv_step_bytes(void *dev, int pos, double *device_bytes, double *host_bytes) {
    GpuState *g = (GpuState *)dev;
    Pkv *p = &g->pkv;
    const AttnConfig *cf = &p->cfg;
    double n = attn_zone_end(cf, pos) - cf->sink, B = g->c.head_dim / 8.0, row = 4.0 * g->c.head_dim;
    float beta = cf->beta, rho = cf->rho;
    if (beta <= 0 || rho <= 0) pkv_schedule((int)n, &beta, &rho);
    double C = n * beta < cf->topk ? cf->topk : n * beta, k = cf->topk < n ? cf->topk : n;
    double window = pos - attn_zone_end(cf, pos) + 1 + cf->sink;
    double per_head = n * B + n + C * (6.0 * B + 8) + (window + (p->kv.host ? 0 : k)) * row;
    *device_bytes = per_head * g->c.n_layers * g->c.n_kv_heads;
    *host_bytes = p->kv.host ? k * (double)p->hs.row_bytes * g->c.n_layers * g->c.n_kv_heads : 0;
}

int one_pkv_device_positions(void *dev) { return ((GpuState *)dev)->dcap; }

// Median of n steps at one position (no index update) with the stages in `skip` left out
// (PKV_DECODE_SKIP's bits): the per-stage breakdown of the benchmark (with the sampler last
// configured, if any).
cudaError_t one_pkv_time_skip(void *dev, int pos, int skip, int n, float *median_ms, char *err) {
    GpuState *g = (GpuState *)dev;
    int keep = g->skip;
    gpu_drop_graphs(g); // captured with the stages of skip
    g->skip = skip;
    float *t = (float *)malloc(sizeof(float) * (size_t)n);
    int *u = (int *)malloc(sizeof(int) * (size_t)n);
    cudaError_t e = t && u ? cudaSuccess : cudaErrorMemoryAllocation;
    for (int i = 0; i < n && e == cudaSuccess; i++) e = one_pkv_time(dev, pos, 1, g->sample_on, &t[i], &u[i], err); // the step as last timed
    if (e == cudaSuccess) {
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++)
                if (t[j] < t[i]) { float x = t[i]; t[i] = t[j], t[j] = x; }
        *median_ms = t[n / 2];
    }
    free(t), free(u);
    gpu_drop_graphs(g);
    g->skip = keep;
    return e;
}

