#!/usr/bin/env bash
# Build morio here, run the standard `morio bench` sweep on the H200 host.
#
#   scripts/bench/h200-bench.sh build   # here: cargo build --release --locked --features cuda,
#                                       # stripped into .dev/morio, and the engine tests into
#                                       # .dev/engine-tests
#   scripts/bench/h200-bench.sh run     # there, from the repo root, with .dev carried along:
#                                       # the standard sweep, one JSON report per invocation,
#                                       # a compact summary table last
#   scripts/bench/h200-bench.sh gpu     # there: the GPU tests on the real GPU (MORIO_TEST_GPU=1),
#                                       # then the GPU sweep beside the same rows in CPU memory
#   scripts/bench/h200-bench.sh lat     # there: small-transfer latency, default shards against few
#                                       # spinning shards (cores left free for the application)
#   scripts/bench/h200-bench.sh trace   # there: small writes with MORIO_TRACE on, then the median
#                                       # time between consecutive stages (scripts/bench/trace-stages.py)
#   scripts/bench/h200-bench.sh tp      # there: only the 1 MiB x 256 write and read rows with ceilings
#   scripts/bench/h200-bench.sh cpus    # there: the host's CPU topology, then the 4 KiB x 256 row on
#                                       # several CPU layouts (CPU_LAYOUTS), each traced and untraced,
#                                       # with every CPU's time (user/system/softirq/steal) during it
#   scripts/bench/h200-bench.sh ab      # there: the 4 KiB x 256 write row (7 spinning shards and
#                                       # lanes) from each binary of BINS, interleaved ROUNDS times
#                                       # (EXTRA_AB: options of every run)
#   scripts/bench/h200-bench.sh archab  # there (or here): the rows an architecture change must
#                                       # keep (1 MiB x 256 write and read, 8 B x 256 write, single
#                                       # 8 B write) from each binary of BINS, interleaved ROUNDS
#                                       # times (default 3), one summary row per run
#   scripts/bench/h200-bench.sh authab  # there (or here): the same rows as archab from BIN,
#                                       # without and with MORIO_AUTH_SECRET (peer
#                                       # authentication on), interleaved ROUNDS times
#   scripts/bench/h200-bench.sh hostab  # there (or here): the same-host transport against TCP
#                                       # (--same-host require / off) on the issue's rows: 1 MiB x
#                                       # 256 write and read, a single 64 MiB write, 128 KiB x 256
#                                       # and single, 4 KiB x 256, 8 B x 256 and single 8 B (spinning
#                                       # shards), interleaved ROUNDS times; GPU=1 adds the GPU rows
#   scripts/bench/h200-bench.sh scrapeab # there (or here): 1 MiB x 256 write and read and the
#                                       # single 8 B write without and with both sides' metrics
#                                       # rendered every second (--scrape-ms 1000), ROUNDS times
#   scripts/bench/h200-bench.sh ftrace  # there (root): the single 8 B and 8 B x 256 write rows under
#                                       # ftrace (send syscalls, IPIs, io_uring task work), then
#                                       # scripts/bench/kernel-sends.py on each buffer
#   scripts/bench/h200-bench.sh stripes # there: the 1 MiB x 256 rows with shared stripes (the
#                                       # default) and dealt ones (--deal-stripes), ROUNDS times
#   scripts/bench/h200-bench.sh gpuipc  # there: GPU memory between the two processes, staged over
#                                       # TCP (--same-host off) against device parts through CUDA IPC
#   scripts/bench/h200-bench.sh gpustage # there: the GPU staging pipeline per slot size (SLOTS)
#   scripts/bench/h200-bench.sh latdefault # there: issue 23's small rows with default settings,
#                                       # from each binary of BINS, interleaved
#   scripts/bench/h200-bench.sh pending # there: what stop 27 built without a GPU host, one call
#   scripts/bench/h200-bench.sh ringab  # there (or here): same-host small rows (8 B to 128 KiB) over TCP, over
#                                       # the socket's records (MORIO_SAME_HOST_RING=off) and
#                                       # through rings, with default settings and spinning shards
#
# BIN (default ./.dev/morio) picks the binary, so two builds can be compared in one call;
# LAT_VARIANTS / TRACE_VARIANTS are ';'-separated "SHARDS SPIN_US WAIT_SPIN_US [CONNS]".
#
# `run` writes under "${OUT:-/tmp/morio-bench}": json/NAME.json while it runs, then bundles them
# into morio-bench-json.tar.gz (the device tool brings back at most 8 files; KEEP_JSON=1 keeps
# the loose files too) beside summary.txt. ITERS (default 128) sets --iters of every row;
# EXTRA adds options to every run (e.g. EXTRA="--spin-us 50").
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

