// Unit tests of the tokenizer that need no Python: a small synthetic byte-level BPE vocabulary
// exercises merging order, added-token matching, serialization (round trip, truncated and
// corrupted sections), streaming decode of split UTF-8, ill-formed input, and the importers'
// refusals. One line per check; exits non-zero if any check fails.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tokenizer/tokenizer.h"
#include "../weights/tokenizer_import.h"

static int passed, failed;

static void check(int ok, const char *name) {
    printf("%s - %s\n", ok ? "ok" : "FAIL", name);
    if (ok) passed++;
    else failed++;
}

static void *need(void *p) {
    if (!p) {
        printf("FAIL - out of memory\n");
        exit(1);
    }
    return p;
}

// ---------------------------------------------------------------- a synthetic vocabulary

enum { AB = 256, BC, ABC, AA, CAB, SP_A, ADD_AB, EOT, N_TOK };
static const char *EXTRA[] = {"ab", "bc", "abc", "aa", "cab", "<a>", "<a>b", "<|eot|>"};
static const uint8_t EXTRA_TYPE[] = {0, 0, 0, 0, 0, TOK_TYPE_SPECIAL, TOK_TYPE_ADDED, TOK_TYPE_SPECIAL};
static const int32_t MERGES[][2] = {{'a', 'b'}, {'b', 'c'}, {AB, 'c'}, {'a', 'a'}};

static void make_spec(TokenizerSpec *s, int pretok, int ignore_merges) {
    memset(s, 0, sizeof *s);
    s->kind = TOK_KIND_BPE;
    s->pretok = pretok;
    s->ignore_merges = ignore_merges;
    s->add_bos = 1;
    s->bos_id = EOT;
    s->n_eos = 2;
    s->eos_ids[0] = EOT;
    s->eos_ids[1] = SP_A;
    s->chat = TOK_CHAT_CHATML;
    s->n_tokens = N_TOK;
    s->tokens = need(calloc(N_TOK, sizeof *s->tokens));
    s->token_len = need(calloc(N_TOK, sizeof *s->token_len));
    s->token_type = need(calloc(N_TOK, 1));
    for (int i = 0; i < N_TOK; i++) {
        const char *x = i < 256 ? NULL : EXTRA[i - 256];
        s->token_len[i] = i < 256 ? 1 : (int)strlen(x);
        s->tokens[i] = need(malloc((size_t)s->token_len[i]));
        if (i < 256) s->tokens[i][0] = (char)i;
        else memcpy(s->tokens[i], x, (size_t)s->token_len[i]);
        s->token_type[i] = i < 256 ? TOK_TYPE_NORMAL : EXTRA_TYPE[i - 256];
    }
    s->n_merges = 4;
    s->merges = need(malloc(sizeof MERGES));
    memcpy(s->merges, MERGES, sizeof MERGES);
    s->chat_template = need(strdup("{{ messages }}"));
}

// Serializes a spec into a malloc'd buffer.
static char *serialize(const TokenizerSpec *s, size_t *n) {
    char *buf = NULL, err[TOK_ERR_LEN];
    FILE *f = need(open_memstream(&buf, n));
    int rc = tokenizer_write(f, s, err);
    fclose(f);
    if (rc < 0) {
        printf("FAIL - tokenizer_write: %s\n", err);
        exit(1);
    }
    return buf;
}

static Tokenizer *build(int pretok, int ignore_merges, char **section) {
    TokenizerSpec s;
    make_spec(&s, pretok, ignore_merges);
    size_t n;
    *section = serialize(&s, &n);
    tokspec_free(&s);
    char err[TOK_ERR_LEN];
    Tokenizer *t = tokenizer_load(*section, n, err);
    if (!t) {
        printf("FAIL - tokenizer_load: %s\n", err);
        exit(1);
    }
    return t;
}

