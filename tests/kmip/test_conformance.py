"""KMIP 1.x server profiles, driven by PyKMIP's ProxyKmipClient at its defaults.

The client is used the way a program uses it out of the box: KMIP 1.2 (the client's
default version), its default names ("Symmetric Key", "Secret Data", ...), its default
attribute sets (Create sends a Cryptographic Usage Mask of Encrypt|Decrypt, CreateKeyPair
sends none). The only non-default is the TLS context of tests/kmip/conftest.py, which
checks the server's host name.

The tests are grouped by the server profile whose operations they exercise (KMIP
Profiles 1.x): Baseline Server, Symmetric Key Lifecycle Server (and its Foundry
variant), Basic Cryptographic Server, Asymmetric Key Lifecycle Server. Each is a
sequence a real client program runs; the names in the docstrings (BL-M, SKLC-M, SKFF-M,
CS-BC-M, CS-RNG-M, AKLC-M) are the families of KMIP test cases they follow in spirit,
not verbatim.
Section numbers and quotations are those of the KMIP 1.2 specification, the version
the client speaks (the operations' sections keep their numbers in 1.3 and 1.4).

Where ProxyKmipClient cannot express a request, the test says so and goes one level
down, over the client's own connection: KMIPProxy (batches, Get with a Key Format
Type), KMIPProxy.send_request_payload with keyserver's AddAttribute payload (PyKMIP
0.11 has none), or a Request Payload assembled from PyKMIP's primitives (RNG Retrieve
and MAC Verify, for which PyKMIP 0.11 has no payload classes), whose response is read
from the raw TTLV.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, padding, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric import padding as asym_padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import NameOID
from kmip.core import enums, misc, primitives
from kmip.core.attributes import CryptographicParameters
from kmip.core.exceptions import OperationFailure
from kmip.core.factories.attributes import AttributeFactory
from kmip.core.messages import contents, messages
from kmip.core.utils import BytearrayStream
from kmip.pie import objects as pie
from kmip.pie.exceptions import KmipOperationFailure

from keyserver.kmip.payloads import AddAttributeRequestPayload
from tests.conftest import unique

A = enums.AttributeType
R = enums.ResultReason
S = enums.State
_factory = AttributeFactory()

# KMIP 1.x has no "wrong state" or "usage not permitted" reason (2.0's Wrong Key
# Lifecycle State and Incompatible Cryptographic Usage Mask cannot be sent in a 1.2
# response). The 1.2 error tables answer an operation the object's state or use does not
# allow with Permission Denied (Activate §11.20, Destroy §11.22; "not able to be used for
# wrapping", §11.12), and this server documents Illegal Operation for a wrong state
# (docs/kmip.md): either is a refusal; what matters is that nothing is done.
NOT_PERMITTED = (R.PERMISSION_DENIED, R.ILLEGAL_OPERATION)


# --- helpers ----------------------------------------------------------------------------
def attr(name: enums.AttributeType | str, value: Any) -> Any:
    return _factory.create_attribute(name, value)


def plain(value: Any) -> Any:
    """A decoded attribute value as a Python value (Name: its text)."""
    if hasattr(value, "name_value"):
        return value.name_value.value
    return getattr(value, "value", value)


def attributes(client: Any, uid: str, names: list[str] | None = None) -> dict[str, list[Any]]:
    """GetAttributes: name -> the values of its instances."""
    got_uid, attrs = client.get_attributes(uid, names)
    assert got_uid == uid
    out: dict[str, list[Any]] = {}
    for a in attrs:
        out.setdefault(a.attribute_name.value, []).append(plain(a.attribute_value))
    return out


def one(client: Any, uid: str, name: str) -> Any:
    values = attributes(client, uid, [name]).get(name)
    assert values is None or len(values) == 1, f"{name}: {values}"
    return values[0] if values else None


def state(client: Any, uid: str) -> Any:
    return one(client, uid, A.STATE.value)


def usage(mask: int) -> set[enums.CryptographicUsageMask]:
    return {m for m in enums.CryptographicUsageMask if mask & m.value}


def failure(call: Callable[[], Any]) -> Any:
    """The Result Reason of a call that must fail (ProxyKmipClient raises
    KmipOperationFailure; KMIPProxy.send_request_payload raises OperationFailure)."""
    with pytest.raises((KmipOperationFailure, OperationFailure)) as e:
        call()
    return e.value.reason


def locate(client: Any, *attrs: Any) -> list[str]:
    return list(client.locate(attributes=list(attrs)))


def by_name(name: str) -> Any:
    return attr(A.NAME, name)


def rsa_private_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def spki(key: rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def pkcs8(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def certificate_der() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"conformance-{uuid.uuid4().hex[:8]}.example")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + timedelta(days=1)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.DER)


def registrable(kind: str, **name: str) -> Any:
    """A fresh PyKMIP object of each registrable type; without `name=` the object
    carries PyKMIP's default name ("Symmetric Key", "Public Key", ...)."""
    if kind == "symmetric-key":
        return pie.SymmetricKey(enums.CryptographicAlgorithm.AES, 256, os.urandom(32), **name)
    if kind == "secret-data":
        return pie.SecretData(os.urandom(24), enums.SecretDataType.PASSWORD, **name)
    if kind == "certificate":
        return pie.X509Certificate(certificate_der(), **name)
    key = rsa_private_key()
    if kind == "public-key":
        return pie.PublicKey(enums.CryptographicAlgorithm.RSA, 2048, spki(key), enums.KeyFormatType.X_509, **name)
    assert kind == "private-key"
    return pie.PrivateKey(enums.CryptographicAlgorithm.RSA, 2048, pkcs8(key), enums.KeyFormatType.PKCS_8, **name)


REGISTRABLE = ("symmetric-key", "public-key", "private-key", "secret-data", "certificate")
OBJECT_TYPE = {"symmetric-key": enums.ObjectType.SYMMETRIC_KEY, "public-key": enums.ObjectType.PUBLIC_KEY,
               "private-key": enums.ObjectType.PRIVATE_KEY, "secret-data": enums.ObjectType.SECRET_DATA,
               "certificate": enums.ObjectType.CERTIFICATE}


def make(client: Any, kind: str, name: str | None = None) -> str:
    """One object of `kind` as a program makes it: Create for a symmetric key,
    CreateKeyPair for either half of a pair, Register for the rest."""
    names = {} if name is None else {"name": name}
    if kind == "symmetric-key":
        return str(client.create(enums.CryptographicAlgorithm.AES, 256, **names))
    if kind in ("public-key", "private-key"):
        public, private = client.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048,
                                                 public_name=name, private_name=name)
        return str(public if kind == "public-key" else private)
    return str(client.register(registrable(kind, **names)))


def add_attribute(client: Any, uid: str, name: enums.AttributeType, value: Any) -> tuple[str, Any]:
    """AddAttribute (§4.14). PyKMIP 0.11 has no AddAttribute payload and ProxyKmipClient
    no add_attribute call: keyserver's payload (built on PyKMIP's primitives and
    registered with its payload factories, as tests/kmip/test_key_pairs.py uses it) is
    sent over the client's own connection with KMIPProxy.send_request_payload."""
    response = client.proxy.send_request_payload(
        enums.Operation.ADD_ATTRIBUTE, AddAttributeRequestPayload(unique_identifier=uid, attribute=attr(name, value)))
    return response.unique_identifier, plain(response.attribute.attribute_value)


