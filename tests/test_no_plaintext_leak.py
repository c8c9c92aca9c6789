"""Plaintext key bytes never reach the database, the logs or the audit log.

After a workload that touches every key path, dump the whole database with pg_dump,
collect every log line, export the audit log, and search all of it for every secret
we know of, in raw, hex and base64 forms."""

from __future__ import annotations

import base64
import logging
import sqlite3
import subprocess

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from hsm import WrappedKey
from keyserver.services import Services
from keyserver.store.models import KeyVersion, ManagedKey
from tests.conftest import Actor, unique


def forms(secret: bytes) -> list[bytes]:
    b64 = base64.b64encode(secret)
    return [secret, secret.hex().encode(), secret.hex().upper().encode(), b64, b64.rstrip(b"="),
            base64.urlsafe_b64encode(secret).rstrip(b"=")]


def test_no_key_bytes_in_database_logs_or_audit(
    actors: dict[str, Actor], services: Services, database_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    admin = actors["admin"].client
    secrets: list[bytes] = []
    names = []
    for _ in range(3):
        name = admin.post("/api/v1/keys", json={"name": unique("leak")}).json()["name"]
        names.append(name)
        for _ in range(3):
            dk = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={"context": {"k": "v"}}).json()
            secrets.append(base64.b64decode(dk["plaintext"]))
            admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": dk["ciphertext_blob"],
                                                         "context": {"k": "v"}})
            bad = bytearray(base64.b64decode(dk["ciphertext_blob"]))
            bad[-3] ^= 0xFF
            admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": base64.b64encode(bytes(bad)).decode()})
        admin.post(f"/api/v1/keys/{name}/rotate")
        admin.post("/api/v1/datakeys/reencrypt", json={"ciphertext_blob": dk["ciphertext_blob"],
                                                       "context": {"k": "v"}})
    token = actors["operator"].client.headers["authorization"].split()[1].encode()
    # srk_<lookup>_<secret>: the lookup is base32 (no "_"), the secret url-safe base64, which
    # may itself hold "_" -- so split once, after the lookup, never at the last "_".
    token_secret = token.removeprefix(b"srk_").partition(b"_")[2]
    assert len(token_secret) >= 40
    session_cookie = actors["operator"].session.cookies["strongroom_session"].encode()
    services.audit.flush()
    # The managed key versions' own material, unwrapped here only to know what to look for
    # (HMAC keys, made by other tests in this process, are generic secrets: unwrap_secret).
    with services.db() as s:
        for v, algorithm in s.execute(select(KeyVersion, ManagedKey.algorithm).join(ManagedKey)
                                      .where(KeyVersion.wrapped_key.is_not(None))):
            assert v.wrapping_key_id and v.wrapping_mechanism and v.wrapped_key
            unwrap = services.hsm.unwrap_key if algorithm == "AES" else services.hsm.unwrap_secret
            secrets.append(unwrap(WrappedKey(v.wrapping_key_id, v.wrapping_mechanism, v.wrapped_key)))
    assert len(secrets) > 9

    u = make_url(database_url)
    if u.get_backend_name() == "sqlite":
        with sqlite3.connect(str(u.database)) as conn:
            dump = "\n".join(conn.iterdump()).encode()
    else:
        dump = subprocess.run(["pg_dump", "-h", str(u.host), "-p", str(u.port or 5432), "-U", str(u.username),
                               "--data-only", "--inserts", str(u.database)],
                              check=True, capture_output=True).stdout
    assert b"managed_keys" in dump and len(dump) > 10_000
    logs = "\n".join(r.getMessage() + str(r.__dict__) for r in caplog.records).encode()
    audit = admin.get("/api/v1/audit/export", params={"format": "jsonl"}).content
    assert audit.count(b"\n") > 20

    haystacks = {"database dump": dump, "logs": logs, "audit export": audit}
    for where, data in haystacks.items():
        for secret in secrets:
            for form in forms(secret):
                assert form not in data, f"key material found in the {where}"
        assert token_secret not in data, f"API token secret found in the {where}"
        assert session_cookie not in data, f"session cookie found in the {where}"


def test_error_responses_carry_no_key_material(admin: httpx.Client) -> None:
    name = admin.post("/api/v1/keys", json={"name": unique("errs")}).json()["name"]
    dk = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={}).json()
    plaintext = base64.b64decode(dk["plaintext"])
    r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": dk["ciphertext_blob"],
                                                     "context": {"wrong": "context"}})
    assert r.status_code == 422
    for form in forms(plaintext):
        assert form not in r.content
