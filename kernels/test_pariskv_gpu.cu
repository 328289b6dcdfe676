// ParisKV's GPU kernels (pariskv_gpu.cu) against the CPU reference (attention/pariskv_*.c) on
// fresh random inputs (fixed seeds, printed): the encoder (device layout, the host store's
// layout through UVA, an unaligned view, the fp8 store's rows), the query transform, and each stage of the selection
// fed the same inputs as the CPU (bonus tables, scores, candidate set and the GPU's candidate
// count, estimates, top-k), the end-to-end overlap with pkv_select from the CPU's own query (at
// least what the query's rounding cannot explain), and a captured graph replayed at other zone
// sizes. Then timings (CUDA events, median; per kernel from the captured graph cut after each
// kernel). PKV_TEST_QUICK=1: the correctness part at smaller n and no timings (for
// compute-sanitizer). PKV_TEST_MUTANT=1: a planted selection mutant that the checks must flag
// (see mutant_mode). Build and run: make test-gpu.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "cuda_common.h"
#include "../offload/fp8.h"
#include "kernels.h"
#include "pariskv_gpu.h"
extern "C" {
#include "../attention/pariskv.h"
#include "../attention/selector.h"
#include "../attention/srht.h"
#include "../model/bf16.h"
}
#include "../tests/test_pariskv_util.h" // check() and its counters

static const double U32 = 5.9604644775390625e-8; // 2^-24: fp32 unit roundoff

// xorshift64 (the CPU tests' splitmix64 Rng of test_pariskv_util.h draws other inputs).
struct Xorshift {
    unsigned long long s;
    unsigned long long next() {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        return s;
    }
    float uni() { return (float)(next() >> 40) / 8388608.0f - 1.0f; } // [-1, 1)
    float gauss() { return uni() + uni() + uni(); }                   // mean 0, variance 1
};

// Keys of one head, bf16: a common direction times amp (a large amp makes the ids and codes of
// many keys equal: skewed id counts, ties everywhere) plus unit noise, a per-key scale; slot 5
// all zero (the r = 0 path), and 2% of the later keys exact copies of earlier ones (equal
// estimates: ties in the top-k).
static void gen_keys(uint16_t *out, size_t slot_stride, int n, int D, float amp, Xorshift &r) {
    std::vector<float> c(D);
    for (int d = 0; d < D; d++) c[d] = r.gauss();
    for (int i = 0; i < n; i++) {
        uint16_t *k = out + (size_t)i * slot_stride;
        if (i == 5) {
            for (int d = 0; d < D; d++) k[d] = 0;
        } else if (i > 10 && r.next() % 50 == 0) {
            memcpy(k, out + (size_t)(r.next() % i) * slot_stride, D * sizeof *k);
        } else {
            float sc = 0.5f + 0.75f * (r.uni() + 1.0f);
            for (int d = 0; d < D; d++) k[d] = f32_to_bf16(sc * (amp * c[d] + r.gauss()));
        }
    }
}

static std::vector<float> bf16_row(const uint16_t *k, int D) {
    std::vector<float> f(D);
    for (int d = 0; d < D; d++) f[d] = bf16_to_f32(k[d]);
    return f;
}

