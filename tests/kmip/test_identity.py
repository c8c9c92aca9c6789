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

from keyserver.kmip.listener import KmipListener
from tests.conftest import Actor, unique
from tests.kmip.conftest import ClientFiles, make_client
from tests.kmip.raw import connect, decode, query_request, read_response, roundtrip


def test_auditor_may_read_but_not_create_or_destroy(kmip_files: Callable[[str], ClientFiles],
                                                    kmip_listener: KmipListener, kmip: Any) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("forauditor"))
    auditor = make_client(kmip_files("auditor"), kmip_listener.port)
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


def test_operator_may_export_and_rekey_but_not_destroy(kmip_files: Callable[[str], ClientFiles],
                                                       kmip_listener: KmipListener, kmip: Any) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("foroperator"))
    kmip.activate(uid)
    with make_client(kmip_files("operator"), kmip_listener.port) as operator:
        assert len(operator.get(uid).value) == 32
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
