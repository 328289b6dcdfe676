// The GPU path's session format (model/session.h, kv_format SESSION_KV_GPU) checked on the CPU:
// a stand-in whole-pass backend whose K/V section is random bytes, written and read back through
// the session stream in calls of other sizes each way (one call of the whole section, whose
// whole 64-MiB pieces are read and checksummed by several threads, against thousands of small
// calls summed incrementally), so the file, the checksums and the refusals are those the GPU
// sees. What the GPU puts in the section is checked on the GPU (kernels/gpu_checks.sh, session).
#include "../model/model.h"
#include "../model/session.h"
#include "test_pariskv_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    uint8_t *kv;
    uint64_t bytes;
    int small; // calls of random sizes up to 1 MiB, else one call
    Rng rng;
} Fake;

static int fake_io(void *dev, const SessionGpuLayout *L, SessionStream *s, int save, char *err) {
    Fake *f = dev;
    if (L->zone_bytes + L->win_bytes != f->bytes) {
        snprintf(err, SESSION_ERR_LEN, "layout of %llu bytes, state of %llu", (unsigned long long)(L->zone_bytes + L->win_bytes),
                 (unsigned long long)f->bytes);
        return -1;
    }
    for (uint64_t at = 0; at < f->bytes;) {
        uint64_t n = f->small ? 1 + next_u64(&f->rng) % (1 << 20) : f->bytes;
        if (n > f->bytes - at) n = f->bytes - at;
        if ((save ? session_put(s, f->kv + at, n) : session_get(s, f->kv + at, n)) != 0) {
            snprintf(err, SESSION_ERR_LEN, "stream failed at %llu", (unsigned long long)at);
            return -1;
        }
        at += n;
    }
    return 0;
}
static int fake_save(void *dev, const SessionGpuLayout *L, SessionStream *out, char *err) { return fake_io(dev, L, out, 1, err); }
static int fake_load(void *dev, const SessionGpuLayout *L, SessionStream *in, char *err) { return fake_io(dev, L, in, 0, err); }

static const Backend fake_backend = {.name = "fake", .session_save = fake_save, .session_load = fake_load};

