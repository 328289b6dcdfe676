"""Tiny random-weight Hugging Face checkpoints of any vocabulary size, written with the standard
library only, for tests that need a model.bin around a real tokenizer (Llama 3's 128256 tokens,
Qwen3's 151669, a SentencePiece model trained at test time). The weights mean nothing: they
only have to load and run. Used by tests/test_chat*.py and tests/test_sentencepiece.py.
"""
import json
import os
import random
import shutil
import struct
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORT = os.path.join(os.environ.get("PKV_BIN", ROOT), "export")  # PKV_BIN: the sanitizer build

# float32 byte 3 = sign and the exponent's top 7 bits: 0x3C gives magnitudes in [2^-7, 2^-5).
_EXP_BYTE = bytes((b & 0x80) | 0x3C for b in range(256))


def _random_f32(n, rng):
    """n float32 values of random sign and magnitude in [2^-7, 2^-5), as bytes (fast: no per-value Python)."""
    b = bytearray(rng.randbytes(4 * n))
    b[3::4] = bytes(b[3::4]).translate(_EXP_BYTE)
    return bytes(b)


def _write_safetensors(path, tensors):
    """tensors: list of (name, shape, f32 bytes)."""
    header, offset = {}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, data in tensors:
            f.write(data)


def write_checkpoint(out_dir, arch, vocab_size, dim=16, layers=1, heads=2, kv_heads=1, head_dim=8, ffn=32,
                     max_pos=8192, seed=0):
    """Writes config.json and model.safetensors (tied embeddings) for arch 'llama' or 'qwen3'."""
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(seed)
    ones = lambda n: struct.pack(f"<{n}f", *([1.0] * n))
    t = [("model.embed_tokens.weight", [vocab_size, dim], _random_f32(vocab_size * dim, rng)),
         ("model.norm.weight", [dim], ones(dim))]
    for l in range(layers):
        p = f"model.layers.{l}."
        t += [(p + "input_layernorm.weight", [dim], ones(dim)),
              (p + "post_attention_layernorm.weight", [dim], ones(dim)),
              (p + "self_attn.q_proj.weight", [heads * head_dim, dim], _random_f32(heads * head_dim * dim, rng)),
              (p + "self_attn.k_proj.weight", [kv_heads * head_dim, dim], _random_f32(kv_heads * head_dim * dim, rng)),
              (p + "self_attn.v_proj.weight", [kv_heads * head_dim, dim], _random_f32(kv_heads * head_dim * dim, rng)),
              (p + "self_attn.o_proj.weight", [dim, heads * head_dim], _random_f32(dim * heads * head_dim, rng)),
              (p + "mlp.gate_proj.weight", [ffn, dim], _random_f32(ffn * dim, rng)),
              (p + "mlp.up_proj.weight", [ffn, dim], _random_f32(ffn * dim, rng)),
              (p + "mlp.down_proj.weight", [dim, ffn], _random_f32(dim * ffn, rng))]
        if arch == "qwen3":
            t += [(p + "self_attn.q_norm.weight", [head_dim], ones(head_dim)),
                  (p + "self_attn.k_norm.weight", [head_dim], ones(head_dim))]
    _write_safetensors(os.path.join(out_dir, "model.safetensors"), t)
    config = {"architectures": ["Qwen3ForCausalLM" if arch == "qwen3" else "LlamaForCausalLM"],
              "hidden_act": "silu", "hidden_size": dim, "intermediate_size": ffn, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
              "vocab_size": vocab_size, "max_position_embeddings": max_pos, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "tie_word_embeddings": True}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def build_model(tmp, name, arch, vocab_size, tokenizer_files, chat_template=None, **kw):
    """A checkpoint in tmp/name with copies of tokenizer_files (paths, or (path, name in the checkpoint)
    pairs), the chat template set in its
    tokenizer_config.json when given, exported to tmp/name.bin. Returns the .bin path; raises on failure."""
    d = os.path.join(tmp, name)
    write_checkpoint(d, arch, vocab_size, **kw)
    for src in tokenizer_files:
        src, dst = src if isinstance(src, tuple) else (src, os.path.basename(src))
        shutil.copy(src, os.path.join(d, dst))
    if chat_template is not None:
        cfg_path = os.path.join(d, "tokenizer_config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg["chat_template"] = chat_template
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
    out = os.path.join(tmp, name + ".bin")
    p = subprocess.run([EXPORT, d, out], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"export of {name} failed: {p.stderr.strip()[-500:]}")
    return out
