#!/usr/bin/env bash
# Here (no GPU): build x86-64-v3 binaries for the GPU machine into .dev/ with the shared
# libraries it lacks, so a device call needs no compiler or packages there; carry .devz
# (`carry: [".devz"]`), which gpu_checks.sh unpacks (kernels/unpack_dev.sh).
# Arguments: the GPU tests to build and carry (e.g. test_pariskv_gpu), for a quicker build and a
# smaller bundle while iterating on a kernel; none: every kernels/test_*.cu.
set -euo pipefail
cd "$(dirname "$0")/.."
TESTS=$(echo ${*:-$(ls kernels/test_*.cu | xargs -n1 basename | sed 's/\.cu$//')}) # one line: the case below matches " name "
# With test_kernels comes its decode-attention mutant build (gpu_checks.sh mutants).
case " $TESTS " in *" test_kernels "*) TESTS="$TESTS test_kernels_mutant" ;; esac
make -j2 BUILD=build-dev OPT="-O3 -march=x86-64-v3" run export $(for t in $TESTS; do echo build-dev/kernels/$t; done)
rm -rf .dev && mkdir -p .dev/lib
# Which build this is, for unpack_dev to print on the GPU machine: the commit, whether the tree
# had changes, when.
echo "$(git describe --always --dirty 2>/dev/null || echo no-git) built $(date -u +%Y-%m-%dT%H:%M:%SZ)" > .dev/BUILD
# Stripped of host symbols (the device code, most of each binary's ~26 MB, stays; xz packs a
# binary into ~5 MB: the carry limit is 64 MiB).
strip -o .dev/run run && strip -o .dev/export export
for t in $TESTS; do strip -o ".dev/$t" "build-dev/kernels/$t"; done
for l in libutf8proc.so.2 libcjson.so.1 libgomp.so.1 libsentencepiece.so.0 libstdc++.so.6 libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 \
         libedit.so.2 libbsd.so.0 libmd.so.0 libtinfo.so.6 libdnnl.so.2 libOpenCL.so.1; do # libedit: chat's line editing; libdnnl: the CPU path's prompt GEMMs
    cp -L /lib/x86_64-linux-gnu/$l .dev/lib/
done
# The kernel timeline's CUPTI injection library (kernels/bench/kernel_timeline.c; gpu_checks.sh
# timeline), with the toolkit's CUPTI beside the other libraries, where the toolkit has it.
CUDA_DIR=$(dirname "$(dirname "$(command -v nvcc)")")
if [ -f "$CUDA_DIR/include/cupti.h" ] && ls "$CUDA_DIR"/lib64/libcupti.so.* > /dev/null 2>&1; then
    gcc -O2 -std=c11 -Wall -Wextra -shared -fPIC -I"$CUDA_DIR/include" -o .dev/libkt.so kernels/bench/kernel_timeline.c \
        -L"$CUDA_DIR/lib64" -lcupti -Wl,-rpath,'$ORIGIN/lib'
    cp -L "$(ls "$CUDA_DIR"/lib64/libcupti.so.* | head -1)" .dev/lib/
fi
# The prefill GEMM shapes under every algorithm cuBLASLt offers (kernels/bench/gemm_algos.cu).
nvcc -O3 -std=c++17 -arch=sm_90 -o .dev/gemm_algos kernels/bench/gemm_algos.cu -lcublasLt -lcublas && strip .dev/gemm_algos
# Scattered row gathers from pinned host memory under three store layouts (kernels/bench/host_gather.cu).
nvcc -O3 -std=c++17 -arch=sm_90 -o .dev/host_gather kernels/bench/host_gather.cu && strip .dev/host_gather
touch -d '2000-01-01' run export   # the next plain `make` relinks the native build
# What a device call carries (the working tree may travel 64 MiB at most): .devz, compressed;
# gpu_checks.sh unpacks it into .dev there.
mkdir -p .devz && (cd .dev && tar cf - BUILD run export test_* gemm_algos host_gather lib $(ls libkt.so 2>/dev/null) | xz -6 -T2 > ../.devz/dev.tar.xz)
# A device call carries the tree too (~7 MB): past ~56 MiB the two may not fit its 64 MiB.
mib=$(( $(stat -c %s .devz/dev.tar.xz) >> 20 ))
[ $mib -le 56 ] || echo "prepare_device: warning: .devz is $mib MiB; with the tree it may pass the 64 MiB a device call carries (name fewer tests)" >&2
grep -qs '^/.devz/' .git/info/exclude || echo '/.devz/' >> .git/info/exclude
ls -la .dev .dev/lib
