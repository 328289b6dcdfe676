// The quantized-weight kernels (kernels/gemv_quant.cu) against the CPU reference on fresh random
// inputs, then timed at Llama-3.1-8B's shapes beside the device's read bandwidth.
//
// Blocks come from model/quant.c's quantizers (GGML's reference algorithms) applied to random
// rows, so their scales are what real weights give. The decode GEMVs multiply activations
// quantized per 32 (model/quant.h's ActQ8): the kernel quantizes x (times g) itself with the
// CPU's act_q8_quantize arithmetic, so the reference quantizes the same fp32 values with that
// function and sums w (weights_rows_to_f32: GGML's values, exactly) times dx q in double. The
// blocks' integer sums are exact on both sides, so what remains are the fp32 roundings (u = 2^-24):
// per 32 weights at most 6 (d dx or d sc dx, times the sum, the min term's product, the
// difference, the accumulation) and a lane's and the warp's additions (units / 32 + 5):
// |got - want| <= (n / 32 + 16) u * S, S = sum over the row of mag |dx q|, mag = |d sc q| +
// |dmin m| (Q8_0, Q4_0: |w|), every rounding adding up (Higham, Accuracy and Stability, 3.1). Epilogues
// add what they compute: 1/rms from fp32 sums (+ (n_sumsq + 8) u relative), SwiGLU's silu (slope
// below 1.1) and its bf16 output (2^-9 relative), the residual's bf16 copy (2^-9 relative).
// Dequantization for the prefill GEMMs: exactly the bf16 of GGML's value (times the norm weight).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_common.h"
#include "gemv_quant.h"
#include "kernels.h"
#include "forward_cuda.h"
extern "C" {
#include "../model/bf16.h"
#include "../model/config.h"
#include "../model/quant.h"
#include "variants.h"
}

static int passed, failed;
static unsigned long long rng = 0x2545F4914F6CDD1Dull;
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

typedef struct {
    uint32_t dt;
    int rows, cols;
    std::vector<uint8_t> blocks; // GGML blocks, row after row
    std::vector<float> w;        // weights_rows_to_f32 of them
    std::vector<double> mag;     // per weight |d sc q| + |dmin m| (Q8_0, Q4_0: |w|)
    QMat dev;
} Mat;

