// ParisKV decode attention (pariskv_attend.h): the QKV post-processing that also writes the new
// row through to the host store, and exact attention over the selected rows.
//
// pkv_attend: grid (n_kv, splits). A KV head's rows form two lists, sink + window (GPU memory,
// attended before the kernel waits for the selection: PDL overlaps it with the top-k) and the
// selected zone slots; split s takes rows s, s + splits, ... of each. Inside a block a "stream" of HD/8 lanes owns
// one row at a time (16 bytes of K and of V a lane) and keeps its own online softmax for the G
// query heads of the group (log2 domain), so each row is read once per step for the whole group.
// Zone rows come from the host store through UVA: each stream issues U rows' loads before using
// any, so that enough PCIe reads are in flight to cover their latency (~1-2 us). Streams are
// combined in shared memory, each block writes (o, m, l), and the last block of a head merges.
// With the row cache (pkv_attend_rc), each block first resolves which selected slots hit, which miss
// writes its line, in shared memory: a table of the head's lines, or a hash of the step's lines
// where the cache has more than PKV_RC_DIRECT_MAX (pariskv_attend.h has the rule).
#include "cuda_common.h"
#include "pariskv_attend.h"
#include "pdl.h"
#include "../offload/fp8.h"

#define PA_THREADS 128
#define PA_WARPS (PA_THREADS / 32)
#define PA_MAX_SPLITS 64
#define PA_U 8 // rows per stream in flight

// Streams of a block: a stream is hd / 8 lanes, 16 bytes of a row's K and of its V a lane.
__host__ __device__ constexpr int pa_streams(int hd) { return PA_WARPS * (32 / (hd / 8)); }
#define LOG2E 1.4426950408889634f

static int sm_count(void) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 132;
    return sms;
}

// One block an SM: a split then holds enough rows (~50 at k = 100) to keep a few dozen host
// reads in flight, and the merge stays short. Where a split's top-k rows would take a stream more
// than one batch of PA_U (k = 2048: 120 rows a split, two batches, the second issued only once the
// first has arrived), more splits, up to two blocks an SM, so that one batch holds them all.
extern "C" int pkv_attend_splits(int n_kv, int hd, int kmax) {
    int s = (sm_count() + n_kv - 1) / n_kv;
    s = s < 4 ? 4 : s > PA_MAX_SPLITS / 2 ? PA_MAX_SPLITS / 2 : s;
    const int batch = pa_streams(hd) * PA_U; // rows a block has in flight
    if (kmax > s * batch) {
        int want = (kmax + batch - 1) / batch;
        s = want < 2 * s ? want : 2 * s;
    }
    return s;
}

extern "C" size_t pkv_attend_scratch_floats(int n_heads, int n_kv, int hd, int kmax) {
    return (size_t)n_heads * pkv_attend_splits(n_kv, hd, kmax) * (hd + 4);
}

__device__ __forceinline__ int dev_slot(const GpuKV &kv, int p) {
    return p < kv.sink ? p : kv.sink + (p - kv.sink) % (kv.dcap - kv.sink);
}

__device__ __forceinline__ size_t cache_off(const GpuKV &kv, int layer, int h, int p) {
    return (((size_t)layer * kv.n_kv + h) * kv.dcap + dev_slot(kv, p)) * kv.hd;
}

__host__ __device__ __forceinline__ size_t row_bytes(const GpuKV &kv) {
    return kv.fp8 ? 2 * (size_t)kv.hd + 8 : 4 * (size_t)kv.hd; // host_store_row_bytes
}

__device__ __forceinline__ char *host_row(const GpuKV &kv, int layer, int h, int slot) {
    size_t s = kv.alias_slots ? (size_t)(slot % kv.alias_slots) : (size_t)slot;
    return (char *)kv.host + ((s * kv.n_layers + layer) * kv.n_kv + h) * row_bytes(kv);
}

// ---- the row cache (pariskv_attend.h) ----

#define RC_NONE 0x3fffffff // a table entry: no row yet (then the first row's index, bit 30 if it hits)
#define RC_HIT 0x40000000

extern "C" size_t pkv_row_cache_bytes(int n_layers, int n_kv, int hd, int fp8, int n) {
    size_t heads = (size_t)n_layers * n_kv, row = fp8 ? 2 * (size_t)hd + 8 : 4 * (size_t)hd;
    return heads * n * (row + sizeof(int)) + (size_t)n_layers * 2 * sizeof(unsigned long long);
}

extern "C" cudaError_t pkv_row_cache_invalidate(PkvRowCache rc, int n_layers, int n_kv, cudaStream_t st) {
    if (!rc.n) return cudaSuccess;
    return cudaMemsetAsync(rc.tags, 0xff, (size_t)n_layers * n_kv * rc.n * sizeof(int), st);
}

