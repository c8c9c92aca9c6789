"""Anchored audit: signed checkpoints of the chain, incremental verification, and an
outside copy of the checkpoints that catches what the database alone cannot — a cut
tail, a wipe, a chain re-MACed by someone holding the token (issue 15).

The destructive cases run on a store of their own (a scratch PostgreSQL database, or a
fresh embedded one), with the session's SoftHSM2 token."""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import delete, select, update

from hsm import HsmBackend
from keyserver.core.audit import (
    AuditService,
    CheckpointPolicy,
    canonical_checkpoint,
    canonical_record,
    checkpoint_digest,
)
from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.store.models import AuditCheckpoint, AuditEvent, AuditHead, AuditVerified
from tests.conftest import own_services

EVERY = 5  # records per checkpoint in the scratch store


@pytest.fixture
def store(services: Services, hsm_backend: HsmBackend, tmp_path: Any) -> Iterator[Services]:
    """A store of its own, on the session's kind of store (`services` selects the test
    for both runs), checkpointing every five records."""
    with own_services(tmp_path / "data", hsm_backend, audit_checkpoint_records=EVERY,
                      audit_checkpoint_seconds=3600) as svc:
        yield svc


def _records(svc: Services, n: int, actor: str = "tests") -> None:
    """`n` records, each chained before the next (so checkpoints fall every EVERY)."""
    for i in range(n):
        svc.audit.record_now(system_context(actor), action="test.event", outcome="allowed", details={"i": i})
        svc.audit.flush()


def _checkpoints(svc: Services) -> list[dict[str, Any]]:
    return svc.audit.checkpoints()


def _verify_outside(c: dict[str, Any], public_pem: str) -> None:
    """What a SIEM or an auditor does with nothing but the public key."""
    key = serialization.load_pem_public_key(public_pem.encode())
    assert isinstance(key, ec.EllipticCurvePublicKey)
    body = canonical_checkpoint(number=c["checkpoint"], seq=c["seq"], hash=c["hash"],
                                time=__import__("datetime").datetime.fromisoformat(c["time"].replace("Z", "+00:00")),
                                prev=c["prev"], key=c["key"])
    key.verify(base64.b64decode(c["signature"]), body, ec.ECDSA(hashes.SHA256()))


def test_checkpoints_are_signed_every_n_records_chained_and_checkable_without_the_hsm(store: Services) -> None:
    _records(store, 2)
    first = _checkpoints(store)
    assert first and first[0]["checkpoint"] == 1  # the first chaining anchors at once
    covered = first[-1]["seq"]
    _records(store, EVERY - 1 - (store.audit.status()["head_seq"] - covered))
    assert store.audit.status()["head_seq"] == covered + EVERY - 1
    assert len(_checkpoints(store)) == len(first)  # not yet due
    _records(store, 1)
    cps = _checkpoints(store)
    assert len(cps) == len(first) + 1 and cps[-1]["seq"] == covered + EVERY
    status = store.audit.status()
    assert status["last_checkpoint"] == cps[-1] and status["head_seq"] == cps[-1]["seq"]
    pem = store.audit.public_key_pem()
    public_der = serialization.load_pem_public_key(pem.encode()).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert status["key_fingerprint"] == hashlib.sha256(public_der).hexdigest() == cps[0]["key"]
    for c in cps:
        _verify_outside(c, pem)
    assert cps[-1]["prev"] == checkpoint_digest(cps[-2])
    with store.db() as s:  # a checkpoint names the record it covers, by its hash
        assert s.execute(select(AuditEvent.hash).where(AuditEvent.seq == cps[-1]["seq"])).scalar_one() == \
            cps[-1]["hash"]
    forged = {**cps[-1], "seq": cps[-1]["seq"] + 1}
    with pytest.raises(InvalidSignature):
        _verify_outside(forged, pem)


def test_a_quiet_chain_is_checkpointed_after_its_time(store: Services) -> None:
    quick = AuditService(store.db, store.hsm, hmac_key_id=store.settings.audit_hmac_key_id,
                         checkpoints=CheckpointPolicy(records=1000, seconds=0.3,
                                                      key_id=store.settings.audit_checkpoint_key_id))
    _records(store, 1)
    before = len(_checkpoints(store))
    time.sleep(0.4)
    quick.flush()  # nothing waiting, but the newest record is older than T and not covered
    assert len(_checkpoints(store)) == before + 1
    quick.flush()
    assert len(_checkpoints(store)) == before + 1  # nothing new: no new checkpoint


