#!/usr/bin/env python3
"""Device-to-device copy costs on this GPU, in one process and from another process's memory
(CUDA IPC through torch.multiprocessing): a single 64 MiB copy, 64 x 1 MiB copies with one
synchronisation, and 64 x 1 MiB copies synchronised one by one (as a per-chunk fence does).
Tells whether IPC copies run at device speed and what one synchronised chunk costs."""

import time

import torch
import torch.multiprocessing as mp

MIB = 1 << 20


def timed(fn, reps=5):
    best = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best.append(time.perf_counter() - t0)
    best.sort()
    return best[len(best) // 2]


def rows(src, label):
    dst = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda:0")
    s = torch.cuda.Stream()

    def one():
        with torch.cuda.stream(s):
            dst.copy_(src, non_blocking=True)
        s.synchronize()

    def many():
        with torch.cuda.stream(s):
            for i in range(64):
                dst[i * MIB:(i + 1) * MIB].copy_(src[i * MIB:(i + 1) * MIB], non_blocking=True)
        s.synchronize()

    def each():
        for i in range(64):
            with torch.cuda.stream(s):
                dst[i * MIB:(i + 1) * MIB].copy_(src[i * MIB:(i + 1) * MIB], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(s)
            while not ev.query():
                pass

    for name, fn in (("64 MiB x 1", one), ("1 MiB x 64, one sync", many), ("1 MiB x 64, sync each", each)):
        fn()
        t = timed(fn)
        print(f"{label:12} {name:24} {t * 1e6:9.1f} us {64 * MIB / t / 1e9:8.1f} GB/s")


def child(q, done):
    src = q.get()
    rows(src, "ipc")
    done.put(1)


def main():
    torch.cuda.init()
    src = torch.randint(0, 255, (64 * MIB,), dtype=torch.uint8, device="cuda:0")
    rows(src, "in-process")
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, done))
    p.start()
    q.put(src)
    done.get(timeout=120)
    p.join()


if __name__ == "__main__":
    main()
