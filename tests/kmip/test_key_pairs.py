"""CreateKeyPair (RSA generated in the HSM), Register of private keys, secret data and
certificates, and AddAttribute: PyKMIP's real client (or raw TTLV where PyKMIP has no
call) against the real listener, token and database."""

from __future__ import annotations

import datetime
import os
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, padding, rsa
from cryptography.x509.oid import NameOID
from kmip.core import enums
from kmip.core.factories.attributes import AttributeFactory
from kmip.core.messages import payloads
from kmip.pie import objects as pie
from kmip.pie.exceptions import KmipOperationFailure
from sqlalchemy import func, select

from hsm import HsmInvalidInput
from keyserver.kmip.attributes import X_LINKED_PRIVATE, X_LINKED_PUBLIC
from keyserver.kmip.listener import KmipListener
from keyserver.kmip.payloads import AddAttributeRequestPayload
from keyserver.services import Services
from keyserver.store.models import AuditEvent, KmipSealedObject
from tests.conftest import unique
from tests.kmip.conftest import ClientFiles, make_client
from tests.kmip.raw import connect, request, roundtrip

_attrs = AttributeFactory()
OAEP_SHA1 = padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None)  # noqa: S303


def attrs_of(kmip: Any, uid: str) -> dict[str, Any]:
    return {a.attribute_name.value: a.attribute_value for a in kmip.get_attributes(uid)[1]}


def failure(call: Callable[[], Any]) -> Any:
    with pytest.raises(KmipOperationFailure) as e:
        call()
    return e.value.reason


def _audited(services: Services, action: str, object_id: str) -> list[AuditEvent]:
    services.audit.flush()
    with services.db() as s:
        return list(s.execute(select(AuditEvent).where(AuditEvent.action == action,
                                                       AuditEvent.object_id == object_id)
                                  .order_by(AuditEvent.seq)).scalars())


# --- CreateKeyPair ------------------------------------------------------------------
def test_create_key_pair_get_both_halves_and_wrap_under_the_public_one(
        kmip: Any, services: Services, officer_files: ClientFiles, kmip_listener: KmipListener) -> None:
    public_uid, private_uid = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048,
                                                   public_name=unique("pub"), private_name=unique("prv"))
    pub_attrs, prv_attrs = attrs_of(kmip, public_uid), attrs_of(kmip, private_uid)
    assert pub_attrs["State"].value == prv_attrs["State"].value == enums.State.PRE_ACTIVE
    assert pub_attrs["Object Type"].value == enums.ObjectType.PUBLIC_KEY
    assert prv_attrs["Object Type"].value == enums.ObjectType.PRIVATE_KEY
    assert prv_attrs["Cryptographic Length"].value == 2048
    assert pub_attrs[X_LINKED_PRIVATE].value == private_uid and prv_attrs[X_LINKED_PUBLIC].value == public_uid
    # Pre-Active private material may be retrieved (KMIP), with keys:export, audited.
    assert kmip.get(private_uid).key_format_type == enums.KeyFormatType.PKCS_8
    kmip.activate(public_uid)
    kmip.activate(private_uid)

    public = kmip.get(public_uid)
    assert public.key_format_type == enums.KeyFormatType.X_509
    private = kmip.get(private_uid)
    assert private.key_format_type == enums.KeyFormatType.PKCS_8
    private_key = serialization.load_der_private_key(private.value, None)
    assert isinstance(private_key, rsa.RSAPrivateKey) and private_key.key_size == 2048
    assert private_key.public_key().public_numbers() == serialization.load_der_public_key(
        public.value).public_numbers()
    with connect(officer_files, kmip_listener.port) as conn:  # PyKMIP's get() cannot ask for a format
        r = roundtrip(conn, request([(enums.Operation.GET, payloads.GetRequestPayload(
            unique_identifier=private_uid, key_format_type=enums.KeyFormatType.PKCS_1))]))
    block = r.batch_items[0].response_payload.secret.key_block
    assert block.key_format_type.value == enums.KeyFormatType.PKCS_1
    pkcs1 = bytes(block.key_value.key_material.value)
    assert serialization.load_der_private_key(pkcs1, None).private_numbers() == private_key.private_numbers()

    # The pair's public key wraps an AES key inside the HSM; its private key opens it.
    aes = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("forpair"))
    kmip.activate(aes)
    wrapped = kmip.get(aes, key_wrapping_specification={
        "wrapping_method": enums.WrappingMethod.ENCRYPT,
        "encryption_key_information": {"unique_identifier": public_uid},
        "encoding_option": enums.EncodingOption.NO_ENCODING})
    assert private_key.decrypt(wrapped.value, OAEP_SHA1) == kmip.get(aes).value

    assert private_uid in kmip.locate(attributes=[
        _attrs.create_attribute(enums.AttributeType.OBJECT_TYPE, enums.ObjectType.PRIVATE_KEY)])
    exports = _audited(services, "key.export", private_uid)
    assert len(exports) == 3  # Pre-Active PKCS#8, then PKCS#8 and PKCS#1
    assert [e.details["state"] for e in exports] == ["pre-active", "active", "active"]
    assert all(e.details["plaintext"] is True and e.actor.startswith("kmip:") for e in exports)
    assert _audited(services, "kmip.create_key_pair", private_uid)


