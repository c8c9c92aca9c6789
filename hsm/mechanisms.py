"""Stored mechanism names, their PKCS#11 parameters, and the key templates we create.

The names in `hsm.backend` are part of the stored format; this module is the single
translation from a name to what the token (python-pkcs11) and `cryptography` need.
Templates are written out in full rather than left to python-pkcs11's defaults, so that
what a key may do is visible here, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding
from pkcs11 import MGF, Attribute, KeyType, Mechanism, ObjectClass
from pkcs11.constants import DEFAULT

from hsm.backend import RSA_OAEP_SHA1, RSA_OAEP_SHA256
from hsm.errors import HsmInvalidInput

KEK_BITS: Final = 2048
KEK_PUBLIC_EXPONENT: Final = 65537
DATA_KEY_BITS: Final = 256
IMPORTABLE_KEY_SIZES: Final = frozenset({16, 24, 32})
HMAC_KEY_BYTES: Final = 32
MIN_RECIPIENT_RSA_BITS: Final = 2048

GCM_IV_BYTES: Final = 12
GCM_TAG_BITS: Final = 128
GCM_TAG_BYTES: Final = GCM_TAG_BITS // 8


@dataclass(frozen=True)
class OaepScheme:
    name: str
    hash_mechanism: Mechanism
    mgf: MGF
    hash_factory: type[hashes.SHA1] | type[hashes.SHA256]

    @property
    def pkcs11_param(self) -> tuple[Mechanism, MGF, None]:
        # (hashAlg, mgf, source data): an empty OAEP label, as in the stored format.
        return (self.hash_mechanism, self.mgf, None)

    def software_padding(self) -> padding.OAEP:
        return padding.OAEP(
            mgf=padding.MGF1(algorithm=self.hash_factory()),
            algorithm=self.hash_factory(),
            label=None,
        )


OAEP_SCHEMES: Final = {
    scheme.name: scheme
    for scheme in (
        OaepScheme(RSA_OAEP_SHA1, Mechanism.SHA_1, MGF.SHA1, hashes.SHA1),
        OaepScheme(RSA_OAEP_SHA256, Mechanism.SHA256, MGF.SHA256, hashes.SHA256),
    )
}


def oaep_scheme(name: str) -> OaepScheme:
    try:
        return OAEP_SCHEMES[name]
    except KeyError:
        raise HsmInvalidInput(
            f"unknown key-wrapping mechanism {name!r}; expected one of {sorted(OAEP_SCHEMES)}"
        ) from None


# --- templates ---------------------------------------------------------------
# Every capability is set explicitly (False unless needed), so that a token's own
# defaults can never grant a key more than we meant to.
_NO_CAPABILITIES: Final[dict[Attribute, Any]] = {
    Attribute.ENCRYPT: False,
    Attribute.DECRYPT: False,
    Attribute.WRAP: False,
    Attribute.UNWRAP: False,
    Attribute.SIGN: False,
    Attribute.VERIFY: False,
    Attribute.DERIVE: False,
}


def kek_public_template(kek_id: str) -> dict[Attribute, Any]:
    return {
        Attribute.TOKEN: True,
        Attribute.PRIVATE: False,
        Attribute.LABEL: kek_id,
        Attribute.ID: kek_id.encode("utf-8"),
        Attribute.MODULUS_BITS: KEK_BITS,
        Attribute.PUBLIC_EXPONENT: KEK_PUBLIC_EXPONENT.to_bytes(3, "big"),
        Attribute.WRAP: True,
        Attribute.ENCRYPT: True,
        Attribute.VERIFY: False,
        Attribute.VERIFY_RECOVER: False,
        Attribute.DERIVE: False,
        Attribute.MODIFIABLE: False,
    }


def kek_private_template(kek_id: str) -> dict[Attribute, Any]:
    return {
        Attribute.TOKEN: True,
        Attribute.PRIVATE: True,
        Attribute.LABEL: kek_id,
        Attribute.ID: kek_id.encode("utf-8"),
        Attribute.SENSITIVE: True,
        Attribute.EXTRACTABLE: False,
        Attribute.UNWRAP: True,
        Attribute.DECRYPT: False,
        Attribute.SIGN: False,
        Attribute.SIGN_RECOVER: False,
        Attribute.DERIVE: False,
        Attribute.MODIFIABLE: False,
        Attribute.COPYABLE: False,
    }


def _session_secret(overrides: dict[Attribute, Any]) -> dict[Attribute, Any]:
    return {
        Attribute.CLASS: ObjectClass.SECRET_KEY,
        Attribute.KEY_TYPE: KeyType.AES,
        Attribute.TOKEN: False,
        Attribute.PRIVATE: True,
        Attribute.SENSITIVE: True,
        Attribute.EXTRACTABLE: False,
        **_NO_CAPABILITIES,
        **overrides,
    }


# A data key that exists only to be wrapped (generate, rewrap): it can leave the token
# wrapped, and do nothing else.
TRANSIT_KEY_TEMPLATE: Final = _session_secret({Attribute.EXTRACTABLE: True})
# The cached handle behind encrypt_with/decrypt_with: usable, never leaves the token.
WORKING_KEY_TEMPLATE: Final = _session_secret({Attribute.ENCRYPT: True, Attribute.DECRYPT: True})
# unwrap_key's one purpose is to hand out the plaintext, which needs a readable CKA_VALUE.
EXPORT_KEY_TEMPLATE: Final = _session_secret({Attribute.SENSITIVE: False, Attribute.EXTRACTABLE: True})


# A managed HMAC key (generic secret): leaves the token only wrapped under a KEK...
HMAC_TRANSIT_TEMPLATE: Final = _session_secret({Attribute.KEY_TYPE: KeyType.GENERIC_SECRET,
                                                Attribute.EXTRACTABLE: True})
# ...and is used (cached handle) for MACs only.
HMAC_WORKING_TEMPLATE: Final = _session_secret({Attribute.KEY_TYPE: KeyType.GENERIC_SECRET,
                                                Attribute.SIGN: True, Attribute.VERIFY: True})
# A sealed object's DEK opened to unwrap the object inside the token, nothing else.
SEALED_DEK_TEMPLATE: Final = _session_secret({Attribute.UNWRAP: True})
HMAC_BITS: Final = frozenset({256, 384, 512})
HMAC_IMPORT_BYTES: Final = range(16, 129)


def opened_private_template(key_type: KeyType = KeyType.RSA) -> dict[Attribute, Any]:
    """A client private key opened from its sealed form for Sign/Decrypt: a sensitive
    session object that can never leave the token. python-pkcs11 adds every capability
    attribute to an unwrap template; Encrypt, Wrap and Verify do not exist on a private
    key (SoftHSM2 answers CKR_ATTRIBUTE_TYPE_INVALID), so they are left out (DEFAULT).
    An EC key only signs (ECDH derivation is not a service we offer)."""
    return {Attribute.CLASS: ObjectClass.PRIVATE_KEY, Attribute.KEY_TYPE: key_type, Attribute.TOKEN: False,
            Attribute.PRIVATE: True, Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False,
            Attribute.SIGN: True, Attribute.DECRYPT: key_type == KeyType.RSA, Attribute.UNWRAP: False,
            Attribute.DERIVE: False, Attribute.ENCRYPT: DEFAULT, Attribute.WRAP: DEFAULT, Attribute.VERIFY: DEFAULT}


HASH_MECHANISMS: Final = {"SHA-1": Mechanism.SHA_1, "SHA-256": Mechanism.SHA256, "SHA-384": Mechanism.SHA384,
                          "SHA-512": Mechanism.SHA512}
HASH_MGF: Final = {"SHA-1": MGF.SHA1, "SHA-256": MGF.SHA256, "SHA-384": MGF.SHA384, "SHA-512": MGF.SHA512}
HASH_BYTES: Final = {"SHA-1": 20, "SHA-256": 32, "SHA-384": 48, "SHA-512": 64}
HMAC_MECHANISMS: Final = {"SHA-256": Mechanism.SHA256_HMAC, "SHA-384": Mechanism.SHA384_HMAC,
                          "SHA-512": Mechanism.SHA512_HMAC}
PSS_MECHANISMS: Final = {"SHA-256": Mechanism.SHA256_RSA_PKCS_PSS, "SHA-384": Mechanism.SHA384_RSA_PKCS_PSS,
                         "SHA-512": Mechanism.SHA512_RSA_PKCS_PSS}
PKCS1_MECHANISMS: Final = {"SHA-256": Mechanism.SHA256_RSA_PKCS, "SHA-384": Mechanism.SHA384_RSA_PKCS,
                           "SHA-512": Mechanism.SHA512_RSA_PKCS}


# Sizes of the RSA key pairs the token generates for clients (KMIP CreateKeyPair).
CLIENT_RSA_BITS: Final = frozenset({2048, 3072, 4096})


def client_rsa_templates() -> tuple[dict[Attribute, Any], dict[Attribute, Any]]:
    """Session objects for a generated client key pair: the private half is sensitive
    and may leave the token only wrapped, and can do nothing else while inside it."""
    public = {Attribute.TOKEN: False, Attribute.PRIVATE: False,
              Attribute.PUBLIC_EXPONENT: KEK_PUBLIC_EXPONENT.to_bytes(3, "big"), Attribute.ENCRYPT: False,
              Attribute.WRAP: False, Attribute.VERIFY: False, Attribute.DERIVE: False}
    private = {Attribute.TOKEN: False, Attribute.PRIVATE: True, Attribute.SENSITIVE: True,
               Attribute.EXTRACTABLE: True, Attribute.DECRYPT: False, Attribute.UNWRAP: False,
               Attribute.SIGN: False, Attribute.DERIVE: False}
    return public, private


# Client EC key pairs (KMIP CreateKeyPair with EC/ECDSA): our curve name → the curve's
# name for python-pkcs11's CKA_EC_PARAMS encoder, its `cryptography` curve, its length.
CLIENT_EC_CURVES: Final[dict[str, tuple[str, ec.EllipticCurve, int]]] = {
    "P-256": ("secp256r1", ec.SECP256R1(), 256), "P-384": ("secp384r1", ec.SECP384R1(), 384)}


def client_ec_templates() -> tuple[dict[Attribute, Any], dict[Attribute, Any]]:
    """As client_rsa_templates: the private half leaves the token only wrapped."""
    public = {Attribute.TOKEN: False, Attribute.PRIVATE: False, Attribute.VERIFY: False, Attribute.DERIVE: False}
    private = {Attribute.TOKEN: False, Attribute.PRIVATE: True, Attribute.SENSITIVE: True,
               Attribute.EXTRACTABLE: True, Attribute.SIGN: False, Attribute.DERIVE: False}
    return public, private


# The AES key that wraps a generated private key: it wraps once, then leaves wrapped.
PAIR_DEK_TEMPLATE: Final = _session_secret({Attribute.EXTRACTABLE: True, Attribute.WRAP: True})


def recipient_public_template(modulus: int, exponent: int) -> dict[Attribute, Any]:
    return {
        Attribute.CLASS: ObjectClass.PUBLIC_KEY,
        Attribute.KEY_TYPE: KeyType.RSA,
        Attribute.TOKEN: False,
        Attribute.PRIVATE: False,
        Attribute.MODULUS: _int_bytes(modulus),
        Attribute.PUBLIC_EXPONENT: _int_bytes(exponent),
        Attribute.WRAP: True,
        Attribute.ENCRYPT: False,
        Attribute.VERIFY: False,
        Attribute.VERIFY_RECOVER: False,
        Attribute.DERIVE: False,
    }


def hmac_key_template(key_id: str) -> dict[Attribute, Any]:
    return {
        Attribute.CLASS: ObjectClass.SECRET_KEY,
        Attribute.KEY_TYPE: KeyType.GENERIC_SECRET,
        Attribute.TOKEN: True,
        Attribute.PRIVATE: True,
        Attribute.LABEL: key_id,
        Attribute.ID: key_id.encode("utf-8"),
        Attribute.VALUE_LEN: HMAC_KEY_BYTES,
        Attribute.SENSITIVE: True,
        Attribute.EXTRACTABLE: False,
        **_NO_CAPABILITIES,
        Attribute.SIGN: True,
        Attribute.MODIFIABLE: False,
        Attribute.COPYABLE: False,
    }


def signing_key_templates(key_id: str) -> tuple[dict[Attribute, Any], dict[Attribute, Any]]:
    """A token-resident EC pair that signs (audit checkpoints): the private half is
    sensitive and never extractable, the public half readable by anyone."""
    ident = {Attribute.LABEL: key_id, Attribute.ID: key_id.encode("utf-8"), Attribute.TOKEN: True,
             Attribute.MODIFIABLE: False}
    public = {**ident, Attribute.PRIVATE: False, Attribute.VERIFY: True, Attribute.ENCRYPT: False,
              Attribute.WRAP: False, Attribute.DERIVE: False}
    private = {**ident, Attribute.PRIVATE: True, Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False,
               Attribute.SIGN: True, Attribute.DECRYPT: False, Attribute.UNWRAP: False, Attribute.DERIVE: False}
    return public, private


def _int_bytes(value: int) -> bytes:
    return value.to_bytes((value.bit_length() + 7) // 8 or 1, "big")
