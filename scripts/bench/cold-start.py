#!/usr/bin/env python3
"""The cost of a peer's first transfers: two fresh engines of one process (TCP, or the
same-host transport), an 8 B or 4 MiB write, with and without `connect_remote_engine` first;
median of 7 pairs of the connect call, the first write and the second write (µs).

    scripts/bench/cold-start.py        # with the morio package installed (pip install ./python)
"""
import time, numpy as np, statistics
from morio import IOEngine, IOEngineConfig, BackendType, TcpBackendConfig
def once(pre, n, same_host):
    a = IOEngine(f"cold_a_{pre}_{n}_{time.monotonic_ns()}", IOEngineConfig("127.0.0.1", 0))
    b = IOEngine(f"cold_b_{pre}_{n}_{time.monotonic_ns()}", IOEngineConfig("127.0.0.1", 0))
    cfg = lambda: TcpBackendConfig(num_data_conns=8, same_host=same_host)
    a.create_backend(BackendType.TCP, cfg()); b.create_backend(BackendType.TCP, cfg())
    a.register_remote_engine(b.get_engine_desc()); b.register_remote_engine(a.get_engine_desc())
    src = np.ones(n, np.uint8); dst = np.zeros(n, np.uint8)
    sm, dm = a.register_array(src), b.register_array(dst)
    c0 = time.perf_counter()
    if pre:
        a.connect_remote_engine(b.get_engine_desc().key)
    c1 = time.perf_counter()
    st = a.write(sm, 0, dm, 0, n, a.allocate_transfer_uid()); st.Wait()
    t1 = time.perf_counter()
    st = a.write(sm, 0, dm, 0, n, a.allocate_transfer_uid()); st.Wait()
    t2 = time.perf_counter()
    a.close(); b.close()
    return (c1-c0)*1e6, (t1-c1)*1e6, (t2-t1)*1e6
for sh in ["off", "auto"]:
    for n in [8, 4<<20]:
        for pre in [False, True]:
            r = [once(pre, n, sh) for _ in range(7)]
            med = lambda i: statistics.median(x[i] for x in r)
            print(f"same_host={sh:4} size={n:>8} preconnect={pre!s:5}  connect {med(0):8.0f} us  first {med(1):8.0f} us  second {med(2):8.0f} us")
