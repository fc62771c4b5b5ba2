#!/usr/bin/env bash
# Busy pollers that offer their CPU while quiet (session 37) against the build before
# (.dev/morio-s36, 45a4640), interleaved ROUNDS times: default-settings small rows over TCP
# (the slow starts: an application thread on a busy shard's CPU waited ~100 us per
# iteration), the spinning single 8 B (configured spin: unchanged), 4 KiB x 256 and
# 1 MiB x 256 (no throughput row may lose), same-host default single 8 B; then goals.sh on
# the new build.   OUT=$OUT ROUNDS=4 bash scripts/bench/s37-offer.sh   (carry .dev/morio, .dev/morio-s36)
set -u
O=${OUT:-/tmp/s37o}
R=${ROUNDS:-4}
mkdir -p "$O/o/j"
T=(--loopback --no-ceiling --same-host off)
row() { # NAME BIN ARGS...
	local n=$1 m=$2
	shift 2
	timeout 90 ".dev/$m" bench "$@" --json "$O/o/j/$n.json" >/dev/null 2>&1 || echo "fail $n"
}
for ((r = 1; r <= R; r++)); do
	for m in morio-s36 morio; do
		row "d8.$m.$r" $m "${T[@]}" --iters 1000 --op-type write --buffer-size 8 --transfer-batch-size 1
		row "d64.$m.$r" $m "${T[@]}" --no-floor --iters 1000 --op-type write --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
		row "d256.$m.$r" $m "${T[@]}" --no-floor --iters 1000 --op-type write --buffer-size 8 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		row "d4k.$m.$r" $m "${T[@]}" --iters 1000 --op-type write --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		row "s8.$m.$r" $m "${T[@]}" --no-floor --shards 2 --spin-us 2000 --wait-spin-us 1000 --iters 3000 --op-type write --buffer-size 8 --transfer-batch-size 1
		row "w1m.$m.$r" $m "${T[@]}" --no-floor --iters 48 --op-type write --buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous
		row "hd8.$m.$r" $m --loopback --no-ceiling --no-floor --same-host require --iters 1000 --op-type write --buffer-size 8 --transfer-batch-size 1
		row "hw1m.$m.$r" $m --loopback --no-ceiling --no-floor --same-host require --iters 48 --op-type write --buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous
	done
	# The new build with mimalloc's THP off (prctl PR_SET_THP_DISABLE, process-wide): do the
	# spinning rows lose their stall at the 2,854th transfer, and what do throughput rows pay?
	E=(env MIMALLOC_ALLOW_THP=0)
	rowe() { local n=$1; shift; timeout 90 "${E[@]}" .dev/morio bench "$@" --json "$O/o/j/$n.json" >/dev/null 2>&1 || echo "fail $n"; }
	rowe "s8.thp0.$r" "${T[@]}" --no-floor --shards 2 --spin-us 2000 --wait-spin-us 1000 --iters 3000 --op-type write --buffer-size 8 --transfer-batch-size 1
	rowe "w1m.thp0.$r" "${T[@]}" --no-floor --iters 48 --op-type write --buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous
	rowe "hw1m.thp0.$r" --loopback --no-ceiling --no-floor --same-host require --iters 48 --op-type write --buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous
done
python3 - "$O/o/j" <<'PY'
import json, sys, glob, os, collections, statistics as st
agg = collections.defaultdict(list)
late = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    name = os.path.basename(f)[:-5]
    row, m, r = name.split(".")
    d = json.load(open(f)); x = d["rows"][0]; du = x["durations_us"]; p50 = x["p50_us"]
    slow = sum(1 for v in du if v > 4 * p50)
    ic, tc = x.get("initiator_counters") or {}, x.get("target_counters") or {}
    cnt = lambda k: ic.get(k, 0) + tc.get(k, 0)
    if row == "s8":
        w = d.get("warmup_iters", 0)
        late[(row, m)].append([(i + w, round(v)) for i, v in enumerate(du) if v > 8 * p50][:4])
    agg[(row, m)].append((x["avg_lat_us"], p50, x["p99_us"], x["avg_bw_gbps"], slow, cnt("busy_poll_backoffs"), cnt("busy_poll_handoffs")))
print(f"{'row':6} {'build':10} {'avg us (rounds)':34} {'p50':18} {'p99':26} {'GB/s':22} slow>4xp50 backoffs handoffs")
for (row, m), v in sorted(agg.items()):
    f = lambda i, p=1: " ".join(f"{t[i]:.{p}f}" for t in v)
    print(f"{row:6} {m:10} {f(0):34} {f(1):18} {f(2):26} {f(3,2):22} {f(4,0)} | {f(5,0)} | {f(6,0)}")
for k, v in sorted(late.items()):
    print("slow s8 iterations (transfer#, us) per round:", k[1], v)
PY
(cd "$O/o" && tar czf ../s37-offer-json.tgz j) && rm -rf "$O/o"
[ "${GOALS:-1}" = 1 ] || exit 0
echo "=== goals, new build"
OUT=$O/goals ROUNDS=${GOAL_ROUNDS:-2} GPU=1 bash scripts/bench/goals.sh 2>&1 | tail -22
