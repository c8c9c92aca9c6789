"""Writing records into `audit_inbox`, where the chainer finds them.

No action commits without its record: `add` writes it in the caller's own transaction.
Refusals and failures must outlive a rollback: outside a transaction `record_now` writes
one in a transaction of its own; inside one (opened with `transaction()`), `record_after`
queues it to be written as soon as that transaction has ended — never while it holds its
locks (one transaction per thread, decision 0010). `commit` and `commit_async` share one
commit among concurrent callers (group_commit.py). A front whose work runs in a worker
thread but answers on the event loop wraps that work in `deferred()`: the `commit`s made
inside are handed back, and it awaits `commit_async` for them before it answers, so no
worker thread sits waiting for a shared commit (the XKS proxy; docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, insert
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.audit.group_commit import AsyncGroupCommit, GroupCommit
from keyserver.core.audit.record import Outcome, PendingRecord, connection, payload
from keyserver.core.principal import RequestContext
from keyserver.store.db import retry_on_disconnect
from keyserver.store.models import AuditInbox

_AFTER = "audit_after_transaction"  # Session.info key: records written once it has ended
# Inside `deferred()`: where `commit` puts its records instead of committing them.
_DEFERRED: ContextVar[list[PendingRecord] | None] = ContextVar("audit_deferred", default=None)


class AuditWriter:
    def __init__(self, session_factory: sessionmaker[Session], *, autocommit_engine: Engine,
                 now: Callable[[], datetime], wake: Callable[[], None]) -> None:
        self._db = session_factory
        # Grouped records are single statements: autocommit saves BEGIN/COMMIT round trips.
        self._autocommit = autocommit_engine
        self._now = now
        self._wake = wake  # tells the chainer records are waiting
        self._grouped = GroupCommit(self._write_grouped)
        self._grouped_async = AsyncGroupCommit(self._write_grouped)

    def add(
        self,
        session: Session | Connection,
        ctx: RequestContext,
        *,
        action: str,
        outcome: Outcome = "allowed",
        object_type: str | None = None,
        object_id: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """Queue a record in the caller's transaction: it commits or rolls back with it."""
        # A Core insert on the session's connection: no unit-of-work bookkeeping (and no
        # ORM bulk-insert handling) on the hot path.
        record = PendingRecord(ctx, action, object_type, object_id, details, outcome)
        connection(session).execute(insert(AuditInbox).values(payload=payload(record, self._now())))
        # The chainer lingers before it looks, by which time this has usually committed;
        # if not, the next poll takes it.
        self._wake()

    def add_many(self, session: Session | Connection, records: list[PendingRecord]) -> None:
        """Queue several records in one statement, in the caller's transaction: for
        callers that group the records of concurrent requests into one commit."""
        if not records:
            return
        connection(session).execute(insert(AuditInbox), [
            {"payload": payload(r, self._now())} for r in records])
        self._wake()

    def commit(self, record: PendingRecord) -> None:
        """Record in a commit shared with concurrent callers, durable before this returns:
        for the hot paths (data keys, KMIP reads and exports), where one commit per
        request was most of the store's work. Call it outside any transaction. Inside
        `deferred()` the record is handed to the caller of `deferred` instead."""
        pending = _DEFERRED.get()
        if pending is not None:
            pending.append(record)
            return
        self._grouped.submit(record)

    @contextmanager
    def deferred(self) -> Iterator[list[PendingRecord]]:
        """The records `commit` is given in this block (this thread or task), not yet
        committed: the caller must `commit_async` every one of them before it answers, and
        answer nothing if that fails. Refusals (`record_now`) are not deferred."""
        pending: list[PendingRecord] = []
        token = _DEFERRED.set(pending)
        try:
            yield pending
        finally:
            _DEFERRED.reset(token)

    async def commit_async(self, record: PendingRecord) -> None:
        """`commit` for a caller on an event loop: awaits the shared commit."""
        await self._grouped_async.submit(record)

    def _write_grouped(self, records: list[PendingRecord]) -> None:
        def write() -> None:
            # begin(): a no-op transaction in autocommit (PostgreSQL), a real one on SQLite;
            # one multi-row INSERT is atomic either way.
            with self._autocommit.begin() as conn:
                self.add_many(conn, records)

        retry_on_disconnect(write)

    def record_now(
        self,
        ctx: RequestContext,
        *,
        action: str,
        outcome: Outcome,
        object_type: str | None = None,
        object_id: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """A record in a transaction of its own, for refusals and failures found
        outside any transaction (inside one, use `record_after`)."""
        with self._db.begin() as s:
            self.add(s, ctx, action=action, outcome=outcome, object_type=object_type,
                     object_id=object_id, details=details)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A write transaction (like `sessionmaker.begin()`) whose `record_after` records
        are written when it ends, whether it committed or rolled back."""
        session = self._db()
        session.info[_AFTER] = []
        try:
            with session.begin():
                yield session
        finally:
            after: list[PendingRecord] = session.info.pop(_AFTER)
            session.close()
            if after:
                with self._db.begin() as s:
                    self.add_many(s, after)

    def record_after(
        self,
        session: Session,
        ctx: RequestContext,
        *,
        action: str,
        outcome: Outcome,
        object_type: str | None = None,
        object_id: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """Queue a refusal or failure found inside `session` (from `transaction()`): it
        is recorded even when the transaction rolls back, right after it ends."""
        pending = session.info.get(_AFTER)
        if pending is None:
            raise RuntimeError("record_after needs a session from AuditService.transaction()")
        pending.append(PendingRecord(ctx, action, object_type, object_id, details, outcome))
