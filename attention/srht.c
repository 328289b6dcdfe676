// Randomized Hadamard transform: signs, then the fast Walsh-Hadamard butterfly, then 1/sqrt(D).
#include "srht.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void srht_signs(uint64_t seed, int D, float *s) {
    uint64_t st = seed, bits = 0;
    for (int i = 0; i < D; i++) {
        if (i % 64 == 0) bits = splitmix64(&st);
        s[i] = (bits >> (i % 64)) & 1 ? -1.0f : 1.0f;
    }
}

void srht_apply(float *x, const float *s, int D) {
    for (int i = 0; i < D; i++) x[i] *= s[i];
    for (int h = 1; h < D; h *= 2)
        for (int i = 0; i < D; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float scale = 1.0f / sqrtf((float)D);
    for (int i = 0; i < D; i++) x[i] *= scale;
}
