"""Discovery on a real etcd (Debian's `etcd-server`), started for this module on free loopback
ports with a temporary data directory: engines publish, a peer looks them up and moves
verified data, a watcher forgets a peer whose handle closed, errors are clear."""

import itertools
import os
import shutil
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

import morio
from morio import StatusCode

from _util import pattern, wait_ok

Discovery = getattr(morio, "Discovery", None)
if Discovery is None:
    pytest.skip("morio was built without the `etcd` feature", allow_module_level=True)

_prefixes = itertools.count()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, cond, timeout_s: float, every_s: float = 0.02):
    """Poll `cond` until it returns a true value (returned) or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(every_s)


class Etcd:
    """An etcd of this module's own on loopback; `connect()` opens a handle on it."""

    def __init__(self, binary: str, data: str) -> None:
        client, peer = free_port(), free_port()
        self.endpoint = f"127.0.0.1:{client}"
        c, p = f"http://{self.endpoint}", f"http://127.0.0.1:{peer}"
        self.log = open(os.path.join(data, "etcd.log"), "wb")
        self.proc = subprocess.Popen(
            [binary, "--name", "morio-test", "--data-dir", os.path.join(data, "etcd"),
             "--listen-client-urls", c, "--advertise-client-urls", c,
             "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
             "--initial-cluster", f"morio-test={p}"],
            stdout=subprocess.DEVNULL, stderr=self.log,
        )
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                self.log.flush()
                with open(self.log.name, "rb") as f:
                    tail = f.read()[-2000:].decode(errors="replace")
                raise RuntimeError(f"etcd exited with {self.proc.returncode}: {tail}")
            try:
                Discovery([self.endpoint], "/probe", connect_timeout_s=0.5).close()
                break
            except ConnectionError:
                if time.monotonic() > deadline:
                    self.close()
                    raise
                time.sleep(0.1)

    def connect(self, prefix: str, **kw):
        kw.setdefault("lease_ttl_s", 2)
        return Discovery([self.endpoint], prefix, **kw)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("no `etcd` binary on PATH: these tests start a real etcd (apt-get install etcd-server)")
    e = Etcd(binary, str(tmp_path_factory.mktemp("etcd")))
    try:
        yield e
    finally:
        e.close()


@pytest.fixture
def prefix():
    """A key prefix of this test's own."""
    return f"/pytest-{os.getpid()}-{next(_prefixes)}"


def test_publish_lookup_and_move_verified_data(etcd, engines, prefix):
    n = 64 << 10
    a, b, c = engines.engine("disc_a"), engines.engine("disc_b"), engines.engine("disc_c")
    ra, rb = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
    with etcd.connect(prefix) as da, etcd.connect(prefix) as db, etcd.connect(prefix) as dc:
        da.publish(a, {"kv": a.register_array(ra)})
        db.publish(b, [("kv", b.register_array(rb)), ("spare", b.register_array(np.zeros(8, np.uint8)))])

        assert dc.lookup(a.get_engine_desc().key) == a.get_engine_desc()
        assert dc.lookup(b.get_engine_desc().key) == b.get_engine_desc()
        assert dc.lookup("nobody") is None
        assert dc.regions("nobody") == {}
        assert list(dc.regions(b.get_engine_desc().key)) == ["kv", "spare"]

        # c registers the looked-up descriptors itself and moves data both ways.
        for peer, buf, seed in ((a, ra, 3), (b, rb, 5)):
            key = peer.get_engine_desc().key
            c.register_remote_engine(dc.lookup(key))
            remote = dc.regions(key)["kv"]
            assert remote.engine_key == key and remote.size == n
            src, back = pattern(n, seed), np.zeros(n, np.uint8)
            src_md, back_md = c.register_array(src), c.register_array(back)
            wait_ok(c.write(src_md, 0, remote, 0, n, c.allocate_transfer_uid()))
            wait_ok(c.read(back_md, 0, remote, 0, n, c.allocate_transfer_uid()))
            assert np.array_equal(buf, src)
            assert np.array_equal(back, src)

        # Publishing again with fewer regions removes the others.
        db.publish(b, {"kv": dc.regions(b.get_engine_desc().key)["kv"]})
        assert list(dc.regions(b.get_engine_desc().key)) == ["kv"]


