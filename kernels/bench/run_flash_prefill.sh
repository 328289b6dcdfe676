#!/bin/bash
# One device call: correctness of the listed kernels, then their benchmarks, then memcheck on the small
# cases. Expects build/fp/test_flash_prefill built here (carried); rebuilds it on the device if it cannot run.
#   CHECK="mma wgmma" BENCH="wgmma mma" MEMCHECK=wgmma bash kernels/bench/run_flash_prefill.sh
# Logs go to $OUT (or ./fp_logs).
set -o pipefail
OUT=${OUT:-fp_logs}; mkdir -p "$OUT"
CHECK=${CHECK:-"mma wgmma"}; BENCH=${BENCH:-"wgmma mma"}; MEMCHECK=${MEMCHECK:-wgmma}
B=build/fp/test_flash_prefill
if ! $B info >/dev/null 2>&1; then
  echo "rebuilding on the device"; mkdir -p build/fp
  nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -o $B kernels/test_flash_prefill.cu kernels/flash_prefill.cu -lpthread || exit 1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt" 2>&1
for i in $CHECK; do timeout 90 $B check $i 2>&1 | tee "$OUT/check_$i.txt"; done
for i in $BENCH; do timeout 120 $B bench $i 2>&1 | tee "$OUT/bench_$i.txt"; done
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv >> "$OUT/smi.txt" 2>&1
for i in $MEMCHECK; do timeout 100 compute-sanitizer --tool memcheck $B small $i > "$OUT/memcheck_$i.txt" 2>&1; echo "memcheck $i rc $?" >> "$OUT/memcheck_$i.txt"; done
echo "==== summary"; cat "$OUT/smi.txt"
for i in $CHECK; do echo "check $i: $(grep -h -E '^check:' "$OUT/check_$i.txt") $(grep -c FAIL "$OUT/check_$i.txt") FAIL lines"; done
for i in $BENCH; do echo "bench $i"; grep -h -E "^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+|^chunk" "$OUT/bench_$i.txt"; done
for i in $MEMCHECK; do tail -2 "$OUT/memcheck_$i.txt"; done
