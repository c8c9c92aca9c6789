"""AddAttribute (KMIP 1.x form): a client attribute on any object: Name (when it has
none), Contact Information, Object Group and Application Specific Information (several
instances), or a custom `x-<name>` (on a symmetric key: the managed key's tag `<name>`,
shared by its versions as in REST). PyKMIP 0.11 has no payload for this operation; ours
is in keyserver.kmip.payloads."""

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
    if attr is None:
        raise KmipFailure(enums.ResultReason.MISSING_DATA, "AddAttribute needs an attribute")
    name = attributes.settable(str(attr.attribute_name.value))
    value = attributes.client_value(name, attr.attribute_value)
    call.engine.objects.change_attribute(call.ctx, uid, operation="add", name=name, value=value)
    # The response echoes the attribute built fresh, never the parsed one (attributes.py).
    index = int(attr.attribute_index.value) if attr.attribute_index is not None else None
    return AddAttributeResponsePayload(unique_identifier=uid, attribute=attributes.build_one(name, value, index))
