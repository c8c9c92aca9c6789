"""Signed checkpoints: "the chain held `seq` records, the last with hash `hash`".

Every N records or T seconds the chainer signs one inside the HSM with an EC P-256 key
that is not the HMAC key, chained to the previous checkpoint, and the sinks copy it off
the server. Anyone with the public key can check a checkpoint without the HSM; a copy
outside the server detects what the database alone cannot: the tail cut off, the log
wiped, or the chain re-MACed by someone holding the token (docs/audit.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import Connection, insert, select
from sqlalchemy.orm import Session, sessionmaker

from hsm import HsmBackend, HsmError
from keyserver.core.audit.record import ChainMac, iso, parse_iso
from keyserver.core.errors import ServiceUnavailable, hsm_failure
from keyserver.store.models import AuditCheckpoint, AuditHead, AuditVerified

ZERO_DIGEST = "0" * 64  # the "previous checkpoint" of the first one
# What a checkpoint's signature covers. Signatures (ECDSA) differ each time one is made,
# so an outside copy is compared on these.
SIGNED_FIELDS = ("checkpoint", "seq", "hash", "time", "prev", "key")


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """When the chainer signs a checkpoint: after `records` new records, or when the
    newest is `seconds` old and not yet covered."""

    records: int = 1000
    seconds: float = 300.0
    key_id: str = "audit-checkpoint-v1"


def canonical_checkpoint(*, number: int, seq: int, hash: str, time: datetime, prev: str, key: str) -> bytes:
    """The exact bytes a checkpoint's signature covers (and its successor's `prev` hashes)."""
    doc = {"checkpoint": number, "seq": seq, "hash": hash, "time": iso(time), "prev": prev, "key": key}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def checkpoint_dict(c: Any) -> dict[str, Any]:
    """A checkpoint (row or entity) as sinks write it and `verify(outside=...)` reads it back."""
    return {"type": "checkpoint", "checkpoint": c.id, "seq": c.seq, "hash": c.hash, "time": iso(c.time),
            "prev": c.prev_digest, "key": c.key_fingerprint, "signature": c.signature}


def checkpoint_digest(c: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_checkpoint(
        number=c["checkpoint"], seq=c["seq"], hash=c["hash"], time=parse_iso(c["time"]), prev=c["prev"],
        key=c["key"])).hexdigest()


def key_fingerprint(public_der: bytes) -> str:
    return hashlib.sha256(public_der).hexdigest()


def checkpoint_problem(c: dict[str, Any], public: ec.EllipticCurvePublicKey, fingerprint: str) -> str | None:
    """Why checkpoint `c` is not a valid one of this server's (None when it is)."""
    try:
        if c["key"] != fingerprint:
            return f"checkpoint {c['checkpoint']} is signed by another key ({c['key'][:16]}…)"
        body = canonical_checkpoint(number=c["checkpoint"], seq=c["seq"], hash=c["hash"], time=parse_iso(c["time"]),
                                    prev=c["prev"], key=c["key"])
        public.verify(base64.b64decode(c["signature"], validate=True), body, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return f"checkpoint {c.get('checkpoint')}'s signature does not verify"
    except (KeyError, TypeError, ValueError):
        return "a checkpoint is malformed"
    return None


class Checkpoints:
    def __init__(self, session_factory: sessionmaker[Session], hsm: HsmBackend, policy: CheckpointPolicy,
                 mac: ChainMac, now: Callable[[], datetime]) -> None:
        self._db = session_factory
        self._hsm = hsm
        self._policy = policy
        self._mac = mac
        self._now = now
        self._public_der: bytes | None = None

    def public_key_der(self) -> bytes:
        """The checkpoint signing key's public half (SubjectPublicKeyInfo DER)."""
        if self._public_der is None:
            try:
                self._public_der = self._hsm.ensure_signing_key(self._policy.key_id)
            except HsmError as exc:
                raise hsm_failure("open the audit checkpoint key", exc) from exc
        return self._public_der

    def public_key_pem(self) -> str:
        key = serialization.load_der_public_key(self.public_key_der())
        return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def sign_statement(self, body: bytes) -> tuple[str, str]:
        """Sign `body` (a statement's canonical bytes, statements.py) in the HSM with the
        checkpoint key: (base64 DER signature, the key's fingerprint). One public key then
        verifies the checkpoints and every statement."""
        fingerprint = key_fingerprint(self.public_key_der())
        try:
            signature = self._hsm.sign_p256(body, key_id=self._policy.key_id)
        except HsmError as exc:
            raise hsm_failure("sign an audit statement", exc) from exc
        return base64.b64encode(signature).decode(), fingerprint

    def maybe_sign(self, conn: Connection, seq: int, hash: str, *, chained: bool) -> None:
        """Inside the chainer's transaction (the head's lock serialises every replica):
        sign a checkpoint when enough records or time have passed since the last one.
        `chained`: more records are waiting, so a time-based one can wait for them."""
        table = AuditCheckpoint.__table__
        last = conn.execute(select(table).order_by(table.c.id.desc()).limit(1)).first()
        covered = last.seq if last is not None else 0
        if seq <= covered:
            return
        now = self._now()
        due = (last is None or seq - covered >= self._policy.records
               or (not chained and (now - last.time).total_seconds() >= self._policy.seconds))
        if not due:
            return
        fingerprint = key_fingerprint(self.public_key_der())
        number = (last.id if last is not None else 0) + 1
        prev = checkpoint_digest(checkpoint_dict(last)) if last is not None else ZERO_DIGEST
        body = canonical_checkpoint(number=number, seq=seq, hash=hash, time=now, prev=prev, key=fingerprint)
        try:
            signature = self._hsm.sign_p256(body, key_id=self._policy.key_id)
        except HsmError as exc:
            raise hsm_failure("sign an audit checkpoint", exc) from exc
        conn.execute(insert(AuditCheckpoint).values(
            id=number, seq=seq, hash=hash, time=now, prev_digest=prev, key_fingerprint=fingerprint,
            signature=base64.b64encode(signature).decode()))

    def page(self, *, after: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
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
                vouched = hmac.compare_digest(verified.mac or "", self._mac.of_verified(
                    verified.checkpoint, verified.seq, verified.hash))
            except ServiceUnavailable:
                vouched = False
        return {
            "head_seq": head.seq if head else 0,
            "last_checkpoint": checkpoint_dict(last) if last is not None else None,
            "verified": None if verified is None or not vouched else {
                "checkpoint": verified.checkpoint, "seq": verified.seq, "at": iso(verified.verified_at)},
        }

    def status(self) -> dict[str, Any]:
        """`chain_state` and the checkpoint key's fingerprint: what the console shows
        instead of re-walking the chain."""
        return {**self.chain_state(), "key_fingerprint": key_fingerprint(self.public_key_der())}
