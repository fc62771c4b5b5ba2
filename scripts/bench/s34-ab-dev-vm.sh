#!/usr/bin/env bash
# Session 34 on the 2-core dev VM: 1 MiB x 64 write and read over TCP (batch + session,
# contiguous, 48 iterations), ROUNDS interleaved rounds (the order alternating) of the build
# before the session (BASE, e.g. 5b1b366 built in a worktree) and this one (HEAD).
#   BASE=/tmp/wt-target/release/morio HEAD=target/release/morio bash scripts/bench/s34-ab-dev-vm.sh
set -u
O=${OUT:-/tmp/s34-ab}/json; rm -rf "$O"; mkdir -p "$O"
declare -A BIN=([base]=${BASE:?} [head]=${HEAD:-target/release/morio})
big=(--buffer-size 1048576 --transfer-batch-size 64 --enable-batch-transfer --enable-sess --batch-contiguous --iters 48 --no-floor --no-ceiling)
for ((r = 1; r <= ${ROUNDS:-10}; r++)); do
  for v in $( ((r % 2)) && echo "head base" || echo "base head"); do
    b=${BIN[$v]}
    "$b" bench --loopback --op-type write "${big[@]}" --same-host off --json "$O/w1m-r$r-$v.json" >/dev/null 2>&1 || echo fail
    "$b" bench --loopback --op-type read "${big[@]}" --same-host off --json "$O/r1m-r$r-$v.json" >/dev/null 2>&1 || echo fail
  done
done
python3 scripts/bench/ab-ratios.py "$O" --base base | cut -c1-150
