#!/usr/bin/env python3
"""Pinned host <-> GPU copy bandwidth, one direction alone, both in one process (two streams)
and both from two processes at once: whether one GPU shared by two processes (the loopback
benchmark's initiator and target) serves their copies concurrently or in turns.
Needs torch with CUDA.
    python3 scripts/bench/copyproc.py [SECONDS] [MiB]
    python3 scripts/bench/copyproc.py --json FILE [SECONDS] [MiB]
                                     the two-process rate only, as a one-row `morio bench
                                     --json` whose avg_bw_gbps is the slower direction's
                                     (what a one-GPU loopback's staged GPU rows can reach)"""
import json
import multiprocessing as mp
import sys
import time

OUT = None
if sys.argv[1:2] == ["--json"]:
    OUT = sys.argv[2]
    del sys.argv[1:3]
SECS = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 2


def loop(dirs, secs, barrier=None, out=None):
    import torch
    n = MIB << 20
    s = {d: torch.cuda.Stream() for d in dirs}
    host = {d: torch.empty(n * 8, dtype=torch.uint8, pin_memory=True) for d in dirs}
    dev = {d: torch.empty(n * 8, dtype=torch.uint8, device="cuda") for d in dirs}
    torch.cuda.synchronize()
    if barrier is not None:
        barrier.wait()
    moved = {d: 0 for d in dirs}
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        for d in dirs:
            with torch.cuda.stream(s[d]):
                for i in range(8):
                    h, g = host[d][i * n:(i + 1) * n], dev[d][i * n:(i + 1) * n]
                    (h.copy_(g, non_blocking=True) if d == "d2h" else g.copy_(h, non_blocking=True))
                moved[d] += 8 * n
        for d in dirs:
            s[d].synchronize()
    dt = time.perf_counter() - t0
    r = {d: moved[d] / dt / 1e9 for d in dirs}
    if out is not None:
        out.put(r)
    return r


def two_processes():
    ctx = mp.get_context("spawn")
    b, q = ctx.Barrier(2), ctx.Queue()
    ps = [ctx.Process(target=loop, args=([d], SECS, b, q)) for d in ("d2h", "h2d")]
    for p in ps:
        p.start()
    got = [q.get() for _ in ps]
    for p in ps:
        p.join()
    return {k: v for g in got for k, v in g.items()}


def main():
    if OUT is not None:
        both = two_processes()
        row = {"op": "d2h+h2d", "msg_size": MIB << 20, "batch_size": 1, "validated": True,
               "avg_bw_gbps": min(both.values()), "d2h_gbps": both["d2h"], "h2d_gbps": both["h2d"]}
        with open(OUT, "w") as fh:
            json.dump({"tool": "copyproc.py", "rows": [row]}, fh)
        print("both, two processes", both)
        return
    print(f"{MIB} MiB copies, {SECS} s each (GB/s)")
    print("d2h alone", loop(["d2h"], SECS))
    print("h2d alone", loop(["h2d"], SECS))
    print("both, one process", loop(["d2h", "h2d"], SECS))
    print("both, two processes", two_processes())


if __name__ == "__main__":
    main()
