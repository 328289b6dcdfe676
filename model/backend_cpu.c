// The CPU backend: the reference every other backend is checked against. fp32 math, the pool's
// threads across output rows, bf16 weights widened and Q8_0 / Q4_K blocks dequantized on the fly
// (several tokens), or multiplied as blocks by activations quantized per 32 (decode; quant.h).
// A decode step's bf16 products run on the instruction set cpu_isa() picks (dot_bf16.h); where
// that is avx512bf16 (the default on CPUs with AVX512_BF16) a prompt's go through oneDNN's bf16
// matmul (gemm_dnnl.h) where built, and both round the activations to bf16: as a reference the
// backend runs with PKV_CPU_ISA=fp32 (tests/run_all.sh sets it).
#include "backend.h"
#include "bf16.h"
#include "config.h"
#include "cpu_isa.h"
#include "dot_bf16.h"
#include "gemm_dnnl.h"
#include "pool.h"
#include "quant.h"

#include <math.h>
#include <stdio.h>
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
    case DTYPE_Q4_0: return dot_q4_0((const uint8_t *)w + i * dtype_row_bytes(dtype, (uint64_t)n), x, n);
    case DTYPE_Q6_K: return dot_q6_k((const uint8_t *)w + i * dtype_row_bytes(dtype, (uint64_t)n), x, n);
    case DTYPE_Q4_1: case DTYPE_Q5_0: case DTYPE_Q5_1: case DTYPE_Q5_K:
        return dot_q45((const uint8_t *)w + i * dtype_row_bytes(dtype, (uint64_t)n), dtype, x, n);
    default: return dot_f32((const float *)w + i * n, x, n);
    }
}

// One product y (T, d) = x (T, n) · W^T, split into tasks of `rows` output rows.
typedef struct {
    float *y;
    const float *x;
    const void *w;
    uint32_t dtype;
    int T, n, d, rows;
    const ActQ8 *act;             // decode with quantized weights: x quantized per 32
    const DotBf16 *bf16;          // decode with bf16 weights: the kernels, and x laid out for them
    const void *xp;
    GemmDnnl *dnnl;               // several tokens in bf16 arithmetic: oneDNN's panels, x in bf16
    const uint16_t *xb;
    float *buf[POOL_MAX_THREADS]; // per thread: weight rows widened to fp32 (allocated on first use)
} Product;

static float *thread_buf(Product *p, int thread, size_t floats) {
    if (!p->buf[thread]) p->buf[thread] = malloc(floats * sizeof(float));
    return p->buf[thread];
}

// Decode: each thread's share of the rows in DECODE_TASKS_PER_THREAD contiguous runs, each a
// whole number of 16-row groups (a 64-byte line of y, so no line is written by two threads),
// claimed one at a time from the pool. Few, long runs: each claim moves the pool's counter line
// between cores, and each run restarts the thread's stream through the weights that the
// prefetcher follows; 16-row tasks made 12,800 claims a token on SmolLM2-135M and split every
// matrix into runs of 18 KiB alternating between the threads. Eight a thread still leave a
// descheduled thread holding up an eighth of its share, not half of the product.
#define DECODE_TASKS_PER_THREAD 8
static int decode_rows_per_task(int d) {
    int parts = pool_threads() * DECODE_TASKS_PER_THREAD, rows = (d + parts - 1) / parts;
    return rows < 16 ? 16 : (rows + 15) / 16 * 16;
}

// Decode: each weight row read once, its dot product with the one x.
static void rows_task(void *ctx, int task, int thread) {
    (void)thread;
    Product *p = ctx;
    int i0 = task * p->rows, i1 = i0 + p->rows < p->d ? i0 + p->rows : p->d;
    if (p->bf16) {
        p->bf16->rows((const uint16_t *)p->w + (size_t)i0 * p->n, p->xp, p->n, i1 - i0, p->y + i0);
        return;
    }
    size_t rb = dtype_row_bytes(p->dtype, (uint64_t)p->n);
    for (int i = i0; i < i1; i++)
        p->y[i] = p->act ? dot_act((const uint8_t *)p->w + i * rb, p->dtype, p->act) : dot_row(p->w, p->dtype, (size_t)i, p->x, p->n);
}

#define PANEL 64 // weight rows a thread widens to fp32 and multiplies at once (64 x 4096 floats: 1 MiB)

// Several tokens in bf16 arithmetic: oneDNN's matmul on a panel of PANEL bf16 weight rows as they
// are stored, x rounded to bf16 once for all panels (products exact, sums in fp32). Should oneDNN
// fail, the panel is computed row by row in fp32.
static void dnnl_task(void *ctx, int task, int thread) {
    (void)thread;
    Product *p = ctx;
    int i0 = task * PANEL, rows = p->d - i0 < PANEL ? p->d - i0 : PANEL;
    if (gemm_dnnl_panel(p->dnnl, p->y, p->xb, p->w, i0) == 0) return;
    for (int t = 0; t < p->T; t++)
        for (int r = 0; r < rows; r++) p->y[(size_t)t * p->d + i0 + r] = dot_row(p->w, p->dtype, (size_t)(i0 + r), p->x + (size_t)t * p->n, p->n);
}

