// The sampler on the GPU (sample.h): one block of 1024 threads, the vocabulary (<= 2^22 logits,
// 152K in practice) re-read from L2 on each pass:
//   penalties from the list; the max logit as the largest (key, -id) pair (greedy stops there)
//   and the first non-finite logit; p = softmax_exp((l - m) / T) into scratch with the sums of P
//   and the min-p count; top-k (by count) and top-p (by mass) as radix selects 8 bits at a time
//   on the 64-bit rank value R = key << 32 | ~id (larger R ranks first, so ties go to lower ids),
//   each level a histogram of counts and P in shared memory (8 copies by lane, so a warp's
//   lanes rarely meet on one counter), stopping once one token is left; the draw: each thread
//   sums P over a contiguous id range, a block scan, and the thread whose range holds r walks it.
// All sums are integers (P = p * 2^40), so the order of atomics changes nothing. Every
// floating-point step is written with _rn intrinsics (no contraction into FMA), the same IEEE
// operations as the CPU's in the same order: p, and so the id, are the CPU's bit for bit.
#include <stdint.h>

#include "cuda_common.h"
#include "sample.h"

#define THREADS 1024
#define COPIES 8
#define STRIDE 257 // a copy's 256 counters, padded so copies start in different banks

typedef unsigned long long u64;

// attention/softmax_exp.h, operation for operation
__device__ __forceinline__ float sexp(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    float xc = x > -87.0f ? (x < 88.0f ? x : 88.0f) : -87.0f;
    float n = __fsub_rn(__fadd_rn(__fmul_rn(xc, log2e), 12582912.0f), 12582912.0f);
    float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(n, ln2_hi)), __fmul_rn(n, ln2_lo));
    float p = __fadd_rn(1.0f / 720, __fmul_rn(r, 1.0f / 5040));
    p = __fadd_rn(1.0f / 120, __fmul_rn(r, p));
    p = __fadd_rn(1.0f / 24, __fmul_rn(r, p));
    p = __fadd_rn(1.0f / 6, __fmul_rn(r, p));
    p = __fadd_rn(0.5f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f, __fmul_rn(r, p));
    float scale = __uint_as_float((uint32_t)((int32_t)n + 127) << 23);
    return x >= -87.0f ? __fmul_rn(p, scale) : x < -87.0f ? 0.0f : x;
}

__device__ __forceinline__ uint32_t order_key(float f) {
    uint32_t b = __float_as_uint(__fadd_rn(f, 0.0f)); // -0 -> +0
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ u64 rank_value(const float *l, int i) {
    return (u64)order_key(l[i]) << 32 | (uint32_t)(0xFFFFFFFFu - (uint32_t)i);
}
// P = p * 2^40 rounded to nearest even (exact product in double)
__device__ __forceinline__ u64 fixed40(float p) { return __double2ull_rn((double)p * 0x1p40); }

// Block-wide reductions (THREADS threads); red: 32 entries of shared memory.
__device__ u64 block_max_u64(u64 v, u64 *red) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < THREADS / 32; w++) v = max(v, red[w]);
    return v;
}
__device__ u64 block_sum_u64(u64 v, u64 *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = 0;
    for (int w = 0; w < THREADS / 32; w++) v += red[w];
    return v;
}
// The sum over threads before this one (in thread order).
__device__ u64 block_exclusive_u64(u64 v, u64 *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        u64 y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    __syncthreads();
    if (lane == 31) red[warp] = inc;
    __syncthreads();
    u64 before = 0;
    for (int w = 0; w < warp; w++) before += red[w];
    return before + inc - v;
}

struct Shared {
    uint32_t hc[COPIES * STRIDE];
    u64 hm[COPIES * STRIDE];
    uint32_t dc[256];
    u64 dm[256];
    u64 red[32];
    // a level's outcome: the digit, the count and P of the tokens ranked before it, its count
    int digit;
    uint32_t in_digit;
    u64 c0, m0, r, p;
    float u;    // *u, read once (pinned host memory is a bus read per warp)
    int n_pen;  // pen[0], likewise
    int pick;   // the drawn id, written to out by one thread
};

// The first s tokens in rank order.
struct Cut {
    int s;
    u64 r;    // the rank value of the last
    u64 mass; // their P sum
};

