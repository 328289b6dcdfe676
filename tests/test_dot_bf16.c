// The decode products on bf16 weights (model/dot_bf16.h), every instruction set this CPU has,
// against a double reference with the bound each set's arithmetic gives.
//
// The reference: sum_j w_j x_j in double. A bf16 times an fp32 is exact in double (8 + 24
// significant bits), and the double sum's own error (n 2^-53 relative) is 2^-29 of the bounds
// below, so it stands for the exact value. A kernel whose longest chain of roundings has h steps
// (a step: one fp32 rounding a term passes through) is within gamma(h) sum_j |w_j x_j|, gamma(h)
// = h u / (1 - h u), u = 2^-24 (Higham, Accuracy and Stability, 3.1 and 4.2):
//   generic      any order: the product's rounding, then up to n - 1 additions: h = n
//   avx2         32 partial sums of at most floor(n / 32) + 1 fused steps, a 5-level tree:
//                h = floor(n / 32) + 6
//   avx512       64 partial sums of at most floor(n / 64) + 1 fused steps, a 6-level tree:
//                h = floor(n / 64) + 7
//   avx512bf16   x -> bf16 (|dx| <= 2^-9 |x|); then exact products and two roundings per
//                instruction, at most floor(n / 128) + 1 instructions a chain (the blocks past
//                the last whole 128 go one to a chain), a 6-level tree: h = 2 floor(n / 128) + 8
//                against the rounded x, and 2^-9 sum |w x| + gamma(h) sum |w bf16(x)| against x
//                itself. vdpbf16ps flushes subnormals; the inputs here stay above 2^-100, so
//                that adds nothing.
// Inputs: Gaussian weights (bf16) and activations with channels 25x apart and outliers, signs
// mixed, lengths around the blocks' edges (1 .. 4097) and model sizes (576, 1536); outputs
// poisoned with NaN first (every one must be written), a guard past the last row untouched.
// Sets this CPU lacks are listed and counted as skipped, not passed.
#include "../model/bf16.h"
#include "../model/cpu_isa.h"
#include "../model/dot_bf16.h"
#include "test_pariskv_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double gamma_h(double h) {
    double u = ldexp(1.0, -24);
    return h * u / (1.0 - h * u);
}

static double steps(CpuIsa isa, int n) {
    switch (isa) {
    case CPU_ISA_AVX2: return n / 32 + 6;
    case CPU_ISA_AVX512: return n / 64 + 7;
    case CPU_ISA_AVX512BF16: return 2 * (n / 128) + 8;
    default: return n;
    }
}

// One shape through one set's kernels: the worst error over the rows as a fraction of the bound
// (against x itself; for avx512bf16 also against bf16(x)), or -1 for an unwritten output.
static void check_shape(const DotBf16 *k, Rng *r, int n, int rows, double *worst, double *worst_rx) {
    uint16_t *w = malloc((size_t)n * rows * sizeof(uint16_t));
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)(rows + 1) * sizeof(float));
    void *xp = aligned_alloc(64, dot_bf16_x_bytes(n));
    float chan[64];
    for (int c = 0; c < 64; c++) chan[c] = expf(logf(0.2f) + logf(25.0f) * (float)uniform(r));
    for (int j = 0; j < n; j++) x[j] = chan[j % 64] * gauss(r) * (j % 97 == 5 ? 40.0f : 1.0f);
    for (size_t i = 0; i < (size_t)n * rows; i++) w[i] = f32_to_bf16(0.05f * gauss(r));
    for (int i = 0; i <= rows; i++) y[i] = NAN;
    y[rows] = 12345.0f; // the guard
    k->prep(x, n, xp);
    k->rows(w, xp, n, rows, y);
    double h = steps(k->isa, n);
    *worst = *worst_rx = 0;
    for (int i = 0; i < rows; i++) {
        double ref = 0, mag = 0, ref_rx = 0, mag_rx = 0;
        for (int j = 0; j < n; j++) {
            double wj = bf16_to_f32(w[(size_t)i * n + j]), xr = bf16_to_f32(f32_to_bf16(x[j]));
            ref += wj * x[j], mag += fabs(wj * x[j]);
            ref_rx += wj * xr, mag_rx += fabs(wj * xr);
        }
        if (!isfinite(y[i])) {
            *worst = -1;
            break;
        }
        double err = fabs(y[i] - ref);
        if (k->isa == CPU_ISA_AVX512BF16) {
            double e = fabs(y[i] - ref_rx) / (gamma_h(h) * mag_rx + 1e-300);
            if (e > *worst_rx) *worst_rx = e;
            err /= ldexp(mag, -9) + gamma_h(h) * mag_rx + 1e-300;
        } else {
            err /= gamma_h(h) * mag + 1e-300;
        }
        if (err > *worst) *worst = err;
    }
    if (y[rows] != 12345.0f) *worst = -2;
    free(w), free(x), free(y), free(xp);
}

int main(void) {
    Rng r = {29};
    int skipped = 0;
    char ran[128] = "", lack[128] = "";
    static const int ns[] = {1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 160, 576, 1536, 4097};
    check(cpu_isa() <= CPU_ISA_AVX512 || getenv("PKV_CPU_ISA"), "the default set (%s) multiplies fp32 activations as they are",
          cpu_isa_name(cpu_isa()));
    check(cpu_isa_supported(cpu_isa()), "the set in use (%s) is one this CPU has (best: %s)", cpu_isa_name(cpu_isa()),
          cpu_isa_name(cpu_isa_best()));
    for (int s = 0; s < CPU_ISA_COUNT; s++)
        check(cpu_isa_parse(cpu_isa_name((CpuIsa)s)) == s, "PKV_CPU_ISA name %s parses back", cpu_isa_name((CpuIsa)s));
    for (int s = 0; s < CPU_ISA_COUNT; s++) {
        CpuIsa isa = (CpuIsa)s;
        const DotBf16 *k = dot_bf16_for(isa);
        if (!cpu_isa_supported(isa) || !k) {
            printf("SKIP %s: %s\n", cpu_isa_name(isa), k ? "this CPU lacks it" : "not built for this architecture");
            snprintf(lack + strlen(lack), sizeof lack - strlen(lack), " %s", cpu_isa_name(isa));
            skipped++;
            continue;
        }
        snprintf(ran + strlen(ran), sizeof ran - strlen(ran), " %s", cpu_isa_name(isa));
        check(k->isa == isa, "%s: the kernels say they are %s", cpu_isa_name(isa), cpu_isa_name(k->isa));
        double all = 0, all_rx = 0;
        int bad_n = -1;
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (int rows = 1; rows <= 17; rows += 8) {
                double wst, wrx;
                check_shape(k, &r, ns[i], rows, &wst, &wrx);
                if ((wst < 0 || wst > 1 || wrx > 1) && bad_n < 0) bad_n = ns[i];
                if (wst < 0) all = 1e9;
                all = fmax(all, wst), all_rx = fmax(all_rx, wrx);
            }
        check(bad_n < 0, "%s: 60 shapes (n 1 .. 4097, 1 .. 17 rows) within the bound: worst error %.3g of it%s (first bad n: %d)",
              cpu_isa_name(isa), all, isa == CPU_ISA_AVX512BF16 ? " (against bf16(x): see below)" : "", bad_n);
        if (isa == CPU_ISA_AVX512BF16)
            check(all_rx <= 1, "%s: against the activations rounded to bf16, worst error %.3g of gamma(h) sum |w bf16(x)|",
                  cpu_isa_name(isa), all_rx);
    }
    printf("instruction sets run:%s; skipped:%s\n", ran, skipped ? lack : " none");
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
