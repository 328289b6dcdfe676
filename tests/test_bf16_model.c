// The tiny models end to end with their activations rounded to bf16, as the products' default
// set does on a CPU with AVX512_BF16 (model/cpu_isa.h), against the same models on fp32 products,
// within a bound derived from that rounding. What is compared: the teacher-forced NLL of each of
// the 149 next tokens of tests/data/<model>/ids.txt (as --score prints them), and their mean.
//
// What differs. The bf16 path multiplies the bf16 weights by xr = bf16(x) instead of x in every
// product on bf16 weights (q, k, v, o, gate, up, down, the LM head), a prompt's (oneDNN's bf16
// matmul) and a decode step's (vdpbf16ps) alike: xr_k = x_k (1 + d_k), |d_k| <= 2^-8 (to nearest
// even, 8 significant bits: model/dot_bf16.h). The rest is the same fp32 code, and the products'
// own sums differ from fp32's only at fp32's roundoff (u = 2^-24; tests/test_dot_bf16.c).
// How that reaches an NLL. To first order nll_i(bf16) - nll_i(fp32) = sum_k c_ik d_k, where
// c_ik = x_k d nll_i / d x_k and k runs over every rounded activation (each product's input, each
// token, each layer; one that feeds several products, the normed x into q, k and v, is one k: it
// is rounded once, the same way, for each). Rounding to nearest is unbiased, its errors bounded
// and, across activations, independent of one another and of c (the assumption
// tests/test_hf_reference.py makes for the weights' rounding): by Hoeffding
//   P(|sum_k c_ik d_k| > t) <= 2 exp(-t^2 / (2 sigma_i^2)),  sigma_i^2 = 2^-16 sum_k c_ik^2.
// sigma_i without derivatives: multiply every rounded activation by 1 + 2^-8 s_k instead, s_k =
// +-1 drawn by a fixed-seed hash of the activation's index and value (so an activation feeding
// several products gets one sign, as it gets one rounding). To first order the NLL moves by
// D_i = 2^-8 sum_k c_ik s_k, and E[D_i^2] = sigma_i^2 exactly (E[s_k s_l] = 1 if k = l, else 0):
// s_i^2, the mean of D_i^2 over M = 64 such runs, estimates it. D_i, a sum of thousands of terms,
// is near Gaussian (a Rademacher sum's tails are no heavier), so 64 s_i^2 / sigma_i^2 is close to
// chi-squared with 64 degrees of freedom: below 16 (s_i < sigma_i / 2) with probability ~1e-9.
// The bound, per position and for the mean (with its own D and s):
//   |nll_i(bf16) - nll_i(fp32)| <= 12 s_i + TOL,
// 12 s_i >= 6 sigma_i, where Hoeffding's tail is 2 e^-18 = 3e-8 a comparison. TOL = 1e-3 nats:
// the two runs also differ as two fp32 evaluations in different orders do, which
// tests/test_hf_reference.py's TINY_TOL bounds for these models. (The argument is first order;
// the sign runs measure the whole change, so where the curvature matters, at the sharpest
// positions, it shows in s_i as it does in the bf16 run.)
// Runs, each over a model's 150 ids (tiny-llama31: 3 layers, tied LM head; tiny-qwen3: QK-norm):
//   fp32      the reference: chunks of 64 tokens on an fp32 set (PKV_CPU_ISA=fp32 unless the caller
//             named one), as every run below but the last two.
//   signs     the M runs giving s_i.
//   emulated  x rounded by dot_bf16_round (the bf16 path's own rounding), then the fp32 products:
//             the bf16 path's arithmetic to within fp32's roundoff, on every CPU. Within the bound.
//   planted   what the bound must reject: x's last element dropped after the rounding (a partial
//             block's bug), and x kept to 4 significant bits (unit roundoff 2^-4, 16x bf16's).
//   bf16      the path itself, where the CPU has AVX512_BF16: a child forked before this process
//             picks its set runs with PKV_CPU_ISA=avx512bf16, in chunks of 64 (prompt products:
//             oneDNN's bf16 matmul where built, else sgemm on fp32) and one token at a time (decode
//             products: vdpbf16ps). Within the bound. Elsewhere it is named on a SKIP line and
//             counted as skipped, not passed.
#include "../model/backend.h"
#include "../model/bf16.h"
#include "../model/cpu_isa.h"
#include "../model/dot_bf16.h"
#include "../model/model.h"
#include "test_pariskv_util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_IDS 150
#define N_NLL N_IDS // 149 positions, then their mean
#define CHUNK 64
#define M 64        // sign runs
#define K_S 12.0    // the bound's multiple of s_i
#define TOL 1e-3    // fp32 evaluations in different orders (test_hf_reference.py's TINY_TOL)

