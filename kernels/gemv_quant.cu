// Quantized weights on the GPU (gemv_quant.h): the decode GEMVs that read Q8_0 / Q4_K / Q4_0
// rows, the dequantization a prefill GEMM multiplies, the upload's repacking and random blocks.
//
// Decode multiplies the blocks by activations quantized per 32 (model/quant.h's ActQ8, the CPU
// reference's arithmetic bit for bit), so a block's products are integer dot products (dp4a)
// and each weight costs about a quarter of an instruction. A GEMV block is 8 or 16 warps, each
// warp two rows (a gate/up pair for SwiGLU), so every activation byte read from shared memory
// serves two rows. Each block quantizes x (times the norm's weights) into shared memory once: 8
// values a thread, the 4 threads of a 32-block exchanging their max and sums by shuffles; then it
// takes row groups in turn (the grid is at most what fits on the GPU at once). That staging is
// what still separates these kernels from their bytes' floor (tests/bench/GPU.md, session 9).
//
// A lane's unit of work is 32 bytes of a row: a Q8_0 block, Q4_K's sub-block pair 2p, 2p + 1 of a
// super-block (bytes 32p .. 32p + 31: low nibbles pair with x[64p + l], high with x[64p + 32 + l]),
// or two Q4_0 blocks, so one unit needs one scale, one scale pair, or two scales.
// Why one file of ~570 lines: the three formats' GEMVs are one kernel template over a unit
// decoder, and the upload's repacking writes the layout those kernels read; together they
// change together.
#include <cuda_fp16.h>
#include <string.h>

#include "cuda_common.h"
#include "gemv_quant.h"
#include "pdl.h"

extern "C" {
#include "../model/config.h"
#include "../model/quant.h"
#include "variants.h"
}


struct QNorm {
    bf16 *y_bf16;          // producer: bf16 copy of the result
    float *sumsq;          // producer: sums of squares of rows in fours
    const float *sumsq_in; // consumer: the producer's sums
    int n_sumsq;
    float eps;
};

extern "C" size_t qmat_qs_bytes(uint32_t dt, size_t rows, size_t cols) { return dt == DTYPE_Q8_0 ? rows * cols : rows * cols / 2; }
extern "C" size_t qmat_meta_bytes(uint32_t dt, size_t rows, size_t cols) {
    return dt == DTYPE_Q4_K ? rows * (cols / 256) * 16 : rows * (cols / 32) * 2;
}
extern "C" int qmat_supported(uint32_t dt, size_t cols) {
    return (dt == DTYPE_Q8_0 && cols % 32 == 0) || (dt == DTYPE_Q4_K && cols % 256 == 0) || (dt == DTYPE_Q4_0 && cols % 64 == 0);
}

// The device order of a row's 16-byte chunks: units in groups of 32, a group's first halves, then
// its second halves (a last group of g < 32 units likewise), so that lane L of a warp loads unit
// 32j + L as chunks L and g + L of group j, each load coalesced, and holds its whole unit.
__host__ __device__ __forceinline__ size_t unit_chunk(size_t unit, int half, size_t n_units) {
    size_t g0 = unit & ~(size_t)31, gs = n_units - g0 < 32 ? n_units - g0 : 32;
    return 2 * g0 + (size_t)half * gs + (unit - g0);
}
static __host__ __device__ size_t row_units(uint32_t dt, size_t cols) { return dt == DTYPE_Q8_0 ? cols / 32 : cols / 64; }
static __host__ __device__ size_t block_elems(uint32_t dt) { return dt == DTYPE_Q8_0 ? QK8_0 : dt == DTYPE_Q4_0 ? QK4_0 : QK_K; }
static __host__ __device__ size_t block_bytes(uint32_t dt) { return dt == DTYPE_Q8_0 ? Q8_0_BYTES : dt == DTYPE_Q4_0 ? Q4_0_BYTES : Q4_K_BYTES; }

extern "C" void qmat_repack_rows(uint32_t dt, const uint8_t *src, size_t n, size_t cols, size_t row0, size_t step, int8_t *qs,
                                 uint8_t *meta) {
    size_t blocks = cols / block_elems(dt), units = row_units(dt, cols);
    size_t bb = block_bytes(dt), head = dt == DTYPE_Q4_K ? 16 : 2, body = bb - head;
    for (size_t i = 0; i < n; i++) {
        size_t r = row0 + i * step;
        uint8_t *row = (uint8_t *)qs + r * units * 32;
        for (size_t b = 0; b < blocks; b++) {
            const uint8_t *blk = src + (i * blocks + b) * bb;
            memcpy(meta + (r * blocks + b) * head, blk, head);
            for (size_t k = 0; k < body / 16; k++) { // the block's 16-byte chunks to their places
                size_t o = b * body + 16 * k; // in the row's quants
                memcpy(row + 16 * unit_chunk(o / 32, (int)((o / 16) & 1), units), blk + head + 16 * k, 16);
            }
        }
    }
}

