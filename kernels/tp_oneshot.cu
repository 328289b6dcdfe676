// The decode step's all-reduces over the GPUs' peer access (--gpus N): each rank writes its part
// of the residual straight into every peer's memory, then sums the N parts in rank order (the same
// order, so the same bits, on every rank) and, fused, writes bf16(x) and the sum of squares the
// next RMSNorm reads. One kernel where NCCL's all-reduce and the stats took two launches.
//
// The parts travel as NCCL's LL protocol has them: 16-byte lines of two floats, each float beside
// the call's number e, written with one 16-byte store (each 8-byte half lands whole). A reader
// polls its own memory until both halves of a line carry e: the data is its own flag, so no
// fence and no flag's second round trip over the link (session 14's flag version: ~7 us a sum,
// tests/bench/GPU.md). Launched with PDL: the next GEMV's blocks load their weights while this
// one waits for the peers; everything this kernel reads or writes comes after pdl_wait().
//
// Each rank's slots: 2 parities x N ranks x TP_ONESHOT_MAX / 2 lines. Call e (an epoch counted on
// each rank; every rank makes the same calls in the same order) uses parity e & 1: a rank can be
// one call ahead of a peer still reading call e - 1's slot, never two (to start call e + 1 it
// needs that peer's part of call e, written after the peer's call e - 1 ended).
//
// The same buffer holds the slots of the sums fused into the residual GEMVs (TpSum in kernels.h,
// gemv_bf16_add_stats_tp in gemv.cu: the default with bf16 weights, PKV_TP_FUSED=0 leaves it for
// this kernel) and their step count: allocated, linked and described here, used by the GEMV.
#include "gpu_state.h"
#include "kernels.h"
#include "pdl.h"
#include "residual_sumsq.cuh"
#include "spin_limit.cuh"

static_assert(TP_MAX_RANKS == TP_SUM_RANKS, "one bound on the ranks");

#define TP_THREADS SUMSQ_THREADS // the sum of squares in residual_stats' order
#define TP_LINES (TP_ONESHOT_MAX / 2) // 16-byte lines a slot

