// Saved sessions (session.h): write, check, read.
#include "session.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

static int fail(char *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, SESSION_ERR_LEN, fmt, ap);
    va_end(ap);
    return -1;
}

// Four independent multiply-xorshift lanes over 8-byte words (several GB/s), then the tail.
uint64_t session_checksum(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h[4] = {0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull, 0x2545f4914f6cdd1dull};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            uint64_t w;
            memcpy(&w, b + i + 8 * k, 8);
            h[k] = (h[k] ^ w) * 0xff51afd7ed558ccdull;
            h[k] ^= h[k] >> 32;
        }
    uint64_t x = (uint64_t)n;
    for (; i < n; i++) x = (x ^ b[i]) * 0x100000001b3ull;
    for (int k = 0; k < 4; k++) x = (x ^ h[k]) * 0xc4ceb9fe1a85ec53ull, x ^= x >> 29;
    return x;
}

uint64_t session_model_id(const Model *m) {
    const ModelFile *f = &m->file;
    if (!f->data) return 0; // a synthetic model: no file, no sessions
    const FileHeader *fh = f->header;
    uint64_t id = session_checksum(f->data, (size_t)fh->tensors_offset + (size_t)fh->n_tensors * sizeof(TensorEntry));
    for (uint32_t i = 0; i < fh->n_tensors; i++) {
        const TensorEntry *t = &f->tensors[i];
        size_t k = t->nbytes < 4096 ? (size_t)t->nbytes : 4096;
        id = (id ^ session_checksum(f->data + t->offset, k)) * 0x9e3779b97f4a7c15ull;
    }
    return id;
}

static uint64_t align_up(uint64_t x) { return (x + SESSION_ALIGN - 1) / SESSION_ALIGN * SESSION_ALIGN; }

uint64_t session_bytes(const Config *c, int n, size_t chat_bytes) {
    uint64_t logits = align_up(SESSION_ALIGN + (uint64_t)n * 4), chat = align_up(logits + (uint64_t)c->vocab_size * 4);
    return align_up(chat + chat_bytes) + 2 * (uint64_t)c->n_layers * n * c->n_kv_heads * c->head_dim * sizeof(float);
}

int session_check_disk(const char *path, uint64_t bytes, char *err) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) return fail(err, "cannot write a session in '%.256s': %s", dir, strerror(errno));
    uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    if (avail < bytes)
        return fail(err, "the session '%.256s' needs %.1f MiB of disk, but %.1f MiB is free there", path, bytes / 1048576.0, avail / 1048576.0);
    return 0;
}

static uint64_t header_sum(const SessionHeader *h) {
    SessionHeader t = *h;
    t.header_sum = 0;
    return session_checksum(&t, sizeof t);
}

static size_t kv_row_floats(const Config *c) { return (size_t)c->n_kv_heads * c->head_dim; }

