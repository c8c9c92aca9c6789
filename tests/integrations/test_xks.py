"""The AWS KMS external key store (XKS) proxy API over HTTPS, every request signed by
botocore's own SigV4 signer (`SigV4Auth`, service kms-xks-proxy): each operation, its
documented errors, rotation, revocation and the audit records (core/xks.py)."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from keyserver.services import Services
from tests.conftest import unique

REGION = "eu-west-1"
ARN = "arn:aws:iam::111122223333:role/app"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def meta(operation: str, **extra: str) -> dict[str, str]:
    return {"awsPrincipalArn": ARN, "kmsOperation": operation, "kmsRequestId": unique("req"),
            "kmsKeyArn": "arn:aws:kms:eu-west-1:111122223333:key/1234", **extra}


class Xks:
    """A key store as AWS KMS sees it: its credential, its URI path, a signing client."""

    def __init__(self, admin: httpx.Client, base_url: str, tls: Any, *, region: str = REGION) -> None:
        r = admin.post("/api/v1/xks/stores", json={"name": unique("xks"), "region": region})
        assert r.status_code == 201, r.text
        self.issued = r.json()
        self.name = self.issued["store"]["name"]
        self.path = self.issued["proxy_uri_path"]
        self.access, self.secret = self.issued["access_key_id"], self.issued["secret_access_key"]
        self.base_url, self.http = base_url, httpx.Client(base_url=base_url, verify=tls, timeout=30)

    def call(self, path: str, body: dict[str, Any] | bytes, *, region: str = REGION, service: str = "kms-xks-proxy",
             secret: str | None = None, access: str | None = None, when: datetime | None = None,
             tamper: bytes | None = None) -> httpx.Response:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        url = f"{self.base_url}{self.path}{path}"
        request = AWSRequest(method="POST", url=url, data=data, headers={"Content-Type": "application/json"})
        creds = Credentials(access or self.access, secret or self.secret)
        if when is None:
            SigV4Auth(creds, service, region).add_auth(request)
        else:
            with mock.patch("botocore.auth.get_current_datetime", return_value=when.replace(tzinfo=None)):
                SigV4Auth(creds, service, region).add_auth(request)
        headers = {k: v for k, v in request.headers.items()}
        return self.http.post(url, content=tamper if tamper is not None else data, headers=headers)

    def grant(self, admin: httpx.Client, key: str, external_id: str | None = None) -> str:
        r = admin.post(f"/api/v1/xks/stores/{self.name}/keys",
                       json={"key": key, **({"external_id": external_id} if external_id else {})})
        assert r.status_code == 201, r.text
        return str(r.json()["external_id"])

    def encrypt(self, key: str, plaintext: bytes, aad: bytes = b"", **extra: Any) -> httpx.Response:
        return self.call(f"/keys/{key}/encrypt", {"requestMetadata": meta("Encrypt"), "plaintext": b64(plaintext),
                                                  "additionalAuthenticatedData": b64(aad),
                                                  "encryptionAlgorithm": "AES_GCM", **extra})

    def decrypt(self, key: str, enc: dict[str, Any], aad: bytes = b"", **extra: Any) -> httpx.Response:
        body = {"requestMetadata": meta("Decrypt"), "additionalAuthenticatedData": b64(aad),
                "encryptionAlgorithm": "AES_GCM", "ciphertext": enc["ciphertext"],
                "initializationVector": enc["initializationVector"], "authenticationTag": enc["authenticationTag"],
                "ciphertextMetadata": enc["ciphertextMetadata"]}
        return self.call(f"/keys/{key}/decrypt", {**body, **extra})


@pytest.fixture
def xks(admin: httpx.Client, base_url: str, tls: Any) -> Xks:
    return Xks(admin, base_url, tls)


def _key(admin: httpx.Client, **extra: Any) -> str:
    r = admin.post("/api/v1/keys", json={"name": unique("xkey"), **extra})
    assert r.status_code == 201, r.text
    return str(r.json()["name"])


def _error(r: httpx.Response, status: int, name: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["errorName"] == name, r.text


def _events(services: Services, admin: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    services.audit.flush()
    r = admin.get("/api/v1/audit/events", params={"limit": 200, **params})
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


def test_create_shows_secret_once_and_keeps_it_sealed(admin: httpx.Client, xks: Xks, services: Services) -> None:
    assert xks.path == f"/xks/{xks.name}/kms/xks/v1"
    assert 20 <= len(xks.access) <= 30 and 43 <= len(xks.secret) <= 64
    got = admin.get(f"/api/v1/xks/stores/{xks.name}").json()
    assert "secret_access_key" not in got and got["region"] == REGION and got["uri_path_prefix"] == f"/xks/{xks.name}"
    from sqlalchemy import select

    from keyserver.store.xks import XksStore
    with services.db() as s:
        row = s.execute(select(XksStore).where(XksStore.name == xks.name)).scalar_one()
    assert xks.secret.encode() not in row.secret_sealed and xks.secret.encode() not in row.secret_dek


def test_health_metadata_encrypt_decrypt(admin: httpx.Client, xks: Xks, services: Services) -> None:
    r = xks.call("/health", {"requestMetadata": {"kmsRequestId": unique("h"), "kmsOperation": "KmsHealthCheck"}})
    assert r.status_code == 200, r.text
    assert r.json()["ekmFleetDetails"][0]["healthStatus"] == "ACTIVE"
    key = _key(admin)
    ext = xks.grant(admin, key, "aws-key-1")
    r = xks.call(f"/keys/{ext}/metadata", {"requestMetadata": meta("DescribeKey")})
    assert r.status_code == 200, r.text
    assert r.json() == {"keySpec": "AES_256", "keyUsage": ["ENCRYPT", "DECRYPT"], "keyStatus": "ENABLED"}
    aad = b'{"purpose":"test"}'
    r = xks.encrypt(ext, b"secret data", aad, ciphertextDataIntegrityValueAlgorithm="SHA_256")
    assert r.status_code == 200, r.text
    enc = r.json()
    raw = {k: base64.b64decode(v) for k, v in enc.items()}
    assert len(raw["initializationVector"]) == 12 and len(raw["authenticationTag"]) == 16
    assert raw["ciphertext"] != b"secret data" and len(raw["ciphertext"]) == len(b"secret data")
    assert raw["ciphertextDataIntegrityValue"] == hashlib.sha256(
        aad + raw["ciphertextMetadata"] + raw["initializationVector"] + raw["ciphertext"]
        + raw["authenticationTag"]).digest()
    r = xks.decrypt(ext, enc, aad)
    assert r.status_code == 200, r.text
    assert base64.b64decode(r.json()["plaintext"]) == b"secret data"
    # The AAD the HSM authenticated is the specification's: len(AAD) (2 bytes) || AAD ||
    # len(metadata) (1 byte) || metadata; checked with the key's own bytes.
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from sqlalchemy import select

    from keyserver.core.keys import version_wrapped
    from keyserver.store.models import KeyVersion, ManagedKey
    with services.db() as s:
        version = s.execute(select(KeyVersion).join(ManagedKey).where(ManagedKey.name == key)).scalar_one()
        material = services.hsm.unwrap_key(version_wrapped(version))
    spec_aad = (len(aad).to_bytes(2, "big") + aad + len(raw["ciphertextMetadata"]).to_bytes(1, "big")
                + raw["ciphertextMetadata"])
    assert AESGCM(material).decrypt(raw["initializationVector"], raw["ciphertext"] + raw["authenticationTag"],
                                    spec_aad) == b"secret data"
    # metadata moved into the AAD does not authenticate (the specification's example)
    _error(xks.decrypt(ext, enc, raw["ciphertextMetadata"], ciphertextMetadata=None), 400,
           "InvalidCiphertextException")
    records = _events(services, admin, actor=f"xks:{xks.name}")
    by_op = {e["details"].get("xks_operation") or e["action"]: e for e in records}
    for op in ("encrypt", "decrypt"):
        d = by_op[op]["details"]
        assert d["aws_principal_arn"] == ARN and d["kms_operation"] in ("Encrypt", "Decrypt")
        assert d["kms_request_id"].startswith("req-") and d["external_id"] == "aws-key-1"
        assert "secret data" not in json.dumps(by_op[op])
    assert {"xks.health", "xks.metadata"} <= {e["action"] for e in records}


def test_no_answer_leaves_before_its_audit_record_is_committed(admin: httpx.Client, xks: Xks,
                                                                services: Services,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The call's record is committed on the event loop after its work (audit.deferred):
    when that commit fails, the caller gets an error and no ciphertext or plaintext."""
    ext = xks.grant(admin, _key(admin))
    enc = xks.encrypt(ext, b"kept").json()
    committed: list[str] = []

    async def failing(record: Any) -> None:
        committed.append(record.action)
        raise OSError("audit store unavailable (injected)")

    monkeypatch.setattr(services.audit, "commit_async", failing)
    for r in (xks.encrypt(ext, b"never returned"), xks.decrypt(ext, enc),
              xks.call(f"/keys/{ext}/metadata", {"requestMetadata": meta("DescribeKey")})):
        assert r.status_code == 500, r.text
        assert "ciphertext" not in r.text and "plaintext" not in r.text and "keyStatus" not in r.text
    assert committed == ["key.encrypt", "key.decrypt", "xks.metadata"]
    monkeypatch.undo()
    r = xks.decrypt(ext, enc)
    assert r.status_code == 200 and base64.b64decode(r.json()["plaintext"]) == b"kept"


