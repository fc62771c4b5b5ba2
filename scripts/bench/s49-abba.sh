#!/usr/bin/env bash
# Session 49: two builds, row by row, in ABBA rounds (A then B in odd rounds, B then A in
# even ones), each row one short `morio bench` run; then per row the medians, their ratio and
# in how many paired rounds B was faster. PART=lat: p50 µs of the small rows over TCP
# (default single 8 B with its floor, default 8 B x 64, spinning single 8 B and 8 B x 256,
# default 4 KiB x 256; spinning 8 B and 8 B x 256 reads); PART=tp: GB/s of 1 MiB x 256 over
# TCP and same-host, GPU rows over TCP (writes, then TCP reads of host and GPU memory).
#   OUT=$OUT PART=lat ROUNDS=10 A=morio-b28 B=morio bash scripts/bench/s49-abba.sh  (carry .dev)
set -u
O=${OUT:-/tmp/s49abba}
A=${A:-morio-old}
B=${B:-morio}
mkdir -p "$O"
S=(--shards 2 --spin-us 2000 --wait-spin-us 1000)
bat=(--enable-batch-transfer --enable-sess)
big=(--buffer-size 1048576 --transfer-batch-size 256 "${bat[@]}" --batch-contiguous --iters 48 --no-floor)
one=(--buffer-size 67108864 --transfer-batch-size 1 --iters 16 --no-floor)
run1() { # BIN ROW ARGS...
	local b=$1 n=$2
	shift 2
	if timeout 90 ".dev/$b" bench --loopback --no-ceiling "$@" --json "$O/j.json" >/dev/null 2>&1; then
		python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(sys.argv[2], sys.argv[3], round(r['avg_bw_gbps'] if sys.argv[4] == 'tp' else r['p50_us'], 2))" \
			"$O/j.json" "$n" "$b" "${PART:-lat}"
	else echo "$n $b fail"; fi
}
rows() { # BIN
	local b=$1
	if [ "${PART:-lat}" = lat ]; then
		run1 "$b" d8 --same-host off --iters 5000 --op-type write --buffer-size 8 --transfer-batch-size 1
		run1 "$b" d64 --same-host off --iters 3000 --no-floor --op-type write --buffer-size 8 \
			--transfer-batch-size 64 "${bat[@]}"
		run1 "$b" s8 --same-host off "${S[@]}" --iters 5000 --op-type write --buffer-size 8 --transfer-batch-size 1
		run1 "$b" s256 --same-host off "${S[@]}" --iters 5000 --no-floor --op-type write --buffer-size 8 \
			--transfer-batch-size 256 "${bat[@]}"
		run1 "$b" d4k --same-host off --iters 1000 --op-type write --buffer-size 4096 \
			--transfer-batch-size 256 "${bat[@]}"
		run1 "$b" s8r --same-host off "${S[@]}" --iters 5000 --op-type read --buffer-size 8 --transfer-batch-size 1
		run1 "$b" s256r --same-host off "${S[@]}" --iters 5000 --no-floor --op-type read --buffer-size 8 \
			--transfer-batch-size 256 "${bat[@]}"
	else
		run1 "$b" t-w1m --same-host off --op-type write "${big[@]}"
		run1 "$b" h-w1m --same-host require --op-type write "${big[@]}"
		run1 "$b" h-r1m --same-host require --op-type read "${big[@]}"
		run1 "$b" t-gw64m --same-host off --mem-type gpu --op-type write "${one[@]}"
		run1 "$b" t-gw1m --same-host off --mem-type gpu --op-type write "${big[@]}"
		run1 "$b" t-r1m --same-host off --op-type read "${big[@]}"
		run1 "$b" t-gr1m --same-host off --mem-type gpu --op-type read "${big[@]}"
	fi
}
for ((r = 1; r <= ${ROUNDS:-8}; r++)); do
	if ((r % 2)); then rows "$A"; rows "$B"; else rows "$B"; rows "$A"; fi
done >"$O/rows.txt" 2>&1
python3 - "$O/rows.txt" "$A" "$B" "${PART:-lat}" <<'PY' | tee "$O/summary.txt"
import collections, statistics as st, sys
path, a_bin, b_bin, part = sys.argv[1:5]
v = collections.defaultdict(list)
for line in open(path):
    f = line.split()
    if len(f) < 3 or f[2] == "fail":
        print(line.strip())
        continue
    v[(f[0], f[1])].append(float(f[2]))
unit, better = ("GB/s", lambda x, y: y > x) if part == "tp" else ("p50 us", lambda x, y: y < x)
for row in dict.fromkeys(k[0] for k in v):
    a, b = v[(row, a_bin)], v[(row, b_bin)]
    if not a or not b:
        print(row, "missing")
        continue
    wins = sum(1 for x, y in zip(a, b) if better(x, y))
    print(f"{row:8} {unit}: {a_bin} median {st.median(a):7.2f}, {b_bin} median {st.median(b):7.2f},"
          f" ratio {st.median(b) / st.median(a):.3f}, {b_bin} better in {wins}/{min(len(a), len(b))} rounds")
PY
