#!/usr/bin/env bash
# Session 42, call 3: staged GPU transfers striped over gpu_data_conns (16) lanes where each
# lane gets a whole chunk, against 8 (`--gpu-data-conns 8`, the build before): the engine's
# GPU suite on CUDA, then ROUNDS interleaved rounds of the GPU rows, GPU 8 B and 4 KiB x 256
# batches (avg us: small batches must not pay) and two host rows (noise check).
#   OUT=$OUT ROUNDS=3 bash scripts/bench/s42c.sh   (carry .dev: morio, engine-tests)
set -u
O=${OUT:-/tmp/s42c}
mkdir -p "$O"
nvidia-smi --query-gpu=name --format=csv,noheader
echo "=== GPU suite on CUDA"
MORIO_TEST_GPU=1 timeout 120 .dev/engine-tests gpu --test-threads 2 2>&1 |
	grep -E "test result|panicked|FAILED" | head -20
echo "=== A/B (old: --gpu-data-conns 8, new: default 16)"
OUT=$O ROUNDS=${ROUNDS:-3} VARIANTS="old .dev/morio --gpu-data-conns 8; new .dev/morio" \
	ROWS="${ROWS:-hw h64w gw gr g64w g64r cgw gcr gcw g8w g4w}" timeout "${ABLIMIT:-330}" bash scripts/bench/s40-landing.sh \
	>"$O/ab.txt" 2>&1
tail -24 "$O/ab.txt"
