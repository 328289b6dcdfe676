// The CUDA backend: the forward pass of model/model.c on the GPU. bf16 weights and KV cache,
// fp32 residual stream and accumulation. Decode (one token) uses the bandwidth-bound GEMV and
// flash-decoding kernels and is captured once as a CUDA graph; prefill uses cuBLAS GEMMs and
// the tiled causal attention kernel.
#include <cublas_v2.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.h"
#include "forward_cuda.h"
#include "kernels.h"
#include "flash_prefill.h"

extern "C" {
#include "../model/bf16.h"
}

#define ERR_LEN 512

static void set_err(char *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, ERR_LEN, fmt, ap);
    va_end(ap);
}

typedef struct {
    bf16 *wqkv;         // (q_dim + 2 kv_dim, dim): rows of wq, wk, wv; columns times attn_norm
    bf16 *wo;           // (dim, q_dim)
    bf16 *wgu;          // (2 hidden, dim): gate and up rows interleaved (2i gate, 2i+1 up); columns times ffn_norm
    bf16 *wdown;        // (dim, hidden)
    float *attn_norm;   // (dim), folded into wqkv's columns after upload
    float *ffn_norm;    // (dim), folded into wgu's columns after upload
    float *q_norm;      // (hd) or NULL
    float *k_norm;      // (hd) or NULL
} GpuLayer;

struct GpuState {
    Config c;
    int ctx, chunk, logit_rows;
    cudaStream_t st;
    cublasHandle_t blas;
    // weights
    bf16 *embd;         // (vocab, dim)
    bf16 *head;         // (vocab, dim); == embd when tied
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
    float *proj;        // (chunk, max(q_dim + 2 kv_dim, 2 hidden)) matmul output
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
    cudaGraphExec_t decode_graph;
    int graph_ready;
};

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

static void gpu_free(GpuState *g) {
    if (!g) return;
    if (g->graph_ready) cudaGraphExecDestroy(g->decode_graph);
    if (g->layers) {
        for (uint32_t l = 0; l < g->c.n_layers; l++) {
            GpuLayer *w = &g->layers[l];
            cudaFree(w->wqkv), cudaFree(w->wo), cudaFree(w->wgu), cudaFree(w->wdown);
            cudaFree(w->attn_norm), cudaFree(w->ffn_norm), cudaFree(w->q_norm), cudaFree(w->k_norm);
        }
        free(g->layers);
    }
    if (g->head != g->embd) cudaFree(g->head);
    cudaFree(g->embd), cudaFree(g->out_norm), cudaFree(g->inv_freq), cudaFree(g->rope_cs);
    cudaFree(g->kcache), cudaFree(g->vcache);
    cudaFree(g->x), cudaFree(g->xb), cudaFree(g->proj), cudaFree(g->q), cudaFree(g->att), cudaFree(g->hb);
    cudaFree(g->logits);
    cudaFree(g->partial), cudaFree(g->counters), cudaFree(g->sumsq_a), cudaFree(g->sumsq_b), cudaFree(g->d_tokens), cudaFree(g->d_pos);
    cudaFreeHost(g->h_tokens), cudaFreeHost(g->h_pos), cudaFreeHost(g->h_logits);
    if (g->blas) cublasDestroy(g->blas);
    if (g->st) cudaStreamDestroy(g->st);
    free(g);
}

// ---- sizes ----

size_t gpu_weight_bytes(const Config *c) {
    size_t hd = c->head_dim, dim = c->dim, q = c->n_heads * hd, kv = c->n_kv_heads * hd, h = c->hidden_dim;
    size_t layer = ((q + 2 * kv) * dim + dim * q + 3 * h * dim) * 2 + (2 * dim + 2 * hd) * 4;
    return c->n_layers * layer + (size_t)c->vocab_size * dim * 2 * (c->tied_embeddings ? 1 : 2) + dim * 4;
}

size_t gpu_kv_bytes(const Config *c, int ctx) {
    return 2 * (size_t)c->n_layers * c->n_kv_heads * (size_t)ctx * c->head_dim * sizeof(bf16);
}

