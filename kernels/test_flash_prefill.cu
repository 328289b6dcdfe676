// Standalone correctness test and benchmark of kernels/flash_prefill.cu (causal GQA prefill attention).
//
// Build (sm_90a code is needed for the wgmma kernel):
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -o build/fp/test_flash_prefill
//        kernels/test_flash_prefill.cu kernels/flash_prefill.cu kernels/flash_prefill_fp8.cu -lpthread
// Run:
//   test_flash_prefill check IMPL    every correctness case (IMPL: wgmma | wgmma0-4 | wgmma5 | wgmma6 | wgmma160 | mma | fp8 | auto)
//   test_flash_prefill small IMPL    the small cases only (for compute-sanitizer)
//   test_flash_prefill bench IMPL [CTX]  Qwen3-8B shapes at ctx CTX (131072): chunks of T = 4096 / 8192 at
//                                    pos0 0, CTX/4, CTX/2, 3 CTX/4, CTX - 8192, then (CTX <= 131072) every
//                                    chunk of a whole prompt, projected over 36 layers
//
// Correctness: fresh random bf16 inputs (q, k uniform in [-2, 2], v in [-1, 1]); cache rows past pos0 + T
// hold NaN (the kernel must never read them); the output is poisoned with NaN before the call and every
// element must come back finite. A CPU reference in double precision (from the same bf16 inputs) is
// compared on every row of the small cases and on a subset of query rows (all heads) of the big ones.
// Pass: max |out - ref| <= 1e-2 * max |ref| and ||out - ref|| / ||ref|| <= 1e-2.
// Where 1e-2 comes from: the kernel rounds P = softmax weights to bf16 before the P V product
// (tensor cores take bf16), errors of at most 2^-9 relative and random sign, and rounds the output
// to bf16 (2^-9 = 2e-3 of max|ref|); the scores themselves are fp32 sums of bf16 products that
// both sides share exactly (u32-level). (The default kernel's lazy rescale lets weights reach 2^8 of
// the row maximum they are taken against: the same relative rounding in bf16.) The P error averages over the keys of a row: sqrt of the
// sum of squared weights times 2^-9 max|v|, at most 2^-9 max|v| when one key dominates; so the
// output is within 2e-3 + 2e-3 (+ fp32 terms) of the double reference: 1e-2 leaves room for
// 4 sigma over millions of outputs, and a wrong row, key range or mask moves outputs by O(1).
//
// IMPL fp8 (flash_prefill_fp8): the reference is computed from the same e4m3 values the kernel sees
// (q and K rotated, q per row, K and V per KV head and 128-row tile: rotation, scales and rounding
// reproduced bit for bit here; every other case reuses the copies a call before made of the rows
// before pos0), so what is left
// is the kernel's rounding of the weights P to e4m3 (3 mantissa bits: at most 2^-4 of a weight,
// 2^-18 of the row's maximum weight below e4m3's normal range) and of the output to bf16. The
// kernel divides by the sum of the rounded weights (the PV GEMM's ones row), so its output is
// sum_p P_p v_p / sum_p P_p with P_p = w_p + d_p, and out - ref = sum_p d_p (v_p - ref) / sum_p P_p.
// Bounds, per element e, with a_p = max((2^-4 + 2^-9) w_p, 2^-18) the bound on |d_p| (w: the weights
// before normalization by l, the row's maximum 1) and L = l - sum_p a_p <= sum_p P_p:
// |out - ref| <= sum_p a_p |v_pe - ref_e| / L + 2^-8 |ref| + 1e-5; and over the case,
// sum (out - ref)^2 <= 3 (sum_e sum_p var_p (v_pe - ref_e)^2 / L^2 + (2^-9 ref)^2 / 3),
// var_p = max(2^-3 w_p, 2^-17)^2 / 12 the variance of a rounding error uniform over the weight's
// e4m3 spacing (at most 2^-3 w_p). Planted
// error: the same outputs against a reference without each row's diagonal key must fail the cases
// whose rows are short enough for that key to matter (the small ones).
#include "../offload/fp8.h"
#include "flash_prefill.h"
#include "variants.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

typedef __nv_bfloat16 bf16;

