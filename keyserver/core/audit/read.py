"""Reading the log: one record, a filtered page newest first, and the filter itself —
exact fields, prefixes and words through the word index (keyserver.core.audit_search)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.audit.record import AuditRecord
from keyserver.core.audit_search import hits, matching, words_of
from keyserver.core.errors import InvalidInput
from keyserver.store.models import AuditEvent, AuditHead, AuditInbox


@dataclass(frozen=True, slots=True)
class AuditFilter:
    actor: str | None = None
    action: str | None = None
    object_type: str | None = None
    object_id: str | None = None
    outcome: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    q: str | None = None  # words every record must hold (keyserver.core.audit_search)


SEARCH_COUNT_CAP = 10_000  # a search counts its matches this far (AuditReader.query)


def searches(flt: AuditFilter) -> bool:
    """Whether the filter goes through the word index: words, or an actor or object prefix."""
    return bool(flt.q or (flt.actor or "").endswith("*") or (flt.object_id or "").endswith("*"))


class AuditReader:
    def __init__(self, session_factory: sessionmaker[Session], engine: Engine) -> None:
        self._db = session_factory
        self._engine = engine

    def pending(self) -> int:
        with self._db() as s:
            return int(s.execute(select(func.count()).select_from(AuditInbox)).scalar_one())

    def query(
        self, flt: AuditFilter, *, limit: int = 50, before_seq: int | None = None
    ) -> tuple[list[AuditRecord], int, bool]:
        """Newest first; returns the page, the number of matching records and whether that
        number is exact. A search by words or prefixes counts to SEARCH_COUNT_CAP and no
        further (the console shows "10,000+"): counting every record holding a common word
        costs more than the page."""
        if not 1 <= limit <= 1000:
            raise InvalidInput("limit must be between 1 and 1000")
        searching = searches(flt)
        with self._db() as s:
            if flt == AuditFilter():
                # Unfiltered, the total is the head's sequence number (the chain numbers its
                # records 1, 2, 3, ...): no count of millions of rows for the first page.
                head = s.get(AuditHead, 1)
                return self._page(s, flt, limit, before_seq), head.seq if head is not None else 0, True
            if not searching:
                total = int(s.execute(self.filtered(select(func.count()).select_from(AuditEvent), flt)).scalar_one())
                return self._page(s, flt, limit, before_seq), total, True
            self.custom_plans(s)
            # Words alone are counted in the word index without meeting the log: joined to
            # it, PostgreSQL walks both tables with the words as a filter for a capped count
            # (0.7 s for a common word among a million records, against 23 ms). With other
            # filters the join is needed, and its plans measured best left to the planner
            # (docs/audit.md "Searching").
            if flt == AuditFilter(q=flt.q):
                found = hits(self._engine.dialect.name, flt.q or "").limit(SEARCH_COUNT_CAP + 1).subquery()
            else:
                found = self.filtered(select(AuditEvent.seq), flt).limit(SEARCH_COUNT_CAP + 1).subquery()
            total = int(s.execute(select(func.count()).select_from(found)).scalar_one())
            # Few matches: take them from the word index, then order them. Many: the newest
            # fifty are near the head of the log, and the planner walks to them.
            rows = self._page(s, flt, limit, before_seq, materialize=total <= SEARCH_COUNT_CAP)
            return rows, min(total, SEARCH_COUNT_CAP), total <= SEARCH_COUNT_CAP

    def _page(self, s: Session, flt: AuditFilter, limit: int, before_seq: int | None, *,
              materialize: bool = False) -> list[AuditRecord]:
        stmt = self.filtered(select(AuditEvent), flt, materialize=materialize)
        if before_seq is not None:
            stmt = stmt.where(AuditEvent.seq < before_seq)
        return [AuditRecord.of(r) for r in s.execute(stmt.order_by(AuditEvent.seq.desc()).limit(limit)).scalars()]

    def custom_plans(self, s: Session) -> None:
        """Plans made for this transaction's search words, not a generic plan cached from
        earlier ones (keyserver.core.audit_search)."""
        if self._engine.dialect.name == "postgresql":
            s.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))

    def get(self, seq: int) -> AuditRecord | None:
        with self._db() as s:
            row = s.get(AuditEvent, seq)
            return AuditRecord.of(row) if row is not None else None

    def _field(self, stmt: Any, column: Any, value: str, materialize: bool) -> Any:
        """`value` exactly, or, ending in `*`, as a prefix: found through the word index
        (the prefix's words), then compared exactly — case-sensitively on every store,
        which SQLite's LIKE is not."""
        if not value.endswith("*"):
            return stmt.where(column == value)
        prefix = value.rstrip("*")
        if not words_of(prefix):
            raise InvalidInput("a prefix needs at least one letter or digit", code="invalid_search")
        return stmt.where(matching(self._engine.dialect.name, value, materialize=materialize),
                          func.substr(column, 1, len(prefix)) == prefix)

    def filtered(self, stmt: Any, flt: AuditFilter, *, materialize: bool = False) -> Any:
        if flt.q:
            stmt = stmt.where(matching(self._engine.dialect.name, flt.q, materialize=materialize))
        if flt.actor:
            stmt = self._field(stmt, AuditEvent.actor, flt.actor, materialize)
        if flt.action:
            # "keys." matches every key action; an exact name matches itself.
            if flt.action.endswith("."):
                stmt = stmt.where(AuditEvent.action.startswith(flt.action))
            else:
                stmt = stmt.where(AuditEvent.action == flt.action)
        if flt.object_type:
            stmt = stmt.where(AuditEvent.object_type == flt.object_type)
        if flt.object_id:
            stmt = self._field(stmt, AuditEvent.object_id, flt.object_id, materialize)
        if flt.outcome:
            stmt = stmt.where(AuditEvent.outcome == flt.outcome)
        if flt.since:
            stmt = stmt.where(AuditEvent.time >= flt.since)
        if flt.until:
            stmt = stmt.where(AuditEvent.time < flt.until)
        return stmt

