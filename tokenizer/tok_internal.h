// Internals shared by the tokenizer's translation units (not part of the public interface).
#ifndef TOK_INTERNAL_H
#define TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "spm.h"
#include "tokenizer.h"

// ---- growable int array (the encoder's output and scratch) ----
typedef struct {
    int *v;
    size_t n, cap;
} IntBuf;
int intbuf_push(IntBuf *b, int x); // 0, or -1 when out of memory
// Grows *p (an array of elem-byte items, *cap of them) to hold at least need. 0, or -1 (unchanged).
int tok_grow(void **p, size_t *cap, size_t need, size_t elem);

// ---- byte string -> id hash table (open addressing; keys point into caller-owned bytes) ----
typedef struct {
    const uint8_t **key;
    uint32_t *len;
    int32_t *id;
    size_t mask; // capacity - 1, capacity a power of two
} StrMap;
int strmap_init(StrMap *m, size_t n_expected); // 0, or -1 when out of memory
void strmap_free(StrMap *m);
// Inserts key -> id unless the key is present already (the first insert wins). -1: out of memory.
int strmap_put(StrMap *m, const uint8_t *key, uint32_t len, int32_t id);
int32_t strmap_get(const StrMap *m, const uint8_t *key, size_t len); // -1 if absent
uint64_t tok_hash_bytes(const uint8_t *p, size_t n);

// ---- (left, right) pair -> merge rank and result id (one 16-byte slot: one cache miss a probe) ----
typedef struct {
    uint64_t key;   // (left << 32 | right) + 1, 0 = empty slot
    int32_t rank;
    int32_t result;
} PairSlot;
typedef struct {
    PairSlot *slot;
    size_t mask;
} PairMap;

// ---- trie over the text of special / added tokens (longest match, as HF's added vocabulary) ----
typedef struct {
    int32_t child; // first child node, -1 if none
    int32_t next;  // next sibling, -1 if none
    int32_t id;    // token ending at this node, -1 if none
    uint8_t byte;  // label of the edge into this node
} TrieNode;

typedef struct {
    TrieNode *node; // node 0 is the root
    int n, cap;
    uint8_t first[256]; // 1 if some token starts with this byte (fast skip)
} Trie;

struct Tokenizer {
    int kind, pretok, normalize_nfc, ignore_merges, add_bos, bos_id, chat;
    int n_eos;
    int eos_ids[TOK_MAX_EOS];
    int n_tokens;
    const uint8_t *bytes;   // all token bytes, concatenated (points into the loaded section)
    uint64_t *offset;       // (n_tokens + 1) start of token i in bytes
    const uint8_t *type;    // (n_tokens) TokType (points into the loaded section)
    size_t max_len;         // longest token in bytes
    int n_merges;
    StrMap vocab;           // token bytes -> id (model tokens win over added ones of the same text)
    PairMap merges;
    int32_t byte_id[256];   // id of the single-byte token, -1 if the vocabulary lacks it
    Trie added;             // special and added tokens
    char *chat_template;    // NUL-terminated copy, or NULL
    const void *sp_model;
    size_t sp_model_len;
    SpmModel *spm;          // kind == SENTENCEPIECE: the library's model, which does the encoding
};

// ---- tables (vocab.c) ----
// Builds vocab, merges, byte_id and the added-token trie from bytes/offset/type. 0 or -1 with err.
int tok_build_tables(struct Tokenizer *t, const int32_t *merge_pairs, char *err);
void tok_free_tables(struct Tokenizer *t);
int pairmap_get(const PairMap *m, int32_t left, int32_t right, int32_t *rank, int32_t *result);
static inline const uint8_t *tok_bytes(const struct Tokenizer *t, int id, size_t *len) {
    *len = (size_t)(t->offset[id + 1] - t->offset[id]);
    return t->bytes + t->offset[id];
}