# --- raw TTLV, for operations PyKMIP 0.11 has no payload classes for ---------------------
class _Payload:
    """A Request Payload assembled from PyKMIP primitives (each writes its own TTLV)."""

    def __init__(self, *fields: Any) -> None:
        self._fields = fields

    def write(self, output: Any, kmip_version: Any = enums.KMIPVersion.KMIP_1_0) -> None:
        body = BytearrayStream()
        for f in self._fields:
            f.write(body, kmip_version=kmip_version)
        data = bytes(body.buffer)
        output.write(struct.pack("!I", enums.Tags.REQUEST_PAYLOAD.value)[1:] + b"\x01"
                     + struct.pack("!I", len(data)) + data)


def _walk(data: bytes) -> list[tuple[int, int, bytes]]:
    """(tag, type, value) of the items of one TTLV structure's body."""
    out, i = [], 0
    while i < len(data):
        tag, typ, length = int.from_bytes(data[i:i + 3], "big"), data[i + 3], struct.unpack("!I", data[i + 4:i + 8])[0]
        out.append((tag, typ, data[i + 8:i + 8 + length]))
        i += 8 + (length if typ == 0x01 else (length + 7) // 8 * 8)
    return out


@dataclass
class RawResult:
    status: enums.ResultStatus
    reason: enums.ResultReason | None
    message: str | None
    payload: dict[int, list[bytes]] = field(default_factory=dict)

    def enum(self, tag: enums.Tags, cls: Any) -> Any:
        [value] = self.payload[tag.value]
        return cls(struct.unpack("!I", value[:4])[0])


def send_raw(client: Any, operation: enums.Operation, *fields: Any) -> RawResult:
    """One batch item over the client's connection, with the client's own request
    header (KMIPProxy._build_request_message: KMIP 1.2, no credential); the response is
    read as TTLV, so that it does not depend on PyKMIP knowing the response payload."""
    proxy = client.proxy
    item = messages.RequestBatchItem(operation=contents.Operation(operation), request_payload=_Payload(*fields))
    proxy._send_message(proxy._build_request_message(None, [item]))
    [(_, _, message)] = _walk(bytes(proxy._receive_message().buffer))
    [batch_item] = [v for t, _, v in _walk(message) if t == enums.Tags.BATCH_ITEM.value]
    got = {t: v for t, _, v in _walk(batch_item)}
    reason = got.get(enums.Tags.RESULT_REASON.value)
    text = got.get(enums.Tags.RESULT_MESSAGE.value)
    result = RawResult(status=enums.ResultStatus(struct.unpack("!I", got[enums.Tags.RESULT_STATUS.value][:4])[0]),
                       reason=enums.ResultReason(struct.unpack("!I", reason[:4])[0]) if reason else None,
                       message=text.decode() if text else None)
    for t, _, v in _walk(got.get(enums.Tags.RESPONSE_PAYLOAD.value, b"")):
        result.payload.setdefault(t, []).append(v)
    return result


def rng_retrieve(client: Any, length: int) -> RawResult:
    """RNG Retrieve (§4.35): Data Length in, Data out. No ProxyKmipClient call, no
    PyKMIP 0.11 payload."""
    return send_raw(client, enums.Operation.RNG_RETRIEVE, primitives.Integer(length, tag=enums.Tags.DATA_LENGTH))


def mac_verify(client: Any, uid: str, data: bytes, mac: bytes, algorithm: enums.CryptographicAlgorithm) -> RawResult:
    """MAC Verify (§4.34). No ProxyKmipClient call, no PyKMIP 0.11 payload."""
    return send_raw(client, enums.Operation.MAC_VERIFY,
                    primitives.TextString(uid, tag=enums.Tags.UNIQUE_IDENTIFIER),
                    CryptographicParameters(cryptographic_algorithm=algorithm),
                    primitives.ByteString(data, tag=enums.Tags.DATA),
                    primitives.ByteString(mac, tag=enums.Tags.MAC_DATA))


# --- required attributes (§3: "SHALL always have a value: Yes", and decodable by PyKMIP 0.11)
# Digest is left out (it exists only "if the server has access to the key material",
# §3.17), and so are the X.509 identifier/subject/issuer attributes: PyKMIP 0.11's
# attribute factory raises NotImplementedError for them (as for Link), so a server that
# returned them would break this client's GetAttributes.
REQUIRED_ALL = {A.UNIQUE_IDENTIFIER.value, A.OBJECT_TYPE.value, A.STATE.value, A.INITIAL_DATE.value,
                A.LAST_CHANGE_DATE.value, A.CRYPTOGRAPHIC_USAGE_MASK.value}
REQUIRED_KEY = REQUIRED_ALL | {A.CRYPTOGRAPHIC_ALGORITHM.value, A.CRYPTOGRAPHIC_LENGTH.value}
REQUIRED = {"symmetric-key": REQUIRED_KEY, "public-key": REQUIRED_KEY, "private-key": REQUIRED_KEY,
            "secret-data": REQUIRED_ALL,
            "certificate": REQUIRED_ALL | {A.CERTIFICATE_TYPE.value, A.CERTIFICATE_LENGTH.value}}

# What the four profiles need the server to do (Query must say so).
PROFILE_OPERATIONS = {
    # Baseline Server
    enums.Operation.DISCOVER_VERSIONS, enums.Operation.QUERY, enums.Operation.LOCATE, enums.Operation.GET,
    enums.Operation.GET_ATTRIBUTES, enums.Operation.GET_ATTRIBUTE_LIST, enums.Operation.ADD_ATTRIBUTE,
    enums.Operation.MODIFY_ATTRIBUTE, enums.Operation.DELETE_ATTRIBUTE, enums.Operation.ACTIVATE,
    enums.Operation.REVOKE, enums.Operation.DESTROY,
    # Symmetric Key Lifecycle / Foundry
    enums.Operation.CREATE, enums.Operation.REGISTER, enums.Operation.REKEY,
    # Asymmetric Key Lifecycle
    enums.Operation.CREATE_KEY_PAIR,
    # Basic Cryptographic
    enums.Operation.ENCRYPT, enums.Operation.DECRYPT, enums.Operation.SIGN, enums.Operation.SIGNATURE_VERIFY,
    enums.Operation.MAC, enums.Operation.MAC_VERIFY, enums.Operation.RNG_RETRIEVE,
}

AES_GCM = {"cryptographic_algorithm": enums.CryptographicAlgorithm.AES,
           "block_cipher_mode": enums.BlockCipherMode.GCM, "tag_length": 16, "random_iv": True}
AES_CBC_PKCS5 = {"cryptographic_algorithm": enums.CryptographicAlgorithm.AES,
                 "block_cipher_mode": enums.BlockCipherMode.CBC, "padding_method": enums.PaddingMethod.PKCS5,
                 "random_iv": True}


# =========================================================================================
# Baseline Server (KMIP Profiles 1.x, Baseline Server clause; test cases BL-M-*)
# =========================================================================================
class TestBaselineServer:
    def test_discover_versions_lists_1_4_to_1_0_and_intersects_with_the_clients_list(self, kmip: Any) -> None:
        """BL-M style, Discover Versions (§4.26): without a list the server returns every
        version it speaks, highest preference first; with the client's list, only the
        versions both speak; with none in common (and the header's version not in the
        list), an empty list."""
        result = kmip.proxy.discover_versions()
        assert result.result_status.value == enums.ResultStatus.SUCCESS
        assert [(v.major, v.minor) for v in result.protocol_versions] == [(1, 4), (1, 3), (1, 2), (1, 1), (1, 0)]

        result = kmip.proxy.discover_versions(
            protocol_versions=[contents.ProtocolVersion(1, 2), contents.ProtocolVersion(1, 0)])
        assert [(v.major, v.minor) for v in result.protocol_versions] == [(1, 2), (1, 0)]

        result = kmip.proxy.discover_versions(protocol_versions=[contents.ProtocolVersion(3, 7)])
        assert result.result_status.value == enums.ResultStatus.SUCCESS
        assert not result.protocol_versions

    def test_query_lists_the_operations_and_object_types_of_the_profiles(self, kmip: Any) -> None:
        """BL-M style, Query (§4.25) for Query Operations and Query Objects: the server
        names every operation of the Baseline, Symmetric/Asymmetric Key Lifecycle and
        Basic Cryptographic server profiles, and the five object types it keeps. (Query is
        a KMIPProxy call: ProxyKmipClient has none.)"""
        result = kmip.proxy.query(query_functions=[enums.QueryFunction.QUERY_OPERATIONS,
                                                   enums.QueryFunction.QUERY_OBJECTS])
        assert result.result_status.value == enums.ResultStatus.SUCCESS
        operations = {o if isinstance(o, enums.Operation) else enums.Operation(o) for o in result.operations}
        missing = sorted(o.name for o in PROFILE_OPERATIONS - operations)
        assert not missing, f"Query Operations does not list {missing}"
        object_types = {o if isinstance(o, enums.ObjectType) else enums.ObjectType(o) for o in result.object_types}
        assert set(OBJECT_TYPE.values()) <= object_types

    def test_locate_with_no_attributes_finds_objects_of_every_type(self, kmip: Any) -> None:
        """BL-M style, Locate (§4.9) with no attribute: "any object SHALL be deemed to
        match". One live object of each type is in the answer."""
        made = {kind: make(kmip, kind) for kind in REGISTRABLE}
        found = set(locate(kmip))
        assert {kind: uid for kind, uid in made.items() if uid not in found} == {}

    def test_locate_by_name_object_type_and_state(self, kmip: Any) -> None:
        """BL-M style, Locate (§4.9) by Name, Object Type and State: "returned objects
        SHALL match all of the attributes in the request"; a state change moves the key
        from one State filter to the other."""
        name = unique("locate me")
        key = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
        secret = kmip.register(registrable("secret-data", name=name + " secret"))
        assert locate(kmip, by_name(name)) == [key]
        assert locate(kmip, by_name(name), attr(A.OBJECT_TYPE, enums.ObjectType.SYMMETRIC_KEY)) == [key]
        assert locate(kmip, by_name(name), attr(A.OBJECT_TYPE, enums.ObjectType.SECRET_DATA)) == []
        symmetric = set(locate(kmip, attr(A.OBJECT_TYPE, enums.ObjectType.SYMMETRIC_KEY)))
        assert key in symmetric and secret not in symmetric
        assert secret in locate(kmip, attr(A.OBJECT_TYPE, enums.ObjectType.SECRET_DATA))
        assert locate(kmip, by_name(name), attr(A.STATE, S.PRE_ACTIVE)) == [key]
        assert locate(kmip, by_name(name), attr(A.STATE, S.ACTIVE)) == []
        kmip.activate(key)
        assert locate(kmip, by_name(name), attr(A.STATE, S.ACTIVE)) == [key]
        assert locate(kmip, by_name(name), attr(A.STATE, S.PRE_ACTIVE)) == []

    @pytest.mark.parametrize("kind", REGISTRABLE)
    def test_get_attributes_and_get_attribute_list_agree_on_every_object_type(self, kmip: Any, kind: str) -> None:
        """BL-M style, Get Attribute List (§4.13) and Get Attributes (§4.12) on each
        object type: the list names exactly what Get Attributes returns; the attributes
        that "SHALL always have a value" (§3) are there; naming some returns those only,
        and a named attribute the object does not have "SHALL NOT be present"."""
        uid = make(kmip, kind)
        names = kmip.get_attribute_list(uid)
        everything = attributes(kmip, uid)
        assert sorted(names) == sorted(everything)
        missing = sorted(REQUIRED[kind] - set(names))
        assert not missing, f"a {kind} lacks the required attributes {missing}"
        assert everything[A.UNIQUE_IDENTIFIER.value] == [uid]
        assert everything[A.OBJECT_TYPE.value] == [OBJECT_TYPE[kind]]
        assert everything[A.STATE.value] == [S.PRE_ACTIVE]  # §3.22 transition 1: created or registered
        some = attributes(kmip, uid, [A.STATE.value, A.OBJECT_TYPE.value, A.COMPROMISE_DATE.value])
        assert sorted(some) == sorted([A.STATE.value, A.OBJECT_TYPE.value])

    def test_a_batch_of_several_operations_through_kmipproxy(self, kmip: Any) -> None:
        """BL-M style, a message with four batch items (§7.1). ProxyKmipClient sends one
        operation per message; KMIPProxy queues batch items (batch=True for Discover
        Versions and Query, its _build_*_batch_item helpers for the others) but has no
        public call to send the queue, so its own _build_request_message,
        _send_and_receive_message and _process_batch_items are used. PyKMIP leaves out the
        Unique Batch Item IDs, which Table 246 calls "REQUIRED if Batch Count > 1": the
        server still answers every item, in order; with IDs, it echoes them."""
        uid = kmip.create(enums.CryptographicAlgorithm.AES, 128, name=unique("batched"))
        proxy = kmip.proxy

        def queue() -> list[Any]:
            proxy.batch_items = []
            proxy.discover_versions(batch=True)
            proxy.query(batch=True, query_functions=[enums.QueryFunction.QUERY_OBJECTS])
            proxy.batch_items.append(proxy._build_get_attributes_batch_item(uid, [A.STATE.value]))
            proxy.batch_items.append(proxy._build_get_attribute_list_batch_item(uid))
            items, proxy.batch_items = proxy.batch_items, []
            return list(items)

        response = proxy._send_and_receive_message(proxy._build_request_message(None, queue()))
        assert [i.operation.value for i in response.batch_items] == [
            enums.Operation.DISCOVER_VERSIONS, enums.Operation.QUERY, enums.Operation.GET_ATTRIBUTES,
            enums.Operation.GET_ATTRIBUTE_LIST]
        versions, query, attrs, names = proxy._process_batch_items(response)
        assert [r.result_status.value for r in (versions, query, attrs, names)] == [enums.ResultStatus.SUCCESS] * 4
        assert (1, 2) in [(v.major, v.minor) for v in versions.protocol_versions]
        assert enums.ObjectType.SYMMETRIC_KEY in query.object_types
        assert attrs.uuid == uid and [plain(a.attribute_value) for a in attrs.attributes] == [S.PRE_ACTIVE]
        assert names.uid == uid and A.STATE.value in names.names

        items = queue()
        for i, item in enumerate(items):
            item.unique_batch_item_id = contents.UniqueBatchItemID(f"conformance-{i}".encode())
        response = proxy._send_and_receive_message(proxy._build_request_message(None, items))
        assert [bytes(i.unique_batch_item_id.value) for i in response.batch_items] == [
            f"conformance-{i}".encode() for i in range(4)]

    def test_an_unknown_identifier_is_item_not_found(self, kmip: Any) -> None:
        """BL-M style, the first row of every error table of §11: "No object with the
        specified Unique Identifier exists" -> Item Not Found."""
        missing = str(uuid.uuid4())
        calls: dict[str, Callable[[], Any]] = {
            "Get": lambda: kmip.get(missing),
            "GetAttributes": lambda: kmip.get_attributes(missing),
            "GetAttributeList": lambda: kmip.get_attribute_list(missing),
            "Activate": lambda: kmip.activate(missing),
            "Revoke": lambda: kmip.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, missing),
            "Destroy": lambda: kmip.destroy(missing),
            "ReKey": lambda: kmip.rekey(uid=missing),
        }
        assert {op: failure(call) for op, call in calls.items()} == {op: R.ITEM_NOT_FOUND for op in calls}


