// Q8_0 and Q4_K blocks: sizes, GGML's reference quantization, dequantization, dot products.
#include "quant.h"
#include "cpu_isa.h"
#include "bf16.h"

#include <math.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// The quantizers follow GGML's reference C, whose results depend on how each expression rounds:
// no fused multiply-adds (gcc in ISO C mode already does not contract; clang would, unasked).
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

int dtype_is_quant(uint32_t dtype) {
    return dtype == DTYPE_Q8_0 || dtype == DTYPE_Q4_K || dtype == DTYPE_Q4_0 || dtype == DTYPE_Q6_K || dtype_is_q45(dtype);
}

const char *dtype_name(uint32_t dtype) {
    switch (dtype) {
    case DTYPE_F32: return "f32";
    case DTYPE_BF16: return "bf16";
    case DTYPE_Q8_0: return "q8_0";
    case DTYPE_Q4_K: return "q4_k";
    case DTYPE_Q4_0: return "q4_0";
    case DTYPE_Q6_K: return "q6_k";
    case DTYPE_Q4_1: return "q4_1";
    case DTYPE_Q5_0: return "q5_0";
    case DTYPE_Q5_1: return "q5_1";
    case DTYPE_Q5_K: return "q5_k";
    default: return "?";
    }
}

uint32_t dtype_block_elems(uint32_t dtype) {
    switch (dtype) {
    case DTYPE_F32: case DTYPE_BF16: return 1;
    case DTYPE_Q8_0: return QK8_0;
    case DTYPE_Q4_K: return QK_K;
    case DTYPE_Q4_0: return QK4_0;
    case DTYPE_Q6_K: case DTYPE_Q5_K: return QK_K;
    case DTYPE_Q4_1: case DTYPE_Q5_0: case DTYPE_Q5_1: return 32;
    default: return 0;
    }
}

uint64_t dtype_row_bytes(uint32_t dtype, uint64_t cols) {
    uint32_t be = dtype_block_elems(dtype);
    if (be == 0 || cols % be != 0) return 0;
    switch (dtype) {
    case DTYPE_F32: return cols * 4;
    case DTYPE_BF16: return cols * 2;
    case DTYPE_Q8_0: return cols / QK8_0 * Q8_0_BYTES;
    case DTYPE_Q4_0: return cols / QK4_0 * Q4_0_BYTES;
    case DTYPE_Q6_K: return cols / QK_K * Q6_K_BYTES;
    case DTYPE_Q4_1: return cols / 32 * Q4_1_BYTES;
    case DTYPE_Q5_0: return cols / 32 * Q5_0_BYTES;
    case DTYPE_Q5_1: return cols / 32 * Q5_1_BYTES;
    case DTYPE_Q5_K: return cols / QK_K * Q5_K_BYTES;
    default: return cols / QK_K * Q4_K_BYTES;
    }
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static void wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }

// fp16 scale to float: the F16C instruction where the build has it (same values, exact).
static inline float h2f(const uint8_t *p) {
#if defined(__F16C__)
    return _cvtsh_ss(rd16(p));
#else
    return f16_to_f32(rd16(p));
#endif
}

// GGML's nearest_int: round to nearest, ties to even (its magic-number addition does exactly that
// for the small values it is given; lrintf in the default rounding mode does the same).
static int nearest_int(float x) { return (int)lrintf(x); }

// ---- Q8_0 ----

void quantize_row_q8_0(const float *x, uint8_t *out, size_t n) {
    for (size_t b = 0; b < n / QK8_0; b++, x += QK8_0, out += Q8_0_BYTES) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        // The quants use the unrounded d's reciprocal; only the stored d is rounded to fp16.
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        wr16(out, f32_to_f16(d));
        for (int j = 0; j < QK8_0; j++) {
            float v = roundf(x[j] * id); // half away from zero
            // |v| <= 127 always, but for amax below 2^-121, where 1 / d overflows (GGML converts the
            // Inf to int8 there, undefined behaviour; such a block's fp16 d is 0 anyway).
            if (!(fabsf(v) <= 127.0f)) v = v > 0 ? 127.0f : v < 0 ? -127.0f : 0.0f;
            out[2 + j] = (uint8_t)(int8_t)v;
        }
    }
}

