#!/usr/bin/env python3
"""The default rows of a sweep (`d*.json` under DIR): iterations slower than 80 µs, and both
engines' busy-poll wakes over the row: `slow-iters.py DIR`. A row whose shards parked between
iterations shows many slow ones and few wakes on one side.
"""
import glob
import json
import os
import sys


def main():
    for f in sorted(glob.glob(os.path.join(sys.argv[1], "d*.json"))):
        r = json.load(open(f))
        r = r["rows"][0] if "rows" in r else r
        d = r.get("durations_us") or []
        print("%-16s slow %4d  wakes %5d / %5d" % (
            os.path.basename(f)[:-5], sum(x > 80 for x in d),
            r.get("initiator_counters", {}).get("busy_poll_wakes", -1),
            r.get("target_counters", {}).get("busy_poll_wakes", -1)))


if __name__ == "__main__":
    main()
