// Building a TokenizerSpec from the two sources ./export reads.
#ifndef TOKENIZER_IMPORT_H
#define TOKENIZER_IMPORT_H

#include "../tokenizer/tokenizer.h"

// Hugging Face: dir holds tokenizer.json and tokenizer_config.json (generation_config.json's
// eos_token_id, an int or a list, is merged into the EOS ids when present).
// Returns 0, or -1 with err filled (missing file, unsupported model type or pre-tokenizer...).
// A directory whose tokenizer is a SentencePiece tokenizer.model (Llama 2, Mistral, TinyLlama:
// no tokenizer.json, or one that is not byte-level) gives a TOK_KIND_SENTENCEPIECE spec.
int tokspec_from_hf_dir(TokenizerSpec *s, const char *dir, char *err);

// The vocabulary, BOS / EOS and model proto of a SentencePiece tokenizer.model (tokenizer_spm.c).
// 0, or -1 with err filled; s is then partly filled and must be freed with tokspec_free.
int tokspec_spm_vocab(TokenizerSpec *s, const char *path, char *err);

// GGUF metadata (tokenizer.ggml.*): tokens as stored (GPT-2 byte-level mapped strings for
// model "gpt2"), GGUF token types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
// 6 byte), merges as "left right" strings, the 'pre' name (e.g. "smollm", "llama-bpe", "qwen2"),
// bos id (-1 if absent), eos ids, add_bos flag, chat template (NULL if absent).
typedef struct {
    const char *model;            // tokenizer.ggml.model, e.g. "gpt2"
    const char *pre;              // tokenizer.ggml.pre, may be NULL
    int n_tokens;
    const char *const *tokens;    // NUL-terminated strings
    const int32_t *token_types;   // may be NULL (all normal)
    int n_merges;
    const char *const *merges;
    int bos_id;
    int n_eos;
    const int *eos_ids;
    int add_bos;                  // -1 if the metadata does not say
    const char *chat_template;
} GgufTokenizerMeta;
int tokspec_from_gguf(TokenizerSpec *s, const GgufTokenizerMeta *m, char *err);

#endif
