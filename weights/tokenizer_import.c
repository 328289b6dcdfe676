// TokenizerSpec from a Hugging Face tokenizer directory or from GGUF tokenizer metadata.
// Only tokenizers reproduced exactly are accepted: byte-level BPE whose pipeline tokenizer/
// implements (Llama 3, Qwen 2/3, SmolLM2) and SentencePiece models (the library itself encodes);
// anything else is refused with a one-line reason, not approximated.
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tokenizer/tok_internal.h"
#include "hf_config.h"
#include "tokenizer_import.h"

#define MAX_VOCAB (1 << 24) // far above any real vocabulary; bounds what malformed ids can allocate

static const char *LLAMA3_RE =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *QWEN2_RE =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Fills err (one line) and returns -1.
__attribute__((format(printf, 2, 3))) static int fail(char *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, TOK_ERR_LEN, fmt, ap);
    va_end(ap);
    for (char *c = err; *c; c++) // token texts quoted in the message may hold line breaks, escapes
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
    return -1;
}

// ---------------------------------------------------------------- shared helpers

static int alloc_tokens(TokenizerSpec *s, int n, char *err) {
    s->n_tokens = n;
    s->tokens = calloc((size_t)n, sizeof *s->tokens);
    s->token_len = calloc((size_t)n, sizeof *s->token_len);
    s->token_type = malloc((size_t)n);
    if (!s->tokens || !s->token_len || !s->token_type) return fail(err, "tokenizer import: out of memory");
    memset(s->token_type, TOK_TYPE_UNUSED, (size_t)n); // ids no entry names stay unused
    return 0;
}

// Sets token id's bytes: byte-level vocabulary strings are mapped back to raw bytes; strings that
// are not byte-level encoded (added tokens) are kept as they are, as HF's ByteLevel decoder does.
static int set_token(TokenizerSpec *s, int id, const char *str, int unmap, int type, char *err) {
    size_t n = strlen(str);
    uint8_t *b = malloc(n + 1);
    if (!b) return fail(err, "tokenizer import: out of memory");
    long m = unmap ? bytelevel_unmap(str, n, b) : -1;
    if (m < 0) {
        memcpy(b, str, n);
        m = (long)n;
    }
    free(s->tokens[id]);
    s->tokens[id] = (char *)b;
    s->token_len[id] = (int)m;
    s->token_type[id] = (uint8_t)type;
    return 0;
}

static int find_token(const TokenizerSpec *s, const char *text) {
    size_t n = strlen(text);
    for (int i = 0; i < s->n_tokens; i++)
        if ((size_t)s->token_len[i] == n && memcmp(s->tokens[i], text, n) == 0) return i;
    return -1;
}

static int add_eos(TokenizerSpec *s, int id, char *err) {
    if (id < 0 || id >= s->n_tokens) return fail(err, "tokenizer import: EOS id out of range");
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos_ids[i] == id) return 0;
    if (s->n_eos == TOK_MAX_EOS) return fail(err, "tokenizer import: more than 8 EOS ids");
    s->eos_ids[s->n_eos++] = id;
    return 0;
}

static int chat_kind(const char *tpl) {
    if (!tpl) return TOK_CHAT_NONE;
    if (strstr(tpl, "<|start_header_id|>")) return TOK_CHAT_LLAMA3;
    if (strstr(tpl, "<|im_start|>")) return strstr(tpl, "<think>") ? TOK_CHAT_QWEN3 : TOK_CHAT_CHATML;
    return TOK_CHAT_NONE;
}

static int set_template(TokenizerSpec *s, const char *tpl, char *err) {
    if (!tpl) return 0;
    if (!(s->chat_template = strdup(tpl))) return fail(err, "tokenizer import: out of memory");
    s->chat = chat_kind(tpl);
    return 0;
}

// Merges from their two parts' texts, parts[2r] and parts[2r + 1] (NULL: malformed), looked up
// in a map of the tokens' texts as the source writes them (byte-level strings).
static int set_merges(TokenizerSpec *s, int n, const StrMap *by_text, const char *const *parts, char *err) {
    s->n_merges = n;
    if (!(s->merges = malloc(2 * (size_t)(n ? n : 1) * sizeof *s->merges)))
        return fail(err, "tokenizer import: out of memory");
    for (int i = 0; i < 2 * n; i++) {
        int32_t id = parts[i] ? strmap_get(by_text, (const uint8_t *)parts[i], strlen(parts[i])) : -1;
        if (id < 0) return fail(err, "tokenizer import: merge %d is malformed or names a token not in the vocabulary", i / 2);
        s->merges[i] = id;
    }
    return 0;
}

