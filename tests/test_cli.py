#!/usr/bin/env python3
"""What a new user meets at the command line, each behaviour checked on the tiny Qwen3 model:
-n 0 prefills and prints nothing; invalid UTF-8 in -p, -f and --score is refused (as chat refuses
it), never dropped; a bad id is quoted alone; progress redraws only on a terminal and is named for
what it counts; a sampled run without --seed prints its seed, and that seed repeats it; the
summary line at load; --version; ./export --help on stdout; "1 token"; --threads; --bench
refuses a method it does not run; --kv-store takes gpu, host or auto; --kv-store-dtype bf16 or fp8
(fp8 only with a zone, in the host store); --prefill-attn bf16 or fp8 (fp8 refused on the CPU); and
what a new user trips on: '[end of text]' when the model ends, a hint to use --chat for a plain
prompt to a chat model, --echo, --tokenize --pieces, a warning for more threads than CPUs, seeds
that differ between runs started together and a chat that prints its seed."""
import ast
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PKV_BIN", ROOT)  # PKV_BIN: the sanitizer build
RUN, EXPORT = os.path.join(BIN, "run"), os.path.join(BIN, "export")
TINY = os.path.join(ROOT, "tests", "data", "tiny-qwen3")

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""))


def run(*args, stdin=None):
    return subprocess.run([RUN, *args], capture_output=True, timeout=120, stdin=subprocess.DEVNULL if stdin is None else stdin)


def refused(name, p, want):
    """Exit status exactly 1 (a clean refusal; sanitizer reports exit 23) and one error line."""
    err = p.stderr.decode(errors="replace").strip().splitlines()
    errs = [l for l in err if l.startswith("error: ")]
    check(name, p.returncode == 1 and len(errs) == 1 and want in errs[0] and p.stdout == b"",
          f"exit {p.returncode}, {errs}")