def test_refusals_found_during_a_call_are_audited(admin: httpx.Client, xks: Xks, services: Services) -> None:
    """A call that fails after it began (a tag that does not authenticate, a version
    destroyed since) is answered with the error and its record is in the audit log: the
    records a failed call made are committed like a successful one's."""
    key = _key(admin)
    ext = xks.grant(admin, key)
    enc = xks.encrypt(ext, b"v1 data").json()
    bad = {**enc, "authenticationTag": b64(bytes(16))}
    _error(xks.decrypt(ext, bad), 400, "InvalidCiphertextException")
    assert admin.post(f"/api/v1/keys/{key}/rotate").status_code == 200
    # AWS still holds v1's ciphertext: destroying it is crypto-shredding, asked for by name (decision 0024).
    r = admin.post(f"/api/v1/keys/{key}/destroy", json={"version": 1, "shred": True})
    assert r.status_code == 200, r.text
    r = xks.decrypt(ext, enc)
    assert r.status_code == 400, r.text
    records = [e for e in _events(services, admin, actor=f"xks:{xks.name}") if e["action"] == "key.decrypt"]
    assert sorted(e["outcome"] for e in records) == ["denied", "error"], records
    assert {e["details"].get("version") for e in records} == {1}, records


def test_calls_that_must_touch_the_store_are_redone_in_a_thread(admin: httpx.Client, xks: Xks,
                                                              services: Services) -> None:
    """With every cache dropped before each call, each one needs the store: tried on the
    event loop, refused that before any effect (no_blocking), redone in a thread, and
    answered exactly once with exactly one audit record."""
    ext = xks.grant(admin, _key(admin))
    answers = []
    for i in range(3):
        services.xks._lookups.clear()
        r = xks.encrypt(ext, f"plain {i}".encode())
        assert r.status_code == 200, r.text
        answers.append(r.json())
    for i, enc in enumerate(answers):
        services.xks._lookups.clear()
        r = xks.decrypt(ext, enc)
        assert base64.b64decode(r.json()["plaintext"]) == f"plain {i}".encode()
    records = [e for e in _events(services, admin, actor=f"xks:{xks.name}")
               if e["details"].get("external_id") == ext and e["action"] in ("key.encrypt", "key.decrypt")]
    assert sorted(e["action"] for e in records) == ["key.decrypt"] * 3 + ["key.encrypt"] * 3


