// Quantized weights on the GPU (gemv_quant.h): the decode GEMVs that read Q8_0 / Q4_K rows,
// the dequantization a prefill GEMM multiplies, the upload's repacking and random blocks.
//
// A GEMV block is 8 warps, each warp two rows (a gate/up pair for SwiGLU), so every activation
// value read from shared memory serves two rows. The block stages x (times the norm's weights)
// in shared memory as fp32, swizzled so that the lanes of a quarter-warp, which read 16 or 32
// consecutive weights' x each, hit distinct banks. Quants become floats with one byte permute:
// 0x4B0000qq is the float 2^23 + qq, so qq = that - 2^23 exactly (Q8_0 flips the sign bit first:
// 2^23 + 128 + q). Q4_K's min term needs the sum of x over each 16-weight run: staged too.
#include <cuda_fp16.h>
#include <string.h>

#include "cuda_common.h"
#include "gemv_quant.h"
#include "pdl.h"

extern "C" {
#include "../model/config.h"
#include "../model/quant.h"
}

#define QW 8 // warps per block
#define QU 4 // 16-byte chunks per row and lane in flight

struct QNorm {
    bf16 *y_bf16;          // producer: bf16 copy of the result
    float *sumsq;          // producer: sums of squares of rows in fours
    const float *sumsq_in; // consumer: the producer's sums
    int n_sumsq;
    float eps;
};

extern "C" size_t qmat_qs_bytes(uint32_t dt, size_t rows, size_t cols) { return dt == DTYPE_Q8_0 ? rows * cols : rows * cols / 2; }
extern "C" size_t qmat_meta_bytes(uint32_t dt, size_t rows, size_t cols) {
    return dt == DTYPE_Q8_0 ? rows * (cols / 32) * 2 : rows * (cols / 256) * 16;
}

extern "C" void qmat_repack_rows(uint32_t dt, const uint8_t *src, size_t n, size_t cols, size_t row0, size_t step, int8_t *qs,
                                 uint8_t *meta) {
    size_t per_block = dt == DTYPE_Q8_0 ? QK8_0 : QK_K, blocks = cols / per_block;
    size_t bb = dt == DTYPE_Q8_0 ? Q8_0_BYTES : Q4_K_BYTES, head = dt == DTYPE_Q8_0 ? 2 : 16, body = bb - head;
    for (size_t i = 0; i < n; i++) {
        size_t r = row0 + i * step;
        for (size_t b = 0; b < blocks; b++) {
            const uint8_t *blk = src + (i * blocks + b) * bb;
            memcpy(meta + (r * blocks + b) * head, blk, head);
            memcpy((uint8_t *)qs + (r * blocks + b) * body, blk + head, body);
        }
    }
}

// ---- decode GEMVs ----

__device__ __forceinline__ int swz(int i, int sh) { return (i & ~3) | ((i & 3) ^ ((i >> sh) & 3)); }

// Byte sel of v as the float 2^23 + byte.
__device__ __forceinline__ float byte_f(uint32_t v, uint32_t sel) { return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540u | sel)); }

// sum_b q_b x_b over one word's 4 bytes (biased by `bias` each) and 4 x values.
__device__ __forceinline__ float dot4(uint32_t v, float4 x, float bias) {
    float s = (byte_f(v, 0) - bias) * x.x;
    s = fmaf(byte_f(v, 1) - bias, x.y, s);
    s = fmaf(byte_f(v, 2) - bias, x.z, s);
    return fmaf(byte_f(v, 3) - bias, x.w, s);
}

// GGML's get_scale_min_k4 for the sub-block pair (2p, 2p + 1), p = 0..3, without branches (lanes
// of a warp hold different p): bytes jj of the scale words A (0..3), B (4..7), C (8..11).
__device__ __forceinline__ void scale_min_pair(uint4 m, int p, float *sc0, float *mn0, float *sc1, float *mn1) {
    int hi = p >> 1; // sub-blocks 4..7 take the packed form
#pragma unroll
    for (int t = 0; t < 2; t++) {
        uint32_t jj = (uint32_t)((2 * p + t) & 3);
        uint32_t A = __byte_perm(m.y, 0, 0x4440u | jj), B = __byte_perm(m.z, 0, 0x4440u | jj), C = __byte_perm(m.w, 0, 0x4440u | jj);
        uint32_t sc = hi ? (C & 15u) | ((A >> 2) & 0x30u) : A & 63u, mn = hi ? (C >> 4) | ((B >> 2) & 0x30u) : B & 63u;
        if (t == 0) *sc0 = (float)sc, *mn0 = (float)mn;
        else *sc1 = (float)sc, *mn1 = (float)mn;
    }
}