def test_watch_registers_peers_and_forgets_one_whose_handle_closed(etcd, engines, prefix):
    n = 4096
    a, c = engines.engine("watch_a"), engines.engine("watch_c")
    ra = np.zeros(n, np.uint8)
    da = etcd.connect(prefix)
    da.publish(a, {"kv": a.register_array(ra)})
    with etcd.connect(prefix) as dc:
        dc.watch(c)  # registers a: no register_remote_engine here
        remote = dc.regions(a.get_engine_desc().key)["kv"]
        src = c.register_array(pattern(n, 7))
        wait_ok(c.write(src, 0, remote, 0, n, c.allocate_transfer_uid()))
        assert np.array_equal(ra, pattern(n, 7))

        # a's handle closes (its lease is revoked): its keys go and c deregisters a, whose
        # engine still runs, so the failure can only be the deregistration.
        da.close()
        assert da.closed
        da.close()  # again: nothing
        wait_until("a unpublished", lambda: dc.lookup(a.get_engine_desc().key) is None, 5)
        assert dc.regions(a.get_engine_desc().key) == {}

        def forgotten():
            st = c.write(src, 0, remote, 0, n, c.allocate_transfer_uid())
            st.WaitFor(10_000)
            return "remote engine not registered" in st.Message()

        wait_until("c forgets a", forgotten, 5)

        # a publishes again on a new handle: c registers it again.
        with etcd.connect(prefix) as da2:
            da2.publish(a, {"kv": remote})

            def reached():
                return c.write(src, 0, remote, 0, n, c.allocate_transfer_uid()).WaitFor(10_000) == StatusCode.SUCCESS

            wait_until("c registers a again", reached, 5)


def test_watch_with_connect_peers_opens_lanes_before_any_transfer(etcd, engines, prefix):
    a, c = engines.engine("conn_a"), engines.engine("conn_c")
    with etcd.connect(prefix) as da, etcd.connect(prefix, connect_peers=True) as dc:
        da.publish(a, {})
        dc.watch(c)
        key = a.get_engine_desc().key

        def up():
            return c.peer_stats().get(key, {}).get("lane_connects", 0)

        # small_config: 2 lanes per peer.
        wait_until("c's lanes to a up", lambda: up() == 2, 10)


def test_unreachable_etcd_is_a_connection_error_within_the_timeout():
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=str(port)):
        Discovery([f"127.0.0.1:{port}"], connect_timeout_s=1)
    assert time.monotonic() - t0 < 5