static const char *const models[] = {"tiny-llama31", "tiny-qwen3"};
#define N_MODELS 2

// What the products on bf16 weights do to x before the fp32 products (matmul_x).
enum { X_AS_IS, X_SIGNS, X_BF16, X_BF16_TAIL, X_BITS4 };
static int x_mode;
static uint64_t x_seed;

static uint64_t mix(uint64_t z) { // splitmix64's finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// v to p significant bits, to nearest even.
static float round_bits(float v, int p) {
    if (v == 0.0f || !isfinite(v)) return v;
    int e;
    frexpf(v, &e); // |v| = f 2^e, 1/2 <= f < 1
    return ldexpf(rintf(ldexpf(v, p - e)), e - p);
}

// The CPU backend's product, x changed first as x_mode says where the weights are bf16.
static void matmul_x(float *y, const float *x, const void *w, uint32_t dtype, int T, int n, int d) {
    static float *xc;
    static uint16_t *xb;
    static size_t cap;
    size_t N = (size_t)T * n;
    if (dtype != DTYPE_BF16 || x_mode == X_AS_IS) {
        backend_cpu.matmul(y, x, w, dtype, T, n, d);
        return;
    }
    if (N > cap) {
        free(xc), free(xb);
        xc = malloc(N * sizeof *xc), xb = malloc(N * sizeof *xb), cap = N;
        if (!xc || !xb) printf("FAIL out of memory\n"), exit(1);
    }
    if (x_mode == X_BF16 || x_mode == X_BF16_TAIL) {
        dot_bf16_round(x, N, xb);
        for (size_t i = 0; i < N; i++) xc[i] = bf16_to_f32(xb[i]);
        if (x_mode == X_BF16_TAIL)
            for (int t = 0; t < T; t++) xc[(size_t)t * n + n - 1] = 0.0f;
    } else if (x_mode == X_BITS4) {
        for (size_t i = 0; i < N; i++) xc[i] = round_bits(x[i], 4);
    } else { // X_SIGNS
        for (size_t i = 0; i < N; i++) {
            uint32_t bits;
            memcpy(&bits, &x[i], 4);
            float s = mix(x_seed ^ mix((uint64_t)bits << 32 ^ i)) >> 63 ? 0x1p-8f : -0x1p-8f;
            xc[i] = x[i] * (1.0f + s);
        }
    }
    backend_cpu.matmul(y, xc, w, dtype, T, n, d);
}

// Teacher-forced NLLs of ids[1..N_IDS) into nll[0..149), their mean into nll[149], the tokens
// given `chunk` at a time (1: a decode step each). 0, or -1.
static int score(Model *m, const int *ids, int chunk, double *nll) {
    RunState s;
    char err[MODEL_ERR_LEN];
    if (run_state_init(&s, m, N_IDS, chunk, 1, err) != 0) return printf("FAIL run state: %s\n", err), -1;
    int V = (int)m->c.vocab_size, rc = 0;
    double sum = 0;
    for (int p = 0; p < N_IDS - 1; p += chunk) {
        int T = chunk < N_IDS - 1 - p ? chunk : N_IDS - 1 - p;
        const float *l = model_forward(m, &s, ids + p, T, p, 1, err);
        if (!l) {
            printf("FAIL forward: %s\n", err);
            rc = -1;
            break;
        }
        for (int t = 0; t < T; t++, l += V) {
            float mx = l[0];
            for (int j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
            double e = 0;
            for (int j = 0; j < V; j++) e += exp((double)l[j] - mx);
            nll[p + t] = log(e) + mx - l[ids[p + t + 1]];
            sum += nll[p + t];
        }
    }
    nll[N_NLL - 1] = sum / (N_IDS - 1);
    run_state_free(&s);
    return rc;
}

// The worst |got - ref| over the positions and the mean as a fraction of K_S s + TOL; where it
// is, in *at (N_NLL - 1: the mean).
static double worst(const double *got, const double *ref, const double *s, int *at) {
    double w = 0;
    *at = -1;
    for (int i = 0; i < N_NLL; i++) {
        double f = fabs(got[i] - ref[i]) / (K_S * s[i] + TOL);
        if (!(f <= w)) w = f, *at = i; // NaN counts as worst
    }
    return w;
}

static const char *where(int at) {
    static char b[32];
    if (at == N_NLL - 1) return "mean_nll";
    snprintf(b, sizeof b, "position %d", at);
    return b;
}

static void judge(const char *name, const char *what, const double *got, const double *ref, const double *s, int must_pass) {
    int at;
    double w = worst(got, ref, s, &at);
    if (must_pass)
        check(w <= 1, "%s, %s: within 12 s + 1e-3 at every position and the mean: worst %.3g of it (%s, |d| %.2e)", name, what, w, where(at),
              at >= 0 ? fabs(got[at] - ref[at]) : NAN);
    else
        check(w > 1, "%s, planted: %s: rejected (%.3g of the bound at %s, |d| %.2e)", name, what, w, where(at), at >= 0 ? fabs(got[at] - ref[at]) : NAN);
}

static int read_ids(const char *model, int *ids) {
    char path[256];
    snprintf(path, sizeof path, "tests/data/%s/ids.txt", model);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && n < N_IDS && fscanf(f, "%d", &ids[n]) == 1) n++;
    if (f) fclose(f);
    return n == N_IDS ? 0 : -1;
}

int main(void) {
    char dir[] = "/tmp/pkvbf16XXXXXX", path[N_MODELS][64], cmd[512], err[MODEL_ERR_LEN];
    if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
    const char *bin = getenv("PKV_BIN");
    Model m[N_MODELS];
    int ids[N_MODELS][N_IDS];
    for (int k = 0; k < N_MODELS; k++) {
        snprintf(path[k], sizeof path[k], "%s/%s.bin", dir, models[k]);
        snprintf(cmd, sizeof cmd, "%s/export tests/data/%s %s > /dev/null 2>&1", bin ? bin : ".", models[k], path[k]);
        if (system(cmd) != 0 || model_load(&m[k], path[k], err) != 0 || read_ids(models[k], ids[k]) != 0) {
            printf("FAIL cannot export and load tests/data/%s, or read its ids.txt (is ./export built?)\n0 passed, 1 failed\n", models[k]);
            return 1;
        }
    }
    // The bf16 path first, in a child forked before anything here runs a product or a thread; its
    // NLLs come back through shared memory: [model][chunked, decode][N_NLL], then its status.
    int bf16 = cpu_isa_best() == CPU_ISA_AVX512BF16, skipped = 0;
    size_t shared_bytes = (size_t)N_MODELS * 2 * N_NLL * sizeof(double) + sizeof(int);
    double *real = mmap(NULL, shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (real == MAP_FAILED) return perror("mmap"), 1;
    int *real_ok = (int *)(real + N_MODELS * 2 * N_NLL);
    if (bf16) {
        fflush(stdout), fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            setenv("PKV_CPU_ISA", "avx512bf16", 1);
            int ok = cpu_isa() == CPU_ISA_AVX512BF16;
            for (int k = 0; k < N_MODELS && ok; k++)
                ok = score(&m[k], ids[k], CHUNK, real + (k * 2 + 0) * N_NLL) == 0 && score(&m[k], ids[k], 1, real + (k * 2 + 1) * N_NLL) == 0;
            *real_ok = ok;
            fflush(stdout);
            _exit(0);
        }
        int st;
        check(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0 && *real_ok,
              "the bf16 path (PKV_CPU_ISA=avx512bf16, a child): ran both models, in chunks and token by token");
    } else {
        printf("SKIP the bf16 path itself (vcvtne2ps2bf16, vdpbf16ps, oneDNN's bf16 matmul): this CPU lacks AVX512_BF16 (its best: %s); "
               "its rounding, emulated, runs below\n", cpu_isa_name(cpu_isa_best()));
        skipped++;
    }
    // This process: fp32 products, unless the caller named a set that keeps x.
    const char *env = getenv("PKV_CPU_ISA");
    int named = env ? cpu_isa_parse(env) : -1;
    if (named < 0 || named == CPU_ISA_AVX512BF16) setenv("PKV_CPU_ISA", "fp32", 1);
    check(cpu_isa() < CPU_ISA_AVX512BF16, "the reference's products keep x as it is (set %s)", cpu_isa_name(cpu_isa()));

    static double ref[N_NLL], got[N_NLL], s[N_NLL];
    static Backend be_x;
    be_x = backend_cpu, be_x.matmul = matmul_x;
    for (int k = 0; k < N_MODELS; k++) {
        const char *name = models[k];
        m[k].be = &be_x;
        x_mode = X_AS_IS;
        if (score(&m[k], ids[k], CHUNK, ref) != 0) continue;
        memset(s, 0, sizeof s);
        int ok = 1;
        x_mode = X_SIGNS;
        for (int r = 0; r < M && ok; r++) {
            x_seed = mix(0x5eedull + (uint64_t)k * M + (uint64_t)r);
            ok = score(&m[k], ids[k], CHUNK, got) == 0;
            for (int i = 0; i < N_NLL; i++) s[i] += (got[i] - ref[i]) * (got[i] - ref[i]) / M;
        }
        double lo = INFINITY, hi = 0;
        for (int i = 0; i < N_NLL; i++) s[i] = sqrt(s[i]);
        for (int i = 0; i < N_NLL - 1; i++) lo = fmin(lo, s[i]), hi = fmax(hi, s[i]);
        check(ok && lo > 0 && isfinite(hi) && s[N_NLL - 1] > 0, "%s: %d runs with every rounded activation scaled by 1 +- 2^-8: s from %.2e to %.2e nats a position, "
              "%.2e for mean_nll (reference mean_nll %.4f)", name, M, lo, hi, s[N_NLL - 1], ref[N_NLL - 1]);
        if (!ok) continue;
        x_mode = X_BF16;
        if (score(&m[k], ids[k], CHUNK, got) == 0) judge(name, "x rounded to bf16 (emulated), fp32 products", got, ref, s, 1);
        x_mode = X_BF16_TAIL;
        if (score(&m[k], ids[k], CHUNK, got) == 0) judge(name, "x rounded to bf16, its last element dropped", got, ref, s, 0);
        x_mode = X_BITS4;
        if (score(&m[k], ids[k], CHUNK, got) == 0) judge(name, "x kept to 4 significant bits", got, ref, s, 0);
        if (bf16 && *real_ok) {
            judge(name, "the bf16 path, chunks of 64 (prompt products)", real + (k * 2 + 0) * N_NLL, ref, s, 1);
            judge(name, "the bf16 path, token by token (decode products)", real + (k * 2 + 1) * N_NLL, ref, s, 1);
        }
        m[k].be = &backend_cpu;
    }
    for (int k = 0; k < N_MODELS; k++) model_free(&m[k]), unlink(path[k]);
    rmdir(dir);
    munmap(real, shared_bytes);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
