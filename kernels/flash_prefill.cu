// Causal grouped-query flash attention for long-prompt prefill. See flash_prefill.h.
//
// Both kernels pack the G = n_heads / n_kv query heads that share one KV head into the rows of one
// block: row r of a block is (query t0 + r / G, head kvh * G + r % G). The q layout (T, n_heads, hd)
// makes those rows contiguous, and every K/V tile loaded into shared memory serves all G heads.
// BM = 128 rows per block, so a block covers 128 / G queries. Online softmax in fp32 (exp2 with the
// scale folded in), bf16 P, fp32 O. Tiles past the block's last query are never visited; tiles that
// straddle the diagonal are masked per element; keys past pos0 + T - 1 are never read (the load
// clamps the row index, and the mask zeroes them).
//
// Shared-memory tiles are stored the way wgmma's 128-byte swizzle wants them, and the mma.sync kernel
// uses the same layout (it is conflict-free for ldmatrix too): a tile of R rows x HD columns is HD/64
// "slabs" of R rows x 128 bytes; the 16-byte chunk c of row r sits at chunk c ^ (r % 8) of that row.
// Slabs start on 1024-byte boundaries.
//
// Kernel 1 (sm_90a, wgmma; the default): 2 consumer warpgroups of 64 rows, 128-key tiles, and a
// producer warpgroup whose one thread fills a 3-stage ring of shared memory with TMA bulk tensor
// copies, with mbarrier full/empty handshakes (the copies complete the full barrier's transaction
// count; a slot is refilled once both consumers released it). The producer keeps 24 registers a
// thread and gives the rest to the consumers (setmaxnreg: 240). Q is copied once by the consumers
// (cp.async). S = Q K^T with both operands from shared memory; O += P V with P from
// registers and V read transposed (MN-major) from shared memory. The S GEMM of tile j+1 is issued
// before the PV GEMM of tile j, so the softmax of one tile overlaps the PV GEMM; the two consumers
// take turns issuing their GEMMs (named barriers).
// Kernel 2 (sm_80+, mma.sync m16n8k16; fallback): FA2 layout, 8 warps x 16 rows, 64-key tiles, 2-stage
// cp.async, ldmatrix from the same swizzled layout.
// Measured on an H100 (kernels/bench/flash_prefill.md, tests/bench/GPU.md): Qwen3-8B shapes, whole
// 128K prompt, kernel 1 620-662 TFLOP/s (MODE 7 below; MODE 3, thread 0 of the consumers issuing
// the copies: 504-515; MODE 0, the threads' cp.async copies: 452), kernel 2 306 TFLOP/s.
// Why one file of ~780 lines: the wgmma and mma.sync kernels share the swizzled tile layout, its
// loaders and the online-softmax epilogue below; apart, the two would drift.
#include "flash_prefill.h"
#include "flash_common.cuh"
#include "variants.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

namespace {

constexpr int BM = 128;        // rows (query, head) per block, both kernels
constexpr int WG_BN = 128;     // keys per tile, wgmma kernel
constexpr int WG_STAGES = 3;   // K/V ring depth, wgmma kernel
constexpr int WG_THREADS = 256; // 2 warpgroups; each thread also copies its share of every tile
constexpr int MMA_BN = 64;     // keys per tile, mma kernel
constexpr int MMA_THREADS = 256;

// Dynamic shared memory of the wgmma kernel: alignment slack, the Q tile, ST stages of a K and a V tile of BN keys.
constexpr int wg_smem_bytes(int HD, int BN, int ST) { return 1024 + BM * HD * 2 + ST * 2 * BN * HD * 2; }
template <int HD> constexpr int mma_smem_bytes() { return 1024 + BM * HD * 2 + 2 * 2 * MMA_BN * HD * 2; }

// Byte offset of 16-byte chunk c (0 .. HD/8-1) of row r in an R-row swizzled tile.
template <int R> __device__ __forceinline__ uint32_t swz(int r, int c) {
    return (uint32_t)((c >> 3) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Rows row0 .. row0+R-1 of a (rows, HD) bf16 matrix into an R-row swizzled tile, row indices clamped
// to row_max; the copy is spread over NTHR threads (thread index tid).
template <int HD, int R, int NTHR>
__device__ __forceinline__ void load_rows(uint32_t sbase, const bf16 *g, int row0, int row_max, int tid) {
    constexpr int CPR = HD / 8;
    static_assert((R * CPR) % NTHR == 0, "tile copy must split evenly");
#pragma unroll 8
    for (int i = 0; i < R * CPR / NTHR; i++) {
        const int idx = tid + i * NTHR;
        const int r = idx / CPR, c = idx % CPR;
        const int row = min(row0 + r, row_max);
        cp_async16(sbase + swz<R>(r, c), g + (size_t)row * HD + c * 8);
    }
}

// The BM packed rows (query, head) of a block: row r -> q row (t0 + min(r / G, nq - 1)) * n_heads + kvh * G + r % G.
template <int HD, int NTHR>
__device__ __forceinline__ void load_q(uint32_t sbase, const bf16 *q, int t0, int nq, int G, int kvh, int n_heads,
                                       int tid) {
    constexpr int CPR = HD / 8;
    static_assert((BM * CPR) % NTHR == 0, "tile copy must split evenly");
#pragma unroll
    for (int i = 0; i < BM * CPR / NTHR; i++) {
        const int idx = tid + i * NTHR;
        const int r = idx / CPR, c = idx % CPR;
        const int t = t0 + min(r / G, nq - 1);
        const int h = kvh * G + r % G;
        cp_async16(sbase + swz<BM>(r, c), q + ((size_t)t * n_heads + h) * HD + c * 8);
    }
}


// ldmatrix and mma.sync: the mma kernel's, and MODE 7 of the wgmma kernel's
__device__ __forceinline__ void ldsm_x4(uint32_t &a, uint32_t &b, uint32_t &c, uint32_t &d, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t &a, uint32_t &b, uint32_t &c, uint32_t &d, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "r"(addr));
}
// c (4 floats) += a b: the mma kernel's scores, and the wgmma kernel's (MODE 7) when it takes them again.
__device__ __forceinline__ void mma16816(float *c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

} // namespace

// ================================ wgmma kernel (sm_90a) ================================
namespace {
#if FP_HAVE_WGMMA
// D(64x128, f32) (+)= A(64x16, smem desc, K-major) * B(128x16, smem desc, K-major)^T
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
}

// D(64x160, f32) (+)= A(64x16, smem desc, K-major) * B(160x16, smem desc, K-major)^T
__device__ __forceinline__ void wgmma_ss_n160(float (&d)[80], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}, %80, %81, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
        : "l"(da), "l"(db), "r"(scale_d));
}
// S (+)= Q K^T for a tile of BN keys.
template <int BN> __device__ __forceinline__ void wgmma_ss(float (&d)[BN / 2], uint64_t da, uint64_t db, int scale_d) {
    if constexpr (BN == 128) wgmma_ss_n128(d, da, db, scale_d);
    else wgmma_ss_n160(d, da, db, scale_d);
}

