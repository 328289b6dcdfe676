// The decode products on bf16 weights (model/dot_bf16.h), every instruction set this CPU has,
// against a double reference with the bound each set's own arithmetic gives.
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
// Those three multiply x as it is: that bound, against x, is all they get.
//   avx512bf16   the one path that rounds x: xr_j = bf16(x_j), then vdpbf16ps. Two parts:
//     x's rounding. bf16 has p = 8 significant bits (7 stored); rounding to nearest even moves
//       x, 2^e <= |x| < 2^(e+1), by at most half an ulp, 2^(e-7) / 2 = 2^(e-8) <= 2^-8 |x|: the
//       unit roundoff of bf16 is 2^-8 (not 2^-9: that is half of it, and a single product, n = 1,
//       errs up to 2^-8 |w x|). So |sum w xr - sum w x| <= sum |w_j| |xr_j - x_j|
//       <= 2^-8 sum |w_j x_j|, whatever the signs.
//     the sums, against xr: a bf16 times a bf16 is exact in fp32 (8 + 8 bits); each instruction
//       adds a lane's two products one after the other, each addition rounded to nearest even;
//       a chain has at most floor(n / 128) + 1 instructions (the blocks past the last whole 128
//       go one to a chain), then a 6-level tree: h = 2 (floor(n / 128) + 1) + 6
//       = 2 floor(n / 128) + 8, |y - sum w xr| <= gamma(h) sum |w xr|.
//     Against x itself, by the triangle inequality:
//       |y - sum w x| <= 2^-8 sum |w x| + gamma(h) sum |w xr|,
//     and against xr the tight gamma(h) sum |w xr| alone: both are checked, the second being the
//     one that sees an error in the sums or a wrong rounding of x. vdpbf16ps flushes subnormal
//     inputs and results to zero; the inputs here stay far above 2^-126, so that adds nothing.
// Which bound a kernel gets follows from what its arithmetic does, and the test checks that: a
// probe (w = 1, x = 1 + 2^-10, which bf16 rounds to 1) says whether a kernel rounds x, and that
// must be true of avx512bf16 alone. The fp32 paths never get the 2^-8 allowance.
// avx512bf16's arithmetic is also written out in C here (emulated: the kernel's chains, the
// instruction's two rounded additions a lane, its flushes) and checked on every CPU against the
// same bounds, so the bf16 bound is exercised where the instruction is missing; the real kernel
// runs only where the CPU has AVX512_BF16.
// Inputs: Gaussian weights (bf16) and activations with channels 25x apart and outliers, signs
// mixed, lengths around the blocks' edges (1 .. 4097) and model sizes (576, 1536); outputs
// poisoned with NaN first (every one must be written), a guard past the last row untouched.
// Planted errors, each through the same checks, which must reject them (else the bounds are too
// loose to see them, or the checks see nothing):
//   tail       x's last element dropped (a partial block's bug): on every path, and at both model
//              sizes, where one element is smallest beside the bound;
//   x in bf16  x rounded to bf16 on an fp32 path (what the bf16 path does): that path's bound
//              must see it, so the fp32 paths keep their tighter bound;
//   truncated  on the bf16 path, x cut to bf16 (toward zero) instead of rounded to nearest: the
//              check against xr must see it.
// Sets this CPU lacks are listed and counted as skipped, not passed.
// Which set the products use (model/cpu_isa.h) is checked against the rule, written out apart in
// cpu_isa_rule.h: by default this CPU's best, avx512bf16 included; PKV_CPU_ISA's set where the CPU
// has it (fp32: the best of generic, avx2, avx512), else the best. The default is checked even
// when the caller set PKV_CPU_ISA (the suite runs on fp32): a child forked before this process's
// set is decided unsets it and says which set it got.
#include "../model/bf16.h"
#include "../model/cpu_isa.h"
#include "cpu_isa_rule.h"
#include "../model/dot_bf16.h"
#include "test_pariskv_util.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