// The claims table in shared memory: direct (val[line]) or, with rc.hashed, open addressing on
// the step's lines (key[i] the line of entry i, -1 empty; val[i] its claim; H entries, hbits = log2 H).
struct RcTab {
    int *val, *key; // key NULL: direct
    int hbits;
};

__device__ __forceinline__ RcTab rc_tab_at(const PkvRowCache &rc, int kmax, int *smem) {
    if (!rc.hashed) return RcTab{smem, nullptr, 0};
    const int H = pkv_row_cache_hash_entries(kmax);
    return RcTab{smem, smem + H, 31 - __clz(H)};
}

// Where a line's probe starts in the hash (Fibonacci hashing: nearby lines spread).
__device__ __forceinline__ int rc_home(const RcTab &t, int line) { return (int)(((unsigned)line * 0x9E3779B1u) >> (32 - t.hbits)); }

// The entry of a line the step's rows put in the table (it is there: no empty-key check).
__device__ __forceinline__ int rc_entry(const RcTab &t, int line) {
    if (!t.key) return line;
    const int mask = (1 << t.hbits) - 1;
    int i = rc_home(t, line);
    while (t.key[i] != line) i = (i + 1) & mask;
    return i;
}

// The table of the head's lines for this step's selection sel[0, n), from the tags as the step
// began: val[entry of line] = the first row on the line, or the row that hits it | RC_HIT. Every
// block builds the same table for the rows it owns (other blocks' misses may write tags
// meanwhile, but only on lines where this block's rows neither hit nor write: see
// pariskv_attend.h). Counts the block's own rows (r % n_splits == split) as hits or misses into stats.
__device__ void rc_claims(const GpuKV &kv, const PkvRowCache &rc, int layer, int h, const int *sel, int n, int split, int n_splits, const RcTab &t) {
    __shared__ unsigned cnt[2];
    const int mask = rc.n - 1;
    const int *tag = rc.tags + ((size_t)layer * kv.n_kv + h) * rc.n;
    if (threadIdx.x == 0) cnt[0] = cnt[1] = 0;
    if (!t.key) { // direct: only the lines the rows fall on are reset (rows may share a line)
        for (int r = threadIdx.x; r < n; r += blockDim.x) atomicExch(&t.val[sel[r] & mask], RC_NONE);
        __syncthreads();
        for (int r = threadIdx.x; r < n; r += blockDim.x) atomicMin(&t.val[sel[r] & mask], r);
    } else { // hashed: all H entries cleared, then each row's line inserted (<= n of H / 2 taken)
        const int H = 1 << t.hbits;
        for (int i = threadIdx.x; i < H; i += blockDim.x) t.key[i] = -1, t.val[i] = RC_NONE;
        __syncthreads();
        for (int r = threadIdx.x; r < n; r += blockDim.x) {
            int line = sel[r] & mask, i = rc_home(t, line);
            for (;;) {
                int k = atomicCAS(&t.key[i], -1, line);
                if (k == -1 || k == line) break;
                i = (i + 1) & (H - 1);
            }
            atomicMin(&t.val[i], r);
        }
    }
    __syncthreads();
    unsigned hits = 0, misses = 0;
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
        int s = sel[r];
        bool hit = tag[s & mask] == s; // one slot per tag: at most one row of a line hits
        if (hit) t.val[rc_entry(t, s & mask)] = r | RC_HIT;
        if (r % n_splits == split) {
            if (hit) hits++;
            else misses++;
        }
    }
    if (hits) atomicAdd(&cnt[0], hits);
    if (misses) atomicAdd(&cnt[1], misses);
    __syncthreads();
    if (threadIdx.x == 0 && cnt[0]) atomicAdd(rc.stats + 2 * layer, (unsigned long long)cnt[0]);
    if (threadIdx.x == 0 && cnt[1]) atomicAdd(rc.stats + 2 * layer + 1, (unsigned long long)cnt[1]);
}

// Row r (slot) of the selection: where to read it (the line on a hit, else the host row), and
// the slot whose row this reader writes into its line afterwards (-1: none).
__device__ __forceinline__ int rc_source(const GpuKV &kv, const PkvRowCache &rc, int layer, int h, int slot, int r, const RcTab &t, const char **row) {
    *row = host_row(kv, layer, h, slot);
    if (!rc.n) return -1;
    int line = slot & (rc.n - 1), e = t.val[rc_entry(t, line)];
    if ((e & RC_NONE) != r) return -1; // another row of the line hits or writes it
    if (!(e & RC_HIT)) return slot;    // the line's first miss: it fills the line
    *row = rc.lines + (((size_t)layer * kv.n_kv + h) * rc.n + line) * row_bytes(kv);
    return -1;
}

