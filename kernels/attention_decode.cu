// Decode attention, fused with what comes between the QKV projection and it: per-head
// RMSNorm (Qwen3) and RoPE of q and of the new key, the new K/V row written to the cache, and
// flash decoding over positions 0..pos with the merge done by the last block to finish.
//
// Grid (n_kv, n_splits): block (h, s) handles keys [s*S, (s+1)*S) of KV head h for all G query
// heads of its group, so each K/V row is read once per step. S is chosen from the position at
// run time (the grid is fixed by the device, so a captured graph serves every position), which
// keeps every SM busy at 4K keys as at 1M. Each block writes (o, m, l) for its split, and the
// last block of each KV head merges them. Two forms of the block's work, the same splits and
// merge (finish_split):
// - the tensor-core form (attn_decode_mma_kernel, what the pass runs): a warp takes 16 keys at
//   a time, the scores and the weighted sums by mma.sync, K/V rows by cp.async into the warp's
//   slots of a ring and read by ldmatrix. Its instructions a key do not grow with the group.
// - the FMA form (attn_decode_kernel, kept for the side-by-side tests and benchmark): a "stream"
//   of HD/8 lanes owns one key row at a time (16 bytes a lane) with its own online-softmax
//   state, K/V through each thread's own slots of a cp.async ring; issue-bound at 4 query heads
//   a KV head (3.3-3.4 TB/s at 128K-1M on an H200, where the tensor-core form reads 4.0-4.4).
// Both keep the softmax in the log2 domain and ask for their first K/V before the kernel waits
// on the QKV projection (PDL).
#include <stdint.h>

#include "cuda_common.h"
#include "kernels.h"
#include "variants.h"
#include "pdl.h"

// 8 warps a block: a block's streams share its query and its merge, and at 4K keys a split of
// 128 keys is then 4 tiles a warp instead of 8 (measured on an H200, Llama-3.1-8B's step: 4K
// 4.30 -> 4.19 ms with the merge below, 32K 5.40 -> 5.23; tests/bench/GPU.md, session 30).
#define DEC_THREADS 256
#define DEC_WARPS (DEC_THREADS / 32)
#define DEC_MAX_BLOCKS_PER_SM 8
#ifndef DEC_MIN_SPLIT // (a measurement build may set it)
#define DEC_MIN_SPLIT 128 // measured best of 64 / 128 / 256 at 4K keys
#endif
#define DEC_STAGES 4 // tiles of K/V in each block's ring: 3 in flight while one is used (measured: a ring of
                     // 8 costs a block per SM, and 3 blocks an SM of 8 stages are slower than 4 of 4)
#define DEC_MAX_SPLITS 1024 // a bound on the grid (the partial scratch is sized by it)
#define LOG2E 1.4426950408889634f

static int sm_count(void) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 132;
    return sms;
}

// Blocks per KV head: one wave of as many blocks as fit on every SM (blocks_per_sm, from the
// occupancy of the kernel used), at most ceil(ctx / 32).
static int n_splits_for(int n_kv, int ctx, int blocks_per_sm) {
    int s = (blocks_per_sm * sm_count() + n_kv - 1) / n_kv, most = (ctx + 31) / 32;
    if (s > most) s = most;
    return s < DEC_MAX_SPLITS ? s : DEC_MAX_SPLITS;
}

extern "C" size_t attn_decode_scratch_floats(int n_heads, int n_kv, int hd, int ctx) {
    return (size_t)n_heads * n_splits_for(n_kv, ctx, DEC_MAX_BLOCKS_PER_SM) * (hd + 4);
}

// Keys per split for n keys: a multiple of 32, so the splits in use are all full but the last,
// and at least DEC_MIN_SPLIT, so that a split's fixed costs (its query, its share of the merge)
// stay small against its reads at short contexts.
__device__ __forceinline__ int split_keys(int n, int n_splits) {
    int s = (n + n_splits - 1) / n_splits;
    s = (s + 31) & ~31;
    return s > DEC_MIN_SPLIT ? s : DEC_MIN_SPLIT;
}

// Split `split`'s cached keys [k0, k1) of a step at *d_pos (whose own key, pos, is new), its
// length S, for both forms. The position was copied in before the first kernel of the step, and
// rows < pos of this layer's cache were written by earlier steps: both may be read before
// pdl_wait().
struct SplitKeys {
    int pos, n, S, k0, k1;
};
__device__ __forceinline__ SplitKeys split_keys_of(const int *d_pos, int split, int n_splits) {
    SplitKeys r;
    r.pos = *d_pos, r.n = r.pos + 1;
    r.S = split_keys(r.n, n_splits);
    r.k0 = split * r.S, r.k1 = min(r.k0 + r.S, r.pos);
#ifdef DEC_MUTANT // a planted error that test_kernels must flag (GPU.md, session 30): each split but the last drops its last key
    if (r.k0 + r.S < r.pos) r.k1--;
#endif
    return r;
}

__device__ __forceinline__ void bf16x8_to_f32(uint4 u, float *f) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}

__device__ __forceinline__ uint4 f32x8_to_bf16(const float *f) {
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return u;
}

