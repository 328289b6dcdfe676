// Q4_1, Q5_0, Q5_1 and Q5_K blocks (model/quant.h), kept from GGUF files by ./export --dtype keep
// (no quantizer: llama.cpp makes them): GGML's dequantization, value for value, and the dot
// products the CPU path multiplies with (a decode step's on AVX2 where the build has it, as
// quant.c's; the integer sums are the same either way, the fp32 roundings within one bound).
#include "quant.h"
#include "bf16.h"

#include <string.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// No fused multiply-adds: q d + m rounds the product and the sum apart, as GGML's C does.
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

// fp16 scale to float: the F16C instruction where the build has it (same values, exact).
static inline float h2f(const uint8_t *p) {
#if defined(__F16C__)
    return _cvtsh_ss((uint16_t)(p[0] | p[1] << 8));
#else
    return f16_to_f32((uint16_t)(p[0] | p[1] << 8));
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
// The 32 levels of a 32-weight block as bytes (weight j in byte j): qs's nibbles, and where qh is
// given (Q5_*) bit j of it as 16 (GGML's bytes_from_bits_32: byte j all ones when bit j is set).
static inline __m256i levels32_avx2(const uint8_t *qs, const uint8_t *qh) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(15);
    __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    if (!qh) return v;
    uint32_t h;
    memcpy(&h, qh, 4);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                                       0x0101010101010101, 0x0000000000000000));
    bytes = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
    return _mm256_or_si256(v, _mm256_and_si256(bytes, _mm256_set1_epi8(16)));
}

// 8 int32 partial sums of levels (unsigned, < 32) times activations (signed): no overflow in vpmaddubsw.
static inline __m256i dot32_avx2(__m256i lev, const int8_t *xq) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(lev, _mm256_loadu_si256((const __m256i *)xq)), _mm256_set1_epi16(1));
}
#endif

// ---- the 32-weight blocks: Q4_1 (d, m, qs[16]), Q5_0 (d, qh[4], qs[16]), Q5_1 (d, m, qh[4], qs[16]) ----

// The block's 32 levels: weight j < 16 in qs[j]'s low nibble, j + 16 in its high one; Q5_*'s fifth
// bit of weight j is bit j of the little-endian qh.
static void levels32(const uint8_t *b, uint32_t dtype, uint8_t *q) {
    const uint8_t *qs = b + (dtype == DTYPE_Q4_1 ? 4 : dtype == DTYPE_Q5_0 ? 6 : 8);
    uint32_t h = 0;
    if (dtype != DTYPE_Q4_1) {
        const uint8_t *qh = qs - 4;
        h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    }
    for (int j = 0; j < 16; j++) {
        q[j] = (uint8_t)((qs[j] & 15) | ((h >> j) & 1) << 4);
        q[j + 16] = (uint8_t)((qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4);
    }
}

// GGML's dequantize_row_q4_1 / q5_1: q d + m (the product exact, one rounding in the sum);
// q5_0: (q - 16) d, exact.
static void dequantize_block32(const uint8_t *b, uint32_t dtype, float *y) {
    uint8_t q[32];
    levels32(b, dtype, q);
    float d = h2f(b), m = dtype == DTYPE_Q5_0 ? 0.0f : h2f(b + 2);
    for (int j = 0; j < 32; j++) y[j] = dtype == DTYPE_Q5_0 ? (float)(q[j] - 16) * d : (float)q[j] * d + m;
}

// ---- Q5_K: d, dmin, scales[12] (as Q4_K's), qh[32], qs[128] ----

// As Q4_K with a fifth bit: sub-block s takes the low (s even) or high nibbles of qs[32 (s / 2) ..]
// and bit s of qh[l]; w = (d sc) q - (dmin m), d sc and dmin m exact: one rounding.
static void dequantize_block_q5_k(const uint8_t *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int s = 0; s < 8; s++) {
        int sc, m;
        q4_k_scale_min(s, b + 4, &sc, &m);
        float dl = d * (float)sc, ml = dmin * (float)m;
        const uint8_t *q = qs + 32 * (s / 2);
        int shift = 4 * (s & 1);
        for (int l = 0; l < 32; l++) y[32 * s + l] = dl * (float)(((q[l] >> shift) & 15) | ((qh[l] >> s) & 1) << 4) - ml;
    }
}

#if !(defined(__AVX2__) && defined(__FMA__)) // the scalar product's levels (AVX2 forms them in registers)
static void q5_k_levels(const uint8_t *b, uint8_t *q) {
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int s = 0; s < 8; s++)
        for (int l = 0; l < 32; l++) q[32 * s + l] = (uint8_t)(((qs[32 * (s / 2) + l] >> (4 * (s & 1))) & 15) | ((qh[l] >> s) & 1) << 4);
}
#endif

// ---- the four together ----

int dtype_is_q45(uint32_t dtype) { return dtype == DTYPE_Q4_1 || dtype == DTYPE_Q5_0 || dtype == DTYPE_Q5_1 || dtype == DTYPE_Q5_K; }

void dequantize_q45(const uint8_t *p, uint32_t dtype, size_t n, float *out) {
    size_t be = dtype_block_elems(dtype), bb = dtype_row_bytes(dtype, be);
    for (size_t b = 0; b < n / be; b++, p += bb, out += be) {
        if (dtype == DTYPE_Q5_K) dequantize_block_q5_k(p, out);
        else dequantize_block32(p, dtype, out);
    }
}