static size_t activation_bytes(const Config *c, int ctx, int chunk, int logit_rows) {
    size_t hd = c->head_dim, dim = c->dim, q = c->n_heads * hd, kv = c->n_kv_heads * hd, h = c->hidden_dim;
    size_t wide = dim > q ? dim : q;
    wide = wide > h ? wide : h;
    size_t proj = q + 2 * kv > 2 * h ? q + 2 * kv : 2 * h;
    size_t T = chunk;
    return T * (dim * 4 + wide * 2 + proj * 4 + 2 * q * 2 + h * 2 + 4) + (size_t)logit_rows * c->vocab_size * 4 +
           attn_decode_scratch_floats(c->n_heads, c->n_kv_heads, hd, ctx) * 4 + (1 << 20);
}

// ---- weight upload ----

// Copies a host matrix (rows, cols) in dtype to device bf16 at dst, with the given row pitch
// (in elements) so rows can be interleaved. staging: host buffer of rows*cols bf16.
static cudaError_t upload_matrix(bf16 *dst, size_t dst_pitch, const void *src, uint32_t dtype, size_t rows, size_t cols,
                                 uint16_t *staging) {
    const void *from = src;
    if (dtype == DTYPE_F32) {
        const float *f = (const float *)src;
        for (size_t i = 0; i < rows * cols; i++) staging[i] = f32_to_bf16(f[i]);
        from = staging;
    }
    return cudaMemcpy2D(dst, dst_pitch * 2, from, cols * 2, cols * 2, rows, cudaMemcpyHostToDevice);
}

static cudaError_t upload_f32(float **dst, const float *src, size_t n) {
    CU_TRY(cudaMalloc(dst, n * 4));
    return cudaMemcpy(*dst, src, n * 4, cudaMemcpyHostToDevice);
}

