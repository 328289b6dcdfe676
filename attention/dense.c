// Dense causal attention on the CPU: the exact reference.
#include "attention.h"

#include <math.h>
#include <omp.h>
#include <string.h>

void attention_dense(float *out, const float *q, const float *k_cache, const float *v_cache, int pos0, int T,
                     int n_heads, int n_kv_heads, int head_dim, float *scratch) {
    int kv_dim = n_kv_heads * head_dim, group = n_heads / n_kv_heads, n_keys = pos0 + T;
    float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel
    {
        float *score = scratch + (size_t)omp_get_thread_num() * n_keys;
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < n_heads; h++) {
                const float *qh = q + ((size_t)t * n_heads + h) * head_dim;
                const float *kb = k_cache + (size_t)(h / group) * head_dim;
                const float *vb = v_cache + (size_t)(h / group) * head_dim;
                int n = pos0 + t + 1;
                float mx = -INFINITY;
                for (int p = 0; p < n; p++) {
                    const float *kp = kb + (size_t)p * kv_dim;
                    float s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int j = 0; j < head_dim; j++) s += qh[j] * kp[j];
                    score[p] = s * scale;
                    if (score[p] > mx) mx = score[p];
                }
                float sum = 0.0f;
                for (int p = 0; p < n; p++) {
                    score[p] = expf(score[p] - mx);
                    sum += score[p];
                }
                float *o = out + ((size_t)t * n_heads + h) * head_dim;
                memset(o, 0, (size_t)head_dim * sizeof(float));
                for (int p = 0; p < n; p++) {
                    const float *vp = vb + (size_t)p * kv_dim;
                    float wgt = score[p] / sum;
#pragma omp simd
                    for (int j = 0; j < head_dim; j++) o[j] += wgt * vp[j];
                }
            }
        }
    }
}
