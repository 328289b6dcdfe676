#!/usr/bin/env python3
"""Long-context retrieval on the real small model (issue 25, item 4): SmolLM2-135M-Instruct reads
about 2,400 tokens of real text (the GPL-3 that Debian ships) with a pass key placed at a depth,
then a question; the answer's tokens (" 5", "8", ... one digit a token) are scored after the
prompt through the attention policy (`./run --score --ids --score-prompt N`: the prompt attended
densely as -p's would be, each answer token then a decode step under the policy).

- Full attention and ParisKV: every digit of the key is the top-1 prediction, at each depth.
- StreamingLLM (the sink and the recent window, nothing from the zone, where the key is): at
  most 2 of the 5 digits are top-1, at each depth. This is the test's control: a policy that
  cannot see the zone fails it, so passing says something about the selection.

The key's position is at least 1,000 tokens before the answer, past the window (256) and the
update buffer (512). Under the sanitizers (PKV_SMOL_PROMPTS, make test-asan): one depth of a
650-token text with the regions shrunk (dense below 300, window and buffer 64).
`kernels/gpu_checks.sh passkey` runs this file on the GPU (PASSKEY_DEVICE=gpu: full attention and
ParisKV there; the control, a CPU-only peer, on the CPU), and again with the prompt's attention in
fp8 (PASSKEY_PREFILL_ATTN=fp8: --prefill-attn fp8 on the GPU runs). Needs the SmolLM2 GGUF ($SMOLLM2_GGUF,
else build/smollm2/, as `make smollm2` fetches it); missing => FAIL. About a minute on two cores."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PKV_BIN", ROOT)
EXPORT, RUN = os.path.join(BIN, "export"), os.path.join(BIN, "run")
GGUF = os.environ.get("SMOLLM2_GGUF") or os.path.join(ROOT, "build", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
TEXT = "/usr/share/common-licenses/GPL-3"
DEVICE = os.environ.get("PASSKEY_DEVICE", "cpu")
PREFILL = os.environ.get("PASSKEY_PREFILL_ATTN")  # --prefill-attn for the GPU runs (fp8)
HAYSTACK_CHARS = 11000  # ~2,400 tokens: past ParisKV's 2,000-token dense phase
CASES = [(0.15, "58291"), (0.55, "73046")]  # (depth in the text, key)
POLICY_ARGS = []
MIN_DISTANCE = 1000  # tokens between the key and the answer: past the window and the update buffer
if os.environ.get("PKV_SMOL_PROMPTS"):  # make test-asan (5x slower): ~650 tokens, one depth, the
    # same sequence of regions shrunk to fit (dense below 300, window and buffer 64)
    HAYSTACK_CHARS, CASES, MIN_DISTANCE = 3000, [(0.2, "58291")], 250
    POLICY_ARGS = ["--dense-below", "300", "--local", "64", "--update", "64"]
QUESTION = "\n\nQuestion: what is the secret pass key? Answer: the secret pass key is"

passed = failed = 0


def check(name, ok, detail=""):
    assert isinstance(name, str), "check(name, ok, detail)"
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""))


def tokenize(model, text, tmp):
    path = os.path.join(tmp, "text.txt")
    with open(path, "w") as f:
        f.write(text)
    out = subprocess.run([RUN, model, "--tokenize", "-f", path], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"--tokenize failed: {out.stderr.strip()}")
    return [int(x) for x in out.stdout.split()]


def answer_lines(model, ids_path, n_prompt, attn):
    """The per-position lines (pos, next_id, nll, top1) of the answer's tokens."""
    p = subprocess.run([RUN, model, "--score", ids_path, "--ids", "--score-prompt", str(n_prompt), "--attn", attn,
                        "--device", "cpu" if attn == "streaming" else DEVICE,  # the peers run on the CPU alone
                        *(POLICY_ARGS if attn != "full" else []),
                        *(["--prefill-attn", PREFILL] if PREFILL and attn != "streaming" else [])], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return None, p.stderr.strip().splitlines()[-1:] or ["(no message)"]
    rows = []
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) == 4 and f[0].isdigit() and int(f[0]) >= n_prompt - 1:
            rows.append((int(f[0]), int(f[1]), float(f[2]), int(f[3])))
    return rows, p.stderr.strip().splitlines()[-1:]


def main():
    if not os.path.exists(GGUF):
        check(f"SmolLM2 GGUF at {GGUF} ($SMOLLM2_GGUF; make smollm2 fetches it)", False, "missing: a missing input is not a pass")
        return
    if not os.path.exists(TEXT):
        check(f"the haystack text {TEXT} (Debian's base-files)", False, "missing")
        return
    hay = open(TEXT).read()[:HAYSTACK_CHARS]
    with tempfile.TemporaryDirectory(prefix="pkv-passkey-") as tmp:
        model = os.path.join(tmp, "smollm2.bin")
        e = subprocess.run([EXPORT, GGUF, model], capture_output=True, text=True, timeout=300)
        if e.returncode != 0:
            check("export of the SmolLM2 GGUF", False, e.stderr.strip()[-300:])
            return
        for depth, key in CASES:
            cut = hay.rfind(". ", 0, int(len(hay) * depth)) + 1  # at a sentence boundary
            needle = f" The secret pass key is {key}. Remember it: the secret pass key is {key}. "
            prompt = hay[:cut] + needle + hay[cut:] + QUESTION
            p_ids = tokenize(model, prompt, tmp)
            ids = tokenize(model, prompt + f" {key}.", tmp)
            key_at = len(tokenize(model, hay[:cut], tmp))
            n = len(p_ids)
            digits = tokenize(model, f" {key}", tmp)  # " ", then one token a digit
            tag = f"[depth {depth:.2f}: key at token {key_at} of {n}]"
            if ids[:n] != p_ids or ids[n:n + len(digits)] != digits or len(digits) != 6:
                check(f"{tag} the answer's tokens follow the prompt's", False, f"prompt {n} ids, answer {ids[n:]}, digits {digits}")
                continue
            check(f"{tag} the key sits past the window and the update buffer", n - key_at >= MIN_DISTANCE,
                  f"{n - key_at} tokens before the answer")
            ids_path = os.path.join(tmp, "ids.txt")
            with open(ids_path, "w") as f:
                f.write(" ".join(map(str, ids)))
            for attn in ("full", "pariskv", "streaming"):
                rows, msg = answer_lines(model, ids_path, n, attn)
                if rows is None:
                    check(f"{tag} --attn {attn}: ./run --score", False, " ".join(msg))
                    continue
                # the rows predicting the 5 digits: position n (predicts ids[n + 1], the first digit) .. n + 4
                pred = {pos: (nxt, nll, top) for pos, nxt, nll, top in rows}
                got = [pred.get(n + i) for i in range(5)]
                if any(g is None or g[0] != ids[n + 1 + i] for i, g in enumerate(got)):
                    check(f"{tag} --attn {attn}: the score lines of the answer's digits", False, f"{rows}")
                    continue
                right = sum(g[2] == g[0] for g in got)
                nll = " ".join(f"{g[1]:.3f}" for g in got)
                if attn == "streaming":
                    check(f"{tag} --attn streaming (the control) cannot read the key: at most 2 of 5 digits top-1",
                          right <= 2, f"{right} of 5 (digit NLLs {nll})")
                else:
                    check(f"{tag} --attn {attn} reads the key: 5 of 5 digits top-1", right == 5, f"{right} of 5 (digit NLLs {nll}; {' '.join(msg)})")


if __name__ == "__main__":
    main()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
