// model.bin: the tensor list, validation, mapping and writing.
#include "modelfile.h"
#include "errmsg.h"
#include "guard.h"
#include "bf16.h"
#include "quant.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define fail(err, ...) err_fail(err, MODEL_ERR_LEN, __VA_ARGS__)

int model_tensor_list(const Config *c, TensorVisitor fn, void *ctx) {
    uint32_t wd = c->weight_dtype, hd = c->head_dim;
    uint64_t q = (uint64_t)c->n_heads * hd, kv = (uint64_t)c->n_kv_heads * hd;
    char name[TENSOR_NAME_LEN];
    int n = 0;
#define T(nm, dt, nd, r, cl) (fn ? fn(nm, dt, nd, r, cl, ctx) : (void)0), n++
    T("token_embd", wd, 2, c->vocab_size, c->dim);
    if (c->rope_scaling == ROPE_SCALING_FREQ_FACTORS) T("rope_freqs", DTYPE_F32, 1, hd / 2, 1);
    for (uint32_t l = 0; l < c->n_layers; l++) {
#define L(suffix, dt, nd, r, cl) snprintf(name, sizeof name, "blk.%u." suffix, l), T(name, dt, nd, r, cl)
        L("attn_norm", DTYPE_F32, 1, c->dim, 1);
        L("attn_q", wd, 2, q, c->dim);
        L("attn_k", wd, 2, kv, c->dim);
        L("attn_v", wd, 2, kv, c->dim);
        if (c->qk_norm) {
            L("attn_q_norm", DTYPE_F32, 1, hd, 1);
            L("attn_k_norm", DTYPE_F32, 1, hd, 1);
        }
        L("attn_output", wd, 2, c->dim, q);
        L("ffn_norm", DTYPE_F32, 1, c->dim, 1);
        L("ffn_gate", wd, 2, c->hidden_dim, c->dim);
        L("ffn_up", wd, 2, c->hidden_dim, c->dim);
        L("ffn_down", wd, 2, c->dim, c->hidden_dim);
#undef L
    }
    T("output_norm", DTYPE_F32, 1, c->dim, 1);
    if (!c->tied_embeddings) T("output", wd, 2, c->vocab_size, c->dim);
#undef T
    return n;
}

// The sampler takes these as they are (a NaN temperature would wreck it): the ranges ./run's own
// --temp --top-p --min-p --top-k accept.
int config_sampling_valid(const Config *c) {
    if (!c->has_gen_defaults) return 1;
    return c->has_gen_defaults == 1 && c->gen_do_sample <= 1 && c->gen_temperature >= 0 && c->gen_temperature <= 100 &&
           c->gen_top_p >= 0 && c->gen_top_p <= 1 && c->gen_min_p >= 0 && c->gen_min_p <= 1 && c->gen_top_k >= 0;
}

int config_validate(const Config *c, char *err) {
#define CHECK(cond, ...) if (!(cond)) return fail(err, __VA_ARGS__)
    CHECK(c->arch == ARCH_LLAMA || c->arch == ARCH_QWEN3, "unknown architecture id %u", c->arch);
    CHECK(c->n_layers >= 1 && c->n_layers <= 512, "bad layer count %u", c->n_layers);
    CHECK(c->dim >= 1 && c->dim <= 65536, "bad hidden size %u", c->dim);
    CHECK(c->n_heads >= 1 && c->n_heads <= 1024, "bad head count %u", c->n_heads);
    CHECK(c->n_kv_heads >= 1 && c->n_heads % c->n_kv_heads == 0,
          "KV head count %u does not divide head count %u", c->n_kv_heads, c->n_heads);
    CHECK(c->head_dim >= 2 && c->head_dim <= 1024 && c->head_dim % 2 == 0, "bad head_dim %u", c->head_dim);
    CHECK(c->hidden_dim >= 1 && c->hidden_dim <= 1u << 20, "bad FFN size %u", c->hidden_dim);
    CHECK(c->vocab_size >= 1 && c->vocab_size <= 1u << 22, "bad vocabulary size %u", c->vocab_size);
    CHECK(c->max_seq_len >= 1 && c->max_seq_len <= 1u << 30, "bad maximum context %u", c->max_seq_len);
    CHECK(c->norm_eps > 0 && c->norm_eps < 1, "bad RMSNorm epsilon %g", c->norm_eps);
    CHECK(c->rope_theta > 1, "bad RoPE theta %g", c->rope_theta);
    CHECK(c->rope_scaling <= ROPE_SCALING_FREQ_FACTORS, "unknown RoPE scaling %u", c->rope_scaling);
    if (c->rope_scaling == ROPE_SCALING_LLAMA3)
        CHECK(c->rope_factor >= 1 && c->rope_high_freq > c->rope_low_freq && c->rope_low_freq > 0 && c->rope_orig_ctx > 0,
              "bad llama3 RoPE scaling (factor %g, low %g, high %g, original context %u)",
              c->rope_factor, c->rope_low_freq, c->rope_high_freq, c->rope_orig_ctx);
    CHECK(c->weight_dtype == DTYPE_F32 || c->weight_dtype == DTYPE_BF16, "unknown weight dtype %u", c->weight_dtype);
    CHECK(c->qk_norm <= 1 && c->tied_embeddings <= 1, "bad flags");
    CHECK(config_sampling_valid(c), "bad sampling defaults (temperature %g, top-p %g, min-p %g, top-k %d)",
          c->gen_temperature, c->gen_top_p, c->gen_min_p, c->gen_top_k);
#undef CHECK
    return 0;
}