# =========================================================================================
# Symmetric Key Lifecycle Server, and Symmetric Key Foundry Server (KMIP Profiles 1.x;
# test cases SKLC-M-*, SKFF-M-*)
# =========================================================================================
class TestSymmetricKeyLifecycleServer:
    def test_get_of_a_pre_active_key_returns_its_material(self, kmip: Any) -> None:
        """SKFF-M style: create(AES, 256) then get(uid) at once. §3.22 forbids a
        Pre-Active object "any cryptographic purpose"; Get is not one (the KMIP 1.2 Get
        error table, §11.12, has no state row), so the key is returned, and is the same
        key once Active."""
        uid = kmip.create(enums.CryptographicAlgorithm.AES, 256)
        assert state(kmip, uid) == S.PRE_ACTIVE
        key = kmip.get(uid)
        assert key.object_type == enums.ObjectType.SYMMETRIC_KEY
        assert key.cryptographic_algorithm == enums.CryptographicAlgorithm.AES
        assert key.cryptographic_length == 256 and len(key.value) == 32
        assert state(kmip, uid) == S.PRE_ACTIVE  # Get changes nothing
        kmip.activate(uid)
        assert kmip.get(uid).value == key.value

    def test_create_get_attributes_activate_get_revoke_destroy_then_get_fails(self, kmip: Any) -> None:
        """SKLC-M-1-14 style: create, get attributes, activate, get, revoke (Cessation of
        Operation), destroy. Each step's state and date (§3.22 transitions 4, 6, 7); after
        Destroy only the attributes are left, and Get answers Illegal Operation ("Object
        exists and is not a Template, but the server only has attributes for this
        object", §11.12)."""
        name = unique("sklc key")
        uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
        created = attributes(kmip, uid)
        assert created[A.STATE.value] == [S.PRE_ACTIVE] and created[A.NAME.value] == [name]
        assert created[A.CRYPTOGRAPHIC_ALGORITHM.value] == [enums.CryptographicAlgorithm.AES]
        assert created[A.CRYPTOGRAPHIC_LENGTH.value] == [256]
        assert A.ACTIVATION_DATE.value not in created

        kmip.activate(uid)
        active = attributes(kmip, uid)
        assert active[A.STATE.value] == [S.ACTIVE] and A.ACTIVATION_DATE.value in active
        assert len(kmip.get(uid).value) == 32

        kmip.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, uid)
        revoked = attributes(kmip, uid)
        assert revoked[A.STATE.value] == [S.DEACTIVATED] and A.DEACTIVATION_DATE.value in revoked

        kmip.destroy(uid)
        destroyed = attributes(kmip, uid)
        assert destroyed[A.STATE.value] == [S.DESTROYED] and A.DESTROY_DATE.value in destroyed
        assert failure(lambda: kmip.get(uid)) == R.ILLEGAL_OPERATION

    @pytest.mark.parametrize("kind", REGISTRABLE)
    def test_register_twice_without_a_name(self, kmip: Any, kind: str) -> None:
        """SKLC-M style Register (§4.3) as a program writes it: register(SymmetricKey(...))
        with no name, so PyKMIP sends its default Name ("Symmetric Key", "Public Key",
        "Private Key", "Secret Data", "X.509 Certificate"), twice. PyKMIP's own server
        takes this; §3.2 asks names to be unique in a domain, and this server treats names
        as labels (migration 0009). Both objects exist, carry the default name, and each
        returns its own material."""
        first, second = registrable(kind), registrable(kind)
        default_name = first.names[0]
        uids = [kmip.register(first), kmip.register(second)]
        assert uids[0] != uids[1]
        found = set(locate(kmip, by_name(default_name)))
        for uid, sent in zip(uids, (first, second), strict=True):
            assert one(kmip, uid, A.NAME.value) == default_name
            assert uid in found
            kmip.activate(uid)
            assert kmip.get(uid).value == sent.value

    @pytest.mark.parametrize("kind", REGISTRABLE)
    def test_names_with_spaces_work_for_every_object_type(self, kmip: Any, kind: str) -> None:
        """§3.2: the Name Value "is intended to be in a form that humans are able to
        interpret". A name with spaces is taken by Create, CreateKeyPair and Register
        alike, returned as sent, and found by Locate."""
        name = unique(f"payroll {kind.replace('-', ' ')} 2024 Q3")
        uid = make(kmip, kind, name)
        assert one(kmip, uid, A.NAME.value) == name
        assert locate(kmip, by_name(name), attr(A.OBJECT_TYPE, OBJECT_TYPE[kind])) == [uid]

    def test_names_follow_one_rule_for_every_object_type(self, kmip: Any) -> None:
        """§3.2: "The key management system MAY specify rules by which the client creates
        valid names." One rule for every object type and operation (keyserver/core/names.py:
        1 to 128 characters, spaces allowed, no control characters): 128 characters are
        taken everywhere, 129 characters or a control character are refused everywhere
        with Invalid Field."""
        base = unique("rule") + " "
        longest = base + "x" * (128 - len(base))
        outcomes: dict[str, Any] = {}
        for kind in REGISTRABLE:
            uid = make(kmip, kind, longest)
            outcomes[f"{kind}: 128 characters"] = one(kmip, uid, A.NAME.value) == longest
            outcomes[f"{kind}: 129 characters"] = failure(partial(make, kmip, kind, longest + "y"))
            outcomes[f"{kind}: control character"] = failure(partial(make, kmip, kind, base + "bell\x07"))
        expected = {}
        for kind in REGISTRABLE:
            expected[f"{kind}: 128 characters"] = True
            expected[f"{kind}: 129 characters"] = R.INVALID_FIELD
            expected[f"{kind}: control character"] = R.INVALID_FIELD
        assert outcomes == expected

    def test_a_destroyed_keys_name_can_be_used_again(self, kmip: Any) -> None:
        """SKLC-M style: create with a name, destroy it (Pre-Active -> Destroyed, §3.22
        transition 2), create with the same name again. The name belongs to the live key;
        the destroyed one is found only by asking for its state."""
        name = unique("reused name")
        old = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
        kmip.destroy(old)
        new = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
        assert new != old
        assert one(kmip, new, A.NAME.value) == name
        assert locate(kmip, by_name(name)) == [new]
        assert locate(kmip, by_name(name), attr(A.STATE, S.DESTROYED)) == [old]

    def test_locate_leaves_out_destroyed_objects_unless_asked_for_that_state(self, kmip: Any) -> None:
        """Locate (§4.9) returns objects a program can use: a Destroyed object "SHALL NOT
        be used for any cryptographic purpose" (§3.22) and only its attributes remain
        (PyKMIP's own server deletes it outright). It is found again by naming its State."""
        name = unique("gone")
        key = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
        secret = kmip.register(registrable("secret-data", name=name))
        for uid in (key, secret):
            kmip.destroy(uid)
        everything = set(locate(kmip))
        assert key not in everything and secret not in everything
        assert locate(kmip, by_name(name)) == []
        assert sorted(locate(kmip, by_name(name), attr(A.STATE, S.DESTROYED))) == sorted([key, secret])
        destroyed = set(locate(kmip, attr(A.STATE, S.DESTROYED)))
        assert {key, secret} <= destroyed

    def test_the_clean_up_loop_locate_revoke_destroy_everything(self, kmip: Any) -> None:
        """The loop every KMIP client program ends up with: `for uid in locate(): revoke
        (Cessation of Operation); destroy`. It must run through objects in every state
        (Pre-Active, Active, Deactivated by ReKey, Compromised) and of every type, leave
        each Destroyed (Destroyed Compromised for the compromised key, §3.22 transition 9),
        and leave nothing for the next Locate. It acts on every object the client can see
        in this test session's store."""
        seeded: dict[str, str] = {}
        seeded["pre-active key"] = kmip.create(enums.CryptographicAlgorithm.AES, 256)
        seeded["active key"] = kmip.create(enums.CryptographicAlgorithm.AES, 256)
        kmip.activate(seeded["active key"])
        seeded["re-keyed key"] = kmip.create(enums.CryptographicAlgorithm.AES, 128)
        kmip.activate(seeded["re-keyed key"])
        seeded["replacement key"] = kmip.rekey(uid=seeded["re-keyed key"])
        seeded["compromised key"] = kmip.create(enums.CryptographicAlgorithm.AES, 256)
        kmip.activate(seeded["compromised key"])
        kmip.revoke(enums.RevocationReasonCode.KEY_COMPROMISE, seeded["compromised key"])
        seeded["public key"], seeded["private key"] = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)
        kmip.activate(seeded["private key"])
        seeded["registered public key"] = kmip.register(registrable("public-key"))
        seeded["secret data"] = kmip.register(registrable("secret-data"))
        kmip.activate(seeded["secret data"])
        seeded["certificate"] = kmip.register(registrable("certificate"))

        everything = locate(kmip)
        assert {k: uid for k, uid in seeded.items() if uid not in everything} == {}
        steps: tuple[tuple[str, Callable[[str], Any]], ...] = (
            ("revoke", partial(kmip.revoke, enums.RevocationReasonCode.CESSATION_OF_OPERATION)),
            ("destroy", kmip.destroy))
        problems = []
        for uid in everything:
            for op, step in steps:
                try:
                    step(uid)
                except KmipOperationFailure as e:
                    kind = [k for k, v in seeded.items() if v == uid] or ["other object"]
                    problems.append(f"{op} {kind[0]} {uid}: {e.reason.name} {e.message}")
                    break
        assert not problems, "\n".join(problems)
        states = {kind: state(kmip, uid) for kind, uid in seeded.items()}
        expected = {kind: S.DESTROYED for kind in seeded}
        expected["compromised key"] = S.DESTROYED_COMPROMISED
        assert states == expected
        assert locate(kmip) == []

    def test_rekey_of_an_active_key(self, kmip: Any) -> None:
        """SKLC-M style, Re-key (§4.4) of an Active key: a new Unique Identifier, new
        material of the same length, the name carried over, and (no Offset: the
        Activation Date is copied) the replacement is Active. The replaced key stays
        retrievable for processing."""
        name = unique("rekey active")
        old = kmip.create(enums.CryptographicAlgorithm.AES, 128, name=name)
        kmip.activate(old)
        old_material = kmip.get(old).value
        new = kmip.rekey(uid=old)
        assert new != old
        replacement = attributes(kmip, new)
        assert replacement[A.STATE.value] == [S.ACTIVE]
        assert replacement[A.CRYPTOGRAPHIC_LENGTH.value] == [128]
        assert replacement[A.NAME.value] == [name]
        new_material = kmip.get(new).value
        assert len(new_material) == 16 and new_material != old_material
        assert kmip.get(old).value == old_material

    def test_rekey_of_a_pre_active_key(self, kmip: Any) -> None:
        """SKLC-M style, Re-key (§4.4) of a Pre-Active key: "If no Offset is specified,
        the Activation Date ... values are copied from the existing key"; there is none,
        so the replacement is Pre-Active too (State "set based on attributes values, such
        as dates"), with new material of the same length and the name carried over."""
        name = unique("rekey pre-active")
        old = kmip.create(enums.CryptographicAlgorithm.AES, 192, name=name)
        new = kmip.rekey(uid=old)
        assert new != old
        replacement = attributes(kmip, new)
        assert replacement[A.STATE.value] == [S.PRE_ACTIVE]
        assert A.ACTIVATION_DATE.value not in replacement
        assert replacement[A.CRYPTOGRAPHIC_LENGTH.value] == [192]
        assert replacement[A.NAME.value] == [name]
        kmip.activate(new)
        assert len(kmip.get(new).value) == 24 and kmip.get(new).value != kmip.get(old).value

    def test_a_compromised_key_can_still_be_retrieved(self, kmip: Any) -> None:
        """SKLC-M style: revoke with Key Compromise (§4.20; §3.22 transition 5), then Get.
        Compromised material "SHOULD only be used to process cryptographically-protected
        information" (§3.22): it is retrievable, unchanged, with its Compromise Date."""
        uid = kmip.create(enums.CryptographicAlgorithm.AES, 256)
        kmip.activate(uid)
        material = kmip.get(uid).value
        kmip.revoke(enums.RevocationReasonCode.KEY_COMPROMISE, uid,
                    compromise_occurrence_date=int(time.time()) - 3600)
        revoked = attributes(kmip, uid)
        assert revoked[A.STATE.value] == [S.COMPROMISED] and A.COMPROMISE_DATE.value in revoked
        assert kmip.get(uid).value == material

    def test_get_attributes_naming_the_same_attribute_twice_is_refused(self, kmip: Any) -> None:
        """Get Attributes (§4.12): "The same attribute name SHALL NOT be present more than
        once in a request"; the Get Attributes error table (§11.13, Table 302): "The same
        Attribute Name is present more than once" -> Invalid Message, not Invalid Field.
        (§4.13 is Get Attribute List, which takes no names.)"""
        uid = kmip.create(enums.CryptographicAlgorithm.AES, 256)
        # PyKMIP's client drops a repeated name before sending: the request is built from
        # its primitives instead.
        names = [primitives.TextString(n, tag=enums.Tags.ATTRIBUTE_NAME)
                 for n in (A.STATE.value, A.NAME.value, A.STATE.value)]
        refused = send_raw(kmip, enums.Operation.GET_ATTRIBUTES,
                           primitives.TextString(uid, tag=enums.Tags.UNIQUE_IDENTIFIER), *names)
        assert (refused.status, refused.reason) == (enums.ResultStatus.OPERATION_FAILED, R.INVALID_MESSAGE)
        assert attributes(kmip, uid, [A.STATE.value]) == {A.STATE.value: [S.PRE_ACTIVE]}

    def test_contact_information_and_object_group_add_modify_delete_and_locate_by_group(self, kmip: Any) -> None:
        """SKLC-M style, the standard client-settable attributes Contact Information
        (§3.37) and Object Group (§3.33, multi-instance) on a symmetric key: Add Attribute
        (§4.14, through the codec: no ProxyKmipClient call), Modify Attribute (§4.15) and
        Delete Attribute (§4.16) with ProxyKmipClient's modify_attribute/delete_attribute,
        and Locate by Object Group (§4.9: "All attributes are allowed to be used")."""
        uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("grouped"))
        group = unique("backup keys")
        assert add_attribute(kmip, uid, A.CONTACT_INFORMATION, "ops team, room 4") == (uid, "ops team, room 4")
        assert add_attribute(kmip, uid, A.OBJECT_GROUP, group) == (uid, group)
        added = attributes(kmip, uid)
        assert added[A.CONTACT_INFORMATION.value] == ["ops team, room 4"]
        assert added[A.OBJECT_GROUP.value] == [group]
        assert locate(kmip, attr(A.OBJECT_GROUP, group)) == [uid]
        # Contact Information is single-instance: a second Add is refused (§11.15).
        assert failure(lambda: add_attribute(kmip, uid, A.CONTACT_INFORMATION, "someone else")) == \
            R.ILLEGAL_OPERATION

        got_uid, modified = kmip.modify_attribute(unique_identifier=uid,
                                                  attribute=attr(A.CONTACT_INFORMATION, "security desk"))
        assert got_uid == uid and plain(modified.attribute_value) == "security desk"
        got_uid, deleted = kmip.delete_attribute(unique_identifier=uid, attribute_name=A.OBJECT_GROUP.value)
        assert got_uid == uid and plain(deleted.attribute_value) == group

        after = attributes(kmip, uid)
        assert after[A.CONTACT_INFORMATION.value] == ["security desk"]
        assert A.OBJECT_GROUP.value not in after
        assert locate(kmip, attr(A.OBJECT_GROUP, group)) == []
        # Deleting what is not there: "No attribute with the specified name exists" (§11.17).
        assert failure(lambda: kmip.delete_attribute(unique_identifier=uid,
                                                     attribute_name=A.OBJECT_GROUP.value)) == R.ITEM_NOT_FOUND

    def test_object_group_on_the_other_object_types(self, kmip: Any) -> None:
        """Object Group "Applies to Object Types: All Objects" (§3.33): added to a public
        key, a private key, secret data and a certificate, it finds the four with one
        Locate, and once deleted, none."""
        group = unique("group of four")
        public, private = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)
        others = [public, private, kmip.register(registrable("secret-data")),
                  kmip.register(registrable("certificate"))]
        for uid in others:
            assert add_attribute(kmip, uid, A.OBJECT_GROUP, group) == (uid, group)
        assert sorted(locate(kmip, attr(A.OBJECT_GROUP, group))) == sorted(others)
        for uid in others:
            kmip.delete_attribute(unique_identifier=uid, attribute_name=A.OBJECT_GROUP.value)
        assert locate(kmip, attr(A.OBJECT_GROUP, group)) == []

    def test_locate_by_certificate_type(self, kmip: Any) -> None:
        """Locate (§4.9) by Certificate Type (§3.8: "SHALL always have a value", set by the
        server on Register): a registered X.509 certificate is found by it; a key is not."""
        name = unique("tls cert")
        cid = kmip.register(registrable("certificate", name=name))
        key = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=name)
        assert one(kmip, cid, A.CERTIFICATE_TYPE.value) == enums.CertificateType.X_509
        x509_type = attr(A.CERTIFICATE_TYPE, enums.CertificateType.X_509)
        assert locate(kmip, by_name(name), x509_type) == [cid]
        found = set(locate(kmip, x509_type))
        assert cid in found and key not in found


