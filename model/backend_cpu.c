// The CPU backend: the reference every other backend is checked against. fp32 math, OpenMP
// across output rows, bf16 weights widened and Q8_0 / Q4_K blocks dequantized on the fly.
#include "backend.h"
#include "bf16.h"
#include "config.h"
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifndef NO_BLAS
#include <cblas.h>
#endif

static float dot_f32(const float *a, const float *b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; j++) s += a[j] * b[j];
    return s;
}

static float dot_bf16(const uint16_t *w, const float *x, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; j++) s += bf16_to_f32(w[j]) * x[j];
    return s;
}

// One output of a product: row i of W (n weights stored in dtype) times x. Quantized rows are
// multiplied block by block (model/quant.h), the activations staying fp32.
static float dot_row(const void *w, uint32_t dtype, size_t i, const float *x, int n) {
    switch (dtype) {
    case DTYPE_BF16: return dot_bf16((const uint16_t *)w + i * n, x, n);
    case DTYPE_Q8_0: return dot_q8_0((const uint8_t *)w + i * dtype_row_bytes(dtype, (uint64_t)n), x, n);
    case DTYPE_Q4_K: return dot_q4_k((const uint8_t *)w + i * dtype_row_bytes(dtype, (uint64_t)n), x, n);
    default: return dot_f32((const float *)w + i * n, x, n);
    }
}

#ifndef NO_BLAS
#define PANEL 64 // weight rows a thread widens to fp32 and multiplies at once (64 x 4096 floats: 1 MiB)

// y (T, d) = x (T, n) · W^T as a matrix product: OpenBLAS's sgemm on panels of PANEL weight
// rows, each widened (bf16) or dequantized (Q8_0, Q4_K) once by the thread that multiplies it
// (OpenBLAS runs one thread inside our parallel region). The products' sums run in sgemm's
// order, not dot_f32's: results agree with the row-by-row path to fp32 rounding, not bit for bit.
static void matmul_blas(float *y, const float *x, const void *w, uint32_t dtype, int T, int n, int d) {
    int panels = (d + PANEL - 1) / PANEL;
#pragma omp parallel
    {
        float *wp = dtype != DTYPE_F32 ? malloc((size_t)PANEL * n * sizeof(float)) : NULL;
#pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < panels; p++) {
            int i0 = p * PANEL, rows = d - i0 < PANEL ? d - i0 : PANEL;
            const float *wr = (const float *)w + (size_t)i0 * n;
            if (dtype != DTYPE_F32) {
                if (!wp) { // no scratch: convert inside the dot products
                    for (int t = 0; t < T; t++)
                        for (int r = 0; r < rows; r++) y[(size_t)t * d + i0 + r] = dot_row(w, dtype, (size_t)(i0 + r), x + (size_t)t * n, n);
                    continue;
                }
                weights_rows_to_f32(w, dtype, (size_t)i0, (size_t)rows, (size_t)n, wp);
                wr = wp;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, rows, n, 1.0f, x, n, wr, n, 0.0f, y + i0, d);
        }
        free(wp);
    }
}
#endif

static void matmul(float *y, const float *x, const void *w, uint32_t dtype, int T, int n, int d) {
    if (T == 1) { // decode: one pass over the weights, nothing to reuse
#pragma omp parallel for schedule(static)
        for (int i = 0; i < d; i++) y[i] = dot_row(w, dtype, (size_t)i, x, n);
        return;
    }
#ifndef NO_BLAS
    matmul_blas(y, x, w, dtype, T, n, d);
    return;
#endif
    // Several tokens: widen each weight row once and reuse it for every token.
#pragma omp parallel
    {
        float *row = dtype != DTYPE_F32 ? malloc((size_t)n * sizeof(float)) : NULL;
#pragma omp for schedule(static)
        for (int i = 0; i < d; i++) {
            const float *wr;
            if (dtype != DTYPE_F32 && row) {
                weights_rows_to_f32(w, dtype, (size_t)i, 1, (size_t)n, row);
                wr = row;
            } else if (dtype != DTYPE_F32) { // no scratch row: convert inside the dot product
                for (int t = 0; t < T; t++) y[(size_t)t * d + i] = dot_row(w, dtype, (size_t)i, x + (size_t)t * n, n);
                continue;
            } else {
                wr = (const float *)w + (size_t)i * n;
            }
            for (int t = 0; t < T; t++) y[(size_t)t * d + i] = dot_f32(wr, x + (size_t)t * n, n);
        }
        free(row);
    }
}

static void rmsnorm(float *out, const float *x, const float *w, int T, int n, float eps) {
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * n;
        float *o = out + (size_t)t * n;
        float ss = dot_f32(xr, xr, n);
        float scale = 1.0f / sqrtf(ss / (float)n + eps);
        for (int j = 0; j < n; j++) o[j] = w[j] * (xr[j] * scale);
    }
}

static void embed(float *out, const void *E, uint32_t dtype, const int *tokens, int T, int dim) {
    for (int t = 0; t < T; t++) weights_rows_to_f32(E, dtype, (size_t)tokens[t], 1, (size_t)dim, out + (size_t)t * dim);
}

static void rope(float *x, const float *inv_freq, int pos0, int T, int n_heads, int head_dim) {
    int half = head_dim / 2;
    float cs[1024]; // head_dim <= 1024 (config_validate)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            // The angle in fp32 as transformers forms it; its cosine and sine exactly.
            float ang = (float)(pos0 + t) * inv_freq[i];
            cs[2 * i] = (float)cos((double)ang);
            cs[2 * i + 1] = (float)sin((double)ang);
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) { // rotate-half pairs (i, i + half)
                float a = v[i], b = v[i + half], c = cs[2 * i], s = cs[2 * i + 1];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

static void swiglu(float *a, const float *b, long n) {
    for (long i = 0; i < n; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}

static void add(float *x, const float *y, long n) {
    for (long i = 0; i < n; i++) x[i] += y[i];
}

const Backend backend_cpu = {
    .name = "cpu",
    .matmul = matmul,
    .rmsnorm = rmsnorm,
    .embed = embed,
    .rope = rope,
    .swiglu = swiglu,
    .add = add,
    .max_chunk = 256,
};
