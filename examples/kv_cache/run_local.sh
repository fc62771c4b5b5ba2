#!/usr/bin/env bash
# Run the KV-cache example on loopback: decode in the background (side channel on an
# ephemeral port), then prefill; both get the same options. Exits 0 only if both succeed.
#
#   ./run_local.sh --backend-numpy              # no torch
#   ./run_local.sh --device cuda --layers 32    # torch, CUDA caches on both sides
#
# PYTHON picks the interpreter (default python3).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=${PYTHON:-python3}
tmp=$(mktemp -d)
decode_pid=

cleanup() {
	if [[ -n ${decode_pid} ]] && kill -0 "${decode_pid}" 2>/dev/null; then
		kill "${decode_pid}" 2>/dev/null
		wait "${decode_pid}" 2>/dev/null
	fi
	rm -rf "${tmp}"
}
trap cleanup EXIT

"${py}" "${here}/decode.py" "$@" --host 127.0.0.1 --port 0 --port-file "${tmp}/port" &
decode_pid=$!

for ((i = 0; i < 600; i++)); do
	[[ -s ${tmp}/port ]] && break
	if ! kill -0 "${decode_pid}" 2>/dev/null; then
		wait "${decode_pid}"
		echo "run_local: decode exited ($?) before listening" >&2
		decode_pid=
		exit 1
	fi
	sleep 0.05
done
if [[ ! -s ${tmp}/port ]]; then
	echo "run_local: decode did not listen within 30 s" >&2
	exit 1
fi

"${py}" "${here}/prefill.py" "$@" --host 127.0.0.1 --port "$(cat "${tmp}/port")"
prefill_rc=$?

# Decode ends on its own once prefill is done (or gone); give it a few seconds.
for ((i = 0; i < 100; i++)); do
	kill -0 "${decode_pid}" 2>/dev/null || break
	sleep 0.05
done
if kill -0 "${decode_pid}" 2>/dev/null; then
	echo "run_local: decode still running 5 s after prefill; killing it" >&2
	kill "${decode_pid}"
fi
wait "${decode_pid}"
decode_rc=$?
decode_pid=

echo "run_local: prefill exit ${prefill_rc}, decode exit ${decode_rc}"
if ((prefill_rc != 0 || decode_rc != 0)); then
	exit 1
fi
exit 0
