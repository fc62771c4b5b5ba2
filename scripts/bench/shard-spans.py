#!/usr/bin/env python3
"""Where a large striped transfer's time goes per shard: `shard-spans.py DIR [DIR ...]`.

Reads the `*.csv` that `MORIO_TRACE=DIR` left (both processes of a `morio bench --loopback`
run) and, over the traced transfers but the first two (warm-up), splits each transfer's time
into three parts, per shard that carried chunks:

- start: from CALL to the shard's first G_STAGED (its first staging slot copied out of GPU
  memory) or, for host memory, its first T_RECV;
- span: from there to the shard's last T_PLACED (a WRITE landed, or a READ_DATA sent);
- end: from the transfer's last T_PLACED to DONE (the last landing copy and the completion).

Prints the median, mean, min and max of each (µs), and the transfers' wall time, so a GPU
run can be set beside a host-memory run of the same size.
"""
import collections
import csv
import glob
import os
import statistics
import sys

CALL, DONE, T_RECV, T_PLACED, G_STAGED = 1, 11, 7, 8, 26


def load(d):
    by_uid = collections.defaultdict(list)
    for f in glob.glob(os.path.join(d, "*.csv")):
        with open(f) as fh:
            for r in csv.DictReader(fh):
                by_uid[int(r["uid"])].append(
                    (int(r["ns"]), int(r["stage"]), int(r.get("cpu") or 0))
                )
    return by_uid


def spans(by_uid):
    out = collections.defaultdict(list)
    done_uids = [u for u, ev in sorted(by_uid.items()) if any(st == DONE for _, st, _ in ev)]
    for uid in done_uids[2:]:
        ev = sorted(by_uid[uid])
        calls = [ns for ns, st, _ in ev if st == CALL]
        placed = [ns for ns, st, _ in ev if st == T_PLACED]
        if not calls or not placed:
            continue
        t0, done = calls[0], [ns for ns, st, _ in ev if st == DONE][0]
        per = collections.defaultdict(list)
        for ns, st, cpu in ev:
            if st in (T_RECV, T_PLACED, G_STAGED):
                per[cpu].append((ns, st))
        for marks in per.values():
            pl = [ns for ns, st in marks if st == T_PLACED]
            first = [ns for ns, st in marks if st == G_STAGED] or [
                ns for ns, st in marks if st == T_RECV
            ]
            if pl and first:
                out["start"].append((first[0] - t0) / 1e3)
                out["span"].append((pl[-1] - first[0]) / 1e3)
        out["end"].append((done - max(placed)) / 1e3)
        out["wall"].append((done - t0) / 1e3)
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for d in sys.argv[1:]:
        out = spans(load(d))
        if not out["wall"]:
            print(f"{d}: fewer than three complete transfers traced")
            continue
        print(f"== {d}: {len(out['wall'])} transfers (us)")
        for k in ("start", "span", "end", "wall"):
            xs = out[k]
            print(
                f"  {k:6} median {statistics.median(xs):7.0f}  mean {statistics.mean(xs):7.0f}"
                f"  min {min(xs):6.0f}  max {max(xs):6.0f}"
            )


if __name__ == "__main__":
    main()
