// Saved sessions on the GPU (model/session.h, kv_format SESSION_KV_GPU, SessionGpuLayout).
//
// The zone's rows go straight between the file and the host store's pinned pages: a restore
// reads them into the store's own huge-page mapping, so the decode's row fetches after it run as
// fast as after a prefill (a file mapping would bring 4 KiB pages, which the GPU's address
// translation fetches through markedly slower, and registering a MAP_PRIVATE file mapping
// copies every page anyway). When the zone is in device memory its rows pass through a pinned
// staging buffer, as do the sink's and the local window's exact rows. The ParisKV index is not
// saved: the next step's pkv_index_to encodes the zone from the restored rows (the same keys
// give the same index).
#include <string.h>

#include "gpu_state.h"

extern "C" {
#include "../model/session.h"
}

#define STAGING_BYTES ((size_t)512 << 20) // two halves of whole 64-MiB pieces: read and checksummed by several threads
#define MAX_RUNS 4096

// The device cache as the row kernels see it: ParisKV's view (sink + ring), or the dense
// cache (slot p = position p).
static GpuKV device_view(const GpuState *g) {
    if (g->pkv.on) return g->pkv.kv;
    const Config *c = &g->c;
    return (GpuKV){g->kcache, g->vcache, NULL, (int)c->n_layers, (int)c->n_kv_heads, (int)c->head_dim, g->dcap, 0, 0, 0};
}

static int dev_slot(const GpuKV *d, int p) { return p < d->sink ? p : d->sink + (p - d->sink) % (d->dcap - d->sink); }

typedef struct {
    GpuState *g;
    SessionStream *s;
    char *stg;          // pinned staging
    size_t cap, used;   // its bytes, and those the pending runs take
    int save, n_runs;
    bf16 *dev[MAX_RUNS]; // each run: device rows, its bytes at stg + off[i]
    size_t off[MAX_RUNS], bytes[MAX_RUNS];
    char *err;
} Io;

static int io_fail(Io *io, const char *what, cudaError_t e) {
    gpu_set_err(io->err, "%s: %s", what, cudaGetErrorString(e));
    return -1;
}