// The settings a session's K/V and regions depend on, as the header keeps them.
static void put_attn(SessionHeader *h, const AttnConfig *a) {
    h->attn_method = a->method, h->topk = a->topk, h->sink = a->sink, h->local = a->local, h->update = a->update;
    h->dense_min = a->dense_min, h->zone_fp8 = a->zone_fp8, h->beta = a->beta, h->rho = a->rho;
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

int session_save(const char *path, const Model *m, const RunState *s, const AttnConfig *a, const int *tokens, int n, const SessionExtra *x,
                 char *err) {
    const Config *c = &m->c;
    if (s->dev) return fail(err, "sessions are saved from the CPU path for now (add --device cpu)");
    if (n < 1 || n > s->ctx) return fail(err, "nothing to save");
    size_t vbytes = (size_t)c->vocab_size * sizeof(float);
    float *zeros_logits = x->logits ? NULL : calloc(c->vocab_size, sizeof(float));
    if (!x->logits && !zeros_logits) return fail(err, "out of memory");
    const float *logits = x->logits ? x->logits : zeros_logits;
    size_t row = kv_row_floats(c) * sizeof(float), layer_bytes = (size_t)n * row;
    SessionHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, SESSION_MAGIC, 8);
    h.version = SESSION_VERSION, h.header_size = sizeof h;
    h.model_id = session_model_id(m);
    h.config = *c;
    h.kv_format = SESSION_KV_CPU_F32;
    put_attn(&h, a);
    h.n_tokens = n, h.prefill_len = x->prefill_len, h.fp8_end = x->fp8_end, h.kind = x->kind;
    h.tokens_offset = SESSION_ALIGN;
    h.logits_offset = align_up(h.tokens_offset + (uint64_t)n * sizeof(int32_t));
    h.chat_offset = align_up(h.logits_offset + vbytes);
    h.chat_bytes = x->chat_bytes;
    h.kv_offset = align_up(h.chat_offset + h.chat_bytes);
    h.kv_bytes = 2 * (uint64_t)c->n_layers * layer_bytes;
    h.file_size = h.kv_offset + h.kv_bytes;
    h.tokens_sum = session_checksum(tokens, (size_t)n * sizeof(int32_t));
    h.logits_sum = session_checksum(logits, vbytes);
    h.chat_sum = session_checksum(x->chat, x->chat_bytes);
    // The K/V checksum is over the section as written: layer by layer, K rows then V rows.
    uint64_t kv = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        size_t off = (size_t)l * s->ctx * kv_row_floats(c);
        kv = (kv ^ session_checksum(s->key_cache + off, layer_bytes)) * 0x9e3779b97f4a7c15ull;
        kv = (kv ^ session_checksum(s->value_cache + off, layer_bytes)) * 0x9e3779b97f4a7c15ull;
    }
    h.kv_sum = kv;
    h.header_sum = header_sum(&h);
    if (session_check_disk(path, h.file_size, err) != 0) { // the disk first: a long session is tens of GiB
        free(zeros_logits);
        return -1;
    }
    char tmp[4200];
    FILE *f = NULL;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp || !(f = fopen(tmp, "wb"))) {
        free(zeros_logits);
        return fail(err, "cannot create '%.256s': %s", tmp, strlen(path) > 4000 ? "path too long" : strerror(errno));
    }
    static const uint8_t zeros[SESSION_ALIGN];
    int bad = write_all(f, &h, sizeof h) || write_all(f, zeros, SESSION_ALIGN - sizeof h) ||
              write_all(f, tokens, (size_t)n * sizeof(int32_t)) ||
              write_all(f, zeros, (size_t)(h.logits_offset - h.tokens_offset - (uint64_t)n * sizeof(int32_t))) ||
              write_all(f, logits, vbytes) || write_all(f, zeros, (size_t)(h.chat_offset - h.logits_offset - vbytes)) ||
              (h.chat_bytes && write_all(f, x->chat, x->chat_bytes)) ||
              write_all(f, zeros, (size_t)(h.kv_offset - h.chat_offset - h.chat_bytes));
    for (uint32_t l = 0; l < c->n_layers && !bad; l++) {
        size_t off = (size_t)l * s->ctx * kv_row_floats(c);
        bad = write_all(f, s->key_cache + off, layer_bytes) || write_all(f, s->value_cache + off, layer_bytes);
    }
    if (fclose(f) != 0) bad = 1;
    free(zeros_logits);
    if (bad || rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return fail(err, "cannot write '%.256s' (%.2f GiB): %s", path, h.file_size / 1073741824.0, strerror(e));
    }
    return 0;
}

int session_check_header(const SessionHeader *h, uint64_t file_size, uint64_t model_id, const Config *c, const AttnConfig *a, char *err) {
    if (memcmp(h->magic, SESSION_MAGIC, 8) != 0) return fail(err, "not a session file (no %s magic)", SESSION_MAGIC);
    if (h->version != SESSION_VERSION || h->header_size != sizeof *h)
        return fail(err, "session format %u (header %u bytes) is not this runner's (%d, %zu bytes)", h->version, h->header_size,
                    SESSION_VERSION, sizeof *h);
    if (header_sum(h) != h->header_sum) return fail(err, "the session header is damaged (checksum mismatch)");
    if (h->model_id != model_id || memcmp(&h->config, c, sizeof *c) != 0)
        return fail(err, "the session was made with another model (%u layers, dim %u, vocab %u%s)", h->config.n_layers, h->config.dim,
                    h->config.vocab_size, memcmp(&h->config, c, sizeof *c) == 0 ? ", other weights" : "");
    if (h->kv_format != SESSION_KV_CPU_F32) return fail(err, "session K/V format %u is not one this runner reads", h->kv_format);
    SessionHeader want = *h;
    put_attn(&want, a);
    if (memcmp(&want, h, sizeof want) != 0)
        return fail(err, "the session was made under other attention settings (--attn %s, --topk %d, --sink %d, --local %d, --update %d, "
                    "--kv-store-dtype %s): give the same ones",
                    attn_method_name(h->attn_method) ? attn_method_name(h->attn_method) : "?", h->topk, h->sink, h->local, h->update,
                    h->zone_fp8 ? "fp8" : "bf16");
    if (h->n_tokens < 1 || h->prefill_len < 0 || h->prefill_len > h->n_tokens || h->n_tokens > (1 << 30) || h->fp8_end < 0 ||
        h->fp8_end > h->n_tokens || (h->kind != SESSION_PROMPT && h->kind != SESSION_CHAT) || h->chat_bytes > (1ull << 40) ||
        (h->kind == SESSION_PROMPT && h->chat_bytes))
        return fail(err, "the session header is inconsistent (%d tokens, prompt %d, kind %d)", h->n_tokens, h->prefill_len, h->kind);
    uint64_t n = (uint64_t)h->n_tokens, row = (uint64_t)c->n_kv_heads * c->head_dim * sizeof(float);
    uint64_t logits_end = h->logits_offset + (uint64_t)c->vocab_size * sizeof(float);
    if (h->tokens_offset != SESSION_ALIGN || h->logits_offset != align_up(h->tokens_offset + n * 4) || h->chat_offset != align_up(logits_end) ||
        h->kv_offset != align_up(h->chat_offset + h->chat_bytes) ||
        h->kv_bytes != 2 * (uint64_t)c->n_layers * n * row || h->file_size != h->kv_offset + h->kv_bytes)
        return fail(err, "the session header is inconsistent (its sections do not add up)");
    if (file_size != h->file_size)
        return fail(err, "the session file has %llu bytes, its header says %llu: truncated or damaged", (unsigned long long)file_size,
                    (unsigned long long)h->file_size);
    return 0;
}

