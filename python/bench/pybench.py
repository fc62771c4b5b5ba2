#!/usr/bin/env python3
"""pybench: morio's Python-side benchmark, the Python counterpart of `morio bench --loopback`.

An initiator and a target engine run in this one process over loopback (shards on disjoint
CPU halves, as `morio bench --loopback` places its two processes), and the initiator's Python
thread drives a session over the target's buffer. Rows:

  a  MsgSize x BatchSize (default 1 MiB x 256) batch write and read: one
     `sess.batch_write` / `sess.batch_read` of BatchSize segments per iteration, offsets
     from numpy int64 arrays, strided (i*(size+1), morio bench's and MORI's default) or
     contiguous (--batch-contiguous); timed from the call to the end of `Wait()`.
  b  single small write latency (default 8 B): `sess.write(...)` + `Wait()` per iteration.
  c  submission cost of a big batch (default 65,536 x 8 B) from numpy int64 arrays: the time
     of the `sess.batch_write(...)` call alone, then of its `Wait()`; also with Python lists
     (--sub-list).

Memory: host (numpy arrays, or torch CPU tensors with --cpu-array torch) or CUDA tensors
(--mem-type gpu, torch). Numbers follow MORI's table (TotalSize MB = size*batch/1e6, BW in
GB/s with GB = 1e9, Min/Avg Lat in us per batch iteration) plus p50/p99 (the same
percentile definition as hdrhistogram's value_at_quantile). Every row's bytes are checked once,
after it ran (the destination is scrambled before the row, as morio bench does).

    python bench/pybench.py                                  # all rows, numpy host memory
    python bench/pybench.py --mem-type gpu --json out.json   # CUDA tensors on both sides
    python bench/pybench.py --rows b --lat-iters 10000 --shards 2 --spin-us 2000 --wait-spin-us 1000

`--json` writes morio bench's report layout (rows with the same keys), so
`morio bench --summarize pybench.json morio.json` lays both side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Optional

import numpy as np

import morio
from morio import BackendType, EngineDesc, IOEngine, IOEngineConfig, MemoryDesc, StatusCode, TcpBackendConfig

TITLE = "TCP Benchmark (morio, Python): Initiator"
INITIATOR_SEED = 0x1A171A7000000001
TARGET_SEED = 0x7A59E7000000002


# --------------------------------------------------------------------------- options


def parse_size(s: str) -> int:
    """morio bench's sizes: 4096, 64K, 1MiB, 1GB (K/M/G and KiB/MiB/GiB are binary)."""
    t = s.strip()
    i = len(t) - len(t.lstrip("0123456789"))
    num, unit = t[:i], t[i:].strip().lower()
    mul = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30,
           "gib": 1 << 30, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3}.get(unit)
    if not num or mul is None:
        raise argparse.ArgumentTypeError(f"bad size {s!r}")
    return int(num) * mul


def parse_cpus(s: str) -> list[int]:
    """morio bench's CPU lists: 0-7 or 0,2,4 (distinct)."""
    out: list[int] = []
    for part in s.split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if a > b:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad CPU list {s!r}") from None
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"CPU list {s!r} repeats a CPU")
    return out


