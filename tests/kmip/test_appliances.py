"""Appliance profiles, at the wire level: each vendor's KMIP sequence, as its public
documentation and the public record describe it, driven through PyKMIP's client and
codec against the real listener over mutual TLS (client certificates from Strongroom's
CA), TLS session resumption with Python's `ssl` included.

No vendor's binary runs here: each test re-enacts what the vendor documents, and says
which steps are documented and which are inferred. Each test records its steps into the
per-client interop matrix of docs/kmip.md (tests/kmip/matrix.py) and fails when the
committed row differs from what it ran (regenerate: `scripts/kmip_matrix.py`).
"""

from __future__ import annotations

import os
import socket
import ssl
import uuid
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding as asym_padding
from cryptography.hazmat.primitives.asymmetric import rsa
from kmip.core import enums, misc
from kmip.core.factories.attributes import AttributeFactory
from kmip.core.messages import payloads
from kmip.core.objects import TemplateAttribute
from kmip.pie import objects as pie

from keyserver.kmip.listener import KmipListener
from tests.kmip import raw
from tests.kmip.conftest import ClientFiles, make_client, verifying_context
from tests.kmip.matrix import Run

A = enums.AttributeType
F = AttributeFactory()
U = enums.CryptographicUsageMask


def _client(files: ClientFiles, port: int, version: enums.KMIPVersion) -> Any:
    client = make_client(files, port)
    client.kmip_version = version
    client.open()
    return client


def _resumed(files: ClientFiles, port: int, *, tls: ssl.TLSVersion) -> tuple[bool, str]:
    """Two connections from one client context, the second offering the first's session
    (as an appliance that reconnects per operation does): a Query on the first, a Locate
    (which needs the identity's keys:read) on the second, so the client certificate must
    be known on the resumed session too. Returns whether it was resumed, and the protocol."""
    ctx = verifying_context(files)
    ctx.maximum_version = tls
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                         server_hostname="localhost") as first:
        assert raw.roundtrip(first, raw.query_request()).batch_items[0].result_status.value == \
            enums.ResultStatus.SUCCESS
        session = first.session  # in TLS 1.3 the ticket arrives with the first response
        assert session is not None
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="localhost",
                         session=session) as second:
        reply = raw.roundtrip(second, raw.request([(enums.Operation.LOCATE, payloads.LocateRequestPayload(
            maximum_items=1))]))
        assert reply.batch_items[0].result_status.value == enums.ResultStatus.SUCCESS, \
            reply.batch_items[0].result_message
        return bool(second.session_reused), str(second.version())


