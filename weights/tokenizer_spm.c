// TokenizerSpec from a SentencePiece tokenizer.model: the proto travels into model.bin as it is
// (the library encodes with it at run time), and each piece becomes the bytes it decodes to, for
// the streaming decoder: "▁" is a space, "<0x0A>" the byte 0x0A, control pieces keep their text.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/spm.h"
#include "tokenizer_import.h"

#define MAX_PROTO (1u << 30) // far above any real tokenizer.model (Llama 2: 500 KB)

static int fail(char *err, const char *msg, const char *path) {
    snprintf(err, TOK_ERR_LEN, "tokenizer import: %s %.180s", msg, path);
    return -1;
}

static void *read_binary(const char *path, size_t *len, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, "cannot open", path), NULL;
    void *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n > 0 && (unsigned long)n <= MAX_PROTO && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n))) {
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    if (!buf) fail(err, n == 0 ? "empty file" : "cannot read", path);
    *len = buf ? (size_t)n : 0;
    return buf;
}

// The bytes piece p (of SentencePiece type) stands for; out holds len bytes. Returns the count.
static size_t piece_bytes(const char *p, size_t len, int type, char *out) {
    unsigned byte;
    char tail;
    if (type == SPM_PIECE_BYTE && len == 6 && sscanf(p, "<0x%2X%c", &byte, &tail) == 2 && tail == '>') {
        out[0] = (char)byte;
        return 1;
    }
    if (type != SPM_PIECE_NORMAL) {
        memcpy(out, p, len);
        return len;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (i + 2 < len && memcmp(p + i, "\xe2\x96\x81", 3) == 0) { // U+2581 LOWER ONE EIGHTH BLOCK
            out[n++] = ' ';
            i += 2;
        } else {
            out[n++] = p[i];
        }
    }
    return n;
}

int tokspec_spm_vocab(TokenizerSpec *s, const char *path, char *err) {
    size_t len;
    void *proto = read_binary(path, &len, err);
    if (!proto) return -1;
    SpmModel *m = spm_load(proto, len, err);
    if (!m) {
        free(proto);
        return fail(err, "not a SentencePiece model:", path);
    }
    static const uint8_t type_of[] = {TOK_TYPE_NORMAL, TOK_TYPE_SPECIAL, TOK_TYPE_SPECIAL, TOK_TYPE_BYTE, TOK_TYPE_UNUSED};
    int n = spm_n_pieces(m), rc = 0;
    s->kind = TOK_KIND_SENTENCEPIECE;
    s->sp_model = proto;
    s->sp_model_len = len;
    s->n_tokens = n;
    s->tokens = calloc((size_t)n, sizeof *s->tokens);
    s->token_len = calloc((size_t)n, sizeof *s->token_len);
    s->token_type = malloc((size_t)n);
    if (!s->tokens || !s->token_len || !s->token_type) rc = fail(err, "out of memory reading", path);
    for (int i = 0; rc == 0 && i < n; i++) {
        size_t pl;
        const char *p = spm_piece(m, i, &pl);
        int type = spm_piece_type(m, i);
        if (!(s->tokens[i] = malloc(pl + 1))) {
            rc = fail(err, "out of memory reading", path);
            break;
        }
        s->token_len[i] = (int)piece_bytes(p, pl, type, s->tokens[i]);
        s->token_type[i] = type_of[type];
    }
    s->bos_id = spm_bos(m) >= 0 && spm_bos(m) < n ? spm_bos(m) : -1;
    s->add_bos = s->bos_id >= 0; // LlamaTokenizer's default; tokenizer_config.json may say otherwise
    int eos = spm_eos(m);
    if (eos >= 0 && eos < n) s->eos_ids[s->n_eos++] = eos;
    spm_free(m);
    return rc; // on failure the caller frees s (proto included)
}