static cudaError_t alloc_weights(GpuState *g, const Model *m) {
    const Config *c = &g->c;
    size_t hd = c->head_dim, dim = c->dim, q = c->n_heads * hd, kv = c->n_kv_heads * hd, h = c->hidden_dim;
    size_t vocab = c->vocab_size;
    int synthetic = m->token_embd == NULL;
    uint16_t *staging = NULL;
    if (!synthetic && c->weight_dtype == DTYPE_F32) {
        size_t biggest = vocab * dim > 2 * h * dim ? vocab * dim : 2 * h * dim;
        staging = (uint16_t *)malloc(biggest * 2);
        if (!staging) return cudaErrorMemoryAllocation;
    }
    cudaError_t e = cudaSuccess;
    unsigned long long seed = 1234;
#define TRY(call)                       \
    do {                                \
        e = (call);                     \
        if (e != cudaSuccess) goto out; \
    } while (0)
    TRY(cudaMalloc(&g->embd, vocab * dim * 2));
    if (synthetic) TRY(fill_random_bf16(g->embd, vocab * dim, seed++, 1.0f, 0.0f, g->st));
    else TRY(upload_matrix(g->embd, dim, m->token_embd, c->weight_dtype, vocab, dim, staging));
    if (c->tied_embeddings) {
        g->head = g->embd;
    } else {
        TRY(cudaMalloc(&g->head, vocab * dim * 2));
        if (synthetic) TRY(fill_random_bf16(g->head, vocab * dim, seed++, sqrtf(3.0f / dim), 0.0f, g->st));
        else TRY(upload_matrix(g->head, dim, m->output, c->weight_dtype, vocab, dim, staging));
    }
    TRY(cudaMalloc(&g->out_norm, dim * 4));
    if (synthetic) TRY(fill_random_f32(g->out_norm, dim, seed++, 0.1f, 1.0f, g->st));
    else TRY(cudaMemcpy(g->out_norm, m->output_norm, dim * 4, cudaMemcpyHostToDevice));
    TRY(upload_f32(&g->inv_freq, m->inv_freq, hd / 2));
    for (uint32_t l = 0; l < c->n_layers; l++) {
        GpuLayer *w = &g->layers[l];
        const LayerWeights *lw = synthetic ? NULL : &m->layers[l];
        TRY(cudaMalloc(&w->wqkv, (q + 2 * kv) * dim * 2));
        TRY(cudaMalloc(&w->wo, dim * q * 2));
        TRY(cudaMalloc(&w->wgu, 2 * h * dim * 2));
        TRY(cudaMalloc(&w->wdown, dim * h * 2));
        TRY(cudaMalloc(&w->attn_norm, dim * 4));
        TRY(cudaMalloc(&w->ffn_norm, dim * 4));
        if (c->qk_norm) {
            TRY(cudaMalloc(&w->q_norm, hd * 4));
            TRY(cudaMalloc(&w->k_norm, hd * 4));
        }
        if (synthetic) { // uniform with variance 1/n keeps activations at unit scale
            float a = sqrtf(3.0f / dim), ah = sqrtf(3.0f / h), aq = sqrtf(3.0f / q);
            TRY(fill_random_bf16(w->wqkv, (q + 2 * kv) * dim, seed++, a, 0.0f, g->st));
            TRY(fill_random_bf16(w->wo, dim * q, seed++, aq, 0.0f, g->st));
            TRY(fill_random_bf16(w->wgu, 2 * h * dim, seed++, a, 0.0f, g->st));
            TRY(fill_random_bf16(w->wdown, dim * h, seed++, ah, 0.0f, g->st));
            TRY(fill_random_f32(w->attn_norm, dim, seed++, 0.1f, 1.0f, g->st));
            TRY(fill_random_f32(w->ffn_norm, dim, seed++, 0.1f, 1.0f, g->st));
            if (c->qk_norm) {
                TRY(fill_random_f32(w->q_norm, hd, seed++, 0.1f, 1.0f, g->st));
                TRY(fill_random_f32(w->k_norm, hd, seed++, 0.1f, 1.0f, g->st));
            }
        } else {
            uint32_t dt = c->weight_dtype;
            TRY(upload_matrix(w->wqkv, dim, lw->wq, dt, q, dim, staging));
            TRY(upload_matrix(w->wqkv + q * dim, dim, lw->wk, dt, kv, dim, staging));
            TRY(upload_matrix(w->wqkv + (q + kv) * dim, dim, lw->wv, dt, kv, dim, staging));
            TRY(upload_matrix(w->wo, q, lw->wo, dt, dim, q, staging));
            TRY(upload_matrix(w->wgu, 2 * dim, lw->w_gate, dt, h, dim, staging));
            TRY(upload_matrix(w->wgu + dim, 2 * dim, lw->w_up, dt, h, dim, staging));
            TRY(upload_matrix(w->wdown, h, lw->w_down, dt, dim, h, staging));
            TRY(cudaMemcpy(w->attn_norm, lw->attn_norm, dim * 4, cudaMemcpyHostToDevice));
            TRY(cudaMemcpy(w->ffn_norm, lw->ffn_norm, dim * 4, cudaMemcpyHostToDevice));
            if (c->qk_norm) {
                TRY(cudaMemcpy(w->q_norm, lw->q_norm, hd * 4, cudaMemcpyHostToDevice));
                TRY(cudaMemcpy(w->k_norm, lw->k_norm, hd * 4, cudaMemcpyHostToDevice));
            }
        }
        // The RMSNorms' weights go into the columns of the matrices after them, so the norm
        // itself is a scale of the GEMV's result (decode) or of its input (prefill).
        TRY(scale_columns(w->wqkv, q + 2 * kv, dim, w->attn_norm, g->st));
        TRY(scale_columns(w->wgu, 2 * h, dim, w->ffn_norm, g->st));
    }
#undef TRY
out:
    free(staging);
    return e;
}

// ---- create / destroy ----

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

