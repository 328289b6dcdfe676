// The CUDA backend: the forward pass of model/model.c on the GPU. bf16 weights and KV cache,
// fp32 residual stream and accumulation. Decode (one token) uses the bandwidth-bound GEMV and
// flash-decoding kernels and is captured once as a CUDA graph; prefill uses cuBLAS GEMMs and
// the tiled causal attention kernel.
#include <cublas_v2.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "forward_cuda.h"
#include "gpu_state.h"
#include "kernels.h"
#include "flash_prefill.h"
#include "pariskv_attend.h"
#include "pariskv_gpu.h"
#include "../offload/host_store.h"

extern "C" {
#include "../attention/attention.h"
#include "../attention/pariskv.h"
#include "../model/bf16.h"
#include "../model/quant.h"
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
    if (p->graph_ready) cudaGraphExecDestroy(p->graph);
    pkv_gpu_index_free(&p->ix);
    pkv_gpu_scratch_free(&p->sc);
    cudaFree(p->q), cudaFree(p->partial), cudaFree(p->counters), cudaFree(p->d_meta), cudaFree(p->d_pos_chunk), cudaFree(p->rope_chunk);
    cudaFreeHost(p->h_meta), cudaFreeHost(p->h_pos_chunk);
    cudaFree(p->dbg_q), cudaFree(p->dbg_sel), cudaFree(p->dbg_nsel);
    free(p->h_dbg_q), free(p->h_dbg_sel), free(p->h_dbg_nsel);
    host_store_close(&p->hs);
}

static void qmat_free(QMat *q) { cudaFree(q->qs), cudaFree(q->meta), q->qs = NULL, q->meta = NULL; }

static void gpu_free(GpuState *g) {
    if (!g) return;
    if (g->graph_ready) cudaGraphExecDestroy(g->decode_graph);
    for (uint32_t i = 0; g->attn_ev && i < 2 * g->c.n_layers; i++)
        if (g->attn_ev[i]) cudaEventDestroy(g->attn_ev[i]);
    free(g->attn_ev);
    pkv_free(&g->pkv);
    if (g->layers) {
        for (uint32_t l = 0; l < g->c.n_layers; l++) {
            GpuLayer *w = &g->layers[l];
            cudaFree(w->wqkv), cudaFree(w->wo), cudaFree(w->wgu), cudaFree(w->wdown);
            qmat_free(&w->qqkv), qmat_free(&w->qo), qmat_free(&w->qgu), qmat_free(&w->qdown);
            cudaFree(w->attn_norm), cudaFree(w->ffn_norm), cudaFree(w->q_norm), cudaFree(w->k_norm);
        }
        free(g->layers);
    }
    if (g->head != g->embd) cudaFree(g->head);
    qmat_free(&g->qhead), cudaFree(g->wdeq);
    cudaFree(g->embd), cudaFree(g->out_norm), cudaFree(g->inv_freq), cudaFree(g->rope_cs);
    cudaFree(g->kcache), cudaFree(g->vcache);
    cudaFree(g->x), cudaFree(g->xb), cudaFree(g->proj), cudaFree(g->q), cudaFree(g->att), cudaFree(g->hb);
    cudaFree(g->logits);
    cudaFree(g->partial), cudaFree(g->counters), cudaFree(g->sumsq_a), cudaFree(g->sumsq_b), cudaFree(g->d_tokens), cudaFree(g->d_pos);
    cudaFreeHost(g->h_tokens), cudaFreeHost(g->h_pos), cudaFreeHost(g->h_logits), cudaFreeHost(g->h_step);
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

// The dtype a fused group runs in on the GPU: its members' common quantized dtype, else bf16 (a
// mixed group -- a GGUF's Q4_K wq beside a wv that ./export widened to bf16 -- is widened too).
static uint32_t group_dt(uint32_t a, uint32_t b, uint32_t c) { return a == b && b == c && dtype_is_quant(a) ? a : (uint32_t)DTYPE_BF16; }

// Layer l's groups: QKV, O, gate/up, down (a quantized group whose rows the GPU's kernels do not
// take as blocks -- Q4_0 rows not whole 64-weight units -- is widened to bf16).
static void layer_dts(const Model *m, uint32_t l, uint32_t dt[4]) {
    const Config *c = &m->c;
    size_t cols[4] = {c->dim, (size_t)c->n_heads * c->head_dim, c->dim, c->hidden_dim};
    if (!m->token_embd) { // synthetic: every matrix in the dtype asked for
        dt[0] = dt[1] = dt[2] = dt[3] = m->synthetic_dt;
    } else {
        const LayerWeights *w = &m->layers[l];
        dt[0] = group_dt(w->wq_dt, w->wk_dt, w->wv_dt);
        dt[1] = group_dt(w->wo_dt, w->wo_dt, w->wo_dt);
        dt[2] = group_dt(w->w_gate_dt, w->w_up_dt, w->w_up_dt);
        dt[3] = group_dt(w->w_down_dt, w->w_down_dt, w->w_down_dt);
    }
    for (int k = 0; k < 4; k++)
        if (dtype_is_quant(dt[k]) && !qmat_supported(dt[k], cols[k])) dt[k] = DTYPE_BF16;
}

// The LM head's: kept quantized for the decode step when it is (a synthetic quantized model's is
// Q8_0, as ./export --quant makes it).
static uint32_t head_dt(const Model *m) {
    if (!m->token_embd) return dtype_is_quant(m->synthetic_dt) ? (uint32_t)DTYPE_Q8_0 : (uint32_t)DTYPE_BF16;
    uint32_t d = m->c.tied_embeddings ? m->token_embd_dt : m->output_dt;
    return dtype_is_quant(d) && qmat_supported(d, m->c.dim) ? d : (uint32_t)DTYPE_BF16;
}

static size_t mat_bytes(uint32_t dt, size_t rows, size_t cols) {
    return dtype_is_quant(dt) ? qmat_qs_bytes(dt, rows, cols) + qmat_meta_bytes(dt, rows, cols) : rows * cols * 2;
}

// Bytes of the four groups of layer l.
static size_t layer_mat_bytes(const Model *m, uint32_t l) {
    const Config *c = &m->c;
    size_t hd = c->head_dim, dim = c->dim, q = c->n_heads * hd, kv = c->n_kv_heads * hd, h = c->hidden_dim;
    uint32_t dt[4];
    layer_dts(m, l, dt);
    return mat_bytes(dt[0], q + 2 * kv, dim) + mat_bytes(dt[1], dim, q) + mat_bytes(dt[2], 2 * h, dim) + mat_bytes(dt[3], dim, h);
}

size_t gpu_model_step_bytes(const Model *m) {
    const Config *c = &m->c;
    size_t b = mat_bytes(head_dt(m), c->vocab_size, c->dim);
    for (uint32_t l = 0; l < c->n_layers; l++) b += layer_mat_bytes(m, l);
    return b;
}

size_t gpu_model_weight_bytes(const Model *m) {
    const Config *c = &m->c;
    size_t hd = c->head_dim, dim = c->dim, q = c->n_heads * hd, kv = c->n_kv_heads * hd, h = c->hidden_dim, vocab = c->vocab_size;
    size_t b = vocab * dim * 2 * (c->tied_embeddings ? 1 : 2) + dim * 4, deq = 0; // embedding and head in bf16 (prefill's logits)
    if (dtype_is_quant(head_dt(m))) b += mat_bytes(head_dt(m), vocab, dim);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        uint32_t dt[4];
        layer_dts(m, l, dt);
        b += layer_mat_bytes(m, l) + (2 * dim + 2 * hd) * 4;
        size_t big[4] = {(q + 2 * kv) * dim, dim * q, 2 * h * dim, dim * h};
        for (int k = 0; k < 4; k++)
            if (dtype_is_quant(dt[k]) && big[k] * 2 > deq) deq = big[k] * 2;
    }
    return b + deq;
}

