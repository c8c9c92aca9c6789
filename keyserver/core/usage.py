"""Cryptographic usage masks: what an object may be used for (KMIP 1.4 §3.19), kept per
object and enforced by every operation that uses a key.

A client may narrow an object's uses when it creates or registers it (its Cryptographic
Usage Mask); it can never widen them past what the object's kind can do. A request
that leaves nothing its kind can do (PyKMIP's client sends Encrypt|Decrypt with every
Create, an HMAC key's included) means "the kind's uses". Objects made over REST, or
without a mask, have their kind's uses.
"""

from __future__ import annotations

from enum import IntFlag
from typing import Any


class Usage(IntFlag):
    """The bits of KMIP's Cryptographic Usage Mask (same values)."""

    SIGN = 0x01
    VERIFY = 0x02
    ENCRYPT = 0x04
    DECRYPT = 0x08
    WRAP_KEY = 0x10
    UNWRAP_KEY = 0x20
    EXPORT = 0x40
    MAC_GENERATE = 0x80
    MAC_VERIFY = 0x100
    DERIVE_KEY = 0x200


U = Usage
USAGE_ATTRIBUTE = "Cryptographic Usage Mask"  # its name in kmip_attributes
_BY_KIND: dict[str, Usage] = {
    "AES": U.ENCRYPT | U.DECRYPT | U.WRAP_KEY | U.UNWRAP_KEY,
    "HMAC": U.MAC_GENERATE | U.MAC_VERIFY,
    "public-key": U.ENCRYPT | U.VERIFY | U.WRAP_KEY,
    "private-key": U.SIGN | U.DECRYPT | U.UNWRAP_KEY,
    "secret-data": U.DERIVE_KEY,
    "certificate": U.VERIFY,
    "opaque-object": U(0),
}


def kind_uses(kind: str, algorithm: str | None = None) -> Usage:
    """Everything an object of this kind can do (symmetric keys: by algorithm)."""
    if kind == "symmetric-key":
        return _BY_KIND["HMAC" if (algorithm or "AES").startswith("HMAC") else "AES"]
    if algorithm == "EC" and kind in ("private-key", "public-key"):  # ECDSA: sign and verify, nothing else
        return U.SIGN if kind == "private-key" else U.VERIFY
    return _BY_KIND.get(kind, U(0))


def requested_uses(kind: str, algorithm: str | None, requested: int | None) -> int | None:
    """What to keep of a client's mask: the part its kind can do, or None (the kind's uses)."""
    if requested is None:
        return None
    kept = Usage(int(requested) & int(kind_uses(kind, algorithm)))
    return int(kept) if kept else None


def uses_of(kind: str, algorithm: str | None, stored: dict[str, Any] | None) -> Usage:
    """An object's uses: the mask kept at its creation, or its kind's."""
    value = (stored or {}).get(USAGE_ATTRIBUTE)
    allowed = kind_uses(kind, algorithm)
    return Usage(int(value) & int(allowed)) if isinstance(value, int) else allowed
