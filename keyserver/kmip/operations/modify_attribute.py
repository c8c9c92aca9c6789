"""ModifyAttribute (KMIP 1.x form): change a custom attribute `x-<name>`, which is the
managed key's tag `<name>` (shared by all versions of the key, as in REST)."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip import attributes
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.MODIFY_ATTRIBUTE


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    attr = payload.attribute
    if attr is None:
        raise KmipFailure(enums.ResultReason.MISSING_DATA, "ModifyAttribute needs an attribute (KMIP 1.x form)")
    name = str(attr.attribute_name.value)
    tag = attributes.tag_of(name)
    value = str(getattr(attr.attribute_value, "value", ""))
    obj = call.engine.objects.version_object(call.ctx, uid)
    if tag not in obj.key.tags:
        raise KmipFailure(enums.ResultReason.ITEM_NOT_FOUND, f"the object has no attribute '{name}'")
    call.engine.keys.update(call.ctx, str(obj.key.id), tags={**obj.key.tags, tag: value})
    return payloads.ModifyAttributeResponsePayload(unique_identifier=uid,
                                                   attribute=attributes.build({name: value})[0])
