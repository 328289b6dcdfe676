// Quantized weights (model/quant.h) on the CPU path.
//
// 1. weights_rows_to_f32 on random Q8_0 / Q4_K / Q4_0 / Q6_K / Q4_1 / Q5_0 / Q5_1 / Q5_K blocks (random bytes, finite fp16 scales of
//    either sign, subnormals and zeros among them) equals weights/gguf.c's dequantization bit for bit:
//    that one is checked against gguf-py's in tests/test_kquants.py, and both form each value
//    with one rounding at most (the products are exact in fp32), so they must agree exactly.
// 2. Quantization error: Q8_0 within 0.5 d + 127 |d - fp16(d)| (the quant is round(x / d) with
//    d = amax / 127, the stored scale fp16(d)); Q4_K within half a step d sc of the rounded scale
//    wherever the level is not clamped, and its rms error on Gaussian rows under 0.1 of theirs.
// 3. The matrix products (decode T = 1: the block dot products; T > 1: dequantized panels through
//    sgemm, or row by row without BLAS) and the embedding lookup against a double-precision
//    reference over the dequantized weights. Bound per output: (n + 2) u sum_j |w_j x_j|, u = 2^-24:
//    the classic gamma_n bound of a length-n dot product in any order (1% for its 1/(1 - nu)). Q4_K
//    forms each weight d sc q - dmin m exactly as dequantized, then a product and at most n - 1
//    additions; Q8_0 scales each block's sum of q x by d: at most n / 32 + 12 roundings a term;
//    sgemm on dequantized panels: one product and n - 1 additions. Decode multiplies activations
//    quantized per 32 (quant.h's ActQ8): checked against double over those quantized values.
#include "../model/backend.h"
#include "../model/bf16.h"
#include "../model/cpu_isa.h"
#include "../model/quant.h"
#include "../weights/gguf.h"
#include "test_pariskv_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint16_t random_f16(Rng *r) {
    // finite, either sign, magnitude 2^-24 .. 2^4 (subnormals included), 1 in 16 zero
    if (next_u64(r) % 16 == 0) return 0;
    float v = ldexpf(1.0f + (float)uniform(r), -24 + (int)(next_u64(r) % 28));
    return (uint16_t)(f32_to_f16(v) | (next_u64(r) & 1 ? 0x8000 : 0));
}

static void random_blocks(Rng *r, uint32_t dtype, uint8_t *p, size_t n_blocks) {
    size_t bb = dtype_row_bytes(dtype, dtype_block_elems(dtype)), at = dtype == DTYPE_Q6_K ? 208 : 0; // where d is
    for (size_t i = 0; i < n_blocks * bb; i++) p[i] = (uint8_t)next_u64(r);
    for (size_t b = 0; b < n_blocks; b++) {
        uint16_t d = random_f16(r), m = random_f16(r);
        memcpy(p + b * bb + at, &d, 2);
        if (dtype == DTYPE_Q4_K || dtype == DTYPE_Q5_K || dtype == DTYPE_Q4_1 || dtype == DTYPE_Q5_1) memcpy(p + b * bb + 2, &m, 2);
    }
}

