"""Who may connect and what they may do: client certificates, revocation, roles."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kmip.core import enums
from kmip.pie.exceptions import KmipOperationFailure

from keyserver.core.principal import system_context
from keyserver.kmip.listener import KmipListener
from tests.conftest import Actor, unique
from tests.kmip.conftest import ClientFiles, make_client
from tests.kmip.raw import connect, decode, query_request, read_response, roundtrip


def test_auditor_may_read_but_not_create_or_destroy(kmip_files: Callable[..., ClientFiles],
                                                    kmip_listener: KmipListener, kmip: Any,
                                                    officer_files: ClientFiles) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("forauditor"))
    # In the officer's group (KMIP tenancy): what is tested here is the role.
    auditor = make_client(kmip_files("auditor", officer_files.group), kmip_listener.port)
    with auditor:
        assert auditor.get_attributes(uid)[0] == uid
        for call in (lambda: auditor.create(enums.CryptographicAlgorithm.AES, 256, name=unique("no")),
                     lambda: auditor.destroy(uid), lambda: auditor.activate(uid)):
            with pytest.raises(KmipOperationFailure) as e:
                call()
            assert e.value.reason == enums.ResultReason.PERMISSION_DENIED
    kmip.activate(uid)
    with auditor, pytest.raises(KmipOperationFailure) as e:
        auditor.get(uid)  # plaintext export needs keys:export
    assert e.value.reason == enums.ResultReason.PERMISSION_DENIED


def test_operator_may_rekey_but_not_export_in_plaintext_nor_destroy(kmip_files: Callable[..., ClientFiles],
                                                                    kmip_listener: KmipListener, kmip: Any,
                                                                    officer_files: ClientFiles) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("foroperator"))
    kmip.activate(uid)
    with make_client(kmip_files("operator", officer_files.group), kmip_listener.port) as operator:
        with pytest.raises(KmipOperationFailure) as e:
            operator.get(uid)  # plaintext is for key officers and programs (kmip-client)
        assert e.value.reason == enums.ResultReason.PERMISSION_DENIED
        new = operator.rekey(uid=uid)
        with pytest.raises(KmipOperationFailure) as e:
            operator.revoke(enums.RevocationReasonCode.SUPERSEDED, new)
        assert e.value.reason == enums.ResultReason.PERMISSION_DENIED


def test_revoked_client_is_refused_at_once(actors: dict[str, Actor], kmip_listener: KmipListener,
                                           tmp_path: Any) -> None:
    admin: httpx.Client = actors["admin"].client
    r = admin.post("/api/v1/kmip/clients", json={"name": unique("torevoke"), "role": "operator"})
    assert r.status_code == 201, r.text
    body = r.json()
    for fname, key in (("cert.pem", "certificate_pem"), ("key.pem", "private_key_pem"),
                       ("ca.pem", "ca_certificate_pem")):
        (tmp_path / fname).write_text(body[key])
    files = ClientFiles(body["client"]["name"], body["client"]["id"], tmp_path / "cert.pem", tmp_path / "key.pem",
                        tmp_path / "ca.pem")
    with connect(files, kmip_listener.port) as conn:
        ok = roundtrip(conn, query_request())
        assert ok.batch_items[0].result_status.value == enums.ResultStatus.SUCCESS
        assert admin.delete(f"/api/v1/kmip/clients/{files.client_id}").status_code == 200
        # The very next request on the open connection is refused, then the connection closes.
        refused = roundtrip(conn, query_request())
        assert refused.batch_items[0].result_reason.value == enums.ResultReason.PERMISSION_DENIED
        with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
            conn.sendall(query_request())
            read_response(conn)
    with connect(files, kmip_listener.port) as conn:  # and a new connection too
        first = decode(read_response(conn))
        assert first.batch_items[0].result_reason.value == enums.ResultReason.PERMISSION_DENIED
    listed = {c["id"]: c for c in admin.get("/api/v1/kmip/clients").json()}
    assert listed[files.client_id]["revoked_at"] is not None


def test_no_client_certificate_is_refused(kmip_listener: KmipListener, officer_files: ClientFiles) -> None:
    ctx = ssl.create_default_context(cafile=str(officer_files.ca))
    with socket.create_connection(("127.0.0.1", kmip_listener.port), timeout=10) as raw, \
            pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        conn = ctx.wrap_socket(raw, server_hostname="localhost")
        conn.sendall(query_request())  # TLS 1.3 reports the missing certificate on first read
        read_response(conn)


def test_foreign_ca_certificate_is_refused(kmip_listener: KmipListener, officer_files: ClientFiles,
                                           tmp_path: Any) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "intruder")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(__import__("datetime").datetime(2020, 1, 1))
            .not_valid_after(__import__("datetime").datetime(2040, 1, 1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("intruder")]), critical=False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "k.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    ctx = ssl.create_default_context(cafile=str(officer_files.ca))
    ctx.load_cert_chain(str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
    with socket.create_connection(("127.0.0.1", kmip_listener.port), timeout=10) as raw, \
            pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        conn = ctx.wrap_socket(raw, server_hostname="localhost")
        conn.sendall(query_request())
        read_response(conn)


def test_server_certificate_names_and_tls_versions(kmip_listener: KmipListener, officer_files: ClientFiles) -> None:
    from tests.kmip.conftest import verifying_context

    for host in ("localhost", "127.0.0.1"):
        with socket.create_connection(("127.0.0.1", kmip_listener.port), timeout=10) as raw, \
                verifying_context(officer_files).wrap_socket(raw, server_hostname=host) as conn:
            assert conn.version() in ("TLSv1.2", "TLSv1.3")
    # A name the certificate does not carry fails verification on the client.
    with socket.create_connection(("127.0.0.1", kmip_listener.port), timeout=10) as raw, \
            pytest.raises(ssl.SSLCertVerificationError):
        verifying_context(officer_files).wrap_socket(raw, server_hostname="not-the-server.example")
    # TLS 1.2 offers forward-secret suites only; TLS 1.1 is refused.
    ctx = verifying_context(officer_files)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection(("127.0.0.1", kmip_listener.port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as conn:
        cipher = conn.cipher()
        assert cipher is not None and cipher[0].startswith("ECDHE")


def test_csr_flow_over_rest(actors: dict[str, Actor]) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ignored")]))
           .sign(key, hashes.SHA256()))
    name = unique("csr")
    r = actors["admin"].client.post("/api/v1/kmip/clients", json={
        "name": name, "role": "auditor", "csr": csr.public_bytes(serialization.Encoding.PEM).decode()})
    assert r.status_code == 201, r.text
    assert r.json()["private_key_pem"] is None
    cert = x509.load_pem_x509_certificate(r.json()["certificate_pem"].encode())
    assert cert.public_key() == key.public_key()
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [name]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in eku
    bad = actors["admin"].client.post("/api/v1/kmip/clients", json={"name": "Not_A_DNS_Name", "role": "auditor"})
    assert bad.status_code in (400, 422)


def _issued(admin: httpx.Client, tmp_path: Any, **body: Any) -> ClientFiles:
    r = admin.post("/api/v1/kmip/clients", json={"name": unique("export"), **body})
    assert r.status_code == 201, r.text
    issued = r.json()
    d = tmp_path / issued["client"]["name"]
    d.mkdir()
    for fname, key in (("cert.pem", "certificate_pem"), ("key.pem", "private_key_pem"),
                       ("ca.pem", "ca_certificate_pem")):
        (d / fname).write_text(issued[key])
    return ClientFiles(issued["client"]["name"], issued["client"]["id"], d / "cert.pem", d / "key.pem",
                       d / "ca.pem")


def test_a_client_limited_to_wrapped_export_gets_keys_only_wrapped(
        actors: dict[str, Actor], kmip_listener: KmipListener, kmip: Any, tmp_path: Any,
        services: Any, officer_files: ClientFiles) -> None:
    """The per-client key-export setting: KMIP's behaviour (plaintext) by default; a
    client set to "wrapped" receives keys only wrapped under another key inside the HSM,
    one set to "none" no material at all; each refusal is Permission Denied, audited, and
    a change applies to the client's very next request (REST PATCH, every replica)."""
    from cryptography.hazmat.primitives.asymmetric import padding

    admin: httpx.Client = actors["admin"].client
    files = _issued(admin, tmp_path, role="key-officer", key_export="wrapped", group=officer_files.group)
    assert admin.get("/api/v1/kmip/clients").json()[-1]["key_export"] in ("plaintext", "wrapped", "none")
    wrapper, spec = _rsa_wrapping(kmip)
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("exportable"))
    kmip.activate(uid)
    oaep = padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None)  # noqa: S303
    plaintext = kmip.get(uid).value
    with make_client(files, kmip_listener.port) as limited:
        with pytest.raises(KmipOperationFailure) as e:
            limited.get(uid)
        assert e.value.reason == enums.ResultReason.PERMISSION_DENIED and "keys:export" in e.value.message
        assert wrapper.decrypt(limited.get(uid, key_wrapping_specification=spec).value, oaep) == plaintext
        assert limited.get_attributes(uid)[0] == uid  # reading attributes is not export

        r = admin.patch(f"/api/v1/kmip/clients/{files.client_id}", json={"key_export": "none"})
        assert r.status_code == 200 and r.json()["key_export"] == "none"
        with pytest.raises(KmipOperationFailure) as e:  # the same open connection, next request
            limited.get(uid, key_wrapping_specification=spec)
        assert e.value.reason == enums.ResultReason.PERMISSION_DENIED and "keys:export-wrapped" in e.value.message
        public_uid = spec["encryption_key_information"]["unique_identifier"]
        assert limited.get(public_uid).value  # public keys are not secret material

        assert admin.patch(f"/api/v1/kmip/clients/{files.client_id}",
                           json={"key_export": "plaintext"}).status_code == 200
        assert limited.get(uid).value == plaintext
    r = admin.patch(f"/api/v1/kmip/clients/{files.client_id}", json={"key_export": "sometimes"})
    assert r.status_code == 422
    services.audit.flush()
    records = admin.get("/api/v1/audit/events", params={"actor": f"kmip:{files.name}", "outcome": "denied",
                                                        "limit": 10}).json()["items"]
    # each refusal names what was missing, and the key by its name (docs/audit.md "Fields")
    assert {r["details"]["missing_permission"] for r in records} == {"keys:export", "keys:export-wrapped"}
    assert all(r["object_name"] == r["details"]["object_name"] != "" for r in records), records
    changes = admin.get("/api/v1/audit/events", params={"action": "kmip_client.update", "object_id": files.client_id,
                                                        "limit": 10}).json()["items"]
    assert [c["details"]["key_export"] for c in changes] == ["plaintext", "none"]  # newest first