// ---------------------------------------------------------------- Hugging Face

static char *read_file(const char *dir, const char *name, int required, char *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!required && access(path, F_OK) != 0) return NULL;
    return read_text_file(path, err); // regular files only, bounded: a FIFO cannot hang us
}

static cJSON *read_json(const char *dir, const char *name, int required, char *err) {
    char *text = read_file(dir, name, required, err);
    if (!text) return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) snprintf(err, TOK_ERR_LEN, "tokenizer import: %.160s/%s is not valid JSON", dir, name);
    return j;
}

static const cJSON *get(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key); }
static const char *get_str(const cJSON *o, const char *key) {
    const cJSON *v = get(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
static int is_type(const cJSON *o, const char *type) {
    const char *t = get_str(o, "type");
    return t && strcmp(t, type) == 0;
}
static int get_int(const cJSON *v, int *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= MAX_VOCAB ||
        v->valuedouble != (double)(int)v->valuedouble)
        return -1;
    *out = (int)v->valuedouble;
    return 0;
}

// A pipeline step as a list: the steps of a Sequence, or the one step itself.
static const cJSON *steps(const cJSON *node, const char *list_key, int *n) {
    if (is_type(node, "Sequence")) {
        const cJSON *l = get(node, list_key);
        *n = cJSON_IsArray(l) ? cJSON_GetArraySize(l) : 0;
        return l ? l->child : NULL;
    }
    *n = node && !cJSON_IsNull(node) ? 1 : 0;
    return node;
}

static int byte_level_ok(const cJSON *b, int use_regex) {
    return is_type(b, "ByteLevel") && !cJSON_IsTrue(get(b, "add_prefix_space")) &&
           cJSON_IsTrue(get(b, "use_regex")) == use_regex;
}

static int hf_pretok(TokenizerSpec *s, const cJSON *tj, char *err) {
    int n;
    const cJSON *a = steps(get(tj, "pre_tokenizer"), "pretokenizers", &n), *b = n == 2 ? a->next : NULL;
    if (n == 2 && is_type(a, "Split") && byte_level_ok(b, 0)) {
        const char *re = get_str(get(a, "pattern"), "Regex"), *beh = get_str(a, "behavior");
        if (!re || !beh || strcmp(beh, "Isolated") != 0 || cJSON_IsTrue(get(a, "invert")))
            return fail(err, "tokenizer import: unsupported Split pre-tokenizer (need an Isolated regex)");
        if (strcmp(re, LLAMA3_RE) == 0) s->pretok = TOK_PRE_LLAMA3;
        else if (strcmp(re, QWEN2_RE) == 0) s->pretok = TOK_PRE_QWEN2;
        else return fail(err, "tokenizer import: unsupported pre-tokenizer regex %.120s", re);
        return 0;
    }
    if (n == 2 && is_type(a, "Digits") && cJSON_IsTrue(get(a, "individual_digits")) && byte_level_ok(b, 1)) {
        s->pretok = TOK_PRE_GPT2;
        return 0;
    }
    if (n == 1 && byte_level_ok(a, 1))
        return fail(err, "tokenizer import: plain GPT-2 pre-tokenizer (multi-digit numbers) is not supported; "
                         "TOK_PRE_GPT2 is SmolLM2's digit-splitting variant");
    return fail(err, "tokenizer import: unsupported pre_tokenizer (need Llama 3, Qwen 2 or SmolLM2 byte-level)");
}

static int hf_normalizer(TokenizerSpec *s, const cJSON *tj, char *err) {
    int n;
    const cJSON *st = steps(get(tj, "normalizer"), "normalizers", &n);
    for (int i = 0; i < n; i++, st = st->next) {
        if (!is_type(st, "NFC")) {
            const char *t = get_str(st, "type");
            return fail(err, "tokenizer import: unsupported normalizer %.80s (only NFC)", t ? t : "?");
        }
        s->normalize_nfc = 1;
    }
    return 0;
}

static int hf_model_checks(const cJSON *model, char *err) {
    const char *type = get_str(model, "type");
    if (!type || strcmp(type, "BPE") != 0)
        return fail(err, "tokenizer import: unsupported tokenizer model type %.80s (only byte-level BPE)", type ? type : "?");
    if (cJSON_IsTrue(get(model, "byte_fallback")))
        return fail(err, "tokenizer import: BPE byte_fallback is not supported");
    const char *pre = get_str(model, "continuing_subword_prefix"), *suf = get_str(model, "end_of_word_suffix");
    if ((pre && *pre) || (suf && *suf))
        return fail(err, "tokenizer import: BPE subword prefixes / suffixes are not supported");
    const cJSON *drop = get(model, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble != 0.0)
        return fail(err, "tokenizer import: BPE dropout is not supported");
    const char *unk = get_str(model, "unk_token");
    if (unk && *unk) // with every byte in the vocabulary the unknown token is never produced
        return fail(err, "tokenizer import: BPE unk_token is not supported (byte-level vocabularies need none)");
    return 0;
}

// The text of an AddedToken-or-string field of tokenizer_config.json, or NULL.
static const char *token_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    return cJSON_IsObject(v) ? get_str(v, "content") : NULL;
}