// cp.async of 16 bytes from global src to shared memory (zeros where !valid): at a shared
// address, or at a generic pointer into shared memory.
__device__ __forceinline__ void cp_async16_at(unsigned dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    cp_async16_at((unsigned)__cvta_generic_to_shared(dst), src, valid);
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__host__ __device__ constexpr int pow2_at_least(int x) { return x <= 1 ? 1 : 2 * pow2_at_least((x + 1) / 2); }

// Sum over the LPK lanes of one stream (a butterfly: every lane gets the sum).
template <int LPK> __device__ __forceinline__ float stream_sum(float v) {
#pragma unroll
    for (int o = LPK / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// 8 consecutive floats from global memory.
__device__ __forceinline__ void load8f(float *f, const float *p) {
    float4 a = *(const float4 *)p, b = *(const float4 *)(p + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

// One head vector (8 elements per lane, part = lane's slot in its stream) from the fp32 QKV
// output: optional RMSNorm over the head (nw: this lane's 8 weights), then rotate-half RoPE
// with this lane's cos/sin (c, s from rope_table()). The partner of element j < HD/2 is
// j + HD/2, held by the lane LPK/2 away.
template <int HD>
__device__ __forceinline__ void head_norm_rope(float *x, const float *src, bool norm, const float *nw, const float *c,
                                               const float *s, int part, float eps) {
    constexpr int LPK = HD / 8;
    load8f(x, src + part * 8);
    if (norm) {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) ss += x[i] * x[i];
        float scale = rsqrtf(stream_sum<LPK>(ss) / (float)HD + eps);
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = nw[i] * (x[i] * scale);
    }
    bool lo = part < LPK / 2;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float other = __shfl_xor_sync(0xffffffffu, x[i], LPK / 2);
        x[i] = lo ? x[i] * c[i] - other * s[i] : x[i] * c[i] + other * s[i];
    }
}

// The new token's row, for both forms: its key (optional k-norm, RoPE) and value from the fp32 QKV
// output (k_src, v_src: KV head kvh's rows), as bf16, stored at pos in the caches (bf16, as
// every later step will read them) by the warp's lanes 0..LPK-1. Every lane of the warp calls it
// (the shuffles inside); part = lane % LPK.
template <int HD>
__device__ __forceinline__ void new_token_row(uint4 &kq, uint4 &vq, const float *k_src, const float *v_src, bool norm,
                                              const float *kn, const float *c, const float *sn, int part, float eps,
                                              bf16 *k_row, bf16 *v_row) {
    float kf[8], vv[8];
    head_norm_rope<HD>(kf, k_src, norm, kn, c, sn, part, eps);
    load8f(vv, v_src + part * 8);
    kq = f32x8_to_bf16(kf), vq = f32x8_to_bf16(vv);
    if ((threadIdx.x & 31) < HD / 8) ((uint4 *)k_row)[part] = kq, ((uint4 *)v_row)[part] = vq;
}

// Online-softmax state of one stream for the G heads of the group.
template <int G> struct StreamState {
    float m[G], l[G], acc[G][8];
};

// Adds U keys to the state: scores s (log2 domain, -inf = no key) and values vr (8 bf16 a lane;
// zero where there is no key, so 0 * v stays 0).
template <int G, int U>
__device__ __forceinline__ void stream_update(StreamState<G> &st, float (&s)[G][U], const uint4 (&vr)[U]) {
#pragma unroll
    for (int g = 0; g < G; g++) {
        float mt = s[g][0];
#pragma unroll
        for (int u = 1; u < U; u++) mt = fmaxf(mt, s[g][u]);
        float m_new = fmaxf(st.m[g], mt);
        if (m_new == -INFINITY) { // nothing seen yet: no weight for these (zero) values
#pragma unroll
            for (int u = 0; u < U; u++) s[g][u] = 0.0f;
            continue;
        }
        float corr = exp2f(st.m[g] - m_new); // 0 when m was -inf
        st.m[g] = m_new;
        st.l[g] *= corr;
#pragma unroll
        for (int i = 0; i < 8; i++) st.acc[g][i] *= corr;
#pragma unroll
        for (int u = 0; u < U; u++) s[g][u] = exp2f(s[g][u] - m_new), st.l[g] += s[g][u];
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        float v[8];
        bf16x8_to_f32(vr[u], v);
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int i = 0; i < 8; i++) st.acc[g][i] = fmaf(s[g][u], v[i], st.acc[g][i]);
    }
}

// Scores of U keys (8 bf16 a lane) for the G heads, reduced over the stream; -inf where k >= k1.
template <int G, int U, int LPK>
__device__ __forceinline__ void stream_scores(float (&s)[G][U], const float (&q)[G][8], const uint4 (&kr)[U],
                                              const bool (&ok)[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        float k[8];
        bf16x8_to_f32(kr[u], k);
#pragma unroll
        for (int g = 0; g < G; g++) {
            float d = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) d = fmaf(q[g][i], k[i], d);
            d = stream_sum<LPK>(d);
            s[g][u] = ok[u] ? d : -INFINITY;
        }
    }
}

// The last block of KV head kvh merges its splits' partials (pbase: [G][n_splits][HD + 4]; the
// first `used` of them hold keys) into out; smem_f: 2 G n_splits floats of the block's shared
// memory; REGS: the kernel's register cap (its launch bounds).
template <int G, int HD, int REGS>
__device__ __forceinline__ void merge_splits(bf16 *out, const float *pbase, float *smem_f, int kvh, int n_splits, int used) {
    constexpr int PSTRIDE = HD + 4;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // The merge is on the step's critical path, so what counts is its dependent L2 round trips:
    // each thread asks for its EPT outputs of the first MB splits before anything else, and the
    // heads' (m, l) go to shared memory beside them; the splits' weights against the head's
    // maximum come next (a warp a head), then each output sums its splits in order.
    constexpr int EPT = pow2_at_least((G * HD + DEC_THREADS - 1) / DEC_THREADS);
    constexpr int MB = EPT * 34 <= REGS - 56 ? 34 : (REGS - 56) / EPT;
    float *wts = smem_f, *lsum = wts + G * n_splits; // [G][n_splits] each: m, then weights; l
    __shared__ float inv_l[G];
    int e0 = threadIdx.x * EPT, g = e0 / HD, d0 = e0 % HD;
    bool mine = e0 < G * HD;
    const float *pv = pbase + ((size_t)(mine ? g : 0) * n_splits) * PSTRIDE + d0;
    float v[MB][EPT];
    auto load_values = [&](int s0) {
#pragma unroll
        for (int j = 0; j < MB; j++) {
            bool ok = mine && s0 + j < used;
            const float *p = pv + (size_t)(s0 + j) * PSTRIDE;
            if (EPT % 4 == 0) {
#pragma unroll
                for (int k = 0; k < EPT; k += 4) {
                    float4 f = ok ? __ldcg((const float4 *)(p + k)) : make_float4(0, 0, 0, 0);
                    v[j][k] = f.x, v[j][k + 1] = f.y, v[j][k + 2] = f.z, v[j][k + 3] = f.w;
                }
            } else if (EPT == 2) {
                float2 f = ok ? __ldcg((const float2 *)p) : make_float2(0, 0);
                v[j][0] = f.x, v[j][1] = f.y;
            } else {
                v[j][0] = ok ? __ldcg(p) : 0.0f;
            }
        }
    };
    load_values(0);
    for (int gg = warp; gg < G; gg += DEC_WARPS) {
        const float *ph = pbase + (size_t)gg * n_splits * PSTRIDE + HD;
        float M = -INFINITY;
#pragma unroll 4
        for (int s = lane; s < used; s += 32) {
            float2 ml = __ldcg((const float2 *)(ph + (size_t)s * PSTRIDE));
            wts[gg * n_splits + s] = ml.x, lsum[gg * n_splits + s] = ml.y;
            M = fmaxf(M, ml.x);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float L = 0.0f; // the key at pos is always seen, so M is finite and L > 0
        for (int s = lane; s < used; s += 32) {
            float m = wts[gg * n_splits + s], w = m == -INFINITY ? 0.0f : exp2f(m - M); // a split with no keys weighs 0
            L += w * lsum[gg * n_splits + s];
            wts[gg * n_splits + s] = w;
        }
        L = warp_sum(L);
        if (lane == 0) inv_l[gg] = 1.0f / L;
    }
    __syncthreads();
    if (mine) {
        float o[EPT];
#pragma unroll
        for (int k = 0; k < EPT; k++) o[k] = 0.0f;
        const float *wg = wts + g * n_splits;
        for (int s0 = 0; s0 < used; s0 += MB) {
            if (s0 > 0) load_values(s0);
#pragma unroll
            for (int j = 0; j < MB; j++) {
                float w = s0 + j < used ? wg[s0 + j] : 0.0f;
#pragma unroll
                for (int k = 0; k < EPT; k++) o[k] = fmaf(w, v[j][k], o[k]);
            }
        }
#pragma unroll
        for (int k = 0; k < EPT; k++) out[(size_t)(kvh * G + g) * HD + d0 + k] = __float2bfloat16(o[k] * inv_l[g]);
    }
}

// The end of both forms: the block's P parts (m[P][G], l[P][G], unnormalized o[P][G][HD] in
// shared memory, written before a barrier) combined into its split's partial in partial
// ([n_kv][G][n_splits][HD + 4]: o, m, l); the last block of KV head kvh to get here merges every
// split (merge_splits; smem_f its scratch). The barrier orders every thread's partial stores
// before thread 0's fence and count (a cumulative release).
template <int G, int HD, int P, int REGS>
__device__ __forceinline__ void finish_split(bf16 *out, float *__restrict__ partial, unsigned *counters,
                                             const float (&pm)[P][G], const float (&pl)[P][G],
                                             const float *__restrict__ po, float *smem_f, int kvh, int split, int n_splits,
                                             int used) {
    constexpr int PSTRIDE = HD + 4;
    __shared__ int is_last;
    float *pbase = partial + (size_t)kvh * G * n_splits * PSTRIDE;
    for (int e = threadIdx.x; e < G * HD; e += DEC_THREADS) {
        int h = e / HD, d = e % HD;
        float M = -INFINITY;
        for (int q = 0; q < P; q++) M = fmaxf(M, pm[q][h]);
        float L = 0.0f, o = 0.0f;
        if (M != -INFINITY)
            for (int q = 0; q < P; q++) {
                float x = exp2f(pm[q][h] - M); // 0 for a part that saw no key
                L += pl[q][h] * x;
                o += po[(q * G + h) * HD + d] * x;
            }
        float *p = pbase + ((size_t)h * n_splits + split) * PSTRIDE;
        p[d] = o;
        if (d == 0) p[HD] = M, p[HD + 1] = L;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        is_last = atomicAdd(&counters[kvh], 1u) == (unsigned)n_splits - 1;
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    merge_splits<G, HD, REGS>(out, pbase, smem_f, kvh, n_splits, used);
    if (threadIdx.x == 0) counters[kvh] = 0; // ready for the next step
}

// ---- the tensor-core form (groups of up to 8 query heads): a warp takes 16 keys at a time by mma.sync ----
//
// Scores as S^T = K Q^T (m16n8k16; m: 16 keys, n: the group's heads padded to 8, k: head dims)
// and the output as O^T += V^T P^T (m16n8k8 twice; m: 16 head dims, n: heads, k: 8 keys), so
// that the group's heads fill the n side and no fragment holds padding rows of K or V. Lane
// l = 4 g + t holds, by ldmatrix from the warp's units in shared memory:
//   K rows g and g+8 of the tile: its word c is dims 8c + 2t, 8c + 2t + 1 of the row, the A
//     fragment's register for k-step c / 2 (c even: k slots 2t, 2t+1; odd: 2t+8, 2t+9); q's B
//     fragment is gathered the same way.
//   V^T: word c of a V unit (ldmatrix .trans) holds dim 8c + g of keys 2t and 2t + 1, the A
//     fragment's register for m-tile c / 2 (c even: rows g; odd: g + 8).
//   P^T from S^T's accumulator: each 8 x 8 half, packed to bf16, transposed by movmatrix, is the
//     B fragment of the PV product over its 8 keys.
// A tile comes in four units of 8 rows (2 KB at HD 128, contiguous in the cache): the K rows
// of keys 0-7, of keys 8-15, then the V rows of each. A unit is copied by the warp's lanes in
// 16-byte chunks, each cp.async of the warp two whole rows (whole 128-byte lines, as the FMA
// form reads them), into the warp's slot of a ring of MMA_UNITS (MMA_UNITS - 1 in flight: 64
// KB a block at HD 128, as the FMA form's ring; a ring of 6, 96 KB, was slower in the step at
// 4K: the SM's shared-memory carveout grows for it). Chunk c of row r sits at chunk c ^ (r & 7)
// of its row, so that ldmatrix's 8 row addresses of one chunk meet 8 different banks. Each
// lane's copies land for that lane only (cp.async.wait_group), so the warp meets at a
// __syncwarp() before reading a unit, and again before a slot is copied into anew.
// Session 30's form gave each lane its own fragment words by cp.async (no ldmatrix): its copies
// read 64 bytes of each of 8 rows (K) or 128 of 4 (V), and it took 1.5x the L2 sectors and
// 2.8x the shared-memory wavefronts of the FMA form (Nsight Compute, 32/8 heads at 128K):
// L2-bound (87% busy) at 2.7 TB/s (tests/bench/GPU.md, session 31). With whole rows and
// ldmatrix, one layer of 32/8 heads at 128K takes 135 us instead of 199 (4.0 TB/s; 1M: 4.38),
// and the form is faster than the FMA form at every shape measured (4K to 1M, 3 to 8 query
// heads a KV head; level at 1 and 2 from 32K), so the pass takes it at every group size.
#define MMA_UNITS 4

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
}
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// Byte offset of row r's 16-byte chunk c in a unit of 8 rows of HD bf16: the chunks of a row
// are XOR-permuted by the row's low bits, so that one chunk of the 8 rows (an ldmatrix
// matrix) falls in 8 different 16-byte bank groups (rows of 32 and 64 bytes: 2 and 4).
template <int HD> __device__ __forceinline__ unsigned unit_chunk(int r, int c) {
    constexpr int NC = HD / 8, SW = (NC < 8 ? NC : 8) - 1;
    return (unsigned)(r * HD * 2 + ((c ^ (r & SW)) * 16));
}

// A warp's online-softmax state: heads 2t and 2t+1 (the lane's n columns); l is this lane's
// share (its keys g, g+8), summed over the 8 lanes of a column at the end; o: O^T's fragments.
template <int HD> struct MmaState {
    float m[2], l[2], o[HD / 16][4];
};

__device__ __forceinline__ void mma_bf16_1688(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

// A tile's scores: ka, kb = this lane's K words of rows g and g + 8 (its chunk of each row),
// qw = Q^T's B fragment words.
template <int HD>
__device__ __forceinline__ void tile_scores(float (&s)[4], const uint32_t (&ka)[HD / 8], const uint32_t (&kb)[HD / 8], const uint32_t (&qw)[HD / 8]) {
#pragma unroll
    for (int j = 0; j < HD / 16; j++) mma_bf16_16816(s, ka[2 * j], kb[2 * j], ka[2 * j + 1], kb[2 * j + 1], qw[2 * j], qw[2 * j + 1]);
}

// The tile's scores s (keys from nvalid on masked) into the state's maxima and sums, the output
// rescaled; returns P^T's B fragments (keys 0-7, 8-15) for tile_pv.
template <int HD>
__device__ __forceinline__ void tile_softmax(MmaState<HD> &st, float (&s)[4], int nvalid, int g, uint32_t &b0, uint32_t &b1) {
    if (g >= nvalid) s[0] = s[1] = -INFINITY;
    if (g + 8 >= nvalid) s[2] = s[3] = -INFINITY;
    float corr[2], p[4];
#pragma unroll
    for (int c = 0; c < 2; c++) { // head 2t + c: keys g (s[c]) and g + 8 (s[c + 2])
        float mt = fmaxf(s[c], s[c + 2]);
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 4));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 8));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 16));
        float mn = fmaxf(st.m[c], mt), base = mn == -INFINITY ? 0.0f : mn; // no key yet: every weight 0
        corr[c] = exp2f(st.m[c] - base);
        st.m[c] = mn;
        p[c] = exp2f(s[c] - base), p[c + 2] = exp2f(s[c + 2] - base);
    }
    uint32_t pk0 = pack_bf16(p[0], p[1]), pk1 = pack_bf16(p[2], p[3]); // P rows g, g + 8; heads 2t, 2t+1
    // l sums the weights as the tensor cores take them (bf16), so out = sum p v / sum p exactly.
    st.l[0] = st.l[0] * corr[0] + bf16_lo(pk0) + bf16_lo(pk1);
    st.l[1] = st.l[1] * corr[1] + bf16_hi(pk0) + bf16_hi(pk1);
    if (!__all_sync(0xffffffffu, corr[0] == 1.0f && corr[1] == 1.0f))