// ---- special.c: added-token trie ----
int trie_add(Trie *tr, const uint8_t *s, size_t n, int32_t id); // 0, or -1 when out of memory
void trie_free(Trie *tr);
// Longest token matching at s[0..n): returns its length (0: none), its id in *id.
size_t trie_match(const Trie *tr, const uint8_t *s, size_t n, int32_t *id);

// ---- utf8.c ----
enum { UTF8_VALID = 0, UTF8_INVALID = 1, UTF8_INCOMPLETE = 2 };
// Classifies the sequence at s[0..n), n >= 1, as Rust's from_utf8_lossy does: VALID (*len bytes,
// code point in *cp), INVALID (*len = length of the maximal ill-formed subpart, replaced by one
// U+FFFD), or INCOMPLETE (all n bytes are a valid prefix of a longer character).
int utf8_scan(const uint8_t *s, size_t n, size_t *len, int32_t *cp);
// Appends s with ill-formed parts replaced by U+FFFD; out must hold 3 * n bytes. Returns bytes written.
size_t utf8_lossy(const uint8_t *s, size_t n, uint8_t *out);

// ---- pretokenize.c ----
typedef struct {
    int32_t cp;    // code point, -1 for a byte of ill-formed UTF-8
    uint32_t off;  // byte offset in the segment
    uint8_t cls;   // character class bits (CL_* in pretokenize.c)
} TokChar;

typedef struct {
    TokChar *ch; size_t ch_cap;     // decoded characters of a segment
    uint32_t *cut; size_t cut_cap;  // pre-token boundaries (byte offsets)
    uint8_t *nfc; size_t nfc_cap;   // NFC-normalized segment
} PretokScratch;
void pretok_scratch_free(PretokScratch *s);
// Splits seg into pre-tokens for the given TokPretok variant: fills s->cut with n_cut + 1 byte
// offsets (cut[0] = 0, cut[n_cut] = len). Returns n_cut, or -1 when out of memory.
long pretokenize(int variant, const uint8_t *seg, size_t len, PretokScratch *s);
// NFC-normalizes seg (ill-formed bytes pass through unchanged). *out points at seg itself when
// nothing changes, else into s->nfc. Returns 0, or -1 when out of memory.
int tok_nfc(const uint8_t *seg, size_t len, PretokScratch *s, const uint8_t **out, size_t *out_len);

// ---- bpe.c ----
typedef struct {
    int32_t *sym; int32_t *prev; int32_t *next; size_t sym_cap;
    struct BpeMerge *heap;          // 3 * sym_cap entries
} BpeScratch;
void bpe_scratch_free(BpeScratch *s);
// Appends the ids of one pre-token (raw bytes). Returns 0, or -1 when out of memory.
int bpe_word(const struct Tokenizer *t, const uint8_t *w, size_t n, BpeScratch *s, IntBuf *out);

// ---- wordcache.c: pre-token -> ids, for the length of one encode call ----
typedef struct {
    uint64_t hash; // 0 = empty slot
    uint32_t off, len, ids, n_ids; // the word in bytes[], its ids in ids[]
} WordSlot;
typedef struct {
    WordSlot *slot; size_t mask, n;
    uint8_t *bytes; size_t n_bytes, bytes_cap;
    int32_t *ids; size_t n_ids, ids_cap;
} WordCache;
void wordcache_free(WordCache *c);
// bpe_word through the cache. 0, or -1 when out of memory.
int bpe_word_cached(const struct Tokenizer *t, const uint8_t *w, size_t n, BpeScratch *bs, WordCache *c,
                    IntBuf *out);

// ---- bytelevel.c: GPT-2's byte <-> printable code point mapping ----
// Undoes the mapping of a UTF-8 string; out must hold n bytes. Returns the byte count, or -1 when
// some character is not in the mapping (the string is then not byte-level encoded).
long bytelevel_unmap(const char *s, size_t n, uint8_t *out);

#endif
