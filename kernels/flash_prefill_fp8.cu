// Causal grouped-query flash attention for prefill in fp8 (--prefill-attn fp8). See flash_prefill.h.
//
// The layer's visible K and V rows (0 .. pos0+T-1) and the chunk's queries are rounded to e4m3 before
// the attention, each with one scale: K and V per KV head and 128-row tile (amax / 448 over the
// tile's rows), a query per (position, head) row. Queries and keys are rotated first (incoherent processing, as FA3 does):
// each row times a fixed random sign per channel, then a Walsh-Hadamard transform (HD stages of
// butterflies, unnormalized), so that (H S q) . (H S k) = HD (q . k) while a few large channels --
// which would carry most of a dot product and most of its rounding error -- are spread over all
// HD. e4m3 keeps 3 mantissa bits: without the rotation SmolLM2's scores cost +0.028 nats of mean
// NLL over 7,753 positions, with it +0.0096 (tests/bench/GPU.md).
// The kernel is flash_prefill.cu's wgmma kernel (TMA ring, two warpgroups, S of tile j+1 issued
// before P V of tile j) with e4m3 operands: m64n128k32 for S = Q K^T and m64nHDk32 for O += P V,
// fp32 accumulation, the softmax in fp32 as in bf16. Differences:
//  - fp8 wgmma reads both shared-memory operands K-major only, so V is stored transposed, (n_kv, HD,
//    keys): each V tile is HD rows of 128 keys.
//  - P goes to the tensor cores from registers as e4m3 (scaled by 256, so the weights down to 2^-17
//    of the row's running maximum stay normal numbers; the row sum is scaled alike). The S
//    accumulator holds keys (2t, 2t+1, 8+2t, 9+2t) of a 16-key group where the A operand wants
//    (4t .. 4t+3), so the transposed V's keys are stored permuted in each group of 16 to match
//    (position p holds key 2(p/4) + p%2 + 8((p/2)%2)): no shuffles in the loop.
//  - The scales: a row's scores in tile j are S8 * sq * sk(j) / HD (its exp2 factor), and O is kept
//    in units of the current tile's V scale (the rescale between tiles carries sv(j-1) / sv(j)).
//  - The row sums come from the PV GEMM: each stage's V^T tile continues with a row of ones (and 7
//    of zeros: N = HD + 8), so the tensor cores sum each tile's e4m3 weights, the same weights they
//    multiply V by, and the softmax loses its 64 adds a tile and thread (SASS of the loop: 530 -> 470
//    instructions a tile and warp; H200, 128K prompt: 749 -> 755 TFLOP/s at T 4096, tests/bench/GPU.md).
//    Each tile's sums are taken into fp32 after its GEMM and the columns zeroed: accumulated across
//    tiles by the tensor cores (whose fp8 accumulation truncates) they came out far off past ~30K keys.
// Shared-memory rows are HD bytes: 128-byte swizzle at HD = 128, 64-byte swizzle at HD = 64 (the
// tensor maps and the descriptors agree); V tiles' rows are 128 keys = 128 bytes.
// Quantization: one pass over the tiles a call's rows touch (a tile's copy depends on its rows
// alone): a caller that prefills a layer chunk after chunk (the layered prefill) passes copies_from
// and the rows before it are not copied again; otherwise every visible row is, each call.
#include "flash_common.cuh"
#include "flash_prefill.h"

#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef __nv_bfloat16 bf16;

