"""KMIP attributes of our objects, and the few we accept in templates.

Every TextString in a response is built fresh from our own data: PyKMIP gives a parsed
TextString whose length is a multiple of 8 eight extra zero bytes when it is written
again (PLATFORM.md), so nothing parsed is ever echoed back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from kmip.core import enums
from kmip.core.factories.attributes import AttributeFactory

from keyserver.core.keys import PROTECT_STOP_DATE
from keyserver.core.kmip_model import (
    APPLICATION_SPECIFIC_INFORMATION,
    CERTIFICATE,
    CLIENT_ATTRIBUTES,
    CRYPTOGRAPHIC_PARAMETERS,
    MULTI_INSTANCE,
    OPAQUE,
    PRIVATE_KEY,
    PROCESS_START_DATE,
    SECRET_DATA,
    SERVER_KEPT,
    PublicKeyObject,
    SealedObject,
    VersionObject,
    public_key_algorithm,
    usage_of,
)
from keyserver.core.states import KeyState
from keyserver.core.usage import USAGE_ATTRIBUTE, requested_uses
from keyserver.kmip.errors import KmipFailure

A = enums.AttributeType
_factory = AttributeFactory()

STATE_TO_KMIP: dict[str, enums.State] = {
    KeyState.PRE_ACTIVE: enums.State.PRE_ACTIVE,
    KeyState.ACTIVE: enums.State.ACTIVE,
    KeyState.DEACTIVATED: enums.State.DEACTIVATED,
    KeyState.COMPROMISED: enums.State.COMPROMISED,
    KeyState.DESTROYED: enums.State.DESTROYED,
    KeyState.DESTROYED_COMPROMISED: enums.State.DESTROYED_COMPROMISED,
}
KMIP_TO_STATE = {v: KeyState(k) for k, v in STATE_TO_KMIP.items()}
OBJECT_TYPES = {PRIVATE_KEY: enums.ObjectType.PRIVATE_KEY, SECRET_DATA: enums.ObjectType.SECRET_DATA,
                "certificate": enums.ObjectType.CERTIFICATE, OPAQUE: enums.ObjectType.OPAQUE_DATA}
# Links as custom attributes: PyKMIP 0.11 cannot decode the standard Link attribute, so
# a client built on it would fail to read any attribute list that held one.
X_KEY_ID, X_KEY_VERSION = "x-strongroom-key-id", "x-strongroom-key-version"
X_REPLACED, X_REPLACEMENT = "x-strongroom-replaced-object", "x-strongroom-replacement-object"
X_LINKED_PUBLIC, X_LINKED_PRIVATE = "x-strongroom-linked-public-key", "x-strongroom-linked-private-key"


class Instances(list[Any]):
    """The values of a multi-instance attribute: one Attribute each, indexed 0.. ."""


# Managed keys' algorithms as KMIP names them.
KEY_ALGORITHMS = {"AES": enums.CryptographicAlgorithm.AES, "HMAC-SHA256": enums.CryptographicAlgorithm.HMAC_SHA256,
                  "HMAC-SHA384": enums.CryptographicAlgorithm.HMAC_SHA384,
                  "HMAC-SHA512": enums.CryptographicAlgorithm.HMAC_SHA512}
ALGORITHM_OF_KMIP = {v: k for k, v in KEY_ALGORITHMS.items()}


def usage_list(mask: int) -> list[enums.CryptographicUsageMask]:
    return [m for m in enums.CryptographicUsageMask if int(m.value) & mask]


def _ts(t: datetime | None) -> int | None:
    return int(t.timestamp()) if t is not None else None


def version_values(obj: VersionObject) -> dict[str, Any]:
    """Attribute name → value (as PyKMIP's attribute factory takes it)."""
    k, v = obj.key, obj.version
    values: dict[str, Any] = {
        A.UNIQUE_IDENTIFIER.value: obj.uid,
        A.OBJECT_TYPE.value: enums.ObjectType.SYMMETRIC_KEY,
        A.CRYPTOGRAPHIC_ALGORITHM.value: KEY_ALGORITHMS[k.algorithm],
        A.CRYPTOGRAPHIC_LENGTH.value: k.length_bits,
        A.NAME.value: k.name,
        A.STATE.value: STATE_TO_KMIP[v.state],
        A.CRYPTOGRAPHIC_USAGE_MASK.value: usage_list(usage_of(obj)),
        A.INITIAL_DATE.value: _ts(v.created_at),
        A.ACTIVATION_DATE.value: _ts(v.activation_date),
        A.DEACTIVATION_DATE.value: _ts(v.deactivation_date),
        A.COMPROMISE_DATE.value: _ts(v.compromise_date),
        A.DESTROY_DATE.value: _ts(v.destroy_date),
        A.LAST_CHANGE_DATE.value: _ts(k.updated_at),
        # KMIP 1.4 §3.48: True when Get returns the key only wrapped (its export policy)
        A.SENSITIVE.value: not k.exportable,
        X_KEY_ID: str(k.id),
        X_KEY_VERSION: str(v.version),
        X_REPLACED: obj.replaced_uid,
        X_REPLACEMENT: obj.replacement_uid,
    }
    values.update(_client_values(k.kmip_attributes))
    values.update(_kept_values(k.kmip_attributes, version=v.version))
    for tag, tag_value in sorted(k.tags.items()):
        if not tag.startswith(RESERVED_TAG_PREFIX):
            values[f"x-{tag}"] = str(tag_value)
    return {name: value for name, value in values.items() if value is not None}


def _client_values(stored: dict[str, Any] | None) -> dict[str, Any]:
    """The attributes clients set (kmip_attributes), as `build` takes them."""
    out: dict[str, Any] = {}
    for name, value in sorted((stored or {}).items()):
        if name == USAGE_ATTRIBUTE or name in SERVER_KEPT:
            continue  # the usage is reported as usage_of says; the others by _kept_values
        if name == APPLICATION_SPECIFIC_INFORMATION:
            out[name] = Instances({"application_namespace": v["namespace"], "application_data": v["data"]}
                                  for v in value)
        elif name in MULTI_INSTANCE:
            out[name] = Instances(value)
        else:
            out[name] = value
    return out


def _kept_values(stored: dict[str, Any] | None, *, version: int | None = None) -> dict[str, Any]:
    """Process Start / Protect Stop Date (a key version's) and Cryptographic Parameters."""
    stored = stored or {}
    out: dict[str, Any] = {}
    if version is not None:
        for name in (PROCESS_START_DATE, PROTECT_STOP_DATE):
            at = (stored.get(name) or {}).get(str(version))
            if at is not None:
                out[name] = int(at)
    if stored.get(CRYPTOGRAPHIC_PARAMETERS):
        out[CRYPTOGRAPHIC_PARAMETERS] = Instances(parameters_value(p) for p in stored[CRYPTOGRAPHIC_PARAMETERS])
    return out


RESERVED_TAG_PREFIX = "strongroom-"


def settable(attribute_name: str) -> str:
    """`attribute_name` if a client may add, modify or delete it: Name, Contact
    Information, Object Group, Application Specific Information, or a custom `x-<name>`
    (on a symmetric key: its tag `<name>`). The others are the server's."""
    custom = attribute_name.startswith("x-") and not attribute_name[2:].startswith(RESERVED_TAG_PREFIX)
    if attribute_name in CLIENT_ATTRIBUTES or custom:
        return attribute_name
    them = f"clients change {', '.join(sorted(CLIENT_ATTRIBUTES))} and custom x-<name> attributes"
    if attribute_name in SERVER_SET or attribute_name.startswith(("x-", "y-")):
        raise KmipFailure(R.PERMISSION_DENIED, f"'{attribute_name}' is set by the server; {them}")
    if attribute_name in _FIXED:
        raise KmipFailure(R.PERMISSION_DENIED, f"'{attribute_name}' is fixed when the object is made; {them}")
    if attribute_name in _FOR_EVERY_KIND | _FOR_KEYS | _FOR_SYMMETRIC_KEYS:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, f"'{attribute_name}' is set in the Create or Register template "
                          "(states change with Activate and Revoke); this server does not change it afterwards")
    raise KmipFailure(R.FEATURE_NOT_SUPPORTED, f"the attribute '{attribute_name}' is not supported by this server; "
                      f"{them}")

