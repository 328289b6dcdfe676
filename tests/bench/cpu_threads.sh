#!/usr/bin/env bash
# CPU decode TPOT and prefill speed of SmolLM2-135M by thread setting, on an idle machine and
# beside one busy-loop process (what a shared machine does to fork-join parallelism). Prints a
# Markdown table of medians over REPS runs. Run on an otherwise idle machine:
#   bash tests/bench/cpu_threads.sh [model.bin] [REPS]
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
M=${1:-build/smollm2/model.bin}
REPS=${2:-5}
[ -f "$M" ] || { echo "no model at $M (make smollm2)"; exit 1; }
# Decode: a short chat prompt, 128 greedy tokens. Prefill: a 512-token prompt, -n 0.
PROMPT=$(printf '<|im_start|>user\nTell me a story about a lighthouse.<|im_end|>\n<|im_start|>assistant\n')
LONG=$(mktemp /tmp/pkv-long-XXXXXX)
python3 - "$LONG" <<'PY'
import sys
words = "the keeper of the lighthouse walked up the stairs every evening and lit the lamp while ships passed".split()
open(sys.argv[1], "w").write(" ".join(words[i % len(words)] for i in range(470)))
PY
busy_pid=
cleanup() { [ -n "$busy_pid" ] && kill "$busy_pid" 2>/dev/null; rm -f "$LONG"; }
trap cleanup EXIT

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
measure() { # $1: extra args; prints "tpot prefill_tok_s"
    local t p
    t=$(for i in $(seq "$REPS"); do ./run "$M" -p "$PROMPT" -n 128 --temp 0 --ignore-eos $1 2>&1 >/dev/null | sed -n 's/.*decode \([0-9.]*\) ms.*/\1/p'; done | median)
    p=$(for i in $(seq "$REPS"); do ./run "$M" -f "$LONG" -n 0 $1 2>&1 >/dev/null | sed -n 's/.*prefill \([0-9.]*\) tok\/s.*/\1/p'; done | median)
    echo "$t $p"
}
echo "| machine | threads | decode TPOT ms (median of $REPS) | prefill 512 tokens, tok/s |"
echo "| --- | --- | --- | --- |"
for cond in idle busy; do
    if [ $cond = busy ]; then (while :; do :; done) & busy_pid=$!; fi
    for thr in "--threads 1" "--threads 2" ""; do
        r=$(measure "$thr")
        echo "| $cond | ${thr:-default (tuned)} | ${r% *} | ${r#* } |"
    done
done
