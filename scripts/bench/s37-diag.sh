#!/usr/bin/env bash
# Two questions from session 37's first call (H200). (1) Default-settings small rows over TCP
# start slow: their first 200-290 iterations take ~115-125 us each, then ~13-20. Which stage
# holds the 100 us? Traced default rows (MORIO_TRACE), the stages of the slow and the fast
# iterations apart. (2) Spinning rows have one 300-450 us iteration at the same transfer
# count (the 2,854th) in every round: memory first touched on a fresh transparent huge page
# (zeroing 2 MiB)? The same rows with THP disabled for the process (prctl
# PR_SET_THP_DISABLE, inherited by the bench's target), interleaved.
#   OUT=$OUT RUNS=3 bash scripts/bench/s37-diag.sh      (carry .dev/morio)
set -u
O=${OUT:-/tmp/s37}
M=${MORIO:-.dev/morio}
N=${RUNS:-3}
mkdir -p "$O/w/j" "$O/w/tr"
echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled) defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag) kernel $(uname -r) cpus $(nproc)"
nothp=(python3 -c 'import ctypes,os,sys; assert ctypes.CDLL(None).prctl(41,1,0,0,0)==0; os.execvp(sys.argv[1], sys.argv[1:])')
d8=(bench --loopback --no-ceiling --same-host off --iters 1000 --op-type write --buffer-size 8 --transfer-batch-size 1)
s8=(bench --loopback --no-ceiling --no-floor --same-host off --shards 2 --spin-us 2000 --wait-spin-us 1000 --iters 3000 --op-type write --buffer-size 8 --transfer-batch-size 1)
for ((i = 1; i <= N; i++)); do
	timeout 60 "$M" "${d8[@]}" --json "$O/w/j/d8-$i.json" >/dev/null 2>&1 || echo "fail d8-$i"
	mkdir -p "$O/w/tr/$i"
	MORIO_TRACE=$O/w/tr/$i timeout 60 "$M" "${d8[@]}" --json "$O/w/j/d8tr-$i.json" >/dev/null 2>&1 || echo "fail d8tr-$i"
	timeout 60 "$M" "${s8[@]}" --json "$O/w/j/s8-$i.json" >/dev/null 2>&1 || echo "fail s8-$i"
	timeout 60 "${nothp[@]}" "$M" "${s8[@]}" --json "$O/w/j/s8nothp-$i.json" >/dev/null 2>&1 || echo "fail s8nothp-$i"
	timeout 60 "${nothp[@]}" "$M" "${d8[@]}" --json "$O/w/j/d8nothp-$i.json" >/dev/null 2>&1 || echo "fail d8nothp-$i"
done
python3 - "$O/w/j" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f)); w = d.get("warmup_iters", 0)
    for r in d["rows"]:
        du = r["durations_us"]; p50 = r["p50_us"]
        slow = [i for i, x in enumerate(du) if x > 4 * p50]
        run = next((i for i, x in enumerate(du) if x < 3 * p50), 0)
        big = [(i + w, round(du[i])) for i in slow if i >= run][:6]
        fl = (r.get("floor") or {}).get("p50_us", 0)
        print(f"{os.path.basename(f)[:-5]:12} avg {r['avg_lat_us']:7.1f} p50 {p50:6.1f} p99 {r['p99_us']:7.1f} "
              f"floor {fl:5.1f} slow-start {run:4d} later-slow(transfer#,us) {big}")
PY
for i in $(seq 1 "$N"); do python3 scripts/bench/trace-stages.py "$O/w/tr/$i" "tr$i" 2>&1 | head -24; done
(cd "$O" && tar czf s37-diag.tgz w && rm -rf w)