# Key pairs' algorithms (an EC pair is created with EC or ECDSA and reported as EC, the
# key's type; ECDSA is what it may do, its usage mask says so).
PAIR_ALGORITHMS = {"RSA": enums.CryptographicAlgorithm.RSA, "EC": enums.CryptographicAlgorithm.EC}


def _lifecycle(obj: PublicKeyObject | SealedObject) -> dict[str, Any]:
    return {
        A.STATE.value: STATE_TO_KMIP[obj.state],
        A.INITIAL_DATE.value: _ts(obj.created_at),
        A.ACTIVATION_DATE.value: _ts(obj.activation_date),
        A.DEACTIVATION_DATE.value: _ts(obj.deactivation_date),
        A.COMPROMISE_DATE.value: _ts(obj.compromise_date),
        A.DESTROY_DATE.value: _ts(obj.destroy_date),
    }


def _last_change(obj: PublicKeyObject) -> int | None:
    """A public key has no change counter: its last lifecycle date that has passed."""
    now = datetime.now(UTC)
    dates = [d for d in (obj.created_at, obj.activation_date, obj.deactivation_date, obj.compromise_date,
                         obj.destroy_date) if d is not None and d <= now]
    return _ts(max(dates)) if dates else None


def public_key_values(pk: PublicKeyObject) -> dict[str, Any]:
    values: dict[str, Any] = {
        A.UNIQUE_IDENTIFIER.value: str(pk.id),
        A.OBJECT_TYPE.value: enums.ObjectType.PUBLIC_KEY,
        A.CRYPTOGRAPHIC_ALGORITHM.value: PAIR_ALGORITHMS[public_key_algorithm(pk)],
        A.CRYPTOGRAPHIC_LENGTH.value: pk.length_bits,
        A.NAME.value: pk.name,
        A.CRYPTOGRAPHIC_USAGE_MASK.value: usage_list(usage_of(pk)),
        **_lifecycle(pk),
        A.LAST_CHANGE_DATE.value: _last_change(pk),
        X_LINKED_PRIVATE: str(pk.private_key_id) if pk.private_key_id is not None else None,
        **_client_values(pk.kmip_attributes),
        **_kept_values(pk.kmip_attributes),
    }
    return {name: value for name, value in values.items() if value is not None}


