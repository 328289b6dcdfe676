// model/bf16.h against the definitions of the formats, computed independently of its bit tricks.
//
// f32_to_bf16: every one of the 2^32 float bit patterns. For a finite f, the two bf16 values that
// bracket |f| are the one whose bits are f's top 16 (|f| rounded toward zero) and the next one up
// (or 2^128 past the largest finite bf16, as IEEE 754 rounds to nearest as if the exponent range
// were unbounded, then overflows to Inf). The distances from |f| to both are exact in double (all
// three are floats within one binade of each other); the nearer wins, a tie goes to the one with
// the even last mantissa bit. NaN must give a quiet NaN of the same sign, Inf the same Inf.
// f32_to_f16 (the scales of quantized blocks): every one of the 2^32 floats, walked in order of
// magnitude through the intervals between consecutive fp16 values (the nearer end wins, a tie the
// even one; past 65504 the next end is 2^16, which becomes Inf), both signs; NaN a quiet NaN.
// bf16_to_f32 and f16_to_f32: every one of the 2^16 inputs against (-1)^s 2^(e-bias) (1 + m/2^p)
// (subnormals 2^(1-bias) m/2^p) computed with ldexp in double. Then named cases: ties to even both
// ways, NaN, +-Inf, overflow, subnormals, -0.
#include "../model/bf16.h"
#include "test_pariskv_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t u_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// The magnitude of a finite bf16 pattern (sign bit clear), from the definition.
static double bf16_mag(uint32_t h) {
    uint32_t e = (h >> 7) & 0xff, m = h & 0x7f;
    return e == 0 ? ldexp((double)m, -126 - 7) : ldexp(128.0 + m, (int)e - 127 - 7);
}

// The bf16 that round-to-nearest-even gives for a finite float's magnitude: hi16 = its top 16 bits
// without the sign (the candidate below), the candidate above is hi16 + 1 (0x7f80 = Inf past the
// largest finite 0x7f7f, at the distance of 2^128).
static uint32_t rne_mag(double a, uint32_t hi16) {
    double lo = bf16_mag(hi16);
    double hi = hi16 == 0x7f7f ? ldexp(1.0, 128) : bf16_mag(hi16 + 1);
    double dlo = a - lo, dhi = hi - a; // exact: a, lo, hi are floats at most one binade apart
    if (dlo < dhi) return hi16;
    if (dhi < dlo) return hi16 + 1;
    return (hi16 & 1) ? hi16 + 1 : hi16; // tie: the even mantissa
}

static int is_quiet_nan_bf16(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x40); }

// All 2^32 floats. Returns the number of wrong results, prints the first few.
static unsigned long long exhaustive_f32_to_bf16(void) {
    unsigned long long bad = 0;
    int shown = 0;
#pragma omp parallel for schedule(dynamic, 256) reduction(+ : bad)
    for (uint32_t top = 0; top < 0x10000u; top++) {
        uint32_t sign = top & 0x8000, hi16 = top & 0x7fff;
        unsigned long long bad_here = 0;
        uint32_t first_bad = 0;
        uint16_t got_bad = 0, want_bad = 0;
        if (hi16 >= 0x7f80) { // Inf (low bits 0) or NaN
            for (uint32_t l = 0; l < 0x10000u; l++) {
                uint32_t u = top << 16 | l;
                uint16_t h = f32_to_bf16(f_of(u));
                int good = hi16 == 0x7f80 && l == 0 ? h == (sign | 0x7f80)
                                                     : is_quiet_nan_bf16(h) && (h & 0x8000) == sign;
                if (!good && bad_here++ == 0) first_bad = u, got_bad = h, want_bad = 0xffff;
            }
        } else {
            // Finite: all 65536 floats with these top bits share the two candidates.
            double lo = bf16_mag(hi16);
            double hi = hi16 == 0x7f7f ? ldexp(1.0, 128) : bf16_mag(hi16 + 1);
            uint16_t below = (uint16_t)(sign | hi16), above = (uint16_t)(sign | (hi16 + 1));
            uint16_t tie = (hi16 & 1) ? above : below;
            // Branch-free count first (it vectorizes); the second pass finds the first wrong one.
            for (uint32_t l = 0; l < 0x10000u; l++) {
                double a = fabs((double)f_of(top << 16 | l));
                double dlo = a - lo, dhi = hi - a;
                uint16_t want = dlo < dhi ? below : dhi < dlo ? above : tie;
                bad_here += f32_to_bf16(f_of(top << 16 | l)) != want;
            }
            for (uint32_t l = 0; bad_here && l < 0x10000u; l++) {
                double a = fabs((double)f_of(top << 16 | l));
                double dlo = a - lo, dhi = hi - a;
                uint16_t want = dlo < dhi ? below : dhi < dlo ? above : tie;
                uint16_t h = f32_to_bf16(f_of(top << 16 | l));
                if (h != want) {
                    first_bad = top << 16 | l, got_bad = h, want_bad = want;
                    break;
                }
            }
        }
        if (bad_here) {
#pragma omp critical
            if (shown++ < 8)
                printf("     0x%08x -> 0x%04x, want 0x%04x%s (%llu wrong with top bits 0x%04x)\n", first_bad,
                       got_bad, want_bad, want_bad == 0xffff ? " (0xffff: a quiet NaN of that sign, or Inf)" : "",
                       bad_here, top);
        }
        bad += bad_here;
    }
    return bad;
}

