// Dense causal attention on the CPU: the exact reference.
#include "attention.h"
#include "softmax_exp.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#define SUB 8 // query heads of a group handled together (their scores live side by side in scratch)

// One query t, the heads [h0, h0 + g) of one KV group: each K and V row of the group is read once
// for all of them. Per head the operations and their order are those of attending alone (dot
// product, scale, max, exp, sum, weighted sum of V rows in position order), so results do not
// depend on the grouping, and policy.c's attend_rows reproduces them bit for bit.
static void attend_group(float *out, const float *q, const float *kb, const float *vb, int n, int kv_dim, int head_dim, int g,
                         float scale, float *score, int stride) {
    float mx[SUB], sum[SUB];
    for (int i = 0; i < g; i++) mx[i] = -INFINITY, sum[i] = 0.0f;
    for (int p = 0; p < n; p++) {
        const float *kp = kb + (size_t)p * kv_dim;
        for (int i = 0; i < g; i++) {
            const float *qh = q + (size_t)i * head_dim;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int j = 0; j < head_dim; j++) s += qh[j] * kp[j];
            float sc = s * scale;
            score[(size_t)i * stride + p] = sc;
            if (sc > mx[i]) mx[i] = sc;
        }
    }
    for (int i = 0; i < g; i++) {
        float *si = score + (size_t)i * stride;
        float m = mx[i], sm = 0.0f;
#pragma omp simd reduction(+ : sm)
        for (int p = 0; p < n; p++) {
            si[p] = softmax_exp(si[p] - m);
            sm += si[p];
        }
        sum[i] = sm;
        memset(out + (size_t)i * head_dim, 0, (size_t)head_dim * sizeof(float));
    }
    for (int p = 0; p < n; p++) {
        const float *vp = vb + (size_t)p * kv_dim;
        for (int i = 0; i < g; i++) {
            float *o = out + (size_t)i * head_dim, wgt = score[(size_t)i * stride + p] / sum[i];
#pragma omp simd
            for (int j = 0; j < head_dim; j++) o[j] += wgt * vp[j];
        }
    }
}

size_t attention_dense_scratch(int n_heads, int n_kv_heads, int n_keys) {
    int group = n_heads / n_kv_heads;
    return (size_t)(group < SUB ? group : SUB) * (size_t)n_keys;
}

void attention_dense(float *out, const float *q, const float *k_cache, const float *v_cache, int pos0, int T,
                     int n_heads, int n_kv_heads, int head_dim, float *scratch) {
    int kv_dim = n_kv_heads * head_dim, group = n_heads / n_kv_heads, n_keys = pos0 + T;
    int subs = (group + SUB - 1) / SUB; // tasks per KV group: SUB heads each
    float scale = 1.0f / sqrtf((float)head_dim);
    size_t per_thread = attention_dense_scratch(n_heads, n_kv_heads, n_keys);
#pragma omp parallel
    {
        float *score = scratch + (size_t)omp_get_thread_num() * per_thread;
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int t = 0; t < T; t++) {
            for (int task = 0; task < n_kv_heads * subs; task++) {
                int kvh = task / subs, h0 = kvh * group + (task % subs) * SUB;
                int g = kvh * group + group - h0 < SUB ? kvh * group + group - h0 : SUB;
                size_t row = (size_t)t * n_heads + h0;
                attend_group(out + row * head_dim, q + row * head_dim, k_cache + (size_t)kvh * head_dim,
                             v_cache + (size_t)kvh * head_dim, pos0 + t + 1, kv_dim, head_dim, g, scale, score, n_keys);
            }
        }
    }
}
