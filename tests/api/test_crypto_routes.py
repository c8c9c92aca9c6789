"""Cryptographic services over REST (/keys/{key}/encrypt|decrypt|sign|verify|mac, /random):
the key stays in the HSM; results checked against `cryptography`, refusals precise and
audited, every use recorded with the key version."""

from __future__ import annotations

import base64
import os
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from sqlalchemy import select

from keyserver.core.errors import InvalidInput
from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.store.models import AuditEvent
from tests.conftest import Actor, unique


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def post(client: httpx.Client, path: str, status: int = 200, **body: Any) -> dict[str, Any]:
    r = client.post(f"/api/v1{path}", json=body)
    assert r.status_code == status, r.text
    return dict(r.json())


def events(services: Services, action: str, object_id: str) -> list[AuditEvent]:
    services.audit.flush()
    with services.db() as s:
        return list(s.execute(select(AuditEvent).where(AuditEvent.action == action, AuditEvent.object_id == object_id)
                              .order_by(AuditEvent.seq)).scalars())


def test_encrypt_and_decrypt_across_a_rotation(admin: httpx.Client, services: Services) -> None:
    key = post(admin, "/keys", 201, name=unique("crypto"))
    data = os.urandom(5000)
    gcm = post(admin, f"/keys/{key['name']}/encrypt", plaintext=b64(data), aad=b64(b"row 7"))
    assert len(unb64(gcm["iv"])) == 12 and len(unb64(gcm["tag"])) == 16 and len(unb64(gcm["ciphertext"])) == 5000
    cbc = post(admin, f"/keys/{key['name']}/encrypt", plaintext=b64(data), mode="AES-CBC-PAD")
    assert cbc["tag"] is None and len(unb64(cbc["ciphertext"])) == 5008  # PKCS#7 padding to a block
    assert gcm["version"] == cbc["version"] == 1  # what to keep beside the ciphertext
    post(admin, f"/keys/{key['name']}/rotate")
    assert post(admin, f"/keys/{key['name']}/encrypt", plaintext=b64(b"x"))["version"] == 2
    # the rotated-out version (Deactivated) still decrypts, named by its version
    back = post(admin, f"/keys/{key['name']}/decrypt", ciphertext=gcm["ciphertext"], iv=gcm["iv"], tag=gcm["tag"],
                aad=b64(b"row 7"), version=gcm["version"])
    assert unb64(back["plaintext"]) == data
    back = post(admin, f"/keys/{key['name']}/decrypt", ciphertext=cbc["ciphertext"], iv=cbc["iv"],
                mode="AES-CBC-PAD", version=1)
    assert unb64(back["plaintext"]) == data
    # wrong associated data: one opaque integrity error, audited as an error
    r = admin.post(f"/api/v1/keys/{key['name']}/decrypt", json={
        "ciphertext": gcm["ciphertext"], "iv": gcm["iv"], "tag": gcm["tag"], "aad": b64(b"row 8"), "version": 1})
    assert r.status_code == 422 and r.json()["code"] == "integrity_failure"
    recorded = events(services, "key.encrypt", key["id"])
    assert [(e.details["version"], e.details["mechanism"]) for e in recorded] == [
        (1, "AES-GCM"), (1, "AES-CBC-PAD"), (2, "AES-GCM")]
    decrypts = events(services, "key.decrypt", key["id"])
    assert [e.outcome for e in decrypts] == ["allowed", "allowed", "error"]
    assert all("plaintext" not in str(e.details) and b64(data)[:16] not in str(e.details) for e in decrypts)


def test_state_and_usage_rules(admin: httpx.Client, services: Services) -> None:
    key = post(admin, "/keys", 201, name=unique("deactivated"))
    sealed = post(admin, f"/keys/{key['name']}/encrypt", plaintext=b64(b"x"))
    post(admin, f"/keys/{key['name']}/deactivate")
    r = admin.post(f"/api/v1/keys/{key['name']}/encrypt", json={"plaintext": b64(b"x")})
    assert r.status_code == 409 and r.json()["code"] == "illegal_state" and "only an Active key" in r.json()["detail"]
    assert unb64(post(admin, f"/keys/{key['name']}/decrypt", ciphertext=sealed["ciphertext"], iv=sealed["iv"],
                      tag=sealed["tag"])["plaintext"]) == b"x"
    pre = post(admin, "/keys", 201, name=unique("pre"), activate=False)
    r = admin.post(f"/api/v1/keys/{pre['name']}/decrypt", json={"ciphertext": sealed["ciphertext"]})
    assert r.status_code == 409 and "pre-active" in r.json()["detail"]
    # an AES key does not MAC or sign
    live = post(admin, "/keys", 201, name=unique("aes"))
    r = admin.post(f"/api/v1/keys/{live['name']}/mac", json={"data": b64(b"x")})
    assert r.status_code == 409 and r.json()["code"] == "usage_not_allowed"
    # more than the HTTP body limit: refused before it is read; the service's own bound says its figure
    r = admin.post(f"/api/v1/keys/{live['name']}/encrypt", json={"plaintext": b64(os.urandom(1024 * 1024 + 1))})
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    with pytest.raises(InvalidInput, match="at most 1048576"):
        services.crypto.encrypt(system_context("tests"), services.kmip_objects.uid_of(live["name"]),
                                bytes(1024 * 1024 + 1))


