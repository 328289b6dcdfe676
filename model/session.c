// Saved sessions (session.h): write, check, read.
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "guard.h"

static int fail(char *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, SESSION_ERR_LEN, fmt, ap);
    va_end(ap);
    return -1;
}

// Four independent multiply-xorshift lanes over 8-byte words (several GB/s), then the tail.
// Kept incrementally (Checksum), so a stream of any call sizes sums like one call.
typedef struct {
    uint64_t h[4], n;
    uint8_t tail[32];
    int nt;
} Checksum;

static void ck_init(Checksum *c) {
    static const uint64_t seed[4] = {0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull, 0x2545f4914f6cdd1dull};
    memcpy(c->h, seed, sizeof seed);
    c->n = 0, c->nt = 0;
}

static void ck_block(Checksum *c, const uint8_t *b) {
    for (int k = 0; k < 4; k++) {
        uint64_t w;
        memcpy(&w, b + 8 * k, 8);
        c->h[k] = (c->h[k] ^ w) * 0xff51afd7ed558ccdull;
        c->h[k] ^= c->h[k] >> 32;
    }
}

static void ck_update(Checksum *c, const void *p, size_t n) {
    const uint8_t *b = p;
    if (n == 0) return; // p may be NULL then
    c->n += n;
    if (c->nt) {
        size_t take = 32 - (size_t)c->nt < n ? 32 - (size_t)c->nt : n;
        memcpy(c->tail + c->nt, b, take);
        c->nt += (int)take, b += take, n -= take;
        if (c->nt < 32) return;
        ck_block(c, c->tail), c->nt = 0;
    }
    for (; n >= 32; b += 32, n -= 32) ck_block(c, b);
    memcpy(c->tail, b, n), c->nt = (int)n;
}

static uint64_t ck_final(const Checksum *c) {
    uint64_t x = c->n;
    for (int i = 0; i < c->nt; i++) x = (x ^ c->tail[i]) * 0x100000001b3ull;
    for (int k = 0; k < 4; k++) x = (x ^ c->h[k]) * 0xc4ceb9fe1a85ec53ull, x ^= x >> 29;
    return x;
}

uint64_t session_checksum(const void *p, size_t n) {
    Checksum c;
    ck_init(&c);
    ck_update(&c, p, n);
    return ck_final(&c);
}

static uint64_t fold(uint64_t sum, uint64_t piece) { return (sum ^ piece) * 0x9e3779b97f4a7c15ull; }

uint64_t session_model_id(const Model *m) {
    const ModelFile *f = &m->file;
    if (!f->data) { // a synthetic model: its random weights follow from its shape and dtypes
        uint32_t dt[4] = {m->token_embd_dt, m->output_dt, m->synthetic_dt, 0x53594e54}; // "SYNT"
        return fold(session_checksum(&m->c, sizeof m->c), session_checksum(dt, sizeof dt));
    }
    const FileHeader *fh = f->header;
    uint64_t id = session_checksum(f->data, (size_t)fh->tensors_offset + (size_t)fh->n_tensors * sizeof(TensorEntry));
    for (uint32_t i = 0; i < fh->n_tensors; i++) {
        const TensorEntry *t = &f->tensors[i];
        size_t k = t->nbytes < 4096 ? (size_t)t->nbytes : 4096;
        id = (id ^ session_checksum(f->data + t->offset, k)) * 0x9e3779b97f4a7c15ull;
    }
    return id;
}

static uint64_t align_up(uint64_t x) { return (x + SESSION_ALIGN - 1) / SESSION_ALIGN * SESSION_ALIGN; }

