// GGUF dequantization on hand-built blocks whose values are known exactly, and the reader's
// rejection of damaged files.
#include "../weights/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int passed, failed;

static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ok ? passed++ : failed++;
}

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }

static int dequant(uint32_t type, const uint8_t *data, uint64_t n, float *out) {
    GgufTensor t = {.name = "t", .type = type, .ndim = 1, .ne = {n, 1, 1, 1}, .n_elems = n, .data = data};
    char err[GGUF_ERR_LEN];
    return gguf_dequantize(&t, out, err);
}

int main(void) {
    float out[64];
    uint8_t blk[64];

    // F16: 1.0 = 0x3c00, -2.5 = 0xc100, smallest subnormal 0x0001 = 2^-24, +inf 0x7c00.
    put16(blk, 0x3c00), put16(blk + 2, 0xc100), put16(blk + 4, 0x0001), put16(blk + 6, 0x7c00);
    dequant(GGML_F16, blk, 4, out);
    check(out[0] == 1.0f && out[1] == -2.5f && out[2] == ldexpf(1.0f, -24) && isinf(out[3]), "F16 values incl. subnormal and inf");

    // BF16: 0x3f80 = 1.0, 0xc040 = -3.0
    put16(blk, 0x3f80), put16(blk + 2, 0xc040);
    dequant(GGML_BF16, blk, 2, out);
    check(out[0] == 1.0f && out[1] == -3.0f, "BF16 values");

    // Q8_0: scale 0.5, quants -128..127 pattern.
    put16(blk, 0x3800); // 0.5
    for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    dequant(GGML_Q8_0, blk, 32, out);
    int ok = 1;
    for (int j = 0; j < 32; j++) ok &= out[j] == 0.5f * (float)(j * 8 - 128);
    check(ok, "Q8_0 block");

    // Q4_0: scale 2.0, byte j holds element j (low nibble) and element j+16 (high nibble); value (q-8)*d.
    put16(blk, 0x4000); // 2.0
    for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)((j & 15) | ((15 - j) << 4));
    dequant(GGML_Q4_0, blk, 32, out);
    ok = 1;
    for (int j = 0; j < 16; j++) ok &= out[j] == 2.0f * (float)(j - 8) && out[j + 16] == 2.0f * (float)(15 - j - 8);
    check(ok, "Q4_0 block (nibble order)");

    // Q4_1: scale 0.25, minimum -1.0; value q*d + m.
    put16(blk, 0x3400), put16(blk + 2, 0xbc00);
    for (int j = 0; j < 16; j++) blk[4 + j] = (uint8_t)((j & 15) | ((j ^ 5) << 4));
    dequant(GGML_Q4_1, blk, 32, out);
    ok = 1;
    for (int j = 0; j < 16; j++) ok &= out[j] == 0.25f * (float)j - 1.0f && out[j + 16] == 0.25f * (float)(j ^ 5) - 1.0f;
    check(ok, "Q4_1 block (scale and minimum)");

    check(dequant(14 /* Q6_K */, blk, 256, out) != 0, "unsupported type is refused");

    // Damaged files: each must be refused with an error, not read past its end.
    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return perror("mkstemp"), printf("FAIL cannot make a temporary file\n0 passed, 1 failed\n"), 1;
    uint8_t hdr[24] = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    uint64_t n_tensors = 0, n_kv = 1;
    memcpy(hdr + 8, &n_tensors, 8), memcpy(hdr + 16, &n_kv, 8);
    // key length 2^48; 16 bytes, so the file is large enough for its one entry and the key is what is wrong
    uint8_t kv[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 'a', 'b', 'c', 'd'};
    if (write(fd, hdr, 24) != 24 || write(fd, kv, 16) != 16) return printf("FAIL cannot write %s\n0 passed, 1 failed\n", path), 1;
    close(fd);
    GgufFile g;
    char err[GGUF_ERR_LEN];
    check(gguf_open(&g, path, err) != 0 && strstr(err, "malformed"), "key length past the end is refused");
    int cut = truncate(path, 10);
    check(cut == 0 && gguf_open(&g, path, err) != 0, "10-byte file is refused (and truncate made it)");
    unlink(path);

    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
