// Fuzzes the JSON files ./export reads from a Hugging Face directory, one at a time beside real
// copies of the others (tests/data/tiny-qwen3 or tiny-llama31). Input byte 0: bits 0-1 pick the
// file (config.json, generation_config.json, tokenizer.json, tokenizer_config.json), bit 2 the
// model; the rest is the file. What was accepted goes on: the configuration is validated, the
// tokenizer serialized, loaded and exercised.
#include "../../model/modelfile.h"
#include "../../weights/hf_config.h"
#include "../../weights/tokenizer_import.h"
#include "fuzz_tok.h"

static const char *files[4] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"};
static const char *models[2] = {REPO_ROOT "/tests/data/tiny-qwen3", REPO_ROOT "/tests/data/tiny-llama31"};
static char *dirs[2][4]; // per model, per fuzzed file: a directory holding the other three

static void cleanup(void) {
    for (int m = 0; m < 2; m++)
        for (int f = 0; f < 4; f++) fuzz_rmdir(dirs[m][f]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    for (int m = 0; m < 2; m++)
        for (int f = 0; f < 4; f++) {
            dirs[m][f] = fuzz_tmpdir();
            for (int g = 0; g < 4; g++)
                if (g != f) fuzz_copy(models[m], dirs[m][f], files[g]);
        }
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int file = data[0] & 3, model = (data[0] >> 2) & 1;
    const char *dir = dirs[model][file];
    char path[4096], err[MODEL_ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", dir, files[file]);
    fuzz_write(path, data + 1, size - 1);
    if (file < 2) {
        Config c;
        if (hf_read_config(dir, &c, err) != 0 || config_validate(&c, err) != 0) fuzz_check_err(err);
    }
    if (file > 0) { // generation_config.json holds EOS ids the tokenizer import reads too
        TokenizerSpec s;
        if (tokspec_from_hf_dir(&s, dir, err) != 0) {
            fuzz_check_err(err);
            return 0;
        }
        char *buf = NULL;
        size_t n = 0;
        FILE *mem = open_memstream(&buf, &n);
        if (!mem) abort();
        int wrote = tokenizer_write(mem, &s, err) == 0;
        fclose(mem);
        if (wrote) {
            Tokenizer *t = tokenizer_load(buf, n, err); // tokenizer_write checked that it loads
            if (!t) abort();
            fuzz_exercise_tokenizer(t);
            tokenizer_free(t);
        } else {
            fuzz_check_err(err);
        }
        free(buf);
        tokspec_free(&s);
    }
    return 0;
}
