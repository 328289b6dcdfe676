// Prompt products through oneDNN's matmul (model/gemm_dnnl.h) against a double reference.
//
// oneDNN does not say in which order it sums, so the bound is the one for any order: each term
// goes through at most n roundings (its product, then up to n - 1 additions), |y - ref| <=
// gamma(n) sum_j |w_j x_j|, gamma(n) = n u / (1 - n u), u = 2^-24 (Higham, 3.1 and 4.2).
//   fp32: that bound against x itself. It runs wherever oneDNN is built in, and checks the
//         plumbing every type shares: panels of weight rows read transposed in place, the last
//         panel shorter, y written with its row stride, nothing outside the panel touched.
//   bf16: x rounded to bf16 first (to nearest even, |dx| <= 2^-9 |x|); a bf16 times a bf16 is
//         exact in fp32, so against the rounded x the same gamma(n) bound holds, and against x
//         itself 2^-9 sum |w x| more. oneDNN 2.6 has its bf16 matmul only from AVX512_BF16 up
//         (AMX too): elsewhere that part is skipped and named.
// Then the backend's product on several tokens with PKV_CPU_ISA=avx512bf16 (oneDNN's panels in
// the pool's tasks), against the bf16 bound, where the CPU has AVX512_BF16.
#include "../model/backend.h"
#include "../model/bf16.h"
#include "../model/config.h"
#include "../model/cpu_isa.h"
#include "../model/dot_bf16.h"
#include "../model/gemm_dnnl.h"
#include "test_pariskv_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PANEL 64

static double gamma_n(int n) {
    double u = ldexp(1.0, -24);
    return n * u / (1.0 - n * u);
}

typedef struct {
    int T, n, d;
    float *x, *y;
    uint16_t *w, *xb;
    float *wf;
} Case;

static void make_case(Case *c, Rng *r, int T, int n, int d) {
    *c = (Case){T, n, d, malloc((size_t)T * n * 4), malloc((size_t)T * d * 4), malloc((size_t)d * n * 2),
                malloc((size_t)T * n * 2), malloc((size_t)d * n * 4)};
    for (int i = 0; i < T * n; i++) c->x[i] = gauss(r) * (i % 53 == 7 ? 30.0f : 1.0f);
    for (int i = 0; i < d * n; i++) c->w[i] = f32_to_bf16(0.05f * gauss(r)), c->wf[i] = bf16_to_f32(c->w[i]);
    dot_bf16_round(c->x, (size_t)T * n, c->xb);
    for (int i = 0; i < T * d; i++) c->y[i] = NAN;
}

static void free_case(Case *c) { free(c->x), free(c->y), free(c->w), free(c->xb), free(c->wf); }

// The worst |y - ref| over the case as a fraction of its bound (bf16: x rounded, plus 2^-9 sum
// |w x| when against x); -1 if an output was not written.
static double worst(const Case *c, int bf16, int against_rounded) {
    double wst = 0;
    for (int t = 0; t < c->T; t++)
        for (int i = 0; i < c->d; i++) {
            double ref = 0, mag = 0, mag_x = 0;
            for (int j = 0; j < c->n; j++) {
                double wj = c->wf[(size_t)i * c->n + j], xj = c->x[(size_t)t * c->n + j];
                double xr = bf16 ? bf16_to_f32(c->xb[(size_t)t * c->n + j]) : xj;
                ref += wj * (against_rounded ? xr : xj), mag += fabs(wj * xr), mag_x += fabs(wj * xj);
            }
            float y = c->y[(size_t)t * c->d + i];
            if (!isfinite(y)) return -1;
            double bound = gamma_n(c->n) * mag + (bf16 && !against_rounded ? ldexp(mag_x, -9) : 0) + 1e-30;
            wst = fmax(wst, fabs(y - ref) / bound);
        }
    return wst;
}

static const int shapes[][3] = {{1, 64, 64}, {3, 100, 130}, {17, 576, 200}, {64, 576, 64}, {256, 128, 192}, {5, 1536, 100}};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

