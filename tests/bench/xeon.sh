#!/usr/bin/env bash
# The CPU checks and the table against llama.cpp on another x86-64 machine that has no network and
# none of our build's libraries (the GPU machine's Xeon: AVX512_BF16, AMX), in three phases. By hand.
#
#   bash tests/bench/xeon.sh pack          # here, on a Debian machine with the build's packages:
#                                          # builds ./run and the tests for x86-64-v4 (AVX-512) into
#                                          # xeon/ with every library they need that a stock
#                                          # Ubuntu lacks, llama.cpp's source and SmolLM2's
#                                          # tokenizer (about 20 MB: the real model is too big to
#                                          # carry, so the table runs on random weights of its
#                                          # shape, which read and multiply the same bytes)
#   bash tests/bench/xeon.sh tests         # there: test_dot_bf16 and test_gemm_dnnl (every
#                                          # instruction set of that CPU; without PKV_CPU_ISA and
#                                          # with avx512 and avx512bf16), test_bf16_model (the
#                                          # bf16 path end to end), the tiny models end to
#                                          # end on each set, cpu_probe on CPUs 0-1; builds
#                                          # llama.cpp's llama-bench and llama-quantize into $OUT
#   bash tests/bench/xeon.sh vnni          # there: test_quant with and without AVX512_VNNI, and
#                                          # the quantized decode's speed both ways
#   bash tests/bench/xeon.sh table ISA [THREADS [TESTS [REPS]]]
#                                          # there, the two llama.cpp programs carried back in
#                                          # xeon/: cpu_vs_llamacpp.sh on CPUs 0-1 (taskset), ./run
#                                          # on ISA (avx512, or avx512bf16: bf16 arithmetic)
# The folder xeon/ (ignored by git) is what the device call carries.
# XEON_OPT (pack): the compiler's flags, default -O3 -march=x86-64-v4 (x86-64-v3 to try the
# phases on a machine without AVX-512); XEON_LLAMA=0 (tests): skip building llama.cpp.
#
# The table in pieces. The whole table (2 thread counts x 3 tests x 5 repetitions, each
# repetition one run of each runner, the decode @4096 ones prefilling 4096 tokens first) takes
# longer than one device command may (600 s), so a call runs part of it:
#   THREADS  "1", "2" or "1 2" (default)                     (LC_THREADS)
#   TESTS    prefill, decode512, decode4096, any of them, comma-separated (default all)  (LC_TESTS)
#   REPS     repetitions of each test, medians of them (default 5)                       (LC_REPS)
# Each repetition's pair is printed on a '#' line as it ends and each row as its test ends, so a
# call cut off keeps what it measured. XEON_BUDGET (default 450 s, from this script's start): no
# repetition starts that would end past it, judged by the one before of the same test (the row
# then says how many it has), and no test starts past it (named at the end, to run as another
# piece); the margin to 600 s is for a test's first repetition, which has no such measure. The
# first call on a fresh machine also makes the random weights (once; kept in /tmp while the
# machine stays warm). Pieces meant to fit (not timed on that machine yet: the '#' lines give each
# repetition's seconds, to size the next call; a decode @4096 repetition is the longest, both
# runners prefilling 4096 tokens, most of all on one thread):
#   bash tests/bench/xeon.sh table avx512 1 prefill,decode512
#   bash tests/bench/xeon.sh table avx512 1 decode4096 3
#   bash tests/bench/xeon.sh table avx512 2 prefill,decode512
#   bash tests/bench/xeon.sh table avx512 2 decode4096 3
# and the same with avx512bf16. Rows of one table compare only where the calls ran on the same
# machine (a fresh one may be another host).
set -euo pipefail
cd "$(dirname "$0")/../.."
X=$PWD/xeon
VER=0.3.36
phase=${1:-}

libs() { # the libraries our programs load, less the C and C++ runtimes every Linux has
    for b in "$@"; do ldd "$b"; done | awk '/=> \// {print $3}' | sort -u |
        grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so'
}

