"""The chainer: a thread in every replica that takes the chain head's row lock, moves the
inbox into `audit_events` in batches, and links each record to the previous one with
HMAC-SHA-256 under a key that never leaves the HSM. In the same transaction it names each
record's object (names.py), keeps the hourly counts, the per-version counts the
inventory reads (data keys, who used each version) and the word index, and signs a
checkpoint when one is due.
"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, delete, insert, select, update

from keyserver.core.audit.activity import rollup_reason
from keyserver.core.audit.checkpoints import Checkpoints
from keyserver.core.audit.names import name_objects
from keyserver.core.audit.record import GENESIS_HASH, ChainMac, canonical_record
from keyserver.core.audit.statements import versions_named
from keyserver.core.audit_search import record_terms
from keyserver.core.errors import ServiceUnavailable
from keyserver.store.db import upsert_counts
from keyserver.store.models import (
    AuditEvent,
    AuditHead,
    AuditHourly,
    AuditInbox,
    AuditRefusalsHourly,
    AuditSearch,
    AuditUsageHourly,
)
from keyserver.store.retirement import add_issued, add_reencrypted, add_version_usage

log = logging.getLogger(__name__)
CHAIN_BATCH = 1000


def count_chained(conn: Connection, events: list[dict[str, Any]]) -> None:
    """Add a chained batch to the hourly counts and the search index, in the batch's own
    transaction: neither ever disagrees with the chain."""
    hourly: dict[tuple[Any, ...], int] = {}
    refusals: dict[tuple[Any, ...], int] = {}
    used: dict[tuple[Any, ...], int] = {}
    issued: dict[tuple[uuid.UUID, int], int] = {}
    reencrypted: set[tuple[uuid.UUID, int, bytes]] = set()
    versions: dict[tuple[uuid.UUID, int, str], tuple[datetime, datetime, int]] = {}
    for e in events:
        hour = e["time"].astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        hourly[(hour, e["outcome"])] = hourly.get((hour, e["outcome"]), 0) + 1
        if e["outcome"] == "allowed" and e["object_type"] == "key" and e["object_id"]:
            k = (e["object_id"], hour, e["actor"], e["action"])
            used[k] = used.get(k, 0) + 1
            _count_datakey(e, issued, reencrypted)
            _count_version_use(e, versions)
        if e["outcome"] != "allowed":
            k = (hour, e["actor"], e["action"], rollup_reason(e["outcome"], e["details"]))
            refusals[k] = refusals.get(k, 0) + 1
    upsert_counts(conn, AuditHourly, ["hour", "outcome"], hourly)
    upsert_counts(conn, AuditRefusalsHourly, ["hour", "actor", "action", "reason"], refusals)
    upsert_counts(conn, AuditUsageHourly, ["key_id", "hour", "actor", "action"], used)
    add_issued(conn, issued)
    add_reencrypted(conn, reencrypted)
    add_version_usage(conn, versions)
    conn.execute(insert(AuditSearch), [{"seq": e["seq"], "terms": record_terms(e)} for e in events])


def _count_datakey(e: dict[str, Any], issued: dict[tuple[uuid.UUID, int], int],
                   reencrypted: set[tuple[uuid.UUID, int, bytes]]) -> None:
    """A version's data-key inventory (decision 0024), counted from its allowed records:
    blobs issued under it, and blobs re-encrypted off it by the old blob's IV, so that a
    blob re-encrypted twice counts once."""
    action = e["action"]
    if action not in ("datakey.generate", "datakey.generate_without_plaintext", "datakey.reencrypt"):
        return
    if str(e["actor"]).startswith("host:"):
        return  # a host's data keys are its volumes' passphrases: the inventory counts those as volumes
    details = e["details"] or {}
    try:
        key_id = uuid.UUID(e["object_id"])
        if action == "datakey.reencrypt":
            if "from_iv" in details:  # records before 0028 have none: the migration counted them
                reencrypted.add((key_id, int(details["from_version"]), bytes.fromhex(details["from_iv"])))
        else:
            k = (key_id, int(details["version"]))
            issued[k] = issued.get(k, 0) + 1
    except (KeyError, TypeError, ValueError):
        log.warning("audit record %s of %s names no usable version; not counted", e.get("seq"), action)


def _count_version_use(e: dict[str, Any], uses: dict[tuple[uuid.UUID, int, str], tuple[datetime, datetime, int]]
                       ) -> None:
    """Who used which version (the inventory's AWS key stores and KMIP clients): an
    allowed use action naming it, by statements.versions_named's rule — an integer, not a
    boolean, in the action's version fields. Migration 0029 applied it to the records
    chained before it."""
    details = e["details"]
    if not isinstance(details, dict):
        return
    # A version column is 32 bits: anything beyond names no version the server made.
    numbers = {v for v in versions_named(e["action"], details) if 0 < v < 2**31}
    if not numbers:
        return
    try:
        key_id = uuid.UUID(str(e["object_id"]))
    except ValueError:
        return  # not one key's id: no version of it to name
    at = e["time"]
    for v in numbers:
        k = (key_id, v, e["actor"])
        seen = uses.get(k)
        uses[k] = (at, at, 1) if seen is None else (min(seen[0], at), max(seen[1], at), seen[2] + 1)


class Chainer:
    def __init__(self, engine: Engine, mac: ChainMac, checkpoints: Checkpoints) -> None:
        self._engine = engine
        self._mac = mac
        self._checkpoints = checkpoints
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flush_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self, *, poll_seconds: float = 0.5, linger_seconds: float = 0.25) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(poll_seconds, linger_seconds), name="audit-chainer", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        try:
            self.flush()
        except ServiceUnavailable:
            log.warning("audit records left in the inbox at shutdown; they are chained at next start")

    def _run(self, poll_seconds: float, linger_seconds: float) -> None:
        backoff = poll_seconds
        while not self._stop.is_set():
            # Polling as well as waking: other replicas fill the same inbox.
            if self._wake.wait(timeout=backoff):
                # Linger so that under load one transaction chains hundreds of records: the
                # per-batch cost dominated (50 ms: ~0.7 ms CPU per record; 250 ms: ~0.1).
                self._stop.wait(linger_seconds)
            self._wake.clear()
            try:
                self.flush()
                backoff = poll_seconds
            except ServiceUnavailable as exc:
                backoff = min(backoff * 2, 10.0)
                log.warning("audit chaining postponed: %s", exc.message)
            except Exception:
                backoff = min(backoff * 2, 10.0)
                log.exception("audit chaining failed; records stay in the inbox and are retried")

    def flush(self) -> int:
        """Chain every record waiting in the inbox now; returns how many were chained."""
        total = 0
        with self._flush_lock:
            while True:
                n = self._chain_batch()
                total += n
                if n < CHAIN_BATCH:
                    return total

    def _chain_batch(self) -> int:
        # Core, not the ORM: this runs for every batch of every replica.
        with self._engine.begin() as conn:
            head = conn.execute(select(AuditHead.seq, AuditHead.hash).where(AuditHead.id == 1)
                                .with_for_update()).first()
            if head is None:
                conn.execute(insert(AuditHead).values(id=1, seq=0, hash=GENESIS_HASH, hmac_key_id=self._mac.key_id))
                seq, prev = 0, GENESIS_HASH
            else:
                seq, prev = head
            rows = conn.execute(select(AuditInbox.id, AuditInbox.payload).order_by(AuditInbox.id)
                                .limit(CHAIN_BATCH)).all()
            if not rows:
                self._checkpoints.maybe_sign(conn, seq, prev, chained=False)
                return 0
            events: list[dict[str, Any]] = [{
                "time": datetime.fromisoformat(p["time"]), "actor": p["actor"], "actor_type": p["actor_type"],
                "action": p["action"], "object_type": p["object_type"], "object_id": p["object_id"],
                "outcome": p["outcome"], "source_ip": p["source_ip"], "request_id": p["request_id"],
                "details": p["details"],
            } for _, p in rows]
            name_objects(conn, events)  # before the MAC: the name is part of the record
            for e in events:
                seq += 1
                e.update(seq=seq, prev_hash=prev)
                prev = e["hash"] = self._mac(canonical_record(**e))
            conn.execute(insert(AuditEvent), events)
            count_chained(conn, events)
            conn.execute(delete(AuditInbox).where(AuditInbox.id.in_([r[0] for r in rows])))
            conn.execute(update(AuditHead).where(AuditHead.id == 1).values(seq=seq, hash=prev))
            self._checkpoints.maybe_sign(conn, seq, prev, chained=len(rows) == CHAIN_BATCH)
            return len(rows)
