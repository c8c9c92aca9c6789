"""The XKS proxy's per-replica cache (core/xks_cache.py): a change is refused or picked up
on the very next call after it commits, with the store and the grant already cached."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from keyserver.services import Services
from keyserver.store import db
from keyserver.store.notify import Notifier, Topic
from keyserver.store.xks import XksStore
from tests.integrations.test_xks import Xks, _error, _key, meta


@pytest.fixture
def warm(admin: httpx.Client, base_url: str, tls: Any, services: Services) -> tuple[Xks, str, str]:
    """A store with a granted key, both in the cache (the notifier heard: caches in use)."""
    assert services.notifier.healthy
    xks = Xks(admin, base_url, tls)
    key = _key(admin)
    ext = xks.grant(admin, key)
    lookups = services.xks._lookups
    # The notifications of the set-up arrive asynchronously (PostgreSQL) and clear the
    # cache: call until both entries are there.
    deadline = time.monotonic() + 10
    while True:
        assert xks.encrypt(ext, b"warm").status_code == 200
        if (lookups._cached(lookups._grants, (xks.name, ext)) is not None
                and lookups._cached(lookups._stores, (xks.name, xks.access)) is not None):
            return xks, key, ext
        assert time.monotonic() < deadline, "the XKS cache never warmed"
        time.sleep(0.05)


def _describe(xks: Xks, ext: str) -> httpx.Response:
    return xks.call(f"/keys/{ext}/metadata", {"requestMetadata": meta("DescribeKey")})


def test_store_revocation_is_refused_on_the_next_call(admin: httpx.Client, warm: tuple[Xks, str, str]) -> None:
    xks, _, ext = warm
    assert admin.post(f"/api/v1/xks/stores/{xks.name}/revoke").status_code == 200
    _error(xks.encrypt(ext, b"data"), 401, "AuthenticationFailedException")


def test_ungrant_is_refused_on_the_next_call(admin: httpx.Client, warm: tuple[Xks, str, str]) -> None:
    xks, _, ext = warm
    assert admin.delete(f"/api/v1/xks/stores/{xks.name}/keys/{ext}").status_code == 204
    _error(xks.encrypt(ext, b"data"), 404, "KeyNotFoundException")
    _error(_describe(xks, ext), 404, "KeyNotFoundException")


def test_key_revocation_is_refused_on_the_next_call(admin: httpx.Client, warm: tuple[Xks, str, str]) -> None:
    xks, key, ext = warm
    enc = xks.encrypt(ext, b"data").json()
    assert admin.post(f"/api/v1/keys/{key}/revoke", json={"reason": "superseded"}).status_code == 200
    _error(xks.encrypt(ext, b"data"), 400, "InvalidStateException")
    _error(xks.decrypt(ext, enc), 400, "InvalidStateException")
    assert _describe(xks, ext).json()["keyStatus"] == "DISABLED"


def test_credential_rotation_and_retirement_on_the_next_call(admin: httpx.Client,
                                                             warm: tuple[Xks, str, str]) -> None:
    xks, _, ext = warm
    r = admin.post(f"/api/v1/xks/stores/{xks.name}/credential")
    assert r.status_code == 200, r.text
    assert _describe(xks, ext).status_code == 200  # the previous pair, until retired
    assert admin.delete(f"/api/v1/xks/stores/{xks.name}/credential/previous").status_code == 200
    _error(_describe(xks, ext), 401, "AuthenticationFailedException")
    xks.access, xks.secret = r.json()["access_key_id"], r.json()["secret_access_key"]
    assert _describe(xks, ext).status_code == 200


def test_rotation_is_picked_up_for_new_encrypts(admin: httpx.Client, warm: tuple[Xks, str, str]) -> None:
    xks, key, ext = warm
    old = xks.encrypt(ext, b"before").json()
    assert admin.post(f"/api/v1/keys/{key}/rotate").status_code == 200
    new = xks.encrypt(ext, b"after").json()
    assert base64.b64decode(new["ciphertextMetadata"]) == b"SRX1\x00\x00\x00\x02"
    # older versions carried in ciphertextMetadata still decrypt
    assert base64.b64decode(xks.decrypt(ext, old).json()["plaintext"]) == b"before"
    assert base64.b64decode(xks.decrypt(ext, new).json()["plaintext"]) == b"after"


def test_a_lookup_that_raced_a_clear_is_not_kept(services: Services, warm: tuple[Xks, str, str]) -> None:
    xks, _, ext = warm
    lookups = services.xks._lookups
    real = lookups._read

    def racing() -> Any:
        lookups.clear()  # a change committed while the rows were being read
        return real()

    lookups.clear()
    lookups._read = racing  # type: ignore[assignment]
    try:
        assert lookups.grant(xks.name, ext) is not None
        assert lookups.store_rows(xks.name, xks.access)
    finally:
        lookups._read = real
    assert lookups._cached(lookups._grants, (xks.name, ext)) is None
    assert lookups._cached(lookups._stores, (xks.name, xks.access)) is None


def test_a_store_revoked_by_another_replica_is_refused(services: Services,
                                                       warm: tuple[Xks, str, str]) -> None:
    """The change committed by another process: refused once its notification arrives
    (LISTEN/NOTIFY on PostgreSQL, the change counter on SQLite)."""
    xks, _, ext = warm
    engine = db.make_engine(services.settings.effective_database_url, pool_size=1)
    try:
        with Session(engine) as s, s.begin():
            s.execute(update(XksStore).where(XksStore.name == xks.name).values(revoked_at=datetime.now(UTC)))
            Notifier(engine).publish(s, Topic.XKS)
    finally:
        engine.dispose()
    deadline = time.monotonic() + 10
    while (r := xks.encrypt(ext, b"data")).status_code == 200:
        assert time.monotonic() < deadline, "the other replica's revocation never reached this one"
        time.sleep(0.05)
    _error(r, 401, "AuthenticationFailedException")
