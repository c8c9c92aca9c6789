"""Sealing of KMIP objects that are not managed AES keys (private keys, secret data).

Each object gets its own AES-256 data-encryption key (DEK). The DEK exists outside the
HSM only wrapped under the current KEK (`WrappedKey`, self-describing like every other
blob); the object's bytes are wrapped under the DEK with AES Key Wrap with Padding
(RFC 5649). Material that arrives in plaintext (Register) is sealed in software, the way
registered AES keys are wrapped under the KEK's public half; a key pair generated in the
HSM leaves it already sealed (`hsm.generate_wrapped_rsa_pair`). Unsealing happens only
on the audited export path, which hands the plaintext to an authorised caller anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cryptography.hazmat.primitives.keywrap import (
    InvalidUnwrap,
    aes_key_unwrap_with_padding,
    aes_key_wrap_with_padding,
)

from hsm import AES_KWP, HsmBackend, WrappedKey

DEK_BYTES = 32


@dataclass(frozen=True, slots=True)
class Sealed:
    dek: WrappedKey
    material: bytes = field(repr=False)
    mechanism: str = AES_KWP


class UnsealError(Exception):
    """The sealed bytes do not open under their key: one opaque failure."""


def seal(hsm: HsmBackend, material: bytes, *, kek_id: str) -> Sealed:
    dek = hsm.random(DEK_BYTES)
    return Sealed(dek=hsm.import_key(dek, kek_id=kek_id), material=aes_key_wrap_with_padding(dek, material))


def unseal(hsm: HsmBackend, dek: WrappedKey, material: bytes, *, mechanism: str, der: bool) -> bytes:
    """The plaintext; `der` trims a DER structure to its own length, because tokens may
    zero-pad what they wrap to a multiple of 8 bytes (SoftHSM2 does, for private keys)."""
    if mechanism != AES_KWP:
        raise UnsealError(f"unknown sealing mechanism {mechanism!r}")
    try:
        plain = aes_key_unwrap_with_padding(hsm.unwrap_key(dek), material)
    except InvalidUnwrap:
        raise UnsealError("the sealed material does not open") from None
    return plain[:der_length(plain)] if der else plain


def der_length(data: bytes) -> int:
    """Length of the DER element at the start of `data` (header included)."""
    if len(data) < 2:
        raise UnsealError("not a DER structure")
    first = data[1]
    if first < 0x80:
        return 2 + first
    n = first & 0x7F
    if n == 0 or n > 4 or len(data) < 2 + n:
        raise UnsealError("not a DER structure")
    return 2 + n + int.from_bytes(data[2:2 + n], "big")