// Does the post-processor (a TemplateProcessing, possibly inside a Sequence) start with bos?
static int template_adds(const cJSON *tj, const char *bos) {
    int n;
    const cJSON *st = steps(get(tj, "post_processor"), "processors", &n);
    for (int i = 0; i < n; i++, st = st->next) {
        const cJSON *single = get(st, "single");
        if (!is_type(st, "TemplateProcessing") || !cJSON_IsArray(single) || !single->child) continue;
        const char *first = get_str(get(single->child, "SpecialToken"), "id");
        if (first && strcmp(first, bos) == 0) return 1;
    }
    return 0;
}

// Merges are "left right" strings (older files) or ["left", "right"] pairs.
static int hf_merges(TokenizerSpec *s, const cJSON *model, const StrMap *by_text, char *err) {
    const cJSON *ml = get(model, "merges");
    if (!cJSON_IsArray(ml)) return fail(err, "tokenizer import: tokenizer.json model has no merges list");
    int n = cJSON_GetArraySize(ml), r = 0;
    const char **parts = calloc(2 * (size_t)n + 2, sizeof *parts);
    if (!parts) return fail(err, "tokenizer import: out of memory");
    for (cJSON *m = ml->child; m; m = m->next, r++) {
        if (cJSON_IsString(m)) {
            char *sp = strchr(m->valuestring + (m->valuestring[0] != 0), ' ');
            if (sp && !strchr(sp + 1, ' ')) {
                *sp = '\0'; // cut in place: the JSON tree is ours and freed right after
                parts[2 * r] = m->valuestring;
                parts[2 * r + 1] = sp + 1;
            }
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            parts[2 * r] = m->child->valuestring;
            parts[2 * r + 1] = m->child->next->valuestring;
        }
    }
    int rc = set_merges(s, n, by_text, parts, err);
    free(parts);
    return rc;
}

