#!/usr/bin/env bash
# Session 31's last device run (one call, this build):
#   tests  the engine's GPU tests on CUDA, the Python CUDA / same-host cases (VMM tensors of
#          torch's expandable segments between two processes included);
#   kv     the KV-cache example (16 KiB blocks, CUDA IPC): device-to-device batches of up to
#          128 KiB (default) against up to 4 KiB (MORIO_GPU_D2D_BATCH_MAX=4096) and none;
#   gsm    small GPU segments between processes: this build's default (payloads of parts
#          under 8 KiB on average staged) against every payload offered through CUDA IPC
#          (MORIO_GPU_IPC_MIN_PART=0) with the three batchings above;
#   spare  default settings with one CPU left to the application (this build's default: the
#          second engine of the loopback pair pins 7 shards) against both engines pinning 8
#          (--shards 8, every CPU of a 16-core host).
# Carry .dev (morio, engine-tests, the wheel).   ROUNDS=3
set -u
O=${OUT:-/tmp/s31-final}
R=${ROUNDS:-3}
mkdir -p "$O"/gsm "$O"/spare
echo "== engine GPU tests (CUDA)"
MORIO_TEST_GPU=1 timeout 150 .dev/engine-tests gpu --test-threads 2 2>&1 |
	grep -E "test result|panicked|FAILED" | head
echo "== Python CUDA tests"
site=/tmp/site
python3 -m pip install -q --no-index --no-deps --target $site .dev/wheels/morio-*.whl &&
	PYTHONPATH=$site timeout 200 python3 -m pytest -q -p no:cacheprovider python/tests \
		-k "cuda or gpu or same_host or mem_desc" 2>&1 | tail -4
b() { # DIR NAME [ENV=VAL...] -- ARGS...
	local d=$1 n=$2
	shift 2
	local envs=()
	while (($#)) && [[ $1 != -- ]]; do
		envs+=("$1")
		shift
	done
	shift
	timeout 120 env "${envs[@]}" .dev/morio bench --loopback --no-ceiling "$@" \
		--json "$O/$d/$n.json" >/dev/null 2>&1 || echo "fail $d/$n"
}
for ((r = 1; r <= R; r++)); do
	echo "== KV example round $r (D2D batch max: default 128 KiB / 4 KiB / off)"
	for v in d128k d4k off; do
		E=(MORIO_GPU_BATCH_COPIES=on)
		[[ $v == d4k ]] && E+=(MORIO_GPU_D2D_BATCH_MAX=4096)
		[[ $v == off ]] && E=(MORIO_GPU_BATCH_COPIES=off)
		printf '%-5s ' $v
		PYTHONPATH=$site env "${E[@]}" timeout 90 examples/kv_cache/run_local.sh --device cuda \
			--layers 32 --blocks 512 --tokens 4096 --rounds 10 2>&1 | grep -E "^\[prefill\]|FAIL" |
			sed 's/.*total/total/' | head -1
	done
	for v in def ipc-d128k ipc-d4k ipc-off; do
		E=(MORIO_GPU_BATCH_COPIES=on)
		[[ $v == ipc-* ]] && E+=(MORIO_GPU_IPC_MIN_PART=0)
		[[ $v == ipc-d4k ]] && E+=(MORIO_GPU_D2D_BATCH_MAX=4096)
		[[ $v == ipc-off ]] && E+=(MORIO_GPU_BATCH_COPIES=off)
		X=(--op-type write --mem-type gpu --enable-batch-transfer --enable-sess --same-host require)
		b gsm "g16k1024-r$r-$v" "${E[@]}" -- "${X[@]}" --buffer-size 16384 --transfer-batch-size 1024 --iters 64
		b gsm "g4k256-r$r-$v" "${E[@]}" -- "${X[@]}" --buffer-size 4096 --transfer-batch-size 256 --iters 256
		b gsm "g8b1024-r$r-$v" "${E[@]}" -- "${X[@]}" --buffer-size 8 --transfer-batch-size 1024 --iters 128
	done
	big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64)
	for v in spare all8; do
		S=()
		[[ $v == all8 ]] && S=(--shards 8)
		L=(--op-type write --iters 512 "${S[@]}")
		b spare "d4k256-r$r-$v" -- "${L[@]}" --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		b spare "d8b1-r$r-$v" -- "${L[@]}" --buffer-size 8 --transfer-batch-size 1
		b spare "d8b64-r$r-$v" -- "${L[@]}" --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
		b spare "d8b256-r$r-$v" -- "${L[@]}" --buffer-size 8 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		b spare "dw1m-r$r-$v" -- --op-type write "${S[@]}" "${big[@]}"
		b spare "dr1m-r$r-$v" -- --op-type read "${S[@]}" "${big[@]}"
	done
done
for d in gsm spare; do
	echo "== $d"
	python3 scripts/bench/ab-ratios.py "$O/$d" | cut -c1-125
done
(cd "$O" && tar czf s31-final-json.tar.gz gsm spare && rm -rf gsm spare)
