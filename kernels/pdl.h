// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl() may start while
// the kernel before it drains. Each such kernel touches only read-only data (weights) before
// pdl_wait(), which blocks until the previous kernel's writes are visible; pdl_release() lets
// the next kernel start its own prologue. Both are no-ops for a plain launch.
#ifndef PDL_H
#define PDL_H

#include <cuda_runtime.h>

__device__ __forceinline__ void pdl_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_release(void) { asm volatile("griddepcontrol.launch_dependents;"); }

template <typename Kernel, typename... Args>
static cudaError_t launch_pdl(Kernel k, dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, k, args...);
}

#endif
