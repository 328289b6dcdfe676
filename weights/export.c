// ./export SRC out.bin [--dtype bf16|f32|keep] [--quant q8_0|q4_k]
// SRC is a Hugging Face checkpoint directory or a GGUF file. Writes model.bin (model/modelfile.h).
#include "../model/errmsg.h"
#include "../model/guard.h"
#include "../model/modelfile.h"
#include "../model/quant.h"
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
// (half, pair) to interleaved (pair, half). Undo it so one RoPE serves every source. Rows are
// row_bytes each: floats, or a quantized row's blocks (rows never share a block).
static void unpermute_rows(uint8_t *w, uint64_t rows, uint64_t row_bytes, uint32_t head_dim, uint8_t *tmp) {
    uint64_t half = head_dim / 2;
    for (uint64_t h = 0; h < rows / head_dim; h++) {
        uint8_t *blk = w + h * head_dim * row_bytes;
        memcpy(tmp, blk, head_dim * row_bytes);
        for (uint64_t i = 0; i < half; i++)
            for (uint64_t s = 0; s < 2; s++)
                memcpy(blk + (s * half + i) * row_bytes, tmp + (2 * i + s) * row_bytes, row_bytes);
    }
}

// Un-permutes a GGUF llama tensor's rows in place when it is Q or K.
static int unpermute_if_qk(const Source *src, const char *name, void *data, uint64_t rows, uint64_t row_bytes, char *err) {
    int is_q = strstr(name, "attn_q") && !strstr(name, "norm"), is_k = strstr(name, "attn_k") && !strstr(name, "norm");
    if (src->c->arch != ARCH_LLAMA || !(is_q || is_k)) return 0;
    uint8_t *tmp = malloc(src->c->head_dim * row_bytes);
    if (!tmp) return efail(err, "out of memory"), -1;
    unpermute_rows(data, rows, row_bytes, src->c->head_dim, tmp);
    free(tmp);
    return 0;
}

// The GGUF tensor for a model.bin name, its shape checked against the configuration's.
static const GgufTensor *gguf_lookup(const Source *src, const char *name, uint64_t rows, uint64_t cols, char *err) {
    char gn[128];
    snprintf(gn, sizeof gn, "%s.weight", name);
    const GgufTensor *t = gguf_tensor(&src->gg, gn);
    if (!t) return efail(err, "GGUF file has no tensor '%s'", gn), NULL;
    int shape_ok = t->ndim == 1 ? (t->ne[0] == rows && cols == 1) : (t->ndim == 2 && t->ne[0] == cols && t->ne[1] == rows);
    if (t->n_elems != rows * cols || !shape_ok)
        return efail(err, "tensor '%s' has shape [%llu, %llu], the configuration needs [%llu, %llu]", gn,
                     (unsigned long long)t->ne[1], (unsigned long long)t->ne[0], (unsigned long long)rows,
                     (unsigned long long)cols), NULL;
    return t;
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
    const GgufTensor *t = gguf_lookup(src, name, rows, cols, err);
    if (!t || gguf_dequantize(t, out, err) != 0) return -1;
    return unpermute_if_qk(src, name, out, rows, cols * sizeof(float), err);
}

// A GGUF tensor's blocks as they are (its type is `dtype`'s, checked by the caller), Q/K rows
// un-permuted: out holds rows * dtype_row_bytes(dtype, cols) bytes.
static int fetch_raw(Source *src, const char *name, uint32_t dtype, uint64_t rows, uint64_t cols, uint8_t *out, char *err) {
    const GgufTensor *t = gguf_lookup(src, name, rows, cols, err);
    if (!t) return -1;
    uint64_t rb = dtype_row_bytes(dtype, cols);
    if (rb == 0 || t->nbytes != rows * rb) return efail(err, "internal: '%s' is not whole %s blocks", name, dtype_name(dtype)), -1;
    memcpy(out, t->data, t->nbytes);
    return unpermute_if_qk(src, name, out, rows, rb, err);
}

