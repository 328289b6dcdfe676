// The sum of squares of a residual row after its sum over the GPUs, written once for the two
// kernels that produce it -- residual_stats (ops.cu, after NCCL's all-reduce) and the one-shot
// all-reduce (tp_oneshot.cu) -- so that both give the same bits: gpu_checks.sh tp compares their
// greedy ids exactly, and under ParisKV a last-bit change of the norm can move a selection.
// Order: pairs (2i, 2i + 1), pair i on thread i % SUMSQ_THREADS in ascending i; then a warp
// butterfly; then the warps' sums in order. Every product and sum rounded as written (no fma).
#ifndef RESIDUAL_SUMSQ_CUH
#define RESIDUAL_SUMSQ_CUH

#define SUMSQ_THREADS 512

__device__ __forceinline__ float sumsq_add_pair(float ss, float2 a) {
    return __fadd_rn(ss, __fadd_rn(__fmul_rn(a.x, a.x), __fmul_rn(a.y, a.y)));
}

// The block's total (blockDim.x == SUMSQ_THREADS) to every thread; red: SUMSQ_THREADS / 32 floats.
__device__ __forceinline__ float sumsq_block(float ss, float *red) {
    for (int o = 16; o > 0; o >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < SUMSQ_THREADS / 32; w++) s = __fadd_rn(s, red[w]);
    return s;
}

#endif
