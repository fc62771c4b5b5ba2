#!/usr/bin/env bash
# Same-host rows, HEAD (.dev/morio-head, 4a077c8) against .dev/morio (a42f95a: busy-aware
# wake-socket reads), interleaved, two rounds; the host's copy bandwidth; then goals.sh on
# .dev/morio. Carry .dev/morio and .dev/morio-head.   OUT=$OUT bash scripts/bench/s35-ipc.sh
set -u
O=${OUT:-/tmp/s35}
mkdir -p "$O/j"
one=(--buffer-size 67108864 --transfer-batch-size 1 --iters 32 --no-floor --no-ceiling --same-host require)
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 32 --no-floor --no-ceiling --same-host require)
row() { local n=$2; shift 2; timeout 90 env "$@" --json "$O/j/$n.json" >"$O/$n.log" 2>&1 || echo "fail $n"; }
echo "=== host copy bandwidth"; timeout 60 python3 scripts/bench/membw.py 64 256 2>&1 | tail -4
for r in 1 2; do
  for b in head fix; do
    M=.dev/morio; [ $b = head ] && M=${HEAD:-.dev/morio-head}
    row $b "gw64-$b-$r" "$M" bench --loopback --op-type write --mem-type gpu "${one[@]}"
    row $b "gr64-$b-$r" "$M" bench --loopback --op-type read --mem-type gpu "${one[@]}"
    row $b "gw1m-$b-$r" "$M" bench --loopback --op-type write --mem-type gpu "${big[@]}"
    row $b "hw1m-$b-$r" "$M" bench --loopback --op-type write "${big[@]}"
    row $b "hr1m-$b-$r" "$M" bench --loopback --op-type read "${big[@]}"
    row $b "hw64-$b-$r" "$M" bench --loopback --op-type write "${one[@]}"
  done
  row x "gw64-headnobusy-$r" "${HEAD:-.dev/morio-head}" bench --loopback --op-type write --mem-type gpu "${one[@]}" --busy-poll-us 0
done
python3 - "$O/j" <<'PY'
import json,sys,glob,os
for f in sorted(glob.glob(sys.argv[1]+'/*.json')):
    d=json.load(open(f))
    for r in d.get('rows',[]):
        print(f"{os.path.basename(f)[:-5]:22} {r.get('avg_bw_gbps',0):8.2f} GB/s avg {r.get('avg_lat_us',0):9.1f} p50 {r.get('p50_us',0):9.1f} p99 {r.get('p99_us',0):9.1f} {r.get('transport')}")
PY
echo "=== trace, GPU single 64 MiB write, same host, .dev/morio"
rm -rf "$O/tr" && mkdir -p "$O/tr"
MORIO_TRACE=$O/tr row x gw64-trace .dev/morio bench --loopback --op-type write --mem-type gpu "${one[@]}"
python3 scripts/bench/trace-stages.py "$O/tr" 2>&1 | head -30
rm -rf "$O/tr"
echo "=== goals, fix build"
OUT=$O/goals ROUNDS=${GOAL_ROUNDS:-3} GPU=1 bash scripts/bench/goals.sh 2>&1 | tail -22
