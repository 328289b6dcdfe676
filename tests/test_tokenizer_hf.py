#!/usr/bin/env python3
"""Compares the C tokenizer (build/tests/tok_tool) with Hugging Face `tokenizers`, id for id.

For the Llama 3 and Qwen 3 tokenizer.json in ../shared/tokenizers and the SmolLM2 one in
tests/data/smollm2-tokenizer: a seeded corpus of a few thousand varied texts (many scripts, emoji,
digit runs, Unicode white space, contractions in every case, code, URLs, special-token strings,
non-NFC text, control characters, long texts) is encoded by both; every id list must be
identical. Decoding is checked too: our decode of our ids must equal HF's decode (U+FFFD
replacements included), and give the text back wherever HF's does; random id sequences
(splitting UTF-8 characters across tokens) must decode as HF decodes them. Finally the published
llama.cpp vectors (llama-bpe -> Llama 3, qwen2 -> Qwen 3) must come out exactly.

Needs: python3 with `tokenizers`, and `make build/tests/tok_tool`. Exits 1 on any mismatch.
"""
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared", "tokenizers")
TOK_TOOL = os.environ.get("TOK_TOOL") or os.path.join(ROOT, "build", "tests", "tok_tool")
SEP = "\n__ggml_vocab_test__\n"
TOKENIZERS = {
    "llama3": os.path.join(SHARED, "llama3"),
    "qwen3": os.path.join(SHARED, "qwen3"),
    "smollm2": os.path.join(ROOT, "tests", "data", "smollm2-tokenizer"),
}
VECTORS = {"llama3": "ggml-vocab-llama-bpe.gguf", "qwen3": "ggml-vocab-qwen2.gguf"}
SHOW = 5  # mismatches shown per sub-test

# ------------------------------------------------------------------------------------------ corpus

SCRIPTS = {  # letter ranges per script (assigned characters are picked from them)
    "latin": [(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x24F), (0x1E00, 0x1EFF)],
    "cyrillic": [(0x400, 0x4FF)], "greek": [(0x370, 0x3FF), (0x1F00, 0x1FFF)],
    "arabic": [(0x600, 0x6FF), (0x750, 0x77F)], "hebrew": [(0x591, 0x5F4)],
    "devanagari": [(0x900, 0x97F)], "bengali": [(0x980, 0x9FF)], "tamil": [(0xB80, 0xBFF)],
    "thai": [(0xE00, 0xE7F)], "khmer": [(0x1780, 0x17FF)], "georgian": [(0x10A0, 0x10FF)],
    "armenian": [(0x531, 0x58A)], "ethiopic": [(0x1200, 0x137F)], "cjk": [(0x4E00, 0x9FFF), (0x3400, 0x4DBF)],
    "kana": [(0x3041, 0x30FF)], "hangul": [(0xAC00, 0xD7A3)], "jamo": [(0x1100, 0x11FF)],
    "math": [(0x1D400, 0x1D7FF)], "cjk_ext_b": [(0x20000, 0x2A6DF)], "fullwidth": [(0xFF01, 0xFF5E)],
}
NUMBERS = "0123456789²³¹¼½¾٠١٢٣٤٥٦٧٨٩०१२३४५६७८९๐๑๒๓０１２３４５６７８９ⅠⅡⅢⅫ①②⑳𝟎𝟏𝟗"
SPACES = [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", "\n\n\n", " \n", "\t\n", "\x0b", "\x0c", "\xa0",
          "\u1680", "\u2000", "\u2003", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f",
          "\u3000", "\x85", "\u200b", "\ufeff", "\u180e", " \xa0 ", " \r\n ", "\r\r\n", "\n \n"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "—", "–", "«", "»", "¿", "¡", "“", "”",
                                                     "‘", "’", "·", "•", "€", "£", "¥", "©", "®", "™", "°",
                                                     "§", "¶", "†", "‰", "→", "∑", "∞", "≠", "√", "☃", "♥"]
EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "👋🏿", "❤️", "❤", "✅", "🔥", "🎉", "👨‍👩‍👧‍👦", "🧑🏽‍💻",
         "🏳️‍🌈", "🇫🇷", "🇯🇵🇺🇸", "1️⃣", "#️⃣", "🤷‍♀️", "👩‍❤️‍💋‍👨", "🫠", "🦀", "🐍", "☕", "🀄"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'rE", "'VE", "'Ve",
                "'M", "'LL", "'Ll", "'lL", "'D", "'ſ", "'ﬆ", "'K", "'x", "'", "''", "'''", "’s", "'st"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|begin_of_text|>", "<|end_of_text|>",
           "<|start_header_id|>", "<|end_header_id|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
           "</tool_call>", "<|fim_prefix|>", "<|reserved_special_token_7|>", "<|python_tag|>", "<repo_name>",
           "<|im_sta", "<|im_start|", "<<|im_start|>>", "<think", "<|eot_id|><|eot_id|>", "|>", "<|"]
