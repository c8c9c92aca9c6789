"""KMIP and REST are two doors to the same keys; wrapping; batches; Query."""

from __future__ import annotations

import os
import uuid
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from kmip.core import enums
from kmip.core.factories.attributes import AttributeFactory
from kmip.core.messages import payloads
from kmip.pie import objects as pie
from kmip.pie.exceptions import KmipOperationFailure
from sqlalchemy import select

from keyserver.kmip.attributes import X_REPLACED, X_REPLACEMENT
from keyserver.kmip.listener import KmipListener
from keyserver.services import Services
from keyserver.store.models import KeyVersion
from tests.conftest import unique
from tests.kmip.conftest import ClientFiles
from tests.kmip.raw import connect, request, roundtrip

_attrs = AttributeFactory()


def attrs_of(kmip: Any, uid: str) -> dict[str, Any]:
    return {a.attribute_name.value: a.attribute_value for a in kmip.get_attributes(uid)[1]}


def name_attr(name: str) -> Any:
    return _attrs.create_attribute(enums.AttributeType.NAME, name)


def test_rekey_links_old_and_new(kmip: Any, admin: httpx.Client) -> None:
    name = unique("rekey")
    old = kmip.create(enums.CryptographicAlgorithm.AES, 128, name=name)
    kmip.activate(old)
    new = kmip.rekey(uid=old)
    assert new != old
    new_attrs, old_attrs = attrs_of(kmip, new), attrs_of(kmip, old)
    assert new_attrs[X_REPLACED].value == old and old_attrs[X_REPLACEMENT].value == new
    assert new_attrs["State"].value == enums.State.ACTIVE
    assert old_attrs["State"].value == enums.State.DEACTIVATED
    assert new_attrs["Cryptographic Length"].value == 128  # a rotation keeps the length
    assert kmip.locate(attributes=[name_attr(name)]) == [new, old]  # newest first
    body = admin.get(f"/api/v1/keys/{name}").json()
    assert [v["version"] for v in body["versions"]] == [1, 2] and body["length_bits"] == 128


def test_kmip_key_visible_over_rest_and_rest_key_over_kmip(kmip: Any, admin: httpx.Client,
                                                           officer_files: ClientFiles) -> None:
    name = unique("fromkmip")
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
    r = admin.get(f"/api/v1/keys/{name}")
    assert r.status_code == 200
    assert r.json()["state"] == "pre-active" and r.json()["owner"] == f"kmip:{officer_files.name}"
    assert admin.post(f"/api/v1/keys/{name}/activate").status_code == 200
    assert attrs_of(kmip, uid)["State"].value == enums.State.ACTIVE

    # A REST key is seen by the KMIP clients of its group (KMIP tenancy).
    rest = admin.post("/api/v1/keys", json={"name": unique("fromrest"), "kmip_group": officer_files.group}).json()
    [found] = kmip.locate(attributes=[name_attr(rest["name"])])
    assert attrs_of(kmip, found)["x-strongroom-key-id"].value == rest["id"]
    assert len(kmip.get(found).value) == 32
    kmip.revoke(enums.RevocationReasonCode.KEY_COMPROMISE, found)
    assert admin.get(f"/api/v1/keys/{rest['id']}").json()["state"] == "compromised"


def test_get_wrapped_under_registered_rsa_key(kmip: Any) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = private.public_key().public_bytes(serialization.Encoding.DER,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    wrap_uid = kmip.register(pie.PublicKey(enums.CryptographicAlgorithm.RSA, 2048, der,
                                           enums.KeyFormatType.X_509, name=unique("wrapper")))
    kmip.activate(wrap_uid)  # registered objects start Pre-Active; wrapping needs an Active key
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("wrapped"))
    kmip.activate(uid)
    wrapped = kmip.get(uid, key_wrapping_specification={
        "wrapping_method": enums.WrappingMethod.ENCRYPT,
        "encryption_key_information": {
            "unique_identifier": wrap_uid,
            "cryptographic_parameters": {"padding_method": enums.PaddingMethod.OAEP,
                                         "hashing_algorithm": enums.HashingAlgorithm.SHA_1}},
        "encoding_option": enums.EncodingOption.NO_ENCODING,
    })
    assert wrapped.key_wrapping_data["wrapping_method"] == enums.WrappingMethod.ENCRYPT
    oaep = padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None)  # noqa: S303 - the token's OAEP
    assert private.decrypt(wrapped.value, oaep) == kmip.get(uid).value
    # The public key itself is a KMIP object too.
    assert attrs_of(kmip, wrap_uid)["Object Type"].value == enums.ObjectType.PUBLIC_KEY