// One named float: f32_to_bf16 must give `want`, and agree with rne_mag (the test's own reference).
static void case_bf16(uint32_t u, uint16_t want, const char *what) {
    uint16_t h = f32_to_bf16(f_of(u));
    float f = f_of(u);
    int ref_ok = 1;
    if (isfinite(f)) ref_ok = (((u >> 16) & 0x8000) | rne_mag(fabs((double)f), (u >> 16) & 0x7fff)) == want;
    check(h == want && ref_ok, "f32_to_bf16(0x%08x = %a) = 0x%04x, want 0x%04x: %s%s", u, (double)f, h, want, what,
          ref_ok ? "" : " (and the test's reference disagrees with the expected value)");
}

static void case_nan(uint32_t u, const char *what) {
    uint16_t h = f32_to_bf16(f_of(u));
    check(is_quiet_nan_bf16(h) && (h & 0x8000) == ((u >> 16) & 0x8000),
          "f32_to_bf16(0x%08x, a %s NaN) = 0x%04x: a quiet NaN of the same sign: %s", u,
          (u & 0x80000000u) ? "negative" : "positive", h, what);
}

// The magnitude of a finite fp16 pattern (sign bit clear), from the definition.
static double f16_mag(uint32_t h) {
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    return e == 0 ? ldexp((double)m, -24) : ldexp(1024.0 + m, (int)e - 25);
}

// All 2^32 floats through f32_to_f16. Returns the number of wrong results.
static unsigned long long exhaustive_f32_to_f16(void) {
    unsigned long long bad = 0;
    // Finite magnitudes from 0 up to 2^16: interval [mag(h), mag(h + 1)) for h = 0 .. 0x7bff.
#pragma omp parallel for schedule(dynamic, 64) reduction(+ : bad)
    for (uint32_t h = 0; h < 0x7c00u; h++) {
        double lo = f16_mag(h), hi = h == 0x7bff ? 65536.0 : f16_mag(h + 1);
        float flo = (float)lo, fhi = (float)hi;
        uint16_t tie = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        for (uint32_t u = u_of(flo); u < u_of(fhi); u++) {
            double a = (double)f_of(u), dlo = a - lo, dhi = hi - a;
            uint16_t want = dlo < dhi ? (uint16_t)h : dhi < dlo ? (uint16_t)(h + 1) : tie;
            bad += f32_to_f16(f_of(u)) != want;
            bad += f32_to_f16(f_of(u | 0x80000000u)) != (want | 0x8000);
        }
    }
    // From 2^16 to Inf: Inf; NaN: a quiet NaN of the same sign.
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (uint32_t u = u_of(65536.0f); u <= 0x7fffffffu; u++) {
        uint16_t p = f32_to_f16(f_of(u)), n = f32_to_f16(f_of(u | 0x80000000u));
        if (u <= 0x7f800000u) bad += p != 0x7c00 || n != 0xfc00;
        else bad += (p & 0xfe00) != 0x7e00 || (n & 0xfe00) != 0xfe00;
    }
    return bad;
}