def format_cpus(c: Optional[list[int]]) -> str:
    if not c:
        return "unpinned"
    parts, i = [], 0
    while i < len(c):
        j = i
        while j + 1 < len(c) and c[j + 1] == c[j] + 1:
            j += 1
        parts.append(f"{c[i]}-{c[j]}" if j > i else str(c[i]))
        i = j + 1
    return ",".join(parts)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("rows")
    g.add_argument("--rows", default="a,b,c", help="which rows: a (batch BW), b (single latency), c (submission)")
    g.add_argument("--ops", default="write,read", help="directions of rows a")
    g.add_argument("--buffer-size", type=parse_size, default=1 << 20, help="rows a: bytes per segment")
    g.add_argument("--transfer-batch-size", type=int, default=256, help="rows a: segments per batch")
    g.add_argument("--batch-contiguous", action="store_true",
                   help="contiguous offsets i*size instead of strided i*(size+1) (rows a and c)")
    g.add_argument("--iters", type=int, default=128, help="rows a: timed iterations")
    g.add_argument("--warmup", type=int, default=None,
                   help="untimed iterations before each row (default max(2, its iterations/16))")
    g.add_argument("--lat-size", type=parse_size, default=8, help="row b: bytes per write")
    g.add_argument("--lat-iters", type=int, default=1000, help="row b: timed iterations")
    g.add_argument("--sub-batch", type=int, default=65536, help="row c: segments per batch")
    g.add_argument("--sub-size", type=parse_size, default=8, help="row c: bytes per segment")
    g.add_argument("--sub-reps", type=int, default=50, help="row c: timed repetitions")
    g.add_argument("--sub-list", action="store_true", help="row c: also submit from Python lists")
    g = p.add_argument_group("memory")
    g.add_argument("--mem-type", choices=("cpu", "gpu"), default="cpu", help="memory of both buffers")
    g.add_argument("--initiator-mem-type", choices=("cpu", "gpu"), help="initiator's (default --mem-type)")
    g.add_argument("--target-mem-type", choices=("cpu", "gpu"), help="target's (default --mem-type)")
    g.add_argument("--cpu-array", choices=("numpy", "torch"), default="numpy",
                   help="what holds host memory (torch: CPU tensors)")
    g.add_argument("--gpu-device", type=int, default=0, help="CUDA device of GPU buffers")
    g.add_argument("--gpu-staging-bytes", type=parse_size, help="pinned GPU staging per engine")
    g.add_argument("--gpu-slot-bytes", type=parse_size, help="GPU staging slot size")
    g = p.add_argument_group("engines (morio bench's knobs)")
    g.add_argument("--host", default="127.0.0.1", help="address both engines listen on")
    g.add_argument("--num-data-conns", type=int, default=8, help="lanes per peer, 1..=16")
    g.add_argument("--striping-threshold-bytes", type=parse_size, default=65536)
    g.add_argument("--shards", type=int, help="shards per engine (default: half the CPUs, at most one per lane)")
    g.add_argument("--cpus", type=parse_cpus, help="CPUs split between the engines (default: this process's)")
    g.add_argument("--initiator-cpus", type=parse_cpus, help="the initiator's shard CPUs (overrides the split)")
    g.add_argument("--target-cpus", type=parse_cpus, help="the target's shard CPUs (overrides the split)")
    g.add_argument("--no-pin", action="store_true", help="do not pin shards")
    g.add_argument("--target-process", action="store_true",
                   help="run the target engine in a child process (as morio bench --loopback does), "
                        "not beside the initiator in this one")
    g.add_argument("--app-cpu", type=int, help="pin this (the submitting) Python thread to one CPU")
    g.add_argument("--chunk-bytes", type=parse_size, help="largest chunk per frame (default 1 MiB)")
    g.add_argument("--deal-stripes", action="store_true", help="deal striped writes' stripes round-robin")
    g.add_argument("--spin-us", type=int, help="shards busy-poll this long before parking")
    g.add_argument("--wait-spin-us", type=int, help="Wait() spins this long before sleeping (morio default 50)")
    g = p.add_argument_group("output")
    g.add_argument("--no-validate", action="store_true", help="skip the byte check of each row")
    g.add_argument("--json", metavar="PATH", help="write the report here (morio bench's layout)")
    a = p.parse_args(argv)
    a.rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    a.ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    if not set(a.rows) <= {"a", "b", "c"} or not a.rows:
        p.error("--rows takes a comma list of a, b, c")
    if not set(a.ops) <= {"write", "read"} or not a.ops:
        p.error("--ops takes a comma list of write, read")
    for k in ("transfer_batch_size", "iters", "lat_iters", "sub_batch", "sub_reps", "buffer_size",
              "lat_size", "sub_size"):
        if getattr(a, k) < 1:
            p.error(f"--{k.replace('_', '-')} must be at least 1")
    if a.warmup is not None and a.warmup < 0:
        p.error("--warmup must be >= 0")
    if a.shards is not None and a.shards < 1:
        p.error("--shards must be at least 1")
    if a.no_pin and (a.cpus or a.initiator_cpus or a.target_cpus):
        p.error("--cpus pins shards; drop --no-pin")
    a.initiator_mem_type = a.initiator_mem_type or a.mem_type
    a.target_mem_type = a.target_mem_type or a.mem_type
    return a


