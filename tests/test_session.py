#!/usr/bin/env python3
"""Saved sessions (--save-session / --load-session, model/session.h) on the CPU path, with a tiny
model and prompts past ParisKV's dense threshold (2,000 tokens), so the policy is at work after a
restore: a restored run continues exactly as the run that saved it (ParisKV, fp8 zone, full
attention), and a chat saved with /save answers its next message after --chat --load-session as
the chat that went on did; text after a session is more prompt, as if it had been there all along; a damaged,
truncated, foreign or mismatched file is refused with one error line (exit 1); a save killed at any
point (SIGKILL before, during, after the rename) leaves the previous session or the new one, whole,
and a save stopped by SIGTERM or Ctrl-C removes its partial file."""
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PKV_BIN", ROOT)  # PKV_BIN: the sanitizer build
RUN, EXPORT = os.path.join(BIN, "run"), os.path.join(BIN, "export")
DATA = os.path.join(ROOT, "tests", "data")

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""))


def run(*args):
    return subprocess.run([RUN, *args], capture_output=True, timeout=300, stdin=subprocess.DEVNULL)


def chat(model, stdin, *args):
    return subprocess.run([RUN, model, "--chat", *args], input=stdin, capture_output=True, timeout=300)


def refused(name, p, want):
    err = p.stderr.decode(errors="replace").strip().splitlines()
    errs = [l for l in err if l.startswith("error: ")]
    check(name, p.returncode == 1 and len(errs) == 1 and want in errs[0], f"exit {p.returncode}, {errs or err[-2:]}")


def ids(n, seed):
    return " ".join(str((i * 7919 + seed) % 97 + 3) for i in range(n))


def killed_saves(qwen, tmp):
    """A save paused (PKV_SESSION_TEST_PAUSE, model/session.c) at each stage, then killed: the event
    is the saver's own line saying it stopped there, not a sleep."""
    sess = os.path.join(tmp, "k.bin")
    opts = ["--ids", "--temp", "0", "--ignore-eos", "--attn", "full", "-n", "8"]
    files, out = {}, {}
    for name, seed in (("old", 1), ("new", 2)):  # two sessions of other tokens: other bytes
        open(os.path.join(tmp, name + ".txt"), "w").write(ids(300, seed))
        p = run(qwen, "-f", os.path.join(tmp, name + ".txt"), "--save-session", sess, *opts)
        files[name], out[name] = open(sess, "rb").read(), p.stdout
        check(f"kill test set-up: the {name} session", p.returncode == 0 and len(p.stdout.split()) == 8,
              "" if p.returncode == 0 else p.stderr.decode(errors="replace")[-200:])
    if files["old"] == files["new"]:
        check("kill test set-up: two sessions differ", False)
        return

    def paused_save(stage):
        with open(sess, "wb") as f:
            f.write(files["old"])
        p = subprocess.Popen([RUN, qwen, "-f", os.path.join(tmp, "new.txt"), "--save-session", sess, *opts], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env={**os.environ, "PKV_SESSION_TEST_PAUSE": stage})
        err = b""
        while True:
            line = p.stderr.readline()
            err += line
            if not line:
                return p, err, False
            if f"test pause at '{stage}'".encode() in line:  # then wait for the stop itself (the line comes first)
                _, st = os.waitpid(p.pid, os.WUNTRACED)
                return p, err, os.WIFSTOPPED(st)

    def finish(p, err):
        o, e = p.communicate(timeout=60)
        return o, err + e

    def leftovers():
        return sorted(os.path.basename(f) for f in glob.glob(sess + ".tmp.*"))

    for stage, want in (("created", "old"), ("partial", "old"), ("written", "old"), ("renamed", "new")):
        p, err, paused = paused_save(stage)
        os.kill(p.pid, signal.SIGKILL)
        finish(p, err)
        now = open(sess, "rb").read()
        left = leftovers()
        # SIGKILL cannot be cleaned up after: its temporary file (a name of its own) stays.
        for f in left:
            os.remove(os.path.join(tmp, f))
        r = run(qwen, "--load-session", sess, *opts)
        check(f"SIGKILL at '{stage}': the {want} session, byte for byte, and it resumes as its saving run did",
              paused and p.returncode == -signal.SIGKILL and now == files[want] and r.returncode == 0 and r.stdout == out[want]
              and len(left) == (0 if want == "new" else 1),
              f"paused {paused}, exit {p.returncode}, old/new/neither {'old' if now == files['old'] else 'new' if now == files['new'] else 'neither'}, "
              f"left {left}, load exit {r.returncode}")
    # SIGTERM (the default end) and Ctrl-C (run's handler: the save fails, then the interrupt) in
    # the middle of the K/V: the partial file removed, the old session untouched.
    for sig, code, msg in ((signal.SIGTERM, -signal.SIGTERM, "removed the partial"), (signal.SIGINT, 1, "interrupted")):
        p, err, paused = paused_save("partial")
        os.kill(p.pid, sig)
        os.kill(p.pid, signal.SIGCONT)
        o, e = finish(p, err)
        e = e.decode(errors="replace")
        now, left = open(sess, "rb").read(), leftovers()
        check(f"{signal.Signals(sig).name} during the save: the partial file removed, the old session kept",
              paused and p.returncode == code and msg in e and now == files["old"] and not left,
              f"paused {paused}, exit {p.returncode}, old kept {now == files['old']}, left {left}, {e.strip().splitlines()[-1:]}")


