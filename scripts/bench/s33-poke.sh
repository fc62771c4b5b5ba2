#!/usr/bin/env bash
# Session 33, the express poke: the submitting thread of an express transfer sends the lane's
# shard a message (ShardMsg::Expect) so that a parked shard wakes while the frame travels
# (a busy one takes it without a wake-up). Variants, one binary, ROUNDS interleaved rounds:
# `base` (MORIO_EXPRESS=ring: no express over TCP), `xpnp` (express, MORIO_EXPRESS_POKE=0),
# `xp` (express with the poke). Rows over TCP at default settings (single 8 B write and read,
# 8 B x 64, 8 B x 256, 4 KiB x 256 with floors), spinning single 8 B and 8 B x 256 over TCP,
# spinning single 8 B through same-host rings; then 1 MiB x 256 write over TCP.
# Carry .dev/morio.   ROUNDS=3
set -u
O=${OUT:-/tmp/s33-poke}
R=${ROUNDS:-3}
mkdir -p "$O"/p
b() { # NAME VARIANT -- ARGS...
	local n=$1 v=$2 e
	shift 3
	case $v in
	base) e=(MORIO_EXPRESS=ring) ;;
	xpnp) e=(MORIO_EXPRESS=1 MORIO_EXPRESS_POKE=0) ;;
	xp) e=(MORIO_EXPRESS=1) ;;
	esac
	timeout 120 env "${e[@]}" .dev/morio bench --loopback --no-ceiling "$@" --json "$O/p/$n.json" >/dev/null 2>&1 || echo "fail $n"
}
S=(--iters 3000 --buffer-size 8 --shards 2 --spin-us 2000 --wait-spin-us 1000 --op-type write)
L=(--iters 1000 --same-host off)
bat=(--enable-batch-transfer --enable-sess)
for ((r = 1; r <= R; r++)); do
	for v in base xpnp xp; do
		b "d8-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 8 --transfer-batch-size 1
		b "d8read-r$r-$v" $v -- "${L[@]}" --op-type read --buffer-size 8 --transfer-batch-size 1
		b "d64-r$r-$v" $v -- "${L[@]}" --op-type write --no-floor --buffer-size 8 --transfer-batch-size 64 "${bat[@]}"
		b "d256-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 8 --transfer-batch-size 256 "${bat[@]}"
		b "d4k-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 4096 --transfer-batch-size 256 "${bat[@]}"
		b "t8s-r$r-$v" $v -- "${S[@]}" --transfer-batch-size 1 --same-host off
		b "t256s-r$r-$v" $v -- "${S[@]}" --no-floor --transfer-batch-size 256 "${bat[@]}" --same-host off
		[ $v = base ] || b "ring8s-r$r-$v" $v -- "${S[@]}" --no-floor --transfer-batch-size 1 --same-host require
	done
done
for v in base xp; do
	b "w1m-r1-$v" $v -- --op-type write --buffer-size 1048576 --transfer-batch-size 256 "${bat[@]}" \
		--batch-contiguous --iters 64 --same-host off --no-floor
done
echo "== per round: avg / p50 / p99 us"
python3 scripts/bench/rounds.py "$O/p"
echo "== slow iterations (> 80 us) per default row, initiator / target busy-poll wakes"
python3 scripts/bench/slow-iters.py "$O/p"
echo "== xpnp, xp / base"
python3 scripts/bench/ab-ratios.py "$O/p" --base base | cut -c1-140
(cd "$O" && tar czf s33-poke-json.tar.gz p && rm -rf p)