// The model.bin dtype of a GGUF type kept as it is, or -1 (it is dequantized).
static int kept_dtype(uint32_t ggml_type) {
    switch (ggml_type) {
    case GGML_Q8_0: return DTYPE_Q8_0;
    case GGML_Q4_K: return DTYPE_Q4_K;
    case GGML_Q4_0: return DTYPE_Q4_0;
    case GGML_Q6_K: return DTYPE_Q6_K;
    case GGML_Q4_1: return DTYPE_Q4_1;
    case GGML_Q5_0: return DTYPE_Q5_0;
    case GGML_Q5_1: return DTYPE_Q5_1;
    case GGML_Q5_K: return DTYPE_Q5_K;
    default: return -1;
    }
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

// What each tensor is stored as: the configuration's dtype (f32 vectors, bf16 / f32 matrices),
// or, for a matrix, Q8_0 / Q4_K blocks (--quant, or a GGUF's own, of any type but Q2_K / Q3_K, under --dtype keep).
typedef struct {
    const Source *src;
    int keep;      // --dtype keep: a GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K matrices stay as they are
    int quant;     // --quant: DTYPE_Q8_0 or DTYPE_Q4_K, or -1
    uint32_t *dtypes;
    int i;
    uint64_t total; // bytes of tensor data, for the progress lines
} PlanCtx;

// The GGUF type of a tensor, or -1 (not a GGUF source, or no such tensor: fetch says so later).
static int gguf_type_of(const Source *src, const char *name) {
    char gn[128];
    snprintf(gn, sizeof gn, "%s.weight", name);
    const GgufTensor *t = src->is_gguf ? gguf_tensor(&src->gg, gn) : NULL;
    return t ? (int)t->type : -1;
}

static void plan_one(const char *name, uint32_t dtype, uint32_t ndim, uint64_t rows, uint64_t cols, void *p) {
    PlanCtx *pc = p;
    uint32_t dt = dtype;
    if (ndim == 2 && pc->quant >= 0) {
        uint32_t target = (uint32_t)pc->quant;
        // The embedding / LM head gets 8 bits under either target: the head's errors go straight
        // into the logits (llama.cpp's presets keep it at 6 bits or more too). So does a matrix
        // whose rows are not whole 256-weight super-blocks (SmolLM2's 576-wide ones).
        int embd_or_head = strcmp(name, "token_embd") == 0 || strcmp(name, "output") == 0;
        if (target == DTYPE_Q4_K && (embd_or_head || dtype_row_bytes(target, cols) == 0)) target = DTYPE_Q8_0;
        if (dtype_row_bytes(target, cols) != 0) dt = target; // else (rows not whole 32-blocks) as configured
    } else if (ndim == 2 && pc->keep) {
        int k = kept_dtype((uint32_t)gguf_type_of(pc->src, name));
        if (k >= 0 && dtype_row_bytes((uint32_t)k, cols) != 0) dt = (uint32_t)k;
    }
    pc->dtypes[pc->i++] = dt;
    pc->total += rows * dtype_row_bytes(dt, ndim == 2 ? cols : 1);
}

typedef struct {
    Source *src;
    ModelWriter *w;
    char *err;
    int failed;
    uint64_t done, total;
    int shown; // last percentage printed
    float *buf;
    uint64_t buf_cap;
    uint8_t *raw;
    uint64_t raw_cap;
} WriteCtx;

// Grows *buf to n bytes; 0 or -1.
static int reserve(void **buf, uint64_t *cap, uint64_t n) {
    if (n <= *cap) return 0;
    free(*buf);
    *buf = malloc(n);
    *cap = *buf ? n : 0;
    return *buf ? 0 : -1;
}

static void write_one(const char *name, uint32_t dtype, uint32_t ndim, uint64_t rows, uint64_t cols, void *p) {
    (void)dtype; // the plan's, in the writer's entry, is what counts
    WriteCtx *wc = p;
    if (wc->failed) return;
    const TensorEntry *e = modelwriter_next(wc->w);
    if (!e) return;
    uint32_t dt = e->dtype;
    cols = ndim == 2 ? cols : 1;
    uint64_t n = rows * cols;
    if (reserve((void **)&wc->buf, &wc->buf_cap, n * sizeof(float)) != 0) {
        efail(wc->err, "out of memory for tensor '%s' (%llu floats)", name, (unsigned long long)n);
        wc->failed = 1;
        return;
    }
    // Every tensor is read as floats first, also one kept as blocks: that checks its values.
    if (fetch(wc->src, name, rows, cols, wc->buf, wc->err) != 0) {
        wc->failed = 1;
        return;
    }
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(wc->buf[i])) {
            efail(wc->err, "tensor '%s' holds a non-finite value at element %llu", name, (unsigned long long)i);
            wc->failed = 1;
            return;
        }
    // A GGUF tensor already in the dtype it is stored in is copied as it is.
    int type = gguf_type_of(wc->src, name);
    uint64_t nbytes = rows * dtype_row_bytes(dt, cols);
    if (dtype_is_quant(dt) && type >= 0 && kept_dtype((uint32_t)type) == (int)dt) {
        if (reserve((void **)&wc->raw, &wc->raw_cap, nbytes) != 0) {
            efail(wc->err, "out of memory for tensor '%s' (%llu bytes)", name, (unsigned long long)nbytes);
            wc->failed = 1;
            return;
        }
        wc->failed = fetch_raw(wc->src, name, dt, rows, cols, wc->raw, wc->err) != 0 ||
                     modelwriter_add_raw(wc->w, name, wc->raw, wc->err) != 0;
    } else {
        wc->failed = modelwriter_add(wc->w, name, wc->buf, wc->err) != 0;
    }
    if (wc->failed) return;
    wc->done += nbytes;
    int pct = (int)(100.0 * (double)wc->done / (double)wc->total);
    if (pct / 5 != wc->shown / 5) { // a line each 5%: readable in a terminal and in a log
        fprintf(stderr, "export: %3d%% (%s)\n", pct, name);
        wc->shown = pct;
    }
}