def main():
    tmp = tempfile.mkdtemp(prefix="pkv-cli-")
    model = os.path.join(tmp, "tiny.bin")
    e = subprocess.run([EXPORT, TINY, model], capture_output=True, timeout=120)
    if e.returncode != 0:
        check("export the tiny model", False, e.stderr.decode(errors="replace")[-300:])
        return

    # -n 0: the prompt is prefilled, nothing is printed, the stats line says 0 tokens.
    p = run(model, "-p", "Once upon a time", "-n", "0")
    err = p.stderr.decode()
    check("-n 0 prefills and prints nothing", p.returncode == 0 and p.stdout == b"" and "generated 0 tokens" in err,
          f"exit {p.returncode}, stdout {p.stdout[:40]!r}, {err.strip().splitlines()[-1:]}")

    # Invalid UTF-8 is refused with its offset, in every text mode.
    bad = b"ab\xff\xfecd"
    refused("invalid UTF-8 in -p is refused", run(model, "-p", bad, "-n", "2"), "not valid UTF-8: byte 0xff at offset 2")
    path = os.path.join(tmp, "bad.txt")
    with open(path, "wb") as f:
        f.write(b"some text " * 5 + bad)
    refused("invalid UTF-8 in -f is refused", run(model, "-f", path, "-n", "2"), "not valid UTF-8: byte 0xff at offset 52")
    refused("invalid UTF-8 in --score is refused", run(model, "--score", path), "not valid UTF-8: byte 0xff at offset 52")
    refused("invalid UTF-8 in --tokenize is refused", run(model, "--tokenize", "-f", path), "not valid UTF-8")

    # A bad id is quoted alone.
    refused("--ids quotes the bad id alone", run(model, "--ids", "-p", "1 abc 3", "-n", "1"), "token id 'abc' is not")
    refused("--ids: an id past the vocabulary", run(model, "--ids", "-p", "1 99999 3", "-n", "1"), "token id '99999' is not")

    # Progress in a log: plain lines (no carriage returns), a few, named for what they count.
    text = os.path.join(tmp, "long.txt")
    with open(text, "w") as f:
        f.write(" ".join(f"word{i % 97} and {i}" for i in range(140)))
    p = run(model, "--score", text)
    err = p.stderr.decode()
    lines = [l for l in err.splitlines() if l.startswith("score: ") and "/" in l]
    check("--score progress to a file: plain lines named 'score', at most 11", p.returncode == 0 and "\r" not in err
          and 1 <= len(lines) <= 11 and "prefill" not in err, f"exit {p.returncode}, {len(lines)} lines, {err[:200]!r}")

    # A sampled run without --seed prints its seed; --seed with it repeats the output.
    p = run(model, "-p", "Once upon a time", "-n", "24", "--temp", "1.0", "--ignore-eos")
    m = re.search(r"\| seed (\d+)", p.stderr.decode())
    if m:
        q = run(model, "-p", "Once upon a time", "-n", "24", "--temp", "1.0", "--ignore-eos", "--seed", m.group(1))
        check("the seed on the stats line repeats the run", p.returncode == 0 and q.returncode == 0 and p.stdout == q.stdout
              and "| seed" not in q.stderr.decode(), f"seed {m.group(1)}")
    else:
        check("a sampled run without --seed prints its seed", False, p.stderr.decode()[-200:])
    p = run(model, "-p", "Once upon a time", "-n", "4", "--temp", "0")
    check("greedy runs print no seed", p.returncode == 0 and "seed" not in p.stderr.decode())

    # The summary line at load, and "1 token".
    p = run(model, "--ids", "-p", "5", "-n", "1", "--temp", "0", "--threads", "1")
    err = p.stderr.decode()
    check("summary line: architecture, parameters, dtype, context, device, threads, attention",
          p.returncode == 0 and re.search(r"^qwen3, [0-9.]+M parameters, bf16 weights, context \d+ \(trained \d+\), cpu, 1 thread, attention dense "
                                          r"\(pariskv from \d+ tokens, the device's crossover\)$", err, re.M),
          err.strip().splitlines()[:1])
    check("'1 token', not '1 tokens'", "prompt 1 token |" in err and "generated 1 token" in err and "tokens" not in err.splitlines()[-1],
          err.strip().splitlines()[-1:])
    check("--threads 1 is fixed (not tuned)", "| threads 1\n" in err or err.rstrip().endswith("| threads 1"), err.strip().splitlines()[-1:])
    refused("--threads 0 is refused", run(model, "-p", "x", "--threads", "0"), "--threads needs an integer")
    # The GPU row cache: 2^20 lines per layer and KV head at most (past 16,384 the attention resolves
    # its claims in a hash of the step's lines; GPU memory is checked before the run).
    refused("--pkv-cache-rows 2097152 is refused", run(model, "-p", "x", "--pkv-cache-rows", "2097152"),
            "--pkv-cache-rows needs an integer in [0, 1048576]")
    refused("--pkv-cache-rows 3 is refused", run(model, "-p", "x", "--pkv-cache-rows", "3"), "--pkv-cache-rows needs 0 or a power of two")

    # --version, ./export --help on stdout.
    p = run("--version")
    # the commit it was built from (a clone's build: a hash, "-dirty" when the tree had changes)
    check("./run --version names its commit", p.returncode == 0 and
          re.match(rb"run \d+\.\d+\.\d+ \(model.bin format \d+, CUDA backend [a-z ]+, commit [0-9a-f]{7,}(-dirty)?\)\n", p.stdout), p.stdout[:100])
    p = subprocess.run([EXPORT, "--help"], capture_output=True, timeout=30)
    check("./export --help prints on stdout, exit 0", p.returncode == 0 and p.stdout.startswith(b"usage: ./export") and p.stderr == b"")
    p = subprocess.run([EXPORT, "--version"], capture_output=True, timeout=30)
    check("./export --version names its commit", p.returncode == 0 and re.match(rb"export \S+ \(model.bin format \d+, commit [0-9a-f]{7,}(-dirty)?\)\n", p.stdout),
          p.stdout[:100])

    # --stop: the output ends right before the first occurrence, which is not printed; a stop
    # string spanning several tokens is found too (it is matched on the text, held back meanwhile).
    base = run(model, "-p", "Once upon a time", "-n", "40", "--temp", "0", "--ignore-eos")
    text = base.stdout.decode(errors="replace")
    ok = base.returncode == 0 and len(text) > 30
    for a, b in ((12, 16), (20, 27)):
        stop = text[a:b]
        p = run(model, "-p", "Once upon a time", "-n", "40", "--temp", "0", "--ignore-eos", "--stop", stop, "--stop", "\x01never")
        want = text[:text.find(stop)] + "\n"
        check(f"--stop {stop!r}: output up to its first occurrence", ok and p.returncode == 0 and p.stdout.decode(errors="replace") == want,
              f"{p.stdout[:60]!r} vs {want[:60]!r}")
    refused("--stop with --ids is refused", run(model, "--ids", "-p", "1 2", "--stop", "x"), "--stop applies to text output")
    # penalties end to end (their arithmetic is tests/test_sampler.c's): a strong repeat penalty
    # changes a greedy run that repeats tokens; penalties of no effect change nothing.
    p = run(model, "-p", "Once upon a time", "-n", "40", "--temp", "0", "--ignore-eos", "--repeat-penalty", "5")
    q = run(model, "-p", "Once upon a time", "-n", "40", "--temp", "0", "--ignore-eos", "--repeat-penalty", "1",
            "--presence-penalty", "0", "--frequency-penalty", "0")
    check("--repeat-penalty 5 changes greedy output; neutral penalties do not", p.returncode == 0 and q.returncode == 0
          and p.stdout != base.stdout and q.stdout == base.stdout)
    # A chat reply cut by -n says so.
    p = subprocess.run([RUN, model, "--chat", "-n", "3", "--temp", "0", "--ignore-eos"], input=b"Hello\n", capture_output=True, timeout=60)
    check("a chat reply cut by -n is marked", p.returncode == 0 and b"[the reply was cut at -n 3 tokens]" in p.stderr, p.stderr[-200:])

    # The GPU benchmark runs full attention and ParisKV: a peer is refused, not mislabelled; a
    # store that does not exist is named.
    refused("--bench --attn quest is refused", run("--bench", "--synthetic", "qwen3-8b", "--attn", "quest"),
            "--bench --attn quest: the GPU benchmark runs full and pariskv")
    # --ids takes its ids from -f as from -p.
    with open(os.path.join(tmp, "ids.txt"), "w") as f:
        f.write("1 2 3 4")
    p, q = run(model, "--ids", "-f", os.path.join(tmp, "ids.txt"), "-n", "4", "--temp", "0"), run(model, "--ids", "-p", "1 2 3 4", "-n", "4", "--temp", "0")
    check("--ids -f FILE reads the ids of FILE (as -p does)", p.returncode == 0 and p.stdout == q.stdout and len(p.stdout.split()) == 4,
          f"exit {p.returncode}, {p.stdout[:80]!r} vs {q.stdout[:80]!r}, {p.stderr[-200:]!r}")
    refused("--kv-store disk is refused", run(model, "-p", "Hi", "--kv-store", "disk"), "--kv-store must be gpu, host or auto, not 'disk'")
    # The fp8 zone store: its values named, its place (the host store) and its need of a zone checked.
    refused("--kv-store-dtype fp16 is refused", run(model, "-p", "Hi", "--kv-store-dtype", "fp16"),
            "--kv-store-dtype must be bf16 or fp8, not 'fp16'")
    refused("--kv-store-dtype fp8 with --kv-store gpu is refused", run(model, "-p", "Hi", "--kv-store-dtype", "fp8", "--kv-store", "gpu"),
            "--kv-store-dtype fp8 keeps the retrieval zone in the host store")
    refused("--kv-store-dtype fp8 with --attn full is refused", run(model, "-p", "Hi", "--kv-store-dtype", "fp8", "--attn", "full"),
            "--kv-store-dtype fp8 applies to a retrieval zone")
    # --prefill-attn: its values named; fp8 is a GPU option, refused in one line on the CPU path.
    refused("--prefill-attn fp16 is refused", run(model, "-p", "Hi", "--prefill-attn", "fp16"), "--prefill-attn must be bf16 or fp8, not 'fp16'")
    refused("--prefill-attn fp8 on the CPU is refused", run(model, "-p", "Hi", "--prefill-attn", "fp8", "--device", "cpu"),
            "--prefill-attn fp8 runs on the GPU")
    # A long generation prints its TPOT in bins (first, middle, last 1,000 decode steps); a short one does not.
    p = run(model, "--ids", "-p", "1 2 3", "-n", "3100", "--temp", "0", "--ignore-eos", "--ctx", "3200", "--attn", "full")
    rows = [l for l in p.stderr.decode().splitlines() if re.match(r"\| (first|middle|last) \| \d+-\d+ \|", l)]
    check("-n 3100 prints TPOT bins of 1,000 steps", p.returncode == 0 and len(rows) == 3 and "| first | 1-1000 |" in rows[0]
          and "| last | 2100-3099 |" in rows[2], f"exit {p.returncode}, {rows}")
    p = run(model, "--ids", "-p", "1 2 3", "-n", "64", "--temp", "0", "--ignore-eos")
    check("-n 64 prints no TPOT bins", p.returncode == 0 and b"TPOT over the generation" not in p.stderr, f"exit {p.returncode}")
    # --score-prompt: only with --score, at most the text's length; N = the whole text scores as full attention does.
    refused("--score-prompt without --score is refused", run(model, "-p", "Hi", "--score-prompt", "4"), "--score-prompt applies to --score")
    with open(os.path.join(tmp, "ids5.txt"), "w") as f:
        f.write("1 2 3 4 5")
    refused("--score-prompt past the text is refused", run(model, "--score", os.path.join(tmp, "ids5.txt"), "--ids", "--score-prompt", "6"),
            "--score-prompt 6:")
    # 2,500 ids: past ParisKV's dense threshold (2,000), so the policy changes the scores unless they are all prompt.
    long_ids = os.path.join(tmp, "ids2500.txt")
    with open(long_ids, "w") as f:
        f.write(" ".join(str((i * 7919) % 97 + 3) for i in range(2500)))
    full = run(model, "--score", long_ids, "--ids", "--ctx", "2600", "--attn", "full")
    whole = run(model, "--score", long_ids, "--ids", "--ctx", "2600", "--attn", "pariskv", "--score-prompt", "2500")
    none = run(model, "--score", long_ids, "--ids", "--ctx", "2600", "--attn", "pariskv")
    check("--score-prompt N = the whole text scores as --attn full, without it ParisKV differs",
          full.returncode == 0 and whole.stdout == full.stdout and none.returncode == 0 and none.stdout != full.stdout and b"mean_nll" in full.stdout,
          f"exit {full.returncode} {whole.returncode} {none.returncode}, {whole.stderr[-200:]!r}")
    score_checks(model, tmp, long_ids, full, none)
    new_user_checks(model, tmp)
    # --synthetic outside --bench: generation from ids on the GPU, nothing else.
    refused("--synthetic without --ids is refused", run("--synthetic", "llama3.1-8b", "-p", "1 2"), "--synthetic has no tokenizer")
    refused("--synthetic with a model file is refused", run(model, "--synthetic", "llama3.1-8b", "--ids", "-p", "1 2"),
            "give either a model file or --synthetic NAME")
    refused("--synthetic NAME unknown is refused", run("--synthetic", "llama9", "--ids", "-p", "1 2"), "unknown --synthetic model 'llama9'")
    refused("--synthetic --chat is refused", run("--synthetic", "qwen3-8b", "--ids", "--chat"), "--synthetic runs generation, --score (or --bench) only")
    refused("--synthetic --device cpu is refused", run("--synthetic", "qwen3-8b", "--ids", "-p", "1", "--device", "cpu"),
            "--synthetic runs on the GPU")

    shutil.rmtree(tmp, ignore_errors=True)


