#!/usr/bin/env python3
"""Drift of ParisKV on the GPU against the CPU reference (issue 12): a long prompt, a greedy
continuation generated with full attention (on the GPU), then prompt + continuation teacher-forced
with `./run --score --score-prompt P` (the prompt attended densely, the continuation's positions
as a generation's would be) under full attention and under ParisKV, on the GPU and on the CPU.
Per quarter of the continuation: top-1 agreement between ParisKV and full attention on each path,
the mean NLL ParisKV adds, and Recall@k of ParisKV's selections (every layer and KV head of every
continuation position: the PKV_RECALL measurement of attention/recall.h, which both paths write
while scoring one position at a time); the checks are the issue's: each bin's top-1 agreement and
Recall@k on the GPU within 1 point of the CPU's.

Usage: pkv_drift.py RUN MODEL.bin TEXT [--prompt P] [--gen G] [--temp T] [--out DIR]
(a greedy continuation of a small model soon repeats itself: --temp 0.8 makes a harder text)"""
import os
import subprocess
import sys


def run(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, timeout=1200, **kw)
    if p.returncode != 0:
        sys.exit(f"FAIL {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return p.stdout


def main():
    a = sys.argv[1:]
    opt = {"--prompt": "4000", "--gen": "4096", "--out": "/tmp/pkv-drift", "--temp": "0"}
    pos = []
    while a:
        x = a.pop(0)
        if x in opt and a:
            opt[x] = a.pop(0)
        else:
            pos.append(x)
    if len(pos) != 3:
        sys.exit(__doc__)
    run_bin, model, text = pos
    P, G, out = int(opt["--prompt"]), int(opt["--gen"]), opt["--out"]
    os.makedirs(out, exist_ok=True)
    ids = run([run_bin, model, "--tokenize", "-f", text]).split()
    if len(ids) < P:
        sys.exit(f"FAIL {text} has {len(ids)} tokens, fewer than --prompt {P}")
    prompt = os.path.join(out, "prompt.txt")
    open(prompt, "w").write(" ".join(ids[:P]))
    gen = run([run_bin, model, "--ids", "-f", prompt, "-n", str(G), "--temp", opt["--temp"], "--seed", "1", "--ignore-eos", "--attn", "full",
               "--device", "gpu"]).split()
    if len(gen) != G:
        sys.exit(f"FAIL the generation gave {len(gen)} ids, not {G}")
    both = os.path.join(out, "prompt_gen.txt")
    open(both, "w").write(" ".join(ids[:P] + gen))
    top, recall = {}, {}
    for dev in ("gpu", "cpu"):
        for attn in ("full", "pariskv"):
            rows, env = {}, None
            if attn == "pariskv":
                rec = os.path.join(out, f"recall_{dev}.txt")
                if os.path.exists(rec):
                    os.remove(rec)
                env = dict(os.environ, PKV_RECALL=rec)
            for line in run([run_bin, model, "--score", both, "--ids", "--score-prompt", str(P), "--device", dev, "--attn", attn], env=env).splitlines():
                f = line.split()
                if len(f) == 4 and f[0] != "mean_nll":
                    rows[int(f[0])] = (float(f[2]), int(f[3]))
            top[dev, attn] = rows
            if env:
                per = {}
                for line in open(rec):
                    p_, _, _, r = line.split()
                    per.setdefault(int(p_), []).append(float(r))
                recall[dev] = {p_: sum(v) / len(v) for p_, v in per.items()}
    n = P + G - 1  # positions scored: 0 .. P + G - 2
    how = "greedy" if float(opt["--temp"]) == 0 else f"sampled at temperature {opt['--temp']}, seed 1"
    print(f"prompt {P} tokens, continuation {G} tokens ({how}, full attention, GPU); per quarter of the continuation:")
    print("| positions | top-1 agreement GPU | top-1 agreement CPU | difference (points) | NLL added GPU | NLL added CPU "
          "| Recall@k GPU | Recall@k CPU | difference (points) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    ok = True
    q = G // 4
    for b in range(4):
        lo, hi = P - 1 + b * q, (P - 1 + (b + 1) * q if b < 3 else n)
        agree, added = {}, {}
        for dev in ("gpu", "cpu"):
            f, k = top[dev, "full"], top[dev, "pariskv"]
            agree[dev] = 100.0 * sum(f[i][1] == k[i][1] for i in range(lo, hi)) / (hi - lo)
            added[dev] = sum(k[i][0] - f[i][0] for i in range(lo, hi)) / (hi - lo)
        d = agree["gpu"] - agree["cpu"]
        ok &= abs(d) <= 1.0
        # Recall@k of the steps at positions lo+1 .. hi (the step at p predicts token p + 1)
        rc = {dev: [recall[dev][p_] for p_ in range(lo + 1, hi + 1) if p_ in recall[dev]] for dev in ("gpu", "cpu")}
        have = all(rc[dev] for dev in rc) and len(rc["gpu"]) == len(rc["cpu"])
        mr = {dev: 100.0 * sum(v) / len(v) if v else float("nan") for dev, v in rc.items()}
        dr = mr["gpu"] - mr["cpu"]
        ok &= have and abs(dr) <= 1.0
        print(f"| {lo}-{hi - 1} | {agree['gpu']:.2f}% | {agree['cpu']:.2f}% | {d:+.2f} | {added['gpu']:+.4f} | {added['cpu']:+.4f} "
              f"| {mr['gpu']:.2f}% | {mr['cpu']:.2f}% | {dr:+.2f} |")
    print(f"{'ok  ' if ok else 'FAIL'} drift: each quarter's top-1 agreement and Recall@k on the GPU within 1 point of the CPU's")
    sys.exit(0 if ok else 1)


main()
