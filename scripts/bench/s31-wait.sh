#!/usr/bin/env bash
# Session 31: the application's wait spin looking at the status after every pause instead of
# every 64 (.dev/morio-wait) against the build before (.dev/morio-fix), interleaved ROUNDS
# times: the spinning single 8 B through rings and over TCP, the default single 8 B and
# 8 B x 64; then a trace of the new build's spinning single 8 B. Carry .dev.   ROUNDS=3
set -u
O=${OUT:-/tmp/s31-wait}
R=${ROUNDS:-3}
mkdir -p "$O"/wait
b() { # NAME BIN -- ARGS...
	local n=$1 bin=$2
	shift 3
	timeout 60 ".dev/$bin" bench --loopback --no-ceiling --no-floor "$@" --json "$O/wait/$n.json" \
		>/dev/null 2>&1 || echo "fail $n"
}
S=(--op-type write --buffer-size 8 --transfer-batch-size 1 --shards 2 --spin-us 2000 --wait-spin-us 1000)
for ((r = 1; r <= R; r++)); do
	for v in fix wait; do
		b "s8b1ring-r$r-$v" "morio-$v" -- "${S[@]}" --iters 2000 --same-host require
		b "s8b1tcp-r$r-$v" "morio-$v" -- "${S[@]}" --iters 2000 --same-host off
		b "d8b1-r$r-$v" "morio-$v" -- --op-type write --iters 512 --buffer-size 8 --transfer-batch-size 1
		b "d8b64-r$r-$v" "morio-$v" -- --op-type write --iters 512 --buffer-size 8 \
			--transfer-batch-size 64 --enable-batch-transfer --enable-sess
	done
done
echo "== wait"
python3 scripts/bench/ab-ratios.py "$O/wait" --base fix | cut -c1-125
(cd "$O" && tar czf s31-wait-json.tar.gz wait && rm -rf wait)
rm -rf /tmp/s31-trace && mkdir -p /tmp/s31-trace
MORIO_TRACE=/tmp/s31-trace timeout 60 .dev/morio-wait bench --loopback --no-ceiling --no-floor "${S[@]}" \
	--iters 3000 --same-host require >/dev/null 2>&1
python3 scripts/bench/trace-stages.py /tmp/s31-trace 2>&1 | head -19
