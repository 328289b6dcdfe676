// Decode GEMV at the memory-bandwidth floor: every weight byte is read once with 16-byte
// loads. Three variants, benchmarked side by side in kernels/test_kernels.cu:
//   v1 (staged): x staged once per block in shared memory; each warp computes two rows.
//   v2 (rowwarp): one row (a gate/up pair for SwiGLU) per warp, x read through L1, U loads
//       per lane issued before any arithmetic so enough bytes are in flight for short matrices.
//   v3 (rowwarp2, what gemv_bf16 and the decode pass use): v2 with two rows a warp for STORE and
//       ADD (SwiGLU as v2), in blocks of two warps.
#include "cuda_common.h"
#include "kernels.h"
#include "pdl.h"
#include "spin_limit.cuh"
#include "variants.h"

#define GEMV_WARPS 8

__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
    const __nv_bfloat162 *wp = (const __nv_bfloat162 *)&w, *xp = (const __nv_bfloat162 *)&x;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 a = __bfloat1622float2(wp[i]), b = __bfloat1622float2(xp[i]);
        s = fmaf(a.x, b.x, s);
        s = fmaf(a.y, b.y, s);
    }
    return s;
}

template <int EPI>
__global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_kernel(void *y, const bf16 *W, const bf16 *x, int n, int d) {
    extern __shared__ uint4 xs[]; // x, n/8 chunks of 8 bf16
    int chunks = n / 8;
    for (int i = threadIdx.x; i < chunks; i += blockDim.x) xs[i] = ((const uint4 *)x)[i];
    __syncthreads();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int pairs = (d + 1) / 2;
    for (int p = blockIdx.x * GEMV_WARPS + warp; p < pairs; p += gridDim.x * GEMV_WARPS) {
        int r0 = 2 * p, r1 = r0 + 1 < d ? r0 + 1 : r0; // odd d: the last warp computes one row twice
        const uint4 *w0 = (const uint4 *)(W + (size_t)r0 * n), *w1 = (const uint4 *)(W + (size_t)r1 * n);
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 4
        for (int c = lane; c < chunks; c += 32) {
            uint4 a = __ldg(w0 + c), b = __ldg(w1 + c), xv = xs[c];
            s0 += dot8(a, xv);
            s1 += dot8(b, xv);
        }
        s0 = warp_sum(s0);
        s1 = warp_sum(s1);
        if (lane == 0) {
            if (EPI == GEMV_SWIGLU) {
                ((bf16 *)y)[p] = __float2bfloat16(s0 / (1.0f + __expf(-s0)) * s1);
            } else {
                float *yf = (float *)y;
                if (EPI == GEMV_ADD) {
                    yf[r0] += s0;
                    if (r1 != r0) yf[r1] += s1;
                } else {
                    yf[r0] = s0;
                    if (r1 != r0) yf[r1] = s1;
                }
            }
        }
    }
}

#define ROW_WARPS 4
#define ROW_UNROLL 8

// The RMSNorm between a residual add and the next GEMV, split across the two so that it needs
// no kernel (and no serial step) of its own: the producer (GEMV_ADD with stats) also writes
// bf16(y) and each block's sum of squares of its rows; the consumer (norm_in) multiplies its
// dot products with bf16(y) by 1/rms, rms² = (sum of those sums) / n + eps. The norm's weights
// are folded into the consumer's weight columns when the model is loaded (scale_columns).
struct NormLink {
    bf16 *y_bf16;          // producer: (d) bf16 copy of the result
    float *sumsq;          // producer: (blocks) sums of squares
    const float *sumsq_in; // consumer: the producer's sums
    int n_sumsq;           // consumer: how many
    float eps;
};