void session_gpu_layout(const Config *c, const AttnConfig *a, int n, SessionGpuLayout *L) {
    memset(L, 0, sizeof *L);
    L->n = n, L->fp8 = a->zone_fp8 != 0;
    L->row_bytes = L->fp8 ? 2 * (uint64_t)c->head_dim + 8 : 4 * (uint64_t)c->head_dim; // offload/host_store.h's rows
    L->slot_bytes = (uint64_t)c->n_layers * c->n_kv_heads * L->row_bytes;
    L->win_a = L->win_b = n; // dense: every position in the window part
    if (a->method == ATTN_PARISKV && n > 0 && !attn_is_dense(a, n)) {
        int S = a->sink < n ? a->sink : n, ze = attn_zone_end(a, n);
        L->zone_from = S, L->zone_slots = n - S;
        L->win_a = S, L->win_b = ze < S ? S : ze > n ? n : ze;
    }
    L->zone_bytes = align_up((uint64_t)L->zone_slots * L->slot_bytes);
    L->win_rows = L->win_a + n - L->win_b;
    L->win_bytes = 2 * (uint64_t)c->n_layers * c->n_kv_heads * (uint64_t)L->win_rows * c->head_dim * 2;
}

static uint64_t kv_section_bytes(const Config *c, const AttnConfig *a, uint32_t kv_format, int n, int prefill_len) {
    if (kv_format != SESSION_KV_GPU) return 2 * (uint64_t)c->n_layers * n * c->n_kv_heads * c->head_dim * sizeof(float);
    AttnConfig ac = *a;
    ac.prefill_len = prefill_len;
    SessionGpuLayout L;
    session_gpu_layout(c, &ac, n, &L);
    return L.zone_bytes + L.win_bytes;
}

uint64_t session_bytes(const Config *c, const AttnConfig *a, uint32_t kv_format, int n, int prefill_len, size_t chat_bytes) {
    uint64_t logits = align_up(SESSION_ALIGN + (uint64_t)n * 4), chat = align_up(logits + (uint64_t)c->vocab_size * 4);
    return align_up(chat + chat_bytes) + kv_section_bytes(c, a, kv_format, n, prefill_len);
}

int session_check_disk(const char *path, uint64_t bytes, char *err) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) return fail(err, "cannot write a session in '%.256s': %s", dir, strerror(errno));
    uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    // The new file is written beside the old one, which stays whole until the rename: both at once.
    struct stat old;
    uint64_t kept = stat(path, &old) == 0 && S_ISREG(old.st_mode) ? (uint64_t)old.st_blocks * 512 : 0;
    if (avail < bytes) {
        char beside[128] = "";
        if (kept) snprintf(beside, sizeof beside, " beside the %.1f MiB of the one it replaces (kept until the new one is whole)", kept / 1048576.0);
        return fail(err, "the session '%.256s' needs %.1f MiB of disk%s, but %.1f MiB is free there", path, bytes / 1048576.0, beside,
                    avail / 1048576.0);
    }
    return 0;
}

static uint64_t header_sum(const SessionHeader *h) {
    SessionHeader t = *h;
    t.header_sum = 0;
    return session_checksum(&t, sizeof t);
}

static size_t kv_row_floats(const Config *c) { return (size_t)c->n_kv_heads * c->head_dim; }

// The settings a session's K/V and regions depend on, as the header keeps them.
static void put_attn(SessionHeader *h, const AttnConfig *a) {
    h->attn_method = a->method, h->topk = a->topk, h->sink = a->sink, h->local = a->local, h->update = a->update;
    h->dense_min = a->dense_min, h->zone_fp8 = a->zone_fp8, h->beta = a->beta, h->rho = a->rho;
}

// ---- the K/V section as a stream (session.h) ----

struct SessionStream {
    int fd, writing;
    uint64_t off;     // file offset of the section's next byte
    uint64_t done;    // bytes of the section so far
    Checksum piece;   // of the current SESSION_PIECE-byte piece
    uint64_t sum;     // the finished pieces, folded
    char err[SESSION_ERR_LEN];
};

static void stream_init(SessionStream *s, int fd, int writing, uint64_t off) {
    memset(s, 0, sizeof *s);
    s->fd = fd, s->writing = writing, s->off = off;
    ck_init(&s->piece);
}