def test_the_key_export_setting_is_validated_and_needs_kmip_clients(actors: dict[str, Actor]) -> None:
    admin: httpx.Client = actors["admin"].client
    r = admin.post("/api/v1/kmip/clients", json={"name": unique("bad"), "role": "operator", "key_export": "all"})
    assert r.status_code == 422
    listed = admin.get("/api/v1/kmip/clients").json()
    assert listed, "the session's clients are listed"
    r = actors["key-officer"].client.patch(f"/api/v1/kmip/clients/{listed[0]['id']}",
                                           json={"key_export": "none"})
    assert r.status_code == 403
    r = admin.patch("/api/v1/kmip/clients/00000000-0000-4000-8000-000000000000", json={"key_export": "none"})
    assert r.status_code == 404 and r.json()["code"] == "kmip_client_not_found"


def test_roles_for_programs_and_storage_and_a_key_kept_from_plaintext_export(
        kmip_files: Callable[..., ClientFiles], kmip_listener: KmipListener, kmip: Any,
        actors: dict[str, Actor], services: Any, officer_files: ClientFiles) -> None:
    """kmip-client (a program) takes keys in plaintext; an operator only wrapped; a
    storage-admin not at all; and a key marked not exportable leaves in plaintext to
    nobody, on the very next request after the change, with the refusal audited."""

    _, spec = _rsa_wrapping(kmip)
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("roles"))
    kmip.activate(uid)

    def reason(client: Any, **kw: Any) -> Any:
        with pytest.raises(KmipOperationFailure) as e:
            client.get(uid, **kw)
        return e.value.reason

    group = officer_files.group  # the roles are tested here, not tenancy: one group
    with make_client(kmip_files("kmip-client", group), kmip_listener.port) as program, \
            make_client(kmip_files("operator", group), kmip_listener.port) as operator, \
            make_client(kmip_files("storage-admin", group), kmip_listener.port) as storage:
        assert len(program.get(uid).value) == 32
        assert reason(operator) == enums.ResultReason.PERMISSION_DENIED
        assert operator.get(uid, key_wrapping_specification=spec).value  # wrapped: yes
        assert reason(storage) == enums.ResultReason.PERMISSION_DENIED
        assert reason(storage, key_wrapping_specification=spec) == enums.ResultReason.PERMISSION_DENIED

        admin: httpx.Client = actors["admin"].client
        rest = services.kmip_objects.resolve(system_context("tests"), uid).key
        r = admin.patch(f"/api/v1/keys/{rest.id}", json={"exportable": False})
        assert r.status_code == 200 and r.json()["exportable"] is False
        with pytest.raises(KmipOperationFailure) as e:
            program.get(uid)
        assert e.value.reason == enums.ResultReason.PERMISSION_DENIED and "not exportable" in e.value.message
        assert program.get(uid, key_wrapping_specification=spec).value  # wrapped still leaves
    services.audit.flush()
    denied = admin.get("/api/v1/audit/events", params={"object_id": str(rest.id), "outcome": "denied"}).json()
    assert any(d["details"].get("reason") == "not_exportable" for d in denied["items"])


def _rsa_wrapping(kmip: Any) -> tuple[Any, dict[str, Any]]:
    """A registered, active RSA public key and the Key Wrapping Specification that has
    Get wrap under it (RSA-OAEP with SHA-1, the token's); its private half decrypts."""
    from cryptography.hazmat.primitives.asymmetric import rsa
    from kmip.pie import objects as pie

    wrapper = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    wrap_uid = kmip.register(pie.PublicKey(enums.CryptographicAlgorithm.RSA, 2048, wrapper.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo), enums.KeyFormatType.X_509))
    kmip.activate(wrap_uid)
    return wrapper, {"wrapping_method": enums.WrappingMethod.ENCRYPT,
                     "encryption_key_information": {"unique_identifier": wrap_uid, "cryptographic_parameters": {
                         "padding_method": enums.PaddingMethod.OAEP,
                         "hashing_algorithm": enums.HashingAlgorithm.SHA_1}},
                     "encoding_option": enums.EncodingOption.NO_ENCODING}
