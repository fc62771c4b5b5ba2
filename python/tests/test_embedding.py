"""Several engines in one process: library defaults stay off the CPUs' pinning; shard counts."""

import os

import numpy as np
import pytest

from morio import BackendType, TcpBackendConfig

from _util import pattern, small_config, wait_ok

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
    assert (e.num_shards(), e.shard_cpus(), e.stats()) == (0, [], [])
    assert "morio_backend_up 0" in e.metrics()
    e.create_backend(BackendType.TCP, small_config(num_shards=1, pin_shards=False))
    assert e.num_shards() == 1 and e.shard_cpus() == [None]
    text = e.metrics()
    assert "morio_backend_up 1" in text and "morio_shards 1" in text
    assert 'morio_outbound_transfers_total{shard="0"} 0' in text
    assert "# TYPE morio_outbound_latency_seconds histogram" in text