def sealed_values(obj: SealedObject) -> dict[str, Any]:
    values: dict[str, Any] = {
        A.UNIQUE_IDENTIFIER.value: str(obj.id),
        A.OBJECT_TYPE.value: OBJECT_TYPES[obj.object_type],
        A.CRYPTOGRAPHIC_ALGORITHM.value: PAIR_ALGORITHMS.get(obj.algorithm or ""),
        A.CRYPTOGRAPHIC_LENGTH.value: obj.length_bits,
        A.NAME.value: obj.name,
        A.CRYPTOGRAPHIC_USAGE_MASK.value: usage_list(usage_of(obj)) or None,
        A.CERTIFICATE_LENGTH.value: (len(obj.material) if obj.object_type == CERTIFICATE and obj.material
                                     else None),
        **_lifecycle(obj),
        A.LAST_CHANGE_DATE.value: _ts(obj.updated_at),
        X_LINKED_PUBLIC: str(obj.public_key_id) if obj.public_key_id is not None else None,
        A.CERTIFICATE_TYPE.value: enums.CertificateType.X_509 if obj.object_type == CERTIFICATE else None,
        **_client_values(obj.kmip_attributes),
        **_kept_values(obj.kmip_attributes),
    }
    return {name: value for name, value in values.items() if value is not None}


def values_of(obj: VersionObject | PublicKeyObject | SealedObject) -> dict[str, Any]:
    if isinstance(obj, VersionObject):
        return version_values(obj)
    if isinstance(obj, PublicKeyObject):
        return public_key_values(obj)
    return sealed_values(obj)


def build(values: dict[str, Any], names: list[str] | None = None) -> list[Any]:
    """PyKMIP Attribute structures, all of them or only `names` (unknown names skipped,
    as KMIP 1.x asks); a multi-instance attribute gives one structure per instance.

    Every instance of an attribute KMIP 1.x lets an object hold several of (Name, Object
    Group, Application Specific Information, Cryptographic Parameters, custom attributes:
    KMIP 1.4 §3) carries its Attribute Index, 0 included (§2.1.1: Attribute Name,
    Attribute Index, Attribute Value), so that a client can address it in Modify/
    DeleteAttribute; single-instance attributes carry none."""
    wanted = list(values) if not names else [n for n in names if n in values]
    out: list[Any] = []
    for name in wanted:
        key: Any = enums.AttributeType(name) if not name.startswith("x-") else name
        value = values[name]
        if isinstance(value, Instances):
            out.extend(_factory.create_attribute(key, v, index=i) for i, v in enumerate(value))
        else:
            out.append(_factory.create_attribute(key, value, index=0 if multi_instance(name) else None))
    return out


# KMIP 1.4 §3: the attributes with "Multiple instances permitted: Yes" that we return.
MULTI_INSTANCE_RETURNED = frozenset({A.NAME.value, A.OBJECT_GROUP.value, A.APPLICATION_SPECIFIC_INFORMATION.value,
                                     A.CRYPTOGRAPHIC_PARAMETERS.value, A.DIGEST.value, A.LINK.value})