// ---- reading ----

typedef struct {
    const ModelFile *mf;
    char *err;
    int index, bad;
} CheckCtx;

// May a tensor that the configuration expects in `want` be stored in `got`? A matrix of a
// format-2 file may be quantized (model/quant.h), when its rows are whole blocks.
static int dtype_allowed(uint32_t version, uint32_t want, uint32_t got, uint32_t ndim, uint64_t cols) {
    if (got == want) return 1;
    return version >= 2 && ndim == 2 && dtype_is_quant(got) && dtype_row_bytes(got, cols) != 0;
}

static void check_tensor(const char *name, uint32_t dtype, uint32_t ndim, uint64_t rows, uint64_t cols, void *p) {
    CheckCtx *cc = p;
    if (cc->bad) return;
    const TensorEntry *t = &cc->mf->tensors[cc->index++];
    if (memchr(t->name, 0, TENSOR_NAME_LEN) == NULL || strcmp(t->name, name) != 0) {
        cc->bad = fail(cc->err, "tensor %d: expected '%s', found '%.*s'", cc->index - 1, name, TENSOR_NAME_LEN, t->name);
        return;
    }
    uint64_t want_cols = ndim == 2 ? cols : 1;
    uint32_t version = cc->mf->header->version;
    if (!dtype_allowed(version, dtype, t->dtype, ndim, want_cols) || t->ndim != ndim || t->shape[0] != rows ||
        (ndim == 2 && t->shape[1] != want_cols)) {
        char alt[64] = "";
        if (version >= 2 && ndim == 2) snprintf(alt, sizeof alt, " (or a quantized dtype with whole blocks)");
        cc->bad = fail(cc->err, "tensor '%s': expected dtype %s%s shape [%llu, %llu], found dtype %u (%s) shape [%llu, %llu]",
                       name, dtype_name(dtype), alt, (unsigned long long)rows, (unsigned long long)want_cols, t->dtype,
                       dtype_name(t->dtype), (unsigned long long)t->shape[0], (unsigned long long)(t->ndim == 2 ? t->shape[1] : 1));
        return;
    }
    // rows * row bytes cannot overflow: rows and cols are bounded by config_validate.
    uint64_t nbytes = rows * dtype_row_bytes(t->dtype, want_cols);
    if (t->nbytes != nbytes || t->offset % MODEL_ALIGN != 0 || t->offset > cc->mf->size || nbytes > cc->mf->size - t->offset) {
        cc->bad = fail(cc->err, "tensor '%s': data (offset %llu, %llu bytes) lies outside the %zu-byte file",
                       name, (unsigned long long)t->offset, (unsigned long long)t->nbytes, cc->mf->size);
    }
}