extern "C" void *gpu_create(const Model *m, int ctx, int chunk, int all_logits, char *err) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        set_err(err, "no CUDA device found (use --device cpu)");
        return NULL;
    }
    const Config *c = &m->c;
    const char *why = unsupported_shape(c);
    if (why) {
        set_err(err, "the CUDA path cannot run this model (head_dim %u, %u / %u heads, dim %u, hidden %u): %s; use --device cpu",
                c->head_dim, c->n_heads, c->n_kv_heads, c->dim, c->hidden_dim, why);
        return NULL;
    }
    int logit_rows = all_logits ? chunk : 1;
    size_t need_w = gpu_weight_bytes(c), need_kv = gpu_kv_bytes(c, ctx), need_a = activation_bytes(c, ctx, chunk, logit_rows);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        set_err(err, "cannot query GPU memory");
        return NULL;
    }
    size_t need = need_w + need_kv + need_a + (256u << 20); // cuBLAS workspace and slack
    if (need > free_b) {
        set_err(err, "GPU memory: weights %.2f GiB + KV cache for %d positions %.2f GiB + activations %.2f GiB = %.2f GiB, "
                     "but only %.2f GiB of %.2f GiB is free: lower --ctx",
                (double)need_w / (1 << 30), ctx, (double)need_kv / (1 << 30), (double)need_a / (1 << 30),
                (double)need / (1 << 30), (double)free_b / (1 << 30), (double)total_b / (1 << 30));
        return NULL;
    }
    GpuState *g = (GpuState *)calloc(1, sizeof(GpuState));
    if (!g) {
        set_err(err, "out of memory");
        return NULL;
    }
    g->c = *c;
    g->ctx = ctx;
    g->chunk = chunk;
    g->logit_rows = logit_rows;
    g->weight_bytes = need_w;
    const char *skip = getenv("PKV_DECODE_SKIP");
    g->skip = skip ? atoi(skip) : 0;
    size_t hd = c->head_dim, dim = c->dim, q = c->n_heads * hd, kv = c->n_kv_heads * hd, h = c->hidden_dim;
    size_t wide = dim > q ? dim : q;
    wide = wide > h ? wide : h;
    size_t proj = q + 2 * kv > 2 * h ? q + 2 * kv : 2 * h;
    size_t T = chunk;
    cudaError_t e = cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking);
    if (e == cudaSuccess && cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS) e = cudaErrorUnknown;
    if (e == cudaSuccess && cublasSetStream(g->blas, g->st) != CUBLAS_STATUS_SUCCESS) e = cudaErrorUnknown;
    g->layers = (GpuLayer *)calloc(c->n_layers, sizeof(GpuLayer));
    if (!g->layers) e = cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = alloc_weights(g, m);
#define ALLOC(p, bytes) \
    if (e == cudaSuccess) e = cudaMalloc((void **)&(p), align256(bytes))
    ALLOC(g->kcache, need_kv / 2);
    ALLOC(g->vcache, need_kv / 2);
    ALLOC(g->x, T * dim * 4);
    ALLOC(g->xb, T * wide * 2);
    ALLOC(g->proj, T * proj * 4);
    ALLOC(g->q, T * q * 2);
    ALLOC(g->att, T * q * 2);
    ALLOC(g->hb, T * h * 2);
    ALLOC(g->logits, (size_t)logit_rows * c->vocab_size * 4);
    ALLOC(g->partial, attn_decode_scratch_floats(c->n_heads, c->n_kv_heads, hd, ctx) * 4);
    ALLOC(g->counters, c->n_kv_heads * sizeof(unsigned));
    if (e == cudaSuccess) e = cudaMemset(g->counters, 0, c->n_kv_heads * sizeof(unsigned));
    ALLOC(g->d_tokens, T * 4);
    ALLOC(g->d_pos, 4);
    ALLOC(g->rope_cs, hd * 4);
    ALLOC(g->sumsq_a, gemv_sumsq_count(dim) * 4);
    ALLOC(g->sumsq_b, gemv_sumsq_count(dim) * 4);
#undef ALLOC
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_tokens, T * 4);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_pos, 4);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_logits, (size_t)logit_rows * c->vocab_size * 4);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
    if (e != cudaSuccess) {
        set_err(err, "GPU setup failed: %s", cudaGetErrorString(e));
        gpu_free(g);
        return NULL;
    }
    return g;
}

extern "C" void gpu_destroy(void *dev) { gpu_free((GpuState *)dev); }

// ---- the forward pass ----

