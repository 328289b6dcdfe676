// The CUDA backend's state made and freed: the pre-flight check of GPU memory (weights, KV
// cache, ParisKV's index and store placement, activations; the numbers in the message when
// they do not fit), then the allocations.
#include <stdarg.h>
#include <stdlib.h>

#include "flash_prefill.h"
#include "gpu_plan.h"
#include "gpu_state.h"
#include "kernels.h"

extern "C" {
#include "../attention/recall.h"
}

void gpu_set_err(char *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, ERR_LEN, fmt, ap);
    va_end(ap);
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

static void pkv_free(Pkv *p) {
    pkv_gpu_index_free(&p->ix);
    pkv_gpu_scratch_free(&p->sc);
    cudaFree(p->rc.lines), cudaFree(p->rc.tags), cudaFree(p->rc.stats);
    pkv_stream_free(p);
    cudaFree(p->q), cudaFree(p->partial), cudaFree(p->counters), cudaFree(p->d_meta), cudaFree(p->d_pos_chunk), cudaFree(p->rope_chunk);
    cudaFreeHost(p->h_meta), cudaFreeHost(p->h_pos_chunk);
    cudaFree(p->dbg_q), cudaFree(p->dbg_sel), cudaFree(p->dbg_nsel);
    free(p->h_dbg_q), free(p->h_dbg_sel), free(p->h_dbg_nsel);
    host_store_close(&p->hs);
}

static void gpu_free(GpuState *g) {
    if (!g) return;
    gpu_drop_graphs(g);
    for (uint32_t i = 0; g->attn_ev && i < 2 * g->c.n_layers; i++)
        if (g->attn_ev[i]) cudaEventDestroy(g->attn_ev[i]);
    free(g->attn_ev);
    pkv_free(&g->pkv);
    gpu_free_weights(g);
    cudaFree(g->rope_cs);
    cudaFree(g->kcache), cudaFree(g->vcache);
    cudaFree(g->x), cudaFree(g->xb), cudaFree(g->proj), cudaFree(g->q), cudaFree(g->att), cudaFree(g->hb), cudaFree(g->f8_ws);
    cudaFree(g->logits), cudaFree(g->logits_gather);
    cudaFree(g->partial), cudaFree(g->counters), cudaFree(g->sumsq_a), cudaFree(g->sumsq_b), cudaFree(g->d_tokens), cudaFree(g->d_pos);
    cudaFreeHost(g->h_tokens), cudaFreeHost(g->h_pos), cudaFreeHost(g->h_logits), cudaFreeHost(g->h_step);
    cudaFree(g->sample_scratch), cudaFreeHost(g->h_u), cudaFreeHost(g->h_pen), cudaFreeHost(g->h_out);
    if (g->blas) cublasDestroy(g->blas);
    if (g->st) cudaStreamDestroy(g->st);
    free(g);
}

// The shapes the kernels take: decode attention for head_dim 16..256 (powers of two) and up to
// 8 query heads per KV head; 16-byte loads of every matrix row.
static const char *unsupported_shape(const Config *c) {
    uint32_t hd = c->head_dim;
    if (hd != 16 && hd != 32 && hd != 64 && hd != 128 && hd != 256) return "head_dim must be 16, 32, 64, 128 or 256";
    if (c->n_kv_heads == 0 || c->n_heads % c->n_kv_heads || c->n_heads / c->n_kv_heads > 8)
        return "at most 8 query heads per KV head";
    if (c->dim % 8 || c->hidden_dim % 8) return "dim and hidden_dim must be multiples of 8";
    return NULL;
}

// Device memory of ParisKV besides the K/V cache: the index, the selection's scratch, the
// attention's scratch.
static size_t pkv_device_bytes(const Config *c, const AttnConfig *a, int ctx) {
    int cap = ctx - a->sink, nkv = c->n_kv_heads;
    return pkv_gpu_index_bytes(c->n_layers, nkv, c->head_dim, cap) + (size_t)nkv * cap * 12 +
           (size_t)nkv * (a->topk + 64) * 8 + pkv_attend_scratch_floats(c->n_heads, nkv, c->head_dim, a->topk) * 4 +
           (size_t)c->n_heads * c->head_dim * 4 + (4u << 20);
}

