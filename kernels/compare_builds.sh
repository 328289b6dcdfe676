#!/usr/bin/env bash
# On the GPU machine: two builds of ./run side by side on the same inputs -- a refactor of the
# GPU pass must leave every number unchanged. Greedy ids and --score NLLs are compared byte for
# byte over each path the GPU pass has (chunked dense prefill and decode graph, the layered
# prefill, ParisKV decode steps and ParisKV chunks, quantized weights, SmolLM2 when its GGUF is
# in /root/smol), then --bench is run old, new, old, new and the medians compared.
# Usage: kernels/compare_builds.sh OLD_DIR NEW_DIR [ids|bench|smol|all]...   (each DIR holds run, export, lib/)
set -uo pipefail
OLD=$1 NEW=$2
shift 2
STEPS=("${@:-all}")
want() { for a in "${STEPS[@]}"; do [ "$a" = "$1" ] || [ "$a" = all ] && return 0; done; return 1; }
OUT=${OUT:-/tmp/compare-out}
mkdir -p "$OUT"
status=0
echo "old: $(LD_LIBRARY_PATH=$OLD/lib $OLD/run --version 2>&1 | head -1)"
echo "new: $(LD_LIBRARY_PATH=$NEW/lib $NEW/run --version 2>&1 | head -1)"
# same NAME ENV ARGS...: the two builds' stdout must be identical (stderr kept, timings differ).
same() {
    local name=$1 env=$2
    shift 2
    for b in old new; do
        local dir=$OLD
        [ $b = new ] && dir=$NEW
        env $env LD_LIBRARY_PATH=$dir/lib:/usr/local/cuda/lib64 timeout 300 $dir/run "$@" > "$OUT/$name.$b" 2> "$OUT/$name.$b.err" ||
            { echo "FAIL $name ($b build exits $?): $(tail -n 2 "$OUT/$name.$b.err")"; status=1; return; }
    done
    if cmp -s "$OUT/$name.old" "$OUT/$name.new" && [ -s "$OUT/$name.new" ]; then
        echo "ok   $name: identical ($(wc -l < "$OUT/$name.new") lines$(grep -h mean_nll "$OUT/$name.new" | sed 's/^/, /'))"
    else
        echo "FAIL $name: the builds differ"; diff "$OUT/$name.old" "$OUT/$name.new" | head -5; status=1
    fi
}
if want ids; then
    python3 tests/random_ids.py 6 150000 6000 > /tmp/ids6k.txt
    python3 tests/random_ids.py 9 150000 9000 > /tmp/ids9k.txt
    head -c 600 /tmp/ids6k.txt | awk '{NF=64; print}' > /tmp/ids64.txt
    S="--synthetic qwen3-0.6b --ids"
    same score-dense X=0 $S --score /tmp/ids6k.txt --attn full
    same greedy-dense X=0 $S -f /tmp/ids64.txt -n 200 --temp 0 --ignore-eos --attn full
    same score-pkv-chunks X=0 $S --score /tmp/ids6k.txt --attn pariskv --kv-store host
    same score-pkv-steps PKV_NO_CHUNK=1 $S --score /tmp/ids6k.txt --attn pariskv --kv-store gpu
    same greedy-pkv-layered PKV_PREFILL_LAYERED=1 $S -f /tmp/ids9k.txt --ctx 9400 --kv-store host -n 200 --temp 0 --ignore-eos
    same greedy-pkv-fp8 X=0 $S -f /tmp/ids9k.txt --ctx 9400 --kv-store host --kv-store-dtype fp8 -n 200 --temp 0 --ignore-eos
    for q in q4_k q8_0; do
        same score-$q X=0 $S --quant $q --score /tmp/ids6k.txt --attn full
        same greedy-$q X=0 $S --quant $q -f /tmp/ids64.txt -n 200 --temp 0 --ignore-eos --attn full
    done
fi
if want smol && [ -s /root/smol/model.gguf ]; then
    LD_LIBRARY_PATH=$NEW/lib $NEW/export /root/smol/model.gguf /tmp/smol.bin > /dev/null 2>&1 || { echo "FAIL export SmolLM2"; status=1; }
    IDS=$(python3 -c "import json; print(' '.join(map(str, json.load(open('tests/data/smollm2_ref.json'))['prompts'][0]['prompt_ids'])))")
    head -c 12000 README.md > /tmp/text.txt
    same smol-greedy X=0 /tmp/smol.bin --ids -p "$IDS" -n 128 --temp 0 --ignore-eos --device gpu
    same smol-score X=0 /tmp/smol.bin --score /tmp/text.txt --device gpu --attn full
    same smol-score-pkv X=0 /tmp/smol.bin --score /tmp/text.txt --device gpu --attn pariskv --score-prompt 2100
fi
if want bench; then
    # Decode TPOT, old and new alternately on one warm GPU; the medians of each side compared.
    for m in llama3.1-8b; do
        for round in 1 2; do
            for b in old new; do
                dir=$OLD; [ $b = new ] && dir=$NEW
                LD_LIBRARY_PATH=$dir/lib:/usr/local/cuda/lib64 timeout 200 $dir/run --bench --synthetic $m --bench-ctx 4096,32768 --bench-steps 64 \
                    2>&1 | tee "$OUT/bench-$m-$b-$round.txt" | grep -E "^ +[0-9]+ \|" | sed "s/^/$b $round: /"
            done
        done
        LD_LIBRARY_PATH=$NEW/lib:/usr/local/cuda/lib64 timeout 300 $NEW/run --bench --synthetic $m --bench-ctx 131072 --attn pariskv --kv-store host \
            --bench-steps 64 2>&1 | grep -E "^ +[0-9]+ \|" | sed "s/^/new pariskv: /"
        LD_LIBRARY_PATH=$OLD/lib:/usr/local/cuda/lib64 timeout 300 $OLD/run --bench --synthetic $m --bench-ctx 131072 --attn pariskv --kv-store host \
            --bench-steps 64 2>&1 | grep -E "^ +[0-9]+ \|" | sed "s/^/old pariskv: /"
    done
fi
[ $status -eq 0 ] && echo "compare_builds: all identical" || echo "compare_builds: DIFFERENT"
exit $status
