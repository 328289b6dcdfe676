// UTF-8 scanning with the replacement rules of Rust's String::from_utf8_lossy, which is what
// Hugging Face's ByteLevel decoder uses, so decoded text matches it byte for byte.
#include <string.h>

#include "tok_internal.h"
#include "tokenizer.h"

int utf8_scan(const uint8_t *s, size_t n, size_t *len, int32_t *cp) {
    uint8_t b = s[0];
    if (b < 0x80) {
        *len = 1;
        *cp = b;
        return UTF8_VALID;
    }
    int need;            // continuation bytes still to come
    uint8_t lo = 0x80, hi = 0xBF; // allowed range of the second byte (excludes overlongs, surrogates)
    int32_t c;
    if (b >= 0xC2 && b <= 0xDF) { need = 1; c = b & 0x1F; }
    else if (b >= 0xE0 && b <= 0xEF) {
        need = 2; c = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3; c = b & 0x07;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        *len = 1;
        return UTF8_INVALID;
    }
    size_t i = 1;
    for (; need > 0; need--, i++) {
        if (i >= n) {
            *len = i;
            return UTF8_INCOMPLETE;
        }
        uint8_t x = s[i];
        if (x < lo || x > hi) {
            *len = i;
            return UTF8_INVALID;
        }
        lo = 0x80; hi = 0xBF;
        c = (c << 6) | (x & 0x3F);
    }
    *len = i;
    *cp = c;
    return UTF8_VALID;
}

size_t utf8_lossy(const uint8_t *s, size_t n, uint8_t *out) {
    static const uint8_t fffd[3] = {0xEF, 0xBF, 0xBD};
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        int32_t cp;
        if (utf8_scan(s + i, n - i, &len, &cp) == UTF8_VALID) {
            memcpy(out + o, s + i, len);
            o += len;
        } else {
            memcpy(out + o, fffd, 3);
            o += 3;
        }
        i += len;
    }
    return o;
}

long tokenizer_utf8_invalid_at(const char *text, size_t len) {
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < len;) {
        size_t n;
        int32_t cp;
        if (utf8_scan(s + i, len - i, &n, &cp) != UTF8_VALID) return (long)i;
        i += n;
    }
    return -1;
}
