// The CUDA backend over one GPU or several of one host (--gpus N, tensor parallel): the public
// entry points of forward_cuda.h and the backend table. With N GPUs each holds a share of the
// model (gpu_state.h's Shard: its KV heads with their query heads, ParisKV index, ring and host
// store; its share of the FFN and of the LM head's vocabulary) in a state of its own, driven by
// a thread of its own (rank 0: the caller's), and every call runs on all of them at once; the
// ranks meet only in the all-reduces after W_o and W_down and the gather of the logits, NCCL
// calls on each rank's stream, captured into its decode graph like its kernels. N = 1 is the
// single state called directly, as before.
//
// NCCL is loaded at run time (dlopen), so that one binary runs on machines without it: only
// --gpus N > 1 needs it, and says so when it is missing.
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "forward_cuda.h"
#include "gpu_plan.h"
#include "gpu_state.h"
#include "kernels.h"

extern "C" {
#include "../model/backend.h"
#include "../model/sampler.h"
}

#if __has_include(<nccl.h>)
#include <nccl.h>
#define HAVE_NCCL 1
#else
#define HAVE_NCCL 0
#endif

enum { MAX_GPUS = 16 };

// ---- NCCL, loaded when a state spans several GPUs ----

#if HAVE_NCCL
typedef struct {
    ncclResult_t (*comm_init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*all_gather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    const char *(*error_string)(ncclResult_t);
    ncclResult_t (*get_version)(int *);
} Nccl;

static Nccl nccl;  // the library's entry points, set once (load_nccl)
static int nccl_state; // 0 not tried, 1 loaded, -1 failed

// Loads libnccl.so.2 once; 0, or -1 with why in err.
static int load_nccl(char *err) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    if (nccl_state == 0) {
        void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
        if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
        if (h) {
            nccl.comm_init_all = (ncclResult_t(*)(ncclComm_t *, int, const int *))dlsym(h, "ncclCommInitAll");
            nccl.comm_destroy = (ncclResult_t(*)(ncclComm_t))dlsym(h, "ncclCommDestroy");
            nccl.all_reduce = (ncclResult_t(*)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t))dlsym(h, "ncclAllReduce");
            nccl.all_gather = (ncclResult_t(*)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t))dlsym(h, "ncclAllGather");
            nccl.error_string = (const char *(*)(ncclResult_t))dlsym(h, "ncclGetErrorString");
            nccl.get_version = (ncclResult_t(*)(int *))dlsym(h, "ncclGetVersion");
        }
        nccl_state = h && nccl.comm_init_all && nccl.comm_destroy && nccl.all_reduce && nccl.all_gather && nccl.error_string ? 1 : -1;
        if (nccl_state < 0) gpu_set_err(err, "--gpus: cannot load NCCL (libnccl.so.2: %s); install NCCL or run on one GPU", h ? "symbols missing" : dlerror());
    } else if (nccl_state < 0) {
        gpu_set_err(err, "--gpus: cannot load NCCL (libnccl.so.2); install NCCL or run on one GPU");
    }
    pthread_mutex_unlock(&mu);
    return nccl_state > 0 ? 0 : -1;
}

static cudaError_t nccl_check(ncclResult_t r) {
    if (r == ncclSuccess) return cudaSuccess;
    fprintf(stderr, "error: NCCL: %s\n", nccl.error_string(r));
    return cudaErrorUnknown;
}

cudaError_t tp_all_reduce(GpuState *g, float *x, size_t n) {
    if (g->shard.n == 1) return cudaSuccess;
    return nccl_check(nccl.all_reduce(x, x, n, ncclFloat32, ncclSum, (ncclComm_t)g->shard.comm, g->st));
}

cudaError_t tp_all_gather(GpuState *g, float *buf, size_t count) {
    if (g->shard.n == 1) return cudaSuccess;
    return nccl_check(nccl.all_gather(buf + (size_t)g->shard.rank * count, buf, count, ncclFloat32, (ncclComm_t)g->shard.comm, g->st));
}
#else
static int load_nccl(char *err) {
    gpu_set_err(err, "--gpus: this build has no NCCL (nccl.h was not found when it was compiled); run on one GPU");
    return -1;
}
cudaError_t tp_all_reduce(GpuState *g, float *x, size_t n) {
    (void)x, (void)n;
    return g->shard.n == 1 ? cudaSuccess : cudaErrorNotSupported;
}
cudaError_t tp_all_gather(GpuState *g, float *buf, size_t count) {
    (void)buf, (void)count;
    return g->shard.n == 1 ? cudaSuccess : cudaErrorNotSupported;
}
#endif

