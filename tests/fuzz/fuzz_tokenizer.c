// Fuzzes the tokenizer. Input byte 0 modulo 3 picks what the rest is:
//   0  a serialized tokenizer section (what ./run reads from model.bin): loaded, then exercised
//   1  text, encoded by a real tokenizer (byte 1 picks SmolLM2, Qwen3-style or Llama 3-style;
//      byte 0 bit 7 turns special-token parsing on); the ids must give the text's bytes back
//      (where every byte has a token and NFC cannot apply) and decode whole and streaming alike
//   2  token ids (little-endian int32, any value) decoded by a real tokenizer (byte 1 picks)
#include "../../weights/tokenizer_import.h"
#include "fuzz_tok.h"

static const char *dirs[3] = {REPO_ROOT "/tests/data/smollm2-tokenizer", REPO_ROOT "/tests/data/tiny-qwen3",
                              REPO_ROOT "/tests/data/tiny-llama31"};
static Tokenizer *real[3];
static char *sections[3];

static void cleanup(void) {
    for (int i = 0; i < 3; i++) tokenizer_free(real[i]), free(sections[i]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    for (int i = 0; i < 3; i++) {
        TokenizerSpec s;
        char err[TOK_ERR_LEN];
        size_t n = 0;
        FILE *mem = open_memstream(&sections[i], &n);
        if (!mem || tokspec_from_hf_dir(&s, dirs[i], err) != 0 || tokenizer_write(mem, &s, err) != 0 ||
            fclose(mem) != 0 || !(real[i] = tokenizer_load(sections[i], n, err))) {
            fprintf(stderr, "fuzz_tokenizer: %s: %s\n", dirs[i], err);
            abort();
        }
        tokspec_free(&s);
    }
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int mode = data[0] % 3;
    if (mode == 0) {
        char err[TOK_ERR_LEN];
        Tokenizer *t = tokenizer_load(data + 1, size - 1, err);
        if (!t) {
            fuzz_check_err(err);
            return 0;
        }
        fuzz_exercise_tokenizer(t);
        tokenizer_free(t);
        return 0;
    }
    const Tokenizer *t = real[data[1] % 3];
    const char *text = (const char *)data + 2;
    size_t len = size - 2;
    if (mode == 1) {
        fuzz_encode_check(t, text, len, data[0] >> 7, fuzz_tok_exact(t, text, len));
        return 0;
    }
    size_t n = len / 4;
    int *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return 0;
    memcpy(ids, text, n * sizeof *ids);
    fuzz_decode_both(t, ids, n);
    free(ids);
    return 0;
}
