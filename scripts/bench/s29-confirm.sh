#!/usr/bin/env bash
# Session 29's last call: the GPU tests on CUDA (engine and Python, this build), then the
# rows the A/B left open, interleaved: 4 KiB x 256 with default settings (before the session,
# uid blocks alone, this build, this build with busy polling by default: morio-def), the
# default rows of morio-new against morio-def, and the 64 MiB GPU rows (staged against IPC).
set -u
O=${OUT:-/tmp/s29-confirm}
mkdir -p "$O"/d4k "$O"/g64
echo "== engine GPU tests (CUDA)"
MORIO_TEST_GPU=1 timeout 120 .dev/engine-tests gpu --test-threads 2 2>&1 | grep -E "test result|panicked|FAILED" | head
echo "== Python CUDA tests"
S=/tmp/site
python3 -m pip install -q --no-index --no-deps --target $S .dev/wheels/morio-*.whl &&
	PYTHONPATH=$S timeout 150 python3 -m pytest -q -p no:cacheprovider python/tests -k "cuda or gpu or same_host" 2>&1 | tail -4
b() { # DIR NAME BIN ARGS...
	local d=$1 n=$2 bin=$3
	shift 3
	timeout 90 ".dev/${bin}" bench --loopback --no-ceiling "$@" --json "$O/$d/$n.json" >/dev/null 2>&1 || echo "fail $d/$n"
}
one=(--buffer-size 67108864 --transfer-batch-size 1 --iters 64 --mem-type gpu)
for ((r = 1; r <= ${ROUNDS:-4}; r++)); do
	for bin in morio morio-uid morio-new morio-def; do
		b d4k "d4k256-r$r-$bin" $bin --op-type write --iters 256 --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
	done
	for bin in morio-new morio-def; do
		b d4k "d8b1-r$r-$bin" $bin --op-type write --iters 256 --buffer-size 8 --transfer-batch-size 1
		b d4k "d8b64-r$r-$bin" $bin --op-type write --iters 256 --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
		b d4k "dw1m-r$r-$bin" $bin --op-type write --buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64
		b d4k "dr1m-r$r-$bin" $bin --op-type read --buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64
	done
	for sh in off require; do
		b g64 "gw64m-r$r-$sh" morio-new --op-type write "${one[@]}" --same-host $sh
		b g64 "gr64m-r$r-$sh" morio-new --op-type read "${one[@]}" --same-host $sh
	done
done
for d in d4k g64; do
	echo "== $d"
	python3 scripts/bench/ab-ratios.py "$O/$d" | cut -c1-125
done
(cd "$O" && tar czf s29-confirm-json.tar.gz d4k g64 && rm -rf d4k g64)
