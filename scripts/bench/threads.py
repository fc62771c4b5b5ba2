#!/usr/bin/env python3
"""Where a process's threads ran and waited: `threads.py snap PATTERN OUT.json` records every
thread of the processes whose command line contains PATTERN (name, allowed CPUs, CPU time,
time spent runnable but waiting for a CPU, context switches, from /proc); `threads.py diff
A.json B.json` prints what each thread did between two snapshots: CPU ms, run-queue wait
ms (preempted or waiting to be scheduled), voluntary and involuntary switches, the CPUs it
may run on; then every other thread of the machine that ran for over a millisecond
between the snapshots (kernel threads such as ksoftirqd included). A shard thread with
milliseconds of run-queue wait shares its CPU with a thread that took it.
"""
import json
import os
import sys


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def snap(pattern, out):
    me = os.getpid()
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        cmd = read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()
        if "threads.py" in cmd:
            continue
        mine = pattern in cmd
        tasks = {}
        for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
            base = f"/proc/{pid}/task/{tid}"
            status = dict(
                line.split(":\t", 1) for line in read(f"{base}/status").splitlines() if ":\t" in line
            )
            sched = read(f"{base}/schedstat").split()
            stat = read(f"{base}/stat")
            fields = stat[stat.rfind(")") + 2 :].split() if stat else []
            if len(sched) < 3 or len(fields) < 37:
                continue
            tasks[tid] = {
                "comm": read(f"{base}/comm").strip(),
                "cpus": status.get("Cpus_allowed_list", "?").strip(),
                "run_ns": int(sched[0]),
                "wait_ns": int(sched[1]),
                "vcsw": int(status.get("voluntary_ctxt_switches", "0")),
                "nvcsw": int(status.get("nonvoluntary_ctxt_switches", "0")),
                "last_cpu": int(fields[36]),
            }
        procs[pid] = {"cmd": cmd[:160] or read(f"/proc/{pid}/comm").strip(), "mine": mine, "tasks": tasks}
    with open(out, "w") as f:
        json.dump(procs, f)


def diff(a_path, b_path):
    a, b = json.load(open(a_path)), json.load(open(b_path))
    others = []
    for pid, p in b.items():
        before = a.get(pid, {}).get("tasks", {})
        if not p.get("mine", True):
            for tid, t in p["tasks"].items():
                o = before.get(tid, {"run_ns": t["run_ns"], "wait_ns": t["wait_ns"]})
                run = (t["run_ns"] - o["run_ns"]) / 1e6
                if run > 1.0:
                    others.append((run, (t["wait_ns"] - o["wait_ns"]) / 1e6, t["cpus"], t["last_cpu"], t["comm"], p["cmd"][:40]))
            continue
        print(f"== pid {pid}: {p['cmd']}")
        rows = []
        for tid, t in p["tasks"].items():
            o = before.get(tid, {"run_ns": 0, "wait_ns": 0, "vcsw": 0, "nvcsw": 0})
            rows.append(
                (
                    (t["run_ns"] - o["run_ns"]) / 1e6,
                    (t["wait_ns"] - o["wait_ns"]) / 1e6,
                    t["vcsw"] - o["vcsw"],
                    t["nvcsw"] - o["nvcsw"],
                    t["cpus"],
                    t["comm"],
                    tid,
                    t["last_cpu"],
                )
            )
        rows.sort(key=lambda r: (-r[0], r[6]))
        print(f"  {'thread':18} {'tid':>7} {'cpus':>10} {'last':>4} {'cpu ms':>9} {'wait ms':>8} {'vcsw':>7} {'nvcsw':>6}")
        for run, wait, v, nv, cpus, comm, tid, last in rows:
            if run < 0.05 and wait < 0.05 and v == 0 and nv == 0:
                continue
            print(f"  {comm[:18]:18} {tid:>7} {cpus:>10} {last:>4} {run:9.1f} {wait:8.2f} {v:7} {nv:6}")
    print("== other threads that ran over 1 ms")
    for run, wait, cpus, last, comm, cmd in sorted(others, reverse=True)[:40]:
        print(f"  {comm[:18]:18} {cpus:>10} {last:>4} {run:9.1f} {wait:8.2f}  {cmd}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "snap":
        snap(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "diff":
        diff(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