// One lane's part of a row it read (kr, vr as attend_rows loads them) into slot's line, then,
// lane 0 of the stream, the tag. Nobody reads the line in this step (its hit would have
// stopped the write), so the tag needs no ordering against the data here; the next step's
// kernel sees both.
template <int HD>
__device__ __forceinline__ void rc_fill(const GpuKV &kv, const PkvRowCache &rc, int layer, int h, int slot, int part, bool f8, uint4 kr, uint4 vr) {
    int line = slot & (rc.n - 1);
    size_t at = ((size_t)layer * kv.n_kv + h) * rc.n + line;
    char *row = rc.lines + at * row_bytes(kv);
    if (f8) {
        ((uint2 *)row)[part] = make_uint2(kr.x, kr.y), ((uint2 *)(row + HD))[part] = make_uint2(vr.x, vr.y);
        if (part == 0) *(uint2 *)(row + 2 * HD) = make_uint2(kr.z, vr.z); // the two scales' bits
    } else ((uint4 *)row)[part] = kr, ((uint4 *)(row + 2 * HD))[part] = vr;
    if (part == 0) rc.tags[at] = slot;
}

// Max over the block of v (every thread gets it); red: 32 floats of shared memory.
__device__ __forceinline__ float block_max(float v, float *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = 0.0f;
    for (int i = 0; i < nw; i++) m = fmaxf(m, red[i]);
    return m;
}

// ---- QKV post-processing ----

// Block b < n_heads: query head b; block n_heads + h: key and value of KV head h. HD threads,
// thread j owns element j. The same arithmetic as attn_decode's head_norm_rope.
template <int HD>
__global__ void pkv_qkv_kernel(float *q, const float *qkv, const float *q_norm, const float *k_norm, const float *rope_cs,
                               GpuKV kv, int layer, const int *d_pos, int n_heads, float eps) {
    __shared__ float x[HD], red[32];
    pdl_wait(); // the QKV projection
    pdl_release();
    int b = blockIdx.x, j = threadIdx.x, pos = *d_pos;
    bool is_q = b < n_heads;
    float v = qkv[(size_t)b * HD + j]; // q heads, then k heads: (n_heads + n_kv) rows of HD
    const float *nw = is_q ? q_norm : k_norm;
    if (nw) {
        float ss = block_sum(v * v, red);
        v = nw[j] * (v * rsqrtf(ss / (float)HD + eps));
    }
    x[j] = v;
    __syncthreads();
    int f = j % (HD / 2);
    float c = rope_cs[f], s = rope_cs[HD / 2 + f], other = x[j ^ (HD / 2)];
    float r = j < HD / 2 ? v * c - other * s : v * c + other * s;
    if (is_q) {
        q[(size_t)b * HD + j] = r;
        return;
    }
    int h = b - n_heads;
    bf16 kb = __float2bfloat16(r), vb = __float2bfloat16(qkv[(size_t)(n_heads + kv.n_kv + h) * HD + j]);
    size_t off = cache_off(kv, layer, h, pos) + j;
    kv.kc[off] = kb, kv.vc[off] = vb;
    if (kv.host && pos >= kv.sink) {
        char *row = host_row(kv, layer, h, pos - kv.sink);
        if (kv.fp8) { // the row's codes and scales from the bf16 values, as fp8_quantize_row
            float kf = __bfloat162float(kb), vf = __bfloat162float(vb);
            float ka = block_max(fabsf(kf), red), va = block_max(fabsf(vf), red);
            float ki = ka > 0.0f ? FP8_E4M3_MAX / ka : 0.0f, vi = va > 0.0f ? FP8_E4M3_MAX / va : 0.0f;
            row[j] = (char)fp8_e4m3_encode(kf * ki), row[HD + j] = (char)fp8_e4m3_encode(vf * vi);
            if (j == 0) ((float *)(row + 2 * HD))[0] = fp8_row_scale(ka), ((float *)(row + 2 * HD))[1] = fp8_row_scale(va);
        } else ((bf16 *)row)[j] = kb, ((bf16 *)row)[HD + j] = vb;
    }
}

extern "C" cudaError_t pkv_qkv_decode(float *q, const float *qkv, const float *q_norm, const float *k_norm,
                                      const float *rope_cs, GpuKV kv, int layer, const int *d_pos, int n_heads, float eps,
                                      cudaStream_t st) {
    int blocks = n_heads + kv.n_kv;
    if (kv.hd == 64) return launch_pdl(pkv_qkv_kernel<64>, dim3(blocks), dim3(64), 0, st, q, qkv, q_norm, k_norm, rope_cs, kv, layer, d_pos, n_heads, eps);
    if (kv.hd == 128) return launch_pdl(pkv_qkv_kernel<128>, dim3(blocks), dim3(128), 0, st, q, qkv, q_norm, k_norm, rope_cs, kv, layer, d_pos, n_heads, eps);
    if (kv.hd == 256) return launch_pdl(pkv_qkv_kernel<256>, dim3(blocks), dim3(256), 0, st, q, qkv, q_norm, k_norm, rope_cs, kv, layer, d_pos, n_heads, eps);
    return cudaErrorInvalidValue;
}

