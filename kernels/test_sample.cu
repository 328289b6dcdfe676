// The GPU sampler (sample.cu) against the CPU's sampler_pick (model/sampler.c) on fresh random
// inputs, then timed with CUDA events after warm-up (median of many runs).
// Build and run: make test-gpu (needs a GPU), or make build/kernels/test_sample && build/kernels/test_sample.
//
// Why the ids must be equal, not close: both paths evaluate p with the same IEEE operations in
// the same order (softmax_exp, no FMA contraction: gcc's ISO C mode, _rn intrinsics on the GPU),
// and everything after p is integer (P = p * 2^40, exact sums) or one double product u * Z done
// the same way. So the only allowed difference would be a draw on a cumulative boundary if some
// p differed after all: such a mismatch is told apart (the CPU picks the GPU's id for u moved by
// 1e-9 relative, far more than a few ulps of p move a boundary) and at most 1 in 1000 is
// tolerated; any other mismatch fails.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "../attention/softmax_exp.h"
#include "cuda_common.h"
#include "sample.h"
extern "C" {
#include "../model/sampler.h"
}

static int passed, failed;
static void check(bool ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ok ? passed++ : failed++;
}

#define SAMPLE_LOGITS_SEED 0x2545F4914F6CDD1Dull
#include "../tests/sample_logits.h"

static const char *kind_name[] = {"flat", "peaked", "tied"};

struct Gpu {
    float *logits, *orig; // device
    void *scratch;
    float *u;             // pinned
    int *pen, *out;       // pinned
    cudaStream_t st;
};
static const int NMAX = 152064, PEN_MAX = 256;

// One GPU pick of logits l (n) with penalties pen (NULL: none); the logits after it in lp (if given).
static int gpu_pick(Gpu &g, const float *l, const SampleParams &sp, float u, const int *pen, int *bad, float *lp) {
    CU_CHECK(cudaMemcpy(g.logits, l, (size_t)sp.n_valid * sizeof(float), cudaMemcpyHostToDevice));
    *g.u = u;
    if (pen) memcpy(g.pen, pen, (size_t)(1 + 2 * pen[0]) * sizeof(int));
    g.out[0] = g.out[1] = -7;
    CU_CHECK(gpu_sample(g.logits, &sp, g.u, pen ? g.pen : NULL, g.out, g.scratch, g.st));
    CU_CHECK(cudaStreamSynchronize(g.st));
    if (lp) CU_CHECK(cudaMemcpy(lp, g.logits, (size_t)sp.n_valid * sizeof(float), cudaMemcpyDeviceToHost));
    *bad = g.out[1];
    return g.out[0];
}

