#!/usr/bin/env bash
# Session 42's first call: the engine's GPU suite on CUDA with MORIO_GPU_SEND_PARTS=4 (a
# frame's first staging slot copied out of device memory and sent in four pieces), then the
# send-pieces A/B: ROUNDS interleaved rounds of the GPU rows (and two host rows as the noise
# check) for the default (old), 2 pieces (new) and 4 pieces (p4), s40-landing.sh's table.
#   OUT=$OUT ROUNDS=4 bash scripts/bench/s42.sh   (carry .dev: morio, morio-p2, morio-p4, engine-tests)
set -u
O=${OUT:-/tmp/s42}
mkdir -p "$O"
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== GPU suite on CUDA, 4 send pieces"
MORIO_GPU_SEND_PARTS=4 MORIO_TEST_GPU=1 timeout 120 .dev/engine-tests gpu --test-threads 2 2>&1 |
	grep -E "test result|panicked|FAILED" | head -20
echo "=== send-pieces A/B (old: whole slots, new: 2 pieces, p4: 4 pieces)"
OUT=$O ROUNDS=${ROUNDS:-4} VARIANTS="old .dev/morio; new .dev/morio-p2; p4 .dev/morio-p4" \
	ROWS="${ROWS:-hw h64w gw gr g64w g64r cgw gcr gcw}" timeout "${ABLIMIT:-420}" bash scripts/bench/s40-landing.sh \
	>"$O/ab.txt" 2>&1
tail -30 "$O/ab.txt"
