"""KMIP honours every attribute it is given, or refuses the request: dates drive state
and are enforced at each use, Cryptographic Parameters kept on the object are the
defaults of its uses, and attributes this server does not apply are refused with their
reason. Every refusal lands in the audit log. Real listener, real TLS, PyKMIP's
ProxyKmipClient at its defaults (its KMIPProxy where the client cannot say the template)."""

from __future__ import annotations

import os
import struct
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import padding as sym_padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from kmip.core import enums
from kmip.core.factories.attributes import AttributeFactory
from kmip.core.objects import CommonTemplateAttribute, TemplateAttribute
from kmip.pie import objects as pie
from kmip.pie.exceptions import KmipOperationFailure
from kmip.pie.factory import ObjectFactory
from sqlalchemy import select, update

from keyserver.core.principal import system_context
from keyserver.kmip.listener import KmipListener
from keyserver.services import Services
from keyserver.store.models import AuditEvent, KeyVersion, KmipPublicKey, KmipSealedObject
from tests.conftest import unique
from tests.kmip.conftest import ClientFiles, make_client
from tests.kmip.raw import connect, query_request, request, roundtrip

A = enums.AttributeType
R = enums.ResultReason
_attrs = AttributeFactory()
HOUR = 3600


def attr(name: Any, value: Any) -> Any:
    return _attrs.create_attribute(name, value)


def aes_template(*extra: Any, name: str | None = None) -> TemplateAttribute:
    return TemplateAttribute(attributes=[
        attr(A.CRYPTOGRAPHIC_ALGORITHM, enums.CryptographicAlgorithm.AES), attr(A.CRYPTOGRAPHIC_LENGTH, 256),
        attr(A.NAME, name or unique("honour")), *extra])


def failed(result: Any) -> tuple[Any, str]:
    assert result.result_status.value == enums.ResultStatus.OPERATION_FAILED, "expected a refusal"
    return result.result_reason.value, result.result_message.value


def created(result: Any) -> str:
    assert result.result_status.value == enums.ResultStatus.SUCCESS, result.result_message
    return str(result.uuid)


def register_aes(kmip: Any, material: bytes, *extra: Any) -> Any:
    """Register an AES key through the proxy, with a template the client cannot build."""
    secret = ObjectFactory().convert(pie.SymmetricKey(enums.CryptographicAlgorithm.AES, len(material) * 8,
                                                      material))
    return kmip.proxy.register(enums.ObjectType.SYMMETRIC_KEY, TemplateAttribute(attributes=[
        attr(A.NAME, unique("registered")), *extra]), secret)


def state_of(kmip: Any, uid: str) -> Any:
    _, attributes = kmip.get_attributes(uid, [A.STATE.value])
    return attributes[0].attribute_value.value


def reason(call: Callable[[], Any]) -> tuple[Any, str]:
    with pytest.raises(KmipOperationFailure) as e:
        call()
    return e.value.reason, e.value.message


def refusals(services: Services, actor: str, action: str) -> list[AuditEvent]:
    services.audit.flush()
    with services.db() as s:
        return list(s.execute(select(AuditEvent).where(AuditEvent.actor == actor, AuditEvent.action == action,
                                                       AuditEvent.outcome == "denied")
                              .order_by(AuditEvent.seq)).scalars())


# --- dates drive state, and are enforced at each use -------------------------------------------
def test_a_deactivation_date_in_the_past_creates_a_deactivated_key_that_never_encrypts(kmip: Any) -> None:
    now = int(time.time())
    uid = created(kmip.proxy.create(enums.ObjectType.SYMMETRIC_KEY, aes_template(
        attr(A.ACTIVATION_DATE, now - 2 * HOUR), attr(A.DEACTIVATION_DATE, now - HOUR))))
    assert state_of(kmip, uid) == enums.State.DEACTIVATED
    why, message = reason(lambda: kmip.encrypt(b"secret", uid=uid))
    assert why == R.ILLEGAL_OPERATION and "deactivated" in message
    _, attributes = kmip.get_attributes(uid, [A.DEACTIVATION_DATE.value])
    assert attributes[0].attribute_value.value == now - HOUR


