// Prompt products through oneDNN's matmul (gemm_dnnl.h).
#include "gemm_dnnl.h"

#include <stdlib.h>

#if defined(HAVE_DNNL)
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

struct GemmDnnl {
    int T, n, d, panel;
    size_t elem;                  // bytes of an x or W element
    dnnl_engine_t eng;
    dnnl_primitive_t prim[2];     // a whole panel, the last one (NULL when d is whole panels)
    dnnl_memory_desc_t src, wei[2], dst[2];
};

// The matmul of one panel shape: src (T, n) row-major; weights (n, rows) stored as the panel's
// rows of W, i.e. transposed (oneDNN's "ba"); dst (T, rows) with y's row stride d.
static int make(GemmDnnl *g, int k, int rows, dnnl_data_type_t dt) {
    dnnl_dims_t wd = {g->n, rows}, dd = {g->T, rows}, ds = {g->d, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    if (dnnl_memory_desc_init_by_tag(&g->wei[k], 2, wd, dt, dnnl_ba) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&g->dst[k], 2, dd, dnnl_f32, ds) != dnnl_success ||
        dnnl_matmul_desc_init(&md, &g->src, &g->wei[k], NULL, &g->dst[k]) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &md, NULL, g->eng, NULL) != dnnl_success)
        return -1;
    dnnl_status_t st = dnnl_primitive_create(&g->prim[k], pd);
    dnnl_primitive_desc_destroy(pd);
    return st == dnnl_success ? 0 : -1;
}

GemmDnnl *gemm_dnnl_create(GemmDnnlType type, int T, int n, int d, int panel) {
    // oneDNN (its OpenMP build) sizes a primitive's work for the creating thread's OpenMP count
    // and opens a team that large at each call: one, as the panels run inside the pool's tasks
    // (the pool sets it too, but only at its first operation, which may come after this).
    omp_set_num_threads(1);
    GemmDnnl *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    *g = (GemmDnnl){.T = T, .n = n, .d = d, .panel = panel, .elem = type == GEMM_DNNL_BF16 ? 2 : 4};
    dnnl_data_type_t dt = type == GEMM_DNNL_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_dims_t sd = {T, n};
    int ok = dnnl_engine_create(&g->eng, dnnl_cpu, 0) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&g->src, 2, sd, dt, dnnl_ab) == dnnl_success && make(g, 0, panel, dt) == 0 &&
             (d % panel == 0 || make(g, 1, d % panel, dt) == 0);
    if (!ok) {
        gemm_dnnl_destroy(g);
        return NULL;
    }
    return g;
}

int gemm_dnnl_panel(GemmDnnl *g, float *y, const void *x, const void *w, int i0) {
    int k = i0 + g->panel > g->d; // the last, shorter panel
    dnnl_stream_t s = NULL;
    dnnl_memory_t m[3] = {NULL, NULL, NULL};
    // oneDNN takes non-const handles; it only reads x and W.
    int ok = dnnl_stream_create(&s, g->eng, dnnl_stream_default_flags) == dnnl_success &&
             dnnl_memory_create(&m[0], &g->src, g->eng, (void *)x) == dnnl_success &&
             dnnl_memory_create(&m[1], &g->wei[k], g->eng, (char *)w + (size_t)i0 * g->n * g->elem) == dnnl_success &&
             dnnl_memory_create(&m[2], &g->dst[k], g->eng, y + i0) == dnnl_success;
    if (ok) {
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]}};
        ok = dnnl_primitive_execute(g->prim[k], s, 3, args) == dnnl_success && dnnl_stream_wait(s) == dnnl_success;
    }
    for (int i = 0; i < 3; i++)
        if (m[i]) dnnl_memory_destroy(m[i]);
    if (s) dnnl_stream_destroy(s);
    return ok ? 0 : -1;
}

void gemm_dnnl_destroy(GemmDnnl *g) {
    if (!g) return;
    for (int k = 0; k < 2; k++)
        if (g->prim[k]) dnnl_primitive_destroy(g->prim[k]);
    if (g->eng) dnnl_engine_destroy(g->eng);
    free(g);
}

const char *gemm_dnnl_isa(void) {
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}
#else
GemmDnnl *gemm_dnnl_create(GemmDnnlType type, int T, int n, int d, int panel) {
    (void)type, (void)T, (void)n, (void)d, (void)panel;
    return NULL;
}
int gemm_dnnl_panel(GemmDnnl *g, float *y, const void *x, const void *w, int i0) {
    (void)g, (void)y, (void)x, (void)w, (void)i0;
    return -1;
}
void gemm_dnnl_destroy(GemmDnnl *g) { (void)g; }
const char *gemm_dnnl_isa(void) { return ""; }
#endif
