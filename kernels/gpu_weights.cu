// Weights and memory on the GPU: what a model's weights take there (and what a decode step
// reads of them), how they are uploaded -- bf16 matrices with their RMSNorm weights folded in,
// quantized groups kept as blocks, random ones for --synthetic models -- and the activations'
// share of the pre-flight check (gpu_create.cu).
#include <stdlib.h>
#include <string.h>

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
// take as blocks -- Q4_0 rows not whole 64-weight units -- is widened to bf16), for the share c of
// m's layers a GPU holds (its columns: W_o's and W_down's are split between the GPUs).
static void layer_dts(const Model *m, const Config *c, uint32_t l, uint32_t dt[4]) {
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

// Bytes of the four groups of layer l (c: the share a GPU holds).
static size_t layer_mat_bytes(const Model *m, const Config *c, uint32_t l) {
    size_t hd = c->head_dim, dim = c->dim, q = c->n_heads * hd, kv = c->n_kv_heads * hd, h = c->hidden_dim;
    uint32_t dt[4];
    layer_dts(m, c, l, dt);
    return mat_bytes(dt[0], q + 2 * kv, dim) + mat_bytes(dt[1], dim, q) + mat_bytes(dt[2], 2 * h, dim) + mat_bytes(dt[3], dim, h);
}

Config shard_config(const Config *c, int n) {
    Config s = *c;
    s.n_heads /= n, s.n_kv_heads /= n, s.hidden_dim /= n;
    return s;
}

const char *shard_refusal(const Model *m, int n) {
    static const char *names[4] = {"W_q/W_k/W_v", "W_o", "W_gate/W_up", "W_down"};
    static char why[256];
    const Config *c = &m->c;
    if (n < 2) return NULL;
    if (c->n_kv_heads % n) {
        snprintf(why, sizeof why, "its %u KV heads do not divide between %d GPUs", c->n_kv_heads, n);
        return why;
    }
    if (c->hidden_dim % (8u * n) || c->vocab_size % n) {
        snprintf(why, sizeof why, "its FFN (%u) or vocabulary (%u) does not divide between %d GPUs in whole rows of 8", c->hidden_dim, c->vocab_size, n);
        return why;
    }
    Config s = shard_config(c, n);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        uint32_t whole[4], part[4];
        layer_dts(m, c, l, whole), layer_dts(m, &s, l, part);
        for (int k = 0; k < 4; k++)
            if (whole[k] != part[k]) {
                snprintf(why, sizeof why, "layer %u's %s in %s splits into columns that are not whole blocks", l, names[k], dtype_name(whole[k]));
                return why;
            }
    }
    return NULL;
}

size_t gpu_model_step_bytes(const Model *m, int n) {
    Config s = shard_config(&m->c, n);
    const Config *c = &s;
    size_t b = mat_bytes(head_dt(m), c->vocab_size / n, c->dim);
    for (uint32_t l = 0; l < c->n_layers; l++) b += layer_mat_bytes(m, c, l);
    return b;
}

size_t gpu_model_weight_bytes(const Model *m, int n) {
    Config s = shard_config(&m->c, n);
    const Config *c = &s;
    size_t hd = c->head_dim, dim = c->dim, q = c->n_heads * hd, kv = c->n_kv_heads * hd, h = c->hidden_dim, vocab = c->vocab_size;
    // The embedding whole on every GPU, the head's share in bf16 (prefill's logits; a tied head is the embedding's rows)
    size_t b = vocab * dim * 2 + (c->tied_embeddings ? 0 : vocab / n * dim * 2) + dim * 4, deq = 0;
    if (dtype_is_quant(head_dt(m))) b += mat_bytes(head_dt(m), vocab / n, dim);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        uint32_t dt[4];
        layer_dts(m, c, l, dt);
        b += layer_mat_bytes(m, c, l) + (2 * dim + 2 * hd) * 4;
        size_t big[4] = {(q + 2 * kv) * dim, dim * q, 2 * h * dim, dim * h};
        for (int k = 0; k < 4; k++)
            if (dtype_is_quant(dt[k]) && big[k] * 2 > deq) deq = big[k] * 2;
    }
    return b + deq;
}

