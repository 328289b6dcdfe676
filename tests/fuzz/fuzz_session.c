// Fuzzes saved sessions (model/session.h). An input of at least a header's size is a session
// file: its header is checked against a fixed small configuration (model identity 0: a model
// with no file), and when it is accepted its sections are read into a cache and checked. A
// shorter input is a recipe: its bytes become the tokens, logits (or a chat's conversation) and
// K/V of a session written by session_save, which must read back identically; then the same file with one byte flipped (the
// recipe chooses which) must be refused with a one-line message or read back unchanged.
#include "../../model/session.h"
#include "fuzz_common.h"

static Config small_config(void) {
    Config c;
    memset(&c, 0, sizeof c);
    c.arch = ARCH_LLAMA, c.n_layers = 2, c.dim = 8, c.n_heads = 2, c.n_kv_heads = 1, c.head_dim = 4, c.hidden_dim = 16;
    c.vocab_size = 16, c.max_seq_len = 64, c.norm_eps = 1e-5f, c.rope_theta = 10000.0f, c.weight_dtype = DTYPE_F32;
    return c;
}

// A state with a cache of ctx positions of c's shape (only the cache is used).
static RunState small_state(const Config *c, int ctx) {
    RunState s;
    memset(&s, 0, sizeof s);
    size_t n = (size_t)c->n_layers * ctx * c->n_kv_heads * c->head_dim;
    s.ctx = ctx;
    s.key_cache = calloc(n ? n : 1, sizeof(float));
    s.value_cache = calloc(n ? n : 1, sizeof(float));
    if (!s.key_cache || !s.value_cache) abort();
    return s;
}

static const char *session_file(const uint8_t *data, size_t size) {
    static char path[64];
    int fd = memfd_create("session", MFD_CLOEXEC);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return path; // closed by the caller through close_file
}

static void close_file(const char *path) { close(atoi(path + strlen("/proc/self/fd/"))); }

// Checks and, if accepted, reads the session in path; 1 when it was accepted and read.
// conv: the chat section read (freed here; its bytes compared to want_conv when given).
static int try_read(const char *path, const Model *m, const AttnConfig *a, int *tokens, float *logits, RunState *out, const void *want_conv,
                    size_t want_bytes) {
    SessionHeader h;
    char err[SESSION_ERR_LEN];
    if (session_open(path, m, a, -1, &h, err) != 0) return fuzz_check_err(err), 0;
    *out = small_state(&m->c, h.n_tokens);
    void *conv = NULL;
    if (session_read(path, &h, out, tokens, logits, &conv, err) == 0) {
        if (want_conv && (h.chat_bytes != want_bytes || (want_bytes && memcmp(conv, want_conv, want_bytes)))) abort();
        free(conv);
        return 1;
    }
    fuzz_check_err(err);
    free(out->key_cache), free(out->value_cache);
    memset(out, 0, sizeof *out);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Model m;
    memset(&m, 0, sizeof m);
    m.c = small_config();
    AttnConfig a;
    attn_config_default(&a);
    const Config *c = &m.c;
    size_t row = (size_t)c->n_kv_heads * c->head_dim;
    if (size >= sizeof(SessionHeader)) { // a session file
        const char *path = session_file(data, size);
        int tokens[64];
        float logits[16];
        RunState s;
        memset(&s, 0, sizeof s);
        SessionHeader h;
        char err[SESSION_ERR_LEN];
        if (session_open(path, &m, &a, -1, &h, err) != 0) fuzz_check_err(err);
        else if (h.n_tokens > 64) abort(); // the checks bound it by the file's size
        else try_read(path, &m, &a, tokens, logits, &s, NULL, 0);
        free(s.key_cache), free(s.value_cache);
        close_file(path);
        return 0;
    }
    // A recipe: n tokens from the first byte, every value from the bytes after it; an odd first
    // byte makes a chat's session (its conversation section: the recipe's bytes).
    int n = size ? 1 + data[0] % 40 : 1, is_chat = size && (data[0] & 1);
    int tokens[64], back_tokens[64];
    float logits[16], back_logits[16];
    RunState s = small_state(c, n);
    for (int i = 0; i < n; i++) tokens[i] = size > 1 ? data[1 + i % (size - 1)] % (int)c->vocab_size : i % 16;
    for (int i = 0; i < 16; i++) logits[i] = (float)(size > 2 ? data[2 + i % (size - 2)] : i) - 100.0f;
    size_t nkv = (size_t)c->n_layers * n * row;
    for (size_t i = 0; i < nkv; i++) {
        s.key_cache[i] = (float)(size ? data[i % size] : 1) / 7.0f;
        s.value_cache[i] = -(float)(size ? data[(i + 3) % size] : 2) / 3.0f;
    }
    char dir_err[SESSION_ERR_LEN];
    char *dir = fuzz_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/s.bin", dir);
    SessionExtra x = {is_chat ? SESSION_CHAT : SESSION_PROMPT, n, size > 5 ? data[5] % (n + 1) : 0, is_chat ? NULL : logits,
                      is_chat ? data : NULL, is_chat ? size : 0};
    if (is_chat) memset(logits, 0, sizeof logits); // a chat's session keeps no logits: zeros
    if (session_save(path, &m, &s, &a, tokens, n, &x, dir_err) != 0) abort(); // a writable directory: must succeed
    RunState r;
    if (!try_read(path, &m, &a, back_tokens, back_logits, &r, data, x.chat_bytes)) abort(); // its own file must read back
    if (memcmp(tokens, back_tokens, (size_t)n * sizeof(int)) || memcmp(logits, back_logits, sizeof logits) ||
        memcmp(s.key_cache, r.key_cache, nkv * sizeof(float)) || memcmp(s.value_cache, r.value_cache, nkv * sizeof(float)))
        abort();
    free(r.key_cache), free(r.value_cache);
    // One byte flipped: refused, or (a byte no check covers: padding between sections) read back unchanged.
    FILE *f = fopen(path, "r+b");
    long len = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (len <= 0) abort();
    long at = (size > 3 ? (long)data[3] * 4099 + (size > 4 ? data[4] : 0) : 17) % len;
    int byte;
    if (fseek(f, at, SEEK_SET) != 0 || (byte = fgetc(f)) == EOF || fseek(f, at, SEEK_SET) != 0 || fputc(byte ^ 0x5a, f) == EOF) abort();
    fclose(f);
    if (try_read(path, &m, &a, back_tokens, back_logits, &r, data, x.chat_bytes)) {
        if (memcmp(tokens, back_tokens, (size_t)n * sizeof(int)) || memcmp(logits, back_logits, sizeof logits) ||
            memcmp(s.key_cache, r.key_cache, nkv * sizeof(float)) || memcmp(s.value_cache, r.value_cache, nkv * sizeof(float)))
            abort(); // a flipped byte read back as different data: a check missed it
        free(r.key_cache), free(r.value_cache);
    }
    free(s.key_cache), free(s.value_cache);
    fuzz_rmdir(dir);
    free(dir);
    return 0;
}