#define CK(call)                                                                                            \
    do {                                                                                                    \
        cudaError_t e_ = (call);                                                                            \
        if (e_ != cudaSuccess) {                                                                            \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__,       \
                    cudaGetErrorString(e_));                                                                \
            exit(1);                                                                                        \
        }                                                                                                   \
    } while (0)

static int g_impl = FLASH_PREFILL_AUTO;
static bool g_fp8 = false;        // IMPL fp8: flash_prefill_fp8
static void *g_ws = NULL;         // its workspace
static size_t g_ws_bytes = 0;

static void ensure_ws(int T, int ctx, int H, int KV, int hd) {
    const size_t need = flash_prefill_fp8_workspace(T, ctx, H, KV, hd);
    if (need <= g_ws_bytes) return;
    if (g_ws) CK(cudaFree(g_ws));
    CK(cudaMalloc(&g_ws, need));
    g_ws_bytes = need;
}

// copies_from: fp8 only, flash_prefill_fp8's (rows before it copied by the call before).
static cudaError_t attn(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int pos0, int T, int H, int KV, int hd, int ctx,
                        int copies_from = 0) {
    if (!g_fp8) return flash_prefill_impl(g_impl, out, q, k, v, pos0, T, H, KV, hd, ctx, 0);
    ensure_ws(T, ctx, H, KV, hd);
    return flash_prefill_fp8(out, q, k, v, pos0, T, H, KV, hd, ctx, copies_from, g_ws, g_ws_bytes, 0);
}

// ---- e4m3 on the CPU: the host store's row quantization (offload/fp8.h), which rounds as the GPU does ----
// flash_prefill_fp8's rotation of a query or key row: signs, then the butterflies in its order
// (fp32 adds and subtractions: the same bits as the GPU's).
static void fp8_rotate(float *x, int D) {
    for (int d = 0; d < D; d++) x[d] *= ((uint32_t)(d + 1) * 0x9E3779B1u) >> 31 ? -1.0f : 1.0f;
    for (int h = 1; h < D; h *= 2)
        for (int i = 0; i < D; i++)
            if (!(i & h)) {
                const float a = x[i], b = x[i + h];
                x[i] = a + b, x[i + h] = a - b;
            }
}
// x[0 .. n) replaced by its e4m3 values times the scale (one scale for all n), as flash_prefill_fp8
// sees them: the host store's row quantization (offload/fp8.h), the same amax, scale and codes.
static void fp8_dequant(float *x, size_t n) {
    std::vector<uint8_t> c(n);
    const float sc = fp8_quantize_row(x, (int)n, c.data());
    fp8_dequantize_row(c.data(), sc, (int)n, x);
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

__global__ void fill_uniform(bf16 *p, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float u = (float)(mix64(seed * 0x100000001b3ull ^ i) >> 40) * (1.0f / 16777216.0f);
        p[i] = __float2bfloat16((2.f * u - 1.f) * scale);
    }
}

// Key row p (of each head) times 1 + p / rise, rounded to bf16 again.
__global__ void rise_rows(bf16 *p, int nkv, int ctx, int hd, int rows, float rise) {
    const size_t n = (size_t)nkv * rows * hd;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t h = i / ((size_t)rows * hd), r = (i / hd) % rows, e = i % hd;
        bf16 &x = p[(h * ctx + r) * hd + e];
        x = __float2bfloat16(__bfloat162float(x) * (1.0f + (float)r / rise));
    }
}

// Cache rows at positions >= lim get NaN.
__global__ void poison_tail(bf16 *p, int nkv, int ctx, int hd, int lim) {
    const size_t per_head = (size_t)(ctx - lim) * hd;
    const size_t n = per_head * nkv;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t h = i / per_head, r = i % per_head;
        p[h * (size_t)ctx * hd + (size_t)lim * hd + r] = __float2bfloat16(nanf(""));
    }
}

static void fill(bf16 *p, size_t n, uint64_t seed, float scale) {
    fill_uniform<<<1024, 256>>>(p, n, seed, scale);
    CK(cudaGetLastError());
}

