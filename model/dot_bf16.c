// The portable decode product on bf16 weights and the choice of kernels by instruction set
// (dot_bf16.h).
#include "dot_bf16.h"
#include "bf16.h"

#include <string.h>

static void prep_generic(const float *x, int n, void *xp) { memcpy(xp, x, (size_t)n * sizeof(float)); }

static void rows_generic(const uint16_t *w, const void *xp, int n, int rows, float *y) {
    const float *x = xp;
    for (int r = 0; r < rows; r++, w += n) {
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < n; j++) s += bf16_to_f32(w[j]) * x[j];
        y[r] = s;
    }
}

const DotBf16 dot_bf16_generic = {CPU_ISA_GENERIC, prep_generic, rows_generic};

const DotBf16 *dot_bf16_for(CpuIsa isa) {
    switch (isa) {
    case CPU_ISA_GENERIC: return &dot_bf16_generic;
    case CPU_ISA_AVX2: return dot_bf16_avx2();
    case CPU_ISA_AVX512: return dot_bf16_avx512();
    case CPU_ISA_AVX512BF16: return dot_bf16_avx512bf16();
    default: return NULL;
    }
}
