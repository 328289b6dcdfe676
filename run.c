// ./run: the command line. Modes: generate (default), --chat, --render-chat, --score, --tokenize.
#include "model/errmsg.h"
#include "model/guard.h"
#include "model/model.h"
#include "model/pool.h"
#include "model/session.h"
#include "model/sampler.h"
#include "model/version.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#define SCORE_CHUNK_GPU 256 // score keeps logits for a whole chunk: (chunk, vocab) floats

typedef struct {
    const char *model_path;
    const char *prompt;       // -p
    const char *prompt_file;  // -f
    const char *score_file;   // --score
    int score_prompt;         // --score-prompt: its first N tokens are a prompt (attended densely)
    const char *save_session; // --save-session FILE: after the prompt
    const char *load_session; // --load-session FILE: resume from it instead of prefilling
    int tokenize;             // --tokenize
    int ids;                  // --ids: prompts and outputs are token ids
    int steps;                // -n
    int ctx;                  // --ctx (0: fit the run)
    int ignore_eos;
    float temperature, top_p, min_p;
    int top_k;
    int sampling_set;         // any sampling flag given: generation_config.json defaults are off
    unsigned long long seed;
    int seed_set;             // --seed given (else the time, printed on the stats line)
    float repeat_penalty, presence_penalty, frequency_penalty; // 1, 0, 0: off
    int repeat_last_n;        // the penalties' window (-1: the whole context)
    const char *stops[16];    // --stop STR: generation ends before the first occurrence
    int n_stops;
    const char *device;       // --device cpu|gpu|auto
    int threads;              // --threads N, or OMP_NUM_THREADS (0: tuned, at most the CPUs we may use)
    int bench;                // --bench
    const char *synthetic;    // --synthetic NAME
    const char *quant;        // --quant q8_0|q4_k|q4_0: a synthetic model's matrices
    const char *bench_ctx;    // --bench-ctx 4096,32768
    int bench_steps;
    int bench_prefill;
    AttnConfig attn;          // --attn --topk --sink --local --update
    int attn_set;             // --attn given
    int steps_set;            // -n given (a chat reply otherwise runs to its end)
    int chat;                 // --chat
    const char *system;       // --system
    const char *date;         // --date: Llama 3.1's "Today Date"
    int think;                // --think 1, --no-think 0, else -1 (the template's default)
    const char *render_chat;  // --render-chat FILE
} Options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: ./run model.bin [options]\n"
            "generate (default):\n"
            "  -p TEXT          prompt\n"
            "  -f FILE          prompt from a file (long prompts)\n"
            "  -n N             tokens to generate (default 256)\n"
            "  --ids            the prompt is whitespace-separated token ids (no BOS added) and the\n"
            "                   output is the generated ids\n"
            "  --ignore-eos     keep generating past an end-of-sequence token\n"
            "sampling (defaults: the model's generation_config.json, else temperature 0.8, top-p 0.95):\n"
            "  --temp T         temperature; 0 is greedy\n"
            "  --top-k K        keep the K most likely tokens (0: off)\n"
            "  --top-p P        nucleus sampling (1: off)\n"
            "  --min-p P        drop tokens below P x the top probability (0: off)\n"
            "  --seed S         random seed (default: the time, printed on the stats line)\n"
            "  --repeat-penalty R     divide a seen token's positive logit by R, multiply a negative\n"
            "                   one (CTRL, as transformers; 1: off)\n"
            "  --presence-penalty P   subtract P from the logit of every seen token (0: off)\n"
            "  --frequency-penalty F  subtract F x the times a token was seen (0: off)\n"
            "  --repeat-last-n N      the penalties look at the last N tokens, prompt included\n"
            "                   (default 64; -1: the whole context)\n"
            "  --stop STR       end the generation before STR (not printed); repeatable, up to 16\n"
            "chat:\n"
            "  --chat           interactive chat (multi-turn, streaming); -p or -f gives the first user\n"
            "                   message; one message per line when stdin is not a terminal; /reset\n"
            "                   clears the conversation, /exit quits, Ctrl-C stops a reply; -n caps a\n"
            "                   reply; the KV cache holds --ctx positions (default 4096)\n"
            "  --system TEXT    the system message\n"
            "  --think, --no-think   Qwen3: thinking on (the template's default) or off\n"
            "  --date TEXT      Llama 3.1: the system header's 'Today Date' (default: the template's)\n"
            "  --render-chat FILE.json   print the token ids of the conversation in FILE (a JSON list\n"
            "                   of {\"role\", \"content\"}) rendered by the model's chat template, with\n"
            "                   the generation prompt\n"
            "sessions:\n"
            "  --save-session F after the prompt, write its tokens and K/V to F (versioned, checksummed)\n"
            "  --load-session F resume from F instead of prefilling its tokens (same model, same --attn\n"
            "                   settings); -p / -f text, if given, follows them as more prompt\n"
            "scoring and tokens:\n"
            "  --score FILE     teacher-forced scoring of FILE's text (no BOS), or of its ids with\n"
            "                   --ids: one line 'i next_id nll top1' per position (top1: the most\n"
            "                   likely next id), then 'mean_nll X ppl Y'\n"
            "  --score-prompt N its first N tokens are a prompt, attended densely as -p's would be\n"
            "                   (then the attention policy from N on, as for a generation; default 0)\n"
            "  --tokenize -f FILE   print the token ids of FILE's text (no BOS)\n"
            "memory and device:\n"
            "  --ctx N          KV cache positions (default: what the run needs, at most the model's)\n"
            "  --device D       cpu, gpu or auto (default: the GPU when there is one)\n"
            "  --threads N      CPU threads (default: the CPUs this process may use, fewer while that\n"
            "                   measures faster, e.g. beside another busy process; OMP_NUM_THREADS\n"
            "                   fixes the count as --threads does)\n"
            "benchmark (GPU):\n"
            "  --bench          time decode steps at each context and print TPOT beside the bandwidth floor\n"
            "  --synthetic NAME random weights of a real shape instead of a model file:\n"
            "                   llama3.1-8b, qwen3-8b, qwen3-0.6b; also without --bench, on the GPU, to\n"
            "                   generate from a prompt of ids (--ids -f FILE -n N) or --score ids (--ids)\n"
            "  --quant q8_0|q4_k|q4_0 a --synthetic model's matrices as Q8_0, Q4_K or Q4_0 blocks (head Q8_0)\n"
            "  --bench-ctx LIST contexts to fill, e.g. 4096,32768,131072 (default 4096,32768,131072)\n"
            "  --bench-steps N  timed decode steps per context (default 64, at least 64)\n"
            "  --bench-prefill  fill by a real prefill of random tokens (timed) instead of random K/V\n"
            "  --bench --attn pariskv  the ParisKV step (zone of random K/V, --kv-store, --topk), its\n"
            "                   index update and its floor\n"
            "attention (dense while the sequence is shorter than max(2000, sink + local + 2 topk)):\n"
            "  --attn A         pariskv (default), full, or a peer (CPU only): streaming, quest, fier, kmeans, oracle\n"
            "  --topk K         retrieval-zone keys attended per step and KV head (default 100)\n"
            "  --sink S         first tokens, always attended (default 4)\n"
            "  --local L        most recent tokens, always attended (default 256)\n"
            "  --update U       update buffer: after U decode steps the oldest U recent tokens join\n"
            "                   the retrieval zone (default 512)\n"
            "  --kv-store S     GPU, pariskv: the retrieval zone's K/V in gpu memory, in pinned host\n"
            "                   memory (read through PCIe, top-k rows a step), or auto (default: gpu\n"
            "                   when the whole context fits there, else host)\n"
            "  --kv-store-dtype T  the retrieval zone's K/V as bf16 (default) or fp8 (e4m3 with a\n"
            "                   scale per row: half the host memory and PCIe bytes; GPU: host store\n"
            "                   only; the CPU path rounds those rows the same way)\n"
            "  --version        the version, and whether this build has the CUDA backend\n"
            "  -h, --help       this text\n");
}

// One line on stderr (messages quote file contents: control bytes are masked), exit status 1.
static void die(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fflush(stdout); // what was generated so far comes first
    fprintf(stderr, "error: %s\n", err_oneline(msg));
    exit(1);
}

// ---- signals and output ----

// Ctrl-C sets `interrupted` (on_sigint, with chat below); generation and chat stop the reply.
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig);

