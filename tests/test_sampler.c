// The sampler: each filter against its definition, on logits whose probabilities are known.
#include "../model/sampler.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int passed, failed;

static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ok ? passed++ : failed++;
}

// Probabilities p[i] ∝ 2^-i for 8 tokens, as logits, shuffled so order is not index order.
static const int order[8] = {5, 2, 7, 0, 3, 6, 1, 4}; // order[r] = id of rank r
static void logits_for(float *l) {
    for (int r = 0; r < 8; r++) l[order[r]] = -(float)r * logf(2.0f);
}

// Frequencies of n draws.
static void draw(Sampler *s, int n, double *freq) {
    float l[8];
    memset(freq, 0, 8 * sizeof(double));
    for (int i = 0; i < n; i++) {
        logits_for(l);
        freq[sampler_sample(s, l)] += 1.0 / n;
    }
}

int main(void) {
    Sampler s;
    double f[8];
    const int N = 200000;
    float l[8];

    sampler_init(&s, 8, 0.0f, 0, 1.0f, 0.0f, 1);
    logits_for(l);
    check(sampler_sample(&s, l) == order[0], "temperature 0 is argmax");
    sampler_free(&s);

    // temperature 1, no filters: frequencies match the softmax (2^-r normalized)
    sampler_init(&s, 8, 1.0f, 0, 1.0f, 0.0f, 42);
    draw(&s, N, f);
    double z = 0, worst = 0;
    for (int r = 0; r < 8; r++) z += pow(2, -r);
    for (int r = 0; r < 8; r++) worst = fmax(worst, fabs(f[order[r]] - pow(2, -r) / z));
    check(worst < 0.005, "temperature 1 samples the softmax (max frequency error < 0.005)");
    sampler_free(&s);

    // temperature 2 flattens: p ∝ 2^-(r/2)
    sampler_init(&s, 8, 2.0f, 0, 1.0f, 0.0f, 7);
    draw(&s, N, f);
    z = 0, worst = 0;
    for (int r = 0; r < 8; r++) z += pow(2, -r / 2.0);
    for (int r = 0; r < 8; r++) worst = fmax(worst, fabs(f[order[r]] - pow(2, -r / 2.0) / z));
    check(worst < 0.005, "temperature 2 samples softmax(logits / 2)");
    sampler_free(&s);

    // top-k 2: only the two best, renormalized 2/3, 1/3
    sampler_init(&s, 8, 1.0f, 2, 1.0f, 0.0f, 9);
    draw(&s, N, f);
    check(fabs(f[order[0]] - 2.0 / 3) < 0.005 && fabs(f[order[1]] - 1.0 / 3) < 0.005 && f[order[2]] == 0,
          "top-k 2 keeps exactly the two best, renormalized");
    sampler_free(&s);

    // top-p 0.7: cumulative 0.502, 0.753 -> the nucleus is the first two tokens
    sampler_init(&s, 8, 1.0f, 0, 0.7f, 0.0f, 11);
    draw(&s, N, f);
    check(f[order[2]] == 0 && f[order[0]] > 0.6 && f[order[1]] > 0.3, "top-p 0.7 keeps the smallest set reaching 0.7");
    sampler_free(&s);

    // min-p 0.2: keep p >= 0.2 * p_max: ranks 0..2 (2^-2 = 0.25 >= 0.2, 2^-3 < 0.2)
    sampler_init(&s, 8, 1.0f, 0, 1.0f, 0.2f, 13);
    draw(&s, N, f);
    check(f[order[3]] == 0 && f[order[2]] > 0.1, "min-p 0.2 drops tokens below 0.2 x the best");
    sampler_free(&s);

    // the same seed gives the same sequence; padding ids (>= n_valid) are never chosen
    Sampler a, b;
    sampler_init(&a, 6, 1.0f, 0, 1.0f, 0.0f, 99);
    sampler_init(&b, 6, 1.0f, 0, 1.0f, 0.0f, 99);
    int same = 1, in_range = 1;
    for (int i = 0; i < 1000; i++) {
        float la[8], lb[8];
        logits_for(la), logits_for(lb);
        int x = sampler_sample(&a, la), y = sampler_sample(&b, lb);
        same &= x == y;
        in_range &= x < 6;
    }
    check(same, "a seed reproduces its sequence");
    check(in_range, "ids past n_valid (vocabulary padding) are never sampled");
    sampler_free(&a), sampler_free(&b);

    // Penalties against their definitions, written out here: a seen token's logit l becomes
    // l / r (l > 0) or l * r (l <= 0), then minus presence and frequency x its count in the window.
    {
        float base[8] = {2.0f, -1.0f, 0.5f, 0.0f, 3.0f, -2.5f, 1.5f, -0.25f}, got[8], want[8];
        int hist[] = {4, 1, 4, 6, 9, 1, 4, 0}; // 9: past the valid ids, ignored
        int n_hist = 8;
        float r = 1.3f, pres = 0.4f, freq = 0.25f;
        for (int last_n = -1; last_n <= 8; last_n += 3) { // -1 (all), 2, 5, 8
            int from = last_n < 0 ? 0 : n_hist - last_n, cnt[8] = {0};
            for (int i = from; i < n_hist; i++)
                if (hist[i] < 8) cnt[hist[i]]++;
            for (int i = 0; i < 8; i++) {
                float v = base[i];
                if (cnt[i]) v = (v > 0 ? v / r : v * r) - pres - freq * (float)cnt[i];
                want[i] = v;
            }
            sampler_init(&s, 8, 0.0f, 0, 1.0f, 0.0f, 1);
            int ok = sampler_set_penalties(&s, r, pres, freq, last_n) == 0;
            memcpy(got, base, sizeof got);
            sampler_penalize(&s, got, hist, n_hist);
            // the same operations in the same order: equal bit for bit
            ok &= memcmp(got, want, sizeof got) == 0;
            // the scratch counts are left zero: a second call is the same
            memcpy(got, base, sizeof got);
            sampler_penalize(&s, got, hist, n_hist);
            ok &= memcmp(got, want, sizeof got) == 0;
            char what[128];
            snprintf(what, sizeof what, "repeat 1.3, presence 0.4, frequency 0.25 over the last %d tokens equal their definitions", last_n);
            check(ok, what);
            sampler_free(&s);
        }
        sampler_init(&s, 8, 0.0f, 0, 1.0f, 0.0f, 1);
        sampler_set_penalties(&s, 1.0f, 0.0f, 0.0f, 64);
        memcpy(got, base, sizeof got);
        sampler_penalize(&s, got, hist, n_hist);
        check(memcmp(got, base, sizeof got) == 0, "no penalty: logits untouched");
        // greedy with a strong repeat penalty avoids the repeated argmax (token 4)
        sampler_set_penalties(&s, 10.0f, 0.0f, 0.0f, -1);
        memcpy(got, base, sizeof got);
        sampler_penalize(&s, got, hist, n_hist);
        check(sampler_sample(&s, got) == 2, "greedy after a repeat penalty of 10 picks the best unseen token");
        sampler_free(&s);
    }

    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