def _names(attrs: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for a in attrs:
        out.setdefault(str(a.attribute_name.value), []).append(a)
    return out


def test_vsphere_standard_key_provider(kmip_files: Callable[[str], ClientFiles], kmip_listener: KmipListener) -> None:
    """vSphere 7/8, Standard Key Provider (a KMIP 1.1 client).

    Documented (VMware vSphere Security, "Standard Key Provider" / "Set Up the Standard
    Key Provider"; the KMIP 1.1 requirement and AES-256 keys): vCenter trusts the KMS
    with a client certificate, checks the connection, and asks the KMS to create an
    AES-256 key per cluster/VM encryption key, which it then retrieves and caches.
    Inferred from the public record of KMS vendors' vSphere notes: the status check is
    DiscoverVersions and Query; Create carries a Name, the Usage Mask Encrypt|Decrypt and a
    vendor custom attribute (here `x-vcenter-cluster`); keys must be Active before use (an
    Activate after Create); GetAttributes asks for State and Name (and reads Name's
    Attribute Index); the key is found again by Name; vCenter reconnects per request and
    offers its TLS session again."""
    files = kmip_files("kmip-client")
    port = kmip_listener.port
    run = Run("VMware vSphere 7/8 standard key provider", "test_vsphere_standard_key_provider", "1.1")
    client = _client(files, port, enums.KMIPVersion.KMIP_1_1)
    name = f"vc-{uuid.uuid4()}"[:40]
    try:
        with run.step("DiscoverVersions"):
            versions = client.proxy.discover_versions(protocol_versions=None).protocol_versions
            assert (1, 1) in [(v.major, v.minor) for v in versions]
        with run.step("Query (Operations, Objects)"):
            result = client.proxy.query(query_functions=[enums.QueryFunction.QUERY_OPERATIONS,
                                                         enums.QueryFunction.QUERY_OBJECTS])
            ops = set(result.operations)
            for op in (enums.Operation.CREATE, enums.Operation.GET, enums.Operation.ACTIVATE,
                       enums.Operation.GET_ATTRIBUTES, enums.Operation.LOCATE):
                assert op in ops
        with run.step("Create AES-256 (Name, Usage Mask Encrypt|Decrypt, x-vcenter-cluster)"):
            template = TemplateAttribute(attributes=[
                F.create_attribute(A.CRYPTOGRAPHIC_ALGORITHM, enums.CryptographicAlgorithm.AES),
                F.create_attribute(A.CRYPTOGRAPHIC_LENGTH, 256),
                F.create_attribute(A.NAME, name),
                F.create_attribute(A.CRYPTOGRAPHIC_USAGE_MASK, [U.ENCRYPT, U.DECRYPT]),
                F.create_attribute("x-vcenter-cluster", "domain-c8")])
            created = client.proxy.create(enums.ObjectType.SYMMETRIC_KEY, template)
            assert created.result_status.value == enums.ResultStatus.SUCCESS, created.result_message
            uid = created.uuid
        with run.step("Activate"):
            client.activate(uid)
        with run.step("GetAttributes (State, Name: index 0, x-vcenter-cluster)"):
            _, attrs = client.get_attributes(uid, [A.STATE.value, A.NAME.value, "x-vcenter-cluster"])
            got = _names(attrs)
            assert got[A.STATE.value][0].attribute_value.value == enums.State.ACTIVE
            assert got[A.NAME.value][0].attribute_value.name_value.value == name
            assert got[A.NAME.value][0].attribute_index.value == 0
            assert got["x-vcenter-cluster"][0].attribute_value.value == "domain-c8"
        with run.step("Get (Raw, 32 bytes)"):
            key = client.get(uid)
            assert isinstance(key, pie.SymmetricKey) and len(key.value) == 32
        with run.step("Locate by Name (one id)"):
            assert client.locate(attributes=[F.create_attribute(A.NAME, name)]) == [uid]
    finally:
        client.close()
    with run.step("reconnect: Locate on a resumed TLS session"):
        reused, version = _resumed(files, port, tls=ssl.TLSVersion.TLSv1_2)
        assert reused, version
    run.tls = "TLS 1.2, session resumed on reconnect"
    run.finish()


def test_synology_dsm7_key_vault(kmip_files: Callable[[str], ClientFiles], kmip_listener: KmipListener) -> None:
    """Synology DSM 7.2, encryption key vault on a KMIP server (volume/share encryption).

    Documented (Synology Knowledge Center, DSM 7.2 "Encryption Key Vault" → KMIP, and
    "Enable KMIP"): DSM connects to an external KMIP server with a client certificate and
    keeps its volume encryption keys (key-encryption keys of its volumes) there instead of
    locally. From the public record (Synology as a KMIP client against PyKMIP-based
    servers): DSM **registers** the key as **Secret Data** with a Cryptographic Usage Mask
    of **Verify**, activates it and reads it back with Get when a volume is unlocked.
    Inferred: the KMIP 1.2 protocol version (what DSM's client offers first), the Name
    DSM gives the secret, a Locate by Name before unlocking, and GetAttributes for State."""
    files = kmip_files("kmip-client")
    port = kmip_listener.port
    run = Run("Synology DSM 7.2 key vault", "test_synology_dsm7_key_vault", "1.2")
    client = _client(files, port, enums.KMIPVersion.KMIP_1_2)
    name = f"dsm-volume1-{uuid.uuid4().hex[:12]}"
    kek = os.urandom(32)
    try:
        with run.step("Register Secret Data (Password, Usage Mask Verify, Name)"):
            secret = pie.SecretData(kek, enums.SecretDataType.PASSWORD, masks=[U.VERIFY], name=name)
            uid = client.register(secret)
        with run.step("Activate"):
            client.activate(uid)
        with run.step("Locate by Name (one id)"):
            assert client.locate(attributes=[F.create_attribute(A.NAME, name)]) == [uid]
        with run.step("GetAttributes (State, Cryptographic Usage Mask)"):
            _, attrs = client.get_attributes(uid, [A.STATE.value, A.CRYPTOGRAPHIC_USAGE_MASK.value])
            got = _names(attrs)
            assert got[A.STATE.value][0].attribute_value.value == enums.State.ACTIVE
            mask = int(got[A.CRYPTOGRAPHIC_USAGE_MASK.value][0].attribute_value.value)
            assert mask & U.VERIFY.value, mask
        with run.step("Get (Opaque, the same 32 bytes)"):
            back = client.get(uid)
            assert isinstance(back, pie.SecretData) and back.value == kek
    finally:
        client.close()
    run.tls = "new session per connection"
    run.finish()


def test_veeam_br12_key_pair(kmip_files: Callable[[str], ClientFiles], kmip_listener: KmipListener) -> None:
    """Veeam Backup & Replication 12, KMS server for encryption (backup jobs).

    Documented (Veeam Help Center, "KMS Servers" / "How KMS Encryption Works"): Veeam asks
    the KMS to generate an **asymmetric key pair**; it encrypts each job's storage key with
    the **public key** on its side and, to restore, sends the encrypted storage key to the
    KMS, which **decrypts** it with the private key that never leaves the KMS. KMIP 1.2+
    over mutual TLS. From the public record: Veeam's backup proxies reconnect often and
    expect **TLS session resumption**; Get of the private key is asked of some servers
    (export, PKCS#8 or PKCS#1). Inferred: RSA 2048, OAEP with SHA-1 (what a token without OAEP-256
    decryption serves), Activate of both halves, Get of the public key as X.509
    SubjectPublicKeyInfo (PyKMIP's default format), and the session over TLS 1.3."""
    files = kmip_files("kmip-client")
    port = kmip_listener.port
    run = Run("Veeam Backup & Replication 12", "test_veeam_br12_key_pair", "1.2")
    client = _client(files, port, enums.KMIPVersion.KMIP_1_2)
    storage_key = os.urandom(32)
    try:
        with run.step("CreateKeyPair RSA-2048"):
            public_uid, private_uid = client.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048)
        with run.step("Activate (both halves)"):
            client.activate(public_uid)
            client.activate(private_uid)
        with run.step("Get public key (X.509)"):
            public = client.get(public_uid)
            assert isinstance(public, pie.PublicKey)
            assert public.key_format_type == enums.KeyFormatType.X_509
            loaded = serialization.load_der_public_key(public.value)
            assert isinstance(loaded, rsa.RSAPublicKey) and loaded.key_size == 2048
        with run.step("encrypt storage key locally (RSA-OAEP SHA-1)"):
            oaep = asym_padding.OAEP(mgf=asym_padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(),  # noqa: S303 (OAEP)
                                     label=None)
            wrapped = loaded.encrypt(storage_key, oaep)
        with run.step("Decrypt (RSA-OAEP) with the private key"):
            params = {"padding_method": enums.PaddingMethod.OAEP, "hashing_algorithm": enums.HashingAlgorithm.SHA_1,
                      "cryptographic_algorithm": enums.CryptographicAlgorithm.RSA}
            assert client.decrypt(wrapped, uid=private_uid, cryptographic_parameters=params) == storage_key
        with run.step("Get private key (PKCS#8)"):
            private = client.get(private_uid)
            assert isinstance(private, pie.PrivateKey)
            assert private.key_format_type == enums.KeyFormatType.PKCS_8
            opened = serialization.load_der_private_key(private.value, password=None)
            assert isinstance(opened, rsa.RSAPrivateKey)
            assert opened.decrypt(wrapped, oaep) == storage_key
        with run.step("Get private key (PKCS#1)"):
            result = client.proxy.get(private_uid, key_format_type=misc.KeyFormatType(enums.KeyFormatType.PKCS_1))
            assert result.result_status.value == enums.ResultStatus.SUCCESS, result.result_message
            pkcs1 = client.object_factory.convert(result.secret)
            assert pkcs1.key_format_type == enums.KeyFormatType.PKCS_1
            assert pkcs1.value == opened.private_bytes(serialization.Encoding.DER,
                                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                                       serialization.NoEncryption())
    finally:
        client.close()
    with run.step("reconnect: Locate on a resumed TLS session"):
        reused, version = _resumed(files, port, tls=ssl.TLSVersion.TLSv1_3)
        assert reused, version
    run.tls = "TLS 1.3, session resumed on reconnect"
    run.finish()