#pragma unroll
        for (int i = 0; i < HD / 16; i++) st.o[i][0] *= corr[0], st.o[i][1] *= corr[1], st.o[i][2] *= corr[0], st.o[i][3] *= corr[1];
    b0 = movmatrix_trans(pk0), b1 = movmatrix_trans(pk1);
}

// O^T += V^T P^T over 8 of the tile's keys: vw = this lane's V^T words of those keys (word c:
// dim 8c + g of keys 2t, 2t + 1), b = P^T's B fragment of the same keys.
template <int HD> __device__ __forceinline__ void tile_pv(MmaState<HD> &st, const uint32_t (&vw)[HD / 8], uint32_t b) {
#pragma unroll
    for (int i = 0; i < HD / 16; i++) mma_bf16_1688(st.o[i], vw[2 * i], vw[2 * i + 1], b);
}

template <int G, int HD>
__global__ void __launch_bounds__(DEC_THREADS, HD <= 128 ? 2 : 1) attn_decode_mma_kernel(bf16 *out, float *partial, unsigned *counters,
                                                                      const float *qkv, const float *q_norm,
                                                                      const float *k_norm, const float *rope_cs,
                                                                      bf16 *k_cache, bf16 *v_cache, const int *d_pos,
                                                                      int n_kv, int ctx, float eps) {
    static_assert(G <= 8 && HD % 16 == 0 && HD <= 256, "G, HD");
    constexpr int LPK = HD / 8;     // lanes per head vector when q is made (8 elements a lane)
    constexpr int TK = 16;          // keys a warp-tile
    constexpr int NC = HD / 8;      // 16-byte chunks a row
    constexpr int UNIT = 8 * HD * 2; // bytes a unit: 8 rows
    extern __shared__ uint4 smem[]; // [MMA_UNITS][DEC_WARPS] units of UNIT bytes; later the warps' outputs
    __shared__ __align__(16) float qs[G][HD]; // the group's queries, scaled to the log2 domain
    __shared__ __align__(16) bf16 new_kv[2][HD];
    __shared__ __align__(16) float w_m[DEC_WARPS][G], w_l[DEC_WARPS][G];
    int kvh = blockIdx.x, split = blockIdx.y, n_splits = gridDim.y;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const SplitKeys sk = split_keys_of(d_pos, split, n_splits);
    const int pos = sk.pos, n = sk.n, S = sk.S, k0 = sk.k0, k1 = sk.k1; // cached keys [k0, k1); key pos is new
    int n_tiles = k0 < k1 ? (k1 - k0 + TK - 1) / TK : 0;
    int my_tiles = warp < n_tiles ? (n_tiles - warp + DEC_WARPS - 1) / DEC_WARPS : 0; // tiles warp, warp + W, ...
    const bf16 *kb = k_cache + (size_t)kvh * ctx * HD, *vb = v_cache + (size_t)kvh * ctx * HD;
    const unsigned ring = (unsigned)__cvta_generic_to_shared(smem) + (unsigned)warp * UNIT;
    auto slot = [&](int u) { return ring + (unsigned)((u % MMA_UNITS) * DEC_WARPS * UNIT); };
    // Unit q of a tile: the rows of keys 8 (q & 1) .. 8 (q & 1) + 7 of K (q < 2) or V. The warp's
    // copy j takes the unit's chunks 32 j .. 32 j + 31 (rows in order, whole rows per copy).
    auto issue = [&](int u) {
        int i = u >> 2, q = u & 3;
        if (i < my_tiles) {
            int key0 = k0 + (warp + DEC_WARPS * i) * TK + 8 * (q & 1);
            const bf16 *base = q < 2 ? kb : vb;
#pragma unroll
            for (int j = 0; j < (8 * NC + 31) / 32; j++) {
                int e = 32 * j + lane, r = e / NC, c = e % NC, k = key0 + r;
                bool ok = k < k1;
                if (8 * NC % 32 == 0 || e < 8 * NC)
                    cp_async16_at(slot(u) + unit_chunk<HD>(r, c), base + (size_t)(ok ? k : k0) * HD + 8 * c, ok);
            }
        }
        cp_async_commit(); // an empty group past the end keeps the group count uniform
    };
    // This lane's words of unit u (its copies landed and the warp met after them): K (word c:
    // row g's dims 8c + 2t, 8c + 2t + 1) or V transposed (word c: dim 8c + g of rows 2t, 2t + 1).
    // Lane l gives the address of row l & 7 in matrix l >> 3, chunk 4 m + (l >> 3) of copy m.
    auto read_unit = [&](int u, uint32_t (&w)[NC], bool trans) {
        unsigned a = slot(u);
        if constexpr (NC >= 4) {
#pragma unroll
            for (int m = 0; m < NC / 4; m++) {
                uint32_t r[4];
                unsigned addr = a + unit_chunk<HD>(lane & 7, 4 * m + (lane >> 3));
                if (trans) ldmatrix_x4_trans(r, addr);
                else ldmatrix_x4(r, addr);
#pragma unroll
                for (int x = 0; x < 4; x++) w[4 * m + x] = r[x];
            }
        } else {
            uint32_t r[2];
            unsigned addr = a + unit_chunk<HD>(lane & 7, (lane >> 3) & 1);
            if (trans) ldmatrix_x2_trans(r, addr);
            else ldmatrix_x2(r, addr);
            w[0] = r[0], w[1] = r[1];
        }
    };
    pdl_release(); // the next kernel may start filling SMs as this one's blocks finish
#pragma unroll
    for (int u = 0; u < MMA_UNITS - 1; u++) issue(u);
    // The queries: thread (head h, part) makes 8 elements of head h (QK-norm, RoPE), as below.
    int hq = threadIdx.x / LPK, part = threadIdx.x % LPK;
    float qn[8], kn[8], c[8], sn[8]; // this lane's QK-norm weights (read-only: before the wait)
    if (q_norm) load8f(qn, q_norm + part * 8), load8f(kn, k_norm + part * 8);
    pdl_wait();
    int j0 = (part * 8) % (HD / 2); // this lane's 8 RoPE frequencies
    load8f(c, rope_cs + j0), load8f(sn, rope_cs + HD / 2 + j0);
    const float scale = rsqrtf((float)HD) * LOG2E; // scores in the log2 domain
    if (warp * 32 < G * LPK) { // whole warps (the shuffles inside); lanes past the group repeat its last head
        float q[8];
        head_norm_rope<HD>(q, qkv + (size_t)(kvh * G + min(hq, G - 1)) * HD, q_norm != NULL, qn, c, sn, part, eps);
        if (hq < G)
#pragma unroll
            for (int i = 0; i < 8; i++) qs[hq][part * 8 + i] = q[i] * scale;
    }
    __syncthreads();
    uint32_t qw[NC]; // Q^T's B fragments: word c = head g's dims 8c + 2t, 8c + 2t + 1 (0 past the group)
#pragma unroll
    for (int i = 0; i < NC; i++) qw[i] = g < G ? pack_bf16(qs[g][8 * i + 2 * t], qs[g][8 * i + 2 * t + 1]) : 0u;
    MmaState<HD> st;
    st.m[0] = st.m[1] = -INFINITY, st.l[0] = st.l[1] = 0.0f;
#pragma unroll
    for (int i = 0; i < HD / 16; i++) st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.0f;
    // Unit u + MMA_UNITS - 1 goes into the slot of unit u - 1, which every lane has read by then.
    for (int i = 0; i < my_tiles; i++) {
        uint32_t ka[NC], w[NC], b[2];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            __syncwarp(); // every lane's reads of the slot refilled next are done
            issue(4 * i + q + MMA_UNITS - 1);
            cp_async_wait<MMA_UNITS - 1>(); // this lane's copies of unit 4 i + q have landed
            __syncwarp();                   // and every other lane's
            if (q == 0) {
                read_unit(4 * i, ka, false);
                continue;
            }
            read_unit(4 * i + q, w, q >= 2);
            if (q == 1) {
                float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                tile_scores<HD>(s, ka, w, qw);
                tile_softmax<HD>(st, s, k1 - (k0 + (warp + DEC_WARPS * i) * TK), g, b[0], b[1]);
            } else {
                tile_pv<HD>(st, w, b[q - 2]);
            }
        }
    }
    cp_async_wait<0>();
    // The new token: warp 0 of the block whose split holds pos normalizes and rotates its key,
    // stores it and its value in the caches (bf16, as every later step will read them), and
    // takes it as a tile of one key.
    if (k0 <= pos && pos < k0 + S && warp == 0) {
        { // every lane (the shuffles inside); lanes past LPK repeat the first LPK
            uint4 kq, vq;
            new_token_row<HD>(kq, vq, qkv + (size_t)(n_kv * G + kvh) * HD, qkv + (size_t)(n_kv * G + n_kv + kvh) * HD,
                              q_norm != NULL, kn, c, sn, part, eps, k_cache + ((size_t)kvh * ctx + pos) * HD,
                              v_cache + ((size_t)kvh * ctx + pos) * HD);
            if (lane < LPK) ((uint4 *)new_kv[0])[lane] = kq, ((uint4 *)new_kv[1])[lane] = vq;
        }
        __syncwarp();
        // A tile whose key 0 is the new key (row g = 0 of K, key 2t = 0 of V^T); the rest zeros.
        const uint32_t *nk = (const uint32_t *)new_kv[0];
        const uint16_t *nv = (const uint16_t *)new_kv[1];
        uint32_t ka[NC], w[NC], b[2];
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < NC; i++) ka[i] = g == 0 ? nk[4 * i + t] : 0u, w[i] = 0u;
        tile_scores<HD>(s, ka, w, qw);
        tile_softmax<HD>(st, s, 1, g, b[0], b[1]);