def multi_instance(name: str) -> bool:
    """Whether KMIP 1.x lets an object hold several instances of `name` (custom
    attributes included, §3.39)."""
    return name in MULTI_INSTANCE_RETURNED or name.startswith("x-") or name.startswith("y-")


def build_one(name: str, value: Any, index: int | None = None) -> Any:
    """One Attribute from a client attribute's stored value (see client_value)."""
    key: Any = enums.AttributeType(name) if not name.startswith("x-") else name
    if name == APPLICATION_SPECIFIC_INFORMATION:
        value = {"application_namespace": value["namespace"], "application_data": value["data"]}
    return _factory.create_attribute(key, value, index=index)


def requested_names(names: list[str]) -> list[str]:
    """GetAttributes' Attribute Names: each at most once. KMIP 1.4 §4.12 ("the same
    attribute name SHALL NOT be present more than once"); its error table answers
    Invalid Message."""
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise KmipFailure(enums.ResultReason.INVALID_MESSAGE,
                              f"the attribute '{n}' is named twice; name each attribute once")
        seen.add(n)
    return names


def client_value(name: str, value: Any) -> Any:
    """A client attribute's value from a request (as KmipObjectService.change_attribute takes it)."""
    if name == A.NAME.value:
        return str(value.name_value.value)
    if name == APPLICATION_SPECIFIC_INFORMATION:
        return {"namespace": str(getattr(value.application_namespace, "value", value.application_namespace)),
                "data": str(getattr(value.application_data, "value", value.application_data))}
    inner = getattr(value, "value", value)
    if not isinstance(inner, str):
        raise KmipFailure(enums.ResultReason.INVALID_FIELD, f"'{name}' takes a text string value")
    return inner


def template_client_attributes(template: Any, kind: str, algorithm: str | None = None) -> dict[str, Any]:
    """The client attributes of a Create/Register template as kmip_attributes keeps them,
    with the Cryptographic Usage Mask narrowed to what the kind can do (core/usage.py)."""
    if template is None:
        return {}
    out = client_attributes(template.attributes or [])
    mask = attribute_values(template.attributes or []).get(A.CRYPTOGRAPHIC_USAGE_MASK.value)
    # Secret Data: no operation of this server uses it (Get is ruled by the export right),
    # so its mask is the client's own record, kept as sent (Synology DSM registers its
    # volume keys with Verify and reads the mask back); an empty one means Derive Key.
    kept = (int(mask) or None) if kind == SECRET_DATA and mask is not None else requested_uses(kind, algorithm, mask)
    if kept is not None:
        out[USAGE_ATTRIBUTE] = kept
    return out


def client_attributes(attrs: list[Any]) -> dict[str, Any]:
    """Contact Information, Object Group and Application Specific Information from a
    template, as stored in kmip_attributes (Name and custom attributes are handled by
    the caller)."""
    out: dict[str, Any] = {}
    for attr in attrs:
        name = str(attr.attribute_name.value)
        if name not in CLIENT_ATTRIBUTES or name == A.NAME.value:
            continue
        value = client_value(name, attr.attribute_value)
        if name in MULTI_INSTANCE:
            out.setdefault(name, []).append(value)
        else:
            out[name] = value
    return out


