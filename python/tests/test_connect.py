"""connect_remote_engine: a peer's connections opened before its first transfer."""

import numpy as np
import pytest

from _util import small_config, wait_ok


def test_connect_opens_every_lane_and_transfers_dial_nothing(engines):
    a, b = engines.pair("pyconn", config=small_config(num_data_conns=3))
    lanes = a.connect_remote_engine(b.get_engine_desc().key, timeout_ms=10_000)
    assert len(lanes) == 3
    assert set(lanes) <= {"tcp", "same-host", "same-host-ring"}, lanes
    connects = sum(s["lane_connects"] for s in a.stats())
    assert connects == 3
    src = np.arange(4 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    wait_ok(a.write(a.register_array(src), 0, b.register_array(dst), 0, src.nbytes, a.allocate_transfer_uid()))
    assert np.array_equal(src, dst)
    assert sum(s["lane_connects"] for s in a.stats()) == connects
    # Host memory is never staged, so nothing of it lands (the counter is there, at zero).
    for s in a.stats() + b.stats():
        assert (s["gpu_staged_bytes"], s["gpu_overlapped_landings"]) == (0, 0), s
    assert a.connect_remote_engine(b.get_engine_desc().key) == lanes


def test_connect_errors(engines):
    a = engines.engine("pyconn_err")
    with pytest.raises(ValueError, match="not registered"):
        a.connect_remote_engine("nobody")
    # A peer that went away: nobody listens on its port any more.
    b = engines.engine("pyconn_closed")
    d = b.get_engine_desc()
    b.close()
    engines.forget(b)
    a.register_remote_engine(d)
    with pytest.raises(ConnectionError, match="refused"):
        a.connect_remote_engine(d.key, timeout_ms=5_000)
