// ParisKV's math, as small pure functions over flat arrays (../shared/pariskv-spec.md has every
// constant). pariskv_encode.c: one key -> (ids, codes, w). pariskv_select.c: one query -> the
// top-k zone slots (vote, bucket top-C, rerank, top-k). pariskv.c holds the index per layer and
// KV head and plugs this into the Selector interface.
//
// Layout, per (layer, KV head), contiguous, slot i = the i-th retrieval-zone key, B = D / 8:
//   ids   uint8  (n, B)      sign-pattern centroid id of each 8-dim subspace
//   codes uint8  (n, B, 4)   4-bit codes, two coordinates per byte, the even one in the low nibble
//   w     uint16 (n, B)      fp16 weights ||k|| r_b / alpha_b
// 7 B per subspace: 56 B per key at D = 64, 112 B at D = 128, what the CUDA kernels keep on the
// GPU. w is fp16 there to halve its share of the index and of the rerank's reads; its rounding
// (2^-11 relative) is far below the 4-bit code's error, and the CPU reference stores the same
// rounded value so that both rank candidates from identical inputs.
#ifndef PARISKV_H
#define PARISKV_H

#include <stddef.h>
#include <stdint.h>

#define PKV_M 8        // subspace dimension
#define PKV_PATTERNS 256 // sign patterns of one subspace: 2^m
#define PKV_TIERS 6
#define PKV_MAX_D 1024

extern const float pkv_thresholds[7]; // |u| magnitude thresholds of the 3-bit levels
extern const float pkv_centers[8];    // reconstruction levels
extern const float pkv_levels[16];   // code -> value: bit 3 the sign, bits 0-2 the center
extern const double pkv_tier_frac[PKV_TIERS];

// ---- fp16 (IEEE binary16), round to nearest even ----
uint16_t pkv_f32_to_f16(float f);
float pkv_f16_to_f32(uint16_t h);

// ---- encoding (pariskv_encode.c) ----

// Encodes key k (D floats, D a power of two >= 8) with the sign vector s: ids (B), codes (B * 4),
// w (B). alpha (B, may be NULL) receives alpha_b, for tests.
void pkv_encode_key(const float *k, int D, const float *s, uint8_t *ids, uint8_t *codes, uint16_t *w, float *alpha);
// The 4-bit code of one coordinate u of a unit subspace direction, and the value it decodes to.
int pkv_code(float u);
float pkv_decode(int code);

// ---- one query (pariskv_select.c) ----

// (beta, rho) for a zone of n keys: n < 5K (0.5, 0.5); < 10K (0.25, 0.3); < 30K (0.2, 0.25); else (0.1, 0.2).
void pkv_schedule(int n, float *beta, float *rho);
// ceil(x) for a product of decimal constants: within 1e-9 of an integer counts as that integer,
// so that 1000 * 0.5 * 0.3 gives 150 and not 151.
int pkv_ceil(double x);
// qt = SRHT(q / ||q||) (D), *qnorm = ||q||.
void pkv_prepare_query(const float *q, int D, const float *s, float *qt, float *qnorm);
// Bonus (0..6) of every sign pattern of every subspace, bonus (B, 256), from the query's ranking
// of the patterns and the zone's id counts, count (B, 256) over n keys.
void pkv_bonus(const float *qt, int B, const int32_t *count, int n, float rho, uint8_t *bonus);
// score[i] = sum over subspaces of bonus_b(ids[i][b]) (0 .. 6B), i < n.
void pkv_vote(const uint8_t *ids, int n, int B, const uint8_t *bonus, uint16_t *score);
// The C highest scores among n (ties: the smaller slot) by a histogram, no sort: slots
// ascending into out, returns min(C, n). hist: room for max_score + 1 counters.
int pkv_bucket_topc(const uint16_t *score, int n, int max_score, int C, int32_t *hist, int *out);
// The calibrated estimate of <k, q> from one key's codes and w: ||q|| sum_b w_b <v_b, qt_b>,
// accumulated in fp32 (coordinates in order within a subspace, subspaces in order).
float pkv_estimate(const uint8_t *codes, const uint16_t *w, int B, const float *qt, float qnorm);

// ---- the index of one (layer, KV head) ----
typedef struct {
    int B, n, cap;
    uint8_t *ids;   // (cap, B)
    uint8_t *codes; // (cap, B, 4)
    uint16_t *w;    // (cap, B)
    int32_t *count; // (B, 256): zone keys with each id, per subspace, kept up to date as keys arrive
} PkvIndex;

// Scratch for pkv_select over up to max_n keys, in bytes.
size_t pkv_scratch_bytes(int B, int max_n, int k);
// The whole step for one query: vote, bucket top-C (C = max(ceil(beta n), min(k, n))), rerank
// the candidates, keep the k best estimates (ties: the smaller slot). beta, rho <= 0: the
// schedule. Slots ascending into out; returns the count.
int pkv_select(const PkvIndex *ix, int D, const float *s, const float *q, int k, float beta, float rho, void *scratch, int *out);

#endif
