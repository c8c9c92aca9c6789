"""Per-token capabilities: what the mechanism list says, corrected by known quirks.

This is the only place where a token's make or version decides behaviour. A quirk
entry is authoritative for the tokens it matches; a token without an entry is probed
once at open (an OAEP round trip with throw-away session keys), because the mechanism
list says "CKM_RSA_PKCS_OAEP" without saying which hash functions the token accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from pkcs11 import Mechanism

from hsm.backend import RSA_OAEP_SHA1, RSA_OAEP_SHA256, TokenCapabilities

# Preference order for wrapping: the first scheme the token supports wins.
_OAEP_PREFERENCE: Final = (RSA_OAEP_SHA256, RSA_OAEP_SHA1)


@dataclass(frozen=True)
class TokenIdentity:
    manufacturer: str
    model: str
    firmware: tuple[int, int]

    @property
    def firmware_text(self) -> str:
        return f"{self.firmware[0]}.{self.firmware[1]}"


@dataclass(frozen=True)
class TokenQuirk:
    manufacturer: str
    model: str
    # Firmware versions (major, minor) the quirk applies to, inclusive.
    firmware_from: tuple[int, int]
    firmware_to: tuple[int, int]
    # RSA-OAEP schemes that work inside the token for wrap AND unwrap.
    rsa_oaep: tuple[str, ...]
    why: str
    # The token ignores CKA_SENSITIVE/CKA_EXTRACTABLE in C_UnwrapKey templates.
    unwrap_sets_attributes_after: bool = False

    def matches(self, token: TokenIdentity) -> bool:
        return (
            token.manufacturer == self.manufacturer
            and token.model == self.model
            and self.firmware_from <= token.firmware <= self.firmware_to
        )


KNOWN_QUIRKS: Final = (
    TokenQuirk(
        manufacturer="SoftHSM project",
        model="SoftHSM v2",
        firmware_from=(2, 0),
        firmware_to=(2, 255),
        rsa_oaep=(RSA_OAEP_SHA1,),
        why=(
            "CKM_RSA_PKCS_OAEP with SHA-256 gives CKR_ARGUMENTS_BAD for wrap/unwrap/"
            "encrypt in 2.6.1, 2.7.0 and master; see docs/decisions/0001"
        ),
    ),
    # openCryptoki's soft token (libpkcs11_sw.so). Its firmware version comes from
    # opencryptoki.conf (default 1.0 for this STDLL), so the range is open; measured on
    # Debian 12's 3.8.1 (docs/decisions/0018).
    TokenQuirk(
        manufacturer="IBM Corp.",
        model="IBM SoftTok",
        firmware_from=(0, 0),
        firmware_to=(255, 255),
        rsa_oaep=(RSA_OAEP_SHA256, RSA_OAEP_SHA1),
        why=(
            "OAEP-SHA-256 and OAEP-SHA-1 wrap and unwrap inside the token; C_UnwrapKey "
            "refuses CKA_EXTRACTABLE=TRUE and CKA_SENSITIVE=FALSE (CKR_ATTRIBUTE_READ_ONLY) and "
            "makes every unwrapped key non-sensitive and extractable whatever the template "
            "says; see docs/decisions/0018"
        ),
        unwrap_sets_attributes_after=True,
    ),
)


class NoUsableOaep(Exception):
    """The token cannot do RSA-OAEP key transport at all: it cannot hold our KEKs."""


def detect(
    token: TokenIdentity,
    mechanisms: Iterable[int],
    *,
    probe_oaep: Callable[[str], bool],
    quirks: Iterable[TokenQuirk] = KNOWN_QUIRKS,
) -> TokenCapabilities:
    """Build the capabilities record. `probe_oaep(name)` is only called for unknown tokens."""
    available = frozenset(int(m) for m in mechanisms)
    if int(Mechanism.RSA_PKCS_OAEP) not in available:
        raise NoUsableOaep("token does not list CKM_RSA_PKCS_OAEP")

    quirk = next((q for q in quirks if q.matches(token)), None)
    oaep = (
        quirk.rsa_oaep
        if quirk is not None
        else tuple(name for name in _OAEP_PREFERENCE if probe_oaep(name))
    )
    if not oaep:
        raise NoUsableOaep("token accepted neither OAEP-SHA-256 nor OAEP-SHA-1 for wrapping")

    wrap = next(name for name in _OAEP_PREFERENCE if name in oaep)
    return TokenCapabilities(
        manufacturer=token.manufacturer,
        model=token.model,
        firmware=token.firmware_text,
        rsa_wrap_mechanism=wrap,
        supports_aes_gcm=int(Mechanism.AES_GCM) in available,
        supports_hmac_sha256=int(Mechanism.SHA256_HMAC) in available,
        rsa_unwrap_mechanisms=frozenset(oaep),
        unwrap_sets_attributes_after=quirk is not None and quirk.unwrap_sets_attributes_after,
        supports_ecdsa={int(Mechanism.EC_KEY_PAIR_GEN), int(Mechanism.ECDSA)} <= available,
        supports_aes_key_wrap_pad=int(Mechanism.AES_KEY_WRAP_PAD) in available,
    )


def missing_services(capabilities: TokenCapabilities) -> tuple[str, ...]:
    """What the token cannot do, each as "mechanism (what it turns off)", for the startup
    line: an operator pointing the server at a smaller token learns it before a client does."""
    lacking = []
    if not capabilities.supports_aes_gcm:
        lacking.append("CKM_AES_GCM (data-key and AES-GCM encryption)")
    if not capabilities.supports_hmac_sha256:
        lacking.append("CKM_SHA256_HMAC (the audit chain)")
    if not capabilities.supports_ecdsa:
        lacking.append("CKM_ECDSA (EC key pairs, audit checkpoint signatures)")
    if not capabilities.supports_aes_key_wrap_pad:
        lacking.append("CKM_AES_KEY_WRAP_PAD (sealed private keys, AES-wrapped Get)")
    return tuple(lacking)
