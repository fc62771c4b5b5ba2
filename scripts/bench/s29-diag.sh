#!/usr/bin/env bash
# Session 29 diagnostics on the GPU host: wake-up cost against idle time, IPC copy costs,
# owner-block A/B, chunk-size sweep for same-host rows, pipelined same-host sends A/B.
set -u
O=${OUT:-/tmp/s29}
mkdir -p "$O"/own "$O"/chunk "$O"/pipe
.dev/wakebench 0 9
.dev/wakebench 0 1
timeout 90 python3 scripts/bench/ipc-copy.py 2>&1 | tail -8
b() { # DIR NAME BIN ARGS...
	local d=$1 n=$2 bin=$3
	shift 3
	timeout 60 ".dev/${bin}" bench --loopback --no-ceiling "$@" --json "$O/$d/$n.json" >/dev/null 2>&1 || echo "fail $d/$n"
}
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64)
for r in 1 2; do
	for c in 1m 8m 32m; do
		cb=$(( ${c%m} << 20 ))
		b chunk "gw64m-r$r-c$c" morio --op-type write --buffer-size 67108864 --transfer-batch-size 1 --iters 64 --mem-type gpu --same-host require --chunk-bytes $cb
		b chunk "gw1m-r$r-c$c" morio --op-type write "${big[@]}" --mem-type gpu --same-host require --chunk-bytes $cb
		b chunk "hw1m-r$r-c$c" morio --op-type write "${big[@]}" --same-host require --chunk-bytes $cb
		b chunk "hr1m-r$r-c$c" morio --op-type read "${big[@]}" --same-host require --chunk-bytes $cb
		b chunk "hw64m-r$r-c$c" morio --op-type write --buffer-size 67108864 --transfer-batch-size 1 --iters 64 --same-host require --chunk-bytes $cb
	done
	b chunk "gw64m-r$r-shc" morio-shc --op-type write --buffer-size 67108864 --transfer-batch-size 1 --iters 64 --mem-type gpu --same-host require
	b chunk "gw1m-r$r-shc" morio-shc --op-type write "${big[@]}" --mem-type gpu --same-host require
	b chunk "hw1m-r$r-shc" morio-shc --op-type write "${big[@]}" --same-host require
	b chunk "hr1m-r$r-shc" morio-shc --op-type read "${big[@]}" --same-host require
	b chunk "hw1m-r$r-tcp" morio --op-type write "${big[@]}" --same-host off
	b chunk "hr1m-r$r-tcp" morio --op-type read "${big[@]}" --same-host off
	for p in morio-p0 morio-p1; do
		b pipe "hw1m-r$r-$p" $p --op-type write "${big[@]}" --same-host require
		b pipe "hr1m-r$r-$p" $p --op-type read "${big[@]}" --same-host require
	done
	for v in morio morio-uid morio-sticky "morio-uid 100" "morio-uid 500"; do
		set -- $v
		bin=$1 tag=$1 X=()
		if (($# > 1)); then tag="$1-spin$2" X=(--spin-us "$2"); fi
		B=(--op-type write --iters 256 "${X[@]}")
		b own "d8b1-r$r-$tag" $bin "${B[@]}" --buffer-size 8 --transfer-batch-size 1
		b own "d8b64-r$r-$tag" $bin "${B[@]}" --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
		b own "d4k256-r$r-$tag" $bin "${B[@]}" --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
	done
	for v in "morio" "morio-uid" "morio-uid 100" "morio-uid 500"; do
		set -- $v
		bin=$1 tag=$1 X=()
		if (($# > 1)); then tag="$1-spin$2" X=(--spin-us "$2"); fi
		b own "hw1m-r$r-$tag" $bin --op-type write "${big[@]}" "${X[@]}"
	done
done
python3 - "$O/own" <<'PY'
import json, glob, os, sys
for f in sorted(glob.glob(sys.argv[1] + '/*.json')):
    r = json.load(open(f))['rows'][0]; d = r['durations_us']
    print(os.path.basename(f)[:-5].ljust(24), 'outliers>300us at', [i for i, x in enumerate(d) if x > 300][:14])
PY
for d in chunk pipe own; do
	echo "== $d"
	python3 scripts/bench/ab-ratios.py "$O/$d" | cut -c1-125
done
