#!/usr/bin/env bash
# Session 32's self-polling ring readers: MORIO_SELF_POLL=1 (a ring reader of a busy shard
# keeps polling its ring itself for 30 us after the shard's last event) against 0 (it waits
# for the busy poller to wake it), one binary, ROUNDS interleaved rounds of the spinning
# single 8 B through rings and the default rows, 1 MiB x 256, then a traced spinning 8 B of
# each (since 0e6f978+1 only on shards configured to spin, as in the spinning row).
# Carry .dev/morio.   ROUNDS=3
set -u
O=${OUT:-/tmp/s32-selfpoll}
R=${ROUNDS:-3}
mkdir -p "$O"/sp
b() { # NAME VARIANT -- ARGS...
	local n=$1 v=$2
	shift 3
	timeout 120 env MORIO_SELF_POLL=$([ "$v" = sp ] && echo 1 || echo 0) .dev/morio bench --loopback \
		--no-ceiling "$@" --json "$O/sp/$n.json" >/dev/null 2>&1 || echo "fail $n"
}
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64)
S=(--op-type write --iters 3000 --no-floor --buffer-size 8 --transfer-batch-size 1 --shards 2 --spin-us 2000 --wait-spin-us 1000)
for ((r = 1; r <= R; r++)); do
	for v in sp nosp; do
		L=(--op-type write --iters 1000)
		b "s8b1-r$r-$v" $v -- "${S[@]}" --same-host require
		b "d8b1-r$r-$v" $v -- "${L[@]}" --buffer-size 8 --transfer-batch-size 1
		b "d8b64-r$r-$v" $v -- "${L[@]}" --no-floor --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
		b "d4k256-r$r-$v" $v -- "${L[@]}" --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
	done
done
for v in sp nosp; do
	b "dw1m-r1-$v" $v -- --op-type write --no-floor "${big[@]}"
	b "dr1m-r1-$v" $v -- --op-type read --no-floor "${big[@]}"
done
for v in sp nosp; do
	echo "== $v: spinning single 8 B through rings, traced"
	rm -rf /tmp/s32-ts && mkdir -p /tmp/s32-ts
	MORIO_TRACE=/tmp/s32-ts MORIO_SELF_POLL=$([ "$v" = sp ] && echo 1 || echo 0) timeout 60 .dev/morio bench \
		--loopback --no-ceiling "${S[@]}" --same-host require >/dev/null 2>&1
	python3 scripts/bench/trace-stages.py /tmp/s32-ts 2>&1 | sed -n 1,18p
done
echo "== per round: avg / p50 / p99 us"
python3 scripts/bench/rounds.py "$O/sp"
echo "== sp / nosp"
python3 scripts/bench/ab-ratios.py "$O/sp" --base nosp | cut -c1-140
(cd "$O" && tar czf s32-selfpoll-json.tar.gz sp && rm -rf sp)