template <typename T> static std::vector<T> from_dev(const T *d, size_t n) {
    std::vector<T> h(n);
    if (n) CU_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

// ---- encoding ----

// Where a GPU encoding may differ from the CPU's without a bug: the same formula in fp32 on both
// sides, so a difference means some value sits within rounding distance of a decision:
//  TOL_U: u_j = x_j / r_b, x = H diag(s) k / (r sqrt(D)). r^2 sums D squares (D u relative,
//         halved by the sqrt), the normalization, log2(D) butterfly stages (u each, relative to
//         the unit vector's magnitudes), the scale, r_b (8 squares), the division: per side
//         (D / 2 + log2 D + 16) u of the subspace's scale; twice that between two sides, and a
//         factor 4 for subspaces with r_b well below its typical sqrt(8 / D) of the key.
//         A code or id may differ where some |u_j| is within TOL_U of a threshold or of 0.
//  TOL_W: w = r r_b / alpha carries those relative errors plus alpha's (8 products): 2 (D + 24) u
//         relative; w may differ by one fp16 step where w lies within TOL_W of the midpoint.
// The kernels repeat the CPU's operations in the CPU's order, so both counts are 0 in
// practice; more than ENC_NEAR_MAX of the keys near a boundary fails the check.
static double tol_u(int D) { return 8 * (D / 2 + log2((double)D) + 16) * U32; }
static double tol_w(int D) { return 2 * (D + 24) * U32; }
static const double ENC_NEAR_MAX = 1e-3;

// u and w of one key as pkv_encode_key computes them (the same float operations).
static void ref_u(const float *k, int D, const float *s, float *u, float *wb) {
    float x[PKV_MAX_D], r2 = 0.0f;
    for (int i = 0; i < D; i++) r2 += k[i] * k[i];
    float r = sqrtf(r2), inv = r > 0.0f ? 1.0f / r : 0.0f;
    for (int i = 0; i < D; i++) x[i] = k[i] * inv;
    srht_apply(x, s, D);
    for (int b = 0; b < D / 8; b++) {
        float rb2 = 0.0f, a = 0.0f;
        for (int j = 0; j < 8; j++) rb2 += x[8 * b + j] * x[8 * b + j];
        float rb = sqrtf(rb2), ib = rb > 0.0f ? 1.0f / rb : 0.0f;
        for (int j = 0; j < 8; j++) {
            u[8 * b + j] = x[8 * b + j] * ib;
            a += pkv_centers[pkv_code(u[8 * b + j]) & 7] * fabsf(u[8 * b + j]);
        }
        if (a < 1e-6f) a = 1e-6f;
        wb[b] = r * rb / a;
    }
}

// Whether each subspace where the GPU's encoding differs has a value at a decision boundary.
static bool near_boundary(const float *k, int D, const float *s, const uint8_t *gi, const uint8_t *gc, const uint16_t *gw,
                          const uint8_t *ci, const uint8_t *cc, const uint16_t *cw) {
    float u[PKV_MAX_D], wb[PKV_MAX_D / 8];
    ref_u(k, D, s, u, wb);
    double tu = tol_u(D), tw = tol_w(D);
    for (int b = 0; b < D / 8; b++) {
        if (gi[b] != ci[b] || memcmp(gc + 4 * b, cc + 4 * b, 4)) { // then alpha, so w, differs too
            bool near = false;
            for (int j = 0; j < 8; j++) {
                double a = fabs(u[8 * b + j]);
                near |= a < tu;
                for (int t = 0; t < 7; t++) near |= fabs(a - pkv_thresholds[t]) < tu;
            }
            if (!near) return false;
        } else if (gw[b] != cw[b]) {
            double mid = 0.5 * ((double)pkv_f16_to_f32(gw[b]) + pkv_f16_to_f32(cw[b]));
            if (abs((int)gw[b] - (int)cw[b]) != 1 || fabs(wb[b] - mid) > tw * fabs(wb[b])) return false;
        }
    }
    return true;
}

struct HostIndex {
    std::vector<uint8_t> ids, codes;
    std::vector<uint16_t> w;
    std::vector<int32_t> count;
};

static HostIndex index_to_host(const PkvGpuIndex &ix) {
    size_t keys = (size_t)ix.n_layers * ix.n_kv * ix.cap, B = ix.B;
    HostIndex h;
    h.ids = from_dev(ix.ids, keys * B);
    std::vector<uint8_t> cw = from_dev(ix.cw, keys * B * 6); // per key: codes, then w
    h.codes.resize(keys * B * 4), h.w.resize(keys * B);
    for (size_t i = 0; i < keys; i++) {
        memcpy(&h.codes[i * B * 4], &cw[i * B * 6], B * 4);
        memcpy(&h.w[i * B], &cw[i * B * 6 + B * 4], B * 2);
    }
    h.count = from_dev(ix.count, (size_t)ix.n_layers * ix.n_kv * B * 256);
    return h;
}

// Compares slots [0, n) of every layer and head of ix with pkv_encode_key of the keys (key(l,
// h, i): the key's D float values), and the counts with those of the GPU's own ids.
template <typename KeyAt>
static void compare_encoding(const PkvGpuIndex &ix, int n, KeyAt key, const char *what) {
    int D = ix.D, B = ix.B;
    std::vector<float> s(D);
    srht_signs(SRHT_SEED, D, s.data());
    HostIndex g = index_to_host(ix);
    long keys = 0, exact = 0, near = 0, bad = 0, count_bad = 0;
    uint8_t ci[PKV_MAX_D / 8], cc[PKV_MAX_D / 2];
    uint16_t cw[PKV_MAX_D / 8];
    for (int l = 0; l < ix.n_layers; l++)
        for (int h = 0; h < ix.n_kv; h++) {
            size_t head = ((size_t)l * ix.n_kv + h) * ix.cap;
            std::vector<int32_t> cnt(B * 256, 0);
            for (int i = 0; i < n; i++) {
                std::vector<float> k = key(l, h, i);
                pkv_encode_key(k.data(), D, s.data(), ci, cc, cw, NULL);
                const uint8_t *gi = &g.ids[(head + i) * B], *gc = &g.codes[(head + i) * B * 4];
                const uint16_t *gw = &g.w[(head + i) * B];
                keys++;
                if (!memcmp(gi, ci, B) && !memcmp(gc, cc, 4 * B) && !memcmp(gw, cw, 2 * B)) exact++;
                else if (near_boundary(k.data(), D, s.data(), gi, gc, gw, ci, cc, cw)) near++;
                else bad++;
                for (int b = 0; b < B; b++) cnt[b * 256 + gi[b]]++;
            }
            const int32_t *gcnt = &g.count[((size_t)l * ix.n_kv + h) * B * 256];
            for (int e = 0; e < B * 256; e++) count_bad += gcnt[e] != cnt[e];
        }
    check(bad == 0 && near <= ENC_NEAR_MAX * keys,
          "encode %s D=%d: %ld keys, %ld bit-exact, %ld differ near a boundary (tol_u %.1e, at most %.0e of keys), %ld otherwise",
          what, D, keys, exact, near, tol_u(D), ENC_NEAR_MAX, bad);
    check(count_bad == 0, "encode %s D=%d: id counts equal those of the ids (%ld of %d counters differ)", what, D, count_bad,
          ix.n_layers * ix.n_kv * B * 256);
}

static void test_encode(int D, int n_layers, int n_kv, int cap, int n1, int n, unsigned long long seed) {
    printf("-- encode D=%d layers=%d n_kv=%d cap=%d slots [0,%d) + [%d,%d), seed %llu\n", D, n_layers, n_kv, cap, n1, n1, n, seed);
    Xorshift r = {seed};
    int LH = n_layers * n_kv;
    // Device cache layout (layer, head, slot, D).
    std::vector<uint16_t> keys((size_t)LH * cap * D);
    for (int lh = 0; lh < LH; lh++) gen_keys(&keys[(size_t)lh * cap * D], D, n, D, lh % 3 == 1 ? 4.0f : 0.0f, r);
    bf16 *dk;
    CU_CHECK(cudaMalloc(&dk, keys.size() * 2 + 16));
    CU_CHECK(cudaMemcpy(dk, keys.data(), keys.size() * 2, cudaMemcpyHostToDevice));
    auto key_dev = [&](int l, int h, int i) { return &keys[(((size_t)l * n_kv + h) * cap + i) * D]; };
    auto key_vals = [&](int l, int h, int i) { return bf16_row(key_dev(l, h, i), D); };
    PkvGpuIndex ix;
    CU_CHECK(pkv_gpu_index_alloc(&ix, n_layers, n_kv, D, cap, 0));
    std::vector<float> s(D);
    srht_signs(SRHT_SEED, D, s.data());
    std::vector<float> gs = from_dev(ix.signs, D);
    check(!memcmp(gs.data(), s.data(), D * sizeof(float)), "index D=%d: signs are srht_signs(SRHT_SEED)", D);
    PkvKeySource src = {dk, (size_t)n_kv * cap * D, (size_t)cap * D, (size_t)D, NULL, 0, 0};
    CU_CHECK(pkv_gpu_encode(&ix, src, 0, n1, 0));
    CU_CHECK(pkv_gpu_encode(&ix, src, n1, n, 0));
    CU_CHECK(pkv_gpu_encode(&ix, src, n, n, 0)); // empty: nothing
    CU_CHECK(cudaDeviceSynchronize());
    compare_encoding(ix, n, key_vals, "device layout");

    // The same keys in the host store's layout (slot, layer, head, [K | V]), pinned and mapped,
    // read by the GPU through UVA; the V halves hold other values.
    size_t row = 2 * (size_t)D, hs_elems = (size_t)cap * LH * row;
    uint16_t *hs;
    CU_CHECK(cudaHostAlloc(&hs, hs_elems * 2, cudaHostAllocMapped));
    for (size_t e = 0; e < hs_elems; e++) hs[e] = f32_to_bf16(r.uni());
    for (int l = 0; l < n_layers; l++)
        for (int h = 0; h < n_kv; h++)
            for (int i = 0; i < n; i++) memcpy(hs + (((size_t)i * n_layers + l) * n_kv + h) * row, key_dev(l, h, i), D * 2);
    bf16 *hs_dev;
    CU_CHECK(cudaHostGetDevicePointer((void **)&hs_dev, hs, 0));
    PkvGpuIndex ix2;
    CU_CHECK(pkv_gpu_index_alloc(&ix2, n_layers, n_kv, D, cap, 0));
    PkvKeySource hsrc = {hs_dev, (size_t)n_kv * row, row, (size_t)n_layers * n_kv * row, NULL, 0, 0};
    CU_CHECK(pkv_gpu_encode(&ix2, hsrc, 0, 7, 0));
    CU_CHECK(pkv_gpu_encode(&ix2, hsrc, 7, n, 0));
    CU_CHECK(cudaDeviceSynchronize());
    compare_encoding(ix2, n, key_vals, "host store (UVA)");

    // An unaligned view (base one element off): the kernel's element-wise loads.
    bf16 *dk1;
    CU_CHECK(cudaMalloc(&dk1, keys.size() * 2 + 16));
    CU_CHECK(cudaMemcpy(dk1 + 1, keys.data(), keys.size() * 2, cudaMemcpyHostToDevice));
    CU_CHECK(pkv_gpu_index_reset(&ix2, -1, 0));
    PkvKeySource usrc = {dk1 + 1, src.layer_stride, src.head_stride, src.slot_stride, NULL, 0, 0};
    CU_CHECK(pkv_gpu_encode(&ix2, usrc, 0, n, 0));
    CU_CHECK(cudaDeviceSynchronize());
    compare_encoding(ix2, n, key_vals, "unaligned view");

    // The fp8 host store's rows (codes of K, of V, two scales; offload/fp8.h): the index of the
    // values fp8_dequantize_row gives, as the CPU path encodes them.
    size_t row8 = 2 * (size_t)D + 8;
    uint8_t *hs8;
    CU_CHECK(cudaHostAlloc(&hs8, (size_t)cap * LH * row8, cudaHostAllocMapped));
    memset(hs8, 0, (size_t)cap * LH * row8);
    std::vector<float> deq((size_t)LH * cap * D);
    for (int l = 0; l < n_layers; l++)
        for (int h = 0; h < n_kv; h++)
            for (int i = 0; i < n; i++) {
                uint8_t *rw = hs8 + (((size_t)i * n_layers + l) * n_kv + h) * row8;
                std::vector<float> k = key_vals(l, h, i);
                float sc = fp8_quantize_row(k.data(), D, rw);
                memcpy(rw + 2 * D, &sc, 4);
                fp8_dequantize_row(rw, sc, D, &deq[(((size_t)l * n_kv + h) * cap + i) * D]);
            }
    uint8_t *hs8_dev;
    CU_CHECK(cudaHostGetDevicePointer((void **)&hs8_dev, hs8, 0));
    CU_CHECK(pkv_gpu_index_reset(&ix2, -1, 0));
    PkvKeySource fsrc = {NULL, (size_t)n_kv * row8, row8, (size_t)n_layers * n_kv * row8, hs8_dev, 2 * (size_t)D, 0};
    CU_CHECK(pkv_gpu_encode(&ix2, fsrc, 0, n1, 0));
    CU_CHECK(pkv_gpu_encode(&ix2, fsrc, n1, n, 0));
    CU_CHECK(cudaDeviceSynchronize());
    compare_encoding(ix2, n, [&](int l, int h, int i) {
        const float *d = &deq[(((size_t)l * n_kv + h) * cap + i) * D];
        return std::vector<float>(d, d + D);
    }, "fp8 host store (UVA)");
    cudaFreeHost(hs8);

    // The same keys from the device layout, each rounded on the GPU as the fp8 store rounds it
    // (round_fp8), one layer at a time (pkv_gpu_encode_layer: the layered prefill's way): the
    // store's index, bit for bit.
    CU_CHECK(pkv_gpu_index_reset(&ix2, -1, 0));
    for (int l = 0; l < n_layers; l++) {
        PkvKeySource lsrc = {dk + (size_t)l * n_kv * cap * D, 0, (size_t)cap * D, (size_t)D, NULL, 0, 1};
        CU_CHECK(pkv_gpu_encode_layer(&ix2, lsrc, l, 0, n1, 0));
        CU_CHECK(pkv_gpu_encode_layer(&ix2, lsrc, l, n1, n, 0));
    }
    CU_CHECK(cudaDeviceSynchronize());
    compare_encoding(ix2, n, [&](int l, int h, int i) {
        const float *d = &deq[(((size_t)l * n_kv + h) * cap + i) * D];
        return std::vector<float>(d, d + D);
    }, "device keys rounded as the fp8 store, layer by layer");

    // Reset of one layer zeroes its counts only.
    CU_CHECK(pkv_gpu_index_reset(&ix, n_layers - 1, 0));
    std::vector<int32_t> c = from_dev(ix.count, (size_t)LH * ix.B * 256);
    size_t per_layer = (size_t)n_kv * ix.B * 256;
    long zero_last = 0, sum_rest = 0;
    for (size_t e = 0; e < c.size(); e++) {
        if (e >= (size_t)(n_layers - 1) * per_layer) zero_last += c[e] == 0;
        else sum_rest += c[e];
    }
    check(zero_last == (long)per_layer && sum_rest == (long)(n_layers - 1) * n_kv * ix.B * n,
          "index reset of layer %d: its counts zero, the other layers' intact", n_layers - 1);
    pkv_gpu_index_free(&ix), pkv_gpu_index_free(&ix2);
    cudaFree(dk), cudaFree(dk1), cudaFreeHost(hs);
}

// ---- query and selection ----

struct Case {
    int n, k;
    float beta, rho; // <= 0: the schedule
};

struct SelCfg {
    int D, n_kv, G;
    float amp; // common component of the keys (by head: amp, 0, amp / 4, ...)
    const char *what;
    std::vector<Case> cases;
};

static double decimal6(float x) { return round((double)x * 1e6) / 1e6; } // pariskv_select.c's decimal()

// The CPU's group mean (policy.c: heads in order, then / G).
static void mean_query(float *qbar, const float *qg, int G, int D) {
    for (int j = 0; j < D; j++) {
        float s = 0.0f;
        for (int g = 0; g < G; g++) s += qg[(size_t)g * D + j];
        qbar[j] = s / (float)G;
    }
}

// Query tolerance, relative to the output's scale: the mean's G additions err by u of the sum
// of |q_g| (~ sqrt(G) times the mean's scale for independent heads), the norm's D squares summed
// in order by D u (halved by the sqrt), the butterflies by log2(D) u, the rest (division, sqrt,
// normalization, scale) by a few u.
static double tol_query(int D, int G) { return (G * sqrt((double)G) + D / 2.0 + log2((double)D) + 8) * U32; }

// How far one key's estimate (pkv_estimate: ||q|| sum_b w_b <v_b, qt_b>) may move between the
// queries (qt, qn) and (qt2, qn2): the exact value's change, plus each side's fp32 rounding (8
// products and sums a subspace, a product with w_b, B sums, the product with qn: within
// (B + 10) u of the sum of |terms|).
static double est_delta(const uint8_t *codes, const uint16_t *w, int B, const float *qt, float qn, const float *qt2, float qn2) {
    double A = 0, dA = 0;
    for (int b = 0; b < B; b++) {
        double wb = fabs((double)pkv_f16_to_f32(w[b]));
        for (int j = 0; j < PKV_M; j++) {
            const uint8_t *cb = codes + b * (PKV_M / 2);
            double lev = fabs((double)pkv_levels[j & 1 ? cb[j / 2] >> 4 : cb[j / 2] & 15]);
            A += wb * lev * fmax(fabs((double)qt[b * PKV_M + j]), fabs((double)qt2[b * PKV_M + j]));
            dA += wb * lev * fabs((double)qt[b * PKV_M + j] - qt2[b * PKV_M + j]);
        }
    }
    double qm = fmax(qn, qn2);
    return fabs((double)qn - qn2) * A + qm * dA + 2 * (B + 10) * U32 * qm * A;
}

// |a \ b| + |b \ a| of two ascending slot lists.
static int sym_diff(const int *a, int na, const int *b, int nb) {
    int i = 0, j = 0, same = 0;
    while (i < na && j < nb) {
        if (a[i] == b[j]) same++, i++, j++;
        else if (a[i] < b[j]) i++;
        else j++;
    }
    return na + nb - 2 * same;
}

// PKV_TEST_MUTANT=1: after each selection one selected slot of KV head 0 is changed on the device
// (to a slot it did not select; where every slot is selected, to its neighbour): the checks of the
// selection must flag every such case. sel_flags counts the failed selection checks.
static bool mutant_mode;
static int sel_flags, mutants_planted, mutants_flagged;
#define SEL_CHECK(ok, ...)                                                                                           \
    do {                                                                                                             \
        bool ok_ = (ok);                                                                                             \
        sel_flags += !ok_;                                                                                           \
        check(ok_, __VA_ARGS__);                                                                                     \
    } while (0)

static void run_select_cfg(const SelCfg &cfg, unsigned long long seed) {
    int D = cfg.D, n_kv = cfg.n_kv, G = cfg.G, B = D / 8, nh = n_kv * G;
    int max_n = 0, kmax = 1;
    for (const Case &c : cfg.cases) max_n = std::max(max_n, c.n), kmax = std::max(kmax, c.k);
    int cap = max_n + 37, capp = (cap + 15) & ~15; // capp: the scratch's row stride (pariskv_gpu.cu)
    printf("-- select %s: D=%d n_kv=%d G=%d cap=%d, seed %llu\n", cfg.what, D, n_kv, G, cap, seed);
    Xorshift r = {seed};
    // Keys (head, cap + 1, D); layer l's slot i is row i + l (two layers, overlapping views).
    std::vector<uint16_t> keys((size_t)n_kv * (cap + 1) * D);
    for (int h = 0; h < n_kv; h++) {
        float amp = h % 3 == 0 ? cfg.amp : h % 3 == 1 ? 0.0f : cfg.amp / 4;
        gen_keys(&keys[(size_t)h * (cap + 1) * D], D, cap + 1, D, amp, r);
    }
    bf16 *dk;
    CU_CHECK(cudaMalloc(&dk, keys.size() * 2));
    CU_CHECK(cudaMemcpy(dk, keys.data(), keys.size() * 2, cudaMemcpyHostToDevice));
    PkvKeySource src = {dk, (size_t)D, (size_t)(cap + 1) * D, (size_t)D, NULL, 0, 0};
    const int layer = 1;
    PkvGpuIndex ix;
    CU_CHECK(pkv_gpu_index_alloc(&ix, 2, n_kv, D, cap, 0));
    PkvGpuScratch s;
    CU_CHECK(pkv_gpu_scratch_alloc(&s, &ix, kmax));
    printf("  selection: %s\n", s.five ? "five kernels a layer (PKV_SELECT=five)" : "four kernels a layer");
    CU_CHECK(cudaDeviceSynchronize()); // the allocations' zeroing ran on stream 0; st does not wait for it
    cudaStream_t st;
    CU_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int *d_n;
    float *d_q;
    CU_CHECK(cudaMalloc(&d_n, sizeof(int)));
    CU_CHECK(cudaMalloc(&d_q, (size_t)nh * D * sizeof(float)));
    std::vector<float> sg(D);
    srht_signs(SRHT_SEED, D, sg.data());
    // Graphs by (k, beta, rho), each captured at the first n that uses it.
    typedef std::pair<int, std::pair<float, float>> GraphKey;
    std::map<GraphKey, cudaGraphExec_t> graphs;
    std::map<GraphKey, int> graph_n;

    for (const Case &cs : cfg.cases) {
        int n = cs.n, k = cs.k;
        char tag[128];
        snprintf(tag, sizeof tag, "[D=%d n_kv=%d G=%d n=%d k=%d]", D, n_kv, G, n, k);
        CU_CHECK(pkv_gpu_index_reset(&ix, -1, st));
        if (n > 0) {
            CU_CHECK(pkv_gpu_encode(&ix, src, 0, n / 3, st));
            CU_CHECK(pkv_gpu_encode(&ix, src, n / 3, n, st));
        }
        // Queries: half of the heads near a key of the zone (a meaningful top-k), half random.
        std::vector<float> q((size_t)nh * D);
        for (int hq = 0; hq < nh; hq++)
            for (int d = 0; d < D; d++) {
                int kh = hq / G, slot = n > 0 ? (int)(r.next() % n) : 0;
                float base = hq % 2 && n > 0 ? bf16_to_f32(keys[((size_t)kh * (cap + 1) + slot + layer) * D + d]) : 0.0f;
                q[(size_t)hq * D + d] = base + r.gauss();
            }
        CU_CHECK(cudaMemcpyAsync(d_q, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice, st));
        CU_CHECK(cudaMemcpyAsync(d_n, &n, sizeof n, cudaMemcpyHostToDevice, st));
        // Candidates and estimates poisoned (-1, NaN): how many the GPU wrote is then readable.
        CU_CHECK(cudaMemsetAsync(s.cand, 0xff, (size_t)n_kv * capp * sizeof(int), st));
        CU_CHECK(cudaMemsetAsync(s.est, 0xff, (size_t)n_kv * capp * sizeof(float), st));
        CU_CHECK(pkv_gpu_select(&s, &ix, layer, d_q, nh, d_n, k, cs.beta, cs.rho, st));
        CU_CHECK(cudaStreamSynchronize(st));
        CU_CHECK(cudaGetLastError());
        int planted_at = -1, planted_from = -1, planted_to = -1, flags0 = sel_flags;
        if (mutant_mode && n >= 2) { // head 0's middle selected slot, changed on the device
            int m0 = std::min(n, k);
            std::vector<int> h0 = from_dev(s.sel, (size_t)m0);
            std::vector<char> in(n, 0);
            for (int v : h0) in[std::min(std::max(v, 0), n - 1)] = 1;
            planted_at = m0 / 2, planted_from = h0[planted_at];
            planted_to = h0[planted_at + (planted_at + 1 < m0 ? 1 : -1)]; // every slot selected: a neighbour
            for (int v = 0; v < n; v++)
                if (!in[v]) {
                    planted_to = v;
                    if (v > planted_from) break; // the first unselected slot past it, else the last one before it
                }
            CU_CHECK(cudaMemcpy(s.sel + planted_at, &planted_to, sizeof(int), cudaMemcpyHostToDevice));
        }
        std::vector<float> gqt = from_dev(s.qt, (size_t)n_kv * D), gqn = from_dev(s.qn, n_kv);
        std::vector<int> gsel = from_dev(s.sel, (size_t)n_kv * kmax), gnsel = from_dev(s.nsel, n_kv);
        std::vector<uint8_t> gbonus = from_dev(s.bonus, (size_t)n_kv * B * 256), gscore = from_dev(s.score, (size_t)n_kv * capp);
        std::vector<int> gcand = from_dev(s.cand, (size_t)n_kv * capp);
        std::vector<float> gest = from_dev(s.est, (size_t)n_kv * capp);
        HostIndex hi = index_to_host(ix);
        size_t lkeys = (size_t)layer * n_kv * cap;

        // Query: the CPU's mean and pkv_prepare_query.
        std::vector<float> qbar((size_t)n_kv * D), cqt((size_t)n_kv * D), cqn(n_kv);
        double eq = 0, eqn = 0, mq = 1e-30;
        bool q_exact = true;
        for (int h = 0; h < n_kv; h++) {
            mean_query(&qbar[(size_t)h * D], &q[(size_t)h * G * D], G, D);
            pkv_prepare_query(&qbar[(size_t)h * D], D, sg.data(), &cqt[(size_t)h * D], &cqn[h]);
            for (int d = 0; d < D; d++) {
                eq = fmax(eq, fabs((double)gqt[(size_t)h * D + d] - cqt[(size_t)h * D + d]));
                mq = fmax(mq, fabs((double)cqt[(size_t)h * D + d]));
            }
            eqn = fmax(eqn, fabs((double)gqn[h] - cqn[h]) / fmax(cqn[h], 1e-30));
        }
        q_exact = !memcmp(gqt.data(), cqt.data(), gqt.size() * 4) && !memcmp(gqn.data(), cqn.data(), gqn.size() * 4);
        double tq = tol_query(D, G);
        check(eq / mq <= tq && eqn <= tq, "%s query: qt rel err %.2e, qn rel err %.2e (tol %.1e)%s", tag, eq / mq, eqn, tq,
              q_exact ? ", bit-exact" : "");

        std::vector<std::vector<int>> direct(n_kv);
        int unsorted = 0;
        for (int h = 0; h < n_kv; h++) {
            int m = std::min(std::max(gnsel[h], 0), kmax);
            direct[h].assign(&gsel[(size_t)h * kmax], &gsel[(size_t)h * kmax] + m);
            unsorted += !std::is_sorted(direct[h].begin(), direct[h].end());
            std::sort(direct[h].begin(), direct[h].end());
        }
        SEL_CHECK(unsorted == 0, "%s selection written in ascending slot order on %d of %d heads", tag, n_kv - unsorted, n_kv);
        if (n <= k) { // every slot, no vote
            int bad = 0;
            for (int h = 0; h < n_kv; h++) {
                bad += gnsel[h] != n;
                for (int i = 0; i < (int)direct[h].size(); i++) bad += direct[h][i] != i;
            }
            SEL_CHECK(bad == 0, "%s n <= k: every slot selected on each head", tag);
        } else {
            float beta = cs.beta, rho = cs.rho;
            if (beta <= 0.0f || rho <= 0.0f) pkv_schedule(n, &beta, &rho);
            int C = pkv_ceil((double)n * decimal6(beta));
            if (C < k) C = k;
            long bonus_bad = 0, score_bad = 0, est_n = 0, est_bad = 0, est_written_bad = 0;
            int cand_bad = 0, count_bad = 0, topk_bad = 0, nsel_bad = 0, tie_heads = 0, nc = 0, gnc_min = capp, gnc_max = 0;
            double est_rel = 0;
            long common = 0, e2e_n = 0, e2e_allowed = 0, e2e_near = 0, e2e_cand = 0;
            int e2e_bad = 0, q_inexact_heads = 0;
            int max_bin = 0;
            for (int h = 0; h < n_kv; h++) {
                size_t head = lkeys + (size_t)h * cap;
                PkvIndex cix = {B, n, cap, &hi.ids[head * B], &hi.codes[head * B * 4], &hi.w[head * B],
                                &hi.count[((size_t)layer * n_kv + h) * B * 256]};
                const float *qt = &gqt[(size_t)h * D];
                float qn = gqn[h];
                // Each stage from the same inputs as the GPU's: its qt, qn and index.
                std::vector<uint8_t> cb(B * 256);
                pkv_bonus(qt, B, cix.count, n, rho, cb.data());
                for (int e = 0; e < B * 256; e++) bonus_bad += cb[e] != gbonus[(size_t)h * B * 256 + e];
                std::vector<uint16_t> sc(n);
                pkv_vote(cix.ids, n, B, cb.data(), sc.data());
                for (int i = 0; i < n; i++) score_bad += sc[i] != gscore[(size_t)h * capp + i];
                std::vector<int32_t> hist(6 * B + 1);
                std::vector<int> cand(n);
                nc = pkv_bucket_topc(sc.data(), n, 6 * B, C, hist.data(), cand.data());
                const int *gc = &gcand[(size_t)h * capp];
                cand_bad += memcmp(cand.data(), gc, nc * sizeof(int)) != 0;
                // The GPU's count: the entries it wrote over the poison (-1; slots are >= 0) must be
                // C = min(max(ceil(beta n), k), n) -- the CPU's count -- and its estimates as many.
                int gnc = 0;
                for (int i = 0; i < capp; i++) gnc += gc[i] != -1;
                gnc_min = std::min(gnc_min, gnc), gnc_max = std::max(gnc_max, gnc);
                count_bad += gnc != nc || nc != std::min(C, n);
                for (int i = 0; i < capp; i++) {
                    uint32_t eb;
                    memcpy(&eb, &gest[(size_t)h * capp + i], 4);
                    est_written_bad += (eb != 0xffffffffu) != (i < nc);
                }
                // Estimates of the GPU's candidates, top-k of those.
                std::vector<float> ce(nc);
                std::vector<int> bins(4096, 0);
                for (int i = 0; i < nc; i++) {
                    int slot = std::min(std::max(gc[i], 0), n - 1);
                    ce[i] = pkv_estimate(cix.codes + (size_t)slot * B * 4, cix.w + (size_t)slot * B, B, qt, qn);
                    float ge = gest[(size_t)h * capp + i];
                    est_n++;
                    if (memcmp(&ce[i], &ge, 4)) est_bad++;
                    est_rel = fmax(est_rel, fabs((double)ge - ce[i]) / fmax(fabs((double)ce[i]), 1e-30));
                    uint32_t u;
                    memcpy(&u, &ce[i], 4);
                    if (ce[i] == 0.0f) u = 0;
                    bins[(u & 0x80000000u ? ~u : u | 0x80000000u) >> 20]++;
                }
                std::vector<ScoredId> heap(k);
                std::vector<int> out(k);
                int m = topk_select(ce.data(), gc, nc, k, heap.data(), out.data());
                topk_bad += m != (int)direct[h].size() || !std::equal(out.begin(), out.begin() + m, direct[h].begin());
                nsel_bad += gnsel[h] != k;
                // Ties at the k-th estimate that the rule had to break; the first digit's bin of the k-th
                // (how many estimates share the k-th's top 12 bits).
                float kth = INFINITY;
                for (int i = 0; i < nc; i++)
                    if (std::binary_search(out.begin(), out.begin() + m, gc[i])) kth = fminf(kth, ce[i]);
                int eq_all = 0, eq_in = 0;
                for (int i = 0; i < nc; i++)
                    if (ce[i] == kth) eq_all++, eq_in += std::binary_search(out.begin(), out.begin() + m, gc[i]);
                tie_heads += eq_all > eq_in;
                uint32_t ku;
                float kz = kth == 0.0f ? 0.0f : kth;
                memcpy(&ku, &kz, 4);
                max_bin = std::max(max_bin, bins[(ku & 0x80000000u ? ~ku : ku | 0x80000000u) >> 20]);
                // End to end on the CPU from the CPU's own query: S1 = pkv_select, against the GPU's
                // S3 (the stages above: S3 = the CPU's stages from the GPU's query).
                std::vector<char> scratch(pkv_scratch_bytes(B, n, k));
                std::vector<int> e2e(k);
                int me = pkv_select(&cix, D, sg.data(), &qbar[(size_t)h * D], k, cs.beta, cs.rho, scratch.data(), e2e.data());
                long same = 0;
                for (int i = 0; i < me; i++) same += std::binary_search(direct[h].begin(), direct[h].end(), e2e[i]);
                common += same, e2e_n += me;
                // Minimum overlap: where the GPU's query is this head's CPU query bit for bit, S3 = S1.
                // Else the sets may differ only by what the query's rounding moves (S2: the top-k of
                // the GPU query's estimates over the CPU query's candidates C1):
                //  S1 vs S2, same candidates, each estimate moved by <= delta (est_delta over C1): a
                //    slot of S1 leaves only for one outside it whose estimate passed it, so its own
                //    lies within 2 delta of S1's k-th: at most near = #{S1 within 2 delta of it};
                //  S2 vs S3, the same estimates over C1 and C3 (the GPU's candidates): at most
                //    |C1 \ C3| + |C3 \ C1| slots part (each slot of S2 missing from S3 is either not
                //    in C3, or was overtaken by one that is not in C1).
                // So |S1 \ S3| <= near + |C1 delta C3|, and the overlap >= me - that.
                const float *cq = &cqt[(size_t)h * D];
                bool hq_exact = !memcmp(qt, cq, D * sizeof(float)) && !memcmp(&qn, &cqn[h], sizeof(float));
                long allowed = 0;
                if (!hq_exact) {
                    q_inexact_heads++;
                    std::vector<uint8_t> cb1(B * 256);
                    std::vector<uint16_t> sc1(n);
                    std::vector<int> c1(n);
                    pkv_bonus(cq, B, cix.count, n, rho, cb1.data());
                    pkv_vote(cix.ids, n, B, cb1.data(), sc1.data());
                    int nc1 = pkv_bucket_topc(sc1.data(), n, 6 * B, C, hist.data(), c1.data());
                    double delta = 0, kth1 = INFINITY;
                    for (int i = 0; i < nc1; i++)
                        delta = fmax(delta, est_delta(cix.codes + (size_t)c1[i] * B * 4, cix.w + (size_t)c1[i] * B, B, cq, cqn[h], qt, qn));
                    std::vector<float> e1(me);
                    for (int i = 0; i < me; i++)
                        e1[i] = pkv_estimate(cix.codes + (size_t)e2e[i] * B * 4, cix.w + (size_t)e2e[i] * B, B, cq, cqn[h]), kth1 = fmin(kth1, e1[i]);
                    long near = 0, cd = sym_diff(c1.data(), nc1, gc, nc);
                    for (int i = 0; i < me; i++) near += e1[i] <= kth1 + 2 * delta;
                    allowed = near + cd, e2e_near += near, e2e_cand += cd;
                }
                e2e_allowed += allowed;
                e2e_bad += me - same > allowed;
            }
            check(bonus_bad == 0, "%s bonus tables (rho %.2f): %ld of %d entries differ", tag, rho, bonus_bad, n_kv * B * 256);
            check(score_bad == 0, "%s vote: %ld of %ld scores differ", tag, score_bad, (long)n * n_kv);
            check(cand_bad == 0 && count_bad == 0, "%s bucket top-C (beta %.2f, C=%d of %d): candidate sets equal on %d of %d heads, "
                  "the GPU's count == C on %d (it wrote %d to %d)", tag, beta, nc, n, n_kv - cand_bad, n_kv, n_kv - count_bad, gnc_min, gnc_max);
            check(est_bad == 0 && est_written_bad == 0, "%s rerank: %ld of %ld estimates bit-exact (max rel diff %.1e), as many written as "
                  "candidates (%ld entries otherwise)", tag, est_n - est_bad, est_n, est_rel, est_written_bad);
            SEL_CHECK(topk_bad == 0 && nsel_bad == 0,
                      "%s top-k: equal sets on %d of %d heads (%d with ties at the k-th; k-th's first-digit bin %d)", tag,
                      n_kv - topk_bad, n_kv, tie_heads, max_bin);
            SEL_CHECK(e2e_bad == 0, "%s end to end vs pkv_select from the CPU's query: overlap %ld of %ld, at least %ld on every head "
                      "(%d heads' queries not bit-exact: %ld slots near the k-th estimate, %ld candidates differ)", tag, common, e2e_n,
                      e2e_n - e2e_allowed, q_inexact_heads, e2e_near, e2e_cand);
        }

        // The same step from a graph captured once (at another n, mostly): grids fixed by cap.
        GraphKey gk = {k, {cs.beta, cs.rho}};
        if (!graphs.count(gk)) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CU_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            CU_CHECK(pkv_gpu_select(&s, &ix, layer, d_q, nh, d_n, k, cs.beta, cs.rho, st));
            CU_CHECK(cudaStreamEndCapture(st, &g));
            CU_CHECK(cudaGraphInstantiate(&ge, g, 0));
            CU_CHECK(cudaGraphDestroy(g));
            graphs[gk] = ge, graph_n[gk] = n;
        }
        CU_CHECK(cudaMemsetAsync(s.sel, 0xff, (size_t)n_kv * kmax * sizeof(int), st));
        CU_CHECK(cudaGraphLaunch(graphs[gk], st));
        CU_CHECK(cudaStreamSynchronize(st));
        std::vector<int> rsel = from_dev(s.sel, (size_t)n_kv * kmax), rnsel = from_dev(s.nsel, n_kv);
        int same = 0;
        for (int h = 0; h < n_kv; h++) {
            int m = std::min(std::max(rnsel[h], 0), kmax);
            std::vector<int> v(&rsel[(size_t)h * kmax], &rsel[(size_t)h * kmax] + m);
            std::sort(v.begin(), v.end());
            same += rnsel[h] == gnsel[h] && v == direct[h];
        }
        SEL_CHECK(same == n_kv, "%s graph captured at n=%d replayed: same selection on %d of %d heads", tag, graph_n[gk], same, n_kv);
        if (planted_at >= 0) {
            mutants_planted++, mutants_flagged += sel_flags > flags0;
            printf("     (mutant: head 0's selected slot %d (place %d) changed to %d on the device: %d selection checks flagged it)\n",
                   planted_from, planted_at, planted_to, sel_flags - flags0);
        }
    }
    for (auto &g : graphs) cudaGraphExecDestroy(g.second);
    pkv_gpu_scratch_free(&s);
    pkv_gpu_index_free(&ix);
    cudaFree(dk), cudaFree(d_n), cudaFree(d_q);
    cudaStreamDestroy(st);
}

