"""Engine, peer and memory lifecycles: close, remove_backend, deregistration and peers that
go away or never answer end transfers with an error status (or an exception), never a hang."""

import atexit
import gc
import logging
import os
import subprocess
import sys
import time
import weakref

import numpy as np
import pytest

from morio import BackendType, IOEngine, IOEngineConfig, MemoryLocationType, StatusCode, set_log_level

from _util import pattern, silent_peer, small_config, unique_key, wait_done, wait_ok


def test_no_hang_on_silent_peer(engines):
    """A peer that accepts connections but never speaks: the transfer fails at op_timeout_ms."""
    with silent_peer(engines, op_timeout_ms=300) as (e, lmd, rmd):
        t0 = time.monotonic()
        st = e.write(lmd, 0, rmd, 0, 64, 1)
        assert wait_done(st, timeout_s=10) == StatusCode.ERR_BAD_STATE, st.Message()
        assert time.monotonic() - t0 < 10


def test_duplicate_inflight_uid(wired):
    a, b, src, dst, src_md, dst_md = wired
    sts = [a.write(src_md, 0, dst_md, 0, 64, 777) for _ in range(2)]
    codes = [wait_done(s) for s in sts]
    assert StatusCode.SUCCESS in codes  # the first proceeds
    assert set(codes) <= {StatusCode.SUCCESS, StatusCode.ERR_BAD_STATE}
    assert np.array_equal(dst, src)


def test_peer_closed(engines):
    a, b = engines.pair("closed_peer", config=small_config(op_timeout_ms=2000))
    src, dst = pattern(64, 3), np.zeros(64, np.uint8)
    smd, dmd = a.register_array(src), b.register_array(dst)
    wait_ok(a.write(smd, 0, dmd, 0, 64, 1))
    b.close()
    st = a.write(smd, 0, dmd, 0, 64, 2)
    assert st.Failed() or wait_done(st, timeout_s=10) != StatusCode.SUCCESS, st.Message()


def test_close_with_transfer_in_flight(engines):
    a, b = engines.pair("close_inflight")
    n = 16 << 20
    smd, dmd = a.register_array(np.ones(n, np.uint8)), b.register_array(np.zeros(n, np.uint8))
    st = a.write(smd, 0, dmd, 0, n, 1)
    a.close()
    code = wait_done(st, timeout_s=10)
    assert code in (StatusCode.SUCCESS, StatusCode.ERR_BAD_STATE), st.Message()


def _closed_calls(e, md, desc):
    return {
        "get_engine_desc": lambda: e.get_engine_desc(),
        "create_backend": lambda: e.create_backend(BackendType.TCP, small_config()),
        "remove_backend": lambda: e.remove_backend(BackendType.TCP),
        "register_remote_engine": lambda: e.register_remote_engine(desc),
        "deregister_remote_engine": lambda: e.deregister_remote_engine(desc),
        "register_array": lambda: e.register_array(np.zeros(8, np.uint8)),
        "register_memory": lambda: e.register_memory(np.zeros(8).ctypes.data, 8, -1, MemoryLocationType.CPU),
        "deregister_memory": lambda: e.deregister_memory(md),
        "allocate_transfer_uid": lambda: e.allocate_transfer_uid(),
        "read": lambda: e.read(md, 0, md, 0, 8, 1),
        "write": lambda: e.write(md, 0, md, 0, 8, 1),
        "batch_read": lambda: e.batch_read([md], [[0]], [md], [[0]], [[8]], [1]),
        "batch_write": lambda: e.batch_write([md], [[0]], [md], [[0]], [[8]], [1]),
        "create_session": lambda: e.create_session(md, md),
        "pop_inbound_transfer_status": lambda: e.pop_inbound_transfer_status("k", 1),
        "num_shards": lambda: e.num_shards(),
        "shard_cpus": lambda: e.shard_cpus(),
        "stats": lambda: e.stats(),
        "metrics": lambda: e.metrics(),
    }