namespace {

constexpr int F8_BM = 128;      // rows (query, head) per block
constexpr int F8_BN = 128;      // keys per tile
constexpr int F8_STAGES = 4;    // K/V ring depth
constexpr int F8_THREADS = 256; // 2 warpgroups
constexpr float F8_MAX = 448.0f; // the largest finite e4m3

constexpr int F8_ONES = 8 * F8_BN; // bytes: the rows after each stage's V^T tile, its ones row and 7 zero rows (the row sums)
template <int HD> __host__ __device__ constexpr int f8_stage_bytes() { return 2 * F8_BN * HD + F8_ONES; } // K tile, V^T tile, the ones rows
template <int HD> __host__ __device__ constexpr int f8_smem_bytes() { return 1024 + F8_BM * HD + F8_STAGES * f8_stage_bytes<HD>(); }
template <int HD> __host__ __device__ constexpr uint64_t f8_swizzle() { return HD == 128 ? 1 : 2; } // descriptor's mode: 128-byte, 64-byte
template <int HD> __host__ __device__ constexpr uint32_t f8_sbo() { return 8 * HD; }                 // bytes between 8-row groups

// Byte offset of 16-byte chunk c of row r in a tile of HD-byte rows (HD = 128: 128-byte swizzle,
// HD = 64: 64-byte swizzle), as TMA writes it and wgmma reads it.
template <int HD> __device__ __forceinline__ uint32_t swz8(int r, int c) {
    if (HD == 128) return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
    return (uint32_t)(r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
}

// Four floats to e4m3 (round to nearest even, saturated to +-448), the first in the low byte.
__device__ __forceinline__ uint32_t pack_e4m3(float a, float b, float c, float d) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return lo | hi << 16;
}

// The key a position of a 16-key group of the transposed V holds (see the top).
__host__ __device__ __forceinline__ int v8_key_of(int p) { return 2 * (p >> 2) + (p & 1) + 8 * ((p >> 1) & 1); }

// A scale from an amax: amax / 448, 1 for an all-zero head or row (its codes are all zero then).
__device__ __forceinline__ float f8_scale(float amax) { return amax > 0.0f ? __fdiv_rn(amax, F8_MAX) : 1.0f; }
__device__ __forceinline__ float f8_inv(float amax) { return amax > 0.0f ? __fdiv_rn(F8_MAX, amax) : 1.0f; }

// The rotation's sign of channel d (a fixed hash; the test's CPU reference has the same).
__host__ __device__ __forceinline__ float f8_sign(int d) { return ((uint32_t)(d + 1) * 0x9E3779B1u) >> 31 ? -1.0f : 1.0f; }

// A row of HD values in a warp, lane l holding channels PER l .. PER l + PER - 1 (PER = HD / 32):
// x <- H (S x), butterflies h = 1, 2, 4, .. in order, (a, b) -> (a + b, a - b) for the pair's low
// and high channel: in-lane while h < PER, then across lanes. The CPU reference repeats the order.
template <int PER> __device__ __forceinline__ void f8_rotate(float (&x)[PER], int lane) {
#pragma unroll
    for (int j = 0; j < PER; j++) x[j] *= f8_sign(lane * PER + j);
#pragma unroll
    for (int h = 1; h < PER; h *= 2)
#pragma unroll
        for (int j = 0; j < PER; j++)
            if (!(j & h)) {
                const float a = x[j], b = x[j + h];
                x[j] = __fadd_rn(a, b), x[j + h] = __fsub_rn(a, b);
            }
#pragma unroll
    for (int m = 1; m < 32; m *= 2)
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const float o = __shfl_xor_sync(0xffffffffu, x[j], m);
            x[j] = lane & m ? __fsub_rn(o, x[j]) : __fadd_rn(x[j], o);
        }
}

// Row `row` of a bf16 matrix of HD columns into a warp's registers (PER a lane).
template <int PER> __device__ __forceinline__ void f8_load_row(float (&x)[PER], const bf16 *r, int lane) {
    if constexpr (PER == 4) {
        const uint2 u = *(const uint2 *)(r + lane * 4);
        const float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
        x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
    } else {
        const float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)(r + lane * 2));
        x[0] = a.x, x[1] = a.y;
    }
}

// PER e4m3 codes of x * inv to p (lane's place).
template <int PER> __device__ __forceinline__ void f8_store_row(uint8_t *p, const float (&x)[PER], float inv) {
    if constexpr (PER == 4) *(uint32_t *)p = pack_e4m3(__fmul_rn(x[0], inv), __fmul_rn(x[1], inv), __fmul_rn(x[2], inv), __fmul_rn(x[3], inv));
    else *(uint16_t *)p = (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(x[0], inv), __fmul_rn(x[1], inv)), __NV_SATFINITE, __NV_E4M3);
}

// ---- quantization ----

