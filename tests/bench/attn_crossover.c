// Where ParisKV's decode step gets cheaper than dense attention on this CPU: times one decode
// step's attention (T = 1) of one layer, dense and under the ParisKV policy (its index built over
// the prompt first, untimed), at each depth, on random K/V of a model's shape. The rest of a
// decode step (the weights' pass) is the same under both, so the depth where the two attention
// times cross is where the whole step's times cross.
//   build/tests/bench/attn_crossover H HKV D THREADS DEPTH,DEPTH,...
// e.g. SmolLM2-135M: 9 3 64; Llama-3.1-8B: 32 8 128. Prints one row per depth (min and median of
// STEPS steps, ms per layer), the first step's index build over the prompt (ms per layer; a
// generation pays it once, after its prompt), how many steps repay it, and the first depth where
// ParisKV's median step is below dense's.
#include "../../attention/attention.h"
#include "../../model/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STEPS 48 // timed steps per depth and method (each moves the position by one)
#define LAYERS 4 // separate caches, so a step reads its rows from memory as a model's layers do

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float *random_floats(size_t n, unsigned *seed) {
    float *p = malloc(n * sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = (float)rand_r(seed) / RAND_MAX * 2.0f - 1.0f;
    return p;
}

typedef struct {
    int H, Hkv, D, ctx;
    float *k[LAYERS], *v[LAYERS], *q, *out, *scratch;
} Cache;

// ms per layer for each of STEPS steps from position pos (ap NULL: dense), sorted.
static void time_steps(AttnPolicy *ap, Cache *c, int pos, double *ms) {
    for (int s = 0; s < STEPS; s++) {
        double t0 = now_s();
        for (int l = 0; l < LAYERS; l++) {
            if (ap) ap->attend(ap, l, c->out, c->q, c->k[l], c->v[l], pos + s, 1, c->H, c->Hkv, c->D, c->scratch);
            else attention_dense(&pool_parallel, c->out, c->q, c->k[l], c->v[l], pos + s, 1, c->H, c->Hkv, c->D, c->scratch);
        }
        ms[s] = 1e3 * (now_s() - t0) / LAYERS;
    }
    qsort(ms, STEPS, sizeof *ms, cmp_double);
}

// Dense and ParisKV at depth n; returns ParisKV's median over dense's.
static double one_depth(Cache *c, int n) {
    double dense[STEPS], pkv[STEPS];
    time_steps(NULL, c, n, dense);
    AttnConfig ac;
    attn_config_default(&ac);
    ac.prefill_len = n; // the prompt, attended densely: the index is built at the first step after it
    char err[ATTN_ERR_LEN];
    AttnPolicy *ap = attn_policy_create(&ac, &pool_parallel, LAYERS, c->H, c->Hkv, c->D, c->ctx, err);
    if (!ap) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    double t0 = now_s();
    for (int l = 0; l < LAYERS; l++) ap->attend(ap, l, c->out, c->q, c->k[l], c->v[l], n, 1, c->H, c->Hkv, c->D, c->scratch);
    double build = 1e3 * (now_s() - t0) / LAYERS;
    time_steps(ap, c, n + 1, pkv);
    ap->destroy(ap);
    double r = pkv[STEPS / 2] / dense[STEPS / 2], gain = dense[STEPS / 2] - pkv[STEPS / 2];
    printf("| %d | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | ", n, dense[0], dense[STEPS / 2], pkv[0], pkv[STEPS / 2], r, build);
    if (gain > 0) printf("%.0f |\n", build / gain);
    else printf("never |\n");
    fflush(stdout);
    return r;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s H HKV D THREADS DEPTH,DEPTH,...\n", argv[0]);
        return 2;
    }
    Cache c = {atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), 0, {0}, {0}, NULL, NULL, NULL};
    int threads = atoi(argv[4]), depths[32], nd = 0;
    for (char *p = argv[5]; *p && nd < 32;) {
        depths[nd] = (int)strtol(p, &p, 10);
        if (depths[nd] > c.ctx) c.ctx = depths[nd];
        nd++;
        if (*p == ',') p++;
    }
    if (c.H < 1 || c.Hkv < 1 || c.H % c.Hkv || c.D < 8 || threads < 1 || nd == 0) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    c.ctx += STEPS + 2;
    pool_set_max_threads(threads);
    pool_set_threads(threads);
    unsigned seed = 1;
    size_t rows = (size_t)c.ctx * c.Hkv * c.D;
    for (int l = 0; l < LAYERS; l++) c.k[l] = random_floats(rows, &seed), c.v[l] = random_floats(rows, &seed);
    c.q = random_floats((size_t)c.H * c.D, &seed), c.out = random_floats((size_t)c.H * c.D, &seed);
    c.scratch = calloc(attention_dense_scratch(&pool_parallel, c.H, c.Hkv, c.D, c.ctx), sizeof(float));
    printf("attention of one decode step, ms per layer (H %d, KV heads %d, head_dim %d, %d threads, %d steps)\n", c.H, c.Hkv, c.D, threads, STEPS);
    printf("| depth | dense min | dense median | pariskv min | pariskv median | pariskv / dense | index build | steps to repay it |\n"
           "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    int cross = 0;
    for (int i = 0; i < nd; i++)
        if (one_depth(&c, depths[i]) < 1.0 && !cross) cross = depths[i];
    if (cross) printf("crossover: ParisKV faster from depth %d (of those timed)\n", cross);
    else printf("crossover: ParisKV slower at every depth timed\n");
    for (int l = 0; l < LAYERS; l++) free(c.k[l]), free(c.v[l]);
    free(c.q), free(c.out), free(c.scratch);
    return 0;
}