case "$phase" in
pack)
    B=build-xeon
    rm -rf $B # make does not see a change of flags
    make -j2 BUILD=$B NO_CUDA=1 OPT="${XEON_OPT:--O3 -march=x86-64-v4}" $B/run $B/export $B/tests/test_dot_bf16 \
        $B/tests/test_gemm_dnnl $B/tests/test_bf16_model $B/tests/test_quant $B/tests/bench/cpu_probe >/dev/null
    rm -rf "$X" && mkdir -p "$X/lib"
    cp $B/run $B/export $B/tests/test_dot_bf16 $B/tests/test_gemm_dnnl $B/tests/test_bf16_model $B/tests/test_quant $B/tests/bench/cpu_probe "$X/"
    for l in $(libs $B/run $B/tests/test_gemm_dnnl); do cp -L "$l" "$X/lib/"; done
    xz -T2 "$X"/lib/* # 88 MB -> 17 MB (a carry holds 64 MiB)
    L=/tmp/xeon-llama
    if ! [ -d "$L/llama_cpp_python-$VER" ]; then
        mkdir -p $L && python3 -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$VER" -d $L
        tar -xzf "$L/llama_cpp_python-$VER.tar.gz" -C $L
    fi
    # llama.cpp without its models, docs, tests and the GPU back ends (176 MB -> 8 MB)
    tar -C "$L/llama_cpp_python-$VER/vendor/llama.cpp" --exclude=./models --exclude=./docs --exclude=./tests \
        --exclude=./benches --exclude=./ggml/src/ggml-cuda --exclude=./ggml/src/ggml-vulkan --exclude=./ggml/src/ggml-sycl \
        --exclude=./ggml/src/ggml-metal --exclude=./tools/server/public --exclude=./tools/ui -cJf "$X/llama_src.tar.xz" .
    SMOL=build/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    [ -f $SMOL ] || make $SMOL
    PYTHONPATH="$L/llama_cpp_python-$VER/vendor/llama.cpp/gguf-py" python3 tests/bench/gguf_random.py $SMOL "$X/smol_tok.gguf" tokenizer
    du -sh "$X"
    ;;
tests)
    for f in "$X"/lib/*.xz; do [ -f "$f" ] && xz -d -f "$f"; done
    export LD_LIBRARY_PATH=$X/lib
    lscpu | grep -E 'Model name|Thread|^CPU\(s\)|Flags' | sed 's/\(Flags:\).*/\1 '"$(grep -m1 -ow -e avx2 -e avx512f -e avx512_bf16 -e avx512_vnni -e amx_bf16 -e amx_tile /proc/cpuinfo | sort -u | tr '\n' ' ')"'/'
    rc=0
    # Their own kernels' checks ignore PKV_CPU_ISA; what it picks (the default set, the backend's
    # prompt path in test_gemm_dnnl) is checked under each
    for isa in "" avx512 avx512bf16; do
        echo "=== PKV_CPU_ISA=${isa:-(unset)}"
        PKV_CPU_ISA=$isa "$X/test_dot_bf16" || rc=1
        PKV_CPU_ISA=$isa "$X/test_gemm_dnnl" || rc=1
    done
    # The bf16 path (the default on this CPU) end to end on the tiny models, within its bound
    echo "=== test_bf16_model"
    PKV_BIN=$X "$X/test_bf16_model" || rc=1
    # The tiny models end to end on each fp32-exact set (avx512bf16's bf16 arithmetic is outside
    # these fp32 tolerances by design: run for the record, not counted)
    for isa in generic avx2 avx512 avx512bf16; do
        for m in tiny-llama31 tiny-qwen3; do
            if PKV_CPU_ISA=$isa PKV_BIN=$X python3 tests/test_hf_reference.py --only $m >/tmp/hf.log 2>&1; then r=PASS; else r=FAIL; fi
            echo "$r test_hf_reference $m with PKV_CPU_ISA=$isa: $(tail -1 /tmp/hf.log)"
            [ $r = PASS ] || [ $isa = avx512bf16 ] || rc=1
        done
    done
    taskset -c 0,1 "$X/cpu_probe" 256
    [ "${XEON_LLAMA:-1}" = 0 ] && exit $rc
    mkdir -p /tmp/lc && tar -xJf "$X/llama_src.tar.xz" -C /tmp/lc
    cmake -S /tmp/lc -B /tmp/lc/b -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/tmp/lc/cmake.log 2>&1
    cmake --build /tmp/lc/b --target llama-bench llama-quantize -j"$(nproc)" >/tmp/lc/build.log 2>&1 || { tail -20 /tmp/lc/build.log; exit 1; }
    cp /tmp/lc/b/bin/llama-bench /tmp/lc/b/bin/llama-quantize "${OUT:-$X}/"
    exit $rc
    ;;