static float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ---------------- CPU reference ----------------
struct RefJob {
    const float *q, *k, *v; // q (T, H, hd); k, v (KV, kv_rows, hd) (only the first kv_rows positions)
    int hd, H, KV, kv_rows, pos0;
    const std::vector<int> *ts;
    double *out; // (ts.size(), H, hd)
    int tid, nthr;
    double *bmax, *bvar; // fp8 only: the per-element bound and error variance (see the top), or NULL
    int drop_diag;       // the planted error: each row's own key left out
};

static void *ref_worker(void *arg) {
    RefJob *j = (RefJob *)arg;
    const int G = j->H / j->KV;
    const double scale = 1.0 / sqrt((double)j->hd);
    const int nrow = (int)j->ts->size() * j->H;
    std::vector<double> s;
    for (int row = j->tid; row < nrow; row += j->nthr) {
        const int ti = row / j->H, h = row % j->H, t = (*j->ts)[ti];
        const int nk = j->pos0 + t + 1;
        const float *q = j->q + ((size_t)t * j->H + h) * j->hd;
        const float *K = j->k + (size_t)(h / G) * j->kv_rows * j->hd;
        const float *V = j->v + (size_t)(h / G) * j->kv_rows * j->hd;
        s.resize(nk);
        double m = -1e300;
        for (int p = 0; p < nk; p++) {
            double d = 0;
            const float *kr = K + (size_t)p * j->hd;
            for (int e = 0; e < j->hd; e++) d += (double)q[e] * kr[e];
            s[p] = d * scale;
            m = std::max(m, s[p]);
        }
        double *o = j->out + (size_t)row * j->hd, *bm = j->bmax ? j->bmax + (size_t)row * j->hd : NULL,
               *bv = j->bvar ? j->bvar + (size_t)row * j->hd : NULL;
        for (int e = 0; e < j->hd; e++) {
            o[e] = 0;
            if (bm) bm[e] = 0, bv[e] = 0;
        }
        double sum = 0;
        const int np = nk - (j->drop_diag ? 1 : 0);
        for (int p = 0; p < np; p++) {
            const double w = s[p] = exp(s[p] - m); // the weight, kept for the bounds below
            sum += w;
            const float *vr = V + (size_t)p * j->hd;
            for (int e = 0; e < j->hd; e++) o[e] += w * vr[e];
        }
        for (int e = 0; e < j->hd; e++) o[e] = sum > 0 ? o[e] / sum : 0.0; // a row whose one key was dropped attends to nothing: 0
        if (bm) { // the bounds of the top: each key's weight error times its distance from the output
            double sab = 0;
            for (int p = 0; p < np; p++) {
                const double w = s[p];
                // + w / 512: the scores' own error (fp8 products summed by the tensor cores, ex2.approx)
                const double ab = std::max(w / 16 + w / 512, ldexp(1.0, -18)), sd = std::max(w / 8, ldexp(1.0, -17));
                const float *vr = V + (size_t)p * j->hd;
                sab += ab;
                for (int e = 0; e < j->hd; e++) {
                    const double d = vr[e] - o[e];
                    bm[e] += ab * fabs(d), bv[e] += sd * sd / 12 * d * d;
                }
            }
            const double lo = sum - sab; // the kernel's row sum is at least this (sum >= 1: the maximum's weight)
            for (int e = 0; e < j->hd; e++) bm[e] /= lo, bv[e] /= lo * lo;
        }
    }
    return NULL;
}

struct Case {
    const char *name;
    int hd, H, KV, T, pos0, ctx;
    int n_t; // 0: every query row; else this many query rows (first, last and spread), all heads
    int rise; // > 0: key row p scaled by 1 + p / rise, so that later tiles' scores pass the earlier
              // ones' by far (the kernels' rescales, and the default kernel's way back to its scores)
    int bf16_only; // 1: not for fp8, whose bounds take the scores' own error as 2^-9 of a weight
                   // (untrue for scores of hundreds: e4m3 products summed by the tensor cores)
};

struct CheckResult {
    double max_err, max_ref, rel_l2;
    long nonfinite;
    bool pass, mutant_flagged;
    float ms;
};

