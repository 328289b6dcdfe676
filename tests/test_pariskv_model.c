// The policies inside the real forward pass, on the tiny Qwen3 checkpoint (tests/data/tiny-qwen3,
// exported here): teacher-forced chunks give the logits single decode steps give; a budget that
// covers the zone gives dense attention's logits exactly; a small budget changes them (the
// policy really runs). Needs ./export (make test builds it first).
#include "../attention/attention.h"
#include "../model/model.h"
#include "test_pariskv_util.h"
#include "../model/pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N 1100
#define CHUNK 64

// Logits of every position of tokens[0..N), by chunks of `chunk` tokens (1: single steps).
static int run(const Model *m, AttnPolicy *ap, const int *tokens, int chunk, float *logits) {
    RunState s;
    char err[MODEL_ERR_LEN];
    if (run_state_init(&s, m, N, CHUNK, 1, err) != 0) {
        printf("FAIL run state: %s\n", err);
        return -1;
    }
    s.attn = ap;
    int V = (int)m->c.vocab_size;
    for (int p = 0; p < N; p += chunk) {
        int T = N - p < chunk ? N - p : chunk;
        float *l = model_forward(m, &s, tokens + p, T, p, 1, err);
        if (!l) {
            printf("FAIL forward: %s\n", err);
            run_state_free(&s);
            return -1;
        }
        memcpy(logits + (size_t)p * V, l, (size_t)T * V * sizeof(float));
    }
    run_state_free(&s);
    return 0;
}

static AttnPolicy *policy(const Model *m, int topk, int prefill_len, int update) {
    AttnConfig c;
    attn_config_default(&c);
    c.sink = 4, c.local = 32, c.update = update, c.topk = topk, c.dense_min = 200, c.prefill_len = prefill_len;
    char err[ATTN_ERR_LEN];
    AttnPolicy *ap = attn_policy_create(&c, &pool_parallel, (int)m->c.n_layers, (int)m->c.n_heads, (int)m->c.n_kv_heads, (int)m->c.head_dim, N, err);
    if (!ap) printf("FAIL policy: %s\n", err);
    return ap;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)a[i] - b[i]) <= d)) d = fabs((double)a[i] - b[i]);
    return d;
}