// ---- attention over the selected rows ----

template <int LPK> __device__ __forceinline__ float stream_sum(float v) {
#pragma unroll
    for (int o = LPK / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ void bf16x8(uint4 u, float *f) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}

// 8 e4m3 codes (u.x, u.y) times the row's scale (u.z's bits): fp8_dequantize_row.
__device__ __forceinline__ void fp8x8(uint4 u, float *f) {
    float s = __uint_as_float(u.z);
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = fp8_e4m3_decode((uint8_t)((i < 4 ? u.x : u.y) >> (8 * (i & 3)))) * s;
}

template <int G, int HD>
__global__ void __launch_bounds__(PA_THREADS) pkv_attend_kernel(bf16 *out, const float *q, const int *sel, const int *nsel,
                                                               int kmax, GpuKV kv, PkvRowCache rc, int layer, const int *d_pos,
                                                               const int *meta, float *partial, unsigned *counters) {
    constexpr int LPK = HD / 8, SPW = 32 / LPK, NS = pa_streams(HD), PSTRIDE = HD + 4;
    __shared__ float st_m[NS][G], st_l[NS][G];
    __shared__ __align__(16) float st_o[NS][G][HD];
    __shared__ int is_last;
    __shared__ float mw[G][PA_MAX_SPLITS], lw[G][PA_MAX_SPLITS], Lsum[G]; // the merge: each split's m (then weight) and l, each head's sum
    int h = blockIdx.x, split = blockIdx.y, n_splits = gridDim.y;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = lane % LPK, stream = warp * SPW + lane / LPK;
    int pos = *d_pos, zone_end = meta[0];
    int ns = min(kv.sink, pos + 1), nw = pos - zone_end + 1;

    const float scale = rsqrtf((float)HD) * LOG2E;
    float qr[G][8];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float *qp = q + (size_t)(h * G + g) * HD + part * 8;
        float4 a = *(const float4 *)qp, b = *(const float4 *)(qp + 4);
        qr[g][0] = a.x * scale, qr[g][1] = a.y * scale, qr[g][2] = a.z * scale, qr[g][3] = a.w * scale;
        qr[g][4] = b.x * scale, qr[g][5] = b.y * scale, qr[g][6] = b.z * scale, qr[g][7] = b.w * scale;
    }
    float mx[G], l[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; g++) {
        mx[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) acc[g][i] = 0.0f;
    }
    // Online softmax over a list of m rows, row r's K at key(r) (V right after it in the host
    // store, at the same offset of the V cache in GPU memory; key returns the slot whose row
    // goes into the row cache, -1: none). Split s takes rows s, s +
    // n_splits, ...: the zone's host rows spread over every block, so all of them are in flight
    // at once instead of queueing in the first few blocks.
    // f8: the rows are fp8 host rows (key() gives the row's start as kp): 8 codes a lane and the
    // row's scales, unpacked to the same 8 floats.
    auto attend_rows = [&](int m, bool f8, auto key) {
        int cnt = split < m ? (m - split + n_splits - 1) / n_splits : 0;
        for (int b0 = 0; b0 < cnt; b0 += NS * PA_U) { // the same trip count for every lane
            // Only the batch's first nu row sets hold rows (a split has ~6 zone rows at k = 100
            // for 8 streams): the rest are skipped, not computed as empty -- the kernel is
            // bound by its warps' instruction latency, not by bytes. nu is the same for the block.
            const int nu = min(PA_U, (cnt - b0 + NS - 1) / NS);
            uint4 kr[PA_U], vr[PA_U];
            bool ok[PA_U];
            int fill[PA_U];
#pragma unroll
            for (int u = 0; u < PA_U; u++) { // all loads first: they are in flight together
                if (u >= nu) break;
                int jj = b0 + u * NS + stream;
                ok[u] = jj < cnt;
                fill[u] = -1;
                if (ok[u]) {
                    const bf16 *kp, *vp;
                    fill[u] = key(split + jj * n_splits, &kp, &vp);
                    if (f8) {
                        const char *row = (const char *)kp;
                        uint2 kc = ((const uint2 *)row)[part], vc = ((const uint2 *)(row + HD))[part];
                        float2 sc = *(const float2 *)(row + 2 * HD);
                        kr[u] = make_uint4(kc.x, kc.y, __float_as_uint(sc.x), 0), vr[u] = make_uint4(vc.x, vc.y, __float_as_uint(sc.y), 0);
                    } else kr[u] = ((const uint4 *)kp)[part], vr[u] = ((const uint4 *)vp)[part];
                } else kr[u] = make_uint4(0, 0, 0, 0), vr[u] = kr[u];
            }
#pragma unroll
            for (int u = 0; u < PA_U; u++) {
                if (u >= nu) break;
                float kf[8], vf[8];
                if (fill[u] >= 0) rc_fill<HD>(kv, rc, layer, h, fill[u], part, f8, kr[u], vr[u]);
                if (f8) fp8x8(kr[u], kf), fp8x8(vr[u], vf);
                else bf16x8(kr[u], kf), bf16x8(vr[u], vf);
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float s = 0.0f;
#pragma unroll
                    for (int i = 0; i < 8; i++) s += qr[g][i] * kf[i];
                    s = stream_sum<LPK>(s); // every lane of the warp takes part in the shuffles
                    if (ok[u]) {
                        float mn = fmaxf(mx[g], s), a = exp2f(mx[g] - mn), p = exp2f(s - mn);
                        l[g] = l[g] * a + p;
#pragma unroll
                        for (int i = 0; i < 8; i++) acc[g][i] = acc[g][i] * a + p * vf[i];
                        mx[g] = mn;
                    }
                }
            }
        }
    };
    // The sink and the window (GPU memory; q and the new row come from the QKV kernel, done
    // before the selection began) do not depend on the selection: they run while it finishes.
    attend_rows(ns + nw, false, [&](int r, const bf16 **kp, const bf16 **vp) {
        size_t o = cache_off(kv, layer, h, r < ns ? r : zone_end + (r - ns));
        *kp = kv.kc + o, *vp = kv.vc + o;
        return -1;
    });
    pdl_wait(); // the selection
    const int *hsel = sel + (size_t)h * kmax;
    int n_zone = nsel[h];
    extern __shared__ int rc_smem[]; // the row cache's claims (attend_dyn_smem)
    const RcTab tab = rc_tab_at(rc, kmax, rc_smem);
    if (kv.host && rc.n) rc_claims(kv, rc, layer, h, hsel, n_zone, split, n_splits, tab);
    attend_rows(n_zone, kv.host && kv.fp8, [&](int r, const bf16 **kp, const bf16 **vp) {
        int slot = hsel[r], fill = -1;
        if (kv.host) {
            const char *row;
            fill = rc_source(kv, rc, layer, h, slot, r, tab, &row);
            *kp = (const bf16 *)row, *vp = *kp + HD;
        } else {
            size_t o = cache_off(kv, layer, h, kv.sink + slot);
            *kp = kv.kc + o, *vp = kv.vc + o;
        }
        return fill;
    });
    pdl_release(); // the output projection may start streaming its weights
    // Combine the block's streams, then write this split's (o, m, l).
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (part == 0) st_m[stream][g] = mx[g], st_l[stream][g] = l[g];
#pragma unroll
        for (int i = 0; i < 8; i++) st_o[stream][g][part * 8 + i] = acc[g][i];
    }
    __syncthreads();
    float *pbase = partial + (size_t)h * G * n_splits * PSTRIDE;
    for (int e = threadIdx.x; e < G * HD; e += PA_THREADS) {
        int g = e / HD, d = e % HD;
        float M = -INFINITY, L = 0.0f, o = 0.0f;
        for (int s = 0; s < NS; s++) M = fmaxf(M, st_m[s][g]);
        if (M != -INFINITY)
            for (int s = 0; s < NS; s++) {
                float w = exp2f(st_m[s][g] - M);
                L += st_l[s][g] * w;
                o += st_o[s][g][d] * w;
            }
        float *p = pbase + ((size_t)g * n_splits + split) * PSTRIDE;
        p[d] = o;
        if (d == 0) p[HD] = M, p[HD + 1] = L;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(&counters[h], 1u) == (unsigned)n_splits - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    // The merge is on the step's critical path: load every split's (m, l) at once (one L2 round
    // trip; a head's thread reading its l's one by one made n_splits of them, ~5 us), then each
    // output element's n_splits values with independent loads -- a few L2 round trips in all.
    for (int e = threadIdx.x; e < G * n_splits; e += PA_THREADS) {
        int g = e / n_splits, sp = e % n_splits;
        float2 ml = __ldcg((const float2 *)(pbase + ((size_t)g * n_splits + sp) * PSTRIDE + HD));
        mw[g][sp] = ml.x, lw[g][sp] = ml.y;
    }
    __syncthreads();
    if (threadIdx.x < G) {
        int g = threadIdx.x;
        float M = -INFINITY, L = 0.0f;
        for (int sp = 0; sp < n_splits; sp++) M = fmaxf(M, mw[g][sp]);
        for (int sp = 0; sp < n_splits; sp++) {
            float w = mw[g][sp] == -INFINITY ? 0.0f : exp2f(mw[g][sp] - M); // a split with no rows weighs 0
            L += w * lw[g][sp];
            mw[g][sp] = w;
        }
        Lsum[g] = L;
    }
    __syncthreads();
    // Each thread four consecutive outputs of one head, their splits' values MB at a time, all in
    // flight together (one output a thread, 8 splits at a time, made 4 x 3 dependent round trips
    // at 17 splits); each output still sums its splits in order: the same bits.
    constexpr int MB = 16;
    for (int e4 = 4 * threadIdx.x; e4 < G * HD; e4 += 4 * PA_THREADS) {
        int g = e4 / HD, d = e4 % HD;
        const float *pg = pbase + (size_t)g * n_splits * PSTRIDE + d;
        float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int s0 = 0; s0 < n_splits; s0 += MB) {
            float4 v[MB];
#pragma unroll
            for (int j = 0; j < MB; j++)
                v[j] = s0 + j < n_splits ? __ldcg((const float4 *)(pg + (size_t)(s0 + j) * PSTRIDE)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int j = 0; j < MB; j++)
                if (s0 + j < n_splits) {
                    float w = mw[g][s0 + j];
                    o[0] += w * v[j].x, o[1] += w * v[j].y, o[2] += w * v[j].z, o[3] += w * v[j].w;
                }
        }
        __nv_bfloat162 r[2] = {__floats2bfloat162_rn(o[0] / Lsum[g], o[1] / Lsum[g]), __floats2bfloat162_rn(o[2] / Lsum[g], o[3] / Lsum[g])};
        *(uint2 *)(out + (size_t)(h * G + g) * HD + d) = *(const uint2 *)r; // the new token is always a row: L > 0
    }
    if (threadIdx.x == 0) counters[h] = 0;
}

