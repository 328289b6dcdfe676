#!/usr/bin/env python3
"""Resources and interaction: what ./run and ./export do when the world misbehaves.
Each check says what must happen; each fails on the behaviour it guards against (a crash, a
hang, a half-written file, a message without its numbers, garbage output).

  - a model file truncated while mapped (SIGBUS): one line naming the file and both sizes, exit 1
  - a GGUF truncated while ./export reads it: the same, and no partial output left
  - Ctrl-C during generation: the reply stops, '[interrupted]', exit 130
  - Ctrl-C during export: the partial output is removed
  - disk full during export (tmpfs when we may mount one; RLIMIT_FSIZE always): one line with the
    byte counts, nothing left behind
  - stdout to a full disk: an error; stdout to a pipe whose reader left (| head): a quiet end,
    also when SIGPIPE came ignored or blocked from the parent
  - a FIFO where a file is expected: an error, not a hang
  - NaN weights: an error naming the position, not garbage tokens
  - EOF on stdin ends chat with status 0
Binaries: $PKV_BIN (the sanitizer build) or the repository root. The SmolLM2 GGUF ($SMOLLM2_GGUF
or build/smollm2/...) gives the export long enough to be interrupted; without it those two
checks fail. Signals and truncations come on an event the program shows (its first output, the
export's first progress line), never after a sleep. A part that cannot run here (the tmpfs, when
mounting is not allowed) prints 'SKIP <what> (<why>)'; the test then exits 77 if nothing failed."""
import errno
import os
import re
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PKV_BIN", ROOT)
RUN, EXPORT = os.path.join(BIN, "run"), os.path.join(BIN, "export")
TINY = os.path.join(ROOT, "tests", "data", "tiny-qwen3")
SMOL = os.environ.get("SMOLLM2_GGUF") or os.path.join(ROOT, "build", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

passed = failed = 0
skipped = []


def result(name, problems, detail=""):
    global passed, failed
    if problems:
        failed += 1
        print("FAIL %s: %s" % (name, "; ".join(problems)), flush=True)
    else:
        passed += 1
        print("ok   %s%s" % (name, ": " + detail if detail else ""), flush=True)


def skip(what, why):
    skipped.append(what)
    print("SKIP %s (%s)" % (what, why), flush=True)


def status(rc):
    """An exit status in words: a signal and a sanitizer report (23/24) are named."""
    if rc is None:
        return "no exit status (killed after a timeout)"
    if rc < 0:
        return "killed by signal %s" % signal.Signals(-rc).name
    return "exit status %d%s" % (rc, " (a sanitizer report)" if rc in (23, 24) else "")


def read_until(stream, pattern, timeout):
    """Reads a pipe until what was read matches pattern (a bytes regex), at EOF, or after timeout
    seconds. Returns (matched, bytes read). Never blocks past the timeout."""
    fd, data, end = stream.fileno(), b"", time.time() + timeout
    while not re.search(pattern, data):
        left = end - time.time()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return re.search(pattern, data) is not None, data


def finish(p, timeout):
    """p.communicate() within timeout, else kill it; returns (stdout, stderr, hung)."""
    try:
        out, err = p.communicate(timeout=timeout)
        return out, err, False
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return out, err, True


def one_error(stderr, *want):
    """Problems with stderr: exactly one 'error: ' line containing every string of want."""
    lines = [l for l in stderr.splitlines() if l.startswith("error: ")]
    if len(lines) != 1:
        return ["%d 'error:' lines in %r" % (len(lines), stderr[-400:])]
    return ["message %r lacks %r" % (lines[0], w) for w in want if w not in lines[0]]


def last_error(stderr):
    lines = [l for l in stderr.splitlines() if l.startswith("error")]
    return lines[-1] if lines else ""


def no_spew(stderr):
    bad = [w for w in ("error", "Sanitizer", "runtime error", "Traceback") if w in stderr]
    return ["stderr has %s: %r" % (bad, stderr[-300:])] if bad else []


def leftovers(*paths):
    return ["left %s behind" % p for p in paths if os.path.exists(p)]


PROGRESS = rb"export: +\d+% \("  # the export's progress line: part of the output is written, most is to come


def export_then(src, out, act, what, prepare=None):
    """./export src out --dtype f32 (SmolLM2: 540 MB to write, about a second), act(p) on its first
    progress line. When the export had already finished, act had nothing to act on: that attempt
    proves nothing, so it runs again (3 in all), saying so, then fails. Returns (exit status,
    stderr, problems)."""
    for attempt in range(1, 4):
        if prepare:
            prepare()
        for path in (out, out + ".tmp"):
            if os.path.exists(path):
                os.remove(path)
        p = subprocess.Popen([EXPORT, src, out, "--dtype", "f32"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        started, err = read_until(p.stderr, PROGRESS, 120)
        if started and p.poll() is None:
            act(p)
        _, rest, hung = finish(p, 120)
        err += rest
        if hung:
            return None, err.decode(errors="replace"), ["hung after %s" % what]
        if not started:
            return p.returncode, err.decode(errors="replace"), ["no progress line from the export (%s): %r"
                                                                % (status(p.returncode), err[-300:])]
        if p.returncode == 0 and b"export: wrote" in err:
            print("    (attempt %d: the export finished before %s; again)" % (attempt, what), flush=True)
            continue
        return p.returncode, err.decode(errors="replace"), []
    return 0, err.decode(errors="replace"), ["the export finished before %s 3 times: it needs more work to do" % what]


def test_truncated_model(tmp, model):
    # The prompt comes from a FIFO: ./run has mapped and checked the model and waits for the
    # prompt when the file is cut; the forward pass then reads pages that no longer exist.
    m = os.path.join(tmp, "shrink.bin")
    shutil.copyfile(model, m)
    size = os.path.getsize(m)
    fifo = os.path.join(tmp, "prompt.fifo")
    os.mkfifo(fifo)
    p = subprocess.Popen([RUN, m, "-f", fifo, "-n", "4", "--temp", "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    # The event: ./run opens the FIFO's read end (a non-blocking open for writing succeeds from
    # then on), which it does once the model is mapped and checked.
    end, fd = time.time() + 60, None
    while fd is None and p.poll() is None and time.time() < end:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            time.sleep(0.01)
    if fd is None:
        _, err, _ = finish(p, 10)
        return result("model file truncated while mapped", ["never opened the prompt FIFO (%s): %r"
                                                            % (status(p.returncode), err[-300:])])
    os.set_blocking(fd, True)
    os.truncate(m, 8192)
    os.write(fd, b"hello")
    os.close(fd)
    _, err, hung = finish(p, 60)
    if hung:
        return result("model file truncated while mapped", ["hung"])
    probs = one_error(err, "shrink.bin", "changed while in use", "8192 bytes now", "%d when" % size)
    if p.returncode != 1:
        probs.append("%s (want 1)" % status(p.returncode))
    result("model file truncated while mapped", probs, err.strip())


def test_export_interrupted(tmp):
    out = os.path.join(tmp, "int.bin")
    if not os.path.exists(SMOL):
        return result("Ctrl-C during export", ["%s is missing (make check fetches it)" % SMOL])
    rc, err, probs = export_then(SMOL, out, lambda p: p.send_signal(signal.SIGINT), "the SIGINT")
    probs += leftovers(out, out + ".tmp")
    if rc != -signal.SIGINT:
        probs.append("%s (want death by SIGINT, after the cleanup)" % status(rc))
    if "removed the partial" not in err:
        probs.append("no line about the removed partial file: %r" % err[-300:])
    result("Ctrl-C during export", probs, err.strip().splitlines()[-1] if err.strip() else "")


def test_export_source_truncated(tmp):
    if not os.path.exists(SMOL):
        return result("GGUF truncated during export", ["%s is missing (make check fetches it)" % SMOL])
    src = os.path.join(tmp, "shrink.gguf")
    size = os.path.getsize(SMOL)
    out = os.path.join(tmp, "shrink-out.bin")
    # On the first progress line: the tensors still to come are gone.
    rc, err, probs = export_then(src, out, lambda p: os.truncate(src, 1 << 20), "the truncation",
                                 prepare=lambda: shutil.copyfile(SMOL, src))
    probs += one_error(err, "shrink.gguf", "changed while in use", "%d bytes now" % (1 << 20), "%d when" % size)
    probs += leftovers(out, out + ".tmp")
    if rc != 1:
        probs.append("%s (want 1)" % status(rc))
    result("GGUF truncated during export", probs, last_error(err))


def test_ctrl_c(model):
    # --ids prints each id as it is made: once some are out, Ctrl-C must end the reply.
    p = subprocess.Popen([RUN, model, "--ids", "-p", "1 2 3", "-n", "1000000", "--ctx", "4096", "--ignore-eos",
                          "--temp", "1", "--attn", "full"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # The event: 8 bytes of ids on stdout. 4096 tokens take this model seconds, so the generation
    # is still going; if it had ended, that is said below.
    got, first = read_until(p.stdout, rb"[\s\S]{8}", 60)
    alive = p.poll() is None
    if alive:
        p.send_signal(signal.SIGINT)
    out, err, hung = finish(p, 60)
    if hung:
        return result("Ctrl-C during generation", ["did not stop"])
    err = err.decode(errors="replace")
    probs = []
    if not got:
        probs.append("no output in 60 s before the interrupt")
    if not alive or "context full" in err:
        probs.append("the generation ended before the signal (%s)" % status(p.returncode))
    if p.returncode != 130:
        probs.append("%s (want 130)" % status(p.returncode))
    if "[interrupted]" not in err or "generated" not in err:
        probs.append("stderr lacks '[interrupted]' and the stats line: %r" % err[-300:])
    result("Ctrl-C during generation", probs, "%d ids out, then stopped" % len((first + out).split()))


def test_disk_full(tmp):
    # Early: a filesystem too small is refused before anything is written (needs root to mount).
    mnt = os.path.join(tmp, "small")
    os.mkdir(mnt)
    try:
        m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", mnt], capture_output=True, text=True,
                           timeout=30)
        why = "mount: %s: %s" % (status(m.returncode), m.stderr.strip()[-200:]) if m.returncode != 0 else ""
    except (OSError, subprocess.TimeoutExpired) as e:
        why = "mount: %s" % e
    if not why:
        try:
            out = os.path.join(mnt, "m.bin")
            p = subprocess.run([EXPORT, TINY, out], capture_output=True, text=True, timeout=120)
            probs = one_error(p.stderr, "not enough disk space", "needs", "are free") + leftovers(out, out + ".tmp")
            if p.returncode != 1:
                probs.append("%s (want 1)" % status(p.returncode))
            result("export to a full disk (tmpfs)", probs, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "")
        finally:
            subprocess.run(["umount", mnt], capture_output=True, timeout=30)
    else:
        skip("export to a full disk (tmpfs): the early disk-space check", "cannot mount a tmpfs here, "
             "which needs root or CAP_SYS_ADMIN; " + why)

    # Mid-write: a file size limit makes a write fail part way (EFBIG), as a full disk would.
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))
    out = os.path.join(tmp, "lim.bin")
    p = subprocess.run([EXPORT, TINY, out], capture_output=True, text=True, timeout=120, preexec_fn=limit)
    probs = one_error(p.stderr, "cannot write", "lim.bin.tmp", "of 356352") + leftovers(out, out + ".tmp")
    if p.returncode != 1:
        probs.append("%s (want 1)" % status(p.returncode))
    result("export write fails part way (RLIMIT_FSIZE)", probs, last_error(p.stderr))


def test_stdout(tmp, model):
    ids = os.path.join(tmp, "ids.txt")
    with open(ids, "w") as f:
        f.write(" ".join(str(i) for i in range(1, 200)))
    with open("/dev/full", "w") as full:
        p = subprocess.run([RUN, model, "--score", ids, "--ids"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    probs = one_error(p.stderr, "cannot write the output", "No space left")
    if p.returncode != 1:
        probs.append("%s (want 1)" % status(p.returncode))
    result("stdout to a full disk", probs, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "")

    # `./run ... | head -c 10`: the reader leaves after 10 bytes; ./run must end at once, quietly,
    # whatever SIGPIPE disposition it inherited.
    for how, pre in (("default", None),
                     ("inherited ignored", lambda: signal.signal(signal.SIGPIPE, signal.SIG_IGN)),
                     ("inherited blocked", lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE}))):
        t0 = time.time()
        p = subprocess.Popen([RUN, model, "-p", "hello", "-n", "100000", "--ctx", "4096", "--ignore-eos", "--temp", "1",
                              "--attn", "full"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=pre)
        got, _ = read_until(p.stdout, rb"[\s\S]{10}", 60)  # the event: its first 10 bytes
        p.stdout.close()
        _, err, hung = finish(p, 60)
        if hung:
            result("broken pipe (%s)" % how, ["kept running after its reader left"])
            continue
        err = err.decode(errors="replace")
        probs = no_spew(err) + ([] if got else ["no output in 60 s"])
        if p.returncode not in (-signal.SIGPIPE, 128 + signal.SIGPIPE):
            probs.append("exit status %s (want the SIGPIPE end)" % p.returncode)
        result("broken pipe (%s)" % how, probs, "ended in %.1f s, status %s" % (time.time() - t0, p.returncode))


def test_fifos(tmp, model):
    fifo = os.path.join(tmp, "f.fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    d = os.path.join(tmp, "fifo-config")
    shutil.copytree(TINY, d)
    os.remove(os.path.join(d, "config.json"))
    os.mkfifo(os.path.join(d, "config.json"))
    out = os.path.join(tmp, "fifo-out.bin")
    for name, cmd, want in (("model file is a FIFO", [RUN, fifo, "-p", "hi"], "not a regular file"),
                            ("GGUF source is a FIFO", [EXPORT, fifo, out], "not a GGUF file"),
                            ("config.json is a FIFO", [EXPORT, d, out], "not a regular file")):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            result(name, ["hung on the FIFO"])
            continue
        probs = one_error(p.stderr, want) + leftovers(out, out + ".tmp")
        if p.returncode != 1:
            probs.append("%s (want 1)" % status(p.returncode))
        result(name, probs, p.stderr.strip())


def tensor_entry(blob, name):
    """(offset, nbytes) of a tensor in a model.bin (TensorEntry: name[48], dtype, ndim, shape[2], offset, nbytes)."""
    at = blob.find(name.encode() + b"\0")
    off, nbytes = struct.unpack_from("<QQ", blob, at + 48 + 8 + 16)
    return off, nbytes


def test_nan_weights(tmp, model):
    bad = os.path.join(tmp, "nan.bin")
    blob = bytearray(open(model, "rb").read())
    off, _ = tensor_entry(blob, "output_norm")
    struct.pack_into("<f", blob, off + 4, float("nan"))
    open(bad, "wb").write(blob)
    p = subprocess.run([RUN, bad, "--ids", "-p", "1 2 3", "-n", "4", "--temp", "0"], capture_output=True, text=True, timeout=60)
    probs = one_error(p.stderr, "non-finite logit", "position 2")
    if p.returncode != 1:
        probs.append("%s (want 1)" % status(p.returncode))
    if p.stdout.strip():
        probs.append("printed tokens: %r" % p.stdout[:80])
    result("NaN in the weights", probs, p.stderr.strip())


def test_chat_eof(model):
    for name, stdin in (("EOF on stdin ends chat (no input)", ""), ("EOF on stdin ends chat (after a message)", "hi\n")):
        try:
            p = subprocess.run([RUN, model, "--chat", "-n", "4", "--temp", "0"], input=stdin, capture_output=True,
                               text=True, timeout=120)
        except subprocess.TimeoutExpired:
            result(name, ["hung"])
            continue
        probs = no_spew(p.stderr)
        if p.returncode != 0:
            probs.append("%s (want 0)" % status(p.returncode))
        result(name, probs)


def main():
    tmp = tempfile.mkdtemp(prefix="pkv-res-")
    try:
        model = os.path.join(tmp, "tiny.bin")
        p = subprocess.run([EXPORT, TINY, model], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            print("FAIL cannot export the tiny model (%s): %s" % (status(p.returncode), p.stderr))
            print("0 passed, 1 failed")
            return 1
        test_truncated_model(tmp, model)
        test_ctrl_c(model)
        test_stdout(tmp, model)
        test_nan_weights(tmp, model)
        test_fifos(tmp, model)
        test_disk_full(tmp)
        test_chat_eof(model)
        test_export_interrupted(tmp)
        test_export_source_truncated(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    if skipped and not failed:
        print("%d part(s) skipped: exit 77" % len(skipped))
    return 1 if failed else 77 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
