// A restored session scores what the run that saved it scores, bit for bit (the CPU path): the
// tiny Qwen3 (exported here) prefills a prompt, saves it, and scores a continuation teacher-forced
// (--score's NLL per position, and the logits); a fresh state restored from the file scores the same
// continuation. Also after a second save to the same path killed (SIGKILL, at a pause the saver
// announces by stopping itself) before, during and after its rename: the file must restore one
// of the two runs exactly, the old before the rename and the new after it, never anything else.
// Full attention and ParisKV (its index rebuilt from the restored rows). Needs ./export.
#include "../attention/attention.h"
#include "../model/model.h"
#include "../model/pool.h"
#include "../model/session.h"
#include "test_pariskv_util.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define P 300   // the prompt
#define C 64    // the scored continuation
#define CTX (P + C)
#define CHUNK 16

typedef struct {
    double nll[C - 1];
    float *logits; // (C, vocab)
} Scores;

static AttnPolicy *policy(const Model *m, int method) {
    if (method == ATTN_FULL) return NULL;
    AttnConfig c;
    attn_config_default(&c);
    c.sink = 4, c.local = 32, c.update = 64, c.topk = 16, c.dense_min = 200, c.prefill_len = P;
    char err[ATTN_ERR_LEN];
    AttnPolicy *ap = attn_policy_create(&c, &pool_parallel, (int)m->c.n_layers, (int)m->c.n_heads, (int)m->c.n_kv_heads, (int)m->c.head_dim, CTX, err);
    if (!ap) printf("FAIL policy: %s\n", err);
    return ap;
}

static AttnConfig attn_of(int method) {
    AttnConfig c;
    attn_config_default(&c);
    c.method = method, c.sink = 4, c.local = 32, c.update = 64, c.topk = 16, c.dense_min = 200;
    return c;
}