// sum_b d_b sum_j q_j x_j, activations in fp32 (not quantized). Each term d q x meets at most
// n / 32 + 12 roundings (product, the block's partial sums, the scale, a lane's sum over blocks,
// the lanes' sum), within the usual gamma_n bound of an fp32 dot product of length n >= 32.
float dot_q8_0(const uint8_t *w, const float *x, int n) {
    float acc[8] = {0};
    // Widening the quants into their own array first, one block per iteration, is what gcc
    // vectorizes well (4x faster than one fused loop, which it unrolled into scalar code); the
    // scale multiplies a block's 8-lane partial sums once instead of each product.
#pragma GCC unroll 1
    for (int b = 0; b < n / QK8_0; b++, w += Q8_0_BYTES, x += QK8_0) {
        const int8_t *q = (const int8_t *)(w + 2);
        float d = h2f(w), qf[QK8_0], t[8];
        for (int j = 0; j < QK8_0; j++) qf[j] = (float)q[j];
        for (int j = 0; j < 8; j++) t[j] = qf[j] * x[j] + qf[j + 8] * x[j + 8] + qf[j + 16] * x[j + 16] + qf[j + 24] * x[j + 24];
        for (int j = 0; j < 8; j++) acc[j] += d * t[j];
    }
    float s = 0.0f;
    for (int j = 0; j < 8; j++) s += acc[j];
    return s;
}

// ---- Q4_K ----

// Scales and mins of sub-blocks 0..3 are the low 6 bits of bytes 0..3 and 4..7; those of 4..7
// have their low 4 bits in bytes 8..11 (scale low nibble, min high nibble) and their top 2 bits
// in the top bits of bytes 0..3 (scales) and 4..7 (mins).
void q4_k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63, *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