static void catch_sigint(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint; // no SA_RESTART: Ctrl-C at a prompt interrupts the read
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

// A failed write to stdout (a full disk) is an error. A reader that went away (`./run | head`)
// ends the program quietly by SIGPIPE's default action, which main restores in case it came
// ignored or blocked; EPIPE here means it could not be restored: the same quiet end.
static void flush_out(void) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return;
    if (errno == EPIPE) _exit(128 + SIGPIPE);
    die("cannot write the output: %s", strerror(errno));
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long parse_long(const char *s, const char *flag, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) die("%s needs an integer in [%ld, %ld], got '%s'", flag, lo, hi, s);
    return v;
}

static float parse_float(const char *s, const char *flag, float lo, float hi) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) die("%s needs a number in [%g, %g], got '%s'", flag, lo, hi, s);
    return v;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) die("out of memory reading '%s'", path);
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        cap *= 2;
        buf = realloc(buf, cap);
    }
    if (ferror(f)) die("cannot read '%s'", path);
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

// Whitespace-separated ids, each checked against the vocabulary.
static int *parse_ids(const char *text, int vocab, int *n_out) {
    int cap = 256, n = 0;
    int *ids = malloc((size_t)cap * sizeof(int));
    if (!ids) die("out of memory");
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= vocab || (*end && !strchr(" \t\r\n", *end))) {
            int w = (int)strcspn(p, " \t\r\n"); // the bad id alone, not what follows it
            die("token id '%.*s%s' is not an integer in [0, %d)", w < 40 ? w : 40, p, w > 40 ? "..." : "", vocab);
        }
        if (n == INT_MAX / 2) die("more than %d token ids", n);
        if (n == cap) ids = realloc(ids, (size_t)(cap *= 2) * sizeof(int));
        if (!ids) die("out of memory");
        ids[n++] = (int)v;
        p = end;
    }
    *n_out = n;
    return ids;
}

// what: the input's name for messages ("the prompt", "'file.txt'"). Invalid UTF-8 is refused,
// as chat refuses such a message: the encoder would drop those bytes without a word.
static int *encode_text(const Tokenizer *tok, const char *what, const char *text, size_t len, int *n_out) {
    long bad = tokenizer_utf8_invalid_at(text, len);
    if (bad >= 0)
        die("%s is not valid UTF-8: byte 0x%02x at offset %ld (give text in UTF-8, or token ids with --ids)", what,
            (unsigned)(unsigned char)text[bad], bad);
    char err[TOK_ERR_LEN];
    int *ids = NULL;
    long n = tokenizer_encode(tok, text, len, 1, &ids, err);
    if (n < 0) die("cannot tokenize the input: %s", err);
    if (n > INT_MAX / 2) die("input of %ld tokens is too long", n);
    *n_out = (int)n;
    return ids;
}

// ---- attention policy ----

// Consumes one attention option (its value is v); returns 0 when a is not one.
static int attn_option(Options *o, const char *a, const char *v) {
    int *field = strcmp(a, "--topk") == 0 ? &o->attn.topk : strcmp(a, "--sink") == 0 ? &o->attn.sink
               : strcmp(a, "--local") == 0 ? &o->attn.local : strcmp(a, "--update") == 0 ? &o->attn.update : NULL;
    if (!field && strcmp(a, "--attn") != 0) return 0;
    if (!v) die("%s needs a value", a);
    if (field) {
        *field = (int)parse_long(v, a, field == &o->attn.topk || field == &o->attn.update ? 1 : 0, 1 << 24);
    } else {
        o->attn.method = attn_method_parse(v), o->attn_set = 1;
        if (o->attn.method < 0) die("--attn must be full, pariskv, streaming, quest, fier, kmeans or oracle, not '%s'", v);
    }
    return 1;
}

// The run's attention policy: NULL (dense) for full attention, or when no position of the
// context ever leaves the dense regime. prefill_len: the prompt, attended densely; --score passes
// 0, so every scored position is a decode step that sees what step-by-step decoding would.
static AttnPolicy *make_attn(const Options *o, const Model *m, const RunState *s, int prefill_len) {
    AttnConfig c = o->attn;
    c.prefill_len = prefill_len;
    if (c.method == ATTN_FULL || s->ctx < attn_dense_threshold(&c) || s->ctx <= prefill_len) return NULL;
    if (s->dev) { // the GPU pass runs its policy itself (it was given o->attn at creation)
        if (s->be->set_prefill_len) s->be->set_prefill_len(s->dev, prefill_len);
        return NULL;
    }
    char err[ATTN_ERR_LEN];
    AttnPolicy *p = attn_policy_create(&c, &pool_parallel, (int)m->c.n_layers, (int)m->c.n_heads, (int)m->c.n_kv_heads, (int)m->c.head_dim, s->ctx, err);
    if (!p) die("%s", err);
    return p;
}

static const char *plural(long n) { return n == 1 ? "" : "s"; }

// One line on stderr once a run's state exists: what runs, where, with what.
static void print_summary(const Model *m, const RunState *s, const Options *o) {
    const Config *c = &m->c;
    double attn = (double)c->dim * c->head_dim * (2.0 * c->n_heads + 2.0 * c->n_kv_heads);
    double per_layer = attn + 3.0 * c->dim * c->hidden_dim + 2.0 * c->dim + (c->qk_norm ? 2.0 * c->head_dim : 0);
    double params = c->n_layers * per_layer + (c->tied_embeddings ? 1.0 : 2.0) * c->vocab_size * c->dim + c->dim;
    char thr[48] = "";
    if (!s->dev) snprintf(thr, sizeof thr, ", %s%d thread%s%s", o->threads ? "" : "up to ", pool_max_threads(), plural(pool_max_threads()),
                          o->threads ? "" : " (tuned)");
    char dt[64];
    fprintf(stderr, "%s, %.1fM parameters, %s weights, context %d (trained %u), %s%s\n", c->arch == ARCH_QWEN3 ? "qwen3" : "llama",
            params / 1e6, model_weights_desc(m, dt, sizeof dt), s->ctx, c->max_seq_len, s->dev ? "gpu" : "cpu", thr);
}

// The CPU pass's thread tuners (decode steps, chunks) for a run's state.
// Called before the run's first parallel operation (the pool's threads, spinning for a moment
// after one, would count as running in threads_guess), and only by the modes that run the model.
static void attach_tuners(RunState *s, ThreadTuner tt[2], const Options *o) {
    int guess = o->threads || s->dev ? 0 : threads_guess(pool_max_threads()); // the GPU pass has no tuner
    for (int i = 0; i < 2; i++) tuner_init(&tt[i], pool_max_threads(), o->threads, guess);
    s->threads = tt;
}

// Runs tokens through the model in chunks; calls on_logits for each chunk when all_logits.
typedef void (*LogitsFn)(const float *logits, int first, int T, void *ctx);
// label names what the progress line counts ("prefill", "score").
static float *prefill(const Model *m, RunState *s, const char *label, const int *tokens, int n, int pos, int all_logits, LogitsFn fn, void *ctx) {
    float *logits = NULL;
    double t0 = now_s();
    int chunk = s->chunk, show = n > 8 * chunk, tty = isatty(STDERR_FILENO), last_tenth = 0;
    char err[MODEL_ERR_LEN];
    if (pos == 0 && !all_logits && s->dev && s->be->prompt_whole && s->be->prompt_whole(s->dev, n)) { // it shows its own progress
        if (!(logits = model_forward(m, s, tokens, n, 0, 0, err))) die("%s", err);
        return logits;
    }
    for (int i = 0; i < n; i += chunk) {
        if (interrupted) return NULL; // only when the caller catches SIGINT (generation)
        int T = n - i < chunk ? n - i : chunk;
        logits = model_forward(m, s, tokens + i, T, pos + i, all_logits, err);
        if (!logits) die("%s", err);
        if (fn) fn(logits, i, T, ctx);
        // Progress: redrawn in place on a terminal; in a log, a plain line per tenth of the way.
        int tenth = (int)(10L * (i + T) / n);
        if (show && (tty || tenth > last_tenth)) {
            double el = now_s() - t0;
            fprintf(stderr, "%s%s: %d/%d tokens (%.0f tok/s)%s", tty ? "\r" : "", label, i + T, n, (i + T) / (el > 0 ? el : 1e-9), tty ? "" : "\n");
            last_tenth = tenth;
        }
    }
    if (show && tty) fprintf(stderr, "\n");
    return logits;
}

static int pick_ctx(const Options *o, const Config *c, int need) {
    if (o->ctx > 0) {
        if ((uint32_t)o->ctx > c->max_seq_len)
            fprintf(stderr, "warning: --ctx %d is past the model's trained context of %u\n", o->ctx, c->max_seq_len);
        return o->ctx;
    }
    return need < (int)c->max_seq_len ? need : (int)c->max_seq_len;
}

