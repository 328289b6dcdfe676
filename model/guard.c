// Signal handling for mapped inputs and partial outputs (guard.h). The handler only reads the
// tables and calls async-signal-safe functions (stat, unlink, write, _exit, raise).
#include "guard.h"

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_MAPS 256 // a checkpoint's shards; past this a fault is reported without the name
#define PATH_LEN 1024

typedef struct {
    volatile sig_atomic_t used;
    const char *addr;
    size_t len;
    char path[PATH_LEN];
} Mapping;

static Mapping maps[MAX_MAPS];
static char output[PATH_LEN];
static volatile sig_atomic_t have_output;

void guard_map(const void *addr, size_t len, const char *path) {
    for (int i = 0; i < MAX_MAPS; i++)
        if (!maps[i].used) {
            maps[i].addr = addr;
            maps[i].len = len;
            strncpy(maps[i].path, path, PATH_LEN - 1);
            maps[i].used = 1; // last: the handler never sees a half-filled entry
            return;
        }
}

void guard_unmap(const void *addr) {
    for (int i = 0; i < MAX_MAPS; i++)
        if (maps[i].used && maps[i].addr == addr) maps[i].used = 0;
}

void guard_output(const char *path) {
    have_output = 0;
    if (!path) return;
    strncpy(output, path, PATH_LEN - 1);
    have_output = 1;
}

// ---- the handler: a message built without stdio ----

typedef struct {
    char buf[3 * PATH_LEN];
    size_t n;
} Msg;

static void put(Msg *m, const char *s) {
    while (*s && m->n < sizeof m->buf - 1) m->buf[m->n++] = *s++;
}

static void put_u64(Msg *m, uint64_t v) {
    char d[24];
    int k = 0;
    do d[k++] = (char)('0' + v % 10), v /= 10;
    while (v);
    while (k > 0 && m->n < sizeof m->buf - 1) m->buf[m->n++] = d[--k];
}

static void emit(Msg *m) {
    put(m, "\n");
    ssize_t r = write(STDERR_FILENO, m->buf, m->n);
    (void)r;
}

static void remove_output(Msg *m) {
    if (!have_output) return;
    if (unlink(output) == 0) put(m, "; removed the partial '"), put(m, output), put(m, "'");
    have_output = 0;
}

static void on_bus(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < MAX_MAPS; i++) {
        uintptr_t lo = (uintptr_t)maps[i].addr;
        if (!maps[i].used || a < lo || a - lo >= maps[i].len) continue;
        Msg m = {.n = 0};
        struct stat st;
        put(&m, "error: '"), put(&m, maps[i].path), put(&m, "' ");
        if (stat(maps[i].path, &st) != 0) {
            put(&m, "was removed while in use");
        } else {
            put(&m, "changed while in use: "), put_u64(&m, (uint64_t)st.st_size);
            put(&m, " bytes now, "), put_u64(&m, maps[i].len), put(&m, " when it was opened");
        }
        put(&m, " (a file must not be truncated or rewritten while it is read)");
        remove_output(&m);
        emit(&m);
        _exit(1);
    }
    // Not one of our mappings: a real crash, which the default action reports.
    signal(sig, SIG_DFL);
}

static void on_interrupt(int sig) {
    Msg m = {.n = 0};
    put(&m, "error: interrupted");
    remove_output(&m);
    if (m.n > sizeof "error: interrupted" - 1) emit(&m);
    signal(sig, SIG_DFL);
    raise(sig);
}

void guard_install(int interrupts) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_sigaction = on_bus;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGBUS, &sa, NULL);
    if (!interrupts) return;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_interrupt;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

// ---- one guarded write (guard_output_begin / guard_output_end) ----

static const int cut_sigs[3] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction cut_old[3];
static volatile sig_atomic_t cut_armed[3], cut_came;

static void on_cut(int sig) {
    int i = sig == SIGINT ? 0 : sig == SIGTERM ? 1 : 2;
    Msg m = {.n = 0};
    put(&m, "error: interrupted");
    remove_output(&m);
    cut_came = 1;
    // The signal again, to what was there before: the program's handler (Ctrl-C's), which
    // then runs once this returns, or the default end, explained first.
    sigaction(sig, &cut_old[i], NULL);
    cut_armed[i] = 0;
    if (cut_old[i].sa_handler == SIG_DFL && m.n > sizeof "error: interrupted" - 1) emit(&m);
    raise(sig);
}

void guard_output_begin(const char *path) {
    cut_came = 0;
    guard_output(path);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++) sigaddset(&sa.sa_mask, cut_sigs[i]); // one at a time
    sa.sa_handler = on_cut;
    for (int i = 0; i < 3; i++) {
        cut_armed[i] = 0;
        if (sigaction(cut_sigs[i], NULL, &cut_old[i]) != 0 || cut_old[i].sa_handler == SIG_IGN) continue; // nohup's SIGHUP stays ignored
        cut_armed[i] = 1;
        sigaction(cut_sigs[i], &sa, NULL);
    }
}

int guard_output_end(void) {
    for (int i = 0; i < 3; i++)
        if (cut_armed[i]) sigaction(cut_sigs[i], &cut_old[i], NULL), cut_armed[i] = 0;
    guard_output(NULL);
    return cut_came != 0;
}