static int pio_all(int fd, int writing, void *p, size_t n, uint64_t off) {
    for (size_t k = 0; k < n;) {
        size_t want = n - k < ((size_t)1 << 30) ? n - k : (size_t)1 << 30;
        ssize_t r = writing ? pwrite(fd, (char *)p + k, want, (off_t)(off + k)) : pread(fd, (char *)p + k, want, (off_t)(off + k));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = writing ? ENOSPC : EIO;
            return -1;
        }
        k += (size_t)r;
    }
    return 0;
}

// Whole pieces starting on a piece boundary: read (or written) and checksummed by several threads.
static int stream_pieces(SessionStream *s, uint8_t *p, size_t n_pieces) {
    uint64_t *sums = malloc(n_pieces * sizeof *sums);
    if (!sums) return -1;
    int bad = 0;
    if (s->writing) bad = pio_all(s->fd, 1, p, n_pieces * SESSION_PIECE, s->off) != 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(8) reduction(| : bad)
    for (size_t i = 0; i < n_pieces; i++) {
        uint8_t *q = p + i * SESSION_PIECE;
        if (!s->writing && pio_all(s->fd, 0, q, SESSION_PIECE, s->off + i * SESSION_PIECE) != 0) bad |= 1;
        else sums[i] = session_checksum(q, SESSION_PIECE);
    }
    for (size_t i = 0; i < n_pieces && !bad; i++) s->sum = fold(s->sum, sums[i]);
    free(sums);
    return bad ? -1 : 0;
}

static int stream_io(SessionStream *s, void *p, size_t n) {
    uint8_t *b = p;
    while (n > 0) {
        uint64_t in = s->done % SESSION_PIECE;
        size_t take;
        if (in == 0 && n >= 2 * SESSION_PIECE) { // a run of whole pieces
            take = (size_t)(n / SESSION_PIECE * SESSION_PIECE);
            if (stream_pieces(s, b, take / SESSION_PIECE) != 0) goto fail;
        } else {
            take = SESSION_PIECE - in < n ? (size_t)(SESSION_PIECE - in) : n;
            if (pio_all(s->fd, s->writing, b, take, s->off) != 0) goto fail;
            ck_update(&s->piece, b, take);
            if (in + take == SESSION_PIECE) s->sum = fold(s->sum, ck_final(&s->piece)), ck_init(&s->piece);
        }
        s->off += take, s->done += take, b += take, n -= take;
    }
    return 0;
fail:
    snprintf(s->err, sizeof s->err, "%s failed at byte %llu of the K/V: %s", s->writing ? "writing" : "reading",
             (unsigned long long)s->done, errno ? strerror(errno) : "short read");
    return -1;
}

int session_put(SessionStream *s, const void *p, size_t n) { return stream_io(s, (void *)p, n); }
int session_get(SessionStream *s, void *p, size_t n) { return stream_io(s, p, n); }

static uint64_t stream_sum(const SessionStream *s) { return s->done % SESSION_PIECE ? fold(s->sum, ck_final(&s->piece)) : s->sum; }

// The CPU format's checksum: per layer, the K then the V rows, folded.
static uint64_t cpu_kv_sum(const Config *c, const RunState *s, int n) {
    size_t layer_bytes = (size_t)n * kv_row_floats(c) * sizeof(float);
    uint64_t kv = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        size_t off = (size_t)l * s->ctx * kv_row_floats(c);
        kv = fold(kv, session_checksum(s->key_cache + off, layer_bytes));
        kv = fold(kv, session_checksum(s->value_cache + off, layer_bytes));
    }
    return kv;
}

// PKV_SESSION_TEST_PAUSE=STAGE (tests only): at that stage of a save, a line on stderr and a
// SIGSTOP, so a test can kill the saver exactly there (tests/test_session.py, test_session_kill.c).
static void test_pause(const char *stage) {
    const char *want = getenv("PKV_SESSION_TEST_PAUSE");
    if (!want || strcmp(want, stage) != 0) return;
    fprintf(stderr, "session: test pause at '%s'\n", stage);
    raise(SIGSTOP);
}