COMBINING = ["e\u0301", "A\u030a", "\u212b", "\u2126", "\u1e0b\u0323", "\u1e0d\u0307", "a\u0301\u0316",
             "o\u0308\u0304", "\u1100\u1161\u11a8", "\u0915\u093c", "\u0958", "ﬁ", "Å", "n\u0303",
             "\u0041\u0308\u0301", "\u03d3", "\u00c7\u0301", "\u05d0\u05b7", "\u0627\u0653", "\u0300",
             "\u0301\u0301", "\u3099", "\u304b\u3099", "\u30cf\u309a", "e\u0301\u0301", "<think>\u0338"]
CODE = [
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; i++) {\n\tsum += x[i] * 2;\n}\n",
    "const f = async (x) => { await g(x?.y ?? 0); };",
    "<div class=\"a\">Hello &amp; bye</div>\r\n",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;",
    "if __name__ == '__main__':\n    main()\n",
    "    \n        \n\t\t\n",
    "x=1;y=2;z=x**y//3%4",
    "#include <stdio.h>\nint main(void){printf(\"%d\\n\", 42);}",
    "fn main() { let v: Vec<u8> = vec![1, 2, 3]; println!(\"{:?}\", v); }",
    "{\"key\": [1, 2.5, -3e10, null, true], \"s\": \"a\\u00e9\"}",
]
URLS = ["https://example.com/path?q=1&r=abc#frag", "http://127.0.0.1:8080/", "user@mail.example.org",
        "ftp://files.example.net/pub/file-1.2.3.tar.gz", "/usr/local/lib/python3.11/site-packages",
        "C:\\Windows\\System32\\drivers", "www.日本.jp/パス", "mailto:a.b+c@d.co.uk"]
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "World", "naïve", "café",
         "Straße", "İstanbul", "ǅemal", "ÆSIR", "œuvre", "Привет", "мир", "Γειά", "σου", "مرحبا", "שלום",
         "नमस्ते", "สวัสดี", "សួស្តី", "你好", "世界", "こんにちは", "안녕하세요", "I", "A", "don", "can", "we"]


def assigned(cp):
    c = chr(cp)
    return unicodedata.category(c) not in ("Cn", "Cs", "Co")


def script_word(rng, ranges, n):
    out = []
    while len(out) < n:
        lo, hi = rng.choice(ranges)
        cp = rng.randint(lo, hi)
        if assigned(cp):
            out.append(chr(cp))
    return "".join(out)


def random_char(rng):
    while True:
        cp = rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0x7FF), rng.randint(0x800, 0xFFFF),
                         rng.randint(0x10000, 0x2FFFF), rng.randint(0xE0000, 0xE01EF)])
        if assigned(cp):
            return chr(cp)


def fragment(rng):
    kind = rng.randrange(12)
    if kind == 0:
        return script_word(rng, SCRIPTS[rng.choice(list(SCRIPTS))], rng.randint(1, 12))
    if kind == 1:
        return rng.choice(WORDS)
    if kind == 2:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 20)))
    if kind == 3:
        return "".join(rng.choice(NUMBERS) for _ in range(rng.randint(1, 6)))
    if kind == 4:
        return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 3)))
    if kind == 5:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 4)))
    if kind == 6:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 3)))
    if kind == 7:
        return rng.choice(CONTRACTIONS)
    if kind == 8:
        return rng.choice(SPECIAL)
    if kind == 9:
        return rng.choice(COMBINING)
    if kind == 10:
        return rng.choice(URLS + CODE)
    return "".join(random_char(rng) for _ in range(rng.randint(1, 5)))


