#!/usr/bin/env python3
"""Kernel-side cost of a small-transfer row: `kernel-sends.py TRACE`.

Reads the text of an ftrace buffer recorded by `scripts/bench/h200-bench.sh ftrace` (syscall
enter and exit events of sendmsg and sendto, IPI, io_uring and wake-up events) during one
`morio bench --loopback` run. morio's connections send with sendmsg and the raw-TCP floor's
streams with sendto, so the two are told apart by syscall. Prints, for each: how many sends,
their duration (p50/p90/p99; the trace clock has microsecond resolution), and how many sent
an IPI from inside the call (a wake-up or io_uring task work on another CPU), with those
sends' median; then the io_uring task-work events (by thread, opcode and poll mask) seen
while morio's connections were sending.
"""
import bisect
import collections
import re
import sys

LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[(\d+)\]\s+\S+\s+([\d.]+):\s+(\w+)(\(|:| ->)\s?(.*)$")
WHO = {"sys_sendmsg": "morio (sendmsg)", "sys_sendto": "floor (sendto)"}


def pct(xs, q):
    xs = sorted(xs)
    return xs[int((len(xs) - 1) * q)] if xs else float("nan")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: kernel-sends.py TRACE")
    opened = {}
    sends = collections.defaultdict(list)  # syscall -> [(start s, duration us, tid)]
    ipis = collections.defaultdict(list)  # tid -> [time s]
    uring = []  # (time s, thread, rest)
    with open(sys.argv[1], errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            comm, tid, _cpu, t, name, sep, rest = m.groups()
            t, tid = float(t), int(tid)
            if name in WHO:
                if sep == " ->":
                    s = opened.pop((tid, name), None)
                    if s is not None:
                        sends[name].append((s, (t - s) * 1e6, tid))
                else:
                    opened[(tid, name)] = t
            elif name.startswith("ipi_send"):
                ipis[tid].append(t)
            elif name == "io_uring_task_add":
                uring.append((t, comm, rest))
    for tid in ipis:
        ipis[tid].sort()
    for name, who in WHO.items():
        calls = sends.get(name, [])
        if not calls:
            print(f"{who:<16} no sends traced")
            continue
        with_ipi = []
        for s, d, tid in calls:
            ts = ipis.get(tid, [])
            i = bisect.bisect_left(ts, s)
            if i < len(ts) and ts[i] <= s + d / 1e6:
                with_ipi.append(d)
        ds = [d for _, d, _ in calls]
        print(f"{who:<16} n={len(ds):>6}  p50 {pct(ds, .5):5.1f}  p90 {pct(ds, .9):5.1f}  "
              f"p99 {pct(ds, .99):5.1f} us;  with an IPI inside: {len(with_ipi)} "
              f"(p50 {pct(with_ipi, .5):.1f} us)")
    calls = sends.get("sys_sendmsg", [])
    if calls:
        lo, hi = min(c[0] for c in calls), max(c[0] for c in calls)
        kinds = collections.Counter()
        for t, comm, rest in uring:
            if lo <= t <= hi:
                op = re.search(r"opcode (\w+)", rest)
                mask = re.search(r"mask (\w+)", rest)
                kinds[(comm, op.group(1) if op else "-", mask.group(1) if mask else "-")] += 1
        print(f"io_uring task work while morio sent ({hi - lo:.3f} s):",
              ", ".join(f"{n} x {c}/{o}/mask {k}" for (c, o, k), n in kinds.most_common(8)) or "none")


if __name__ == "__main__":
    main()