// Makes a rename in path's directory last: fsync of the directory.
static int fsync_dir(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return -1;
    int r = fsync(dfd), e = errno;
    close(dfd);
    errno = e;
    return r;
}

int session_save(const char *path, const Model *m, const RunState *s, const AttnConfig *a, const int *tokens, int n, const SessionExtra *x,
                 char *err) {
    const Config *c = &m->c;
    if (s->dev && !s->be->session_save) return fail(err, "the %s backend does not save sessions", s->be->name);
    if (n < 1 || n > s->ctx) return fail(err, "nothing to save");
    size_t vbytes = (size_t)c->vocab_size * sizeof(float);
    float *zeros_logits = x->logits ? NULL : calloc(c->vocab_size, sizeof(float));
    if (!x->logits && !zeros_logits) return fail(err, "out of memory");
    const float *logits = x->logits ? x->logits : zeros_logits;
    SessionHeader h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, SESSION_MAGIC, 8);
    h.version = SESSION_VERSION, h.header_size = sizeof h;
    h.model_id = session_model_id(m);
    h.config = *c;
    h.kv_format = s->dev ? SESSION_KV_GPU : SESSION_KV_CPU_F32;
    put_attn(&h, a);
    h.n_tokens = n, h.prefill_len = x->prefill_len, h.fp8_end = x->fp8_end, h.kind = x->kind;
    h.tokens_offset = SESSION_ALIGN;
    h.logits_offset = align_up(h.tokens_offset + (uint64_t)n * sizeof(int32_t));
    h.chat_offset = align_up(h.logits_offset + vbytes);
    h.chat_bytes = x->chat_bytes;
    h.kv_offset = align_up(h.chat_offset + h.chat_bytes);
    h.kv_bytes = kv_section_bytes(c, a, h.kv_format, n, x->prefill_len);
    h.file_size = h.kv_offset + h.kv_bytes;
    h.tokens_sum = session_checksum(tokens, (size_t)n * sizeof(int32_t));
    h.logits_sum = session_checksum(logits, vbytes);
    h.chat_sum = session_checksum(x->chat, x->chat_bytes);
    if (session_check_disk(path, h.file_size, err) != 0) { // the disk first: a long session is tens of GiB
        free(zeros_logits);
        return -1;
    }
    // A temporary file of its own beside path (mkostemp: two saves to one path never share one,
    // and no unrelated file is truncated), removed if a signal ends the save.
    char tmp[4200];
    int fd = -1;
    if (strlen(path) > 4000) {
        free(zeros_logits);
        return fail(err, "cannot write '%.256s': path too long", path);
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    sigset_t stop3, before;
    sigemptyset(&stop3), sigaddset(&stop3, SIGINT), sigaddset(&stop3, SIGTERM), sigaddset(&stop3, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop3, &before); // no signal between the file's creation and its guard
    guard_output_begin(NULL);
    fd = mkostemp(tmp, O_CLOEXEC);
    int mk_errno = errno;
    if (fd >= 0) guard_output(tmp);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (fd < 0) {
        guard_output_end();
        free(zeros_logits);
        return fail(err, "cannot create a file beside '%.256s': %s", path, strerror(mk_errno));
    }
    mode_t mask = umask(0); // mkostemp makes 0600; a session gets open()'s usual 0644 under the umask
    umask(mask);
    (void)fchmod(fd, 0644 & ~mask); // left 0600 if it fails: still a session
    test_pause("created");
    // The sections at their offsets (the gaps stay zeros), the K/V, then the header with its sums.
    int bad = pio_all(fd, 1, (void *)tokens, (size_t)n * sizeof(int32_t), h.tokens_offset) ||
              pio_all(fd, 1, (void *)logits, vbytes, h.logits_offset) ||
              (h.chat_bytes && pio_all(fd, 1, (void *)x->chat, x->chat_bytes, h.chat_offset));
    free(zeros_logits);
    SessionStream st;
    stream_init(&st, fd, 1, h.kv_offset);
    char why[SESSION_ERR_LEN] = "";
    test_pause("partial");
    if (!bad && s->dev) {
        AttnConfig ac = *a;
        ac.prefill_len = x->prefill_len;
        SessionGpuLayout L;
        session_gpu_layout(c, &ac, n, &L);
        bad = s->be->session_save(s->dev, &L, &st, why) != 0;
        if (!bad && st.done != h.kv_bytes) bad = 1, snprintf(why, sizeof why, "internal: %llu bytes of K/V written, %llu expected",
                                                           (unsigned long long)st.done, (unsigned long long)h.kv_bytes);
        h.kv_sum = stream_sum(&st);
    } else if (!bad) {
        size_t layer_bytes = (size_t)n * kv_row_floats(c) * sizeof(float);
        for (uint32_t l = 0; l < c->n_layers && !bad; l++) {
            size_t off = (size_t)l * s->ctx * kv_row_floats(c);
            bad = session_put(&st, s->key_cache + off, layer_bytes) || session_put(&st, s->value_cache + off, layer_bytes);
        }
        h.kv_sum = cpu_kv_sum(c, s, n);
    }
    if (!why[0] && st.err[0]) snprintf(why, sizeof why, "%s", st.err);
    h.header_sum = header_sum(&h);
    // The data on the disk before the name points at it, and the name on the disk before we say
    // saved: after a power loss path holds the old session or the new one, whole (SQLite, git).
    if (!bad) bad = pio_all(fd, 1, &h, sizeof h, 0) || ftruncate(fd, (off_t)h.file_size) != 0 || fsync(fd) != 0;
    int e = errno;
    if (close(fd) != 0 && !bad) bad = 1, e = errno;
    if (!bad) test_pause("written");
    // A signal that came before the rename removed tmp, so the rename fails (ENOENT); one after
    // it finds no tmp to remove: either way path holds a whole session, the old one or the new.
    int renamed = !bad && rename(tmp, path) == 0;
    if (!bad && !renamed) bad = 1, e = errno;
    if (renamed) guard_output(NULL), test_pause("renamed");
    int cut = guard_output_end();
    if (!renamed) {
        unlink(tmp); // (gone already after a signal)
        if (cut) return fail(err, "interrupted: '%.256s' not written (the partial file removed)", path);
        if (why[0]) return fail(err, "cannot write '%.256s': %.300s", path, why);
        return fail(err, "cannot write '%.256s' (%.2f GiB): %s", path, h.file_size / 1073741824.0, strerror(e));
    }
    // A file system without directory fsync (EINVAL) keeps its own order; any other failure may
    // lose the new name at a power loss.
    if (fsync_dir(path) != 0 && errno != EINVAL && errno != ENOTSUP)
        return fail(err, "wrote '%.256s', but the directory's fsync failed, so a power loss may undo it: %s", path, strerror(errno));
    return 0;
}