def test_get_wrapped_under_an_aes_key(kmip: Any) -> None:
    """AES Key Wrap with Padding (RFC 5649) inside the HSM; checked with `cryptography`."""
    from cryptography.hazmat.primitives.keywrap import aes_key_unwrap_with_padding

    wrapping = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("kek"))
    target = kmip.create(enums.CryptographicAlgorithm.AES, 192, name=unique("target"))
    spec = {"wrapping_method": enums.WrappingMethod.ENCRYPT,
            "encryption_key_information": {"unique_identifier": wrapping}}
    kmip.activate(target)
    with pytest.raises(KmipOperationFailure) as e:  # the wrapping key is still pre-active
        kmip.get(target, key_wrapping_specification=spec)
    assert e.value.reason == enums.ResultReason.ILLEGAL_OPERATION
    kmip.activate(wrapping)
    wrapped = kmip.get(target, key_wrapping_specification=spec)
    params = wrapped.key_wrapping_data["encryption_key_information"]["cryptographic_parameters"]
    assert params["block_cipher_mode"] == enums.BlockCipherMode.AES_KEY_WRAP_PADDING
    assert aes_key_unwrap_with_padding(kmip.get(wrapping).value, wrapped.value) == kmip.get(target).value
    spec["encryption_key_information"]["cryptographic_parameters"] = {
        "block_cipher_mode": enums.BlockCipherMode.NIST_KEY_WRAP}
    with pytest.raises(KmipOperationFailure) as e:  # RFC 3394 without padding is not what we do
        kmip.get(target, key_wrapping_specification=spec)
    assert e.value.reason == enums.ResultReason.FEATURE_NOT_SUPPORTED


def test_batch_with_continue_and_stop(officer_files: ClientFiles, kmip_listener: KmipListener) -> None:
    create = payloads.CreateRequestPayload(
        object_type=enums.ObjectType.SYMMETRIC_KEY,
        template_attribute=_template(unique("batch")))
    missing = payloads.GetAttributesRequestPayload(unique_identifier="00000000-0000-0000-0000-000000000000")
    query = payloads.QueryRequestPayload(query_functions=[enums.QueryFunction.QUERY_SERVER_INFORMATION])
    with connect(officer_files, kmip_listener.port) as conn:
        r = roundtrip(conn, request([(enums.Operation.CREATE, create), (enums.Operation.GET_ATTRIBUTES, missing),
                                     (enums.Operation.QUERY, query)], continue_on_error=True))
        status = [i.result_status.value for i in r.batch_items]
        assert status == [enums.ResultStatus.SUCCESS, enums.ResultStatus.OPERATION_FAILED,
                          enums.ResultStatus.SUCCESS]
        assert r.batch_items[1].result_reason.value == enums.ResultReason.ITEM_NOT_FOUND
        assert [bytes(i.unique_batch_item_id.value) for i in r.batch_items] == [b"item-0", b"item-1", b"item-2"]
        assert r.batch_items[2].response_payload.vendor_identification == "Strongroom"
        r = roundtrip(conn, request([(enums.Operation.GET_ATTRIBUTES, missing), (enums.Operation.QUERY, query)]))
        assert len(r.batch_items) == 1  # Stop: the default


def _template(name: str) -> Any:
    from kmip.core.objects import TemplateAttribute

    return TemplateAttribute(attributes=[
        _attrs.create_attribute(enums.AttributeType.CRYPTOGRAPHIC_ALGORITHM, enums.CryptographicAlgorithm.AES),
        _attrs.create_attribute(enums.AttributeType.CRYPTOGRAPHIC_LENGTH, 256),
        _attrs.create_attribute(enums.AttributeType.NAME, name)])


