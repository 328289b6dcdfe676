// ParisKV's decode attention on the GPU: the K/V of a run as the GPU sees it (a device cache of
// sink + ring, the retrieval zone in the host store or the device cache), the step's QKV
// post-processing, and exact attention over sink U top-k U local window U buffer.
#ifndef PARISKV_ATTEND_H
#define PARISKV_ATTEND_H

#include <cuda_runtime.h>
#include <stddef.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

// Where the K/V rows of position p live.
//   device cache kc, vc (n_layers, n_kv, dcap, hd): positions p < sink at slot p, later ones at
//     slot sink + (p - sink) % (dcap - sink) -- a ring that holds the local window and the
//     update buffer (and, while nothing has wrapped, every position: the prefill's cache).
//   zone (positions sink .. zone_end - 1, slot i = p - sink): host != NULL: the host store's row
//     at byte ((i * n_layers + l) * n_kv + h) * row bytes (key, then value; offload/host_store.h),
//     bf16 or, fp8 set, e4m3 codes and two fp32 scales (offload/fp8.h), written by the QKV
//     kernel as each position is computed; host == NULL: the device cache at position p (then
//     dcap covers the whole context).
typedef struct {
    bf16 *kc, *vc;
    void *host;
    int n_layers, n_kv, hd, dcap, sink;
    long alias_slots; // > 0: zone slot i's host row is that of slot i % alias_slots (offload/host_store.h; timing only)
    int fp8;          // host rows in fp8
} GpuKV;

// The zone row cache (host store only): the zone rows recently selected, kept in GPU memory, per
// (layer, KV head) n lines; slot s may sit in line s & (n - 1).
typedef struct {
    char *lines;               // (n_layers, n_kv, n, row bytes): each line one host-store row exactly as stored
    int *tags;                 // (n_layers, n_kv, n): the zone slot the line holds, -1: none
    unsigned long long *stats; // (n_layers, 2): zone rows read from the cache (hits) and from the host (misses)
    int n;                     // lines per (layer, KV head), a power of two; 0: no cache
    int hashed;                // the step's claims in a hash of its lines (pkv_row_cache_hashed), not a table of n
} PkvRowCache;

// The attention resolves a step's claims in shared memory: a table of all n lines up to
// PKV_RC_DIRECT_MAX lines (64 KB), beyond it an open-addressing hash of the lines the step's
// rows fall on (2 x 4 bytes an entry, pkv_row_cache_hash_entries(kmax) of them), which needs
// kmax <= PKV_RC_HASH_KMAX (128 KB). With PKV_RC_HASH_GROUP or more query heads a KV head the hash
// at any n: on the Llama-3.1-70B shape (8 a KV head) at 16,384 lines the direct table made the
// step 2.5% slower, on the 8B shapes (4) the hash 0.4-0.9% (tests/bench/GPU.md, session 29).
#define PKV_RC_DIRECT_MAX 16384
#define PKV_RC_HASH_KMAX 8192
#define PKV_RC_HASH_GROUP 8
#ifdef __CUDACC__
#define PKV_RC_FN static inline __host__ __device__
#else
#define PKV_RC_FN static inline
#endif
PKV_RC_FN int pkv_row_cache_hashed(int n, int group) { return n > PKV_RC_DIRECT_MAX || group >= PKV_RC_HASH_GROUP; }
PKV_RC_FN int pkv_row_cache_hash_entries(int kmax) { // a power of two >= 2 kmax: probes stay short
    int e = 64;
    while (e < 2 * kmax) e *= 2;
    return e;
}

// The decode step's QKV post-processing: qkv ((n_heads + 2 n_kv) hd) fp32 from the projection;
// q (n_heads, hd) fp32 = q with the optional q_norm and RoPE (rope_cs from rope_table()); the
// new key (k_norm, RoPE) and value stored as bf16 in the device cache at *d_pos's slot and, with
// a host store and *d_pos >= sink, written through to its zone row (so eviction moves nothing).
cudaError_t pkv_qkv_decode(float *q, const float *qkv, const float *q_norm, const float *k_norm, const float *rope_cs,
                           GpuKV kv, int layer, const int *d_pos, int n_heads, float eps, cudaStream_t st);

