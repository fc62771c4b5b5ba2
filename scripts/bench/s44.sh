#!/usr/bin/env bash
# Session 44's device calls (docs/perf/s44-runs.md).
#   PART=stall  shards that go silent in the middle of a large GPU transfer: traced GPU -> GPU
#               single 64 MiB writes and 1 MiB x 256 writes (lane-stalls.py: lanes taken up
#               late, silences over 1 ms), then long untraced runs (GPU and host memory) with
#               every thread's CPU time and run-queue wait sampled from /proc (threads.py),
#               and, where perf works, `perf sched` over one second of a GPU run
#   PART=first  the first transfers of a fresh engine pair, GPU -> GPU 2 MiB and 64 MiB writes
#               (no warm-up): .dev/morio-nf (pools pinned as transfers need them) against
#               .dev/morio (pinned when GPU memory is registered), ROUNDS alternating rounds
#   PART=ab     VARIANTS (s40-landing.sh's format) interleaved ROUNDS times over ROWS
#   OUT=$OUT PART=stall bash scripts/bench/s44.sh        (carry .dev: morio, morio-nf)
set -u
O=${OUT:-/tmp/s44}
P=${PART:-stall}
M=${MORIO:-.dev/morio}
mkdir -p "$O"
nvidia-smi --query-gpu=name --format=csv,noheader
T=(--loopback --no-ceiling --no-floor --same-host off ${EXTRA:-})
B=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous)
S=(--buffer-size 67108864 --transfer-batch-size 1)
traced() { # NAME ARGS...
	local n=$1
	shift
	rm -rf "$O/tr/$n" && mkdir -p "$O/tr/$n"
	MORIO_TRACE=$O/tr/$n timeout 90 "$M" bench "${T[@]}" "$@" --json "$O/tr/$n/bench.json" >/dev/null 2>&1 || echo "fail $n"
	python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(f\"$n: {r['avg_bw_gbps']:.2f} GB/s, p50 {r['p50_us']:.0f} us, max {r['max_lat_us']:.0f} us\")" "$O/tr/$n/bench.json" 2>/dev/null
	python3 scripts/bench/lane-stalls.py "$O/tr/$n" "$n" | cut -c1-600
}
sampled() { # NAME SECONDS_TO_FIRST SECONDS_BETWEEN ARGS...
	local n=$1 a=$2 w=$3
	shift 3
	timeout 90 "$M" bench "${T[@]}" "$@" --json "$O/$n.json" >/dev/null 2>&1 &
	local pid=$!
	sleep "$a"
	python3 scripts/bench/threads.py snap "morio bench" "$O/$n-a.snap"
	sleep "$w"
	python3 scripts/bench/threads.py snap "morio bench" "$O/$n-b.snap"
	wait $pid || echo "fail $n"
	python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(f\"$n: {r['avg_bw_gbps']:.2f} GB/s, p50 {r['p50_us']:.0f} us, max {r['max_lat_us']:.0f} us\")" "$O/$n.json" 2>/dev/null
	python3 scripts/bench/threads.py diff "$O/$n-a.snap" "$O/$n-b.snap" >"$O/$n-threads.txt"
	grep -v "^  .* 0\.0  *0\.00 " "$O/$n-threads.txt" | head -60
}
case $P in
stall)
	echo "perf: $(command -v perf || echo none); paranoid $(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null); THP $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
	traced g64w --mem-type gpu --op-type write "${S[@]}" --iters 64
	traced g64w8 --mem-type gpu --op-type write "${S[@]}" --iters 64 --gpu-data-conns 8
	traced h64w --op-type write "${S[@]}" --iters 64
	traced gw --mem-type gpu --op-type write "${B[@]}" --iters 16
	(cd "$O" && tar czf s44-trace.tgz tr && rm -rf tr)
	sampled g64w-long 2 2 --mem-type gpu --op-type write "${S[@]}" --iters 1500
	sampled h64w-long 2 2 --op-type write "${S[@]}" --iters 2500
	if command -v perf >/dev/null; then
		timeout 90 "$M" bench "${T[@]}" --mem-type gpu --op-type write "${S[@]}" --iters 1500 >/dev/null 2>&1 &
		pid=$!
		sleep 2
		timeout 20 perf sched record -a -o "$O/sched.data" -- sleep 1 >/dev/null 2>&1 || echo "perf sched record failed"
		wait $pid
		if [ -s "$O/sched.data" ]; then
			timeout 60 perf sched latency -i "$O/sched.data" --sort max 2>/dev/null | head -45
			timeout 120 perf sched timehist -i "$O/sched.data" 2>/dev/null | gzip >"$O/timehist.txt.gz"
			rm -f "$O/sched.data"
		fi
	fi ;;
first)
	for ((r = 1; r <= ${ROUNDS:-5}; r++)); do
		for b in nf new; do
			bin=.dev/morio
			[[ $b == nf ]] && bin=.dev/morio-nf
			for sz in 2097152 67108864; do
				j=$O/first-$b-$sz-$r.json
				timeout 60 "$bin" bench "${T[@]}" --mem-type gpu --op-type write --buffer-size $sz \
					--transfer-batch-size 1 --iters 4 --warmup 0 --json "$j" >/dev/null 2>&1 || echo "fail $b $sz $r"
			done
		done
	done
	python3 - "$O" <<'PY'
import glob, json, statistics, sys
rows = {}
for f in glob.glob(sys.argv[1] + "/first-*.json"):
    _, b, sz, _ = f.rsplit("/", 1)[1][:-5].split("-")
    d = json.load(open(f))["rows"][0]["durations_us"]
    rows.setdefault((b, int(sz)), []).append(d)
print("build size  first transfer us per round (median)  | later ones median")
for (b, sz), ds in sorted(rows.items()):
    first = [d[0] for d in ds]
    later = [x for d in ds for x in d[1:]]
    print(f"{b:5} {sz >> 20:3} MiB " + " ".join(f"{x:8.0f}" for x in first)
          + f"  ({statistics.median(first):.0f}) | {statistics.median(later):.0f}")
PY
	;;
ab)
	OUT=$O ROUNDS=${ROUNDS:-3} VARIANTS="$VARIANTS" ROWS="${ROWS:-hw gw gr g64w g64r cgw gcw g4w}" \
		timeout "${ABLIMIT:-420}" bash scripts/bench/s40-landing.sh >"$O/ab.txt" 2>&1
	tail -30 "$O/ab.txt" ;;
*) echo "PART must be stall, first or ab" >&2; exit 2 ;;
esac