def build_corpus(seed=20240521):
    rng = random.Random(seed)
    texts = ["", " ", "a", "\n", "Hello world", " Hello world", "Hello World!", "   leading", "trailing   ",
             "a  b   c", "a\tb", "x\r\ny", "\n\n\nz", "ends with newline\n", "ends with spaces  ", "  \n  ",
             "I'm", "I'M", "you're", "YOU'RE", "we'Ve", "it's", "IT'S", "they'll", "THEY'LL", "he'd", "'s",
             "ſ", "'ſ", "ǅ", "\x00", "a\x00b", "\x04\x06\x13", "\x7f\x80\x9f", "\ue000\uf8ff", "\ufffe\uffff",
             "\U0010fffd", "\ufffd", "¼½¾", "x²+y²", "Ⅻ", "١٢٣٤", "０１２", "3.14159", "1,234,567", "1e-10"]
    for n in range(1, 21):  # digit runs of every length, alone and in context
        digits = "".join(str((i * 7 + n) % 10) for i in range(n))
        texts += [digits, " " + digits, "a" + digits + "b", digits + ".", "$" + digits, digits + "px",
                  "x " + digits + " y", "\n" + digits, digits + "\n"]
    for sp in SPACES:  # every white space before and after each character class
        for c in ["a", "1", "!", "é", "你", "", "\n", "😀", "'s", sp]:
            texts += [sp + c, "x" + sp + c, c + sp, "x" + sp + sp + c]
    for c in CONTRACTIONS:
        texts += [c, c + "x", "word" + c + "abc", "WORD" + c + " more", " " + c + "x", "1" + c, c + c]
    for s in SPECIAL:
        texts += [s, "a" + s + "b", " " + s + " ", s + "\n" + s, "x " + s + "y", "<" + s + ">"]
    for s in COMBINING + EMOJI:
        texts += [s, "x" + s, s + " " + s, " " + s, s + "1"]
    texts += CODE + URLS
    for _ in range(3000):  # random mixtures of all of the above
        k = rng.choice([1, 2, 3, 5, 8, 15, 30])
        texts.append("".join(fragment(rng) for _ in range(k)))
    for name, ranges in SCRIPTS.items():  # running text in each script
        for _ in range(10):
            texts.append(" ".join(script_word(rng, ranges, rng.randint(1, 10)) for _ in range(rng.randint(1, 12))))
    for _ in range(200):  # unrestricted assigned characters
        texts.append("".join(random_char(rng) for _ in range(rng.randint(1, 40))))
    texts += [" " * 1000, "\n" * 500 + "x", "9" * 1000, "a" * 3000, "!" * 700, "ab " * 2000,
              "".join(fragment(rng) for _ in range(2000))]
    return [t for t in texts if SEP.strip() not in t]


# ------------------------------------------------------------------------------------------ helpers

def run_tool(args):
    """tok_tool's stdout; it must exit 0 (a sanitizer report, 23, or a signal is a failure too)."""
    r = subprocess.run([TOK_TOOL] + args, capture_output=True, timeout=600)
    if r.returncode != 0:
        how = f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit status {r.returncode}"
        raise RuntimeError(f"tok_tool {' '.join(args[:2])}: {how} (want 0): {r.stderr.decode(errors='replace').strip()[-400:]}")
    return r.stdout


def zip_same(what, **seqs):
    """zip of named lists that must be equally long: a tool that prints fewer lines fails here
    instead of being compared on fewer texts."""
    lens = {name: len(s) for name, s in seqs.items()}
    if len(set(lens.values())) != 1:
        raise RuntimeError(f"{what}: lengths differ: " + ", ".join(f"{n} {name}" for name, n in lens.items()))
    return zip(*seqs.values(), strict=True)


def write_texts(texts, directory, name):
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        for t in texts:
            f.write(t.encode("utf-8") + SEP.encode())
    return path


def c_encode(tok_dir, texts, directory):
    out = run_tool([tok_dir, "--lines", write_texts(texts, directory, "texts.txt")]).decode()
    lines = out.split("\n")[:-1]
    if len(lines) != len(texts):
        raise RuntimeError(f"tok_tool gave {len(lines)} lines for {len(texts)} texts")
    return [[int(x) for x in line.split()] for line in lines]


def c_pretokenize(tok_dir, texts, directory):
    """Pre-token end offsets, in characters, of the bare pre-tokenizer."""
    out = run_tool([tok_dir, "--pretok-lines", write_texts(texts, directory, "texts.txt")]).decode()
    lines = out.split("\n")[:-1]
    if len(lines) != len(texts):
        raise RuntimeError(f"tok_tool gave {len(lines)} lines for {len(texts)} texts")
    result = []
    for text, line in zip_same("pre-token lines", texts=texts, lines=lines):
        char_at = {0: 0}  # byte offset -> character offset
        b = 0
        for i, ch in enumerate(text):
            b += len(ch.encode("utf-8"))
            char_at[b] = i + 1
        result.append([char_at[int(x)] for x in line.split()])
    return result


def c_decode(tok_dir, id_lists, directory):
    path = os.path.join(directory, "ids.txt")
    with open(path, "w") as f:
        for ids in id_lists:
            f.write(" ".join(map(str, ids)) + "\n")
    out = run_tool([tok_dir, "--decode-lines", path])
    parts = out.split(SEP.encode())
    if len(parts) != len(id_lists) + 1 or parts[-1] != b"":
        raise RuntimeError(f"tok_tool --decode-lines gave {len(parts) - 1} texts for {len(id_lists)} id lists")
    return parts[:-1]


