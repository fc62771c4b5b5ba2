#!/usr/bin/env bash
# Session 33, call 2: (1) GPU staging over TCP with smaller pinned pools and slots (can the
# slots stay in the last-level cache, so that the staged path costs fewer DRAM passes than
# docs/perf/same-host-chunks-h200.md counts?), against host memory, ROUNDS interleaved
# rounds; (2) traces of the spinning single 8 B and 8 B x 256 over TCP with express writes;
# (3) the default 4 KiB x 256 over TCP with its floor.   Carry .dev/morio.   ROUNDS=2
set -u
O=${OUT:-/tmp/s33-gpupool}
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
	for pool in 64 16 8 4; do
		for slot in 1024 256; do
			[ $((pool * 1024 / slot)) -ge 16 ] || continue
			b "gw1m-r$r-p${pool}s${slot}" -- --op-type write "${big[@]}" --mem-type gpu \
				--gpu-staging-bytes $((pool << 20)) --gpu-slot-bytes $((slot << 10))
		done
	done
done
S=(--op-type write --iters 3000 --buffer-size 8 --shards 2 --spin-us 2000 --wait-spin-us 1000 --same-host off --no-floor)
for row in 1 256; do
	echo "== spinning 8 B x $row over TCP, express, traced"
	rm -rf /tmp/s33-ts && mkdir -p /tmp/s33-ts
	extra=()
	[ $row = 1 ] || extra=(--enable-batch-transfer --enable-sess)
	MORIO_TRACE=/tmp/s33-ts timeout 60 .dev/morio bench --loopback --no-ceiling "${S[@]}" \
		--transfer-batch-size $row "${extra[@]}" >/dev/null 2>&1
	python3 scripts/bench/trace-stages.py /tmp/s33-ts 2>&1 | sed -n 1,20p
done
for ((r = 1; r <= R; r++)); do
	b "d4k-r$r-xp" -- --op-type write --iters 1000 --same-host off --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
done
echo "== per round: avg / p50 / p99 us"
python3 scripts/bench/rounds.py "$O/g"
(cd "$O" && tar czf s33-gpupool-json.tar.gz g && rm -rf g)