__device__ __forceinline__ float half_lo(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(v & 0xffffu))); }
__device__ __forceinline__ float half_hi(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(v >> 16))); }

// Q8_0: chunk c of a row is quants 16c .. 16c + 15 (half of block c / 2).
__device__ __forceinline__ float q8_chunk(uint4 w, const float4 *xs, int c) {
    const float bias = 8388608.0f + 128.0f;
    int i = 4 * c;
    float s = dot4(w.x ^ 0x80808080u, xs[swz(i, 3)], bias);
    s += dot4(w.y ^ 0x80808080u, xs[swz(i + 1, 3)], bias);
    s += dot4(w.z ^ 0x80808080u, xs[swz(i + 2, 3)], bias);
    s += dot4(w.w ^ 0x80808080u, xs[swz(i + 3, 3)], bias);
    return s;
}

// sum_b q_b x_b over a word of 4 nibble-bytes (0..15 each): byte b alone in a 32-bit word is the
// denormal float q 2^-149, and x comes scaled by 2^100 (XS), so each product is q x 2^-49, exact
// in its rounding as any product, with one permute and one FMA a weight.
__device__ __forceinline__ float dot4_denorm(uint32_t v, float4 x, float s) {
    s = fmaf(__uint_as_float(__byte_perm(v, 0, 0x4440u)), x.x, s);
    s = fmaf(__uint_as_float(__byte_perm(v, 0, 0x4441u)), x.y, s);
    s = fmaf(__uint_as_float(__byte_perm(v, 0, 0x4442u)), x.z, s);
    return fmaf(__uint_as_float(__byte_perm(v, 0, 0x4443u)), x.w, s);
}
#define XS 1.2676506002282294e30f // 2^100: Q4_K's staged x
#define XS_BACK 562949953421312.0f // 2^49: a Q4_K sum of products back to units of x

// Q4_K: chunk c is bytes 16c .. 16c + 15 of the quants: super-block c / 8, within it the 32-byte
// group p = (c % 8) / 2 (sub-blocks 2p in the low nibbles, 2p + 1 in the high), half h = c % 2.
// Returns sum_w (d sc q - dmin m) x over its 32 weights.
__device__ __forceinline__ float q4_chunk(uint4 w, uint4 m, const float4 *xs, const float *xsum, int c) {
    int k = c & 7, p = k >> 1, h = k & 1;
    int i = 64 * (c >> 3) + 16 * p + 4 * h; // float4 index of the low nibbles' first x
    uint32_t wv[4] = {w.x, w.y, w.z, w.w};
    float tl = 0.0f, th = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        tl = dot4_denorm(wv[q] & 0x0F0F0F0Fu, xs[swz(i + q, 4)], tl);
        th = dot4_denorm((wv[q] >> 4) & 0x0F0F0F0Fu, xs[swz(i + 8 + q, 4)], th);
    }
    float d = half_lo(m.x), dmin = half_hi(m.x), scl, mnl, sch, mnh;
    scale_min_pair(m, p, &scl, &mnl, &sch, &mnh);
    return d * XS_BACK * (scl * tl + sch * th) - dmin * (mnl * xsum[i / 4] + mnh * xsum[i / 4 + 2]);
}

// A batch of a warp's two rows: QU chunks per lane (16 quant bytes each) and their block heads.
struct QBatch {
    uint4 a[QU], b[QU];     // rows r0, r1
    uint4 ma[QU], mb[QU];   // Q4_K: the super-block heads
    unsigned short da[QU], db[QU]; // Q8_0: the blocks' d
};

