// ./run's options (options.h): one table gives each option's name, its argument, where it goes,
// its range or choices and its --help text; the parser and --help both read it.
#include "options.h"

#include "pool.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

typedef enum {
    ARG_NONE,   // a flag: the int at field set to lo
    ARG_STRING, // the value itself
    ARG_INT,    // an integer in [lo, hi] into an int
    ARG_FLOAT,  // a number in [flo, fhi] into a float
    ARG_CHOICE, // one of choices: the string (values NULL) or its value (an int)
    ARG_CUSTOM, // set() checks and stores it
    ARG_ACTION, // -h, --version: parsing stops there
    ARG_NOTE,   // not an option: a line of --help
} ArgKind;

typedef struct OptSpec OptSpec;
struct OptSpec {
    const char *name;
    ArgKind kind;
    size_t field;  // offsetof(Options, ...)
    size_t given;  // an int of Options set to 1 when the option is given (NOT_GIVEN: none)
    long lo, hi;
    float flo, fhi;
    const char *const *choices; // NULL-terminated
    const int *values;
    int (*set)(Options *o, const OptSpec *s, const char *v, char *err);
    const char *section; // --help: a heading printed before this entry
    const char *usage;   // --help: the left column (NULL: the entry is not listed, another lists it)
    const char *help;    // --help: the text; '\n' starts a continuation line
};

#define NOT_GIVEN 0 // model_path sits at offset 0: no flag's "given" int can be there
#define AT(f) .field = offsetof(Options, f)
#define GIVEN(f) .given = offsetof(Options, f)
#define FLAG(f, v) .kind = ARG_NONE, AT(f), .lo = (v)
#define STRING(f) .kind = ARG_STRING, AT(f)
#define INT(f, l, h) .kind = ARG_INT, AT(f), .lo = (l), .hi = (h)
#define FLOAT(f, l, h) .kind = ARG_FLOAT, AT(f), .flo = (l), .fhi = (h)
#define CHOICE(f, ...) .kind = ARG_CHOICE, AT(f), .choices = (const char *const[]){__VA_ARGS__, NULL}
#define VALUES(...) .values = (const int[]){__VA_ARGS__}
#define CUSTOM(fn) .kind = ARG_CUSTOM, .set = (fn)
#define ACTION(a) .kind = ARG_ACTION, .lo = (a)