// A block of a host matrix: rows [row0, row0 + rows) and columns [col0, col0 + cols) of a matrix of
// src_cols columns (a GPU's share of it; all of it on one GPU).
typedef struct {
    const void *src;
    uint32_t dtype;
    size_t src_cols, row0, rows, col0, cols;
} Slice;

static Slice whole(const void *src, uint32_t dtype, size_t rows, size_t cols) { return (Slice){src, dtype, cols, 0, rows, 0, cols}; }

// Copies a slice in dtype (f32, bf16, or blocks: widened) to device bf16 at dst, with the given
// row pitch (in elements) so rows can be interleaved.
static cudaError_t upload_matrix(bf16 *dst, size_t dst_pitch, Slice m) {
    size_t cols = m.cols;
    if (m.dtype == DTYPE_BF16)
        return cudaMemcpy2D(dst, dst_pitch * 2, (const uint16_t *)m.src + m.row0 * m.src_cols + m.col0, m.src_cols * 2, cols * 2, m.rows,
                            cudaMemcpyHostToDevice);
    size_t R = 256;
    float *wide = (float *)malloc(R * m.src_cols * 4);
    uint16_t *staging = (uint16_t *)malloc(R * cols * 2);
    cudaError_t e = wide && staging ? cudaSuccess : cudaErrorMemoryAllocation;
    for (size_t r0 = 0; r0 < m.rows && e == cudaSuccess; r0 += R) {
        size_t n = m.rows - r0 < R ? m.rows - r0 : R;
        weights_rows_to_f32(m.src, m.dtype, m.row0 + r0, n, m.src_cols, wide);
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < cols; j++) staging[i * cols + j] = f32_to_bf16(wide[i * m.src_cols + m.col0 + j]);
        e = cudaMemcpy2D(dst + r0 * dst_pitch, dst_pitch * 2, staging, cols * 2, cols * 2, n, cudaMemcpyHostToDevice);
    }
    free(wide), free(staging);
    return e;
}

// A slice of a matrix of GGML blocks as a (rows, cols) matrix of its own: a pointer into src when
// it is whole rows, else its rows' blocks copied into *tmp (freed by the caller; NULL: none).
static const void *block_slice(Slice m, void **tmp) {
    size_t rb = dtype_row_bytes(m.dtype, m.src_cols), sb = dtype_row_bytes(m.dtype, m.cols), off = dtype_row_bytes(m.dtype, m.col0);
    const uint8_t *first = (const uint8_t *)m.src + m.row0 * rb;
    *tmp = NULL;
    if (m.cols == m.src_cols) return first;
    uint8_t *t = (uint8_t *)malloc(m.rows * sb);
    if (!t) return NULL;
    for (size_t r = 0; r < m.rows; r++) memcpy(t + r * sb, first + r * rb + off, sb);
    *tmp = t;
    return t;
}

// Random bf16 weights as the slice of a matrix of src_cols columns: element (i, j) of the whole
// matrix is hash(seed, i src_cols + j) whatever the split, so the GPUs' shares together are one
// GPU's matrix.
static cudaError_t fill_slice(bf16 *dst, size_t dst_pitch, Slice m, unsigned long long seed, float scale, cudaStream_t st) {
    return fill_random_bf16_2d(dst, dst_pitch, m.rows, m.cols, m.src_cols, m.row0, m.col0, seed, scale, st);
}

