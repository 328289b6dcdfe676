// How fast the GPU gathers scattered zone rows from pinned host memory, by where one layer's rows
// of one KV head lie in the store (timing only; built by kernels/prepare_device.sh).
//
// The ParisKV attention reads a step's top-k rows of one layer (8 KV heads x k rows of 512 bytes,
// K then V) from the host store through UVA. The fetch is bound by address translation, not by
// PCIe bytes (tests/bench/GPU.md, session 5: 44 GB/s from a 164 MB store, 19.5 from 16 GiB). So
// what matters is how many distinct pages a layer's rows fall on. Three layouts of the same store
// (slots x layers x KV heads rows), the same random slots each call:
//   slot-major   (slot, layer, head): the store as kernels/pariskv_attend.cu reads it today; a
//                slot's rows of every layer together, so a layer's rows are spread over the
//                whole store
//   slot blocks  (slot / B, layer, head, slot % B): B slots of one (layer, head) contiguous
//                (B x 512 bytes = 2 MiB at B = 4096), blocks appended as the context grows
//   layer-major  (layer, head, slot): each (layer, head) one contiguous region
// Each call takes the next layer (as a decode step does) and fresh random slots below n.
// Usage: host_gather [GiB of store, default 32]
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <vector>

#define CK(x)                                                                                        \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

#define ROW 512 // bytes of one row: K and V of head_dim 128 in bf16
#define U 8     // rows a warp has in flight

struct Shape {
    long cap;   // slots the store holds
    int L, H;   // layers, KV heads
    long block; // slots of a block (slot-blocks layout)
};

// Byte offset of (slot, layer, head)'s row under layout m.
__host__ __device__ inline size_t row_off(const Shape &s, int m, long slot, int l, int h) {
    if (m == 0) return (((size_t)slot * s.L + l) * s.H + h) * ROW;
    if (m == 1) return ((((size_t)(slot / s.block) * s.L + l) * s.H + h) * s.block + slot % s.block) * ROW;
    return (((size_t)l * s.H + h) * s.cap + slot) * ROW;
}

// Warp w gathers rows w*U .. w*U+U-1 of the call (rows: H x k slots), all loads in flight first.
__global__ void gather(const char *store, Shape s, int m, int l, const int *slots, int k, unsigned long long *sum) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31, rows = s.H * k;
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        int r = warp * U + u;
        v[u] = make_uint4(0, 0, 0, 0);
        if (r < rows) v[u] = ((const uint4 *)(store + row_off(s, m, slots[r], l, r / k)))[lane];
    }
    unsigned long long x = 0;
#pragma unroll
    for (int u = 0; u < U; u++) x += v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    if (lane == 0) atomicAdd(sum, x);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    double gib = argc > 1 ? atof(argv[1]) : 32.0;
    Shape s;
    s.L = 32, s.H = 8, s.block = 4096;
    s.cap = (long)(gib * 1073741824.0 / ((double)s.L * s.H * ROW)) / s.block * s.block;
    size_t bytes = (size_t)s.cap * s.L * s.H * ROW;
    double t0 = now();
    // As the runner's host store: anonymous, transparent huge pages, registered.
    char *store = (char *)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (store == MAP_FAILED) {
        fprintf(stderr, "mmap of %.1f GiB failed\n", bytes / 1073741824.0);
        return 1;
    }
    madvise(store, bytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < bytes; i += 4096) store[i] = (char)(i >> 12);
    CK(cudaHostRegister(store, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    char *dstore;
    CK(cudaHostGetDevicePointer((void **)&dstore, store, 0));
    printf("store: %ld slots x %d layers x %d KV heads x %d bytes = %.1f GiB, set up in %.1f s\n", s.cap, s.L, s.H, ROW,
           bytes / 1073741824.0, now() - t0);
    const int ks[2] = {100, 2048};
    const long ns[3] = {131072, 524288, s.cap};
    const char *names[3] = {"slot-major", "slot blocks of 4096", "layer-major"};
    int *dslots;
    unsigned long long *dsum;
    CK(cudaMalloc(&dslots, (size_t)s.H * 2048 * 4));
    CK(cudaMalloc(&dsum, 8));
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    unsigned long long rng = 0x9E3779B97F4A7C15ull;
    printf("\n%-20s | %9s | %5s | %10s | %8s\n", "layout", "context", "k", "us a layer", "GB/s");
    for (long n : ns) {
        if (n > s.cap) continue;
        for (int k : ks)
            for (int m = 0; m < 3; m++) {
                std::vector<float> t;
                std::vector<int> slots((size_t)s.H * k);
                for (int call = 0; call < 74; call++) {
                    for (auto &x : slots) { // fresh random slots each call, as each step
                        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                        x = (int)(rng % (unsigned long long)n);
                    }
                    CK(cudaMemcpy(dslots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
                    int rows = s.H * k, warps = (rows + U - 1) / U;
                    cudaEventRecord(a);
                    gather<<<(warps * 32 + 127) / 128, 128>>>(dstore, s, m, call % s.L, dslots, k, dsum);
                    cudaEventRecord(b);
                    CK(cudaEventSynchronize(b));
                    float ms;
                    cudaEventElapsedTime(&ms, a, b);
                    if (call >= 10) t.push_back(ms);
                }
                std::sort(t.begin(), t.end());
                double us = t[t.size() / 2] * 1e3;
                printf("%-20s | %9ld | %5d | %10.1f | %8.1f\n", names[m], n, k, us, (double)s.H * k * ROW / (us * 1e-6) / 1e9);
            }
    }
    CK(cudaHostUnregister(store));
    munmap(store, bytes);
    return 0;
}