// ---- decode GEMVs ----

// Small integers to float without the conversion unit (a quarter of the FMA rate): the float
// 2^23 + 2^22 + v for |v| < 2^22, less that constant, is v exactly.
__device__ __forceinline__ float i2f(int v) { return __int_as_float(v + 0x4B400000) - 12582912.0f; }
__device__ __forceinline__ float u6f(uint32_t v) { return __uint_as_float(0x4B000000u | v) - 8388608.0f; }

// GGML's get_scale_min_k4 for the sub-block pair (2p, 2p + 1), p = 0..3, without branches (lanes
// of a warp hold different p): bytes jj of the scale words A (0..3), B (4..7), C (8..11).
__device__ __forceinline__ void scale_min_pair(uint4 m, int p, float *sc0, float *mn0, float *sc1, float *mn1) {
    int hi = p >> 1; // sub-blocks 4..7 take the packed form
#pragma unroll
    for (int t = 0; t < 2; t++) {
        uint32_t jj = (uint32_t)((2 * p + t) & 3);
        uint32_t A = __byte_perm(m.y, 0, 0x4440u | jj), B = __byte_perm(m.z, 0, 0x4440u | jj), C = __byte_perm(m.w, 0, 0x4440u | jj);
        uint32_t sc = hi ? (C & 15u) | ((A >> 2) & 0x30u) : A & 63u, mn = hi ? (C >> 4) | ((B >> 2) & 0x30u) : B & 63u;
        if (t == 0) *sc0 = u6f(sc), *mn0 = u6f(mn);
        else *sc1 = u6f(sc), *mn1 = u6f(mn);
    }
}

__device__ __forceinline__ float half_lo(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(v & 0xffffu))); }
__device__ __forceinline__ float half_hi(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(v >> 16))); }

// Shared memory: the quantized x, swizzled in 16-byte chunks so that the 8 lanes of a 128-bit
// load's phase hit distinct banks, then the blocks' d and (Q4_K) d times the sum of q.
// Byte offset of values i .. i + 7 (i a multiple of 8).
template <int FMT> __device__ __forceinline__ int xq_at(int i) {
    if (FMT == 0) { // Q8_0 unit b = 32 values: chunk k at slot k ^ bit 2 of b
        int b = i >> 5, k = (i >> 4) & 1;
        return 32 * b + 16 * (k ^ ((b >> 2) & 1)) + (i & 15);
    }
    int t = i >> 6, k = (i >> 4) & 3; // Q4_K unit t = 64 values: chunk k at slot k ^ bits 1-2 of t
    return 64 * t + 16 * (k ^ ((t >> 1) & 3)) + (i & 15);
}
// (Q4_0 takes Q4_K's layout: its unit is 64 values too.)
template <int FMT> __device__ __forceinline__ int4 xq_chunk(const int8_t *xq, int unit, int k) {
    if (FMT == 0) return *(const int4 *)(xq + 32 * unit + 16 * (k ^ ((unit >> 2) & 1)));
    return *(const int4 *)(xq + 64 * unit + 16 * (k ^ ((unit >> 1) & 3)));
}