# =========================================================================================
# Basic Cryptographic Server (KMIP Profiles 1.x; test cases BC-M-* / CS-BC-M-*)
# =========================================================================================
def _active_aes(client: Any, bits: int = 256) -> tuple[str, bytes]:
    uid = client.create(enums.CryptographicAlgorithm.AES, bits)
    client.activate(uid)
    return uid, client.get(uid).value


class TestBasicCryptographicServer:
    def test_encrypt_and_decrypt_aes_gcm(self, kmip: Any) -> None:
        """CS-BC-M style, Encrypt (§4.29) and Decrypt (§4.30) with AES-GCM. At KMIP
        1.2 (the client's default) there is no Authenticated Encryption Tag field and
        client.encrypt/decrypt have no tag or AAD argument, so the 16-byte tag travels at
        the end of the ciphertext, as `cryptography`'s AESGCM writes it. With Random IV
        the server returns the IV it drew; with a client IV it returns none (§4.29) and the
        ciphertext is AESGCM's. A changed byte fails with Cryptographic Failure."""
        uid, key = _active_aes(kmip)
        data = b"attack at dawn: " + os.urandom(37)
        ciphertext, iv = kmip.encrypt(data, uid=uid, cryptographic_parameters=AES_GCM)
        assert iv is not None and len(ciphertext) == len(data) + 16
        assert AESGCM(key).decrypt(iv, ciphertext, None) == data
        assert kmip.decrypt(ciphertext, uid=uid, cryptographic_parameters=AES_GCM, iv_counter_nonce=iv) == data

        nonce = os.urandom(12)
        fixed = {**AES_GCM, "random_iv": False}
        ciphertext, returned = kmip.encrypt(data, uid=uid, cryptographic_parameters=fixed, iv_counter_nonce=nonce)
        assert returned is None and ciphertext == AESGCM(key).encrypt(nonce, data, None)

        tampered = bytes([ciphertext[0] ^ 1]) + ciphertext[1:]
        assert failure(lambda: kmip.decrypt(tampered, uid=uid, cryptographic_parameters=fixed,
                                            iv_counter_nonce=nonce)) == R.CRYPTOGRAPHIC_FAILURE

    def test_encrypt_and_decrypt_aes_cbc_with_pkcs5_padding(self, kmip: Any) -> None:
        """CS-BC-M style, Encrypt/Decrypt (§4.29, §4.30) with AES-CBC and PKCS5 padding:
        the ciphertext is whole blocks, `cryptography` opens it with the key and the
        returned IV, the server opens it, and with a client IV the ciphertext is exactly
        `cryptography`'s."""
        uid, key = _active_aes(kmip)
        data = os.urandom(45)
        ciphertext, iv = kmip.encrypt(data, uid=uid, cryptographic_parameters=AES_CBC_PKCS5)
        assert iv is not None and len(iv) == 16 and len(ciphertext) == 48
        decryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).decryptor()
        unpadder = padding.PKCS7(128).unpadder()
        padded = decryptor.update(ciphertext) + decryptor.finalize()
        assert unpadder.update(padded) + unpadder.finalize() == data
        assert kmip.decrypt(ciphertext, uid=uid, cryptographic_parameters=AES_CBC_PKCS5, iv_counter_nonce=iv) == data

        fixed_iv = os.urandom(16)
        fixed = {**AES_CBC_PKCS5, "random_iv": False}
        ciphertext, returned = kmip.encrypt(data, uid=uid, cryptographic_parameters=fixed, iv_counter_nonce=fixed_iv)
        padder = padding.PKCS7(128).padder()
        encryptor = Cipher(algorithms.AES(key), modes.CBC(fixed_iv)).encryptor()
        expected = encryptor.update(padder.update(data) + padder.finalize()) + encryptor.finalize()
        assert returned is None and ciphertext == expected

    def _signing_pair(self, client: Any) -> tuple[str, str, rsa.RSAPublicKey]:
        public_uid, private_uid = client.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)
        client.activate(public_uid)
        client.activate(private_uid)
        public = serialization.load_der_public_key(client.get(public_uid).value)
        assert isinstance(public, rsa.RSAPublicKey)
        return public_uid, private_uid, public

    def test_sign_and_signature_verify_rsa_pss_sha256(self, kmip: Any) -> None:
        """CS-BC-M style, Sign (§4.31) with the private key of a pair made by
        create_key_pair, parameters as PyKMIP's own sign demo gives them (RSA, PSS,
        SHA-256); `cryptography` verifies the signature with the pair's public key, and
        Signature Verify (§4.32) with the public key says Valid, and Invalid for other
        data."""
        public_uid, private_uid, public = self._signing_pair(kmip)
        params = {"cryptographic_algorithm": enums.CryptographicAlgorithm.RSA,
                  "padding_method": enums.PaddingMethod.PSS, "hashing_algorithm": enums.HashingAlgorithm.SHA_256}
        data = b"release 4.2.0 " + os.urandom(16)
        signature = kmip.sign(data, uid=private_uid, cryptographic_parameters=params)
        assert len(signature) == 256
        public.verify(signature, data, asym_padding.PSS(mgf=asym_padding.MGF1(hashes.SHA256()),
                                                        salt_length=asym_padding.PSS.AUTO), hashes.SHA256())
        assert kmip.signature_verify(data, signature, uid=public_uid, cryptographic_parameters=params) == \
            enums.ValidityIndicator.VALID
        assert kmip.signature_verify(data + b"!", signature, uid=public_uid, cryptographic_parameters=params) == \
            enums.ValidityIndicator.INVALID

    def test_sign_and_signature_verify_rsa_pkcs1v15_sha256(self, kmip: Any) -> None:
        """CS-BC-M style, Sign/Signature Verify (§4.31, §4.32) with PKCS#1 v1.5 and
        SHA-256, said the two ways Cryptographic Parameters allow (§3.6): padding and
        hashing, or Digital Signature Algorithm SHA256WithRSAEncryption. PKCS#1 v1.5 is
        deterministic: both give the same signature, which `cryptography` verifies."""
        public_uid, private_uid, public = self._signing_pair(kmip)
        by_parts = {"cryptographic_algorithm": enums.CryptographicAlgorithm.RSA,
                    "padding_method": enums.PaddingMethod.PKCS1v15, "hashing_algorithm": enums.HashingAlgorithm.SHA_256}
        by_name = {"digital_signature_algorithm": enums.DigitalSignatureAlgorithm.SHA256_WITH_RSA_ENCRYPTION}
        data = os.urandom(100)
        signature = kmip.sign(data, uid=private_uid, cryptographic_parameters=by_parts)
        public.verify(signature, data, asym_padding.PKCS1v15(), hashes.SHA256())
        assert kmip.sign(data, uid=private_uid, cryptographic_parameters=by_name) == signature
        for params in (by_parts, by_name):
            assert kmip.signature_verify(data, signature, uid=public_uid, cryptographic_parameters=params) == \
                enums.ValidityIndicator.VALID
        assert kmip.signature_verify(os.urandom(100), signature, uid=public_uid,
                                     cryptographic_parameters=by_parts) == enums.ValidityIndicator.INVALID

    def test_mac_and_mac_verify_with_an_hmac_sha256_key_made_at_the_clients_defaults(self, kmip: Any) -> None:
        """CS-BC-M style: client.create(HMAC_SHA256, 256) exactly so (PyKMIP then sends
        a Cryptographic Usage Mask of Encrypt|Decrypt, which means nothing for an HMAC
        key), activate, MAC (§4.33) with client.mac. The MAC is HMAC-SHA256 of the data
        under the key's material; the key's usage mask says MAC Generate and MAC Verify
        (an Active key is used only for what its mask allows, §3.22); MAC Verify (§4.34,
        through the codec: PyKMIP 0.11 has no call or payload for it) says Valid, and
        Invalid for another MAC."""
        uid = kmip.create(enums.CryptographicAlgorithm.HMAC_SHA256, 256)
        kmip.activate(uid)
        created = attributes(kmip, uid)
        assert created[A.CRYPTOGRAPHIC_ALGORITHM.value] == [enums.CryptographicAlgorithm.HMAC_SHA256]
        assert created[A.CRYPTOGRAPHIC_LENGTH.value] == [256]
        mask = usage(created[A.CRYPTOGRAPHIC_USAGE_MASK.value][0])
        assert {enums.CryptographicUsageMask.MAC_GENERATE, enums.CryptographicUsageMask.MAC_VERIFY} <= mask
        data = b"ledger line 1042 " + os.urandom(20)
        got_uid, mac = kmip.mac(data, uid=uid, algorithm=enums.CryptographicAlgorithm.HMAC_SHA256)
        key = kmip.get(uid).value
        assert got_uid == uid and len(key) == 32
        assert mac == hmac.new(key, data, hashlib.sha256).digest()

        verified = mac_verify(kmip, uid, data, mac, enums.CryptographicAlgorithm.HMAC_SHA256)
        assert (verified.status, verified.reason) == (enums.ResultStatus.SUCCESS, None), verified.message
        assert verified.enum(enums.Tags.VALIDITY_INDICATOR, enums.ValidityIndicator) == enums.ValidityIndicator.VALID
        wrong = mac_verify(kmip, uid, data, bytes(32), enums.CryptographicAlgorithm.HMAC_SHA256)
        assert wrong.status == enums.ResultStatus.SUCCESS, wrong.message
        assert wrong.enum(enums.Tags.VALIDITY_INDICATOR, enums.ValidityIndicator) == enums.ValidityIndicator.INVALID

    def test_rng_retrieve_returns_the_requested_number_of_random_bytes(self, kmip: Any) -> None:
        """CS-RNG-M style, RNG Retrieve (§4.35) through the codec (no ProxyKmipClient call,
        no PyKMIP 0.11 payload): Data Length 32 gives 32 bytes of Data, and two draws
        differ."""
        draws = [rng_retrieve(kmip, 32) for _ in range(2)]
        for draw in draws:
            assert (draw.status, draw.reason) == (enums.ResultStatus.SUCCESS, None), draw.message
            assert len(draw.payload[enums.Tags.DATA.value][0]) == 32
        assert draws[0].payload[enums.Tags.DATA.value] != draws[1].payload[enums.Tags.DATA.value]

    def test_a_deactivated_key_decrypts_but_does_not_encrypt(self, kmip: Any) -> None:
        """§3.22: a Deactivated object "SHALL NOT be used for applying cryptographic
        protection" but may "process cryptographically-protected information". After
        revoke (Cessation of Operation), what was encrypted still decrypts; Encrypt is
        refused."""
        uid, _ = _active_aes(kmip)
        data = os.urandom(40)
        ciphertext, iv = kmip.encrypt(data, uid=uid, cryptographic_parameters=AES_CBC_PKCS5)
        kmip.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, uid)
        assert state(kmip, uid) == S.DEACTIVATED
        assert kmip.decrypt(ciphertext, uid=uid, cryptographic_parameters=AES_CBC_PKCS5, iv_counter_nonce=iv) == data
        assert failure(lambda: kmip.encrypt(data, uid=uid, cryptographic_parameters=AES_CBC_PKCS5)) in \
            NOT_PERMITTED

    def test_the_cryptographic_usage_mask_is_enforced(self, kmip: Any) -> None:
        """§3.19/§3.22: an Active key "SHALL only be used for all cryptographic purposes that
        are allowed by its Cryptographic Usage Mask" (set by the client on Register,
        §3.19). The same AES material registered twice, once with the mask Encrypt alone
        and once with Decrypt alone (pie.SymmetricKey(masks=[...])): each key reports the
        mask it was given and does only that, so what one encrypts the other decrypts."""
        material = os.urandom(32)
        encrypting, decrypting = (
            kmip.register(pie.SymmetricKey(enums.CryptographicAlgorithm.AES, 256, material, masks=[mask]))
            for mask in (enums.CryptographicUsageMask.ENCRYPT, enums.CryptographicUsageMask.DECRYPT))
        for uid, mask in ((encrypting, enums.CryptographicUsageMask.ENCRYPT),
                          (decrypting, enums.CryptographicUsageMask.DECRYPT)):
            kmip.activate(uid)
            assert usage(one(kmip, uid, A.CRYPTOGRAPHIC_USAGE_MASK.value)) == {mask}
        data = os.urandom(20)
        ciphertext, iv = kmip.encrypt(data, uid=encrypting, cryptographic_parameters=AES_GCM)
        assert AESGCM(material).decrypt(iv, ciphertext, None) == data
        assert kmip.decrypt(ciphertext, uid=decrypting, cryptographic_parameters=AES_GCM, iv_counter_nonce=iv) == data
        assert failure(lambda: kmip.decrypt(ciphertext, uid=encrypting, cryptographic_parameters=AES_GCM,
                                            iv_counter_nonce=iv)) in NOT_PERMITTED
        assert failure(lambda: kmip.encrypt(data, uid=decrypting, cryptographic_parameters=AES_GCM)) in \
            NOT_PERMITTED


