// A decode step's products with bf16 weights: y_r = sum_j w_rj x_j for rows of n weights, one x
// for every row. x is laid out once per product for the instruction set (prep), then each weight
// row is read once, widened in registers (a bf16 is the top half of an fp32: a shift or a mask).
//
// How each set sums (the bounds tests/test_dot_bf16.c checks against a double reference):
//   generic     C the compiler vectorizes as -march allows: any order, so the sequential bound
//               (each product rounded once, at most n - 1 additions after it).
//   avx2        32 partial sums (4 registers x 8 lanes) of fused multiply-adds (one rounding per
//               step, the product exact inside it), at most floor(n / 32) + 1 steps each, then
//               a 5-level tree.
//   avx512      64 partial sums (4 x 16), at most floor(n / 64) + 1 fused steps each, then a
//               6-level tree.
//   avx512bf16  x rounded to bf16 first (to nearest even: |dx| <= 2^-8 |x|), then vdpbf16ps: the
//               product of two bf16 is exact in fp32, and each instruction adds a lane's two
//               products one after the other, rounding each addition to nearest even, subnormal
//               inputs and results flushed to zero; 64 partial sums of at most floor(n / 128) + 1
//               instructions, then a 6-level tree.
// The first three multiply the fp32 activations exactly as the reference does (only the order
// of the sums differs); the last loses 8 bits of each activation. avx512bf16 is the default where
// the CPU has it (model/cpu_isa.h): a decode step is bound by memory bandwidth either way, but a
// prompt's products, compute-bound, run several times faster in bf16 (oneDNN, AMX), and one
// rounding of the activations serves both. PKV_CPU_ISA=fp32 keeps them fp32 (the tests' reference).
#ifndef DOT_BF16_H
#define DOT_BF16_H

#include <stddef.h>
#include <stdint.h>
#include "cpu_isa.h"

typedef struct {
    CpuIsa isa;
    // x (n) laid out for rows(): dot_bf16_x_bytes(n) bytes at xp, 64-byte aligned.
    void (*prep)(const float *x, int n, void *xp);
    // y[r] = row r of w (rows x n, row-major) times x, for r < rows.
    void (*rows)(const uint16_t *w, const void *xp, int n, int rows, float *y);
} DotBf16;

// The kernels of isa; NULL where they are not built (off x86-64).
const DotBf16 *dot_bf16_for(CpuIsa isa);
// The prepared x's size for any set: n rounded up to 32 floats.
static inline size_t dot_bf16_x_bytes(int n) { return (size_t)(n + 31) / 32 * 32 * sizeof(float); }

// n floats rounded to bf16 to nearest even (vcvtne2ps2bf16 where the CPU has AVX512_BF16, else
// f32_to_bf16; the two agree on every normal float): the activations of the bf16 products.
void dot_bf16_round(const float *x, size_t n, uint16_t *out);

// Each set's kernels (their own files); NULL off x86-64.
extern const DotBf16 dot_bf16_generic;
const DotBf16 *dot_bf16_avx2(void);
const DotBf16 *dot_bf16_avx512(void);
const DotBf16 *dot_bf16_avx512bf16(void);

#endif