// ---- score ----

typedef struct {
    const int *tokens;
    int n, vocab;
    double total;
    int base; // position of the current prefill call's first token
} ScoreCtx;

typedef struct {
    const float *logits;
    const int *next; // the token that follows each row's position
    int vocab;
    double *nll;
    int *top;
} ScoreRows;

static void score_row(void *ctx, int t, int thread) {
    (void)thread;
    ScoreRows *r = ctx;
    const float *l = r->logits + (size_t)t * r->vocab;
    r->top[t] = argmax(l, r->vocab);
    float mx = l[r->top[t]];
    double sum = 0.0;
    for (int j = 0; j < r->vocab; j++) sum += exp((double)l[j] - mx);
    r->nll[t] = log(sum) + mx - l[r->next[t]];
}

static void score_chunk(const float *logits, int first, int T, void *p) {
    ScoreCtx *sc = p;
    first += sc->base;
    int n = first + T < sc->n ? T : sc->n - 1 - first; // the last token has no successor
    if (n <= 0) return;
    double *nll = malloc((size_t)n * sizeof(double));
    int *top = malloc((size_t)n * sizeof(int));
    if (!nll || !top) die("out of memory");
    // log-softmax over the vocabulary for each row: the rows are independent
    ScoreRows r = {logits, sc->tokens + first + 1, sc->vocab, nll, top};
    pool_run(n, score_row, &r);
    for (int t = 0; t < n; t++) {
        sc->total += nll[t];
        printf("%d\t%d\t%.6f\t%d\n", first + t, sc->tokens[first + t + 1], nll[t], top[t]);
    }
    flush_out();
    free(nll);
    free(top);
}

static void run_score(const Model *m, const Tokenizer *tok, const Options *o) {
    size_t len;
    char *text = read_file(o->score_file, &len);
    int n;
    char what[300];
    snprintf(what, sizeof what, "'%.256s'", o->score_file);
    int *tokens = o->ids ? parse_ids(text, (int)m->c.vocab_size, &n) : encode_text(tok, what, text, len, &n);
    free(text);
    int ctx = pick_ctx(o, &m->c, n);
    RunState s;
    char err[MODEL_ERR_LEN];
    int chunk = m->be->create ? SCORE_CHUNK_GPU : m->be->max_chunk;
    // Checked with the tokens freed first, so a sanitizer build sees no leak on these exits.
    if (n < 2 || n > ctx || run_state_init_attn(&s, m, ctx, chunk, 1, &o->attn, err) != 0) {
        free(tokens);
        if (n < 2) die("--score needs at least 2 tokens, '%s' has %d", o->score_file, n);
        if (n > ctx) die("'%s' has %d tokens, more than the context of %d", o->score_file, n, ctx);
        die("%s", err);
    }
    if (o->score_prompt > n) {
        run_state_free(&s);
        free(tokens);
        die("--score-prompt %d: '%s' has only %d tokens", o->score_prompt, o->score_file, n);
    }
    s.attn = make_attn(o, m, &s, o->score_prompt);
    ThreadTuner tt[2];
    attach_tuners(&s, tt, o);
    print_summary(m, &s, o);
    ScoreCtx sc = {tokens, n, (int)m->c.vocab_size, 0.0, 0};
    double t0 = now_s();
    if (getenv("PKV_RECALL") && o->score_prompt > 0) { // the measurement reads each step's own selection
        prefill(m, &s, "score", tokens, o->score_prompt, 0, 1, score_chunk, &sc);     // (attention/recall.h):
        s.chunk = 1, sc.base = o->score_prompt;                                         // the positions after
        prefill(m, &s, "score", tokens + o->score_prompt, n - o->score_prompt, o->score_prompt, 1, score_chunk, &sc); // the prompt one at a time
    } else {
        prefill(m, &s, "score", tokens, n, 0, 1, score_chunk, &sc);
    }
    double el = now_s() - t0;
    double mean = sc.total / (n - 1);
    printf("mean_nll %.6f ppl %.6f\n", mean, exp(mean));
    fprintf(stderr, "score: %d tokens in %.2f s (%.1f tok/s)\n", n, el, n / el);
    if (s.attn) s.attn->destroy(s.attn);
    run_state_free(&s);
    free(tokens);
}

// ---- generate ----

// --stop: output is held back while it could be the start of a stop string; when one appears,
// what precedes it is printed and the generation ends.
typedef struct {
    const char *const *stops;
    int n;
    char *held; // text not yet printed
    size_t len;
} StopFilter;

// Adds text; returns 1 when a stop string is complete (the text before it printed).
static int stop_feed(StopFilter *f, const char *text, size_t k) {
    if (f->n == 0) return fwrite(text, 1, k, stdout), 0;
    if (!(f->held = realloc(f->held, f->len + k + 1))) die("out of memory");
    memcpy(f->held + f->len, text, k);
    f->len += k;
    f->held[f->len] = 0;
    size_t cut = f->len, keep = 0;
    for (int i = 0; i < f->n; i++) {
        const char *at = memmem(f->held, f->len, f->stops[i], strlen(f->stops[i]));
        if (at && (size_t)(at - f->held) < cut) cut = (size_t)(at - f->held);
    }
    if (cut < f->len) {
        fwrite(f->held, 1, cut, stdout);
        f->len = 0;
        return 1;
    }
    // the longest tail that is a proper prefix of a stop string stays held
    for (int i = 0; i < f->n; i++) {
        size_t sl = strlen(f->stops[i]);
        for (size_t t = sl - 1 < f->len ? sl - 1 : f->len; t > keep; t--)
            if (memcmp(f->held + f->len - t, f->stops[i], t) == 0) {
                keep = t;
                break;
            }
    }
    fwrite(f->held, 1, f->len - keep, stdout);
    memmove(f->held, f->held + f->len - keep, keep);
    f->len = keep;
    return 0;
}

static void stop_flush(StopFilter *f) {
    if (f->len) fwrite(f->held, 1, f->len, stdout); // held is NULL until a stop string was given
    f->len = 0;
}

// A long generation's TPOT over its course: the first, a middle and the last 1,000 decode
// steps, each bin's mean, median and slowest step (index updates included, as they happen).
#define TPOT_BIN 1000
#define TPOT_BINS_FROM (3 * TPOT_BIN)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void print_tpot_bins(const double *ms, int n, int n_prompt) {
    double *tmp = malloc(TPOT_BIN * sizeof(double));
    if (!tmp) return;
    fprintf(stderr, "TPOT over the generation (ms, decode steps; context = prompt %d + step):\n", n_prompt);
    fprintf(stderr, "| bin | steps | mean | median | max |\n| --- | --- | --- | --- | --- |\n");
    const char *name[3] = {"first", "middle", "last"};
    int from[3] = {0, (n - TPOT_BIN) / 2, n - TPOT_BIN};
    for (int b = 0; b < 3; b++) {
        double sum = 0, mx = 0;
        for (int i = 0; i < TPOT_BIN; i++) {
            tmp[i] = ms[from[b] + i];
            sum += tmp[i];
            if (tmp[i] > mx) mx = tmp[i];
        }
        qsort(tmp, TPOT_BIN, sizeof(double), cmp_double);
        fprintf(stderr, "| %s | %d-%d | %.3f | %.3f | %.3f |\n", name[b], from[b] + 1, from[b] + TPOT_BIN, sum / TPOT_BIN,
                (tmp[TPOT_BIN / 2 - 1] + tmp[TPOT_BIN / 2]) / 2, mx);
    }
    free(tmp);
}