#pragma unroll
        for (int i = 0; i < NC; i++) w[i] = t == 0 ? (uint32_t)nv[8 * i + g] : 0u;
        tile_pv<HD>(st, w, b[0]);
    }
    // The warp's state per head: l summed over the lanes of a column; the ring's memory becomes
    // the warps' outputs [warp][G][HD].
#pragma unroll
    for (int e = 0; e < 2; e++) {
        float l = st.l[e];
        l += __shfl_xor_sync(0xffffffffu, l, 4);
        l += __shfl_xor_sync(0xffffffffu, l, 8);
        l += __shfl_xor_sync(0xffffffffu, l, 16);
        st.l[e] = l;
    }
    __syncthreads();
    float *w_o = (float *)smem;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        int h = 2 * t + e;
        if (h < G) {
            if (g == 0) w_m[warp][h] = st.m[e], w_l[warp][h] = st.l[e];
#pragma unroll
            for (int i = 0; i < HD / 16; i++) // O^T rows 16 i + g and 16 i + g + 8
                w_o[(warp * G + h) * HD + 16 * i + g] = st.o[i][e], w_o[(warp * G + h) * HD + 16 * i + g + 8] = st.o[i][2 + e];
        }
    }
    __syncthreads();
    finish_split<G, HD, DEC_WARPS, HD <= 128 ? 128 : 255>(out, partial, counters, w_m, w_l, w_o, (float *)smem, kvh, split,
                                                          n_splits, (n + S - 1) / S);
}

