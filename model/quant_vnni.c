// The decode products on quantized weights with AVX512_VNNI's vpdpbusd (quant.h's dot_*_act):
// one instruction for the four byte products and their sum that the AVX2 kernels form with
// vpmaddubsw and vpmaddwd. Each 32-bit lane sums the same four bytes (4j .. 4j + 3) as those two
// do, both sums are exact integers (no saturation: |q| <= 128 against |x| <= 127, or nibbles
// against |x| <= 127), and the fp32 steps after them are the same operations in the same order:
// the results equal the AVX2 kernels' bit for bit (tests/test_quant.c checks that where the CPU
// has VNNI). Built for any x86-64 target through function attributes, called only where the CPU
// has the instructions and the chosen set is avx512 or above (cpu_isa.h: cpu_int8_vnni).
#include "quant.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

VNNI static inline float h2f(const uint8_t *p) { return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8)); }

VNNI static inline float lanes_sum(__m256 acc) {
    float t[8], s = 0.0f;
    _mm256_storeu_ps(t, acc);
    for (int j = 0; j < 8; j++) s += t[j];
    return s;
}

VNNI float dot_q8_0_act_vnni(const uint8_t *w, const ActQ8 *a) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < a->n / QK8_0; b++, w += Q8_0_BYTES) {
        float sc = h2f(w) * a->d[b];
        // |q| (unsigned) against x with q's sign, as the AVX2 kernel
        __m256i qb = _mm256_loadu_si256((const __m256i *)(w + 2)), xb = _mm256_loadu_si256((const __m256i *)(a->q + 32 * b));
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(qb, qb), _mm256_sign_epi8(xb, qb));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(sc), _mm256_cvtepi32_ps(p), acc);
    }
    return lanes_sum(acc);
}

VNNI float dot_q4_k_act_vnni(const uint8_t *w, const ActQ8 *a) {
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    const __m256i m4 = _mm256_set1_epi8(15), z = _mm256_setzero_si256();
    for (int sb = 0; sb < a->n / QK_K; sb++, w += Q4_K_BYTES) {
        float d = h2f(w), dmin = h2f(w + 2);
        for (int p = 0; p < 4; p++) { // bytes 32p .. 32p + 31: sub-blocks 2p (low nibbles), 2p + 1 (high)
            const uint8_t *q = w + 16 + 32 * p;
            int blk = 8 * sb + 2 * p, sc0, m0, sc1, m1;
            const int8_t *xl = a->q + 32 * blk, *xh = xl + 32;
            q4_k_scale_min(2 * p, w + 4, &sc0, &m0);
            q4_k_scale_min(2 * p + 1, w + 4, &sc1, &m1);
            float s0 = d * (float)sc0 * a->d[blk], s1 = d * (float)sc1 * a->d[blk + 1];
            __m256i qb = _mm256_loadu_si256((const __m256i *)q);
            __m256i il = _mm256_dpbusd_epi32(z, _mm256_and_si256(qb, m4), _mm256_loadu_si256((const __m256i *)xl));
            __m256i ih = _mm256_dpbusd_epi32(z, _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4), _mm256_loadu_si256((const __m256i *)xh));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(s0), _mm256_cvtepi32_ps(il), acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(s1), _mm256_cvtepi32_ps(ih), acc);
            mins += dmin * ((float)m0 * a->d[blk] * (float)a->sum[blk] + (float)m1 * a->d[blk + 1] * (float)a->sum[blk + 1]);
        }
    }
    return lanes_sum(acc) - mins;
}

VNNI float dot_q4_0_act_vnni(const uint8_t *w, const ActQ8 *a) {
    __m256 acc = _mm256_setzero_ps();
    float offs = 0.0f;
    const __m128i m4 = _mm_set1_epi8(15);
    for (int b = 0; b < a->n / QK4_0; b++, w += Q4_0_BYTES) {
        float sc = h2f(w) * a->d[b];
        __m128i qh = _mm_loadu_si128((const __m128i *)(w + 2));
        __m256i qb = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qh, 4), m4), _mm_and_si128(qh, m4)); // weights 0..15, 16..31
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), qb, _mm256_loadu_si256((const __m256i *)(a->q + 32 * b)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(sc), _mm256_cvtepi32_ps(p), acc);
        offs += sc * (float)(8 * a->sum[b]); // the quants' offset of 8
    }
    return lanes_sum(acc) - offs;
}

#else // no VNNI off x86-64: cpu_int8_vnni() is 0 there, these are never called

float dot_q8_0_act_vnni(const uint8_t *w, const ActQ8 *a) { return dot_q8_0_act(w, a); }
float dot_q4_k_act_vnni(const uint8_t *w, const ActQ8 *a) { return dot_q4_k_act(w, a); }
float dot_q4_0_act_vnni(const uint8_t *w, const ActQ8 *a) { return dot_q4_0_act(w, a); }

#endif
