// The tokenizer section of model.bin: a versioned little-endian header, then the arrays. The
// loader checks every count, length and id against the section size before using any of them,
// so a truncated or corrupted section is refused with a message instead of crashing.
//
// Layout (version 1):
//   0   "TOKZ", u32 version, u64 total size of the section
//   16  i32 kind, pretok, normalize_nfc, ignore_merges, add_bos, bos_id, chat, n_eos
//   48  i32 eos_ids[8]
//   80  i32 n_tokens, n_merges
//   88  u64 token bytes, chat template bytes, SentencePiece model bytes
//   112 u32 token_len[n_tokens], u8 token_type[n_tokens], i32 merges[n_merges][2],
//       token bytes, chat template (no NUL), SentencePiece model
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

#define TOK_MAGIC "TOKZ"
#define TOK_VERSION 1u
#define HEADER_SIZE 112

static void put32(uint8_t *p, uint32_t x) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(x >> (8 * i));
}
static void put64(uint8_t *p, uint64_t x) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(x >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

void tokspec_free(TokenizerSpec *s) {
    if (!s) return;
    if (s->tokens)
        for (int i = 0; i < s->n_tokens; i++) free(s->tokens[i]);
    free(s->tokens);
    free(s->token_len);
    free(s->token_type);
    free(s->merges);
    free(s->chat_template);
    free(s->sp_model);
    memset(s, 0, sizeof *s);
}

// Checks of the header fields shared by the writer and the loader. 0, or -1 with err.
static int check_fields(int kind, int pretok, int nfc, int ign, int add_bos, int bos, int chat, int n_eos,
                        const int *eos, int n_tokens, int n_merges, char *err) {
    const char *bad = NULL;
    if (kind != TOK_KIND_BPE && kind != TOK_KIND_SENTENCEPIECE) bad = "kind";
    else if (kind == TOK_KIND_BPE && (pretok < TOK_PRE_GPT2 || pretok > TOK_PRE_QWEN2)) bad = "pre-tokenizer";
    else if ((nfc | ign | add_bos) & ~1) bad = "flag";
    else if (chat < TOK_CHAT_NONE || chat > TOK_CHAT_QWEN3) bad = "chat template kind";
    else if (n_tokens < 0 || (kind == TOK_KIND_BPE && n_tokens == 0)) bad = "token count";
    else if (n_merges < 0) bad = "merge count";
    else if (bos < -1 || bos >= n_tokens) bad = "BOS id";
    else if (n_eos < 1 || n_eos > TOK_MAX_EOS) bad = "EOS count";
    for (int i = 0; !bad && i < n_eos; i++)
        if (eos[i] < 0 || eos[i] >= n_tokens) bad = "EOS id";
    if (bad) {
        snprintf(err, TOK_ERR_LEN, "tokenizer: invalid %s in tokenizer section", bad);
        return -1;
    }
    return 0;
}

// The whole section in one malloc'd buffer. Returns NULL with err.
static uint8_t *build_section(const TokenizerSpec *s, size_t *size, char *err) {
    if (check_fields(s->kind, s->pretok, s->normalize_nfc, s->ignore_merges, s->add_bos, s->bos_id, s->chat,
                     s->n_eos, s->eos_ids, s->n_tokens, s->n_merges, err) < 0)
        return NULL;
    if ((s->n_tokens > 0 && (!s->tokens || !s->token_len)) || (s->n_merges > 0 && !s->merges)) {
        snprintf(err, TOK_ERR_LEN, "tokenizer: spec without its token or merge arrays");
        return NULL;
    }
    uint64_t tok_bytes = 0;
    for (int i = 0; i < s->n_tokens; i++) {
        if (s->token_len[i] < 0 || (s->token_len[i] > 0 && !s->tokens[i])) {
            snprintf(err, TOK_ERR_LEN, "tokenizer: token %d has no bytes", i);
            return NULL;
        }
        tok_bytes += (uint64_t)s->token_len[i];
    }
    size_t tpl = s->chat_template ? strlen(s->chat_template) : 0, sp = s->sp_model ? s->sp_model_len : 0;
    size_t n = HEADER_SIZE + 5 * (size_t)s->n_tokens + 8 * (size_t)s->n_merges + tok_bytes + tpl + sp;
    uint8_t *buf = malloc(n), *p = buf;
    if (!buf) {
        snprintf(err, TOK_ERR_LEN, "tokenizer: out of memory writing %zu bytes", n);
        return NULL;
    }
    memcpy(p, TOK_MAGIC, 4);
    put32(p + 4, TOK_VERSION);
    put64(p + 8, n);
    const int fields[8] = {s->kind, s->pretok, s->normalize_nfc, s->ignore_merges,
                           s->add_bos, s->bos_id, s->chat, s->n_eos};
    for (int i = 0; i < 8; i++) put32(p + 16 + 4 * i, (uint32_t)fields[i]);
    for (int i = 0; i < TOK_MAX_EOS; i++) put32(p + 48 + 4 * i, (uint32_t)(i < s->n_eos ? s->eos_ids[i] : -1));
    put32(p + 80, (uint32_t)s->n_tokens);
    put32(p + 84, (uint32_t)s->n_merges);
    put64(p + 88, tok_bytes);
    put64(p + 96, tpl);
    put64(p + 104, sp);
    p += HEADER_SIZE;
    for (int i = 0; i < s->n_tokens; i++, p += 4) put32(p, (uint32_t)s->token_len[i]);
    for (int i = 0; i < s->n_tokens; i++) *p++ = s->token_type ? s->token_type[i] : TOK_TYPE_NORMAL;
    for (int i = 0; i < 2 * s->n_merges; i++, p += 4) put32(p, (uint32_t)s->merges[i]);
    for (int i = 0; i < s->n_tokens; i++) {
        if (s->token_len[i]) memcpy(p, s->tokens[i], (size_t)s->token_len[i]);
        p += s->token_len[i];
    }
    if (tpl) memcpy(p, s->chat_template, tpl);
    if (sp) memcpy(p + tpl, s->sp_model, sp);
    *size = n;
    return buf;
}

int tokenizer_write(FILE *f, const TokenizerSpec *s, char *err) {
    size_t n;
    uint8_t *buf = build_section(s, &n, err);
    if (!buf) return -1;
    // Load what we are about to write, so a section that ./run would refuse is never written.
    Tokenizer *t = tokenizer_load(buf, n, err);
    int rc = t ? 0 : -1;
    tokenizer_free(t);
    if (rc == 0 && fwrite(buf, 1, n, f) != n) {
        snprintf(err, TOK_ERR_LEN, "tokenizer: write of %zu bytes failed", n);
        rc = -1;
    }
    free(buf);
    return rc;
}

static Tokenizer *fail(Tokenizer *t, char *err, const char *msg) {
    if (msg) snprintf(err, TOK_ERR_LEN, "tokenizer: %s", msg);
    tokenizer_free(t);
    return NULL;
}

// SentencePiece: the library encodes from the model proto; its pieces must be the section's tokens.
static int load_spm(Tokenizer *t, char *err) {
    if (!t->sp_model) {
        snprintf(err, TOK_ERR_LEN, "tokenizer: SentencePiece section without its model proto");
        return -1;
    }
    if (!(t->spm = spm_load(t->sp_model, t->sp_model_len, err))) return -1;
    if (spm_n_pieces(t->spm) != t->n_tokens) {
        snprintf(err, TOK_ERR_LEN, "tokenizer: SentencePiece model has %d pieces, the section %d tokens",
                 spm_n_pieces(t->spm), t->n_tokens);
        return -1;
    }
    return 0;
}

Tokenizer *tokenizer_load(const void *data, size_t size, char *err) {
    const uint8_t *d = data;
    if (!d || size < HEADER_SIZE) return fail(NULL, err, "section too short for its header");
    if (memcmp(d, TOK_MAGIC, 4) != 0) return fail(NULL, err, "bad magic (not a tokenizer section)");
    if (get32(d + 4) != TOK_VERSION) {
        snprintf(err, TOK_ERR_LEN, "tokenizer: section version %u, this build reads %u", get32(d + 4), TOK_VERSION);
        return NULL;
    }
    Tokenizer *t = calloc(1, sizeof *t);
    if (!t) return fail(NULL, err, "out of memory");
    int f[8];
    for (int i = 0; i < 8; i++) f[i] = (int)get32(d + 16 + 4 * i);
    t->kind = f[0]; t->pretok = f[1]; t->normalize_nfc = f[2]; t->ignore_merges = f[3];
    t->add_bos = f[4]; t->bos_id = f[5]; t->chat = f[6]; t->n_eos = f[7];
    int n_eos = f[7] >= 1 && f[7] <= TOK_MAX_EOS ? f[7] : 1;
    for (int i = 0; i < n_eos; i++) t->eos_ids[i] = (int)get32(d + 48 + 4 * i);
    t->n_tokens = (int)get32(d + 80);
    t->n_merges = (int)get32(d + 84);
    if (check_fields(t->kind, t->pretok, t->normalize_nfc, t->ignore_merges, t->add_bos, t->bos_id, t->chat,
                     t->n_eos, t->eos_ids, t->n_tokens, t->n_merges, err) < 0)
        return fail(t, err, NULL);
    uint64_t total = get64(d + 8), tok_bytes = get64(d + 88), tpl = get64(d + 96), sp = get64(d + 104);
    uint64_t need = HEADER_SIZE + 5 * (uint64_t)t->n_tokens + 8 * (uint64_t)t->n_merges; // < 2^36
    // Subtract part by part from the declared total (itself within size), so nothing can overflow.
    if (total > size || need > total || tok_bytes > total - need || tpl > total - need - tok_bytes ||
        sp != total - need - tok_bytes - tpl)
        return fail(t, err, "section sizes disagree with its length (truncated or corrupted)");
    const uint8_t *lens = d + HEADER_SIZE;
    t->type = lens + 4 * (size_t)t->n_tokens;
    const uint8_t *mp = t->type + t->n_tokens;
    t->bytes = mp + 8 * (size_t)t->n_merges;
    t->offset = malloc(((size_t)t->n_tokens + 1) * sizeof *t->offset);
    int32_t *pairs = malloc(((size_t)t->n_merges * 2 + 1) * sizeof *pairs);
    if (!t->offset || !pairs) {
        free(pairs);
        return fail(t, err, "out of memory");
    }
    uint64_t off = 0;
    for (int i = 0; i < t->n_tokens; i++) {
        uint32_t len = get32(lens + 4 * (size_t)i);
        if (t->type[i] > TOK_TYPE_UNUSED) {
            free(pairs);
            return fail(t, err, "invalid token type");
        }
        t->offset[i] = off;
        off += len;
        if (len > t->max_len) t->max_len = len;
    }
    t->offset[t->n_tokens] = off;
    if (off != tok_bytes) {
        free(pairs);
        return fail(t, err, "token lengths disagree with the token bytes size");
    }
    for (int i = 0; i < 2 * t->n_merges; i++) {
        pairs[i] = (int32_t)get32(mp + 4 * (size_t)i);
        if (pairs[i] < 0 || pairs[i] >= t->n_tokens) {
            free(pairs);
            return fail(t, err, "merge refers to a token id out of range");
        }
    }
    const uint8_t *tp = t->bytes + tok_bytes;
    if (tpl) {
        if (memchr(tp, 0, tpl)) {
            free(pairs);
            return fail(t, err, "chat template contains a NUL byte");
        }
        if (!(t->chat_template = malloc(tpl + 1))) {
            free(pairs);
            return fail(t, err, "out of memory");
        }
        memcpy(t->chat_template, tp, tpl);
        t->chat_template[tpl] = '\0';
    }
    if (sp) {
        t->sp_model = tp + tpl;
        t->sp_model_len = sp;
    }
    int rc = tok_build_tables(t, pairs, err);
    free(pairs);
    if (rc == 0 && t->kind == TOK_KIND_SENTENCEPIECE) rc = load_spm(t, err);
    return rc < 0 ? fail(t, err, NULL) : t;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    tok_free_tables(t);
    spm_free(t->spm);
    free(t->offset);
    free(t->chat_template);
    free(t);
}