static int fail(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int set_seed(Options *o, const OptSpec *s, const char *v, char *err);
static int add_stop(Options *o, const OptSpec *s, const char *v, char *err);
static int set_attn(Options *o, const OptSpec *s, const char *v, char *err);
static int set_cache_rows(Options *o, const OptSpec *s, const char *v, char *err);
_Static_assert(offsetof(Options, model_path) == 0, "NOT_GIVEN is model_path's offset");

static const OptSpec OPTIONS[] = {
    {.section = "generate (default):"},
    {"-p", STRING(prompt), .usage = "-p TEXT", .help = "prompt"},
    {"-f", STRING(prompt_file), .usage = "-f FILE", .help = "prompt from a file (long prompts)"},
    {"-n", INT(steps, 0, INT_MAX / 2), GIVEN(steps_set), .usage = "-n N", .help = "tokens to generate (default 256)"},
    {"--ids", FLAG(ids, 1), .usage = "--ids",
     .help = "the prompt is whitespace-separated token ids (no BOS added) and the\noutput is the generated ids"},
    {"--ignore-eos", FLAG(ignore_eos, 1), .usage = "--ignore-eos", .help = "keep generating past an end-of-sequence token"},
    {"--echo", FLAG(echo, 1), .usage = "--echo", .help = "print the prompt (its tokens' text, or ids) before the generated text"},

    {.section = "sampling (defaults: the model's generation_config.json, else temperature 0.8, top-p 0.95):"},
    {"--temp", FLOAT(temperature, 0, 100), GIVEN(sampling_set), .usage = "--temp T", .help = "temperature; 0 is greedy"},
    {"--top-k", INT(top_k, 0, INT_MAX), GIVEN(sampling_set), .usage = "--top-k K", .help = "keep the K most likely tokens (0: off)"},
    {"--top-p", FLOAT(top_p, 0, 1), GIVEN(sampling_set), .usage = "--top-p P", .help = "nucleus sampling (1: off)"},
    {"--min-p", FLOAT(min_p, 0, 1), GIVEN(sampling_set), .usage = "--min-p P", .help = "drop tokens below P x the top probability (0: off)"},
    {"--seed", CUSTOM(set_seed), GIVEN(seed_set), .lo = 0, .hi = LONG_MAX, .usage = "--seed S",
     .help = "random seed (default: a fresh one each run, printed on the stats line\nand at a chat's start)"},
    {"--repeat-penalty", FLOAT(repeat_penalty, 0.01f, 100), .usage = "--repeat-penalty R",
     .help = "divide a seen token's positive logit by R, multiply a negative\none (CTRL, as transformers; 1: off)"},
    {"--presence-penalty", FLOAT(presence_penalty, -100, 100), .usage = "--presence-penalty P",
     .help = "subtract P from the logit of every seen token (0: off)"},
    {"--frequency-penalty", FLOAT(frequency_penalty, -100, 100), .usage = "--frequency-penalty F",
     .help = "subtract F x the times a token was seen (0: off)"},
    {"--repeat-last-n", INT(repeat_last_n, -1, INT_MAX / 2), .usage = "--repeat-last-n N",
     .help = "the penalties look at the last N tokens, prompt included\n(default 64; -1: the whole context)"},
    {"--stop", CUSTOM(add_stop), .usage = "--stop STR", .help = "end the generation before STR (not printed); repeatable, up to 16"},

    {.section = "chat:"},
    {"--chat", FLAG(chat, 1), .usage = "--chat",
     .help = "interactive chat (multi-turn, streaming); -p or -f gives the first user\nmessage; one message per line when stdin is not a "
             "terminal; /reset\nclears the conversation, /exit quits, Ctrl-C stops a reply; -n caps a\nreply; the KV cache holds --ctx "
             "positions (default 4096)"},
    {"--system", STRING(system), .usage = "--system TEXT", .help = "the system message"},
    {"--think", FLAG(think, 1), .usage = "--think, --no-think", .help = "Qwen3: thinking on (the template's default) or off"},
    {"--no-think", FLAG(think, 0)},
    {"--date", STRING(date), .usage = "--date TEXT", .help = "Llama 3.1: the system header's 'Today Date' (default: the template's)"},
    {"--render-chat", STRING(render_chat), .usage = "--render-chat FILE.json",
     .help = "print the token ids of the conversation in FILE (a JSON list\nof {\"role\", \"content\"}) rendered by the model's chat "
             "template, with\nthe generation prompt"},

    {.section = "sessions:"},
    {"--save-session", STRING(save_session), .usage = "--save-session F",
     .help = "after the prompt, write its tokens and K/V to F (versioned, checksummed)"},
    {"--load-session", STRING(load_session), .usage = "--load-session F",
     .help = "resume from F instead of prefilling its tokens (same model, same --attn\nsettings); -p / -f text, if given, follows them as "
             "more prompt"},

    {.section = "scoring and tokens:"},
    {"--score", STRING(score_file), .usage = "--score FILE",
     .help = "teacher-forced scoring of FILE's text (no BOS), or of its ids with\n--ids: one line 'i next_id nll top1' per position "
             "(top1: the most\nlikely next id), then 'mean_nll X ppl Y +/- U' (U: llama-perplexity's\nestimate); Ctrl-C prints "
             "the mean of what was scored"},
    {"--score-prompt", INT(score_prompt, 0, INT_MAX / 2), .usage = "--score-prompt N",
     .help = "its first N tokens are a prompt, attended densely as -p's would be\n(then the attention policy from N on, as for a "
             "generation; default 0)"},
    {"--summary", FLAG(summary, 1), .usage = "--summary", .help = "with --score: the summary alone, no line per position"},
    {"--score-out", STRING(score_out), .usage = "--score-out FILE",
     .help = "with --score: the lines per position into FILE (stdout: the summary)"},
    {"--tokenize", FLAG(tokenize, 1), .usage = "--tokenize -f FILE", .help = "print the token ids of FILE's text (no BOS)"},
    {"--pieces", FLAG(pieces, 1), .usage = "--pieces",
     .help = "with --tokenize: one line per token, its id and its text (quoted,\nC escapes for control and non-UTF-8 bytes)"},

    {.section = "memory and device:"},
    {"--ctx", INT(ctx, 2, INT_MAX / 2), .usage = "--ctx N", .help = "KV cache positions (default: what the run needs, at most the model's)"},
    {"--device", CHOICE(device, "cpu", "gpu", "auto"), .usage = "--device D", .help = "cpu, gpu or auto (default: the GPU when there is one)"},
    {"--gpus", INT(gpus, 1, 16), .usage = "--gpus N",
     .help = "GPU: split the model over N GPUs of this host (tensor parallel over\nNCCL: each GPU holds its share of the KV heads, FFN and vocabulary,\nand ParisKV's index and host store for its heads; default 1)"},
    {"--prefill-attn", CHOICE(attn.prefill_fp8, "bf16", "fp8"), VALUES(0, 1), .usage = "--prefill-attn T",
     .help = "GPU (H100-class, sm_90): a prompt's attention in bf16 (default) or fp8\n(e4m3 Q, K, V with a scale per query row and per KV head, fp32 sums:\n~1.35x the attention's speed on long prompts; what it costs in quality:\nREADME)"},
    {"--threads", INT(threads, 1, POOL_MAX_THREADS), GIVEN(threads_set), .usage = "--threads N",
     .help = "CPU threads (default: the CPUs this process may use, fewer while that\nmeasures faster, e.g. beside another busy process; "
             "OMP_NUM_THREADS\nfixes the count as --threads does)"},

    {.section = "benchmark (GPU):"},
    {"--bench", FLAG(bench, 1), .usage = "--bench", .help = "time decode steps at each context and print TPOT beside the bandwidth floor:\neach step with its sampling, greedy beside the sampling options (default: the\nmodel's own settings)"},
    {"--synthetic", STRING(synthetic), .usage = "--synthetic NAME",
     .help = "random weights of a real shape instead of a model file:\nllama3.1-8b, llama3.1-70b, qwen3-8b, qwen3-0.6b; also without --bench, on the "
             "GPU, to\ngenerate from a prompt of ids (--ids -f FILE -n N) or --score ids (--ids)"},
    {"--quant", CHOICE(quant, "q8_0", "q4_k", "q4_0"), .usage = "--quant q8_0|q4_k|q4_0",
     .help = "a --synthetic model's matrices as Q8_0, Q4_K or Q4_0 blocks (head Q8_0)"},
    {"--bench-ctx", STRING(bench_ctx), .usage = "--bench-ctx LIST",
     .help = "contexts to fill, e.g. 4096,32768,131072 (default 4096,32768,131072)"},
    {"--bench-steps", INT(bench_steps, 64, 100000), .usage = "--bench-steps N", .help = "timed decode steps per context (default 64, at least 64)"},
    {"--bench-prefill", FLAG(bench_prefill, 1), .usage = "--bench-prefill",
     .help = "fill by a real prefill of random tokens (timed) instead of random K/V"},
    {.kind = ARG_NOTE, .usage = "--bench --attn pariskv", .help = "the ParisKV step (zone of random K/V, --kv-store, --topk), its\nindex update and its floor"},
    {"--bench-overlap", FLOAT(bench_overlap, 0, 1), .usage = "--bench-overlap F",
     .help = "pariskv: a second row per context whose top-k keeps a share F of the\nstep before's (default 0.6, SmolLM2 on real text; "
             "0: none), for the\nrow cache"},
    {"--bench-returns", FLOAT(bench_returns, 0, 1), .usage = "--bench-returns R",
     .help = "of the rest, R come back from the slots dropped in the last steps,\nthe others uniform (default 0.75: what the "
             "default cache's hit rate\non real text, 0.90, implies)"},

    {.section = "attention (dense while the sequence is shorter than max(D, sink + local + 2 topk)):"},
    {"--attn", CUSTOM(set_attn), GIVEN(attn_set), .usage = "--attn A",
     .help = "pariskv (default), full, or a peer (CPU only): streaming, quest, fier, kmeans, oracle"},
    {"--dense-below", INT(dense_below, 1, INT_MAX / 2), .usage = "--dense-below D",
     .help = "D, the length below which attention is dense (default: 2000 with\n--attn; without it, where ParisKV is measured "
             "faster on the device,\nsaid on the load line)"},
    {"--topk", INT(attn.topk, 1, 1 << 24), GIVEN(policy_set), .usage = "--topk K", .help = "retrieval-zone keys attended per step and KV head (default 100)"},
    {"--sink", INT(attn.sink, 0, 1 << 24), GIVEN(policy_set), .usage = "--sink S", .help = "first tokens, always attended (default 4)"},
    {"--local", INT(attn.local, 0, 1 << 24), GIVEN(policy_set), .usage = "--local L", .help = "most recent tokens, always attended (default 256)"},
    {"--update", INT(attn.update, 1, 1 << 24), GIVEN(policy_set), .usage = "--update U",
     .help = "update buffer: after U decode steps the oldest U recent tokens join\nthe retrieval zone (default 512)"},
    {"--kv-store", CHOICE(attn.store, "gpu", "host", "auto"), VALUES(KV_STORE_GPU, KV_STORE_HOST, KV_STORE_AUTO), GIVEN(policy_set), .usage = "--kv-store S",
     .help = "GPU, pariskv: the retrieval zone's K/V in gpu memory, in pinned host\nmemory (read through PCIe, top-k rows a step), or auto "
             "(default: gpu\nwhen the whole context fits there, else host)"},
    {"--kv-store-dtype", CHOICE(attn.zone_fp8, "bf16", "fp8"), VALUES(0, 1), GIVEN(policy_set), .usage = "--kv-store-dtype T",
     .help = "the retrieval zone's K/V as bf16 (default) or fp8 (e4m3 with a\nscale per row: half the host memory and PCIe bytes; GPU: "
             "host store\nonly; the CPU path rounds those rows the same way)"},
    {"--pkv-cache-rows", CUSTOM(set_cache_rows), .lo = 0, .hi = ATTN_CACHE_ROWS_MAX, .usage = "--pkv-cache-rows N",
     .help = "GPU, zone in the host store: keep recently selected zone rows in GPU\nmemory, N rows per layer and KV head (a power of "
             "two up to 1048576;\n0: off; default: 16384, or 32 x --topk past 512, fewer where GPU\nmemory is short), "
             "printed at load"},
    {"--profile", FLAG(attn.profile, 1), .usage = "--profile",
     .help = "at the end, where ParisKV's work went: CPU, how much of each decode\nstep's top-k the step before selected too; GPU, "
             "the row cache's hit rate"},
    {"--version", ACTION(OPTIONS_VERSION), .usage = "--version", .help = "the version, and whether this build has the CUDA backend"},
    {"-h", ACTION(OPTIONS_HELP), .usage = "-h, --help", .help = "this text"},
    {"--help", ACTION(OPTIONS_HELP)},
};
#define N_OPTIONS (sizeof OPTIONS / sizeof OPTIONS[0])

static int fail(char *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, OPTIONS_ERR_LEN, fmt, ap);
    va_end(ap);
    return -1;
}

