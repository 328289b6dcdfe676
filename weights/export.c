// ./export SRC out.bin [--dtype bf16|f32]
// SRC is a Hugging Face checkpoint directory or a GGUF file. Writes model.bin (model/modelfile.h).
#include "../model/errmsg.h"
#include "../model/guard.h"
#include "../model/modelfile.h"
#include "../model/version.h"
#include "../tokenizer/tokenizer.h"
#include "gguf.h"
#include "hf_config.h"
#include "safetensors.h"
#include "tokenizer_import.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ERR_LEN 512

// Fills err with a one-line message (names from the source file may hold any byte); returns -1.
#define efail(err, ...) err_fail(err, ERR_LEN, __VA_ARGS__)

// Where tensors come from: fills out (rows*cols floats) with the tensor named in model.bin terms.
typedef struct {
    int is_gguf;
    StModel st;
    GgufFile gg;
    const Config *c;
} Source;

// model.bin name → Hugging Face name.
static void hf_name(const char *name, char *out, size_t n) {
    unsigned l;
    char suffix[32];
    static const char *map[][2] = {
        {"attn_norm", "input_layernorm"}, {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},
        {"attn_v", "self_attn.v_proj"}, {"attn_output", "self_attn.o_proj"}, {"attn_q_norm", "self_attn.q_norm"},
        {"attn_k_norm", "self_attn.k_norm"}, {"ffn_norm", "post_attention_layernorm"}, {"ffn_gate", "mlp.gate_proj"},
        {"ffn_up", "mlp.up_proj"}, {"ffn_down", "mlp.down_proj"}};
    if (sscanf(name, "blk.%u.%31s", &l, suffix) == 2) {
        for (size_t i = 0; i < sizeof map / sizeof *map; i++)
            if (strcmp(suffix, map[i][0]) == 0) {
                snprintf(out, n, "model.layers.%u.%s.weight", l, map[i][1]);
                return;
            }
    }
    if (strcmp(name, "token_embd") == 0) snprintf(out, n, "model.embed_tokens.weight");
    else if (strcmp(name, "output_norm") == 0) snprintf(out, n, "model.norm.weight");
    else if (strcmp(name, "output") == 0) snprintf(out, n, "lm_head.weight");
    else snprintf(out, n, "%s", name);
}

// GGUF's llama converter permutes Q and K rows per head from HF's rotate-half order
// (half, pair) to interleaved (pair, half). Undo it so one RoPE serves every source.
static void unpermute_rows(float *w, uint64_t rows, uint64_t cols, uint32_t head_dim, float *tmp) {
    uint64_t half = head_dim / 2;
    for (uint64_t h = 0; h < rows / head_dim; h++) {
        float *blk = w + h * head_dim * cols;
        memcpy(tmp, blk, head_dim * cols * sizeof(float));
        for (uint64_t i = 0; i < half; i++)
            for (uint64_t s = 0; s < 2; s++)
                memcpy(blk + (s * half + i) * cols, tmp + (2 * i + s) * cols, cols * sizeof(float));
    }
}

static int fetch(Source *src, const char *name, uint64_t rows, uint64_t cols, float *out, char *err) {
    uint64_t want = rows * cols;
    if (!src->is_gguf) {
        char hn[128];
        hf_name(name, hn, sizeof hn);
        const StTensor *t = st_find(&src->st, hn);
        if (!t) return efail(err, "checkpoint has no tensor '%s'", hn), -1;
        uint64_t r = t->ndim >= 1 ? t->shape[0] : 1, cl = t->ndim == 2 ? t->shape[1] : 1;
        if (t->n_elems != want || t->ndim > 2 || r != rows || cl != cols)
            return efail(err, "tensor '%s' has shape [%llu, %llu], the configuration needs [%llu, %llu]", hn,
                            (unsigned long long)r, (unsigned long long)cl, (unsigned long long)rows,
                            (unsigned long long)cols), -1;
        st_to_f32(t, out);
        return 0;
    }
    char gn[128];
    snprintf(gn, sizeof gn, "%s.weight", name);
    const GgufTensor *t = gguf_tensor(&src->gg, gn);
    if (!t) return efail(err, "GGUF file has no tensor '%s'", gn), -1;
    int shape_ok = t->ndim == 1 ? (t->ne[0] == rows && cols == 1) : (t->ndim == 2 && t->ne[0] == cols && t->ne[1] == rows);
    if (t->n_elems != want || !shape_ok)
        return efail(err, "tensor '%s' has shape [%llu, %llu], the configuration needs [%llu, %llu]", gn,
                        (unsigned long long)t->ne[1], (unsigned long long)t->ne[0], (unsigned long long)rows,
                        (unsigned long long)cols), -1;
    if (gguf_dequantize(t, out, err) != 0) return -1;
    int is_q = strstr(name, "attn_q") && !strstr(name, "norm"), is_k = strstr(name, "attn_k") && !strstr(name, "norm");
    if (src->c->arch == ARCH_LLAMA && (is_q || is_k)) {
        float *tmp = malloc(src->c->head_dim * cols * sizeof(float));
        if (!tmp) return efail(err, "out of memory"), -1;
        unpermute_rows(out, rows, cols, src->c->head_dim, tmp);
        free(tmp);
    }
    return 0;
}

