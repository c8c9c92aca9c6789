"""KMIP objects as the core sees them: the attribute names it keeps, the kinds of
object (a managed key's version, a registered public key, a sealed object), what an
operation gets back, and the rules every operation applies to an object's dates,
uses and audit identity. No database access, no HSM."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeAlias

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from keyserver.core.keys import (
    PROTECT_STOP_DATE,
)
from keyserver.core.states import KeyState
from keyserver.core.usage import USAGE_ATTRIBUTE, Usage, uses_of
from keyserver.store.models import KeyVersion, KmipPublicKey, KmipSealedObject, ManagedKey

MAX_LOCATE = 1000
SCAN_LIMIT = 20_000  # candidates per kind of object when Locate filters on stored attributes
# Standard attributes a client may set, as kept in `kmip_attributes` (KMIP names).
CONTACT_INFORMATION, OBJECT_GROUP = "Contact Information", "Object Group"
APPLICATION_SPECIFIC_INFORMATION = "Application Specific Information"
NAME = "Name"
# Attributes a client may add, modify and delete (besides custom "x-" ones); the others
# are the server's. Multi-instance ones hold a list (KMIP 1.4 §3: Object Group and
# Application Specific Information may appear several times).
CLIENT_ATTRIBUTES = frozenset({NAME, CONTACT_INFORMATION, OBJECT_GROUP, APPLICATION_SPECIFIC_INFORMATION})
MULTI_INSTANCE = frozenset({OBJECT_GROUP, APPLICATION_SPECIFIC_INFORMATION})
# Server-kept attributes in `kmip_attributes` a client sets only when it creates or
# registers the object: a symmetric key's Process Start and Protect Stop Dates, per
# version ({"<version>": epoch seconds}: a ReKey's replacement starts without them), and
# the Cryptographic Parameters each use takes by default (a list of instances).
PROCESS_START_DATE = "Process Start Date"
CRYPTOGRAPHIC_PARAMETERS = "Cryptographic Parameters"
SERVER_KEPT = frozenset({PROCESS_START_DATE, PROTECT_STOP_DATE, CRYPTOGRAPHIC_PARAMETERS})
# Uses that apply protection, and those that process protected data (KMIP 1.4 §3.25-3.26).
PROTECT_USES = frozenset({"encrypt", "sign", "mac", "wrap"})
PROCESS_USES = frozenset({"decrypt", "verify", "mac_verify", "unwrap"})
MAX_INSTANCES = 32
MAX_TEXT = 1024
PRIVATE_KEY, SECRET_DATA, CERTIFICATE, OPAQUE = "private-key", "secret-data", "certificate", "opaque-object"
SEALED_TYPES = frozenset({PRIVATE_KEY, SECRET_DATA, CERTIFICATE, OPAQUE})
RSA_PAIR_BITS = frozenset({2048, 3072, 4096})
EC_PAIR_CURVES = {256: "P-256", 384: "P-384"}  # Cryptographic Length → curve (EC pairs)
PAIR_GENERATIONS = 2  # RSA key pairs generated at once per replica
MAX_SECRET_BYTES = 64 * 1024
# Objects with a lifecycle of their own (not a managed key's version).
StandaloneObject = KmipPublicKey | KmipSealedObject
# Their two kinds by the names the KMIP layer uses (keyserver/kmip never imports the
# store): a registered or generated public key, and a sealed object (a private key,
# secret data, a certificate, an opaque object).
PublicKeyObject: TypeAlias = KmipPublicKey
SealedObject: TypeAlias = KmipSealedObject


@dataclass(frozen=True, slots=True)
class VersionObject:
    """A key version with what KMIP attributes need from its key."""

    key: ManagedKey
    version: KeyVersion

    @property
    def uid(self) -> str:
        return str(self.version.id)

    @property
    def replaced_uid(self) -> str | None:
        older = [v for v in self.key.versions if v.version == self.version.version - 1]
        return str(older[0].id) if older else None

    @property
    def replacement_uid(self) -> str | None:
        newer = [v for v in self.key.versions if v.version == self.version.version + 1]
        return str(newer[0].id) if newer else None

    @property
    def is_newest(self) -> bool:
        return self.key.versions[-1].id == self.version.id


@dataclass(frozen=True, slots=True)
class VersionRef:
    """Which managed key version a KMIP identifier names: all that an operation which
    then changes it under the key's lock (Activate, Revoke, Destroy) needs to know."""

    key_id: uuid.UUID
    version: int


@dataclass(frozen=True, slots=True)
class ExportedKey:
    obj: VersionObject
    material: bytes = field(repr=False)
    # None: plaintext; else the mechanism the material is wrapped with.
    wrapping_mechanism: str | None = None


@dataclass(frozen=True, slots=True)
class CreatedPair:
    private: KmipSealedObject
    public: KmipPublicKey


@dataclass(frozen=True, slots=True)
class LocateQuery:
    name: str | None = None
    object_type: str | None = None  # "symmetric-key" | "public-key" | one of SEALED_TYPES
    state: KeyState | None = None  # None: every state but the destroyed ones
    algorithm: str | None = None  # "AES", "RSA", "HMAC-SHA256", ...
    length_bits: int | None = None
    object_group: str | None = None
    contact_information: str | None = None
    certificate_type: str | None = None  # "x509"
    unique_identifier: uuid.UUID | None = None  # the one object, if it meets the rest
    maximum_items: int | None = None
    offset_items: int = 0

    def criteria(self) -> dict[str, object]:
        """What was asked, for the audit record."""
        out = {"name": self.name, "object_type": self.object_type,
               "state": self.state.value if self.state else None, "algorithm": self.algorithm,
               "length_bits": self.length_bits, "object_group": self.object_group,
               "contact_information": self.contact_information, "certificate_type": self.certificate_type,
               "unique_identifier": str(self.unique_identifier) if self.unique_identifier else None}
        return {k: v for k, v in out.items() if v is not None}




