#!/usr/bin/env bash
# Session 42, calls 3-4: large staged GPU transfers striped over gpu_data_conns = 16 lanes
# (each lane a whole chunk at least) against 8: the engine's GPU suite on CUDA, then ROUNDS
# interleaved rounds of the GPU rows, GPU 8 B and 4 KiB x 256 batches (avg us: small batches
# must not pay) and two host rows (noise check). Call 3 ran with 16 as the default
# (VARIANTS="old .dev/morio --gpu-data-conns 8; new .dev/morio"); the default is now 8, and
# `big` adds twice the staging pool (two lanes a shard share its slots).
#   OUT=$OUT ROUNDS=3 bash scripts/bench/s42c.sh   (carry .dev: morio, engine-tests)
set -u
O=${OUT:-/tmp/s42c}
mkdir -p "$O"
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== GPU suite on CUDA"
MORIO_TEST_GPU=1 timeout 120 .dev/engine-tests gpu --test-threads 2 2>&1 |
	grep -E "test result|panicked|FAILED" | head -20
echo "=== A/B (old: 8 GPU lanes, new: 16, big: 16 and a 128 MiB staging pool)"
OUT=$O ROUNDS=${ROUNDS:-3} VARIANTS="${VARIANTS:-old .dev/morio --gpu-data-conns 8; new .dev/morio --gpu-data-conns 16; big .dev/morio --gpu-data-conns 16 --gpu-staging-bytes 128MiB}" \
	ROWS="${ROWS:-hw h64w gw gr g64w g64r cgw gcr gcw g8w g4w}" timeout "${ABLIMIT:-330}" bash scripts/bench/s40-landing.sh \
	>"$O/ab.txt" 2>&1
tail -24 "$O/ab.txt"