// y (T, d) fp32 (= or +=) x (T, n) bf16 · W^T; W (d, n) bf16.
static cudaError_t gemm(GpuState *g, float *y, const bf16 *x, const bf16 *W, int T, int n, int d, int accumulate) {
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t s = cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, d, T, n, &alpha, W, CUDA_R_16BF, n, x, CUDA_R_16BF,
                                    n, &beta, y, CUDA_R_32F, d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

// One decode step (T = 1): five kernels a layer. Each RMSNorm is split between the residual
// GEMV before it (which also writes bf16(x) and per-block sums of squares) and the GEMV after it
// (which divides by the rms; the norm weights are folded into its columns at load time), and
// the QKV post-processing rides on the attention kernel. PKV_DECODE_SKIP=1 leaves the
// attention out (timing breakdowns only).
static cudaError_t enqueue_decode(GpuState *g) {
    const Config *c = &g->c;
    int hd = c->head_dim, dim = c->dim, hidden = c->hidden_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    int q_dim = nh * hd, kv_dim = nkv * hd, n_sums = gemv_sumsq_count(dim), n_a = 1;
    size_t layer_kv = (size_t)nkv * g->ctx * hd;
    cudaStream_t st = g->st;
    float eps = c->norm_eps;
    CU_TRY(embed_stats(g->x, g->xb, g->sumsq_a, g->embd, g->d_tokens, dim, st));
    CU_TRY(rope_table(g->rope_cs, g->inv_freq, g->d_pos, hd / 2, st));
    for (uint32_t l = 0; l < c->n_layers; l++) {
        GpuLayer *w = &g->layers[l];
        bf16 *kc = g->kcache + l * layer_kv, *vc = g->vcache + l * layer_kv;
        CU_TRY(gemv_bf16_normed(g->proj, w->wqkv, g->xb, dim, q_dim + 2 * kv_dim, GEMV_STORE, g->sumsq_a, n_a, eps, st));
        if (!(g->skip & 1))
            CU_TRY(attn_decode(g->att, g->proj, w->q_norm, w->k_norm, g->rope_cs, kc, vc, g->d_pos, nh, nkv, hd, g->ctx,
                               eps, g->partial, g->counters, st));
        CU_TRY(gemv_bf16_add_stats(g->x, w->wo, g->att, q_dim, dim, g->xb, g->sumsq_b, st));
        CU_TRY(gemv_bf16_normed(g->hb, w->wgu, g->xb, dim, 2 * hidden, GEMV_SWIGLU, g->sumsq_b, n_sums, eps, st));
        CU_TRY(gemv_bf16_add_stats(g->x, w->wdown, g->hb, hidden, dim, g->xb, g->sumsq_a, st));
        n_a = n_sums;
    }
    CU_TRY(rmsnorm_bf16(g->xb, g->x, g->out_norm, 1, dim, eps, st));
    CU_TRY(gemv_bf16(g->logits, g->head, g->xb, dim, c->vocab_size, GEMV_STORE, st));
    return cudaMemcpyAsync(g->h_logits, g->logits, (size_t)c->vocab_size * 4, cudaMemcpyDeviceToHost, st);
}

// Enqueues one forward pass for T tokens (already in d_tokens, position in d_pos / pos): a
// prefill chunk (cuBLAS GEMMs, tiled causal attention).
static cudaError_t enqueue_forward(GpuState *g, int T, int pos, int all_logits) {
    const Config *c = &g->c;
    int hd = c->head_dim, dim = c->dim, hidden = c->hidden_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    int q_dim = nh * hd, kv_dim = nkv * hd;
    size_t layer_kv = (size_t)nkv * g->ctx * hd;
    cudaStream_t st = g->st;
    CU_TRY(embed_rows(g->x, g->embd, g->d_tokens, T, dim, st));
    for (uint32_t l = 0; l < c->n_layers; l++) {
        GpuLayer *w = &g->layers[l];
        bf16 *kc = g->kcache + l * layer_kv, *vc = g->vcache + l * layer_kv;
        CU_TRY(rmsnorm_bf16(g->xb, g->x, NULL, T, dim, c->norm_eps, st)); // weights folded into wqkv
        CU_TRY(gemm(g, g->proj, g->xb, w->wqkv, T, dim, q_dim + 2 * kv_dim, 0));
        CU_TRY(qkv_rope_store(g->q, kc, vc, g->proj, w->q_norm, w->k_norm, g->inv_freq, g->d_pos, T, nh, nkv, hd, g->ctx,
                              c->norm_eps, st));
        if (hd == 64 || hd == 128) CU_TRY(flash_prefill(g->att, g->q, kc, vc, pos, T, nh, nkv, hd, g->ctx, st));
        else CU_TRY(attn_prefill_simple(g->att, g->q, kc, vc, pos, T, nh, nkv, hd, g->ctx, st)); // other head sizes
        CU_TRY(gemm(g, g->x, g->att, w->wo, T, q_dim, dim, 1));
        CU_TRY(rmsnorm_bf16(g->xb, g->x, NULL, T, dim, c->norm_eps, st)); // weights folded into wgu
        CU_TRY(gemm(g, g->proj, g->xb, w->wgu, T, dim, 2 * hidden, 0));
        CU_TRY(swiglu_pairs(g->hb, g->proj, T, hidden, st));
        CU_TRY(gemm(g, g->x, g->hb, w->wdown, T, hidden, dim, 1));
    }
    int first = all_logits ? 0 : T - 1, n = T - first;
    CU_TRY(rmsnorm_bf16(g->xb, g->x + (size_t)first * dim, g->out_norm, n, dim, c->norm_eps, st));
    if (n == 1) CU_TRY(gemv_bf16(g->logits, g->head, g->xb, dim, c->vocab_size, GEMV_STORE, st));
    else CU_TRY(gemm(g, g->logits, g->xb, g->head, n, dim, c->vocab_size, 0));
    return cudaMemcpyAsync(g->h_logits, g->logits, (size_t)n * c->vocab_size * 4, cudaMemcpyDeviceToHost, st);
}

// The decode step as a graph: it reads the token and position from pinned host memory when
// replayed, so one capture serves every step.
static cudaError_t decode_step(GpuState *g) {
    if (!g->graph_ready) {
        cudaGraph_t graph;
        CU_TRY(cudaStreamBeginCapture(g->st, cudaStreamCaptureModeThreadLocal));
        cudaError_t e = cudaMemcpyAsync(g->d_tokens, g->h_tokens, 4, cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(g->d_pos, g->h_pos, 4, cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess) e = enqueue_decode(g);
        cudaError_t e2 = cudaStreamEndCapture(g->st, &graph);
        CU_TRY(e);
        CU_TRY(e2);
        e = cudaGraphInstantiate(&g->decode_graph, graph, 0);
        cudaGraphDestroy(graph);
        CU_TRY(e);
        g->graph_ready = 1;
    }
    return cudaGraphLaunch(g->decode_graph, g->st);
}

extern "C" float *gpu_forward(void *dev, const int *tokens, int T, int pos, int all_logits, char *err) {
    GpuState *g = (GpuState *)dev;
    memcpy(g->h_tokens, tokens, (size_t)T * sizeof(int));
    *g->h_pos = pos;
    cudaError_t e;
    if (T == 1) {
        e = decode_step(g);
    } else {
        e = cudaMemcpyAsync(g->d_tokens, g->h_tokens, (size_t)T * 4, cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(g->d_pos, g->h_pos, 4, cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess) e = enqueue_forward(g, T, pos, all_logits);
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
    if (e != cudaSuccess) {
        set_err(err, "GPU forward pass failed: %s", cudaGetErrorString(e));
        return NULL;
    }
    return g->h_logits;
}

// ---- for the benchmark ----

extern "C" cudaError_t gpu_fill_kv_random(void *dev, int n_tokens) {
    GpuState *g = (GpuState *)dev;
    const Config *c = &g->c;
    size_t per_head = (size_t)n_tokens * c->head_dim, stride = (size_t)g->ctx * c->head_dim;
    for (uint32_t l = 0; l < c->n_layers; l++)
        for (uint32_t h = 0; h < c->n_kv_heads; h++) {
            size_t off = ((size_t)l * c->n_kv_heads + h) * stride;
            CU_TRY(fill_random_bf16(g->kcache + off, per_head, 7000 + l * 64 + h, 1.0f, 0.0f, g->st));
            CU_TRY(fill_random_bf16(g->vcache + off, per_head, 9000 + l * 64 + h, 1.0f, 0.0f, g->st));
        }
    return cudaStreamSynchronize(g->st);
}

// Times n decode steps at position pos (graph replays, CUDA events); per-step ms into ms_out.
extern "C" cudaError_t gpu_time_decode(void *dev, int pos, int warmup, int n, float *ms_out) {
    GpuState *g = (GpuState *)dev;
    cudaEvent_t a, b;
    CU_TRY(cudaEventCreate(&a));
    CU_TRY(cudaEventCreate(&b));
    *g->h_tokens = 1;
    *g->h_pos = pos;
    for (int i = 0; i < warmup + n; i++) {
        CU_TRY(cudaEventRecord(a, g->st));
        CU_TRY(decode_step(g));
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

extern "C" size_t gpu_state_weight_bytes(void *dev) { return ((GpuState *)dev)->weight_bytes; }

static int gpu_available(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static const Backend backend_cuda = {
    "cuda", NULL, NULL, NULL, NULL, NULL, NULL, gpu_available, gpu_create, gpu_forward, gpu_destroy, gpu_bench, 4096,
};

extern "C" const Backend *backend_cuda_get(void) { return &backend_cuda; }
