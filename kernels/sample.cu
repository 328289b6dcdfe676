// The sampler on the GPU (sample.h) as a fixed sequence of kernels: G blocks (at most GMAX, a
// slice of consecutive ids each) for the passes over the vocabulary, and the decisions taken by
// the last block to finish a pass (a ticket counter in scratch; it sees every other block's
// writes), so the launches are the same for every setting and every step:
//   k_pen (only with a penalty list; one block): the penalties, read once from the list.
//   k_max: the block's largest rank value R = key << 32 | ~id (larger R ranks first, so ties go
//     to lower ids) and first non-finite index -> partials; block 0 clears the control struct,
//     all blocks the histograms (when top-k or top-p is on).
//   k_exp: every block reduces the partials (non-finite or greedy: block 0 writes out, the rest
//     of the pipeline finds nothing to do); p = softmax_exp((l - m) / T) into scratch, the sums
//     of P and min-p's count (global integer atomics), and with top-k or top-p a histogram of the
//     top 16 bits of R (65,536 bins of count and P, global atomics) beside one of the top 8 bits
//     (256 bins, gathered in shared memory first). Last block: the totals; with top-k (or top-p
//     alone) the bin holding the first boundary (the coarse histogram, then the 256 fine bins of
//     its coarse bin), else the final cut.
//   k_compact (stage 0, 1): the (R, P) of every token in the stage's bin appended to a list.
//     Last block: the exact cut inside the list (a radix select on R's low 48 bits, 8 at a time,
//     with the count and P of the tokens above the bin); after top-k, top-p's target top_p * Z_K
//     located in the histograms: in the same bin it is resolved in the same list, else stage 1
//     gathers its bin. The final cut is min(top-k, top-p, min-p) as the definition says, Z_S,
//     r = floor(u * Z_S).
//   k_draw: each block's sum of P over the kept tokens of its slice. Last block: the block whose
//     range holds r (a scan of the partials), then its slice scanned in id order for the first id
//     whose running sum exceeds r -> out (one writer).
// Launched with programmatic dependent launch (pdl.h): each kernel waits for the one before at
// its start. A kernel with nothing to do for the setting (flags in the control struct, cleared by k_max)
// returns at once. All sums are integers (P = p * 2^40), so the order of atomics changes
// nothing. Every floating-point step is written with _rn intrinsics (no contraction into FMA),
// the same IEEE operations as the CPU's in the same order: p, and so the id, are the CPU's bit
// for bit.
// Why one file of ~580 lines: the five kernels are one pipeline over one scratch layout and one
// control struct (the last block of each pass hands the next its decisions); apart, the layout
// would be written twice.
#include <stdint.h>

#include "cuda_common.h"
#include "pdl.h"
#include "sample.h"

#define THREADS 512
#define WARPS (THREADS / 32)
#define GMAX 256     // blocks of the passes over the vocabulary
#define COPIES 8
#define STRIDE 257   // a copy's 256 counters, padded so copies start in different banks
#define NFINE 65536  // bins of R's top 16 bits
#define NCOARSE 256  // bins of R's top 8 bits

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

// Block-wide reductions (THREADS threads); red: WARPS entries of shared memory.
__device__ u64 block_max_u64(u64 v, u64 *red) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < WARPS; w++) v = max(v, red[w]);
    return v;
}
__device__ u64 block_sum_u64(u64 v, u64 *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = 0;
    for (int w = 0; w < WARPS; w++) v += red[w];
    return v;
}
// The sum over threads before this one (in thread order); *total: the sum over all.
__device__ u64 block_exclusive_u64(u64 v, u64 *red, u64 *total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        u64 y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    __syncthreads();
    if (lane == 31) red[warp] = inc;
    __syncthreads();
    u64 before = 0, all = 0;
    for (int w = 0; w < WARPS; w++) {
        if (w < warp) before += red[w];
        all += red[w];
    }
    *total = all;
    return before + inc - v;
}

enum { KEEP_ALL, KEEP_BY_P, KEEP_BY_R };
enum { TARGET_K, TARGET_P };

