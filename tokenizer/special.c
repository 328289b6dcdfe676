// Matching special and added tokens in input text the way Hugging Face's AddedVocabulary does by
// default: scanning left to right, at the first position where any token matches, the longest
// token there wins (Aho-Corasick "leftmost longest"); the text between matches is encoded normally.
//
// Supported added_tokens flags: none of lstrip / rstrip / single_word (the importer rejects them);
// normalized=true is treated like normalized=false (exact when the tokenizer has no normalizer).
#include <stdlib.h>

#include "tok_internal.h"

static int32_t new_node(Trie *tr, uint8_t byte) {
    if (tr->n == tr->cap) {
        int cap = tr->cap ? 2 * tr->cap : 64;
        TrieNode *n = realloc(tr->node, (size_t)cap * sizeof *n);
        if (!n) return -1;
        tr->node = n;
        tr->cap = cap;
    }
    tr->node[tr->n] = (TrieNode){.child = -1, .next = -1, .id = -1, .byte = byte};
    return tr->n++;
}

static int32_t find_child(const Trie *tr, int32_t at, uint8_t b) {
    for (int32_t c = tr->node[at].child; c >= 0; c = tr->node[c].next)
        if (tr->node[c].byte == b) return c;
    return -1;
}

int trie_add(Trie *tr, const uint8_t *s, size_t n, int32_t id) {
    if (tr->n == 0 && new_node(tr, 0) < 0) return -1;
    int32_t at = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = find_child(tr, at, s[i]);
        if (c < 0) {
            if ((c = new_node(tr, s[i])) < 0) return -1;
            tr->node[c].next = tr->node[at].child;
            tr->node[at].child = c;
        }
        at = c;
    }
    if (tr->node[at].id < 0) tr->node[at].id = id; // same text twice: the first id stays
    tr->first[s[0]] = 1;
    return 0;
}

void trie_free(Trie *tr) {
    free(tr->node);
    tr->node = NULL;
    tr->n = tr->cap = 0;
}

size_t trie_match(const Trie *tr, const uint8_t *s, size_t n, int32_t *id) {
    if (tr->n == 0 || !tr->first[s[0]]) return 0;
    size_t best = 0;
    int32_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if ((at = find_child(tr, at, s[i])) < 0) break;
        if (tr->node[at].id >= 0) {
            best = i + 1;
            *id = tr->node[at].id;
        }
    }
    return best;
}