template <int FMT>
__device__ __forceinline__ void load_batch(QBatch &q, const QMat &m, int r0, int r1, int c0, int lane) {
    int cols = m.cols, chunks = FMT == 0 ? cols / 16 : cols / 32;
    size_t row_bytes = FMT == 0 ? (size_t)cols : (size_t)cols / 2;
    const uint4 *w0 = (const uint4 *)(m.qs + (size_t)r0 * row_bytes), *w1 = (const uint4 *)(m.qs + (size_t)r1 * row_bytes);
#pragma unroll
    for (int u = 0; u < QU; u++) {
        int c = c0 + u * 32 + lane;
        bool ok = c < chunks;
        q.a[u] = ok ? __ldcs(w0 + c) : make_uint4(0, 0, 0, 0);
        q.b[u] = ok ? __ldcs(w1 + c) : make_uint4(0, 0, 0, 0);
        if (FMT == 0) {
            const unsigned short *d0 = (const unsigned short *)m.meta + (size_t)r0 * (cols / 32);
            const unsigned short *d1 = (const unsigned short *)m.meta + (size_t)r1 * (cols / 32);
            q.da[u] = ok ? __ldg(d0 + (c >> 1)) : 0;
            q.db[u] = ok ? __ldg(d1 + (c >> 1)) : 0;
        } else {
            const uint4 *h0 = (const uint4 *)(m.meta + (size_t)r0 * (cols / 256) * 16);
            const uint4 *h1 = (const uint4 *)(m.meta + (size_t)r1 * (cols / 256) * 16);
            q.ma[u] = ok ? __ldg(h0 + (c >> 3)) : make_uint4(0, 0, 0, 0);
            q.mb[u] = ok ? __ldg(h1 + (c >> 3)) : make_uint4(0, 0, 0, 0);
        }
    }
}

template <int FMT, int EPI, bool NORM_IN, bool STATS> // FMT 0: Q8_0, 1: Q4_K
__global__ void __launch_bounds__(QW * 32) gemv_q_kernel(void *y, QMat m, const bf16 *x, const float *g, QNorm nl) {
    extern __shared__ float4 xs[];
    const int cols = m.cols, n4 = cols / 4, chunks = FMT == 0 ? cols / 16 : cols / 32;
    float *xsum = (float *)(xs + n4); // Q4_K: sums of x over runs of 16
    constexpr int SH = FMT == 0 ? 3 : 4;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int r0 = (blockIdx.x * QW + warp) * 2;
    bool active = r0 < m.rows;
    int r1 = r0 + 1 < m.rows ? r0 + 1 : r0;
    // The first batch of weights is requested before anything else: weights are read-only, so
    // their loads overlap the previous kernel's tail (PDL) and the staging of x.
    QBatch q;
    load_batch<FMT>(q, m, active ? r0 : 0, active ? r1 : 0, 0, lane);
    pdl_release();
    pdl_wait();
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
        uint2 raw = ((const uint2 *)x)[i];
        float4 v = make_float4(__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u), __uint_as_float(raw.y << 16),
                               __uint_as_float(raw.y & 0xffff0000u));
        if (g) {
            float4 gg = ((const float4 *)g)[i];
            v.x *= gg.x, v.y *= gg.y, v.z *= gg.z, v.w *= gg.w;
        }
        xs[swz(i, SH)] = v;
    }
    __syncthreads();
    if (FMT == 1) { // the sums of x over runs of 16, then x scaled for dot4_denorm (each thread its own run)
        for (int i = threadIdx.x; i < cols / 16; i += blockDim.x) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float4 v = xs[swz(4 * i + k, SH)];
                s += (v.x + v.y) + (v.z + v.w);
                xs[swz(4 * i + k, SH)] = make_float4(v.x * XS, v.y * XS, v.z * XS, v.w * XS);
            }
            xsum[i] = s;
        }
        __syncthreads();
    }
    __shared__ float red[QW];
    float inv_rms = 1.0f;
    if (NORM_IN) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < nl.n_sumsq; i += blockDim.x) ss += nl.sumsq_in[i];
        ss = warp_sum(ss);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        ss = 0.0f;
#pragma unroll
        for (int i = 0; i < QW; i++) ss += red[i];
        inv_rms = rsqrtf(ss / (float)cols + nl.eps);
        __syncthreads(); // red is reused below
    }
    float s0 = 0.0f, s1 = 0.0f;
    if (active) {
        for (int c0 = 0;;) {
#pragma unroll
            for (int u = 0; u < QU; u++) {
                int c = c0 + u * 32 + lane;
                if (c < chunks) {
                    if (FMT == 0) {
                        s0 = fmaf(__half2float(__ushort_as_half(q.da[u])), q8_chunk(q.a[u], xs, c), s0);
                        s1 = fmaf(__half2float(__ushort_as_half(q.db[u])), q8_chunk(q.b[u], xs, c), s1);
                    } else {
                        s0 += q4_chunk(q.a[u], q.ma[u], xs, xsum, c);
                        s1 += q4_chunk(q.b[u], q.mb[u], xs, xsum, c);
                    }
                }
            }
            c0 += 32 * QU;
            if (c0 >= chunks) break;
            load_batch<FMT>(q, m, r0, r1, c0, lane);
        }
    }
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
    if (STATS) { // rows in fours: warps 2t and 2t + 1 of the block hold group t
        if (lane == 0) red[warp] = sq;
        __syncthreads();
        int groups = (m.rows + 3) / 4, gi = blockIdx.x * (QW / 2) + threadIdx.x;
        if (threadIdx.x < QW / 2 && gi < groups) nl.sumsq[gi] = red[2 * threadIdx.x] + red[2 * threadIdx.x + 1];
    }
}

