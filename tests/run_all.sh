#!/usr/bin/env bash
# Runs every test: the C unit-test programs (one per tests/test_*.c), then the Python and shell
# end-to-end tests (tests/test_*.py, tests/test_*.sh). Each test is a program that prints a
# closing 'N passed, N failed' line and exits 0 when all passed, 77 when all that ran passed but
# it skipped something (it says what on a 'SKIP ...' line), anything else on a failure.
# A test counts as passed only with exit 0, that closing line, N > 0 and no failures in it.
# A test that passes may skip parts the machine cannot run (', N skipped' on its closing line,
# a 'SKIP ...' line for each: test_dot_bf16's instruction sets the CPU lacks); they are named on
# its PASS line, and are no failure under PKV_NO_SKIP=1 (no install makes a CPU grow AVX-512).
# A missing test binary is a failure, not a skip. Prints 'N passed, N failed, N skipped' and
# checks that as many tests ran as exist. Exits non-zero on any failure, and on any skip when
# PKV_NO_SKIP=1 (make check: CI runs everything or says why not by failing).
#   PKV_BUILD=build-asan (make test-asan): the C tests of that build, and the programs the Python
#   tests run (PKV_BIN, TOK_TOOL) from it too.
#   PKV_ONLY="test_a test_b": just these (the second -march run of the float-sensitive tests).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
B=${PKV_BUILD:-build}
# The products on fp32 activations (model/cpu_isa.h): the end-to-end tests' bounds are derived for
# fp32 arithmetic, and the default on a CPU with AVX512_BF16 rounds the activations to bf16. The
# tests of that choice and of the bf16 path (test_dot_bf16, test_gemm_dnnl, test_bf16_model) set
# PKV_CPU_ISA themselves for what they check. A caller's PKV_CPU_ISA is kept (make test-march).
export PKV_CPU_ISA=${PKV_CPU_ISA:-fp32}
if [ -n "${PKV_BUILD:-}" ]; then
    export PKV_BIN=$PWD/$B TOK_TOOL=$PWD/$B/tests/tok_tool
fi
log=$(mktemp /tmp/pkv-test-XXXXXX)
trap 'rm -f "$log"' EXIT
passed=0 failed=0 skipped=0 expected=0 failed_names=() skipped_names=() part_skips=()
wanted() { [ -z "${PKV_ONLY:-}" ] || [[ " $PKV_ONLY " == *" $1 "* ]]; }
run() {
    local name=$1; shift
    expected=$((expected + 1))
    echo "=== $name"
    local t0=$SECONDS rc summary
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
    local np=${summary%% passed*} nf
    nf=${summary#* passed, }; nf=${nf%% failed*}
    if [ "$rc" -eq 0 ] && [ -n "$summary" ] && [ "$np" -gt 0 ] && [ "$nf" -eq 0 ]; then
        passed=$((passed + 1))
        # Parts this machine cannot run (an instruction set the CPU lacks) are counted as skipped
        # on the closing line and named on SKIP lines: say so here, not as part of the pass.
        local parts=""
        if [[ "$summary" =~ ,\ ([1-9][0-9]*)\ skipped ]]; then
            parts="; ${BASH_REMATCH[1]} part(s) skipped: $(grep '^SKIP' "$log" | tr '\n' ' ')"
            part_skips+=("$name (${BASH_REMATCH[1]})")
        fi
        echo "--- PASS $name ($((SECONDS - t0)) s$parts)"
    elif [ "$rc" -eq 77 ] && [ -n "$summary" ] && [ "$nf" -eq 0 ]; then
        skipped=$((skipped + 1)); skipped_names+=("$name"); echo "--- SKIP $name ($((SECONDS - t0)) s): $(grep -m3 '^SKIP' "$log" | tr '\n' ' ')"
    else
        failed=$((failed + 1)); failed_names+=("$name")
        local why="'$summary'"
        [ -n "$summary" ] || why="no 'N passed, N failed' line"
        echo "--- FAIL $name ($((SECONDS - t0)) s; exit $rc, $why)"
    fi
}
# C tests of the CUDA path's host code (tests/test_gpu_plan.c: the GPU memory plan): a build
# without that path (NO_CUDA=1: test-asan, test-march) has nothing for them to test, so they are
# not expected there -- only where its ./run says so; make test's build runs them.
runbin=${PKV_BIN:-$PWD}/run
no_cuda=0
[ -x "$runbin" ] && "$runbin" --version 2>/dev/null | grep -q 'CUDA backend not built' && no_cuda=1
for src in tests/test_*.c; do
    name=$(basename "$src" .c)
    wanted "$name" || continue
    if [ "$no_cuda" = 1 ] && [ "$name" = test_gpu_plan ]; then
        echo "=== $name: not in this build ($runbin has no CUDA path; make test runs it)"
        continue
    fi
    if [ -x "$B/tests/$name" ]; then
        run "$name" "$B/tests/$name"
    else
        expected=$((expected + 1)); failed=$((failed + 1)); failed_names+=("$name")
        echo "--- FAIL $name: $B/tests/$name was not built"
    fi
done
for t in tests/test_*.py; do
    wanted "$(basename "$t")" && run "$(basename "$t")" python3 "$t"
done
for t in tests/test_*.sh; do
    wanted "$(basename "$t")" && run "$(basename "$t")" bash "$t"
done
[ "$failed" -gt 0 ] && echo "failed: ${failed_names[*]}"
[ "$skipped" -gt 0 ] && echo "skipped: ${skipped_names[*]}"
[ "${#part_skips[@]}" -gt 0 ] && echo "passed with parts this machine cannot run skipped: ${part_skips[*]}"
echo "$passed passed, $failed failed, $skipped skipped (of $expected tests)"
if [ $((passed + failed + skipped)) -ne "$expected" ] || [ "$expected" -eq 0 ]; then
    echo "FAIL the runner counted $((passed + failed + skipped)) results for $expected tests"; exit 1
fi
[ "$failed" -eq 0 ] || exit 1
if [ "$skipped" -gt 0 ] && [ "${PKV_NO_SKIP:-0}" = 1 ]; then
    echo "FAIL skips are failures here (PKV_NO_SKIP=1)"; exit 1
fi
exit 0
