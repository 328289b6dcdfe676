// ParisKV's selection in one kernel a layer (pkv_select.cuh; the staged version in five kernels
// is pkv_select_staged.cu). Grid (CL, n_kv): a thread-block cluster of CL blocks (16 where the
// GPU can hold one cluster per KV head at that size, else 8) per KV head, one block an SM.
// Block j of head h owns the slots [j S, (j+1) S) (S = n / CL rounded up to 16); the step runs
// as phases with a cluster barrier between them, everything a phase exchanges kept in shared
// memory (read by the peers through distributed shared memory):
//   1. the group query's transform (every block), the tier bonus of the subspaces b = j mod CL
//      (rank by counting, prefix sum of the id counts, as the staged bonus kernel)
//   2. the vote over the block's slots, scores a byte a slot in shared memory, the block's
//      score histogram as "scores >= s"
//   3. threshold and quota of the bucket top-C from the cluster's histograms, the block's
//      candidates written to cand in slot order at its offset (blocks before it + block scan)
//   4. the estimates of an equal share of the candidates (the scores' spread does not matter)
//   5. radix select of the k-th estimate key (digits of 12, 10 and 10 bits), each digit's
//      histogram summed over the cluster a slice per block; ties at the k-th to the smaller
//      slot; the selection written in slot order.
// Same arithmetic and choices as the staged kernels (so as the CPU), position for position;
// 11 cluster barriers and no launch between phases, where the staged kernels pay five launches
// and their grid-wide dependencies (~60 us a layer at 128K). Bytes: the ids once (n B), the
// candidates' codes and w (C 6 B), cand and est through L2.
#include "pkv_select.cuh"

#include <stdlib.h>

#define FU_THREADS 512 // = TOPK_THREADS: est_pass's stride
#define FU_WARPS (FU_THREADS / 32)
#define FU_UNR 8        // id pieces a vote lane loads at once: 64 KB in flight per SM at B >= 16
#define FU_MAX_SLICE 512 // bins of a digit's histogram a block sums (ceil(nb / CL), CL >= 8)

static_assert(FU_THREADS == TOPK_THREADS, "est_pass strides by TOPK_THREADS");

// Phase times for profiling (PkvSelArgs.stamps, tests only): thread 0 of each block records the
// global timer (ns) at each phase's end, FU_STAMPS per block.
#define FU_STAMPS 16
static __device__ __forceinline__ void stamp(const PkvSelArgs &a, int block, int i) {
    if (!a.stamps || threadIdx.x) return;
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    a.stamps[(size_t)block * FU_STAMPS + i] = ns;
}

template <int B> struct Fu {
    static constexpr int NB = 6 * B + 1;                      // score bins
    static constexpr int HSTR = ((NB + 31) & ~31) + 16;       // one warp-half's histogram copy
    static constexpr int WH = 2 * FU_WARPS * HSTR;            // the vote's histograms (ints)
    static constexpr int RADIX = EST_BINS + 2 * 1024;         // the estimates' digit histograms
    static constexpr int BONUS = 3 * 256;                     // the bonus ranking's scratch
    static constexpr int UNION = WH > RADIX ? WH : RADIX;     // one region, used phase by phase
    static_assert(NB < HIST_BLK, "score bins");
};

// Shared memory of a block besides the union region and the scores.
struct FuShared {
    float x[PKV_GPU_MAX_D];      // the group query, transformed
    uint8_t braw[32 * 256];      // bonus of the subspaces this block ranks (b * 256 + pattern)
    uint32_t tbl[32 * 32];       // every subspace's bonus, 4 bits an entry (piece_score's layout)
    int ge[HIST_BLK];            // this block's slots scoring >= s
    int tot[HIST_BLK];           // the head's
    int slice[FU_MAX_SLICE];     // a digit's bins [j per, (j+1) per) (the last slice shorter) summed over the cluster
    int slice_tot;
    long long red64[32];
    int red[32];
    int s_thr, s_bin, s_above, s_gt, s_eq;
};

