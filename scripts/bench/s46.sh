#!/usr/bin/env bash
# Session 46's device call (docs/perf/s46-runs.md): same-host GPU batches between two
# processes, the build before (.dev/morio-old, 1662ad8: device-to-device copies only as
# batches, payloads of parts under 8 KiB staged) against this one (.dev/morio: runs of small
# device-to-device copies as one 2D copy, such payloads moved device to device), each
# row on both builds in turn, ROUNDS times; every row validated. Rows: MORI's strided layout and --batch-scattered at
# SIZES x 256, 8 B x 1024, a single 8 B and 8 B x 4 scattered (each also with
# MORIO_GPU_IPC_MIN_PART=0: device to device), 1 MiB x 256 (throughput check).
#   OUT=$OUT ROUNDS=2 [OPS="write read"] [SIZES="8 4096 32768"] bash scripts/bench/s46.sh
#   (carry .dev/morio, .dev/morio-old)
set -u
O=${OUT:-/tmp/s46}
mkdir -p "$O/j"
nvidia-smi --query-gpu=name --format=csv,noheader
T=(--loopback --no-ceiling --no-floor --same-host require --mem-type gpu)
Bt=(--enable-batch-transfer --enable-sess)
one() { # NAME BIN ARGS... : one row's avg and p50 latency, bandwidth and transport -> rows.txt
	local n=$1 bin=$2
	shift 2
	if timeout 120 $bin bench "${T[@]}" "$@" --json "$O/j/$n.json" >"$O/j/$n.out" 2>"$O/j/$n.err"; then
		python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(sys.argv[2], f\"{r['avg_lat_us']:.1f} {r['p50_us']:.1f} {r['avg_bw_gbps']:.3f}\", str(r.get('transport','?')).replace(' ','_'))" "$O/j/$n.json" "$n" >>"$O/rows.txt"
	else
		echo "$n fail" >>"$O/rows.txt"
		tail -3 "$O/j/$n.err"
	fi
}
both() { # NAME ARGS... : the row on the build before, then on this one
	local n=$1
	shift
	one "old-$n" .dev/morio-old "$@"
	one "new-$n" .dev/morio "$@"
}
for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
	for op in ${OPS:-write read}; do
		for sz in ${SIZES:-8 4096 32768}; do
			both "$op-strided-$sz-r$r" --op-type $op "${Bt[@]}" --transfer-batch-size 256 --buffer-size $sz --iters 300
			both "$op-scattered-$sz-r$r" --op-type $op "${Bt[@]}" --transfer-batch-size 256 --buffer-size $sz --iters 300 --batch-scattered
		done
		both "$op-strided-8x1024-r$r" --op-type $op "${Bt[@]}" --transfer-batch-size 1024 --buffer-size 8 --iters 300
		both "$op-single8-r$r" --op-type $op --transfer-batch-size 1 --buffer-size 8 --iters 1000
		MORIO_GPU_IPC_MIN_PART=0 both "$op-single8ipc-r$r" --op-type $op --transfer-batch-size 1 --buffer-size 8 --iters 1000
		both "$op-scat8x4-r$r" --op-type $op "${Bt[@]}" --transfer-batch-size 4 --buffer-size 8 --iters 1000 --batch-scattered
		MORIO_GPU_IPC_MIN_PART=0 both "$op-scat8x4ipc-r$r" --op-type $op "${Bt[@]}" --transfer-batch-size 4 --buffer-size 8 --iters 1000 --batch-scattered
		both "$op-1m-r$r" --op-type $op "${Bt[@]}" --transfer-batch-size 256 --buffer-size 1048576 --iters 20
	done
done
python3 - "$O/rows.txt" <<'PY' | tee "$O/summary.txt"
import collections, statistics, sys
by = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 5:
        by[f[0].rsplit("-r", 1)[0]].append((float(f[1]), float(f[2]), float(f[3]), f[4]))
rows = sorted({k.split("-", 1)[1] for k in by})
print(f"{'row':28} {'old avg':>9} {'new avg':>9} {'new/old':>7}  old p50 / new p50   GB/s old / new   transport old | new")
for r in rows:
    o, n = by.get("old-" + r, []), by.get("new-" + r, [])
    if not o or not n:
        print(r, "missing"); continue
    ao, an = statistics.mean(x[0] for x in o), statistics.mean(x[0] for x in n)
    po, pn = statistics.mean(x[1] for x in o), statistics.mean(x[1] for x in n)
    bo, bn = statistics.mean(x[2] for x in o), statistics.mean(x[2] for x in n)
    print(f"{r:28} {ao:9.1f} {an:9.1f} {an/ao:7.2f}  {po:8.1f} / {pn:<8.1f} {bo:7.2f} / {bn:<7.2f} {o[0][3]} | {n[0][3]}")
PY
