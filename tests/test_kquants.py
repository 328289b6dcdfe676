#!/usr/bin/env python3
"""K-quant import (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and the Q5_0 / Q5_1 that K-quant files of models
with rows of other widths hold) checked against an independent reference: gguf-py's numpy
dequantization (gguf.quants.dequantize, the `gguf` package llama.cpp ships).

A tiny qwen3 GGUF (dim 256, 2 layers, the tiny-qwen3 tokenizer) is written whose every matrix is
a K-quant (or Q5_0 / Q5_1) tensor of random blocks: random bytes for scales and quants, the fp16
d / dmin fields set to finite values of either sign from 2^-20 to 1 (fp16 subnormals included)
and now and then 0. ./export --dtype f32 turns it into model.bin; each matrix read back from there
must equal gguf-py's dequantization bit for bit. Exact equality is what the arithmetic gives, not
luck: in every one of these formats the products are exact in fp32 (fp16 d has 11 significant
bits, a scale's magnitude at most 7, a quant's at most 5: at most 23 of fp32's 24), so the one
rounding is the final add or subtract of the minimum, the same correctly rounded operation in
numpy and in C (FMA contraction or not). The default bf16 export must then hold the
round-to-nearest-even bf16 of those values, and a file cut short inside a K-quant tensor must be
refused.

Needs numpy and gguf (pip); without them it prints SKIP and exits 77. Takes about a second."""
import os
import subprocess
import sys
import tempfile

from modelbin import read_tensors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORT = os.path.join(os.environ.get("PKV_BIN", ROOT), "export")  # PKV_BIN: the sanitizer build
TOK_DIR = os.path.join(ROOT, "tests", "data", "tiny-qwen3")

try:
    import numpy as np
    import gguf
    from gguf import quants
    sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))
    from make_seeds import gguf_writer  # the seed generator writes its GGUF headers the same way
except ImportError as e:
    print(f"SKIP K-quant reference check (python package missing: {e.name}; pip install gguf)")
    print("0 passed, 0 failed")
    sys.exit(77)

passed = failed = 0


def check(ok, what):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if ok:
        passed += 1
    else:
        failed += 1


Q = gguf.GGMLQuantizationType
# (block bytes, offset of the fp16 d, of the fp16 dmin or None) of each type (GGML's block_qN_K).
KTYPES = {
    Q.Q2_K: (84, 80, 82),   # scales[16] qs[64] d dmin
    Q.Q3_K: (110, 108, None),  # hmask[32] qs[64] scales[12] d
    Q.Q4_K: (144, 0, 2),    # d dmin scales[12] qs[128]
    Q.Q5_K: (176, 0, 2),    # d dmin scales[12] qh[32] qs[128]
    Q.Q6_K: (210, 208, None),  # ql[128] qh[64] scales[16] d
}
# Q5_0 / Q5_1 (32-element blocks), which llama.cpp's K-quant presets use for rows that are not
# whole super-blocks (SmolLM2-135M's 576 columns): checked the same way.
LEGACY = {
    Q.Q5_0: (22, 0, None),  # d qh[4] qs[16]
    Q.Q5_1: (24, 0, 2),     # d m qh[4] qs[16]
}
TYPES = {**KTYPES, **LEGACY}
DTYPE_F32, DTYPE_BF16 = 0, 1


def random_fp16(rng, n):
    """n finite fp16 values of random sign and magnitude 2^-20 .. 1 (subnormals included), 1 in 16 zero."""
    v = np.sign(rng.standard_normal(n)) * np.exp2(rng.uniform(-20, 0, n))
    v[rng.random(n) < 1 / 16] = 0.0
    return v.astype(np.float16)


def random_blocks(rng, qtype, rows, cols):
    """Raw bytes (rows, cols / block elements * block size) of random blocks with sane d / dmin fields."""
    size, d_at, dmin_at = TYPES[qtype]
    per = gguf.GGML_QUANT_SIZES[qtype][0]
    assert gguf.GGML_QUANT_SIZES[qtype] == (per, size) and cols % per == 0
    nb = cols // per
    raw = rng.integers(0, 256, (rows, nb, size), dtype=np.uint8)
    for at in (d_at, dmin_at):
        if at is not None:
            raw[:, :, at:at + 2] = random_fp16(rng, rows * nb).view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * size)


