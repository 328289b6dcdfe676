// ParisKV on the GPU (pariskv_gpu.h): the encoder of zone keys and one decode step's selection.
// The arithmetic is that of attention/pariskv_*.c operation for operation (__fadd_rn / __fmul_rn
// so that nvcc contracts nothing into an FMA, sums in the CPU's order), so ids, codes, w, the
// query, the bonus tables, the scores and the estimates equal the CPU's bit for bit (the CPU
// build, -std=c11 without -ffast-math, contracts nothing either), and the candidate and top-k
// sets are the CPU's, ties to the smaller slot included.
//
// Selection, per layer (n = *d_n read by every kernel; every grid is fixed by cap, n_kv and
// the device, so one captured graph serves every n):
//   pkv_bonus_kernel   (B, n_kv) x 256  the group query's transform (each block; block 0
//                                       stores it), tier bonus of the 256 patterns of each
//                                       subspace (rank by counting, prefix sum of the id
//                                       counts); zeroes this step's histograms
//   pkv_vote_kernel    (P, n_kv) x 256  scores of block j's slot range [j S, (j+1) S): the ids
//                                       streamed with coalesced 16-byte loads, the bonus
//                                       tables as 4-bit entries in shared memory; a score
//                                       histogram per head (global) and per block (kept as
//                                       "scores >= s" so later blocks find their offsets)
//   pkv_compact_kernel (P, n_kv) x 256  threshold score and quota of the bucket top-C; each
//                                       block writes its candidates in slot order at its
//                                       offset (block prefix + block scan)
//   pkv_rerank_kernel  (R, n_kv) x 256  estimates of equal shares of the candidates; 12-bit
//                                       histogram of the estimates' order-preserving keys
//   pkv_topk_kernel    (8, n_kv) x 512  one cluster per head: radix select on the keys
//                                       (12/10/10 bits) from that histogram, histograms
//                                       summed in distributed shared memory, ties at the k-th
//                                       to the smaller slot; the selection written in slot order
// P and R fill the GPU with one wave of resident blocks. 5 launches. Bytes read per KV head, n slots, C candidates (n = 1M, D = 128:
// C = 100K): ids n B (16 MB), scores n (1 MB, from L2), cand C 4 (0.4 MB, L2), codes and w
// C 6 B (9.6 MB), est C 4 (0.4 MB, L2), counts B 1 KB; written: scores n, cand + est C 8.
// All kernels of a step use PDL (pdl_wait() before reading anything an earlier kernel wrote).
//
// For callers: the scratch's score, cand and est rows are capp = cap rounded up to 16 apart
// (aligned vector reads), cand/est hold C entries (cand ascending); one scratch per stream, and
// it serves only indexes of the shape it was allocated for; the zone size *d_n is clamped to
// cap. Encoding: D in {64, 128, 256}, n_layers * n_kv <= 65535; the key source is read with
// 16-byte loads when its base and strides allow (8-element multiples), element-wise otherwise.
// Why one file of ~1,000 lines: the encoder and the five selection kernels share the index
// layout's device helpers and the bit-for-bit arithmetic rules above; splitting them would put
// those rules in two places. (Issue 24 replaces the selection kernels; split it then.)
#include "cuda_common.h"
#include "pariskv_gpu.h"
#include "pdl.h"
#include "../offload/fp8.h"

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <string.h>

namespace cg = cooperative_groups;

extern "C" {
#include "../attention/srht.h"
}

#define SEL_THREADS 256             // bonus, vote, compact, rerank blocks
#define TOPK_THREADS 512            // top-k blocks
#define TOPK_CLUSTER 8              // top-k blocks per KV head: one cluster (a portable size)
#define EMIT_CHUNK (SEL_THREADS * 16) // slots a compact block scans at once (16 scores a thread)
#define RERANK_U 4                  // candidate groups a rerank warp gathers at once
#define EST_BINS 4096               // first radix digit of the estimates: 12 bits
// hist of one head (int32): score histogram, estimate histogram, then one block's "scores >= s"
// (s = 0 .. 6B + 1) per vote block.
#define HIST_SCORE 0
#define HIST_EST 256
#define HIST_BLK0 (HIST_EST + EST_BINS)
#define HIST_BLK 256
#define MAX_P 1024 // vote / compact blocks per head

// pkv_centers: reconstruction levels of the 3-bit magnitudes (pariskv_encode.c).
static __constant__ float c_centers[8] = {0.0420f, 0.1266f, 0.2130f, 0.3025f, 0.3973f, 0.5001f, 0.6169f, 0.7633f};

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

static int sm_count(void) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 132;
    return sms;
}

// ---- index ----

// Byte offsets of ids, codes, w, count, signs in the one allocation; returns its size.
static size_t index_layout(int n_layers, int n_kv, int D, int cap, size_t off[5]) {
    size_t B = (size_t)D / 8, keys = (size_t)n_layers * n_kv * (cap > 0 ? cap : 1);
    size_t sz[5] = {keys * B, keys * B * 4, keys * B * 2, (size_t)n_layers * n_kv * B * 256 * 4, (size_t)D * 4};
    size_t tot = 0;
    for (int i = 0; i < 5; i++) off[i] = tot, tot += al256(sz[i]);
    return tot;
}

static int index_shape_ok(int n_layers, int n_kv, int D, int cap) {
    return (D == 64 || D == 128 || D == 256) && n_layers > 0 && n_kv > 0 && cap > 0 && cap <= (1 << 30) &&
           (long long)n_layers * n_kv <= 65535; // the encoder's grid.y
}

extern "C" size_t pkv_gpu_index_bytes(int n_layers, int n_kv, int D, int cap) {
    size_t off[5];
    return index_layout(n_layers, n_kv, D, cap, off);
}

extern "C" cudaError_t pkv_gpu_index_alloc(PkvGpuIndex *ix, int n_layers, int n_kv, int D, int cap, cudaStream_t st) {
    memset(ix, 0, sizeof *ix);
    if (!index_shape_ok(n_layers, n_kv, D, cap)) return cudaErrorInvalidValue;
    size_t off[5], bytes = index_layout(n_layers, n_kv, D, cap, off);
    char *p;
    CU_TRY(cudaMalloc(&p, bytes));
    ix->n_layers = n_layers, ix->n_kv = n_kv, ix->D = D, ix->B = D / 8, ix->cap = cap;
    ix->ids = (uint8_t *)p; // the base: pkv_gpu_index_free frees it
    ix->codes = (uint8_t *)(p + off[1]);
    ix->w = (uint16_t *)(p + off[2]);
    ix->count = (int32_t *)(p + off[3]);
    ix->signs = (float *)(p + off[4]);
    float s[PKV_GPU_MAX_D];
    srht_signs(SRHT_SEED, D, s);
    cudaError_t e = cudaMemsetAsync(p, 0, off[4], st);
    // From pageable memory: returns once s is staged, so the stack array may go.
    if (e == cudaSuccess) e = cudaMemcpyAsync(ix->signs, s, (size_t)D * sizeof(float), cudaMemcpyHostToDevice, st);
    if (e != cudaSuccess) pkv_gpu_index_free(ix);
    return e;
}