def test_query_and_discover_versions(kmip: Any) -> None:
    result = kmip.proxy.query(query_functions=[enums.QueryFunction.QUERY_OPERATIONS,
                                               enums.QueryFunction.QUERY_OBJECTS])
    ops = {enums.Operation(o.value) for o in result.operations}
    assert {enums.Operation.CREATE, enums.Operation.GET, enums.Operation.REKEY, enums.Operation.LOCATE} <= ops
    assert {enums.Operation.ENCRYPT, enums.Operation.SIGN, enums.Operation.MAC_VERIFY,
            enums.Operation.RNG_RETRIEVE} <= ops
    assert enums.Operation.DERIVE_KEY not in ops
    versions = kmip.proxy.discover_versions().protocol_versions
    assert [(v.major, v.minor) for v in versions][:2] == [(1, 4), (1, 3)]


def test_locate_filters_and_paging(kmip: Any) -> None:
    name = unique("page")
    first = kmip.create(enums.CryptographicAlgorithm.AES, 192, name=name)
    kmip.activate(first)
    second = kmip.rekey(uid=first)
    third = kmip.rekey(uid=second)
    assert kmip.locate(attributes=[name_attr(name)]) == [third, second, first]
    assert kmip.locate(attributes=[name_attr(name)], maximum_items=1, offset_items=1) == [second]
    state = _attrs.create_attribute(enums.AttributeType.STATE, enums.State.ACTIVE)
    assert kmip.locate(attributes=[name_attr(name), state]) == [third]
    length = _attrs.create_attribute(enums.AttributeType.CRYPTOGRAPHIC_LENGTH, 128)
    assert kmip.locate(attributes=[name_attr(name), length]) == []


def test_operations_are_audited_with_the_client_identity(kmip: Any, services: Services,
                                                         admin: httpx.Client, officer_files: ClientFiles) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("audited"))
    kmip.activate(uid)
    kmip.get(uid)
    services.audit.flush()
    events = admin.get("/api/v1/audit/events", params={"actor": f"kmip:{officer_files.name}", "limit": 500}).json()
    actions = {e["action"] for e in events["items"]}
    assert {"key.create", "key.activate", "key.export"} <= actions
    export = next(e for e in events["items"] if e["action"] == "key.export")
    assert export["details"]["plaintext"] is True and export["actor_type"] == "host"


def test_register_symmetric_key_becomes_a_managed_key(kmip: Any, admin: httpx.Client, services: Services) -> None:
    material = os.urandom(24)
    name = unique("registered")
    uid = kmip.register(pie.SymmetricKey(enums.CryptographicAlgorithm.AES, 192, material, name=name))
    kmip.activate(uid)
    assert kmip.get(uid).value == material
    body = admin.get(f"/api/v1/keys/{name}").json()
    assert body["length_bits"] == 192 and body["state"] == "active"
    with services.db() as s:  # stored wrapped under the KEK, never in plaintext
        blob = s.execute(select(KeyVersion.wrapped_key).where(KeyVersion.id == uuid.UUID(uid))).scalar_one()
    assert blob is not None and material not in blob


def test_custom_attributes_are_key_tags(kmip: Any, admin: httpx.Client, officer_files: ClientFiles,
                                        kmip_listener: KmipListener) -> None:
    name = unique("tagged")
    key = admin.post("/api/v1/keys", json={"name": name, "tags": {"env": "test", "team": "a"},
                                           "kmip_group": officer_files.group}).json()
    [uid] = kmip.locate(attributes=[name_attr(name)])
    assert attrs_of(kmip, uid)["x-env"].value == "test"
    modify = payloads.ModifyAttributeRequestPayload(
        unique_identifier=uid, attribute=_attrs.create_attribute("x-env", "production"))
    delete = payloads.DeleteAttributeRequestPayload(unique_identifier=uid, attribute_name="x-team")
    server_owned = payloads.ModifyAttributeRequestPayload(
        unique_identifier=uid, attribute=_attrs.create_attribute("x-strongroom-key-id", "forged"))
    with connect(officer_files, kmip_listener.port) as conn:
        r = roundtrip(conn, request([(enums.Operation.MODIFY_ATTRIBUTE, modify),
                                     (enums.Operation.DELETE_ATTRIBUTE, delete),
                                     (enums.Operation.MODIFY_ATTRIBUTE, server_owned)], continue_on_error=True))
    assert [i.result_status.value for i in r.batch_items][:2] == [enums.ResultStatus.SUCCESS] * 2
    assert r.batch_items[1].response_payload.attribute.attribute_value.value == "a"
    assert r.batch_items[2].result_reason.value == enums.ResultReason.PERMISSION_DENIED
    assert admin.get(f"/api/v1/keys/{key['id']}").json()["tags"] == {"env": "production"}
