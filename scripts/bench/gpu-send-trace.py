#!/usr/bin/env python3
"""Where a staged GPU sender's time goes: `gpu-send-trace.py DIR [LABEL]`.

Reads the `*.csv` that `MORIO_TRACE=DIR` left and, for every chunk sent from GPU memory
through staging slots (those with a `G_STAGED` mark: initiator WRITE chunks between ENCODE
and PUSHED, target READ_DATA between T_RECV and T_PLACED), splits the sending shard's time
per chunk into
  wait  start -> G_STAGED: the copy out of device memory still running (the GPU),
  send  G_STAGED -> end:   the bytes into the socket (the CPU and the receiver),
  gap   previous chunk's end -> start on the same CPU within one transfer (no work queued).
Prints, per kind of sender, medians and sums over the run, and the share of the sending
shards' busy time spent waiting for the GPU. Marks on one CPU are paired first-in first-out,
which holds while each shard runs one sending lane (the default: one lane per shard).
"""
import csv
import glob
import os
import statistics
import sys

ENCODE, PUSHED, T_RECV, T_PLACED, G_STAGED = 4, 5, 7, 8, 26
KINDS = {"write (initiator lane)": (ENCODE, PUSHED), "read (target)": (T_RECV, T_PLACED)}


def main():
    d = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else os.path.basename(d.rstrip("/"))
    marks = {}  # (uid, cpu) -> {stage: [ns]}
    for f in glob.glob(os.path.join(d, "*.csv")):
        with open(f) as fh:
            for r in csv.DictReader(fh):
                k = (int(r["uid"]), int(r.get("cpu") or 0))
                marks.setdefault(k, {}).setdefault(int(r["stage"]), []).append(int(r["ns"]))
    print(f"== {label}")
    for name, (start, end) in KINDS.items():
        waits, sends, gaps, walls, per_transfer = [], [], [], {}, {}
        for (uid, cpu), st in marks.items():
            g = sorted(st.get(G_STAGED, []))
            s = sorted(st.get(start, []))
            e = sorted(st.get(end, []))
            if not g or len(s) < len(g) or len(e) < len(g):
                continue
            # The sender's marks of this uid on this CPU; a target's T_RECV / T_PLACED of
            # other frames on the CPU do not carry this uid, so the lists pair up.
            s, e = s[: len(g)], e[: len(g)]
            prev = None
            for a, b, c in zip(s, g, e):
                waits.append(b - a)
                sends.append(c - b)
                if prev is not None and a >= prev:
                    gaps.append(a - prev)
                prev = c
            lo, hi = walls.get(uid, (s[0], e[-1]))
            walls[uid] = (min(lo, s[0]), max(hi, e[-1]))
            per_transfer[uid] = per_transfer.get(uid, 0) + len(g)
        if not waits:
            continue
        med = lambda xs: statistics.median(xs) / 1000 if xs else 0.0
        busy = sum(waits) + sum(sends)
        wall = [hi - lo for lo, hi in walls.values()]
        print(
            f"  {name}: {len(walls)} transfers, {statistics.median(per_transfer.values()):.0f} "
            f"chunks each; per chunk median wait {med(waits):.1f} us, send {med(sends):.1f} us, "
            f"gap {med(gaps):.1f} us; GPU wait {100 * sum(waits) / busy:.0f} % of the senders' "
            f"busy time; sender wall per transfer median {med(wall):.0f} us"
        )


if __name__ == "__main__":
    main()
