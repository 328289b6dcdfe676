// The forward pass of Llama 3 and Qwen 3, written once over the backend's operations.
#include "model.h"
#include "pool.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include "errmsg.h"
#include "quant.h"
#include "sampler.h"
#include "../attention/recall.h"

#define fail(err, ...) err_fail(err, MODEL_ERR_LEN, __VA_ARGS__)

void rope_inv_freq(const Config *c, const float *rope_freqs, float *inv_freq) {
    int half = (int)c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        // As transformers computes it: theta ^ -(2i / head_dim), in fp32.
        float f = (float)(1.0 / pow((double)c->rope_theta, (double)(2 * i) / (double)c->head_dim));
        if (c->rope_scaling == ROPE_SCALING_FREQ_FACTORS) {
            f = f / rope_freqs[i];
        } else if (c->rope_scaling == ROPE_SCALING_LLAMA3) {
            // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, a smooth blend between.
            float low_wavelen = (float)c->rope_orig_ctx / c->rope_low_freq;
            float high_wavelen = (float)c->rope_orig_ctx / c->rope_high_freq;
            float wavelen = 2.0f * (float)M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / c->rope_factor;
            } else if (wavelen >= high_wavelen) {
                float smooth = ((float)c->rope_orig_ctx / wavelen - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
                f = (1.0f - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

int model_load(Model *m, const char *path, char *err) {
    memset(m, 0, sizeof *m);
    if (modelfile_open(&m->file, path, err) != 0) return -1;
    m->c = m->file.header->config;
    const Config *c = &m->c;
    m->layers = calloc(c->n_layers, sizeof(LayerWeights));
    m->inv_freq = malloc(c->head_dim / 2 * sizeof(float));
    if (!m->layers || !m->inv_freq) {
        model_free(m);
        return fail(err, "out of memory");
    }
    // modelfile_open checked every tensor's presence, dtype and shape, so lookups cannot fail.
    const ModelFile *f = &m->file;
    m->token_embd = modelfile_tensor(f, "token_embd");
    m->token_embd_dt = modelfile_entry(f, "token_embd")->dtype;
    m->output_norm = modelfile_tensor(f, "output_norm");
    m->output = c->tied_embeddings ? m->token_embd : modelfile_tensor(f, "output");
    m->output_dt = c->tied_embeddings ? m->token_embd_dt : modelfile_entry(f, "output")->dtype;
    char name[TENSOR_NAME_LEN];
    for (uint32_t l = 0; l < c->n_layers; l++) {
        LayerWeights *w = &m->layers[l];
#define GET(field, suffix) snprintf(name, sizeof name, "blk.%u." suffix, l), w->field = modelfile_tensor(f, name)
#define GETM(field, suffix) GET(field, suffix), w->field##_dt = modelfile_entry(f, name)->dtype
        GET(attn_norm, "attn_norm");
        GETM(wq, "attn_q");
        GETM(wk, "attn_k");
        GETM(wv, "attn_v");
        GET(q_norm, "attn_q_norm");
        GET(k_norm, "attn_k_norm");
        GETM(wo, "attn_output");
        GET(ffn_norm, "ffn_norm");
        GETM(w_gate, "ffn_gate");
        GETM(w_up, "ffn_up");
        GETM(w_down, "ffn_down");
#undef GETM
#undef GET
    }
    for (uint32_t i = 0; i < f->header->n_tensors; i++) m->n_quantized += dtype_is_quant(f->tensors[i].dtype);
    rope_inv_freq(c, modelfile_tensor(f, "rope_freqs"), m->inv_freq);
    m->be = &backend_cpu;
    return 0;
}

int model_synthetic(Model *m, const char *name) {
    memset(m, 0, sizeof *m);
    m->file.fd = -1; // no file behind it
    Config *c = &m->c;
    c->rope_scaling = ROPE_SCALING_NONE;
    c->norm_eps = 1e-6f;
    c->weight_dtype = DTYPE_BF16;
    m->token_embd_dt = m->output_dt = DTYPE_BF16; // the layers' are on the device only
    m->synthetic_dt = DTYPE_BF16;
    c->head_dim = 128;
    c->n_kv_heads = 8;
    if (strcmp(name, "llama3.1-8b") == 0) {
        c->arch = ARCH_LLAMA, c->n_layers = 32, c->dim = 4096, c->n_heads = 32, c->hidden_dim = 14336;
        c->vocab_size = 128256, c->max_seq_len = 131072, c->rope_theta = 500000.0f, c->norm_eps = 1e-5f;
        c->rope_scaling = ROPE_SCALING_LLAMA3, c->rope_factor = 8, c->rope_low_freq = 1, c->rope_high_freq = 4;
        c->rope_orig_ctx = 8192;
    } else if (strcmp(name, "llama3.1-70b") == 0) { // bf16 140 GB: two GPUs (--gpus 2; H200s) or --quant
        c->arch = ARCH_LLAMA, c->n_layers = 80, c->dim = 8192, c->n_heads = 64, c->hidden_dim = 28672;
        c->vocab_size = 128256, c->max_seq_len = 131072, c->rope_theta = 500000.0f, c->norm_eps = 1e-5f;
        c->rope_scaling = ROPE_SCALING_LLAMA3, c->rope_factor = 8, c->rope_low_freq = 1, c->rope_high_freq = 4;
        c->rope_orig_ctx = 8192;
    } else if (strcmp(name, "qwen3-8b") == 0) {
        c->arch = ARCH_QWEN3, c->n_layers = 36, c->dim = 4096, c->n_heads = 32, c->hidden_dim = 12288;
        c->vocab_size = 151936, c->max_seq_len = 131072, c->rope_theta = 1000000.0f, c->qk_norm = 1;
    } else if (strcmp(name, "qwen3-0.6b") == 0) {
        c->arch = ARCH_QWEN3, c->n_layers = 28, c->dim = 1024, c->n_heads = 16, c->hidden_dim = 3072;
        c->vocab_size = 151936, c->max_seq_len = 131072, c->rope_theta = 1000000.0f, c->qk_norm = 1;
        c->tied_embeddings = 1;
    } else {
        return -1;
    }
    m->inv_freq = malloc(c->head_dim / 2 * sizeof(float));
    if (!m->inv_freq) return -1;
    rope_inv_freq(c, NULL, m->inv_freq);
    m->be = &backend_cpu;
    return 0;
}

const char *model_weights_desc(const Model *m, char *buf, size_t n) {
    int count[DTYPE_COUNT] = {0}, kinds = 0;
    const ModelFile *f = &m->file;
    if (!f->header) return snprintf(buf, n, "%s", dtype_name(m->c.weight_dtype)), buf;
    for (uint32_t i = 0; i < f->header->n_tensors; i++)
        if (f->tensors[i].ndim == 2 && f->tensors[i].dtype < DTYPE_COUNT) kinds += count[f->tensors[i].dtype]++ == 0;
    static const uint32_t order[] = {DTYPE_Q4_K, DTYPE_Q4_0, DTYPE_Q4_1, DTYPE_Q5_K, DTYPE_Q5_0, DTYPE_Q5_1, // what the file is, first
                                     DTYPE_Q6_K, DTYPE_Q8_0, DTYPE_BF16, DTYPE_F32};
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < DTYPE_COUNT; i++) {
        uint32_t dt = order[i];
        if (!count[dt] || at >= n) continue;
        if (kinds == 1) at += (size_t)snprintf(buf + at, n - at, "%s", dtype_name(dt));
        else at += (size_t)snprintf(buf + at, n - at, "%s%s x%d", at ? " + " : "", dtype_name(dt), count[dt]);
    }
    return buf;
}

void model_free(Model *m) {
    free(m->layers);
    free(m->inv_freq);
    modelfile_close(&m->file);
    memset(m, 0, sizeof *m);
}

size_t run_state_bytes(const Config *c, int ctx, int chunk) {
    size_t q = (size_t)c->n_heads * c->head_dim, kv = (size_t)c->n_kv_heads * c->head_dim;
    size_t wide = q > c->dim ? q : c->dim;
    size_t per_tok = 2 * (size_t)c->dim + wide + q + 2 * (size_t)c->hidden_dim + c->vocab_size;
    return sizeof(float) * ((size_t)chunk * per_tok + 2 * (size_t)c->n_layers * (size_t)ctx * kv +
                            attention_dense_scratch(&pool_parallel, (int)c->n_heads, (int)c->n_kv_heads, (int)c->head_dim, ctx));
}

int run_state_init(RunState *s, const Model *m, int ctx, int chunk, int all_logits, char *err) {
    return run_state_init_attn(s, m, ctx, chunk, all_logits, NULL, err);
}

int run_state_init_attn(RunState *s, const Model *m, int ctx, int chunk, int all_logits, const struct AttnConfig *attn, char *err) {
    memset(s, 0, sizeof *s);
    const Config *c = &m->c;
    s->be = m->be;
    s->ctx = ctx;
    s->chunk = chunk;
    if (m->be->create) {
        s->dev = m->be->create(m, ctx, chunk, all_logits, attn, err);
        return s->dev ? 0 : -1;
    }
    size_t need = run_state_bytes(c, ctx, chunk);
    struct sysinfo si;
    if (sysinfo(&si) == 0) {
        double avail = ((double)si.freeram + (double)si.bufferram) * si.mem_unit;
        FILE *mi = fopen("/proc/meminfo", "r");
        if (mi) { // MemAvailable counts reclaimable page cache too
            char line[256];
            unsigned long long kb;
            while (fgets(line, sizeof line, mi))
                if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = (double)kb * 1024.0;
            fclose(mi);
        }
        if ((double)need > avail)
            return fail(err, "context %d needs %.2f GiB for the KV cache and activations, but only %.2f GiB of memory is available: lower --ctx",
                        ctx, (double)need / (1 << 30), avail / (1 << 30));
    }
    size_t q = (size_t)c->n_heads * c->head_dim, kv = (size_t)c->n_kv_heads * c->head_dim;
    size_t wide = q > c->dim ? q : c->dim, T = (size_t)chunk;
    s->x = calloc(T * c->dim, sizeof(float));
    s->xb = calloc(T * wide, sizeof(float));
    s->xb2 = calloc(T * c->dim, sizeof(float));
    s->q = calloc(T * q, sizeof(float));
    s->hb = calloc(T * c->hidden_dim, sizeof(float));
    s->hb2 = calloc(T * c->hidden_dim, sizeof(float));
    s->logits = calloc(T * c->vocab_size, sizeof(float));
    s->att_scratch = calloc(attention_dense_scratch(&pool_parallel, (int)c->n_heads, (int)c->n_kv_heads, (int)c->head_dim, ctx), sizeof(float));
    s->key_cache = calloc((size_t)c->n_layers * (size_t)ctx * kv, sizeof(float));
    s->value_cache = calloc((size_t)c->n_layers * (size_t)ctx * kv, sizeof(float));
    if (!s->x || !s->xb || !s->xb2 || !s->q || !s->hb || !s->hb2 || !s->logits || !s->att_scratch || !s->key_cache || !s->value_cache) {
        run_state_free(s);
        return fail(err, "out of memory allocating %.2f GiB for context %d", (double)need / (1 << 30), ctx);
    }
    return 0;
}

void run_state_free(RunState *s) {
    if (s->dev) s->be->destroy(s->dev);
    free(s->x);
    free(s->xb);
    free(s->xb2);
    free(s->q);
    free(s->hb);
    free(s->hb2);
    free(s->logits);
    free(s->att_scratch);
    free(s->key_cache);
    free(s->value_cache);
    free(s->pen);
    memset(s, 0, sizeof *s);
}

// The PKV_RECALL measurement (attention/recall.h) after a decode step's attention in layer l:
// per KV head, Recall@k of what the policy selected for the query at pos.
static void recall_step(const Model *m, RunState *s, int l, int pos, const float *k_cache) {
    const AttnConfig *a = attn_policy_config(s->attn);
    if (!a || a->method == ATTN_FULL || attn_is_dense(a, pos)) return; // any selector: ParisKV, and the peers as known answers
    const Config *c = &m->c;
    int hd = (int)c->head_dim, G = (int)(c->n_heads / c->n_kv_heads), kv_dim = (int)c->n_kv_heads * hd, S = a->sink;
    int nz = attn_zone_end(a, pos) - S;
    int *sel = malloc(((size_t)a->topk + 16) * sizeof(int));
    float *qbar = malloc((size_t)hd * sizeof(float)), *scratch = malloc((size_t)recall_scratch_floats(nz, a->topk) * sizeof(float));
    for (int h = 0; sel && qbar && scratch && h < (int)c->n_kv_heads; h++) {
        const float *qg = s->q + (size_t)h * G * hd;
        int nsel = attn_policy_select(s->attn, l, h, qg, pos, 0, 0, sel);
        if (nsel < 0) continue;
        for (int i = 0; i < nsel; i++) sel[i] -= S; // positions to zone slots
        for (int j = 0; j < hd; j++) {
            float t = 0.0f;
            for (int g = 0; g < G; g++) t += qg[g * hd + j];
            qbar[j] = t / (float)G;
        }
        double r = recall_at_k(qbar, k_cache + (size_t)S * kv_dim + (size_t)h * hd, kv_dim, nz, hd, a->topk, sel, nsel, scratch);
        fprintf(recall_file(), "%d %d %d %.6f\n", pos, l, h, r);
    }
    free(sel), free(qbar), free(scratch);
}

static float *forward(const Model *m, RunState *s, const int *tokens, int T, int pos, int all_logits, char *err) {
    if (s->dev) return s->be->forward(s->dev, tokens, T, pos, all_logits, err);
    const Config *c = &m->c;
    const Backend *be = m->be;
    int dim = (int)c->dim, hd = (int)c->head_dim, hidden = (int)c->hidden_dim;
    int q_dim = (int)c->n_heads * hd, kv_dim = (int)c->n_kv_heads * hd;

    be->embed(s->x, m->token_embd, m->token_embd_dt, tokens, T, dim);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const LayerWeights *w = &m->layers[l];
        size_t layer_off = (size_t)l * (size_t)s->ctx * (size_t)kv_dim;
        // K and V of these tokens go straight into their cache rows.
        float *k = s->key_cache + layer_off + (size_t)pos * kv_dim;
        float *v = s->value_cache + layer_off + (size_t)pos * kv_dim;

        be->rmsnorm(s->xb, s->x, w->attn_norm, T, dim, c->norm_eps);
        be->matmul(s->q, s->xb, w->wq, w->wq_dt, T, dim, q_dim);
        be->matmul(k, s->xb, w->wk, w->wk_dt, T, dim, kv_dim);
        be->matmul(v, s->xb, w->wv, w->wv_dt, T, dim, kv_dim);
        if (c->qk_norm) { // Qwen3: RMSNorm over each head before RoPE
            be->rmsnorm(s->q, s->q, w->q_norm, T * (int)c->n_heads, hd, c->norm_eps);
            be->rmsnorm(k, k, w->k_norm, T * (int)c->n_kv_heads, hd, c->norm_eps);
        }
        be->rope(s->q, m->inv_freq, pos, T, (int)c->n_heads, hd);
        be->rope(k, m->inv_freq, pos, T, (int)c->n_kv_heads, hd);

        if (s->attn) {
            s->attn->attend(s->attn, (int)l, s->xb, s->q, s->key_cache + layer_off, s->value_cache + layer_off, pos, T,
                            (int)c->n_heads, (int)c->n_kv_heads, hd, s->att_scratch);
            if (T == 1 && recall_file()) recall_step(m, s, (int)l, pos, s->key_cache + layer_off);
        }
        else
            attention_dense(&pool_parallel, s->xb, s->q, s->key_cache + layer_off, s->value_cache + layer_off, pos, T,
                            (int)c->n_heads, (int)c->n_kv_heads, hd, s->att_scratch);
        be->matmul(s->xb2, s->xb, w->wo, w->wo_dt, T, q_dim, dim);
        be->add(s->x, s->xb2, (long)T * dim);

        be->rmsnorm(s->xb, s->x, w->ffn_norm, T, dim, c->norm_eps);
        be->matmul(s->hb, s->xb, w->w_gate, w->w_gate_dt, T, dim, hidden);
        be->matmul(s->hb2, s->xb, w->w_up, w->w_up_dt, T, dim, hidden);
        be->swiglu(s->hb, s->hb2, (long)T * hidden);
        be->matmul(s->xb2, s->hb, w->w_down, w->w_down_dt, T, hidden, dim);
        be->add(s->x, s->xb2, (long)T * dim);
    }
    // Only the rows whose logits are wanted go through the final norm and the head.
    int first = all_logits ? 0 : T - 1, n = T - first;
    be->rmsnorm(s->xb, s->x + (size_t)first * dim, m->output_norm, n, dim, c->norm_eps);
    be->matmul(s->logits, s->xb, m->output, m->output_dt, n, dim, (int)c->vocab_size);
    return s->logits;
}

// The pass, then a check of what it produced: a NaN or infinity in the logits (damaged weights,
// an overflow) would otherwise be sampled as if it were a distribution.
float *model_forward(const Model *m, RunState *s, const int *tokens, int T, int pos, int all_logits, char *err) {
    ThreadTuner *tt = s->threads && !s->dev ? &s->threads[T > 1] : NULL;
    if (tt) tuner_begin(tt);
    float *logits = forward(m, s, tokens, T, pos, all_logits, err);
    if (tt) tuner_end(tt, T);
    if (!logits) return NULL;
    size_t n = (size_t)(all_logits ? T : 1) * m->c.vocab_size;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(logits[i])) {
            int at = pos + (all_logits ? (int)(i / m->c.vocab_size) : T - 1);
            fail(err, "the model produced a non-finite logit (%g, token id %zu) at position %d: its weights are damaged or the computation overflowed",
                 (double)logits[i], i % m->c.vocab_size, at);
            return NULL;
        }
    return logits;
}

int model_decode_sample(const Model *m, RunState *s, Sampler *smp, int token, int pos, const int *hist, int n_hist, char *err) {
    const Backend *be = s->be;
    if (s->dev && be->decode_sample) {
        if (s->sampling != smp) { // its settings go into the device's step once
            if (be->sample_config(s->dev, smp, err) != 0) return -1;
            s->sampling = smp;
        }
        int n_pen = 0;
        if (smp->count) {
            if (!s->pen && !(s->pen = malloc(2 * (size_t)smp->n_valid * sizeof(int)))) {
                fail(err, "out of memory");
                return -1;
            }
            n_pen = sampler_penalty_list(smp, hist, n_hist, s->pen, s->pen + smp->n_valid);
        }
        float u = smp->temperature > 0.0f ? sampler_uniform(smp) : 0.0f;
        return be->decode_sample(s->dev, token, pos, u, s->pen, s->pen ? s->pen + smp->n_valid : NULL, n_pen, err);
    }
    float *logits = model_forward(m, s, &token, 1, pos, 0, err);
    if (!logits) return -1;
    sampler_penalize(smp, logits, hist, n_hist);
    return sampler_sample(smp, logits);
}