// The bin of a digit's histogram (nb bins, this block's part in hist) holding the r-th largest
// key over the cluster: *d, and *above = the items in the bins above it. Two cluster barriers:
// the first makes every block's hist complete (and ends the readers of the previous call's
// slices), the second publishes the slice sums.
static __device__ void cluster_find(cg::cluster_group &cl, FuShared &sh, const int *hist, int nb, int r, int *d, int *above) {
    const int CL = (int)cl.num_blocks(), j = (int)cl.block_rank(), per = (nb + CL - 1) / CL, t = threadIdx.x;
    const int mine = max(0, min(per, nb - j * per));
    cl.sync();
    int part = 0;
    for (int b = t; b < mine; b += FU_THREADS) {
        int s = 0;
        for (int q = 0; q < CL; q++) s += cl.map_shared_rank(hist, q)[j * per + b];
        sh.slice[b] = s, part += s;
    }
    int tot;
    block_scan(part, sh.red, &tot);
    if (t == 0) sh.slice_tot = tot;
    cl.sync();
    // The slice holding the r-th largest: warp 0, lane i the slice CL - 1 - i (descending keys).
    if (t < 32) {
        int q = CL - 1 - t, v = t < CL ? *cl.map_shared_rank(&sh.slice_tot, q) : 0, x = v;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, x, o);
            if (t >= o) x += y;
        }
        unsigned hit = __ballot_sync(0xffffffffu, t < CL && x - v < r && x >= r);
        int L = __ffs(hit) - 1; // one lane unless the histograms hold fewer than r items
        int ab = __shfl_sync(0xffffffffu, x - v, L < 0 ? 0 : L);
        if (t == 0) sh.s_bin = CL - 1 - (L < 0 ? 0 : L), sh.s_above = ab;
    }
    __syncthreads();
    const int qs = sh.s_bin, ab0 = sh.s_above;
    const int *src = cl.map_shared_rank(sh.slice, qs);
    // Within the slice (len bins), descending: thread t the bins len - 1 - 2t and len - 2 - 2t.
    const int len = max(0, min(per, nb - qs * per));
    int b0 = len - 1 - 2 * t, v0 = b0 >= 0 ? src[b0] : 0, v1 = b0 - 1 >= 0 ? src[b0 - 1] : 0;
    int all, ex = block_scan(v0 + v1, sh.red, &all);
    int ab = ab0 + ex;
    if (b0 >= 0 && ab < r && ab + v0 >= r) sh.s_bin = qs * per + b0, sh.s_above = ab;
    if (b0 - 1 >= 0 && ab + v0 < r && ab + v0 + v1 >= r) sh.s_bin = qs * per + b0 - 1, sh.s_above = ab + v0;
    __syncthreads();
    *d = sh.s_bin, *above = sh.s_above;
    __syncthreads(); // s_bin / s_above are rewritten by the next call
}

// Phase 1's ranking: bonus of subspace b (threads < 256: pattern t), as pkv_bonus_kernel.
static __device__ void rank_subspace(FuShared &sh, int *scratch, const PkvSelArgs &a, int h, int b, const int T[6]) {
    unsigned long long *xch = (unsigned long long *)scratch; // 256 keys
    int *cnt = scratch + 512;
    const int t = threadIdx.x;
    float s = 0.0f;
    if (t < 256) {
        const float *q = sh.x + b * 8;
#pragma unroll
        for (int jj = 0; jj < 8; jj++) s = __fadd_rn(s, (t >> jj) & 1 ? q[jj] : -q[jj]);
        cnt[t] = a.count[((size_t)h * a.B + b) * 256 + t];
    }
    int cid = rank_patterns(s, xch) & 255; // its barriers also publish cnt
    long long tot, before = block_scan(t < 256 ? (long long)cnt[cid] : 0LL, sh.red64, &tot);
    if (t < 256) {
        int tiers = 0;
#pragma unroll
        for (int tt = 0; tt < 6; tt++) tiers += before < T[tt];
        sh.braw[b * 256 + cid] = (uint8_t)tiers;
        if (a.keep) a.bonus[((size_t)h * a.B + b) * 256 + cid] = (uint8_t)tiers;
    }
    __syncthreads(); // xch / cnt are reused by the next subspace
}

