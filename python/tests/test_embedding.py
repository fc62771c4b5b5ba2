"""Several engines in one process: library defaults stay off the CPUs' pinning; shard counts."""

import os
import time

import numpy as np
import pytest

from morio import BackendType, StatusCode, TcpBackendConfig

from _util import pattern, small_config, wait_done, wait_ok

ALLOWED = sorted(os.sched_getaffinity(0))


def test_default_config_is_unpinned(engines):
    assert TcpBackendConfig().pin_shards is False
    a, b = engines.engine("emb_a", config=TcpBackendConfig()), engines.engine("emb_b", config=None)
    for e in (a, b):
        cpus = e.shard_cpus()
        assert len(cpus) == e.num_shards() >= 1
        assert cpus == [None] * e.num_shards()


def test_two_unpinned_engines_transfer(engines):
    a, b = engines.pair("emb_pair", config=small_config(pin_shards=False))
    for e in (a, b):
        assert e.shard_cpus() == [None] * e.num_shards()
    src, dst = pattern(100_000, 1), np.zeros(100_000, np.uint8)
    wait_ok(a.write(a.register_array(src), 0, b.register_array(dst), 0, src.size, 1))
    assert np.array_equal(dst, src)


def test_explicit_cpus_pin(engines):
    cpu = ALLOWED[0]
    e = engines.engine("emb_pin", config=small_config(cpus=[cpu]))
    assert e.num_shards() == 1
    assert e.shard_cpus() == [cpu]
    if len(ALLOWED) > 1:
        e2 = engines.engine("emb_pin2", config=small_config(cpus=ALLOWED[:2], pin_shards=True))
        assert e2.shard_cpus() == ALLOWED[:2]


@pytest.mark.parametrize("conns", [1, 2, 8])
def test_default_num_shards_bounds(engines, conns):
    e = engines.engine("emb_n", config=small_config(num_data_conns=conns))
    n = e.num_shards()
    assert 1 <= n <= conns and n <= len(ALLOWED)
    assert n == min(conns, len(ALLOWED))  # documented: one per allowed CPU, at most one per lane
    assert len(e.shard_cpus()) == n == len(e.stats())
    assert all(c is None or c in ALLOWED for c in e.shard_cpus())


def test_num_shards_explicit_and_before_backend(engines):
    e = engines.engine("emb_n0", backend=False)
    assert (e.num_shards(), e.shard_cpus(), e.stats(), e.peer_stats()) == (0, [], [], {})
    assert "morio_backend_up 0" in e.metrics()
    e.create_backend(BackendType.TCP, small_config(num_shards=1, pin_shards=False))
    assert e.num_shards() == 1 and e.shard_cpus() == [None]
    text = e.metrics()
    assert "morio_backend_up 1" in text and "morio_shards 1" in text
    assert 'morio_outbound_transfers_total{shard="0"} 0' in text
    assert "# TYPE morio_outbound_latency_seconds histogram" in text


def test_stats_per_peer(engines):
    """Counters per peer on both sides: a write and a read that succeed, a write the target
    refuses; keys that need escaping in the exposition."""
    cfg = small_config(num_shards=2, pin_shards=False)
    a = engines.engine(key=f'py "a" \\ {os.getpid()}', config=cfg)
    b = engines.engine("emb_peer_b", config=cfg)
    a.register_remote_engine(b.get_engine_desc())
    ka, kb = a.get_engine_desc().key, b.get_engine_desc().key
    n = 100_000
    src, dst, back = pattern(n, 3), np.zeros(n, np.uint8), np.zeros(4096, np.uint8)
    smd, dmd, bmd = a.register_array(src), b.register_array(dst), a.register_array(back)
    wait_ok(a.write(smd, 0, dmd, 0, n, a.allocate_transfer_uid()))
    wait_ok(a.read(bmd, 0, dmd, 0, 4096, a.allocate_transfer_uid()))
    gone = b.register_array(np.zeros(4096, np.uint8))
    b.deregister_memory(gone)
    st = a.write(smd, 0, gone, 0, 4096, a.allocate_transfer_uid())
    assert wait_done(st) == StatusCode.ERR_NOT_FOUND, st.Message()

    to_b = a.peer_stats()[kb]
    assert (to_b["transfers_ok"], to_b["transfers_failed"]) == (2, 1)
    assert (to_b["bytes_sent"], to_b["bytes_received"]) == (n + 4096, 4096)
    assert to_b["inbound_transfers"] == 0 and to_b["lane_failures"] == 0
    assert to_b["lane_connects"] == sum(l["connects"] for l in to_b["lanes"].values()) >= 1
    assert all(0 <= i < 2 for i in to_b["lanes"])
    assert list(a.peer_stats()) == [kb]
    # Per shard, the same counters split: they add up.
    shards = a.stats()
    assert sum(s["peers"].get(kb, {}).get("bytes_sent", 0) for s in shards) == n + 4096
    assert sum(s["transfers_ok"] for s in shards) == 2

    # The target: the write placed, the read served, three inbound statuses (one refused).
    deadline = time.monotonic() + 5
    while b.peer_stats()[ka]["inbound_bytes_read"] < 4096 and time.monotonic() < deadline:
        time.sleep(0.01)
    from_a = b.peer_stats()[ka]
    assert (from_a["inbound_bytes_written"], from_a["inbound_bytes_read"]) == (n, 4096)
    assert from_a["inbound_transfers"] == 3
    assert (from_a["transfers_ok"], from_a["lanes"]) == (0, {})

    # The exposition names the peer, escaped; peers=False leaves the per-peer series out.
    label = ka.replace("\\", "\\\\").replace('"', '\\"')
    text = b.metrics()
    assert f'morio_peer_inbound_written_bytes_total{{peer="{label}"}} {n}' in text, text
    assert f'morio_peer_transfers_total{{peer="{kb}",outcome="failed"}} 1' in a.metrics()
    assert "morio_peer_" not in b.metrics(peers=False)
    assert "morio_inbound_transfers_total" in b.metrics(peers=False)