int session_open(const char *path, const Model *m, const AttnConfig *a, SessionHeader *h, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, "cannot open session '%.256s': %s", path, strerror(errno));
    struct stat st;
    int got = fstat(fileno(f), &st) == 0 && fread(h, 1, sizeof *h, f) == sizeof *h;
    fclose(f);
    if (!got) return fail(err, "session '%.256s': too short for a session header", path);
    if (session_check_header(h, (uint64_t)st.st_size, session_model_id(m), &m->c, a, err) != 0) {
        char why[SESSION_ERR_LEN];
        memcpy(why, err, sizeof why);
        return fail(err, "session '%.200s': %.300s", path, why);
    }
    return 0;
}

static int read_at(FILE *f, uint64_t off, void *p, size_t n) {
    return fseeko(f, (off_t)off, SEEK_SET) == 0 && fread(p, 1, n, f) == n ? 0 : -1;
}

int session_read(const char *path, const SessionHeader *h, RunState *s, int *tokens, float *logits, void **chat, char *err) {
    const Config *c = &h->config;
    *chat = NULL;
    if (s->dev) return fail(err, "sessions are restored on the CPU path for now (add --device cpu)");
    if (h->n_tokens > s->ctx) return fail(err, "session '%.256s' has %d positions, more than the context of %d", path, h->n_tokens, s->ctx);
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, "cannot open session '%.256s': %s", path, strerror(errno));
    size_t n = (size_t)h->n_tokens, row = kv_row_floats(c), layer_bytes = n * row * sizeof(float);
    int bad = read_at(f, h->tokens_offset, tokens, n * sizeof(int32_t)) || read_at(f, h->logits_offset, logits, (size_t)c->vocab_size * 4);
    if (!bad && h->chat_bytes) {
        *chat = malloc((size_t)h->chat_bytes);
        bad = !*chat || read_at(f, h->chat_offset, *chat, (size_t)h->chat_bytes);
    }
    uint64_t kv = 0;
    if (!bad && fseeko(f, (off_t)h->kv_offset, SEEK_SET) != 0) bad = 1;
    for (uint32_t l = 0; l < c->n_layers && !bad; l++) {
        size_t off = (size_t)l * s->ctx * row;
        bad = fread(s->key_cache + off, 1, layer_bytes, f) != layer_bytes || fread(s->value_cache + off, 1, layer_bytes, f) != layer_bytes;
        if (!bad) {
            kv = (kv ^ session_checksum(s->key_cache + off, layer_bytes)) * 0x9e3779b97f4a7c15ull;
            kv = (kv ^ session_checksum(s->value_cache + off, layer_bytes)) * 0x9e3779b97f4a7c15ull;
        }
    }
    fclose(f);
    const char *which = bad ? NULL
                        : kv != h->kv_sum                                                       ? "K/V"
                        : session_checksum(tokens, n * 4) != h->tokens_sum                      ? "tokens"
                        : session_checksum(logits, (size_t)c->vocab_size * 4) != h->logits_sum ? "logits"
                        : session_checksum(*chat, (size_t)h->chat_bytes) != h->chat_sum          ? "conversation"
                                                                                                  : NULL;
    int out_of_range = 0;
    for (size_t i = 0; i < n && !bad && !which; i++) out_of_range |= tokens[i] < 0 || (uint32_t)tokens[i] >= c->vocab_size;
    if (bad || which || out_of_range) {
        free(*chat);
        *chat = NULL;
        if (bad) return fail(err, "session '%.256s': read failed (truncated while open?)", path);
        if (which) return fail(err, "session '%.256s' is damaged (checksum mismatch in its %s)", path, which);
        return fail(err, "session '%.256s': a token is out of range", path);
    }
    return 0;
}
