"""The tamper-evident audit log.

Two stages, so that no action can commit without its record and no request waits on
the chain:

1. The writer (writer.py) puts the record into `audit_inbox` inside the caller's own
   transaction, or, for refusals and failures, in one of its own that outlives a
   rollback; the hot paths share one commit among concurrent callers (group_commit.py).
2. The chainer (chain.py, a thread in every replica) takes the chain head's row lock,
   moves the inbox into `audit_events` in batches, and links each record to the
   previous one with HMAC-SHA-256 under a key that never leaves the HSM (record.py:
   the canonical bytes and the MAC).
3. Every N records or T seconds the chainer also writes a checkpoint (checkpoints.py),
   signed inside the HSM with an EC P-256 key that is not the HMAC key and copied off
   the server by the sinks (keyserver.core.audit_sinks).

Reading (read.py), the activity charts (activity.py), export (export.py) and
verification (verify.py) are rooms of their own; `AuditService` puts them together and
is what the rest of the server holds.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from hsm import HsmBackend
from keyserver.core.audit.activity import MAX_ACTIVITY_BUCKETS, ActivityCounts, rollup_reason
from keyserver.core.audit.chain import CHAIN_BATCH, Chainer
from keyserver.core.audit.checkpoints import (
    SIGNED_FIELDS,
    ZERO_DIGEST,
    CheckpointPolicy,
    Checkpoints,
    canonical_checkpoint,
    checkpoint_dict,
    checkpoint_digest,
    key_fingerprint,
)
from keyserver.core.audit.export import AuditExport
from keyserver.core.audit.group_commit import AsyncGroupCommit, GroupCommit
from keyserver.core.audit.read import SEARCH_COUNT_CAP, AuditFilter, AuditReader
from keyserver.core.audit.record import (
    EXPORT_COLUMNS,
    GENESIS_HASH,
    AuditRecord,
    ChainMac,
    Outcome,
    PendingRecord,
    canonical_record,
    event_dict,
    utcnow,
)
from keyserver.core.audit.verify import Verifier, VerifyResult
from keyserver.core.audit.writer import AuditWriter

__all__ = [
    "CHAIN_BATCH", "EXPORT_COLUMNS", "GENESIS_HASH", "MAX_ACTIVITY_BUCKETS", "SEARCH_COUNT_CAP",
    "SIGNED_FIELDS", "ZERO_DIGEST", "AsyncGroupCommit", "AuditFilter", "AuditRecord", "AuditService",
    "CheckpointPolicy", "GroupCommit", "Outcome", "PendingRecord", "VerifyResult", "canonical_checkpoint",
    "canonical_record", "checkpoint_dict", "checkpoint_digest", "event_dict", "key_fingerprint",
    "rollup_reason", "utcnow",
]


class AuditService:
    """The audit log as the rest of the server sees it: each method is one room's."""

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
        engine: Engine = session_factory.kw["bind"]
        mac = ChainMac(hsm, hmac_key_id)
        signed = Checkpoints(session_factory, hsm, checkpoints or CheckpointPolicy(), mac, now)
        chainer = Chainer(engine, mac, signed)
        writer = AuditWriter(session_factory, autocommit_engine=autocommit_engine or engine, now=now,
                             wake=chainer.wake)
        reader = AuditReader(session_factory, engine)
        counts = ActivityCounts(session_factory)
        # Writing (writer.py)
        self.add = writer.add
        self.add_many = writer.add_many
        self.commit = writer.commit
        self.commit_async = writer.commit_async
        self.deferred = writer.deferred
        self.record_now = writer.record_now
        self.transaction = writer.transaction
        self.record_after = writer.record_after
        # Chaining (chain.py)
        self.start = chainer.start
        self.stop = chainer.stop
        self.flush = chainer.flush
        # Checkpoints (checkpoints.py)
        self.public_key_der = signed.public_key_der
        self.public_key_pem = signed.public_key_pem
        self.sign_statement = signed.sign_statement
        self.checkpoints = signed.page
        self.chain_state = signed.chain_state
        self.status = signed.status
        # Reading (read.py, activity.py, export.py)
        self.pending = reader.pending
        self.query = reader.query
        self.get = reader.get
        self.activity = counts.activity
        self.usage = counts.usage
        self.export = AuditExport(session_factory, reader).export
        # Verifying (verify.py)
        self.verify = Verifier(session_factory, mac, signed, flush=chainer.flush, now=now).verify
