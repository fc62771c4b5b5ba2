#!/usr/bin/env bash
# Session 29's A/B on the GPU host, interleaved ROUNDS times: the build before the session
# (.dev/morio) against this one (.dev/morio-new) on the same-host rows (GPU through CUDA IPC,
# host memory), the default-settings latency rows, and the spinning single 8 B; TCP
# (--same-host off) beside them as the reference. ab-ratios tables last.
set -u
O=${OUT:-/tmp/s29-final}
mkdir -p "$O"/gpu "$O"/host "$O"/lat "$O"/spin
timeout 120 python3 scripts/bench/membw.py 64 256
b() { # DIR NAME BIN ARGS...
	local d=$1 n=$2 bin=$3
	shift 3
	timeout 90 ".dev/${bin}" bench --loopback --no-ceiling "$@" --json "$O/$d/$n.json" >/dev/null 2>&1 || echo "fail $d/$n"
}
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64)
one=(--buffer-size 67108864 --transfer-batch-size 1 --iters 64)
for ((r = 1; r <= ${ROUNDS:-3}; r++)); do
	for v in "morio require" "morio-new require" "morio-new off"; do
		set -- $v
		t="r$r-$1-$2"
		b gpu "gw1m-$t" $1 --op-type write "${big[@]}" --mem-type gpu --same-host $2
		b gpu "gr1m-$t" $1 --op-type read "${big[@]}" --mem-type gpu --same-host $2
		b gpu "gw64m-$t" $1 --op-type write "${one[@]}" --mem-type gpu --same-host $2
		b gpu "gr64m-$t" $1 --op-type read "${one[@]}" --mem-type gpu --same-host $2
		b host "hw1m-$t" $1 --op-type write "${big[@]}" --same-host $2
		b host "hr1m-$t" $1 --op-type read "${big[@]}" --same-host $2
		b host "hw64m-$t" $1 --op-type write "${one[@]}" --same-host $2
	done
	# Default settings: before, now, and two candidates for spinning by default (glommio's
	# spin after work; the busy poller that backs off when preempted, experiments/).
	for v in morio morio-new "morio-new 100" morio-bc100; do
		set -- $v
		bin=$1 tag=$1 X=()
		if (($# > 1)); then tag="$1-spin$2" X=(--spin-us "$2"); fi
		L=(--op-type write --iters 256 "${X[@]}")
		b lat "d8b1-r$r-$tag" $bin "${L[@]}" --buffer-size 8 --transfer-batch-size 1
		b lat "d8b64-r$r-$tag" $bin "${L[@]}" --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
		b lat "d8b256-r$r-$tag" $bin "${L[@]}" --buffer-size 8 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		b lat "d4k256-r$r-$tag" $bin "${L[@]}" --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		b lat "dw1m-r$r-$tag" $bin --op-type write "${big[@]}" "${X[@]}"
	done
	for sh in require off; do
		b spin "s8b1-r$r-$sh" morio-new --op-type write --iters 2000 --buffer-size 8 --transfer-batch-size 1 --shards 2 --spin-us 2000 --wait-spin-us 1000 --same-host $sh
	done
done
for d in gpu host lat spin; do
	echo "== $d"
	python3 scripts/bench/ab-ratios.py "$O/$d" | cut -c1-125
done
(cd "$O" && tar czf s29-final-json.tar.gz gpu host lat spin && rm -rf gpu host lat spin)