// sum_j w_j x_j in fp32 over the dequantized weights, a block's partial sum at a time.
float dot_q45(const uint8_t *w, uint32_t dtype, const float *x, int n) {
    size_t be = dtype_block_elems(dtype), bb = dtype_row_bytes(dtype, be);
    float s = 0.0f, y[QK_K];
    for (size_t b = 0; b < (size_t)n / be; b++, w += bb, x += be) {
        dequantize_q45(w, dtype, be, y);
        float t = 0.0f;
        for (size_t j = 0; j < be; j++) t += y[j] * x[j];
        s += t;
    }
    return s;
}

// Q4_1 / Q5_1: sum_b (d dx sum_j q_j qx_j + m dx sum_j qx_j); Q5_0: sum_b d dx (sum_j q_j qx_j -
// 16 sum_j qx_j), the difference exact. GGML's vec_dot on Q8_1 / Q8_0 activations.
static float dot_block32_act(const uint8_t *w, uint32_t dtype, const ActQ8 *a) {
    size_t bb = dtype_row_bytes(dtype, 32);
#if defined(__AVX2__) && defined(__FMA__)
    // as dot_q4_0_act: each block's integer sums scaled by d dx into 8 fp32 lanes; the offset
    // (Q5_0: 16 sum qx) or the minimum's term (m dx sum qx) summed apart
    int has_m = dtype != DTYPE_Q5_0, qs_at = dtype == DTYPE_Q4_1 ? 4 : dtype == DTYPE_Q5_0 ? 6 : 8;
    __m256 acc = _mm256_setzero_ps();
    float extra = 0.0f;
    for (int b = 0; b < a->n / 32; b++, w += bb) {
        float sc = h2f(w) * a->d[b];
        __m256i lev = levels32_avx2(w + qs_at, dtype == DTYPE_Q4_1 ? NULL : w + qs_at - 4);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(sc), _mm256_cvtepi32_ps(dot32_avx2(lev, a->q + 32 * b)), acc);
        extra += has_m ? h2f(w + 2) * a->d[b] * (float)a->sum[b] : sc * (float)(16 * a->sum[b]);
    }
    float lanes[8], s = 0.0f;
    _mm256_storeu_ps(lanes, acc);
    for (int j = 0; j < 8; j++) s += lanes[j];
    return has_m ? s + extra : s - extra;
#else
    float s = 0.0f;
    for (int b = 0; b < a->n / 32; b++, w += bb) {
        uint8_t q[32];
        levels32(w, dtype, q);
        const int8_t *xq = a->q + 32 * b;
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += q[j] * xq[j];
        float d = h2f(w), dx = a->d[b];
        if (dtype == DTYPE_Q5_0) s += d * dx * (float)(isum - 16 * a->sum[b]);
        else s += d * dx * (float)isum + h2f(w + 2) * dx * (float)a->sum[b];
    }
    return s;
#endif
}

// sum_s dx_s (d sc_s sum_j q_j qx_j - dmin m_s sum_j qx_j) over the 32-weight sub-blocks (as Q4_K).
static float dot_q5_k_act(const uint8_t *w, const ActQ8 *a) {
#if defined(__AVX2__) && defined(__FMA__)
    // as dot_q4_k_act, the fifth bits of sub-blocks 2p and 2p + 1 from bits 2p, 2p + 1 of qh[l]
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int sb = 0; sb < a->n / QK_K; sb++, w += Q5_K_BYTES) {
        float d = h2f(w), dmin = h2f(w + 2);
        __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 16)), m4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(16);
        for (int p = 0; p < 4; p++) {
            __m256i qb = _mm256_loadu_si256((const __m256i *)(w + 48 + 32 * p));
            __m256i lo = _mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * p), 4), b4));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4), _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(qh, 2 * p + 1), 4), b4));
            int blk = 8 * sb + 2 * p, sc0, m0, sc1, m1;
            q4_k_scale_min(2 * p, w + 4, &sc0, &m0);
            q4_k_scale_min(2 * p + 1, w + 4, &sc1, &m1);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc0 * a->d[blk]), _mm256_cvtepi32_ps(dot32_avx2(lo, a->q + 32 * blk)), acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)sc1 * a->d[blk + 1]), _mm256_cvtepi32_ps(dot32_avx2(hi, a->q + 32 * blk + 32)), acc);
            mins += dmin * ((float)m0 * a->d[blk] * (float)a->sum[blk] + (float)m1 * a->d[blk + 1] * (float)a->sum[blk + 1]);
        }
    }
    float lanes[8], s = 0.0f;
    _mm256_storeu_ps(lanes, acc);
    for (int j = 0; j < 8; j++) s += lanes[j];
    return s - mins;
#else
    float s = 0.0f;
    for (int sb = 0; sb < a->n / QK_K; sb++, w += Q5_K_BYTES) {
        uint8_t q[QK_K];
        q5_k_levels(w, q);
        float d = h2f(w), dmin = h2f(w + 2);
        for (int k = 0; k < 8; k++) {
            int blk = 8 * sb + k, sc, m;
            q4_k_scale_min(k, w + 4, &sc, &m);
            const int8_t *xq = a->q + 32 * blk;
            int32_t isum = 0;
            for (int l = 0; l < 32; l++) isum += q[32 * k + l] * xq[l];
            s += a->d[blk] * (d * (float)sc * (float)isum - dmin * (float)m * (float)a->sum[blk]);
        }
    }
    return s;
#endif
}

float dot_q45_act(const uint8_t *w, uint32_t dtype, const ActQ8 *a) {
    return dtype == DTYPE_Q5_K ? dot_q5_k_act(w, a) : dot_block32_act(w, dtype, a);
}
