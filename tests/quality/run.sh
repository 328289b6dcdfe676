#!/usr/bin/env bash
# The retrieval-quality harness in one command: builds ./run, the SmolLM2-135M model and the
# harness, then prints the policy x metric tables (markdown) for the teacher-forced 8K text and
# the drift run. Extra arguments go to the harness (see build/tests/quality/quality --help), e.g.
#   tests/quality/run.sh --positions 3000 --drift-prompt 2100 --drift-gen 256   # a quick look
# Full run on 2 busy cores: 1 h 45 min (tests/bench/RESULTS.md has the measured times).
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s all smollm2 build/tests/quality/quality
mkdir -p build/quality
dirty=$(git status --porcelain -- attention offload tests/quality run.c | head -c1)
echo "commit $(git rev-parse --short HEAD)${dirty:+ + uncommitted changes}, $(date -u +%Y-%m-%d), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
exec build/tests/quality/quality build/smollm2/model.bin "$@"