extern "C" void pkv_gpu_index_free(PkvGpuIndex *ix) {
    if (ix->ids) cudaFree(ix->ids);
    memset(ix, 0, sizeof *ix);
}

extern "C" cudaError_t pkv_gpu_index_reset(PkvGpuIndex *ix, int layer, cudaStream_t st) {
    if (layer >= ix->n_layers) return cudaErrorInvalidValue;
    size_t per_layer = (size_t)ix->n_kv * ix->B * 256;
    if (layer < 0) return cudaMemsetAsync(ix->count, 0, per_layer * ix->n_layers * sizeof(int32_t), st);
    return cudaMemsetAsync(ix->count + per_layer * layer, 0, per_layer * sizeof(int32_t), st);
}

// ---- encoding ----

struct PkvEncArgs {
    const bf16 *base;
    size_t ls, hs, ss; // strides of the key source, elements (bytes for fp8)
    const uint8_t *base8; // fp8 keys instead (PkvKeySource.fp8)
    size_t soff;          // the scale's byte offset from a row's first code
    uint8_t *ids, *codes;
    uint16_t *w;
    int32_t *count;
    const float *signs;
    int n_kv, cap, from, to, chunk, vec;
};

// The D / 8 lanes of one key hold 8 consecutive elements each, which after the rotation are
// one subspace: lane p encodes subspace p.
static __device__ __forceinline__ uint4 load_key8(const bf16 *p, int vec) {
    if (vec) return *(const uint4 *)p;
    unsigned short h[8];
#pragma unroll
    for (int i = 0; i < 8; i++) h[i] = __bfloat16_as_ushort(p[i]);
    return make_uint4(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16, h[4] | (unsigned)h[5] << 16,
                      h[6] | (unsigned)h[7] << 16);
}

// Slots [from, to) of (layer, head) = blockIdx.y, a chunk of them per block. Each warp holds
// 32 / LPK keys; the next ones are loaded before the current ones are encoded, so that reads
// of host memory (UVA) overlap the arithmetic. Id counts go to shared memory, then to global.
template <int D> static __global__ void __launch_bounds__(256) pkv_encode_kernel(PkvEncArgs a) {
    constexpr int LPK = D / 8, B = D / 8, KPW = 32 / LPK, KPB = (256 / 32) * KPW;
    __shared__ int cnt[B * 256];
    __shared__ float cen[8];
    int lh = blockIdx.y, l = lh / a.n_kv, h = lh % a.n_kv;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane / LPK, p = lane % LPK;
    for (int i = threadIdx.x; i < B * 256; i += 256) cnt[i] = 0;
    if (threadIdx.x < 8) cen[threadIdx.x] = c_centers[threadIdx.x]; // shared: read at divergent indices
    float sg[8];
#pragma unroll
    for (int j = 0; j < 8; j++) sg[j] = a.signs[p * 8 + j];
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn((float)D)); // as srht_apply: 1.0f / sqrtf(D)
    __syncthreads();
    int i0 = a.from + blockIdx.x * a.chunk, i1 = min(i0 + a.chunk, a.to);
    const bf16 *kb = a.base + l * a.ls + h * a.hs + p * 8;
    const uint8_t *kb8 = a.base8 + l * a.ls + h * a.hs; // fp8: the row's first code
    // One key's 8 values of lane p: bf16 (16 bytes), or fp8 codes (8 bytes) with the row's scale in .z.
    auto load = [&](int i) -> uint4 {
        if (!a.base8) return load_key8(kb + (size_t)i * a.ss, a.vec);
        const uint8_t *row = kb8 + (size_t)i * a.ss;
        uint2 c = *(const uint2 *)(row + p * 8);
        return make_uint4(c.x, c.y, __float_as_uint(*(const float *)(row + a.soff)), 0);
    };
    size_t head = (size_t)lh * a.cap;
    uint8_t *ids = a.ids + head * B;
    uint32_t *codes = (uint32_t *)(a.codes + head * B * 4);
    uint16_t *w = a.w + head * B;
    // The loop bound is uniform over the warp (its shuffles need every lane).
    int first = i0 + warp * KPW;
    uint4 nxt = first + g < i1 ? load(first + g) : make_uint4(0, 0, 0, 0);
    for (int base = first; base < i1; base += KPB) {
        int i = base + g;
        uint4 cur = nxt;
        if (base + KPB + g < i1) nxt = load(base + KPB + g);
        float x[8];
        if (a.base8) { // fp8_dequantize_row's values
            float sc = __uint_as_float(cur.z);
#pragma unroll
            for (int j = 0; j < 8; j++) x[j] = __fmul_rn(fp8_e4m3_decode((uint8_t)((j < 4 ? cur.x : cur.y) >> (8 * (j & 3)))), sc);
        } else {
            const __nv_bfloat162 *c2 = (const __nv_bfloat162 *)&cur;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = __bfloat1622float2(c2[j]);
                x[2 * j] = f.x, x[2 * j + 1] = f.y;
            }
        }
        // r^2 summed over the D elements in order: a chain through the key's lanes.
        float r2 = 0.0f;
        for (int q = 0; q < LPK; q++) {
            float t = r2;
#pragma unroll
            for (int j = 0; j < 8; j++) t = __fadd_rn(t, __fmul_rn(x[j], x[j]));
            r2 = __shfl_sync(0xffffffffu, t, q, LPK);
        }
        float r = __fsqrt_rn(r2), inv = r > 0.0f ? __fdiv_rn(1.0f, r) : 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] = __fmul_rn(__fmul_rn(x[j], inv), sg[j]);
        // Walsh-Hadamard butterflies, stages h = 1, 2, 4 inside the lane, then across lanes.
#pragma unroll
        for (int hh = 1; hh < 8; hh *= 2)
#pragma unroll
            for (int s0 = 0; s0 < 8; s0 += 2 * hh)
#pragma unroll
                for (int j = s0; j < s0 + hh; j++) {
                    float u = x[j], v = x[j + hh];
                    x[j] = __fadd_rn(u, v), x[j + hh] = __fsub_rn(u, v);
                }