// Block (tile, h): rows [128 tile, 128 tile + 128) of KV head h, tile = first + blockIdx.x: their
// scales (K rotated, and V: amax / 448 over the tile's rows below `rows`) to sk, sv (n_kv, tiles of
// the capacity); K rotated to k8 (n_kv, capp, HD); V transposed to v8t (n_kv, HD, capp), keys
// permuted in groups of 16; rows past `rows` as zeros. Each tile's copy depends on its rows alone,
// so a later call re-makes only the tiles its new rows touch.
template <int HD>
__global__ void __launch_bounds__(256) f8_quant_kv_kernel(uint8_t *k8, uint8_t *v8t, float *sk, float *sv, const bf16 *kc, const bf16 *vc,
                                                          int first, int rows, int capp, int ctx) {
    __shared__ uint8_t vs[F8_BN][HD + 4]; // V's codes, row-major, read back by channel
    __shared__ float red[2][8];
    constexpr int PER = HD / 32;
    const int h = blockIdx.y, tile = first + blockIdx.x, r0 = tile * F8_BN, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const bf16 *k = kc + (size_t)h * ctx * HD, *v = vc + (size_t)h * ctx * HD;
    float mk = 0.0f, mv = 0.0f; // the tile's amax: a warp a row
    for (int r = warp; r < F8_BN && r0 + r < rows; r += 8) {
        float x[PER], y[PER];
        f8_load_row<PER>(x, k + (size_t)(r0 + r) * HD, lane);
        f8_load_row<PER>(y, v + (size_t)(r0 + r) * HD, lane);
        f8_rotate<PER>(x, lane);
#pragma unroll
        for (int j = 0; j < PER; j++) mk = fmaxf(mk, fabsf(x[j])), mv = fmaxf(mv, fabsf(y[j]));
    }
    for (int o = 16; o > 0; o >>= 1) mk = fmaxf(mk, __shfl_xor_sync(0xffffffffu, mk, o)), mv = fmaxf(mv, __shfl_xor_sync(0xffffffffu, mv, o));
    if (lane == 0) red[0][warp] = mk, red[1][warp] = mv;
    __syncthreads();
    mk = red[0][0], mv = red[1][0];
    for (int w = 1; w < 8; w++) mk = fmaxf(mk, red[0][w]), mv = fmaxf(mv, red[1][w]);
    const float ik = f8_inv(mk), iv = f8_inv(mv);
    if (t == 0) sk[(size_t)h * (capp / F8_BN) + tile] = f8_scale(mk), sv[(size_t)h * (capp / F8_BN) + tile] = f8_scale(mv);
    for (int r = warp; r < F8_BN; r += 8) { // K: a warp a row, rotated again (the rows are in L2)
        const int row = r0 + r;
        float x[PER];
        if (row < rows) f8_load_row<PER>(x, k + (size_t)row * HD, lane), f8_rotate<PER>(x, lane);
        else
#pragma unroll
            for (int j = 0; j < PER; j++) x[j] = 0.0f;
        f8_store_row<PER>(k8 + ((size_t)h * capp + row) * HD + lane * PER, x, ik);
    }
    for (int i = t; i < F8_BN * HD / 4; i += 256) { // V: 4 elements a thread and pass
        const int r = i / (HD / 4), c = (i % (HD / 4)) * 4, row = r0 + r;
        float b[4] = {0, 0, 0, 0};
        if (row < rows) {
            const __nv_bfloat162 *pv = (const __nv_bfloat162 *)(v + (size_t)row * HD + c);
            float2 v0 = __bfloat1622float2(pv[0]), v1 = __bfloat1622float2(pv[1]);
            b[0] = v0.x, b[1] = v0.y, b[2] = v1.x, b[3] = v1.y;
        }
        *(uint32_t *)&vs[r][c] = pack_e4m3(__fmul_rn(b[0], iv), __fmul_rn(b[1], iv), __fmul_rn(b[2], iv), __fmul_rn(b[3], iv));
    }
    __syncthreads();
    for (int i = t; i < HD * (F8_BN / 16); i += 256) { // one 16-key group of one channel a thread and pass
        const int d = i / (F8_BN / 16), g = (i % (F8_BN / 16)) * 16;
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            w[j] = (uint32_t)vs[g + v8_key_of(4 * j)][d] | (uint32_t)vs[g + v8_key_of(4 * j + 1)][d] << 8 |
                   (uint32_t)vs[g + v8_key_of(4 * j + 2)][d] << 16 | (uint32_t)vs[g + v8_key_of(4 * j + 3)][d] << 24;
        *(uint4 *)(v8t + ((size_t)h * HD + d) * capp + r0 + g) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// One warp a (position, head) row of q: rotated, its amax, scale to qs, codes to q8 (q's layout).
template <int HD>
__global__ void f8_quant_q_kernel(uint8_t *q8, float *qs, const bf16 *q, int nrows) {
    constexpr int PER = HD / 32;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= nrows) return;
    float x[PER], m = 0.0f;
    f8_load_row<PER>(x, q + (size_t)row * HD, lane);
    f8_rotate<PER>(x, lane);
#pragma unroll
    for (int j = 0; j < PER; j++) m = fmaxf(m, fabsf(x[j]));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    f8_store_row<PER>(q8 + (size_t)row * HD + lane * PER, x, f8_inv(m));
    if (lane == 0) qs[row] = f8_scale(m);
}

// ---- the attention ----
#if FP_HAVE_WGMMA
// Sixteen bytes, four copies of w, to shared memory at addr.
__device__ __forceinline__ void st_shared16(uint32_t addr, uint32_t w) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(w) : "memory");
}

// D(64x128, f32) (+)= A(64x32 e4m3, smem desc, K-major) * B(128x32 e4m3, smem desc, K-major)^T
__device__ __forceinline__ void wgmma8_ss_n128(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
}

// D(64x136, f32) += A(64x32 e4m3, registers) * B(32x136 e4m3, smem desc, K-major: V transposed, then its ones row)
__device__ __forceinline__ void wgmma8_rs_n136(float (&d)[68], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %73, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n136k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67}, {%68, %69, %70, %71}, %72, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}