// The positions the device cache needs at least under ParisKV with the zone in the host store:
// the dense phase, the ring (sink + local window + update buffer + the new token), a prefill chunk.
int pkv_min_positions(const AttnConfig *a, int chunk) {
    int ring = a->sink + a->local + a->update + 1, t = attn_dense_threshold(a);
    return (t > ring ? t : ring) + chunk;
}

// Whether ParisKV's selection runs for a state of ctx positions (a context past the dense threshold).
static int pkv_runs(const AttnConfig *attn, int ctx) { return attn && attn->method == ATTN_PARISKV && ctx >= attn_dense_threshold(attn); }

// Whether this model and attention can run here; sets *pkv when ParisKV's selection will run
// (a context past the dense threshold). 0, or -1 with err filled.
static int check_runnable(const Config *c, int ctx, const AttnConfig *attn, int *pkv, char *err) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        gpu_set_err(err, "no CUDA device found (use --device cpu)");
        return -1;
    }
    const char *why = unsupported_shape(c);
    if (why) {
        gpu_set_err(err, "the CUDA path cannot run this model (head_dim %u, %u / %u heads, dim %u, hidden %u): %s; use --device cpu",
                c->head_dim, c->n_heads, c->n_kv_heads, c->dim, c->hidden_dim, why);
        return -1;
    }
    if (attn && attn->method != ATTN_FULL && attn->method != ATTN_PARISKV) {
        gpu_set_err(err, "--attn %s runs on the CPU only (add --device cpu); the GPU runs full and pariskv", attn_method_name(attn->method));
        return -1;
    }
    if (attn && attn->prefill_fp8 && ((c->head_dim != 64 && c->head_dim != 128) || !flash_prefill_fp8_supported(0))) {
        int dev = 0, major = 0, minor = 0;
        cudaGetDevice(&dev), cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        if (c->head_dim != 64 && c->head_dim != 128)
            gpu_set_err(err, "--prefill-attn fp8 needs head_dim 64 or 128 (this model: %u); drop it", c->head_dim);
        else
            gpu_set_err(err, "--prefill-attn fp8 needs an sm_90 GPU (H100 / H200) and this build's sm_90a code; this GPU is sm_%d%d: drop it",
                        major, minor);
        return -1;
    }
    *pkv = pkv_runs(attn, ctx);
    if (*pkv && attn->topk > 4096) {
        gpu_set_err(err, "--attn pariskv on the GPU takes --topk up to 4096, not %d", attn->topk);
        return -1;
    }
    if (*pkv && c->head_dim != 64 && c->head_dim != 128) {
        gpu_set_err(err, "--attn pariskv on the GPU needs head_dim 64 or 128 (this model: %u); use --device cpu", c->head_dim);
        return -1;
    }
    return 0;
}

// The row cache's lines (host store only): --pkv-cache-rows, or attn_cache_rows_default halved
// while it would take more than 1/16 of the free memory.
static int row_cache_lines(const Config *c, const AttnConfig *a, size_t free_b) {
    if (a->cache_rows >= 0) return a->cache_rows;
    int n = attn_cache_rows_default(a->topk);
    while (n > 256 && pkv_row_cache_bytes(c->n_layers, c->n_kv_heads, c->head_dim, a->zone_fp8, n) > free_b / 16) n /= 2;
    return n;
}

