// Chat templates rendered in C, exactly as transformers' apply_chat_template renders the model's
// own Jinja template (add_generation_prompt=True), for the families TokChat names:
//   TOK_CHAT_LLAMA3  Llama 3.1 / 3.2 / 3.3 (a system header with "Cutting Knowledge Date" and
//                    "Today Date" always first) and Llama 3 (no system header of its own);
//   TOK_CHAT_QWEN3   Qwen3, thinking on or off; earlier turns' <think> blocks dropped;
//   TOK_CHAT_CHATML  ChatML (SmolLM2), with the default system prompt the template adds when the
//                    conversation has none (read from the template's text).
// Messages are system / user / assistant text; tools are not rendered.
#ifndef CHAT_H
#define CHAT_H

#include "tokenizer.h"

typedef struct {
    const char *role;    // "system", "user" or "assistant"
    const char *content; // UTF-8
} ChatMessage;

typedef struct {
    int think;        // Qwen3: -1 the template's default (thinking on), 0 off (enable_thinking=False), 1 on
    const char *date; // Llama 3.1 "Today Date"; NULL: the template's default (e.g. "26 Jul 2024")
} ChatOptions;

// The conversation as text, the generation prompt appended; malloc'd, NUL-terminated. NULL with
// err (TOK_ERR_LEN) filled when the model has no supported template, a role is not one of the
// three, or a content is not valid UTF-8.
char *chat_render(const Tokenizer *t, const ChatMessage *msgs, int n, const ChatOptions *o, char *err);

#endif
