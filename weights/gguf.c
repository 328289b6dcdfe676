// GGUF v3 reader. The file is mapped; a cursor walks the header with bounds checks on every read.
#include "gguf.h"
#include "../model/errmsg.h"
#include "../model/guard.h"
#include "../model/bf16.h"

#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define fail(err, ...) err_fail(err, GGUF_ERR_LEN, __VA_ARGS__)

typedef struct {
    const uint8_t *p;
    size_t pos, size;
    int bad;
} Cursor;

static const uint8_t *take(Cursor *c, uint64_t n) {
    if (c->bad || n > c->size - c->pos) {
        c->bad = 1;
        return NULL;
    }
    const uint8_t *r = c->p + c->pos;
    c->pos += (size_t)n;
    return r;
}

static uint64_t rd_u64(Cursor *c) {
    uint64_t v = 0;
    const uint8_t *p = take(c, 8);
    if (p) memcpy(&v, p, 8);
    return v;
}

static uint32_t rd_u32(Cursor *c) {
    uint32_t v = 0;
    const uint8_t *p = take(c, 4);
    if (p) memcpy(&v, p, 4);
    return v;
}

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case GGUF_U8: case GGUF_I8: case GGUF_BOOL: return 1;
    case GGUF_U16: case GGUF_I16: return 2;
    case GGUF_U32: case GGUF_I32: case GGUF_F32: return 4;
    case GGUF_U64: case GGUF_I64: case GGUF_F64: return 8;
    default: return 0;
    }
}

// Skips one value of type t (strings carry their length).
static void skip_value(Cursor *c, uint32_t t) {
    if (t == GGUF_STRING) {
        take(c, rd_u64(c));
    } else {
        size_t s = scalar_size(t);
        if (s == 0) c->bad = 1;
        else take(c, s);
    }
}

static char *dup_str(const uint8_t *p, uint64_t n) {
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    memcpy(s, p, (size_t)n);
    s[n] = 0;
    return s;
}

// Bytes per block and elements per block of each supported tensor type.
static int type_block(uint32_t type, uint64_t *bytes, uint64_t *elems) {
    switch (type) {
    case GGML_F32: *bytes = 4, *elems = 1; return 0;
    case GGML_F16: case GGML_BF16: *bytes = 2, *elems = 1; return 0;
    case GGML_Q4_0: *bytes = 18, *elems = 32; return 0;
    case GGML_Q4_1: *bytes = 20, *elems = 32; return 0;
    case GGML_Q8_0: *bytes = 34, *elems = 32; return 0;
    default: return -1;
    }
}

const char *ggml_type_name(uint32_t type) {
    static const char *names[] = {"F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
                                  "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS",
                                  "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64",
                                  "IQ1_M", "BF16"};
    return type < sizeof names / sizeof *names ? names[type] : "unknown";
}

