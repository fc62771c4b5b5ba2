#!/usr/bin/env bash
# Session 32's poller A/B: .dev/morio-a (8e7c628) against .dev/morio (the busy poller waking
# a shared-memory reader first, one clock read per round), ROUNDS interleaved rounds of the
# spinning single 8 B through rings and the default rows, then a traced spinning 8 B of each.
# Carry .dev/morio and .dev/morio-a.   ROUNDS=3
set -u
O=${OUT:-/tmp/s32-poller}
R=${ROUNDS:-3}
mkdir -p "$O"/pl
b() { # NAME BIN -- ARGS...
	local n=$1 bin=$2
	shift 3
	timeout 120 ".dev/$bin" bench --loopback --no-ceiling "$@" --json "$O/pl/$n.json" >/dev/null 2>&1 || echo "fail $n"
}
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64)
S=(--op-type write --iters 3000 --no-floor --buffer-size 8 --transfer-batch-size 1 --shards 2 --spin-us 2000 --wait-spin-us 1000)
for ((r = 1; r <= R; r++)); do
	for v in morio morio-a; do
		L=(--op-type write --iters 1000)
		b "s8b1-r$r-$v" $v -- "${S[@]}" --same-host require
		b "s8b1tcp-r$r-$v" $v -- "${S[@]}" --same-host off
		b "d8b1-r$r-$v" $v -- "${L[@]}" --buffer-size 8 --transfer-batch-size 1
		b "d8b64-r$r-$v" $v -- "${L[@]}" --no-floor --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
		b "d4k256-r$r-$v" $v -- "${L[@]}" --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
	done
done
for v in morio morio-a; do
	b "dw1m-r1-$v" $v -- --op-type write --no-floor "${big[@]}"
done
for v in morio morio-a; do
	echo "== $v: spinning single 8 B through rings, traced"
	rm -rf /tmp/s32-tp && mkdir -p /tmp/s32-tp
	MORIO_TRACE=/tmp/s32-tp timeout 60 ".dev/$v" bench --loopback --no-ceiling "${S[@]}" --same-host require >/dev/null 2>&1
	python3 scripts/bench/trace-stages.py /tmp/s32-tp 2>&1 | sed -n 2,18p
done
echo "== per round: avg / p50 / p99 us"
python3 scripts/bench/rounds.py "$O/pl"
echo "== morio / morio-a"
python3 scripts/bench/ab-ratios.py "$O/pl" --base morio-a | cut -c1-140
(cd "$O" && tar czf s32-poller-json.tar.gz pl && rm -rf pl)
