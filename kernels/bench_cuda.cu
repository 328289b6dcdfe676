// ./run --bench on the GPU: fill the context to N tokens (a real prefill, or random K/V for
// contexts too long to prefill), time decode steps with CUDA events, and print TPOT next to
// the bandwidth floor of the step. Every step is timed as a user gets it: ending in the
// device's sampler, greedy (--temp 0) beside the sampling settings given (the model's own by
// default).
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.h"
#include "forward_cuda.h"

extern "C" {
#include "../model/sampler.h"
}

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

// Host-to-device bandwidth of a bulk copy from pinned memory (bytes/s): the ceiling of the top-k
// fetches from a host store.
static double h2d_bandwidth(void) {
    size_t n = (size_t)256 << 20;
    void *h = NULL, *d = NULL;
    if (cudaMallocHost(&h, n) != cudaSuccess) return 0;
    if (cudaMalloc(&d, n) != cudaSuccess) {
        cudaFreeHost(h);
        return 0;
    }
    memset(h, 1, n);
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    float t[7];
    for (int i = 0; i < 7; i++) {
        cudaEventRecord(a, 0);
        cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, 0);
        cudaEventRecord(b, 0);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&t[i], a, b);
    }
    std::sort(t, t + 7);
    cudaEventDestroy(a), cudaEventDestroy(b);
    cudaFree(d), cudaFreeHost(h);
    return (double)n / (t[3] * 1e-3);
}

// The sampling a column times, for the table's header.
static void print_sampling(const Sampler *smp) {
    printf("sampling: greedy, and temperature %g", smp->temperature);
    if (smp->top_k > 0) printf(", top-k %d", smp->top_k);
    if (smp->top_p < 1.0f) printf(", top-p %g", smp->top_p);
    if (smp->min_p > 0.0f) printf(", min-p %g", smp->min_p);
    if (smp->count) printf(", penalties (an empty list in the timed steps)");
    printf(" (vocabulary %d), each inside the decode step\n", smp->n_valid);
}

// smp with temperature 0: the greedy column.
static Sampler greedy_of(const Sampler *smp) {
    Sampler g = *smp;
    g.temperature = 0.0f;
    return g;
}

// What every row of the ParisKV table shares.
typedef struct {
    const AttnConfig *attn;
    const Sampler *smp;
    double bw, pcie;
    size_t step_wbytes;
    int warmup, steps;
    float *ms, *steady; // (warmup + steps) scratch
    int *upd;
} PkvBench;

// --gpus N: what a step's communication between the GPUs takes alone (with the sums fused into
// the GEMVs: what they add to them, gpu_comm_time).
static void bench_comm(void *g, uint32_t n_layers) {
    double ms = 0;
    if (gpu_comm_time(g, 50, &ms) == cudaSuccess)
        printf("communication a step (%d GPUs, %s): %u all-reduces of the residual (with the next norm's stats) + the logits' gather, "
               "%s %.3f ms (median of 50)\n", gpu_count(g), gpu_comm_kind(g), 2 * n_layers,
               strstr(gpu_comm_kind(g), "fused") ? "over the GEMVs alone" : "alone", ms);
    else printf("communication a step: cannot time it\n");
}

