#!/usr/bin/env bash
# Session 51: several builds in rotating order, round by round, on the throughput rows where
# an ABBA run showed a loss (TCP 1 MiB x 256 write, same-host 1 MiB x 256 write, TCP GPU
# single 64 MiB write); per row and build the median GB/s and its rank count.
#   OUT=$OUT ROUNDS=12 BUILDS="morio-base morio-new4 morio-new6" bash scripts/bench/s51-rot.sh
set -u
O=${OUT:-/tmp/s51rot}
mkdir -p "$O"
read -r -a B <<<"${BUILDS:-morio-base morio-new6}"
bat=(--enable-batch-transfer --enable-sess)
big=(--buffer-size 1048576 --transfer-batch-size 256 "${bat[@]}" --batch-contiguous --iters 48 --no-floor)
one=(--buffer-size 67108864 --transfer-batch-size 1 --iters 16 --no-floor)
run1() { # BIN ROW ARGS...
	local b=$1 n=$2
	shift 2
	if timeout 90 ".dev/$b" bench --loopback --no-ceiling "$@" --json "$O/j.json" >/dev/null 2>&1; then
		python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(sys.argv[2], sys.argv[3], round(r['avg_bw_gbps'], 2))" "$O/j.json" "$n" "$b"
	else echo "$n $b fail"; fi
}
for ((r = 0; r < ${ROUNDS:-12}; r++)); do
	k=${#B[@]}
	for ((i = 0; i < k; i++)); do
		b=${B[$(((i + r) % k))]}
		run1 "$b" t-w1m --same-host off --op-type write "${big[@]}"
		run1 "$b" h-w1m --same-host require --op-type write "${big[@]}"
		[ "${GPU:-1}" = 1 ] && run1 "$b" t-gw64m --same-host off --mem-type gpu --op-type write "${one[@]}"
	done
done >"$O/rows.txt" 2>&1
python3 - "$O/rows.txt" <<'PY' | tee "$O/summary.txt"
import collections, statistics as st, sys
v = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 3 and f[2] != "fail":
        v[f[0]][f[1]].append(float(f[2]))
for row, d in v.items():
    print(row, "  ".join(f"{b} {st.median(x):.2f} (n={len(x)}, min {min(x):.2f} max {max(x):.2f})" for b, x in d.items()))
PY
