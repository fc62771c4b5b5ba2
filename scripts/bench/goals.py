#!/usr/bin/env python3
"""The goals of issues 22 and 23 from a `goals.sh` run: one line per goal with its value in each
round, their mean, the target and in how many rounds it was met.

    scripts/bench/goals.py DIR_OR_TARBALL [--json FILE]

DIR holds `morio bench --json` reports named ROW-rN (goals.sh's names: t- over TCP, h- between
processes of one host; g for GPU memory). A goal whose rows are missing (GPU rows without a
GPU, a failed row) is listed as not measured. Values: bandwidth ratios are morio's Avg BW over
the reference row's; latencies in µs per batch iteration; `floor` is the row's raw-TCP floor
(busy-polling threads, same batch, same CPUs) measured right after it; `membw-rN` is the
host's memory copy bandwidth in that round (`membw.py --json`, 256 MiB), the bound of a
one-copy transfer; `gpulink-rN` the GPU's pinned copies from two processes at once, the slower
direction (`copyproc.py --json`): a one-GPU loopback's staged GPU rows pass both ways through it.
"""

import argparse
import glob
import json
import os
import re
import statistics
import tarfile
import tempfile


def load(path):
    if os.path.isfile(path) and tarfile.is_tarfile(path):
        tmp = tempfile.mkdtemp(prefix="goals-")
        with tarfile.open(path) as t:
            t.extractall(tmp, filter="data")
        path = tmp
    rows = {}
    for f in glob.glob(os.path.join(path, "**", "*.json"), recursive=True):
        m = re.match(r"^(?P<row>.+)-r(?P<round>\d+)$", os.path.splitext(os.path.basename(f))[0])
        if not m:
            continue
        with open(f) as fh:
            rep = json.load(fh)
        if rep.get("rows") and rep["rows"][0].get("validated", True):
            rows.setdefault(m.group("row"), {})[int(m.group("round"))] = rep["rows"][0]
    return rows


def bw(r):
    return r["avg_bw_gbps"]


def ratio(a, b, f):
    return lambda rows, k: f(rows[a][k]) / f(rows[b][k])


def field(a, f):
    return lambda rows, k: f(rows[a][k])


def floor_p50(r):
    return r["floor"]["p50_us"]