// Copies a host matrix (rows, cols) in dtype (f32, bf16, or blocks: widened) to device bf16 at
// dst, with the given row pitch (in elements) so rows can be interleaved.
static cudaError_t upload_matrix(bf16 *dst, size_t dst_pitch, const void *src, uint32_t dtype, size_t rows, size_t cols) {
    if (dtype == DTYPE_BF16) return cudaMemcpy2D(dst, dst_pitch * 2, src, cols * 2, cols * 2, rows, cudaMemcpyHostToDevice);
    size_t R = 256;
    float *wide = (float *)malloc(R * cols * 4);
    uint16_t *staging = (uint16_t *)malloc(R * cols * 2);
    cudaError_t e = wide && staging ? cudaSuccess : cudaErrorMemoryAllocation;
    for (size_t r0 = 0; r0 < rows && e == cudaSuccess; r0 += R) {
        size_t n = rows - r0 < R ? rows - r0 : R;
        weights_rows_to_f32(src, dtype, r0, n, cols, wide);
        for (size_t i = 0; i < n * cols; i++) staging[i] = f32_to_bf16(wide[i]);
        e = cudaMemcpy2D(dst + r0 * dst_pitch, dst_pitch * 2, staging, cols * 2, cols * 2, n, cudaMemcpyHostToDevice);
    }
    free(wide), free(staging);
    return e;
}

