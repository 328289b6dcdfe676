// Byte-pair merging of one pre-token, as Hugging Face's BPE::merge_word: start from single bytes,
// repeatedly apply the lowest-ranked merge (leftmost first on ties) taken from a min-heap of
// candidate pairs; entries made stale by earlier merges are skipped when popped. O(n log n).
#include <stdlib.h>

#include "tok_internal.h"

struct BpeMerge {
    int32_t rank;
    int32_t pos;    // index of the left symbol
    int32_t result; // id the pair merges into (checked against the current pair when popped)
};

void bpe_scratch_free(BpeScratch *s) {
    free(s->sym);
    free(s->prev);
    free(s->next);
    free(s->heap);
    *s = (BpeScratch){0};
}

static int reserve(BpeScratch *s, size_t n) {
    if (n <= s->sym_cap) return 0;
    size_t cap = s->sym_cap ? s->sym_cap : 64;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(s->sym, cap * sizeof *a);
    if (a) s->sym = a;
    int32_t *b = realloc(s->prev, cap * sizeof *b);
    if (b) s->prev = b;
    int32_t *c = realloc(s->next, cap * sizeof *c);
    if (c) s->next = c;
    // Each merge pushes at most two pairs: n - 1 initial pairs + 2 (n - 1) later ones.
    struct BpeMerge *h = realloc(s->heap, 3 * cap * sizeof *h);
    if (h) s->heap = h;
    if (!a || !b || !c || !h) return -1;
    s->sym_cap = cap;
    return 0;
}

static int before(const struct BpeMerge *a, const struct BpeMerge *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct BpeMerge *h, size_t *n, struct BpeMerge m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static struct BpeMerge heap_pop(struct BpeMerge *h, size_t *n) {
    struct BpeMerge top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && before(&h[c + 1], &h[c])) c++;
        if (!before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void push_pair(const struct Tokenizer *t, BpeScratch *s, size_t *nh, int32_t pos) {
    int32_t nx = s->next[pos], rank, result;
    if (nx >= 0 && pairmap_get(&t->merges, s->sym[pos], s->sym[nx], &rank, &result))
        heap_push(s->heap, nh, (struct BpeMerge){.rank = rank, .pos = pos, .result = result});
}

int bpe_word(const struct Tokenizer *t, const uint8_t *w, size_t n, BpeScratch *s, IntBuf *out) {
    if (t->ignore_merges) { // a pre-token that is a whole model token is emitted as is
        int32_t id = strmap_get(&t->vocab, w, n);
        if (id >= 0 && (t->type[id] == TOK_TYPE_NORMAL || t->type[id] == TOK_TYPE_BYTE))
            return intbuf_push(out, id);
    }
    if (reserve(s, n) < 0) return -1;
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id < 0) continue; // HF drops a character missing from the vocabulary (no unk token)
        s->sym[m] = id;
        s->prev[m] = m - 1;
        s->next[m] = m + 1;
        m++;
    }
    if (m == 0) return 0;
    s->next[m - 1] = -1;
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < m; i++) push_pair(t, s, &nh, i);
    while (nh > 0) {
        struct BpeMerge top = heap_pop(s->heap, &nh);
        int32_t pos = top.pos, nx = s->next[pos], rank, result;
        if (s->sym[pos] < 0 || nx < 0) continue; // left symbol was merged away, or is now last
        if (!pairmap_get(&t->merges, s->sym[pos], s->sym[nx], &rank, &result) || result != top.result)
            continue; // the pair changed since this entry was pushed
        s->sym[pos] = result;
        s->sym[nx] = -1;
        s->next[pos] = s->next[nx];
        if (s->next[nx] >= 0) s->prev[s->next[nx]] = pos;
        if (s->prev[pos] >= 0) push_pair(t, s, &nh, s->prev[pos]);
        push_pair(t, s, &nh, pos);
    }
    for (int32_t i = 0; i >= 0; i = s->next[i])
        if (intbuf_push(out, s->sym[i]) < 0) return -1;
    return 0;
}
