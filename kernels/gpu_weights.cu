// Weights and memory on the GPU: what a model's weights take there (and what a decode step
// reads of them), how they are uploaded -- bf16 matrices with their RMSNorm weights folded in,
// quantized groups kept as blocks, random ones for --synthetic models -- and the activations'
// share of the pre-flight check (gpu_create.cu).
#include <stdlib.h>

#include "gpu_state.h"
#include "kernels.h"

extern "C" {
#include "../model/bf16.h"
#include "../model/quant.h"
}

size_t gpu_weight_bytes(const Config *c) {
    size_t hd = c->head_dim, dim = c->dim, q = c->n_heads * hd, kv = c->n_kv_heads * hd, h = c->hidden_dim;
    size_t layer = ((q + 2 * kv) * dim + dim * q + 3 * h * dim) * 2 + (2 * dim + 2 * hd) * 4;
    return c->n_layers * layer + (size_t)c->vocab_size * dim * 2 * (c->tied_embeddings ? 1 : 2) + dim * 4;
}

size_t gpu_kv_bytes(const Config *c, int ctx) {
    return 2 * (size_t)c->n_layers * c->n_kv_heads * (size_t)ctx * c->head_dim * sizeof(bf16);
}

size_t gpu_activation_bytes(const Config *c, int ctx, int chunk, int logit_rows) {
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

cudaError_t gpu_upload_weights(GpuState *g, const Model *m) {
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


static void qmat_free(QMat *q) { cudaFree(q->qs), cudaFree(q->meta), q->qs = NULL, q->meta = NULL; }

void gpu_free_weights(GpuState *g) {
    if (g->layers) {
        for (uint32_t l = 0; l < g->c.n_layers; l++) {
            GpuLayer *w = &g->layers[l];
            cudaFree(w->wqkv), cudaFree(w->wo), cudaFree(w->wgu), cudaFree(w->wdown);
            qmat_free(&w->qqkv), qmat_free(&w->qo), qmat_free(&w->qgu), qmat_free(&w->qdown);
            cudaFree(w->attn_norm), cudaFree(w->ffn_norm), cudaFree(w->q_norm), cudaFree(w->k_norm);
        }
        free(g->layers);
        g->layers = NULL;
    }
    if (g->head != g->embd) cudaFree(g->head);
    qmat_free(&g->qhead), cudaFree(g->wdeq);
    cudaFree(g->embd), cudaFree(g->out_norm), cudaFree(g->inv_freq);
    g->head = g->embd = g->wdeq = NULL, g->out_norm = g->inv_freq = NULL;
}
