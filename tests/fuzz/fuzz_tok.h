// What every fuzz harness that gets a Tokenizer checks on it: encoding yields ids in range (and,
// where it must, exactly the input's bytes back), and streaming decode agrees with whole decode.
#ifndef FUZZ_TOK_H
#define FUZZ_TOK_H

#include "../../tokenizer/tok_internal.h"
#include "fuzz_common.h"

// Decodes ids whole and step by step; the two must be the same text (HF's decode, lossy UTF-8).
static inline void fuzz_decode_both(const Tokenizer *t, const int *ids, size_t n) {
    char *whole = tokenizer_decode(t, ids, n);
    if (!whole) return; // out of memory
    size_t cap = tokenizer_max_piece_len(t) + 16, len = strlen(whole), o = 0;
    // Exactly the documented size, so ASan catches a write past it.
    char *piece = malloc(cap);
    TokDecoder d = {0};
    int cut = 0; // whole is a C string: it ends at the first NUL the text holds
    for (size_t i = 0; i <= n && piece && !cut; i++) {
        size_t k = i < n ? tokenizer_decode_step(t, &d, ids[i], piece, cap) : tokenizer_decode_flush(t, &d, piece, cap);
        size_t same = o + k > len ? len - o : k;
        cut = same < k;
        if (memcmp(whole + o, piece, same) != 0 || (cut && piece[same] != 0)) {
            fprintf(stderr, "streaming decode differs from whole decode at id %zu\n", i);
            abort();
        }
        o += k;
    }
    if (piece && !cut && o != len) {
        fprintf(stderr, "streaming decode is %zu bytes, whole decode %zu\n", o, len);
        abort();
    }
    free(piece);
    free(whole);
}

// exact: the pieces of the ids must concatenate to the input (a byte-level vocabulary with every
// byte, and no normalization that changes this text).
static inline void fuzz_encode_check(const Tokenizer *t, const char *text, size_t len, int parse_special, int exact) {
    int *ids = NULL;
    char err[TOK_ERR_LEN];
    long n = tokenizer_encode(t, text, len, parse_special, &ids, err);
    if (n < 0) {
        fuzz_check_err(err);
        return;
    }
    size_t o = 0;
    for (long i = 0; i < n; i++) {
        size_t pl;
        const char *p = tokenizer_piece(t, ids[i], &pl);
        if (!p) {
            fprintf(stderr, "encode produced id %d of %d tokens\n", ids[i], tokenizer_n_tokens(t));
            abort();
        }
        if (exact && (o + pl > len || memcmp(text + o, p, pl) != 0)) {
            fprintf(stderr, "token %ld (id %d) does not match the text at byte %zu\n", i, ids[i], o);
            abort();
        }
        o += pl;
    }
    if (exact && o != len) {
        fprintf(stderr, "tokens cover %zu of %zu bytes\n", o, len);
        abort();
    }
    fuzz_decode_both(t, ids, (size_t)n);
    free(ids);
}

// Must encoding give back text's bytes? Yes when each byte has its own token (else HF drops it)
// and no NFC normalization can change the text (it has none, or the text is ASCII).
static inline int fuzz_tok_exact(const Tokenizer *t, const char *text, size_t len) {
    if (t->kind != TOK_KIND_BPE) return 0;
    for (size_t i = 0; i < len; i++)
        if (t->byte_id[(uint8_t)text[i]] < 0 || (t->normalize_nfc && (uint8_t)text[i] >= 0x80)) return 0;
    return 1;
}

// A loaded tokenizer of unknown origin: fixed texts through encode, every id through decode.
static inline void fuzz_exercise_tokenizer(const Tokenizer *t) {
    static const char *texts[] = {
        "Hello, world! It's 2024; numbers 1234567 and don't.\n\n  spaces\t\ttabs",
        "<|im_start|>user\nHi<|im_end|>\n<|begin_of_text|><|eot_id|>",
        "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 e\xcc\x81 \xff\xfe broken \xe2\x82",
    };
    if (t->kind == TOK_KIND_BPE)
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
            for (int ps = 0; ps < 2; ps++)
                fuzz_encode_check(t, texts[i], strlen(texts[i]), ps, fuzz_tok_exact(t, texts[i], strlen(texts[i])));
    int n = tokenizer_n_tokens(t) < 4096 ? tokenizer_n_tokens(t) : 4096;
    int *ids = malloc(((size_t)n + 2) * sizeof *ids);
    if (!ids) return;
    for (int i = 0; i < n; i++) ids[i] = i;
    ids[n] = -1, ids[n + 1] = tokenizer_n_tokens(t); // ids out of range are skipped
    fuzz_decode_both(t, ids, (size_t)n + 2);
    free(ids);
    (void)tokenizer_chat_template(t);
    for (int i = -1; i <= tokenizer_n_tokens(t) && i < 64; i++) (void)tokenizer_is_eos(t, i);
}

#endif
