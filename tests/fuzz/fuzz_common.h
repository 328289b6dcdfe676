// Shared by the fuzz harnesses. The parsers read files by path (they map them), so a harness
// puts its input in a memfd and passes "/proc/self/fd/N", or writes it into a private directory.
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef REPO_ROOT
#define REPO_ROOT "."
#endif

// Exactly data[0..size) in a reused memfd; returns its path. The memfd can be made longer (sparse
// zeros) with fuzz_memfd_extend.
static int fuzz_fd = -1;
static inline const char *fuzz_memfd(const uint8_t *data, size_t size) {
    static char path[64];
    if (fuzz_fd < 0 && (fuzz_fd = memfd_create("fuzz", MFD_CLOEXEC)) < 0) abort();
    if (ftruncate(fuzz_fd, 0) != 0 || pwrite(fuzz_fd, data, size, 0) != (ssize_t)size) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fuzz_fd);
    return path;
}
static inline void fuzz_memfd_extend(size_t size) {
    if (ftruncate(fuzz_fd, (off_t)size) != 0) abort();
}

static inline void fuzz_write(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

// Copies from_dir/name to to_dir/name.
static inline void fuzz_copy(const char *from_dir, const char *to_dir, const char *name) {
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/%s", from_dir, name);
    snprintf(to, sizeof to, "%s/%s", to_dir, name);
    FILE *f = fopen(from, "rb");
    char *buf = NULL;
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
        buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        perror(from);
        abort();
    }
    fclose(f);
    fuzz_write(to, buf, (size_t)n);
    free(buf);
}

// A fresh private directory (on /dev/shm when there is one: every execution rewrites files).
static inline char *fuzz_tmpdir(void) {
    char tpl[] = "/dev/shm/pkv-fuzz-XXXXXX", tpl2[] = "/tmp/pkv-fuzz-XXXXXX";
    char *d = mkdtemp(tpl);
    if (!d) d = mkdtemp(tpl2);
    if (!d) abort();
    return strdup(d);
}

// Removes the files of a directory made by fuzz_tmpdir, then the directory.
static inline void fuzz_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", dir, e->d_name), unlink(p);
    closedir(d);
    rmdir(dir);
}

// An error message must be one non-empty line.
static inline void fuzz_check_err(const char *err) {
    if (!err[0] || strchr(err, '\n')) {
        fprintf(stderr, "bad error message: '%s'\n", err);
        abort();
    }
}

#endif
