#!/usr/bin/env bash
# Session 45's device calls (docs/perf/s45-runs.md).
#   PART=probe  where small GPU batches lose against host memory: traced 8 B x 256 batch
#               writes (GPU and host memory; trace-stages.py), then ROUNDS interleaved rounds
#               of batch writes, GPU and host memory, at MORI's strided layout and at
#               --batch-scattered (the same slots shuffled, as a paged KV cache's blocks),
#               for SIZES x 256
#   PART=ab     VARIANTS ("name binary [opts]; ..."), interleaved ROUNDS times over the
#               scattered and strided GPU rows of SIZES
#   LOAD=SECONDS  (with ab) the GPU kept busy meanwhile by back-to-back bf16 matmuls from
#               torch (an application's compute, against which an SM kernel must find room)
#   OUT=$OUT PART=probe bash scripts/bench/s45.sh        (carry .dev/morio)
set -u
O=${OUT:-/tmp/s45}
P=${PART:-probe}
M=${MORIO:-.dev/morio}
mkdir -p "$O"
nvidia-smi --query-gpu=name --format=csv,noheader
T=(--loopback --no-ceiling --no-floor --same-host off ${EXTRA:-})
Bt=(--enable-batch-transfer --enable-sess --transfer-batch-size 256)
one() { # NAME BIN ARGS... : one row, its avg latency and bandwidth appended to $O/rows.txt
	local n=$1 bin=$2
	shift 2
	if timeout 120 $bin bench "${T[@]}" "$@" --json "$O/j/$n.json" >/dev/null 2>"$O/j/$n.err"; then
		python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(sys.argv[2], f\"{r['avg_lat_us']:.1f} {r['p50_us']:.1f} {r['avg_bw_gbps']:.3f}\")" "$O/j/$n.json" "$n" >>"$O/rows.txt"
	else
		echo "$n fail" >>"$O/rows.txt"
		tail -3 "$O/j/$n.err"
	fi
}
summary() { # rows.txt -> name: mean avg latency (us) over rounds, each round's
	python3 - "$O/rows.txt" <<'PY'
import collections, statistics, sys
by = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 4:
        by[f[0].rsplit("-r", 1)[0]].append((float(f[1]), float(f[3])))
for k in sorted(by):
    v = by[k]
    print(f"{k:28} avg us {statistics.mean(a for a, _ in v):9.1f}   rounds " + " ".join(f"{a:.0f}" for a, _ in v)
          + f"   GB/s {statistics.mean(b for _, b in v):.2f}")
PY
}
mkdir -p "$O/j"
case $P in
probe)
	for mem in gpu cpu; do
		d=$O/tr/$mem-8x256
		mkdir -p "$d"
		MORIO_TRACE=$d timeout 90 "$M" bench "${T[@]}" --mem-type $mem --op-type write "${Bt[@]}" \
			--buffer-size 8 --iters 300 >/dev/null 2>&1 || echo "trace $mem failed"
		python3 scripts/bench/trace-stages.py "$d" "$mem 8 B x 256 write"
		d=$O/tr/$mem-8x1
		mkdir -p "$d"
		MORIO_TRACE=$d timeout 90 "$M" bench "${T[@]}" --mem-type $mem --op-type write \
			--transfer-batch-size 1 --buffer-size 8 --iters 300 >/dev/null 2>&1 || echo "trace $mem single failed"
		python3 scripts/bench/trace-stages.py "$d" "$mem 8 B single write"
	done
	(cd "$O" && tar czf s45-trace.tgz tr && rm -rf tr)
	for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
		for sz in ${SIZES:-8 4096 32768}; do
			for mem in gpu cpu; do
				for lay in strided scattered; do
					x=()
					[[ $lay == scattered ]] && x=(--batch-scattered)
					one "$mem-$lay-w$sz-r$r" "$M" --mem-type $mem --op-type write "${Bt[@]}" --buffer-size $sz --iters 200 "${x[@]}"
				done
			done
			one "gpu-scattered-r$sz-r$r" "$M" --mem-type gpu --op-type read "${Bt[@]}" --buffer-size $sz --iters 200 --batch-scattered
		done
	done
	summary | tee "$O/summary.txt" ;;
ab)
	if [[ -n ${LOAD:-} ]]; then
		python3 - "$LOAD" <<'PY' &
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end, n = time.time() + float(sys.argv[1]), 0
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    n += 20
print(f"load: {n} matmuls 8192^3 bf16", flush=True)
PY
		sleep 5
	fi
	IFS=';' read -ra V <<<"${VARIANTS:?VARIANTS=\"name bin [opts]; ...\"}"
	for ((r = 1; r <= ${ROUNDS:-3}; r++)); do
		for sz in ${SIZES:-8 4096 32768}; do
			for v in "${V[@]}"; do
				read -ra w <<<"$v"
				for op in ${OPS:-write}; do
					for lay in ${LAYOUTS:-scattered strided}; do
						x=()
						[[ $lay == scattered ]] && x=(--batch-scattered)
						one "${w[0]}-$lay-$op$sz-r$r" "${w[1]}" "${w[@]:2}" --mem-type gpu --op-type $op "${Bt[@]}" --buffer-size $sz --iters 200 "${x[@]}"
					done
				done
			done
		done
	done
	summary | tee "$O/summary.txt"
	wait ;;
esac
