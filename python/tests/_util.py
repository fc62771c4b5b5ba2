"""Helpers shared by morio's Python tests (imported as a plain module: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time

import numpy as np
import pytest

from morio import (
    BackendType,
    EngineDesc,
    IOEngine,
    IOEngineConfig,
    StatusCode,
    TcpBackendConfig,
)

HOST = "127.0.0.1"
_keys = itertools.count()


@contextlib.contextmanager
def peer_process(target, *args):
    """Run `target(child_conn, *args)` in a spawned process; yields (parent_conn, process) and
    kills the process on the way out if it still runs. End a good run with `finish_peer`."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args), daemon=True)
    proc.start()
    try:
        yield parent, proc
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def finish_peer(parent, proc) -> None:
    """Tell a `peer_process` it is done and check it exits cleanly."""
    parent.send("done")
    proc.join(20)
    assert proc.exitcode == 0


def small_config(**kw) -> TcpBackendConfig:
    """A TCP config with few lanes (and so few shard threads) for a 2-core machine."""
    kw.setdefault("num_data_conns", 2)
    return TcpBackendConfig(**kw)


def unique_key(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{next(_keys)}"


class Engines:
    """Makes engines on 127.0.0.1 (or a given host) with ephemeral ports and closes them all at teardown."""

    def __init__(self) -> None:
        self._all: list[IOEngine] = []

    def engine(self, prefix: str = "eng", *, backend: bool = True, config=None, key=None, host=HOST) -> IOEngine:
        e = IOEngine(key or unique_key(prefix), IOEngineConfig(host=host, port=0))
        self._all.append(e)
        if backend:
            e.create_backend(BackendType.TCP, config if config is not None else small_config())
        return e

    def pair(self, prefix: str = "pair", *, config=None, config_b=None, host=HOST):
        """Two engines with TCP backends on `host`, registered with each other."""
        a = self.engine(prefix + "_a", config=config, host=host)
        b = self.engine(prefix + "_b", config=config_b if config_b is not None else config, host=host)
        a.register_remote_engine(b.get_engine_desc())
        b.register_remote_engine(a.get_engine_desc())
        return a, b

    def forget(self, e: IOEngine) -> None:
        """Stop tracking `e` (a test that drops its last reference itself)."""
        self._all.remove(e)

    def close(self) -> None:
        while self._all:
            self._all.pop().close()


def wait_done(status, timeout_s: float = 10.0):
    """Wait (bounded) for a status to leave IN_PROGRESS and return its code."""
    code = status.WaitFor(int(timeout_s * 1000))
    assert code != StatusCode.IN_PROGRESS, f"transfer still in progress after {timeout_s} s"
    return code


def wait_ok(status, timeout_s: float = 10.0) -> None:
    code = wait_done(status, timeout_s)
    assert code == StatusCode.SUCCESS, (code, status.Message())
    assert status.Succeeded()


def wait_inbound(engine, remote_key: str, uid: int, timeout_s: float = 5.0):
    """Pop the inbound status of (remote_key, uid), polling up to timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = engine.pop_inbound_transfer_status(remote_key, uid)
        if st is not None:
            return st
        time.sleep(0.001)
    raise AssertionError(f"no inbound status for ({remote_key!r}, {uid}) within {timeout_s} s")


def pattern(n: int, seed: int = 0) -> np.ndarray:
    """n bytes, all non-zero, different for each seed."""
    return ((np.arange(n, dtype=np.int64) * (2 * seed + 1) + seed) % 251 + 1).astype(np.uint8)


# --------------------------------------------------------------------------- memory kinds
# A "memory kind" makes 1-D uint8 buffers and registers them the way a user of that kind
# would: numpy through register_array, torch through register_torch_tensor.


class NumpyMem:
    name = "numpy"

    def from_numpy(self, a: np.ndarray):
        return np.array(a, dtype=np.uint8, copy=True)

    def zeros(self, n: int):
        return np.zeros(n, dtype=np.uint8)

    def register(self, engine, x):
        return engine.register_array(x)

    def host(self, x) -> np.ndarray:
        return np.array(x, copy=True)

    def copy_in(self, x, a: np.ndarray) -> None:
        x[...] = a

    def zero_(self, x) -> None:
        x[...] = 0

    def data_ptr(self, x) -> int:
        return x.ctypes.data

    def sync(self) -> None:
        pass


class TorchMem:
    def __init__(self, torch, device: str) -> None:
        self.torch = torch
        self.device = device
        self.name = "torch_" + device.split(":")[0]

    def from_numpy(self, a: np.ndarray):
        return self.torch.from_numpy(np.array(a, dtype=np.uint8, copy=True)).to(self.device)

    def zeros(self, n: int):
        return self.torch.zeros(n, dtype=self.torch.uint8, device=self.device)

    def register(self, engine, x):
        return engine.register_torch_tensor(x)

    def host(self, x) -> np.ndarray:
        return x.cpu().numpy().copy()

    def copy_in(self, x, a: np.ndarray) -> None:
        x.copy_(self.torch.from_numpy(np.array(a, dtype=np.uint8, copy=True)).to(self.device))

    def zero_(self, x) -> None:
        x.zero_()

    def data_ptr(self, x) -> int:
        return x.data_ptr()

    def sync(self) -> None:
        # Memory written by torch kernels must be complete before morio's copies read it.
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()


MEM_KINDS = ("numpy", "torch", "cuda")


def make_mem(kind: str):
    """The memory kind `kind`, or skip the test if torch / CUDA is missing."""
    if kind == "numpy":
        return NumpyMem()
    torch = pytest.importorskip("torch")
    if kind == "torch":
        return TorchMem(torch, "cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("requires a CUDA (or ROCm) GPU")
        return TorchMem(torch, "cuda:0")
    raise ValueError(kind)


# --------------------------------------------------------------------------- a silent peer


def _mp_str(s: str) -> bytes:
    b = s.encode()
    assert len(b) < 256
    return (bytes([0xA0 | len(b)]) if len(b) < 32 else bytes([0xD9, len(b)])) + b


def _mp_uint(v: int) -> bytes:
    if v < 128:
        return bytes([v])
    if v < 1 << 16:
        return b"\xcd" + v.to_bytes(2, "big")
    return b"\xce" + v.to_bytes(4, "big")


def engine_desc_bytes(key: str, host: str, port: int, pid: int = 1) -> bytes:
    """MORI's packed EngineDesc (msgpack array: key, node_id, hostname, host, port, pid)."""
    return b"\x96" + _mp_str(key) + _mp_str("node") + _mp_str("host") + _mp_str(host) + _mp_uint(port) + _mp_uint(pid)


@contextlib.contextmanager
def silent_peer(engines, op_timeout_ms: int):
    """An engine whose registered peer accepts TCP connections and never answers.

    Yields (engine, local_md, remote_md): transfers to remote_md stay IN_PROGRESS until
    op_timeout_ms passes (a real transfer that has not finished)."""
    srv = socket.socket()
    srv.bind((HOST, 0))
    srv.listen(64)
    srv.settimeout(0.05)
    conns = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except socket.timeout:
                continue
            except OSError:
                return

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        key = unique_key("silent")
        e = engines.engine("to_silent", config=small_config(num_data_conns=1, op_timeout_ms=op_timeout_ms))
        e.register_remote_engine(EngineDesc.unpack(engine_desc_bytes(key, HOST, srv.getsockname()[1])))
        # A MemoryDesc owned by `key`: made by a short-lived engine of that name.
        ghost = engines.engine(key=key, backend=False)
        rmd = ghost.register_array(np.zeros(64, np.uint8))
        ghost.close()
        lmd = e.register_array(np.zeros(64, np.uint8))
        yield e, lmd, rmd
    finally:
        stop.set()
        t.join(5)
        srv.close()
        for c in conns:
            c.close()
