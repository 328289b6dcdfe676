#!/usr/bin/env python3
"""ParisKV on the GPU against the CPU reference, whole model: `./run --score` of one input under
full attention and under --attn pariskv, on the CPU (fp32) and on the GPU (bf16) with the zone in
GPU memory and in the host store (with a small device cache, so its ring wraps).

Checks (issue 11): GPU pariskv vs CPU pariskv mean NLL within 0.02; their top-1 agreement within
0.5 point of what dense attention gets between the two paths (a trained model only); the host
store and the GPU store give identical scores (the same kernels read the same rows from two
places), and so do two runs.

Usage: pkv_gpu_vs_cpu.py RUN MODEL.bin INPUT [--ids] [--cpu-dir DIR] [--random-model DIR]
  --cpu-dir DIR: cpu_full.score / cpu_pkv.score already computed there (else computed here)
  --random-model DIR: first write a random-weight SmolLM2-shaped checkpoint (transformers) to DIR
                      and export it to MODEL.bin with the EXPORT beside RUN"""
import os
import random
import subprocess
import sys
import time


def score(run, model, inp, ids, device, attn, extra_env=None, extra=()):
    env = dict(os.environ)
    env.update(extra_env or {})
    args = [run, model, "--score", inp, "--device", device, "--attn", attn, *extra] + (["--ids"] if ids else [])
    t0 = time.time()
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    el = time.time() - t0
    if p.returncode != 0:
        print(f"FAIL {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
        return None, el
    rows, mean = [], None
    for line in p.stdout.splitlines():
        f = line.split()
        if f and f[0] == "mean_nll":
            mean = float(f[1])
        elif len(f) == 4:
            rows.append((int(f[0]), int(f[1]), float(f[2]), int(f[3])))
    return (rows, mean, p.stdout), el


def read_cached(path):
    rows, mean = [], None
    text = open(path).read()
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == "mean_nll":
            mean = float(f[1])
        elif len(f) == 4:
            rows.append((int(f[0]), int(f[1]), float(f[2]), int(f[3])))
    return rows, mean, text


def make_random_model(d, out_bin, export, hidden=576, layers=6, heads=9, kv_heads=3):
    """SmolLM2's shape (or, by the keywords, another of its head_dim 64: gpu_checks.sh tp's 8 / 4
    heads split over two GPUs), random bf16 weights, SmolLM2's tokenizer and chat template."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=1536, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=64, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=True, initializer_range=0.08, bos_token_id=1, eos_token_id=2)
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.save_pretrained(d)
    tok = os.path.join(os.path.dirname(__file__), "..", "data", "smollm2-tokenizer")
    for f in os.listdir(tok):
        subprocess.run(["cp", os.path.join(tok, f), d], check=True)
    subprocess.run([export, d, out_bin], check=True, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def main():
    a = sys.argv[1:]
    run, model, inp = a[0], a[1], a[2]
    ids = "--ids" in a
    random_model = "--random-model" in a
    cpu_dir = a[a.index("--cpu-dir") + 1] if "--cpu-dir" in a else None
    if "--random-model" in a:
        make_random_model(a[a.index("--random-model") + 1], model, os.path.join(os.path.dirname(run), "export"))
        if not os.path.exists(inp):
            random.seed(1)
            with open(inp, "w") as f:
                f.write(" ".join(str(random.randrange(3, 49152)) for _ in range(6000)))
    res, times = {}, {}
    if cpu_dir:
        res["cpu full"] = read_cached(os.path.join(cpu_dir, "cpu_full.score"))
        res["cpu pariskv"] = read_cached(os.path.join(cpu_dir, "cpu_pkv.score"))
    else:
        res["cpu full"], times["cpu full"] = score(run, model, inp, ids, "cpu", "full")
        res["cpu pariskv"], times["cpu pariskv"] = score(run, model, inp, ids, "cpu", "pariskv")
    res["gpu full"], times["gpu full"] = score(run, model, inp, ids, "gpu", "full")
    res["gpu pariskv, gpu store"], times["gpu pariskv, gpu store"] = score(run, model, inp, ids, "gpu", "pariskv", extra=("--kv-store", "gpu"))
    res["gpu pariskv, host store"], times["gpu pariskv, host store"] = score(
        run, model, inp, ids, "gpu", "pariskv", {"PKV_DEVICE_POSITIONS": "2600"}, ("--kv-store", "host"))
    res["gpu pariskv, gpu store, again"], times["gpu pariskv, gpu store, again"] = score(run, model, inp, ids, "gpu", "pariskv",
                                                                                        extra=("--kv-store", "gpu"))
    if any(v is None for v in res.values()):
        sys.exit(1)
    if os.environ.get("OUT"):  # every run's scores, for a closer look
        for k, v in res.items():
            with open(os.path.join(os.environ["OUT"], k.replace(", ", "_").replace(" ", "_") + ".score"), "w") as f:
                f.write(v[2])
    n = len(res["cpu full"][0])
    print(f"{n} scored positions; mean NLL and time per run:")
    for k, v in res.items():
        t = f"{times[k]:.1f} s" if k in times else "(cached)"
        print(f"  {k:26s} mean_nll {v[1]:.5f}  {t}")

    def agree(x, y):
        return 100.0 * sum(r[3] == s[3] for r, s in zip(x[0], y[0])) / len(x[0])

    ok = True
    for k in res:
        if [r[:2] for r in res[k][0]] != [r[:2] for r in res["cpu full"][0]]:
            print(f"FAIL {k}: positions differ from cpu full")
            ok = False
    dense_agree = agree(res["gpu full"], res["cpu full"])
    for store in ("gpu store", "host store"):
        g = res[f"gpu pariskv, {store}"]
        d = abs(g[1] - res["cpu pariskv"][1])
        a_p = agree(g, res["cpu pariskv"])
        mad = sum(abs(r[2] - s[2]) for r, s in zip(g[0], res["cpu pariskv"][0])) / n
        # A random-weight model attends diffusely: its top-k sets hinge on rounding, so bf16 and
        # fp32 select differently far more often than on a trained model, and top-1 is reported
        # there, not bounded.
        good = d <= 0.02 and (random_model or a_p >= dense_agree - 0.5)
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} gpu pariskv ({store}) vs cpu pariskv: mean NLL difference {d:.5f} (bound 0.02), "
              f"mean |dNLL| {mad:.4f}, top-1 agreement {a_p:.2f}% vs dense gpu-vs-cpu {dense_agree:.2f}% "
              f"({'reported only: random weights' if random_model else 'at most 0.5 point below'})")
    rep = res["gpu pariskv, gpu store"][2] == res["gpu pariskv, gpu store, again"][2]
    ok &= rep
    print(f"{'ok  ' if rep else 'FAIL'} the GPU repeats itself: two runs give identical scores")
    same = res["gpu pariskv, gpu store"][2] == res["gpu pariskv, host store"][2]
    if not same:
        x, y = res["gpu pariskv, gpu store"][0], res["gpu pariskv, host store"][0]
        diff = [r[0] for r, s in zip(x, y) if r[2] != s[2]]
        print(f"     the stores differ at {len(diff)} positions, the first {diff[:5]}")
    ok &= same
    print(f"{'ok  ' if same else 'FAIL'} host store and GPU store give identical scores")
    print(f"     (for scale: cpu pariskv vs cpu full mean NLL {res['cpu pariskv'][1] - res['cpu full'][1]:+.5f}, "
          f"gpu pariskv vs gpu full {res['gpu pariskv, gpu store'][1] - res['gpu full'][1]:+.5f})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