def test_connect_releases_the_gil():
    """An endpoint that accepts TCP and never answers: connect blocks until its timeout while
    another Python thread keeps running."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)  # never accepted: the handshake completes, etcd's answer never comes
    ticks, stop = [0], threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=tick, daemon=True)
    try:
        t.start()
        t0 = time.monotonic()
        before = ticks[0]
        with pytest.raises(ConnectionError):
            Discovery([f"127.0.0.1:{srv.getsockname()[1]}"], connect_timeout_s=1)
        assert time.monotonic() - t0 < 5
        assert ticks[0] - before > 50, "the other thread did not run while connect blocked"
    finally:
        stop.set()
        t.join(5)
        srv.close()


def test_bad_names_and_options_are_refused(etcd, engines, prefix):
    slashed = engines.engine(key=f"disc/slashed_{os.getpid()}")
    e = engines.engine("names")
    md = e.register_array(np.zeros(8, np.uint8))
    with etcd.connect(prefix) as d:
        with pytest.raises(ValueError, match="'/'"):
            d.publish(slashed)
        with pytest.raises(ValueError, match="'/'"):
            d.lookup("a/b")
        with pytest.raises(ValueError, match="'/'"):
            d.regions("a/b")
        with pytest.raises(ValueError, match="region name"):
            d.publish(e, {"a/b": md})
        with pytest.raises(ValueError, match="region name"):
            d.publish(e, {"": md})
        with pytest.raises(ValueError, match="twice"):
            d.publish(e, [("kv", md), ("kv", md)])
        with pytest.raises(TypeError, match="MemoryDesc"):
            d.publish(e, {"kv": b"not a desc"})
        with pytest.raises(TypeError, match="regions"):
            d.publish(e, "kv")
        assert d.lookup(e.get_engine_desc().key) is None  # nothing half-published
    with pytest.raises(RuntimeError, match="closed"):
        d.lookup("x")
    with pytest.raises(RuntimeError, match="closed"):
        d.publish(e)
    with pytest.raises(ValueError, match="endpoints"):
        Discovery([])
    with pytest.raises(TypeError, match="endpoints"):
        Discovery(5)
    with pytest.raises(ValueError, match="lease_ttl_s"):
        Discovery([etcd.endpoint], lease_ttl_s=0)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="connect_timeout_s"):
            Discovery([etcd.endpoint], connect_timeout_s=bad)


def test_defaults_repr_and_a_single_endpoint_string(etcd):
    d = Discovery(etcd.endpoint)
    try:
        assert d.prefix == "/morio"
        assert not d.closed
        assert "/morio" in repr(d) and etcd.endpoint in repr(d)
    finally:
        d.close()
    assert "closed" in repr(d)
    assert Discovery([etcd.endpoint], "/x/").prefix == "/x"


def test_user_and_password(tmp_path, engines):
    """An etcd of this test's own with authentication on (enabled through etcd's JSON gateway,
    as an operator would with etcdctl): the right password publishes and looks up; a wrong
    one, or none, raises PermissionError within the timeout; options that cannot go together
    raise ValueError; a TLS file that is not there raises OSError naming it."""
    import json
    import urllib.request

    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("no `etcd` binary on PATH: these tests start a real etcd (apt-get install etcd-server)")
    e = Etcd(binary, str(tmp_path))
    try:
        def post(path: str, body: dict) -> None:
            req = urllib.request.Request(
                f"http://{e.endpoint}/v3/{path}", json.dumps(body).encode(),
                {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200, r.read()

        post("auth/user/add", {"name": "root", "password": "root-pw-py"})
        post("auth/user/grant", {"user": "root", "role": "root"})
        post("auth/enable", {})

        eng = engines.engine("py_auth")
        key = eng.get_engine_desc().key
        with Discovery([e.endpoint], "/pyauth", user="root", password="root-pw-py", lease_ttl_s=2) as d:
            d.publish(eng)
            assert d.lookup(key) == eng.get_engine_desc()
            assert "root-pw-py" not in repr(d)
        t0 = time.monotonic()
        with pytest.raises(PermissionError, match="password") as err:
            Discovery([e.endpoint], "/pyauth", user="root", password="not-it-9b1", connect_timeout_s=2)
        assert "not-it-9b1" not in str(err.value)
        with pytest.raises(PermissionError, match="authentication"):
            Discovery([e.endpoint], "/pyauth", connect_timeout_s=2)
        assert time.monotonic() - t0 < 6

        with pytest.raises(ValueError, match="needs password"):
            Discovery([e.endpoint], user="root")
        with pytest.raises(ValueError, match="needs user"):
            Discovery([e.endpoint], password="root-pw-py")
        with pytest.raises(ValueError, match="go together"):
            Discovery([e.endpoint], ca_file=tmp_path / "ca.pem", cert_file=tmp_path / "c.pem")
        with pytest.raises(ValueError, match="need ca_file"):
            Discovery([e.endpoint], cert_file=tmp_path / "c.pem", key_file=tmp_path / "k.pem")
        with pytest.raises(OSError, match="ca_file .*missing.pem"):
            Discovery([e.endpoint], ca_file=tmp_path / "missing.pem")
    finally:
        e.close()


def test_interpreter_exit_revokes_the_lease(etcd, prefix):
    """A process that exits without closing its handle unpublishes at exit (well before its
    30 s lease would run out)."""
    import sys
    import textwrap

    key = f"exiting_{os.getpid()}"
    code = textwrap.dedent(f"""
        import numpy as np
        from morio import BackendType, Discovery, IOEngine, IOEngineConfig
        e = IOEngine({key!r}, IOEngineConfig("127.0.0.1", 0))
        e.create_backend(BackendType.TCP)
        d = Discovery([{etcd.endpoint!r}], {prefix!r}, lease_ttl_s=30)
        d.publish(e, {{"kv": e.register_array(np.zeros(64, np.uint8))}})
        print("published", flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "published" in r.stdout, r.stderr
    with etcd.connect(prefix) as d:
        wait_until("the exited process unpublished", lambda: d.lookup(key) is None, 5)
        assert d.regions(key) == {}