def test_the_private_key_is_stored_sealed(kmip: Any, services: Services) -> None:
    _, private_uid = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048, private_name=unique("sealed"))
    kmip.activate(private_uid)
    plain = kmip.get(private_uid).value
    with services.db() as s:
        row = s.get(KmipSealedObject, uuid.UUID(private_uid))
    assert row is not None and row.material is not None and row.dek_ciphertext is not None
    assert row.mechanism == "AES-KWP" and row.dek_mechanism.startswith("RSA-OAEP")
    # No 16-byte window of the key appears in what the database holds.
    assert all(plain[i:i + 16] not in row.material for i in range(0, len(plain) - 16, 16))


@pytest.mark.parametrize("bits", [3072])
def test_create_key_pair_lengths(kmip: Any, bits: int) -> None:
    public_uid, private_uid = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, bits)
    assert attrs_of(kmip, public_uid)["Cryptographic Length"].value == bits
    assert attrs_of(kmip, private_uid)["Cryptographic Length"].value == bits


def test_create_key_pair_refuses_bad_requests(kmip: Any, services: Services) -> None:
    assert failure(lambda: kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 1024)) == \
        enums.ResultReason.INVALID_FIELD
    assert failure(lambda: kmip.create_key_pair(enums.CryptographicAlgorithm.AES, 256)) == \
        enums.ResultReason.INVALID_FIELD
    with pytest.raises(HsmInvalidInput):
        services.hsm.generate_wrapped_rsa_pair(kek_id=services.keks.current(), bits=1536)


def test_key_pair_lifecycle_revoke_and_destroy(kmip: Any, services: Services) -> None:
    public_uid, private_uid = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)
    kmip.activate(private_uid)
    kmip.activate(public_uid)
    assert failure(lambda: kmip.destroy(private_uid)) == enums.ResultReason.ILLEGAL_OPERATION  # revoke first
    kmip.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, private_uid)
    assert attrs_of(kmip, private_uid)["State"].value == enums.State.DEACTIVATED
    assert len(kmip.get(private_uid).value) > 1000  # deactivated: still retrievable
    kmip.destroy(private_uid)
    assert attrs_of(kmip, private_uid)["State"].value == enums.State.DESTROYED
    assert failure(lambda: kmip.get(private_uid)) == enums.ResultReason.ILLEGAL_OPERATION
    with services.db() as s:
        row = s.get(KmipSealedObject, uuid.UUID(private_uid))
    assert row is not None and row.material is None and row.dek_ciphertext is None
    # Each half has its own lifecycle: the public key is still active; a compromise ends it.
    assert attrs_of(kmip, public_uid)["State"].value == enums.State.ACTIVE
    kmip.revoke(enums.RevocationReasonCode.KEY_COMPROMISE, public_uid)
    assert attrs_of(kmip, public_uid)["State"].value == enums.State.COMPROMISED
    aes = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("nowrap"))
    kmip.activate(aes)
    spec = {"wrapping_method": enums.WrappingMethod.ENCRYPT,
            "encryption_key_information": {"unique_identifier": public_uid}}
    assert failure(lambda: kmip.get(aes, key_wrapping_specification=spec)) == enums.ResultReason.ILLEGAL_OPERATION
    assert _audited(services, "kmip.destroy", private_uid)


