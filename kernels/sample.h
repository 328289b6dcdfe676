// The next token on the GPU: model/sampler.h's definition (penalties, temperature, top-k, top-p,
// min-p), the same id as the CPU's sampler_pick for the same logits and u. A fixed sequence of
// kernels (kernels/sample.cu: up to 256 blocks over the vocabulary, the decisions in the last
// block of each pass); everything that changes per step is read through pointers when the
// kernels run, so a captured CUDA graph replays them (the same launches for every setting with a
// fixed n_valid and pen NULL or not, no allocation, no host sync).
#ifndef SAMPLE_H
#define SAMPLE_H

#include <cuda_runtime.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n_valid;       // 1 .. 2^22 logits are read (ids past it, vocabulary padding, never picked)
    float temperature; // <= 0: greedy (argmax, lowest id among equals)
    int top_k;         // 0: off
    float top_p;       // 1: off
    float min_p;       // 0: off
    float repeat, presence, frequency; // the penalties' parameters (used only with a list)
} SampleParams;

// Bytes of device scratch gpu_sample needs for n_valid logits: p (a float per logit), a list of
// (rank value, P) pairs (16 bytes per logit: every token may share one histogram bin), the
// histograms (65,536 + 256 bins of count and P, 0.8 MB), per-block partials and a control struct.
size_t gpu_sample_scratch_bytes(int n_valid);

// logits: device, n_valid floats; the penalties are applied to them in place.
// sp: copied by value at launch. u: a uniform in [0, 1) (sampler_uniform), read when the kernel
// runs (pinned host or device). pen: NULL (no penalties) or pen[0] = count, then ids[count], then
// counts[count] (sampler_penalty_list), read when the kernel runs (pinned host or device).
// out (pinned host or device): out[0] = the id, out[1] = the first non-finite logit's index or -1
// (then out[0] = 0: a graph that feeds out[0] on stays in bounds). scratch: device,
// gpu_sample_scratch_bytes(n_valid).
cudaError_t gpu_sample(float *logits, const SampleParams *sp, const float *u, const int *pen, int *out, void *scratch,
                       cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