def main():
    tmp = tempfile.mkdtemp(prefix="pkv-session-")
    try:
        qwen, llama = os.path.join(tmp, "qwen.bin"), os.path.join(tmp, "llama.bin")
        for src, dst in (("tiny-qwen3", qwen), ("tiny-llama31", llama)):
            e = subprocess.run([EXPORT, os.path.join(DATA, src), dst], capture_output=True)
            if e.returncode != 0:
                check(f"export {src}", False, e.stderr.decode(errors="replace")[-300:])
                return
        # 2,304 ids: a whole number of 256-token chunks, so prefilling more after a restore cuts the
        # text where a prefill of everything would (the same products, the same sums).
        prompt, more = os.path.join(tmp, "p.txt"), os.path.join(tmp, "pm.txt")
        open(prompt, "w").write(ids(2304, 1))
        open(more, "w").write(ids(2304, 1) + " " + ids(256, 5))
        sess = os.path.join(tmp, "s.bin")
        common = ["--ids", "--temp", "0", "--ctx", "2700", "--ignore-eos", "--attn", "pariskv"]  # ParisKV past 2,000 (an --attn given)
        for label, extra in (("pariskv", []), ("pariskv, fp8 zone", ["--kv-store-dtype", "fp8"]), ("full attention", ["--attn", "full"])):
            a = run(qwen, "-f", prompt, "-n", "48", "--save-session", sess, *common, *extra)
            b = run(qwen, "--load-session", sess, "-n", "48", *common, *extra)
            check(f"{label}: the restored run continues as the saving run (48 greedy ids)",
                  a.returncode == 0 and b.returncode == 0 and a.stdout == b.stdout and len(a.stdout.split()) == 48
                  and b"restored" in b.stderr, f"exit {a.returncode}/{b.returncode}, {b.stderr.decode(errors='replace')[-200:]!r}")
        a = run(qwen, "-f", prompt, "-n", "8", "--save-session", sess, *common)
        c = run(qwen, "-f", more, "-n", "24", *common)
        d = run(qwen, "--load-session", sess, "-p", ids(256, 5), "-n", "24", *common)
        check("text after a session is more prompt: as the whole prompt prefilled at once",
              c.returncode == 0 and d.returncode == 0 and c.stdout == d.stdout and len(d.stdout.split()) == 24,
              f"exit {c.returncode}/{d.returncode}, {d.stderr.decode(errors='replace')[-200:]!r}")
        size = os.path.getsize(sess)
        # Refusals.
        refused("another model's session", run(llama, "--load-session", sess, "-n", "4", *common), "made with another model")
        refused("other attention settings", run(qwen, "--load-session", sess, "-n", "4", "--topk", "50", *common),
                "made under other attention settings")
        refused("fp8 zone against a bf16 session", run(qwen, "--load-session", sess, "-n", "4", "--kv-store-dtype", "fp8", *common),
                "made under other attention settings")
        refused("a model file is not a session", run(qwen, "--load-session", qwen, "-n", "4", *common), "not a session file")
        refused("a missing session", run(qwen, "--load-session", os.path.join(tmp, "none.bin"), "-n", "4", *common), "--load-session '")
        refused("a context too small for the session", run(qwen, "--load-session", sess, "-n", "4", "--ids", "--temp", "0", "--ctx", "2000", "--attn", "pariskv"),
                "leaves no room")
        cut = os.path.join(tmp, "cut.bin")
        with open(sess, "rb") as f, open(cut, "wb") as g:
            g.write(f.read(size - 100))
        refused("a truncated session", run(qwen, "--load-session", cut, "-n", "4", *common), "truncated or damaged")
        for what, offset, want in (("header", 40, "header is damaged"), ("K/V", size - 5000, "checksum mismatch in its K/V"),
                                   ("tokens", 4096 + 8, "checksum mismatch in its tokens")):
            bad = os.path.join(tmp, "bad.bin")
            shutil.copy(sess, bad)
            with open(bad, "r+b") as f:
                f.seek(offset)
                b = f.read(1)
                f.seek(offset)
                f.write(bytes([b[0] ^ 0x40]))
            refused(f"a damaged session ({what})", run(qwen, "--load-session", bad, "-n", "4", *common), want)
        # A chat: /save after a first message past the dense threshold (replies under ParisKV), then
        # --chat --load-session answers the next message as the chat that went on did.
        words = " ".join(f"w{i % 97} x{i % 13}" for i in range(440)).encode()
        chat_sess = os.path.join(tmp, "chat.bin")
        for label, extra in (("pariskv", ["--attn", "pariskv"]), ("pariskv, fp8 zone", ["--kv-store-dtype", "fp8"]), ("full attention", ["--attn", "full"])):
            opts = ["--chat", "--temp", "0", "-n", "12", "--ctx", "3000", "--ignore-eos", *extra]
            a = chat(qwen, words + b"\nand what next?\n", *opts)
            b = chat(qwen, words + b"\n/save " + chat_sess.encode() + b"\n", *opts)
            c = chat(qwen, b"and what next?\n", "--load-session", chat_sess, *opts)
            check(f"chat, {label}: /save, then --load-session answers the next message as the chat that went on",
                  a.returncode == b.returncode == c.returncode == 0 and a.stdout == b.stdout + c.stdout and c.stdout.strip()
                  and b"saved" in b.stderr and b"restored" in c.stderr,
                  f"exit {a.returncode}/{b.returncode}/{c.returncode}, {a.stdout[-80:]!r} vs {b.stdout[-40:]!r} + {c.stdout[-40:]!r}, "
                  f"{c.stderr.decode(errors='replace')[-200:]!r}")
        # (chat_sess is the last loop's: --attn full)
        refused("a chat's session resumed by a generation", run(qwen, "--load-session", chat_sess, "-n", "4", *common, "--attn", "full"),
                "is a chat's")
        refused("a prompt's session resumed by a chat", chat(qwen, b"hi\n", "--load-session", sess, "--attn", "pariskv"), "is a prompt's")
        refused("--system with a chat session", chat(qwen, b"hi\n", "--load-session", chat_sess, "--attn", "full", "--system", "x"), "brings its own conversation")
        refused("--save-session with --chat", run(qwen, "--chat", "--save-session", sess), "in a chat, /save FILE")
        refused("one file for both", run(qwen, "-f", prompt, "--load-session", sess, "--save-session", sess, *common), "name the same file")
        killed_saves(qwen, tmp)
        refused("an unwritable session path", run(qwen, "-f", prompt, "-n", "2", "--save-session", os.path.join(tmp, "no", "s.bin"), *common),
                "its directory")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


main()
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
