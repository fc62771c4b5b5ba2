#!/usr/bin/env python3
"""The Python package's goals from one `scripts/bench/h200-python.sh run`: each Python row
beside the `morio bench` row of the same round.

    scripts/bench/python-goals.py DIR   # DIR holds rust-*.json and py-*.json of that run
"""

import glob
import json
import os
import re
import sys


def load(path):
    with open(path) as f:
        return json.load(f)["rows"]


def main(d):
    rounds = sorted({int(m.group(1)) for p in glob.glob(os.path.join(d, "*.json"))
                     if (m := re.search(r"-(\d+)\.json$", p))})
    print("1 MiB x 256 batch through a session (Avg BW, GB/s); goal: Python >= 0.95 x morio bench")
    print("(Python: both engines in one process; Python 2p: the target in a child process, as")
    print(" morio bench --loopback runs its roles; the goal is judged on the 2p rows when present)")
    print(f"{'row':<16}{'round':>6}{'morio bench':>13}{'Python':>9}{'ratio':>8}{'Python 2p':>11}{'ratio':>8}")
    ok = True
    for mem in ("cpu", "gpu"):
        for op in ("write", "read"):
            for r in rounds:
                rp, pp, tp = (os.path.join(d, f"{k}-{op}-{mem}-{r}.json") for k in ("rust", "py", "pyt"))
                if not (os.path.exists(rp) and os.path.exists(pp)):
                    continue
                rb, pb = load(rp)[0]["avg_bw_gbps"], load(pp)[0]["avg_bw_gbps"]
                line = f"{op + ' ' + mem:<16}{r:>6}{rb:>13.2f}{pb:>9.2f}{pb / rb:>8.2f}"
                judged = pb
                if os.path.exists(tp):
                    judged = load(tp)[0]["avg_bw_gbps"]
                    line += f"{judged:>11.2f}{judged / rb:>8.2f}"
                ok &= judged >= 0.95 * rb
                print(line)
    print()
    print("single 8 B write (p50, us), 2 spinning shards; goal: Python <= morio bench + 3 us")
    print(f"{'round':>6}{'morio bench':>13}{'Python':>9}{'delta':>8}{'Py avg':>9}{'Py p99':>9}")
    for r in rounds:
        rp, pp = (os.path.join(d, f"{k}-lat-{r}.json") for k in ("rust", "py"))
        if not (os.path.exists(rp) and os.path.exists(pp)):
            continue
        rr, pr = load(rp)[0], load(pp)[0]
        ok &= pr["p50_us"] <= rr["p50_us"] + 3
        print(f"{r:>6}{rr['p50_us']:>13.2f}{pr['p50_us']:>9.2f}{pr['p50_us'] - rr['p50_us']:>8.2f}"
              f"{pr['avg_lat_us']:>9.2f}{pr['p99_us']:>9.2f}")
    print()
    print("65,536-entry session batch_write: the call alone (us); goal: <= 2000 from numpy")
    print(f"{'round':>6}{'source':>8}{'p50':>10}{'p99':>10}{'ns/entry':>10}{'then Wait p50':>15}")
    for r in rounds:
        pp = os.path.join(d, f"py-sub-{r}.json")
        if not os.path.exists(pp):
            continue
        for row in load(pp):
            s = row["submit"]
            if row.get("source") == "numpy":
                ok &= s["p50_us"] <= 2000
            print(f"{r:>6}{row.get('source', '?'):>8}{s['p50_us']:>10.1f}{s['p99_us']:>10.1f}"
                  f"{s['ns_per_entry_p50']:>10.1f}{row['wait']['p50_us']:>15.1f}")
    print()
    print("all goals met" if ok else "a goal was missed (see above)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
