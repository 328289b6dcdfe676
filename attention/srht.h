// The shared rotation of ParisKV: a subsampling-free randomized Hadamard transform,
// x <- H diag(s) x / sqrt(D), with H the D x D Walsh-Hadamard matrix (Sylvester order) and s
// fixed pseudo-random signs. Orthogonal, so it preserves inner products; it spreads a vector's
// energy over all coordinates, which makes the subspace directions near-isotropic.
#ifndef SRHT_H
#define SRHT_H

#include <stdint.h>

// The seed of the one sign vector a model uses for every layer and head, keys and queries alike.
#define SRHT_SEED 0x50415249534b5631ull // "PARISKV1"

// D signs (+1 / -1) from seed: the bits of a splitmix64 stream, lowest bit first.
void srht_signs(uint64_t seed, int D, float *s);
// In place; D a power of two.
void srht_apply(float *x, const float *s, int D);

#endif
