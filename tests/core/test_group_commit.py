"""The audit's group commit: every caller's record written exactly once and before its
`submit` returns, a failed write is the error of every caller in its batch (and no
other), and the lead passes on so no caller keeps writing for others."""

from __future__ import annotations

import threading

import pytest

from keyserver.core.audit import GroupCommit, PendingRecord
from keyserver.core.principal import system_context


def _record(n: int) -> PendingRecord:
    return PendingRecord(ctx=system_context("test"), action=f"test.{n}")


def test_every_record_is_written_once_before_its_caller_returns() -> None:
    written: list[str] = []
    batches: list[int] = []
    gate = threading.Event()

    def write(records: list[PendingRecord]) -> None:
        gate.wait(5)  # the first batch holds while the others queue behind it
        batches.append(len(records))
        written.extend(r.action for r in records)

    group = GroupCommit(write)
    returned: list[str] = []
    seen_at_return: dict[str, bool] = {}

    def caller(n: int) -> None:
        group.submit(_record(n))
        seen_at_return[f"test.{n}"] = f"test.{n}" in written
        returned.append(f"test.{n}")

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(40)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert sorted(written) == sorted(f"test.{n}" for n in range(40))
    assert len(written) == len(set(written))
    assert all(seen_at_return.values()) and len(seen_at_return) == 40
    assert len(batches) < 40, "concurrent callers shared commits"


def test_a_failed_write_fails_its_batch_only() -> None:
    fail_for = {"test.0"}
    group = GroupCommit(lambda records: (_ for _ in ()).throw(RuntimeError("disk full"))
                        if any(r.action in fail_for for r in records) else None)
    with pytest.raises(RuntimeError, match="disk full"):
        group.submit(_record(0))
    group.submit(_record(1))  # the next batch is written; the group is not stuck


def test_the_lead_passes_on_after_its_own_batch() -> None:
    """The first caller writes one batch and returns even while others keep arriving."""
    first_written = threading.Event()
    release_second = threading.Event()
    calls: list[list[str]] = []

    def write(records: list[PendingRecord]) -> None:
        calls.append([r.action for r in records])
        if len(calls) == 1:
            first_written.set()
        elif len(calls) == 2:
            release_second.wait(5)

    group = GroupCommit(write)
    leader_done = threading.Event()

    def leader() -> None:
        group.submit(_record(0))
        leader_done.set()

    t0 = threading.Thread(target=leader)
    t0.start()
    assert first_written.wait(5)
    others = [threading.Thread(target=group.submit, args=(_record(n),)) for n in range(1, 4)]
    for t in others:
        t.start()
    assert leader_done.wait(5), "the first caller returned without writing the later batches"
    release_second.set()
    for t in [t0, *others]:
        t.join(5)
    assert sorted(a for call in calls for a in call) == [f"test.{n}" for n in range(4)]


def test_on_an_event_loop_callers_await_a_shared_commit() -> None:
    import asyncio

    from keyserver.core.audit import AsyncGroupCommit

    written: list[list[str]] = []
    threads: set[str] = set()

    def write(records: list[PendingRecord]) -> None:
        threads.add(threading.current_thread().name)
        if any(r.action == "test.fail" for r in records):
            raise RuntimeError("disk full")
        written.append([r.action for r in records])

    group = AsyncGroupCommit(write)

    async def run() -> list[BaseException | None]:
        results = await asyncio.gather(*(group.submit(_record(n)) for n in range(50)), return_exceptions=True)
        failed = await asyncio.gather(group.submit(PendingRecord(ctx=system_context("t"), action="test.fail")),
                                      return_exceptions=True)
        await group.submit(_record(99))  # the next batch after a failure is written
        return [*results, *failed]

    results = asyncio.run(run())
    assert results[:50] == [None] * 50
    assert isinstance(results[50], RuntimeError)
    flat = [a for batch in written for a in batch]
    assert sorted(flat) == sorted([f"test.{n}" for n in range(50)] + ["test.99"])
    assert len(written) < 51, "callers shared commits"
    assert threading.current_thread().name not in threads, "the write ran off the event loop"