BIN="${BIN:-./.dev/morio}"
OUT_DIR="${OUT:-/tmp/morio-bench}"
ITERS="${ITERS:-128}"

usage() {
	echo "usage: $0 build|run|tp|gpu|gpuipc|gpustage|latdefault|pending|ringab|lat|trace|cpus|ab|archab|authab|hostab|scrapeab|stripes|ftrace" >&2
	exit 2
}

build() {
	cargo build --release --locked --features cuda
	mkdir -p .dev
	strip -o .dev/morio target/release/morio
	local t
	t=$(cargo test --release --locked --features cuda --test engine --no-run --message-format json |
		sed -n 's/.*"executable":"\([^"]*engine-[^"]*\)".*/\1/p' | tail -1)
	strip -o .dev/engine-tests "${t}"
	ls -l .dev/morio .dev/engine-tests
}

# bench NAME ARGS...: one `morio bench --loopback` invocation with its JSON report.
bench() {
	local name=$1
	shift
	echo
	echo "=== ${name}: morio bench --loopback --iters ${ITERS} $*"
	local extra=()
	read -ra extra <<<"${EXTRA:-}"
	"${BIN}" bench --loopback --iters "${ITERS}" --json "${OUT_DIR}/json/${name}.json" "$@" "${extra[@]}"
}

# The runs of this sweep, and those that failed.
NAMES=()
FAILED=()

# begin: check the binary, start an empty sweep.
begin() {
	if [[ ! -x ${BIN} ]]; then
		echo "missing ${BIN}: run '$0 build' first and carry .dev" >&2
		exit 1
	fi
	rm -rf "${OUT_DIR}/json" "${OUT_DIR}/summary.txt"
	mkdir -p "${OUT_DIR}/json"
	NAMES=()
	FAILED=()
}

# add NAME ARGS...: run one bench and remember how it went.
add() {
	NAMES+=("$1")
	if ! bench "$@"; then
		FAILED+=("$1")
	fi
}

