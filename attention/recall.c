// Recall@k of a selection (recall.h).
#include "recall.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "selector.h"

long recall_scratch_floats(int nz, int k) { return 2L * nz + 3L * k + 8; }

double recall_from_scores(const float *score, int nz, int k, const int *sel, int nsel, float *scratch) {
    if (nz <= 0) return 1.0;
    char *mark = (char *)(scratch + nz);          // nz bytes (room for nz floats)
    int *top = (int *)(scratch + 2L * nz);        // k ints
    ScoredId *heap = (ScoredId *)(top + k + 2);   // k pairs
    int ntop = topk_select(score, NULL, nz, k, heap, top);
    memset(mark, 0, (size_t)nz);
    for (int i = 0; i < ntop; i++) mark[top[i]] = 1;
    int hit = 0;
    for (int i = 0; i < nsel; i++) hit += sel[i] >= 0 && sel[i] < nz && mark[sel[i]];
    return ntop ? (double)hit / ntop : 1.0;
}

double recall_at_k(const float *qbar, const float *keys, long stride, int nz, int D, int k, const int *sel, int nsel, float *scratch) {
#pragma omp parallel for schedule(static) if (nz > 4096)
    for (int i = 0; i < nz; i++) {
        const float *ki = keys + (long)i * stride;
        double d = 0;
        for (int j = 0; j < D; j++) d += (double)qbar[j] * ki[j];
        scratch[i] = (float)d;
    }
    return recall_from_scores(scratch, nz, k, sel, nsel, scratch);
}

double selection_overlap(const int *a, int na, const int *b, int nb) {
    int i = 0, j = 0, both = 0;
    while (i < na && j < nb) { // a merge: both lists ascending
        if (a[i] == b[j]) both++, i++, j++;
        else if (a[i] < b[j]) i++;
        else j++;
    }
    int n = na > nb ? na : nb;
    return n ? (double)both / n : 1.0;
}

static FILE *recall_f; // the process's one measurement file
static pthread_once_t recall_once = PTHREAD_ONCE_INIT;

static void recall_open(void) {
    const char *p = getenv("PKV_RECALL");
    if (p && *p && !(recall_f = fopen(p, "a"))) fprintf(stderr, "warning: PKV_RECALL: cannot open '%s'\n", p);
}

// Opened once, whichever thread asks first (--gpus: each GPU's thread writes its KV heads' lines).
FILE *recall_file(void) {
    pthread_once(&recall_once, recall_open);
    return recall_f;
}
