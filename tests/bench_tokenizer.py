#!/usr/bin/env python3
"""Benchmark (not a test): encode a ~1 MB text with the C tokenizer (build/tests/tok_tool --bench,
which times tokenizer_encode alone) and with Hugging Face `tokenizers` (Tokenizer.encode on the
same single string), for each tokenizer of tests/test_tokenizer_hf.py; prints a table.

usage: python3 tests/bench_tokenizer.py [MEGABYTES]
"""
import os
import random
import subprocess
import sys
import tempfile
import time

from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_tokenizer_hf import CODE, TOK_TOOL, TOKENIZERS, WORDS, fragment  # noqa: E402


def make_text(size, seed=1):
    """Mostly English-like prose with numbers and punctuation, some code and other scripts."""
    rng = random.Random(seed)
    english = [w for w in WORDS if w.isascii()] + ["and", "of", "to", "in", "is", "that", "for", "it", "was"]
    parts, n = [], 0
    while n < size:
        r = rng.random()
        if r < 0.80:
            s = " ".join(rng.choice(english) for _ in range(rng.randint(5, 20))) + rng.choice([". ", ", ", "! ", "? "])
            if rng.random() < 0.2:
                s += str(rng.randint(0, 10 ** rng.randint(1, 8))) + " "
            if rng.random() < 0.1:
                s += "\n\n"
        elif r < 0.90:
            s = rng.choice(CODE)
        else:
            s = "".join(fragment(rng) for _ in range(5)) + " "
        parts.append(s)
        n += len(s.encode("utf-8"))
    return "".join(parts)


def main():
    mb = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    text = make_text(int(mb * 1e6))
    data = text.encode("utf-8")
    print(f"text: {len(data) / 1e6:.2f} MB, {len(text)} characters")
    print(f"{'tokenizer':<10} {'ids':>9} {'C (s)':>8} {'C MB/s':>8} {'HF (s)':>8} {'HF MB/s':>8}  same ids")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.txt")
        with open(path, "wb") as f:
            f.write(data)
        for name, tok_dir in TOKENIZERS.items():
            out = subprocess.run([TOK_TOOL, tok_dir, "--bench", path], capture_output=True, text=True, check=True)
            c_s, c_n = out.stdout.split()
            c_s = float(c_s)
            hf = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
            t0 = time.perf_counter()
            ids = hf.encode(text, add_special_tokens=False).ids
            hf_s = time.perf_counter() - t0
            ours = subprocess.run([TOK_TOOL, tok_dir, path], capture_output=True, text=True, check=True).stdout
            same = [int(x) for x in ours.split()] == ids
            mbs = len(data) / 1e6
            print(f"{name:<10} {int(c_n):>9} {c_s:>8.3f} {mbs / c_s:>8.1f} {hf_s:>8.3f} {mbs / hf_s:>8.1f}  {same}")


if __name__ == "__main__":
    main()
