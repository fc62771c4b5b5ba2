"""Peer authentication from Python: the auth_secret keyword, wrong and one-sided secrets."""

import numpy as np
import pytest

from morio import StatusCode, TcpBackendConfig

from _util import pattern, small_config, wait_done, wait_ok

SECRET = b"a python deployment secret"


def test_engines_sharing_a_secret_transfer(engines):
    cfg = small_config(auth_secret=SECRET, num_data_conns=4, chunk_bytes=4096, striping_threshold_bytes=8192)
    a, b = engines.pair("auth_ok", config=cfg)
    n = (1 << 20) + 5
    src, dst = pattern(n, 3), np.zeros(n, np.uint8)
    wait_ok(a.write(a.register_array(src), 0, b.register_array(dst), 0, n, a.allocate_transfer_uid()))
    assert np.array_equal(dst, src)


def test_a_str_secret_is_its_utf8_bytes(engines):
    a, b = engines.pair("auth_str", config=small_config(auth_secret=SECRET.decode()), config_b=small_config(auth_secret=SECRET))
    src, dst = pattern(64, 1), np.zeros(64, np.uint8)
    wait_ok(a.write(a.register_array(src), 0, b.register_array(dst), 0, 64, a.allocate_transfer_uid()))


@pytest.mark.parametrize("mine,theirs,why", [
    (SECRET, b"a different secret, long enough", "failed authentication"),
    (SECRET, None, "does not authenticate"),
    (None, SECRET, "requires authentication"),
])
def test_mismatched_secrets_fail_and_place_nothing(engines, monkeypatch, mine, theirs, why):
    monkeypatch.delenv("MORIO_AUTH_SECRET", raising=False)
    cfg = lambda s: small_config(auth_secret=s, op_timeout_ms=5000)  # noqa: E731
    a, b = engines.pair("auth_bad", config=cfg(mine), config_b=cfg(theirs))
    src, dst = pattern(4096, 2), np.zeros(4096, np.uint8)
    st = a.write(a.register_array(src), 0, b.register_array(dst), 0, 4096, a.allocate_transfer_uid())
    assert wait_done(st, 30) != StatusCode.SUCCESS
    assert why in st.Message()
    assert not dst.any()


def test_bad_secrets_are_clear_errors():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        TcpBackendConfig(auth_secret=b"short")
    with pytest.raises(TypeError, match="auth_secret"):
        TcpBackendConfig(auth_secret=12345)
    c = TcpBackendConfig(auth_secret=SECRET)
    assert c.auth_secret is True and "auth=True" in repr(c)
    assert SECRET.decode() not in repr(c)
    c.auth_secret = None
    assert c.auth_secret is False


def test_limits_are_keywords_and_properties():
    c = TcpBackendConfig(max_connections=10, max_connections_per_peer=5, max_handshakes=7,
                         max_joins=100, max_joins_per_peer=10,
                         max_inbound_statuses=50, max_inbound_statuses_per_peer=5)
    assert (c.max_connections, c.max_connections_per_peer, c.max_handshakes) == (10, 5, 7)
    assert (c.max_joins, c.max_joins_per_peer) == (100, 10)
    assert (c.max_inbound_statuses, c.max_inbound_statuses_per_peer) == (50, 5)
    d = TcpBackendConfig()
    assert (d.max_handshakes, d.max_connections, d.max_connections_per_peer) == (128, 1024, 64)
    with pytest.raises(ValueError):
        TcpBackendConfig(max_connections=0)


def test_check_host_passes_here_and_says_what_to_change_elsewhere():
    import subprocess
    import sys

    import morio

    morio.check_host()  # the test machines run io_uring with enough locked memory
    code = "import morio\ntry:\n    morio.check_host()\nexcept RuntimeError as e:\n    print(e)\n"
    r = subprocess.run(["sh", "-c", f'ulimit -l 128 && exec "{sys.executable}" -c "$0"', code],
                       capture_output=True, text=True, timeout=60)
    assert "ulimit -l unlimited" in r.stdout, (r.stdout, r.stderr)


def test_advertise_host_is_what_the_descriptor_carries(engines):
    from morio import BackendType, IOEngine, IOEngineConfig

    cfg = IOEngineConfig(host="", port=0, advertise_host="127.0.0.4")
    assert "advertise_host" in repr(cfg)
    e = IOEngine("adv_py", cfg)
    try:
        e.create_backend(BackendType.TCP, small_config())
        assert e.get_engine_desc().host == "127.0.0.4"
        a = engines.engine("adv_py_a")
        a.register_remote_engine(e.get_engine_desc())
        src, dst = pattern(4096, 4), np.zeros(4096, np.uint8)
        wait_ok(a.write(a.register_array(src), 0, e.register_array(dst), 0, 4096, a.allocate_transfer_uid()))
        assert np.array_equal(dst, src)
    finally:
        e.close()
