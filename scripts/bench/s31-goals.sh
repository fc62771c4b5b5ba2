#!/usr/bin/env bash
# Session 31's device run (one call): session 30's `lat same mb` sections of this build, then
#   gsm   small GPU segments through CUDA IPC: batched copies with the copy engines preferred
#         (the default) against the driver's own choice (MORIO_GPU_BATCH_COPIES=sm, which may
#         run a device-to-device batch of tiny copies on the SMs; a mode of the build then
#         measured, removed since: it gained nothing) and one call per copy;
#   py    the MORI descriptor case on CUDA (the IPC handle is filled where CUDA exports).
# Needs what s30-goals.sh needs (carry .dev).   ROUNDS=2
set -u
O=${OUT:-/tmp/s31-goals}
R=${ROUNDS:-2}
mkdir -p "$O"/gsm
echo "== MORI descriptor case, CUDA"
site=/tmp/site
python3 -m pip install -q --no-index --no-deps --target $site .dev/wheels/morio-*.whl &&
	PYTHONPATH=$site timeout 120 python3 -m pytest -q -p no:cacheprovider python/tests/test_mori_cases.py \
		-k "mem_desc" 2>&1 | tail -2
for ((r = 1; r <= R; r++)); do
	for v in on sm off; do
		X=(--op-type write --mem-type gpu --enable-batch-transfer --enable-sess --same-host require)
		for row in "g8b1024 8 1024 64" "g4k256 4096 256 128" "g16k1024 16384 1024 32"; do
			read -r name size batch iters <<<"$row"
			timeout 120 env MORIO_GPU_BATCH_COPIES=$v .dev/morio bench --loopback --no-ceiling "${X[@]}" \
				--buffer-size "$size" --transfer-batch-size "$batch" --iters "$iters" \
				--json "$O/gsm/$name-r$r-batch$v.json" >/dev/null 2>&1 || echo "fail gsm/$name-$v"
		done
	done
done
echo "== gsm"
python3 scripts/bench/ab-ratios.py "$O/gsm" | cut -c1-125
(cd "$O" && tar czf s31-gsm-json.tar.gz gsm && rm -rf gsm)
SECTIONS="lat same mb" ROUNDS=$R OUT=$O bash scripts/bench/s30-goals.sh
