"""Names, client attributes and audit of every KMIP operation: PyKMIP's client at its
defaults (or the codec where it has no call) against the real listener, token and store."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from kmip.core import enums
from kmip.core.exceptions import OperationFailure
from kmip.core.factories.attributes import AttributeFactory
from kmip.pie import objects as pie
from kmip.pie.exceptions import KmipOperationFailure
from sqlalchemy import select

from keyserver.kmip.listener import KmipListener
from keyserver.kmip.payloads import AddAttributeRequestPayload
from keyserver.services import Services
from keyserver.store.models import AuditEvent
from tests.conftest import unique
from tests.kmip.conftest import ClientFiles, make_client
from tests.kmip.raw import connect, request, roundtrip

A = enums.AttributeType
_attrs = AttributeFactory()


def attr(name: Any, value: Any, index: int | None = None) -> Any:
    return _attrs.create_attribute(name, value, index=index)


def attrs_of(kmip: Any, uid: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for a in kmip.get_attributes(uid)[1]:
        out.setdefault(a.attribute_name.value, []).append(a.attribute_value)
    return out


def reason(call: Callable[[], Any]) -> Any:
    # ProxyKmipClient raises one class or the other depending on the operation
    with pytest.raises((KmipOperationFailure, OperationFailure)) as e:
        call()
    return e.value.reason


def audited(services: Services, *, action: str, since: int) -> list[AuditEvent]:
    services.audit.flush()
    with services.db() as s:
        return list(s.execute(select(AuditEvent).where(AuditEvent.action == action, AuditEvent.seq > since)
                              .order_by(AuditEvent.seq)).scalars())


def last_seq(services: Services) -> int:
    services.audit.flush()
    with services.db() as s:
        return int(s.execute(select(AuditEvent.seq).order_by(AuditEvent.seq.desc()).limit(1)).scalar() or 0)


def test_one_name_rule_for_every_object_type_and_default_names_register_twice(kmip: Any) -> None:
    """PyKMIP's client names what it registers "Symmetric Key", "Secret Data", ...: two
    unnamed registrations of each work, and a name with spaces is a name everywhere."""
    uids = [kmip.register(pie.SymmetricKey(enums.CryptographicAlgorithm.AES, 256, os.urandom(32)))
            for _ in range(2)]
    uids += [kmip.register(pie.SecretData(b"hunter2", enums.SecretDataType.PASSWORD)) for _ in range(2)]
    assert len(set(uids)) == 4
    assert attrs_of(kmip, uids[0])["Name"][0].name_value.value == "Symmetric Key"
    spaced = unique("quarterly payroll key")
    key = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=spaced)
    secret = kmip.register(pie.SecretData(b"pw", enums.SecretDataType.PASSWORD, name=spaced))
    assert set(kmip.locate(attributes=[attr(A.NAME, spaced)])) == {key, secret}
    # ("" cannot be sent: PyKMIP's client leaves an empty name out)
    # (nor anything outside ASCII: its codec writes one byte per character)
    for bad in ("   ", "tab\there", str(uuid.uuid4()), "x" * 129):
        assert reason(lambda bad=bad: kmip.create(enums.CryptographicAlgorithm.AES, 256, name=bad)) \
            == enums.ResultReason.INVALID_FIELD, bad
        assert reason(lambda bad=bad: kmip.register(pie.SecretData(b"pw", enums.SecretDataType.PASSWORD,
                                                                   name=bad))) == enums.ResultReason.INVALID_FIELD


def test_rest_names_stay_one_key_each_and_are_released_on_destroy(admin: httpx.Client, kmip: Any) -> None:
    name = unique("shared name")
    first = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
    second = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)  # a KMIP Name is a label
    # REST refuses a second live key of that name; by name it means the newest live one
    r = admin.post("/api/v1/keys", json={"name": name})
    assert r.status_code == 409 and r.json()["code"] == "key_exists"
    newest = admin.get(f"/api/v1/keys/{name}").json()
    assert newest["versions"][0]["state"] == "pre-active"
    for uid in (first, second):
        kmip.destroy(uid)  # Pre-Active: no revocation needed
    created = admin.post("/api/v1/keys", json={"name": name})
    assert created.status_code == 201, created.text
    assert admin.get(f"/api/v1/keys/{name}").json()["id"] == created.json()["id"]


def test_client_attributes_on_every_object_type_and_locate_by_them(
        kmip: Any, officer_files: ClientFiles, kmip_listener: KmipListener) -> None:
    group = unique("group")
    key = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("grouped"))
    secret = kmip.register(pie.SecretData(b"pw", enums.SecretDataType.PASSWORD))
    _, private = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)

    def add(uid: str, a: Any) -> Any:
        return enums.Operation.ADD_ATTRIBUTE, AddAttributeRequestPayload(unique_identifier=uid, attribute=a)

    with connect(officer_files, kmip_listener.port) as conn:
        r = roundtrip(conn, request([
            add(key, attr(A.CONTACT_INFORMATION, "dba-oncall@example.com")),
            add(key, attr(A.OBJECT_GROUP, group)), add(key, attr(A.OBJECT_GROUP, "second")),
            add(secret, attr(A.OBJECT_GROUP, group)), add(private, attr(A.OBJECT_GROUP, group)),
            add(private, attr(A.APPLICATION_SPECIFIC_INFORMATION,
                              {"application_namespace": "ssl", "application_data": "www.example.com"})),
            add(key, attr(A.CONTACT_INFORMATION, "twice")),  # single-instance: refused
            add(key, attr(A.STATE, enums.State.ACTIVE)),  # the server's: refused
        ], continue_on_error=True))
    results = [(i.result_status.value, i.result_reason.value if i.result_reason else None) for i in r.batch_items]
    ok = (enums.ResultStatus.SUCCESS, None)
    assert results[:6] == [ok] * 6
    assert results[6] == (enums.ResultStatus.OPERATION_FAILED, enums.ResultReason.ILLEGAL_OPERATION)
    assert results[7] == (enums.ResultStatus.OPERATION_FAILED, enums.ResultReason.PERMISSION_DENIED)

    got = attrs_of(kmip, key)
    assert [g.value for g in got["Object Group"]] == [group, "second"]
    assert got["Contact Information"][0].value == "dba-oncall@example.com"
    assert attrs_of(kmip, private)["Application Specific Information"][0].application_data \
        == "www.example.com"
    assert set(kmip.locate(attributes=[attr(A.OBJECT_GROUP, group)])) == {key, secret, private}
    assert kmip.locate(attributes=[attr(A.OBJECT_GROUP, "second")]) == [key]

    kmip.modify_attribute(key, attribute=attr(A.OBJECT_GROUP, "renamed", index=1))
    kmip.modify_attribute(key, attribute=attr(A.CONTACT_INFORMATION, "sec@example.com"))
    kmip.delete_attribute(secret, attribute_name="Object Group", attribute_index=0)
    got = attrs_of(kmip, key)
    assert [g.value for g in got["Object Group"]] == [group, "renamed"]
    assert got["Contact Information"][0].value == "sec@example.com"
    assert "Object Group" not in attrs_of(kmip, secret)
    assert set(kmip.locate(attributes=[attr(A.OBJECT_GROUP, group)])) == {key, private}
    assert reason(lambda: kmip.delete_attribute(secret, attribute_name="Object Group", attribute_index=0)) \
        == enums.ResultReason.ITEM_NOT_FOUND
    # a name is a client attribute too, on every type; a managed key always keeps one
    kmip.modify_attribute(secret, attribute=attr(A.NAME, "payroll db password"))
    assert kmip.locate(attributes=[attr(A.NAME, "payroll db password")]) == [secret]
    assert reason(lambda: kmip.delete_attribute(key, attribute_name="Name", attribute_index=0)) \
        == enums.ResultReason.ILLEGAL_OPERATION


def test_get_attributes_naming_one_attribute_twice_is_refused(
        kmip: Any, officer_files: ClientFiles, kmip_listener: KmipListener) -> None:
    """PyKMIP's client drops a repeated name itself; a raw request may repeat one."""
    from kmip.core import primitives
    from kmip.core.messages import payloads

    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256)
    twice = payloads.GetAttributesRequestPayload(unique_identifier=uid, attribute_names=["State"])
    twice._attribute_names.append(primitives.TextString(value="State", tag=enums.Tags.ATTRIBUTE_NAME))
    with connect(officer_files, kmip_listener.port) as conn:
        [item] = roundtrip(conn, request([(enums.Operation.GET_ATTRIBUTES, twice)])).batch_items
    assert item.result_reason.value == enums.ResultReason.INVALID_MESSAGE  # §4.12's error table
    assert "named twice" in item.result_message.value
    assert [a.attribute_name.value for a in kmip.get_attributes(uid, ["State", "Name"])[1]] == ["State", "Name"]


