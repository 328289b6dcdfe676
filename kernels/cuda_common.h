// Shared by the CUDA sources: error checks, bf16 helpers, warp and block sums.
#ifndef CUDA_COMMON_H
#define CUDA_COMMON_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>

typedef __nv_bfloat16 bf16;

// Returns the error from the enclosing function (which must return cudaError_t).
#define CU_TRY(call)                                                                   \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) return e_;                                              \
    } while (0)

// For test and benchmark programs: report and exit.
#define CU_CHECK(call)                                                                 \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_),      \
                    __FILE__, __LINE__, cudaGetErrorString(e_));                       \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

#ifdef __CUDACC__
// Sum over the 32 lanes of a warp (a butterfly: every lane gets the sum).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block, returned to every thread; red: one float per warp of shared memory.
__device__ __forceinline__ float block_sum(float v, float *red) {
    v = warp_sum(v);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads(); // red may still be read from a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}
#endif

#endif
