// Fuzzes the chat-template renderer (tokenizer/chat.c): the template text (it comes from the
// model file: the renderer reads dates and default system prompts out of it) and the messages.
// Input: byte 0 bits 0-1 the family (ChatML, Llama 3, Qwen3, none), bits 2-3 thinking (default,
// off, on), bit 4 a --date, bit 5 the vocabulary (tiny-llama31's, else tiny-qwen3's); then
// NUL-separated pieces: the template, then messages, each a role byte ('S' system, 'U' user,
// 'A' assistant, other: an invalid role) followed by the content. What renders is tokenized with
// special tokens parsed, as ./run --chat does.
#include "../../tokenizer/chat.h"
#include "../../weights/tokenizer_import.h"
#include "fuzz_tok.h"

#define MAX_MSG 64

static TokenizerSpec specs[2];

static void cleanup(void) {
    tokspec_free(&specs[0]);
    tokspec_free(&specs[1]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dirs[2] = {REPO_ROOT "/tests/data/tiny-qwen3", REPO_ROOT "/tests/data/tiny-llama31"};
    for (int i = 0; i < 2; i++) {
        char err[TOK_ERR_LEN];
        if (tokspec_from_hf_dir(&specs[i], dirs[i], err) != 0) {
            fprintf(stderr, "fuzz_chat: %s\n", err);
            abort();
        }
    }
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const int kinds[4] = {TOK_CHAT_CHATML, TOK_CHAT_LLAMA3, TOK_CHAT_QWEN3, TOK_CHAT_NONE};
    static const int thinks[4] = {-1, 0, 1, -1};
    // The pieces, NUL-terminated in a copy.
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    char *piece[MAX_MSG + 1];
    int n = 0;
    for (char *p = text; n <= MAX_MSG && p <= text + size - 1; p += strlen(p) + 1) piece[n++] = p;
    // A tokenizer of the chosen vocabulary with this template.
    TokenizerSpec s = specs[(data[0] >> 5) & 1];
    s.chat = kinds[data[0] & 3];
    s.chat_template = piece[0];
    char *sec = NULL, err[TOK_ERR_LEN];
    size_t sec_n = 0;
    FILE *mem = open_memstream(&sec, &sec_n);
    if (!mem) abort();
    int wrote = tokenizer_write(mem, &s, err) == 0;
    fclose(mem);
    Tokenizer *t = wrote ? tokenizer_load(sec, sec_n, err) : NULL;
    if (!t) { // a template with a NUL cannot be stored, so none reaches here; anything else is a bug
        fprintf(stderr, "fuzz_chat: %s\n", err);
        abort();
    }
    ChatMessage msgs[MAX_MSG];
    for (int i = 1; i < n; i++) {
        char r = piece[i][0];
        msgs[i - 1].role = r == 'S' ? "system" : r == 'U' ? "user" : r == 'A' ? "assistant" : "tool";
        msgs[i - 1].content = piece[i][0] ? piece[i] + 1 : piece[i];
    }
    ChatOptions o = {thinks[(data[0] >> 2) & 3], (data[0] >> 4) & 1 ? "1 Jan 2025" : NULL};
    char *conv = chat_render(t, msgs, n - 1, &o, err);
    if (conv) {
        fuzz_encode_check(t, conv, strlen(conv), 1, fuzz_tok_exact(t, conv, strlen(conv)));
        free(conv);
    } else {
        fuzz_check_err(err);
    }
    tokenizer_free(t);
    free(sec);
    free(text);
    return 0;
}
