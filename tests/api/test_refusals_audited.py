"""Refused and failed security operations answer their precise code at once and leave
their audit record, even though the operation's own transaction rolls back; and no
request opens a second transaction while it holds one (on SQLite that wait was on
itself: 30 s, then 503, and the record lost). Runs on both stores."""

from __future__ import annotations

import base64
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from agents.keyclient.identity import HostIdentity
from keyserver.services import Services
from keyserver.store import db
from keyserver.store.db import NestedTransaction
from keyserver.store.models import AuditEvent, ManagedKey
from tests.api.test_hosts import enroll
from tests.conftest import Actor, unique


def _records(services: Services, action: str, object_id: str) -> list[AuditEvent]:
    services.audit.flush()
    with services.db() as s:
        return list(s.execute(select(AuditEvent).where(AuditEvent.action == action,
                                                       AuditEvent.object_id == object_id)
                              .order_by(AuditEvent.seq)).scalars())


def test_a_data_key_for_a_missing_key_is_404_and_audited(admin: httpx.Client, services: Services) -> None:
    name = unique("absent")
    r = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={})
    assert r.status_code == 404 and r.json()["code"] == "key_not_found"
    [rec] = _records(services, "datakey.generate", name)
    assert rec.outcome == "error" and rec.details == {"reason": "key_not_found"}


def test_a_tampered_blob_or_a_wrong_context_is_422_and_audited(admin: httpx.Client, new_key: dict[str, Any],
                                                                services: Services) -> None:
    dk = admin.post(f"/api/v1/keys/{new_key['name']}/generate-data-key", json={"context": {"a": "1"}}).json()
    blob = bytearray(base64.b64decode(dk["ciphertext_blob"]))
    blob[-1] ^= 1
    for body in ({"ciphertext_blob": base64.b64encode(bytes(blob)).decode(), "context": {"a": "1"}},
                 {"ciphertext_blob": dk["ciphertext_blob"], "context": {"a": "2"}}):
        r = admin.post("/api/v1/datakeys/decrypt", json=body)
        assert r.status_code == 422 and r.json()["code"] == "integrity_failure"
    failed = [r for r in _records(services, "datakey.decrypt", new_key["id"]) if r.outcome == "error"]
    assert [r.details["error"] for r in failed] == ["integrity", "integrity"]


def test_a_wrong_current_password_is_403_and_audited(actors: dict[str, Actor], services: Services) -> None:
    a = actors["auditor"]
    r = a.session.post("/api/v1/auth/password", json={"current_password": "not the password",
                                                      "new_password": "a new passphrase 42"})
    assert r.status_code == 403 and r.json()["code"] == "wrong_password"
    assert [rec.outcome for rec in _records(services, "user.change_password", a.username)] == ["denied"]


def test_a_refused_enrollment_is_audited_and_a_valid_one_enrolls(admin: httpx.Client, base_url: str,
                                                                  services: Services, tmp_path: Path) -> None:
    ident = HostIdentity.load_or_create(tmp_path / "host")
    hostname = f"{unique('audited')}.example.com"
    r = enroll(base_url, "sre_unknown_secret", ident, hostname)
    assert r.status_code == 401 and r.json()["code"] == "enrollment_invalid"
    token = admin.post("/api/v1/enrollment-tokens", json={"host_group": unique("g")}).json()["secret"]
    r = enroll(base_url, token, ident, hostname)
    assert r.status_code == 201, r.text
    assert [rec.outcome for rec in _records(services, "host.enroll", hostname)] == ["denied"]
    assert [rec.outcome for rec in _records(services, "host.enroll", r.json()["host_id"])] == ["allowed"]


def test_concurrent_enrollments_do_not_wait_on_each_other(admin: httpx.Client, base_url: str,
                                                           tmp_path: Path) -> None:
    """Each enrollment holds its token's row lock while the CA signs: signing needs no
    second transaction, so eight at once all finish, one use each."""
    token = admin.post("/api/v1/enrollment-tokens", json={"host_group": unique("g"), "max_uses": 8}).json()
    idents = [HostIdentity.load_or_create(tmp_path / f"h{i}") for i in range(9)]
    codes: list[int] = []

    def one(i: int) -> None:
        name = f"c{i}-{uuid.uuid4().hex[:6]}.example.com"
        codes.append(enroll(base_url, token["secret"], idents[i], name).status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(codes) == [201] * 8
    late = enroll(base_url, token["secret"], idents[8], "late.example.com")
    assert late.status_code == 401 and late.json()["code"] == "enrollment_used"


def test_a_second_transaction_on_the_same_thread_is_refused_at_once(services: Services) -> None:
    with services.db.begin() as outer:
        outer.execute(select(AuditEvent.seq).limit(1))
        with pytest.raises(NestedTransaction), services.db.begin() as inner:
            inner.execute(select(AuditEvent.seq).limit(1))
    with services.db.begin() as s:  # and the thread goes on afterwards
        s.execute(select(AuditEvent.seq).limit(1))


def test_a_busy_store_answers_503_with_retry_after_and_changes_nothing(admin: httpx.Client,
                                                                        new_key: dict[str, Any],
                                                                        services: Services) -> None:
    """Another writer holds what a rotation needs (SQLite: the write lock; PostgreSQL: the
    key's row): the request waits its bound, then answers 503 + Retry-After, not 30 s."""
    holder = db.make_engine(services.settings.effective_database_url, pool_size=1)
    try:
        with holder.connect() as conn:
            conn.begin()
            if holder.dialect.name == "postgresql":
                conn.execute(select(ManagedKey).where(ManagedKey.id == uuid.UUID(new_key["id"])).with_for_update())
            else:
                conn.execute(select(ManagedKey.id).limit(1))  # BEGIN IMMEDIATE took the write lock
            r = admin.post(f"/api/v1/keys/{new_key['name']}/rotate")
            assert r.status_code == 503 and r.json()["code"] == "store_busy", r.text
            assert r.headers["retry-after"] == "1"
            conn.rollback()
    finally:
        holder.dispose()
    assert admin.get(f"/api/v1/keys/{new_key['name']}").json()["current_version"] == 1
    assert admin.post(f"/api/v1/keys/{new_key['name']}/rotate").json()["current_version"] == 2
