"""The audit chain: records, queries, exports, verification, tampering, concurrency."""

from __future__ import annotations

import csv
import io
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from sqlalchemy import delete, select, update

from keyserver.services import Services
from keyserver.store.models import AuditEvent, AuditHead
from tests.conftest import Actor


def test_key_actions_are_recorded(admin: httpx.Client, services: Services, new_key: dict[str, Any]) -> None:
    r = admin.post(f"/api/v1/keys/{new_key['name']}/rotate", headers={"X-Request-ID": "req-rotate-1"})
    assert r.headers["x-request-id"] == "req-rotate-1"
    services.audit.flush()
    page = admin.get("/api/v1/audit/events", params={"object_id": new_key["id"]}).json()
    actions = [e["action"] for e in page["items"]]
    assert actions[:2] == ["key.rotate", "key.create"]
    rot = page["items"][0]
    assert rot["request_id"] == "req-rotate-1" and rot["outcome"] == "allowed"
    assert rot["source_ip"] == "127.0.0.1" and rot["actor_type"] == "token"
    assert rot["details"]["version"] == 2 and len(rot["hash"]) == 64
    one = admin.get(f"/api/v1/audit/events/{rot['seq']}").json()
    assert one == rot
    assert admin.get("/api/v1/audit/events/999999999").status_code == 404


def test_filters_and_cursor(admin: httpx.Client, services: Services) -> None:
    services.audit.flush()
    first = admin.get("/api/v1/audit/events", params={"limit": 5}).json()
    assert len(first["items"]) == 5 and first["next_before_seq"] == first["items"][-1]["seq"]
    nxt = admin.get("/api/v1/audit/events", params={"limit": 5, "before_seq": first["next_before_seq"]}).json()
    assert nxt["items"][0]["seq"] < first["items"][-1]["seq"]
    denied = admin.get("/api/v1/audit/events", params={"outcome": "denied", "limit": 1000}).json()
    assert all(e["outcome"] == "denied" for e in denied["items"])
    keys = admin.get("/api/v1/audit/events", params={"action": "key.", "limit": 1000}).json()
    assert keys["items"] and all(e["action"].startswith("key.") for e in keys["items"])
    assert admin.get("/api/v1/audit/events", params={"outcome": "maybe"}).status_code == 422
    window = admin.get("/api/v1/audit/events", params={"since": "2999-01-01T00:00:00Z"}).json()
    assert window["items"] == [] and window["total"] == 0


def test_export_csv_and_jsonl(admin: httpx.Client, services: Services) -> None:
    services.audit.flush()
    r = admin.get("/api/v1/audit/export", params={"format": "jsonl", "action": "key.create"})
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert lines and all(x["action"] == "key.create" for x in lines)
    assert [x["seq"] for x in lines] == sorted(x["seq"] for x in lines)
    r = admin.get("/api/v1/audit/export", params={"format": "csv", "action": "key.create"})
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == len(lines) and rows[0]["hash"] == lines[0]["hash"]
    assert "attachment" in r.headers["content-disposition"]


