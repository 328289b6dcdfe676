// ./run --bench on the GPU: fill the context to N tokens (a real prefill, or random K/V for
// contexts too long to prefill), time decode steps with CUDA events, and print TPOT next to
// the bandwidth floor of the step.
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.h"
#include "forward_cuda.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static float percentile(float *v, int n, double p) {
    std::sort(v, v + n);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

extern "C" int gpu_bench(const Model *m, const int *ctx_list, int n_ctx, int steps, int real_prefill, int chunk) {
    const Config *c = &m->c;
    double bw = gpu_read_bandwidth();
    if (bw <= 0) {
        fprintf(stderr, "error: cannot measure device bandwidth\n");
        return 1;
    }
    cudaDeviceProp prop;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaGetDeviceProperties(&prop, dev);
    size_t wbytes = gpu_weight_bytes(c);
    // A decode step reads every matrix once, but of the embedding only one row.
    size_t step_wbytes = wbytes - (c->tied_embeddings ? 0 : (size_t)c->vocab_size * c->dim * 2);
    printf("device: %s, measured read bandwidth %.2f TB/s\n", prop.name, bw / 1e12);
    printf("model: %u layers, dim %u, %u heads / %u KV heads x %u, FFN %u, vocab %u; weights read per step %.2f GB\n",
           c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->hidden_dim, c->vocab_size, step_wbytes / 1e9);
    printf("%9s | %10s | %17s | %8s | %9s | %10s | %11s\n", "context", "TPOT ms", "p10-p90 ms", "tok/s", "floor ms",
           "TPOT/floor", "prefill s");
    printf("----------+------------+-------------------+----------+-----------+------------+------------\n");
    int rc = 0;
    int warmup = 8;
    float *ms = (float *)malloc(sizeof(float) * (size_t)steps);
    for (int i = 0; i < n_ctx && rc == 0; i++) {
        int N = ctx_list[i];
        int ctx = N + warmup + steps + 1;
        char err[512];
        void *g = gpu_create(m, ctx, chunk, 0, err);
        if (!g) {
            printf("%9d | %s\n", N, err);
            rc = 1;
            break;
        }
        double prefill_s = -1;
        if (real_prefill) {
            int *tok = (int *)malloc(sizeof(int) * (size_t)chunk);
            unsigned s = 12345;
            double t0 = now_s();
            for (int p = 0; p < N && rc == 0; p += chunk) {
                int T = std::min(chunk, N - p);
                for (int j = 0; j < T; j++) tok[j] = (int)((s = s * 1103515245u + 12345u) >> 8) % (int)c->vocab_size;
                if (!gpu_forward(g, tok, T, p, 0, err)) {
                    printf("%9d | %s\n", N, err);
                    rc = 1;
                }
            }
            prefill_s = now_s() - t0;
            free(tok);
        } else if (gpu_fill_kv_random(g, N) != cudaSuccess) {
            printf("%9d | cannot fill the KV cache\n", N);
            rc = 1;
        }
        cudaError_t e = rc ? cudaSuccess : gpu_time_decode(g, N, warmup, steps, ms);
        if (e != cudaSuccess) {
            printf("%9d | decode failed: %s\n", N, cudaGetErrorString(e));
            rc = 1;
        }
        if (rc == 0) {
            float med = percentile(ms, steps, 0.5), p10 = percentile(ms, steps, 0.1), p90 = percentile(ms, steps, 0.9);
            // KV read by the steps: positions 0 .. N+warmup+k; use the mean over the timed steps.
            double kv_bytes = (double)gpu_kv_bytes(c, 1) * (N + warmup + steps / 2.0 + 1);
            double floor_ms = ((double)step_wbytes + kv_bytes) / bw * 1e3;
            char pf[32] = "-";
            if (prefill_s >= 0) snprintf(pf, sizeof pf, "%.2f", prefill_s);
            printf("%9d | %10.3f | %8.3f-%-8.3f | %8.1f | %9.3f | %10.3f | %11s\n", N, med, p10, p90, 1e3 / med, floor_ms,
                   med / floor_ms, pf);
            fflush(stdout);
        }
        gpu_destroy(g);
    }
    free(ms);
    return rc;
}
