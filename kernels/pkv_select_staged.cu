// ParisKV's selection, per layer: four kernels (the default), or the five of session 5
// (PKV_SELECT=five, kept to time the two side by side). Arithmetic: pkv_select.cuh.
//
// Per layer (n = *d_n read by every kernel; every grid is fixed by cap, n_kv and the device, so
// one captured graph serves every n):
//   pkv_bonus_kernel   (B, n_kv) x 256  the group query's transform (each block; block 0
//                                       stores it), tier bonus of the 256 patterns of each
//                                       subspace (rank by sorting, prefix sum of the id
//                                       counts); zeroes this step's histograms
//   pkv_vote_kernel    (P, n_kv) x 256  scores of block j's slot range [j S, (j+1) S): the ids
//                                       streamed with coalesced 16-byte loads, the bonus
//                                       tables in shared memory (half bytes, half 4-bit
//                                       entries: VoteTables); a score
//                                       histogram per head (global) and per block (kept as
//                                       "scores >= s" so later blocks find their offsets)
//   pkv_cand_rerank_kernel (R, n_kv) x 256
//                                       block r takes the vote blocks [r P / R, (r+1) P / R):
//                                       threshold score and quota of the bucket top-C, their
//                                       candidates written to cand in slot order at their
//                                       offset, then reranked by the same block (no grid-wide
//                                       step between the two); 12-bit histogram of the
//                                       estimates' order-preserving keys
//   pkv_topk_kernel    (8, n_kv) x 512  one cluster per head: radix select on the keys
//                                       (12/10/10 bits) from that histogram, histograms
//                                       summed in distributed shared memory, ties at the k-th
//                                       to the smaller slot; the selection written in slot order.
//                                       Up to TOPK_ONE_BLOCK candidates (contexts to ~320K)
//                                       the cluster's first block does it alone, the keys
//                                       in shared memory; past that, where the k-th key's
//                                       first digit leaves few items, a list of them sorted
//                                       in the first block instead (topk_from_list)
// The five-kernel selection splits the third kernel into pkv_compact_kernel (the vote's
// blocks) and pkv_rerank_kernel (equal shares of the candidates): a launch and a pass more.
// Tried and dropped (tests/bench/GPU.md, session 13): the top-k in the rerank kernel's last
// block per head, from each block's own top-k -- its serial radix passes cost more than the
// launch they saved (63.5 against 55.4 us a layer at 128K).
// P and R fill the GPU with one wave of resident blocks. Bytes read per KV head, n slots, C
// candidates (n = 1M, D = 128: C = 100K): ids n B (16 MB), scores n (1 MB, from L2), the
// records of codes and w C 6 B (9.6 MB, one 96-byte gather a candidate), cand and est C 8 (L2),
// counts B 1 KB; written: scores n, cand + est C 8.
// All kernels of a step use PDL: pdl_wait() before reading what the kernel before wrote. A kernel
// starts only once the one before it passed its own wait, so from the vote on, what existed when
// the bonus kernel started (the index, the zone size) and from the cand-rerank on, the bonus
// kernel's query transform are final and read before the wait, overlapping the previous tail.

#include "pkv_select.cuh"

#include <atomic>

#define TOPK_ONE_BLOCK 32768 // candidates a head up to which one block of the top-k cluster takes them all


// Block (b, h): subspace b of KV head h. Thread c scores pattern c (pkv_bonus's sum), the
// patterns are sorted into rank order (better score, or equal and smaller id, first), and the
// prefix sum of the counts in rank order gives the keys ranked before each pattern.
static __global__ void __launch_bounds__(SEL_THREADS) pkv_bonus_kernel(PkvSelArgs a) {
    __shared__ unsigned long long xch[256];
    __shared__ int cnt[256];
    __shared__ long long red[32];
    __shared__ float x[PKV_GPU_MAX_D];
    int b = blockIdx.x, h = blockIdx.y, c = threadIdx.x, B = a.B;
    size_t tb = ((size_t)h * B + b) * 256;
    // Final before the step's graph began (the index and its counts, the zone size, the SRHT
    // signs): read before the wait, their latency under the kernel before.
    int my = a.count[tb + c];
    float sign = c < a.D ? a.signs[c] : 0.0f;
    int n, C, T[6];
    sel_setup(a, &n, &C, T);
    pdl_wait();
    int32_t *hh = a.hist + (size_t)h * a.hist_stride;
    for (int i = b * SEL_THREADS + c; i < HIST_BLK0; i += B * SEL_THREADS) hh[i] = 0; // the vote's and rerank's sums
    // Every block of the head transforms its query (a launch less than a kernel of its own);
    // block 0 stores it for the rerank.
    float qn = query_transform(x, a.q, sign, a.G, a.D, h);
    if (b == 0) {
        if (c < a.D) a.qt[(size_t)h * a.D + c] = x[c];
        if (c == 0) a.qn[h] = qn;
    }
    if (n <= a.k) return;
    const float *q = x + b * 8;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) s = __fadd_rn(s, (c >> j) & 1 ? q[j] : -q[j]);
    cnt[c] = my;
    int cid = rank_patterns(s, xch); // the pattern of rank c (its barriers also publish cnt)
    long long tot, before = block_scan((long long)cnt[cid], red, &tot);
    int tiers = 0;
#pragma unroll
    for (int t = 0; t < 6; t++) tiers += before < T[t];
    pdl_release();
    a.bonus[tb + cid] = (uint8_t)tiers;
}