#ifndef NO_BLAS
// Several tokens: OpenBLAS's sgemm on a panel of PANEL weight rows, widened (bf16) or dequantized
// (Q8_0, Q4_K) once by the thread that multiplies it (OpenBLAS runs single-threaded inside our
// tasks). The products' sums run in sgemm's order, not dot_f32's: results agree with the
// row-by-row path to fp32 rounding, not bit for bit.
static void panel_task(void *ctx, int task, int thread) {
    Product *p = ctx;
    int i0 = task * PANEL, rows = p->d - i0 < PANEL ? p->d - i0 : PANEL, n = p->n;
    const float *wr = (const float *)p->w + (size_t)i0 * n;
    if (p->dtype != DTYPE_F32) {
        float *wp = thread_buf(p, thread, (size_t)PANEL * n);
        if (!wp) { // no scratch: convert inside the dot products
            for (int t = 0; t < p->T; t++)
                for (int r = 0; r < rows; r++) p->y[(size_t)t * p->d + i0 + r] = dot_row(p->w, p->dtype, (size_t)(i0 + r), p->x + (size_t)t * n, n);
            return;
        }
        weights_rows_to_f32(p->w, p->dtype, (size_t)i0, (size_t)rows, (size_t)n, wp);
        wr = wp;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p->T, rows, n, 1.0f, p->x, n, wr, n, 0.0f, p->y + i0, p->d);
}
#else
// Several tokens without BLAS: each weight row widened once and reused for every token.
static void row_reuse_task(void *ctx, int task, int thread) {
    Product *p = ctx;
    int i = task, n = p->n;
    const float *wr = (const float *)p->w + (size_t)i * n;
    if (p->dtype != DTYPE_F32) {
        float *row = thread_buf(p, thread, (size_t)n);
        if (!row) { // no scratch row: convert inside the dot product
            for (int t = 0; t < p->T; t++) p->y[(size_t)t * p->d + i] = dot_row(p->w, p->dtype, (size_t)i, p->x + (size_t)t * n, n);
            return;
        }
        weights_rows_to_f32(p->w, p->dtype, (size_t)i, 1, (size_t)n, row);
        wr = row;
    }
    for (int t = 0; t < p->T; t++) p->y[(size_t)t * p->d + i] = dot_f32(wr, p->x + (size_t)t * n, n);
}
#endif

static void matmul(float *y, const float *x, const void *w, uint32_t dtype, int T, int n, int d) {
    Product p = {y, x, w, dtype, T, n, d, 0, NULL, NULL, NULL, NULL, NULL, {NULL}};
    if (T == 1) { // decode: one pass over the weights, nothing to reuse
        p.rows = decode_rows_per_task(d);
        ActQ8 act = {n, NULL, NULL, NULL};
        void *xp = NULL;
        if (dtype == DTYPE_BF16 && (xp = aligned_alloc(64, dot_bf16_x_bytes(n)))) { // else dot_row's loop
            p.bf16 = dot_bf16_for(cpu_isa());
            p.bf16->prep(x, n, xp);
            p.xp = xp;
        }
        if (dtype_is_quant(dtype)) { // the activations quantized once, as the GPU's decode does
            void *mem = malloc((size_t)n + (size_t)n / 32 * 8);
            if (!mem) {
                fprintf(stderr, "error: out of memory (%zu bytes for a product's quantized activations)\n", (size_t)n * 5 / 4);
                exit(1);
            }
            act.d = mem, act.sum = (int32_t *)mem + n / 32, act.q = (int8_t *)mem + (size_t)n / 32 * 8;
            act_q8_quantize(x, &act);
            p.act = &act;
        }
        pool_run((d + p.rows - 1) / p.rows, rows_task, &p);
        if (p.act) free(act.d);
        free(xp);
        return;
    }
    uint16_t *xb = NULL;
    if (dtype == DTYPE_BF16 && cpu_isa() == CPU_ISA_AVX512BF16 && (xb = malloc((size_t)T * n * sizeof(uint16_t))) &&
        (p.dnnl = gemm_dnnl_create(GEMM_DNNL_BF16, T, n, d, PANEL))) {
        dot_bf16_round(x, (size_t)T * n, xb);
        p.xb = xb;
        pool_run((d + PANEL - 1) / PANEL, dnnl_task, &p);
        gemm_dnnl_destroy(p.dnnl);
        free(xb);
        return;
    }
    free(xb);
#ifndef NO_BLAS
    pool_run((d + PANEL - 1) / PANEL, panel_task, &p);
#else
    pool_run(d, row_reuse_task, &p);
#endif
    for (int i = 0; i < POOL_MAX_THREADS; i++) free(p.buf[i]);
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