static void test_dequantize(Rng *r) {
    static const uint32_t dts[8] = {DTYPE_Q8_0, DTYPE_Q4_K, DTYPE_Q4_0, DTYPE_Q6_K, DTYPE_Q4_1, DTYPE_Q5_0, DTYPE_Q5_1, DTYPE_Q5_K};
    static const uint32_t types[8] = {GGML_Q8_0, GGML_Q4_K, GGML_Q4_0, GGML_Q6_K, GGML_Q4_1, GGML_Q5_0, GGML_Q5_1, GGML_Q5_K};
    for (int k = 0; k < 8; k++) {
        uint32_t dt = dts[k];
        size_t rows = 7, cols = dtype_block_elems(dt) == 256 ? 512 : 96, rb = dtype_row_bytes(dt, cols), n = rows * cols;
        uint8_t *blk = malloc(rows * rb);
        float *ours = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
        random_blocks(r, dt, blk, rows * cols / dtype_block_elems(dt));
        GgufTensor t = {.name = "t", .type = types[k], .ndim = 2, .ne = {cols, rows, 1, 1},
                        .n_elems = n, .data = blk, .nbytes = rows * rb};
        char err[GGUF_ERR_LEN];
        int ok = gguf_dequantize(&t, ref, err) == 0;
        // whole, then row by row from an offset: the same values
        weights_rows_to_f32(blk, dt, 0, rows, cols, ours);
        size_t same = 0;
        for (size_t i = 0; i < n; i++) same += memcmp(&ours[i], &ref[i], 4) == 0;
        for (size_t i = 0; i < rows; i++) {
            weights_rows_to_f32(blk, dt, i, 1, cols, ours + i * cols);
        }
        for (size_t i = 0; i < n; i++) same -= memcmp(&ours[i], &ref[i], 4) != 0;
        check(ok && same == n, "%s: weights_rows_to_f32 equals gguf_dequantize bit for bit (%zu of %zu values)", dtype_name(dt), same, n);
        free(blk), free(ours), free(ref);
    }
}

static void test_quantize_error(Rng *r) {
    enum { COLS = 1024 };
    float x[COLS], back[COLS];
    uint8_t blk[COLS / QK8_0 * Q8_0_BYTES];
    // Q8_0 on rows of several scales (one so small that 1 / d overflows), one all zero, outliers
    int bad = 0;
    for (int row = 0; row < 40; row++) {
        float scale = ldexpf(1.0f, row == 39 ? -125 : -20 + row); // 2^-125: 1 / d overflows to Inf
        for (int j = 0; j < COLS; j++) x[j] = row == 0 ? 0.0f : gauss(r) * scale * (j == 77 ? 30.0f : 1.0f);
        quantize_row_q8_0(x, blk, COLS);
        weights_rows_to_f32(blk, DTYPE_Q8_0, 0, 1, COLS, back);
        for (int b = 0; b < COLS / QK8_0; b++) {
            float amax = 0;
            for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[b * QK8_0 + j]));
            double d = (double)(amax / 127.0f), d16 = f16_to_f32(f32_to_f16(amax / 127.0f));
            double bound = 0.5 * d * (1 + 1e-6) + 127 * fabs(d - d16) + 1e-45;
            for (int j = 0; j < QK8_0; j++) bad += fabs((double)x[b * QK8_0 + j] - back[b * QK8_0 + j]) > bound;
        }
    }
    check(bad == 0, "q8_0: every weight within 0.5 d + 127 |d - fp16(d)| of its source (%d outside)", bad);

    // Q4_K on Gaussian rows: half a step wherever the level is not clamped; rms error
    uint8_t kb[COLS / QK_K * Q4_K_BYTES];
    double se = 0, sx = 0;
    long unclamped = 0, over = 0;
    for (int row = 0; row < 64; row++) {
        for (int j = 0; j < COLS; j++) x[j] = gauss(r) * 0.02f + (row % 4 == 1 ? 0.01f : 0.0f);
        quantize_row_q4_k(x, kb, COLS);
        weights_rows_to_f32(kb, DTYPE_Q4_K, 0, 1, COLS, back);
        for (int b = 0; b < COLS / QK_K; b++) {
            const uint8_t *p = kb + b * Q4_K_BYTES;
            float d = f16_to_f32((uint16_t)(p[0] | p[1] << 8)), dmin = f16_to_f32((uint16_t)(p[2] | p[3] << 8));
            for (int s = 0; s < 8; s++) {
                int sc, m;
                q4_k_scale_min(s, p + 4, &sc, &m);
                double dl = (double)d * sc, ml = (double)dmin * m;
                for (int l = 0; l < 32; l++) {
                    int j = b * QK_K + 32 * s + l;
                    double lev = ((double)x[j] + ml) / dl;
                    double e = fabs((double)x[j] - back[j]);
                    se += e * e, sx += (double)x[j] * x[j];
                    if (dl > 0 && lev >= -0.49 && lev <= 15.49) {
                        unclamped++;
                        over += e > 0.5 * dl * (1 + 1e-5) + 1e-6 * fabs(x[j]);
                    }
                }
            }
        }
    }
    check(over == 0 && unclamped > 64L * COLS * 9 / 10,
          "q4_k: unclamped weights (%ld, >= 90%%) within half a step of their source (%ld outside)", unclamped, over);
    check(sqrt(se / sx) < 0.1, "q4_k: rms error %.4f of the rows' rms (< 0.1)", sqrt(se / sx));
    // an all-zero row: all-zero weights, finite scales
    memset(x, 0, sizeof x);
    quantize_row_q4_k(x, kb, COLS);
    weights_rows_to_f32(kb, DTYPE_Q4_K, 0, 1, COLS, back);
    int zero = 1;
    for (int j = 0; j < COLS; j++) zero &= back[j] == 0.0f;
    check(zero, "q4_k: an all-zero row comes back all zero");
}

