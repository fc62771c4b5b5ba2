#!/usr/bin/env bash
# Where the same-host spinning single 8 B write's ~4.5 us goes (issue 22's <= 5 us p50):
# per-stage traces (MORIO_TRACE) through the shared-memory rings, RUNS runs, beside the same
# row over TCP.   OUT=$OUT RUNS=2 bash scripts/bench/s38-hosttrace.sh      (carry .dev/morio)
set -u
O=${OUT:-/tmp/s38h}
M=${MORIO:-.dev/morio}
N=${RUNS:-2}
mkdir -p "$O/w/j" "$O/w/tr"
sp=(bench --loopback --no-ceiling --no-floor --shards 2 --spin-us 2000 --wait-spin-us 1000 --iters 3000 --op-type write --buffer-size 8 --transfer-batch-size 1)
for ((i = 1; i <= N; i++)); do
	for t in require off; do
		mkdir -p "$O/w/tr/$t-$i"
		MORIO_TRACE=$O/w/tr/$t-$i timeout 60 "$M" "${sp[@]}" --same-host $t --json "$O/w/j/$t-$i.json" >/dev/null 2>&1 || echo "fail $t-$i"
	done
done
python3 - "$O/w/j" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    r = json.load(open(f))["rows"][0]
    print(f"{os.path.basename(f)[:-5]:10} avg {r['avg_lat_us']:6.1f} p50 {r['p50_us']:6.1f} p99 {r['p99_us']:6.1f} {r['transport']}")
PY
for d in "$O"/w/tr/*; do python3 scripts/bench/trace-stages.py "$d" "$(basename "$d")" 2>&1 | grep -v "slow:" | head -30; done
(cd "$O" && tar czf s38-hosttrace.tgz w && rm -rf w)
