#!/usr/bin/env bash
# Session 49: every row of goals.sh from each binary of BINS in turn, ROUNDS interleaved
# rounds (one goals.sh round per binary per round, in reverse order every other round), then
# one line per row: its value per round for each binary, the means and their ratio (GB/s
# for the 1 MiB x 256 and 64 MiB rows, avg and p50 us for the small ones). The regression check of issue 23's "no
# throughput row loses more than 3 %" across builds.
#   OUT=$OUT ROUNDS=3 GPU=1 BINS=".dev/morio-b28 .dev/morio" bash scripts/bench/s49-ab.sh
set -u
O=${OUT:-/tmp/s49ab}
mkdir -p "$O"
read -ra bins <<<"${BINS:-.dev/morio}"
for ((r = 1; r <= ${ROUNDS:-3}; r++)); do
	order=("${bins[@]}")
	# Even rounds run the binaries in reverse order (ABBA): drift within a round then
	# falls on every binary alike (session 49's first run, in one order, read it as a
	# 10-30 % latency loss that ABBA rounds did not show).
	if ((r % 2 == 0)); then
		order=()
		for ((i = ${#bins[@]} - 1; i >= 0; i--)); do order+=("${bins[i]}"); done
	fi
	for b in "${order[@]}"; do
		OUT="$O/$(basename "$b")-r$r" ROUNDS=1 GPU=${GPU:-1} MORIO=$b bash scripts/bench/goals.sh >/dev/null 2>&1 ||
			echo "fail $b r$r"
	done
done
python3 - "$O" ${BINS:-.dev/morio} <<'PY' | tee "$O/summary.txt"
import collections, glob, io, json, os, statistics, sys, tarfile
out, bins = sys.argv[1], [os.path.basename(b) for b in sys.argv[2:]]
val = collections.defaultdict(lambda: collections.defaultdict(list))
for b in bins:
    for tgz in sorted(glob.glob(f"{out}/{b}-r*/goals-json.tar.gz")):
        with tarfile.open(tgz) as t:
            for m in t.getmembers():
                name = os.path.basename(m.name)
                if not m.isfile() or not name.endswith(".json") or name.startswith(("membw", "gpulink")):
                    continue
                row = json.load(t.extractfile(m))["rows"][0]
                key = name.rsplit("-r", 1)[0]
                big = any(s in key for s in ("1m", "64m"))
                if big:
                    val[key][b].append(row["avg_bw_gbps"])
                else:
                    val[key + " avg"][b].append(row["avg_lat_us"])
                    val[key + " p50"][b].append(row["p50_us"])
unit = lambda k: "GB/s" if any(s in k for s in ("1m", "64m")) else "us"
print(f"{'row':12} {'unit':5} " + " | ".join(f"{b} per round" for b in bins) + " | means | last/first")
for k in sorted(val):
    v = val[k]
    if any(not v[b] for b in bins):
        print(k, "missing"); continue
    means = [statistics.mean(v[b]) for b in bins]
    per = " | ".join(" ".join(f"{x:.2f}" for x in v[b]) for b in bins)
    print(f"{k:12} {unit(k):5} {per} | {' '.join(f'{m:.2f}' for m in means)} | {means[-1] / means[0]:.3f}")
PY
