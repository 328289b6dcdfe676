// The zone row cache of pkv_attend_rc (pariskv_attend.h) over many decode steps whose selections
// overlap as real text's do (60-90% of a head's slots kept from one step to the next, the rest
// new, some of them forced onto lines already taken): the output equals the cache-off output
// bit for bit at every step, bf16 and fp8 stores; the tags, the hit and miss counters and the
// lines' bytes equal a CPU simulation of the claim rule, with the claims in the direct table and
// in the hash of the step's lines; an invalidation empties the cache; the step replays from a
// CUDA graph with sizes read from device memory. Needs a GPU.
// PKV_TEST_QUICK=1: fewer steps (compute-sanitizer).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_common.h"
#include "pariskv_attend.h"

static int passed, failed;

static void check(bool ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ok ? passed++ : failed++;
}

static unsigned long long rng = 0x2545F4914F6CDD1Dull;
static unsigned next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)(rng >> 32);
}
static float frand(void) { return (float)(next_u32() >> 8) / 8388608.0f - 1.0f; } // [-1, 1)

typedef struct {
    const char *name;
    int fp8, hd, G, n_kv, lines; // lines: the cache's, per (layer, KV head)
    double keep;                 // share of a head's slots kept from the step before
    int graph;                   // the steps replayed from one captured graph
    int hashed;                  // the claims in the hash of the step's lines even where the direct table fits
} Case;

// Everything one case runs on: the host store, the device cache (sink + window), the step's
// inputs in device memory, the cache, and the CPU's copy of the tags.
typedef struct {
    Case c;
    int L, S, nz, dcap, pos, k, kmax, n_heads;
    size_t row;
    GpuKV kv;
    PkvRowCache rc;
    float *q, *partial;
    int *sel, *nsel, *d_pos, *meta;
    unsigned *counters;
    bf16 *out_off, *out_on;
    std::vector<int> tags;                // (L, n_kv, lines) the simulation's
    std::vector<unsigned long long> hm;   // (L, 2) its hits and misses
} Rig;

