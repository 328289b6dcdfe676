// ParisKV's decode attention kernels (pariskv_attend.cu) and the host store (offload/) against
// CPU references on fresh random inputs, then timed: the QKV post-processing with its
// write-through, the attention over sink + selected + window with the zone in pinned host memory
// (UVA, bf16 or fp8 rows) or in the device cache, the ring of the device cache past its wrap, the
// rows of a prompt converted to the host store. Needs a GPU. Each attention output is checked
// against its own bound, and a reference that drops or duplicates one selected row must reject
// the GPU's output (mutants that must fail). PKV_TEST_QUICK=1: no timings; PKV_TEST_TRIALS=N: the
// attention cases N times on fresh draws; PKV_TEST_MUTANT=1: the GPU attends one wrong selected
// row in every attention case, and each of those checks must fail (see mutant_mode).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <vector>

#include <cuda.h> // the VMM API's types (entry points fetched at run time: no -lcuda)

#include "cuda_common.h"
#include "kernels.h"
#include "pariskv_attend.h"
#include "../offload/host_store.h"
#include "../offload/fp8.h"
extern "C" {
#include "../model/bf16.h"
}

static int passed, failed;
static unsigned long long rng = 0x9E3779B97F4A7C15ull;

static float frand(void) { // uniform [-1, 1)
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

static void check(bool ok, const char *fmt, double a, double b) {
    printf("%s ", ok ? "ok  " : "FAIL");
    printf(fmt, a, b);
    printf("\n");
    ok ? passed++ : failed++;
}

static float bf(uint16_t b) { return bf16_to_f32(b); }

// A device cache (K and V, n bf16 values each) of random values, kept on the host too for the
// reference; K and V drawn in turn, value by value.
static void random_cache(size_t n, std::vector<uint16_t> &kh, std::vector<uint16_t> &vh, bf16 **kc, bf16 **vc) {
    kh.resize(n), vh.resize(n);
    for (size_t i = 0; i < n; i++) kh[i] = f32_to_bf16(frand()), vh[i] = f32_to_bf16(frand());
    CU_CHECK(cudaMalloc(kc, n * 2));
    CU_CHECK(cudaMalloc(vc, n * 2));
    CU_CHECK(cudaMemcpy(*kc, kh.data(), n * 2, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(*vc, vh.data(), n * 2, cudaMemcpyHostToDevice));
}

// The device cache's slot of position p (pariskv_attend.h).
static int slot_of(int p, int S, int dcap) { return p < S ? p : S + (p - S) % (dcap - S); }

// ---- QKV post-processing ----
// Tolerances: q is fp32 from the same fp32 inputs (a sum of hd squares and a few products):
// 4 hd u32 relative = 3e-5 at hd 128. The stored bf16 K/V: the device rounds its fp32 value,
// which differs from the double reference by the same 3e-5 relative: at most one bf16 step
// (2^-8 relative) apart from bf16(reference).
static void test_qkv(int hd, int n_heads, int n_kv, int qk_norm, int host, int pos) {
    int S = 4, dcap = 64, L = 3, layer = 1;
    size_t nq = (size_t)(n_heads + 2 * n_kv) * hd;
    std::vector<float> qkv(nq), qn(hd), kn(hd), inv(hd / 2), cs(hd);
    for (auto &x : qkv) x = 2 * frand();
    for (int j = 0; j < hd; j++) qn[j] = 1 + 0.5f * frand(), kn[j] = 1 + 0.5f * frand();
    for (int j = 0; j < hd / 2; j++) inv[j] = powf(10000.0f, -2.0f * j / hd);
    for (int j = 0; j < hd / 2; j++) cs[j] = cosf(pos * inv[j]), cs[hd / 2 + j] = sinf(pos * inv[j]);
    float *d_qkv, *d_qn, *d_kn, *d_cs, *d_q;
    int *d_pos;
    bf16 *kc, *vc;
    size_t cache = (size_t)L * n_kv * dcap * hd;
    CU_CHECK(cudaMalloc(&d_qkv, nq * 4));
    CU_CHECK(cudaMalloc(&d_qn, hd * 4));
    CU_CHECK(cudaMalloc(&d_kn, hd * 4));
    CU_CHECK(cudaMalloc(&d_cs, hd * 4));
    CU_CHECK(cudaMalloc(&d_q, (size_t)n_heads * hd * 4));
    CU_CHECK(cudaMalloc(&d_pos, 4));
    CU_CHECK(cudaMalloc(&kc, cache * 2));
    CU_CHECK(cudaMalloc(&vc, cache * 2));
    CU_CHECK(cudaMemset(kc, 0, cache * 2));
    CU_CHECK(cudaMemset(vc, 0, cache * 2));
    CU_CHECK(cudaMemcpy(d_qkv, qkv.data(), nq * 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(d_qn, qn.data(), hd * 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(d_kn, kn.data(), hd * 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(d_cs, cs.data(), hd * 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(d_pos, &pos, 4, cudaMemcpyHostToDevice));
    HostStore hs;
    memset(&hs, 0, sizeof hs);
    char err[256];
    void *hrows = NULL;
    if (host) {
        if (host_store_open(&hs, L, n_kv, hd, host == 2, pos + 8, err) != 0 || host_store_grow(&hs, pos + 1, err) != 0) {
            printf("FAIL host store: %s\n", err);
            failed++;
            return;
        }
        hrows = hs.base;
    }
    GpuKV kv = {kc, vc, hrows, L, n_kv, hd, dcap, S, 0, host == 2};
    CU_CHECK(pkv_qkv_decode(d_q, d_qkv, qk_norm ? d_qn : NULL, qk_norm ? d_kn : NULL, d_cs, kv, layer, d_pos, n_heads, 1e-6f, 0));
    CU_CHECK(cudaDeviceSynchronize());
    std::vector<float> q((size_t)n_heads * hd);
    std::vector<uint16_t> kh(cache), vh(cache);
    CU_CHECK(cudaMemcpy(q.data(), d_q, q.size() * 4, cudaMemcpyDeviceToHost));
    CU_CHECK(cudaMemcpy(kh.data(), kc, cache * 2, cudaMemcpyDeviceToHost));
    CU_CHECK(cudaMemcpy(vh.data(), vc, cache * 2, cudaMemcpyDeviceToHost));
    // reference, double
    auto post = [&](const float *x, const float *w, std::vector<double> &o) {
        o.assign(hd, 0);
        double ss = 0;
        for (int j = 0; j < hd; j++) ss += (double)x[j] * x[j];
        double r = 1 / sqrt(ss / hd + 1e-6);
        std::vector<double> y(hd);
        for (int j = 0; j < hd; j++) y[j] = w ? w[j] * (x[j] * r) : x[j];
        for (int j = 0; j < hd; j++) {
            int f = j % (hd / 2);
            double c = cs[f], s = cs[hd / 2 + f], other = y[j ^ (hd / 2)];
            o[j] = j < hd / 2 ? y[j] * c - other * s : y[j] * c + other * s;
        }
    };
    double eq = 0, mq = 1e-30;
    std::vector<double> o;
    for (int h = 0; h < n_heads; h++) {
        post(&qkv[(size_t)h * hd], qk_norm ? qn.data() : NULL, o);
        for (int j = 0; j < hd; j++) eq = fmax(eq, fabs(q[(size_t)h * hd + j] - o[j])), mq = fmax(mq, fabs(o[j]));
    }
    char what[160];
    snprintf(what, sizeof what, "pkv_qkv_decode hd %d, %d/%d heads, qk_norm %d, pos %d: q rel err %%.2e (tol %%.0e)", hd, n_heads, n_kv, qk_norm, pos);
    check(eq / mq <= 4 * hd * 6e-8, what, eq / mq, 4 * hd * 6e-8);
    int bad = 0, bad_host = 0;
    int sl = slot_of(pos, S, dcap);
    for (int h = 0; h < n_kv; h++) {
        post(&qkv[(size_t)(n_heads + h) * hd], qk_norm ? kn.data() : NULL, o);
        const float *v = &qkv[(size_t)(n_heads + n_kv + h) * hd];
        size_t off = (((size_t)layer * n_kv + h) * dcap + sl) * hd;
        const char *row = host ? (const char *)hs.base + (((size_t)(pos - S) * L + layer) * n_kv + h) * hs.row_bytes : NULL;
        std::vector<float> kf(hd), vf(hd);
        for (int j = 0; j < hd; j++) {
            bad += fabs(bf(kh[off + j]) - o[j]) > fabs(o[j]) * (1.0 / 128) + 1e-30;
            bad += fabs(bf(vh[off + j]) - v[j]) > fabs(v[j]) * (1.0 / 128) + 1e-30;
            if (host == 1 && pos >= S) bad_host += ((const uint16_t *)row)[j] != kh[off + j] || ((const uint16_t *)row)[hd + j] != vh[off + j];
            kf[j] = bf(kh[off + j]), vf[j] = bf(vh[off + j]);
        }
        if (host == 2 && pos >= S) { // the row's codes and scales: fp8_quantize_row of the cache's bf16 values, bit for bit
            std::vector<uint8_t> kc8(hd), vc8(hd);
            float ks = fp8_quantize_row(kf.data(), hd, kc8.data()), vs = fp8_quantize_row(vf.data(), hd, vc8.data()), gs[2];
            memcpy(gs, row + 2 * hd, 8);
            bad_host += memcmp(row, kc8.data(), hd) != 0, bad_host += memcmp(row + hd, vc8.data(), hd) != 0;
            bad_host += memcmp(&gs[0], &ks, 4) != 0, bad_host += memcmp(&gs[1], &vs, 4) != 0;
        }
    }
    snprintf(what, sizeof what, "pkv_qkv_decode hd %d pos %d (slot %d of %d): stored K/V beyond one bf16 step: %%.0f; host row (%s) != cache row: %%.0f",
             hd, pos, sl, dcap, host == 2 ? "fp8, codes and scales" : "bf16");
    check(bad == 0 && bad_host == 0, what, bad, bad_host);
    if (host) host_store_close(&hs);
    cudaFree(d_qkv), cudaFree(d_qn), cudaFree(d_kn), cudaFree(d_cs), cudaFree(d_q), cudaFree(d_pos), cudaFree(kc), cudaFree(vc);
}

// ---- attention over sink + selected + window ----
// Bound, per output element against its own magnitude (pariskv_attend.cu's arithmetic, u =
// 2^-24): the rows are the same bf16 (fp8-decoded) values on both sides. A row's score is a
// dot product of 8 products a lane, summed in order, then over log2(hd/8) shuffle levels, with
// q pre-scaled by rsqrtf(hd) log2(e) (2 ulp, then 3 roundings): its error is within (8 +
// log2(hd/8) + 8) u of its sum of |q_j k_j| (in log2 units); exp2f's argument (s - running max)
// rounds by u |s - max| over the chain, and each exp2f is within 2 ulp (4 u). The sums are
// chains, not one long sum: a stream takes at most the block's rows of each list (rows / splits,
// the split's share), the block then combines its <= 16 streams (128 threads, >= 8 lanes a row),
// the last block merges the splits: depth d = ceil(n1 / splits) + ceil(n2 / splits) + 16 +
// splits + 2. Each level multiplies by a rescale factor (an exp2f: 4 u, the product: u) and adds
// (u): 6 u. So row i's weight in the numerator and the denominator is off by at most
// theta_i = ln 2 (score error + u (max - s_i)) + (6 d + 5) u, and the fp32 output by
// E_j = sum_i p_i theta_i (|v_ij| + |o_j|) / (sum_i p_i (1 - max theta)) + u |o_j| (the division);
// the bf16 output rounds by 2^-8 of itself: tol_j = E_j + 2^-8 (|o_j| + E_j). The old bound,
// 2^-9 + 4 m u against max|V| = 1 (~2.6e-3), was 5-10% of the outputs themselves (~0.02-0.05)
// and let a dropped or a duplicated row through; this one is ~2^-8 |o| + a few 1e-5 (a row of
// k = 2048 moves outputs by ~|v - o| / m ~ 2e-4): the two mutants below must fail it.
static const double U32 = 5.9604644775390625e-8;

// The double reference of one query head qh over rows kr, vr (m rows of hd, the kernel's list
// order) and each element's bound: n1 of the rows in the first list (sink + window), the rest
// selected; splits as the kernel's.
static void attend_ref(const float *qh, const std::vector<float> &kr, const std::vector<float> &vr, int hd, int n1, int splits,
                       double *o, double *tol) {
    int m = (int)(kr.size() / hd), n2 = m - n1;
    int depth = (n1 + splits - 1) / splits + (n2 + splits - 1) / splits + 16 + splits + 2;
    double sc2 = 1.4426950408889634 / sqrt((double)hd), dot_u = (16 + log2(hd / 8.0)) * U32;
    std::vector<double> s(m), p(m), th(m);
    double mx = -1e300, P = 0, thmax = 0;
    for (int i = 0; i < m; i++) {
        double d = 0, a = 0;
        for (int j = 0; j < hd; j++) d += (double)qh[j] * kr[(size_t)i * hd + j], a += fabs((double)qh[j] * kr[(size_t)i * hd + j]);
        s[i] = d * sc2, th[i] = dot_u * a * sc2; // log2 units
        mx = fmax(mx, s[i]);
    }
    for (int i = 0; i < m; i++) {
        p[i] = exp2(s[i] - mx), P += p[i];
        th[i] = log(2.0) * (th[i] + U32 * (mx - s[i])) + (6.0 * depth + 5) * U32;
        thmax = fmax(thmax, th[i]);
    }
    for (int j = 0; j < hd; j++) {
        double num = 0, e = 0;
        for (int i = 0; i < m; i++) num += p[i] * vr[(size_t)i * hd + j];
        o[j] = num / P;
        for (int i = 0; i < m; i++) e += p[i] * th[i] * (fabs(vr[(size_t)i * hd + j]) + fabs(o[j]));
        e = e / (P * (1 - thmax)) + U32 * fabs(o[j]);
        tol[j] = e + (fabs(o[j]) + e) / 256;
    }
}

// max over one query head's hd outputs of |got - o| / tol (a non-finite output: infinite).
static double worst_ratio(const uint16_t *got, const double *o, const double *tol, int hd) {
    double r = 0;
    for (int j = 0; j < hd; j++) {
        double g = bf(got[j]);
        r = isfinite(g) ? fmax(r, fabs(g - o[j]) / tol[j]) : INFINITY;
    }
    return r;
}

// PKV_TEST_MUTANT=1: each attention case gives the GPU one selected slot of KV head 0 replaced by
// a slot it did not select (the reference keeps the true selection): every such case must fail.
static bool mutant_mode;
static int mutants_planted, mutants_flagged;

struct AttnCase {
    int hd, n_heads, n_kv, k, host, dcap, pos, zone_end;
};

static void test_attend(AttnCase c, int timed) {
    int S = 4, L = 2, layer = 1, G = c.n_heads / c.n_kv, n_zone = c.zone_end - S, kmax = c.k;
    size_t cache = (size_t)L * c.n_kv * c.dcap * c.hd;
    std::vector<uint16_t> kh, vh;
    bf16 *kc, *vc;
    random_cache(cache, kh, vh, &kc, &vc);
    HostStore hs;
    memset(&hs, 0, sizeof hs);
    char err[256];
    // host 1: bf16 rows, 2: fp8 rows (codes of random values and their scales); host_f: every
    // host row's values as the GPU reads them, (n_zone, L, n_kv, [K | V]) floats.
    std::vector<float> host_f;
    if (c.host) {
        if (host_store_open(&hs, L, c.n_kv, c.hd, c.host == 2, n_zone + 16, err) != 0 || host_store_grow(&hs, n_zone, err) != 0) {
            printf("FAIL host store: %s\n", err);
            failed++;
            return;
        }
        size_t rows = (size_t)n_zone * L * c.n_kv;
        host_f.resize(rows * 2 * c.hd);
        std::vector<float> x(c.hd);
        for (size_t r = 0; r < rows; r++) {
            char *row = (char *)hs.base + r * hs.row_bytes;
            for (int kvp = 0; kvp < 2; kvp++) {
                float *f = &host_f[(r * 2 + kvp) * c.hd];
                if (c.host == 1)
                    for (int j = 0; j < c.hd; j++) ((uint16_t *)row)[kvp * c.hd + j] = f32_to_bf16(frand()), f[j] = bf(((uint16_t *)row)[kvp * c.hd + j]);
                else {
                    for (int j = 0; j < c.hd; j++) x[j] = frand() * (kvp ? 1.0f : 3.0f);
                    float sc = fp8_quantize_row(x.data(), c.hd, (uint8_t *)row + kvp * c.hd);
                    memcpy(row + 2 * c.hd + 4 * kvp, &sc, 4);
                    fp8_dequantize_row((uint8_t *)row + kvp * c.hd, sc, c.hd, f);
                }
            }
        }
    }
    GpuKV kv = {kc, vc, c.host ? hs.base : NULL, L, c.n_kv, c.hd, c.dcap, S, 0, c.host == 2};
    // a random selection of distinct zone slots per head, ascending (as the selection writes it)
    std::vector<int> sel((size_t)c.n_kv * kmax), nsel(c.n_kv);
    for (int h = 0; h < c.n_kv; h++) {
        int cnt = std::min(c.k - (h % 2) * 3, n_zone); // heads with fewer rows too
        nsel[h] = cnt;
        std::vector<int> all(n_zone);
        for (int i = 0; i < n_zone; i++) all[i] = i;
        for (int i = 0; i < cnt; i++) std::swap(all[i], all[i + (int)((frand() + 1) * 0.5f * (n_zone - i - 1))]);
        std::sort(all.begin(), all.begin() + cnt);
        for (int i = 0; i < cnt; i++) sel[(size_t)h * kmax + i] = all[i];
    }
    std::vector<float> q((size_t)c.n_heads * c.hd);
    for (auto &x : q) x = 2 * frand();
    // KV head h's rows as the GPU reads them, appended to kr, vr: position p of the device cache,
    // or zone slot s (the host store's row, or the device cache's).
    auto cache_row = [&](int h, int p, std::vector<float> &kr, std::vector<float> &vr) {
        size_t o = (((size_t)layer * c.n_kv + h) * c.dcap + slot_of(p, S, c.dcap)) * c.hd;
        for (int j = 0; j < c.hd; j++) kr.push_back(bf(kh[o + j])), vr.push_back(bf(vh[o + j]));
    };
    auto zone_row = [&](int h, int s, std::vector<float> &kr, std::vector<float> &vr) {
        if (!c.host) return cache_row(h, S + s, kr, vr);
        const float *f = &host_f[((((size_t)s * L + layer) * c.n_kv + h) * 2) * c.hd];
        kr.insert(kr.end(), f, f + c.hd), vr.insert(vr.end(), f + c.hd, f + 2 * c.hd);
    };
    // The mutants' row, place im of KV head 0's selection: the middle one, a typical row (K in
    // [-1, 1]: flat scores, weight ~1/m, it moves outputs by ~|v - o| / m). fp8 rows hold K up to
    // 3 (peaked scores: a typical row weighs ~1/(7 m), below the bf16 rounding of |o| ~ 0.1 --
    // no bound on a bf16 output sees it): the selected row of largest weight for query head 0.
    int im = nsel[0] / 2;
    if (c.host == 2) {
        double best = -INFINITY;
        for (int i = 0; i < nsel[0]; i++) {
            std::vector<float> kr, vr;
            zone_row(0, sel[i], kr, vr);
            double d = 0;
            for (int j = 0; j < c.hd; j++) d += (double)q[j] * kr[j];
            if (d > best) best = d, im = i;
        }
    }
    // PKV_TEST_MUTANT: the GPU gets head 0's selected slot im replaced by the first slot it did
    // not select (the reference keeps the true selection).
    std::vector<int> sel_gpu(sel);
    int planted = -1;
    if (mutant_mode)
        for (int s = 0, i = 0; s < n_zone && planted < 0; s++) {
            while (i < nsel[0] && sel[i] < s) i++;
            if (i == nsel[0] || sel[i] != s) planted = s, sel_gpu[im] = s;
        }
    int *d_sel = NULL, *d_nsel, *d_pos, *d_meta;
    float *d_q, *partial;
    unsigned *counters;
    bf16 *d_out;
    CU_CHECK(cudaMalloc(&d_sel, sel.size() * 4));
    CU_CHECK(cudaMalloc(&d_nsel, nsel.size() * 4));
    CU_CHECK(cudaMalloc(&d_pos, 4));
    CU_CHECK(cudaMalloc(&d_meta, 8));
    CU_CHECK(cudaMalloc(&d_q, q.size() * 4));
    CU_CHECK(cudaMalloc(&d_out, q.size() * 2));
    CU_CHECK(cudaMalloc(&partial, pkv_attend_scratch_floats(c.n_heads, c.n_kv, c.hd, kmax) * 4));
    CU_CHECK(cudaMalloc(&counters, c.n_kv * 4));
    CU_CHECK(cudaMemset(counters, 0, c.n_kv * 4));
    int meta[2] = {c.zone_end, n_zone};
    CU_CHECK(cudaMemcpy(d_sel, sel_gpu.data(), sel.size() * 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(d_nsel, nsel.data(), nsel.size() * 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(d_pos, &c.pos, 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(d_meta, meta, 8, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(d_q, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemset(d_out, 0xff, q.size() * 2)); // poisoned: NaN
    CU_CHECK(pkv_attend(d_out, d_q, d_sel, d_nsel, kmax, kv, layer, d_pos, d_meta, c.n_heads, partial, counters, 0));
    CU_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> out(q.size());
    CU_CHECK(cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost));
    // reference: rows in the kernel's list order, softmax in double; each output against its bound
    int splits = pkv_attend_splits(c.n_kv, c.hd, kmax), m_rows = 0;
    double worst = 0, err_max = 0, mut[2] = {0, 0};
    std::vector<double> o(c.hd), tol(c.hd);
    for (int h = 0; h < c.n_kv; h++) {
        std::vector<float> kr, vr; // the rows' values, in the kernel's list order
        int ns_rows = 0;
        for (int p = 0; p < S && p <= c.pos; p++) cache_row(h, p, kr, vr), ns_rows++;
        for (int i = 0; i < nsel[h]; i++) zone_row(h, sel[(size_t)h * kmax + i], kr, vr);
        for (int p = c.zone_end; p <= c.pos; p++) cache_row(h, p, kr, vr);
        int m = (int)(kr.size() / c.hd), n1 = m - nsel[h];
        m_rows = std::max(m_rows, m);
        for (int g = 0; g < G; g++) {
            const uint16_t *got = &out[(size_t)(h * G + g) * c.hd];
            attend_ref(&q[(size_t)(h * G + g) * c.hd], kr, vr, c.hd, n1, splits, o.data(), tol.data());
            worst = fmax(worst, worst_ratio(got, o.data(), tol.data(), c.hd));
            for (int j = 0; j < c.hd; j++) err_max = isfinite(bf(got[j])) ? fmax(err_max, fabs(bf(got[j]) - o[j])) : INFINITY;
        }
        if (h != 0 || mutant_mode) continue;
        // The mutants: the reference without row im of the selection, then with it twice; each
        // must reject the GPU's output (some element beyond its bound).
        size_t r = (size_t)(ns_rows + im) * c.hd;
        for (int x = 0; x < 2; x++) {
            std::vector<float> km(kr), vm(vr);
            if (x == 0) km.erase(km.begin() + r, km.begin() + r + c.hd), vm.erase(vm.begin() + r, vm.begin() + r + c.hd);
            else km.insert(km.begin() + r, kr.begin() + r, kr.begin() + r + c.hd), vm.insert(vm.begin() + r, vr.begin() + r, vr.begin() + r + c.hd);
            for (int g = 0; g < G; g++) {
                attend_ref(&q[(size_t)g * c.hd], km, vm, c.hd, n1, splits, o.data(), tol.data());
                mut[x] = fmax(mut[x], worst_ratio(&out[(size_t)g * c.hd], o.data(), tol.data(), c.hd));
            }
        }
    }
    const char *zone = c.host == 2 ? "host fp8" : c.host ? "host" : "gpu";
    char what[240];
    snprintf(what, sizeof what, "pkv_attend hd %d, %d/%d heads, k %d, zone %s, pos %d (device cache %d: %s), up to %d rows: "
             "max |err| / tol %%.3f per element (max |err| %%.2e)", c.hd, c.n_heads, c.n_kv, c.k, zone, c.pos, c.dcap,
             c.pos >= c.dcap ? "wrapped" : "no wrap", m_rows);
    check(worst <= 1.0, what, worst, err_max);
    if (mutant_mode && planted >= 0) {
        mutants_planted++, mutants_flagged += !(worst <= 1.0);
        printf("     (mutant: the GPU read slot %d for head 0's selected slot %d: this check %s)\n", planted, sel[im],
               !(worst <= 1.0) ? "flagged it" : "MISSED it");
    }
    if (!mutant_mode) {
        snprintf(what, sizeof what, "pkv_attend %s k %d, mutants of head 0's selected row %d (slot %d, %s): the reference without it "
                 "rejects the GPU output (max |err| / tol %%.2f > 1), with it twice too (%%.2f > 1)", zone, c.k, im, sel[im],
                 c.host == 2 ? "largest weight" : "the middle one");
        check(mut[0] > 1.0 && mut[1] > 1.0, what, mut[0], mut[1]);
    }
    if (timed) {
        cudaEvent_t a, b;
        cudaEventCreate(&a), cudaEventCreate(&b);
        std::vector<float> t(50);
        for (int i = 0; i < 60; i++) {
            cudaEventRecord(a, 0);
            pkv_attend(d_out, d_q, d_sel, d_nsel, kmax, kv, layer, d_pos, d_meta, c.n_heads, partial, counters, 0);
            cudaEventRecord(b, 0);
            cudaEventSynchronize(b);
            if (i >= 10) cudaEventElapsedTime(&t[i - 10], a, b);
        }
        std::sort(t.begin(), t.end());
        double zone_bytes = 0;
        for (int h = 0; h < c.n_kv; h++) zone_bytes += nsel[h] * (c.host == 2 ? 2.0 * c.hd + 8 : 4.0 * c.hd);
        printf("time pkv_attend %s k %d, %d KV heads: %.1f us (median of 50); zone rows %.0f KB -> %.1f GB/s\n",
               c.host == 2 ? "host fp8" : c.host ? "host" : "gpu",
               c.k, c.n_kv, t[25] * 1e3, zone_bytes / 1e3, zone_bytes / (t[25] * 1e-3) / 1e9);
        cudaEventDestroy(a), cudaEventDestroy(b);
    }
    if (c.host) host_store_close(&hs);
    cudaFree(kc), cudaFree(vc), cudaFree(d_sel), cudaFree(d_nsel), cudaFree(d_pos), cudaFree(d_meta), cudaFree(d_q), cudaFree(d_out);
    cudaFree(partial), cudaFree(counters);
}

// ---- rows to the host store: an exact copy ----
static void test_rows_to_host(int fp8) {
    int S = 4, L = 3, n_kv = 2, hd = 64, dcap = 300, p0 = 2, p1 = 257;
    size_t cache = (size_t)L * n_kv * dcap * hd;
    std::vector<uint16_t> kh, vh;
    bf16 *kc, *vc;
    random_cache(cache, kh, vh, &kc, &vc);
    HostStore hs;
    char err[256];
    if (host_store_open(&hs, L, n_kv, hd, fp8, dcap, err) != 0 || host_store_grow(&hs, p1, err) != 0) {
        printf("FAIL host store: %s\n", err);
        failed++;
        return;
    }
    GpuKV kv = {kc, vc, hs.base, L, n_kv, hd, dcap, S, 0, fp8};
    CU_CHECK(pkv_rows_to_host(kv, p0, p1, 0));
    CU_CHECK(cudaDeviceSynchronize());
    long bad = 0;
    std::vector<float> x(hd);
    std::vector<uint8_t> c8(hd);
    for (int p = S; p < p1; p++)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < n_kv; h++) {
                const char *r = (const char *)hs.base + (((size_t)(p - S) * L + l) * n_kv + h) * hs.row_bytes;
                size_t o = (((size_t)l * n_kv + h) * dcap + p) * hd;
                if (!fp8) {
                    for (int j = 0; j < hd; j++) bad += ((const uint16_t *)r)[j] != kh[o + j] || ((const uint16_t *)r)[hd + j] != vh[o + j];
                    continue;
                }
                for (int kvp = 0; kvp < 2; kvp++) { // codes and scale: fp8_quantize_row of the cache row
                    for (int j = 0; j < hd; j++) x[j] = bf((kvp ? vh : kh)[o + j]);
                    float sc = fp8_quantize_row(x.data(), hd, c8.data());
                    for (int j = 0; j < hd; j++) bad += (uint8_t)r[kvp * hd + j] != c8[j];
                    bad += memcmp(r + 2 * hd + 4 * kvp, &sc, 4) != 0;
                }
            }
    char what[160];
    snprintf(what, sizeof what, "pkv_rows_to_host %s: positions 4..256 of 3 layers: %%.0f values differ (of %%.0f)",
             fp8 ? "fp8 (codes and scales bit-exact)" : "bf16 (an exact copy)");
    check(bad == 0, what, (double)bad, (double)(p1 - S) * L * n_kv * 2 * hd);
    printf("host store: %ld slots of %zu bytes per chunk registration\n", hs.chunk_slots, hs.slot_bytes);
    host_store_close(&hs);
    cudaFree(kc), cudaFree(vc);
}
// ---- where the host store's memory comes from: registered THP mapping vs cudaHostAlloc ----
// Timing only: the k = 2048 fetch of one layer (8 KV heads) from random rows of a 16 GiB store,
// the GPU's page-table reach being what a long context stresses and a small store does not.
static double huge_pages_gib(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb / 1048576.0;
}

// Host memory through the virtual memory API: cuMemCreate with a host location, mapped and
// made accessible to the device (the GPU may then map it with the allocation's granularity).
// NULL with a note when the driver refuses.
static void *vmm_host_alloc(size_t bytes, size_t *gran) {
    typedef CUresult (*Gran)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    typedef CUresult (*Reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    typedef CUresult (*Create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    typedef CUresult (*Map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    typedef CUresult (*Access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    void *f[5] = {NULL};
    const char *names[5] = {"cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess"};
    for (int i = 0; i < 5; i++)
        if (cudaGetDriverEntryPointByVersion(names[i], &f[i], 12000, cudaEnableDefault, NULL) != cudaSuccess || !f[i]) {
            printf("note: no driver entry point %s\n", names[i]);
            return NULL;
        }
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    size_t g = 0, gmin = 0;
    CUresult r = ((Gran)f[0])(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r == CUDA_SUCCESS) r = ((Gran)f[0])(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    bytes = (bytes + g - 1) / (g ? g : 1) * g;
    if (r == CUDA_SUCCESS) r = ((Reserve)f[1])(&va, bytes, g, 0, 0);
    if (r == CUDA_SUCCESS) r = ((Create)f[2])(&h, bytes, &prop, 0);
    if (r == CUDA_SUCCESS) r = ((Map)f[3])(va, bytes, 0, h, 0);
    CUmemAccessDesc acc[2];
    memset(acc, 0, sizeof acc);
    acc[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE, acc[0].location.id = 0, acc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    acc[1].location.type = CU_MEM_LOCATION_TYPE_HOST, acc[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (r == CUDA_SUCCESS) r = ((Access)f[4])(va, bytes, acc, 2);
    if (r != CUDA_SUCCESS) {
        printf("note: cuMemCreate on the host (granularity %zu / %zu): error %d\n", gmin, g, (int)r);
        return NULL;
    }
    *gran = g;
    printf("VMM host allocation: granularity min %zu, recommended %zu bytes\n", gmin, g);
    return (void *)va;
}

// mode 0: the runner's host store (mmap + MADV_HUGEPAGE + cudaHostRegister), 1: cudaHostAlloc,
// 2: cuMemCreate on the host (VMM). Not freed in mode 2 (a timing run's end frees it).
static void time_big_store(int mode) {
    int S = 4, L = 2, n_kv = 8, hd = 128, n_heads = 32, k = 2048, dcap = 1300, pos = 20784, zone_end = 20084;
    long slots = (16L << 30) / ((long)L * n_kv * 2 * hd * 2);
    HostStore hs;
    memset(&hs, 0, sizeof hs);
    char err[256];
    bf16 *rows = NULL;
    double t0 = 0;
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t0 = ts.tv_sec + ts.tv_nsec * 1e-9;
    size_t vmm_gran = 0;
    if (mode == 2) {
        rows = (bf16 *)vmm_host_alloc((size_t)slots * L * n_kv * 2 * hd * 2, &vmm_gran);
        if (!rows) return;
    } else if (mode == 1) {
        if (cudaHostAlloc((void **)&rows, (size_t)slots * L * n_kv * 2 * hd * 2, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
            printf("note: cudaHostAlloc of 16 GiB failed\n");
            return;
        }
    } else {
        if (host_store_open(&hs, L, n_kv, hd, 0, slots, err) != 0 || host_store_grow(&hs, slots, err) != 0) {
            printf("note: host store of 16 GiB: %s\n", err);
            return;
        }
        rows = (bf16 *)hs.base;
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double alloc_s = ts.tv_sec + ts.tv_nsec * 1e-9 - t0;
    size_t cache = (size_t)L * n_kv * dcap * hd;
    bf16 *kc, *vc;
    CU_CHECK(cudaMalloc(&kc, cache * 2));
    CU_CHECK(cudaMalloc(&vc, cache * 2));
    GpuKV kv = {kc, vc, rows, L, n_kv, hd, dcap, S, 0, 0};
    CU_CHECK(pkv_fill_random(kv, (int)slots, 77, 0));
    std::vector<int> sel((size_t)n_kv * k), nsel(n_kv, k);
    for (auto &x : sel) x = (int)((frand() + 1) * 0.5 * (slots - 1));
    std::vector<float> q((size_t)n_heads * hd);
    for (auto &x : q) x = frand();
    int *d_sel, *d_nsel, *d_pos, *d_meta;
    float *d_q, *partial;
    unsigned *counters;
    bf16 *d_out;
    int meta[2] = {zone_end, zone_end - S};
    CU_CHECK(cudaMalloc(&d_sel, sel.size() * 4));
    CU_CHECK(cudaMalloc(&d_nsel, n_kv * 4));
    CU_CHECK(cudaMalloc(&d_pos, 4));
    CU_CHECK(cudaMalloc(&d_meta, 8));
    CU_CHECK(cudaMalloc(&d_q, q.size() * 4));
    CU_CHECK(cudaMalloc(&d_out, q.size() * 2));
    CU_CHECK(cudaMalloc(&partial, pkv_attend_scratch_floats(n_heads, n_kv, hd, k) * 4));
    CU_CHECK(cudaMalloc(&counters, n_kv * 4));
    CU_CHECK(cudaMemset(counters, 0, n_kv * 4));
    CU_CHECK(cudaMemcpy(d_nsel, nsel.data(), n_kv * 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(d_pos, &pos, 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(d_meta, meta, 8, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(d_q, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    std::vector<float> t(40);
    for (int i = 0; i < 50; i++) {
        for (auto &x : sel) x = (int)((frand() + 1) * 0.5 * (slots - 1)); // fresh rows each time, as each step
        CU_CHECK(cudaMemcpy(d_sel, sel.data(), sel.size() * 4, cudaMemcpyHostToDevice));
        cudaEventRecord(a, 0);
        pkv_attend(d_out, d_q, d_sel, d_nsel, k, kv, 1, d_pos, d_meta, n_heads, partial, counters, 0);
        cudaEventRecord(b, 0);
        cudaEventSynchronize(b);
        if (i >= 10) cudaEventElapsedTime(&t[i - 10], a, b);
    }
    std::sort(t.begin(), t.end());
    double bytes = (double)n_kv * k * 4 * hd;
    printf("time 16 GiB store from %s (set up in %.1f s; huge pages in this process %.1f GiB): k 2048 x 8 heads, fresh random rows: "
           "%.1f us, %.1f GB/s\n", mode == 2 ? "cuMemCreate (host)" : mode == 1 ? "cudaHostAlloc" : "mmap + MADV_HUGEPAGE + cudaHostRegister", alloc_s,
           huge_pages_gib(), t[20] * 1e3, bytes / (t[20] * 1e-3) / 1e9);
    if (mode == 1) cudaFreeHost(rows);
    else if (mode == 0) host_store_close(&hs);
    cudaFree(kc), cudaFree(vc), cudaFree(d_sel), cudaFree(d_nsel), cudaFree(d_pos), cudaFree(d_meta), cudaFree(d_q), cudaFree(d_out);
    cudaFree(partial), cudaFree(counters);
    cudaEventDestroy(a), cudaEventDestroy(b);
}

int main(void) {
    int quick = getenv("PKV_TEST_QUICK") != NULL;
    const char *mut = getenv("PKV_TEST_MUTANT"), *tr = getenv("PKV_TEST_TRIALS");
    mutant_mode = mut && *mut && strcmp(mut, "0");
    int trials = tr ? std::max(1, atoi(tr)) : 1; // PKV_TEST_TRIALS: the attention cases again on fresh draws
    printf("seed %llu\n", rng);
    if (mutant_mode) printf("PKV_TEST_MUTANT: the GPU attends one wrong selected row in every pkv_attend case: each of those checks must FAIL\n");
    for (int hd : {64, 128})
        for (int host : {0, 1, 2}) {
            test_qkv(hd, 9, 3, 0, host, 40);  // SmolLM2's grouping, no wrap
            test_qkv(hd, 8, 2, 1, host, 131); // Qwen3-style QK norms, past the ring's wrap (dcap 64)
        }
    test_rows_to_host(0);
    test_rows_to_host(1);
    // SmolLM2 (9 / 3 x 64) and Llama-3.1-8B (32 / 8 x 128) groupings; zone in the host store or
    // the device cache; positions before and after the ring wraps.
    for (int t = 0; t < trials; t++) {
        test_attend({64, 9, 3, 100, 1, 1200, 3000, 2600}, 0);
        test_attend({64, 9, 3, 100, 0, 3001, 3000, 2600}, 0);
        test_attend({128, 32, 8, 100, 1, 1200, 5000, 4300}, 0);
        test_attend({128, 32, 8, 2048, 1, 1200, 9000, 8300}, 0);
        test_attend({128, 32, 8, 100, 0, 5001, 5000, 4300}, 0);
        test_attend({128, 16, 8, 7, 1, 900, 700, 200}, 0); // few rows, G = 2, no wrap
        test_attend({64, 9, 3, 100, 2, 1200, 3000, 2600}, 0); // fp8 host rows
        test_attend({128, 32, 8, 2048, 2, 1200, 9000, 8300}, 0);
    }
    if (!quick && !mutant_mode) {
        printf("-- timing (Llama-3.1-8B shape, one layer)\n");
        test_attend({128, 32, 8, 100, 1, 1300, 20784, 20084}, 1);
        test_attend({128, 32, 8, 2048, 1, 1300, 20784, 20084}, 1);
        test_attend({128, 32, 8, 100, 0, 20800, 20700, 20100}, 1);
        test_attend({128, 32, 8, 100, 2, 1300, 20784, 20084}, 1);
        test_attend({128, 32, 8, 2048, 2, 1300, 20784, 20084}, 1);
        if (getenv("PKV_TEST_BIG_STORE")) time_big_store(2), time_big_store(0), time_big_store(1);
    }
    if (mutant_mode) printf("mutant: flagged in %d of %d planted cases (every one must be)\n", mutants_flagged, mutants_planted);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
