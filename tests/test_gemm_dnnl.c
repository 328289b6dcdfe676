// Prompt products through oneDNN's matmul (model/gemm_dnnl.h) against a double reference.
//
// oneDNN does not say in which order it sums, so the bound is the one for any order: each term
// goes through at most n roundings (its product, then up to n - 1 additions), |y - ref| <=
// gamma(n) sum_j |w_j x_j|, gamma(n) = n u / (1 - n u), u = 2^-24 (Higham, 3.1 and 4.2).
//   fp32: that bound against x itself. It runs wherever oneDNN is built in, and checks the
//         plumbing every type shares: panels of weight rows read transposed in place, the last
//         panel shorter, y written with its row stride, nothing outside the panel touched.
//   bf16: x rounded to bf16 first, xr = bf16(x): bf16 has 8 significant bits, so rounding to
//         nearest even moves x by at most half an ulp, |xr - x| <= 2^-8 |x| (bf16's unit
//         roundoff). A bf16 times a bf16 is exact in fp32, so against xr the same gamma(n) sum
//         |w xr| holds, and against x itself 2^-8 sum |w x| more (|sum w (xr - x)| <= 2^-8 sum
//         |w x|, whatever the signs). oneDNN 2.6 has its bf16 matmul only from AVX512_BF16 up (AMX
//         too): elsewhere that part is skipped and named.
// Then the backend's prompt product (backend_cpu.c, T > 1 on bf16 weights), which takes one of two
// paths, and the test expects the one the code takes (backend_cpu.c, matmul):
//   bf16  oneDNN's bf16 matmul, x rounded to bf16 once (dot_bf16_round): when the products' set,
//         cpu_isa(), is avx512bf16 (the default where the CPU has AVX512_BF16, or
//         PKV_CPU_ISA=avx512bf16) and oneDNN has a bf16 matmul here. The bf16 bound above, and
//         against xr gamma(n) alone.
//   fp32  every other case: OpenBLAS's sgemm on the weights widened to fp32 (exactly) and x as it
//         is (NO_BLAS: dot_f32 row by row): any order, gamma(n) sum |w x| against x.
// PKV_CPU_ISA never reaches oneDNN: gemm_dnnl.c does not cap oneDNN's instruction set (oneDNN
// reads only its own ONEDNN_MAX_CPU_ISA); it decides whether our code calls oneDNN at all. So on
// an AVX512_BF16 CPU with PKV_CPU_ISA=avx512 or fp32 the prompt product is fp32: far inside the
// bf16 bound (on the Xeon, 0.0001 of it), but not the path a bf16 expectation asks for (the test
// once set PKV_CPU_ISA=avx512bf16 itself, after the set had been decided, and failed there for
// that). A probe (one weight 1, x = 1 + 2^-10, which bf16 rounds to 1) sees which path ran, and
// must agree with the rule. The set is decided once per process, at its first use, so setting
// PKV_CPU_ISA inside the test comes too late: the test runs itself again (--backend), with
// PKV_CPU_ISA set for the path this run did not take where the CPU has it (avx512bf16 for bf16,
// avx512 for fp32), and with PKV_CPU_ISA unset when this run had it set (the suite sets fp32).
// So the default is checked too: it is the CPU's best set (cpu_isa.h), and takes the bf16 path
// exactly where the CPU has AVX512_BF16 and oneDNN a bf16 matmul. Each such run checks the backend
// alone; a plain run covers both paths and the default.
// Planted errors, through the same bounds, must be rejected: x's last element dropped, on the
// path that ran; on the fp32 path, x rounded to bf16 beforehand (what the bf16 path does) against
// the fp32 bound; on the bf16 path, its result against the fp32 bound.
#include "../model/backend.h"
#include "../model/bf16.h"
#include "../model/config.h"
#include "../model/cpu_isa.h"
#include "cpu_isa_rule.h"
#include "../model/dot_bf16.h"
#include "../model/gemm_dnnl.h"
#include "test_pariskv_util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PANEL 64 // as backend_cpu.c's

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

// The worst |y - ref| over the case as a fraction of its bound (bf16: x rounded, plus 2^-8 sum
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
            double bound = gamma_n(c->n) * mag + (bf16 && !against_rounded ? ldexp(mag_x, -8) : 0) + 1e-30;
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

// ---- the backend's prompt product ----

// The path backend_cpu.c's matmul takes in this process for several tokens on bf16 weights: 1 for
// oneDNN's bf16 matmul (the products' set avx512bf16 and oneDNN has that matmul), else 0 (fp32).
static int backend_takes_bf16(int T, int n, int d) {
    if (cpu_isa() != CPU_ISA_AVX512BF16) return 0;
    GemmDnnl *g = gemm_dnnl_create(GEMM_DNNL_BF16, T, n, d, PANEL);
    int ok = g != NULL;
    gemm_dnnl_destroy(g);
    return ok;
}