static CheckResult run_case(const Case &c, uint64_t seed) {
    const size_t nq = (size_t)c.T * c.H * c.hd, nkv = (size_t)c.KV * c.ctx * c.hd;
    const int kv_len = c.pos0 + c.T;
    bf16 *dq, *dk, *dv, *dout;
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dout, nq * 2));
    CK(cudaMalloc(&dk, nkv * 2));
    CK(cudaMalloc(&dv, nkv * 2));
    fill(dq, nq, seed * 4 + 1, 2.f);
    fill(dk, nkv, seed * 4 + 2, 2.f);
    fill(dv, nkv, seed * 4 + 3, 1.f);
    if (c.rise > 0) {
        rise_rows<<<256, 256>>>(dk, c.KV, c.ctx, c.hd, kv_len, (float)c.rise);
        CK(cudaGetLastError());
    }
    if (kv_len < c.ctx) {
        poison_tail<<<256, 256>>>(dk, c.KV, c.ctx, c.hd, kv_len);
        poison_tail<<<256, 256>>>(dv, c.KV, c.ctx, c.hd, kv_len);
        CK(cudaGetLastError());
    }
    // fp8, every other case: the rows before pos0 copied by a call before (one query at pos0 - 1, as
    // a layer's previous chunk would leave them), which this case's call then reuses
    const int copies_from = g_fp8 && (seed & 1) && c.pos0 > 0 ? c.pos0 : 0;
    if (g_fp8) ensure_ws(c.T, c.ctx, c.H, c.KV, c.hd); // sized for both calls: a larger one later would lose the copies
    if (copies_from) CK(attn(dout, dq, dk, dv, c.pos0 - 1, 1, c.H, c.KV, c.hd, c.ctx));
    CK(cudaMemset(dout, 0xff, nq * 2)); // NaN
    CK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0));
    CK(attn(dout, dq, dk, dv, c.pos0, c.T, c.H, c.KV, c.hd, c.ctx, copies_from));
    CK(cudaEventRecord(e1));
    CK(cudaDeviceSynchronize());
    CheckResult r = {};
    CK(cudaEventElapsedTime(&r.ms, e0, e1));

    std::vector<uint16_t> hq(nq), hout(nq), hk(nkv), hv(nkv);
    CK(cudaMemcpy(hq.data(), dq, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hout.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hk.data(), dk, nkv * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hv.data(), dv, nkv * 2, cudaMemcpyDeviceToHost));
    CK(cudaFree(dq));
    CK(cudaFree(dout));
    CK(cudaFree(dk));
    CK(cudaFree(dv));

    for (size_t i = 0; i < nq; i++)
        if (!isfinite(bf2f(hout[i]))) r.nonfinite++;

    std::vector<int> ts;
    if (c.n_t == 0 || c.n_t >= c.T) {
        for (int t = 0; t < c.T; t++) ts.push_back(t);
    } else {
        uint64_t x = seed * 7919 + 17;
        ts.push_back(0);
        ts.push_back(c.T - 1);
        for (int i = 2; i < c.n_t; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            ts.push_back((int)((x >> 33) % (uint64_t)c.T));
        }
    }
    std::vector<float> fq(nq), fk((size_t)c.KV * kv_len * c.hd), fv(fk.size());
    for (size_t i = 0; i < nq; i++) fq[i] = bf2f(hq[i]);
    for (int h = 0; h < c.KV; h++)
        for (size_t i = 0; i < (size_t)kv_len * c.hd; i++) {
            fk[(size_t)h * kv_len * c.hd + i] = bf2f(hk[(size_t)h * c.ctx * c.hd + i]);
            fv[(size_t)h * kv_len * c.hd + i] = bf2f(hv[(size_t)h * c.ctx * c.hd + i]);
        }
    if (g_fp8) { // the values the kernel sees: q per (position, head) row, K and V per KV head and
        // 128-row tile; q and K rotated (K then divided by hd, the rotation's gain: scores are q . k)
        for (size_t r = 0; r < (size_t)c.T * c.H; r++) fp8_rotate(fq.data() + r * c.hd, c.hd), fp8_dequant(fq.data() + r * c.hd, c.hd);
        for (size_t r = 0; r < (size_t)c.KV * kv_len; r++) fp8_rotate(fk.data() + r * c.hd, c.hd);
        for (int h = 0; h < c.KV; h++)
            for (int r0 = 0; r0 < kv_len; r0 += 128) {
                const size_t n = (size_t)std::min(128, kv_len - r0) * c.hd, at = ((size_t)h * kv_len + r0) * c.hd;
                fp8_dequant(fk.data() + at, n);
                fp8_dequant(fv.data() + at, n);
            }
        for (float &x : fk) x /= (float)c.hd;
    }
    const size_t nout = ts.size() * c.H * c.hd;
    std::vector<double> ref(nout), mut(g_fp8 ? nout : 0), bmax(g_fp8 ? nout : 0), bvar(g_fp8 ? nout : 0);
    const int nthr = 16;
    RefJob jobs[nthr];
    pthread_t th[nthr];
    for (int pass = 0; pass < (g_fp8 ? 2 : 1); pass++) { // fp8: the reference, then the planted error's
        for (int i = 0; i < nthr; i++) {
            jobs[i] = RefJob{fq.data(), fk.data(), fv.data(), c.hd, c.H, c.KV, kv_len, c.pos0, &ts, pass ? mut.data() : ref.data(), i, nthr,
                             g_fp8 && !pass ? bmax.data() : NULL, g_fp8 && !pass ? bvar.data() : NULL, pass};
            pthread_create(&th[i], NULL, ref_worker, &jobs[i]);
        }
        for (int i = 0; i < nthr; i++) pthread_join(th[i], NULL);
    }

    double se = 0, sr = 0;
    for (size_t ti = 0; ti < ts.size(); ti++)
        for (int h = 0; h < c.H; h++)
            for (int e = 0; e < c.hd; e++) {
                const double rv = ref[(ti * c.H + h) * c.hd + e];
                const double ov = bf2f(hout[((size_t)ts[ti] * c.H + h) * c.hd + e]);
                const double err = fabs(ov - rv);
                if (!(err <= r.max_err)) r.max_err = isfinite(err) ? std::max(r.max_err, err) : INFINITY;
                r.max_ref = std::max(r.max_ref, fabs(rv));
                se += (ov - rv) * (ov - rv);
                sr += rv * rv;
            }
    r.rel_l2 = sqrt(se / sr);
    r.pass = r.nonfinite == 0 && r.max_err <= 1e-2 * r.max_ref && r.rel_l2 <= 1e-2;
    if (g_fp8) { // the bounds of the top, against the reference and against the planted error's
        double over = 0, var = 0, se_m = 0, over_m = 0;
        for (size_t ti = 0; ti < ts.size(); ti++)
            for (int h = 0; h < c.H; h++)
                for (int e = 0; e < c.hd; e++) {
                    const size_t i = (ti * c.H + h) * c.hd + e;
                    const double ov = bf2f(hout[((size_t)ts[ti] * c.H + h) * c.hd + e]), rv = ref[i];
                    const double lim = bmax[i] + ldexp(fabs(rv), -8) + 1e-5;
                    over = std::max(over, fabs(ov - rv) / lim);
                    over_m = std::max(over_m, fabs(ov - mut[i]) / lim);
                    var += bvar[i] + ldexp(rv * rv, -18) / 3;
                    se_m += (ov - mut[i]) * (ov - mut[i]);
                }
        r.pass = r.nonfinite == 0 && over <= 1.0 && se <= 3 * var;
        r.mutant_flagged = !(over_m <= 1.0 && se_m <= 3 * var);
        printf("  fp8 bounds: max |err| / bound %.3f, sum err^2 / (3 x expected) %.3f; planted error (no diagonal key): %.3f, %.3f -> %s\n",
               over, se / (3 * var), over_m, se_m / (3 * var), r.mutant_flagged ? "flagged" : "not flagged");
    }
    printf("%-34s hd %3d H %2d KV %2d T %5d pos0 %6d rows %5zu/%5d  max_err %.3e (ref max %.3f)  rel_l2 %.3e  "
           "nonfinite %ld  %s\n",
           c.name, c.hd, c.H, c.KV, c.T, c.pos0, ts.size(), c.T, r.max_err, r.max_ref, r.rel_l2, r.nonfinite,
           r.pass ? "PASS" : "FAIL");
    fflush(stdout);
    return r;
}

