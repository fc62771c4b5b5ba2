#!/usr/bin/env bash
# Session 30's device run: the CUDA tests of this build, then, interleaved ROUNDS times,
#   gseg  many small segments in GPU memory (a KV cache's blocks), staged over TCP and
#         copied through CUDA IPC, with the batched copies of this build against one driver
#         call per segment (MORIO_GPU_BATCH_COPIES=off);
#   lat   issue 23's default-settings rows (8 B single / x 64 / x 256, 4 KiB x 256, with the
#         raw floor) and throughput rows, session 29's build (.dev/morio-s29) against this one
#         (.dev/morio): idle shards that tick once a second must cost nothing;
#   same  issue 22's rows: host memory and GPU memory same-host against TCP, and the spinning
#         single 8 B through rings and over TCP, traced (trace-stages.py) for the hops left.
#   mb    (when .dev/morio-nomb exists: docs/perf/experiments/glommio-no-membarrier.patch)
#         default, busy-polling and spinning small rows, glommio's membarrier on park against
#         fences: whether parking shards' interrupts make the tails.
# Needs .dev/morio, .dev/morio-s29, .dev/engine-tests, .dev/wheels/ (carry .dev); .dev/morio-nomb
# for `mb`.
#   SECTIONS="tests gseg lat same mb"  which parts to run (default all)   ROUNDS=2
# All of it may pass a call's 10 minutes: run SECTIONS="tests gseg", then "lat same mb"
# (each about 4-5 minutes on the H200 host; rows time out at 120 s each).
set -u
O=${OUT:-/tmp/s30-goals}
R=${ROUNDS:-2}
S=${SECTIONS:-tests gseg lat same mb}
mkdir -p "$O"/gseg "$O"/lat "$O"/same "$O"/mb
[ -x .dev/morio-nomb ] || S=${S//mb/}
on() { [[ " $S " == *" $1 "* ]]; }
b() { # DIR NAME BIN [ENV=VAL...] -- ARGS...
	local d=$1 n=$2 bin=$3
	shift 3
	local envs=()
	while (($#)) && [[ $1 != -- ]]; do
		envs+=("$1")
		shift
	done
	shift
	timeout 120 env "${envs[@]}" ".dev/${bin}" bench --loopback --no-ceiling "$@" \
		--json "$O/$d/$n.json" >/dev/null 2>&1 || echo "fail $d/$n"
}
if on tests; then
	echo "== engine GPU tests (CUDA)"
	MORIO_TEST_GPU=1 timeout 150 .dev/engine-tests gpu --test-threads 2 2>&1 |
		grep -E "test result|panicked|FAILED" | head
	echo "== Python CUDA tests"
	site=/tmp/site
	python3 -m pip install -q --no-index --no-deps --target $site .dev/wheels/morio-*.whl &&
		PYTHONPATH=$site timeout 150 python3 -m pytest -q -p no:cacheprovider python/tests \
			-k "cuda or gpu or same_host" 2>&1 | tail -4
	echo "== KV-cache example, CUDA tensors (same host), batched copies on / off"
	for v in on off; do
		PYTHONPATH=$site MORIO_GPU_BATCH_COPIES=$v timeout 90 examples/kv_cache/run_local.sh \
			--device cuda --layers 32 --blocks 512 --tokens 4096 --rounds 10 2>&1 |
			grep -E "GB/s|FAIL" | head -2
	done
fi
if on mb && [ -x .dev/membarrier ]; then
	echo "== what a glommio park's membarrier costs the parker and spinning threads"
	timeout 60 .dev/membarrier 8
fi
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64)
one=(--buffer-size 67108864 --transfer-batch-size 1 --iters 64)
for ((r = 1; r <= R; r++)); do
	if on gseg; then
		for v in on off; do
			for sh in off require; do
				t="r$r-batch$v-$sh"
				E=(MORIO_GPU_BATCH_COPIES=$v)
				X=(--op-type write --mem-type gpu --enable-batch-transfer --enable-sess --same-host "$sh")
				b gseg "g16k1024-$t" morio "${E[@]}" -- "${X[@]}" --buffer-size 16384 --transfer-batch-size 1024 --iters 32
				b gseg "g4k256-$t" morio "${E[@]}" -- "${X[@]}" --buffer-size 4096 --transfer-batch-size 256 --iters 128
				b gseg "g8b1024-$t" morio "${E[@]}" -- "${X[@]}" --buffer-size 8 --transfer-batch-size 1024 --iters 64
			done
		done
	fi
	if on lat; then
		for bin in morio-s29 morio; do
			L=(--op-type write --iters 512)
			b lat "d8b1-r$r-$bin" $bin -- "${L[@]}" --buffer-size 8 --transfer-batch-size 1
			b lat "d8b64-r$r-$bin" $bin -- "${L[@]}" --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
			b lat "d8b256-r$r-$bin" $bin -- "${L[@]}" --buffer-size 8 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
			b lat "d4k256-r$r-$bin" $bin -- "${L[@]}" --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
			b lat "dw1m-r$r-$bin" $bin -- --op-type write "${big[@]}"
			b lat "dr1m-r$r-$bin" $bin -- --op-type read "${big[@]}"
			b lat "dw64m-r$r-$bin" $bin -- --op-type write "${one[@]}"
		done
	fi
	if on mb; then
		# Fewer parks (a longer busy window) is the other way to fewer barriers: bp1000.
		for v in morio morio-nomb "morio 1000"; do
			set -- $v
			bin=$1 tag=$1 X=()
			if (($# > 1)); then tag="$1-bp$2" X=(--busy-poll-us "$2"); fi
			L=(--op-type write --iters 1000 "${X[@]}")
			b mb "d8b1-r$r-$tag" $bin -- "${L[@]}" --buffer-size 8 --transfer-batch-size 1
			b mb "d8b64-r$r-$tag" $bin -- "${L[@]}" --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
			b mb "d4k256-r$r-$tag" $bin -- "${L[@]}" --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
			b mb "s8b1-r$r-$tag" $bin -- "${L[@]}" --buffer-size 8 --transfer-batch-size 1 --shards 2 --spin-us 2000 --wait-spin-us 1000
		done
	fi
	if on same; then
		for sh in require off; do
			t="r$r-$sh"
			b same "hw1m-$t" morio -- --op-type write "${big[@]}" --same-host $sh
			b same "hr1m-$t" morio -- --op-type read "${big[@]}" --same-host $sh
			b same "gw64m-$t" morio -- --op-type write "${one[@]}" --mem-type gpu --same-host $sh
			b same "gr64m-$t" morio -- --op-type read "${one[@]}" --mem-type gpu --same-host $sh
			b same "s8b1-$t" morio -- --op-type write --iters 2000 --buffer-size 8 --transfer-batch-size 1 \
				--shards 2 --spin-us 2000 --wait-spin-us 1000 --same-host $sh
		done
	fi
done
if on same; then
	echo "== spinning single 8 B through rings, traced"
	rm -rf /tmp/s30-trace && mkdir -p /tmp/s30-trace
	MORIO_TRACE=/tmp/s30-trace timeout 60 .dev/morio bench --loopback --no-ceiling --no-floor \
		--op-type write --iters 3000 --buffer-size 8 --transfer-batch-size 1 --shards 2 \
		--spin-us 2000 --wait-spin-us 1000 --same-host require >/dev/null 2>&1
	python3 scripts/bench/trace-stages.py /tmp/s30-trace 2>&1 | tail -30
fi
for d in gseg lat same mb; do
	if ls "$O/$d"/*.json >/dev/null 2>&1; then
		echo "== $d"
		python3 scripts/bench/ab-ratios.py "$O/$d" | cut -c1-125
	fi
done
(cd "$O" && tar czf s30-goals-json.tar.gz gseg lat same mb && rm -rf gseg lat same mb)
