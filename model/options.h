// ./run's command-line options: the Options a run reads, and the one table (options.c) that
// parses them, checks them and prints --help, so those three cannot disagree.
#ifndef OPTIONS_H
#define OPTIONS_H

#include "../attention/attention.h"

#include <stdio.h>

#define OPTIONS_MAX_STOPS 16
#define OPTIONS_ERR_LEN 1024 // as long as run.c's one-line errors

typedef struct {
    const char *model_path;
    const char *prompt;       // -p
    const char *prompt_file;  // -f
    const char *score_file;   // --score
    int score_prompt;         // --score-prompt: its first N tokens are a prompt (attended densely)
    int summary;              // --summary: --score prints its summary alone, no line per position
    const char *score_out;    // --score-out FILE: --score's lines per position into FILE
    const char *save_session; // --save-session FILE: after the prompt
    const char *load_session; // --load-session FILE: resume from it instead of prefilling
    int tokenize;             // --tokenize
    int pieces;               // --pieces: --tokenize prints each token's text beside its id
    int ids;                  // --ids: prompts and outputs are token ids
    int steps;                // -n
    int ctx;                  // --ctx (0: fit the run)
    int ignore_eos;
    int echo;                 // --echo: print the prompt before the generated text
    float temperature, top_p, min_p;
    int top_k;
    int sampling_set;         // any sampling flag given: generation_config.json defaults are off
    unsigned long long seed;
    int seed_set;             // --seed given (else a fresh one, printed on the stats line)
    float repeat_penalty, presence_penalty, frequency_penalty; // 1, 0, 0: off
    int repeat_last_n;        // the penalties' window (-1: the whole context)
    const char *stops[OPTIONS_MAX_STOPS]; // --stop STR: generation ends before the first occurrence
    int n_stops;
    const char *device;       // --device cpu|gpu|auto
    int gpus;                 // --gpus N: the model split over N GPUs of the host (tensor parallel; 0: one)
    int threads;              // --threads N, or OMP_NUM_THREADS (0: tuned, at most the CPUs we may use)
    int threads_set;          // --threads given (not OMP_NUM_THREADS)
    int bench;                // --bench
    const char *synthetic;    // --synthetic NAME
    const char *quant;        // --quant q8_0|q4_k|q4_0: a synthetic model's matrices
    const char *bench_ctx;    // --bench-ctx 4096,32768
    int bench_steps;
    int bench_prefill;
    float bench_overlap;      // --bench-overlap: ParisKV's locality stream keeps this share of the top-k (0: no such row)
    float bench_returns;      // --bench-returns: and draws this share of the rest from the last steps' dropped slots
    AttnConfig attn;          // --attn --topk --sink --local --update --kv-store --kv-store-dtype
    int attn_set;             // --attn given
    int policy_set;           // --topk, --sink, --local, --update, --kv-store or --kv-store-dtype given: a policy is asked for
    int dense_below;          // --dense-below N (0: not given): attn.dense_min, whatever the method
    int attn_crossover;       // attn.dense_min is the device's crossover (the default policy), set at load
    int steps_set;            // -n given (a chat reply otherwise runs to its end)
    int chat;                 // --chat
    const char *system;       // --system
    const char *date;         // --date: Llama 3.1's "Today Date"
    int think;                // --think 1, --no-think 0, else -1 (the template's default)
    const char *render_chat;  // --render-chat FILE
} Options;

enum { OPTIONS_RUN, OPTIONS_HELP, OPTIONS_VERSION, OPTIONS_ERROR };

// The defaults (seed: a fresh one), then argv in order: OPTIONS_HELP or OPTIONS_VERSION at the first
// -h / --help / --version, OPTIONS_ERROR with err filled at the first bad argument, else
// OPTIONS_RUN.
int options_parse(Options *o, int argc, char **argv, char *err);
// The checks across options that need no model, in the order the runner makes them; 0 or -1 with
// err filled.
int options_check(const Options *o, char *err);
// --help, from the table.
void options_usage(FILE *f);
// An integer in [lo, hi] (flag names it in the message); 0, or -1 with err filled.
int options_parse_long(const char *s, const char *flag, long lo, long hi, long *out, char *err);

#endif