// D(64x72, f32) += A(64x32 e4m3, registers) * B(32x72 e4m3, smem desc, K-major: V transposed, then its ones row)
__device__ __forceinline__ void wgmma8_rs_n72(float (&d)[36], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n72k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}, {%36, %37, %38, %39}, %40, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}

#endif // FP_HAVE_WGMMA

// Block (q tile, KV head), as flash_prefill.cu's wgmma kernel (MODE 5). q8 / qs: the chunk's codes and
// row scales; tmk / tmv: k8 (n_kv, capp, HD) and v8t (n_kv, HD, capp) as tensor maps; sk, sv: the K
// and V scales of each 128-row tile (n_kv, capp / 128). A tile's K scale is part of its exp2 factor
// (the running max is kept in exp2 units); O is kept in units of the current tile's V scale: each
// rescale multiplies it by alpha x sv(j-1) / sv(j), and the output by the last tile's sv.
// PW: a third, producer warpgroup fills the ring and gives its registers to the two consumer
// warpgroups (setmaxnreg 24 / 240); without it (MODE 3, the default until 2026-11-28), thread 0 of
// the consumers issues the copies once both warpgroups released a slot. PP: flash_prefill.cu's
// MODE 2 turns -- named barriers make the two warpgroups take turns issuing their GEMMs. H100,
// whole 128K prompt (tests/bench/GPU.md): PW + PP (the default) 694-711 TFLOP/s, PW 661-698, neither
// 624-628; 730-749 for PW + PP once the softmax's row maxima and sums ran in four chains. The others
// kept to measure (PKV_FP8_VARIANT below).
template <int HD, bool PP, bool PW>
__global__ void __launch_bounds__(PW ? F8_THREADS + 128 : F8_THREADS, 1)
    f8_wgmma_kernel(bf16 *__restrict__ out, const uint8_t *__restrict__ q8, const float *__restrict__ qs, const float *__restrict__ sk,
                    const float *__restrict__ sv, int pos0, int T, int n_heads, int n_kv, int capp, int G, int nq, int n_qtiles, float sl2,
                    const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv) {
#if FP_HAVE_WGMMA
    constexpr int QB = F8_BM * HD, KB = F8_BN * HD, SB = f8_stage_bytes<HD>(); // bytes: the Q tile, a K (and a V) tile, a stage
    constexpr int NO = (HD + 8) / 2; // O accumulators per thread: HD / 2 of O, then 4 of the ones row's columns
    constexpr uint64_t SW = f8_swizzle<HD>();
    constexpr uint32_t SBO = f8_sbo<HD>();
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t bar_full[F8_STAGES], bar_empty[F8_STAGES], bar_q;
    const uint32_t sQ = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t sKV = sQ + QB; // stage s: K at sKV + s*SB, V^T right after, then the ones rows

    const int kvh = blockIdx.x % n_kv;
    const int qt = n_qtiles - 1 - (int)(blockIdx.x / n_kv); // the longest rows first
    const int t0 = qt * nq;
    const int nqh = min(nq, T - t0);
    const int kv_len = pos0 + t0 + nqh;
    const int n_tiles = (kv_len + F8_BN - 1) / F8_BN;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    // Each stage's V^T tile continues with a row of ones (e4m3 1.0 = 0x38) and 7 rows of zeros, which
    // TMA never writes: the PV GEMM's last 8 columns, the first of which sums P, as the tensor cores
    // see it, into the row sums (64 adds a tile and thread fewer). Generic-proxy writes, fenced for
    // wgmma's async proxy before the barrier below.
    for (int i = tid; i < F8_STAGES * F8_ONES / 16; i += blockDim.x) {
        const int s = i / (F8_ONES / 16), c = i % (F8_ONES / 16); // 16-byte chunk c of stage s's ones rows
        const uint32_t w = c < F8_BN / 16 ? 0x38383838u : 0u;
        st_shared16(sKV + s * SB + 2 * KB + 16 * c, w);
    }
    fence_proxy_async();
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < F8_STAGES; s++) mbar_init(&bar_full[s], 1), mbar_init(&bar_empty[s], F8_THREADS);
        mbar_init(&bar_q, F8_THREADS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); // visible to the TMA unit
    }
    __syncthreads();
    auto tma_tile = [&](int jt) { // thread 0, or the producer's thread (PW)
        const int s = jt % F8_STAGES;
        const uint32_t kb = sKV + s * SB;
        mbar_expect_tx(&bar_full[s], 2 * KB);
        tma_load_3d(kb, &tmk, 0, jt * F8_BN, kvh, &bar_full[s]);
        tma_load_3d(kb + KB, &tmv, jt * F8_BN, 0, kvh, &bar_full[s]);
    };
    if constexpr (PW)
        if (producer_warpgroup<F8_STAGES>(warp, lane, n_tiles, bar_empty, tma_tile)) return;
    { // the Q tile: row r = (query t0 + min(r / G, nqh - 1), head kvh G + r % G), HD / 16 chunks a row
        constexpr int CPR = HD / 16;
#pragma unroll
        for (int i = 0; i < F8_BM * CPR / F8_THREADS; i++) {
            const int idx = tid + i * F8_THREADS, r = idx / CPR, c = idx % CPR;
            const int t = t0 + min(r / G, nqh - 1), h = kvh * G + r % G;
            cp_async16(sQ + swz8<HD>(r, c), q8 + ((size_t)t * n_heads + h) * HD + c * 16);
        }
        cp_async_arrive(&bar_q);
    }
    if (!PW && tid == 0)
        for (int jt = 0; jt < F8_STAGES && jt < n_tiles; jt++) tma_tile(jt);

    // wg and (below) the stages from lane 0: ptxas then knows them warp-uniform and builds the
    // descriptors in uniform registers (flash_prefill.cu)
    const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0), wl = warp & 3, tq = lane & 3;
    const int r0 = wg * 64 + wl * 16 + (lane >> 2), r1 = r0 + 8;
    const int qp0 = pos0 + t0 + min(r0 / G, nqh - 1);
    const int qp1 = pos0 + t0 + min(r1 / G, nqh - 1);
    const int wg_qp_min = pos0 + t0 + min((wg * 64) / G, nqh - 1);
    const uint32_t qbase = sQ + wg * 64 * HD;
    // Each row's exp2 factor: its query's scale x log2(e) / sqrt(HD) / HD (the rotation's H is
    // unnormalized: the rotated dot products are HD times the scores), times each tile's K scale.
    const float cq0 = qs[(size_t)(qp0 - pos0) * n_heads + kvh * G + r0 % G] * sl2;
    const float cq1 = qs[(size_t)(qp1 - pos0) * n_heads + kvh * G + r1 % G] * sl2;
    const float *skh = sk + (size_t)kvh * (capp / F8_BN), *svh = sv + (size_t)kvh * (capp / F8_BN);

    float o[NO];