// The first s tokens in rank order.
struct Cut {
    int s;
    u64 r;    // the rank value of the last
    u64 mass; // their P sum
};

// Per-step state in scratch, zeroed by k_max's block 0 (so by default every later kernel has
// nothing to do), written by the last blocks.
struct Ctrl {
    unsigned arrive[4]; // tickets of k_exp, k_compact 0 and 1, k_draw (the last block resets its own)
    u64 z, z_min, n_min; // the sum of P; over p >= min_p; their count
    u64 best;           // the largest rank value
    int best_id;
    int on[2];          // k_compact stage s gathers the tokens of bin[s]
    int bin[2];
    unsigned list_n[2];
    // the cut that stage s resolves: count or P target, with the tokens above its bin
    int kind, by_mass;
    u64 count;
    double mass;
    u64 c_above, m_above;
    Cut kcut;           // top-k's, once resolved
    // the draw
    int draw_on, keep;
    u64 cut_r, r;
};

struct Scratch {
    float *prob;        // n
    Ctrl *ctrl;
    u64 *best_part, *bad_part, *draw_part; // GMAX each (bad_part: ~index, 0 for none)
    uint32_t *fine_c, *coarse_c;           // NFINE, NCOARSE
    u64 *fine_m, *coarse_m;
    u64 *list_r, *list_p; // n each
};

static size_t align256(size_t x) { return (x + 255) / 256 * 256; }

static size_t scratch_layout(int n, char *base, Scratch *s) {
    size_t o = 0;
    size_t at[10], sz[10] = {(size_t)n * sizeof(float), sizeof(Ctrl), GMAX * 8, GMAX * 8, GMAX * 8, NFINE * 4, NCOARSE * 4,
                             NFINE * 8, NCOARSE * 8, (size_t)n * 8};
    for (int j = 0; j < 10; j++) at[j] = o, o += align256(sz[j]);
    size_t list_p = o;
    o += align256((size_t)n * 8);
    if (s) {
        s->prob = (float *)(base + at[0]), s->ctrl = (Ctrl *)(base + at[1]);
        s->best_part = (u64 *)(base + at[2]), s->bad_part = (u64 *)(base + at[3]), s->draw_part = (u64 *)(base + at[4]);
        s->fine_c = (uint32_t *)(base + at[5]), s->coarse_c = (uint32_t *)(base + at[6]);
        s->fine_m = (u64 *)(base + at[7]), s->coarse_m = (u64 *)(base + at[8]);
        s->list_r = (u64 *)(base + at[9]), s->list_p = (u64 *)(base + list_p);
    }
    return o;
}

// The slice of ids of block b.
__device__ __forceinline__ void slice(int n, int *lo, int *hi) {
    int chunk = (n + (int)gridDim.x - 1) / (int)gridDim.x;
    *lo = min(n, (int)blockIdx.x * chunk), *hi = min(n, *lo + chunk);
}
__device__ __forceinline__ int hist_on(const SampleParams &sp) {
    return sp.temperature > 0.0f && ((sp.top_k > 0 && sp.top_k < sp.n_valid) || sp.top_p < 1.0f);
}

// Shared memory of the decisions.
struct Shared {
    uint32_t hc[COPIES * STRIDE];
    u64 hm[COPIES * STRIDE];
    uint32_t dc[256];
    u64 dm[256];
    u64 red[WARPS];
    // find_digit's outcome: the digit, its count, the count and P of the tokens ranked before it
    int digit;
    uint32_t in_digit;
    u64 c0, m0, r, p;
    int last;   // this block is the last of its kernel
    int blk;    // the draw: the block whose range holds r
    u64 base;
    int pick;
};

// Whether this block is the last of the kernel to get here; then it sees the others' writes
// (read them with __ldcg: L1 is not coherent). Called by every thread.
__device__ int last_block(unsigned *ticket, Shared *sh) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned t = atomicAdd(ticket, 1u);
        sh->last = t == gridDim.x - 1;
        if (sh->last) *ticket = 0; // every other block has taken its ticket
    }
    __syncthreads();
    if (!sh->last) return 0;
    __threadfence();
    return 1;
}

