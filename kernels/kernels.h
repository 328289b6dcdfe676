// Launchers of the CUDA kernels (C linkage, callable from C). All run on the given stream and
// return the launch error. Shapes follow model/backend.h: row-major, T rows at a time.
#ifndef KERNELS_H
#define KERNELS_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef __nv_bfloat16 bf16;

// How a GEMV writes its result.
enum GemvEpilogue {
    GEMV_STORE = 0,  // y[i] = W[i]·x
    GEMV_ADD = 1,    // y[i] += W[i]·x (residual)
    GEMV_SWIGLU = 2, // W rows interleaved gate/up: h[i] = silu(W[2i]·x) * (W[2i+1]·x), written as bf16
};

// Decode matrix-vector product: W (d, n) bf16 row-major, x (n) bf16, y (d) fp32 (or (d/2) bf16
// for GEMV_SWIGLU). n must be a multiple of 8.
cudaError_t gemv_bf16(void *y, const bf16 *W, const bf16 *x, int n, int d, int epilogue, cudaStream_t st);

// Decode, the RMSNorm between a residual and the next GEMV split across the two (gemv.cu):
// gemv_bf16_add_stats: y (d) fp32 += W·x, y_bf16 = bf16(y), sumsq[b] = sum of y² over the rows
//   of block b (gemv_sumsq_count(d) sums);
// gemv_bf16_normed: like gemv_bf16 (GEMV_STORE or GEMV_SWIGLU), with x = that bf16(y) and the
//   dot products divided by rms = sqrt(sum(sumsq) / n + eps); W's columns must carry the norm's
//   weights (scale_columns).
int gemv_sumsq_count(int d);
cudaError_t gemv_bf16_add_stats(float *y, const bf16 *W, const bf16 *x, int n, int d, bf16 *y_bf16, float *sumsq,
                                cudaStream_t st);
cudaError_t gemv_bf16_normed(void *y, const bf16 *W, const bf16 *x, int n, int d, int epilogue, const float *sumsq,
                             int n_sumsq, float eps, cudaStream_t st);
// Tensor parallel decode over peer access: the residual's sum over the ranks fused into the GEMV
// that makes each rank's part (gemv_bf16_add_stats_tp). Each warp, its row computed, stores it
// beside the call's number into every peer's slot (8 bytes in one store, NCCL's LL protocol) and
// polls its own slots for the peers' values of the row; the N parts are summed in rank order, so
// every rank writes the same bits. The call's number is count * per_step + call: count is the
// step's number (embed_stats adds one), call this sum's place in the step; consecutive calls
// alternate the parity of the slots they use, so per_step must be even.
#define TP_SUM_RANKS 16
#define TP_SUM_ROWS 16384 // a slot's entries: the decode residual (dim) at most
typedef struct {
    void *slot[TP_SUM_RANKS]; // rank q's receive slots (uint2 entries): 2 parities x n ranks x TP_SUM_ROWS
    const unsigned *count;    // this rank's step count
    unsigned call, per_step;
    int rank, n;
    int add;      // y's old value is added to this rank's part (rank 0: the residual)
    int own_only; // planted error for the checks: the sum made, but this rank's own part kept
} TpSum;
// y (d) = the ranks' sum of W·x (+ y on the rank with add), y_bf16 and sumsq as gemv_bf16_add_stats.
cudaError_t gemv_bf16_add_stats_tp(float *y, const bf16 *W, const bf16 *x, int n, int d, bf16 *y_bf16, float *sumsq, TpSum tp,
                                   cudaStream_t st);
// W (rows, cols) bf16: column c *= g[c].
cudaError_t scale_columns(bf16 *W, size_t rows, int cols, const float *g, cudaStream_t st);

// Decode: x (dim) fp32 = row of E for *token, x_bf16 = bf16(x), *sumsq = sum of x² (the stats
// gemv_bf16_normed reads, as one sum); count (the TpSum step count; NULL: none) += 1.
cudaError_t embed_stats(float *x, bf16 *x_bf16, float *sumsq, const bf16 *E, const int *token, int dim, unsigned *count,
                        cudaStream_t st);
