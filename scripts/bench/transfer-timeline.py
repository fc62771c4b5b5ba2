#!/usr/bin/env python3
"""When a multi-chunk transfer's milestones come: `transfer-timeline.py DIR [median|UID]`.

Reads the `*.csv` that `MORIO_TRACE=DIR` left and prints, over the traced transfers but the
first two (warm-up), the median and mean time from CALL of: the owner's plan, the first frame
encoded, the first and the median shard's first staging slot copied out of GPU memory
(G_STAGED, GPU senders only), the last frame pushed, the first and last chunk placed at the
target, T_FINISH, COMPLETED and DONE. With `median` (the transfer of median wall time) or a
uid, also that transfer's marks per shard: initiator E encode, G slot copied, P pushed,
S sent; target RD readable, R received, PL placed.
"""
import collections
import csv
import glob
import os
import statistics
import sys

CALL, WOKE = 1, 12
MILESTONES = [
    ("planned", 15, "first"),
    ("first ENCODE", 4, "first"),
    ("first G_STAGED", 26, "first"),
    ("median shard's first G_STAGED", 26, "median-shard"),
    ("last PUSHED", 5, "last"),
    ("first T_PLACED", 8, "first"),
    ("last T_PLACED", 8, "last"),
    ("T_FINISH", 18, "first"),
    ("COMPLETED", 19, "first"),
    ("DONE", 11, "first"),
]
SHORT = {4: "E", 26: "G", 5: "P", 6: "S", 23: "RD", 7: "R", 8: "PL"}


def main():
    d = sys.argv[1]
    pick = sys.argv[2] if len(sys.argv) > 2 else None
    by_uid = collections.defaultdict(list)
    for f in glob.glob(os.path.join(d, "*.csv")):
        side = "I" if os.path.basename(f).startswith("initiator") else "T"
        with open(f) as fh:
            for r in csv.DictReader(fh):
                by_uid[int(r["uid"])].append(
                    (int(r["ns"]), side, int(r["stage"]), int(r.get("cpu") or 0))
                )
    walls, at = {}, collections.defaultdict(list)
    for uid, ev in sorted(by_uid.items()):
        ev.sort()
        call = [ns for ns, _, st, _ in ev if st == CALL]
        woke = [ns for ns, _, st, _ in ev if st == WOKE]
        if not call or not woke:
            continue
        t0 = call[0]
        walls[uid] = (woke[-1] - t0) / 1e3
        if len(walls) <= 2:
            continue
        at["wall"].append(walls[uid])
        for name, stage, how in MILESTONES:
            ts = [(ns - t0) / 1e3 for ns, _, st, _ in ev if st == stage]
            if not ts:
                continue
            if how == "first":
                at[name].append(ts[0])
            elif how == "last":
                at[name].append(ts[-1])
            else:
                firsts = {}
                for ns, side, st, cpu in ev:
                    if st == stage and side == "I" and cpu not in firsts:
                        firsts[cpu] = (ns - t0) / 1e3
                if firsts:
                    at[name].append(statistics.median(firsts.values()))
    if not at:
        print(f"{d}: fewer than three complete transfers traced")
        return
    print(f"== {os.path.basename(d.rstrip('/'))}: {len(at['wall'])} transfers (us from CALL)")
    for name, xs in at.items():
        print(f"  {name:32} median {statistics.median(xs):8.0f}  mean {statistics.mean(xs):8.0f}")
    if pick is None:
        return
    if pick == "median":
        med = statistics.median(walls.values())
        uid = min(walls, key=lambda u: abs(walls[u] - med))
    else:
        uid = int(pick)
    ev = sorted(by_uid[uid])
    t0 = [ns for ns, _, st, _ in ev if st == CALL][0]
    print(f"  transfer {uid}, wall {walls.get(uid, 0):.0f} us, marks per shard:")
    shards = collections.defaultdict(list)
    for ns, side, st, cpu in ev:
        if st in SHORT:
            shards[(side, cpu)].append(f"{SHORT[st]}{(ns - t0) / 1e3:.0f}")
    for (side, cpu), marks in sorted(shards.items()):
        print(f"    {side}{cpu:<3} " + " ".join(marks))


if __name__ == "__main__":
    main()