// Per weight, the magnitude its term's roundings scale with: |w| (Q8_0), |d sc q| + |dmin m| (Q4_K,
// Q5_K, whose decode products sum d sc q x and dmin m x apart), |d q| + |m| (Q4_1, Q5_1 likewise).
static void weight_mags(const uint8_t *q, uint32_t dt, int rows, int n, const float *w, double *mag) {
    size_t rb = dtype_row_bytes(dt, (uint64_t)n);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < n; j++) {
            size_t k = (size_t)i * n + j;
            if (dt == DTYPE_Q4_1 || dt == DTYPE_Q5_1 || dt == DTYPE_Q5_K) { // |w - offset| + |offset|
                size_t be = dtype_block_elems(dt);
                const uint8_t *blk = q + i * rb + (size_t)(j / be) * dtype_row_bytes(dt, be);
                double off = f16_to_f32(*(const uint16_t *)(blk + 2));
                if (dt == DTYPE_Q5_K) {
                    int sc, m;
                    q4_k_scale_min(j % 256 / 32, blk + 4, &sc, &m);
                    off = -off * m;
                }
                mag[k] = fabs(w[k] - off) + fabs(off);
                continue;
            }
            if (dt != DTYPE_Q4_K) {
                mag[k] = fabs(w[k]);
                continue;
            }
            const uint8_t *blk = q + i * rb + (size_t)(j / 256) * Q4_K_BYTES;
            int sc, m, l = j % 256, qv = l % 64 < 32 ? blk[16 + 32 * (l / 64) + l % 32] & 15 : blk[16 + 32 * (l / 64) + l % 32] >> 4;
            q4_k_scale_min(l / 32, blk + 4, &sc, &m);
            mag[k] = fabs((double)f16_to_f32(*(const uint16_t *)blk) * sc * qv) + fabs((double)f16_to_f32(*(const uint16_t *)(blk + 2)) * m);
        }
}

// The decode activations (ActQ8): per block the quants quantize_row_q8_0 gives the same values
// (GGML's Q8_0 arithmetic, checked against gguf-py in test_quant.py), d = max|x| / 127 in fp32,
// the sums; zero, tiny (1 / d overflows) and outlier blocks among them.
static void test_act_quantize(Rng *r) {
    enum { N = 32 * 40 };
    float x[N];
    int8_t q[N];
    float d[N / 32];
    int32_t sum[N / 32];
    uint8_t blk[Q8_0_BYTES];
    for (int j = 0; j < N; j++) x[j] = gauss(r) * (j % 97 == 0 ? 50.0f : 1.0f);
    for (int j = 0; j < 32; j++) x[64 + j] = 0.0f, x[96 + j] = ldexpf(gauss(r), -126); // a zero block, a subnormal one
    ActQ8 a = {N, q, d, sum};
    act_q8_quantize(x, &a);
    int bad = 0;
    for (int b = 0; b < N / 32; b++) {
        quantize_row_q8_0(x + 32 * b, blk, 32);
        float amax = 0.0f;
        int32_t s = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j])), s += q[32 * b + j];
        bad += memcmp(blk + 2, q + 32 * b, 32) != 0 || d[b] != amax / 127.0f || sum[b] != s;
    }
    check(bad == 0, "decode activations: quants as quantize_row_q8_0's, d = max|x| / 127 in fp32, the sums (%d of %d blocks differ)", bad, N / 32);
}