static int check(bool small_only) {
    const Case cases[] = {
        {"qwen3/llama3 single query", 128, 32, 8, 1, 0, 64, 0, 0, 0},
        {"qwen3/llama3 ragged T, pos0 0", 128, 32, 8, 100, 0, 256, 0, 0, 0},
        {"qwen3/llama3 pos0 1000 T 257", 128, 32, 8, 257, 1000, 1400, 0, 0, 0},
        {"MHA (G=1) pos0 129", 128, 8, 8, 300, 129, 512, 0, 0, 0},
        {"G=3 hd128 pos0 77", 128, 12, 4, 200, 77, 300, 0, 0, 0},
        {"smollm2 (hd64 G=3) pos0 333", 64, 9, 3, 77, 333, 512, 0, 0, 0},
        {"smollm2 single query pos0 50", 64, 9, 3, 1, 50, 64, 0, 0, 0},
        {"hd64 G=8 pos0 3", 64, 8, 1, 130, 3, 200, 0, 0, 0},
        {"rising keys hd128 pos0 500", 128, 32, 8, 300, 500, 1024, 0, 64, 0},
        {"rising keys hd64 G=3 pos0 700", 64, 9, 3, 200, 700, 1024, 0, 64, 0},
        // scores of hundreds (exp2 of a later tile against an earlier maximum overflows fp32)
        {"steep keys hd128 pos0 500", 128, 32, 8, 300, 500, 1024, 0, 4, 1},
        {"smollm2 T 2048 pos0 5000", 64, 9, 3, 2048, 5000, 8192, 64, 0, 0},
        {"qwen3/llama3 T 4096 pos0 0", 128, 32, 8, 4096, 0, 4096, 48, 0, 0},
        {"qwen3/llama3 T 1000 pos0 31000", 128, 32, 8, 1000, 31000, 40000, 32, 0, 0},
        {"qwen3 T 8192 pos0 122880 ctx 128K", 128, 32, 8, 8192, 122880, 131072, 16, 0, 0},
        {"rising keys T 4096 pos0 12288", 128, 32, 8, 4096, 12288, 16384, 32, 2048, 0},
    };
    int n = 0, fails = 0, mutants = 0, flagged = 0;
    for (const Case &c : cases) {
        if ((small_only && c.n_t != 0) || (g_fp8 && c.bf16_only)) continue;
        CheckResult r = run_case(c, 1000 + n);
        n++;
        if (!r.pass) fails++;
        if (g_fp8 && c.n_t == 0) mutants++, flagged += r.mutant_flagged;
    }
    printf("check: %d cases, %d failed\n", n, fails);
    if (g_fp8) printf("planted error (each row's diagonal key dropped) flagged in %d of %d small cases%s\n", flagged, mutants, flagged == mutants ? "" : ": FAIL");
    return fails || flagged != mutants ? 1 : 0;
}

