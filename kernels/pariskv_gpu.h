// ParisKV on the GPU: the index of the retrieval zone (encoded keys, id counts) and one decode
// step's selection (query transform, 6-tier collision vote, bucket top-C, rerank, top-k), the
// same math as attention/pariskv_*.c (the CPU reference these kernels are checked against).
//
// Everything a decode step launches reads the zone size n from device memory (*d_n), and its
// grid depends only on the index's capacity: one captured CUDA graph serves every step. The
// encoding runs every U steps, outside the graph, with host-side bounds.
#ifndef PARISKV_GPU_H
#define PARISKV_GPU_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PKV_GPU_MAX_D 256 // scores fit a byte: 6 tiers x D/8 subspaces <= 192

// The index of every (layer, KV head), in device memory. Slot i is the i-th zone key (position
// sink + i). B = D / 8 subspaces; per key 7 B per subspace (112 B at D = 128).
typedef struct {
    int n_layers, n_kv, D, B;
    int cap;          // zone slots per (layer, KV head)
    uint8_t *ids;     // (n_layers, n_kv, cap, B)      sign-pattern id per subspace
    uint8_t *cw;      // (n_layers, n_kv, cap, B * 6)  per key: its 4-bit codes (B * 4 bytes, even
                      //   coordinate in the low nibble), then its fp16 w = ||k|| r_b / alpha_b
                      //   (B * 2 bytes): the rerank gathers one record a candidate
    int32_t *count;   // (n_layers, n_kv, B, 256)      zone keys with each id, per subspace
    float *signs;     // (D) the SRHT signs (srht_signs(SRHT_SEED, D))
} PkvGpuIndex;

size_t pkv_gpu_index_bytes(int n_layers, int n_kv, int D, int cap);
// Allocates and zeroes the index (signs uploaded); cudaFree-based pkv_gpu_index_free.
cudaError_t pkv_gpu_index_alloc(PkvGpuIndex *ix, int n_layers, int n_kv, int D, int cap, cudaStream_t st);
void pkv_gpu_index_free(PkvGpuIndex *ix);
// All counts of one layer (or every layer: layer < 0) to zero: a new sequence.
cudaError_t pkv_gpu_index_reset(PkvGpuIndex *ix, int layer, cudaStream_t st);

// Where the zone keys are read from when encoding: the key of (layer l, KV head h, slot i) is
// the D bf16 values at base + l * layer_stride + h * head_stride + i * slot_stride (elements).
// The device cache (n_layers, n_kv, ctx, D) and the host store (slot, layer, head, [K | V]) are
// both such strided views; base may be a host pointer registered for UVA.
// fp8 != NULL instead: e4m3 keys (offload/fp8.h) of the fp8 host store: the D codes of (l, h, i)
// at byte fp8 + l * layer_stride + h * head_stride + i * slot_stride (strides in bytes), their
// scale the float scale_offset bytes after the row's first code; encoded from the values
// decode(code) * scale, as fp8_dequantize_row gives them.
// round_fp8 (with base): each bf16 key first rounded as the fp8 host store rounds it (one scale a
// row, rows_to_host_fp8), so that keys still in GPU memory encode as their stored copies would.
typedef struct {
    const bf16 *base;
    size_t layer_stride, head_stride, slot_stride;
    const uint8_t *fp8;
    size_t scale_offset;
    int round_fp8;
} PkvKeySource;

// Encodes slots [from, to) of every layer and KV head (keys from src) into ix and adds them to
// the id counts. from/to are host values: this runs at index updates, outside the decode graph.
cudaError_t pkv_gpu_encode(const PkvGpuIndex *ix, PkvKeySource src, int from, int to, cudaStream_t st);
// The same for one layer (src's keys are that layer's: its layer_stride unused).
cudaError_t pkv_gpu_encode_layer(const PkvGpuIndex *ix, PkvKeySource src, int layer, int from, int to, cudaStream_t st);

// Scratch of one layer's selection, device memory, reused by every layer.
typedef struct {
    float *qt;       // (n_kv, D) SRHT(q / ||q||) of the group's mean query
    float *qn;       // (n_kv) ||mean query||
    uint8_t *bonus;  // (n_kv, B, 256)    tier bonus of each pattern
    uint8_t *score;  // (n_kv, cap) vote scores
    int32_t *hist;   // (n_kv, hist_stride) histograms and counters of the top-C and top-k
    int *cand;       // (n_kv, cap) candidate slots
    float *est;      // (n_kv, cap) their estimates
    int *sel;        // (n_kv, kmax) the selected slots
    int *nsel;       // (n_kv) how many
    int kmax, R;     // R: rerank blocks per head
    int hist_stride;
    int five;        // 1: the five-kernel selection of session 5 (PKV_SELECT=five, for comparisons)
    int radix;       // 1: the top-k by radix passes only, never from a list (PKV_TOPK_RADIX=1, for comparisons)
    void *base;      // the one allocation
} PkvGpuScratch;

cudaError_t pkv_gpu_scratch_alloc(PkvGpuScratch *s, const PkvGpuIndex *ix, int kmax);
void pkv_gpu_scratch_free(PkvGpuScratch *s);

// One layer's selection for every KV head. The query: q (n_heads, D) fp32 after RoPE (and
// q_norm); per KV head the mean over the G = n_heads / n_kv heads of its group (summed in head
// order, then / G), normalized, rotated, as pkv_prepare_query on the group mean (kept in s->qt,
// s->qn). Over the zone's *d_n keys: bonus (tier targets ceil(n rho r_t)), vote, bucket top-C
// (C = max(ceil(beta n), min(k, n)), ties to the smaller slot), rerank (fp32), top-k by
// estimate (ties to the smaller slot). beta, rho <= 0: the schedule of pkv_schedule by n.
// n <= k selects every slot. Result: s->sel (n_kv, kmax) slots ascending, s->nsel (n_kv) their
// count = min(k, n). k <= s->kmax.
cudaError_t pkv_gpu_select(PkvGpuScratch *s, const PkvGpuIndex *ix, int layer, const float *q, int n_heads, const int *d_n,
                           int k, float beta, float rho, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