class Report:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, name, total, bad):
        """bad: list of (text, ours, theirs) mismatches."""
        ok = not bad
        self.passed += ok
        self.failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {total - len(bad)}/{total} identical")
        for text, ours, theirs in bad[:SHOW]:
            print(f"    text  {text!r:.300}\n    ours  {ours!r:.300}\n    hf    {theirs!r:.300}")


# ------------------------------------------------------------------------------------------ tests

def test_tokenizer(name, tok_dir, texts, report, directory):
    hf = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    ours = c_encode(tok_dir, texts, directory)
    ref = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    report.check(f"{name} encode ({len(texts)} texts)", len(texts),
                 [(t, a, b) for t, a, b in zip_same(f"{name} encode", texts=texts, ours=ours, hf=ref) if a != b])

    # Pre-token boundaries, which ids alone can hide (a split that no merge crosses).
    cuts = c_pretokenize(tok_dir, texts, directory)
    ref_cuts = [[end for _, (_, end) in hf.pre_tokenizer.pre_tokenize_str(t)] for t in texts]
    report.check(f"{name} pre-token boundaries", len(texts),
                 [(t, a, b) for t, a, b in zip_same(f"{name} pre-tokens", texts=texts, ours=cuts, hf=ref_cuts)
                  if a != b])

    dec = c_decode(tok_dir, ref, directory)
    hf_dec = [s.encode("utf-8") for s in hf.decode_batch(ref, skip_special_tokens=False)]
    report.check(f"{name} decode = HF decode", len(texts),
                 [(t, a, b) for t, a, b in zip_same(f"{name} decode", texts=texts, ours=dec, hf=hf_dec) if a != b])
    trips = [(t, d) for t, d, h in zip_same(f"{name} decode", texts=texts, ours=dec, hf=hf_dec) if h == t.encode("utf-8")]
    report.check(f"{name} decode(encode(x)) == x where HF round-trips", len(trips),
                 [(t, d, t.encode("utf-8")) for t, d in trips if d != t.encode("utf-8")])

    rng = random.Random(7)
    n = hf.get_vocab_size(with_added_tokens=True)
    byte_ids = [hf.token_to_id(bytes_to_unicode_char(b)) for b in range(0x80, 0x100)]
    byte_ids = [i for i in byte_ids if i is not None]
    rand = [[rng.choice(byte_ids) if rng.random() < 0.5 else rng.randrange(n) for _ in range(rng.randint(1, 12))]
            for _ in range(1000)]
    dec = c_decode(tok_dir, rand, directory)
    hf_dec = [s.encode("utf-8") for s in hf.decode_batch(rand, skip_special_tokens=False)]
    report.check(f"{name} decode of random ids (split UTF-8, U+FFFD)", len(rand),
                 [(ids, a, b) for ids, a, b in zip_same(f"{name} random decode", ids=rand, ours=dec, hf=hf_dec)
                  if a != b])


def bytes_to_unicode_char(b):
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + sum(1 for x in range(b) if x not in printable))


def test_vectors(name, tok_dir, report, directory):
    base = os.path.join(SHARED, "llamacpp-vectors", VECTORS[name])
    with open(base + ".inp", "rb") as f:
        texts = f.read().decode("utf-8").split(SEP)
    assert texts[-1] == "", "vector file does not end with a separator"
    texts = texts[:-1]
    with open(base + ".out") as f:
        lines = f.read().split("\n")
    assert lines[-1] == "", "vector .out file does not end with a newline"
    want = [[int(x) for x in line.split()] for line in lines[:-1]]
    ours = c_encode(tok_dir, texts, directory)
    report.check(f"{name} llama.cpp vectors {VECTORS[name]}", len(texts),
                 [(t, a, b) for t, a, b in zip_same(f"{name} vectors", texts=texts, ours=ours, want=want) if a != b])


def main():
    if not os.path.exists(TOK_TOOL):
        print(f"FAIL {TOK_TOOL} not built (run: make {os.path.relpath(TOK_TOOL, ROOT)})")
        print("0 passed, 1 failed")
        return 1
    texts = build_corpus()
    report = Report()
    with tempfile.TemporaryDirectory() as d:
        for name, tok_dir in TOKENIZERS.items():
            try:
                test_tokenizer(name, tok_dir, texts, report, d)
                if name in VECTORS:
                    test_vectors(name, tok_dir, report, d)
            except (RuntimeError, OSError, AssertionError, subprocess.TimeoutExpired) as e:
                print(f"FAIL {name}: {e}")
                report.failed += 1
    print(f"{report.passed} passed, {report.failed} failed")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