// y = x W^T against double over the dequantized weights, within (n + 2) u sum |w x| (T > 1). A
// decode (T = 1) multiplies the activations as quantized (dx q): against double over those, within
// (n / 32 + 4) u sum mag |dx q|: a block's integer sums are exact, then at most four roundings
// (d dx or d sc, times the sum, the min term's, the difference times dx) and the n / 32 additions
// (Q6_K, a scale per 16 weights: n / 16 + 4).
static void test_matmul(Rng *r, uint32_t dt, int T, int n, int d) {
    size_t rb = dtype_row_bytes(dt, (uint64_t)n);
    float *src = malloc((size_t)d * n * sizeof(float)), *w = malloc((size_t)d * n * sizeof(float));
    float *x = malloc((size_t)T * n * sizeof(float)), *y = malloc((size_t)T * d * sizeof(float));
    uint8_t *q = malloc((size_t)d * rb);
    for (size_t i = 0; i < (size_t)d * n; i++) src[i] = gauss(r) * 0.05f + (i % 7 == 0 ? 0.02f : 0.0f);
    for (size_t i = 0; i < (size_t)T * n; i++) x[i] = gauss(r) * (i % 11 == 0 ? 8.0f : 1.0f);
    for (int i = 0; i < d; i++) {
        if (dt == DTYPE_Q8_0) quantize_row_q8_0(src + (size_t)i * n, q + i * rb, (size_t)n);
        else if (dt == DTYPE_Q4_K) quantize_row_q4_k(src + (size_t)i * n, q + i * rb, (size_t)n);
        else { // Q4_0, Q6_K, Q4_1, Q5_* (no quantizer: GGUF files only): random quants, scales of real weights' size
            size_t be = dtype_block_elems(dt), bb = dtype_row_bytes(dt, be);
            random_blocks(r, dt, q + i * rb, (size_t)n / be);
            for (size_t b = 0; b < (size_t)n / be; b++) {
                float scale = dt == DTYPE_Q6_K ? 0.0005f : dt == DTYPE_Q5_K ? 0.0002f : dt == DTYPE_Q5_0 || dt == DTYPE_Q5_1 ? 0.005f : 0.01f;
                uint16_t h = f32_to_f16(scale * (1.0f + (float)uniform(r))), m = f32_to_f16(-0.08f * (float)uniform(r));
                memcpy(q + i * rb + b * bb + (dt == DTYPE_Q6_K ? 208 : 0), &h, 2);
                if (dt == DTYPE_Q4_1 || dt == DTYPE_Q5_1) memcpy(q + i * rb + b * bb + 2, &m, 2); // w = d q + m, m < 0
                if (dt == DTYPE_Q5_K) m = f32_to_f16(0.0002f * (float)uniform(r)), memcpy(q + i * rb + b * bb + 2, &m, 2);
            }
        }
    }
    weights_rows_to_f32(q, dt, 0, (size_t)d, (size_t)n, w);
    backend_cpu.matmul(y, x, q, dt, T, n, d);
    double *xr = malloc((size_t)T * n * sizeof(double)), *wm = malloc((size_t)d * n * sizeof(double));
    for (size_t i = 0; i < (size_t)T * n; i++) xr[i] = x[i];
    for (size_t i = 0; i < (size_t)d * n; i++) wm[i] = fabs(w[i]);
    double terms = n + 2;
    if (T == 1) { // the activations as the decode product quantizes them
        int8_t *aq = malloc((size_t)n);
        float *ad = malloc((size_t)n / 32 * sizeof(float));
        int32_t *as = malloc((size_t)n / 32 * sizeof(int32_t));
        ActQ8 a = {n, aq, ad, as};
        act_q8_quantize(x, &a);
        for (int j = 0; j < n; j++) xr[j] = (double)ad[j / 32] * aq[j];
        weight_mags(q, dt, d, n, w, wm);
        terms = (dt == DTYPE_Q6_K ? n / 16 : n / 32) + 4; // Q6_K: a scale (a rounded term) per 16 weights
        free(aq), free(ad), free(as);
    }
    const double u = ldexp(1.0, -24);
    int bad = 0;
    double worst = 0, qerr = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++) {
            double ref = 0, mag = 0, exact = 0;
            for (int j = 0; j < n; j++) {
                double p = (double)w[(size_t)i * n + j] * xr[(size_t)t * n + j];
                ref += p, mag += wm[(size_t)i * n + j] * fabs(xr[(size_t)t * n + j]);
                exact += (double)w[(size_t)i * n + j] * x[(size_t)t * n + j];
            }
            double e = fabs((double)y[(size_t)t * d + i] - ref), bound = 1.01 * terms * u * mag;
            bad += !(e <= bound);
            if (mag > 0 && e / (u * mag) > worst) worst = e / (u * mag);
            if (mag > 0 && fabs(ref - exact) / mag > qerr) qerr = fabs(ref - exact) / mag;
        }
    if (T == 1)
        check(bad == 0,
              "%s decode product n=%d d=%d on activations quantized per 32: every output within (n / 32 + 4) u sum|mag dx q| of double (Q6_K: n / 16 + 4) "
              "(worst %.1f u, %d outside; the quantization itself moves outputs by up to %.2g of sum|mag x|)",
              dtype_name(dt), n, d, worst, bad, qerr);
    else
        check(bad == 0, "%s matmul T=%d n=%d d=%d: every output within (n + 2) u sum|w x| of double (worst %.1f u sum|w x|, %d outside)",
              dtype_name(dt), T, n, d, worst, bad);
    free(xr), free(wm);
    // the embedding lookup: rows exactly as dequantized
    int tokens[3] = {0, d - 1, d / 2};
    float *e = malloc(3 * (size_t)n * sizeof(float));
    backend_cpu.embed(e, q, dt, tokens, 3, n);
    int same = 1;
    for (int k = 0; k < 3; k++) same &= memcmp(e + (size_t)k * n, w + (size_t)tokens[k] * n, (size_t)n * sizeof(float)) == 0;
    if (T == 1) check(same, "%s embed: rows equal the dequantized weights", dtype_name(dt));
    free(src), free(w), free(x), free(y), free(q), free(e);
}