// D(64x128, f32) += A(64x16, bf16 registers) * B(16x128, smem desc, MN-major i.e. transposed)
__device__ __forceinline__ void wgmma_rs_n128_tb(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}

// D(64x64, f32) += A(64x16, bf16 registers) * B(16x64, smem desc, MN-major i.e. transposed)
__device__ __forceinline__ void wgmma_rs_n64_tb(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}

#endif // FP_HAVE_WGMMA
} // namespace

// MODE 0: every thread copies 1/256 of each tile; a slot is refilled once both warpgroups released it
//         (the warpgroups wait on each other once per tile).
// MODE 1: warpgroup 1 alone refills the ring; warpgroup 0 never waits on warpgroup 1.
// MODE 2: MODE 1 + ping-pong: named barriers make the warpgroups take turns issuing their GEMMs, so one
//         warpgroup's softmax runs while the other's GEMMs occupy the tensor cores.
// MODE 3: as MODE 0, but thread 0 alone fills the ring, with TMA bulk tensor copies (tmk, tmv: the
//         layer's K and V caches as (n_kv, pos0 + T, HD), boxes of 128 rows x 64 columns, 128-byte
//         swizzle: the layout above), so the warps issue no copies or address arithmetic. (A ninth,
//         producer warp instead: ptxas then budgets 168 registers a thread, as for 384, and spills.)
//         MODE 3 with MODE 2's turns measured no faster (494.7-491.0 against 498.9-503.1 TFLOP/s over
//         the whole 128K prompt): not kept.
// MODE 4: as MODE 3, but a third, producer warpgroup fills the ring (one thread of it issues the
//         copies) and gives its registers to the two consumer warpgroups (setmaxnreg: 24 / 240 a
//         thread), so no consumer thread waits for the other warpgroup's release of a slot: 572-583
//         TFLOP/s against MODE 3's 504-515. (The 384-thread launch bound alone budgets 168 registers;
//         ptxas honours setmaxnreg's 240 only with no trap in the kernel: flash_common.cuh.)
// MODE 5: MODE 4 with MODE 2's turns: 574-587 (576-590 with one descriptor a tile; 589-603 once the
//         descriptors came from the uniform datapath, below). With tiles of 160 keys (BN 160, a ring
//         of 2 stages: 3 do not fit; FLASH_PREFILL_WGMMA_N160) 460-464 against 576-593 in the same
//         call: not kept as the default.
// MODE 6: MODE 5 with a lazy rescale: a row's running maximum moves only when a tile passes it by
//         more than LAZY_RESCALE, so the 64 multiplies of O a tile (on each consumer's path from its
//         PV wait to its next issue) run only in the warps where one did: 598-624 against MODE 5's
//         589-603 in the same call (whole 128K prompt, T 8192 / 4096).
// MODE 7: MODE 6 with the exponentials first (the default): after the first tile no row maxima
//         before the exponentials (64 fmax and two shuffle rounds on the path from the S GEMM to P),
//         only a check of the sums after them; where a thread's part of a row's sum passes 2^8, its
//         warp takes its scores again by mma.sync and MODE 6's way: 620-662 against MODE 6's 600-628.
// All modes take the warpgroup index and the ring's stage from lane 0 (a shuffle): ptxas then
// knows them warp-uniform and builds every wgmma descriptor in uniform registers (48 R2UR a tile
// before, and ~100 of the loop's 576 instructions; 430 with MODE 6, 354 with MODE 7).
template <int MODE> constexpr int wg_threads() { return MODE >= 4 ? WG_THREADS + 128 : WG_THREADS; }

