"""KMIP Destroy of a version still in use (decision 0024): refused with Permission
Denied and the holders in the reason, audited, never shredded; once nothing uses it,
Destroy goes. A client destroying what only it used is its own decision."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from kmip.core import enums
from kmip.pie.exceptions import KmipOperationFailure
from sqlalchemy import select

from keyserver.services import Services
from keyserver.store.models import AuditEvent
from tests.conftest import unique
from tests.kmip.conftest import ClientFiles


def test_destroy_of_a_version_in_use_is_refused_over_kmip(kmip: Any, admin: httpx.Client,
                                                           services: Services) -> None:
    name = unique("inuse")
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
    kmip.activate(uid)
    key = kmip.get(uid)  # this client holds it too: that alone would not stop its own Destroy
    assert len(key.value) == 32
    key_id = admin.get(f"/api/v1/keys/{name}").json()["id"]
    r = admin.post(f"/api/v1/keys/{key_id}/generate-data-key", json={})
    assert r.status_code == 200, r.text
    blob = r.json()["ciphertext_blob"]
    kmip.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, uid)
    with pytest.raises(KmipOperationFailure) as e:
        kmip.destroy(uid)
    assert e.value.reason == enums.ResultReason.PERMISSION_DENIED
    assert "object in use" in str(e.value) and "data-key blobs held by applications" in str(e.value)
    services.audit.flush()
    with services.db() as s:
        refused = s.execute(select(AuditEvent.details).where(
            AuditEvent.object_id == str(key_id), AuditEvent.action == "key.destroy",
            AuditEvent.outcome == "denied")).scalars().all()
    assert [d["reason"] for d in refused] == ["version_in_use"]
    # The key has no Active version to re-encrypt under: the application discards its blob
    # and the operator says so, retiring the version with an exclusion.
    assert admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": blob}).status_code == 200
    assert admin.post(f"/api/v1/keys/{key_id}/versions/1/retire", json={}).status_code == 201
    base = f"/api/v1/keys/{key_id}/versions/1"
    r = admin.post(f"{base}/retire/exclusions",
                   json={"kind": "data_keys", "holder": "applications", "reason": "blob discarded"})
    assert r.status_code == 201 and r.json()["state"] == "running", r.text
    # The client that got it is a holder the server cannot see into: it is excluded by name.
    clients = [h for h in admin.get(f"{base}/inventory").json()["holders"] if h["kind"] == "kmip_client"]
    assert [h["state"] for h in clients] == ["in_use"]
    r = admin.post(f"{base}/retire/exclusions",
                   json={"kind": "kmip_client", "holder": clients[0]["holder"], "reason": "destroys it itself"})
    assert r.status_code == 201 and r.json()["state"] == "complete", r.text
    kmip.destroy(uid)
    attrs = {a.attribute_name.value: a.attribute_value for a in kmip.get_attributes(uid)[1]}
    assert attrs["State"].value == enums.State.DESTROYED



def test_a_client_that_used_only_version_2_holds_version_2_not_1(kmip: Any, admin: httpx.Client,
                                                                 officer_files: ClientFiles,
                                                                 services: Services) -> None:
    """Who used which version is counted per version (audit_version_usage): a client that
    made the key, re-keyed it and encrypted under the replacement holds version 2 only;
    for version 1 it is listed, clear (it did use the key, never that version)."""
    name = unique("v2only")
    old = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
    kmip.activate(old)
    new = kmip.rekey(uid=old)
    gcm = {"block_cipher_mode": enums.BlockCipherMode.GCM}
    data, iv = kmip.encrypt(b"under v2", uid=new, cryptographic_parameters=gcm)
    assert kmip.decrypt(data, uid=new, cryptographic_parameters=gcm, iv_counter_nonce=iv) == b"under v2"
    services.audit.flush()
    key_id = admin.get(f"/api/v1/keys/{name}").json()["id"]

    def client_state(version: int) -> list[tuple[str, str]]:
        r = admin.get(f"/api/v1/keys/{key_id}/versions/{version}/inventory")
        assert r.status_code == 200, r.text
        return [(h["holder"], h["state"]) for h in r.json()["holders"] if h["kind"] == "kmip_client"]

    assert client_state(2) == [(officer_files.name, "in_use")]
    assert client_state(1) == [(officer_files.name, "clear")]