int options_parse_long(const char *s, const char *flag, long lo, long hi, long *out, char *err) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return fail(err, "%s needs an integer in [%ld, %ld], got '%s'", flag, lo, hi, s);
    *out = v;
    return 0;
}

// Bounds and comparison in float, as the fields are: 0.01f is the least --repeat-penalty.
static int parse_float(const char *s, const char *flag, float lo, float hi, float *out, char *err) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return fail(err, "%s needs a number in [%g, %g], got '%s'", flag, lo, hi, s);
    *out = v;
    return 0;
}

static int set_seed(Options *o, const OptSpec *s, const char *v, char *err) {
    long seed = 0;
    if (options_parse_long(v, s->name, s->lo, s->hi, &seed, err) != 0) return -1;
    o->seed = (unsigned long long)seed;
    return 0;
}

static int set_cache_rows(Options *o, const OptSpec *s, const char *v, char *err) {
    long n = 0;
    if (options_parse_long(v, s->name, s->lo, s->hi, &n, err) != 0) return -1;
    if (n & (n - 1)) return fail(err, "%s needs 0 or a power of two, got %ld", s->name, n);
    o->attn.cache_rows = (int)n;
    return 0;
}

static int add_stop(Options *o, const OptSpec *s, const char *v, char *err) {
    (void)s;
    if (!*v) return fail(err, "--stop needs a non-empty string");
    if (o->n_stops == OPTIONS_MAX_STOPS) return fail(err, "at most %d --stop strings", OPTIONS_MAX_STOPS);
    o->stops[o->n_stops++] = v;
    return 0;
}

