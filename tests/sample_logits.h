// Random logits for the sampler's tests (tests/test_sampler.c, kernels/test_sample.cu): one
// xorshift stream, seeded by the includer (#define SAMPLE_LOGITS_SEED first), and the three
// shapes both draw from at a 152K vocabulary.
#ifndef SAMPLE_LOGITS_H
#define SAMPLE_LOGITS_H

#include <math.h>
#include <stdint.h>

static uint64_t rng = SAMPLE_LOGITS_SEED;
static double frand(void) { // uniform [0, 1)
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static double gauss(void) { return sqrt(-2 * log(1 - frand())) * cos(6.283185307179586 * frand()); }

enum { FLAT, PEAKED, TIED };
// FLAT uniform in [-2, 2]; PEAKED 3 x gauss with 5 tokens near +15 (a confident model); TIED
// values on a grid of 0.25 in [-2, 2] (ties everywhere).
static void make_logits(float *l, int n, int kind) {
    for (int i = 0; i < n; i++) {
        if (kind == FLAT) l[i] = (float)(4 * frand() - 2);
        else if (kind == PEAKED) l[i] = (float)(3 * gauss());
        else l[i] = (float)(floor(16 * frand()) * 0.25 - 2);
    }
    if (kind == PEAKED)
        for (int j = 0; j < 5; j++) l[(int)(frand() * n)] = (float)(15 - 0.5 * j);
}

#endif