// TpSum's 8-byte entries: the value's bits and the call's number, stored and read whole.
__device__ __forceinline__ void st_entry(uint2 *p, uint2 v) {
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ uint2 ld_entry(const uint2 *p) {
    uint2 v;
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
    return v;
}

// Row `row`'s sum over the ranks (TpSum in kernels.h), in two halves so that a warp's rows are
// all sent before it waits for any: tp_row_send gives v, this rank's part, to every peer;
// tp_row_sum reads the peers' parts from this rank's slots as they land, the sum in rank order.
__device__ __forceinline__ void tp_row_send(const TpSum &tp, int row, float v, unsigned e) {
    const size_t par = (size_t)(e & 1) * tp.n;
    for (int q = 0; q < tp.n; q++)
        if (q != tp.rank) st_entry((uint2 *)tp.slot[q] + (par + tp.rank) * TP_SUM_ROWS + row, make_uint2(__float_as_uint(v), e));
}
__device__ __forceinline__ float tp_row_sum(const TpSum &tp, int row, float v, unsigned e) {
    const size_t par = (size_t)(e & 1) * tp.n;
    const uint2 *mine = (const uint2 *)tp.slot[tp.rank];
    float a = 0.0f;
    for (int q = 0; q < tp.n; q++) {
        float w = v;
        if (q != tp.rank) {
            const uint2 *src = mine + (par + q) * TP_SUM_ROWS + row;
            uint2 l = ld_entry(src);
            long spins = 0;
            while (l.y != e) {
                spin_limit(&spins); // a lost peer: a launch error, not a hang
                l = ld_entry(src);
            }
            w = __uint_as_float(l.x);
        }
        a = q == 0 ? w : a + w;
    }
    return a;
}

// RPW (STORE and ADD: 1 or 2): rows a warp computes, sharing its loads of x, in blocks of
// ROW_WARPS / RPW warps, so that a block still covers ROW_WARPS rows (the sums of squares stay one
// a 4 rows). Two rows a warp put twice the weight bytes in flight per warp, and per SM (96
// registers: 20 warps of 8 KB, against 32 of 4 KB), the first batch included, which is asked for
// before the wait: Llama-3.1-8B's step at 4K 4.41 -> 4.31 ms on an H200 (tests/bench/GPU.md,
// session 26). The tensor-parallel residual GEMV keeps one row a warp (gemv_bf16_add_stats_tp).
// SwiGLU keeps one gate/up pair a warp (two pairs with half the loads each measured the same).
template <int EPI, bool NORM_IN, bool STATS, bool TP = false, int RPW = 1>
__global__ void __launch_bounds__(ROW_WARPS / RPW * 32)
    gemv_row_kernel(void *y, const bf16 *W, const bf16 *x, int n, int d, NormLink nl, TpSum tp) {
    static_assert(RPW == 1 || (RPW == 2 && EPI != GEMV_SWIGLU), "RPW");
    constexpr int R = EPI == GEMV_SWIGLU ? 2 : RPW; // rows per warp
    constexpr int WARPS = ROW_WARPS / RPW;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int unit = blockIdx.x * WARPS + warp;
    bool active = unit * R < d; // (RPW > 1: the launch makes sure d is a multiple of RPW)
    int chunks = n / 8;
    const uint4 *xv = (const uint4 *)x;
    const uint4 *w[R];
#pragma unroll
    for (int r = 0; r < R; r++) w[r] = (const uint4 *)(W + (size_t)(active ? unit * R + r : 0) * n);
    // The next kernel may launch as soon as every block of this one has started (it waits for
    // this one to finish before reading its output). The first batch of weights is requested
    // before waiting on the previous kernel: weights are read-only, and their loads then
    // overlap that kernel's tail.
    pdl_release();
    uint4 wv[R][ROW_UNROLL];
#pragma unroll
    for (int u = 0; u < ROW_UNROLL; u++) {
        int c = u * 32 + lane;
#pragma unroll
        for (int r = 0; r < R; r++) wv[r][u] = active && c < chunks ? __ldcs(w[r] + c) : make_uint4(0, 0, 0, 0);
    }
    pdl_wait();
    // The call's number (TpSum): the step's count was written before this kernel's wait; read
    // now, so that its L2 round trip overlaps the row's dot product, not the exchange after it.
    const unsigned call_no = TP ? *tp.count * tp.per_step + tp.call : 0u;
    __shared__ float red[ROW_WARPS]; // NORM_IN: a warp's part of the sums; STATS: a row's square
    float inv_rms = 1.0f;
    if (NORM_IN) { // the block sums the producer's sums of squares (all loads in flight at once)
        float ss = 0.0f;
        for (int i0 = 0; i0 < nl.n_sumsq; i0 += 8 * WARPS * 32) {
            float v[8];
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int i = i0 + k * WARPS * 32 + threadIdx.x;
                v[k] = i < nl.n_sumsq ? nl.sumsq_in[i] : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < 8; k++) ss += v[k];
        }
        ss = warp_sum(ss); // block_sum's leading barrier measurably costs here: reduce by hand
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        ss = 0.0f;
#pragma unroll
        for (int i = 0; i < WARPS; i++) ss += red[i];
        inv_rms = rsqrtf(ss / (float)n + nl.eps);
    }
    float yv[R]; // this warp's new values (STATS)
#pragma unroll
    for (int r = 0; r < R; r++) yv[r] = 0.0f;
    if (active) {
        float s[R];
#pragma unroll
        for (int r = 0; r < R; r++) s[r] = 0.0f;
        for (int c0 = 0;;) {
            uint4 xx[ROW_UNROLL];
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; u++) {
                int c = c0 + u * 32 + lane;
                xx[u] = c < chunks ? __ldg(xv + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; u++)
#pragma unroll
                for (int r = 0; r < R; r++) s[r] += dot8(wv[r][u], xx[u]);
            c0 += 32 * ROW_UNROLL;
            if (c0 >= chunks) break;
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; u++) {
                int c = c0 + u * 32 + lane;
#pragma unroll
                for (int r = 0; r < R; r++) wv[r][u] = c < chunks ? __ldcs(w[r] + c) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) s[r] = warp_sum(s[r]) * inv_rms;
        if (lane == 0) {
            if (EPI == GEMV_SWIGLU) ((bf16 *)y)[unit] = __float2bfloat16(s[0] / (1.0f + __expf(-s[0])) * s[1]);
            else if (EPI == GEMV_STORE)
#pragma unroll
                for (int r = 0; r < R; r++) ((float *)y)[unit * R + r] = s[r];
            else {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    yv[r] = !TP || tp.add ? ((float *)y)[unit * R + r] + s[r] : s[r];
                    if (TP) tp_row_send(tp, unit * R + r, yv[r], call_no);
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int row = unit * R + r;
                    if (TP) {
                        float sum = tp_row_sum(tp, row, yv[r], call_no);
                        if (!tp.own_only) yv[r] = sum;
                    }
                    ((float *)y)[row] = yv[r];
                    if (STATS) nl.y_bf16[row] = __float2bfloat16(yv[r]);
                }
            }
        }
    }
    if (STATS) { // the block's sum of squares, its rows' squares added in row order
        if (NORM_IN) __syncthreads(); // red was read above
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < RPW; r++) red[warp * RPW + r] = yv[r] * yv[r];
        __syncthreads();
        if (threadIdx.x == 0) {
            float ss = 0.0f;
#pragma unroll
            for (int i = 0; i < ROW_WARPS; i++) ss += red[i];
            nl.sumsq[blockIdx.x] = ss;
        }
    }
}

