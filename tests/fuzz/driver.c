// Runs a fuzz harness over files, without libFuzzer: how the corpora and the regression inputs
// (tests/fuzz/{corpus,regressions}/NAME/) run in `make test` and the sanitizer build, with any
// compiler. Usage: fuzz_NAME FILE_OR_DIR... ; exits non-zero (abort) on the first failure.
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);
__attribute__((weak)) void __sanitizer_set_death_callback(void (*callback)(void));

// Which input failed: named by a sanitizer's death callback or on abort().
static const char *current;
static void name_input(void) {
    if (current) fprintf(stderr, "failing input: %s\n", current);
}
static void on_abort(int sig) {
    (void)sig;
    name_input();
    signal(SIGABRT, SIG_DFL);
    abort();
}

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += k;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) return -1;
    // An exact-size copy, so ASan sees a read past the input's end.
    uint8_t *in = malloc(n ? n : 1);
    if (!in) return -1;
    memcpy(in, buf, n);
    free(buf);
    current = path;
    LLVMFuzzerTestOneInput(in, n);
    current = NULL;
    free(in);
    return 0;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(name_input);
    signal(SIGABRT, on_abort);
    int n = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i]) != 0) return 1;
            n++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        char **names = NULL;
        size_t k = 0;
        for (struct dirent *e; d && (e = readdir(d));)
            if (e->d_name[0] != '.' && (names = realloc(names, (k + 1) * sizeof *names))) names[k++] = strdup(e->d_name);
        if (d) closedir(d);
        if (names) qsort(names, k, sizeof *names, cmp); // a fixed order: reproducible runs
        for (size_t j = 0; j < k; j++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], names[j]);
            if (run_file(p) != 0) return 1;
            n++;
            free(names[j]);
        }
        free(names);
    }
    fprintf(stderr, "%d inputs ran cleanly\n", n); // stderr: a harness may silence stdout
    return 0;
}
