"""Group commit: concurrent callers whose records must be durable before they return
share one INSERT and one commit (the hot paths: data keys, KMIP reads and exports)."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable

from keyserver.core.audit.record import PendingRecord


class _Slot:
    __slots__ = ("done", "error", "lead")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.lead = False


class GroupCommit:
    """Group commit: a caller's record is committed before `submit` returns, but
    concurrent callers share one INSERT and one commit. The first caller to arrive
    writes its own record and whatever queued meanwhile, then hands the lead to the
    oldest waiter, so no caller waits for more than the batch in flight and its own; no
    extra thread, so a lone caller pays nothing for the grouping. A failed write is every
    waiter of its batch's error."""

    def __init__(self, write: Callable[[list[PendingRecord]], None]) -> None:
        self._write = write
        self._lock = threading.Lock()
        self._queue: list[tuple[PendingRecord, _Slot]] = []
        self._writing = False

    def submit(self, record: PendingRecord) -> None:
        slot = _Slot()
        with self._lock:
            self._queue.append((record, slot))
            if not self._writing:
                self._writing = slot.lead = True
        if not slot.lead:
            slot.done.wait()
            if not slot.lead:  # written by a leader's batch
                if slot.error is not None:
                    raise slot.error
                return
        with self._lock:
            batch, self._queue = self._queue, []
        error: BaseException | None = None
        try:
            self._write([r for r, _ in batch])
        except BaseException as exc:
            error = exc
        for _, waiter in batch:
            if waiter is not slot:
                waiter.error = error
                waiter.done.set()
        with self._lock:
            if self._queue:
                successor = self._queue[0][1]
                successor.lead = True
                successor.done.set()
            else:
                self._writing = False
        if error is not None:
            raise error


class _LoopQueue:
    __slots__ = ("queue", "task")

    def __init__(self) -> None:
        self.queue: list[tuple[PendingRecord, asyncio.Future[None]]] = []
        self.task: asyncio.Task[None] | None = None


class AsyncGroupCommit:
    """`GroupCommit` for callers on an event loop: they await their record's commit
    instead of blocking a thread, and the batch is written in the loop's executor, so
    a batch costs one thread hand-off instead of one per caller. Records queued while a
    batch is written go in the next one; a failed write is the error of its batch only."""

    def __init__(self, write: Callable[[list[PendingRecord]], None]) -> None:
        self._write = write
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopQueue] = weakref.WeakKeyDictionary()

    async def submit(self, record: PendingRecord) -> None:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _LoopQueue()
        done: asyncio.Future[None] = loop.create_future()
        state.queue.append((record, done))
        if state.task is None:
            state.task = loop.create_task(self._drain(loop, state))
        await done

    async def _drain(self, loop: asyncio.AbstractEventLoop, state: _LoopQueue) -> None:
        try:
            while state.queue:
                batch, state.queue = state.queue, []
                try:
                    await loop.run_in_executor(None, self._write, [r for r, _ in batch])
                except BaseException as exc:  # every waiter of the batch learns it failed
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    for _, done in batch:
                        if not done.done():  # a caller that went away (cancelled) needs nothing
                            done.set_result(None)
        finally:
            state.task = None