vnni)
    # The quantized decode products with AVX512_VNNI (the default where the CPU has it) and without
    # (PKV_CPU_ISA=avx2: the same integer sums, so the same tokens), SmolLM2's shape in Q8_0, Q4_K
    # and Q4_0 (random blocks), a 512-id prompt then 64 tokens, one and two threads on CPUs 0-1.
    for f in "$X"/lib/*.xz; do [ -f "$f" ] && xz -d -f "$f"; done
    export LD_LIBRARY_PATH=$X/lib
    rc=0
    for isa in "" avx2 avx512; do
        echo "=== test_quant, PKV_CPU_ISA=${isa:-(unset)}"
        PKV_CPU_ISA=$isa "$X/test_quant" > /tmp/tq.log 2>&1 || rc=1
        grep -E 'VNNI|passed' /tmp/tq.log
    done
    mkdir -p /tmp/lc && { [ -d /tmp/lc/gguf-py ] || tar -xJf "$X/llama_src.tar.xz" -C /tmp/lc ./gguf-py; }
    python3 tests/random_ids.py 5 49152 512 > /tmp/ids512v.txt
    for q in ${XEON_QUANTS:-q8_0 q4_k q4_0}; do
        PYTHONPATH=/tmp/lc/gguf-py python3 tests/bench/gguf_random.py "$X/smol_tok.gguf" /tmp/s_$q.gguf $q --shape smollm2 >/dev/null &&
            "$X/export" /tmp/s_$q.gguf /tmp/s_$q.bin >/dev/null || { echo "FAIL making the $q model"; rc=1; continue; }
        for t in 1 2; do
            for rep in 1 2 3; do
                for isa in "" avx2; do
                    o=$(PKV_CPU_ISA=$isa taskset -c 0,1 "$X/run" /tmp/s_$q.bin --ids -f /tmp/ids512v.txt -n 64 --temp 0 --ignore-eos --threads $t \
                        --device cpu --attn full 2>/tmp/vn.err) || rc=1
                    echo "$q threads $t ${isa:-vnni} rep $rep: $(grep 'prompt .* tokens |' /tmp/vn.err) | ids $(echo "$o" | md5sum | cut -c1-8)"
                done
            done
        done
    done
    exit $rc
    ;;
table)
    isa=${2:?table avx512 or table avx512bf16 [THREADS [TESTS [REPS]]]}
    threads=${3:-${LC_THREADS:-1 2}} tests=${4:-${LC_TESTS:-prefill decode512 decode4096}} reps=${5:-${LC_REPS:-5}}
    for f in "$X"/lib/*.xz; do [ -f "$f" ] && xz -d -f "$f"; done
    export LD_LIBRARY_PATH=$X/lib
    W=${XEON_WORK:-/tmp/llamacpp_cpu} # the table's llama.cpp programs, weights and prompts
    mkdir -p $W/llama-build/bin && touch $W/llama-build/CMakeCache.txt
    cp "$X/llama-bench" "$X/llama-quantize" $W/llama-build/bin/ && chmod +x $W/llama-build/bin/*
    cp "$X/run" "$X/export" ./ # where cpu_vs_llamacpp.sh looks
    if ! [ -s $W/smollm2-BF16.gguf ]; then
        mkdir -p /tmp/lc && [ -d /tmp/lc/gguf-py ] || tar -xJf "$X/llama_src.tar.xz" -C /tmp/lc ./gguf-py
        PYTHONPATH=/tmp/lc/gguf-py python3 tests/bench/gguf_random.py "$X/smol_tok.gguf" $W/smollm2-BF16.gguf.tmp bf16 --shape smollm2
        mv $W/smollm2-BF16.gguf.tmp $W/smollm2-BF16.gguf # whole, or not there (a call cut off mid-way)
        echo "# the random weights made in $SECONDS s"
    fi
    budget=${XEON_BUDGET:-450}
    echo "# table on $isa: threads '$threads', tests '$tests', $reps reps; $SECONDS s spent, budget $budget s"
    LC_WORK=$W LC_GGUF=$W/smollm2-BF16.gguf LC_CPUS=${LC_CPUS:-0,1} LC_ISA=$isa LC_THREADS=$threads LC_TESTS=$tests \
        LC_REPS=$reps LC_DEADLINE=$((budget > SECONDS ? budget - SECONDS : 1)) bash tests/bench/cpu_vs_llamacpp.sh
    ;;
*)
    sed -n '2,/^set -euo/p' "$0" | sed '$d'
    exit 2
    ;;
esac
