"""The tamper-evident audit log.

Two stages, so that no action can commit without its record and no request waits on
the chain:

1. `add()` writes the record into `audit_inbox` inside the caller's own transaction.
   Refusals and failures must outlive a rollback: outside a transaction `record_now()`
   writes one in a transaction of its own; inside one (opened with `transaction()`),
   `record_after()` queues it to be written as soon as that transaction has ended —
   never while it holds its locks (one transaction per thread, decision 0010).
2. The chainer (a thread in every replica) takes the chain head's row lock, moves the
   inbox into `audit_events` in batches, and links each record to the previous one
   with HMAC-SHA-256 under a key that never leaves the HSM.

A database writer without the HSM can delete or edit rows, but cannot forge the
hashes; `verify()` names the first record where the chain breaks.

3. Every N records or T seconds the chainer also writes a checkpoint — "the chain held
   `seq` records, the last with hash `hash`" — signed inside the HSM with an EC P-256
   key that is not the HMAC key, chained to the previous checkpoint, and copied off the
   server by the sinks. Anyone with the public key can check a checkpoint without the
   HSM; a copy outside the server detects what the database alone cannot: the tail cut
   off, the log wiped, or the chain re-MACed by someone holding the token
   (`verify(outside=...)`, docs/audit.md).
"""

from __future__ import annotations

import asyncio
import base64
import csv
import hashlib
import hmac
import io
import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import Connection, Engine, delete, func, insert, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from hsm import HsmBackend, HsmError
from keyserver.core.audit_search import hits, matching, record_terms, words_of
from keyserver.core.errors import InvalidInput, ServiceUnavailable, hsm_failure
from keyserver.core.principal import RequestContext
from keyserver.store.db import retry_on_disconnect, upsert_counts
from keyserver.store.models import (
    AuditCheckpoint,
    AuditEvent,
    AuditHead,
    AuditHourly,
    AuditInbox,
    AuditRefusalsHourly,
    AuditSearch,
    AuditUsageHourly,
    AuditVerified,
)

log = logging.getLogger(__name__)

Outcome = Literal["allowed", "denied", "error"]
GENESIS_HASH = "0" * 64
_AFTER = "audit_after_transaction"  # Session.info key: records written once it has ended
CHAIN_BATCH = 1000
ZERO_DIGEST = "0" * 64  # the "previous checkpoint" of the first one
# What a checkpoint's signature covers. Signatures (ECDSA) differ each time one is made,
# so an outside copy is compared on these.
SIGNED_FIELDS = ("checkpoint", "seq", "hash", "time", "prev", "key")
EXPORT_COLUMNS = (
    "seq", "time", "actor", "actor_type", "action", "object_type", "object_id",
    "outcome", "source_ip", "request_id", "details", "prev_hash", "hash",
)


def utcnow() -> datetime:
    return datetime.now(UTC)


def _connection(session: Session | Connection) -> Connection:
    return session.connection() if isinstance(session, Session) else session


# An activity query returns at most this many buckets (two weeks of hours, a year of days).
MAX_ACTIVITY_BUCKETS = 400


def rollup_reason(outcome: str, details: Any) -> str:
    """Why a record was refused or failed, in a few words shared by many records (what
    the activity charts group denials by): the refusal's code, the missing permission,
    or "refused"; empty for what was allowed. Migration 0018 applied this rule to the
    records chained before it."""
    if outcome == "allowed" or not isinstance(details, dict):
        return ""
    if details.get("reason"):
        return str(details["reason"])[:64]
    if details.get("missing_permission"):
        return f"missing {details['missing_permission']}"[:64]
    return "refused" if details.get("refused") else ""


def _count_chained(conn: Connection, events: list[dict[str, Any]]) -> None:
    """Add a chained batch to the hourly counts and the search index, in the batch's own
    transaction: neither ever disagrees with the chain."""
    hourly: dict[tuple[Any, ...], int] = {}
    refusals: dict[tuple[Any, ...], int] = {}
    used: dict[tuple[Any, ...], int] = {}
    for e in events:
        hour = e["time"].astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        hourly[(hour, e["outcome"])] = hourly.get((hour, e["outcome"]), 0) + 1
        if e["outcome"] == "allowed" and e["object_type"] == "key" and e["object_id"]:
            k = (e["object_id"], hour, e["actor"], e["action"])
            used[k] = used.get(k, 0) + 1
        if e["outcome"] != "allowed":
            k = (hour, e["actor"], e["action"], rollup_reason(e["outcome"], e["details"]))
            refusals[k] = refusals.get(k, 0) + 1
    upsert_counts(conn, AuditHourly, ["hour", "outcome"], hourly)
    upsert_counts(conn, AuditRefusalsHourly, ["hour", "actor", "action", "reason"], refusals)
    upsert_counts(conn, AuditUsageHourly, ["key_id", "hour", "actor", "action"], used)
    conn.execute(insert(AuditSearch), [{"seq": e["seq"], "terms": record_terms(e)} for e in events])


