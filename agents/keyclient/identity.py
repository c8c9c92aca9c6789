"""The host's own identity: an RSA-2048 key pair generated on the host (the private key
never leaves it), a CSR for enrollment, and the certificate and CA pinned afterwards.

Files in the state directory (0700): `host.key` (PKCS#8 PEM, 0600), `host.crt`,
`ca.crt`. Every write is write-new + fsync + rename.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from agents.cryptfile.transform import atomic_replace
from agents.errors import AgentError, Exit

KEY_FILE, CERT_FILE, CA_FILE = "host.key", "host.crt", "ca.crt"
# The mechanism names the key server records (hsm.backend); the host unwraps with them.
OAEP = {
    "RSA-OAEP-SHA1": padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None),  # noqa: S303
    "RSA-OAEP-SHA256": padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None),
}


class IdentityError(AgentError):
    """The state directory is unusable (wrong permissions, damaged files)."""

    exit_status = Exit.NOT_ENROLLED


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    with atomic_replace(path, mode=mode) as f:
        f.write(data)


@dataclass
class HostIdentity:
    state_dir: Path
    private_key: rsa.RSAPrivateKey

    @classmethod
    def load_or_create(cls, state_dir: Path) -> HostIdentity:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if state_dir.stat().st_mode & 0o077:
            raise IdentityError(f"{state_dir} is accessible to other users; chmod 700 it")
        key_path = state_dir / KEY_FILE
        if key_path.exists():
            if key_path.stat().st_mode & 0o077:
                raise IdentityError(f"{key_path} is readable by other users; chmod 600 it")
            try:
                key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            except ValueError:
                raise IdentityError(f"{key_path} is not a readable private key") from None
            if not isinstance(key, rsa.RSAPrivateKey) or key.key_size < 2048:
                raise IdentityError(f"{key_path} is not an RSA key of at least 2048 bits")
            return cls(state_dir, key)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
        return cls(state_dir, key)

    def public_key_der(self) -> bytes:
        return self.private_key.public_key().public_bytes(serialization.Encoding.DER,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo)

    def csr(self, hostname: str | None = None) -> bytes:
        name = hostname or socket.getfqdn()
        req = (x509.CertificateSigningRequestBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
               .sign(self.private_key, hashes.SHA256()))
        return req.public_bytes(serialization.Encoding.PEM)

    def unwrap(self, wrapped: bytes, *, mechanism: str) -> bytes:
        """A key the server wrapped under this host's public key."""
        try:
            scheme = OAEP[mechanism]
        except KeyError:
            raise IdentityError(f"unknown wrapping mechanism {mechanism!r}") from None
        return self.private_key.decrypt(wrapped, scheme)

    def save_certificates(self, certificate_pem: bytes, ca_pem: bytes) -> None:
        cert = x509.load_pem_x509_certificate(certificate_pem)
        if cert.public_key().public_numbers() != self.private_key.public_key().public_numbers():  # type: ignore[union-attr]
            raise IdentityError("the issued certificate is not for this host's key")
        x509.load_pem_x509_certificate(ca_pem)
        write_private(self.state_dir / CERT_FILE, certificate_pem, 0o644)
        write_private(self.state_dir / CA_FILE, ca_pem, 0o644)

    @property
    def enrolled(self) -> bool:
        return (self.state_dir / CERT_FILE).exists() and (self.state_dir / CA_FILE).exists()