# --------------------------------------------------------------------------- buffers


class Buffer:
    """One side's registered buffer: a numpy array, or a torch tensor on the CPU or a GPU."""

    def __init__(self, engine: IOEngine, n: int, mem: str, cpu_array: str, gpu_device: int):
        self.mem, self.n = mem, n
        if mem == "cpu" and cpu_array == "numpy":
            self.kind = "numpy"
            self.arr = np.zeros(n, dtype=np.uint8)
            self.desc = engine.register_array(self.arr)
        else:
            try:
                import torch
            except ImportError:
                sys.exit(f"pybench: {'--mem-type gpu' if mem == 'gpu' else '--cpu-array torch'} needs torch")
            self.torch = torch
            dev = torch.device("cpu") if mem == "cpu" else torch.device("cuda", gpu_device)
            self.kind = "torch-cpu" if mem == "cpu" else f"torch-{dev}"
            self.arr = torch.zeros(n, dtype=torch.uint8, device=dev)
            self.desc = engine.register_torch_tensor(self.arr)

    def fill(self, seed: int, start: int, n: int) -> None:
        """Bytes [start, start+n) := a pseudo-random pattern that depends only on seed."""
        data = np.frombuffer(np.random.default_rng(seed % (1 << 63)).bytes(n), dtype=np.uint8)
        if self.kind == "numpy":
            self.arr[start:start + n] = data
        else:
            self.arr[start:start + n].copy_(self.torch.from_numpy(data.copy()))
            if self.arr.is_cuda:
                self.torch.cuda.synchronize(self.arr.device)

    def segments(self, size: int, batch: int, contiguous: bool) -> np.ndarray:
        """The row's segments as a host array [batch, size] (a view for host numpy memory)."""
        stride = size if contiguous else size + 1
        v = self.arr[:batch * stride].reshape(batch, stride)[:, :size]
        if self.kind == "numpy":
            return v
        return v.cpu().numpy()


def offsets(size: int, batch: int, contiguous: bool) -> np.ndarray:
    stride = size if contiguous else size + 1
    return np.arange(batch, dtype=np.int64) * stride


def extent(size: int, batch: int, contiguous: bool) -> int:
    return (batch - 1) * (size if contiguous else size + 1) + size


# --------------------------------------------------------------------------- statistics


def quantile(sorted_ns: list[int], q: float) -> int:
    """hdrhistogram's value_at_quantile: the smallest value with at least q of the counts at
    or below it."""
    return sorted_ns[max(0, math.ceil(q * len(sorted_ns)) - 1)]


def row_stats(op: str, size: int, batch: int, durs_ns: list[int]) -> dict[str, Any]:
    """MORI's formulas (as morio bench's RowStats), durations in ns per batch iteration."""
    s = sorted(durs_ns)
    n = len(s)
    mean_s = sum(s) / n / 1e9
    min_s = s[0] / 1e9
    mb = size * batch / 1e6
    return {
        "op": op,
        "msg_size": size,
        "batch_size": batch,
        "iters": n,
        "total_size_mb": mb,
        "max_bw_gbps": mb / 1e3 / min_s,
        "avg_bw_gbps": mb / 1e3 / mean_s,
        "min_lat_us": min_s * 1e6,
        "avg_lat_us": mean_s * 1e6,
        "p50_us": quantile(s, 0.5) / 1e3,
        "p99_us": quantile(s, 0.99) / 1e3,
        "p999_us": quantile(s, 0.999) / 1e3,
        "max_lat_us": s[-1] / 1e3,
        "avg_over_ceiling": None,
        "floor": None,
        "p50_over_floor": None,
        "validated": False,
        "durations_us": [d / 1e3 for d in durs_ns],
    }