// ---- timing ----

static float time_ms(cudaStream_t st, int warm, int reps, void (*fn)(void *), void *arg) {
    cudaEvent_t a, b;
    CU_CHECK(cudaEventCreate(&a));
    CU_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < warm; i++) fn(arg);
    std::vector<float> t(reps);
    for (int i = 0; i < reps; i++) {
        CU_CHECK(cudaEventRecord(a, st));
        fn(arg);
        CU_CHECK(cudaEventRecord(b, st));
        CU_CHECK(cudaEventSynchronize(b));
        CU_CHECK(cudaEventElapsedTime(&t[i], a, b));
    }
    std::sort(t.begin(), t.end());
    cudaEventDestroy(a), cudaEventDestroy(b);
    return t[reps / 2];
}

struct Bench {
    PkvGpuIndex ix;
    PkvGpuScratch s;
    PkvKeySource src;
    int from, to, k, *d_n, nh;
    const float *d_q;
    cudaStream_t st;
    cudaGraphExec_t graph;
};

// The per-kernel table is a diagnostic: a graph API call that fails there skips the table (its
// graphs leak) instead of ending the test.
#define STAGE_TRY(call)                                                                                    \
    do {                                                                                                   \
        cudaError_t e_ = (call);                                                                           \
        if (e_ != cudaSuccess) {                                                                           \
            printf("  (per-kernel times skipped: %s at line %d)\n", cudaGetErrorName(e_), __LINE__);        \
            cudaGetLastError();                                                                            \
            return;                                                                                        \
        }                                                                                                  \
    } while (0)