// GGML's make_qkx2_quants for Q4_K's parameters (nmax 15, rmin -1, rdelta 0.1, 20 steps, squared
// error): the scale and (negated) min of one 32-weight sub-block, minimizing the weighted squared
// error over 21 candidate scales, each refit by least squares. L gets the 4-bit levels.
static float fit_sub_block(const float *x, const float *w, uint8_t *L, float *neg_min) {
    enum { N = 32, NMAX = 15, NSTEP = 20 };
    const float rmin = -1.0f, rdelta = 0.1f;
    uint8_t Laux[N];
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < N; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, N);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = (float)NMAX / (max - min), scale = 1 / iscale, best = 0;
    for (int i = 0; i < N; i++) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)(l < 0 ? 0 : l > NMAX ? NMAX : l);
        float diff = scale * L[i] + min - x[i];
        best += w[i] * (diff * diff);
    }
    for (int is = 0; is <= NSTEP; is++) {
        iscale = (rmin + rdelta * (float)is + (float)NMAX) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < N; i++) {
            int l = nearest_int(iscale * (x[i] - min));
            l = l < 0 ? 0 : l > NMAX ? NMAX : l;
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < N; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                err += w[i] * (diff * diff);
            }
            if (err < best) {
                memcpy(L, Laux, N);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

// GGML's quantize_row_q4_K_ref: each sub-block fitted (weights: its rms plus |x|), the eight
// scales and mins quantized to 6 bits against the largest, then every weight's level recomputed
// against the rounded scale and min.
void quantize_row_q4_k(const float *x, uint8_t *out, size_t n) {
    for (size_t b = 0; b < n / QK_K; b++, x += QK_K, out += Q4_K_BYTES) {
        uint8_t L[QK_K], *sc = out + 4, *qs = out + 16;
        float scales[8], mins[8], w[32], max_scale = 0, max_min = 0;
        for (int j = 0; j < 8; j++) {
            const float *xs = x + 32 * j;
            float sum_x2 = 0;
            for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
            float av_x = sqrtf(sum_x2 / 32);
            for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
            scales[j] = fit_sub_block(xs, w, L + 32 * j, &mins[j]);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f, inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
        memset(sc, 0, 12);
        for (int j = 0; j < 8; j++) {
            uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]), lm = (uint8_t)nearest_int(inv_min * mins[j]);
            ls = ls < 63 ? ls : 63;
            lm = lm < 63 ? lm : 63;
            if (j < 4) {
                sc[j] = ls, sc[j + 4] = lm;
            } else {
                sc[j + 4] = (uint8_t)((ls & 15) | (lm & 15) << 4);
                sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
                sc[j] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        wr16(out, f32_to_f16(max_scale / 63.0f));
        wr16(out + 2, f32_to_f16(max_min / 63.0f));
        float d = f16_to_f32(rd16(out)), dmin = f16_to_f32(rd16(out + 2));
        for (int j = 0; j < 8; j++) {
            int s, m;
            q4_k_scale_min(j, sc, &s, &m);
            float dl = d * (float)s;
            if (dl == 0.0f) continue; // the fitted levels stay, as in GGML
            float ml = dmin * (float)m;
            for (int i = 0; i < 32; i++) {
                int l = nearest_int((x[32 * j + i] + ml) / dl);
                L[32 * j + i] = (uint8_t)(l < 0 ? 0 : l > 15 ? 15 : l);
            }
        }
        // Bytes 32p .. 32p + 31 hold sub-block 2p in the low nibbles and 2p + 1 in the high.
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) qs[32 * p + l] = (uint8_t)(L[64 * p + l] | L[64 * p + 32 + l] << 4);
    }
}

// w = (d sc) q - (dmin m): d sc and dmin m are exact in fp32 (11 + 6 bits), so is (d sc) q, and
// the one rounding is the subtraction: GGML's value whatever the evaluation order.
static void dequantize_block_q4_k(const uint8_t *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    for (int s = 0; s < 8; s++) {
        int sc, m;
        q4_k_scale_min(s, b + 4, &sc, &m);
        float dl = d * (float)sc, ml = dmin * (float)m;
        const uint8_t *q = b + 16 + 32 * (s / 2);
        int shift = 4 * (s & 1);
        for (int l = 0; l < 32; l++) y[32 * s + l] = dl * (float)((q[l] >> shift) & 15) - ml;
    }
}

// Each weight formed exactly as dequantize_block_q4_k forms it (the fp32 dot product over GGML's
// dequantized weights), in 32 lanes of partial sums summed at the end. Bytes
// 32p .. 32p + 31 hold sub-blocks 2p (low nibbles) and 2p + 1 (high), done together.
float dot_q4_k(const uint8_t *w, const float *x, int n) {
    float acc[32] = {0};
#pragma GCC unroll 1
    for (int b = 0; b < n / QK_K; b++, w += Q4_K_BYTES, x += QK_K) {
        float d = h2f(w), dmin = h2f(w + 2);
#pragma GCC unroll 1
        for (int p = 0; p < 4; p++) {
            int sc0, m0, sc1, m1;
            q4_k_scale_min(2 * p, w + 4, &sc0, &m0);
            q4_k_scale_min(2 * p + 1, w + 4, &sc1, &m1);
            float dl0 = d * (float)sc0, ml0 = dmin * (float)m0, dl1 = d * (float)sc1, ml1 = dmin * (float)m1;
            const uint8_t *q = w + 16 + 32 * p;
            const float *xs = x + 64 * p;
            float lo[32], hi[32];
            for (int l = 0; l < 32; l++) lo[l] = (float)(q[l] & 15), hi[l] = (float)(q[l] >> 4);
            for (int l = 0; l < 32; l++) acc[l] += (dl0 * lo[l] - ml0) * xs[l];
            for (int l = 0; l < 32; l++) acc[l] += (dl1 * hi[l] - ml1) * xs[32 + l];
        }
    }
    float s = 0.0f;
    for (int l = 0; l < 32; l++) s += acc[l];
    return s;
}

// ---- Q4_0 ----

// sum_b d_b sum_j (q_j - 8) x_j in fp32, (q - 8) exact: the same roundings as dot_q8_0.
float dot_q4_0(const uint8_t *w, const float *x, int n) {
    float s = 0.0f;
    for (int b = 0; b < n / QK4_0; b++, w += Q4_0_BYTES, x += QK4_0) {
        float t = 0.0f;
        for (int j = 0; j < 16; j++) t += (float)((w[2 + j] & 15) - 8) * x[j] + (float)((w[2 + j] >> 4) - 8) * x[j + 16];
        s += h2f(w) * t;
    }
    return s;
}

// ---- Q6_K ----

// GGML's dequantize_row_q6_K: run s (16 weights) has scale sc[s]; weight 128h + 32k + l takes
// nibble k / 2 of ql[64h + 32 (k % 2) + l] and bits 2k of qh[32h + l]. d sc (q - 32) is exact in
// fp32 (11 + 7 + 5 significant bits), so any association gives GGML's value.
static void q6_k_quants(const uint8_t *b, int8_t *q) { // the 256 (q - 32)
    const uint8_t *ql = b, *qh = b + 128;
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                int v = ((ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15) | ((qh[32 * h + l] >> (2 * k)) & 3) << 4;
                q[128 * h + 32 * k + l] = (int8_t)(v - 32);
            }
}

static void dequantize_block_q6_k(const uint8_t *b, float *y) {
    int8_t q[QK_K];
    q6_k_quants(b, q);
    float d = h2f(b + 208);
    for (int s = 0; s < 16; s++) {
        float dl = d * (float)(int8_t)b[192 + s];
        for (int l = 0; l < 16; l++) y[16 * s + l] = dl * (float)q[16 * s + l];
    }
}

float dot_q6_k(const uint8_t *w, const float *x, int n) {
    float s = 0.0f, y[QK_K];
    for (int b = 0; b < n / QK_K; b++, w += Q6_K_BYTES, x += QK_K) {
        dequantize_block_q6_k(w, y);
        float t = 0.0f;
        for (int j = 0; j < QK_K; j++) t += y[j] * x[j];
        s += t;
    }
    return s;
}

// ---- decode activations quantized per 32 (ActQ8) ----

void act_q8_quantize(const float *x, ActQ8 *a) {
    for (int b = 0; b < a->n / 32; b++, x += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < 32; j++) {
            float v = roundf(x[j] * id);
            if (!(fabsf(v) <= 127.0f)) v = v > 0 ? 127.0f : v < 0 ? -127.0f : 0.0f; // as quantize_row_q8_0
            a->q[32 * b + j] = (int8_t)v;
            sum += (int32_t)v;
        }
        a->d[b] = d, a->sum[b] = sum;
    }
}

