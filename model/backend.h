// The operations the forward pass is written in. The CPU backend (backend_cpu.c) is the
// reference; the CUDA backend (kernels/) implements the same table over device memory.
// Activations are fp32, row-major, T rows (tokens) at a time.
#ifndef BACKEND_H
#define BACKEND_H

#include <stdint.h>

typedef struct Backend {
    const char *name;
    // y (T, d) = x (T, n) · W^T, W (d, n) stored in dtype (DType)
    void (*matmul)(float *y, const float *x, const void *w, uint32_t dtype, int T, int n, int d);
    // out (T, n) = x / rms(x) * w, per row
    void (*rmsnorm)(float *out, const float *x, const float *w, int T, int n, float eps);
    // out (T, dim) = rows of the embedding table E (vocab, dim) in dtype
    void (*embed)(float *out, const void *E, uint32_t dtype, const int *tokens, int T, int dim);
    // Rotate-half RoPE in place on x (T, n_heads, head_dim), token t at position pos0 + t,
    // with inv_freq (head_dim / 2) angular frequencies.
    void (*rope)(float *x, const float *inv_freq, int pos0, int T, int n_heads, int head_dim);
    // a (n) = silu(a) * b
    void (*swiglu)(float *a, const float *b, long n);
    // x (n) += y
    void (*add)(float *x, const float *y, long n);
} Backend;

extern const Backend backend_cpu;

#endif
