. kernels/unpack_dev.sh; unpack_dev; export LD_LIBRARY_PATH=$PWD/.dev/lib:/usr/local/cuda/lib64
xz -dc .devold/run.xz > /tmp/run-old && chmod +x /tmp/run-old; echo "old: $(/tmp/run-old --version | head -1)"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 .dev/test_pariskv_gpu > $OUT/t.log 2>&1; echo "test rc=$? $(grep -E ' passed, ' $OUT/t.log)"; grep -E 'FAIL' $OUT/t.log | head -5
grep -E 'selection variant|select k=|pkv_topk|whole graph' $OUT/t.log | head -40
CS=/usr/local/cuda/bin/compute-sanitizer; for tool in memcheck racecheck; do PKV_TEST_QUICK=1 timeout 150 $CS --tool $tool --error-exitcode 9 .dev/test_pariskv_gpu > $OUT/san-$tool.log 2>&1; echo "$tool rc=$? $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY\| passed, ' $OUT/san-$tool.log | tr '\n' ' ')"; done
for row in "qwen3-8b 131072 bf16" "llama3.1-8b 131072 bf16"; do set -- $row
 for b in old new; do R=.dev/run; [ $b = old ] && R=/tmp/run-old; echo "=== $1 $2 $3 $b"; timeout 120 $R --bench --attn pariskv --kv-store host --kv-store-dtype $3 --synthetic $1 --topk 100 --bench-ctx $2 > $OUT/b-$1-$2-$b.txt 2>&1; echo "rc=$?"; grep -E '^ +[0-9]+ \||stages' $OUT/b-$1-$2-$b.txt | cut -c1-200; done; done
