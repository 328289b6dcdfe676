#!/usr/bin/env python3
"""`./run --chat` driven through piped stdin, on tiny random-weight models (greedy decoding):

  - multi-turn: one reply per line, each turn prefills only what the KV cache lacks, and a
    turn's reply equals what a fresh prefill of the whole rendered conversation gives
    (./run --render-chat, then ./run --ids) -- the persistent cache changes nothing;
  - /reset (the same first message gives the same reply again), /exit, EOF without a final newline;
  - -p as the first message, --system;
  - the first turn prefills exactly what --render-chat renders, for Llama 3.1 (--date), Qwen3
    (--no-think) and SmolLM2 (its default system prompt) with the real tokenizers; Qwen3 drops
    the previous turn's <think> block, so the cache is kept only up to it;
  - the context filling up: during a reply (it stops, the chat goes on) and before one (the
    message is refused, the cache untouched); /reset then works again;
  - Ctrl-C (SIGINT) during a reply stops the reply, not the program, twice in a row;
  - on a terminal (a pty): prompts, a line ending in '\\' continues the message, Ctrl-C at the
    prompt asks again, Ctrl-D quits; with libedit, arrows, history and Ctrl-R edit the line;
  - invalid UTF-8, a NUL byte, empty lines and a 10 MB message: a clear note, never a crash;
  - a first message past the dense threshold: the first turn is a prefill under ParisKV, as in
    ./run -p (the same reply).
Every run must exit 0 with no 'error:' line. Stdlib only.
"""
import json
import os
import platform
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_checkpoint import ROOT, EXPORT, build_model  # noqa: E402

RUN = os.path.join(os.environ.get("PKV_BIN", ROOT), "run")  # PKV_BIN: the sanitizer build
TOK_TOOL = os.environ.get("TOK_TOOL") or os.path.join(ROOT, "build", "tests", "tok_tool")
TINY = os.path.join(ROOT, "tests", "data", "tiny-qwen3")  # ChatML template, no default system prompt
SHARED = os.path.join(ROOT, "..", "shared", "tokenizers")
STATS = re.compile(r"^\[prefill (\d+) tokens \((\d+) cached\).*context (\d+)/(\d+)\]$")

passed = failed = 0
skipped = False


def status(rc):
    """An exit status in words: a signal and a sanitizer report (23/24) are named, never read as a refusal."""
    if rc is None:
        return "still running"
    if rc < 0:
        return f"killed by signal {signal.Signals(-rc).name}"
    return f"exit status {rc}" + (" (a sanitizer report)" if rc in (23, 24) else "")


def check(name, ok, detail=""):
    global passed, failed
    passed += ok
    failed += not ok
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + str(detail)[-600:]))


class Result:
    def __init__(self, p):
        self.rc, self.out, self.err = p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")
        self.stats = [tuple(map(int, m.groups())) for m in map(STATS.match, self.err.splitlines()) if m]
        self.clean = self.rc == 0 and "error:" not in self.err

    def __str__(self):
        return f"{status(self.rc)}, stderr {self.err[-400:]!r}"


def chat(model, stdin, *args, timeout=120):
    p = subprocess.run([RUN, model, "--chat", "--temp", "0"] + list(args), input=stdin, capture_output=True,
                       timeout=timeout)
    return Result(p)