// Why the session cannot be read by the path `gpu` loads it with (its K/V format is the other's),
// without the file's name; 0 when it can.
static int path_refusal(const SessionHeader *h, int gpu, char *err) {
    if (gpu && h->kv_format != SESSION_KV_GPU)
        return fail(err, "saved by the CPU path (fp32 K/V): load it with --device cpu (the GPU reads sessions saved on the GPU)");
    if (!gpu && h->kv_format != SESSION_KV_CPU_F32)
        return fail(err, "saved by the GPU path (bf16 K/V): load it on the GPU (the CPU reads sessions saved on the CPU)");
    return 0;
}

int session_check_header(const SessionHeader *h, uint64_t file_size, uint64_t model_id, const Config *c, const AttnConfig *a, int gpu,
                         char *err) {
    if (memcmp(h->magic, SESSION_MAGIC, 8) != 0) return fail(err, "not a session file (no %s magic)", SESSION_MAGIC);
    if (h->version != SESSION_VERSION || h->header_size != sizeof *h)
        return fail(err, "session format %u (header %u bytes) is not this runner's (%d, %zu bytes)", h->version, h->header_size,
                    SESSION_VERSION, sizeof *h);
    if (header_sum(h) != h->header_sum) return fail(err, "the session header is damaged (checksum mismatch)");
    if (h->model_id != model_id || memcmp(&h->config, c, sizeof *c) != 0)
        return fail(err, "the session was made with another model (%u layers, dim %u, vocab %u%s)", h->config.n_layers, h->config.dim,
                    h->config.vocab_size, memcmp(&h->config, c, sizeof *c) == 0 ? ", other weights" : "");
    if (h->kv_format != SESSION_KV_CPU_F32 && h->kv_format != SESSION_KV_GPU)
        return fail(err, "session K/V format %u is not one this runner reads", h->kv_format);
    // The path before the settings: each path has its own default dense crossover, so the other
    // path's session differs in them too, and that is not what the user can change.
    if (gpu >= 0 && path_refusal(h, gpu, err)) return -1;
    SessionHeader want = *h;
    put_attn(&want, a);
    if (memcmp(&want, h, sizeof want) != 0)
        return fail(err, "the session was made under other attention settings (--attn %s, --topk %d, --sink %d, --local %d, --update %d, "
                    "--kv-store-dtype %s, --dense-below %d): give the same ones",
                    attn_method_name(h->attn_method) ? attn_method_name(h->attn_method) : "?", h->topk, h->sink, h->local, h->update,
                    h->zone_fp8 ? "fp8" : "bf16", h->dense_min);
    if (h->n_tokens < 1 || h->prefill_len < 0 || h->prefill_len > h->n_tokens || h->n_tokens > (1 << 30) || h->fp8_end < 0 ||
        h->fp8_end > h->n_tokens || (h->kind != SESSION_PROMPT && h->kind != SESSION_CHAT) || h->chat_bytes > (1ull << 40) ||
        (h->kind == SESSION_PROMPT && h->chat_bytes))
        return fail(err, "the session header is inconsistent (%d tokens, prompt %d, kind %d)", h->n_tokens, h->prefill_len, h->kind);
    uint64_t n = (uint64_t)h->n_tokens;
    uint64_t logits_end = h->logits_offset + (uint64_t)c->vocab_size * sizeof(float);
    if (h->tokens_offset != SESSION_ALIGN || h->logits_offset != align_up(h->tokens_offset + n * 4) || h->chat_offset != align_up(logits_end) ||
        h->kv_offset != align_up(h->chat_offset + h->chat_bytes) ||
        h->kv_bytes != kv_section_bytes(c, a, h->kv_format, h->n_tokens, h->prefill_len) || h->file_size != h->kv_offset + h->kv_bytes)
        return fail(err, "the session header is inconsistent (its sections do not add up)");
    if (file_size != h->file_size)
        return fail(err, "the session file has %llu bytes, its header says %llu: truncated or damaged", (unsigned long long)file_size,
                    (unsigned long long)h->file_size);
    return 0;
}

