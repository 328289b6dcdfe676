// The host store (host_store.h): reserve, grow by registered chunks, release.
#include "host_store.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

size_t host_store_row_bytes(int head_dim, int fp8) { return fp8 ? 2 * (size_t)head_dim + 8 : 4 * (size_t)head_dim; }

size_t host_store_bytes(int n_layers, int n_kv, int head_dim, int fp8, long slots) {
    return (size_t)slots * n_layers * n_kv * host_store_row_bytes(head_dim, fp8);
}

size_t host_memory_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

int host_store_open(HostStore *h, int n_layers, int n_kv, int head_dim, int fp8, long cap_slots, char *err) {
    memset(h, 0, sizeof *h);
    int can = 0, dev = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&can, cudaDevAttrCanUseHostPointerForRegisteredMem, dev) != cudaSuccess || !can) {
        snprintf(err, 256, "the host KV store needs a GPU that reads registered host memory at its own address (UVA); use --kv-store gpu");
        return -1;
    }
    h->n_layers = n_layers, h->n_kv = n_kv, h->head_dim = head_dim, h->fp8 = fp8;
    h->row_bytes = host_store_row_bytes(head_dim, fp8);
    h->slot_bytes = host_store_bytes(n_layers, n_kv, head_dim, fp8, 1);
    h->cap_slots = cap_slots > 0 ? cap_slots : 1;
    // Chunks of whole pages: a multiple of page / gcd(slot_bytes, page) slots.
    long page = sysconf(_SC_PAGESIZE), g = page, r = (long)(h->slot_bytes % (size_t)page);
    for (long a = r; a;) { long t = g % a; g = a; a = t; }
    long unit = page / g;
    h->chunk_slots = (long)(HOST_STORE_CHUNK_BYTES / h->slot_bytes) / unit * unit;
    if (h->chunk_slots < unit) h->chunk_slots = unit;
    size_t need = h->slot_bytes * (size_t)h->cap_slots, avail = host_memory_available();
    const char *alias = getenv("PKV_HOST_ALIAS_GIB");
    size_t chunk_bytes = (size_t)h->chunk_slots * h->slot_bytes;
    if (alias && atof(alias) > 0) {
        long a = (long)(atof(alias) * 1073741824.0 / (double)chunk_bytes) * h->chunk_slots; // whole chunks
        if (a < h->chunk_slots) a = h->chunk_slots;
        if (a < h->cap_slots) h->alias_slots = a;
    }
    size_t real = h->alias_slots ? h->slot_bytes * (size_t)h->alias_slots : need;
    if (avail && real > avail) {
        snprintf(err, 256, "host memory: the %s KV store for %ld retrieval-zone positions needs %.2f GiB, but only %.2f GiB is available: "
                 "lower --ctx%s", fp8 ? "fp8" : "bf16", h->cap_slots, real / 1073741824.0, avail / 1073741824.0,
                 fp8 ? "" : " (or --kv-store-dtype fp8: half the bytes; or --kv-store gpu when it fits the GPU)");
        return -1;
    }
    if (h->alias_slots)
        fprintf(stderr, "host store: %.1f GiB of slots folded onto %.1f GiB (PKV_HOST_ALIAS_GIB; timing only)\n", need / 1073741824.0,
                real / 1073741824.0);
    size_t align = (size_t)2 << 20; // whole huge pages, so chunks never share one
    h->reserved_bytes = (real + align - 1) / align * align + (size_t)page;
    void *p = mmap(NULL, h->reserved_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(err, 256, "host memory: cannot reserve %.2f GiB for the KV store", h->reserved_bytes / 1073741824.0);
        h->reserved_bytes = 0;
        return -1;
    }
    madvise(p, h->reserved_bytes, MADV_HUGEPAGE); // advice only: without THP the store still works, slower to fill
    h->base = p;
    return 0;
}

typedef struct {
    char *a;
    size_t n;
} Span;

static void *touch_span(void *arg) {
    const Span *t = (const Span *)arg;
    for (size_t o = 0; o < t->n; o += 4096) ((volatile char *)t->a)[o] = 0;
    return NULL;
}

// The first touch of fresh pages (the kernel zeroing them) runs at ~7 GB/s on one thread, and
// cudaHostRegister would do it on one: touch [a, a + n) from several threads first, so that
// registering only pins (a 128K-token Llama store is 16 GiB: ~2.3 s on one thread).
static void touch_parallel(char *a, size_t n) {
    enum { MAX_THREADS = 8 };
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int k = cpus >= 2 * MAX_THREADS ? MAX_THREADS : cpus > 2 ? (int)(cpus / 2) : 1;
    if (n < ((size_t)256 << 20)) k = 1;
    pthread_t th[MAX_THREADS];
    Span part[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    size_t per = (n / k + 4095) & ~(size_t)4095;
    for (int i = 0; i < k; i++) {
        size_t off = (size_t)i * per;
        part[i].a = a + (off < n ? off : n);
        part[i].n = off < n ? (n - off < per ? n - off : per) : 0;
        if (i > 0) started[i] = pthread_create(&th[i], NULL, touch_span, &part[i]) == 0;
    }
    touch_span(&part[0]);
    for (int i = 1; i < k; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        else touch_span(&part[i]); // no thread: this one does it
    }
}

int host_store_grow(HostStore *h, long slots, char *err) {
    if (slots > h->cap_slots) slots = h->cap_slots;
    if (h->alias_slots && slots > h->alias_slots) slots = h->alias_slots;
    long cap = h->alias_slots ? h->alias_slots : h->cap_slots;
    if (h->registered_slots < slots) { // the chunks about to be registered, touched in parallel
        long from = h->registered_slots, to = (slots - from + h->chunk_slots - 1) / h->chunk_slots * h->chunk_slots + from;
        if (to > cap) to = cap;
        touch_parallel((char *)h->base + (size_t)from * h->slot_bytes, (size_t)(to - from) * h->slot_bytes);
    }
    while (h->registered_slots < slots) {
        long from = h->registered_slots, to = from + h->chunk_slots;
        if (to > cap) to = cap;
        // Registration pins the pages (touching them first). Chunks start on page boundaries
        // (chunk_slots is chosen so); the last one may end inside a page of the reservation.
        char *a = (char *)h->base + (size_t)from * h->slot_bytes;
        size_t n = (size_t)(to - from) * h->slot_bytes;
        cudaError_t e = cudaHostRegister(a, n, cudaHostRegisterMapped | cudaHostRegisterPortable);
        if (e != cudaSuccess) {
            snprintf(err, 256, "host memory: cannot pin %.2f GiB more for the KV store (%.2f GiB pinned so far): %s",
                     n / 1073741824.0, (double)from * h->slot_bytes / 1073741824.0, cudaGetErrorString(e));
            return -1;
        }
        h->registered_slots = to;
    }
    return 0;
}

size_t host_store_release(HostStore *h) {
    if (!h->base) return 0;
    size_t pinned = (size_t)h->registered_slots * h->slot_bytes;
    for (long from = 0; from < h->registered_slots; from += h->chunk_slots)
        cudaHostUnregister((char *)h->base + (size_t)from * h->slot_bytes);
    h->registered_slots = 0;
    madvise(h->base, h->reserved_bytes, MADV_DONTNEED); // private anonymous pages: freed, zeros if touched again
    return pinned;
}

void host_store_close(HostStore *h) {
    if (!h->base) return;
    for (long from = 0; from < h->registered_slots; from += h->chunk_slots)
        cudaHostUnregister((char *)h->base + (size_t)from * h->slot_bytes);
    munmap(h->base, h->reserved_bytes);
    memset(h, 0, sizeof *h);
}
