// bf16 and fp16 conversions (bf16 is the upper half of an IEEE fp32).
#ifndef BF16_H
#define BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { // subnormal: renormalize
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even, as numpy's astype(float16) and GGML's FP32_TO_FP16 do (the scales of
// quantized blocks): overflow past 65504 (from the midpoint 65520 up) gives Inf, values below
// 2^-14 become subnormals, NaN stays a quiet NaN.
static inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
    if (a >= 0x38800000u) { // a normal fp16: round at bit 13, then rebias the exponent 127 -> 15
        uint32_t r = a + 0x0fffu + ((a >> 13) & 1);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    uint32_t e = a >> 23;
    if (e < 101) return sign; // below 2^-25: rounds to zero
    // A subnormal fp16: the float's significand shifted to units of 2^-24, rounded to nearest even
    // (a carry into 0x400 is the smallest normal, correctly encoded).
    uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e; // 14 .. 25
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

#endif
