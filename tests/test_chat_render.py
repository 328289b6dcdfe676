#!/usr/bin/env python3
"""`./run --render-chat` against transformers' apply_chat_template, id for id.

tests/data/chat/<family>.json (made by tests/ref/make_chat_reference.py) hold conversations and
the ids transformers renders for them with the real tokenizers and templates: Llama 3.1, Llama
3.2 and Llama 3 (Meta's templates on ../shared/tokenizers/llama3), Qwen3 with thinking default,
on and off, SmolLM2 (ChatML with its default system prompt). For each family a tiny random-weight
checkpoint is built around the real tokenizer (tests/tiny_checkpoint.py: the vocabulary is the
tokenizer's) and exported; every case must come out identical. SmolLM2's GGUF ($SMOLLM2_GGUF, as
`make check` sets it, else build/smollm2/) must give the same ids from its own tokenizer.chat_template. Bad conversation files (not JSON,
wrong shapes, unknown roles or keys, invalid UTF-8) must give one 'error:' line and exit 1, a
10 MB message its ids. Stdlib only.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_checkpoint import ROOT, EXPORT, build_model  # noqa: E402

RUN = os.path.join(os.environ.get("PKV_BIN", ROOT), "run")  # PKV_BIN: the sanitizer build
DATA = os.path.join(ROOT, "tests", "data", "chat")
FAMILIES = ["llama31", "llama32", "llama3", "qwen3", "smollm2"]
SMOL_GGUF = os.environ.get("SMOLLM2_GGUF") or os.path.join(ROOT, "build", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    passed += ok
    failed += not ok
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))


def status(rc):
    """An exit status in words: a signal and a sanitizer report (23/24) are named."""
    if rc < 0:
        return f"killed by signal {signal.Signals(-rc).name}"
    return f"exit status {rc}" + (" (a sanitizer report)" if rc in (23, 24) else "")


def vocab_size(tokenizer_json):
    with open(tokenizer_json) as f:
        tj = json.load(f)
    ids = list(tj["model"]["vocab"].values()) + [t["id"] for t in tj.get("added_tokens", [])]
    return max(ids) + 1


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first difference at {i}: got {a[i:i + 8]}, want {b[i:i + 8]} (lengths {len(a)}, {len(b)})"
    return f"lengths differ: got {len(a)}, want {len(b)}"


def render(model, messages_path, case):
    cmd = [RUN, model, "--render-chat", messages_path]
    if case["enable_thinking"] is not None:
        cmd.append("--think" if case["enable_thinking"] else "--no-think")
    if case["date_string"]:
        cmd += ["--date", case["date_string"]]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:  # exactly 0: ids printed before a sanitizer report (23) or a crash do not count
        return None, f"{status(p.returncode)} (want 0): {p.stderr.strip()[-400:]}"
    return [int(x) for x in p.stdout.split()], ""


def test_errors(tmp):
    """Bad conversation files: one 'error:' line on stderr and exit status 1, never a crash."""
    tiny = os.path.join(tmp, "tiny-qwen3.bin")
    p = subprocess.run([EXPORT, os.path.join(ROOT, "tests", "data", "tiny-qwen3"), tiny],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        check("export of tiny-qwen3", False, f"{status(p.returncode)}: {p.stderr}")
        return
    ok_msg = b'{"role": "user", "content": "hi"}'
    cases = [("not JSON", b"[{", "not valid JSON"), ("not a list", ok_msg, "JSON list"),
             ("empty list", b"[]", "no messages"), ("a message that is not an object", b'["hi"]', "not an object"),
             ("no content", b'[{"role": "user"}]', "one \"role\" and one \"content\""),
             ("content not a string", b'[{"role": "user", "content": ["a"]}]', "must be a string"),
             ("an unknown key", b'[{"role": "user", "content": "a", "name": "x"}]', "only \"role\" and \"content\""),
             ("a role other than system/user/assistant", b'[{"role": "tool", "content": "a"}]', "role must be"),
             ("duplicate keys", b'[{"role": "user", "content": "a", "content": "b"}]', "one \"role\""),
             ("invalid UTF-8 content", b'[{"role": "user", "content": "a\xff"}]', "not valid UTF-8"),
             ("a NUL byte in the file", b'[{"role": "user", "content": "a"}]\x00', "not valid JSON"),
             ("truncated UTF-8 at the end", b'[{"role": "user", "content": "\xe6\x97"}]', "not valid UTF-8")]
    path = os.path.join(tmp, "bad.json")
    for name, data, want in cases + [("a missing file", None, "No such file or directory")]:
        if data is not None:
            with open(path, "wb") as f:
                f.write(data)
        p = subprocess.run([RUN, tiny, "--render-chat", path if data is not None else path + ".none"],
                           capture_output=True, timeout=60)
        err = p.stderr.decode("utf-8", "replace").strip().splitlines()
        check(f"--render-chat with {name}: exit 1, one 'error:' line naming it",
              p.returncode == 1 and len(err) == 1 and err[0].startswith("error: ") and want in err[0],
              f"{status(p.returncode)}, stderr {err}")
    big = [{"role": "user", "content": "word " * 2_000_000}]  # 10 MB
    with open(path, "w") as f:
        json.dump(big, f)
    p = subprocess.run([RUN, tiny, "--render-chat", path], capture_output=True, text=True, timeout=300)
    check("--render-chat of a 10 MB message prints its ids", p.returncode == 0 and len(p.stdout.split()) > 2_000_000,
          f"{status(p.returncode)}, {len(p.stdout.split())} ids, stderr {p.stderr[-300:]!r}")


def test_gguf_template(tmp):
    """SmolLM2's GGUF carries its template as tokenizer.chat_template: the same ids must come out."""
    if not os.path.isfile(SMOL_GGUF):
        check(f"smollm2 GGUF at {SMOL_GGUF} ($SMOLLM2_GGUF): a missing input is not a pass", False, "not found")
        return
    model = os.path.join(tmp, "smollm2-gguf.bin")
    p = subprocess.run([EXPORT, SMOL_GGUF, model], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        check("smollm2 GGUF: export", False, f"{status(p.returncode)}: {p.stderr[-300:]}")
        return
    with open(os.path.join(DATA, "smollm2.json")) as f:
        cases = json.load(f)["cases"]
    if not cases:
        check("smollm2 GGUF: the reference has cases", False, "tests/data/chat/smollm2.json has none")
    msgs_path = os.path.join(tmp, "messages.json")
    for case in cases:
        with open(msgs_path, "w") as f:
            json.dump(case["messages"], f, ensure_ascii=False)
        ids, err = render(model, msgs_path, case)
        check(f"smollm2 (GGUF tokenizer.chat_template): {case['name']}", ids == case["ids"],
              err if ids is None else first_difference(ids, case["ids"]))
    os.unlink(model)


def main():
    with tempfile.TemporaryDirectory(prefix="pkv-chat-") as tmp:
        for test in (test_errors, test_gguf_template):
            try:
                test(tmp)
            except (OSError, ValueError, subprocess.TimeoutExpired) as e:  # a hang or a broken file fails that part
                check(f"{test.__name__} ran to the end", False, str(e))
        for family in FAMILIES:
            try:
                with open(os.path.join(DATA, family + ".json")) as f:
                    ref = json.load(f)
                tok_dir = os.path.join(ROOT, ref["tokenizer"])
                files = [os.path.join(tok_dir, "tokenizer.json"), os.path.join(tok_dir, "tokenizer_config.json")]
                tpl = open(os.path.join(ROOT, ref["template"])).read() if ref["template"] else None
                model = build_model(tmp, family, "llama", vocab_size(files[0]), files, chat_template=tpl)
            except (OSError, RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
                check(f"{family}: reference and export", False, str(e))
                continue
            if not ref["cases"]:  # an empty reference would pass by comparing nothing
                check(f"{family}: the reference has cases", False, f"tests/data/chat/{family}.json has none")
            msgs_path = os.path.join(tmp, "messages.json")
            for case in ref["cases"]:
                with open(msgs_path, "w") as f:
                    json.dump(case["messages"], f, ensure_ascii=False)
                ids, err = render(model, msgs_path, case)
                opts = f"think={case['enable_thinking']} date={case['date_string']}"
                name = f"{family}: {case['name']} ({len(case['messages'])} messages, {opts})"
                check(name, ids == case["ids"], err if ids is None else first_difference(ids, case["ids"]))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