// Every shape through gemm_dnnl of the type, panel by panel; returns 0 when oneDNN has no such
// matmul here (nothing checked).
static int check_type(GemmDnnlType type, Rng *r) {
    const char *name = type == GEMM_DNNL_BF16 ? "bf16" : "fp32";
    double all = 0, all_rx = 0;
    int fails = 0;
    for (int s = 0; s < N_SHAPES; s++) {
        Case c;
        make_case(&c, r, shapes[s][0], shapes[s][1], shapes[s][2]);
        GemmDnnl *g = gemm_dnnl_create(type, c.T, c.n, c.d, PANEL);
        if (!g) {
            free_case(&c);
            if (s == 0) return 0;
            check(0, "%s: oneDNN made the first shape's matmul but not shape %d's", name, s);
            return 1;
        }
        for (int i0 = 0; i0 < c.d; i0 += PANEL)
            fails += gemm_dnnl_panel(g, c.y, type == GEMM_DNNL_BF16 ? (const void *)c.xb : c.x, type == GEMM_DNNL_BF16 ? (const void *)c.w : c.wf, i0) != 0;
        gemm_dnnl_destroy(g);
        double wx = worst(&c, type == GEMM_DNNL_BF16, 0), wr = type == GEMM_DNNL_BF16 ? worst(&c, 1, 1) : 0;
        all = wx < 0 || all < 0 ? -1 : fmax(all, wx), all_rx = wr < 0 || all_rx < 0 ? -1 : fmax(all_rx, wr);
        free_case(&c);
    }
    check(fails == 0, "%s: every panel call succeeded (%d failed)", name, fails);
    check(all >= 0 && all <= 1, "%s: %d shapes (T 1 .. 256, n 64 .. 1536, d 64 .. 200, last panels short) within the bound against x: worst %.3g of it%s",
          name, N_SHAPES, all, all < 0 ? " (an output left unwritten)" : "");
    if (type == GEMM_DNNL_BF16)
        check(all_rx >= 0 && all_rx <= 1, "bf16: against x rounded to bf16, within gamma(n) sum |w bf16(x)|: worst %.3g of it", all_rx);
    return 1;
}

int main(void) {
    Rng r = {2929};
    int skipped = 0;
    GemmDnnl *probe = gemm_dnnl_create(GEMM_DNNL_F32, 1, 64, 64, PANEL);
    if (!probe) {
        printf("SKIP oneDNN is not built in (the Makefile found no oneapi/dnnl/dnnl.h: apt-get install libdnnl-dev)\n");
        printf("0 passed, 0 failed, 1 skipped\n");
        return 77;
    }
    gemm_dnnl_destroy(probe);
    printf("oneDNN dispatches to %s on this CPU; the products' set: %s\n", gemm_dnnl_isa(), cpu_isa_name(cpu_isa_best()));
    check(check_type(GEMM_DNNL_F32, &r), "fp32: oneDNN has an fp32 matmul here");
    if (!check_type(GEMM_DNNL_BF16, &r)) {
        printf("SKIP bf16 matmul: oneDNN has none for this CPU (it needs AVX512_BF16 or AMX; this one's best: %s)\n", gemm_dnnl_isa());
        skipped++;
    }
    if (cpu_isa_supported(CPU_ISA_AVX512BF16)) {
        setenv("PKV_CPU_ISA", "avx512bf16", 1); // read once, at the first product
        Case c;
        make_case(&c, &r, 9, 576, 200);
        backend_cpu.matmul(c.y, c.x, c.w, DTYPE_BF16, c.T, c.n, c.d);
        double wx = worst(&c, 1, 0);
        check(cpu_isa() == CPU_ISA_AVX512BF16 && wx >= 0 && wx <= 1,
              "the backend's product of 9 tokens with PKV_CPU_ISA=%s: within the bf16 bound against x (worst %.3g of it)", cpu_isa_name(cpu_isa()), wx);
        free_case(&c);
    } else {
        printf("SKIP the backend's bf16 prompt product: this CPU lacks AVX512_BF16\n");
        skipped++;
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
