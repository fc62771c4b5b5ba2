#!/usr/bin/env bash
# The default 4 KiB x 256 row (one 1 MiB transfer, striped) over 8 lanes (the default), 4
# and 2, default settings otherwise, ROUNDS interleaved rounds with the raw floor and both
# engines' shard counters (doorbells: stripes that found their target shard parked).
# Carry .dev/morio.   ROUNDS=3
set -u
O=${OUT:-/tmp/s32-lanes}
R=${ROUNDS:-3}
mkdir -p "$O"/ln
for ((r = 1; r <= R; r++)); do
	for l in 8 4 2; do
		timeout 120 .dev/morio bench --loopback --no-ceiling --op-type write --iters 1000 \
			--num-data-conns $l --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer \
			--enable-sess --json "$O/ln/d4k256-r$r-l$l.json" >/dev/null 2>&1 || echo "fail r$r-l$l"
	done
done
python3 scripts/bench/rounds.py "$O/ln"
python3 scripts/bench/ab-ratios.py "$O/ln" --base l8 | cut -c1-140
(cd "$O" && tar czf s32-lanes-json.tar.gz ln && rm -rf ln)