// Registers are capped so that 2 blocks fit on an SM (1 for groups of more than 4 heads, whose
// state is twice as large): the K/V bytes in flight per SM are what the speed depends on.
template <int G, int HD>
__global__ void __launch_bounds__(DEC_THREADS, G <= 4 ? 2 : 1) attn_decode_kernel(bf16 *out, float *partial, unsigned *counters,
                                                                  const float *qkv, const float *q_norm,
                                                                  const float *k_norm, const float *rope_cs,
                                                                  bf16 *k_cache, bf16 *v_cache, const int *d_pos,
                                                                  int n_kv, int ctx, float eps) {
    constexpr int LPK = HD / 8;             // lanes per key row
    constexpr int SPW = 32 / LPK;           // streams per warp
    constexpr int NS = DEC_WARPS * SPW;     // streams per block
    constexpr int U = 2;                    // rows per stream per tile
    constexpr int TILE = NS * U;            // keys per block iteration (8 KB of K and V)
    // Each thread's K/V chunks land in its own slots of a DEC_STAGES-deep ring (cp.async), so a
    // thread needs no barrier to read them and DEC_STAGES - 1 tiles are always in flight. The
    // ring and the streams' outputs are never live together: they share the memory.
    extern __shared__ uint4 smem[]; // dec_smem(): the larger of the ring and the streams' outputs
    __shared__ __align__(16) float st_m[NS][G], st_l[NS][G];
    uint4(*ring)[2 * U][DEC_THREADS] = (uint4(*)[2 * U][DEC_THREADS])smem; // [stage][K rows, V rows][thread]
    float(*st_o)[G][HD] = (float(*)[G][HD])smem;
    int kvh = blockIdx.x, split = blockIdx.y, n_splits = gridDim.y;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane / LPK, part = lane % LPK;
    int stream = warp * SPW + sub;
    const SplitKeys sk = split_keys_of(d_pos, split, n_splits);
    const int pos = sk.pos, n = sk.n, S = sk.S, k0 = sk.k0, k1 = sk.k1; // cached keys [k0, k1); key pos is new
    int n_tiles = k0 < k1 ? (k1 - k0 + TILE - 1) / TILE : 0;
    const bf16 *kb = k_cache + (size_t)kvh * ctx * HD, *vb = v_cache + (size_t)kvh * ctx * HD;
    // Key of row u of tile t: each warp covers SPW*U consecutive rows.
    auto key_of = [&](int t, int u) { return k0 + t * TILE + warp * SPW * U + u * SPW + sub; };
    auto issue = [&](int t) { // tile t into its ring stage; rows past k1 are zero-filled
        if (t < n_tiles) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                int k = key_of(t, u), kc = k < k1 ? k : k0;
                cp_async16(&ring[t % DEC_STAGES][u][threadIdx.x], (const uint4 *)(kb + (size_t)kc * HD) + part, k < k1);
                cp_async16(&ring[t % DEC_STAGES][U + u][threadIdx.x], (const uint4 *)(vb + (size_t)kc * HD) + part, k < k1);
            }
        }
        cp_async_commit(); // an empty group past the end keeps the group count uniform
    };
    pdl_release(); // the next kernel may start filling SMs as this one's blocks finish