# (issue, goal, rows used, value per round, comparison, target, unit)
GOALS = [
    (22, "host 1 MiB x 256 write, same-host / TCP", ["h-w1m", "t-w1m"], ratio("h-w1m", "t-w1m", bw), ">=", 2.0, "x"),
    (22, "host 1 MiB x 256 read, same-host / TCP", ["h-r1m", "t-r1m"], ratio("h-r1m", "t-r1m", bw), ">=", 2.0, "x"),
    (22, "GPU 1 MiB x 256 write, same-host / staged TCP", ["h-gw1m", "t-gw1m"], ratio("h-gw1m", "t-gw1m", bw), ">=", 10.0, "x"),
    (22, "GPU 1 MiB x 256 read, same-host / staged TCP", ["h-gr1m", "t-gr1m"], ratio("h-gr1m", "t-gr1m", bw), ">=", 10.0, "x"),
    (22, "GPU single 64 MiB write, same-host / staged TCP", ["h-gw64m", "t-gw64m"], ratio("h-gw64m", "t-gw64m", bw), ">=", 10.0, "x"),
    (22, "GPU single 64 MiB read, same-host / staged TCP", ["h-gr64m", "t-gr64m"], ratio("h-gr64m", "t-gr64m", bw), ">=", 10.0, "x"),
    (22, "single 8 B write p50, same-host, spinning", ["h-s8"], field("h-s8", lambda r: r["p50_us"]), "<=", 5.0, "us"),
    (23, "default 8 B x 64 avg (TCP)", ["t-d64"], field("t-d64", lambda r: r["avg_lat_us"]), "<=", 40.0, "us"),
    (23, "default 8 B x 64 p99 / p50 (TCP)", ["t-d64"], field("t-d64", lambda r: r["p99_us"] / r["p50_us"]), "<=", 5.0, "x"),
    (23, "spinning single 8 B p50 / floor p50 (TCP)", ["t-s8"], field("t-s8", lambda r: r["p50_us"] / floor_p50(r)), "<=", 1.5, "x"),
    (23, "spinning 8 B x 256 avg (TCP)", ["t-s256"], field("t-s256", lambda r: r["avg_lat_us"]), "<=", 15.0, "us"),
    (23, "default 4 KiB x 256 avg / floor mean (TCP)", ["t-d4k"], field("t-d4k", lambda r: r["avg_lat_us"] / r["floor"]["avg_us"]), "<=", 1.2, "x"),
    (23, "default 4 KiB x 256 avg where floor p50 < 45 us", ["t-d4k"],
     field("t-d4k", lambda r: r["avg_lat_us"] if floor_p50(r) < 45 else None), "<=", 60.0, "us"),
    (23, "GPU / host 1 MiB x 256 write (TCP)", ["t-gw1m", "t-w1m"], ratio("t-gw1m", "t-w1m", bw), ">=", 0.85, "x"),
    (23, "GPU / host 1 MiB x 256 read (TCP)", ["t-gr1m", "t-r1m"], ratio("t-gr1m", "t-r1m", bw), ">=", 0.85, "x"),
    (23, "GPU / host single 64 MiB write (TCP)", ["t-gw64m", "t-w64m"], ratio("t-gw64m", "t-w64m", bw), ">=", 0.85, "x"),
    (23, "GPU / host single 64 MiB read (TCP)", ["t-gr64m", "t-r64m"], ratio("t-gr64m", "t-r64m", bw), ">=", 0.85, "x"),
    (0, "(info) spinning 8 B x 256 avg / floor p50 (TCP)", ["t-s256"], field("t-s256", lambda r: r["avg_lat_us"] / floor_p50(r)), "", None, "x"),
    (0, "(info) host 1 MiB x 256 write, same-host / host copy", ["h-w1m", "membw"], ratio("h-w1m", "membw", bw), "", None, "x"),
    (0, "(info) host 1 MiB x 256 read, same-host / host copy", ["h-r1m", "membw"], ratio("h-r1m", "membw", bw), "", None, "x"),
    (0, "(info) host 1 MiB x 256 write, TCP / host copy", ["t-w1m", "membw"], ratio("t-w1m", "membw", bw), "", None, "x"),
    (0, "(info) GPU 1 MiB x 256 write, TCP / GPU link both ways", ["t-gw1m", "gpulink"], ratio("t-gw1m", "gpulink", bw), "", None, "x"),
    (0, "(info) GPU 1 MiB x 256 read, TCP / GPU link both ways", ["t-gr1m", "gpulink"], ratio("t-gr1m", "gpulink", bw), "", None, "x"),
    (0, "(info) default single 8 B p50 / floor p50 (TCP)", ["t-d8"], field("t-d8", lambda r: r["p50_us"] / floor_p50(r)), "", None, "x"),
]


def evaluate(rows):
    out = []
    for issue, goal, need, value, cmp, target, unit in GOALS:
        rounds = sorted(set.intersection(*(set(rows.get(n, {})) for n in need)))
        vals, waived = [], 0
        for k in rounds:
            try:
                v = value(rows, k)
            except (KeyError, TypeError, ZeroDivisionError):
                continue
            if v is None:
                waived += 1  # the goal does not apply to this round (its condition)
            else:
                vals.append(v)
        met = None
        if vals and target is not None:
            ok = [(v >= target) if cmp == ">=" else (v <= target) for v in vals]
            met = sum(ok)
        out.append(dict(issue=issue, goal=goal, values=vals, mean=statistics.fmean(vals) if vals else None,
                        cmp=cmp, target=target, unit=unit, met_rounds=met, rounds=len(vals),
                        waived_rounds=waived))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path")
    ap.add_argument("--json", help="also write the table here")
    a = ap.parse_args()
    table = evaluate(load(a.path))
    print("%-5s %-52s %-30s %8s %-10s %s" % ("issue", "goal", "per round", "mean", "target", "met"))
    for g in table:
        if not g["values"]:
            why = "does not apply in any round" if g["waived_rounds"] else "not measured"
            print("%-5s %-52s %s" % (g["issue"] or "", g["goal"], why))
            continue
        per = " ".join("%.2f" % v for v in g["values"])
        target = "%s %g%s" % (g["cmp"], g["target"], g["unit"]) if g["target"] is not None else ""
        met = "%d/%d" % (g["met_rounds"], g["rounds"]) if g["met_rounds"] is not None else ""
        print("%-5s %-52s %-30s %8.2f %-10s %s" % (g["issue"] or "", g["goal"], per[:30], g["mean"], target, met))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(table, fh, indent=1)


if __name__ == "__main__":
    main()