// One row for state g, its zone filled as after an N-token prompt: the greedy median on the
// positions before the index update, then from pos0 again the sampled steps the rest of the row
// reads (the same rows rewritten), then where the time goes. stream: the top-k stream's label.
static int bench_pkv_row(void *g, const PkvBench *b, int N, int pos0, double fill_s, double index_s, const char *stream) {
    const AttnConfig *attn = b->attn;
    int warmup = b->warmup, n_all = warmup + b->steps, U = attn->update, n_greedy = warmup + b->steps / 2 - 1;
    float *ms = b->ms, *steady = b->steady, greedy_ms = -1;
    int *upd = b->upd;
    char err[512] = "";
    Sampler greedy = greedy_of(b->smp);
    cudaError_t e = gpu_sample_config(g, &greedy, err) != 0 ? cudaErrorUnknown : cudaSuccess;
    if (e == cudaSuccess) e = gpu_pkv_time(g, pos0, n_greedy, 1, ms, upd, err);
    if (e == cudaSuccess) {
        int ns = 0;
        for (int j = warmup; j < n_greedy; j++)
            if (!upd[j]) steady[ns++] = ms[j];
        greedy_ms = ns ? percentile(steady, ns, 0.5) : -1;
    }
    double hits = 0, rows = 0;
    if (e == cudaSuccess && gpu_sample_config(g, b->smp, err) != 0) e = cudaErrorUnknown;
    if (e == cudaSuccess) e = gpu_pkv_cache_stats(g, &hits, &rows, 1); // counted from here: the sampled steps
    if (e == cudaSuccess) e = gpu_pkv_time(g, pos0, n_all, 1, ms, upd, err);
    if (e == cudaSuccess) e = gpu_pkv_cache_stats(g, &hits, &rows, 0);
    if (e != cudaSuccess) {
        printf("%9d | failed: %s %s\n", N, cudaGetErrorString(e), err);
        return 1;
    }
    int ns = 0;
    float upd_ms = -1;
    for (int j = warmup; j < n_all; j++) {
        if (upd[j]) upd_ms = ms[j];
        else steady[ns++] = ms[j];
    }
    float med = percentile(steady, ns, 0.5), p10 = percentile(steady, ns, 0.1), p90 = percentile(steady, ns, 0.9);
    double dev_b, host_b;
    gpu_pkv_step_bytes(g, pos0 + warmup + b->steps / 2, &dev_b, &host_b);
    double floor_ms = ((b->step_wbytes + dev_b) / b->bw + (b->pcie > 0 ? host_b / b->pcie : 0)) * 1e3;
    char u1[32] = "-", u2[32] = "-", hr[32] = "-";
    if (upd_ms >= 0) snprintf(u1, sizeof u1, "%.3f", upd_ms), snprintf(u2, sizeof u2, "%.4f", (upd_ms - med) / U);
    if (rows > 0) snprintf(hr, sizeof hr, "%.3f", hits / rows);
    printf("%9d | %5d | %4s | %9.3f | %10.3f | %8.3f-%-8.3f | %9.3f | %8.3f | %10s | %9s | %8.2f | %8.2f | %6s | %s\n", N, attn->topk,
           attn->zone_fp8 ? "fp8" : attn->store == KV_STORE_HOST ? "host" : "gpu", greedy_ms, med, p10, p90, floor_ms, med / floor_ms, u1, u2,
           fill_s, index_s, hr, stream);
    // Where the time goes: the same step with stages left out (PKV_DECODE_SKIP bits), repeated at
    // one position. The attention's share is the timed steps' median less the step without it:
    // a repeated position empties the row cache for the selection's own top-k (one_pkv_time), so
    // timing the whole step there would count every zone row as a miss, which the timed steps,
    // a position after another, do not.
    float t_noatt, t_nosel, t_none;
    int at = pos0 + warmup - 1;
    if (gpu_pkv_time_skip(g, at, 4, 15, &t_noatt, err) == cudaSuccess && gpu_pkv_time_skip(g, at, 6, 15, &t_nosel, err) == cudaSuccess &&
        gpu_pkv_time_skip(g, at, 1, 15, &t_none, err) == cudaSuccess)
        printf("%9s   stages ms: weights and the rest %.3f | qkv post-processing %.3f | query + selection %.3f | attention over "
               "sink + top-k + window %.3f (weights floor %.3f)\n", "", t_none, t_nosel - t_none, t_noatt - t_nosel, med - t_noatt,
               b->step_wbytes / b->bw * 1e3);
    fflush(stdout);
    return 0;
}

// The label of the locality stream's rows.
static void stream_label(char *buf, size_t n, double keep, double ret) {
    snprintf(buf, n, "locality: keeps %.2f of the step before's top-k; of the rest %.2f return from the last steps, the others uniform", keep,
             ret);
}

