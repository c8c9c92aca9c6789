"""One audit record: what it holds, the exact bytes its MAC covers, and the MAC itself.

The canonical form is the log's file format: a change to it breaks every chain written
before it, so it changes only with a migration that says how old records verify.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from hsm import HsmBackend, HsmError
from keyserver.core.errors import hsm_failure
from keyserver.core.principal import RequestContext
from keyserver.store.models import AuditEvent

Outcome = Literal["allowed", "denied", "error"]
GENESIS_HASH = "0" * 64
EXPORT_COLUMNS = (
    "seq", "time", "actor", "actor_type", "action", "object_type", "object_id",
    "outcome", "source_ip", "request_id", "details", "prev_hash", "hash",
)
# The columns a record's MAC covers: every exported one but the MAC itself.
MAC_COLUMNS = EXPORT_COLUMNS[:-1]


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def connection(session: Session | Connection) -> Connection:
    return session.connection() if isinstance(session, Session) else session


def canonical_record(
    *, seq: int, time: datetime, actor: str, actor_type: str, action: str,
    object_type: str | None, object_id: str | None, outcome: str, source_ip: str | None,
    request_id: str | None, details: dict[str, Any], prev_hash: str,
) -> bytes:
    """The exact bytes that are MACed: stable across databases and Python versions."""
    doc = {
        "seq": seq, "time": iso(time), "actor": actor, "actor_type": actor_type,
        "action": action, "object_type": object_type, "object_id": object_id,
        "outcome": outcome, "source_ip": source_ip, "request_id": request_id,
        "details": details, "prev_hash": prev_hash,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """A chained record as the services hand it out (the protocol side never sees the
    row). `object_name`: the object's name when it was recorded (names.py)."""

    seq: int
    time: datetime
    actor: str
    actor_type: str
    action: str
    object_type: str | None
    object_id: str | None
    outcome: str
    source_ip: str | None
    request_id: str | None
    details: dict[str, Any]
    prev_hash: str
    hash: str

    @classmethod
    def of(cls, r: AuditEvent) -> AuditRecord:
        return cls(r.seq, r.time, r.actor, r.actor_type, r.action, r.object_type, r.object_id, r.outcome,
                   r.source_ip, r.request_id, r.details, r.prev_hash, r.hash)

    @property
    def object_name(self) -> str | None:
        name = self.details.get("object_name") if isinstance(self.details, dict) else None
        return name if isinstance(name, str) else None


def event_dict(r: AuditEvent | AuditRecord) -> dict[str, Any]:
    return {
        "seq": r.seq, "time": iso(r.time), "actor": r.actor, "actor_type": r.actor_type,
        "action": r.action, "object_type": r.object_type, "object_id": r.object_id,
        "outcome": r.outcome, "source_ip": r.source_ip, "request_id": r.request_id,
        "details": r.details, "prev_hash": r.prev_hash, "hash": r.hash,
    }


@dataclass(frozen=True, slots=True)
class PendingRecord:
    """One record for `add_many`."""

    ctx: RequestContext
    action: str
    object_type: str | None = None
    object_id: str | None = None
    details: dict[str, Any] | None = None
    outcome: Outcome = "allowed"


def payload(record: PendingRecord, now: datetime) -> dict[str, Any]:
    """What the inbox holds for a record until the chainer numbers and MACs it."""
    p = record.ctx.principal
    return {
        "time": iso(now),
        "actor": p.name,
        "actor_type": p.actor_type,
        "action": record.action,
        "object_type": record.object_type,
        "object_id": record.object_id,
        "outcome": record.outcome,
        "source_ip": record.ctx.source_ip,
        "request_id": record.ctx.request_id,
        "details": record.details or {},
    }


class ChainMac:
    """HMAC-SHA-256 under the chain's key, which never leaves the HSM."""

    def __init__(self, hsm: HsmBackend, key_id: str) -> None:
        self._hsm = hsm
        self.key_id = key_id

    def __call__(self, data: bytes) -> str:
        try:
            return self._hsm.hmac_sha256(data, key_id=self.key_id).hex()
        except HsmError as exc:
            raise hsm_failure("compute the audit chain MAC", exc) from exc

    def of_verified(self, checkpoint: int, seq: int, hash: str) -> str:
        """What makes `audit_verified` trustworthy: a MAC under the chain's HSM key, so a
        database writer cannot move the incremental start past an edit. The message is
        no record's canonical form (those are objects with a `seq` at the top)."""
        body = json.dumps({"audit_verified": {"checkpoint": checkpoint, "seq": seq, "hash": hash}},
                          sort_keys=True, separators=(",", ":")).encode()
        return self(body)
