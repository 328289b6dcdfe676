#!/usr/bin/env bash
# CPU speed against llama.cpp on this machine (issue 13): SmolLM2-135M in bf16, the same weights
# in both runners, side by side, interleaved repetitions, medians. By hand, not in CI.
#
#   bash tests/bench/cpu_vs_llamacpp.sh          # after `make` and `make smollm2`
#
# 1. Builds llama.cpp's llama-bench and llama-quantize (CPU only) from the llama.cpp that the
#    PyPI sdist of llama-cpp-python ($LC_VER, default 0.3.36) vendors, under $LC_WORK (default
#    /tmp/llamacpp_cpu; a kquant_check.sh build in /tmp/kquant_check is reused; LC_SRC=DIR builds
#    the llama.cpp tree in DIR instead, for a machine without network); nothing is written
#    inside the repository. About 25 minutes the first time on two cores.
# 2. SmolLM2-135M-Instruct.Q4_1.gguf -> F16 -> BF16 with llama-quantize; ./export of that BF16
#    file gives our model.bin: both runners read the same bf16 weights.
# 3. For each thread count ($LC_THREADS, default "1 2"), each test ($LC_TESTS, default all three),
#    $LC_REPS times (default 3), the two runners alternating:
#      prefill     prefill 512: llama-bench -p 512 -n 0 (random tokens) / ./run -n 0 on 512 ids:
#                  tokens per second
#      decode512   decode @512: llama-bench -n 64 -d 512 / ./run with a 512-id prompt, -n 64: ms
#                  per token
#      decode4096  decode @4096: the same after 4096 tokens (the longest: both runners prefill
#                  4096 tokens at each repetition)
#    (ours with --attn full: the dense attention llama.cpp computes), and prints a table of
#    medians with the ratios (targets of issue 29: prefill >= 0.8x llama.cpp's, decode <= 1.0x
#    llama.cpp's time): each repetition's pair on a '#' line as it ends, each row as soon as its
#    test's repetitions are done, so a run cut short keeps what it measured.
# The machine should be otherwise idle: a busy neighbour moves every figure (the alternation keeps
# the two runners' conditions alike).
#   LC_CPUS=0,1   both runners under `taskset -c 0,1` (a 2-core table on a bigger machine)
#   LC_ISA=avx512 ./run's products on that instruction set (PKV_CPU_ISA, model/cpu_isa.h; default:
#                 ./run's own default, the CPU's best: avx512bf16, avx512 or avx2); the table's header says which set ran
#                 (as ./run confirms it), the CPU's flags and its threads per core
#   LC_TESTS="prefill decode512"  only these tests (spaces or commas), for a table in pieces
#   LC_DEADLINE=450  for a machine that cuts a command off: no repetition starts that would end
#                 past this many seconds from the script's start, judged by the previous
#                 repetition of the same test (a row then has fewer and says so), and no test
#                 starts past it (those are named at the end). A test's first repetition has no
#                 such measure: leave room for one below the machine's limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
VER=${LC_VER:-0.3.36}
W=${LC_WORK:-/tmp/llamacpp_cpu}
REPS=${LC_REPS:-3}
THREADS=${LC_THREADS:-1 2}
TESTS=${LC_TESTS:-prefill decode512 decode4096}
TESTS=${TESTS//,/ }
for x in $TESTS; do
    case $x in prefill | decode512 | decode4096) ;; *) echo "LC_TESTS: no test '$x' (prefill, decode512, decode4096)"; exit 2 ;; esac
