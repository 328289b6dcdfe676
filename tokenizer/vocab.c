// Lookup tables built at load time: token bytes -> id, (left, right) -> merge, byte -> id,
// and the added-token trie; plus the small accessors of the public interface.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

int tok_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

int intbuf_push(IntBuf *b, int x) {
    if (b->n == b->cap && tok_grow((void **)&b->v, &b->cap, b->n + 1, sizeof *b->v) < 0) return -1;
    b->v[b->n++] = x;
    return 0;
}

uint64_t tok_hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; // FNV-1a, then a final mix for the low bits we index by
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

static size_t table_size(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2; // load factor <= 1/2 keeps probe chains short
    return cap;
}

int strmap_init(StrMap *m, size_t n) {
    size_t cap = table_size(n);
    m->key = calloc(cap, sizeof *m->key);
    m->len = calloc(cap, sizeof *m->len);
    m->id = malloc(cap * sizeof *m->id);
    m->mask = cap - 1;
    if (!m->key || !m->len || !m->id) {
        strmap_free(m);
        return -1;
    }
    for (size_t i = 0; i < cap; i++) m->id[i] = -1;
    return 0;
}

void strmap_free(StrMap *m) {
    free(m->key);
    free(m->len);
    free(m->id);
    memset(m, 0, sizeof *m);
}

int strmap_put(StrMap *m, const uint8_t *key, uint32_t len, int32_t id) {
    // Never fills past half: callers size the map for all their keys.
    for (size_t i = tok_hash_bytes(key, len) & m->mask;; i = (i + 1) & m->mask) {
        if (m->id[i] < 0) {
            m->key[i] = key;
            m->len[i] = len;
            m->id[i] = id;
            return 0;
        }
        if (m->len[i] == len && memcmp(m->key[i], key, len) == 0) return 0;
    }
}

int32_t strmap_get(const StrMap *m, const uint8_t *key, size_t len) {
    if (!m->id) return -1;
    for (size_t i = tok_hash_bytes(key, len) & m->mask;; i = (i + 1) & m->mask) {
        if (m->id[i] < 0) return -1;
        if (m->len[i] == len && memcmp(m->key[i], key, len) == 0) return m->id[i];
    }
}

static uint64_t pair_key(int32_t l, int32_t r) { return ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1; }

static size_t pair_slot(uint64_t k, size_t mask) {
    k *= 0x9e3779b97f4a7c15ull;
    return (size_t)(k >> 29) & mask;
}

int pairmap_get(const PairMap *m, int32_t l, int32_t r, int32_t *rank, int32_t *result) {
    if (!m->slot) return 0;
    uint64_t k = pair_key(l, r);
    for (size_t i = pair_slot(k, m->mask);; i = (i + 1) & m->mask) {
        const PairSlot *e = &m->slot[i];
        if (e->key == 0) return 0;
        if (e->key == k) {
            *rank = e->rank;
            *result = e->result;
            return 1;
        }
    }
}

static int build_merges(struct Tokenizer *t, const int32_t *pairs, char *err) {
    PairMap *m = &t->merges;
    size_t cap = table_size((size_t)t->n_merges);
    m->slot = calloc(cap, sizeof *m->slot);
    m->mask = cap - 1;
    if (!m->slot) {
        snprintf(err, TOK_ERR_LEN, "tokenizer: out of memory for %d merges", t->n_merges);
        return -1;
    }
    uint8_t *buf = malloc(2 * t->max_len + 1);
    if (!buf) {
        snprintf(err, TOK_ERR_LEN, "tokenizer: out of memory");
        return -1;
    }
    for (int r = 0; r < t->n_merges; r++) {
        size_t ll, rl;
        const uint8_t *lp = tok_bytes(t, pairs[2 * r], &ll), *rp = tok_bytes(t, pairs[2 * r + 1], &rl);
        memcpy(buf, lp, ll);
        memcpy(buf + ll, rp, rl);
        int32_t res = strmap_get(&t->vocab, buf, ll + rl);
        if (res < 0) {
            snprintf(err, TOK_ERR_LEN, "tokenizer: merge %d (%d, %d) makes a token not in the vocabulary",
                     r, pairs[2 * r], pairs[2 * r + 1]);
            free(buf);
            return -1;
        }
        uint64_t k = pair_key(pairs[2 * r], pairs[2 * r + 1]);
        size_t i = pair_slot(k, m->mask);
        while (m->slot[i].key != 0 && m->slot[i].key != k) i = (i + 1) & m->mask;
        // A pair listed twice keeps its last rank, as HF's merge map (a HashMap collect) does.
        m->slot[i] = (PairSlot){.key = k, .rank = r, .result = res};
    }
    free(buf);
    return 0;
}

static int is_model_type(int type) { return type == TOK_TYPE_NORMAL || type == TOK_TYPE_BYTE; }

int tok_build_tables(struct Tokenizer *t, const int32_t *merge_pairs, char *err) {
    if (strmap_init(&t->vocab, (size_t)t->n_tokens) < 0) {
        snprintf(err, TOK_ERR_LEN, "tokenizer: out of memory for the vocabulary table");
        return -1;
    }
    // Model tokens first, so where an added token repeats a model token's text the model id wins.
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < t->n_tokens; i++) {
            size_t len;
            const uint8_t *p = tok_bytes(t, i, &len);
            if (len == 0 || is_model_type(t->type[i]) != (pass == 0)) continue;
            strmap_put(&t->vocab, p, (uint32_t)len, i);
        }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        int32_t id = strmap_get(&t->vocab, &c, 1);
        t->byte_id[b] = id >= 0 && is_model_type(t->type[id]) ? id : -1;
    }
    if (build_merges(t, merge_pairs, err) < 0) return -1;
    for (int i = 0; i < t->n_tokens; i++) {
        size_t len;
        const uint8_t *p = tok_bytes(t, i, &len);
        if (len == 0 || (t->type[i] != TOK_TYPE_SPECIAL && t->type[i] != TOK_TYPE_ADDED)) continue;
        if (trie_add(&t->added, p, len, i) < 0) {
            snprintf(err, TOK_ERR_LEN, "tokenizer: out of memory for the added-token trie");
            return -1;
        }
    }
    return 0;
}

void tok_free_tables(struct Tokenizer *t) {
    strmap_free(&t->vocab);
    free(t->merges.slot);
    t->merges.slot = NULL;
    trie_free(&t->added);
}

int tokenizer_n_tokens(const Tokenizer *t) { return t->n_tokens; }
int tokenizer_bos(const Tokenizer *t) { return t->bos_id; }
int tokenizer_add_bos(const Tokenizer *t) { return t->add_bos; }
int tokenizer_chat(const Tokenizer *t) { return t->chat; }
const char *tokenizer_chat_template(const Tokenizer *t) { return t->chat_template; }
size_t tokenizer_max_piece_len(const Tokenizer *t) { return 3 * t->max_len; } // each byte may become U+FFFD

int tokenizer_is_eos(const Tokenizer *t, int id) {
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id) return 1;
    return 0;
}

int tokenizer_is_special(const Tokenizer *t, int id) { return id >= 0 && id < t->n_tokens && t->type[id] == TOK_TYPE_SPECIAL; }

int tokenizer_token_id(const Tokenizer *t, const char *bytes, size_t len) {
    return strmap_get(&t->vocab, (const uint8_t *)bytes, len);
}
