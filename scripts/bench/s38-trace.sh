#!/usr/bin/env bash
# Where the spinning 8 B x 256 batch's time goes over TCP, beside the single 8 B write:
# per-stage traces (MORIO_TRACE) of both rows, RUNS runs each, with their raw floors.
#   OUT=$OUT RUNS=2 bash scripts/bench/s38-trace.sh      (carry .dev/morio)
set -u
O=${OUT:-/tmp/s38}
M=${MORIO:-.dev/morio}
N=${RUNS:-2}
mkdir -p "$O/w/j" "$O/w/tr"
sp=(bench --loopback --no-ceiling --same-host off --shards 2 --spin-us 2000 --wait-spin-us 1000 --iters 3000 --op-type write --buffer-size 8)
for ((i = 1; i <= N; i++)); do
	for b in 1 256; do
		mkdir -p "$O/w/tr/s$b-$i"
		MORIO_TRACE=$O/w/tr/s$b-$i timeout 60 "$M" "${sp[@]}" --transfer-batch-size $b --enable-batch-transfer --enable-sess \
			--json "$O/w/j/s$b-$i.json" >/dev/null 2>&1 || echo "fail s$b-$i"
	done
done
python3 - "$O/w/j" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f))
    for r in d["rows"]:
        fl = (r.get("floor") or {}).get("p50_us", 0)
        print(f"{os.path.basename(f)[:-5]:8} avg {r['avg_lat_us']:6.1f} p50 {r['p50_us']:6.1f} p99 {r['p99_us']:6.1f} floor p50 {fl:5.1f}")
PY
for d in "$O"/w/tr/*; do python3 scripts/bench/trace-stages.py "$d" "$(basename "$d")" 2>&1 | head -30; done
(cd "$O" && tar czf s38-trace.tgz w && rm -rf w)