// Encodes text and compares with the expected ids (terminated by -1).
static int encodes_to(const Tokenizer *t, const char *text, int parse_special, const int *want) {
    int *ids, n_want = 0;
    char err[TOK_ERR_LEN];
    while (want[n_want] >= 0) n_want++;
    long n = tokenizer_encode(t, text, strlen(text), parse_special, &ids, err);
    int ok = n == n_want && memcmp(ids, want, (size_t)n_want * sizeof *ids) == 0;
    if (!ok) {
        printf("    %s ->", text);
        for (long i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n");
    }
    free(ids);
    return ok;
}

// ---------------------------------------------------------------- checks

static void test_bpe(void) {
    char *sec;
    Tokenizer *t = build(TOK_PRE_GPT2, 0, &sec);
    check(encodes_to(t, "abc", 1, (int[]){ABC, -1}), "bpe: merges apply in rank order (ab, then ab+c)");
    check(encodes_to(t, "aaa", 1, (int[]){AA, 'a', -1}), "bpe: equal ranks merge leftmost first");
    check(encodes_to(t, "aaaa", 1, (int[]){AA, AA, -1}), "bpe: merges repeat along the word");
    check(encodes_to(t, "bcab", 1, (int[]){BC, AB, -1}), "bpe: independent merges in one word");
    check(encodes_to(t, "abc abc", 1, (int[]){ABC, ' ', ABC, -1}), "bpe: pre-tokens merge separately");
    check(encodes_to(t, "cab", 1, (int[]){'c', AB, -1}), "bpe: whole-word token unused without ignore_merges");
    check(encodes_to(t, "", 1, (int[]){-1}), "encode: empty text gives no ids");
    tokenizer_free(t);
    free(sec);
    t = build(TOK_PRE_LLAMA3, 1, &sec);
    check(encodes_to(t, "cab", 1, (int[]){CAB, -1}), "bpe: ignore_merges emits a whole-word token");
    tokenizer_free(t);
    free(sec);
}

static void test_added_tokens(void) {
    char *sec;
    Tokenizer *t = build(TOK_PRE_GPT2, 0, &sec);
    check(encodes_to(t, "x<a>y", 1, (int[]){'x', SP_A, 'y', -1}), "added: special token split out");
    check(encodes_to(t, "<a>bc", 1, (int[]){ADD_AB, 'c', -1}), "added: the longest token at a position wins");
    check(encodes_to(t, "<|eot|><|eot|>", 1, (int[]){EOT, EOT, -1}), "added: adjacent special tokens");
    check(encodes_to(t, "<|eot", 1, (int[]){'<', '|', 'e', 'o', 't', -1}), "added: a partial token is text");
    check(encodes_to(t, "<a>x", 0, (int[]){'<', 'a', '>', 'x', -1}), "added: special is text without parse_special");
    check(encodes_to(t, "<a>bc", 0, (int[]){ADD_AB, 'c', -1}), "added: non-special still matched without parse_special");
    check(encodes_to(t, "ab<a>", 1, (int[]){AB, SP_A, -1}), "added: text before a token is encoded alone");
    tokenizer_free(t);
    free(sec);
}

static void test_round_trip(void) {
    TokenizerSpec s;
    make_spec(&s, TOK_PRE_QWEN2, 1);
    s.normalize_nfc = 1;
    size_t n;
    char *sec = serialize(&s, &n), err[TOK_ERR_LEN];
    Tokenizer *t = tokenizer_load(sec, n, err);
    int ok = t != NULL && tokenizer_n_tokens(t) == N_TOK && tokenizer_bos(t) == EOT && tokenizer_add_bos(t) == 1 &&
             tokenizer_is_eos(t, EOT) && tokenizer_is_eos(t, SP_A) && !tokenizer_is_eos(t, AB) &&
             tokenizer_chat(t) == TOK_CHAT_CHATML && tokenizer_chat_template(t) &&
             strcmp(tokenizer_chat_template(t), "{{ messages }}") == 0;
    for (int i = 0; ok && i < N_TOK; i++) {
        size_t len;
        const char *p = tokenizer_piece(t, i, &len);
        ok = p && len == (size_t)s.token_len[i] && memcmp(p, s.tokens[i], len) == 0;
    }
    check(ok, "serialize: every field and token survives write + load");
    check(t && tokenizer_token_id(t, "abc", 3) == ABC && tokenizer_token_id(t, "<|eot|>", 7) == EOT &&
              tokenizer_token_id(t, "zzz", 3) == -1, "serialize: vocabulary lookup after load");
    size_t len;
    check(t && tokenizer_piece(t, -1, &len) == NULL && tokenizer_piece(t, N_TOK, &len) == NULL && len == 0,
          "piece: ids out of range give NULL");
    tokenizer_free(t);

    // A spec the loader would refuse is never written.
    s.merges[0] = N_TOK + 5;
    char *buf = NULL;
    size_t bn;
    FILE *f = need(open_memstream(&buf, &bn));
    int rc = tokenizer_write(f, &s, err);
    fclose(f);
    check(rc < 0 && bn == 0 && strstr(err, "merge"), "serialize: write refuses a merge id out of range");
    free(buf);
    s.merges[0] = 'c', s.merges[1] = 'c'; // "cc" is not a token
    f = need(open_memstream(&buf, &bn));
    rc = tokenizer_write(f, &s, err);
    fclose(f);
    check(rc < 0 && strstr(err, "not in the vocabulary"), "serialize: write refuses a merge whose result is no token");
    free(buf);
    tokspec_free(&s);
    free(sec);
}

static void test_bad_sections(void) {
    char *sec;
    Tokenizer *ok_t = build(TOK_PRE_LLAMA3, 1, &sec);
    tokenizer_free(ok_t);
    TokenizerSpec s;
    make_spec(&s, TOK_PRE_LLAMA3, 1);
    size_t n;
    free(sec);
    sec = serialize(&s, &n);
    tokspec_free(&s);
    char err[TOK_ERR_LEN];
    int all = 1;
    for (size_t cut = 0; cut < n; cut++) { // every truncation
        err[0] = '\0';
        Tokenizer *t = tokenizer_load(sec, cut, err);
        if (t || !err[0]) all = 0;
        tokenizer_free(t);
    }
    check(all, "load: every truncated section is refused with a message");

    char *copy = need(malloc(n));
    srand(1234);
    int crashes_avoided = 1, refused = 0;
    for (int trial = 0; trial < 4000; trial++) { // bit flips: refused, or a tokenizer that works
        memcpy(copy, sec, n);
        size_t at = trial < 112 * 8 ? (size_t)trial / 8 : (size_t)rand() % n;
        copy[at] ^= (char)(1 << (trial % 8));
        Tokenizer *t = tokenizer_load(copy, n, err);
        if (!t) {
            refused++;
            continue;
        }
        int *ids;
        const char *text = "abc <a> x\xff\xc3 caab";
        long k = tokenizer_encode(t, text, strlen(text), 1, &ids, err);
        if (k >= 0) {
            char *d = tokenizer_decode(t, ids, (size_t)k);
            if (!d) crashes_avoided = 0;
            free(d);
            free(ids);
        }
        tokenizer_free(t);
    }
    check(crashes_avoided && refused > 0, "load: corrupted sections are refused or load into a working tokenizer");

    for (int trial = 0; trial < 1000; trial++) { // pure garbage, magic included sometimes
        for (size_t i = 0; i < n; i++) copy[i] = (char)rand();
        if (trial % 2) memcpy(copy, sec, 8);
        Tokenizer *t = tokenizer_load(copy, n, err);
        if (t) all = 0;
        tokenizer_free(t);
    }
    check(all, "load: random garbage is refused");
    memcpy(copy, sec, n);
    copy[4] = 9;
    check(!tokenizer_load(copy, n, err) && strstr(err, "version"), "load: unknown version refused by name");
    check(!tokenizer_load(NULL, 0, err), "load: NULL section refused");
    free(copy);
    free(sec);
}

static void test_stream_decode(void) {
    char *sec;
    Tokenizer *t = build(TOK_PRE_GPT2, 0, &sec);
    char out[64];
    size_t cap = tokenizer_max_piece_len(t) + 16;
    const char *emoji = "\xF0\x9F\x98\x80";
    int ok = 1;
    TokDecoder d = {0};
    size_t got = 0;
    char text[16];
    for (int i = 0; i < 4; i++) { // a 4-byte character, one byte per token
        size_t m = tokenizer_decode_step(t, &d, (uint8_t)emoji[i], out, cap);
        if (i < 3 && m != 0) ok = 0; // nothing comes out before the character is complete
        memcpy(text + got, out, m);
        got += m;
    }
    got += tokenizer_decode_flush(t, &d, text + got, cap);
    if (got != 4 || memcmp(text, emoji, 4) != 0) ok = 0;
    check(ok, "decode: a character split across tokens comes out whole, once complete");

    d = (TokDecoder){0};
    size_t m = tokenizer_decode_step(t, &d, 0xC3, out, cap);
    m += tokenizer_decode_step(t, &d, 'A', out + m, cap);
    check(m == 4 && memcmp(out, "\xEF\xBF\xBD" "A", 4) == 0, "decode: a broken sequence becomes U+FFFD, the next byte stays");
    d = (TokDecoder){0};
    m = tokenizer_decode_step(t, &d, 0xE2, out, cap);
    m += tokenizer_decode_step(t, &d, 0x82, out + m, cap);
    m += tokenizer_decode_flush(t, &d, out + m, cap);
    check(m == 3 && memcmp(out, "\xEF\xBF\xBD", 3) == 0, "decode: flush turns a pending prefix into one U+FFFD");
    d = (TokDecoder){0};
    m = tokenizer_decode_step(t, &d, 0x80, out, cap);
    m += tokenizer_decode_step(t, &d, 0xF5, out + m, cap);
    m += tokenizer_decode_step(t, &d, ABC, out + m, cap);
    check(m == 9 && memcmp(out, "\xEF\xBF\xBD\xEF\xBF\xBD" "abc", 9) == 0, "decode: stray bytes become U+FFFD each");
    check(tokenizer_decode_step(t, &d, -3, out, cap) == 0 && tokenizer_decode_step(t, &d, N_TOK, out, cap) == 0,
          "decode: unknown ids are skipped");
    int ids[] = {0xE4, 0xBD, 'x', 0xE4, 0xBD, 0xA0, EOT, 0xE4};
    char *whole = tokenizer_decode(t, ids, 8);
    check(whole && strcmp(whole, "\xEF\xBF\xBDx\xE4\xBD\xA0<|eot|>\xEF\xBF\xBD") == 0,
          "decode: one-shot decode replaces as HF does (from_utf8_lossy)");
    free(whole);
    tokenizer_free(t);
    free(sec);
}

static void test_ill_formed_input(void) {
    static const int variants[3] = {TOK_PRE_GPT2, TOK_PRE_LLAMA3, TOK_PRE_QWEN2};
    srand(99);
    int ok = 1;
    for (int v = 0; v < 3; v++) {
        TokenizerSpec s;
        make_spec(&s, variants[v], v == 1);
        s.normalize_nfc = v == 2;
        size_t n;
        char *sec = serialize(&s, &n), err[TOK_ERR_LEN];
        tokspec_free(&s);
        Tokenizer *t = tokenizer_load(sec, n, err);
        for (int trial = 0; t && trial < 2000; trial++) {
            char text[64];
            size_t len = (size_t)(rand() % 64);
            for (size_t i = 0; i < len; i++) text[i] = (char)(rand() % 4 ? rand() : " \n'\xcc"[rand() % 4]);
            int *ids;
            long k = tokenizer_encode(t, text, len, 0, &ids, err);
            // Every byte is a token here, so the pieces give back the input exactly (NFC aside).
            size_t got = 0;
            char back[256];
            for (long i = 0; k >= 0 && i < k; i++) {
                size_t pl;
                const char *p = tokenizer_piece(t, ids[i], &pl);
                if (got + pl <= sizeof back) memcpy(back + got, p, pl);
                got += pl;
            }
            if (k < 0 || (v != 2 && (got != len || memcmp(back, text, len) != 0))) ok = 0;
            free(ids);
        }
        if (!t) ok = 0;
        tokenizer_free(t);
        free(sec);
    }
    check(ok, "encode: ill-formed UTF-8 is encoded byte for byte in every variant, no crash");
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = need(fopen(path, "w"));
    fputs(text, f);
    fclose(f);
}

static void test_hf_import_errors(void) {
    TokenizerSpec s;
    char err[TOK_ERR_LEN], dir[] = "/tmp/tok_test_XXXXXX";
    check(tokspec_from_hf_dir(&s, "/nonexistent/dir", err) < 0 && strstr(err, "cannot open"),
          "import: missing directory gives a message");
    if (!mkdtemp(dir)) {
        check(0, "import: mkdtemp");
        return;
    }
    static const char *BASE =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\xc4\xa0\": 3},"
        " \"merges\": [\"a b\"]}, \"added_tokens\": [{\"id\": 4, \"content\": \"<e>\", \"special\": true}],"
        " \"normalizer\": null, \"decoder\": {\"type\": \"ByteLevel\"}, \"pre_tokenizer\": {\"type\": \"Sequence\","
        " \"pretokenizers\": [{\"type\": \"Digits\", \"individual_digits\": true}, {\"type\": \"ByteLevel\","
        " \"add_prefix_space\": false, \"use_regex\": true}]}}";
    write_file(dir, "tokenizer.json", BASE);
    write_file(dir, "tokenizer_config.json", "{\"eos_token\": \"<e>\", \"chat_template\": \"<|im_start|>\"}");
    int rc = tokspec_from_hf_dir(&s, dir, err);
    check(rc == 0 && s.n_tokens == 5 && s.pretok == TOK_PRE_GPT2 && s.n_merges == 1 && s.merges[0] == 0 &&
              s.merges[1] == 1 && s.token_len[3] == 1 && s.tokens[3][0] == ' ' && s.token_type[4] == TOK_TYPE_SPECIAL &&
              s.n_eos == 1 && s.eos_ids[0] == 4 && s.bos_id == -1 && s.chat == TOK_CHAT_CHATML,
          "import: minimal SmolLM2-style tokenizer.json (byte-level mapping undone)");
    if (rc == 0) tokspec_free(&s);
    write_file(dir, "generation_config.json", "{\"eos_token_id\": [2, 4, 3]}");
    rc = tokspec_from_hf_dir(&s, dir, err);
    check(rc == 0 && s.n_eos == 3 && s.eos_ids[0] == 4 && s.eos_ids[1] == 2 && s.eos_ids[2] == 3,
          "import: generation_config.json EOS ids merged");
    if (rc == 0) tokspec_free(&s);
    write_file(dir, "generation_config.json", "{\"eos_token_id\": 77}");
    check(tokspec_from_hf_dir(&s, dir, err) < 0 && strstr(err, "EOS"), "import: EOS id out of range refused");
    char path[600];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    unlink(path);

    static const struct { const char *what, *from, *to, *msg; } BAD[] = {
        {"a Unigram model", "\"BPE\"", "\"Unigram\"", "model type"},
        {"a merge of an unknown token", "\"merges\": [\"a b\"]", "\"merges\": [\"a zz\"]", "merge 0"},
        {"a one-part merge", "\"merges\": [\"a b\"]", "\"merges\": [[\"a\"]]", "merge 0"},
        {"an unknown pre-tokenizer", "\"Digits\"", "\"Punctuation\"", "pre_tokenizer"},
        {"an NFKC normalizer", "\"normalizer\": null", "\"normalizer\": {\"type\": \"NFKC\"}", "NFKC"},
        {"an lstrip added token", "\"special\": true", "\"special\": true, \"lstrip\": true", "lstrip"},
        {"a negative id", "\"vocab\": {\"a\": 0", "\"vocab\": {\"a\": -4", "bad id"},
        {"a Metaspace decoder", "{\"type\": \"ByteLevel\"}", "{\"type\": \"Metaspace\"}", "decoder"},
        {"add_prefix_space", "\"add_prefix_space\": false", "\"add_prefix_space\": true", "pre_tokenizer"},
        {"an added token without content", "\"added_tokens\": [", "\"added_tokens\": [{\"id\": 9},", "added_tokens"},
        {"truncated JSON", "}}", "}", "JSON"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        char text[2048], name[128];
        const char *at = strstr(BASE, BAD[i].from);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - BASE), BASE, BAD[i].to, at + strlen(BAD[i].from));
        write_file(dir, "tokenizer.json", text);
        err[0] = '\0';
        rc = tokspec_from_hf_dir(&s, dir, err);
        snprintf(name, sizeof name, "import: refuses %s with a one-line message", BAD[i].what);
        check(rc < 0 && strstr(err, BAD[i].msg) && !strchr(err, '\n'), name);
        if (rc == 0) tokspec_free(&s);
    }
    write_file(dir, "tokenizer.json", BASE);
    write_file(dir, "tokenizer_config.json", "{\"eos_token\": \"<nope>\"}");
    check(tokspec_from_hf_dir(&s, dir, err) < 0 && strstr(err, "<nope>"), "import: unknown eos_token refused");
    write_file(dir, "tokenizer_config.json", "{\"bos_token\": \"<e>\"}");
    check(tokspec_from_hf_dir(&s, dir, err) < 0 && strstr(err, "no EOS"), "import: tokenizer without EOS refused");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("    (could not remove %s)\n", dir);
}