# finish: the summary table, the JSON bundle, and the exit status of the sweep.
finish() {
	local files=()
	for n in "${NAMES[@]}"; do
		if [[ -f ${OUT_DIR}/json/${n}.json ]]; then
			files+=("${OUT_DIR}/json/${n}.json")
		fi
	done
	if ((${#files[@]} > 0)); then
		"${BIN}" bench --summarize "${files[@]}" >"${OUT_DIR}/summary.txt"
	fi
	tar -czf "${OUT_DIR}/morio-bench-json.tar.gz" -C "${OUT_DIR}" json
	if [[ ${KEEP_JSON:-0} != 1 ]]; then
		rm -r "${OUT_DIR}/json"
	fi
	echo
	if ((${#FAILED[@]} > 0)); then
		echo "FAILED: ${FAILED[*]}" >&2
	fi
	if [[ -f ${OUT_DIR}/summary.txt ]]; then
		cat "${OUT_DIR}/summary.txt"
	fi
	((${#FAILED[@]} == 0))
}

run() {
	begin
	nproc
	"${BIN}" --version
	local big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess)
	local small=(--transfer-batch-size 256 --enable-batch-transfer --enable-sess)
	for op in write read; do
		add "${op}-1m-b256-contig" --op-type "${op}" "${big[@]}" --batch-contiguous
		add "${op}-1m-b256-strided" --op-type "${op}" "${big[@]}"
		add "${op}-8b-b256" --op-type "${op}" --buffer-size 8 "${small[@]}"
		add "${op}-4k-b256" --op-type "${op}" --buffer-size 4096 "${small[@]}"
		add "${op}-8b-single" --op-type "${op}" --buffer-size 8 --transfer-batch-size 1
	done
	for shards in 1 2 4 8; do
		add "write-1m-b256-shards${shards}" --op-type write "${big[@]}" --batch-contiguous \
			--shards "${shards}"
	done
	finish
}

# The 1 MiB x 256 rows (batch + session, contiguous) with their ceilings: a quick check of
# throughput beside the latency work.
tp() {
	begin
	local big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess)
	for op in write read; do
		add "${op}-1m-b256-contig" --op-type "${op}" "${big[@]}" --batch-contiguous
	done
	finish
}

gpu() {
	begin
	nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader || true
	echo "=== engine tests on the GPU: MORIO_TEST_GPU=1 MORIO_TEST_BIG=1 engine-tests gpu"
	if [[ ${SKIP_TESTS:-0} != 1 ]] && ! MORIO_TEST_GPU=1 MORIO_TEST_BIG=1 ./.dev/engine-tests gpu --test-threads 1 2>&1 | tail -15; then
		FAILED+=(tests)
	fi
	local big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer --enable-sess --batch-contiguous --no-ceiling)
	local single=(--buffer-size 67108864 --transfer-batch-size 1 --no-ceiling)
	for op in write read; do
		add "${op}-1m-b256-cpu" --op-type "${op}" "${big[@]}" --mem-type cpu
		add "${op}-64m-single-cpu" --op-type "${op}" "${single[@]}" --mem-type cpu
		for slot in ${GPU_SLOTS:-1MiB}; do
			local s=(--gpu-slot-bytes "${slot}")
			add "${op}-1m-b256-gpu-slot${slot}" --op-type "${op}" "${big[@]}" --mem-type gpu "${s[@]}"
			add "${op}-64m-single-gpu-slot${slot}" --op-type "${op}" "${single[@]}" --mem-type gpu "${s[@]}"
			add "${op}-1m-b256-cpu2gpu-slot${slot}" --op-type "${op}" "${big[@]}" --initiator-mem-type cpu --target-mem-type gpu "${s[@]}"
			add "${op}-1m-b256-gpu2cpu-slot${slot}" --op-type "${op}" "${big[@]}" --initiator-mem-type gpu --target-mem-type cpu "${s[@]}"
		done
	done
	finish
}

# variants SPEC DEFAULTS...: VARIANTS = SPEC split at ';', or DEFAULTS when SPEC is empty.
variants() {
	local spec=$1
	shift
	VARIANTS=("$@")
	if [[ -n ${spec} ]]; then
		IFS=';' read -ra VARIANTS <<<"${spec}"
	fi
}

# variant V: OPTS and TAG for V = "default" or "SHARDS SPIN_US WAIT_SPIN_US [CONNS]".
variant() {
	OPTS=()
	TAG=default
	if [[ $1 != default ]]; then
		local sh spin wspin conns
		read -r sh spin wspin conns <<<"$1"
		OPTS=(--shards "${sh}" --wait-spin-us "${wspin}")
		((spin > 0)) && OPTS+=(--spin-us "${spin}")
		TAG="s${sh}-spin${spin}-wait${wspin}"
		if [[ -n ${conns} ]]; then
			OPTS+=(--num-data-conns "${conns}")
			TAG+="-c${conns}"
		fi
	fi
}

lat() {
	begin
	local b256=(--transfer-batch-size 256 --enable-batch-transfer --enable-sess --no-ceiling)
	local one=(--transfer-batch-size 1 --no-ceiling)
	variants "${LAT_VARIANTS:-}" "default" "1 2000 1000" "2 2000 1000" "4 2000 1000" "8 2000 1000"
	for v in "${VARIANTS[@]}"; do
		variant "${v}"
		add "lat-8b-b256-${TAG}" --op-type write --buffer-size 8 "${b256[@]}" "${OPTS[@]}"
		add "lat-4k-b256-${TAG}" --op-type write --buffer-size 4096 "${b256[@]}" "${OPTS[@]}"
		add "lat-8b-single-${TAG}" --op-type write --buffer-size 8 "${one[@]}" "${OPTS[@]}"
	done
	finish
}

trace() {
	begin
	local b256=(--transfer-batch-size 256 --enable-batch-transfer --enable-sess)
	local one=(--transfer-batch-size 1)
	variants "${TRACE_VARIANTS:-}" "2 2000 1000" "7 2000 1000 7"
	for v in "${VARIANTS[@]}"; do
		variant "${v}"
		for row in "8b-single:--buffer-size 8 ${one[*]}" "8b-b256:--buffer-size 8 ${b256[*]}" "4k-b256:--buffer-size 4096 ${b256[*]}"; do
			local name="trace-${row%%:*}-${TAG}" args
			read -ra args <<<"${row#*:}"
			mkdir -p "${OUT_DIR}/trace/${name}"
			MORIO_TRACE="${OUT_DIR}/trace/${name}" add "${name}" --op-type write "${args[@]}" "${OPTS[@]}" --no-ceiling
		done
	done
	# One run with the ceiling, for the raw round-trip floors (blocking and busy-polling).
	add "floor" --op-type write --buffer-size 8 "${one[@]}" --ceiling-bytes 268435456
	echo
	for d in "${OUT_DIR}"/trace/*/; do
		python3 scripts/bench/trace-stages.py "${d}" || true
	done | tee "${OUT_DIR}/trace-stages.txt"
	tar -czf "${OUT_DIR}/trace.tar.gz" -C "${OUT_DIR}" trace
	rm -r "${OUT_DIR}/trace"
	finish
}

# cpustat: /proc/stat's per-CPU lines (for a delta over one run).
cpustat() {
	grep '^cpu[0-9]' /proc/stat
}

# cpudelta BEFORE AFTER: per CPU, the share of the interval in user / system / softirq /
# steal / idle (the host taking a vCPU away shows as steal).
cpudelta() {
	python3 - "$1" "$2" <<'PY'
import sys
def load(p):
    return {l.split()[0]: [int(x) for x in l.split()[1:9]] for l in open(p)}
a, b = load(sys.argv[1]), load(sys.argv[2])
print("      cpu    user  system softirq   steal    idle   (% of the interval)")
for c in sorted(a, key=lambda c: int(c[3:])):
    d = [y - x for x, y in zip(a[c], b[c])]
    t = sum(d) or 1
    us, ni, sy, idle, io, irq, sirq, st = d
    print(f"      {c:<6} {100*(us+ni)/t:6.1f} {100*sy/t:7.1f} {100*(irq+sirq)/t:7.1f} {100*st/t:7.1f} {100*(idle+io)/t:7.1f}")
PY
}

cpus() {
	begin
	{
		nproc
		lscpu | grep -E 'Model name|Thread|Core|Socket|NUMA|MHz' || true
		for c in /sys/devices/system/cpu/cpu[0-9]*; do
			echo "$(basename "${c}") siblings $(cat "${c}/topology/thread_siblings_list" 2>/dev/null) core $(cat "${c}/topology/core_id" 2>/dev/null)"
		done
	} | tee "${OUT_DIR}/topology.txt"
	local row=(--op-type write --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer
		--enable-sess --no-ceiling --shards 7 --num-data-conns 7 --spin-us 2000 --wait-spin-us 1000)
	local layouts=()
	IFS=';' read -ra layouts <<<"${CPU_LAYOUTS:-0-13;7-13,0-6;0-4,6-8,9-11,13-15}"
	for l in "${layouts[@]}"; do
		local tag="cpus-${l//,/_}"
		cpustat >"${OUT_DIR}/stat0"
		add "${tag}" "${row[@]}" --cpus "${l}"
		cpustat >"${OUT_DIR}/stat1"
		{
			echo "=== CPU time during ${tag} (initiator = first 7 CPUs of --cpus ${l}, target = next 7)"
			cpudelta "${OUT_DIR}/stat0" "${OUT_DIR}/stat1"
		} | tee -a "${OUT_DIR}/cpu-time.txt"
		mkdir -p "${OUT_DIR}/trace/trace-${tag}"
		MORIO_TRACE="${OUT_DIR}/trace/trace-${tag}" add "trace-${tag}" "${row[@]}" --cpus "${l}" --no-floor
	done
	echo
	for d in "${OUT_DIR}"/trace/*/; do
		python3 scripts/bench/trace-stages.py "${d}" || true
	done | tee "${OUT_DIR}/trace-stages.txt"
	rm -rf "${OUT_DIR}/trace" "${OUT_DIR}/stat0" "${OUT_DIR}/stat1"
	finish
}

stripes() {
	begin
	local big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer
		--enable-sess --batch-contiguous)
	local r
	for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
		add "share${r}-write-1m-b256" --op-type write "${big[@]}"
		add "deal${r}-write-1m-b256" --op-type write "${big[@]}" --deal-stripes
	done
	finish
}

ab() {
	begin
	local row=(--op-type write --buffer-size 4096 --transfer-batch-size 256 --enable-batch-transfer
		--enable-sess --no-ceiling --shards 7 --num-data-conns 7 --spin-us 2000 --wait-spin-us 1000)
	local extra=()
	read -ra extra <<<"${EXTRA_AB:-}"
	local r b
	for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
		for b in ${BINS:-.dev/morio}; do
			BIN=${b} add "ab${r}-$(basename "${b}")" "${row[@]}" "${extra[@]}"
		done
	done
	finish
}

# archab: behaviour-preserving changes (refactors) A/B, every row from every binary in turn.
archab() {
	begin
	local big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer
		--enable-sess --batch-contiguous)
	local extra=()
	read -ra extra <<<"${EXTRA_AB:-}"
	local r b tag
	for ((r = 1; r <= ${ROUNDS:-3}; r++)); do
		for b in ${BINS:-.dev/morio}; do
			tag="r${r}-$(basename "${b}")"
			BIN=${b} add "w1m-${tag}" --op-type write "${big[@]}" "${extra[@]}"
			BIN=${b} add "r1m-${tag}" --op-type read "${big[@]}" "${extra[@]}"
			BIN=${b} add "w8b256-${tag}" --op-type write --buffer-size 8 --transfer-batch-size 256 \
				--enable-batch-transfer --enable-sess --no-ceiling "${extra[@]}"
			BIN=${b} add "w8b1-${tag}" --op-type write --buffer-size 8 --transfer-batch-size 1 \
				--no-ceiling "${extra[@]}"
		done
	done
	finish
}

# latdefault: issue 23's small rows with default settings (no spin flags) from each binary of
# BINS, interleaved ROUNDS times, beside the floor: 8 B x 64 and x 256 batches through a
# session, a single 8 B write, and 4 KiB x 256.
latdefault() {
	begin
	local r b tag
	for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
		for b in ${BINS:-.dev/morio}; do
			tag="r${r}-$(basename "${b}")"
			BIN=${b} add "d8b64-${tag}" --op-type write --buffer-size 8 --transfer-batch-size 64 \
				--enable-batch-transfer --enable-sess --no-ceiling
			BIN=${b} add "d8b256-${tag}" --op-type write --buffer-size 8 --transfer-batch-size 256 \
				--enable-batch-transfer --enable-sess --no-ceiling
			BIN=${b} add "d8b1-${tag}" --op-type write --buffer-size 8 --transfer-batch-size 1 \
				--no-ceiling
			BIN=${b} add "d4k256-${tag}" --op-type write --buffer-size 4096 --transfer-batch-size 256 \
				--enable-batch-transfer --enable-sess --no-ceiling
		done
	done
	finish
}

# pending: what stop 27 built without a GPU host, in one call (about 6-8 minutes): the GPU
# tests on CUDA, then gpuipc, latdefault (BINS: the build before and this one) and gpustage
# (1 MiB and 256 KiB slots), one round each; OUT gets one directory per sweep.
pending() {
	local out=${OUT_DIR}
	echo "=== GPU tests (CUDA, MORIO_TEST_GPU=1)"
	MORIO_TEST_GPU=1 timeout 200 .dev/engine-tests gpu --test-threads 2 2>&1 |
		grep -E "test result|panicked|FAILED" | head -20
	OUT_DIR=${out}/gpuipc ROUNDS=1 gpuipc
	OUT_DIR=${out}/latdefault ROUNDS=1 latdefault
	OUT_DIR=${out}/gpustage ROUNDS=1 SLOTS="1048576 262144" gpustage
}

# ringab: what shared-memory rings give small same-host transfers: the issue's small rows
# over TCP (same-host off), same-host with records in the socket (version 8's way) and
# through rings, default settings and with spinning shards, interleaved ROUNDS times.
ringab() {
	begin
	# Two shards per side, so the four spinning shards and the application have cores of
	# their own (16 spinning shards and the application would not).
	local spin=(--spin-us 2000 --wait-spin-us 1000 --shards 2)
	local r mode tag s
	for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
		for mode in tcp sock ring; do
			local sh=require ring=on
			case ${mode} in
			tcp) sh=off ;;
			sock) ring=off ;;
			esac
			for s in dflt spin; do
				local extra=(--no-ceiling --same-host "${sh}")
				if [[ ${s} == spin ]]; then
					extra+=("${spin[@]}")
				fi
				tag="r${r}-${mode}-${s}"
				export MORIO_SAME_HOST_RING=${ring}
				add "w8b1-${tag}" --op-type write --buffer-size 8 --transfer-batch-size 1 \
					"${extra[@]}"
				add "w8b256-${tag}" --op-type write --buffer-size 8 --transfer-batch-size 256 \
					--enable-batch-transfer --enable-sess "${extra[@]}"
				add "w4k256-${tag}" --op-type write --buffer-size 4096 --transfer-batch-size 256 \
					--enable-batch-transfer --enable-sess "${extra[@]}"
				add "w16k256-${tag}" --op-type write --buffer-size 16384 --transfer-batch-size 256 \
					--enable-batch-transfer --enable-sess "${extra[@]}"
				add "w128k256-${tag}" --op-type write --buffer-size 131072 --transfer-batch-size 256 \
					--enable-batch-transfer --enable-sess "${extra[@]}"
				unset MORIO_SAME_HOST_RING
			done
		done
	done
	finish
}

# authab: authentication's cost, every row without and with a deployment secret in turn.
authab() {
	begin
	local big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer
		--enable-sess --batch-contiguous)
	local r mode tag
	for ((r = 1; r <= ${ROUNDS:-3}; r++)); do
		for mode in off on; do
			if [[ ${mode} == on ]]; then
				export MORIO_AUTH_SECRET="morio bench deployment secret"
			else
				unset MORIO_AUTH_SECRET
			fi
			tag="r${r}-auth-${mode}"
			add "w1m-${tag}" --op-type write "${big[@]}"
			add "r1m-${tag}" --op-type read "${big[@]}"
			add "w8b1-${tag}" --op-type write --buffer-size 8 --transfer-batch-size 1 --no-ceiling
		done
	done
	unset MORIO_AUTH_SECRET
	finish
}

# hostab: the same-host transport against TCP, every row with each in turn.
hostab() {
	begin
	local big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer
		--enable-sess --batch-contiguous)
	local spin=(--spin-us 2000 --wait-spin-us 1000 --no-ceiling)
	local r mode tag
	for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
		for mode in off require; do
			tag="r${r}-${mode}"
			add "w1m-${tag}" --op-type write "${big[@]}" --same-host "${mode}"
			add "r1m-${tag}" --op-type read "${big[@]}" --same-host "${mode}"
			add "w64m-${tag}" --op-type write --buffer-size 67108864 --transfer-batch-size 1 \
				--no-ceiling --same-host "${mode}"
			add "w128k256-${tag}" --op-type write --buffer-size 131072 --transfer-batch-size 256 \
				--enable-batch-transfer --enable-sess --no-ceiling --same-host "${mode}"
			add "w128k1-${tag}" --op-type write --buffer-size 131072 --transfer-batch-size 1 \
				--no-ceiling --same-host "${mode}"
			add "w4k256-${tag}" --op-type write --buffer-size 4096 --transfer-batch-size 256 \
				--enable-batch-transfer --enable-sess "${spin[@]}" --same-host "${mode}"
			add "w8b256-${tag}" --op-type write --buffer-size 8 --transfer-batch-size 256 \
				--enable-batch-transfer --enable-sess "${spin[@]}" --same-host "${mode}"
			add "w8b1-${tag}" --op-type write --buffer-size 8 --transfer-batch-size 1 \
				"${spin[@]}" --same-host "${mode}"
			if [[ ${GPU:-0} == 1 ]]; then
				add "gw1m-${tag}" --op-type write "${big[@]}" --mem-type gpu \
					--no-ceiling --same-host "${mode}"
				add "gw64m-${tag}" --op-type write --buffer-size 67108864 \
					--transfer-batch-size 1 --mem-type gpu --no-ceiling --same-host "${mode}"
			fi
		done
	done
	finish
}

