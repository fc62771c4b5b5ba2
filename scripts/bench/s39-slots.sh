#!/usr/bin/env bash
# GPU staging over TCP against host memory with larger chunks and slots (issue 23's GPU / host
# >= 0.85x): fewer driver calls per byte. Per config, 1 MiB x 256 write and read over TCP in
# host and GPU memory (the host rows take the same chunk size), interleaved ROUNDS times; then
# per config the mean GB/s and the GPU / host ratio of each round (against the host rows of
# the same config, else of c1m, the defaults). CONFIGS picks configs, HOST those that also
# run host rows (default: all), G the GPU rows (default "gw gr"; g64w g64r: a single 64 MiB).
#   OUT=$OUT ROUNDS=3 [CONFIGS="c1m c2m"] [HOST=c1m] bash scripts/bench/s39-slots.sh
set -u
O=${OUT:-/tmp/s39}
R=${ROUNDS:-3}
M=${MORIO:-.dev/morio}
mkdir -p "$O/sl/j"
T=(--loopback --no-ceiling --no-floor --same-host off)
B=(--iters 48 --buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous)
S=(--iters 16 --buffer-size 67108864 --transfer-batch-size 1)
declare -A C=(
	[c1m]="--chunk-bytes 1MiB --gpu-slot-bytes 1MiB --gpu-staging-bytes 64MiB"
	[c2m]="--chunk-bytes 2MiB --gpu-slot-bytes 2MiB --gpu-staging-bytes 128MiB"
	[c4m]="--chunk-bytes 4MiB --gpu-slot-bytes 4MiB --gpu-staging-bytes 256MiB"
	[c1m-p128]="--chunk-bytes 1MiB --gpu-slot-bytes 1MiB --gpu-staging-bytes 128MiB"
	[c2m-s1m]="--chunk-bytes 2MiB --gpu-slot-bytes 1MiB --gpu-staging-bytes 64MiB"
	[c2m-p64]="--chunk-bytes 2MiB --gpu-slot-bytes 2MiB --gpu-staging-bytes 64MiB"
	[c4m-s1m]="--chunk-bytes 4MiB --gpu-slot-bytes 1MiB --gpu-staging-bytes 64MiB"
	[c4m-s2m]="--chunk-bytes 4MiB --gpu-slot-bytes 2MiB --gpu-staging-bytes 128MiB"
	[c8m-s2m]="--chunk-bytes 8MiB --gpu-slot-bytes 2MiB --gpu-staging-bytes 128MiB"
)
for ((r = 1; r <= R; r++)); do
	for c in ${CONFIGS:-c1m c2m c4m}; do
		read -ra X <<<"${C[$c]}"
		run() {
			local n=$1
			shift
			timeout 120 "$M" bench "${T[@]}" "${X[@]}" "$@" --json "$O/sl/j/$n.$c.$r.json" >/dev/null 2>&1 || echo "fail $n $c $r"
		}
		if [[ " ${HOST:-${CONFIGS:-c1m c2m c4m}} " == *" $c "* ]]; then
			[[ " ${G:-gw gr} " == *" gw "* ]] && run hw --op-type write "${B[@]}"
			[[ " ${G:-gw gr} " == *" gr "* ]] && run hr --op-type read "${B[@]}"
			[[ " ${G:-gw gr} " == *" g64w "* ]] && run h64w --op-type write "${S[@]}"
			[[ " ${G:-gw gr} " == *" g64r "* ]] && run h64r --op-type read "${S[@]}"
		fi
		[[ " ${G:-gw gr} " == *" gw "* ]] && run gw --op-type write --mem-type gpu "${B[@]}"
		[[ " ${G:-gw gr} " == *" gr "* ]] && run gr --op-type read --mem-type gpu "${B[@]}"
		[[ " ${G:-gw gr} " == *" g64w "* ]] && run g64w --op-type write --mem-type gpu "${S[@]}"
		[[ " ${G:-gw gr} " == *" g64r "* ]] && run g64r --op-type read --mem-type gpu "${S[@]}"
	done
done
python3 - "$O/sl/j" <<'PY'
import json, sys, glob, os, collections, statistics as st
agg = collections.defaultdict(dict)
for f in glob.glob(sys.argv[1] + "/*.json"):
    row, c, r = os.path.basename(f)[:-5].split(".")
    agg[(row, c)][int(r)] = json.load(open(f))["rows"][0]["avg_bw_gbps"]
print(f"{'row':5} {'config':9} {'GB/s per round':24} mean   GPU/host per round")
for (row, c), v in sorted(agg.items()):
    t = [v[k] for k in sorted(v)]
    h = "h" + row[1:]
    host = (agg.get((h, c)) or agg.get((h, "c1m"), {})) if row.startswith("g") else {}
    ratio = " ".join(f"{v[k] / host[k]:.2f}" for k in sorted(v) if host.get(k))
    print(f"{row:5} {c:9} {' '.join(f'{x:.2f}' for x in t):24} {st.mean(t):6.2f} {ratio}")
PY
(cd "$O/sl" && tar czf ../s39-slots-json.tgz j) && rm -rf "$O/sl"
