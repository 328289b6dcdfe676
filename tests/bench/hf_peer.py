#!/usr/bin/env python3
"""The peer, measured beside ./run on the same GPU: Hugging Face transformers + PyTorch sdpa on a
random-weight Qwen3-8B (bf16, batch 1). Prefill of N random tokens, then decode steps.
Usage: python3 tests/bench/hf_peer.py N [N ...]   (needs torch + transformers + a GPU)"""
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM, Qwen3Config


def qwen3_8b():
    return Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                       rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False)


def main():
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(qwen3_8b(), torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    print(f"transformers + sdpa, Qwen3-8B shape, random bf16 weights, {torch.cuda.get_device_name()}")
    print(f"{'context':>9} | {'prefill s':>9} | {'decode ms/token':>15}")
    for n in map(int, sys.argv[1:]):
        ids = torch.randint(0, 151936, (1, n), device="cuda")
        with torch.no_grad():
            torch.cuda.synchronize()
            t0 = time.time()
            out = model(ids, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
            prefill = time.time() - t0
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            times = []
            for i in range(20):
                torch.cuda.synchronize()
                t0 = time.time()
                out = model(tok, past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
                torch.cuda.synchronize()
                times.append(time.time() - t0)
        print(f"{n:9d} | {prefill:9.2f} | {1e3 * statistics.median(times[4:]):15.1f}", flush=True)
        del out, past
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
