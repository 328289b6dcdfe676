#!/usr/bin/env bash
# Runs every test: the C unit-test programs (build/tests/test_*), then the Python and shell
# end-to-end tests (tests/test_*.py, tests/test_*.sh). Each test is a program that exits 0 on
# success. Prints a closing 'N passed, N failed' line; exits non-zero if any test failed.
cd "$(dirname "$0")/.." || exit 1
# PKV_BUILD=build-asan (make test-asan): the C tests of that build, and the programs the Python
# tests run (PKV_BIN, TOK_TOOL) from it too.
B=${PKV_BUILD:-build}
if [ -n "${PKV_BUILD:-}" ]; then
    export PKV_BIN=$PWD/$B TOK_TOOL=$PWD/$B/tests/tok_tool
fi
passed=0 failed=0 failed_names=()
run() {
    local name=$1; shift
    echo "=== $name"
    local t0=$SECONDS
    if "$@"; then
        passed=$((passed + 1)); echo "--- PASS $name ($((SECONDS - t0)) s)"
    else
        failed=$((failed + 1)); failed_names+=("$name"); echo "--- FAIL $name ($((SECONDS - t0)) s)"
    fi
}
for t in "$B"/tests/test_*; do
    [ -x "$t" ] && run "$(basename "$t")" "$t"
done
for t in tests/test_*.py; do
    [ -f "$t" ] && run "$(basename "$t")" python3 "$t"
done
for t in tests/test_*.sh; do
    [ -f "$t" ] && run "$(basename "$t")" bash "$t"
done
[ "$failed" -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