int gguf_open(GgufFile *g, const char *path, char *err) {
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); // O_NONBLOCK: a FIFO cannot hang us
    if (fd < 0) return fail(err, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 24) {
        close(fd);
        return fail(err, "'%s' is not a GGUF file (too small or not a regular file)", path);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return fail(err, "cannot map '%s': %s", path, strerror(errno));
    g->map = m;
    g->size = (size_t)st.st_size;
    guard_map(m, g->size, path);
    Cursor c = {g->map, 0, g->size, 0};
    if (memcmp(take(&c, 4), "GGUF", 4) != 0) {
        gguf_close(g);
        return fail(err, "'%s' is not a GGUF file (bad magic)", path);
    }
    g->version = rd_u32(&c);
    if (g->version != 3) {
        uint32_t v = g->version;
        gguf_close(g);
        return fail(err, "'%s': GGUF version %u is not supported (only version 3)", path, v);
    }
    g->n_tensors = rd_u64(&c);
    g->n_kv = rd_u64(&c);
    // A metadata entry takes at least 13 bytes of file (key length, type, a byte of value), a
    // tensor entry 32 (name length, ndim, one dimension, type, offset): this bounds the counts
    // (and so what is allocated for them) by the file before anything is allocated.
    if (g->n_kv > (g->size - 24) / 13 || g->n_tensors > (g->size - 24) / 32 ||
        g->n_kv * 13 + g->n_tensors * 32 > g->size - 24) {
        uint64_t nt = g->n_tensors, nk = g->n_kv;
        gguf_close(g);
        return fail(err, "'%s': implausible counts: %llu tensors and %llu metadata entries cannot fit in %zu bytes", path,
                    (unsigned long long)nt, (unsigned long long)nk, (size_t)st.st_size);
    }
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(GgufKV));
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(GgufTensor));
    if (!g->kv || !g->tensors) {
        gguf_close(g);
        return fail(err, "out of memory reading '%s'", path);
    }
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < g->n_kv && !c.bad; i++) {
        GgufKV *kv = &g->kv[i];
        uint64_t klen = rd_u64(&c);
        const uint8_t *k = take(&c, klen);
        if (!k) break;
        kv->key = dup_str(k, klen);
        if (!kv->key) c.bad = 1;
        kv->type = rd_u32(&c);
        if (kv->type == GGUF_ARRAY) {
            kv->arr_type = rd_u32(&c);
            kv->arr_len = rd_u64(&c);
            if (kv->arr_type == GGUF_ARRAY || (kv->arr_type != GGUF_STRING && scalar_size(kv->arr_type) == 0)) {
                c.bad = 1;
                break;
            }
            if (kv->arr_len > c.size) { c.bad = 1; break; }
            kv->data = c.p + c.pos;
            for (uint64_t j = 0; j < kv->arr_len && !c.bad; j++) skip_value(&c, kv->arr_type);
        } else if (kv->type == GGUF_STRING) {
            kv->str_len = rd_u64(&c);
            kv->data = take(&c, kv->str_len);
        } else {
            size_t s = scalar_size(kv->type);
            if (s == 0) { c.bad = 1; break; }
            kv->data = take(&c, s);
        }
        if (!c.bad && kv->key && strcmp(kv->key, "general.alignment") == 0 && kv->type == GGUF_U32) {
            uint32_t a;
            memcpy(&a, kv->data, 4);
            alignment = a;
        }
    }
    if (c.bad || alignment == 0 || (alignment & (alignment - 1)) != 0) {
        gguf_close(g);
        return fail(err, "'%s': metadata is truncated or malformed", path);
    }
    for (uint64_t i = 0; i < g->n_tensors && !c.bad; i++) {
        GgufTensor *t = &g->tensors[i];
        uint64_t nlen = rd_u64(&c);
        const uint8_t *n = take(&c, nlen);
        if (!n) break;
        t->name = dup_str(n, nlen);
        if (!t->name) { c.bad = 1; break; }
        t->ndim = rd_u32(&c);
        if (t->ndim < 1 || t->ndim > 4) { c.bad = 1; break; }
        t->n_elems = 1;
        for (uint32_t d = 0; d < t->ndim; d++) {
            t->ne[d] = rd_u64(&c);
            if (t->ne[d] == 0 || t->ne[d] > (1ull << 40) || t->n_elems > (1ull << 40) / t->ne[d]) c.bad = 1;
            else t->n_elems *= t->ne[d];
        }
        for (uint32_t d = t->ndim; d < 4; d++) t->ne[d] = 1;
        t->type = rd_u32(&c);
        t->nbytes = rd_u64(&c); // offset for now
    }
    if (c.bad) {
        gguf_close(g);
        return fail(err, "'%s': tensor directory is truncated or malformed", path);
    }
    uint64_t data_start = (c.pos + alignment - 1) / alignment * alignment;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        GgufTensor *t = &g->tensors[i];
        uint64_t off = t->nbytes, bb, be;
        if (type_block(t->type, &bb, &be) == 0) {
            if (t->ne[0] % be != 0) {
                fail(err, "'%s': tensor '%s' row of %llu is not a whole number of blocks", path, t->name,
                     (unsigned long long)t->ne[0]);
                gguf_close(g); // after the message: it frees the name
                return -1;
            }
            t->nbytes = t->n_elems / be * bb;
        } else {
            t->nbytes = 0; // unsupported type: reported when the tensor is used
        }
        if (data_start > g->size || off > g->size - data_start || t->nbytes > g->size - data_start - off) {
            fail(err, "'%s' is truncated: tensor '%s' (offset %llu, %llu bytes) lies outside the %zu-byte file", path,
                 t->name, (unsigned long long)off, (unsigned long long)t->nbytes, g->size);
            gguf_close(g);
            return -1;
        }
        t->data = g->map + data_start + off;
    }
    return 0;
}

void gguf_close(GgufFile *g) {
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].key);
    if (g->tensors)
        for (uint64_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    if (g->map) guard_unmap(g->map), munmap((void *)g->map, g->size);
    memset(g, 0, sizeof *g);
}

const GgufKV *gguf_find(const GgufFile *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key && strcmp(g->kv[i].key, key) == 0) return &g->kv[i];
    return NULL;
}

const GgufTensor *gguf_tensor(const GgufFile *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    return NULL;
}

static int scalar_f64(uint32_t type, const uint8_t *p, double *out) {
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; float f32;
            uint64_t u64; int64_t i64; double f64; } v;
    size_t s = scalar_size(type);
    if (s == 0) return -1;
    memcpy(&v, p, s);
    switch (type) {
    case GGUF_U8: case GGUF_BOOL: *out = v.u8; break;
    case GGUF_I8: *out = v.i8; break;
    case GGUF_U16: *out = v.u16; break;
    case GGUF_I16: *out = v.i16; break;
    case GGUF_U32: *out = v.u32; break;
    case GGUF_I32: *out = v.i32; break;
    case GGUF_F32: *out = v.f32; break;
    case GGUF_U64: *out = (double)v.u64; break;
    case GGUF_I64: *out = (double)v.i64; break;
    case GGUF_F64: *out = v.f64; break;
    }
    return 0;
}