def test_fortigate_locate_by_name(kmip_files: Callable[[str], ClientFiles], kmip_listener: KmipListener) -> None:
    """FortiGate (FortiOS 7.x), KMIP client for its keys.

    Documented (FortiOS Administration Guide, "KMIP" / `config vpn kmip-server`): FortiOS
    connects to a KMIP server with a client certificate and keeps keys there by name,
    reading them by name. From the public record: FortiGate Locates a key **by Name and
    expects exactly one identifier** per name, then Gets it; on removal it Revokes and
    Destroys. Inferred: KMIP 1.4, an AES-256 key Created (then Activated) by FortiGate
    itself, a rotation (ReKey) after which a Locate by Name with State Active still finds
    exactly one id (the older version is Deactivated), and that a destroyed key's name
    finds nothing."""
    files = kmip_files("kmip-client")
    port = kmip_listener.port
    run = Run("FortiGate (FortiOS 7)", "test_fortigate_locate_by_name", "1.4")
    client = _client(files, port, enums.KMIPVersion.KMIP_1_4)
    name = f"fgt-{uuid.uuid4().hex[:16]}"
    by_name = F.create_attribute(A.NAME, name)
    active = F.create_attribute(A.STATE, enums.State.ACTIVE)
    try:
        with run.step("Create AES-256 (Name)"):
            uid = client.create(enums.CryptographicAlgorithm.AES, 256, name=name)
        with run.step("Activate"):
            client.activate(uid)
        with run.step("Locate by Name (exactly one id)"):
            assert client.locate(attributes=[by_name]) == [uid]
        with run.step("Get"):
            assert len(client.get(uid).value) == 32
        with run.step("ReKey, then Locate by Name + State Active (exactly one id, the new one)"):
            new = client.proxy.rekey(uuid=uid).get("unique_identifier")
            assert new and new != uid
            assert client.locate(attributes=[by_name, active]) == [new]
        with run.step("Revoke (cessation of operation)"):
            client.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, new)
        with run.step("Destroy (both versions)"):
            client.destroy(new)
            client.destroy(uid)
        with run.step("Locate by Name (none)"):
            assert client.locate(attributes=[by_name]) == []
    finally:
        client.close()
    run.finish()


def test_the_matrix_has_one_row_per_appliance_test_and_no_other() -> None:
    """A row whose test was removed or renamed is not left behind (each test checks its own)."""
    import sys

    from tests.kmip.matrix import committed_rows
    module = sys.modules[__name__]
    me = "test_the_matrix_has_one_row_per_appliance_test_and_no_other"
    tests = {n for n in dir(module) if n.startswith("test_") and n != me}
    rows = committed_rows()
    assert len(rows) == len(tests)
    assert {r.split("(`", 1)[1].split("`)", 1)[0] for r in rows} == tests
