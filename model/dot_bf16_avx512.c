// The decode product on bf16 weights with AVX-512, and with AVX512_BF16's vdpbf16ps
// (dot_bf16.h), built for any x86-64 target through function attributes and called only where
// the CPU has them (cpu_isa.h).
#include "dot_bf16.h"
#include "bf16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// ---- avx512: weights widened in registers, fp32 fused multiply-adds ----

// As the AVX2 kernel's layout, on blocks of 32: a block's 16 even elements, then its 16 odd ones
// (a 32-bit lane of the weights' load holds the pair w[2k], w[2k+1]); the partial block padded.
static void prep(const float *x, int n, void *xp) {
    float *o = xp;
    for (int b = 0; b < n; b += 32) {
        float blk[32] = {0};
        memcpy(blk, x + b, (size_t)(n - b < 32 ? n - b : 32) * sizeof(float));
        for (int k = 0; k < 16; k++) o[b + k] = blk[2 * k], o[b + 16 + k] = blk[2 * k + 1];
    }
}

AVX512 static inline __m512 fma_block(__m512i v, const float *x, __m512 acc_even, __m512 *acc_odd) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    *acc_odd = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hi)), _mm512_loadu_ps(x + 16), *acc_odd);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), _mm512_loadu_ps(x), acc_even);
}

AVX512 static float dot(const uint16_t *w, const float *x, int n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int full = n / 32 * 32, j = 0;
    for (; j + 64 <= full; j += 64) {
        a0 = fma_block(_mm512_loadu_si512(w + j), x + j, a0, &a1);
        a2 = fma_block(_mm512_loadu_si512(w + j + 32), x + j + 32, a2, &a3);
    }
    if (j < full) a0 = fma_block(_mm512_loadu_si512(w + j), x + j, a0, &a1), j += 32;
    if (j < n) // the partial block: weights past n read as zero
        a2 = fma_block(_mm512_maskz_loadu_epi16((__mmask32)((1ull << (n - j)) - 1), w + j), x + j, a2, &a3);
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

AVX512 static void rows(const uint16_t *w, const void *xp, int n, int nr, float *y) {
    for (int r = 0; r < nr; r++) y[r] = dot(w + (size_t)r * n, xp, n);
}

static const DotBf16 kernels = {CPU_ISA_AVX512, prep, rows};
const DotBf16 *dot_bf16_avx512(void) { return &kernels; }

// ---- avx512bf16: x rounded to bf16, vdpbf16ps on pairs ----

// n floats to bf16 with vcvtne2ps2bf16: to nearest even, as f32_to_bf16 (model/bf16.h) rounds
// every normal float.
AVX512BF16 static void round_bf16(const float *x, size_t n, uint16_t *o) {
    size_t j = 0;
    for (; j + 32 <= n; j += 32)
        _mm512_storeu_si512(o + j, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + j + 16), _mm512_loadu_ps(x + j)));
    for (; j < n; j++) o[j] = f32_to_bf16(x[j]);
}

void dot_bf16_round(const float *x, size_t n, uint16_t *out) {
    if (cpu_isa_supported(CPU_ISA_AVX512BF16)) round_bf16(x, n, out);
    else
        for (size_t j = 0; j < n; j++) out[j] = f32_to_bf16(x[j]);
}

// x to bf16 in its own order (pairs line up with the weights'), padded with zeros to a whole
// block of 32.
static void prep_bf16(const float *x, int n, void *xp) {
    uint16_t *o = xp;
    round_bf16(x, (size_t)n, o);
    for (int j = n; j % 32; j++) o[j] = 0;
}

AVX512BF16 static inline __m512 dp(__m512 acc, __m512i w, const uint16_t *x) {
    return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)_mm512_loadu_si512(x));
}

AVX512BF16 static float dot_bf16(const uint16_t *w, const uint16_t *x, int n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int full = n / 32 * 32, j = 0;
    for (; j + 128 <= full; j += 128) {
        a0 = dp(a0, _mm512_loadu_si512(w + j), x + j);
        a1 = dp(a1, _mm512_loadu_si512(w + j + 32), x + j + 32);
        a2 = dp(a2, _mm512_loadu_si512(w + j + 64), x + j + 64);
        a3 = dp(a3, _mm512_loadu_si512(w + j + 96), x + j + 96);
    }
    for (int k = 0; j < full; j += 32, k++) { // spread the last blocks over the chains too
        __m512 *a = k == 0 ? &a0 : k == 1 ? &a1 : &a2;
        *a = dp(*a, _mm512_loadu_si512(w + j), x + j);
    }
    if (j < n) a3 = dp(a3, _mm512_maskz_loadu_epi16((__mmask32)((1ull << (n - j)) - 1), w + j), x + j);
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

AVX512BF16 static void rows_bf16(const uint16_t *w, const void *xp, int n, int nr, float *y) {
    for (int r = 0; r < nr; r++) y[r] = dot_bf16(w + (size_t)r * n, xp, n);
}

static const DotBf16 kernels_bf16 = {CPU_ISA_AVX512BF16, prep_bf16, rows_bf16};
const DotBf16 *dot_bf16_avx512bf16(void) { return &kernels_bf16; }
#else
const DotBf16 *dot_bf16_avx512(void) { return NULL; }
const DotBf16 *dot_bf16_avx512bf16(void) { return NULL; }
void dot_bf16_round(const float *x, size_t n, uint16_t *out) {
    for (size_t j = 0; j < n; j++) out[j] = f32_to_bf16(x[j]);
}
#endif
