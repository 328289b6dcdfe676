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

// ---- K-quants. Each check packs known quants, scales and minimums into a super-block with a
// packer written from GGML's layout (the inverse of what the reader does), dequantizes it and
// expects d * scale * q - dmin * min exactly: every product is exact in fp32.

// A quant for element i of a type with quants in [lo, lo + n): varies within and across sub-blocks.
static int qpat(int i, int lo, int n) { return lo + (i * 7 + i / 16 * 3 + 1) % n; }

static void kquant_checks(void) {
    static float out[256];
    static uint8_t b[256];
    int ok;
    const float d = 0.5f, dmin = 0.125f; // fp16 0x3800 and 0x3000

    // Q2_K: scales[16] = scale | min << 4; element 128h + 32j + l in bits 2j of qs[32h + l].
    memset(b, 0, sizeof b);
    for (int s = 0; s < 16; s++) b[s] = (uint8_t)(s | (15 - s) << 4);
    for (int i = 0; i < 256; i++) b[16 + 32 * (i / 128) + i % 32] |= (uint8_t)(qpat(i, 0, 4) << (2 * ((i / 32) % 4)));
    put16(b + 80, 0x3800), put16(b + 82, 0x3000);
    ok = dequant(GGML_Q2_K, b, 256, out) == 0;
    for (int i = 0; i < 256; i++) ok &= out[i] == d * (float)(i / 16) * (float)qpat(i, 0, 4) - dmin * (float)(15 - i / 16);
    check(ok, "Q2_K block (4-bit scales and mins, 2-bit quants)");

    // Q3_K: quant q in [-4, 4) is 2 low bits (q & 3, placed as Q2_K's) plus a high bit in hmask
    // (bit i / 32 of hmask[i % 32]) that is set when q >= 0; 6-bit scales s - 32 packed as GGML's.
    memset(b, 0, sizeof b);
    int sc3[16];
    for (int s = 0; s < 16; s++) sc3[s] = (s * 13 + 7) % 64 - 32; // -32..31, both nibbles and high bits used
    for (int i = 0; i < 256; i++) {
        int q = qpat(i, -4, 8);
        b[32 + 32 * (i / 128) + i % 32] |= (uint8_t)((q & 3) << (2 * ((i / 32) % 4)));
        if (q >= 0) b[i % 32] |= (uint8_t)(1 << (i / 32));
    }
    for (int s = 0; s < 16; s++) {
        int u = sc3[s] + 32;
        b[96 + s % 8] |= (uint8_t)((u & 15) << (s < 8 ? 0 : 4));
        b[96 + 8 + s % 4] |= (uint8_t)((u >> 4) << (2 * (s / 4)));
    }
    put16(b + 108, 0x3800);
    ok = dequant(GGML_Q3_K, b, 256, out) == 0;
    for (int i = 0; i < 256; i++) ok &= out[i] == d * (float)sc3[i / 16] * (float)qpat(i, -4, 8);
    check(ok, "Q3_K block (packed 6-bit scales, hmask high bits)");

    // Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scale and min: sub-block j < 4 in the low 6 bits
    // of bytes j (scale) and j + 4 (min); j >= 4 in byte j + 4 (scale low nibble, min high) with
    // the top 2 bits in the top of bytes j - 4 (scale) and j (min).
    int sc4[8], mn4[8];
    for (int j = 0; j < 8; j++) sc4[j] = (j * 23 + 5) % 64, mn4[j] = (j * 41 + 60) % 64;
    for (int t5 = 0; t5 < 2; t5++) {
        memset(b, 0, sizeof b);
        put16(b, 0x3800), put16(b + 2, 0x3000);
        uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (t5 ? 48 : 16);
        for (int j = 0; j < 4; j++) {
            sc[j] = (uint8_t)(sc4[j] | (sc4[j + 4] >> 4) << 6);
            sc[j + 4] = (uint8_t)(mn4[j] | (mn4[j + 4] >> 4) << 6);
            sc[j + 8] = (uint8_t)((sc4[j + 4] & 15) | (mn4[j + 4] & 15) << 4);
        }
        // Sub-block j: nibble j % 2 of qs[32 (j / 2) + l]; Q5_K's fifth bit is bit j of qh[l].
        for (int i = 0; i < 256; i++) {
            int q = qpat(i, 0, t5 ? 32 : 16), j = i / 32;
            qs[32 * (j / 2) + i % 32] |= (uint8_t)((q & 15) << (4 * (j % 2)));
            if (t5) qh[i % 32] |= (uint8_t)((q >> 4) << j);
        }
        ok = dequant(t5 ? GGML_Q5_K : GGML_Q4_K, b, 256, out) == 0;
        for (int i = 0; i < 256; i++)
            ok &= out[i] == d * (float)sc4[i / 32] * (float)qpat(i, 0, t5 ? 32 : 16) - dmin * (float)mn4[i / 32];
        check(ok, t5 ? "Q5_K block (scale/min packing, fifth bit in qh)" : "Q4_K block (6-bit scale/min packing)");
    }

    // Q6_K: q + 32 in [0, 64): low nibble in ql, high 2 bits in qh; element 128h + 32k + l uses
    // nibble k / 2 of ql[64h + 32 (k % 2) + l] and bits 2k of qh[32h + l]; int8 scale per 16.
    memset(b, 0, sizeof b);
    int sc6[16];
    for (int s = 0; s < 16; s++) sc6[s] = s == 0 ? -128 : s == 1 ? 127 : (s * 37) % 256 - 128;
    for (int i = 0; i < 256; i++) {
        int u = qpat(i, -32, 64) + 32, h = i / 128, k = (i % 128) / 32, l = i % 32;
        b[64 * h + 32 * (k % 2) + l] |= (uint8_t)((u & 15) << (4 * (k / 2)));
        b[128 + 32 * h + l] |= (uint8_t)((u >> 4) << (2 * k));
    }
    for (int s = 0; s < 16; s++) b[192 + s] = (uint8_t)(int8_t)sc6[s];
    put16(b + 208, 0x3800);
    ok = dequant(GGML_Q6_K, b, 256, out) == 0;
    for (int i = 0; i < 256; i++) ok &= out[i] == d * (float)sc6[i / 16] * (float)qpat(i, -32, 64);
    check(ok, "Q6_K block (ql/qh split, int8 scales)");

    // Literal values: a Q6_K block of zero bytes but d = 1 and scale[s] = s holds -32 s; a
    // Q4_K block of 0xff bytes but d = 1, dmin = 2 holds 63 * 15 - 2 * 63 = 819 everywhere.
    memset(b, 0, sizeof b);
    for (int s = 0; s < 16; s++) b[192 + s] = (uint8_t)s;
    put16(b + 208, 0x3c00);
    ok = dequant(GGML_Q6_K, b, 256, out) == 0;
    for (int i = 0; i < 256; i++) ok &= out[i] == -32.0f * (float)(i / 16);
    check(ok, "Q6_K literal block (-32 * scale)");
    memset(b, 0xff, sizeof b);
    put16(b, 0x3c00), put16(b + 2, 0x4000);
    ok = dequant(GGML_Q4_K, b, 256, out) == 0;
    for (int i = 0; i < 256; i++) ok &= out[i] == 819.0f;
    check(ok, "Q4_K literal block (all bits set)");
}

