"""Shared by prefill.py and decode.py: the options, the paged KV cache (torch tensor or numpy
array), the deterministic pattern the prefill side fills it with, and the side channel's
length-prefixed messages (JSON header + raw bytes, nothing beyond the standard library).

Cache layout, one tensor per side:

    [num_layers, 2 (K/V), num_blocks, block_size, num_heads, head_dim]

so the bytes of block ``b`` of ``(layer, kv)`` are one contiguous run of ``block_bytes`` at

    ((layer * 2 + kv) * num_blocks + b) * block_bytes

which is what the offsets of every ``batch_write`` are made of.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time
from typing import Any, Optional

import numpy as np

DTYPES = ("float16", "bfloat16", "float32", "uint8")
DEFAULT_PORT = 47380


# --------------------------------------------------------------------------- options


def parse_args(role: str, argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Both scripts take the same options (so one command line drives both); each uses what
    applies to it."""
    p = argparse.ArgumentParser(
        prog=f"{role}.py",
        description=f"KV-cache transfer example over morio: the {role} side.",
    )
    p.add_argument("--host", default="127.0.0.1",
                   help="address of decode's side channel and of both engines (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"decode's side-channel port (default {DEFAULT_PORT}; decode: 0 picks one, "
                        "see --port-file)")
    p.add_argument("--port-file", help="decode: write the side-channel port to this file once listening")
    p.add_argument("--device", default="cpu", help="torch device of the cache: cpu, cuda or cuda:N")
    p.add_argument("--backend-numpy", action="store_true",
                   help="hold the cache in a numpy array (CPU, no torch needed)")
    p.add_argument("--dtype", default="float16", choices=DTYPES, help="element type (default float16)")
    p.add_argument("--layers", type=int, default=4, help="model layers (default 4)")
    p.add_argument("--blocks", type=int, default=64, help="blocks in this side's cache (default 64)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    p.add_argument("--heads", type=int, default=8, help="KV heads (default 8)")
    p.add_argument("--head-dim", type=int, default=64, help="head dimension (default 64)")
    p.add_argument("--tokens", type=int, default=None,
                   help="prefill: prompt tokens whose KV is sent (default: 3/4 of --blocks' tokens)")
    p.add_argument("--rounds", type=int, default=1,
                   help="prefill: send the request's blocks this many times (for a steadier GB/s)")
    p.add_argument("--seed", type=int, default=7, help="seed of the block tables (default 7)")
    p.add_argument("--num-data-conns", type=int, default=8, help="TCP lanes per peer (default 8)")
    p.add_argument("--shards", type=int, default=None, help="engine shards (default: the engine's choice)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the peer (default 60)")
    p.add_argument("--corrupt", action="store_true", help=argparse.SUPPRESS)  # tests: break one byte
    a = p.parse_args(argv)
    for name in ("layers", "blocks", "block_size", "heads", "head_dim", "rounds", "num_data_conns"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.tokens is not None and a.tokens < 1:
        p.error("--tokens must be at least 1")
    if a.backend_numpy and a.device != "cpu":
        p.error("--backend-numpy holds the cache in host memory: drop --device")
    if a.backend_numpy and a.dtype == "bfloat16":
        p.error("numpy has no bfloat16: pick --dtype float16, float32 or uint8")
    if not a.backend_numpy:
        try:
            import torch  # noqa: F401
        except ImportError:
            if a.device != "cpu":
                p.error(f"--device {a.device} needs torch, which is not installed")
            if a.dtype == "bfloat16":
                p.error("torch is not installed and numpy has no bfloat16")
            log(role, "torch is not installed: using numpy arrays (as --backend-numpy)")
            a.backend_numpy = True
    return a


def path_taken(engine) -> str:
    """How this engine's lanes carried the bytes: TCP or the same-host transport, and for GPU
    memory whether it moved device to device (CUDA IPC) or was staged through host memory."""
    shards = engine.stats()
    total = {k: sum(s[k] for s in shards)
             for k in ("lane_connects", "lane_connects_same_host", "gpu_ipc_bytes", "gpu_staged_bytes")}
    lanes = "same host" if total["lane_connects"] and \
        total["lane_connects_same_host"] == total["lane_connects"] else "TCP"
    if total["gpu_ipc_bytes"] and not total["gpu_staged_bytes"]:
        return f"{lanes}, GPU memory device to device"
    if total["gpu_staged_bytes"]:
        return f"{lanes}, GPU memory staged through host memory"
    return lanes


def log(role: str, msg: str) -> None:
    print(f"[{role}] {msg}", flush=True)


def geometry(a: argparse.Namespace) -> dict[str, Any]:
    """What both caches must agree on (block count aside)."""
    return {
        "layers": a.layers,
        "block_size": a.block_size,
        "heads": a.heads,
        "head_dim": a.head_dim,
        "dtype": a.dtype,
    }


# --------------------------------------------------------------------------- the cache


def block_offsets(layer: int, block_ids: np.ndarray, num_blocks: int, block_bytes: int) -> np.ndarray:
    """Byte offsets (int64) of the K blocks then the V blocks ``block_ids`` of ``layer`` in a
    cache of ``num_blocks`` blocks per (layer, K/V)."""
    kv = np.arange(2, dtype=np.int64)[:, None]
    ids = np.asarray(block_ids, dtype=np.int64)[None, :]
    return (((layer * 2 + kv) * num_blocks + ids) * block_bytes).ravel()


class KVCache:
    """One side's paged KV cache, zero-filled, as a torch tensor or a numpy array."""

    def __init__(self, a: argparse.Namespace, num_blocks: int):
        self.layers = a.layers
        self.num_blocks = num_blocks
        self.shape = (a.layers, 2, num_blocks, a.block_size, a.heads, a.head_dim)
        self.numpy = a.backend_numpy
        if self.numpy:
            self.tensor = np.zeros(self.shape, dtype=np.dtype(a.dtype))
            self.itemsize = self.tensor.itemsize
            self.device = "cpu (numpy)"
        else:
            import torch

            self.torch = torch
            dev = torch.device(a.device)
            if dev.type == "cuda":
                if not torch.cuda.is_available():
                    raise SystemExit(f"--device {a.device}: CUDA is not available to torch")
                if dev.index is not None:
                    torch.cuda.set_device(dev)
            self.tensor = torch.zeros(self.shape, dtype=getattr(torch, a.dtype), device=dev)
            self.itemsize = self.tensor.element_size()
            self.device = f"{self.tensor.device} (torch)"
        self.block_bytes = a.block_size * a.heads * a.head_dim * self.itemsize
        self.nbytes = self.block_bytes * 2 * num_blocks * a.layers

    def offsets(self, layer: int, block_ids: np.ndarray) -> np.ndarray:
        return block_offsets(layer, block_ids, self.num_blocks, self.block_bytes)

    def _layer_u8(self, layer: int):
        """The layer as uint8 [2, num_blocks, block_bytes], sharing the cache's memory."""
        t = self.tensor[layer]
        if self.numpy:
            return t.view(np.uint8).reshape(2, self.num_blocks, self.block_bytes)
        return t.view(self.torch.uint8).reshape(2, self.num_blocks, self.block_bytes)

    def set_layer(self, layer: int, data: np.ndarray) -> None:
        """Overwrite a layer with uint8 [2, num_blocks, block_bytes] host data."""
        dst = self._layer_u8(layer)
        if self.numpy:
            dst[...] = data
        else:
            dst.copy_(self.torch.from_numpy(np.ascontiguousarray(data)))

    def layer_host(self, layer: int) -> np.ndarray:
        """The layer's bytes as a host numpy uint8 [2, num_blocks, block_bytes] array."""
        v = self._layer_u8(layer)
        return v if self.numpy else v.cpu().numpy()

    def sync(self) -> None:
        """Let copies into a CUDA cache finish before the engine reads it."""
        if not self.numpy and self.tensor.is_cuda:
            self.torch.cuda.synchronize(self.tensor.device)

    def register(self, engine):
        if self.numpy:
            return engine.register_array(self.tensor)
        return engine.register_torch_tensor(self.tensor)


# --------------------------------------------------------------------------- the pattern


def _mix(x: np.ndarray) -> np.ndarray:
    """A 64-bit finalizer (splitmix64's), in place on a uint64 array."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def pattern(layer: int, block_ids: np.ndarray, block_bytes: int) -> np.ndarray:
    """uint8 [2, len(block_ids), block_bytes]: the bytes prefill's blocks ``block_ids`` of
    ``layer`` hold (K then V). Every byte depends on (layer, K/V, prefill block id, byte
    index), so a block landing at the wrong index, a K/V swap or a shifted copy all show."""
    kv = np.arange(2, dtype=np.uint64)[:, None, None]
    ids = np.asarray(block_ids, dtype=np.uint64)[None, :, None]
    i = np.arange(block_bytes, dtype=np.uint64)[None, None, :]
    tag = (np.uint64(layer) * np.uint64(2) + kv) << np.uint64(48)
    x = tag + (ids << np.uint64(24)) + i
    return (_mix(x) >> np.uint64(56)).astype(np.uint8)


def block_tables(num_tokens: int, block_size: int, num_blocks: int, seed: int) -> np.ndarray:
    """A request's block table: ceil(tokens / block_size) distinct blocks, scattered over
    the cache as a paged allocator hands them out."""
    n = -(-num_tokens // block_size)
    if n > num_blocks:
        raise ValueError(f"{num_tokens} tokens need {n} blocks of {block_size}, the cache has {num_blocks}")
    return np.random.default_rng(seed).permutation(num_blocks)[:n].astype(np.int64)


# --------------------------------------------------------------------------- side channel

_HEAD = struct.Struct("!4sII")  # magic, header bytes, payload bytes
_MAGIC = b"KVX1"


def send_msg(sock: socket.socket, header: dict[str, Any], blobs: Optional[dict[str, bytes]] = None) -> None:
    """One message: a JSON header and named binary blobs (packed descriptors)."""
    blobs = blobs or {}
    h = dict(header, _blobs=[[k, len(v)] for k, v in blobs.items()])
    hb = json.dumps(h).encode()
    payload = b"".join(blobs.values())
    sock.sendall(_HEAD.pack(_MAGIC, len(hb), len(payload)) + hb + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError(f"peer closed the side channel ({len(buf)} of {n} bytes)")
        buf += chunk
    return bytes(buf)


def recv_msg(sock: socket.socket, expect: Optional[str] = None) -> tuple[dict[str, Any], dict[str, bytes]]:
    magic, hlen, plen = _HEAD.unpack(_recv_exact(sock, _HEAD.size))
    if magic != _MAGIC:
        raise ConnectionError(f"not a kv_cache side channel (magic {magic!r})")
    header = json.loads(_recv_exact(sock, hlen))
    payload = _recv_exact(sock, plen)
    blobs, off = {}, 0
    for name, n in header.pop("_blobs", []):
        blobs[name] = payload[off:off + n]
        off += n
    if header.get("type") == "error":
        raise RuntimeError(f"peer reported an error: {header.get('message')}")
    if expect is not None and header.get("type") != expect:
        raise RuntimeError(f"expected a {expect!r} message, got {header.get('type')!r}")
    return header, blobs


def connect(host: str, port: int, timeout: float) -> socket.socket:
    """Connect to decode, retrying until it listens or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = socket.create_connection((host, port), timeout=timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except (ConnectionRefusedError, OSError) as e:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"cannot reach decode at {host}:{port}: {e}") from e
            time.sleep(0.05)


def fmt_bytes(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def main_guard(role: str, fn) -> None:
    """Run ``fn`` and exit with its code; errors print one line and exit 1."""
    try:
        code = fn()
    except KeyboardInterrupt:
        code = 130
    except (RuntimeError, ConnectionError, ValueError, OSError) as e:
        log(role, f"FAILED: {e}")
        code = 1
    sys.stdout.flush()
    sys.exit(code)