def test_calls_after_close_raise_runtime_error(engines):
    e = engines.engine("closed")
    peer = engines.engine("closed_peer")
    md = e.register_array(np.zeros(64, np.uint8))
    desc = peer.get_engine_desc()
    e.close()
    e.close()  # idempotent
    assert "closed" in repr(e)
    for name, call in _closed_calls(e, md, desc).items():
        with pytest.raises(RuntimeError, match="closed"):
            call()
            pytest.fail(name)
    with IOEngine(unique_key("ctx"), IOEngineConfig("127.0.0.1", 0)) as ctx:
        ctx.create_backend(BackendType.TCP, small_config())
    with pytest.raises(RuntimeError):
        ctx.get_engine_desc()


def test_session_after_close_fails_cleanly(wired):
    a, b, src, dst, src_md, dst_md = wired
    sess = a.create_session(src_md, dst_md)
    a.close()
    st = sess.write(0, 0, 64, 1)
    assert wait_done(st) == StatusCode.ERR_BAD_STATE, st.Message()
    assert not dst.any()


def test_session_outliving_its_engine_object(engines):
    a, b = engines.pair("sess_gc")
    src, dst = pattern(4096, 5), np.zeros(4096, np.uint8)
    src_ref = weakref.ref(src)
    sess = a.create_session(a.register_array(src), b.register_array(dst))
    wait_ok(sess.write(0, 0, 4096, 1))
    assert np.array_equal(dst, src)
    engines.forget(a)
    del a, src
    gc.collect()
    assert src_ref() is None  # the engine object went away and released its registrations
    dst[:] = 0
    st = sess.write(0, 0, 4096, 2)  # must not read the freed memory
    assert wait_done(st) == StatusCode.ERR_BAD_STATE, st.Message()
    assert not dst.any()


@pytest.mark.parametrize("side", ["initiator", "target"])
@pytest.mark.parametrize("op", ["write", "read"])
def test_deregister_during_transfer(engines, side, op):
    a, b = engines.pair("dereg_inflight", config=small_config(op_timeout_ms=5000))
    n = 8 << 20
    src, dst = np.full(n, 7, np.uint8), np.zeros(n, np.uint8)
    refs = weakref.ref(src), weakref.ref(dst)
    smd, dmd = a.register_array(src), b.register_array(dst)
    del src, dst
    st = getattr(a, op)(smd, 0, dmd, 0, n, a.allocate_transfer_uid())
    first, second = ((a, smd), (b, dmd)) if side == "initiator" else ((b, dmd), (a, smd))
    first[0].deregister_memory(first[1])  # returns once no transfer uses the memory
    second[0].deregister_memory(second[1])
    code = wait_done(st)
    assert code in (StatusCode.SUCCESS, StatusCode.ERR_NOT_FOUND, StatusCode.ERR_BAD_STATE), st.Message()
    gc.collect()
    assert refs[0]() is None and refs[1]() is None


def test_remove_backend_then_create_again(engines):
    a, b = engines.pair("rmbe")
    src, dst = pattern(64, 4), np.zeros(64, np.uint8)
    smd, dmd = a.register_array(src), b.register_array(dst)
    n = 8 << 20
    big_md = a.register_array(np.ones(n, np.uint8))
    big_dst = b.register_array(np.zeros(n, np.uint8))
    inflight = a.write(big_md, 0, big_dst, 0, n, a.allocate_transfer_uid())
    a.remove_backend(BackendType.TCP)
    assert wait_done(inflight) in (StatusCode.SUCCESS, StatusCode.ERR_BAD_STATE), inflight.Message()
    assert a.num_shards() == 0
    a.remove_backend(BackendType.TCP)  # again: no error
    st = a.write(smd, 0, dmd, 0, 64, a.allocate_transfer_uid())
    assert wait_done(st) == StatusCode.ERR_BAD_STATE, st.Message()
    assert a.create_session(smd, dmd) is None
    assert not dst.any()
    a.create_backend(BackendType.TCP, small_config())
    a.register_remote_engine(b.get_engine_desc())
    b.register_remote_engine(a.get_engine_desc())
    wait_ok(a.write(smd, 0, dmd, 0, 64, a.allocate_transfer_uid()))
    assert np.array_equal(dst, src)
    # The target removes its backend: the initiator gets an error status, not a hang.
    b.remove_backend(BackendType.TCP)
    st = a.write(smd, 0, dmd, 0, 64, a.allocate_transfer_uid())
    assert wait_done(st) != StatusCode.SUCCESS, st.Message()