// "NAME must be a, b or c, not 'v'"
static int bad_choice(const char *name, const char *const *choices, int n_choices, const char *v, char *err) {
    char list[256] = "";
    size_t n = 0;
    for (int i = 0; i < n_choices; i++) {
        const char *sep = i == 0 ? "" : i + 1 < n_choices ? ", " : " or ";
        n += (size_t)snprintf(list + n, n < sizeof list ? sizeof list - n : 0, "%s%s", sep, choices[i]);
    }
    return fail(err, "%s must be %s, not '%s'", name, list, v);
}

// The methods' names are attention's own (attn_method_parse).
static int set_attn(Options *o, const OptSpec *s, const char *v, char *err) {
    o->attn.method = attn_method_parse(v);
    if (o->attn.method >= 0) return 0;
    const char *names[ATTN_N_METHODS];
    for (int i = 0; i < ATTN_N_METHODS; i++) names[i] = attn_method_name(i);
    return bad_choice(s->name, names, ATTN_N_METHODS, v, err);
}

// The value v of option s into o.
static int apply(Options *o, const OptSpec *s, const char *v, char *err) {
    char *field = (char *)o + s->field;
    switch (s->kind) {
    case ARG_NONE: *(int *)field = (int)s->lo; return 0;
    case ARG_STRING: *(const char **)field = v; return 0;
    case ARG_INT: {
        long x = 0;
        if (options_parse_long(v, s->name, s->lo, s->hi, &x, err) != 0) return -1;
        *(int *)field = (int)x;
        return 0;
    }
    case ARG_FLOAT: return parse_float(v, s->name, s->flo, s->fhi, (float *)field, err);
    case ARG_CHOICE: {
        int i = 0;
        for (; s->choices[i]; i++)
            if (strcmp(v, s->choices[i]) == 0) {
                if (s->values) *(int *)field = s->values[i];
                else *(const char **)field = v;
                return 0;
            }
        return bad_choice(s->name, s->choices, i, v, err);
    }
    case ARG_CUSTOM: return s->set(o, s, v, err);
    case ARG_ACTION:
    case ARG_NOTE: break;
    }
    return 0;
}