// Teacher-forced scoring of tokens[P..CTX) from a state holding positions [0, P): run.c's score_row.
static int score(const Model *m, RunState *s, const int *tokens, Scores *out) {
    char err[MODEL_ERR_LEN];
    int V = (int)m->c.vocab_size;
    for (int p = P; p < CTX; p += CHUNK) {
        float *l = model_forward(m, s, tokens + p, CHUNK, p, 1, err);
        if (!l) return printf("FAIL forward: %s\n", err), -1;
        memcpy(out->logits + (size_t)(p - P) * V, l, (size_t)CHUNK * V * sizeof(float));
    }
    for (int t = 0; t < C - 1; t++) {
        const float *l = out->logits + (size_t)t * V;
        float mx = l[0];
        for (int j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
        double sum = 0;
        for (int j = 0; j < V; j++) sum += exp((double)l[j] - mx);
        out->nll[t] = log(sum) + mx - l[tokens[P + t + 1]];
    }
    return 0;
}

// Prefills tokens[0..P) into a fresh state; saves it to path (pause: the stage to stop at in a
// child that the caller kills; NULL: save here); then scores the continuation into out (if any).
static int prefill_save(const Model *m, int method, const int *tokens, const char *path, const char *pause, Scores *out, pid_t *child) {
    RunState s;
    char err[MODEL_ERR_LEN];
    if (run_state_init(&s, m, CTX, CHUNK, 1, err) != 0) return printf("FAIL run state: %s\n", err), -1;
    s.attn = policy(m, method);
    float *l = NULL;
    for (int p = 0; p < P && (l = model_forward(m, &s, tokens + p, CHUNK < P - p ? CHUNK : P - p, p, 1, err)); p += CHUNK) {}
    int rc = l ? 0 : -1;
    int V = (int)m->c.vocab_size, last = (P - 1) % CHUNK;
    AttnConfig a = attn_of(method);
    SessionExtra x = {SESSION_PROMPT, P, s.attn ? attn_policy_fp8_end(s.attn) : 0, l ? l + (size_t)last * V : NULL, NULL, 0};
    char serr[SESSION_ERR_LEN];
    if (rc == 0 && pause) {
        fflush(stdout);
        *child = fork();
        if (*child == 0) { // saves, stopping itself at the stage; killed there by the parent
            setenv("PKV_SESSION_TEST_PAUSE", pause, 1);
            session_save(path, m, &s, &a, tokens, P, &x, serr);
            _exit(0);
        }
        rc = *child < 0 ? -1 : 0;
    } else if (rc == 0 && session_save(path, m, &s, &a, tokens, P, &x, serr) != 0) {
        printf("FAIL save: %s\n", serr);
        rc = -1;
    }
    if (rc == 0 && out) rc = score(m, &s, tokens, out);
    if (s.attn) s.attn->destroy(s.attn);
    run_state_free(&s);
    return rc;
}

// Restores path into a fresh state (as run.c does: read, then the policy resumes) and scores the
// continuation cont[P..CTX); tokens gets the session's prompt, then that continuation.
static int restore_score(const Model *m, int method, const char *path, const int *cont, int *tokens, Scores *out) {
    RunState s;
    char err[MODEL_ERR_LEN], serr[SESSION_ERR_LEN];
    if (run_state_init(&s, m, CTX, CHUNK, 1, err) != 0) return printf("FAIL run state: %s\n", err), -1;
    AttnConfig a = attn_of(method);
    SessionHeader h;
    float *saved = malloc(m->c.vocab_size * sizeof(float));
    void *chat = NULL;
    int rc = saved && session_open(path, m, &a, 0, &h, serr) == 0 && session_read(path, &h, &s, tokens, saved, &chat, serr) == 0 ? 0 : -1;
    if (rc != 0) printf("FAIL restore: %s\n", serr);
    s.attn = policy(m, method);
    if (rc == 0 && s.attn) attn_policy_resume(s.attn, P, h.fp8_end);
    memcpy(tokens + P, cont + P, C * sizeof(int));
    if (rc == 0) rc = score(m, &s, tokens, out);
    if (s.attn) s.attn->destroy(s.attn);
    free(saved), free(chat);
    run_state_free(&s);
    return rc;
}

static int same(const Scores *a, const Scores *b, int V) {
    return memcmp(a->nll, b->nll, sizeof a->nll) == 0 && memcmp(a->logits, b->logits, (size_t)C * V * sizeof(float)) == 0;
}

int main(void) {
    pool_set_threads(1); // no worker threads across the fork
    char dir[] = "/tmp/pkvrestoreXXXXXX", model_path[64], path[64], cmd[4352];
    if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
    snprintf(model_path, sizeof model_path, "%s/tiny.bin", dir);
    snprintf(path, sizeof path, "%s/s.bin", dir);
    const char *bin = getenv("PKV_BIN");
    snprintf(cmd, sizeof cmd, "%s/export tests/data/tiny-qwen3 %s > /dev/null 2>&1", bin ? bin : ".", model_path);
    Model m;
    char err[MODEL_ERR_LEN];
    if (system(cmd) != 0 || model_load(&m, model_path, err) != 0) {
        printf("FAIL cannot export and load tests/data/tiny-qwen3 (is ./export built?)\n0 passed, 1 failed\n");
        return 1;
    }
    int V = (int)m.c.vocab_size, old_tok[CTX], new_tok[CTX], got[CTX];
    Rng r = {11};
    for (int i = 0; i < CTX; i++) old_tok[i] = (int)(next_u64(&r) % (unsigned)V);
    memcpy(new_tok, old_tok, sizeof old_tok);
    for (int i = 0; i < P; i += 7) new_tok[i] = (int)(next_u64(&r) % (unsigned)V); // another prompt, the same continuation
    Scores want_old, want_new, s;
    want_old.logits = malloc((size_t)C * V * sizeof(float)), want_new.logits = malloc((size_t)C * V * sizeof(float));
    s.logits = malloc((size_t)C * V * sizeof(float));
    if (!want_old.logits || !want_new.logits || !s.logits) return printf("FAIL out of memory\n"), 1;
    static const char *stages[] = {"created", "partial", "written", "renamed"};
    for (int method = ATTN_FULL; method <= ATTN_PARISKV; method++) {
        const char *name = method == ATTN_FULL ? "full attention" : "pariskv";
        int ok = prefill_save(&m, method, new_tok, path, NULL, &want_new, NULL) == 0 &&
                 prefill_save(&m, method, old_tok, path, NULL, &want_old, NULL) == 0;
        check(ok && memcmp(want_old.nll, want_new.nll, sizeof s.nll) != 0, "%s: two prompts saved, their continuations scored (and differ)", name);
        if (!ok) continue;
        ok = restore_score(&m, method, path, old_tok, got, &s) == 0;
        check(ok && same(&s, &want_old, V) && memcmp(got, old_tok, P * sizeof(int)) == 0,
              "%s: restored, the continuation's %d NLLs and logits equal the saving run's bit for bit", name, C - 1);
        for (int k = 0; k < 4; k++) {
            int renamed = k == 3;
            pid_t child = -1;
            int st = 0;
            ok = prefill_save(&m, method, new_tok, path, stages[k], NULL, &child) == 0 && waitpid(child, &st, WUNTRACED) == child &&
                 WIFSTOPPED(st) && kill(child, SIGKILL) == 0 && waitpid(child, &st, 0) == child && WIFSIGNALED(st);
            ok = ok && restore_score(&m, method, path, old_tok, got, &s) == 0;
            const Scores *w = renamed ? &want_new : &want_old;
            check(ok && same(&s, w, V) && memcmp(got, renamed ? new_tok : old_tok, P * sizeof(int)) == 0,
                  "%s: a save of another prompt killed at '%s': the file restores the %s session, NLLs bit for bit", name, stages[k],
                  renamed ? "new" : "old");
            if (renamed) prefill_save(&m, method, old_tok, path, NULL, NULL, NULL); // the old one back for the next
            snprintf(cmd, sizeof cmd, "rm -f %s.tmp.*", path); // what SIGKILL left
            if (system(cmd) != 0) printf("note: could not remove %s.tmp.*\n", path);
        }
    }
    free(want_old.logits), free(want_new.logits), free(s.logits);
    model_free(&m);
    unlink(path), unlink(model_path), rmdir(dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