def test_rekey_of_a_pre_active_key_gives_a_pre_active_replacement(kmip: Any) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256)
    new = kmip.rekey(uid=uid)
    assert new != uid
    assert attrs_of(kmip, new)["State"][0].value == enums.State.PRE_ACTIVE
    assert attrs_of(kmip, uid)["State"][0].value == enums.State.DEACTIVATED
    kmip.activate(new)
    assert len(kmip.get(new).value) == 32


def test_reads_are_audited_under_one_identity_with_the_client_as_actor(
        kmip: Any, services: Services, officer_files: ClientFiles, kmip_files: Callable[..., ClientFiles],
        kmip_listener: KmipListener) -> None:
    name = unique("audited")
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
    key_id = attrs_of(kmip, uid)["x-strongroom-key-id"][0].value
    since = last_seq(services)
    kmip.get_attributes(uid)
    kmip.get_attribute_list(uid)
    kmip.locate(attributes=[attr(A.NAME, name)])
    kmip.get(uid)
    for action in ("kmip.get_attributes", "kmip.get_attribute_list"):
        [event] = audited(services, action=action, since=since)
        assert (event.object_type, event.object_id) == ("key", key_id)
        assert event.details["kmip_uid"] == uid and event.details["version"] == 1
        assert event.actor == officer_files.name or officer_files.name in event.actor
    [located] = audited(services, action="kmip.locate", since=since)
    assert located.details == {"criteria": {"name": name}, "found": 1}
    [export] = audited(services, action="key.export", since=since)
    assert (export.object_type, export.object_id) == ("key", key_id) and export.details["kmip_uid"] == uid
    # a refused export is recorded under the same identity
    auditor = make_client(kmip_files("auditor", officer_files.group), kmip_listener.port)  # sees it, may not take it
    auditor.open()
    try:
        assert reason(lambda: auditor.get(uid)) == enums.ResultReason.PERMISSION_DENIED
    finally:
        auditor.close()
    denied = [e for e in audited(services, action="key.export", since=since) if e.outcome == "denied"]
    assert [(e.object_type, e.object_id) for e in denied] == [("key", key_id)]