static void run_generate(const Model *m, const Tokenizer *tok, const Options *o) {
    if (o->ids && o->n_stops) die("--stop applies to text output, not --ids");
    const Config *c = &m->c;
    int n_prompt = 0, *prompt;
    if (o->ids) { // ids from -p, or from the file of -f
        size_t len = 0;
        char *text = o->prompt_file ? read_file(o->prompt_file, &len) : NULL;
        prompt = parse_ids(text ? text : o->prompt ? o->prompt : "", (int)c->vocab_size, &n_prompt);
        free(text);
    } else {
        size_t len = 0;
        char *text = o->prompt_file ? read_file(o->prompt_file, &len) : NULL;
        const char *src = text ? text : (o->prompt ? o->prompt : "");
        if (!text) len = strlen(src);
        int n_text;
        char what[300] = "the prompt (-p)";
        if (text) snprintf(what, sizeof what, "'%.256s'", o->prompt_file);
        int *ids = encode_text(tok, what, src, len, &n_text);
        free(text);
        int bos = tokenizer_add_bos(tok) && tokenizer_bos(tok) >= 0 && !o->load_session; // text after a session: no second BOS
        prompt = malloc(((size_t)n_text + 1) * sizeof(int));
        if (!prompt) die("out of memory");
        if (bos) prompt[n_prompt++] = tokenizer_bos(tok);
        memcpy(prompt + n_prompt, ids, (size_t)n_text * sizeof(int));
        n_prompt += n_text;
        free(ids);
    }
    // A session: its tokens, then the prompt's (if any) as more of the prompt.
    SessionHeader sh;
    int n_saved = 0;
    if (o->load_session) {
        char serr[SESSION_ERR_LEN];
        if (session_open(o->load_session, m, &o->attn, &sh, serr) != 0 || session_check_path(&sh, m->be->create != NULL, o->load_session, serr) != 0)
            die("%s", serr);
        if (sh.kind != SESSION_PROMPT) die("session '%s' is a chat's (/save): resume it with --chat", o->load_session);
        n_saved = sh.n_tokens;
        int *all = malloc(((size_t)n_saved + n_prompt) * sizeof(int));
        if (!all) die("out of memory");
        memcpy(all + n_saved, prompt, (size_t)n_prompt * sizeof(int)); // the saved ones are read with the K/V
        free(prompt);
        prompt = all;
        n_prompt += n_saved;
    }
    if (n_prompt == 0) die("the prompt is empty (give -p TEXT or -f FILE)");
    long want = (long)n_prompt + o->steps;
    int ctx = pick_ctx(o, c, want > INT_MAX ? INT_MAX : (int)want);
    if (o->steps == 0 ? n_prompt > ctx : n_prompt >= ctx) // -n 0: prefill only (timing it)
        die("the prompt has %d tokens, which leaves no room in a context of %d (raise --ctx; the model was trained on %u)",
            n_prompt, ctx, c->max_seq_len);
    RunState s;
    char err[MODEL_ERR_LEN];
    if (run_state_init_attn(&s, m, ctx, m->be->max_chunk, 0, &o->attn, err) != 0) die("%s", err);
    s.attn = make_attn(o, m, &s, n_prompt);
    ThreadTuner tt[2];
    attach_tuners(&s, tt, o);
    print_summary(m, &s, o);
    float *saved_logits = NULL;
    double t_restore = 0;
    if (o->load_session) { // the K/V of the saved positions, and the logits after the last
        char serr[SESSION_ERR_LEN];
        double tr = now_s();
        if (!(saved_logits = malloc((size_t)c->vocab_size * sizeof(float)))) die("out of memory");
        void *conv = NULL;
        if (session_read(o->load_session, &sh, &s, prompt, saved_logits, &conv, serr) != 0) die("%s", serr);
        free(conv);
        if (s.attn) attn_policy_resume(s.attn, n_saved, sh.fp8_end); // its index is rebuilt from the rows at the next step
        t_restore = now_s() - tr;
        fprintf(stderr, "session: %d positions restored from '%s' in %.2f s%s\n", n_saved, o->load_session, t_restore,
                n_prompt > n_saved ? ", the prompt's tokens follow them" : "");
    }

    Sampler sampler;
    int n_tok = tok ? tokenizer_n_tokens(tok) : (int)c->vocab_size; // no tokenizer: a --synthetic model's ids
    int n_valid = n_tok < (int)c->vocab_size ? n_tok : (int)c->vocab_size;
    if (sampler_init(&sampler, n_valid, o->temperature, o->top_k, o->top_p, o->min_p, o->seed) != 0 ||
        sampler_set_penalties(&sampler, o->repeat_penalty, o->presence_penalty, o->frequency_penalty, o->repeat_last_n) != 0)
        die("out of memory");
    int *hist = malloc((size_t)ctx * sizeof(int)); // the context so far, for the penalties
    if (!hist) die("out of memory");
    memcpy(hist, prompt, (size_t)n_prompt * sizeof(int));
    StopFilter sf = {o->stops, o->n_stops, NULL, 0};

    if (o->save_session) { // before the prefill: the disk the session will need
        char serr[SESSION_ERR_LEN];
        uint64_t bytes = session_bytes(c, &o->attn, s.dev ? SESSION_KV_GPU : SESSION_KV_CPU_F32, n_prompt, n_prompt, 0);
        if (session_check_disk(o->save_session, bytes, serr) != 0) die("--save-session: %s", serr);
    }
    catch_sigint();
    double t0 = now_s();
    float *logits = n_prompt > n_saved ? prefill(m, &s, "prefill", prompt + n_saved, n_prompt - n_saved, n_saved, 0, NULL, NULL) : saved_logits;
    double t_prefill = now_s() - t0;
    if (o->save_session && logits) {
        char serr[SESSION_ERR_LEN];
        double ts = now_s();
        SessionExtra x = {SESSION_PROMPT, n_prompt, s.attn ? attn_policy_fp8_end(s.attn) : 0, logits, NULL, 0};
        if (session_save(o->save_session, m, &s, &o->attn, prompt, n_prompt, &x, serr) != 0) die("--save-session: %s", serr);
        fprintf(stderr, "session: %d positions saved to '%s' in %.2f s\n", n_prompt, o->save_session, now_s() - ts);
    }

    char *piece = malloc(tok ? tokenizer_max_piece_len(tok) + 16 : 16);
    if (!piece) die("out of memory");
    TokDecoder dec = {0};
    int pos = n_prompt, generated = 0;
    const char *stop = NULL;
    double *step_ms = o->steps > TPOT_BINS_FROM ? malloc((size_t)o->steps * sizeof(double)) : NULL; // per decode step, for the bins
    double first_ms = 0; // the first decode step (after a restore it rebuilds the ParisKV index)
    double t1 = now_s();
    while (generated < o->steps) {
        if (interrupted || !logits) {
            stop = "interrupted";
            break;
        }
        sampler_penalize(&sampler, logits, hist, pos);
        int next = sampler_sample(&sampler, logits);
        hist[pos] = next;
        generated++;
        if (o->ids) {
            printf(generated > 1 ? " %d" : "%d", next);
        } else if (!tokenizer_is_eos(tok, next)) {
            size_t k = tokenizer_decode_step(tok, &dec, next, piece, tokenizer_max_piece_len(tok) + 16);
            if (stop_feed(&sf, piece, k)) {
                flush_out();
                stop = "stop string";
                break;
            }
        }
        flush_out();
        if (tok && tokenizer_is_eos(tok, next) && !o->ignore_eos) break;
        if (generated == o->steps) break;
        if (pos >= ctx) {
            stop = "context full";
            break;
        }
        double ts = now_s();
        logits = model_forward(m, &s, &next, 1, pos, 0, err);
        if (!logits) die("%s", err);
        if (step_ms) step_ms[generated - 1] = 1e3 * (now_s() - ts);
        if (generated == 1) first_ms = 1e3 * (now_s() - ts);
        pos++;
    }
    if (!o->ids && !(stop && strcmp(stop, "stop string") == 0)) {
        size_t k = tokenizer_decode_flush(tok, &dec, piece, tokenizer_max_piece_len(tok) + 16);
        if (!stop_feed(&sf, piece, k)) stop_flush(&sf);
    }
    free(sf.held);
    free(hist);
    if (generated > 0) printf("\n"); // -n 0 prints nothing
    double t_decode = now_s() - t1;
    flush_out();
    if (stop && interrupted) fprintf(stderr, "[interrupted]\n");
    else if (stop && strcmp(stop, "stop string") == 0) stop = NULL; // the run's own end
    else if (stop) fprintf(stderr, "[stopped: %s at %d tokens; raise --ctx]\n", stop, ctx);
    // generated tokens minus the first, which came from the prefill, were decode steps
    int steps = generated > 1 ? generated - 1 : 0;
    int n_new = n_prompt - n_saved;
    if (n_saved) // restored: the time to the first token is the restore, plus any new prompt tokens' prefill
        fprintf(stderr, "prompt %d tokens (%d restored in %.2f s, %d prefilled in %.2f s) | first step %.1f ms", n_prompt, n_saved, t_restore,
                n_new, t_prefill, first_ms);
    else
        fprintf(stderr, "prompt %d token%s | prefill %.1f tok/s", n_prompt, plural(n_prompt), n_prompt / (t_prefill > 0 ? t_prefill : 1e-9));
    fprintf(stderr, " | decode %.2f ms/token (TPOT) | generated %d token%s", steps ? 1e3 * t_decode / steps : 0.0, generated, plural(generated));
    if (!s.dev) fprintf(stderr, " | threads %d%s", tuner_threads(&tt[0]), o->threads ? "" : " (tuned)");
    if (!o->seed_set && o->temperature > 0) fprintf(stderr, " | seed %llu", o->seed); // to repeat the run: --seed
    fprintf(stderr, "\n");
    if (step_ms && steps > TPOT_BINS_FROM) print_tpot_bins(step_ms, steps, n_prompt);
    free(step_ms);
    free(saved_logits);
    free(piece);
    sampler_free(&sampler);
    if (s.attn) s.attn->destroy(s.attn);
    run_state_free(&s);
    free(prompt);
}