// x (cols bf16), times g when given (G), into shared memory quantized per 32 as act_q8_quantize
// does. The loads of a round (XU groups of 8 values a thread, and their g) are issued before any
// arithmetic: one L2 round trip a round (most shapes take one round), not one a group.
#define XU 2
template <int FMT, int QW, bool G>
__device__ __forceinline__ void stage_x(int8_t *xq, float *xd, float *xs, const bf16 *x, const float *g, int cols, int warp, int lane) {
    const int n8 = cols / 8;
    for (int base = warp * 32; base < n8; base += XU * QW * 32) { // warp-uniform trips: the shuffles see every lane
        uint4 raw[XU];
        float4 ga[XU], gb[XU];
#pragma unroll
        for (int k = 0; k < XU; k++) {
            int gi = base + k * QW * 32 + lane;
            bool ok = gi < n8;
            raw[k] = ok ? ((const uint4 *)x)[gi] : make_uint4(0, 0, 0, 0);
            if (G) {
                ga[k] = ok ? ((const float4 *)g)[2 * gi] : make_float4(0, 0, 0, 0);
                gb[k] = ok ? ((const float4 *)g)[2 * gi + 1] : make_float4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int k = 0; k < XU; k++) {
            int gi = base + k * QW * 32 + lane;
            if (base + k * QW * 32 >= n8) break; // warp-uniform
            uint32_t rw[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
            float v[8];
#pragma unroll
            for (int j = 0; j < 4; j++) v[2 * j] = __uint_as_float(rw[j] << 16), v[2 * j + 1] = __uint_as_float(rw[j] & 0xffff0000u);
            if (G) {
                v[0] *= ga[k].x, v[1] *= ga[k].y, v[2] *= ga[k].z, v[3] *= ga[k].w;
                v[4] *= gb[k].x, v[5] *= gb[k].y, v[6] *= gb[k].z, v[7] *= gb[k].w;
            }
            float am = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) am = fmaxf(am, fabsf(v[j]));
            am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
            am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
            float d = am / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f; // correctly rounded, as the CPU's
            int sum = 0;
            uint32_t pk[2] = {0, 0};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float r = roundf(v[j] * id);
                if (!(fabsf(r) <= 127.0f)) r = r > 0.0f ? 127.0f : r < 0.0f ? -127.0f : 0.0f;
                int qi = (int)r;
                sum += qi;
                pk[j >> 2] |= (uint32_t)(qi & 255) << (8 * (j & 3));
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (gi < n8) {
                *(uint2 *)(xq + xq_at<FMT>(8 * gi)) = make_uint2(pk[0], pk[1]);
                if ((gi & 3) == 0) {
                    xd[gi >> 2] = d;
                    if (FMT != 0) xs[gi >> 2] = d * (float)sum;
                }
            }
        }
    }
}

// A batch of a warp's two rows: 2 units a lane (two 16-byte chunks each) and their heads.
#define QB 2
struct QBatch {
    uint4 a[2 * QB], b[2 * QB];    // rows r0, r1
    uint4 ma[QB], mb[QB];          // Q4_K: the super-block heads
    unsigned short da[QB], db[QB]; // Q8_0: the blocks' d
};

template <int FMT>
__device__ __forceinline__ void load_batch(QBatch &q, const QMat &m, int r0, int r1, int u0, int lane) {
    const int units = FMT == 0 ? m.cols / 32 : m.cols / 64;
    const uint4 *w0 = (const uint4 *)m.qs + (size_t)r0 * 2 * units, *w1 = (const uint4 *)m.qs + (size_t)r1 * 2 * units;
#pragma unroll
    for (int u = 0; u < QB; u++) {
        int t = u0 + u * 32 + lane;
        bool ok = t < units;
        size_t c0 = unit_chunk((size_t)t, 0, (size_t)units), c1 = unit_chunk((size_t)t, 1, (size_t)units);
        q.a[2 * u] = ok ? __ldcs(w0 + c0) : make_uint4(0, 0, 0, 0);
        q.a[2 * u + 1] = ok ? __ldcs(w0 + c1) : make_uint4(0, 0, 0, 0);
        q.b[2 * u] = ok ? __ldcs(w1 + c0) : make_uint4(0, 0, 0, 0);
        q.b[2 * u + 1] = ok ? __ldcs(w1 + c1) : make_uint4(0, 0, 0, 0);
        if (FMT == 0) {
            q.da[u] = ok ? __ldg((const unsigned short *)m.meta + (size_t)r0 * units + t) : 0;
            q.db[u] = ok ? __ldg((const unsigned short *)m.meta + (size_t)r1 * units + t) : 0;
        } else if (FMT == 1) {
            q.ma[u] = ok ? __ldg((const uint4 *)m.meta + (size_t)r0 * (m.cols / 256) + (t >> 2)) : make_uint4(0, 0, 0, 0);
            q.mb[u] = ok ? __ldg((const uint4 *)m.meta + (size_t)r1 * (m.cols / 256) + (t >> 2)) : make_uint4(0, 0, 0, 0);
        } else { // Q4_0: the unit's two blocks' d in one word
            q.ma[u].x = ok ? __ldg((const uint32_t *)m.meta + (size_t)r0 * units + t) : 0;
            q.mb[u].x = ok ? __ldg((const uint32_t *)m.meta + (size_t)r1 * units + t) : 0;
        }
    }
}

__device__ __forceinline__ int dot16(uint4 w, int4 x, int acc) {
    acc = __dp4a((int)w.x, x.x, acc);
    acc = __dp4a((int)w.y, x.y, acc);
    acc = __dp4a((int)w.z, x.z, acc);
    return __dp4a((int)w.w, x.w, acc);
}
__device__ __forceinline__ uint4 nib(uint4 w, int shift) {
    const uint32_t M = 0x0F0F0F0Fu;
    return make_uint4((w.x >> shift) & M, (w.y >> shift) & M, (w.z >> shift) & M, (w.w >> shift) & M);
}

// Q8_0 unit: d dx sum(q qx) over the block.
__device__ __forceinline__ float q8_unit(uint4 w0, uint4 w1, unsigned short dw, int4 x0, int4 x1, float dx) {
    int s = dot16(w1, x1, dot16(w0, x0, 0));
    return __half2float(__ushort_as_half(dw)) * dx * i2f(s);
}

// Q4_K unit (sub-blocks 2p, 2p + 1): dx (d sc sum(q qx)) - dmin m (dx sum(qx)) for each.
__device__ __forceinline__ float q4_unit(uint4 w0, uint4 w1, uint4 m, int p, int4 X0, int4 X1, int4 X2, int4 X3, float2 dx, float2 sx) {
    int il = dot16(nib(w1, 0), X1, dot16(nib(w0, 0), X0, 0));
    int ih = dot16(nib(w1, 4), X3, dot16(nib(w0, 4), X2, 0));
    float d = half_lo(m.x), dmin = half_hi(m.x), scl, mnl, sch, mnh;
    scale_min_pair(m, p, &scl, &mnl, &sch, &mnh);
    return d * (dx.x * scl * i2f(il) + dx.y * sch * i2f(ih)) - dmin * (mnl * sx.x + mnh * sx.y);
}

// Q4_0 unit (blocks 2t, 2t + 1; block byte j: weight j low, 16 + j high): d dx (sum(q qx) - 8 sum(qx)) each.
__device__ __forceinline__ float q40_unit(uint4 w0, uint4 w1, uint32_t d2, int4 X0, int4 X1, int4 X2, int4 X3, float2 dx, float2 sx) {
    int i0 = dot16(nib(w0, 4), X1, dot16(nib(w0, 0), X0, 0));
    int i1 = dot16(nib(w1, 4), X3, dot16(nib(w1, 0), X2, 0));
    return half_lo(d2) * (dx.x * i2f(i0) - 8.0f * sx.x) + half_hi(d2) * (dx.y * i2f(i1) - 8.0f * sx.y);
}

// s0, s1 += the batch c (units from u0) times the staged x, for rows r0, r1.
template <int FMT>
__device__ __forceinline__ void mul_batch(const QBatch &c, const int8_t *xq, const float *xd, const float *xs, int units, int u0, int lane,
                                          float &s0, float &s1) {
#pragma unroll
    for (int u = 0; u < QB; u++) {
        int t = u0 + u * 32 + lane;
        if (t >= units) continue;
        if (FMT == 0) {
            int4 x0 = xq_chunk<0>(xq, t, 0), x1 = xq_chunk<0>(xq, t, 1);
            float dx = xd[t];
            s0 += q8_unit(c.a[2 * u], c.a[2 * u + 1], c.da[u], x0, x1, dx);
            s1 += q8_unit(c.b[2 * u], c.b[2 * u + 1], c.db[u], x0, x1, dx);
        } else {
            int4 X0 = xq_chunk<1>(xq, t, 0), X1 = xq_chunk<1>(xq, t, 1), X2 = xq_chunk<1>(xq, t, 2), X3 = xq_chunk<1>(xq, t, 3);
            float2 dx = *(const float2 *)(xd + 2 * t), sx = *(const float2 *)(xs + 2 * t);
            if (FMT == 1) {
                s0 += q4_unit(c.a[2 * u], c.a[2 * u + 1], c.ma[u], t & 3, X0, X1, X2, X3, dx, sx);
                s1 += q4_unit(c.b[2 * u], c.b[2 * u + 1], c.mb[u], t & 3, X0, X1, X2, X3, dx, sx);
            } else {
                s0 += q40_unit(c.a[2 * u], c.a[2 * u + 1], c.ma[u].x, X0, X1, X2, X3, dx, sx);
                s1 += q40_unit(c.b[2 * u], c.b[2 * u + 1], c.mb[u].x, X0, X1, X2, X3, dx, sx);
            }
        }
    }
}

// Rows r0, r1 of warp `warp` in row group grp (2 QW rows); false (and row 0 twice, loads still
// valid) past the matrix. An odd last row is computed twice.
template <int QW> __device__ __forceinline__ bool group_rows(int grp, int warp, int rows, int &r0, int &r1) {
    r0 = (grp * QW + warp) * 2;
    bool active = r0 < rows;
    r1 = r0 + 1 < rows ? r0 + 1 : r0;
    if (!active) r0 = r1 = 0;
    return active;
}

// FMT 0: Q8_0, 1: Q4_K, 2: Q4_0; QW warps a block, each two rows (a SwiGLU's gate/up pair).
template <int FMT, int EPI, bool NORM_IN, bool STATS, int QW>
__global__ void __launch_bounds__(QW * 32, (FMT == 0 && !NORM_IN ? 4 : 3) * 8 / QW) gemv_q_kernel(void *y, QMat m, const bf16 *x, const float *g, QNorm nl) {
    extern __shared__ int4 smem[];
    const int cols = m.cols, units = FMT == 0 ? cols / 32 : cols / 64;
    int8_t *xq = (int8_t *)smem;
    float *xd = (float *)(xq + cols), *xs = xd + cols / 32;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // The grid is at most what fits on the GPU at once: a block stages x once and then takes
    // groups of 2 QW rows blockIdx.x, + gridDim.x, ... (a wide matrix's many groups share one staging).
    const int groups = (m.rows + 2 * QW - 1) / (2 * QW);
    int grp = blockIdx.x, r0, r1;
    bool active = group_rows<QW>(grp, warp, m.rows, r0, r1);
    // The first batch of weights is requested before anything else: weights are read-only, so
    // their loads overlap the previous kernel's tail (PDL) and the staging of x.
    QBatch q;
    load_batch<FMT>(q, m, r0, r1, 0, lane);
    pdl_release();
    pdl_wait();
    // NORM_IN: this thread's share of the producer's sums of squares, requested with x (below)
    // and added after it is staged.
    constexpr int SQ = 2;
    float sqv[SQ];
#pragma unroll
    for (int k = 0; k < SQ; k++) {
        int i = threadIdx.x + k * QW * 32;
        sqv[k] = NORM_IN && i < nl.n_sumsq ? nl.sumsq_in[i] : 0.0f;
    }
    stage_x<FMT, QW, NORM_IN>(xq, xd, xs, x, g, cols, warp, lane);
    __shared__ float red[QW];
    float inv_rms = 1.0f;
    if (NORM_IN) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < SQ; k++) ss += sqv[k];
        for (int i = threadIdx.x + SQ * QW * 32; i < nl.n_sumsq; i += QW * 32) ss += nl.sumsq_in[i];
        ss = warp_sum(ss);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        ss = 0.0f;
#pragma unroll
        for (int i = 0; i < QW; i++) ss += red[i];
        inv_rms = rsqrtf(ss / (float)cols + nl.eps);
    }
    __syncthreads(); // x staged (and red read: it is reused below)
    for (;;) {
        float s0 = 0.0f, s1 = 0.0f;
        if (active) {
            for (int u0 = 0;;) {
                mul_batch<FMT>(q, xq, xd, xs, units, u0, lane, s0, s1);
                u0 += 32 * QB;
                if (u0 >= units) break;
                load_batch<FMT>(q, m, r0, r1, u0, lane);
            }
        }
        // the next group's first batch is requested before this group's sums are written
        int ngrp = grp + gridDim.x, n0, n1;
        bool nact = group_rows<QW>(ngrp, warp, m.rows, n0, n1);
        if (ngrp < groups) load_batch<FMT>(q, m, n0, n1, 0, lane);
        s0 = warp_sum(s0) * inv_rms;
        s1 = warp_sum(s1) * inv_rms;
        float sq = 0.0f;
        if (lane == 0 && active) {
            if (EPI == GEMV_SWIGLU) {
                ((bf16 *)y)[r0 / 2] = __float2bfloat16(s0 / (1.0f + __expf(-s0)) * s1);
            } else if (EPI == GEMV_STORE) {
                ((float *)y)[r0] = s0;
                if (r1 != r0) ((float *)y)[r1] = s1;
            } else {
                float *yf = (float *)y;
                float v0 = yf[r0] + s0, v1 = r1 != r0 ? yf[r1] + s1 : 0.0f;
                yf[r0] = v0;
                if (r1 != r0) yf[r1] = v1;
                if (STATS) {
                    nl.y_bf16[r0] = __float2bfloat16(v0);
                    if (r1 != r0) nl.y_bf16[r1] = __float2bfloat16(v1);
                    sq = v0 * v0 + v1 * v1;
                }
            }
        }
        if (STATS) { // rows in fours: warps 2t and 2t + 1 of the group hold fours t
            if (lane == 0) red[warp] = sq;
            __syncthreads();
            int fours = (m.rows + 3) / 4, gi = grp * (QW / 2) + threadIdx.x;
            if (threadIdx.x < QW / 2 && gi < fours) nl.sumsq[gi] = red[2 * threadIdx.x] + red[2 * threadIdx.x + 1];
            __syncthreads(); // red is written again by the next group
        }
        if (ngrp >= groups) break; // block-uniform
        grp = ngrp, r0 = n0, r1 = n1, active = nact;
    }
}

