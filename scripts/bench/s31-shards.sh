#!/usr/bin/env bash
# Session 31's shard-count check (one call, this build): default settings with every CPU of a
# 16-core host pinned (--shards 8 per engine), with 7 per engine, with 4 (balanced: two lanes
# each, half the CPUs left), and this build's default (one CPU left to the application: 8 and
# 7); then the KV-cache example's figures (D2D batches up to 128 KiB, up to 4 KiB, none).
# Carry .dev.   ROUNDS=2
set -u
O=${OUT:-/tmp/s31-shards}
R=${ROUNDS:-2}
mkdir -p "$O"/shards
b() { # NAME -- ARGS...
	local n=$1
	shift 2
	timeout 120 .dev/morio bench --loopback --no-ceiling "$@" --json "$O/shards/$n.json" >/dev/null 2>&1 ||
		echo "fail $n"
}
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64)
for ((r = 1; r <= R; r++)); do
	for v in all8 s7 s4 spare; do
		S=()
		[[ $v == all8 ]] && S=(--shards 8)
		[[ $v == s7 ]] && S=(--shards 7)
		[[ $v == s4 ]] && S=(--shards 4)
		L=(--op-type write --iters 512 "${S[@]}")
		b "d4k256-r$r-$v" -- "${L[@]}" --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		b "d8b1-r$r-$v" -- "${L[@]}" --buffer-size 8 --transfer-batch-size 1
		b "d8b64-r$r-$v" -- "${L[@]}" --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
		b "dw1m-r$r-$v" -- --op-type write "${S[@]}" "${big[@]}"
		b "dr1m-r$r-$v" -- --op-type read "${S[@]}" "${big[@]}"
	done
done
echo "== shards"
python3 scripts/bench/ab-ratios.py "$O/shards" | cut -c1-125
(cd "$O" && tar czf s31-shards-json.tar.gz shards && rm -rf shards)
site=/tmp/site
python3 -m pip install -q --no-index --no-deps --target $site .dev/wheels/morio-*.whl
for ((r = 1; r <= R; r++)); do
	for v in d128k d4k off; do
		E=(MORIO_GPU_BATCH_COPIES=on)
		[[ $v == d4k ]] && E+=(MORIO_GPU_D2D_BATCH_MAX=4096)
		[[ $v == off ]] && E=(MORIO_GPU_BATCH_COPIES=off)
		printf 'kv r%d %-5s ' "$r" $v
		PYTHONPATH=$site env "${E[@]}" timeout 90 examples/kv_cache/run_local.sh --device cuda \
			--layers 32 --blocks 512 --tokens 4096 --rounds 10 2>&1 | grep -E "^\[prefill\] wrote|FAIL" |
			sed 's/.*total/total/' | head -1
	done
done