// What the backend's prompt product does to x, seen from outside: every weight row (1, 0, ..., 0),
// x_t = (1 + 2^-10, 0, ...), an fp32 that bf16 rounds to 1. 1: every y is 1 (x rounded); 0: every
// y is 1 + 2^-10 (x as it is); -1: anything else.
static int backend_rounds_x(void) {
    enum { T = 3, N = 64, D = 70 };
    static float x[T * N], y[T * D];
    static uint16_t w[D * N];
    for (int i = 0; i < D; i++) w[i * N] = f32_to_bf16(1.0f);
    for (int t = 0; t < T; t++) x[t * N] = 1.0f + 0x1p-10f;
    backend_cpu.matmul(y, x, w, DTYPE_BF16, T, N, D);
    int ones = 0, kept = 0;
    for (int i = 0; i < T * D; i++) ones += y[i] == 1.0f, kept += y[i] == 1.0f + 0x1p-10f;
    return ones == T * D ? 1 : kept == T * D ? 0 : -1;
}

// The backend's product on the case's x (or x changed: PLANT_*) into c->y.
enum { PLANT_NONE, PLANT_TAIL, PLANT_X_BF16 };
static void backend_product(Case *c, int plant) {
    float *x = malloc((size_t)c->T * c->n * sizeof(float));
    for (int i = 0; i < c->T * c->n; i++) {
        x[i] = plant == PLANT_X_BF16 ? bf16_to_f32(c->xb[i]) : c->x[i];
        if (plant == PLANT_TAIL && i % c->n == c->n - 1) x[i] = 0.0f;
    }
    for (int i = 0; i < c->T * c->d; i++) c->y[i] = NAN;
    backend_cpu.matmul(c->y, x, c->w, DTYPE_BF16, c->T, c->n, c->d);
    free(x);
}

// The verdict on a backend product on the given path, as a fraction of its bounds (the larger;
// > 1: rejected): fp32, gamma(n) sum |w x| against x; bf16, the bf16 bound against x and gamma(n)
// sum |w xr| against xr. -1 if an output was not written.
static double judge(const Case *c, int bf16) {
    double v = worst(c, bf16, 0), vr = bf16 ? worst(c, 1, 1) : 0;
    return v < 0 || vr < 0 ? -1 : fmax(v, vr);
}

// The backend's checks in this process, for the set it uses; returns the path (1 bf16, 0 fp32).
static int check_backend(void) {
    Rng r = {2930};
    Case c;
    make_case(&c, &r, 9, 576, 200);
    const char *set = cpu_isa_name(cpu_isa()), *env = getenv("PKV_CPU_ISA");
    int bf16 = backend_takes_bf16(c.T, c.n, c.d), probe = backend_rounds_x();
    const char *path = bf16 ? "oneDNN's bf16 matmul" : "fp32 (OpenBLAS's sgemm, or row by row without BLAS)";
    check(probe == bf16, "backend, products on %s (PKV_CPU_ISA=%s): a prompt product takes %s, so it %s x; the probe (x = 1 + 2^-10): %s",
          set, env && *env ? env : "unset", path, bf16 ? "rounds" : "keeps", probe == 1 ? "rounded" : probe == 0 ? "kept" : "neither");
    backend_product(&c, PLANT_NONE);
    double v = judge(&c, bf16);
    if (bf16)
        check(v >= 0 && v <= 1, "backend, %s: 9 tokens, n 576, d 200 within the bf16 bounds: against x (2^-8 sum |w x| + gamma(n) sum |w xr|) "
              "worst %.3g of it, against xr (gamma(n) sum |w xr|) %.3g", set, worst(&c, 1, 0), worst(&c, 1, 1));
    else
        check(v >= 0 && v <= 1, "backend, %s: 9 tokens, n 576, d 200 within the fp32 bound against x (gamma(n) sum |w x|): worst %.3g of it", set, v);
    // Planted: what the same verdict must reject.
    if (bf16) { // x rounded beforehand is what this path does: instead, the other path's bound must not pass it
        double wf = judge(&c, 0);
        check(wf > 1, "backend, %s: cross-check: this bf16 result judged by the fp32 path's bound: rejected (%.3g of it)", set, wf);
    } else {
        backend_product(&c, PLANT_X_BF16);
        double wf = judge(&c, 0);
        check(wf > 1, "backend, %s: planted: x rounded to bf16 beforehand (the bf16 path's x): rejected by the fp32 bound (%.3g of it)", set, wf);
    }
    backend_product(&c, PLANT_TAIL);
    double wt = judge(&c, bf16);
    check(wt > 1, "backend, %s: planted: x's last element dropped: rejected (%.3g of the %s bound%s)", set, wt, bf16 ? "bf16" : "fp32",
          bf16 ? "s, the larger" : "");
    free_case(&c);
    return bf16;
}

