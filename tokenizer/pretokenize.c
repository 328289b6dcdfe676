// Pre-tokenization: the split regexes of Hugging Face's byte-level BPE tokenizers, written as
// hand matchers that follow the regex engine's leftmost-first alternation and backtracking:
//
// LLAMA3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
//         |\s*[\r\n]+|\s+(?!\S)|\s+
// QWEN2:  the same with \p{N} (one digit per pre-token).
// GPT2:   SmolLM2's Sequence[Digits(individual_digits), ByteLevel(use_regex)]: every \p{N}
//         character stands alone, and each stretch between them is split by GPT-2's
//         's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// \s is Unicode White_Space (what Oniguruma, HF's regex engine, uses); \p{L} and \p{N} come from
// utf8proc's general categories. A byte of ill-formed UTF-8 counts as one "other" character.
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tok_internal.h"

enum { CL_L = 1, CL_N = 2, CL_WS = 4, CL_CRLF = 8 };

static int is_white_space(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

static uint8_t classify(int32_t c) {
    if (c < 0) return 0;
    if (c == '\r' || c == '\n') return CL_WS | CL_CRLF;
    if (is_white_space(c)) return CL_WS;
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return CL_L;
        return c >= '0' && c <= '9' ? CL_N : 0;
    }
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        return CL_L;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        return CL_N;
    default:
        return 0;
    }
}

void pretok_scratch_free(PretokScratch *s) {
    free(s->ch);
    free(s->cut);
    free(s->nfc);
    memset(s, 0, sizeof *s);
}

#define L(k) (c[k].cls & CL_L)
#define N(k) (c[k].cls & CL_N)
#define WS(k) (c[k].cls & CL_WS)
#define CRLF(k) (c[k].cls & CL_CRLF)
#define OTHER(k) (c[k].cls == 0) // [^\s\p{L}\p{N}]

// Does c[i] equal the ASCII lower-case letter x, ignoring case when ci? Besides ASCII, only
// U+017F (long s) case-folds onto one of s t r e v m l d.
static int letter_is(const TokChar *c, size_t i, char x, int ci) {
    int32_t cp = c[i].cp;
    if (cp == x) return 1;
    return ci && (cp == x - 32 || (x == 's' && cp == 0x17F));
}

// 's|'t|'re|'ve|'m|'ll|'d at c[i] (c[i] is '\''): length in characters, 0 if none.
static size_t contraction(const TokChar *c, size_t i, size_t end, int ci) {
    if (i + 1 >= end) return 0;
    if (letter_is(c, i + 1, 's', ci) || letter_is(c, i + 1, 't', ci) || letter_is(c, i + 1, 'm', ci) ||
        letter_is(c, i + 1, 'd', ci))
        return 2;
    if (i + 2 >= end) return 0;
    if ((letter_is(c, i + 1, 'r', ci) || letter_is(c, i + 1, 'v', ci)) && letter_is(c, i + 2, 'e', ci)) return 3;
    if (letter_is(c, i + 1, 'l', ci) && letter_is(c, i + 2, 'l', ci)) return 3;
    return 0;
}

// \s*[\r\n]+ | \s+(?!\S) | \s+ at a white-space character c[i]; also GPT-2's last two branches
// (with_crlf = 0). Returns the end of the match.
static size_t match_space(const TokChar *c, size_t i, size_t end, int with_crlf) {
    size_t j = i, last_crlf = 0;
    int seen_crlf = 0;
    while (j < end && WS(j)) {
        if (CRLF(j)) { last_crlf = j; seen_crlf = 1; }
        j++;
    }
    // \s* backtracks from the end of the run to the last CR/LF, which [\r\n]+ then ends at.
    if (with_crlf && seen_crlf) return last_crlf + 1;
    // \s+(?!\S): the whole run at the end of the text, else all but its last character (which then
    // begins the next pre-token); a single space before a non-space falls through to \s+.
    if (j == end) return j;
    if (j - 1 > i) return j - 1;
    return j;
}

