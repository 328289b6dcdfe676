#!/usr/bin/env python3
"""Quantized weights (issue 14) against an independent reference: gguf-py (`gguf`, the package
llama.cpp ships), which quantizes Q8_0 as GGML's reference C does and dequantizes every type.

1. --quant q8_0: a tiny qwen3 GGUF (dim 256, 2 layers, the tiny-qwen3 tokenizer) of random f32
   matrices (rows of several magnitudes, fp16-subnormal scales, all-zero blocks, outliers) is
   exported; every Q8_0 block in model.bin must equal gguf.quants.quantize(x, Q8_0) byte for
   byte. Exactness is what the arithmetic gives: amax / 127, its reciprocal, x * id and the fp16
   and integer roundings are each one correctly rounded IEEE operation in numpy and in C.
2. --quant q4_k: the matrices whose rows are whole 256-weight super-blocks become Q4_K, the
   embedding / head Q8_0. gguf-py has no Q4_K quantizer, so the blocks are compared byte for byte
   with GGML's quantize_row_q4_K_ref written again below in numpy float32 (each operation one
   IEEE rounding, sums in GGML's order, no fused multiply-add), and gguf-py's dequantization of
   our blocks must lie within half a quantization step of the source wherever the level is not
   clamped (and 0.1 of the rows' rms overall).
3. --dtype keep: a llama GGUF of random Q8_0, Q4_K, Q4_0 and Q6_K blocks (Q4_0 by gguf-py's
   quantizer, Q6_K random bytes with a small scale) keeps them byte for byte (Q and K rows un-permuted as whole rows of blocks);
   so does one of Q4_1, Q5_0, Q5_1 (gguf-py's quantizers) and Q5_K (random bytes, small scales).
4. The CPU path on those blocks: ./run --score of the kept model equals the --dtype f32 export of
   the same GGUF (the same weight values, multiplied block by block instead of from fp32 rows)
   within 2e-4 per position: both are fp32 evaluations of one function in different summation
   orders, each within about 1e-5 of exact here (test_hf_reference.py measures that spread on
   models of this size), so 2e-4 leaves a margin of ten.

Needs numpy and gguf (pip); without them it prints SKIP and exits 77. Takes a few seconds."""
import os
import subprocess
import sys
import tempfile

from modelbin import read_tensors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PKV_BIN", ROOT)  # PKV_BIN: the sanitizer build
EXPORT, RUN = os.path.join(BIN, "export"), os.path.join(BIN, "run")
DATA = os.path.join(ROOT, "tests", "data")

try:
    import numpy as np
    import gguf
    from gguf import quants
    sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))
    from make_seeds import gguf_writer
except ImportError as e:
    print(f"SKIP quantized-weight reference check (python package missing: {e.name}; pip install gguf)")
    print("0 passed, 0 failed")
    sys.exit(77)

