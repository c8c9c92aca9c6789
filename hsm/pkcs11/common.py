"""What every part of the backend shares: the KEK and lease records, what a refused
operation means, and small helpers over token objects.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any, Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pkcs11 import Attribute, KeyType
from pkcs11 import exceptions as p11

from hsm import faults, mechanisms
from hsm.backend import KekInfo, WrappedKey
from hsm.errors import HsmError, HsmIntegrityError, HsmInvalidInput, HsmUnavailable
from hsm.handles import CacheKey, _SecretKey, _View, _WrapMixin

log = logging.getLogger(__name__)

MAX_ID_CHARS: Final = 128
INTEGRITY_MESSAGE: Final = "wrapped key or ciphertext failed to unwrap or verify"


@dataclass(frozen=True)
class Kek:
    info: KekInfo
    public_handle: int
    private_handle: int
    public_key: rsa.RSAPublicKey


@dataclass(frozen=True)
class Lease:
    """A borrowed session and the pool generation it belongs to."""

    session: Any
    generation: int


# What a CRYPTO fault (the token refused the data or the key) means, per operation.
def integrity_error(_what: str, _name: str) -> HsmError:
    return HsmIntegrityError(INTEGRITY_MESSAGE)


def invalid_input(what: str, name: str) -> HsmError:
    return HsmInvalidInput(f"{what}: the token rejected the input ({name})")


def refused(what: str, name: str) -> HsmError:
    return HsmUnavailable(f"{what}: the token refused the operation ({name})")


class AesWrapView(_View, _WrapMixin, _SecretKey):  # type: ignore[misc]
    """An AES session key that may only wrap (wrap_with_key)."""

    key_type = KeyType.AES


# A session AES key whose one capability is wrapping; it never leaves the token.
AES_WRAPPING_TEMPLATE: Final = {**mechanisms.TRANSIT_KEY_TEMPLATE, Attribute.EXTRACTABLE: False,
                                 Attribute.WRAP: True}



def handle_cache_key(wrapped: WrappedKey) -> CacheKey:
    return (
        wrapped.wrapping_key_id,
        wrapped.mechanism,
        hashlib.sha256(wrapped.ciphertext).digest(),
    )


def check_id(value: str, *, what: str) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        raise HsmInvalidInput(f"{what} must be a string of 1..{MAX_ID_CHARS} characters")
    if value != value.strip() or not value.isprintable():
        raise HsmInvalidInput(f"{what} must be printable, without surrounding whitespace")


def load_recipient_key(der: bytes) -> rsa.RSAPublicKey:
    try:
        key = serialization.load_der_public_key(bytes(der))
    except (ValueError, TypeError):
        raise HsmInvalidInput(
            "recipient public key is not a DER SubjectPublicKeyInfo"
        ) from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise HsmInvalidInput("recipient public key must be RSA")
    if key.key_size < mechanisms.MIN_RECIPIENT_RSA_BITS:
        raise HsmInvalidInput(
            f"recipient RSA key has {key.key_size} bits; at least "
            f"{mechanisms.MIN_RECIPIENT_RSA_BITS} are required"
        )
    return key


def start_date(obj: Any) -> datetime | None:
    try:
        value = obj[Attribute.START_DATE]
    except (p11.PKCS11Error, ValueError):
        # Unset CK_DATE comes back empty, which python-pkcs11 cannot parse.
        return None
    if not isinstance(value, date):
        return None
    # CK_DATE has no time of day; midnight UTC is the honest reading of it.
    return datetime.combine(value, time.min, tzinfo=UTC)



def der_octet_string(data: bytes) -> bytes:
    """The contents of a DER OCTET STRING (how PKCS#11 v2.20+ tokens give CKA_EC_POINT);
    a bare point (some older tokens) is returned as it is."""
    if len(data) >= 2 and data[0] == 0x04:
        length, offset = data[1], 2
        if length & 0x80:
            n = length & 0x7F
            length, offset = int.from_bytes(data[2:2 + n], "big"), 2 + n
        if offset + length == len(data):
            return data[offset:]
    return data


def destroy_quietly(obj: Any) -> None:
    """Destroy a session object; if its session is gone, so is the object."""
    try:
        obj.destroy()
    except p11.PKCS11Error as exc:
        log.debug("destroying a session object failed: %s", faults.describe(exc))


def session_rsa_pair(session: Any) -> tuple[Any, Any]:
    """A throw-away RSA-2048 wrap/unwrap pair as session objects (probes and benchmarks)."""
    return session.generate_keypair(  # type: ignore[no-any-return]
        KeyType.RSA,
        mechanisms.KEK_BITS,
        store=False,
        capabilities=0,
        public_template={Attribute.TOKEN: False, Attribute.WRAP: True},
        private_template={
            Attribute.TOKEN: False,
            Attribute.UNWRAP: True,
            Attribute.SENSITIVE: True,
            Attribute.EXTRACTABLE: False,
        },
    )