def test_auditor_may_read_the_public_half_only(kmip: Any, kmip_files: Callable[..., ClientFiles],
                                               kmip_listener: KmipListener, services: Services,
                                               officer_files: ClientFiles) -> None:
    public_uid, private_uid = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)
    kmip.activate(public_uid)
    kmip.activate(private_uid)
    files = kmip_files("auditor", officer_files.group)  # the role is tested, not tenancy: one group
    with make_client(files, kmip_listener.port) as auditor:
        assert auditor.get(public_uid).key_format_type == enums.KeyFormatType.X_509
        assert auditor.get_attributes(private_uid)[0] == private_uid
        assert failure(lambda: auditor.get(private_uid)) == enums.ResultReason.PERMISSION_DENIED
        assert failure(lambda: auditor.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)) == \
            enums.ResultReason.PERMISSION_DENIED
        assert failure(lambda: auditor.revoke(enums.RevocationReasonCode.UNSPECIFIED, private_uid)) == \
            enums.ResultReason.PERMISSION_DENIED
    [denied] = [e for e in _audited(services, "key.export", private_uid) if e.outcome == "denied"]
    assert denied.actor == f"kmip:{files.name}"


# --- Register ------------------------------------------------------------------------
def test_register_private_key_secret_data_and_certificate(kmip: Any, services: Services) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pkcs8 = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    pkcs1 = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL,
                              serialization.NoEncryption())
    uid8 = kmip.register(pie.PrivateKey(enums.CryptographicAlgorithm.RSA, 2048, pkcs8, enums.KeyFormatType.PKCS_8,
                                        name=unique("regprv")))
    uid1 = kmip.register(pie.PrivateKey(enums.CryptographicAlgorithm.RSA, 2048, pkcs1, enums.KeyFormatType.PKCS_1))
    for uid in (uid8, uid1):
        assert attrs_of(kmip, uid)["State"].value == enums.State.PRE_ACTIVE
        kmip.activate(uid)
        assert kmip.get(uid).value == pkcs8
    assert _audited(services, "kmip.register", uid8)

    secret = os.urandom(48)
    sid = kmip.register(pie.SecretData(secret, enums.SecretDataType.SEED, name=unique("seed")))
    kmip.activate(sid)
    got = kmip.get(sid)
    assert got.value == secret and got.data_type == enums.SecretDataType.SEED
    with services.db() as s:
        row = s.get(KmipSealedObject, uuid.UUID(sid))
    assert row is not None and row.material is not None and secret not in row.material

    cert = _certificate()
    cid = kmip.register(pie.X509Certificate(cert, name=unique("cert")))
    assert kmip.get(cid).value == cert  # public: retrievable before activation too
    assert attrs_of(kmip, cid)["Object Type"].value == enums.ObjectType.CERTIFICATE
    kmip.activate(cid)
    kmip.revoke(enums.RevocationReasonCode.SUPERSEDED, cid)
    kmip.destroy(cid)
    assert failure(lambda: kmip.get(cid)) == enums.ResultReason.ILLEGAL_OPERATION


