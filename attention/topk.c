// Helpers the selectors share: a deterministic top-k and checked allocation.
#include "attention.h"
#include "selector.h"

#include <stdio.h>
#include <stdlib.h>

// a ranks below b: lower score, or the same score and the larger id (ties go to the smaller id,
// so the choice never depends on the order items arrive in).
static int worse(ScoredId a, ScoredId b) { return a.score < b.score || (a.score == b.score && a.id > b.id); }

static void sift_down(ScoredId *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(h[l], h[m])) m = l;
        if (r < n && worse(h[r], h[m])) m = r;
        if (m == i) return;
        ScoredId t = h[i];
        h[i] = h[m], h[m] = t;
        i = m;
    }
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int topk_select(const float *score, const int *id, int n, int k, ScoredId *heap, int *out) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    // A min-heap of the k best so far: its root is the weakest kept item.
    for (int i = 0; i < k; i++) heap[i] = (ScoredId){score[i], id ? id[i] : i};
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(heap, k, i);
    for (int i = k; i < n; i++) {
        ScoredId c = {score[i], id ? id[i] : i};
        if (worse(heap[0], c)) {
            heap[0] = c;
            sift_down(heap, k, 0);
        }
    }
    for (int i = 0; i < k; i++) out[i] = heap[i].id;
    qsort(out, (size_t)k, sizeof(int), cmp_int);
    return k;
}

int select_all(int n, int *out) {
    for (int i = 0; i < n; i++) out[i] = i;
    return n;
}

void *attn_calloc(size_t n, size_t size, const char *what, char *err) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) snprintf(err, ATTN_ERR_LEN, "out of memory allocating %.1f MiB for %s", (double)n * (double)size / (1 << 20), what);
    return p;
}