// Shared memory a block takes beyond its static arrays: the row cache's claims (RcTab).
static size_t claims_smem(const PkvRowCache &rc, int kmax) {
    if (rc.n <= 0) return 0;
    return rc.hashed ? 2 * (size_t)pkv_row_cache_hash_entries(kmax) * sizeof(int) : (size_t)rc.n * sizeof(int);
}
static size_t attend_dyn_smem(const GpuKV &kv, const PkvRowCache &rc, int kmax) { return kv.host ? claims_smem(rc, kmax) : 0; }

// The instantiation for (G, hd), or NULL.
typedef void (*AttendKernel)(bf16 *, const float *, const int *, const int *, int, GpuKV, PkvRowCache, int, const int *, const int *,
                             float *, unsigned *);
static AttendKernel attend_kernel(int G, int hd) {
#define CASE(g, d) \
    if (G == g && hd == d) return pkv_attend_kernel<g, d>;
#define CASES(g) CASE(g, 64) CASE(g, 128)
    CASES(1) CASES(2) CASES(3) CASES(4) CASES(5) CASES(6) CASES(7) CASES(8)
#undef CASES
#undef CASE
    return NULL;
}

// Raises the kernel's limit on shared memory past the default 48 KiB when the claims need it;
// never lowers it (another state may run the same kernel with a larger table).
extern "C" cudaError_t pkv_attend_setup(PkvRowCache rc, int n_heads, int n_kv, int hd, int kmax) {
    AttendKernel k = attend_kernel(n_heads / n_kv, hd);
    if (!k || (rc.hashed && (kmax < 1 || kmax > PKV_RC_HASH_KMAX))) return cudaErrorInvalidValue;
    cudaFuncAttributes fa;
    CU_TRY(cudaFuncGetAttributes(&fa, k));
    int need = (int)claims_smem(rc, kmax);
    return need > fa.maxDynamicSharedSizeBytes ? cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, need) : cudaSuccess;
}