def test_opaque_objects_register_get_locate_destroy(kmip: Any, services: Services) -> None:
    data = b"\x00opaque blob\xff" * 50
    uid = kmip.register(pie.OpaqueObject(data, enums.OpaqueDataType.NONE))
    got = kmip.get(uid)
    assert isinstance(got, pie.OpaqueObject) and got.value == data
    assert uid in kmip.locate(attributes=[attr(A.OBJECT_TYPE, enums.ObjectType.OPAQUE_DATA)])
    assert attrs_of(kmip, uid)["Object Type"][0].value == enums.ObjectType.OPAQUE_DATA
    since = last_seq(services)
    kmip.get(uid)
    [export] = audited(services, action="key.export", since=since)
    assert (export.object_type, export.object_id) == ("opaque_object", uid)
    kmip.destroy(uid)  # Pre-Active: destroyed without a revocation
    assert reason(lambda: kmip.get(uid)) == enums.ResultReason.ILLEGAL_OPERATION
    assert uid not in kmip.locate(attributes=[attr(A.OBJECT_TYPE, enums.ObjectType.OPAQUE_DATA)])


def test_a_clients_usage_mask_is_kept_narrowed_to_what_the_kind_can_do(kmip: Any) -> None:
    M = enums.CryptographicUsageMask

    def mask(uid: str) -> int:
        return int(attrs_of(kmip, uid)["Cryptographic Usage Mask"][0].value)  # one Integer: the bits

    narrowed = kmip.register(pie.SymmetricKey(enums.CryptographicAlgorithm.AES, 256, os.urandom(32),
                                              masks=[M.ENCRYPT]))
    assert mask(narrowed) == M.ENCRYPT.value
    # Sign makes no sense for AES: dropped; Wrap Key kept (the client adds Encrypt|Decrypt itself)
    mixed = kmip.create(enums.CryptographicAlgorithm.AES, 256, cryptographic_usage_mask=[M.SIGN, M.WRAP_KEY])
    assert mask(mixed) == M.ENCRYPT.value | M.DECRYPT.value | M.WRAP_KEY.value
    # the halves of a pair: each its own template's mask over the common one
    public, private = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048, public_usage_mask=[M.VERIFY],
                                           private_usage_mask=[M.SIGN])
    assert (mask(public), mask(private)) == (M.VERIFY.value, M.SIGN.value)
    # Secret Data: no operation here uses it, so its mask is the client's record, kept as
    # sent (Synology DSM: Verify); an empty mask (libmongocrypt) means the kind's, Derive Key
    secret = kmip.register(pie.SecretData(b"pw", enums.SecretDataType.PASSWORD, masks=[M.SIGN]))
    assert mask(secret) == M.SIGN.value
    # a mask that leaves nothing a key's kind can do: the kind's uses
    hmac_key = kmip.create(enums.CryptographicAlgorithm.HMAC_SHA256, 256, cryptographic_usage_mask=[M.SIGN])
    assert mask(hmac_key) == M.MAC_GENERATE.value | M.MAC_VERIFY.value
