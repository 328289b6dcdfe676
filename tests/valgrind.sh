#!/usr/bin/env bash
# valgrind (memcheck) over export, generate, score, tokenize, chat and --render-chat on a tiny
# model: no invalid access, no use of uninitialised memory, and no leak -- definitely, indirectly
# or possibly lost; what is still reachable at exit (die() paths, libraries' one-time state) is
# not a leak. Needs a build valgrind can decode: `make test-valgrind` builds build-vg/ for
# x86-64-v3 (valgrind does not know AVX-512), CPU only. tests/valgrind.supp says what is
# suppressed and why. Prints ok/FAIL per run and a closing 'N passed, N failed' line.
cd "$(dirname "$0")/.." || exit 1
B=${VG_BUILD:-build-vg}
tmp=$(mktemp -d /tmp/pkv-vg-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
vg() {
    local name=$1; shift
    local in=${VG_STDIN:-/dev/null} rc
    valgrind -q --error-exitcode=99 --leak-check=full --show-leak-kinds=definite,indirect,possible \
        --errors-for-leak-kinds=definite,indirect,possible --suppressions=tests/valgrind.supp \
        --log-file="$tmp/$name.log" "$@" < "$in" > "$tmp/$name.out" 2> "$tmp/$name.err"
    rc=$?
    if [ "$rc" -eq "${VG_RC:-0}" ] && [ ! -s "$tmp/$name.log" ]; then
        echo "ok   $name"; passed=$((passed + 1))
    else
        echo "FAIL $name (exit $rc, want ${VG_RC:-0})"; head -60 "$tmp/$name.log"; tail -5 "$tmp/$name.err"
        failed=$((failed + 1))
    fi
}
# Two threads: the pool's operations run as they do for real, on a machine of two cores.
export OMP_NUM_THREADS=2
vg export "$B/export" tests/data/tiny-qwen3 "$tmp/m.bin"
if [ -f "$tmp/m.bin" ]; then
    vg generate "$B/run" "$tmp/m.bin" -p "Once upon a time" -n 12 --temp 0.8 --seed 1
    vg generate-ids "$B/run" "$tmp/m.bin" --ids -p "1 2 3" -n 8 --temp 0 --ignore-eos
    vg score "$B/run" "$tmp/m.bin" --score tests/data/tiny-qwen3/ids.txt --ids
    vg tokenize "$B/run" "$tmp/m.bin" --tokenize -p "Hello, world! <|im_start|> ünïcödé"
    printf 'Hello!\nHow are you?\n' > "$tmp/chat.in"
    VG_STDIN=$tmp/chat.in vg chat "$B/run" "$tmp/m.bin" --chat -n 6 --temp 0
    printf '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]' > "$tmp/msgs.json"
    vg render-chat "$B/run" "$tmp/m.bin" --render-chat "$tmp/msgs.json"
    VG_RC=1 vg bad-input "$B/run" "$tmp/m.bin" --ids -p "1 2 99999999" -n 1 # an error path: exits through die()
else
    echo "FAIL export produced no model"; failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
