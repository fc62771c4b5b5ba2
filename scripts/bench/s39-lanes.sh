#!/usr/bin/env bash
# Do two lanes per shard hide GPU staging's per-chunk waits? (A shard waits for a chunk's
# first D2H before its header leaves and for its last H2D before the answer; another lane on
# the same shard could send meanwhile.) 1 MiB x 256 write and read over TCP, host and GPU
# memory, 8 shards per side with 8 and with 16 lanes, interleaved ROUNDS times.
#   OUT=$OUT ROUNDS=3 bash scripts/bench/s39-lanes.sh
set -u
O=${OUT:-/tmp/s39}
R=${ROUNDS:-3}
M=${MORIO:-.dev/morio}
mkdir -p "$O/ln/j"
T=(--loopback --no-ceiling --no-floor --same-host off --shards 8 --iters 48 --buffer-size 1048576
	--transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous)
for ((r = 1; r <= R; r++)); do
	for l in 8 16; do
		run() {
			local n=$1
			shift
			timeout 120 "$M" bench "${T[@]}" --num-data-conns "$l" "$@" --json "$O/ln/j/$n.$l.$r.json" >/dev/null 2>&1 || echo "fail $n $l $r"
		}
		run hw --op-type write
		run gw --op-type write --mem-type gpu
		run hr --op-type read
		run gr --op-type read --mem-type gpu
	done
done
python3 - "$O/ln/j" <<'PY'
import json, sys, glob, os, collections, statistics as st
agg = collections.defaultdict(dict)
for f in glob.glob(sys.argv[1] + "/*.json"):
    row, l, r = os.path.basename(f)[:-5].split(".")
    agg[(row, int(l))][int(r)] = json.load(open(f))["rows"][0]["avg_bw_gbps"]
print(f"{'row':4} {'lanes':5} {'GB/s per round':24} mean   GPU/host per round")
for (row, l), v in sorted(agg.items()):
    t = [v[k] for k in sorted(v)]
    host = agg.get(("h" + row[1], l), {}) if row.startswith("g") else {}
    ratio = " ".join(f"{v[k] / host[k]:.2f}" for k in sorted(v) if host.get(k))
    print(f"{row:4} {l:5} {' '.join(f'{x:.2f}' for x in t):24} {st.mean(t):6.2f} {ratio}")
PY
(cd "$O/ln" && tar czf ../s39-lanes-json.tgz j) && rm -rf "$O/ln"