def test_signature_errors(admin: httpx.Client, xks: Xks, services: Services) -> None:
    ext = xks.grant(admin, _key(admin))
    body = {"requestMetadata": meta("DescribeKey")}
    path = f"/keys/{ext}/metadata"
    _error(xks.call(path, body, secret="x" * 48), 401, "AuthenticationFailedException")
    _error(xks.call(path, body, region="us-east-1"), 401, "AuthenticationFailedException")
    _error(xks.call(path, body, service="kms"), 401, "AuthenticationFailedException")
    _error(xks.call(path, body, access="SRXKSAAAAAAAAAAAAAAAAAAAAAAAA"), 401, "AuthenticationFailedException")
    _error(xks.call(path, body, when=datetime.now(UTC) - timedelta(minutes=6)), 401, "AuthenticationFailedException")
    assert xks.call(path, body, when=datetime.now(UTC) - timedelta(minutes=4)).status_code == 200
    tampered = json.dumps({"requestMetadata": meta("Other")}).encode()
    _error(xks.call(path, body, tamper=tampered), 401, "AuthenticationFailedException")
    r = xks.http.post(f"{xks.path}{path}", json=body)
    _error(r, 401, "AuthenticationFailedException")
    denied = [e for e in _events(services, admin, action="xks.metadata") if e["outcome"] == "denied"
              and e["object_id"] == xks.name]
    assert len(denied) >= 6 and {e["details"]["refused"] for e in denied} >= {
        "signature_invalid", "scope_invalid", "credential_invalid"}


