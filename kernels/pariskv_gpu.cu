// ParisKV on the GPU (pariskv_gpu.h): the encoder of zone keys and one decode step's selection.
// The arithmetic is that of attention/pariskv_*.c operation for operation (__fadd_rn / __fmul_rn
// so that nvcc contracts nothing into an FMA, sums in the CPU's order), so ids, codes, w, the
// query, the bonus tables, the scores and the estimates equal the CPU's bit for bit (the CPU
// build, -std=c11 without -ffast-math, contracts nothing either), and the candidate and top-k
// sets are the CPU's, ties to the smaller slot included.
//
// The selection's kernels are in pkv_select_staged.cu (four a layer; PKV_SELECT=five runs the
// five of session 5 to compare); pkv_select.cuh holds what they share with the encoder. This
// file: the index, the encoder, the scratch.
//
// For callers: the scratch's score, cand and est rows are capp = cap rounded up to 16 apart
// (aligned vector reads), cand/est hold C entries (cand ascending); one scratch per stream, and
// it serves only indexes of the shape it was allocated for; the zone size *d_n is clamped to
// cap. Encoding: D in {64, 128, 256}, n_layers * n_kv <= 65535; the key source is read with
// 16-byte loads when its base and strides allow (8-element multiples), element-wise otherwise.
#include "pkv_select.cuh"
#include "../offload/fp8.h"

#include <stdlib.h>

#include <cuda_fp16.h>
#include <string.h>

namespace cg = cooperative_groups;

extern "C" {
#include "../attention/srht.h"
}


static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }


// ---- index ----

// Byte offsets of ids, cw, count, signs in the one allocation; returns its size.
static size_t index_layout(int n_layers, int n_kv, int D, int cap, size_t off[4]) {
    size_t B = (size_t)D / 8, keys = (size_t)n_layers * n_kv * (cap > 0 ? cap : 1);
    size_t sz[4] = {keys * B, keys * B * 6, (size_t)n_layers * n_kv * B * 256 * 4, (size_t)D * 4};
    size_t tot = 0;
    for (int i = 0; i < 4; i++) off[i] = tot, tot += al256(sz[i]);
    return tot;
}

static int index_shape_ok(int n_layers, int n_kv, int D, int cap) {
    return (D == 64 || D == 128 || D == 256) && n_layers > 0 && n_kv > 0 && cap > 0 && cap <= (1 << 30) &&
           (long long)n_layers * n_kv <= 65535; // the encoder's grid.y
}

extern "C" size_t pkv_gpu_index_bytes(int n_layers, int n_kv, int D, int cap) {
    size_t off[4];
    return index_layout(n_layers, n_kv, D, cap, off);
}

extern "C" cudaError_t pkv_gpu_index_alloc(PkvGpuIndex *ix, int n_layers, int n_kv, int D, int cap, cudaStream_t st) {
    memset(ix, 0, sizeof *ix);
    if (!index_shape_ok(n_layers, n_kv, D, cap)) return cudaErrorInvalidValue;
    size_t off[4], bytes = index_layout(n_layers, n_kv, D, cap, off);
    char *p;
    CU_TRY(cudaMalloc(&p, bytes));
    ix->n_layers = n_layers, ix->n_kv = n_kv, ix->D = D, ix->B = D / 8, ix->cap = cap;
    ix->ids = (uint8_t *)p; // the base: pkv_gpu_index_free frees it
    ix->cw = (uint8_t *)(p + off[1]);
    ix->count = (int32_t *)(p + off[2]);
    ix->signs = (float *)(p + off[3]);
    float s[PKV_GPU_MAX_D];
    srht_signs(SRHT_SEED, D, s);
    cudaError_t e = cudaMemsetAsync(p, 0, off[3], st);
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
    int round8;           // bf16 keys rounded as the fp8 store rounds them (PkvKeySource.round_fp8)
    int l0;               // the first layer encoded (blockIdx.y / n_kv counts from it)
    uint8_t *ids, *cw;
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
    int l = a.l0 + (int)blockIdx.y / a.n_kv, h = (int)blockIdx.y % a.n_kv, lh = l * a.n_kv + h;
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
    uint8_t *cw = a.cw + head * B * 6;
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
            if (a.round8) { // rows_to_host_fp8's codes and scale, then fp8_dequantize_row's values
                float amax = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(x[j]));
                for (int m = 1; m < LPK; m *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
                const float inv = amax > 0.0f ? FP8_E4M3_MAX / amax : 0.0f, sc = fp8_row_scale(amax);
#pragma unroll
                for (int j = 0; j < 8; j++) x[j] = __fmul_rn(fp8_e4m3_decode(fp8_e4m3_encode(x[j] * inv)), sc);
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
            uint8_t *rec = cw + (size_t)i * B * 6; // codes, then w
            ((uint32_t *)rec)[p] = word;
            ((uint16_t *)(rec + B * 4))[p] = __half_as_ushort(__float2half_rn(wb < 65504.0f ? wb : 65504.0f));
            atomicAdd(&cnt[p * 256 + id], 1);
        }
    }
    __syncthreads();
    int32_t *gc = a.count + (size_t)lh * B * 256;
    for (int e = threadIdx.x; e < B * 256; e += 256)
        if (cnt[e]) atomicAdd(&gc[e], cnt[e]);
}