#pragma unroll
    for (int t = 0; t < DEC_STAGES - 1; t++) issue(t);
    float qn[8], kn[8], c[8], sn[8]; // this lane's QK-norm weights (read-only: before the wait)
    if (q_norm) load8f(qn, q_norm + part * 8), load8f(kn, k_norm + part * 8);
    pdl_wait();
    int j0 = (part * 8) % (HD / 2); // this lane's 8 RoPE frequencies
    load8f(c, rope_cs + j0), load8f(sn, rope_cs + HD / 2 + j0);

    const float scale = rsqrtf((float)HD) * LOG2E; // scores in the log2 domain
    float q[G][8];
#pragma unroll
    for (int g = 0; g < G; g++) {
        int h = kvh * G + g;
        head_norm_rope<HD>(q[g], qkv + (size_t)h * HD, q_norm != NULL, qn, c, sn, part, eps);
#pragma unroll
        for (int i = 0; i < 8; i++) q[g][i] *= scale;
    }
    StreamState<G> st;
#pragma unroll
    for (int g = 0; g < G; g++) {
        st.m[g] = -INFINITY, st.l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) st.acc[g][i] = 0.0f;
    }
    for (int t = 0; t < n_tiles; t++) {
        issue(t + DEC_STAGES - 1);
        cp_async_wait<DEC_STAGES - 1>(); // this thread's copies of tile t have landed
        uint4 kr[U], vr[U];
        float s[G][U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            kr[u] = ring[t % DEC_STAGES][u][threadIdx.x], vr[u] = ring[t % DEC_STAGES][U + u][threadIdx.x];
            ok[u] = key_of(t, u) < k1;
        }
        stream_scores<G, U, LPK>(s, q, kr, ok);
        stream_update<G, U>(st, s, vr);
    }
    cp_async_wait<0>();
    __syncthreads(); // the ring's memory becomes the streams' outputs
    // The new token: warp 0 of the block whose split holds pos makes its row, stores it in the
    // caches, and scores it (stream 0's lanes: the others repeat them).
    if (k0 <= pos && pos < k0 + S && warp == 0) {
        uint4 kq[1], vq[1];
        new_token_row<HD>(kq[0], vq[0], qkv + (size_t)(n_kv * G + kvh) * HD, qkv + (size_t)(n_kv * G + n_kv + kvh) * HD,
                          q_norm != NULL, kn, c, sn, part, eps, k_cache + ((size_t)kvh * ctx + pos) * HD,
                          v_cache + ((size_t)kvh * ctx + pos) * HD);
        float s[G][1];
        bool ok[1] = {sub == 0};
        stream_scores<G, 1, LPK>(s, q, kq, ok);
        stream_update<G, 1>(st, s, vq);
    }
    // Combine the block's streams.
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (part == 0) st_m[stream][g] = st.m[g], st_l[stream][g] = st.l[g];
#pragma unroll
        for (int i = 0; i < 8; i++) st_o[stream][g][part * 8 + i] = st.acc[g][i];
    }
    __syncthreads();
    finish_split<G, HD, NS, G <= 4 ? 128 : 255>(out, partial, counters, st_m, st_l, &st_o[0][0][0], (float *)smem, kvh, split,
                                                 n_splits, (n + S - 1) / S);
}