static void run_tokenize(const Tokenizer *tok, const Options *o) {
    if (!o->prompt_file && !o->prompt) die("--tokenize needs -f FILE (or -p TEXT)");
    size_t len = 0;
    char *text = o->prompt_file ? read_file(o->prompt_file, &len) : NULL;
    int n;
    char what[300] = "the text (-p)";
    if (text) snprintf(what, sizeof what, "'%.256s'", o->prompt_file);
    int *ids = encode_text(tok, what, text ? text : o->prompt, text ? len : strlen(o->prompt), &n);
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    free(text);
}

// ---- chat ----

#define CHAT_CTX_DEFAULT 4096 // a chat's KV cache when --ctx is not given (the model's own may be 128K)

static void on_sigint(int sig) {
    (void)sig;
    if (interrupted) _exit(130); // a second Ctrl-C before the first was handled: quit now
    interrupted = 1;
}

// Consumes one chat option (its value is v); returns how many values it took, or -1 when a is not one.
static int chat_option(Options *o, const char *a, const char *v) {
    if (strcmp(a, "--chat") == 0) return o->chat = 1, 0;
    if (strcmp(a, "--think") == 0) return o->think = 1, 0;
    if (strcmp(a, "--no-think") == 0) return o->think = 0, 0;
    const char **field = strcmp(a, "--system") == 0 ? &o->system : strcmp(a, "--date") == 0 ? &o->date
                       : strcmp(a, "--render-chat") == 0 ? &o->render_chat : NULL;
    if (!field) return -1;
    if (!v) die("%s needs a value", a);
    *field = v;
    return 1;
}

// --render-chat FILE: a JSON list of {"role", "content"} messages, rendered with the generation
// prompt and tokenized (special tokens parsed, as apply_chat_template does); prints the ids.
static void run_render_chat(const Tokenizer *tok, const Options *o) {
    const char *path = o->render_chat;
    size_t len;
    char *text = read_file(path, &len);
    const char *end = text;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    while (j && end < text + len && strchr(" \t\r\n", *end) && *end) end++; // only white space may follow
    int trailing = j && end != text + len;
    free(text);
    if (!j || trailing) die("'%s' is not valid JSON", path);
    if (!cJSON_IsArray(j)) die("'%s' must hold a JSON list of {\"role\", \"content\"} messages", path);
    int n = cJSON_GetArraySize(j), i = 0;
    ChatMessage *msgs = calloc((size_t)n + 1, sizeof *msgs);
    if (!msgs) die("out of memory");
    const cJSON *e, *k;
    cJSON_ArrayForEach(e, j) {
        int roles = 0, contents = 0;
        if (!cJSON_IsObject(e)) die("'%s': message %d is not an object", path, i + 1);
        cJSON_ArrayForEach(k, e) {
            int is_role = strcmp(k->string, "role") == 0, is_content = strcmp(k->string, "content") == 0;
            if (!is_role && !is_content) die("'%s': message %d has key \"%.40s\" (only \"role\" and \"content\" are read)", path, i + 1, k->string);
            if (!cJSON_IsString(k)) die("'%s': message %d: \"%s\" must be a string", path, i + 1, k->string);
            roles += is_role, contents += is_content;
            if (is_role) msgs[i].role = k->valuestring;
            else msgs[i].content = k->valuestring;
        }
        if (roles != 1 || contents != 1) die("'%s': message %d needs one \"role\" and one \"content\"", path, i + 1);
        i++;
    }
    ChatOptions co = {o->think, o->date};
    char err[TOK_ERR_LEN];
    char *conv = chat_render(tok, msgs, n, &co, err);
    if (!conv) die("'%s': %s", path, err);
    int n_ids;
    int *ids = encode_text(tok, "the rendered conversation", conv, strlen(conv), &n_ids);
    for (i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    free(conv);
    free(msgs);
    cJSON_Delete(j);
}

// A conversation and the model state that follows it. cache[0 .. n_cache) are the ids whose K/V
// the KV cache holds: a new turn re-renders the whole conversation, keeps the cached prefix it
// shares and prefills only the rest (the template may rewrite earlier turns: Qwen3 drops their
// <think> blocks, Llama trims them; a reply's ids may differ from its text's tokenization).
typedef struct {
    const Model *m;
    const Tokenizer *tok;
    const Options *o;
    RunState s;
    Sampler sampler;
    ChatMessage *msg; // (n_msg) role and content owned (malloc'd)
    int n_msg, cap_msg;
    int *cache;       // (s.ctx)
    int n_cache;
    char *piece;      // a decoded token: tokenizer_max_piece_len + 16 bytes
    int attn_made;    // the attention policy is made at the first turn (its prompt is the prefill)
    int prefill_len;  // that first turn's length
} Chat;

static void chat_push(Chat *c, const char *role, char *content) {
    if (!content) die("out of memory");
    if (c->n_msg == c->cap_msg) {
        c->cap_msg = c->cap_msg ? 2 * c->cap_msg : 16;
        if (!(c->msg = realloc(c->msg, (size_t)c->cap_msg * sizeof *c->msg))) die("out of memory");
    }
    c->msg[c->n_msg++] = (ChatMessage){role, content};
}

static void chat_pop(Chat *c) { free((char *)c->msg[--c->n_msg].content); }

static void chat_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "]\n");
    va_end(ap);
}

// Runs ids[from .. n) into the cache; stops early on Ctrl-C. Returns the last logits, or NULL
// when interrupted (c->n_cache then says how far it got).
static float *chat_prefill(Chat *c, const int *ids, int from, int n) {
    char err[MODEL_ERR_LEN];
    float *logits = NULL;
    c->n_cache = from;
    if (from == 0 && c->s.dev && c->s.be->prompt_whole && c->s.be->prompt_whole(c->s.dev, n)) { // a first message longer than the GPU's cache
        if (!(logits = model_forward(c->m, &c->s, ids, n, 0, 0, err))) die("%s", err);
        memcpy(c->cache, ids, (size_t)n * sizeof(int));
        c->n_cache = n;
        return logits;
    }
    for (int i = from; i < n; i += c->s.chunk) {
        if (interrupted) return NULL;
        int T = n - i < c->s.chunk ? n - i : c->s.chunk;
        if (!(logits = model_forward(c->m, &c->s, ids + i, T, i, 0, err))) die("%s", err);
        memcpy(c->cache + i, ids + i, (size_t)T * sizeof(int));
        c->n_cache = i + T;
    }
    return logits;
}

// Streams a reply from logits; returns its ids (malloc'd, *n of them) and why it stopped early.
static int *chat_generate(Chat *c, float *logits, int *n, const char **stop) {
    const Options *o = c->o;
    int budget = o->steps_set ? o->steps : INT_MAX, cap = 64, k = 0;
    int *reply = malloc((size_t)cap * sizeof(int));
    size_t piece_cap = tokenizer_max_piece_len(c->tok) + 16;
    TokDecoder dec = {0};
    char err[MODEL_ERR_LEN];
    *stop = NULL;
    while (reply && k < budget) {
        if (interrupted) {
            *stop = "interrupted";
            break;
        }
        sampler_penalize(&c->sampler, logits, c->cache, c->n_cache);
        int next = sampler_sample(&c->sampler, logits);
        int eos = tokenizer_is_eos(c->tok, next);
        if (eos && !o->ignore_eos) break;
        if (k == cap && !(reply = realloc(reply, (size_t)(cap *= 2) * sizeof(int)))) break;
        reply[k++] = next;
        if (!eos) fwrite(c->piece, 1, tokenizer_decode_step(c->tok, &dec, next, c->piece, piece_cap), stdout);
        flush_out();
        if (k == budget) {
            *stop = "cut";
            break;
        }
        if (c->n_cache >= c->s.ctx) {
            *stop = "context full";
            break;
        }
        if (!(logits = model_forward(c->m, &c->s, &next, 1, c->n_cache, 0, err))) die("%s", err);
        c->cache[c->n_cache++] = next;
    }
    if (!reply) die("out of memory");
    fwrite(c->piece, 1, tokenizer_decode_flush(c->tok, &dec, c->piece, piece_cap), stdout);
    printf("\n");
    flush_out();
    *n = k;
    return reply;
}