// A node's dependencies (or dependents): their number, and the one in *out when there is one.
// The graph API's queries gained an edge-data argument in CUDA 13.
static cudaError_t node_deps(cudaGraphNode_t n, cudaGraphNode_t *out, bool dependents, size_t *m) {
    *m = 0;
#if CUDART_VERSION >= 13000
    // With the edge data: programmatic (PDL) edges make a query without it "lossy".
    cudaGraphEdgeData ed[1];
    cudaError_t e = dependents ? cudaGraphNodeGetDependentNodes(n, NULL, NULL, m) : cudaGraphNodeGetDependencies(n, NULL, NULL, m);
    if (e == cudaSuccess && out && *m == 1)
        e = dependents ? cudaGraphNodeGetDependentNodes(n, out, ed, m) : cudaGraphNodeGetDependencies(n, out, ed, m);
#else
    cudaError_t e = dependents ? cudaGraphNodeGetDependentNodes(n, NULL, m) : cudaGraphNodeGetDependencies(n, NULL, m);
    if (e == cudaSuccess && out && *m == 1)
        e = dependents ? cudaGraphNodeGetDependentNodes(n, out, m) : cudaGraphNodeGetDependencies(n, out, m);
#endif
    return e;
}

// A kernel node's function name, demangled enough: _Z15pkv_vote_kernelILi16EEv... -> pkv_vote_kernel<16>.
static std::string kernel_name(cudaGraphNode_t nd) {
    cudaGraphNodeType ty;
    cudaKernelNodeParams kp;
    const char *m = NULL;
    if (cudaGraphNodeGetType(nd, &ty) != cudaSuccess || ty != cudaGraphNodeTypeKernel ||
        cudaGraphKernelNodeGetParams(nd, &kp) != cudaSuccess || cudaFuncGetName(&m, kp.func) != cudaSuccess || !m) {
        cudaGetLastError();
        return "?";
    }
    if (strncmp(m, "_Z", 2)) return m;
    char *end;
    long len = strtol(m + 2, &end, 10);
    if (len <= 0 || (long)strlen(end) < len) return m;
    std::string name(end, len);
    const char *ta = end + len;
    if (!strncmp(ta, "ILi", 3)) name += "<" + std::string(ta + 3, strcspn(ta + 3, "E")) + ">";
    return name;
}

