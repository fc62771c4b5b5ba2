#!/usr/bin/env bash
# Session 42's device calls (docs/perf/s42-runs.md): the engine's GPU suite on CUDA, then
# ROUNDS interleaved rounds of s40-landing.sh's GPU rows (and host rows as the noise check)
# for the variants of one PART:
#   parts  a frame's first staging slot sent in 2 / 4 pieces against whole slots (wrappers
#          .dev/morio-pK = `MORIO_GPU_SEND_PARTS=K exec morio "$@"`; the option exists only
#          with docs/perf/experiments/gpu-send-parts.patch)
#   slots  staging slots on transparent huge pages against cuMemHostAlloc's (wrapper
#          .dev/morio-cu = MORIO_PINNED_THP=0; experiments/gpu-huge-slots.patch), after the
#          host rows with the bench's heap on 4 KiB pages (.dev/morio-heap4k =
#          MIMALLOC_ALLOW_THP=0) against huge pages
#   lanes  --gpu-data-conns 8 / 16 / 16 with a 128 MiB staging pool, with the GPU 8 B and
#          4 KiB x 256 rows (avg us: small batches must not pay)
#   OUT=$OUT PART=lanes ROUNDS=4 bash scripts/bench/s42.sh   (carry .dev: morio, engine-tests)
set -u
O=${OUT:-/tmp/s42}
P=${PART:-lanes}
mkdir -p "$O"
nvidia-smi --query-gpu=name --format=csv,noheader
env=()
case $P in
parts) env=(MORIO_GPU_SEND_PARTS=4)
	V="old .dev/morio; new .dev/morio-p2; p4 .dev/morio-p4"
	R="hw h64w gw gr g64w g64r cgw gcr gcw" ;;
slots) V="old .dev/morio-cu; new .dev/morio"
	R="hw h64w gw gr g64w g64r cgw gcr gcw" ;;
lanes) V="old .dev/morio --gpu-data-conns 8; new .dev/morio --gpu-data-conns 16; big .dev/morio --gpu-data-conns 16 --gpu-staging-bytes 128MiB"
	R="hw h64w gw gr g64w g64r cgw gcr gcw g8w g4w" ;;
*) echo "PART must be parts, slots or lanes" >&2; exit 2 ;;
esac
echo "=== GPU suite on CUDA ${env[*]}"
env "${env[@]}" MORIO_TEST_GPU=1 timeout 120 .dev/engine-tests gpu --test-threads 2 2>&1 |
	grep -E "test result|panicked|FAILED" | head -20
if [[ $P == slots ]]; then
	echo "=== heap pages (old: huge, new: 4 KiB)"
	OUT=$O/heap ROUNDS=3 VARIANTS="old .dev/morio; new .dev/morio-heap4k" ROWS="hw hr h64w h64r" \
		timeout 150 bash scripts/bench/s40-landing.sh >"$O/heap.txt" 2>&1
	tail -8 "$O/heap.txt"
fi
echo "=== $P A/B: ${VARIANTS:-$V}"
OUT=$O ROUNDS=${ROUNDS:-4} VARIANTS="${VARIANTS:-$V}" ROWS="${ROWS:-$R}" \
	timeout "${ABLIMIT:-360}" bash scripts/bench/s40-landing.sh >"$O/ab.txt" 2>&1
tail -36 "$O/ab.txt"
