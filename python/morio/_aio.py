"""asyncio support: awaiting transfers without blocking the event loop.

Each event loop gets one notifier (an ``eventfd`` the loop watches with ``add_reader``);
a status being awaited registers a completion callback that the engine's shard thread runs
when the transfer ends: it queues a token and rings the fd, without the GIL. The loop then
resolves the futures of the tokens it reads. No thread waits, nothing polls.
"""

import asyncio
import weakref
from typing import Iterable

from ._morio import StatusCode, TransferStatus, _Notifier


class _LoopWaiter:
    """The notifier of one event loop and the futures it resolves. It holds no reference to
    its loop (the loop holds it, through its reader callback), so a finished loop and its
    notifier go together."""

    def __init__(self, loop):
        self._notifier = _Notifier()
        self._pending = {}
        loop.add_reader(self._notifier.fileno(), self._drain)

    def _drain(self):
        for token in self._notifier.drain():
            fut, status = self._pending.pop(token, (None, None))
            if fut is not None and not fut.done():
                fut.set_result(status.Code())

    def wait(self, loop, status):
        fut = loop.create_future()
        self._pending[self._notifier.watch(status)] = (fut, status)
        return fut


_waiters = weakref.WeakKeyDictionary()


def future_of(status: TransferStatus) -> "asyncio.Future[StatusCode]":
    """A future of the running loop that resolves to ``status``'s code once it is not
    IN_PROGRESS (already resolved if it is not now)."""
    loop = asyncio.get_running_loop()
    code = status.Code()
    if code != StatusCode.IN_PROGRESS:
        fut = loop.create_future()
        fut.set_result(code)
        return fut
    waiter = _waiters.get(loop)
    if waiter is None:
        waiter = _waiters[loop] = _LoopWaiter(loop)
    return waiter.wait(loop, status)


async def wait_async(status: TransferStatus) -> StatusCode:
    """Wait for a transfer in asyncio: ``code = await morio.wait_async(st)`` (or
    ``await st``). Returns its StatusCode once it is not IN_PROGRESS; the loop runs other
    tasks meanwhile. Cancelling the awaiting task leaves the transfer alone."""
    return await future_of(status)


async def wait_all_async(statuses: Iterable[TransferStatus]) -> "list[StatusCode]":
    """Wait for every status (in any order); their codes, in the order given."""
    return list(await asyncio.gather(*(future_of(s) for s in statuses)))