static uint16_t bf16_bits(float f) { // round to nearest even (the values here are finite)
    unsigned u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// Random host rows: bf16 values in [-1, 1), or fp8 codes (no NaN code) with scales near 1/448.
static void fill_host(Rig *R) {
    size_t n = (size_t)R->nz * R->L * R->c.n_kv;
    for (size_t i = 0; i < n; i++) {
        char *row = (char *)R->kv.host + i * R->row;
        if (R->c.fp8) {
            for (int j = 0; j < 2 * R->c.hd; j++) {
                unsigned char b = (unsigned char)next_u32();
                row[j] = (char)((b & 0x7f) == 0x7f ? b & 0xfe : b);
            }
            float sc[2] = {(1.5f + frand()) / 448.0f, (1.5f + frand()) / 448.0f};
            memcpy(row + 2 * R->c.hd, sc, 8);
        } else {
            uint16_t *b = (uint16_t *)row;
            for (int j = 0; j < 2 * R->c.hd; j++) b[j] = bf16_bits(frand());
        }
    }
}

static void setup(Rig *R, const Case &c) {
    R->c = c;
    R->L = 2, R->S = 4, R->nz = 4096, R->dcap = 64, R->k = 100, R->kmax = 116, R->n_heads = c.G * c.n_kv;
    R->pos = R->S + R->nz + 20; // window: 21 rows after the zone
    R->row = c.fp8 ? 2 * (size_t)c.hd + 8 : 4 * (size_t)c.hd;
    size_t cache = (size_t)R->L * c.n_kv * R->dcap * c.hd, heads = (size_t)R->L * c.n_kv;
    void *host;
    CU_CHECK(cudaMallocHost(&host, (size_t)R->nz * heads * R->row));
    R->kv = GpuKV{NULL, NULL, host, R->L, c.n_kv, c.hd, R->dcap, R->S, 0, c.fp8};
    fill_host(R);
    std::vector<uint16_t> kvh(cache);
    CU_CHECK(cudaMalloc(&R->kv.kc, cache * 2));
    CU_CHECK(cudaMalloc(&R->kv.vc, cache * 2));
    for (auto &x : kvh) x = bf16_bits(frand());
    CU_CHECK(cudaMemcpy(R->kv.kc, kvh.data(), cache * 2, cudaMemcpyHostToDevice));
    for (auto &x : kvh) x = bf16_bits(frand());
    CU_CHECK(cudaMemcpy(R->kv.vc, kvh.data(), cache * 2, cudaMemcpyHostToDevice));
    R->rc.n = c.lines, R->rc.hashed = c.hashed || pkv_row_cache_hashed(c.lines, c.G);
    CU_CHECK(cudaMalloc(&R->rc.lines, heads * c.lines * R->row));
    CU_CHECK(cudaMalloc(&R->rc.tags, heads * c.lines * sizeof(int)));
    CU_CHECK(cudaMalloc(&R->rc.stats, R->L * 2 * sizeof(unsigned long long)));
    CU_CHECK(cudaMemset(R->rc.stats, 0, R->L * 2 * sizeof(unsigned long long)));
    CU_CHECK(pkv_row_cache_invalidate(R->rc, R->L, c.n_kv, 0));
    CU_CHECK(pkv_attend_setup(R->rc, R->n_heads, c.n_kv, c.hd, R->kmax));
    R->tags.assign(heads * c.lines, -1);
    R->hm.assign(R->L * 2, 0);
    CU_CHECK(cudaMalloc(&R->q, (size_t)R->n_heads * c.hd * 4));
    CU_CHECK(cudaMalloc(&R->partial, pkv_attend_scratch_floats(R->n_heads, c.n_kv, c.hd, R->kmax) * 4));
    CU_CHECK(cudaMalloc(&R->sel, (size_t)c.n_kv * R->kmax * 4));
    CU_CHECK(cudaMalloc(&R->nsel, c.n_kv * 4));
    CU_CHECK(cudaMalloc(&R->counters, c.n_kv * 4));
    CU_CHECK(cudaMemset(R->counters, 0, c.n_kv * 4));
    CU_CHECK(cudaMalloc(&R->d_pos, 4));
    CU_CHECK(cudaMalloc(&R->meta, 2 * 4));
    int meta[2] = {R->S + R->nz, R->nz};
    CU_CHECK(cudaMemcpy(R->d_pos, &R->pos, 4, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMemcpy(R->meta, meta, 8, cudaMemcpyHostToDevice));
    CU_CHECK(cudaMalloc(&R->out_off, (size_t)R->n_heads * c.hd * 2));
    CU_CHECK(cudaMalloc(&R->out_on, (size_t)R->n_heads * c.hd * 2));
}

static void teardown(Rig *R) {
    cudaFreeHost(R->kv.host);
    cudaFree(R->kv.kc), cudaFree(R->kv.vc), cudaFree(R->rc.lines), cudaFree(R->rc.tags), cudaFree(R->rc.stats);
    cudaFree(R->q), cudaFree(R->partial), cudaFree(R->sel), cudaFree(R->nsel), cudaFree(R->counters), cudaFree(R->d_pos), cudaFree(R->meta);
    cudaFree(R->out_off), cudaFree(R->out_on);
}

// The next step's selection of one head from the last (ascending, distinct, at most k): each slot
// kept with probability keep, then new ones -- a quarter of them on the line of a slot already
// chosen (slot +- j lines), the rest anywhere. Now and then a short one (an empty head included).
static std::vector<int> next_selection(const std::vector<int> &prev, const Rig *R) {
    std::vector<int> s;
    unsigned keep = (unsigned)(R->c.keep * 4294967296.0 > 4294967295.0 ? 4294967295.0 : R->c.keep * 4294967296.0);
    for (int x : prev)
        if (next_u32() < keep) s.push_back(x);
    int want = R->k;
    unsigned u = next_u32() % 16;
    if (u == 0) want = 0;
    else if (u == 1) want = 1 + (int)(next_u32() % R->k);
    while ((int)s.size() > want) s.erase(s.begin() + next_u32() % s.size());
    while ((int)s.size() < want) {
        int x = (int)(next_u32() % R->nz);
        if (!s.empty() && next_u32() % 4 == 0) { // a collision: the line of a chosen slot
            int base = s[next_u32() % s.size()], j = 1 + (int)(next_u32() % 4);
            x = base + (next_u32() & 1 ? j : -j) * R->c.lines;
            if (x < 0 || x >= R->nz) continue;
        }
        if (std::find(s.begin(), s.end(), x) == s.end()) s.push_back(x);
    }
    std::sort(s.begin(), s.end());
    return s;
}

// The claim rule on the CPU (pariskv_attend.h): per line, the row whose tag it is hits; with no
// hit the line's first row in the selection fills it. Counts hits and misses, updates the tags.
static void simulate(Rig *R, int layer, int h, const std::vector<int> &sel) {
    int M = R->c.lines;
    int *tag = &R->tags[((size_t)layer * R->c.n_kv + h) * M];
    std::vector<int> first(M, -1);
    std::vector<char> hit(M, 0);
    for (size_t r = 0; r < sel.size(); r++) {
        int line = sel[r] & (M - 1);
        if (first[line] < 0) first[line] = (int)r;
        if (tag[line] == sel[r]) hit[line] = 1, R->hm[2 * layer]++;
        else R->hm[2 * layer + 1]++;
    }
    for (int line = 0; line < M; line++)
        if (first[line] >= 0 && !hit[line]) tag[line] = sel[first[line]];
}

// The device's tags, counters and lines against the simulation: every tagged line holds its
// slot's host row, byte for byte.
static bool state_matches(Rig *R, unsigned long long *hits, unsigned long long *rows) {
    size_t heads = (size_t)R->L * R->c.n_kv, M = R->c.lines;
    std::vector<int> tags(heads * M);
    std::vector<unsigned long long> hm(R->L * 2);
    std::vector<char> lines(heads * M * R->row);
    CU_CHECK(cudaMemcpy(tags.data(), R->rc.tags, tags.size() * 4, cudaMemcpyDeviceToHost));
    CU_CHECK(cudaMemcpy(hm.data(), R->rc.stats, hm.size() * 8, cudaMemcpyDeviceToHost));
    CU_CHECK(cudaMemcpy(lines.data(), R->rc.lines, lines.size(), cudaMemcpyDeviceToHost));
    bool ok = tags == R->tags && hm == R->hm;
    for (size_t i = 0; ok && i < heads * M; i++) {
        if (tags[i] < 0) continue;
        size_t lh = i / M, layer = lh / R->c.n_kv, h = lh % R->c.n_kv;
        const char *host = (const char *)R->kv.host + (((size_t)tags[i] * R->L + layer) * R->c.n_kv + h) * R->row;
        ok = memcmp(&lines[i * R->row], host, R->row) == 0;
    }
    *hits = *rows = 0;
    for (int l = 0; l < R->L; l++) *hits += hm[2 * l], *rows += hm[2 * l] + hm[2 * l + 1];
    return ok;
}

// One layer of a step: the cache-off output, then the cache-on one (directly or as a graph).
static void attend_both(Rig *R, int layer, cudaGraphExec_t *ge) {
    CU_CHECK(pkv_attend(R->out_off, R->q, R->sel, R->nsel, R->kmax, R->kv, layer, R->d_pos, R->meta, R->n_heads, R->partial, R->counters, 0));
    if (ge) CU_CHECK(cudaGraphLaunch(ge[layer], 0));
    else
        CU_CHECK(pkv_attend_rc(R->out_on, R->q, R->sel, R->nsel, R->kmax, R->kv, R->rc, layer, R->d_pos, R->meta, R->n_heads, R->partial,
                               R->counters, 0));
    CU_CHECK(cudaDeviceSynchronize());
}

// A graph per layer of the cache-on launch: sizes and slots from device memory at replay.
static void capture(Rig *R, cudaGraphExec_t *ge, cudaStream_t st) {
    for (int layer = 0; layer < R->L; layer++) {
        cudaGraph_t g;
        CU_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        CU_CHECK(pkv_attend_rc(R->out_on, R->q, R->sel, R->nsel, R->kmax, R->kv, R->rc, layer, R->d_pos, R->meta, R->n_heads, R->partial,
                               R->counters, st));
        CU_CHECK(cudaStreamEndCapture(st, &g));
        CU_CHECK(cudaGraphInstantiate(&ge[layer], g, 0));
        CU_CHECK(cudaGraphDestroy(g));
    }
}

static void run_case(const Case &c) {
    Rig R;
    setup(&R, c);
    cudaStream_t st;
    CU_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraphExec_t ge[2];
    if (c.graph) capture(&R, ge, st);
    const int quick = getenv("PKV_TEST_QUICK") != NULL; // under compute-sanitizer
    const int steps = quick ? 24 : 90, invalidate_at = quick ? 16 : 60;
    std::vector<std::vector<int>> cur(R.L * c.n_kv);
    size_t out_n = (size_t)R.n_heads * c.hd;
    std::vector<uint16_t> a(out_n), b(out_n);
    std::vector<int> host_sel((size_t)c.n_kv * R.kmax), host_nsel(c.n_kv);
    std::vector<float> q(out_n);
    int same = 1, state = 1, after_inval = 1;
    unsigned long long hits = 0, rows = 0;
    for (int t = 0; t < steps; t++) {
        if (t == invalidate_at) { // as a rewind does: every line empty, the next step all misses
            CU_CHECK(pkv_row_cache_invalidate(R.rc, R.L, c.n_kv, 0));
            std::fill(R.tags.begin(), R.tags.end(), -1);
        }
        for (int layer = 0; layer < R.L; layer++) {
            for (int h = 0; h < c.n_kv; h++) {
                std::vector<int> &s = cur[layer * c.n_kv + h];
                s = next_selection(s, &R);
                std::copy(s.begin(), s.end(), host_sel.begin() + (size_t)h * R.kmax);
                host_nsel[h] = (int)s.size();
                simulate(&R, layer, h, s);
            }
            for (auto &x : q) x = frand();
            CU_CHECK(cudaMemcpy(R.q, q.data(), out_n * 4, cudaMemcpyHostToDevice));
            CU_CHECK(cudaMemcpy(R.sel, host_sel.data(), host_sel.size() * 4, cudaMemcpyHostToDevice));
            CU_CHECK(cudaMemcpy(R.nsel, host_nsel.data(), host_nsel.size() * 4, cudaMemcpyHostToDevice));
            attend_both(&R, layer, c.graph ? ge : NULL);
            CU_CHECK(cudaMemcpy(a.data(), R.out_off, out_n * 2, cudaMemcpyDeviceToHost));
            CU_CHECK(cudaMemcpy(b.data(), R.out_on, out_n * 2, cudaMemcpyDeviceToHost));
            same &= a == b;
        }
        unsigned long long h0 = hits;
        state &= state_matches(&R, &hits, &rows);
        if (t == invalidate_at) after_inval = hits == h0;
    }
    char what[256];
    snprintf(what, sizeof what, "%s: %d steps x %d layers, outputs with the row cache equal those without, bit for bit", c.name, steps, R.L);
    check(same, what);
    snprintf(what, sizeof what, "%s: tags, hit/miss counters and line bytes equal the CPU simulation after every step (hit rate %.3f, "
                                "%llu of %llu rows)", c.name, rows ? (double)hits / rows : 0.0, hits, rows);
    check(state, what);
    snprintf(what, sizeof what, "%s: after an invalidation the next step reads every row from the host", c.name);
    check(after_inval, what);
    if (c.lines >= 8 * R.k) { // room for every kept row: most of them hit (empty and short steps, collisions lose some)
        snprintf(what, sizeof what, "%s: the hit rate is most of the kept share (%.3f, kept %.2f)", c.name, rows ? (double)hits / rows : 0.0,
                 c.keep);
        check(rows && (double)hits / rows > 0.5 * c.keep, what);
    }
    if (c.graph) cudaGraphExecDestroy(ge[0]), cudaGraphExecDestroy(ge[1]);
    cudaStreamDestroy(st);
    teardown(&R);
}

int main(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("no CUDA device: skipped\n");
        return 0;
    }
    const Case cases[] = {
        {"bf16 hd 128, G 4, 2 KV heads, 256 lines (many collisions), keep 0.8", 0, 128, 4, 2, 256, 0.8, 0, 0},
        {"fp8 hd 128, G 4, 2 KV heads, 16384 lines (64 KiB table), keep 0.6, graph", 1, 128, 4, 2, 16384, 0.6, 1, 0},
        {"fp8 hd 128, G 8, 2 KV heads, 16384 lines (hashed claims: 8 query heads a KV head), keep 0.6, graph", 1, 128, 8, 2, 16384, 0.6, 1, 0},
        {"bf16 hd 64, G 1, 4 KV heads, 1024 lines, keep 0.9, graph", 0, 64, 1, 4, 1024, 0.9, 1, 0},
        {"fp8 hd 64, G 3, 8 KV heads, 128 lines, keep 0.7", 1, 64, 3, 8, 128, 0.7, 0, 0},
        // The claims' hash (past PKV_RC_DIRECT_MAX lines; forced at small sizes, where rows share lines).
        {"hashed claims: bf16 hd 128, G 4, 2 KV heads, 256 lines (many collisions), keep 0.8", 0, 128, 4, 2, 256, 0.8, 0, 1},
        {"hashed claims: fp8 hd 64, G 8, 4 KV heads, 64 lines (most rows share a line), keep 0.7, graph", 1, 64, 8, 4, 64, 0.7, 1, 1},
        {"hashed claims: bf16 hd 128, G 8, 2 KV heads, 65536 lines, keep 0.6, graph", 0, 128, 8, 2, 65536, 0.6, 1, 0},
    };
    for (const Case &c : cases) run_case(c);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