// Vocabulary, added tokens and merges of tokenizer.json.
static int hf_vocab(TokenizerSpec *s, const cJSON *tj, char *err) {
    const cJSON *model = get(tj, "model"), *vocab = get(model, "vocab"), *added = get(tj, "added_tokens");
    if (!cJSON_IsObject(vocab)) return fail(err, "tokenizer import: tokenizer.json model has no vocab object");
    if (added && !cJSON_IsArray(added)) return fail(err, "tokenizer import: added_tokens is not a list");
    int max_id = -1, id;
    const cJSON *v;
    cJSON_ArrayForEach(v, vocab) {
        if (get_int(v, &id) < 0) return fail(err, "tokenizer import: bad id for vocab entry %.80s", v->string);
        if (id > max_id) max_id = id;
    }
    cJSON_ArrayForEach(v, added) {
        if (get_int(get(v, "id"), &id) < 0 || !get_str(v, "content"))
            return fail(err, "tokenizer import: malformed added_tokens entry");
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) return fail(err, "tokenizer import: empty vocabulary");
    if (alloc_tokens(s, max_id + 1, err) < 0) return -1;
    StrMap by_text;
    if (strmap_init(&by_text, (size_t)cJSON_GetArraySize(vocab)) < 0)
        return fail(err, "tokenizer import: out of memory");
    int rc = 0;
    cJSON_ArrayForEach(v, vocab) {
        get_int(v, &id);
        if (s->tokens[id]) {
            rc = fail(err, "tokenizer import: two vocab entries share an id (%.80s)", v->string);
            break;
        }
        if ((rc = set_token(s, id, v->string, 1, TOK_TYPE_NORMAL, err)) < 0) break;
        strmap_put(&by_text, (const uint8_t *)v->string, (uint32_t)strlen(v->string), id);
    }
    if (rc == 0) rc = hf_merges(s, model, &by_text, err);
    strmap_free(&by_text);
    if (rc < 0) return -1;
    cJSON_ArrayForEach(v, added) {
        const char *flag[] = {"lstrip", "rstrip", "single_word"};
        for (int k = 0; k < 3; k++)
            if (cJSON_IsTrue(get(v, flag[k])))
                return fail(err, "tokenizer import: added token flag %s is not supported", flag[k]);
        get_int(get(v, "id"), &id);
        int type = cJSON_IsTrue(get(v, "special")) ? TOK_TYPE_SPECIAL : TOK_TYPE_ADDED;
        if (set_token(s, id, get_str(v, "content"), 0, type, err) < 0) return -1;
    }
    return 0;
}

// tokenizer_config.json: BOS, EOS, add_bos_token, the chat template. Optional for SentencePiece
// (the model proto names BOS and EOS itself), required for byte-level BPE (tj: its tokenizer.json).
static int hf_config(TokenizerSpec *s, const cJSON *tj, const char *dir, char *err) {
    int required = s->kind == TOK_KIND_BPE;
    err[0] = '\0';
    cJSON *cfg = read_json(dir, "tokenizer_config.json", required, err);
    if (!cfg) return required || err[0] ? -1 : 0;
    int rc = 0;
    const char *bos = token_text(get(cfg, "bos_token")), *eos = token_text(get(cfg, "eos_token"));
    if (bos) s->bos_id = find_token(s, bos);
    if (bos && s->bos_id < 0) rc = fail(err, "tokenizer import: bos_token %.80s is not a token", bos);
    const cJSON *ab = get(cfg, "add_bos_token");
    if (cJSON_IsBool(ab)) s->add_bos = cJSON_IsTrue(ab);
    else if (bos && s->kind == TOK_KIND_BPE) // Meta's Llama 3 prepends <|begin_of_text|> even where the JSON has no template for it
        s->add_bos = template_adds(tj, bos) || strcmp(bos, "<|begin_of_text|>") == 0;
    s->add_bos &= s->bos_id >= 0;
    if (rc == 0 && eos) {
        int id = find_token(s, eos);
        rc = id < 0 ? fail(err, "tokenizer import: eos_token %.80s is not a token", eos) : add_eos(s, id, err);
    }
    const cJSON *tpl = get(cfg, "chat_template");
    if (cJSON_IsArray(tpl)) { // the older list of named templates: take "default"
        const cJSON *t = tpl->child;
        while (t && !(get_str(t, "name") && strcmp(get_str(t, "name"), "default") == 0)) t = t->next;
        tpl = t ? get(t, "template") : NULL;
    }
    if (rc == 0 && cJSON_IsString(tpl)) rc = set_template(s, tpl->valuestring, err);
    cJSON_Delete(cfg);
    if (rc == 0 && !s->chat_template) { // newer transformers save the template beside the config
        char *text = read_file(dir, "chat_template.jinja", 0, err);
        if (text) {
            rc = set_template(s, text, err);
            free(text);
        }
    }
    return rc;
}

static int hf_generation_config(TokenizerSpec *s, const char *dir, char *err) {
    char ignored[TOK_ERR_LEN];
    char *text = read_file(dir, "generation_config.json", 0, ignored);
    if (!text) return 0; // optional
    cJSON *g = cJSON_Parse(text);
    free(text);
    if (!g) return fail(err, "tokenizer import: %.180s/generation_config.json is not valid JSON", dir);
    const cJSON *e = get(g, "eos_token_id");
    const cJSON *one = cJSON_IsArray(e) ? e->child : cJSON_IsNull(e) ? NULL : e; // an int or a list
    int rc = 0, id;
    for (; one && rc == 0; one = cJSON_IsArray(e) ? one->next : NULL)
        rc = get_int(one, &id) < 0 ? fail(err, "tokenizer import: bad eos_token_id in %.180s/generation_config.json", dir)
                                   : add_eos(s, id, err);
    cJSON_Delete(g);
    return rc;
}