// A group kept quantized: members[i] (src_rows[i] rows of GGML blocks) become rows
// row0[i] + k * step[i] of q.
static cudaError_t upload_qgroup(QMat *q, uint32_t dt, size_t rows, size_t cols, int n, const void *const *members, const size_t *src_rows,
                                 const size_t *row0, const size_t *step) {
    q->dt = dt, q->rows = (int)rows, q->cols = (int)cols;
    size_t qb = qmat_qs_bytes(dt, rows, cols), mb = qmat_meta_bytes(dt, rows, cols);
    CU_TRY(cudaMalloc(&q->qs, qb));
    CU_TRY(cudaMalloc(&q->meta, mb));
    if (!members) return cudaSuccess; // synthetic: filled on the device
    int8_t *hq = (int8_t *)malloc(qb);
    uint8_t *hm = (uint8_t *)malloc(mb);
    cudaError_t e = hq && hm ? cudaSuccess : cudaErrorMemoryAllocation;
    for (int i = 0; i < n && e == cudaSuccess; i++) qmat_repack_rows(dt, (const uint8_t *)members[i], src_rows[i], cols, row0[i], step[i], hq, hm);
    if (e == cudaSuccess) e = cudaMemcpy(q->qs, hq, qb, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(q->meta, hm, mb, cudaMemcpyHostToDevice);
    free(hq), free(hm);
    return e;
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
    cudaError_t e = cudaSuccess;
    unsigned long long seed = 1234;
    size_t deq = 0; // elements of the largest quantized matrix
#define TRY(call)                       \
    do {                                \
        e = (call);                     \
        if (e != cudaSuccess) goto out; \
    } while (0)
    TRY(cudaMalloc(&g->embd, vocab * dim * 2));
    if (synthetic) TRY(fill_random_bf16(g->embd, vocab * dim, seed++, 1.0f, 0.0f, g->st));
    else TRY(upload_matrix(g->embd, dim, m->token_embd, m->token_embd_dt, vocab, dim));
    if (c->tied_embeddings) {
        g->head = g->embd;
    } else {
        TRY(cudaMalloc(&g->head, vocab * dim * 2));
        if (synthetic) TRY(fill_random_bf16(g->head, vocab * dim, seed++, sqrtf(3.0f / dim), 0.0f, g->st));
        else TRY(upload_matrix(g->head, dim, m->output, m->output_dt, vocab, dim));
    }
    if (dtype_is_quant(head_dt(m))) { // the decode step's head reads the blocks
        size_t one = vocab, zero = 0, unit = 1;
        const void *src = synthetic ? NULL : (c->tied_embeddings ? m->token_embd : m->output);
        TRY(upload_qgroup(&g->qhead, head_dt(m), vocab, dim, 1, synthetic ? NULL : &src, &one, &zero, &unit));
        if (synthetic) TRY(qmat_fill_random(&g->qhead, seed++, sqrtf(3.0f / dim), g->st));
    }
    TRY(cudaMalloc(&g->out_norm, dim * 4));
    if (synthetic) TRY(fill_random_f32(g->out_norm, dim, seed++, 0.1f, 1.0f, g->st));
    else TRY(cudaMemcpy(g->out_norm, m->output_norm, dim * 4, cudaMemcpyHostToDevice));
    TRY(upload_f32(&g->inv_freq, m->inv_freq, hd / 2));
    for (uint32_t l = 0; l < c->n_layers; l++) {
        GpuLayer *w = &g->layers[l];
        const LayerWeights *lw = synthetic ? NULL : &m->layers[l];
        uint32_t dt[4];
        layer_dts(m, l, dt);
        size_t rows[4] = {q + 2 * kv, dim, 2 * h, dim}, cols[4] = {dim, q, dim, h};
        QMat *qm[4] = {&w->qqkv, &w->qo, &w->qgu, &w->qdown};
        bf16 **bm[4] = {&w->wqkv, &w->wo, &w->wgu, &w->wdown};
        for (int k = 0; k < 4; k++) {
            if (dtype_is_quant(dt[k])) {
                if (rows[k] * cols[k] > deq) deq = rows[k] * cols[k];
                if (synthetic) {
                    TRY(upload_qgroup(qm[k], dt[k], rows[k], cols[k], 0, NULL, NULL, NULL, NULL));
                    TRY(qmat_fill_random(qm[k], seed++, sqrtf(3.0f / cols[k]), g->st));
                }
            } else {
                TRY(cudaMalloc(bm[k], rows[k] * cols[k] * 2));
            }
        }
        TRY(cudaMalloc(&w->attn_norm, dim * 4));
        TRY(cudaMalloc(&w->ffn_norm, dim * 4));
        if (c->qk_norm) {
            TRY(cudaMalloc(&w->q_norm, hd * 4));
            TRY(cudaMalloc(&w->k_norm, hd * 4));
        }
        if (synthetic) { // uniform with variance 1/n keeps activations at unit scale
            float a = sqrtf(3.0f / dim), ah = sqrtf(3.0f / h), aq = sqrtf(3.0f / q);
            if (w->wqkv) TRY(fill_random_bf16(w->wqkv, (q + 2 * kv) * dim, seed++, a, 0.0f, g->st));
            if (w->wo) TRY(fill_random_bf16(w->wo, dim * q, seed++, aq, 0.0f, g->st));
            if (w->wgu) TRY(fill_random_bf16(w->wgu, 2 * h * dim, seed++, a, 0.0f, g->st));
            if (w->wdown) TRY(fill_random_bf16(w->wdown, dim * h, seed++, ah, 0.0f, g->st));
            TRY(fill_random_f32(w->attn_norm, dim, seed++, 0.1f, 1.0f, g->st));
            TRY(fill_random_f32(w->ffn_norm, dim, seed++, 0.1f, 1.0f, g->st));
            if (c->qk_norm) {
                TRY(fill_random_f32(w->q_norm, hd, seed++, 0.1f, 1.0f, g->st));
                TRY(fill_random_f32(w->k_norm, hd, seed++, 0.1f, 1.0f, g->st));
            }
        } else {
            if (w->wqkv) {
                TRY(upload_matrix(w->wqkv, dim, lw->wq, lw->wq_dt, q, dim));
                TRY(upload_matrix(w->wqkv + q * dim, dim, lw->wk, lw->wk_dt, kv, dim));
                TRY(upload_matrix(w->wqkv + (q + kv) * dim, dim, lw->wv, lw->wv_dt, kv, dim));
            } else {
                const void *src[3] = {lw->wq, lw->wk, lw->wv};
                size_t n[3] = {q, kv, kv}, r0[3] = {0, q, q + kv}, st[3] = {1, 1, 1};
                TRY(upload_qgroup(&w->qqkv, dt[0], q + 2 * kv, dim, 3, src, n, r0, st));
            }
            if (w->wo) TRY(upload_matrix(w->wo, q, lw->wo, lw->wo_dt, dim, q));
            else {
                size_t n = dim, r0 = 0, st = 1;
                TRY(upload_qgroup(&w->qo, dt[1], dim, q, 1, &lw->wo, &n, &r0, &st));
            }
            if (w->wgu) {
                TRY(upload_matrix(w->wgu, 2 * dim, lw->w_gate, lw->w_gate_dt, h, dim));
                TRY(upload_matrix(w->wgu + dim, 2 * dim, lw->w_up, lw->w_up_dt, h, dim));
            } else {
                const void *src[2] = {lw->w_gate, lw->w_up};
                size_t n[2] = {h, h}, r0[2] = {0, 1}, st[2] = {2, 2};
                TRY(upload_qgroup(&w->qgu, dt[2], 2 * h, dim, 2, src, n, r0, st));
            }
            if (w->wdown) TRY(upload_matrix(w->wdown, h, lw->w_down, lw->w_down_dt, dim, h));
            else {
                size_t n = dim, r0 = 0, st = 1;
                TRY(upload_qgroup(&w->qdown, dt[3], dim, h, 1, &lw->w_down, &n, &r0, &st));
            }
            TRY(cudaMemcpy(w->attn_norm, lw->attn_norm, dim * 4, cudaMemcpyHostToDevice));
            TRY(cudaMemcpy(w->ffn_norm, lw->ffn_norm, dim * 4, cudaMemcpyHostToDevice));
            if (c->qk_norm) {
                TRY(cudaMemcpy(w->q_norm, lw->q_norm, hd * 4, cudaMemcpyHostToDevice));
                TRY(cudaMemcpy(w->k_norm, lw->k_norm, hd * 4, cudaMemcpyHostToDevice));
            }
        }
        // The RMSNorms' weights go into the columns of the bf16 matrices after them, so the norm
        // itself is a scale of the GEMV's result (decode) or of its input (prefill). Quantized
        // groups keep them apart (gemv_q_normed applies them; a prefill folds them on dequantizing).
        if (w->wqkv) TRY(scale_columns(w->wqkv, q + 2 * kv, dim, w->attn_norm, g->st));
        if (w->wgu) TRY(scale_columns(w->wgu, 2 * h, dim, w->ffn_norm, g->st));
    }
    if (deq) TRY(cudaMalloc(&g->wdeq, deq * 2));
#undef TRY
out:
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


// Device memory of ParisKV besides the K/V cache: the index, the selection's scratch, the
// attention's scratch.
static size_t pkv_device_bytes(const Config *c, const AttnConfig *a, int ctx) {
    int cap = ctx - a->sink, nkv = c->n_kv_heads;
    return pkv_gpu_index_bytes(c->n_layers, nkv, c->head_dim, cap) + (size_t)nkv * cap * 12 +
           (size_t)nkv * (a->topk + 64) * 8 + pkv_attend_scratch_floats(c->n_heads, nkv, c->head_dim) * 4 +
           (size_t)c->n_heads * c->head_dim * 4 + (4u << 20);
}

// The positions the device cache needs at least under ParisKV with the zone in the host store:
// the dense phase, the ring (sink + local window + update buffer + the new token), a prefill chunk.
int pkv_min_positions(const AttnConfig *a, int chunk) {
    int ring = a->sink + a->local + a->update + 1, t = attn_dense_threshold(a);
    return (t > ring ? t : ring) + chunk;
}

// create with the device cache's size under a host store chosen by the caller (dcap_want > 0,
// the benchmark: no prompt to hold) or from the memory left (0).
static void *gpu_create_ex(const Model *m, int ctx, int chunk, int all_logits, const AttnConfig *attn, int dcap_want, char *err) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        gpu_set_err(err, "no CUDA device found (use --device cpu)");
        return NULL;
    }
    const Config *c = &m->c;
    const char *why = unsupported_shape(c);
    if (why) {
        gpu_set_err(err, "the CUDA path cannot run this model (head_dim %u, %u / %u heads, dim %u, hidden %u): %s; use --device cpu",
                c->head_dim, c->n_heads, c->n_kv_heads, c->dim, c->hidden_dim, why);
        return NULL;
    }
    if (attn && attn->method != ATTN_FULL && attn->method != ATTN_PARISKV) {
        gpu_set_err(err, "--attn %s runs on the CPU only (add --device cpu); the GPU runs full and pariskv", attn_method_name(attn->method));
        return NULL;
    }
    int pkv = attn && attn->method == ATTN_PARISKV && ctx >= attn_dense_threshold(attn);
    if (pkv && attn->topk > 4096) {
        gpu_set_err(err, "--attn pariskv on the GPU takes --topk up to 4096, not %d", attn->topk);
        return NULL;
    }
    if (pkv && c->head_dim != 64 && c->head_dim != 128) {
        gpu_set_err(err, "--attn pariskv on the GPU needs head_dim 64 or 128 (this model: %u); use --device cpu", c->head_dim);
        return NULL;
    }
    int logit_rows = all_logits ? chunk : 1;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        gpu_set_err(err, "cannot query GPU memory");
        return NULL;
    }
    size_t slack = 256u << 20; // cuBLAS workspace and slack
    size_t need_w = gpu_model_weight_bytes(m), need_a = activation_bytes(c, ctx, chunk, logit_rows);
    size_t need_p = pkv ? pkv_device_bytes(c, attn, ctx) : 0, per_pos = gpu_kv_bytes(c, 1);
    int dcap = ctx, host = 0;
    if (pkv) {
        int fits_all = need_w + need_a + need_p + per_pos * (size_t)ctx + slack <= free_b;
        host = attn->store == KV_STORE_HOST || (attn->store == KV_STORE_AUTO && !fits_all) || attn->zone_fp8; // fp8: the host store's format
        if (host) {
            int least = pkv_min_positions(attn, chunk);
            size_t rest = free_b > need_w + need_a + need_p + slack + (1u << 30) ? free_b - need_w - need_a - need_p - slack - (1u << 30) : 0;
            long fit = (long)(rest / per_pos);
            const char *env = getenv("PKV_DEVICE_POSITIONS"); // tests: a small device cache, so the ring wraps
            long want = dcap_want > 0 ? dcap_want : env ? atol(env) : fit;
            if (want < least) want = least;
            dcap = want < ctx ? (int)want : ctx;
            if (dcap > fit && dcap_want <= 0 && !env) dcap = (int)fit; // never above what fits
            if (dcap < least && dcap < ctx) {
                gpu_set_err(err, "GPU memory: weights %.2f GiB + ParisKV index %.2f GiB + activations %.2f GiB leave room for %ld cached positions, "
                        "but the host-store mode needs at least %d: lower --ctx",
                        gib(need_w), gib(need_p), gib(need_a), fit, least);
                return NULL;
            }
        }
    }
    size_t need_kv = per_pos * (size_t)dcap;
    size_t need = need_w + need_kv + need_a + need_p + slack;
    if (need > free_b) {
        if (pkv)
            gpu_set_err(err, "GPU memory: weights %.2f GiB + KV cache for %d positions %.2f GiB + ParisKV index %.2f GiB + activations %.2f GiB = %.2f GiB, "
                         "but only %.2f GiB of %.2f GiB is free: lower --ctx%s",
                    gib(need_w), dcap, gib(need_kv), gib(need_p), gib(need_a), gib(need), gib(free_b), gib(total_b),
                    host ? "" : " or use --kv-store host");
        else
            gpu_set_err(err, "GPU memory: weights %.2f GiB + KV cache for %d positions %.2f GiB + activations %.2f GiB = %.2f GiB, "
                         "but only %.2f GiB of %.2f GiB is free: lower --ctx%s",
                    gib(need_w), ctx, gib(need_kv), gib(need_a), gib(need), gib(free_b), gib(total_b),
                    attn && attn->method == ATTN_FULL ? "" : " (--attn pariskv keeps the long context in host memory)");
        return NULL;
    }
    GpuState *g = (GpuState *)calloc(1, sizeof(GpuState));
    if (!g) {
        gpu_set_err(err, "out of memory");
        return NULL;
    }
    g->c = *c;
    g->ctx = ctx;
    g->dcap = dcap;
    g->chunk = chunk;
    g->logit_rows = logit_rows;
    g->weight_bytes = gpu_model_step_bytes(m);
    if (host && host_store_open(&g->pkv.hs, c->n_layers, c->n_kv_heads, c->head_dim, attn->zone_fp8, ctx - attn->sink, err) != 0) {
        free(g);
        return NULL;
    }
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
    ALLOC(g->partial, attn_decode_scratch_floats(c->n_heads, c->n_kv_heads, hd, dcap) * 4);
    ALLOC(g->counters, c->n_kv_heads * sizeof(unsigned));
    if (e == cudaSuccess) e = cudaMemset(g->counters, 0, c->n_kv_heads * sizeof(unsigned));
    ALLOC(g->d_tokens, T * 4);
    ALLOC(g->d_pos, 4);
    ALLOC(g->rope_cs, hd * 4);
    ALLOC(g->sumsq_a, gemv_sumsq_count(dim) * 4);
    ALLOC(g->sumsq_b, gemv_sumsq_count(dim) * 4);
    if (pkv) {
        Pkv *p = &g->pkv;
        p->on = 1;
        p->cfg = *attn;
        p->cfg.store = host ? KV_STORE_HOST : KV_STORE_GPU;
        if (e == cudaSuccess) e = pkv_gpu_index_alloc(&p->ix, c->n_layers, c->n_kv_heads, hd, ctx - attn->sink, g->st);
        if (e == cudaSuccess) e = pkv_gpu_scratch_alloc(&p->sc, &p->ix, attn->topk);
        if (e == cudaSuccess) e = cudaMemset(p->sc.nsel, 0, c->n_kv_heads * sizeof(int)); // read by timing runs without the selection
        ALLOC(p->q, q * 4);
        ALLOC(p->partial, pkv_attend_scratch_floats(c->n_heads, c->n_kv_heads, hd) * 4);
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
        p->kv = (GpuKV){g->kcache, g->vcache, host ? p->hs.base : NULL, (int)c->n_layers, (int)c->n_kv_heads, (int)hd, dcap, attn->sink,
                        host ? p->hs.alias_slots : 0, host && attn->zone_fp8};
    }