#pragma unroll
        for (int m = 1; m < LPK; m *= 2) {
            bool upper = p & m;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float o = __shfl_xor_sync(0xffffffffu, x[j], m);
                x[j] = upper ? __fsub_rn(o, x[j]) : __fadd_rn(x[j], o);
            }
        }
        float rb2 = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] = __fmul_rn(x[j], scale), rb2 = __fadd_rn(rb2, __fmul_rn(x[j], x[j]));
        float rb = __fsqrt_rn(rb2), inv_b = rb > 0.0f ? __fdiv_rn(1.0f, rb) : 0.0f; // a zero block: u = 0, w = 0
        unsigned id = 0, word = 0;
        float al = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float u = __fmul_rn(x[j], inv_b), au = fabsf(u);
            // pkv_code: the thresholds |u| is strictly above
            int t = (au > 0.0843f) + (au > 0.1698f) + (au > 0.2578f) + (au > 0.3499f) + (au > 0.4487f) +
                    (au > 0.5585f) + (au > 0.6901f);
            bool pos = u >= 0.0f;
            id |= (unsigned)pos << j;
            word |= (unsigned)((pos ? 8 : 0) | t) << (4 * j);
            al = __fadd_rn(al, __fmul_rn(cen[t], au));
        }
        if (al < 1e-6f) al = 1e-6f;
        float wb = __fdiv_rn(__fmul_rn(r, rb), al);
        if (i < i1) {
            ids[(size_t)i * B + p] = (uint8_t)id;
            codes[(size_t)i * B + p] = word;
            w[(size_t)i * B + p] = __half_as_ushort(__float2half_rn(wb < 65504.0f ? wb : 65504.0f));
            atomicAdd(&cnt[p * 256 + id], 1);
        }
    }
    __syncthreads();
    int32_t *gc = a.count + (size_t)lh * B * 256;
    for (int e = threadIdx.x; e < B * 256; e += 256)
        if (cnt[e]) atomicAdd(&gc[e], cnt[e]);
}

extern "C" cudaError_t pkv_gpu_encode(const PkvGpuIndex *ix, PkvKeySource src, int from, int to, cudaStream_t st) {
    if (from < 0 || to > ix->cap || from > to || (!src.base && !src.fp8)) return cudaErrorInvalidValue;
    // fp8 rows: 8-byte code loads and a 4-byte scale
    if (src.fp8 && ((uintptr_t)src.fp8 % 8 || src.layer_stride % 8 || src.head_stride % 8 || src.slot_stride % 8 || src.scale_offset % 4))
        return cudaErrorInvalidValue;
    if (from == to) return cudaSuccess;
    PkvEncArgs a = {src.base, src.layer_stride, src.head_stride, src.slot_stride, src.fp8, src.scale_offset, ix->ids, ix->codes,
                 ix->w, ix->count, ix->signs, ix->n_kv, ix->cap, from, to, 0, 0};
    a.vec = (uintptr_t)src.base % 16 == 0 && src.layer_stride % 8 == 0 && src.head_stride % 8 == 0 && src.slot_stride % 8 == 0;
    // Chunks of up to 2048 slots per block, smaller while that leaves the GPU short of blocks
    // (an update of 512 slots).
    int range = to - from, lh = ix->n_layers * ix->n_kv, want = 8 * sm_count();
    int chunk = 2048;
    while (chunk > 128 && (long long)((range + chunk - 1) / chunk) * lh < want) chunk /= 2;
    a.chunk = chunk;
    dim3 grid((range + chunk - 1) / chunk, lh);
    switch (ix->D) {
    case 64: pkv_encode_kernel<64><<<grid, 256, 0, st>>>(a); break;
    case 128: pkv_encode_kernel<128><<<grid, 256, 0, st>>>(a); break;
    case 256: pkv_encode_kernel<256><<<grid, 256, 0, st>>>(a); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

// ---- query ----

// The query transform of KV head h into x (D floats of shared memory, every thread of the block
// calls it; threads j < D work): the group mean (heads in order, then / G), its norm (one
// thread, the D squares in order), normalize, signs, butterflies, 1 / sqrt(D). Returns the
// norm to every thread. As pkv_prepare_query on the group mean.
static __device__ float query_transform(float *x, const float *q, const float *signs, int G, int D, int h) {
    __shared__ float s_inv, s_norm;
    int j = threadIdx.x;
    if (j < D) {
        float s = 0.0f;
        for (int g = 0; g < G; g++) s = __fadd_rn(s, q[((size_t)h * G + g) * D + j]);
        x[j] = __fdiv_rn(s, (float)G);
    }
    __syncthreads();
    if (j == 0) {
        float n2 = 0.0f;
#pragma unroll 16
        for (int i = 0; i < D; i++) n2 = __fadd_rn(n2, __fmul_rn(x[i], x[i])); // in order: a chain of D adds
        float nn = __fsqrt_rn(n2);
        s_inv = nn > 0.0f ? __fdiv_rn(1.0f, nn) : 0.0f;
        s_norm = nn;
    }
    __syncthreads();
    if (j < D) x[j] = __fmul_rn(__fmul_rn(x[j], s_inv), signs[j]);
    for (int hh = 1; hh < D; hh *= 2) {
        __syncthreads();
        if (j < D / 2) {
            int i = (j / hh) * 2 * hh + j % hh;
            float u = x[i], v = x[i + hh];
            x[i] = __fadd_rn(u, v), x[i + hh] = __fsub_rn(u, v);
        }
    }
    __syncthreads();
    if (j < D) x[j] = __fmul_rn(x[j], __fdiv_rn(1.0f, __fsqrt_rn((float)D)));
    __syncthreads();
    return s_norm;
}

// ---- selection ----

struct PkvSelArgs {
    const float *q, *signs;     // the step's queries (n_kv G heads, D), the SRHT signs
    int G;
    const uint8_t *ids, *codes; // this layer's
    const uint16_t *w;
    const int32_t *count;
    float *qt, *qn;
    uint8_t *bonus, *score;
    int32_t *hist;
    int *cand;
    float *est;
    int *sel, *nsel;
    const int *d_n;
    int n_kv, D, B, cap, capp, k, kmax, P, hist_stride;
    float beta, rho;
    int R; // rerank blocks per head
};

// Exclusive prefix sum of v over the block in thread order; *total gets the block's sum. red:
// 32 T of shared memory (the first barrier guards its reuse by a previous call).
template <typename T> static __device__ __forceinline__ T block_scan(T v, T *red, T *total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    T x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        T y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) red[warp] = x;
    __syncthreads();
    if (warp == 0) {
        T y = lane < nw ? red[lane] : (T)0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            T z = __shfl_up_sync(0xffffffffu, y, o);
            if (lane >= o) y += z;
        }
        red[lane] = y;
    }
    __syncthreads();
    *total = red[nw - 1];
    return (warp > 0 ? red[warp - 1] : (T)0) + x - v;
}

// pariskv_select.c's decimal() and pkv_ceil(), in double without contraction.
static __device__ __forceinline__ double dec6(float x) { return __ddiv_rn(round(__dmul_rn((double)x, 1e6)), 1e6); }
static __device__ __forceinline__ int ceil_dec(double x) { return (int)ceil(__dadd_rn(x, -1e-9)); }

