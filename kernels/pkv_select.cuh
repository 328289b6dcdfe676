// The selection's shared parts (pariskv_gpu.h): the argument block, the query transform, the
// schedule, and the device helpers whose arithmetic must equal attention/pariskv_*.c bit for bit
// (the vote's piece score, the estimate, the order-preserving keys). Included by the selection
// (pkv_select_staged.cu) and by the encoder (pariskv_gpu.cu: the reconstruction levels).
#ifndef PKV_SELECT_CUH
#define PKV_SELECT_CUH

#include "cuda_common.h"
#include "pariskv_gpu.h"
#include "pdl.h"

#include <cooperative_groups.h>
#include <cuda_fp16.h>

namespace cg = cooperative_groups;

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

static inline int sm_count(void) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 132;
    return sms;
}

// ---- query ----

// The query transform of KV head h into x (D floats of shared memory, every thread of the block
// calls it; threads j < D work): the group mean (heads in order, then / G), its norm (one
// thread, the D squares in order), normalize, signs, butterflies, 1 / sqrt(D). Returns the
// norm to every thread. As pkv_prepare_query on the group mean. sign: thread j's SRHT sign
// (the caller reads it early: it is constant). The G heads' values are read 8 at a time, all
// in flight, then added in order (one L2 round trip for G <= 8, not G).
static __device__ float query_transform(float *x, const float *q, float sign, int G, int D, int h) {
    __shared__ float s_inv, s_norm;
    int j = threadIdx.x;
    if (j < D) {
        float s = 0.0f;
        for (int g0 = 0; g0 < G; g0 += 8) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = g0 + u < G ? q[((size_t)h * G + g0 + u) * D + j] : 0.0f;
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (g0 + u < G) s = __fadd_rn(s, v[u]);
        }
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
    if (j < D) x[j] = __fmul_rn(__fmul_rn(x[j], s_inv), sign);
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
    const uint8_t *ids, *cw; // this layer's
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
    int R;    // rerank blocks per head
    int five; // the five-kernel selection (PKV_SELECT=five)
    int radix; // the cluster's top-k by radix passes only (PKV_TOPK_RADIX=1, to time it beside the list)
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


// Bitonic sort step over the block's threads, one 64-bit key a thread (thread t holds element
// t; n = a power of two, a multiple of 32, <= blockDim.x): stages inside a warp by shuffles, the
// others through xch (n keys of shared memory). Every thread of the block calls it (the
// barriers); threads t >= n keep their key. Ascending in t.
static __device__ unsigned long long bitonic_sort(unsigned long long key, int n, unsigned long long *xch) {
    const int t = threadIdx.x;
    for (int k = 2; k <= n; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            unsigned long long other;
            if (j >= 32) {
                __syncthreads(); // the previous stage's reads are done
                if (t < n) xch[t] = key;
                __syncthreads();
                other = t < n ? xch[t ^ j] : key;
            } else other = __shfl_xor_sync(0xffffffffu, key, j);
            bool keep_min = ((t & j) == 0) == ((t & k) == 0);
            unsigned long long lo = key < other ? key : other, hi = key < other ? other : key;
            if (t < n) key = keep_min ? lo : hi;
        }
    return key;
}

// The 256 patterns of a subspace in rank order, as pkv_bonus ranks them (score descending, the
// smaller id first among equal scores; fkey orders floats as their comparison does): thread
// c < 256 passes pattern c's score and gets the pattern of rank c. A sort, where counting each
// pattern's rank took 256 comparisons a thread. xch: 256 keys of shared memory.
static __device__ int rank_patterns(float s, unsigned long long *xch) {
    const int c = threadIdx.x;
    unsigned long long key = (unsigned long long)(~fkey(s)) << 32 | (unsigned)(c & 255);
    return (int)(bitonic_sort(key, 256, xch) & 255);
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

// The bonus tables in shared memory, in two formats that load different pipes (the vote is
// bound by its integer issue: ncu, the ALU pipe 79% busy at 1M with nibbles only):
// - nibbles: a subspace's 256 entries in 32 words (4 bits an entry; bonuses are 0..6), entry e
//   in word e & 31, nibble 7 - (e >> 5). They fill the 32 banks once, so a warp's lookups into
//   one subspace never conflict; rotating the word left by 4 (e >> 5) brings the entry to the
//   top nibble, where a shift fused with the add extracts it. Per id ~4.4 integer instructions
//   (the byte offset (e & 31) * 4 and the rotation from the id word, the rotate, the add).
// - bytes: 256 bytes, entry e at byte e. The load gives the entry: per id a PRMT and half an
//   add, but 64 words take two a bank, so a warp's load mostly costs two shared-memory passes.
// Of each 8 subspaces the first VoteTables::BYTES8 = 4 are bytes, which balances the integer pipe
// against the shared-memory pipe: the vote at 1M (H200) 54.0 us with nibbles only, 42.1-42.3 with
// 4 bytes of 8, 42.6-43.0 with 5, 43.2 with 6, 46.3-46.5 with bytes only (tests/bench/GPU.md,
// session 27).
// The tables of a group of up to 16 subspaces (B = 32: two groups, a lane's half of the slot
// uses one): the byte tables first, in subspace order, 256 bytes each, then the nibble tables,
// 128 bytes each. Offsets are compile-time, so each lookup's table is the load's immediate.
template <int B> struct VoteTables {
    static constexpr int BYTES8 = 4, G = B < 16 ? B : 16;
    __host__ __device__ static constexpr bool is_byte(int i) { return (i & 7) < BYTES8; }
    __host__ __device__ static constexpr int bytes_before(int i) { return (i >> 3) * BYTES8 + ((i & 7) < BYTES8 ? (i & 7) : BYTES8); }
    static constexpr int NBYTE = bytes_before(G);
    __host__ __device__ static constexpr int offset(int i) { return is_byte(i) ? 256 * bytes_before(i) : 256 * NBYTE + 128 * (i - bytes_before(i)); }
    static constexpr int GROUP = 256 * NBYTE + 128 * (G - NBYTE); // bytes of a group: a multiple of 256
    static constexpr int WORDS = GROUP / 4 * (B / G);             // of all groups
    static_assert(B == G || GROUP % 256 == 0, "the second group's tables 256-byte aligned");
};

// Score of one piece: the sum of its subspaces' bonuses. row: the shared-memory address of its
// group's tables, 256-byte aligned, so that PRMT puts an id's byte offset into the address's low
// byte in one instruction (the id itself for a byte table, (e & 31) * 4 for a nibble table) and
// the table comes as the load's immediate offset. Per id word w (4 ids): A holds the 4 word
// offsets (e & 31) * 4, M the 4 rotations (e >> 5) * 4 in the low 5 bits of each byte (funnel
// shifts use the amount mod 32).
template <typename VT, int WORDS> static __device__ __forceinline__ unsigned piece_score(const uint32_t (&wd)[WORDS], uint32_t row) {
    unsigned s = 0;
#pragma unroll
    for (int q = 0; q < WORDS; q++) {
        uint32_t w = wd[q], A = (w << 2) & 0x7c7c7c7cu, M = (w >> 3) & 0x1c1c1c1cu;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = 4 * q + j, off = VT::offset(i);
            if (VT::is_byte(i)) {
                const uint32_t addr = __byte_perm(w, row, 0x7650 + j); // row's upper bytes, the id
                s += ((const uint8_t *)__cvta_shared_to_generic(addr))[off];
            } else {
                const uint32_t addr = __byte_perm(A, row, 0x7650 + j); // row's upper bytes, A's byte j
                const uint32_t word = *(const uint32_t *)((const uint8_t *)__cvta_shared_to_generic(addr) + off);
                s += __funnelshift_l(word, word, M >> (8 * j)) >> 28;
            }
        }
    }
    return s;
}

// The vote's tables of head h's bonuses bs (B x 256 bytes) into tbl (VT::WORDS words); every
// thread of the block calls it.
template <typename VT, int B> static __device__ void vote_tables(uint32_t *tbl, const uint8_t *bs) {
    constexpr int PER = VT::G * 64; // word tasks a group: 64 a subspace (a nibble table's 32 take 8 bytes each)
    for (int task = threadIdx.x; task < (B / VT::G) * PER; task += blockDim.x) {
        const int g = task / PER, i = (task % PER) >> 6, c = task & 63, b = g * VT::G + i;
        uint32_t *t = tbl + (g * VT::GROUP + VT::offset(i)) / 4;
        if (VT::is_byte(i)) t[c] = *(const uint32_t *)(bs + b * 256 + 4 * c) & 0x0f0f0f0fu; // entries e = 4c .. 4c + 3
        else if (c < 32) {
            uint32_t v = 0;
#pragma unroll
            for (int m = 0; m < 8; m++) v |= (uint32_t)(bs[b * 256 + c + 32 * m] & 15) << (4 * (7 - m));
            t[c] = v;
        }
    }
}

// The calibrated estimate of one candidate, L = B / 4 lanes of it: each lane decodes 4
// subspaces (16 bytes of codes, 8 of w) into their w_b <v_b, qt_b>, and the sum over b runs
// in order through the lanes, as pkv_estimate.
template <int L>
static __device__ __forceinline__ float estimate(uint4 cv, uint2 wv, const float (&q)[32], float qn, const float *lev) {
    const uint32_t lev_s = (uint32_t)__cvta_generic_to_shared(lev); // 256-byte aligned
    const uint32_t cw[4] = {cv.x, cv.y, cv.z, cv.w}, ww[2] = {wv.x, wv.y};
    float p[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float d = 0.0f;
        // Level (cw >> 4 j) & 15 of the 256-byte aligned table: PRMT puts its byte offset (the
        // nibble x 4, from E for even j, O for odd) into the address's low byte.
        const uint32_t E = (cw[k] << 2) & 0x3c3c3c3cu, O = (cw[k] >> 2) & 0x3c3c3c3cu;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint32_t addr = __byte_perm(j & 1 ? O : E, lev_s, 0x7650 + (j >> 1));
            const float lv = *(const float *)__cvta_shared_to_generic(addr);
            d = __fadd_rn(d, __fmul_rn(lv, q[k * 8 + j]));
        }
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


// The selection for every B the index allows (8, 16, 32). a.P / a.hist_stride: the vote's
// blocks per head (pkv_staged_vote_blocks); a.R: pkv_cand_rerank_kernel's (pkv_cand_rerank_blocks).
int pkv_staged_vote_blocks(int n_kv, int B, int cap);
int pkv_cand_rerank_blocks(int n_kv, int B, int cap);
cudaError_t pkv_select_staged(PkvSelArgs a, cudaStream_t st);

#endif