// Block (j, h): the scores of slot range [j S, (j+1) S) of head h. Each warp streams
// 32 * UNR pieces per pass (UNR independent loads a lane), scores stored a byte a slot
// (32 contiguous bytes per store). Score histogram: two copies per warp (half-warps, 16 banks
// apart) with shared atomics, so that lanes with equal scores collide less; then the block's
// sum goes to the head's histogram (global) and, as "scores >= s", to the block's row.
// 6 blocks per SM (40 registers; 8 would spill): 96 KB of ids in flight per SM at B >= 16.
template <int B> static __global__ void __launch_bounds__(SEL_THREADS, 6) pkv_vote_kernel(PkvSelArgs a) {
    using VP = VotePiece<B>;
    using VT = VoteTables<B>;
    constexpr int NB = 6 * B + 1, NW = SEL_THREADS / 32, PPS = VP::PPS, UNR = VP::UNR;
    constexpr int HSTR = ((NB + 31) & ~31) + 16; // one histogram copy
    static_assert(NB < HIST_BLK && NB < SEL_THREADS, "score bins");
    __shared__ __align__(256) uint32_t tbl[VT::WORDS]; // 256-byte aligned: piece_score's addresses
    __shared__ int wh[2 * NW * HSTR];
    __shared__ int red[32];
    int h = blockIdx.y, j = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    for (int i = t; i < 2 * NW * HSTR; i += SEL_THREADS) wh[i] = 0;
    int n, C;
    sel_setup(a, &n, &C, NULL);
    // The ids of the block's first pass (16 KB at most a block: all blocks' fit L2) asked of HBM
    // before the wait: the index and the zone size were written before the bonus kernel, which
    // passed its own wait before this kernel could start (PDL), so they are final here.
    // (B = 8: a head's rows are only 8-byte aligned, the bulk prefetch needs 16.)
    if (B >= 16 && t == 0 && n > a.k) {
        int S0 = block_slots(n, a.P), lo0 = min(j * S0, n), hi0 = min(min(lo0 + S0, n), lo0 + NW * 32 * UNR / PPS);
        if (hi0 > lo0) {
            const uint8_t *p0 = a.ids + ((size_t)h * a.cap + lo0) * B;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p0), "r"((unsigned)(hi0 - lo0) * B) : "memory");
        }
    }
    pdl_wait();
    if (n <= a.k) return;
    const uint8_t *bs = a.bonus + (size_t)h * B * 256;
    vote_tables<VT, B>(tbl, bs);
    __syncthreads();
    int S = block_slots(n, a.P), lo = min(j * S, n), hi = min(lo + S, n);
    unsigned plo = (unsigned)lo * PPS, phi = (unsigned)hi * PPS; // pieces: up to 2^31 at B = 32
    const uint8_t *ids = a.ids + (size_t)h * a.cap * B;
    uint8_t *sc = a.score + (size_t)h * a.capp;
    int *hw = wh + (2 * warp + (lane >> 4)) * HSTR;
    // B = 32: odd lanes hold the second half of a slot (subspaces 16..31). p0 stays even.
    const uint32_t row = (uint32_t)__cvta_generic_to_shared(tbl + (PPS == 2 ? (lane & 1) * VT::GROUP / 4 : 0));
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
            unsigned s = piece_score<VT>(wd[u], row);
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



// ---- the bucket top-C: which slots are candidates, and where each goes in cand ----

// The threshold score *thr and the *quota of the bucket top-C (pkv_bucket_topc): a slot is a
// candidate if its score > thr, or == thr and fewer than quota slots before it scored thr.
// *G / *E: the slots of the vote blocks before block j0 scoring > thr / == thr, from their
// "scores >= s" rows, so that each candidate's place in cand is its rank in slot order.
static __device__ void topc_threshold(const int32_t *hh, int B, int C, int j0, int *thr, int *quota, int *G, int *E) {
    __shared__ int red[32];
    __shared__ unsigned long long red64[32];
    __shared__ int s_thr, s_above;
    int t = threadIdx.x, NB = 6 * B + 1;
    if (t == 0) s_thr = 0, s_above = 0;
    // thr: the highest score s with (slots scoring >= s) >= C; above: those scoring > thr.
    int v = t < NB ? hh[HIST_SCORE + t] : 0, tot, ex = block_scan(v, red, &tot), ge = tot - ex;
    if (t < NB && ge >= C && ge - v < C) s_thr = t, s_above = ge - v;
    __syncthreads();
    *thr = s_thr, *quota = C - s_above;
    unsigned long long acc = 0, acc_tot; // > thr (high word), == thr (low word)
    for (int jj = t; jj < j0; jj += blockDim.x) {
        const int32_t *cb = hh + HIST_BLK0 + (size_t)jj * HIST_BLK;
        int g1 = cb[*thr + 1], g0 = cb[*thr];
        acc += (unsigned long long)g1 << 32 | (unsigned)(g0 - g1);
    }
    block_scan(acc, red64, &acc_tot);
    *G = (int)(acc_tot >> 32), *E = (int)(acc_tot & 0xffffffffu);
}