// Per-kernel times of one step (query + select): the captured graph's kernel nodes form a
// chain; the graph cut after each node is timed, and a kernel's time is what it adds to the
// prefix before it (with PDL a kernel's start overlaps its predecessor's tail: the times sum
// to the whole graph's). The first row holds the graph launch too. GB/s: of the bytes the
// kernel must read (rerank: cand, codes, w of the C candidates; topk: their estimates).
static void stage_times(Bench &bn, const float *d_q, int G, double C) {
    const int D = bn.ix.D, B = bn.ix.B, H = bn.ix.n_kv;
    int n;
    CU_CHECK(cudaMemcpy(&n, bn.d_n, 4, cudaMemcpyDeviceToHost));
    cudaGraph_t g;
    CU_CHECK(cudaStreamBeginCapture(bn.st, cudaStreamCaptureModeThreadLocal));
    CU_CHECK(pkv_gpu_select(&bn.s, &bn.ix, 0, d_q, H * G, bn.d_n, bn.k, 0.0f, 0.0f, bn.st));
    CU_CHECK(cudaStreamEndCapture(bn.st, &g));
    size_t nn = 0, m;
    STAGE_TRY(cudaGraphGetNodes(g, NULL, &nn));
    std::vector<cudaGraphNode_t> nodes(nn), chain;
    STAGE_TRY(cudaGraphGetNodes(g, nodes.data(), &nn));
    for (cudaGraphNode_t nd : nodes) {
        STAGE_TRY(node_deps(nd, NULL, false, &m));
        if (m == 0) {
            chain.push_back(nd);
            break;
        }
    }
    while (!chain.empty() && chain.size() < nn) {
        cudaGraphNode_t next;
        STAGE_TRY(node_deps(chain.back(), &next, true, &m));
        if (m != 1) break;
        chain.push_back(next);
    }
    if (chain.size() != nn) {
        printf("  (per-kernel times skipped: the graph's %zu nodes are not a chain)\n", nn);
        CU_CHECK(cudaGraphDestroy(g));
        return;
    }
    std::map<std::string, double> must = {
        {"pkv_bonus_kernel", (double)H * B * (256 * 4 + G * D * 4)},
        {"pkv_vote_kernel", (double)H * n * B},
        {"pkv_compact_kernel", (double)H * n},
        {"pkv_rerank_kernel", (double)H * C * (4 + 6 * B)},
        {"pkv_topk_kernel", (double)H * C * 4},
        {"pkv_topk1_kernel", (double)H * C * 4},
        {"pkv_cand_rerank_kernel", (double)H * (n + C * 6 * B)},
    };
    printf("  %-24s %14s %9s %9s %9s\n", "kernel", "grid x block", "us", "MB read", "GB/s");
    float prev = 0.0f;
    for (m = 1; m <= nn; m++) {
        cudaGraph_t cg;
        STAGE_TRY(cudaGraphClone(&cg, g));
        for (size_t i = m; i < nn; i++) {
            cudaGraphNode_t cn;
            STAGE_TRY(cudaGraphNodeFindInClone(&cn, chain[i], cg));
            STAGE_TRY(cudaGraphDestroyNode(cn));
        }
        STAGE_TRY(cudaGraphInstantiate(&bn.graph, cg, 0));
        STAGE_TRY(cudaGraphDestroy(cg));
        float t = time_ms(bn.st, 5, 20, [](void *p) { Bench *b = (Bench *)p; CU_CHECK(cudaGraphLaunch(b->graph, b->st)); }, &bn);
        CU_CHECK(cudaGraphExecDestroy(bn.graph));
        std::string name = kernel_name(chain[m - 1]);
        char geo[64] = "";
        cudaKernelNodeParams kp;
        if (name != "?" && cudaGraphKernelNodeGetParams(chain[m - 1], &kp) == cudaSuccess)
            snprintf(geo, sizeof geo, "%ux%u x %u", kp.gridDim.x, kp.gridDim.y, kp.blockDim.x);
        std::string base = name.substr(0, name.find('<'));
        double us = (t - prev) * 1e3, bytes = must.count(base) ? must[base] : 0.0;
        printf("  %-24s %14s %9.1f", name.c_str(), geo, us);
        if (bytes > 0 && us > 0) printf(" %9.2f %9.0f\n", bytes / 1e6, bytes / (us * 1e-6) / 1e9);
        else printf(" %9s %9s\n", "-", "-");
        prev = t;
    }
    printf("  %-24s %14s %9.1f\n", "whole graph", "", prev * 1e3);
    CU_CHECK(cudaGraphDestroy(g));
}