// ParisKV: for each context N, the zone filled as after an N-token prompt (random K/V), then
// decode steps from a position chosen so that one index update (U new zone keys) falls inside
// the timed steps. TPOT is the median of the steps without an update; the update's extra cost
// is shown apart and amortized over U steps. Each context's first row attends what the
// selection chose for the random queries (little locality from step to step: the worst case
// for the row cache); with keep > 0 a second row attends a synthetic top-k stream instead (the
// selection still runs): each step keeps each of the step before's slots with probability keep
// (the overlap measured on real text, issue 24: 0.60 on SmolLM2 over 8K tokens) and draws the
// rest with probability ret from the slots the head dropped in its last few steps, else
// uniformly from the zone. Returns are what a cache catches beyond the overlap: on that text the
// 1024-row cache, simulated, read 0.90 of the rows = 0.60 + 0.75 x 0.40, so ret 0.75. The
// stream's own hit rate comes out lower, ~0.77 with 1024 rows at any zone size (a CPU model of
// this generator) and 0.84 with the default 16,384 (measured, session 25): its returns spread
// over more rows than real text's, which lines lose between a drop and a return. The row
// prints the rate it got.
static int bench_pariskv(const Model *m, const int *ctx_list, int n_ctx, int steps, int chunk, const AttnConfig *attn, const Sampler *smp, double bw,
                         double keep, double ret) {
    PkvBench b = {attn, smp, bw, h2d_bandwidth(), gpu_model_step_bytes(m, m->gpus > 1 ? m->gpus : 1), 8, steps, NULL, NULL, NULL};
    printf("pariskv: k %d, sink %d, local %d, update %d, zone in %s; host-to-device bulk copy %.1f GB/s\n", attn->topk, attn->sink,
           attn->local, attn->update, attn->zone_fp8                   ? "pinned host memory, fp8 rows"
           : attn->store == KV_STORE_HOST ? "pinned host memory"
           : attn->store == KV_STORE_GPU  ? "GPU memory"
                                          : "auto",
           b.pcie / 1e9);
    printf("floor = (weights + index, window and selection bytes) / HBM bandwidth + top-k rows from host / bulk PCIe bandwidth%s\n",
           m->gpus > 1 ? ", one GPU's share of each (its KV heads, its rows from its host store)" : "");
    const char *sv = getenv("PKV_SELECT");
    printf("selection: %s\n", sv && !strcmp(sv, "five") ? "five kernels a layer (PKV_SELECT=five)" : "four kernels a layer");
    printf("hit rate: the zone rows of the sampled steps read from the GPU row cache (-: none); stream: what the attention reads\n");
    print_sampling(smp);
    printf("%9s | %5s | %4s | %8s | %10s | %17s | %9s | %8s | %10s | %9s | %8s | %8s | %6s | %s\n", "context", "k", "zone", "greedy ms",
           "sampled ms", "p10-p90 sampled", "floor ms", "TPOT/flr", "update ms", "+per step", "fill s", "index s", "hits", "stream");
    printf("----------+-------+------+-----------+------------+-------------------+-----------+----------+------------+-----------+----------+-"
           "---------+--------+-------\n");
    int U = attn->update, rc = 0, n_all = b.warmup + steps;
    b.ms = (float *)malloc(sizeof(float) * (size_t)n_all), b.steady = (float *)malloc(sizeof(float) * (size_t)n_all);
    b.upd = (int *)malloc(sizeof(int) * (size_t)n_all);
    char label[128];
    stream_label(label, sizeof label, keep, ret);
    for (int i = 0; i < n_ctx && rc == 0; i++) {
        int N = ctx_list[i];
        // steps start at pos0 so that the update at N + U (zone_end moves by U) is in the middle
        int pos0 = N + U - b.warmup - steps / 2, ctx = pos0 + n_all + 1;
        if (pos0 < N) pos0 = N, ctx = N + U + n_all + 1;
        char err[512] = "";
        void *g = gpu_create_bench(m, ctx, chunk, attn, err);
        if (!g) {
            printf("%9d | %s\n", N, err);
            rc = 1;
            break;
        }
        if (i == 0 && gpu_count(g) > 1) bench_comm(g, m->c.n_layers);
        if (i == 0) {
            double bytes = 0;
            int lines = gpu_pkv_cache_lines(g, &bytes);
            if (lines) printf("row cache: %d rows per layer and KV head (%.2f GiB of GPU memory)\n", lines, bytes / (1 << 30));
            else printf("row cache: off\n");
        }
        double fill_s = 0, index_s = 0;
        cudaError_t e = gpu_pkv_fill(g, N, &fill_s, &index_s, err);
        if (e == cudaSuccess && attn->store == KV_STORE_HOST) {
            FILE *f = fopen("/proc/self/smaps_rollup", "r"); // did the store get huge pages?
            char line[256];
            double kb = -1;
            while (f && fgets(line, sizeof line, f))
                if (sscanf(line, "AnonHugePages: %lf kB", &kb) == 1) break;
            if (f) fclose(f);
            if (kb >= 0) fprintf(stderr, "host memory in transparent huge pages: %.1f GiB\n", kb / 1048576.0);
        }
        if (e != cudaSuccess) {
            printf("%9d | fill failed: %s %s\n", N, cudaGetErrorString(e), err);
            rc = 1;
        }
        if (rc == 0) rc = bench_pkv_row(g, &b, N, pos0, fill_s, index_s, "the selection's (random queries)");
        if (rc == 0 && keep > 0) {
            e = gpu_pkv_stream(g, keep, ret, err);
            if (e != cudaSuccess) printf("%9d | stream failed: %s %s\n", N, cudaGetErrorString(e), err), rc = 1;
            else rc = bench_pkv_row(g, &b, N, pos0, fill_s, index_s, label);
        }
        gpu_destroy(g);
    }
    free(b.ms), free(b.steady), free(b.upd);
    return rc;
}

