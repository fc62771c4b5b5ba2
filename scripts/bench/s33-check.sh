#!/usr/bin/env bash
# Session 33's last call: the engine's GPU tests on CUDA and the express tests (over rings and
# TCP) on the final build, then ROUNDS rounds of the spinning single 8 B write through
# same-host rings and over TCP (issue 22's and 23's rows).
# Needs .dev/morio and .dev/engine-tests (carry both).   ROUNDS=3
set -u
O=${OUT:-/tmp/s33-check}
R=${ROUNDS:-3}
mkdir -p "$O"/c
echo "== GPU tests (CUDA)"
MORIO_TEST_GPU=1 timeout 150 .dev/engine-tests gpu --test-threads 2 2>&1 |
	grep -E "test result|panicked|FAILED" | head
echo "== express tests, same host and TCP"
timeout 120 .dev/engine-tests express --test-threads 2 2>&1 | grep -E "test result|panicked|FAILED" | head
MORIO_SAME_HOST=off timeout 120 .dev/engine-tests express --test-threads 2 2>&1 | grep -E "test result|panicked|FAILED" | head
S=(--iters 3000 --buffer-size 8 --shards 2 --spin-us 2000 --wait-spin-us 1000 --op-type write --transfer-batch-size 1)
for ((r = 1; r <= R; r++)); do
	timeout 60 .dev/morio bench --loopback --no-ceiling --no-floor "${S[@]}" --same-host require --json "$O/c/ring8s-r$r.json" >/dev/null 2>&1 || echo "fail ring r$r"
	timeout 60 .dev/morio bench --loopback --no-ceiling "${S[@]}" --same-host off --json "$O/c/t8s-r$r.json" >/dev/null 2>&1 || echo "fail tcp r$r"
done
echo "== per round: avg / p50 / p99 us"
python3 scripts/bench/rounds.py "$O/c"
(cd "$O" && tar czf s33-check-json.tar.gz c && rm -rf c)