// Among the 256 digits sh->dc / sh->dm, in rank order (larger digits first), the one holding the
// target given the count c0 and P m0 ranked before them: the first where the running count
// reaches `count` (by_mass 0), or the running P sum, in double, reaches `mass`. Outcome in sh.
// Called by every thread (warp 0 works).
__device__ void find_digit(u64 c0, u64 m0, int by_mass, u64 count, double mass, Shared *sh) {
    const int tid = threadIdx.x, lane = tid & 31;
    __syncthreads();
    if (tid < 32) { // lane L: digits 255 - 8L down to 248 - 8L
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
            int reached = by_mass ? (double)(cm + sh->dm[d]) >= mass : cc + sh->dc[d] >= count;
            if (reached) {
                hit = d;
                break;
            }
            cc += sh->dc[d], cm += sh->dm[d];
        }
        unsigned found = __ballot_sync(0xffffffffu, hit >= 0);
        // the target lies within the candidates (count <= their number, mass <= their P), so
        // some lane finds it; the first such lane holds the first digit
        if (found && lane == __ffs(found) - 1) sh->digit = hit, sh->in_digit = sh->dc[hit], sh->c0 = cc, sh->m0 = cm;
        if (!found && lane == 0) sh->digit = 0, sh->in_digit = 1, sh->c0 = c0, sh->m0 = m0; // not reached
    }
    __syncthreads();
}

// The fine bin holding a target (the coarse histogram, then the 256 fine bins of the coarse bin
// found) and the count and P of the tokens in the bins above it.
struct Bin {
    int bin;
    u64 c_above, m_above;
};
__device__ Bin locate(const Scratch &S, int by_mass, u64 count, double mass, Shared *sh) {
    const int tid = threadIdx.x;
    __syncthreads();
    if (tid < 256) sh->dc[tid] = __ldcg(S.coarse_c + tid), sh->dm[tid] = __ldcg(S.coarse_m + tid);
    find_digit(0, 0, by_mass, count, mass, sh);
    const int D = sh->digit;
    const u64 c0 = sh->c0, m0 = sh->m0;
    __syncthreads();
    if (tid < 256) sh->dc[tid] = __ldcg(S.fine_c + D * 256 + tid), sh->dm[tid] = __ldcg(S.fine_m + D * 256 + tid);
    find_digit(c0, m0, by_mass, count, mass, sh);
    Bin b = {D << 8 | sh->digit, sh->c0, sh->m0};
    __syncthreads();
    return b;
}

// The cut inside a list of m tokens (rank values lr, P lp) of one fine bin, given what lies above
// the bin: a radix select on R's low 48 bits, 8 at a time, stopping once one token is left.
__device__ Cut resolve(const u64 *lr, const u64 *lp, int m, u64 c0, u64 m0, int by_mass, u64 count, double mass, Shared *sh) {
    const int tid = threadIdx.x;
    u64 prefix = 0, pmask = 0;
    for (int shift = 40; shift >= 0; shift -= 8) {
        __syncthreads();
        for (int j = tid; j < COPIES * STRIDE; j += THREADS) sh->hc[j] = 0, sh->hm[j] = 0;
        __syncthreads();
        const int copy = (tid & (COPIES - 1)) * STRIDE;
        for (int j = tid; j < m; j += THREADS) {
            u64 R = __ldcg(lr + j);
            if ((R & pmask) == prefix) {
                int d = (int)(R >> shift) & 255;
                atomicAdd(&sh->hc[copy + d], 1u);
                atomicAdd(&sh->hm[copy + d], __ldcg(lp + j));
            }
        }
        __syncthreads();
        if (tid < 256) {
            uint32_t c = 0;
            u64 s = 0;
            for (int k = 0; k < COPIES; k++) c += sh->hc[k * STRIDE + tid], s += sh->hm[k * STRIDE + tid];
            sh->dc[tid] = c, sh->dm[tid] = s;
        }
        find_digit(c0, m0, by_mass, count, mass, sh);
        prefix |= (u64)sh->digit << shift, pmask |= (u64)255 << shift;
        c0 = sh->c0, m0 = sh->m0;
        uint32_t left = sh->in_digit;
        __syncthreads(); // sh is written again
        if (left <= 1) break;
    }
    // the one token left (R are distinct)
    for (int j = tid; j < m; j += THREADS) {
        u64 R = __ldcg(lr + j);
        if ((R & pmask) == prefix) sh->r = R, sh->p = __ldcg(lp + j);
    }
    __syncthreads();
    Cut c = {(int)c0 + 1, sh->r, m0 + sh->p};
    __syncthreads();
    return c;
}