static const OptSpec *find(const char *name) {
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (OPTIONS[i].name && strcmp(OPTIONS[i].name, name) == 0) return &OPTIONS[i];
    return NULL;
}

// A seed no other run shares: the kernel's random bytes, or where those are unavailable the
// clock's nanoseconds mixed with the process id (the seconds alone repeat for two runs started
// together). 63 bits, so that --seed takes it back.
static unsigned long long fresh_seed(void) {
    unsigned long long x = 0;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        x = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
        x ^= (unsigned long long)getpid() << 40;
    }
    return x & (unsigned long long)LONG_MAX;
}

static void set_defaults(Options *o) {
    *o = (Options){0};
    o->steps = 256;
    o->repeat_penalty = 1.0f, o->repeat_last_n = 64;
    o->temperature = 0.8f;
    o->top_p = 0.95f;
    o->seed = fresh_seed();
    attn_config_default(&o->attn);
    o->bench_overlap = 0.6f, o->bench_returns = 0.75f;
    o->think = -1;
}

int options_parse(Options *o, int argc, char **argv, char *err) {
    set_defaults(o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const OptSpec *s = find(a);
        if (!s) {
            if (a[0] == '-') return fail(err, "unknown option '%s' (see ./run -h)", a), OPTIONS_ERROR;
            if (o->model_path) return fail(err, "unexpected argument '%s' (see ./run -h)", a), OPTIONS_ERROR;
            o->model_path = a;
            continue;
        }
        if (s->kind == ARG_ACTION) return (int)s->lo;
        const char *v = NULL;
        if (s->kind != ARG_NONE) {
            if (i + 1 >= argc) return fail(err, "%s needs a value", a), OPTIONS_ERROR;
            v = argv[++i];
        }
        if (apply(o, s, v, err) != 0) return OPTIONS_ERROR;
        if (s->given != NOT_GIVEN) *(int *)((char *)o + s->given) = 1;
    }
    return OPTIONS_RUN;
}