def test_register_refuses_what_it_cannot_keep(kmip: Any) -> None:
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(  # noqa: S505 - refused
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    assert failure(lambda: kmip.register(pie.PrivateKey(
        enums.CryptographicAlgorithm.RSA, 1024, small, enums.KeyFormatType.PKCS_8))) == enums.ResultReason.INVALID_FIELD
    dsa_key = dsa.generate_private_key(2048).private_bytes(  # RSA and EC (P-256/P-384) only
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    assert failure(lambda: kmip.register(pie.PrivateKey(
        enums.CryptographicAlgorithm.DSA, 2048, dsa_key, enums.KeyFormatType.PKCS_8))) == \
        enums.ResultReason.FEATURE_NOT_SUPPORTED
    assert failure(lambda: kmip.register(pie.PrivateKey(
        enums.CryptographicAlgorithm.RSA, 2048, b"\x30\x03garbage", enums.KeyFormatType.PKCS_8))) == \
        enums.ResultReason.INVALID_FIELD
    assert failure(lambda: kmip.register(pie.X509Certificate(b"not a certificate"))) == \
        enums.ResultReason.INVALID_FIELD
    assert failure(lambda: kmip.register(pie.OpaqueObject(b"x" * (64 * 1024 + 1), enums.OpaqueDataType.NONE))) == \
        enums.ResultReason.INVALID_FIELD


def test_secret_data_needs_export_permission(kmip: Any, kmip_files: Callable[..., ClientFiles],
                                             kmip_listener: KmipListener, officer_files: ClientFiles) -> None:
    sid = kmip.register(pie.SecretData(b"hunter2-but-longer", enums.SecretDataType.PASSWORD))
    kmip.activate(sid)
    with make_client(kmip_files("auditor", officer_files.group), kmip_listener.port) as auditor:
        assert failure(lambda: auditor.get(sid)) == enums.ResultReason.PERMISSION_DENIED
        assert failure(lambda: auditor.register(pie.SecretData(b"x" * 8, enums.SecretDataType.PASSWORD))) == \
            enums.ResultReason.PERMISSION_DENIED


# --- AddAttribute (raw TTLV: PyKMIP's client has no call for it) ---------------------
def test_add_attribute_adds_a_key_tag(admin: httpx.Client, officer_files: ClientFiles,
                                      kmip_files: Callable[..., ClientFiles], kmip_listener: KmipListener,
                                      kmip: Any, services: Services) -> None:
    name = unique("addattr")
    key = admin.post("/api/v1/keys", json={"name": name, "tags": {"env": "test"},
                                           "kmip_group": officer_files.group}).json()
    [uid] = kmip.locate(attributes=[_attrs.create_attribute(enums.AttributeType.NAME, name)])

    def add(attr: str, value: Any, target: str = uid) -> Any:
        return (enums.Operation.ADD_ATTRIBUTE,
                AddAttributeRequestPayload(unique_identifier=target, attribute=_attrs.create_attribute(attr, value)))

    with connect(officer_files, kmip_listener.port) as conn:
        r = roundtrip(conn, request([add("x-owner", "team-b"), add("x-owner", "team-c"),
                                     add("x-strongroom-key-id", "forged"), add("x-env", "again"),
                                     add("x-new", "v", target=str(uuid.uuid4()))], continue_on_error=True))
    items = r.batch_items
    assert items[0].result_status.value == enums.ResultStatus.SUCCESS
    assert items[0].operation.value == enums.Operation.ADD_ATTRIBUTE
    assert items[0].response_payload.unique_identifier == uid
    assert items[0].response_payload.attribute.attribute_value.value == "team-b"
    assert [i.result_reason.value for i in items[1:]] == [
        enums.ResultReason.ILLEGAL_OPERATION, enums.ResultReason.PERMISSION_DENIED,
        enums.ResultReason.ILLEGAL_OPERATION, enums.ResultReason.ITEM_NOT_FOUND]
    assert admin.get(f"/api/v1/keys/{key['id']}").json()["tags"] == {"env": "test", "owner": "team-b"}
    assert attrs_of(kmip, uid)["x-owner"].value == "team-b"

    auditor = kmip_files("auditor", officer_files.group)  # sees the key; its role may not change it
    with connect(auditor, kmip_listener.port) as conn:
        r = roundtrip(conn, request([add("x-other", "no")]))
    assert r.batch_items[0].result_reason.value == enums.ResultReason.PERMISSION_DENIED
    services.audit.flush()
    with services.db() as s:
        denied = s.execute(select(func.count()).select_from(AuditEvent).where(
            AuditEvent.actor == f"kmip:{auditor.name}", AuditEvent.outcome == "denied")).scalar_one()
    assert denied >= 1


def test_add_attribute_payload_roundtrip() -> None:
    from kmip.core.utils import BytearrayStream

    from keyserver.kmip.payloads import AddAttributeResponsePayload

    for cls in (AddAttributeRequestPayload, AddAttributeResponsePayload):
        original = cls(unique_identifier="abc", attribute=_attrs.create_attribute("x-a", "b"))
        stream = BytearrayStream()
        original.write(stream)
        decoded = cls()
        decoded.read(BytearrayStream(bytes(stream.buffer)))
        assert decoded == original
    with pytest.raises(Exception, match="attribute"):
        AddAttributeRequestPayload(unique_identifier="abc").write(BytearrayStream())


def _certificate() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "registered.example.com")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.DER)