// The pre-flight check: weights, activations, ParisKV's index and the device cache against the
// GPU's free memory; under ParisKV where the zone goes, and how many positions the device cache
// holds (dcap_want > 0: the caller's choice). 0, or -1 with the numbers in err.
// plan_memory_in: against free_b of total_b bytes (gpu_plan_memory tests it without a GPU).
static int plan_memory_in(const Model *m, const Config *c, int nranks, int ctx, int chunk, int logit_rows, const AttnConfig *attn, int dcap_want,
                          size_t free_b, size_t total_b, GpuMemPlan *mp, char *err) {
    size_t slack = 256u << 20; // cuBLAS workspace and slack
    size_t need_w = gpu_model_weight_bytes(m, nranks), need_a = gpu_activation_bytes(c, ctx, chunk, logit_rows);
    if (nranks > 1 && logit_rows > 1) need_a += (size_t)logit_rows * c->vocab_size * 4; // the logits' gather buffer
    size_t need_p = mp->pkv ? pkv_device_bytes(c, attn, ctx) : 0, per_pos = gpu_kv_bytes(c, 1), need_c = 0;
    int dcap = ctx, host = 0;
    if (mp->pkv) {
        int fits_all = need_w + need_a + need_p + per_pos * (size_t)ctx + slack <= free_b;
        host = attn->store == KV_STORE_HOST || (attn->store == KV_STORE_AUTO && !fits_all) || attn->zone_fp8; // fp8: the host store's format
        if (host) {
            mp->lines = row_cache_lines(c, attn, free_b);
            if (pkv_row_cache_hashed(mp->lines, c->n_heads / c->n_kv_heads) && attn->topk > PKV_RC_HASH_KMAX) { // the claims' hash in shared memory
                gpu_set_err(err, "--pkv-cache-rows %d (above %d, or %d query heads a KV head) needs --topk %d or less, got %d", mp->lines,
                            PKV_RC_DIRECT_MAX, c->n_heads / c->n_kv_heads, PKV_RC_HASH_KMAX, attn->topk);
                return -1;
            }
            need_c = mp->lines ? pkv_row_cache_bytes(c->n_layers, c->n_kv_heads, c->head_dim, attn->zone_fp8, mp->lines) : 0;
            need_p += need_c; // counted with ParisKV's device memory, and named apart in the messages
            int least = pkv_min_positions(attn, chunk);
            // --prefill-attn fp8 keeps e4m3 copies of the device cache's rows (~1/64 of a
            // position's bytes on an 8B model: 1.6 GiB at 771K positions on an H200, more than
            // the margin): counted per position here, so the cache it sizes fits beside them.
            size_t ws0 = 0, ws_pp = 0;
            if (attn->prefill_fp8) {
                const int M = 1 << 20;
                ws0 = flash_prefill_fp8_workspace(chunk, 0, c->n_heads, c->n_kv_heads, c->head_dim);
                ws_pp = (flash_prefill_fp8_workspace(chunk, M, c->n_heads, c->n_kv_heads, c->head_dim) - ws0 + M - 1) / M;
            }
            size_t used = need_w + need_a + need_p + slack + ws0 + (1u << 30);
            size_t rest = free_b > used ? free_b - used : 0;
            long fit = (long)(rest / (per_pos + ws_pp));
            const char *env = getenv("PKV_DEVICE_POSITIONS"); // tests: a small device cache, so the ring wraps
            long want = dcap_want > 0 ? dcap_want : env ? atol(env) : fit;
            if (want < least) want = least;
            dcap = want < ctx ? (int)want : ctx;
            if (dcap > fit && dcap_want <= 0 && !env) dcap = (int)fit; // never above what fits
            if (dcap < least && dcap < ctx) {
                gpu_set_err(err, "GPU memory: weights %.2f GiB + ParisKV index %.2f GiB (row cache %.2f GiB of it) + activations %.2f GiB "
                        "leave room for %ld cached positions, but the host-store mode needs at least %d: lower --ctx%s%s",
                        gib(need_w), gib(need_p), gib(need_c), gib(need_a), fit, least, need_c ? " or --pkv-cache-rows" : "",
                        nranks == 1 ? ", or split the weights and the index over GPUs (--gpus N)" : "");
                return -1;
            }
        }
    }
    size_t need_kv = per_pos * (size_t)dcap;
    if (attn && attn->prefill_fp8) need_a += flash_prefill_fp8_workspace(chunk, dcap, c->n_heads, c->n_kv_heads, c->head_dim);
    size_t need = need_w + need_kv + need_a + need_p + slack;
    if (need > free_b) {
        if (mp->pkv)
            gpu_set_err(err, "GPU memory: weights %.2f GiB + KV cache for %d positions %.2f GiB + ParisKV index %.2f GiB (row cache %.2f GiB "
                         "of it) + activations %.2f GiB = %.2f GiB, but only %.2f GiB of %.2f GiB is free: lower --ctx%s",
                    gib(need_w), dcap, gib(need_kv), gib(need_p), gib(need_c), gib(need_a), gib(need), gib(free_b), gib(total_b),
                    host ? (need_c ? " or --pkv-cache-rows" : "") : " or use --kv-store host");
        else
            gpu_set_err(err, "GPU memory: weights %.2f GiB + KV cache for %d positions %.2f GiB + activations %.2f GiB = %.2f GiB, "
                         "but only %.2f GiB of %.2f GiB is free: lower --ctx%s",
                    gib(need_w), ctx, gib(need_kv), gib(need_a), gib(need), gib(free_b), gib(total_b),
                    attn && attn->method == ATTN_FULL ? "" : " (--attn pariskv keeps the long context in host memory)");
        return -1;
    }
    mp->host = host, mp->dcap = dcap, mp->least = mp->pkv ? pkv_min_positions(attn, chunk) : 0;
    mp->need_w = need_w, mp->need_a = need_a, mp->need_p = need_p, mp->need_kv = need_kv, mp->need_c = need_c, mp->need = need;
    return 0;
}

