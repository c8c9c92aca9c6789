"""Host enrollment and key delivery: tokens, CSR -> certificate, delivery under the host's
own key inside the HSM, revocation."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from sqlalchemy import select

from agents.keyclient.identity import HostIdentity
from hsm import WrappedKey
from keyserver.core.errors import Forbidden, Unauthenticated
from keyserver.services import Services
from keyserver.store.models import EnrollmentToken, KeyVersion, ManagedKey
from tests import https
from tests.conftest import Actor, unique


def enroll(base_url: str, secret: str, ident: HostIdentity, hostname: str) -> httpx.Response:
    return https.post(f"{base_url}/api/v1/enroll", json={
        "token": secret, "csr_pem": ident.csr(hostname).decode(), "hostname": hostname,
        "os": "Debian 12", "agent_version": "0.1.0"})


@pytest.fixture
def operator(actors: dict[str, Actor]) -> httpx.Client:
    return actors["operator"].session


def test_enroll_deliver_and_revoke(tmp_path: Path, base_url: str, operator: httpx.Client, admin: httpx.Client,
                                   services: Services) -> None:
    group = unique("db")
    r = operator.post("/api/v1/enrollment-tokens", json={"host_group": group, "max_uses": 1})
    assert r.status_code == 201
    secret, token_id = r.json()["secret"], r.json()["token"]["id"]
    with services.db() as s:
        stored = s.get(EnrollmentToken, uuid.UUID(token_id))
        assert stored is not None and secret.split("_")[-1] not in stored.secret_hash
    ident = HostIdentity.load_or_create(tmp_path / "agent")
    r = enroll(base_url, secret, ident, "db01.example.com")
    assert r.status_code == 201, r.text
    body = r.json()
    cert = x509.load_pem_x509_certificate(body["certificate_pem"].encode())
    ca = x509.load_pem_x509_certificate(body["ca_pem"].encode())
    cert.verify_directly_issued_by(ca)
    assert cert.public_key().public_numbers() == ident.private_key.public_key().public_numbers()  # type: ignore[union-attr]
    ident.save_certificates(body["certificate_pem"].encode(), body["ca_pem"].encode())
    # One use only.
    again = enroll(base_url, secret, HostIdentity.load_or_create(tmp_path / "other"), "db02.example.com")
    assert again.status_code == 401 and again.json()["code"] == "enrollment_used"
    hosts = operator.get("/api/v1/hosts", params={"group": group}).json()["items"]
    host = next(h for h in hosts if h["id"] == body["host_id"])
    assert host["host_group"] == group and host["state"] == "active" and host["os"] == "Debian 12"

    # Delivery: keys tagged for the host's group, re-wrapped inside the HSM under its key.
    key = admin.post("/api/v1/keys", json={"name": unique("gp"), "tags": {"host-group": group}}).json()
    ctx, host_row = services.hosts.authenticate(host["cert_serial"])
    delivered = services.hosts.deliver_key(ctx, host_row, key["name"])
    plaintext = ident.unwrap(delivered.wrapped.ciphertext, mechanism=delivered.wrapped.mechanism)
    with services.db() as s:
        v = s.execute(select(KeyVersion).join(ManagedKey).where(ManagedKey.name == key["name"])).scalar_one()
        assert v.wrapping_key_id and v.wrapping_mechanism and v.wrapped_key
        assert plaintext == services.hsm.unwrap_key(WrappedKey(v.wrapping_key_id, v.wrapping_mechanism,
                                                               v.wrapped_key))
    other = admin.post("/api/v1/keys", json={"name": unique("notyours")}).json()
    with pytest.raises(Forbidden):
        services.hosts.deliver_key(ctx, host_row, other["name"])

    # Revocation: refused from the next call on.
    assert operator.post(f"/api/v1/hosts/{host['id']}/revoke").json()["state"] == "revoked"
    with pytest.raises(Unauthenticated) as exc:
        services.hosts.authenticate(host["cert_serial"])
    assert exc.value.code == "host_revoked"
    assert operator.post(f"/api/v1/hosts/{host['id']}/revoke").status_code == 409
    services.audit.flush()
    actions = {(e["action"], e["outcome"]) for e in admin.get(
        "/api/v1/audit/events", params={"limit": 1000}).json()["items"]}
    assert {("host.enroll", "allowed"), ("key.deliver", "allowed"), ("key.deliver", "denied"),
            ("host.revoke", "allowed"), ("host.authenticate", "denied")} <= actions


@pytest.mark.parametrize("case", ["revoked", "expired", "garbage"])
def test_unusable_tokens_are_refused_and_audited(tmp_path: Path, base_url: str, operator: httpx.Client,
                                                 services: Services, case: str) -> None:
    r = operator.post("/api/v1/enrollment-tokens", json={"host_group": "refused"}).json()
    secret = r["secret"]
    if case == "revoked":
        operator.delete(f"/api/v1/enrollment-tokens/{r['token']['id']}")
    elif case == "expired":
        from datetime import UTC, datetime, timedelta

        from sqlalchemy import update
        with services.db.begin() as s:
            s.execute(update(EnrollmentToken).where(EnrollmentToken.id == uuid.UUID(r["token"]["id"]))
                      .values(expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    else:
        secret = secret[:-4] + "AAAA"
    resp = enroll(base_url, secret, HostIdentity.load_or_create(tmp_path / "a"), "h1.example")
    assert resp.status_code == 401
    assert resp.json()["code"] == {"revoked": "enrollment_revoked", "expired": "enrollment_expired",
                                   "garbage": "enrollment_invalid"}[case]
    assert "ask an operator" in resp.json()["detail"]


@pytest.mark.parametrize("change,status", [
    ({"hostname": "bad host!"}, 400), ({"csr_pem": "not a csr"}, 400), ({"token": ""}, 422),
    ({"unexpected": 1}, 422),
])
def test_bad_enrollment_requests(tmp_path: Path, base_url: str, operator: httpx.Client,
                                 change: dict[str, Any], status: int) -> None:
    secret = operator.post("/api/v1/enrollment-tokens", json={"host_group": "bad"}).json()["secret"]
    ident = HostIdentity.load_or_create(tmp_path / "a")
    body = {"token": secret, "csr_pem": ident.csr("h.example").decode(), "hostname": "h.example", **change}
    r = https.post(f"{base_url}/api/v1/enroll", json=body)
    assert r.status_code == status, r.text


def test_weak_host_keys_are_refused(base_url: str, operator: httpx.Client) -> None:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # noqa: S505 - the weak key under test
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "weak.example")]))
           .sign(weak, hashes.SHA256()))
    secret = operator.post("/api/v1/enrollment-tokens", json={"host_group": "weak"}).json()["secret"]
    r = https.post(f"{base_url}/api/v1/enroll", json={
        "token": secret, "csr_pem": csr.public_bytes(serialization.Encoding.PEM).decode(), "hostname": "weak.example"})
    assert r.status_code == 400 and "2048" in r.json()["detail"]