// The step's zone size (clamped to the capacity), candidate count C = min(max(ceil(beta n),
// k), n), and (T not NULL) the tier targets ceil(n rho r_t), as pkv_select and pkv_bonus.
static __device__ __forceinline__ void sel_setup(const PkvSelArgs &a, int *n_out, int *C_out, int *T) {
    int n = *a.d_n;
    n = n < 0 ? 0 : n > a.cap ? a.cap : n;
    float beta = a.beta, rho = a.rho;
    if (beta <= 0.0f || rho <= 0.0f) { // pkv_schedule
        if (n < 5000) beta = 0.5f, rho = 0.5f;
        else if (n < 10000) beta = 0.25f, rho = 0.3f;
        else if (n < 30000) beta = 0.2f, rho = 0.25f;
        else beta = 0.1f, rho = 0.2f;
    }
    int C = ceil_dec(__dmul_rn((double)n, dec6(beta)));
    if (C < a.k) C = a.k;
    if (C > n) C = n;
    if (T) {
        const double frac[6] = {0.05, 0.15, 0.30, 0.50, 0.75, 1.0};
        double nr = __dmul_rn((double)n, dec6(rho));
#pragma unroll
        for (int t = 0; t < 6; t++) T[t] = ceil_dec(__dmul_rn(nr, frac[t]));
    }
    *n_out = n, *C_out = C;
}

// Slots per vote / compact block: a multiple of 16 (the compaction reads 16 scores at once).
static __device__ __forceinline__ int block_slots(int n, int P) { return ((n + P - 1) / P + 15) & ~15; }

// Order-preserving key of a float (-0 as +0, so that equal estimates tie as on the CPU).
static __device__ __forceinline__ uint32_t fkey(float f) {
    uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

// Block (b, h): subspace b of KV head h. Thread c scores pattern c (pkv_bonus's sum), counts
// the patterns ranked before it (better score, or equal and smaller id), and the prefix sum
// of the counts in rank order gives the keys ranked before each pattern.
static __global__ void __launch_bounds__(SEL_THREADS) pkv_bonus_kernel(PkvSelArgs a) {
    __shared__ __align__(16) float sc[256];
    __shared__ int perm[256], cnt[256];
    __shared__ long long red[32];
    __shared__ float x[PKV_GPU_MAX_D];
    pdl_wait();
    int b = blockIdx.x, h = blockIdx.y, c = threadIdx.x, B = a.B;
    int32_t *hh = a.hist + (size_t)h * a.hist_stride;
    for (int i = b * SEL_THREADS + c; i < HIST_BLK0; i += B * SEL_THREADS) hh[i] = 0; // the vote's and rerank's sums
    size_t tb = ((size_t)h * B + b) * 256;
    int my = a.count[tb + c]; // issued first: the query transform and the ranking hide its latency
    // Every block of the head transforms its query (a launch less than a kernel of its own);
    // block 0 stores it for the rerank.
    float qn = query_transform(x, a.q, a.signs, a.G, a.D, h);
    if (b == 0) {
        if (c < a.D) a.qt[(size_t)h * a.D + c] = x[c];
        if (c == 0) a.qn[h] = qn;
    }
    int n, C, T[6];
    sel_setup(a, &n, &C, T);
    if (n <= a.k) return;
    const float *q = x + b * 8;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) s = __fadd_rn(s, (c >> j) & 1 ? q[j] : -q[j]);
    sc[c] = s;
    __syncthreads();
    int rank = 0;
    const float4 *s4 = (const float4 *)sc;
#pragma unroll 8
    for (int o = 0; o < 256; o += 4) {
        float4 v = s4[o / 4];
        rank += (v.x > s || (v.x == s && o < c)) + (v.y > s || (v.y == s && o + 1 < c)) + (v.z > s || (v.z == s && o + 2 < c)) +
                (v.w > s || (v.w == s && o + 3 < c));
    }
    perm[rank & 255] = c; // a permutation unless qt holds NaN; the mask keeps that in bounds
    cnt[c] = my;
    __syncthreads();
    int cid = perm[c] & 255; // the pattern of rank c
    long long tot, before = block_scan((long long)cnt[cid], red, &tot);
    int tiers = 0;
#pragma unroll
    for (int t = 0; t < 6; t++) tiers += before < T[t];
    pdl_release();
    a.bonus[tb + cid] = (uint8_t)tiers;
}

// The vote reads a head's ids in pieces of 16 bytes (8 at B = 8: a head's rows are only 8-byte
// aligned there), lane l of a warp piece p0 + l: each load instruction reads 512 (256)
// contiguous bytes. A slot is PPS = 1 piece (B = 8, 16) or 2 (B = 32: lanes 2i, 2i + 1).
template <int B> struct VotePiece {
    static constexpr int BYTES = B < 16 ? B : 16, WORDS = BYTES / 4, PPS = B / BYTES;
    static constexpr int UNR = 4; // pieces a lane loads at once: 64 bytes in flight (32 at B = 8)
};

// Streamed (read once per step, evict-first: the scores, candidates and estimates stay in L2).
template <int B> static __device__ __forceinline__ void load_piece(uint32_t (&wd)[VotePiece<B>::WORDS], const uint8_t *p) {
    if constexpr (VotePiece<B>::WORDS == 2) {
        uint2 v = __ldcs((const uint2 *)p);
        wd[0] = v.x, wd[1] = v.y;
    } else {
        uint4 v = __ldcs((const uint4 *)p);
        wd[0] = v.x, wd[1] = v.y, wd[2] = v.z, wd[3] = v.w;
    }
}

// The bonus tables in shared memory, 4 bits an entry (bonuses are 0..6): subspace b's entry e
// sits in word b * 32 + (e & 31), nibble 7 - (e >> 5). A subspace's 256 entries then fill the
// 32 banks once, so a warp's lookups into one subspace never conflict (bytes: 64 words, two
// a bank, mostly 2-way conflicts), and rotating the word left by 4 (e >> 5) brings the entry
// to the top nibble, where one shift (fused with the add) extracts it.
// Score of one piece: the sum of its subspaces' bonuses (row: the table of its first one).
// Per id word w (4 ids): A holds the 4 byte offsets (e & 31) * 4, M the 4 rotations
// (e >> 5) * 4 in the low 5 bits of each byte (funnel shifts use the amount mod 32).
template <int WORDS> static __device__ __forceinline__ unsigned piece_score(const uint32_t (&wd)[WORDS], const uint32_t *row) {
    unsigned s = 0;
#pragma unroll
    for (int q = 0; q < WORDS; q++) {
        uint32_t w = wd[q], A = (w << 2) & 0x7c7c7c7cu, M = (w >> 3) & 0x1c1c1c1cu;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t word = *(const uint32_t *)((const char *)(row + (4 * q + j) * 32) + ((A >> (8 * j)) & 0xffu));
            s += __funnelshift_l(word, word, M >> (8 * j)) >> 28;
        }
    }
    return s;
}

