#!/usr/bin/env python3
"""Host memory copy bandwidth: N threads each copying its share of a SIZE buffer into another
(numpy copies release the GIL), for buffer sizes that do and do not fit the last-level cache.
The bound a one-copy same-host transfer of that size can reach (a transfer of S bytes
copies S bytes: it reads S and writes S).

    membw.py [MIB ...]                 the table, 1 to 16 threads
    membw.py --json FILE [MIB]         the best over 4, 8 and 16 threads for one size (256
                                       MiB by default), as a one-row `morio bench --json`
                                       report (`avg_bw_gbps`) for goals.py"""

import json
import sys
import threading
import time

import numpy as np

MIB = 1 << 20


def run(size, threads, reps=4):
    src = np.ones(size, dtype=np.uint8)
    dst = np.ones(size, dtype=np.uint8)
    share = size // threads

    def work(i):
        np.copyto(dst[i * share:(i + 1) * share], src[i * share:(i + 1) * share])

    best = None
    for _ in range(reps):
        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return share * threads / best / 1e9


def main():
    if sys.argv[1:2] == ["--json"]:
        size = int(sys.argv[3]) * MIB if len(sys.argv) > 3 else 256 * MIB
        best = max(run(size, t) for t in (4, 8, 16))
        row = {"op": "copy", "msg_size": size, "batch_size": 1, "avg_bw_gbps": best, "validated": True}
        with open(sys.argv[2], "w") as fh:
            json.dump({"tool": "membw.py", "rows": [row]}, fh)
        print(f"host copy bandwidth, {size // MIB} MiB: {best:.1f} GB/s")
        return
    sizes = [int(a) * MIB for a in sys.argv[1:]] or [64 * MIB, 256 * MIB]
    print(f"{'buffer':>10} " + " ".join(f"{t:>3} thr GB/s" for t in (1, 2, 4, 8, 16)))
    for s in sizes:
        print(f"{s // MIB:>7} MiB " + " ".join(f"{run(s, t):>12.1f}" for t in (1, 2, 4, 8, 16)))


if __name__ == "__main__":
    main()