cudaError_t tp_all_reduce_stats(GpuState *g, float *x, size_t n, bf16 *xb, float *sumsq) {
    if (tp_oneshot_fits(g, n)) return tp_oneshot(g, x, n, xb, sumsq);
    CU_TRY(tp_all_reduce(g, x, n));
    return residual_stats(x, xb, sumsq, (int)n, g->st);
}

// ---- the ranks and their threads ----

// A call run on every rank at once: rank r's part, 0 or non-zero (the first non-zero is returned).
typedef int (*RankCall)(void *ctx, int r);

typedef struct Gpus {
    int n;
    void *g[MAX_GPUS];          // each rank's state (GpuState)
    void *comm[MAX_GPUS];       // each rank's NCCL communicator
    char err[MAX_GPUS][ERR_LEN]; // each rank's message of its last call
    // The workers (ranks 1 .. n - 1): each waits for gen to move, runs call(ctx, rank), then
    // decrements pending. They spin a while first (a decode step's call comes every few ms).
    pthread_t th[MAX_GPUS];
    int started[MAX_GPUS];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned gen;
    int pending, stop;
    RankCall call;
    void *ctx;
    int rc[MAX_GPUS];
} Gpus;

typedef struct {
    Gpus *G;
    int r;
} Worker;

static void *worker_main(void *arg) {
    Worker w = *(Worker *)arg;
    free(arg);
    Gpus *G = w.G;
    cudaSetDevice(w.r);
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        long spins = 0;
        while ((gen = __atomic_load_n(&G->gen, __ATOMIC_ACQUIRE)) == seen) {
            if (++spins < (1L << 20)) { // ~10-50 ms of polling, then sleep until woken
                __builtin_ia32_pause();
                continue;
            }
            pthread_mutex_lock(&G->mu);
            while (__atomic_load_n(&G->gen, __ATOMIC_ACQUIRE) == seen) pthread_cond_wait(&G->cv, &G->mu);
            pthread_mutex_unlock(&G->mu);
        }
        seen = gen;
        if (__atomic_load_n(&G->stop, __ATOMIC_ACQUIRE)) break;
        G->rc[w.r] = G->call(G->ctx, w.r);
        __atomic_sub_fetch(&G->pending, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

// Runs call on every rank at once (rank 0 on this thread) and waits for all; the first non-zero
// result, or 0.
static int each_call(Gpus *G, RankCall call, void *ctx) {
    if (G->n == 1) return G->rc[0] = call(ctx, 0);
    G->call = call, G->ctx = ctx;
    __atomic_store_n(&G->pending, G->n - 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&G->mu);
    __atomic_add_fetch(&G->gen, 1, __ATOMIC_ACQ_REL);
    pthread_cond_broadcast(&G->cv);
    pthread_mutex_unlock(&G->mu);
    G->rc[0] = call(ctx, 0);
    while (__atomic_load_n(&G->pending, __ATOMIC_ACQUIRE) > 0) __builtin_ia32_pause();
    for (int r = 0; r < G->n; r++)
        if (G->rc[r]) return G->rc[r];
    return 0;
}

template <typename F> static int call_lambda(void *f, int r) { return (*(F *)f)(r); }

// each(G, [&](int r) { ...rank r's part...; return 0; }): runs it on every rank at once.
template <typename F> static int each(Gpus *G, F f) { return each_call(G, call_lambda<F>, &f); }

// The message of the first rank whose call failed, into err (prefixed with the GPU when several).
static void first_err(Gpus *G, char *err) {
    for (int r = 0; r < G->n; r++)
        if (G->rc[r]) {
            if (G->n == 1) snprintf(err, ERR_LEN, "%s", G->err[r]);
            else snprintf(err, ERR_LEN, "GPU %d: %s", r, G->err[r][0] ? G->err[r] : "failed");
            return;
        }
}

static void gpus_free(Gpus *G) {
    if (!G) return;
    each(G, [&](int r) {
        if (G->g[r]) tp_oneshot_free((GpuState *)G->g[r]), one_destroy(G->g[r]);
        G->g[r] = NULL;
        return 0;
    });
    if (G->n > 1) {
        pthread_mutex_lock(&G->mu);
        __atomic_store_n(&G->stop, 1, __ATOMIC_RELEASE);
        __atomic_add_fetch(&G->gen, 1, __ATOMIC_ACQ_REL);
        pthread_cond_broadcast(&G->cv);
        pthread_mutex_unlock(&G->mu);
        for (int r = 1; r < G->n; r++)
            if (G->started[r]) pthread_join(G->th[r], NULL);
    }
#if HAVE_NCCL
    for (int r = 0; r < G->n; r++)
        if (G->comm[r]) nccl.comm_destroy((ncclComm_t)G->comm[r]);
#endif
    pthread_mutex_destroy(&G->mu), pthread_cond_destroy(&G->cv);
    free(G);
}

// The ranks of a model on m->gpus GPUs (0 or 1: one), their threads and communicators; NULL with
// err filled when the model cannot be split so or the GPUs or NCCL are not there.
static Gpus *gpus_open(const Model *m, char *err) {
    int n = m->gpus > 1 ? m->gpus : 1, have = 0;
    if (n > MAX_GPUS) {
        gpu_set_err(err, "--gpus %d: at most %d", n, MAX_GPUS);
        return NULL;
    }
    if (n > 1) {
        if (cudaGetDeviceCount(&have) != cudaSuccess || have < n) {
            gpu_set_err(err, "--gpus %d: this machine has %d CUDA device%s", n, have, have == 1 ? "" : "s");
            return NULL;
        }
        const char *why = shard_refusal(m, n);
        if (why) {
            gpu_set_err(err, "--gpus %d: this model cannot be split over %d GPUs: %s", n, n, why);
            return NULL;
        }
        if (load_nccl(err) != 0) return NULL;
    }
    Gpus *G = (Gpus *)calloc(1, sizeof(Gpus));
    if (!G) {
        gpu_set_err(err, "out of memory");
        return NULL;
    }
    G->n = n;
    pthread_mutex_init(&G->mu, NULL), pthread_cond_init(&G->cv, NULL);
    if (n == 1) return G;
    cudaSetDevice(0); // rank 0 runs on the caller's thread
#if HAVE_NCCL
    int devs[MAX_GPUS];
    for (int r = 0; r < n; r++) devs[r] = r;
    ncclResult_t nr = nccl.comm_init_all((ncclComm_t *)G->comm, n, devs);
    if (nr != ncclSuccess) {
        gpu_set_err(err, "--gpus %d: NCCL could not connect the GPUs: %s", n, nccl.error_string(nr));
        memset(G->comm, 0, sizeof G->comm);
        gpus_free(G);
        return NULL;
    }
#endif
    for (int r = 1; r < n; r++) {
        Worker *w = (Worker *)malloc(sizeof(Worker));
        if (w) *w = (Worker){G, r};
        G->started[r] = w && pthread_create(&G->th[r], NULL, worker_main, w) == 0;
        if (!G->started[r]) {
            free(w);
            gpu_set_err(err, "--gpus %d: cannot start a thread for GPU %d", n, r);
            G->n = r; // the workers started so far are stopped
            gpus_free(G);
            return NULL;
        }
    }
    return G;
}

// Every rank's state made by make(rank's shard, its err) on its own device; then, with several
// GPUs, the ranks' host stores together checked against the host's memory.
template <typename F> static void *gpus_create(const Model *m, char *err, F make) {
    Gpus *G = gpus_open(m, err);
    if (!G) return NULL;
    int rc = each(G, [&](int r) {
        Shard sh = {r, G->n, G->comm[r]};
        G->err[r][0] = 0;
        G->g[r] = make(&sh, G->err[r]);
        return G->g[r] ? 0 : 1;
    });
    if (rc) {
        first_err(G, err);
        gpus_free(G);
        return NULL;
    }
    if (G->n > 1) {
        // NCCL connects the ranks on their first collective: made here, outside any graph capture
        // (a first all-reduce inside a decode graph's capture fails).
        rc = each(G, [&](int r) -> int {
            GpuState *g = (GpuState *)G->g[r];
            CU_TRY(tp_all_reduce(g, g->x, g->c.dim));
            CU_TRY(tp_all_gather(g, g->logits, (size_t)g->vocab_n));
            return (int)cudaStreamSynchronize(g->st);
        });
        if (rc) {
            gpu_set_err(err, "--gpus %d: the first exchange between the GPUs failed (NCCL)", G->n);
            gpus_free(G);
            return NULL;
        }
        // The decode step's sums over peer access where the GPUs have it (after NCCL's first
        // exchange, which must not be one of them; before any graph is captured).
        if (each(G, [&](int r) { return (int)tp_oneshot_alloc((GpuState *)G->g[r]); })) {
            gpu_set_err(err, "--gpus %d: cannot allocate the all-reduce's buffers", G->n);
            gpus_free(G);
            return NULL;
        }
        tp_oneshot_link((GpuState *const *)G->g, G->n);
        size_t need = 0;
        for (int r = 0; r < G->n; r++) {
            const Pkv *p = &((GpuState *)G->g[r])->pkv;
            if (p->on && p->kv.host) need += p->hs.reserved_bytes; // what each store reserved (host_store_open)
        }
        size_t avail = host_memory_available();
        if (need && avail && need > avail) {
            gpu_set_err(err, "host memory: the %d GPUs' KV stores need %.2f GiB together, but only %.2f GiB is available: lower --ctx "
                        "(or --kv-store-dtype fp8: half the bytes)", G->n, gib(need), gib(avail));
            gpus_free(G);
            return NULL;
        }
    }
    return G;
}

static GpuState *rank0(void *dev) { return (GpuState *)((Gpus *)dev)->g[0]; }

// ---- the public entry points (forward_cuda.h) ----

extern "C" void *gpu_create(const Model *m, int ctx, int chunk, int all_logits, const AttnConfig *attn, char *err) {
    return gpus_create(m, err, [&](const Shard *sh, char *e) { return one_create(m, sh, ctx, chunk, all_logits, attn, e); });
}

extern "C" void *gpu_create_bench(const Model *m, int ctx, int chunk, const AttnConfig *attn, char *err) {
    return gpus_create(m, err, [&](const Shard *sh, char *e) { return one_create_bench(m, sh, ctx, chunk, attn, e); });
}

extern "C" void gpu_destroy(void *dev) { gpus_free((Gpus *)dev); }

extern "C" void gpu_set_prefill_len(void *dev, int prefill_len) {
    Gpus *G = (Gpus *)dev;
    for (int r = 0; r < G->n; r++) one_set_prefill_len(G->g[r], prefill_len);
}

extern "C" float *gpu_forward(void *dev, const int *tokens, int T, int pos, int all_logits, char *err) {
    Gpus *G = (Gpus *)dev;
    float *out[MAX_GPUS];
    int rc = each(G, [&](int r) {
        G->err[r][0] = 0;
        out[r] = one_forward(G->g[r], tokens, T, pos, all_logits, G->err[r]);
        return out[r] ? 0 : 1;
    });
    if (rc) {
        first_err(G, err);
        return NULL;
    }
    return out[0]; // every rank holds the whole logits
}

extern "C" int gpu_sample_config(void *dev, const Sampler *s, char *err) {
    Gpus *G = (Gpus *)dev;
    int rc = each(G, [&](int r) { return one_sample_config(G->g[r], s, G->err[r]) != 0; });
    if (rc) first_err(G, err);
    return rc ? -1 : 0;
}

// Every rank samples the same gathered logits with the same uniform: one id, checked.
extern "C" int gpu_decode_sample(void *dev, int token, int pos, float u, const int *pen_ids, const int *pen_counts, int n_pen, char *err) {
    Gpus *G = (Gpus *)dev;
    int id[MAX_GPUS];
    int rc = each(G, [&](int r) {
        G->err[r][0] = 0;
        id[r] = one_decode_sample(G->g[r], token, pos, u, pen_ids, pen_counts, n_pen, G->err[r]);
        return id[r] < 0;
    });
    if (rc) {
        first_err(G, err);
        return -1;
    }
    for (int r = 1; r < G->n; r++)
        if (id[r] != id[0]) {
            gpu_set_err(err, "internal: the GPUs sampled different ids at position %d (GPU 0: %d, GPU %d: %d)", pos, id[0], r, id[r]);
            return -1;
        }
    return id[0];
}

static int gpus_prompt_whole(void *dev, int n) { return one_prompt_whole(rank0(dev), n); }

static size_t gpus_reset(void *dev) {
    Gpus *G = (Gpus *)dev;
    size_t freed[MAX_GPUS] = {0}, sum = 0;
    each(G, [&](int r) {
        freed[r] = one_reset(G->g[r]);
        return 0;
    });
    for (int r = 0; r < G->n; r++) sum += freed[r];
    return sum;
}

static void gpus_profile(void *dev, FILE *f) {
    Gpus *G = (Gpus *)dev;
    for (int r = 0; r < G->n; r++) { // in rank order, this thread on each rank's device in turn (no collective in it)
        cudaSetDevice(r);
        if (G->n > 1 && ((GpuState *)G->g[r])->pkv.cfg.profile) fprintf(f, "profile: GPU %d (its KV heads):\n", r);
        one_profile(G->g[r], f);
    }
    cudaSetDevice(0); // rank 0's, this thread's
}

// Saved sessions hold one GPU's layout (every KV head in order); a state split over several
// GPUs does not write or read it yet.
static int gpus_session_refused(Gpus *G, char *err) {
    if (G->n == 1) return 0;
    gpu_set_err(err, "saved sessions run on one GPU: this state is split over %d (--gpus %d); save or restore without --gpus", G->n, G->n);
    return -1;
}

static int gpus_session_save(void *dev, const SessionGpuLayout *L, SessionStream *out, char *err) {
    Gpus *G = (Gpus *)dev;
    return gpus_session_refused(G, err) ? -1 : one_session_save(G->g[0], L, out, err);
}

static int gpus_session_load(void *dev, const SessionGpuLayout *L, SessionStream *in, char *err) {
    Gpus *G = (Gpus *)dev;
    return gpus_session_refused(G, err) ? -1 : one_session_load(G->g[0], L, in, err);
}

// ---- the benchmark's entry points: every rank runs; rank 0's times (the ranks wait for each
// other in every step's all-reduces) and per-GPU byte counts ----

extern "C" size_t gpu_state_weight_bytes(void *dev) { return one_state_weight_bytes(rank0(dev)); }

extern "C" cudaError_t gpu_fill_kv_random(void *dev, int n_tokens) {
    Gpus *G = (Gpus *)dev;
    return (cudaError_t)each(G, [&](int r) { return (int)one_fill_kv_random(G->g[r], n_tokens); });
}

extern "C" cudaError_t gpu_time_decode(void *dev, int pos, int warmup, int n, int sample, float *ms_out) {
    Gpus *G = (Gpus *)dev;
    float *scratch = (float *)malloc(sizeof(float) * (size_t)n * G->n);
    if (!scratch) return cudaErrorMemoryAllocation;
    int rc = each(G, [&](int r) { return (int)one_time_decode(G->g[r], pos, warmup, n, sample, r ? scratch + (size_t)r * n : ms_out); });
    free(scratch);
    return (cudaError_t)rc;
}

extern "C" double gpu_prefill_attention_ms(void *dev, int start) {
    Gpus *G = (Gpus *)dev;
    double ms[MAX_GPUS];
    each(G, [&](int r) {
        ms[r] = one_prefill_attention_ms(G->g[r], start);
        return 0;
    });
    return ms[0];
}

extern "C" cudaError_t gpu_pkv_fill(void *dev, int n, double *fill_s, double *index_s, char *err) {
    Gpus *G = (Gpus *)dev;
    double f[MAX_GPUS], x[MAX_GPUS];
    int rc = each(G, [&](int r) {
        G->err[r][0] = 0;
        return (int)one_pkv_fill(G->g[r], n, &f[r], &x[r], G->err[r]);
    });
    if (rc) first_err(G, err);
    *fill_s = f[0], *index_s = x[0];
    for (int r = 1; r < G->n && !rc; r++) *fill_s = f[r] > *fill_s ? f[r] : *fill_s, *index_s = x[r] > *index_s ? x[r] : *index_s;
    return (cudaError_t)rc;
}

extern "C" cudaError_t gpu_pkv_time(void *dev, int pos0, int n, int sample, float *ms_out, int *updated, char *err) {
    Gpus *G = (Gpus *)dev;
    float *ms = (float *)malloc(sizeof(float) * (size_t)n * G->n);
    int *up = (int *)malloc(sizeof(int) * (size_t)n * G->n);
    if (!ms || !up) return free(ms), free(up), cudaErrorMemoryAllocation;
    int rc = each(G, [&](int r) {
        G->err[r][0] = 0;
        return (int)one_pkv_time(G->g[r], pos0, n, sample, r ? ms + (size_t)r * n : ms_out, r ? up + (size_t)r * n : updated, G->err[r]);
    });
    if (rc) first_err(G, err);
    free(ms), free(up);
    return (cudaError_t)rc;
}

extern "C" void gpu_pkv_step_bytes(void *dev, int pos, double *device_bytes, double *host_bytes) {
    one_pkv_step_bytes(rank0(dev), pos, device_bytes, host_bytes); // one GPU's: its KV heads
}

extern "C" int gpu_pkv_device_positions(void *dev) { return one_pkv_device_positions(rank0(dev)); }

extern "C" cudaError_t gpu_pkv_time_skip(void *dev, int pos, int skip, int n, float *median_ms, char *err) {
    Gpus *G = (Gpus *)dev;
    float med[MAX_GPUS];
    int rc = each(G, [&](int r) {
        G->err[r][0] = 0;
        return (int)one_pkv_time_skip(G->g[r], pos, skip, n, &med[r], G->err[r]);
    });
    if (rc) first_err(G, err);
    *median_ms = med[0];
    return (cudaError_t)rc;
}

extern "C" int gpu_pkv_cache_lines(void *dev, double *bytes) { return one_pkv_cache_lines(rank0(dev), bytes); }

extern "C" cudaError_t gpu_pkv_cache_stats(void *dev, double *hits, double *rows, int reset) {
    Gpus *G = (Gpus *)dev;
    double h[MAX_GPUS], n[MAX_GPUS];
    int rc = each(G, [&](int r) { return (int)one_pkv_cache_stats(G->g[r], &h[r], &n[r], reset); });
    *hits = *rows = 0;
    for (int r = 0; r < G->n && !rc; r++) *hits += h[r], *rows += n[r];
    return (cudaError_t)rc;
}

extern "C" cudaError_t gpu_pkv_stream(void *dev, double keep, double ret, char *err) {
    Gpus *G = (Gpus *)dev;
    int rc = each(G, [&](int r) {
        G->err[r][0] = 0;
        return (int)one_pkv_stream(G->g[r], keep, ret, G->err[r]);
    });
    if (rc) first_err(G, err);
    return (cudaError_t)rc;
}

extern "C" int gpu_count(void *dev) { return ((Gpus *)dev)->n; }

// What a decode step spends communicating: its all-reduces (two a layer, dim floats each) and
// its logits' gather, alone in a graph of their own, replayed `reps` times; the median ms. With
// the sums fused into the residual GEMVs (tp.fused) they have no time of their own: the step's
// residual GEMVs with their sums (and the gather) against the same GEMVs without.
extern "C" const char *gpu_comm_kind(void *dev) {
    Gpus *G = (Gpus *)dev;
    const GpuState *g = (const GpuState *)G->g[0];
    if (G->n == 1 || !g->tp.on) return "NCCL";
    return g->tp.fused ? "sums fused into the residual GEMVs over peer access (PKV_TP_FUSED=0: one-shot kernels), gather by NCCL"
                       : "one-shot all-reduces over peer access (PKV_TP_ONESHOT=0: NCCL's), gather by NCCL";
}

// Rank r's graph of what enqueue(g) puts on its stream, replayed reps times after 3: rank 0's
// times in t.
template <typename F> static cudaError_t time_graph(GpuState *g, int r, int reps, float *t, F enqueue) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaEvent_t a, b;
    CU_TRY(cudaEventCreate(&a));
    CU_TRY(cudaEventCreate(&b));
    CU_TRY(cudaStreamBeginCapture(g->st, cudaStreamCaptureModeThreadLocal));
    cudaError_t e = enqueue(g);
    cudaError_t e2 = cudaStreamEndCapture(g->st, &graph);
    CU_TRY(e);
    CU_TRY(e2);
    CU_TRY(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
    for (int i = -3; i < reps && e == cudaSuccess; i++) {
        float ms = 0;
        e = cudaEventRecord(a, g->st);
        if (e == cudaSuccess) e = cudaGraphLaunch(exec, g->st);
        if (e == cudaSuccess) e = cudaEventRecord(b, g->st);
        if (e == cudaSuccess) e = cudaEventSynchronize(b);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
        if (r == 0 && i >= 0) t[i] = ms;
    }
    cudaGraphExecDestroy(exec);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return e;
}

static float median(float *t, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            float x = t[j];
            t[j] = t[j - 1], t[j - 1] = x;
        }
    return t[n / 2];
}

// The step's residual GEMVs (the embedding step first: it counts the steps), with the ranks'
// sums fused (sum != 0) or without.
static cudaError_t residual_gemvs(GpuState *g, int sum) {
    const Config *c = &g->c;
    CU_TRY(embed_stats(g->x, g->xb, g->sumsq_a, g->embd, g->d_tokens, c->dim, sum ? g->tp.count : NULL, g->st));
    int q_dim = c->n_heads * c->head_dim;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const GpuLayer *w = &g->layers[l];
        if (sum) {
            CU_TRY(gemv_bf16_add_stats_tp(g->x, w->wo, g->att, q_dim, c->dim, g->xb, g->sumsq_b, tp_sum_link(g, 2 * l, 0), g->st));
            CU_TRY(gemv_bf16_add_stats_tp(g->x, w->wdown, g->hb, c->hidden_dim, c->dim, g->xb, g->sumsq_a, tp_sum_link(g, 2 * l + 1, 0), g->st));
        } else {
            CU_TRY(gemv_bf16_add_stats(g->x, w->wo, g->att, q_dim, c->dim, g->xb, g->sumsq_b, g->st));
            CU_TRY(gemv_bf16_add_stats(g->x, w->wdown, g->hb, c->hidden_dim, c->dim, g->xb, g->sumsq_a, g->st));
        }
    }
    return sum ? tp_all_gather(g, g->logits, (size_t)g->vocab_n) : cudaSuccess;
}