extern "C" cudaError_t pkv_attend_rc(bf16 *out, const float *q, const int *sel, const int *nsel, int kmax, GpuKV kv, PkvRowCache rc,
                                     int layer, const int *d_pos, const int *meta, int n_heads, float *partial, unsigned *counters,
                                     cudaStream_t st) {
    AttendKernel k = attend_kernel(n_heads / kv.n_kv, kv.hd);
    if (!k) return cudaErrorInvalidValue;
    dim3 grid(kv.n_kv, pkv_attend_splits(kv.n_kv, kv.hd, kmax));
    return launch_pdl(k, grid, dim3(PA_THREADS), attend_dyn_smem(kv, rc, kmax), st, out, q, sel, nsel, kmax, kv, rc, layer, d_pos, meta, partial,
                      counters);
}

extern "C" cudaError_t pkv_attend(bf16 *out, const float *q, const int *sel, const int *nsel, int kmax, GpuKV kv,
                                  int layer, const int *d_pos, const int *meta, int n_heads, float *partial,
                                  unsigned *counters, cudaStream_t st) {
    const PkvRowCache none = {}; // n == 0: no cache
    return pkv_attend_rc(out, q, sel, nsel, kmax, kv, none, layer, d_pos, meta, n_heads, partial, counters, st);
}