// One user message: render, prefill what the cache lacks, stream the reply, record it.
static void chat_turn(Chat *c, const char *text) {
    char err[TOK_ERR_LEN];
    chat_push(c, "user", strdup(text));
    ChatOptions co = {c->o->think, c->o->date};
    char *conv = chat_render(c->tok, c->msg, c->n_msg, &co, err);
    int *ids = NULL;
    long n = conv ? tokenizer_encode(c->tok, conv, strlen(conv), 1, &ids, err) : -1;
    free(conv);
    if (n < 0 || n >= c->s.ctx) {
        if (n < 0) chat_note("%s: message ignored", err);
        else chat_note("context full: the conversation needs %ld tokens, the context holds %d "
                       "(/reset starts over, --ctx sets the size): message ignored", n, c->s.ctx);
        chat_pop(c);
        free(ids);
        return;
    }
    if (!c->attn_made) { // the first turn is a prefill (dense); later turns' tokens go through the policy
        c->s.attn = make_attn(c->o, c->m, &c->s, (int)n);
        c->attn_made = 1;
        c->prefill_len = (int)n;
    }
    int keep = 0;
    while (keep < c->n_cache && keep < n - 1 && c->cache[keep] == ids[keep]) keep++;
    double t0 = now_s();
    float *logits = chat_prefill(c, ids, keep, (int)n);
    double t1 = now_s();
    free(ids);
    if (!logits) {
        chat_note("interrupted");
        chat_pop(c);
        return;
    }
    int n_reply;
    const char *stop;
    int *reply = chat_generate(c, logits, &n_reply, &stop);
    double t2 = now_s();
    chat_push(c, "assistant", tokenizer_decode(c->tok, reply, (size_t)n_reply));
    free(reply);
    fprintf(stderr, "[prefill %ld tokens (%d cached) %.1f tok/s | reply %d tokens %.2f ms/token | context %d/%d]\n",
            n - keep, keep, (n - keep) / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_reply,
            n_reply > 1 ? 1e3 * (t2 - t1) / (n_reply - 1) : 0.0, c->n_cache, c->s.ctx);
    if (stop && strcmp(stop, "interrupted") == 0) chat_note("interrupted");
    else if (stop && strcmp(stop, "cut") == 0) chat_note("the reply was cut at -n %d tokens", c->o->steps);
    else if (stop) chat_note("context full: the reply stops here (/reset starts over, --ctx sets the size)");
}

// One user message from stdin, newline removed; on a terminal a line ending in '\' continues on
// the next. NULL at end of input. Ctrl-C while waiting asks again.
static char *read_message(int tty, size_t *len) {
    char *line = NULL, *msg = NULL;
    size_t cap = 0, n_msg = 0;
    for (;;) {
        interrupted = 0; // a Ctrl-C pressed between turns stopped nothing: forget it
        if (tty) fputs(msg ? "... " : "> ", stdout), fflush(stdout);
        errno = 0;
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0 && errno == EINTR && !feof(stdin)) {
            clearerr(stdin);
            if (tty) fputs("\n(/exit or Ctrl-D quits)\n", stdout);
            continue;
        }
        if (n < 0) break;
        if (n > 0 && line[n - 1] == '\n') line[--n] = '\0';
        if (n > 0 && line[n - 1] == '\r') line[--n] = '\0';
        int more = tty && n > 0 && line[n - 1] == '\\';
        if (more) line[n - 1] = '\n';
        if (!(msg = realloc(msg, n_msg + (size_t)n + 1))) die("out of memory");
        memcpy(msg + n_msg, line, (size_t)n + 1);
        n_msg += (size_t)n;
        if (!more) break;
    }
    free(line);
    *len = n_msg;
    return msg;
}

// /save FILE: the conversation and its K/V (model/session.h), so --chat --load-session FILE goes
// on from here. A failure is a note: the chat goes on.
static void chat_save(Chat *c, const char *path) {
    const char *why = !*path ? "/save needs a file name"
                      : c->n_cache == 0 ? "nothing to save yet"
                                        : NULL;
    if (why) {
        chat_note("%s", why);
        return;
    }
    size_t bytes = 0;
    for (int i = 0; i < c->n_msg; i++) bytes += 5 + strlen(c->msg[i].content);
    char *blob = malloc(bytes ? bytes : 1), *w = blob, err[SESSION_ERR_LEN];
    if (!blob) die("out of memory");
    for (int i = 0; i < c->n_msg; i++) { // role byte, length, text
        uint32_t len = (uint32_t)strlen(c->msg[i].content);
        *w++ = c->msg[i].role[0];
        memcpy(w, &len, 4), memcpy(w + 4, c->msg[i].content, len), w += 4 + len;
    }
    SessionExtra x = {SESSION_CHAT, c->prefill_len, c->s.attn ? attn_policy_fp8_end(c->s.attn) : 0, NULL, blob, bytes};
    double t0 = now_s();
    if (session_save(path, c->m, &c->s, &c->o->attn, c->cache, c->n_cache, &x, err) != 0) chat_note("/save: %s", err);
    else chat_note("saved %d positions and %d messages to '%s' in %.2f s", c->n_cache, c->n_msg, path, now_s() - t0);
    free(blob);
}

// --chat --load-session FILE: the messages, the cache and its policy as /save left them.
static void chat_load(Chat *c, const SessionHeader *h, const char *path) {
    char err[SESSION_ERR_LEN];
    float *logits = malloc((size_t)c->m->c.vocab_size * sizeof(float));
    void *conv = NULL;
    if (!logits) die("out of memory");
    double t0 = now_s();
    if (session_read(path, h, &c->s, c->cache, logits, &conv, err) != 0) die("%s", err);
    free(logits);
    const char *p = conv, *end = p + h->chat_bytes;
    while (p < end) {
        uint32_t len;
        char role = *p;
        if (end - p < 5 || (memcpy(&len, p + 1, 4), (uint64_t)len > (uint64_t)(end - p - 5)) || (role != 's' && role != 'u' && role != 'a'))
            die("session '%s': its conversation is damaged", path);
        char *text = malloc((size_t)len + 1); // not strndup: the text is not NUL-terminated in the file
        if (text) memcpy(text, p + 5, len), text[len] = 0;
        chat_push(c, role == 's' ? "system" : role == 'u' ? "user" : "assistant", text);
        p += 5 + len;
    }
    free(conv);
    c->n_cache = h->n_tokens;
    c->s.attn = make_attn(c->o, c->m, &c->s, h->prefill_len);
    if (c->s.attn) attn_policy_resume(c->s.attn, h->n_tokens, h->fp8_end); // its index is rebuilt from the rows at the next step
    c->attn_made = 1;
    c->prefill_len = h->prefill_len;
    chat_note("session: %d positions and %d messages restored from '%s' in %.2f s", h->n_tokens, c->n_msg, path, now_s() - t0);
}