def render(model, messages, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(messages, f, ensure_ascii=False)
    p = subprocess.run([RUN, model, "--render-chat", f.name] + list(args), capture_output=True, text=True, timeout=60)
    os.unlink(f.name)
    if p.returncode != 0:
        raise RuntimeError(f"--render-chat: {status(p.returncode)} (want 0): {p.stderr[-400:]}")
    return [int(x) for x in p.stdout.split()]


def generate_ids(model, ids, *args):
    """./run --ids: the generated ids; it must exit 0."""
    p = subprocess.run([RUN, model, "--ids", "-p", " ".join(map(str, ids)), "--temp", "0"] + list(args),
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"./run --ids: {status(p.returncode)} (want 0): {p.stderr[-400:]}")
    return [int(x) for x in p.stdout.split()]


def decode(hf_dir, ids):
    """tok_tool --decode of ids, as bytes; it must exit 0."""
    d = subprocess.run([TOK_TOOL, hf_dir, "--decode"] + [str(x) for x in ids], capture_output=True, timeout=60)
    if d.returncode != 0:
        raise RuntimeError(f"tok_tool --decode: {status(d.returncode)} (want 0): {d.stderr[-400:]!r}")
    return d.stdout


def fresh_reply(model, messages, n, hf_dir):
    """The greedy reply to the rendered conversation, prefilled at once, as text."""
    out = generate_ids(model, render(model, messages), "-n", str(n))
    if out and out[-1] == 402:  # <|im_end|>: the chat stops there without printing it
        out.pop()
    return decode(hf_dir, out)


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_turns(tiny):
    one = chat(tiny, b"hello there\n", "-n", "6")
    two = chat(tiny, b"hello there\nwhat next?\n", "-n", "6")
    three = chat(tiny, b"hello there\nwhat next?\nand then\n", "-n", "6")
    check("three piped lines: three turns, exit 0 at EOF", three.clean and len(three.stats) == 3, three)
    if not (one.clean and two.clean and len(two.stats) == 2 and len(one.stats) == 1):
        check("one and two turns run", False, f"{one} / {two}")
        return
    reply1 = one.out[:-1].decode("utf-8")
    first = render(tiny, [{"role": "user", "content": "hello there"}])
    check(f"turn 1 prefills the rendered conversation ({one.stats[0][0]} = {len(first)} tokens)",
          one.stats[0][:2] == (len(first), 0))
    conv = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": reply1},
            {"role": "user", "content": "what next?"}]
    second = render(tiny, conv)
    pre, cached = two.stats[1][:2]
    check(f"turn 2 reuses the cache: {cached} cached + {pre} prefilled = {len(second)} rendered, cached >= turn 1's prompt",
          cached + pre == len(second) and cached >= len(first) - 1 and pre < len(second), two.stats)
    reply2 = two.out[len(one.out):-1]
    try:
        want = fresh_reply(tiny, conv, 6, TINY)
    except RuntimeError as e:  # ./run --ids or tok_tool failed: this check fails, the others run
        want = e
    check("turn 2's reply equals a fresh prefill of the whole conversation", reply2 == want, f"{reply2!r} vs {want!r}")
    r = chat(tiny, b"hello there\n/reset\nhello there\n", "-n", "6")
    check("/reset: the same first message gives the same reply", r.clean and r.out == one.out * 2 and
          "[conversation cleared]" in r.err, f"{r} out {r.out!r}")
    r = chat(tiny, b"hello there\n/exit\nnot read\n", "-n", "6")
    check("/exit quits before the next line", r.clean and len(r.stats) == 1 and r.out == one.out, r)
    r = chat(tiny, b"hello there", "-n", "6")
    check("EOF without a final newline: the line is a message", r.clean and r.out == one.out, r)
    r = chat(tiny, b"what next?\n", "-n", "6", "-p", "hello there")
    check("-p is the first message, stdin the next", r.clean and r.out == two.out, r)
    r = chat(tiny, b"hello there\n", "-n", "2", "--system", "Be brief.")
    sys_ids = render(tiny, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}])
    check(f"--system is the first message ({len(sys_ids)} tokens prefilled)", r.clean and r.stats and
          r.stats[0][0] == len(sys_ids), r)


def test_long_first_message(tiny):
    """Past the dense threshold (2000 tokens) ParisKV selects keys; the first turn is the prompt,
    attended densely like ./run -p, so its reply equals a generation from the rendered prompt
    under the same policy (every later token a decode step in both)."""
    words = " ".join(f"w{i % 97} x{i % 13}" for i in range(440))
    conv = [{"role": "user", "content": words}]
    ids = render(tiny, conv)
    if len(ids) < 2100:
        check(f"the long message renders to >= 2100 tokens ({len(ids)})", False)
        return
    r = chat(tiny, (words + "\n").encode(), "-n", "8", "--ctx", "3000", "--ignore-eos", "--attn", "pariskv", timeout=300)
    want = decode(TINY, generate_ids(tiny, ids, "-n", "8", "--ctx", "3000", "--ignore-eos", "--attn", "pariskv"))
    check(f"a {len(ids)}-token first message under ParisKV: the chat's reply equals ./run -p of the rendered prompt",
          r.clean and r.out[:-1] == want, f"{r} chat {r.out!r} vs run {want!r}")


