// Error messages quote names and strings read from files (tensor names, dtypes, architectures).
// err_oneline keeps such a message one line and free of terminal control sequences.
#ifndef ERRMSG_H
#define ERRMSG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline char *err_oneline(char *s) {
    for (char *c = s; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    return s;
}

// The parsers' error path: formats a one-line message into err (len bytes) and returns -1.
__attribute__((format(printf, 3, 4))) static inline int err_fail(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    err_oneline(err);
    return -1;
}

#endif
