// Prompt products through oneDNN's matmul (Debian libdnnl-dev 2.x), which picks its kernels at
// run time: on bf16 weights and bf16 activations (AMX or AVX512_BF16: the weights multiplied as
// stored, not widened to fp32 first), or on fp32 (the same plumbing, which tests check on any CPU).
//   y (T, d) = x (T, n) . W^T, W (d, n) row-major, accumulated in fp32, in panels of weight rows,
//   each panel one oneDNN call on the calling thread (inside the pool's tasks, as OpenBLAS is).
// Built when the Makefile finds oneDNN (DNNL=1); otherwise gemm_dnnl_create returns NULL and the
// caller keeps OpenBLAS's sgemm.
#ifndef GEMM_DNNL_H
#define GEMM_DNNL_H

#include <stdint.h>

typedef enum { GEMM_DNNL_BF16, GEMM_DNNL_F32 } GemmDnnlType;
typedef struct GemmDnnl GemmDnnl;

// The primitives of one product of T tokens over panels of `panel` weight rows (and the last,
// shorter one): NULL when oneDNN is not built in or has no such matmul for this CPU (oneDNN 2.6
// has its bf16 matmul from AVX512_BF16 up).
GemmDnnl *gemm_dnnl_create(GemmDnnlType type, int T, int n, int d, int panel);
// Rows [i0, i0 + panel) of y (clipped at d) from x (T, n; bf16 or fp32 as the type) and W (bf16 or
// fp32). 0, or -1 when oneDNN failed.
int gemm_dnnl_panel(GemmDnnl *g, float *y, const void *x, const void *w, int i0);
void gemm_dnnl_destroy(GemmDnnl *g);
// oneDNN's name for the instruction set it dispatches to here ("" when not built).
const char *gemm_dnnl_isa(void);

#endif
