// Each CUDA kernel against the CPU reference on fresh random inputs (outputs poisoned first),
// then timed with CUDA events after warm-up (median of many runs), variants side by side.
// Build and run: make test-gpu (needs a GPU).
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_common.h"
#include "kernels.h"
#include "variants.h"
extern "C" {
#include "../attention/attention.h"
#include "../model/backend.h"
#include "../model/bf16.h"
#include "../model/config.h"
#include "../model/pool.h"
}
#include "variants.h"

static int passed, failed;
static unsigned long long rng = 88172645463325252ull;

static float frand(void) { // uniform [-1, 1)
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

// Random values that bf16 represents exactly, so host and device see the same numbers.
static void rand_bf16(std::vector<float> &f, std::vector<uint16_t> &b, size_t n, float scale) {
    f.resize(n), b.resize(n);
    for (size_t i = 0; i < n; i++) {
        b[i] = f32_to_bf16(scale * frand());
        f[i] = bf16_to_f32(b[i]);
    }
}

template <typename T> static T *to_dev(const std::vector<T> &h) {
    T *d;
    CU_CHECK(cudaMalloc(&d, h.size() * sizeof(T) + 16));
    CU_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

// Tolerances (on rel_err: max |got - want| / max |want|), each from the arithmetic. u32 = 2^-24,
// ub = 2^-8 (bf16 keeps 8 significant bits: rounding to nearest errs by at most ub/2 = 2^-9).
// The inputs are bf16-representable, so host and device start from the same numbers.
//  TOL_ACC  1e-4: an fp32 result of the same bf16 inputs, only the summation order differs. Each
//           of n <= 14336 products errs by u32 per addition it passes through; the sums are of
//           random-sign terms, so the error grows as lambda sqrt(n) u32 sum|w x| (Higham & Mary,
//           SIAM J. Sci. Comput. 2019; lambda = 6: exceeded with probability < 1e-7 per output),
//           and sum|w x| / max|y| <= ~1 for these shapes: 6 * 120 * 6e-8 = 4.3e-5 < 1e-4.
//  TOL_EMB  1e-5: a copy, the bf16 of a bf16 row (exact), and a sum of dim <= 8192 positive
//           squares: per-thread runs of dim / 256 additions and a tree of log2(256) levels,
//           (32 + 8) u32 = 2.4e-6 relative.
//  TOL_BF16 1e-2: one bf16 rounding of the output (ub/2 = 2e-3 of max|want| at most), plus one
//           bf16 rounding of a vector inside (x for the next GEMV, q or k after RoPE): relative
//           errors up to ub/2 of random sign, summed over n terms like the above, 4 sigma over
//           thousands of outputs: 4 ub/2 / sqrt(3) = 4.5e-3; 2e-3 + 4.5e-3 + the fp32 part < 1e-2.
//  TOL_ATTN 2e-2: attention reads bf16 q (rounded after QK-norm and RoPE) and bf16 K/V: scores
//           err by ub/2 x |q||k| / sqrt(hd) <= ~3e-3 absolute here (|q||k|/sqrt(hd) <= ~1.5),
//           which moves softmax weights by that relative; the output, a weighted mean of bf16
//           V rows, adds its own bf16 rounding (2e-3): 3e-3 + 2e-3 + 4 sigma of the random
//           parts < 2e-2.
static const double TOL_ACC = 1e-4, TOL_EMB = 1e-5, TOL_BF16 = 1e-2, TOL_ATTN = 2e-2;

// max |a - b| / max |b|: the error relative to the output's scale.
static double rel_err(const float *a, const float *b, size_t n) {
    double e = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        e = fmax(e, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return e / m;
}

static void check(const char *what, double err, double tol) {
    int ok = err <= tol;
    printf("%s %-58s err %.2e (tol %.0e)\n", ok ? "ok  " : "FAIL", what, err, tol);
    ok ? passed++ : failed++;
}

static std::vector<float> bf16_dev_to_f32(const bf16 *d, size_t n) {
    std::vector<uint16_t> h(n);
    CU_CHECK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(h[i]);
    return f;
}

typedef void (*Launch)(void *);
static float time_ms(void (*fn)(void *), void *arg, int reps) {
    cudaEvent_t a, b;
    CU_CHECK(cudaEventCreate(&a));
    CU_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 10; i++) fn(arg);
    std::vector<float> t(reps);
    for (int i = 0; i < reps; i++) {
        CU_CHECK(cudaEventRecord(a));
        fn(arg);
        CU_CHECK(cudaEventRecord(b));
        CU_CHECK(cudaEventSynchronize(b));
        CU_CHECK(cudaEventElapsedTime(&t[i], a, b));
    }
    std::sort(t.begin(), t.end());
    cudaEventDestroy(a), cudaEventDestroy(b);
    return t[reps / 2];
}

// ---- GEMV ----

typedef cudaError_t (*GemvFn)(void *, const bf16 *, const bf16 *, int, int, int, cudaStream_t);
static const struct {
    const char *name;
    GemvFn fn;
} gemv_variants[] = {{"staged", gemv_bf16_staged}, {"rowwarp", gemv_bf16_rowwarp}, {"rowwarp2", gemv_bf16_rowwarp2}};
#define N_GEMV_VARIANTS 3

struct GemvArgs {
    void *y;
    const bf16 *W, *x;
    int n, d, epi;
    cublasHandle_t blas;
    float *yf;
    GemvFn fn;
};
static void run_gemv(void *p) {
    GemvArgs *a = (GemvArgs *)p;
    CU_CHECK(a->fn(a->y, a->W, a->x, a->n, a->d, a->epi, 0));
}
static void run_cublas_gemv(void *p) {
    GemvArgs *a = (GemvArgs *)p;
    float one = 1, zero = 0;
    cublasGemmEx(a->blas, CUBLAS_OP_T, CUBLAS_OP_N, a->d, 1, a->n, &one, a->W, CUDA_R_16BF, a->n, a->x, CUDA_R_16BF, a->n,
                 &zero, a->yf, CUDA_R_32F, a->d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static void test_gemv_one(GemvFn fn, const char *vname, int n, int d, int epi) {
    std::vector<float> wf, xf;
    std::vector<uint16_t> wb, xb;
    rand_bf16(wf, wb, (size_t)d * n, 0.05f);
    rand_bf16(xf, xb, n, 1.0f);
    std::vector<float> ref(d), y0(d);
    backend_cpu.matmul(ref.data(), xf.data(), wb.data(), DTYPE_BF16, 1, n, d);
    for (int i = 0; i < d; i++) y0[i] = frand();
    bf16 *W = (bf16 *)to_dev(wb), *x = (bf16 *)to_dev(xb);
    float *y = to_dev(y0);
    int out_n = epi == GEMV_SWIGLU ? d / 2 : d;
    std::vector<float> got(out_n), want(out_n);
    if (epi == GEMV_SWIGLU) {
        bf16 *h;
        CU_CHECK(cudaMalloc(&h, out_n * 2));
        CU_CHECK(cudaMemset(h, 0xff, out_n * 2)); // NaN poison
        CU_CHECK(fn(h, W, x, n, d, epi, 0));
        CU_CHECK(cudaDeviceSynchronize());
        got = bf16_dev_to_f32(h, out_n);
        for (int i = 0; i < out_n; i++) {
            float g = ref[2 * i], u = ref[2 * i + 1];
            want[i] = g / (1.0f + expf(-g)) * u;
        }
        cudaFree(h);
    } else {
        if (epi == GEMV_STORE) CU_CHECK(cudaMemset(y, 0xff, d * 4));
        CU_CHECK(fn(y, W, x, n, d, epi, 0));
        CU_CHECK(cudaMemcpy(got.data(), y, d * 4, cudaMemcpyDeviceToHost));
        for (int i = 0; i < d; i++) want[i] = ref[i] + (epi == GEMV_ADD ? y0[i] : 0.0f);
    }
    char what[128];
    snprintf(what, sizeof what, "gemv %s %s n=%d d=%d", vname, epi == GEMV_STORE ? "store" : epi == GEMV_ADD ? "add" : "swiglu", n, d);
    check(what, rel_err(got.data(), want.data(), out_n), epi == GEMV_SWIGLU ? TOL_BF16 : TOL_ACC);
    cudaFree(W), cudaFree(x), cudaFree(y);
}

// The RMSNorm split across two GEMVs: the producer adds W1·h to the residual and writes bf16 of
// the result and per-block sums of squares; the consumer, whose columns carry the norm weights
// (scale_columns), computes W2 · rmsnorm(y). Against model.c's matmul + rmsnorm + matmul.
static void test_norm_link(int n1, int dim, int d2, int epi) {
    std::vector<float> w1f, hf, w2f, y0(dim), nw(dim);
    std::vector<uint16_t> w1b, hb, w2b;
    rand_bf16(w1f, w1b, (size_t)dim * n1, 0.05f);
    rand_bf16(hf, hb, n1, 1.0f);
    rand_bf16(w2f, w2b, (size_t)d2 * dim, 0.05f);
    for (int i = 0; i < dim; i++) y0[i] = 2.0f * frand(), nw[i] = 1.0f + 0.5f * frand();
    std::vector<float> y(dim), yn(dim), ref(d2);
    backend_cpu.matmul(y.data(), hf.data(), w1b.data(), DTYPE_BF16, 1, n1, dim);
    for (int i = 0; i < dim; i++) y[i] += y0[i];
    backend_cpu.rmsnorm(yn.data(), y.data(), nw.data(), 1, dim, 1e-6f);
    backend_cpu.matmul(ref.data(), yn.data(), w2b.data(), DTYPE_BF16, 1, dim, d2);
    int out_n = epi == GEMV_SWIGLU ? d2 / 2 : d2;
    std::vector<float> want(out_n);
    for (int i = 0; i < out_n; i++) {
        float g = ref[2 * i], u = ref[2 * i + 1];
        want[i] = epi == GEMV_SWIGLU ? g / (1.0f + expf(-g)) * u : ref[i];
    }
    bf16 *W1 = (bf16 *)to_dev(w1b), *h = (bf16 *)to_dev(hb), *W2 = (bf16 *)to_dev(w2b), *yb;
    float *dy = to_dev(y0), *dnw = to_dev(nw), *sums;
    void *out;
    int n_sums = gemv_sumsq_count(dim);
    CU_CHECK(cudaMalloc(&yb, dim * 2));
    CU_CHECK(cudaMalloc(&sums, n_sums * 4));
    CU_CHECK(cudaMalloc(&out, d2 * 4));
    CU_CHECK(cudaMemset(out, 0xff, d2 * 4));
    CU_CHECK(scale_columns(W2, d2, dim, dnw, 0));
    CU_CHECK(gemv_bf16_add_stats(dy, W1, h, n1, dim, yb, sums, 0));
    CU_CHECK(gemv_bf16_normed(out, W2, yb, dim, d2, epi, sums, n_sums, 1e-6f, 0));
    CU_CHECK(cudaDeviceSynchronize());
    std::vector<float> gy(dim), got;
    CU_CHECK(cudaMemcpy(gy.data(), dy, dim * 4, cudaMemcpyDeviceToHost));
    if (epi == GEMV_SWIGLU) got = bf16_dev_to_f32((bf16 *)out, out_n);
    else {
        got.resize(out_n);
        CU_CHECK(cudaMemcpy(got.data(), out, out_n * 4, cudaMemcpyDeviceToHost));
    }
    char what[128];
    snprintf(what, sizeof what, "gemv add+stats n=%d d=%d: residual", n1, dim);
    check(what, rel_err(gy.data(), y.data(), dim), TOL_ACC);
    snprintf(what, sizeof what, "  then normed %s n=%d d=%d (bf16 input)", epi == GEMV_SWIGLU ? "swiglu" : "store", dim, d2);
    check(what, rel_err(got.data(), want.data(), out_n), TOL_BF16);
    cudaFree(W1), cudaFree(h), cudaFree(W2), cudaFree(yb), cudaFree(dy), cudaFree(dnw), cudaFree(sums), cudaFree(out);
}

static void test_embed_stats(int vocab, int dim) {
    std::vector<float> ef, row(dim);
    std::vector<uint16_t> eb;
    rand_bf16(ef, eb, (size_t)vocab * dim, 1.0f);
    int tok = vocab - 2;
    double ss = 0;
    for (int i = 0; i < dim; i++) row[i] = ef[(size_t)tok * dim + i], ss += (double)row[i] * row[i];
    std::vector<int> ht = {tok};
    int *dt = to_dev(ht);
    bf16 *E = (bf16 *)to_dev(eb), *xb;
    float *x, *sum;
    CU_CHECK(cudaMalloc(&x, dim * 4));
    CU_CHECK(cudaMalloc(&xb, dim * 2));
    CU_CHECK(cudaMalloc(&sum, 4));
    CU_CHECK(embed_stats(x, xb, sum, E, dt, dim, NULL, 0));
    std::vector<float> gx(dim);
    float gs;
    CU_CHECK(cudaMemcpy(gx.data(), x, dim * 4, cudaMemcpyDeviceToHost));
    CU_CHECK(cudaMemcpy(&gs, sum, 4, cudaMemcpyDeviceToHost));
    auto gb = bf16_dev_to_f32(xb, dim);
    char what[96];
    snprintf(what, sizeof what, "embed+stats vocab=%d dim=%d", vocab, dim);
    check(what, std::max({rel_err(gx.data(), row.data(), dim), rel_err(gb.data(), row.data(), dim), fabs(gs - ss) / ss}), TOL_EMB);
    cudaFree(dt), cudaFree(E), cudaFree(xb), cudaFree(x), cudaFree(sum);
}

static void test_gemv(int n, int d, int epi) {
    for (int v = 0; v < N_GEMV_VARIANTS; v++) test_gemv_one(gemv_variants[v].fn, gemv_variants[v].name, n, d, epi);
}

static void bench_gemv(cublasHandle_t blas, double bw) {
    int shapes[][2] = {{4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096}, {4096, 24576}, {12288, 4096},
                       {4096, 128256}, {4096, 151936}, {576, 960}, {1536, 576}};
    printf("\n%-22s | %9s %6s | %9s %6s | %9s %6s | %9s %6s | %s\n", "GEMV bf16 (n -> d)", "staged us", "TB/s", "rowwarp", "TB/s",
           "rowwarp2", "TB/s", "cuBLAS us", "TB/s", "floor us");
    for (auto &s : shapes) {
        int n = s[0], d = s[1];
        size_t bytes = (size_t)n * d * 2;
        // Rotate among weight copies so the 50 MB L2 does not hold the matrix between runs.
        int copies = (int)std::max<size_t>(1, (size_t)(200u << 20) / bytes + 1);
        std::vector<bf16 *> Ws(copies);
        for (auto &w : Ws) {
            CU_CHECK(cudaMalloc(&w, bytes));
            CU_CHECK(fill_random_bf16(w, (size_t)n * d, 3, 0.05f, 0, 0));
        }
        bf16 *x;
        float *y;
        CU_CHECK(cudaMalloc(&x, n * 2));
        CU_CHECK(cudaMalloc(&y, d * 4));
        CU_CHECK(fill_random_bf16(x, n, 4, 1.0f, 0, 0));
        struct Rot {
            GemvArgs a;
            std::vector<bf16 *> *Ws;
            int i;
        } r = {{y, NULL, x, n, d, GEMV_STORE, blas, y, NULL}, &Ws, 0};
        auto ours = [](void *p) {
            Rot *r = (Rot *)p;
            r->a.W = (*r->Ws)[r->i++ % r->Ws->size()];
            run_gemv(&r->a);
        };
        auto theirs = [](void *p) {
            Rot *r = (Rot *)p;
            r->a.W = (*r->Ws)[r->i++ % r->Ws->size()];
            run_cublas_gemv(&r->a);
        };
        float tv[N_GEMV_VARIANTS];
        for (int v = 0; v < N_GEMV_VARIANTS; v++) {
            r.a.fn = gemv_variants[v].fn;
            tv[v] = time_ms(ours, &r, 200);
        }
        float t2 = time_ms(theirs, &r, 200);
        printf("%8d -> %-10d |", n, d);
        for (int v = 0; v < N_GEMV_VARIANTS; v++) printf(" %9.1f %6.2f |", tv[v] * 1e3, bytes / (tv[v] * 1e-3) / 1e12);
        printf(" %9.1f %6.2f | %.1f\n", t2 * 1e3, bytes / (t2 * 1e-3) / 1e12, bytes / bw * 1e6);
        for (auto w : Ws) cudaFree(w);
        cudaFree(x), cudaFree(y);
    }
}

// ---- norms, RoPE, QKV ----

static void test_rmsnorm(int T, int n) {
    std::vector<float> x(T * n), w(n), ref(T * n);
    for (auto &v : x) v = 3.0f * frand();
    for (auto &v : w) v = 1.0f + 0.5f * frand();
    backend_cpu.rmsnorm(ref.data(), x.data(), w.data(), T, n, 1e-6f);
    float *dx = to_dev(x), *dw = to_dev(w);
    bf16 *out;
    CU_CHECK(cudaMalloc(&out, T * n * 2));
    CU_CHECK(cudaMemset(out, 0xff, T * n * 2));
    CU_CHECK(rmsnorm_bf16(out, dx, dw, T, n, 1e-6f, 0));
    auto got = bf16_dev_to_f32(out, T * n);
    char what[96];
    snprintf(what, sizeof what, "rmsnorm T=%d n=%d", T, n);
    check(what, rel_err(got.data(), ref.data(), T * n), TOL_BF16);
    cudaFree(dx), cudaFree(dw), cudaFree(out);
}

// The prefill's SwiGLU over the gate/up GEMM's interleaved bf16 (gate, up) pairs, against silu(g) u
// of the same bf16 values in double: one bf16 rounding of the output (TOL_BF16).
static void test_swiglu(int T, int hidden) {
    size_t n = (size_t)T * hidden;
    std::vector<float> gu, ref(n);
    std::vector<uint16_t> gub;
    rand_bf16(gu, gub, 2 * n, 6.0f);
    for (size_t i = 0; i < n; i++) {
        double g = gu[2 * i], u = gu[2 * i + 1];
        ref[i] = (float)(g / (1.0 + exp(-g)) * u);
    }
    bf16 *dgu = (bf16 *)to_dev(gub);
    bf16 *h;
    CU_CHECK(cudaMalloc(&h, n * 2));
    CU_CHECK(cudaMemset(h, 0xff, n * 2));
    CU_CHECK(swiglu_pairs(h, dgu, T, hidden, 0));
    auto got = bf16_dev_to_f32(h, n);
    char what[96];
    snprintf(what, sizeof what, "swiglu T=%d hidden=%d", T, hidden);
    check(what, rel_err(got.data(), ref.data(), n), TOL_BF16);
    cudaFree(dgu), cudaFree(h);
}

static void test_qkv(int T, int pos, int nh, int nkv, int hd, int qk_norm) {
    int ctx = pos + T + 3, row = (nh + 2 * nkv) * hd;
    std::vector<float> qkv(T * row), qn(hd), kn(hd), inv(hd / 2);
    for (auto &v : qkv) v = 2.0f * frand();
    for (int i = 0; i < hd; i++) qn[i] = 1 + 0.3f * frand(), kn[i] = 1 + 0.3f * frand();
    for (int i = 0; i < hd / 2; i++) inv[i] = powf(1e6f, -2.0f * i / hd);
    // CPU: split, norm, rope exactly as model.c does
    std::vector<float> q(T * nh * hd), k(T * nkv * hd), v(T * nkv * hd);
    for (int t = 0; t < T; t++) {
        memcpy(&q[t * nh * hd], &qkv[t * row], nh * hd * 4);
        memcpy(&k[t * nkv * hd], &qkv[t * row + nh * hd], nkv * hd * 4);
        memcpy(&v[t * nkv * hd], &qkv[t * row + (nh + nkv) * hd], nkv * hd * 4);
    }
    if (qk_norm) {
        backend_cpu.rmsnorm(q.data(), q.data(), qn.data(), T * nh, hd, 1e-6f);
        backend_cpu.rmsnorm(k.data(), k.data(), kn.data(), T * nkv, hd, 1e-6f);
    }
    backend_cpu.rope(q.data(), inv.data(), pos, T, nh, hd);
    backend_cpu.rope(k.data(), inv.data(), pos, T, nkv, hd);
    float *dqkv = to_dev(qkv), *dqn = to_dev(qn), *dkn = to_dev(kn), *dinv = to_dev(inv);
    std::vector<int> hp = {pos};
    int *dpos = to_dev(hp);
    bf16 *dq, *kc, *vc;
    CU_CHECK(cudaMalloc(&dq, T * nh * hd * 2));
    CU_CHECK(cudaMalloc(&kc, (size_t)nkv * ctx * hd * 2));
    CU_CHECK(cudaMalloc(&vc, (size_t)nkv * ctx * hd * 2));
    CU_CHECK(cudaMemset(dq, 0xff, T * nh * hd * 2));
    CU_CHECK(cudaMemset(kc, 0xff, (size_t)nkv * ctx * hd * 2));
    CU_CHECK(cudaMemset(vc, 0xff, (size_t)nkv * ctx * hd * 2));
    CU_CHECK(qkv_rope_store(dq, kc, vc, dqkv, qk_norm ? dqn : NULL, qk_norm ? dkn : NULL, dinv, dpos, T, nh, nkv, hd, ctx,
                            1e-6f, 0));
    auto gq = bf16_dev_to_f32(dq, T * nh * hd), gk = bf16_dev_to_f32(kc, (size_t)nkv * ctx * hd),
         gv = bf16_dev_to_f32(vc, (size_t)nkv * ctx * hd);
    std::vector<float> gk2(T * nkv * hd), gv2(T * nkv * hd);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nkv; h++)
            for (int j = 0; j < hd; j++) {
                gk2[(t * nkv + h) * hd + j] = gk[((size_t)h * ctx + pos + t) * hd + j];
                gv2[(t * nkv + h) * hd + j] = gv[((size_t)h * ctx + pos + t) * hd + j];
            }
    char what[128];
    snprintf(what, sizeof what, "qkv+rope T=%d pos=%d heads %d/%d hd=%d qknorm=%d: q", T, pos, nh, nkv, hd, qk_norm);
    check(what, rel_err(gq.data(), q.data(), q.size()), TOL_BF16);
    snprintf(what, sizeof what, "qkv+rope T=%d pos=%d heads %d/%d hd=%d qknorm=%d: k", T, pos, nh, nkv, hd, qk_norm);
    check(what, rel_err(gk2.data(), k.data(), k.size()), TOL_BF16);
    snprintf(what, sizeof what, "qkv+rope T=%d pos=%d: v stored", T, pos);
    check(what, rel_err(gv2.data(), v.data(), v.size()), TOL_BF16);
    cudaFree(dqkv), cudaFree(dqn), cudaFree(dkn), cudaFree(dinv), cudaFree(dpos), cudaFree(dq), cudaFree(kc), cudaFree(vc);
}

// ---- attention ----

struct AttnData {
    int nh, nkv, hd, ctx, n; // n keys filled
    std::vector<float> kf, vf; // CPU layout (ctx, nkv*hd)
    bf16 *kc, *vc;             // GPU layout (nkv, ctx, hd)
};

static void make_attn(AttnData &a, int nh, int nkv, int hd, int ctx, int n) {
    a.nh = nh, a.nkv = nkv, a.hd = hd, a.ctx = ctx, a.n = n;
    a.kf.assign((size_t)ctx * nkv * hd, 0), a.vf.assign((size_t)ctx * nkv * hd, 0);
    std::vector<uint16_t> kb((size_t)nkv * ctx * hd), vb((size_t)nkv * ctx * hd);
    for (int p = 0; p < n; p++)
        for (int h = 0; h < nkv; h++)
            for (int j = 0; j < hd; j++) {
                uint16_t k = f32_to_bf16(2.0f * frand()), v = f32_to_bf16(frand());
                kb[((size_t)h * ctx + p) * hd + j] = k, vb[((size_t)h * ctx + p) * hd + j] = v;
                a.kf[((size_t)p * nkv + h) * hd + j] = bf16_to_f32(k), a.vf[((size_t)p * nkv + h) * hd + j] = bf16_to_f32(v);
            }
    a.kc = (bf16 *)to_dev(kb), a.vc = (bf16 *)to_dev(vb);
}

// The fused decode attention: from the QKV projection's output at position pos (cache rows
// < pos filled) to the attention output, against model.c's steps on the CPU (QK-norm, RoPE, the
// new row rounded to bf16 as the cache holds it, dense attention with an fp32 query).
// needle >= 0: that cached key is set along its group's queries so that it takes nearly all the
// weight (scores ~20 above the rest): a key the kernel drops or misplaces then moves the output
// by its whole size, where among random keys one key is below the tolerance. The needles sit on
// the first and last keys of tiles and splits.
static void test_attn_decode(int nh, int nkv, int hd, int ctx, int pos, int qk_norm, int variant, int needle = -1) {
    AttnData a;
    make_attn(a, nh, nkv, hd, ctx, pos);
    int row = (nh + 2 * nkv) * hd;
    std::vector<float> qkv(row), qn(hd), kn(hd), inv(hd / 2);
    for (auto &v : qkv) v = 2.0f * frand();
    for (int i = 0; i < hd; i++) qn[i] = 1 + 0.3f * frand(), kn[i] = 1 + 0.3f * frand();
    for (int i = 0; i < hd / 2; i++) inv[i] = powf(5e5f, -2.0f * i / hd);
    std::vector<float> q(qkv.begin(), qkv.begin() + nh * hd), k(qkv.begin() + nh * hd, qkv.begin() + (nh + nkv) * hd),
        v(qkv.begin() + (nh + nkv) * hd, qkv.end());
    if (qk_norm) {
        backend_cpu.rmsnorm(q.data(), q.data(), qn.data(), nh, hd, 1e-6f);
        backend_cpu.rmsnorm(k.data(), k.data(), kn.data(), nkv, hd, 1e-6f);
    }
    backend_cpu.rope(q.data(), inv.data(), pos, 1, nh, hd);
    backend_cpu.rope(k.data(), inv.data(), pos, 1, nkv, hd);
    if (needle >= 0) {
        int G = nh / nkv;
        for (int h = 0; h < nkv; h++) {
            std::vector<double> u(hd, 0.0);
            for (int g = 0; g < G; g++)
                for (int j = 0; j < hd; j++) u[j] += q[(size_t)(h * G + g) * hd + j];
            double nu = 0, least = 1e30;
            for (int j = 0; j < hd; j++) nu += u[j] * u[j];
            nu = sqrt(nu);
            for (int g = 0; g < G; g++) {
                double d = 0;
                for (int j = 0; j < hd; j++) d += q[(size_t)(h * G + g) * hd + j] * u[j] / nu;
                least = fmin(least, d);
            }
            double c = least > 0 ? fmin(20.0 * sqrt((double)hd) / least, 1e3) : 1e3; // the smallest score ~20
            std::vector<uint16_t> kb(hd);
            for (int j = 0; j < hd; j++) {
                kb[j] = f32_to_bf16((float)(c * u[j] / nu));
                a.kf[((size_t)needle * nkv + h) * hd + j] = bf16_to_f32(kb[j]);
            }
            CU_CHECK(cudaMemcpy(a.kc + ((size_t)h * ctx + needle) * hd, kb.data(), hd * 2, cudaMemcpyHostToDevice));
        }
    }
    for (int i = 0; i < nkv * hd; i++) {
        a.kf[(size_t)pos * nkv * hd + i] = bf16_to_f32(f32_to_bf16(k[i]));
        a.vf[(size_t)pos * nkv * hd + i] = bf16_to_f32(f32_to_bf16(v[i]));
    }
    std::vector<float> ref(nh * hd), scratch(attention_dense_scratch(&pool_parallel, nh, nkv, hd, pos + 1));
    attention_dense(&pool_parallel, ref.data(), q.data(), a.kf.data(), a.vf.data(), pos, 1, nh, nkv, hd, scratch.data());
    float *dqkv = to_dev(qkv), *dqn = to_dev(qn), *dkn = to_dev(kn), *dinv = to_dev(inv);
    std::vector<int> hp = {pos};
    int *dpos = to_dev(hp);
    float *partial;
    unsigned *counters;
    bf16 *out;
    CU_CHECK(cudaMalloc(&partial, attn_decode_scratch_floats(nh, nkv, hd, ctx) * 4));
    CU_CHECK(cudaMalloc(&counters, nkv * sizeof(unsigned)));
    CU_CHECK(cudaMemset(counters, 0, nkv * sizeof(unsigned)));
    CU_CHECK(cudaMalloc(&out, nh * hd * 2));
    std::vector<float> got[2];
    float *dcs;
    CU_CHECK(cudaMalloc(&dcs, hd * 4));
    CU_CHECK(rope_table(dcs, dinv, dpos, hd / 2, 0));
    for (int rep = 0; rep < 2; rep++) { // the second run finds the counters the first left behind
        CU_CHECK(cudaMemset(out, 0xff, nh * hd * 2));
        CU_CHECK(attn_decode_variant(out, dqkv, qk_norm ? dqn : NULL, qk_norm ? dkn : NULL, dcs, a.kc, a.vc, dpos, nh, nkv, hd,
                                     ctx, 1e-6f, partial, counters, variant, 0));
        CU_CHECK(cudaDeviceSynchronize());
        got[rep] = bf16_dev_to_f32(out, nh * hd);
    }
    auto gk = bf16_dev_to_f32(a.kc, (size_t)nkv * ctx * hd), gv = bf16_dev_to_f32(a.vc, (size_t)nkv * ctx * hd);
    std::vector<float> gk2(nkv * hd), gv2(nkv * hd), rk(nkv * hd), rv(nkv * hd);
    for (int h = 0; h < nkv; h++)
        for (int j = 0; j < hd; j++) {
            gk2[h * hd + j] = gk[((size_t)h * ctx + pos) * hd + j], gv2[h * hd + j] = gv[((size_t)h * ctx + pos) * hd + j];
            rk[h * hd + j] = a.kf[((size_t)pos * nkv + h) * hd + j], rv[h * hd + j] = a.vf[((size_t)pos * nkv + h) * hd + j];
        }
    char what[128];
    char at[32] = "";
    if (needle >= 0) snprintf(at, sizeof at, " needle %d", needle);
    snprintf(what, sizeof what, "attn_decode %s heads %d/%d hd=%d ctx=%d keys=%d qknorm=%d%s", variant == ATTN_DECODE_MMA ? "mma" : "fma",
             nh, nkv, hd, ctx, pos + 1, qk_norm, at);
    check(what, rel_err(got[0].data(), ref.data(), ref.size()), TOL_ATTN);
    if (getenv("PKV_DEBUG"))
        for (int h = 0; h < nh; h++) {
            int bad = 0;
            double e = 0;
            for (int j = 0; j < hd; j++) bad += !isfinite(got[0][h * hd + j]), e = fmax(e, fabs(got[0][h * hd + j] - ref[h * hd + j]));
            printf("   head %d: %d non-finite, max err %.3g, got[0] %g ref[0] %g\n", h, bad, e, got[0][h * hd], ref[h * hd]);
        }
    snprintf(what, sizeof what, "  same output when run again (counters reset)");
    check(what, got[0] == got[1] ? 0.0 : 1.0, 0.5);
    snprintf(what, sizeof what, "  new key and value stored at %d", pos);
    check(what, std::max(rel_err(gk2.data(), rk.data(), rk.size()), rel_err(gv2.data(), rv.data(), rv.size())), TOL_BF16);
    cudaFree(dqkv), cudaFree(dqn), cudaFree(dkn), cudaFree(dinv), cudaFree(dpos), cudaFree(partial), cudaFree(counters);
    cudaFree(dcs), cudaFree(out), cudaFree(a.kc), cudaFree(a.vc);
}

static void test_attn_prefill(int nh, int nkv, int hd, int pos0, int T) {
    AttnData a;
    int ctx = pos0 + T + 5;
    make_attn(a, nh, nkv, hd, ctx, pos0 + T);
    std::vector<float> qf;
    std::vector<uint16_t> qb;
    rand_bf16(qf, qb, (size_t)T * nh * hd, 1.0f);
    std::vector<float> ref((size_t)T * nh * hd), scratch(attention_dense_scratch(&pool_parallel, nh, nkv, hd, pos0 + T));
    attention_dense(&pool_parallel, ref.data(), qf.data(), a.kf.data(), a.vf.data(), pos0, T, nh, nkv, hd, scratch.data());
    bf16 *dq = (bf16 *)to_dev(qb), *out;
    CU_CHECK(cudaMalloc(&out, (size_t)T * nh * hd * 2));
    CU_CHECK(cudaMemset(out, 0xff, (size_t)T * nh * hd * 2));
    CU_CHECK(attn_prefill_simple(out, dq, a.kc, a.vc, pos0, T, nh, nkv, hd, ctx, 0));
    CU_CHECK(cudaDeviceSynchronize());
    auto got = bf16_dev_to_f32(out, (size_t)T * nh * hd);
    char what[128];
    snprintf(what, sizeof what, "attn_prefill_simple heads %d/%d hd=%d pos0=%d T=%d", nh, nkv, hd, pos0, T);
    check(what, rel_err(got.data(), ref.data(), ref.size()), TOL_ATTN);
    cudaFree(dq), cudaFree(out), cudaFree(a.kc), cudaFree(a.vc);
}

struct DecArgs {
    bf16 *out, *kc, *vc;
    float *qkv, *norm, *inv, *partial;
    unsigned *counters;
    int *pos;
    int nh, nkv, hd, ctx, variant;
};
static void run_dec(void *p) {
    DecArgs *a = (DecArgs *)p;
    CU_CHECK(attn_decode_variant(a->out, a->qkv, a->norm, a->norm, a->inv, a->kc, a->vc, a->pos, a->nh, a->nkv, a->hd, a->ctx,
                                 1e-6f, a->partial, a->counters, a->variant, 0));
}

// only: "heads,kv,hd,ctx" (NULL: every shape), for a profiler run of one shape.
static void bench_attn_decode(double bw, const char *only) {
    printf("\n%-38s | %9s | %8s | %s\n", "decode attention (one layer), form", "us", "TB/s", "floor us");
    int cfg[][4] = {{32, 8, 128, 4096},  {32, 8, 128, 8192},  {32, 8, 128, 16384},  {32, 8, 128, 32768},
                    {32, 8, 128, 131072}, {32, 8, 128, 1 << 20}, {16, 4, 128, 4096},  {16, 4, 128, 32768},
                    {9, 3, 64, 8192},     {64, 8, 128, 4096},  {64, 8, 128, 32768}, {64, 8, 128, 131072},
                    {8, 8, 128, 4096},    {8, 8, 128, 32768},  {16, 8, 128, 32768}};
    for (auto &c : cfg)
    for (int v : {ATTN_DECODE_FMA, ATTN_DECODE_MMA}) {
        int nh = c[0], nkv = c[1], hd = c[2], ctx = c[3];
        char name[64];
        snprintf(name, sizeof name, "%d,%d,%d,%d", nh, nkv, hd, ctx);
        if (only && strcmp(only, name) != 0) continue;
        size_t kv = (size_t)nkv * ctx * hd;
        DecArgs a;
        a.nh = nh, a.nkv = nkv, a.hd = hd, a.ctx = ctx, a.variant = v;
        CU_CHECK(cudaMalloc(&a.kc, kv * 2));
        CU_CHECK(cudaMalloc(&a.vc, kv * 2));
        CU_CHECK(cudaMalloc(&a.qkv, (nh + 2 * nkv) * hd * 4));
        CU_CHECK(cudaMalloc(&a.norm, hd * 4));
        CU_CHECK(cudaMalloc(&a.inv, hd * 4));
        CU_CHECK(cudaMalloc(&a.out, nh * hd * 2));
        CU_CHECK(cudaMalloc(&a.partial, attn_decode_scratch_floats(nh, nkv, hd, ctx) * 4));
        CU_CHECK(cudaMalloc(&a.counters, nkv * sizeof(unsigned)));
        CU_CHECK(cudaMemset(a.counters, 0, nkv * sizeof(unsigned)));
        CU_CHECK(fill_random_bf16(a.kc, kv, 5, 1, 0, 0));
        CU_CHECK(fill_random_bf16(a.vc, kv, 6, 1, 0, 0));
        CU_CHECK(fill_random_f32(a.qkv, (nh + 2 * nkv) * hd, 7, 1, 0, 0));
        CU_CHECK(fill_random_f32(a.norm, hd, 8, 0.1f, 1, 0));
        CU_CHECK(fill_random_f32(a.inv, hd, 9, 1.0f, 0.0f, 0)); // stands for the cos/sin table
        std::vector<int> hp = {ctx - 1};
        a.pos = to_dev(hp);
        float t = time_ms(run_dec, &a, 100);
        double bytes = 2.0 * kv * 2;
        printf("heads %2d/%d hd %3d ctx %8d, %s     | %9.1f | %8.2f | %.1f\n", nh, nkv, hd, ctx, v == ATTN_DECODE_MMA ? "mma" : "fma",
               t * 1e3, bytes / (t * 1e-3) / 1e12, bytes / bw * 1e6);
        cudaFree(a.kc), cudaFree(a.vc), cudaFree(a.qkv), cudaFree(a.norm), cudaFree(a.inv), cudaFree(a.out);
        cudaFree(a.partial), cudaFree(a.counters), cudaFree(a.pos);
    }
}

// The residual's sum over two GPUs fused into the GEMV (gemv_bf16_add_stats_tp): each rank computes
// its columns' part of W·h, rank 0 adding the old residual, and the parts are summed over peer
// access. Both ranks must hold the same bits, the sum must match the CPU's whole product, and
// the planted error (each rank keeping its own part) must fail the same check. Four calls: the
// slots' two parities, each used twice.
static void test_tp_sum(int n1, int dim) {
    int ndev = 0, ab = 0, ba = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 2 || cudaDeviceCanAccessPeer(&ab, 0, 1) != cudaSuccess ||
        cudaDeviceCanAccessPeer(&ba, 1, 0) != cudaSuccess || !ab || !ba) {
        cudaGetLastError();
        printf("skip gemv add+stats summed over two GPUs: no two GPUs with peer access here (not counted)\n");
        return;
    }
    const int N = 2, part = n1 / N, n_sums = gemv_sumsq_count(dim);
    std::vector<float> wf, hf, y0(dim), ref(dim);
    std::vector<uint16_t> wb, hb;
    rand_bf16(wf, wb, (size_t)dim * n1, 0.05f);
    rand_bf16(hf, hb, n1, 1.0f);
    for (int i = 0; i < dim; i++) y0[i] = 2.0f * frand();
    backend_cpu.matmul(ref.data(), hf.data(), wb.data(), DTYPE_BF16, 1, n1, dim);
    for (int i = 0; i < dim; i++) ref[i] += y0[i];
    bf16 *W[N], *h[N], *yb[N];
    float *y[N], *sums[N];
    void *slots[N];
    unsigned *count[N];
    size_t slot_bytes = (size_t)2 * N * TP_SUM_ROWS * 8;
    for (int r = 0; r < N; r++) {
        CU_CHECK(cudaSetDevice(r));
        cudaError_t pe = cudaDeviceEnablePeerAccess(1 - r, 0);
        if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled) CU_CHECK(pe);
        cudaGetLastError();
        std::vector<uint16_t> ws((size_t)dim * part), hs(hb.begin() + r * part, hb.begin() + (r + 1) * part);
        for (int i = 0; i < dim; i++) memcpy(&ws[(size_t)i * part], &wb[(size_t)i * n1 + r * part], part * 2);
        W[r] = (bf16 *)to_dev(ws), h[r] = (bf16 *)to_dev(hs), y[r] = to_dev(y0);
        CU_CHECK(cudaMalloc(&yb[r], dim * 2));
        CU_CHECK(cudaMalloc(&sums[r], n_sums * 4));
        CU_CHECK(cudaMalloc(&slots[r], slot_bytes));
        CU_CHECK(cudaMemset(slots[r], 0, slot_bytes));
        CU_CHECK(cudaMalloc(&count[r], 4));
    }
    for (int k = 0; k < 5; k++) {
        int planted = k == 4;
        unsigned cnt = 1 + k / 2;
        for (int r = 0; r < N; r++) {
            CU_CHECK(cudaSetDevice(r));
            CU_CHECK(cudaMemcpy(count[r], &cnt, 4, cudaMemcpyHostToDevice));
            if (r == 0) CU_CHECK(cudaMemcpy(y[r], y0.data(), dim * 4, cudaMemcpyHostToDevice));
            else CU_CHECK(cudaMemset(y[r], 0xff, dim * 4)); // the other ranks' old values are not read
            CU_CHECK(cudaMemset(yb[r], 0xff, dim * 2));
            CU_CHECK(cudaMemset(sums[r], 0xff, n_sums * 4));
        }
        for (int r = 0; r < N; r++) { // both launched before either is waited for
            CU_CHECK(cudaSetDevice(r));
            TpSum tp;
            memset(&tp, 0, sizeof tp);
            for (int q = 0; q < N; q++) tp.slot[q] = slots[q];
            tp.count = count[r], tp.call = k % 2, tp.per_step = 2, tp.rank = r, tp.n = N, tp.add = r == 0, tp.own_only = planted;
            CU_CHECK(gemv_bf16_add_stats_tp(y[r], W[r], h[r], part, dim, yb[r], sums[r], tp, 0));
        }
        std::vector<float> got[N], gs(n_sums), want_s(n_sums);
        for (int r = 0; r < N; r++) {
            CU_CHECK(cudaSetDevice(r));
            CU_CHECK(cudaDeviceSynchronize());
            got[r].resize(dim);
            CU_CHECK(cudaMemcpy(got[r].data(), y[r], dim * 4, cudaMemcpyDeviceToHost));
        }
        char what[128];
        if (planted) {
            double err = rel_err(got[0].data(), ref.data(), dim);
            snprintf(what, sizeof what, "  planted: each rank's own part kept is caught (err %.1e)", err);
            check(what, err > TOL_ACC ? 0.0 : 1.0, 0.0);
            continue;
        }
        size_t differ = 0;
        for (int i = 0; i < dim; i++) differ += memcmp(&got[0][i], &got[1][i], 4) != 0;
        snprintf(what, sizeof what, "gemv add+stats summed over 2 GPUs n=%d d=%d call %d: ranks' bits differ", n1, dim, k);
        check(what, (double)differ, 0.0);
        snprintf(what, sizeof what, "  the sum against the whole product");
        check(what, rel_err(got[1].data(), ref.data(), dim), TOL_ACC);
        std::vector<float> gb = bf16_dev_to_f32(yb[1], dim);
        size_t bad = 0;
        for (int i = 0; i < dim; i++) bad += gb[i] != bf16_to_f32(f32_to_bf16(got[1][i]));
        snprintf(what, sizeof what, "  its bf16 copy: values not bf16(y)");
        check(what, (double)bad, 0.0);
        CU_CHECK(cudaMemcpy(gs.data(), sums[1], n_sums * 4, cudaMemcpyDeviceToHost));
        int rows = (dim + n_sums - 1) / n_sums; // a block's rows
        for (int b = 0; b < n_sums; b++) {
            double s = 0;
            for (int i = rows * b; i < rows * (b + 1) && i < dim; i++) s += (double)got[1][i] * got[1][i];
            want_s[b] = (float)s;
        }
        snprintf(what, sizeof what, "  its sums of squares by blocks of rows");
        check(what, rel_err(gs.data(), want_s.data(), n_sums), TOL_EMB);
    }
    for (int r = 0; r < N; r++) {
        CU_CHECK(cudaSetDevice(r));
        cudaFree(W[r]), cudaFree(h[r]), cudaFree(y[r]), cudaFree(yb[r]), cudaFree(sums[r]), cudaFree(slots[r]), cudaFree(count[r]);
    }
    CU_CHECK(cudaSetDevice(0));
}

// Device read bandwidth (2 GiB read once, median of 20): the floor each benchmark row states.
static double measure_bandwidth(void) {
    size_t n = (size_t)2 << 30;
    void *buf;
    float *sink;
    CU_CHECK(cudaMalloc(&buf, n));
    CU_CHECK(cudaMalloc(&sink, 4));
    CU_CHECK(fill_random_bf16((bf16 *)buf, n / 2, 1, 1, 0, 0));
    struct R {
        void *b;
        size_t n;
        float *s;
    } r = {buf, n, sink};
    float t = time_ms([](void *p) { R *r = (R *)p; CU_CHECK(read_bandwidth_kernel(r->b, r->n, r->s, 0)); }, &r, 20);
    double bw = n / (t * 1e-3);
    printf("\nmeasured read bandwidth: %.2f TB/s\n", bw / 1e12);
    cudaFree(buf), cudaFree(sink);
    return bw;
}

int main(int argc, char **argv) {
    cudaDeviceProp prop;
    CU_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
    // `test_kernels bench-decode [heads,kv,hd,ctx]`: the decode-attention benchmark alone (no
    // checks), for side-by-side timing or a profiler run of one shape.
    if (argc > 1 && strcmp(argv[1], "bench-decode") == 0) {
        bench_attn_decode(measure_bandwidth(), argc > 2 ? argv[2] : NULL);
        return 0;
    }
    // correctness
    test_gemv(576, 960, GEMV_STORE);
    test_gemv(4096, 6144, GEMV_STORE);
    test_gemv(1536, 577, GEMV_ADD);
    test_gemv(4096, 4096, GEMV_ADD);
    test_gemv(576, 3072, GEMV_SWIGLU);
    test_gemv(4096, 2 * 12288, GEMV_SWIGLU);
    test_gemv(14336, 4096, GEMV_ADD);
    test_rmsnorm(1, 4096);
    test_rmsnorm(2, 9000); // longer than a block holds at once
    test_norm_link(4096, 4096, 6144, GEMV_STORE);
    test_norm_link(12288, 4096, 2 * 12288, GEMV_SWIGLU);
    test_norm_link(1536, 576, 960, GEMV_STORE);
    test_norm_link(960, 584, 64, GEMV_STORE);
    test_norm_link(8192, 9000, 512, GEMV_SWIGLU);
    test_embed_stats(1000, 4096);
    test_embed_stats(49152, 576);
    test_tp_sum(4096, 4096);
    test_tp_sum(14336, 4096);
    test_tp_sum(8192, 8192);
    test_rmsnorm(1, 576);
    test_rmsnorm(7, 4096);
    test_rmsnorm(33, 8192);
    test_rmsnorm(5, 576);
    test_rmsnorm(3, 1002); // rows by the one-row kernel: n not a multiple of 4
    test_qkv(1, 0, 9, 3, 64, 0);
    test_qkv(5, 1000, 32, 8, 128, 1);
    test_qkv(3, 131000, 16, 8, 128, 1);
    test_qkv(64, 1048000, 8, 1, 128, 1); // many tokens at a 1M position (one KV head: the cache is allocated whole)
    test_qkv(4, 7, 4, 2, 16, 1);
    test_qkv(4, 300, 6, 2, 32, 1);
    test_qkv(2, 50000, 8, 2, 256, 1);
    test_swiglu(1, 576);
    test_swiglu(37, 12288);
    int dec[][6] = {{9, 3, 64, 300, 0, 0}, {9, 3, 64, 300, 299, 0}, {32, 8, 128, 5000, 4321, 1}, {16, 8, 128, 2048, 1023, 1},
                    {8, 8, 128, 700, 650, 0}, {64, 8, 128, 3000, 2999, 1}, {32, 8, 128, 70000, 65537, 1},
                    {32, 8, 128, 140000, 131071, 1}, {4, 2, 16, 200, 149, 1}, {4, 2, 32, 200, 77, 0},
                    {16, 4, 256, 900, 899, 1}, {24, 3, 64, 40, 31, 0}, {6, 6, 128, 5000, 4095, 0}};
    // Needles (heads, KV heads, hd, ctx, pos, key): split ends for both forms' grids on a
    // 132-SM GPU (32/8: splits of 160 keys; 64/8: 128 for mma, 192 for fma; 4/2: 128), tile
    // starts, the first and the last cached key.
    int needles[][6] = {{32, 8, 128, 5000, 4321, 0},  {32, 8, 128, 5000, 4321, 159}, {32, 8, 128, 5000, 4321, 160},
                        {32, 8, 128, 5000, 4321, 4320}, {64, 8, 128, 3000, 2999, 127}, {64, 8, 128, 3000, 2999, 191},
                        {64, 8, 128, 3000, 2999, 2998}, {4, 2, 16, 200, 149, 127},    {4, 2, 16, 200, 149, 16}};
    for (int v : {ATTN_DECODE_FMA, ATTN_DECODE_MMA}) {
        for (auto &d : dec) test_attn_decode(d[0], d[1], d[2], d[3], d[4], d[5], v);
        for (auto &d : needles) test_attn_decode(d[0], d[1], d[2], d[3], d[4], 1, v, d[5]);
    }
    test_attn_prefill(9, 3, 64, 0, 40);
    test_attn_prefill(32, 8, 128, 300, 17);
    if (getenv("PKV_SKIP_BENCH")) { // correctness only: under compute-sanitizer the timings are meaningless and slow
        printf("\n%d passed, %d failed\n", passed, failed);
        return failed != 0;
    }
    // speed
    double bw = measure_bandwidth();
    cublasHandle_t blas;
    cublasCreate(&blas);
    bench_gemv(blas, bw);
    bench_attn_decode(bw, NULL);
    printf("\n%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
