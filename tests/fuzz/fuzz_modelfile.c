// Fuzzes the model.bin loader: modelfile_open's checks of header, configuration, sections and
// tensor table, the tokenizer section, and one forward step over whatever it accepted.
// The input is the head of a file: when its header claims a larger file (up to MAX_FILE), the
// rest reads as zeros, so mutations land on the header, tokenizer and table, not on weights.
#include "../../model/model.h"
#include "../../model/sampler.h"
#include "fuzz_tok.h"

#define MAX_FILE (8u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_memfd(data, size);
    if (size >= sizeof(FileHeader)) {
        FileHeader h;
        memcpy(&h, data, sizeof h);
        if (h.file_size > size && h.file_size <= MAX_FILE) fuzz_memfd_extend((size_t)h.file_size);
    }
    Model m;
    char err[MODEL_ERR_LEN];
    if (model_load(&m, path, err) != 0) {
        fuzz_check_err(err);
        return 0;
    }
    const FileHeader *h = m.file.header;
    char terr[TOK_ERR_LEN];
    Tokenizer *t = tokenizer_load(m.file.data + h->tokenizer_offset, (size_t)h->tokenizer_size, terr);
    if (t) fuzz_exercise_tokenizer(t);
    else fuzz_check_err(terr);
    tokenizer_free(t);
    RunState s;
    if (run_state_init(&s, &m, 4, 2, 1, err) == 0) {
        int tokens[2] = {0, (int)m.c.vocab_size - 1};
        float *logits = model_forward(&m, &s, tokens, 2, 0, 1, err);
        if (!logits) fuzz_check_err(err); // non-finite logits
        // Sampling with the file's generation defaults, as ./run does unless told otherwise.
        Sampler sm;
        const Config *c = &m.c;
        if (logits && c->has_gen_defaults && sampler_init(&sm, (int)c->vocab_size, c->gen_do_sample ? c->gen_temperature : 0,
                                                          c->gen_top_k, c->gen_top_p, c->gen_min_p, 1) == 0) {
            int id = sampler_sample(&sm, logits + c->vocab_size);
            if (id < 0 || id >= (int)c->vocab_size) abort();
            sampler_free(&sm);
        }
        run_state_free(&s);
    } else {
        fuzz_check_err(err);
    }
    model_free(&m);
    return 0;
}