static int plan_memory(const Model *m, const Config *c, int nranks, int ctx, int chunk, int logit_rows, const AttnConfig *attn, int dcap_want,
                       GpuMemPlan *mp, char *err) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        gpu_set_err(err, "cannot query GPU memory");
        return -1;
    }
    return plan_memory_in(m, c, nranks, ctx, chunk, logit_rows, attn, dcap_want, free_b, total_b, mp, err);
}

// gpu_plan.h: the plan one GPU of nranks would make with free_b of total_b bytes free, for a
// generation (one row of logits) with the GPU path's prefill chunk.
extern "C" int gpu_plan_memory(const Model *m, int nranks, int ctx, const AttnConfig *attn, size_t free_b, size_t total_b, GpuMemPlan *out,
                               char *err) {
    Config local = shard_config(&m->c, nranks);
    *out = GpuMemPlan(); // zeros
    out->pkv = pkv_runs(attn, ctx);
    return plan_memory_in(m, &local, nranks, ctx, GPU_PREFILL_CHUNK, 1, attn, 0, free_b, total_b, out, err);
}

#define ALLOC(p, bytes) \
    if (e == cudaSuccess) e = cudaMalloc((void **)&(p), align256(bytes))

// The KV cache and the activations of chunk tokens (and their pinned host buffers).
static cudaError_t alloc_activations(GpuState *g, size_t need_kv) {
    const Config *c = &g->c;
    size_t hd = c->head_dim, dim = c->dim, q = c->n_heads * hd, kv = c->n_kv_heads * hd, h = c->hidden_dim;
    size_t wide = dim > q ? dim : q;
    wide = wide > h ? wide : h;
    size_t proj = q + 2 * kv > 2 * h ? q + 2 * kv : 2 * h;
    size_t T = g->chunk;
    cudaError_t e = cudaSuccess;
    ALLOC(g->kcache, need_kv / 2);
    ALLOC(g->vcache, need_kv / 2);
    ALLOC(g->x, T * dim * 4);
    ALLOC(g->xb, T * wide * 2);
    ALLOC(g->proj, T * proj * 4);
    ALLOC(g->q, T * q * 2);
    ALLOC(g->att, T * q * 2);
    if (g->prefill_fp8) {
        g->f8_ws_bytes = flash_prefill_fp8_workspace((int)T, g->dcap, c->n_heads, c->n_kv_heads, c->head_dim);
        ALLOC(g->f8_ws, g->f8_ws_bytes);
    }
    ALLOC(g->hb, T * h * 2);
    ALLOC(g->logits, (size_t)g->logit_rows * c->vocab_size * 4);
    if (g->shard.n > 1 && g->logit_rows > 1) ALLOC(g->logits_gather, (size_t)g->logit_rows * c->vocab_size * 4);
    ALLOC(g->partial, attn_decode_scratch_floats(c->n_heads, c->n_kv_heads, hd, g->dcap) * 4);
    ALLOC(g->counters, c->n_kv_heads * sizeof(unsigned));
    if (e == cudaSuccess) e = cudaMemset(g->counters, 0, c->n_kv_heads * sizeof(unsigned));
    ALLOC(g->d_tokens, T * 4);
    ALLOC(g->d_pos, 4);
    ALLOC(g->rope_cs, hd * 4);
    ALLOC(g->sumsq_a, gemv_sumsq_count(dim) * 4);
    ALLOC(g->sumsq_b, gemv_sumsq_count(dim) * 4);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_tokens, T * 4);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_pos, 4);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_logits, (size_t)g->logit_rows * c->vocab_size * 4);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_step, (size_t)c->vocab_size * 4);
    return e;
}