// BN, ST: keys a tile and the ring's depth (160 keys only with TMA, MODES 3-7, in a ring of 2).
template <int HD, int MODE, int BN = WG_BN, int ST = WG_STAGES>
__global__ void __launch_bounds__(wg_threads<MODE>(), 1)
    fp_wgmma_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ q, const bf16 *__restrict__ kc,
                    const bf16 *__restrict__ vc, int pos0, int T, int n_heads, int n_kv, int ctx, int G, int nq,
                    int n_qtiles, float sl2, const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv) {
#if FP_HAVE_WGMMA
    constexpr int QB = BM * HD * 2, KVB = BN * HD * 2;
    constexpr int NO = HD / 2; // O accumulators per thread (m64 x nHD over 128 threads)
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t bar_full[ST], bar_empty[ST], bar_q;
    const uint32_t sQ = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t sKV = sQ + QB; // stage s: K at sKV + s*2*KVB, V right after

    const int kvh = blockIdx.x % n_kv;
    const int qt = n_qtiles - 1 - (int)(blockIdx.x / n_kv); // the longest rows first
    const int t0 = qt * nq;
    const int nqh = min(nq, T - t0);
    const int kv_len = pos0 + t0 + nqh; // keys 0 .. kv_len-1 are visible to some row
    const int n_tiles = (kv_len + BN - 1) / BN;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const bf16 *kg = kc + (size_t)kvh * ctx * HD, *vg = vc + (size_t)kvh * ctx * HD;

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < ST; s++) {
            mbar_init(&bar_full[s], MODE == 0 ? WG_THREADS : MODE >= 3 ? 1 : 128);
            mbar_init(&bar_empty[s], WG_THREADS);
        }
        mbar_init(&bar_q, WG_THREADS);
        if (MODE >= 3) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); // visible to the TMA unit
    }
    __syncthreads();
    constexpr bool TMA = MODE >= 3, LAZY = MODE >= 6, EXPS_FIRST = MODE >= 7;
    constexpr int LAZY_BITS = 8; // MODES 6, 7: how far (exp2 units) a row's maximum may pass the one its weights use
    constexpr float LAZY_RESCALE = LAZY_BITS, LAZY_MAX_WEIGHT = (float)(1 << LAZY_BITS); // a weight's bound, 2^LAZY_BITS
    auto tma_tile = [&](int jt) { // MODE 3: thread 0; MODES 4-7: the producer's thread
        const int s = jt % ST;
        const uint32_t kb = sKV + s * 2 * KVB;
        mbar_expect_tx(&bar_full[s], 2 * KVB);
#pragma unroll
        for (int sl = 0; sl < HD / 64; sl++) {
            tma_load_3d(kb + sl * BN * 128, &tmk, sl * 64, jt * BN, kvh, &bar_full[s]);
            tma_load_3d(kb + KVB + sl * BN * 128, &tmv, sl * 64, jt * BN, kvh, &bar_full[s]);
        }
    };

    // The copying threads each copy their share of a tile and arrive on the tile's barrier when it lands.
    auto issue_tile = [&](int jt) {
        const int s = jt % ST;
        const uint32_t kb = sKV + s * 2 * KVB;
        if constexpr (MODE == 0) {
            load_rows<HD, BN, WG_THREADS>(kb, kg, jt * BN, kv_len - 1, tid);
            load_rows<HD, BN, WG_THREADS>(kb + KVB, vg, jt * BN, kv_len - 1, tid);
        } else {
            load_rows<HD, BN, 128>(kb, kg, jt * BN, kv_len - 1, tid - 128);
            load_rows<HD, BN, 128>(kb + KVB, vg, jt * BN, kv_len - 1, tid - 128);
        }
        cp_async_arrive(&bar_full[s]);
    };
    if constexpr (MODE >= 4)
        if (producer_warpgroup<ST>(warp, lane, n_tiles, bar_empty, tma_tile)) return;
    load_q<HD, WG_THREADS>(sQ, q, t0, nqh, G, kvh, n_heads, tid);
    cp_async_arrive(&bar_q);
    if (MODE == 3 && tid == 0) // the ring's first tiles (MODES 4-7: the producer's)
        for (int jt = 0; jt < ST && jt < n_tiles; jt++) tma_tile(jt);
    if (!TMA && (MODE == 0 || tid >= 128))
        for (int jt = 0; jt < ST && jt < n_tiles; jt++) issue_tile(jt);
    constexpr bool TURNS = MODE == 2 || MODE >= 5;
    if (TURNS && tid >= 128) named_arrive(1); // warpgroup 0 issues first
    // GEMM issue turns (MODE 2): point k of warpgroup w waits for the other's point k-1 (or the start).
    auto turn_begin = [&]() {
        if constexpr (TURNS) named_sync(1 + (warp >> 2));
    };
    auto turn_end = [&](bool last) {
        if constexpr (TURNS) {
            if (!(last && warp >= 4)) named_arrive(2 - (warp >> 2));
        }
    };

    // ---- warpgroup wg owns rows wg*64 .. wg*64+63 ----
    // wg from lane 0 (a shuffle of a constant lane): ptxas then knows it is warp-uniform
    const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0), wl = warp & 3, g = lane >> 2, tq = lane & 3;
    const int r0 = wg * 64 + wl * 16 + g, r1 = r0 + 8;
    const int qp0 = pos0 + t0 + min(r0 / G, nqh - 1);
    const int qp1 = pos0 + t0 + min(r1 / G, nqh - 1);
    const int wg_qp_min = pos0 + t0 + min((wg * 64) / G, nqh - 1);
    const uint32_t qbase = sQ + wg * 64 * 128;

    float o[NO];
