#!/usr/bin/env bash
# Session 33: how long a default busy-polling shard steps aside when preempted while
# spinning: 50 ms (the default) against 5 ms (MORIO_BUSY_BACKOFF_MS), one binary, ROUNDS
# interleaved rounds of the default rows over TCP (single 8 B write and read, 8 B x 64,
# 8 B x 256, 4 KiB x 256 with floors), between processes of one host (single 8 B,
# 4 KiB x 256), and 1 MiB x 256 write and read.   Carry .dev/morio.   ROUNDS=3
set -u
O=${OUT:-/tmp/s33-backoff}
R=${ROUNDS:-3}
mkdir -p "$O"/b
b() { # NAME VARIANT -- ARGS...
	local n=$1 v=$2
	shift 3
	timeout 120 env MORIO_BUSY_BACKOFF_MS=${v#b} .dev/morio bench \
		--loopback --no-ceiling "$@" --json "$O/b/$n.json" >/dev/null 2>&1 || echo "fail $n"
}
L=(--iters 1000 --same-host off)
H=(--iters 1000 --same-host require)
bat=(--enable-batch-transfer --enable-sess)
big=(--buffer-size 1048576 --transfer-batch-size 256 "${bat[@]}" --batch-contiguous --iters 48 --same-host off --no-floor)
for ((r = 1; r <= R; r++)); do
	for v in b50 b5; do
		b "d8-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 8 --transfer-batch-size 1
		b "d8read-r$r-$v" $v -- "${L[@]}" --op-type read --buffer-size 8 --transfer-batch-size 1
		b "d64-r$r-$v" $v -- "${L[@]}" --op-type write --no-floor --buffer-size 8 --transfer-batch-size 64 "${bat[@]}"
		b "d256-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 8 --transfer-batch-size 256 "${bat[@]}"
		b "d4k-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 4096 --transfer-batch-size 256 "${bat[@]}"
		b "hd8-r$r-$v" $v -- "${H[@]}" --op-type write --no-floor --buffer-size 8 --transfer-batch-size 1
		b "hd4k-r$r-$v" $v -- "${H[@]}" --op-type write --no-floor --buffer-size 4096 --transfer-batch-size 256 "${bat[@]}"
		b "w1m-r$r-$v" $v -- --op-type write "${big[@]}"
		b "r1m-r$r-$v" $v -- --op-type read "${big[@]}"
	done
done
echo "== per round: avg / p50 / p99 us"
python3 scripts/bench/rounds.py "$O/b"
echo "== slow iterations (> 80 us) per default row, initiator / target busy-poll wakes"
python3 scripts/bench/slow-iters.py "$O/b"
echo "== b5 / b50"
python3 scripts/bench/ab-ratios.py "$O/b" --base b50 | cut -c1-140
(cd "$O" && tar czf s33-backoff-json.tar.gz b && rm -rf b)