def test_real_templates(tmp):
    models = {}
    for name, tok_dir, tpl, args in [
            ("llama31", os.path.join(SHARED, "llama3"), "meta-llama-Llama-3.1-8B-Instruct.jinja", ["--date", "01 Jan 2025"]),
            ("qwen3", os.path.join(SHARED, "qwen3"), "Qwen-Qwen3-0.6B.jinja", ["--no-think"]),
            ("smollm2", os.path.join(ROOT, "tests", "data", "smollm2-tokenizer"), None, [])]:
        files = [os.path.join(tok_dir, "tokenizer.json"), os.path.join(tok_dir, "tokenizer_config.json")]
        with open(files[0]) as f:
            tj = json.load(f)
        vocab = max(list(tj["model"]["vocab"].values()) + [t["id"] for t in tj["added_tokens"]]) + 1
        template = open(os.path.join(SHARED, "templates", tpl)).read() if tpl else None
        try:
            models[name] = build_model(tmp, name, "qwen3" if name == "qwen3" else "llama", vocab, files, template)
        except RuntimeError as e:
            check(f"{name}: export", False, e)
            continue
        r = chat(models[name], "Hi there!\nTell me more.\n".encode(), "-n", "4", *args)
        want = render(models[name], [{"role": "user", "content": "Hi there!"}], *args)
        check(f"{name}: turn 1 prefills what --render-chat {' '.join(args) or '(no option)'} renders ({len(want)} tokens), 2 turns",
              r.clean and len(r.stats) == 2 and r.stats[0][0] == len(want), r)
        if name == "qwen3" and r.clean and len(r.stats) == 2:
            reply1 = r.out.decode("utf-8").split("\n")[0]
            conv = [{"role": "user", "content": "Hi there!"}, {"role": "assistant", "content": reply1},
                    {"role": "user", "content": "Tell me more."}]
            keep = common_prefix(want, render(models[name], conv, "--no-think"))
            check(f"qwen3: turn 2 keeps the cache up to the dropped <think> block ({keep} of {len(want)} tokens)",
                  keep < len(want) and r.stats[1][1] == keep, r.stats)


def test_context_full(tiny):
    r = chat(tiny, b"hello there\nmore words here please\n/reset\nhi\n", "-n", "100", "--ctx", "40", "--ignore-eos")
    notes = [l for l in r.err.splitlines() if l.startswith("[context full")]
    check("context fills during a reply: it stops there, the chat goes on", r.clean and len(notes) >= 1 and
          "reply stops here" in notes[0] and r.stats and r.stats[0][2] == 40, r)
    check("the next message does not fit: refused with a note; after /reset a turn runs (and fills the context)",
          len(notes) == 3 and "message ignored" in notes[1] and "reply stops here" in notes[2] and
          len(r.stats) == 2 and r.stats[1][2] == 40, r)


class Reader(threading.Thread):
    def __init__(self, f):
        super().__init__(daemon=True)
        self.f, self.data = f, b""

    def run(self):
        for chunk in iter(lambda: self.f.read1(4096), b""):
            self.data += chunk


