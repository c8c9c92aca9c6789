"""Mutual TLS for the AWS KMS external key store proxy (decision 0023): the optional XKS
port asks for a client certificate chained to its configured CA bundle, as AWS KMS
presents one (subject `cks.kms.<region>.amazonaws.com`) when a key store is set up for
mTLS; every call is still signed by botocore's SigV4Auth. The REST port never asks."""

from __future__ import annotations

import contextlib
import copy
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from fastapi import FastAPI

from keyserver.runtime.xksport import xks_sidecar
from keyserver.services import Services
from tests.conftest import _serving, unique
from tests.integrations.test_xks import REGION, Xks, _error, _events, _key

AWS_NAME = f"cks.kms.{REGION}.amazonaws.com"


@dataclass(frozen=True)
class Ca:
    """A CA made for the test (standing for AWS KMS's public CA, or for another one)."""

    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    directory: Path

    @classmethod
    def make(cls, name: str, directory: Path) -> Ca:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.now(UTC)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(hours=1))
                .not_valid_after(now + timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False, key_agreement=False,
                                             key_cert_sign=True, crl_sign=True, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        directory.mkdir(parents=True, exist_ok=True)
        ca = cls(name, key, cert, directory)
        ca.pem_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return ca

    @property
    def pem_file(self) -> Path:
        return self.directory / "ca.pem"

    def client(self, common_name: str, *, dns: tuple[str, ...] = ()) -> tuple[Path, Path]:
        """A client certificate (CN `common_name`, DNS SANs `dns`) and its key, as files."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                   .issuer_name(self.cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(hours=1))
                   .not_valid_after(now + timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if dns:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(d) for d in dns]),
                                            critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        stem = self.directory / f"{common_name}-{x509.random_serial_number():x}"
        cert_file, key_file = stem.with_suffix(".crt"), stem.with_suffix(".key")
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_file, key_file


@pytest.fixture(scope="module")
def aws_ca(tmp_path_factory: pytest.TempPathFactory) -> Ca:
    return Ca.make("Test AWS KMS client CA", tmp_path_factory.mktemp("aws-ca"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Ca:
    return Ca.make("Test other CA", tmp_path_factory.mktemp("other-ca"))


@pytest.fixture(scope="module")
def xks_url(services: Services, app: FastAPI, base_url: str, aws_ca: Ca) -> Iterator[str]:
    """The XKS port as `keyserver serve` runs it with STRONGROOM_XKS_PORT and
    STRONGROOM_XKS_CLIENT_CA_FILE set, on the session's application and store."""
    configured = copy.copy(services)
    configured.settings = services.settings.model_copy(update={"xks_port": 0,
                                                               "xks_client_ca_file": aws_ca.pem_file})
    sidecar = xks_sidecar(configured, app, {"log_config": None, "access_log": False})
    assert sidecar is not None
    server, sock = sidecar
    with _serving(server, [sock]):
        yield f"https://127.0.0.1:{sock.getsockname()[1]}"


def client_context(ca_file: Path, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


def on(xks: Xks, url: str, ca_file: Path, cert: tuple[Path, Path] | None) -> Xks:
    """The same key store, called at `url` with `cert` presented (or none)."""
    other = copy.copy(xks)
    other.base_url, other.http = url, httpx.Client(base_url=url, verify=client_context(ca_file, cert), timeout=30)
    return other


def health(xks: Xks) -> httpx.Response:
    return xks.call("/health", {"requestMetadata": {"kmsRequestId": "h-1", "kmsOperation": "KmsHealthCheck"}})


def handshake_messages(url: str, cert: tuple[Path, Path] | None = None) -> str:
    """What `openssl s_client -msg` sees of the handshake with the server at `url`."""
    host_port = url.removeprefix("https://")
    args = ["openssl", "s_client", "-connect", host_port, "-msg", "-brief"]
    if cert is not None:
        args += ["-cert", str(cert[0]), "-key", str(cert[1])]
    out = subprocess.run(args, input=b"", capture_output=True, timeout=30, check=False)
    return out.stdout.decode(errors="replace") + out.stderr.decode(errors="replace")


def test_only_the_xks_port_asks_for_a_client_certificate(base_url: str, xks_url: str) -> None:
    assert "CertificateRequest" in handshake_messages(xks_url)
    rest = handshake_messages(base_url)
    assert "ServerHello" in rest, rest  # the check can see handshake messages at all
    assert "CertificateRequest" not in rest


def test_store_without_a_subject_works_on_both_ports_without_a_certificate(
        admin: httpx.Client, base_url: str, tls: Any, xks_url: str, ca_file: Path, aws_ca: Ca) -> None:
    xks = Xks(admin, base_url, tls)
    external = xks.grant(admin, _key(admin))
    assert health(xks).status_code == 200
    on_xks_port = on(xks, xks_url, ca_file, None)
    r = on_xks_port.encrypt(external, b"data key", b"context")
    assert r.status_code == 200, r.text
    assert xks.decrypt(external, r.json(), b"context").status_code == 200
    # A certificate AWS KMS would present changes nothing for such a store.
    with_cert = on(xks, xks_url, ca_file, aws_ca.client(AWS_NAME))
    assert health(with_cert).status_code == 200


def test_certificate_of_another_ca_fails_the_handshake(admin: httpx.Client, base_url: str, tls: Any,
                                                       xks_url: str, ca_file: Path, other_ca: Ca) -> None:
    xks = on(Xks(admin, base_url, tls), xks_url, ca_file, other_ca.client(AWS_NAME))
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        health(xks)


def test_xks_port_serves_the_xks_api_only(xks_url: str, ca_file: Path, admin: httpx.Client) -> None:
    token = admin.headers["Authorization"]
    with httpx.Client(base_url=xks_url, verify=client_context(ca_file, None), timeout=30) as http:
        r = http.get("/api/v1/keys", headers={"Authorization": token})
        assert r.status_code == 404 and r.json()["code"] == "not_on_xks_port", r.text
        assert http.get("/healthz").status_code == 200
        r = http.post("/xks/nosuchstore/kms/xks/v1/health", json={})
        _error(r, 401, "AuthenticationFailedException")


def test_xks_port_and_ca_bundle_go_together(tmp_path: Path) -> None:
    from keyserver.settings import Settings, SettingsInvalid

    for half in ({"xks_port": 8444}, {"xks_client_ca_file": tmp_path / "ca.pem"}):
        with pytest.raises((SettingsInvalid, ValueError)) as bad:
            Settings(data_dir=tmp_path, **half)
        assert "STRONGROOM_XKS_CLIENT_CA_FILE" in str(bad.value)


def test_unreadable_bundle_leaves_the_rest_port_up(services: Services, app: FastAPI, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    from keyserver.runtime.xksport import start_xks_sidecar

    configured = copy.copy(services)
    configured.settings = services.settings.model_copy(update={"xks_port": 0,
                                                               "xks_client_ca_file": tmp_path / "missing.pem"})
    assert start_xks_sidecar(configured, app, {}) == []
    assert "XKS port not started" in caplog.text and "STRONGROOM_XKS_CLIENT_CA_FILE" in caplog.text


def mtls_store(admin: httpx.Client, base_url: str, tls: Any, subject: str = AWS_NAME) -> Xks:
    xks = Xks(admin, base_url, tls)
    r = admin.patch(f"/api/v1/xks/stores/{xks.name}", json={"client_cert_subject": subject})
    assert r.status_code == 200, r.text
    assert r.json()["client_cert_subject"] == subject.lower()
    return xks


def refusals(services: Services, admin: httpx.Client, store: str) -> list[dict[str, Any]]:
    return [e for e in _events(services, admin, object_id=store) if e["outcome"] == "denied"]


def test_required_subject_right_certificate_works(admin: httpx.Client, base_url: str, tls: Any, xks_url: str,
                                                  ca_file: Path, aws_ca: Ca, services: Services) -> None:
    xks = mtls_store(admin, base_url, tls)
    external = xks.grant(admin, _key(admin))
    aws = on(xks, xks_url, ca_file, aws_ca.client(AWS_NAME))
    assert health(aws).status_code == 200
    r = aws.encrypt(external, b"data key", b"context")
    assert r.status_code == 200, r.text
    r = aws.decrypt(external, r.json(), b"context")
    assert r.status_code == 200 and r.json()["plaintext"] == "ZGF0YSBrZXk=", r.text
    # A DNS name in the subject alternative names counts as the CN does.
    by_san = on(xks, xks_url, ca_file, aws_ca.client("another name", dns=("x.example", AWS_NAME)))
    assert health(by_san).status_code == 200
    assert not refusals(services, admin, xks.name)


def test_required_subject_refuses_without_it_and_audits(admin: httpx.Client, base_url: str, tls: Any, xks_url: str,
                                                        ca_file: Path, aws_ca: Ca, services: Services) -> None:
    xks = mtls_store(admin, base_url, tls)
    external = xks.grant(admin, _key(admin))
    # No certificate: on the XKS port, and on the REST port (which never asks for one).
    _error(health(on(xks, xks_url, ca_file, None)), 401, "AuthenticationFailedException")
    _error(xks.encrypt(external, b"data key"), 401, "AuthenticationFailedException")
    # A certificate of the right CA for another subject (another region's AWS KMS).
    wrong = on(xks, xks_url, ca_file, aws_ca.client("cks.kms.us-east-1.amazonaws.com",
                                                    dns=("cks.kms.us-east-1.amazonaws.com",)))
    r = wrong.encrypt(external, b"data key")
    _error(r, 401, "AuthenticationFailedException")
    assert "requires" in r.json()["errorMessage"] and AWS_NAME not in r.json()["errorMessage"]
    # The certificate is checked before the signature: a bad one changes nothing.
    _error(on(xks, xks_url, ca_file, None).encrypt(external, b"data key", secret="wrong" * 8), 401,
           "AuthenticationFailedException")
    denied = refusals(services, admin, xks.name)
    reasons = [(e["action"], e["details"]["refused"]) for e in denied]
    assert reasons.count(("xks.health", "client_certificate_required")) == 1, reasons
    assert reasons.count(("xks.encrypt", "client_certificate_required")) == 2, reasons
    assert reasons.count(("xks.encrypt", "client_certificate_subject")) == 1, reasons
    subject = next(e for e in denied if e["details"]["refused"] == "client_certificate_subject")
    assert subject["details"]["client_certificate"] == ["cks.kms.us-east-1.amazonaws.com"]
    assert subject["details"]["required_subject"] == AWS_NAME and subject["actor"] != f"xks:{xks.name}"
    assert "data key" not in str(denied)


def test_right_certificate_still_needs_sigv4(admin: httpx.Client, base_url: str, tls: Any, xks_url: str,
                                            ca_file: Path, aws_ca: Ca, services: Services) -> None:
    xks = mtls_store(admin, base_url, tls)
    aws = on(xks, xks_url, ca_file, aws_ca.client(AWS_NAME))
    _error(aws.call("/health", {"requestMetadata": {"kmsRequestId": "h", "kmsOperation": "KmsHealthCheck"}},
                    secret="wrong" * 8), 401, "AuthenticationFailedException")
    r = aws.http.post(f"{xks_url}{xks.path}/health", json={"requestMetadata": {}})
    _error(r, 401, "AuthenticationFailedException")
    assert {e["details"]["refused"] for e in refusals(services, admin, xks.name)} == {"signature_invalid"}


def test_subject_set_shown_changed_and_cleared(admin: httpx.Client, base_url: str, tls: Any, xks_url: str,
                                              ca_file: Path, services: Services) -> None:
    r = admin.post("/api/v1/xks/stores", json={"name": unique("xks"), "region": REGION,
                                               "client_cert_subject": "CKS.KMS.EU-WEST-1.AMAZONAWS.COM"})
    assert r.status_code == 201, r.text
    name = r.json()["store"]["name"]
    assert r.json()["store"]["client_cert_subject"] == AWS_NAME
    for bad in ("*.amazonaws.com", "cks kms", "-x.example", "a" * 254):
        r = admin.patch(f"/api/v1/xks/stores/{name}", json={"client_cert_subject": bad})
        assert r.status_code in (400, 422) and "client_cert_subject" in r.text, r.text
    r = admin.patch(f"/api/v1/xks/stores/{name}", json={"description": "AWS prod"})
    assert r.status_code == 200 and r.json()["client_cert_subject"] == AWS_NAME, r.text
    r = admin.patch(f"/api/v1/xks/stores/{name}", json={"client_cert_subject": None})
    assert r.status_code == 200 and r.json()["client_cert_subject"] is None, r.text
    assert admin.get(f"/api/v1/xks/stores/{name}").json()["client_cert_subject"] is None
    updates = [e["details"] for e in _events(services, admin, action="xks.update", object_id=name)]
    assert {"client_cert_subject": {"from": AWS_NAME, "to": None}} in updates
    assert {"description": "AWS prod"} in updates
    created = _events(services, admin, action="xks.create", object_id=name)
    assert created[0]["details"]["client_cert_subject"] == AWS_NAME


def test_update_refusals(admin: httpx.Client, actors: dict[str, Any], base_url: str, tls: Any) -> None:
    xks = Xks(admin, base_url, tls)
    r = actors["operator"].client.patch(f"/api/v1/xks/stores/{xks.name}", json={"client_cert_subject": AWS_NAME})
    assert r.status_code == 403, r.text
    r = admin.patch(f"/api/v1/xks/stores/{xks.name}", json={"client_cert_subject": AWS_NAME, "x": 1})
    assert r.status_code == 422, r.text
    r = admin.patch("/api/v1/xks/stores/no-such-store", json={"client_cert_subject": AWS_NAME})
    assert r.status_code == 404, r.text
    assert admin.post(f"/api/v1/xks/stores/{xks.name}/revoke").status_code == 200
    r = admin.patch(f"/api/v1/xks/stores/{xks.name}", json={"client_cert_subject": AWS_NAME})
    assert r.status_code == 409 and r.json()["code"] == "xks_store_revoked", r.text


@pytest.mark.parametrize("workers", [1, 2])
def test_keyserver_serve_opens_the_xks_port(tmp_path: Path, aws_ca: Ca, workers: int) -> None:
    """`keyserver serve` as an operator runs it: one process, or workers (PostgreSQL),
    each serving the XKS port beside the REST port."""
    from tests.pg import scratch_database
    from tests.serve import Server, eventually, free_port

    port = free_port()
    env = {"STRONGROOM_XKS_PORT": str(port), "STRONGROOM_XKS_CLIENT_CA_FILE": str(aws_ca.pem_file)}
    with contextlib.ExitStack() as stack:
        if workers > 1:
            env.update(STRONGROOM_WORKERS=str(workers), STRONGROOM_DATABASE_URL=stack.enter_context(scratch_database()))
        server = stack.enter_context(Server(tmp_path / "data", **env))
        xks_url = f"https://127.0.0.1:{port}"
        ctx = client_context(server.data / "ca.pem", aws_ca.client(AWS_NAME))

        def answers() -> bool:
            try:
                return httpx.get(f"{xks_url}/healthz", verify=ctx, timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        eventually(answers, "the XKS port")
        assert "CertificateRequest" in handshake_messages(xks_url)
        assert "CertificateRequest" not in handshake_messages(server.url)
        r = httpx.get(f"{xks_url}/api/v1/keys", verify=ctx, timeout=5)
        assert r.status_code == 404 and r.json()["code"] == "not_on_xks_port", r.text
