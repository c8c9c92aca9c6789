"""Create: a new AES managed key (KMIP object = its version 1). Pre-Active unless the
template carries an Activation Date that is not in the future (KMIP 1.4 §4.1)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.core.keys import HMAC_ALGORITHMS, KeySpec
from keyserver.kmip import attributes
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


def handle(call: Call, payload: Any) -> Any:
    if payload.object_type != enums.ObjectType.SYMMETRIC_KEY:
        raise KmipFailure(enums.ResultReason.INVALID_FIELD, "Create makes symmetric keys only "
                          "(RSA key pairs come from CreateKeyPair)")
    values = attributes.template_values(payload.template_attribute)
    algorithm = attributes.ALGORITHM_OF_KMIP.get(
        values.get(A.CRYPTOGRAPHIC_ALGORITHM.value, enums.CryptographicAlgorithm.AES))
    if algorithm is None:
        raise KmipFailure(enums.ResultReason.INVALID_FIELD, "Create makes AES and HMAC-SHA256/384/512 keys; "
                          "legacy ciphers (3DES, RC4, ...) are refused")
    length = int(values.get(A.CRYPTOGRAPHIC_LENGTH.value, HMAC_ALGORITHMS.get(algorithm, 256)))
    if algorithm == "AES" and length not in (128, 192, 256):
        raise KmipFailure(enums.ResultReason.INVALID_FIELD, "AES keys are 128, 192 or 256 bits long")
    name = values.get(A.NAME.value) or f"kmip-{uuid.uuid4().hex[:16]}"
    activate, activation_date = activation_of(values)
    spec = KeySpec(name=name, description="created over KMIP", owner=call.ctx.principal.name, activate=activate,
                   activation_date=activation_date, length_bits=length, unique_name=False, algorithm=algorithm,
                   kmip_attributes=attributes.template_client_attributes(payload.template_attribute,
                                                                         "symmetric-key", algorithm))
    key = call.engine.keys.create(call.ctx, spec)
    return payloads.CreateResponsePayload(object_type=enums.ObjectType.SYMMETRIC_KEY,
                                          unique_identifier=str(key.versions[-1].id))
