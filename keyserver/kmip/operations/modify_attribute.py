"""ModifyAttribute (KMIP 1.x form): change one instance (Attribute Index, default 0) of a
client attribute: Name, Contact Information, Object Group, Application Specific
Information or a custom `x-<name>` (on a symmetric key: the managed key's tag)."""

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
    name = attributes.settable(str(attr.attribute_name.value))
    value = attributes.client_value(name, attr.attribute_value)
    index = int(attr.attribute_index.value) if attr.attribute_index is not None else 0
    call.engine.objects.change_attribute(call.ctx, uid, operation="modify", name=name, value=value, index=index)
    return payloads.ModifyAttributeResponsePayload(unique_identifier=uid,
                                                   attribute=attributes.build_one(name, value, index))