// The pending runs: saving, device -> staging -> stream; loading, stream -> staging -> device.
static int flush(Io *io) {
    if (!io->n_runs) return 0;
    cudaError_t e = cudaSuccess;
    if (!io->save && session_get(io->s, io->stg, io->used) != 0) return gpu_set_err(io->err, "%s", "reading the session failed"), -1;
    for (int i = 0; i < io->n_runs && e == cudaSuccess; i++)
        e = io->save ? cudaMemcpyAsync(io->stg + io->off[i], io->dev[i], io->bytes[i], cudaMemcpyDeviceToHost, io->g->st)
                     : cudaMemcpyAsync(io->dev[i], io->stg + io->off[i], io->bytes[i], cudaMemcpyHostToDevice, io->g->st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(io->g->st);
    if (e != cudaSuccess) return io_fail(io, "copying the session's rows", e);
    if (io->save && session_put(io->s, io->stg, io->used) != 0) return gpu_set_err(io->err, "%s", "writing the session failed"), -1;
    io->n_runs = 0, io->used = 0;
    return 0;
}

// Rows of positions [a, b) of one (layer, K or V, KV head) whose cache rows start at base.
static int window_range(Io *io, const GpuKV *d, bf16 *base, int a, int b) {
    size_t row = (size_t)d->hd * sizeof(bf16);
    for (int p = a; p < b;) {
        int slot = dev_slot(d, p), run = b - p;
        int contiguous = p < d->sink ? d->sink - p : d->dcap - slot; // to the sink's end, or the ring's wrap
        if (run > contiguous) run = contiguous;
        if (io->n_runs == MAX_RUNS || io->used + row > io->cap) {
            if (flush(io) != 0) return -1;
        }
        size_t room = (io->cap - io->used) / row;
        if ((size_t)run > room) run = (int)room;
        io->dev[io->n_runs] = base + (size_t)slot * d->hd, io->off[io->n_runs] = io->used, io->bytes[io->n_runs] = (size_t)run * row;
        io->used += (size_t)run * row, io->n_runs++;
        p += run;
    }
    return 0;
}

// The window part: per layer, K then V, per KV head, positions [0, win_a) then [win_b, n).
static int window_io(Io *io, const GpuKV *d, const SessionGpuLayout *L) {
    for (int l = 0; l < d->n_layers; l++)
        for (int v = 0; v < 2; v++)
            for (int h = 0; h < d->n_kv; h++) {
                bf16 *base = (v ? d->vc : d->kc) + ((size_t)l * d->n_kv + h) * d->dcap * d->hd;
                if (window_range(io, d, base, 0, L->win_a) != 0 || window_range(io, d, base, L->win_b, L->n) != 0) return -1;
            }
    return flush(io);
}

// The zone part from / into a device-resident zone through the two halves of the staging buffer
// in turn: the GPU gathers (or scatters) one half's slots while the file takes (or fills) the other.
static int zone_staged(Io *io, const GpuKV *d, const SessionGpuLayout *L) {
    size_t half = io->cap / 2;
    int per = (int)(half / L->slot_bytes), end = L->zone_from + L->zone_slots, k = 0;
    cudaEvent_t ev[2];
    if (cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming) != cudaSuccess) return gpu_set_err(io->err, "%s", "CUDA events"), -1;
    if (cudaEventCreateWithFlags(&ev[1], cudaEventDisableTiming) != cudaSuccess) {
        cudaEventDestroy(ev[0]);
        return gpu_set_err(io->err, "%s", "CUDA events"), -1;
    }
    const char *fail = NULL;
    cudaError_t e = cudaSuccess;
    size_t prev_bytes = 0;
    for (int p0 = L->zone_from; p0 < end && !fail; p0 += per, k++) {
        int p1 = p0 + per < end ? p0 + per : end;
        size_t bytes = (size_t)(p1 - p0) * L->slot_bytes;
        char *buf = io->stg + (size_t)(k & 1) * half;
        GpuKV rows = {NULL, NULL, buf, d->n_layers, d->n_kv, d->hd, 0, p0, 0, 0}; // slot 0 = position p0
        if (io->save) {
            e = pkv_rows_copy(*d, rows, p0, p1, PKV_ROWS_TO_HOST, io->g->st);
            if (e == cudaSuccess) e = cudaEventRecord(ev[k & 1], io->g->st);
            if (e == cudaSuccess && k > 0) e = cudaEventSynchronize(ev[(k - 1) & 1]);
            if (e != cudaSuccess) fail = "copying the zone's rows";
            else if (k > 0 && session_put(io->s, io->stg + (size_t)((k - 1) & 1) * half, prev_bytes) != 0) fail = "writing the session";
            prev_bytes = bytes;
        } else {
            if (k > 1 && (e = cudaEventSynchronize(ev[k & 1])) != cudaSuccess) fail = "copying the zone's rows"; // the GPU is done with this half
            else if (session_get(io->s, buf, bytes) != 0) fail = "reading the session";
            else if ((e = pkv_rows_copy(*d, rows, p0, p1, PKV_ROWS_FROM_HOST, io->g->st)) != cudaSuccess ||
                     (e = cudaEventRecord(ev[k & 1], io->g->st)) != cudaSuccess)
                fail = "copying the zone's rows";
        }
    }
    if (!fail && (e = cudaStreamSynchronize(io->g->st)) != cudaSuccess) fail = "copying the zone's rows";
    if (!fail && io->save && k > 0 && session_put(io->s, io->stg + (size_t)((k - 1) & 1) * half, prev_bytes) != 0) fail = "writing the session";
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    if (fail && e != cudaSuccess) return io_fail(io, fail, e);
    if (fail) return gpu_set_err(io->err, "%s failed", fail), -1;
    return 0;
}