// The prefix that a target ends: the first `count` tokens (by_mass 0), or the shortest whose P
// sum, in double, is >= mass. Called by every thread.
__device__ Cut select_prefix(const float *l, const float *prob, int n, int by_mass, int count, double mass, Shared *sh) {
    const int tid = threadIdx.x, lane = tid & 31;
    u64 prefix = 0, pmask = 0, c0 = 0, m0 = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int j = tid; j < COPIES * STRIDE; j += THREADS) sh->hc[j] = 0, sh->hm[j] = 0;
        __syncthreads();
        const int copy = (tid & (COPIES - 1)) * STRIDE;
        for (int i = tid; i < n; i += THREADS) {
            u64 R = rank_value(l, i);
            if ((R & pmask) == prefix) {
                int d = (int)(R >> shift) & 255;
                atomicAdd(&sh->hc[copy + d], 1u);
                atomicAdd(&sh->hm[copy + d], fixed40(prob[i]));
            }
        }
        __syncthreads();
        if (tid < 256) {
            uint32_t c = 0;
            u64 m = 0;
            for (int k = 0; k < COPIES; k++) c += sh->hc[k * STRIDE + tid], m += sh->hm[k * STRIDE + tid];
            sh->dc[tid] = c, sh->dm[tid] = m;
        }
        __syncthreads();
        if (tid < 32) { // lane L: digits 255 - 8L down to 248 - 8L (rank order: larger first)
            u64 lc = 0, lm = 0;
            for (int j = 0; j < 8; j++) lc += sh->dc[255 - 8 * lane - j], lm += sh->dm[255 - 8 * lane - j];
            u64 ic = lc, im = lm; // inclusive scans over lanes
            for (int o = 1; o < 32; o <<= 1) {
                u64 yc = __shfl_up_sync(0xffffffffu, ic, o), ym = __shfl_up_sync(0xffffffffu, im, o);
                if (lane >= o) ic += yc, im += ym;
            }
            u64 cc = c0 + ic - lc, cm = m0 + im - lm;
            int hit = -1;
            for (int j = 0; j < 8; j++) {
                int d = 255 - 8 * lane - j;
                int reached = by_mass ? (double)(cm + sh->dm[d]) >= mass : cc + sh->dc[d] >= (u64)count;
                if (reached) {
                    hit = d;
                    break;
                }
                cc += sh->dc[d], cm += sh->dm[d];
            }
            unsigned found = __ballot_sync(0xffffffffu, hit >= 0);
            // the target lies within the candidates (by induction from count <= n and
            // mass <= Z), so some lane finds it; the first such lane holds the first digit
            if (found && lane == __ffs(found) - 1) sh->digit = hit, sh->in_digit = sh->dc[hit], sh->c0 = cc, sh->m0 = cm;
            if (!found && lane == 0) sh->digit = 0, sh->in_digit = 1, sh->c0 = c0, sh->m0 = m0; // not reached
        }
        __syncthreads();
        prefix |= (u64)sh->digit << shift, pmask |= (u64)255 << shift;
        c0 = sh->c0, m0 = sh->m0;
        uint32_t left = sh->in_digit;
        __syncthreads(); // sh is written again by the next level
        if (left <= 1) break;
    }
    // the one token left
    for (int i = tid; i < n; i += THREADS) {
        u64 R = rank_value(l, i);
        if ((R & pmask) == prefix) sh->r = R, sh->p = fixed40(prob[i]);
    }
    __syncthreads();
    Cut c = {(int)c0 + 1, sh->r, m0 + sh->p};
    __syncthreads();
    return c;
}

enum { KEEP_ALL, KEEP_BY_P, KEEP_BY_R };