// Block (j, h): the scores of slot range [j S, (j+1) S) of head h. Each warp streams
// 32 * UNR pieces per pass (UNR independent loads a lane), scores stored a byte a slot
// (32 contiguous bytes per store). Score histogram: two copies per warp (half-warps, 16 banks
// apart) with shared atomics, so that lanes with equal scores collide less; then the block's
// sum goes to the head's histogram (global) and, as "scores >= s", to the block's row.
// 6 blocks per SM (40 registers; 8 would spill): 96 KB of ids in flight per SM at B >= 16.
template <int B> static __global__ void __launch_bounds__(SEL_THREADS, 6) pkv_vote_kernel(PkvSelArgs a) {
    using VP = VotePiece<B>;
    constexpr int NB = 6 * B + 1, NW = SEL_THREADS / 32, PPS = VP::PPS, UNR = VP::UNR;
    constexpr int HSTR = ((NB + 31) & ~31) + 16; // one histogram copy
    static_assert(NB < HIST_BLK && NB < SEL_THREADS, "score bins");
    __shared__ uint32_t tbl[B * 32];
    __shared__ int wh[2 * NW * HSTR];
    __shared__ int red[32];
    int h = blockIdx.y, j = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    for (int i = t; i < 2 * NW * HSTR; i += SEL_THREADS) wh[i] = 0;
    pdl_wait();
    int n, C;
    sel_setup(a, &n, &C, NULL);
    if (n <= a.k) return;
    const uint8_t *bs = a.bonus + (size_t)h * B * 256;
    for (int i = t; i < B * 32; i += SEL_THREADS) {
        int b = i >> 5, c = i & 31;
        uint32_t v = 0;
#pragma unroll
        for (int m = 0; m < 8; m++) v |= (uint32_t)(bs[b * 256 + c + 32 * m] & 15) << (4 * (7 - m));
        tbl[i] = v;
    }
    __syncthreads();
    int S = block_slots(n, a.P), lo = min(j * S, n), hi = min(lo + S, n);
    unsigned plo = (unsigned)lo * PPS, phi = (unsigned)hi * PPS; // pieces: up to 2^31 at B = 32
    const uint8_t *ids = a.ids + (size_t)h * a.cap * B;
    uint8_t *sc = a.score + (size_t)h * a.capp;
    int *hw = wh + (2 * warp + (lane >> 4)) * HSTR;
    // B = 32: odd lanes hold the second half of a slot (subspaces 16..31). p0 stays even.
    const uint32_t *row = tbl + (PPS == 2 ? (lane & 1) * 16 * 32 : 0);
    // The loop bound is uniform over the warp (the shuffle needs every lane).
    for (unsigned p0 = plo + warp * 32 * UNR; p0 < phi; p0 += NW * 32 * UNR) {
        uint32_t wd[UNR][VP::WORDS];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            unsigned p = p0 + 32 * u + lane;
            if (p < phi) load_piece<B>(wd[u], ids + (size_t)p * VP::BYTES);
            else
#pragma unroll
                for (int q = 0; q < VP::WORDS; q++) wd[u][q] = 0;
        }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            unsigned s = piece_score(wd[u], row);
            if constexpr (PPS == 2) s += __shfl_xor_sync(0xffffffffu, s, 1);
            unsigned p = p0 + 32 * u + lane;
            if (p < phi && (PPS == 1 || !(lane & 1))) {
                sc[p / PPS] = (uint8_t)s;
                atomicAdd(&hw[s], 1);
            }
        }
    }
    pdl_release();
    __syncthreads();
    int v = 0;
    if (t < NB)
#pragma unroll
        for (int w = 0; w < 2 * NW; w++) v += wh[w * HSTR + t];
    int tot, ex = block_scan(v, red, &tot);
    int32_t *hh = a.hist + (size_t)h * a.hist_stride;
    if (t <= NB) hh[HIST_BLK0 + (size_t)j * HIST_BLK + t] = tot - ex; // this block's scores >= t (0 at t = NB)
    if (t < NB && v) atomicAdd(&hh[HIST_SCORE + t], v);
}

// The calibrated estimate of one candidate, L = B / 4 lanes of it: each lane decodes 4
// subspaces (16 bytes of codes, 8 of w) into their w_b <v_b, qt_b>, and the sum over b runs
// in order through the lanes, as pkv_estimate.
template <int L>
static __device__ __forceinline__ float estimate(uint4 cv, uint2 wv, const float (&q)[32], float qn, const float *lev) {
    const uint32_t cw[4] = {cv.x, cv.y, cv.z, cv.w}, ww[2] = {wv.x, wv.y};
    float p[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float d = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) d = __fadd_rn(d, __fmul_rn(lev[(cw[k] >> (4 * j)) & 15], q[k * 8 + j]));
        float wf = __half2float(__ushort_as_half((unsigned short)(ww[k >> 1] >> (16 * (k & 1)))));
        p[k] = __fmul_rn(wf, d);
    }
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < L; s++) {
        float t = acc;
#pragma unroll
        for (int k = 0; k < 4; k++) t = __fadd_rn(t, p[k]);
        acc = __shfl_sync(0xffffffffu, t, s, L);
    }
    return __fmul_rn(qn, acc);
}