static cudaError_t encode(const PkvGpuIndex *ix, PkvKeySource src, int l0, int nl, int from, int to, cudaStream_t st) {
    if (from < 0 || to > ix->cap || from > to || (!src.base && !src.fp8) || (src.round_fp8 && !src.base)) return cudaErrorInvalidValue;
    // fp8 rows: 8-byte code loads and a 4-byte scale
    if (src.fp8 && ((uintptr_t)src.fp8 % 8 || src.layer_stride % 8 || src.head_stride % 8 || src.slot_stride % 8 || src.scale_offset % 4))
        return cudaErrorInvalidValue;
    if (from == to) return cudaSuccess;
    PkvEncArgs a = {src.base, src.layer_stride, src.head_stride, src.slot_stride, src.fp8, src.scale_offset, src.round_fp8, l0, ix->ids, ix->cw,
                 ix->count, ix->signs, ix->n_kv, ix->cap, from, to, 0, 0};
    a.vec = (uintptr_t)src.base % 16 == 0 && src.layer_stride % 8 == 0 && src.head_stride % 8 == 0 && src.slot_stride % 8 == 0;
    // Chunks of up to 2048 slots per block, smaller while that leaves the GPU short of blocks
    // (an update of 512 slots).
    int range = to - from, lh = nl * ix->n_kv, want = 8 * sm_count();
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

extern "C" cudaError_t pkv_gpu_encode(const PkvGpuIndex *ix, PkvKeySource src, int from, int to, cudaStream_t st) {
    return encode(ix, src, 0, ix->n_layers, from, to, st);
}

extern "C" cudaError_t pkv_gpu_encode_layer(const PkvGpuIndex *ix, PkvKeySource src, int layer, int from, int to, cudaStream_t st) {
    if (layer < 0 || layer >= ix->n_layers) return cudaErrorInvalidValue;
    return encode(ix, src, layer, 1, from, to, st);
}


extern "C" cudaError_t pkv_gpu_scratch_alloc(PkvGpuScratch *s, const PkvGpuIndex *ix, int kmax) {
    memset(s, 0, sizeof *s);
    if (kmax < 1 || !ix->ids) return cudaErrorInvalidValue;
    size_t H = ix->n_kv, D = ix->D, B = ix->B, capp = ((size_t)ix->cap + 15) & ~(size_t)15;
    int hist_stride = HIST_BLK0 + pkv_staged_vote_blocks(ix->n_kv, ix->B, ix->cap) * HIST_BLK;
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
    s->R = pkv_cand_rerank_blocks(ix->n_kv, ix->B, ix->cap);
    s->hist_stride = hist_stride;
    s->base = p;
    const char *v = getenv("PKV_SELECT");
    s->five = v && !strcmp(v, "five");
    const char *rx = getenv("PKV_TOPK_RADIX");
    s->radix = rx && *rx && strcmp(rx, "0");
    return cudaSuccess;
}

extern "C" void pkv_gpu_scratch_free(PkvGpuScratch *s) {
    if (s->base) cudaFree(s->base);
    memset(s, 0, sizeof *s);
}

extern "C" cudaError_t pkv_gpu_select(PkvGpuScratch *s, const PkvGpuIndex *ix, int layer, const float *q, int n_heads,
                                      const int *d_n, int k, float beta, float rho, cudaStream_t st) {
    if (k < 1 || k > s->kmax || layer < 0 || layer >= ix->n_layers || !s->base || n_heads <= 0 || n_heads % ix->n_kv)
        return cudaErrorInvalidValue;
    size_t keys = (size_t)layer * ix->n_kv * ix->cap, B = ix->B;
    PkvSelArgs a = {q, ix->signs, n_heads / ix->n_kv, ix->ids + keys * B, ix->cw + keys * B * 6,
                    ix->count + (size_t)layer * ix->n_kv * B * 256, s->qt, s->qn, s->bonus, s->score, s->hist, s->cand,
                    s->est, s->sel, s->nsel, d_n, ix->n_kv, ix->D, ix->B, ix->cap, (ix->cap + 15) & ~15, k, s->kmax,
                    (s->hist_stride - HIST_BLK0) / HIST_BLK, s->hist_stride, beta, rho, s->R, s->five, s->radix};
    return pkv_select_staged(a, st);
}