// The candidates among slots [lo, hi) (lo a multiple of 16) written to cand at their ranks: a
// pass over the scores (L2: just written), 16 a thread, four a word (SIMD within a register);
// the next chunk's scores are asked for before this chunk's scan (at 1M a block takes ~8 chunks,
// ~14 us of its ~67; reading ahead saved ~0.5 of them: the rest is the scans and the stores).
// G / E: the slots before lo scoring > thr / == thr, advanced past hi.
static __device__ void topc_write(const uint8_t *sc, int *cand, int lo, int hi, int thr, int quota, int &Gb, int &Eb) {
    __shared__ int red[32];
    const int t = threadIdx.x;
    const uint32_t thr4 = (uint32_t)thr * 0x01010101u;
    auto scores = [&](int c0) { // in bounds: capp % 16 == 0
        int i0 = c0 + 16 * t;
        return i0 < hi ? *(const uint4 *)(sc + i0) : make_uint4(0, 0, 0, 0);
    };
    uint4 sv_next = scores(lo);
    for (int c0 = lo; c0 < hi; c0 += EMIT_CHUNK) {
        int i0 = c0 + 16 * t, nv = min(max(hi - i0, 0), 16); // valid scores of this thread's 16
        uint4 sv = sv_next;
        sv_next = scores(c0 + EMIT_CHUNK);
        const uint32_t sw[4] = {sv.x, sv.y, sv.z, sv.w};
        uint32_t gm[4], em[4]; // byte masks of > thr and == thr
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
}

// ---- the rerank ----

// The estimates of candidates [c_lo, c_hi) of head h into est, and a 12-bit histogram of their
// order-preserving keys into h1 (shared, zeroed by the caller). Each warp takes U groups of CPW
// candidates at once: the slots, then all U gathers of codes (16 bytes a lane) and w (8) before
// any arithmetic, so each lane has 2U loads in flight; software-pipelined: the codes and w of the
// next group and the slots of the one after are in flight while this group is scored. lev: the
// 16 reconstruction levels (shared). Every thread of the block calls it.
// q, qn: this lane's 32 values of the head's transformed query and its norm (rerank_query).
template <int B>
static __device__ void rerank_range(const PkvSelArgs &a, int h, int c_lo, int c_hi, int *h1, const float *lev, const float (&q)[32], float qn) {
    constexpr int L = B / 4, CPW = 32 / L, NW = SEL_THREADS / 32, U = RERANK_U, STEP = NW * CPW * U;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = lane % L, g = lane / L;
    const uint8_t *cw = a.cw + (size_t)h * a.cap * B * 6;
    const int *cand = a.cand + (size_t)h * a.capp;
    float *est = a.est + (size_t)h * a.capp;
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
                const uint8_t *rec = cw + (size_t)slot[u] * B * 6; // one record: codes, then w
                cv[u] = __ldcs((const uint4 *)rec + part);
                wv[u] = __ldcs((const uint2 *)(rec + B * 4) + part);
            }
        }
    };
    int c = c_lo + warp * CPW * U, s_cur[U], s_nxt[U];
    uint4 cv[U], cv_n[U];
    uint2 wv[U], wv_n[U];
    slots(c, s_cur);
    gather(s_cur, cv, wv);
    slots(c + STEP, s_nxt);
    for (; c < c_hi; c += STEP) { // uniform over the warp (the estimate's shuffles need every lane)
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

// The lane's part of head h's transformed query and its norm (the bonus kernel's): read before
// pdl_wait() by the rerank kernels, which start only after the vote passed its own wait, so
// after the bonus kernel ended.
template <int B> static __device__ void rerank_query(const PkvSelArgs &a, int h, float (&q)[32], float *qn) {
    const int part = (threadIdx.x & 31) % (B / 4);
#pragma unroll
    for (int i = 0; i < 32; i++) q[i] = a.qt[(size_t)h * a.D + part * 32 + i];
    *qn = a.qn[h];
}

static __device__ void rerank_setup(int *h1, float *lev) {
    for (int i = threadIdx.x; i < EST_BINS; i += blockDim.x) h1[i] = 0;
    if (threadIdx.x < 16) lev[threadIdx.x] = threadIdx.x & 8 ? c_centers[threadIdx.x & 7] : -c_centers[threadIdx.x & 7]; // pkv_levels
}

// After a block's rerank_range: the next kernel may start, and the block's histogram (its
// nonzero bins) is added to the head's.
static __device__ void rerank_finish(int32_t *hh, const int *h1) {
    pdl_release();
    __syncthreads();
    for (int i = threadIdx.x; i < EST_BINS; i += SEL_THREADS) // the rerank kernels' block size
        if (h1[i]) atomicAdd(&hh[HIST_EST + i], h1[i]);
}

// ---- the top-k ----

// The bin d of hist (PER x the block size bins) holding the r-th largest item
// (r >= 1): the items of the bins above d number *above < r <= *above + hist[d] = *above + *in.
// Thread t takes bins [t per, (t+1) per), read at once as 16-byte words (hist 16-byte aligned):
// one word a bin, at stride per, made an 8-way bank conflict of each read at per = 8.
template <int PER> static __device__ void find_digit(const int *hist, int r, int *red, int *d, int *above, int *in) {
    static_assert(PER % 4 == 0 || PER == 2, "16- or 8-byte words");
    const int b0 = threadIdx.x * PER;
    int c[PER], v = 0;
    if constexpr (PER == 2) {
        int2 w = *(const int2 *)(hist + b0);
        c[0] = w.x, c[1] = w.y;
    } else {
#pragma unroll
        for (int q = 0; q < PER / 4; q++) {
            int4 w = *(const int4 *)(hist + b0 + 4 * q);
            c[4 * q] = w.x, c[4 * q + 1] = w.y, c[4 * q + 2] = w.z, c[4 * q + 3] = w.w;
        }
    }
#pragma unroll
    for (int i = 0; i < PER; i++) v += c[i];
    int tot, ex = block_scan(v, red, &tot);
    int ab = tot - ex - v; // in the bins of the threads after this one
#pragma unroll
    for (int i = PER - 1; i >= 0; i--) {
        if (ab < r && ab + c[i] >= r) *d = b0 + i, *above = ab, *in = c[i];
        ab += c[i];
    }
    __syncthreads();
}
#define EST_PER (EST_BINS / TOPK_THREADS) // the first digit's bins a thread
#define DIG_PER (1024 / TOPK_THREADS)     // the second's and third's

// Block (r, h): the candidates of vote blocks [j0 = r P / R, j1 = (r+1) P / R) of head h written
// to cand in slot order at their offset, then reranked by the same block (it reads back what it
// wrote: no grid-wide step between the two); the estimates' 12-bit histogram for the top-k.
template <int B> static __global__ void __launch_bounds__(SEL_THREADS) pkv_cand_rerank_kernel(PkvSelArgs a) {
    __shared__ int h1[EST_BINS];
    __shared__ __align__(256) float lev[16]; // estimate's addresses
    const int h = blockIdx.y, r = blockIdx.x;
    rerank_setup(h1, lev);
    int n, C; // the zone size, the query: final before the vote began (rerank_query)
    sel_setup(a, &n, &C, NULL);
    float q[32], qn;
    rerank_query<B>(a, h, q, &qn);
    pdl_wait();
    if (n <= a.k) return;
    int32_t *hh = a.hist + (size_t)h * a.hist_stride;
    const int S = block_slots(n, a.P), j0 = r * a.P / a.R, j1 = (r + 1) * a.P / a.R;
    const int lo = min(j0 * S, n), hi = min(j1 * S, n);
    int thr, quota, G, E;
    topc_threshold(hh, B, C, j0, &thr, &quota, &G, &E); // its barriers also publish h1, lev
    const int c_lo = G + min(E, quota);
    topc_write(a.score + (size_t)h * a.capp, a.cand + (size_t)h * a.capp, lo, hi, thr, quota, G, E);
    const int c_hi = G + min(E, quota);
    __syncthreads(); // this block's cand entries, read back by its other warps
    rerank_range<B>(a, h, c_lo, c_hi, h1, lev, q, qn);
    rerank_finish(hh, h1);
}

// ---- the five-kernel selection (PKV_SELECT=five) ----

// Block (j, h), the vote's block j's slot range: its candidates written to cand.
static __global__ void __launch_bounds__(SEL_THREADS) pkv_compact_kernel(PkvSelArgs a) {
    pdl_wait();
    int h = blockIdx.y, j = blockIdx.x;
    int n, C;
    sel_setup(a, &n, &C, NULL);
    if (n <= a.k) return;
    int thr, quota, G, E;
    topc_threshold(a.hist + (size_t)h * a.hist_stride, a.B, C, j, &thr, &quota, &G, &E);
    int S = block_slots(n, a.P), lo = min(j * S, n), hi = min(lo + S, n);
    topc_write(a.score + (size_t)h * a.capp, a.cand + (size_t)h * a.capp, lo, hi, thr, quota, G, E);
    pdl_release();
}

// Block (r, h): the estimates of candidates [r Cr, (r+1) Cr) of head h (Cr = C / R rounded
// up), fixed-size shares whatever the scores' spread; the histogram's nonzero bins to global.
template <int B> static __global__ void __launch_bounds__(SEL_THREADS) pkv_rerank_kernel(PkvSelArgs a) {
    __shared__ int h1[EST_BINS];
    __shared__ __align__(256) float lev[16]; // estimate's addresses
    int h = blockIdx.y, r = blockIdx.x;
    rerank_setup(h1, lev);
    int n, C;
    sel_setup(a, &n, &C, NULL);
    float q[32], qn;
    rerank_query<B>(a, h, q, &qn);
    pdl_wait();
    if (n <= a.k) return;
    int per = (C + a.R - 1) / a.R, c_lo = min(r * per, C), c_hi = min(c_lo + per, C);
    __syncthreads(); // h1, lev
    rerank_range<B>(a, h, c_lo, c_hi, h1, lev, q, qn);
    rerank_finish(a.hist + (size_t)h * a.hist_stride, h1);
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

// One item of an ordered write: above the k-th key T, value() goes to (items above T before it:
// G) + min(ties before it: E, quota); a tie, among the first quota, to G + E. Counts the item.
// value is called only for an item written (a candidate's slot is read from L2 only then).
template <typename V>
static __device__ __forceinline__ void place_item(uint32_t key, uint32_t T, int quota, V value, int *out, int &G, int &E) {
    if (key > T) out[G + min(E, quota)] = value(), G++;
    else if (key == T) {
        if (E < quota) out[G + E] = value();
        E++;
    }
}

// The items [lo, hi) of est (lo a multiple of 16) above T and the first `quota` equal to it, in
// order, to out: an item's place is (items above T before it) + min(ties before it, quota).
// Every thread of the block calls it (TOPK_THREADS), 16 items a thread per chunk.
static __device__ void write_ordered(const float *est, const int *cand, int *out, int lo, int hi, uint32_t T, int quota,
                                     long long *red64) {
    int gb = 0, eb = 0; // the block's counts before the current chunk
    for (int c0 = lo; c0 < hi; c0 += 16 * TOPK_THREADS) {
        int i0 = c0 + 16 * threadIdx.x, g = 0, e = 0;
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
        for (int u = 0; u < 16; u++)
            if (i0 + u < hi) place_item(key[u], T, quota, [&] { return cand[i0 + u]; }, out, gx, ex_e);
        gb += (int)(ctot >> 32), eb += (int)(ctot & 0xffffffff);
    }
}

// f(i, key) for the keys i0, i0 + 1, ... below hi in shared memory (16-byte aligned), 4 a 16-byte
// read at i0, i0 + step, ... (i0 and step multiples of 4): block-strided (i0 = 4 t, step 4 x the
// block: conflict-free, any order, for histograms) or one thread's contiguous range (step 4).
template <typename F> static __device__ __forceinline__ void keys_pass(const uint32_t *keys, int i0, int hi, int step, F f) {
#pragma unroll 4
    for (int i = i0; i < hi; i += step) {
        uint4 w = *(const uint4 *)(keys + i);
        f(i, w.x);
        if (i + 1 < hi) f(i + 1, w.y);
        if (i + 2 < hi) f(i + 2, w.z);
        if (i + 3 < hi) f(i + 3, w.w);
    }
}

// The ordered write from keys in shared memory (m <= TOPK_ONE_BLOCK of them, so both counts fit
// 16 bits): thread t takes the items [t per, (t+1) per) in slot order (per a multiple of 4: 16-byte
// reads); an item's place is the items above T before it + min(the ties before it, quota), from
// one block scan of the threads' counts. out[place] = value(i) for the items taken.
template <typename V> static __device__ void keys_write_ordered(const uint32_t *keys, int m, uint32_t T, int quota, int *out, int *red, V value) {
    const int t = threadIdx.x, per = ((m + 4 * TOPK_THREADS - 1) / (4 * TOPK_THREADS)) * 4, lo = min(t * per, m), hi = min(lo + per, m);
    int g = 0, e = 0;
    keys_pass(keys, lo, hi, 4, [&](int, uint32_t key) { g += key > T, e += key == T; });
    int tot, ex = block_scan(g << 16 | e, red, &tot);
    int G = ex >> 16, E = ex & 0xffff;
    keys_pass(keys, lo, hi, 4, [&](int i, uint32_t key) { place_item(key, T, quota, [&] { return value(i); }, out, G, E); });
}

// The top-k from a list instead of radix passes, where it is short. The rerank's histogram gives
// the k-th key's first-digit bin d1 and the items in it and above: L of them, every one of the
// top k among them. Where L <= TOPK_THREADS, one pass over the keys lists those L items, each as
// (~key) << 32 | candidate index, and two bitonic sorts finish: the list in rank order (key
// descending, ties by index, i.e. slot, ascending: pkv_select's order), then its first k by
// index, so that out (sel) gets their slots in slot order. On the random and model streams L is
// ~k plus the ~1% of candidates a bin holds near the tail; ties (degenerate keys) and large k
// take the radix passes. The cluster's top-k only: there the list replaces two passes, two of
// its four cluster barriers and two histogram sums over distributed shared memory (H200, 1M: 13.1 against
// 16.5 us a layer at 4 KV heads); one block's radix passes over its shared-memory keys are
// cheaper than the two sorts (9.6 against 11.6 us at 128K, tests/bench/GPU.md, session 32).
static __device__ void topk_from_list(const unsigned long long *list, int L, int k, const int *cand, int *out, unsigned long long *xch) {
    const int t = threadIdx.x;
    int n2 = 1, k2 = 1;
    while (n2 < L) n2 <<= 1;
    while (k2 < k) k2 <<= 1;
    unsigned long long v = t < L ? list[t] : ~0ull;
    v = bitonic_sort(v, n2, xch); // thread t: the item of rank t
    unsigned long long w = t < k ? (v & 0xffffffffu) : ~0ull;
    w = bitonic_sort(w, k2, xch); // the first k by index
    if (t < k && t < L) out[t] = cand[(int)w]; // L >= k (the histogram counts these keys)
}

// The top-k of a head's C <= TOPK_ONE_BLOCK estimates by one block (the cluster's first): the
// same radix as the cluster's, the keys read once into shared memory (keys: the kernel's dynamic
// shared memory, TOPK_ONE_BLOCK words), block barriers instead of cluster barriers. Session 13's
// version read the estimates from L2 in each of its passes (seven dependent L2 round trips);
// keeping them in registers instead unrolled every pass 64 times, and the instruction cache
// missed (tests/bench/GPU.md, session 15). The keys and the bins are read as 16-byte words
// (a word at a time made 8-way bank conflicts), and the ordered write gives each thread a
// contiguous range (a warp's ballot loop over its slice was 26 dependent rounds at 128K).
#define TOPK_LOADS (TOPK_ONE_BLOCK / (4 * TOPK_THREADS)) // 16-byte loads a thread, all in flight
static __device__ void topk_one_block(const PkvSelArgs &a, int h, int C, uint32_t *keys, int *hist, int *h2, int *h3, int *red) {
    __shared__ int s_d, s_above, s_in;
    const int t = threadIdx.x;
    const float *est = a.est + (size_t)h * a.capp;
    const int *cand = a.cand + (size_t)h * a.capp;
    const int32_t *hh = a.hist + (size_t)h * a.hist_stride;
    {
        float4 e4[TOPK_LOADS]; // est rows are padded to 16: a load that starts below C stays in the row
#pragma unroll
        for (int v = 0; v < TOPK_LOADS; v++) {
            int i = 4 * (v * TOPK_THREADS + t);
            e4[v] = i < C ? *(const float4 *)(est + i) : make_float4(0, 0, 0, 0);
        }
        for (int i = t; i < EST_BINS; i += TOPK_THREADS) hist[i] = hh[HIST_EST + i];
        for (int i = t; i < 1024; i += TOPK_THREADS) h2[i] = 0, h3[i] = 0;
#pragma unroll
        for (int v = 0; v < TOPK_LOADS; v++) {
            int i = 4 * (v * TOPK_THREADS + t);
            if (i < C) *(uint4 *)(keys + i) = make_uint4(fkey(e4[v].x), fkey(e4[v].y), fkey(e4[v].z), fkey(e4[v].w));
        }
    }
    __syncthreads();
    pdl_release();
    int r = a.k;
    find_digit<EST_PER>(hist, r, red, &s_d, &s_above, &s_in);
    const uint32_t d1 = s_d;
    r -= s_above;
    keys_pass(keys, 4 * t, C, 4 * TOPK_THREADS, [&](int, uint32_t key) {
        if (key >> 20 == d1) atomicAdd(&h2[(key >> 10) & 1023], 1);
    });
    __syncthreads();
    find_digit<DIG_PER>(h2, r, red, &s_d, &s_above, &s_in);
    const uint32_t p22 = d1 << 10 | (uint32_t)s_d;
    r -= s_above;
    keys_pass(keys, 4 * t, C, 4 * TOPK_THREADS, [&](int, uint32_t key) {
        if (key >> 10 == p22) atomicAdd(&h3[key & 1023], 1);
    });
    __syncthreads();
    find_digit<DIG_PER>(h3, r, red, &s_d, &s_above, &s_in);
    const uint32_t T = p22 << 10 | (uint32_t)s_d;
    const int quota = r - s_above; // of T's ties, the first quota in slot order are taken
    // The ordered write (keys_write_ordered) places each item's index first, its slot after a
    // barrier (one L2 round trip for all k).
    int *out = a.sel + (size_t)h * a.kmax;
    keys_write_ordered(keys, C, T, quota, out, red, [](int i) { return i; });
    __syncthreads(); // the indices written (a block's global writes are visible to it after a barrier)
    for (int p = t; p < a.k; p += TOPK_THREADS) out[p] = cand[out[p]];
    if (t == 0) a.nsel[h] = a.k;
}

// When the top-k is every slot (n <= k) or every candidate (C == k): those written to sel
// (ascending) by threads i0, i0 + step, ..., nsel by thread 0 of i0; returns whether it was so.
static __device__ bool topk_takes_all(const PkvSelArgs &a, int h, int n, int C, int i0, int step) {
    const int k = a.k;
    if (n > k && C != k) return false;
    int *sel = a.sel + (size_t)h * a.kmax;
    const int *cand = a.cand + (size_t)h * a.capp;
    for (int i = i0; i < (n <= k ? n : k); i += step) sel[i] = n <= k ? i : cand[i];
    if (i0 == 0) a.nsel[h] = n <= k ? n : k;
    return true;
}

// Block (h): the top-k where no step of this capacity has more than TOPK_ONE_BLOCK candidates a
// head (topk_one_block_always): the same as the cluster's first block, without a cluster launch.
static __global__ void __launch_bounds__(TOPK_THREADS) pkv_topk1_kernel(PkvSelArgs a) {
    __shared__ __align__(16) int hist[EST_BINS], h2[1024], h3[1024];
    __shared__ int red[32];
    extern __shared__ uint32_t keys[];
    int h = blockIdx.x;
    int n, C;
    sel_setup(a, &n, &C, NULL); // the zone size: final before the vote began
    pdl_wait();
    if (topk_takes_all(a, h, n, C, threadIdx.x, TOPK_THREADS)) return;
    topk_one_block(a, h, C, keys, hist, h2, h3, red);
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
// Where digit 1's bin and those above it hold at most TOPK_THREADS items, the blocks list them
// in the first block's shared memory instead, which sorts them (topk_from_list).
static __global__ void __cluster_dims__(TOPK_CLUSTER, 1, 1) __launch_bounds__(TOPK_THREADS) pkv_topk_kernel(PkvSelArgs a) {
    __shared__ __align__(16) int hist[EST_BINS], h2[1024], h3[1024];
    __shared__ int red[32];
    __shared__ long long red64[32];
    __shared__ int s_d, s_above, s_in, s_gt, s_eq;
    cg::cluster_group cl = cg::this_cluster();
    int h = blockIdx.y, j = (int)cl.block_rank(), t = threadIdx.x, k = a.k;
    int n, C;
    sel_setup(a, &n, &C, NULL); // the zone size: final before the vote began
    pdl_wait();
    int *sel = a.sel + (size_t)h * a.kmax;
    const int *cand = a.cand + (size_t)h * a.capp;
    if (topk_takes_all(a, h, n, C, j * TOPK_THREADS + t, TOPK_CLUSTER * TOPK_THREADS)) return;
    extern __shared__ uint32_t keys[]; // TOPK_SMEM: the one-block path's keys, or this block's
    if (C <= TOPK_ONE_BLOCK) {         // the whole cluster's decision (C is the same in every block)
        if (j == 0) topk_one_block(a, h, C, keys, hist, h2, h3, red);
        return;
    }
    const float *est = a.est + (size_t)h * a.capp;
    const int32_t *hh = a.hist + (size_t)h * a.hist_stride;
    int per = ((C + TOPK_CLUSTER - 1) / TOPK_CLUSTER + 15) & ~15, lo = min(j * per, C), hi = min(lo + per, C), m = hi - lo;
    // Up to TOPK_ONE_BLOCK candidates a block (C to 262,144: contexts to ~2.6M) the block's keys
    // are read once into shared memory, and its passes read them there (each pass over L2 was a
    // round trip of its own); past that, every pass reads the estimates from L2. The five-kernel
    // selection keeps the L2 passes, so that test_pariskv_gpu's cluster cases check both.
    const bool in_smem = per <= TOPK_ONE_BLOCK && !a.five; // the same in every block of the cluster
    if (in_smem) {
        constexpr int NL = 8; // 16-byte loads in flight a thread
        for (int i0 = 4 * t; i0 < m; i0 += 4 * NL * TOPK_THREADS) {
            float4 e4[NL]; // est rows are padded to 16: a load that starts below hi stays in the row
#pragma unroll
            for (int v = 0; v < NL; v++) {
                int i = i0 + 4 * v * TOPK_THREADS;
                e4[v] = i < m ? *(const float4 *)(est + lo + i) : make_float4(0, 0, 0, 0);
            }
#pragma unroll
            for (int v = 0; v < NL; v++) {
                int i = i0 + 4 * v * TOPK_THREADS;
                if (i < m) *(uint4 *)(keys + i) = make_uint4(fkey(e4[v].x), fkey(e4[v].y), fkey(e4[v].z), fkey(e4[v].w));
            }
        }
    }
    auto pass = [&](auto f) { // f(key) for each of the block's items, any order
        if (in_smem) keys_pass(keys, 4 * t, m, 4 * TOPK_THREADS, [&](int, uint32_t key) { f(key); });
        else est_pass(est, lo, hi, [&](int, uint32_t key) { f(key); });
    };
    for (int i = t; i < EST_BINS; i += TOPK_THREADS) hist[i] = hh[HIST_EST + i];
    for (int i = t; i < 1024; i += TOPK_THREADS) h2[i] = 0, h3[i] = 0;
    __syncthreads();
    pdl_release();
    int r = k, gt = 0; // gt: this thread's items above the k-th key
    find_digit<EST_PER>(hist, r, red, &s_d, &s_above, &s_in);
    const uint32_t d1 = s_d;
    if (in_smem && !a.radix && s_above + s_in <= TOPK_THREADS) { // the list (topk_from_list) in block 0's hist; the same in every block
        __shared__ int s_cnt;
        if (t == 0) s_cnt = 0;
        cl.sync(); // block 0's counter zeroed, its bins read
        int *cnt0 = cl.map_shared_rank(&s_cnt, 0);
        unsigned long long *list0 = (unsigned long long *)cl.map_shared_rank(hist, 0);
        keys_pass(keys, 4 * t, m, 4 * TOPK_THREADS, [&](int i, uint32_t key) {
            if (key >> 20 >= d1) {
                int p = atomicAdd(cnt0, 1);
                if (p < TOPK_THREADS) list0[p] = (unsigned long long)~key << 32 | (unsigned)(lo + i);
            }
        });
        cl.sync(); // the list complete; only block 0 reads it
        if (j == 0) {
            unsigned long long *list = (unsigned long long *)hist;
            topk_from_list(list, min(s_cnt, TOPK_THREADS), k, cand, sel, list + TOPK_THREADS);
            if (t == 0) a.nsel[h] = k;
        }
        return;
    }
    r -= s_above;
    pass([&](uint32_t key) {
        if (key >> 20 > d1) gt++;
        else if (key >> 20 == d1) atomicAdd(&h2[(key >> 10) & 1023], 1);
    });
    cl.sync();
    cluster_hist_sum(cl, h2, hist, 1024);
    find_digit<DIG_PER>(hist, r, red, &s_d, &s_above, &s_in);
    const uint32_t p22 = d1 << 10 | (uint32_t)s_d; // the k-th key's first 22 bits
    r -= s_above;
    pass([&](uint32_t key) {
        if (key >> 20 != d1) return;
        if (key >> 10 > p22) gt++;
        else if (key >> 10 == p22) atomicAdd(&h3[key & 1023], 1);
    });
    cl.sync();
    cluster_hist_sum(cl, h3, hist, 1024);
    find_digit<DIG_PER>(hist, r, red, &s_d, &s_above, &s_in);
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
    int *out = sel + G0 + min(E0, r);
    if (in_smem) keys_write_ordered(keys, m, T, quota, out, red, [&](int i) { return cand[lo + i]; });
    else write_ordered(est, cand, out, lo, hi, T, quota, red64);
    if (j == 0 && t == 0) a.nsel[h] = k;
    cl.sync(); // peers may still read s_gt / s_eq
}


// Blocks of a kernel resident per SM (its registers and shared memory decide), once per kernel.
template <typename Kernel> static int resident(Kernel k, int threads, int fallback) {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k, threads, 0) != cudaSuccess || b < 1) b = fallback;
    return b;
}
enum { K_VOTE, K_RERANK, K_CAND_RERANK };
template <int B> static int resident_of(int kernel) {
    static const int vote = resident(pkv_vote_kernel<B>, SEL_THREADS, 4), rr = resident(pkv_rerank_kernel<B>, SEL_THREADS, 2),
                     cr = resident(pkv_cand_rerank_kernel<B>, SEL_THREADS, 2);
    return kernel == K_VOTE ? vote : kernel == K_RERANK ? rr : cr;
}

// Blocks per KV head of the vote (P), the rerank of the five-kernel selection and the candidates +
// rerank kernel (R): those of all heads in one wave of resident blocks (equal shares: a second,
// partial wave would add its whole length), at least 256 slots (candidates) each at full
// capacity; P at most MAX_P, R at most P (each block takes whole vote blocks). The first call
// (pkv_gpu_scratch_alloc) queries the occupancies, so that none runs inside a stream capture.
static int blocks_per_head(int n_kv, int B, int cap, int kernel) {
    int per_sm = B == 8 ? resident_of<8>(kernel) : B == 16 ? resident_of<16>(kernel) : resident_of<32>(kernel);
    int p = per_sm * sm_count() / n_kv, most = (cap + 255) / 256;
    p = p < most ? p : most;
    if (kernel != K_RERANK) p = p < MAX_P ? p : MAX_P;
    if (kernel == K_CAND_RERANK) {
        int P = blocks_per_head(n_kv, B, cap, K_VOTE);
        p = p < P ? p : P;
    }
    return p > 0 ? p : 1;
}

// The top-k's dynamic shared memory (the one-block path's keys), allowed once per device: a
// kernel's attribute belongs to the current device, and with --gpus N each GPU's thread launches
// it (set once per process, another GPU's launches failed). The first call on a device is
// pkv_gpu_scratch_alloc's (pkv_staged_vote_blocks), outside any capture.
#define TOPK_SMEM (TOPK_ONE_BLOCK * sizeof(uint32_t))
static cudaError_t topk_smem_allowed(void) {
    static std::atomic<bool> done[64];
    int dev = 0;
    CU_TRY(cudaGetDevice(&dev));
    if (dev < 64 && done[dev].load()) return cudaSuccess;
    CU_TRY(cudaFuncSetAttribute(pkv_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)TOPK_SMEM));
    CU_TRY(cudaFuncSetAttribute(pkv_topk1_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)TOPK_SMEM));
    if (dev < 64) done[dev].store(true);
    return cudaSuccess;
}