EXIT_SCRIPT = """
import sys, threading, time
import numpy as np
from morio import BackendType, IOEngine, IOEngineConfig, StatusCode, TcpBackendConfig, TransferStatus
e = IOEngine("exiting", IOEngineConfig("127.0.0.1", 0))
e.create_backend(BackendType.TCP, TcpBackendConfig(num_data_conns=2))
e.register_remote_engine(e.get_engine_desc())
s = TransferStatus()
s.SetCode(StatusCode.IN_PROGRESS)
if sys.argv[1] == "waiting_thread":
    threading.Thread(target=s.Wait, daemon=True).start()
    threading.Thread(target=lambda: e.wait_all([s]), daemon=True).start()
else:
    n = 32 << 20
    am, bm = e.register_array(np.ones(n, np.uint8)), e.register_array(np.zeros(n, np.uint8))
    sts = [e.write(am, 0, bm, 0, n, i) for i in range(4)]
    threading.Thread(target=lambda: [x.Wait() for x in sts], daemon=True).start()
time.sleep(0.1)
print("exiting", flush=True)
"""


@pytest.mark.parametrize("mode", ["waiting_thread", "transfers_in_flight"])
def test_interpreter_exit_with_live_engine(mode):
    """Exit without close(): daemon threads blocked in waits, transfers in flight; a clean exit."""
    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, mode], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "exiting"), r.stderr


def test_create_backend_twice_is_ignored_with_warning(engines, caplog, restore_log_level):
    set_log_level("warning")
    e = engines.engine("twice", config=small_config(num_data_conns=1))
    port, shards = e.get_engine_desc().port, e.num_shards()
    with caplog.at_level(logging.WARNING, logger="morio"):
        e.create_backend(BackendType.TCP, small_config(num_data_conns=2))  # MORI: warning, ignored
    assert (e.get_engine_desc().port, e.num_shards()) == (port, shards)
    assert "already created" in caplog.text


def test_forked_child_cannot_use_the_parents_engine_and_exits_cleanly(wired):
    """A fork copies no shard threads: the child gets a clear error, never a hang, and its
    exit leaves the parent's engine alone."""
    a, b, src, dst, smd, dmd = wired
    sess = a.create_session(smd, dmd)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what happened through the pipe, then exit at once
        os.close(r)
        out = []
        for call in (lambda: a.write(smd, 0, dmd, 0, 8, 1), lambda: sess.write(0, 0, 8, 2),
                     a.allocate_transfer_uid):
            try:
                call()
                out.append("no error")
            except RuntimeError as e:
                out.append("forked" if "forked child" in str(e) else f"other: {e}")
        os.write(w, ",".join(out).encode())
        os.close(w)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert got == "forked,forked,forked", got
    # The parent's engine still works.
    st = a.write(smd, 0, dmd, 0, 64, a.allocate_transfer_uid())
    assert st.WaitFor(10000) == StatusCode.SUCCESS, st.Message()
    assert (src == dst).all()


def test_forked_child_exiting_normally_does_not_hang(wired):
    """A child that exits through the interpreter (atexit, object drops) must not try to stop
    the parent's shard threads."""
    a, _b, _src, _dst, _smd, _dmd = wired
    pid = os.fork()
    if pid == 0:  # in pytest's process: leave through os._exit, never back into pytest
        code = 0
        try:
            a.close()  # the engine object's own stop path
            atexit._run_exitfuncs()  # morio's exit hook: stops "every engine" of this process
        except BaseException:
            code = 3
        os._exit(code)
    deadline = time.time() + 20
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung at exit")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
