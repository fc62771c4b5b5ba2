#!/usr/bin/env python3
"""Per-stage latency of traced transfers: `trace-stages.py DIR [LABEL]`.

Reads every `*.csv` that `MORIO_TRACE=DIR` left (initiator and target of one run), lines the
stages of each transfer up by uid (CLOCK_MONOTONIC is shared by the processes of a host) and
prints the median and p90 of each step between consecutive stages (sub-stages included
where every such transfer recorded them), for transfers that passed every main stage (express writes: all but the owner's).
"""
import csv
import glob
import os
import statistics
import sys

NAMES = {1: "call", 2: "submit", 3: "owner", 4: "encode", 5: "pushed", 6: "sent", 7: "t_recv",
         8: "t_placed", 9: "t_sent", 10: "resp", 11: "done", 12: "woke"}
# Sub-stages (`morio::trace::stage`), printed in their places when a run recorded them.
SUBS = {13: "resolved", 14: "normalized", 15: "planned", 16: "t_checked", 17: "finish",
        18: "joined", 19: "completed", 20: "t_answered", 21: "handed", 22: "head_sent",
        23: "t_readable", 24: "t_noticed", 25: "noticed", 26: "g_staged"}
# The order a write passes every stage (`morio::trace::stage::ORDER`).
ORDER = [1, 13, 14, 2, 3, 15, 21, 4, 26, 22, 5, 6, 24, 23, 7, 16, 8, 9, 25, 10, 11, 12]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    d = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else os.path.basename(d.rstrip("/"))
    per = {}
    last = {}
    oncpu = {}
    for f in glob.glob(os.path.join(d, "*.csv")):
        with open(f) as fh:
            for r in csv.DictReader(fh):
                uid, st, ns = int(r["uid"]), int(r["stage"]), int(r["ns"])
                first = per.setdefault(uid, {})
                first[st] = min(first.get(st, ns), ns)
                end = last.setdefault(uid, {})
                end[st] = max(end.get(st, ns), ns)
                if r.get("cpu") is not None:
                    k = (st, int(r["cpu"]))
                    c = oncpu.setdefault(uid, {})
                    c[k] = min(c.get(k, ns), ns)
    # A multi-chunk write gets no answer per chunk (protocol v4): its chunk 0's COMPLETE
    # (completed) stands in for the answer (resp).
    for u, s in per.items():
        if 10 not in s and 19 in s:
            s[10] = s[19]
            last[u].setdefault(10, last[u][19])
    # Express writes (the submitting thread puts them into the ring) have no owner stage:
    # the larger group of the two is shown.
    full = [s for s in per.values() if all(k in s for k in NAMES if k != 3)]
    express = [s for s in full if 3 not in s]
    owned = [s for s in full if 3 in s]
    full = express if len(express) > len(owned) else owned
    if express and full is express:
        label += " (express)"
    if not full:
        print(f"{label}: no transfer passed every stage ({len(per)} traced)")
        return
    # Skip the first 10% (warm-up).
    full = full[len(full) // 10:]
    names = {**NAMES, **SUBS}
    steps = [st for st in ORDER if all(st in s for s in full)]
    cells = []
    for a, b in zip(steps, steps[1:]):
        ds = [(s[b] - s[a]) / 1000 for s in full]
        cells.append(f"{names[a]}>{names[b]} {statistics.median(ds):.1f}/{pct(ds, 0.9):.1f}")
    tot = [(s[12] - s[1]) / 1000 for s in full]
    print(f"{label} (n={len(full)}, us p50/p90): total {statistics.median(tot):.1f}/{pct(tot, 0.9):.1f}")
    for c in cells:
        print("   " + c)
    # The slowest transfers, step by step: where a tail comes from.
    slow = sorted(full, key=lambda s: s[12] - s[1])[-int(os.environ.get("SLOWEST", "3")):]
    for s in reversed(slow):
        parts = [f"{names[a]}>{names[b]} {(s[b] - s[a]) / 1000:.1f}" for a, b in zip(steps, steps[1:])]
        print(f"   slow: total {(s[12] - s[1]) / 1000:.1f} us: " + ", ".join(parts))
    # Multi-chunk transfers: how far apart the chunks' stages are, and the join: the last
    # chunk placed on the target, every chunk joined there, COMPLETE decoded here, done.
    in_full = {id(s) for s in full}
    multi = [(s, last[u]) for u, s in per.items() if id(s) in in_full and 19 in s]
    if multi:
        print(f"   multi-chunk (n={len(multi)}): first>last chunk of each stage, then the end")
        for st in (4, 5, 7, 8, 10):
            ds = [(e[st] - s[st]) / 1000 for s, e in multi]
            print(f"      {NAMES[st]} spread {statistics.median(ds):.1f}/{pct(ds, 0.9):.1f}")
        ends = (
            ("last t_placed>joined", lambda s, e: e[8], lambda s, e: s.get(18)),
            ("joined>t_answered", lambda s, e: s.get(18), lambda s, e: s.get(20)),
            ("t_answered>completed", lambda s, e: s.get(20), lambda s, e: s.get(19)),
            ("joined>completed", lambda s, e: s.get(18), lambda s, e: s.get(19)),
            ("completed>done", lambda s, e: s.get(19), lambda s, e: s[11]),
        )
        for name, frm, to in ends:
            ds = [(to(s, e) - frm(s, e)) / 1000 for s, e in multi
                  if frm(s, e) is not None and to(s, e) is not None]
            if ds:
                print(f"      {name} {statistics.median(ds):.1f}/{pct(ds, 0.9):.1f}")
        timeline(multi, per, oncpu, names)


def timeline(multi, per, oncpu, names):
    """Per CPU, the median time from CALL at which each stage was first marked there: which
    lane or target shard is late, and with what."""
    uids = {id(s): u for u, s in per.items()}
    rows = {}
    for s, _ in multi:
        c = oncpu.get(uids[id(s)])
        if not c:
            return
        for (st, cpu), ns in c.items():
            rows.setdefault((cpu, st), []).append((ns - s[1]) / 1000)
    n = len(multi)
    print(f"      per cpu, us from call (p50; stages seen on that cpu in >= half the transfers):")
    for cpu in sorted({c for c, _ in rows}):
        cells = [(statistics.median(v), names[st]) for (c, st), v in rows.items()
                 if c == cpu and len(v) * 2 >= n]
        if cells:
            cells.sort()
            print(f"         cpu{cpu:<3} " + " ".join(f"{nm}@{t:.1f}" for t, nm in cells))

if __name__ == "__main__":
    main()
