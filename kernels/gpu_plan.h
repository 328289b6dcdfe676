// What one GPU's state would take of its memory: the plan gpu_create makes after asking the
// device for its free bytes (kernels/gpu_create.cu, whose plan this struct is), made here from
// given free bytes, for the tests to check on any machine that it fits what it was given.
#ifndef GPU_PLAN_H
#define GPU_PLAN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "../attention/attention.h"
#include "../model/model.h"
#ifdef __cplusplus
}
#endif

#define GPU_PREFILL_CHUNK 4096 // the GPU path's prefill chunk (its Backend's max_chunk)

typedef struct {
    int pkv;        // ParisKV's selection runs (the context reaches the dense threshold)
    int host;       // its zone in the pinned host store
    int dcap;       // positions of the device cache
    int lines;      // the zone row cache's lines per layer and KV head
    size_t need_w, need_kv, need_a, need_p, need_c; // weights, device cache, activations (fp8 prefill
                                                    // workspace included), ParisKV (row cache included), row cache
    size_t need;    // all of it with the slack: at most the free bytes given
    int least;      // the device cache's least positions in the host-store mode (0 without ParisKV)
} GpuMemPlan;

#ifdef __cplusplus
extern "C" {
#endif
// The plan of one GPU of nranks (its share of the model) for ctx positions under attn, with
// free_b of total_b bytes free. 0, or -1 with the one-line refusal gpu_create would print in err
// (MODEL_ERR_LEN bytes). A build without the CUDA path: -1, and says so.
int gpu_plan_memory(const Model *m, int nranks, int ctx, const AttnConfig *attn, size_t free_b, size_t total_b, GpuMemPlan *out,
                    char *err);
#ifdef __cplusplus
}
#endif

#endif
