// Ids -> text. Tokens are raw bytes, so a character may be split across tokens: the streaming
// decoder holds an incomplete character's bytes until the rest arrive, and replaces ill-formed
// bytes with U+FFFD exactly where Hugging Face's decoder (Rust's from_utf8_lossy) would.
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static const uint8_t FFFD[3] = {0xEF, 0xBF, 0xBD};

const char *tokenizer_piece(const Tokenizer *t, int id, size_t *len) {
    if (id < 0 || id >= t->n_tokens) {
        *len = 0;
        return NULL;
    }
    return (const char *)tok_bytes(t, id, len);
}

// Bounded append: never writes past cap (callers size out as documented, so nothing is dropped).
static void emit(char *out, size_t cap, size_t *o, const uint8_t *p, size_t n) {
    if (*o + n > cap) return;
    memcpy(out + *o, p, n);
    *o += n;
}

size_t tokenizer_decode_step(const Tokenizer *t, TokDecoder *d, int id, char *out, size_t cap) {
    size_t n, o = 0, i = 0, len;
    int32_t cp;
    const uint8_t *p = (const uint8_t *)tokenizer_piece(t, id, &n);
    if (!p) return 0;
    if (d->n_pending < 0 || d->n_pending > 3) d->n_pending = 0; // a decoder never set up: start clean
    // Complete the held character first, byte by byte from this piece.
    while (d->n_pending > 0 && i < n) {
        d->pending[d->n_pending++] = (char)p[i++];
        int r = utf8_scan((const uint8_t *)d->pending, (size_t)d->n_pending, &len, &cp);
        if (r == UTF8_INCOMPLETE) continue;
        if (r == UTF8_VALID) {
            emit(out, cap, &o, (const uint8_t *)d->pending, len);
        } else {
            emit(out, cap, &o, FFFD, 3);
            i--; // the byte that broke the sequence starts afresh
        }
        d->n_pending = 0;
    }
    while (i < n) {
        int r = utf8_scan(p + i, n - i, &len, &cp);
        if (r == UTF8_INCOMPLETE) { // at most 3 bytes, all a valid prefix
            memcpy(d->pending, p + i, len);
            d->n_pending = (int)len;
        } else if (r == UTF8_VALID) {
            emit(out, cap, &o, p + i, len);
        } else {
            emit(out, cap, &o, FFFD, 3);
        }
        i += len;
    }
    return o;
}

size_t tokenizer_decode_flush(const Tokenizer *t, TokDecoder *d, char *out, size_t cap) {
    (void)t;
    size_t o = 0;
    if (d->n_pending > 0) emit(out, cap, &o, FFFD, 3);
    d->n_pending = 0;
    return o;
}

char *tokenizer_decode(const Tokenizer *t, const int *ids, size_t n) {
    size_t total = 0, len;
    for (size_t i = 0; i < n; i++) {
        tokenizer_piece(t, ids[i], &len); // unknown ids are skipped, as HF's decode does
        total += len;
    }
    uint8_t *raw = malloc(total + 1);
    char *text = malloc(3 * total + 1);
    if (!raw || !text) {
        free(raw);
        free(text);
        return NULL;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = tokenizer_piece(t, ids[i], &len);
        if (p) memcpy(raw + o, p, len);
        o += len;
    }
    size_t m = utf8_lossy(raw, total, (uint8_t *)text);
    text[m] = '\0';
    free(raw);
    return text;
}
