#!/usr/bin/env bash
# Session 32's device calls: express writes (the submitting thread puts a small same-host
# write into the peer's ring; the lane's reader completes it) and the waiter's look every 8
# pauses, against the build before (MORIO_EXPRESS=0 MORIO_WAIT_PAUSES=64), one binary,
# ROUNDS interleaved rounds of the small rows (default settings, same host auto, with the
# raw floor) and the spinning single 8 B of issue 22, then 1 MiB x 256 write and read (no
# throughput row may lose), then a traced spinning 8 B.
#   variants: off (express off, look every 64), xp (express on, every 64), on (both new)
# Needs .dev/morio (carry .dev/morio).   ROUNDS=2
set -u
O=${OUT:-/tmp/s32-express}
R=${ROUNDS:-2}
mkdir -p "$O"/xp
b() { # NAME VARIANT -- ARGS...
	local n=$1 e
	case $2 in
	off) e=(MORIO_EXPRESS=0 MORIO_WAIT_PAUSES=64) ;;
	xp) e=(MORIO_EXPRESS=1 MORIO_WAIT_PAUSES=64) ;;
	*) e=(MORIO_EXPRESS=1 MORIO_WAIT_PAUSES=8) ;;
	esac
	shift 3
	timeout 120 env "${e[@]}" .dev/morio bench --loopback --no-ceiling "$@" \
		--json "$O/xp/$n.json" >/dev/null 2>&1 || echo "fail $n"
}
big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --iters 64)
for ((r = 1; r <= R; r++)); do
	for v in on xp off; do
		E=$v
		L=(--op-type write --iters 1000)
		b "d8b1-r$r-$v" $E -- "${L[@]}" --buffer-size 8 --transfer-batch-size 1
		b "d8b64-r$r-$v" $E -- "${L[@]}" --no-floor --buffer-size 8 --transfer-batch-size 64 --enable-batch-transfer --enable-sess
		b "d8b256-r$r-$v" $E -- "${L[@]}" --no-floor --buffer-size 8 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		b "d4k256-r$r-$v" $E -- "${L[@]}" --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer --enable-sess
		b "s8b1-r$r-$v" $E -- --op-type write --iters 3000 --no-floor --buffer-size 8 --transfer-batch-size 1 \
			--shards 2 --spin-us 2000 --wait-spin-us 1000 --same-host require
		b "s8b1tcp-r$r-$v" $E -- --op-type write --iters 3000 --no-floor --buffer-size 8 --transfer-batch-size 1 \
			--shards 2 --spin-us 2000 --wait-spin-us 1000 --same-host off
	done
done
for r in 1 2; do
	for v in on off; do
		b "dw1m-r$r-$v" $v -- --op-type write --no-floor "${big[@]}"
		b "dr1m-r$r-$v" $v -- --op-type read --no-floor "${big[@]}"
	done
done
echo "== spinning single 8 B through rings, express, traced"
rm -rf /tmp/s32-trace && mkdir -p /tmp/s32-trace
MORIO_TRACE=/tmp/s32-trace timeout 60 .dev/morio bench --loopback --no-ceiling --no-floor \
	--op-type write --iters 3000 --buffer-size 8 --transfer-batch-size 1 --shards 2 \
	--spin-us 2000 --wait-spin-us 1000 --same-host require >/dev/null 2>&1
python3 scripts/bench/trace-stages.py /tmp/s32-trace 2>&1 | head -22
echo "== floors (raw TCP, busy polling) of the default rows"
python3 - "$O/xp" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/d*b*-r*-*.json")):
    r = json.load(open(f)); r = r["rows"][0] if "rows" in r else r
    fl = r.get("floor")
    if fl:
        print(f.rsplit("/", 1)[1], "floor p50 %.1f avg %.1f | row p50 %.1f avg %.1f" % (fl["p50_us"], fl["avg_us"], r["p50_us"], r["avg_lat_us"]))
PY
echo "== express on / off"
python3 scripts/bench/ab-ratios.py "$O/xp" --base off | cut -c1-140
(cd "$O" && tar czf s32-express-json.tar.gz xp && rm -rf xp)