static void test_gguf_import(void) {
    // GGUF stores byte-level strings: "\xc4\xa0" is the space byte.
    const char *tokens[] = {"<|endoftext|>", "a", "b", "ab", "\xc4\xa0", ("\xc4\xa0" "ab")};
    const int32_t types[] = {3, 1, 1, 1, 1, 1};
    const char *merges[] = {"a b", "\xc4\xa0 ab"};
    const int eos[] = {0};
    GgufTokenizerMeta m = {.model = "gpt2", .pre = "smollm", .n_tokens = 6, .tokens = tokens, .token_types = types,
                           .n_merges = 2, .merges = merges, .bos_id = -1, .n_eos = 1, .eos_ids = eos,
                           .add_bos = -1, .chat_template = "<|im_start|>x<think>"};
    TokenizerSpec s;
    char err[TOK_ERR_LEN];
    int rc = tokspec_from_gguf(&s, &m, err);
    check(rc == 0 && s.pretok == TOK_PRE_GPT2 && s.token_len[5] == 3 && memcmp(s.tokens[5], " ab", 3) == 0 &&
              s.token_type[0] == TOK_TYPE_SPECIAL && s.merges[2] == 4 && s.merges[3] == 3 && s.add_bos == 0 &&
              s.chat == TOK_CHAT_QWEN3 && s.n_eos == 1,
          "gguf: smollm metadata imported, byte-level mapping undone");
    if (rc == 0) {
        size_t n;
        char *sec = serialize(&s, &n);
        Tokenizer *t = tokenizer_load(sec, n, err);
        check(t && encodes_to(t, "ab ab<|endoftext|>", 1, (int[]){3, 5, 0, -1}), "gguf: imported tokenizer encodes");
        tokenizer_free(t);
        free(sec);
        tokspec_free(&s);
    }
    m.pre = "llama-bpe";
    rc = tokspec_from_gguf(&s, &m, err);
    check(rc == 0 && s.pretok == TOK_PRE_LLAMA3 && s.ignore_merges == 1, "gguf: llama-bpe is the Llama 3 variant");
    if (rc == 0) tokspec_free(&s);
    m.pre = "qwen2";
    rc = tokspec_from_gguf(&s, &m, err);
    check(rc == 0 && s.pretok == TOK_PRE_QWEN2 && s.normalize_nfc == 1, "gguf: qwen2 is the Qwen variant, with NFC");
    if (rc == 0) tokspec_free(&s);
    m.pre = "falcon";
    check(tokspec_from_gguf(&s, &m, err) < 0 && strstr(err, "falcon"), "gguf: unknown pre-tokenizer refused by name");
    m.pre = "smollm";
    m.model = "llama";
    check(tokspec_from_gguf(&s, &m, err) < 0 && strstr(err, "SentencePiece") && strstr(err, "tokenizer.model"),
          "gguf: SentencePiece (\"llama\") vocabulary refused, naming the way that works");
    m.model = "gpt2";
    merges[1] = "\xc4\xa0 zz";
    check(tokspec_from_gguf(&s, &m, err) < 0 && strstr(err, "merge 1"), "gguf: merge of an unknown token refused");
    merges[1] = "\xc4\xa0 ab";
    m.n_eos = 0;
    check(tokspec_from_gguf(&s, &m, err) < 0 && strstr(err, "EOS"), "gguf: missing EOS refused");
    m.n_eos = 1;
    m.bos_id = 6;
    check(tokspec_from_gguf(&s, &m, err) < 0 && strstr(err, "BOS"), "gguf: BOS out of range refused");
}

int main(void) {
    test_bpe();
    test_added_tokens();
    test_round_trip();
    test_bad_sections();
    test_stream_decode();
    test_ill_formed_input();
    test_hf_import_errors();
    test_gguf_import();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