// The final cut: the smallest of top-k (kc), top-p (pc) and min-p, Z_S, r; the draw turned on.
// Thread 0 only.
__device__ void finalize(const SampleParams &sp, const float *u, Ctrl *c, const Cut *kc, const Cut *pc) {
    const int n = sp.n_valid;
    const u64 z = __ldcg(&c->z), z_min = __ldcg(&c->z_min), n_min = __ldcg(&c->n_min);
    const int s_m = sp.min_p > 0.0f ? (n_min > 0 ? (int)n_min : 1) : n;
    // min-p's kept set is {p >= min_p} itself (p falls along rank order); past 1 no p reaches
    // it and the one best token is kept
    Cut cut = {n, 0, z};
    int keep = KEEP_ALL;
    if (s_m < n) cut.s = s_m, cut.mass = z_min, keep = KEEP_BY_P;
    if (sp.min_p > 0.0f && n_min == 0) cut.s = 1, cut.r = c->best, cut.mass = fixed40(1.0f), keep = KEEP_BY_R;
    if (kc || pc) {
        Cut k = {n, 0, z};
        if (kc) k = *kc;
        if (pc && pc->s < k.s) k = *pc;
        if (k.s < cut.s) cut = k, keep = KEEP_BY_R;
    }
    u64 r = (u64)((double)*u * (double)cut.mass);
    if (r >= cut.mass) r = cut.mass - 1;
    c->keep = keep, c->cut_r = cut.r, c->r = r, c->draw_on = 1;
}

// Stage s's bin to gather (kind: the cut it resolves), or the final cut when none is needed.
__device__ void plan(const Scratch &S, int stage, int kind, int by_mass, u64 count, double mass, Shared *sh) {
    Bin b = locate(S, by_mass, count, mass, sh);
    if (threadIdx.x == 0) {
        Ctrl *c = S.ctrl;
        c->on[stage] = 1, c->bin[stage] = b.bin, c->kind = kind, c->by_mass = by_mass, c->count = count, c->mass = mass;
        c->c_above = b.c_above, c->m_above = b.m_above;
    }
}

__global__ void __launch_bounds__(THREADS) k_pen(float *l, SampleParams sp, const int *pen) {
    pdl_wait(); // nothing is touched before the previous kernel is done
    pdl_release();
    __shared__ int n_pen;
    const int n = sp.n_valid;
    if (threadIdx.x == 0) n_pen = pen[0];
    __syncthreads();
    const int k = n_pen;
    for (int j = threadIdx.x; j < k; j += THREADS) { // distinct ids: no two threads touch one logit
        int id = pen[1 + j], c = pen[1 + k + j];
        if (id < 0 || id >= n) continue;
        float v = l[id];
        if (sp.repeat != 1.0f) v = v > 0.0f ? __fdiv_rn(v, sp.repeat) : __fmul_rn(v, sp.repeat);
        l[id] = __fsub_rn(__fsub_rn(v, sp.presence), __fmul_rn(sp.frequency, (float)c));
    }
}

