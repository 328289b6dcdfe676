#!/usr/bin/env python3
"""Writes a GGUF of random weights of Llama-3.1-8B's shape (vocab of the tokenizer given) for the
GPU comparison with llama.cpp (tests/bench/gpu_vs_llamacpp.sh): llama.cpp reads it as it is and
./export reads the same file, so both runners multiply the same numbers. --shape smollm2: the
shape of SmolLM2-135M (tied embeddings) instead, for the CPU comparison on a machine the real
model cannot be copied to (tests/bench/cpu_vs_llamacpp.sh; the speed does not depend on the values).

  gguf_random.py TOKENIZER.gguf OUT.gguf bf16|q8_0|q4_k|q4_0 [--layers N] [--shape smollm2]
  gguf_random.py MODEL.gguf OUT.gguf tokenizer     # OUT: MODEL's tokenizer metadata alone (small)

TOKENIZER.gguf: a GGUF whose tokenizer.* metadata is copied (the pack step makes one from
SmolLM2's, 49152 tokens). Matrices: bf16 values of a N(0, 0.02)-like spread; q8_0 / q4_k / q4_0: random
blocks with small fixed scales (every matrix in that type, the embedding and the output Q8_0 for
q4_k and q4_0: the same choice as ./run --synthetic --quant). Norm weights are fp32 ones. The content does
not matter for speed; the values are sane so that nothing overflows. Needs gguf-py (the llama.cpp
source's gguf-py on sys.path) and numpy."""
import sys

import numpy as np

from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter

DIM, HIDDEN, HEADS, KV_HEADS, LAYERS = 4096, 14336, 32, 8, 32
SHAPES = {  # dim, hidden, heads, kv heads, layers, rope theta, context, tied embeddings
    "llama3.1-8b": (4096, 14336, 32, 8, 32, 500000.0, 131072, False),
    "smollm2": (576, 1536, 9, 3, 30, 100000.0, 8192, True),
}
rng = np.random.default_rng(7)
_pool = {}


def pool_bytes(n):
    """n random bytes: slices of one random buffer (fast; the values only need to be sane)."""
    if "b" not in _pool:
        _pool["b"] = rng.integers(0, 256, size=1 << 27, dtype=np.uint8)
    b = _pool["b"]
    off = int(rng.integers(0, len(b) // 2))
    reps = -(-n // (len(b) - off))
    return np.tile(b[off:], reps)[:n] if reps > 1 else b[off:off + n].copy()


def bf16_matrix(rows, cols):
    if "w" not in _pool:  # bf16 bits of N(0, 0.02) values
        f = (rng.standard_normal(1 << 24, dtype=np.float32) * 0.02).view(np.uint32)
        _pool["w"] = (f >> 16).astype(np.uint16)
    w = _pool["w"]
    off = int(rng.integers(0, len(w)))
    return np.resize(np.roll(w, off), rows * cols).reshape(rows, cols)


def quant_matrix(rows, cols, qt):
    if qt == Q.Q8_0:  # blocks of 32: fp16 d, 32 int8
        nb, size = cols // 32, 34
        blk = pool_bytes(rows * nb * size).reshape(rows * nb, size)
        blk[:, 0:2] = np.frombuffer(np.float16(0.02 / 127).tobytes(), dtype=np.uint8)
    elif qt == Q.Q4_0:  # blocks of 32: fp16 d, 16 bytes of nibbles
        nb, size = cols // 32, 18
        blk = pool_bytes(rows * nb * size).reshape(rows * nb, size)
        blk[:, 0:2] = np.frombuffer(np.float16(0.02 / 8).tobytes(), dtype=np.uint8)
    else:  # Q4_K, super-blocks of 256: fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
        nb, size = cols // 256, 144
        blk = pool_bytes(rows * nb * size).reshape(rows * nb, size)
        blk[:, 0:2] = np.frombuffer(np.float16(0.004 / 63).tobytes(), dtype=np.uint8)
        blk[:, 2:4] = np.frombuffer(np.float16(0.03 / 63).tobytes(), dtype=np.uint8)
    return blk.reshape(rows, nb * size)


def copy_tokenizer(tok, w):
    """tokenizer.* metadata of reader tok into writer w; returns the vocabulary size."""
    vocab = None
    for name, field in tok.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vt = field.types[0]
        if vt == GGUFValueType.ARRAY:
            et = field.types[1]
            vals = [bytes(field.parts[i]).decode("utf-8", "replace") if et == GGUFValueType.STRING else field.parts[i][0].item()
                    for i in field.data]
            w.add_array(name, vals)
            if name == "tokenizer.ggml.tokens":
                vocab = len(vals)
        elif vt == GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            w.add_key_value(name, field.parts[field.data[0]][0].item(), vt)
    if vocab is None:
        sys.exit("the tokenizer GGUF has no tokenizer.ggml.tokens")
    return vocab


def main():
    if len(sys.argv) < 4 or sys.argv[3] not in ("bf16", "q8_0", "q4_k", "q4_0", "tokenizer"):
        sys.exit(__doc__)
    tok_path, out, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    shape = sys.argv[sys.argv.index("--shape") + 1] if "--shape" in sys.argv else "llama3.1-8b"
    if shape not in SHAPES:
        sys.exit(f"--shape: one of {', '.join(SHAPES)}")
    global DIM, HIDDEN, HEADS, KV_HEADS
    DIM, HIDDEN, HEADS, KV_HEADS, layers, theta, ctx, tied = SHAPES[shape]
    layers = int(sys.argv[sys.argv.index("--layers") + 1]) if "--layers" in sys.argv else layers
    w = GGUFWriter(out, "llama")
    vocab = copy_tokenizer(GGUFReader(tok_path), w)
    if kind == "tokenizer":
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
        return
    w.add_name(f"random {shape} shape, {kind}")
    w.add_block_count(layers)
    w.add_context_length(ctx)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(DIM // HEADS)
    w.add_vocab_size(vocab)
    w.add_file_type({"bf16": 32, "q8_0": 7, "q4_k": 15, "q4_0": 2}[kind])

    mat_q = {"bf16": None, "q8_0": Q.Q8_0, "q4_k": Q.Q4_K, "q4_0": Q.Q4_0}[kind]
    edge_q = {"bf16": None, "q8_0": Q.Q8_0, "q4_k": Q.Q8_0, "q4_0": Q.Q8_0}[kind]

    def matrix(name, rows, cols, qt):
        if qt is None:
            w.add_tensor(name, bf16_matrix(rows, cols), raw_dtype=Q.BF16)
        else:
            w.add_tensor(name, quant_matrix(rows, cols, qt), raw_dtype=qt)

    ones = np.ones(DIM, dtype=np.float32)
    matrix("token_embd.weight", vocab, DIM, edge_q)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        matrix(f"blk.{i}.attn_q.weight", DIM, DIM, mat_q)
        matrix(f"blk.{i}.attn_k.weight", DIM // HEADS * KV_HEADS, DIM, mat_q)
        matrix(f"blk.{i}.attn_v.weight", DIM // HEADS * KV_HEADS, DIM, mat_q)
        matrix(f"blk.{i}.attn_output.weight", DIM, DIM, mat_q)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        matrix(f"blk.{i}.ffn_gate.weight", HIDDEN, DIM, mat_q)
        matrix(f"blk.{i}.ffn_up.weight", HIDDEN, DIM, mat_q)
        matrix(f"blk.{i}.ffn_down.weight", DIM, HIDDEN, mat_q)
    w.add_tensor("output_norm.weight", ones)
    if not tied:
        matrix("output.weight", vocab, DIM, edge_q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()


if __name__ == "__main__":
    main()