extern "C" cudaError_t gpu_comm_time(void *dev, int reps, double *median_ms) {
    Gpus *G = (Gpus *)dev;
    *median_ms = 0;
    if (G->n == 1) return cudaSuccess;
    float *t = (float *)malloc(sizeof(float) * 2 * (size_t)reps);
    if (!t) return cudaErrorMemoryAllocation;
    int fused = ((GpuState *)G->g[0])->tp.fused;
    int rc = each(G, [&](int r) -> int {
        GpuState *g = (GpuState *)G->g[r];
        if (fused) {
            CU_TRY(time_graph(g, r, reps, t, [](GpuState *g) { return residual_gemvs(g, 1); }));
            return (int)time_graph(g, r, reps, t + reps, [](GpuState *g) { return residual_gemvs(g, 0); });
        }
        return (int)time_graph(g, r, reps, t, [](GpuState *g) {
            cudaError_t e = cudaSuccess;
            for (uint32_t l = 0; l < 2 * g->c.n_layers && e == cudaSuccess; l++) e = tp_all_reduce_stats(g, g->x, g->c.dim, g->xb, g->sumsq_b);
            return e == cudaSuccess ? tp_all_gather(g, g->logits, (size_t)g->vocab_n) : e;
        });
    });
    if (!rc) *median_ms = median(t, reps) - (fused ? median(t + reps, reps) : 0.0f);
    free(t);
    return (cudaError_t)rc;
}

// ---- the backend table ----

static int gpu_available(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static const Backend backend_cuda = {
    "cuda", NULL, NULL, NULL, NULL, NULL, NULL, gpu_available, gpu_create, gpu_set_prefill_len, gpu_forward, gpu_destroy, gpu_bench, GPU_PREFILL_CHUNK,
    gpus_prompt_whole, gpus_session_save, gpus_session_load, gpus_reset, gpu_sample_config, gpu_decode_sample, gpus_profile,
};

extern "C" const Backend *backend_cuda_get(void) { return &backend_cuda; }
