"""The contract every HSM backend fulfils.

`keyserver/core` talks only to `HsmBackend`; `hsm.pkcs11.Pkcs11Backend` is the
implementation for any PKCS#11 module (SoftHSM2 by default). The conformance suite in
`tests/hsm/conformance.py` is written against this protocol so that any backend can be
checked with it.

Vocabulary:
* KEK — an RSA-2048 key pair in the token; the private half is sensitive,
  non-extractable and may only unwrap. Identified by `kek_id` (its CKA_LABEL/CKA_ID).
* WrappedKey — a self-describing blob: which key wrapped it, with which mechanism.
* managed key version — an AES-256 key that exists outside the token only as a
  WrappedKey under a KEK.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

# Mechanism names recorded beside every wrapped blob. They are part of the stored
# format: never rename one, add a new name instead.
RSA_OAEP_SHA1 = "RSA-OAEP-SHA1"  # OAEP, SHA-1 + MGF1-SHA-1, empty label
RSA_OAEP_SHA256 = "RSA-OAEP-SHA256"  # OAEP, SHA-256 + MGF1-SHA-256, empty label
AES_256_GCM = "AES-256-GCM"  # 96-bit IV || ciphertext || 128-bit tag
AES_KWP = "AES-KWP"  # Added: AES Key Wrap with Padding, RFC 5649 (CKM_AES_KEY_WRAP_PAD)


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A key in its only storable form: ciphertext plus how to undo it."""

    wrapping_key_id: str
    mechanism: str
    ciphertext: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class WrappedKeyPair:
    """Added: an RSA key pair generated in the token. The private key left it only as
    `private_key`: its PKCS#8 encoding wrapped with AES Key Wrap with Padding (`AES_KWP`)
    under a fresh AES-256 key, `dek`, which is itself wrapped under the KEK. Some tokens
    (SoftHSM2) zero-pad the PKCS#8 to a multiple of 8 bytes before wrapping; DER says
    its own length, so whoever unwraps it trims by that."""

    public_key_der: bytes  # SubjectPublicKeyInfo
    dek: WrappedKey
    private_key: bytes = field(repr=False)
    mechanism: str = AES_KWP


@dataclass(frozen=True, slots=True)
class KekInfo:
    kek_id: str
    public_key_pem: bytes
    created_at: datetime | None


@dataclass(frozen=True, slots=True)
class TokenCapabilities:
    """What this token can do, so that quirks live here and not in `if`s elsewhere."""

    manufacturer: str
    model: str
    firmware: str
    # Mechanism used when wrapping under an RSA key inside the token (KEK and
    # external public keys alike). SoftHSM2 2.6 only accepts OAEP with SHA-1.
    rsa_wrap_mechanism: str
    supports_aes_gcm: bool
    supports_hmac_sha256: bool
    # Added: every RSA-OAEP mechanism the token can unwrap inside itself (always
    # includes rsa_wrap_mechanism). A blob stored under another mechanism needs a
    # token that can read it; empty means "only rsa_wrap_mechanism".
    rsa_unwrap_mechanisms: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class KekAttributes:
    """Added: the security attributes of a KEK as the token reports them (read back,
    not remembered), so that an operator or a test can verify the key policy."""

    kek_id: str
    modulus_bits: int
    private_sensitive: bool
    private_always_sensitive: bool
    private_extractable: bool
    private_never_extractable: bool
    private_unwrap: bool
    private_decrypt: bool
    private_sign: bool
    public_wrap: bool
    public_encrypt: bool


@runtime_checkable
class HsmBackend(Protocol):
    @property
    def capabilities(self) -> TokenCapabilities: ...

    def check(self) -> None:
        """Raise HsmUnavailable (with advice) unless the token is usable right now."""

    def close(self) -> None:
        """Close sessions; the backend is unusable afterwards."""

    # --- key-encryption keys -------------------------------------------------
    def create_kek(self, kek_id: str) -> KekInfo: ...

    def get_kek(self, kek_id: str) -> KekInfo:
        """Raises HsmKeyNotFound."""

    def list_keks(self) -> list[KekInfo]: ...

    def describe_kek(self, kek_id: str) -> KekAttributes:
        """Added: read the KEK's attributes back from the token. Raises HsmKeyNotFound."""

    # --- managed key versions ------------------------------------------------
    def generate_wrapped_key(self, *, kek_id: str) -> WrappedKey:
        """Generate an AES-256 key inside the token; return it wrapped under the KEK."""

    def import_key(self, material: bytes, *, kek_id: str) -> WrappedKey:
        """Wrap caller-supplied AES key material (16/24/32 bytes) under the KEK."""

    def unwrap_key(self, wrapped: WrappedKey) -> bytes:
        """Return the plaintext of a wrapped key. Only for the few paths the design allows."""

    def rewrap_under_kek(self, wrapped: WrappedKey, *, kek_id: str) -> WrappedKey:
        """KEK rotation: unwrap inside the token, wrap again under another KEK."""

    def rewrap_for_public_key(self, wrapped: WrappedKey, *, public_key_der: bytes) -> WrappedKey:
        """Deliver a key to a host: unwrap and wrap under an external RSA public key
        (SubjectPublicKeyInfo DER, RSA >= 2048) entirely inside the token.
        `wrapping_key_id` of the result is the SHA-256 hex of the DER."""

    def wrap_with_key(self, wrapped: WrappedKey, *, wrapping: WrappedKey) -> bytes:
        """Added: wrap one managed key version under another (an AES key) with AES Key
        Wrap with Padding (RFC 5649, mechanism `AES_KWP`). Both are unwrapped under their
        KEKs and the wrap happens inside the token: the plaintext never leaves it.
        Raises HsmIntegrityError if either blob does not unwrap."""

    def generate_wrapped_rsa_pair(self, *, kek_id: str, bits: int) -> WrappedKeyPair:
        """Added: an RSA key pair (2048, 3072 or 4096 bits) generated in the token; the
        private key leaves it only wrapped (see WrappedKeyPair)."""

    def forget(self, wrapped: WrappedKey) -> None:
        """Drop any cached unwrapped handle of this blob (key destroyed or re-wrapped)."""

    # --- data keys (envelope encryption under a managed key version) --------
    def encrypt_with(self, wrapped: WrappedKey, plaintext: bytes, *, aad: bytes) -> bytes:
        """AES-256-GCM under the managed key inside the token: IV(12) || ct || tag(16)."""

    def decrypt_with(self, wrapped: WrappedKey, ciphertext: bytes, *, aad: bytes) -> bytes:
        """Inverse of encrypt_with. Raises HsmIntegrityError on any failure."""

    def random(self, n: int) -> bytes:
        """n bytes from the token's RNG."""

    # --- audit chain ---------------------------------------------------------
    def ensure_hmac_key(self, key_id: str) -> None:
        """Create the token-resident HMAC-SHA-256 key if it does not exist yet."""

    def hmac_sha256(self, data: bytes, *, key_id: str) -> bytes: ...
