#!/usr/bin/env bash
# The goals of issues 22 (same-host transport) and 23 (speed as users get it), each beside
# its reference, in one call: ROUNDS interleaved rounds of every row, then goals.py's table
# (goal, measured per round and mean, target, met in how many rounds).
#   TCP (--same-host off): default single 8 B write (floor), default 8 B x 64, spinning
#     single 8 B (floor) and 8 B x 256, default 4 KiB x 256 (floor), host and GPU memory
#     1 MiB x 256 write / read and single 64 MiB write / read;
#   same host (--same-host require): host and GPU memory 1 MiB x 256 write / read, GPU single
#     64 MiB write / read, spinning single 8 B.
# GPU rows need the cuda build and a GPU (GPU=0 skips them); with them, copyproc.py (torch)
# measures the GPU's pinned copies both ways at once from two processes. Carry .dev/morio (from
# `h200-bench.sh build`).   OUT=$OUT ROUNDS=3 GPU=1 bash scripts/bench/goals.sh
set -u
O=${OUT:-/tmp/goals}
R=${ROUNDS:-3}
G=${GPU:-1}
M=${MORIO:-.dev/morio}
mkdir -p "$O"/g
b() { # NAME -- ARGS...
	local n=$1
	shift 2
	timeout 180 "$M" bench --loopback --no-ceiling "$@" --json "$O/g/$n.json" >/dev/null 2>&1 ||
		echo "fail $n"
}
spin=(--shards 2 --spin-us 2000 --wait-spin-us 1000)
bat=(--enable-batch-transfer --enable-sess)
big=(--buffer-size 1048576 --transfer-batch-size 256 "${bat[@]}" --batch-contiguous --iters 48 --no-floor)
one=(--buffer-size 67108864 --transfer-batch-size 1 --iters 16 --no-floor)
for ((r = 1; r <= R; r++)); do
	T=(--same-host off)
	H=(--same-host require)
	b "t-d8-r$r" -- "${T[@]}" --iters 1000 --op-type write --buffer-size 8 --transfer-batch-size 1
	b "t-d64-r$r" -- "${T[@]}" --iters 1000 --no-floor --op-type write --buffer-size 8 \
		--transfer-batch-size 64 "${bat[@]}"
	b "t-s8-r$r" -- "${T[@]}" "${spin[@]}" --iters 3000 --op-type write --buffer-size 8 --transfer-batch-size 1
	b "t-s256-r$r" -- "${T[@]}" "${spin[@]}" --iters 3000 --op-type write --buffer-size 8 \
		--transfer-batch-size 256 "${bat[@]}"
	b "t-d4k-r$r" -- "${T[@]}" --iters 1000 --op-type write --buffer-size 4096 --transfer-batch-size 256 "${bat[@]}"
	b "h-s8-r$r" -- "${H[@]}" "${spin[@]}" --iters 3000 --no-floor --op-type write --buffer-size 8 \
		--transfer-batch-size 1
	for op in write read; do
		o=${op:0:1}
		b "t-${o}1m-r$r" -- "${T[@]}" --op-type $op "${big[@]}"
		b "h-${o}1m-r$r" -- "${H[@]}" --op-type $op "${big[@]}"
		b "t-${o}64m-r$r" -- "${T[@]}" --op-type $op "${one[@]}"
		if [ "$G" = 1 ]; then
			b "t-g${o}1m-r$r" -- "${T[@]}" --op-type $op --mem-type gpu "${big[@]}"
			b "h-g${o}1m-r$r" -- "${H[@]}" --op-type $op --mem-type gpu "${big[@]}"
			b "t-g${o}64m-r$r" -- "${T[@]}" --op-type $op --mem-type gpu "${one[@]}"
			b "h-g${o}64m-r$r" -- "${H[@]}" --op-type $op --mem-type gpu "${one[@]}"
		fi
	done
	timeout 60 python3 scripts/bench/membw.py --json "$O/g/membw-r$r.json" 256 >/dev/null 2>&1 || echo "fail membw-r$r"
	if [ "$G" = 1 ]; then
		timeout 60 python3 scripts/bench/copyproc.py --json "$O/g/gpulink-r$r.json" 2 2 >/dev/null 2>&1 || echo "fail gpulink-r$r"
	fi
done
python3 scripts/bench/goals.py "$O/g" --json "$O/goals.json"
(cd "$O" && tar czf goals-json.tar.gz g && rm -rf g)
