. kernels/unpack_dev.sh; unpack_dev >/dev/null; export LD_LIBRARY_PATH=$PWD/.dev/lib:/usr/local/cuda/lib64
NCU=/usr/local/cuda/bin/ncu
PKV_TEST_BENCH_ONLY=131072 timeout 300 $NCU --kernel-name regex:'pkv_(bonus|topk)' --launch-skip 20 --launch-count 2 --import-source no \
  --metrics regex:smsp__pcsamp_warps_issue_stalled_.* --section SourceCounters --csv --page details .dev/test_pariskv_gpu > $OUT/ncu2.csv 2> $OUT/ncu2.err
echo "rc=$?"
PKV_TEST_BENCH_ONLY=131072 timeout 300 $NCU --kernel-name regex:'pkv_topk' --launch-skip 10 --launch-count 1 --section SourceCounters --page source --print-source sass --csv .dev/test_pariskv_gpu > $OUT/ncu3.csv 2> $OUT/ncu3.err
echo "rc=$?"; ls -la $OUT