// Splits per KV head of pkv_attend (fixed by the device, the head size and kmax), and its
// scratch in floats.
int pkv_attend_splits(int n_kv, int hd, int kmax);
size_t pkv_attend_scratch_floats(int n_heads, int n_kv, int hd, int kmax);

// out (n_heads, hd) bf16 = exact attention of q (n_heads, hd) fp32 over, per KV head h: the sink
// positions, the zone slots sel[h * kmax .. + nsel[h]) (ascending, as pkv_gpu_select writes them:
// the sum then runs in one order and a step repeats bit for bit), and positions meta[0] (zone_end) ..
// *d_pos (the local window, the update buffer and the new token). Scale 1/sqrt(hd).
// partial: pkv_attend_scratch_floats(); counters: n_kv zeroed unsigned ints (left zeroed).
cudaError_t pkv_attend(bf16 *out, const float *q, const int *sel, const int *nsel, int kmax, GpuKV kv, int layer,
                       const int *d_pos, const int *meta, int n_heads, float *partial, unsigned *counters, cudaStream_t st);
// The same, zone rows through the row cache rc (rc.n == 0 or no host store: none). Per (layer,
// head) and step, among the selected slots of one line: the one whose tag it is reads the line
// (a hit) and nobody writes it; with no hit, the first of them in the selection (a miss, read
// from the host) writes its row into the line, then the tag; the others read the host. So no
// line is written twice in a step or while it is read, and outputs are the same bytes with or
// without the cache. Every block of a head resolves this in shared memory: a table of rc.n ints, or
// with rc.hashed a hash of the step's lines (then kmax <= PKV_RC_HASH_KMAX).
cudaError_t pkv_attend_rc(bf16 *out, const float *q, const int *sel, const int *nsel, int kmax, GpuKV kv, PkvRowCache rc, int layer,
                          const int *d_pos, const int *meta, int n_heads, float *partial, unsigned *counters, cudaStream_t st);

// The row cache's bytes for these shapes (lines, tags, counters); its tags to -1 (a new
// sequence, a rewind: whenever a zone row may change); and the setup pkv_attend_rc needs for
// rc.n lines (its shared memory), once before any graph capture.
size_t pkv_row_cache_bytes(int n_layers, int n_kv, int hd, int fp8, int n);
cudaError_t pkv_row_cache_invalidate(PkvRowCache rc, int n_layers, int n_kv, cudaStream_t st);
cudaError_t pkv_attend_setup(PkvRowCache rc, int n_heads, int n_kv, int hd, int kmax);

// Copies positions [p0, p1) of every layer from the device cache to their host-store rows (the
// prompt's rows after a prefill; positions written by dense steps). kv.host must be set.
cudaError_t pkv_rows_to_host(GpuKV kv, int p0, int p1, cudaStream_t st);

// Rows of positions [p0, p1) of every layer between a device cache (dev: kc, vc, dcap, sink) and
// rows in the host store's layout (host: host, n_layers, n_kv, hd, fp8; the row of position p
// at slot p - host.sink, which may be a staging buffer's own numbering). PKV_ROWS_TO_HOST:
// dev's rows into host's (fp8 rows quantized as the QKV kernel does); PKV_ROWS_FROM_HOST:
// host's bf16 rows into dev's cache. Saved sessions (kernels/session_gpu.cu).
#define PKV_ROWS_TO_HOST 1
#define PKV_ROWS_FROM_HOST 0
cudaError_t pkv_rows_copy(GpuKV dev, GpuKV host, int p0, int p1, int dir, cudaStream_t st);

// One layer's rows from a layer-sized cache k, v (n_kv, cap, hd) bf16 (slot p = position p: a
// prompt prefilled layer by layer) into layer `layer` of kv: positions [p0, p1) into the host
// store (to_host; positions below the sink are skipped, fp8 rows quantized as the QKV kernel
// does), or into the device cache's slots (the sink and the ring).
cudaError_t pkv_layer_rows_out(GpuKV kv, int layer, const bf16 *k, const bf16 *v, int cap, int p0, int p1, int to_host,
                               cudaStream_t st);

// Random K/V for a benchmark: zone slots [0, n_slots) in the host store (or the device cache),
// and every device-cache slot. Values uniform in [-1, 1].
cudaError_t pkv_fill_random(GpuKV kv, int n_slots, unsigned long long seed, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
