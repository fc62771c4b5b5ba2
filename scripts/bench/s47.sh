#!/usr/bin/env bash
# Session 47's device call: on the H200 (issue 23's own host, not lent since session 39) the
# goals run first; on any other GPU machine session 46's queued same-host rows. Both start
# with the GPU tests of the same-host 2D device-to-device copies.
#   OUT=$OUT bash scripts/bench/s47.sh   (carry .dev/morio, .dev/morio-old, .dev/engine-tests)
set -u
O=${OUT:-/tmp/s47}
mkdir -p "$O"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
MORIO_TEST_GPU=1 timeout 150 .dev/engine-tests gpu_strided gpu_same_host --test-threads 4 >"$O/tests.txt" 2>&1
grep -E "^test result|FAILED|panicked" "$O/tests.txt" | head -8
case "$gpu" in
*H200*) OUT=$O/goals ROUNDS=${ROUNDS:-2} GPU=1 timeout 420 bash scripts/bench/goals.sh 2>&1 | tail -30 ;;
*) OUT=$O/s46 ROUNDS=${ROUNDS:-1} timeout 420 bash scripts/bench/s46.sh 2>&1 | tail -40 ;;
esac
