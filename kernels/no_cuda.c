// Built instead of the CUDA sources when no CUDA compiler is found: the CPU path only.
#include "../model/backend.h"
#include "gpu_plan.h"

#include <stddef.h>
#include <stdio.h>

const Backend *backend_cuda_get(void) { return NULL; }

int gpu_plan_memory(const Model *m, int nranks, int ctx, const AttnConfig *attn, size_t free_b, size_t total_b, GpuMemPlan *out,
                    char *err) {
    (void)m, (void)nranks, (void)ctx, (void)attn, (void)free_b, (void)total_b, (void)out;
    snprintf(err, MODEL_ERR_LEN, "this build has no CUDA path (NO_CUDA=1 or no nvcc): no GPU memory plan");
    return -1;
}