def _buckets_of(since: datetime, until: datetime, bucket: Literal["hour", "day"]) -> tuple[datetime, timedelta]:
    """The first bucket's start and the buckets' length, for charts over [since, until)."""
    if since.tzinfo is None or until.tzinfo is None:
        raise InvalidInput("since and until need a time zone (e.g. 2026-11-25T10:00:00Z)")
    start = since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if bucket == "day":
        start = start.replace(hour=0)
    if not start < until:
        raise InvalidInput("until must be after since")
    step = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
    if (until - start) / step > MAX_ACTIVITY_BUCKETS:
        raise InvalidInput(f"at most {MAX_ACTIVITY_BUCKETS} buckets: ask for days over long ranges")
    return start, step


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical_record(
    *, seq: int, time: datetime, actor: str, actor_type: str, action: str,
    object_type: str | None, object_id: str | None, outcome: str, source_ip: str | None,
    request_id: str | None, details: dict[str, Any], prev_hash: str,
) -> bytes:
    """The exact bytes that are MACed: stable across databases and Python versions."""
    doc = {
        "seq": seq, "time": _iso(time), "actor": actor, "actor_type": actor_type,
        "action": action, "object_type": object_type, "object_id": object_id,
        "outcome": outcome, "source_ip": source_ip, "request_id": request_id,
        "details": details, "prev_hash": prev_hash,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def canonical_checkpoint(*, number: int, seq: int, hash: str, time: datetime, prev: str, key: str) -> bytes:
    """The exact bytes a checkpoint's signature covers (and its successor's `prev` hashes)."""
    doc = {"checkpoint": number, "seq": seq, "hash": hash, "time": _iso(time), "prev": prev, "key": key}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def checkpoint_dict(c: Any) -> dict[str, Any]:
    """A checkpoint (row or entity) as sinks write it and `verify(outside=...)` reads it back."""
    return {"type": "checkpoint", "checkpoint": c.id, "seq": c.seq, "hash": c.hash, "time": _iso(c.time),
            "prev": c.prev_digest, "key": c.key_fingerprint, "signature": c.signature}


def checkpoint_digest(c: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_checkpoint(
        number=c["checkpoint"], seq=c["seq"], hash=c["hash"], time=_parse_iso(c["time"]), prev=c["prev"],
        key=c["key"])).hexdigest()


def _parse_iso(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def key_fingerprint(public_der: bytes) -> str:
    return hashlib.sha256(public_der).hexdigest()


@dataclass(frozen=True, slots=True)
class PendingRecord:
    """One record for `add_many`."""

    ctx: RequestContext
    action: str
    object_type: str | None = None
    object_id: str | None = None
    details: dict[str, Any] | None = None
    outcome: Outcome = "allowed"


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


SEARCH_COUNT_CAP = 10_000  # a search counts its matches this far (AuditLog.query)


def _searches(flt: AuditFilter) -> bool:
    """Whether the filter goes through the word index: words, or an actor or object prefix."""
    return bool(flt.q or (flt.actor or "").endswith("*") or (flt.object_id or "").endswith("*"))


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    checked: int
    head_seq: int
    first_broken_seq: int | None
    reason: str | None
    # Where this run started (0: the whole chain) and the last checkpoint it confirmed.
    from_seq: int = 0
    checkpoint: int | None = None
    outside_checked: int = 0  # checkpoints from an outside copy compared
    outside_records: int = 0  # records from an outside copy compared, one by one
    outside_seq: int = 0  # the newest record the outside copy holds
    # Why an incremental run walked every record instead (its stored state did not verify).
    note: str | None = None


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """When the chainer signs a checkpoint: after `records` new records, or when the
    newest is `seconds` old and not yet covered."""

    records: int = 1000
    seconds: float = 300.0
    key_id: str = "audit-checkpoint-v1"


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


class AuditService:
    def __init__(
        self,
        session_factory: sessionmaker[Session],
        hsm: HsmBackend,
        *,
        hmac_key_id: str,
        checkpoints: CheckpointPolicy | None = None,
        autocommit_engine: Engine | None = None,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self._db = session_factory
        self._hsm = hsm
        self._key_id = hmac_key_id
        self._checkpoints = checkpoints or CheckpointPolicy()
        self._public_der: bytes | None = None
        self._now = now
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flush_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._engine = session_factory.kw["bind"]
        # Grouped records are single statements: autocommit saves BEGIN/COMMIT round trips.
        self._autocommit: Engine = autocommit_engine or self._engine
        self._grouped = GroupCommit(self._write_grouped)
        self._grouped_async = AsyncGroupCommit(self._write_grouped)

    # --- writing ---------------------------------------------------------------
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
        _connection(session).execute(insert(AuditInbox).values(
            payload=self._payload(ctx, action, outcome, object_type, object_id, details)))
        # The chainer lingers before it looks, by which time this has usually committed;
        # if not, the next poll takes it.
        self._wake.set()

    def add_many(self, session: Session | Connection, records: list[PendingRecord]) -> None:
        """Queue several records in one statement, in the caller's transaction: for
        callers that group the records of concurrent requests into one commit."""
        if not records:
            return
        _connection(session).execute(insert(AuditInbox), [
            {"payload": self._payload(r.ctx, r.action, r.outcome, r.object_type, r.object_id, r.details)}
            for r in records])
        self._wake.set()

    def commit(self, record: PendingRecord) -> None:
        """Record in a commit shared with concurrent callers, durable before this returns:
        for the hot paths (data keys, KMIP reads and exports), where one commit per
        request was most of the store's work. Call it outside any transaction."""
        self._grouped.submit(record)

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

    def _payload(
        self, ctx: RequestContext, action: str, outcome: str, object_type: str | None,
        object_id: str | None, details: dict[str, Any] | None,
    ) -> dict[str, Any]:
        p = ctx.principal
        return {
            "time": _iso(self._now()),
            "actor": p.name,
            "actor_type": p.actor_type,
            "action": action,
            "object_type": object_type,
            "object_id": object_id,
            "outcome": outcome,
            "source_ip": ctx.source_ip,
            "request_id": ctx.request_id,
            "details": details or {},
        }

    # --- chaining --------------------------------------------------------------
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
                conn.execute(insert(AuditHead).values(id=1, seq=0, hash=GENESIS_HASH, hmac_key_id=self._key_id))
                seq, prev = 0, GENESIS_HASH
            else:
                seq, prev = head
            rows = conn.execute(select(AuditInbox.id, AuditInbox.payload).order_by(AuditInbox.id)
                                .limit(CHAIN_BATCH)).all()
            if not rows:
                self._maybe_checkpoint(conn, seq, prev, chained=False)
                return 0
            events = []
            for _, p in rows:
                seq += 1
                t = datetime.fromisoformat(p["time"])
                fields: dict[str, Any] = {
                    "seq": seq, "time": t, "actor": p["actor"], "actor_type": p["actor_type"],
                    "action": p["action"], "object_type": p["object_type"],
                    "object_id": p["object_id"], "outcome": p["outcome"],
                    "source_ip": p["source_ip"], "request_id": p["request_id"],
                    "details": p["details"], "prev_hash": prev,
                }
                prev = self._mac(canonical_record(**fields))
                events.append({**fields, "hash": prev})
            conn.execute(insert(AuditEvent), events)
            _count_chained(conn, events)
            conn.execute(delete(AuditInbox).where(AuditInbox.id.in_([r[0] for r in rows])))
            conn.execute(update(AuditHead).where(AuditHead.id == 1).values(seq=seq, hash=prev))
            self._maybe_checkpoint(conn, seq, prev, chained=len(rows) == CHAIN_BATCH)
            return len(rows)

    # --- checkpoints -------------------------------------------------------------
    def public_key_der(self) -> bytes:
        """The checkpoint signing key's public half (SubjectPublicKeyInfo DER)."""
        if self._public_der is None:
            try:
                self._public_der = self._hsm.ensure_signing_key(self._checkpoints.key_id)
            except HsmError as exc:
                raise hsm_failure("open the audit checkpoint key", exc) from exc
        return self._public_der

    def public_key_pem(self) -> str:
        key = serialization.load_der_public_key(self.public_key_der())
        return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def _maybe_checkpoint(self, conn: Connection, seq: int, hash: str, *, chained: bool) -> None:
        """Inside the chainer's transaction (the head's lock serialises every replica):
        sign a checkpoint when enough records or time have passed since the last one.
        `chained`: more records are waiting, so a time-based one can wait for them."""
        table = AuditCheckpoint.__table__
        last = conn.execute(select(table).order_by(table.c.id.desc()).limit(1)).first()
        covered = last.seq if last is not None else 0
        if seq <= covered:
            return
        now = self._now()
        due = (last is None or seq - covered >= self._checkpoints.records
               or (not chained and (now - last.time).total_seconds() >= self._checkpoints.seconds))
        if not due:
            return
        fingerprint = key_fingerprint(self.public_key_der())
        number = (last.id if last is not None else 0) + 1
        prev = checkpoint_digest(checkpoint_dict(last)) if last is not None else ZERO_DIGEST
        body = canonical_checkpoint(number=number, seq=seq, hash=hash, time=now, prev=prev, key=fingerprint)
        try:
            signature = self._hsm.sign_p256(body, key_id=self._checkpoints.key_id)
        except HsmError as exc:
            raise hsm_failure("sign an audit checkpoint", exc) from exc
        conn.execute(insert(AuditCheckpoint).values(
            id=number, seq=seq, hash=hash, time=now, prev_digest=prev, key_fingerprint=fingerprint,
            signature=base64.b64encode(signature).decode()))

    def checkpoints(self, *, after: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        """Checkpoints numbered after `after`, oldest first, as sinks write them."""
        with self._db() as s:
            rows = s.execute(select(AuditCheckpoint).where(AuditCheckpoint.id > after)
                             .order_by(AuditCheckpoint.id).limit(limit)).scalars()
            return [checkpoint_dict(c) for c in rows]

    def chain_state(self) -> dict[str, Any]:
        """The chain's head, its last checkpoint and how far it was last verified, from
        the store (a health page shows it while the HSM is away). How far it was verified
        is shown only when the HSM vouches for it: a row without this server's MAC — or
        with the HSM away — is shown as not verified, never as verified."""
        with self._db() as s:
            head = s.get(AuditHead, 1)
            last = s.execute(select(AuditCheckpoint).order_by(AuditCheckpoint.id.desc()).limit(1)).scalars().first()
            verified = s.get(AuditVerified, 1)
        vouched = False
        if verified is not None:
            try:
                vouched = hmac.compare_digest(verified.mac or "", self._verified_mac(
                    verified.checkpoint, verified.seq, verified.hash))
            except ServiceUnavailable:
                vouched = False
        return {
            "head_seq": head.seq if head else 0,
            "last_checkpoint": checkpoint_dict(last) if last is not None else None,
            "verified": None if verified is None or not vouched else {
                "checkpoint": verified.checkpoint, "seq": verified.seq, "at": _iso(verified.verified_at)},
        }

    def status(self) -> dict[str, Any]:
        """`chain_state` and the checkpoint key's fingerprint: what the console shows
        instead of re-walking the chain."""
        return {**self.chain_state(), "key_fingerprint": key_fingerprint(self.public_key_der())}

    def _mac(self, data: bytes) -> str:
        try:
            return self._hsm.hmac_sha256(data, key_id=self._key_id).hex()
        except HsmError as exc:
            raise hsm_failure("compute the audit chain MAC", exc) from exc

    # --- reading ---------------------------------------------------------------
    def pending(self) -> int:
        with self._db() as s:
            return int(s.execute(select(func.count()).select_from(AuditInbox)).scalar_one())

    def query(
        self, flt: AuditFilter, *, limit: int = 50, before_seq: int | None = None
    ) -> tuple[list[AuditEvent], int, bool]:
        """Newest first; returns the page, the number of matching records and whether that
        number is exact. A search by words or prefixes counts to SEARCH_COUNT_CAP and no
        further (the console shows "10,000+"): counting every record holding a common word
        costs more than the page."""
        if not 1 <= limit <= 1000:
            raise InvalidInput("limit must be between 1 and 1000")
        searching = _searches(flt)
        with self._db() as s:
            if flt == AuditFilter():
                # Unfiltered, the total is the head's sequence number (the chain numbers its
                # records 1, 2, 3, ...): no count of millions of rows for the first page.
                head = s.get(AuditHead, 1)
                return self._page(s, flt, limit, before_seq), head.seq if head is not None else 0, True
            if not searching:
                total = int(s.execute(self._filtered(select(func.count()).select_from(AuditEvent), flt)).scalar_one())
                return self._page(s, flt, limit, before_seq), total, True
            self._custom_plans(s)
            # Words alone are counted in the word index without meeting the log: joined to
            # it, PostgreSQL walks both tables with the words as a filter for a capped count
            # (0.7 s for a common word among a million records, against 23 ms). With other
            # filters the join is needed, and its plans measured best left to the planner
            # (docs/audit.md "Searching").
            if flt == AuditFilter(q=flt.q):
                found = hits(self._engine.dialect.name, flt.q or "").limit(SEARCH_COUNT_CAP + 1).subquery()
            else:
                found = self._filtered(select(AuditEvent.seq), flt).limit(SEARCH_COUNT_CAP + 1).subquery()
            total = int(s.execute(select(func.count()).select_from(found)).scalar_one())
            # Few matches: take them from the word index, then order them. Many: the newest
            # fifty are near the head of the log, and the planner walks to them.
            rows = self._page(s, flt, limit, before_seq, materialize=total <= SEARCH_COUNT_CAP)
            return rows, min(total, SEARCH_COUNT_CAP), total <= SEARCH_COUNT_CAP

    def _page(self, s: Session, flt: AuditFilter, limit: int, before_seq: int | None, *,
              materialize: bool = False) -> list[AuditEvent]:
        stmt = self._filtered(select(AuditEvent), flt, materialize=materialize)
        if before_seq is not None:
            stmt = stmt.where(AuditEvent.seq < before_seq)
        return list(s.execute(stmt.order_by(AuditEvent.seq.desc()).limit(limit)).scalars())

    def _custom_plans(self, s: Session) -> None:
        """Plans made for this transaction's search words, not a generic plan cached from
        earlier ones (keyserver.core.audit_search)."""
        if self._engine.dialect.name == "postgresql":
            s.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))

    def get(self, seq: int) -> AuditEvent | None:
        with self._db() as s:
            return s.get(AuditEvent, seq)

    def activity(self, *, since: datetime, until: datetime, bucket: Literal["hour", "day"],
                 top: int = 5) -> dict[str, Any]:
        """Chained records per hour or day and outcome between `since` and `until` (every
        bucket listed, empty ones as zeros), and the actors, actions and reasons with the
        most refusals — from the hourly counts, so it costs the same at a thousand records
        or at millions."""
        start, step = _buckets_of(since, until, bucket)
        r = AuditRefusalsHourly
        total = func.sum(r.count)

        def ranked(s: Session, column: Any) -> list[dict[str, Any]]:
            rows = s.execute(select(column, total).where(r.hour >= start, r.hour < until).group_by(column)
                             .order_by(total.desc(), column).limit(top)).all()
            return [{"name": name, "count": int(n)} for name, n in rows]

        with self._db() as s:
            per_hour = s.execute(select(AuditHourly.hour, AuditHourly.outcome, AuditHourly.count)
                                 .where(AuditHourly.hour >= start, AuditHourly.hour < until)).all()
            result: dict[str, Any] = {"top_refused_actors": ranked(s, r.actor),
                                      "top_refused_actions": ranked(s, r.action),
                                      "top_refusal_reasons": ranked(s, r.reason)}
        buckets: dict[datetime, dict[str, int]] = {}
        at = start
        while at < until:
            buckets[at] = {"allowed": 0, "denied": 0, "error": 0}
            at += step
        for hour, outcome, n in per_hour:
            hour = hour.astimezone(UTC)
            key = hour if bucket == "hour" else hour.replace(hour=0)
            if key in buckets:
                kind = outcome if outcome in ("allowed", "denied") else "error"
                buckets[key][kind] += int(n)
        result["buckets"] = [{"start": t, **c} for t, c in buckets.items()]
        result["totals"] = {k: sum(c[k] for c in buckets.values()) for k in ("allowed", "denied", "error")}
        return result

    def usage(self, *, since: datetime, until: datetime, bucket: Literal["hour", "day"],
              key_id: str | None = None, actor: str | None = None, top: int = 5) -> dict[str, Any]:
        """Allowed operations on keys per hour or day and action, for one key (with the
        actors that used it most) or one actor — a host is `host:<hostname>`, a KMIP
        client `kmip:<name>` — (with the keys it used most), from the hourly counts."""
        if (key_id is None) == (actor is None):
            raise InvalidInput("ask for the usage of one key or of one actor")
        start, step = _buckets_of(since, until, bucket)
        u = AuditUsageHourly
        scope = (u.key_id == key_id) if key_id is not None else (u.actor == actor)
        in_range = (u.hour >= start, u.hour < until)
        total = func.sum(u.count)
        other = u.actor if key_id is not None else u.key_id
        with self._db() as s:
            per_hour = s.execute(select(u.hour, u.action, total).where(scope, *in_range)
                                 .group_by(u.hour, u.action)).all()
            ranked = s.execute(select(other, total).where(scope, *in_range).group_by(other)
                               .order_by(total.desc(), other).limit(top)).all()
        buckets: dict[datetime, dict[str, int]] = {}
        at = start
        while at < until:
            buckets[at] = {}
            at += step
        actions: dict[str, int] = {}
        for hour, action, n in per_hour:
            hour = hour.astimezone(UTC)
            b = buckets.get(hour if bucket == "hour" else hour.replace(hour=0))
            if b is not None:
                b[action] = b.get(action, 0) + int(n)
                actions[action] = actions.get(action, 0) + int(n)
        return {"buckets": [{"start": t, "counts": c} for t, c in buckets.items()],
                "actions": [{"name": a, "count": n} for a, n in sorted(actions.items(), key=lambda x: (-x[1], x[0]))],
                "total": sum(actions.values()),
                "top": [{"name": name, "count": int(n)} for name, n in ranked]}

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

    def _filtered(self, stmt: Any, flt: AuditFilter, *, materialize: bool = False) -> Any:
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

    def export(self, flt: AuditFilter, *, fmt: Literal["csv", "jsonl"]) -> Iterator[str]:
        """Oldest first, streamed in pages so an export never holds the log in memory.
        The filter is checked here, before anything is streamed (an invalid search is
        the caller's error, not a cut file); a failure once streaming has begun ends the
        stream with an error line (jsonl: `{"type": "error", ...}`; csv: a row whose
        first field is `#error`), so a partial export never looks complete."""
        self._filtered(select(AuditEvent.seq), flt, materialize=_searches(flt))  # raises InvalidInput
        return self._export_pages(flt, fmt)

    def _export_pages(self, flt: AuditFilter, fmt: Literal["csv", "jsonl"]) -> Iterator[str]:
        # A search's matches come from the word index on every page (a common word costs a
        # little more per page; a rare one is not hunted through the log).
        searching = _searches(flt)
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
                        self._custom_plans(s)
                    stmt = self._filtered(select(AuditEvent), flt, materialize=searching).where(AuditEvent.seq > last)
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

    def verify(self, *, full: bool = False, outside: Iterable[dict[str, Any]] | None = None) -> VerifyResult:
        """Check the chain and name the first thing that does not fit.

        Every checkpoint's signature and link is checked; records are walked from the
        last checkpoint an earlier run verified (from the start with `full`), each
        record's link and MAC, and each checkpoint against the record it names.
        `outside`: a copy kept off the server (a sink's file, a syslog receiver's copy,
        the SIEM): its checkpoints must verify under this server's key and be present,
        unchanged, in the database — which catches a cut tail, a wipe and a re-MACed
        chain — and its records must chain among themselves and each be, unchanged, the
        database's record of the same sequence number, so that nothing the copy holds,
        after the last checkpoint too, can be cut or rewritten unseen. `outside` is read
        twice (checkpoints, then records, streamed: a copy of millions of records is
        never held in memory) — a list, or `audit_sinks.read_copy(path)`."""
        self.flush()
        public = serialization.load_der_public_key(self.public_key_der())
        assert isinstance(public, ec.EllipticCurvePublicKey)
        fingerprint = key_fingerprint(self.public_key_der())
        outside_cps = [c for c in outside or () if c.get("type", "checkpoint") == "checkpoint"]
        with self._db() as s:
            head = s.get(AuditHead, 1)
            head_seq, head_hash = (head.seq, head.hash) if head else (0, GENESIS_HASH)
            stored = [checkpoint_dict(c) for c in
                      s.execute(select(AuditCheckpoint).order_by(AuditCheckpoint.id)).scalars()]
            verified = None if full else s.get(AuditVerified, 1)

        def broken(seq: int | None, reason: str, checked: int = 0, start: int = 0) -> VerifyResult:
            return VerifyResult(False, checked, head_seq, seq, reason, from_seq=start)

        # 1. The checkpoints themselves: signed by this key, linked, increasing.
        prev_digest, prev_seq = ZERO_DIGEST, 0
        for n, c in enumerate(stored, start=1):
            problem = _checkpoint_problem(c, public, fingerprint)
            if c["checkpoint"] != n:
                problem = f"checkpoint {n} is missing"
            elif c["prev"] != prev_digest:
                problem = f"checkpoint {n} does not link to checkpoint {n - 1}"
            elif c["seq"] <= prev_seq:
                problem = f"checkpoint {n} goes backwards (record {c['seq']} after {prev_seq})"
            if problem:
                return broken(c["seq"], problem)
            prev_digest, prev_seq = checkpoint_digest(c), c["seq"]
        if stored and stored[-1]["seq"] > head_seq:
            return broken(head_seq + 1, f"checkpoint {stored[-1]['checkpoint']} covers {stored[-1]['seq']} records "
                                        f"but the chain holds {head_seq}: records were removed")
        # 2. Checkpoints from outside: each must be valid and present, unchanged, here.
        by_number = {c["checkpoint"]: c for c in stored}
        for c in outside_cps:
            problem = _checkpoint_problem(c, public, fingerprint)
            if problem:
                return broken(c.get("seq"), f"outside copy: {problem}")
            mine = by_number.get(c["checkpoint"])
            if mine is None:
                what = ("the audit log was wiped" if not stored else
                        "the chain's tail was cut off" if c["seq"] > head_seq else "checkpoints were removed")
                return broken(c["seq"], f"checkpoint {c['checkpoint']} (record {c['seq']}) from the outside copy "
                                        f"is not in the database: {what}")
            if any(mine[f] != c[f] for f in SIGNED_FIELDS):
                return broken(c["seq"], f"checkpoint {c['checkpoint']} differs from the outside copy: the chain "
                                        f"up to record {c['seq']} was rewritten (re-MACed and re-signed)")
        # 3. Records from outside, every one: checkpoints leave the newest records (up to
        # N or T of them) unanchored, and only the copy itself can show them cut or edited.
        problem_at, outside_records, outside_seq = self._compare_outside_records(outside or (), head_seq)
        if problem_at is not None:
            return broken(problem_at[0], problem_at[1])
        # 4. The records, from where the last run left off — if the HSM vouches for that.
        start, prev, note = 0, GENESIS_HASH, None
        if verified is not None:
            if not hmac.compare_digest(verified.mac or "", self._verified_mac(verified.checkpoint, verified.seq,
                                                                              verified.hash)):
                note = ("the stored verification state (audit_verified) does not carry this server's MAC: "
                        "it was forged or written by an older version, so every record was verified")
            elif any(c["checkpoint"] == verified.checkpoint and c["seq"] == verified.seq
                     and c["hash"] == verified.hash for c in stored):
                start, prev = verified.seq, verified.hash
        at_seq = {c["seq"]: c for c in stored}
        expected_seq, checked, last_cp = start + 1, 0, None
        with self._db() as s:
            stmt = (select(AuditEvent).where(AuditEvent.seq > start).order_by(AuditEvent.seq)
                    .execution_options(yield_per=1000))
            for r in s.execute(stmt).scalars():
                if r.seq != expected_seq:
                    return broken(expected_seq, f"record {expected_seq} is missing (next present: {r.seq})",
                                  checked, start)
                if r.prev_hash != prev:
                    return broken(r.seq, f"record {r.seq} does not link to record {r.seq - 1}", checked, start)
                fields = {c: getattr(r, c) for c in (
                    "seq", "time", "actor", "actor_type", "action", "object_type", "object_id",
                    "outcome", "source_ip", "request_id", "details", "prev_hash")}
                if not hmac.compare_digest(self._mac(canonical_record(**fields)), r.hash):
                    return broken(r.seq, f"record {r.seq} was altered (its MAC does not match)", checked, start)
                cp = at_seq.get(r.seq)
                if cp is not None:
                    if cp["hash"] != r.hash:
                        return broken(r.seq, f"record {r.seq} is not the one checkpoint {cp['checkpoint']} signed",
                                      checked, start)
                    last_cp = cp
                prev, expected_seq, checked = r.hash, expected_seq + 1, checked + 1
        if head_seq != start + checked or head_hash != prev:
            return broken(start + checked + 1, f"the chain head says {head_seq} records; "
                                               f"records after {start + checked} were removed", checked, start)
        if last_cp is not None:
            with self._db.begin() as s:
                row = s.get(AuditVerified, 1)
                if row is None:
                    row = AuditVerified(id=1)
                    s.add(row)
                row.checkpoint, row.seq, row.hash, row.verified_at = (
                    last_cp["checkpoint"], last_cp["seq"], last_cp["hash"], self._now())
                row.mac = self._verified_mac(last_cp["checkpoint"], last_cp["seq"], last_cp["hash"])
        return VerifyResult(True, checked, head_seq, None, None, from_seq=start,
                            checkpoint=(last_cp or (stored[-1] if stored else {})).get("checkpoint"),
                            outside_checked=len(outside_cps), outside_records=outside_records,
                            outside_seq=outside_seq, note=note)

    def _verified_mac(self, checkpoint: int, seq: int, hash: str) -> str:
        """What makes `audit_verified` trustworthy: a MAC under the chain's HSM key, so a
        database writer cannot move the incremental start past an edit. The message is
        no record's canonical form (those are objects with a `seq` at the top)."""
        body = json.dumps({"audit_verified": {"checkpoint": checkpoint, "seq": seq, "hash": hash}},
                          sort_keys=True, separators=(",", ":")).encode()
        return self._mac(body)

    def _compare_outside_records(self, items: Iterable[dict[str, Any]],
                                 head_seq: int) -> tuple[tuple[int | None, str] | None, int, int]:
        """(the first problem as (seq, reason) or None, how many records the copy holds,
        the newest of them). Streamed in the copy's order, the database read a page at a
        time. The copy may repeat records (delivery is at-least-once: a batch sent again
        restarts at an earlier record) and may start after record 1 (rotated files
        dropped); it may not disagree with itself or with the database, skip a record,
        or reach past the database's end."""
        count, last_seq, last_hash = 0, 0, ""
        cut: int | None = None  # the first record the copy holds beyond the database's end
        with self._db() as s:
            page: dict[int, dict[str, Any]] = {}

            def stored(seq: int) -> dict[str, Any] | None:
                nonlocal page
                if seq not in page:
                    rows = s.execute(select(AuditEvent).where(AuditEvent.seq >= seq, AuditEvent.seq < seq + 1000))
                    page = {r.seq: event_dict(r) for r in rows.scalars()}
                return page.get(seq)

            for item in items:
                if item.get("type") != "record":
                    continue
                try:
                    seq = int(item["seq"])
                    theirs = {c: item[c] for c in EXPORT_COLUMNS}
                except (KeyError, TypeError, ValueError):
                    return (None, f"the outside copy's record after record {last_seq} is malformed"), count, last_seq
                count += 1
                if cut is not None:  # only how far the copy reaches is still of interest
                    last_seq = max(last_seq, seq)
                    continue
                if last_seq and seq > last_seq + 1:
                    return ((last_seq + 1, f"the outside copy skips from record {last_seq} to record {seq}: it is "
                                           "incomplete or was edited"), count, seq)
                if last_seq and seq == last_seq + 1 and theirs["prev_hash"] != last_hash:
                    return ((seq, f"in the outside copy, record {seq} does not link to record {last_seq}: the copy "
                                  "was edited"), count, seq)
                if seq > head_seq:
                    cut, last_seq = seq, seq
                    continue
                mine = stored(seq)
                if mine is None:
                    return ((seq, f"record {seq} from the outside copy is not in the database: records were "
                                  "removed"), count, max(seq, last_seq))
                differ = [c for c in EXPORT_COLUMNS if mine[c] != theirs[c]]
                if differ:
                    what = ([c for c in differ if c not in ("hash", "prev_hash")] or differ)[0]
                    return ((seq, f"record {seq} differs from the outside copy ({what}: {_short(mine[what])} here, "
                                  f"{_short(theirs[what])} outside): it was rewritten after it left the server"),
                            count, max(seq, last_seq))
                if seq > last_seq:
                    last_seq, last_hash = seq, theirs["hash"]
        if cut is not None:
            return ((cut, f"the outside copy holds records up to {last_seq} but the database ends at record "
                          f"{head_seq}: the chain's tail was cut off"), count, last_seq)
        return None, count, last_seq


def _short(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:39] + "…"


def _checkpoint_problem(c: dict[str, Any], public: ec.EllipticCurvePublicKey, fingerprint: str) -> str | None:
    """Why checkpoint `c` is not a valid one of this server's (None when it is)."""
    try:
        if c["key"] != fingerprint:
            return f"checkpoint {c['checkpoint']} is signed by another key ({c['key'][:16]}…)"
        body = canonical_checkpoint(number=c["checkpoint"], seq=c["seq"], hash=c["hash"], time=_parse_iso(c["time"]),
                                    prev=c["prev"], key=c["key"])
        public.verify(base64.b64decode(c["signature"], validate=True), body, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return f"checkpoint {c.get('checkpoint')}'s signature does not verify"
    except (KeyError, TypeError, ValueError):
        return "a checkpoint is malformed"
    return None


def event_dict(r: AuditEvent) -> dict[str, Any]:
    return {
        "seq": r.seq, "time": _iso(r.time), "actor": r.actor, "actor_type": r.actor_type,
        "action": r.action, "object_type": r.object_type, "object_id": r.object_id,
        "outcome": r.outcome, "source_ip": r.source_ip, "request_id": r.request_id,
        "details": r.details, "prev_hash": r.prev_hash, "hash": r.hash,
    }