# gpuipc: GPU memory between two processes of the host, staged through host memory over TCP
# (same-host off) against device parts through CUDA IPC (same-host require), host memory
# rows as the reference, interleaved.
gpuipc() {
	begin
	local big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer
		--enable-sess --batch-contiguous --no-ceiling)
	local r mode tag
	for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
		for mode in off require; do
			tag="r${r}-${mode}"
			add "hw1m-${tag}" --op-type write "${big[@]}" --same-host "${mode}"
			add "gw1m-${tag}" --op-type write "${big[@]}" --mem-type gpu --same-host "${mode}"
			add "gr1m-${tag}" --op-type read "${big[@]}" --mem-type gpu --same-host "${mode}"
			add "gw64m-${tag}" --op-type write --buffer-size 67108864 --transfer-batch-size 1 \
				--mem-type gpu --no-ceiling --same-host "${mode}"
			add "gr64m-${tag}" --op-type read --buffer-size 67108864 --transfer-batch-size 1 \
				--mem-type gpu --no-ceiling --same-host "${mode}"
		done
	done
	finish
}

# gpustage: the GPU staging pipeline over TCP against host memory, for slot sizes SLOTS
# (default 1 MiB, 512, 256 and 128 KiB) and the default staging pool, interleaved: where
# it stalls (a chunk of one slot has no overlap between its D2H and its send, nor between its
# receive and its H2D).
gpustage() {
	begin
	local big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer
		--enable-sess --batch-contiguous --no-ceiling --same-host off)
	local r slot tag
	for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
		add "hw1m-r${r}" --op-type write "${big[@]}"
		add "hr1m-r${r}" --op-type read "${big[@]}"
		for slot in ${SLOTS:-1048576 524288 262144 131072}; do
			tag="r${r}-slot$((slot >> 10))k"
			add "gw1m-${tag}" --op-type write "${big[@]}" --mem-type gpu --gpu-slot-bytes "${slot}"
			add "gr1m-${tag}" --op-type read "${big[@]}" --mem-type gpu --gpu-slot-bytes "${slot}"
			add "gw64m-${tag}" --op-type write --buffer-size 67108864 --transfer-batch-size 1 \
				--no-ceiling --same-host off --mem-type gpu --gpu-slot-bytes "${slot}"
		done
	done
	finish
}