// Where a prefill of n tokens went: causal attention (2 * head_dim * heads * layers * n^2 flops:
// QK^T and PV over the causal half) in the flash kernel, timed by events around it, and the rest
// (the GEMMs: 2 flops per weight and token; norms, RoPE, launches).
static void prefill_breakdown(const Config *c, int n, double total_s, double attn_s) {
    double hd = c->head_dim, q = (double)c->n_heads * hd, kv = (double)c->n_kv_heads * hd;
    double attn_flop = 2.0 * hd * c->n_heads * c->n_layers * (double)n * n;
    double lin_flop = 2.0 * n * c->n_layers * ((double)c->dim * (q + 2 * kv) + q * c->dim + 3.0 * c->dim * c->hidden_dim);
    double rest = total_s - attn_s;
    printf("%9s   prefill %.2f s: attention %.2f s (%.1f PFLOP, %.0f TFLOP/s), the rest %.2f s (GEMMs %.1f PFLOP, %.0f TFLOP/s over it)\n",
           "", total_s, attn_s, attn_flop / 1e15, attn_flop / attn_s / 1e12, rest, lin_flop / 1e15, rest > 0 ? lin_flop / rest / 1e12 : 0.0);
}

extern "C" int gpu_bench(const Model *m, const int *ctx_list, int n_ctx, int steps, int real_prefill, int chunk, const AttnConfig *attn,
                         const Sampler *smp, double keep, double ret) {
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
    // A decode step reads every matrix once (quantized ones as their blocks), of the embedding one
    // row; split over N GPUs each reads its share at once, so the floor is one GPU's bytes over
    // one GPU's bandwidth.
    int ngpu = m->gpus > 1 ? m->gpus : 1;
    size_t step_wbytes = gpu_model_step_bytes(m, ngpu);
    if (ngpu > 1) printf("device: %d x %s (tensor parallel, --gpus %d), measured read bandwidth %.2f TB/s each\n", ngpu, prop.name, ngpu, bw / 1e12);
    else printf("device: %s, measured read bandwidth %.2f TB/s\n", prop.name, bw / 1e12);
    printf("model: %u layers, dim %u, %u heads / %u KV heads x %u, FFN %u, vocab %u; weights read per step %.2f GB%s\n",
           c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->hidden_dim, c->vocab_size, step_wbytes / 1e9, ngpu > 1 ? " per GPU" : "");
    if (attn && attn->method == ATTN_PARISKV) {
        if (real_prefill) {
            fprintf(stderr, "error: --bench-prefill times dense attention; the ParisKV benchmark fills the zone with random K/V\n");
            return 1;
        }
        return bench_pariskv(m, ctx_list, n_ctx, steps, chunk, attn, smp, bw, keep, ret);
    }
    if (real_prefill) printf("prefill attention: %s\n", attn && attn->prefill_fp8 ? "fp8 (e4m3 Q, K, V, --prefill-attn fp8)" : "bf16");
    print_sampling(smp);
    printf("%9s | %10s | %10s | %17s | %8s | %9s | %10s | %11s\n", "context", "greedy ms", "sampled ms", "p10-p90 sampled", "tok/s",
           "floor ms", "TPOT/floor", "prefill s");
    printf("----------+------------+------------+-------------------+----------+-----------+------------+------------\n");
    Sampler greedy = greedy_of(smp);
    int rc = 0;
    int warmup = 8;
    float *ms = (float *)malloc(sizeof(float) * (size_t)steps);
    for (int i = 0; i < n_ctx && rc == 0; i++) {
        int N = ctx_list[i];
        int ctx = N + warmup + steps + 1;
        char err[512];
        void *g = gpu_create(m, ctx, chunk, 0, attn, err); // attn: NULL, or full attention with --prefill-attn
        if (!g) {
            printf("%9d | %s\n", N, err);
            rc = 1;
            break;
        }
        if (i == 0 && ngpu > 1) bench_comm(g, c->n_layers);
        double prefill_s = -1, attn_ms = -1;
        if (real_prefill) {
            gpu_prefill_attention_ms(g, 1);
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
            attn_ms = gpu_prefill_attention_ms(g, 0);
            free(tok);
        } else if (gpu_fill_kv_random(g, N) != cudaSuccess) {
            printf("%9d | cannot fill the KV cache\n", N);
            rc = 1;
        }
        float greedy_ms = -1;
        cudaError_t e = cudaSuccess;
        if (rc == 0 && gpu_sample_config(g, &greedy, err) != 0) e = cudaErrorUnknown;
        if (rc == 0 && e == cudaSuccess) e = gpu_time_decode(g, N, warmup, steps, 1, ms);
        if (rc == 0 && e == cudaSuccess) greedy_ms = percentile(ms, steps, 0.5);
        if (rc == 0 && e == cudaSuccess && gpu_sample_config(g, smp, err) != 0) e = cudaErrorUnknown;
        if (rc == 0 && e == cudaSuccess) e = gpu_time_decode(g, N, warmup, steps, 1, ms);
        if (e != cudaSuccess) {
            printf("%9d | decode failed: %s\n", N, cudaGetErrorString(e));
            rc = 1;
        }
        if (rc == 0) {
            float med = percentile(ms, steps, 0.5), p10 = percentile(ms, steps, 0.1), p90 = percentile(ms, steps, 0.9);
            // KV read by the steps: positions 0 .. N+warmup+k; use the mean over the timed steps.
            double kv_bytes = (double)gpu_kv_bytes(c, 1) * (N + warmup + steps / 2.0 + 1) / ngpu; // one GPU's KV heads
            double floor_ms = ((double)step_wbytes + kv_bytes) / bw * 1e3;
            char pf[32] = "-";
            if (prefill_s >= 0) snprintf(pf, sizeof pf, "%.2f", prefill_s);
            printf("%9d | %10.3f | %10.3f | %8.3f-%-8.3f | %8.1f | %9.3f | %10.3f | %11s\n", N, greedy_ms, med, p10, p90, 1e3 / med, floor_ms,
                   med / floor_ms, pf);
            if (prefill_s > 0 && attn_ms > 0) prefill_breakdown(c, N, prefill_s, attn_ms / 1e3);
            fflush(stdout);
        }
        gpu_destroy(g);
    }
    free(ms);
    return rc;
}