static int argmax(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

int main(void) {
    // One thread: 2 x 1100 single-token steps of a tiny model are all parallel-region overhead,
    // ruinous on a busy machine (the thread count's irrelevance is test_pariskv_policy's job).
    pool_set_threads(1);
    char dir[] = "/tmp/pkvmodelXXXXXX", path[64], cmd[4352];
    if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
    snprintf(path, sizeof path, "%s/tiny.bin", dir);
    const char *bin = getenv("PKV_BIN"); // the build under test (make test-asan, test-march)
    snprintf(cmd, sizeof cmd, "%s/export tests/data/tiny-qwen3 %s > /dev/null 2>&1", bin ? bin : ".", path);
    Model m;
    char err[MODEL_ERR_LEN];
    if (system(cmd) != 0 || model_load(&m, path, err) != 0) {
        printf("FAIL cannot export and load tests/data/tiny-qwen3 (is ./export built?)\n0 passed, 1 failed\n");
        return 1;
    }
    int V = (int)m.c.vocab_size, tokens[N];
    unsigned long long x = 7;
    for (int i = 0; i < N; i++) x = x * 6364136223846793005ull + 1442695040888963407ull, tokens[i] = (int)((x >> 33) % (unsigned)V);
    size_t n = (size_t)N * V;
    float *dense = malloc(n * sizeof(float)), *dense1 = malloc(n * sizeof(float)), *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    if (!dense || !dense1 || !a || !b) return printf("FAIL out of memory\n"), 1;

    int ok = run(&m, NULL, tokens, CHUNK, dense) == 0 && run(&m, NULL, tokens, 1, dense1) == 0;
    // Chunks and single steps run the same operations through different matmul paths (GEMM vs
    // GEMV: other summation orders, other vector widths per build), so logits may differ by
    // rounding alone. Bound: each dot product of length n in fp32, in any order, is within
    // gamma_n = n u (u = 2^-24) of exact, relative to its sum of |terms|; the longest here is
    // attention over N = 1100 keys (dim 64, ffn 128 are shorter); two orders differ by twice that
    // per layer, and the residual stream carries each layer's error to the logits, which scale it
    // by their magnitude: tol = 2 * 2 n u * n_layers * max|logit|. Measured across builds
    // (-O0, -O3 with x86-64-v2, v3, v4 and native on AMD EPYC): 0 to 1.9e-5, against a tol of 8.5e-3.
    // A wrong chunked path (a position off, a stale row) moves logits by O(1).
    double max_logit = 0;
    for (size_t i = 0; i < n; i++) max_logit = fabs(dense[i]) > max_logit ? fabs(dense[i]) : max_logit;
    double u = ldexp(1.0, -24), tol = 4.0 * N * u * (double)m.c.n_layers * max_logit;
    double base = max_diff(dense, dense1, n);
    check(ok && base <= tol, "dense attention: chunks of %d vs single steps: max logit diff %.2e (tol %.2e from %d keys x %d layers x max|logit| %.1f)",
          CHUNK, base, tol, N, (int)m.c.n_layers, max_logit);
    AttnPolicy *pa = policy(&m, 16, 0, 64), *pb = policy(&m, 16, 0, 64); // zones of up to ~1000 keys
    ok = ok && pa && pb && run(&m, pa, tokens, CHUNK, a) == 0 && run(&m, pb, tokens, 1, b) == 0;
    if (ok) {
        double d = max_diff(a, b, n);
        // The next token must agree wherever rounding cannot swap it: top-2 margin above 2 tol.
        int agree = 0, decided = 0;
        for (int p = 0; p < N; p++) {
            const float *la = a + (size_t)p * V;
            int t = argmax(la, V);
            double second = -INFINITY;
            for (int i = 0; i < V; i++)
                if (i != t && la[i] > second) second = la[i];
            if (la[t] - second <= 2 * tol) continue;
            decided++, agree += t == argmax(b + (size_t)p * V, V);
        }
        // Past the threshold a rounding-level difference in q or k can swap a key at the top-k's
        // edge (the selection is discontinuous), and the positions after it see another row:
        // those may exceed tol. A wrong chunked path (a position off, a stale row) moves almost
        // every position; allowed: at most 1 in 50.
        int over = 0;
        for (int p = 0; p < N; p++) over += max_diff(a + (size_t)p * V, b + (size_t)p * V, (size_t)V) > tol;
        check(over <= N / 50, "pariskv teacher-forced chunks of %d vs single steps through the model: %d of %d positions beyond tol %.2e "
              "(at most %d; max logit diff %.2e; dense: %.2e)", CHUNK, over, N, tol, N / 50, d, base);
        check(agree == decided && decided >= N * 9 / 10, "the same next token at all %d positions whose top-2 margin exceeds 2 tol (of %d)",
              decided, N);
        // The policy runs: past the threshold its logits differ from dense, before it they do not
        // (there it calls attention_dense itself: the same operations, so bit for bit).
        double before = max_diff(a, dense, (size_t)199 * V), after = max_diff(a + (size_t)600 * V, dense + (size_t)600 * V, (size_t)(N - 600) * V);
        check(before == 0 && after > 100 * tol, "dense below the threshold (diff %.1e), selective past it (diff %.2e > 100 tol)", before, after);
    }
    if (pa) pa->destroy(pa);
    if (pb) pb->destroy(pb);
    // A prompt of 150 leaves a zone of 114 keys that no update grows (U = 2000): topk 120 covers it,
    // and the threshold 4 + 32 + 240 = 276 leaves most positions on the policy's path.
    AttnPolicy *pc = policy(&m, 120, 150, 2000);
    if (pc && run(&m, pc, tokens, CHUNK, a) == 0) {
        double d = max_diff(a, dense, n);
        check(d == 0, "pariskv with topk >= the zone gives dense logits exactly (max diff %.1e)", d);
    } else {
        check(0, "pariskv with topk >= the zone ran");
    }
    if (pc) pc->destroy(pc);
    free(dense), free(dense1), free(a), free(b);
    model_free(&m);
    unlink(path);
    rmdir(dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
