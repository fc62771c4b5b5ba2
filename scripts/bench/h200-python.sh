#!/usr/bin/env bash
# The Python package on the H200 host: its test suite with torch and CUDA, the KV-cache
# example on CUDA tensors, and the package's goals measured beside `morio bench` in one run.
#
#   scripts/bench/h200-python.sh build  # here: the manylinux wheel (maturin --zig, needs the
#                                       # ziglang package) into .dev/wheels, the morio command
#                                       # and engine tests into .dev (scripts/bench/h200-bench.sh build)
#   scripts/bench/h200-python.sh run    # there, from the repo root with .dev carried: install the
#                                       # wheel, pytest, the example, then ROUNDS rounds of each row
#                                       # from `morio bench` and from python/bench/pybench.py,
#                                       # interleaved; a summary table last
#
# Rows (the issue's goals): 1 MiB x 256 batch write and read through a session, host memory
# and CUDA memory (8+8 shards, pinned, as `morio bench --loopback` places them), from Python
# with both engines in one process and with the target in a child process (as `morio bench
# --loopback` runs its two roles); a single 8 B
# write (2 spinning shards per side, wait spin 1000 us); the submission cost of a
# 65,536-entry batch from numpy int64 arrays.
#   ROUNDS (default 2), ITERS (default 64: 1 MiB rows), LAT_ITERS (default 4000),
#   SKIP_TESTS=1 skips pytest and the example.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

OUT_DIR="${OUT:-/tmp/morio-python}"
ROUNDS="${ROUNDS:-2}"
ITERS="${ITERS:-64}"
LAT_ITERS="${LAT_ITERS:-4000}"
BIN=./.dev/morio

build() {
	set -e
	scripts/bench/h200-bench.sh build
	rm -rf .dev/wheels
	(cd python && maturin build --release --zig --compatibility manylinux_2_28 -o ../.dev/wheels)
	ls -l .dev/wheels
}

run() {
	mkdir -p "${OUT_DIR}/json"
	local site=/tmp/morio-site
	rm -rf "${site}"
	python3 -m pip install -q --no-index --no-deps --target "${site}" .dev/wheels/morio-*.whl || exit 1
	export PYTHONPATH="${site}"
	python3 -c 'import morio, torch; print("morio", morio.__version__, morio.GPU_RUNTIMES, "torch", torch.__version__, "cuda", torch.cuda.is_available())'
	nproc
	local failed=()
	if [[ ${SKIP_TESTS:-0} != 1 ]]; then
		echo "=== pytest python/tests (torch, CUDA)"
		if ! timeout 170 python3 -m pytest -q -p no:cacheprovider python/tests 2>&1 | tee "${OUT_DIR}/pytest.txt" | tail -15; then
			failed+=(pytest)
		fi
		echo "=== KV-cache example, CUDA tensors"
		if ! timeout 60 examples/kv_cache/run_local.sh --device cuda 2>&1 | tail -8; then
			failed+=(example)
		fi
	fi
	local big=(--buffer-size 1048576 --transfer-batch-size 256 --batch-contiguous --iters "${ITERS}")
	local lat=(--shards 2 --spin-us 2000 --wait-spin-us 1000)
	for r in $(seq 1 "${ROUNDS}"); do
		for mem in cpu gpu; do
			for op in write read; do
				echo "=== round ${r}: ${op} 1 MiB x 256, ${mem} memory"
				"${BIN}" bench --loopback --op-type "${op}" --mem-type "${mem}" "${big[@]}" \
					--enable-batch-transfer --enable-sess --no-ceiling --no-floor \
					--json "${OUT_DIR}/json/rust-${op}-${mem}-${r}.json" | tail -4 || failed+=("rust-${op}-${mem}-${r}")
				python3 python/bench/pybench.py --rows a --ops "${op}" --mem-type "${mem}" "${big[@]}" \
					--json "${OUT_DIR}/json/py-${op}-${mem}-${r}.json" | tail -4 || failed+=("py-${op}-${mem}-${r}")
				python3 python/bench/pybench.py --rows a --ops "${op}" --mem-type "${mem}" "${big[@]}" \
					--target-process --json "${OUT_DIR}/json/pyt-${op}-${mem}-${r}.json" | tail -4 ||
					failed+=("pyt-${op}-${mem}-${r}")
			done
		done
		echo "=== round ${r}: single 8 B write, 2 spinning shards"
		"${BIN}" bench --loopback --op-type write --buffer-size 8 --transfer-batch-size 1 --enable-sess \
			--iters "${LAT_ITERS}" "${lat[@]}" --no-ceiling --no-floor \
			--json "${OUT_DIR}/json/rust-lat-${r}.json" | tail -4 || failed+=("rust-lat-${r}")
		python3 python/bench/pybench.py --rows b --lat-iters "${LAT_ITERS}" "${lat[@]}" \
			--json "${OUT_DIR}/json/py-lat-${r}.json" | tail -4 || failed+=("py-lat-${r}")
		echo "=== round ${r}: 65,536-entry batch submission"
		python3 python/bench/pybench.py --rows c --sub-list \
			--json "${OUT_DIR}/json/py-sub-${r}.json" | tail -6 || failed+=("py-sub-${r}")
	done
	python3 scripts/bench/python-goals.py "${OUT_DIR}/json" | tee "${OUT_DIR}/summary.txt"
	(cd "${OUT_DIR}" && tar czf python-json.tar.gz json && rm -rf json)
	if ((${#failed[@]})); then
		echo "FAILED: ${failed[*]}"
		return 1
	fi
}

case "${1:-}" in
build) build ;;
run) run ;;
*)
	echo "usage: $0 build|run" >&2
	exit 2
	;;
esac
