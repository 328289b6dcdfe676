// offload/fp8.h (the fp8 host store's format) against the definition of e4m3, computed here
// independently of its rounding code.
//
// The 127 finite magnitudes of e4m3: code e.m (e = 0: m 2^-9, else (8 + m) 2^(e - 10)), from 0 to
// 448 (0x7e); 0x7f is NaN. decode: all 256 codes against that table. encode, round to nearest
// with ties to the even code and saturation at 448: at every midpoint between two neighbouring
// magnitudes (exact in float), one float below it and one above, both signs; saturation, NaN,
// +-0, +-Inf; then 10^6 random floats against a linear search for the nearest magnitude. Rows:
// every value within half a step of its own (relative 2^-4, or 2^-10 of the scale below 2^-6 of
// it) plus the products' rounding, the row's maximum stored as 448 times the scale.
#include "../offload/fp8.h"
#include "test_pariskv_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static double mag[127]; // magnitude of code c, c = 0 .. 126

static double def_mag(int c) {
    int e = (c >> 3) & 15, m = c & 7;
    return e == 0 ? ldexp((double)m, -9) : ldexp(8.0 + m, e - 10);
}

// The code the definition gives for x (finite or not): nearest magnitude, ties to the even code.
static uint8_t def_encode(float x) {
    if (isnan(x)) return 0x7f;
    uint8_t s = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    if (a >= 448.0) return s | 0x7e;
    int best = 0;
    for (int c = 1; c < 127; c++) {
        double d = fabs(mag[c] - a), db = fabs(mag[best] - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return s | (uint8_t)best;
}

int main(void) {
    for (int c = 0; c < 127; c++) mag[c] = def_mag(c);

    int bad = 0;
    for (int c = 0; c < 256; c++) {
        float v = fp8_e4m3_decode((uint8_t)c);
        if ((c & 0x7f) == 0x7f) bad += !isnan(v);
        else bad += (double)v != ((c & 0x80) ? -mag[c & 0x7f] : mag[c & 0x7f]) || (c == 0x80 && !signbit(v));
    }
    check(bad == 0, "decode: all 256 codes equal the definition (0x7f, 0xff NaN): %d differ", bad);

    bad = 0;
    int ties = 0;
    for (int c = 0; c < 126; c++)
        for (int sg = 0; sg < 2; sg++) {
            float mid = (float)((mag[c] + mag[c + 1]) / 2), sign = sg ? -1.0f : 1.0f;
            uint8_t s = sg ? 0x80 : 0, even = (uint8_t)((c & 1) == 0 ? c : c + 1);
            bad += fp8_e4m3_encode(sign * mid) != (s | even);
            bad += fp8_e4m3_encode(sign * nextafterf(mid, 0.0f)) != (s | c);
            bad += fp8_e4m3_encode(sign * nextafterf(mid, 1e9f)) != (s | (c + 1));
            bad += fp8_e4m3_encode(sign * (float)mag[c]) != (s | c);
            ties++;
        }
    check(bad == 0, "encode: %d midpoints (ties to the even code), their neighbours and every magnitude, both signs: %d wrong", ties, bad);

    const float sat[] = {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, INFINITY};
    bad = 0;
    for (int i = 0; i < 6; i++) bad += fp8_e4m3_encode(sat[i]) != 0x7e || fp8_e4m3_encode(-sat[i]) != 0xfe;
    bad += fp8_e4m3_encode(NAN) != 0x7f || fp8_e4m3_encode(0.0f) != 0x00 || fp8_e4m3_encode(-0.0f) != 0x80;
    bad += fp8_e4m3_encode(1e-30f) != 0x00 || fp8_e4m3_encode(ldexpf(1.0f, -10)) != 0x00 || fp8_e4m3_encode(nextafterf(ldexpf(1.0f, -10), 1.0f)) != 0x01;
    check(bad == 0, "encode: 448 and beyond (Inf too) saturate to +-448, NaN to 0x7f, +-0 and below 2^-10 to zero: %d wrong", bad);

    Rng r = {2026};
    bad = 0;
    for (int i = 0; i < 1000000; i++) {
        float x = (float)(ldexp(uniform(&r), (int)(uniform(&r) * 24) - 14)) * (uniform(&r) < 0.5 ? -1.0f : 1.0f);
        bad += fp8_e4m3_encode(x) != def_encode(x);
    }
    check(bad == 0, "encode: 10^6 random floats from 2^-14 to 2^10 against the nearest magnitude: %d differ", bad);

    // Rows: half a step of e4m3 (2^-4 relative for normal codes, 2^-10 of the scale below), plus
    // the division, the product and the decoded product's rounding (3 u of the value).
    bad = 0;
    int rows = 0, max_ok = 0;
    double worst = 0;
    for (int t = 0; t < 2000; t++) {
        float x[128], y[128];
        uint8_t c[128];
        int n = t % 3 == 0 ? 64 : 128;
        double amp = ldexp(1.0, (t % 41) - 20);
        for (int j = 0; j < n; j++) x[j] = (float)(amp * gauss(&r));
        if (t % 7 == 0) x[t % n] = 0.0f, x[(t + 1) % n] = (float)(amp * 1e-6);
        float s = fp8_quantize_row(x, n, c);
        fp8_dequantize_row(c, s, n, y);
        double amax = 0;
        int imax = 0;
        for (int j = 0; j < n; j++)
            if (fabs(x[j]) > amax) amax = fabs(x[j]), imax = j;
        max_ok += c[imax] == (x[imax] < 0 ? 0xfe : 0x7e);
        for (int j = 0; j < n; j++) {
            double e = fabs((double)y[j] - x[j]), tol = fmax(fabs(x[j]) * 0.0625, ldexp((double)s, -10)) + 3 * 6e-8 * fabs(x[j]);
            bad += e > tol * (1 + 1e-6);
            worst = fmax(worst, e / fmax(tol, 1e-300));
        }
        rows++;
    }
    check(bad == 0, "rows: %d rows of 64 / 128 values over 2^-20 .. 2^20: every value within half a step (worst %.3f of the bound); %d beyond",
          rows, worst, bad);
    check(max_ok == rows, "rows: the largest magnitude is stored as +-448 (the scale is amax / 448) in %d of %d rows", max_ok, rows);
    float z[8] = {0}, zy[8];
    uint8_t zc[8];
    float zs = fp8_quantize_row(z, 8, zc);
    fp8_dequantize_row(zc, zs, 8, zy);
    check(zs == 0.0f && zy[0] == 0.0f && zc[7] == 0, "rows: an all-zero row has scale 0 and reads back as zeros");

    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
