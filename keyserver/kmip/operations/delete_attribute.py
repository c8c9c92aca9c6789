"""DeleteAttribute (KMIP 1.x form): remove one instance (Attribute Index, default 0) of a
client attribute: Contact Information, Object Group, Application Specific Information, a
custom `x-<name>` (on a symmetric key: the managed key's tag), or the Name of an object
that is not a managed key (a managed key always has one)."""

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
    name = attributes.settable(str(payload.attribute_name))
    index = int(payload.attribute_index or 0)
    old = call.engine.objects.change_attribute(call.ctx, uid, operation="delete", name=name, index=index)
    return payloads.DeleteAttributeResponsePayload(unique_identifier=uid,
                                                   attribute=attributes.build_one(name, old, index))
