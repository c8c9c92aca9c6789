"""DeleteAttribute (KMIP 1.x form): remove a custom attribute `x-<name>` (the key's tag)."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip import attributes
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.DELETE_ATTRIBUTE


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    if not payload.attribute_name:
        raise KmipFailure(enums.ResultReason.MISSING_DATA, "DeleteAttribute needs an attribute name (KMIP 1.x form)")
    if payload.attribute_index not in (None, 0):
        raise KmipFailure(enums.ResultReason.ITEM_NOT_FOUND, "custom attributes have a single instance (index 0)")
    name = str(payload.attribute_name)
    tag = attributes.tag_of(name)
    obj = call.engine.objects.version_object(call.ctx, uid)
    if tag not in obj.key.tags:
        raise KmipFailure(enums.ResultReason.ITEM_NOT_FOUND, f"the object has no attribute '{name}'")
    old = str(obj.key.tags[tag])
    call.engine.keys.update(call.ctx, str(obj.key.id), tags={k: v for k, v in obj.key.tags.items() if k != tag})
    return payloads.DeleteAttributeResponsePayload(unique_identifier=uid, attribute=attributes.build({name: old})[0])