#undef ALLOC
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_tokens, T * 4);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_pos, 4);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_logits, (size_t)logit_rows * c->vocab_size * 4);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_step, (size_t)c->vocab_size * 4);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
    if (e != cudaSuccess) {
        gpu_set_err(err, "GPU setup failed: %s", cudaGetErrorString(e));
        gpu_free(g);
        return NULL;
    }
    if (pkv && dcap_want <= 0)
        fprintf(stderr, "pariskv on the GPU: retrieval zone in %s (%.2f GiB at %d positions), index %.2f GiB, device KV cache %d positions\n",
                host ? (attn->zone_fp8 ? "pinned host memory, fp8" : "pinned host memory") : "GPU memory",
                gib(host ? host_store_bytes(c->n_layers, c->n_kv_heads, c->head_dim, attn->zone_fp8, ctx - attn->sink)
                         : per_pos * (size_t)(ctx - attn->sink)), ctx, gib(need_p), dcap);
    return g;
}

extern "C" void *gpu_create(const Model *m, int ctx, int chunk, int all_logits, const AttnConfig *attn, char *err) {
    return gpu_create_ex(m, ctx, chunk, all_logits, attn, 0, err);
}

extern "C" void gpu_set_prefill_len(void *dev, int prefill_len) {
    GpuState *g = (GpuState *)dev;
    g->pkv.cfg.prefill_len = prefill_len;
}

