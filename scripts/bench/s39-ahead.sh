#!/usr/bin/env bash
# The next GPU chunk's first slot copied while its lane sends the one before (.dev/morio built
# with docs/perf/experiments/gpu-prestage.patch applied) against the build without it
# (.dev/morio-base, 2bc802c), interleaved ROUNDS times: GPU ->
# GPU 1 MiB x 256 and single 64 MiB, write and read, GPU -> host 1 MiB x 256 write, over TCP,
# and host memory beside them; then per row the means and the per-round paired differences.
#   OUT=$OUT ROUNDS=4 bash scripts/bench/s39-ahead.sh
set -u
O=${OUT:-/tmp/s39}
R=${ROUNDS:-4}
mkdir -p "$O/ah/j"
T=(--loopback --no-ceiling --no-floor --same-host off)
B=(--iters 48 --buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous)
S=(--iters 16 --buffer-size 67108864 --transfer-batch-size 1)
for ((r = 1; r <= R; r++)); do
	for m in morio-base morio; do
		run() {
			local n=$1
			shift
			timeout 120 ".dev/$m" bench "${T[@]}" "$@" --json "$O/ah/j/$n.$m.$r.json" >/dev/null 2>&1 || echo "fail $n $m $r"
		}
		run gw --op-type write --mem-type gpu "${B[@]}"
		run gr --op-type read --mem-type gpu "${B[@]}"
		run g64w --op-type write --mem-type gpu "${S[@]}"
		run g64r --op-type read --mem-type gpu "${S[@]}"
		run gcw --op-type write --initiator-mem-type gpu --target-mem-type cpu "${B[@]}"
		run hw --op-type write "${B[@]}"
	done
done
python3 - "$O/ah/j" <<'PY'
import json, sys, glob, os, collections, statistics as st
agg = collections.defaultdict(dict)
for f in glob.glob(sys.argv[1] + "/*.json"):
    row, m, r = os.path.basename(f)[:-5].split(".")
    agg[(row, m)][int(r)] = json.load(open(f))["rows"][0]["avg_bw_gbps"]
print(f"{'row':5} {'base GB/s per round':28} {'new GB/s per round':28} base   new    paired")
for row in sorted({k[0] for k in agg}):
    a, b = agg.get((row, "morio-base"), {}), agg.get((row, "morio"), {})
    rs = sorted(set(a) & set(b))
    if not rs: continue
    d = [b[r] - a[r] for r in rs]
    print(f"{row:5} {' '.join(f'{a[r]:.2f}' for r in rs):28} {' '.join(f'{b[r]:.2f}' for r in rs):28} "
          f"{st.mean(a[r] for r in rs):6.2f} {st.mean(b[r] for r in rs):6.2f} {st.mean(d):+.2f} ({sum(x > 0 for x in d)}/{len(d)} up)")
PY
(cd "$O/ah" && tar czf ../s39-ahead-json.tgz j) && rm -rf "$O/ah"