// ---- GGUF configuration ----

// An optional GGUF integer: 0 with *out when present and a whole number in [0, max], 1 when
// absent, -1 (err filled) when present but not that: a bad value is refused, never truncated.
static int gguf_uint(const GgufFile *g, const char *key, uint64_t max, uint64_t *out, char *err) {
    double d;
    if (!gguf_find(g, key)) return 1;
    if (gguf_get_f64(g, key, &d) != 0 || !(d >= 0 && d <= (double)max) || d != floor(d))
        return efail(err, "GGUF metadata '%s' is not a whole number in [0, %llu]", key, (unsigned long long)max);
    *out = (uint64_t)d;
    return 0;
}

static int gguf_config(const GgufFile *g, Config *c, char *err) {
    memset(c, 0, sizeof *c);
    char *arch = gguf_get_str(g, "general.architecture");
    if (!arch) return efail(err, "GGUF file has no general.architecture"), -1;
    if (strcmp(arch, "llama") != 0 && strcmp(arch, "qwen3") != 0) {
        efail(err, "GGUF architecture '%s' is not supported (supported: llama, qwen3)", arch);
        free(arch);
        return -1;
    }
    c->arch = strcmp(arch, "qwen3") == 0 ? ARCH_QWEN3 : ARCH_LLAMA;
    char key[128];
    uint64_t v = 0;
    double f;
#define GET_U(field, suffix)                                                                        \
    snprintf(key, sizeof key, "%s.%s", arch, suffix);                                               \
    if (gguf_uint(g, key, UINT32_MAX, &v, err) != 0) {                                              \
        if (!gguf_find(g, key)) efail(err, "GGUF file lacks '%s'", key);                            \
        free(arch);                                                                                 \
        return -1;                                                                                  \
    }                                                                                               \
    c->field = (uint32_t)v;
    GET_U(n_layers, "block_count");
    GET_U(dim, "embedding_length");
    GET_U(hidden_dim, "feed_forward_length");
    GET_U(n_heads, "attention.head_count");
    GET_U(max_seq_len, "context_length");
#undef GET_U
    snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
    int r = gguf_uint(g, key, UINT32_MAX, &v, err);
    c->n_kv_heads = r == 0 ? (uint32_t)v : c->n_heads;
    snprintf(key, sizeof key, "%s.attention.key_length", arch);
    int r2 = r < 0 ? r : gguf_uint(g, key, UINT32_MAX, &v, err);
    c->head_dim = r2 == 0 ? (uint32_t)v : (c->n_heads ? c->dim / c->n_heads : 0);
    if (r2 < 0) {
        free(arch);
        return -1;
    }
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    c->norm_eps = gguf_get_f64(g, key, &f) == 0 ? (float)f : 1e-5f;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    c->rope_theta = gguf_get_f64(g, key, &f) == 0 ? (float)f : 10000.0f;
    const GgufTensor *emb = gguf_tensor(g, "token_embd.weight");
    if (!emb || emb->ndim != 2) {
        free(arch);
        return efail(err, "GGUF file has no 2-D token_embd.weight"), -1;
    }
    c->vocab_size = (uint32_t)emb->ne[1];
    c->qk_norm = c->arch == ARCH_QWEN3;
    c->tied_embeddings = gguf_tensor(g, "output.weight") == NULL;
    if (gguf_tensor(g, "rope_freqs.weight")) c->rope_scaling = ROPE_SCALING_FREQ_FACTORS;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    char *st = gguf_get_str(g, key);
    int bad_scaling = st && strcmp(st, "none") != 0;
    free(st);
    free(arch);
    if (bad_scaling) return efail(err, "GGUF RoPE scaling type is not supported"), -1;
    c->weight_dtype = DTYPE_BF16;
    return 0;
}