// Which block size (0: 8 warps, 1: 16) a shape runs with: tuned on the H100 (test_gemv_quant's
// variant table in tests/bench/GPU.md); any choice computes the same sums in the same order per row.
static int pick_variant(uint32_t dt, int cols) {
    return dt != DTYPE_Q8_0 || cols >= 8192 ? 1 : 0; // 4-bit, long rows (the FFN's down): fewer blocks staging x
}

template <int FMT, int EPI, bool NORM_IN, bool STATS, int QW>
static cudaError_t launch_v(void *y, const QMat *m, const bf16 *x, const float *g, QNorm nl, size_t smem, cudaStream_t st) {
    auto k = gemv_q_kernel<FMT, EPI, NORM_IN, STATS, QW>;
    if (smem > 48 * 1024) {
        static size_t set[64]; // the largest size this instantiation was allowed so far, per device (an attribute is per device)
        int dev = 0;
        CU_TRY(cudaGetDevice(&dev));
        if (dev >= 64 || smem > set[dev]) {
            CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            if (dev < 64) set[dev] = smem;
        }
    }
    static size_t fit_smem[4];
    static int fit[4]; // blocks of this instantiation resident on the whole GPU at once, by smem
    int slot = 0;
    while (slot < 3 && fit[slot] && fit_smem[slot] != smem) slot++;
    if (!fit[slot] || fit_smem[slot] != smem) {
        int dev, sms, per_sm;
        CU_TRY(cudaGetDevice(&dev));
        CU_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, QW * 32, smem));
        fit[slot] = sms * (per_sm > 0 ? per_sm : 1), fit_smem[slot] = smem;
    }
    int groups = (m->rows + 2 * QW - 1) / (2 * QW), blocks = groups < fit[slot] ? groups : fit[slot];
    return launch_pdl(k, blocks, QW * 32, smem, st, y, *m, x, g, nl);
}