static void run_chat(const Model *m, const Tokenizer *tok, const Options *o) {
    if (o->score_file || o->tokenize || o->ids) die("--chat cannot be combined with --score, --tokenize or --ids");
    if (o->n_stops) die("--stop applies to generation, not --chat (the chat template ends each reply)");
    if (tokenizer_chat(tok) == TOK_CHAT_NONE) die("the model has no chat template this runner renders (Llama 3, Qwen3, ChatML)");
    Chat c = {.m = m, .tok = tok, .o = o};
    char err[MODEL_ERR_LEN];
    SessionHeader sh;
    int need = CHAT_CTX_DEFAULT;
    if (o->load_session) {
        char serr[SESSION_ERR_LEN];
        if (session_open(o->load_session, m, &o->attn, &sh, serr) != 0 || session_check_path(&sh, m->be->create != NULL, o->load_session, serr) != 0)
            die("%s", serr);
        if (sh.kind != SESSION_CHAT) die("session '%s' is a prompt's (--save-session): resume it without --chat", o->load_session);
        if (o->system || o->prompt || o->prompt_file) die("--load-session brings its own conversation: no --system, -p or -f with it");
        if (sh.n_tokens + 1024 > need) need = sh.n_tokens + 1024; // room for the next turns
    }
    int ctx = pick_ctx(o, &m->c, need);
    if (o->load_session && sh.n_tokens >= ctx)
        die("session '%s' holds %d positions, more than the context of %d: raise --ctx", o->load_session, sh.n_tokens, ctx);
    if (run_state_init_attn(&c.s, m, ctx, m->be->max_chunk, 0, &o->attn, err) != 0) die("%s", err);
    ThreadTuner tt[2];
    attach_tuners(&c.s, tt, o);
    print_summary(m, &c.s, o);
    int n_valid = tokenizer_n_tokens(tok) < (int)m->c.vocab_size ? tokenizer_n_tokens(tok) : (int)m->c.vocab_size;
    if (sampler_init(&c.sampler, n_valid, o->temperature, o->top_k, o->top_p, o->min_p, o->seed) != 0 ||
        sampler_set_penalties(&c.sampler, o->repeat_penalty, o->presence_penalty, o->frequency_penalty, o->repeat_last_n) != 0)
        die("out of memory");
    c.cache = malloc((size_t)c.s.ctx * sizeof(int));
    c.piece = malloc(tokenizer_max_piece_len(tok) + 16);
    if (!c.cache || !c.piece) die("out of memory");
    if (o->system) chat_push(&c, "system", strdup(o->system));
    if (o->load_session) chat_load(&c, &sh, o->load_session);
    catch_sigint();
    int tty = isatty(STDIN_FILENO);
    if (tty) fprintf(stderr, "chat: /reset clears the conversation, /save FILE keeps it, /exit quits, Ctrl-C stops a reply\n");
    size_t len = 0;
    char *first = o->prompt_file ? read_file(o->prompt_file, &len) : o->prompt ? strdup(o->prompt) : NULL;
    if (first && !o->prompt_file) len = strlen(first);
    for (char *line = first; line || (line = read_message(tty, &len)); line = NULL) {
        interrupted = 0; // a Ctrl-C while the line was read belongs to no reply
        if (strcmp(line, "/exit") == 0) {
            free(line);
            break;
        } else if (strncmp(line, "/save ", 6) == 0 || strcmp(line, "/save") == 0) {
            chat_save(&c, line[5] ? line + 6 : "");
        } else if (strcmp(line, "/reset") == 0) {
            while (c.n_msg > (o->system ? 1 : 0)) chat_pop(&c);
            // The cache and the attention policy start over (the next message is a first turn,
            // prefilled densely), and the GPU gives back its host store's pages.
            if (c.s.attn) c.s.attn->destroy(c.s.attn);
            c.s.attn = NULL, c.attn_made = 0, c.n_cache = 0, c.prefill_len = 0;
            size_t freed = c.s.dev && c.s.be->reset ? c.s.be->reset(c.s.dev) : 0;
            if (freed) chat_note("conversation cleared (%.2f GiB of pinned host memory given back)", freed / 1073741824.0);
            else chat_note("conversation cleared");
        } else if (strlen(line) != len) {
            chat_note("the message contains a NUL byte: message ignored");
        } else if (len > 0) {
            chat_turn(&c, line);
        }
        free(line);
    }
    while (c.n_msg > 0) chat_pop(&c);
    free(c.msg);
    free(c.cache);
    free(c.piece);
    sampler_free(&c.sampler);
    if (c.s.attn) c.s.attn->destroy(c.s.attn);
    run_state_free(&c.s);
}

// The GPU when there is one (or when asked), else the CPU.
static void select_device(Model *m, const char *device) {
    const Backend *cuda = backend_cuda_get();
    int want_gpu = device && strcmp(device, "gpu") == 0, want_cpu = device && strcmp(device, "cpu") == 0;
    int have_gpu = cuda && cuda->available();
    if (want_gpu && !have_gpu)
        die(cuda ? "--device gpu: no CUDA device is available" : "--device gpu: this build has no CUDA support");
    if (have_gpu && !want_cpu) m->be = cuda;
}

// --quant for a --synthetic model: its matrices made as blocks on the GPU.
static void synthetic_quant(Model *m, const char *quant) {
    if (!quant) return;
    m->synthetic_dt = strcmp(quant, "q8_0") == 0 ? DTYPE_Q8_0 : strcmp(quant, "q4_0") == 0 ? DTYPE_Q4_0 : DTYPE_Q4_K;
    m->n_quantized = 7 * (int)m->c.n_layers + 1;
}

static int run_bench(const Options *o) {
    Model m;
    char err[MODEL_ERR_LEN];
    // The benchmark times the GPU's dense decode: say so rather than print dense figures under
    // another method's name.
    // Dense decode unless --attn pariskv is given; the peers run on the CPU only.
    if (o->attn_set && o->attn.method != ATTN_FULL && o->attn.method != ATTN_PARISKV)
        die("--bench --attn %s: the GPU benchmark runs full and pariskv (%s runs on the CPU only)", attn_method_name(o->attn.method),
            attn_method_name(o->attn.method));
    if (o->synthetic) {
        if (o->model_path) die("give either a model file or --synthetic NAME, not both");
        if (model_synthetic(&m, o->synthetic) != 0)
            die("unknown --synthetic model '%s' (llama3.1-8b, qwen3-8b, qwen3-0.6b)", o->synthetic);
        synthetic_quant(&m, o->quant);
    } else if (!o->model_path) {
        die("--bench needs a model file or --synthetic NAME");
    } else if (model_load(&m, o->model_path, err) != 0) {
        die("%s", err);
    }
    select_device(&m, o->device ? o->device : "gpu");
    if (!m.be->bench) die("--bench needs the GPU backend");
    int ctxs[32], n = 0;
    const char *p = o->bench_ctx ? o->bench_ctx : "4096,32768,131072";
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 30) || n == 32 || (*end && *end != ',')) die("--bench-ctx: bad list '%s'", o->bench_ctx);
        ctxs[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    int pkv = o->attn_set && o->attn.method == ATTN_PARISKV;
    int rc = m.be->bench(&m, ctxs, n, o->bench_steps ? o->bench_steps : 64, o->bench_prefill, m.be->max_chunk, pkv ? &o->attn : NULL);
    model_free(&m);
    return rc;
}

// Generation on random weights of a real shape (no tokenizer: --ids), on the GPU: long-context
// runs of the real path (a prompt of random ids, then -n steps) where no model file of that size
// is at hand.
static int run_synthetic(const Options *o) {
    if (o->model_path) die("give either a model file or --synthetic NAME, not both");
    if (!o->ids) die("--synthetic has no tokenizer: give the prompt as ids (--ids -p \"1 2 3\" or --ids -f FILE)");
    if (o->chat || o->render_chat || o->tokenize) die("--synthetic runs generation, --score (or --bench) only");
    Model m;
    if (model_synthetic(&m, o->synthetic) != 0) die("unknown --synthetic model '%s' (llama3.1-8b, qwen3-8b, qwen3-0.6b)", o->synthetic);
    synthetic_quant(&m, o->quant);
    if (o->device && strcmp(o->device, "cpu") == 0) die("--synthetic runs on the GPU (its weights are made there)");
    select_device(&m, "gpu");
    if (o->score_file) run_score(&m, NULL, o);
    else run_generate(&m, NULL, o);
    model_free(&m);
    flush_out();
    return interrupted ? 130 : 0;
}

