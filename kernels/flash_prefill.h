// Causal grouped-query flash attention for long-prompt prefill (issue 4).
#ifndef FLASH_PREFILL_H
#define FLASH_PREFILL_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#else
// Plain C cannot see the C++ class __nv_bfloat16; its 2-byte storage type stands in (same ABI: pointers).
typedef __nv_bfloat16_raw __nv_bfloat16;
#endif

// Causal grouped-query attention for a chunk of T queries at positions pos0 .. pos0+T-1 over cache
// positions 0 .. pos0+T-1 (query t sees keys 0 .. pos0+t). Scale 1/sqrt(head_dim). fp32 accumulation.
//   out: (T, n_heads, head_dim) bf16      q: (T, n_heads, head_dim) bf16 (RoPE already applied)
//   k_cache, v_cache: (n_kv_heads, ctx, head_dim) bf16, head-major (one head's positions contiguous)
// Query head h uses KV head h / (n_heads / n_kv_heads). head_dim 64 or 128.
// Requirements: n_heads % n_kv_heads == 0, n_heads / n_kv_heads <= 128, pos0 >= 0, pos0 + T <= ctx,
// all four pointers 16-byte aligned. Only cache rows 0 .. pos0+T-1 are read. T == 0 is a no-op.
// Returns cudaErrorInvalidValue for bad arguments, else the launch error. No allocation; no host sync
// except on the first call, which probes once whether the loaded module has the sm_90a kernel: make that
// first call outside stream capture (a call under capture before it takes the mma kernel).
cudaError_t flash_prefill(__nv_bfloat16 *out, const __nv_bfloat16 *q, const __nv_bfloat16 *k_cache,
                          const __nv_bfloat16 *v_cache, int pos0, int T, int n_heads, int n_kv_heads,
                          int head_dim, int ctx, cudaStream_t stream);

// The same in fp8 (--prefill-attn fp8; flash_prefill_fp8.cu): q and the visible K/V rows rounded to
// e4m3 (one scale per query row, one per KV head and 128-row tile for K and for V), the weights P to
// e4m3, fp32 accumulation. Needs an sm_90 GPU and this build's sm_90a code
// (flash_prefill_fp8_supported: 1). workspace: at least flash_prefill_fp8_workspace(T, ctx, ...)
// bytes of device memory, 256-byte aligned (e4m3 copies of the rows, laid out by ctx, and of the
// chunk's queries). copies_from (<= pos0): rows [0, copies_from) are unchanged since an earlier call
// with this workspace, ctx and caches, whose copies of them are reused (0: every row copied).
// cudaErrorNotSupported where the GPU or build has no fp8 path; else as flash_prefill.
size_t flash_prefill_fp8_workspace(int T, int ctx, int n_heads, int n_kv_heads, int head_dim);
int flash_prefill_fp8_supported(cudaStream_t stream);
cudaError_t flash_prefill_fp8(__nv_bfloat16 *out, const __nv_bfloat16 *q, const __nv_bfloat16 *k_cache,
                              const __nv_bfloat16 *v_cache, int pos0, int T, int n_heads, int n_kv_heads,
                              int head_dim, int ctx, int copies_from, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
