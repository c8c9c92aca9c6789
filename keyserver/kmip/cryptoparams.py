"""KMIP Cryptographic Parameters → what core/crypto.py takes, and one refusal for the
rest. Absent parameters take the defaults docs/kmip.md states: AES-GCM (16-byte tag)
for symmetric keys, RSA-OAEP with SHA-1 (SoftHSM2's only OAEP, decision 0001) for key
pairs, RSA-PSS with SHA-256 for RSA signatures, ECDSA with the curve's hash (P-256:
SHA-256, P-384: SHA-384) for EC ones, the key's own hash for HMAC."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kmip.core import enums

from hsm import AES_CBC_PAD, AES_GCM, ECDSA, RSA_PKCS1V15, RSA_PSS
from keyserver.kmip.errors import KmipFailure

R = enums.ResultReason
HASHES = {enums.HashingAlgorithm.SHA_1: "SHA-1", enums.HashingAlgorithm.SHA_256: "SHA-256",
          enums.HashingAlgorithm.SHA_384: "SHA-384", enums.HashingAlgorithm.SHA_512: "SHA-512"}
SIGNATURES = {
    enums.DigitalSignatureAlgorithm.SHA256_WITH_RSA_ENCRYPTION: (RSA_PKCS1V15, "SHA-256"),
    enums.DigitalSignatureAlgorithm.SHA384_WITH_RSA_ENCRYPTION: (RSA_PKCS1V15, "SHA-384"),
    enums.DigitalSignatureAlgorithm.SHA512_WITH_RSA_ENCRYPTION: (RSA_PKCS1V15, "SHA-512"),
    enums.DigitalSignatureAlgorithm.ECDSA_WITH_SHA256: (ECDSA, "SHA-256"),
    enums.DigitalSignatureAlgorithm.ECDSA_WITH_SHA384: (ECDSA, "SHA-384"),
    enums.DigitalSignatureAlgorithm.ECDSA_WITH_SHA512: (ECDSA, "SHA-512"),
}
EC_ALGORITHMS = (enums.CryptographicAlgorithm.EC, enums.CryptographicAlgorithm.ECDSA)
HMACS = {enums.CryptographicAlgorithm.HMAC_SHA256: "SHA-256", enums.CryptographicAlgorithm.HMAC_SHA384: "SHA-384",
         enums.CryptographicAlgorithm.HMAC_SHA512: "SHA-512"}
# Legacy and weak choices are refused by name, so a client learns why.
LEGACY = {enums.CryptographicAlgorithm.DES, enums.CryptographicAlgorithm.TRIPLE_DES,
          enums.CryptographicAlgorithm.RC2, enums.CryptographicAlgorithm.RC4, enums.CryptographicAlgorithm.RC5,
          enums.CryptographicAlgorithm.IDEA, enums.CryptographicAlgorithm.CAST5,
          enums.CryptographicAlgorithm.BLOWFISH, enums.CryptographicAlgorithm.SKIPJACK,
          enums.CryptographicAlgorithm.HMAC_MD5, enums.CryptographicAlgorithm.HMAC_SHA1}


def _refuse(what: str) -> KmipFailure:
    return KmipFailure(R.FEATURE_NOT_SUPPORTED, what)


def _algorithm(params: Any) -> Any:
    algorithm = getattr(params, "cryptographic_algorithm", None)
    if algorithm in LEGACY:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED,
                          f"{getattr(algorithm, 'name', algorithm)} is a legacy algorithm this server refuses; "
                          "use AES, RSA or HMAC-SHA-2")
    return algorithm


@dataclass(frozen=True, slots=True)
class Cipher:
    mode: str | None  # AES_GCM / AES_CBC_PAD; None for RSA
    tag_bytes: int = 16
    oaep_hash: str = "SHA-1"


def cipher(params: Any) -> Cipher:
    """Encrypt/Decrypt parameters."""
    if params is None:
        return Cipher(mode=None)
    algorithm = _algorithm(params)
    if algorithm not in (None, enums.CryptographicAlgorithm.AES, enums.CryptographicAlgorithm.RSA):
        raise _refuse(f"Encrypt/Decrypt with {algorithm.name} is not supported; use AES or RSA")
    padding, mode = params.padding_method, params.block_cipher_mode
    if algorithm == enums.CryptographicAlgorithm.RSA or padding == enums.PaddingMethod.OAEP:
        if padding not in (None, enums.PaddingMethod.OAEP):
            raise _refuse("RSA encryption is RSA-OAEP only (PKCS#1 v1.5 encryption is refused: Bleichenbacher)")
        name = HASHES.get(params.hashing_algorithm or enums.HashingAlgorithm.SHA_1)
        if name not in ("SHA-1", "SHA-256"):
            raise _refuse("RSA-OAEP uses SHA-1 or SHA-256")
        return Cipher(mode=None, oaep_hash=name)
    if mode in (None, enums.BlockCipherMode.GCM):
        if padding not in (None, enums.PaddingMethod.NONE):
            raise _refuse("GCM takes no padding")
        tag = int(params.tag_length) if params.tag_length is not None else 16
        if not 12 <= tag <= 16:
            raise KmipFailure(R.INVALID_FIELD, "a GCM Tag Length is 12 to 16 bytes")
        return Cipher(mode=AES_GCM if mode is not None else None, tag_bytes=tag)
    if mode == enums.BlockCipherMode.CBC:
        if padding not in (None, enums.PaddingMethod.PKCS5):
            raise _refuse("CBC is served with PKCS#5 padding only (its plaintext need not be whole blocks)")
        return Cipher(mode=AES_CBC_PAD)
    raise _refuse(f"block cipher mode {mode.name} is not supported; use GCM or CBC (PKCS#5 padding)")


def signature(params: Any) -> tuple[str | None, str | None]:
    """(scheme, hash) for Sign/SignatureVerify; None where the request leaves it to the
    key's defaults (core/crypto.py: RSA-PSS with SHA-256; ECDSA with the curve's hash)."""
    if params is None:
        return None, None
    algorithm = _algorithm(params)
    if algorithm not in (None, enums.CryptographicAlgorithm.RSA, *EC_ALGORITHMS):
        raise _refuse(f"signatures with {algorithm.name} are not supported; use RSA or ECDSA")
    chosen = params.digital_signature_algorithm
    scheme: str | None
    if chosen is not None:
        if chosen in SIGNATURES:
            return SIGNATURES[chosen]
        if chosen != enums.DigitalSignatureAlgorithm.RSASSA_PSS:
            raise _refuse(f"{chosen.name} is not supported; use RSASSA-PSS, SHA-256/384/512 with RSA, or "
                          "ECDSA with SHA-256/384/512")
        scheme = RSA_PSS
    elif algorithm in EC_ALGORITHMS:
        if params.padding_method is not None:
            raise _refuse("ECDSA takes no padding method")
        scheme = ECDSA
    elif params.padding_method is None:
        scheme = None
    elif params.padding_method == enums.PaddingMethod.PSS:
        scheme = RSA_PSS
    elif params.padding_method == enums.PaddingMethod.PKCS1v15:
        scheme = RSA_PKCS1V15
    else:
        raise _refuse("signatures use PSS or PKCS#1 v1.5 padding")
    if params.hashing_algorithm is None:
        return scheme, None
    name = HASHES.get(params.hashing_algorithm)
    if name not in ("SHA-256", "SHA-384", "SHA-512"):
        raise _refuse("signatures hash with SHA-256, SHA-384 or SHA-512")
    return scheme, name


def mac_hash(params: Any) -> str | None:
    """The hash a MAC request names (None: the key's own)."""
    if params is None:
        return None
    algorithm = _algorithm(params)
    if algorithm is None:
        return None
    if algorithm not in HMACS:
        raise _refuse(f"MAC with {algorithm.name} is not supported; use HMAC-SHA256/384/512")
    return HMACS[algorithm]
