#!/usr/bin/env python3
"""SentencePiece tokenizers (the Llama 2 / Mistral / TinyLlama family) against the library's own
command-line tools, on models trained here with spm_train (Debian package `sentencepiece`):

  - a Llama 2-style unigram model (byte fallback, split digits, identity normalization, a
    user-defined symbol) and a BPE model with the default NFKC normalization and no byte
    fallback (unknown characters become <unk>);
  - each inside a tiny checkpoint whose directory has tokenizer.model and no tokenizer.json,
    exported to model.bin: ids of many texts must equal `spm_encode --output_format=id`, through
    the tokenizer import (build/tests/tok_tool) and through ./run --tokenize on model.bin;
  - decoding gives the text back (with the dummy-prefix space) for the byte-fallback model;
  - tokenizer.json that is not byte-level beside tokenizer.model: SentencePiece is chosen;
    tokenizer_config.json's add_bos_token is honoured (BOS prepended by default);
  - a tokenizer.model that is not a model proto is refused with one 'error:' line.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_checkpoint import ROOT, EXPORT, write_checkpoint  # noqa: E402

RUN = os.path.join(os.environ.get("PKV_BIN", ROOT), "run")  # PKV_BIN: the sanitizer build
TOK_TOOL = os.environ.get("TOK_TOOL") or os.path.join(ROOT, "build", "tests", "tok_tool")
SEP = "\n__ggml_vocab_test__\n"

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    passed += ok
    failed += not ok
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))


WORDS = ("the quick brown fox jumps over a lazy dog while language models read tokens and "
         "café naïve über straße façade résumé 東京 日本語 中文 привет мир Ελληνικά שלום مرحبا "
         "hello world 2024 3.14 1,000,000 don't it's we'll").split()


def corpus(path, rng):
    with open(path, "w") as f:
        for _ in range(4000):
            f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) + "\n")


TEXTS = ["Hello world", "the quick brown fox", "  leading and trailing spaces  ", "multiple   inner    spaces",
         "café naïve über", "東京 日本語 中文", "numbers 12345 and 3.14159 and 1,000,000", "don't it's we'll",
         "emoji 😀👍🏽 and rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ﬁ ligature", "fullwidth ＡＢＣ１２３", "tabs\tand\tmore", "<tool> is user-defined",
         "<s> and </s> stay text", "x", "a" * 300, "ẞ Ǆ ǅ ǆ combining e\u0301 a\u0308", "Привет, мир! Ελληνικά שלום مرحبا"]


def status(rc):
    return f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"


def id_lines(what, out, n):
    """n lines of ids, each ended by a newline: fewer (or more) is an error, not a shorter comparison."""
    lines = out.split("\n")
    if lines[-1] != "" or len(lines) - 1 != n:
        raise RuntimeError(f"{what}: {len(lines) - 1} lines{'' if lines[-1] == '' else ' (last unterminated)'} "
                           f"for {n} texts")
    return [[int(x) for x in line.split()] for line in lines[:-1]]


def spm_encode(model, texts):
    p = subprocess.run(["spm_encode", f"--model={model}", "--output_format=id"], input="\n".join(texts) + "\n",
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"spm_encode: {status(p.returncode)}: {p.stderr[-400:]}")
    return id_lines("spm_encode", p.stdout, len(texts))


def tok_tool(args, data):
    """tok_tool's stdout; it must exit 0 (a sanitizer report, 23, or a signal is a failure)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(data)
    try:
        p = subprocess.run([TOK_TOOL] + args + [f.name], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(f.name)
    if p.returncode != 0:
        raise RuntimeError(f"tok_tool {' '.join(args[1:])}: {status(p.returncode)} (want 0): {p.stderr[-400:]}")
    return p.stdout


def train(tmp, name, args, rng):
    data = os.path.join(tmp, "corpus.txt")
    if not os.path.exists(data):
        corpus(data, rng)
    prefix = os.path.join(tmp, name)
    p = subprocess.run(["spm_train", f"--input={data}", f"--model_prefix={prefix}", "--minloglevel=2",
                        "--hard_vocab_limit=false"] + args,
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"spm_train {name}: {p.stderr[-400:]}")
    return prefix + ".model"


def checkpoint(tmp, name, model, extra=None):
    """HF dir with tokenizer.model (and the extra files {name: text}), exported. Returns (dir, bin, stderr,
    export's exit status); bin is None unless the export exited 0."""
    d = os.path.join(tmp, name)
    n_pieces = sum(1 for _ in open(model[:-len(".model")] + ".vocab", encoding="utf-8"))
    write_checkpoint(d, "llama", n_pieces + 8)  # a little padding, as real models have
    shutil.copy(model, os.path.join(d, "tokenizer.model"))
    for fname, text in (extra or {}).items():
        with open(os.path.join(d, fname), "w") as f:
            f.write(text)
    out = d + ".bin"
    p = subprocess.run([EXPORT, d, out], capture_output=True, text=True, timeout=120)
    return d, out if p.returncode == 0 else None, p.stderr, p.returncode


def prompt_tokens(model_bin, text):
    """The prompt length ./run reports for text (BOS included when the model adds one); ./run must exit 0."""
    p = subprocess.run([RUN, model_bin, "-p", text, "-n", "1", "--temp", "0"], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"./run -p: {status(p.returncode)} (want 0): {p.stderr[-400:]}")
    for line in p.stderr.splitlines():
        if line.startswith("prompt "):
            return int(line.split()[1])
    return None


def test_model(tmp, name, model, decodes_back):
    d, model_bin, err, _ = checkpoint(tmp, name, model)
    check(f"{name}: export of a directory with tokenizer.model and no tokenizer.json", model_bin is not None, err)
    if not model_bin:
        return
    want = spm_encode(model, TEXTS)
    got = id_lines("tok_tool --lines", tok_tool([d, "--lines"], "".join(t + SEP for t in TEXTS)), len(TEXTS))
    for text, g, w in zip(TEXTS, got, want, strict=True):
        check(f"{name}: ids of {text[:40]!r} equal spm_encode's ({len(w)} ids)", g == w, f"got {g[:12]}, want {w[:12]}")
    for text, w in list(zip(TEXTS, want, strict=True))[:4]:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        r = subprocess.run([RUN, model_bin, "--tokenize", "-f", f.name], capture_output=True, text=True, timeout=60)
        os.unlink(f.name)
        check(f"{name}: ./run --tokenize on model.bin gives spm_encode's ids for {text[:30]!r}",
              r.returncode == 0 and [int(x) for x in r.stdout.split()] == w,
              f"{status(r.returncode)}, stdout {r.stdout[:100]!r}, stderr {r.stderr[-200:]!r}")
    if decodes_back:
        texts = tok_tool([d, "--decode-lines"], "\n".join(" ".join(map(str, w)) for w in want) + "\n").split(SEP)
        if texts[-1] != "" or len(texts) - 1 != len(TEXTS):
            raise RuntimeError(f"tok_tool --decode-lines: {len(texts) - 1} texts for {len(TEXTS)} id lists")
        for text, back in zip(TEXTS, texts[:-1], strict=True):
            check(f"{name}: decoding {text[:30]!r} gives it back after the dummy-prefix space",
                  back == " " + text, f"got {back[:60]!r}")
    n = prompt_tokens(model_bin, TEXTS[0])
    check(f"{name}: generation runs, BOS prepended by default (prompt {n} = 1 + {len(want[0])})", n == len(want[0]) + 1)
    chat = subprocess.run([RUN, model_bin, "--chat"], input="hi\n", capture_output=True, text=True, timeout=60)
    check(f"{name}: --chat without a template is refused (exit 1)", chat.returncode == 1 and
          chat.stderr.startswith("error: ") and "chat template" in chat.stderr,
          f"{status(chat.returncode)}, stderr {chat.stderr[-300:]!r}")


def main():
    if not shutil.which("spm_train") or not shutil.which("spm_encode"):
        print("FAIL spm_train / spm_encode not found (Debian package sentencepiece)")
        print("0 passed, 1 failed")
        return 1
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="pkv-spm-") as tmp:
        try:
            run_all(tmp, rng)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
            check("the tests ran to the end", False, str(e)[-400:])
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def guarded(name, fn, *args):
    """Runs one part; a tool that failed (RuntimeError) fails that part, and the others still run."""
    try:
        fn(*args)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        check(f"{name} ran to the end", False, str(e)[-400:])