def test_hmac_keys_mac_and_verify_and_make_no_data_keys(admin: httpx.Client, services: Services) -> None:
    from keyserver.core.keys import KeySpec

    key = services.keys.create(system_context("tests"), KeySpec(name=unique("hmac"), algorithm="HMAC-SHA512",
                                                                length_bits=512))
    mac = unb64(post(admin, f"/keys/{key.name}/mac", data=b64(b"message"))["mac"])
    assert len(mac) == 64
    assert post(admin, f"/keys/{key.name}/mac", data=b64(b"message"), mac=b64(mac)) == {"mac": None, "valid": True}
    assert post(admin, f"/keys/{key.name}/mac", data=b64(b"messagE"), mac=b64(mac))["valid"] is False
    r = admin.post(f"/api/v1/keys/{key.name}/generate-data-key", json={})
    assert r.status_code == 409 and r.json()["code"] == "wrong_key_algorithm"
    r = admin.post(f"/api/v1/keys/{key.name}/encrypt", json={"plaintext": b64(b"x")})
    assert r.status_code == 409


def test_sign_and_verify_with_a_key_pair(admin: httpx.Client, services: Services) -> None:
    ctx = system_context("tests")
    pair = services.kmip_objects.create_key_pair(ctx, bits=2048, private_name=unique("signer"), public_name=None,
                                                 activation_date=None)
    private, public = str(pair.private.id), str(pair.public.id)
    r = admin.post(f"/api/v1/keys/{private}/sign", json={"data": b64(b"doc")})
    assert r.status_code == 409 and "pre-active" in r.json()["detail"]
    for uid in (private, public):
        services.kmip_objects.transition(ctx, uid, operation="activate")
    for scheme in ("RSA-PSS", "RSA-PKCS1-v1_5"):
        signature = unb64(post(admin, f"/keys/{private}/sign", data=b64(b"doc"), scheme=scheme, hash="SHA-384")
                          ["signature"])
        key = serialization.load_der_public_key(pair.public.der)
        assert isinstance(key, rsa.RSAPublicKey)
        pad = (padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48) if scheme == "RSA-PSS"
               else padding.PKCS1v15())
        key.verify(signature, b"doc", pad, hashes.SHA384())
        assert post(admin, f"/keys/{public}/verify", data=b64(b"doc"), signature=b64(signature), scheme=scheme,
                    hash="SHA-384") == {"valid": True}
        assert post(admin, f"/keys/{public}/verify", data=b64(b"dog"), signature=b64(signature), scheme=scheme,
                    hash="SHA-384") == {"valid": False}
    # RSA-OAEP: the public key encrypts, the private key decrypts in the token
    sealed = post(admin, f"/keys/{public}/encrypt", plaintext=b64(b"secret"), mode="RSA-OAEP")
    assert unb64(post(admin, f"/keys/{private}/decrypt", ciphertext=sealed["ciphertext"],
                      mode="RSA-OAEP")["plaintext"]) == b"secret"


def test_roles_and_random(actors: dict[str, Actor], admin: httpx.Client) -> None:
    key = post(admin, "/keys", 201, name=unique("roles"))
    auditor = actors["auditor"].client
    r = auditor.post(f"/api/v1/keys/{key['name']}/encrypt", json={"plaintext": b64(b"x")})
    assert r.status_code == 403 and "keys:encrypt" in r.json()["detail"]
    first, second = (unb64(auditor.get("/api/v1/random", params={"bytes": 32}).json()["random"]) for _ in range(2))
    assert len(first) == 32 and first != second
    assert auditor.get("/api/v1/random", params={"bytes": 0}).status_code == 422


def test_ecdsa_with_an_ec_key_pair(admin: httpx.Client, services: Services) -> None:
    ctx = system_context("tests")
    pair = services.kmip_objects.create_key_pair(ctx, bits=384, private_name=unique("ec-signer"), public_name=None,
                                                 activation_date=None, algorithm="EC")
    private, public = str(pair.private.id), str(pair.public.id)
    for uid in (private, public):
        services.kmip_objects.transition(ctx, uid, operation="activate")
    key = serialization.load_der_public_key(pair.public.der)
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp384r1"
    # defaults: ECDSA with the curve's hash (P-384: SHA-384)
    signature = unb64(post(admin, f"/keys/{private}/sign", data=b64(b"doc"))["signature"])
    key.verify(signature, b"doc", ec.ECDSA(hashes.SHA384()))
    assert post(admin, f"/keys/{public}/verify", data=b64(b"doc"), signature=b64(signature)) == {"valid": True}
    signature = unb64(post(admin, f"/keys/{private}/sign", data=b64(b"doc"), scheme="ECDSA",
                           hash="SHA-512")["signature"])
    key.verify(signature, b"doc", ec.ECDSA(hashes.SHA512()))
    assert post(admin, f"/keys/{public}/verify", data=b64(b"dog"), signature=b64(signature),
                hash="SHA-512") == {"valid": False}
    r = admin.post(f"/api/v1/keys/{private}/sign", json={"data": b64(b"doc"), "scheme": "RSA-PSS"})
    assert r.status_code == 400 and "ECDSA only" in r.json()["detail"]
    r = admin.post(f"/api/v1/keys/{public}/encrypt", json={"plaintext": b64(b"x"), "mode": "RSA-OAEP"})
    assert r.status_code == 409 and r.json()["code"] == "usage_not_allowed"
    signs = events(services, "key.sign", private)
    assert [(e.outcome, e.details["mechanism"]) for e in signs] == [
        ("allowed", "ECDSA-SHA-384"), ("allowed", "ECDSA-SHA-512")]