def test_verification_starts_at_the_last_verified_checkpoint_and_full_walks_everything(store: Services) -> None:
    _records(store, EVERY)
    first = store.audit.verify()
    assert first.ok and first.from_seq == 0 and first.checkpoint is not None
    _records(store, EVERY + 2)
    second = store.audit.verify()
    assert second.ok and second.from_seq > 0 and second.checked == second.head_seq - second.from_seq
    with store.db() as s:
        verified = s.get(AuditVerified, 1)
        assert verified is not None and verified.checkpoint == second.checkpoint
    assert store.audit.status()["verified"]["checkpoint"] == second.checkpoint
    # An edit before the verified checkpoint is left to the full walk (docs/audit.md).
    with store.db.begin() as s:
        s.execute(update(AuditEvent).where(AuditEvent.seq == 2).values(actor="someone-else"))
    assert store.audit.verify().ok
    full = store.audit.verify(full=True)
    assert not full.ok and full.first_broken_seq == 2 and "altered" in (full.reason or "")


def test_the_database_alone_misses_a_cut_tail_and_the_outside_copy_does_not(store: Services) -> None:
    _records(store, 3 * EVERY)
    outside = _checkpoints(store)
    assert len(outside) >= 3
    keep = outside[-2]["seq"] - 1  # cut the tail, the last two checkpoints with it
    with store.db.begin() as s:
        kept_hash = s.execute(select(AuditEvent.hash).where(AuditEvent.seq == keep)).scalar_one()
        s.execute(delete(AuditEvent).where(AuditEvent.seq > keep))
        s.execute(delete(AuditCheckpoint).where(AuditCheckpoint.seq > keep))
        s.execute(delete(AuditVerified))
        s.execute(update(AuditHead).where(AuditHead.id == 1).values(seq=keep, hash=kept_hash))
    assert store.audit.verify(full=True).ok  # what the issue found: the database agrees with itself
    r = store.audit.verify(outside=outside)
    assert not r.ok and "tail was cut off" in (r.reason or "")


def test_the_outside_copy_detects_a_wipe(store: Services) -> None:
    _records(store, EVERY)
    outside = _checkpoints(store)
    with store.db.begin() as s:
        for table in (AuditEvent, AuditCheckpoint, AuditVerified, AuditHead):
            s.execute(delete(table))
    assert store.audit.verify(full=True).ok  # "intact: 0 records"
    r = store.audit.verify(outside=outside)
    assert not r.ok and "wiped" in (r.reason or "")


def test_the_outside_copy_detects_a_chain_re_maced_with_the_token(store: Services) -> None:
    """Someone who can read the data directory holds the token's PINs: they edit a
    record, recompute every later MAC with the token, and re-sign the checkpoints. The
    database verifies; the copy outside does not match."""
    _records(store, 2 * EVERY)
    outside = _checkpoints(store)
    with store.db.begin() as s:
        rows = list(s.execute(select(AuditEvent).order_by(AuditEvent.seq)).scalars())
        prev = rows[0].prev_hash
        for r in rows:
            if r.seq == 3:
                r.actor = "nobody"
            r.prev_hash = prev
            fields = {c: getattr(r, c) for c in ("seq", "time", "actor", "actor_type", "action", "object_type",
                                                 "object_id", "outcome", "source_ip", "request_id", "details",
                                                 "prev_hash")}
            r.hash = prev = store.hsm.hmac_sha256(canonical_record(**fields),
                                                  key_id=store.settings.audit_hmac_key_id).hex()
        s.execute(update(AuditHead).where(AuditHead.id == 1).values(hash=prev))
        s.execute(delete(AuditCheckpoint))
        s.execute(delete(AuditVerified))
    _records(store, 1)  # the chainer signs a fresh first checkpoint over the rewritten chain
    assert store.audit.verify(full=True).ok
    r = store.audit.verify(outside=outside)
    assert not r.ok and "rewritten" in (r.reason or "") and r.first_broken_seq == outside[0]["seq"]


def test_status_checkpoints_and_verify_over_rest(admin: httpx.Client, services: Services) -> None:
    services.audit.flush()
    status = admin.get("/api/v1/audit/status").json()
    cps = admin.get("/api/v1/audit/checkpoints").json()
    assert cps and status["last_checkpoint"] == {k: v for k, v in cps[-1].items()}
    for c in cps:
        _verify_outside(c, status["public_key_pem"])
    r = admin.post("/api/v1/audit/verify", json={"outside": cps}).json()
    assert r["ok"] is True and r["outside_checked"] == len(cps)
    again = admin.post("/api/v1/audit/verify").json()  # no body: incremental
    assert again["ok"] is True and again["from_seq"] >= 0
    full = admin.post("/api/v1/audit/verify", json={"full": True}).json()
    assert full["ok"] is True and full["from_seq"] == 0 and full["checked"] == full["head_seq"]
    bad = {**cps[0], "hash": "f" * 64}
    r = admin.post("/api/v1/audit/verify", json={"outside": [bad]}).json()
    assert r["ok"] is False and "signature does not verify" in r["reason"]
    r = admin.post("/api/v1/audit/verify", json={"outside": [{**cps[0], "seq": -1}]})
    assert r.status_code == 422
