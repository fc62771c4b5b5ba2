#!/usr/bin/env bash
# GPU staging over TCP against host memory by shard count (issue 23's GPU / host >= 0.85x):
# if the ratio is as low with one shard per side as with eight, the staging pipeline, not
# the host's memory bandwidth, sets it. Rows of 1 MiB x 256 over TCP, write and read, host
# and GPU memory, 1 / 2 / 4 / 8 shards per side, interleaved ROUNDS times.
#   OUT=$OUT ROUNDS=2 [SHARDS="1 2 4 8"] [EXTRA="..."] bash scripts/bench/s39-scale.sh
set -u
O=${OUT:-/tmp/s39}
R=${ROUNDS:-2}
M=${MORIO:-.dev/morio}
mkdir -p "$O/sc/j"
read -ra X <<<"${EXTRA:-}"
T=(--loopback --no-ceiling --no-floor --same-host off --buffer-size 1048576
	--transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous)
for ((r = 1; r <= R; r++)); do
	for s in ${SHARDS:-1 2 4 8}; do
		run() {
			local n=$1
			shift
			timeout 120 "$M" bench "${T[@]}" --iters $((8 * s)) --shards "$s" "$@" "${X[@]}" --json "$O/sc/j/$n.$s.$r.json" >/dev/null 2>&1 || echo "fail $n $s $r"
		}
		run hw --op-type write
		run gw --op-type write --mem-type gpu
		run hr --op-type read
		run gr --op-type read --mem-type gpu
	done
done
python3 - "$O/sc/j" <<'PY'
import json, sys, glob, os, collections, statistics as st
agg = collections.defaultdict(dict)
for f in glob.glob(sys.argv[1] + "/*.json"):
    row, s, r = os.path.basename(f)[:-5].split(".")
    agg[(row, int(s))][int(r)] = json.load(open(f))["rows"][0]["avg_bw_gbps"]
print(f"{'row':4} {'shards':6} {'GB/s per round':24} mean   GPU/host per round")
for (row, s), v in sorted(agg.items()):
    t = [v[k] for k in sorted(v)]
    host = agg.get(("h" + row[1], s), {}) if row.startswith("g") else {}
    ratio = " ".join(f"{v[k] / host[k]:.2f}" for k in sorted(v) if host.get(k))
    print(f"{row:4} {s:6} {' '.join(f'{x:.2f}' for x in t):24} {st.mean(t):6.2f} {ratio}")
PY
(cd "$O/sc" && tar czf ../s39-scale-json.tgz j) && rm -rf "$O/sc"