passed = failed = 0
Q = gguf.GGMLQuantizationType
DTYPE_F32, DTYPE_BF16, DTYPE_Q8_0, DTYPE_Q4_K, DTYPE_Q4_0, DTYPE_Q6_K = 0, 1, 2, 3, 4, 5
DTYPE_Q4_1, DTYPE_Q5_0, DTYPE_Q5_1, DTYPE_Q5_K = 6, 7, 8, 9
ROW_BYTES = {DTYPE_F32: lambda c: 4 * c, DTYPE_BF16: lambda c: 2 * c, DTYPE_Q8_0: lambda c: c // 32 * 34,
             DTYPE_Q4_K: lambda c: c // 256 * 144, DTYPE_Q4_0: lambda c: c // 32 * 18, DTYPE_Q6_K: lambda c: c // 256 * 210,
             DTYPE_Q4_1: lambda c: c // 32 * 20, DTYPE_Q5_0: lambda c: c // 32 * 22, DTYPE_Q5_1: lambda c: c // 32 * 24,
             DTYPE_Q5_K: lambda c: c // 256 * 176}
KEPT = {Q.Q8_0: DTYPE_Q8_0, Q.Q4_K: DTYPE_Q4_K, Q.Q4_0: DTYPE_Q4_0, Q.Q6_K: DTYPE_Q6_K,
        Q.Q4_1: DTYPE_Q4_1, Q.Q5_0: DTYPE_Q5_0, Q.Q5_1: DTYPE_Q5_1, Q.Q5_K: DTYPE_Q5_K}
# Which blocks each matrix of the keep GGUFs holds: kind 0 Q8_0 / Q4_K, kind 1 with Q4_0 and Q6_K,
# kind 2 the types kept since issue 28 (Q4_1 and Q5_0 are what SmolLM2's Q4_1 and Q4_K_M files hold).
KINDS = [{"attn_k": Q.Q8_0, "attn_output": Q.Q8_0, "ffn_down": Q.Q4_K, "ffn_up": Q.Q8_0, "attn_v": Q.Q4_K},
         {"attn_k": Q.Q4_0, "attn_output": Q.Q4_0, "ffn_down": Q.Q6_K, "ffn_up": Q.Q8_0, "attn_v": Q.Q4_K},
         {"attn_k": Q.Q4_1, "attn_output": Q.Q5_0, "ffn_down": Q.Q5_K, "ffn_up": Q.Q5_1, "attn_v": Q.Q4_1}]
f32 = np.float32


def check(ok, what):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    passed, failed = passed + bool(ok), failed + (not ok)


def read_modelbin(path):
    """{name: (dtype, rows, cols, raw bytes)} and the format version of a model.bin."""
    tensors, version = read_tensors(path)
    return {k: (d, r, c, raw) for k, (d, _, r, c, raw) in tensors.items()}, version


def export(src, dst, *extra):
    p = subprocess.run([EXPORT, src, dst, *extra], capture_output=True, text=True, timeout=300)
    p.last = (p.stderr.strip().splitlines() or [""])[-1]  # its closing line, or the error
    return p


# ---- GGML's quantize_row_q4_K_ref in numpy float32, vectorized over sub-blocks ----

def rint(v):
    v = np.where(np.isfinite(v), v, 0)  # rows where GGML divides by zero are discarded below
    return np.rint(v).astype(np.int64)  # ties to even, as GGML's nearest_int


def fit_sub_blocks(x, w):
    """make_qkx2_quants(32, 15, x, w, L, &min, Laux, -1, 0.1, 20, false) for each row of x (N, 32)."""
    mn, mx, sum_w = x[:, 0].copy(), x[:, 0].copy(), w[:, 0].copy()
    sum_x = sum_w * x[:, 0]
    for i in range(1, 32):
        mn, mx = np.minimum(mn, x[:, i]), np.maximum(mx, x[:, i])
        sum_w = sum_w + w[:, i]
        sum_x = sum_x + w[:, i] * x[:, i]
    mn = np.where(mn > 0, f32(0), mn)
    flat = mx == mn
    rng = np.where(flat, f32(1), mx - mn)
    iscale = f32(15) / rng
    scale = f32(1) / iscale
    L = np.clip(rint(iscale[:, None] * (x - mn[:, None])), 0, 15)
    best = np.zeros_like(mn)
    for i in range(32):
        diff = scale * L[:, i].astype(f32) + mn - x[:, i]
        best = best + w[:, i] * (diff * diff)
    for step in range(21):  # a better fit's min moves the range the later steps divide
        rng = np.where(flat, f32(1), mx - mn)
        iscale = (f32(-1) + f32(0.1) * f32(step) + f32(15)) / rng
        laux = np.clip(rint(iscale[:, None] * (x - mn[:, None])), 0, 15)
        lf = laux.astype(f32)
        sum_l = sum_l2 = sum_xl = np.zeros_like(mn)
        for i in range(32):
            wl = w[:, i] * lf[:, i]
            sum_l, sum_l2, sum_xl = sum_l + wl, sum_l2 + wl * lf[:, i], sum_xl + wl * x[:, i]
        D = sum_w * sum_l2 - sum_l * sum_l
        with np.errstate(divide="ignore", invalid="ignore"):
            t_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            t_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = t_min > 0
            t_scale = np.where(pos, sum_xl / sum_l2, t_scale)
        t_min = np.where(pos, f32(0), t_min)
        err = np.zeros_like(mn)
        for i in range(32):
            diff = t_scale * lf[:, i] + t_min - x[:, i]
            err = err + w[:, i] * (diff * diff)
        take = (D > 0) & (err < best)
        L[take], best[take], scale[take], mn[take] = laux[take], err[take], t_scale[take], t_min[take]
    L[flat], scale[flat] = 0, f32(0)
    return scale, -mn, L


def quantize_q4_k(x):
    """(rows, cols) float32 -> (rows, cols / 256 * 144) uint8, GGML's quantize_row_q4_K_ref."""
    rows, cols = x.shape
    sb = x.reshape(-1, 8, 32)
    nb = sb.shape[0]
    sum_x2 = np.zeros((nb, 8), f32)
    for l in range(32):
        sum_x2 = sum_x2 + sb[:, :, l] * sb[:, :, l]
    av_x = np.sqrt(sum_x2 / f32(32))
    w = av_x[:, :, None] + np.abs(sb)
    scales, mins, L = fit_sub_blocks(sb.reshape(-1, 32), w.reshape(-1, 32))
    scales, mins, L = scales.reshape(nb, 8), mins.reshape(nb, 8), L.reshape(nb, 8, 32)
    max_scale = np.maximum(np.max(scales, axis=1), f32(0))
    max_min = np.maximum(np.max(mins, axis=1), f32(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, f32(63) / max_scale, f32(0))
        inv_min = np.where(max_min > 0, f32(63) / max_min, f32(0))
    ls = np.minimum(rint(inv_scale[:, None] * scales) & 255, 63)
    lm = np.minimum(rint(inv_min[:, None] * mins) & 255, 63)
    sc = np.zeros((nb, 12), np.int64)
    sc[:, 0:4], sc[:, 4:8] = ls[:, :4], lm[:, :4]
    sc[:, 8:12] = (ls[:, 4:] & 15) | (lm[:, 4:] & 15) << 4
    sc[:, 0:4] |= (ls[:, 4:] >> 4) << 6
    sc[:, 4:8] |= (lm[:, 4:] >> 4) << 6
    d16, dmin16 = (max_scale / f32(63)).astype(np.float16), (max_min / f32(63)).astype(np.float16)
    dl = d16.astype(f32)[:, None] * ls.astype(f32)
    ml = dmin16.astype(f32)[:, None] * lm.astype(f32)
    with np.errstate(divide="ignore", invalid="ignore"):
        lev = np.clip(rint((sb + ml[:, :, None]) / dl[:, :, None]), 0, 15)
    L = np.where((dl != 0)[:, :, None], lev, L)
    qs = (L[:, 0::2, :] | L[:, 1::2, :] << 4).reshape(nb, 128)
    out = np.concatenate([d16.view(np.uint8).reshape(nb, 2), dmin16.view(np.uint8).reshape(nb, 2),
                          sc.astype(np.uint8), qs.astype(np.uint8)], axis=1)
    return out.reshape(rows, cols // 256 * 144)


# ---- the GGUF sources ----

def random_matrix(rng, rows, cols, k):
    """Gaussian rows of several magnitudes, with the cases the rounding meets at its edges."""
    x = rng.standard_normal((rows, cols)).astype(f32) * f32(0.05)
    x *= np.exp2(rng.integers(-4, 5, (rows, 1))).astype(f32)
    x[0, :64] = 0                                       # all-zero blocks and sub-blocks
    x[1 % rows] *= f32(2.0 ** -20)                      # fp16-subnormal scales
    x[2 % rows, ::97] *= f32(40)                        # outliers
    if k % 2:
        x[3 % rows] += f32(0.1)                         # rows all of one sign (Q4_K's min > 0 case)
    return x


def write_float_gguf(path, rng):
    dim, heads, kv, hd, hidden, layers = shape = 256, 4, 2, 64, 512, 2
    w, tokens, _ = gguf_writer(path, "qwen3", os.path.join(DATA, "tiny-qwen3"), "qwen2", shape, 1e6)
    mats = {}

    def mat(name, rows, cols):
        mats[name] = random_matrix(rng, rows, cols, len(mats))
        w.add_tensor(name + ".weight", mats[name])

    def vec(name, n):
        w.add_tensor(name + ".weight", (1 + 0.1 * rng.standard_normal(n)).astype(f32))

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
    return mats, len(tokens)


def random_blocks(rng, qt, rows, cols):
    """Quantized blocks of plausible weights (the source quantized by gguf-py or by quantize_q4_k)."""
    x = (rng.standard_normal((rows, cols)) * 0.05).astype(f32)
    return quants.quantize(x, qt) if qt == Q.Q8_0 else quantize_q4_k(x)


def write_block_gguf(path, rng, kind):
    """A llama GGUF whose matrices are blocks of the types KINDS[kind] names (Q4_0, Q4_1, Q5_0, Q5_1 by
    gguf-py's quantizers; Q6_K and Q5_K random quants and scales, a small d, as gguf-py has no
    quantizer for them), the others Q8_0 or Q4_K."""
    dim, heads, kv, hd, hidden, layers = shape = 256, 4, 2, 64, 512, 1
    w, tokens, _ = gguf_writer(path, "llama", os.path.join(DATA, "tiny-llama31"), "llama-bpe", shape, 5e5)
    raw = {}

    def mat(name, rows, cols, qt):
        if qt == Q.Q6_K:
            blk = rng.integers(0, 256, (rows * cols // 256, 210), dtype=np.uint8)
            blk[:, 208:210] = np.frombuffer(np.float16(0.0005).tobytes(), dtype=np.uint8)
            raw[name] = (qt, blk.reshape(rows, cols // 256 * 210))
        elif qt == Q.Q5_K:  # d, dmin small: weights within about +-0.01
            blk = rng.integers(0, 256, (rows * cols // 256, 176), dtype=np.uint8)
            blk[:, 0:2] = np.frombuffer(np.float16(0.00001).tobytes(), dtype=np.uint8)
            blk[:, 2:4] = np.frombuffer(np.float16(0.0001).tobytes(), dtype=np.uint8)
            raw[name] = (qt, blk.reshape(rows, cols // 256 * 176))
        else:
            raw[name] = (qt, random_blocks(rng, qt, rows, cols) if qt in (Q.Q8_0, Q.Q4_K) else
                         quants.quantize((rng.standard_normal((rows, cols)) * 0.05).astype(f32), qt))
        w.add_tensor(name + ".weight", raw[name][1], raw_dtype=qt)

    def vec(name, n):
        w.add_tensor(name + ".weight", (1 + 0.1 * rng.standard_normal(n)).astype(f32))

    mat("token_embd", len(tokens), dim, Q.Q8_0)
    vec("blk.0.attn_norm", dim)
    mat("blk.0.attn_q", heads * hd, dim, Q.Q4_K)
    k = KINDS[kind]
    mat("blk.0.attn_k", kv * hd, dim, k["attn_k"])
    mat("blk.0.attn_v", kv * hd, dim, k["attn_v"])
    mat("blk.0.attn_output", dim, heads * hd, k["attn_output"])
    vec("blk.0.ffn_norm", dim)
    mat("blk.0.ffn_gate", hidden, dim, Q.Q4_K)
    mat("blk.0.ffn_up", hidden, dim, k["ffn_up"])
    mat("blk.0.ffn_down", dim, hidden, k["ffn_down"])
    vec("output_norm", dim)
    mat("output", len(tokens), dim, Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return raw, len(tokens), hd


def unpermute(a, head_dim):
    """GGUF llama Q/K rows back to rotate-half order, as ./export does (rows of any byte width)."""
    h = a.reshape(-1, head_dim // 2, 2, a.shape[1])
    return h.transpose(0, 2, 1, 3).reshape(a.shape)


def score(model, ids_path):
    p = subprocess.run([RUN, model, "--score", ids_path, "--ids", "--threads", "2", "--ctx", "512"], capture_output=True,
                       text=True, timeout=300)
    rows = [l.split("\t") for l in p.stdout.splitlines() if l[:1].isdigit()]
    return p.returncode, [float(r[2]) for r in rows], p.stderr


def main():
    rng = np.random.default_rng(14)
    with tempfile.TemporaryDirectory() as tmp:
        gg = os.path.join(tmp, "f.gguf")
        mats, vocab = write_float_gguf(gg, rng)

        # 1. Q8_0 against gguf-py's quantizer
        out = os.path.join(tmp, "q8.bin")
        p = export(gg, out, "--quant", "q8_0")
        check(p.returncode == 0 and "quantized: q8_0 x" in p.stderr, "export --quant q8_0 (%s)" % p.last)
        if p.returncode == 0:
            ours, version = read_modelbin(out)
            bad = [n for n, x in mats.items()
                   if ours[n][0] != DTYPE_Q8_0 or ours[n][3] != quants.quantize(x, Q.Q8_0).tobytes()]
            nblk = sum(x.size // 32 for x in mats.values())
            check(not bad and version == 2, "q8_0: all %d blocks of %d matrices byte-identical to gguf.quants.quantize "
                  "(format %d)%s" % (nblk, len(mats), version, ": differ in " + ", ".join(bad[:4]) if bad else ""))

        # 2. Q4_K against GGML's algorithm in numpy, and gguf-py's dequantization against the source
        out = os.path.join(tmp, "q4k.bin")
        p = export(gg, out, "--quant", "q4_k")
        check(p.returncode == 0, "export --quant q4_k (%s)" % p.last)
        if p.returncode == 0:
            ours, _ = read_modelbin(out)
            want_dt = {n: DTYPE_Q8_0 if n in ("token_embd", "output") else DTYPE_Q4_K for n in mats}
            check(all(ours[n][0] == want_dt[n] for n in mats), "q4_k: matrices Q4_K, the embedding and head Q8_0")
            nblk = diff_blk = over = unclamped = 0
            se = sx = 0.0
            for n, x in mats.items():
                if want_dt[n] != DTYPE_Q4_K:
                    continue
                got = np.frombuffer(ours[n][3], np.uint8).reshape(x.shape[0], -1)
                ref = quantize_q4_k(x)
                nblk += got.size // 144
                diff_blk += int(np.count_nonzero((got.reshape(-1, 144) != ref.reshape(-1, 144)).any(axis=1)))
                back = quants.dequantize(got, Q.Q4_K).astype(np.float64)
                # half a step d * sc wherever (x + dmin m) / (d sc) is inside the 16 levels
                blk = got.reshape(-1, 144)
                d = blk[:, 0:2].copy().view(np.float16).astype(np.float64)
                dmin = blk[:, 2:4].copy().view(np.float16).astype(np.float64)
                sc, m = quants.Q4_K.get_scale_min(blk[:, 4:16].copy())
                dl = (d * sc).reshape(-1, 8, 1)
                ml = (dmin * m).reshape(-1, 8, 1)
                xs = x.astype(np.float64).reshape(-1, 8, 32)
                e = np.abs(xs - back.reshape(-1, 8, 32))
                with np.errstate(divide="ignore", invalid="ignore"):
                    lev = (xs + ml) / dl
                inside = (dl > 0) & (lev >= -0.49) & (lev <= 15.49)
                unclamped += int(inside.sum())
                over += int((inside & (e > 0.5 * dl * (1 + 1e-5) + 1e-6 * np.abs(xs))).sum())
                se, sx = se + float((e ** 2).sum()), sx + float((xs ** 2).sum())
            check(nblk > 0 and diff_blk == 0, "q4_k: %d of %d super-blocks byte-identical to GGML's quantize_row_q4_K_ref "
                  "(numpy float32 transcription)" % (nblk - diff_blk, nblk))
            check(over == 0 and unclamped > 0, "q4_k: gguf-py's dequantization within half a step of the source at "
                  "all %d unclamped weights (%d outside)" % (unclamped, over))
            check((se / sx) ** 0.5 < 0.1, "q4_k: rms error %.4f of the source's rms (< 0.1)" % (se / sx) ** 0.5)

        for kind in (1, 2):
            check_keep(tmp, rng, kind)


def types_of(kind):
    return " / ".join(sorted({t.name for t in KINDS[kind].values()} | {"Q8_0", "Q4_K"}))


def check_keep(tmp, rng, kind):
    """3. --dtype keep: blocks as they are; 4. the CPU path on them against the f32 export."""
    gb = os.path.join(tmp, "b.gguf")
    raw, vocab_b, hd = write_block_gguf(gb, rng, kind)
    keep = os.path.join(tmp, "keep.bin")
    p = export(gb, keep, "--dtype", "keep")
    check(p.returncode == 0, "export --dtype keep of %s matrices (%s)" % (types_of(kind), p.last))
    if p.returncode == 0:
        ours, version = read_modelbin(keep)
        bad = []
        for n, (qt, blocks) in raw.items():
            dt, want = ours[n][0], blocks
            if n.endswith("attn_q") or n.endswith("attn_k"):
                want = unpermute(blocks, hd)
            ok = dt == KEPT[qt] and ours[n][3] == want.tobytes()
            if not ok:
                bad.append(n)
        check(not bad and version == 2, "keep: %s blocks byte for byte (Q/K rows un-permuted)%s" %
              (types_of(kind), ": differ in " + ", ".join(bad) if bad else ""))
        p = export(gb, os.path.join(tmp, "bad.bin"), "--dtype", "keep", "--quant", "q8_0")
        check(p.returncode == 1 and "give one" in p.stderr, "--dtype keep with --quant is refused")

    # 4. the CPU path on the kept blocks equals the f32 export of the same values
    gb = os.path.join(tmp, "b2.gguf")
    write_block_gguf(gb, rng, kind)
    keep, f32bin = os.path.join(tmp, "keep2.bin"), os.path.join(tmp, "f32.bin")
    p, p2 = export(gb, keep, "--dtype", "keep"), export(gb, f32bin, "--dtype", "f32")
    ids = os.path.join(tmp, "ids.txt")
    with open(ids, "w") as f:
        f.write(" ".join(str(int(i)) for i in rng.integers(0, vocab_b, 300)))
    rc_q, nll_q, err_q = score(keep, ids)
    rc_f, nll_f, err_f = score(f32bin, ids)
    ok = p.returncode == 0 and p2.returncode == 0 and rc_q == 0 and rc_f == 0 and len(nll_q) == len(nll_f) == 299
    worst = max((abs(a - b) for a, b in zip(nll_q, nll_f)), default=float("nan"))
    check(ok and worst <= 2e-4, "--score (chunks: dequantized panels through sgemm) on kept %s blocks equals "
          "the f32 export within 2e-4 per position (299 positions, worst %.2e)%s"
          % (types_of(kind), worst, "" if ok else ": " + (err_q + err_f).strip()[-200:]))
    # decode steps: the block dot products on activations quantized per 32 (quant.h's ActQ8),
    # against fp32 activations in the f32 export: greedy ids equal, or where they part, the kept
    # model's choice a near-tie under the f32 model (its NLL within 0.1 nats of the f32 choice's;
    # the activations' rounding moves a product by up to ~0.2% of its magnitude, test_quant.c,
    # which moves these logits by hundredths of a nat)
    gen = [subprocess.run([RUN, m, "--ids", "-p", "1 2 3 4", "-n", "48", "--temp", "0", "--ignore-eos"],
                          capture_output=True, text=True, timeout=300) for m in (keep, f32bin)]
    gk, gf = gen[0].stdout.split(), gen[1].stdout.split()
    ok = all(g.returncode == 0 for g in gen) and len(gk) == len(gf) == 48
    part, margin = next((i for i in range(len(gk)) if gk[i] != gf[i]), None) if ok else None, 0.0
    if ok and part is not None:
        nll = []
        for tok in (gk[part], gf[part]):
            with open(ids, "w") as f:
                f.write(" ".join(["1", "2", "3", "4"] + gf[:part] + [tok]))
            rc, v, _ = score(f32bin, ids)
            ok &= rc == 0 and len(v) > 0
            nll.append(v[-1] if v else float("nan"))
        margin = nll[0] - nll[1]
        ok &= margin < 0.1
    check(ok, "greedy decode (block dot products, activations quantized per 32) on the kept %s blocks: the f32 export's 48 ids%s"
          % (types_of(kind), "" if part is None else ", up to a near-tie at step %d (%.4f nats under the f32 model, bound 0.1)" % (part, margin)))
    check("q4_k x" in err_q and "q8_0 x" in err_q, "the load line names the dtypes (%s)" %
          next((l for l in err_q.splitlines() if "weights" in l), "?"))


if __name__ == "__main__":
    main()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
