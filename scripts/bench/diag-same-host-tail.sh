#!/usr/bin/env bash
# Where do the same-host transport's small-transfer tails come from? Single 8 B writes over TCP and
# same-host (with and without the wake hello byte, MORIO_X_NOHELLO; short and long warm-up),
# the slow iterations of each, then a per-stage trace of the slowest transfers. BIN picks the binary.
B=${BIN:-.dev/morio}
row="--op-type write --buffer-size 8 --transfer-batch-size 1 --iters 1000 --no-ceiling --no-floor --no-validate"
slow() { python3 -c "
import json,sys;d=json.load(open(sys.argv[1]))['rows'][0]['durations_us'];s=[(i,round(x)) for i,x in enumerate(d) if x>2000];print('   slow iters (>2ms):',s[:12], 'n=',len(s))" $1; }
for spin in "" "--spin-us 2000 --wait-spin-us 1000"; do
for m in "off 0 4" "require 0 4" "require 1 4" "require 0 200"; do set -- $m
  if [ $2 = 1 ]; then export MORIO_X_NOHELLO=1; else unset MORIO_X_NOHELLO; fi
  $B bench --loopback $row $spin --warmup $3 --same-host $1 --json /tmp/d.json 2>&1 | grep -E "^\|\s+8 " | awk -v m="$1 nohello=$2 warmup=$3 spin=${spin:+on}" -F'|' '{printf "DIAG %s avg %s p50 %s p99 %s max %s\n", m, $8, $9, $10, $12}'; slow /tmp/d.json
done; done
unset MORIO_X_NOHELLO
mkdir -p /tmp/tr; MORIO_TRACE=/tmp/tr $B bench --loopback $row --warmup 4 --spin-us 2000 --wait-spin-us 1000 --same-host require > /dev/null 2>&1
SLOWEST=4 python3 scripts/bench/trace-stages.py /tmp/tr same-host-w8b1 2>&1 | head -30
