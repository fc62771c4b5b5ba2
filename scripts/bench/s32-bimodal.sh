#!/usr/bin/env bash
# The default 4 KiB x 256 row is bimodal between runs on the 16-core GPU hosts (rounds of
# ~0.2 ms and of ~1 ms avg, every build and placement measured in session 31). This runs it
# RUNS times with default settings, each traced (MORIO_TRACE) and with /proc/stat's per-CPU
# counters around it, and prints per run: avg / p50 / p99, the CPUs busiest in it (user+sys
# share), and the trace's per-stage medians; compare a slow run's lines with a fast one's.
# Needs .dev/morio (carry .dev).   RUNS=8
set -u
O=${OUT:-/tmp/s32-bimodal}
N=${RUNS:-8}
mkdir -p "$O"
for ((i = 1; i <= N; i++)); do
	d="$O/run$i"
	mkdir -p "$d/trace"
	grep '^cpu[0-9]' /proc/stat >"$d/stat0"
	MORIO_TRACE="$d/trace" timeout 120 .dev/morio bench --loopback --no-ceiling --no-floor \
		--op-type write --iters 512 --buffer-size 4096 --transfer-batch-size 256 \
		--enable-batch-transfer --enable-sess --json "$d/row.json" >/dev/null 2>&1 || echo "fail run$i"
	grep '^cpu[0-9]' /proc/stat >"$d/stat1"
done
python3 - "$O" "$N" <<'PY'
import json, sys
o, n = sys.argv[1], int(sys.argv[2])
def stat(f):
    d = {}
    for line in open(f):
        p = line.split()
        d[p[0]] = [int(x) for x in p[1:]]
    return d
for i in range(1, n + 1):
    d = f"{o}/run{i}"
    try:
        r = json.load(open(f"{d}/row.json"))
        r = r["rows"][0] if "rows" in r else r
    except (OSError, ValueError, KeyError):
        print(f"run{i}: no result")
        continue
    a, b = stat(f"{d}/stat0"), stat(f"{d}/stat1")
    busy = []
    for cpu in a:
        delta = [y - x for x, y in zip(a[cpu], b[cpu])]
        total = sum(delta) or 1
        busy.append((100 * (delta[0] + delta[2]) / total, cpu))
    busy.sort(reverse=True)
    top = " ".join(f"{c[3:]}:{u:.0f}%" for u, c in busy[:6])
    print(f"run{i}: avg {r['avg_lat_us']:.1f} p50 {r['p50_us']:.1f} p99 {r['p99_us']:.1f} us | busiest {top}")
PY
for ((i = 1; i <= N; i++)); do
	echo "== run$i"
	python3 scripts/bench/trace-stages.py "$O/run$i/trace" 2>&1 | head -24
done
(cd "$O" && tar czf s32-bimodal.tar.gz run* && rm -rf run*)