template <int B> static __global__ void __launch_bounds__(FU_THREADS, 1) pkv_fused_kernel(PkvSelArgs a) {
    using F = Fu<B>;
    using VP = VotePiece<B>;
    constexpr int NB = F::NB, PPS = VP::PPS, UNR = FU_UNR;
    __shared__ FuShared sh;
    __shared__ __align__(16) int un[F::UNION];
    extern __shared__ __align__(16) uint8_t sc[]; // the block's scores, slot lo + i at i
    cg::cluster_group cl = cg::this_cluster();
    const int CL = (int)cl.num_blocks(), j = (int)cl.block_rank(), h = blockIdx.y, t = threadIdx.x;
    const int lane = t & 31, warp = t >> 5, k = a.k;
    const int blk = h * CL + j;
    pdl_wait();
    stamp(a, blk, 0);
    int n, C, T[6];
    sel_setup(a, &n, &C, T);
    int *sel = a.sel + (size_t)h * a.kmax;
    // ---- 1. query and bonus ----
    stamp(a, blk, 13);
    float qn = query_transform(sh.x, a.q, a.signs, a.G, a.D, h);
    stamp(a, blk, 14);
    if (j == 0) {
        if (t < a.D) a.qt[(size_t)h * a.D + t] = sh.x[t];
        if (t == 0) a.qn[h] = qn;
    }
    if (n <= k) { // every slot (uniform over the cluster: no barrier is skipped by some blocks only)
        for (int i = j * FU_THREADS + t; i < n; i += CL * FU_THREADS) sel[i] = i;
        if (j == 0 && t == 0) a.nsel[h] = n;
        return;
    }
    for (int b = j; b < B; b += CL) rank_subspace(sh, un, a, h, b, T);
    stamp(a, blk, 1);
    cl.sync();
    for (int i = t; i < B * 32; i += FU_THREADS) {
        int b = i >> 5, c = i & 31;
        const uint8_t *src = cl.map_shared_rank(sh.braw, b % CL) + b * 256;
        uint32_t v = 0;
#pragma unroll
        for (int m = 0; m < 8; m++) v |= (uint32_t)(src[c + 32 * m] & 15) << (4 * (7 - m));
        sh.tbl[i] = v;
    }
    for (int i = t; i < F::WH; i += FU_THREADS) un[i] = 0;
    __syncthreads();
    stamp(a, blk, 2);
    // ---- 2. vote ----
    const int S = block_slots(n, CL), lo = min(j * S, n), hi = min(lo + S, n);
    {
        const unsigned plo = (unsigned)lo * PPS, phi = (unsigned)hi * PPS;
        const uint8_t *ids = a.ids + (size_t)h * a.cap * B;
        int *hw = un + (2 * warp + (lane >> 4)) * F::HSTR;
        const uint32_t *row = sh.tbl + (PPS == 2 ? (lane & 1) * 16 * 32 : 0);
        for (unsigned p0 = plo + warp * 32 * UNR; p0 < phi; p0 += FU_WARPS * 32 * UNR) { // uniform over the warp
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
                    sc[p / PPS - lo] = (uint8_t)s;
                    if (a.keep) a.score[(size_t)h * a.capp + p / PPS] = (uint8_t)s;
                    atomicAdd(&hw[s], 1);
                }
            }
        }
    }
    pdl_release(); // the attention may start on the sink and the window
    __syncthreads();
    stamp(a, blk, 3);
    {
        int v = 0;
        if (t < NB)
#pragma unroll
            for (int w = 0; w < 2 * FU_WARPS; w++) v += un[w * F::HSTR + t];
        int tot, ex = block_scan(v, sh.red, &tot);
        if (t <= NB) sh.ge[t] = tot - ex; // 0 at t = NB
    }
    cl.sync();
    stamp(a, blk, 4);
    // ---- 3. bucket top-C ----
    if (t <= NB) {
        int g = 0;
        for (int q = 0; q < CL; q++) g += cl.map_shared_rank(sh.ge, q)[t];
        sh.tot[t] = g; // slots of the head scoring >= t
    }
    __syncthreads();
    // thr: the highest score s with (slots scoring >= s) >= C (tot[NB] = 0 < C <= n = tot[0]).
    if (t < NB && sh.tot[t] >= C && sh.tot[t + 1] < C) sh.s_thr = t;
    __syncthreads();
    const int thr = sh.s_thr, quota = C - sh.tot[thr + 1];
    int Gb = 0, Eb = 0; // slots of the blocks before this one scoring > thr, == thr
    for (int q = 0; q < j; q++) {
        const int *g = cl.map_shared_rank(sh.ge, q);
        int g1 = g[thr + 1];
        Gb += g1, Eb += g[thr] - g1;
    }
    int *cand = a.cand + (size_t)h * a.capp;
    {
        const uint32_t thr4 = (uint32_t)thr * 0x01010101u;
        for (int c0 = lo; c0 < hi; c0 += 16 * FU_THREADS) {
            int i0 = c0 + 16 * t, nv = min(max(hi - i0, 0), 16); // valid scores of this thread's 16
            uint4 sv = nv ? *(const uint4 *)(sc + (i0 - lo)) : make_uint4(0, 0, 0, 0); // lo % 16 == 0
            const uint32_t sw[4] = {sv.x, sv.y, sv.z, sv.w};
            uint32_t gm[4], em[4];
            int ng = 0, ne = 0;
#pragma unroll
            for (int w = 0; w < 4; w++) {
                int vb = min(max(nv - 4 * w, 0), 4);
                uint32_t valid = vb == 4 ? 0xffffffffu : (1u << (8 * vb)) - 1;
                gm[w] = __vcmpgtu4(sw[w], thr4) & valid, em[w] = __vcmpeq4(sw[w], thr4) & valid;
                ng += __popc(gm[w]) >> 3, ne += __popc(em[w]) >> 3;
            }
            int ptot, pex = block_scan(ng << 16 | ne, sh.red, &ptot); // each sum <= 8192 < 2^16
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
    }
    stamp(a, blk, 5);
    cl.sync(); // cand complete (cluster scope: the peers' global writes are visible)
    stamp(a, blk, 6);
    // ---- 4. rerank an equal share ----
    int *h1 = un, *h2 = un + EST_BINS, *h3 = h2 + 1024;
    for (int i = t; i < F::RADIX; i += FU_THREADS) un[i] = 0;
    __shared__ float lev[16];
    if (t < 16) lev[t] = t & 8 ? c_centers[t & 7] : -c_centers[t & 7]; // pkv_levels
    const int per = ((C + CL - 1) / CL + 15) & ~15, c_lo = min(j * per, C), c_hi = min(c_lo + per, C);
    float *est = a.est + (size_t)h * a.capp;
    __syncthreads();
    {
        constexpr int L = B / 4, CPW = 32 / L, U = RERANK_U, STEP = FU_WARPS * CPW * U;
        const int part = lane % L, g = lane / L;
        float q[32];
#pragma unroll
        for (int i = 0; i < 32; i++) q[i] = sh.x[part * 32 + i];
        const uint8_t *codes = a.codes + (size_t)h * a.cap * B * 4;
        const uint16_t *w = a.w + (size_t)h * a.cap * B;
        // Pipelined as the staged rerank: the next group's codes and w and the slots of the one
        // after are in flight while this group is scored. Uniform trip count over the warp.
        auto slots = [&](int c, int (&slot)[U]) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                int idx = c + u * CPW + g;
                slot[u] = idx < c_hi ? __ldcg(cand + idx) : -1; // written by the peers
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
    }
    __syncthreads(); // h1 and est (this block's share) complete
    stamp(a, blk, 7);
    if (C == k) { // every candidate (ascending)
        for (int i = j * FU_THREADS + t; i < k; i += CL * FU_THREADS) sel[i] = __ldcg(cand + i);
        if (j == 0 && t == 0) a.nsel[h] = k;
        return; // no peer reads this block's shared memory after the barrier above
    }
    // ---- 5. top-k by radix select ----
    int r = k, gt = 0, d, above; // gt: this thread's items above the k-th key
    cluster_find(cl, sh, h1, EST_BINS, r, &d, &above);
    stamp(a, blk, 8);
    const uint32_t d1 = d;
    r -= above;
    est_pass(est, c_lo, c_hi, [&](int, uint32_t key) {
        if (key >> 20 > d1) gt++;
        else if (key >> 20 == d1) atomicAdd(&h2[(key >> 10) & 1023], 1);
    });
    __syncthreads();
    cluster_find(cl, sh, h2, 1024, r, &d, &above);
    stamp(a, blk, 9);
    const uint32_t p22 = d1 << 10 | (uint32_t)d; // the k-th key's first 22 bits
    r -= above;
    est_pass(est, c_lo, c_hi, [&](int, uint32_t key) {
        if (key >> 20 != d1) return;
        if (key >> 10 > p22) gt++;
        else if (key >> 10 == p22) atomicAdd(&h3[key & 1023], 1);
    });
    __syncthreads();
    cluster_find(cl, sh, h3, 1024, r, &d, &above);
    stamp(a, blk, 10);
    const uint32_t Tk = p22 << 10 | (uint32_t)d; // the k-th key
    r -= above;                                   // of its ties, the first r in slot order are taken
    for (int b = t; b < 1024; b += FU_THREADS) gt += b > d ? h3[b] : 0;
    int gtot;
    block_scan(gt, sh.red, &gtot);
    if (t == 0) sh.s_gt = gtot, sh.s_eq = h3[d];
    cl.sync();
    int G0 = 0, E0 = 0; // the items above Tk and the ties of the blocks before this one
    for (int q = 0; q < j; q++) G0 += *cl.map_shared_rank(&sh.s_gt, q), E0 += *cl.map_shared_rank(&sh.s_eq, q);
    const int tq = max(0, r - E0); // ties this block may take, from its first
    int gb = 0, eb = 0;
    for (int c0 = c_lo; c0 < c_hi; c0 += 16 * FU_THREADS) {
        int i0 = c0 + 16 * t, g = 0, e = 0;
        uint32_t key[16];
#pragma unroll
        for (int v = 0; v < 4; v++) {
            float4 e4 = i0 + 4 * v < c_hi ? *(const float4 *)(est + i0 + 4 * v) : make_float4(0, 0, 0, 0);
            key[4 * v] = fkey(e4.x), key[4 * v + 1] = fkey(e4.y), key[4 * v + 2] = fkey(e4.z), key[4 * v + 3] = fkey(e4.w);
        }
#pragma unroll
        for (int u = 0; u < 16; u++)
            if (i0 + u < c_hi) g += key[u] > Tk, e += key[u] == Tk;
        long long ctot, ex = block_scan((long long)g << 32 | e, sh.red64, &ctot);
        int gx = gb + (int)(ex >> 32), ex_e = eb + (int)(ex & 0xffffffff);
#pragma unroll
        for (int u = 0; u < 16; u++) {
            if (i0 + u >= c_hi) continue;
            if (key[u] > Tk) sel[G0 + min(E0, r) + gx + min(ex_e, tq)] = __ldcg(cand + i0 + u), gx++;
            else if (key[u] == Tk) {
                if (ex_e < tq) sel[G0 + min(E0, r) + gx + ex_e] = __ldcg(cand + i0 + u);
                ex_e++;
            }
        }
        gb += (int)(ctot >> 32), eb += (int)(ctot & 0xffffffff);
    }
    if (j == 0 && t == 0) a.nsel[h] = k;
    stamp(a, blk, 11);
    cl.sync(); // the peers may still read this block's s_gt / s_eq
    stamp(a, blk, 12);
}