__global__ void __launch_bounds__(THREADS, 2) k_max(const float *l, SampleParams sp, Scratch S) {
    pdl_wait(); // nothing is touched before the previous kernel is done
    pdl_release();
    __shared__ u64 red[WARPS];
    const int tid = threadIdx.x;
    if (blockIdx.x == 0)
        for (int j = tid; j < (int)(sizeof(Ctrl) / 4); j += THREADS) ((uint32_t *)S.ctrl)[j] = 0;
    if (hist_on(sp)) {
        for (int j = blockIdx.x * THREADS + tid; j < NFINE; j += gridDim.x * THREADS) S.fine_c[j] = 0, S.fine_m[j] = 0;
        if (blockIdx.x == gridDim.x - 1 && tid < NCOARSE) S.coarse_c[tid] = 0, S.coarse_m[tid] = 0;
    }
    int lo, hi;
    slice(sp.n_valid, &lo, &hi);
    u64 best = 0, bad = 0; // bad: ~ the first non-finite index, 0 for none
    for (int i = lo + tid; i < hi; i += THREADS) {
        float v = l[i];
        if (!isfinite(v)) bad = max(bad, ~(u64)i);
        best = max(best, rank_value(l, i));
    }
    best = block_max_u64(best, red);
    bad = block_max_u64(bad, red);
    if (tid == 0) S.best_part[blockIdx.x] = best, S.bad_part[blockIdx.x] = bad;
}

__global__ void __launch_bounds__(THREADS, 2) k_exp(const float *l, SampleParams sp, const float *u, int *out, Scratch S) {
    pdl_wait(); // nothing is touched before the previous kernel is done
    pdl_release();
    __shared__ Shared sh;
    __shared__ uint32_t cc[NCOARSE];
    __shared__ u64 cm[NCOARSE];
    const int tid = threadIdx.x, n = sp.n_valid, G = gridDim.x;
    u64 best = 0, bad = 0;
    for (int j = tid; j < G; j += THREADS) best = max(best, S.best_part[j]), bad = max(bad, S.bad_part[j]);
    best = block_max_u64(best, sh.red);
    bad = block_max_u64(bad, sh.red);
    if (bad) { // the later kernels find nothing to do
        if (blockIdx.x == 0 && tid == 0) out[0] = 0, out[1] = (int)~bad;
        return;
    }
    const int best_id = (int)(0xFFFFFFFFu - (uint32_t)best);
    if (sp.temperature <= 0.0f) {
        if (blockIdx.x == 0 && tid == 0) out[0] = best_id, out[1] = -1;
        return;
    }
    const int hist = hist_on(sp);
    if (hist && tid < NCOARSE) cc[tid] = 0, cm[tid] = 0;
    __syncthreads();
    const float m = l[best_id], t = sp.temperature, min_p = sp.min_p;
    int lo, hi;
    slice(n, &lo, &hi);
    // p, the sum of P, min-p's count and sum, the histograms
    u64 z = 0, z_min = 0, n_min = 0;
    for (int i = lo + tid; i < hi; i += THREADS) {
        float p = sexp(__fdiv_rn(__fsub_rn(l[i], m), t));
        S.prob[i] = p;
        u64 P = fixed40(p);
        z += P;
        if (p >= min_p) z_min += P, n_min++;
        if (hist) {
            u64 R = rank_value(l, i);
            int b = (int)(R >> 48);
            atomicAdd(&S.fine_c[b], 1u);
            if (P) atomicAdd(&S.fine_m[b], P);
            atomicAdd(&cc[b >> 8], 1u);
            if (P) atomicAdd(&cm[b >> 8], P);
        }
    }
    z = block_sum_u64(z, sh.red);
    z_min = block_sum_u64(z_min, sh.red);
    n_min = block_sum_u64(n_min, sh.red);
    Ctrl *c = S.ctrl;
    if (tid == 0) {
        if (z) atomicAdd(&c->z, z);
        if (z_min) atomicAdd(&c->z_min, z_min);
        if (n_min) atomicAdd(&c->n_min, n_min);
    }
    if (hist && tid < NCOARSE && cc[tid]) { // cc is complete: block_sum's barriers
        atomicAdd(&S.coarse_c[tid], cc[tid]);
        if (cm[tid]) atomicAdd(&S.coarse_m[tid], cm[tid]);
    }
    if (!last_block(&c->arrive[0], &sh)) return;
    // the totals; the first boundary's bin, else the final cut
    if (tid == 0) c->best = best, c->best_id = best_id;
    const int need_k = sp.top_k > 0 && sp.top_k < n, need_p = sp.top_p < 1.0f;
    if (need_k) plan(S, 0, TARGET_K, 0, (u64)sp.top_k, 0, &sh);
    else if (need_p) {
        double target = (double)sp.top_p * (double)__ldcg(&c->z); // Z_K = Z
        if (target > 0) plan(S, 0, TARGET_P, 1, 0, target, &sh);
        else plan(S, 0, TARGET_P, 0, 1, 0, &sh);
    } else if (tid == 0)
        finalize(sp, u, c, NULL, NULL);
}

