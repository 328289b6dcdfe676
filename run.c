// ./run: the command line. main parses the options (model/options.h, one table) and hands the
// run to its mode: generate (the default), --chat, --render-chat, --score, --tokenize, --bench,
// --synthetic. Each mode reads the Options, makes the run's state and prints; errors are one line
// on stderr and exit status 1 (die).
// Why one file of ~1,400 lines: each mode is a few short functions, but they share die(), the
// interrupt flag, the output and stop-string helpers and the run-state set-up; and the chat loop
// exits through die(), which the render-chat fuzz harness catches only inside this file (a mode
// moved under model/ would also be linked into every test and fuzz program).
#include "model/errmsg.h"
#include "model/guard.h"
#include "model/model.h"
#include "model/options.h"
#include "model/pool.h"
#include "model/session.h"
#include "model/sampler.h"
#include "model/version.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#ifdef HAVE_LIBEDIT // line editing in chat (the Makefile defines it where libedit is installed)
#include <editline/readline.h>
#endif
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SCORE_CHUNK_GPU 256   // score keeps logits for a whole chunk: (chunk, vocab) floats
#define CHAT_CTX_DEFAULT 4096 // a chat's KV cache when --ctx is not given (the model's own may be 128K)
// The default policy's crossover: the sequence length from which ParisKV's decode step is
// measured faster than dense attention's on the device (below it dense is faster, and exact).
// GPU (tests/bench/GPU.md, session 11): Qwen3-8B and Llama-3.1-8B cross at ~41K on the H100 and
// ~48K on the H200; the larger, so the default is never slower than dense. Session 31's builds
// cross at ~33K on the H200; the H100 is not re-measured, so this stays. CPU (RESULTS.md,
// "ParisKV against dense on the CPU"): dense measured faster at 3K and 7.6K on a quiet 2-core
// machine; twice that until a quiet machine measures further.
#define PKV_CROSSOVER_CPU 16384
#define PKV_CROSSOVER_GPU 49152

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

// Ctrl-C sets `interrupted`; generation and chat stop the reply.
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    if (interrupted) _exit(130); // a second Ctrl-C before the first was handled: quit now
    interrupted = 1;
}

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

static const char *plural(long n) { return n == 1 ? "" : "s"; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// ---- input ----

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
    if (ferror(f)) die("cannot read '%s': %s", path, strerror(errno));
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

// An input file named by flag, checked before the model loads (seconds to minutes on a big one):
// it exists, is no directory, and a regular file is readable. A FIFO or a device is left to the
// read itself (-f <(cmd) works; opening a FIFO here would wait for its writer), unless regular
// says the reader needs a file it can size (a session).
static void check_input(const char *flag, const char *path, int regular) {
    struct stat st;
    if (!path) return;
    if (stat(path, &st) != 0) die("%s '%s': %s", flag, path, strerror(errno));
    if (S_ISDIR(st.st_mode)) die("%s '%s': is a directory, not a file", flag, path);
    if (regular && !S_ISREG(st.st_mode)) die("%s '%s': not a regular file", flag, path);
    if (S_ISREG(st.st_mode) && access(path, R_OK) != 0) die("%s '%s': %s", flag, path, strerror(errno));
}

// An output file: not a directory, and its directory exists (the run would otherwise fail at the
// end of a prefill that may take minutes).
static void check_output(const char *flag, const char *path) {
    struct stat st;
    if (!path) return;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) die("%s '%s': is a directory, not a file", flag, path);
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return; // the current directory, or the root
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (stat(dir, &st) != 0) die("%s '%s': its directory '%s': %s", flag, path, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) die("%s '%s': '%s' is not a directory", flag, path, dir);
}

