"""Create: a new AES or HMAC managed key (KMIP object = its version 1). Pre-Active unless
the template carries an Activation Date that is not in the future (KMIP 1.4 §4.1);
Deactivated at once when its Deactivation Date has passed. Every template attribute is
applied or the request refused (attributes.read_template)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.core.keys import HMAC_ALGORITHMS, KeySpec
from keyserver.kmip import attributes, cryptoparams
from keyserver.kmip.context import Call
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.CREATE
A = enums.AttributeType


def activation_of(values: dict[str, Any]) -> tuple[bool, datetime | None]:
    """KMIP objects start Pre-Active; an Activation Date not in the future activates at once."""
    activation = values.get(A.ACTIVATION_DATE.value)
    if activation is None:
        return False, None
    return int(activation) <= int(time.time()), datetime.fromtimestamp(int(activation), UTC)


def symmetric_spec(call: Call, template: Any, t: attributes.Template, *, name: str | None, algorithm: str,
                   length: int, description: str, material: bytes | None = None) -> KeySpec:
    """The managed key a Create or Register template asks for, every attribute applied:
    its dates (a Deactivation Date already past: created Deactivated), Process Start and
    Protect Stop Dates and Cryptographic Parameters (kept per object, enforced at each
    use), client and custom attributes (custom ones are the key's tags, as in REST)."""
    cryptoparams.check_defaults(t.parameters, algorithm)
    activate, activation_date = activation_of(t.values)
    kept = {**attributes.template_client_attributes(template, "symmetric-key", algorithm),
            **attributes.kept_attributes(t)}
    return KeySpec(name=name or f"kmip-{uuid.uuid4().hex[:16]}", description=description,
                   owner=call.ctx.principal.name, activate=activate, activation_date=activation_date,
                   deactivation_date=t.deactivation, length_bits=length, material=material, unique_name=False,
                   algorithm=algorithm, kmip_attributes=kept, tags={k[2:]: v for k, v in t.custom.items()},
                   exportable=not t.values.get(A.SENSITIVE.value, False))


def handle(call: Call, payload: Any) -> Any:
    if payload.object_type != enums.ObjectType.SYMMETRIC_KEY:
        raise KmipFailure(enums.ResultReason.INVALID_FIELD, "Create makes symmetric keys only "
                          "(RSA key pairs come from CreateKeyPair)")
    t = attributes.read_template(payload.template_attribute, "symmetric-key", object_type=payload.object_type)
    values = t.values
    algorithm = attributes.ALGORITHM_OF_KMIP.get(
        values.get(A.CRYPTOGRAPHIC_ALGORITHM.value, enums.CryptographicAlgorithm.AES))
    if algorithm is None:
        raise KmipFailure(enums.ResultReason.INVALID_FIELD, "Create makes AES and HMAC-SHA256/384/512 keys; "
                          "legacy ciphers (3DES, RC4, ...) are refused")
    length = int(values.get(A.CRYPTOGRAPHIC_LENGTH.value, HMAC_ALGORITHMS.get(algorithm, 256)))
    if algorithm == "AES" and length not in (128, 192, 256):
        raise KmipFailure(enums.ResultReason.INVALID_FIELD, "AES keys are 128, 192 or 256 bits long")
    spec = symmetric_spec(call, payload.template_attribute, t, name=values.get(A.NAME.value), algorithm=algorithm,
                          length=length, description="created over KMIP")
    key = call.engine.keys.create(call.ctx, spec)
    return payloads.CreateResponsePayload(object_type=enums.ObjectType.SYMMETRIC_KEY,
                                          unique_identifier=str(key.versions[-1].id))
