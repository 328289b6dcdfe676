// Fuzzes the GGUF reader and what ./export does with a GGUF file short of writing it: the
// directory and metadata (gguf_open), the configuration and tokenizer import, the serialized
// tokenizer, and every tensor the configuration needs, dequantized and un-permuted (and a Q8_0 /
// Q4_K one also copied as blocks, as --dtype keep does).
#define main export_main // the exporter's static functions, as tests reach them (DESIGN.md)
#include "../../weights/export.c"
#undef main
#include "fuzz_tok.h"

#define MAX_ELEMS (4u << 20) // a tensor larger than this is not dequantized (time, not safety)

// Fetches a tensor as write_one does (dequantized, Q/K rows un-permuted) and drops it.
static void fetch_one(const char *name, uint32_t dtype, uint32_t ndim, uint64_t rows, uint64_t cols, void *p) {
    (void)dtype;
    Source *src = p;
    uint64_t n = rows * (ndim == 2 ? cols : 1);
    float *buf = n <= MAX_ELEMS ? malloc(n * sizeof(float)) : NULL;
    char err[ERR_LEN];
    if (buf && fetch(src, name, rows, ndim == 2 ? cols : 1, buf, err) != 0) fuzz_check_err(err);
    free(buf);
    // A Q8_0 / Q4_K matrix as --dtype keep copies it: blocks as they are, Q/K rows un-permuted.
    int k = ndim == 2 ? kept_dtype((uint32_t)gguf_type_of(src, name)) : -1;
    uint64_t rb = k >= 0 ? dtype_row_bytes((uint32_t)k, cols) : 0;
    uint8_t *raw = rb && n <= MAX_ELEMS ? malloc(rows * rb) : NULL;
    if (raw && fetch_raw(src, name, (uint32_t)k, rows, cols, raw, err) != 0) fuzz_check_err(err);
    free(raw);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_memfd(data, size);
    Source src = {0};
    src.is_gguf = 1;
    char err[ERR_LEN];
    if (gguf_open(&src.gg, path, err) != 0) {
        fuzz_check_err(err);
        return 0;
    }
    // The accessors on every key, whatever its type.
    for (uint64_t i = 0; i < src.gg.n_kv; i++) {
        const char *k = src.gg.kv[i].key;
        uint64_t u;
        double f;
        char **strs;
        int32_t *ints;
        (void)gguf_get_u64(&src.gg, k, &u);
        (void)gguf_get_f64(&src.gg, k, &f);
        free(gguf_get_str(&src.gg, k));
        long n = gguf_get_str_array(&src.gg, k, &strs);
        for (long j = 0; j < n; j++) free(strs[j]);
        if (n >= 0) free(strs);
        if (gguf_get_i32_array(&src.gg, k, &ints) >= 0) free(ints);
    }
    Config c;
    TokenizerSpec spec = {0};
    int ok = gguf_config(&src.gg, &c, err) == 0;
    if (ok && gguf_tokenizer(&src.gg, &spec, err) != 0) {
        fuzz_check_err(err);
    } else if (ok) {
        char *tok = NULL;
        size_t tok_size = 0;
        FILE *mem = open_memstream(&tok, &tok_size);
        if (!mem) abort();
        int wrote = tokenizer_write(mem, &spec, err) == 0;
        fclose(mem);
        if (wrote) {
            Tokenizer *t = tokenizer_load(tok, tok_size, err); // tokenizer_write checked that it loads
            if (!t) abort();
            fuzz_exercise_tokenizer(t);
            tokenizer_free(t);
        } else {
            fuzz_check_err(err);
        }
        free(tok);
        tokspec_free(&spec);
    }
    if (!ok || config_validate(&c, err) != 0) {
        fuzz_check_err(err);
        gguf_close(&src.gg);
        return 0;
    }
    src.c = &c;
    model_tensor_list(&c, fetch_one, &src); // each tensor the configuration needs
    gguf_close(&src.gg);
    return 0;
}