def test_a_deactivation_date_before_the_activation_date_is_refused(kmip: Any) -> None:
    now = int(time.time())
    result = kmip.proxy.create(enums.ObjectType.SYMMETRIC_KEY, aes_template(
        attr(A.ACTIVATION_DATE, now + HOUR), attr(A.DEACTIVATION_DATE, now - HOUR)))
    assert failed(result)[0] == R.INVALID_FIELD


def test_a_past_protect_stop_date_stops_encryption_but_not_decryption(kmip: Any) -> None:
    material = os.urandom(32)
    now = int(time.time())
    uid = created(register_aes(kmip, material, attr(A.ACTIVATION_DATE, now - HOUR),
                               attr(A.PROTECT_STOP_DATE, now - 60)))
    assert state_of(kmip, uid) == enums.State.ACTIVE
    why, message = reason(lambda: kmip.encrypt(b"more data", uid=uid))
    assert why == R.ILLEGAL_OPERATION and "Protect Stop Date" in message
    # data protected before the date still decrypts (GCM: the tag follows the data)
    iv = os.urandom(12)
    sealed = AESGCM(material).encrypt(iv, b"older data", None)
    assert kmip.decrypt(sealed, uid=uid, iv_counter_nonce=iv) == b"older data"
    _, attributes = kmip.get_attributes(uid, [A.PROTECT_STOP_DATE.value])
    assert attributes[0].attribute_value.value == now - 60


def test_a_kmip_key_past_its_protect_stop_date_makes_no_data_keys_over_rest(kmip: Any, admin: httpx.Client) -> None:
    """A key made over KMIP is a REST key: the REST paths that protect honour its dates too."""
    now = int(time.time())
    uid = created(register_aes(kmip, os.urandom(32), attr(A.ACTIVATION_DATE, now - HOUR),
                               attr(A.PROTECT_STOP_DATE, now - 60)))
    _, attributes = kmip.get_attributes(uid, ["x-strongroom-key-id"])
    key_id = attributes[0].attribute_value.value
    r = admin.post(f"/api/v1/keys/{key_id}/generate-data-key", json={})
    assert r.status_code == 409 and r.json()["code"] == "illegal_state", r.text
    r = admin.post(f"/api/v1/keys/{key_id}/encrypt", json={"plaintext": "aGVsbG8="})
    assert r.status_code == 409, r.text


def test_a_key_past_its_protect_stop_date_wraps_no_key(kmip: Any) -> None:
    wrapping = created(register_aes(kmip, os.urandom(32), attr(A.ACTIVATION_DATE, int(time.time()) - HOUR),
                                    attr(A.PROTECT_STOP_DATE, int(time.time()) - 60)))
    target = kmip.create(enums.CryptographicAlgorithm.AES, 256)
    spec = {"wrapping_method": enums.WrappingMethod.ENCRYPT,
            "encryption_key_information": {"unique_identifier": wrapping}}
    why, message = reason(lambda: kmip.get(target, key_wrapping_specification=spec))
    assert why == R.ILLEGAL_OPERATION and "Protect Stop Date" in message


def test_a_future_process_start_date_holds_decryption_back(kmip: Any) -> None:
    material = os.urandom(32)
    now = int(time.time())
    uid = created(register_aes(kmip, material, attr(A.ACTIVATION_DATE, now - HOUR),
                               attr(A.PROCESS_START_DATE, now + HOUR)))
    ciphertext, iv = kmip.encrypt(b"for later", uid=uid)  # protecting may start at once
    why, message = reason(lambda: kmip.decrypt(ciphertext, uid=uid, iv_counter_nonce=iv))
    assert why == R.ILLEGAL_OPERATION and "Process Start Date" in message


