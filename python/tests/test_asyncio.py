"""asyncio: awaiting transfers (`await status`, `morio.wait_async`, `morio.wait_all_async`)
resolves from the engine's completion without blocking the event loop."""

import asyncio
import threading

import numpy as np
import pytest

import morio
from morio import MemoryDesc, StatusCode, TransferStatus

from _util import small_config, wait_ok


def _pair(engines, prefix):
    a, b = engines.pair(prefix, config=small_config())
    src = np.random.default_rng(1).integers(0, 255, 8 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    return a, b, src, dst, a.register_array(src), b.register_array(dst)


def test_await_a_status_and_wait_all(engines):
    a, b, src, dst, sm, dm = _pair(engines, "aio")

    async def main():
        code = await a.write(sm, 0, dm, 0, src.nbytes, a.allocate_transfer_uid())
        assert code == StatusCode.SUCCESS
        assert np.array_equal(src, dst)
        dst[:] = 0
        sts = [a.write(sm, i << 16, dm, i << 16, 1 << 16, a.allocate_transfer_uid()) for i in range(64)]
        # One that fails: memory the target never registered.
        bogus = MemoryDesc.unpack(dm.pack())
        bad = a.write(sm, 0, bogus, bogus.size, 1, a.allocate_transfer_uid())
        codes = await morio.wait_all_async(sts + [bad])
        assert codes[:-1] == [StatusCode.SUCCESS] * 64
        assert codes[-1] != StatusCode.SUCCESS
        assert np.array_equal(src[: 64 << 16], dst[: 64 << 16])
        assert await morio.wait_async(sts[0]) == StatusCode.SUCCESS  # already done

    asyncio.run(main())


def test_the_loop_runs_other_tasks_while_a_transfer_is_awaited(engines):
    a, b, src, dst, sm, dm = _pair(engines, "aio_free")

    async def main():
        ticks = 0
        done = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(ticker())
        for _ in range(4):
            assert await a.write(sm, 0, dm, 0, src.nbytes, a.allocate_transfer_uid()) == StatusCode.SUCCESS
        done.set()
        await t
        return ticks

    ticks = asyncio.run(main())
    assert ticks > 0, "the event loop was blocked while the transfers were awaited"
    assert np.array_equal(src, dst)


def test_cancelling_the_awaiting_task_leaves_the_transfer_alone(engines):
    a, b, src, dst, sm, dm = _pair(engines, "aio_cancel")

    async def main():
        st = a.write(sm, 0, dm, 0, src.nbytes, a.allocate_transfer_uid())
        task = asyncio.create_task(morio.wait_async(st))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return st

    st = asyncio.run(main())
    wait_ok(st)
    assert np.array_equal(src, dst)


def test_statuses_not_in_progress_resolve_at_once_and_no_loop_is_an_error(engines):
    async def main():
        return await TransferStatus()  # INIT: nothing will complete it

    assert asyncio.run(main()) == StatusCode.INIT
    with pytest.raises(RuntimeError, match="event loop"):
        TransferStatus().__await__()


def test_loops_of_several_threads_await_at_once(engines):
    a, b, src, dst, sm, dm = _pair(engines, "aio_threads")
    results, errors = [], []

    def run(i):
        async def main():
            off = i << 20
            return await a.write(sm, off, dm, off, 1 << 20, a.allocate_transfer_uid())

        try:
            results.append(asyncio.run(main()))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert results == [StatusCode.SUCCESS] * 4
    assert np.array_equal(src[: 4 << 20], dst[: 4 << 20])


def test_a_finished_loop_leaves_no_notifier_behind(engines):
    """Each asyncio.run makes a loop (and, once it awaits a transfer, a notifier): both go
    with the loop, no descriptor is left open."""
    import gc
    import os

    a, b, src, dst, sm, dm = _pair(engines, "aio_leak")

    async def main():
        return await a.write(sm, 0, dm, 0, 1 << 20, a.allocate_transfer_uid())

    asyncio.run(main())  # warm-up: lanes, the executor's threads
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        assert asyncio.run(main()) == StatusCode.SUCCESS
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 2
