#!/usr/bin/env bash
# The default small rows, RUNS times each, with both engines' shard counters per row (the
# JSON's initiator_counters / target_counters): does a slow 4 KiB x 256 run (or an 8 B x 64
# run with a tail) come with shards stepping aside (busy_poll_backoffs), parking (doorbells)?
# Carry .dev/morio.   RUNS=6
set -u
O=${OUT:-/tmp/s32-counters}
N=${RUNS:-6}
mkdir -p "$O"/ct
for ((i = 1; i <= N; i++)); do
	for row in "d4k256 4096 256" "d8b64 8 64"; do
		read -r name size batch <<<"$row"
		timeout 120 .dev/morio bench --loopback --no-ceiling --no-floor --op-type write --iters 1000 \
			--buffer-size "$size" --transfer-batch-size "$batch" --enable-batch-transfer --enable-sess \
			--json "$O/ct/$name-r$i.json" >/dev/null 2>&1 || echo "fail $name-r$i"
	done
done
python3 scripts/bench/rounds.py "$O/ct"
(cd "$O" && tar czf s32-counters-json.tar.gz ct && rm -rf ct)
