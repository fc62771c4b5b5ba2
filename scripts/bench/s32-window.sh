#!/usr/bin/env bash
# The default rows against longer busy-poll windows (--busy-poll-us 100, the default, 500,
# 2000), ROUNDS interleaved rounds, with both engines' shard counters per row (doorbells:
# rings whose readers were parked). Carry .dev/morio.   ROUNDS=3
set -u
O=${OUT:-/tmp/s32-window}
R=${ROUNDS:-3}
mkdir -p "$O"/bw
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64)
for ((r = 1; r <= R; r++)); do
	for w in 100 500 2000; do
		for row in "d4k256 4096 256" "d8b64 8 64" "d8b1 8 1"; do
			read -r name size batch <<<"$row"
			X=(--enable-batch-transfer --enable-sess)
			[ "$batch" = 1 ] && X=()
			timeout 120 .dev/morio bench --loopback --no-ceiling --no-floor --op-type write --iters 1000 \
				--busy-poll-us $w --buffer-size "$size" --transfer-batch-size "$batch" "${X[@]}" \
				--json "$O/bw/$name-r$r-bp$w.json" >/dev/null 2>&1 || echo "fail $name-r$r-bp$w"
		done
		[ "$r" = 1 ] && timeout 120 .dev/morio bench --loopback --no-ceiling --no-floor --op-type write \
			--busy-poll-us $w "${big[@]}" --json "$O/bw/dw1m-r1-bp$w.json" >/dev/null 2>&1
	done
done
python3 scripts/bench/rounds.py "$O/bw"
python3 scripts/bench/ab-ratios.py "$O/bw" --base bp100 | cut -c1-140
(cd "$O" && tar czf s32-window-json.tar.gz bw && rm -rf bw)
