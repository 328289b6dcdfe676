#!/usr/bin/env bash
# Every committed fuzz input -- the seed corpora and the inputs that once crashed a parser
# (tests/fuzz/{corpus,regressions}/NAME/) -- through each harness, built with the plain driver
# ($B/fuzz/fuzz_NAME; under make test-asan, with ASan + UBSan). Fails if any input fails.
cd "$(dirname "$0")/.." || exit 1
set -uo pipefail
B=${PKV_BUILD:-build}
export OMP_NUM_THREADS=1
passed=0 failed=0
# Every harness there is (tests/fuzz/fuzz_NAME.c), each with its seed corpus: a harness without
# one is a failure, not a harness quietly left out.
for src in tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c); name=${name#fuzz_}
    bin=$B/fuzz/fuzz_$name d=tests/fuzz/corpus/$name
    if [ ! -d "$d" ] || [ -z "$(ls -A "$d")" ]; then
        echo "FAIL $name: no seed corpus in $d"; failed=$((failed + 1)); continue
    fi
    inputs=("$d")
    [ -d "tests/fuzz/regressions/$name" ] && inputs+=("tests/fuzz/regressions/$name")
    if [ ! -x "$bin" ]; then
        echo "FAIL $name: $bin not built"; failed=$((failed + 1)); continue
    fi
    if out=$("$bin" "${inputs[@]}" 2>&1); then
        echo "ok   $name: $(echo "$out" | tail -1) ($(ls "tests/fuzz/regressions/$name" 2>/dev/null | wc -l) regressions)"
        passed=$((passed + 1))
    else
        echo "FAIL $name (exit $?):"; echo "$out" | tail -30; failed=$((failed + 1))
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
