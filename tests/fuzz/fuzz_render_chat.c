// Fuzzes ./run --render-chat FILE: the JSON message list read by run.c's run_render_chat, rendered
// and tokenized with a real tokenizer and template. run.c reports bad input through die(), which
// exits; here exit() returns to the harness instead (longjmp), and the message must be one line.
// What die() leaves allocated on its way out is the process's to drop, so leak checking is off
// for the call (__lsan_disable); tests/test_chat_render.py covers leaks on the normal path.
// Input byte 0: bits 0-1 the tokenizer and template (tiny-qwen3's as Qwen3, tiny-llama31's as
// Llama 3, tiny-qwen3 as ChatML with SmolLM2's template), bits 2-3 thinking; the rest: the file.
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

static jmp_buf on_exit_jmp;
static int exit_status;
static void fuzz_exit(int status) {
    exit_status = status;
    longjmp(on_exit_jmp, 1);
}
#define exit(s) fuzz_exit(s)
#define main run_main
#include "../../run.c"
#undef main
#undef exit

#include "../../weights/tokenizer_import.h"
#include "fuzz_tok.h"

__attribute__((weak)) void __lsan_disable(void);
__attribute__((weak)) void __lsan_enable(void);

static Tokenizer *toks[3];
static char *sections[3];

static void cleanup(void) {
    for (int i = 0; i < 3; i++) tokenizer_free(toks[i]), free(sections[i]);
}

// A tokenizer from dir with the template of tpl_dir's tokenizer_config.json, as family kind.
static Tokenizer *load(int i, const char *dir, const char *tpl_dir, int kind) {
    TokenizerSpec s, tpl;
    char err[TOK_ERR_LEN];
    if (tokspec_from_hf_dir(&s, dir, err) != 0 || tokspec_from_hf_dir(&tpl, tpl_dir, err) != 0) goto bad;
    free(s.chat_template);
    s.chat_template = tpl.chat_template;
    tpl.chat_template = NULL;
    tokspec_free(&tpl);
    s.chat = kind;
    size_t n = 0;
    FILE *mem = open_memstream(&sections[i], &n);
    if (!mem || tokenizer_write(mem, &s, err) != 0 || fclose(mem) != 0) goto bad;
    tokspec_free(&s);
    Tokenizer *t = tokenizer_load(sections[i], n, err);
    if (t) return t;
bad:
    fprintf(stderr, "fuzz_render_chat: %s: %s\n", dir, err);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *qwen = REPO_ROOT "/tests/data/tiny-qwen3", *llama = REPO_ROOT "/tests/data/tiny-llama31";
    toks[0] = load(0, qwen, qwen, TOK_CHAT_QWEN3);
    toks[1] = load(1, llama, llama, TOK_CHAT_LLAMA3);
    toks[2] = load(2, qwen, REPO_ROOT "/tests/data/smollm2-tokenizer", TOK_CHAT_CHATML);
    atexit(cleanup);
    if (!freopen("/dev/null", "w", stdout)) abort(); // the ids run_render_chat prints
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    Options o = {0};
    o.render_chat = fuzz_memfd(data + 1, size - 1);
    o.think = (int[]){-1, 0, 1, -1}[(data[0] >> 2) & 3];
    const Tokenizer *t = toks[(data[0] & 3) % 3];
    if (__lsan_disable) __lsan_disable();
    if (setjmp(on_exit_jmp) == 0) run_render_chat(t, &o);
    else if (exit_status != 1) abort(); // die() is the only way out, with status 1
    if (__lsan_enable) __lsan_enable();
    return 0;
}