def test_the_scheduler_activates_and_deactivates_key_pairs_by_their_dates(kmip: Any, services: Services) -> None:
    common = CommonTemplateAttribute(attributes=[
        attr(A.CRYPTOGRAPHIC_ALGORITHM, enums.CryptographicAlgorithm.EC), attr(A.CRYPTOGRAPHIC_LENGTH, 256),
        attr(A.ACTIVATION_DATE, int(time.time()) + HOUR)])
    result = kmip.proxy.create_key_pair(common_template_attribute=common)
    assert result.result_status.value == enums.ResultStatus.SUCCESS, result.result_message
    private, public = str(result.private_key_uuid), str(result.public_key_uuid)
    assert state_of(kmip, private) == state_of(kmip, public) == enums.State.PRE_ACTIVE
    # An hour passes (the stored dates move back instead; no clock is waited for).
    past = datetime.now(UTC) - timedelta(minutes=1)
    with services.db.begin() as s:
        for model, uid in ((KmipSealedObject, private), (KmipPublicKey, public)):
            s.execute(update(model).where(model.id == uuid.UUID(uid)).values(activation_date=past))
    services.keys.run_due(system_context("tests"))
    assert state_of(kmip, private) == state_of(kmip, public) == enums.State.ACTIVE
    with services.db.begin() as s:
        s.execute(update(KmipPublicKey).where(KmipPublicKey.id == uuid.UUID(public))
                  .values(deactivation_date=past.replace(year=past.year + 1)))
        s.execute(update(KmipSealedObject).where(KmipSealedObject.id == uuid.UUID(private))
                  .values(deactivation_date=past))
    services.keys.run_due(system_context("tests"))
    assert state_of(kmip, private) == enums.State.DEACTIVATED
    assert state_of(kmip, public) == enums.State.ACTIVE


def test_the_scheduler_deactivates_a_pre_active_key_whose_deactivation_date_passes(kmip: Any,
                                                                                    services: Services) -> None:
    uid = created(kmip.proxy.create(enums.ObjectType.SYMMETRIC_KEY, aes_template(
        attr(A.DEACTIVATION_DATE, int(time.time()) + HOUR))))
    assert state_of(kmip, uid) == enums.State.PRE_ACTIVE
    with services.db.begin() as s:  # the hour passes
        s.execute(update(KeyVersion).where(KeyVersion.id == uuid.UUID(uid))
                  .values(deactivation_date=datetime.now(UTC) - timedelta(minutes=1)))
    services.keys.run_due(system_context("tests"))
    assert state_of(kmip, uid) == enums.State.DEACTIVATED


# --- the object's Cryptographic Parameters are its uses' defaults ------------------------------
CBC = {"block_cipher_mode": enums.BlockCipherMode.CBC, "padding_method": enums.PaddingMethod.PKCS5}


def test_a_key_registered_for_cbc_encrypts_with_cbc_when_the_request_names_nothing(kmip: Any) -> None:
    material = os.urandom(32)
    uid = created(register_aes(kmip, material, attr(A.ACTIVATION_DATE, int(time.time())),
                               attr(A.CRYPTOGRAPHIC_PARAMETERS, CBC)))
    ciphertext, iv = kmip.encrypt(b"sixteen byte blk and more", uid=uid)
    assert iv is not None and len(iv) == 16
    decryptor = Cipher(algorithms.AES(material), modes.CBC(iv)).decryptor()
    unpadder = sym_padding.PKCS7(128).unpadder()
    padded = decryptor.update(ciphertext) + decryptor.finalize()
    assert unpadder.update(padded) + unpadder.finalize() == b"sixteen byte blk and more"
    assert kmip.decrypt(ciphertext, uid=uid, iv_counter_nonce=iv) == b"sixteen byte blk and more"
    # a request that names what the key was not made for is refused, not obeyed
    why, message = reason(lambda: kmip.encrypt(b"x", uid=uid, cryptographic_parameters={
        "block_cipher_mode": enums.BlockCipherMode.GCM}))
    assert why == R.INVALID_FIELD and "contradict" in message
    # naming part of the key's parameters is completed from them
    ciphertext, iv = kmip.encrypt(b"x", uid=uid, cryptographic_parameters={
        "block_cipher_mode": enums.BlockCipherMode.CBC})
    assert len(ciphertext) == 16 and len(iv) == 16
    _, attributes = kmip.get_attributes(uid, [A.CRYPTOGRAPHIC_PARAMETERS.value])
    assert attributes[0].attribute_value.block_cipher_mode == enums.BlockCipherMode.CBC