def test_credential_of_another_store_is_refused(admin: httpx.Client, xks: Xks, base_url: str, tls: Any) -> None:
    other = Xks(admin, base_url, tls)
    ext = xks.grant(admin, _key(admin))
    r = other.call(f"/keys/{ext}/metadata", {"requestMetadata": meta("DescribeKey")}, access=other.access)
    # other's credential against its own path: the key is not in that store
    _error(r, 404, "KeyNotFoundException")
    request_path = xks.path
    other.path = request_path  # other's credential on xks's path
    _error(other.call(f"/keys/{ext}/metadata", {"requestMetadata": meta("DescribeKey")}), 403,
           "AccessDeniedException")


def test_validation_and_ciphertext_errors(admin: httpx.Client, xks: Xks, services: Services) -> None:
    ext = xks.grant(admin, _key(admin))
    _error(xks.call("/keys/nope/metadata", {"requestMetadata": meta("DescribeKey")}), 404, "KeyNotFoundException")
    _error(xks.call(f"/keys/{ext}/sign", {"requestMetadata": meta("Sign")}), 404, "InvalidUriPathException")
    _error(xks.call(f"/keys/{ext}/health", {"requestMetadata": meta("Health")}), 404, "InvalidUriPathException")
    _error(xks.call(f"/keys/{ext}/metadata", {"requestMetadata": {"kmsOperation": "DescribeKey"}}), 400,
           "ValidationException")
    _error(xks.call(f"/keys/{ext}/metadata", b"not json"), 400, "ValidationException")
    # unsigned, the same malformed request learns only that it is not authenticated
    _error(xks.http.post(f"{xks.path}/keys/{ext}/metadata", content=b"not json"), 401,
           "AuthenticationFailedException")
    _error(xks.encrypt(ext, b"x" * 4301), 400, "ValidationException")
    assert xks.encrypt(ext, b"x" * 4300).status_code == 200
    _error(xks.encrypt(ext, b"x", encryptionAlgorithm="RSAES_OAEP_SHA_256"), 400, "ValidationException")
    _error(xks.encrypt(ext, b"x", ciphertextDataIntegrityValueAlgorithm="MD5"), 400, "ValidationException")
    enc = xks.encrypt(ext, b"payload", b"ctx").json()
    _error(xks.decrypt(ext, enc, b"other ctx"), 400, "InvalidCiphertextException")
    flipped = bytearray(base64.b64decode(enc["authenticationTag"]))
    flipped[0] ^= 1
    _error(xks.decrypt(ext, enc, b"ctx", authenticationTag=b64(bytes(flipped))), 400, "InvalidCiphertextException")
    ct = bytearray(base64.b64decode(enc["ciphertext"]))
    ct[0] ^= 1
    _error(xks.decrypt(ext, enc, b"ctx", ciphertext=b64(bytes(ct))), 400, "InvalidCiphertextException")
    _error(xks.decrypt(ext, enc, b"ctx", ciphertextMetadata=b64(b"SRX1\x00\x00\x00\x09")), 400,
           "InvalidCiphertextException")
    _error(xks.decrypt(ext, enc, b"ctx", ciphertextMetadata=b64(b"garbage")), 400, "InvalidCiphertextException")
    _error(xks.decrypt(ext, enc, b"ctx", authenticationTag=b64(b"short")), 400, "ValidationException")
    assert xks.decrypt(ext, enc, b"ctx").status_code == 200
    refused = {(e["action"], e["details"].get("refused")) for e in _events(services, admin, actor=f"xks:{xks.name}")
               if e["outcome"] == "denied"}
    assert {("xks.metadata", "ValidationException"), ("xks.encrypt", "ValidationException"),
            ("xks.metadata", "xks_key_not_found"), ("xks.decrypt", "invalid_ciphertext")} <= refused


