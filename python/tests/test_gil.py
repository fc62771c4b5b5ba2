"""Waits release the GIL (another Python thread runs meanwhile) and honour Ctrl-C."""

import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from morio import StatusCode, TransferStatus

from _util import silent_peer


@pytest.fixture
def alarm():
    """Fail (instead of hanging the suite) if the test body blocks for more than 20 s."""

    def on_alarm(signum, frame):
        raise TimeoutError("test blocked for 20 s: a wait did not return")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


class Ticker:
    """A Python thread counting ticks (each needs the GIL) while `active` is set."""

    def __init__(self) -> None:
        self.ticks = 0
        self.active = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.active.is_set():
                self.ticks += 1
            time.sleep(0.001)

    def wait_ticks(self, n: int, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.ticks < n:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


def _blocking_call(method, engine, status):
    if method == "Wait":
        return status.Wait()
    if method == "WaitFor":
        return status.WaitFor(-1)
    if method == "WaitFor_timeout":
        return status.WaitFor(15_000)
    return engine.wait_all([status])


METHODS = ["Wait", "WaitFor", "WaitFor_timeout", "wait_all"]


@pytest.mark.parametrize("method", METHODS)
def test_thread_runs_while_waiting_on_status(engines, alarm, method):
    """The status completes only after another thread has ticked 20 times: the wait must not
    hold the GIL, or the ticker (and so the completer) could never run."""
    engine = engines.engine("gil", backend=False)
    status = TransferStatus()
    status.SetCode(StatusCode.IN_PROGRESS)
    ticker = Ticker()
    seen = {}

    def completer():
        seen["progressed"] = ticker.wait_ticks(20)
        seen["ticks"] = ticker.ticks
        status.Update(StatusCode.SUCCESS, "")

    t = threading.Thread(target=completer)
    t.start()
    try:
        ticker.active.set()  # from here the main thread is (about to be) in the wait
        rc = _blocking_call(method, engine, status)
    finally:
        t.join(10)
        ticker.close()
    assert rc == StatusCode.SUCCESS
    assert seen["progressed"] and seen["ticks"] >= 20


@pytest.mark.parametrize("method", METHODS)
def test_thread_runs_while_waiting_on_real_transfer(engines, alarm, method):
    """A real transfer that cannot finish (silent peer) until its op timeout: a Python
    thread keeps running for the whole wait, which ends with the timeout's error."""
    with silent_peer(engines, op_timeout_ms=400) as (e, lmd, rmd):
        ticker = Ticker()
        try:
            st = e.write(lmd, 0, rmd, 0, 64, 1)
            assert st.InProgress()
            ticker.active.set()
            rc = _blocking_call(method, e, st)
            ticks = ticker.ticks
        finally:
            ticker.close()
    assert rc == StatusCode.ERR_BAD_STATE, st.Message()
    # The wait lasted about 400 ms; a ticker holding the GIL 1 in ~1 ms ran many times.
    assert ticks >= 20


def test_bounded_waits_return_in_progress(engines, alarm):
    engine = engines.engine("bounded", backend=False)
    status = TransferStatus()
    status.SetCode(StatusCode.IN_PROGRESS)
    ticker = Ticker()
    ticker.active.set()
    try:
        assert status.WaitFor(200) == StatusCode.IN_PROGRESS
        assert engine.wait_all([status], timeout_ms=200) == StatusCode.IN_PROGRESS
        assert status.WaitFor(0) == StatusCode.IN_PROGRESS
        ticks = ticker.ticks
    finally:
        ticker.close()
    assert ticks >= 20
    assert status.InProgress()


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import signal, sys
    # Python's own SIGINT handler, even where this process started with SIGINT ignored (a
    # shell's background job without job control), which Python would leave ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from morio import IOEngine, IOEngineConfig, StatusCode, TransferStatus
    s = TransferStatus()
    s.SetCode(StatusCode.IN_PROGRESS)
    method = sys.argv[1]
    e = IOEngine("ctrl_c", IOEngineConfig("127.0.0.1", 0))
    print("ready", flush=True)
    if method == "Wait":
        s.Wait()
    elif method == "WaitFor":
        s.WaitFor(-1)
    elif method == "WaitFor_timeout":
        s.WaitFor(600_000)
    else:
        e.wait_all([s])
    print("returned", flush=True)
    """
)


@pytest.mark.parametrize("method", METHODS)
def test_ctrl_c_interrupts_wait(method):
    p = subprocess.Popen([sys.executable, "-c", CTRL_C_SCRIPT, method],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # let it enter the wait
        assert p.poll() is None, "the waiter exited before SIGINT"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert "KeyboardInterrupt" in err, err
    assert "returned" not in out
    assert p.returncode in (-signal.SIGINT, 128 + signal.SIGINT, 1), (p.returncode, err)