def brief(durs_ns: list[int]) -> dict[str, float]:
    s = sorted(durs_ns)
    return {"min_us": s[0] / 1e3, "p50_us": quantile(s, 0.5) / 1e3, "p99_us": quantile(s, 0.99) / 1e3,
            "avg_us": sum(s) / len(s) / 1e3, "max_us": s[-1] / 1e3}


# --------------------------------------------------------------------------- the bench


class Bench:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        if a.wait_spin_us is not None:
            morio.set_wait_spin_us(a.wait_spin_us)
        icpus, tcpus, unpin = self.split()
        self.cpus = (icpus, tcpus)
        self.initiator = self.engine("pybench-initiator", icpus, unpin)
        self.blen = self.buffer_len()
        self.child: Any = None
        if a.target_process:
            self.target, self.tbuf = self.spawn_target(tcpus, unpin)
        else:
            self.target = self.engine("pybench-target", tcpus, unpin)
        # Descriptors cross as bytes, as they would between processes.
        tdesc = EngineDesc.unpack(self.target.get_engine_desc().pack())
        self.initiator.register_remote_engine(tdesc)
        self.target.register_remote_engine(EngineDesc.unpack(self.initiator.get_engine_desc().pack()))
        if a.app_cpu is not None:
            os.sched_setaffinity(0, {a.app_cpu})

        self.ibuf = Buffer(self.initiator, self.blen, a.initiator_mem_type, a.cpu_array, a.gpu_device)
        if not a.target_process:
            self.tbuf = Buffer(self.target, self.blen, a.target_mem_type, a.cpu_array, a.gpu_device)
        if not a.no_validate:
            self.ibuf.fill(INITIATOR_SEED, 0, self.blen)
            self.tbuf.fill(TARGET_SEED, 0, self.blen)
        remote = MemoryDesc.unpack(self.tbuf.desc.pack())
        sess = self.initiator.create_session(self.ibuf.desc, remote)
        if sess is None:
            raise SystemExit("pybench: create_session returned None")
        self.sess = sess
        self.rows: list[dict[str, Any]] = []

    def spawn_target(self, cpus: Optional[list[int]], unpin: bool) -> tuple[Any, Any]:
        """The target engine and buffer in a child process, driven over a pipe."""
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        mine, theirs = ctx.Pipe()
        self.child = ctx.Process(target=_target_main, args=(theirs, vars(self.a), cpus, unpin, self.blen),
                                 daemon=True)
        self.child.start()
        proxy = _TargetProxy(mine)
        return proxy, proxy

    def split(self) -> tuple[Optional[list[int]], Optional[list[int]], bool]:
        """(initiator CPUs, target CPUs, unpinned) as `morio bench --loopback` splits them."""
        a = self.a
        if a.no_pin:
            return None, None, True
        if a.initiator_cpus or a.target_cpus:
            return a.initiator_cpus, a.target_cpus, False
        pool = a.cpus or sorted(os.sched_getaffinity(0))
        per = a.shards or max(1, min(len(pool) // 2, a.num_data_conns))
        if len(pool) < 2 * per:
            print(f"pybench: {len(pool)} CPUs cannot give each side {per} of its own; running both unpinned",
                  file=sys.stderr)
            return None, None, True
        return pool[:per], pool[per:2 * per], False

    def engine(self, key: str, cpus: Optional[list[int]], unpin: bool) -> IOEngine:
        a = self.a
        kw: dict[str, Any] = dict(num_data_conns=a.num_data_conns, striping_threshold_bytes=a.striping_threshold_bytes,
                                  pin_shards=not unpin, spin_us=a.spin_us or 0)
        if cpus:
            kw["cpus"] = cpus
        else:
            kw["num_shards"] = a.shards
        if a.chunk_bytes is not None:
            kw["chunk_bytes"] = a.chunk_bytes
        if a.deal_stripes:
            kw["share_stripes"] = False
        if a.gpu_staging_bytes is not None:
            kw["gpu_staging_bytes"] = a.gpu_staging_bytes
        if a.gpu_slot_bytes is not None:
            kw["gpu_slot_bytes"] = a.gpu_slot_bytes
        e = IOEngine(f"{key}-{os.getpid()}", IOEngineConfig(a.host, 0))
        e.create_backend(BackendType.TCP, TcpBackendConfig(**kw))
        return e

    def buffer_len(self) -> int:
        a, c = self.a, self.a.batch_contiguous
        need = [1]
        if "a" in a.rows:
            need.append(a.transfer_batch_size * (a.buffer_size if c else a.buffer_size + 1))
        if "b" in a.rows:
            need.append(a.lat_size)
        if "c" in a.rows:
            need.append(a.sub_batch * (a.sub_size if c else a.sub_size + 1))
        return max(need)

    def warmup(self, iters: int) -> int:
        return self.a.warmup if self.a.warmup is not None else max(2, iters // 16)

    # ---- validation (morio bench's: scramble the destination, compare segments after)

    def prepare(self, op: str, size: int, batch: int, contiguous: bool, seed: int) -> None:
        if self.a.no_validate:
            return
        dst = self.tbuf if op == "write" else self.ibuf
        dst.fill(seed, 0, extent(size, batch, contiguous))

    def check(self, row: dict[str, Any], op: str, size: int, batch: int, contiguous: bool) -> None:
        if self.a.no_validate:
            return
        src, dst = (self.ibuf, self.tbuf) if op == "write" else (self.tbuf, self.ibuf)
        s, d = src.segments(size, batch, contiguous), dst.segments(size, batch, contiguous)
        if not np.array_equal(s, d):
            bad = int(np.argmax((s != d).any(axis=1)))
            raise RuntimeError(f"{row['name']}: validation FAILED: segment {bad} of {batch} differs "
                               f"between the {'initiator' if op == 'write' else 'target'}'s source and the "
                               f"{'target' if op == 'write' else 'initiator'}'s destination")
        row["validated"] = True

    @staticmethod
    def ok(code: Any, st: Any, what: str) -> None:
        if code != StatusCode.SUCCESS:
            raise RuntimeError(f"{what} failed: {StatusCode(code).name} {st.Message()}")

    # ---- rows

    def row_batch(self, op: str, seed: int) -> None:
        """Row a: one session batch call of batch x size per iteration, call to Wait() end."""
        a = self.a
        size, batch, c = a.buffer_size, a.transfer_batch_size, a.batch_contiguous
        name = f"a {op}"
        mode = f"batch {'contig' if c else 'strided'}"
        progress(f"{name}: {size} B x {batch}, {mode}")
        offs = offsets(size, batch, c)
        sizes = np.full(batch, size, dtype=np.int64)
        call = self.sess.batch_write if op == "write" else self.sess.batch_read
        self.prepare(op, size, batch, c, seed)
        alloc = self.sess.allocate_transfer_uid
        clock = time.perf_counter_ns
        durs = []
        for i in range(self.warmup(a.iters) + a.iters):
            uid = alloc()
            t0 = clock()
            st = call(offs, offs, sizes, uid)
            code = st.Wait()
            t1 = clock()
            self.ok(code, st, name)
            durs.append(t1 - t0)
        durs = durs[self.warmup(a.iters):]
        row = dict(name=name, kind="batch", mode=mode, api=f"IOEngineSession.batch_{op}",
                   **row_stats(op, size, batch, durs))
        self.check(row, op, size, batch, c)
        self.rows.append(row)

    def row_single(self, seed: int) -> None:
        """Row b: one session write of lat_size bytes per iteration, call to Wait() end."""
        a = self.a
        size = a.lat_size
        name, mode = "b write", "single"
        progress(f"{name}: {size} B x 1, {mode}")
        self.prepare("write", size, 1, True, seed)
        write, alloc, clock = self.sess.write, self.sess.allocate_transfer_uid, time.perf_counter_ns
        durs = []
        for i in range(self.warmup(a.lat_iters) + a.lat_iters):
            uid = alloc()
            t0 = clock()
            st = write(0, 0, size, uid)
            code = st.Wait()
            t1 = clock()
            self.ok(code, st, name)
            durs.append(t1 - t0)
        durs = durs[self.warmup(a.lat_iters):]
        row = dict(name=name, kind="single", mode=mode, api="IOEngineSession.write",
                   **row_stats("write", size, 1, durs))
        self.check(row, "write", size, 1, True)
        self.rows.append(row)

    def row_submit(self, seed: int, as_list: bool) -> None:
        """Row c: the batch_write call alone (submission), then its Wait() (completion)."""
        a = self.a
        size, batch, c = a.sub_size, a.sub_batch, a.batch_contiguous
        src = "list" if as_list else "numpy"
        name = f"c write {src}"
        mode = f"batch {'contig' if c else 'strided'}"
        progress(f"{name}: {size} B x {batch}, {mode}, offsets from {'Python lists' if as_list else 'int64 arrays'}")
        offs = offsets(size, batch, c)
        sizes = np.full(batch, size, dtype=np.int64)
        lo: Any = offs.tolist() if as_list else offs
        sz: Any = sizes.tolist() if as_list else sizes
        self.prepare("write", size, batch, c, seed)
        call, alloc, clock = self.sess.batch_write, self.sess.allocate_transfer_uid, time.perf_counter_ns
        sub, tot = [], []
        for i in range(self.warmup(a.sub_reps) + a.sub_reps):
            uid = alloc()
            t0 = clock()
            st = call(lo, lo, sz, uid)
            t1 = clock()
            code = st.Wait()
            t2 = clock()
            self.ok(code, st, name)
            sub.append(t1 - t0)
            tot.append(t2 - t0)
        w = self.warmup(a.sub_reps)
        sub, tot = sub[w:], tot[w:]
        submit = brief(sub)
        submit["ns_per_entry_p50"] = submit["p50_us"] * 1e3 / batch
        submit["durations_us"] = [d / 1e3 for d in sub]
        wait = brief([t - s for s, t in zip(sub, tot)])
        row = dict(name=name, kind="submit", mode=mode, api="IOEngineSession.batch_write", source=src,
                   **row_stats("write", size, batch, tot), submit=submit, wait=wait)
        self.check(row, "write", size, batch, c)
        self.rows.append(row)

    def run(self) -> None:
        a, seed = self.a, 0
        def next_seed() -> int:
            nonlocal seed
            seed += 1
            return (0x9E3779B97F4A7C15 ^ (seed * 0xD1B54A32D192ED03)) % (1 << 64)
        if "a" in a.rows:
            for op in a.ops:
                self.row_batch(op, next_seed())
        if "b" in a.rows:
            self.row_single(next_seed())
        if "c" in a.rows:
            self.row_submit(next_seed(), as_list=False)
            if a.sub_list:
                self.row_submit(next_seed(), as_list=True)

    def side(self, e: IOEngine, buf: Buffer) -> dict[str, Any]:
        d = e.get_engine_desc()
        cpus = [c for c in e.shard_cpus()]
        return {"engine_key": d.key, "host": d.host, "port": d.port, "shards": e.num_shards(),
                "cpus": cpus if all(c is not None for c in cpus) else None, "pid": d.pid,
                "gpu_staging": None, "memory": buf.kind}

    def close(self) -> None:
        self.initiator.deregister_memory(self.ibuf.desc)
        self.target.deregister_memory(self.tbuf.desc)
        self.initiator.close()
        self.target.close()
        if self.child is not None:
            self.child.join(timeout=30)


class _TargetProxy:
    """The target engine and its buffer in a child process (--target-process): the calls the
    bench makes on either, forwarded over a pipe."""

    def __init__(self, conn: Any):
        self.conn = conn
        info = self.call("info")
        self._desc, self.desc, self.kind = EngineDesc.unpack(info["engine"]), MemoryDesc.unpack(info["mem"]), info["kind"]
        self._shards, self._cpus = info["shards"], info["cpus"]

    def call(self, *msg: Any) -> Any:
        self.conn.send(msg)
        ok, v = self.conn.recv()
        if not ok:
            raise RuntimeError(f"target process: {v}")
        return v

    def get_engine_desc(self) -> EngineDesc:
        return self._desc

    def register_remote_engine(self, d: EngineDesc) -> None:
        self.call("register", d.pack())

    def num_shards(self) -> int:
        return self._shards

    def shard_cpus(self) -> list[Optional[int]]:
        return self._cpus

    def fill(self, seed: int, start: int, n: int) -> None:
        self.call("fill", seed, start, n)

    def segments(self, size: int, batch: int, contiguous: bool) -> np.ndarray:
        return self.call("segments", size, batch, contiguous)

    def deregister_memory(self, _d: MemoryDesc) -> None:
        pass

    def close(self) -> None:
        try:
            self.call("close")
        except (EOFError, OSError, RuntimeError):
            pass


def _target_main(conn: Any, args: dict[str, Any], cpus: Optional[list[int]], unpin: bool, blen: int) -> None:
    """The child of --target-process: one target engine and buffer, serving the proxy's calls."""
    a = argparse.Namespace(**args)
    if a.wait_spin_us is not None:
        morio.set_wait_spin_us(a.wait_spin_us)
    b = Bench.__new__(Bench)
    b.a = a
    e = b.engine("pybench-target", cpus, unpin)
    buf = Buffer(e, blen, a.target_mem_type, a.cpu_array, a.gpu_device)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        try:
            op = msg[0]
            if op == "info":
                v: Any = {"engine": e.get_engine_desc().pack(), "mem": buf.desc.pack(), "kind": buf.kind,
                          "shards": e.num_shards(), "cpus": e.shard_cpus()}
            elif op == "register":
                v = e.register_remote_engine(EngineDesc.unpack(msg[1]))
            elif op == "fill":
                v = buf.fill(*msg[1:])
            elif op == "segments":
                v = np.ascontiguousarray(buf.segments(*msg[1:]))
            elif op == "close":
                e.deregister_memory(buf.desc)
                e.close()
                conn.send((True, None))
                break
            else:
                raise ValueError(f"unknown call {op!r}")
            conn.send((True, v))
        except Exception as ex:  # reported to the parent, which raises it
            conn.send((False, f"{type(ex).__name__}: {ex}"))


def progress(name: str) -> None:
    print(f"pybench: {name} ...", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- output


def table(header: list[str], rows: list[list[str]], title: str, left: int = 2) -> str:
    """An ASCII table under a title box (morio bench's look); the first ``left`` columns are
    left-aligned, the numbers right-aligned."""
    w = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    sep = "+" + "+".join("-" * (x + 2) for x in w) + "+"

    def line(cells: list[str]) -> str:
        return "|" + "|".join(f" {c:<{x}} " if i < left else f" {c:>{x}} "
                              for i, (c, x) in enumerate(zip(cells, w))) + "|"

    inner = len(sep) - 2
    out = ["+" + "-" * inner + "+", "|" + title.center(inner) + "|", sep, line(header), sep]
    out += [line(r) for r in rows]
    out.append(sep)
    return "\n".join(out)


def f2(x: float) -> str:
    return f"{x:.2f}"


def print_config(b: Bench) -> None:
    a = b.a
    i, t = b.initiator, b.target
    lines = [
        ("morio", f"{morio.__version__} (GPU runtimes {morio.GPU_RUNTIMES or 'none'})"),
        ("python", sys.version.split()[0]),
        ("host", a.host),
        ("rows", ",".join(a.rows) + f" (ops {','.join(a.ops)})"),
        ("memory", f"{b.ibuf.kind} / {b.tbuf.kind}, {b.blen} B per side"),
        ("layout", "contiguous" if a.batch_contiguous else "strided (i*(size+1))"),
        ("iters", f"a {a.iters}, b {a.lat_iters}, c {a.sub_reps} (warm-up "
                  f"{b.warmup(a.iters)}/{b.warmup(a.lat_iters)}/{b.warmup(a.sub_reps)})"),
        ("num_data_conns", str(a.num_data_conns)),
        ("striping_threshold_bytes", str(a.striping_threshold_bytes)),
        ("initiator_shards", f"{i.num_shards()} (cpus {format_cpus(b.cpus[0])})"),
        ("target_shards", f"{t.num_shards()} (cpus {format_cpus(b.cpus[1])})"),
        ("app_thread", f"cpu {a.app_cpu}" if a.app_cpu is not None else "unpinned"),
        ("spin_before_park", f"{a.spin_us} us" if a.spin_us else "off"),
        ("wait_spin", f"{a.wait_spin_us if a.wait_spin_us is not None else 50} us"),
        ("validate", "off" if a.no_validate else "each row's segments, source against destination"),
    ]
    print("MORIO Python Benchmark Configurations:")
    for k, v in lines:
        print(f"  {k}: {v}")
    print(flush=True)


def print_tables(b: Bench) -> None:
    hdr = ["Row", "Mode", "MsgSize (B)", "BatchSize", "TotalSize (MB)", "Max BW (GB/s)", "Avg BW (GB/s)",
           "Min Lat (us)", "Avg Lat (us)", "p50 (us)", "p99 (us)", "Valid"]
    rows = [[r["name"], r["mode"], str(r["msg_size"]), str(r["batch_size"]), f2(r["total_size_mb"]),
             f2(r["max_bw_gbps"]), f2(r["avg_bw_gbps"]), f2(r["min_lat_us"]), f2(r["avg_lat_us"]),
             f2(r["p50_us"]), f2(r["p99_us"]), "yes" if r["validated"] else "no"] for r in b.rows]
    print(table(hdr, rows, TITLE))
    subs = [r for r in b.rows if r["kind"] == "submit"]
    if subs:
        hdr = ["Row", "BatchSize", "Submit p50 (us)", "Submit p99 (us)", "Submit min (us)", "ns/entry (p50)",
               "Wait p50 (us)", "Total p50 (us)", "Total avg (us)"]
        rows = [[r["name"], str(r["batch_size"]), f2(r["submit"]["p50_us"]), f2(r["submit"]["p99_us"]), f2(r["submit"]["min_us"]),
                 f2(r["submit"]["ns_per_entry_p50"]), f2(r["wait"]["p50_us"]), f2(r["p50_us"]),
                 f2(r["avg_lat_us"])] for r in subs]
        print(table(hdr, rows, "c: the batch_write call alone (submit), then its Wait()", left=1))


def write_json(b: Bench, path: str) -> None:
    a = b.a
    config = {k: v for k, v in vars(a).items()}
    # The keys `morio bench --summarize` reads (they describe rows a).
    config.update(enable_batch_transfer=True, enable_sess=True)
    report = {
        "tool": "pybench",
        "version": morio.__version__,
        "title": TITLE,
        "config": config,
        "loopback": True,
        "warmup_iters": b.warmup(a.iters),
        "buffer_bytes": b.blen,
        "initiator": b.side(b.initiator, b.ibuf),
        "target": b.side(b.target, b.tbuf),
        "ceiling": None,
        "python": sys.version.split()[0],
        "rows": b.rows,
    }
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"JSON: {path}")


def main(argv: Optional[list[str]] = None) -> int:
    a = parse_args(argv)
    b = Bench(a)
    try:
        print_config(b)
        try:
            b.run()
        except RuntimeError as e:
            if b.rows:
                print_tables(b)
            print(f"pybench: {e}", file=sys.stderr)
            return 1
        print_tables(b)
        if a.json:
            write_json(b, a.json)
    finally:
        b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
