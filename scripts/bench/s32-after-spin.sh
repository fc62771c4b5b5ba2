#!/usr/bin/env bash
# Session 32's call 14: does a spinning run with self-polling ring readers leave something
# behind that slows what follows? Per round, MORIO_SELF_POLL=0 then 1: the spinning single
# 8 B through rings, what is still running right after, then the default single 8 B with
# its raw floor at once and again after 3 s. Carry .dev/morio (BIN=... for another).
S=(--op-type write --iters 3000 --no-floor --no-ceiling --buffer-size 8 --transfer-batch-size 1 --shards 2 --spin-us 2000 --wait-spin-us 1000 --same-host require)
D=(--no-ceiling --op-type write --iters 1000 --buffer-size 8 --transfer-batch-size 1)
for r in 1 2 3; do
for v in 0 1; do
	t0=$(date +%s.%N)
	MORIO_SELF_POLL=$v timeout 60 ${BIN:-.dev/morio} bench --loopback "${S[@]}" --json /tmp/s.json >/dev/null 2>&1
	t1=$(date +%s.%N)
	left=$(pgrep -c -f "bench --role")
	busy=$(top -b -n1 | awk 'NR>7 && $9>20 {print $12":"$9}' | head -5 | tr '\n' ' ')
	MORIO_SELF_POLL=$v timeout 60 ${BIN:-.dev/morio} bench --loopback "${D[@]}" --json /tmp/d.json >/dev/null 2>&1
	sleep 3
	MORIO_SELF_POLL=$v timeout 60 ${BIN:-.dev/morio} bench --loopback "${D[@]}" --json /tmp/d2.json >/dev/null 2>&1
	python3 -c "
import json
s=json.load(open('/tmp/s.json'))['rows'][0]; d=json.load(open('/tmp/d.json'))['rows'][0]; e=json.load(open('/tmp/d2.json'))['rows'][0]
print('r$r sp=$v s8b1 p50 %.1f took %.1fs left $left [$busy] | d8b1 now avg %.1f p50 %.1f p99 %.1f floor %.1f | after 3s avg %.1f p50 %.1f p99 %.1f floor %.1f' % (s['p50_us'], $t1-$t0, d['avg_lat_us'], d['p50_us'], d['p99_us'], d['floor']['p50_us'], e['avg_lat_us'], e['p50_us'], e['p99_us'], e['floor']['p50_us']))
"
done
done
