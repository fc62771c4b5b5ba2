"""Engines on IPv6 loopback (::1, bare or in brackets): descriptors, writes and reads over TCP
and the same-host transport, an IPv4 and an IPv6 engine together. Skipped without ::1."""

import socket

import numpy as np
import pytest

from morio import IOEngine, IOEngineConfig

from _util import pattern, small_config, wait_inbound, wait_ok


def _has_v6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _has_v6_loopback(), reason="no IPv6 loopback (::1) here")


def _round_trip(a, b, n, seed):
    src = pattern(n, seed)
    dst = np.zeros_like(src)
    back = np.zeros_like(src)
    smd, dmd, bmd = a.register_array(src), b.register_array(dst), a.register_array(back)
    uid = a.allocate_transfer_uid()
    wait_ok(a.write(smd, 0, dmd, 0, n, uid))
    assert np.array_equal(dst, src)
    assert wait_inbound(b, a.get_engine_desc().key, uid).Succeeded()
    wait_ok(a.read(bmd, 0, dmd, 0, n, a.allocate_transfer_uid()))
    assert np.array_equal(back, src)


@pytest.mark.parametrize("same_host", ["off", "require"])
def test_engines_on_ipv6_loopback(engines, same_host):
    a, b = engines.pair("v6", config=small_config(same_host=same_host), host="::1")
    d = b.get_engine_desc()
    assert d.host == "::1"
    for n, seed in [(8, 1), (4096, 2), (3 << 20, 3)]:
        _round_trip(a, b, n, seed)
    total = {k: sum(s[k] for s in a.stats()) for k in ("lane_connects", "lane_connects_same_host")}
    assert total["lane_connects"] >= 1
    want = total["lane_connects"] if same_host == "require" else 0
    assert total["lane_connects_same_host"] == want, total


def test_ipv4_and_ipv6_engines_together(engines):
    a = engines.engine("v46_a", config=small_config(same_host="off"), host="127.0.0.1")
    b = engines.engine("v46_b", config=small_config(same_host="off"), host="[::1]")
    assert b.get_engine_desc().host == "::1"  # brackets are for HOST:PORT, not advertised
    a.register_remote_engine(b.get_engine_desc())
    b.register_remote_engine(a.get_engine_desc())
    _round_trip(a, b, 1 << 20, 4)
    _round_trip(b, a, 1 << 20, 5)


def test_a_host_that_is_not_an_address_is_refused():
    for bad in ["[127.0.0.1]", "[::1", "[::1]:80"]:
        with pytest.raises(ValueError, match="not a numeric IP address"):
            IOEngine("v6bad", IOEngineConfig(host=bad, port=0))