def score_checks(model, tmp, long_ids, full, pkv):
    """--score's summary: llama-perplexity's uncertainty, the policy that scored, --summary,
    --score-out, Ctrl-C; and the default policy (dense below the device's crossover)."""
    rows = [l.split() for l in full.stdout.decode().splitlines() if l[:1].isdigit()]
    nll = [float(r[2]) for r in rows]
    mean = sum(nll) / len(nll)
    var = sum(x * x for x in nll) / len(nll) - mean * mean
    unc = math.exp(mean) * math.sqrt(var / (len(nll) - 1))
    last = full.stdout.decode().splitlines()[-1].split()
    check("the summary: mean_nll X ppl Y +/- U, U = ppl * sqrt(var(nll) / (N - 1)) as llama-perplexity prints",
          last[:3] == ["mean_nll", f"{mean:.6f}", "ppl"] and last[4] == "+/-" and abs(float(last[5]) - unc) <= 1e-5 * unc + 2e-6,
          f"{last} vs {unc:.6f}")
    check("--score says which policy scored: dense for --attn full, pariskv from 2000 for --attn pariskv",
          b"attention dense (--attn full)" in full.stderr and b"attention pariskv from 2000 tokens, top-100" in pkv.stderr,
          f"{full.stderr[-120:]!r} / {pkv.stderr[-120:]!r}")
    # The default policy: dense below the device's crossover (said on the load line and in the
    # summary), so it scores as --attn full; --dense-below D moves it.
    dflt = run(model, "--score", long_ids, "--ids", "--ctx", "2600")
    low = run(model, "--score", long_ids, "--ids", "--ctx", "2600", "--dense-below", "2000")
    check("default attention: dense below the device's crossover (scores = --attn full), the load line and summary say so",
          dflt.returncode == 0 and dflt.stdout == full.stdout and dflt.stderr.count(b"the device's crossover") == 2, dflt.stderr[-300:])
    check("--dense-below 2000 without --attn: ParisKV from there (scores = --attn pariskv)", low.returncode == 0 and low.stdout == pkv.stdout
          and b"attention pariskv from 2000 tokens" in low.stderr, low.stderr[-200:])
    refused("--dense-below with --attn full is refused", run(model, "--score", long_ids, "--ids", "--attn", "full", "--dense-below", "9"),
            "--dense-below applies to a policy")
    # --summary: the summary alone; --score-out FILE: the lines there, the summary on stdout.
    summ = run(model, "--score", long_ids, "--ids", "--ctx", "2600", "--attn", "full", "--summary")
    out = os.path.join(tmp, "lines.txt")
    sout = run(model, "--score", long_ids, "--ids", "--ctx", "2600", "--attn", "full", "--score-out", out)
    body = full.stdout.decode().splitlines()
    check("--summary prints the summary line alone", summ.returncode == 0 and summ.stdout.decode().splitlines() == body[-1:], summ.stdout[:100])
    check("--score-out FILE: the lines per position in FILE, the summary on stdout", sout.returncode == 0
          and sout.stdout.decode().splitlines() == body[-1:] and open(out).read().splitlines() == body[:-1])
    refused("--summary without --score is refused", run(model, "-p", "hi", "--summary"), "--summary and --score-out apply to --score")
    # Ctrl-C: the summary of the positions scored so far, then exit 130.
    big = os.path.join(tmp, "ids30k.txt")
    with open(big, "w") as f:
        f.write(" ".join(str((i * 7919) % 97 + 3) for i in range(30000)))
    p = subprocess.Popen([RUN, model, "--score", big, "--ids", "--attn", "full", "--ctx", "30000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.readline()  # a position scored: now interrupt
    p.send_signal(signal.SIGINT)
    rest, err = p.stdout.read(), p.stderr.read()  # not communicate(): it would skip what readline buffered
    p.wait(timeout=120)
    lines = (first + rest).decode().splitlines()
    n_rows = sum(1 for l in lines if l[:1].isdigit())
    m = re.search(rb"\[interrupted: (\d+) of 29999 positions scored; the summary is theirs\]", err)
    sub = [float(l.split()[2]) for l in lines if l[:1].isdigit()]
    check("Ctrl-C during --score: the mean of what was scored, then exit 130", p.returncode == 130 and m and int(m.group(1)) == n_rows
          and lines[-1].startswith("mean_nll ") and abs(float(lines[-1].split()[1]) - sum(sub) / len(sub)) <= 1e-6,
          f"exit {p.returncode}, {err[-200:]!r}, {lines[-1:]}, {n_rows} rows")


def demo_build_checks(tmp):
    """make demo builds the CPU path alone where nvidia-smi lists no GPU, and says where the model is.
    Read from `make -n demo` (nothing is built): a stub nvidia-smi first on PATH plays each machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "MFLAGS"}
    lines = {}
    for name, body in (("none", "exit 9"), ("gpu", "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'")):
        stub = os.path.join(tmp, "stub-" + name)
        os.makedirs(stub, exist_ok=True)
        with open(os.path.join(stub, "nvidia-smi"), "w") as f:
            f.write("#!/bin/sh\n" + body + "\n")
        os.chmod(os.path.join(stub, "nvidia-smi"), 0o755)
        p = subprocess.run(["make", "-n", "demo"], cwd=ROOT, env={**env, "PATH": stub + os.pathsep + env["PATH"]},
                           capture_output=True, text=True, timeout=300)
        lines[name] = [l for l in p.stdout.splitlines() if re.match(r"^make(\[\d+\])? .*\ball smollm2$", l) or "demo: the model is" in l]
    check("make demo without a GPU builds the CPU-only ./run (NO_CUDA=1); with one, the CUDA build",
          any("NO_CUDA=1" in l for l in lines["none"]) and any(l.endswith("all smollm2") and "NO_CUDA" not in l for l in lines["gpu"]),
          lines)
    check("make demo says where its model.bin is", any("build/smollm2/model.bin" in l for l in lines["none"]), lines["none"])


def new_user_checks(model, tmp):
    """What a new user trips on (issue 28, item 5)."""
    demo_build_checks(tmp)
    # The end of text is marked: a model whose EOS is the token greedy decoding picks first.
    first = run(model, "--ids", "-p", "5", "-n", "1", "--temp", "0").stdout.split()
    eos_dir = os.path.join(tmp, "tiny-eos")
    shutil.copytree(TINY, eos_dir)
    gen = json.load(open(os.path.join(eos_dir, "generation_config.json")))
    gen["eos_token_id"] = gen["eos_token_id"] + [int(first[0])] if first else gen["eos_token_id"]
    json.dump(gen, open(os.path.join(eos_dir, "generation_config.json"), "w"))
    eos_model = os.path.join(tmp, "tiny-eos.bin")
    subprocess.run([EXPORT, eos_dir, eos_model], capture_output=True, timeout=120)
    p = run(eos_model, "--ids", "-p", "5", "-n", "8", "--temp", "0")
    err = p.stderr.decode().splitlines()
    check("EOS at once: '[end of text]', then the stats say no decode step", p.returncode == 0 and "[end of text]" in err
          and "| no decode step | generated 1 token" in err[-1], f"exit {p.returncode}, {err[-2:]}")
    p = run(model, "--ids", "-p", "5", "-n", "8", "--temp", "0", "--ignore-eos")
    check("no '[end of text]' when the run ends at -n", p.returncode == 0 and b"[end of text]" not in p.stderr)
    # A plain prompt to a model with a chat template gets a hint; a templated prompt or ids do not.
    hint = b"note: the model has a chat template and the prompt is plain text"
    p = run(model, "-p", "What is the capital of France?", "-n", "1", "--temp", "0")
    check("a plain prompt to a chat model: a one-line hint to use --chat", p.returncode == 0 and p.stderr.count(hint) == 1 and b"--chat" in p.stderr)
    p = run(model, "-p", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "-n", "1", "--temp", "0")
    q = run(model, "--ids", "-p", "5 6", "-n", "1", "--temp", "0")
    check("a templated prompt, or ids: no hint", p.returncode == 0 and q.returncode == 0 and hint not in p.stderr and hint not in q.stderr)

    # --echo: the prompt, then exactly what the run without it prints.
    base = run(model, "-p", "Once upon a time", "-n", "8", "--temp", "0", "--ignore-eos")
    p = run(model, "-p", "Once upon a time", "-n", "8", "--temp", "0", "--ignore-eos", "--echo")
    check("--echo prints the prompt's text before the generation", p.returncode == 0 and p.stdout == b"Once upon a time" + base.stdout,
          f"{p.stdout[:60]!r}")
    base = run(model, "--ids", "-p", "1 2 3", "-n", "4", "--temp", "0", "--ignore-eos")
    p = run(model, "--ids", "-p", "1 2 3", "-n", "4", "--temp", "0", "--ignore-eos", "--echo")
    check("--echo --ids prints the prompt's ids first", p.returncode == 0 and p.stdout == b"1 2 3 " + base.stdout, f"{p.stdout[:60]!r}")
    refused("--echo with --score is refused", run(model, "--score", os.path.join(tmp, "ids5.txt"), "--ids", "--echo"), "--echo applies to generation")

    # --tokenize --pieces: the same ids, each beside its text; the texts joined are the input.
    text = 'Hi "there",\n\tcaf\u00e9 \\ done'
    ids = run(model, "--tokenize", "-p", text).stdout.split()
    p = run(model, "--tokenize", "--pieces", "-p", text)
    rows = [l.split("\t", 1) for l in p.stdout.decode().splitlines()]
    joined = "".join(ast.literal_eval(r[1]) for r in rows if len(r) == 2)
    check("--tokenize --pieces: 'id<TAB>\"text\"' per token, the ids of --tokenize, the texts joined give the input",
          p.returncode == 0 and [r[0].encode() for r in rows] == ids and joined == text, f"{p.stdout[:120]!r}")
    refused("--pieces without --tokenize is refused", run(model, "-p", "Hi", "--pieces"), "--pieces applies to --tokenize")

    # More threads than CPUs: allowed, with a warning; as many as there are CPUs: no warning.
    cpus = len(os.sched_getaffinity(0))
    p = run(model, "--ids", "-p", "5", "-n", "1", "--temp", "0", "--threads", str(cpus + 3))
    q = run(model, "--ids", "-p", "5", "-n", "1", "--temp", "0", "--threads", str(cpus))
    check("--threads past the CPUs warns (and runs)", p.returncode == 0 and f"warning: --threads {cpus + 3} is more than the {cpus} CPU".encode() in p.stderr
          and b"warning" not in q.stderr, f"{p.stderr[:200]!r}")

    # Seeds: two sampled runs started together get different seeds (not the clock's second); a chat prints its seed.
    cmd = [RUN, model, "--ids", "-p", "5", "-n", "2", "--temp", "1"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    seeds = [re.search(rb"\| seed (\d+)", pr.communicate(timeout=60)[1]) for pr in procs]
    check("two runs started together print different seeds", all(seeds) and seeds[0].group(1) != seeds[1].group(1),
          f"{[s.group(1) if s else None for s in seeds]}")
    p = subprocess.run([RUN, model, "--chat", "-n", "2", "--temp", "1"], input=b"Hi\n", capture_output=True, timeout=60)
    m = re.search(rb"\[seed (\d+) \(--seed \1 repeats these replies\)\]", p.stderr)
    q = subprocess.run([RUN, model, "--chat", "-n", "2", "--temp", "1", "--seed", m.group(1) if m else b"1"], input=b"Hi\n",
                       capture_output=True, timeout=60)
    check("a sampled chat prints its seed, and that seed repeats its replies", p.returncode == 0 and m and q.stdout == p.stdout
          and b"[seed" not in q.stderr, f"{p.stderr[:200]!r}")


main()
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