def attribute_values(attrs: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr in attrs:
        name = str(attr.attribute_name.value)
        value = attr.attribute_value
        if name == A.NAME.value:
            out[name] = str(value.name_value.value)
        elif name == A.CRYPTOGRAPHIC_USAGE_MASK.value:
            out[name] = int(value.value)
        else:
            out[name] = getattr(value, "value", value)
    return out


# --- templates: every attribute applied, or the request refused -----------------------------
R = enums.ResultReason
KEY_KINDS = frozenset({"symmetric-key", "public-key", PRIVATE_KEY})
# What a Create/Register/CreateKeyPair template may carry, and for which kinds of object.
_FOR_EVERY_KIND = frozenset({A.NAME.value, A.CRYPTOGRAPHIC_USAGE_MASK.value, A.ACTIVATION_DATE.value,
                             A.DEACTIVATION_DATE.value, A.OBJECT_TYPE.value, *CLIENT_ATTRIBUTES})
_FOR_KEYS = frozenset({A.CRYPTOGRAPHIC_ALGORITHM.value, A.CRYPTOGRAPHIC_LENGTH.value, CRYPTOGRAPHIC_PARAMETERS})
# KMIP 1.4 §3.25-3.26; Sensitive (§3.48): True makes the key not exportable in plaintext
_FOR_SYMMETRIC_KEYS = frozenset({PROCESS_START_DATE, PROTECT_STOP_DATE, A.SENSITIVE.value})
# Attributes only the server sets (KMIP 1.4 §3: "Initially set by: Server").
SERVER_SET = frozenset({
    A.UNIQUE_IDENTIFIER.value, A.STATE.value, A.INITIAL_DATE.value, A.LAST_CHANGE_DATE.value,
    A.COMPROMISE_DATE.value, A.COMPROMISE_OCCURRENCE_DATE.value, A.DESTROY_DATE.value, A.ARCHIVE_DATE.value,
    A.REVOCATION_REASON.value, A.DIGEST.value, A.FRESH.value, A.ORIGINAL_CREATION_DATE.value,
    A.CERTIFICATE_TYPE.value, A.CERTIFICATE_LENGTH.value, A.CERTIFICATE_IDENTIFIER.value,
    A.CERTIFICATE_SUBJECT.value, A.CERTIFICATE_ISSUER.value, A.DIGITAL_SIGNATURE_ALGORITHM.value,
    A.LEASE_TIME.value, A.KEY_VALUE_PRESENT.value, A.LINK.value,
})
_SINGLE = frozenset({A.CRYPTOGRAPHIC_ALGORITHM.value, A.CRYPTOGRAPHIC_LENGTH.value, A.CRYPTOGRAPHIC_USAGE_MASK.value,
                     A.ACTIVATION_DATE.value, A.DEACTIVATION_DATE.value, A.OBJECT_TYPE.value,
                     A.CONTACT_INFORMATION.value, PROCESS_START_DATE, PROTECT_STOP_DATE})
# Fixed for an object's life (KMIP 1.4 §3: "Modifiable by client: No").
_FIXED = frozenset({A.CRYPTOGRAPHIC_ALGORITHM.value, A.CRYPTOGRAPHIC_LENGTH.value, A.CRYPTOGRAPHIC_USAGE_MASK.value,
                    A.OBJECT_TYPE.value})
MAX_PARAMETERS = 8
# Cryptographic Parameters fields this server honours (cryptoparams.py); the rest are refused.
PARAMETER_FIELDS = {"block_cipher_mode": enums.BlockCipherMode, "padding_method": enums.PaddingMethod,
                    "hashing_algorithm": enums.HashingAlgorithm,
                    "digital_signature_algorithm": enums.DigitalSignatureAlgorithm,
                    "cryptographic_algorithm": enums.CryptographicAlgorithm, "tag_length": int, "random_iv": bool}
_UNSERVED_FIELDS = ("key_role_type", "iv_length", "fixed_field_length", "invocation_field_length",
                    "counter_length", "initial_counter_value")


@dataclass
class Template:
    """A request's template, read whole: each attribute has a place here or was refused."""

    values: dict[str, Any] = field(default_factory=dict)
    activation: datetime | None = None
    deactivation: datetime | None = None
    process_start: datetime | None = None
    protect_stop: datetime | None = None
    parameters: list[dict[str, Any]] = field(default_factory=list)
    custom: dict[str, str] = field(default_factory=dict)  # x-<name> → value


def _when(value: Any) -> datetime:
    return datetime.fromtimestamp(int(value), UTC)


def parameters_stored(params: Any) -> dict[str, Any]:
    """A Cryptographic Parameters structure as kmip_attributes keeps it (enum names)."""
    out: dict[str, Any] = {}
    for name in _UNSERVED_FIELDS:
        if getattr(params, name, None) is not None:
            raise KmipFailure(R.FEATURE_NOT_SUPPORTED, f"the Cryptographic Parameters field "
                              f"{name.replace('_', ' ').title()} is not supported")
    for name, kind in PARAMETER_FIELDS.items():
        value = getattr(params, name, None)
        if value is None:
            continue
        out[name] = value.name if isinstance(value, Enum) else kind(value)
    if out.get("random_iv") is False:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "Random IV False is not supported: give the IV with each "
                                                   "request, or let the server choose it")
    return out


def parameters_value(stored: dict[str, Any]) -> dict[str, Any]:
    """kmip_attributes' form → what PyKMIP's CryptographicParameters takes."""
    out: dict[str, Any] = {}
    for name, value in stored.items():
        kind = PARAMETER_FIELDS[name]
        out[name] = kind[value] if isinstance(kind, type) and issubclass(kind, Enum) else value
    return out


