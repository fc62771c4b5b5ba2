#!/usr/bin/env bash
# Does GPU staging over TCP gain when its bytes stay in the last-level cache? (issue 23's
# GPU / host >= 0.85x.) Rows of 1 MiB x 256 over TCP, host memory and GPU memory, with each
# data connection's socket buffers at 32 MiB (the default), 4 MiB and 1 MiB, and GPU rows with
# a smaller staging pool (16 MiB of 256 KiB slots), interleaved ROUNDS times; then per config
# the mean GB/s and the GPU / host ratio of its round. Needs the cuda build and a GPU.
#   OUT=$OUT ROUNDS=3 bash scripts/bench/s39-residency.sh
set -u
O=${OUT:-/tmp/s39}
R=${ROUNDS:-3}
M=${MORIO:-.dev/morio}
mkdir -p "$O/res/j"
T=(--loopback --no-ceiling --no-floor --same-host off --iters 48 --buffer-size 1048576
	--transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous)
for ((r = 1; r <= R; r++)); do
	for sb in 32MiB 4MiB 1MiB; do
		run() {
			local n=$1
			shift
			timeout 120 "$M" bench "${T[@]}" --sock-buf-bytes "$sb" "$@" --json "$O/res/j/$n.$sb.$r.json" >/dev/null 2>&1 || echo "fail $n $sb $r"
		}
		run hw --op-type write
		run hr --op-type read
		run gw --op-type write --mem-type gpu
		run gr --op-type read --mem-type gpu
		run gws --op-type write --mem-type gpu --gpu-staging-bytes 16MiB --gpu-slot-bytes 256KiB
	done
done
python3 - "$O/res/j" <<'PY'
import json, sys, glob, os, collections, statistics as st
agg = collections.defaultdict(dict)
for f in glob.glob(sys.argv[1] + "/*.json"):
    row, sb, r = os.path.basename(f)[:-5].split(".")
    agg[(row, sb)][int(r)] = json.load(open(f))["rows"][0]["avg_bw_gbps"]
print(f"{'row':4} {'sockbuf':7} {'GB/s per round':30} mean   GPU/host per round")
for (row, sb), v in sorted(agg.items(), key=lambda k: (k[0][0], -int(k[0][1][:-3]))):
    t = [v[k] for k in sorted(v)]
    host = agg.get(("h" + row[1], sb), {}) if row.startswith("g") else {}
    ratio = " ".join(f"{v[k] / host[k]:.2f}" for k in sorted(v) if host.get(k))
    print(f"{row:4} {sb:7} {' '.join(f'{x:.2f}' for x in t):30} {st.mean(t):6.2f} {ratio}")
PY
(cd "$O/res" && tar czf ../s39-residency-json.tgz j) && rm -rf "$O/res"