#pragma unroll
    for (int i = 0; i < NO; i++) o[i] = 0.f;
    static_assert(BN == 128 || (BN == 160 && MODE >= 3), "160-key tiles come by TMA");
    float sacc[BN / 2];
    uint32_t p[BN / 4];
    // The running maxima in exp2 units (score x sl2). MODE 6 moves a row's only when its new
    // maximum passes it by more than LAZY_RESCALE (the weights then reach at most 2^8, no concern
    // for bf16 P or fp32 sums): O and l are rescaled only then, and a warp skips the 64 multiplies
    // of O unless one of its rows moved (after the first tiles, rarely).
    float ms0 = -INFINITY, ms1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    // Each GEMM's descriptors: one built for the tile, the others that plus a constant (2-4%
    // faster than building each one from its address before its wgmma).
    const uint64_t dq0 = desc_at(qbase, 16, 1024);
    auto s_gemm = [&](uint32_t kb) {
        const uint64_t dk0 = desc_at(kb, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            const uint64_t da = dq0 + desc_step(((kk >> 2) * (BM * 128) + (kk & 3) * 32));
            const uint64_t db = dk0 + desc_step(((kk >> 2) * (BN * 128) + (kk & 3) * 32));
            wgmma_ss<BN>(sacc, da, db, kk > 0);
        }
    };
    auto pv_gemm = [&](uint32_t vb) {
        const uint64_t dv0 = desc_at(vb, BN * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            const uint64_t db = dv0 + desc_step(kk * 2048);
            if constexpr (HD == 128)
                wgmma_rs_n128_tb(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3], db);
            else
                wgmma_rs_n64_tb(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3], db);
        }
    };
    auto mask = [&](int j) {
        if (j * BN + BN - 1 > wg_qp_min) {
            const int kb = j * BN + 2 * tq;
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = kb + 8 * i + e;
                    if (key > qp0) sacc[4 * i + e] = -INFINITY;
                    if (key > qp1) sacc[4 * i + 2 + e] = -INFINITY;
                }
        }
    };
    // The exponentials in place against the running maxima, and their row sums (this thread's part).
    auto exps = [&](float &rs0, float &rs1) {
        rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int i = 0; i < BN / 8; i++) {
            sacc[4 * i] = fast_exp2(fmaf(sacc[4 * i], sl2, -ms0));
            sacc[4 * i + 1] = fast_exp2(fmaf(sacc[4 * i + 1], sl2, -ms0));
            sacc[4 * i + 2] = fast_exp2(fmaf(sacc[4 * i + 2], sl2, -ms1));
            sacc[4 * i + 3] = fast_exp2(fmaf(sacc[4 * i + 3], sl2, -ms1));
            rs0 += sacc[4 * i] + sacc[4 * i + 1];
            rs1 += sacc[4 * i + 2] + sacc[4 * i + 3];
        }
    };
    // Running max, exponentials in place, their sums, of masked scores; the rescale factors of the
    // old state, and (the return value) whether this warp must rescale O at all.
    auto exact = [&](float &a0, float &a1, float &rs0, float &rs1) -> bool {
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int i = 0; i < BN / 8; i++) {
            mx0 = fmaxf(mx0, fmaxf(sacc[4 * i], sacc[4 * i + 1]));
            mx1 = fmaxf(mx1, fmaxf(sacc[4 * i + 2], sacc[4 * i + 3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        // finite after the first tile: key 0 is in every row's first tile
        const float mn0 = fmaxf(ms0, mx0 * sl2), mn1 = fmaxf(ms1, mx1 * sl2);
        bool moved = true;
        if constexpr (LAZY) {
            const bool up0 = mn0 > ms0 + LAZY_RESCALE, up1 = mn1 > ms1 + LAZY_RESCALE; // -inf + x: -inf
            moved = __any_sync(0xffffffffu, up0 || up1);
            a0 = 1.f, a1 = 1.f;
            if (moved) {
                if (up0) a0 = fast_exp2(ms0 - mn0), ms0 = mn0;
                if (up1) a1 = fast_exp2(ms1 - mn1), ms1 = mn1;
            }
        } else {
            a0 = fast_exp2(ms0 - mn0);
            a1 = fast_exp2(ms1 - mn1);
            ms0 = mn0;
            ms1 = mn1;
        }
        exps(rs0, rs1);
        return moved;
    };
    // The warp's 16 rows of S_j again, by mma.sync from the same shared-memory tiles (the
    // accumulators' layout is wgmma's): MODE 7's way back to the scores after their exponentials.
    auto rescore = [&](uint32_t kb) {
        const int lm = lane >> 3, l8 = lane & 7;
#pragma unroll
        for (int i = 0; i < BN / 2; i++) sacc[i] = 0.f;
#pragma unroll 1 // rare: registers before speed (unrolled, ptxas spilled around the loop)
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t a[4];
            ldsm_x4(a[0], a[1], a[2], a[3], sQ + swz<BM>(wg * 64 + wl * 16 + (lm & 1) * 8 + l8, 2 * kk + (lm >> 1)));
#pragma unroll
            for (int np = 0; np < BN / 16; np++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, kb + swz<BN>(16 * np + (lm >> 1) * 8 + l8, 2 * kk + (lm & 1)));
                mma16816(sacc + 8 * np, a, b0, b1);
                mma16816(sacc + 8 * np + 4, a, b2, b3);
            }
        }
    };
    // Mask, exponentials in place, the rescale factors of the old state, and (the return value)
    // whether this warp must rescale O at all. MODE 7 after the first tile: the exponentials first,
    // against the running maxima as they stand, and the row maxima only where a thread's part of a
    // row's sum passes 2^8 (so every weight kept is at most 2^8, as MODE 6 has them): then the warp
    // takes its scores again (rescore) and MODE 6's way. kb: the tile's K in shared memory.
    auto softmax = [&](int j, float &a0, float &a1, uint32_t kb) -> bool {
        mask(j);
        float rs0, rs1;
        bool moved = false;
        if (EXPS_FIRST && j > 0) {
            exps(rs0, rs1);
            a0 = 1.f, a1 = 1.f;
            if (__any_sync(0xffffffffu, !(rs0 <= LAZY_MAX_WEIGHT && rs1 <= LAZY_MAX_WEIGHT))) { // also NaN or inf
                rescore(kb);
                mask(j);
                moved = exact(a0, a1, rs0, rs1);
            }
        } else
            moved = exact(a0, a1, rs0, rs1);
        l0 = l0 * a0 + rs0;
        l1 = l1 * a1 + rs1;
        return moved;
    };
    auto to_p = [&]() {
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            p[4 * kk] = pack_bf16(sacc[8 * kk], sacc[8 * kk + 1]);
            p[4 * kk + 1] = pack_bf16(sacc[8 * kk + 2], sacc[8 * kk + 3]);
            p[4 * kk + 2] = pack_bf16(sacc[8 * kk + 4], sacc[8 * kk + 5]);
            p[4 * kk + 3] = pack_bf16(sacc[8 * kk + 6], sacc[8 * kk + 7]);
        }
    };

    mbar_wait(&bar_q, 0);
    mbar_wait(&bar_full[0], 0);
    fence_proxy_async(); // cp.async wrote through the generic proxy; wgmma reads through the async proxy
    turn_begin();
    wgmma_fence();
    s_gemm(sKV);
    wgmma_commit();
    turn_end(false);
    wgmma_wait<0>();
    fence_regs(sacc);
    {
        float a0, a1;
        softmax(0, a0, a1, sKV);
    }
    to_p();

    for (int j = 1; j < n_tiles; j++) {
        // The stages from lane 0 (as wg): the K and V descriptors then come from the uniform datapath.
        const int s = __shfl_sync(0xffffffffu, j % ST, 0), sp = __shfl_sync(0xffffffffu, (j - 1) % ST, 0);
        mbar_wait(&bar_full[s], (j / ST) & 1);
        if constexpr (!TMA) fence_proxy_async(); // the threads' cp.async wrote the tile (TMA writes through the async proxy)
        turn_begin();
        wgmma_fence();
        s_gemm(sKV + s * 2 * KVB);                // S_j = Q K_j^T
        wgmma_commit();
        pv_gemm(sKV + sp * 2 * KVB + KVB);        // O += P_{j-1} V_{j-1}
        wgmma_commit();
        turn_end(false);
        wgmma_wait<1>();
        fence_regs(sacc);
        float a0, a1;
        const bool moved = softmax(j, a0, a1, sKV + s * 2 * KVB); // overlaps the PV GEMM
        wgmma_wait_all_after(l0); // below the exponentials (flash_common.cuh says how)
        fence_regs(o);
        mbar_arrive(&bar_empty[sp]);
        if (MODE == 3 && tid == 0 && j - 1 + ST < n_tiles) {
            mbar_wait(&bar_empty[sp], ((j - 1) / ST) & 1);
            tma_tile(j - 1 + ST);
        }
        if (!TMA && j - 1 + ST < n_tiles && (MODE == 0 || warp >= 4)) {
            // refill the slot of tile j-1 once both warpgroups are done with it
            mbar_wait(&bar_empty[sp], ((j - 1) / ST) & 1);
            issue_tile(j - 1 + ST);
        }
        if (moved)
#pragma unroll
            for (int i = 0; i < NO / 4; i++) {
                o[4 * i] *= a0;
                o[4 * i + 1] *= a0;
                o[4 * i + 2] *= a1;
                o[4 * i + 3] *= a1;
            }
        to_p();
    }
    turn_begin();
    wgmma_fence();
    pv_gemm(sKV + ((n_tiles - 1) % ST) * 2 * KVB + KVB);
    wgmma_commit();
    turn_end(true);
    wgmma_wait<0>();
    fence_regs(o);

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = 1.f / l0, inv1 = 1.f / l1;
    if (r0 < nqh * G) {
        bf16 *op = out + ((size_t)(t0 + r0 / G) * n_heads + kvh * G + r0 % G) * HD + 2 * tq;
#pragma unroll
        for (int i = 0; i < HD / 8; i++)
            *reinterpret_cast<__nv_bfloat162 *>(op + 8 * i) = __floats2bfloat162_rn(o[4 * i] * inv0, o[4 * i + 1] * inv0);
    }
    if (r1 < nqh * G) {
        bf16 *op = out + ((size_t)(t0 + r1 / G) * n_heads + kvh * G + r1 % G) * HD + 2 * tq;
#pragma unroll
        for (int i = 0; i < HD / 8; i++)
            *reinterpret_cast<__nv_bfloat162 *>(op + 8 * i) =
                __floats2bfloat162_rn(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
    }
#endif // FP_HAVE_WGMMA
}