// The exact distribution of the definition, from a full sort (P of each kept id, else 0).
static std::vector<unsigned long long> exact(const float *l, int n, float t, int top_k, float top_p, float min_p) {
    std::vector<int> r(n);
    for (int i = 0; i < n; i++) r[i] = i;
    std::sort(r.begin(), r.end(), [&](int a, int b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
    std::vector<unsigned long long> all(n), P(n, 0);
    float m = l[r[0]];
    int s_k = top_k > 0 && top_k < n ? top_k : n, s_p = n, cnt = 0;
    unsigned long long zk = 0;
    std::vector<float> p(n);
    for (int j = 0; j < n; j++) {
        p[j] = softmax_exp((l[r[j]] - m) / t); // the definition's exp (g++ in ISO mode contracts nothing)
        all[j] = (unsigned long long)llrint((double)p[j] * 0x1p40);
        if (j < s_k) zk += all[j];
        cnt += p[j] >= min_p;
    }
    int s_m = min_p > 0 ? std::max(cnt, 1) : n;
    if (top_p < 1) {
        unsigned long long c = 0;
        s_p = 1;
        for (int j = 0; j < n; j++)
            if ((double)(c += all[j]) >= (double)top_p * (double)zk) {
                s_p = j + 1;
                break;
            }
    }
    int s = std::min(s_k, std::min(s_p, s_m));
    for (int j = 0; j < s; j++) P[r[j]] = all[j];
    return P;
}

// Wilson-Hilferty: the chi-square quantile for df at upper tail 1e-6 (z = 4.753).
static double chi2_bound(int df) {
    double a = 2.0 / (9 * df), q = 1 - a + 4.753 * sqrt(a);
    return df * q * q * q;
}

static float median_ms(Gpu &g, const SampleParams &sp, int runs) {
    cudaEvent_t a, b;
    CU_CHECK(cudaEventCreate(&a));
    CU_CHECK(cudaEventCreate(&b));
    std::vector<float> ms(runs);
    for (int i = 0; i < 10; i++) CU_CHECK(gpu_sample(g.logits, &sp, g.u, NULL, g.out, g.scratch, g.st));
    for (int i = 0; i < runs; i++) {
        CU_CHECK(cudaEventRecord(a, g.st));
        CU_CHECK(gpu_sample(g.logits, &sp, g.u, NULL, g.out, g.scratch, g.st));
        CU_CHECK(cudaEventRecord(b, g.st));
        CU_CHECK(cudaEventSynchronize(b));
        CU_CHECK(cudaEventElapsedTime(&ms[i], a, b));
    }
    CU_CHECK(cudaEventDestroy(a));
    CU_CHECK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[runs / 2];
}

int main(void) {
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
        printf("SKIP test_sample (no CUDA device)\n0 passed, 0 failed\n");
        return 77;
    }
    Gpu g;
    CU_CHECK(cudaMalloc(&g.logits, NMAX * sizeof(float)));
    CU_CHECK(cudaMalloc(&g.orig, NMAX * sizeof(float)));
    CU_CHECK(cudaMalloc(&g.scratch, gpu_sample_scratch_bytes(NMAX)));
    CU_CHECK(cudaMallocHost(&g.u, sizeof(float)));
    CU_CHECK(cudaMallocHost(&g.pen, (1 + 2 * PEN_MAX) * sizeof(int)));
    CU_CHECK(cudaMallocHost(&g.out, 2 * sizeof(int)));
    CU_CHECK(cudaStreamCreate(&g.st));
    std::vector<float> l(NMAX), lc(NMAX), lg(NMAX);

    // (1) many (logits, u) pairs: the GPU id is the CPU's
    {
        int trials = 0, same = 0, near = 0, wrong = 0, pen_bad = 0;
        const int sizes[] = {8, 9, 100, 1000, 4097, 32000, 128256, 152064};
        for (int c = 0; c < 1200; c++) {
            int n = c < 800 ? sizes[c % 8] : 2 + (int)(frand() * (NMAX - 2));
            int kind = (c / 8) % 3;
            make_logits(l.data(), n, kind);
            if (c % 13 == 0)
                for (int i = 0; i < n; i++) l[i] *= 20; // wide: most P are 0
            float t = c % 17 == 0 ? 0.0f : (float)(0.1 + 1.9 * frand());
            int f = c % 8; // filters on or off: top-k, top-p, min-p
            int k = f & 1 ? 1 + (int)(frand() * (frand() < 0.5 ? 64 : n)) : 0;
            float p = f & 2 ? (float)(0.5 + 0.5 * frand()) : 1.0f, mp = f & 4 ? (float)(0.2 * frand()) : 0.0f;
            if (c % 29 == 0) p = 0.0f;     // top-p 0: the best token alone
            if (c % 31 == 0) mp = 1.5f;    // min-p past 1: the best token alone
            if (k > 1 && c % 5 == 0) {     // ties planted at the top-k boundary
                std::vector<float> srt(l.begin(), l.begin() + n);
                std::nth_element(srt.begin(), srt.begin() + (k - 1), srt.end(), std::greater<float>());
                float at = srt[k - 1];
                for (int j = 0; j < 6; j++) l[(int)(frand() * n)] = at;
            }
            Sampler s;
            if (sampler_init(&s, n, t, k, p, mp, 1 + c) != 0) return 1;
            int *pen = NULL, list[1 + 2 * PEN_MAX];
            std::copy(l.begin(), l.begin() + n, lc.begin());
            if (c % 3 == 0) { // penalties from a random history
                sampler_set_penalties(&s, 1.0f + (float)frand(), (float)frand(), 0.5f * (float)frand(), c % 2 ? 64 : -1);
                int hist[200];
                for (int i = 0; i < 200; i++) hist[i] = (int)(frand() * std::min(n, 300));
                list[0] = sampler_penalty_list(&s, hist, 200, list + 1, list + 1 + PEN_MAX);
                memmove(list + 1 + list[0], list + 1 + PEN_MAX, (size_t)list[0] * sizeof(int)); // counts right after the ids
                sampler_penalize(&s, lc.data(), hist, 200);
                pen = list;
            }
            float u = sampler_uniform(&s);
            int want = sampler_pick(&s, lc.data(), u), bad;
            int got = gpu_pick(g, l.data(), SampleParams{n, t, k, p, mp, s.repeat, s.presence, s.frequency}, u, pen, &bad, lg.data());
            if (pen && memcmp(lg.data(), lc.data(), (size_t)n * sizeof(float)) != 0 && pen_bad++ == 0)
                printf("     penalized logits differ (n %d, %d ids)\n", n, list[0]);
            trials++;
            if (got == want && bad == -1) same++;
            else if (bad == -1 && got >= 0 && got < n &&
                     (sampler_pick(&s, lc.data(), u * (1 - 1e-9)) == got || sampler_pick(&s, lc.data(), u * (1 + 1e-9)) == got)) {
                near++;
                printf("     near a boundary: n %d %s T %g k %d p %g min-p %g u %.9g: GPU %d, CPU %d\n", n, kind_name[kind], t, k, p, mp, u, got,
                       want);
            } else if (wrong++ < 10)
                printf("     DIFFERS: n %d %s T %g k %d p %g min-p %g u %.9g%s: GPU %d (bad %d), CPU %d\n", n, kind_name[kind], t, k, p, mp, u,
                       pen ? " penalties" : "", got, bad, want);
            sampler_free(&s);
        }
        char line[200];
        snprintf(line, sizeof line, "%d picks (n 2..152064, flat / peaked / tied, filter combinations, boundary ties, penalties): %d equal, %d on a boundary (<= %d), %d differ",
                 trials, same, near, trials / 1000, wrong);
        check(wrong == 0 && near <= trials / 1000, line);
        check(pen_bad == 0, "penalties from the list: the GPU's logits equal sampler_penalize's bit for bit");
    }

    // (1b) the multi-block paths: all logits equal (one histogram bin holds every token), top-p's
    // boundary in another bin than top-k's, bins of thousands, top-k 1 and top-p 0
    {
        struct { int kind; float t; int k; float p, mp; int equal; } set[] = {
            {FLAT, 1.0f, 0, 0.5f, 0, 1},          {FLAT, 1.0f, 1000, 0.3f, 0, 1},      {FLAT, 1.0f, 77777, 1, 0, 1},
            {FLAT, 1.0f, 0, 1, 0.5f, 1},          {FLAT, 0.8f, 100000, 0.3f, 0, 0},    {FLAT, 0.8f, 5000, 0.05f, 0, 0},
            {PEAKED, 0.8f, 100000, 0.99f, 0, 0},  {PEAKED, 2.0f, 20000, 0.6f, 0, 0},   {TIED, 1.0f, 30000, 0.7f, 0.001f, 0},
            {TIED, 1.0f, 0, 0.4f, 0, 0},          {FLAT, 0.8f, 0, 0.0f, 0, 0},         {FLAT, 0.8f, 1, 1, 0, 0},
            {FLAT, 0.8f, 151000, 0.999f, 0.01f, 0}, {TIED, 0.5f, 9000, 1, 0, 0}};
        int total = 0, wrong = 0;
        for (auto &c : set) {
            int n = NMAX;
            make_logits(l.data(), n, c.kind);
            if (c.equal)
                for (int i = 0; i < n; i++) l[i] = 0.75f;
            Sampler s;
            if (sampler_init(&s, n, c.t, c.k, c.p, c.mp, 99) != 0) return 1;
            for (int rep = 0; rep < 6; rep++) {
                float u = rep == 0 ? 0.0f : rep == 1 ? 0.99999994f : sampler_uniform(&s);
                std::copy(l.begin(), l.begin() + n, lc.begin());
                int want = sampler_pick(&s, lc.data(), u), bad;
                int got = gpu_pick(g, l.data(), SampleParams{n, c.t, c.k, c.p, c.mp, 1, 0, 0}, u, NULL, &bad, NULL);
                total++;
                if (got != want || bad != -1) {
                    if (wrong++ < 10)
                        printf("     DIFFERS: n %d %s%s T %g k %d p %g min-p %g u %.9g: GPU %d (bad %d), CPU %d\n", n, kind_name[c.kind],
                               c.equal ? " (all equal)" : "", c.t, c.k, c.p, c.mp, u, got, bad, want);
                }
            }
            sampler_free(&s);
        }
        char line[200];
        snprintf(line, sizeof line, "%d picks on 152K stress cases (all equal, top-p's bin apart from top-k's, big bins): %d differ", total, wrong);
        check(wrong == 0, line);
    }

    // (2) chi-square of GPU draws against the exact distribution
    {
        struct { int kind; float t; int k; float p, mp; } set[] = {{FLAT, 0.8f, 0, 0.95f, 0}, {PEAKED, 0.8f, 40, 0.95f, 0.001f}, {TIED, 1.0f, 5000, 0.9f, 0.0f}};
        for (auto &c : set) {
            int n = NMAX, draws = 20000;
            make_logits(l.data(), n, c.kind);
            std::vector<unsigned long long> P = exact(l.data(), n, c.t, c.k, c.p, c.mp);
            double z = 0;
            for (auto x : P) z += (double)x;
            // bins of consecutive ids with >= draws / 40 expected
            std::vector<int> bin(n);
            std::vector<double> want, got;
            double acc = 0;
            for (int i = 0; i < n; i++) {
                if (want.empty() || acc >= draws / 40.0) want.push_back(0), acc = 0;
                bin[i] = (int)want.size() - 1;
                want.back() += P[i] / z * draws, acc += P[i] / z * draws;
            }
            if (want.size() > 1 && want.back() < 5) {
                want[want.size() - 2] += want.back(), want.pop_back();
                for (int i = 0; i < n; i++) bin[i] = std::min(bin[i], (int)want.size() - 1);
            }
            got.assign(want.size(), 0);
            Sampler s;
            sampler_init(&s, n, c.t, c.k, c.p, c.mp, 12345);
            int outside = 0;
            SampleParams sp = {n, c.t, c.k, c.p, c.mp, 1, 0, 0};
            CU_CHECK(cudaMemcpy(g.logits, l.data(), (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
            for (int d = 0; d < draws; d++) {
                *g.u = sampler_uniform(&s);
                CU_CHECK(gpu_sample(g.logits, &sp, g.u, NULL, g.out, g.scratch, g.st));
                CU_CHECK(cudaStreamSynchronize(g.st));
                int id = g.out[0];
                if (id < 0 || id >= n || !P[id]) outside++;
                else got[bin[id]]++;
            }
            sampler_free(&s);
            double chi2 = 0;
            for (size_t b = 0; b < want.size(); b++) chi2 += (got[b] - want[b]) * (got[b] - want[b]) / want[b];
            int df = (int)want.size() - 1;
            char line[200];
            snprintf(line, sizeof line, "152K %s T %g top-k %d top-p %g min-p %g: chi2 %.1f <= %.1f (%d bins, %d GPU draws, 1e-6 quantile), %d outside",
                     kind_name[c.kind], c.t, c.k, c.p, c.mp, chi2, df ? chi2_bound(df) : 0.0, df + 1, draws, outside);
            check(outside == 0 && (df == 0 || chi2 <= chi2_bound(df)), line);
        }
    }

    // (3) greedy: argmax, the lowest id among equal maxima
    {
        int ok = 1;
        for (int c = 0; c < 40; c++) {
            int n = c % 2 ? NMAX : 1 + (int)(frand() * 5000);
            make_logits(l.data(), n, c % 3);
            float mx = *std::max_element(l.begin(), l.begin() + n);
            if (c % 4 == 0) l[(int)(frand() * n)] = mx, l[(int)(frand() * n)] = mx; // ties at the max
            int want = (int)(std::max_element(l.begin(), l.begin() + n) - l.begin()), bad; // the first maximum
            int got = gpu_pick(g, l.data(), SampleParams{n, 0.0f, 40, 0.9f, 0.1f, 1, 0, 0}, 0.5f, NULL, &bad, NULL);
            if (got != want || bad != -1) {
                if (ok) printf("     greedy n %d: GPU %d, argmax %d\n", n, got, want);
                ok = 0;
            }
        }
        check(ok, "greedy (temperature 0) is the argmax, the lowest id among equal maxima, 40 cases");
    }

    // (4) a non-finite logit is reported: the first one's index, and id 0
    {
        int n = NMAX, bad;
        make_logits(l.data(), n, FLAT);
        l[100000] = NAN, l[120000] = INFINITY, l[777] = -INFINITY;
        int got = gpu_pick(g, l.data(), SampleParams{n, 0.8f, 0, 0.95f, 0, 1, 0, 0}, 0.5f, NULL, &bad, NULL);
        int got0 = gpu_pick(g, l.data(), SampleParams{n, 0.0f, 0, 1, 0, 1, 0, 0}, 0.5f, NULL, &bad, NULL);
        check(got == 0 && got0 == 0 && bad == 777, "a non-finite logit: out[1] = the first one's index (777), out[0] = 0");
    }

    // (5) a captured graph (logits copied in, then the kernel) replayed with new u and penalty
    // lists picks what a direct launch picks
    {
        int n = NMAX;
        make_logits(l.data(), n, PEAKED);
        for (int i = 0; i < n; i++) l[i] *= 0.3f; // a wide nucleus: u and penalties matter
        CU_CHECK(cudaMemcpy(g.orig, l.data(), (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
        SampleParams sp = {n, 0.9f, 400, 0.95f, 0.001f, 1.3f, 0.5f, 0.2f};
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        g.pen[0] = 0;
        CU_CHECK(cudaStreamBeginCapture(g.st, cudaStreamCaptureModeGlobal));
        CU_CHECK(cudaMemcpyAsync(g.logits, g.orig, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, g.st));
        CU_CHECK(gpu_sample(g.logits, &sp, g.u, g.pen, g.out, g.scratch, g.st));
        CU_CHECK(cudaStreamEndCapture(g.st, &graph));
        CU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        int ok = 1, distinct = 0, prev = -1;
        for (int rep = 0; rep < 50; rep++) {
            float u = (float)frand();
            int list[1 + 2 * 32];
            list[0] = rep % 3 ? 32 : 0;
            // the best token among them (it matters most), the rest at random, all distinct
            std::vector<int> ids;
            int best = (int)(std::max_element(l.begin(), l.begin() + n) - l.begin());
            for (int j = 0; j < list[0]; j++) {
                int id = best;
                while (std::find(ids.begin(), ids.end(), id) != ids.end()) id = (int)(frand() * n);
                ids.push_back(id), list[1 + j] = id, list[1 + list[0] + j] = 1 + (int)(frand() * 4);
            }
            memcpy(g.pen, list, sizeof list);
            *g.u = u;
            g.out[0] = -7;
            CU_CHECK(cudaGraphLaunch(exec, g.st));
            CU_CHECK(cudaStreamSynchronize(g.st));
            int from_graph = g.out[0], bad;
            int direct = gpu_pick(g, l.data(), sp, u, list, &bad, NULL);
            distinct += from_graph != prev, prev = from_graph;
            if (from_graph != direct) {
                if (ok) printf("     replay %d: graph %d, direct %d\n", rep, from_graph, direct);
                ok = 0;
            }
        }
        check(ok && distinct > 10, "a captured graph replayed with new u and penalty lists picks what a direct launch picks (50 replays)");
        CU_CHECK(cudaGraphExecDestroy(exec));
        CU_CHECK(cudaGraphDestroy(graph));
    }

    // timing
    if (!getenv("PKV_SKIP_BENCH")) {
        struct { const char *name; float t; int k; float p, mp; } set[] = {
            {"greedy", 0, 0, 1, 0}, {"T 0.8", 0.8f, 0, 1, 0}, {"top-p 0.95", 0.8f, 0, 0.95f, 0}, {"top-k 40", 0.8f, 40, 1, 0},
            {"min-p 0.05", 0.8f, 0, 1, 0.05f}, {"k40 p.95 minp.05", 0.8f, 40, 0.95f, 0.05f}};
        const int ns[] = {32000, 128256, 152064};
        printf("\ngpu_sample, median of 200 (us), flat / peaked logits:\n  %-18s", "");
        for (int n : ns) printf("  %15d", n);
        printf("\n");
        for (auto &c : set) {
            printf("  %-18s", c.name);
            for (int n : ns) {
                float t[2];
                for (int kind = 0; kind < 2; kind++) {
                    make_logits(l.data(), n, kind);
                    CU_CHECK(cudaMemcpy(g.logits, l.data(), (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
                    *g.u = 0.37f;
                    t[kind] = 1000 * median_ms(g, SampleParams{n, c.t, c.k, c.p, c.mp, 1, 0, 0}, 200);
                }
                printf("  %6.1f / %6.1f", t[0], t[1]);
            }
            printf("\n");
        }
    }
    printf("\n%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