int gguf_get_f64(const GgufFile *g, const char *key, double *out) {
    const GgufKV *kv = gguf_find(g, key);
    if (!kv || kv->type == GGUF_ARRAY || kv->type == GGUF_STRING) return -1;
    return scalar_f64(kv->type, kv->data, out);
}

int gguf_get_u64(const GgufFile *g, const char *key, uint64_t *out) {
    double d;
    if (gguf_get_f64(g, key, &d) != 0 || d < 0 || d > 1e15) return -1;
    *out = (uint64_t)d;
    return 0;
}

char *gguf_get_str(const GgufFile *g, const char *key) {
    const GgufKV *kv = gguf_find(g, key);
    if (!kv || kv->type != GGUF_STRING) return NULL;
    return dup_str(kv->data, kv->str_len);
}

long gguf_get_str_array(const GgufFile *g, const char *key, char ***out) {
    const GgufKV *kv = gguf_find(g, key);
    if (!kv || kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING) return -1;
    char **a = calloc(kv->arr_len ? kv->arr_len : 1, sizeof(char *));
    if (!a) return -1;
    // Lengths were validated while parsing, so this walk stays inside the file.
    Cursor c = {g->map, (size_t)(kv->data - g->map), g->size, 0};
    for (uint64_t i = 0; i < kv->arr_len; i++) {
        uint64_t n = rd_u64(&c);
        const uint8_t *p = take(&c, n);
        a[i] = p ? dup_str(p, n) : NULL;
        if (!a[i]) {
            for (uint64_t j = 0; j < i; j++) free(a[j]);
            free(a);
            return -1;
        }
    }
    *out = a;
    return (long)kv->arr_len;
}

long gguf_get_i32_array(const GgufFile *g, const char *key, int32_t **out) {
    const GgufKV *kv = gguf_find(g, key);
    if (!kv || kv->type != GGUF_ARRAY || kv->arr_type == GGUF_STRING) return -1;
    size_t s = scalar_size(kv->arr_type);
    int32_t *a = malloc((kv->arr_len ? kv->arr_len : 1) * sizeof(int32_t));
    if (!a) return -1;
    for (uint64_t i = 0; i < kv->arr_len; i++) {
        double d = 0.0;
        scalar_f64(kv->arr_type, kv->data + i * s, &d);
        // Outside int32 (or NaN): INT32_MIN, which no caller accepts as an id or a type.
        a[i] = d >= -2147483648.0 && d <= 2147483647.0 ? (int32_t)d : INT32_MIN;
    }
    *out = a;
    return (long)kv->arr_len;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

int gguf_dequantize(const GgufTensor *t, float *out, char *err) {
    const uint8_t *p = t->data;
    uint64_t n = t->n_elems;
    switch (t->type) {
    case GGML_F32:
        memcpy(out, p, n * 4);
        return 0;
    case GGML_F16:
        for (uint64_t i = 0; i < n; i++) out[i] = f16_to_f32(rd16(p + 2 * i));
        return 0;
    case GGML_BF16:
        for (uint64_t i = 0; i < n; i++) out[i] = bf16_to_f32(rd16(p + 2 * i));
        return 0;
    case GGML_Q8_0: // block: fp16 scale, 32 x int8
        for (uint64_t b = 0; b < n / 32; b++, p += 34) {
            float d = f16_to_f32(rd16(p));
            for (int j = 0; j < 32; j++) out[b * 32 + j] = d * (float)(int8_t)p[2 + j];
        }
        return 0;
    case GGML_Q4_0: // block: fp16 scale, 16 bytes; low nibbles are elements 0..15, high nibbles 16..31
        for (uint64_t b = 0; b < n / 32; b++, p += 18) {
            float d = f16_to_f32(rd16(p));
            for (int j = 0; j < 16; j++) {
                out[b * 32 + j] = d * (float)((p[2 + j] & 15) - 8);
                out[b * 32 + j + 16] = d * (float)((p[2 + j] >> 4) - 8);
            }
        }
        return 0;
    case GGML_Q4_1: // block: fp16 scale, fp16 minimum, 16 bytes of nibbles as Q4_0
        for (uint64_t b = 0; b < n / 32; b++, p += 20) {
            float d = f16_to_f32(rd16(p)), m = f16_to_f32(rd16(p + 2));
            for (int j = 0; j < 16; j++) {
                out[b * 32 + j] = d * (float)(p[4 + j] & 15) + m;
                out[b * 32 + j + 16] = d * (float)(p[4 + j] >> 4) + m;
            }
        }
        return 0;
    default:
        return fail(err, "tensor '%s' has type %s, which is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)",
                    t->name, ggml_type_name(t->type));
    }
}
