#!/usr/bin/env bash
# The spinning single 8 B through same-host rings (express writes), traced twice with the busy
# poller's notice times (T_NOTICED / NOTICED): session 32's call 6. Carry .dev/morio.
for i in 1 2; do
	rm -rf /tmp/s32-t6 && mkdir -p /tmp/s32-t6
	MORIO_TRACE=/tmp/s32-t6 timeout 60 .dev/morio bench --loopback --no-ceiling --no-floor \
		--op-type write --iters 3000 --buffer-size 8 --transfer-batch-size 1 --shards 2 \
		--spin-us 2000 --wait-spin-us 1000 --same-host require 2>&1 | grep same-host | cut -c1-200
	python3 scripts/bench/trace-stages.py /tmp/s32-t6 2>&1 | head -18
done