template <int FMT, int EPI, bool NORM_IN, bool STATS>
static cudaError_t launch_q(void *y, const QMat *m, const bf16 *x, const float *g, QNorm nl, cudaStream_t st) {
    if (m->cols % (FMT == 0 ? 32 : 256) || m->rows < 1) return cudaErrorInvalidValue;
    size_t smem = (size_t)m->cols * 4 + (FMT == 1 ? (size_t)m->cols / 16 * 4 : 0);
    if (smem > 48 * 1024) {
        static size_t set = 0; // the largest size this instantiation was allowed so far
        if (smem > set) {
            CU_TRY(cudaFuncSetAttribute(gemv_q_kernel<FMT, EPI, NORM_IN, STATS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            set = smem;
        }
    }
    int blocks = (m->rows + 2 * QW - 1) / (2 * QW);
    return launch_pdl(gemv_q_kernel<FMT, EPI, NORM_IN, STATS>, blocks, QW * 32, smem, st, y, *m, x, g, nl);
}

template <int EPI, bool NORM_IN, bool STATS>
static cudaError_t launch_fmt(void *y, const QMat *m, const bf16 *x, const float *g, QNorm nl, cudaStream_t st) {
    if (m->dt == DTYPE_Q8_0) return launch_q<0, EPI, NORM_IN, STATS>(y, m, x, g, nl, st);
    if (m->dt == DTYPE_Q4_K) return launch_q<1, EPI, NORM_IN, STATS>(y, m, x, g, nl, st);
    return cudaErrorInvalidValue;
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

// One thread per 16 quants (Q8_0) or 32 (Q4_K, one 16-byte chunk).
__global__ void q_to_bf16_kernel(bf16 *W, QMat m, const float *g) {
    size_t per_row = m.dt == DTYPE_Q8_0 ? m.cols / 16 : m.cols / 32, n = per_row * m.rows;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x) {
        size_t r = t / per_row;
        int c = (int)(t % per_row);
        bf16 *out = W + r * m.cols;
        if (m.dt == DTYPE_Q8_0) {
            uint4 w = ((const uint4 *)(m.qs + r * m.cols))[c];
            float d = __half2float(__ushort_as_half(((const unsigned short *)m.meta)[r * (m.cols / 32) + c / 2]));
            uint32_t wv[4] = {w.x, w.y, w.z, w.w};
            float v[16];
#pragma unroll
            for (int k = 0; k < 16; k++) {
                v[k] = __fmul_rn(d, (float)(int8_t)(wv[k / 4] >> (8 * (k % 4))));
                if (g) v[k] = __fmul_rn(v[k], g[16 * c + k]);
            }
            store16(out + 16 * c, v);
        } else {
            uint4 w = ((const uint4 *)(m.qs + r * (m.cols / 2)))[c];
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
    if (m->dt != DTYPE_Q8_0 && m->dt != DTYPE_Q4_K) return cudaErrorInvalidValue;
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
    size_t heads = m.dt == DTYPE_Q8_0 ? (size_t)m.rows * (m.cols / 32) : (size_t)m.rows * (m.cols / 256);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < qs + heads; i += (size_t)gridDim.x * blockDim.x) {
        if (i < qs) {
            uint32_t r = qhash(seed * 0x9e3779b97f4a7c15ULL + i);
            m.qs[i] = m.dt == DTYPE_Q8_0 ? (int8_t)((int)(r % 255u) - 127) : (int8_t)(r & 255u);
        } else if (m.dt == DTYPE_Q8_0) {
            ((__half *)m.meta)[i - qs] = __float2half(a / 127.0f);
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
