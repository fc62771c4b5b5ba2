#!/usr/bin/env python3
"""The decode side of a disaggregated-serving KV-cache hand-off over morio.

It holds its own zeroed paged KV cache, listens on a side channel, and for prefill's request
allocates blocks from its own block table (other indices than prefill's), sends its engine
and memory descriptors and that table, then waits for prefill's "done". It then checks every
transfer's inbound status (``wait_inbound_transfer_status``) and every block byte for byte:
each requested block must hold prefill's pattern for the matching prefill block, and every
block it did not ask for must still be zero. Exit status 0 only if all of that holds.

    python decode.py --host 127.0.0.1 --port 47380 [--backend-numpy | --device cuda] ...
"""

from __future__ import annotations

import os
import socket
import time

import numpy as np

import kv_common as kc
from morio import BackendType, EngineDesc, IOEngine, IOEngineConfig, TcpBackendConfig

ROLE = "decode"


def listen(a) -> socket.socket:
    srv = socket.create_server((a.host, a.port))
    srv.settimeout(a.timeout)
    port = srv.getsockname()[1]
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, a.port_file)
    kc.log(ROLE, f"side channel listening on {a.host}:{port}")
    return srv


def pop_inbound(engine: IOEngine, key: str, uids: list[int], timeout: float) -> list[str]:
    """Problems with the inbound statuses of ``uids`` (empty: all SUCCESS). A status the
    engine has not recorded yet is waited for (without polling) until ``timeout``."""
    problems = []
    deadline = time.monotonic() + timeout
    for uid in uids:
        left_ms = max(0, int((deadline - time.monotonic()) * 1000))
        st = engine.wait_inbound_transfer_status(key, uid, left_ms)
        if st is None:
            problems.append(f"uid {uid}: no inbound status")
        elif not st.Succeeded():
            problems.append(f"uid {uid}: inbound {st.Code().name} {st.Message()}")
    return problems


def verify(cache: kc.KVCache, src_blocks: np.ndarray, dst_blocks: np.ndarray) -> list[str]:
    """Mismatches of the cache against prefill's pattern (empty: every byte is right)."""
    problems = []
    untouched = np.setdiff1d(np.arange(cache.num_blocks), dst_blocks)
    for layer in range(cache.layers):
        got = cache.layer_host(layer)
        want = kc.pattern(layer, src_blocks, cache.block_bytes)
        bad = np.nonzero((got[:, dst_blocks] != want).any(axis=2))
        for kv, j in zip(*bad):
            first = int(np.argmax(got[kv, dst_blocks[j]] != want[kv, j]))
            problems.append(f"layer {layer} {'KV'[kv]} block {dst_blocks[j]} (prefill block "
                            f"{src_blocks[j]}): first wrong byte at {first}")
        stray = np.nonzero(got[:, untouched].any(axis=2))
        for kv, j in zip(*stray):
            problems.append(f"layer {layer} {'KV'[kv]} block {untouched[j]} was not requested but "
                            f"is no longer zero")
    return problems


def run() -> int:
    a = kc.parse_args(ROLE)
    cache = kc.KVCache(a, a.blocks)
    engine = IOEngine(f"{ROLE}-{os.getpid()}", IOEngineConfig(a.host, 0))
    with engine:
        engine.create_backend(BackendType.TCP, TcpBackendConfig(num_data_conns=a.num_data_conns,
                                                                num_shards=a.shards))
        local = cache.register(engine)
        kc.log(ROLE, f"cache {list(cache.shape)} {a.dtype} on {cache.device}: {kc.fmt_bytes(cache.nbytes)}")

        with listen(a) as srv:
            conn, peer_addr = srv.accept()
        with conn:
            conn.settimeout(a.timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello, blobs = kc.recv_msg(conn, expect="hello")
            peer = EngineDesc.unpack(blobs["engine_desc"])
            if hello["geometry"] != kc.geometry(a):
                msg = f"cache geometry differs: prefill {hello['geometry']}, decode {kc.geometry(a)}"
                kc.send_msg(conn, {"type": "error", "message": msg})
                raise RuntimeError(msg)
            src_blocks = np.asarray(hello["src_blocks"], dtype=np.int64)
            try:
                dst_blocks = kc.block_tables(int(hello["tokens"]), a.block_size, a.blocks, a.seed + 1)
            except ValueError as e:
                kc.send_msg(conn, {"type": "error", "message": f"decode: {e}"})
                raise
            engine.register_remote_engine(peer)
            kc.log(ROLE, f"request from {peer.key} ({peer_addr[0]}): {hello['tokens']} tokens, "
                         f"prefill blocks {src_blocks[:6].tolist()}{'...' if len(src_blocks) > 6 else ''} "
                         f"-> decode blocks {dst_blocks[:6].tolist()}{'...' if len(dst_blocks) > 6 else ''}")
            t0 = time.perf_counter_ns()
            kc.send_msg(conn, {"type": "plan", "dst_blocks": dst_blocks.tolist(), "num_blocks": a.blocks},
                        {"engine_desc": engine.get_engine_desc().pack(), "mem_desc": local.pack()})
            done, _ = kc.recv_msg(conn, expect="done")
            waited = (time.perf_counter_ns() - t0) / 1e9

            problems = [] if done["ok"] else [f"prefill's transfers failed: {done['message']}"]
            problems += pop_inbound(engine, peer.key, done["uids"], timeout=5.0)
            cache.sync()
            problems += verify(cache, src_blocks, dst_blocks)
            ok = not problems
            kc.send_msg(conn, {"type": "result", "ok": ok,
                               "message": "; ".join(problems[:4]) + (" ..." if len(problems) > 4 else "")})

        engine.deregister_memory(local)

    blocks = a.layers * 2 * len(dst_blocks)
    nbytes, secs = int(done["bytes"]), float(done["seconds"])
    kc.log(ROLE, f"received {blocks} blocks ({a.layers} layers x K/V x {len(dst_blocks)}) = "
                 f"{kc.fmt_bytes(blocks * cache.block_bytes)} in {len(done['uids'])} transfers; "
                 f"prefill: {nbytes / 1e9 / secs:.2f} GB/s over {secs * 1e3:.2f} ms, "
                 f"plan-to-done here {waited * 1e3:.2f} ms")
    if not ok:
        for p in problems[:20]:
            kc.log(ROLE, f"MISMATCH: {p}")
        kc.log(ROLE, f"FAILED: {len(problems)} problem(s)")
        return 1
    kc.log(ROLE, f"OK: {blocks} blocks verified byte for byte, {len(done['uids'])} inbound statuses SUCCESS, "
                 f"{len(np.setdiff1d(np.arange(a.blocks), dst_blocks))} unrequested blocks untouched")
    return 0


if __name__ == "__main__":
    kc.main_guard(ROLE, run)
