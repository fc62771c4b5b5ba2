#!/usr/bin/env bash
# Session 32's last device calls: the engine's GPU tests on CUDA (express writes beside
# device lanes), then this build's defaults (express writes; the waiter looking every 8
# pauses at e5e2a01, every 2 for 32 us then every 64 since) against the build before
# (MORIO_EXPRESS=0 MORIO_WAIT_PAUSES=64) and against looks every 2 pauses throughout, ROUNDS
# interleaved rounds of the small rows (default settings with the raw floor, and the spinning
# single 8 B of issue 22), 1 MiB x 256 write and read, then a traced spinning 8 B.
#   variants: off (the build before), on (this build's defaults), p2 (MORIO_WAIT_PAUSES=2)
# Needs .dev/morio and .dev/engine-tests (carry both).   ROUNDS=3
set -u
O=${OUT:-/tmp/s32-final}
R=${ROUNDS:-3}
mkdir -p "$O"/fin
echo "== engine GPU tests (CUDA)"
MORIO_TEST_GPU=1 timeout 150 .dev/engine-tests gpu --test-threads 2 2>&1 |
	grep -E "test result|panicked|FAILED" | head
echo "== engine express tests"
timeout 120 .dev/engine-tests express --test-threads 2 2>&1 | grep -E "test result|panicked|FAILED" | head
b() { # NAME VARIANT -- ARGS...
	local n=$1 e
	case $2 in
	off) e=(MORIO_EXPRESS=0 MORIO_WAIT_PAUSES=64) ;;
	p2) e=(MORIO_WAIT_PAUSES=2) ;;
	*) e=(MORIO_UNUSED=1) ;;
	esac
	shift 3
	timeout 120 env "${e[@]}" .dev/morio bench --loopback --no-ceiling "$@" \
		--json "$O/fin/$n.json" >/dev/null 2>&1 || echo "fail $n"
}
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64)
S=(--op-type write --iters 3000 --no-floor --buffer-size 8 --transfer-batch-size 1 --shards 2 --spin-us 2000 --wait-spin-us 1000)
for ((r = 1; r <= R; r++)); do
	for v in on p2 off; do
		L=(--op-type write --iters 1000)
		b "s8b1-r$r-$v" $v -- "${S[@]}" --same-host require
		b "d8b1-r$r-$v" $v -- "${L[@]}" --buffer-size 8 --transfer-batch-size 1
		b "d8b64-r$r-$v" $v -- "${L[@]}" --no-floor --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
		b "d8b256-r$r-$v" $v -- "${L[@]}" --buffer-size 8 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		b "d4k256-r$r-$v" $v -- "${L[@]}" --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
	done
done
for r in 1 2; do
	for v in on off; do
		b "dw1m-r$r-$v" $v -- --op-type write --no-floor "${big[@]}"
		b "dr1m-r$r-$v" $v -- --op-type read --no-floor "${big[@]}"
	done
done
echo "== spinning single 8 B through rings, this build, traced"
rm -rf /tmp/s32-trace && mkdir -p /tmp/s32-trace
MORIO_TRACE=/tmp/s32-trace timeout 60 .dev/morio bench --loopback --no-ceiling "${S[@]}" \
	--same-host require >/dev/null 2>&1
python3 scripts/bench/trace-stages.py /tmp/s32-trace 2>&1 | head -16
echo "== per round: avg / p50 / p99 us (floor avg / p50)"
python3 scripts/bench/rounds.py "$O/fin"
echo "== on / p2 / off"
python3 scripts/bench/ab-ratios.py "$O/fin" --base off | cut -c1-140
(cd "$O" && tar czf s32-final-json.tar.gz fin && rm -rf fin)
