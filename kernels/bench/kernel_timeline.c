// A CUPTI injection library for timelines of the decode step (Nsight Systems cannot make a
// report on the GPU machine): run any program with CUDA_INJECTION64_PATH=libkt.so and every
// kernel's start and end on the GPU, graph nodes included, is written to $KT_OUT (default
// kernel_timeline.csv) as start_ns,end_ns,graph,node,grid,block,name. kernel_timeline.py
// reads it. Records are kept in CUPTI's buffers and written when one fills and at exit.
// KT_DEVICE=d keeps device d's kernels only (--gpus N: each rank's layers apart).
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#define KT_BUF (16u << 20) // bytes per activity buffer: ~80K kernel records

static FILE *out;
static int only_device = -1;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, KT_BUF);
    *size = *buf ? KT_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        if (only_device >= 0 && k->deviceId != (uint32_t)only_device) continue;
        fprintf(out, "%llu,%llu,%u,%llu,%dx%dx%d,%d,%.100s\n", (unsigned long long)k->start, (unsigned long long)k->end, k->graphId,
                (unsigned long long)k->graphNodeId, k->gridX, k->gridY, k->gridZ, k->blockX, k->name ? k->name : "?");
    }
    free(buf);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (out) fclose(out), out = NULL;
}

// Called by the CUDA driver when it loads the library (CUDA_INJECTION64_PATH).
int InitializeInjection(void) {
    const char *path = getenv("KT_OUT"), *dev = getenv("KT_DEVICE");
    if (dev) only_device = atoi(dev);
    out = fopen(path ? path : "kernel_timeline.csv", "w");
    if (!out) {
        fprintf(stderr, "kernel_timeline: cannot write %s\n", path ? path : "kernel_timeline.csv");
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_timeline: CUPTI refused kernel activity records\n");
        fclose(out), out = NULL;
        return 0;
    }
    atexit(flush_at_exit);
    return 1;
}