static void flip(const char *path, uint64_t off) {
    FILE *f = fopen(path, "r+b");
    int c = fseek(f, (long)off, SEEK_SET) == 0 ? fgetc(f) : 0;
    fseek(f, (long)off, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

int main(void) {
    Model m;
    if (model_synthetic(&m, "qwen3-0.6b") != 0) return 1;
    const Config *c = &m.c;
    char path[] = "/tmp/pkv-session-gpu-XXXXXX";
    int tfd = mkstemp(path);
    if (tfd < 0) return 1;
    close(tfd);
    Rng rng = {7};
    struct {
        const char *name;
        int method, n, fp8;
    } cases[] = {{"ParisKV past its dense phase", ATTN_PARISKV, 3000, 0},
                 {"ParisKV, fp8 zone", ATTN_PARISKV, 2500, 1},
                 {"ParisKV in its dense phase", ATTN_PARISKV, 300, 0},
                 {"full attention", ATTN_FULL, 1200, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        AttnConfig a;
        attn_config_default(&a);
        a.method = cases[ci].method, a.zone_fp8 = cases[ci].fp8, a.prefill_len = cases[ci].n;
        int n = cases[ci].n;
        SessionGpuLayout L;
        session_gpu_layout(c, &a, n, &L);
        int sparse = cases[ci].method == ATTN_PARISKV && !attn_is_dense(&a, n);
        uint64_t row = cases[ci].fp8 ? 2 * c->head_dim + 8 : 4 * c->head_dim;
        check(sparse ? L.zone_slots == n - a.sink && L.slot_bytes == c->n_layers * c->n_kv_heads * row && L.win_a == a.sink &&
                           L.win_b == attn_zone_end(&a, n) && L.zone_bytes % SESSION_ALIGN == 0
                     : L.zone_slots == 0 && L.zone_bytes == 0 && L.win_rows == n,
              "%s: layout (zone %d slots of %llu bytes, window %d rows)", cases[ci].name, L.zone_slots, (unsigned long long)L.slot_bytes,
              L.win_rows);
        Fake saver = {NULL, L.zone_bytes + L.win_bytes, (int)(ci & 1), {ci + 1}}, loader = saver;
        loader.small = !saver.small;
        saver.kv = malloc(saver.bytes), loader.kv = calloc(1, saver.bytes);
        int *tokens = malloc((size_t)n * sizeof(int)), *back = malloc((size_t)n * sizeof(int));
        float *logits = malloc(c->vocab_size * sizeof(float)), *logits_back = malloc(c->vocab_size * sizeof(float));
        if (!saver.kv || !loader.kv || !tokens || !back || !logits || !logits_back) return 1;
        for (uint64_t i = 0; i < saver.bytes; i++) saver.kv[i] = (uint8_t)next_u64(&rng);
        for (int i = 0; i < n; i++) tokens[i] = (int)(next_u64(&rng) % c->vocab_size);
        for (uint32_t i = 0; i < c->vocab_size; i++) logits[i] = gauss(&rng);
        RunState s;
        memset(&s, 0, sizeof s);
        s.ctx = n + 16, s.dev = &saver, s.be = &fake_backend;
        SessionExtra x = {SESSION_PROMPT, n, 0, logits, NULL, 0};
        char err[SESSION_ERR_LEN] = "";
        int rc = session_save(path, &m, &s, &a, tokens, n, &x, err);
        check(rc == 0, "%s: saved (%llu bytes of K/V in %s) %s", cases[ci].name, (unsigned long long)saver.bytes,
              saver.small ? "small calls" : "one call", err);
        SessionHeader h;
        rc = session_open(path, &m, &a, 1, &h, err);
        check(rc == 0 && h.kv_format == SESSION_KV_GPU && h.kv_bytes == saver.bytes &&
                  h.file_size == session_bytes(c, &a, SESSION_KV_GPU, n, n, 0),
              "%s: the header checks and counts the section %s", cases[ci].name, rc ? err : "");
        s.dev = &loader;
        void *chat = NULL;
        rc = session_read(path, &h, &s, back, logits_back, &chat, err);
        check(rc == 0 && memcmp(saver.kv, loader.kv, saver.bytes) == 0 && memcmp(tokens, back, (size_t)n * sizeof(int)) == 0 &&
                  memcmp(logits, logits_back, c->vocab_size * sizeof(float)) == 0,
              "%s: read back in %s, identical %s", cases[ci].name, loader.small ? "small calls" : "one call", rc ? err : "");
        // Damage anywhere in the section is caught: the zone's first piece, the middle, the last byte.
        uint64_t at[3] = {h.kv_offset + 5, h.kv_offset + h.kv_bytes / 2, h.file_size - 1};
        for (int k = 0; k < 3; k++) {
            flip(path, at[k]);
            rc = session_read(path, &h, &s, back, logits_back, &chat, err);
            check(rc != 0 && strstr(err, "checksum mismatch in its K/V"), "%s: a byte flipped at %llu of %llu: %s", cases[ci].name,
                  (unsigned long long)at[k], (unsigned long long)h.file_size, err);
            flip(path, at[k]);
        }
        // Opened for the CPU path it is refused as the GPU's, also where the settings differ as well
        // (each path has its own default dense crossover: the path is what to say).
        SessionHeader h2;
        rc = session_open(path, &m, &a, 0, &h2, err);
        check(rc != 0 && strstr(err, "saved by the GPU path"), "%s: opened for the CPU path: %s", cases[ci].name, err);
        AttnConfig other = a;
        other.dense_min += 1000;
        rc = session_open(path, &m, &other, 0, &h2, err);
        check(rc != 0 && strstr(err, "saved by the GPU path"), "%s: the path said before other settings: %s", cases[ci].name, err);
        rc = session_open(path, &m, &other, 1, &h2, err);
        check(rc != 0 && strstr(err, "other attention settings") && strstr(err, "--dense-below"), "%s: other settings, named: %s",
              cases[ci].name, err);
        // The other path's state refuses it, and a CPU session is refused by a GPU state.
        RunState cpu;
        memset(&cpu, 0, sizeof cpu);
        cpu.ctx = n + 16;
        rc = session_read(path, &h, &cpu, back, logits_back, &chat, err);
        check(rc != 0 && strstr(err, "saved by the GPU path"), "%s: the CPU path refuses it: %s", cases[ci].name, err);
        h.kv_format = SESSION_KV_CPU_F32;
        rc = session_read(path, &h, &s, back, logits_back, &chat, err);
        check(rc != 0 && strstr(err, "saved by the CPU path"), "%s: a CPU session refused by a GPU state: %s", cases[ci].name, err);
        free(saver.kv), free(loader.kv), free(tokens), free(back), free(logits), free(logits_back);
    }
    unlink(path);
    model_free(&m);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
