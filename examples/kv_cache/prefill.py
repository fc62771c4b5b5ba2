#!/usr/bin/env python3
"""The prefill side of a disaggregated-serving KV-cache hand-off over morio.

It holds a paged KV cache [layers, 2, blocks, block_size, heads, head_dim] filled with a
deterministic pattern, connects to decode's side channel, swaps descriptors and block tables
with it, then pushes the request's blocks into decode's cache: one ``session.batch_write`` per
layer (K and V blocks of that layer, offsets from numpy int64 arrays), ``wait_all``, and a
"done" message with the transfer uids. Decode verifies and answers; the exit status is 0 only
if every transfer succeeded and decode found every byte where it belongs.

    python prefill.py --host 127.0.0.1 --port 47380 [--backend-numpy | --device cuda] ...
"""

from __future__ import annotations

import os
import time

import numpy as np

import kv_common as kc
from morio import BackendType, EngineDesc, IOEngine, IOEngineConfig, MemoryDesc, StatusCode, TcpBackendConfig

ROLE = "prefill"


def fill(cache: kc.KVCache) -> None:
    for layer in range(cache.layers):
        cache.set_layer(layer, kc.pattern(layer, np.arange(cache.num_blocks), cache.block_bytes))
    cache.sync()


def run() -> int:
    a = kc.parse_args(ROLE)
    sock = kc.connect(a.host, a.port, a.timeout)
    with sock:
        try:
            return transfer(a, sock)
        except Exception as e:
            try:  # let decode stop waiting (it may be the one that reported the error)
                kc.send_msg(sock, {"type": "error", "message": f"prefill: {e}"})
            except OSError:
                pass
            raise


def transfer(a, sock) -> int:
    cache = kc.KVCache(a, a.blocks)
    tokens = a.tokens if a.tokens is not None else max(1, a.blocks * 3 // 4) * a.block_size
    src_blocks = kc.block_tables(tokens, a.block_size, a.blocks, a.seed)
    fill(cache)
    if a.corrupt:  # tests: one wrong byte in the last layer's first V block, sent as is
        data = cache.layer_host(a.layers - 1).copy()
        data[1, src_blocks[0], 0] ^= 0xFF
        cache.set_layer(a.layers - 1, data)
        cache.sync()
    kc.log(ROLE, f"cache {list(cache.shape)} {a.dtype} on {cache.device}: {kc.fmt_bytes(cache.nbytes)}, "
                 f"request of {tokens} tokens in {len(src_blocks)} blocks")

    engine = IOEngine(f"{ROLE}-{os.getpid()}", IOEngineConfig(a.host, 0))
    with engine:
        engine.create_backend(BackendType.TCP, TcpBackendConfig(num_data_conns=a.num_data_conns,
                                                                num_shards=a.shards))
        local = cache.register(engine)

        kc.send_msg(sock, {"type": "hello", "geometry": kc.geometry(a), "num_blocks": a.blocks,
                           "tokens": tokens, "src_blocks": src_blocks.tolist()},
                    {"engine_desc": engine.get_engine_desc().pack(), "mem_desc": local.pack()})
        plan, blobs = kc.recv_msg(sock, expect="plan")
        peer = EngineDesc.unpack(blobs["engine_desc"])
        remote = MemoryDesc.unpack(blobs["mem_desc"])
        dst_blocks = np.asarray(plan["dst_blocks"], dtype=np.int64)
        dst_num_blocks = int(plan["num_blocks"])
        need = 2 * a.layers * dst_num_blocks * cache.block_bytes
        if remote.size < need:
            raise RuntimeError(f"decode registered {remote.size} bytes, its cache needs {need}")
        if len(dst_blocks) != len(src_blocks):
            raise RuntimeError(f"decode allocated {len(dst_blocks)} blocks for {len(src_blocks)}")
        engine.register_remote_engine(peer)
        # Every connection up before the clock starts (and a refusing peer is an error here).
        engine.connect_remote_engine(peer.key, timeout_ms=int(a.timeout * 1000))
        sess = engine.create_session(local, remote)
        if sess is None:
            raise RuntimeError("create_session returned None (no backend)")

        # Offsets of every (layer, K/V, block) of the request: prefill's index on this side,
        # decode's on the other (decode's cache may hold another number of blocks).
        plans = [(cache.offsets(layer, src_blocks),
                  kc.block_offsets(layer, dst_blocks, dst_num_blocks, cache.block_bytes))
                 for layer in range(a.layers)]
        sizes = np.full(2 * len(src_blocks), cache.block_bytes, dtype=np.int64)

        statuses, uids = [], []
        t0 = time.perf_counter_ns()
        for _ in range(a.rounds):
            for loc, rem in plans:  # one batch per layer, as a layer-wise connector sends them
                uid = sess.allocate_transfer_uid()
                statuses.append(sess.batch_write(loc, rem, sizes, uid))
                uids.append(uid)
        t_submit = time.perf_counter_ns()
        engine.wait_all(statuses, timeout_ms=int(a.timeout * 1000))
        t1 = time.perf_counter_ns()

        failed = [(u, s) for u, s in zip(uids, statuses) if s.Code() != StatusCode.SUCCESS]
        nbytes = a.rounds * a.layers * 2 * len(src_blocks) * cache.block_bytes
        secs = (t1 - t0) / 1e9
        msg = "; ".join(f"uid {u}: {s.Code().name} {s.Message()}" for u, s in failed[:4])
        kc.send_msg(sock, {"type": "done", "uids": uids, "ok": not failed, "message": msg,
                           "bytes": nbytes, "seconds": secs})
        result, _ = kc.recv_msg(sock, expect="result")
        engine.deregister_memory(local)
        path = kc.path_taken(engine)

    blocks = a.layers * 2 * len(src_blocks)
    kc.log(ROLE, f"wrote {blocks} blocks ({a.layers} layers x K/V x {len(src_blocks)}) x {a.rounds} round(s) "
                 f"= {kc.fmt_bytes(nbytes)} in {len(uids)} batch_write calls: "
                 f"submit {(t_submit - t0) / 1e3:.0f} us, total {secs * 1e3:.2f} ms, "
                 f"{nbytes / 1e9 / secs:.2f} GB/s ({path})")
    if failed:
        kc.log(ROLE, f"FAILED: {len(failed)} of {len(uids)} transfers: {msg}")
        return 1
    if not result.get("ok"):
        kc.log(ROLE, f"FAILED: decode reports: {result.get('message')}")
        return 1
    kc.log(ROLE, "OK: decode verified every block")
    return 0


if __name__ == "__main__":
    kc.main_guard(ROLE, run)
