#!/usr/bin/env bash
# Every test of the repository: the Rust workspace, then the Python package (built from
# python/ into a virtual environment, then its pytest suite). This is the README's test
# command; .ci/run calls exactly it. Needs no GPU.
#   MORIO_VENV  virtual environment to use or create (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."

# (The loom model checks, tests/loom.rs, are an ordinary test target: no special flags.)
HIP_PATH="${HIP_PATH:-/usr}" cargo test --workspace --all-targets --all-features --locked
# The engine tests once more with the same-host transport off: the run above took it for
# every pair of engines (all on this host), this one runs the same tests over TCP. One suite,
# two transports (tests that need a given transport set it themselves).
MORIO_SAME_HOST=off HIP_PATH="${HIP_PATH:-/usr}" \
  cargo test --workspace --all-features --locked --test engine
# And once with same-host records in the socket instead of shared-memory rings (how a
# version 8 peer is served), so all three paths run every engine test; this run's shards also
# busy-poll after their work (the default on hosts of 8 CPUs or more, off on small ones).
MORIO_SAME_HOST_RING=off MORIO_BUSY_POLL_US=100 HIP_PATH="${HIP_PATH:-/usr}" \
  cargo test --workspace --all-features --locked --test engine
# With express writes off (read once per process), a dead ring lane's port is closed by the
# lane itself, not through its express port: the test of that alone.
MORIO_EXPRESS=0 HIP_PATH="${HIP_PATH:-/usr}" \
  cargo test --workspace --all-features --locked --test engine dying_write

venv="${MORIO_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
venv="$(cd "$venv" && pwd)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements-test.txt
# Build the extension the way a user's `pip install ./python` does, without re-downloading
# the build backend (it is in the venv already).
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pip install -q --disable-pip-version-check \
  --no-build-isolation ./python
"$venv/bin/python" -m pytest -q python/tests