// ---------------- benchmark ----------------
static double pairs(long long pos0, long long T) { return (double)T * pos0 + (double)T * (T + 1) / 2; }

static float time_call(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int pos0, int T, int reps,
                       int H, int KV, int hd, int ctx) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(e0));
        CK(attn(out, q, k, v, pos0, T, H, KV, hd, ctx));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ts.push_back(ms);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

// ctx: the cache's rows (131072 by default; a 1M prompt's late chunks with 1048576: 4 GiB of K/V).
// The whole-prompt sweep runs only up to 131072 (at 1M it would take minutes).
static int bench(int ctx) {
    const int H = 32, KV = 8, hd = 128, layers = 36;
    const size_t nkv = (size_t)KV * ctx * hd, nq = (size_t)8192 * H * hd;
    bf16 *dq, *dk, *dv, *dout;
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dout, nq * 2));
    CK(cudaMalloc(&dk, nkv * 2));
    CK(cudaMalloc(&dv, nkv * 2));
    fill(dq, nq, 11, 2.f);
    fill(dk, nkv, 12, 2.f);
    fill(dv, nkv, 13, 1.f);
    CK(cudaDeviceSynchronize());
    const double fl_per_pair = 4.0 * hd * H;
    // warm-up
    time_call(dout, dq, dk, dv, ctx / 2, 8192, 2, H, KV, hd, ctx);

    printf("\nQwen3-8B attention (H 32, KV 8, hd 128, ctx %d), one layer, median of N\n", ctx);
    printf("%6s %7s %10s %10s %9s %4s\n", "T", "pos0", "ms", "TFLOP/s", "GFLOP", "N");
    const int Ts[2] = {4096, 8192};
    const int pos[5] = {0, ctx / 4, ctx / 2, ctx / 4 * 3, ctx - 8192};
    for (int T : Ts)
        for (int p : pos) {
            const double fl = fl_per_pair * pairs(p, T);
            float ms = time_call(dout, dq, dk, dv, p, T, 1, H, KV, hd, ctx);
            int reps = (int)std::min(25.0, std::max(5.0, 300.0 / ms));
            ms = time_call(dout, dq, dk, dv, p, T, reps, H, KV, hd, ctx);
            printf("%6d %7d %10.3f %10.1f %9.1f %4d\n", T, p, ms, fl / (ms * 1e-3) / 1e12, fl / 1e9, reps);
            fflush(stdout);
        }

    if (ctx <= 131072) { // the whole prompt's chunks (at 1M they would take minutes)
        printf("\nWhole %d-token prompt in chunks (sum of per-chunk medians of 3), one layer and x%d layers\n", ctx, layers);
        for (int T : Ts) {
            double tot_ms = 0, tot_fl = 0;
            for (int p = 0; p < ctx; p += T) {
                tot_ms += time_call(dout, dq, dk, dv, p, T, 3, H, KV, hd, ctx);
                tot_fl += fl_per_pair * pairs(p, T);
            }
            printf("chunk T %5d: %d chunks, %.1f ms per layer, %.1f TFLOP/s, projected %d layers: %.2f s (%.2f PFLOP)\n",
                   T, ctx / T, tot_ms, tot_fl / (tot_ms * 1e-3) / 1e12, layers, tot_ms * layers / 1e3,
                   tot_fl * layers / 1e15);
            fflush(stdout);
        }
    }
    CK(cudaFree(dq));
    CK(cudaFree(dout));
    CK(cudaFree(dk));
    CK(cudaFree(dv));
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "check";
    const char *impl = argc > 2 ? argv[2] : "auto";
    if (!strcmp(impl, "wgmma")) g_impl = FLASH_PREFILL_WGMMA;
    else if (!strcmp(impl, "wgmma1")) g_impl = FLASH_PREFILL_WGMMA_M1;
    else if (!strcmp(impl, "wgmma2")) g_impl = FLASH_PREFILL_WGMMA_M2;
    else if (!strcmp(impl, "wgmma0")) g_impl = FLASH_PREFILL_WGMMA_M0;
    else if (!strcmp(impl, "wgmma3")) g_impl = FLASH_PREFILL_WGMMA_M3;
    else if (!strcmp(impl, "wgmma4")) g_impl = FLASH_PREFILL_WGMMA_M4;
    else if (!strcmp(impl, "wgmma160")) g_impl = FLASH_PREFILL_WGMMA_N160;
    else if (!strcmp(impl, "wgmma5")) g_impl = FLASH_PREFILL_WGMMA_M5;
    else if (!strcmp(impl, "wgmma6")) g_impl = FLASH_PREFILL_WGMMA_M6;
    else if (!strcmp(impl, "mma")) g_impl = FLASH_PREFILL_MMA;
    else if (!strcmp(impl, "fp8")) g_fp8 = true;
    else g_impl = FLASH_PREFILL_AUTO;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s (sm_%d%d, %d SMs), impl %s, mode %s\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, impl, mode);
    if (!strcmp(mode, "info")) return 0;
    if (!strcmp(mode, "check")) return check(false);
    if (!strcmp(mode, "small")) return check(true);
    if (!strcmp(mode, "bench")) {
        char *end = NULL;
        const long ctx = argc > 3 ? strtol(argv[3], &end, 10) : 131072;
        if ((argc > 3 && (end == argv[3] || *end)) || ctx < 16384 || ctx > (1 << 22) || ctx % 8192) {
            fprintf(stderr, "bench: CTX must be a multiple of 8192 from 16384 to 4194304\n");
            return 2;
        }
        return bench((int)ctx);
    }
    fprintf(stderr, "usage: %s check|small|bench wgmma|wgmma0|wgmma1|wgmma2|wgmma3|wgmma4|wgmma5|wgmma6|wgmma160|mma|fp8|auto [CTX, bench]\n", argv[0]);
    return 2;
}