def run_all(tmp, rng):
    llama2 = train(tmp, "llama2", ["--model_type=unigram", "--vocab_size=420", "--byte_fallback=true",
                                   "--split_digits=true", "--normalization_rule_name=identity",
                                   "--remove_extra_whitespaces=false", "--user_defined_symbols=<tool>"], rng)
    bpe = train(tmp, "bpe", ["--model_type=bpe", "--vocab_size=300", "--character_coverage=0.995"], rng)
    guarded("unigram+bytes", test_model, tmp, "unigram+bytes", llama2, True)
    guarded("bpe+nfkc", test_model, tmp, "bpe+nfkc", bpe, False)
    guarded("tokenizer.json beside tokenizer.model", test_with_json, tmp, llama2)
    guarded("junk tokenizer.model", test_junk, tmp, llama2)


def test_with_json(tmp, llama2):
    # tokenizer.json beside it that is not byte-level (Llama 2 ships both): SentencePiece wins.
    extra = {"tokenizer.json": json.dumps({"model": {"type": "BPE", "byte_fallback": True},
                                           "decoder": {"type": "Sequence", "decoders": []}}),
             "tokenizer_config.json": json.dumps({"add_bos_token": False, "bos_token": "<s>", "eos_token": "</s>"})}
    d, model_bin, err, _ = checkpoint(tmp, "with-json", llama2, extra)
    check("tokenizer.json (not byte-level) + tokenizer.model: exported as SentencePiece", model_bin is not None, err)
    if model_bin:
        want = spm_encode(llama2, [TEXTS[0]])[0]
        n = prompt_tokens(model_bin, TEXTS[0])
        check(f"add_bos_token false is honoured (prompt {n} = {len(want)} ids, no BOS)", n == len(want))


def test_junk(tmp, llama2):
    bad = os.path.join(tmp, "junk.model")
    with open(bad, "wb") as f:
        f.write(os.urandom(3000))
    shutil.copy(llama2[:-len(".model")] + ".vocab", bad[:-len(".model")] + ".vocab")
    _, model_bin, err, rc = checkpoint(tmp, "junk", bad)
    lines = [l for l in err.splitlines() if l.startswith("error: ")]
    check("a tokenizer.model that is not a SentencePiece proto is refused in one line, exit 1",
          rc == 1 and len(lines) == 1 and "SentencePiece" in lines[0], f"{status(rc)}, stderr {err[-300:]!r}")


if __name__ == "__main__":
    sys.exit(main())
