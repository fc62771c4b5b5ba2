#!/usr/bin/env bash
# Session 33's final build: express writes and reads over TCP (`xp`) against
# MORIO_EXPRESS=ring (`base`: express transfers only into same-host rings), one binary,
# ROUNDS interleaved rounds over TCP (--same-host off) of the spinning single 8 B and
# 8 B x 256, the default single 8 B, 8 B x 64, 8 B x 256 and 4 KiB x 256 (floors measured in
# each run), single 8 B reads spinning and default, the spinning single 8 B through
# same-host rings (issue 22's row); 1 MiB x 256
# write / read over TCP; traces of the spinning rows in xp.   Carry .dev/morio.   ROUNDS=3
set -u
O=${OUT:-/tmp/s33-final}
R=${ROUNDS:-3}
mkdir -p "$O"/f
b() { # NAME VARIANT -- ARGS...
	local n=$1 v=$2
	shift 3
	timeout 120 env MORIO_EXPRESS=$([ "$v" = base ] && echo ring || echo 1) .dev/morio bench \
		--loopback --no-ceiling "$@" --json "$O/f/$n.json" >/dev/null 2>&1 || echo "fail $n"
}
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64 --same-host off --no-floor)
S=(--iters 3000 --buffer-size 8 --shards 2 --spin-us 2000 --wait-spin-us 1000)
L=(--iters 1000 --same-host off)
bat=(--enable-batch-transfer --enable-sess)
for ((r = 1; r <= R; r++)); do
	for v in base xp; do
		b "t8s-r$r-$v" $v -- "${S[@]}" --op-type write --transfer-batch-size 1 --same-host off
		b "t256s-r$r-$v" $v -- "${S[@]}" --op-type write --transfer-batch-size 256 "${bat[@]}" --same-host off
		b "t8sread-r$r-$v" $v -- "${S[@]}" --transfer-batch-size 1 --same-host off --op-type read
		b "d8read-r$r-$v" $v -- "${L[@]}" --buffer-size 8 --transfer-batch-size 1 --op-type read
		b "d8-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 8 --transfer-batch-size 1
		b "d64-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 8 --transfer-batch-size 64 "${bat[@]}"
		b "d256-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 8 --transfer-batch-size 256 "${bat[@]}"
		b "d4k-r$r-$v" $v -- "${L[@]}" --op-type write --buffer-size 4096 --transfer-batch-size 256 "${bat[@]}"
		b "ring8s-r$r-$v" $v -- "${S[@]}" --op-type write --no-floor --transfer-batch-size 1 --same-host require
	done
done
for v in base xp; do
	b "w1m-r1-$v" $v -- --op-type write "${big[@]}"
	b "r1m-r1-$v" $v -- --op-type read "${big[@]}"
done
for row in 1 256; do
	echo "== xp: spinning 8 B x $row over TCP, traced"
	rm -rf /tmp/s33-ts && mkdir -p /tmp/s33-ts
	extra=()
	[ $row = 1 ] || extra=("${bat[@]}")
	MORIO_TRACE=/tmp/s33-ts timeout 60 .dev/morio bench --loopback --no-ceiling --no-floor "${S[@]}" --op-type write \
		--same-host off --transfer-batch-size $row "${extra[@]}" >/dev/null 2>&1
	python3 scripts/bench/trace-stages.py /tmp/s33-ts 2>&1 | sed -n 1,16p
done
echo "== per round: avg / p50 / p99 us"
python3 scripts/bench/rounds.py "$O/f"
echo "== xp / base"
python3 scripts/bench/ab-ratios.py "$O/f" --base base | cut -c1-140
(cd "$O" && tar czf s33-final-json.tar.gz f && rm -rf f)
