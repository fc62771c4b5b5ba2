"""TransferStatus and wait_all semantics (MORI-IO reference §1.8)."""

import threading
import time

import pytest

from morio import IOEngine, IOEngineConfig, StatusCode, TransferStatus


def status(code):
    s = TransferStatus()
    s.SetCode(code)
    return s


@pytest.fixture
def engine():
    e = IOEngine("status_engine", IOEngineConfig("127.0.0.1", 0))
    yield e
    e.close()


def test_enum_values_are_moris():
    assert [(c.name, int(c)) for c in StatusCode] == [
        ("SUCCESS", 0), ("INIT", 1), ("IN_PROGRESS", 2), ("ERR_INVALID_ARGS", 11),
        ("ERR_NOT_FOUND", 12), ("ERR_RDMA_OP", 13), ("ERR_BAD_STATE", 14), ("ERR_GPU_OP", 15)]


def test_new_status_and_predicates():
    s = TransferStatus()
    assert s.Code() == StatusCode.INIT and isinstance(s.Code(), StatusCode)
    assert (s.Init(), s.InProgress(), s.Succeeded(), s.Failed()) == (True, False, False, False)
    assert s.Message() == ""
    # Waits return at once on a status that is not in progress.
    assert s.Wait() == StatusCode.INIT and s.WaitFor(-1) == StatusCode.INIT
    for code, pred in [(StatusCode.IN_PROGRESS, "InProgress"), (StatusCode.SUCCESS, "Succeeded"),
                       (StatusCode.ERR_GPU_OP, "Failed"), (StatusCode.ERR_INVALID_ARGS, "Failed")]:
        s = status(code)
        assert getattr(s, pred)() and s.Code() == code


def test_update_first_error_wins_and_setcode_overrides():
    s = status(StatusCode.IN_PROGRESS)
    s.Update(StatusCode.ERR_NOT_FOUND, "first")
    s.Update(StatusCode.ERR_BAD_STATE, "second")
    s.Update(StatusCode.SUCCESS, "")
    assert (s.Code(), s.Message()) == (StatusCode.ERR_NOT_FOUND, "first")
    s.SetCode(StatusCode.SUCCESS)  # unconditional
    assert s.Succeeded() and s.Message() == "first"
    s.SetMessage("m")
    assert s.Message() == "m" and "SUCCESS" in repr(s)
    s.Update(StatusCode.IN_PROGRESS, "again")  # not an error: replaced
    assert s.InProgress() and s.Message() == "again"


def test_bad_codes():
    s = TransferStatus()
    with pytest.raises(ValueError):
        s.SetCode(99)
    with pytest.raises(ValueError):
        s.Update(3, "")
    with pytest.raises((OverflowError, ValueError)):
        s.SetCode(-1)
    assert s.Init()


def test_waitfor_bounded_and_poll():
    s = status(StatusCode.IN_PROGRESS)
    assert s.WaitFor(0) == StatusCode.IN_PROGRESS
    t0 = time.monotonic()
    assert s.WaitFor(50) == StatusCode.IN_PROGRESS
    assert time.monotonic() - t0 >= 0.04  # it did wait


def test_wait_all_semantics(engine):
    ok, err1, err2 = status(StatusCode.SUCCESS), status(StatusCode.ERR_NOT_FOUND), status(StatusCode.ERR_BAD_STATE)
    pending = status(StatusCode.IN_PROGRESS)
    assert engine.wait_all([]) == StatusCode.SUCCESS
    assert engine.wait_all([None, ok, None]) == StatusCode.SUCCESS
    assert engine.wait_all([ok, err2, err1]) == StatusCode.ERR_BAD_STATE  # first error in list order
    assert engine.wait_all([pending], timeout_ms=30) == StatusCode.IN_PROGRESS
    assert engine.wait_all([err1, pending], timeout_ms=30) == StatusCode.ERR_NOT_FOUND  # error seen wins
    assert engine.wait_all((ok, pending), timeout_ms=0) == StatusCode.IN_PROGRESS  # tuples too


def test_wait_all_blocks_until_all_done(engine):
    sts = [status(StatusCode.IN_PROGRESS) for _ in range(4)]

    def finish():
        for i, s in enumerate(reversed(sts)):
            time.sleep(0.01)
            s.Update(StatusCode.ERR_RDMA_OP if i == 1 else StatusCode.SUCCESS, "x" if i == 1 else "")

    t = threading.Thread(target=finish)
    t.start()
    rc = engine.wait_all(sts, timeout_ms=-1)
    t.join()
    assert rc == StatusCode.ERR_RDMA_OP
    assert not any(s.InProgress() for s in sts)


def test_wait_spin_is_adaptive_unless_set():
    """A fixed window replaces the adaptive one until set_wait_spin_adaptive(); either way a
    wait for a status completed by another thread returns its code."""
    import morio

    try:
        for setting in (lambda: morio.set_wait_spin_us(0), morio.set_wait_spin_adaptive):
            setting()
            s = status(StatusCode.IN_PROGRESS)
            t = threading.Timer(0.02, lambda: s.SetCode(StatusCode.SUCCESS))
            t.start()
            t0 = time.monotonic()
            assert s.Wait() == StatusCode.SUCCESS
            assert time.monotonic() - t0 >= 0.015
            t.join()
    finally:
        morio.set_wait_spin_adaptive()


def test_busy_poll_is_a_setting_and_its_steps_aside_a_stat(engines):
    """`busy_poll_us`: None (the default: MORIO_BUSY_POLL_US, else 100 µs on hosts of 8 CPUs
    or more), 0 for off, or a window; engines take each, and every shard's stats say how
    often its poller stepped aside."""
    from morio import TcpBackendConfig

    from _util import small_config

    assert TcpBackendConfig().busy_poll_us is None
    assert TcpBackendConfig(busy_poll_us=0).busy_poll_us == 0
    c = TcpBackendConfig(busy_poll_us=250)
    assert c.busy_poll_us == 250
    c.busy_poll_us = None
    assert c.busy_poll_us is None
    for us in (None, 0, 200):
        e = engines.engine("busy", config=small_config(busy_poll_us=us))
        stats = e.stats()
        assert stats and all(
            s["busy_poll_backoffs"] >= 0 and s["busy_poll_handoffs"] >= 0 for s in stats
        )
