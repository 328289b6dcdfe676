#!/usr/bin/env python3
"""GPU correctness at long context against PyTorch: a random-weight Qwen3-8B-shaped checkpoint is
saved, exported with ./export, scored with ./run --device gpu over N random tokens, and the
per-position next-token NLL of the last K positions is compared with transformers (bf16, sdpa).
Usage: python3 tests/bench/hf_vs_gpu.py RUN EXPORT TOKENIZER_DIR N K   (needs torch + a GPU)"""
import os
import shutil
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, Qwen3Config


def main():
    run, export, tokdir, n, k = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    d = "/dev/shm/q8b"
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                      rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.05)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    model.save_pretrained(d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokdir, f), d)
    ids = torch.randint(0, 151643, (1, n), device="cuda")
    with torch.no_grad():
        h = model.model(ids).last_hidden_state[:, -k:]
        logits = model.lm_head(h).float()[0]
    lp = torch.log_softmax(logits, -1)
    tgt = ids[0, n - k + 1:]
    ref = (-lp[:-1].gather(1, tgt[:, None])[:, 0]).cpu().tolist()
    ref_top1 = logits[:-1].argmax(-1).cpu().tolist()
    del model, h, logits, lp
    torch.cuda.empty_cache()
    with open("/dev/shm/ids.txt", "w") as f:
        f.write(" ".join(map(str, ids[0].tolist())))
    subprocess.run([export, d, "/dev/shm/q8b.bin"], check=True, stderr=subprocess.DEVNULL)
    shutil.rmtree(d)
    out = subprocess.run([run, "/dev/shm/q8b.bin", "--score", "/dev/shm/ids.txt", "--ids", "--device", "gpu"],
                         check=True, capture_output=True, text=True).stdout
    ours = [float(l.split()[2]) for l in out.splitlines() if l[0].isdigit()]
    ours = ours[n - k:]
    diffs = [abs(a - b) for a, b in zip(ours, ref)]
    print(f"Qwen3-8B shape, random weights, {n} tokens: last {len(diffs)} positions, ./run GPU vs transformers bf16: "
          f"max |dNLL| {max(diffs):.4f}, mean |dNLL| {sum(diffs) / len(diffs):.4f}, "
          f"mean NLL {sum(ours) / len(ours):.4f} vs {sum(ref) / len(ref):.4f}")
    # Two bf16 implementations with different accumulation orders: per-position NLL moves by a
    # fraction of a nat on a sharp random model; the mean must agree closely.
    mean_ref = sum(ref) / len(ref)
    ok = sum(diffs) / len(diffs) < 0.02 * mean_ref and abs(sum(ours) - sum(ref)) / len(ours) < 0.005 * mean_ref
    print("ok" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