static int gguf_tokenizer(const GgufFile *g, TokenizerSpec *s, char *err) {
    GgufTokenizerMeta m = {0};
    char **tokens = NULL, **merges = NULL;
    int32_t *types = NULL;
    int rc = -1;
    long nt = gguf_get_str_array(g, "tokenizer.ggml.tokens", &tokens);
    long nm = gguf_get_str_array(g, "tokenizer.ggml.merges", &merges);
    long ny = gguf_get_i32_array(g, "tokenizer.ggml.token_type", &types);
    m.model = gguf_get_str(g, "tokenizer.ggml.model");
    m.pre = gguf_get_str(g, "tokenizer.ggml.pre");
    m.chat_template = gguf_get_str(g, "tokenizer.chat_template");
    uint64_t v = 0;
    if (nt <= 0 || !m.model) {
        efail(err, "GGUF file has no tokenizer (tokenizer.ggml.model / tokens missing)");
        goto out;
    }
    if (ny >= 0 && ny != nt) {
        efail(err, "GGUF tokenizer: %ld token types for %ld tokens", ny, nt);
        goto out;
    }
    if (nt > (1 << 24) || nm > INT_MAX) { // the counts become ints below
        efail(err, "GGUF tokenizer: %ld tokens and %ld merges are too many", nt, nm);
        goto out;
    }
    m.n_tokens = (int)nt;
    m.tokens = (const char *const *)tokens;
    m.token_types = ny >= 0 ? types : NULL;
    m.n_merges = nm > 0 ? (int)nm : 0;
    m.merges = (const char *const *)merges;
    int r = gguf_uint(g, "tokenizer.ggml.bos_token_id", INT_MAX, &v, err);
    if (r < 0) goto out;
    m.bos_id = r == 0 ? (int)v : -1;
    // Extra end-of-turn ids some converters add (e.g. <|eot_id|>, <|im_end|>).
    static const char *eos_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
    int ids[3], n_ids = 0;
    for (int i = 0; i < 3; i++) {
        if ((r = gguf_uint(g, eos_keys[i], INT_MAX, &v, err)) < 0) goto out;
        int dup = r != 0;
        for (int k = 0; k < n_ids; k++) dup |= ids[k] == (int)v;
        if (!dup) ids[n_ids++] = (int)v;
    }
    m.n_eos = n_ids;
    m.eos_ids = ids;
    if ((r = gguf_uint(g, "tokenizer.ggml.add_bos_token", 1, &v, err)) < 0) goto out;
    m.add_bos = r == 0 ? (int)v : -1;
    rc = tokspec_from_gguf(s, &m, err);
out:
    for (long i = 0; i < nt; i++) free(tokens[i]);
    for (long i = 0; i < nm; i++) free(merges[i]);
    free(tokens);
    free(merges);
    free(types);
    free((char *)m.model);
    free((char *)m.pre);
    free((char *)m.chat_template);
    return rc;
}

// ---- writing ----

typedef struct {
    Source *src;
    ModelWriter *w;
    char *err;
    int failed;
    uint64_t done, total;
    int shown; // last percentage printed
    float *buf;
    uint64_t buf_cap;
} WriteCtx;

static void count_bytes(const char *name, uint32_t dtype, uint32_t ndim, uint64_t rows, uint64_t cols, void *p) {
    (void)name, (void)ndim;
    ((WriteCtx *)p)->total += rows * cols * dtype_size(dtype);
}

static void write_one(const char *name, uint32_t dtype, uint32_t ndim, uint64_t rows, uint64_t cols, void *p) {
    WriteCtx *wc = p;
    if (wc->failed) return;
    uint64_t n = rows * (ndim == 2 ? cols : 1);
    if (n > wc->buf_cap) {
        free(wc->buf);
        wc->buf = malloc(n * sizeof(float));
        wc->buf_cap = wc->buf ? n : 0;
        if (!wc->buf) {
            efail(wc->err, "out of memory for tensor '%s' (%llu floats)", name, (unsigned long long)n);
            wc->failed = 1;
            return;
        }
    }
    if (fetch(wc->src, name, rows, ndim == 2 ? cols : 1, wc->buf, wc->err) != 0 ||
        modelwriter_add(wc->w, name, wc->buf, wc->err) != 0) {
        wc->failed = 1;
        return;
    }
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(wc->buf[i])) {
            efail(wc->err, "tensor '%s' holds a non-finite value at element %llu", name, (unsigned long long)i);
            wc->failed = 1;
            return;
        }
    wc->done += n * dtype_size(dtype);
    int pct = (int)(100.0 * (double)wc->done / (double)wc->total);
    if (pct / 5 != wc->shown / 5) { // a line each 5%: readable in a terminal and in a log
        fprintf(stderr, "export: %3d%% (%s)\n", pct, name);
        wc->shown = pct;
    }
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: ./export SRC out.bin [--dtype bf16|f32]\n"
            "  SRC: a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json)\n"
            "       or a GGUF v3 file (llama or qwen3; F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,\n"
            "       Q2_K..Q6_K tensors, dequantized)\n"
            "  --dtype: how matrices are stored (default bf16; norms are always f32)\n"
            "  --version, -h/--help\n");
}

