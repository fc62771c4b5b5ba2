#!/usr/bin/env bash
# Session 33: GPU staging over TCP with larger pinned pools and slots than the default
# (64 MiB, 1 MiB), GPU -> GPU write and read 1 MiB x 256 and a single 64 MiB write, against
# host memory, ROUNDS interleaved rounds.   Carry .dev/morio.   ROUNDS=2
set -u
O=${OUT:-/tmp/s33-gpupool2}
R=${ROUNDS:-2}
mkdir -p "$O"/g
b() { # NAME -- ARGS...
	local n=$1
	shift 2
	timeout 120 .dev/morio bench --loopback --no-ceiling "$@" --json "$O/g/$n.json" >/dev/null 2>&1 || echo "fail $n"
}
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 48 --same-host off --no-floor)
for ((r = 1; r <= R; r++)); do
	b "hw1m-r$r-host" -- --op-type write "${big[@]}"
	b "hr1m-r$r-host" -- --op-type read "${big[@]}"
	for pool in 64 128 256; do
		for slot in 1 2 4; do
			g=(--mem-type gpu --gpu-staging-bytes $((pool << 20)) --gpu-slot-bytes $((slot << 20)))
			b "gw1m-r$r-p${pool}s${slot}" -- --op-type write "${big[@]}" "${g[@]}"
			b "gr1m-r$r-p${pool}s${slot}" -- --op-type read "${big[@]}" "${g[@]}"
		done
	done
done
echo "== per round: avg / p50 / p99 us, GB/s"
python3 scripts/bench/rounds.py "$O/g" | cut -c1-70
(cd "$O" && tar czf s33-gpupool2-json.tar.gz g && rm -rf g)
