// exp(x) for the softmax's x = score - max <= 0, written so that a loop over it vectorizes
// (glibc's expf is a call per element: at 4K cached positions it was most of a CPU decode step).
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, then a degree-7 Taylor polynomial of e^r
// (truncation < 6e-9 relative) and 2^n through the exponent bits: within 2 ulp of e^x (1.17 measured
// over [-87, 0] by tests/test_softmax_exp.c). Below -87 (e^-87 = 1.6e-38, the last normal floats)
// it returns 0. Shared by every CPU attention (dense.c, policy.c), so they agree bit for bit.
#ifndef SOFTMAX_EXP_H
#define SOFTMAX_EXP_H

#include <stdint.h>
#include <string.h>

static inline float softmax_exp(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    float xc = x > -87.0f ? (x < 88.0f ? x : 88.0f) : -87.0f; // NaN -> -87: n stays a small integer
    float n = (xc * log2e + 12582912.0f) - 12582912.0f; // round to nearest (1.5 * 2^23), vectorizes
    float r = (xc - n * ln2_hi) - n * ln2_lo;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x >= -87.0f ? p * scale : x < -87.0f ? 0.0f : x; // NaN stays NaN, as with expf
}

#endif