def test_rotation_new_version_old_ciphertexts_decrypt(admin: httpx.Client, xks: Xks) -> None:
    key = _key(admin)
    ext = xks.grant(admin, key)
    old = xks.encrypt(ext, b"before").json()
    assert base64.b64decode(old["ciphertextMetadata"]) == b"SRX1\x00\x00\x00\x01"
    assert admin.post(f"/api/v1/keys/{key}/rotate").status_code == 200
    new = xks.encrypt(ext, b"after").json()
    assert base64.b64decode(new["ciphertextMetadata"]) == b"SRX1\x00\x00\x00\x02"
    assert base64.b64decode(xks.decrypt(ext, old).json()["plaintext"]) == b"before"
    assert base64.b64decode(xks.decrypt(ext, new).json()["plaintext"]) == b"after"
    # the version is authenticated: the old ciphertext under the new version's metadata fails
    _error(xks.decrypt(ext, old, ciphertextMetadata=new["ciphertextMetadata"]), 400, "InvalidCiphertextException")


def test_revoked_key_is_disabled(admin: httpx.Client, xks: Xks, services: Services) -> None:
    key = _key(admin)
    ext = xks.grant(admin, key)
    enc = xks.encrypt(ext, b"data").json()
    assert admin.post(f"/api/v1/keys/{key}/revoke", json={"reason": "superseded"}).status_code == 200
    r = xks.call(f"/keys/{ext}/metadata", {"requestMetadata": meta("DescribeKey")})
    assert r.status_code == 200 and r.json()["keyStatus"] == "DISABLED"
    _error(xks.encrypt(ext, b"data"), 400, "InvalidStateException")
    _error(xks.decrypt(ext, enc), 400, "InvalidStateException")
    denied = [e for e in _events(services, admin, actor=f"xks:{xks.name}") if e["outcome"] == "denied"]
    assert {e["details"]["refused"] for e in denied} == {"key_disabled"}


def test_store_revocation_credential_rotation_and_ungrant(admin: httpx.Client, xks: Xks) -> None:
    ext = xks.grant(admin, _key(admin))
    body = {"requestMetadata": meta("DescribeKey")}
    first = (xks.access, xks.secret)
    r = admin.post(f"/api/v1/xks/stores/{xks.name}/credential")
    assert r.status_code == 200, r.text
    assert r.json()["store"]["previous_access_key_id"] == first[0]
    # both pairs work while AWS KMS moves over (the XKS API's rotation)
    assert xks.call(f"/keys/{ext}/metadata", body).status_code == 200
    xks.access, xks.secret = r.json()["access_key_id"], r.json()["secret_access_key"]
    assert xks.call(f"/keys/{ext}/metadata", body).status_code == 200
    # a second re-issue drops the first pair; retiring drops the previous one
    r = admin.post(f"/api/v1/xks/stores/{xks.name}/credential")
    second, third = (xks.access, xks.secret), (r.json()["access_key_id"], r.json()["secret_access_key"])
    assert r.json()["store"]["previous_access_key_id"] == second[0]
    _error(xks.call(f"/keys/{ext}/metadata", body, access=first[0], secret=first[1]), 401,
           "AuthenticationFailedException")
    assert xks.call(f"/keys/{ext}/metadata", body).status_code == 200
    r = admin.delete(f"/api/v1/xks/stores/{xks.name}/credential/previous")
    assert r.status_code == 200 and r.json()["previous_access_key_id"] is None
    _error(xks.call(f"/keys/{ext}/metadata", body), 401, "AuthenticationFailedException")
    r = admin.delete(f"/api/v1/xks/stores/{xks.name}/credential/previous")
    assert r.status_code == 409 and r.json()["code"] == "no_previous_credential"
    xks.access, xks.secret = third
    assert admin.delete(f"/api/v1/xks/stores/{xks.name}/keys/{ext}").status_code == 204
    _error(xks.call(f"/keys/{ext}/metadata", body), 404, "KeyNotFoundException")
    assert admin.post(f"/api/v1/xks/stores/{xks.name}/revoke").status_code == 200
    _error(xks.call("/health", {"requestMetadata": {"kmsRequestId": "r", "kmsOperation": "KmsHealthCheck"}}), 401,
           "AuthenticationFailedException")