int session_open(const char *path, const Model *m, const AttnConfig *a, int gpu, SessionHeader *h, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, "cannot open session '%.256s': %s", path, strerror(errno));
    struct stat st;
    int got = fstat(fileno(f), &st) == 0 && fread(h, 1, sizeof *h, f) == sizeof *h;
    fclose(f);
    if (!got) return fail(err, "session '%.256s': too short for a session header", path);
    if (session_check_header(h, (uint64_t)st.st_size, session_model_id(m), &m->c, a, gpu, err) != 0) {
        char why[SESSION_ERR_LEN];
        memcpy(why, err, sizeof why);
        return fail(err, "session '%.200s': %.300s", path, why);
    }
    return 0;
}

int session_check_path(const SessionHeader *h, int gpu, const char *path, char *err) {
    char why[SESSION_ERR_LEN];
    if (path_refusal(h, gpu, why)) return fail(err, "session '%.256s' was %.300s", path, why);
    return 0;
}

int session_read(const char *path, const SessionHeader *h, RunState *s, int *tokens, float *logits, void **chat, char *err) {
    const Config *c = &h->config;
    *chat = NULL;
    if (session_check_path(h, s->dev != NULL, path, err) != 0) return -1;
    if (s->dev && !s->be->session_load) return fail(err, "the %s backend does not restore sessions", s->be->name);
    if (h->n_tokens > s->ctx) return fail(err, "session '%.256s' has %d positions, more than the context of %d", path, h->n_tokens, s->ctx);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(err, "cannot open session '%.256s': %s", path, strerror(errno));
    size_t n = (size_t)h->n_tokens;
    int bad = pio_all(fd, 0, tokens, n * sizeof(int32_t), h->tokens_offset) || pio_all(fd, 0, logits, (size_t)c->vocab_size * 4, h->logits_offset);
    if (!bad && h->chat_bytes) {
        *chat = malloc((size_t)h->chat_bytes);
        bad = !*chat || pio_all(fd, 0, *chat, (size_t)h->chat_bytes, h->chat_offset);
    }
    SessionStream st;
    stream_init(&st, fd, 0, h->kv_offset);
    char why[SESSION_ERR_LEN] = "";
    uint64_t kv = 0;
    if (!bad && s->dev) {
        AttnConfig ac;
        memset(&ac, 0, sizeof ac);
        ac.method = h->attn_method, ac.topk = h->topk, ac.sink = h->sink, ac.local = h->local, ac.update = h->update;
        ac.dense_min = h->dense_min, ac.zone_fp8 = h->zone_fp8, ac.beta = h->beta, ac.rho = h->rho, ac.prefill_len = h->prefill_len;
        SessionGpuLayout L;
        session_gpu_layout(c, &ac, h->n_tokens, &L);
        bad = s->be->session_load(s->dev, &L, &st, why) != 0;
        if (!bad && st.done != h->kv_bytes) bad = 1, snprintf(why, sizeof why, "internal: %llu bytes of K/V read, %llu in the file",
                                                            (unsigned long long)st.done, (unsigned long long)h->kv_bytes);
        kv = stream_sum(&st);
    } else if (!bad) {
        size_t layer_bytes = n * kv_row_floats(c) * sizeof(float);
        for (uint32_t l = 0; l < c->n_layers && !bad; l++) {
            size_t off = (size_t)l * s->ctx * kv_row_floats(c);
            bad = session_get(&st, s->key_cache + off, layer_bytes) || session_get(&st, s->value_cache + off, layer_bytes);
        }
        if (!bad) kv = cpu_kv_sum(c, s, h->n_tokens);
    }
    if (!why[0] && st.err[0]) snprintf(why, sizeof why, "%s", st.err);
    close(fd);
    const char *which = bad ? NULL
                        : kv != h->kv_sum                                                       ? "K/V"
                        : session_checksum(tokens, n * 4) != h->tokens_sum                      ? "tokens"
                        : session_checksum(logits, (size_t)c->vocab_size * 4) != h->logits_sum ? "logits"
                        : session_checksum(*chat, (size_t)h->chat_bytes) != h->chat_sum          ? "conversation"
                                                                                                  : NULL;
    int out_of_range = 0;
    for (size_t i = 0; i < n && !bad && !which; i++) out_of_range |= tokens[i] < 0 || (uint32_t)tokens[i] >= c->vocab_size;
    if (bad || which || out_of_range) {
        free(*chat);
        *chat = NULL;
        if (bad && why[0]) return fail(err, "session '%.200s': %.300s", path, why);
        if (bad) return fail(err, "session '%.256s': read failed (truncated while open?)", path);
        if (which) return fail(err, "session '%.256s' is damaged (checksum mismatch in its %s)", path, which);
        return fail(err, "session '%.256s': a token is out of range", path);
    }
    return 0;
}
