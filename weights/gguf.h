// GGUF v3 reader: metadata, tensor directory, and dequantization to fp32.
#ifndef GGUF_H
#define GGUF_H

#include <stddef.h>
#include <stdint.h>

#define GGUF_ERR_LEN 512

enum GgufValueType {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6,
    GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10, GGUF_I64 = 11, GGUF_F64 = 12,
};

enum GgmlType {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    // K-quants: super-blocks of 256 elements (GGML's QK_K), sub-blocks with their own 4-8 bit scales.
    GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14,
    GGML_BF16 = 30,
};

typedef struct {
    char *key;
    uint32_t type;       // GgufValueType
    uint32_t arr_type;   // element type when type == GGUF_ARRAY
    uint64_t arr_len;
    const uint8_t *data; // points into the mapped file: the scalar, the string (after its length), or the first element
    uint64_t str_len;    // when type == GGUF_STRING
} GgufKV;

typedef struct {
    char *name;
    uint32_t type;       // GgmlType
    uint32_t ndim;
    uint64_t ne[4];      // ne[0] is the contiguous (column) dimension
    uint64_t n_elems;
    const uint8_t *data;
    uint64_t nbytes;
} GgufTensor;

typedef struct {
    const uint8_t *map;
    size_t size;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    GgufKV *kv;
    GgufTensor *tensors;
} GgufFile;

// Maps and parses path; every count, length and offset is checked against the file.
int gguf_open(GgufFile *g, const char *path, char *err);
void gguf_close(GgufFile *g);

const GgufKV *gguf_find(const GgufFile *g, const char *key);
const GgufTensor *gguf_tensor(const GgufFile *g, const char *name);
// Scalars of any integer/float type, converted. Return 0 if found and numeric, else -1.
int gguf_get_u64(const GgufFile *g, const char *key, uint64_t *out);
int gguf_get_f64(const GgufFile *g, const char *key, double *out);
// A string value copied into a malloc'd NUL-terminated buffer, or NULL.
char *gguf_get_str(const GgufFile *g, const char *key);
// A string array as malloc'd NUL-terminated strings (*out has n entries). Returns n, or -1.
long gguf_get_str_array(const GgufFile *g, const char *key, char ***out);
// An integer array converted to int32. Returns n, or -1.
long gguf_get_i32_array(const GgufFile *g, const char *key, int32_t **out);

const char *ggml_type_name(uint32_t type);
// Dequantize a whole tensor into out (n_elems floats). Returns 0, or -1 for an unsupported type.
int gguf_dequantize(const GgufTensor *t, float *out, char *err);

#endif