int main(int argc, char **argv) {
    const char *src_path = NULL, *out_path = NULL;
    uint32_t dtype = DTYPE_BF16;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("export %s (model.bin format %d)\n", PKV_VERSION, MODEL_VERSION);
            return 0;
        } else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
            const char *d = argv[++i];
            if (strcmp(d, "bf16") == 0) dtype = DTYPE_BF16;
            else if (strcmp(d, "f32") == 0) dtype = DTYPE_F32;
            else {
                fprintf(stderr, "error: --dtype must be bf16 or f32, not '%s'\n", d);
                return 1;
            }
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 1;
        } else if (!src_path) src_path = argv[i];
        else if (!out_path) out_path = argv[i];
        else {
            usage(stderr);
            return 1;
        }
    }
    if (!src_path || !out_path) {
        usage(stderr);
        return 1;
    }
    // A source truncated while mapped, or Ctrl-C: a one-line error and no partial output left.
    guard_install(1);
    char err[ERR_LEN] = "";
    struct stat st;
    if (stat(src_path, &st) != 0) {
        fprintf(stderr, "error: '%s' does not exist\n", src_path);
        return 1;
    }
    Source src = {0};
    Config c;
    TokenizerSpec spec = {0};
    src.is_gguf = !S_ISDIR(st.st_mode);
    int ok;
    if (src.is_gguf) {
        ok = gguf_open(&src.gg, src_path, err) == 0;
        if (ok) ok = gguf_config(&src.gg, &c, err) == 0 && gguf_tokenizer(&src.gg, &spec, err) == 0;
    } else {
        ok = hf_read_config(src_path, &c, err) == 0 && tokspec_from_hf_dir(&spec, src_path, err) == 0 &&
             st_open_dir(&src.st, src_path, err) == 0;
    }
    if (ok) {
        c.weight_dtype = dtype;
        if (c.tied_embeddings == 0 && !src.is_gguf && !st_find(&src.st, "lm_head.weight") &&
            st_find(&src.st, "model.embed_tokens.weight"))
            c.tied_embeddings = 1; // checkpoints that tie the head often omit lm_head.weight
        ok = config_validate(&c, err) == 0;
        if (ok && (uint32_t)spec.n_tokens > c.vocab_size) {
            efail(err, "tokenizer has %d tokens but the model's vocabulary is %u", spec.n_tokens, c.vocab_size);
            ok = 0;
        }
    }
    // Serialize the tokenizer into memory, then write everything.
    char *tok = NULL;
    size_t tok_size = 0;
    if (ok) {
        FILE *mem = open_memstream(&tok, &tok_size);
        ok = mem && tokenizer_write(mem, &spec, err) == 0;
        if (mem) fclose(mem);
    }
    ModelWriter *w = ok ? modelwriter_create(out_path, &c, tok, tok_size, err) : NULL;
    if (w) {
        c.weight_dtype = dtype;
        WriteCtx wc = {&src, w, err, 0, 0, 0, 0, NULL, 0};
        src.c = &c;
        model_tensor_list(&c, count_bytes, &wc);
        model_tensor_list(&c, write_one, &wc);
        free(wc.buf);
        if (wc.failed) {
            modelwriter_abort(w);
            ok = 0;
        } else {
            ok = modelwriter_finish(w, err) == 0;
        }
        if (ok)
            fprintf(stderr, "export: wrote %s (%s, %u layers, dim %u, vocab %u, %.1f MB of weights)\n", out_path,
                    c.arch == ARCH_QWEN3 ? "qwen3" : "llama", c.n_layers, c.dim, c.vocab_size, (double)wc.total / 1e6);
    } else {
        ok = 0;
    }
    free(tok);
    tokspec_free(&spec);
    if (src.is_gguf) gguf_close(&src.gg);
    else st_close(&src.st);
    if (!ok) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    return 0;
}