int modelfile_open(ModelFile *mf, const char *path, char *err) {
    memset(mf, 0, sizeof *mf);
    mf->fd = -1;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); // O_NONBLOCK: a FIFO cannot hang us
    if (fd < 0) return fail(err, "cannot open model file '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(err, "'%s' is not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    if (size < sizeof(FileHeader)) {
        close(fd);
        return fail(err, "'%s' is not a model file: %zu bytes is smaller than the header", path, size);
    }
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return fail(err, "cannot map '%s': %s", path, strerror(errno));
    }
    mf->data = p;
    mf->size = size;
    mf->fd = fd;
    guard_map(p, size, path);
    const FileHeader *h = p;
    mf->header = h;
    int rc = -1;
    if (memcmp(h->magic, MODEL_MAGIC, 8) != 0) {
        fail(err, "'%s' is not a model file (bad magic; convert checkpoints with ./export)", path);
    } else if (h->version < MODEL_VERSION_MIN || h->version > MODEL_VERSION) {
        fail(err, "'%s' has format version %u, this runner reads versions %u to %u: re-export it", path, h->version,
             MODEL_VERSION_MIN, MODEL_VERSION);
    } else if (h->header_size != sizeof(FileHeader)) {
        fail(err, "'%s': header size %u, expected %zu", path, h->header_size, sizeof(FileHeader));
    } else if (h->file_size != size) {
        fail(err, "'%s' is truncated or damaged: header says %llu bytes, file has %zu", path,
             (unsigned long long)h->file_size, size);
    } else if (config_validate(&h->config, err) != 0) {
        // err already says what
    } else if (h->tokenizer_offset > size || h->tokenizer_size > size - h->tokenizer_offset) {
        fail(err, "'%s': tokenizer section lies outside the file", path);
    } else if (h->n_tensors != (uint32_t)model_tensor_list(&h->config, NULL, NULL)) {
        fail(err, "'%s': %u tensors, the configuration needs %d", path, h->n_tensors, model_tensor_list(&h->config, NULL, NULL));
    } else if (h->tensors_offset % 8 != 0 || h->tensors_offset > size ||
               (uint64_t)h->n_tensors * sizeof(TensorEntry) > size - h->tensors_offset) {
        fail(err, "'%s': tensor table lies outside the file", path);
    } else {
        mf->tensors = (const TensorEntry *)(mf->data + h->tensors_offset);
        CheckCtx cc = {mf, err, 0, 0};
        model_tensor_list(&h->config, check_tensor, &cc);
        rc = cc.bad ? -1 : 0;
    }
    if (rc != 0) modelfile_close(mf);
    return rc;
}

void modelfile_close(ModelFile *mf) {
    if (mf->data) guard_unmap(mf->data), munmap((void *)mf->data, mf->size);
    if (mf->fd >= 0) close(mf->fd);
    memset(mf, 0, sizeof *mf);
    mf->fd = -1;
}

const TensorEntry *modelfile_entry(const ModelFile *mf, const char *name) {
    for (uint32_t i = 0; i < mf->header->n_tensors; i++)
        if (strcmp(mf->tensors[i].name, name) == 0) return &mf->tensors[i];
    return NULL;
}

const void *modelfile_tensor(const ModelFile *mf, const char *name) {
    const TensorEntry *t = modelfile_entry(mf, name);
    return t ? mf->data + t->offset : NULL;
}

// ---- writing ----

struct ModelWriter {
    FILE *f;
    char *path, *tmp_path;
    FileHeader h;
    TensorEntry *entries;
    int n, next;
    uint64_t pos;
    uint64_t total; // the finished file's size
};

typedef struct {
    TensorEntry *entries;
    const uint32_t *dtypes;
    int i, bad, quantized;
} FillCtx;

static void fill_entry(const char *name, uint32_t dtype, uint32_t ndim, uint64_t rows, uint64_t cols, void *p) {
    FillCtx *fc = p;
    TensorEntry *t = &fc->entries[fc->i];
    uint32_t dt = fc->dtypes ? fc->dtypes[fc->i] : dtype;
    fc->i++;
    snprintf(t->name, TENSOR_NAME_LEN, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    t->shape[0] = rows;
    t->shape[1] = ndim == 2 ? cols : 1;
    t->nbytes = rows * dtype_row_bytes(dt, t->shape[1]);
    if (!dtype_allowed(MODEL_VERSION, dtype, dt, ndim, t->shape[1])) fc->bad = 1;
    fc->quantized |= dtype_is_quant(dt);
}

static int write_zeros(FILE *f, uint64_t n) {
    static const char zeros[4096];
    while (n > 0) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        if (fwrite(zeros, 1, k, f) != k) return -1;
        n -= k;
    }
    return 0;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Bytes free to us in the directory that will hold path (UINT64_MAX when unknown).
static uint64_t free_space(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) slash[slash == dir] = 0; // "/x" -> "/", "a/b" -> "a"
    struct statvfs vfs;
    if (statvfs(slash ? dir : ".", &vfs) != 0) return UINT64_MAX;
    return (uint64_t)vfs.f_bavail * vfs.f_frsize;
}