// Block (j, h), the vote's block j's slot range. The threshold score thr and the quota of the
// bucket top-C (pkv_bucket_topc): a slot is a candidate if its score > thr, or == thr and
// fewer than quota slots before it scored thr. The slots before this block's are counted from
// the earlier vote blocks' "scores >= s" rows, so each candidate's place in cand is its rank
// in slot order: cand is ascending. A pass over the scores (L2: just written), 16 a thread.
static __global__ void __launch_bounds__(SEL_THREADS) pkv_compact_kernel(PkvSelArgs a) {
    __shared__ int red[32];
    __shared__ unsigned long long red64[32];
    __shared__ int s_thr, s_above;
    pdl_wait();
    int h = blockIdx.y, j = blockIdx.x, t = threadIdx.x, NB = 6 * a.B + 1;
    int n, C;
    sel_setup(a, &n, &C, NULL);
    if (n <= a.k) return;
    const int32_t *hh = a.hist + (size_t)h * a.hist_stride;
    if (t == 0) s_thr = 0, s_above = 0;
    // thr: the highest score s with (slots scoring >= s) >= C; above: those scoring > thr.
    int v = t < NB ? hh[HIST_SCORE + t] : 0, tot, ex = block_scan(v, red, &tot), ge = tot - ex;
    if (t < NB && ge >= C && ge - v < C) s_thr = t, s_above = ge - v;
    __syncthreads();
    int thr = s_thr, quota = C - s_above;
    // Slots of the earlier blocks scoring > thr (high word) and == thr (low word).
    unsigned long long acc = 0, acc_tot;
    for (int jj = t; jj < j; jj += SEL_THREADS) {
        const int32_t *cb = hh + HIST_BLK0 + (size_t)jj * HIST_BLK;
        int g1 = cb[thr + 1], g0 = cb[thr];
        acc += (unsigned long long)g1 << 32 | (unsigned)(g0 - g1);
    }
    block_scan(acc, red64, &acc_tot);
    int Gb = (int)(acc_tot >> 32), Eb = (int)(acc_tot & 0xffffffffu);
    const uint8_t *sc = a.score + (size_t)h * a.capp;
    int *cand = a.cand + (size_t)h * a.capp;
    int S = block_slots(n, a.P), lo = min(j * S, n), hi = min(lo + S, n);
    const uint32_t thr4 = (uint32_t)thr * 0x01010101u;
    for (int c0 = lo; c0 < hi; c0 += EMIT_CHUNK) {
        int i0 = c0 + 16 * t, nv = min(max(hi - i0, 0), 16); // valid scores of this thread's 16
        uint4 sv = nv ? *(const uint4 *)(sc + i0) : make_uint4(0, 0, 0, 0); // in bounds: capp % 16 == 0
        const uint32_t sw[4] = {sv.x, sv.y, sv.z, sv.w};
        // Four scores a word (SIMD within a register): byte masks of > thr and == thr.
        uint32_t gm[4], em[4];
        int ng = 0, ne = 0;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            int vb = min(max(nv - 4 * w, 0), 4);
            uint32_t valid = vb == 4 ? 0xffffffffu : (1u << (8 * vb)) - 1;
            gm[w] = __vcmpgtu4(sw[w], thr4) & valid, em[w] = __vcmpeq4(sw[w], thr4) & valid;
            ng += __popc(gm[w]) >> 3, ne += __popc(em[w]) >> 3;
        }
        int ptot, pex = block_scan(ng << 16 | ne, red, &ptot); // each sum <= EMIT_CHUNK < 2^16
        int G = Gb + (pex >> 16), E = Eb + (pex & 0xffff);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            uint32_t m = (gm[w] | em[w]) & 0x01010101u; // one bit a candidate byte, ascending slots
            while (m) {
                int bit = __ffs(m) - 1, slot = i0 + 4 * w + (bit >> 3);
                m &= m - 1;
                if (gm[w] >> bit & 1) cand[G + min(E, quota)] = slot, G++;
                else {
                    if (E < quota) cand[G + E] = slot;
                    E++;
                }
            }
        }
        Gb += ptot >> 16, Eb += ptot & 0xffff;
    }
    pdl_release();
}

// Block (r, h): the estimates of candidates [r Cr, (r+1) Cr) of head h (Cr = C / R rounded
// up), fixed-size shares whatever the scores' spread. Each warp takes U groups of CPW
// candidates at once: the slots (L2), then all U gathers of codes (16 bytes a lane) and w (8)
// before any arithmetic, so each lane has 2U loads in flight. 12-bit histogram of the
// estimates' order-preserving keys for the top-k (shared, then the nonzero bins to global).
template <int B> static __global__ void __launch_bounds__(SEL_THREADS) pkv_rerank_kernel(PkvSelArgs a) {
    constexpr int L = B / 4, CPW = 32 / L, NW = SEL_THREADS / 32, U = RERANK_U, STEP = NW * CPW * U;
    __shared__ int h1[EST_BINS];
    __shared__ float lev[16];
    int h = blockIdx.y, r = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    for (int i = t; i < EST_BINS; i += SEL_THREADS) h1[i] = 0;
    if (t < 16) lev[t] = t & 8 ? c_centers[t & 7] : -c_centers[t & 7]; // pkv_levels
    pdl_wait();
    int n, C;
    sel_setup(a, &n, &C, NULL);
    if (n <= a.k) return;
    int part = lane % L, g = lane / L;
    float q[32];
#pragma unroll
    for (int i = 0; i < 32; i++) q[i] = a.qt[(size_t)h * a.D + part * 32 + i];
    float qn = a.qn[h];
    const uint8_t *codes = a.codes + (size_t)h * a.cap * B * 4;
    const uint16_t *w = a.w + (size_t)h * a.cap * B;
    const int *cand = a.cand + (size_t)h * a.capp;
    float *est = a.est + (size_t)h * a.capp;
    int per = (C + a.R - 1) / a.R, c_lo = min(r * per, C), c_hi = min(c_lo + per, C);
    __syncthreads(); // h1, lev
    // Software-pipelined over a warp's groups of U x CPW candidates: the codes and w of the next
    // group and the slots of the one after are in flight while this group is scored. The loop
    // bound is uniform over the warp (estimate's shuffles need every lane).
    auto slots = [&](int c, int (&slot)[U]) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int idx = c + u * CPW + g;
            slot[u] = idx < c_hi ? cand[idx] : -1;
        }
    };
    auto gather = [&](const int (&slot)[U], uint4 (&cv)[U], uint2 (&wv)[U]) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            cv[u] = make_uint4(0, 0, 0, 0), wv[u] = make_uint2(0, 0);
            if (slot[u] >= 0) {
                cv[u] = __ldcs((const uint4 *)(codes + (size_t)slot[u] * B * 4) + part);
                wv[u] = __ldcs((const uint2 *)(w + (size_t)slot[u] * B) + part);
            }
        }
    };
    int c = c_lo + warp * CPW * U, s_cur[U], s_nxt[U];
    uint4 cv[U], cv_n[U];
    uint2 wv[U], wv_n[U];
    slots(c, s_cur);
    gather(s_cur, cv, wv);
    slots(c + STEP, s_nxt);
    for (; c < c_hi; c += STEP) {
        gather(s_nxt, cv_n, wv_n);
        int s_nn[U];
        slots(c + 2 * STEP, s_nn);
#pragma unroll
        for (int u = 0; u < U; u++) {
            float e = estimate<L>(cv[u], wv[u], q, qn, lev);
            if (part == 0 && s_cur[u] >= 0) {
                est[c + u * CPW + g] = e;
                atomicAdd(&h1[fkey(e) >> 20], 1);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) cv[u] = cv_n[u], wv[u] = wv_n[u], s_cur[u] = s_nxt[u], s_nxt[u] = s_nn[u];
    }
    pdl_release();
    __syncthreads();
    int32_t *hh = a.hist + (size_t)h * a.hist_stride;
    for (int i = t; i < EST_BINS; i += SEL_THREADS)
        if (h1[i]) atomicAdd(&hh[HIST_EST + i], h1[i]);
}

// The bin d of hist (nb bins, nb a multiple of the block size) holding the r-th largest item
// (r >= 1): the items of the bins above d number *above < r <= *above + hist[d] = *above + *in.
static __device__ void find_digit(const int *hist, int nb, int r, int *red, int *d, int *above, int *in) {
    int per = nb / blockDim.x, b0 = threadIdx.x * per, v = 0;
    for (int i = 0; i < per; i++) v += hist[b0 + i];
    int tot, ex = block_scan(v, red, &tot);
    int ab = tot - ex - v; // in the bins of the threads after this one
    for (int i = per - 1; i >= 0; i--) {
        int c = hist[b0 + i];
        if (ab < r && ab + c >= r) *d = b0 + i, *above = ab, *in = c;
        ab += c;
    }
    __syncthreads();
}

