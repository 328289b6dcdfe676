// Exact softmax attention over a list of K/V rows, in fixed blocks of rows (see attention.h).
#include "attention.h"
#include "softmax_exp.h"

#include <math.h>
#include <string.h>

// Eight floats: GCC/Clang vector extensions, lowered to whatever the machine has (AVX2, AVX-512,
// SSE). Dot products and weighted sums are written out in a fixed order (ISO C: no contraction into
// FMA); the sum of a block's exponentials is the compiler's vectorized reduction.
typedef float v8 __attribute__((vector_size(32)));
// Builds without AVX (the fuzzers', x86-64-v2) warn that passing v8 by value changes the ABI:
// it only ever passes between these static functions of one file, so no ABI is involved.
#pragma GCC diagnostic ignored "-Wpsabi"

static inline __attribute__((always_inline)) v8 ld8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) float hsum8(const v8 *v) {
    const float *a = (const float *)v;
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static inline __attribute__((always_inline)) float dot(const float *q, const float *k, int hd) {
    if (hd % 16) { // any head_dim: plain order
        float s = 0.0f;
        for (int j = 0; j < hd; j++) s += q[j] * k[j];
        return s;
    }
    v8 a0 = ld8(q) * ld8(k), a1 = ld8(q + 8) * ld8(k + 8);
    for (int j = 16; j < hd; j += 16) {
        a0 += ld8(q + j) * ld8(k + j);
        a1 += ld8(q + j + 8) * ld8(k + j + 8);
    }
    v8 s = a0 + a1;
    return hsum8(&s);
}

// o (hd) += sum over the m rows of w[p] * v[p], rows in order; 64 columns at a time so the
// accumulators stay in registers.
static inline __attribute__((always_inline)) void weighted_rows(float *o, const float *w, const float *const *vrow, int m, int hd) {
    if (hd % 64) {
        for (int p = 0; p < m; p++)
            for (int j = 0; j < hd; j++) o[j] += w[p] * vrow[p][j];
        return;
    }
    for (int c = 0; c < hd; c += 64) {
        v8 acc[8];
        for (int u = 0; u < 8; u++) acc[u] = ld8(o + c + 8 * u);
        for (int p = 0; p < m; p++) {
            const float *vp = vrow[p] + c;
            float wp = w[p];
            for (int u = 0; u < 8; u++) acc[u] += wp * ld8(vp + 8 * u);
        }
        for (int u = 0; u < 8; u++) memcpy(o + c + 8 * u, &acc[u], sizeof acc[u]);
    }
}

// The block with hd a compile-time constant where it is 64 or 128 (the loops then unroll).
static inline __attribute__((always_inline)) void block_hd(const float *q, int g, int hd, const float *const *krow, const float *const *vrow, int m,
                                                           float *part, float *score) {
    float scale = 1.0f / sqrtf((float)hd), mx[ATT_SUB];
    for (int i = 0; i < g; i++) mx[i] = -INFINITY;
    for (int p = 0; p < m; p++) { // each K row read once for the g heads
        for (int i = 0; i < g; i++) {
            float s = dot(q + (size_t)i * hd, krow[p], hd) * scale;
            score[i * ATT_BLOCK + p] = s;
            if (s > mx[i]) mx[i] = s;
        }
    }
    for (int i = 0; i < g; i++) {
        float *e = score + i * ATT_BLOCK, *pi = part + (size_t)i * ATT_PART(hd);
        float mi = mx[i];
        float l = 0.0f;
#pragma omp simd reduction(+ : l)
        for (int p = 0; p < m; p++) {
            e[p] = softmax_exp(e[p] - mi);
            l += e[p];
        }
        memset(pi, 0, (size_t)hd * sizeof(float));
        weighted_rows(pi, e, vrow, m, hd);
        pi[hd] = mi, pi[hd + 1] = l;
    }
}

void attend_block(const float *q, int g, int hd, const float *const *krow, const float *const *vrow, int m, float *part, float *score) {
    if (hd == 64) block_hd(q, g, 64, krow, vrow, m, part, score);
    else if (hd == 128) block_hd(q, g, 128, krow, vrow, m, part, score);
    else block_hd(q, g, hd, krow, vrow, m, part, score);
}

void attend_merge(float *out, int g, int hd, int nb, const float *part) {
    for (int i = 0; i < g; i++) {
        float *o = out + (size_t)i * hd, mx = -INFINITY, l = 0.0f;
        for (int b = 0; b < nb; b++) {
            const float *pb = part + ((size_t)b * ATT_SUB + i) * ATT_PART(hd);
            if (pb[hd] > mx) mx = pb[hd];
        }
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int b = 0; b < nb; b++) {
            const float *pb = part + ((size_t)b * ATT_SUB + i) * ATT_PART(hd);
            float c = softmax_exp(pb[hd] - mx); // 1 exactly for the block holding the max
            l += c * pb[hd + 1];
            for (int j = 0; j < hd; j++) o[j] += c * pb[j];
        }
        for (int j = 0; j < hd; j++) o[j] /= l;
    }
}

void attend_rows(float *out, const float *q, int g, int hd, const float *const *krow, const float *const *vrow, int n, float *scratch) {
    float *score = scratch, *part = scratch + ATT_SUB * ATT_BLOCK;
    int nb = (n + ATT_BLOCK - 1) / ATT_BLOCK;
    for (int b = 0; b < nb; b++) {
        int m = n - b * ATT_BLOCK < ATT_BLOCK ? n - b * ATT_BLOCK : ATT_BLOCK;
        attend_block(q, g, hd, krow + (size_t)b * ATT_BLOCK, vrow + (size_t)b * ATT_BLOCK, m, part + (size_t)b * ATT_SUB * ATT_PART(hd), score);
    }
    attend_merge(out, g, hd, nb, part);
}

size_t attend_rows_scratch(int hd, int n) {
    size_t nb = ((size_t)n + ATT_BLOCK - 1) / ATT_BLOCK;
    return (size_t)ATT_SUB * ATT_BLOCK + nb * ATT_SUB * ATT_PART(hd);
}
