"""Data path beyond MORI's cases: striped unaligned transfers, many in flight, threads, peer restart."""

import threading

import numpy as np
import pytest

from morio import StatusCode

from _util import pattern, small_config, wait_done, wait_inbound, wait_ok

STRIPED = dict(num_data_conns=4, chunk_bytes=4096, striping_threshold_bytes=8192)


@pytest.mark.parametrize("n", [1, 8191, 8192, (3 << 20) + 12345])
def test_striped_unaligned_write_and_read(engines, n):
    a, b = engines.pair("striped", config=small_config(**STRIPED))
    src = np.random.default_rng(n).integers(0, 256, n + 7, dtype=np.uint8)
    dst = np.zeros(n + 11, np.uint8)
    smd, dmd = a.register_array(src), b.register_array(dst)
    wait_ok(a.write(smd, 7, dmd, 3, n, a.allocate_transfer_uid()))
    assert np.array_equal(dst[3 : 3 + n], src[7 : 7 + n])
    assert not dst[:3].any() and not dst[3 + n :].any()  # nothing outside the range
    back = np.zeros(n + 1, np.uint8)
    bmd = a.register_array(back)
    wait_ok(a.read(bmd, 1, dmd, 3, n, a.allocate_transfer_uid()))
    assert np.array_equal(back[1:], src[7 : 7 + n]) and back[0] == 0


def test_many_in_flight(engines):
    a, b = engines.pair("many")
    n = 4000  # below the target's cap of 4096 inbound statuses per peer (MORI's)
    src, dst = pattern(n, 9), np.zeros(n, np.uint8)
    smd, dmd = a.register_array(src), b.register_array(dst)
    uids = [a.allocate_transfer_uid() for _ in range(n)]
    sts = [a.write(smd, i, dmd, n - 1 - i, 1, uids[i]) for i in range(n)]  # reversed, one byte each
    assert a.wait_all(sts, timeout_ms=30_000) == StatusCode.SUCCESS
    assert np.array_equal(dst, src[::-1])
    key = a.get_engine_desc().key
    assert all(wait_inbound(b, key, u).Succeeded() for u in uids)


def test_threads_submit_concurrently(engines):
    a, b = engines.pair("threads")
    n_threads, per, size = 4, 64, 256
    src = pattern(n_threads * per * size, 10)
    dst = np.zeros_like(src)
    smd, dmd = a.register_array(src), b.register_array(dst)
    codes = []

    def worker(t):
        sess = a.create_session(smd, dmd)
        sts = []
        for i in range(per):
            off = (t * per + i) * size
            sts.append(sess.write(off, off, size, sess.allocate_transfer_uid()))
        codes.extend(wait_done(s) for s in sts)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert codes == [StatusCode.SUCCESS] * (n_threads * per)
    assert np.array_equal(dst, src)


def test_peer_restart_with_same_key(engines):
    a, b = engines.pair("restart")
    b_key = b.get_engine_desc().key
    src = pattern(1000, 11)
    smd = a.register_array(src)
    dst1 = np.zeros(1000, np.uint8)
    wait_ok(a.write(smd, 0, b.register_array(dst1), 0, 1000, a.allocate_transfer_uid()))
    b.close()
    b2 = engines.engine(key=b_key)  # the peer comes back on a new port
    b2.register_remote_engine(a.get_engine_desc())
    dst2 = np.zeros(1000, np.uint8)
    d2md = b2.register_array(dst2)
    st = a.write(smd, 0, d2md, 0, 1000, a.allocate_transfer_uid())
    assert wait_done(st) != StatusCode.SUCCESS  # still the old address
    a.register_remote_engine(b2.get_engine_desc())  # replaces it
    uid = a.allocate_transfer_uid()
    wait_ok(a.write(smd, 0, d2md, 0, 1000, uid))
    assert np.array_equal(dst2, src) and np.array_equal(dst1, src)
    assert wait_inbound(b2, a.get_engine_desc().key, uid).Succeeded()


def test_the_target_waits_for_an_inbound_status(engines):
    """wait_inbound_transfer_status blocks (GIL released) until the transfer ends at the
    target, then pops its status; a uid that never comes is None at the timeout."""
    import time

    a, b = engines.pair("inbound_wait")
    n = 1 << 20
    src, dst = pattern(n, 3), np.zeros(n, np.uint8)
    sm, dm = a.register_array(src), b.register_array(dst)
    uid = a.allocate_transfer_uid()
    key = a.get_engine_desc().key
    got = []
    waiter = threading.Thread(target=lambda: got.append(b.wait_inbound_transfer_status(key, uid, 20_000)))
    waiter.start()
    time.sleep(0.05)
    wait_ok(a.write(sm, 0, dm, 0, n, uid))
    waiter.join(20)
    assert got and got[0] is not None and got[0].Code() == StatusCode.SUCCESS
    assert np.array_equal(src, dst)
    t0 = time.monotonic()
    assert b.wait_inbound_transfer_status(key, uid + 1000, timeout_ms=150) is None
    assert time.monotonic() - t0 >= 0.14
    assert b.wait_inbound_transfer_status(key, uid, timeout_ms=0) is None  # popped already