// Calls f(i, key) for the items [lo, hi) of est (lo a multiple of 16), 16 a thread per chunk
// (four 16-byte loads in flight); est rows are padded to a multiple of 16, so reads past hi stay
// in bounds.
template <typename F> static __device__ void est_pass(const float *est, int lo, int hi, F f) {
    constexpr int PB = 16;
    for (int c0 = lo; c0 < hi; c0 += PB * TOPK_THREADS) {
        int i0 = c0 + PB * threadIdx.x;
        uint32_t key[PB];
#pragma unroll
        for (int v = 0; v < PB / 4; v++) {
            float4 e4 = i0 + 4 * v < hi ? *(const float4 *)(est + i0 + 4 * v) : make_float4(0, 0, 0, 0);
            key[4 * v] = fkey(e4.x), key[4 * v + 1] = fkey(e4.y), key[4 * v + 2] = fkey(e4.z), key[4 * v + 3] = fkey(e4.w);
        }
#pragma unroll
        for (int u = 0; u < PB; u++)
            if (i0 + u < hi) f(i0 + u, key[u]);
    }
}

// The sum of bins [0, nb) of hist over the cluster's blocks (ranks in order: every block gets the
// same), into tot; after a cluster barrier that follows the last write to hist.
static __device__ __forceinline__ void cluster_hist_sum(cg::cluster_group &cl, int *hist, int *tot, int nb) {
    for (int b = threadIdx.x; b < nb; b += TOPK_THREADS) {
        int s = 0;
#pragma unroll
        for (int r = 0; r < TOPK_CLUSTER; r++) s += cl.map_shared_rank(hist, r)[b];
        tot[b] = s;
    }
    __syncthreads();
}

// Cluster (h) of TOPK_CLUSTER blocks per KV head: the k best of the C estimates (ties: the
// smaller slot) by radix select on their keys, digits of 12, 10 and 10 bits, written to sel in
// slot order (cand is ascending): the attention needs no sort. Block j takes the candidates
// [j per, (j+1) per). Digit 1 comes from the rerank's histogram; pass 1 over the block's
// estimates counts the items above digit 1's bin and histograms digit 2 of those in it, pass 2
// does the same one digit down; the histograms are summed over the cluster (distributed shared
// memory). The k-th key T is then known, with the number r of its ties to take: each block
// counts its items above T and equal to it, and a last ordered pass writes block j's items
// above T and its share of the first r ties at its offset (the items of blocks before it).
static __global__ void __cluster_dims__(TOPK_CLUSTER, 1, 1) __launch_bounds__(TOPK_THREADS) pkv_topk_kernel(PkvSelArgs a) {
    __shared__ int hist[EST_BINS], h2[1024], h3[1024];
    __shared__ int red[32];
    __shared__ long long red64[32];
    __shared__ int s_d, s_above, s_in, s_gt, s_eq;
    cg::cluster_group cl = cg::this_cluster();
    pdl_wait();
    int h = blockIdx.y, j = (int)cl.block_rank(), t = threadIdx.x, k = a.k;
    int n, C;
    sel_setup(a, &n, &C, NULL);
    int *sel = a.sel + (size_t)h * a.kmax;
    const int *cand = a.cand + (size_t)h * a.capp;
    if (n <= k || C == k) { // every slot, or every candidate (ascending)
        for (int i = j * TOPK_THREADS + t; i < (n <= k ? n : k); i += TOPK_CLUSTER * TOPK_THREADS) sel[i] = n <= k ? i : cand[i];
        if (j == 0 && t == 0) a.nsel[h] = n <= k ? n : k;
        return;
    }
    const float *est = a.est + (size_t)h * a.capp;
    const int32_t *hh = a.hist + (size_t)h * a.hist_stride;
    int per = ((C + TOPK_CLUSTER - 1) / TOPK_CLUSTER + 15) & ~15, lo = min(j * per, C), hi = min(lo + per, C);
    for (int i = t; i < EST_BINS; i += TOPK_THREADS) hist[i] = hh[HIST_EST + i];
    for (int i = t; i < 1024; i += TOPK_THREADS) h2[i] = 0, h3[i] = 0;
    __syncthreads();
    pdl_release();
    int r = k, gt = 0; // gt: this thread's items above the k-th key
    find_digit(hist, EST_BINS, r, red, &s_d, &s_above, &s_in);
    const uint32_t d1 = s_d;
    r -= s_above;
    est_pass(est, lo, hi, [&](int, uint32_t key) {
        if (key >> 20 > d1) gt++;
        else if (key >> 20 == d1) atomicAdd(&h2[(key >> 10) & 1023], 1);
    });
    cl.sync();
    cluster_hist_sum(cl, h2, hist, 1024);
    find_digit(hist, 1024, r, red, &s_d, &s_above, &s_in);
    const uint32_t p22 = d1 << 10 | (uint32_t)s_d; // the k-th key's first 22 bits
    r -= s_above;
    est_pass(est, lo, hi, [&](int, uint32_t key) {
        if (key >> 20 != d1) return;
        if (key >> 10 > p22) gt++;
        else if (key >> 10 == p22) atomicAdd(&h3[key & 1023], 1);
    });
    cl.sync();
    cluster_hist_sum(cl, h3, hist, 1024);
    find_digit(hist, 1024, r, red, &s_d, &s_above, &s_in);
    const uint32_t T = p22 << 10 | (uint32_t)s_d; // the k-th key
    r -= s_above;                                  // of its ties, the first r in slot order are taken
    // This block's items above T and equal to it (its own digit-3 histogram above and at T's bin).
    for (int b = t; b < 1024; b += TOPK_THREADS) gt += b > s_d ? h3[b] : 0;
    int tot;
    block_scan(gt, red, &tot);
    if (t == 0) s_gt = tot, s_eq = h3[s_d];
    cl.sync();
    // Offsets: the items above T and the ties of the blocks before this one.
    int G0 = 0, E0 = 0;
    for (int q = 0; q < j; q++) G0 += *cl.map_shared_rank(&s_gt, q), E0 += *cl.map_shared_rank(&s_eq, q);
    int quota = max(0, r - E0); // ties this block may take, from its first
    // Ordered pass: an item's place is (items above T before it) + min(ties before it, quota).
    int gb = 0, eb = 0; // this block's counts before the current chunk
    for (int c0 = lo; c0 < hi; c0 += 16 * TOPK_THREADS) {
        int i0 = c0 + 16 * t, g = 0, e = 0;
        uint32_t key[16];
#pragma unroll
        for (int v = 0; v < 4; v++) {
            float4 e4 = i0 + 4 * v < hi ? *(const float4 *)(est + i0 + 4 * v) : make_float4(0, 0, 0, 0);
            key[4 * v] = fkey(e4.x), key[4 * v + 1] = fkey(e4.y), key[4 * v + 2] = fkey(e4.z), key[4 * v + 3] = fkey(e4.w);
        }
#pragma unroll
        for (int u = 0; u < 16; u++)
            if (i0 + u < hi) g += key[u] > T, e += key[u] == T;
        long long ctot, ex = block_scan((long long)g << 32 | e, red64, &ctot);
        int gx = gb + (int)(ex >> 32), ex_e = eb + (int)(ex & 0xffffffff);
#pragma unroll
        for (int u = 0; u < 16; u++) {
            if (i0 + u >= hi) continue;
            if (key[u] > T) sel[G0 + min(E0, r) + gx + min(ex_e, quota)] = cand[i0 + u], gx++;
            else if (key[u] == T) {
                if (ex_e < quota) sel[G0 + min(E0, r) + gx + ex_e] = cand[i0 + u];
                ex_e++;
            }
        }
        gb += (int)(ctot >> 32), eb += (int)(ctot & 0xffffffff);
    }
    if (j == 0 && t == 0) a.nsel[h] = k;
    cl.sync(); // peers may still read s_gt / s_eq
}

