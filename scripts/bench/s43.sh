#!/usr/bin/env bash
# Session 43's device calls (docs/perf/s43-runs.md).
#   PART=trace  where a staged GPU sender's time goes: MORIO_TRACE runs of GPU -> GPU single
#               64 MiB write and read and 1 MiB x 256 write (default lanes, then 16), each
#               summarised by gpu-send-trace.py (copy wait / send / gap per chunk)
#   PART=ab     VARIANTS (s40-landing.sh's format) interleaved ROUNDS times over ROWS
#   PART=ahead  copy-ahead (.dev/morio) against the build before it (.dev/morio-old): the GPU
#               suite on CUDA, traced single 64 MiB and 1 MiB x 256 GPU writes of both, then
#               old / new / new with 16 GPU lanes interleaved ROUNDS times
#   OUT=$OUT PART=trace bash scripts/bench/s43.sh       (carry .dev: morio, morio-old, engine-tests)
set -u
O=${OUT:-/tmp/s43}
P=${PART:-trace}
M=${MORIO:-.dev/morio}
mkdir -p "$O"
nvidia-smi --query-gpu=name --format=csv,noheader
T=(--loopback --no-ceiling --no-floor --same-host off --mem-type gpu)
B=(--iters 8 --buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous)
S=(--iters 16 --buffer-size 67108864 --transfer-batch-size 1)
trace() {
	local n=$1
	shift
	rm -rf "$O/tr/$n" && mkdir -p "$O/tr/$n"
	MORIO_TRACE=$O/tr/$n timeout 60 "$M" bench "${T[@]}" "$@" --json "$O/tr/$n/bench.json" >/dev/null 2>&1 || echo "fail $n"
	python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(f\"$n: {r['avg_bw_gbps']:.2f} GB/s\")" "$O/tr/$n/bench.json" 2>/dev/null
	python3 scripts/bench/gpu-send-trace.py "$O/tr/$n" "$n"
}
case $P in
trace)
	for l in "" 16; do
		x=()
		[[ -n $l ]] && x=(--gpu-data-conns "$l")
		trace "g64w$l" --op-type write "${S[@]}" "${x[@]}"
		trace "g64r$l" --op-type read "${S[@]}" "${x[@]}"
		trace "gw$l" --op-type write "${B[@]}" "${x[@]}"
	done
	(cd "$O" && tar czf s43-trace.tgz tr && rm -rf tr) ;;
ahead)
	echo "=== GPU suite on CUDA"
	MORIO_TEST_GPU=1 timeout 120 .dev/engine-tests gpu --test-threads 2 2>&1 | grep -E "test result|panicked|FAILED" | head
	for b in old new; do
		M=.dev/morio
		[[ $b == old ]] && M=.dev/morio-old
		trace "g64w-$b" --op-type write "${S[@]}"
		trace "g64r-$b" --op-type read "${S[@]}"
		trace "gw-$b" --op-type write "${B[@]}"
	done
	(cd "$O" && tar czf s43-trace.tgz tr && rm -rf tr)
	OUT=$O ROUNDS=${ROUNDS:-6} VARIANTS="old .dev/morio-old; new .dev/morio; n16 .dev/morio --gpu-data-conns 16" \
		ROWS="${ROWS:-hw h64w gw gr g64w g64r cgw gcw g4w}" timeout "${ABLIMIT:-420}" bash scripts/bench/s40-landing.sh >"$O/ab.txt" 2>&1
	tail -30 "$O/ab.txt" ;;
ab)
	OUT=$O ROUNDS=${ROUNDS:-3} VARIANTS="$VARIANTS" ROWS="${ROWS:-hw gw gr g64w g64r cgw gcw g4w}" \
		timeout "${ABLIMIT:-420}" bash scripts/bench/s40-landing.sh >"$O/ab.txt" 2>&1
	tail -30 "$O/ab.txt" ;;
*) echo "PART must be trace, ahead or ab" >&2; exit 2 ;;
esac
