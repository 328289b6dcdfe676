// GPT-2's bytes_to_unicode: byte-level vocabularies write each byte as a printable code point
// (printable Latin-1 bytes as themselves, the other 68 as U+0100..U+0143 in byte order).
#include "tok_internal.h"

static int printable(unsigned b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

// Byte written as code point c, -1 for code points outside the mapping.
static int unmap_char(uint32_t c) {
    if (c < 256) return printable(c) ? (int)c : -1;
    if (c >= 256 + 68) return -1;
    unsigned k = c - 256;
    for (unsigned x = 0; x < 256; x++)
        if (!printable(x) && k-- == 0) return (int)x;
    return -1;
}

long bytelevel_unmap(const char *s, size_t n, uint8_t *out) {
    const uint8_t *u = (const uint8_t *)s;
    long o = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        int32_t cp;
        if (utf8_scan(u + i, n - i, &len, &cp) != UTF8_VALID) return -1;
        int b = unmap_char((uint32_t)cp);
        if (b < 0) return -1;
        out[o++] = (uint8_t)b;
        i += len;
    }
    return o;
}
