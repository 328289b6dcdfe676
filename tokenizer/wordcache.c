// Per-call cache of pre-token -> ids. Natural text repeats its words, and merging a word costs
// many random probes into the large merge table, so each distinct word is merged once per
// encode call (Hugging Face's BPE keeps a similar cache). Lives in the caller's Encoder: no state
// is shared between calls or threads.
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

#define MAX_WORD 64          // longer pre-tokens are rare and not worth keeping
#define MAX_SLOTS (1u << 17) // stops growing here; later new words are merged uncached

void wordcache_free(WordCache *c) {
    free(c->slot);
    free(c->bytes);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

static WordSlot *find(const WordCache *c, uint64_t h, const uint8_t *w, size_t n) {
    for (size_t i = h & c->mask;; i = (i + 1) & c->mask) {
        WordSlot *s = &c->slot[i];
        if (s->hash == 0 || (s->hash == h && s->len == n && memcmp(c->bytes + s->off, w, n) == 0)) return s;
    }
}

static int rehash(WordCache *c, size_t cap) {
    WordSlot *old = c->slot;
    size_t old_cap = old ? c->mask + 1 : 0;
    if (!(c->slot = calloc(cap, sizeof *c->slot))) {
        c->slot = old;
        return -1;
    }
    c->mask = cap - 1;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].hash) {
            size_t j = old[i].hash & c->mask;
            while (c->slot[j].hash) j = (j + 1) & c->mask;
            c->slot[j] = old[i];
        }
    free(old);
    return 0;
}

int bpe_word_cached(const struct Tokenizer *t, const uint8_t *w, size_t n, BpeScratch *bs, WordCache *c,
                    IntBuf *out) {
    if (n > MAX_WORD) return bpe_word(t, w, n, bs, out);
    uint64_t h = tok_hash_bytes(w, n) | 1; // never 0, which marks an empty slot
    if (c->slot) {
        WordSlot *s = find(c, h, w, n);
        if (s->hash) {
            for (uint32_t k = 0; k < s->n_ids; k++)
                if (intbuf_push(out, c->ids[s->ids + k]) < 0) return -1;
            return 0;
        }
    }
    size_t before = out->n;
    if (bpe_word(t, w, n, bs, out) < 0) return -1;
    // Remember the word if there is room; a failed allocation only means no caching.
    if (2 * (c->n + 1) > (c->slot ? c->mask + 1 : 0)) {
        size_t cap = c->slot ? 2 * (c->mask + 1) : 1024;
        if (cap > MAX_SLOTS || rehash(c, cap) < 0) return 0;
    }
    size_t n_ids = out->n - before;
    if (tok_grow((void **)&c->bytes, &c->bytes_cap, c->n_bytes + n, 1) < 0 ||
        tok_grow((void **)&c->ids, &c->ids_cap, c->n_ids + n_ids, sizeof *c->ids) < 0)
        return 0;
    WordSlot *s = find(c, h, w, n);
    *s = (WordSlot){.hash = h, .off = (uint32_t)c->n_bytes, .len = (uint32_t)n, .ids = (uint32_t)c->n_ids,
                    .n_ids = (uint32_t)n_ids};
    memcpy(c->bytes + c->n_bytes, w, n);
    if (n_ids) // a word of bytes the vocabulary lacks has no ids, and c->ids may still be NULL
        memcpy(c->ids + c->n_ids, out->v + before, n_ids * sizeof *c->ids);
    c->n_bytes += n;
    c->n_ids += n_ids;
    c->n++;
    return 0;
}