static int write_failed(ModelWriter *w, char *err) {
    int e = errno;
    return fail(err, "cannot write '%s' at about byte %llu of %llu: %s", w->tmp_path, (unsigned long long)w->pos,
                (unsigned long long)w->total, strerror(e ? e : EIO));
}

ModelWriter *modelwriter_create(const char *path, const Config *c, const void *tok, size_t tok_size,
                                const uint32_t *dtypes, char *err) {
    if (config_validate(c, err) != 0) return NULL;
    ModelWriter *w = calloc(1, sizeof *w);
    if (!w) return fail(err, "out of memory"), NULL;
    w->n = model_tensor_list(c, NULL, NULL);
    w->entries = calloc((size_t)w->n, sizeof(TensorEntry));
    w->path = strdup(path);
    size_t tl = strlen(path) + 8;
    w->tmp_path = malloc(tl);
    if (!w->entries || !w->path || !w->tmp_path) {
        modelwriter_abort(w);
        return fail(err, "out of memory"), NULL;
    }
    snprintf(w->tmp_path, tl, "%s.tmp", path);
    FillCtx fc = {w->entries, dtypes, 0, 0, 0};
    model_tensor_list(c, fill_entry, &fc);
    if (fc.bad) {
        modelwriter_abort(w);
        return fail(err, "internal: a tensor's dtype does not fit its shape"), NULL;
    }

    memcpy(w->h.magic, MODEL_MAGIC, 8);
    w->h.version = fc.quantized ? 2 : 1; // format 1 readers still take what has no quantized matrix
    w->h.header_size = sizeof(FileHeader);
    w->h.config = *c;
    w->h.tokenizer_offset = align_up(sizeof(FileHeader), 64);
    w->h.tokenizer_size = tok_size;
    w->h.tensors_offset = align_up(w->h.tokenizer_offset + tok_size, 64);
    w->h.n_tensors = (uint32_t)w->n;
    w->pos = align_up(w->h.tensors_offset + (uint64_t)w->n * sizeof(TensorEntry), MODEL_ALIGN);
    w->total = w->pos;
    for (int i = 0; i < w->n; i++) w->total = align_up(w->total + w->entries[i].nbytes, MODEL_ALIGN);
    // Refuse at once what cannot fit, rather than fail after writing most of it.
    uint64_t avail = free_space(w->tmp_path);
    if (avail < w->total) {
        fail(err, "not enough disk space for '%s': it needs %llu bytes, %llu are free", path,
             (unsigned long long)w->total, (unsigned long long)avail);
        modelwriter_abort(w);
        return NULL;
    }

    w->f = fopen(w->tmp_path, "wb");
    if (w->f) guard_output(w->tmp_path); // removed if the program is stopped before the rename
    if (!w->f) {
        fail(err, "cannot create '%s': %s", w->tmp_path, strerror(errno));
        modelwriter_abort(w);
        return NULL;
    }
    // Header and table are rewritten at the end, once offsets are known.
    if (write_zeros(w->f, w->h.tokenizer_offset) != 0 || fwrite(tok, 1, tok_size, w->f) != tok_size ||
        write_zeros(w->f, w->pos - (w->h.tokenizer_offset + tok_size)) != 0) {
        write_failed(w, err);
        modelwriter_abort(w);
        return NULL;
    }
    return w;
}

const TensorEntry *modelwriter_next(const ModelWriter *w) { return w->next < w->n ? &w->entries[w->next] : NULL; }

static TensorEntry *next_entry(ModelWriter *w, const char *name, char *err) {
    if (w->next >= w->n) return fail(err, "internal: too many tensors (at '%s')", name), NULL;
    TensorEntry *t = &w->entries[w->next];
    if (strcmp(t->name, name) != 0) return fail(err, "internal: tensor '%s' written where '%s' belongs", name, t->name), NULL;
    t->offset = w->pos;
    return t;
}

// Pads the tensor just written to the alignment and moves on.
static int end_tensor(ModelWriter *w, const TensorEntry *t, char *err) {
    uint64_t end = w->pos + t->nbytes;
    w->pos = align_up(end, MODEL_ALIGN);
    if (write_zeros(w->f, w->pos - end) != 0) return write_failed(w, err);
    w->next++;
    return 0;
}