// Each block's products are exact integer sums (|sum| <= 32 * 127 * 128), in 8 lanes of 4 (AVX2:
// vpmaddubsw + vpmaddwd; else plain loops gcc vectorizes), a lane's sum scaled by d dx (Q4_K: d sc
// dx) into 8 fp32 lanes summed at the end: no horizontal sum per block. The lanes' sums differ
// between the two forms, so do the fp32 roundings: both within the bound test_quant.c checks.
float dot_q8_0_act(const uint8_t *w, const ActQ8 *a) {
    float acc[8] = {0};
#pragma GCC unroll 1
    for (int b = 0; b < a->n / QK8_0; b++, w += Q8_0_BYTES) {
        const int8_t *q = (const int8_t *)(w + 2), *xq = a->q + 32 * b;
        float sc = h2f(w) * a->d[b];
#if defined(__AVX2__) && defined(__FMA__)
        // |q| (unsigned, 128 for -128) times x with q's sign (|x| <= 127): vpmaddubsw cannot overflow
        __m256i qb = _mm256_loadu_si256((const __m256i *)q), xb = _mm256_loadu_si256((const __m256i *)xq);
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(qb, qb), _mm256_sign_epi8(xb, qb)), _mm256_set1_epi16(1));
        _mm256_storeu_ps(acc, _mm256_fmadd_ps(_mm256_set1_ps(sc), _mm256_cvtepi32_ps(p), _mm256_loadu_ps(acc)));
#else
        int32_t p[8];
        for (int j = 0; j < 8; j++) p[j] = q[j] * xq[j] + q[j + 8] * xq[j + 8] + q[j + 16] * xq[j + 16] + q[j + 24] * xq[j + 24];
        for (int j = 0; j < 8; j++) acc[j] += sc * (float)p[j];