def test_verify_detects_edit_deletion_and_truncation(admin: httpx.Client, services: Services) -> None:
    """The full walk (`full`): an incremental run starts at the last verified checkpoint
    and leaves older records to it (tests/api/test_audit_checkpoints.py)."""
    services.audit.flush()
    ok = admin.post("/api/v1/audit/verify").json()
    assert ok["ok"] is True and ok["checked"] >= 1 and ok["first_broken_seq"] is None
    services.audit.flush()
    with services.db() as s:
        victim = s.execute(select(AuditEvent).order_by(AuditEvent.seq.desc()).offset(3).limit(1)).scalar_one()
        last = s.execute(select(AuditEvent).order_by(AuditEvent.seq.desc()).limit(1)).scalar_one()
        snapshot = {c.name: getattr(victim, c.name) for c in AuditEvent.__table__.columns}
        last_snap = {c.name: getattr(last, c.name) for c in AuditEvent.__table__.columns}
    try:
        # 1. someone with database access edits a record
        with services.db.begin() as s:
            s.execute(update(AuditEvent).where(AuditEvent.seq == victim.seq).values(actor="someone-else"))
        r = services.audit.verify(full=True)
        assert not r.ok and r.first_broken_seq == victim.seq and "altered" in (r.reason or "")
        # 2. ... or deletes it
        with services.db.begin() as s:
            s.execute(delete(AuditEvent).where(AuditEvent.seq == victim.seq))
        r = services.audit.verify(full=True)
        assert not r.ok and r.first_broken_seq == victim.seq and "missing" in (r.reason or "")
    finally:
        with services.db.begin() as s:
            s.add(AuditEvent(**snapshot))
    assert services.audit.verify(full=True).ok
    # 3. ... or cuts off the tail
    with services.db.begin() as s:
        s.execute(delete(AuditEvent).where(AuditEvent.seq == last.seq))
    try:
        r = services.audit.verify(full=True)
        assert not r.ok and "removed" in (r.reason or "")
    finally:
        with services.db.begin() as s:
            s.add(AuditEvent(**last_snap))
    # 4. a record forged without the HSM key (plain SHA-256, correct links) is caught
    import hashlib
    from datetime import UTC, datetime

    from keyserver.core.audit import canonical_record

    services.audit.flush()
    with services.db.begin() as s:
        head = s.get(AuditHead, 1)
        assert head is not None
        saved = (head.seq, head.hash)
        fields: dict[str, Any] = {
            "seq": head.seq + 1, "time": datetime.now(UTC), "actor": "forger", "actor_type": "user",
            "action": "key.read", "object_type": None, "object_id": None, "outcome": "allowed",
            "source_ip": None, "request_id": None, "details": {}, "prev_hash": head.hash}
        forged = hashlib.sha256(canonical_record(**fields)).hexdigest()
        s.add(AuditEvent(**fields, hash=forged))
        head.seq, head.hash = head.seq + 1, forged
    try:
        r = services.audit.verify(full=True)
        assert not r.ok and r.first_broken_seq == saved[0] + 1
    finally:
        with services.db.begin() as s:
            s.execute(delete(AuditEvent).where(AuditEvent.seq == saved[0] + 1))
            s.execute(update(AuditHead).where(AuditHead.id == 1).values(seq=saved[0], hash=saved[1]))
    assert services.audit.verify(full=True).ok


def test_cli_verify_through_api_reports(admin: httpx.Client, services: Services) -> None:
    r = admin.post("/api/v1/audit/verify").json()
    services.audit.flush()
    rec = admin.get("/api/v1/audit/events", params={"action": "audit.verify", "limit": 1}).json()["items"][0]
    assert rec["details"]["ok"] is True and rec["details"]["checked"] == r["checked"]


def test_concurrent_writers_lose_nothing(actors: dict[str, Actor], services: Services) -> None:
    """Many requests at once, the background chainer running: every record is chained
    exactly once, with no gap and a verifying chain."""
    services.audit.start(poll_seconds=0.05)
    try:
        admin = actors["admin"].client
        name = admin.post("/api/v1/keys", json={"name": f"conc-{id(services)}"}).json()["name"]

        def work(i: int) -> str:
            r = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={},
                           headers={"X-Request-ID": f"conc-{i}"})
            assert r.status_code == 200
            return r.headers["x-request-id"]

        with ThreadPoolExecutor(16) as pool:
            ids = set(pool.map(work, range(200)))
    finally:
        services.audit.stop()
    with services.db() as s:
        got = list(s.execute(select(AuditEvent.request_id).where(AuditEvent.request_id.like("conc-%"))).scalars())
    assert sorted(got) == sorted(ids)
    result = services.audit.verify()
    assert result.ok, result.reason
