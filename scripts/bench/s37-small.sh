#!/usr/bin/env bash
# Small pieces copied with fixed-size moves (session 37's small_copy) against the build
# before (.dev/morio-offer, 599a20c's code), interleaved ROUNDS times: the spinning 8 B x 256
# batch write and read over TCP (issue 23's <= 15 us), the spinning single 8 B, the default
# 8 B x 256 and 1 MiB x 256 (no loss).   OUT=$OUT ROUNDS=6 bash scripts/bench/s37-small.sh
set -u
O=${OUT:-/tmp/s37s}
R=${ROUNDS:-6}
mkdir -p "$O/s/j"
T=(--loopback --no-ceiling --same-host off)
S=(--shards 2 --spin-us 2000 --wait-spin-us 1000)
B=(--enable-batch-transfer --enable-sess)
for ((r = 1; r <= R; r++)); do
	for m in morio-offer morio; do
		run() { local n=$1; shift; timeout 90 ".dev/$m" bench "${T[@]}" "$@" --json "$O/s/j/$n.$m.$r.json" >/dev/null 2>&1 || echo "fail $n $m $r"; }
		run s256w "${S[@]}" --iters 3000 --op-type write --buffer-size 8 --transfer-batch-size 256 "${B[@]}"
		run s256r "${S[@]}" --no-floor --iters 3000 --op-type read --buffer-size 8 --transfer-batch-size 256 "${B[@]}"
		run s8 "${S[@]}" --no-floor --iters 3000 --op-type write --buffer-size 8 --transfer-batch-size 1
		run d256 --no-floor --iters 1000 --op-type write --buffer-size 8 --transfer-batch-size 256 "${B[@]}"
		run w1m --no-floor --iters 48 --op-type write --buffer-size 1048576 --transfer-batch-size 256 "${B[@]}" --batch-contiguous
	done
done
python3 - "$O/s/j" <<'PY'
import json, sys, glob, os, collections, statistics as st
agg = collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + "/*.json"):
    row, m, r = os.path.basename(f)[:-5].split(".")
    x = json.load(open(f))["rows"][0]
    fl = (x.get("floor") or {}).get("p50_us", 0)
    agg[(row, m)].append((int(r), x["avg_lat_us"], x["p50_us"], x["p99_us"], x["avg_bw_gbps"], fl))
print(f"{'row':6} {'build':12} {'avg us per round':60} mean   p50 mean  GB/s mean  floor p50")
for (row, m), v in sorted(agg.items()):
    v.sort()
    print(f"{row:6} {m:12} {' '.join(f'{t[1]:.1f}' for t in v):60} {st.mean(t[1] for t in v):6.1f} {st.mean(t[2] for t in v):8.1f} {st.mean(t[4] for t in v):9.2f} {' '.join(f'{t[5]:.1f}' for t in v if t[5])}")
PY
(cd "$O/s" && tar czf ../s37-small-json.tgz j) && rm -rf "$O/s"