// The zone row cache of `lines` lines per layer and KV head (pariskv_attend.h), empty, its
// counters zeroed, and the attention kernel set up for its table.
static cudaError_t alloc_row_cache(GpuState *g, int lines) {
    const Config *c = &g->c;
    PkvRowCache *rc = &g->pkv.rc;
    size_t heads = (size_t)c->n_layers * c->n_kv_heads, row = host_store_row_bytes(c->head_dim, g->pkv.kv.fp8);
    cudaError_t e = cudaSuccess;
    rc->n = lines, rc->hashed = pkv_row_cache_hashed(lines, c->n_heads / c->n_kv_heads);
    ALLOC(rc->lines, heads * lines * row);
    ALLOC(rc->tags, heads * lines * sizeof(int));
    ALLOC(rc->stats, c->n_layers * 2 * sizeof(unsigned long long));
    if (e == cudaSuccess) e = cudaMemset(rc->stats, 0, c->n_layers * 2 * sizeof(unsigned long long));
    if (e == cudaSuccess) e = pkv_row_cache_invalidate(*rc, c->n_layers, c->n_kv_heads, g->st);
    if (e == cudaSuccess) e = pkv_attend_setup(*rc, c->n_heads, c->n_kv_heads, c->head_dim, g->pkv.sc.kmax);
    return e;
}

// ParisKV's index, scratch and step buffers (the host store is opened before), and the row
// cache's `lines` (0: none).
static cudaError_t alloc_pkv(GpuState *g, const AttnConfig *attn, int host, int lines) {
    const Config *c = &g->c;
    size_t hd = c->head_dim, q = c->n_heads * hd, T = g->chunk;
    Pkv *p = &g->pkv;
    cudaError_t e = cudaSuccess;
    p->on = 1;
    p->cfg = *attn;
    p->cfg.store = host ? KV_STORE_HOST : KV_STORE_GPU;
    if (e == cudaSuccess) e = pkv_gpu_index_alloc(&p->ix, c->n_layers, c->n_kv_heads, hd, g->ctx - attn->sink, g->st);
    if (e == cudaSuccess) e = pkv_gpu_scratch_alloc(&p->sc, &p->ix, attn->topk);
    if (e == cudaSuccess) e = cudaMemset(p->sc.nsel, 0, c->n_kv_heads * sizeof(int)); // read by timing runs without the selection
    ALLOC(p->q, q * 4);
    ALLOC(p->partial, pkv_attend_scratch_floats(c->n_heads, c->n_kv_heads, hd, p->sc.kmax) * 4);
    ALLOC(p->counters, c->n_kv_heads * sizeof(unsigned));
    if (e == cudaSuccess) e = cudaMemset(p->counters, 0, c->n_kv_heads * sizeof(unsigned));
    ALLOC(p->d_meta, 2 * sizeof(int));
    if (e == cudaSuccess) e = cudaMallocHost((void **)&p->h_meta, 2 * sizeof(int));
    ALLOC(p->d_pos_chunk, T * sizeof(int));
    ALLOC(p->rope_chunk, T * hd * sizeof(float));
    if (e == cudaSuccess) e = cudaMallocHost((void **)&p->h_pos_chunk, T * sizeof(int));
    if (recall_file()) { // the measurement only (attention/recall.h)
        size_t L = c->n_layers;
        p->recall = 1;
        ALLOC(p->dbg_q, L * c->n_heads * hd * 4);
        ALLOC(p->dbg_sel, L * c->n_kv_heads * (size_t)p->sc.kmax * 4);
        ALLOC(p->dbg_nsel, L * c->n_kv_heads * 4);
        p->h_dbg_q = (float *)malloc(L * c->n_heads * hd * 4);
        p->h_dbg_sel = (int *)malloc(L * c->n_kv_heads * (size_t)p->sc.kmax * 4);
        p->h_dbg_nsel = (int *)malloc(L * c->n_kv_heads * 4);
        if (!p->h_dbg_q || !p->h_dbg_sel || !p->h_dbg_nsel) e = cudaErrorMemoryAllocation;
    }
    p->kv = (GpuKV){g->kcache, g->vcache, host ? p->hs.base : NULL, (int)c->n_layers, (int)c->n_kv_heads, (int)hd, g->dcap, attn->sink,
                    host ? p->hs.alias_slots : 0, host && attn->zone_fp8};
    if (e == cudaSuccess && host && lines > 0) e = alloc_row_cache(g, lines);
    return e;
}
#undef ALLOC

