"""Envelope encryption: generate, decrypt and re-encrypt data keys."""

from __future__ import annotations

import base64
from typing import Any

import httpx

from keyserver.core.datakeys import HEADER


def gen(client: httpx.Client, key: str, **body: Any) -> dict[str, Any]:
    r = client.post(f"/api/v1/keys/{key}/generate-data-key", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_generate_and_decrypt_roundtrip(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    dk = gen(admin, new_key["name"], context={"bucket": "invoices"})
    plaintext = base64.b64decode(dk["plaintext"])
    assert len(plaintext) == 32 and dk["key_version"] == 1
    r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": dk["ciphertext_blob"],
                                                     "context": {"bucket": "invoices"}})
    assert r.status_code == 200
    assert base64.b64decode(r.json()["plaintext"]) == plaintext


def test_wrapped_only_and_sizes(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    dk = gen(admin, new_key["name"], include_plaintext=False, number_of_bytes=64)
    assert dk["plaintext"] is None
    r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": dk["ciphertext_blob"]})
    assert len(base64.b64decode(r.json()["plaintext"])) == 64
    bad = admin.post(f"/api/v1/keys/{new_key['name']}/generate-data-key", json={"number_of_bytes": 33})
    assert bad.status_code == 422


def test_wrong_context_or_tampering_is_one_opaque_error(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    dk = gen(admin, new_key["name"], context={"a": "1"})
    blob = bytearray(base64.b64decode(dk["ciphertext_blob"]))
    attempts = [
        {"ciphertext_blob": dk["ciphertext_blob"], "context": {"a": "2"}},
        {"ciphertext_blob": dk["ciphertext_blob"]},
    ]
    flipped = bytearray(blob)
    flipped[-1] ^= 1
    attempts.append({"ciphertext_blob": base64.b64encode(bytes(flipped)).decode(), "context": {"a": "1"}})
    truncated = bytes(blob[:-5])
    attempts.append({"ciphertext_blob": base64.b64encode(truncated).decode(), "context": {"a": "1"}})
    for body in attempts:
        r = admin.post("/api/v1/datakeys/decrypt", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "integrity_failure"
        assert r.json()["detail"] == "the ciphertext blob is invalid, corrupted or not for this context"


def test_blob_moved_to_another_version_fails(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    name = new_key["name"]
    dk = gen(admin, name)
    admin.post(f"/api/v1/keys/{name}/rotate")
    blob = bytearray(base64.b64decode(dk["ciphertext_blob"]))
    blob[21:25] = (2).to_bytes(4, "big")  # claim version 2
    r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": base64.b64encode(bytes(blob)).decode()})
    assert r.status_code == 422 and r.json()["code"] == "integrity_failure"


def test_malformed_blobs(admin: httpx.Client) -> None:
    for raw, code in [(b"short", "invalid_blob"), (b"XXXX" + bytes(60), "invalid_blob"),
                      (b"SRDK\x09" + bytes(60), "invalid_blob")]:
        r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": base64.b64encode(raw).decode()})
        assert r.status_code == 400 and r.json()["code"] == code, r.text
    r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": "%%%"})
    assert r.status_code == 422
    unknown = HEADER.pack(b"SRDK", 1, bytes(16), 1, 1) + bytes(40)
    r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": base64.b64encode(unknown).decode()})
    assert r.status_code == 404


def test_rotation_keeps_old_blobs_readable_and_reencrypt(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    name = new_key["name"]
    dk = gen(admin, name, context={"f": "x"})
    admin.post(f"/api/v1/keys/{name}/rotate")
    r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": dk["ciphertext_blob"], "context": {"f": "x"}})
    assert r.status_code == 200 and r.json()["plaintext"] == dk["plaintext"]
    r = admin.post("/api/v1/datakeys/reencrypt", json={"ciphertext_blob": dk["ciphertext_blob"], "context": {"f": "x"}})
    assert r.status_code == 200 and r.json()["key_version"] == 2 and r.json()["plaintext"] is None
    r2 = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": r.json()["ciphertext_blob"],
                                                      "context": {"f": "x"}})
    assert r2.json()["plaintext"] == dk["plaintext"] and r2.json()["key_version"] == 2


def test_states_gate_data_keys(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    name = new_key["name"]
    dk = gen(admin, name)
    admin.post(f"/api/v1/keys/{name}/revoke", json={"reason": "superseded"})
    r = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={})
    assert r.status_code == 409 and "no active version" in r.json()["detail"]
    # Deactivated still decrypts (KMIP: process, not protect).
    assert admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": dk["ciphertext_blob"]}).status_code == 200
    assert admin.post(f"/api/v1/keys/{name}/destroy", json={}).json()["code"] == "version_in_use"  # dk holds it
    assert admin.post(f"/api/v1/keys/{name}/destroy", json={"shred": True}).status_code == 200
    r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": dk["ciphertext_blob"]})
    assert r.status_code == 409 and "destroyed" in r.json()["detail"]


def test_compromised_key_refuses_decrypt(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    dk = gen(admin, new_key["name"])
    admin.post(f"/api/v1/keys/{new_key['name']}/revoke", json={"reason": "key-compromise"})
    r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": dk["ciphertext_blob"]})
    assert r.status_code == 409 and "compromised" in r.json()["detail"]