def read_template(template: Any, kind: str, *, object_type: enums.ObjectType | None = None) -> Template:
    """Every attribute of a Create/Register/CreateKeyPair template, checked: applied by
    the caller (through the returned Template) or refused here with the reason KMIP 1.x
    gives — a server-set attribute Permission Denied, one this server does not implement
    Feature Not Supported, one that does not apply to the kind of object Invalid Field.
    Nothing is silently dropped (docs/kmip.md lists which are which)."""
    out = Template()
    if template is None:
        return out
    if getattr(template, "names", None):
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "named templates are not supported")
    allowed = _FOR_EVERY_KIND | (_FOR_KEYS if kind in KEY_KINDS else frozenset()) | (
        _FOR_SYMMETRIC_KEYS if kind == "symmetric-key" else frozenset())
    seen: set[str] = set()
    for attr in template.attributes or []:
        name = str(attr.attribute_name.value)
        value = attr.attribute_value
        if name.startswith("x-"):
            settable(name)
            if name in out.custom:
                raise KmipFailure(R.INVALID_FIELD, f"the custom attribute '{name}' is given twice; it has one "
                                                   "instance here")
            out.custom[name] = _checked_text(name, client_value(name, value))
            continue
        if name in SERVER_SET:
            raise KmipFailure(R.PERMISSION_DENIED, f"'{name}' is set by the server; leave it out of the template")
        if name not in allowed:
            known = name in _FOR_EVERY_KIND | _FOR_KEYS | _FOR_SYMMETRIC_KEYS
            raise KmipFailure(R.INVALID_FIELD if known else R.FEATURE_NOT_SUPPORTED,
                              f"'{name}' does not apply to a {kind}" if known
                              else f"the attribute '{name}' is not supported by this server (docs/kmip.md lists "
                                   "the attributes it applies)")
        if name in seen and (name in _SINGLE or name == A.NAME.value):
            raise KmipFailure(R.FEATURE_NOT_SUPPORTED if name == A.NAME.value else R.INVALID_FIELD,
                              "an object has one Name here" if name == A.NAME.value
                              else f"'{name}' is given twice; it has one instance")
        seen.add(name)
        if name == A.NAME.value:
            out.values[name] = str(value.name_value.value)
        elif name == A.CRYPTOGRAPHIC_USAGE_MASK.value:
            out.values[name] = int(value.value)
        elif name == CRYPTOGRAPHIC_PARAMETERS:
            if len(out.parameters) >= MAX_PARAMETERS:
                raise KmipFailure(R.INVALID_FIELD, f"at most {MAX_PARAMETERS} Cryptographic Parameters instances")
            out.parameters.append(parameters_stored(value))
        else:
            out.values[name] = getattr(value, "value", value)
    if object_type is not None and out.values.get(A.OBJECT_TYPE.value, object_type) != object_type:
        raise KmipFailure(R.INVALID_FIELD, "the template's Object Type is not the request's")
    dates = {n: _when(out.values[n]) for n in (A.ACTIVATION_DATE.value, A.DEACTIVATION_DATE.value,
                                                 PROCESS_START_DATE, PROTECT_STOP_DATE) if n in out.values}
    out.activation = dates.get(A.ACTIVATION_DATE.value)
    out.deactivation = dates.get(A.DEACTIVATION_DATE.value)
    out.process_start = dates.get(PROCESS_START_DATE)
    out.protect_stop = dates.get(PROTECT_STOP_DATE)
    if out.activation and out.deactivation and out.deactivation <= out.activation:
        raise KmipFailure(R.INVALID_FIELD, "the Deactivation Date must be after the Activation Date")
    return out


def _checked_text(name: str, value: str) -> str:
    if not 1 <= len(value) <= 1024:
        raise KmipFailure(R.INVALID_FIELD, f"'{name}' takes a text value of 1 to 1024 characters")
    return value


def kept_attributes(t: Template, version: int = 1) -> dict[str, Any]:
    """The server-kept attributes a template sets, as kmip_attributes holds them."""
    out: dict[str, Any] = {}
    if t.process_start is not None:
        out[PROCESS_START_DATE] = {str(version): int(t.process_start.timestamp())}
    if t.protect_stop is not None:
        out[PROTECT_STOP_DATE] = {str(version): int(t.protect_stop.timestamp())}
    if t.parameters:
        out[CRYPTOGRAPHIC_PARAMETERS] = t.parameters
    return out
