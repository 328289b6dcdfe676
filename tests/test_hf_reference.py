#!/usr/bin/env python3
"""Check ./export + ./run against reference data computed with Hugging Face transformers.

Python 3 standard library only. Run from the repository root after `make`
(tests/run_all.sh does this):

    python3 tests/test_hf_reference.py [-v] [--only NAME]

The reference data under tests/data/ was produced, by hand, with
tests/ref/make_tiny_models.py (tiny random-weight checkpoints) and
tests/ref/smollm2_reference.py (SmolLM2-135M-Instruct Q4_1 GGUF); see their
headers for the command lines and library versions.

Checks
  tiny models (tests/data/tiny-*/ with ref_score.txt):
    * export bf16 (the default) and f32; for each:
      - ./run m.bin --score ids.txt --ids: every per-position nll within
        TINY_TOL (1e-3, absolute) of ref_score.txt, same next_id, and mean_nll
        within TINY_TOL. The weights are bf16-representable, so the bf16 export
        is lossless and both exports must match the float32 reference.
      - greedy: ./run m.bin --ids -p "<first 10 ids>" -n 32 --temp 0
        --ignore-eos must print exactly the 32 ids of ref_greedy.txt.
  SmolLM2-135M-Instruct Q4_1 GGUF (path: $SMOLLM2_GGUF, else
  build/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; missing => FAIL):
    * export --dtype f32 (Q4_1 dequantized to f32, exactly as transformers does)
    * per prompt: 32 greedy ids must equal the reference for all 32 steps;
      --score over prompt+generation: every nll within SMOL_TOL (2e-3,
      absolute) and mean_nll within SMOL_TOL.

Prints one line per check, `ok ...` or `FAIL ...`, and exits 1 if anything failed.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
RUN = os.path.join(os.environ.get("PKV_BIN", ROOT), "run")  # PKV_BIN: the sanitizer build
EXPORT = os.path.join(os.environ.get("PKV_BIN", ROOT), "export")

TINY_TOL = 1e-3   # absolute tolerance on per-position nll (nats), tiny models
SMOL_TOL = 2e-3   # absolute tolerance on per-position nll (nats), SmolLM2 Q4_1 -> f32
TINY_MODELS = ["tiny-llama31", "tiny-llama31-tf4", "tiny-qwen3", "tiny-llama-fp16"]
SMOL_DEFAULT = os.path.join(ROOT, "build", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

EXPORT_TIMEOUT = 600
RUN_TIMEOUT = 300

failures = []
VERBOSE = False


def ok(msg):
    print("ok   " + msg, flush=True)


def fail(msg):
    failures.append(msg)
    print("FAIL " + msg, flush=True)


def sh(cmd, timeout):
    """Run cmd (list). Returns (rc, stdout, stderr); rc None on timeout/launch error."""
    if VERBOSE:
        print("  $ " + " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", "timed out after %ds" % timeout
    except OSError as e:
        return None, "", "could not start: %s" % e
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"))


def tail(s, n=600):
    s = s.strip()
    return s if len(s) <= n else "..." + s[-n:]


def read_ids(path):
    with open(path) as f:
        return [int(t) for t in f.read().split()]


def parse_score(text):
    """Parse `i next_id nll` lines (tab or space separated) and `mean_nll X ppl Y`.

    Returns (rows, mean_nll, ppl); rows is a list of (i, next_id, nll).
    Lines that match neither form are ignored (banners etc. belong on stderr,
    but be tolerant)."""
    rows, mean, ppl = [], None, None
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "mean_nll":
            try:
                mean = float(parts[1])
                if len(parts) >= 4 and parts[2] == "ppl":
                    ppl = float(parts[3])
            except (IndexError, ValueError):
                pass
            continue
        if len(parts) == 3:
            try:
                rows.append((int(parts[0]), int(parts[1]), float(parts[2])))
            except ValueError:
                pass
    return rows, mean, ppl


def parse_ref_score(path):
    with open(path) as f:
        return parse_score(f.read())


def parse_gen_ids(text):
    """Generated ids: every whitespace-separated token on lines made only of integers."""
    ids, junk = [], []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            ids.extend(int(t) for t in parts)
        except ValueError:
            junk.append(line)
    return ids, junk


def compare_score(label, out, ids, ref_rows, ref_mean, tol):
    rows, mean, ppl = parse_score(out)
    n = len(ids)
    if len(rows) != n - 1:
        fail("%s: expected %d score lines, got %d; stdout tail: %s"
             % (label, n - 1, len(rows), tail(out, 300)))
        return
    worst, worst_i, bad = 0.0, -1, []
    for k, ((i, nid, nll), (ri, rnid, rnll)) in enumerate(zip(rows, ref_rows)):
        if i != ri or nid != rnid:
            bad.append("line %d: got (i=%d,next=%d) want (i=%d,next=%d)" % (k, i, nid, ri, rnid))
            continue
        if not math.isfinite(nll):
            bad.append("pos %d: nll %r not finite" % (i, nll))
            continue
        d = abs(nll - rnll)
        if d > worst:
            worst, worst_i = d, i
        if d > tol:
            bad.append("pos %d next %d: nll %.6f ref %.6f |d| %.2e" % (i, nid, nll, rnll, d))
    if bad:
        fail("%s: %d/%d positions off (tol %.0e, worst |d| %.3e at pos %d); first: %s"
             % (label, len(bad), n - 1, tol, worst, worst_i, "; ".join(bad[:4])))
    else:
        ok("%s: %d positions, max |d nll| %.2e at pos %d (tol %.0e)"
           % (label, n - 1, worst, worst_i, tol))
    if mean is None:
        fail("%s: no `mean_nll X ppl Y` line" % label)
    elif not abs(mean - ref_mean) <= tol:
        fail("%s: mean_nll %.6f ref %.6f |d| %.2e (tol %.0e)"
             % (label, mean, ref_mean, abs(mean - ref_mean), tol))
    else:
        msg = "%s: mean_nll %.6f ref %.6f" % (label, mean, ref_mean)
        if ppl is not None:
            rppl = math.exp(ref_mean)
            if abs(ppl - rppl) > 1e-3 * rppl + 1e-3:
                fail("%s: ppl %.4f but exp(ref mean_nll) = %.4f" % (label, ppl, rppl))
                return
            msg += " ppl %.4f" % ppl
        ok(msg)


def do_score(label, model, ids, ref_rows, ref_mean, tol, tmp):
    path = os.path.join(tmp, "score_ids.txt")
    with open(path, "w") as f:
        f.write(" ".join(str(i) for i in ids) + "\n")
    rc, out, err = sh([RUN, model, "--score", path, "--ids"], RUN_TIMEOUT)
    if rc != 0:
        fail("%s: ./run --score failed (rc %s): %s" % (label, rc, tail(err or out)))
        return
    compare_score(label, out, ids, ref_rows, ref_mean, tol)


def do_greedy(label, model, prompt, ref_gen):
    n = len(ref_gen)
    rc, out, err = sh([RUN, model, "--ids", "-p", " ".join(str(i) for i in prompt),
                       "-n", str(n), "--temp", "0", "--ignore-eos"], RUN_TIMEOUT)
    if rc != 0:
        fail("%s: ./run greedy failed (rc %s): %s" % (label, rc, tail(err or out)))
        return
    gen, junk = parse_gen_ids(out)
    if junk:
        print("note %s: ignored non-id stdout lines: %r" % (label, junk[:3]), flush=True)
    if gen == ref_gen:
        ok("%s: %d greedy ids match" % (label, n))
        return
    k = next((j for j in range(min(len(gen), n)) if gen[j] != ref_gen[j]), min(len(gen), n))
    fail("%s: greedy ids differ at step %d (got %d ids)\n     got  %s\n     want %s"
         % (label, k, len(gen), " ".join(map(str, gen)), " ".join(map(str, ref_gen))))


def do_export(label, src, out, dtype):
    cmd = [EXPORT, src, out]
    if dtype:
        cmd += ["--dtype", dtype]
    rc, o, e = sh(cmd, EXPORT_TIMEOUT)
    if rc != 0 or not os.path.isfile(out):
        fail("%s: export failed (rc %s): %s" % (label, rc, tail(e or o)))
        return False
    ok("%s: exported (%d bytes)" % (label, os.path.getsize(out)))
    return True


def test_tiny(name, tmp):
    d = os.path.join(DATA, name)
    needed = ["config.json", "ids.txt", "ref_score.txt", "ref_greedy.txt"]
    missing = [f for f in needed if not os.path.isfile(os.path.join(d, f))]
    if missing:
        fail("%s: reference data missing in %s: %s" % (name, d, ", ".join(missing)))
        return
    ids = read_ids(os.path.join(d, "ids.txt"))
    ref_rows, ref_mean, _ = parse_ref_score(os.path.join(d, "ref_score.txt"))
    ref_gen = read_ids(os.path.join(d, "ref_greedy.txt"))
    if len(ref_rows) != len(ids) - 1 or ref_mean is None:
        fail("%s: ref_score.txt malformed" % name)
        return
    for dtype in ("bf16", "f32"):
        label = "%s[%s]" % (name, dtype)
        model = os.path.join(tmp, "%s-%s.bin" % (name, dtype))
        # bf16 is the default: do not pass --dtype for it, so the default is what is tested
        if not do_export(label + " export", d, model, None if dtype == "bf16" else dtype):
            continue
        do_score(label + " score", model, ids, ref_rows, ref_mean, TINY_TOL, tmp)
        do_greedy(label + " greedy", model, ids[:10], ref_gen)
        os.unlink(model)


def test_smollm2(tmp):
    gguf = os.environ.get("SMOLLM2_GGUF") or SMOL_DEFAULT
    ref_path = os.path.join(DATA, "smollm2_ref.json")
    if not os.path.isfile(gguf):
        src = "$SMOLLM2_GGUF" if os.environ.get("SMOLLM2_GGUF") else "default path"
        fail("smollm2: GGUF not found at %s (%s); set SMOLLM2_GGUF to "
             "SmolLM2-135M-Instruct.Q4_1.gguf -- a missing input is not a pass" % (gguf, src))
        return
    if not os.path.isfile(ref_path):
        fail("smollm2: reference %s missing" % ref_path)
        return
    with open(ref_path) as f:
        ref = json.load(f)
    model = os.path.join(tmp, "smollm2-f32.bin")
    if not do_export("smollm2[f32] export", gguf, model, "f32"):
        return
    # PKV_SMOL_PROMPTS=N: the first N prompts only (make test-asan: the others run the same code)
    n_prompts = int(os.environ.get("PKV_SMOL_PROMPTS", "0")) or None
    for p in ref["prompts"][:n_prompts]:
        label = "smollm2[%s]" % p["name"]
        do_greedy(label + " greedy", model, p["prompt_ids"], p["greedy_ids"])
        full = p["prompt_ids"] + p["greedy_ids"]
        rows = [(r[0], r[1], r[2]) for r in p["score"]]
        do_score(label + " score", model, full, rows, p["mean_nll"], SMOL_TOL, tmp)
    os.unlink(model)


def main():
    global VERBOSE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-v", "--verbose", action="store_true", help="print commands")
    ap.add_argument("--only", help="run only this model (a tiny-* dir name or 'smollm2')")
    args = ap.parse_args()
    VERBOSE = args.verbose
    for b in (RUN, EXPORT):
        if not os.access(b, os.X_OK):
            fail("%s not built (run `make` first)" % os.path.relpath(b, ROOT))
    if failures:
        print("test_hf_reference: %d failure(s)" % len(failures))
        return 1
    tmp = tempfile.mkdtemp(prefix="hfref_")
    try:
        for name in TINY_MODELS:
            if args.only and args.only != name:
                continue
            test_tiny(name, tmp)
        if not args.only or args.only == "smollm2":
            test_smollm2(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print("test_hf_reference: %d failure(s)" % len(failures))
        return 1
    print("test_hf_reference: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