#endif
    }
    float s = 0.0f;
    for (int j = 0; j < 8; j++) s += acc[j];
    return s;
}

float dot_q4_k_act(const uint8_t *w, const ActQ8 *a) {
    float acc[8] = {0}, mins = 0.0f;
#pragma GCC unroll 1
    for (int sb = 0; sb < a->n / QK_K; sb++, w += Q4_K_BYTES) {
        float d = h2f(w), dmin = h2f(w + 2);
#pragma GCC unroll 1
        for (int p = 0; p < 4; p++) { // bytes 32p .. 32p + 31: sub-blocks 2p (low nibbles), 2p + 1 (high)
            const uint8_t *q = w + 16 + 32 * p;
            int blk = 8 * sb + 2 * p;
            const int8_t *xl = a->q + 32 * blk, *xh = xl + 32;
            int sc0, m0, sc1, m1;
            q4_k_scale_min(2 * p, w + 4, &sc0, &m0);
            q4_k_scale_min(2 * p + 1, w + 4, &sc1, &m1);
            float s0 = d * (float)sc0 * a->d[blk], s1 = d * (float)sc1 * a->d[blk + 1];
#if defined(__AVX2__) && defined(__FMA__)
            // the nibbles are unsigned: vpmaddubsw takes them against the signed activations as they are
            __m256i qb = _mm256_loadu_si256((const __m256i *)q), m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi16(1);
            __m256i il = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(qb, m4), _mm256_loadu_si256((const __m256i *)xl)), one);
            __m256i ih = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4), _mm256_loadu_si256((const __m256i *)xh)), one);
            __m256 va = _mm256_loadu_ps(acc);
            va = _mm256_fmadd_ps(_mm256_set1_ps(s0), _mm256_cvtepi32_ps(il), va);
            va = _mm256_fmadd_ps(_mm256_set1_ps(s1), _mm256_cvtepi32_ps(ih), va);
            _mm256_storeu_ps(acc, va);
#else
            int8_t lo[32], hi[32];
            for (int l = 0; l < 32; l++) lo[l] = (int8_t)(q[l] & 15), hi[l] = (int8_t)(q[l] >> 4);
            int32_t pl[8], ph[8];
            for (int j = 0; j < 8; j++) {
                pl[j] = lo[j] * xl[j] + lo[j + 8] * xl[j + 8] + lo[j + 16] * xl[j + 16] + lo[j + 24] * xl[j + 24];
                ph[j] = hi[j] * xh[j] + hi[j + 8] * xh[j + 8] + hi[j + 16] * xh[j + 16] + hi[j + 24] * xh[j + 24];
            }
            for (int j = 0; j < 8; j++) acc[j] += s0 * (float)pl[j] + s1 * (float)ph[j];
#endif
            mins += dmin * ((float)m0 * a->d[blk] * (float)a->sum[blk] + (float)m1 * a->d[blk + 1] * (float)a->sum[blk + 1]);
        }
    }
    float s = 0.0f;
    for (int j = 0; j < 8; j++) s += acc[j];
    return s - mins;
}

float dot_q4_0_act(const uint8_t *w, const ActQ8 *a) {
    float acc[8] = {0}, offs = 0.0f;
#pragma GCC unroll 1
    for (int b = 0; b < a->n / QK4_0; b++, w += Q4_0_BYTES) {
        const int8_t *xq = a->q + 32 * b;
        float sc = h2f(w) * a->d[b];
#if defined(__AVX2__) && defined(__FMA__)
        __m128i qh = _mm_loadu_si128((const __m128i *)(w + 2)), m4 = _mm_set1_epi8(15);
        __m256i qb = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qh, 4), m4), _mm_and_si128(qh, m4)); // weights 0..15, 16..31
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(qb, _mm256_loadu_si256((const __m256i *)xq)), _mm256_set1_epi16(1));
        _mm256_storeu_ps(acc, _mm256_fmadd_ps(_mm256_set1_ps(sc), _mm256_cvtepi32_ps(p), _mm256_loadu_ps(acc)));