// ---- moving and filling rows ----

// The rows-out kernels read the source cache src (its layers 0 .. src.n_layers - 1) and write
// layer layer0 + l of the destination kv: its host store, or its device cache.

// fp8 rows: one warp per (position, layer, head, K or V) row: its max magnitude, then its codes
// (fp8_quantize_row on the bf16 values), lane 0 the scale.
// Item i of the rows of positions p0.. in the order (position, layer, head, K or V, part of a row).
struct RowItem {
    int part, isv, h, layer, p;
};
__device__ __forceinline__ RowItem row_item(long i, int parts, int n_kv, int n_layers, int p0) {
    RowItem r;
    r.part = (int)(i % parts), i /= parts;
    r.isv = (int)(i % 2), i /= 2;
    r.h = (int)(i % n_kv), i /= n_kv;
    r.layer = (int)(i % n_layers);
    r.p = p0 + (int)(i / n_layers);
    return r;
}

__global__ void rows_to_host_fp8_kernel(GpuKV kv, GpuKV src, int layer0, int p0, long n_rows) {
    int lane = threadIdx.x & 31;
    long warps = (long)gridDim.x * (blockDim.x / 32);
    for (long i = blockIdx.x * (long)(blockDim.x / 32) + (threadIdx.x >> 5); i < n_rows; i += warps) {
        RowItem r = row_item(i, 1, kv.n_kv, src.n_layers, p0);
        int isv = r.isv, h = r.h, layer = r.layer, p = r.p;
        const bf16 *s = (isv ? src.vc : src.kc) + cache_off(src, layer, h, p);
        // Four elements a lane (hd <= 256: at most two passes), so that a warp's codes go out
        // as one 128-byte write over PCIe instead of 4 x 32 single bytes.
        float x[2][4], amax = 0.0f;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int j = 4 * lane + 128 * q;
            if (j < kv.hd) {
                const uint2 u = *(const uint2 *)(s + j);
                const float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
                x[q][0] = a.x, x[q][1] = a.y, x[q][2] = b.x, x[q][3] = b.y;
#pragma unroll
                for (int e = 0; e < 4; e++) amax = fmaxf(amax, fabsf(x[q][e]));
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        float inv = amax > 0.0f ? FP8_E4M3_MAX / amax : 0.0f;
        char *row = host_row(kv, layer0 + layer, h, p - kv.sink);
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int j = 4 * lane + 128 * q;
            if (j < kv.hd)
                *(uint32_t *)(row + isv * kv.hd + j) = (uint32_t)fp8_e4m3_encode(x[q][0] * inv) | (uint32_t)fp8_e4m3_encode(x[q][1] * inv) << 8 |
                                                       (uint32_t)fp8_e4m3_encode(x[q][2] * inv) << 16 | (uint32_t)fp8_e4m3_encode(x[q][3] * inv) << 24;
        }
        if (lane == 0) ((float *)(row + 2 * kv.hd))[isv] = fp8_row_scale(amax);
    }
}

// One thread per 16 bytes: (position, layer, head, K or V, 16-byte part). to_host: into kv's
// host store (bf16 rows), else into kv's device cache.
__global__ void rows_out_kernel(GpuKV kv, GpuKV src, int layer0, int p0, long n_items, int to_host) {
    int parts = kv.hd / 8;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n_items; i += (long)gridDim.x * blockDim.x) {
        RowItem r = row_item(i, parts, kv.n_kv, src.n_layers, p0);
        int part = r.part, isv = r.isv, h = r.h, layer = r.layer, p = r.p;
        const uint4 *s = (const uint4 *)((isv ? src.vc : src.kc) + cache_off(src, layer, h, p));
        uint4 *dst = to_host ? (uint4 *)((bf16 *)host_row(kv, layer0 + layer, h, p - kv.sink) + isv * kv.hd) // bf16 rows
                             : (uint4 *)((isv ? kv.vc : kv.kc) + cache_off(kv, layer0 + layer, h, p));
        dst[part] = s[part];
    }
}

static cudaError_t rows_out(GpuKV kv, GpuKV src, int layer0, int p0, int p1, int to_host, cudaStream_t st) {
    if (p1 <= p0) return cudaSuccess;
    if (to_host && kv.fp8) {
        long rows = (long)(p1 - p0) * src.n_layers * kv.n_kv * 2, blocks = (rows + 7) / 8;
        rows_to_host_fp8_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, st>>>(kv, src, layer0, p0, rows);
        return cudaGetLastError();
    }
    long n = (long)(p1 - p0) * src.n_layers * kv.n_kv * 2 * (kv.hd / 8);
    long blocks = (n + 255) / 256;
    rows_out_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, st>>>(kv, src, layer0, p0, n, to_host);
    return cudaGetLastError();
}

