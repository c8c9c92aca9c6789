"""Register: AES keys (they become managed keys, wrapped under the KEK at once) and RSA
public keys (>= 2048 bits, so that Get can deliver keys wrapped under them)."""

from __future__ import annotations

import uuid
from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.core.keys import KeySpec
from keyserver.kmip import attributes
from keyserver.kmip.context import Call
from keyserver.kmip.errors import KmipFailure
from keyserver.kmip.operations.create import activation_of

OPERATION = enums.Operation.REGISTER
R = enums.ResultReason
A = enums.AttributeType


def handle(call: Call, payload: Any) -> Any:
    if payload.object_type not in (enums.ObjectType.SYMMETRIC_KEY, enums.ObjectType.PUBLIC_KEY):
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "only AES keys and RSA public keys can be registered")
    block = payload.managed_object.key_block
    if block.key_wrapping_data is not None:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "wrapped keys cannot be registered")
    values = attributes.template_values(payload.template_attribute)
    material = bytes(block.key_value.key_material.value)
    if payload.object_type == enums.ObjectType.PUBLIC_KEY:
        if block.key_format_type.value not in (enums.KeyFormatType.X_509, enums.KeyFormatType.PKCS_1):
            raise KmipFailure(R.KEY_FORMAT_TYPE_NOT_SUPPORTED,
                              "public keys are registered in X.509 (SubjectPublicKeyInfo) or PKCS#1 format")
        row = call.engine.objects.register_public_key(call.ctx, material, name=values.get(A.NAME.value))
        return payloads.RegisterResponsePayload(unique_identifier=str(row.id))
    if block.key_format_type.value != enums.KeyFormatType.RAW:
        raise KmipFailure(R.KEY_FORMAT_TYPE_NOT_SUPPORTED, "symmetric keys are registered in Raw format")
    algorithm = block.cryptographic_algorithm.value if block.cryptographic_algorithm is not None else None
    if algorithm not in (None, enums.CryptographicAlgorithm.AES):
        raise KmipFailure(R.INVALID_FIELD, "only AES keys can be registered")
    if len(material) not in (16, 24, 32):
        raise KmipFailure(R.INVALID_FIELD, "AES keys are 16, 24 or 32 bytes long")
    activate, activation_date = activation_of(values)
    key = call.engine.keys.create(call.ctx, KeySpec(
        name=values.get(A.NAME.value) or f"kmip-{uuid.uuid4().hex[:16]}", description="registered over KMIP",
        owner=call.ctx.principal.name, activate=activate, activation_date=activation_date,
        length_bits=len(material) * 8, material=material))
    return payloads.RegisterResponsePayload(unique_identifier=str(key.versions[-1].id))
