"""The embedded store's in-process queue for SQLite's write lock (decision 0010)."""

from __future__ import annotations

import threading

from keyserver.store.db import _WriterQueue


def test_writers_get_the_turn_in_arrival_order() -> None:
    q = _WriterQueue()
    assert q.acquire(1)
    order: list[int] = []
    arrived = [threading.Event() for _ in range(3)]

    def writer(i: int) -> None:
        arrived[i].set()
        assert q.acquire(10)
        order.append(i)
        q.release()

    threads = []
    for i in range(3):  # queued one after another
        t = threading.Thread(target=writer, args=(i,))
        t.start()
        arrived[i].wait()
        threads.append(t)
        while len(q._waiting) < i + 1:
            threading.Event().wait(0.001)
    q.release()
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2]


def test_a_waiter_that_times_out_leaves_the_queue_and_others_go_on() -> None:
    q = _WriterQueue()
    assert q.acquire(1)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(q.acquire(0.05)))
    t.start()
    t.join(10)
    assert result == [False] and not q._waiting
    other = threading.Thread(target=q.release)  # not the holder: changes nothing
    other.start()
    other.join()
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(q.acquire(0.05)))
    t.start()
    t.join(10)
    assert got == [False]
    q.release()
    assert q.acquire(0.05)
    q.release()
