#!/usr/bin/env bash
# Session 31: the busy poller's stale runtime-armed sockets. A socket whose readiness poll the
# runtime answered was never taken off the poller's list, so (same host: two of a target's
# lane sockets, quiet once bytes move through rings) it was polled on every turn. Builds
# .dev/morio-nofix (before) and .dev/morio-fix (after), interleaved ROUNDS times: the spinning
# single 8 B through rings and over TCP, default-settings rows; then a trace of the fix.
# Carry .dev.   ROUNDS=3
set -u
O=${OUT:-/tmp/s31-busyfix}
R=${ROUNDS:-3}
mkdir -p "$O"/busy
b() { # NAME BIN -- ARGS...
	local n=$1 bin=$2
	shift 3
	timeout 120 ".dev/$bin" bench --loopback --no-ceiling "$@" --json "$O/busy/$n.json" >/dev/null 2>&1 ||
		echo "fail $n"
}
S=(--op-type write --buffer-size 8 --transfer-batch-size 1 --shards 2 --spin-us 2000 --wait-spin-us 1000)
for ((r = 1; r <= R; r++)); do
	for v in nofix fix; do
		b "s8b1ring-r$r-$v" "morio-$v" -- "${S[@]}" --iters 2000 --same-host require
		b "s8b1tcp-r$r-$v" "morio-$v" -- "${S[@]}" --iters 2000 --same-host off
		L=(--op-type write --iters 512)
		b "d8b1-r$r-$v" "morio-$v" -- "${L[@]}" --buffer-size 8 --transfer-batch-size 1
		b "d8b64-r$r-$v" "morio-$v" -- "${L[@]}" --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
		b "d4k256-r$r-$v" "morio-$v" -- "${L[@]}" --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
	done
done
echo "== busy"
python3 scripts/bench/ab-ratios.py "$O/busy" --base nofix | cut -c1-125
(cd "$O" && tar czf s31-busyfix-json.tar.gz busy && rm -rf busy)
echo "== spinning single 8 B through rings, traced (fix)"
rm -rf /tmp/s31-trace && mkdir -p /tmp/s31-trace
MORIO_TRACE=/tmp/s31-trace timeout 60 .dev/morio-fix bench --loopback --no-ceiling --no-floor "${S[@]}" \
	--iters 3000 --same-host require >/dev/null 2>&1
python3 scripts/bench/trace-stages.py /tmp/s31-trace 2>&1 | head -20