template <int EPI, bool NORM_IN, bool STATS, bool TP, int RPW>
static cudaError_t launch_rpw(void *y, const bf16 *W, const bf16 *x, int n, int d, NormLink nl, cudaStream_t st, TpSum tp) {
    constexpr int warps = ROW_WARPS / RPW, R = EPI == GEMV_SWIGLU ? 2 : RPW;
    int blocks = (d / R + warps - 1) / warps;
    return launch_pdl(gemv_row_kernel<EPI, NORM_IN, STATS, TP, RPW>, blocks, warps * 32, 0, st, y, W, x, n, d, nl, tp);
}

// rpw: rows a warp (STORE and ADD), 2 unless d is odd; 1 keeps the one-row kernel (the side by side).
template <int EPI, bool NORM_IN, bool STATS, bool TP = false>
static cudaError_t launch_row(void *y, const bf16 *W, const bf16 *x, int n, int d, NormLink nl, cudaStream_t st, TpSum tp = TpSum{},
                              int rpw = 2) {
    if constexpr (EPI != GEMV_SWIGLU)
        if (rpw == 2 && d % 2 == 0) return launch_rpw<EPI, NORM_IN, STATS, TP, 2>(y, W, x, n, d, nl, st, tp);
    return launch_rpw<EPI, NORM_IN, STATS, TP, 1>(y, W, x, n, d, nl, st, tp);
}