static void make_mat(Mat &m, uint32_t dt, int rows, int cols) {
    m.dt = dt, m.rows = rows, m.cols = cols;
    size_t rb = dtype_row_bytes(dt, cols);
    m.blocks.resize(rb * rows);
    std::vector<float> row(cols);
    for (int r = 0; r < rows; r++) {
        float scale = 0.02f * (1.0f + (float)(r % 7)); // rows of different magnitudes
        for (int c = 0; c < cols; c++) row[c] = scale * frand();
        if (dt == DTYPE_Q8_0) quantize_row_q8_0(row.data(), m.blocks.data() + rb * r, cols);
        else if (dt == DTYPE_Q4_K) quantize_row_q4_k(row.data(), m.blocks.data() + rb * r, cols);
        else // Q4_0 (GGUF files only, no quantizer here): random nibbles, d of the row's scale
            for (int b = 0; b < cols / 32; b++) {
                uint8_t *blk = m.blocks.data() + rb * r + (size_t)b * Q4_0_BYTES;
                uint16_t h = f32_to_f16(scale / 8.0f * (0.5f + 0.5f * fabsf(frand())));
                memcpy(blk, &h, 2);
                for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(frand() * 128.0f + 128.0f);
            }
    }
    m.w.resize((size_t)rows * cols);
    weights_rows_to_f32(m.blocks.data(), dt, 0, rows, cols, m.w.data());
    m.mag.resize((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            if (dt != DTYPE_Q4_K) {
                m.mag[i] = fabs(m.w[i]);
            } else {
                const uint8_t *blk = m.blocks.data() + rb * r + (size_t)(c / 256) * Q4_K_BYTES;
                float d = f16_to_f32(*(const uint16_t *)blk), dmin = f16_to_f32(*(const uint16_t *)(blk + 2));
                int sc, mn, k = c % 256;
                q4_k_scale_min(k / 32, blk + 4, &sc, &mn);
                const uint8_t *qs = blk + 16 + (k / 64) * 32;
                int q = (k % 64) < 32 ? qs[k % 32] & 15 : qs[k % 32] >> 4;
                m.mag[i] = fabs((double)d * sc * q) + fabs((double)dmin * mn);
            }
        }
    std::vector<int8_t> qs(qmat_qs_bytes(dt, rows, cols));
    std::vector<uint8_t> meta(qmat_meta_bytes(dt, rows, cols));
    qmat_repack_rows(dt, m.blocks.data(), rows, cols, 0, 1, qs.data(), meta.data());
    m.dev = {dt, rows, cols, NULL, NULL};
    CU_CHECK(cudaMalloc(&m.dev.qs, qs.size()));
    CU_CHECK(cudaMalloc(&m.dev.meta, meta.size()));
    CU_CHECK(cudaMemcpy(m.dev.qs, qs.data(), qs.size(), cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(m.dev.meta, meta.data(), meta.size(), cudaMemcpyHostToDevice));
}

static void free_mat(Mat &m) { cudaFree(m.dev.qs), cudaFree(m.dev.meta); }

static double silu(double a) { return a / (1.0 + exp(-a)); }

// One GEMV variant against the reference: epi GEMV_STORE / ADD / SWIGLU; normed: x times g and
// 1/rms from sumsq; stats: the residual add's bf16 copy and sums of squares.
static void check_gemv(Mat &m, int epi, bool normed, bool stats, int variant = -1) {
    int n = m.cols, d = m.rows;
    const double u = 1.0 / 16777216.0;
    std::vector<uint16_t> xb(n);
    std::vector<float> x(n), g(n), y0(d), sums(13);
    for (int i = 0; i < n; i++) xb[i] = f32_to_bf16(2.0f * frand()), x[i] = bf16_to_f32(xb[i]), g[i] = 1.0f + 0.5f * frand();
    for (int i = 0; i < d; i++) y0[i] = frand();
    double ss = 0;
    for (int i = 0; i < 13; i++) sums[i] = 3.0f + 2.0f * frand(), ss += sums[i];
    // reference: x (times g, one fp32 rounding as in the kernel) quantized as the CPU quantizes,
    // per row the dot product in double and its bound's magnitude
    std::vector<float> xg(n), ad(n / 32);
    std::vector<int8_t> aq(n);
    std::vector<int32_t> asum(n / 32);
    for (int c = 0; c < n; c++) xg[c] = normed ? x[c] * g[c] : x[c];
    ActQ8 act = {n, aq.data(), ad.data(), asum.data()};
    act_q8_quantize(xg.data(), &act);
    std::vector<double> dot(d), bound(d);
    double inv_rms = normed ? 1.0 / sqrt(ss / n + 1e-5) : 1.0, rms_rel = normed ? (13 + 8) * u : 0.0;
    for (int r = 0; r < d; r++) {
        double s = 0, S = 0;
        for (int c = 0; c < n; c++) {
            double xc = (double)ad[c / 32] * aq[c];
            s += (double)m.w[(size_t)r * n + c] * xc;
            S += m.mag[(size_t)r * n + c] * fabs(xc);
        }
        dot[r] = s * inv_rms;
        bound[r] = (n / 32 + 16) * u * S * inv_rms + fabs(dot[r]) * rms_rel;
    }
    float *dy, *dg, *dsum, *dstats;
    bf16 *dx, *dyb;
    CU_CHECK(cudaMalloc(&dy, d * 4 + 16));
    CU_CHECK(cudaMalloc(&dx, n * 2 + 16));
    CU_CHECK(cudaMalloc(&dg, n * 4 + 16));
    CU_CHECK(cudaMalloc(&dsum, 13 * 4));
    CU_CHECK(cudaMalloc(&dyb, d * 2 + 16));
    CU_CHECK(cudaMalloc(&dstats, ((d + 3) / 4) * 4 + 16));
    CU_CHECK(cudaMemcpy(dy, y0.data(), d * 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(dx, xb.data(), n * 2, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(dg, g.data(), n * 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(dsum, sums.data(), 13 * 4, cudaMemcpyHostToDevice));
    if (variant >= 0) CU_CHECK(gemv_q_variant(dy, &m.dev, dx, epi, stats ? dyb : NULL, stats ? dstats : NULL, variant, 0));
    else if (stats) CU_CHECK(gemv_q_add_stats(dy, &m.dev, dx, dyb, dstats, 0));
    else if (normed) CU_CHECK(gemv_q_normed(dy, &m.dev, dx, epi, dg, dsum, 13, 1e-5f, 0));
    else CU_CHECK(gemv_q(dy, &m.dev, dx, epi, 0));
    CU_CHECK(cudaDeviceSynchronize());
    int outs = epi == GEMV_SWIGLU ? d / 2 : d;
    std::vector<float> got(outs);
    std::vector<uint16_t> gotb(epi == GEMV_SWIGLU ? outs : 0), ybf(stats ? d : 0);
    std::vector<float> gst(stats ? (d + 3) / 4 : 0);
    if (epi == GEMV_SWIGLU) {
        CU_CHECK(cudaMemcpy(gotb.data(), dy, outs * 2, cudaMemcpyDeviceToHost));
        for (int i = 0; i < outs; i++) got[i] = bf16_to_f32(gotb[i]);
    } else {
        CU_CHECK(cudaMemcpy(got.data(), dy, outs * 4, cudaMemcpyDeviceToHost));
    }
    if (stats) {
        CU_CHECK(cudaMemcpy(ybf.data(), dyb, d * 2, cudaMemcpyDeviceToHost));
        CU_CHECK(cudaMemcpy(gst.data(), dstats, gst.size() * 4, cudaMemcpyDeviceToHost));
    }
    double worst = 0; // max over outputs of |got - want| / allowed
    for (int i = 0; i < outs; i++) {
        double want, allow;
        if (epi == GEMV_SWIGLU) {
            double a = dot[2 * i], b = dot[2 * i + 1];
            want = silu(a) * b;
            allow = 1.1 * bound[2 * i] * fabs(b) + fabs(silu(a)) * bound[2 * i + 1] + fabs(want) / 256.0 + 1e-30;
        } else if (epi == GEMV_ADD) {
            want = y0[i] + dot[i];
            allow = bound[i] + fabs(want) * u + 1e-30;
        } else {
            want = dot[i];
            allow = bound[i] + 1e-30;
        }
        worst = std::max(worst, fabs(got[i] - want) / allow);
        if (stats) worst = std::max(worst, fabs(bf16_to_f32(ybf[i]) - got[i]) / (fabs(got[i]) / 256.0 + 1e-30));
    }
    if (stats)
        for (size_t k = 0; k < gst.size(); k++) {
            double want = 0;
            for (int r = 4 * (int)k; r < 4 * (int)k + 4 && r < d; r++) want += (double)got[r] * got[r];
            worst = std::max(worst, fabs(gst[k] - want) / (8 * u * want + 1e-30));
        }
    const char *en = epi == GEMV_SWIGLU ? "swiglu" : epi == GEMV_ADD ? "add" : "store";
    char fmt[200];
    char vn[32] = "";
    if (variant >= 0) snprintf(vn, sizeof vn, ", variant %d", variant);
    snprintf(fmt, sizeof fmt, "%s %dx%d %s%s%s%s: worst error %%.3g of its bound (%%.0f)", dtype_name(m.dt), d, n, en, normed ? ", normed" : "",
             stats ? ", with the residual's bf16 and sums of squares" : "", vn);
    check(worst <= 1.0, fmt, worst, 1.0);
    cudaFree(dy), cudaFree(dx), cudaFree(dg), cudaFree(dsum), cudaFree(dyb), cudaFree(dstats);
}

static void check_dequant(Mat &m, bool with_g) {
    size_t n = (size_t)m.rows * m.cols;
    std::vector<float> g(m.cols);
    for (int i = 0; i < m.cols; i++) g[i] = 1.0f + 0.5f * frand();
    float *dg;
    bf16 *dw;
    CU_CHECK(cudaMalloc(&dg, m.cols * 4));
    CU_CHECK(cudaMalloc(&dw, n * 2));
    CU_CHECK(cudaMemcpy(dg, g.data(), m.cols * 4, cudaMemcpyHostToDevice));
    CU_CHECK(qmat_to_bf16(dw, &m.dev, with_g ? dg : NULL, 0));
    std::vector<uint16_t> got(n);
    CU_CHECK(cudaMemcpy(got.data(), dw, n * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = with_g ? m.w[i] * g[i % m.cols] : m.w[i];
        bad += got[i] != f32_to_bf16(want);
    }
    char fmt[160];
    snprintf(fmt, sizeof fmt, "%s %dx%d dequantized to bf16%s: %%.0f of %%.0f values differ from bf16(GGML's)", dtype_name(m.dt), m.rows,
             m.cols, with_g ? " times a norm's weights" : "");
    check(bad == 0, fmt, (double)bad, (double)n);
    cudaFree(dg), cudaFree(dw);
}

// Median microseconds of a GEMV (STORE, or SWIGLU for the gate/up shape) over 50 runs, for each
// variant beside the launch's own pick.
static void time_gemv(uint32_t dt, int rows, int cols, int epi, const char *what, double bw) {
    QMat q = {dt, rows, cols, NULL, NULL};
    CU_CHECK(cudaMalloc(&q.qs, qmat_qs_bytes(dt, rows, cols)));
    CU_CHECK(cudaMalloc(&q.meta, qmat_meta_bytes(dt, rows, cols)));
    CU_CHECK(qmat_fill_random(&q, 7, 0.05f, 0));
    float *y;
    bf16 *x;
    CU_CHECK(cudaMalloc(&y, (size_t)rows * 4));
    CU_CHECK(cudaMalloc(&x, (size_t)cols * 2));
    CU_CHECK(cudaMemset(x, 0, (size_t)cols * 2));
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    double bytes = (double)(qmat_qs_bytes(dt, rows, cols) + qmat_meta_bytes(dt, rows, cols));
    printf("| %s | %s | %d x %d | %.1f MB |", dtype_name(dt), what, rows, cols, bytes / 1e6);
    for (int v = -1; v < 2; v++) {
        std::vector<float> t(50);
        for (int i = 0; i < 60; i++) {
            cudaEventRecord(a);
            CU_CHECK(gemv_q_variant(y, &q, x, epi, NULL, NULL, v, 0));
            cudaEventRecord(b);
            cudaEventSynchronize(b);
            if (i >= 10) cudaEventElapsedTime(&t[i - 10], a, b);
        }
        std::sort(t.begin(), t.end());
        double us = t[25] * 1e3;
        printf(" %.1f (%.2f) |", us, bytes / us / 1e6 / (bw / 1e12));
    }
    printf("\n");
    cudaEventDestroy(a), cudaEventDestroy(b);
    cudaFree(y), cudaFree(x), cudaFree(q.qs), cudaFree(q.meta);
}

int main(void) {
    uint32_t dts[3] = {DTYPE_Q8_0, DTYPE_Q4_K, DTYPE_Q4_0};
    for (int k = 0; k < 3; k++) {
        int shapes[5][2] = {{96, 512}, {50, 1024}, {34, 2304}, {18, 14336}, {9000, 256}}; // odd warps, partial blocks of 16 rows, partial groups of 32 units, several batches a warp, more row groups than the grid has blocks
        for (int s = 0; s < 5; s++) {
            Mat m;
            make_mat(m, dts[k], shapes[s][0], shapes[s][1]);
            check_gemv(m, GEMV_STORE, false, false);
            check_gemv(m, GEMV_ADD, false, false);
            check_gemv(m, GEMV_SWIGLU, false, false);
            check_gemv(m, GEMV_STORE, true, false);
            check_gemv(m, GEMV_SWIGLU, true, false);
            check_gemv(m, GEMV_ADD, false, true);
            for (int v = 0; v < 2; v++) { // every variant the launch may pick
                check_gemv(m, GEMV_STORE, false, false, v);
                check_gemv(m, GEMV_ADD, false, true, v);
                check_gemv(m, GEMV_SWIGLU, false, false, v);
            }
            check_dequant(m, false);
            check_dequant(m, true);
            free_mat(m);
        }
    }
    { // SmolLM2's width: Q8_0 rows of 576 (18 blocks)
        Mat m;
        make_mat(m, DTYPE_Q8_0, 64, 576);
        check_gemv(m, GEMV_STORE, true, false);
        check_gemv(m, GEMV_ADD, false, true);
        check_dequant(m, true);
        free_mat(m);
    }
    if (!getenv("PKV_SKIP_BENCH")) {
        double bw = gpu_read_bandwidth();
        printf("\nmeasured read bandwidth %.2f TB/s; median of 50 runs after 10\n\n", bw / 1e12);
        printf("us (of bandwidth); variants: 0 blocks of 8 warps, 1 of 16 (each warp two rows)\n\n");
        printf("| format | matrix | rows x cols | bytes | picked | 0 | 1 |\n| --- | --- | --- | --- | --- | --- | --- |\n");
        for (int k = 0; k < 3; k++) {
            time_gemv(dts[k], 6144, 4096, GEMV_STORE, "QKV", bw);
            time_gemv(dts[k], 4096, 4096, GEMV_STORE, "O", bw);
            time_gemv(dts[k], 28672, 4096, GEMV_SWIGLU, "gate/up", bw);
            time_gemv(dts[k], 4096, 14336, GEMV_STORE, "down", bw);
            time_gemv(dts[k], 128256, 4096, GEMV_STORE, "head", bw);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