// ================================ mma.sync kernel (sm_80+) ================================

template <int HD>
__global__ void __launch_bounds__(MMA_THREADS, 1)
    fp_mma_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ q, const bf16 *__restrict__ kc,
                  const bf16 *__restrict__ vc, int pos0, int T, int n_heads, int n_kv, int ctx, int G, int nq,
                  int n_qtiles, float sl2) {
    constexpr int QB = BM * HD * 2, KVB = MMA_BN * HD * 2;
    constexpr int NT = MMA_BN / 8; // n8 score tiles per warp
    constexpr int DT = HD / 8;     // n8 output tiles per warp
    extern __shared__ uint8_t smem_raw[];
    const uint32_t sQ = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t sKV = sQ + QB; // buffer b: K at sKV + b*2*KVB, V right after

    const int kvh = blockIdx.x % n_kv;
    const int qt = n_qtiles - 1 - (int)(blockIdx.x / n_kv);
    const int t0 = qt * nq;
    const int nqh = min(nq, T - t0);
    const int kv_len = pos0 + t0 + nqh;
    const int n_tiles = (kv_len + MMA_BN - 1) / MMA_BN;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const bf16 *kg = kc + (size_t)kvh * ctx * HD, *vg = vc + (size_t)kvh * ctx * HD;

    load_q<HD, MMA_THREADS>(sQ, q, t0, nqh, G, kvh, n_heads, tid);
    load_rows<HD, MMA_BN, MMA_THREADS>(sKV, kg, 0, kv_len - 1, tid);
    load_rows<HD, MMA_BN, MMA_THREADS>(sKV + KVB, vg, 0, kv_len - 1, tid);
    cp_async_commit();

    const int g = lane >> 2, tq = lane & 3, lm = lane >> 3, l8 = lane & 7;
    const int r0 = warp * 16 + g, r1 = r0 + 8;
    const int qp0 = pos0 + t0 + min(r0 / G, nqh - 1);
    const int qp1 = pos0 + t0 + min(r1 / G, nqh - 1);
    const int w_qp_min = pos0 + t0 + min((warp * 16) / G, nqh - 1);

    uint32_t qf[HD / 16][4];
    float o[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait<0>();
        __syncthreads(); // tile j landed for everyone; everyone is done with tile j-1
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
                ldsm_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3],
                        sQ + swz<BM>(warp * 16 + (lm & 1) * 8 + l8, 2 * kk + (lm >> 1)));
        }
        if (j + 1 < n_tiles) {
            const uint32_t nb = sKV + ((j + 1) & 1) * 2 * KVB;
            load_rows<HD, MMA_BN, MMA_THREADS>(nb, kg, (j + 1) * MMA_BN, kv_len - 1, tid);
            load_rows<HD, MMA_BN, MMA_THREADS>(nb + KVB, vg, (j + 1) * MMA_BN, kv_len - 1, tid);
        }
        cp_async_commit();
        const uint32_t kb = sKV + (j & 1) * 2 * KVB, vb = kb + KVB;

        float s[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, kb + swz<MMA_BN>(16 * np + (lm >> 1) * 8 + l8, 2 * kk + (lm & 1)));
                mma16816(s[2 * np], qf[kk], b0, b1);
                mma16816(s[2 * np + 1], qf[kk], b2, b3);
            }

        if (j * MMA_BN + MMA_BN - 1 > w_qp_min) {
            const int kb0 = j * MMA_BN + 2 * tq;
#pragma unroll
            for (int i = 0; i < NT; i++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = kb0 + 8 * i + e;
                    if (key > qp0) s[i][e] = -INFINITY;
                    if (key > qp1) s[i][2 + e] = -INFINITY;
                }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int i = 0; i < NT; i++) {
            mx0 = fmaxf(mx0, fmaxf(s[i][0], s[i][1]));
            mx1 = fmaxf(mx1, fmaxf(s[i][2], s[i][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float a0 = fast_exp2((m0 - mn0) * sl2), a1 = fast_exp2((m1 - mn1) * sl2);
        m0 = mn0;
        m1 = mn1;
        const float ms0 = mn0 * sl2, ms1 = mn1 * sl2;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int i = 0; i < NT; i++) {
            s[i][0] = fast_exp2(fmaf(s[i][0], sl2, -ms0));
            s[i][1] = fast_exp2(fmaf(s[i][1], sl2, -ms0));
            s[i][2] = fast_exp2(fmaf(s[i][2], sl2, -ms1));
            s[i][3] = fast_exp2(fmaf(s[i][3], sl2, -ms1));
            rs0 += s[i][0] + s[i][1];
            rs1 += s[i][2] + s[i][3];
        }
        l0 = l0 * a0 + rs0;
        l1 = l1 * a1 + rs1;
#pragma unroll
        for (int i = 0; i < DT; i++) {
            o[i][0] *= a0;
            o[i][1] *= a0;
            o[i][2] *= a1;
            o[i][3] *= a1;
        }
#pragma unroll
        for (int kk = 0; kk < MMA_BN / 16; kk++) {
            const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                    pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, vb + swz<MMA_BN>(16 * kk + (lm & 1) * 8 + l8, 2 * dp + (lm >> 1)));
                mma16816(o[2 * dp], pa, b0, b1);
                mma16816(o[2 * dp + 1], pa, b2, b3);
            }
        }
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = 1.f / l0, inv1 = 1.f / l1;
    if (r0 < nqh * G) {
        bf16 *op = out + ((size_t)(t0 + r0 / G) * n_heads + kvh * G + r0 % G) * HD + 2 * tq;
#pragma unroll
        for (int i = 0; i < DT; i++)
            *reinterpret_cast<__nv_bfloat162 *>(op + 8 * i) = __floats2bfloat162_rn(o[i][0] * inv0, o[i][1] * inv0);
    }
    if (r1 < nqh * G) {
        bf16 *op = out + ((size_t)(t0 + r1 / G) * n_heads + kvh * G + r1 % G) * HD + 2 * tq;
#pragma unroll
        for (int i = 0; i < DT; i++)
            *reinterpret_cast<__nv_bfloat162 *>(op + 8 * i) = __floats2bfloat162_rn(o[i][2] * inv1, o[i][3] * inv1);
    }
}

