#!/usr/bin/env bash
# Where do the same-host transport's small-transfer tails come from? Single 8 B writes over TCP and
# same-host (short and long warm-up, with and without spinning shards), the slow iterations of
# each, then a per-stage trace of the slowest transfers. BIN picks the binary. (Run of 2026-12-05,
# docs/perf/h200-stop26.md: one 42-51 ms stall at the first transfer of owner shard 4.)
B=${BIN:-.dev/morio}
row="--op-type write --buffer-size 8 --transfer-batch-size 1 --iters 1000 --no-ceiling --no-floor --no-validate"
slow() { python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))['rows'][0]['durations_us'];s=[(i,round(x)) for i,x in enumerate(d) if x>2000];print('   slow iters (>2ms):',s[:12], 'n=',len(s))" $1; }
for spin in "" "--spin-us 2000 --wait-spin-us 1000"; do
for m in "off 4" "require 4" "require 200"; do set -- $m
  $B bench --loopback $row $spin --warmup $2 --same-host $1 --json /tmp/d.json 2>&1 | grep -E "^\|\s+8 " | awk -v m="$1 warmup=$2 spin=${spin:+on}" -F'|' '{printf "DIAG %s avg %s p50 %s p99 %s max %s\n", m, $8, $9, $10, $12}'; slow /tmp/d.json
done; done
mkdir -p /tmp/tr; MORIO_TRACE=/tmp/tr $B bench --loopback $row --warmup 4 --spin-us 2000 --wait-spin-us 1000 --same-host require > /dev/null 2>&1
SLOWEST=4 python3 scripts/bench/trace-stages.py /tmp/tr same-host-w8b1 2>&1 | head -30
