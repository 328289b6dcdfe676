// Flash decoding: the keys 0..pos of each KV head are cut into fixed splits; one block per
// (KV head, split) scores its keys for all G query heads of the group (each K/V row is read
// once for the whole group), then a second kernel merges the splits' softmax pieces.
#include "cuda_common.h"
#include "kernels.h"
#include "pdl.h"

#define DEC_THREADS 128
#define DEC_MAX_SPLIT 1024

#define DEC_UNROLL 4 // keys per lane loaded before any arithmetic: bytes in flight

// Split length: about four waves of blocks at this cache capacity (132 SMs), 128..1024 keys.
static int split_len(int ctx, int n_kv) {
    int s = (int)(((long long)ctx * n_kv / (4 * 132) + 127) / 128 * 128);
    if (s < 128) s = 128;
    if (s > DEC_MAX_SPLIT) s = DEC_MAX_SPLIT;
    return s;
}

extern "C" size_t attn_decode_scratch_floats(int n_heads, int hd, int ctx) {
    (void)ctx;
    int n_splits = (ctx + 127) / 128; // upper bound over any n_kv
    return (size_t)n_heads * n_splits * (hd + 2);
}

__device__ __forceinline__ void load8(const bf16 *p, float *f) {
    uint4 u = __ldg((const uint4 *)p);
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}

