#!/usr/bin/env python3
"""Regenerates the fuzz seed corpora (tests/fuzz/corpus/NAME/) from real files: the tiny
checkpoints and tokenizers of tests/data, model.bin files ./export makes of them, and two tiny
GGUF files written here with the `gguf` package (the one llama.cpp ships). Kept small (< 2 MB in
all): model.bin seeds are only a file's head (fuzz_modelfile reads the rest as zeros), safetensors
seeds only the JSON header (fuzz_safetensors appends zeros for the data).

    python3 tests/fuzz/make_seeds.py      # from the repository root, after `make`; needs gguf, numpy
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import quants

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
HEADER_SIZE = 192  # sizeof(FileHeader): tokenizer_offset at 152, tensors_offset 168, n_tensors 176
ENTRY_SIZE = 88    # sizeof(TensorEntry)


def put(name, fname, data):
    d = os.path.join(CORPUS, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, fname), "wb") as f:
        f.write(data)


def export(src, out, *extra):
    subprocess.run([os.path.join(ROOT, "export"), src, out, *extra], check=True, capture_output=True)
    return open(out, "rb").read()


def modelbin_parts(blob):
    tok_off, tok_size, tens_off = struct.unpack_from("<QQQ", blob, 152)
    n_tensors, = struct.unpack_from("<I", blob, 176)
    return blob[tok_off:tok_off + tok_size], blob[:tens_off + n_tensors * ENTRY_SIZE]


def hf_tokens(tok_dir):
    """tokens (byte-level strings in id order), GGUF types, merges 'a b', bos, eos of a tokenizer.json."""
    tj = json.load(open(os.path.join(tok_dir, "tokenizer.json")))
    tc = json.load(open(os.path.join(tok_dir, "tokenizer_config.json")))
    vocab = dict(tj["model"]["vocab"])
    n = max(list(vocab.values()) + [a["id"] for a in tj["added_tokens"]]) + 1
    tokens, types = ["[UNUSED%d]" % i for i in range(n)], [5] * n
    for s, i in vocab.items():
        tokens[i], types[i] = s, 1
    for a in tj["added_tokens"]:
        tokens[a["id"]], types[a["id"]] = a["content"], 3 if a["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    text = lambda v: v if isinstance(v, str) or v is None else v["content"]
    bos, eos = text(tc.get("bos_token")), text(tc.get("eos_token"))
    return tokens, types, merges, tokens.index(bos) if bos else None, tokens.index(eos), tc.get("chat_template")


def gguf_writer(path, arch, tok_dir, pre, shape, rope_base):
    """A GGUFWriter with the hyperparameters of shape (dim, heads, kv, hd, hidden, layers) and the
    tokenizer of tok_dir (byte-level BPE, pre-tokenizer pre). Returns it, the tokens and the chat
    template (not written)."""
    tokens, types, merges, bos, eos, template = hf_tokens(tok_dir)
    dim, heads, kv, hd, hidden, layers = shape
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(hidden)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(rope_base)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    return w, tokens, template


def write_gguf(path, arch, tok_dir, pre, qtypes, tied, rope_freqs, shape=(32, 2, 1, 16, 64, 1)):
    dim, heads, kv, hd, hidden, layers = shape
    w, tokens, template = gguf_writer(path, arch, tok_dir, pre, shape, 10000.0)
    if template:
        w.add_chat_template(template)
    rng = np.random.default_rng(0)

    def t(name, shape, qt):
        x = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if qt in ("F32",):
            w.add_tensor(name, x)
        elif qt == "F16":
            w.add_tensor(name, x.astype(np.float16))
        else:
            q = getattr(gguf.GGMLQuantizationType, qt)
            w.add_tensor(name, quants.quantize(x, q), raw_dtype=q)

    t("token_embd.weight", (len(tokens), dim), qtypes[0])
    if rope_freqs:
        t("rope_freqs.weight", (hd // 2,), "F32")
    for l in range(layers):
        p = "blk.%d." % l
        t(p + "attn_norm.weight", (dim,), "F32")
        t(p + "attn_q.weight", (heads * hd, dim), qtypes[1])
        t(p + "attn_k.weight", (kv * hd, dim), qtypes[1])
        t(p + "attn_v.weight", (kv * hd, dim), qtypes[2])
        if arch == "qwen3":
            t(p + "attn_q_norm.weight", (hd,), "F32")
            t(p + "attn_k_norm.weight", (hd,), "F32")
        t(p + "attn_output.weight", (dim, heads * hd), qtypes[2])
        t(p + "ffn_norm.weight", (dim,), "F32")
        t(p + "ffn_gate.weight", (hidden, dim), qtypes[3])
        t(p + "ffn_up.weight", (hidden, dim), qtypes[3])
        t(p + "ffn_down.weight", (dim, hidden), qtypes[4])
    t("output_norm.weight", (dim,), "F32")
    if not tied:
        t("output.weight", (len(tokens), dim), qtypes[4])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def chat_seeds(texts):
    shared = os.path.join(ROOT, "..", "shared", "tokenizers", "templates")
    smol = json.load(open(os.path.join(DATA, "smollm2-tokenizer", "tokenizer_config.json")))["chat_template"]
    templates = [(0, smol.encode())]  # (family: 0 ChatML, 1 Llama 3, 2 Qwen3, template)
    for fam, name in ((1, "meta-llama-Llama-3.1-8B-Instruct.jinja"), (1, "meta-llama-Llama-3.2-3B-Instruct.jinja"),
                      (2, "Qwen-Qwen3-0.6B.jinja")):
        path = os.path.join(shared, name)
        if os.path.exists(path):
            templates.append((fam, open(path, "rb").read()))
    convs = []
    for f in sorted(os.listdir(os.path.join(DATA, "chat"))):
        for case in json.load(open(os.path.join(DATA, "chat", f)))["cases"]:
            conv = [{"system": b"S", "user": b"U", "assistant": b"A"}.get(m["role"], b"T") + m["content"].encode()
                    for m in case["messages"]]
            if conv not in convs:
                convs.append(conv)
    convs.append([b"U" + texts[1], b"A<think>\nhmm\n</think>\n\n" + texts[0], b"U<tool_response>x</tool_response>"])
    # --render-chat files: the same conversations as JSON, and a few that must be refused
    jsons = []
    for f in sorted(os.listdir(os.path.join(DATA, "chat"))):
        for case in json.load(open(os.path.join(DATA, "chat", f)))["cases"]:
            j = json.dumps(case["messages"], ensure_ascii=False).encode()
            if j not in jsons:
                jsons.append(j)
    jsons += [b'{"role": "user"}', b'[{"role": "user", "content": 5}]', b'[{"role": "user", "content": "a\\u0000b"}]',
              b'[{"role": "user", "content": "x", "name": "y"}]', b'[{"role": "tool", "content": "x"}]', b'[]',
              b'[{"role": "user", "content": "\xff\xfe"}]']
    for i, j in enumerate(jsons[:16]):
        put("render_chat", "msgs%02d" % i, bytes([i % 3 | (i % 4) << 2]) + j)
    for i, conv in enumerate(convs[:12]):
        fam, tpl = templates[i % len(templates)]
        flags = fam | (i % 3) << 2 | (i & 1) << 4 | (fam == 1) << 5
        put("chat", "conv%02d" % i, bytes([flags]) + b"\0".join([tpl] + conv))


def main():
    shutil.rmtree(CORPUS, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix="pkv-seeds-")
    try:
        # model.bin heads and tokenizer sections
        sections = {}
        for name, extra in (("tiny-qwen3", ()), ("tiny-llama31", ()), ("tiny-llama-fp16", ("--dtype", "f32"))):
            blob = export(os.path.join(DATA, name), os.path.join(tmp, name + ".bin"), *extra)
            sections[name], head = modelbin_parts(blob)
            put("modelfile", name, head)
            put("tokenizer", "section-" + name, b"\x00" + sections[name])
        # GGUF: llama with quantized matrices and rope_freqs; qwen3 with bf16 / f16, tied head
        for fname, args in (("tiny-llama-q.gguf", ("llama", "tiny-llama31", "llama-bpe", ("Q8_0", "Q4_0", "Q4_1", "Q8_0", "F16"), False, True)),
                            ("tiny-qwen3-bf16.gguf", ("qwen3", "tiny-qwen3", "qwen2", ("BF16", "F16", "BF16", "F32", "BF16"), True, False))):
            p = os.path.join(tmp, fname)
            write_gguf(p, args[0], os.path.join(DATA, args[1]), *args[2:])
            export(p, os.path.join(tmp, fname + ".bin"))  # the seed must be a file ./export accepts
            put("gguf", fname, open(p, "rb").read())
            put("modelfile", fname, modelbin_parts(open(os.path.join(tmp, fname + ".bin"), "rb").read())[1])
        # model.bin heads with quantized matrices (format 2): tiny-qwen3 in Q8_0, and a dim-256
        # qwen3 (Q4_K needs rows of 256) in Q4_K, its embedding and head Q8_0
        blob = export(os.path.join(DATA, "tiny-qwen3"), os.path.join(tmp, "q8.bin"), "--quant", "q8_0")
        put("modelfile", "tiny-qwen3-q8_0", modelbin_parts(blob)[1])
        p = os.path.join(tmp, "k.gguf")
        write_gguf(p, "qwen3", os.path.join(DATA, "tiny-qwen3"), "qwen2", ("F32",) * 5, False, False,
                   shape=(256, 4, 2, 64, 512, 1))
        put("modelfile", "qwen3-q4_k", modelbin_parts(export(p, os.path.join(tmp, "k.bin"), "--quant", "q4_k"))[1])
        # safetensors: the JSON header, with the data size as the zero padding to append
        for name in ("tiny-qwen3", "tiny-llama-fp16"):
            blob = open(os.path.join(DATA, name, "model.safetensors"), "rb").read()
            hlen, = struct.unpack_from("<Q", blob, 0)
            put("safetensors", name, b"\x00" + struct.pack("<I", len(blob) - 8 - hlen) + blob[:8 + hlen])
        put("safetensors", "index-tiny-llama31", b"\x01" + open(os.path.join(DATA, "tiny-llama31", "model.safetensors.index.json"), "rb").read())
        # Hugging Face JSON files, each with its selector byte (bit 2: the model)
        for m, model in enumerate(("tiny-qwen3", "tiny-llama31")):
            for f, fname in enumerate(("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")):
                put("hf_json", "%s-%s" % (model, fname), bytes([f | m << 2]) + open(os.path.join(DATA, model, fname), "rb").read())
        # texts and ids for the real tokenizers (0 SmolLM2, 1 Qwen3-style, 2 Llama 3-style)
        texts = [
            b"Once upon a time, there was a little girl named Lily. She's 12345 years old; isn't that odd?\n\n",
            "Grüße, 日本語のテキスト, emoji 😀👍🏽, Ελληνικά, русский, e\u0301 vs é, ﬁ ligature".encode(),
            b"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|begin_of_text|><|eot_id|>",
            b"  leading spaces\t\ttabs\r\n\r\n   trailing   \n\n\n123 4567 89.0 'll 're 'VE ''s",
            b"broken utf-8: \xff\xfe \xc3 \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf end",
            b"def f(x):\n    return x**2  # comment\n\tif (a && b) { c[i] = d->e; }\n",
        ]
        for i, text in enumerate(texts):
            for tk in range(3):
                put("tokenizer", "text%d-tok%d" % (i, tk), bytes([1 | (0x80 if i == 2 else 0), tk]) + text)
        ids = struct.pack("<12i", 0, 1, 2, 255, 256, 300, 399, 400, 401, -1, 1 << 30, 12)
        for tk in range(3):
            put("tokenizer", "ids-tok%d" % tk, bytes([2, tk]) + ids)
        # chat: the real templates, with conversations of the chat tests (tests/data/chat)
        chat_seeds(texts)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(CORPUS) for f in fs)
    print("corpus: %d bytes" % total)


if __name__ == "__main__":
    sys.exit(main())
