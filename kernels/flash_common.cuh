// What the prefill attention kernels share (flash_prefill.cu: bf16; flash_prefill_fp8.cu: e4m3):
// shared-memory addresses, cp.async, mbarriers, TMA bulk tensor copies, the wgmma fences and
// shared-memory matrix descriptors; and, on the host, the probe of whether a file's sm_90a kernels
// can run and the driver's tensor-map encoder. Each file gets its own copy, in an anonymous namespace.
#ifndef FLASH_COMMON_CUH
#define FLASH_COMMON_CUH

#include <cuda.h> // CUtensorMap (the type only: the encoder comes through the runtime's driver entry point)
#include <cuda_bf16.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "spin_limit.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FP_HAVE_WGMMA 1
#else
#define FP_HAVE_WGMMA 0
#endif

namespace {

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// ---- mbarrier (wgmma kernel only) ----
#if FP_HAVE_WGMMA
__device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
    const uint32_t a = smem_u32(b);
    uint32_t ok;
    long spins = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(a), "r"(parity)
                     : "memory");
        spin_limit(&spins); // a deadlock becomes a launch error, not a hang
    } while (!ok);
}
// Arrives on the barrier (counted in its expected count) once all earlier cp.async of this thread land.
__device__ __forceinline__ void cp_async_arrive(uint64_t *b) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
// The producer's arrival, announcing the bytes the tile's bulk copies will complete on the barrier.
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
// One box of a 3-D tensor map (coordinates innermost first) into shared memory, completing on bar.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, uint64_t *bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
                 : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Named barriers 1 and 2 over both warpgroups (256 threads): one side syncs, the other arrives.
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
#endif // FP_HAVE_WGMMA

#if FP_HAVE_WGMMA
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Warp specialization for a block of two consumer warpgroups (warps 0-7) and a producer warpgroup
// (warps 8-11). The producer drops to 24 registers a thread so that the consumers may take 240
// (setmaxnreg; ptxas honours it only in a kernel without a trap, see mbar_wait), and one of its
// threads fills the ring of ST slots: tile jt goes to slot jt % ST once the consumers released the
// slot's previous tile (bar_empty), by fill(jt). Returns true on the producer's warps, which then
// leave the kernel; false on the consumers, now holding 240 registers.
template <int ST, class Fill>
__device__ __forceinline__ bool producer_warpgroup(int warp, int lane, int n_tiles, uint64_t *bar_empty, Fill fill) {
    if (warp >= 8) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (warp == 8 && lane == 0)
            for (int jt = 0; jt < n_tiles; jt++) {
                if (jt >= ST) mbar_wait(&bar_empty[jt % ST], (jt / ST - 1) & 1);
                fill(jt);
            }
        return true;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    return false;
}
// Waits for all of this warpgroup's wgmmas, placed after the computation of v (v >= 0 or NaN: the
// branch always goes the first way). Unconditional, ptxas hoists the wait above the softmax and the
// PV GEMM no longer overlaps it; one-armed, ptxas sees a path reading accumulators in flight and
// serializes every wgmma of the kernel (C7514). Both arms wait, in asm ptxas cannot merge.
__device__ __forceinline__ void wgmma_wait_all_after(float v) {
    if (!(v < 0.f)) wgmma_wait<0>();
    else asm volatile("wgmma.wait_group.sync.aligned 0; // the arm never taken\n" ::: "memory");
}
// Pins accumulator registers after a wgmma wait so that no read of them moves above it.
template <int N> __device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
// Shared-memory matrix descriptor of the tile at addr. lbo/sbo in bytes; swz: the layout's swizzle,
// 1 = 128-byte (the default), 2 = 64-byte. A GEMM builds one a tile and adds desc_step(bytes) for
// each k-slice: the address field (bits 0-13) holds address / 16 and never carries (shared memory
// is < 256 KB). (Building each slice's descriptor from its address, behind a volatile move that
// kept ptxas from hoisting them all into registers, cost 2-4%: tests/bench/GPU.md, session 20.)
__device__ __forceinline__ uint64_t desc_at(uint32_t addr, uint32_t lbo, uint32_t sbo, uint64_t swz = 1) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) | (swz << 62);
}
__device__ __forceinline__ constexpr uint64_t desc_step(uint32_t bytes) { return bytes >> 4; }
#endif // FP_HAVE_WGMMA

// Whether a file's sm_90a kernels can run here: its module was built with them (built: the file's
// own __device__ flag, set to FP_HAVE_WGMMA) and the device is sm_90. Probed once into *state (the
// caller's static, -1 before), outside stream capture: a call under capture gets 0 unprobed.
inline int sm90a_usable(cudaStream_t st, const int &built_flag, int *state) {
    if (*state >= 0) return *state;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
        cudaGetLastError();
        return 0;
    }
    int dev = 0, major = 0, minor = 0, built = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) ||
        cudaMemcpyFromSymbol(&built, built_flag, sizeof(int)) != cudaSuccess) {
        cudaGetLastError();
        built = 0;
    }
    *state = (major == 9 && minor == 0 && built) ? 1 : 0;
    return *state;
}

// The driver's tensor-map encoder, looked up once through the runtime (no link against libcuda;
// a function-local static: thread-safe, and --gpus N prefills on N threads); NULL without one.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void *f = NULL;
        cudaDriverEntryPointQueryResult qr;
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &qr);
        if (e != cudaSuccess) cudaGetLastError();
        return e == cudaSuccess && qr == cudaDriverEntryPointSuccess ? (PFN_cuTensorMapEncodeTiled_v12000)f : NULL;
    }();
    return encode;
}

} // namespace

#endif