template <int G, int HD>
__global__ void __launch_bounds__(DEC_THREADS) attn_split_kernel(float *partial, const bf16 *q, const bf16 *k_cache,
                                                                 const bf16 *v_cache, const int *d_pos, int ctx,
                                                                 int S, int n_splits, float scale) {
    constexpr int LPK = HD / 8;            // lanes per key row (16-byte chunks)
    constexpr int KPW = 32 / LPK;          // keys a warp handles at once
    constexpr int NW = DEC_THREADS / 32;
    __shared__ float sc[G][DEC_MAX_SPLIT]; // scores, then probabilities, then the warps' sums of V
    __shared__ float red[NW][G];
    __shared__ float mx_s[G], sum_s[G];
    float(*acc_s)[G][HD] = (float(*)[G][HD])sc; // NW * G * HD <= G * DEC_MAX_SPLIT
    int kvh = blockIdx.x, split = blockIdx.y;
    pdl_wait();
    pdl_release();
    int n_keys = *d_pos + 1;
    int k0 = split * S, k1 = min(k0 + S, n_keys);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane / LPK, part = lane % LPK;
    float *out_base = partial; // layout: [head][split][HD + 2] (o unnormalized, then m, l)
    if (k0 >= k1) {
        for (int g = threadIdx.x; g < G; g += DEC_THREADS) {
            float *o = out_base + ((size_t)(kvh * G + g) * n_splits + split) * (HD + 2);
            o[HD] = -INFINITY;
            o[HD + 1] = 0.0f;
        }
        return;
    }
    // This lane's 8 query elements for each head of the group.
    float qf[G][8];
#pragma unroll
    for (int g = 0; g < G; g++) load8(q + (size_t)(kvh * G + g) * HD + part * 8, qf[g]);
    const bf16 *kb = k_cache + (size_t)kvh * ctx * HD, *vb = v_cache + (size_t)kvh * ctx * HD;

    // Scores: each lane loads its chunk of DEC_UNROLL keys before using any of them.
    for (int base = k0 + warp * KPW * DEC_UNROLL; base < k1; base += NW * KPW * DEC_UNROLL) {
        float kf[DEC_UNROLL][8];
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++) {
            int k = base + u * KPW + sub;
            if (k < k1) load8(kb + (size_t)k * HD + part * 8, kf[u]);
            else
#pragma unroll
                for (int i = 0; i < 8; i++) kf[u][i] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++) {
            int k = base + u * KPW + sub;
#pragma unroll
            for (int g = 0; g < G; g++) {
                float sdot = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) sdot = fmaf(qf[g][i], kf[u][i], sdot);
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) sdot += __shfl_xor_sync(0xffffffffu, sdot, o);
                if (part == 0 && k < k1) sc[g][k - k0] = sdot * scale;
            }
        }
    }
    __syncthreads();
    // Max and sum per head.
    int n = k1 - k0;
    float m[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        for (int i = threadIdx.x; i < n; i += DEC_THREADS) m[g] = fmaxf(m[g], sc[g][i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m[g] = fmaxf(m[g], __shfl_xor_sync(0xffffffffu, m[g], o));
        if (lane == 0) red[warp][g] = m[g];
    }
    __syncthreads();
    if (threadIdx.x < G) {
        float v = red[0][threadIdx.x];
        for (int w = 1; w < NW; w++) v = fmaxf(v, red[w][threadIdx.x]);
        mx_s[threadIdx.x] = v;
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < G; g++) {
        float s = 0.0f;
        for (int i = threadIdx.x; i < n; i += DEC_THREADS) {
            float p = __expf(sc[g][i] - mx_s[g]);
            sc[g][i] = p;
            s += p;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) red[warp][g] = s;
    }
    __syncthreads();
    if (threadIdx.x < G) {
        float v = 0.0f;
        for (int w = 0; w < NW; w++) v += red[w][threadIdx.x];
        sum_s[threadIdx.x] = v;
    }
    // Weighted sum of V: each lane owns 8 output dims of every head.
    float acc[G][8];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int i = 0; i < 8; i++) acc[g][i] = 0.0f;
    for (int base = k0 + warp * KPW * DEC_UNROLL; base < k1; base += NW * KPW * DEC_UNROLL) {
        float vf[DEC_UNROLL][8];
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++) {
            int k = base + u * KPW + sub;
            if (k < k1) load8(vb + (size_t)k * HD + part * 8, vf[u]);
        }
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++) {
            int k = base + u * KPW + sub;
            if (k >= k1) continue;
#pragma unroll
            for (int g = 0; g < G; g++) {
                float p = sc[g][k - k0];
#pragma unroll
                for (int i = 0; i < 8; i++) acc[g][i] = fmaf(p, vf[u][i], acc[g][i]);
            }
        }
    }
    // Lanes holding the same dims (different keys) are LPK apart: fold them, then the warps.
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int o = LPK; o < 32; o <<= 1) acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], o);
    __syncthreads(); // every warp is done reading probabilities before sc is reused
    if (sub == 0)
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int i = 0; i < 8; i++) acc_s[warp][g][part * 8 + i] = acc[g][i];
    __syncthreads();
    for (int e = threadIdx.x; e < G * HD; e += DEC_THREADS) {
        int g = e / HD, d = e % HD;
        float v = 0.0f;
        for (int w = 0; w < NW; w++) v += acc_s[w][g][d];
        float *o = out_base + ((size_t)(kvh * G + g) * n_splits + split) * (HD + 2);
        o[d] = v;
        if (d == 0) {
            o[HD] = mx_s[g];
            o[HD + 1] = sum_s[g];
        }
    }
}

// One block per query head: merge the splits (each a max m, a sum l and an unnormalized o).
__global__ void attn_merge_kernel(bf16 *out, const float *partial, int n_splits, int hd) {
    int h = blockIdx.x, d = threadIdx.x;
    pdl_wait();
    pdl_release();
    const float *base = partial + (size_t)h * n_splits * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, base[(size_t)s * (hd + 2) + hd]);
    float L = 0.0f, o = 0.0f;
    for (int s = 0; s < n_splits; s++) {
        const float *p = base + (size_t)s * (hd + 2);
        if (p[hd + 1] == 0.0f) continue; // empty split
        float w = __expf(p[hd] - M);
        L += p[hd + 1] * w;
        o += p[d] * w;
    }
    out[(size_t)h * hd + d] = __float2bfloat16(o / L);
}