#pragma unroll
    for (int i = 0; i < NO; i++) o[i] = 0.f;
    float sacc[64];
    uint32_t p[16];
    // l0, l1: the row sums in fp32, each tile's taken from the PV GEMM's ones-row columns (o[HD / 2 ..]; see the top)
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    // Each GEMM's descriptors: one built for the tile, the others that plus a constant (1-2%
    // faster than building each one from its address before its wgmma).
    const uint64_t dq0 = desc_at(qbase, 16, SBO, SW);
    auto s_gemm = [&](uint32_t kb) {
        const uint64_t dk0 = desc_at(kb, 16, SBO, SW);
#pragma unroll
        for (int kk = 0; kk < HD / 32; kk++)
            wgmma8_ss_n128(sacc, dq0 + desc_step(kk * 32), dk0 + desc_step(kk * 32), kk > 0);
    };
    auto pv_gemm = [&](uint32_t vb) {
        const uint64_t dv0 = desc_at(vb, 16, 1024, 1); // V^T rows and the ones rows: 128 keys, 128-byte swizzle
#pragma unroll
        for (int kk = 0; kk < F8_BN / 32; kk++) {
            const uint64_t db = dv0 + desc_step(kk * 32);
            if constexpr (HD == 128) wgmma8_rs_n136(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3], db);
            else wgmma8_rs_n72(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3], db);
        }
    };
    // Mask, running max (exp2 units), exponentials in place (x 256); the rescale factors. The row
    // sums come from the PV GEMM (the ones row).
    auto softmax = [&](int j, float fk, float &a0, float &a1) {
        const float c0 = cq0 * fk, c1 = cq1 * fk;
        if (j * F8_BN + F8_BN - 1 > wg_qp_min) {
            const int kb = j * F8_BN + 2 * tq;
#pragma unroll
            for (int i = 0; i < 16; i++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = kb + 8 * i + e;
                    if (key > qp0) sacc[4 * i + e] = -INFINITY;
                    if (key > qp1) sacc[4 * i + 2 + e] = -INFINITY;
                }
        }
        // The row maxima and (below) sums in four chains each: one chain of 16 dependent steps was
        // the softmax's critical path (Nsight Compute: fixed-latency "wait" stalls first).
        float mxa[4], mxb[4];
#pragma unroll
        for (int c = 0; c < 4; c++) mxa[c] = mxb[c] = -INFINITY;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            mxa[i & 3] = fmaxf(mxa[i & 3], fmaxf(sacc[4 * i], sacc[4 * i + 1]));
            mxb[i & 3] = fmaxf(mxb[i & 3], fmaxf(sacc[4 * i + 2], sacc[4 * i + 3]));
        }
        float mx0 = fmaxf(fmaxf(mxa[0], mxa[1]), fmaxf(mxa[2], mxa[3]));
        float mx1 = fmaxf(fmaxf(mxb[0], mxb[1]), fmaxf(mxb[2], mxb[3]));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        // finite: key 0 is in every row's first tile (a masked -inf times c stays -inf)
        const float mn0 = fmaxf(m0, mx0 * c0), mn1 = fmaxf(m1, mx1 * c1);
        a0 = fast_exp2(m0 - mn0);
        a1 = fast_exp2(m1 - mn1);
        m0 = mn0;
        m1 = mn1;
        const float ms0 = mn0 - 8.0f, ms1 = mn1 - 8.0f; // weights x 2^8: at most 256 (e4m3 to 448)