// The AVX512_VNNI kernels (quant_vnni.c) against the AVX2 ones, on the same rows and activations:
// the same integer lanes and the same fp32 steps, so equal bit for bit. Only where the CPU has
// VNNI and the chosen set allows it (cpu_int8_vnni); elsewhere nothing is counted.
static void test_vnni(Rng *r) {
    if (!cpu_int8_vnni()) {
        printf("note: the VNNI kernels not run: this CPU lacks AVX512_VNNI or the chosen set is below avx512 (nothing counted)\n");
        return;
    }
#if defined(__AVX2__) && defined(__FMA__)
    enum { N = 4096, ROWS = 40 };
    float x[N];
    int8_t aq[N];
    float ad[N / 32];
    int32_t as[N / 32];
    ActQ8 a = {N, aq, ad, as};
    static const uint32_t dts[3] = {DTYPE_Q8_0, DTYPE_Q4_K, DTYPE_Q4_0};
    for (int k = 0; k < 3; k++) {
        uint32_t dt = dts[k];
        size_t rb = dtype_row_bytes(dt, N);
        uint8_t *q = malloc(ROWS * rb);
        random_blocks(r, dt, q, ROWS * (N / dtype_block_elems(dt)));
        for (size_t b = 0; b < ROWS * (N / dtype_block_elems(dt)); b++) { // scales of real weights' size
            uint16_t h = f32_to_f16(0.01f * (1.0f + (float)uniform(r)));
            memcpy(q + b * dtype_row_bytes(dt, dtype_block_elems(dt)), &h, 2);
        }
        int differ = 0;
        for (int i = 0; i < ROWS; i++) {
            for (int j = 0; j < N; j++) x[j] = gauss(r) * (j % 11 == 0 ? 8.0f : 1.0f);
            act_q8_quantize(x, &a);
            const uint8_t *w = q + i * rb;
            float v = dt == DTYPE_Q8_0 ? dot_q8_0_act_vnni(w, &a) : dt == DTYPE_Q4_K ? dot_q4_k_act_vnni(w, &a) : dot_q4_0_act_vnni(w, &a);
            float e = dt == DTYPE_Q8_0 ? dot_q8_0_act(w, &a) : dt == DTYPE_Q4_K ? dot_q4_k_act(w, &a) : dot_q4_0_act(w, &a);
            differ += memcmp(&v, &e, sizeof v) != 0;
        }
        check(differ == 0, "%s decode product with AVX512_VNNI: %d rows of %d equal the AVX2 kernel's bit for bit (%d differ)", dtype_name(dt),
              ROWS - differ, N, differ);
        free(q);
    }
#else
    (void)r;
    printf("note: the VNNI kernels not compared: this build has no AVX2 kernels to compare with (-march); the decode checks above ran them\n");
#endif
}