extern "C" void gpu_destroy(void *dev) { gpu_free((GpuState *)dev); }

void gpu_drop_graphs(GpuState *g) {
    if (g->graph_ready) cudaGraphExecDestroy(g->decode_graph), g->graph_ready = 0;
    if (g->pkv.graph_ready) cudaGraphExecDestroy(g->pkv.graph), g->pkv.graph_ready = 0;
}

// ---- the forward pass ----

cudaError_t gpu_gemm(GpuState *g, float *y, const bf16 *x, const bf16 *W, int T, int n, int d, int accumulate) {
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t s = cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, d, T, n, &alpha, W, CUDA_R_16BF, n, x, CUDA_R_16BF,
                                    n, &beta, y, CUDA_R_32F, d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

cudaError_t gpu_gemm_w(GpuState *g, float *y, const bf16 *x, const bf16 *W, const QMat *q, const float *norm, int T, int n, int d,
                       int accumulate) {
    if (q->dt) { // dequantized for the tensor cores: a GEMM over T tokens reuses each weight T times
        CU_TRY(qmat_to_bf16(g->wdeq, q, norm, g->st));
        W = g->wdeq;
    }
    return gpu_gemm(g, y, x, W, T, n, d, accumulate);
}

cudaError_t gpu_head_gemv(GpuState *g) {
    const Config *c = &g->c;
    if (g->qhead.dt) return gemv_q(g->logits, &g->qhead, g->xb, GEMV_STORE, g->st);
    return gemv_bf16(g->logits, g->head, g->xb, c->dim, c->vocab_size, GEMV_STORE, g->st);
}

// The decode GEMVs on a group that may be quantized: after an RMSNorm (split as described below;
// a quantized group applies the norm's weights itself), and with the residual add and its stats.
static cudaError_t dec_normed(GpuState *g, void *y, const bf16 *W, const QMat *q, const float *norm, int n, int d, int epi,
                              const float *sumsq, int n_sumsq) {
    float eps = g->c.norm_eps;
    if (q->dt) return gemv_q_normed(y, q, g->xb, epi, norm, sumsq, n_sumsq, eps, g->st);
    return gemv_bf16_normed(y, W, g->xb, n, d, epi, sumsq, n_sumsq, eps, g->st);
}

static cudaError_t dec_add_stats(GpuState *g, const bf16 *W, const QMat *q, const bf16 *x, int n, int d, float *sumsq) {
    if (q->dt) return gemv_q_add_stats(g->x, q, x, g->xb, sumsq, g->st);
    return gemv_bf16_add_stats(g->x, W, x, n, d, g->xb, sumsq, g->st);
}

// One decode step (T = 1): five kernels a layer. Each RMSNorm is split between the residual
// GEMV before it (which also writes bf16(x) and per-block sums of squares) and the GEMV after it
// (which divides by the rms; the norm weights are folded into its columns at load time), and
// the QKV post-processing rides on the attention kernel. PKV_DECODE_SKIP=1 leaves the
// attention out (timing breakdowns only).
// Under ParisKV (pkv) the attention is three stages instead: QKV post-processing (the new row
// written through to the store), the selection (the group query's transform included; slots
// written in ascending order), the attention over sink + top-k + window.
static cudaError_t enqueue_decode(GpuState *g, int pkv) {
    Pkv *p = &g->pkv;
    const Config *c = &g->c;
    int hd = c->head_dim, dim = c->dim, hidden = c->hidden_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    int q_dim = nh * hd, kv_dim = nkv * hd, n_sums = gemv_sumsq_count(dim), n_a = 1;
    size_t layer_kv = (size_t)nkv * g->dcap * hd;
    cudaStream_t st = g->st;
    float eps = c->norm_eps;
    CU_TRY(embed_stats(g->x, g->xb, g->sumsq_a, g->embd, g->d_tokens, dim, st));
    CU_TRY(rope_table(g->rope_cs, g->inv_freq, g->d_pos, hd / 2, st));
    for (uint32_t l = 0; l < c->n_layers; l++) {
        GpuLayer *w = &g->layers[l];
        bf16 *kc = g->kcache + l * layer_kv, *vc = g->vcache + l * layer_kv;
        CU_TRY(dec_normed(g, g->proj, w->wqkv, &w->qqkv, w->attn_norm, dim, q_dim + 2 * kv_dim, GEMV_STORE, g->sumsq_a, n_a));
        if (pkv && !(g->skip & 1)) {
            CU_TRY(pkv_qkv_decode(p->q, g->proj, w->q_norm, w->k_norm, g->rope_cs, p->kv, (int)l, g->d_pos, nh, eps, st));
            if (!(g->skip & 2)) { // timing breakdowns: 2 leaves the selection out (nsel stays 0), 4 the attention
                CU_TRY(pkv_gpu_select(&p->sc, &p->ix, (int)l, p->q, nh, p->d_meta + 1, p->cfg.topk, p->cfg.beta, p->cfg.rho,
                                      st));
            }
            if (p->recall) { // the measurement keeps this layer's query and selection
                size_t ks = (size_t)nkv * p->sc.kmax;
                CU_TRY(cudaMemcpyAsync(p->dbg_q + (size_t)l * q_dim, p->q, (size_t)q_dim * 4, cudaMemcpyDeviceToDevice, st));
                CU_TRY(cudaMemcpyAsync(p->dbg_sel + l * ks, p->sc.sel, ks * 4, cudaMemcpyDeviceToDevice, st));
                CU_TRY(cudaMemcpyAsync(p->dbg_nsel + (size_t)l * nkv, p->sc.nsel, (size_t)nkv * 4, cudaMemcpyDeviceToDevice, st));
            }
            if (!(g->skip & 4))
                CU_TRY(pkv_attend(g->att, p->q, p->sc.sel, p->sc.nsel, p->sc.kmax, p->kv, (int)l, g->d_pos, p->d_meta, nh,
                                  p->partial, p->counters, st));
        } else if (!(g->skip & 1))
            CU_TRY(attn_decode(g->att, g->proj, w->q_norm, w->k_norm, g->rope_cs, kc, vc, g->d_pos, nh, nkv, hd, g->dcap,
                               eps, g->partial, g->counters, st));
        CU_TRY(dec_add_stats(g, w->wo, &w->qo, g->att, q_dim, dim, g->sumsq_b));
        CU_TRY(dec_normed(g, g->hb, w->wgu, &w->qgu, w->ffn_norm, dim, 2 * hidden, GEMV_SWIGLU, g->sumsq_b, n_sums));
        CU_TRY(dec_add_stats(g, w->wdown, &w->qdown, g->hb, hidden, dim, g->sumsq_a));
        n_a = n_sums;
    }
    CU_TRY(rmsnorm_bf16(g->xb, g->x, g->out_norm, 1, dim, eps, st));
    CU_TRY(gpu_head_gemv(g));
    return cudaMemcpyAsync(g->h_step, g->logits, (size_t)c->vocab_size * 4, cudaMemcpyDeviceToHost, st);
}

// Enqueues one forward pass for T tokens (already in d_tokens, position in d_pos / pos): a
// prefill chunk (cuBLAS GEMMs, tiled causal attention).
static cudaError_t enqueue_forward(GpuState *g, int T, int pos, int all_logits) {
    const Config *c = &g->c;
    int hd = c->head_dim, dim = c->dim, hidden = c->hidden_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    int q_dim = nh * hd, kv_dim = nkv * hd;
    size_t layer_kv = (size_t)nkv * g->dcap * hd;
    cudaStream_t st = g->st;
    CU_TRY(embed_rows(g->x, g->embd, g->d_tokens, T, dim, st));
    for (uint32_t l = 0; l < c->n_layers; l++) {
        GpuLayer *w = &g->layers[l];
        bf16 *kc = g->kcache + l * layer_kv, *vc = g->vcache + l * layer_kv;
        CU_TRY(rmsnorm_bf16(g->xb, g->x, NULL, T, dim, c->norm_eps, st)); // weights folded into wqkv
        CU_TRY(gpu_gemm_w(g, g->proj, g->xb, w->wqkv, &w->qqkv, w->attn_norm, T, dim, q_dim + 2 * kv_dim, 0));
        CU_TRY(qkv_rope_store(g->q, kc, vc, g->proj, w->q_norm, w->k_norm, g->inv_freq, g->d_pos, T, nh, nkv, hd, g->dcap,
                              c->norm_eps, st));
        if (g->attn_ev) CU_TRY(cudaEventRecord(g->attn_ev[2 * l], st));
        if (hd == 64 || hd == 128) CU_TRY(flash_prefill(g->att, g->q, kc, vc, pos, T, nh, nkv, hd, g->dcap, st));
        else CU_TRY(attn_prefill_simple(g->att, g->q, kc, vc, pos, T, nh, nkv, hd, g->dcap, st)); // other head sizes
        if (g->attn_ev) CU_TRY(cudaEventRecord(g->attn_ev[2 * l + 1], st));
        CU_TRY(gpu_gemm_w(g, g->x, g->att, w->wo, &w->qo, NULL, T, q_dim, dim, 1));
        CU_TRY(rmsnorm_bf16(g->xb, g->x, NULL, T, dim, c->norm_eps, st)); // weights folded into wgu
        CU_TRY(gpu_gemm_w(g, g->proj, g->xb, w->wgu, &w->qgu, w->ffn_norm, T, dim, 2 * hidden, 0));
        CU_TRY(swiglu_pairs(g->hb, g->proj, T, hidden, st));
        CU_TRY(gpu_gemm_w(g, g->x, g->hb, w->wdown, &w->qdown, NULL, T, hidden, dim, 1));
    }
    int first = all_logits ? 0 : T - 1, n = T - first;
    CU_TRY(rmsnorm_bf16(g->xb, g->x + (size_t)first * dim, g->out_norm, n, dim, c->norm_eps, st));
    if (n == 1) CU_TRY(gpu_head_gemv(g));
    else CU_TRY(gpu_gemm(g, g->logits, g->xb, g->head, n, dim, c->vocab_size, 0));
    return cudaMemcpyAsync(g->h_logits, g->logits, (size_t)n * c->vocab_size * 4, cudaMemcpyDeviceToHost, st);
}

// The decode step as a graph: it reads the token, the position (and ParisKV's zone) from pinned
// host memory when replayed, so one capture serves every step. Logits land in h_step.
static cudaError_t decode_step(GpuState *g, int pkv) {
    cudaGraphExec_t *exec = pkv ? &g->pkv.graph : &g->decode_graph;
    int *ready = pkv ? &g->pkv.graph_ready : &g->graph_ready;
    if (!*ready) {
        cudaGraph_t graph;
        CU_TRY(cudaStreamBeginCapture(g->st, cudaStreamCaptureModeThreadLocal));
        cudaError_t e = cudaMemcpyAsync(g->d_tokens, g->h_tokens, 4, cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(g->d_pos, g->h_pos, 4, cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess && pkv) e = cudaMemcpyAsync(g->pkv.d_meta, g->pkv.h_meta, 2 * sizeof(int), cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess) e = enqueue_decode(g, pkv);
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

// ---- ParisKV's protocol on the host side (attention/policy.c is the CPU reference) ----

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
        if (p->indexed == 0) CU_TRY(pkv_gpu_index_reset(&p->ix, -1, g->st));
        size_t hd = p->kv.hd;
        PkvKeySource src;
        size_t row = p->hs.row_bytes;
        if (p->kv.host && p->kv.fp8) // strides in bytes
            src = (PkvKeySource){NULL, (size_t)p->kv.n_kv * row, row, (size_t)p->kv.n_layers * p->kv.n_kv * row, (const uint8_t *)p->kv.host,
                                 2 * hd};
        else if (p->kv.host)
            src = (PkvKeySource){(const bf16 *)p->kv.host, (size_t)p->kv.n_kv * 2 * hd, 2 * hd, (size_t)p->kv.n_layers * p->kv.n_kv * 2 * hd,
                                 NULL, 0};
        else
            src = (PkvKeySource){p->kv.kc + (size_t)S * hd, (size_t)p->kv.n_kv * g->dcap * hd, (size_t)g->dcap * hd, hd, NULL, 0};
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

// One ParisKV decode step at pos: the index update it needs, then its graph. Logits in h_step.
static cudaError_t pkv_step(GpuState *g, int token, int pos, char *err) {
    Pkv *p = &g->pkv;
    int zone_end = attn_zone_end(&p->cfg, pos);
    CU_TRY(pkv_index_to(g, zone_end, pos, err));
    *g->h_tokens = token;
    *g->h_pos = pos;
    p->h_meta[0] = zone_end, p->h_meta[1] = zone_end - p->cfg.sink;
    CU_TRY(decode_step(g, 1));
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
static float *pkv_forward(GpuState *g, const int *tokens, int T, int pos, int all_logits, char *err) {
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
            e = decode_step(g, 0);
            if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
            if (e != cudaSuccess) return forward_failed(g, e, err);
            if (pos + 1 > p->ring_hi) p->ring_hi = pos + 1;
            return g->h_step;
        }
        memcpy(g->h_tokens, tokens, (size_t)nd * sizeof(int));
        *g->h_pos = pos;
        e = cudaMemcpyAsync(g->d_tokens, g->h_tokens, (size_t)nd * 4, cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(g->d_pos, g->h_pos, 4, cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess) e = enqueue_forward(g, nd, pos, all_logits);
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
        e = pkv_step(g, tokens[t], pos + t, err);
        if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
        if (e == cudaSuccess && p->recall) e = pkv_recall_step(g, pos + t);
        if (e != cudaSuccess) return forward_failed(g, e, err);
        if (all_logits) memcpy(g->h_logits + (size_t)t * V, g->h_step, V * sizeof(float));
        else if (t == T - 1) memcpy(g->h_logits, g->h_step, V * sizeof(float));
    }
    return g->h_logits;
}

extern "C" float *gpu_forward(void *dev, const int *tokens, int T, int pos, int all_logits, char *err) {
    GpuState *g = (GpuState *)dev;
    if (g->pkv.on) return pkv_forward(g, tokens, T, pos, all_logits, err);
    memcpy(g->h_tokens, tokens, (size_t)T * sizeof(int));
    *g->h_pos = pos;
    cudaError_t e;
    if (T == 1) {
        e = decode_step(g, 0);
    } else {
        e = cudaMemcpyAsync(g->d_tokens, g->h_tokens, (size_t)T * 4, cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess) e = cudaMemcpyAsync(g->d_pos, g->h_pos, 4, cudaMemcpyHostToDevice, g->st);
        if (e == cudaSuccess) e = enqueue_forward(g, T, pos, all_logits);
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

// ---- for the benchmark ----

// Times each layer's prefill attention (events around the kernel) from now on; returns the
// milliseconds summed so far (-1: could not make the events).
extern "C" double gpu_prefill_attention_ms(void *dev, int start) {
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

extern "C" cudaError_t gpu_fill_kv_random(void *dev, int n_tokens) {
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
        CU_TRY(decode_step(g, 0));
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

// ---- the ParisKV benchmark ----

extern "C" void *gpu_create_bench(const Model *m, int ctx, int chunk, const AttnConfig *attn, char *err) {
    return gpu_create_ex(m, ctx, chunk, 0, attn, attn && (attn->store == KV_STORE_HOST || attn->zone_fp8) ? pkv_min_positions(attn, chunk) : 0,
                         err);
}

// As after a prompt of n tokens: random K/V in every zone slot of the context and every device
// cache slot, then the index of the zone [sink, zone_end(n)) built. *fill_s, *index_s: seconds.
extern "C" cudaError_t gpu_pkv_fill(void *dev, int n, double *fill_s, double *index_s, char *err) {
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

// Times steps at positions pos0, pos0 + 1, ... (each with the index update it needs, outside
// its graph but inside its timing): ms_out[i], and updated[i] = 1 where step i updated the index.
extern "C" cudaError_t gpu_pkv_time(void *dev, int pos0, int n, float *ms_out, int *updated, char *err) {
    GpuState *g = (GpuState *)dev;
    Pkv *p = &g->pkv;
    cudaEvent_t a, b;
    CU_TRY(cudaEventCreate(&a));
    CU_TRY(cudaEventCreate(&b));
    p->seen_end = pos0;
    for (int i = 0; i < n; i++) {
        int before = p->indexed;
        CU_TRY(cudaEventRecord(a, g->st));
        CU_TRY(pkv_step(g, 1, pos0 + i, err));
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
extern "C" void gpu_pkv_step_bytes(void *dev, int pos, double *device_bytes, double *host_bytes) {
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

extern "C" int gpu_pkv_device_positions(void *dev) { return ((GpuState *)dev)->dcap; }

// Median of n steps at one position (no index update) with the stages in `skip` left out
// (PKV_DECODE_SKIP's bits): the per-stage breakdown of the benchmark.
extern "C" cudaError_t gpu_pkv_time_skip(void *dev, int pos, int skip, int n, float *median_ms, char *err) {
    GpuState *g = (GpuState *)dev;
    Pkv *p = &g->pkv;
    int keep = g->skip;
    if (p->graph_ready) cudaGraphExecDestroy(p->graph), p->graph_ready = 0;
    g->skip = skip;
    float *t = (float *)malloc(sizeof(float) * (size_t)n);
    int *u = (int *)malloc(sizeof(int) * (size_t)n);
    cudaError_t e = t && u ? cudaSuccess : cudaErrorMemoryAllocation;
    for (int i = 0; i < n && e == cudaSuccess; i++) e = gpu_pkv_time(dev, pos, 1, &t[i], &u[i], err);
    if (e == cudaSuccess) {
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++)
                if (t[j] < t[i]) { float x = t[i]; t[i] = t[j], t[j] = x; }
        *median_ms = t[n / 2];
    }
    free(t), free(u);
    if (p->graph_ready) cudaGraphExecDestroy(p->graph), p->graph_ready = 0;
    g->skip = keep;
    return e;
}

// Whether a prompt of n tokens must come in one forward call (prefilled layer by layer).
static int gpu_prompt_whole(void *dev, int n) { return gpu_prefill_is_layered((GpuState *)dev, n); }

// A chat's /reset: the sequence forgotten, the host store's pages given back.
static size_t gpu_reset(void *dev) {
    GpuState *g = (GpuState *)dev;
    Pkv *p = &g->pkv;
    cudaStreamSynchronize(g->st);
    if (!p->on) return 0;
    p->seen_end = 0, p->ring_hi = 0, p->synced = 0, p->indexed = 0;
    return p->kv.host ? host_store_release(&p->hs) : 0;
}

static int gpu_available(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static const Backend backend_cuda = {
    "cuda", NULL, NULL, NULL, NULL, NULL, NULL, gpu_available, gpu_create, gpu_set_prefill_len, gpu_forward, gpu_destroy, gpu_bench, 4096, gpu_prompt_whole,
    gpu_session_save, gpu_session_load, gpu_reset,
};

extern "C" const Backend *backend_cuda_get(void) { return &backend_cuda; }
