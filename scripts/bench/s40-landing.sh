#!/usr/bin/env bash
# Two builds A/B, interleaved ROUNDS times (session 40: a chunk received into GPU memory is
# answered after the next frame is read, its last H2D copies overlapping that read). Rows: host
# memory 1 MiB x 256 and a single 64 MiB, write and read (the reference, and the "no row loses
# more than 3 %" check); GPU -> GPU the same four; CPU -> GPU write, GPU <- CPU read (into the
# initiator's GPU), GPU -> CPU write; GPU 8 B x 256 and 4 KiB x 256 writes (g8w, g4w: avg us). Then per row and build the
# rounds, the mean, new / old per round, GPU / host per round, and the most chunks a run
# counted as landing while the next frame was read (gpu_overlapped_landings, both engines).
#   OUT=$OUT ROUNDS=3 A=.dev/morio-old B=.dev/morio bash scripts/bench/s40-landing.sh
# VARIANTS="old .dev/morio-old; new .dev/morio; s1m .dev/morio --gpu-slot-bytes 1MiB" sets the
# builds (name, binary, options; "old" is the baseline); ROWS limits the rows run.
set -u
O=${OUT:-/tmp/s40}
R=${ROUNDS:-3}
declare -A BIN=() ARGS=()
NAMES=()
IFS=';' read -ra VS <<<"${VARIANTS:-old ${A:-.dev/morio-old}; new ${B:-.dev/morio}}"
for v in "${VS[@]}"; do
	read -ra w <<<"$v"
	NAMES+=("${w[0]}")
	BIN[${w[0]}]=${w[1]}
	ARGS[${w[0]}]="${w[*]:2}"
done
ROWS=${ROWS:-hw hr h64w h64r gw gr g64w g64r cgw gcr gcw g8w}
mkdir -p "$O/ld/j"
T=(--loopback --no-ceiling --no-floor --same-host off ${EXTRA:-})
M=(--iters 48 --buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous)
S=(--iters 16 --buffer-size 67108864 --transfer-batch-size 1)
for ((r = 1; r <= R; r++)); do
	# Even rounds run the builds in reverse order, so no build always runs first.
	ORDER=("${NAMES[@]}")
	if ((r % 2 == 0)); then
		ORDER=()
		for ((i = ${#NAMES[@]} - 1; i >= 0; i--)); do ORDER+=("${NAMES[i]}"); done
	fi
	for b in "${ORDER[@]}"; do
		run() {
			local n=$1
			shift
			[[ " $ROWS " == *" $n "* ]] || return 0
			# Host rows: the baseline and "new" only (other variants change GPU options).
			[[ $n != h* || $b == old || $b == new ]] || return 0
			local x
			read -ra x <<<"${ARGS[$b]}"
			timeout 120 "${BIN[$b]}" bench "${T[@]}" "${x[@]}" "$@" --json "$O/ld/j/$n.$b.$r.json" >/dev/null 2>&1 || echo "fail $n $b $r"
		}
		run hw --op-type write "${M[@]}"
		run hr --op-type read "${M[@]}"
		run h64w --op-type write "${S[@]}"
		run h64r --op-type read "${S[@]}"
		run gw --op-type write --mem-type gpu "${M[@]}"
		run gr --op-type read --mem-type gpu "${M[@]}"
		run g64w --op-type write --mem-type gpu "${S[@]}"
		run g64r --op-type read --mem-type gpu "${S[@]}"
		run cgw --op-type write --initiator-mem-type cpu --target-mem-type gpu "${M[@]}"
		run gcr --op-type read --initiator-mem-type gpu --target-mem-type cpu "${M[@]}"
		run gcw --op-type write --initiator-mem-type gpu --target-mem-type cpu "${M[@]}"
		run g8w --op-type write --mem-type gpu --iters 500 --buffer-size 8 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		run g4w --op-type write --mem-type gpu --iters 500 --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
	done
done
python3 - "$O/ld/j" "$O/s40-landing.json" "${NAMES[@]}" <<'PY'
import json, sys, glob, os, collections, statistics as st
NAMES = sys.argv[3:]
agg = collections.defaultdict(dict)
ovl = collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + "/*.json"):
    row, b, r = os.path.basename(f)[:-5].split(".")
    x = json.load(open(f))["rows"][0]
    agg[(row, b)][int(r)] = x["avg_lat_us"] if row in ("g8w", "g4w") else x["avg_bw_gbps"]
    c = [x.get(k) or {} for k in ("initiator_counters", "target_counters")]
    ovl[(row, b)].append(sum(d.get("gpu_overlapped_landings", 0) for d in c))
json.dump({f"{k[0]}.{k[1]}": v for k, v in agg.items()}, open(sys.argv[2], "w"), indent=1)
HOST = {"gw": "hw", "gr": "hr", "g64w": "h64w", "g64r": "h64r", "cgw": "hw", "gcr": "hr", "gcw": "hw"}
print(f"{'row':5} {'build':5} {'GB/s (g8w, g4w: avg us) per round':30} {'mean':>7}  new/old per round | GPU/host per round")
for row in ["hw", "hr", "h64w", "h64r", "gw", "gr", "g64w", "g64r", "cgw", "gcr", "gcw", "g8w", "g4w"]:
    for b in NAMES:
        v = agg.get((row, b), {})
        if not v:
            continue
        t = [v[k] for k in sorted(v)]
        o = agg.get((row, "old"), {})
        ab = " ".join(f"{v[k] / o[k]:.3f}" for k in sorted(v) if b != "old" and o.get(k))
        h = agg.get((HOST.get(row, ""), b), {}) or agg.get((HOST.get(row, ""), "old"), {})
        gh = " ".join(f"{v[k] / h[k]:.2f}" for k in sorted(v) if h.get(k))
        print(f"{row:5} {b:5} {' '.join(f'{x:.2f}' for x in t):30} {st.mean(t):7.2f}  {ab:17} | {gh:15} ovl {max(ovl[(row, b)])}")
PY
(cd "$O/ld" && tar czf ../s40-landing-json.tgz j) && rm -rf "$O/ld"
