// Kernel variants kept for the side-by-side benchmarks and tests (kernels/test_*.cu), apart
// from the launchers the pass uses (kernels.h, gemv_quant.h, flash_prefill.h): each launcher
// calls the variant that won its benchmark, and the losers stay here, measured, not in the pass.
#ifndef VARIANTS_H
#define VARIANTS_H

#include "flash_prefill.h"
#include "gemv_quant.h"
#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// gemv_bf16's (gemv.cu): rowwarp2 (two rows a warp) is the one it calls: faster than rowwarp (one) on the
// 8B shapes, level on the LM heads and SmolLM2's; staged lost on every shape (tests/bench/GPU.md, session 26).
cudaError_t gemv_bf16_staged(void *y, const bf16 *W, const bf16 *x, int n, int d, int epilogue, cudaStream_t st);
cudaError_t gemv_bf16_rowwarp(void *y, const bf16 *W, const bf16 *x, int n, int d, int epilogue, cudaStream_t st);
cudaError_t gemv_bf16_rowwarp2(void *y, const bf16 *W, const bf16 *x, int n, int d, int epilogue, cudaStream_t st);

// attn_decode (kernels.h) with its form chosen: AUTO is the pass's (MMA); FMA: each K/V row's
// dot products and weighted sums on the FMA pipes, a stream of HD/8 lanes a row; MMA: 16 keys a
// warp by mma.sync (attention_decode.cu has the measurements).
enum { ATTN_DECODE_AUTO = 0, ATTN_DECODE_FMA = 1, ATTN_DECODE_MMA = 2 };
cudaError_t attn_decode_variant(bf16 *out, const float *qkv, const float *q_norm, const float *k_norm, const float *rope_cs,
                                bf16 *k_cache, bf16 *v_cache, const int *d_pos, int n_heads, int n_kv, int hd, int ctx, float eps,
                                float *partial, unsigned *counters, int variant, cudaStream_t st);

// The tests' and benchmark's side-by-side variants of gemv_q (with y_bf16 and sumsq, ADD is
// gemv_q_add_stats), blocks of 0: 8 warps, 1: 16 (two rows a warp either way); -1 the launch's
// pick. Either computes the same sums in the same order.
cudaError_t gemv_q_variant(void *y, const QMat *m, const bf16 *x, int epilogue, bf16 *y_bf16, float *sumsq, int variant, cudaStream_t st);

// flash_prefill (flash_prefill.h) with the implementation chosen (for tests and benchmarks):
//   FLASH_PREFILL_AUTO  : wgmma when this build has sm_90a code and the device is sm_90 (the
//                         threads' copies if the driver has no tensor-map encoder), else mma
//   FLASH_PREFILL_WGMMA : Hopper wgmma kernel, K/V tiles by TMA from a producer warpgroup, the
//                         consumers taking turns, O rescaled lazily, the exponentials before
//                         the row maxima (MODE 7; needs -gencode arch=compute_90a,code=sm_90a);
//                         cudaErrorInvalidDeviceFunction if this build has no sm_90a code
//   FLASH_PREFILL_MMA   : portable mma.sync m16n8k16 kernel (sm_80 and newer)
//   FLASH_PREFILL_WGMMA_M0, _M1, _M2 : the wgmma kernel with K/V copied by the threads (MODE 0, the
//                         default until 2026-11-27, and its scheduling variants 1, 2; see the .cu)
//   FLASH_PREFILL_WGMMA_M3, _M4 : TMA issued by thread 0 of the consumers (MODE 3, the default until
//                         2026-11-28), and MODE 5 without the turns
//   FLASH_PREFILL_WGMMA_N160 : MODE 5 with tiles of 160 keys (a ring of 2)
//   FLASH_PREFILL_WGMMA_M5 : MODE 6 rescaling O every tile (MODE 5, the default until 2026-11-28)
//   FLASH_PREFILL_WGMMA_M6 : MODE 7 with the row maxima before the exponentials (MODE 6)
enum { FLASH_PREFILL_AUTO = 0, FLASH_PREFILL_WGMMA = 1, FLASH_PREFILL_MMA = 2, FLASH_PREFILL_WGMMA_M1 = 3,
       FLASH_PREFILL_WGMMA_M2 = 4, FLASH_PREFILL_WGMMA_M0 = 5, FLASH_PREFILL_WGMMA_M3 = 6, FLASH_PREFILL_WGMMA_M4 = 7,
       FLASH_PREFILL_WGMMA_N160 = 8, FLASH_PREFILL_WGMMA_M5 = 9, FLASH_PREFILL_WGMMA_M6 = 10 };
cudaError_t flash_prefill_impl(int impl, __nv_bfloat16 *out, const __nv_bfloat16 *q,
                               const __nv_bfloat16 *k_cache, const __nv_bfloat16 *v_cache, int pos0,
                               int T, int n_heads, int n_kv_heads, int head_dim, int ctx,
                               cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
