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
checks fail."""
import os
import resource
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


def result(name, problems, detail=""):
    global passed, failed
    if problems:
        failed += 1
        print("FAIL %s: %s" % (name, "; ".join(problems)), flush=True)
    else:
        passed += 1
        print("ok   %s%s" % (name, ": " + detail if detail else ""), flush=True)


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


def wait_for(path, text, timeout):
    """Waits until the file at path contains text; True when it does."""
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return True
        time.sleep(0.05)
    return False


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
    with open(fifo, "w") as f:  # opens once ./run opens its end
        os.truncate(m, 8192)
        f.write("hello")
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        return result("model file truncated while mapped", ["hung"])
    probs = one_error(err, "shrink.bin", "changed while in use", "8192 bytes now", "%d when" % size)
    if p.returncode != 1:
        probs.append("exit status %s (want 1)" % p.returncode)
    result("model file truncated while mapped", probs, err.strip())


def test_export_interrupted(tmp):
    out = os.path.join(tmp, "int.bin")
    if not os.path.exists(SMOL):
        return result("Ctrl-C during export", ["%s is missing (make check fetches it)" % SMOL])
    log = os.path.join(tmp, "int.log")
    with open(log, "w") as lf:
        p = subprocess.Popen([EXPORT, SMOL, out, "--dtype", "f32"], stderr=lf, stdout=subprocess.DEVNULL)
        started = wait_for(log, "export:", 120)
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
    err = open(log).read()
    probs = [] if started else ["export never started writing"]
    probs += leftovers(out, out + ".tmp")
    if p.returncode != -signal.SIGINT:
        probs.append("exit status %s (want death by SIGINT, after the cleanup)" % p.returncode)
    if "removed the partial" not in err:
        probs.append("no line about the removed partial file: %r" % err[-300:])
    result("Ctrl-C during export", probs, err.strip().splitlines()[-1] if err.strip() else "")


def test_export_source_truncated(tmp):
    if not os.path.exists(SMOL):
        return result("GGUF truncated during export", ["%s is missing (make check fetches it)" % SMOL])
    src = os.path.join(tmp, "shrink.gguf")
    shutil.copyfile(SMOL, src)
    size = os.path.getsize(src)
    out = os.path.join(tmp, "shrink-out.bin")
    log = os.path.join(tmp, "shrink.log")
    with open(log, "w") as lf:
        p = subprocess.Popen([EXPORT, src, out, "--dtype", "f32"], stderr=lf, stdout=subprocess.DEVNULL)
        started = wait_for(log, "export:", 120)
        os.truncate(src, 1 << 20)  # the tensors still to come are gone
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
    err = open(log).read()
    probs = [] if started else ["export never started writing"]
    probs += one_error(err, "shrink.gguf", "changed while in use", "%d bytes now" % (1 << 20), "%d when" % size)
    probs += leftovers(out, out + ".tmp")
    if p.returncode != 1:
        probs.append("exit status %s (want 1)" % p.returncode)
    result("GGUF truncated during export", probs, last_error(err))


def test_ctrl_c(model):
    # --ids prints each id as it is made: once some are out, Ctrl-C must end the reply.
    p = subprocess.Popen([RUN, model, "--ids", "-p", "1 2 3", "-n", "1000000", "--ctx", "4096", "--ignore-eos",
                          "--temp", "1", "--attn", "full"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.read(8)
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        return result("Ctrl-C during generation", ["did not stop"])
    err = err.decode()
    probs = []
    if p.returncode != 130:
        probs.append("exit status %s (want 130)" % p.returncode)
    if "[interrupted]" not in err or "generated" not in err:
        probs.append("stderr lacks '[interrupted]' and the stats line: %r" % err[-300:])
    if len(first) < 8:
        probs.append("no output before the interrupt")
    result("Ctrl-C during generation", probs, "%d ids out, then stopped" % len((first + out).split()))


def test_disk_full(tmp):
    # Early: a filesystem too small is refused before anything is written (needs root to mount).
    mnt = os.path.join(tmp, "small")
    os.mkdir(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", mnt], capture_output=True).returncode == 0:
        try:
            out = os.path.join(mnt, "m.bin")
            p = subprocess.run([EXPORT, TINY, out], capture_output=True, text=True, timeout=120)
            probs = one_error(p.stderr, "not enough disk space", "needs", "are free") + leftovers(out, out + ".tmp")
            if p.returncode != 1:
                probs.append("exit status %s" % p.returncode)
            result("export to a full disk (tmpfs)", probs, p.stderr.strip().splitlines()[-1])
        finally:
            subprocess.run(["umount", mnt])
    else:
        print("note: cannot mount a tmpfs here (not root?): the early disk-space check is not exercised")

    # Mid-write: a file size limit makes a write fail part way (EFBIG), as a full disk would.
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))
    out = os.path.join(tmp, "lim.bin")
    p = subprocess.run([EXPORT, TINY, out], capture_output=True, text=True, timeout=120, preexec_fn=limit)
    probs = one_error(p.stderr, "cannot write", "lim.bin.tmp", "of 356352") + leftovers(out, out + ".tmp")
    if p.returncode != 1:
        probs.append("exit status %s" % p.returncode)
    result("export write fails part way (RLIMIT_FSIZE)", probs, last_error(p.stderr))


def test_stdout(tmp, model):
    ids = os.path.join(tmp, "ids.txt")
    with open(ids, "w") as f:
        f.write(" ".join(str(i) for i in range(1, 200)))
    with open("/dev/full", "w") as full:
        p = subprocess.run([RUN, model, "--score", ids, "--ids"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    probs = one_error(p.stderr, "cannot write the output", "No space left")
    if p.returncode != 1:
        probs.append("exit status %s" % p.returncode)
    result("stdout to a full disk", probs, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "")

    # `./run ... | head -c 10`: the reader leaves after 10 bytes; ./run must end at once, quietly,
    # whatever SIGPIPE disposition it inherited.
    for how, pre in (("default", None),
                     ("inherited ignored", lambda: signal.signal(signal.SIGPIPE, signal.SIG_IGN)),
                     ("inherited blocked", lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE}))):
        t0 = time.time()
        p = subprocess.Popen([RUN, model, "-p", "hello", "-n", "100000", "--ctx", "4096", "--ignore-eos", "--temp", "1",
                              "--attn", "full"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=pre)
        p.stdout.read(10)
        p.stdout.close()
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            result("broken pipe (%s)" % how, ["kept running after its reader left"])
            continue
        err = err.decode(errors="replace")
        probs = no_spew(err)
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
            probs.append("exit status %s" % p.returncode)
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
        probs.append("exit status %s" % p.returncode)
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
            probs.append("exit status %s (want 0)" % p.returncode)
        result(name, probs)


def main():
    tmp = tempfile.mkdtemp(prefix="pkv-res-")
    try:
        model = os.path.join(tmp, "tiny.bin")
        p = subprocess.run([EXPORT, TINY, model], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            print("FAIL cannot export the tiny model:", p.stderr)
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