static cudaError_t rowwarp(void *y, const bf16 *W, const bf16 *x, int n, int d, int epilogue, cudaStream_t st, int rpw) {
    NormLink none = {NULL, NULL, NULL, 0, 0.0f};
    switch (epilogue) {
    case GEMV_STORE: return launch_row<GEMV_STORE, false, false>(y, W, x, n, d, none, st, TpSum{}, rpw);
    case GEMV_ADD: return launch_row<GEMV_ADD, false, false>(y, W, x, n, d, none, st, TpSum{}, rpw);
    case GEMV_SWIGLU: return launch_row<GEMV_SWIGLU, false, false>(y, W, x, n, d, none, st, TpSum{}, rpw);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t gemv_bf16_rowwarp(void *y, const bf16 *W, const bf16 *x, int n, int d, int epilogue, cudaStream_t st) {
    return rowwarp(y, W, x, n, d, epilogue, st, 1);
}
extern "C" cudaError_t gemv_bf16_rowwarp2(void *y, const bf16 *W, const bf16 *x, int n, int d, int epilogue, cudaStream_t st) {
    return rowwarp(y, W, x, n, d, epilogue, st, 2);
}

extern "C" int gemv_sumsq_count(int d) { return (d + ROW_WARPS - 1) / ROW_WARPS; }

extern "C" cudaError_t gemv_bf16_add_stats(float *y, const bf16 *W, const bf16 *x, int n, int d, bf16 *y_bf16,
                                           float *sumsq, cudaStream_t st) {
    NormLink nl = {y_bf16, sumsq, NULL, 0, 0.0f};
    return launch_row<GEMV_ADD, false, true>(y, W, x, n, d, nl, st);
}

extern "C" cudaError_t gemv_bf16_add_stats_tp(float *y, const bf16 *W, const bf16 *x, int n, int d, bf16 *y_bf16, float *sumsq, TpSum tp,
                                              cudaStream_t st) {
    if (d > TP_SUM_ROWS || tp.n < 1 || tp.n > TP_SUM_RANKS || tp.per_step % 2) return cudaErrorInvalidValue;
    NormLink nl = {y_bf16, sumsq, NULL, 0, 0.0f};
    // One row a warp: with two, each warp's exchange waits on both rows' peers, and fewer warps
    // exchange at once (two H200s at 4K: 2.631 ms a step against 2.611, tests/bench/GPU.md session 26).
    return launch_row<GEMV_ADD, false, true, true>(y, W, x, n, d, nl, st, tp, 1);
}

extern "C" cudaError_t gemv_bf16_normed(void *y, const bf16 *W, const bf16 *x, int n, int d, int epilogue,
                                        const float *sumsq, int n_sumsq, float eps, cudaStream_t st) {
    NormLink nl = {NULL, NULL, sumsq, n_sumsq, eps};
    switch (epilogue) {
    case GEMV_STORE: return launch_row<GEMV_STORE, true, false>(y, W, x, n, d, nl, st);
    case GEMV_SWIGLU: return launch_row<GEMV_SWIGLU, true, false>(y, W, x, n, d, nl, st);
    default: return cudaErrorInvalidValue;
    }
}

// W (rows, cols) bf16: column c *= g[c] (a norm's weights folded into the matrix after it).
__global__ void scale_columns_kernel(bf16 *W, size_t rows, int cols, const float *g) {
    size_t n = rows * cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        W[i] = __float2bfloat16(__bfloat162float(W[i]) * g[i % cols]);
}

extern "C" cudaError_t scale_columns(bf16 *W, size_t rows, int cols, const float *g, cudaStream_t st) {
    scale_columns_kernel<<<2048, 256, 0, st>>>(W, rows, cols, g);
    return cudaGetLastError();
}

extern "C" cudaError_t gemv_bf16(void *y, const bf16 *W, const bf16 *x, int n, int d, int epilogue, cudaStream_t st) {
    return gemv_bf16_rowwarp2(y, W, x, n, d, epilogue, st);
}

extern "C" cudaError_t gemv_bf16_staged(void *y, const bf16 *W, const bf16 *x, int n, int d, int epilogue, cudaStream_t st) {
    int dev, sms;
    CU_TRY(cudaGetDevice(&dev));
    CU_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    size_t smem = (size_t)n * sizeof(bf16);
    int pairs = (d + 1) / 2;
    int blocks = (pairs + GEMV_WARPS - 1) / GEMV_WARPS;
    if (blocks > sms * 8) blocks = sms * 8;
    switch (epilogue) {
#define LAUNCH(E)                                                                                        \
    case E:                                                                                              \
        if (smem > 48 * 1024)                                                                            \
            CU_TRY(cudaFuncSetAttribute(gemv_kernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)); \
        gemv_kernel<E><<<blocks, GEMV_WARPS * 32, smem, st>>>(y, W, x, n, d);                            \
        break;
        LAUNCH(GEMV_STORE)
        LAUNCH(GEMV_ADD)
        LAUNCH(GEMV_SWIGLU)
#undef LAUNCH
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