#pragma unroll
        for (int i = 0; i < 16; i++) {
            sacc[4 * i] = fast_exp2(fmaf(sacc[4 * i], c0, -ms0));
            sacc[4 * i + 1] = fast_exp2(fmaf(sacc[4 * i + 1], c0, -ms0));
            sacc[4 * i + 2] = fast_exp2(fmaf(sacc[4 * i + 2], c1, -ms1));
            sacc[4 * i + 3] = fast_exp2(fmaf(sacc[4 * i + 3], c1, -ms1));
        }
    };
    // P to e4m3 in the A operand's order: register 4kk + i holds keys 32kk + 16(i/2) + v8_key_of(4 tq ..
    // 4 tq + 3) of row r0 (i even) or r1 (i odd).
    auto to_p = [&]() {
#pragma unroll
        for (int kk = 0; kk < F8_BN / 32; kk++) {
            const float *s = sacc + 16 * kk;
            p[4 * kk] = pack_e4m3(s[0], s[1], s[4], s[5]);
            p[4 * kk + 1] = pack_e4m3(s[2], s[3], s[6], s[7]);
            p[4 * kk + 2] = pack_e4m3(s[8], s[9], s[12], s[13]);
            p[4 * kk + 3] = pack_e4m3(s[10], s[11], s[14], s[15]);
        }
    };

    // GEMM issue turns (PP): point k of warpgroup w waits for the other's point k-1 (or the start).
    if (PP && tid >= 128) named_arrive(1); // warpgroup 0 issues first
    auto turn_begin = [&]() {
        if constexpr (PP) named_sync(1 + (warp >> 2));
    };
    auto turn_end = [&](bool last) {
        if constexpr (PP) {
            if (!(last && warp >= 4)) named_arrive(2 - (warp >> 2));
        }
    };

    // The tiles' scales are read an iteration ahead (a load at the top of the loop, used after the
    // GEMMs): read where they are used, their latency sat between the S GEMM's wait and the softmax.
    float fk_next = __ldg(skh), sv_prev = __ldg(svh), sv_next = n_tiles > 1 ? __ldg(svh + 1) : 1.0f;
    mbar_wait(&bar_q, 0);
    mbar_wait(&bar_full[0], 0);
    fence_proxy_async(); // cp.async wrote Q through the generic proxy; wgmma reads through the async proxy
    turn_begin();
    wgmma_fence();
    s_gemm(sKV);
    wgmma_commit();
    turn_end(false);
    wgmma_wait<0>();
    fence_regs(sacc);
    {
        float a0, a1;
        softmax(0, fk_next, a0, a1);
    }
    to_p();

    for (int j = 1; j < n_tiles; j++) {
        const int s = __shfl_sync(0xffffffffu, j % F8_STAGES, 0), sp = __shfl_sync(0xffffffffu, (j - 1) % F8_STAGES, 0);
        const float fk = __ldg(skh + j), sv_j = sv_next;
        if (j + 1 < n_tiles) sv_next = __ldg(svh + j + 1);
        mbar_wait(&bar_full[s], (j / F8_STAGES) & 1);
        turn_begin();
        wgmma_fence();
        s_gemm(sKV + s * SB);         // S_j = Q K_j^T
        wgmma_commit();
        pv_gemm(sKV + sp * SB + KB);  // O += P_{j-1} V_{j-1}, and the row sums
        wgmma_commit();
        turn_end(false);
        wgmma_wait<1>();
        fence_regs(sacc);
        float a0, a1;
        softmax(j, fk, a0, a1); // overlaps the PV GEMM
        wgmma_wait_all_after(sacc[63]); // below the exponentials (the last of them)
        fence_regs(o);
        mbar_arrive(&bar_empty[sp]);
        if (!PW && tid == 0 && j - 1 + F8_STAGES < n_tiles) {
            mbar_wait(&bar_empty[sp], ((j - 1) / F8_STAGES) & 1);
            tma_tile(j - 1 + F8_STAGES);
        }
        // Tile j-1's row sums (this thread's 2 of the ones-row columns a row: the ones row's own in
        // the quad's first thread, zeros elsewhere) join l; the columns start at zero again (times
        // zero, not set to it: an accumulator assigned a constant made ptxas wait for every wgmma
        // at its issue, C7514).
        l0 = (l0 + (o[HD / 2] + o[HD / 2 + 1])) * a0;
        l1 = (l1 + (o[HD / 2 + 2] + o[HD / 2 + 3])) * a1;
#pragma unroll
        for (int i = HD / 2; i < NO; i++) o[i] *= 0.f;
        // O from tile j-1's V units to tile j's. __fdividef (2 ulp, no slow path: scales are
        // normal floats): its errors telescope with the other tiles' only as a random walk, ~1e-5
        // of O after 8,192 tiles, far inside the test's 2^-8 |ref|.
        const float vr = __fdividef(sv_prev, sv_j);
        sv_prev = sv_j;
        a0 *= vr, a1 *= vr;
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            o[4 * i] *= a0;
            o[4 * i + 1] *= a0;
            o[4 * i + 2] *= a1;
            o[4 * i + 3] *= a1;
        }
        to_p();
    }
    turn_begin();
    wgmma_fence();
    pv_gemm(sKV + ((n_tiles - 1) % F8_STAGES) * SB + KB);
    wgmma_commit();
    turn_end(true);
    wgmma_wait<0>();
    fence_regs(o);

    l0 += o[HD / 2] + o[HD / 2 + 1]; // the last tile's
    l1 += o[HD / 2 + 2] + o[HD / 2 + 3];
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float sv_last = sv_prev, inv0 = sv_last / l0, inv1 = sv_last / l1; // sv_prev: the last tile's by now
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
            *reinterpret_cast<__nv_bfloat162 *>(op + 8 * i) = __floats2bfloat162_rn(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
    }
