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
    case GGML_Q5_0: *bytes = 22, *elems = 32; return 0;
    case GGML_Q5_1: *bytes = 24, *elems = 32; return 0;
    case GGML_Q8_0: *bytes = 34, *elems = 32; return 0;
    // K-quants (GGML's block_qN_K, QK_K = 256): the sizes are the structs' static_asserts.
    case GGML_Q2_K: *bytes = 84, *elems = 256; return 0;
    case GGML_Q3_K: *bytes = 110, *elems = 256; return 0;
    case GGML_Q4_K: *bytes = 144, *elems = 256; return 0;
    case GGML_Q5_K: *bytes = 176, *elems = 256; return 0;
    case GGML_Q6_K: *bytes = 210, *elems = 256; return 0;
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

// ---- K-quants: one 256-element super-block each, laid out as GGML's block_qN_K (ggml-common.h)
// and dequantized as its dequantize_row_qN_K (ggml-quants.c) does, in the same order of operations.
// Every product there is exact in fp32: fp16 d has 11 significant bits, a scale's magnitude at
// most 7 (Q6_K's int8), a quant's at most 5, so d * scale * q needs at most 23 of fp32's 24. The
// only rounding is the final subtraction of the minimum, so the result is bit for bit GGML's (and
// gguf-py's) whatever the association, with or without FMA contraction.

// Q2_K (84 bytes): scales[16] (low nibble scale, high nibble min, per 16 elements), qs[64]
// (2-bit quants), fp16 d, fp16 dmin. Element 128h + 32j + l comes from bits 2j of qs[32h + l].
static void deq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = f16_to_f32(rd16(b + 80)), dmin = f16_to_f32(rd16(b + 82));
    for (int s = 0; s < 16; s++) {
        float dl = d * (float)(sc[s] & 15), ml = dmin * (float)(sc[s] >> 4);
        const uint8_t *q = qs + 32 * (s / 8) + 16 * (s & 1);
        int shift = 2 * ((s / 2) % 4);
        for (int l = 0; l < 16; l++) y[16 * s + l] = dl * (float)((q[l] >> shift) & 3) - ml;
    }
}

// Q3_K (110 bytes): hmask[32] (each quant's high bit), qs[64] (low 2 bits, placed as Q2_K's),
// scales[12] (sixteen 6-bit scales, offset by 32), fp16 d. Scale s has its low 4 bits in byte s
// (s < 8) or the high nibble of byte s - 8, its high 2 bits in byte 8 + s % 4 at bit 2 (s / 4):
// GGML's kmask shuffle, done per byte here so it does not depend on the host's byte order.
// Element 128h + 32j + l has high bit (4h + j) of hmask[l]; a clear bit subtracts 4.
static void deq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    float d = f16_to_f32(rd16(b + 108));
    for (int s = 0; s < 16; s++) {
        int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4, hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        float dl = d * (float)((lo | hi << 4) - 32);
        int h = s / 8, j = (s / 2) % 4, off = 16 * (s & 1);
        for (int l = 0; l < 16; l++) {
            int q = ((qs[32 * h + off + l] >> (2 * j)) & 3) - ((hm[off + l] >> (4 * h + j)) & 1 ? 0 : 4);
            y[16 * s + l] = dl * (float)q;
        }
    }
}

// The 6-bit scale and minimum of sub-block j (0..7) of Q4_K / Q5_K (GGML's get_scale_min_k4):
// j < 4 in the low 6 bits of bytes j and j + 4; j >= 4 has its low 4 bits in byte j + 4 (scale
// in the low nibble, minimum in the high) and its high 2 bits in the top of bytes j - 4 and j.
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63, *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

