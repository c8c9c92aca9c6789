"""KMIP Cryptographic Parameters → what core/crypto.py takes, and one refusal for the
rest. Absent parameters take the defaults docs/kmip.md states: AES-GCM (16-byte tag)
for symmetric keys, RSA-OAEP with SHA-1 (SoftHSM2's only OAEP, decision 0001) for key
pairs, RSA-PSS with SHA-256 for RSA signatures, ECDSA with the curve's hash (P-256:
SHA-256, P-384: SHA-384) for EC ones, the key's own hash for HMAC.

Cryptographic Parameters set on the object when it was made come first: a request that
names none uses the object's (a key registered for CBC encrypts with CBC), a request
that names some is completed from the first of the object's instances it agrees with,
and one that agrees with none — or names another algorithm than the key's — is refused
(Invalid Field)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kmip.core import attributes as kmip_attributes
from kmip.core import enums

from hsm import AES_CBC_PAD, AES_GCM, ECDSA, RSA_PKCS1V15, RSA_PSS
from keyserver.core.kmip_model import (
    PublicKeyObject,
    StandaloneObject,
    VersionObject,
    public_key_algorithm,
    stored_parameters,
    usage_of,
)
from keyserver.core.permissions import Permission
from keyserver.core.usage import Usage
from keyserver.kmip.attributes import parameters_stored, parameters_value
from keyserver.kmip.context import Call
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


# --- the object's own parameters -----------------------------------------------------------
# Which key algorithm a request's Cryptographic Algorithm names (legacy ones are refused first).
FAMILIES = {enums.CryptographicAlgorithm.AES: "AES", enums.CryptographicAlgorithm.RSA: "RSA",
            enums.CryptographicAlgorithm.EC: "EC", enums.CryptographicAlgorithm.ECDSA: "EC",
            enums.CryptographicAlgorithm.HMAC_SHA256: "HMAC-SHA256",
            enums.CryptographicAlgorithm.HMAC_SHA384: "HMAC-SHA384",
            enums.CryptographicAlgorithm.HMAC_SHA512: "HMAC-SHA512"}
# What each use needs of the caller (as core/crypto.py asks it: a refusal is audited there).
USES = {"encrypt": Usage.ENCRYPT, "decrypt": Usage.DECRYPT, "sign": Usage.SIGN, "verify": Usage.VERIFY,
        "mac": Usage.MAC_GENERATE, "mac_verify": Usage.MAC_VERIFY}
PERMISSIONS = {"encrypt": Permission.KEYS_ENCRYPT, "decrypt": Permission.KEYS_DECRYPT,
               "sign": Permission.KEYS_ENCRYPT, "verify": Permission.KEYS_VERIFY,
               "mac": Permission.KEYS_ENCRYPT, "mac_verify": Permission.KEYS_VERIFY}


def algorithm_of(obj: VersionObject | StandaloneObject) -> str | None:
    if isinstance(obj, VersionObject):
        return obj.key.algorithm
    if isinstance(obj, PublicKeyObject):
        return public_key_algorithm(obj)
    return obj.algorithm


def _build(stored: dict[str, Any]) -> Any:
    return kmip_attributes.CryptographicParameters(**parameters_value(stored))


def _agrees(params: Any, algorithm: str | None) -> None:
    named = _algorithm(params)
    if named is not None and algorithm is not None and FAMILIES.get(named) != algorithm:
        raise KmipFailure(R.INVALID_FIELD, f"the Cryptographic Parameters name {named.name}, but the key is "
                                           f"an {algorithm} key")


def effective(requested: Any, obj: VersionObject | StandaloneObject) -> Any:
    """The parameters a use runs with: the request's, completed from (or, absent, taken
    from) the object's own; refused when they contradict the object."""
    algorithm = algorithm_of(obj)
    own = stored_parameters(obj)
    if not own:
        if requested is not None:
            _agrees(requested, algorithm)
        return requested
    asked = parameters_stored(requested) if requested is not None else {}
    for instance in own:
        if all(instance.get(k, v) == v for k, v in asked.items()):
            chosen = _build({**instance, **asked})
            _agrees(chosen, algorithm)
            return chosen
    raise KmipFailure(R.INVALID_FIELD, f"the request's Cryptographic Parameters ({_describe(asked)}) contradict "
                      f"the object's ({'; '.join(_describe(p) for p in own)}); name none to use the object's")


