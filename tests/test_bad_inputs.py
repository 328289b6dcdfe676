#!/usr/bin/env python3
"""Bad inputs to ./export and ./run: each must give a one-line 'error: ...' on stderr and exit
status 1 -- never a crash (signal), a sanitizer report (its own exit status: 23 in make test-asan),
a hang, or a file left behind that looks valid. The status is compared with 1 exactly: a test
that took any non-zero status as the refusal would pass on a crash."""
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "data", "tiny-qwen3")
RUN = os.path.join(os.environ.get("PKV_BIN", ROOT), "run")  # PKV_BIN: the sanitizer build
EXPORT = os.path.join(os.environ.get("PKV_BIN", ROOT), "export")

passed = failed = 0
SANITIZER_TEXT = ("Sanitizer", "runtime error:")  # ASan/LSan/UBSan reports, in case one kept status 1


def status(rc):
    """An exit status in words: a signal and a sanitizer report (23/24) are named."""
    if rc < 0:
        return f"killed by signal {signal.Signals(-rc).name}"
    return f"exit status {rc}" + (" (a sanitizer report)" if rc in (23, 24) else "")


def check_error(name, cmd, expect_in=None, leftover=None):
    """cmd must exit 1 with exactly one stderr line 'error: ...' (containing expect_in)."""
    global passed, failed
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        failed += 1
        print(f"FAIL {name}: hung (timeout)")
        return
    lines = [l for l in p.stderr.splitlines() if l.strip() and not l.startswith("export: ") and not l.startswith("\r")]
    errs = [l for l in lines if l.startswith("error: ")]
    problems = []
    if p.returncode != 1:
        problems.append(f"{status(p.returncode)} (want exactly 1, a clean refusal)")
    problems += [f"stderr has a sanitizer report ({w!r}): {p.stderr[-300:]!r}" for w in SANITIZER_TEXT
                 if w in p.stderr]
    if len(errs) != 1:
        problems.append(f"{len(errs)} 'error:' lines in stderr {p.stderr[-300:]!r}")
    elif expect_in and expect_in not in errs[0]:
        problems.append(f"message {errs[0]!r} lacks {expect_in!r}")
    for path in leftover or []:
        if os.path.exists(path):
            problems.append(f"left {path} behind")
    if problems:
        failed += 1
        print(f"FAIL {name}: " + "; ".join(problems))
    else:
        passed += 1
        print(f"ok   {name}: {errs[0]}")


def patched(src, dst, offset, data):
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(offset)
        f.write(data)
    return dst


