#!/usr/bin/env python3
"""Shards that went silent during a transfer: `lane-stalls.py DIR [LABEL]`.

Reads the `*.csv` that `MORIO_TRACE=DIR` left (initiator-*.csv, target-*.csv) and, per
transfer (CALL to WOKE), finds
  late lanes  an initiator shard that took up its share of the transfer (HANDED) more than
              300 us after the owner planned it (PLANNED): the shard did not run its inbox;
  silences    on every shard that carries the transfer (lane or served connection marks), the longest stretch between its first
              and last mark of it without any mark of any transfer (over 1 ms is listed,
              with the shard's CPU): a shard in the middle of its share that did nothing.
Prints the transfers' median and mean wall time, and the late lanes and silences with the
transfer they fell in, so a slow transfer can be told apart from a stalled shard.
"""
import collections
import csv
import glob
import os
import statistics
import sys

CALL, PLANNED, WOKE, HANDED = 1, 15, 12, 21
# Marks of a lane (initiator) or a served connection (target); the owner's and the
# application thread's marks have waits of their own between them.
CONN = {4, 5, 6, 10, 19, 21, 22, 26, 7, 8, 9, 16, 18, 20, 23}


def main():
    d = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else os.path.basename(d.rstrip("/"))
    by_uid = collections.defaultdict(list)
    by_cpu = collections.defaultdict(list)  # (side, cpu) -> [ns]
    for f in glob.glob(os.path.join(d, "*.csv")):
        side = "I" if os.path.basename(f).startswith("initiator") else "T"
        with open(f) as fh:
            for r in csv.DictReader(fh):
                ns, uid, st, cpu = int(r["ns"]), int(r["uid"]), int(r["stage"]), int(r.get("cpu") or 0)
                by_uid[uid].append((ns, side, st, cpu))
                if st in CONN:
                    by_cpu[(side, cpu)].append(ns)
    for v in by_cpu.values():
        v.sort()
    walls, late, silences = [], [], []
    for uid, ev in sorted(by_uid.items()):
        ev.sort()
        call = [ns for ns, _, st, _ in ev if st == CALL]
        woke = [ns for ns, _, st, _ in ev if st == WOKE]
        plan = [ns for ns, _, st, _ in ev if st == PLANNED]
        if not call or not woke:
            continue
        t0, t1 = call[0], woke[-1]
        walls.append((t1 - t0) / 1e3)
        if plan:
            seen = {}
            for ns, side, st, cpu in ev:
                if side == "I" and st == HANDED and cpu not in seen:
                    seen[cpu] = (ns - plan[0]) / 1e3
            late += [(uid, cpu, us) for cpu, us in seen.items() if us > 300]
        for key in {(side, cpu) for _, side, st, cpu in ev if st in CONN}:
            own = [ns for ns, side, st, cpu in ev if (side, cpu) == key and st in CONN]
            marks = [ns for ns in by_cpu[key] if own[0] <= ns <= own[-1]]
            gaps = [(b - a) / 1e3 for a, b in zip(marks, marks[1:])]
            if gaps and max(gaps) > 1000:
                silences.append((uid, f"{key[0]}{key[1]}", max(gaps)))
    if not walls:
        print(f"== {label}: no complete transfer traced")
        return
    print(
        f"== {label}: {len(walls)} transfers, wall median {statistics.median(walls):.0f} us, "
        f"mean {statistics.mean(walls):.0f} us, max {max(walls):.0f} us"
    )
    print(
        f"  late lanes (>300 us after PLANNED): {len(late)}  "
        + " ".join(f"uid{u}:I{c}:{us:.0f}" for u, c, us in late)
    )
    print(
        f"  silences >1 ms inside a transfer: {len(silences)}  "
        + " ".join(f"uid{u}:{k}:{us:.0f}" for u, k, us in sorted(silences))
    )


if __name__ == "__main__":
    main()