// Stage s: the tokens of bin[s] into the list; the last block resolves the cut.
__global__ void __launch_bounds__(THREADS, 2) k_compact(const float *l, SampleParams sp, const float *u, Scratch S, int stage) {
    pdl_wait(); // nothing is touched before the previous kernel is done
    pdl_release();
    __shared__ Shared sh;
    Ctrl *c = S.ctrl;
    if (!c->on[stage]) return;
    const int tid = threadIdx.x, lane = tid & 31, bin = c->bin[stage];
    int lo, hi;
    slice(sp.n_valid, &lo, &hi);
    for (int base = lo; base < hi; base += THREADS) { // whole warps, for the ballot
        int i = base + tid;
        u64 R = i < hi ? rank_value(l, i) : 0;
        int in = i < hi && (int)(R >> 48) == bin;
        unsigned mask = __ballot_sync(0xffffffffu, in);
        if (!mask) continue;
        int leader = __ffs(mask) - 1;
        unsigned pos = 0;
        if (lane == leader) pos = atomicAdd(&c->list_n[stage], (unsigned)__popc(mask));
        pos = __shfl_sync(0xffffffffu, pos, leader) + __popc(mask & ((1u << lane) - 1));
        if (in) S.list_r[pos] = R, S.list_p[pos] = fixed40(S.prob[i]);
    }
    if (!last_block(&c->arrive[1 + stage], &sh)) return;
    const int m = (int)__ldcg(&c->list_n[stage]), kind = c->kind;
    const u64 c_above = c->c_above, m_above = c->m_above;
    Cut cut = resolve(S.list_r, S.list_p, m, c_above, m_above, c->by_mass, c->count, c->mass, &sh);
    const int need_p = sp.top_p < 1.0f;
    if (kind == TARGET_P) { // the last cut
        if (tid == 0) {
            Cut k = c->kcut;
            finalize(sp, u, c, stage ? &k : NULL, &cut);
        }
        return;
    }
    // top-k resolved
    if (!need_p) {
        if (tid == 0) finalize(sp, u, c, &cut, NULL);
        return;
    }
    if (tid == 0) c->kcut = cut;
    double target = (double)sp.top_p * (double)cut.mass; // Z_K
    int by_mass = target > 0;
    u64 count = by_mass ? 0 : 1;
    Bin b = locate(S, by_mass, count, target, &sh);
    if (b.bin == bin) { // the same bin: the same list
        Cut p = resolve(S.list_r, S.list_p, m, b.c_above, b.m_above, by_mass, count, target, &sh);
        if (tid == 0) finalize(sp, u, c, &cut, &p);
    } else if (tid == 0) {
        c->on[1] = 1, c->bin[1] = b.bin, c->kind = TARGET_P, c->by_mass = by_mass, c->count = count, c->mass = target;
        c->c_above = b.c_above, c->m_above = b.m_above;
    }
}

__device__ __forceinline__ int kept(const float *l, const float *prob, int i, int keep, u64 cut_r, float min_p) {
    return keep == KEEP_ALL || (keep == KEEP_BY_P ? prob[i] >= min_p : rank_value(l, i) >= cut_r);
}

