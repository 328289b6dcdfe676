// The host store: the retrieval zone's full-precision K/V rows in pinned host memory, read by
// the GPU through unified virtual addressing (a top-k fetch reads a few rows per step).
//
// Layout, slot-major so that the store grows by appending: slot i (position sink + i) holds,
// for every layer l and KV head h, one row -- the key, then the value -- at byte offset
// ((i * n_layers + l) * n_kv + h) * row_bytes. bf16 rows: 2 * head_dim bf16 (512 bytes at
// head_dim 128); fp8 rows (--kv-store-dtype fp8, offload/fp8.h): head_dim e4m3 codes of the key,
// head_dim of the value, then the key's and the value's fp32 scales (264 bytes). One fetch is
// one contiguous piece.
//
// The memory is one anonymous private mapping reserved for the whole context (MAP_NORESERVE:
// nothing is touched until used) with MADV_HUGEPAGE (first touch 6.9 GB/s instead of 1.5, and
// registration 6x faster: ../shared/h100-notes.md), registered with cudaHostRegister chunk by
// chunk as the context grows, so a short session never pins what a long one would need.
#ifndef HOST_STORE_H
#define HOST_STORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HOST_STORE_CHUNK_BYTES ((size_t)1 << 30) // registered 1 GiB at a time (~0.02 s each)

typedef struct {
    void *base;            // the rows; the GPU reads them at the same address (UVA)
    int n_layers, n_kv, head_dim, fp8;
    size_t row_bytes;      // bf16: 4 head_dim; fp8: 2 head_dim + 8
    size_t slot_bytes;     // n_layers * n_kv * row_bytes
    long cap_slots;        // slots reserved
    long chunk_slots;      // slots per registration
    long registered_slots; // slots [0, registered_slots) are pinned and mapped
    size_t reserved_bytes;
    long alias_slots;      // > 0: slot i lives at slot i % alias_slots (benchmarks beyond the host's memory:
                           // PKV_HOST_ALIAS_GIB), else 0
} HostStore;

// Bytes of one row (key and value of one position, layer and KV head), and of host memory a store
// of `slots` slots pins when full.
size_t host_store_row_bytes(int head_dim, int fp8);
size_t host_store_bytes(int n_layers, int n_kv, int head_dim, int fp8, long slots);
// Available host memory (MemAvailable), bytes; 0 when unknown.
size_t host_memory_available(void);
// Reserves the mapping for cap_slots slots after checking that they fit the host memory
// available (the message gives both numbers). 0, or -1 with err (256 bytes) filled.
// For timing beyond the host's memory, PKV_HOST_ALIAS_GIB=N keeps only N GiB of slots and folds
// the rest onto them (slot i at i % alias_slots, in every kernel that touches the store): the
// index and the selection see the whole context, the fetched rows come from N GiB. Only the
// benchmark sets it.
int host_store_open(HostStore *h, int n_layers, int n_kv, int head_dim, int fp8, long cap_slots, char *err);
// Registers slots up to at least `slots` (whole chunks). 0, or -1 with err filled.
int host_store_grow(HostStore *h, long slots, char *err);
void host_store_close(HostStore *h);
// Gives the store's pages back (a chat's /reset): unpinned and returned to the system, the
// reservation kept, so the next sequence grows it again from nothing at the same address.
// Returns the bytes that were pinned.
size_t host_store_release(HostStore *h);

#ifdef __cplusplus
}
#endif

#endif
