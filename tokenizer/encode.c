// Text -> ids, in Hugging Face's order: split out special/added tokens, then for each stretch of
// plain text: normalize (NFC for Qwen), pre-tokenize, byte-pair merge each pre-token.
#include <stdio.h>
#include <stdlib.h>

#include "tok_internal.h"

typedef struct {
    PretokScratch pre;
    BpeScratch bpe;
    WordCache cache;
    IntBuf out;
} Encoder;

static int encode_plain(const Tokenizer *t, const uint8_t *s, size_t len, Encoder *e) {
    if (len == 0) return 0;
    if (t->normalize_nfc && tok_nfc(s, len, &e->pre, &s, &len) < 0) return -1;
    long n = pretokenize(t->pretok, s, len, &e->pre);
    if (n < 0) return -1;
    for (long k = 0; k < n; k++) {
        const uint32_t *cut = e->pre.cut;
        if (bpe_word_cached(t, s + cut[k], cut[k + 1] - cut[k], &e->bpe, &e->cache, &e->out) < 0) return -1;
    }
    return 0;
}

long tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int parse_special, int **ids, char *err) {
    *ids = NULL;
    if (len >= UINT32_MAX) {
        snprintf(err, TOK_ERR_LEN, "tokenizer: text of %zu bytes is too long (limit 4 GiB)", len);
        return -1;
    }
    // SentencePiece encodes as spm_encode does: control tokens in the text stay plain text.
    if (t->kind == TOK_KIND_SENTENCEPIECE) return spm_encode(t->spm, text, len, ids, err);
    const uint8_t *s = (const uint8_t *)text;
    Encoder e = {0};
    int rc = 0;
    size_t plain = 0; // start of the text not yet encoded
    for (size_t i = 0; i < len && rc == 0;) {
        int32_t id;
        size_t m = trie_match(&t->added, s + i, len - i, &id);
        if (m == 0) {
            i++;
            continue;
        }
        // Without parse_special a special token's text is plain text (HF's split_special_tokens).
        if (parse_special || t->type[id] == TOK_TYPE_ADDED) {
            rc = encode_plain(t, s + plain, i - plain, &e);
            if (rc == 0) rc = intbuf_push(&e.out, id);
            plain = i + m;
        }
        i += m;
    }
    if (rc == 0) rc = encode_plain(t, s + plain, len - plain, &e);
    pretok_scratch_free(&e.pre);
    bpe_scratch_free(&e.bpe);
    wordcache_free(&e.cache);
    if (rc < 0) {
        free(e.out.v);
        snprintf(err, TOK_ERR_LEN, "tokenizer: out of memory encoding %zu bytes", len);
        return -1;
    }
    if (!e.out.v && !(e.out.v = malloc(sizeof(int)))) { // a valid pointer even for no ids
        snprintf(err, TOK_ERR_LEN, "tokenizer: out of memory");
        return -1;
    }
    *ids = e.out.v;
    return (long)e.out.n;
}
