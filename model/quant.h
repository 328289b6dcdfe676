// Block-quantized matrices, byte for byte GGML's formats, so a GGUF tensor is kept as it is:
//   Q8_0  32 weights in 34 bytes: fp16 d, 32 x int8 q; w = d q
//   Q4_K  256 weights in 144 bytes: fp16 d, fp16 dmin, 12 bytes of eight 6-bit scales and eight
//         6-bit mins, 128 bytes of 4-bit q; sub-block s (32 weights) has w = d sc_s q - dmin m_s
//   Q4_0  32 weights in 18 bytes: fp16 d, 16 bytes of 4-bit q (weight j in byte j's low nibble,
//         weight 16 + j in its high one); w = d (q - 8). Read from GGUF files only (no quantizer).
//   Q6_K  256 weights in 210 bytes: ql[128] (low 4 bits), qh[64] (high 2), int8 scales[16] (one
//         per 16 weights), fp16 d last; w = d sc (q - 32). From GGUF files only; the GPU widens it.
//   Q4_1  32 weights in 20 bytes: fp16 d, fp16 m, qs[16] as Q4_0's; w = d q + m
//   Q5_0  32 weights in 22 bytes: fp16 d, qh[4] (bit j: weight j's fifth bit), qs[16]; w = d (q - 16)
//   Q5_1  32 weights in 24 bytes: fp16 d, fp16 m, qh[4], qs[16]; w = d q + m
//   Q5_K  256 weights in 176 bytes: Q4_K's d, dmin and scales, qh[32] (bit s of qh[l]: weight
//         32s + l's fifth bit), qs[128]; w = d sc_s q - dmin m_s
//         These four from GGUF files only (quant_q45.c); the GPU widens them to bf16.
// A row of a matrix is whole blocks (its length a multiple of 32 or 256), so rows never share a
// block. Also the sizes of every dtype (f32, bf16 too), quantization (./export), dequantization
// and the dot products the CPU path multiplies with.
#ifndef QUANT_H
#define QUANT_H

#include <stddef.h>
#include <stdint.h>
#include "config.h"

#define QK8_0 32
#define Q8_0_BYTES 34
#define QK_K 256
#define Q4_K_BYTES 144
#define QK4_0 32
#define Q4_0_BYTES 18
#define Q6_K_BYTES 210
#define Q4_1_BYTES 20
#define Q5_0_BYTES 22
#define Q5_1_BYTES 24
#define Q5_K_BYTES 176

int dtype_is_quant(uint32_t dtype);
const char *dtype_name(uint32_t dtype); // "f32", "bf16", "q8_0", "q4_k", "q4_0", "q6_k", "q4_1", ..., or "?"
uint32_t dtype_block_elems(uint32_t dtype); // 1 for f32 / bf16; 0 for an unknown dtype
// Bytes of one row of cols weights; 0 for an unknown dtype or a row that is not whole blocks.
uint64_t dtype_row_bytes(uint32_t dtype, uint64_t cols);

// One row of n weights (n a multiple of the block) to blocks. Q8_0 is GGML's (and gguf-py's)
// quantize_row_q8_0_ref, Q4_K its quantize_row_q4_K_ref (no importance matrix), each operation
// rounded as written (a GGML built with fused multiply-adds may differ in a rare Q4_K block).
void quantize_row_q8_0(const float *x, uint8_t *out, size_t n);
void quantize_row_q4_k(const float *x, uint8_t *out, size_t n);

// Sub-block j (0..7) of a Q4_K block's 12 scale bytes: its 6-bit scale and min.
void q4_k_scale_min(int j, const uint8_t *scales, int *sc, int *m);

// The GPU upload's entry point (and the CPU's dequantizer): rows row0 .. row0 + n_rows of a
// (rows, cols) matrix stored in dtype (f32, bf16, q8_0, q4_k, q4_0, q6_k) as fp32 in out (n_rows * cols),
// each value exactly GGML's dequantization of it. cols must be whole blocks of dtype.
void weights_rows_to_f32(const void *src, uint32_t dtype, size_t row0, size_t n_rows, size_t cols, float *out);

// sum_j w_j x_j over one row of n weights, x fp32 (a product over several tokens when its panel
// scratch could not be allocated).
float dot_q8_0(const uint8_t *w, const float *x, int n);
float dot_q4_k(const uint8_t *w, const float *x, int n);
float dot_q4_0(const uint8_t *w, const float *x, int n);
float dot_q6_k(const uint8_t *w, const float *x, int n);

// The activations of a decode step's product with quantized weights, on the CPU and the GPU alike:
// per 32 values quantized as GGML's Q8_0 quantizes (d = max|x| / 127, q = round(x * (1 / d)), the
// same roundings) with d kept in fp32, and each block's sum of q (Q4_K's min term). A row's dot
// product is then exact integer sums per 32 weights, scaled in fp32 (GGML's vec_dot on Q8_0 /
// Q8_K activations; llama.cpp's CUDA decode on Q8_1). A prefill multiplies fp32 (bf16 on the GPU)
// activations by the dequantized weights instead.
typedef struct {
    int n;        // values, a multiple of 32
    int8_t *q;    // (n)
    float *d;     // (n / 32)
    int32_t *sum; // (n / 32): sum of the block's q
} ActQ8;
void act_q8_quantize(const float *x, ActQ8 *a);
// sum_b d_b dx_b sum_j q_j qx_j (Q8_0); sum_s dx_s (d sc_s sum_j q_j qx_j - dmin m_s sum_j qx_j) (Q4_K).
float dot_q8_0_act(const uint8_t *w, const ActQ8 *a);
float dot_q4_k_act(const uint8_t *w, const ActQ8 *a);
// sum_b d_b dx_b (sum_j q_j qx_j - 8 sum_j qx_j) (Q4_0).
float dot_q4_0_act(const uint8_t *w, const ActQ8 *a);
// sum_r dx_(r / 2) d sc_r sum_j (q_j - 32) qx_j over the 16-weight runs r (Q6_K).
float dot_q6_k_act(const uint8_t *w, const ActQ8 *a);
// The same products with AVX512_VNNI (quant_vnni.c): equal to the AVX2 kernels bit for bit; to be
// called only where cpu_int8_vnni() (cpu_isa.h) says the CPU has them.
float dot_q8_0_act_vnni(const uint8_t *w, const ActQ8 *a);
float dot_q4_k_act_vnni(const uint8_t *w, const ActQ8 *a);
float dot_q4_0_act_vnni(const uint8_t *w, const ActQ8 *a);
// The one of the above for a quantized dtype (w: one row of it); VNNI's where cpu_int8_vnni().
float dot_act(const uint8_t *w, uint32_t dtype, const ActQ8 *a);

// Q4_1, Q5_0, Q5_1, Q5_K (quant_q45.c): n weights from p dequantized into out; a row's dot product
// with fp32 x (over the dequantized weights) and with decode activations (Q4_1 / Q5_1: sum_b (d dx
// sum_j q_j qx_j + m dx sum_j qx_j); Q5_0: sum_b d dx (sum_j q_j qx_j - 16 sum_j qx_j); Q5_K as Q4_K).
int dtype_is_q45(uint32_t dtype);
void dequantize_q45(const uint8_t *p, uint32_t dtype, size_t n, float *out);
float dot_q45(const uint8_t *w, uint32_t dtype, const float *x, int n);
float dot_q45_act(const uint8_t *w, uint32_t dtype, const ActQ8 *a);

#endif