// Shared memory a block takes: the ring of K/V tiles, which the streams' outputs later reuse.
template <int G, int HD> static constexpr int dec_smem(void) {
    constexpr int ring = DEC_STAGES * 4 * DEC_THREADS * 16, outs = DEC_WARPS * (32 / (HD / 8)) * G * HD * 4;
    return ring > outs ? ring : outs;
}



typedef void (*DecKernel)(bf16 *, float *, unsigned *, const float *, const float *, const float *, const float *, bf16 *, bf16 *,
                          const int *, int, int, float);

// variant: ATTN_DECODE_FMA or ATTN_DECODE_MMA (variants.h); AUTO: MMA.
template <int G, int HD>
static cudaError_t launch_decode(bf16 *out, const float *qkv, const float *q_norm, const float *k_norm,
                                 const float *rope_cs, bf16 *k_cache, bf16 *v_cache, const int *d_pos, int n_kv, int ctx,
                                 float eps, float *partial, unsigned *counters, int variant, cudaStream_t st) {
    bool mma = variant != ATTN_DECODE_FMA;
    DecKernel k = mma ? (DecKernel)attn_decode_mma_kernel<G, HD> : (DecKernel)attn_decode_kernel<G, HD>;
    int smem = mma ? MMA_UNITS * DEC_WARPS * 16 * HD : dec_smem<G, HD>(); // mma: units of 8 rows
    CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0;
    CU_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, DEC_THREADS, smem));
    per_sm = per_sm < 1 ? 1 : per_sm > DEC_MAX_BLOCKS_PER_SM ? DEC_MAX_BLOCKS_PER_SM : per_sm;
    dim3 grid(n_kv, n_splits_for(n_kv, ctx, per_sm));
    if ((size_t)2 * G * grid.y * sizeof(float) > (size_t)smem) return cudaErrorInvalidValue; // the merge's (m, l)
    return launch_pdl(k, grid, DEC_THREADS, smem, st, out, partial, counters, qkv, q_norm, k_norm,
                      rope_cs, k_cache, v_cache, d_pos, n_kv, ctx, eps);
}