// Every file a run names, before anything loads.
static void check_files(const Options *o) {
    check_input("-f", o->prompt_file, 0);
    check_input("--score", o->score_file, 0);
    check_input("--render-chat", o->render_chat, 0);
    check_input("--load-session", o->load_session, 1);
    check_output("--save-session", o->save_session);
    check_output("--score-out", o->score_out);
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

// ---- a run's state ----

// Without --attn (or an option of the policy's) the policy is ParisKV from the device's
// crossover on; --attn NAME runs NAME from the spec's 2000 tokens; --dense-below D sets the
// length for either. Called once the device is known.
static void resolve_attention(Options *o, const Model *m) {
    if (o->dense_below) o->attn.dense_min = o->dense_below;
    else if (!o->attn_set && !o->policy_set) o->attn.dense_min = m->be->create ? PKV_CROSSOVER_GPU : PKV_CROSSOVER_CPU, o->attn_crossover = 1;
}

// "dense" or "pariskv from 2000 tokens" (and why from there): what attends the positions of a
// sequence of up to len tokens whose first prompt_len are a prompt (attended densely).
static const char *attn_desc(const Options *o, int len, int prompt_len, char *buf, size_t cap) {
    const AttnConfig *a = &o->attn;
    int from = attn_dense_threshold(a), why = o->attn_crossover;
    if (prompt_len > from - 1) from = prompt_len + 1;
    if (a->method == ATTN_FULL) snprintf(buf, cap, "dense (--attn full)");
    else if (len < from) snprintf(buf, cap, "dense (%s from %d tokens%s)", attn_method_name(a->method), from, why ? ", the device's crossover" : "");
    else snprintf(buf, cap, "%s from %d tokens, top-%d%s", attn_method_name(a->method), from, a->topk, why ? " (the device's crossover)" : "");
    return buf;
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

// One line on stderr once a run's state exists: what runs, where, with what.
static void print_summary(const Model *m, const RunState *s, const Options *o) {
    const Config *c = &m->c;
    double attn = (double)c->dim * c->head_dim * (2.0 * c->n_heads + 2.0 * c->n_kv_heads);
    double per_layer = attn + 3.0 * c->dim * c->hidden_dim + 2.0 * c->dim + (c->qk_norm ? 2.0 * c->head_dim : 0);
    double params = c->n_layers * per_layer + (c->tied_embeddings ? 1.0 : 2.0) * c->vocab_size * c->dim + c->dim;
    char thr[48] = "";
    if (!s->dev) snprintf(thr, sizeof thr, ", %s%d thread%s%s", o->threads ? "" : "up to ", pool_max_threads(), plural(pool_max_threads()),
                          o->threads ? "" : " (tuned)");
    char dt[64], ad[128];
    fprintf(stderr, "%s, %.1fM parameters, %s weights, context %d (trained %u), %s%s, attention %s\n", c->arch == ARCH_QWEN3 ? "qwen3" : "llama",
            params / 1e6, model_weights_desc(m, dt, sizeof dt), s->ctx, c->max_seq_len, s->dev ? "gpu" : "cpu", thr,
            attn_desc(o, s->ctx, 0, ad, sizeof ad));
}

// The CPU pass's thread tuners (decode steps, chunks) for a run's state.
// Called before the run's first parallel operation (the pool's threads, spinning for a moment
// after one, would count as running in threads_guess), and only by the modes that run the model.
static void attach_tuners(RunState *s, ThreadTuner tt[2], const Options *o) {
    int guess = o->threads || s->dev ? 0 : threads_guess(pool_max_threads()); // the GPU pass has no tuner
    for (int i = 0; i < 2; i++) tuner_init(&tt[i], pool_max_threads(), o->threads, guess);
    s->threads = tt;
}

// The run's state for ctx positions, or a one-line error.
static void open_run_state(RunState *s, const Model *m, const Options *o, int ctx, int chunk, int all_logits) {
    char err[MODEL_ERR_LEN];
    if (run_state_init_attn(s, m, ctx, chunk, all_logits, &o->attn, err) != 0) die("%s", err);
}

// Once the state (and its policy) exist: the thread tuners, then the summary line.
static void start_run(RunState *s, ThreadTuner tt[2], const Model *m, const Options *o) {
    attach_tuners(s, tt, o);
    print_summary(m, s, o);
}

static void close_run_state(RunState *s) {
    if (s->attn) attn_policy_report(s->attn, stderr); // --profile's findings, if any
    if (s->dev && s->be->profile) s->be->profile(s->dev, stderr);
    if (s->attn) s->attn->destroy(s->attn);
    run_state_free(s);
}

// Sampling over the ids the tokenizer has (no tokenizer: a --synthetic model's, all of them).
static void make_sampler(Sampler *sampler, const Model *m, const Tokenizer *tok, const Options *o) {
    int n_tok = tok ? tokenizer_n_tokens(tok) : (int)m->c.vocab_size;
    int n_valid = n_tok < (int)m->c.vocab_size ? n_tok : (int)m->c.vocab_size;
    if (sampler_init(sampler, n_valid, o->temperature, o->top_k, o->top_p, o->min_p, o->seed) != 0 ||
        sampler_set_penalties(sampler, o->repeat_penalty, o->presence_penalty, o->frequency_penalty, o->repeat_last_n) != 0)
        die("out of memory");
}

// The first token of a reply or a generation, from the prompt's logits, the context so far
// hist[0 .. n_hist) giving the penalties. Every later one comes with its decode step
// (model_decode_sample: on the GPU the sampler runs inside the step).
static int next_token(Sampler *sampler, float *logits, const int *hist, int n_hist) {
    sampler_penalize(sampler, logits, hist, n_hist);
    return sampler_sample(sampler, logits);
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
    double total, total2; // the NLLs' sum and their squares' (the summary's uncertainty)
    int count;            // positions scored so far (all n - 1 unless interrupted)
    int base;             // position of the current prefill call's first token
    FILE *lines;          // the lines per position: stdout, --score-out's file, or NULL (--summary)
    const char *out_path; // --score-out's name, for its errors
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
        sc->total += nll[t], sc->total2 += nll[t] * nll[t];
        if (sc->lines) fprintf(sc->lines, "%d\t%d\t%.6f\t%d\n", first + t, sc->tokens[first + t + 1], nll[t], top[t]);
    }
    sc->count += n;
    if (sc->lines == stdout) flush_out();
    else if (sc->lines && (fflush(sc->lines) != 0 || ferror(sc->lines))) die("cannot write '%s': %s", sc->out_path, strerror(errno));
    free(nll);
    free(top);
}

// The mean NLL and perplexity of the positions scored, with llama-perplexity's uncertainty:
// ppl * sqrt(var(nll) / (N - 1)), var the NLLs' (population) variance.
static void print_score_summary(const ScoreCtx *sc) {
    double mean = sc->total / sc->count, var = sc->total2 / sc->count - mean * mean, ppl = exp(mean);
    double unc = sc->count > 1 && var > 0 ? ppl * sqrt(var / (sc->count - 1)) : 0.0;
    printf("mean_nll %.6f ppl %.6f +/- %.6f\n", mean, ppl, unc);
}

// Every position of the text through score_chunk, a chunk at a time; under PKV_RECALL those after
// a --score-prompt one at a time (attention/recall.h: the measurement reads each step's own selection).
static void score_positions(const Model *m, RunState *s, ScoreCtx *sc, const Options *o) {
    if (getenv("PKV_RECALL") && o->score_prompt > 0) {
        prefill(m, s, "score", sc->tokens, o->score_prompt, 0, 1, score_chunk, sc);
        s->chunk = 1, sc->base = o->score_prompt;
        prefill(m, s, "score", sc->tokens + o->score_prompt, sc->n - o->score_prompt, o->score_prompt, 1, score_chunk, sc);
    } else {
        prefill(m, s, "score", sc->tokens, sc->n, 0, 1, score_chunk, sc);
    }
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
    start_run(&s, tt, m, o);
    ScoreCtx sc = {.tokens = tokens, .n = n, .vocab = (int)m->c.vocab_size, .lines = o->summary ? NULL : stdout, .out_path = o->score_out};
    if (o->score_out && !(sc.lines = fopen(o->score_out, "w"))) die("--score-out '%s': %s", o->score_out, strerror(errno));
    catch_sigint(); // Ctrl-C: the summary of what was scored
    double t0 = now_s();
    score_positions(m, &s, &sc, o);
    double el = now_s() - t0;
    if (sc.lines && sc.lines != stdout && fclose(sc.lines) != 0) die("cannot write '%s': %s", o->score_out, strerror(errno));
    if (sc.count > 0) print_score_summary(&sc);
    if (interrupted) fprintf(stderr, "[interrupted: %d of %d positions scored%s]\n", sc.count, n - 1, sc.count ? "; the summary is theirs" : "");
    char ad[128];
    int done = interrupted ? sc.count + 1 : n; // the tokens of the positions scored
    fprintf(stderr, "score: %d tokens in %.2f s (%.1f tok/s), attention %s\n", done, el, done / el, attn_desc(o, n, o->score_prompt, ad, sizeof ad));
    close_run_state(&s);
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

// A generation: its prompt, state and what its stats line reports.
typedef struct {
    const Model *m;
    const Tokenizer *tok; // NULL: a --synthetic model (ids only)
    const Options *o;
    RunState s;
    ThreadTuner tt[2];
    Sampler sampler;
    int *prompt, n_prompt; // the session's tokens first, when one is loaded
    int n_saved;           // of which restored from --load-session
    int ctx;
    int *hist;             // (ctx) the context so far, for the penalties
    int generated;
    const char *stop;      // why it ended early (NULL: EOS or -n)
    int eos;               // it ended at the model's end-of-sequence token
    double t_restore, t_prefill, t_decode, first_ms; // first_ms: the first decode step (after a restore it rebuilds the index)
    double *step_ms;       // per decode step, for the TPOT bins of a long run (else NULL)
} Generation;

// -p or -f as ids (--ids), or as text with BOS in front (none after a session: its tokens have it).
static int *read_prompt(const Tokenizer *tok, const Options *o, int vocab, int *n_out) {
    size_t len = 0;
    char *text = o->prompt_file ? read_file(o->prompt_file, &len) : NULL;
    const char *src = text ? text : (o->prompt ? o->prompt : "");
    int n = 0, *prompt;
    if (o->ids) {
        prompt = parse_ids(src, vocab, &n);
    } else {
        if (!text) len = strlen(src);
        int n_text;
        char what[300] = "the prompt (-p)";
        if (text) snprintf(what, sizeof what, "'%.256s'", o->prompt_file);
        int *ids = encode_text(tok, what, src, len, &n_text);
        int bos = tokenizer_add_bos(tok) && tokenizer_bos(tok) >= 0 && !o->load_session;
        if (!(prompt = malloc(((size_t)n_text + 1) * sizeof(int)))) die("out of memory");
        if (bos) prompt[n++] = tokenizer_bos(tok);
        memcpy(prompt + n, ids, (size_t)n_text * sizeof(int));
        n += n_text;
        free(ids);
    }
    free(text);
    *n_out = n;
    return prompt;
}

// A chat model given plain text continues it as written, and an instruct model often ends it at
// once (an empty reply): say what --chat would do. Not applied by default: -p stays the exact
// text (templated by hand, it is left alone).
static void hint_chat(const Tokenizer *tok, const Options *o, const int *prompt, int n) {
    if (o->ids || o->load_session || tokenizer_chat(tok) == TOK_CHAT_NONE) return;
    for (int i = 0; i < n; i++)
        if (tokenizer_is_special(tok, prompt[i]) && prompt[i] != tokenizer_bos(tok)) return; // already templated
    fprintf(stderr, "note: the model has a chat template and the prompt is plain text, continued as written; "
                    "--chat applies the template\n");
}

// --load-session: its tokens go in front of the prompt's (their ids are read with the K/V).
static void open_prompt_session(Generation *g, SessionHeader *sh) {
    const Options *o = g->o;
    char serr[SESSION_ERR_LEN];
    if (session_open(o->load_session, g->m, &o->attn, g->m->be->create != NULL, sh, serr) != 0) die("%s", serr);
    if (sh->kind != SESSION_PROMPT) die("session '%s' is a chat's (/save): resume it with --chat", o->load_session);
    g->n_saved = sh->n_tokens;
    int *all = malloc(((size_t)g->n_saved + g->n_prompt) * sizeof(int));
    if (!all) die("out of memory");
    memcpy(all + g->n_saved, g->prompt, (size_t)g->n_prompt * sizeof(int));
    free(g->prompt);
    g->prompt = all;
    g->n_prompt += g->n_saved;
}

// The context: the prompt and -n, or --ctx; the prompt must leave room for a token (-n 0: fit).
static int generation_ctx(const Generation *g) {
    const Config *c = &g->m->c;
    if (g->n_prompt == 0) die("the prompt is empty (give -p TEXT or -f FILE)");
    long want = (long)g->n_prompt + g->o->steps;
    int ctx = pick_ctx(g->o, c, want > INT_MAX ? INT_MAX : (int)want);
    if (g->o->steps == 0 ? g->n_prompt > ctx : g->n_prompt >= ctx) // -n 0: prefill only (timing it)
        die("the prompt has %d tokens, which leaves no room in a context of %d (raise --ctx; the model was trained on %u)",
            g->n_prompt, ctx, c->max_seq_len);
    return ctx;
}

// The K/V of the saved positions; returns the logits after the last.
static float *restore_prompt_session(Generation *g, const SessionHeader *sh) {
    const Options *o = g->o;
    char serr[SESSION_ERR_LEN];
    double t0 = now_s();
    float *logits = malloc((size_t)g->m->c.vocab_size * sizeof(float));
    if (!logits) die("out of memory");
    void *conv = NULL;
    if (session_read(o->load_session, sh, &g->s, g->prompt, logits, &conv, serr) != 0) die("%s", serr);
    free(conv);
    if (g->s.attn) attn_policy_resume(g->s.attn, g->n_saved, sh->fp8_end); // its index is rebuilt from the rows at the next step
    g->t_restore = now_s() - t0;
    fprintf(stderr, "session: %d positions restored from '%s' in %.2f s%s\n", g->n_saved, o->load_session, g->t_restore,
            g->n_prompt > g->n_saved ? ", the prompt's tokens follow them" : "");
    return logits;
}

// The prompt's tokens that no session brought, then --save-session; the logits after the last.
static float *prefill_prompt(Generation *g, float *saved_logits) {
    const Options *o = g->o;
    double t0 = now_s();
    float *logits = g->n_prompt > g->n_saved
                        ? prefill(g->m, &g->s, "prefill", g->prompt + g->n_saved, g->n_prompt - g->n_saved, g->n_saved, 0, NULL, NULL)
                        : saved_logits;
    g->t_prefill = now_s() - t0;
    if (o->save_session && logits) {
        char serr[SESSION_ERR_LEN];
        double ts = now_s();
        SessionExtra x = {SESSION_PROMPT, g->n_prompt, g->s.attn ? attn_policy_fp8_end(g->s.attn) : 0, logits, NULL, 0};
        if (session_save(o->save_session, g->m, &g->s, &o->attn, g->prompt, g->n_prompt, &x, serr) != 0) die("--save-session: %s", serr);
        fprintf(stderr, "session: %d positions saved to '%s' in %.2f s\n", g->n_prompt, o->save_session, now_s() - ts);
    }
    return logits;
}

// Token `next` to stdout: an id, or its text through the --stop filter. 1 when a stop string completed.
static int print_token(const Generation *g, int next, TokDecoder *dec, StopFilter *sf, char *piece) {
    if (g->o->ids) return printf(g->generated > 1 ? " %d" : "%d", next), 0;
    if (tokenizer_is_eos(g->tok, next)) return 0;
    size_t k = tokenizer_decode_step(g->tok, dec, next, piece, tokenizer_max_piece_len(g->tok) + 16);
    return stop_feed(sf, piece, k);
}

// --echo: the prompt (a session's tokens included) as the generation will continue it: its ids,
// or its text without the BOS the runner put in front.
static void echo_prompt(const Generation *g) {
    if (g->o->ids) {
        for (int i = 0; i < g->n_prompt; i++) printf("%d ", g->prompt[i]);
    } else {
        int skip = g->n_prompt > 0 && g->prompt[0] == tokenizer_bos(g->tok);
        char *text = tokenizer_decode(g->tok, g->prompt + skip, (size_t)(g->n_prompt - skip));
        if (!text) die("out of memory");
        fputs(text, stdout);
        free(text);
    }
    flush_out();
}

// Samples, prints and runs tokens from the prompt's logits until EOS, -n, a stop string, the end
// of the context or Ctrl-C.
static void decode(Generation *g, float *logits) {
    const Options *o = g->o;
    char *piece = malloc(g->tok ? tokenizer_max_piece_len(g->tok) + 16 : 16), err[MODEL_ERR_LEN];
    if (!piece) die("out of memory");
    TokDecoder dec = {0};
    StopFilter sf = {o->stops, o->n_stops, NULL, 0};
    double t0 = now_s();
    int next = -1;
    for (int pos = g->n_prompt; g->generated < o->steps; pos++) {
        if (interrupted || !logits) {
            g->stop = "interrupted";
            break;
        }
        if (next < 0) next = next_token(&g->sampler, logits, g->hist, pos); // the first token; later ones come with their step
        g->hist[pos] = next;
        g->generated++;
        if (print_token(g, next, &dec, &sf, piece)) {
            flush_out();
            g->stop = "stop string";
            break;
        }
        flush_out();
        if (g->tok && tokenizer_is_eos(g->tok, next) && !o->ignore_eos) {
            g->eos = 1;
            break;
        }
        if (g->generated == o->steps) break;
        if (pos >= g->ctx) {
            g->stop = "context full";
            break;
        }
        double ts = now_s(); // the step as the user gets it: the forward pass and the sampling
        next = model_decode_sample(g->m, &g->s, &g->sampler, next, pos, g->hist, pos + 1, err);
        if (next < 0) die("%s", err);
        if (g->step_ms) g->step_ms[g->generated - 1] = 1e3 * (now_s() - ts);
        if (g->generated == 1) g->first_ms = 1e3 * (now_s() - ts);
    }
    if (!o->ids && !(g->stop && strcmp(g->stop, "stop string") == 0)) {
        size_t k = tokenizer_decode_flush(g->tok, &dec, piece, tokenizer_max_piece_len(g->tok) + 16);
        if (!stop_feed(&sf, piece, k)) stop_flush(&sf);
    }
    free(sf.held);
    free(piece);
    if (g->generated > 0) printf("\n"); // -n 0 prints nothing
    g->t_decode = now_s() - t0;
    flush_out();
}

// Why it ended (when not by itself), then the stats line on stderr, then a long run's TPOT bins.
static void print_generation_stats(Generation *g) {
    const Options *o = g->o;
    if (g->eos) fprintf(stderr, "[end of text]\n"); // the model's own end: the output is all there is
    if (g->stop && interrupted) fprintf(stderr, "[interrupted]\n");
    else if (g->stop && strcmp(g->stop, "stop string") == 0) g->stop = NULL; // the run's own end
    else if (g->stop) fprintf(stderr, "[stopped: %s at %d tokens; raise --ctx]\n", g->stop, g->ctx);
    // generated tokens minus the first, which came from the prefill, were decode steps
    int steps = g->generated > 1 ? g->generated - 1 : 0, n_prompt = g->n_prompt;
    if (g->n_saved) // restored: the time to the first token is the restore, plus any new prompt tokens' prefill
        fprintf(stderr, "prompt %d tokens (%d restored in %.2f s, %d prefilled in %.2f s) | first step %.1f ms", n_prompt, g->n_saved,
                g->t_restore, n_prompt - g->n_saved, g->t_prefill, g->first_ms);
    else
        fprintf(stderr, "prompt %d token%s | prefill %.1f tok/s", n_prompt, plural(n_prompt), n_prompt / (g->t_prefill > 0 ? g->t_prefill : 1e-9));
    if (steps) fprintf(stderr, " | decode %.2f ms/token (TPOT)", 1e3 * g->t_decode / steps);
    else fprintf(stderr, " | no decode step"); // 0 or 1 tokens: the first comes from the prefill
    fprintf(stderr, " | generated %d token%s", g->generated, plural(g->generated));
    if (!g->s.dev) fprintf(stderr, " | threads %d%s", tuner_threads(&g->tt[0]), o->threads ? "" : " (tuned)");
    if (!o->seed_set && o->temperature > 0) fprintf(stderr, " | seed %llu", o->seed); // to repeat the run: --seed
    fprintf(stderr, "\n");
    if (g->step_ms && steps > TPOT_BINS_FROM) print_tpot_bins(g->step_ms, steps, n_prompt);
}

static void run_generate(const Model *m, const Tokenizer *tok, const Options *o) {
    if (o->ids && o->n_stops) die("--stop applies to text output, not --ids");
    Generation g = {.m = m, .tok = tok, .o = o};
    g.prompt = read_prompt(tok, o, (int)m->c.vocab_size, &g.n_prompt);
    if (tok) hint_chat(tok, o, g.prompt, g.n_prompt);
    SessionHeader sh;
    if (o->load_session) open_prompt_session(&g, &sh);
    g.ctx = generation_ctx(&g);
    open_run_state(&g.s, m, o, g.ctx, m->be->max_chunk, 0);
    g.s.attn = make_attn(o, m, &g.s, g.n_prompt);
    start_run(&g.s, g.tt, m, o);
    float *saved_logits = o->load_session ? restore_prompt_session(&g, &sh) : NULL;
    make_sampler(&g.sampler, m, tok, o);
    if (!(g.hist = malloc((size_t)g.ctx * sizeof(int)))) die("out of memory");
    memcpy(g.hist, g.prompt, (size_t)g.n_prompt * sizeof(int));
    if (o->save_session) { // before the prefill: the disk the session will need
        char serr[SESSION_ERR_LEN];
        uint64_t bytes = session_bytes(&m->c, &o->attn, g.s.dev ? SESSION_KV_GPU : SESSION_KV_CPU_F32, g.n_prompt, g.n_prompt, 0);
        if (session_check_disk(o->save_session, bytes, serr) != 0) die("--save-session: %s", serr);
    }
    catch_sigint();
    if (o->echo) echo_prompt(&g);
    float *logits = prefill_prompt(&g, saved_logits);
    g.step_ms = o->steps > TPOT_BINS_FROM ? malloc((size_t)o->steps * sizeof(double)) : NULL;
    decode(&g, logits);
    free(g.hist);
    print_generation_stats(&g);
    free(g.step_ms);
    free(saved_logits);
    sampler_free(&g.sampler);
    close_run_state(&g.s);
    free(g.prompt);
}

// ---- tokenize, render-chat ----

// A token's bytes as a quoted C string: control bytes, quotes, backslashes and, in a piece that
// is not whole UTF-8 (part of a character), its bytes above 0x7f as escapes.
static void print_piece(const char *p, size_t len) {
    int utf8 = tokenizer_utf8_invalid_at(p, len) < 0;
    putchar('"');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c < 0x20 || c == 0x7f || (c >= 0x80 && !utf8)) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('"');
}

static void run_tokenize(const Tokenizer *tok, const Options *o) {
    if (!o->prompt_file && !o->prompt) die("--tokenize needs -f FILE (or -p TEXT)");
    size_t len = 0;
    char *text = o->prompt_file ? read_file(o->prompt_file, &len) : NULL;
    int n;
    char what[300] = "the text (-p)";
    if (text) snprintf(what, sizeof what, "'%.256s'", o->prompt_file);
    int *ids = encode_text(tok, what, text ? text : o->prompt, text ? len : strlen(o->prompt), &n);
    for (int i = 0; i < n && o->pieces; i++) { // --pieces: "id<TAB>text" per line
        size_t k;
        const char *piece = tokenizer_piece(tok, ids[i], &k);
        printf("%d\t", ids[i]);
        print_piece(piece, k);
        printf("\n");
    }
    for (int i = 0; i < n && !o->pieces; i++) printf(i ? " %d" : "%d", ids[i]);
    if (!o->pieces) printf("\n");
    free(ids);
    free(text);
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

// ---- chat ----

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
    int next = -1;
    while (reply && k < budget) {
        if (interrupted) {
            *stop = "interrupted";
            break;
        }
        if (next < 0) next = next_token(&c->sampler, logits, c->cache, c->n_cache); // the first token; later ones come with their step
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
        c->cache[c->n_cache] = next;
        if ((next = model_decode_sample(c->m, &c->s, &c->sampler, next, c->n_cache, c->cache, c->n_cache + 1, err)) < 0) die("%s", err);
        c->n_cache++;
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

// One line of stdin into *line (malloc'd, *cap bytes): on a terminal after the prompt, and through
// libedit where the build has it (arrows, history, Ctrl-R search); -1 at the end of input, or with
// errno EINTR when Ctrl-C ended the wait.
static ssize_t read_line(int tty, const char *prompt, char **line, size_t *cap) {
#ifdef HAVE_LIBEDIT
    if (tty) {
        char *r = readline(prompt);
        if (!r) { // Ctrl-C (our handler ran: no restart) or the end of input
            errno = interrupted ? EINTR : 0;
            return -1;
        }
        if (*r) add_history(r);
        size_t n = strlen(r);
        free(*line);
        *line = r, *cap = n + 1;
        return (ssize_t)n;
    }
#endif
    if (tty) fputs(prompt, stdout), fflush(stdout);
    errno = 0;
    return getline(line, cap, stdin);
}

// One user message from stdin, newline removed; on a terminal a line ending in '\' continues on
// the next. NULL at end of input. Ctrl-C while waiting asks again.
static char *read_message(int tty, size_t *len) {
    char *line = NULL, *msg = NULL;
    size_t cap = 0, n_msg = 0;
    for (;;) {
        interrupted = 0; // a Ctrl-C pressed between turns stopped nothing: forget it
        errno = 0;
        ssize_t n = read_line(tty, msg ? "... " : "> ", &line, &cap);
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

// --chat --load-session: the session's header, checked before the state is sized for it.
static void open_chat_session(const Model *m, const Options *o, SessionHeader *sh) {
    char serr[SESSION_ERR_LEN];
    if (session_open(o->load_session, m, &o->attn, m->be->create != NULL, sh, serr) != 0)
        die("%s", serr);
    if (sh->kind != SESSION_CHAT) die("session '%s' is a prompt's (--save-session): resume it without --chat", o->load_session);
    if (o->system || o->prompt || o->prompt_file) die("--load-session brings its own conversation: no --system, -p or -f with it");
}

// A chat's state: --ctx positions (default CHAT_CTX_DEFAULT, or the session's and room for more
// turns), the sampler, the cache's ids, the system message or the loaded conversation.
static void chat_open(Chat *c, ThreadTuner tt[2]) {
    const Options *o = c->o;
    SessionHeader sh;
    int need = CHAT_CTX_DEFAULT;
    if (o->load_session) {
        open_chat_session(c->m, o, &sh);
        if (sh.n_tokens + 1024 > need) need = sh.n_tokens + 1024; // room for the next turns
    }
    int ctx = pick_ctx(o, &c->m->c, need);
    if (o->load_session && sh.n_tokens >= ctx)
        die("session '%s' holds %d positions, more than the context of %d: raise --ctx", o->load_session, sh.n_tokens, ctx);
    open_run_state(&c->s, c->m, o, ctx, c->m->be->max_chunk, 0);
    start_run(&c->s, tt, c->m, o);
    make_sampler(&c->sampler, c->m, c->tok, o);
    c->cache = malloc((size_t)c->s.ctx * sizeof(int));
    c->piece = malloc(tokenizer_max_piece_len(c->tok) + 16);
    if (!c->cache || !c->piece) die("out of memory");
    if (o->system) chat_push(c, "system", strdup(o->system));
    if (o->load_session) chat_load(c, &sh, o->load_session);
    if (!o->seed_set && o->temperature > 0) chat_note("seed %llu (--seed %llu repeats these replies)", o->seed, o->seed);
}

// /reset: the conversation (but --system) and its cache go; the next message is a first turn
// again, prefilled densely, and the GPU gives back its host store's pages.
static void chat_reset(Chat *c) {
    while (c->n_msg > (c->o->system ? 1 : 0)) chat_pop(c);
    if (c->s.attn) c->s.attn->destroy(c->s.attn);
    c->s.attn = NULL, c->attn_made = 0, c->n_cache = 0, c->prefill_len = 0;
    size_t freed = c->s.dev && c->s.be->reset ? c->s.be->reset(c->s.dev) : 0;
    if (freed) chat_note("conversation cleared (%.2f GiB of pinned host memory given back)", freed / 1073741824.0);
    else chat_note("conversation cleared");
}

// One line of input: a command or a message (len: its bytes, to find a NUL). 0 after /exit.
static int chat_line(Chat *c, const char *line, size_t len) {
    if (strcmp(line, "/exit") == 0) return 0;
    if (strncmp(line, "/save ", 6) == 0 || strcmp(line, "/save") == 0) chat_save(c, line[5] ? line + 6 : "");
    else if (strcmp(line, "/reset") == 0) chat_reset(c);
    else if (strlen(line) != len) chat_note("the message contains a NUL byte: message ignored");
    else if (len > 0) chat_turn(c, line);
    return 1;
}

static void chat_close(Chat *c) {
    while (c->n_msg > 0) chat_pop(c);
    free(c->msg);
    free(c->cache);
    free(c->piece);
    sampler_free(&c->sampler);
    close_run_state(&c->s);
}

static void run_chat(const Model *m, const Tokenizer *tok, const Options *o) {
    if (o->score_file || o->tokenize || o->ids) die("--chat cannot be combined with --score, --tokenize or --ids");
    if (o->n_stops) die("--stop applies to generation, not --chat (the chat template ends each reply)");
    if (tokenizer_chat(tok) == TOK_CHAT_NONE) die("the model has no chat template this runner renders (Llama 3, Qwen3, ChatML)");
    Chat c = {.m = m, .tok = tok, .o = o};
    ThreadTuner tt[2];
    chat_open(&c, tt);
    catch_sigint();
    int tty = isatty(STDIN_FILENO);
    if (tty) fprintf(stderr, "chat: /reset clears the conversation, /save FILE keeps it, /exit quits, Ctrl-C stops a reply\n");
    size_t len = 0; // -p or -f: the first message
    char *first = o->prompt_file ? read_file(o->prompt_file, &len) : o->prompt ? strdup(o->prompt) : NULL;
    if (first && !o->prompt_file) len = strlen(first);
    for (char *line = first; line || (line = read_message(tty, &len)); line = NULL) {
        interrupted = 0; // a Ctrl-C while the line was read belongs to no reply
        int go_on = chat_line(&c, line, len);
        free(line);
        if (!go_on) break;
    }
    chat_close(&c);
}

// ---- bench, synthetic ----

// The GPU when there is one (or when asked), else the CPU.
// gpus: --gpus (0 or 1: one GPU); prefill_fp8: --prefill-attn fp8, a GPU option.
static void select_device(Model *m, const char *device, int gpus, int prefill_fp8) {
    const Backend *cuda = backend_cuda_get();
    int want_gpu = device && strcmp(device, "gpu") == 0, want_cpu = device && strcmp(device, "cpu") == 0;
    int have_gpu = cuda && cuda->available();
    if (want_gpu && !have_gpu)
        die(cuda ? "--device gpu: no CUDA device is available" : "--device gpu: this build has no CUDA support");
    if (have_gpu && !want_cpu) m->be = cuda;
    if (gpus > 1 && m->be != cuda)
        die("--gpus %d: %s", gpus, want_cpu ? "the CPU path runs on the CPU (drop --device cpu)" : cuda ? "no CUDA device is available" : "this build has no CUDA support");
    if (prefill_fp8 && m->be != cuda)
        die("--prefill-attn fp8 runs on the GPU (Hopper's fp8 tensor cores); %s", want_cpu ? "the CPU path attends in fp32 (drop --device cpu)" :
            cuda ? "no CUDA device is available" : "this build has no CUDA support");
    m->gpus = gpus;
}

// --quant for a --synthetic model: its matrices made as blocks on the GPU.
static void synthetic_quant(Model *m, const char *quant) {
    if (!quant) return;
    m->synthetic_dt = strcmp(quant, "q8_0") == 0 ? DTYPE_Q8_0 : strcmp(quant, "q4_0") == 0 ? DTYPE_Q4_0 : DTYPE_Q4_K;
    m->n_quantized = 7 * (int)m->c.n_layers + 1;
}

// --bench-ctx: up to 32 contexts, comma-separated (default 4K, 32K, 128K).
static int bench_contexts(const char *list, int ctxs[32]) {
    int n = 0;
    const char *p = list ? list : "4096,32768,131072";
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 30) || n == 32 || (*end && *end != ',')) die("--bench-ctx: bad list '%s'", list);
        ctxs[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

static void sampling_defaults(Options *o, const Config *c);

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
            die("unknown --synthetic model '%s' (llama3.1-8b, llama3.1-70b, qwen3-8b, qwen3-0.6b)", o->synthetic);
        synthetic_quant(&m, o->quant);
    } else if (!o->model_path) {
        die("--bench needs a model file or --synthetic NAME");
    } else if (model_load(&m, o->model_path, err) != 0) {
        die("%s", err);
    }
    select_device(&m, o->device ? o->device : "gpu", o->gpus, o->attn.prefill_fp8);
    if (!m.be->bench) die("--bench needs the GPU backend");
    int ctxs[32], n = bench_contexts(o->bench_ctx, ctxs);
    int pkv = o->attn_set && o->attn.method == ATTN_PARISKV;
    // The sampling timed beside greedy: the options given, else the model's own settings.
    printf("run %s, commit %s\n", PKV_VERSION, PKV_COMMIT); // which binary made the table
    Options so = *o;
    sampling_defaults(&so, &m.c);
    Sampler smp;
    make_sampler(&smp, &m, NULL, &so);
    AttnConfig dense = o->attn; // dense decode; its settings carry --prefill-attn
    dense.method = ATTN_FULL;
    int rc = m.be->bench(&m, ctxs, n, o->bench_steps ? o->bench_steps : 64, o->bench_prefill, m.be->max_chunk,
                         pkv ? &o->attn : o->attn.prefill_fp8 ? &dense : NULL, &smp, o->bench_overlap, o->bench_returns);
    sampler_free(&smp);
    model_free(&m);
    return rc;
}

// Generation on random weights of a real shape (no tokenizer: --ids), on the GPU: long-context
// runs of the real path (a prompt of random ids, then -n steps) where no model file of that size
// is at hand.
static int run_synthetic(Options *o) {
    if (o->model_path) die("give either a model file or --synthetic NAME, not both");
    if (!o->ids) die("--synthetic has no tokenizer: give the prompt as ids (--ids -p \"1 2 3\" or --ids -f FILE)");
    if (o->chat || o->render_chat || o->tokenize) die("--synthetic runs generation, --score (or --bench) only");
    check_files(o);
    Model m;
    if (model_synthetic(&m, o->synthetic) != 0) die("unknown --synthetic model '%s' (llama3.1-8b, llama3.1-70b, qwen3-8b, qwen3-0.6b)", o->synthetic);
    synthetic_quant(&m, o->quant);
    if (o->device && strcmp(o->device, "cpu") == 0) die("--synthetic runs on the GPU (its weights are made there)");
    select_device(&m, "gpu", o->gpus, o->attn.prefill_fp8);
    resolve_attention(o, &m);
    if (o->score_file) run_score(&m, NULL, o);
    else run_generate(&m, NULL, o);
    model_free(&m);
    flush_out();
    return interrupted ? 130 : 0;
}

// ---- main ----

// Threads: --threads, else OMP_NUM_THREADS (both fix the count), else the CPUs of our affinity
// mask, the count then tuned by measuring (model/threads.h).
static void set_max_threads(Options *o) {
    const char *omp_env = getenv("OMP_NUM_THREADS");
    char err[OPTIONS_ERR_LEN];
    long n = 0;
    if (!o->threads && omp_env && *omp_env) {
        if (options_parse_long(omp_env, "OMP_NUM_THREADS", 1, POOL_MAX_THREADS, &n, err) != 0) die("%s", err);
        o->threads = (int)n;
    }
    int cpus = pool_cpus_available();
    if (o->threads > cpus) // allowed (a test of oversubscription), but rarely meant
        fprintf(stderr, "warning: %s %d is more than the %d CPU%s this process may use: threads will wait for each other\n",
                o->threads_set ? "--threads" : "OMP_NUM_THREADS", o->threads, cpus, plural(cpus));
    pool_set_max_threads(o->threads ? o->threads : cpus);
}

// The model's generation_config.json supplies the sampling defaults unless the user chose.
static void sampling_defaults(Options *o, const Config *c) {
    if (o->sampling_set || !c->has_gen_defaults) return;
    o->temperature = c->gen_do_sample ? c->gen_temperature : 0.0f;
    o->top_k = c->gen_top_k;
    o->top_p = c->gen_top_p;
    o->min_p = c->gen_min_p;
}

// The modes that read a model file: load it and its tokenizer, run the mode.
static int run_model_file(Options *o) {
    if (o->prompt && o->prompt_file) die("give either -p or -f, not both");
    if (!o->chat && !o->render_chat && (o->system || o->date || o->think >= 0))
        die("--system, --date, --think and --no-think apply to --chat and --render-chat");
    check_files(o);
    set_max_threads(o);
    Model m;
    char err[MODEL_ERR_LEN], tok_err[TOK_ERR_LEN];
    if (model_load(&m, o->model_path, err) != 0) die("%s", err);
    select_device(&m, o->device, o->gpus, o->attn.prefill_fp8);
    resolve_attention(o, &m);
    const FileHeader *h = m.file.header;
    Tokenizer *tok = tokenizer_load(m.file.data + h->tokenizer_offset, h->tokenizer_size, tok_err);
    if (!tok) die("model file '%s': bad tokenizer section: %s", o->model_path, tok_err);
    sampling_defaults(o, &m.c);

    if (o->render_chat) run_render_chat(tok, o);
    else if (o->chat) run_chat(&m, tok, o);
    else if (o->tokenize) run_tokenize(tok, o);
    else if (o->score_file) run_score(&m, tok, o);
    else run_generate(&m, tok, o);

    tokenizer_free(tok);
    model_free(&m);
    flush_out();
    return interrupted && !o->chat ? 130 : 0; // a generation stopped by Ctrl-C
}

// SIGPIPE's default action (see flush_out), restored in case it came ignored or blocked; SIGBUS
// from a model file truncated while mapped: a one-line error.
static void prepare_process(void) {
    signal(SIGPIPE, SIG_DFL);
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigprocmask(SIG_UNBLOCK, &pipe_set, NULL);
    guard_install(0);
}

int main(int argc, char **argv) {
    Options o;
    char err[OPTIONS_ERR_LEN];
    switch (options_parse(&o, argc, argv, err)) {
    case OPTIONS_HELP: options_usage(stdout); return 0;
    case OPTIONS_VERSION:
        printf("run %s (model.bin format %d, CUDA backend %s, commit %s)\n", PKV_VERSION, MODEL_VERSION, backend_cuda_get() ? "built in" : "not built",
               PKV_COMMIT);
        return 0;
    case OPTIONS_ERROR: die("%s", err);
    }
    prepare_process();
    if (options_check(&o, err) != 0) die("%s", err);
    if (o.bench) return run_bench(&o);
    if (o.synthetic) return run_synthetic(&o);
    if (!o.model_path) return options_usage(stderr), 1;
    return run_model_file(&o);
}
