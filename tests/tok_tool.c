// Command-line access to the tokenizer for the Python comparison tests and the benchmark.
//   tok_tool HF_DIR FILE                 ids of FILE's text (special tokens parsed, no BOS), one line
//   tok_tool HF_DIR --lines FILE         one line of ids per text; FILE holds texts each followed
//                                        by a line __ggml_vocab_test__ (llama.cpp's vector format)
//   tok_tool HF_DIR --decode IDS...      the decoded text
//   tok_tool HF_DIR --decode-lines FILE  each line of ids decoded, in the --lines text format
//                                        (streaming decoder; checked against tokenizer_decode)
//   tok_tool HF_DIR --pretok-lines FILE  per text, the byte offsets where pre-tokens end (the
//                                        bare pre-tokenizer: no added tokens, no normalizer)
//   tok_tool HF_DIR --bench FILE         seconds spent encoding FILE, and the id count
// The tokenizer goes through tokenizer_write / tokenizer_load, as ./run gets it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tokenizer/tok_internal.h"
#include "../tokenizer/tokenizer.h"
#include "../weights/tokenizer_import.h"

static const char SEP[] = "\n__ggml_vocab_test__\n";

static void die(const char *what, const char *msg) {
    fprintf(stderr, "tok_tool: %s: %s\n", what, msg);
    exit(1);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path, "cannot open");
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (size_t got; buf && (got = fread(buf + len, 1, cap - len, f)) > 0;) {
        len += got;
        if (len == cap && !(buf = realloc(buf, (cap *= 2) + 1))) break;
    }
    fclose(f);
    if (!buf) die(path, "out of memory");
    buf[len] = '\0';
    *n = len;
    return buf;
}

// The section stays in *sec, which must outlive the tokenizer.
static Tokenizer *load(const char *dir, char **sec) {
    char err[TOK_ERR_LEN];
    TokenizerSpec spec;
    if (tokspec_from_hf_dir(&spec, dir, err) < 0) die(dir, err);
    size_t n = 0;
    *sec = NULL;
    FILE *mem = open_memstream(sec, &n);
    if (!mem) die(dir, "open_memstream failed");
    int rc = tokenizer_write(mem, &spec, err);
    fclose(mem);
    tokspec_free(&spec);
    if (rc < 0) die(dir, err);
    Tokenizer *t = tokenizer_load(*sec, n, err);
    if (!t) die(dir, err);
    return t;
}

static void print_cuts(const Tokenizer *t, const char *text, size_t len) {
    PretokScratch s = {0};
    long n = pretokenize(t->pretok, (const uint8_t *)text, len, &s);
    if (n < 0) die("pretokenize", "out of memory");
    for (long i = 1; i <= n; i++) printf(i > 1 ? " %u" : "%u", s.cut[i]);
    putchar('\n');
    pretok_scratch_free(&s);
}

static void print_ids(const Tokenizer *t, const char *text, size_t len) {
    char err[TOK_ERR_LEN];
    int *ids;
    long n = tokenizer_encode(t, text, len, 1, &ids, err);
    if (n < 0) die("encode", err);
    for (long i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    free(ids);
}

// Streams ids through the decoder and checks the result equals the one-shot decode.
static void decode_ids(const Tokenizer *t, const int *ids, size_t n) {
    size_t cap = tokenizer_max_piece_len(t) + 16, len = 0, size = 4 * cap;
    char *piece = malloc(cap), *text = malloc(size);
    if (!piece || !text) die("decode", "out of memory");
    TokDecoder d = {0};
    for (size_t i = 0; i < n; i++) {
        size_t m = tokenizer_decode_step(t, &d, ids[i], piece, cap);
        if (len + 2 * cap > size && !(text = realloc(text, size *= 2))) die("decode", "out of memory");
        memcpy(text + len, piece, m);
        len += m;
    }
    len += tokenizer_decode_flush(t, &d, text + len, cap);
    char *whole = tokenizer_decode(t, ids, n);
    if (!whole) die("decode", "out of memory");
    // Compared by bytes: the text may hold NULs (whole has room for them: 3 bytes per token byte).
    if (memcmp(whole, text, len) != 0 || whole[len] != '\0') die("decode", "streaming and one-shot decode differ");
    fwrite(text, 1, len, stdout);
    free(whole);
    free(text);
    free(piece);
}

static int *parse_ids(char *line, size_t *n) {
    size_t cap = 16;
    int *ids = malloc(cap * sizeof *ids);
    *n = 0;
    for (char *tok = strtok(line, " \t\r\n"); ids && tok; tok = strtok(NULL, " \t\r\n")) {
        if (*n == cap && !(ids = realloc(ids, (cap *= 2) * sizeof *ids))) break;
        ids[(*n)++] = atoi(tok);
    }
    if (!ids) die("ids", "out of memory");
    return ids;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tok_tool HF_DIR [--lines|--decode-lines|--bench] FILE | tok_tool HF_DIR --decode IDS...\n");
        return 2;
    }
    char *sec;
    Tokenizer *t = load(argv[1], &sec);
    const char *mode = argv[2];
    size_t n;
    if (!strcmp(mode, "--decode")) {
        int *ids = malloc((size_t)argc * sizeof *ids);
        if (!ids) die("decode", "out of memory");
        for (int i = 3; i < argc; i++) ids[i - 3] = atoi(argv[i]);
        decode_ids(t, ids, (size_t)(argc - 3));
        free(ids);
    } else if (argc == 4 && (!strcmp(mode, "--lines") || !strcmp(mode, "--pretok-lines"))) {
        void (*each)(const Tokenizer *, const char *, size_t) = mode[2] == 'l' ? print_ids : print_cuts;
        char *text = slurp(argv[3], &n), *p = text, *end = text + n, *sep;
        while (p < end && (sep = memmem(p, (size_t)(end - p), SEP, sizeof SEP - 1)) != NULL) {
            each(t, p, (size_t)(sep - p));
            p = sep + sizeof SEP - 1;
        }
        if (p < end) each(t, p, (size_t)(end - p));
        free(text);
    } else if (argc == 4 && !strcmp(mode, "--decode-lines")) {
        char *text = slurp(argv[3], &n), *end = text + n;
        for (char *line = text; line < end;) {
            char *nl = memchr(line, '\n', (size_t)(end - line));
            if (!nl) nl = end;
            *nl = '\0';
            size_t k;
            int *ids = parse_ids(line, &k);
            decode_ids(t, ids, k);
            fputs(SEP, stdout);
            free(ids);
            line = nl + 1;
        }
        free(text);
    } else if (argc == 4 && !strcmp(mode, "--bench")) {
        char *text = slurp(argv[3], &n), err[TOK_ERR_LEN];
        int *ids;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        long k = tokenizer_encode(t, text, n, 1, &ids, err);
        clock_gettime(CLOCK_MONOTONIC, &b);
        if (k < 0) die("encode", err);
        printf("%.6f %ld\n", (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec), k);
        free(ids);
        free(text);
    } else if (argc == 3) {
        char *text = slurp(argv[2], &n);
        print_ids(t, text, n);
        free(text);
    } else {
        fprintf(stderr, "tok_tool: unknown mode %s\n", mode);
        return 2;
    }
    tokenizer_free(t);
    free(sec);
    return 0;
}