__device__ __forceinline__ void st_line(uint4 *p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ uint4 ld_line(const uint4 *p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

// Lines per thread: TP_ONESHOT_MAX / 2 / TP_THREADS at most.
#define TP_PER (TP_LINES / TP_THREADS)

__global__ void __launch_bounds__(TP_THREADS) tp_oneshot_kernel(float *x, int n, bf16 *xb, float *sumsq, TpPeers P, int rank, int N) {
    __shared__ float red[TP_THREADS / 32];
    const int t = threadIdx.x, n2 = n / 2;
    pdl_release(); // the next kernel's blocks may start loading weights
    pdl_wait();    // the GEMV before has written x; the call before has written the epoch
    const unsigned e = *P.epoch + 1;
    const size_t par = (size_t)(e & 1) * N;
    float2 v[TP_PER];
#pragma unroll
    for (int u = 0; u < TP_PER; u++) {
        int i = t + u * TP_THREADS;
        v[u] = i < n2 ? ((const float2 *)x)[i] : make_float2(0.f, 0.f);
    }
    for (int q = 0; q < N; q++) // this rank's part into slot (par, rank) of every peer
        if (q != rank) {
            uint4 *dst = P.in[q] + (par + rank) * TP_LINES;
#pragma unroll
            for (int u = 0; u < TP_PER; u++) {
                int i = t + u * TP_THREADS;
                if (i < n2) st_line(dst + i, make_uint4(__float_as_uint(v[u].x), e, __float_as_uint(v[u].y), e));
            }
        }
    float ss = 0.0f;
    const uint4 *mine = P.in[rank];
#pragma unroll
    for (int u = 0; u < TP_PER; u++) {
        int i = t + u * TP_THREADS;
        if (i >= n2) break;
        float2 a = make_float2(0.f, 0.f);
        for (int q = 0; q < N; q++) {
            float2 w = v[u];
            if (q != rank) { // poll this line of peer q's part until both halves are call e's
                const uint4 *src = mine + (par + q) * TP_LINES + i;
                uint4 l = ld_line(src);
                long spins = 0;
                while (l.y != e || l.w != e) {
                    spin_limit(&spins); // a lost peer: a launch error, not a hang
                    l = ld_line(src);
                }
                w = make_float2(__uint_as_float(l.x), __uint_as_float(l.z));
            }
            if (q == 0) a = w;
            else a.x += w.x, a.y += w.y;
        }
        ((float2 *)x)[i] = a;
        if (xb) {
            ((__nv_bfloat162 *)xb)[i] = __floats2bfloat162_rn(a.x, a.y);
            ss = sumsq_add_pair(ss, a);
        }
    }
    if (xb) {
        float s = sumsq_block(ss, red);
        if (t == 0) *sumsq = s;
    }
    __syncthreads(); // every thread has read the epoch
    if (t == 0) *P.epoch = e;
}

int tp_oneshot_fits(const GpuState *g, size_t n) { return g->tp.on && n <= TP_ONESHOT_MAX && n % 4 == 0; }

cudaError_t tp_oneshot(GpuState *g, float *x, size_t n, bf16 *xb, float *sumsq) {
    if (!tp_oneshot_fits(g, n)) return cudaErrorInvalidValue;
    return launch_pdl(tp_oneshot_kernel, dim3(1), dim3(TP_THREADS), 0, g->st, x, (int)n, xb, sumsq, g->tp, g->shard.rank, g->shard.n);
}

cudaError_t tp_oneshot_alloc(GpuState *g) {
    memset(&g->tp, 0, sizeof g->tp);
    const char *v = getenv("PKV_TP_ONESHOT");
    if (g->shard.n < 2 || (v && !strcmp(v, "0"))) return cudaSuccess; // NCCL for every sum
    int dev = 0;
    CU_TRY(cudaGetDevice(&dev));
    for (int q = 0; q < g->shard.n; q++) {
        int can = 0;
        if (q == dev) continue;
        if (cudaDeviceCanAccessPeer(&can, dev, q) != cudaSuccess || !can) return (void)cudaGetLastError(), cudaSuccess; // no peer access: NCCL
        cudaError_t e = cudaDeviceEnablePeerAccess(q, 0);
        if (e != cudaSuccess) cudaGetLastError(); // not left for a later check to find
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) return cudaSuccess;
    }
    // The one-shot kernel's slots, then the fused sums' (TpSum), then the two counts.
    size_t slots = (size_t)2 * g->shard.n * TP_LINES * sizeof(uint4), rows = (size_t)2 * g->shard.n * TP_SUM_ROWS * sizeof(uint2);
    char *p;
    CU_TRY(cudaMalloc(&p, slots + rows + 256));
    CU_TRY(cudaMemset(p, 0, slots + rows + 256)); // call numbers start at 1: no line matches before it is written
    CU_TRY(cudaDeviceSynchronize());             // zeroed before the rank's (non-blocking) stream first reads it
    g->tp_base = p;
    g->tp.in[g->shard.rank] = (uint4 *)p;
    g->tp.rows[g->shard.rank] = p + slots;
    g->tp.epoch = (unsigned *)(p + slots + rows); // this rank's own counts
    g->tp.count = g->tp.epoch + 1;
    return cudaSuccess;
}

// The fused sums need every residual GEMV in bf16 (a quantized one has no fused form, and the
// calls' parity must alternate over the step).
static int all_bf16_residuals(const GpuState *g) {
    for (uint32_t l = 0; l < g->c.n_layers; l++)
        if (g->layers[l].qo.dt || g->layers[l].qdown.dt) return 0;
    return g->c.dim <= TP_SUM_ROWS;
}

void tp_oneshot_link(GpuState *const *all, int n) {
    for (int r = 0; r < n; r++)
        if (!all[r]->tp_base) return; // some rank has no peer access: NCCL everywhere
    const char *v = getenv("PKV_TP_FUSED");
    int fused = !(v && !strcmp(v, "0"));
    for (int r = 0; r < n; r++) fused = fused && all_bf16_residuals(all[r]);
    for (int r = 0; r < n; r++) {
        for (int q = 0; q < n; q++) all[r]->tp.in[q] = all[q]->tp.in[q], all[r]->tp.rows[q] = all[q]->tp.rows[q];
        all[r]->tp.on = 1;
        all[r]->tp.fused = fused;
    }
}

TpSum tp_sum_link(const GpuState *g, unsigned call, int own_only) {
    TpSum t;
    memset(&t, 0, sizeof t);
    for (int q = 0; q < g->shard.n; q++) t.slot[q] = g->tp.rows[q];
    t.count = g->tp.count;
    t.call = call, t.per_step = 2 * g->c.n_layers;
    t.rank = g->shard.rank, t.n = g->shard.n;
    t.add = g->shard.rank == 0, t.own_only = own_only;
    return t;
}

void tp_oneshot_free(GpuState *g) {
    if (g->tp_base) cudaFree(g->tp_base);
    g->tp_base = NULL;
    memset(&g->tp, 0, sizeof g->tp);
}