// Blocks of a kernel resident per SM (its registers and shared memory decide), once per kernel.
template <typename Kernel> static int resident(Kernel k, int fallback) {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k, SEL_THREADS, 0) != cudaSuccess || b < 1) b = fallback;
    return b;
}
template <int B> static int resident_of(bool rerank) {
    static const int vote = resident(pkv_vote_kernel<B>, 4), rr = resident(pkv_rerank_kernel<B>, 2);
    return rerank ? rr : vote;
}

// Vote / compact (rerank) blocks per KV head: those of all heads in one wave of resident
// blocks (equal shares: a second, partial wave would add its whole length), at least 256
// slots (candidates) each at full capacity, the vote's at most MAX_P. hist_stride records the
// vote's for pkv_gpu_select. The first call (pkv_gpu_scratch_alloc) queries the occupancies,
// so that none runs inside a stream capture.
static int blocks_per_head(int n_kv, int B, int cap, bool rerank) {
    int per_sm = B == 8 ? resident_of<8>(rerank) : B == 16 ? resident_of<16>(rerank) : resident_of<32>(rerank);
    int p = per_sm * sm_count() / n_kv, most = (cap + 255) / 256;
    p = p < most ? p : most;
    if (!rerank) p = p < MAX_P ? p : MAX_P;
    return p > 0 ? p : 1;
}

extern "C" cudaError_t pkv_gpu_scratch_alloc(PkvGpuScratch *s, const PkvGpuIndex *ix, int kmax) {
    memset(s, 0, sizeof *s);
    if (kmax < 1 || !ix->ids) return cudaErrorInvalidValue;
    size_t H = ix->n_kv, D = ix->D, B = ix->B, capp = ((size_t)ix->cap + 15) & ~(size_t)15;
    int hist_stride = HIST_BLK0 + blocks_per_head(ix->n_kv, ix->B, ix->cap, false) * HIST_BLK;
    size_t sz[9] = {H * D * 4, H * 4, H * B * 256, H * capp, H * hist_stride * 4, H * capp * 4, H * capp * 4, H * kmax * 4, H * 4};
    size_t off[9], tot = 0;
    for (int i = 0; i < 9; i++) off[i] = tot, tot += al256(sz[i]);
    char *p;
    CU_TRY(cudaMalloc(&p, tot));
    // Nothing reads it unwritten, but the tails of vector reads stay defined. Waited for: the
    // caller's stream need not be ordered after stream 0.
    cudaError_t e = cudaMemset(p, 0, tot);
    if (e == cudaSuccess) e = cudaStreamSynchronize(0);
    if (e != cudaSuccess) {
        cudaFree(p);
        return e;
    }
    s->qt = (float *)(p + off[0]);
    s->qn = (float *)(p + off[1]);
    s->bonus = (uint8_t *)(p + off[2]);
    s->score = (uint8_t *)(p + off[3]);
    s->hist = (int32_t *)(p + off[4]);
    s->cand = (int *)(p + off[5]);
    s->est = (float *)(p + off[6]);
    s->sel = (int *)(p + off[7]);
    s->nsel = (int *)(p + off[8]);
    s->kmax = kmax;
    s->hist_stride = hist_stride;
    s->base = p;
    return cudaSuccess;
}

extern "C" void pkv_gpu_scratch_free(PkvGpuScratch *s) {
    if (s->base) cudaFree(s->base);
    memset(s, 0, sizeof *s);
}

template <int B> static cudaError_t launch_select(PkvSelArgs a, cudaStream_t st) {
    a.R = blocks_per_head(a.n_kv, B, a.cap, true);
    dim3 per_head(a.P, a.n_kv);
    CU_TRY(launch_pdl(pkv_bonus_kernel, dim3(B, a.n_kv), dim3(SEL_THREADS), 0, st, a));
    CU_TRY(launch_pdl(pkv_vote_kernel<B>, per_head, dim3(SEL_THREADS), 0, st, a));
    CU_TRY(launch_pdl(pkv_compact_kernel, per_head, dim3(SEL_THREADS), 0, st, a));
    CU_TRY(launch_pdl(pkv_rerank_kernel<B>, dim3(a.R, a.n_kv), dim3(SEL_THREADS), 0, st, a));
    return launch_pdl(pkv_topk_kernel, dim3(TOPK_CLUSTER, a.n_kv), dim3(TOPK_THREADS), 0, st, a);
}

extern "C" cudaError_t pkv_gpu_select(PkvGpuScratch *s, const PkvGpuIndex *ix, int layer, const float *q, int n_heads,
                                      const int *d_n, int k, float beta, float rho, cudaStream_t st) {
    if (k < 1 || k > s->kmax || layer < 0 || layer >= ix->n_layers || !s->base || n_heads <= 0 || n_heads % ix->n_kv)
        return cudaErrorInvalidValue;
    size_t keys = (size_t)layer * ix->n_kv * ix->cap, B = ix->B;
    PkvSelArgs a = {q, ix->signs, n_heads / ix->n_kv, ix->ids + keys * B, ix->codes + keys * B * 4, ix->w + keys * B,
                 ix->count + (size_t)layer * ix->n_kv * B * 256, s->qt, s->qn, s->bonus, s->score, s->hist, s->cand,
                 s->est, s->sel, s->nsel, d_n, ix->n_kv, ix->D, ix->B, ix->cap, (ix->cap + 15) & ~15, k, s->kmax,
                 (s->hist_stride - HIST_BLK0) / HIST_BLK, s->hist_stride, beta, rho, 0};
    switch (ix->B) {
    case 8: return launch_select<8>(a, st);
    case 16: return launch_select<16>(a, st);
    case 32: return launch_select<32>(a, st);
    }
    return cudaErrorInvalidValue;
}