def test_parameters_that_contradict_the_key_are_refused(kmip: Any) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256)
    kmip.activate(uid)
    why, _ = reason(lambda: kmip.encrypt(b"x", uid=uid, cryptographic_parameters={
        "cryptographic_algorithm": enums.CryptographicAlgorithm.RSA}))
    assert why == R.INVALID_FIELD
    # and at creation, parameters no use of the key could honour
    result = kmip.proxy.create(enums.ObjectType.SYMMETRIC_KEY, aes_template(
        attr(A.CRYPTOGRAPHIC_PARAMETERS, {"block_cipher_mode": enums.BlockCipherMode.ECB})))
    assert failed(result)[0] == R.FEATURE_NOT_SUPPORTED


# --- what is not applied is refused, with its reason ------------------------------------------
@pytest.mark.parametrize(("extra", "expected"), [
    (attr(A.OPERATION_POLICY_NAME, "default"), R.FEATURE_NOT_SUPPORTED),
    (attr(A.STATE, enums.State.ACTIVE), R.PERMISSION_DENIED),
    (attr(A.INITIAL_DATE, 0), R.PERMISSION_DENIED),
    (attr("x-strongroom-key-id", "forged"), R.PERMISSION_DENIED),
    (attr(A.OBJECT_TYPE, enums.ObjectType.SECRET_DATA), R.INVALID_FIELD),
])
def test_attributes_the_server_does_not_apply_are_refused(kmip: Any, extra: Any, expected: Any) -> None:
    why, message = failed(kmip.proxy.create(enums.ObjectType.SYMMETRIC_KEY, aes_template(extra)))
    assert why == expected, message


def test_dates_for_symmetric_keys_only_are_refused_on_other_objects(kmip: Any) -> None:
    secret = ObjectFactory().convert(pie.SecretData(b"a password", enums.SecretDataType.PASSWORD))
    result = kmip.proxy.register(enums.ObjectType.SECRET_DATA, TemplateAttribute(attributes=[
        attr(A.PROTECT_STOP_DATE, int(time.time()))]), secret)
    why, message = failed(result)
    assert why == R.INVALID_FIELD and "Protect Stop Date" in message


def test_a_registered_key_whose_template_says_another_length_is_refused(kmip: Any) -> None:
    result = register_aes(kmip, os.urandom(16), attr(A.CRYPTOGRAPHIC_LENGTH, 256))
    assert failed(result)[0] == R.INVALID_FIELD


def test_custom_attributes_in_a_template_are_kept(kmip: Any) -> None:
    uid = created(kmip.proxy.create(enums.ObjectType.SYMMETRIC_KEY, aes_template(attr("x-team", "payments"))))
    _, attributes = kmip.get_attributes(uid, ["x-team"])
    assert attributes[0].attribute_value.value == "payments"