// A GGUF file of one 1-D tensor [ne0] of the given type whose data holds data_bytes bytes.
static int write_one_tensor(const char *path, uint32_t type, uint64_t ne0, uint64_t data_bytes) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint32_t version = 3, ndim = 1;
    uint64_t n_tensors = 1, n_kv = 0, name_len = 1, offset = 0;
    fwrite("GGUF", 1, 4, f), fwrite(&version, 4, 1, f), fwrite(&n_tensors, 8, 1, f), fwrite(&n_kv, 8, 1, f);
    fwrite(&name_len, 8, 1, f), fwrite("w", 1, 1, f), fwrite(&ndim, 4, 1, f), fwrite(&ne0, 8, 1, f);
    fwrite(&type, 4, 1, f), fwrite(&offset, 8, 1, f);
    long pos = ftell(f);
    for (long i = pos; i < (pos + 31) / 32 * 32; i++) fputc(0, f); // data starts 32-aligned
    for (uint64_t i = 0; i < data_bytes; i++) fputc((int)(i * 29 % 251), f);
    return fclose(f);
}

// The reader's size checks on K-quant tensors: whole super-blocks, the data inside the file.
static void kquant_file_checks(void) {
    static const struct { uint32_t type; uint64_t bytes; const char *name; } kt[] = {
        {GGML_Q2_K, 84, "Q2_K"}, {GGML_Q3_K, 110, "Q3_K"}, {GGML_Q4_K, 144, "Q4_K"},
        {GGML_Q5_K, 176, "Q5_K"}, {GGML_Q6_K, 210, "Q6_K"}};
    char path[] = "/tmp/test_gguf_k_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        check(0, "cannot make a temporary file");
        return;
    }
    close(fd);
    static float out[512];
    char err[GGUF_ERR_LEN], what[128];
    GgufFile g;
    for (int k = 0; k < 5; k++) {
        int ok = write_one_tensor(path, kt[k].type, 512, 2 * kt[k].bytes) == 0 && gguf_open(&g, path, err) == 0;
        if (ok) {
            ok = g.tensors[0].nbytes == 2 * kt[k].bytes && gguf_dequantize(&g.tensors[0], out, err) == 0;
            gguf_close(&g);
        }
        snprintf(what, sizeof what, "%s tensor of 2 super-blocks (%llu bytes) opens and dequantizes", kt[k].name,
                 (unsigned long long)(2 * kt[k].bytes));
        check(ok, what);
        ok = write_one_tensor(path, kt[k].type, 512, 2 * kt[k].bytes - 1) == 0 && gguf_open(&g, path, err) != 0 &&
             strstr(err, "truncated");
        snprintf(what, sizeof what, "%s tensor one byte short of its data is refused", kt[k].name);
        check(ok, what);
        ok = write_one_tensor(path, kt[k].type, 384, 2 * kt[k].bytes) == 0 && gguf_open(&g, path, err) != 0 &&
             strstr(err, "whole number of blocks");
        snprintf(what, sizeof what, "%s row of 384 (not whole super-blocks) is refused", kt[k].name);
        check(ok, what);
    }
    unlink(path);
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

    // Q5_0: scale 0.5, qh (little-endian) bit j is element j's fifth bit; value (q - 16) d.
    // Q5_1: scale 0.25, minimum -2.0, qh and nibbles after them; value q d + m.
    for (int t1 = 0; t1 < 2; t1++) {
        memset(blk, 0, sizeof blk);
        int at = t1 ? 4 : 2; // qh
        put16(blk, t1 ? 0x3400 : 0x3800);
        if (t1) put16(blk + 2, 0xc000);
        int q5[32];
        for (int j = 0; j < 32; j++) {
            q5[j] = (j * 11 + 3) % 32;
            blk[at + j / 8] |= (uint8_t)((q5[j] >> 4) << (j % 8));
            blk[at + 4 + j % 16] |= (uint8_t)((q5[j] & 15) << (j < 16 ? 0 : 4));
        }
        ok = dequant(t1 ? GGML_Q5_1 : GGML_Q5_0, blk, 32, out) == 0;
        for (int j = 0; j < 32; j++)
            ok &= out[j] == (t1 ? 0.25f * (float)q5[j] - 2.0f : 0.5f * (float)(q5[j] - 16));
        check(ok, t1 ? "Q5_1 block (fifth bits, scale and minimum)" : "Q5_0 block (fifth bits in qh)");
    }

    check(dequant(16 /* IQ2_XXS */, blk, 256, out) != 0, "unsupported type is refused");

    kquant_checks();
    kquant_file_checks();

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
