#!/usr/bin/env bash
# K-quant GGUF import end to end on a real model (issue 13): by hand, not in CI (it builds
# llama.cpp and takes a while on two cores).
#
#   bash tests/bench/kquant_check.sh        # from anywhere, after `make` and `make smollm2`
#
# On two shared cores: about 25 min to build llama.cpp the first time, then about 15 min.
#
# 1. Builds llama.cpp's llama-quantize, llama-perplexity and llama-tokenize (CPU only) from the
#    llama.cpp that the PyPI sdist of llama-cpp-python vendors, under $KQ_WORK (default
#    /tmp/kquant_check); nothing is written inside the repository.
# 2. SmolLM2-135M-Instruct.Q4_1.gguf (what `make smollm2` fetches) -> F16 (llama-quantize
#    --allow-requantize: the Q4_1 values, dequantized) -> Q4_K_M, Q5_K_M, Q6_K, Q3_K_M, Q2_K, and
#    Q2_K with --pure ($KQ_TYPES; TYPE-pure passes --pure). SmolLM2-135M's rows are 576 wide, not
#    whole 256-element super-blocks, so llama.cpp puts those tensors in fallback types (Q5_0, Q5_1,
#    Q8_0, Q4_0) and only the 1536-wide ffn_down matrices are K-quants (the presets' own mix: the
#    Q2_K preset's are Q3_K, hence Q2_K-pure): the census column says what each file holds.
# 3. For the Q4_1 source and each K-quant file: ./export (bf16), then on the same text
#    (the first $KQ_CHARS characters of $KQ_TEXT, default the GPL-3 text every Debian has) cut
#    into $KQ_CHUNKS chunks of 512 tokens, each scored alone as llama-perplexity does:
#      mean NLL (ours)  every position of every chunk, ./run --score --ids --attn full
#      ppl (ours)       exp(mean NLL) over the positions llama-perplexity scores: the second half
#                       of each chunk (positions 256..510 predicting tokens 257..511), no BOS
#                       (SmolLM2's GGUF sets add_bos_token false)
#      ppl llama.cpp    llama-perplexity -c 512 --chunks $KQ_CHUNKS, its "Final estimate", on the
#                       file and on GGML's own F32 dequantization of it (llama-quantize F32): the
#                       first differs from ours by llama.cpp's 8-bit quantized activations in its
#                       quantized matrix products, the second by little more than bf16 weights
#      f32=             ./export --dtype f32 of the file and of GGML's F32 dequantization of it give
#                       byte-identical model.bin files: our dequantization is GGML's, bit for bit
#    and a greedy generation (--temp 0) of a chat prompt, printed after the table.
# The two tokenizations (./run --tokenize, llama-tokenize) are compared first: the ppl columns
# are comparable only when they agree, and the script says so.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
W=${KQ_WORK:-/tmp/kquant_check}
VER=${KQ_LLAMA_CPP_PYTHON:-0.3.36}
SRC=${KQ_GGUF:-$ROOT/build/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
TYPES=${KQ_TYPES:-Q4_K_M Q5_K_M Q6_K Q3_K_M Q2_K Q2_K-pure}
TEXT_SRC=${KQ_TEXT:-/usr/share/common-licenses/GPL-3}
CHARS=${KQ_CHARS:-12000}
CHUNKS=${KQ_CHUNKS:-5}
JOBS=${KQ_JOBS:-2}
CTX=512
PROMPT=$(printf '<|im_start|>user\nWrite a short paragraph about why the sky is blue.<|im_end|>\n<|im_start|>assistant\n')
[ -f "$SRC" ] || { echo "no $SRC: run 'make smollm2' first (or set KQ_GGUF)"; exit 1; }
[ -x ./export ] && [ -x ./run ] || { echo "build ./run and ./export first (make)"; exit 1; }
mkdir -p "$W"
B=$W/llama-build/bin

# ---- 1. llama.cpp tools ----
if ! [ -x "$B/llama-quantize" ] || ! [ -x "$B/llama-perplexity" ] || ! [ -x "$B/llama-tokenize" ]; then
    if ! [ -d "$W/llama_cpp_python-$VER" ]; then
        python3 -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$VER" -d "$W"
        tar -xzf "$W/llama_cpp_python-$VER.tar.gz" -C "$W"
    fi
    cmake -S "$W/llama_cpp_python-$VER/vendor/llama.cpp" -B "$W/llama-build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$W/cmake.log" 2>&1
    cmake --build "$W/llama-build" --target llama-quantize llama-perplexity llama-tokenize -j"$JOBS" \
        >"$W/build.log" 2>&1 || { tail -20 "$W/build.log"; exit 1; }
fi

# ---- the text and its tokens ----
head -c "$CHARS" "$TEXT_SRC" >"$W/text.txt"
./export "$SRC" "$W/tokenizer.bin" >/dev/null 2>&1 # the source's tokenizer, for --tokenize
./run "$W/tokenizer.bin" --tokenize -f "$W/text.txt" 2>/dev/null | tr -s ' \n' '\n\n' | grep . >"$W/ids_ours.txt"
"$B/llama-tokenize" -m "$SRC" -f "$W/text.txt" --ids --log-disable 2>/dev/null | tr -d '[],' | tr -s ' \n' '\n\n' |
    grep . >"$W/ids_llama.txt" || true
n_tok=$(wc -l <"$W/ids_ours.txt")
if cmp -s "$W/ids_ours.txt" "$W/ids_llama.txt"; then
    echo "tokenization: ours and llama.cpp's agree ($n_tok tokens)"
else
    echo "WARNING tokenization: ours ($n_tok tokens) and llama.cpp's ($(wc -l <"$W/ids_llama.txt") tokens) differ: the ppl columns are not comparable"
fi
[ "$n_tok" -ge $((CHUNKS * CTX)) ] || { echo "the text has $n_tok tokens, fewer than $CHUNKS chunks of $CTX: raise KQ_CHARS"; exit 1; }
for ((c = 0; c < CHUNKS; c++)); do
    sed -n "$((c * CTX + 1)),$(((c + 1) * CTX))p" "$W/ids_ours.txt" | tr '\n' ' ' >"$W/chunk$c.ids"
done

# ---- 2. the K-quant files ----
if ! [ -s "$W/smollm2-F16.gguf" ]; then
    "$B/llama-quantize" --allow-requantize "$SRC" "$W/smollm2-F16.gguf" F16 >"$W/quantize-F16.log" 2>&1 ||
        { tail -5 "$W/quantize-F16.log"; exit 1; }
fi
files=("$SRC")
for t in $TYPES; do
    f=$W/smollm2-$t.gguf
    if ! [ -s "$f" ]; then
        pure=() && [ "${t%-pure}" != "$t" ] && pure=(--pure) # TYPE-pure: every tensor that fits in TYPE
        "$B/llama-quantize" "${pure[@]}" "$W/smollm2-F16.gguf" "$f" "${t%-pure}" "$JOBS" >"$W/quantize-$t.log" 2>&1 ||
            { tail -5 "$W/quantize-$t.log"; exit 1; }
    fi
    files+=("$f")
done

census() { # "Q8_0:1 Q4_K:21 ..." of a GGUF's matrices (needs the gguf package; else "-")
    python3 - "$1" <<'EOF' 2>/dev/null || echo "-"
import sys, collections
from gguf import GGUFReader
c = collections.Counter(t.tensor_type.name for t in GGUFReader(sys.argv[1]).tensors if len(t.shape) == 2)
print(" ".join("%s:%d" % kv for kv in sorted(c.items())))
EOF
}

# ---- 3. export, score, compare, generate ----
ppl_llama() { # llama-perplexity's final estimate on the text
    "$B/llama-perplexity" -m "$1" -f "$W/text.txt" -c $CTX -b $CTX --chunks "$CHUNKS" -t "$JOBS" 2>&1 |
        sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p'
}
rel() { [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.2f%%", 100 * (a / b - 1) }' || echo "-"; }
rows=() gens=()
for f in "${files[@]}"; do
    name=$(basename "$f" .gguf)
    bin=$W/$name.bin
    t0=$(date +%s.%N)
    if ! ./export "$f" "$bin" >"$W/$name.export.log" 2>&1; then
        rows+=("$(printf '%-28s export FAILED: %s' "$name" "$(tail -1 "$W/$name.export.log")")")
        continue
    fi
    t_exp=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
    : >"$W/$name.nll"
    for ((c = 0; c < CHUNKS; c++)); do
        ./run "$bin" --score "$W/chunk$c.ids" --ids --attn full 2>/dev/null | grep -P '^\d+\t' >>"$W/$name.nll"
    done
    read -r mean_all ppl_ours < <(awk -F'\t' -v first=$((CTX / 2)) '
        { s += $3; n++ } $1 >= first { h += $3; m++ }
        END { printf "%.4f %.4f\n", s / n, exp(h / m) }' "$W/$name.nll")
    ppl_ll=$(ppl_llama "$f")
    # GGML's own dequantization of the file (llama-quantize to F32) must export to the very bytes
    # ours gives with --dtype f32; llama.cpp on those F32 weights isolates its quantized-activation
    # arithmetic from the import.
    deq=$W/$name.ggml-F32.gguf same=- ppl_deq=
    if "$B/llama-quantize" --allow-requantize "$f" "$deq" F32 "$JOBS" >"$W/$name.ggml-F32.log" 2>&1; then
        ./export "$deq" "$W/a.f32.bin" --dtype f32 >/dev/null 2>&1 && ./export "$f" "$W/b.f32.bin" --dtype f32 >/dev/null 2>&1 &&
            { cmp -s "$W/a.f32.bin" "$W/b.f32.bin" && same=yes || same=NO; }
        rm -f "$W/a.f32.bin" "$W/b.f32.bin"
        ppl_deq=$(ppl_llama "$deq")
        rm -f "$deq"
    fi
    size=$(awk -v s="$(stat -c %s "$f")" 'BEGIN { printf "%.1f", s / 1048576 }')
    rows+=("$(printf '%-28s %6s %6.1f %8s %8s %8s %7s %8s %7s %5s  %s' "$name" "$size" "$t_exp" "$mean_all" "$ppl_ours" \
        "${ppl_ll:--}" "$(rel "$ppl_ours" "$ppl_ll")" "${ppl_deq:--}" "$(rel "$ppl_ours" "$ppl_deq")" "$same" "$(census "$f")")")
    gens+=("$name: $(./run "$bin" -p "$PROMPT" -n 48 --temp 0 2>/dev/null | tr '\n' ' ')")
done

echo
echo "text: first $CHARS characters of $TEXT_SRC, $CHUNKS chunks of $CTX tokens; ours: ./export (bf16) + ./run --score"
echo "ppl_ll: llama-perplexity on the file; ppl_llF32: on GGML's F32 dequantization of it (llama-quantize F32);"
echo "d: ours / theirs - 1; f32=: ./export --dtype f32 of the file and of GGML's F32 dequantization are byte-identical"
printf '%-28s %6s %6s %8s %8s %8s %7s %8s %7s %5s  %s\n' file MiB exp_s mean_nll ppl_ours ppl_ll d ppl_llF32 d f32= matrices
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "greedy (--temp 0, 48 tokens):"
for g in "${gens[@]}"; do echo "  $g"; done
