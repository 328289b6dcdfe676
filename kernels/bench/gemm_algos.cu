// The prefill's GEMM shapes under each algorithm cuBLASLt's heuristic offers, beside
// cublasGemmEx's default (what kernels/layer.cu calls): TFLOP/s, median of N after warm-up.
// Built by kernels/prepare_device.sh into .dev/gemm_algos (no GPU needed to build).
// Run: .dev/gemm_algos [T] [qwen3-8b | llama3.1-8b] (results: tests/bench/GPU.md, session 23)
#include "../cuda_common.h" // CU_CHECK

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define BK(x)                                                                                                                              \
    do {                                                                                                                                   \
        cublasStatus_t s_ = (x);                                                                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                                                 \
            fprintf(stderr, "%s:%d cublas status %d\n", __FILE__, __LINE__, (int)s_);                                                      \
            exit(1);                                                                                                                       \
        }                                                                                                                                  \
    } while (0)

struct Shape {
    const char *name;
    int n, d, acc, bf16_out; // y (T, d) [+]= x (T, n) W^T
};

static __global__ void fill(__nv_bfloat16 *p, size_t n, unsigned seed) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = __float2bfloat16((float)((i * 2654435761u + seed) % 2001) / 1000.0f - 1.0f);
}

template <class F> static float time_ms(F f, int reps) {
    cudaEvent_t a, b;
    CU_CHECK(cudaEventCreate(&a));
    CU_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) f();
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        CU_CHECK(cudaEventRecord(a));
        f();
        CU_CHECK(cudaEventRecord(b));
        CU_CHECK(cudaEventSynchronize(b));
        float ms;
        CU_CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    CU_CHECK(cudaEventDestroy(a));
    CU_CHECK(cudaEventDestroy(b));
    return t[t.size() / 2];
}

int main(int argc, char **argv) {
    char *end = NULL;
    const long Tl = argc > 1 ? strtol(argv[1], &end, 10) : 4096;
    if ((argc > 1 && (end == argv[1] || *end)) || Tl < 1 || Tl > 65536 ||
        (argc > 2 && strcmp(argv[2], "qwen3-8b") && strcmp(argv[2], "llama3.1-8b")) || argc > 3) {
        fprintf(stderr, "usage: %s [T: 1..65536, default 4096] [qwen3-8b | llama3.1-8b]\n", argv[0]);
        return 2;
    }
    const int T = (int)Tl;
    const bool llama = argc > 2 && !strcmp(argv[2], "llama3.1-8b");
    const int dim = 4096, q = 4096, kv = 1024, hidden = llama ? 14336 : 12288;
    const Shape shapes[] = {{"QKV", dim, q + 2 * kv, 0, 0}, {"W_o +", q, dim, 1, 0}, {"gate/up fp32", dim, 2 * hidden, 0, 0},
                            {"gate/up bf16", dim, 2 * hidden, 0, 1}, {"down +", hidden, dim, 1, 0}};
    size_t maxw = (size_t)2 * hidden * dim, maxx = (size_t)T * hidden, maxy = (size_t)T * 2 * hidden;
    __nv_bfloat16 *W, *x;
    float *y;
    void *ws;
    const size_t ws_bytes = 64 << 20;
    CU_CHECK(cudaMalloc(&W, maxw * 2));
    CU_CHECK(cudaMalloc(&x, maxx * 2));
    CU_CHECK(cudaMalloc(&y, maxy * 4));
    CU_CHECK(cudaMalloc(&ws, ws_bytes));
    fill<<<(unsigned)((maxw + 255) / 256), 256>>>(W, maxw, 1);
    fill<<<(unsigned)((maxx + 255) / 256), 256>>>(x, maxx, 2);
    CU_CHECK(cudaMemset(y, 0, maxy * 4));
    cublasHandle_t h;
    cublasLtHandle_t lt;
    BK(cublasCreate(&h));
    BK(cublasLtCreate(&lt));
    cudaDeviceProp prop;
    CU_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, T %d, %s shapes; TFLOP/s, median of 20\n", prop.name, T, llama ? "Llama-3.1-8B" : "Qwen3-8B");
    for (const Shape &s : shapes) {
        const double flop = 2.0 * T * s.n * s.d;
        const float alpha = 1.0f, beta = s.acc ? 1.0f : 0.0f;
        const cudaDataType yt = s.bf16_out ? CUDA_R_16BF : CUDA_R_32F;
        float ms = time_ms(
            [&] {
                BK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.d, T, s.n, &alpha, W, CUDA_R_16BF, s.n, x, CUDA_R_16BF, s.n, &beta, y, yt, s.d,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            },
            20);
        printf("%-13s n %5d d %5d  cublasGemmEx default      %7.1f\n", s.name, s.n, s.d, flop / ms / 1e9);
        cublasLtMatmulDesc_t op;
        BK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        BK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        BK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        cublasLtMatrixLayout_t la, lb, lc;
        BK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.n, s.d, s.n));
        BK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.n, T, s.n));
        BK(cublasLtMatrixLayoutCreate(&lc, yt, s.d, T, s.d));
        cublasLtMatmulPreference_t pref;
        BK(cublasLtMatmulPreferenceCreate(&pref));
        BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
        cublasLtMatmulHeuristicResult_t res[16];
        int nres = 0;
        BK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 16, res, &nres));
        for (int i = 0; i < nres; i++) {
            int tile = -1, stages = -1, splitk = -1, cluster = -1;
            size_t sz;
            cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &sz);
            cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &sz);
            cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &sz);
            cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &sz);
            float m = time_ms(
                [&] {
                    BK(cublasLtMatmul(lt, op, &alpha, W, la, x, lb, &beta, y, lc, y, lc, &res[i].algo, ws, ws_bytes, 0));
                },
                20);
            printf("%-13s n %5d d %5d  lt heuristic %2d (tile %3d stages %3d splitk %2d cluster %3d ws %6zu KB) %7.1f\n", s.name, s.n, s.d, i,
                   tile, stages, splitk, cluster, res[i].workspaceSize >> 10, flop / m / 1e9);
        }
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(op);
        fflush(stdout);
    }
    return 0;
}
