#!/usr/bin/env bash
# Session 41's one call: the engine's GPU suite on CUDA, the chunk ramp A/B (`--gpu-ramp
# false` against `true`, one binary, ROUNDS interleaved rounds of the GPU rows and two host
# rows, s40-landing.sh's table), then GROUNDS rounds of goals.sh at the default settings.
# Each part under its own time limit so the call ends within the device's 10 minutes.
#   OUT=$OUT ROUNDS=3 GROUNDS=1 bash scripts/bench/s41.sh   (carry .dev: morio, engine-tests)
set -u
O=${OUT:-/tmp/s41}
mkdir -p "$O"
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== GPU suite on CUDA"
MORIO_TEST_GPU=1 timeout 120 .dev/engine-tests gpu --test-threads 2 2>&1 |
	grep -E "test result|panicked|FAILED" | head -20
echo "=== ramp A/B"
OUT=$O ROUNDS=${ROUNDS:-3} VARIANTS="old .dev/morio --gpu-ramp false; new .dev/morio --gpu-ramp true" \
	ROWS="hw h64w gw gr g64w g64r cgw gcr" timeout "${ABLIMIT:-280}" bash scripts/bench/s40-landing.sh \
	>"$O/ab.txt" 2>&1
echo "=== goals"
OUT=$O/goals ROUNDS=${GROUNDS:-1} GPU=1 timeout "${GLIMIT:-200}" bash scripts/bench/goals.sh >"$O/goals.txt" 2>&1
tail -25 "$O/goals.txt"
echo "=== ramp A/B (old: --gpu-ramp false, new: true)"
tail -20 "$O/ab.txt"
