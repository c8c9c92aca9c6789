"""Exporting the log, oldest first, as CSV or JSON lines, streamed a page at a time."""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Iterator
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.audit.read import AuditFilter, AuditReader, searches
from keyserver.core.audit.record import EXPORT_COLUMNS, event_dict
from keyserver.store.models import AuditEvent

log = logging.getLogger(__name__)


class AuditExport:
    def __init__(self, session_factory: sessionmaker[Session], reader: AuditReader) -> None:
        self._db = session_factory
        self._reader = reader

    def export(self, flt: AuditFilter, *, fmt: Literal["csv", "jsonl"]) -> Iterator[str]:
        """Oldest first, streamed in pages so an export never holds the log in memory.
        The filter is checked here, before anything is streamed (an invalid search is
        the caller's error, not a cut file); a failure once streaming has begun ends the
        stream with an error line (jsonl: `{"type": "error", ...}`; csv: a row whose
        first field is `#error`), so a partial export never looks complete."""
        self._reader.filtered(select(AuditEvent.seq), flt, materialize=searches(flt))  # raises InvalidInput
        return self._export_pages(flt, fmt)

    def _export_pages(self, flt: AuditFilter, fmt: Literal["csv", "jsonl"]) -> Iterator[str]:
        # A search's matches come from the word index on every page (a common word costs a
        # little more per page; a rare one is not hunted through the log).
        searching = searches(flt)
        last = 0
        if fmt == "csv":
            buf = io.StringIO()
            writer = csv.writer(buf)
            writer.writerow(EXPORT_COLUMNS)
            yield buf.getvalue()
        while True:
            try:
                with self._db() as s:
                    if searching:
                        self._reader.custom_plans(s)
                    stmt = (self._reader.filtered(select(AuditEvent), flt, materialize=searching)
                            .where(AuditEvent.seq > last))
                    rows = list(s.execute(stmt.order_by(AuditEvent.seq).limit(1000)).scalars())
            except Exception as exc:
                # The status line is sent: the only way left to say "incomplete" is in the body.
                log.exception("audit export failed after record %d", last)
                message = f"the export stopped after record {last}: {type(exc).__name__}; it is incomplete"
                if fmt == "jsonl":
                    yield json.dumps({"type": "error", "code": "export_failed", "after_seq": last,
                                      "message": message}, separators=(",", ":")) + "\n"
                else:
                    buf = io.StringIO()
                    csv.writer(buf).writerow(["#error", "export_failed", last, message])
                    yield buf.getvalue()
                return
            if not rows:
                return
            buf = io.StringIO()
            writer = csv.writer(buf)
            for r in rows:
                doc = event_dict(r)
                if fmt == "jsonl":
                    buf.write(json.dumps(doc, separators=(",", ":")) + "\n")
                else:
                    writer.writerow([
                        json.dumps(doc[c], separators=(",", ":")) if c == "details" else doc[c]
                        for c in EXPORT_COLUMNS
                    ])
            last = rows[-1].seq
            yield buf.getvalue()