// Whether a set's kernels multiply x rounded to bf16 (and so get the 2^-8 allowance): avx512bf16
// alone. The probe below checks that each kernel does what this says.
static int rounds_x(CpuIsa isa) { return isa == CPU_ISA_AVX512BF16; }

#define U_BF16_LOG2 (-8) // bf16's unit roundoff, 2^-8 (rounding to nearest even, 8 significant bits)

// What the kernel k does to x: w = 1, x = 1 + 2^-10 (an fp32, not a bf16: bf16 rounds it to 1).
// 0: multiplies x as it is; 1: rounds it to bf16; -1: neither (a wrong product).
static int probe_rounds_x(const DotBf16 *k) {
    float x[32] = {1.0f + 0x1p-10f}, y[2] = {NAN, NAN};
    uint16_t w[32] = {f32_to_bf16(1.0f)};
    void *xp = aligned_alloc(64, dot_bf16_x_bytes(32));
    k->prep(x, 1, xp);
    k->rows(w, xp, 1, 1, y);
    free(xp);
    return y[0] == x[0] ? 0 : y[0] == 1.0f ? 1 : -1;
}

// One shape through one set's kernels: the worst error over the rows as a fraction of the bound
// against x (the set's own: with the 2^-8 allowance where it rounds x), and for a set that rounds
// x the worst against xr = bf16(x) as a fraction of gamma(h) sum |w xr|; -1 for an unwritten
// output, -2 for a written guard.
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
    int rx = rounds_x(k->isa);
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
        if (rx) {
            double e = fabs(y[i] - ref_rx) / (gamma_h(h) * mag_rx + 1e-300);
            if (e > *worst_rx) *worst_rx = e;
            err /= ldexp(mag, U_BF16_LOG2) + gamma_h(h) * mag_rx + 1e-300;
        } else {
            err /= gamma_h(h) * mag + 1e-300;
        }
        if (err > *worst) *worst = err;
    }
    if (y[rows] != 12345.0f) *worst = -2;
    free(w), free(x), free(y), free(xp);
}

static const int ns[] = {1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 160, 576, 1536, 4097};
#define N_NS (int)(sizeof ns / sizeof ns[0])
#define N_SHAPES (3 * N_NS) // 1, 9 and 17 rows each

// Every shape through k, the same inputs for every kernel (one seed): the worst fractions of the
// bounds and which shapes broke one.
typedef struct {
    double x, rx;     // worst over the shapes (x: -1 an output unwritten, -2 the guard written)
    int bad, first_n; // shapes outside a bound; the first one's n (-1: none)
    int bad_n[N_NS];  // per length: whether some row count broke a bound
} Sweep;

static Sweep sweep(const DotBf16 *k) {
    Rng r = {29};
    Sweep s = {0, 0, 0, -1, {0}};
    for (int i = 0; i < N_NS; i++)
        for (int rows = 1; rows <= 17; rows += 8) {
            double wst, wrx;
            check_shape(k, &r, ns[i], rows, &wst, &wrx);
            if (wst < 0 || wst > 1 || wrx > 1) {
                if (s.first_n < 0) s.first_n = ns[i];
                s.bad++, s.bad_n[i] = 1;
            }
            s.x = s.x < 0 ? s.x : wst < 0 ? wst : fmax(s.x, wst);
            s.rx = fmax(s.rx, wrx);
        }
    return s;
}

static int bad_at(const Sweep *s, int n) {
    for (int i = 0; i < N_NS; i++)
        if (ns[i] == n) return s->bad_n[i];
    return 0;
}

// ---- planted errors: a kernel's own rows on an x changed before its prep ----

enum { PLANT_TAIL, PLANT_X_BF16, PLANT_X_TRUNC };
static const DotBf16 *plant_base;
static int plant_mode;

