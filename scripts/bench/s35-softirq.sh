#!/usr/bin/env bash
# Do default-settings small rows (and the raw TCP floor) run slow (~110 us an iteration)
# when the kernel defers loopback packet processing to ksoftirqd? RUNS times: the default
# 8 B x 64 batch write over TCP with its raw floor, each run beside the CPU time the
# ksoftirqd threads took during it (clock ticks, per CPU where non-zero) and how many of its
# iterations took over 40 us.   OUT=$OUT RUNS=8 bash scripts/bench/s35-softirq.sh
set -u
O=${OUT:-/tmp/s35-softirq}
M=${MORIO:-.dev/morio}
N=${RUNS:-8}
mkdir -p "$O/sq"
ksoft() { # "cpu:ticks" for every ksoftirqd thread
	for p in /proc/[0-9]*; do
		c=$(cat "$p/comm" 2>/dev/null) || continue
		case $c in ksoftirqd/*) awk -v c="${c#ksoftirqd/}" '{print c ":" $14 + $15}' "$p/stat" ;; esac
	done
}
for ((i = 1; i <= N; i++)); do
	ksoft >"$O/sq/k0"
	timeout 120 "$M" bench --loopback --no-ceiling --same-host off --iters 1000 --op-type write \
		--buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess \
		--json "$O/sq/r$i.json" >/dev/null 2>&1 || echo "fail $i"
	ksoft >"$O/sq/k1"
	python3 - "$O/sq/r$i.json" "$O/sq/k0" "$O/sq/k1" "$i" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["rows"][0]
du = r["durations_us"]
slow = sum(1 for x in du if x > 40)
k0 = dict(l.split(":") for l in open(sys.argv[2]).read().split())
k1 = dict(l.split(":") for l in open(sys.argv[3]).read().split())
d = {c: int(k1[c]) - int(k0.get(c, 0)) for c in k1}
busy = " ".join(f"{c}:{v}" for c, v in sorted(d.items(), key=lambda x: -x[1]) if v > 0)
fl = r.get("floor") or {}
print(f"run {sys.argv[4]}: p50 {r['p50_us']:.1f} p99 {r['p99_us']:.1f} slow {slow}/{len(du)} "
      f"floor p50 {fl.get('p50_us', 0):.1f}  ksoftirqd ticks {sum(d.values())} [{busy}]")
PY
done
