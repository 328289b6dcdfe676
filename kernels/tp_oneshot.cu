// The decode step's all-reduces over the GPUs' peer access (--gpus N): each rank writes its part
// of the residual straight into every peer's memory, raises a flag there, waits for the peers'
// flags in its own, then sums the N parts in rank order (the same order, so the same bits, on
// every rank) and, fused, writes bf16(x) and the sum of squares the next RMSNorm reads. One kernel
// where NCCL's all-reduce and the stats took two launches (two H100s, 64 sums and the logits'
// gather a step: 0.476 ms against 0.576; tests/bench/GPU.md, session 14). Prefill's larger sums
// stay with NCCL. (Not yet tried: NCCL's LL protocol, each value stored beside the call's number
// in one 8-byte store, which needs no fence or flag.)
//
// Each rank's slots: 2 parities x N ranks x TP_ONESHOT_MAX floats. Call e (an epoch counted on
// each rank; every rank makes the same calls in the same order) uses parity e & 1: a rank can be
// one call ahead of a peer still reading call e - 1's slot, never two (to start call e + 1 it
// needs that peer's part of call e, written after the peer's call e - 1 ended).
#include "gpu_state.h"
#include "kernels.h"

#define TP_THREADS 512

__device__ __forceinline__ void st_release_sys(unsigned *p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire_sys(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__global__ void __launch_bounds__(TP_THREADS) tp_oneshot_kernel(float *x, int n, bf16 *xb, float *sumsq, TpPeers P, int rank, int N) {
    __shared__ unsigned s_e;
    __shared__ float red[TP_THREADS / 32];
    const int t = threadIdx.x, n4 = n / 4;
    if (t == 0) s_e = *P.epoch + 1;
    __syncthreads();
    const unsigned e = s_e;
    const size_t par = (size_t)(e & 1) * N;
    for (int q = 0; q < N; q++) // this rank's part into slot (par, rank) of every peer
        if (q != rank) {
            float4 *dst = (float4 *)(P.in[q] + (par + rank) * TP_ONESHOT_MAX);
            for (int i = t; i < n4; i += TP_THREADS) dst[i] = ((const float4 *)x)[i];
        }
    __syncthreads(); // every thread's writes before the flags (the fence below is cumulative)
    if (t == 0) {
        __threadfence_system();
        for (int q = 0; q < N; q++)
            if (q != rank) st_release_sys(P.flag[q] + rank, e);
    }
    if (t < N && t != rank) { // peer t's part has landed here
        long spins = 0;
        while (ld_acquire_sys(P.flag[rank] + t) < e)
            if (++spins > (1L << 26)) __trap(); // a lost peer: a launch error after ~a minute, not a hang
    }
    __syncthreads();
    float ss = 0.0f;
    const float4 *mine = (const float4 *)P.in[rank];
    for (int i = t; i < n4; i += TP_THREADS) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int q = 0; q < N; q++) {
            float4 v = q == rank ? ((const float4 *)x)[i] : __ldcg(mine + (par + q) * (TP_ONESHOT_MAX / 4) + i); // L2: a peer wrote it
            if (q == 0) a = v;
            else a.x += v.x, a.y += v.y, a.z += v.z, a.w += v.w;
        }
        ((float4 *)x)[i] = a;
        if (xb) {
            __nv_bfloat162 *o = (__nv_bfloat162 *)(xb + 4 * (size_t)i);
            o[0] = __floats2bfloat162_rn(a.x, a.y), o[1] = __floats2bfloat162_rn(a.z, a.w);
            ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
        }
    }
    if (xb) {
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if ((t & 31) == 0) red[t >> 5] = ss;
        __syncthreads();
        if (t == 0) {
            float s = 0.0f;
            for (int w = 0; w < TP_THREADS / 32; w++) s += red[w];
            *sumsq = s;
        }
    }
    if (t == 0) *P.epoch = e;
}

int tp_oneshot_fits(const GpuState *g, size_t n) { return g->tp.on && n <= TP_ONESHOT_MAX && n % 4 == 0; }

cudaError_t tp_oneshot(GpuState *g, float *x, size_t n, bf16 *xb, float *sumsq) {
    if (!tp_oneshot_fits(g, n)) return cudaErrorInvalidValue;
    tp_oneshot_kernel<<<1, TP_THREADS, 0, g->st>>>(x, (int)n, xb, sumsq, g->tp, g->shard.rank, g->shard.n);
    return cudaGetLastError();
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
    size_t slots = (size_t)2 * g->shard.n * TP_ONESHOT_MAX * sizeof(float), flags = 64 * sizeof(unsigned);
    char *p;
    CU_TRY(cudaMalloc(&p, slots + flags));
    CU_TRY(cudaMemset(p, 0, slots + flags));
    CU_TRY(cudaDeviceSynchronize()); // zeroed before the rank's (non-blocking) stream first reads it
    g->tp_base = p;
    g->tp.in[g->shard.rank] = (float *)p;
    g->tp.flag[g->shard.rank] = (unsigned *)(p + slots);
    g->tp.epoch = (unsigned *)(p + slots) + 32; // this rank's own count (flags take the first N)
    return cudaSuccess;
}

void tp_oneshot_link(GpuState *const *all, int n) {
    for (int r = 0; r < n; r++)
        if (!all[r]->tp_base) return; // some rank has no peer access: NCCL everywhere
    for (int r = 0; r < n; r++) {
        for (int q = 0; q < n; q++) all[r]->tp.in[q] = all[q]->tp.in[q], all[r]->tp.flag[q] = all[q]->tp.flag[q];
        all[r]->tp.on = 1;
    }
}

void tp_oneshot_free(GpuState *g) {
    if (g->tp_base) cudaFree(g->tp_base);
    g->tp_base = NULL;
    memset(&g->tp, 0, sizeof g->tp);
}