def main():
    tmp = tempfile.mkdtemp(prefix="pkv-bad-")
    try:
        good = os.path.join(tmp, "good.bin")
        p = subprocess.run([EXPORT, TINY, good], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            print(f"FAIL cannot export the tiny model ({status(p.returncode)}):", p.stderr)
            print("0 passed, 1 failed")
            return 1
        size = os.path.getsize(good)
        ids = os.path.join(tmp, "ids.txt")
        with open(ids, "w") as f:
            f.write("1 2 3 4 5")

        # --- the model file ---
        check_error("missing model file", [RUN, os.path.join(tmp, "nope.bin"), "-p", "hi"], "cannot open")
        empty = os.path.join(tmp, "empty.bin")
        open(empty, "wb").close()
        check_error("empty model file", [RUN, empty, "-p", "hi"], "not a model file")
        junk = os.path.join(tmp, "junk.bin")
        with open(junk, "wb") as f:
            f.write(os.urandom(100000))
        check_error("random bytes", [RUN, junk, "-p", "hi"], "bad magic")
        trunc = os.path.join(tmp, "trunc.bin")
        with open(good, "rb") as f, open(trunc, "wb") as g:
            g.write(f.read(size // 2))
        check_error("truncated model file", [RUN, trunc, "-p", "hi"], "truncated")
        check_error("wrong format version", [RUN, patched(good, os.path.join(tmp, "v.bin"), 8, struct.pack("<I", 99)), "-p", "hi"], "version")
        # Config starts at byte 16: arch, n_layers, dim, ... ; n_kv_heads that does not divide n_heads.
        check_error("inconsistent config", [RUN, patched(good, os.path.join(tmp, "c.bin"), 16 + 16, struct.pack("<I", 3)), "-p", "hi"], "divide")
        check_error("unknown architecture id", [RUN, patched(good, os.path.join(tmp, "a.bin"), 16, struct.pack("<I", 7)), "-p", "hi"], "architecture")
        # Config field 8 (max_seq_len) past 2^30 would overflow the int context; field 21, the
        # sampling temperature, NaN would send the sampler past its candidates.
        check_error("context past 2^30", [RUN, patched(good, os.path.join(tmp, "ctx.bin"), 16 + 32, struct.pack("<I", 3 << 30)), "-p", "hi"], "maximum context")
        check_error("NaN sampling temperature", [RUN, patched(good, os.path.join(tmp, "t.bin"), 16 + 84, struct.pack("<f", float("nan"))), "-p", "hi"], "sampling defaults")
        # Tensor table: find the first entry (name 'token_embd') and corrupt its shape.
        blob = open(good, "rb").read()
        at = blob.find(b"token_embd\0")
        check_error("tensor shape mismatch", [RUN, patched(good, os.path.join(tmp, "s.bin"), at + 48 + 8, struct.pack("<Q", 5)), "-p", "hi"], "shape")
        check_error("tensor offset outside file", [RUN, patched(good, os.path.join(tmp, "o.bin"), at + 48 + 8 + 16, struct.pack("<Q", 1 << 40)), "-p", "hi"], "outside")
        # Quantized matrices (format 2): a file cut short, a dtype its rows are not whole blocks of,
        # a quantized dtype in a format-1 file, an unknown dtype, a byte count that disagrees.
        q8 = os.path.join(tmp, "q8.bin")
        p = subprocess.run([EXPORT, TINY, q8, "--quant", "q8_0"], capture_output=True, text=True, timeout=120)
        qblob = open(q8, "rb").read()
        qat = qblob.find(b"blk.0.attn_q\0")
        with open(q8, "rb") as f, open(trunc, "wb") as g:
            g.write(f.read(len(qblob) - 5000))
        check_error("truncated quantized model file", [RUN, trunc, "-p", "hi"], "truncated")
        check_error("q4_k dtype on rows that are not whole 256-blocks", [RUN, patched(q8, os.path.join(tmp, "q4.bin"), qat + 48, struct.pack("<I", 3)), "-p", "hi"], "whole blocks")
        check_error("unknown tensor dtype", [RUN, patched(q8, os.path.join(tmp, "u.bin"), qat + 48, struct.pack("<I", 9)), "-p", "hi"], "dtype 9")
        check_error("quantized matrix in a format-1 file", [RUN, patched(q8, os.path.join(tmp, "v1.bin"), 8, struct.pack("<I", 1)), "-p", "hi"], "expected dtype bf16 shape")
        check_error("quantized tensor byte count wrong", [RUN, patched(q8, os.path.join(tmp, "n.bin"), qat + 48 + 8 + 24, struct.pack("<Q", 64 * 64 * 2)), "-p", "hi"], "outside")

        # --- run's inputs ---
        check_error("token id out of range", [RUN, good, "--ids", "-p", "1 2 99999999", "-n", "1"], "token id")
        check_error("non-numeric token id", [RUN, good, "--ids", "-p", "1 x", "-n", "1"], "token id")
        check_error("prompt longer than context", [RUN, good, "--ids", "-p", "1 2 3 4 5 6 7 8", "--ctx", "4", "-n", "1"], "context")
        check_error("score longer than context", [RUN, good, "--score", ids, "--ids", "--ctx", "3"], "context")
        check_error("missing prompt file", [RUN, good, "-f", os.path.join(tmp, "none.txt")], "No such file or directory")
        # Input files are checked before the model loads, with the reason: the model named here
        # does not exist, so only a check made before loading it can name the directory.
        nomodel = os.path.join(tmp, "no-model.bin")
        for flags, want in ((["-f", tmp], "-f '"), (["--score", tmp], "--score '"), (["--chat", "-f", tmp], "-f '"),
                            (["--render-chat", tmp], "--render-chat '"), (["-p", "hi", "--load-session", tmp], "--load-session '")):
            check_error(f"{flags[-2]} DIR: refused before the model loads", [RUN, nomodel, *flags], want + tmp + "': is a directory")
        check_error("--save-session into a missing directory: refused before the model loads",
                    [RUN, nomodel, "-p", "hi", "--save-session", os.path.join(tmp, "nodir", "s.session")], "its directory")
        check_error("--save-session DIR: refused before the model loads", [RUN, nomodel, "-p", "hi", "--save-session", tmp], "is a directory")
        fifo = os.path.join(tmp, "fifo")
        os.mkfifo(fifo)
        check_error("--load-session FIFO: not a regular file", [RUN, nomodel, "-p", "hi", "--load-session", fifo], "not a regular file")
        check_error("bad -n", [RUN, good, "-p", "hi", "-n", "-5"], "-n")
        check_error("bad --temp", [RUN, good, "-p", "hi", "--temp", "abc"], "--temp")
        check_error("unknown option", [RUN, good, "--frobnicate"], "unknown option")
        check_error("context larger than memory", [RUN, good, "-p", "hi", "--ctx", "1000000000"], "GiB")

        # --- the exporter ---
        out = os.path.join(tmp, "out.bin")
        left = [out, out + ".tmp"]
        check_error("export: missing source", [EXPORT, os.path.join(tmp, "nodir"), out], "does not exist", left)
        d = os.path.join(tmp, "notok")
        shutil.copytree(TINY, d)
        os.remove(os.path.join(d, "tokenizer.json"))
        check_error("export: missing tokenizer.json", [EXPORT, d, out], "tokenizer.json", left)
        d = os.path.join(tmp, "arch")
        shutil.copytree(TINY, d)
        cfg = open(os.path.join(d, "config.json")).read().replace("Qwen3ForCausalLM", "MistralForCausalLM")
        open(os.path.join(d, "config.json"), "w").write(cfg)
        check_error("export: unsupported architecture", [EXPORT, d, out], "MistralForCausalLM", left)
        d = os.path.join(tmp, "badjson")
        shutil.copytree(TINY, d)
        open(os.path.join(d, "config.json"), "w").write('{"architectures": ["Qwen3ForCausalLM"], "hidden_size": ')
        check_error("export: malformed config.json", [EXPORT, d, out], "JSON", left)
        d = os.path.join(tmp, "trunc_st")
        shutil.copytree(TINY, d)
        st = os.path.join(d, "model.safetensors")
        sz = os.path.getsize(st)
        with open(st, "r+b") as f:
            f.truncate(sz - 1000)
        check_error("export: truncated safetensors", [EXPORT, d, out], "truncated", left)
        d = os.path.join(tmp, "shape")
        shutil.copytree(TINY, d)
        cfg = open(os.path.join(d, "config.json")).read().replace('"intermediate_size": ', '"intermediate_size": 1')
        open(os.path.join(d, "config.json"), "w").write(cfg)
        check_error("export: shape mismatch with config", [EXPORT, d, out], "shape", left)

        # --- GGUF ---
        gg = os.path.join(tmp, "bad.gguf")
        with open(gg, "wb") as f:
            f.write(b"GGUF" + struct.pack("<I", 3) + struct.pack("<QQ", 1, 1000000))
        check_error("gguf: counts larger than the file", [EXPORT, gg, out], "implausible", left)
        with open(gg, "wb") as f:
            f.write(b"GGUF" + struct.pack("<I", 2) + struct.pack("<QQ", 0, 0))
        check_error("gguf: version 2", [EXPORT, gg, out], "version 2", left)
        with open(gg, "wb") as f:  # one tensor of type Q6_K (14), arch llama, nothing else: the metadata is what is missing
            kv = struct.pack("<Q", 20) + b"general.architecture" + struct.pack("<IQ", 8, 5) + b"llama"
            t = struct.pack("<Q", 17) + b"token_embd.weight" + struct.pack("<IQQIQ", 2, 256, 4, 14, 0)
            f.write(b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + kv + t)
            f.write(b"\0" * (4096))
        check_error("gguf: incomplete metadata", [EXPORT, gg, out], "lacks", left)
        # A negative BOS id (int32 -1) in a real tiny GGUF: refused, not read as "no BOS".
        seed = open(os.path.join(ROOT, "tests", "fuzz", "corpus", "gguf", "tiny-llama-q.gguf"), "rb").read()
        key = b"tokenizer.ggml.bos_token_id"
        at = seed.find(key) + len(key)
        bad = seed[:at] + struct.pack("<Ii", 5, -1) + seed[at + 8:]  # type INT32, value -1
        with open(gg, "wb") as f:
            f.write(bad)
        check_error("gguf: negative BOS id", [EXPORT, gg, out], "bos_token_id", left)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
