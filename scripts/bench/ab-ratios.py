#!/usr/bin/env python3
"""Ratios of an A/B sweep from `h200-bench.sh` (gpuipc, hostab, latdefault, gpustage, archab,
...): rows named ROW-rN-VARIANT are grouped by ROW, each variant's figures averaged over the
rounds, and every variant set beside the first one (or --base).

    scripts/bench/ab-ratios.py DIR_OR_TARBALL [--base VARIANT]

DIR holds the JSON reports (`json/` of a sweep, or its morio-bench-json.tar.gz). Prints, per
row and variant: Avg BW (GB/s), avg, p50 and p99 latency (us), the ratios to the base variant
(bandwidth: variant / base, higher is better; p50: base / variant, higher is better), p99
over p50, and the transport each carried.
"""

import argparse
import glob
import json
import os
import re
import statistics
import tarfile
import tempfile


def reports(path):
    if os.path.isfile(path) and tarfile.is_tarfile(path):
        tmp = tempfile.mkdtemp(prefix="ab-ratios-")
        with tarfile.open(path) as t:
            t.extractall(tmp, filter="data")
        path = tmp
    files = glob.glob(os.path.join(path, "**", "*.json"), recursive=True)
    out = {}
    for f in files:
        name = os.path.splitext(os.path.basename(f))[0]
        m = re.match(r"^(?P<row>.+?)-r(?P<round>\d+)(?:-(?P<variant>.+))?$", name)
        if not m:
            continue
        with open(f) as fh:
            rows = json.load(fh).get("rows") or []
        if not rows:
            continue
        r = rows[0]
        key = (m.group("row"), m.group("variant") or "-")
        out.setdefault(key, []).append(r)
    return out


def mean(rows, field):
    vals = [r[field] for r in rows if r.get(field) is not None]
    return statistics.fmean(vals) if vals else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path")
    ap.add_argument("--base", help="the variant the others are compared with")
    a = ap.parse_args()
    data = reports(a.path)
    by_row = {}
    for (row, variant), rows in data.items():
        by_row.setdefault(row, {})[variant] = rows
    print(f"{'row':<14}{'variant':<22}{'n':>3}{'GB/s':>9}{'x':>7}{'avg us':>11}{'p50 us':>11}"
          f"{'x p50':>7}{'p99 us':>11}{'p99/p50':>8}  transport")
    for row in sorted(by_row):
        variants = by_row[row]
        order = sorted(variants)
        base = a.base if a.base in variants else order[0]
        order = [base] + [v for v in order if v != base]
        b = variants[base]
        b_bw, b_p50 = mean(b, "avg_bw_gbps"), mean(b, "p50_us")
        for v in order:
            rows = variants[v]
            bw, avg, p50 = mean(rows, "avg_bw_gbps"), mean(rows, "avg_lat_us"), mean(rows, "p50_us")
            p99 = mean(rows, "p99_us")
            tail = f"{p99 / p50:8.2f}" if p99 and p50 else f"{'-':>8}"
            x_bw = f"{bw / b_bw:7.2f}" if bw and b_bw else f"{'-':>7}"
            x_p50 = f"{b_p50 / p50:7.2f}" if p50 and b_p50 else f"{'-':>7}"
            transports = ",".join(sorted({r.get("transport") or "-" for r in rows}))
            print(f"{row:<14}{v:<22}{len(rows):>3}{(bw or 0):>9.2f}{x_bw}{(avg or 0):>11.1f}"
                  f"{(p50 or 0):>11.1f}{x_p50}{(p99 or 0):>11.1f}{tail}  {transports}")


if __name__ == "__main__":
    main()
