#!/usr/bin/env bash
# Session 48: how many small scattered GPU parts still move faster device to device than
# staged between two processes of one host? Rows: SIZES x N scattered parts, staged
# (MORIO_GPU_IPC=off) against device to device (MORIO_GPU_IPC_MIN_PART=0) and the default
# rule, interleaved. BIN picks the build (default .dev/morio).
#   OUT=$OUT ROUNDS=2 bash scripts/bench/s48-fewparts.sh   (carry .dev/morio)
set -u
O=${OUT:-/tmp/s48}
mkdir -p "$O/j"
T=(--loopback --no-ceiling --no-floor --same-host require --mem-type gpu --enable-batch-transfer --enable-sess --batch-scattered)
one() { # NAME ARGS...
	local n=$1
	shift
	if timeout 60 ${BIN:-.dev/morio} bench "${T[@]}" "$@" --json "$O/j/$n.json" >"$O/j/$n.out" 2>"$O/j/$n.err"; then
		python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(sys.argv[2], f\"{r['avg_lat_us']:.1f} {r['p50_us']:.1f}\", str(r.get('transport','?')).replace(' ','_'))" "$O/j/$n.json" "$n" >>"$O/rows.txt"
	else echo "$n fail" >>"$O/rows.txt"; tail -3 "$O/j/$n.err"; fi
}
for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
	for op in ${OPS:-write read}; do
		for sz in ${SIZES:-8 2048}; do
			for n in ${NS:-1 2 4 8 16 32}; do
				MORIO_GPU_IPC=off one "$op-$sz-x$n-staged-r$r" --op-type $op --transfer-batch-size $n --buffer-size $sz --iters 1000
				MORIO_GPU_IPC_MIN_PART=0 one "$op-$sz-x$n-d2d-r$r" --op-type $op --transfer-batch-size $n --buffer-size $sz --iters 1000
				one "$op-$sz-x$n-default-r$r" --op-type $op --transfer-batch-size $n --buffer-size $sz --iters 1000
			done
		done
	done
done
python3 - "$O/rows.txt" <<'PY' | tee "$O/summary.txt"
import collections, statistics, sys
by = collections.defaultdict(list); tr = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 4: continue
    k = f[0].rsplit('-r', 1)[0]; by[k].append((float(f[1]), float(f[2]))); tr[k] = f[3]
keys = sorted({k.rsplit('-', 1)[0] for k in by}, key=lambda k: (k.split('-')[0], int(k.split('-')[1]), int(k.split('-x')[1])))
print(f"{'row':18} {'staged avg':>10} {'d2d avg':>9} {'d2d/st':>7} {'staged p50':>10} {'d2d p50':>8} {'dflt avg':>8}  transports staged | d2d | default")
for k in keys:
    s, d = by.get(k + '-staged', []), by.get(k + '-d2d', [])
    if not s or not d: print(k, 'missing'); continue
    sa, da = statistics.median(x[0] for x in s), statistics.median(x[0] for x in d)
    sp, dp = statistics.median(x[1] for x in s), statistics.median(x[1] for x in d)
    f = by.get(k + '-default', [])
    fa = statistics.median(x[0] for x in f) if f else float('nan')
    print(f"{k:18} {sa:10.1f} {da:9.1f} {da/sa:7.2f} {sp:10.1f} {dp:8.1f} {fa:8.1f}  {tr[k+'-staged']} | {tr[k+'-d2d']} | {tr.get(k+'-default','-')}")
PY
