"""The keyserver's internal certificate authority, for the KMIP listener's mutual TLS.

The CA key (ECDSA P-256) is never stored in plaintext: its PKCS#8 encoding is sealed
with AES-256-GCM *inside the HSM* under a data-encryption key (DEK) that exists outside
the token only wrapped under the KEK. It is unsealed only for the moment of a signature
(docs/decisions/0005-kmip-internal-ca.md). The listener's own TLS key is ephemeral: a
fresh one per process start, certified by the CA, never written anywhere durable.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from hsm import HsmBackend, HsmError, WrappedKey
from keyserver.core.audit import utcnow
from keyserver.core.errors import InvalidInput, hsm_failure
from keyserver.core.kek import KekService
from keyserver.store.models import KmipCa
from keyserver.store.notify import Notifier, Topic

CA_ROW = 1
# Binds the sealed blob to its purpose: it cannot be passed off as any other ciphertext.
SEAL_AAD = b"strongroom/kmip-ca/private-key/v1"
CA_YEARS = 10
SERVER_CERT_DAYS = 30
CertPublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey


def _name(common_name: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Strongroom"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])


def _general_name(value: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        return x509.DNSName(value)


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()


def display_fingerprint(cert: x509.Certificate) -> str:
    """SHA-256, colon-separated upper-case hex: what `openssl x509 -fingerprint -sha256` prints."""
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def serial_hex(cert: x509.Certificate) -> str:
    return format(cert.serial_number, "x")


class CertificateAuthority:
    def __init__(
        self,
        session_factory: sessionmaker[Session],
        hsm: HsmBackend,
        keks: KekService,
        *,
        notifier: Notifier | None = None,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self._db = session_factory
        self._hsm = hsm
        self._keks = keks
        self._now = now
        self._cert: x509.Certificate | None = None
        # The CA's row is kept here so that signing needs no database session (callers
        # sign inside their own transaction: decision 0010). Only a KEK rotation changes
        # it (its DEK re-wrapped): then it is read again at the next `ensure`, before the
        # old KEK can be retired from the token.
        self._sealed: tuple[WrappedKey, bytes] | None = None
        self._stale = threading.Event()
        self._lock = threading.Lock()
        if notifier is not None:
            notifier.subscribe(Topic.KEYS, self._stale.set)

    # --- the CA itself ---------------------------------------------------------
    def ensure(self) -> x509.Certificate:
        """The CA certificate, creating the CA on first use (safe across replicas:
        the loser of a concurrent insert reads the winner's row), its sealed key read
        again after a KEK rotation. Reads the store: call it outside any transaction,
        before signing inside one."""
        if self._cert is not None and not self._stale.is_set():
            return self._cert
        with self._lock:
            if self._cert is None or self._stale.is_set():
                self._stale.clear()  # before the read: a change during it marks it stale again
                if self._load() is None:
                    self._create()
                    self._load()
            assert self._cert is not None
            return self._cert

    def certificate_pem(self) -> bytes:
        return self.ensure().public_bytes(serialization.Encoding.PEM)

    def _load(self) -> x509.Certificate | None:
        with self._db() as s:
            row = s.get(KmipCa, CA_ROW)
            if row is None:
                return None
            self._sealed = (WrappedKey(wrapping_key_id=row.dek_wrapping_key_id, mechanism=row.dek_mechanism,
                                       ciphertext=row.dek_wrapped), row.sealed_private_key)
            self._cert = x509.load_pem_x509_certificate(row.certificate_pem.encode())
            return self._cert

    def _create(self) -> None:
        """Write the CA's row (the loser of a race between replicas keeps the winner's)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = self._now()
        subject = _name("Strongroom KMIP CA")
        cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=365 * CA_YEARS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        pkcs8 = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
        try:
            dek = self._hsm.generate_wrapped_key(kek_id=self._keks.current())
            sealed = self._hsm.encrypt_with(dek, pkcs8, aad=SEAL_AAD)
        except HsmError as exc:
            raise hsm_failure("seal the KMIP CA key", exc) from exc
        finally:
            del pkcs8, key
        try:
            with self._db.begin() as s:
                s.add(KmipCa(id=CA_ROW, certificate_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
                             sealed_private_key=sealed, dek_wrapped=dek.ciphertext,
                             dek_wrapping_key_id=dek.wrapping_key_id, dek_mechanism=dek.mechanism,
                             created_at=now))
        except IntegrityError:
            pass

    def _sign(self, builder: x509.CertificateBuilder) -> x509.Certificate:
        """Unseal the CA key inside this call only, sign, and let it go. Reads the store
        only on first use (callers may be inside a transaction; `ensure` refreshes)."""
        ca = self._cert if self._cert is not None else self.ensure()
        assert self._sealed is not None
        dek, sealed = self._sealed
        try:
            pkcs8 = self._hsm.decrypt_with(dek, sealed, aad=SEAL_AAD)
        except HsmError as exc:
            raise hsm_failure("unseal the KMIP CA key", exc) from exc
        key = serialization.load_der_private_key(pkcs8, password=None)
        del pkcs8
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        cert = builder.issuer_name(ca.subject).add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()),  # type: ignore[arg-type]
            critical=False,
        ).sign(key, hashes.SHA256())
        del key
        return cert

    # --- certificates ------------------------------------------------------------
    def issue_client(self, *, name: str, public_key: CertPublicKey, days: int) -> x509.Certificate:
        """A client certificate: subjectAltName + clientAuth EKU, as common KMIP clients need."""
        if isinstance(public_key, rsa.RSAPublicKey) and public_key.key_size < 2048:
            raise InvalidInput("client RSA keys must be at least 2048 bits")
        now = self._now()
        builder = (
            x509.CertificateBuilder().subject_name(_name(name)).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False,
                key_encipherment=isinstance(public_key, rsa.RSAPublicKey), data_encipherment=False,
                key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False,
                decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        )
        return self._sign(builder)

    def issue_server(
        self, names: Iterable[str], *, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | None = None,
        common_name: str,
    ) -> tuple[bytes, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey]:
        """A certificate for a listener (KMIP, the agent port) with a fresh key (or
        `key`, for a peer server in the benchmark), both in memory."""
        sans: list[str] = []
        for n in ["localhost", "127.0.0.1", "::1", socket.gethostname(), *names]:
            if n and n not in sans:
                sans.append(n)
        key = key if key is not None else ec.generate_private_key(ec.SECP256R1())
        now = self._now()
        builder = (
            x509.CertificateBuilder().subject_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=SERVER_CERT_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in sans]), critical=False)
        )
        return self._sign(builder).public_bytes(serialization.Encoding.PEM), key


def load_into_context(ctx: object, cert_pem: bytes, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    """`ssl` loads keys only from files: write the ephemeral key to a private file,
    load it, and remove it at once (it never outlives this call)."""
    import ssl

    assert isinstance(ctx, ssl.SSLContext)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd, path = tempfile.mkstemp(prefix="strongroom-kmip-", suffix=".pem")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(cert_pem + key_pem)
        ctx.load_cert_chain(path)
    finally:
        os.unlink(path)
