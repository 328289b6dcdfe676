// The fp8 host store's number format: e4m3 (1 sign, 4 exponent bits with bias 7, 3 mantissa
// bits; no infinities, S.1111.111 is NaN, largest finite 448), one fp32 scale per row.
//
// A row x[0..n) is stored as codes c_i = e4m3(x_i * (448 / amax)) with round to nearest even and
// saturation at +-448, amax = max |x_i|, and read back as decode(c_i) * (amax / 448). Every step
// is one IEEE operation (a division, a product, an exact power-of-two scaling, rintf), so the CPU
// and the GPU produce the same codes and values from the same inputs. Header-only, for C and CUDA.
#ifndef FP8_H
#define FP8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FP8_FN static __host__ __device__ __forceinline__
#else
#define FP8_FN static inline
#endif

#define FP8_E4M3_MAX 448.0f

FP8_FN uint32_t fp8_float_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
#endif
}

// e4m3 code of x: round to nearest even, |x| beyond 448 saturates to 448, NaN gives 0x7f.
FP8_FN uint8_t fp8_e4m3_encode(float x) {
    uint32_t u = fp8_float_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    float a = fabsf(x);
    if (a != a) return 0x7f;
    if (a >= FP8_E4M3_MAX) return sign | 0x7e;
    if (a < 0.015625f) { // below 2^-6: subnormal codes, steps of 2^-9
        int m = (int)rintf(ldexpf(a, 9));
        return sign | (uint8_t)m; // m == 8 is the smallest normal code, 0x08
    }
    int e = (int)((fp8_float_bits(a) >> 23) & 0xff) - 127; // -6 .. 8
    int m = (int)rintf(ldexpf(a, 3 - e));                 // 8 .. 16
    if (m == 16) m = 8, e++;
    if (e > 8 || (e == 8 && m > 14)) return sign | 0x7e; // above 448 after rounding: saturate
    return sign | (uint8_t)((e + 7) << 3 | (m - 8));
}

// The value of code c, built from its bits: a normal code's exponent and mantissa move into a
// float's fields (bias 7 -> 127); a subnormal one is m 2^-9 (exact).
FP8_FN float fp8_e4m3_decode(uint8_t c) {
    uint32_t e = (c >> 3) & 15, m = c & 7, s = (uint32_t)(c & 0x80) << 24;
    if (e == 15 && m == 7) return NAN;
    float v;
    if (e) {
        uint32_t u = s | (e + 120) << 23 | m << 20;
#ifdef __CUDA_ARCH__
        v = __uint_as_float(u);
#else
        memcpy(&v, &u, 4);
#endif
        return v;
    }
    v = (float)m * 0.001953125f; // 2^-9
    return s ? -v : v;
}

// The scale of a row whose largest magnitude is amax (0 for an all-zero row).
FP8_FN float fp8_row_scale(float amax) { return amax > 0.0f ? amax / FP8_E4M3_MAX : 0.0f; }

// Codes of x[0..n) into c; returns the row's scale.
FP8_FN float fp8_quantize_row(const float *x, int n, uint8_t *c) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    float inv = amax > 0.0f ? FP8_E4M3_MAX / amax : 0.0f;
    for (int i = 0; i < n; i++) c[i] = fp8_e4m3_encode(x[i] * inv);
    return fp8_row_scale(amax);
}

// x[0..n) = the stored row's values.
FP8_FN void fp8_dequantize_row(const uint8_t *c, float scale, int n, float *x) {
    for (int i = 0; i < n; i++) x[i] = fp8_e4m3_decode(c[i]) * scale;
}

#endif