static int zone_io(Io *io, const GpuKV *d, const SessionGpuLayout *L) {
    GpuState *g = io->g;
    Pkv *p = &g->pkv;
    uint64_t bytes = (uint64_t)L->zone_slots * L->slot_bytes;
    if (!L->zone_slots) return 0;
    int fp8 = p->kv.host && p->kv.fp8;
    if (!p->on || L->fp8 != fp8 || (p->kv.host && L->slot_bytes != (uint64_t)p->hs.slot_bytes)) {
        gpu_set_err(io->err, "internal: the session's zone (%d rows, %s) does not match the state's", L->zone_slots, L->fp8 ? "fp8" : "bf16");
        return -1;
    }
    if (p->kv.host) {
        int n = L->n, S = L->zone_from;
        if (host_store_grow(&p->hs, L->zone_slots, io->err) != 0) return -1;
        if (io->save && p->synced < n) { // rows a dense phase left in the device cache only
            int from = p->synced > S ? p->synced : S;
            cudaError_t e = n > g->dcap ? cudaErrorInvalidValue : pkv_rows_to_host(p->kv, from, n, g->st);
            if (e == cudaSuccess) e = cudaStreamSynchronize(g->st);
            if (e != cudaSuccess) return io_fail(io, "copying the last rows to the host store", e);
            p->synced = n;
        }
        int rc = io->save ? session_put(io->s, p->hs.base, (size_t)bytes) : session_get(io->s, p->hs.base, (size_t)bytes);
        if (rc != 0) return gpu_set_err(io->err, "%s", io->save ? "writing the session failed" : "reading the session failed"), -1;
    } else if (zone_staged(io, d, L) != 0) {
        return -1;
    }
    static const char zeros[SESSION_ALIGN] = {0};
    char pad[SESSION_ALIGN];
    size_t np = (size_t)(L->zone_bytes - bytes);
    if (np && (io->save ? session_put(io->s, zeros, np) : session_get(io->s, pad, np)) != 0)
        return gpu_set_err(io->err, "%s", "the session's padding failed"), -1;
    return 0;
}

static int session_io(GpuState *g, const SessionGpuLayout *L, SessionStream *s, int save, char *err) {
    Pkv *p = &g->pkv;
    GpuKV d = device_view(g);
    err[0] = 0;
    if (p->on && p->kv.host && p->hs.alias_slots) {
        gpu_set_err(err, "a folded host store (PKV_HOST_ALIAS_GIB, for timing) keeps no sessions");
        return -1;
    }
    int ring_rows = L->win_a > d.sink ? L->n - d.sink : L->n - (L->win_b > d.sink ? L->win_b : d.sink);
    if (L->n > g->ctx || ring_rows > d.dcap - d.sink) {
        gpu_set_err(err, "the GPU's device cache (%d positions) cannot hold the session's %d window positions (of %d)", d.dcap, ring_rows, L->n);
        return -1;
    }
    Io io;
    memset(&io, 0, sizeof io);
    io.g = g, io.s = s, io.save = save, io.err = err;
    io.cap = STAGING_BYTES > 2 * L->slot_bytes ? STAGING_BYTES : 2 * (size_t)L->slot_bytes;
    cudaError_t e = cudaStreamSynchronize(g->st);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&io.stg, io.cap);
    if (e != cudaSuccess) return io_fail(&io, "session staging", e);
    int rc = zone_io(&io, &d, L);
    if (rc == 0) rc = window_io(&io, &d, L);
    cudaFreeHost(io.stg);
    if (rc == 0 && !save && p->on) { // the state as the saving run left it at position n
        p->seen_end = L->n, p->ring_hi = L->n, p->indexed = 0;
        p->synced = p->kv.host && L->zone_slots ? L->n : 0;
    }
    return rc;
}

int one_session_save(void *dev, const SessionGpuLayout *L, SessionStream *out, char *err) {
    return session_io((GpuState *)dev, L, out, 1, err);
}

int one_session_load(void *dev, const SessionGpuLayout *L, SessionStream *in, char *err) {
    return session_io((GpuState *)dev, L, in, 0, err);
}
