#!/usr/bin/env bash
# On the GPU machine, from the repo root, with binaries from kernels/prepare_device.sh in .dev/:
# kernel tests against the CPU reference, whole-model GPU vs CPU, and the decode benchmark.
# Usage: kernels/gpu_checks.sh [kernels|models|bench|all]...
set -u
export LD_LIBRARY_PATH=$PWD/.dev/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
D=.dev
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
status=0
want() { for a in "${STEPS[@]}"; do [ "$a" = "$1" ] || [ "$a" = all ] && return 0; done; return 1; }
STEPS=("${@:-all}")
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if want kernels; then
    for t in $D/test_kernels; do echo "=== $t"; $t 2>&1 | tee "$OUT/$(basename $t).log" || status=1; done
fi
if want models; then
    for d in tiny-llama31 tiny-qwen3 tiny-llama-fp16; do
        $D/export tests/data/$d /tmp/$d.bin >/dev/null 2>&1 || { echo "FAIL export $d"; status=1; continue; }
        $D/run /tmp/$d.bin --score tests/data/$d/ids.txt --ids --device cpu > /tmp/$d.cpu 2>/dev/null
        $D/run /tmp/$d.bin --score tests/data/$d/ids.txt --ids --device gpu > /tmp/$d.gpu 2>"$OUT/$d.gpu.err" || cat "$OUT/$d.gpu.err"
        python3 tests/compare_scores.py /tmp/$d.gpu tests/data/$d/ref_score.txt 5e-2 || status=1
        python3 tests/compare_scores.py /tmp/$d.cpu tests/data/$d/ref_score.txt 1e-3 || status=1
        g=$($D/run /tmp/$d.bin --ids -p "$(head -c 40 tests/data/$d/ids.txt | awk '{NF=10; print}')" -n 32 --temp 0 --ignore-eos --device gpu 2>"$OUT/$d.greedy.err")
        c=$($D/run /tmp/$d.bin --ids -p "$(head -c 40 tests/data/$d/ids.txt | awk '{NF=10; print}')" -n 32 --temp 0 --ignore-eos --device cpu 2>/dev/null)
        [ "$g" = "$c" ] && echo "ok   $d greedy 32 tokens GPU == CPU" || { echo "DIFF $d greedy GPU: $g"; echo "                 CPU: $c"; cat "$OUT/$d.greedy.err"; }
    done
fi
if want smollm2; then
    # The real model (assembled from parts carried by earlier calls: the GGUF is larger than one call may carry).
    G=/root/smol/model.gguf
    if [ ! -f $G ]; then cat /root/smol/part0* > $G; fi
    md5sum $G
    $D/export $G /tmp/smol.bin > /dev/null 2>&1 || { echo "FAIL export SmolLM2"; status=1; }
    for p in "The capital of France is" "def fibonacci(n):" "<|im_start|>user
What is the tallest mountain in the world?<|im_end|>
<|im_start|>assistant
"; do
        ids=$($D/run /tmp/smol.bin --tokenize -p "$p")
        g=$($D/run /tmp/smol.bin --ids -p "$ids" -n 64 --temp 0 --ignore-eos --device gpu 2>"$OUT/smol.err")
        c=$($D/run /tmp/smol.bin --ids -p "$ids" -n 64 --temp 0 --ignore-eos --device cpu 2>/dev/null)
        if [ "$g" = "$c" ]; then echo "ok   SmolLM2 greedy 64 tokens GPU == CPU for '${p:0:30}'"; else
            echo "DIFF SmolLM2 greedy for '${p:0:30}'"; echo " GPU: $g"; echo " CPU: $c"; cat "$OUT/smol.err"; status=1; fi
    done
    head -c 12000 .smol/paper.txt > /tmp/paper.txt
    $D/run /tmp/smol.bin --score /tmp/paper.txt --device gpu > /tmp/smol.gpu.score 2>/dev/null
    $D/run /tmp/smol.bin --score /tmp/paper.txt --device cpu > /tmp/smol.cpu.score 2>/dev/null
    python3 tests/compare_scores.py /tmp/smol.gpu.score /tmp/smol.cpu.score 0.1 || status=1
fi
if want bench; then
    for m in qwen3-8b llama3.1-8b; do
        echo "=== bench $m"
        $D/run --bench --synthetic $m --bench-ctx 4096,32768,131072 --bench-steps 64 2>&1 | tee "$OUT/bench-$m.txt" || status=1
    done
fi
exit $status
