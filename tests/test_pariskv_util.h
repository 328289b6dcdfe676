// What the ParisKV tests share: the check line and its counters, and a fixed-seed generator.
#ifndef TEST_PARISKV_UTIL_H
#define TEST_PARISKV_UTIL_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

static int passed, failed;

// Prints "ok   ..." or "FAIL ..." and counts it; main ends with the "N passed, N failed" line.
static inline void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    ok ? passed++ : failed++;
}

typedef struct {
    unsigned long long s;
} Rng;

static inline unsigned long long next_u64(Rng *r) { // splitmix64
    unsigned long long z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double uniform(Rng *r) { return (double)(next_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

static inline float gauss(Rng *r) { // Box-Muller
    double u = uniform(r), v = uniform(r);
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

// Anisotropic vectors like real keys and queries: per-channel scales spanning 25x, and large
// offsets on every 16th channel.
typedef struct {
    float scale[128], offset[128];
} Shape;

static inline Shape make_shape(Rng *r, int D, float offset) {
    Shape s = {{0}, {0}};
    for (int j = 0; j < D; j++) {
        s.scale[j] = expf(logf(0.2f) + (logf(5.0f) - logf(0.2f)) * (float)uniform(r));
        s.offset[j] = j % 16 == 3 ? offset * gauss(r) : 0.0f;
    }
    return s;
}

static inline void draw(Rng *r, const Shape *s, int D, float *x) {
    for (int j = 0; j < D; j++) x[j] = s->scale[j] * gauss(r) + s->offset[j];
}

#endif