int modelwriter_add_raw(ModelWriter *w, const char *name, const void *data, char *err) {
    TensorEntry *t = next_entry(w, name, err);
    if (!t) return -1;
    if (fwrite(data, 1, t->nbytes, w->f) != t->nbytes) return write_failed(w, err);
    return end_tensor(w, t, err);
}

// Quantizes data row by row into t's blocks and writes them. Each row is dequantized again to
// check it: values too large for an fp16 scale (past 65504 * 127 for Q8_0) would come back as
// Inf, and a model file must not hold what the runner would only find at its first token.
static int add_quantized(ModelWriter *w, const TensorEntry *t, const float *data, char *err) {
    uint64_t rows = t->shape[0], cols = t->shape[1], rb = dtype_row_bytes(t->dtype, cols);
    uint8_t *buf = malloc(rb);
    float *back = malloc(cols * sizeof(float));
    int rc = -1;
    if (!buf || !back) {
        fail(err, "out of memory quantizing '%s'", t->name);
        goto out;
    }
    if (t->dtype != DTYPE_Q8_0 && t->dtype != DTYPE_Q4_K) { // the others are kept from a GGUF (modelwriter_add_raw) only
        fail(err, "internal: no %s quantizer for '%s'", dtype_name(t->dtype), t->name);
        goto out;
    }
    for (uint64_t r = 0; r < rows; r++) {
        const float *x = data + r * cols;
        if (t->dtype == DTYPE_Q8_0) quantize_row_q8_0(x, buf, cols);
        else quantize_row_q4_k(x, buf, cols);
        weights_rows_to_f32(buf, t->dtype, 0, 1, cols, back);
        for (uint64_t j = 0; j < cols; j++)
            if (!isfinite(back[j])) {
                fail(err, "tensor '%s' row %llu: its values (up to %g) do not fit %s's fp16 scales", t->name,
                     (unsigned long long)r, (double)x[j], dtype_name(t->dtype));
                goto out;
            }
        if (fwrite(buf, 1, rb, w->f) != rb) {
            write_failed(w, err);
            goto out;
        }
    }
    rc = 0;
out:
    free(buf);
    free(back);
    return rc;
}

int modelwriter_add(ModelWriter *w, const char *name, const float *data, char *err) {
    TensorEntry *t = next_entry(w, name, err);
    if (!t) return -1;
    uint64_t count = t->shape[0] * t->shape[1];
    if (dtype_is_quant(t->dtype)) {
        if (add_quantized(w, t, data, err) != 0) return -1;
    } else if (t->dtype == DTYPE_F32) {
        if (fwrite(data, 4, count, w->f) != count) goto io;
    } else {
        uint16_t buf[4096];
        for (uint64_t i = 0; i < count; i += 4096) {
            size_t k = count - i < 4096 ? (size_t)(count - i) : 4096;
            for (size_t j = 0; j < k; j++) buf[j] = f32_to_bf16(data[i + j]);
            if (fwrite(buf, 2, k, w->f) != k) goto io;
        }
    }
    return end_tensor(w, t, err);
io:
    return write_failed(w, err);
}

int modelwriter_finish(ModelWriter *w, char *err) {
    int rc = -1;
    if (w->next != w->n) {
        fail(err, "internal: %d of %d tensors written", w->next, w->n);
        goto out;
    }
    w->h.file_size = w->pos;
    if (fseek(w->f, 0, SEEK_SET) != 0 || fwrite(&w->h, sizeof w->h, 1, w->f) != 1 ||
        fseek(w->f, (long)w->h.tensors_offset, SEEK_SET) != 0 ||
        fwrite(w->entries, sizeof(TensorEntry), (size_t)w->n, w->f) != (size_t)w->n || fflush(w->f) != 0 ||
        fsync(fileno(w->f)) != 0) {
        write_failed(w, err);
        goto out;
    }
    if (fclose(w->f) != 0) {
        w->f = NULL;
        write_failed(w, err);
        goto out;
    }
    w->f = NULL;
    if (rename(w->tmp_path, w->path) == 0) guard_output(NULL);
    else {
        fail(err, "cannot rename '%s' to '%s': %s", w->tmp_path, w->path, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (rc != 0) {
        modelwriter_abort(w);
    } else {
        free(w->entries);
        free(w->path);
        free(w->tmp_path);
        free(w);
    }
    return rc;
}

void modelwriter_abort(ModelWriter *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    if (w->tmp_path) unlink(w->tmp_path);
    guard_output(NULL);
    free(w->entries);
    free(w->path);
    free(w->tmp_path);
    free(w);
}