# --- every refusal is audited -------------------------------------------------------------------
def test_every_class_of_refusal_is_audited(kmip: Any, officer_files: ClientFiles, services: Services,
                                           kmip_files: Callable[[str], ClientFiles],
                                           kmip_listener: KmipListener) -> None:
    actor = f"kmip:{officer_files.name}"
    # invalid field: an unsupported algorithm
    assert reason(lambda: kmip.create(enums.CryptographicAlgorithm.TRIPLE_DES, 168))[0] == R.INVALID_FIELD
    [record] = refusals(services, actor, "kmip.create")[-1:]
    assert record.details["result_reason"] == "INVALID_FIELD" and "legacy" in record.details["message"]
    # item not found
    missing = str(uuid.uuid4())
    assert reason(lambda: kmip.get(missing))[0] == R.ITEM_NOT_FOUND
    [record] = [r for r in refusals(services, actor, "kmip.get") if r.object_id == missing]
    assert record.details["result_reason"] == "ITEM_NOT_FOUND"
    # wrong state: a Pre-Active key does not encrypt
    pre_active = kmip.create(enums.CryptographicAlgorithm.AES, 256)
    assert reason(lambda: kmip.encrypt(b"x", uid=pre_active))[0] == R.ILLEGAL_OPERATION
    [record] = [r for r in refusals(services, actor, "kmip.encrypt") if r.object_id == pre_active]
    assert record.details["result_reason"] == "ILLEGAL_OPERATION"
    # feature not supported: an attribute the server does not apply
    failed(kmip.proxy.create(enums.ObjectType.SYMMETRIC_KEY, aes_template(attr(A.OPERATION_POLICY_NAME, "x"))))
    assert refusals(services, actor, "kmip.create")[-1].details["result_reason"] == "FEATURE_NOT_SUPPORTED"
    # operation not supported: one the codec does not know
    data = bytearray(query_request())
    at = data.index(bytes.fromhex("42005c05") + struct.pack("!I", 4)) + 8
    data[at:at + 4] = struct.pack("!I", 0x7FFF)
    with connect(officer_files, kmip_listener.port) as conn:
        response = roundtrip(conn, bytes(data))
    assert response.batch_items[0].result_reason.value == R.OPERATION_NOT_SUPPORTED
    assert refusals(services, actor, "kmip.request")[-1].details["result_reason"] == "OPERATION_NOT_SUPPORTED"
    # permission denied: recorded once, by the policy layer, with the key and the missing permission
    auditor_files = kmip_files("auditor")
    auditor = make_client(auditor_files, kmip_listener.port)
    auditor.open()
    try:
        kmip.activate(pre_active)
        assert reason(lambda: auditor.encrypt(b"x", uid=pre_active))[0] == R.PERMISSION_DENIED
    finally:
        auditor.close()
    [record] = refusals(services, f"kmip:{auditor_files.name}", "key.encrypt")
    assert record.details["missing_permission"] == "keys:encrypt"


@pytest.mark.parametrize(("name", "value", "expected"), [
    (A.STATE, enums.State.ACTIVE, R.PERMISSION_DENIED),
    (A.CRYPTOGRAPHIC_LENGTH, 128, R.PERMISSION_DENIED),
    (A.DEACTIVATION_DATE, 0, R.FEATURE_NOT_SUPPORTED),
    (A.OPERATION_POLICY_NAME, "default", R.FEATURE_NOT_SUPPORTED),
])
def test_add_attribute_refuses_what_it_does_not_apply_with_its_reason(
        kmip: Any, officer_files: ClientFiles, kmip_listener: KmipListener, name: Any, value: Any,
        expected: Any) -> None:
    from kmip.core.messages.payloads import ModifyAttributeRequestPayload

    from keyserver.kmip.payloads import AddAttributeRequestPayload

    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256)
    with connect(officer_files, kmip_listener.port) as conn:
        r = roundtrip(conn, request([
            (enums.Operation.ADD_ATTRIBUTE, AddAttributeRequestPayload(unique_identifier=uid,
                                                                       attribute=attr(name, value))),
            (enums.Operation.MODIFY_ATTRIBUTE, ModifyAttributeRequestPayload(unique_identifier=uid,
                                                                             attribute=attr(name, value)))],
            continue_on_error=True))
    assert [item.result_reason.value for item in r.batch_items] == [expected, expected]


def test_a_message_refused_before_dispatch_is_audited_through_the_dispatchers_hook(
        officer_files: ClientFiles, services: Services) -> None:
    """For the listener's framing and size refusals (its own file calls this hook)."""
    from keyserver.core.principal import Principal
    from keyserver.kmip.context import Engine
    from keyserver.kmip.dispatcher import Dispatcher
    from tests.kmip.raw import decode

    dispatcher = Dispatcher(Engine(keys=services.keys, objects=services.kmip_objects, crypto=services.crypto))
    caller = Principal(name=f"kmip:{officer_files.name}", actor_type="host", role="key-officer",
                       permissions=frozenset())
    out = dispatcher.refuse(R.INVALID_MESSAGE, "request messages are limited to 1 bytes", principal=caller,
                            source_ip="192.0.2.1")
    assert decode(out).batch_items[0].result_reason.value == R.INVALID_MESSAGE
    [record] = [r for r in refusals(services, caller.name, "kmip.request") if r.source_ip == "192.0.2.1"]
    assert record.details["result_reason"] == "INVALID_MESSAGE"