extern "C" cudaError_t attn_decode_variant(bf16 *out, const float *qkv, const float *q_norm, const float *k_norm,
                                           const float *rope_cs, bf16 *k_cache, bf16 *v_cache, const int *d_pos, int n_heads,
                                           int n_kv, int hd, int ctx, float eps, float *partial, unsigned *counters,
                                           int variant, cudaStream_t st) {
    int G = n_heads / n_kv;
#define CASE(g, d)                                                                                              \
    if (G == g && hd == d)                                                                                      \
        return launch_decode<g, d>(out, qkv, q_norm, k_norm, rope_cs, k_cache, v_cache, d_pos, n_kv, ctx, eps, partial, \
                                   counters, variant, st);
#define CASES(g) CASE(g, 16) CASE(g, 32) CASE(g, 64) CASE(g, 128) CASE(g, 256)
    CASES(1) CASES(2) CASES(3) CASES(4) CASES(5) CASES(6) CASES(7) CASES(8)
#undef CASES
#undef CASE
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t attn_decode(bf16 *out, const float *qkv, const float *q_norm, const float *k_norm,
                                   const float *rope_cs, bf16 *k_cache, bf16 *v_cache, const int *d_pos, int n_heads,
                                   int n_kv, int hd, int ctx, float eps, float *partial, unsigned *counters,
                                   cudaStream_t st) {
    return attn_decode_variant(out, qkv, q_norm, k_norm, rope_cs, k_cache, v_cache, d_pos, n_heads, n_kv, hd, ctx, eps,
                               partial, counters, ATTN_DECODE_AUTO, st);
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