// A group kept quantized: members[i] (slices of GGML blocks, as many rows as src_rows[i]) become
// rows row0[i] + k * step[i] of q.
static cudaError_t upload_qgroup(QMat *q, uint32_t dt, size_t rows, size_t cols, int n, const Slice *members, const size_t *src_rows,
                                 const size_t *row0, const size_t *step) {
    q->dt = dt, q->rows = (int)rows, q->cols = (int)cols;
    size_t qb = qmat_qs_bytes(dt, rows, cols), mb = qmat_meta_bytes(dt, rows, cols);
    CU_TRY(cudaMalloc(&q->qs, qb));
    CU_TRY(cudaMalloc(&q->meta, mb));
    if (!members) return cudaSuccess; // synthetic: filled on the device
    int8_t *hq = (int8_t *)malloc(qb);
    uint8_t *hm = (uint8_t *)malloc(mb);
    cudaError_t e = hq && hm ? cudaSuccess : cudaErrorMemoryAllocation;
    for (int i = 0; i < n && e == cudaSuccess; i++) {
        void *tmp;
        const void *src = block_slice(members[i], &tmp);
        if (!src) e = cudaErrorMemoryAllocation;
        else qmat_repack_rows(dt, (const uint8_t *)src, src_rows[i], cols, row0[i], step[i], hq, hm);
        free(tmp);
    }
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
    const Config *c = &g->c, *C = &m->c; // this GPU's share, the whole model
    size_t hd = c->head_dim, dim = c->dim, q = c->n_heads * hd, kv = c->n_kv_heads * hd, h = c->hidden_dim;
    size_t Q = C->n_heads * hd, KV = C->n_kv_heads * hd, H = C->hidden_dim; // whole
    size_t r = (size_t)g->shard.rank, vocab = c->vocab_size, v0 = (size_t)g->vocab0, vn = (size_t)g->vocab_n;
    int synthetic = m->token_embd == NULL;
    cudaError_t e = cudaSuccess;
    unsigned long long seed = 1234;
    size_t deq = 0; // elements of the largest quantized matrix
#define TRY(call)                       \
    do {                                \
        e = (call);                     \
        if (e != cudaSuccess) goto out; \
    } while (0)
    // The embedding whole on every GPU (any token's row); the head's rows [v0, v0 + vn).
    TRY(cudaMalloc(&g->embd, vocab * dim * 2));
    if (synthetic) TRY(fill_random_bf16(g->embd, vocab * dim, seed++, 1.0f, 0.0f, g->st));
    else TRY(upload_matrix(g->embd, dim, whole(m->token_embd, m->token_embd_dt, vocab, dim)));
    if (c->tied_embeddings) {
        g->head = g->embd + v0 * dim;
    } else {
        Slice hs = {m->output, m->output_dt, dim, v0, vn, 0, dim};
        TRY(cudaMalloc(&g->head, vn * dim * 2));
        if (synthetic) TRY(fill_slice(g->head, dim, hs, seed++, sqrtf(3.0f / dim), g->st));
        else TRY(upload_matrix(g->head, dim, hs));
    }
    if (dtype_is_quant(head_dt(m))) { // the decode step's head reads the blocks
        size_t zero = 0, unit = 1;
        Slice src = {c->tied_embeddings ? m->token_embd : m->output, head_dt(m), dim, v0, vn, 0, dim};
        TRY(upload_qgroup(&g->qhead, head_dt(m), vn, dim, 1, synthetic ? NULL : &src, &vn, &zero, &unit));
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
        layer_dts(m, c, l, dt);
        size_t rows[4] = {q + 2 * kv, dim, 2 * h, dim}, cols[4] = {dim, q, dim, h};
        QMat *qm[4] = {&w->qqkv, &w->qo, &w->qgu, &w->qdown};
        bf16 **bm[4] = {&w->wqkv, &w->wo, &w->wgu, &w->wdown};
        for (int k = 0; k < 4; k++) {
            if (dtype_is_quant(dt[k])) {
                if (rows[k] * cols[k] > deq) deq = rows[k] * cols[k];
                if (synthetic) { // each GPU's blocks drawn apart: a split quantized synthetic model is not one GPU's (timing only)
                    TRY(upload_qgroup(qm[k], dt[k], rows[k], cols[k], 0, NULL, NULL, NULL, NULL));
                    TRY(qmat_fill_random(qm[k], seed++ + 977 * r, sqrtf(3.0f / (k == 1 ? Q : k == 3 ? H : dim)), g->st));
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
        // This GPU's rows of W_q, W_k, W_v (its heads), rows of W_gate, W_up (its hidden units), and
        // the matching columns of W_o and W_down. As slices of the whole matrices; a synthetic
        // model's W_q, W_k, W_v are one matrix (rows Q + 2 KV) as one GPU makes it.
        const void *src[7] = {NULL};
        uint32_t sdt[7] = {0};
        if (!synthetic) {
            const void *s7[7] = {lw->wq, lw->wk, lw->wv, lw->wo, lw->w_gate, lw->w_up, lw->w_down};
            uint32_t d7[7] = {lw->wq_dt, lw->wk_dt, lw->wv_dt, lw->wo_dt, lw->w_gate_dt, lw->w_up_dt, lw->w_down_dt};
            memcpy(src, s7, sizeof src), memcpy(sdt, d7, sizeof sdt);
        }
        Slice sq = {src[0], sdt[0], dim, r * q, q, 0, dim}, sk = {src[1], sdt[1], dim, r * kv, kv, 0, dim},
              sv = {src[2], sdt[2], dim, r * kv, kv, 0, dim}, so = {src[3], sdt[3], Q, 0, dim, r * q, q},
              sg = {src[4], sdt[4], dim, r * h, h, 0, dim}, su = {src[5], sdt[5], dim, r * h, h, 0, dim},
              sd = {src[6], sdt[6], H, 0, dim, r * h, h};
        if (synthetic) { // uniform with variance 1/n keeps activations at unit scale
            float a = sqrtf(3.0f / dim), ah = sqrtf(3.0f / H), aq = sqrtf(3.0f / Q);
            if (w->wqkv) { // rows of the one (Q + 2 KV, dim) matrix
                unsigned long long s1 = seed++;
                sk.row0 += Q, sv.row0 += Q + KV;
                TRY(fill_slice(w->wqkv, dim, sq, s1, a, g->st));
                TRY(fill_slice(w->wqkv + q * dim, dim, sk, s1, a, g->st));
                TRY(fill_slice(w->wqkv + (q + kv) * dim, dim, sv, s1, a, g->st));
            }
            if (w->wo) TRY(fill_slice(w->wo, q, so, seed++, aq, g->st));
            if (w->wgu) { // rows 2i (gate) and 2i + 1 (up) of one (2 H, dim) matrix: this GPU's are contiguous
                Slice gu = {NULL, 0, dim, 2 * r * h, 2 * h, 0, dim};
                TRY(fill_slice(w->wgu, dim, gu, seed++, a, g->st));
            }
            if (w->wdown) TRY(fill_slice(w->wdown, h, sd, seed++, ah, g->st));
            TRY(fill_random_f32(w->attn_norm, dim, seed++, 0.1f, 1.0f, g->st));
            TRY(fill_random_f32(w->ffn_norm, dim, seed++, 0.1f, 1.0f, g->st));
            if (c->qk_norm) {
                TRY(fill_random_f32(w->q_norm, hd, seed++, 0.1f, 1.0f, g->st));
                TRY(fill_random_f32(w->k_norm, hd, seed++, 0.1f, 1.0f, g->st));
            }
        } else {
            if (w->wqkv) {
                TRY(upload_matrix(w->wqkv, dim, sq));
                TRY(upload_matrix(w->wqkv + q * dim, dim, sk));
                TRY(upload_matrix(w->wqkv + (q + kv) * dim, dim, sv));
            } else {
                Slice s3[3] = {sq, sk, sv};
                size_t n[3] = {q, kv, kv}, r0[3] = {0, q, q + kv}, st[3] = {1, 1, 1};
                TRY(upload_qgroup(&w->qqkv, dt[0], q + 2 * kv, dim, 3, s3, n, r0, st));
            }
            if (w->wo) TRY(upload_matrix(w->wo, q, so));
            else {
                size_t n = dim, r0 = 0, st = 1;
                TRY(upload_qgroup(&w->qo, dt[1], dim, q, 1, &so, &n, &r0, &st));
            }
            if (w->wgu) {
                TRY(upload_matrix(w->wgu, 2 * dim, sg));
                TRY(upload_matrix(w->wgu + dim, 2 * dim, su));
            } else {
                Slice s2[2] = {sg, su};
                size_t n[2] = {h, h}, r0[2] = {0, 1}, st[2] = {2, 2};
                TRY(upload_qgroup(&w->qgu, dt[2], 2 * h, dim, 2, s2, n, r0, st));
            }
            if (w->wdown) TRY(upload_matrix(w->wdown, h, sd));
            else {
                size_t n = dim, r0 = 0, st = 1;
                TRY(upload_qgroup(&w->qdown, dt[3], dim, h, 1, &sd, &n, &r0, &st));
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
    if (g->head < g->embd || g->head >= g->embd + (size_t)g->c.vocab_size * g->c.dim) cudaFree(g->head); // a tied head is rows of the embedding
    qmat_free(&g->qhead), cudaFree(g->wdeq);
    cudaFree(g->embd), cudaFree(g->out_norm), cudaFree(g->inv_freq);
    g->head = g->embd = g->wdeq = NULL, g->out_norm = g->inv_freq = NULL;
}