static void planted_prep(const float *x, int n, void *xp) {
    float *c = malloc((size_t)n * sizeof(float));
    memcpy(c, x, (size_t)n * sizeof(float));
    for (int j = 0; j < n; j++) {
        uint32_t u;
        memcpy(&u, &c[j], 4);
        if (plant_mode == PLANT_X_BF16) u = (uint32_t)f32_to_bf16(c[j]) << 16; // to nearest even
        if (plant_mode == PLANT_X_TRUNC) u &= 0xffff0000u;                       // toward zero
        memcpy(&c[j], &u, 4);
    }
    if (plant_mode == PLANT_TAIL) c[n - 1] = 0.0f;
    plant_base->prep(c, n, xp);
    free(c);
}

static void planted_rows(const uint16_t *w, const void *xp, int n, int rows, float *y) { plant_base->rows(w, xp, n, rows, y); }

static Sweep sweep_planted(const DotBf16 *k, int mode) {
    DotBf16 p = {k->isa, planted_prep, planted_rows};
    plant_base = k, plant_mode = mode;
    return sweep(&p);
}

// ---- avx512bf16's arithmetic written out in C (model/dot_bf16_avx512.c, dot_bf16), any CPU ----

static float ftz(float v) { return fabsf(v) < FLT_MIN ? 0.0f : v; }             // results: subnormals flushed
static float daz(uint16_t h) { return (h & 0x7f80) ? bf16_to_f32(h) : 0.0f; } // inputs: subnormals read as 0

static void emu_prep(const float *x, int n, void *xp) { // as prep_bf16: x to bf16, zeros to a whole block
    uint16_t *o = xp;
    dot_bf16_round(x, (size_t)n, o);
    for (int j = n; j % 32; j++) o[j] = 0;
}

// One vdpbf16ps on a block of 32 (16 lanes, lane l holding elements 2l and 2l + 1): as Intel's
// pseudocode, lane += w[2l+1] x[2l+1], then lane += w[2l] x[2l], the products exact, each
// addition rounded to nearest even. Weights at or past `valid` read as zero (the masked load).
static void emu_dp(float *acc, const uint16_t *w, int valid, const uint16_t *x) {
    for (int l = 0; l < 16; l++) {
        float w1 = 2 * l + 1 < valid ? daz(w[2 * l + 1]) : 0.0f, w0 = 2 * l < valid ? daz(w[2 * l]) : 0.0f;
        acc[l] = ftz(acc[l] + w1 * daz(x[2 * l + 1]));
        acc[l] = ftz(acc[l] + w0 * daz(x[2 * l]));
    }
}

static void emu_rows(const uint16_t *w, const void *xp, int n, int nr, float *y) {
    const uint16_t *x = xp;
    for (int r = 0; r < nr; r++, w += n) {
        float a[4][16] = {{0}}, s[16];
        int full = n / 32 * 32, j = 0;
        for (; j + 128 <= full; j += 128)
            for (int c = 0; c < 4; c++) emu_dp(a[c], w + j + 32 * c, 32, x + j + 32 * c);
        for (int c = 0; j < full; j += 32, c++) emu_dp(a[c], w + j, 32, x + j); // c < 3: the last blocks over a0 .. a2
        if (j < n) emu_dp(a[3], w + j, n - j, x + j);
        for (int l = 0; l < 16; l++) s[l] = (a[0][l] + a[1][l]) + (a[2][l] + a[3][l]);
        for (int h = 8; h; h /= 2) // the 16 lanes' tree (_mm512_reduce_add_ps)
            for (int l = 0; l < h; l++) s[l] += s[l + h];
        y[r] = s[0];
    }
}

static const DotBf16 emulated_bf16 = {CPU_ISA_AVX512BF16, emu_prep, emu_rows};

// ---- one path: what it does to x, the shapes, the planted errors ----

