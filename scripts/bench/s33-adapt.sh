#!/usr/bin/env bash
# Session 33, the last call: adaptive busy windows (a default busy-polling shard whose work
# comes back within one more window of going idle doubles its window, up to 4x; back to the
# configured one after 10 ms idle). One binary, ROUNDS interleaved rounds of three variants:
# `base` (MORIO_EXPRESS=ring MORIO_BUSY_ADAPT=0: no express over TCP, fixed windows: this
# session's start for TCP), `fixed` (express over TCP with the poke, fixed windows), `xp`
# (everything: the final build's defaults). Rows over TCP at default settings (single 8 B
# write and read, 8 B x 64, 8 B x 256, 4 KiB x 256, with floors), spinning single 8 B and
# 8 B x 256 over TCP, 1 MiB x 256 write and read; the spinning single 8 B through same-host
# rings in xp.   Carry .dev/morio.   ROUNDS=3
set -u
O=${OUT:-/tmp/s33-adapt}
R=${ROUNDS:-3}
mkdir -p "$O"/a
b() { # NAME VARIANT -- ARGS...
	local n=$1 v=$2 e
	shift 3
	case $v in
	base) e=(MORIO_EXPRESS=ring MORIO_BUSY_ADAPT=0) ;;
	fixed) e=(MORIO_EXPRESS=1 MORIO_BUSY_ADAPT=0) ;;
	xp) e=(MORIO_EXPRESS=1 MORIO_BUSY_ADAPT=1) ;;
	esac
	timeout 120 env "${e[@]}" .dev/morio bench --loopback --no-ceiling "$@" --json "$O/a/$n.json" >/dev/null 2>&1 || echo "fail $n"
}
S=(--iters 3000 --buffer-size 8 --shards 2 --spin-us 2000 --wait-spin-us 1000 --op-type write)
L=(--iters 1000 --same-host off)
bat=(--enable-batch-transfer --enable-sess)
big=(--buffer-size 1048576 --transfer-batch-size 256 "${bat[@]}" --batch-contiguous --iters 48 --same-host off --no-floor)
for ((r = 1; r <= R; r++)); do
	for v in base fixed xp; do
		b "d8-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 8 --transfer-batch-size 1
		b "d8read-r$r-$v" $v -- "${L[@]}" --op-type read --buffer-size 8 --transfer-batch-size 1
		b "d64-r$r-$v" $v -- "${L[@]}" --op-type write --no-floor --buffer-size 8 --transfer-batch-size 64 "${bat[@]}"
		b "d256-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 8 --transfer-batch-size 256 "${bat[@]}"
		b "d4k-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 4096 --transfer-batch-size 256 "${bat[@]}"
		b "t8s-r$r-$v" $v -- "${S[@]}" --transfer-batch-size 1 --same-host off
		b "t256s-r$r-$v" $v -- "${S[@]}" --transfer-batch-size 256 "${bat[@]}" --same-host off
		[ $v = fixed ] || b "w1m-r$r-$v" $v -- --op-type write "${big[@]}"
		[ $v = fixed ] || b "r1m-r$r-$v" $v -- --op-type read "${big[@]}"
		[ $v != xp ] || b "ring8s-r$r-$v" $v -- "${S[@]}" --no-floor --transfer-batch-size 1 --same-host require
	done
done
echo "== per round: avg / p50 / p99 us"
python3 scripts/bench/rounds.py "$O/a"
echo "== slow iterations (> 80 us) per default row, initiator / target busy-poll wakes"
python3 scripts/bench/slow-iters.py "$O/a"
echo "== fixed, xp / base"
python3 scripts/bench/ab-ratios.py "$O/a" --base base | cut -c1-140
(cd "$O" && tar czf s33-adapt-json.tar.gz a && rm -rf a)