// PKV_TEST_BENCH_KV: KV heads of the timed layer (default 8; 4 is one GPU's share of Llama-3.1-8B
// under --gpus 2, whose fixed latencies do not halve with the heads).
static void bench(int n) {
    const char *kv_env = getenv("PKV_TEST_BENCH_KV");
    const int kv_asked = kv_env ? atoi(kv_env) : 0;
    const int D = 128, n_kv = kv_asked > 0 && kv_asked <= 64 ? kv_asked : 8, G = 4, B = D / 8;
    printf("\n-- timing (%s selection): D=%d n_kv=%d G=%d, zone of n=%d keys per head, one layer\n", getenv("PKV_SELECT") ? getenv("PKV_SELECT") : "default", D, n_kv, G, n);
    Bench bn;
    CU_CHECK(cudaStreamCreateWithFlags(&bn.st, cudaStreamNonBlocking));
    size_t kelems = (size_t)n_kv * n * D;
    bf16 *dk;
    float *d_q, *sink;
    CU_CHECK(cudaMalloc(&dk, kelems * 2));
    CU_CHECK(cudaMalloc(&d_q, (size_t)n_kv * G * D * 4));
    CU_CHECK(cudaMalloc(&sink, 4));
    CU_CHECK(cudaMalloc(&bn.d_n, 4));
    CU_CHECK(fill_random_bf16(dk, kelems, 7, 1.0f, 0.3f, bn.st)); // uniform plus a common component
    CU_CHECK(fill_random_f32(d_q, (size_t)n_kv * G * D, 8, 1.0f, 0.1f, bn.st));
    CU_CHECK(pkv_gpu_index_alloc(&bn.ix, 1, n_kv, D, n, bn.st));
    CU_CHECK(pkv_gpu_scratch_alloc(&bn.s, &bn.ix, 2048));
    CU_CHECK(cudaMemcpy(bn.d_n, &n, 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaStreamSynchronize(bn.st));
    double bw;
    {
        size_t bytes = (size_t)n_kv * n * B * 7; // the whole index
        struct R {
            const void *p;
            size_t n;
            float *s;
            cudaStream_t st;
        } r = {bn.ix.ids, bytes, sink, bn.st};
        float t = time_ms(bn.st, 3, 10, [](void *p) { R *r = (R *)p; CU_CHECK(read_bandwidth_kernel(r->p, r->n, r->s, r->st)); }, &r);
        bw = bytes / (t * 1e-3);
        printf("read bandwidth (streaming the index, %.0f MB): %.2f TB/s\n", bytes / 1e6, bw / 1e12);
    }
    auto run_encode = [](void *p) {
        Bench *b = (Bench *)p;
        CU_CHECK(pkv_gpu_index_reset(&b->ix, -1, b->st));
        CU_CHECK(pkv_gpu_encode(&b->ix, b->src, b->from, b->to, b->st));
    };
    // From the host store (pinned, UVA): 64K slots of every head.
    {
        int hn = 1 << 16;
        size_t row = 2 * (size_t)D, elems = (size_t)hn * n_kv * row;
        uint16_t *hs;
        CU_CHECK(cudaHostAlloc(&hs, elems * 2, cudaHostAllocMapped));
        Xorshift r = {99};
        for (size_t e = 0; e < elems; e++) hs[e] = f32_to_bf16(0.3f + r.uni());
        bf16 *hd;
        CU_CHECK(cudaHostGetDevicePointer((void **)&hd, hs, 0));
        bn.src = {hd, (size_t)n_kv * row, row, (size_t)n_kv * row, NULL, 0, 0}, bn.from = 0, bn.to = hn;
        float t = time_ms(bn.st, 1, 5, run_encode, &bn);
        double keys = (double)hn * n_kv;
        printf("encode from the host store (UVA): %d slots x %d heads in %.2f ms: %.1f M keys/s, %.1f GB/s of keys\n", hn, n_kv, t,
               keys / (t * 1e-3) / 1e6, keys * D * 2 / (t * 1e-3) / 1e9);
        cudaFreeHost(hs);
    }
    bn.src = {dk, 0, (size_t)n * D, (size_t)D, NULL, 0, 0};
    bn.from = n - 512, bn.to = n;
    float tu = time_ms(bn.st, 2, 10, run_encode, &bn);
    printf("encode an update of 512 slots x %d heads (device keys): %.1f us\n", n_kv, tu * 1e3);
    bn.from = 0, bn.to = n;
    float te = time_ms(bn.st, 1, 3, run_encode, &bn); // leaves the whole zone encoded
    printf("encode %d slots x %d heads (device keys): %.1f ms: %.1f M keys/s, %.0f GB/s of keys\n", n, n_kv, te,
           (double)n * n_kv / (te * 1e-3) / 1e6, (double)n * n_kv * D * 2 / (te * 1e-3) / 1e9);
    for (int k : {100, 2048}) {
        bn.k = k, bn.d_q = d_q, bn.nh = n_kv * G;
        float t = time_ms(bn.st, 5, 20, [](void *p) {
            Bench *b = (Bench *)p;
            CU_CHECK(pkv_gpu_select(&b->s, &b->ix, 0, b->d_q, b->nh, b->d_n, b->k, 0.0f, 0.0f, b->st));
        }, &bn);
        cudaGraph_t g;
        CU_CHECK(cudaStreamBeginCapture(bn.st, cudaStreamCaptureModeThreadLocal));
        CU_CHECK(pkv_gpu_select(&bn.s, &bn.ix, 0, d_q, n_kv * G, bn.d_n, k, 0.0f, 0.0f, bn.st));
        CU_CHECK(cudaStreamEndCapture(bn.st, &g));
        CU_CHECK(cudaGraphInstantiate(&bn.graph, g, 0));
        cudaGraphDestroy(g);
        float tg = time_ms(bn.st, 5, 20, [](void *p) { Bench *b = (Bench *)p; CU_CHECK(cudaGraphLaunch(b->graph, b->st)); }, &bn);
        cudaGraphExecDestroy(bn.graph);
        // Bytes the step must read: ids of every slot, the scores again (written by the vote),
        // codes and w of the C = n / 10 candidates.
        double C = ceil(n * 0.1), bytes = (double)n_kv * ((double)n * (B + 1) + C * 6 * B);
        printf("select k=%4d: %.1f us (as a graph: %.1f us): %.0f MB read, %.2f TB/s (%.0f%% of the read bandwidth)\n",
               k, t * 1e3, tg * 1e3, bytes / 1e6, bytes / (t * 1e-3) / 1e12, 100 * bytes / (t * 1e-3) / bw);
        stage_times(bn, d_q, G, C);
    }
    CU_CHECK(cudaGetLastError());
    pkv_gpu_scratch_free(&bn.s);
    pkv_gpu_index_free(&bn.ix);
    cudaFree(dk), cudaFree(d_q), cudaFree(sink), cudaFree(bn.d_n);
    cudaStreamDestroy(bn.st);
}

int main(void) {
    cudaDeviceProp prop;
    CU_CHECK(cudaGetDeviceProperties(&prop, 0));
    const char *qe = getenv("PKV_TEST_QUICK"), *mu = getenv("PKV_TEST_MUTANT");
    bool quick = qe && *qe && strcmp(qe, "0");
    mutant_mode = mu && *mu && strcmp(mu, "0");
    printf("device: %s (%d SMs)%s\n", prop.name, prop.multiProcessorCount, quick ? ", quick (PKV_TEST_QUICK)" : "");
    unsigned long long seed = 1000;
    const char *bo = getenv("PKV_TEST_BENCH_ONLY"); // profiling the timing part alone (counts no check)
    if (bo && *bo && strcmp(bo, "0")) { // a zone size past 1000: that one alone
        int n = atoi(bo);
        if (n > 1000) bench(n);
        else bench(1 << 20), bench(1 << 17);
        return 0;
    }
    test_encode(64, 2, 3, 1000, 333, 999, seed++);
    test_encode(128, 2, 3, 5000, 1000, 4321, seed++);
    test_encode(256, 1, 2, 700, 512, 700, seed++);

    int big = quick ? 20000 : 200000;
    std::vector<SelCfg> cfgs = {
        {64, 2, 3, 3.0f, "D=64", {{0, 100, 0, 0}, {60, 100, 0, 0}, {100, 100, 0, 0}, {101, 100, 0, 0}, {3000, 100, 0, 0},
                                  {3000, 2048, 0, 0}, {20000, 100, 0, 0}, {20000, 100, 0.3f, 0.3f}, {big, 100, 0, 0}}},
        {128, 8, 4, 3.0f, "D=128", {{0, 100, 0, 0}, {100, 100, 0, 0}, {3000, 100, 0, 0}, {20000, 100, 0, 0},
                                    {big, 100, 0, 0}, {big, 2048, 0, 0}, {9999, 2048, 0.25f, 0.3f},
                                    {quick ? 20000 : 400000, 100, 0, 0}}}, // full runs: past 32,768 candidates, the top-k's cluster
        {256, 1, 8, 2.0f, "D=256", {{5000, 100, 0, 0}, {30001, 100, 0, 0}, {30001, 700, 0, 0}}},
        // Nearly parallel keys: skewed counts, most scores and estimates equal (ties everywhere),
        // and many candidates in the k-th's first radix bin (the top-k's later digits decide).
        // The first case's 13K-30K candidates take the top-k's one-block path, the second's 34K-40K its cluster.
        {128, 2, 2, 200.0f, "degenerate", {{quick ? 131072 : 300000, 100, 0, 0}, {quick ? 340000 : 400000, 1000, 0, 0}}},
    };
    if (mutant_mode) printf("PKV_TEST_MUTANT: one selected slot changed on the device after every selection: its selection checks must FAIL\n");
    // Both selections (PKV_SELECT picks one at scratch allocation), each against the CPU.
    for (const char *variant : {"four", "five"}) {
        setenv("PKV_SELECT", variant, 1);
        printf("\n== selection variant: %s\n", variant);
        unsigned long long vseed = seed;
        for (const SelCfg &c : cfgs) run_select_cfg(c, vseed++);
        if (!quick && !mutant_mode) bench(1 << 20), bench(1 << 17);
    }
    unsetenv("PKV_SELECT");
    if (mutant_mode) printf("mutant: flagged in %d of %d planted cases (every one must be)\n", mutants_flagged, mutants_planted);
    printf("\n%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