int main(int argc, char **argv) {
    Options o = {0};
    o.steps = 256;
    o.repeat_penalty = 1.0f, o.repeat_last_n = 64;
    o.temperature = 0.8f;
    o.top_p = 0.95f;
    o.seed = (unsigned long long)time(NULL);
    attn_config_default(&o.attn);
    o.think = -1;
    for (int i = 1, chat_consumed; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDS_VALUE() if (!v) die("%s needs a value", a); i++
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("run %s (model.bin format %d, CUDA backend %s)\n", PKV_VERSION, MODEL_VERSION, backend_cuda_get() ? "built in" : "not built");
            return 0;
        } else if (strcmp(a, "-p") == 0) {
            NEEDS_VALUE(); o.prompt = v;
        } else if (strcmp(a, "-f") == 0) {
            NEEDS_VALUE(); o.prompt_file = v;
        } else if (strcmp(a, "-n") == 0) {
            NEEDS_VALUE(); o.steps = (int)parse_long(v, a, 0, INT_MAX / 2); o.steps_set = 1;
        } else if (strcmp(a, "--ctx") == 0) {
            NEEDS_VALUE(); o.ctx = (int)parse_long(v, a, 2, INT_MAX / 2);
        } else if (strcmp(a, "--temp") == 0) {
            NEEDS_VALUE(); o.temperature = parse_float(v, a, 0, 100); o.sampling_set = 1;
        } else if (strcmp(a, "--top-k") == 0) {
            NEEDS_VALUE(); o.top_k = (int)parse_long(v, a, 0, INT_MAX); o.sampling_set = 1;
        } else if (strcmp(a, "--top-p") == 0) {
            NEEDS_VALUE(); o.top_p = parse_float(v, a, 0, 1); o.sampling_set = 1;
        } else if (strcmp(a, "--min-p") == 0) {
            NEEDS_VALUE(); o.min_p = parse_float(v, a, 0, 1); o.sampling_set = 1;
        } else if (strcmp(a, "--seed") == 0) {
            NEEDS_VALUE(); o.seed = (unsigned long long)parse_long(v, a, 0, LONG_MAX); o.seed_set = 1;
        } else if (strcmp(a, "--repeat-penalty") == 0) {
            NEEDS_VALUE(); o.repeat_penalty = parse_float(v, a, 0.01f, 100);
        } else if (strcmp(a, "--presence-penalty") == 0) {
            NEEDS_VALUE(); o.presence_penalty = parse_float(v, a, -100, 100);
        } else if (strcmp(a, "--frequency-penalty") == 0) {
            NEEDS_VALUE(); o.frequency_penalty = parse_float(v, a, -100, 100);
        } else if (strcmp(a, "--repeat-last-n") == 0) {
            NEEDS_VALUE(); o.repeat_last_n = (int)parse_long(v, a, -1, INT_MAX / 2);
        } else if (strcmp(a, "--stop") == 0) {
            NEEDS_VALUE();
            if (!*v) die("--stop needs a non-empty string");
            if (o.n_stops == 16) die("at most 16 --stop strings");
            o.stops[o.n_stops++] = v;
        } else if (strcmp(a, "--score") == 0) {
            NEEDS_VALUE(); o.score_file = v;
        } else if (strcmp(a, "--save-session") == 0) {
            NEEDS_VALUE(); o.save_session = v;
        } else if (strcmp(a, "--load-session") == 0) {
            NEEDS_VALUE(); o.load_session = v;
        } else if (strcmp(a, "--score-prompt") == 0) {
            NEEDS_VALUE(); o.score_prompt = (int)parse_long(v, a, 0, INT_MAX / 2);
        } else if (strcmp(a, "--tokenize") == 0) {
            o.tokenize = 1;
        } else if (strcmp(a, "--ids") == 0) {
            o.ids = 1;
        } else if (strcmp(a, "--ignore-eos") == 0) {
            o.ignore_eos = 1;
        } else if (strcmp(a, "--device") == 0) {
            NEEDS_VALUE(); o.device = v;
            if (strcmp(v, "cpu") && strcmp(v, "gpu") && strcmp(v, "auto")) die("--device must be cpu, gpu or auto, not '%s'", v);
        } else if (strcmp(a, "--threads") == 0) {
            NEEDS_VALUE(); o.threads = (int)parse_long(v, a, 1, POOL_MAX_THREADS);
        } else if (strcmp(a, "--bench") == 0) {
            o.bench = 1;
        } else if (strcmp(a, "--synthetic") == 0) {
            NEEDS_VALUE(); o.synthetic = v;
        } else if (strcmp(a, "--quant") == 0) {
            NEEDS_VALUE(); o.quant = v;
            if (strcmp(v, "q8_0") != 0 && strcmp(v, "q4_k") != 0 && strcmp(v, "q4_0") != 0) die("--quant must be q8_0, q4_k or q4_0, not '%s'", v);
        } else if (strcmp(a, "--bench-ctx") == 0) {
            NEEDS_VALUE(); o.bench_ctx = v;
        } else if (strcmp(a, "--bench-steps") == 0) {
            NEEDS_VALUE(); o.bench_steps = (int)parse_long(v, a, 64, 100000);
        } else if (strcmp(a, "--bench-prefill") == 0) {
            o.bench_prefill = 1;
        } else if (strcmp(a, "--kv-store") == 0) {
            NEEDS_VALUE();
            if (strcmp(v, "auto") == 0) o.attn.store = KV_STORE_AUTO;
            else if (strcmp(v, "gpu") == 0) o.attn.store = KV_STORE_GPU;
            else if (strcmp(v, "host") == 0) o.attn.store = KV_STORE_HOST;
            else die("--kv-store must be gpu, host or auto, not '%s'", v);
        } else if (strcmp(a, "--kv-store-dtype") == 0) {
            NEEDS_VALUE();
            if (strcmp(v, "bf16") == 0) o.attn.zone_fp8 = 0;
            else if (strcmp(v, "fp8") == 0) o.attn.zone_fp8 = 1;
            else die("--kv-store-dtype must be bf16 or fp8, not '%s'", v);
        } else if (attn_option(&o, a, v)) {
            i++;
        } else if ((chat_consumed = chat_option(&o, a, v)) >= 0) {
            i += chat_consumed;
        } else if (a[0] == '-') {
            die("unknown option '%s' (see ./run -h)", a);
        } else if (!o.model_path) {
            o.model_path = a;
        } else {
            die("unexpected argument '%s' (see ./run -h)", a);
        }
#undef NEEDS_VALUE
    }
    signal(SIGPIPE, SIG_DFL); // see flush_out
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigprocmask(SIG_UNBLOCK, &pipe_set, NULL);
    guard_install(0); // SIGBUS from a model file truncated while mapped: a one-line error
    if (o.attn.zone_fp8 && o.attn.store == KV_STORE_GPU)
        die("--kv-store-dtype fp8 keeps the retrieval zone in the host store: use --kv-store host or auto, not gpu");
    if (o.attn.zone_fp8 && o.attn.method == ATTN_FULL)
        die("--kv-store-dtype fp8 applies to a retrieval zone: it needs --attn pariskv (or a peer), not full");
    if (o.score_prompt && !o.score_file) die("--score-prompt applies to --score");
    if (o.save_session && (o.chat || o.render_chat || o.score_file || o.tokenize || o.bench))
        die("--save-session applies to generation (-p / -f); in a chat, /save FILE");
    if (o.load_session && (o.render_chat || o.score_file || o.tokenize || o.bench))
        die("--load-session applies to generation (-p / -f) and --chat");
    if (o.save_session && o.load_session && strcmp(o.save_session, o.load_session) == 0)
        die("--save-session and --load-session name the same file");
    if (o.bench) return run_bench(&o);
    if (o.quant && !o.synthetic) die("--quant applies to --synthetic models (./export --quant quantizes a model file)");
    if (o.synthetic) return run_synthetic(&o);
    if (!o.model_path) {
        usage(stderr);
        return 1;
    }
    if (o.prompt && o.prompt_file) die("give either -p or -f, not both");
    if (!o.chat && !o.render_chat && (o.system || o.date || o.think >= 0))
        die("--system, --date, --think and --no-think apply to --chat and --render-chat");

    // Threads: --threads, else OMP_NUM_THREADS (both fix the count), else the CPUs of our
    // affinity mask, the count then tuned by measuring (model/threads.h).
    const char *omp_env = getenv("OMP_NUM_THREADS");
    if (!o.threads && omp_env && *omp_env) o.threads = (int)parse_long(omp_env, "OMP_NUM_THREADS", 1, POOL_MAX_THREADS);
    pool_set_max_threads(o.threads ? o.threads : pool_cpus_available());

    Model m;
    char err[MODEL_ERR_LEN];
    if (model_load(&m, o.model_path, err) != 0) die("%s", err);
    select_device(&m, o.device);
    const FileHeader *h = m.file.header;
    char tok_err[TOK_ERR_LEN];
    Tokenizer *tok = tokenizer_load(m.file.data + h->tokenizer_offset, h->tokenizer_size, tok_err);
    if (!tok) die("model file '%s': bad tokenizer section: %s", o.model_path, tok_err);

    // The model's generation_config.json supplies the defaults unless the user chose.
    const Config *c = &m.c;
    if (!o.sampling_set && c->has_gen_defaults) {
        o.temperature = c->gen_do_sample ? c->gen_temperature : 0.0f;
        o.top_k = c->gen_top_k;
        o.top_p = c->gen_top_p;
        o.min_p = c->gen_min_p;
    }

    if (o.render_chat) run_render_chat(tok, &o);
    else if (o.chat) run_chat(&m, tok, &o);
    else if (o.tokenize) run_tokenize(tok, &o);
    else if (o.score_file) run_score(&m, tok, &o);
    else run_generate(&m, tok, &o);

    tokenizer_free(tok);
    model_free(&m);
    flush_out();
    return interrupted && !o.chat ? 130 : 0; // a generation stopped by Ctrl-C
}