def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def use_window(obj: VersionObject | StandaloneObject) -> tuple[datetime | None, datetime | None]:
    """(Process Start Date, Protect Stop Date) of a symmetric key version, if it has them."""
    if not isinstance(obj, VersionObject):
        return None, None
    stored = obj.key.kmip_attributes or {}
    out: list[datetime | None] = []
    for name in (PROCESS_START_DATE, PROTECT_STOP_DATE):
        at = (stored.get(name) or {}).get(str(obj.version.version))
        out.append(datetime.fromtimestamp(int(at), UTC) if at is not None else None)
    return out[0], out[1]


def use_refusal(obj: VersionObject | StandaloneObject, use: str, now: datetime) -> str | None:
    """Why the object's dates forbid `use` now, or None. Enforced at the moment of use, not
    only when the scheduler next changes the state: a Deactivation Date that has passed
    stops protection at once, as do a passed Protect Stop Date and a Process Start Date
    still to come for processing (KMIP 1.4 §3.24-3.26)."""
    what = object_type_of(obj)
    deactivation = obj.version.deactivation_date if isinstance(obj, VersionObject) else obj.deactivation_date
    if use in PROTECT_USES and deactivation is not None and _aware(deactivation) <= now:
        return (f"the {what}'s Deactivation Date ({_aware(deactivation).isoformat()}) has passed: it no longer "
                f"may {use}; it may still process (decrypt, verify)")
    process_start, protect_stop = use_window(obj)
    if use in PROTECT_USES and protect_stop is not None and protect_stop <= now:
        return (f"the {what}'s Protect Stop Date ({protect_stop.isoformat()}) has passed: it no longer may {use}; "
                "it may still decrypt until it is deactivated")
    if use in PROCESS_USES and process_start is not None and process_start > now:
        return (f"the {what}'s Process Start Date ({process_start.isoformat()}) is still to come: it may not "
                f"{use.replace('_', ' ')} before then")
    return None


def stored_parameters(obj: VersionObject | StandaloneObject) -> list[dict[str, Any]]:
    """The Cryptographic Parameters instances set when the object was made: each use's defaults."""
    stored = (obj.key.kmip_attributes if isinstance(obj, VersionObject) else obj.kmip_attributes) or {}
    return [dict(p) for p in stored.get(CRYPTOGRAPHIC_PARAMETERS) or []]


def usage_of(obj: VersionObject | StandaloneObject) -> Usage:
    """What the object may be used for (keyserver/core/usage.py): every operation that
    uses a key checks it."""
    if isinstance(obj, VersionObject):
        return uses_of("symmetric-key", obj.key.algorithm, obj.key.kmip_attributes)
    algorithm = obj.algorithm if isinstance(obj, KmipSealedObject) else public_key_algorithm(obj)
    kind = object_type_of(obj)
    kept = (obj.kmip_attributes or {}).get(USAGE_ATTRIBUTE)
    if kind == SECRET_DATA and isinstance(kept, int) and kept:
        return Usage(kept)  # the client's record, kept as sent (kmip/attributes.py)
    return uses_of(kind, algorithm, obj.kmip_attributes)


_EC_PUBLIC_KEY_OID = bytes.fromhex("06072a8648ce3d0201")  # id-ecPublicKey, as DER


def public_bits(key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey) -> int:
    return key.key_size if isinstance(key, rsa.RSAPublicKey) else key.curve.key_size


def public_key_algorithm(pk: KmipPublicKey) -> str:
    """"RSA" or "EC". The table keeps no algorithm: the SubjectPublicKeyInfo's
    AlgorithmIdentifier (in its first bytes) says it. (PKCS#1 public keys are RSA.)"""
    return "EC" if _EC_PUBLIC_KEY_OID in pk.der[:24] else "RSA"


def audit_identity(obj: VersionObject | StandaloneObject) -> tuple[str, str]:
    """(object type, object id) an object is audited under, whatever the operation: a
    symmetric key version under its managed key (as REST records it), with the version
    and KMIP identifier in the details; other objects under their KMIP identifier."""
    if isinstance(obj, VersionObject):
        return "key", str(obj.key.id)
    return object_type_of(obj).replace("-", "_"), str(obj.id)


def audit_details(obj: VersionObject | StandaloneObject) -> dict[str, object]:
    if isinstance(obj, VersionObject):
        return {"name": obj.key.name, "version": obj.version.version, "kmip_uid": obj.uid}
    return {"name": obj.name}


def object_type_of(obj: VersionObject | StandaloneObject) -> str:
    if isinstance(obj, VersionObject):
        return "symmetric-key"
    if isinstance(obj, KmipPublicKey):
        return "public-key"
    return obj.object_type


def load_public_der(der: bytes) -> object:
    """SubjectPublicKeyInfo, or KMIP's PKCS#1 RSAPublicKey (via its PEM armour)."""
    try:
        return serialization.load_der_public_key(der)
    except ValueError:
        pem = b"-----BEGIN RSA PUBLIC KEY-----\n" + base64.encodebytes(der) + b"-----END RSA PUBLIC KEY-----\n"
        return serialization.load_pem_public_key(pem)