def test_management_refusals(admin: httpx.Client, xks: Xks, services: Services) -> None:
    from keyserver.core.keys import KeySpec
    from keyserver.core.principal import system_context

    hmac_key = services.keys.create(system_context("tests"), KeySpec(name=unique("hmac"),
                                                                     algorithm="HMAC-SHA256")).name
    r = admin.post("/api/v1/xks/stores", json={"name": "Bad Name", "region": REGION})
    assert r.status_code == 400 and r.json()["code"] == "invalid_xks_store_name"
    r = admin.post("/api/v1/xks/stores", json={"name": unique("x"), "region": "mars"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_region"
    r = admin.post("/api/v1/xks/stores", json={"name": xks.name, "region": REGION})
    assert r.status_code == 409 and r.json()["code"] == "xks_store_exists"
    r = admin.post(f"/api/v1/xks/stores/{xks.name}/keys", json={"key": hmac_key})
    assert r.status_code == 409 and r.json()["code"] == "wrong_key_algorithm"
    r = admin.post(f"/api/v1/xks/stores/{xks.name}/keys", json={"key": _key(admin, activate=False)})
    assert r.status_code == 409 and r.json()["code"] == "key_not_active"
    key = _key(admin)
    xks.grant(admin, key, "k1")
    r = admin.post(f"/api/v1/xks/stores/{xks.name}/keys", json={"key": key, "external_id": "k1"})
    assert r.status_code == 409 and r.json()["code"] == "external_id_in_use"
    r = admin.post(f"/api/v1/xks/stores/{xks.name}/keys", json={"key": key, "external_id": "bad id!"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_external_key_id"


def test_kek_rotation_rewraps_the_sealed_secret(admin: httpx.Client, xks: Xks, services: Services) -> None:
    from sqlalchemy import select

    from keyserver.core.principal import system_context
    from keyserver.store.xks import XksStore

    ext = xks.grant(admin, _key(admin))
    services.keks.resume_rotations()  # one another test started (tests/api) finishes first
    services.keks.start_rotation(system_context("tests"))
    services.keks.resume_rotations()
    with services.db() as s:
        wrapped_under = s.execute(select(XksStore.secret_dek_wrapping_key_id)
                                  .where(XksStore.name == xks.name)).scalar_one()
    assert wrapped_under == services.keks.current()
    services.xks._keys.clear()  # unseal again, from the re-wrapped DEK
    assert xks.call(f"/keys/{ext}/metadata", {"requestMetadata": meta("DescribeKey")}).status_code == 200


def test_the_store_refuses_a_connection_inside_no_blocking(services: Services) -> None:
    """What the proxy's event-loop attempt relies on: inside no_blocking() no connection
    is taken (none is checked out, none invalidated), and outside it all works as before."""
    from sqlalchemy import text

    from keyserver.store.db import WouldBlock, no_blocking
    pool = services.engine.pool
    before = pool.checkedout()
    with no_blocking(), pytest.raises(WouldBlock), services.db() as s:
        s.execute(text("select 1"))
    assert pool.checkedout() == before
    with services.db() as s:
        assert s.execute(text("select 1")).scalar() == 1