static void test_sizes(void) {
    check(dtype_row_bytes(DTYPE_Q8_0, 576) == 18 * 34 && dtype_row_bytes(DTYPE_Q4_K, 1536) == 6 * 144 &&
              dtype_row_bytes(DTYPE_Q4_0, 576) == 18 * 18 && dtype_row_bytes(DTYPE_Q4_0, 48) == 0 &&
              dtype_row_bytes(DTYPE_Q6_K, 512) == 2 * 210 && dtype_row_bytes(DTYPE_Q6_K, 576) == 0 &&
              dtype_row_bytes(DTYPE_Q4_K, 576) == 0 && dtype_row_bytes(DTYPE_Q8_0, 33) == 0 &&
              dtype_row_bytes(DTYPE_BF16, 3) == 6 && dtype_row_bytes(DTYPE_F32, 3) == 12 && dtype_row_bytes(DTYPE_COUNT, 256) == 0 &&
              dtype_row_bytes(DTYPE_Q4_1, 576) == 18 * 20 && dtype_row_bytes(DTYPE_Q5_0, 576) == 18 * 22 &&
              dtype_row_bytes(DTYPE_Q5_1, 576) == 18 * 24 && dtype_row_bytes(DTYPE_Q5_K, 512) == 2 * 176 &&
              dtype_row_bytes(DTYPE_Q5_K, 576) == 0 && dtype_row_bytes(DTYPE_Q4_1, 48) == 0,
          "row sizes: q8_0 34 B / 32, q4_k 144 B / 256, q4_0 18 B / 32, q6_k 210 B / 256, q4_1 20 B / 32, q5_0 22 B / 32, "
          "q5_1 24 B / 32, q5_k 176 B / 256, partial blocks and unknown dtypes 0");
}

int main(void) {
    Rng r = {14};
    test_sizes();
    test_dequantize(&r);
    test_quantize_error(&r);
    test_act_quantize(&r);
    static const uint32_t dts[8] = {DTYPE_Q8_0, DTYPE_Q4_K, DTYPE_Q4_0, DTYPE_Q6_K, DTYPE_Q4_1, DTYPE_Q5_0, DTYPE_Q5_1, DTYPE_Q5_K};
    for (int k = 0; k < 8; k++) {
        uint32_t dt = dts[k];
        test_matmul(&r, dt, 1, 1536, 300);  // decode: the block dot products
        test_matmul(&r, dt, 5, 512, 200);   // prefill: dequantized panels (sgemm, or row by row)
        test_matmul(&r, dt, 1, 4096, 64);   // a long row
    }
    test_vnni(&r);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