// SentencePiece when dir has a tokenizer.model and its tokenizer.json is absent or not byte-level
// (Llama 2's is a byte-fallback BPE converted from the .model): the library then encodes exactly.
static int hf_spm(TokenizerSpec *s, const char *dir, char *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    int rc = tokspec_spm_vocab(s, path, err);
    if (rc == 0) rc = hf_config(s, NULL, dir, err);
    return rc;
}

// Byte-level BPE from tokenizer.json (and tokenizer_config.json).
static int hf_bpe(TokenizerSpec *s, const cJSON *tj, const char *dir, char *err) {
    const cJSON *model = get(tj, "model");
    int rc = hf_model_checks(model, err);
    if (rc == 0) rc = hf_pretok(s, tj, err);
    if (rc == 0) rc = hf_normalizer(s, tj, err);
    if (rc == 0 && !is_type(get(tj, "decoder"), "ByteLevel"))
        rc = fail(err, "tokenizer import: unsupported decoder (need ByteLevel)");
    if (rc == 0) {
        s->ignore_merges = cJSON_IsTrue(get(model, "ignore_merges"));
        rc = hf_vocab(s, tj, err);
    }
    if (rc == 0) rc = hf_config(s, tj, dir, err);
    return rc;
}

int tokspec_from_hf_dir(TokenizerSpec *s, const char *dir, char *err) {
    memset(s, 0, sizeof *s);
    s->kind = TOK_KIND_BPE;
    s->bos_id = -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    int have_model = access(path, F_OK) == 0; // not opened here: a FIFO would block
    cJSON *tj = read_json(dir, "tokenizer.json", !have_model, err);
    if (!tj && !have_model) return -1;
    int rc = have_model && (!tj || !is_type(get(tj, "decoder"), "ByteLevel")) ? hf_spm(s, dir, err) : hf_bpe(s, tj, dir, err);
    cJSON_Delete(tj);
    if (rc == 0) rc = hf_generation_config(s, dir, err);
    if (rc == 0 && s->n_eos == 0) rc = fail(err, "tokenizer import: no EOS token in %.200s", dir);
    if (rc < 0) tokspec_free(s);
    return rc;
}

// ---------------------------------------------------------------- GGUF

static int gguf_pretok(TokenizerSpec *s, const char *pre, char *err) {
    if (!pre) return fail(err, "tokenizer import: GGUF tokenizer has no tokenizer.ggml.pre");
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) {
        s->pretok = TOK_PRE_LLAMA3;
        s->ignore_merges = 1;
    } else if (!strcmp(pre, "qwen2")) {
        s->pretok = TOK_PRE_QWEN2;
        s->normalize_nfc = 1; // as HF's Qwen tokenizer (llama.cpp skips it)
    } else if (!strcmp(pre, "smollm")) {
        s->pretok = TOK_PRE_GPT2;
    } else if (!strcmp(pre, "gpt2") || !strcmp(pre, "default")) {
        return fail(err, "tokenizer import: GGUF pre-tokenizer %s (multi-digit numbers) is not supported; "
                         "TOK_PRE_GPT2 is SmolLM2's digit-splitting variant", pre);
    } else {
        return fail(err, "tokenizer import: unknown GGUF pre-tokenizer %.100s", pre);
    }
    return 0;
}

static int gguf_tokens(TokenizerSpec *s, const GgufTokenizerMeta *m, StrMap *by_text, char *err) {
    // GGUF types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    static const int type_of[7] = {-1, TOK_TYPE_NORMAL, TOK_TYPE_SPECIAL, TOK_TYPE_SPECIAL, TOK_TYPE_ADDED,
                                   TOK_TYPE_UNUSED, TOK_TYPE_BYTE};
    for (int i = 0; i < m->n_tokens; i++) {
        int gt = m->token_types ? m->token_types[i] : 1;
        int type = gt >= 1 && gt <= 6 ? type_of[gt] : -1;
        if (!m->tokens[i] || type < 0)
            return fail(err, "tokenizer import: GGUF token %d is missing or has unknown type %d", i, gt);
        // Control and user-defined tokens are stored as plain text, the rest byte-level encoded.
        if (set_token(s, i, m->tokens[i], type != TOK_TYPE_SPECIAL && type != TOK_TYPE_ADDED, type, err) < 0)
            return -1;
        strmap_put(by_text, (const uint8_t *)m->tokens[i], (uint32_t)strlen(m->tokens[i]), i);
    }
    return 0;
}

