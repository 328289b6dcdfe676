// Error messages quote names and strings read from files (tensor names, dtypes, architectures).
// err_oneline keeps such a message one line and free of terminal control sequences.
#ifndef ERRMSG_H
#define ERRMSG_H

static inline char *err_oneline(char *s) {
    for (char *c = s; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    return s;
}

#endif