#endif // FP_HAVE_WGMMA
}

// ================================ host ================================
__device__ int f8_wgmma_built = FP_HAVE_WGMMA;

// 1 when this module has the sm_90a kernel, the device is sm_90 and the driver encodes tensor maps;
// probed once, outside capture (a call under capture before it is refused).
int f8_usable(cudaStream_t st) {
    static int state = -1;
    return sm90a_usable(st, f8_wgmma_built, &state) && tensor_map_encoder();
}

// The workspace's parts for T queries over a capacity of cap rows (NULL base: sizes only). The K/V
// copies' layout depends on cap alone, so that a later call with the same cap finds the earlier
// calls' tiles where they were made.
struct F8Parts {
    float *sk, *sv;
    uint8_t *k8, *v8t, *q8;
    float *qs;
    int capp;
    size_t bytes;
};
F8Parts f8_parts(void *ws, int T, int cap, int n_heads, int n_kv, int hd) {
    F8Parts P;
    auto up = [](size_t x) { return (x + 255) & ~(size_t)255; };
    uint8_t *b = (uint8_t *)ws;
    size_t off = 0;
    P.capp = (cap + F8_BN - 1) / F8_BN * F8_BN;
    P.sk = (float *)(b + off), off += up((size_t)n_kv * (P.capp / F8_BN) * 4);
    P.sv = (float *)(b + off), off += up((size_t)n_kv * (P.capp / F8_BN) * 4);
    P.k8 = b + off, off += up((size_t)n_kv * P.capp * hd);
    P.v8t = b + off, off += up((size_t)n_kv * hd * P.capp);
    P.q8 = b + off, off += up((size_t)T * n_heads * hd);
    P.qs = (float *)(b + off), off += up((size_t)T * n_heads * 4);
    P.bytes = off;
    return P;
}