#else
        int8_t q[32];
        for (int j = 0; j < 16; j++) q[j] = (int8_t)(w[2 + j] & 15), q[j + 16] = (int8_t)(w[2 + j] >> 4);
        int32_t p[8];
        for (int j = 0; j < 8; j++) p[j] = q[j] * xq[j] + q[j + 8] * xq[j + 8] + q[j + 16] * xq[j + 16] + q[j + 24] * xq[j + 24];
        for (int j = 0; j < 8; j++) acc[j] += sc * (float)p[j];
#endif
        offs += sc * (float)(8 * a->sum[b]); // the quants' offset of 8: sum_j (q_j - 8) qx_j
    }
    float s = 0.0f;
    for (int j = 0; j < 8; j++) s += acc[j];
    return s - offs;
}

float dot_q6_k_act(const uint8_t *w, const ActQ8 *a) {
    float s = 0.0f;
    for (int sb = 0; sb < a->n / QK_K; sb++, w += Q6_K_BYTES) {
        int8_t q[QK_K];
        q6_k_quants(w, q);
        const int8_t *xq = a->q + QK_K * sb;
        float d = h2f(w + 208);
        for (int r = 0; r < 16; r++) { // runs of 16: two a block of activations
            int32_t isum = 0;
            for (int l = 0; l < 16; l++) isum += q[16 * r + l] * xq[16 * r + l];
            s += d * (float)(int8_t)w[192 + r] * a->d[8 * sb + r / 2] * (float)isum;
        }
    }
    return s;
}

float dot_act(const uint8_t *w, uint32_t dtype, const ActQ8 *a) {
    if (cpu_int8_vnni()) switch (dtype) { // the same bits as the AVX2 kernels, fewer instructions
        case DTYPE_Q8_0: return dot_q8_0_act_vnni(w, a);
        case DTYPE_Q4_K: return dot_q4_k_act_vnni(w, a);
        case DTYPE_Q4_0: return dot_q4_0_act_vnni(w, a);
        }
    switch (dtype) {
    case DTYPE_Q8_0: return dot_q8_0_act(w, a);
    case DTYPE_Q4_K: return dot_q4_k_act(w, a);
    case DTYPE_Q4_0: return dot_q4_0_act(w, a);
    case DTYPE_Q6_K: return dot_q6_k_act(w, a);
    default: return dot_q45_act(w, dtype, a);
    }
}

void weights_rows_to_f32(const void *src, uint32_t dtype, size_t row0, size_t n_rows, size_t cols, float *out) {
    const uint8_t *p = (const uint8_t *)src + row0 * dtype_row_bytes(dtype, cols);
    size_t n = n_rows * cols;
    switch (dtype) {
    case DTYPE_F32:
        memcpy(out, p, n * sizeof(float));
        break;
    case DTYPE_BF16:
        for (size_t i = 0; i < n; i++) out[i] = bf16_to_f32(rd16(p + 2 * i));
        break;
    case DTYPE_Q8_0:
        for (size_t b = 0; b < n / QK8_0; b++, p += Q8_0_BYTES, out += QK8_0) {
            float d = h2f(p);
            for (int j = 0; j < QK8_0; j++) out[j] = d * (float)(int8_t)p[2 + j];
        }
        break;
    case DTYPE_Q4_K:
        for (size_t b = 0; b < n / QK_K; b++, p += Q4_K_BYTES, out += QK_K) dequantize_block_q4_k(p, out);
        break;
    case DTYPE_Q6_K:
        for (size_t b = 0; b < n / QK_K; b++, p += Q6_K_BYTES, out += QK_K) dequantize_block_q6_k(p, out);
        break;
    case DTYPE_Q4_1: case DTYPE_Q5_0: case DTYPE_Q5_1: case DTYPE_Q5_K:
        dequantize_q45(p, dtype, n, out);
        break;
    case DTYPE_Q4_0: // GGML's dequantize_row_q4_0: (q - 8) d, one exact product
        for (size_t b = 0; b < n / QK4_0; b++, p += Q4_0_BYTES, out += QK4_0) {
            float d = h2f(p);
            for (int j = 0; j < 16; j++) out[j] = (float)((p[2 + j] & 15) - 8) * d, out[j + 16] = (float)((p[2 + j] >> 4) - 8) * d;
        }
        break;
    }
}