int options_check(const Options *o, char *err) {
    if (o->attn.zone_fp8 && o->attn.store == KV_STORE_GPU)
        return fail(err, "--kv-store-dtype fp8 keeps the retrieval zone in the host store: use --kv-store host or auto, not gpu");
    if (o->attn.zone_fp8 && o->attn.method == ATTN_FULL)
        return fail(err, "--kv-store-dtype fp8 applies to a retrieval zone: it needs --attn pariskv (or a peer), not full");
    if (o->score_prompt && !o->score_file) return fail(err, "--score-prompt applies to --score");
    if (o->pieces && !o->tokenize) return fail(err, "--pieces applies to --tokenize");
    if ((o->summary || o->score_out) && !o->score_file) return fail(err, "--summary and --score-out apply to --score");
    if (o->summary && o->score_out) return fail(err, "give --summary (no lines per position) or --score-out FILE (them into FILE), not both");
    if (o->dense_below && o->attn_set && o->attn.method == ATTN_FULL) return fail(err, "--dense-below applies to a policy, not --attn full");
    if (o->echo && (o->chat || o->score_file || o->tokenize || o->render_chat || o->bench))
        return fail(err, "--echo applies to generation (-p / -f)");
    if (o->save_session && (o->chat || o->render_chat || o->score_file || o->tokenize || o->bench))
        return fail(err, "--save-session applies to generation (-p / -f); in a chat, /save FILE");
    if (o->load_session && (o->render_chat || o->score_file || o->tokenize || o->bench))
        return fail(err, "--load-session applies to generation (-p / -f) and --chat");
    if (o->save_session && o->load_session && strcmp(o->save_session, o->load_session) == 0)
        return fail(err, "--save-session and --load-session name the same file");
    if (o->quant && !o->synthetic && !o->bench) // --bench reads a model file's own weights
        return fail(err, "--quant applies to --synthetic models (./export --quant quantizes a model file)");
    return 0;
}

// Each entry: its left column, its text; continuation lines at column 19.
void options_usage(FILE *f) {
    fprintf(f, "usage: ./run model.bin [options]\n");
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const OptSpec *s = &OPTIONS[i];
        if (s->section) fprintf(f, "%s\n", s->section);
        if (!s->usage) continue;
        int w = (int)strlen(s->usage);
        fprintf(f, "  %s%*s", s->usage, (w < 17 ? 17 : w < 23 ? 23 : w + 2) - w, ""); // the text at column 19, or 25
        for (const char *p = s->help; *p;) {
            size_t n = strcspn(p, "\n");
            fprintf(f, "%.*s\n", (int)n, p);
            p += n;
            if (*p) p++, fprintf(f, "%19s", "");
        }
    }
}