int main(void) {
    // bf16_to_f32: every pattern against the definition.
    int bad = 0, first = -1;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        uint32_t s = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
        float f = bf16_to_f32((uint16_t)h);
        int good;
        if (e == 0xff && m != 0) good = isnan(f) && !!signbit(f) == (int)s && (u_of(f) >> 16) == h;
        else if (e == 0xff) good = isinf(f) && !!signbit(f) == (int)s;
        else good = (double)f == (s ? -1.0 : 1.0) * bf16_mag(h & 0x7fff) && !!signbit(f) == (int)s;
        if (!good && bad++ == 0) first = (int)h;
    }
    check(bad == 0, "bf16_to_f32: all 65536 patterns equal (-1)^s 2^(e-127) (1 + m/128), subnormals "
                    "2^-126 m/128, +-Inf, NaN with its payload, -0 (%d wrong, first 0x%04x)",
          bad, first);

    // f16_to_f32: every pattern against the definition.
    bad = 0, first = -1;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        uint32_t s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
        float f = f16_to_f32((uint16_t)h);
        double want = (s ? -1.0 : 1.0) * (e == 0 ? ldexp((double)m, -14 - 10) : ldexp(1024.0 + m, (int)e - 15 - 10));
        int good;
        if (e == 0x1f && m != 0) // NaN: same sign, the payload in the top mantissa bits (quiet bit too)
            good = isnan(f) && !!signbit(f) == (int)s && (u_of(f) & 0x7fffff) == m << 13;
        else if (e == 0x1f) good = isinf(f) && !!signbit(f) == (int)s;
        else good = (double)f == want && !!signbit(f) == (int)s;
        if (!good && bad++ == 0) first = (int)h;
    }
    check(bad == 0, "f16_to_f32: all 65536 patterns equal (-1)^s 2^(e-15) (1 + m/1024), subnormals "
                    "2^-14 m/1024, +-Inf, NaN with its payload, -0 (%d wrong, first 0x%04x)",
          bad, first);
    check(u_of(f16_to_f32(0x0001)) == u_of(0x1p-24f) && u_of(f16_to_f32(0x8001)) == u_of(-0x1p-24f) &&
              u_of(f16_to_f32(0x03ff)) == u_of(0x1.ff8p-15f) && u_of(f16_to_f32(0x0400)) == u_of(0x1p-14f) &&
              u_of(f16_to_f32(0x7bff)) == u_of(65504.0f) && u_of(f16_to_f32(0x8000)) == 0x80000000u &&
              u_of(f16_to_f32(0x3c00)) == u_of(1.0f),
          "f16_to_f32: smallest subnormal 2^-24 (both signs), largest subnormal, smallest normal 2^-14, "
          "65504, -0, 1");

    unsigned long long bad16 = exhaustive_f32_to_f16();
    check(bad16 == 0, "f32_to_f16: all 2^32 floats round to the nearest fp16 (ties to even, 65520 and up to Inf), "
                      "NaN to a quiet NaN of its sign (%llu wrong)", bad16);
    check(f32_to_f16(65519.996f) == 0x7bff && f32_to_f16(65520.0f) == 0x7c00 && f32_to_f16(0x1p-25f) == 0 &&
              f32_to_f16(0x1.000002p-25f) == 1 && f32_to_f16(0x1.8p-24f) == 2 && f32_to_f16(-0.0f) == 0x8000 &&
              f32_to_f16(0x1.ffcp-15f) == 0x0400 && f32_to_f16(1.0f + 0x1p-11f) == 0x3c00,
          "f32_to_f16: 65504 / Inf edge, 2^-25 ties to 0, just above it 2^-24, 1.5 2^-24 ties to 2 2^-24, -0, "
          "subnormal carry into the smallest normal, 1 + 2^-11 ties to 1");

    // Round trip: every non-NaN bf16 comes back unchanged.
    bad = 0, first = -1;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) continue;
        if (f32_to_bf16(bf16_to_f32((uint16_t)h)) != h && bad++ == 0) first = (int)h;
    }
    check(bad == 0, "f32_to_bf16(bf16_to_f32(h)) == h for every non-NaN bf16 (%d wrong, first 0x%04x)", bad, first);

    // Named cases (each also checked against the reference above, so a wrong expectation shows).
    case_bf16(0x3f800000, 0x3f80, "1.0 exact");
    case_bf16(0x3f808000, 0x3f80, "tie 1 + 2^-8 between 0x3f80 (even) and 0x3f81: down to even");
    case_bf16(0x3f818000, 0x3f82, "tie between 0x3f81 and 0x3f82 (even): up to even");
    case_bf16(0xbf808000, 0xbf80, "negative tie: toward the even one, down in magnitude");
    case_bf16(0xbf818000, 0xbf82, "negative tie: toward the even one, up in magnitude");
    case_bf16(0x3f807fff, 0x3f80, "one ulp below the tie: down");
    case_bf16(0x3f808001, 0x3f81, "one ulp above the tie (even below): up (truncation gives 0x3f80)");
    case_bf16(0x3f80ffff, 0x3f81, "just below the next bf16: up");
    case_bf16(0x3f7fffff, 0x3f80, "just below 1.0: up across the binade to 1.0");
    case_bf16(0x3f7f8000, 0x3f80, "tie at the top of a binade (0x3f7f odd): up to 1.0");
    case_bf16(0x40490fdb, 0x4049, "pi: 0x0fdb < 0x8000, down");
    case_bf16(0x3dcccccd, 0x3dcd, "0.1: 0xcccd > 0x8000, up");
    case_bf16(0x00000000, 0x0000, "+0");
    case_bf16(0x80000000, 0x8000, "-0 keeps its sign");
    case_bf16(0x00000001, 0x0000, "smallest subnormal float: to +0");
    case_bf16(0x80000001, 0x8000, "smallest negative subnormal float: to -0");
    case_bf16(0x00008000, 0x0000, "subnormal tie between 0 (even) and 0x0001: to 0");
    case_bf16(0x00018000, 0x0002, "subnormal tie between 0x0001 and 0x0002 (even): up");
    case_bf16(0x00008001, 0x0001, "subnormal just above the tie: up to the smallest bf16 subnormal");
    case_bf16(0x00010000, 0x0001, "smallest bf16 subnormal 2^-133, exact");
    case_bf16(0x007fffff, 0x0080, "largest subnormal float: up to the smallest normal 2^-126");
    case_bf16(0x807fffff, 0x8080, "largest negative subnormal float: to -2^-126");
    case_bf16(0x007f8000, 0x0080, "subnormal tie 0x007f (odd) / 0x0080: up to the normal");
    case_bf16(0x7f7f0000, 0x7f7f, "largest finite bf16 (2 - 2^-7) 2^127, exact");
    case_bf16(0x7f7f7fff, 0x7f7f, "below the overflow midpoint (2 - 2^-8) 2^127: stays finite");
    case_bf16(0x7f7f8000, 0x7f80, "the overflow midpoint: a tie, 0x7f7f is odd, so up: +Inf");
    case_bf16(0x7f7fffff, 0x7f80, "FLT_MAX: +Inf (truncation gives 0x7f7f)");
    case_bf16(0xff7f7fff, 0xff7f, "negative, below the overflow midpoint: stays finite");
    case_bf16(0xff7f8000, 0xff80, "negative overflow midpoint: -Inf");
    case_bf16(0xff7fffff, 0xff80, "-FLT_MAX: -Inf");
    case_bf16(0x7f7e8000, 0x7f7e, "tie just under the top: 0x7f7e even, stays");
    case_bf16(0x7f800000, 0x7f80, "+Inf");
    case_bf16(0xff800000, 0xff80, "-Inf");
    case_nan(0x7fc00000, "the canonical quiet NaN");
    case_nan(0xffc00000, "negative quiet NaN");
    case_nan(0x7f800001, "signaling NaN whose payload is all in the low 16 bits (truncation gives +Inf)");
    case_nan(0xff800001, "negative signaling NaN, payload in the low bits (truncation gives -Inf)");
    case_nan(0x7f810000, "signaling NaN with a payload in the top bits: quieted");
    case_nan(0x7fffffff, "all-ones payload (a rounding add carries into the sign bit)");
    case_nan(0xffffffff, "negative, all-ones payload");
    case_nan(0x7f808000, "NaN whose low half is exactly a tie (a rounding add gives +Inf 0x7f80+...)");

    // Everything.
    unsigned long long wrong = exhaustive_f32_to_bf16();
    check(wrong == 0,
          "f32_to_bf16 over all 2^32 floats: nearest bf16, ties to even, overflow to Inf from (2 - 2^-8) "
          "2^127, NaN quiet with its sign, Inf kept (%llu wrong)",
          wrong);

    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