// ================================ host ================================
__device__ int fp_wgmma_built = FP_HAVE_WGMMA;

namespace {
// 1 when the loaded module has the sm_90a kernel and the device is sm_90 (under capture before the
// probe: 0, the portable kernel this time).
int wgmma_usable(cudaStream_t st) {
    static int state = -1;
    return sm90a_usable(st, fp_wgmma_built, &state);
}

// The layer's K or V cache (n_kv, ctx, HD) as a 3-D tensor map of rows 0 .. rows-1: boxes of box_rows rows
// x 64 columns with the 128-byte swizzle; rows past `rows` read as zeros. The encoder comes from the
// driver through the runtime (no link against libcuda).
cudaError_t kv_tensor_map(CUtensorMap *map, const bf16 *base, int HD, int rows, int n_kv, int ctx, int box_rows) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    const cuuint64_t dims[3] = {(cuuint64_t)HD, (cuuint64_t)rows, (cuuint64_t)n_kv};
    const cuuint64_t strides[2] = {(cuuint64_t)HD * 2, (cuuint64_t)ctx * HD * 2}; // bytes, dims 1 and 2
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, estr[3] = {1, 1, 1};
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

typedef void (*WgKern)(bf16 *, const bf16 *, const bf16 *, const bf16 *, int, int, int, int, int, int, int, int, float, const CUtensorMap,
                       const CUtensorMap);

// Every variant of the wgmma kernel, in one place: its kernel, threads, keys a tile, ring depth, and
// whether its K/V tiles come by TMA (tensor maps made at launch). FLASH_PREFILL_AUTO takes
// FLASH_PREFILL_WGMMA's (M0's where the driver has no tensor-map encoder); the others are kept to
// measure side by side (variants.h says what each is).
struct WgVariant {
    int impl;
    WgKern kern;
    int threads, bn, st;
    bool tma;
};
template <int HD> const WgVariant *wg_variant(int impl) {
    static const WgVariant table[] = {
        {FLASH_PREFILL_WGMMA, fp_wgmma_kernel<HD, 7>, wg_threads<7>(), WG_BN, WG_STAGES, true},
        {FLASH_PREFILL_WGMMA_M6, fp_wgmma_kernel<HD, 6>, wg_threads<6>(), WG_BN, WG_STAGES, true},
        {FLASH_PREFILL_WGMMA_M5, fp_wgmma_kernel<HD, 5>, wg_threads<5>(), WG_BN, WG_STAGES, true},
        {FLASH_PREFILL_WGMMA_N160, fp_wgmma_kernel<HD, 5, 160, 2>, wg_threads<5>(), 160, 2, true},
        {FLASH_PREFILL_WGMMA_M4, fp_wgmma_kernel<HD, 4>, wg_threads<4>(), WG_BN, WG_STAGES, true},
        {FLASH_PREFILL_WGMMA_M3, fp_wgmma_kernel<HD, 3>, wg_threads<3>(), WG_BN, WG_STAGES, true},
        {FLASH_PREFILL_WGMMA_M2, fp_wgmma_kernel<HD, 2>, wg_threads<2>(), WG_BN, WG_STAGES, false},
        {FLASH_PREFILL_WGMMA_M1, fp_wgmma_kernel<HD, 1>, wg_threads<1>(), WG_BN, WG_STAGES, false},
        {FLASH_PREFILL_WGMMA_M0, fp_wgmma_kernel<HD, 0>, wg_threads<0>(), WG_BN, WG_STAGES, false},
    };
    for (const WgVariant &v : table)
        if (v.impl == impl) return &v;
    return NULL;
}

template <int HD>
cudaError_t launch(int impl, bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int pos0, int T, int n_heads,
                   int n_kv, int ctx, cudaStream_t st) {
    const int G = n_heads / n_kv;
    const int nq = BM / G;
    const int n_qtiles = (T + nq - 1) / nq;
    const float sl2 = (float)(1.4426950408889634 / sqrt((double)HD));
    const dim3 grid((unsigned)(n_qtiles * n_kv));
    if (impl != FLASH_PREFILL_MMA) {
        const WgVariant *w = wg_variant<HD>(impl == FLASH_PREFILL_AUTO ? FLASH_PREFILL_WGMMA : impl);
        if (!w) return cudaErrorInvalidValue;
        CUtensorMap tmk, tmv;
        memset(&tmk, 0, sizeof tmk), memset(&tmv, 0, sizeof tmv);
        if (w->tma) {
            cudaError_t e = kv_tensor_map(&tmk, k, HD, pos0 + T, n_kv, ctx, w->bn);
            if (e == cudaSuccess) e = kv_tensor_map(&tmv, v, HD, pos0 + T, n_kv, ctx, w->bn);
            if (e != cudaSuccess && impl != FLASH_PREFILL_AUTO) return e;
            if (e != cudaSuccess) w = wg_variant<HD>(FLASH_PREFILL_WGMMA_M0); // AUTO, no encoder from the driver: copies by the threads
        }
        const int smem = wg_smem_bytes(HD, w->bn, w->st);
        cudaError_t e = cudaFuncSetAttribute(w->kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        w->kern<<<grid, w->threads, smem, st>>>(out, q, k, v, pos0, T, n_heads, n_kv, ctx, G, nq, n_qtiles, sl2, tmk, tmv);
    } else {
        const int smem = mma_smem_bytes<HD>();
        cudaError_t e = cudaFuncSetAttribute(fp_mma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        fp_mma_kernel<HD><<<grid, MMA_THREADS, smem, st>>>(out, q, k, v, pos0, T, n_heads, n_kv, ctx, G, nq,
                                                         n_qtiles, sl2);
    }
    return cudaGetLastError();
}
} // namespace

extern "C" cudaError_t flash_prefill_impl(int impl, bf16 *out, const bf16 *q, const bf16 *k_cache,
                                          const bf16 *v_cache, int pos0, int T, int n_heads, int n_kv_heads,
                                          int head_dim, int ctx, cudaStream_t stream) {
    if (T == 0) return cudaSuccess;
    if (!out || !q || !k_cache || !v_cache || T < 0 || pos0 < 0 || n_heads <= 0 || n_kv_heads <= 0 ||
        n_heads % n_kv_heads || n_heads / n_kv_heads > BM || (head_dim != 64 && head_dim != 128) ||
        (long long)pos0 + T > ctx || (((uintptr_t)out | (uintptr_t)q | (uintptr_t)k_cache | (uintptr_t)v_cache) & 15))
        return cudaErrorInvalidValue;
    if (impl == FLASH_PREFILL_AUTO) impl = wgmma_usable(stream) ? FLASH_PREFILL_AUTO : FLASH_PREFILL_MMA; // AUTO: launch() picks
    else if (impl == FLASH_PREFILL_MMA) {
    } else if (wg_variant<128>(impl)) {
        if (!wgmma_usable(stream)) return cudaErrorInvalidDeviceFunction;
    } else
        return cudaErrorInvalidValue;
    if (head_dim == 128)
        return launch<128>(impl, out, q, k_cache, v_cache, pos0, T, n_heads, n_kv_heads, ctx, stream);
    return launch<64>(impl, out, q, k_cache, v_cache, pos0, T, n_heads, n_kv_heads, ctx, stream);
}

extern "C" cudaError_t flash_prefill(bf16 *out, const bf16 *q, const bf16 *k_cache, const bf16 *v_cache, int pos0,
                                     int T, int n_heads, int n_kv_heads, int head_dim, int ctx, cudaStream_t stream) {
    return flash_prefill_impl(FLASH_PREFILL_AUTO, out, q, k_cache, v_cache, pos0, T, n_heads, n_kv_heads, head_dim,
                              ctx, stream);
}