done
JOBS=${LC_JOBS:-2}
SRC=${LC_GGUF:-$ROOT/build/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$SRC" ] || { echo "no $SRC: run 'make smollm2' first (or set LC_GGUF)"; exit 1; }
[ -x ./export ] && [ -x ./run ] || { echo "build ./run and ./export first (make)"; exit 1; }
mkdir -p "$W"

# ---- 1. llama.cpp ----
B=""
for b in "$W/llama-build" /tmp/kquant_check/llama-build /tmp/kq/llama-build; do
    [ -d "$b" ] && [ -f "$b/CMakeCache.txt" ] && { B=$b; break; }
done
if [ -z "$B" ]; then
    B=$W/llama-build
    LSRC=${LC_SRC:-$W/llama_cpp_python-$VER/vendor/llama.cpp} # LC_SRC: a llama.cpp tree already here (no network)
    if ! [ -d "$LSRC" ]; then
        python3 -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$VER" -d "$W"
        tar -xzf "$W/llama_cpp_python-$VER.tar.gz" -C "$W"
    fi
    cmake -S "$LSRC" -B "$B" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF >"$W/cmake.log" 2>&1
fi
if ! [ -x "$B/bin/llama-bench" ] && ! [ -x "$B/tools/llama-bench" ] || ! [ -x "$B/bin/llama-quantize" ]; then
    cmake --build "$B" --target llama-bench llama-quantize -j"$JOBS" >"$W/build.log" 2>&1 || { tail -20 "$W/build.log"; exit 1; }
fi
LB=$B/bin/llama-bench
[ -x "$LB" ] || LB=$(find "$B" -name llama-bench -type f -perm -u+x | head -1)

# ---- 2. the same bf16 weights for both ----
if ! [ -s "$W/smollm2-BF16.gguf" ]; then
    "$B/bin/llama-quantize" --allow-requantize "$SRC" "$W/smollm2-F16.gguf" F16 >"$W/q16.log" 2>&1
    "$B/bin/llama-quantize" --allow-requantize "$W/smollm2-F16.gguf" "$W/smollm2-BF16.gguf" BF16 >"$W/qbf16.log" 2>&1
fi
M=$W/smollm2-bf16.bin
if ! [ "$M" -nt "$W/smollm2-BF16.gguf" ] || ! [ "$M" -nt ./export ]; then # kept between the pieces of a table
    ./export "$W/smollm2-BF16.gguf" "$M" >/dev/null 2>&1
fi
python3 - "$W" <<'EOF' # prompts of exactly 512 and 4096 ids (random, as llama-bench's)
import random, sys
random.seed(7)
for n in (512, 4096):
    open(f"{sys.argv[1]}/ids{n}.txt", "w").write(" ".join(str(random.randrange(100, 49000)) for _ in range(n)))
EOF

# ---- 3. alternating measurements ----
TS=()
[ -n "${LC_CPUS:-}" ] && TS=(taskset -c "$LC_CPUS")
if [ -z "${LC_ISA:-}" ]; then # ./run's default, named so that ./run confirms it on stderr
    LC_ISA=generic
    grep -qw avx2 /proc/cpuinfo && LC_ISA=avx2
    grep -qw avx512bw /proc/cpuinfo && LC_ISA=avx512
    grep -qw avx512_bf16 /proc/cpuinfo && LC_ISA=avx512bf16
fi
export PKV_CPU_ISA=$LC_ISA
lc_pp() { "${TS[@]}" "$LB" -m "$W/smollm2-BF16.gguf" -p 512 -n 0 -t "$1" -r 1 -o csv 2>/dev/null | tail -1 | tr -d '"' | awk -F, '{print $(NF-1)}'; }
lc_tg() { # ms per token of 64 generated after depth $2
    "${TS[@]}" "$LB" -m "$W/smollm2-BF16.gguf" -p 0 -n 64 -d "$2" -t "$1" -r 1 -o csv 2>/dev/null | tail -1 | tr -d '"' | awk -F, '{printf "%.3f", 1000 / $(NF-1)}'
}
ours() { # prefill tok/s, or decode ms/token, from the stats line
    local line
    line=$("${TS[@]}" ./run "$M" --ids -f "$W/ids$2.txt" -n "$3" --temp 0 --ignore-eos --threads "$1" --device cpu --attn full 2>&1 >/dev/null | grep "prompt .* tokens |")
    if [ "$3" = 0 ]; then echo "$line" | sed -n 's/.*prefill \([0-9.]*\) tok\/s.*/\1/p'
    else echo "$line" | sed -n 's/.*decode \([0-9.]*\) ms\/token.*/\1/p'; fi
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $(date -u +%F); llama.cpp $("$LB" --version 2>&1 | grep -o 'version: [0-9]* ([0-9a-f]*)' | head -1)"
echo "cpu flags: $(grep -m1 -ow -e avx2 -e avx512f -e avx512_bf16 -e avx512_vnni -e amx_bf16 /proc/cpuinfo | sort -u | tr '\n' ' ')threads per core: $(lscpu | sed -n 's/^Thread(s) per core: *//p'); taskset: ${LC_CPUS:-none}"
echo "./run: $(./run --version | head -1); $(./run "$M" --ids -p 1 -n 1 --device cpu 2>&1 >/dev/null | grep -m1 '^cpu: products on')"
printf "%-8s | %-14s | %12s | %12s | %8s | %s\n" threads test ./run llama.cpp ratio target
printf -- "---------+----------------+--------------+--------------+----------+-------\n"
row() { # threads name ours-runs llama-runs unit target [note]
    local o l
    o=$(echo "$3" | median) l=$(echo "$4" | median)
    awk -v t="$1" -v n="$2" -v o="$o" -v l="$l" -v u="$5" -v tg="$6" -v note="$7" 'BEGIN {
        printf "%-8s | %-14s | %8.2f %-3s | %8.2f %-3s | %8.3f | %s%s\n", t, n, o, u, l, u, o / l, tg, note }'
    echo "         all runs: ours [$3 ] llama.cpp [$4 ]"
}
skipped=()
for t in $THREADS; do
    for test in $TESTS; do
        if [ -n "${LC_DEADLINE:-}" ] && [ "$SECONDS" -ge "$LC_DEADLINE" ]; then skipped+=("$t:$test") && continue; fi
        case $test in
        prefill) name="prefill 512" unit=t/s target=">= 0.8" ;;
        decode512) name="decode @512" unit=ms target="<= 1.0" ;;
        decode4096) name="decode @4096" unit=ms target="<= 1.0" ;;
        esac
        o_runs="" l_runs="" done_reps=0 last=0
        for ((r = 0; r < REPS; r++)); do
            if [ -n "${LC_DEADLINE:-}" ] && [ "$r" -gt 0 ] && [ $((SECONDS + last)) -gt "$LC_DEADLINE" ]; then break; fi
            t0=$SECONDS
            case $test in # who goes first alternates between the tests, as before
            prefill) l=$(lc_pp "$t") o=$(ours "$t" 512 0) ;;
            decode512) o=$(ours "$t" 512 64) l=$(lc_tg "$t" 512) ;;
            decode4096) l=$(lc_tg "$t" 4096) o=$(ours "$t" 4096 64) ;;
            esac
            last=$((SECONDS - t0)) done_reps=$((r + 1))
            o_runs+=" $o" l_runs+=" $l"
            printf "# %-6s | %-14s | rep %d/%d: ./run %s, llama.cpp %s %s (%d s)\n" "$t" "$name" "$done_reps" "$REPS" "$o" "$l" "$unit" "$last"
        done
        note=""
        [ "$done_reps" -lt "$REPS" ] && note=" ($done_reps of $REPS reps: LC_DEADLINE=$LC_DEADLINE s)"
        row "$t" "$name" "$o_runs" "$l_runs" "$unit" "$target" "$note"
    done
done
if [ "${#skipped[@]}" -gt 0 ]; then
    echo "not run (LC_DEADLINE=$LC_DEADLINE s, $SECONDS s spent): ${skipped[*]} (threads:test; run them as another piece)"
fi
