// The PKV_RECALL measurement on the GPU path (attention/recall.h): after a ParisKV decode step,
// each layer's query and selection (kept by the decode graph) against the exact top-k of the zone
// by the group's mean query, over the keys as the attention reads them -- the host store's bf16
// or fp8 rows, or the device cache's bf16 rows. Host code, off the measured path: it only runs
// when PKV_RECALL names a file.
#include <stdlib.h>
#include <string.h>

#include "gpu_state.h"

extern "C" {
#include "../attention/recall.h"
#include "../model/bf16.h"
#include "../offload/fp8.h"
}

// scores[(l n_kv + h) nz + i] = qbar[l][h] . key of zone slot i (bf16 rows: the device cache, or the
// host store through UVA): one warp per key.
__global__ void recall_scores_kernel(float *scores, const float *qbar, GpuKV kv, int nz, size_t row_bytes) {
    long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31, hd = kv.hd;
    if (w >= (long)kv.n_layers * kv.n_kv * nz) return;
    int i = (int)(w % nz), lh = (int)(w / nz), h = lh % kv.n_kv, l = lh / kv.n_kv;
    const bf16 *k;
    if (kv.host) {
        size_t slot = kv.alias_slots ? (size_t)(i % kv.alias_slots) : (size_t)i;
        k = (const bf16 *)((const char *)kv.host + ((slot * kv.n_layers + l) * kv.n_kv + h) * row_bytes);
    } else {
        k = kv.kc + (((size_t)l * kv.n_kv + h) * kv.dcap + kv.sink + i) * hd; // the zone: no ring wrap below zone_end
    }
    const float *q = qbar + (size_t)lh * hd;
    float s = 0.0f;
    for (int j = lane; j < hd; j += 32) s += q[j] * __bfloat162float(k[j]);
    s = warp_sum(s);
    if (lane == 0) scores[w] = s;
}

cudaError_t pkv_recall_step(GpuState *g, int pos) {
    Pkv *p = &g->pkv;
    const Config *c = &g->c;
    FILE *f = recall_file();
    int L = (int)c->n_layers, nkv = (int)c->n_kv_heads, nh = (int)c->n_heads, hd = (int)c->head_dim, G = nh / nkv;
    int S = p->cfg.sink, nz = attn_zone_end(&p->cfg, pos) - S, kmax = p->sc.kmax;
    if (!f || nz < 0) return cudaSuccess;
    CU_TRY(cudaMemcpy(p->h_dbg_q, p->dbg_q, (size_t)L * nh * hd * 4, cudaMemcpyDeviceToHost));
    CU_TRY(cudaMemcpy(p->h_dbg_sel, p->dbg_sel, (size_t)L * nkv * kmax * 4, cudaMemcpyDeviceToHost));
    CU_TRY(cudaMemcpy(p->h_dbg_nsel, p->dbg_nsel, (size_t)L * nkv * 4, cudaMemcpyDeviceToHost));
    size_t n_scores = (size_t)L * nkv * (nz > 0 ? nz : 1);
    float *qbar = (float *)malloc((size_t)L * nkv * hd * 4), *scores = (float *)malloc(n_scores * 4);
    float *scratch = (float *)malloc((size_t)recall_scratch_floats(nz, p->cfg.topk) * 4);
    cudaError_t e = qbar && scores && scratch ? cudaSuccess : cudaErrorMemoryAllocation;
    for (int lh = 0; lh < L * nkv && e == cudaSuccess; lh++) { // the groups' mean queries, summed in head order as the selection does
        const float *q = p->h_dbg_q + ((size_t)(lh / nkv) * nh + (size_t)(lh % nkv) * G) * hd;
        for (int j = 0; j < hd; j++) {
            float t = 0.0f;
            for (int k = 0; k < G; k++) t += q[k * hd + j];
            qbar[(size_t)lh * hd + j] = t / (float)G;
        }
    }
    if (e == cudaSuccess && nz > 0 && !(p->kv.host && p->kv.fp8)) {
        float *d_q = NULL, *d_s = NULL;
        e = cudaMalloc(&d_q, (size_t)L * nkv * hd * 4);
        if (e == cudaSuccess) e = cudaMalloc(&d_s, n_scores * 4);
        if (e == cudaSuccess) e = cudaMemcpy(d_q, qbar, (size_t)L * nkv * hd * 4, cudaMemcpyHostToDevice);
        if (e == cudaSuccess) {
            long warps = (long)n_scores;
            // On the legacy default stream, in order with the cudaMemcpy calls around it (g->st is a
            // non-blocking stream: those copies would not wait for a kernel there).
            recall_scores_kernel<<<(unsigned)((warps * 32 + 255) / 256), 256, 0, 0>>>(d_s, d_q, p->kv, nz, p->hs.row_bytes);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess) e = cudaMemcpy(scores, d_s, n_scores * 4, cudaMemcpyDeviceToHost); // (synchronizes)
        cudaFree(d_q), cudaFree(d_s);
    } else if (e == cudaSuccess && nz > 0) { // fp8 host rows: decoded here, as the attention decodes them
        float *key = (float *)malloc((size_t)hd * 4);
        for (int lh = 0; key && lh < L * nkv; lh++)
            for (int i = 0; i < nz; i++) {
                long slot = p->kv.alias_slots ? i % p->kv.alias_slots : i;
                const uint8_t *r = (const uint8_t *)p->kv.host + (((size_t)slot * L + lh / nkv) * nkv + lh % nkv) * p->hs.row_bytes;
                float scale;
                memcpy(&scale, r + 2 * hd, 4);
                fp8_dequantize_row(r, scale, hd, key);
                double d = 0;
                for (int j = 0; j < hd; j++) d += (double)qbar[(size_t)lh * hd + j] * key[j];
                scores[(size_t)lh * nz + i] = (float)d;
            }
        if (!key) e = cudaErrorMemoryAllocation;
        free(key);
    }
    for (int lh = 0; lh < L * nkv && e == cudaSuccess; lh++) {
        const int *sel = p->h_dbg_sel + (size_t)lh * kmax;
        double r = recall_from_scores(scores + (size_t)lh * (nz > 0 ? nz : 1), nz, p->cfg.topk, sel, p->h_dbg_nsel[lh], scratch);
        fprintf(f, "%d %d %d %.6f\n", pos, lh / nkv, g->shard.rank * nkv + lh % nkv, r); // the model's KV head (--gpus: this GPU's share)
    }
    free(qbar), free(scores), free(scratch);
    return e;
}