def wait_for(cond, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_sigint(tiny):
    # The reply has no -n: it runs until the 60000-token context is full (minutes for this model),
    # so it is still streaming when the signal comes; if it was not, that is said, not passed.
    p = subprocess.Popen([RUN, tiny, "--chat", "--temp", "0", "--ignore-eos", "--ctx", "60000"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = Reader(p.stdout), Reader(p.stderr)
    out.start(), err.start()
    problems = []
    for i, msg in enumerate([b"tell me a long story\n", b"another one\n"]):
        p.stdin.write(msg)
        p.stdin.flush()
        before = len(out.data)
        # The event: reply bytes on stdout (a reply streams before its stats line) -- the program
        # is in the reply's decode loop. The signal goes at once, no sleep.
        if not wait_for(lambda: len(out.data) > before + 20 or err.data.count(b"[prefill") > i or p.poll() is not None):
            problems.append(f"reply {i + 1}: nothing streamed in 60 s")
            break
        if p.poll() is not None or err.data.count(b"[prefill") != i:
            problems.append(f"reply {i + 1} ended before the signal could be sent ({status(p.poll())})")
            break
        p.send_signal(signal.SIGINT)
        if not wait_for(lambda: err.data.count(b"[interrupted]") == i + 1 and err.data.count(b"[prefill") == i + 1
                        or p.poll() is not None):
            problems.append(f"reply {i + 1}: no '[interrupted]' and stats line 60 s after the signal")
            break
        if p.poll() is not None:
            problems.append(f"the chat ended on the signal to reply {i + 1} ({status(p.poll())})")
            break
    p.stdin.close()
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        rc = None
        problems.append("hung after EOF on stdin")
    out.join(5), err.join(5)
    if rc != 0 and rc is not None:
        problems.append(status(rc) + " at EOF (want 0)")
    if err.data.count(b"[interrupted]") != 2:
        problems.append(f"{err.data.count(b'[interrupted]')} '[interrupted]' notes (want 2)")
    check("Ctrl-C stops the reply and the chat takes the next message (twice), then exits 0 at EOF",
          not problems, f"{'; '.join(problems)}; stderr {err.data[-300:]!r}")


READ_SYSCALL = {"x86_64": "0", "aarch64": "63", "riscv64": "63"}  # read(2)'s number in /proc/PID/syscall


def proc_state(pid):
    """The state letter of pid's main thread (R, S, D, Z...), or '' when /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


def blocked_reading_stdin(pid):
    """True when pid's main thread sleeps in read(0, ...). /proc/PID/syscall names the call where it
    can be read (a parent may read its child's; the kernel needs CONFIG_HAVE_ARCH_TRACEHOOK); else
    the thread's state: after the prompt is written the only sleep before input is that read."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        fields = []
    if fields and fields[0] == "running":
        return False
    if fields and platform.machine() in READ_SYSCALL:
        return fields[0] == READ_SYSCALL[platform.machine()] and int(fields[1], 16) == 0
    return proc_state(pid) == "S"


def wait_reading(pid):
    """Until the chat blocks in its read of stdin (or has exited): keys typed earlier can be lost."""
    wait_for(lambda: blocked_reading_stdin(pid) or proc_state(pid) in ("Z", ""), 30)


def exit_code(pid):
    """The child's exit status within 30 s; a hang is a failure (killed), not a stuck test."""
    for _ in range(300):
        done, wstatus = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(wstatus)
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    _, wstatus = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wstatus)


def test_terminal(tiny):
    """On a terminal: prompts, a line ending in '\\' continued, Ctrl-C at the prompt, Ctrl-D."""
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execv(RUN, [RUN, tiny, "--chat", "--temp", "0", "-n", "4"])
        finally:
            os._exit(127)
    seen = b""

    def expect(what, timeout=60):
        nonlocal seen
        end = time.time() + timeout
        while what not in seen and time.time() < end:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    seen += os.read(fd, 4096)
                except OSError:  # the other end closed
                    break
        return what in seen

    ok = expect(b"> ")
    os.write(fd, b"line one\\\n")
    ok &= expect(b"... ")
    os.write(fd, b"line two\n")
    ok &= expect(b"[prefill ")
    stats = seen[seen.find(b"[prefill "):] if b"[prefill " in seen else b""
    ok &= expect(b"]\r\n> ", 30)  # the prompt after the turn's stats line
    # Ctrl-C must find the program in its read of the next line (a SIGINT just before that read
    # would only set a flag, and the prompt would not be asked again): the prompt is printed just
    # before it, and /proc says when the read has begun.
    reading = wait_for(lambda: blocked_reading_stdin(pid) or proc_state(pid) in ("Z", ""), 30) and \
        blocked_reading_stdin(pid)
    if not reading:
        print(f"    (the chat was not seen waiting in read(0) after its prompt; state {proc_state(pid)!r})")
    ok &= reading
    os.write(fd, b"\x03")  # Ctrl-C at the prompt: the terminal sends SIGINT
    ok &= expect(b"Ctrl-D quits")
    # Ctrl-D only once the next read has begun: libedit sets the terminal up before it reads
    # (TCSAFLUSH), which drops a key typed in between -- on a busy machine the test types fast.
    wait_reading(pid)
    os.write(fd, b"\x04")  # Ctrl-D: end of input
    rc = exit_code(pid)
    os.close(fd)
    want = render(tiny, [{"role": "user", "content": "line one\nline two"}])
    m = re.match(rb"\[prefill (\d+) tokens", stats)
    check("on a terminal: prompts, '\\' continues a message, Ctrl-C at the prompt asks again, Ctrl-D exits 0",
          ok and rc == 0 and m and int(m.group(1)) == len(want), f"{status(rc)}, output {seen[-400:]!r}")


def links_libedit():
    p = subprocess.run(["ldd", RUN], capture_output=True, text=True)
    return "libedit" in p.stdout


def test_line_editing(tiny):
    """On a terminal, with libedit: a line edited with the arrow keys, the history (Up) and its
    search (Ctrl-R) give the edited command; without line editing the escape bytes would reach the
    model as a message (a reply, a '[prefill' line) and /exit would not be read."""
    global skipped
    if not links_libedit():
        print("SKIP line editing in chat (./run was built without libedit: make deps installs libedit-dev)")
        skipped = True
        return
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execv(RUN, [RUN, tiny, "--chat", "--temp", "0", "-n", "3"])
        finally:
            os._exit(127)
    seen = b""

    def expect(what, count=1, timeout=30):
        nonlocal seen
        end = time.time() + timeout
        while seen.count(what) < count and time.time() < end:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    seen += os.read(fd, 4096)
                except OSError:
                    break
        return seen.count(what) >= count

    # Keys are typed only once libedit reads: between lines the terminal is cooked (there ^R is
    # the line discipline's reprint) and libedit's setup flushes what came before (TCSAFLUSH).
    def typed(keys):
        wait_reading(pid)
        os.write(fd, keys)

    cleared = b"[conversation cleared]"
    ok = expect(b"> ")
    typed(b"/reset\r")
    ok &= expect(cleared, 1)
    typed(b"\x1b[A\r")  # Up: the last line again
    ok &= expect(cleared, 2)
    typed(b"\x12res")  # Ctrl-R: the history searched for "res"
    time.sleep(0.5)
    os.write(fd, b"\r")
    ok &= expect(cleared, 3)
    typed(b"/ext\x1b[Di\r")  # Left, then 'i': "/exit"
    rc = exit_code(pid)
    os.close(fd)
    check("line editing on a terminal: Up recalls, Ctrl-R searches, Left edits ('/ext' <- 'i' is /exit); no message reached the model",
          ok and rc == 0 and b"[prefill" not in seen, f"{status(rc)}, output {seen[-400:]!r}")


def test_bad_input(tiny):
    r = chat(tiny, b"\xff\xfe bad bytes\n\n\nok then\n", "-n", "3")
    check("invalid UTF-8 is refused with a note, empty lines are skipped, the chat goes on",
          r.clean and "not valid UTF-8" in r.err and len(r.stats) == 1, r)
    r = chat(tiny, b"nul\x00byte\nok then\n", "-n", "3")
    check("a NUL byte is refused with a note", r.clean and "NUL byte" in r.err and len(r.stats) == 1, r)
    big = (("word " * 2_000_000)[:10 * 1024 * 1024]).encode() + b"\nhi\n"
    t0 = time.time()
    r = chat(tiny, big, "-n", "3", timeout=300)
    check(f"a 10 MB message: 'context full' note, then the next message runs ({time.time() - t0:.1f} s)",
          r.clean and "context full: the conversation needs" in r.err and len(r.stats) == 1, r)
    r = chat(tiny, b"", "-n", "3")
    check("empty input: exits 0 at once", r.clean and not r.stats and r.out == b"", r)


def main():
    with tempfile.TemporaryDirectory(prefix="pkv-chattest-") as tmp:
        tiny = os.path.join(tmp, "tiny-qwen3.bin")
        p = subprocess.run([EXPORT, TINY, tiny], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            check("export of the tiny model", False, p.stderr)
        else:
            for test in (test_turns, test_long_first_message, test_context_full, test_sigint, test_terminal,
                         test_line_editing, test_bad_input):
                try:
                    test(tiny)
                except (OSError, RuntimeError, subprocess.TimeoutExpired, UnicodeDecodeError) as e:
                    check(test.__name__ + " ran to the end", False, e)
            try:
                test_real_templates(tmp)
            except (OSError, RuntimeError, subprocess.TimeoutExpired, UnicodeDecodeError) as e:
                check("test_real_templates ran to the end", False, e)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 77 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
