#!/usr/bin/env bash
# Runs libFuzzer harnesses (build-fuzz/fuzz_NAME, from `make fuzz-build`) for SECONDS each, one
# after the other, starting from the committed seeds (tests/fuzz/corpus/NAME) and regression
# inputs (tests/fuzz/regressions/NAME). New inputs go to build-fuzz/corpus/NAME (kept between runs
# with FUZZ_KEEP=1), crashes to build-fuzz/crashes/. Prints a line per harness and exits 1 if any
# crashed: copy the crash into tests/fuzz/regressions/NAME/, fix, rerun.
# Usage: tests/fuzz/run_fuzz.sh SECONDS NAME...
set -u
cd "$(dirname "$0")/../.." || exit 1
secs=$1; shift
export OMP_NUM_THREADS=1
# libgomp/libomp's thread pool outlives the input: not a leak of ours (tests/sanitize.supp).
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitize.supp:print_suppressions=0
mkdir -p build-fuzz/crashes
status=0
printf '%-12s %8s %6s %10s %7s %s\n' harness seconds execs/s execs corpus result
for name in "$@"; do
    work=build-fuzz/corpus/$name
    [ "${FUZZ_KEEP:-0}" = 1 ] || rm -rf "$work"
    mkdir -p "$work" "tests/fuzz/regressions/$name"
    log=build-fuzz/$name.log
    t0=$SECONDS
    build-fuzz/fuzz_$name -max_total_time="$secs" -timeout=20 -rss_limit_mb=3072 -print_final_stats=1 \
        -artifact_prefix="build-fuzz/crashes/$name-" "$work" "tests/fuzz/corpus/$name" \
        "tests/fuzz/regressions/$name" > "$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    corpus=$(ls "$work" | wc -l)
    if [ $rc -eq 0 ]; then
        result=ok
    else
        result="FAILED (exit $rc): $(ls -t build-fuzz/crashes/$name-* 2>/dev/null | head -1)"
        status=1
    fi
    printf '%-12s %8d %6s %10s %7d %s\n' "$name" $((SECONDS - t0)) "${rate:-?}" "${execs:-?}" "$corpus" "$result"
    [ $rc -eq 0 ] || grep -E -A25 'ERROR|==[0-9]+==|runtime error|deadly signal|^bad |differs|does not match|cover' "$log" | head -60
done
exit $status