__global__ void __launch_bounds__(THREADS) sample_kernel(float *l, SampleParams sp, const float *u, const int *pen, int *out,
                                                         float *prob) {
    __shared__ Shared sh;
    const int tid = threadIdx.x, n = sp.n_valid;
    if (tid == 0) sh.u = *u, sh.n_pen = pen ? pen[0] : 0;
    __syncthreads();
    // penalties: distinct ids, so no two threads touch one logit
    if (sh.n_pen > 0) {
        int k = sh.n_pen;
        for (int j = tid; j < k; j += THREADS) {
            int id = pen[1 + j], c = pen[1 + k + j];
            if (id < 0 || id >= n) continue;
            float v = l[id];
            if (sp.repeat != 1.0f) v = v > 0.0f ? __fdiv_rn(v, sp.repeat) : __fmul_rn(v, sp.repeat);
            l[id] = __fsub_rn(__fsub_rn(v, sp.presence), __fmul_rn(sp.frequency, (float)c));
        }
        __syncthreads();
    }
    // the max (largest rank value: the lowest id among equal logits) and the first non-finite
    u64 best = 0, bad = ~0ull;
    for (int i = tid; i < n; i += THREADS) {
        float v = l[i];
        if (!isfinite(v)) bad = min(bad, (u64)i);
        best = max(best, rank_value(l, i));
    }
    bad = ~block_max_u64(~bad, sh.red);
    if (bad != ~0ull) {
        if (tid == 0) out[0] = 0, out[1] = (int)bad;
        return;
    }
    best = block_max_u64(best, sh.red);
    const int best_id = (int)(0xFFFFFFFFu - (uint32_t)best);
    if (sp.temperature <= 0.0f) {
        if (tid == 0) out[0] = best_id, out[1] = -1;
        return;
    }
    const float m = l[best_id], t = sp.temperature, min_p = sp.min_p;
    // p, the sum of P, min-p's count and sum
    u64 z = 0, z_min = 0, n_min = 0;
    for (int i = tid; i < n; i += THREADS) {
        float p = sexp(__fdiv_rn(__fsub_rn(l[i], m), t));
        prob[i] = p;
        u64 P = fixed40(p);
        z += P;
        if (p >= min_p) z_min += P, n_min++;
    }
    z = block_sum_u64(z, sh.red);
    z_min = block_sum_u64(z_min, sh.red);
    n_min = block_sum_u64(n_min, sh.red);
    __syncthreads(); // prob is read by other threads from here on
    const int s_k = sp.top_k > 0 && sp.top_k < n ? sp.top_k : n;
    const int s_m = min_p > 0.0f ? (n_min > 0 ? (int)n_min : 1) : n;
    // min-p's kept set is {p >= min_p} itself (p falls along rank order); past 1 no p reaches
    // it and the one best token is kept
    Cut cut = {n, 0, z};
    int keep = KEEP_ALL;
    if (s_m < n) cut.s = s_m, cut.mass = z_min, keep = KEEP_BY_P;
    if (min_p > 0.0f && n_min == 0) cut.s = 1, cut.r = best, cut.mass = fixed40(1.0f), keep = KEEP_BY_R;
    if (s_k < n || sp.top_p < 1.0f) {
        Cut k = {n, 0, z};
        if (s_k < n) k = select_prefix(l, prob, n, 0, s_k, 0, &sh);
        if (sp.top_p < 1.0f) {
            double target = (double)sp.top_p * (double)k.mass; // Z_K
            Cut p = target > 0 ? select_prefix(l, prob, n, 1, 0, target, &sh) : select_prefix(l, prob, n, 0, 1, 0, &sh);
            if (p.s < k.s) k = p;
        }
        if (k.s < cut.s) cut = k, keep = KEEP_BY_R;
    }
    // the draw: thread ranges of consecutive ids, in id order
    u64 r = (u64)((double)sh.u * (double)cut.mass);
    if (r >= cut.mass) r = cut.mass - 1;
    const int chunk = (n + THREADS - 1) / THREADS, lo = min(n, tid * chunk), hi = min(n, lo + chunk);
    u64 mine = 0;
    for (int i = lo; i < hi; i++) {
        int in = keep == KEEP_ALL || (keep == KEEP_BY_P ? prob[i] >= min_p : rank_value(l, i) >= cut.r);
        if (in) mine += fixed40(prob[i]);
    }
    if (tid == 0) sh.pick = best_id; // replaced below (the scan's barriers order the two)
    u64 before = block_exclusive_u64(mine, sh.red);
    if (mine && before <= r && r < before + mine) {
        u64 cum = before;
        for (int i = lo; i < hi; i++) {
            int in = keep == KEEP_ALL || (keep == KEEP_BY_P ? prob[i] >= min_p : rank_value(l, i) >= cut.r);
            if (in && (cum += fixed40(prob[i])) > r) {
                sh.pick = i;
                break;
            }
        }
    }
    __syncthreads();
    if (tid == 0) out[0] = sh.pick, out[1] = -1; // one writer: a host reading pinned memory sees one value
}

extern "C" size_t gpu_sample_scratch_bytes(int n_valid) { return ((size_t)(n_valid > 0 ? n_valid : 0) * sizeof(float) + 255) / 256 * 256; }

extern "C" cudaError_t gpu_sample(float *logits, const SampleParams *sp, const float *u, const int *pen, int *out, void *scratch,
                                  cudaStream_t st) {
    if (sp->n_valid < 1 || sp->n_valid > (1 << 22)) return cudaErrorInvalidValue;
    sample_kernel<<<1, THREADS, 0, st>>>(logits, *sp, u, pen, out, (float *)scratch);
    return cudaGetLastError();
}