def write_gguf(path, rng):
    """A qwen3 GGUF whose matrices cycle through the types. Returns {model.bin name: (qtype, raw)}."""
    dim, heads, kv, hd, hidden, layers = shape = 256, 4, 2, 64, 512, 2
    w, tokens, _template = gguf_writer(path, "qwen3", TOK_DIR, "qwen2", shape, 1e6)
    cycle = list(TYPES)
    quant = {}

    def mat(name, rows, cols):
        qt = cycle[len(quant) % len(cycle)]
        raw = random_blocks(rng, qt, rows, cols)
        quant[name] = (qt, raw)
        w.add_tensor(name + ".weight", raw, raw_dtype=qt)

    def vec(name, n):
        w.add_tensor(name + ".weight", (1 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    mat("token_embd", len(tokens), dim)
    for l in range(layers):
        p = "blk.%d." % l
        vec(p + "attn_norm", dim)
        mat(p + "attn_q", heads * hd, dim)
        mat(p + "attn_k", kv * hd, dim)
        mat(p + "attn_v", kv * hd, dim)
        vec(p + "attn_q_norm", hd)
        vec(p + "attn_k_norm", hd)
        mat(p + "attn_output", dim, heads * hd)
        vec(p + "ffn_norm", dim)
        mat(p + "ffn_gate", hidden, dim)
        mat(p + "ffn_up", hidden, dim)
        mat(p + "ffn_down", dim, hidden)
    vec("output_norm", dim)
    mat("output", len(tokens), dim)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return quant


def read_modelbin(path):
    """{name: (dtype, array of shape (rows, cols) or (n,))} from a model.bin (model/modelfile.h)."""
    out = {}
    for name, (dtype, ndim, r, c, raw) in read_tensors(path)[0].items():
        dt = np.float32 if dtype == DTYPE_F32 else np.uint16
        out[name] = (dtype, np.frombuffer(raw, dtype=dt).reshape((r, c) if ndim == 2 else (r,)))
    return out


def bf16_rne(x):
    """fp32 -> bf16 bits, round to nearest even (finite inputs), as the export writes bf16."""
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def export(src, dst, *extra):
    return subprocess.run([EXPORT, src, dst, *extra], capture_output=True, text=True, timeout=120)


def main():
    rng = np.random.default_rng(13)
    with tempfile.TemporaryDirectory() as tmp:
        gg, f32, bf = (os.path.join(tmp, n) for n in ("k.gguf", "f32.bin", "bf16.bin"))
        quant = write_gguf(gg, rng)
        p = export(gg, f32, "--dtype", "f32")
        check(p.returncode == 0, "export --dtype f32 of a GGUF of K-quant tensors" +
              ("" if p.returncode == 0 else ": exit %d: %s" % (p.returncode, p.stderr.strip()[-300:])))
        if p.returncode != 0:
            return
        ours = read_modelbin(f32)
        refs = {}
        per_type = {qt: [0, 0, 0] for qt in TYPES}  # tensors, elements, elements bit-equal
        for name, (qt, raw) in quant.items():
            ref = quants.dequantize(raw, qt).astype(np.float32)
            refs[name] = ref
            dtype, got = ours.get(name, (None, None))
            ok = dtype == DTYPE_F32 and got is not None and got.shape == ref.shape
            same = int(np.count_nonzero(got.view(np.uint32) == ref.view(np.uint32))) if ok else 0
            t = per_type[qt]
            t[0], t[1], t[2] = t[0] + 1, t[1] + ref.size, t[2] + same
            if not ok or same != ref.size:
                diff = float(np.max(np.abs(got.astype(np.float64) - ref))) if ok else float("nan")
                check(False, "%s (%s %s): %d of %d values differ from gguf-py's, max |diff| %g" %
                      (name, qt.name, "x".join(map(str, ref.shape)), ref.size - same, ref.size, diff))
        for qt, (nt, ne, eq) in per_type.items():
            check(nt > 0 and ne == eq, "%s: %d tensors, %d values, all bit-equal to gguf.quants.dequantize"
                  % (qt.name, nt, ne) if ne == eq else "%s: %d of %d values bit-equal" % (qt.name, eq, ne))
        # Sanity of the random data itself: the comparison saw negative, positive and subnormal-d values.
        allv = np.concatenate([r.ravel() for r in refs.values()])
        check(np.all(np.isfinite(allv)) and (allv < 0).any() and (allv > 0).any() and
              (np.abs(allv[allv != 0]) < 2.0 ** -14).any(), "reference values are finite, of both signs, some tiny")

        p = export(gg, bf)
        ok = p.returncode == 0
        if ok:
            got = read_modelbin(bf)
            bad = [n for n, r in refs.items() if got[n][0] != DTYPE_BF16 or not np.array_equal(got[n][1], bf16_rne(r))]
            ok = not bad
        check(ok, "default bf16 export holds the round-to-nearest-even bf16 of the same values" +
              ("" if ok else ": " + (p.stderr.strip()[-300:] if p.returncode else "differs in " + ", ".join(bad[:4]))))

        # A file cut inside the last (K-quant) tensor is refused as truncated, no file left behind.
        cut = os.path.join(tmp, "cut.gguf")
        data = open(gg, "rb").read()
        open(cut, "wb").write(data[:len(data) - 100])
        out = os.path.join(tmp, "cut.bin")
        p = export(cut, out)
        check(p.returncode == 1 and "truncated" in p.stderr and not os.path.exists(out),
              "GGUF cut short inside a K-quant tensor is refused (exit %d: %s)" % (p.returncode, p.stderr.strip()[-160:]))


if __name__ == "__main__":
    main()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
