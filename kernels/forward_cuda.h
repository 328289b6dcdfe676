// The CUDA backend's extra entry points, for the benchmark mode and the GPU tests.
#ifndef FORWARD_CUDA_H
#define FORWARD_CUDA_H

#include <cuda_runtime.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "../model/model.h"
#include "../attention/attention.h"

typedef struct GpuState GpuState;

void *gpu_create(const Model *m, int ctx, int chunk, int all_logits, const AttnConfig *attn, char *err);
void gpu_set_prefill_len(void *dev, int prefill_len);
float *gpu_forward(void *dev, const int *tokens, int T, int pos, int all_logits, char *err);
void gpu_destroy(void *dev);
// Sampling inside the decode step (model/backend.h's sample_config, decode_sample).
struct Sampler;
int gpu_sample_config(void *dev, const struct Sampler *s, char *err);
int gpu_decode_sample(void *dev, int token, int pos, float u, const int *pen_ids, const int *pen_counts, int n_pen, char *err);
size_t gpu_weight_bytes(const Config *c);   // bytes of weights a decode step reads (bf16 weights)
// The same for m's weights as the GPU keeps them (blocks read as blocks), and the GPU memory they
// take there: one GPU's share when m is split over gpus GPUs (1: all of it).
size_t gpu_model_step_bytes(const Model *m, int gpus);
size_t gpu_model_weight_bytes(const Model *m, int gpus);
size_t gpu_kv_bytes(const Config *c, int ctx);
size_t gpu_state_weight_bytes(void *dev);
// Fills positions 0 .. n_tokens-1 of every layer's cache with random K/V (contexts too long to prefill).
cudaError_t gpu_fill_kv_random(void *dev, int n_tokens);
// Times n decode steps at position pos after warmup steps (sample: with the sampler set by
// gpu_sample_config inside each); per-step milliseconds into ms_out.
cudaError_t gpu_time_decode(void *dev, int pos, int warmup, int n, int sample, float *ms_out);
// --bench-prefill's breakdown: start != 0 starts timing each layer's prefill attention (events
// around the kernel); returns the milliseconds summed over the forward passes since (-1: none).
double gpu_prefill_attention_ms(void *dev, int start);
// The GPUs the state spans (Model.gpus), and what a decode step's communication between them
// takes alone (its all-reduces and the logits' gather, replayed as a graph: median ms; 0 on one).
int gpu_count(void *dev);
cudaError_t gpu_comm_time(void *dev, int reps, double *median_ms);
// How the step's sums travel: "NCCL", or the one-shot all-reduce over peer access (tp_oneshot.cu).
const char *gpu_comm_kind(void *dev);
// Measured streaming read bandwidth of the device, bytes per second.
double gpu_read_bandwidth(void);
// ./run --bench: for each context, fill (real prefill of random tokens in chunks, or random
// K/V), time `steps` decode steps ending in the device's sampler -- greedy, and with smp's
// settings -- and print a table with the bandwidth floor. ParisKV with keep > 0: each context
// also with the top-k locality stream (gpu_pkv_stream's keep and ret). 0 on success.
int gpu_bench(const Model *m, const int *ctx_list, int n_ctx, int steps, int real_prefill, int chunk, const AttnConfig *attn,
              const struct Sampler *smp, double keep, double ret);

// The ParisKV benchmark (forward_cuda.cu): a state with the smallest device cache; the zone filled
// with random K/V as after an n-token prompt and its index built; steps timed from pos0 on; the
// bytes a step reads (device memory, PCIe); the device cache's positions.
void *gpu_create_bench(const Model *m, int ctx, int chunk, const AttnConfig *attn, char *err);
cudaError_t gpu_pkv_fill(void *dev, int n, double *fill_s, double *index_s, char *err);
cudaError_t gpu_pkv_time(void *dev, int pos0, int n, int sample, float *ms_out, int *updated, char *err);
void gpu_pkv_step_bytes(void *dev, int pos, double *device_bytes, double *host_bytes);
int gpu_pkv_device_positions(void *dev);
cudaError_t gpu_pkv_time_skip(void *dev, int pos, int skip, int n, float *median_ms, char *err);
// The zone row cache: its lines per layer and KV head (0: none) and its bytes; the zone rows read
// from it (*hits) and in all since the counters were last zeroed (reset: zero them after).
int gpu_pkv_cache_lines(void *dev, double *bytes);
cudaError_t gpu_pkv_cache_stats(void *dev, double *hits, double *rows, int reset);
// The benchmark's top-k locality stream from the next timed step on (keep > 0; 0: off, the
// selection's own top-k): each step's top-k, per layer and KV head, keeps each of the step
// before's slots with probability keep and draws the rest -- with probability ret one the head
// dropped in its last few steps (a return), else uniformly from the zone -- on the host, outside
// the timed step; the step's graph copies it in and the attention reads it instead of the
// selection's (which still runs).
cudaError_t gpu_pkv_stream(void *dev, double keep, double ret, char *err);

#ifdef __cplusplus
}
#endif

#endif