// Whether every step of this capacity has at most TOPK_ONE_BLOCK candidates a head: C = min(max(
// ceil(beta n), k), n) for n <= cap, beta from the schedule (0.5, 0.25, 0.2 below 5,000, 10,000,
// 30,000 keys, then 0.1: at most max(6,000, cap / 10)) unless both beta and rho are given.
static bool topk_one_block_always(const PkvSelArgs &a) {
    double most = a.beta > 0.0f && a.rho > 0.0f ? ceil((double)a.beta * a.cap) : fmax(6000.0, ceil(0.1 * a.cap));
    most = fmin(fmax(most + 1.0, (double)a.kmax), (double)a.cap); // + 1: the decimal rounding of beta
    return most <= TOPK_ONE_BLOCK;
}

int pkv_staged_vote_blocks(int n_kv, int B, int cap) {
    if (topk_smem_allowed() != cudaSuccess) cudaGetLastError(); // pkv_select_staged tries again and returns the error
    return blocks_per_head(n_kv, B, cap, K_VOTE);
}
int pkv_cand_rerank_blocks(int n_kv, int B, int cap) { return blocks_per_head(n_kv, B, cap, K_CAND_RERANK); }

template <int B> static cudaError_t launch_select(PkvSelArgs a, cudaStream_t st) {
    dim3 per_head(a.P, a.n_kv);
    CU_TRY(launch_pdl(pkv_bonus_kernel, dim3(B, a.n_kv), dim3(SEL_THREADS), 0, st, a));
    CU_TRY(launch_pdl(pkv_vote_kernel<B>, per_head, dim3(SEL_THREADS), 0, st, a));
    if (!a.five) {
        CU_TRY(launch_pdl(pkv_cand_rerank_kernel<B>, dim3(a.R, a.n_kv), dim3(SEL_THREADS), 0, st, a));
        if (topk_one_block_always(a)) return launch_pdl(pkv_topk1_kernel, dim3(a.n_kv), dim3(TOPK_THREADS), TOPK_SMEM, st, a);
        return launch_pdl(pkv_topk_kernel, dim3(TOPK_CLUSTER, a.n_kv), dim3(TOPK_THREADS), TOPK_SMEM, st, a);
    }
    a.R = blocks_per_head(a.n_kv, B, a.cap, K_RERANK);
    CU_TRY(launch_pdl(pkv_compact_kernel, per_head, dim3(SEL_THREADS), 0, st, a));
    CU_TRY(launch_pdl(pkv_rerank_kernel<B>, dim3(a.R, a.n_kv), dim3(SEL_THREADS), 0, st, a));
    return launch_pdl(pkv_topk_kernel, dim3(TOPK_CLUSTER, a.n_kv), dim3(TOPK_THREADS), TOPK_SMEM, st, a);
}

cudaError_t pkv_select_staged(PkvSelArgs a, cudaStream_t st) {
    CU_TRY(topk_smem_allowed());
    switch (a.B) {
    case 8: return launch_select<8>(a, st);
    case 16: return launch_select<16>(a, st);
    case 32: return launch_select<32>(a, st);
    }
    return cudaErrorInvalidValue;
}
