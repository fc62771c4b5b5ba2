#!/usr/bin/env bash
# The least of s35-ipc.sh, for a call with little device time: the same-host GPU single
# 64 MiB write and host 1 MiB x 256 write, .dev/morio-head (4a077c8) against .dev/morio,
# interleaved ROUNDS times, one line per run as it ends.   ROUNDS=2 bash scripts/bench/s35-min.sh
set -u
R=${ROUNDS:-2}
one=(--buffer-size 67108864 --transfer-batch-size 1 --iters 32 --mem-type gpu)
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 32)
for ((r = 1; r <= R; r++)); do
	for b in morio-head morio; do
		for row in gw64 hw1m; do
			if [ $row = gw64 ]; then a=("${one[@]}"); else a=("${big[@]}"); fi
			rm -f /tmp/m.json
			timeout 60 ".dev/$b" bench --loopback --no-floor --no-ceiling --same-host require \
				--op-type write "${a[@]}" --json /tmp/m.json >/dev/null 2>&1 || { echo "fail $b $row"; continue; }
			python3 -c "import json; r = json.load(open('/tmp/m.json'))['rows'][0]; print('$r $b $row', round(r['avg_bw_gbps'], 2), 'GB/s p50', round(r['p50_us'], 1), r['transport'])"
		done
	done
done
