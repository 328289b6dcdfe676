// The CPU attention's vectorizable exp (attention/softmax_exp.h) against exp in double: every
// float in [-87, 0] at a fixed stride plus the ends, its largest error in ulp of the result.
// The bound, 2 ulp: the reduction's r carries ~1 ulp (n ln2 split in two, products exact to
// rounding), the polynomial's truncation at r^8/40320 is < 6e-9 relative (0.05 ulp), Horner's
// seven roundings ~0.5 ulp; measured below.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../attention/softmax_exp.h"

static double ulp_err(float x) {
    double want = exp((double)x);
    float got = softmax_exp(x);
    float w = (float)want;
    float next = nextafterf(w, INFINITY);
    return fabs((double)got - want) / ((double)next - (double)w);
}

int main(void) {
    int passed = 0, failed = 0;
    double worst = 0;
    float at = 0;
    long n = 0;
    // every 97th float bit pattern from -87 up to -0: about 11 million points across all binades
    uint32_t lo, hi;
    float a = -87.0f, b = -0.0f;
    memcpy(&lo, &b, 4), memcpy(&hi, &a, 4);
    for (uint32_t u = lo; u <= hi; u += 97, n++) {
        float x;
        memcpy(&x, &u, 4);
        double e = ulp_err(x);
        if (e > worst) worst = e, at = x;
    }
    const float ends[] = {0.0f, -0.0f, -87.0f, -1e-30f, -0.34657359f, -86.9999f};
    for (int i = 0; i < 6; i++) {
        float x = ends[i];
        double e = ulp_err(x);
        if (e > worst) worst = e, at = x;
    }
    int ok = worst <= 2.0;
    printf("%s softmax_exp over %ld points in [-87, 0]: worst %.3f ulp at %.9g (bound 2)\n", ok ? "ok  " : "FAIL", n, worst, at);
    ok ? passed++ : failed++;
    int below = softmax_exp(-87.5f) == 0.0f && softmax_exp(-1e30f) == 0.0f && softmax_exp(-INFINITY) == 0.0f;
    printf("%s below -87 (and -inf): 0\n", below ? "ok  " : "FAIL");
    below ? passed++ : failed++;
    int nan = isnan(softmax_exp(NAN)); // a damaged model's scores: NaN out, as expf gives, no undefined shift
    printf("%s NaN in, NaN out\n", nan ? "ok  " : "FAIL");
    nan ? passed++ : failed++;
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
