// What a CPU gives the decode step, by thread count: memory bandwidth, the bf16 decode product on
// each instruction set the CPU has, and the pool's cost per operation. By hand, not in CI:
//   make build/tests/bench/cpu_probe && build/tests/bench/cpu_probe [MiB, default 256]
// A decode step of SmolLM2-135M bf16 reads 269 MB of weights in ~270 products; if two threads do
// not read faster than one (the first lines), no split makes the second thread help the weights.
#include "../../model/backend.h"
#include "../../model/bf16.h"
#include "../../model/config.h"
#include "../../model/cpu_isa.h"
#include "../../model/dot_bf16.h"
#include "../../model/pool.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    const uint16_t *w;
    size_t words;
    int parts;
    uint64_t sum[POOL_MAX_THREADS * 8];
} Read;

static void read_task(void *ctx, int task, int thread) { // one contiguous part, 8 bytes at a time
    Read *r = ctx;
    size_t per = r->words / 4 / (size_t)r->parts, i0 = per * (size_t)task;
    const uint64_t *p = (const uint64_t *)r->w + i0;
    uint64_t s = 0;
    for (size_t i = 0; i < per; i++) s += p[i];
    r->sum[thread * 8] += s;
}

static void empty_task(void *ctx, int task, int thread) { (void)ctx, (void)task, (void)thread; }

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 256, n = 576, rows = (mib << 20) / (n * 2);
    uint16_t *w = malloc(rows * n * sizeof(uint16_t));
    float *x = malloc(n * sizeof(float)), *y = malloc(rows * sizeof(float));
    if (!w || !x || !y) return 1;
    for (size_t i = 0; i < rows * n; i++) w[i] = f32_to_bf16((float)(i % 1013) * 1e-3f - 0.5f);
    for (size_t j = 0; j < n; j++) x[j] = (float)j * 1e-2f;
    printf("cpu: best set %s, default %s; %d CPUs for this process; %zu MiB of weights (%zu rows of %zu)\n",
           cpu_isa_name(cpu_isa_best()), cpu_isa_name(cpu_isa()), pool_cpus_available(), mib, rows, n);
    for (int t = 1; t <= 2 && t <= pool_max_threads(); t++) {
        pool_set_threads(t);
        Read rd = {w, rows * n, 8 * t, {0}};
        double best = 1e9;
        for (int rep = 0; rep < 7; rep++) {
            double t0 = now();
            pool_run(rd.parts, read_task, &rd);
            best = best < now() - t0 ? best : now() - t0;
        }
        printf("threads %d: read           %6.1f GB/s\n", t, (double)rows * n * 2 / best / 1e9);
        best = 1e9;
        for (int rep = 0; rep < 7; rep++) { // the backend's decode product, its split and kernels
            double t0 = now();
            backend_cpu.matmul(y, x, w, DTYPE_BF16, 1, (int)n, (int)rows);
            best = best < now() - t0 ? best : now() - t0;
        }
        printf("threads %d: decode product %6.1f GB/s (%s, the backend's split)\n", t, (double)rows * n * 2 / best / 1e9, cpu_isa_name(cpu_isa()));
        best = 1e9;
        for (int rep = 0; rep < 20; rep++) {
            double t0 = now();
            for (int op = 0; op < 270; op++) pool_run(16 * t, empty_task, NULL);
            best = best < now() - t0 ? best : now() - t0;
        }
        printf("threads %d: pool           %6.2f us per operation of %d empty tasks (x 270 operations a token: %.2f ms)\n", t,
               best / 270 * 1e6, 16 * t, best * 1e3);
    }
    pool_set_threads(1);
    void *xp = aligned_alloc(64, dot_bf16_x_bytes((int)n));
    for (int s = 0; s < CPU_ISA_COUNT; s++) {
        const DotBf16 *k = dot_bf16_for((CpuIsa)s);
        if (!k || !cpu_isa_supported((CpuIsa)s)) {
            printf("kernels %-10s  skipped: this CPU lacks them\n", cpu_isa_name((CpuIsa)s));
            continue;
        }
        double best = 1e9, best_l2 = 1e9;
        for (int rep = 0; rep < 7; rep++) {
            double t0 = now();
            k->prep(x, (int)n, xp);
            k->rows(w, xp, (int)n, (int)rows, y);
            best = best < now() - t0 ? best : now() - t0;
        }
        for (int rep = 0; rep < 200; rep++) { // 256 rows: 288 KiB, in L2
            double t0 = now();
            k->rows(w, xp, (int)n, 256, y);
            best_l2 = best_l2 < now() - t0 ? best_l2 : now() - t0;
        }
        printf("kernels %-10s  one thread: %6.1f GB/s from memory, %6.1f GB/s from L2\n", cpu_isa_name((CpuIsa)s),
               (double)rows * n * 2 / best / 1e9, 256.0 * n * 2 / best_l2 / 1e9);
    }
    free(w), free(x), free(y), free(xp);
    return 0;
}