static void check_path(const DotBf16 *k, const char *name) {
    int rx = rounds_x(k->isa), probe = probe_rounds_x(k);
    check(probe == rx, "%s: %s (w = 1, x = 1 + 2^-10: y %s), so it is judged against the %s bound", name,
          rx ? "rounds x to bf16" : "keeps x as it is", probe == 1 ? "1" : probe == 0 ? "1 + 2^-10" : "neither", rx ? "bf16" : "fp32");
    Sweep s = sweep(k);
    check(s.bad == 0 && s.x >= 0, "%s: %d shapes (n 1 .. 4097, 1 .. 17 rows) within the bound%s: worst error %.3g of it (first bad n: %d)%s",
          name, N_SHAPES, rx ? " against x, 2^-8 sum |w x| + gamma(h) sum |w xr|" : " gamma(h) sum |w x|", s.x, s.first_n,
          s.x == -1 ? " (an output unwritten)" : s.x == -2 ? " (the guard past the last row written)" : "");
    if (rx) check(s.rx <= 1, "%s: against xr = bf16(x), worst error %.3g of gamma(h) sum |w xr|", name, s.rx);

    Sweep t = sweep_planted(k, PLANT_TAIL);
    check(bad_at(&t, 576) && bad_at(&t, 1536), "%s: planted: x's last element dropped: rejected in %d of %d shapes, both model sizes among "
          "them (576: %s, 1536: %s; worst %.3g of the bound against x%s)", name, t.bad, N_SHAPES, bad_at(&t, 576) ? "yes" : "no",
          bad_at(&t, 1536) ? "yes" : "no", t.x, rx ? ", and see against xr" : "");
    if (rx) {
        printf("     (the tail dropped, against xr: worst %.3g of gamma(h) sum |w xr|)\n", t.rx);
        Sweep c = sweep_planted(k, PLANT_X_TRUNC);
        check(c.bad > 0, "%s: planted: x cut to bf16 (toward zero) for rounded to nearest: rejected in %d of %d shapes (against xr: "
              "worst %.3g of the bound; against x: %.3g)", name, c.bad, N_SHAPES, c.rx, c.x);
    } else {
        Sweep c = sweep_planted(k, PLANT_X_BF16);
        check(c.bad > 0, "%s: planted: x rounded to bf16 (the bf16 path's x) on this fp32 path: rejected in %d of %d shapes by the fp32 "
              "bound (worst %.3g of it)", name, c.bad, N_SHAPES, c.x);
    }
}

// The set a process gets without PKV_CPU_ISA, from a child forked before this one decides its own
// (cpu_isa_best() reads no environment); -1 if the child did not run or end.
static int default_set(void) {
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        unsetenv("PKV_CPU_ISA");
        _exit((int)cpu_isa());
    }
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

int main(void) {
    int skipped = 0;
    char ran[128] = "", lack[128] = "";
    int dflt = default_set();
    check(dflt == (int)cpu_isa_best(), "without PKV_CPU_ISA the products use this CPU's best set, %s (got %s)%s", cpu_isa_name(cpu_isa_best()),
          dflt < 0 ? "no answer" : cpu_isa_name((CpuIsa)dflt), cpu_isa_best() == CPU_ISA_AVX512BF16 ? ": activations rounded to bf16" : "");
    const char *env = getenv("PKV_CPU_ISA");
    check(cpu_isa() == cpu_isa_rule(env), "here, with PKV_CPU_ISA=%s, the products use %s (the rule: %s)", env ? env : "(unset)",
          cpu_isa_name(cpu_isa()), cpu_isa_name(cpu_isa_rule(env)));
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
        check_path(k, cpu_isa_name(isa));
    }
    // The bf16 bound on avx512bf16's arithmetic written out in C, on any CPU.
    check_path(&emulated_bf16, "avx512bf16 in C");
    printf("instruction sets run:%s (and avx512bf16's arithmetic in C); skipped:%s\n", ran, skipped ? lack : " none");
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
