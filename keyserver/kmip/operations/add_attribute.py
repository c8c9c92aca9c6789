"""AddAttribute (KMIP 1.x form): add a custom attribute `x-<name>`, which becomes the
managed key's tag `<name>` (shared by all versions of the key, as in REST). PyKMIP
0.11 has no payload for this operation; ours is in keyserver.kmip.payloads."""

from __future__ import annotations

from typing import Any

from kmip.core import enums

from keyserver.kmip import attributes
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure
from keyserver.kmip.payloads import AddAttributeResponsePayload

OPERATION = enums.Operation.ADD_ATTRIBUTE


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    attr = payload.attribute
    name = str(attr.attribute_name.value)
    tag = attributes.tag_of(name)
    value = getattr(attr.attribute_value, "value", None)
    if not isinstance(value, str):
        raise KmipFailure(enums.ResultReason.INVALID_FIELD, f"'{name}' takes a text string value")
    obj = call.engine.objects.version_object(call.ctx, uid)
    if tag in obj.key.tags:
        # Tags hold one value each: a second instance would be invisible to REST.
        raise KmipFailure(enums.ResultReason.ILLEGAL_OPERATION,
                          f"the object has the attribute '{name}' already; use ModifyAttribute to change it")
    call.engine.keys.update(call.ctx, str(obj.key.id), tags={**obj.key.tags, tag: value})
    return AddAttributeResponsePayload(unique_identifier=uid, attribute=attributes.build({name: value})[0])