// ---- host side ----

template <int B> static size_t fused_static_smem(void) {
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, pkv_fused_kernel<B>) == cudaSuccess ? fa.sharedSizeBytes : 64 * 1024;
}

static size_t fused_dyn_smem(int cap, int CL) { return (size_t)((((cap + CL - 1) / CL) + 15) & ~15); }

// The cluster size for this shape (8..16 blocks), 0 if none fits: the one whose clusters of
// every head finish soonest (waves of resident clusters times slots per block), fewer waves on
// a tie. Clusters are placed within a GPC: on an H100 8 clusters of 12 are resident but only 7
// of 16, so 8 KV heads run on 96 SMs in one wave. PKV_FUSED_CL=N forces a size (measuring).
// Sets the kernel's attributes; runs at scratch allocation, outside any stream capture.
template <int B> static int fused_cluster(int n_kv, int cap) {
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return 0;
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major < 9) return 0; // clusters
    size_t stat = fused_static_smem<B>();
    if ((size_t)optin <= stat) return 0;
    size_t dyn_max = (size_t)optin - stat;
    if (cudaFuncSetAttribute(pkv_fused_kernel<B>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn_max) != cudaSuccess ||
        cudaFuncSetAttribute(pkv_fused_kernel<B>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    const char *force = getenv("PKV_FUSED_CL"); // measuring: one size only
    int best = 0;
    double best_cost = 0;
    for (int CL = 16; CL >= 8; CL--) {
        if (force && atoi(force) != CL) continue;
        size_t dyn = fused_dyn_smem(cap, CL);
        if (dyn > dyn_max) continue;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(CL, n_kv);
        cfg.blockDim = dim3(FU_THREADS);
        cfg.dynamicSmemBytes = dyn;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = CL, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
        int nc = 0;
        if (cudaOccupancyMaxActiveClusters(&nc, pkv_fused_kernel<B>, &cfg) != cudaSuccess || nc < 1) {
            cudaGetLastError();
            continue;
        }
        int waves = (n_kv + nc - 1) / nc;
        double cost = (double)waves / CL + 1e-3 * waves; // on a tie, fewer waves (each has its fixed costs)
        if (getenv("PKV_SELECT_VERBOSE")) fprintf(stderr, "fused selection: clusters of %d blocks (%zu B shared each): %d resident\n", CL, stat + dyn, nc);
        if (!best || cost < best_cost) best = CL, best_cost = cost;
    }
    return best;
}

int pkv_fused_fits(int n_kv, int B, int cap) {
    switch (B) {
    case 8: return fused_cluster<8>(n_kv, cap);
    case 16: return fused_cluster<16>(n_kv, cap);
    case 32: return fused_cluster<32>(n_kv, cap);
    }
    return 0;
}

template <int B> static cudaError_t launch_fused(PkvSelArgs a, cudaStream_t st) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(a.CL, a.n_kv);
    cfg.blockDim = dim3(FU_THREADS);
    cfg.dynamicSmemBytes = fused_dyn_smem(a.cap, a.CL);
    cfg.stream = st;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = a.CL, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = 2;
    return cudaLaunchKernelEx(&cfg, pkv_fused_kernel<B>, a);
}

cudaError_t pkv_select_fused(PkvSelArgs a, cudaStream_t st) {
    if (a.CL < 8 || a.CL > 16) return cudaErrorInvalidValue;
    switch (a.B) {
    case 8: return launch_fused<8>(a, st);
    case 16: return launch_fused<16>(a, st);
    case 32: return launch_fused<32>(a, st);
    }
    return cudaErrorInvalidValue;
}