// One thread per 16 bytes: bf16 host rows (host's layout) into dev's device cache.
__global__ void rows_in_kernel(GpuKV dev, GpuKV host, int p0, long n_items) {
    int parts = dev.hd / 8;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n_items; i += (long)gridDim.x * blockDim.x) {
        RowItem r = row_item(i, parts, dev.n_kv, dev.n_layers, p0);
        const uint4 *s = (const uint4 *)((const bf16 *)host_row(host, r.layer, r.h, r.p - host.sink) + r.isv * host.hd);
        ((uint4 *)((r.isv ? dev.vc : dev.kc) + cache_off(dev, r.layer, r.h, r.p)))[r.part] = s[r.part];
    }
}

extern "C" cudaError_t pkv_rows_copy(GpuKV dev, GpuKV host, int p0, int p1, int dir, cudaStream_t st) {
    if (p1 <= p0) return cudaSuccess;
    if (dir == PKV_ROWS_TO_HOST) return rows_out(host, dev, 0, p0, p1, 1, st);
    if (host.fp8 || host.n_layers != dev.n_layers || host.n_kv != dev.n_kv || host.hd != dev.hd) return cudaErrorInvalidValue;
    long n = (long)(p1 - p0) * dev.n_layers * dev.n_kv * 2 * (dev.hd / 8), blocks = (n + 255) / 256;
    rows_in_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, st>>>(dev, host, p0, n);
    return cudaGetLastError();
}

extern "C" cudaError_t pkv_rows_to_host(GpuKV kv, int p0, int p1, cudaStream_t st) {
    if (p0 < kv.sink) p0 = kv.sink;
    if (!kv.host) return cudaSuccess;
    return rows_out(kv, kv, 0, p0, p1, 1, st);
}

extern "C" cudaError_t pkv_layer_rows_out(GpuKV kv, int layer, const bf16 *k, const bf16 *v, int cap, int p0, int p1, int to_host,
                                          cudaStream_t st) {
    if (to_host && !kv.host) return cudaErrorInvalidValue;
    if (to_host && p0 < kv.sink) p0 = kv.sink;
    // The source as a one-layer cache of cap positions: slot p holds position p (no ring).
    GpuKV src = {(bf16 *)k, (bf16 *)v, NULL, 1, kv.n_kv, kv.hd, cap, 0, 0, 0};
    return rows_out(kv, src, layer, p0, p1, to_host, st);
}

__device__ __forceinline__ unsigned hash32(unsigned long long x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (unsigned)x;
}

__global__ void fill_bf16_kernel(bf16 *p, size_t n, unsigned long long seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16((float)(hash32(seed * 0x9e3779b97f4a7c15ULL + i) >> 8) * (2.0f / 16777216.0f) - 1.0f);
}

// fp8 rows of values uniform in [-1, 1]: random finite codes, both scales 1 / 448.
__global__ void fill_fp8_kernel(char *p, size_t rows, int hd, unsigned long long seed) {
    size_t row = 2 * (size_t)hd + 8, n = rows * row;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t o = i % row;
        if (o < 2 * (size_t)hd) {
            uint8_t c = (uint8_t)(hash32(seed * 0x9e3779b97f4a7c15ULL + i) >> 8);
            p[i] = (char)((c & 0x7f) == 0x7f ? c & 0xfe : c); // not a NaN code
        } else if ((o - 2 * (size_t)hd) % 4 == 0)
            *(float *)(p + i) = 1.0f / FP8_E4M3_MAX;
    }
}

extern "C" cudaError_t pkv_fill_random(GpuKV kv, int n_slots, unsigned long long seed, cudaStream_t st) {
    size_t cache = (size_t)kv.n_layers * kv.n_kv * kv.dcap * kv.hd;
    fill_bf16_kernel<<<4096, 256, 0, st>>>(kv.kc, cache, seed);
    fill_bf16_kernel<<<4096, 256, 0, st>>>(kv.vc, cache, seed + 1);
    if (kv.alias_slots && n_slots > kv.alias_slots) n_slots = (int)kv.alias_slots;
    if (kv.host && n_slots > 0) {
        size_t rows = (size_t)n_slots * kv.n_layers * kv.n_kv;
        if (kv.fp8) fill_fp8_kernel<<<4096, 256, 0, st>>>((char *)kv.host, rows, kv.hd, seed + 2);
        else fill_bf16_kernel<<<4096, 256, 0, st>>>((bf16 *)kv.host, rows * 2 * kv.hd, seed + 2);
    }
    return cudaGetLastError();
}
