#!/usr/bin/env python3
"""The PKV_RECALL measurement (attention/recall.h) on the CPU path: `./run --score` under ParisKV
with PKV_RECALL=FILE writes one line `pos layer kv_head recall` for every position past the dense
phase, every layer and KV head, each recall in [0, 1]; the scores stay those of a run without it
(it scores one position at a time: only the summation order of the products changes); a second
run writes the same file. Known answers, so that no constant passes: the oracle selector (the exact
top-k) gives 1.0 at every step; StreamingLLM (nothing from the zone, by its definition) gives 0.0;
ParisKV with k at least the zone (it then selects the whole zone) gives 1.0; ParisKV with k = 16 gives
values strictly between those. The GPU path writes the same lines (tests/bench/pkv_drift.py compares
the two there)."""
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PKV_BIN", ROOT)
RUN, EXPORT = os.path.join(BIN, "run"), os.path.join(BIN, "export")
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""))


def score(model, ids, topk, rec=None, attn="pariskv", extra=()):
    env = dict(os.environ, PKV_RECALL=rec) if rec else {k: v for k, v in os.environ.items() if k != "PKV_RECALL"}
    p = subprocess.run([RUN, model, "--score", ids, "--ids", "--attn", attn, "--topk", str(topk), "--score-prompt", "2200",
                        "--ctx", "2700", "--device", "cpu", *extra], capture_output=True, text=True, timeout=300, env=env)
    mean = [float(l.split()[1]) for l in p.stdout.splitlines() if l.startswith("mean_nll")]
    return p.returncode, mean[0] if mean else None


def main():
    with tempfile.TemporaryDirectory(prefix="pkv-recall-") as tmp:
        model = os.path.join(tmp, "tq.bin")
        subprocess.run([EXPORT, os.path.join(ROOT, "tests", "data", "tiny-qwen3"), model], check=True, capture_output=True)
        random.seed(1)
        ids = os.path.join(tmp, "ids.txt")
        open(ids, "w").write(" ".join(str(random.randrange(3, 400)) for _ in range(2600)))
        rec = os.path.join(tmp, "rec.txt")
        rc, with_rec = score(model, ids, 16, rec)
        rc0, without = score(model, ids, 16)
        lines = [l.split() for l in open(rec)] if os.path.exists(rec) else []
        # positions 2200 .. 2599 are decode steps (past the prompt and the 2,000-token dense phase);
        # tiny-qwen3: 2 layers, 2 KV heads
        want = {(p, l, h) for p in range(2200, 2600) for l in range(2) for h in range(2)}
        got = {(int(f[0]), int(f[1]), int(f[2])) for f in lines}
        vals = [float(f[3]) for f in lines]
        check("one line per decode step, layer and KV head", rc == 0 and got == want and len(lines) == len(want),
              f"{len(lines)} lines for {len(want)} (step, layer, head)")
        check("every recall in [0, 1]", vals and all(0.0 <= v <= 1.0 for v in vals), f"min {min(vals, default=-1)}, max {max(vals, default=-1)}")
        check("the scores stay those of a run without it", rc0 == 0 and with_rec is not None and abs(with_rec - without) <= 1e-4,
              f"mean NLL {with_rec} vs {without}")
        check("ParisKV at k = 16: recall strictly between 0 and 1 on average, and not one value", vals and 0 < sum(vals) / len(vals) < 1
              and len(set(vals)) > 1, f"mean {sum(vals) / max(len(vals), 1):.3f}, {len(set(vals))} distinct")
        # --local 1900 leaves a zone of 2200 - 1900 - 4 = 296 keys (no update within 400 steps of
        # U = 512); k = 300 covers it, and its dense threshold 4 + 1900 + 600 leaves steps 2503 on.
        for label, attn, k, extra, value, steps in (("the oracle selector (exact top-k)", "oracle", 16, (), 1.0, range(2200, 2600)),
                                                   ("StreamingLLM (nothing from the zone)", "streaming", 16, (), 0.0, range(2200, 2600)),
                                                   ("ParisKV with k = 300 >= the zone of 296", "pariskv", 300, ("--local", "1900"), 1.0,
                                                    range(2503, 2600))):
            r = os.path.join(tmp, f"rec-{attn}-{k}.txt")
            rc_k, _ = score(model, ids, k, r, attn, extra)
            got = [l.split() for l in open(r)] if os.path.exists(r) else []
            v = [float(f[3]) for f in got]
            n_want = len(steps) * 2 * 2
            check(f"{label}: recall {value} at every step, layer and head", rc_k == 0 and len(got) == n_want and all(x == value for x in v)
                  and {int(f[0]) for f in got} == set(steps), f"{len(got)} lines for {n_want}, values {sorted(set(v))[:4]}")
        rec2 = os.path.join(tmp, "rec2.txt")
        score(model, ids, 16, rec2)
        check("a second run writes the same measurement", os.path.exists(rec2) and open(rec2).read() == open(rec).read())
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


main()
