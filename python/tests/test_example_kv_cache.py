"""The KV-cache example (examples/kv_cache) end to end: decode and prefill as two processes on
loopback through run_local.sh, numpy caches (no torch)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kv_cache"
SMALL = ["--backend-numpy", "--layers", "2", "--blocks", "24", "--heads", "4", "--head-dim", "32",
         "--num-data-conns", "2", "--shards", "1", "--timeout", "20"]


def run_local(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(EXAMPLE / "run_local.sh"), *SMALL, *args],
                          capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


def test_kv_cache_example_numpy():
    r = run_local("--dtype", "float16", "--tokens", "300")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    # 300 tokens in blocks of 16: 19 blocks, x 2 layers x K/V.
    assert "[prefill] OK: decode verified every block" in out, out
    assert "[decode] OK: 76 blocks verified byte for byte, 2 inbound statuses SUCCESS, " \
           "5 unrequested blocks untouched" in out, out
    assert "run_local: prefill exit 0, decode exit 0" in out, out
    # The prefill says which transport carried the bytes: two processes of this host take the
    # same-host transport where it is available, else TCP.
    import morio
    path = "(TCP)" if morio.same_host_unavailable() else "(same host)"
    assert path in out, out


def test_kv_cache_example_detects_corruption():
    r = run_local("--dtype", "uint8", "--corrupt")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "[decode] MISMATCH: layer 1 V block" in out, out
    assert "[prefill] FAILED: decode reports:" in out, out
