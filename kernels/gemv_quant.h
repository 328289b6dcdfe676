// Quantized weights on the GPU: model/quant.h's Q8_0, Q4_K and Q4_0 matrices, kept as their blocks.
//
// On the device a block is split into its head and its quants (the same bytes, so the same
// bandwidth floor), so that every row's quants are 16-byte aligned whatever the row length:
//   Q8_0  qs:   int8 (rows, cols);          meta: fp16 d (rows, cols / 32)
//   Q4_K  qs:   uint8 (rows, cols / 2), each super-block's 128 bytes in GGML's order;
//         meta: (rows, cols / 256) x 16 bytes: fp16 d, fp16 dmin, the 12 scale bytes
//   Q4_0  qs:   uint8 (rows, cols / 2), each block's 16 bytes; meta: fp16 d (rows, cols / 32)
// A row's quants are 32-byte units (a Q8_0 block, Q4_K's sub-block pair, two Q4_0 blocks) whose
// 16-byte halves are interleaved in groups of 32 units (gemv_quant.cu says why); the decode
// GEMVs read a unit a lane.
// A matrix's rows may be any permutation of the source rows (the fused QKV rows, the
// interleaved gate/up rows): blocks never cross rows.
#ifndef GEMV_QUANT_H
#define GEMV_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint32_t dt;   // DTYPE_Q8_0, DTYPE_Q4_K or DTYPE_Q4_0 (model/config.h); 0: none
    int rows, cols;
    int8_t *qs;    // device
    uint8_t *meta; // device
} QMat;

// Whether the GPU keeps a matrix of rows cols wide in dt as blocks (Q8_0: cols a multiple of 32,
// Q4_K: 256, Q4_0: 64, the width of its unit); otherwise it is widened to bf16.
int qmat_supported(uint32_t dt, size_t cols);
size_t qmat_qs_bytes(uint32_t dt, size_t rows, size_t cols);
size_t qmat_meta_bytes(uint32_t dt, size_t rows, size_t cols);
// Host side of the upload: rows [0, n) of the GGML-block matrix src (cols wide) into host
// buffers qs / meta laid out as above, source row i becoming row row0 + i * step.
void qmat_repack_rows(uint32_t dt, const uint8_t *src, size_t n, size_t cols, size_t row0, size_t step, int8_t *qs, uint8_t *meta);

// Random blocks with weights spread over about [-a, a] (synthetic models).
cudaError_t qmat_fill_random(QMat *m, unsigned long long seed, float a, cudaStream_t st);

// W (rows, cols) bf16 = the dequantized matrix, column c times g[c] (g NULL: 1): what a prefill
// GEMM multiplies (the RMSNorm's weights folded in, as for bf16 weights at load time).
cudaError_t qmat_to_bf16(bf16 *W, const QMat *m, const float *g, cudaStream_t st);

// Decode GEMVs on quantized rows, with gemv.cu's epilogues (GEMV_STORE, GEMV_ADD, GEMV_SWIGLU)
// and its split RMSNorm: x (cols) bf16;
//   gemv_q:           y = W.x (STORE), y += W.x (ADD), or SwiGLU of row pairs;
//   gemv_q_add_stats: y (rows) fp32 += W.x, y_bf16 = bf16(y), sumsq[r / 4] = sums of y^2 over
//                     rows in fours (gemv_sumsq_count(rows) of them, as gemv_bf16_add_stats);
//   gemv_q_normed:    as gemv_q (STORE or SWIGLU) with x_c replaced by x_c g_c / rms,
//                     rms = sqrt(sum(sumsq) / cols + eps): the norm's weights g are applied here
//                     (they cannot be folded into the blocks' columns).
cudaError_t gemv_q(void *y, const QMat *m, const bf16 *x, int epilogue, cudaStream_t st);
cudaError_t gemv_q_add_stats(float *y, const QMat *m, const bf16 *x, bf16 *y_bf16, float *sumsq, cudaStream_t st);
cudaError_t gemv_q_normed(void *y, const QMat *m, const bf16 *x, int epilogue, const float *g, const float *sumsq, int n_sumsq,
                          float eps, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
