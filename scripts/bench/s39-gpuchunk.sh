#!/usr/bin/env bash
# gpu_chunk_bytes (2 MiB by default since session 39) against the 1 MiB chunks GPU transfers
# over TCP took before, one binary, interleaved ROUNDS times: 1 MiB x 256 and a single 64 MiB,
# write and read, GPU -> GPU, and 1 MiB x 256 writes CPU -> GPU and GPU -> CPU; the host rows
# beside them for the ratio (issue 23's >= 0.85x). Configs: c1m (1 MiB chunks), c2m (2 MiB
# chunks, 1 MiB slots), s2m (2 MiB both), old (1 MiB both: the defaults before), new (the
# binary's defaults). SMALL=1 adds GPU -> GPU batch writes of 4 KiB x 256 and 8 B x 256 (avg
# us, not GB/s). Then per row and config the mean and each round's ratio to the host row.
#   OUT=$OUT ROUNDS=3 [CONFIGS="c1m c2m s2m"] [SMALL=1] bash scripts/bench/s39-gpuchunk.sh
set -u
O=${OUT:-/tmp/s39}
R=${ROUNDS:-3}
M=${MORIO:-.dev/morio}
mkdir -p "$O/gc/j"
T=(--loopback --no-ceiling --no-floor --same-host off)
B=(--iters 48 --buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous)
S=(--iters 16 --buffer-size 67108864 --transfer-batch-size 1)
declare -A C=([c1m]="--gpu-chunk-bytes 1MiB" [c2m]="--gpu-chunk-bytes 2MiB --gpu-slot-bytes 1MiB"
	[s2m]="--gpu-chunk-bytes 2MiB --gpu-slot-bytes 2MiB" [old]="--gpu-chunk-bytes 1MiB --gpu-slot-bytes 1MiB" [new]="")
for ((r = 1; r <= R; r++)); do
	run() {
		local n=$1 c=$2
		shift 2
		read -ra X <<<"${C[$c]:-}"
		timeout 120 "$M" bench "${T[@]}" "${X[@]}" "$@" --json "$O/gc/j/$n.$c.$r.json" >/dev/null 2>&1 || echo "fail $n $c $r"
	}
	run hw host --op-type write "${B[@]}"
	run hr host --op-type read "${B[@]}"
	run h64w host --op-type write "${S[@]}"
	run h64r host --op-type read "${S[@]}"
	for c in ${CONFIGS:-c1m c2m s2m}; do
		run gw "$c" --op-type write --mem-type gpu "${B[@]}"
		run gr "$c" --op-type read --mem-type gpu "${B[@]}"
		run g64w "$c" --op-type write --mem-type gpu "${S[@]}"
		run g64r "$c" --op-type read --mem-type gpu "${S[@]}"
		run cgw "$c" --op-type write --initiator-mem-type cpu --target-mem-type gpu "${B[@]}"
		run gcw "$c" --op-type write --initiator-mem-type gpu --target-mem-type cpu "${B[@]}"
		if [[ -n ${SMALL:-} ]]; then
			run g4kw "$c" --op-type write --mem-type gpu --iters 500 --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
			run g8w "$c" --op-type write --mem-type gpu --iters 500 --buffer-size 8 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		fi
	done
done
python3 - "$O/gc/j" <<'PY'
import json, sys, glob, os, collections, statistics as st
agg = collections.defaultdict(dict)
for f in glob.glob(sys.argv[1] + "/*.json"):
    row, c, r = os.path.basename(f)[:-5].split(".")
    x = json.load(open(f))["rows"][0]
    agg[(row, c)][int(r)] = x["avg_lat_us"] if row in ("g4kw", "g8w") else x["avg_bw_gbps"]
HOST = {"gw": "hw", "gr": "hr", "g64w": "h64w", "g64r": "h64r", "cgw": "hw", "gcw": "hw"}
print(f"{'row':5} {'config':6} {'GB/s (small: avg us) per round':31} mean   / host per round")
for (row, c), v in sorted(agg.items()):
    t = [v[k] for k in sorted(v)]
    host = agg.get((HOST.get(row, ""), "host"), {})
    ratio = " ".join(f"{v[k] / host[k]:.2f}" for k in sorted(v) if host.get(k))
    print(f"{row:5} {c:6} {' '.join(f'{x:.2f}' for x in t):31} {st.mean(t):6.2f} {ratio}")
PY
(cd "$O/gc" && tar czf ../s39-gpuchunk-json.tgz j) && rm -rf "$O/gc"
