#!/usr/bin/env bash
# Session 33's express writes over TCP: one binary, three variants interleaved round by
# round: `base` (MORIO_EXPRESS=ring: express writes only into same-host rings, the build
# before for TCP), `xp` (small writes sent on the lane's TCP socket by the submitting
# thread) and `xpsp` (xp, and socket readers of spinning shards poll their socket themselves
# while hot, MORIO_SELF_POLL_SOCKETS=1). Rows over TCP (--same-host off): spinning single
# 8 B and 8 B x 256, default single 8 B, 8 B x 64, 8 B x 256 and 4 KiB x 256; the spinning
# single 8 B through same-host rings (issue 22's row) in base and xp; then 1 MiB x 256
# write/read over TCP and a traced spinning single 8 B over TCP per variant.
# Carry .dev/morio.   ROUNDS=3
set -u
O=${OUT:-/tmp/s33-tcpexpress}
R=${ROUNDS:-3}
mkdir -p "$O"/x
b() { # NAME VARIANT -- ARGS...
	local n=$1 v=$2
	shift 3
	timeout 120 env $(venv "$v") .dev/morio bench --loopback \
		--no-ceiling "$@" --json "$O/x/$n.json" >/dev/null 2>&1 || echo "fail $n"
}
venv() {
	case $1 in
	base) echo MORIO_EXPRESS=ring ;;
	xp) echo MORIO_EXPRESS=1 ;;
	xpsp) echo MORIO_EXPRESS=1 MORIO_SELF_POLL_SOCKETS=1 ;;
	esac
}
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64 --same-host off)
S=(--op-type write --iters 3000 --buffer-size 8 --shards 2 --spin-us 2000 --wait-spin-us 1000)
L=(--op-type write --iters 1000 --same-host off)
for ((r = 1; r <= R; r++)); do
	for v in base xp xpsp; do
		b "t8s-r$r-$v" $v -- "${S[@]}" --transfer-batch-size 1 --same-host off
		b "t256s-r$r-$v" $v -- "${S[@]}" --transfer-batch-size 256 --enable-batch-transfer --enable-sess --same-host off
		b "d8-r$r-$v" $v -- "${L[@]}" --buffer-size 8 --transfer-batch-size 1
		b "d64-r$r-$v" $v -- "${L[@]}" --no-floor --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
		b "d256-r$r-$v" $v -- "${L[@]}" --buffer-size 8 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		b "d4k-r$r-$v" $v -- "${L[@]}" --no-floor --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		[ "$v" = xpsp ] || b "ring8s-r$r-$v" $v -- "${S[@]}" --no-floor --transfer-batch-size 1 --same-host require
	done
done
for v in base xp; do
	b "w1m-r1-$v" $v -- --op-type write --no-floor "${big[@]}"
	b "r1m-r1-$v" $v -- --op-type read --no-floor "${big[@]}"
done
for v in base xp xpsp; do
	echo "== $v: spinning single 8 B over TCP, traced"
	rm -rf /tmp/s33-ts && mkdir -p /tmp/s33-ts
	MORIO_TRACE=/tmp/s33-ts timeout 60 env $(venv "$v") .dev/morio bench \
		--loopback --no-ceiling --no-floor "${S[@]}" --transfer-batch-size 1 --same-host off >/dev/null 2>&1
	python3 scripts/bench/trace-stages.py /tmp/s33-ts 2>&1 | sed -n 1,18p
done
echo "== per round: avg / p50 / p99 us"
python3 scripts/bench/rounds.py "$O/x"
echo "== xp, xpsp / base"
python3 scripts/bench/ab-ratios.py "$O/x" --base base | cut -c1-140
(cd "$O" && tar czf s33-tcpexpress-json.tar.gz x && rm -rf x)