void *gpu_create_sized(const Model *m, const Shard *sh, int ctx, int chunk, int all_logits, const AttnConfig *attn, int dcap_want, char *err) {
    Shard one = {0, 1, NULL}, s = sh ? *sh : one;
    Config local = shard_config(&m->c, s.n);
    const Config *c = &local;
    GpuMemPlan mp = {};
    if (check_runnable(c, ctx, attn, &mp.pkv, err) != 0) return NULL;
    int logit_rows = all_logits ? chunk : 1;
    if (plan_memory(m, c, s.n, ctx, chunk, logit_rows, attn, dcap_want, &mp, err) != 0) return NULL;
    GpuState *g = (GpuState *)calloc(1, sizeof(GpuState));
    if (!g) {
        gpu_set_err(err, "out of memory");
        return NULL;
    }
    g->c = *c;
    g->shard = s;
    g->vocab_n = (int)(c->vocab_size / s.n), g->vocab0 = s.rank * g->vocab_n;
    g->ctx = ctx;
    g->dcap = mp.dcap;
    g->chunk = chunk;
    g->logit_rows = logit_rows;
    g->prefill_fp8 = attn && attn->prefill_fp8;
    g->weight_bytes = gpu_model_step_bytes(m, s.n);
    if (mp.host && host_store_open(&g->pkv.hs, c->n_layers, c->n_kv_heads, c->head_dim, attn->zone_fp8, ctx - attn->sink, err) != 0) {
        free(g);
        return NULL;
    }
    const char *skip = getenv("PKV_DECODE_SKIP");
    g->skip = skip ? atoi(skip) : 0;
    const char *mutant = getenv("PKV_TP_MUTANT");
    g->tp_mutant = s.n > 1 && mutant && atoi(mutant) == 1;
    cudaError_t e = cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking);
    if (e == cudaSuccess && cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS) e = cudaErrorUnknown;
    if (e == cudaSuccess && cublasSetStream(g->blas, g->st) != CUBLAS_STATUS_SUCCESS) e = cudaErrorUnknown;
    g->layers = (GpuLayer *)calloc(c->n_layers, sizeof(GpuLayer));
    if (!g->layers) e = cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = gpu_upload_weights(g, m);
    if (e == cudaSuccess) e = alloc_activations(g, mp.need_kv);
    if (e == cudaSuccess && mp.pkv) e = alloc_pkv(g, attn, mp.host, mp.lines);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
    if (e != cudaSuccess) {
        gpu_set_err(err, "GPU setup failed: %s", cudaGetErrorString(e));
        gpu_free(g);
        return NULL;
    }
    if (mp.pkv && dcap_want <= 0 && s.rank == 0) {
        char rc[96] = "";
        if (mp.host && mp.lines) snprintf(rc, sizeof rc, ", zone row cache %d rows per layer and KV head (%.2f GiB)", mp.lines, gib(mp.need_c));
        else if (mp.host) snprintf(rc, sizeof rc, ", zone row cache off");
        fprintf(stderr, "pariskv on the GPU%s: retrieval zone in %s (%.2f GiB at %d positions), index %.2f GiB, device KV cache %d positions%s\n",
                s.n > 1 ? "s (each GPU's share of the KV heads)" : "",
                mp.host ? (attn->zone_fp8 ? "pinned host memory, fp8" : "pinned host memory") : "GPU memory",
                gib(mp.host ? host_store_bytes(c->n_layers, c->n_kv_heads, c->head_dim, attn->zone_fp8, ctx - attn->sink)
                            : gpu_kv_bytes(c, 1) * (size_t)(ctx - attn->sink)), ctx, gib(mp.need_p - mp.need_c), mp.dcap, rc);
    }
    return g;
}

void *one_create(const Model *m, const Shard *sh, int ctx, int chunk, int all_logits, const AttnConfig *attn, char *err) {
    return gpu_create_sized(m, sh, ctx, chunk, all_logits, attn, 0, err);
}

void one_set_prefill_len(void *dev, int prefill_len) {
    GpuState *g = (GpuState *)dev;
    g->pkv.cfg.prefill_len = prefill_len;
}

void one_destroy(void *dev) { gpu_free((GpuState *)dev); }

void gpu_drop_graphs(GpuState *g) {
    for (int k = 0; k < 2; k++) {
        if (g->graph_ready[k]) cudaGraphExecDestroy(g->decode_graph[k]), g->graph_ready[k] = 0;
        if (g->pkv.graph_ready[k]) cudaGraphExecDestroy(g->pkv.graph[k]), g->pkv.graph_ready[k] = 0;
    }
}