// Q4_K (144 bytes): fp16 d, fp16 dmin, scales[12], qs[128]. Sub-block s (32 elements) reads the
// low nibbles (s even) or the high nibbles (s odd) of qs[32 (s / 2) ..]; value d sc q - dmin m.
// Q5_K (176 bytes): the same with qh[32] before qs: a fifth bit, bit s of qh[l] for element l of
// sub-block s. One routine for both: qh NULL for Q4_K.
static void deq_q45_k(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y) {
    const uint8_t *sc = b + 4;
    float d = f16_to_f32(rd16(b)), dmin = f16_to_f32(rd16(b + 2));
    for (int s = 0; s < 8; s++) {
        int scale, min;
        scale_min_k4(s, sc, &scale, &min);
        float dl = d * (float)scale, ml = dmin * (float)min;
        const uint8_t *q = qs + 32 * (s / 2);
        int shift = 4 * (s & 1);
        for (int l = 0; l < 32; l++)
            y[32 * s + l] = dl * (float)(((q[l] >> shift) & 15) | (qh ? ((qh[l] >> s) & 1) << 4 : 0)) - ml;
    }
}

static void deq_q4_k(const uint8_t *b, float *y) { deq_q45_k(b, NULL, b + 16, y); }
static void deq_q5_k(const uint8_t *b, float *y) { deq_q45_k(b, b + 16, b + 48, y); }

// Q6_K (210 bytes): ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (per 16
// elements), fp16 d; quants are offset by 32. Element 128h + 32k + l takes nibble (k / 2) of
// ql[64h + 32 (k % 2) + l] and bits 2k of qh[32h + l].
static void deq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128, *sc = b + 192;
    float d = f16_to_f32(rd16(b + 208));
    for (int s = 0; s < 16; s++) {
        float dl = d * (float)(int8_t)sc[s];
        int h = s / 8, k = (s / 2) % 4, off = 16 * (s & 1);
        const uint8_t *lo = ql + 64 * h + 32 * (k & 1) + off, *hi = qh + 32 * h + off;
        for (int l = 0; l < 16; l++) {
            int q = ((lo[l] >> (4 * (k >> 1))) & 15) | ((hi[l] >> (2 * k)) & 3) << 4;
            y[16 * s + l] = dl * (float)(q - 32);
        }
    }
}

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
    // Q5_0 / Q5_1: Q4_0 / Q4_1 plus a fifth bit per element, bit j of the little-endian 32-bit qh
    // for element j. llama.cpp's K-quant presets fall back to them for rows that are not whole
    // super-blocks (SmolLM2-135M's 576), so a Q4_K_M / Q5_K_M file of such a model holds them.
    case GGML_Q5_0: case GGML_Q5_1: { // fp16 d, [fp16 m,] qh[4], 16 bytes of nibbles
        uint64_t bb = t->type == GGML_Q5_0 ? 22 : 24;
        for (uint64_t b = 0; b < n / 32; b++, p += bb) {
            float d = f16_to_f32(rd16(p)), m = t->type == GGML_Q5_1 ? f16_to_f32(rd16(p + 2)) : 0.0f;
            const uint8_t *qh = p + bb - 20, *qs = p + bb - 16;
            uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
            for (int j = 0; j < 16; j++) {
                int q0 = (qs[j] & 15) | ((h >> j) & 1) << 4, q1 = (qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4;
                if (t->type == GGML_Q5_0) { // (q - 16) d: exact in fp32
                    out[b * 32 + j] = (float)(q0 - 16) * d;
                    out[b * 32 + j + 16] = (float)(q1 - 16) * d;
                } else { // q d + m: the product is exact, the sum rounds once, as in GGML
                    out[b * 32 + j] = (float)q0 * d + m;
                    out[b * 32 + j + 16] = (float)q1 * d + m;
                }
            }
        }
        return 0;
    }
    case GGML_Q2_K: case GGML_Q3_K: case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K: {
        // gguf_open checked that the row is whole super-blocks and n / 256 of them lie in the file.
        static void (*const deq_k[])(const uint8_t *, float *) = {deq_q2_k, deq_q3_k, deq_q4_k, deq_q5_k, deq_q6_k};
        void (*deq)(const uint8_t *, float *) = deq_k[t->type - GGML_Q2_K];
        uint64_t bb, be;
        type_block(t->type, &bb, &be);
        for (uint64_t b = 0; b < n / 256; b++) deq(p + b * bb, out + b * 256);
        return 0;
    }
    default:
        return fail(err, "tensor '%s' has type %s, which is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
                         "Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
                    t->name, ggml_type_name(t->type));
    }
}