// The draw: the kept tokens in id order, the first whose running sum of P exceeds r.
__global__ void __launch_bounds__(THREADS, 2) k_draw(const float *l, SampleParams sp, int *out, Scratch S) {
    pdl_wait(); // nothing is touched before the previous kernel is done
    pdl_release();
    __shared__ Shared sh;
    Ctrl *c = S.ctrl;
    if (!c->draw_on) return;
    const int tid = threadIdx.x, keep = c->keep, G = gridDim.x;
    const u64 cut_r = c->cut_r, r = c->r;
    const float min_p = sp.min_p;
    int lo, hi;
    slice(sp.n_valid, &lo, &hi);
    u64 mine = 0;
    for (int i = lo + tid; i < hi; i += THREADS)
        if (kept(l, S.prob, i, keep, cut_r, min_p)) mine += fixed40(S.prob[i]);
    mine = block_sum_u64(mine, sh.red);
    if (tid == 0) S.draw_part[blockIdx.x] = mine;
    if (!last_block(&c->arrive[3], &sh)) return;
    // the block whose range holds r (G <= THREADS)
    if (tid == 0) sh.blk = -1, sh.pick = c->best_id; // replaced below (the scans' barriers order these)
    u64 v = tid < G ? __ldcg(S.draw_part + tid) : 0, total;
    u64 before = block_exclusive_u64(v, sh.red, &total);
    if (v && before <= r && r < before + v) sh.blk = tid, sh.base = before;
    __syncthreads();
    if (sh.blk >= 0) { // its slice, a block-wide scan at a time
        const int chunk = (sp.n_valid + G - 1) / G, b_lo = min(sp.n_valid, sh.blk * chunk), b_hi = min(sp.n_valid, b_lo + chunk);
        u64 cum = sh.base;
        for (int base = b_lo; base < b_hi; base += THREADS) {
            int i = base + tid;
            u64 P = i < b_hi && kept(l, S.prob, i, keep, cut_r, min_p) ? fixed40(S.prob[i]) : 0;
            u64 ex = block_exclusive_u64(P, sh.red, &total);
            if (P && cum + ex <= r && r < cum + ex + P) sh.pick = i;
            cum += total;
            if (cum > r) break; // uniform: found in this round
        }
    }
    __syncthreads();
    if (tid == 0) out[0] = sh.pick, out[1] = -1, c->draw_on = 0; // one writer: a host reading pinned memory sees one value
}

static int grid_for(int n) {
    int g = (n + THREADS - 1) / THREADS;
    return g < GMAX ? g : GMAX;
}

extern "C" size_t gpu_sample_scratch_bytes(int n_valid) { return scratch_layout(n_valid > 0 ? n_valid : 0, NULL, NULL); }

extern "C" cudaError_t gpu_sample(float *logits, const SampleParams *sp, const float *u, const int *pen, int *out, void *scratch,
                                  cudaStream_t st) {
    if (sp->n_valid < 1 || sp->n_valid > (1 << 22)) return cudaErrorInvalidValue;
    const SampleParams p = *sp;
    const int G = grid_for(p.n_valid);
    Scratch S;
    scratch_layout(p.n_valid, (char *)scratch, &S);
    // programmatic dependent launch: a kernel's blocks are placed while the one before drains
    // (each waits for it before touching memory), so the launches' latency overlaps
    const float *cl = logits;
    if (pen) CU_TRY(launch_pdl(k_pen, dim3(1), dim3(THREADS), 0, st, logits, p, pen));
    CU_TRY(launch_pdl(k_max, dim3(G), dim3(THREADS), 0, st, cl, p, S));
    CU_TRY(launch_pdl(k_exp, dim3(G), dim3(THREADS), 0, st, cl, p, u, out, S));
    CU_TRY(launch_pdl(k_compact, dim3(G), dim3(THREADS), 0, st, cl, p, u, S, 0));
    CU_TRY(launch_pdl(k_compact, dim3(G), dim3(THREADS), 0, st, cl, p, u, S, 1));
    CU_TRY(launch_pdl(k_draw, dim3(G), dim3(THREADS), 0, st, cl, p, out, S));
    return cudaSuccess;
}