// This process's set against the rule, then its backend's checks; returns the path (1 bf16).
// Unset PKV_CPU_ISA (the default) must take the bf16 path exactly where this CPU has AVX512_BF16
// and oneDNN a bf16 matmul (dnnl_bf16).
static int check_set_backend(const char *who, int dnnl_bf16) {
    const char *env = getenv("PKV_CPU_ISA");
    int dflt = !env || !*env;
    check(cpu_isa() == cpu_isa_rule(env), "backend (%s): the products' set is %s, as PKV_CPU_ISA=%s gives (the rule: %s)", who,
          cpu_isa_name(cpu_isa()), dflt ? "(unset)" : env, cpu_isa_name(cpu_isa_rule(env)));
    int bf16 = check_backend();
    if (dflt) {
        int want = cpu_isa_best() == CPU_ISA_AVX512BF16 && dnnl_bf16;
        check(bf16 == want, "backend (%s): by default a prompt product %s x (this CPU's best set: %s; oneDNN's bf16 matmul: %s)", who,
              bf16 ? "rounds" : "keeps", cpu_isa_name(cpu_isa_best()), dnnl_bf16 ? "here" : "none");
    }
    return bf16;
}

// Whether oneDNN has a bf16 matmul for this CPU.
static int dnnl_has_bf16(void) {
    GemmDnnl *g = gemm_dnnl_create(GEMM_DNNL_BF16, 1, 64, 64, PANEL);
    int ok = g != NULL;
    gemm_dnnl_destroy(g);
    return ok;
}

// This test again, checking the backend alone with PKV_CPU_ISA=isa (NULL: unset; the set is
// chosen once per process); its lines print as it runs. Returns its exit status, -1 if it did not
// run or end.
static int run_backend_child(const char *isa) {
    extern char **environ;
    size_t n = 0, k = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 2, sizeof *env), var[64], arg0[] = "test_gemm_dnnl", arg1[] = "--backend";
    char *args[] = {arg0, arg1, NULL};
    if (!env) return -1;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "PKV_CPU_ISA=", 12) != 0) env[k++] = environ[i];
    if (isa) {
        snprintf(var, sizeof var, "PKV_CPU_ISA=%s", isa);
        env[k++] = var;
    }
    env[k] = NULL;
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        execve("/proc/self/exe", args, env);
        _exit(127);
    }
    free(env);
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--backend") == 0) { // the child: the backend with PKV_CPU_ISA as given
        const char *env = getenv("PKV_CPU_ISA");
        char who[80];
        snprintf(who, sizeof who, "a second run, PKV_CPU_ISA=%s", env ? env : "(unset)");
        check_set_backend(who, dnnl_has_bf16());
        return failed ? 1 : 0; // no closing line: the first run counts this one as one check
    }
    Rng r = {2929};
    int skipped = 0;
    GemmDnnl *probe = gemm_dnnl_create(GEMM_DNNL_F32, 1, 64, 64, PANEL);
    if (!probe) {
        printf("SKIP oneDNN is not built in (the Makefile found no oneapi/dnnl/dnnl.h: apt-get install libdnnl-dev)\n");
        printf("0 passed, 0 failed, 1 skipped\n");
        return 77;
    }
    gemm_dnnl_destroy(probe);
    printf("oneDNN dispatches to %s on this CPU; the products' set: %s (this CPU's best: %s)\n", gemm_dnnl_isa(), cpu_isa_name(cpu_isa()),
           cpu_isa_name(cpu_isa_best()));
    check(check_type(GEMM_DNNL_F32, &r), "fp32: oneDNN has an fp32 matmul here");
    int dnnl_bf16 = check_type(GEMM_DNNL_BF16, &r);
    if (!dnnl_bf16) {
        printf("SKIP bf16 matmul: oneDNN has none for this CPU (it needs AVX512_BF16 or AMX; this one's best: %s)\n", gemm_dnnl_isa());
        skipped++;
    }
    int bf16 = check_set_backend("this run", dnnl_bf16);
    // The other path, where this CPU has it: in a second run, with the set that takes it.
    const char *other = bf16 ? "avx512" : cpu_isa_supported(CPU_ISA_AVX512BF16) && dnnl_bf16 ? "avx512bf16" : NULL;
    if (other) {
        int st = run_backend_child(other);
        check(st == 0, "backend: the %s path, in a second run with PKV_CPU_ISA=%s: its checks above %s (exit %d)", bf16 ? "fp32" : "bf16", other,
              st == 0 ? "passed" : "did not all pass", st);
    } else {
        printf("SKIP the backend's bf16 prompt product: %s\n",
               cpu_isa_supported(CPU_ISA_AVX512BF16) ? "oneDNN has no bf16 matmul here" : "this CPU lacks AVX512_BF16");
        skipped++;
    }
    // The default, where this run had PKV_CPU_ISA set.
    const char *env = getenv("PKV_CPU_ISA");
    if (env && *env) {
        int st = run_backend_child(NULL);
        check(st == 0, "backend: the default (PKV_CPU_ISA unset), in a second run: its checks above %s (exit %d)", st == 0 ? "passed" : "did not all pass",
              st);
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
