// Fuzzes the safetensors reader of ./export and the fetch of every tensor a configuration needs.
// Input byte 0 picks the form: even, a single model.safetensors (bytes 1..4: how many zero bytes
// to append, as little-endian u32 capped at 4 MiB, so a seed need only hold the JSON header);
// odd, model.safetensors.index.json beside the two real shards of tests/data/tiny-llama31.
#define main export_main // the exporter's static functions, as tests reach them (DESIGN.md)
#include "../../weights/export.c"
#undef main
#include "fuzz_common.h"

#define MAX_PAD (4u << 20)

static char *single_dir, *sharded_dir;
static Config single_cfg, sharded_cfg;

static void cleanup(void) {
    fuzz_rmdir(single_dir);
    fuzz_rmdir(sharded_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char err[ERR_LEN];
    const char *q = REPO_ROOT "/tests/data/tiny-qwen3", *l = REPO_ROOT "/tests/data/tiny-llama31";
    if (hf_read_config(q, &single_cfg, err) != 0 || hf_read_config(l, &sharded_cfg, err) != 0) {
        fprintf(stderr, "fuzz_safetensors: %s\n", err);
        abort();
    }
    single_dir = fuzz_tmpdir();
    sharded_dir = fuzz_tmpdir();
    fuzz_copy(l, sharded_dir, "model-00001-of-00002.safetensors");
    fuzz_copy(l, sharded_dir, "model-00002-of-00002.safetensors");
    atexit(cleanup);
    return 0;
}

static void fetch_one(const char *name, uint32_t dtype, uint32_t ndim, uint64_t rows, uint64_t cols, void *p) {
    (void)dtype;
    Source *src = p;
    uint64_t n = rows * (ndim == 2 ? cols : 1);
    float *buf = malloc(n * sizeof(float));
    char err[ERR_LEN];
    if (buf && fetch(src, name, rows, ndim == 2 ? cols : 1, buf, err) != 0) fuzz_check_err(err);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int sharded = data[0] & 1;
    const char *dir = sharded ? sharded_dir : single_dir;
    char path[4096];
    if (sharded) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        fuzz_write(path, data + 1, size - 1);
    } else {
        if (size < 5) return 0;
        uint32_t pad;
        memcpy(&pad, data + 1, 4);
        pad = pad < MAX_PAD ? pad : MAX_PAD;
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(data + 5, 1, size - 5, f) != size - 5 || ftruncate(fileno(f), (off_t)(size - 5 + pad)) != 0 ||
            fclose(f) != 0)
            abort();
    }
    Source src = {0};
    char err[ERR_LEN];
    if (st_open_dir(&src.st, dir, err) != 0) {
        fuzz_check_err(err);
        return 0;
    }
    // Every tensor through the converter, then what the configuration needs through fetch.
    for (int i = 0; i < src.st.n_tensors; i++) {
        const StTensor *t = &src.st.tensors[i];
        float *buf = malloc((t->n_elems ? t->n_elems : 1) * sizeof(float));
        if (buf) st_to_f32(t, buf);
        free(buf);
        if (st_find(&src.st, t->name) == NULL) abort();
    }
    src.c = sharded ? &sharded_cfg : &single_cfg;
    model_tensor_list(src.c, fetch_one, &src);
    st_close(&src.st);
    return 0;
}