// GGUF merges are "left right" strings, split as llama.cpp does: at the first space after the
// first byte.
static int gguf_merges(TokenizerSpec *s, const GgufTokenizerMeta *m, const StrMap *by_text, char *err) {
    size_t total = 0;
    for (int r = 0; r < m->n_merges; r++) total += m->merges[r] ? strlen(m->merges[r]) + 1 : 0;
    const char **parts = calloc(2 * (size_t)m->n_merges + 2, sizeof *parts);
    char *cut = malloc(total + 1), *p = cut;
    int rc = parts && cut ? 0 : fail(err, "tokenizer import: out of memory");
    for (int r = 0; rc == 0 && r < m->n_merges; r++) {
        if (!m->merges[r]) continue;
        size_t n = strlen(m->merges[r]);
        memcpy(p, m->merges[r], n + 1);
        char *sp = n > 1 ? strchr(p + 1, ' ') : NULL;
        if (sp) {
            *sp = '\0';
            parts[2 * r] = p;
            parts[2 * r + 1] = sp + 1;
        }
        p += n + 1;
    }
    if (rc == 0) rc = set_merges(s, m->n_merges, by_text, parts, err);
    free(parts);
    free(cut);
    return rc;
}

int tokspec_from_gguf(TokenizerSpec *s, const GgufTokenizerMeta *m, char *err) {
    memset(s, 0, sizeof *s);
    s->kind = TOK_KIND_BPE;
    if (m->model && strcmp(m->model, "llama") == 0) // its tokens and scores are not a model proto
        return fail(err, "tokenizer import: GGUF SentencePiece tokenizers (model \"llama\") are not supported; "
                         "export the Hugging Face directory with its tokenizer.model instead");
    if (!m->model || strcmp(m->model, "gpt2") != 0)
        return fail(err, "tokenizer import: GGUF tokenizer model %.100s is not supported (byte-level BPE \"gpt2\" only)",
                    m->model ? m->model : "(missing)");
    if (gguf_pretok(s, m->pre, err) < 0) return -1;
    if (m->n_tokens <= 0 || m->n_tokens > MAX_VOCAB || !m->tokens || m->n_merges < 0 || (m->n_merges && !m->merges) ||
        m->n_eos < 0 || (m->n_eos && !m->eos_ids))
        return fail(err, "tokenizer import: GGUF tokenizer metadata has missing arrays or bad counts");
    StrMap by_text;
    if (alloc_tokens(s, m->n_tokens, err) < 0) goto bad;
    if (strmap_init(&by_text, (size_t)m->n_tokens) < 0) {
        fail(err, "tokenizer import: out of memory");
        goto bad;
    }
    int rc = gguf_tokens(s, m, &by_text, err);
    if (rc == 0) rc = gguf_merges(s, m, &by_text, err);
    strmap_free(&by_text);
    if (rc < 0) goto bad;
    s->bos_id = m->bos_id;
    if (s->bos_id < -1 || s->bos_id >= s->n_tokens) {
        fail(err, "tokenizer import: GGUF BOS id %d out of range", m->bos_id);
        goto bad;
    }
    s->add_bos = m->add_bos >= 0 ? m->add_bos != 0 : s->pretok == TOK_PRE_LLAMA3; // llama.cpp's default
    s->add_bos &= s->bos_id >= 0;
    for (int i = 0; i < m->n_eos; i++)
        if (add_eos(s, m->eos_ids[i], err) < 0) goto bad;
    if (s->n_eos == 0) {
        fail(err, "tokenizer import: GGUF tokenizer has no EOS id");
        goto bad;
    }
    if (set_template(s, m->chat_template, err) < 0) goto bad;
    return 0;
bad:
    tokspec_free(s);
    return -1;
}