def for_use(call: Call, uid: str, use: str, requested: Any) -> Any:
    """`effective` for the object `uid` names (the cached resolution the use then repeats)."""
    obj = call.engine.objects.resolve_for_export(call.ctx, uid, action=f"key.{use}", permission=PERMISSIONS[use])
    if not usage_of(obj) & USES[use]:
        return requested  # the object cannot do this at all: the use refuses it (Illegal Operation)
    return effective(requested, obj)


def for_cipher(call: Call, uid: str, use: str, requested: Any) -> tuple[Cipher, bool]:
    """Encrypt/Decrypt: the `cipher` of `for_use`'s parameters, and whether the object is
    an AES key (whose absent mode means GCM)."""
    obj = call.engine.objects.resolve_for_export(call.ctx, uid, action=f"key.{use}", permission=PERMISSIONS[use])
    params = effective(requested, obj) if usage_of(obj) & USES[use] else requested
    return cipher(params), algorithm_of(obj) == "AES"


# What the HSM takes (hsm/mechanisms.py): GCM with a 96-bit IV (NIST SP 800-38D's
# recommended length; SoftHSM2 answers CKR_ARGUMENTS_BAD to others), CBC with one block.
GCM_IV_BYTES, CBC_IV_BYTES = 12, 16
TAG_BYTES = range(12, 17)


def check_lengths(params: Cipher, aes: bool, *, iv: bytes | None, tag: bytes | None = None) -> None:
    """Refuse an IV or tag the token would not take, before it sees them (Invalid Field,
    KMIP 1.4 §4.29/§4.30: a field of the request is not acceptable), naming what is."""
    if not aes:
        return
    gcm = params.mode in (None, AES_GCM)
    if iv is not None:
        want = GCM_IV_BYTES if gcm else CBC_IV_BYTES
        if len(iv) != want:
            mode = "GCM" if gcm else "CBC"
            raise KmipFailure(R.INVALID_FIELD, f"the IV/Counter/Nonce is {len(iv)} bytes; an AES-{mode} IV is "
                                               f"{want} bytes ({want * 8} bits), the only length served"
                                               + (" (omit it and the HSM draws one)" if gcm else ""))
    if tag is not None and gcm and len(tag) not in TAG_BYTES:
        raise KmipFailure(R.INVALID_FIELD, f"the Authenticated Encryption Tag is {len(tag)} bytes; a GCM tag is "
                                           f"{TAG_BYTES.start} to {TAG_BYTES.stop - 1} bytes")


def _describe(stored: dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(stored.items())) or "none"


def check_defaults(parameters: list[dict[str, Any]], algorithm: str) -> None:
    """Refuse at Create/Register what no use of the object could honour later."""
    for stored in parameters:
        params = _build(stored)
        _agrees(params, algorithm)
        if algorithm == "AES":
            cipher(params)
        elif algorithm in ("HMAC-SHA256", "HMAC-SHA384", "HMAC-SHA512"):
            own = "SHA-" + algorithm.removeprefix("HMAC-SHA")
            if (stored.get("hashing_algorithm") or own.replace("-", "_")) != own.replace("-", "_") or \
                    set(stored) - {"cryptographic_algorithm", "hashing_algorithm"}:
                raise KmipFailure(R.INVALID_FIELD, f"an {algorithm} key MACs with {own} and takes no other "
                                                   "parameters")
        elif algorithm == "EC" or params.digital_signature_algorithm is not None or params.padding_method in (
                enums.PaddingMethod.PSS, enums.PaddingMethod.PKCS1v15):
            signature(params)
        else:
            cipher(params)
