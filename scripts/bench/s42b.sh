#!/usr/bin/env bash
# Session 42, call 2: staging slots on transparent huge pages (`gpu/cuda_pinned.rs`) against
# cuMemHostAlloc's slots (`MORIO_PINNED_THP=0`): the engine's GPU suite on CUDA, then ROUNDS
# interleaved rounds of the GPU rows and two host rows (s40-landing.sh's table); then, as the
# hypothesis' check, host-memory rows with the bench's heap on 4 KiB pages
# (`MIMALLOC_ALLOW_THP=0`) against huge pages.
#   OUT=$OUT ROUNDS=4 bash scripts/bench/s42b.sh   (carry .dev: morio, morio-cu, morio-heap4k, engine-tests)
set -u
O=${OUT:-/tmp/s42b}
mkdir -p "$O/heap"
nvidia-smi --query-gpu=name --format=csv,noheader
grep -o '\[[a-z]*\]' /sys/kernel/mm/transparent_hugepage/enabled
echo "=== GPU suite on CUDA (huge-page slots)"
MORIO_TEST_GPU=1 timeout 120 .dev/engine-tests gpu --test-threads 2 2>&1 |
	grep -E "test result|panicked|FAILED" | head -20
echo "=== heap pages (old: huge, new: 4 KiB)"
OUT=$O/heap ROUNDS=3 VARIANTS="old .dev/morio; new .dev/morio-heap4k" ROWS="hw hr h64w h64r" \
	timeout 150 bash scripts/bench/s40-landing.sh >"$O/heap.txt" 2>&1
tail -6 "$O/heap.txt"
echo "=== slots A/B (old: cuMemHostAlloc, new: huge pages)"
OUT=$O ROUNDS=${ROUNDS:-4} VARIANTS="old .dev/morio-cu; new .dev/morio" \
	ROWS="${ROWS:-hw h64w gw gr g64w g64r cgw gcr gcw}" timeout "${ABLIMIT:-360}" bash scripts/bench/s40-landing.sh \
	>"$O/ab.txt" 2>&1
tail -20 "$O/ab.txt"