# =========================================================================================
# Asymmetric Key Lifecycle Server (KMIP Profiles 1.x; test cases AKLC-M-*)
# =========================================================================================
class TestAsymmetricKeyLifecycleServer:
    def test_create_key_pair_activate_get_both_halves_revoke_destroy(self, kmip: Any) -> None:
        """AKLC-M style: create_key_pair(RSA, 2048) with the client's defaults (no names,
        no masks), both halves Pre-Active; activate both; get the public key (X.509 by
        default; PKCS#1 on request, through KMIPProxy.get since ProxyKmipClient.get takes
        no Key Format Type) and the private key (PKCS#8), which match; revoke both
        (Deactivated), destroy both (Destroyed), after which Get finds only attributes
        (Illegal Operation, §11.12)."""
        public_uid, private_uid = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)
        assert (state(kmip, public_uid), state(kmip, private_uid)) == (S.PRE_ACTIVE, S.PRE_ACTIVE)
        kmip.activate(public_uid)
        kmip.activate(private_uid)

        public = kmip.get(public_uid)
        assert public.object_type == enums.ObjectType.PUBLIC_KEY
        assert public.key_format_type == enums.KeyFormatType.X_509
        public_key = serialization.load_der_public_key(public.value)
        assert isinstance(public_key, rsa.RSAPublicKey) and public_key.key_size == 2048
        result = kmip.proxy.get(public_uid, key_format_type=misc.KeyFormatType(enums.KeyFormatType.PKCS_1))
        assert result.result_status.value == enums.ResultStatus.SUCCESS
        pkcs1 = kmip.object_factory.convert(result.secret)
        assert pkcs1.key_format_type == enums.KeyFormatType.PKCS_1
        assert pkcs1.value == public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1)

        private = kmip.get(private_uid)
        assert private.object_type == enums.ObjectType.PRIVATE_KEY
        assert private.key_format_type == enums.KeyFormatType.PKCS_8
        private_key = serialization.load_der_private_key(private.value, None)
        assert isinstance(private_key, rsa.RSAPrivateKey)
        assert private_key.public_key().public_numbers() == public_key.public_numbers()

        for uid in (private_uid, public_uid):
            kmip.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, uid)
            assert state(kmip, uid) == S.DEACTIVATED
            kmip.destroy(uid)
            assert state(kmip, uid) == S.DESTROYED
            assert failure(partial(kmip.get, uid)) == R.ILLEGAL_OPERATION

    def test_register_a_public_and_a_private_key_made_with_cryptography(self, kmip: Any) -> None:
        """AKLC-M style (TC-82 "Register Both Halves of a Key Pair"): an RSA key made with
        `cryptography`, its public half registered as X.509 SubjectPublicKeyInfo and its
        private half as PKCS#8. Each is Pre-Active (§3.22 transition 1: "When an object is
        created or registered, it automatically goes from non-existent to Pre-Active"),
        activates, and is returned in the format it was registered in (§4.11)."""
        key = rsa_private_key()
        public_uid = kmip.register(pie.PublicKey(enums.CryptographicAlgorithm.RSA, 2048, spki(key),
                                                 enums.KeyFormatType.X_509))
        private_uid = kmip.register(pie.PrivateKey(enums.CryptographicAlgorithm.RSA, 2048, pkcs8(key),
                                                   enums.KeyFormatType.PKCS_8))
        for uid, object_type in ((public_uid, enums.ObjectType.PUBLIC_KEY),
                                 (private_uid, enums.ObjectType.PRIVATE_KEY)):
            registered = attributes(kmip, uid)
            assert registered[A.OBJECT_TYPE.value] == [object_type]
            assert registered[A.CRYPTOGRAPHIC_ALGORITHM.value] == [enums.CryptographicAlgorithm.RSA]
            assert registered[A.CRYPTOGRAPHIC_LENGTH.value] == [2048]
            assert registered[A.STATE.value] == [S.PRE_ACTIVE]
            kmip.activate(uid)
            assert state(kmip, uid) == S.ACTIVE
        public = kmip.get(public_uid)
        assert (public.key_format_type, public.value) == (enums.KeyFormatType.X_509, spki(key))
        private = kmip.get(private_uid)
        assert (private.key_format_type, private.value) == (enums.KeyFormatType.PKCS_8, pkcs8(key))

    def test_the_halves_of_a_pair_name_each_other_in_readable_attributes(self, kmip: Any) -> None:
        """AKLC-M style: each half of a pair points at the other (KMIP's Link, §3.35, with
        Link Types Public Key Link / Private Key Link). PyKMIP 0.11 cannot decode a Link
        attribute (its attribute factory raises NotImplementedError), so the server carries
        the links as custom attributes: GetAttributes with no names must decode, and name
        the other half."""
        public_uid, private_uid = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)
        public = attributes(kmip, public_uid)
        private = attributes(kmip, private_uid)
        assert public["x-strongroom-linked-private-key"] == [private_uid]
        assert private["x-strongroom-linked-public-key"] == [public_uid]
        assert usage(public[A.CRYPTOGRAPHIC_USAGE_MASK.value][0]) >= {enums.CryptographicUsageMask.VERIFY}
        assert usage(private[A.CRYPTOGRAPHIC_USAGE_MASK.value][0]) >= {enums.CryptographicUsageMask.SIGN}