static size_t match_llama3(const TokChar *c, size_t i, size_t end, size_t max_digits) {
    if (c[i].cp == '\'') {
        size_t k = contraction(c, i, end, 1);
        if (k) return i + k;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    size_t j = i;
    if (!L(i) && !N(i) && !CRLF(i) && i + 1 < end && L(i + 1)) j = i + 1;
    if (L(j)) {
        while (j < end && L(j)) j++;
        return j;
    }
    if (N(i)) { // \p{N}{1,3} or \p{N}
        for (j = i; j < end && j - i < max_digits && N(j);) j++;
        return j;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    j = i;
    if (c[i].cp == ' ' && i + 1 < end && OTHER(i + 1)) j = i + 1;
    if (OTHER(j)) {
        while (j < end && OTHER(j)) j++;
        while (j < end && CRLF(j)) j++;
        return j;
    }
    return match_space(c, i, end, 1); // c[i] is white space: every other class was handled
}

static size_t match_gpt2(const TokChar *c, size_t i, size_t end) {
    if (c[i].cp == '\'') {
        size_t k = contraction(c, i, end, 0);
        if (k) return i + k;
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional U+0020, then a run of one class.
    size_t j = i;
    if (c[i].cp == ' ' && i + 1 < end && !WS(i + 1)) j = i + 1;
    if (!WS(j)) {
        uint8_t cls = c[j].cls;
        while (j < end && c[j].cls == cls) j++;
        return j;
    }
    return match_space(c, i, end, 0);
}

// Decodes seg into s->ch (plus a sentinel holding the end offset). Returns the count, or -1.
static long decode_chars(const uint8_t *seg, size_t len, PretokScratch *s) {
    if (tok_grow((void **)&s->ch, &s->ch_cap, len + 1, sizeof *s->ch) < 0) return -1;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t l;
        int32_t cp;
        if (utf8_scan(seg + i, len - i, &l, &cp) != UTF8_VALID) {
            cp = -1;
            l = 1;
        }
        s->ch[n++] = (TokChar){.cp = cp, .off = (uint32_t)i, .cls = classify(cp)};
        i += l;
    }
    s->ch[n] = (TokChar){.cp = -1, .off = (uint32_t)len, .cls = 0};
    return (long)n;
}

long pretokenize(int variant, const uint8_t *seg, size_t len, PretokScratch *s) {
    if (len >= UINT32_MAX) return -1; // offsets are 32-bit (the encoder refuses texts of 4 GiB)
    long nl = decode_chars(seg, len, s);
    if (nl < 0 || tok_grow((void **)&s->cut, &s->cut_cap, (size_t)nl + 1, sizeof *s->cut) < 0) return -1;
    size_t n = (size_t)nl, n_cut = 0;
    const TokChar *c = s->ch;
    s->cut[0] = 0;
    for (size_t i = 0; i < n;) {
        size_t j;
        if (variant == TOK_PRE_GPT2) {
            if (N(i)) {
                j = i + 1; // Digits(individual_digits=true)
            } else {
                size_t end = i;
                while (end < n && !N(end)) end++;
                for (; i < end; i = j) {
                    j = match_gpt2(c, i, end);
                    s->cut[++n_cut] = c[j].off;
                }
                continue;
            }
        } else {
            j = match_llama3(c, i, n, variant == TOK_PRE_QWEN2 ? 1 : 3);
        }
        s->cut[++n_cut] = c[j].off;
        i = j;
    }
    return (long)n_cut;
}

// Appends NFC(s[0..n)) to the scratch buffer at *o; ill-formed bytes pass through unchanged.
static int nfc_append(const uint8_t *seg, size_t len, PretokScratch *s, size_t *o) {
    for (size_t i = 0; i < len;) {
        // Maximal well-formed run [i, j): utf8proc refuses ill-formed input.
        size_t j = i, l;
        int32_t cp;
        while (j < len && utf8_scan(seg + j, len - j, &l, &cp) == UTF8_VALID) j += l;
        if (j > i) {
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t m = utf8proc_map(seg + i, (utf8proc_ssize_t)(j - i), &dst,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (m < 0 || tok_grow((void **)&s->nfc, &s->nfc_cap, *o + (size_t)m + 1, 1) < 0) {
                free(dst);
                return -1;
            }
            memcpy(s->nfc + *o, dst, (size_t)m);
            *o += (size_t)m;
            free(dst);
        }
        if (j < len) {
            if (tok_grow((void **)&s->nfc, &s->nfc_cap, *o + 1, 1) < 0) return -1;
            s->nfc[(*o)++] = seg[j++];
        }
        i = j;
    }
    return 0;
}

int tok_nfc(const uint8_t *seg, size_t len, PretokScratch *s, const uint8_t **out, size_t *out_len) {
    size_t i = 0, o = 0;
    while (i < len && seg[i] < 0x80) i++;
    if (i == len) { // ASCII is always in NFC
        *out = seg;
        *out_len = len;
        return 0;
    }
    if (tok_grow((void **)&s->nfc, &s->nfc_cap, len + 1, 1) < 0) return -1;
    // NFC never acts across the boundary before an ASCII character (a starter that composes with
    // nothing before it), so only the non-ASCII runs, each with the character before it (which
    // may take a combining mark), go through utf8proc; the rest is copied.
    for (i = 0; i < len;) {
        size_t j = i;
        while (j < len && seg[j] < 0x80) j++;
        size_t keep = j < len && j > i ? j - 1 : j;
        if (tok_grow((void **)&s->nfc, &s->nfc_cap, o + (keep - i) + 1, 1) < 0) return -1;
        memcpy(s->nfc + o, seg + i, keep - i);
        o += keep - i;
        if (j == len) break;
        size_t k = j;
        while (k < len && seg[k] >= 0x80) k++;
        if (nfc_append(seg + keep, k - keep, s, &o) < 0) return -1;
        i = k;
    }
    *out = s->nfc;
    *out_len = o;
    return 0;
}
