// Tokenizer: byte-level BPE (Llama 3, Qwen 3, SmolLM2/GPT-2 style) and SentencePiece models.
//
// The tokenizer lives inside model.bin as one serialized section. ./export builds a
// TokenizerSpec (from tokenizer.json or GGUF metadata, see weights/tokenizer_import.h) and
// writes it with tokenizer_write(); ./run maps the file and calls tokenizer_load() on the bytes.
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TOK_ERR_LEN 256
#define TOK_MAX_EOS 8

enum TokKind { TOK_KIND_BPE = 1, TOK_KIND_SENTENCEPIECE = 2 };

// Pre-tokenization regex family, named after the variants of Hugging Face / llama.cpp.
enum TokPretok {
    TOK_PRE_GPT2 = 1,   // GPT-2 / SmolLM2: 's|'t|..| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    TOK_PRE_LLAMA3 = 2, // Llama 3: case-insensitive contractions, \p{N}{1,3}
    TOK_PRE_QWEN2 = 3,  // Qwen 2/3: like Llama 3 but single-digit \p{N}, NFC normalization
};

// Token types. SPECIAL tokens are control tokens (e.g. <|eot_id|>), ADDED are user-defined
// added tokens; both are matched in input text before pre-tokenization (when allowed).
enum TokType { TOK_TYPE_NORMAL = 0, TOK_TYPE_SPECIAL = 1, TOK_TYPE_ADDED = 2, TOK_TYPE_BYTE = 3, TOK_TYPE_UNUSED = 4 };

// Which chat template the model uses (tokenizer/chat.h renders them).
enum TokChat { TOK_CHAT_NONE = 0, TOK_CHAT_CHATML = 1, TOK_CHAT_LLAMA3 = 2, TOK_CHAT_QWEN3 = 3 };

// Everything needed to serialize a tokenizer. Token strings are RAW bytes (the byte-level
// unicode mapping of GPT-2 already undone), so token i is tokens[i][0..token_len[i]).
typedef struct {
    int kind;               // TokKind
    int pretok;             // TokPretok (BPE only)
    int normalize_nfc;      // 1: NFC-normalize input text before pre-tokenizing (Qwen)
    int ignore_merges;      // 1: a pre-token that is itself in the vocabulary is emitted whole (Llama 3)
    int add_bos;            // 1: the model expects BOS at the start of a sequence
    int bos_id;             // -1 if none
    int n_eos;              // 1..TOK_MAX_EOS
    int eos_ids[TOK_MAX_EOS];
    int chat;               // TokChat
    int n_tokens;
    char **tokens;          // (n_tokens) raw bytes of each token
    int *token_len;         // (n_tokens)
    uint8_t *token_type;    // (n_tokens) TokType
    int n_merges;
    int32_t *merges;        // (n_merges, 2) left and right token ids, in rank order (rank = index)
    char *chat_template;    // the model's Jinja template text, or NULL
    void *sp_model;         // SentencePiece model proto bytes (kind == SENTENCEPIECE), else NULL
    size_t sp_model_len;
} TokenizerSpec;

void tokspec_free(TokenizerSpec *s);

// Serialize the spec at the current position of f. Returns 0, or -1 with err filled.
int tokenizer_write(FILE *f, const TokenizerSpec *s, char *err);

typedef struct Tokenizer Tokenizer;

// Parse a serialized section (bytes stay owned by the caller and must outlive the tokenizer).
// Validates every length and id against size. Returns NULL with err filled on failure.
Tokenizer *tokenizer_load(const void *data, size_t size, char *err);
void tokenizer_free(Tokenizer *t);

int tokenizer_n_tokens(const Tokenizer *t);
int tokenizer_bos(const Tokenizer *t);        // -1 if none
int tokenizer_add_bos(const Tokenizer *t);
int tokenizer_is_eos(const Tokenizer *t, int id);
int tokenizer_is_special(const Tokenizer *t, int id); // a control token (TOK_TYPE_SPECIAL: <|im_start|>, <|eot_id|>, ...)
int tokenizer_chat(const Tokenizer *t);        // TokChat
const char *tokenizer_chat_template(const Tokenizer *t); // NULL if none
int tokenizer_token_id(const Tokenizer *t, const char *bytes, size_t len); // exact vocabulary lookup, -1 if absent

// The offset of the first byte of text[0..len) that is not part of well-formed UTF-8, or -1 when
// all of it is. The encoder drops such bytes (byte-level BPE encodes text, not bytes): a caller
// that must not lose input checks first.
long tokenizer_utf8_invalid_at(const char *text, size_t len);

// Encode text (no BOS added). parse_special: 1 to recognize special/added token strings in the
// text as Hugging Face does by default (byte-level BPE; SentencePiece encodes as spm_encode does,
// control tokens such as <s> staying text). *ids is malloc'd; returns the count, or -1 with err.
long tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int parse_special, int **ids, char *err);

// Raw bytes of one token (may be a partial UTF-8 sequence).
const char *tokenizer_piece(const Tokenizer *t, int id, size_t *len);

// Streaming decode: feed ids one by one, get back only complete UTF-8 text; bytes of a
// character split across tokens are held until the character is complete.
typedef struct {
    char pending[8];
    int n_pending;
} TokDecoder;
// out must hold tokenizer_max_piece_len(t) + 16 bytes. Returns bytes written (not NUL-terminated).
size_t tokenizer_max_piece_len(const Tokenizer *t);
size_t tokenizer_decode_step(const Tokenizer *t, TokDecoder *d, int id, char *out, size_t cap);
// Flush whatever is pending at the end (invalid bytes come out as U+FFFD).
size_t tokenizer_decode_flush(const Tokenizer *t, TokDecoder *d, char *out, size_t cap);

// Decode a whole id sequence to a malloc'd NUL-terminated string (what HF decode() gives with
// skip_special_tokens=False).
char *tokenizer_decode(const Tokenizer *t, const int *ids, size_t n);

#endif