# scrapeab: what a 1 s metrics scrape costs the data path, every row without and with it.
scrapeab() {
	begin
	local big=(--buffer-size 1048576 --transfer-batch-size 256 --enable-batch-transfer
		--enable-sess --batch-contiguous)
	local r mode tag scrape
	for ((r = 1; r <= ${ROUNDS:-3}; r++)); do
		for mode in off on; do
			scrape=()
			[[ ${mode} == on ]] && scrape=(--scrape-ms "${SCRAPE_MS:-1000}")
			tag="r${r}-scrape-${mode}"
			add "w1m-${tag}" --op-type write "${big[@]}" "${scrape[@]}"
			add "r1m-${tag}" --op-type read "${big[@]}" "${scrape[@]}"
			add "w8b1-${tag}" --op-type write --buffer-size 8 --transfer-batch-size 1 --no-ceiling \
				"${scrape[@]}"
		done
	done
	finish
}

# ftrace: the kernel's side of the small rows (is a send dearer for morio than for the floor?).
ftrace() {
	local t=/sys/kernel/tracing
	mountpoint -q "${t}" || mount -t tracefs nodev "${t}"
	mkdir -p "${OUT_DIR}"
	local e batch
	for batch in 1 256; do
		echo 0 >"${t}/tracing_on"
		echo >"${t}/trace"
		echo 16384 >"${t}/buffer_size_kb"
		echo >"${t}/set_event"
		for e in syscalls/sys_enter_sendmsg syscalls/sys_exit_sendmsg syscalls/sys_enter_sendto \
			syscalls/sys_exit_sendto ipi/ipi_send_cpu ipi/ipi_send_cpumask io_uring/io_uring_task_add; do
			echo 1 >"${t}/events/${e}/enable"
		done
		local row=(--op-type write --buffer-size 8 --transfer-batch-size "${batch}" --no-ceiling
			--shards 2 --spin-us 2000 --wait-spin-us 1000 --iters "${ITERS}")
		((batch > 1)) && row+=(--enable-batch-transfer --enable-sess)
		echo
		echo "=== ftrace: morio bench --loopback ${row[*]}"
		echo 1 >"${t}/tracing_on"
		"${BIN}" bench --loopback "${row[@]}" --json "${OUT_DIR}/ftrace-b${batch}.json"
		echo 0 >"${t}/tracing_on"
		echo >"${t}/set_event"
		cat "${t}/trace" >"${OUT_DIR}/ftrace-b${batch}.txt"
		grep -h overrun "${t}"/per_cpu/cpu*/stats | awk '{n += $2} END {print "events lost:", n}'
		python3 scripts/bench/kernel-sends.py "${OUT_DIR}/ftrace-b${batch}.txt" | tee "${OUT_DIR}/ftrace-b${batch}-sends.txt"
		rm "${OUT_DIR}/ftrace-b${batch}.txt"
	done
}

case "${1:-}" in
ab) ab ;;
archab) archab ;;
authab) authab ;;
hostab) hostab ;;
scrapeab) scrapeab ;;
ftrace) ftrace ;;
stripes) stripes ;;
cpus) cpus ;;
build) build ;;
gpuipc) gpuipc ;;
gpustage) gpustage ;;
latdefault) latdefault ;;
pending) pending ;;
ringab) ringab ;;
trace) trace ;;
run) run ;;
tp) tp ;;
gpu) gpu ;;
lat) lat ;;
*) usage ;;
esac
