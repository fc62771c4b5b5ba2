#!/usr/bin/env bash
# A strided chunk kept as one run on the target (session 38) against the build before
# (.dev/morio-base, a90123c's code), interleaved ROUNDS times: the spinning 8 B x 256 batch
# write and read over TCP (issue 23's <= 15 us), the spinning single 8 B, the default 8 B x 256
# and 4 KiB x 256, and 1 MiB x 256 (no loss); then per row the mean of the per-round paired
# differences (new - base). ROWS picks rows (default all; r1m, the 1 MiB x 256 read, only
# when named), BASE another base binary in .dev.
#   OUT=$OUT ROUNDS=6 [ROWS="w1m r1m"] [BASE=morio-prev] bash scripts/bench/s38-runs.sh
set -u
O=${OUT:-/tmp/s38r}
R=${ROUNDS:-6}
mkdir -p "$O/s/j"
T=(--loopback --no-ceiling --same-host off)
S=(--shards 2 --spin-us 2000 --wait-spin-us 1000)
B=(--enable-batch-transfer --enable-sess)
for ((r = 1; r <= R; r++)); do
	for m in "${BASE:-morio-base}" morio; do
		run() {
			local n=$1
			shift
			[[ " ${ROWS:-s256w s256r s8 d256 d4k w1m} " == *" $n "* ]] || return 0
			timeout 90 ".dev/$m" bench "${T[@]}" "$@" --json "$O/s/j/$n.$m.$r.json" >/dev/null 2>&1 || echo "fail $n $m $r"
		}
		run s256w "${S[@]}" --iters 3000 --op-type write --buffer-size 8 --transfer-batch-size 256 "${B[@]}"
		run s256r "${S[@]}" --no-floor --iters 3000 --op-type read --buffer-size 8 --transfer-batch-size 256 "${B[@]}"
		run s8 "${S[@]}" --no-floor --iters 3000 --op-type write --buffer-size 8 --transfer-batch-size 1
		run d256 --no-floor --iters 1000 --op-type write --buffer-size 8 --transfer-batch-size 256 "${B[@]}"
		run d4k --no-floor --iters 1000 --op-type write --buffer-size 4096 --transfer-batch-size 256 "${B[@]}"
		run w1m --no-floor --iters 48 --op-type write --buffer-size 1048576 --transfer-batch-size 256 "${B[@]}" --batch-contiguous
		run r1m --no-floor --iters 48 --op-type read --buffer-size 1048576 --transfer-batch-size 256 "${B[@]}" --batch-contiguous
	done
done
python3 - "$O/s/j" "${BASE:-morio-base}" <<'PY'
import json, sys, glob, os, collections, statistics as st
BASE = sys.argv[2]
agg = collections.defaultdict(dict)
for f in glob.glob(sys.argv[1] + "/*.json"):
    row, m, r = os.path.basename(f)[:-5].split(".")
    x = json.load(open(f))["rows"][0]
    fl = (x.get("floor") or {}).get("p50_us", 0)
    agg[(row, m)][int(r)] = (x["avg_lat_us"], x["p50_us"], x["p99_us"], x["avg_bw_gbps"], fl)
print(f"{'row':6} {'build':11} {'avg us per round':54} mean  p50mean  GB/s   floor p50")
for (row, m), v in sorted(agg.items()):
    t = [v[k] for k in sorted(v)]
    print(f"{row:6} {m:11} {' '.join(f'{x[0]:.1f}' for x in t):54} {st.mean(x[0] for x in t):5.1f} {st.mean(x[1] for x in t):7.1f} {st.mean(x[3] for x in t):6.2f} {' '.join(f'{x[4]:.1f}' for x in t if x[4])}")
print("paired (new - base), per round: avg us, p50 us, GB/s")
for row in sorted({k[0] for k in agg}):
    a, b = agg.get((row, BASE), {}), agg.get((row, "morio"), {})
    rs = sorted(set(a) & set(b))
    if not rs: continue
    d = [(b[r][0] - a[r][0], b[r][1] - a[r][1], b[r][3] - a[r][3]) for r in rs]
    print(f"{row:6} avg {st.mean(x[0] for x in d):+6.2f}  p50 {st.mean(x[1] for x in d):+6.2f}  GB/s {st.mean(x[2] for x in d):+6.2f}  (p50 better in {sum(x[1] < 0 for x in d)}/{len(d)} rounds)")
PY
(cd "$O/s" && tar czf ../s38-runs-json.tgz j) && rm -rf "$O/s"
