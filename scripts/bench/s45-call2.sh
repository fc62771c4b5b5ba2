# Session 45, call 2 (docs/perf/s45-runs.md): the revised gather kernel on CUDA (its test),
# a traced scattered GPU 8 B x 256 write, and copy-engine batches against the gather kernel
# on block-aligned scattered rows (--batch-contiguous --batch-scattered: a paged KV cache).
#   OUT=$OUT bash scripts/bench/s45-call2.sh      (carry .dev: morio, morio-gather, engine-tests
#   built from 033f328; the gather kernel was removed after this call)
MORIO_TEST_GPU=1 timeout 120 .dev/engine-tests gpu_gather 2>&1 | grep -E "test result|panicked" | head -5
d=$OUT/tr
mkdir -p "$d"
MORIO_TRACE=$d timeout 90 .dev/morio bench --loopback --no-ceiling --no-floor --same-host off --mem-type gpu \
	--op-type write --enable-batch-transfer --enable-sess --transfer-batch-size 256 --buffer-size 8 --iters 300 \
	--batch-scattered --json "$OUT/tr8.json" >/dev/null 2>&1
python3 scripts/bench/trace-stages.py "$d" "gpu 8 B x 256 scattered write" | grep -v "^   slow"
(cd "$OUT" && tar czf tr.tgz tr && rm -rf tr)
mkdir -p "$OUT/a"
OUT=$OUT/a PART=ab EXTRA=--batch-contiguous ROUNDS=${ROUNDS:-1} SIZES="8 4096 32768" OPS="write read" LAYOUTS=scattered \
	VARIANTS="batch .dev/morio; gather .dev/morio-gather" bash scripts/bench/s45.sh 2>&1 | tail -8
(cd "$OUT" && tar czf j.tgz a && rm -rf a/j)
