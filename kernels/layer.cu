// The layer sequence of the GPU pass, written once: RMSNorm, QKV projection | attention |
// output projection + residual, RMSNorm, gate/up projection, SwiGLU, down projection + residual.
// Every pass runs it -- the decode graph, the chunked prefill, the layered prefill and ParisKV
// chunks -- and supplies only the attention between the two halves (gpu_layers), so a change
// to the sequence (a new kernel, a tensor-parallel split) is made here, once.
#include "gpu_state.h"
#include "kernels.h"
#include "flash_prefill.h"

// y (d x T, column-major: T rows of d) of type yt = W x: cuBLAS's default algorithm for the shape,
// fp32 accumulation; beta 1 adds to y (fp32 outputs only).
static cudaError_t gemm_to(GpuState *g, void *y, cudaDataType yt, const bf16 *x, const bf16 *W, int T, int n, int d, int accumulate) {
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t s = cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, d, T, n, &alpha, W, CUDA_R_16BF, n, x, CUDA_R_16BF,
                                    n, &beta, y, yt, d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

cudaError_t gpu_gemm(GpuState *g, float *y, const bf16 *x, const bf16 *W, int T, int n, int d, int accumulate) {
    return gemm_to(g, y, CUDA_R_32F, x, W, T, n, d, accumulate);
}

// A layer's matrix that may be quantized: dequantized for the tensor cores first (a GEMM over T
// tokens reuses each weight T times).
static cudaError_t gemm_w_to(GpuState *g, void *y, cudaDataType yt, const bf16 *x, const bf16 *W, const QMat *q, const float *norm, int T,
                             int n, int d, int accumulate) {
    if (q->dt) {
        CU_TRY(qmat_to_bf16(g->wdeq, q, norm, g->st));
        W = g->wdeq;
    }
    return gemm_to(g, y, yt, x, W, T, n, d, accumulate);
}

cudaError_t gpu_gemm_w(GpuState *g, float *y, const bf16 *x, const bf16 *W, const QMat *q, const float *norm, int T, int n, int d,
                       int accumulate) {
    return gemm_w_to(g, y, CUDA_R_32F, x, W, q, norm, T, n, d, accumulate);
}

cudaError_t gpu_head_gemv(GpuState *g) { // this GPU's vocabulary rows, then every rank's gathered
    const Config *c = &g->c;
    float *mine = g->logits + g->vocab0;
    if (g->qhead.dt) CU_TRY(gemv_q(mine, &g->qhead, g->xb, GEMV_STORE, g->st));
    else CU_TRY(gemv_bf16(mine, g->head, g->xb, c->dim, g->vocab_n, GEMV_STORE, g->st));
    return tp_all_gather(g, g->logits, (size_t)g->vocab_n);
}

// Tensor parallel: each rank's product of its heads (W_o) or hidden units (W_down) is a partial sum
// of the residual's update. Rank 0 adds its part to the residual, the others write theirs in its
// place, and the all-reduce sums them: x + sum of the parts on every rank.
static int adds_residual(const GpuState *g) { return g->shard.rank == 0; }

// PKV_TP_MUTANT=1 (gpu_checks.sh tp: the checks must catch it): the last layer's W_down parts are
// not summed, so rank 0 goes on with its own part only.
static int tp_mutant(const GpuState *g, uint32_t l) { return g->tp_mutant && l == g->c.n_layers - 1; }

// Decode (one row): each RMSNorm is split between the residual GEMV before it (which also
// writes bf16(x) and per-block sums of squares) and the GEMV after it (which divides by the
// rms; bf16 weights carry the norm's weights in their columns, a quantized group applies them
// itself). The embedding step wrote one sum, every residual GEMV gemv_sumsq_count(dim).
static cudaError_t dec_normed(GpuState *g, void *y, const bf16 *W, const QMat *q, const float *norm, int n, int d, int epi,
                              const float *sumsq, int n_sumsq) {
    float eps = g->c.norm_eps;
    if (q->dt) return gemv_q_normed(y, q, g->xb, epi, norm, sumsq, n_sumsq, eps, g->st);
    return gemv_bf16_normed(y, W, g->xb, n, d, epi, sumsq, n_sumsq, eps, g->st);
}

// With the sums fused into the GEMVs (tp.fused: bf16 weights, peer access), call is the sum's
// place in the step; else the GEMV, then the all-reduce kernel with the stats.
static cudaError_t dec_add_stats(GpuState *g, const bf16 *W, const QMat *q, const bf16 *x, int n, int d, float *sumsq, unsigned call,
                                 int skip_sum = 0) {
    if (g->tp.fused) return gemv_bf16_add_stats_tp(g->x, W, x, n, d, g->xb, sumsq, tp_sum_link(g, call, skip_sum), g->st);
    if (g->shard.n > 1) { // the parts summed over the ranks, then the stats of the sum
        int epi = adds_residual(g) ? GEMV_ADD : GEMV_STORE;
        if (q->dt) CU_TRY(gemv_q(g->x, q, x, epi, g->st));
        else CU_TRY(gemv_bf16(g->x, W, x, n, d, epi, g->st));
        if (!skip_sum) return tp_all_reduce_stats(g, g->x, (size_t)d, g->xb, sumsq);
        return residual_stats(g->x, g->xb, sumsq, d, g->st);
    }
    if (q->dt) return gemv_q_add_stats(g->x, q, x, g->xb, sumsq, g->st);
    return gemv_bf16_add_stats(g->x, W, x, n, d, g->xb, sumsq, g->st);
}

// The sums of squares a residual update left for the normed GEMV after it: the GEMV's per-block
// sums, or one (residual_stats after an all-reduce; embed_stats before layer 0).
static int residual_sums(const GpuState *g) { return g->shard.n > 1 && !g->tp.fused ? 1 : gemv_sumsq_count(g->c.dim); }

cudaError_t layer_qkv(GpuState *g, uint32_t l, float *x, int T, LayerMode mode) {
    const Config *c = &g->c;
    const GpuLayer *w = &g->layers[l];
    int dim = c->dim, qkv_dim = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    if (mode == LAYER_DECODE) {
        int n_a = l == 0 ? 1 : residual_sums(g);
        return dec_normed(g, g->proj, w->wqkv, &w->qqkv, w->attn_norm, dim, qkv_dim, GEMV_STORE, g->sumsq_a, n_a);
    }
    CU_TRY(rmsnorm_bf16(g->xb, x, NULL, T, dim, c->norm_eps, g->st)); // weights folded into wqkv
    return gpu_gemm_w(g, g->proj, g->xb, w->wqkv, &w->qqkv, w->attn_norm, T, dim, qkv_dim, 0);
}

cudaError_t layer_out_mlp(GpuState *g, uint32_t l, float *x, int T, LayerMode mode) {
    const Config *c = &g->c;
    const GpuLayer *w = &g->layers[l];
    int dim = c->dim, hidden = c->hidden_dim, q_dim = c->n_heads * c->head_dim;
    if (mode == LAYER_DECODE) { // x is g->x: the decode GEMVs' residual
        CU_TRY(dec_add_stats(g, w->wo, &w->qo, g->att, q_dim, dim, g->sumsq_b, 2 * l));
        CU_TRY(dec_normed(g, g->hb, w->wgu, &w->qgu, w->ffn_norm, dim, 2 * hidden, GEMV_SWIGLU, g->sumsq_b, residual_sums(g)));
        return dec_add_stats(g, w->wdown, &w->qdown, g->hb, hidden, dim, g->sumsq_a, 2 * l + 1, tp_mutant(g, l));
    }
    CU_TRY(gpu_gemm_w(g, x, g->att, w->wo, &w->qo, NULL, T, q_dim, dim, adds_residual(g)));
    CU_TRY(tp_all_reduce(g, x, (size_t)T * dim));
    CU_TRY(rmsnorm_bf16(g->xb, x, NULL, T, dim, c->norm_eps, g->st)); // weights folded into wgu
    // The gate and up values in bf16 (as a bf16 Linear layer gives them): the GEMM writes, and SwiGLU
    // reads, half the bytes of fp32 (2 x 201 MB a 4,096-token chunk of Qwen3-8B). Their mean NLL
    // against fp32 values: tests/bench/GPU.md, session 23.
    bf16 *gu = (bf16 *)g->proj;
    CU_TRY(gemm_w_to(g, gu, CUDA_R_16BF, g->xb, w->wgu, &w->qgu, w->ffn_norm, T, dim, 2 * hidden, 0));
    CU_TRY(swiglu_pairs(g->hb, gu, T, hidden, g->st));
    CU_TRY(gpu_gemm_w(g, x, g->hb, w->wdown, &w->qdown, NULL, T, hidden, dim, adds_residual(g)));
    return tp_mutant(g, l) ? cudaSuccess : tp_all_reduce(g, x, (size_t)T * dim);
}

cudaError_t gpu_layers(GpuState *g, float *x, int T, LayerMode mode, AttnStep attn, void *arg) {
    for (uint32_t l = 0; l < g->c.n_layers; l++) {
        CU_TRY(layer_qkv(g, l, x, T, mode));
        CU_TRY(attn(g, l, arg));
        CU_TRY(layer_out_mlp(g, l, x, T, mode));
    }
    return cudaSuccess;
}

cudaError_t gpu_logits(GpuState *g, const float *x, int n) {
    const Config *c = &g->c;
    CU_TRY(rmsnorm_bf16(g->xb, x, g->out_norm, n, c->dim, c->norm_eps, g->st));
    if (n == 1) return gpu_head_gemv(g);
    if (g->shard.n == 1) return gpu_gemm(g, g->logits, g->xb, g->head, n, c->dim, c->vocab_size, 0);
    // Rank r's (n, vocab_n) block at r n vocab_n of the gather buffer, gathered, then each block's
    // rows into their columns of the (n, vocab) logits.
    size_t blk = (size_t)n * g->vocab_n;
    CU_TRY(gpu_gemm(g, g->logits_gather + g->shard.rank * blk, g->xb, g->head, n, c->dim, g->vocab_n, 0));
    CU_TRY(tp_all_gather(g, g->logits_gather, blk));
    for (int r = 0; r < g->shard.n; r++)
        CU_TRY(cudaMemcpy2DAsync(g->logits + (size_t)r * g->vocab_n, (size_t)c->vocab_size * 4, g->logits_gather + r * blk,
                                 (size_t)g->vocab_n * 4, (size_t)g->vocab_n * 4, n, cudaMemcpyDeviceToDevice, g->st));
    return cudaSuccess;
}

cudaError_t prefill_qkv_store(GpuState *g, uint32_t l, bf16 *kc, bf16 *vc, const int *d_pos, int T, int ctx) {
    const Config *c = &g->c;
    const GpuLayer *w = &g->layers[l];
    return qkv_rope_store(g->q, kc, vc, g->proj, w->q_norm, w->k_norm, g->inv_freq, d_pos, T, c->n_heads, c->n_kv_heads, c->head_dim, ctx,
                          c->norm_eps, g->st);
}

cudaError_t prefill_fp8_reserve(GpuState *g, int T, int ctx, size_t *need, int *remade) {
    const Config *c = &g->c;
    size_t n = flash_prefill_fp8_workspace(T, ctx, c->n_heads, c->n_kv_heads, c->head_dim);
    if (need) *need = n;
    if (remade) *remade = n > g->f8_ws_bytes;
    if (n <= g->f8_ws_bytes) return cudaSuccess;
    cudaFree(g->f8_ws); // waits for the kernels that read it
    g->f8_ws = NULL, g->f8_ws_bytes = 0;
    CU_TRY(cudaMalloc(&g->f8_ws, n));
    g->f8_ws_bytes = n;
    return cudaSuccess;
}

cudaError_t prefill_attention(GpuState *g, const bf16 *kc, const bf16 *vc, int pos, int T, int ctx, int copies_from) {
    const Config *c = &g->c;
    int hd = c->head_dim;
    if (g->prefill_fp8) { // check_runnable made sure of head_dim 64 or 128 and an sm_90 GPU
        int remade = 0;
        CU_TRY(prefill_fp8_reserve(g, T, ctx, NULL, &remade));
        return flash_prefill_fp8(g->att, g->q, kc, vc, pos, T, c->n_heads, c->n_kv_heads, hd, ctx, remade ? 0 : copies_from, g->f8_ws,
                                 g->f8_ws_bytes, g->st);
    }
    if (hd == 64 || hd == 128) return flash_prefill(g->att, g->q, kc, vc, pos, T, c->n_heads, c->n_kv_heads, hd, ctx, g->st);
    return attn_prefill_simple(g->att, g->q, kc, vc, pos, T, c->n_heads, c->n_kv_heads, hd, ctx, g->st); // other head sizes
}