// "q4_k x30 + q8_0 x155" for the closing line.
static const char *quant_census(const uint32_t *dtypes, int n) {
    static char buf[96];
    static const uint32_t order[] = {DTYPE_Q4_K, DTYPE_Q4_0, DTYPE_Q4_1, DTYPE_Q5_K, DTYPE_Q5_0, DTYPE_Q5_1, DTYPE_Q6_K, DTYPE_Q8_0};
    size_t at = 0;
    buf[0] = 0;
    for (int k = 0; k < (int)(sizeof order / sizeof order[0]); k++) {
        int c = 0;
        for (int i = 0; i < n; i++) c += dtypes[i] == order[k];
        if (c && at < sizeof buf) at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%s x%d", at ? " + " : "", dtype_name(order[k]), c);
    }
    return buf;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: ./export SRC out.bin [--dtype bf16|f32|keep] [--quant q8_0|q4_k]\n"
            "  SRC: a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json)\n"
            "       or a GGUF v3 file (llama or qwen3; F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,\n"
            "       Q2_K..Q6_K tensors)\n"
            "  --dtype: how matrices are stored (default bf16; norms are always f32); keep: a GGUF's\n"
            "           Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K matrices stay as they are\n"
            "           (quantized), Q2_K and Q3_K ones become bf16\n"
            "  --quant: matrices quantized to Q8_0, or Q4_K (the embedding / LM head and rows that are\n"
            "           not whole 256-weight blocks: Q8_0); a GGUF's tensors already so are copied\n"
            "  Quantized matrices run as blocks on the CPU and the GPU (decode multiplies them by\n"
            "  activations quantized per 32, as llama.cpp does); the GPU widens Q6_K, Q4_1, Q5_0,\n"
            "  Q5_1 and Q5_K to bf16.\n"
            "  --version, -h/--help\n");
}

int main(int argc, char **argv) {
    const char *src_path = NULL, *out_path = NULL;
    uint32_t dtype = DTYPE_BF16;
    int keep = 0, quant = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("export %s (model.bin format %d, commit %s)\n", PKV_VERSION, MODEL_VERSION, PKV_COMMIT);
            return 0;
        } else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
            const char *d = argv[++i];
            if (strcmp(d, "bf16") == 0) dtype = DTYPE_BF16, keep = 0;
            else if (strcmp(d, "f32") == 0) dtype = DTYPE_F32, keep = 0;
            else if (strcmp(d, "keep") == 0) dtype = DTYPE_BF16, keep = 1;
            else {
                fprintf(stderr, "error: --dtype must be bf16, f32 or keep, not '%s'\n", d);
                return 1;
            }
        } else if (strcmp(argv[i], "--quant") == 0 && i + 1 < argc) {
            const char *q = argv[++i];
            if (strcmp(q, "q8_0") == 0) quant = DTYPE_Q8_0;
            else if (strcmp(q, "q4_k") == 0) quant = DTYPE_Q4_K;
            else {
                fprintf(stderr, "error: --quant must be q8_0 or q4_k, not '%s'\n", q);
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
    if (keep && quant >= 0) {
        fprintf(stderr, "error: --dtype keep and --quant: give one (--quant copies a GGUF's tensors already in its type)\n");
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
    // Each tensor's dtype, decided before anything is written (the writer sizes the file from it).
    uint32_t *dtypes = ok ? calloc((size_t)model_tensor_list(&c, NULL, NULL), sizeof(uint32_t)) : NULL;
    PlanCtx pc = {&src, keep, quant, dtypes, 0, 0};
    if (ok && !dtypes) ok = 0, efail(err, "out of memory");
    if (ok) src.c = &c, model_tensor_list(&c, plan_one, &pc);
    ModelWriter *w = ok ? modelwriter_create(out_path, &c, tok, tok_size, dtypes, err) : NULL;
    if (w) {
        WriteCtx wc = {&src, w, err, 0, 0, pc.total, 0, NULL, 0, NULL, 0};
        model_tensor_list(&c, write_one, &wc);
        free(wc.buf);
        free(wc.raw);
        if (wc.failed) {
            modelwriter_abort(w);
            ok = 0;
        } else {
            ok = modelwriter_finish(w, err) == 0;
        }
        int n_quant = 0;
        for (int i = 0; i < pc.i; i++) n_quant += dtype_is_quant(dtypes[i]);
        if (ok)
            fprintf(stderr, "export: wrote %s (%s, %u layers, dim %u, vocab %u, %.1f MB of weights%s%s)\n", out_path,
                    c.arch == ARCH_QWEN3 ? "qwen3" : "llama", c.n_layers, c.dim, c.vocab_size, (double)wc.total / 1e6,
                    n_quant ? ", quantized: " : "", n_quant ? quant_census(dtypes, pc.i) : "");
    } else {
        ok = 0;
    }
    free(dtypes);
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