// The residual x (dim) after the ranks' all-reduce: its bf16 copy and sum of squares, as embed_stats.
cudaError_t residual_stats(const float *x, bf16 *x_bf16, float *sumsq, int dim, cudaStream_t st);

// out (T, n) bf16 = x (T, n) fp32 / rms * w (w NULL: no weights)
cudaError_t rmsnorm_bf16(bf16 *out, const float *x, const float *w, int T, int n, float eps, cudaStream_t st);

// x (T, dim) fp32 = rows of E (vocab, dim) bf16 for tokens (device ids)
cudaError_t embed_rows(float *x, const bf16 *E, const int *tokens, int T, int dim, cudaStream_t st);

// After the QKV projection: qkv (T, (n_heads + 2 n_kv) * hd) fp32 →
//   q_out (T, n_heads, hd) bf16 with optional per-head RMSNorm (q_norm) and RoPE,
//   k → k_cache (n_kv, ctx, hd) bf16 at positions pos .. pos+T-1 (k_norm, RoPE), v → v_cache.
// The position comes from *d_pos (device), so a captured graph replays at any position.
cudaError_t qkv_rope_store(bf16 *q_out, bf16 *k_cache, bf16 *v_cache, const float *qkv, const float *q_norm,
                           const float *k_norm, const float *inv_freq, const int *d_pos, int T, int n_heads,
                           int n_kv, int hd, int ctx, float eps, cudaStream_t st);

// cs (2 half) fp32 = cos, then sin, of *d_pos * inv_freq[j], j < half: RoPE for a decode step.
cudaError_t rope_table(float *cs, const float *inv_freq, const int *d_pos, int half, cudaStream_t st);

// h (T, hidden) bf16 = silu(gu[:, 2i]) * gu[:, 2i+1], gu (T, 2 hidden) bf16 (16-byte aligned, both)
cudaError_t swiglu_pairs(bf16 *h, const bf16 *gu, int T, int hidden, cudaStream_t st);

// Decode attention for one token at position *d_pos, fused with the QKV post-processing:
// qkv ((n_heads + 2 n_kv) * hd) fp32 is the QKV projection's output; q and the new key get the
// optional per-head RMSNorm (q_norm, k_norm) and RoPE (rope_cs from rope_table()), the new K/V row is stored in the caches
// (n_kv, ctx, hd) bf16 at *d_pos, and out (n_heads, hd) bf16 = attention over 0 .. *d_pos.
// partial: attn_decode_scratch_floats() floats; counters: n_kv zeroed unsigned ints (the kernel
// leaves them zeroed). The grid depends only on the device and ctx, so graphs stay valid.
size_t attn_decode_scratch_floats(int n_heads, int n_kv, int hd, int ctx);
cudaError_t attn_decode(bf16 *out, const float *qkv, const float *q_norm, const float *k_norm, const float *rope_cs,
                        bf16 *k_cache, bf16 *v_cache, const int *d_pos, int n_heads, int n_kv, int hd, int ctx,
                        float eps, float *partial, unsigned *counters, cudaStream_t st);

// Simple exact causal attention for T queries at positions pos0..: one block per (query, head).
// The reference the tiled prefill kernel is checked against, and a fallback.
cudaError_t attn_prefill_simple(bf16 *out, const bf16 *q, const bf16 *k_cache, const bf16 *v_cache, int pos0, int T,
                                int n_heads, int n_kv, int hd, int ctx, cudaStream_t st);

// Fill with uniform random values in [-scale, scale] + offset (synthetic weights, tests).
cudaError_t fill_random_bf16(bf16 *p, size_t n, unsigned long long seed, float scale, float offset, cudaStream_t st);
// The (rows, cols) block at (row0, col0) of a matrix of src_cols columns that fill_random_bf16
// would make whole (offset 0), into p with row pitch `pitch` elements.
cudaError_t fill_random_bf16_2d(bf16 *p, size_t pitch, size_t rows, size_t cols, size_t src_cols, size_t row0, size_t col0,
                                unsigned long long seed, float scale, cudaStream_t st);
cudaError_t fill_random_f32(float *p, size_t n, unsigned long long seed, float scale, float offset, cudaStream_t st);

// Streaming read of n bytes (bandwidth measurement); result written to *sink.
cudaError_t read_bandwidth_kernel(const void *p, size_t n, float *sink, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
