"""Issue 28's three fixes, on the wire: every multi-instance attribute GetAttributes
returns carries its Attribute Index (KMIP 1.4 §2.1.1: Attribute Name, Attribute Index,
Attribute Value); Locate by Unique Identifier (Symmetric Key Foundry); an IV or tag of a
length the token does not take is refused with Invalid Field naming the lengths served,
before the token sees it."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from kmip.core import enums
from kmip.core.attributes import CryptographicParameters
from kmip.core.factories.attributes import AttributeFactory
from kmip.core.messages import contents, messages, payloads
from kmip.core.utils import BytearrayStream
from kmip.pie.exceptions import KmipOperationFailure

from keyserver.kmip import attributes as server_attributes
from keyserver.kmip.cryptoparams import Cipher, check_lengths
from keyserver.kmip.errors import KmipFailure
from keyserver.kmip.listener import KmipListener
from keyserver.services import Services
from tests.conftest import unique
from tests.kmip import raw
from tests.kmip.conftest import ClientFiles
from tests.kmip.test_honour_or_refuse import refusals

A = enums.AttributeType
F = AttributeFactory()


def _add(kmip: Any, uid: str, name: Any, value: Any) -> None:
    from keyserver.kmip.payloads import AddAttributeRequestPayload
    kmip.proxy.send_request_payload(enums.Operation.ADD_ATTRIBUTE, AddAttributeRequestPayload(
        unique_identifier=uid, attribute=F.create_attribute(name, value)))


def test_every_multi_instance_attribute_carries_its_index_and_single_ones_none(kmip: Any) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("idx"))
    _add(kmip, uid, A.OBJECT_GROUP, "group-a")
    _add(kmip, uid, A.OBJECT_GROUP, "group-b")
    _add(kmip, uid, "x-site", "lab")
    _, attrs = kmip.get_attributes(uid)
    seen: dict[str, list[int | None]] = {}
    for attr in attrs:
        index = attr.attribute_index.value if attr.attribute_index is not None else None
        seen.setdefault(str(attr.attribute_name.value), []).append(index)
    assert seen[A.NAME.value] == [0]
    assert seen[A.OBJECT_GROUP.value] == [0, 1]
    assert seen["x-site"] == [0]
    assert seen["x-strongroom-key-id"] == [0]
    for single in (A.STATE.value, A.UNIQUE_IDENTIFIER.value, A.CRYPTOGRAPHIC_LENGTH.value,
                   A.CRYPTOGRAPHIC_USAGE_MASK.value):
        assert seen[single] == [None], single
    # asked for by name alone, as vSphere does
    _, named = kmip.get_attributes(uid, [A.NAME.value, A.STATE.value])
    assert [(str(a.attribute_name.value), a.attribute_index.value if a.attribute_index else None)
            for a in named] == [(A.NAME.value, 0), (A.STATE.value, None)]


def test_build_indexes_names_of_every_object_kind() -> None:
    built = server_attributes.build({A.NAME.value: "n", A.STATE.value: enums.State.ACTIVE, "x-a": "b"})
    assert [a.attribute_index.value if a.attribute_index else None for a in built] == [0, None, 0]


def test_locate_by_unique_identifier_returns_that_object_if_it_meets_the_rest(kmip: Any) -> None:
    name = unique("by-uid")
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
    other = kmip.create(enums.CryptographicAlgorithm.AES, 128, name=name)
    by_uid = F.create_attribute(A.UNIQUE_IDENTIFIER, uid)
    assert kmip.locate(attributes=[by_uid]) == [uid]
    assert kmip.locate(attributes=[by_uid, F.create_attribute(A.NAME, name)]) == [uid]
    assert kmip.locate(attributes=[by_uid, F.create_attribute(A.CRYPTOGRAPHIC_LENGTH, 128)]) == []
    assert kmip.locate(attributes=[F.create_attribute(A.UNIQUE_IDENTIFIER, other),
                                   F.create_attribute(A.OBJECT_TYPE, enums.ObjectType.SECRET_DATA)]) == []
    assert kmip.locate(attributes=[F.create_attribute(A.UNIQUE_IDENTIFIER, str(uuid.uuid4()))]) == []
    assert kmip.locate(attributes=[F.create_attribute(A.UNIQUE_IDENTIFIER, "not-a-uuid")]) == []
    # other kinds: a secret and a key pair's halves
    secret = kmip.register(_secret())
    kmip.activate(secret)
    assert kmip.locate(attributes=[F.create_attribute(A.UNIQUE_IDENTIFIER, secret)]) == [secret]
    public, private = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)
    for half in (public, private):
        assert kmip.locate(attributes=[F.create_attribute(A.UNIQUE_IDENTIFIER, half)]) == [half]
    # destroyed: found only by asking for its state, like every Locate
    kmip.destroy(other)
    assert kmip.locate(attributes=[F.create_attribute(A.UNIQUE_IDENTIFIER, other)]) == []
    assert kmip.locate(attributes=[F.create_attribute(A.UNIQUE_IDENTIFIER, other),
                                   F.create_attribute(A.STATE, enums.State.DESTROYED)]) == [other]


def _secret() -> Any:
    from kmip.pie.objects import SecretData
    return SecretData(os.urandom(32), enums.SecretDataType.PASSWORD)


@pytest.mark.parametrize("size", [8, 16, 0])
def test_a_gcm_iv_of_another_length_is_invalid_field_naming_the_length(
        kmip: Any, size: int, officer_files: ClientFiles, services: Services) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("iv"))
    kmip.activate(uid)
    gcm = {"block_cipher_mode": enums.BlockCipherMode.GCM}
    with pytest.raises(KmipOperationFailure) as e:
        kmip.encrypt(b"data", uid=uid, cryptographic_parameters=gcm, iv_counter_nonce=b"\x01" * size)
    assert e.value.reason == enums.ResultReason.INVALID_FIELD
    assert f"is {size} bytes" in e.value.message and "12 bytes" in e.value.message
    # the refusal is audited, with the reason and message the client got
    [record] = refusals(services, f"kmip:{officer_files.name}", "kmip.encrypt")[-1:]
    assert record.details["result_reason"] == "INVALID_FIELD" and f"is {size} bytes" in record.details["message"]
    with pytest.raises(KmipOperationFailure) as e:
        kmip.decrypt(b"d" * 32, uid=uid, cryptographic_parameters=gcm, iv_counter_nonce=b"\x01" * size)
    assert e.value.reason == enums.ResultReason.INVALID_FIELD and "12 bytes" in e.value.message
    # the 12-byte IV still works, both ways, and the connection is alive
    data, _ = kmip.encrypt(b"data", uid=uid, cryptographic_parameters=gcm, iv_counter_nonce=b"\x01" * 12)
    assert kmip.decrypt(data, uid=uid, cryptographic_parameters=gcm, iv_counter_nonce=b"\x01" * 12) == b"data"


def test_a_cbc_iv_is_one_block(kmip: Any) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("cbc"))
    kmip.activate(uid)
    cbc = {"block_cipher_mode": enums.BlockCipherMode.CBC, "padding_method": enums.PaddingMethod.PKCS5}
    with pytest.raises(KmipOperationFailure) as e:
        kmip.encrypt(b"data", uid=uid, cryptographic_parameters=cbc, iv_counter_nonce=b"\x01" * 12)
    assert e.value.reason == enums.ResultReason.INVALID_FIELD and "16 bytes" in e.value.message


def test_a_tag_of_another_length_is_invalid_field(officer_files: ClientFiles, kmip_listener: KmipListener,
                                                   kmip: Any) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("tag"))
    kmip.activate(uid)
    request = payloads.DecryptRequestPayload(
        unique_identifier=uid, data=b"d" * 16, iv_counter_nonce=b"\x00" * 12,
        cryptographic_parameters=CryptographicParameters(block_cipher_mode=enums.BlockCipherMode.GCM),
        auth_additional_data=b"aad", auth_tag=b"t" * 8)
    with raw.connect(officer_files, kmip_listener.port) as conn:
        item = raw.roundtrip(conn, _request_1_4(enums.Operation.DECRYPT, request)).batch_items[0]
    assert item.result_status.value == enums.ResultStatus.OPERATION_FAILED
    assert item.result_reason.value == enums.ResultReason.INVALID_FIELD
    assert "12 to 16 bytes" in item.result_message.value


def _request_1_4(operation: enums.Operation, payload: Any) -> bytes:
    """raw.request, written as KMIP 1.4 (raw.request writes the 1.0 fields only, which have
    no Authenticated Encryption Tag)."""
    header = messages.RequestHeader(protocol_version=contents.ProtocolVersion(1, 4),
                                    batch_count=contents.BatchCount(1))
    item = messages.RequestBatchItem(operation=contents.Operation(operation), request_payload=payload)
    stream = BytearrayStream()
    messages.RequestMessage(request_header=header, batch_items=[item]).write(
        stream, kmip_version=enums.KMIPVersion.KMIP_1_4)
    return bytes(stream.buffer)


def test_check_lengths_unit() -> None:
    check_lengths(Cipher(mode=None), True, iv=b"x" * 12, tag=b"t" * 16)
    check_lengths(Cipher(mode=None), False, iv=b"x" * 3)  # not an AES key: not an IV rule
    for iv, tag in ((b"x" * 16, None), (b"x" * 12, b"t" * 17)):
        with pytest.raises(KmipFailure) as e:
            check_lengths(Cipher(mode=None), True, iv=iv, tag=tag)
        assert e.value.reason == enums.ResultReason.INVALID_FIELD