extern "C" cudaError_t attn_decode(bf16 *out, const bf16 *q, const bf16 *k_cache, const bf16 *v_cache, const int *d_pos,
                                   int n_heads, int n_kv, int hd, int ctx, float *partial, cudaStream_t st) {
    int G = n_heads / n_kv, S = split_len(ctx, n_kv), n_splits = (ctx + S - 1) / S;
    float scale = rsqrtf((float)hd);
    dim3 grid(n_kv, n_splits);
#define CASE(g, d)                                                                                               \
    if (G == g && hd == d) {                                                                                     \
        CU_TRY(launch_pdl(attn_split_kernel<g, d>, grid, DEC_THREADS, 0, st, partial, q, k_cache, v_cache, d_pos, ctx, S,   \
                          n_splits, scale));                                                                      \
    } else
#define CASES(g) CASE(g, 16) CASE(g, 32) CASE(g, 64) CASE(g, 128) CASE(g, 256)
    CASES(1) CASES(2) CASES(3) CASES(4) CASES(5) CASES(6) CASES(7) CASES(8) return cudaErrorInvalidValue;
#undef CASES
#undef CASE
    return launch_pdl(attn_merge_kernel, n_heads, hd, 0, st, out, partial, n_splits, hd);
}

// ---- simple exact causal attention (reference and fallback for prefill) ----

// One block per (query, head); keys in tiles of blockDim, online softmax across tiles.
__global__ void attn_simple_kernel(bf16 *out, const bf16 *q, const bf16 *k_cache, const bf16 *v_cache, int pos0,
                                   int n_heads, int n_kv, int hd, int ctx, float scale) {
    extern __shared__ float sm[]; // q (hd), p (blockDim)
    float *qs = sm, *ps = sm + hd;
    __shared__ float red[32], stat[2];
    int t = blockIdx.x, h = blockIdx.y, kvh = h / (n_heads / n_kv), n = pos0 + t + 1;
    const bf16 *qr = q + ((size_t)t * n_heads + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = __bfloat162float(qr[i]);
    const bf16 *kb = k_cache + (size_t)kvh * ctx * hd, *vb = v_cache + (size_t)kvh * ctx * hd;
    float m = -INFINITY, l = 0.0f, acc = 0.0f; // thread d < hd owns output dim d
    __syncthreads();
    for (int base = 0; base < n; base += blockDim.x) {
        int k = base + threadIdx.x;
        float s = -INFINITY;
        if (k < n) {
            s = 0.0f;
            for (int i = 0; i < hd; i++) s += qs[i] * __bfloat162float(kb[(size_t)k * hd + i]);
            s *= scale;
        }
        // tile max
        float v = s;
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
        __syncthreads();
        if (threadIdx.x == 0) {
            float mm = red[0];
            for (int w = 1; w < (int)(blockDim.x >> 5); w++) mm = fmaxf(mm, red[w]);
            stat[0] = fmaxf(m, mm);
        }
        __syncthreads();
        float m_new = stat[0];
        float p = k < n ? __expf(s - m_new) : 0.0f;
        ps[threadIdx.x] = p;
        float ps_sum = p;
        for (int o = 16; o > 0; o >>= 1) ps_sum += __shfl_xor_sync(0xffffffffu, ps_sum, o);
        __syncthreads();
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ps_sum;
        __syncthreads();
        float tile_sum = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) tile_sum += red[w];
        float corr = __expf(m - m_new);
        l = l * corr + tile_sum;
        if (threadIdx.x < hd) {
            acc *= corr;
            int kmax = min((int)blockDim.x, n - base);
            for (int j = 0; j < kmax; j++) acc += ps[j] * __bfloat162float(vb[(size_t)(base + j) * hd + threadIdx.x]);
        }
        m = m_new;
        __syncthreads();
    }
    if (threadIdx.x < hd) out[((size_t)t * n_heads + h) * hd + threadIdx.x] = __float2bfloat16(acc / l);
}

extern "C" cudaError_t attn_prefill_simple(bf16 *out, const bf16 *q, const bf16 *k_cache, const bf16 *v_cache, int pos0,
                                           int T, int n_heads, int n_kv, int hd, int ctx, cudaStream_t st) {
    int threads = hd > 128 ? hd : 128;
    dim3 grid(T, n_heads);
    attn_simple_kernel<<<grid, threads, (hd + threads) * sizeof(float), st>>>(out, q, k_cache, v_cache, pos0, n_heads,
                                                                             n_kv, hd, ctx, rsqrtf((float)hd));
    return cudaGetLastError();
}