template <int FMT, int EPI, bool NORM_IN, bool STATS>
static cudaError_t launch_q(void *y, const QMat *m, const bf16 *x, const float *g, QNorm nl, int variant, cudaStream_t st) {
    if (!qmat_supported(m->dt, (size_t)m->cols) || m->rows < 1) return cudaErrorInvalidValue;
    if (((uintptr_t)x & 15) || ((uintptr_t)g & 15)) return cudaErrorMisalignedAddress; // x read 8 values at a time
    size_t smem = (size_t)m->cols + (size_t)m->cols / 32 * 4 * (FMT != 0 ? 2 : 1);
    if (variant < 0) variant = pick_variant(m->dt, m->cols);
    if (variant == 1) return launch_v<FMT, EPI, NORM_IN, STATS, 16>(y, m, x, g, nl, smem, st);
    return launch_v<FMT, EPI, NORM_IN, STATS, 8>(y, m, x, g, nl, smem, st);
}

template <int EPI, bool NORM_IN, bool STATS>
static cudaError_t launch_fmt(void *y, const QMat *m, const bf16 *x, const float *g, QNorm nl, cudaStream_t st, int variant = -1) {
    if (m->dt == DTYPE_Q8_0) return launch_q<0, EPI, NORM_IN, STATS>(y, m, x, g, nl, variant, st);
    if (m->dt == DTYPE_Q4_K) return launch_q<1, EPI, NORM_IN, STATS>(y, m, x, g, nl, variant, st);
    if (m->dt == DTYPE_Q4_0) return launch_q<2, EPI, NORM_IN, STATS>(y, m, x, g, nl, variant, st);
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t gemv_q_variant(void *y, const QMat *m, const bf16 *x, int epilogue, bf16 *y_bf16, float *sumsq, int variant,
                                      cudaStream_t st) {
    QNorm none = {NULL, NULL, NULL, 0, 0.0f}, nl = {y_bf16, sumsq, NULL, 0, 0.0f};
    switch (epilogue) {
    case GEMV_STORE: return launch_fmt<GEMV_STORE, false, false>(y, m, x, NULL, none, st, variant);
    case GEMV_SWIGLU: return launch_fmt<GEMV_SWIGLU, false, false>(y, m, x, NULL, none, st, variant);
    case GEMV_ADD: return y_bf16 ? launch_fmt<GEMV_ADD, false, true>((float *)y, m, x, NULL, nl, st, variant)
                                 : launch_fmt<GEMV_ADD, false, false>(y, m, x, NULL, none, st, variant);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t gemv_q(void *y, const QMat *m, const bf16 *x, int epilogue, cudaStream_t st) {
    QNorm none = {NULL, NULL, NULL, 0, 0.0f};
    switch (epilogue) {
    case GEMV_STORE: return launch_fmt<GEMV_STORE, false, false>(y, m, x, NULL, none, st);
    case GEMV_ADD: return launch_fmt<GEMV_ADD, false, false>(y, m, x, NULL, none, st);
    case GEMV_SWIGLU: return launch_fmt<GEMV_SWIGLU, false, false>(y, m, x, NULL, none, st);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t gemv_q_add_stats(float *y, const QMat *m, const bf16 *x, bf16 *y_bf16, float *sumsq, cudaStream_t st) {
    QNorm nl = {y_bf16, sumsq, NULL, 0, 0.0f};
    return launch_fmt<GEMV_ADD, false, true>(y, m, x, NULL, nl, st);
}

extern "C" cudaError_t gemv_q_normed(void *y, const QMat *m, const bf16 *x, int epilogue, const float *g, const float *sumsq, int n_sumsq,
                                     float eps, cudaStream_t st) {
    QNorm nl = {NULL, NULL, sumsq, n_sumsq, eps};
    switch (epilogue) {
    case GEMV_STORE: return launch_fmt<GEMV_STORE, true, false>(y, m, x, g, nl, st);
    case GEMV_SWIGLU: return launch_fmt<GEMV_SWIGLU, true, false>(y, m, x, g, nl, st);
    default: return cudaErrorInvalidValue;
    }
}

// ---- dequantization for prefill GEMMs ----

// 16 values as bf16 at p (32-byte aligned), two 16-byte stores.
__device__ __forceinline__ void store16(bf16 *p, const float *v) {
    uint32_t u[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        u[k] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16(v[2 * k])) | ((uint32_t)__bfloat16_as_ushort(__float2bfloat16(v[2 * k + 1])) << 16);
    ((uint4 *)p)[0] = make_uint4(u[0], u[1], u[2], u[3]);
    ((uint4 *)p)[1] = make_uint4(u[4], u[5], u[6], u[7]);
}

// One thread per 16 quants (Q8_0) or 32 (Q4_K, Q4_0): one 16-byte chunk c of the GGML row, found
// at its device place (unit c / 2, half c % 2).
__global__ void q_to_bf16_kernel(bf16 *W, QMat m, const float *g) {
    size_t per_row = m.dt == DTYPE_Q8_0 ? m.cols / 16 : m.cols / 32, n = per_row * m.rows;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x) {
        size_t r = t / per_row;
        int c = (int)(t % per_row);
        bf16 *out = W + r * m.cols;
        if (m.dt == DTYPE_Q8_0) {
            uint4 w = ((const uint4 *)(m.qs + r * m.cols))[unit_chunk((size_t)c >> 1, c & 1, (size_t)m.cols / 32)];
            float d = __half2float(__ushort_as_half(((const unsigned short *)m.meta)[r * (m.cols / 32) + c / 2]));
            uint32_t wv[4] = {w.x, w.y, w.z, w.w};
            float v[16];
#pragma unroll
            for (int k = 0; k < 16; k++) {
                v[k] = __fmul_rn(d, (float)(int8_t)(wv[k / 4] >> (8 * (k % 4))));
                if (g) v[k] = __fmul_rn(v[k], g[16 * c + k]);
            }
            store16(out + 16 * c, v);
        } else if (m.dt == DTYPE_Q4_0) { // chunk c: block c (GGML's (q - 8) d, exact)
            uint4 w = ((const uint4 *)(m.qs + r * (m.cols / 2)))[unit_chunk((size_t)c >> 1, c & 1, (size_t)m.cols / 64)];
            float d = __half2float(__ushort_as_half(((const unsigned short *)m.meta)[r * (m.cols / 32) + c]));
            uint32_t wv[4] = {w.x, w.y, w.z, w.w};
            float lo[16], hi[16];
#pragma unroll
            for (int k = 0; k < 16; k++) {
                int byte = (int)((wv[k / 4] >> (8 * (k % 4))) & 255u);
                lo[k] = __fmul_rn((float)((byte & 15) - 8), d), hi[k] = __fmul_rn((float)((byte >> 4) - 8), d);
                if (g) lo[k] = __fmul_rn(lo[k], g[32 * c + k]), hi[k] = __fmul_rn(hi[k], g[32 * c + 16 + k]);
            }
            store16(out + 32 * c, lo);
            store16(out + 32 * c + 16, hi);
        } else {
            uint4 w = ((const uint4 *)(m.qs + r * (m.cols / 2)))[unit_chunk((size_t)c >> 1, c & 1, (size_t)m.cols / 64)];
            uint4 mm = ((const uint4 *)(m.meta + r * (m.cols / 256) * 16))[c >> 3];
            int k8 = c & 7, j = k8 >> 1, h = k8 & 1, base = 256 * (c >> 3) + 64 * j + 16 * h;
            float d = half_lo(mm.x), dmin = half_hi(mm.x), scl, mnl, sch, mnh;
            scale_min_pair(mm, j, &scl, &mnl, &sch, &mnh);
            // As GGML's dequantize_row_q4_K, each product and difference rounded (no contraction
            // into an FMA), so the values are the CPU's weights_rows_to_f32 bit for bit.
            float dl = __fmul_rn(d, scl), ml = __fmul_rn(dmin, mnl), dh = __fmul_rn(d, sch), mh = __fmul_rn(dmin, mnh);
            uint32_t wv[4] = {w.x, w.y, w.z, w.w};
            float lo[16], hi[16];
#pragma unroll
            for (int k = 0; k < 16; k++) {
                uint32_t byte = (wv[k / 4] >> (8 * (k % 4))) & 255u;
                lo[k] = __fsub_rn(__fmul_rn(dl, (float)(byte & 15u)), ml), hi[k] = __fsub_rn(__fmul_rn(dh, (float)(byte >> 4)), mh);
                if (g) lo[k] = __fmul_rn(lo[k], g[base + k]), hi[k] = __fmul_rn(hi[k], g[base + 32 + k]);
            }
            store16(out + base, lo);
            store16(out + base + 32, hi);
        }
    }
}

extern "C" cudaError_t qmat_to_bf16(bf16 *W, const QMat *m, const float *g, cudaStream_t st) {
    if (!qmat_supported(m->dt, (size_t)m->cols)) return cudaErrorInvalidValue;
    q_to_bf16_kernel<<<4096, 256, 0, st>>>(W, *m, g);
    return cudaGetLastError();
}

// ---- random blocks ----

__device__ __forceinline__ uint32_t qhash(unsigned long long x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

// Q8_0: quants uniform in [-127, 127], d = a / 127. Q4_K: quants uniform in [0, 15], every
// sub-block scale and min 32, d = a / 240 and dmin = 7.5 d, so w = 32 d (q - 7.5) in [-a, a].
__global__ void q_fill_kernel(QMat m, unsigned long long seed, float a) {
    size_t qs = m.dt == DTYPE_Q8_0 ? (size_t)m.rows * m.cols : (size_t)m.rows * m.cols / 2;
    size_t heads = m.dt == DTYPE_Q4_K ? (size_t)m.rows * (m.cols / 256) : (size_t)m.rows * (m.cols / 32);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < qs + heads; i += (size_t)gridDim.x * blockDim.x) {
        if (i < qs) {
            uint32_t r = qhash(seed * 0x9e3779b97f4a7c15ULL + i);
            m.qs[i] = m.dt == DTYPE_Q8_0 ? (int8_t)((int)(r % 255u) - 127) : (int8_t)(r & 255u);
        } else if (m.dt == DTYPE_Q8_0) {
            ((__half *)m.meta)[i - qs] = __float2half(a / 127.0f);
        } else if (m.dt == DTYPE_Q4_0) { // quants uniform in [0, 15]: w = d (q - 8) in [-a, a]
            ((__half *)m.meta)[i - qs] = __float2half(a / 8.0f);
        } else {
            uint8_t *h = m.meta + (i - qs) * 16;
            float d = a / 240.0f;
            *(__half *)h = __float2half(d);
            *(__half *)(h + 2) = __float2half(7.5f * d);
            for (int k = 0; k < 12; k++) h[4 + k] = k < 8 ? 160 : 0; // scales and mins all 32 (the 6-bit packing)
        }
    }
}

extern "C" cudaError_t qmat_fill_random(QMat *m, unsigned long long seed, float a, cudaStream_t st) {
    q_fill_kernel<<<4096, 256, 0, st>>>(*m, seed, a);
    return cudaGetLastError();
}
