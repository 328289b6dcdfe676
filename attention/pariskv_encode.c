// ParisKV key encoding: normalize, rotate, split into 8-dim subspaces, and per subspace keep the
// sign-pattern centroid id, 4-bit codes of the unit direction and the calibrated weight w.
#include "pariskv.h"
#include "srht.h"

#include <math.h>
#include <string.h>

// Lloyd-Max levels for one coordinate of a uniform direction on S^7 (the Beta(1/2, 7/2) prior
// of Prop. 4.1): 7 thresholds on |u|, 8 reconstruction centers.
const float pkv_thresholds[7] = {0.0843f, 0.1698f, 0.2578f, 0.3499f, 0.4487f, 0.5585f, 0.6901f};
const float pkv_centers[8] = {0.0420f, 0.1266f, 0.2130f, 0.3025f, 0.3973f, 0.5001f, 0.6169f, 0.7633f};

uint16_t pkv_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
    int exp = (int)((x >> 23) & 0xff);
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    int e = exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { // subnormal half: m * 2^-24
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        int shift = 14 - e;
        uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; // a carry into the exponent is still right
    return (uint16_t)h;
}

float pkv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) return (sign ? -1.0f : 1.0f) * ldexpf((float)mant, -24);
    uint32_t x = exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp - 15 + 127) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

int pkv_code(float u) {
    float a = fabsf(u);
    int t = 0;
    while (t < 7 && a > pkv_thresholds[t]) t++;
    return (u >= 0.0f ? 8 : 0) | t;
}

// pkv_decode as a table: the rerank reads it for every coordinate of every candidate.
const float pkv_levels[16] = {-0.0420f, -0.1266f, -0.2130f, -0.3025f, -0.3973f, -0.5001f, -0.6169f, -0.7633f,
                              0.0420f,  0.1266f,  0.2130f,  0.3025f,  0.3973f,  0.5001f,  0.6169f,  0.7633f};

float pkv_decode(int code) { return pkv_levels[code & 15]; }

void pkv_encode_key(const float *k, int D, const float *s, uint8_t *ids, uint8_t *codes, uint16_t *w, float *alpha) {
    float x[PKV_MAX_D];
    float r2 = 0.0f;
    for (int i = 0; i < D; i++) r2 += k[i] * k[i];
    float r = sqrtf(r2), inv = r > 0.0f ? 1.0f / r : 0.0f;
    for (int i = 0; i < D; i++) x[i] = k[i] * inv;
    srht_apply(x, s, D);
    for (int b = 0; b < D / PKV_M; b++) {
        const float *kb = x + b * PKV_M;
        float rb2 = 0.0f;
        for (int j = 0; j < PKV_M; j++) rb2 += kb[j] * kb[j];
        float rb = sqrtf(rb2), inv_b = rb > 0.0f ? 1.0f / rb : 0.0f; // a zero block: u = 0, w = 0
        int id = 0;
        float a = 0.0f;
        uint8_t *cb = codes + b * (PKV_M / 2);
        memset(cb, 0, PKV_M / 2);
        for (int j = 0; j < PKV_M; j++) {
            float u = kb[j] * inv_b;
            int c = pkv_code(u);
            if (u >= 0.0f) id |= 1 << j;
            a += pkv_centers[c & 7] * fabsf(u); // alpha_b = <v_b, u_b>
            cb[j / 2] |= (uint8_t)(j & 1 ? c << 4 : c);
        }
        if (a < 1e-6f) a = 1e-6f;
        float wb = r * rb / a;
        ids[b] = (uint8_t)id;
        w[b] = pkv_f32_to_f16(wb < 65504.0f ? wb : 65504.0f);
        if (alpha) alpha[b] = a;
    }
}
