#!/usr/bin/env bash
# The spinning 8 B x 256 write over TCP stalls once (~370 us, in the target's placement
# stage) at a fixed transfer count (2,377th in session 38's traces): the first touch of a
# fresh transparent huge page as the heap grows? RUNS runs with THP on and off for the
# process (prctl PR_SET_THP_DISABLE, inherited by the bench's target), interleaved; each
# run's slow iterations (> 150 us) as (transfer#, us).
#   OUT=$OUT RUNS=4 bash scripts/bench/s38-thp.sh      (carry .dev/morio)
set -u
O=${OUT:-/tmp/s38}
M=${MORIO:-.dev/morio}
N=${RUNS:-4}
mkdir -p "$O/thp"
echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled) defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag)"
nothp=(python3 -c 'import ctypes,os,sys; assert ctypes.CDLL(None).prctl(41,1,0,0,0)==0; os.execvp(sys.argv[1], sys.argv[1:])')
s=(bench --loopback --no-ceiling --no-floor --same-host off --shards 2 --spin-us 2000 --wait-spin-us 1000 --iters 3000 --op-type write --buffer-size 8 --enable-batch-transfer --enable-sess)
for ((i = 1; i <= N; i++)); do
	for b in 256 1; do
		timeout 60 "$M" "${s[@]}" --transfer-batch-size $b --json "$O/thp/on-$b-$i.json" >/dev/null 2>&1 || echo "fail on-$b-$i"
		timeout 60 "${nothp[@]}" "$M" "${s[@]}" --transfer-batch-size $b --json "$O/thp/off-$b-$i.json" >/dev/null 2>&1 || echo "fail off-$b-$i"
	done
done
python3 - "$O/thp" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f)); w = d.get("warmup_iters", 0); r = d["rows"][0]
    slow = [(i + w, round(x)) for i, x in enumerate(r["durations_us"]) if x > 150]
    print(f"{os.path.basename(f)[:-5]:12} avg {r['avg_lat_us']:6.1f} p50 {r['p50_us']:6.1f} max {max(r['durations_us']):6.0f} slow {slow}")
PY
