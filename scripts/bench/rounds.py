#!/usr/bin/env python3
"""Each `morio bench --json` report of a sweep, one line per row: `rounds.py DIR`.

Prints the report's name (ROW-rN-VARIANT), avg / p50 / p99 µs, GB/s for 1 MiB rows, the row's
raw-TCP floor (mean / p50) when measured, and the busy-poll step-asides and doorbells of
both engines' shards over the row when the report has them (`initiator_counters`,
`target_counters`). Next to `ab-ratios.py`, which averages the rounds; this shows each.
"""
import glob
import json
import os
import sys


def main():
    d = sys.argv[1]
    for f in sorted(glob.glob(os.path.join(d, "*.json"))):
        r = json.load(open(f))
        r = r["rows"][0] if "rows" in r else r
        line = "%-20s %8.1f / %7.1f / %8.1f" % (
            os.path.basename(f)[:-5], r["avg_lat_us"], r["p50_us"], r["p99_us"])
        if "1m" in f:
            line += " %6.2f GB/s" % r["avg_bw_gbps"]
        fl = r.get("floor")
        if fl:
            line += " | floor %.1f / %.1f" % (fl["avg_us"], fl["p50_us"])
        for side in ("initiator", "target"):
            c = r.get(side + "_counters")
            if c:
                line += " | %s backoffs %d doorbells %d" % (
                    side[0], c["busy_poll_backoffs"], c["same_host_doorbells"])
        print(line)


if __name__ == "__main__":
    main()