// A 3-D e4m3 (byte) tensor map: dims innermost first, strides of dims 1 and 2 in bytes, boxes of
// b0 x b1 x 1; elements past the dims read as zeros.
cudaError_t f8_tensor_map(CUtensorMap *map, const uint8_t *base, const cuuint64_t (&dims)[3], const cuuint64_t (&strides)[2], cuuint32_t b0,
                          cuuint32_t b1, CUtensorMapSwizzle sw) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    const cuuint32_t box[3] = {b0, b1, 1}, estr[3] = {1, 1, 1};
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, (void *)base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int HD>
cudaError_t f8_launch(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int pos0, int T, int n_heads, int n_kv, int ctx, int copies_from,
                      const F8Parts &P, cudaStream_t st) {
    const int rows = pos0 + T, G = n_heads / n_kv, nq = F8_BM / G, n_qtiles = (T + nq - 1) / nq;
    const int first = copies_from / F8_BN, tiles = (rows + F8_BN - 1) / F8_BN; // the tiles this call's rows touch
    f8_quant_kv_kernel<HD><<<dim3((unsigned)(tiles - first), (unsigned)n_kv), 256, 0, st>>>(P.k8, P.v8t, P.sk, P.sv, k, v, first, rows, P.capp, ctx);
    cudaError_t e;
    f8_quant_q_kernel<HD><<<(unsigned)(((size_t)T * n_heads + 7) / 8), 256, 0, st>>>(P.q8, P.qs, q, T * n_heads);
    CUtensorMap tmk, tmv;
    memset(&tmk, 0, sizeof tmk), memset(&tmv, 0, sizeof tmv);
    const CUtensorMapSwizzle ksw = HD == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
    e = f8_tensor_map(&tmk, P.k8, {(cuuint64_t)HD, (cuuint64_t)rows, (cuuint64_t)n_kv}, {(cuuint64_t)HD, (cuuint64_t)P.capp * HD}, HD, F8_BN, ksw);
    if (e == cudaSuccess)
        e = f8_tensor_map(&tmv, P.v8t, {(cuuint64_t)P.capp, (cuuint64_t)HD, (cuuint64_t)n_kv}, {(cuuint64_t)P.capp, (cuuint64_t)HD * P.capp},
                          F8_BN, HD, CU_TENSOR_MAP_SWIZZLE_128B);
    if (e != cudaSuccess) return e;
    const int smem = f8_smem_bytes<HD>();
    // PKV_FP8_VARIANT (to measure side by side): 0 or unset the producer warpgroup and the turns, 1
    // the producer without turns, 2 thread 0's copies (the default until 2026-11-28), 3 with turns.
    static const int var = getenv("PKV_FP8_VARIANT") ? atoi(getenv("PKV_FP8_VARIANT")) : 0;
    const bool pw = var != 2 && var != 3;
    auto kern = var == 1 ? f8_wgmma_kernel<HD, false, true>
                : var == 2 ? f8_wgmma_kernel<HD, false, false>
                : var == 3 ? f8_wgmma_kernel<HD, true, false>
                           : f8_wgmma_kernel<HD, true, true>;
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    const float sl2 = (float)(1.4426950408889634 / sqrt((double)HD) / HD);
    kern<<<(unsigned)(n_qtiles * n_kv), pw ? F8_THREADS + 128 : F8_THREADS, smem, st>>>(out, P.q8, P.qs, P.sk, P.sv, pos0, T, n_heads, n_kv, P.capp, G, nq, n_qtiles, sl2,
                                                               tmk, tmv);
    return cudaGetLastError();
}
} // namespace

extern "C" size_t flash_prefill_fp8_workspace(int T, int ctx, int n_heads, int n_kv_heads, int head_dim) {
    if (T < 0 || ctx < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0) return 0;
    return f8_parts(NULL, T, ctx, n_heads, n_kv_heads, head_dim).bytes;
}

extern "C" int flash_prefill_fp8_supported(cudaStream_t stream) { return f8_usable(stream); }

extern "C" cudaError_t flash_prefill_fp8(bf16 *out, const bf16 *q, const bf16 *k_cache, const bf16 *v_cache, int pos0, int T, int n_heads,
                                         int n_kv_heads, int head_dim, int ctx, int copies_from, void *workspace,
                                         size_t workspace_bytes, cudaStream_t stream) {
    if (T == 0) return cudaSuccess;
    if (!out || !q || !k_cache || !v_cache || !workspace || T < 0 || pos0 < 0 || n_heads <= 0 || n_kv_heads <= 0 ||
        n_heads % n_kv_heads || n_heads / n_kv_heads > F8_BM || (head_dim != 64 && head_dim != 128) || (long long)pos0 + T > ctx ||
        (((uintptr_t)out | (uintptr_t)q | (uintptr_t)k_cache | (uintptr_t)v_cache) & 15) || ((uintptr_t)workspace & 255) ||
        copies_from < 0 || copies_from > pos0)
        return cudaErrorInvalidValue;
    const F8Parts P = f8_parts(workspace, T, ctx, n_heads, n_kv_heads, head_dim);
    if (workspace_bytes < P.bytes) return cudaErrorInvalidValue;
    if (!f8_usable(stream)) return cudaErrorNotSupported;
    if (head_dim == 128) return f8_launch<128>(out, q, k_cache, v_cache, pos0, T, n_heads, n_kv_heads, ctx, copies_from, P, stream);
    return f8_launch<64>(out, q, k_cache, v_cache, pos0, T, n_heads, n_kv_heads, ctx, copies_from, P, stream);
}
