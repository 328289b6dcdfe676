// Shared by the CUDA sources: error checks and bf16 helpers.
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

#endif
